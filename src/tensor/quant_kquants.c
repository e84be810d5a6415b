/* The 256-element GGUF "K-quant" super-block formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * Q8_K. Layouts (bytes; multi-byte fields little-endian):
 *
 *   Q2_K (84)  scales[16] qs[64] d:f16 dmin:f16
 *       16 sub-blocks of 16; scales[i] = scale (low nibble) | min (high nibble);
 *       y = (d * sc) * q - (dmin * m), q in 0..3.
 *   Q3_K (110) hmask[32] qs[64] scales[12] d:f16
 *       16 sub-blocks of 16; 6-bit scales stored with +32; q = low 2 bits, minus 4
 *       when the hmask bit is CLEAR; y = (d * (sc - 32)) * q, q in -4..3.
 *   Q4_K (144) d:f16 dmin:f16 scales[12] qs[128]
 *       8 sub-blocks of 32; 6-bit scale and 6-bit min each, packed in 12 bytes;
 *       y = (d * sc) * q - (dmin * m), q in 0..15.
 *   Q5_K (176) d:f16 dmin:f16 scales[12] qh[32] qs[128]     as Q4_K, q in 0..31.
 *   Q6_K (210) ql[128] qh[64] scales[16]:int8 d:f16
 *       16 sub-blocks of 16; y = (d * sc) * (q - 32), q in 0..63.
 *   Q8_K (292) d:f32 qs[256]:int8 bsums[16]:int16 (sums of 16 codes);  y = d * q.
 *
 * Bit positions of element e (0..255) of a super-block, as the per-format loops below
 * walk them. With l = e % 32:
 *   2-bit fields (Q2_K, Q3_K qs): byte (e / 128) * 32 + l, bits 2 * ((e % 128) / 32).
 *   4-bit fields (Q4_K, Q5_K qs): byte (e / 64) * 32 + l, low nibble when (e % 64) < 32.
 *   1-bit fields (Q3_K hmask, Q5_K qh): byte l, bit e / 32.
 *   Q6_K: low 4 bits from ql byte (e / 128) * 64 + e % 64, high nibble when
 *         (e % 128) >= 64; high 2 bits from qh byte (e / 128) * 32 + l, bits
 *         2 * ((e % 128) / 32).
 * Every float expression evaluates in the order written, the order of the GGUF
 * reference, so dequantization is bit-exact to it. */
#include "tensor/quant_blocks.h"

enum { QK_K = 256 };

/* ---- the 12-byte packed scales ------------------------------------------------- */

/* Q4_K/Q5_K: 8 scales and 8 mins of 6 bits. Bytes 0..3 hold scales 0..3 in their low
 * 6 bits, bytes 4..7 mins 0..3; scale/min 4..7 have their low nibbles in bytes 8..11
 * (scale low, min high) and their top 2 bits in the top 2 bits of bytes 0..3 (scale)
 * and 4..7 (min). */
static void get_scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void put_scale_min_k4(uint8_t *s, const int *sc, const int *m) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

/* Q3_K: 16 scales of 6 bits. Scale j has its low nibble in byte j % 8 (low nibble
 * for j < 8, high for j >= 8) and its top 2 bits in byte 8 + j % 4 at bit 2 * (j / 4). */
