/* Attention over the paged KV cache. Each (token, head) pair is independent: the
 * work is split over them across the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "kv/kv_cache.h"

void lm_cpu_kv_store(lm_backend *b, lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch, const float *k,
                     const float *v) {
    (void)b;
    int64_t d = kv->n_embd_kv;
    size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d);
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        int64_t slot = lm_kv_cache_slot(kv, batch->seq[t], batch->pos[t]);
        memcpy(kv->k + layer_off + (size_t)(slot * d), k + t * d, (size_t)d * sizeof(float));
        memcpy(kv->v + layer_off + (size_t)(slot * d), v + t * d, (size_t)d * sizeof(float));
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
} attn_job;

static void attn_worker(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const lm_kv_cache *kv = j->kv;
    int64_t hd = j->head_dim, d_kv = kv->n_embd_kv, group = j->n_head / j->n_head_kv;
    size_t layer_off = (size_t)(j->layer * kv->n_blocks * kv->block_size * d_kv);
    const float *kbase = kv->k + layer_off, *vbase = kv->v + layer_off;
    int64_t max_pos = 0;
    for (int64_t t = 0; t < j->batch->n_tokens; t++)
        if (j->batch->pos[t] > max_pos) max_pos = j->batch->pos[t];
    float *scores = malloc((size_t)(max_pos + 1) * sizeof(float));
    double *acc = malloc((size_t)hd * sizeof(double));
    if (!scores || !acc) {
        free(scores);
        free(acc);
        return;
    }
    int64_t i0, i1;
    lm_split_range(j->batch->n_tokens * j->n_head, ith, nth, &i0, &i1);
    for (int64_t item = i0; item < i1; item++) {
        int64_t t = item / j->n_head, h = item % j->n_head, hk = h / group;
        int32_t seq = j->batch->seq[t];
        int64_t pos = j->batch->pos[t];
        int64_t lo = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
        const float *qv = j->q + (t * j->n_head + h) * hd;
        float mx = -INFINITY;
        for (int64_t p = lo; p <= pos; p++) {
            int64_t slot = lm_kv_cache_slot(kv, seq, p);
            float s = j->scale * lm_cpu_dot_f32(qv, kbase + slot * d_kv + hk * hd, hd);
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
            const float *vv = vbase + lm_kv_cache_slot(kv, seq, p) * d_kv + hk * hd;
            double w = scores[p - lo];
            for (int64_t e = 0; e < hd; e++) acc[e] += w * vv[e];
        }
        float *o = j->out + (t * j->n_head + h) * hd;
        for (int64_t e = 0; e < hd; e++) o[e] = (float)(acc[e] / sum);
    }
    free(scores);
    free(acc);
}

void lm_cpu_attention(lm_backend *b, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                      const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                      float scale, float *out) {
    attn_job job = {kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out};
    lm_threadpool_run(lm_cpu_pool(b), attn_worker, &job);
}
