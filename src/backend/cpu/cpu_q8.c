/* Activation quantization, the scalar q8 kernels, and runtime kernel selection. */
#include "backend/cpu/cpu_q8.h"
#include "backend/cpu/cpu_features.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tensor/quant.h"

static void finish_block(lm_q8a_block *o, float d_for_s) {
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) s0 += o->q[i], s1 += o->q[i + 16];
    o->sum16[0] = (int16_t)s0;
    o->sum16[1] = (int16_t)s1;
    o->s = lm_f16_to_f32(lm_f32_to_f16(d_for_s * (float)(s0 + s1)));
}

static void quantize_per32(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        lm_q8a_block *o = &out[b];
        for (int i = 0; i < 32; i++) o->q[i] = (int8_t)lrintf(xb[i] * id); /* |x * id| <= 127 */
        o->d = lm_f16_to_f32(lm_f32_to_f16(d));
        finish_block(o, d);
    }
}

static void quantize_per256(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const float *xs = x + sb * 256;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; i++)
            if (fabsf(xs[i]) > amax) amax = fabsf(xs[i]), max = xs[i];
        float iscale = amax != 0.0f ? -127.0f / max : 0.0f, d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int b = 0; b < 8; b++) {
            lm_q8a_block *o = &out[sb * 8 + b];
            for (int i = 0; i < 32; i++) {
                long q = lrintf(iscale * xs[b * 32 + i]);
                o->q[i] = (int8_t)(q > 127 ? 127 : q); /* -max maps to +127, max to -127 */
            }
            o->d = d;
            finish_block(o, d);
        }
    }
}

#if defined(__x86_64__)
/* The same arithmetic on AVX-512, bit for bit: max and compares are exact, the
 * conversion rounds to nearest even like lrintf, F16C rounds like lm_f32_to_f16. */
#define Q8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

Q8_TARGET static inline void store_codes(lm_q8a_block *o, __m512i q0, __m512i q1, float d_for_s) {
    _mm_storeu_si128((__m128i *)o->q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(o->q + 16), _mm512_cvtepi32_epi8(q1));
    int s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
    o->sum16[0] = (int16_t)s0;
    o->sum16[1] = (int16_t)s1;
    o->s = _cvtsh_ss(_cvtss_sh(d_for_s * (float)(s0 + s1), _MM_FROUND_TO_NEAREST_INT));
}

Q8_TARGET static void quantize_per32_avx512(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m512 idv = _mm512_set1_ps(id);
        lm_q8a_block *o = &out[b];
        o->d = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        store_codes(o, _mm512_cvtps_epi32(_mm512_mul_ps(x0, idv)), _mm512_cvtps_epi32(_mm512_mul_ps(x1, idv)), d);
    }
}

Q8_TARGET static void quantize_per256_avx512(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const float *xs = x + sb * 256;
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 256; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xs + i)));
        float amax = _mm512_reduce_max_ps(m), max = 0.0f;
        /* the signed value at the first position of largest magnitude */
        for (int i = 0; i < 256 && amax != 0.0f; i += 16) {
            __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xs + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (hit) {
                max = xs[i + __builtin_ctz(hit)];
                break;
            }
        }
        float iscale = amax != 0.0f ? -127.0f / max : 0.0f, d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        __m512 is = _mm512_set1_ps(iscale);
        __m512i k127 = _mm512_set1_epi32(127);
        for (int b = 0; b < 8; b++) {
            lm_q8a_block *o = &out[sb * 8 + b];
            __m512i q0 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xs + b * 32))), k127);
            __m512i q1 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(xs + b * 32 + 16))), k127);
            o->d = d;
            store_codes(o, q0, q1, d);
        }
    }
}

static bool has_avx512(void) {
    /* the pool's threads may race here: they all store the same value, atomically */
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && lm_cpu_has_avx2();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
#endif

void lm_q8a_quantize_row_ref(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style) {
    if (style == LM_Q8A_PER256)
        quantize_per256(x, out, n);
    else
        quantize_per32(x, out, n);
}

void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style) {
#if defined(__x86_64__)
    if (has_avx512()) {
        if (style == LM_Q8A_PER256)
            quantize_per256_avx512(x, out, n);
        else
            quantize_per32_avx512(x, out, n);
        return;
    }
#endif
    if (style == LM_Q8A_PER256)
        quantize_per256(x, out, n);
    else
        quantize_per32(x, out, n);
}

lm_q8a_style lm_q8a_style_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q2_K:
    case LM_DTYPE_Q3_K:
    case LM_DTYPE_Q4_K:
    case LM_DTYPE_Q5_K:
    case LM_DTYPE_Q6_K: return LM_Q8A_PER256;
    default: return LM_Q8A_PER32;
    }
}

