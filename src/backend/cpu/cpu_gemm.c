/* f32 matrix-product micro-kernels for the prefill path: C[t][r] = sum_k X[t][k] W[r][k]
 * with both operands contiguous along k (weights decoded to f32 a tile at a time).
 *
 * A 4x4 block of (token, row) dot products is computed at once: each vector of W is
 * loaded once for 4 tokens and each vector of X once for 4 rows, so the loop does 16
 * fused multiply-adds per 8 loads. Compiled for AVX-512 and AVX2 and chosen at run
 * time; the plain C fallback computes the same sums. */
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#define DEFINE_DOT4X4(NAME, TARGET, WIDTH)                                                                     \
    __attribute__((target(TARGET))) static void NAME(const float *const w[4], const float *const x[4],         \
                                                     int64_t k, float out[4][4]) {                             \
        typedef float vec __attribute__((vector_size(WIDTH * 4)));                                            \
        vec acc[4][4];                                                                                         \
        memset(acc, 0, sizeof acc);                                                                            \
        int64_t i = 0;                                                                                         \
        for (; i + WIDTH <= k; i += WIDTH) {                                                                   \
            vec wv[4], xv[4];                                                                                  \
            for (int r = 0; r < 4; r++) memcpy(&wv[r], w[r] + i, sizeof(vec));                                 \
            for (int t = 0; t < 4; t++) memcpy(&xv[t], x[t] + i, sizeof(vec));                                 \
            for (int t = 0; t < 4; t++)                                                                        \
                for (int r = 0; r < 4; r++) acc[t][r] += wv[r] * xv[t];                                        \
        }                                                                                                      \
        for (int t = 0; t < 4; t++)                                                                            \
            for (int r = 0; r < 4; r++) {                                                                      \
                float s = 0.0f;                                                                                \
                for (int j = 0; j < WIDTH; j++) s += acc[t][r][j];                                             \
                for (int64_t e = i; e < k; e++) s += w[r][e] * x[t][e];                                        \
                out[t][r] = s;                                                                                 \
            }                                                                                                  \
    }

#if defined(__x86_64__)
DEFINE_DOT4X4(dot4x4_avx512, "avx512f", 16)
DEFINE_DOT4X4(dot4x4_avx2, "avx2,fma", 8)
#endif
DEFINE_DOT4X4(dot4x4_generic, "default", 4)

/* One dot product with WIDTH-lane partial sums, reduced lane by lane, then the tail. */
#define DEFINE_DOT(NAME, TARGET, WIDTH)                                                         \
    __attribute__((target(TARGET))) static float NAME(const float *a, const float *b, int64_t n) { \
        typedef float vec __attribute__((vector_size(WIDTH * 4)));                             \
        vec acc;                                                                                \
        memset(&acc, 0, sizeof acc);                                                            \
        int64_t i = 0;                                                                          \
        for (; i + WIDTH <= n; i += WIDTH) {                                                    \
            vec av, bv;                                                                         \
            memcpy(&av, a + i, sizeof av);                                                      \
            memcpy(&bv, b + i, sizeof bv);                                                      \
            acc += av * bv;                                                                     \
        }                                                                                       \
        float s = 0.0f;                                                                         \
        for (int j = 0; j < WIDTH; j++) s += acc[j];                                            \
        for (; i < n; i++) s += a[i] * b[i];                                                    \
        return s;                                                                               \
    }

#if defined(__x86_64__)
DEFINE_DOT(dot_avx512, "avx512f", 16)
DEFINE_DOT(dot_avx2, "avx2,fma", 8)
#endif
DEFINE_DOT(dot_generic, "default", 4)

typedef float (*dot_fn)(const float *, const float *, int64_t);

static dot_fn pick_dot(void) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return dot_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dot_avx2;
#endif
    return dot_generic;
}

float lm_cpu_dot_f32(const float *a, const float *b, int64_t n) {
    /* chosen once; threads racing here all store the same value */
    static _Atomic(dot_fn) chosen;
    dot_fn dot = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (!dot) atomic_store_explicit(&chosen, dot = pick_dot(), memory_order_relaxed);
    return dot(a, b, n);
}

typedef void (*dot4x4_fn)(const float *const w[4], const float *const x[4], int64_t k, float out[4][4]);

static dot4x4_fn pick_dot4x4(void) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return dot4x4_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dot4x4_avx2;
#endif
    return dot4x4_generic;
}

void lm_cpu_gemm_tile(const float *tile, int64_t n_rows, const float *x, int64_t n_tok, int64_t k, float *y,
                      int64_t y_stride, int64_t row0) {
    static _Atomic(dot4x4_fn) chosen; /* threads racing here all store the same value */
    dot4x4_fn dot4x4 = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (!dot4x4) atomic_store_explicit(&chosen, dot4x4 = pick_dot4x4(), memory_order_relaxed);
    /* Ragged edges repeat the last token / row in the unused slots instead of using
     * another kernel: every (token, row) result then comes from the same arithmetic,
     * whatever the batch size (batch invariance). */
    for (int64_t t = 0; t < n_tok; t += 4) {
        const float *xs[4];
        for (int a = 0; a < 4; a++) xs[a] = x + (t + a < n_tok ? t + a : n_tok - 1) * k;
        for (int64_t r = 0; r < n_rows; r += 4) {
            const float *ws[4];
            for (int b = 0; b < 4; b++) ws[b] = tile + (r + b < n_rows ? r + b : n_rows - 1) * k;
            float out[4][4];
            dot4x4(ws, xs, k, out);
            for (int a = 0; a < 4 && t + a < n_tok; a++)
                for (int b = 0; b < 4 && r + b < n_rows; b++) y[(t + a) * y_stride + row0 + r + b] = out[a][b];
        }
    }
}
