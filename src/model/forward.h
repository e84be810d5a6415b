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

/* What lm_forward_topk returns for the selected tokens (rows, in batch order) instead
 * of their logits: each row's k best candidates (the backend's logits_topk, see
 * backend.h for their exact meaning), all in host memory. */
typedef struct lm_topk_out {
    int k;              /* candidates per row: 1..min(LM_TOPK_MAX, n_vocab)            */
    int32_t *ids;       /* [n_out][k] token ids, largest logit first, ties by lower id */
    float *vals;        /* [n_out][k] their logits                                    */
    float *row_max;     /* [n_out] NaN: the row holds a NaN, ids[0] is the first one   */
    float *row_lse;     /* [n_out] log-sum-exp of each row, or NULL: not computed      */
    /* Optional: the rows the candidates do not settle. Once the candidates are in,
     * every row r with need_full(user, r) true gets its full logits in
     * full + r * n_vocab, and fetched[r] says which rows did (1) or not (0). */
    bool (*need_full)(void *user, int64_t row);
    void *user;
    float *full;        /* [n_out][n_vocab] host; needed with need_full               */
    int8_t *fetched;    /* [n_out]; needed with need_full                             */
} lm_topk_out;

/* lm_forward that copies back only each row's candidates: on a backend with
 * logits_topk the logits stay in device memory (k values per row cross the bus
 * instead of n_vocab); otherwise they are downloaded and reduced on the host by
 * lm_logits_topk_host. Rows for which out->need_full asks are then downloaded
 * whole, before the pass's buffers are let go. */
lm_status lm_forward_topk(const lm_model_internal *m, lm_kv_cache *kv, const lm_batch *batch, const lm_topk_out *out);

/* The model as a backend's decode_step sees it (backend.h): layers [hp.n_layer], at
 * most LM_DECODE_MAX_LAYERS, is filled and pointed at. */
void lm_decode_model_of(const lm_model_internal *m, lm_decode_layer *layers, lm_decode_model *out);

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
