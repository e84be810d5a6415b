/* Options shared by `lumen run` and `lumen chat`: the model, how it is loaded, and
 * how tokens are sampled; their parsing, their --help lines, and small output
 * helpers. Everything here goes through the public API (lumen.h). */
#ifndef LM_TOOLS_GEN_OPTIONS_H
#define LM_TOOLS_GEN_OPTIONS_H

#include <stdio.h>

#include "lumen.h"

#define GEN_DEFAULT_MODEL "smollm2-135m"
#define GEN_MAX_STOPS 64
#define GEN_MAX_BIAS 256

typedef struct gen_options {
    const char *model;
    lm_model_params model_params;
    lm_generate_params gen;
    const char *stops[GEN_MAX_STOPS];
    lm_logit_bias bias[GEN_MAX_BIAS];
    const char *system;
} gen_options;

/* Fills the defaults (`temperature` is the command's default temperature). */
void gen_options_init(gen_options *o, float temperature, int32_t max_tokens);

/* Tries to consume argv[*i] (and its value) as a shared option. Returns 1 if it was
 * one, 0 if not, -1 after printing an error for a bad or missing value. */
int gen_options_parse(gen_options *o, int argc, char **argv, int *i, const char *cmd);

/* The --help lines of the shared options, with their defaults. */
void gen_options_usage(FILE *f, float temperature, int32_t max_tokens);

/* Loads o->model, printing "lumen CMD: <error>" on failure. */
int gen_load_model(const gen_options *o, const char *cmd, lm_model **model);

/* Writes s[0..n) as a JSON string (quotes included); bytes that are not valid UTF-8
 * become \u00XX so that the output stays valid JSON. */
void gen_json_string(FILE *f, const char *s, size_t n);

/* Writes the statistics as a JSON object. */
void gen_json_stats(FILE *f, const lm_stats *s);

/* One human line of statistics ("[prompt 12 tokens, ... ]"). */
void gen_print_stats(FILE *f, const lm_stats *s);

/* Ctrl-C: the first press cancels the request set with gen_sigint_watch (the program
 * carries on); with no request running, it sets gen_sigint_pending. */
void gen_sigint_install(void);
void gen_sigint_watch(lm_request *req); /* NULL: none running */
extern volatile int gen_sigint_pending;

#endif
