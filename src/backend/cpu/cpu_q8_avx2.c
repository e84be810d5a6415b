/* AVX2 integer dot products of quantized weight rows with q8 activations.
 *
 * Every kernel follows one pattern per 32 weights: unpack the codes to 32 unsigned
 * bytes u (0..63), multiply-add them with the 32 signed activation bytes
 * (maddubs -> 16 x i16 -> madd -> 8 x i32; no overflow: |u * a| * 2 <= 63*127*2 for the
 * 4/5/6-bit formats, 128*127*2 for Q8_0), scale by the block scales in f32, and fold
 * each format's zero point or min into one scalar term using the activation sums.
 * Block layouts are described in src/tensor/quant_legacy.c and quant_kquants.c. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_q8.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 lanes, lane i = sum of u[4i..4i+3] * a[4i..4i+3] */
static inline __m256i dot_u8_i8(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high */
static inline __m256i unpack_nibbles16(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* byte i = 0x10 where bit i of `bits` is set, else 0 */
static inline __m256i bits_to_0x10(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)); /* all but bit i of byte i */
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static inline int act_sum(const lm_q8a_block *a) { return a->sum16[0] + a->sum16[1]; }

static inline __m256i load_act(const lm_q8a_block *a) { return _mm256_loadu_si256((const __m256i *)a->q); }

static float dot_q4_0(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 32; b++, w += 18) {
        float d = rd_f16(w) * a[b].d;
        __m256i s = dot_u8_i8(unpack_nibbles16(w + 2), load_act(&a[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
        off += d * 8.0f * (float)act_sum(&a[b]);
    }
    return hsum8(acc) - off;
}

static float dot_q4_1(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 32; b++, w += 20) {
        float d = rd_f16(w) * a[b].d, m = rd_f16(w + 2);
        __m256i s = dot_u8_i8(unpack_nibbles16(w + 4), load_act(&a[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
        off += m * a[b].s;
    }
    return hsum8(acc) + off;
}

static float dot_q5_0(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 32; b++, w += 22) {
        float d = rd_f16(w) * a[b].d;
        uint32_t qh;
        memcpy(&qh, w + 2, 4);
        __m256i u = _mm256_or_si256(unpack_nibbles16(w + 6), bits_to_0x10(qh));
        __m256i s = dot_u8_i8(u, load_act(&a[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
        off += d * 16.0f * (float)act_sum(&a[b]);
    }
    return hsum8(acc) - off;
}

static float dot_q5_1(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 32; b++, w += 24) {
        float d = rd_f16(w) * a[b].d, m = rd_f16(w + 2);
        uint32_t qh;
        memcpy(&qh, w + 4, 4);
        __m256i u = _mm256_or_si256(unpack_nibbles16(w + 8), bits_to_0x10(qh));
        __m256i s = dot_u8_i8(u, load_act(&a[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
        off += m * a[b].s;
    }
    return hsum8(acc) + off;
}

static float dot_q8_0(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, w += 34) {
        float d = rd_f16(w) * a[b].d;
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + 2));
        /* |w| as unsigned times a with w's sign: the signed product via maddubs */
        __m256i s = dot_u8_i8(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(load_act(&a[b]), wv));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
    }
    return hsum8(acc);
}

/* Q4_K / Q5_K: 6-bit sub-block scale and min, 12 bytes for 8 of each */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static inline float dot_k4k5(const uint8_t *w, const uint8_t *qh, const uint8_t *qs, const lm_q8a_block *a,
                             __m256 *acc) {
    float d = rd_f16(w), dmin = rd_f16(w + 2), off = 0.0f;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i qhv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        for (int half = 0; half < 2; half++) {
            int sub = 2 * j + half, sc, m;
            scale_min_k4(w + 4, sub, &sc, &m);
            __m256i u = half ? _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4) : _mm256_and_si256(bytes, low4);
            if (qh) {
                __m256i bit = _mm256_set1_epi8((char)(1 << sub));
                __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qhv, bit), bit);
                u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
            const lm_q8a_block *ab = &a[sub];
            __m256i s = dot_u8_i8(u, load_act(ab));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * (float)sc * ab->d), *acc);
            off += dmin * (float)m * ab->d * (float)act_sum(ab);
        }
    }
    return off;
}

static float dot_q4_k(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 256; b++, w += 144) off += dot_k4k5(w, NULL, w + 16, a + 8 * b, &acc);
    return hsum8(acc) - off;
}

static float dot_q5_k(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t b = 0; b < n / 256; b++, w += 176) off += dot_k4k5(w, w + 16, w + 48, a + 8 * b, &acc);
    return hsum8(acc) - off;
}

static float dot_q6_k(const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    for (int64_t b = 0; b < n / 256; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *scales = (const int8_t *)(w + 192);
        float d = rd_f16(w + 208);
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            for (int c = 0; c < 4; c++) {
                __m256i src = (c & 1) ? l1 : l0;
                __m256i lo = _mm256_and_si256(c < 2 ? src : _mm256_srli_epi16(src, 4), low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), low2);
                __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                const lm_q8a_block *ab = &a[8 * b + 4 * h + c];
                int sc0 = scales[8 * h + 2 * c], sc1 = scales[8 * h + 2 * c + 1];
                __m256i s = dot_u8_i8(u, load_act(ab));
                s = _mm256_mullo_epi32(s, _mm256_setr_epi32(sc0, sc0, sc0, sc0, sc1, sc1, sc1, sc1));
                float dd = d * ab->d;
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dd), acc);
                off += dd * 32.0f * (float)(sc0 * ab->sum16[0] + sc1 * ab->sum16[1]);
            }
        }
    }
    return hsum8(acc) - off;
}

lm_q8a_dot_fn lm_q8a_dot_avx2_for(lm_dtype type);
lm_q8a_dot_fn lm_q8a_dot_avx2_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q4_0: return dot_q4_0;
    case LM_DTYPE_Q4_1: return dot_q4_1;
    case LM_DTYPE_Q5_0: return dot_q5_0;
    case LM_DTYPE_Q5_1: return dot_q5_1;
    case LM_DTYPE_Q8_0: return dot_q8_0;
    case LM_DTYPE_Q4_K: return dot_q4_k;
    case LM_DTYPE_Q5_K: return dot_q5_k;
    case LM_DTYPE_Q6_K: return dot_q6_k;
    default: return NULL;
    }
}
#else
#include "backend/cpu/cpu_q8.h"
lm_q8a_dot_fn lm_q8a_dot_avx2_for(lm_dtype type);
lm_q8a_dot_fn lm_q8a_dot_avx2_for(lm_dtype type) {
    (void)type;
    return NULL;
}
#endif
