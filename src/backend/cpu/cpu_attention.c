/* Attention over the paged KV cache. Each (token, head) pair is independent: the
 * work is split over them across the pool.
 *
 * With an F16 cache the arithmetic is that of f16 dot products: the query is rounded
 * to f16 like the keys, and the softmax weights are rounded to f16 before they meet
 * the values (as llama.cpp computes it, so outputs can be compared with it). With an
 * F32 cache everything stays f32. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "tensor/quant.h"

static inline float round_f16(float x) { return lm_f16_to_f32(lm_f32_to_f16(x)); }

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
            uint16_t *kd = (uint16_t *)kv->k + off, *vd = (uint16_t *)kv->v + off;
            for (int64_t e = 0; e < d; e++) {
                kd[e] = lm_f32_to_f16(k[t * d + e]);
                vd[e] = lm_f32_to_f16(v[t * d + e]);
            }
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
    uint8_t *scratch; /* per thread: acc [head_dim] f64, row [head_dim] f32, q [head_dim] f32, scores */
    size_t scratch_per_thread;
} attn_job;

/* row `slot` of head hk of K or V as f32 */
static inline const float *kv_row(const lm_kv_cache *kv, const void *base, size_t layer_off, int64_t slot, int64_t hk,
                                  int64_t hd, float *tmp) {
    size_t off = layer_off + (size_t)(slot * kv->n_embd_kv + hk * hd);
    if (kv->type == LM_DTYPE_F32) return (const float *)base + off;
    const uint16_t *h = (const uint16_t *)base + off;
    for (int64_t e = 0; e < hd; e++) tmp[e] = lm_f16_to_f32(h[e]);
    return tmp;
}

static void attn_worker(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const lm_kv_cache *kv = j->kv;
    int64_t hd = j->head_dim, group = j->n_head / j->n_head_kv;
    size_t layer_off = (size_t)(j->layer * kv->n_blocks * kv->block_size * kv->n_embd_kv);
    bool f16 = kv->type == LM_DTYPE_F16;
    uint8_t *mine = j->scratch + (size_t)ith * j->scratch_per_thread;
    double *acc = (double *)mine;
    float *row = (float *)(acc + hd), *qv = row + hd, *scores = qv + hd;
    int64_t i0, i1;
    lm_split_range(j->batch->n_tokens * j->n_head, ith, nth, &i0, &i1);
    for (int64_t item = i0; item < i1; item++) {
        int64_t t = item / j->n_head, h = item % j->n_head, hk = h / group;
        int32_t seq = j->batch->seq[t];
        int64_t pos = j->batch->pos[t];
        int64_t lo = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
        const float *q = j->q + (t * j->n_head + h) * hd;
        for (int64_t e = 0; e < hd; e++) qv[e] = f16 ? round_f16(q[e]) : q[e];
        float mx = -INFINITY;
        for (int64_t p = lo; p <= pos; p++) {
            const float *k = kv_row(kv, kv->k, layer_off, lm_kv_cache_slot(kv, seq, p), hk, hd, row);
            float s = j->scale * lm_cpu_dot_f32(qv, k, hd);
            scores[p - lo] = s;
            if (s > mx) mx = s;
        }
        double sum = 0.0;
        for (int64_t p = lo; p <= pos; p++) {
            float e = expf(scores[p - lo] - mx);
            scores[p - lo] = e;
            sum += e;
        }
        memset(acc, 0, (size_t)hd * sizeof(double));
        for (int64_t p = lo; p <= pos; p++) {
            const float *v = kv_row(kv, kv->v, layer_off, lm_kv_cache_slot(kv, seq, p), hk, hd, row);
            float w = (float)(scores[p - lo] / sum);
            if (f16) w = round_f16(w);
            for (int64_t e = 0; e < hd; e++) acc[e] += (double)w * v[e];
        }
        float *o = j->out + (t * j->n_head + h) * hd;
        for (int64_t e = 0; e < hd; e++) o[e] = (float)acc[e];
    }
}

lm_status lm_cpu_attention(lm_backend *b, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                           const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                           float scale, float *out) {
    int64_t max_pos = 0;
    for (int64_t t = 0; t < batch->n_tokens; t++)
        if (batch->pos[t] > max_pos) max_pos = batch->pos[t];
    int nth = lm_threadpool_size(lm_cpu_pool(b));
    size_t per = (size_t)head_dim * (sizeof(double) + 2 * sizeof(float)) + (size_t)(max_pos + 1) * sizeof(float);
    per = (per + 63) & ~(size_t)63;
    uint8_t *scratch = lm_cpu_scratch(b, LM_SCRATCH_ATTN, per * (size_t)nth);
    if (!scratch) return lm_error(LM_ERR_NO_MEMORY, "out of memory for attention scores");
    attn_job job = {kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out, scratch, per};
    lm_threadpool_run(lm_cpu_pool(b), attn_worker, &job);
    return LM_OK;
}
