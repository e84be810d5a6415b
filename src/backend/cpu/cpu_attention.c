/* Attention over the paged KV cache, and storing keys and values into it.
 *
 * On AVX-512 CPUs attention runs in cpu_attention_avx512.c (16 queries per vector);
 * below is the portable version. Each (token, head) pair is independent: the work is
 * split over them across the pool.
 *
 * With an F16 cache the arithmetic is that of f16 dot products: the query is rounded
 * to f16 like the keys, and the softmax weights are rounded to f16 before they meet
 * the values (as llama.cpp computes it, so outputs can be compared with it). With an
 * F32 cache everything stays f32. */
#include <math.h>
#include <stdatomic.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "tensor/quant.h"

enum { KEY_RUN = 16 };

static inline float round_f16(float x) { return lm_f16_to_f32(lm_f32_to_f16(x)); }

/* sum a[i] * h[i] with h in f16, and y[i] += w * h[i]: F16C where the CPU has it. The
 * summation order is fixed by n alone (batch invariance). */
#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const float *a, const uint16_t *h, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8),
                               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8))), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += a[i] * lm_f16_to_f32(h[i]);
    return r;
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *y, float w, const uint16_t *h, int64_t n) {
    int64_t i = 0;
    __m256 wv = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * lm_f16_to_f32(h[i]);
}

__attribute__((target("f16c"))) static float round_f16_f16c(float x) {
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

static float dot_f16_scalar(const float *a, const uint16_t *h, int64_t n) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += a[i] * lm_f16_to_f32(h[i]);
    return r;
}

static void axpy_f16_scalar(float *y, float w, const uint16_t *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += w * lm_f16_to_f32(h[i]);
}

typedef float (*dot_f16_fn)(const float *, const uint16_t *, int64_t);
typedef void (*axpy_f16_fn)(float *, float, const uint16_t *, int64_t);
typedef float (*round_fn)(float);

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) static void to_f16_f16c(const float *x, uint16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = lm_f32_to_f16(x[i]);
}
#endif

/* f32 -> f16, rounding to nearest even (F16C gives the same bits as lm_f32_to_f16) */
static void to_f16(const float *x, uint16_t *h, int64_t n) {
#if defined(__x86_64__)
    /* CPUID is slow under a hypervisor: ask once (racing threads store the same value) */
    static _Atomic int f16c = -1;
    int v = atomic_load_explicit(&f16c, memory_order_relaxed);
    if (v < 0) atomic_store_explicit(&f16c, v = lm_cpu_has_avx2(), memory_order_relaxed);
    if (v) {
        to_f16_f16c(x, h, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_f16(x[i]);
}

void lm_cpu_kv_store(lm_backend *b, lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch, const float *k,
                     const float *v) {
    (void)b;
    int64_t d = kv->n_embd_kv;
    size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d);
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        size_t off = layer_off + (size_t)(lm_kv_cache_slot(kv, batch->seq[t], batch->pos[t]) * d);
        if (kv->type == LM_DTYPE_F32) {
            memcpy((float *)kv->k + off, k + t * d, (size_t)d * sizeof(float));
            memcpy((float *)kv->v + off, v + t * d, (size_t)d * sizeof(float));
        } else {
            to_f16(k + t * d, (uint16_t *)kv->k + off, d);
            to_f16(v + t * d, (uint16_t *)kv->v + off, d);
        }
    }
}

typedef struct attn_job {
    const lm_kv_cache *kv;
    int64_t layer;
    const lm_attn_batch *batch;
    const float *q;
    int64_t n_head, n_head_kv, head_dim, window;
    float scale;
    float *out;
    uint8_t *scratch; /* per thread: total [head_dim] f64; acc [head_dim], q [head_dim], scores [max_pos + 1] f32 */
    size_t scratch_per_thread;
} attn_job;

/* element offset of row `slot`, head hk, in one layer's K or V */
static inline size_t kv_off(const lm_kv_cache *kv, size_t layer_off, int64_t slot, int64_t hk, int64_t hd) {
    return layer_off + (size_t)(slot * kv->n_embd_kv + hk * hd);
}

