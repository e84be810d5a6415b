/* The per-token half of a generation, written once for the two generators: the
 * standalone requests of api/generate.c (one sequence, the caller's thread) and the
 * engine's requests (engine/, many sequences on the worker thread). Each owns its
 * sequence and its forward passes; given the logits of the sequence's last
 * position, this module does the rest of a step:
 *
 *   sample a token (bias, penalties, processors, the sampler chain), its logprob and
 *   the top logprobs (of the raw distribution); decode it incrementally; pass the
 *   text through the stop-string matcher, which holds back what could still become
 *   a stop string or is part of a character; decide whether the step was the last
 *   (end token, stop string, max_tokens, the sequence full) and if so release
 *   everything held back.
 *
 * A generation's state (lm_gen) is single-threaded: whoever advances the sequence
 * owns it. The output of a step (text, token, logprobs) lives in the lm_gen until
 * its next step. */
#ifndef LM_API_GEN_STEP_H
#define LM_API_GEN_STEP_H

#include "api/api_internal.h"
#include "sampling/sampling.h"
#include "sampling/stop.h"

typedef struct lm_gen {
    /* the request's parameters */
    int32_t max_tokens;            /* -1: until the sequence is full                  */
    bool ignore_eos, want_logprobs;
    int32_t n_top;
    const lm_tokenizer *tok;
    uint32_t tok_vocab;            /* tokenizer ids; the model may have padding rows beyond */
    size_t n_vocab;                /* logits per step                                 */

    /* state (NULL once released) */
    lm_sampler *sampler;
    lm_stop_matcher *stop;
    lm_detok_stream *detok;
    lm_logits_processor_factory factories[2]; /* those whose processor was built      */
    lm_logits_processor built[2];
    int n_built;
    int64_t n_generated;
    double t_start, t_first;
    /* the generation's statistics: sampling fills ttft_s, n_generated_tokens and
     * generation_s; the owner fills the rest (prompt, cache, times around steps) */
    lm_stats stats;

    /* the last step's output */
    char *text;                    /* newly final text, NUL-terminated                */
    size_t text_len, text_cap;
    int32_t token;                 /* the token sampled, -1 if none                   */
    float logprob;                 /* its logprob if want_logprobs, else 0           */
    lm_token_logprob top[LM_MAX_TOP_LOGPROBS];
    size_t n_top_out;
} lm_gen;

/* Checks a generation's input: LM_ERR_INVALID_ARG for an empty or NULL prompt (`fn`,
 * the public function, is named), a token outside [0, n_vocab), max_tokens < -1,
 * top_logprobs out of range, an empty stop string or invalid sampling parameters;
 * LM_ERR_LIMIT when the prompt leaves no room in a sequence of n_ctx tokens (`where`
 * names the sequence, `knob` the parameter that sets n_ctx). */
lm_status lm_gen_validate(const int32_t *prompt, size_t n_prompt, const lm_generate_params *p, size_t n_vocab,
                          int64_t n_ctx, const char *fn, const char *where, const char *knob);

/* Sets up a generation (g zeroed by the caller; lm_gen_free it also on failure):
 * the sampler over the request's processors, then the processor built by the
 * request's factory, then the one built by `extra` (the engine's; may be NULL), each
 * from `model`; the prompt as the sampler's history; the stop matcher; the
 * detokenizer. The clock starts (stats.ttft_s counts from here). */
lm_status lm_gen_init(lm_gen *g, const lm_model *model, const lm_generate_params *p,
                      const lm_logits_processor_factory *extra, const int32_t *prompt, size_t n_prompt);

/* One step from logits[0..n_vocab) of the sequence's last position: the token, its
 * text, and *finish = LM_FINISH_NONE or why it was the last step (then the text
 * includes everything held back). `full`: the sequence has no room for another
 * token. An error status leaves the step without text; the generation is over. */
lm_status lm_gen_sample(lm_gen *g, const float *logits, bool full, lm_finish_reason *finish);

/* The candidate path (sampling.h, "drawing from candidates"): whether every step of
 * this generation can be sampled from k candidates per row (no logprobs asked, since
 * they need the whole row's log-softmax, and lm_sampler_candidates_ok). */
bool lm_gen_candidates_ok(const lm_gen *g, int k);

/* How many candidates a row of this generation needs, at most k_max: 1 where the best
 * alone settles every step (greedy), k_max where k_max do, 0 where none will (or
 * k_max < 1: the candidate path is off). A greedy step then reduces each row to its
 * best logit only, the lighter reduction. */
int lm_gen_candidates_k(const lm_gen *g, int k_max);

/* Whether this row's candidates settle the step exactly; else sample the full row. */
bool lm_gen_candidates_suffice(const lm_gen *g, const lm_candidates *c);

/* lm_gen_sample from candidates: the same step, token and text as from the full
 * row. LM_ERR_INVALID_ARG (the generation is over) when they do not suffice. */
lm_status lm_gen_sample_candidates(lm_gen *g, const lm_candidates *c, bool full, lm_finish_reason *finish);

/* Ends the generation without a token (cancelled, max_tokens reached before a step):
 * the step's text is what the detokenizer and the stop matcher still hold; *got is
 * `want`, or LM_FINISH_STOP when that text completes a stop string. */
lm_status lm_gen_end(lm_gen *g, lm_finish_reason want, lm_finish_reason *got);

/* Frees the sampler, the matcher, the detokenizer and the built processors (their
 * factories' release runs now); the step's output stays readable. Idempotent. */
void lm_gen_release(lm_gen *g);

/* lm_gen_release and the step's buffer. */
void lm_gen_free(lm_gen *g);

#endif
