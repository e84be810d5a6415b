/* The backend op vtable. The forward pass (model/forward.c) is written once over
 * these ops; a backend supplies memory, weights in its preferred layout, and the
 * kernels. Activations are row-major f32 matrices in backend memory: a buffer
 * "[n][d]" holds n rows of d contiguous floats. Per-token metadata (positions,
 * sequence ids) is passed in host memory.
 *
 * The CPU reference backend (backend/cpu/) defines the meaning of every op; any
 * faster backend is tested against it op by op (tests/unit/test_backend_ops.c). */
#ifndef LM_BACKEND_BACKEND_H
#define LM_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stdlib.h>

#include "model/hparams.h"
#include "tensor/tensor.h"

struct lm_kv_cache;

typedef struct lm_backend lm_backend;
typedef struct lm_weight lm_weight; /* a weight matrix prepared by a backend */

/* What attention needs to know about the tokens of a batch. */
typedef struct lm_attn_batch {
    int64_t n_tokens;
    const int32_t *pos; /* [n_tokens] position of each token in its sequence */
    const int32_t *seq; /* [n_tokens] sequence id of each token              */
} lm_attn_batch;

/* The steps between the Q/K/V products and attention, for the fused op below. */
typedef struct lm_qkv_finish {
    float *q, *k, *v;             /* [n][n_head * head_dim], [n][n_head_kv * head_dim] x 2 */
    const float *bq, *bk, *bv;    /* biases, or NULL                                       */
    const float *q_norm, *k_norm; /* per-head RMS norm weights [head_dim], or NULL          */
    float eps;
    int64_t n_head, n_head_kv, head_dim, n_rot;
    float theta, freq_scale;
    lm_rope_mode mode;
} lm_qkv_finish;

/* One layer's weights, for decode_step (the model's lm_layer_weights, seen from below). */
typedef struct lm_decode_layer {
    const lm_weight *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
    const float *attn_norm, *ffn_norm;
    const float *bq, *bk, *bv; /* NULL: no biases */
} lm_decode_layer;

/* The most layers a decode_step model has (the forward pass passes them on the stack). */
#define LM_DECODE_MAX_LAYERS 256

/* What decode_step runs: the model's shapes and every weight of its forward pass. */
typedef struct lm_decode_model {
    const lm_hparams *hp;
    const lm_weight *tok_embd, *output;
    const float *output_norm;
    const lm_decode_layer *layers; /* [hp->n_layer] */
} lm_decode_model;

