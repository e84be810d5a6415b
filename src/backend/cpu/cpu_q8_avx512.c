/* Tiled integer matrix-matrix kernels (the prefill path) on AVX-512 VNNI.
 *
 * `pack` decodes a panel of 32 weight rows (two groups of 16) once per call into
 * unsigned byte codes interleaved so that one 512-bit vector holds 4 consecutive codes
 * of each of 16 rows (lane r = row r), plus the per-unit scales as 16-lane vectors.
 * `tile` then walks the tokens a few at a time: the activation's 4 matching bytes of
 * one token are broadcast to all lanes and vpdpbusd adds 16 rows x 4 products per
 * instruction, each weight vector serving every token of the tile and each broadcast
 * both row groups. The per-unit integers of cpu_q8.h come out exactly in each lane:
 *  - legacy blocks: the 8 dot steps of a block into a zeroed accumulator, the zero
 *    point as one vpdpwssd of (-off, -off) with the activation's two half sums;
 *  - Q4_K/Q5_K: each 32-element sub-block into a zeroed accumulator, multiplied by its
 *    scale (vpmulld) into S; M as vpdpwssd of (m_j, m_j) with the half sums;
 *  - Q6_K: 16-element sub-blocks likewise, the offset 32 as vpdpwssd of
 *    (-32 sc_2j, -32 sc_2j+1) with the half sums of block j.
 * Then the float steps, lane by lane in the order of cpu_q8.h: results equal the gemv
 * kernels and the scalar code bit for bit, whatever the tile. */
#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif
#include <immintrin.h>
#include <string.h>

#define TUNROLL _Pragma("GCC unroll 16")

enum { GROUP = 16, RG = LM_Q8A_PANEL_ROWS / GROUP };

/* Panel layout, per unit (one 32-element block, or one 256-element super-block):
 *   codes [unit / 4][RG][16 rows][4 bytes]
 *   legacy:   dw [RG][16] f32, mw [RG][16] f32
 *   K-quants: sc [16][RG][16] bytes (8 used by Q4_K/Q5_K; signed for Q6_K), Q4_K/Q5_K mins
 *             m [8][RG][16] bytes, d [RG][16] f32, dmin [RG][16] f32
 *   (the tile kernel widens the byte scales once per tile of tokens) */
enum {
    L_DW = 32 * LM_Q8A_PANEL_ROWS,
    L_MW = L_DW + RG * 64,
    L_UNIT = L_MW + RG * 64,
    K_SC = 256 * LM_Q8A_PANEL_ROWS,
    K_M = K_SC + 16 * RG * 16,
    K_D = K_M + 8 * RG * 16,
    K_DMIN = K_D + RG * 64,
    K_UNIT = K_DMIN + RG * 64,
};

/* the panel, then scratch for the rows' codes in natural order ([32][n] bytes) */
static size_t panel_bytes_legacy(int64_t n) { return (size_t)(n / 32) * L_UNIT + (size_t)(LM_Q8A_PANEL_ROWS * n); }
static size_t panel_bytes_k(int64_t n) { return (size_t)(n / 256) * K_UNIT + (size_t)(LM_Q8A_PANEL_ROWS * n); }

static inline float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high */
static inline __m256i unpack_nibbles16(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* byte i = 0x10 where bit i of `bits` is set */
static inline __m256i bits_to_0x10(uint32_t bits) {
    return _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(0x10));
}

/* o[j] = dword j of every r[i] (lane i): a 16 x 16 transpose of 32-bit elements
 * (pairs by unpacks, then 128-bit lanes by shuffles) */
static inline void transpose16(const __m512i r[16], __m512i o[16]) {
    __m512i t[16], u[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    /* u[4m + c], 128-bit lane L: rows 4m..4m+3 of dword 4L + c */
    for (int m = 0; m < 4; m++) {
        u[4 * m + 0] = _mm512_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 1] = _mm512_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 2] = _mm512_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
        u[4 * m + 3] = _mm512_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
        __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        o[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        o[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
        o[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        o[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
}

/* Interleaves `bytes` bytes of natural-order codes of 32 rows (tmp: row r at r * stride,
 * bytes a multiple of 32) into the panel's [g][RG][16][4] order: group g (4 codes) at
 * dst(g) = out + (g / per_unit) * unit_bytes + (g % per_unit) * RG * 64. */
static inline __attribute__((always_inline)) void interleave(const uint8_t *tmp, int64_t stride, int64_t bytes,
                                                             int per_unit, size_t unit_bytes, uint8_t *out) {
    for (int rg = 0; rg < RG; rg++) {
        const uint8_t *src = tmp + (size_t)(rg * GROUP) * (size_t)stride;
        for (int64_t off = 0; off < bytes; off += 64) {
            const int half = bytes - off < 64; /* 32 bytes left: 8 groups */
            __m512i r[16], o[16];
            for (int i = 0; i < 16; i++)
                r[i] = half ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(src + i * stride + off)))
                            : _mm512_loadu_si512(src + i * stride + off);
            transpose16(r, o);
            for (int j = 0; j < (half ? 8 : 16); j++) {
                int64_t g = off / 4 + j;
                _mm512_store_si512((__m512i *)(out + (size_t)(g / per_unit) * unit_bytes + (size_t)((g % per_unit) * RG + rg) * 64),
                                   o[j]);
            }
        }
    }
}

/* Q4_K/Q5_K: the 8 six-bit sub-block scales and mins from their 12 bytes, 8 bytes each */
static inline void scales_k4_bytes(const uint8_t *s, uint64_t *sc, uint64_t *m) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *m = m_lo | (uint64_t)m_hi << 32;
}

/* ---- packing ---- */

/* software prefetch distance while packing: the panel is read once, cold, in one
 * sequential stream that the hardware prefetcher picks up too late after the long
 * tile phase of the previous panel */
enum { PACK_AHEAD = 2048 };

enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0 };

