/* Internal to src/tensor: per-block converters of the GGUF block formats, and the
 * little helpers they share. One block in, one block out; quant.c walks rows. */
#ifndef LM_TENSOR_QUANT_BLOCKS_H
#define LM_TENSOR_QUANT_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor/quant.h"

/* dequantize one block of `type` into y[block_size] */
typedef void (*lm_dequant_block_fn)(const uint8_t *blk, float *y);
/* quantize x[block_size] into one block of `type` */
typedef void (*lm_quant_block_fn)(const float *x, uint8_t *blk);

#define LM_DECLARE_BLOCK_FNS(name)                                  \
    void lm_dequant_block_##name(const uint8_t *blk, float *y);     \
    void lm_quant_block_##name(const float *x, uint8_t *blk);

LM_DECLARE_BLOCK_FNS(q4_0)
LM_DECLARE_BLOCK_FNS(q4_1)
LM_DECLARE_BLOCK_FNS(q5_0)
LM_DECLARE_BLOCK_FNS(q5_1)
LM_DECLARE_BLOCK_FNS(q8_0)
LM_DECLARE_BLOCK_FNS(q8_1)
LM_DECLARE_BLOCK_FNS(q2_k)
LM_DECLARE_BLOCK_FNS(q3_k)
LM_DECLARE_BLOCK_FNS(q4_k)
LM_DECLARE_BLOCK_FNS(q5_k)
LM_DECLARE_BLOCK_FNS(q6_k)
LM_DECLARE_BLOCK_FNS(q8_k)

#undef LM_DECLARE_BLOCK_FNS

/* Multi-byte fields of GGUF blocks are little-endian; read them bytewise so that
 * alignment and host order never matter. */
static inline uint16_t lm_rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline void lm_wr_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}
static inline uint32_t lm_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline void lm_wr_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline float lm_rd_f16(const uint8_t *p) { return lm_f16_to_f32(lm_rd_u16(p)); }
static inline float lm_rd_f32(const uint8_t *p) {
    uint32_t u = lm_rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void lm_wr_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    lm_wr_u32(p, u);
}

/* Stores f as f16 at p and returns the value actually stored (what dequantization
 * will see), so quantizers round against the real scale. */
static inline float lm_wr_f16(uint8_t *p, float f) {
    uint16_t h = lm_f32_to_f16(f);
    lm_wr_u16(p, h);
    return lm_f16_to_f32(h);
}

/* round(v) clamped to [lo, hi]; NaN gives lo. Clamping happens in float, before the
 * conversion, so no out-of-range float reaches an int. */
static inline int lm_quant_clamp(float v, int lo, int hi) {
    if (!(v >= (float)lo)) return lo;
    if (v > (float)hi) return hi;
    int q = (int)roundf(v);
    return q > hi ? hi : q;
}

/* 1/d, or 0 when d is 0 or not finite (the block then quantizes to its zero point). */
static inline float lm_safe_inv(float d) {
    return (d != 0.0f && isfinite(d) && isfinite(1.0f / d)) ? 1.0f / d : 0.0f;
}

#endif