typedef struct lm_backend_ops {
    const char *name;
    void (*destroy)(lm_backend *b);

    /* Backend memory. alloc returns NULL on failure; contents are undefined. */
    void *(*alloc)(lm_backend *b, size_t bytes);
    void (*free)(lm_backend *b, void *p);
    void (*upload)(lm_backend *b, void *dst, const void *host_src, size_t bytes);
    void (*download)(lm_backend *b, void *host_dst, const void *src, size_t bytes);
    /* Copy within backend memory; the ranges may overlap. */
    void (*copy)(lm_backend *b, void *dst, const void *src, size_t bytes);
    /* Host memory that `download` fills fastest (page-locked on a GPU: a copy into
     * ordinary pages runs at a fraction of the bus's speed; 256 rows of logits of a
     * 152k vocabulary are 155 MB a step). Optional: NULL = malloc/free. Use through
     * lm_backend_host_alloc / lm_backend_host_free. */
    void *(*host_alloc)(lm_backend *b, size_t bytes);
    void (*host_free)(lm_backend *b, void *p);
    /* The most device memory in use at once since the backend was created, in bytes
     * (the whole device's, as the driver reports it). Optional: NULL where the backend
     * has no memory of its own (the CPU: its memory is the process's). */
    uint64_t (*peak_memory)(lm_backend *b);
    /* The most bytes the backend may add beside the weights for faster forms of them
     * (the CUDA backend's bf16 copies of quantized and f16 weights, made on their first
     * large product). Optional: NULL where the backend makes none. A model under a
     * memory limit sets 0: the limit counts the weights and the KV caches only. */
    void (*set_copy_limit)(lm_backend *b, uint64_t bytes);

    /* Weights: a matrix of ne[1] rows by ne[0] columns in any supported format. The
     * tensor's bytes stay owned by the caller and must outlive the weight. */
    lm_status (*weight_create)(lm_backend *b, const lm_tensor *t, lm_weight **out);
    void (*weight_free)(lm_backend *b, lm_weight *w);
    /* Optional: weights always multiplied together through matmul_many (Q/K/V,
     * gate/up), called once after creating them. The backend may store them side by
     * side and then run them as one product. Best effort: on any failure they stay as
     * they were. Each keeps its own weight_free (called for all of them). */
    void (*weight_pack)(lm_backend *b, lm_weight *const *w, int n_w);

    /* out[i] = row ids[i] of `table` as f32; out [n][table cols]; ids in host memory
     * and already checked to be in range. */
    void (*get_rows)(lm_backend *b, const lm_weight *table, const int32_t *ids, int64_t n, float *out);

    /* y[t][r] = sum_k W[r][k] * x[t][k]; x [n][cols(W)], y [n][rows(W)].
     * LM_ERR_NO_MEMORY if the backend cannot get its working memory. */
    lm_status (*matmul)(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y);

    /* Several products of one input: y[i] = W[i] x for i < n_w, all W[i] with the same
     * columns (Q/K/V, gate/up). Optional (NULL: the forward pass calls matmul for each
     * W[i]); a backend uses it to prepare x once and run all rows in one pass. Each
     * y[i] must equal what matmul would give, bit for bit, unless weight_pack packed
     * the weights: one product over all their rows may sum in another order (within
     * matmul's own rounding), and still gives a token the same bits whatever batch it
     * is in wherever matmul does. */
    lm_status (*matmul_many)(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                             float *const *y);

    /* Optional fused form (NULL: matmul_many, then swiglu) of the feed-forward's first
     * half: gate = W_gate x and up = W_up x (same shapes), then gate[i] =
     * silu(gate[i]) * up[i]; x [n][cols], gate and up [n][rows]. up is working memory
     * (unspecified after the call). gate bit-identical to the separate ops. */
    lm_status (*matmul_swiglu)(lm_backend *b, const lm_weight *w_gate, const lm_weight *w_up, const float *x,
                               int64_t n, float *gate, float *up);

    /* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w; x, y [n][d] (may alias), w [d]. */
    void (*rms_norm)(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y);

    /* y[i] += x[i] for i < n. */
    void (*add)(lm_backend *b, float *y, const float *x, int64_t n);
    /* Optional fused form (NULL: the forward pass calls add, then rms_norm) of the
     * residual add and the norm that follows it: y += x, then out = rms_norm(y) * w;
     * y, x, out [n][d], w [d] (NULL: no weight). One launch instead of two; y and out
     * bit-identical to add(y, x, n * d) then rms_norm(y, w, n, d, eps, out). out may
     * be y; it must not overlap x. */
    void (*add_rms_norm)(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                         float *out);
    /* y[r][j] += bias[j]; y [n][d]. */
    void (*add_bias)(lm_backend *b, float *y, const float *bias, int64_t n, int64_t d);
    /* y[i] *= s. */
    void (*scale)(lm_backend *b, float *y, float s, int64_t n);

    /* Rotates the first n_rot dims of each head of x [n][n_head * head_dim] in place,
     * angle pos[t] * freq_scale * theta^(-2i/n_rot) for pair i (pairing by mode). */
    void (*rope)(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                 const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode);

    /* out[i] = act(gate[i]) * up[i]: SiLU (SwiGLU) or tanh-approximated GELU. */
    void (*swiglu)(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);
    void (*geglu)(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);

    /* Writes k, v [n][n_embd_kv] of layer `layer` into the cache slots of the batch's
     * (seq, pos); the slots must be reserved. */
    void (*kv_store)(lm_backend *b, struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                     const float *k, const float *v);

    /* Optional fused form (NULL: the forward pass calls the ops one by one) of:
     * add_bias of q, k, v; rms_norm of each q and k head; rope of q and k; kv_store
     * of k and v — in one launch instead of seven. Bit-identical to those ops. */
    void (*qkv_finish)(lm_backend *b, struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                       const lm_qkv_finish *p);

    /* Causal attention of q [n][n_head * head_dim] over the cached keys/values of each
     * token's sequence at positions <= its own (and > pos - window when window > 0);
     * out [n][n_head * head_dim]; score = scale * q·k; GQA groups n_head / n_head_kv.
     * LM_ERR_NO_MEMORY if the backend cannot get its working memory. */
    lm_status (*attention)(lm_backend *b, const struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                      const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                      float scale, float *out);

    /* Optional (NULL: ops always run as they are called). Brackets the ops of one
     * forward pass so the backend can record them once and replay the recording
     * (the CUDA backend: a CUDA graph, one launch instead of hundreds). `key` names
     * the pass's shape: passes with the same nonzero key issue the same ops, with
     * the same sizes, on the same buffers, and differ only in the contents of their
     * host metadata (token ids, positions, the batch's KV block tables); 0 = do not
     * record this pass. Between the two calls ops may only read their host inputs
     * and return; pass_end runs the pass and reports the first error of any op in
     * it. No upload or download inside a pass. If pass_end fails, the pass's
     * outputs are undefined: run it again with key 0.
     * `tokens` are the pass's token ids. Where the recording of `key` reads no host
     * metadata but the token ids, the positions and the sequences' KV block tables,
     * pass_begin may run it from these alone: it sets *ran, and the caller issues
     * no ops and no pass_end (errors as pass_end's). */
    lm_status (*pass_begin)(lm_backend *b, uint64_t key, const struct lm_kv_cache *kv, const lm_attn_batch *batch,
                            const int32_t *tokens, bool *ran);
    lm_status (*pass_end)(lm_backend *b);

    /* Optional (NULL: op by op). The whole forward pass of a batch of one token whose
     * logits are wanted, from its id (tokens, host memory) to logits [n_vocab], in one
     * call: the CUDA backend runs it as one kernel. x [n_embd] is working memory (the
     * residual stream). The token's keys and values go to the cache as kv_store puts
     * them. Results equal the op-by-op pass's within rounding (products summed in
     * another order), not to the bit. LM_ERR_UNSUPPORTED, with no error message and
     * nothing done, where the backend does not serve this model, cache or batch: the
     * caller then runs the ops one by one. Inside a pass_begin/pass_end bracket like
     * any op. */
    lm_status (*decode_step)(lm_backend *b, const lm_decode_model *m, struct lm_kv_cache *kv,
                             const lm_attn_batch *batch, const int32_t *tokens, float *x, float *logits);

    /* Optional (NULL: the forward pass downloads the logits and runs
     * lm_logits_topk_host). Reduces each row of logits [n_rows][n_vocab] (backend
     * memory) to what sampling needs, so a step copies back k values per row instead
     * of n_vocab. Outputs are HOST memory (page-locked when taken from host_alloc),
     * filled when the call returns:
     *   ids  [n_rows][k]  the ids of the k largest logits, largest first, equal
     *                     logits by lower id (+0 and -0 are equal; -inf entries
     *                     count like any value, so a row with fewer than k finite
     *                     logits ends with -inf candidates);
     *   vals [n_rows][k]  their logits, exactly as in the row;
     *   row_max [n_rows]  the largest logit;
     *   row_lse [n_rows]  log(sum_t exp(l_t)), computed as max + log(sum exp(l - max))
     *                     in double: -inf for a row of -inf, +inf when max is +inf.
     *                     May be NULL: not computed (the sampler does not need it).
     * A row holding a NaN is not an error of the call (one bad row must not fail a
     * whole batch): its row_max (and row_lse) is NaN and ids[0] is the lowest id
     * whose logit is NaN; its other outputs are unspecified. The sampler reports
     * that row exactly as it would from the full row.
     * 1 <= k <= min(LM_TOPK_MAX, n_vocab), else LM_ERR_INVALID_ARG. Not inside a
     * pass_begin/pass_end bracket (it copies to the host). */
    lm_status (*logits_topk)(lm_backend *b, const float *logits, int64_t n_rows, int64_t n_vocab, int k,
                             int32_t *ids, float *vals, float *row_max, float *row_lse);
} lm_backend_ops;