static inline __attribute__((always_inline)) void pack_legacy(int fmt, size_t bytes, const uint8_t *w,
                                                              size_t row_bytes, int nr, int64_t n, uint8_t *panel) {
    /* each row read front to back (the panel's rows are one sequential stream), its
     * codes into tmp in natural order, then interleaved unit by unit */
    uint8_t *tmp = panel + panel_bytes_legacy(n) - (size_t)(LM_Q8A_PANEL_ROWS * n);
    for (int r = 0; r < LM_Q8A_PANEL_ROWS; r++) {
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *p = panel + b * L_UNIT;
            float *dw = (float *)(p + L_DW), *mw = (float *)(p + L_MW);
            const uint8_t *wb = w + (size_t)(r < nr ? r : nr - 1) * row_bytes + b * bytes;
            if (b % 2 == 0) _mm_prefetch((const char *)wb + PACK_AHEAD, _MM_HINT_T0);
            __m256i u;
            uint32_t qh;
            switch (fmt) {
            case FMT_Q4_0: u = unpack_nibbles16(wb + 2); break;
            case FMT_Q4_1: u = unpack_nibbles16(wb + 4); break;
            case FMT_Q5_0:
                memcpy(&qh, wb + 2, 4);
                u = _mm256_or_si256(unpack_nibbles16(wb + 6), bits_to_0x10(qh));
                break;
            case FMT_Q5_1:
                memcpy(&qh, wb + 4, 4);
                u = _mm256_or_si256(unpack_nibbles16(wb + 8), bits_to_0x10(qh));
                break;
            default: /* Q8_0: w + 128 as unsigned, offset 128 */
                u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)), _mm256_set1_epi8((char)0x80));
                break;
            }
            _mm256_storeu_si256((__m256i *)(tmp + r * n + b * 32), u);
            dw[r] = rd_f16(wb);
            mw[r] = fmt == FMT_Q4_1 || fmt == FMT_Q5_1 ? rd_f16(wb + 2) : 0.0f;
        }
    }
    interleave(tmp, n, n, 8, L_UNIT, panel);
}

#define PACK_LEGACY(NAME, FMT, BYTES)                                                                  \
    static void NAME(const uint8_t *w, size_t row_bytes, int nr, int64_t n, uint8_t *panel) {         \
        pack_legacy(FMT, BYTES, w, row_bytes, nr, n, panel);                                           \
    }
PACK_LEGACY(pack_q4_0, FMT_Q4_0, 18)
PACK_LEGACY(pack_q4_1, FMT_Q4_1, 20)
PACK_LEGACY(pack_q5_0, FMT_Q5_0, 22)
PACK_LEGACY(pack_q5_1, FMT_Q5_1, 24)
PACK_LEGACY(pack_q8_0, FMT_Q8_0, 34)

/* Q4_K (qh_off 0) and Q5_K */
static inline __attribute__((always_inline)) void pack_k4k5(int qh_off, int qs_off, size_t bytes, const uint8_t *w,
                                                            size_t row_bytes, int nr, int64_t n, uint8_t *panel) {
    uint8_t *tmp = panel + panel_bytes_k(n) - (size_t)(LM_Q8A_PANEL_ROWS * n);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int r = 0; r < LM_Q8A_PANEL_ROWS; r++) {
        for (int64_t sb = 0; sb < n / 256; sb++) {
            uint8_t *p = panel + sb * K_UNIT, *sc = p + K_SC, *mn = p + K_M;
            float *d = (float *)(p + K_D), *dmin = (float *)(p + K_DMIN);
            const uint8_t *wb = w + (size_t)(r < nr ? r : nr - 1) * row_bytes + sb * bytes, *qs = wb + qs_off;
            for (size_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)wb + PACK_AHEAD + l, _MM_HINT_T0);
            __m256i qhv = qh_off ? _mm256_loadu_si256((const __m256i *)(wb + qh_off)) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i b32 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(b32, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b32, 4), low4);
                if (qh_off) {
                    __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                    lo = _mm256_or_si256(lo, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qhv, b0), _mm256_set1_epi8(0x10)));
                    hi = _mm256_or_si256(hi, _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(qhv, b1), _mm256_set1_epi8(0x10)));
                }
                _mm256_storeu_si256((__m256i *)(tmp + r * n + sb * 256 + 64 * c), lo);
                _mm256_storeu_si256((__m256i *)(tmp + r * n + sb * 256 + 64 * c + 32), hi);
            }
            int row = r % GROUP, rg = r / GROUP;
            uint64_t sc8, m8;
            scales_k4_bytes(wb + 4, &sc8, &m8);
            for (int j = 0; j < 8; j++) {
                sc[(j * RG + rg) * GROUP + row] = (uint8_t)(sc8 >> (8 * j));
                mn[(j * RG + rg) * GROUP + row] = (uint8_t)(m8 >> (8 * j));
            }
            d[rg * GROUP + row] = rd_f16(wb);
            dmin[rg * GROUP + row] = rd_f16(wb + 2);
        }
    }
    interleave(tmp, n, n, 64, K_UNIT, panel);
}

static void pack_q4_k(const uint8_t *w, size_t row_bytes, int nr, int64_t n, uint8_t *panel) {
    pack_k4k5(0, 16, 144, w, row_bytes, nr, n, panel);
}
static void pack_q5_k(const uint8_t *w, size_t row_bytes, int nr, int64_t n, uint8_t *panel) {
    pack_k4k5(16, 48, 176, w, row_bytes, nr, n, panel);
}

