/* The forward pass, written once over the backend ops for every architecture. */
#ifndef LM_MODEL_FORWARD_H
#define LM_MODEL_FORWARD_H

#include "kv/kv_cache.h"
#include "model/model.h"

/* A batch of tokens from any number of sequences (DESIGN.md invariant 2). Tokens of
 * one sequence must come in increasing position order; earlier positions of that
 * sequence must already be in the cache or earlier in this batch. */
typedef struct lm_batch {
    int64_t n_tokens;
    const int32_t *tokens; /* [n_tokens] token ids                               */
    const int32_t *pos;    /* [n_tokens] position of each token in its sequence  */
    const int32_t *seq;    /* [n_tokens] sequence id (a KV cache sequence slot)  */
    const int8_t *logits;  /* [n_tokens] nonzero: return this token's logits;
                            * NULL: only the last token's                       */
} lm_batch;

/* Runs the batch, writing K/V into `kv` and the logits of the selected tokens, in
 * batch order, to `logits` (host memory, [n_selected][n_vocab]). */
lm_status lm_forward(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, float *logits);

/* The activation buffers a model keeps between forward passes (stable addresses
 * let a backend replay a recorded pass); created with the model. */
typedef struct lm_forward_state lm_forward_state;
lm_status lm_forward_state_create(lm_forward_state **out);
void lm_forward_state_free(lm_backend *b, lm_forward_state *st);

/* A KV cache sized for `n_seqs` sequences of up to `n_ctx` tokens each, storing
 * keys and values as `type` (LM_DTYPE_F16, the usual choice, or LM_DTYPE_F32). */
lm_status lm_kv_cache_for_model(const lm_model_internal *m, int64_t n_ctx, int64_t n_seqs, lm_dtype type,
                                lm_kv_cache **out);

#endif
