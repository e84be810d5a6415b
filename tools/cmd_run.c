/* lumen run [MODEL] -p PROMPT: one generation, streamed to stdout, over the public
 * API (lumen.h). The prompt goes through the model's chat template unless --raw.
 * --json prints one JSON object per token and then a final one; --json-final only
 * the final one (the text, the finish reason and the statistics). Ctrl-C stops the
 * generation (what was generated is kept, the statistics are printed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "gen_options.h"

#define RUN_TEMPERATURE 0.0f
#define RUN_MAX_TOKENS 256

typedef struct run_opts {
    gen_options g;
    const char *prompt;
    bool raw, json, json_final, no_stats;
    int top_logprobs;
} run_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen run [MODEL] -p PROMPT [options]\n"
            "  -p, --prompt TEXT         the user message, or with --raw the whole prompt (required)\n"
            "  --raw                     feed the prompt as is, without the chat template; control tokens\n"
            "                            written in it (<|im_start|>) are parsed (default: off)\n"
            "  --json                    print one JSON object per token, then a final object with the\n"
            "                            text, finish reason and statistics (default: off, plain text)\n"
            "  --json-final              print only the final JSON object (default: off)\n"
            "  --logprobs N              with --json: the N most likely tokens at each step, 0-%d (default: 0)\n"
            "  --no-stats                do not print the statistics line to stderr (default: printed)\n",
            LM_MAX_TOP_LOGPROBS);
    gen_options_usage(f, RUN_TEMPERATURE, RUN_MAX_TOKENS);
}

/* 0: go on; otherwise the exit code + 1 */
static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    gen_options_init(&o->g, RUN_TEMPERATURE, RUN_MAX_TOKENS);
    bool model_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = gen_options_parse(&o->g, argc, argv, &i, "run");
        if (r < 0) return 3;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--raw")) {
            o->raw = true;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--json-final")) {
            o->json_final = true;
        } else if (!strcmp(a, "--no-stats")) {
            o->no_stats = true;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) {
            o->prompt = argv[++i];
        } else if (!strcmp(a, "--logprobs") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (!*argv[i] || *end || v < 0 || v > LM_MAX_TOP_LOGPROBS) {
                fprintf(stderr, "lumen run: invalid value for --logprobs: '%s' (0-%d)\n", argv[i],
                        LM_MAX_TOP_LOGPROBS);
                return 3;
            }
            o->top_logprobs = (int)v;
        } else if (a[0] != '-' && !model_set) {
            o->g.model = a;
            model_set = true;
        } else {
            fprintf(stderr, "lumen run: unknown option or missing value: %s (see lumen run --help)\n", a);
            return 3;
        }
    }
    if (!o->prompt) {
        fprintf(stderr, "lumen run: a prompt is required (-p TEXT; see lumen run --help)\n");
        return 3;
    }
    if (o->json && o->json_final) {
        fprintf(stderr, "lumen run: --json and --json-final exclude each other\n");
        return 3;
    }
    if (o->json) {
        o->g.gen.logprobs = true;
        o->g.gen.top_logprobs = o->top_logprobs;
    }
    return 0;
}

/* The prompt's tokens: the chat template applied to [system?, user] unless raw. */
static int prompt_tokens(const lm_model *model, const run_opts *o, int32_t **ids, size_t *n) {
    char *text = NULL;
    size_t len = 0;
    if (o->raw) {
        text = strdup(o->prompt);
        len = strlen(o->prompt);
    } else {
        lm_chat_message msgs[2];
        size_t k = 0;
        if (o->g.system) msgs[k++] = (lm_chat_message){"system", o->g.system};
        msgs[k++] = (lm_chat_message){"user", o->prompt};
        lm_chat_params cp = lm_chat_default_params();
        if (lm_chat_render(model, msgs, k, cp, NULL, 0, &len) == LM_OK && (text = malloc(len + 1)) &&
            lm_chat_render(model, msgs, k, cp, text, len + 1, &len) != LM_OK) {
            free(text);
            text = NULL;
        }
        if (!text) {
            fprintf(stderr, "lumen run: %s%s\n", lm_last_error(),
                    lm_model_has_chat_template(model) ? "" : " (or pass --raw)");
            return 1;
        }
    }
    if (!text) return 1;
    uint32_t flags = LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL;
    int rc = 1;
    if (lm_tokenize(model, text, len, flags, NULL, 0, n) == LM_OK && (*ids = malloc(sizeof(int32_t) * (*n + 1))) &&
        lm_tokenize(model, text, len, flags, *ids, *n, n) == LM_OK)
        rc = 0;
    else
        fprintf(stderr, "lumen run: %s\n", lm_last_error());
    free(text);
    return rc;
}

