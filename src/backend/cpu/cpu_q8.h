/* Activations quantized to 8 bits for integer dot products with quantized weights
 * (the decode path: one activation row against every weight row).
 *
 * A row of n floats becomes n/32 blocks; block b holds q[i] = round(x[i] / d) with
 * d = max|x| / 127 over its 32 values, and the sums of q over each half (what the
 * zero points of Q4_0/Q5_0/Q6_K and the mins of Q4_1/Q4_K need). */
#ifndef LM_BACKEND_CPU_Q8_H
#define LM_BACKEND_CPU_Q8_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/dtype.h"

typedef struct lm_q8a_block {
    float d;           /* scale: x ~= d * q                 */
    int16_t sum16[2];  /* sum of q[0..15] and of q[16..31]  */
    int8_t q[32];
} lm_q8a_block;

/* Quantizes x[n] (n % 32 == 0) into n / 32 blocks. */
void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n);

/* sum_i w[i] * x[i] for one weight row of `type` and its activation row quantized
 * as above, n elements. */
typedef float (*lm_q8a_dot_fn)(const uint8_t *w, const lm_q8a_block *a, int64_t n);

/* The fastest kernel this CPU runs for `type`, or NULL when the type has none (the
 * caller then dequantizes to f32). */
lm_q8a_dot_fn lm_q8a_dot_for(lm_dtype type);

/* The portable scalar kernel of the same arithmetic (the reference the SIMD kernels
 * are tested against); NULL for types without a kernel. */
lm_q8a_dot_fn lm_q8a_dot_scalar_for(lm_dtype type);

#endif
