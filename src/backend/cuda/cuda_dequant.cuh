/* Device decoding of weight rows, eight elements at a time.
 *
 * deq8<T>(row, c, y) writes elements 8c .. 8c+7 of a row stored in format T (the GGUF
 * block layouts of src/tensor/quant_legacy.c and quant_kquants.c, kept as in the
 * file). Eight consecutive elements always share one block and one sub-block scale,
 * so each call decodes its scales once. Products and sums are rounded one at a time
 * (__fmul_rn, __fadd_rn: no fused multiply-add) in the order the reference writes
 * them, so every decoded value is bit-identical to lm_dequantize_row().
 *
 * Loads are as wide as the block layout allows: 16 bytes for F32/F16/BF16 rows
 * (cols % 8 == 0), 8 bytes for Q4_K/Q5_K (144- and 176-byte blocks), 4 or 2 bytes for
 * the formats whose block sizes are not multiples of 8. */
#ifndef LM_BACKEND_CUDA_DEQUANT_CUH
#define LM_BACKEND_CUDA_DEQUANT_CUH

#include "backend/cuda/cuda_internal.cuh"

__device__ __forceinline__ float lm_ld_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* 16 bytes of a weight row. Weights are read once a pass, so they bypass L1 (which
 * keeps the activations every warp rereads), and L2 fetches the whole 256-byte
 * sector group (a warp reads a row's consecutive 512 bytes). */
#define LM_LD_WEIGHTS16_PTX "ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
__device__ __forceinline__ uint4 lm_ld_weights16(const void *p) {
    uint4 u;
    asm(LM_LD_WEIGHTS16_PTX : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    return u;
}

/* lm_ld_weights16 that stays where it is written (volatile): the compiler may
 * otherwise sink it past a PDL wait (an asm with a memory clobber) it was put before */
__device__ __forceinline__ uint4 lm_ld_weights16_early(const void *p) {
    uint4 u;
    asm volatile(LM_LD_WEIGHTS16_PTX : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    return u;
}

__device__ __forceinline__ uint32_t lm_ld_u16(const uint8_t *p) { return *(const unsigned short *)p; }

/* 8 bytes from a 2-byte aligned address, as two little-endian words */
__device__ __forceinline__ void lm_ld8_a2(const uint8_t *p, uint32_t *lo, uint32_t *hi) {
    *lo = lm_ld_u16(p) | (lm_ld_u16(p + 2) << 16);
    *hi = lm_ld_u16(p + 4) | (lm_ld_u16(p + 6) << 16);
}

__device__ __forceinline__ void lm_ld8_a4(const uint8_t *p, uint32_t *lo, uint32_t *hi) {
    *lo = *(const uint32_t *)p;
    *hi = *(const uint32_t *)(p + 4);
}

__device__ __forceinline__ void lm_ld8_a8(const uint8_t *p, uint32_t *lo, uint32_t *hi) {
    uint2 u = *(const uint2 *)p;
    *lo = u.x;
    *hi = u.y;
}

/* byte k (0..7) of the 8 bytes lo|hi */
__device__ __forceinline__ int lm_byte8(uint32_t lo, uint32_t hi, int k) {
    return (int)(((k < 4 ? lo : hi) >> (8 * (k & 3))) & 0xffu);
}

__device__ __forceinline__ float lm_bf16_bits(uint32_t h) { return __uint_as_float(h << 16); }

template <int T>
__device__ __forceinline__ void deq8(const uint8_t *__restrict__ row, int64_t c, float *y);

template <>
__device__ __forceinline__ void deq8<LM_DTYPE_F32>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint4 *p = (const uint4 *)row + 2 * c;
    const uint4 a = lm_ld_weights16(p), b = lm_ld_weights16(p + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = __uint_as_float(w[i]);
}

/* The 8 elements of a 16-byte word of an F16 or BF16 row (deq8 of a loaded word). */
template <int T>
__device__ __forceinline__ void deq8_words(uint4 u, float *y) {
    static_assert(T == LM_DTYPE_F16 || T == LM_DTYPE_BF16, "16-bit formats only");
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (T == LM_DTYPE_F16) {
            y[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
            y[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
        } else {
            y[2 * i] = lm_bf16_bits(w[i] & 0xffffu);
            y[2 * i + 1] = lm_bf16_bits(w[i] >> 16);
        }
    }
}

template <>
__device__ __forceinline__ void deq8<LM_DTYPE_F16>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    deq8_words<LM_DTYPE_F16>(lm_ld_weights16((const uint4 *)row + c), y);
}

template <>
__device__ __forceinline__ void deq8<LM_DTYPE_BF16>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    deq8_words<LM_DTYPE_BF16>(lm_ld_weights16((const uint4 *)row + c), y);
}

/* Q4_0: d:f16 qs[16]; element j low nibble of qs[j], j + 16 high nibble; y = (q - 8) * d */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q4_0>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 2) * 18;
    int j = (int)(c & 3) * 8, sh = j >= 16 ? 4 : 0;
    float d = lm_ld_f16(blk);
    uint32_t lo, hi;
    lm_ld8_a2(blk + 2 + (j & 15), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = __fmul_rn((float)(((lm_byte8(lo, hi, k) >> sh) & 15) - 8), d);
}

/* Q4_1: d:f16 m:f16 qs[16]; y = q * d + m */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q4_1>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 2) * 20;
    int j = (int)(c & 3) * 8, sh = j >= 16 ? 4 : 0;
    float d = lm_ld_f16(blk), m = lm_ld_f16(blk + 2);
    uint32_t lo, hi;
    lm_ld8_a4(blk + 4 + (j & 15), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = __fadd_rn(__fmul_rn((float)((lm_byte8(lo, hi, k) >> sh) & 15), d), m);
}