static void json_token(const lm_model *model, const lm_step *s) {
    printf("{\"token\": %d, \"text\": ", s->token);
    gen_json_string(stdout, s->text, s->text_len);
    if (s->token >= 0) printf(", \"logprob\": %.6f", (double)s->logprob);
    if (s->n_top_logprobs) {
        printf(", \"top_logprobs\": [");
        for (size_t i = 0; i < s->n_top_logprobs; i++) {
            char piece[256];
            size_t n = 0;
            if (lm_detokenize(model, &s->top_logprobs[i].token, 1, 0, piece, sizeof piece, &n) != LM_OK) n = 0;
            printf("%s{\"token\": %d, \"logprob\": %.6f, \"text\": ", i ? ", " : "", s->top_logprobs[i].token,
                   (double)s->top_logprobs[i].logprob);
            gen_json_string(stdout, piece, n < sizeof piece ? n : sizeof piece);
            printf("}");
        }
        printf("]");
    }
    if (s->finish) printf(", \"finish_reason\": \"%s\"", lm_finish_reason_str(s->finish));
    printf("}\n");
    fflush(stdout);
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc - 1;
    lm_model *model = NULL;
    lm_context *ctx = NULL;
    lm_request *req = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *all = NULL;
    size_t all_len = 0, all_cap = 0;
    rc = 1;
    if (gen_load_model(&o.g, "run", &model) || prompt_tokens(model, &o, &ids, &n_ids)) goto done;
    if (lm_context_create(model, lm_context_default_params(), &ctx) != LM_OK ||
        lm_request_start(ctx, ids, n_ids, &o.g.gen, &req) != LM_OK) {
        fprintf(stderr, "lumen run: %s\n", lm_last_error());
        goto done;
    }
    gen_sigint_install();
    gen_sigint_watch(req);
    lm_step s;
    for (;;) {
        if (lm_request_next(req, &s) != LM_OK) {
            gen_sigint_watch(NULL);
            fprintf(stderr, "\nlumen run: %s\n", lm_last_error());
            goto done;
        }
        if (o.json) {
            if (s.token >= 0 || s.text_len) json_token(model, &s);
        } else if (o.json_final) {
            if (all_len + s.text_len + 1 > all_cap) {
                all_cap = (all_len + s.text_len + 1) * 2;
                char *t = realloc(all, all_cap);
                if (!t) {
                    fprintf(stderr, "lumen run: out of memory\n");
                    goto done;
                }
                all = t;
            }
            memcpy(all + all_len, s.text, s.text_len);
            all_len += s.text_len;
        } else {
            fwrite(s.text, 1, s.text_len, stdout);
            fflush(stdout);
        }
        if (s.finish) break;
    }
    gen_sigint_watch(NULL);
    lm_stats st;
    lm_request_stats(req, &st);
    if (o.json || o.json_final) {
        printf("{\"finish_reason\": \"%s\"", lm_finish_reason_str(st.finish));
        if (o.json_final) {
            printf(", \"text\": ");
            gen_json_string(stdout, all ? all : "", all_len);
        }
        printf(", \"stats\": ");
        gen_json_stats(stdout, &st);
        printf("}\n");
    } else {
        printf("\n");
    }
    fflush(stdout);
    if (!o.no_stats && !o.json && !o.json_final) gen_print_stats(stderr, &st);
    rc = 0;
done:
    lm_request_free(req);
    lm_context_free(ctx);
    lm_model_free(model);
    free(ids);
    free(all);
    return rc;
}
