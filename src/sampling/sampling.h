/* Token sampling: parameters, a per-request sampler, user logits processors and the
 * log-probabilities reported to users. Pure C, no dependency on models: the caller
 * hands in one step's logits (f32[n_vocab]) and gets a token id back.
 *
 * The pipeline, applied in this order at every step (the order of Hugging Face's
 * generate and llama.cpp's documented chain):
 *
 *   1. logit bias     logits[t] += bias for every (t, bias) of the list; several
 *                     entries for one token add up; a bias of -INFINITY bans t.
 *   2. penalties      with c(t) = how often t occurs (see "history" below):
 *        repetition   (CTRL, Keskar et al. 2019) once per distinct token t of the
 *                     repetition window:  l = l > 0 ? l / r : l * r
 *        presence     l -= presence_penalty   if t was generated at least once
 *        frequency    l -= frequency_penalty * c(t)
 *                     (presence and frequency are applied as one subtraction,
 *                     l -= (float)c * frequency_penalty + presence_penalty, which is
 *                     OpenAI's documented formula)
 *   3. processors     the user callbacks, in array order, each seeing the previous
 *                     one's output.
 *   -- temperature == 0: greedy. The token is the argmax of the logits after 1-3;
 *      ties go to the lowest token id. Steps 4-8 are skipped.
 *   4. temperature    p(t) ∝ exp((l - l_max) / T).
 *   5. top-k          keep the tokens whose logit is >= the k-th largest logit: ties at
 *                     the boundary are all kept, so more than k tokens may survive
 *                     (the rule of HF's TopKLogitsWarper; it depends on values only,
 *                     never on token order).
 *   6. top-p          on the distribution renormalized over the top-k survivors, keep
 *                     token t iff the mass of the tokens strictly more probable than t
 *                     is < top_p. Without ties this is "the smallest set of most
 *                     probable tokens whose mass reaches top_p"; tokens of equal
 *                     probability are kept or dropped together. The most probable
 *                     token is always kept.
 *   7. min-p          keep t iff p(t) >= min_p * p_max (a ratio, so unaffected by the
 *                     renormalization after top-k/top-p; p_max is always kept).
 *   8. draw           u = lm_rng_uniform(seed, step, 0) in [0,1); walking the kept
 *                     tokens in increasing id order, the first t whose cumulative
 *                     weight exceeds u * (total weight).
 *
 * Each of steps 5-7 keeps a set of the form {t : p(t) >= threshold}, so the final set
 * is found in expected O(n_vocab) (a k-heap for small top-k, 3-way quickselect for
 * top-p and large top-k), never a full sort; exp() is computed only for tokens that
 * can survive. About 0.5-2 ms per token for a 152k vocabulary on one core.
 * Tokens whose logit is -inf after 1-3 are never kept. A logit of +inf after 1-3
 * makes the draw uniform over the +inf tokens. A NaN logit after 1-3 is an error.
 *
 * History and steps. A sampler holds its request's token history: prompt tokens
 * (lm_sampler_accept_prompt, optional, before generation) then generated tokens
 * (lm_sampler_accept / lm_sampler_sample).
 *   - the repetition penalty sees the last `repetition_context_size` tokens of the
 *     whole history (prompt included, like HF and llama.cpp); 0 = the whole history;
 *   - presence and frequency penalties count generated tokens only (OpenAI, vLLM);
 *   - processors see the whole history (prompt then generated, like mlx-lm).
 * The step of a draw is the number of generated tokens accepted so far, so token i
 * is always drawn with the uniform for (seed, i): lm_sampler_draw can be repeated
 * (speculative verification) and always answers the same for the same logits.
 *
 * Memory: a sampler keeps three scratch arrays of n_vocab floats (allocated on the
 * first draw) plus, with penalties on, hash maps over the distinct tokens seen.
 *
 * Thread safety: a sampler is single-threaded state (one per request); different
 * samplers may be used on different threads at once. lm_logprobs is pure. */
#ifndef LM_SAMPLING_SAMPLING_H
#define LM_SAMPLING_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

/* The parameter types (lm_sampling_params, lm_logit_bias, lm_logits_processor,
 * LM_SAMPLING_SEED_RANDOM, lm_token_logprob) and lm_sampling_default_params() are
 * public: include/lumen.h, section "sampling". */

/* LM_OK, or LM_ERR_INVALID_ARG with a sentence naming the parameter and its value:
 * temperature negative or not finite, top_k < 0, top_p outside (0, 1], min_p outside
 * [0, 1], repetition_penalty <= 0 or not finite, repetition_context_size < 0,
 * presence/frequency penalty not finite, a logit bias whose token is outside
 * [0, n_vocab) or whose bias is NaN or +inf, a processor without a function, a NULL
 * array with a nonzero count, n_vocab 0 or above INT32_MAX. */
lm_status lm_sampling_params_validate(const lm_sampling_params *params, size_t n_vocab);

typedef struct lm_sampler lm_sampler;