/* Reference: dequantize the weights to f32 (lm_dequantize_row, 256 at a time) and
 * take the dot with d * q in double. Slow and obviously right. Formats with a min
 * (Q4_1, Q5_1) take the min's share from the rounded s, as their kernels do. */
static float dot_scalar(lm_dtype type, const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    const lm_dtype_info *info = lm_dtype_get_info(type);
    int64_t bs = info->block_size;
    bool has_min = type == LM_DTYPE_Q4_1 || type == LM_DTYPE_Q5_1;
    float wf[256];
    double sum = 0.0;
    for (int64_t blk = 0; blk < n / bs; blk++) {
        const uint8_t *wb = w + blk * (int64_t)info->block_bytes;
        lm_dequantize_row(type, wb, wf, bs);
        for (int64_t i = 0; i < bs; i++) {
            const lm_q8a_block *ab = &a[(blk * bs + i) / 32];
            sum += (double)wf[i] * ab->d * ab->q[(blk * bs + i) % 32];
        }
        if (has_min) {
            const lm_q8a_block *ab = &a[blk];
            float m = lm_f16_to_f32((uint16_t)(wb[2] | (wb[3] << 8)));
            sum += (double)m * ((double)ab->s - (double)ab->d * (ab->sum16[0] + ab->sum16[1]));
        }
    }
    return (float)sum;
}

#define SCALAR_KERNEL(name, TYPE) \
    static float name(const uint8_t *w, const lm_q8a_block *a, int64_t n) { return dot_scalar(TYPE, w, a, n); }
SCALAR_KERNEL(dot_q4_0_scalar, LM_DTYPE_Q4_0)
SCALAR_KERNEL(dot_q4_1_scalar, LM_DTYPE_Q4_1)
SCALAR_KERNEL(dot_q5_0_scalar, LM_DTYPE_Q5_0)
SCALAR_KERNEL(dot_q5_1_scalar, LM_DTYPE_Q5_1)
SCALAR_KERNEL(dot_q8_0_scalar, LM_DTYPE_Q8_0)
SCALAR_KERNEL(dot_q4_k_scalar, LM_DTYPE_Q4_K)
SCALAR_KERNEL(dot_q5_k_scalar, LM_DTYPE_Q5_K)
SCALAR_KERNEL(dot_q6_k_scalar, LM_DTYPE_Q6_K)
#undef SCALAR_KERNEL

lm_q8a_dot_fn lm_q8a_dot_scalar_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q4_0: return dot_q4_0_scalar;
    case LM_DTYPE_Q4_1: return dot_q4_1_scalar;
    case LM_DTYPE_Q5_0: return dot_q5_0_scalar;
    case LM_DTYPE_Q5_1: return dot_q5_1_scalar;
    case LM_DTYPE_Q8_0: return dot_q8_0_scalar;
    case LM_DTYPE_Q4_K: return dot_q4_k_scalar;
    case LM_DTYPE_Q5_K: return dot_q5_k_scalar;
    case LM_DTYPE_Q6_K: return dot_q6_k_scalar;
    default: return NULL;
    }
}

/* ---- the exact arithmetic of every kernel (cpu_q8.h), in plain C ---- */

