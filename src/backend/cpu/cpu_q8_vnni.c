/* The q8 kernels for AVX-512 VNNI: the 512-bit ones of cpu_q8_avx512.c where it has
 * them, else the 8-row matrix-vector kernels on 256-bit vectors (vpdpbusd: the byte
 * dot product in one instruction). Same results as the AVX2 kernels, bit for bit. */
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
    lm_q8a_kernels k = lm_q8a_kernels_avx512(type);
    if (!k.gemv) k.gemv = K(lm_q8a_gemv_for)(type), k.gemv_rows = 8;
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
