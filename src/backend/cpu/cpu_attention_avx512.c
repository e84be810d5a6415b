/* Attention over the paged KV cache on AVX-512: 16 queries per vector.
 *
 * Work item: up to QT consecutive tokens of one sequence and one KV head, i.e. the
 * queries of every head of that GQA group for those tokens, 16 to a vector (lane =
 * query). Keys and values are read by cache blocks of 16 positions (the cache's
 * block: absolute positions 16k..16k+15 in contiguous slots), converted to f32 once
 * per item, and their elements broadcast to all lanes.
 *
 * The arithmetic of one query is fixed by its own position range [lo, pos] alone (never
 * by the other queries of its vector, the item or the thread), so a token's output is
 * the same bits in any batch (DESIGN.md invariant 2):
 *  - q rounded to f16 with an F16 cache (the keys' precision, as llama.cpp does);
 *  - score of each key: one f32 fma chain over the head dimension in order, times
 *    scale;
 *  - softmax: the max over [lo, pos], e = exp(s - max) (exp_v below, 1-2 ulp), their sum
 *    in f64 in position order, weights (float)(e * (1 / sum)) (rounded to f16 with an
 *    F16 cache, before they meet the values);
 *  - output: per cache block an f32 fma chain over its keys in [lo, pos] in order, the
 *    blocks added in f64.
 * Lanes outside their query's range are masked (never added), so a query computes the
 * same operations whatever else shares its vector. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "kv/kv_cache.h"

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
                             apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif
#include <immintrin.h>

#include "backend/cpu/cpu_exp512.h"

enum { KB = 16 };

#define AUNROLL _Pragma("GCC unroll 8") /* positions per cache block: the cache's block size */

typedef struct item {
    int64_t t0, t1, hk;
} item;

typedef struct job {
    const lm_kv_cache *kv;
    int64_t layer;
    const lm_attn_batch *batch;
    const float *q;
    int64_t n_head, n_head_kv, hd, window;
    float scale;
    float *out;
    const item *items;
    int64_t n_items;
    uint8_t *scratch;
    size_t per_thread;
    int64_t max_groups, max_blocks;
    _Atomic int64_t next; /* the next item to take */
} job;

/* per-thread scratch: kv [16][hd] f32 (the block's keys, then its values),
 * qt [groups][hd][16] f32, scores [groups][blocks * 16][16] f32, tot [groups][hd][16] f64 */
static size_t scratch_bytes(int64_t hd, int64_t groups, int64_t blocks) {
    size_t b = (size_t)(KB * hd) * 4 + (size_t)(groups * hd * 16) * 4 + (size_t)(groups * blocks * KB * 16) * 4 +
               (size_t)(groups * hd * 16) * 8;
    return b + 4 * 64;
}

static inline void *take(uint8_t **p, size_t bytes) {
    void *r = *p;
    *p += (bytes + 63) & ~(size_t)63;
    return r;
}

/* rows p0..p0+15 of one cache block, head hk, as f32 into dst [16][hd]; rows past pmax
 * (maybe unreserved) are zero */
static void load_block(const lm_kv_cache *kv, const void *base, size_t layer_off, int32_t seq, int64_t p0,
                       int64_t pmax, int64_t hk, int64_t hd, float *dst) {
    for (int64_t l = 0; l < KB; l++) {
        float *d = dst + l * hd;
        if (p0 + l > pmax) {
            memset(d, 0, (size_t)hd * 4);
            continue;
        }
        size_t off = layer_off + (size_t)(lm_kv_cache_slot(kv, seq, p0 + l) * kv->n_embd_kv + hk * hd);
        if (kv->type == LM_DTYPE_F16) {
            const uint16_t *src = (const uint16_t *)base + off;
            for (int64_t e = 0; e < hd; e += 16)
                _mm512_store_ps(d + e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + e))));
        } else {
            memcpy(d, (const float *)base + off, (size_t)hd * 4);
        }
    }
}

