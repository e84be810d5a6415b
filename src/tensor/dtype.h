/* Element and block formats of tensors.
 *
 * The numeric values of the GGML-derived types equal their GGUF type ids, so a GGUF
 * tensor's type field maps onto lm_dtype without a table. Types that GGUF lacks
 * (unsigned integers of safetensors, MLX affine quantization) live from 1000 up. */
#ifndef LM_TENSOR_DTYPE_H
#define LM_TENSOR_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum lm_dtype {
    LM_DTYPE_F32 = 0,
    LM_DTYPE_F16 = 1,
    LM_DTYPE_Q4_0 = 2,
    LM_DTYPE_Q4_1 = 3,
    LM_DTYPE_Q5_0 = 6,
    LM_DTYPE_Q5_1 = 7,
    LM_DTYPE_Q8_0 = 8,
    LM_DTYPE_Q8_1 = 9,
    LM_DTYPE_Q2_K = 10,
    LM_DTYPE_Q3_K = 11,
    LM_DTYPE_Q4_K = 12,
    LM_DTYPE_Q5_K = 13,
    LM_DTYPE_Q6_K = 14,
    LM_DTYPE_Q8_K = 15,
    LM_DTYPE_I8 = 24,
    LM_DTYPE_I16 = 25,
    LM_DTYPE_I32 = 26,
    LM_DTYPE_I64 = 27,
    LM_DTYPE_F64 = 28,
    LM_DTYPE_BF16 = 30,
    /* not in GGUF */
    LM_DTYPE_U8 = 1000,
    LM_DTYPE_U16 = 1001,
    LM_DTYPE_U32 = 1002,
    LM_DTYPE_U64 = 1003,
    LM_DTYPE_BOOL = 1004,
    /* MLX affine quantization: each row of ne[0] logical elements is packed into
     * uint32 words (LSB first, ne[0]*bits/32 words per row); every group of
     * `group_size` consecutive elements has a scale and a bias (tensors `scales`,
     * `biases` of the lm_tensor) and dequantizes as w = scale * q + bias. */
    LM_DTYPE_AFFINE = 1010,
} lm_dtype;

typedef struct lm_dtype_info {
    const char *name;       /* "Q4_K", "BF16", ... as in GGUF and safetensors */
    int64_t block_size;     /* elements per block (1 for plain types)         */
    size_t block_bytes;     /* bytes per block                                */
    bool quantized;         /* block-quantized (needs dequantization)         */
} lm_dtype_info;

/* Traits of `type`, or NULL for a value that is not a known lm_dtype. For
 * LM_DTYPE_AFFINE the traits describe one packed uint32 word of 4-bit data; use
 * lm_affine_row_bytes() for its real sizes. */
const lm_dtype_info *lm_dtype_get_info(int type);

/* "Q4_K"; "unknown" for an unknown value. */
const char *lm_dtype_name(int type);

/* Parses a name as written in GGUF tools and safetensors headers ("F16", "BF16",
 * "Q4_K", "U32", ...). Returns false if unknown. */
bool lm_dtype_from_name(const char *name, lm_dtype *out);

/* Bytes of a row of `n` elements; 0 if n is not a multiple of the block size or the
 * type is unknown (callers treat 0 as a format error). */
size_t lm_dtype_row_bytes(lm_dtype type, int64_t n);

/* Bytes of one packed row of an MLX affine tensor: n * bits / 8 (n a multiple of
 * 32 / bits); 0 if bits is not in {2, 3, 4, 6, 8} or n does not pack evenly. */
size_t lm_affine_row_bytes(int bits, int64_t n);

#endif