/* Q5_0: d:f16 qh:u32 qs[16]; bit 4 of element e is bit e of qh; y = (q - 16) * d */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q5_0>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 2) * 22;
    int j = (int)(c & 3) * 8, sh = j >= 16 ? 4 : 0;
    float d = lm_ld_f16(blk);
    uint32_t qh = lm_ld_u16(blk + 2) | (lm_ld_u16(blk + 4) << 16), lo, hi;
    lm_ld8_a2(blk + 6 + (j & 15), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = ((lm_byte8(lo, hi, k) >> sh) & 15) | (int)(((qh >> (j + k)) & 1u) << 4);
        y[k] = __fmul_rn((float)(q - 16), d);
    }
}

/* Q5_1: d:f16 m:f16 qh:u32 qs[16]; y = q * d + m */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q5_1>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 2) * 24;
    int j = (int)(c & 3) * 8, sh = j >= 16 ? 4 : 0;
    float d = lm_ld_f16(blk), m = lm_ld_f16(blk + 2);
    uint32_t qh = *(const uint32_t *)(blk + 4), lo, hi;
    lm_ld8_a8(blk + 8 + (j & 15), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = ((lm_byte8(lo, hi, k) >> sh) & 15) | (int)(((qh >> (j + k)) & 1u) << 4);
        y[k] = __fadd_rn(__fmul_rn((float)q, d), m);
    }
}

/* Q8_0: d:f16 qs[32]:int8; y = q * d */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q8_0>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 2) * 34;
    int j = (int)(c & 3) * 8;
    float d = lm_ld_f16(blk);
    uint32_t lo, hi;
    lm_ld8_a2(blk + 2 + j, &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = __fmul_rn((float)(int8_t)lm_byte8(lo, hi, k), d);
}

/* Q2_K (84): scales[16] qs[64] d dmin; y = (d * sc) * q - (dmin * m) */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q2_K>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 5) * 84;
    int e0 = (int)(c & 31) * 8;
    int sc = blk[e0 / 16];
    float d = lm_ld_f16(blk + 80), dmin = lm_ld_f16(blk + 82);
    float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
    int sh = 2 * ((e0 % 128) / 32);
    uint32_t lo, hi;
    lm_ld8_a4(blk + 16 + (e0 / 128) * 32 + (e0 % 32), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = __fsub_rn(__fmul_rn(dl, (float)((lm_byte8(lo, hi, k) >> sh) & 3)), ml);
}

/* Q3_K (110): hmask[32] qs[64] scales[12] d; y = (d * (sc - 32)) * q, q in -4..3 */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q3_K>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 5) * 110;
    int e0 = (int)(c & 31) * 8, s = e0 / 16, l0 = e0 % 32;
    const uint8_t *scales = blk + 96;
    int slo = s < 8 ? (scales[s] & 0x0f) : (scales[s - 8] >> 4);
    int shi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    float dl = __fmul_rn(lm_ld_f16(blk + 108), (float)((slo | (shi << 4)) - 32));
    int sh = 2 * ((e0 % 128) / 32), hb = e0 / 32;
    uint32_t lo, hi, mlo, mhi;
    lm_ld8_a2(blk + 32 + (e0 / 128) * 32 + l0, &lo, &hi);
    lm_ld8_a2(blk + l0, &mlo, &mhi);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = (lm_byte8(lo, hi, k) >> sh) & 3;
        if (!((lm_byte8(mlo, mhi, k) >> hb) & 1)) q -= 4;
        y[k] = __fmul_rn(dl, (float)q);
    }
}