static inline __m512d lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d hi8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static void run_item(const job *j, const item *it, uint8_t *mem) {
    const lm_kv_cache *kv = j->kv;
    const int64_t hd = j->hd, G = j->n_head / j->n_head_kv, hk = it->hk, nq = (it->t1 - it->t0) * G;
    const int64_t ng = (nq + 15) / 16;
    const bool f16 = kv->type == LM_DTYPE_F16;
    const int32_t seq = j->batch->seq[it->t0];
    const size_t layer_off = (size_t)(j->layer * kv->n_blocks * kv->block_size * kv->n_embd_kv);
    float *blk = take(&mem, (size_t)(KB * hd) * 4);
    float *qt = take(&mem, (size_t)(j->max_groups * hd * 16) * 4);
    float *scores = take(&mem, (size_t)(j->max_groups * j->max_blocks * KB * 16) * 4);
    double *tot = take(&mem, (size_t)(j->max_groups * hd * 16) * 8);
    /* per lane: range [lo, pos]; unused lanes get an empty range */
    _Alignas(64) int32_t lo[64], pos[64];
    int64_t kb_min = INT64_MAX, kb_max = 0, pmax = 0;
    for (int64_t i = 0; i < ng * 16; i++) {
        if (i >= nq) {
            lo[i] = 1, pos[i] = 0;
            continue;
        }
        int64_t t = it->t0 + i / G, h = hk * G + i % G, p = j->batch->pos[t];
        int64_t l = j->window > 0 && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
        lo[i] = (int32_t)l, pos[i] = (int32_t)p;
        kb_min = l / KB < kb_min ? l / KB : kb_min;
        kb_max = p / KB > kb_max ? p / KB : kb_max;
        pmax = p > pmax ? p : pmax;
        const float *qs = j->q + (t * j->n_head + h) * hd;
        float *qd = qt + (i / 16) * hd * 16 + i % 16;
        for (int64_t e = 0; e < hd; e++) qd[e * 16] = f16 ? _cvtsh_ss(_cvtss_sh(qs[e], _MM_FROUND_TO_NEAREST_INT)) : qs[e];
    }
    for (int64_t i = nq; i < ng * 16; i++)
        for (int64_t e = 0; e < hd; e++) qt[(i / 16) * hd * 16 + e * 16 + i % 16] = 0.0f;
    const int64_t nk = (kb_max - kb_min + 1) * KB; /* key rows of the item */
    const __m512 scale = _mm512_set1_ps(j->scale), ninf = _mm512_set1_ps(-INFINITY);

    /* lanes whose range holds position p */
#define LANES(g, p)                                                                                            \
    (_mm512_cmple_epi32_mask(_mm512_load_si512(lo + 16 * (g)), _mm512_set1_epi32((int)(p))) &                  \
     _mm512_cmpge_epi32_mask(_mm512_load_si512(pos + 16 * (g)), _mm512_set1_epi32((int)(p))))

    /* scores: 8 keys at a time (independent chains), each element of a key broadcast */
    for (int64_t kb = kb_min; kb <= kb_max; kb++) {
        load_block(kv, kv->k, layer_off, seq, kb * KB, pmax, hk, hd, blk);
        for (int64_t g = 0; g < ng; g++) {
            float *sg = scores + (g * nk + (kb - kb_min) * KB) * 16;
            const float *qg = qt + g * hd * 16;
            for (int l0 = 0; l0 < KB; l0 += 8) {
                __m512 s[8];
                AUNROLL
                for (int k = 0; k < 8; k++) s[k] = _mm512_setzero_ps();
                for (int64_t e = 0; e < hd; e++) {
                    __m512 qv = _mm512_load_ps(qg + e * 16);
                    AUNROLL
                    for (int k = 0; k < 8; k++) s[k] = _mm512_fmadd_ps(qv, _mm512_set1_ps(blk[(l0 + k) * hd + e]), s[k]);
                }
                AUNROLL
                for (int k = 0; k < 8; k++)
                    _mm512_store_ps(sg + (l0 + k) * 16,
                                    _mm512_mask_blend_ps(LANES(g, kb * KB + l0 + k), ninf, _mm512_mul_ps(s[k], scale)));
            }
        }
    }

    /* softmax per lane over its keys in position order */
    for (int64_t g = 0; g < ng; g++) {
        float *sg = scores + g * nk * 16;
        __m512 mx = ninf;
        for (int64_t k = 0; k < nk; k++) mx = _mm512_max_ps(mx, _mm512_load_ps(sg + k * 16));
        __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
        for (int64_t k = 0; k < nk; k++) {
            __m512 e = lm_exp512(_mm512_sub_ps(_mm512_load_ps(sg + k * 16), mx)); /* masked: exp(-inf) = 0 */
            _mm512_store_ps(sg + k * 16, e);
            __mmask16 m = LANES(g, kb_min * KB + k);
            sum_lo = _mm512_mask_add_pd(sum_lo, (__mmask8)m, sum_lo, lo8(e));
            sum_hi = _mm512_mask_add_pd(sum_hi, (__mmask8)(m >> 8), sum_hi, hi8(e));
        }
        __m512d inv_lo = _mm512_div_pd(_mm512_set1_pd(1.0), sum_lo), inv_hi = _mm512_div_pd(_mm512_set1_pd(1.0), sum_hi);
        for (int64_t k = 0; k < nk; k++) {
            __m512 e = _mm512_load_ps(sg + k * 16);
            __m512 w = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_mul_pd(lo8(e), inv_lo))),
                                          _mm512_cvtpd_ps(_mm512_mul_pd(hi8(e), inv_hi)), 1);
            if (f16) w = _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT));
            _mm512_store_ps(sg + k * 16, w);
        }
        memset(tot + g * hd * 16, 0, (size_t)(hd * 16) * sizeof(double));
    }

    /* values: per block and 8 elements at a time, each lane's chain over its keys */
    for (int64_t kb = kb_min; kb <= kb_max; kb++) {
        load_block(kv, kv->v, layer_off, seq, kb * KB, pmax, hk, hd, blk);
        for (int64_t g = 0; g < ng; g++) {
            __mmask16 m[KB], any = 0;
            for (int l = 0; l < KB; l++) any |= m[l] = LANES(g, kb * KB + l);
            if (!any) continue;
            const float *wg = scores + (g * nk + (kb - kb_min) * KB) * 16;
            double *tg = tot + g * hd * 16;
            for (int64_t e0 = 0; e0 < hd; e0 += 8) {
                __m512 a[8];
                AUNROLL
                for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
                for (int l = 0; l < KB; l++) {
                    if (!m[l]) continue;
                    __m512 w = _mm512_load_ps(wg + l * 16);
                    AUNROLL
                    for (int k = 0; k < 8; k++)
                        a[k] = _mm512_mask3_fmadd_ps(w, _mm512_set1_ps(blk[l * hd + e0 + k]), a[k], m[l]);
                }
                AUNROLL
                for (int k = 0; k < 8; k++) {
                    double *t = tg + (e0 + k) * 16;
                    _mm512_store_pd(t, _mm512_add_pd(_mm512_load_pd(t), lo8(a[k])));
                    _mm512_store_pd(t + 8, _mm512_add_pd(_mm512_load_pd(t + 8), hi8(a[k])));
                }
            }
        }
    }