static void pack_q6_k(const uint8_t *w, size_t row_bytes, int nr, int64_t n, uint8_t *panel) {
    uint8_t *tmp = panel + panel_bytes_k(n) - (size_t)(LM_Q8A_PANEL_ROWS * n);
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    for (int r = 0; r < LM_Q8A_PANEL_ROWS; r++) {
        for (int64_t sb = 0; sb < n / 256; sb++) {
            uint8_t *p = panel + sb * K_UNIT, *sc = p + K_SC;
            float *d = (float *)(p + K_D);
            const uint8_t *wb = w + (size_t)(r < nr ? r : nr - 1) * row_bytes + sb * 210, *ql = wb, *qh = wb + 128;
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)wb + PACK_AHEAD + l, _MM_HINT_T0);
            const int8_t *scales = (const int8_t *)(wb + 192);
            for (int h = 0; h < 2; h++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
                __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
                for (int c = 0; c < 4; c++) {
                    __m256i src = (c & 1) ? l1 : l0;
                    __m256i lo = _mm256_and_si256(c < 2 ? src : _mm256_srli_epi16(src, 4), low4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), low2);
                    _mm256_storeu_si256((__m256i *)(tmp + r * n + sb * 256 + 128 * h + 32 * c),
                                        _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
                }
            }
            int row = r % GROUP, rg = r / GROUP;
            for (int i = 0; i < 16; i++) sc[(i * RG + rg) * GROUP + row] = (uint8_t)scales[i];
            d[rg * GROUP + row] = rd_f16(wb + 208);
        }
    }
    interleave(tmp, n, n, 64, K_UNIT, panel);
}

/* ---- tiles ---- */

static inline __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* out[rg][t] for rows of the panel, tokens a + t * a_stride (t < T) */
static inline void store_tile(const __m512 acc[RG][8], int T, int nr, float *y, int64_t y_stride) {
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    for (int t = 0; t < T; t++) {
        _mm512_mask_storeu_ps(y + t * y_stride, m0, acc[0][t]);
        _mm512_mask_storeu_ps(y + t * y_stride + 16, m1, acc[1][t]);
    }
}

enum { TT_LEGACY = 6, TT_K = 4 };

static inline __attribute__((always_inline)) void tile_legacy_T(const uint8_t *panel, int nr, const lm_q8a_block *a,
                                                                int64_t a_stride, int T, int64_t n, int off,
                                                                int has_min, float *y, int64_t y_stride) {
    const __m512i offp = _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)(-off) * 0x10001u));
    __m512 acc[RG][8];
    TUNROLL
    for (int t = 0; t < T; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *p = panel + b * L_UNIT;
        __m512i s[RG][8];
        TUNROLL
        for (int t = 0; t < T; t++) s[0][t] = s[1][t] = _mm512_setzero_si512();
        TUNROLL
        for (int g = 0; g < 8; g++) {
            __m512i w0 = _mm512_load_si512((const __m512i *)(p + g * 128));
            __m512i w1 = _mm512_load_si512((const __m512i *)(p + g * 128 + 64));
            TUNROLL
            for (int t = 0; t < T; t++) {
                __m512i av = bcast32(a[t * a_stride + b].q + 4 * g);
                s[0][t] = _mm512_dpbusd_epi32(s[0][t], w0, av);
                s[1][t] = _mm512_dpbusd_epi32(s[1][t], w1, av);
            }
        }
        __m512 dw0 = _mm512_load_ps(p + L_DW), dw1 = _mm512_load_ps(p + L_DW + 64);
        TUNROLL
        for (int t = 0; t < T; t++) {
            const lm_q8a_block *ab = &a[t * a_stride + b];
            if (off) {
                __m512i hs = bcast32(ab->sum16);
                s[0][t] = _mm512_dpwssd_epi32(s[0][t], offp, hs);
                s[1][t] = _mm512_dpwssd_epi32(s[1][t], offp, hs);
            }
            __m512 da = _mm512_set1_ps(ab->d);
            acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0][t]), _mm512_mul_ps(dw0, da), acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1][t]), _mm512_mul_ps(dw1, da), acc[1][t]);
            if (has_min) {
                __m512 sa = _mm512_set1_ps(ab->s);
                acc[0][t] = _mm512_fmadd_ps(_mm512_load_ps(p + L_MW), sa, acc[0][t]);
                acc[1][t] = _mm512_fmadd_ps(_mm512_load_ps(p + L_MW + 64), sa, acc[1][t]);
            }
        }
    }
    store_tile(acc, T, nr, y, y_stride);
}

static inline __attribute__((always_inline)) void tile_legacy(const uint8_t *panel, int nr, const lm_q8a_block *a,
                                                              int64_t a_stride, int64_t n_tok, int64_t n, int off,
                                                              int has_min, float *y, int64_t y_stride) {
    int64_t t0 = 0;
    for (; t0 + TT_LEGACY <= n_tok; t0 += TT_LEGACY)
        tile_legacy_T(panel, nr, a + t0 * a_stride, a_stride, TT_LEGACY, n, off, has_min, y + t0 * y_stride, y_stride);
    const lm_q8a_block *at = a + t0 * a_stride;
    float *yt = y + t0 * y_stride;
    switch (n_tok - t0) {
    case 1: tile_legacy_T(panel, nr, at, a_stride, 1, n, off, has_min, yt, y_stride); break;
    case 2: tile_legacy_T(panel, nr, at, a_stride, 2, n, off, has_min, yt, y_stride); break;
    case 3: tile_legacy_T(panel, nr, at, a_stride, 3, n, off, has_min, yt, y_stride); break;
    case 4: tile_legacy_T(panel, nr, at, a_stride, 4, n, off, has_min, yt, y_stride); break;
    case 5: tile_legacy_T(panel, nr, at, a_stride, 5, n, off, has_min, yt, y_stride); break;
    default: break;
    }
}

#define TILE_LEGACY(NAME, OFF, HAS_MIN)                                                                           \
    static void NAME(const uint8_t *panel, int nr, const lm_q8a_block *a, int64_t a_stride, int64_t n_tok,       \
                     int64_t n, float *y, int64_t y_stride) {                                                    \
        tile_legacy(panel, nr, a, a_stride, n_tok, n, OFF, HAS_MIN, y, y_stride);                                 \
    }
