/* Shared between the CPU backend's files: the backend struct and kernel entry points. */
#ifndef LM_BACKEND_CPU_INTERNAL_H
#define LM_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "backend/cpu/cpu_q8.h"
#include "core/threadpool.h"

/* Scratch buffers reused across calls, one per purpose. A backend runs one forward
 * pass at a time (the engine's worker thread), so they need no locking. */
typedef enum lm_cpu_scratch_slot {
    LM_SCRATCH_Q8_ACT,
    LM_SCRATCH_TILES,
    LM_SCRATCH_PANEL,
    LM_SCRATCH_ATTN,
    LM_SCRATCH_COUNT
} lm_cpu_scratch_slot;

/* RoPE's cos/sin for the positions of one batch, kept across layers (every layer of a
 * pass rotates the same positions; Gemma alternates two bases, hence two). */
typedef struct lm_cpu_rope_cache {
    int32_t *pos;        /* [n] the positions it was made for (n < 0: empty) */
    float *cs;           /* [n][n_rot / 2][2] cos, sin                      */
    int64_t n, n_rot, pos_cap, cs_cap;
    float theta, freq_scale;
    int mode;
    uint64_t used;       /* for replacing the least recently used */
} lm_cpu_rope_cache;

typedef struct lm_cpu_backend {
    lm_backend base;
    lm_threadpool *pool;
    void *scratch[LM_SCRATCH_COUNT];
    size_t scratch_size[LM_SCRATCH_COUNT];
    lm_cpu_rope_cache rope[2];
    uint64_t rope_clock;
} lm_cpu_backend;

/* On the CPU a weight is the tensor (its bytes copied into huge pages at load, see
 * cpu_weight_create) and the integer kernels chosen for its format on this CPU
 * ({NULL, NULL}: the f32 path). */
struct lm_weight {
    lm_tensor t;       /* t.data: `owned` if the weight was copied, else the mapping */
    lm_q8a_kernels q8;
    void *owned;       /* the private copy of the bytes, or NULL */
};

static inline lm_threadpool *lm_cpu_pool(lm_backend *b) { return ((lm_cpu_backend *)b)->pool; }

/* Calls fn(ctx, begin, end) on ranges covering [0, n), split across the pool when each
 * thread would get at least `min_per_thread` items (else on the caller alone): for the
 * row-wise ops around the matrix products, which would otherwise run serially. The
 * items are independent, so results do not depend on the split. */
void lm_cpu_parallel_for(lm_backend *b, int64_t n, int64_t min_per_thread,
                         void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);

/* A 64-byte aligned buffer of at least `bytes` for `slot`, grown as needed; NULL when
 * memory runs out (the op then falls back or reports it). */
void *lm_cpu_scratch(lm_backend *b, lm_cpu_scratch_slot slot, size_t bytes);

/* sum a[i] * b[i], vectorized where the CPU allows (runtime dispatch). */
float lm_cpu_dot_f32(const float *a, const float *b, int64_t n);

/* y[t][row0 + r] = tile[r] . x[t] for r < n_rows, t < n_tok; tile [n_rows][k] and
 * x [n_tok][k] f32, y rows y_stride apart. Register-blocked; runtime-dispatched. */
void lm_cpu_gemm_tile(const float *tile, int64_t n_rows, const float *x, int64_t n_tok, int64_t k, float *y,
                      int64_t y_stride, int64_t row0);

/* Row r of weight w as f32 into dst [cols]. */
void lm_cpu_weight_row(const lm_weight *w, int64_t r, float *dst);

void lm_cpu_get_rows(lm_backend *b, const lm_weight *table, const int32_t *ids, int64_t n, float *out);
lm_status lm_cpu_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y);
lm_status lm_cpu_matmul_many(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                             float *const *y);
void lm_cpu_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y);
void lm_cpu_add(lm_backend *b, float *y, const float *x, int64_t n);
void lm_cpu_add_rms_norm(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                         float *out);
void lm_cpu_add_bias(lm_backend *b, float *y, const float *bias, int64_t n, int64_t d);
void lm_cpu_scale(lm_backend *b, float *y, float s, int64_t n);
void lm_cpu_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                 const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode);
void lm_cpu_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);
void lm_cpu_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);
void lm_cpu_kv_store(lm_backend *b, struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                     const float *k, const float *v);
/* The AVX-512 attention (cpu_attention_avx512.c) and whether it takes these shapes. */
bool lm_cpu_attention_avx512_supported(int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                                       const struct lm_kv_cache *kv);
lm_status lm_cpu_attention_avx512(lm_backend *b, const struct lm_kv_cache *kv, int64_t layer,
                                  const lm_attn_batch *batch, const float *q, int64_t n_head, int64_t n_head_kv,
                                  int64_t head_dim, int64_t window, float scale, float *out);
lm_status lm_cpu_attention(lm_backend *b, const struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                      const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                      float scale, float *out);
/* logits_topk (cpu_topk.c): lm_logits_topk_host with the rows split across the pool. */
lm_status lm_cpu_logits_topk(lm_backend *b, const float *logits, int64_t n_rows, int64_t n_vocab, int k,
                             int32_t *ids, float *vals, float *row_max, float *row_lse);

#endif