#undef LANES
    for (int64_t i = 0; i < nq; i++) {
        int64_t t = it->t0 + i / G, h = hk * G + i % G;
        float *o = j->out + (t * j->n_head + h) * hd;
        const double *ti = tot + (i / 16) * hd * 16 + i % 16;
        for (int64_t e = 0; e < hd; e++) o[e] = (float)ti[e * 16];
    }
}

/* items from a shared counter: a thread that loses its core leaves its share to the others */
static void worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    uint8_t *mem = j->scratch + (size_t)ith * j->per_thread;
    for (int64_t i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items;)
        run_item(j, &j->items[i], mem);
}

/* Tokens per item: about 48 queries (three vectors) reuse each converted block, few
 * enough that the item's scores stay in cache. */
static int64_t tokens_per_item(int64_t group) {
    int64_t qt = 48 / group;
    return qt < 1 ? 1 : qt;
}

bool lm_cpu_attention_avx512_supported(int64_t n_head, int64_t n_head_kv, int64_t head_dim, const lm_kv_cache *kv) {
    int64_t g = n_head / n_head_kv;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && head_dim % 16 == 0 &&
           kv->block_size == KB && (g * tokens_per_item(g) + 15) / 16 * 16 <= 64;
}

lm_status lm_cpu_attention_avx512(lm_backend *b, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                                  const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                                  float scale, float *out) {
    int64_t G = n_head / n_head_kv, qt = tokens_per_item(G), n = batch->n_tokens;
    /* items: runs of consecutive tokens of one sequence, cut every qt tokens, times heads */
    int64_t n_items = 0, max_blocks = 1;
    for (int64_t t = 0; t < n;) {
        int64_t e = t + 1;
        while (e < n && e - t < qt && batch->seq[e] == batch->seq[t]) e++;
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t u = t; u < e; u++) {
            int64_t p = batch->pos[u], l = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            lo = l < lo ? l : lo;
            hi = p > hi ? p : hi;
        }
        if (hi / KB - lo / KB + 1 > max_blocks) max_blocks = hi / KB - lo / KB + 1;
        n_items += n_head_kv;
        t = e;
    }
    int nth = lm_threadpool_size(lm_cpu_pool(b));
    size_t per = scratch_bytes(head_dim, (qt * G + 15) / 16, max_blocks);
    size_t items_bytes = ((size_t)n_items * sizeof(item) + 63) & ~(size_t)63;
    uint8_t *mem = lm_cpu_scratch(b, LM_SCRATCH_ATTN, items_bytes + per * (size_t)nth);
    if (!mem) return LM_ERR_NO_MEMORY;
    item *items = (item *)mem;
    int64_t k = 0;
    for (int64_t t = 0; t < n;) {
        int64_t e = t + 1;
        while (e < n && e - t < qt && batch->seq[e] == batch->seq[t]) e++;
        for (int64_t hk = 0; hk < n_head_kv; hk++) items[k++] = (item){t, e, hk};
        t = e;
    }
    job j = {kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out, items, n_items,
             mem + items_bytes, per, (qt * G + 15) / 16, max_blocks, 0};
    if (nth == 1 || n_items == 1)
        worker(&j, 0, 1);
    else
        lm_threadpool_run(lm_cpu_pool(b), worker, &j);
    return LM_OK;
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
bool lm_cpu_attention_avx512_supported(int64_t n_head, int64_t n_head_kv, int64_t head_dim, const lm_kv_cache *kv) {
    (void)n_head, (void)n_head_kv, (void)head_dim, (void)kv;
    return false;
}
lm_status lm_cpu_attention_avx512(lm_backend *b, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                                  const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                                  float scale, float *out) {
    (void)b, (void)kv, (void)layer, (void)batch, (void)q, (void)n_head, (void)n_head_kv, (void)head_dim, (void)window,
        (void)scale, (void)out;
    return LM_ERR_UNSUPPORTED;
}
#endif
