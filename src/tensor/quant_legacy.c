/* The 32-element GGUF block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
 *
 * Layout (bytes, little-endian):
 *   Q4_0  d:f16  qs[16]                 y = d * (q - 8)
 *   Q4_1  d:f16  m:f16  qs[16]          y = d * q + m
 *   Q5_0  d:f16  qh[4]  qs[16]          y = d * (q - 16)
 *   Q5_1  d:f16  m:f16  qh[4]  qs[16]   y = d * q + m
 *   Q8_0  d:f16  qs[32] (int8)          y = d * q
 *   Q8_1  d:f16  s:f16  qs[32] (int8)   y = d * q   (s = d * sum(q), for dot kernels)
 * The 4-bit formats keep element j in the low nibble of qs[j] and element j + 16 in
 * the high nibble; the 5-bit ones take bit 4 of element j from bit j of the
 * little-endian uint32 qh. Every expression below evaluates in float in the order
 * written, which is the order of the GGUF reference. */
#include "tensor/quant_blocks.h"

enum { QK = 32 };

/* ---- dequantization ------------------------------------------------------------ */

void lm_dequant_block_q4_0(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk);
    const uint8_t *qs = blk + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

void lm_dequant_block_q4_1(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk), m = lm_rd_f16(blk + 2);
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

void lm_dequant_block_q5_0(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk);
    const uint32_t qh = lm_rd_u32(blk + 2);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)(lo - 16) * d;
        y[j + QK / 2] = (float)(hi - 16) * d;
    }
}

void lm_dequant_block_q5_1(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk), m = lm_rd_f16(blk + 2);
    const uint32_t qh = lm_rd_u32(blk + 4);
    const uint8_t *qs = blk + 8;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)lo * d + m;
        y[j + QK / 2] = (float)hi * d + m;
    }
}

void lm_dequant_block_q8_0(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk);
    const int8_t *qs = (const int8_t *)(blk + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

void lm_dequant_block_q8_1(const uint8_t *blk, float *y) {
    const float d = lm_rd_f16(blk);
    const int8_t *qs = (const int8_t *)(blk + 4);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

/* ---- quantization --------------------------------------------------------------
 * Round to nearest against the scale as stored (f16), so the stored codes are the
 * best ones for the scale that dequantization will actually use. */

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

/* Packs 32 codes of up to 5 bits: low nibbles into qs, bit 4 into qh (if non-NULL). */
static void pack_nibbles(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + QK / 2] & 0x0f) << 4));
    for (int j = 0; j < QK; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    if (qh) lm_wr_u32(qh, h);
}

/* Symmetric: the largest-magnitude element maps to the code -2^(bits-1) exactly
 * (one more level on that side than the other). */
static void quant_symmetric(const float *x, uint8_t *blk, int half, uint8_t *qs, uint8_t *qh) {
    int q[QK];
    const float d = lm_wr_f16(blk, signed_absmax(x, QK) / (float)-half);
    const float id = lm_safe_inv(d);
    for (int j = 0; j < QK; j++) q[j] = lm_quant_clamp(x[j] * id, -half, half - 1) + half;
    pack_nibbles(q, qs, qh);
}

/* Asymmetric: min and max map to codes 0 and 2^bits - 1. */
static void quant_minmax(const float *x, uint8_t *blk, int levels, uint8_t *qs, uint8_t *qh) {
    int q[QK];
    float mn, mx;
    min_max(x, QK, &mn, &mx);
    const float d = lm_wr_f16(blk, (mx - mn) / (float)levels);
    const float m = lm_wr_f16(blk + 2, mn);
    const float id = lm_safe_inv(d);
    for (int j = 0; j < QK; j++) q[j] = lm_quant_clamp((x[j] - m) * id, 0, levels);
    pack_nibbles(q, qs, qh);
}

void lm_quant_block_q4_0(const float *x, uint8_t *blk) { quant_symmetric(x, blk, 8, blk + 2, NULL); }
void lm_quant_block_q5_0(const float *x, uint8_t *blk) { quant_symmetric(x, blk, 16, blk + 6, blk + 2); }
void lm_quant_block_q4_1(const float *x, uint8_t *blk) { quant_minmax(x, blk, 15, blk + 4, NULL); }
void lm_quant_block_q5_1(const float *x, uint8_t *blk) { quant_minmax(x, blk, 31, blk + 8, blk + 4); }

/* Returns the sum of the codes (for Q8_1's s). */
static int quant_q8(const float *x, uint8_t *blk, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
    const float d = lm_wr_f16(blk, amax / 127.0f);
    const float id = lm_safe_inv(d);
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        qs[j] = (int8_t)lm_quant_clamp(x[j] * id, -127, 127);
        sum += qs[j];
    }
    return sum;
}

void lm_quant_block_q8_0(const float *x, uint8_t *blk) { quant_q8(x, blk, (int8_t *)(blk + 2)); }

void lm_quant_block_q8_1(const float *x, uint8_t *blk) {
    int sum = quant_q8(x, blk, (int8_t *)(blk + 4));
    lm_wr_f16(blk + 2, lm_rd_f16(blk) * (float)sum);
}
