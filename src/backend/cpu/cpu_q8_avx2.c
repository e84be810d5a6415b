/* The q8 kernels for AVX2 (maddubs + madd for the byte dot products). */
#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)
/* every function below is compiled for this instruction set */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <string.h>

static inline __m256i dot_u8_i8(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

#define KSUFFIX avx2
#include "backend/cpu/cpu_q8_kernels.inc"

lm_q8a_kernels lm_q8a_kernels_for_avx2(lm_dtype type) {
    return (lm_q8a_kernels){.gemv = K(lm_q8a_gemv_for)(type), .gemv_rows = 8};
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
lm_q8a_kernels lm_q8a_kernels_for_avx2(lm_dtype type) {
    (void)type;
    return (lm_q8a_kernels){0};
}
#endif