static int get_scale_k3(const uint8_t *s, int j) {
    int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

static void put_scales_k3(uint8_t *s, const int *u) {
    memset(s, 0, 12);
    for (int j = 0; j < 16; j++) {
        s[j % 8] |= (uint8_t)((u[j] & 0x0f) << (j < 8 ? 0 : 4));
        s[8 + j % 4] |= (uint8_t)(((u[j] >> 4) & 3) << (2 * (j / 4)));
    }
}

/* ---- dequantization ------------------------------------------------------------ */

void lm_dequant_block_q2_k(const uint8_t *blk, float *y) {
    const uint8_t *scales = blk, *qs = blk + 16;
    const float d = lm_rd_f16(blk + 80), dmin = lm_rd_f16(blk + 82);
    for (int s = 0; s < 16; s++) {
        const float dl = d * (float)(scales[s] & 0x0f), ml = dmin * (float)(scales[s] >> 4);
        for (int e = 16 * s; e < 16 * s + 16; e++) {
            int l = e % 32, shift = 2 * ((e % 128) / 32);
            int q = (qs[(e / 128) * 32 + l] >> shift) & 3;
            y[e] = dl * (float)q - ml;
        }
    }
}

void lm_dequant_block_q3_k(const uint8_t *blk, float *y) {
    const uint8_t *hmask = blk, *qs = blk + 32, *scales = blk + 96;
    const float d = lm_rd_f16(blk + 108);
    for (int s = 0; s < 16; s++) {
        const float dl = d * (float)(get_scale_k3(scales, s) - 32);
        for (int e = 16 * s; e < 16 * s + 16; e++) {
            int l = e % 32, shift = 2 * ((e % 128) / 32);
            int q = (qs[(e / 128) * 32 + l] >> shift) & 3;
            if (!((hmask[l] >> (e / 32)) & 1)) q -= 4;
            y[e] = dl * (float)q;
        }
    }
}

/* Q4_K and Q5_K (qh == NULL for Q4_K). */
static void dequant_k4k5(const uint8_t *blk, const uint8_t *qh, const uint8_t *qs, float *y) {
    const float d = lm_rd_f16(blk), dmin = lm_rd_f16(blk + 2);
    const uint8_t *scales = blk + 4;
    for (int s = 0; s < 8; s++) {
        int sc, m;
        get_scale_min_k4(scales, s, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        for (int e = 32 * s; e < 32 * s + 32; e++) {
            int l = e % 32;
            int q = (qs[(e / 64) * 32 + l] >> ((e % 64) < 32 ? 0 : 4)) & 0x0f;
            if (qh) q |= ((qh[l] >> (e / 32)) & 1) << 4;
            y[e] = d1 * (float)q - m1;
        }
    }
}

void lm_dequant_block_q4_k(const uint8_t *blk, float *y) { dequant_k4k5(blk, NULL, blk + 16, y); }
void lm_dequant_block_q5_k(const uint8_t *blk, float *y) { dequant_k4k5(blk, blk + 16, blk + 48, y); }

void lm_dequant_block_q6_k(const uint8_t *blk, float *y) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *scales = (const int8_t *)(blk + 192);
    const float d = lm_rd_f16(blk + 208);
    for (int e = 0; e < QK_K; e++) {
        int half = e / 128, r = e % 128;
        int lo = (ql[half * 64 + r % 64] >> (r < 64 ? 0 : 4)) & 0x0f;
        int hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        int q = (lo | (hi << 4)) - 32;
        y[e] = d * (float)scales[e / 16] * (float)q;
    }
}

void lm_dequant_block_q8_k(const uint8_t *blk, float *y) {
    const float d = lm_rd_f32(blk);
    const int8_t *qs = (const int8_t *)(blk + 4);
    for (int e = 0; e < QK_K; e++) y[e] = d * (float)qs[e];
}

/* ---- quantization --------------------------------------------------------------
 * Plain, not error-optimal: per sub-block scale (and min) from the extremes, the
 * sub-block scales themselves quantized against a super-block scale, and the codes
 * rounded against the scales as they will be dequantized. */

static void put_2bit(uint8_t *qs, int e, int v) {
    qs[(e / 128) * 32 + e % 32] |= (uint8_t)((v & 3) << (2 * ((e % 128) / 32)));
}

static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* Asymmetric sub-blocks (Q2_K, Q4_K, Q5_K): for each of `nsub` sub-blocks of `len`,
 * y = (d * sc) * q - (dmin * m) with q in 0..levels, sc and m in 0..smax. Writes d and
 * dmin (f16) to pd/pdmin and fills sc, m and the codes q[256]. */
static void quant_asym(const float *x, int nsub, int len, int levels, int smax, uint8_t *pd,
                       uint8_t *pdmin, int *sc, int *m, int *q) {
    float scale[16], mins[16], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < nsub; s++) {
        const float *xs = x + s * len;
        float lo = 0.0f, hi = xs[0]; /* the min is never above 0: it is stored negated */
        for (int j = 0; j < len; j++) {
            if (xs[j] < lo) lo = xs[j];
            if (xs[j] > hi) hi = xs[j];
        }
        scale[s] = (hi - lo) / (float)levels;
        mins[s] = -lo;
        if (scale[s] > max_scale) max_scale = scale[s];
        if (mins[s] > max_min) max_min = mins[s];
    }
    const float d = lm_wr_f16(pd, max_scale / (float)smax);
    const float dmin = lm_wr_f16(pdmin, max_min / (float)smax);
    const float id = lm_safe_inv(d), idmin = lm_safe_inv(dmin);
    for (int s = 0; s < nsub; s++) {
        sc[s] = lm_quant_clamp(scale[s] * id, 0, smax);
        m[s] = lm_quant_clamp(mins[s] * idmin, 0, smax);
        const float dl = d * (float)sc[s], ml = dmin * (float)m[s];
        const float il = lm_safe_inv(dl);
        for (int j = 0; j < len; j++)
            q[s * len + j] = lm_quant_clamp((x[s * len + j] + ml) * il, 0, levels);
    }
}