/* A sampler for one request over a vocabulary of n_vocab tokens. Validates the
 * params (see above) and copies the bias and processor arrays (the processors' user
 * pointers are borrowed). */
lm_status lm_sampler_create(const lm_sampling_params *params, size_t n_vocab, lm_sampler **out);
void lm_sampler_free(lm_sampler *s); /* NULL is a no-op */

/* The seed in use (the resolved one when params.seed was LM_SAMPLING_SEED_RANDOM). */
uint64_t lm_sampler_seed(const lm_sampler *s);
/* Generated tokens accepted so far = the step of the next draw. */
size_t lm_sampler_n_generated(const lm_sampler *s);

/* Appends prompt tokens to the history (repetition window and processors see them;
 * presence/frequency do not). Only before the first generated token; every id must be
 * in [0, n_vocab). */
lm_status lm_sampler_accept_prompt(lm_sampler *s, const int32_t *tokens, size_t n);

/* Draws the token for the current step from logits[0..n_vocab) (n_vocab must equal
 * the sampler's). The logits are not modified. The sampler's history and step do not
 * change: a second call with the same logits gives the same token. */
lm_status lm_sampler_draw(lm_sampler *s, const float *logits, size_t n_vocab, int32_t *token);

/* Appends a generated token to the history and advances the step. For tokens chosen
 * by the caller (forced, accepted draft tokens); lm_sampler_sample calls it itself. */
lm_status lm_sampler_accept(lm_sampler *s, int32_t token);

/* lm_sampler_draw then lm_sampler_accept: the usual per-step call. */
lm_status lm_sampler_sample(lm_sampler *s, const float *logits, size_t n_vocab, int32_t *token);

/* The final distribution the next draw samples from: probs[t] for every token (0 for
 * removed tokens, summing to 1; one-hot on the argmax when greedy). Same pipeline as
 * lm_sampler_draw, no state change. For speculative sampling and for tests. */
lm_status lm_sampler_distribution(lm_sampler *s, const float *logits, size_t n_vocab, float *probs);

/* ---- drawing from candidates ------------------------------------------------------ */

/* A step's logits reduced to the k largest (the backend's logits_topk: on a GPU only
 * these cross the bus). For the parameters lm_sampler_candidates_ok accepts, and the
 * rows lm_sampler_candidates_suffice accepts, lm_sampler_sample_candidates returns
 * exactly what lm_sampler_sample would from the full row: the same token, the same
 * state change, the same error (same status and sentence) for a NaN or an all -inf
 * row. Anything else goes through the full row. */
typedef struct lm_candidates {
    size_t n_vocab;      /* the full row's length                                     */
    int k;               /* 1 <= k <= n_vocab                                          */
    const int32_t *ids;  /* [k] the k largest logits' ids, largest first, ties by lower id */
    const float *vals;   /* [k] their logits                                          */
    float row_max;       /* NaN: the row holds a NaN, ids[0] is the lowest such id     */
} lm_candidates;

/* The candidates per row the generators ask for: greedy and top_k up to 63 are
 * served from them. */
#define LM_SAMPLER_CANDIDATES 64
/* The most candidates a draw takes (the backends' LM_TOPK_MAX). */
#define LM_TOPK_CANDIDATES_MAX 256

/* Whether every step of this sampler can be drawn from k candidates of each row
 * (subject to lm_sampler_candidates_suffice per row): no logit bias, no penalties,
 * no processors (user processors, grammars), and greedy or top_k in [1, k); with
 * k >= n_vocab (the candidates are the whole row) any temperature/top-k/top-p/min-p. */
bool lm_sampler_candidates_ok(const lm_sampler *s, int k);

/* Whether this row's candidates settle the draw exactly. False when top-k keeps
 * tokens tied with its k-th value and the candidates end inside that tie (the tie
 * set is unknown), and whenever lm_sampler_candidates_ok is false. */
bool lm_sampler_candidates_suffice(const lm_sampler *s, const lm_candidates *c);

/* lm_sampler_sample from candidates (draw, then accept). LM_ERR_INVALID_ARG when
 * lm_sampler_candidates_suffice is false: the caller must use the full row. */
lm_status lm_sampler_sample_candidates(lm_sampler *s, const lm_candidates *c, int32_t *token);

/* ---- log-probabilities reported to users ---------------------------------------- */


/* Log-probabilities of the model's raw distribution, log_softmax(logits) — before
 * bias, penalties, processors, temperature and filters — which is what OpenAI's
 * `logprobs` reports. Writes min(n_top, n_vocab) entries to top[] (most likely first;
 * ties by lower id) and sets *n_top_out to that count (top/n_top_out may be NULL when
 * n_top is 0); if token >= 0, *token_logprob = its logprob (token_logprob may be NULL
 * otherwise). O(n_vocab log n_top). LM_ERR_INVALID_ARG for a NaN logit, all logits
 * -inf, or a token outside [0, n_vocab). */
lm_status lm_logprobs(const float *logits, size_t n_vocab, int32_t token, float *token_logprob, size_t n_top,
                      lm_token_logprob *top, size_t *n_top_out);

#endif