TILE_LEGACY(tile_q4_0, 8, 0)
TILE_LEGACY(tile_q4_1, 0, 1)
TILE_LEGACY(tile_q5_0, 16, 0)
TILE_LEGACY(tile_q5_1, 0, 1)
TILE_LEGACY(tile_q8_0, 128, 0)

/* 16 byte scales as int32 lanes (signed for Q6_K) */
static inline __m512i widen_scale(const uint8_t *p, int q6) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    return q6 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
}

/* Q4_K/Q5_K: (m, m) as two i16 per lane, for vpdpwssd with an activation block's half sums */
static inline __m512i min_pair(const uint8_t *p) {
    __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
}

/* Q6_K: (-32 sc_2j, -32 sc_2j+1) as two i16 per lane (|32 sc| <= 4096) */
static inline __m512i offset_pair(const uint8_t *s0, const uint8_t *s1) {
    __m512i a = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(widen_scale(s0, 1), 5));
    __m512i b = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(widen_scale(s1, 1), 5));
    return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(b, 16));
}

/* Q4_K/Q5_K (q6 = 0) and Q6_K (q6 = 1) */
static inline __attribute__((always_inline)) void tile_k_T(const uint8_t *panel, int nr, const lm_q8a_block *a,
                                                           int64_t a_stride, int T, int64_t n, int q6, float *y,
                                                           int64_t y_stride) {
    __m512 acc[RG][8];
    TUNROLL
    for (int t = 0; t < T; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const uint8_t *p = panel + sb * K_UNIT;
        const lm_q8a_block *as = a + 8 * sb;
        __m512i S[RG][8], s[RG][8];
        TUNROLL
        for (int t = 0; t < T; t++) S[0][t] = S[1][t] = _mm512_setzero_si512();
        const int n_sub = q6 ? 16 : 8, groups = q6 ? 4 : 8;
        for (int j = 0; j < n_sub; j++) {
            const uint8_t *cj = p + j * groups * 128;
            TUNROLL
            for (int t = 0; t < T; t++) s[0][t] = s[1][t] = _mm512_setzero_si512();
            TUNROLL
            for (int g = 0; g < groups; g++) {
                __m512i w0 = _mm512_load_si512((const __m512i *)(cj + g * 128));
                __m512i w1 = _mm512_load_si512((const __m512i *)(cj + g * 128 + 64));
                TUNROLL
                for (int t = 0; t < T; t++) {
                    /* element 4g of the sub-block: activation block j (j / 2 for Q6_K) */
                    const int8_t *q = q6 ? as[t * a_stride + j / 2].q + 16 * (j % 2) : as[t * a_stride + j].q;
                    __m512i av = bcast32(q + 4 * g);
                    s[0][t] = _mm512_dpbusd_epi32(s[0][t], w0, av);
                    s[1][t] = _mm512_dpbusd_epi32(s[1][t], w1, av);
                }
            }
            __m512i sc0 = widen_scale(p + K_SC + (j * RG) * 16, q6), sc1 = widen_scale(p + K_SC + (j * RG + 1) * 16, q6);
            TUNROLL
            for (int t = 0; t < T; t++) {
                S[0][t] = _mm512_add_epi32(S[0][t], _mm512_mullo_epi32(s[0][t], sc0));
                S[1][t] = _mm512_add_epi32(S[1][t], _mm512_mullo_epi32(s[1][t], sc1));
            }
        }
        /* Q6_K: the offset into S; Q4_K/Q5_K: the mins' sum M into s */
        TUNROLL
        for (int t = 0; t < T; t++) s[0][t] = s[1][t] = _mm512_setzero_si512();
        TUNROLL
        for (int j = 0; j < 8; j++) {
            __m512i p0 = q6 ? offset_pair(p + K_SC + (2 * j * RG) * 16, p + K_SC + ((2 * j + 1) * RG) * 16)
                            : min_pair(p + K_M + (j * RG) * 16);
            __m512i p1 = q6 ? offset_pair(p + K_SC + (2 * j * RG + 1) * 16, p + K_SC + ((2 * j + 1) * RG + 1) * 16)
                            : min_pair(p + K_M + (j * RG + 1) * 16);
            TUNROLL
            for (int t = 0; t < T; t++) {
                __m512i hs = bcast32(as[t * a_stride + j].sum16);
                if (q6) {
                    S[0][t] = _mm512_dpwssd_epi32(S[0][t], p0, hs);
                    S[1][t] = _mm512_dpwssd_epi32(S[1][t], p1, hs);
                } else {
                    s[0][t] = _mm512_dpwssd_epi32(s[0][t], p0, hs);
                    s[1][t] = _mm512_dpwssd_epi32(s[1][t], p1, hs);
                }
            }
        }
        __m512 d0 = _mm512_load_ps(p + K_D), d1 = _mm512_load_ps(p + K_D + 64);
        __m512 m0 = _mm512_load_ps(p + K_DMIN), m1 = _mm512_load_ps(p + K_DMIN + 64);
        TUNROLL
        for (int t = 0; t < T; t++) {
            __m512 da = _mm512_set1_ps(as[t * a_stride].d);
            acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[0][t]), _mm512_mul_ps(d0, da), acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[1][t]), _mm512_mul_ps(d1, da), acc[1][t]);
            if (!q6) {
                acc[0][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s[0][t]), _mm512_mul_ps(m0, da), acc[0][t]);
                acc[1][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s[1][t]), _mm512_mul_ps(m1, da), acc[1][t]);
            }
        }
    }
    store_tile(acc, T, nr, y, y_stride);
}

