/* Activations quantized to 8 bits for integer products with quantized weights.
 *
 * A row of n floats becomes n/32 blocks of 32 codes q with a scale d (x ~= d * q) and
 * the sums of q over each half (what the zero points of Q4_0/Q5_0/Q6_K and the mins of
 * Q4_1/Q4_K need). How d is chosen follows the reference engine (llama.cpp), so that
 * our logits match its logits closely, not merely the exact f32 product:
 *  - PER32 (for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights): d = max|x| / 127 per 32 values,
 *    stored rounded to f16; codes round(x * 127 / max|x|) to nearest even; and
 *    s = d * sum(q), also rounded to f16, for the formats with a min;
 *  - PER256 (for K-quant weights): one scale per 256 values, d = max / -127 with max
 *    the signed value of largest magnitude, codes min(127, round(x / d)).
 *
 * The products (one arithmetic, several kernels). For a weight row and a token, the
 * row is cut into units — its 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or
 * 256-element super-blocks (Q4_K, Q5_K, Q6_K) — and, with c the weight codes as
 * unsigned integers and q the activation codes, in unit order from acc = 0:
 *   Q4_0/Q5_0/Q8_0  I = sum c*q - off * sum q        (off 8 / 16 / 0, Q8_0 c signed)
 *                   acc = fma((float)I, dw * da, acc)
 *   Q4_1/Q5_1       I = sum c*q;  acc = fma((float)I, dw * da, acc);  acc = fma(mw, sa, acc)
 *   Q4_K/Q5_K       S = sum_j sc_j sum_{sub j} c*q,  M = sum_j m_j sum_{sub j} q
 *                   acc = fma((float)S, d * da, acc);  acc = fma(-(float)M, dmin * da, acc)
 *   Q6_K            S = sum_i sc_i sum_{sub i} (c - 32) * q
 *                   acc = fma((float)S, d * da, acc)
 * (dw, mw, d, dmin the weight's f16 scales as f32; da, sa the activation block's d and
 * s; products of two scales rounded to f32 before the fma.) The integer sums are exact
 * (int32 cannot overflow for these code ranges), so every kernel may form them in any
 * order; the float steps are the same operations in the same order in every kernel.
 * Hence a token's result never depends on which kernel computed it, how many tokens
 * or rows it was computed with, or the instruction set: batch invariance (DESIGN.md
 * invariant 2), tested bit for bit in tests/unit/test_cpu_kernels.c. */
#ifndef LM_BACKEND_CPU_Q8_H
#define LM_BACKEND_CPU_Q8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

typedef struct lm_q8a_block {
    float d;           /* scale: x ~= d * q                           */
    float s;           /* d * sum(q) as the reference rounds it (PER32) */
    int16_t sum16[2];  /* sum of q[0..15] and of q[16..31]            */
    int8_t q[32];
} lm_q8a_block;

typedef enum lm_q8a_style { LM_Q8A_PER32, LM_Q8A_PER256 } lm_q8a_style;

/* Quantizes x[n] into n / 32 blocks (n % 32 == 0, and n % 256 == 0 for PER256);
 * vectorized where the CPU allows. _ref: the portable code, equal bit for bit. */
void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style);
void lm_q8a_quantize_row_ref(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style);

/* The activation style the kernels of `type` expect. */
lm_q8a_style lm_q8a_style_for(lm_dtype type);

/* Matrix-vector kernel (decode): y[t * y_stride + r] = row r . token t for r < nr
 * (nr <= the kernel's gemv_rows; row r at w + r * row_bytes) and t < n_tok (any
 * count: tokens are taken a few at a time, each row unit decoded once per group),
 * n elements per row; token t's blocks at a + t * a_stride. */
typedef void (*lm_q8a_gemv_fn)(const uint8_t *w, size_t row_bytes, int nr, const lm_q8a_block *a,
                               int64_t a_stride, int64_t n_tok, int64_t n, float *y, int64_t y_stride);

/* Tiled matrix-matrix kernel (prefill), in two steps: `pack` decodes LM_Q8A_PANEL_ROWS
 * rows (nr valid, the rest repeat the last) into a panel of unsigned codes interleaved
 * for the kernel (`panel_bytes(n)` bytes, 64-byte aligned), once per call; `tile` then
 * multiplies the panel with every token, y as for gemv. */
enum { LM_Q8A_PANEL_ROWS = 32 };
typedef void (*lm_q8a_pack_fn)(const uint8_t *w, size_t row_bytes, int nr, int64_t n, uint8_t *panel);
typedef void (*lm_q8a_tile_fn)(const uint8_t *panel, int nr, const lm_q8a_block *a, int64_t a_stride, int64_t n_tok,
                               int64_t n, float *y, int64_t y_stride);
typedef size_t (*lm_q8a_panel_bytes_fn)(int64_t n);

typedef struct lm_q8a_kernels {
    lm_q8a_gemv_fn gemv;               /* NULL: the type has no integer kernel here */
    int gemv_rows;                     /* rows per gemv call (8 or 16) */
    lm_q8a_pack_fn pack;               /* NULL: no tiled kernel (gemv for every batch) */
    lm_q8a_tile_fn tile;
    lm_q8a_panel_bytes_fn panel_bytes;
} lm_q8a_kernels;

/* The fastest kernels this CPU runs for `type` (all NULL when the type has none: the
 * caller then dequantizes to f32). LUMEN_REFERENCE_KERNELS=1 forces that f32 path;
 * LUMEN_CPU_NO_VNNI=1 the AVX2 kernels; LUMEN_CPU_NO_TILE=1 gemv for every batch. */
lm_q8a_kernels lm_q8a_kernels_for(lm_dtype type);

/* The kernels of one instruction set (NULL where the type has none or the build
 * targets another architecture); callers must check the CPU supports it. */
lm_q8a_kernels lm_q8a_kernels_for_avx2(lm_dtype type);
lm_q8a_kernels lm_q8a_kernels_for_vnni(lm_dtype type);

/* The kernels on 512-bit vectors with AVX-512 VNNI (cpu_q8_avx512.c) for
 * lm_q8a_kernels_for_vnni: 16-row matrix-vector and tiled; all NULL for types
 * without them. */
lm_q8a_kernels lm_q8a_kernels_avx512(lm_dtype type);

/* The arithmetic above in portable C, one row and one token: what every kernel must
 * equal bit for bit. NULL for types without a kernel. */
typedef float (*lm_q8a_dot_fn)(const uint8_t *w, const lm_q8a_block *a, int64_t n);
lm_q8a_dot_fn lm_q8a_dot_exact_for(lm_dtype type);

/* Reference: the weights dequantized to f32, the dot with d * q taken in double (the
 * min's share of Q4_1/Q5_1 from the rounded s). Slow, obviously right, and not bit
 * equal to the kernels: tests hold them to a tolerance. */
lm_q8a_dot_fn lm_q8a_dot_scalar_for(lm_dtype type);

#endif
