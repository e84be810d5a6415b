/* What the CPU running us can do, for choosing kernels at run time. */
#ifndef LM_BACKEND_CPU_FEATURES_H
#define LM_BACKEND_CPU_FEATURES_H

#include <stdbool.h>

#if defined(__x86_64__)
#include <cpuid.h>

/* AVX2 + FMA + F16C: what the 256-bit kernels use. (F16C is read from CPUID: not
 * every compiler's __builtin_cpu_supports knows its name.) */
static inline bool lm_cpu_has_avx2(void) {
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* AVX-512 VNNI (vpdpbusd, on 512-bit vectors and with VL on 256-bit ones) with the BW
 * and DQ subsets the 512-bit kernels also use, on top of the above. */
static inline bool lm_cpu_has_avx512_vnni(void) {
    return lm_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}
#else
static inline bool lm_cpu_has_avx2(void) { return false; }
static inline bool lm_cpu_has_avx512_vnni(void) { return false; }
#endif

#endif