static inline __attribute__((always_inline)) void tile_k(const uint8_t *panel, int nr, const lm_q8a_block *a,
                                                         int64_t a_stride, int64_t n_tok, int64_t n, int q6, float *y,
                                                         int64_t y_stride) {
    int64_t t0 = 0;
    for (; t0 + TT_K <= n_tok; t0 += TT_K)
        tile_k_T(panel, nr, a + t0 * a_stride, a_stride, TT_K, n, q6, y + t0 * y_stride, y_stride);
    const lm_q8a_block *at = a + t0 * a_stride;
    float *yt = y + t0 * y_stride;
    switch (n_tok - t0) {
    case 1: tile_k_T(panel, nr, at, a_stride, 1, n, q6, yt, y_stride); break;
    case 2: tile_k_T(panel, nr, at, a_stride, 2, n, q6, yt, y_stride); break;
    case 3: tile_k_T(panel, nr, at, a_stride, 3, n, q6, yt, y_stride); break;
    case 4: tile_k_T(panel, nr, at, a_stride, 4, n, q6, yt, y_stride); break;
    case 5: tile_k_T(panel, nr, at, a_stride, 5, n, q6, yt, y_stride); break;
    default: break;
    }
}

static void tile_k4k5(const uint8_t *panel, int nr, const lm_q8a_block *a, int64_t a_stride, int64_t n_tok, int64_t n,
                      float *y, int64_t y_stride) {
    tile_k(panel, nr, a, a_stride, n_tok, n, 0, y, y_stride);
}
static void tile_q6_k(const uint8_t *panel, int nr, const lm_q8a_block *a, int64_t a_stride, int64_t n_tok, int64_t n,
                      float *y, int64_t y_stride) {
    tile_k(panel, nr, a, a_stride, n_tok, n, 1, y, y_stride);
}

/* ---- matrix-vector (decode): 16 rows per call ----
 * Each row's unit is decoded into 512-bit vectors of codes and dotted with the token
 * (vpdpbusd: 16 lanes of 4 products); the lanes of the 16 rows are then reduced across
 * rows (a transposing tree of unpacks and 128-bit shuffles) into one vector whose lane
 * r holds row r's exact integer, and the float steps of cpu_q8.h run lane-wise. Lanes
 * of 4 products stay below 2^15 (4 * 63 * 127), so K-quant sub-block scales apply
 * with the 16-bit multiply-add. */
enum { GV_ROWS = 16, GV_TOK = 3, GV_CHUNK = 8 };

static inline __m512i add4(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }

/* after this, u[q] holds in 128-bit lane i the sums over lanes 4i..4i+3 of rows 4q..4q+3 */
static inline void reduce_rows_l2(const __m512i v[16], __m512i u[4]) {
    __m512i t[8];
    TUNROLL
    for (int i = 0; i < 8; i++)
        t[i] = add4(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    TUNROLL
    for (int i = 0; i < 4; i++)
        u[i] = add4(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
}

/* lane r = the sum of the 16 lanes of v[r] */
static inline __m512i reduce_rows(const __m512i v[16]) {
    __m512i u[4];
    reduce_rows_l2(v, u);
    __m512i x = add4(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xdd));
    __m512i y = add4(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xdd));
    return add4(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xdd));
}

/* the same over lanes 0..7 (*h0) and 8..15 (*h1) of each v[r] separately */
static inline void reduce_rows_halves(const __m512i v[16], __m512i *h0, __m512i *h1) {
    __m512i u[4];
    reduce_rows_l2(v, u);
    __m512i x = add4(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xdd));
    __m512i y = add4(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xdd));
    *h0 = _mm512_shuffle_i32x4(x, y, 0x88);
    *h1 = _mm512_shuffle_i32x4(x, y, 0xdd);
}

static inline __m512i dp(__m512i u, __m512i a) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a); }

/* two activation blocks' codes in one vector (the second zero when absent) */
static inline __m512i act2(const lm_q8a_block *a0, const lm_q8a_block *a1) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)a0->q);
    __m256i hi = a1 ? _mm256_loadu_si256((const __m256i *)a1->q) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline int act_sum(const lm_q8a_block *a) { return a->sum16[0] + a->sum16[1]; }

static inline void store_rows(float *y, int nr, __m512 v) {
    _mm512_mask_storeu_ps(y, nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1), v);
}

/* codes of blocks b and b+1 (natural order, 32 each; the second zero when !two) */
static inline __attribute__((always_inline)) __m512i legacy_codes2(int fmt, size_t bytes, const uint8_t *wb, int two) {
    if (fmt == FMT_Q8_0) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(wb + 2));
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(wb + bytes + 2)) : _mm256_set1_epi8((char)0x80);
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    }
    const int qoff = fmt == FMT_Q4_0 ? 2 : fmt == FMT_Q4_1 ? 4 : fmt == FMT_Q5_0 ? 6 : 8;
    __m128i q0 = _mm_loadu_si128((const __m128i *)(wb + qoff));
    __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(wb + bytes + qoff)) : _mm_setzero_si128();
    __m512i z = _mm512_castsi256_si512(_mm256_set_m128i(q1, q0));
    z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), z);
    z = _mm512_and_si512(_mm512_srlv_epi16(z, _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                                                0x0004000400040004LL, 0x0004000400040004LL)),
                         _mm512_set1_epi8(0x0f));
    if (fmt == FMT_Q5_0 || fmt == FMT_Q5_1) {
        const int hoff = fmt == FMT_Q5_0 ? 2 : 4;
        uint32_t h0, h1 = 0;
        memcpy(&h0, wb + hoff, 4);
        if (two) memcpy(&h1, wb + bytes + hoff, 4);
        z = _mm512_mask_add_epi8(z, (__mmask64)h0 | (__mmask64)h1 << 32, z, _mm512_set1_epi8(0x10));
    }
    return z;
}

