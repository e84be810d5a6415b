/* Scalar reference conversions for every tensor format: plain, obvious C that every
 * fast kernel (SIMD, CUDA) is tested against. Block layouts are those of GGUF. */
#ifndef LM_TENSOR_QUANT_H
#define LM_TENSOR_QUANT_H

#include "tensor/tensor.h"

/* IEEE half and bfloat16 <-> f32 (round to nearest even; NaN preserved). */
float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);
float lm_bf16_to_f32(uint16_t h);
uint16_t lm_f32_to_bf16(float f);

/* Converts `n` elements of a row of `type` to f32. n must be a multiple of the block
 * size (lm_dtype_row_bytes(type, n) != 0). Supports F32, F16, BF16, F64, the integer
 * types, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K. Returns false for a type it
 * cannot convert (LM_DTYPE_AFFINE: use lm_affine_dequantize_row). */
bool lm_dequantize_row(lm_dtype type, const void *src, float *dst, int64_t n);

/* Quantizes `n` f32 values into `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q8_1, Q2_K..Q8_K). A straightforward (not error-optimal) quantizer, used to write
 * test models and to quantize activations. Returns false for an unsupported type. */
bool lm_quantize_row(lm_dtype type, const float *src, void *dst, int64_t n);

/* sum_i dequant(row)[i] * x[i] over n elements, computed block by block without
 * materializing the dequantized row. Same types as lm_dequantize_row. */
float lm_dot_row_f32(lm_dtype type, const void *row, const float *x, int64_t n);

/* MLX affine: row `packed` holds n elements of `bits` bits (uint32 words, LSB first);
 * `scales`/`biases` hold n/group_size values of `scale_type` (F32, F16 or BF16). */
bool lm_affine_dequantize_row(int bits, int group_size, const uint32_t *packed,
                              const void *scales, const void *biases, lm_dtype scale_type,
                              float *dst, int64_t n);
float lm_affine_dot_row_f32(int bits, int group_size, const uint32_t *packed,
                            const void *scales, const void *biases, lm_dtype scale_type,
                            const float *x, int64_t n);

/* Quantizes n f32 values (n % group_size == 0) to MLX affine form: per group,
 * scale = (max - min) / (2^bits - 1), bias = min, q = round((w - bias) / scale). */
bool lm_affine_quantize_row(int bits, int group_size, const float *src, uint32_t *packed,
                            void *scales, void *biases, lm_dtype scale_type, int64_t n);

#endif
