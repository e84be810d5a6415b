/* Activations quantized to 8 bits for integer dot products with quantized weights.
 *
 * A row of n floats becomes n/32 blocks of 32 codes q with a scale d (x ~= d * q) and
 * the sums of q over each half (what the zero points of Q4_0/Q5_0/Q6_K and the mins of
 * Q4_1/Q4_K need). How d is chosen follows the reference engine (llama.cpp), so that
 * our logits match its logits closely, not merely the exact f32 product:
 *  - PER32 (for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights): d = max|x| / 127 per 32 values,
 *    stored rounded to f16; codes round(x * 127 / max|x|) to nearest even; and
 *    s = d * sum(q), also rounded to f16, for the formats with a min;
 *  - PER256 (for K-quant weights): one scale per 256 values, d = max / -127 with max
 *    the signed value of largest magnitude, codes min(127, round(x / d)). */
#ifndef LM_BACKEND_CPU_Q8_H
#define LM_BACKEND_CPU_Q8_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/dtype.h"

typedef struct lm_q8a_block {
    float d;           /* scale: x ~= d * q                           */
    float s;           /* d * sum(q) as the reference rounds it (PER32) */
    int16_t sum16[2];  /* sum of q[0..15] and of q[16..31]            */
    int8_t q[32];
} lm_q8a_block;

typedef enum lm_q8a_style { LM_Q8A_PER32, LM_Q8A_PER256 } lm_q8a_style;

/* Quantizes x[n] into n / 32 blocks (n % 32 == 0, and n % 256 == 0 for PER256). */
void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style);

/* The activation style the kernels of `type` expect. */
lm_q8a_style lm_q8a_style_for(lm_dtype type);

/* sum_i w[i] * x[i] for one weight row of `type` and its activation row quantized
 * as above, n elements. */
typedef float (*lm_q8a_dot_fn)(const uint8_t *w, const lm_q8a_block *a, int64_t n);

/* The same for 4 activation rows at once (a, a + stride, a + 2 * stride, ...; stride
 * in blocks) against one weight row, decoding the weights once. out[t] equals
 * dot(w, a + t * stride, n) bit for bit: a token's result never depends on which
 * kernel, or which batch, computed it. */
typedef void (*lm_q8a_dot4_fn)(const uint8_t *w, const lm_q8a_block *a, int64_t stride, int64_t n, float out[4]);

typedef struct lm_q8a_kernels {
    lm_q8a_dot_fn dot;
    lm_q8a_dot4_fn dot4;
} lm_q8a_kernels;

/* The fastest kernels this CPU runs for `type`; {NULL, NULL} when the type has none
 * (the caller then dequantizes to f32). */
lm_q8a_kernels lm_q8a_kernels_for(lm_dtype type);

/* The kernels of one instruction set (NULL where the type has none or the build
 * targets another architecture); callers must check the CPU supports it. */
lm_q8a_kernels lm_q8a_kernels_for_avx2(lm_dtype type);
lm_q8a_kernels lm_q8a_kernels_for_vnni(lm_dtype type);

/* The portable scalar kernel of the same arithmetic (the reference the SIMD kernels
 * are tested against); NULL for types without a kernel. */
lm_q8a_dot_fn lm_q8a_dot_scalar_for(lm_dtype type);

#endif