static inline __attribute__((always_inline)) void gemv_legacy_T(int fmt, size_t bytes, int off, int has_min,
                                                                const uint8_t *w, size_t row_bytes, int nr,
                                                                const lm_q8a_block *a, int64_t a_stride, int T,
                                                                int64_t n, float *y, int64_t y_stride) {
    const uint8_t *rows[GV_ROWS];
    int32_t offs_a[GV_ROWS];
    for (int r = 0; r < GV_ROWS; r++) {
        int rr = r < nr ? r : nr - 1;
        rows[r] = w + (size_t)rr * row_bytes;
        offs_a[r] = (int32_t)((size_t)rr * row_bytes);
    }
    const __m512i offs = _mm512_loadu_si512(offs_a);
    __m512 acc[GV_TOK];
    TUNROLL
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i av[GV_TOK], d[GV_TOK][GV_ROWS];
        TUNROLL
        for (int t = 0; t < T; t++) av[t] = act2(&a[t * a_stride + b], two ? &a[t * a_stride + b + 1] : NULL);
        TUNROLL
        for (int r = 0; r < GV_ROWS; r++) {
            const char *pf = (const char *)(rows[r] + b * bytes + GV_ROWS * row_bytes); /* next group of rows */
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 2 * bytes - 1, _MM_HINT_T0);
            __m512i c = legacy_codes2(fmt, bytes, rows[r] + b * bytes, two);
            TUNROLL
            for (int t = 0; t < T; t++) d[t][r] = dp(c, av[t]);
        }
        /* each row's block header (d, and m or the next bytes) */
        __m512i h0 = _mm512_i32gather_epi32(offs, (const void *)(w + b * bytes), 1);
        __m512i h1 = two ? _mm512_i32gather_epi32(offs, (const void *)(w + (b + 1) * bytes), 1) : h0;
        __m512 dw0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0)), dw1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h1));
        __m512 mw0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
        __m512 mw1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h1, 16)));
        TUNROLL
        for (int t = 0; t < T; t++) {
            __m512i i0, i1;
            reduce_rows_halves(d[t], &i0, &i1);
            for (int k = 0; k < 1 + two; k++) {
                const lm_q8a_block *ab = &a[t * a_stride + b + k];
                __m512i I = k ? i1 : i0;
                if (off) I = _mm512_sub_epi32(I, _mm512_set1_epi32(off * act_sum(ab)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(k ? dw1 : dw0, _mm512_set1_ps(ab->d)), acc[t]);
                if (has_min) acc[t] = _mm512_fmadd_ps(k ? mw1 : mw0, _mm512_set1_ps(ab->s), acc[t]);
            }
        }
    }
    TUNROLL
    for (int t = 0; t < T; t++) store_rows(y + t * y_stride, nr, acc[t]);
}

/* tokens GV_TOK at a time; CALL(T) with T constant */
#define GEMV_TOKENS(CALL)                                                                                       \
    for (int64_t t0 = 0; t0 < n_tok; t0 += GV_TOK) {                                                            \
        const lm_q8a_block *at = a + t0 * a_stride;                                                             \
        float *yt = y + t0 * y_stride;                                                                          \
        switch (n_tok - t0 < GV_TOK ? n_tok - t0 : GV_TOK) {                                                    \
        case 1: CALL(1); break;                                                                                 \
        case 2: CALL(2); break;                                                                                 \
        default: CALL(3); break;                                                                                \
        }                                                                                                       \
    }

#define GEMV_LEGACY(NAME, FMT, BYTES, OFF, HAS_MIN)                                                        \
    static void NAME(const uint8_t *w, size_t row_bytes, int nr, const lm_q8a_block *a, int64_t a_stride, \
                     int64_t n_tok, int64_t n, float *y, int64_t y_stride) {                               \
        for (int64_t t0 = 0; t0 < n_tok; t0 += GV_TOK) {                                                    \
            const lm_q8a_block *at = a + t0 * a_stride;                                                     \
            float *yt = y + t0 * y_stride;                                                                  \
            switch (n_tok - t0 < GV_TOK ? n_tok - t0 : GV_TOK) {                                            \
            case 1: gemv_legacy_T(FMT, BYTES, OFF, HAS_MIN, w, row_bytes, nr, at, a_stride, 1, n, yt, y_stride); break; \
            case 2: gemv_legacy_T(FMT, BYTES, OFF, HAS_MIN, w, row_bytes, nr, at, a_stride, 2, n, yt, y_stride); break; \
            default: gemv_legacy_T(FMT, BYTES, OFF, HAS_MIN, w, row_bytes, nr, at, a_stride, 3, n, yt, y_stride); break; \
            }                                                                                               \
        }                                                                                                   \
    }
GEMV_LEGACY(gemv_q4_0, FMT_Q4_0, 18, 8, 0)
GEMV_LEGACY(gemv_q4_1, FMT_Q4_1, 20, 0, 1)
GEMV_LEGACY(gemv_q5_0, FMT_Q5_0, 22, 16, 0)
GEMV_LEGACY(gemv_q5_1, FMT_Q5_1, 24, 0, 1)
GEMV_LEGACY(gemv_q8_0, FMT_Q8_0, 34, 128, 0)

/* pshufb controls: dword lanes 0..7 take scale byte j0, lanes 8..15 byte j1 (zero-extended) */
#define SC_CTL(j0, j1)                                                                                          \
    _mm512_setr_epi32(0x80808000 | j0, 0x80808000 | j0, 0x80808000 | j0, 0x80808000 | j0, 0x80808000 | j0,       \
                      0x80808000 | j0, 0x80808000 | j0, 0x80808000 | j0, 0x80808000 | j1, 0x80808000 | j1,       \
                      0x80808000 | j1, 0x80808000 | j1, 0x80808000 | j1, 0x80808000 | j1, 0x80808000 | j1,       \
                      0x80808000 | j1)