void lm_quant_block_q2_k(const float *x, uint8_t *blk) {
    int sc[16], m[16], q[QK_K];
    memset(blk, 0, 84);
    quant_asym(x, 16, 16, 3, 15, blk + 80, blk + 82, sc, m, q);
    for (int s = 0; s < 16; s++) blk[s] = (uint8_t)(sc[s] | (m[s] << 4));
    for (int e = 0; e < QK_K; e++) put_2bit(blk + 16, e, q[e]);
}

static void quant_k4k5(const float *x, uint8_t *blk, uint8_t *qh, uint8_t *qs, int levels) {
    int sc[8], m[8], q[QK_K];
    quant_asym(x, 8, 32, levels, 63, blk, blk + 2, sc, m, q);
    put_scale_min_k4(blk + 4, sc, m);
    memset(qs, 0, 128);
    if (qh) memset(qh, 0, 32);
    for (int e = 0; e < QK_K; e++) {
        int l = e % 32;
        qs[(e / 64) * 32 + l] |= (uint8_t)((q[e] & 0x0f) << ((e % 64) < 32 ? 0 : 4));
        if (qh) qh[l] |= (uint8_t)(((q[e] >> 4) & 1) << (e / 32));
    }
}

void lm_quant_block_q4_k(const float *x, uint8_t *blk) { quant_k4k5(x, blk, NULL, blk + 16, 15); }
void lm_quant_block_q5_k(const float *x, uint8_t *blk) { quant_k4k5(x, blk, blk + 16, blk + 48, 31); }

/* Symmetric sub-blocks of 16 (Q3_K, Q6_K): the sub-block's largest-magnitude element
 * maps to code -qhalf, and the largest sub-block scale to -shalf. Writes d (f16) to pd,
 * the signed sub-block scales to sc[16] and signed codes to q[256]. */
static void quant_sym16(const float *x, int qhalf, int shalf, uint8_t *pd, int *sc, int *q) {
    float scale[16], best = 0.0f;
    for (int s = 0; s < 16; s++) {
        scale[s] = signed_absmax(x + 16 * s, 16) / (float)-qhalf;
        if (fabsf(scale[s]) > fabsf(best)) best = scale[s];
    }
    const float d = lm_wr_f16(pd, best / (float)-shalf);
    const float id = lm_safe_inv(d);
    for (int s = 0; s < 16; s++) {
        sc[s] = lm_quant_clamp(scale[s] * id, -shalf, shalf - 1);
        const float il = lm_safe_inv(d * (float)sc[s]);
        for (int j = 0; j < 16; j++)
            q[16 * s + j] = lm_quant_clamp(x[16 * s + j] * il, -qhalf, qhalf - 1);
    }
}

void lm_quant_block_q3_k(const float *x, uint8_t *blk) {
    int sc[16], q[QK_K];
    memset(blk, 0, 110);
    quant_sym16(x, 4, 32, blk + 108, sc, q);
    for (int s = 0; s < 16; s++) sc[s] += 32;
    put_scales_k3(blk + 96, sc);
    for (int e = 0; e < QK_K; e++) {
        int u = q[e] + 4; /* 0..7: low 2 bits in qs, bit 2 set in hmask means "no -4" */
        put_2bit(blk + 32, e, u & 3);
        blk[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
    }
}

void lm_quant_block_q6_k(const float *x, uint8_t *blk) {
    int sc[16], q[QK_K];
    memset(blk, 0, 210);
    quant_sym16(x, 32, 128, blk + 208, sc, q);
    for (int s = 0; s < 16; s++) blk[192 + s] = (uint8_t)(int8_t)sc[s];
    for (int e = 0; e < QK_K; e++) {
        int u = q[e] + 32, half = e / 128, r = e % 128;
        blk[half * 64 + r % 64] |= (uint8_t)((u & 0x0f) << (r < 64 ? 0 : 4));
        blk[128 + half * 32 + r % 32] |= (uint8_t)((u >> 4) << (2 * (r / 32)));
    }
}

void lm_quant_block_q8_k(const float *x, uint8_t *blk) {
    float amax = 0.0f;
    for (int e = 0; e < QK_K; e++)
        if (fabsf(x[e]) > amax) amax = fabsf(x[e]);
    const float d = amax / 127.0f;
    const float id = lm_safe_inv(d);
    lm_wr_f32(blk, d);
    int8_t *qs = (int8_t *)(blk + 4);
    for (int e = 0; e < QK_K; e++) qs[e] = (int8_t)lm_quant_clamp(x[e] * id, -127, 127);
    for (int s = 0; s < 16; s++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += qs[16 * s + j];
        lm_wr_u16(blk + 260 + 2 * s, (uint16_t)(int16_t)sum);
    }
}