static void attn_worker(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const lm_kv_cache *kv = j->kv;
    int64_t hd = j->head_dim, group = j->n_head / j->n_head_kv;
    size_t layer_off = (size_t)(j->layer * kv->n_blocks * kv->block_size * kv->n_embd_kv);
    bool f16 = kv->type == LM_DTYPE_F16;
    dot_f16_fn dot_f16 = dot_f16_scalar;
    axpy_f16_fn axpy_f16 = axpy_f16_scalar;
    round_fn to_f16 = round_f16;
#if defined(__x86_64__)
    if (lm_cpu_has_avx2())
        dot_f16 = dot_f16_avx2, axpy_f16 = axpy_f16_avx2, to_f16 = round_f16_f16c;
#endif
    uint8_t *mine = j->scratch + (size_t)ith * j->scratch_per_thread;
    double *total = (double *)mine;
    float *acc = (float *)(total + hd), *qv = acc + hd, *scores = qv + hd;
    int64_t i0, i1;
    lm_split_range(j->batch->n_tokens * j->n_head, ith, nth, &i0, &i1);
    for (int64_t item = i0; item < i1; item++) {
        int64_t t = item / j->n_head, h = item % j->n_head, hk = h / group;
        int32_t seq = j->batch->seq[t];
        int64_t pos = j->batch->pos[t];
        int64_t lo = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
        const float *q = j->q + (t * j->n_head + h) * hd;
        for (int64_t e = 0; e < hd; e++) qv[e] = f16 ? to_f16(q[e]) : q[e];
        float mx = -INFINITY;
        for (int64_t p = lo; p <= pos; p++) {
            size_t off = kv_off(kv, layer_off, lm_kv_cache_slot(kv, seq, p), hk, hd);
            float s = j->scale * (f16 ? dot_f16(qv, (const uint16_t *)kv->k + off, hd)
                                      : lm_cpu_dot_f32(qv, (const float *)kv->k + off, hd));
            scores[p - lo] = s;
            if (s > mx) mx = s;
        }
        double sum = 0.0;
        for (int64_t p = lo; p <= pos; p++) {
            float e = expf(scores[p - lo] - mx);
            scores[p - lo] = e;
            sum += e;
        }
        /* values are summed in f32 over runs of KEY_RUN keys, the runs in f64: the
         * accuracy of a pairwise sum at the cost of a plain one */
        memset(acc, 0, (size_t)hd * sizeof(float));
        memset(total, 0, (size_t)hd * sizeof(double));
        for (int64_t p = lo; p <= pos; p++) {
            size_t off = kv_off(kv, layer_off, lm_kv_cache_slot(kv, seq, p), hk, hd);
            float w = (float)(scores[p - lo] / sum);
            if (f16) {
                axpy_f16(acc, to_f16(w), (const uint16_t *)kv->v + off, hd);
            } else {
                const float *v = (const float *)kv->v + off;
                for (int64_t e = 0; e < hd; e++) acc[e] += w * v[e];
            }
            if ((p - lo) % KEY_RUN == KEY_RUN - 1 || p == pos) {
                for (int64_t e = 0; e < hd; e++) total[e] += acc[e];
                memset(acc, 0, (size_t)hd * sizeof(float));
            }
        }
        float *o = j->out + (t * j->n_head + h) * hd;
        for (int64_t e = 0; e < hd; e++) o[e] = (float)total[e];
    }
}

lm_status lm_cpu_attention(lm_backend *b, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                           const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                           float scale, float *out) {
    if (lm_cpu_attention_avx512_supported(n_head, n_head_kv, head_dim, kv)) {
        lm_status st = lm_cpu_attention_avx512(b, kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out);
        if (st == LM_ERR_NO_MEMORY) return lm_error(LM_ERR_NO_MEMORY, "out of memory for attention scores");
        return st;
    }
    int64_t max_pos = 0;
    for (int64_t t = 0; t < batch->n_tokens; t++)
        if (batch->pos[t] > max_pos) max_pos = batch->pos[t];
    int nth = lm_threadpool_size(lm_cpu_pool(b));
    size_t per = (size_t)head_dim * sizeof(double) + (size_t)(2 * head_dim + max_pos + 1) * sizeof(float);
    per = (per + 63) & ~(size_t)63;
    uint8_t *scratch = lm_cpu_scratch(b, LM_SCRATCH_ATTN, per * (size_t)nth);
    if (!scratch) return lm_error(LM_ERR_NO_MEMORY, "out of memory for attention scores");
    attn_job job = {kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out, scratch, per};
    lm_threadpool_run(lm_cpu_pool(b), attn_worker, &job);
    return LM_OK;
}