static inline __attribute__((always_inline)) void gemv_k4k5_T(int q5, const uint8_t *w, size_t row_bytes, int nr,
                                                              const lm_q8a_block *a, int64_t a_stride, int T,
                                                              int64_t n, float *y, int64_t y_stride) {
    const size_t bytes = q5 ? 176 : 144;
    const int qs_off = q5 ? 48 : 16;
    const uint8_t *rows[GV_ROWS];
    for (int r = 0; r < GV_ROWS; r++) rows[r] = w + (size_t)(r < nr ? r : nr - 1) * row_bytes;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i ctl[4] = {SC_CTL(0, 2), SC_CTL(1, 3), SC_CTL(4, 6), SC_CTL(5, 7)};
    /* Q5_K: the bit of each code in qh[l]: sub-block j is bit j */
    const __m512i hbit[4] = {
        _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x04), 1),
        _mm512_inserti64x4(_mm512_set1_epi8(0x02), _mm256_set1_epi8(0x08), 1),
        _mm512_inserti64x4(_mm512_set1_epi8(0x10), _mm256_set1_epi8(0x40), 1),
        _mm512_inserti64x4(_mm512_set1_epi8(0x20), _mm256_set1_epi8((char)0x80), 1),
    };
    __m512 acc[GV_TOK];
    TUNROLL
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const int64_t nsb = n / 256;
    /* super-blocks a chunk at a time; within a chunk each row is read in order */
    for (int64_t sb0 = 0; sb0 < nsb; sb0 += GV_CHUNK) {
        const int nc = (int)(nsb - sb0 < GV_CHUNK ? nsb - sb0 : GV_CHUNK);
        _Alignas(64) __m512i av[GV_TOK][GV_CHUNK][4], part[GV_TOK][GV_CHUNK][GV_ROWS];
        _Alignas(64) int32_t mins[GV_TOK][GV_CHUNK][GV_ROWS];
        _Alignas(32) uint16_t dh[GV_CHUNK][GV_ROWS], mh[GV_CHUNK][GV_ROWS];
        int32_t asum[GV_TOK][GV_CHUNK][8];
        TUNROLL
        for (int t = 0; t < T; t++)
            for (int c = 0; c < nc; c++) {
                const lm_q8a_block *as = &a[t * a_stride + 8 * (sb0 + c)];
                av[t][c][0] = act2(&as[0], &as[2]);
                av[t][c][1] = act2(&as[1], &as[3]);
                av[t][c][2] = act2(&as[4], &as[6]);
                av[t][c][3] = act2(&as[5], &as[7]);
                for (int j = 0; j < 8; j++) asum[t][c][j] = act_sum(&as[j]);
            }
        for (int r = 0; r < GV_ROWS; r++) {
            const uint8_t *wr = rows[r] + sb0 * bytes;
            for (int c = 0; c < nc; c++) {
                const uint8_t *wb = wr + c * bytes, *qs = wb + qs_off;
                /* the same bytes of the next group of rows, for the next call */
                const char *pf = (const char *)wb + GV_ROWS * row_bytes;
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + 64, _MM_HINT_T0);
                _mm_prefetch(pf + 128, _MM_HINT_T0);
                __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
                __m512i cd[4] = {_mm512_and_si512(q0, low4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), low4),
                                 _mm512_and_si512(q1, low4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), low4)};
                if (q5) {
                    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb + 16)));
                    for (int k = 0; k < 4; k++)
                        cd[k] = _mm512_mask_add_epi8(cd[k], _mm512_test_epi8_mask(qh, hbit[k]), cd[k],
                                                     _mm512_set1_epi8(0x10));
                }
                uint64_t sc8, m8;
                scales_k4_bytes(wb + 4, &sc8, &m8);
                __m512i scb = _mm512_set1_epi64((long long)sc8);
                __m512i scv[4];
                for (int k = 0; k < 4; k++) scv[k] = _mm512_shuffle_epi8(scb, ctl[k]);
                dh[c][r] = (uint16_t)(wb[0] | wb[1] << 8);
                mh[c][r] = (uint16_t)(wb[2] | wb[3] << 8);
                TUNROLL
                for (int t = 0; t < T; t++) {
                    __m512i p = _mm512_madd_epi16(dp(cd[0], av[t][c][0]), scv[0]);
                    p = add4(p, _mm512_madd_epi16(dp(cd[1], av[t][c][1]), scv[1]));
                    p = add4(p, _mm512_madd_epi16(dp(cd[2], av[t][c][2]), scv[2]));
                    p = add4(p, _mm512_madd_epi16(dp(cd[3], av[t][c][3]), scv[3]));
                    part[t][c][r] = p;
                    int32_t mt = 0;
                    for (int j = 0; j < 8; j++) mt += (int32_t)((m8 >> (8 * j)) & 0xff) * asum[t][c][j];
                    mins[t][c][r] = mt;
                }
            }
        }
        for (int c = 0; c < nc; c++) {
            __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh[c]));
            __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)mh[c]));
            TUNROLL
            for (int t = 0; t < T; t++) {
                __m512 da = _mm512_set1_ps(a[t * a_stride + 8 * (sb0 + c)].d);
                __m512i S = reduce_rows(part[t][c]), M = _mm512_load_si512(mins[t][c]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, da), acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dmin, da), acc[t]);
            }
        }
    }
    TUNROLL
    for (int t = 0; t < T; t++) store_rows(y + t * y_stride, nr, acc[t]);
}

static void gemv_q4_k(const uint8_t *w, size_t row_bytes, int nr, const lm_q8a_block *a, int64_t a_stride,
                      int64_t n_tok, int64_t n, float *y, int64_t y_stride) {
#define CALL(T) gemv_k4k5_T(0, w, row_bytes, nr, at, a_stride, T, n, yt, y_stride)
    GEMV_TOKENS(CALL)
#undef CALL
}
static void gemv_q5_k(const uint8_t *w, size_t row_bytes, int nr, const lm_q8a_block *a, int64_t a_stride,
                      int64_t n_tok, int64_t n, float *y, int64_t y_stride) {
#define CALL(T) gemv_k4k5_T(1, w, row_bytes, nr, at, a_stride, T, n, yt, y_stride)
    GEMV_TOKENS(CALL)
#undef CALL
}