static float rd_f16(const uint8_t *p) { return lm_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static int act_sum(const lm_q8a_block *a) { return a->sum16[0] + a->sum16[1]; }

/* 32-element formats: c[32] the unsigned codes (Q8_0: signed), off the zero point */
static float exact_legacy(lm_dtype type, const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    float acc = 0.0f;
    size_t bytes = lm_dtype_get_info(type)->block_bytes;
    for (int64_t b = 0; b < n / 32; b++, w += bytes) {
        const lm_q8a_block *ab = &a[b];
        int c[32], off = 0;
        float dw = rd_f16(w), mw = 0.0f;
        bool has_min = false;
        switch (type) {
        case LM_DTYPE_Q4_0:
        case LM_DTYPE_Q4_1:
            has_min = type == LM_DTYPE_Q4_1;
            off = has_min ? 0 : 8;
            for (int i = 0; i < 16; i++) {
                const uint8_t qs = w[(has_min ? 4 : 2) + i];
                c[i] = qs & 15, c[i + 16] = qs >> 4;
            }
            break;
        case LM_DTYPE_Q5_0:
        case LM_DTYPE_Q5_1: {
            has_min = type == LM_DTYPE_Q5_1;
            off = has_min ? 0 : 16;
            const uint8_t *p = w + (has_min ? 4 : 2);
            uint32_t qh = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            for (int i = 0; i < 16; i++) {
                c[i] = (p[4 + i] & 15) | (int)((qh >> i) & 1) << 4;
                c[i + 16] = (p[4 + i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            }
            break;
        }
        default: /* Q8_0 */
            for (int i = 0; i < 32; i++) c[i] = (int8_t)w[2 + i];
            break;
        }
        if (has_min) mw = rd_f16(w + 2);
        int32_t I = 0;
        for (int i = 0; i < 32; i++) I += c[i] * ab->q[i];
        I -= off * act_sum(ab);
        acc = fmaf((float)I, dw * ab->d, acc);
        if (has_min) acc = fmaf(mw, ab->s, acc);
    }
    return acc;
}

static void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static float exact_kquant(lm_dtype type, const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    float acc = 0.0f;
    size_t bytes = lm_dtype_get_info(type)->block_bytes;
    for (int64_t sb = 0; sb < n / 256; sb++, w += bytes) {
        const lm_q8a_block *as = &a[8 * sb];
        int32_t S = 0, M = 0;
        if (type == LM_DTYPE_Q6_K) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            for (int i = 0; i < 16; i++) {
                int32_t s = 0;
                for (int e = 16 * i; e < 16 * i + 16; e++) {
                    int half = e / 128, r = e % 128;
                    int lo = (ql[half * 64 + r % 64] >> (r < 64 ? 0 : 4)) & 15;
                    int hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
                    s += ((lo | hi << 4) - 32) * as[e / 32].q[e % 32];
                }
                S += sc[i] * s;
            }
            acc = fmaf((float)S, rd_f16(w + 208) * as->d, acc);
            continue;
        }
        const uint8_t *qh = type == LM_DTYPE_Q5_K ? w + 16 : NULL, *qs = w + (qh ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(w + 4, j, &sc, &m);
            int32_t s = 0;
            for (int l = 0; l < 32; l++) {
                int c = (qs[(j / 2) * 32 + l] >> (j % 2 ? 4 : 0)) & 15;
                if (qh) c |= ((qh[l] >> j) & 1) << 4;
                s += c * as[j].q[l];
            }
            S += sc * s;
            M += m * act_sum(&as[j]);
        }
        acc = fmaf((float)S, rd_f16(w) * as->d, acc);
        acc = fmaf(-(float)M, rd_f16(w + 2) * as->d, acc);
    }
    return acc;
}

#define EXACT_KERNEL(name, TYPE, IMPL) \
    static float name(const uint8_t *w, const lm_q8a_block *a, int64_t n) { return IMPL(TYPE, w, a, n); }
EXACT_KERNEL(exact_q4_0, LM_DTYPE_Q4_0, exact_legacy)
EXACT_KERNEL(exact_q4_1, LM_DTYPE_Q4_1, exact_legacy)
EXACT_KERNEL(exact_q5_0, LM_DTYPE_Q5_0, exact_legacy)
EXACT_KERNEL(exact_q5_1, LM_DTYPE_Q5_1, exact_legacy)
EXACT_KERNEL(exact_q8_0, LM_DTYPE_Q8_0, exact_legacy)
EXACT_KERNEL(exact_q4_k, LM_DTYPE_Q4_K, exact_kquant)
EXACT_KERNEL(exact_q5_k, LM_DTYPE_Q5_K, exact_kquant)
EXACT_KERNEL(exact_q6_k, LM_DTYPE_Q6_K, exact_kquant)
#undef EXACT_KERNEL

lm_q8a_dot_fn lm_q8a_dot_exact_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q4_0: return exact_q4_0;
    case LM_DTYPE_Q4_1: return exact_q4_1;
    case LM_DTYPE_Q5_0: return exact_q5_0;
    case LM_DTYPE_Q5_1: return exact_q5_1;
    case LM_DTYPE_Q8_0: return exact_q8_0;
    case LM_DTYPE_Q4_K: return exact_q4_k;
    case LM_DTYPE_Q5_K: return exact_q5_k;
    case LM_DTYPE_Q6_K: return exact_q6_k;
    default: return NULL;
    }
}

static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && atoi(v) != 0;
}

lm_q8a_kernels lm_q8a_kernels_for(lm_dtype type) {
    lm_q8a_kernels none = {0};
    if (env_on("LUMEN_REFERENCE_KERNELS")) return none;
    lm_q8a_kernels k = none;
#if defined(__x86_64__)
    if (lm_cpu_has_avx512_vnni() && !env_on("LUMEN_CPU_NO_VNNI"))
        k = lm_q8a_kernels_for_vnni(type);
    else if (lm_cpu_has_avx2())
        k = lm_q8a_kernels_for_avx2(type);
#endif
    /* no SIMD kernel: the caller's f32 path (dequantize + dot) is faster than the
     * scalar arithmetic above */
    if (env_on("LUMEN_CPU_NO_TILE")) k.pack = NULL, k.tile = NULL, k.panel_bytes = NULL;
    return k;
}
