/* The q8 matrix-vector kernels for AVX-512 VNNI on 256-bit vectors (vpdpbusd: the
 * byte dot product in one instruction), plus the tiled 512-bit kernels of
 * cpu_q8_tile.c. Same integer results as the AVX2 kernels. */
#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)
/* every function below is compiled for this instruction set */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
#endif
#include <immintrin.h>
#include <string.h>

static inline __m256i dot_u8_i8(__m256i u, __m256i a) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a); }

#define KSUFFIX vnni
#include "backend/cpu/cpu_q8_kernels.inc"

lm_q8a_kernels lm_q8a_kernels_for_vnni(lm_dtype type) {
    lm_q8a_kernels k = {K(lm_q8a_gemv_for)(type), NULL, NULL, NULL};
    if (k.gemv) lm_q8a_tile_kernels_avx512(type, &k.pack, &k.tile, &k.panel_bytes);
    return k;
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
lm_q8a_kernels lm_q8a_kernels_for_vnni(lm_dtype type) {
    (void)type;
    return (lm_q8a_kernels){0};
}
#endif