/* Q4_K/Q5_K 6-bit scale and min of sub-block j (see quant_kquants.c) */
__device__ __forceinline__ void lm_scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (144): d dmin scales[12] qs[128]; y = (d * sc) * q - (dmin * m) */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q4_K>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 5) * 144;
    int e0 = (int)(c & 31) * 8, sc, m;
    lm_scale_min_k4(blk + 4, e0 / 32, &sc, &m);
    float d1 = __fmul_rn(lm_ld_f16(blk), (float)sc), m1 = __fmul_rn(lm_ld_f16(blk + 2), (float)m);
    int sh = (e0 % 64) < 32 ? 0 : 4;
    uint32_t lo, hi;
    lm_ld8_a8(blk + 16 + (e0 / 64) * 32 + (e0 % 32), &lo, &hi);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = __fsub_rn(__fmul_rn(d1, (float)((lm_byte8(lo, hi, k) >> sh) & 15)), m1);
}

/* Q5_K (176): d dmin scales[12] qh[32] qs[128] */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q5_K>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 5) * 176;
    int e0 = (int)(c & 31) * 8, sc, m;
    lm_scale_min_k4(blk + 4, e0 / 32, &sc, &m);
    float d1 = __fmul_rn(lm_ld_f16(blk), (float)sc), m1 = __fmul_rn(lm_ld_f16(blk + 2), (float)m);
    int sh = (e0 % 64) < 32 ? 0 : 4, hb = e0 / 32;
    uint32_t lo, hi, hlo, hhi;
    lm_ld8_a8(blk + 48 + (e0 / 64) * 32 + (e0 % 32), &lo, &hi);
    lm_ld8_a8(blk + 16 + (e0 % 32), &hlo, &hhi);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = ((lm_byte8(lo, hi, k) >> sh) & 15) | (((lm_byte8(hlo, hhi, k) >> hb) & 1) << 4);
        y[k] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

/* Q6_K (210): ql[128] qh[64] scales[16]:int8 d; y = (d * sc) * (q - 32) */
template <>
__device__ __forceinline__ void deq8<LM_DTYPE_Q6_K>(const uint8_t *__restrict__ row, int64_t c, float *y) {
    const uint8_t *blk = row + (c >> 5) * 210;
    int e0 = (int)(c & 31) * 8, half = e0 / 128, r = e0 % 128;
    float dl = __fmul_rn(lm_ld_f16(blk + 208), (float)(int8_t)blk[192 + e0 / 16]);
    int shl = r < 64 ? 0 : 4, shh = 2 * (r / 32);
    uint32_t lo, hi, hlo, hhi;
    lm_ld8_a2(blk + half * 64 + r % 64, &lo, &hi);
    lm_ld8_a2(blk + 128 + half * 32 + r % 32, &hlo, &hhi);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = ((lm_byte8(lo, hi, k) >> shl) & 15) | (((lm_byte8(hlo, hhi, k) >> shh) & 3) << 4);
        y[k] = __fmul_rn(dl, (float)(q - 32));
    }
}

/* Calls F.template operator()<T>() for the device format `type`; false if the type
 * has no device decoder. Every kernel family that decodes weights dispatches here, so
 * the list of formats lives in one place. */
#define LM_CUDA_FOR_EACH_TYPE(X) \
    X(LM_DTYPE_F32) X(LM_DTYPE_F16) X(LM_DTYPE_BF16) X(LM_DTYPE_Q4_0) X(LM_DTYPE_Q4_1) X(LM_DTYPE_Q5_0) \
    X(LM_DTYPE_Q5_1) X(LM_DTYPE_Q8_0) X(LM_DTYPE_Q2_K) X(LM_DTYPE_Q3_K) X(LM_DTYPE_Q4_K) X(LM_DTYPE_Q5_K) \
    X(LM_DTYPE_Q6_K)

#endif
