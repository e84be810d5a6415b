/* Row-level dispatch over the formats: plain element types are converted here, block
 * formats block by block through the converters of quant_legacy.c and
 * quant_kquants.c. */
#include "tensor/quant_blocks.h"

typedef struct block_ops {
    lm_dtype type;
    lm_dequant_block_fn dequant;
    lm_quant_block_fn quant;
} block_ops;

static const block_ops k_block_ops[] = {
    {LM_DTYPE_Q4_0, lm_dequant_block_q4_0, lm_quant_block_q4_0},
    {LM_DTYPE_Q4_1, lm_dequant_block_q4_1, lm_quant_block_q4_1},
    {LM_DTYPE_Q5_0, lm_dequant_block_q5_0, lm_quant_block_q5_0},
    {LM_DTYPE_Q5_1, lm_dequant_block_q5_1, lm_quant_block_q5_1},
    {LM_DTYPE_Q8_0, lm_dequant_block_q8_0, lm_quant_block_q8_0},
    {LM_DTYPE_Q8_1, lm_dequant_block_q8_1, lm_quant_block_q8_1},
    {LM_DTYPE_Q2_K, lm_dequant_block_q2_k, lm_quant_block_q2_k},
    {LM_DTYPE_Q3_K, lm_dequant_block_q3_k, lm_quant_block_q3_k},
    {LM_DTYPE_Q4_K, lm_dequant_block_q4_k, lm_quant_block_q4_k},
    {LM_DTYPE_Q5_K, lm_dequant_block_q5_k, lm_quant_block_q5_k},
    {LM_DTYPE_Q6_K, lm_dequant_block_q6_k, lm_quant_block_q6_k},
    {LM_DTYPE_Q8_K, lm_dequant_block_q8_k, lm_quant_block_q8_k},
};

static const block_ops *find_block_ops(lm_dtype type) {
    for (size_t i = 0; i < sizeof k_block_ops / sizeof k_block_ops[0]; i++)
        if (k_block_ops[i].type == type) return &k_block_ops[i];
    return NULL;
}

/* Element i of a row of a plain (block size 1) type as f32; false if `type` is not
 * one. Integers convert with the usual C rounding to nearest float. */
static bool plain_to_f32(lm_dtype type, const uint8_t *row, int64_t i, float *out) {
    switch (type) {
    case LM_DTYPE_F32: *out = lm_rd_f32(row + 4 * i); return true;
    case LM_DTYPE_F16: *out = lm_rd_f16(row + 2 * i); return true;
    case LM_DTYPE_BF16: *out = lm_bf16_to_f32(lm_rd_u16(row + 2 * i)); return true;
    case LM_DTYPE_F64: {
        double d;
        memcpy(&d, row + 8 * i, sizeof d);
        *out = (float)d;
        return true;
    }
    case LM_DTYPE_I8: *out = (float)(int8_t)row[i]; return true;
    case LM_DTYPE_U8: *out = (float)row[i]; return true;
    case LM_DTYPE_BOOL: *out = row[i] ? 1.0f : 0.0f; return true;
    case LM_DTYPE_I16: *out = (float)(int16_t)lm_rd_u16(row + 2 * i); return true;
    case LM_DTYPE_U16: *out = (float)lm_rd_u16(row + 2 * i); return true;
    case LM_DTYPE_I32: *out = (float)(int32_t)lm_rd_u32(row + 4 * i); return true;
    case LM_DTYPE_U32: *out = (float)lm_rd_u32(row + 4 * i); return true;
    case LM_DTYPE_I64:
    case LM_DTYPE_U64: {
        uint64_t u = (uint64_t)lm_rd_u32(row + 8 * i) | ((uint64_t)lm_rd_u32(row + 8 * i + 4) << 32);
        *out = type == LM_DTYPE_I64 ? (float)(int64_t)u : (float)u;
        return true;
    }
    default: return false;
    }
}

static bool is_plain(lm_dtype type) {
    float unused;
    static const uint8_t zero[8];
    return plain_to_f32(type, zero, 0, &unused);
}

bool lm_dequantize_row(lm_dtype type, const void *src, float *dst, int64_t n) {
    if (!src || !dst || n < 0 || (n > 0 && lm_dtype_row_bytes(type, n) == 0)) return false;
    const uint8_t *row = src;
    const block_ops *ops = find_block_ops(type);
    if (ops) {
        const lm_dtype_info *info = lm_dtype_get_info((int)type);
        for (int64_t b = 0; b < n / info->block_size; b++)
            ops->dequant(row + b * (int64_t)info->block_bytes, dst + b * info->block_size);
        return true;
    }
    if (!is_plain(type)) return false;
    for (int64_t i = 0; i < n; i++) plain_to_f32(type, row, i, &dst[i]);
    return true;
}

bool lm_quantize_row(lm_dtype type, const float *src, void *dst, int64_t n) {
    if (!src || !dst || n < 0 || (n > 0 && lm_dtype_row_bytes(type, n) == 0)) return false;
    uint8_t *row = dst;
    const block_ops *ops = find_block_ops(type);
    if (ops) {
        const lm_dtype_info *info = lm_dtype_get_info((int)type);
        for (int64_t b = 0; b < n / info->block_size; b++)
            ops->quant(src + b * info->block_size, row + b * (int64_t)info->block_bytes);
        return true;
    }
    switch (type) {
    case LM_DTYPE_F32:
        for (int64_t i = 0; i < n; i++) lm_wr_f32(row + 4 * i, src[i]);
        return true;
    case LM_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) lm_wr_u16(row + 2 * i, lm_f32_to_f16(src[i]));
        return true;
    case LM_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) lm_wr_u16(row + 2 * i, lm_f32_to_bf16(src[i]));
        return true;
    default: return false;
    }
}

/* Each block is dequantized into a small buffer and its products summed in a float
 * partial, added to a float total: exactly "dequantize, then multiply", with the
 * summation split per block as fast kernels split it. Plain types use blocks of 256
 * elements the same way. Returns 0 for an unsupported type or a bad n. */
float lm_dot_row_f32(lm_dtype type, const void *row, const float *x, int64_t n) {
    if (!row || !x || n <= 0 || lm_dtype_row_bytes(type, n) == 0) return 0.0f;
    const uint8_t *r = row;
    float buf[256];
    float total = 0.0f;
    const block_ops *ops = find_block_ops(type);
    if (ops) {
        const lm_dtype_info *info = lm_dtype_get_info((int)type);
        for (int64_t b = 0; b < n / info->block_size; b++) {
            ops->dequant(r + b * (int64_t)info->block_bytes, buf);
            const float *xb = x + b * info->block_size;
            float sum = 0.0f;
            for (int64_t j = 0; j < info->block_size; j++) sum += buf[j] * xb[j];
            total += sum;
        }
        return total;
    }
    if (!is_plain(type)) return 0.0f;
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        float sum = 0.0f;
        for (int64_t i = i0; i < n && i < i0 + 256; i++) {
            float v;
            plain_to_f32(type, r, i, &v);
            sum += v * x[i];
        }
        total += sum;
    }
    return total;
}