/* The most candidates logits_topk returns per row. */
#define LM_TOPK_MAX 256

/* logits_topk on host memory, on the calling thread: the meaning of the op (the CPU
 * backend runs it on its threads; backend/cpu/cpu_topk.c) and what the forward pass
 * runs on downloaded logits behind a backend without the op. */
lm_status lm_logits_topk_host(const float *logits, int64_t n_rows, int64_t n_vocab, int k, int32_t *ids,
                              float *vals, float *row_max, float *row_lse);

struct lm_backend {
    const lm_backend_ops *ops;
};

/* The CPU backend with `n_threads` worker threads (1 = run on the caller). */
lm_status lm_backend_cpu_create(int n_threads, lm_backend **out);

/* The CUDA backend on GPU `device` (0 = the first). LM_ERR_UNSUPPORTED, with a
 * sentence naming what is missing, when this build has no CUDA backend (configure
 * with -DLUMEN_CUDA=ON), when no GPU or driver is present, or when the GPU is older
 * than the build targets (compute capability 9.0). Ops may be called from any one
 * thread at a time. Errors inside void ops (a failed kernel, a failed download) are
 * reported by the next matmul or attention. */
lm_status lm_backend_cuda_create(int device, lm_backend **out);

/* Host buffers for downloads (see host_alloc); NULL when out of memory. */
static inline void *lm_backend_host_alloc(lm_backend *b, size_t bytes) {
    return b->ops->host_alloc ? b->ops->host_alloc(b, bytes) : malloc(bytes);
}
static inline void lm_backend_host_free(lm_backend *b, void *p) {
    if (!p) return;
    if (b->ops->host_free)
        b->ops->host_free(b, p);
    else
        free(p);
}

static inline void lm_backend_free(lm_backend *b) {
    if (b) b->ops->destroy(b);
}

#endif