static inline __attribute__((always_inline)) void gemv_q6k_T(const uint8_t *w, size_t row_bytes, int nr,
                                                             const lm_q8a_block *a, int64_t a_stride, int T,
                                                             int64_t n, float *y, int64_t y_stride) {
    const uint8_t *rows[GV_ROWS];
    for (int r = 0; r < GV_ROWS; r++) rows[r] = w + (size_t)(r < nr ? r : nr - 1) * row_bytes;
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    /* int16 index of the scale of each lane: chunk k (64 codes) covers sub-blocks 4k..4k+3 */
    __m512i sidx[4];
    for (int k = 0; k < 4; k++) {
        _Alignas(64) int16_t ix[32];
        for (int i = 0; i < 32; i++) ix[i] = (int16_t)(4 * k + (i / 2) / 4);
        sidx[k] = _mm512_load_si512(ix);
    }
    __m512 acc[GV_TOK];
    TUNROLL
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n / 256; sb++) {
        __m512i av[GV_TOK][4], part[GV_TOK][GV_ROWS];
        __m256i as16[GV_TOK];
        _Alignas(32) uint16_t dh[GV_ROWS];
        TUNROLL
        for (int t = 0; t < T; t++) {
            const lm_q8a_block *as = &a[t * a_stride + 8 * sb];
            _Alignas(32) int32_t hs[8];
            for (int k = 0; k < 4; k++) av[t][k] = act2(&as[2 * k], &as[2 * k + 1]);
            for (int j = 0; j < 8; j++) memcpy(&hs[j], as[j].sum16, 4);
            as16[t] = _mm256_load_si256((const __m256i *)hs);
        }
        TUNROLL
        for (int r = 0; r < GV_ROWS; r++) {
            const uint8_t *wb = rows[r] + sb * 210;
            const char *pf = (const char *)wb + GV_ROWS * row_bytes; /* next group of rows */
            for (int l = 0; l < 4; l++) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
            __m512i c[4];
            for (int h = 0; h < 2; h++) {
                __m512i ql = _mm512_loadu_si512(wb + 64 * h);
                __m256i qh = _mm256_loadu_si256((const __m256i *)(wb + 128 + 32 * h));
                __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
                __m512i h23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 4)), _mm256_srli_epi16(qh, 6), 1);
                c[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(_mm512_and_si512(h01, low2), 4));
                c[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                               _mm512_slli_epi16(_mm512_and_si512(h23, low2), 4));
            }
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
            __m512i scz = _mm512_castsi256_si512(sc16), scv[4];
            for (int k = 0; k < 4; k++) scv[k] = _mm512_maskz_permutexvar_epi16(0x55555555u, sidx[k], scz);
            __m256i sc32 = _mm256_slli_epi16(sc16, 5);
            dh[r] = (uint16_t)(wb[208] | wb[209] << 8);
            TUNROLL
            for (int t = 0; t < T; t++) {
                __m512i p = _mm512_madd_epi16(dp(c[0], av[t][0]), scv[0]);
                p = add4(p, _mm512_madd_epi16(dp(c[1], av[t][1]), scv[1]));
                p = add4(p, _mm512_madd_epi16(dp(c[2], av[t][2]), scv[2]));
                p = add4(p, _mm512_madd_epi16(dp(c[3], av[t][3]), scv[3]));
                /* the offset 32: minus 32 * sum_i sc_i * (sum of the sub-block's activations) */
                part[t][r] = _mm512_sub_epi32(p, _mm512_zextsi256_si512(_mm256_madd_epi16(sc32, as16[t])));
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh));
        TUNROLL
        for (int t = 0; t < T; t++) {
            __m512 da = _mm512_set1_ps(a[t * a_stride + 8 * sb].d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(reduce_rows(part[t])), _mm512_mul_ps(d, da), acc[t]);
        }
    }
    TUNROLL
    for (int t = 0; t < T; t++) store_rows(y + t * y_stride, nr, acc[t]);
}

static void gemv_q6_k(const uint8_t *w, size_t row_bytes, int nr, const lm_q8a_block *a, int64_t a_stride,
                      int64_t n_tok, int64_t n, float *y, int64_t y_stride) {
#define CALL(T) gemv_q6k_T(w, row_bytes, nr, at, a_stride, T, n, yt, y_stride)
    GEMV_TOKENS(CALL)
#undef CALL
}

lm_q8a_kernels lm_q8a_kernels_avx512(lm_dtype type) {
#define KSET(GEMV, PACK, TILE, BYTES) (lm_q8a_kernels){GEMV, GV_ROWS, PACK, TILE, BYTES}
    switch (type) {
    case LM_DTYPE_Q4_0: return KSET(gemv_q4_0, pack_q4_0, tile_q4_0, panel_bytes_legacy);
    case LM_DTYPE_Q4_1: return KSET(gemv_q4_1, pack_q4_1, tile_q4_1, panel_bytes_legacy);
    case LM_DTYPE_Q5_0: return KSET(gemv_q5_0, pack_q5_0, tile_q5_0, panel_bytes_legacy);
    case LM_DTYPE_Q5_1: return KSET(gemv_q5_1, pack_q5_1, tile_q5_1, panel_bytes_legacy);
    case LM_DTYPE_Q8_0: return KSET(gemv_q8_0, pack_q8_0, tile_q8_0, panel_bytes_legacy);
    case LM_DTYPE_Q4_K: return KSET(gemv_q4_k, pack_q4_k, tile_k4k5, panel_bytes_k);
    case LM_DTYPE_Q5_K: return KSET(gemv_q5_k, pack_q5_k, tile_k4k5, panel_bytes_k);
    case LM_DTYPE_Q6_K: return KSET(gemv_q6_k, pack_q6_k, tile_q6_k, panel_bytes_k);
    default: return (lm_q8a_kernels){0};
    }
#undef KSET
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
lm_q8a_kernels lm_q8a_kernels_avx512(lm_dtype type) {
    (void)type;
    return (lm_q8a_kernels){0};
}
#endif
