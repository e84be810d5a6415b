/* MLX affine quantization: a row of n codes of `bits` bits forms one little-endian bit
 * stream stored as uint32 words, code i at bits [i * bits, (i + 1) * bits) of the
 * stream (bit k of the stream is bit k % 32 of word k / 32). For 2, 4 and 8 bits the
 * codes never straddle a word; for 3 and 6 bits they do (3-bit code 10 takes bits
 * 30, 31 of word 0 and bit 0 of word 1). Every `group_size` consecutive codes share a
 * scale and a bias: w = scale * q + bias. */
#include "tensor/quant_blocks.h"

static bool affine_args_ok(int bits, int group_size, int64_t n) {
    return group_size > 0 && n > 0 && n % group_size == 0 && lm_affine_row_bytes(bits, n) != 0;
}

static bool scale_type_ok(lm_dtype t) {
    return t == LM_DTYPE_F32 || t == LM_DTYPE_F16 || t == LM_DTYPE_BF16;
}

static float load_scale(const void *p, lm_dtype t, int64_t i) {
    const uint8_t *b = p;
    switch (t) {
    case LM_DTYPE_F16: return lm_rd_f16(b + 2 * i);
    case LM_DTYPE_BF16: return lm_bf16_to_f32(lm_rd_u16(b + 2 * i));
    default: return lm_rd_f32(b + 4 * i);
    }
}

/* Stores v as type t and returns the value as stored. */
static float store_scale(void *p, lm_dtype t, int64_t i, float v) {
    uint8_t *b = p;
    switch (t) {
    case LM_DTYPE_F16: return lm_wr_f16(b + 2 * i, v);
    case LM_DTYPE_BF16: {
        uint16_t h = lm_f32_to_bf16(v);
        lm_wr_u16(b + 2 * i, h);
        return lm_bf16_to_f32(h);
    }
    default: lm_wr_f32(b + 4 * i, v); return v;
    }
}

static uint32_t get_code(const uint32_t *packed, int bits, int64_t i) {
    int64_t bit = i * bits;
    int64_t w = bit / 32;
    int off = (int)(bit % 32);
    uint64_t v = packed[w] >> off;
    if (off + bits > 32) v |= (uint64_t)packed[w + 1] << (32 - off);
    return (uint32_t)(v & ((1u << bits) - 1u));
}

static void put_code(uint32_t *packed, int bits, int64_t i, uint32_t q) {
    int64_t bit = i * bits;
    int64_t w = bit / 32;
    int off = (int)(bit % 32);
    packed[w] |= q << off;
    if (off + bits > 32) packed[w + 1] |= q >> (32 - off);
}

bool lm_affine_dequantize_row(int bits, int group_size, const uint32_t *packed,
                              const void *scales, const void *biases, lm_dtype scale_type,
                              float *dst, int64_t n) {
    if (!affine_args_ok(bits, group_size, n) || !scale_type_ok(scale_type) || !packed ||
        !scales || !biases || !dst)
        return false;
    for (int64_t g = 0; g < n / group_size; g++) {
        const float s = load_scale(scales, scale_type, g), b = load_scale(biases, scale_type, g);
        for (int64_t i = g * group_size; i < (g + 1) * group_size; i++)
            dst[i] = s * (float)get_code(packed, bits, i) + b;
    }
    return true;
}

float lm_affine_dot_row_f32(int bits, int group_size, const uint32_t *packed,
                            const void *scales, const void *biases, lm_dtype scale_type,
                            const float *x, int64_t n) {
    if (!affine_args_ok(bits, group_size, n) || !scale_type_ok(scale_type) || !packed ||
        !scales || !biases || !x)
        return 0.0f;
    float total = 0.0f;
    for (int64_t g = 0; g < n / group_size; g++) {
        const float s = load_scale(scales, scale_type, g), b = load_scale(biases, scale_type, g);
        float sum = 0.0f;
        for (int64_t i = g * group_size; i < (g + 1) * group_size; i++)
            sum += (s * (float)get_code(packed, bits, i) + b) * x[i];
        total += sum;
    }
    return total;
}

bool lm_affine_quantize_row(int bits, int group_size, const float *src, uint32_t *packed,
                            void *scales, void *biases, lm_dtype scale_type, int64_t n) {
    if (!affine_args_ok(bits, group_size, n) || !scale_type_ok(scale_type) || !src ||
        !packed || !scales || !biases)
        return false;
    const int levels = (1 << bits) - 1;
    memset(packed, 0, lm_affine_row_bytes(bits, n));
    for (int64_t g = 0; g < n / group_size; g++) {
        const float *x = src + g * group_size;
        float mn = x[0], mx = x[0];
        for (int i = 1; i < group_size; i++) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        /* round against the scale and bias as stored, which dequantization uses */
        const float s = store_scale(scales, scale_type, g, (mx - mn) / (float)levels);
        const float b = store_scale(biases, scale_type, g, mn);
        const float is = lm_safe_inv(s);
        for (int i = 0; i < group_size; i++)
            put_code(packed, bits, g * group_size + i,
                     (uint32_t)lm_quant_clamp((x[i] - b) * is, 0, levels));
    }
    return true;
}
