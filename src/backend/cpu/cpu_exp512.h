/* e^x on 16 floats, shared by the AVX-512 attention and element-wise kernels. */
#ifndef LM_BACKEND_CPU_EXP512_H
#define LM_BACKEND_CPU_EXP512_H

#if defined(__x86_64__)
#include <immintrin.h>

/* x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r (the classic Cephes
 * expf coefficients), scaled by 2^n; 0 below -87 (and for -inf), inf above 89. */
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) static inline __m512
lm_exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    y = _mm512_scalef_ps(y, n);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ), y);
}
#endif

#endif
