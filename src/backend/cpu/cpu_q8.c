/* Activation quantization, the scalar q8 kernels, and runtime kernel selection. */
#include "backend/cpu/cpu_q8.h"

#include <math.h>

#include "tensor/quant.h"

void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        lm_q8a_block *o = &out[b];
        o->d = d;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; i++) {
            int q = (int)lrintf(xb[i] * inv);
            o->q[i] = (int8_t)q;
            if (i < 16)
                s0 += q;
            else
                s1 += q;
        }
        o->sum16[0] = (int16_t)s0;
        o->sum16[1] = (int16_t)s1;
    }
}

/* Reference: dequantize the weights to f32 (lm_dequantize_row, 256 at a time) and
 * take the dot with d * q in double. Slow and obviously right. */
static float dot_scalar(lm_dtype type, const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    const lm_dtype_info *info = lm_dtype_get_info(type);
    int64_t bs = info->block_size;
    float wf[256];
    double sum = 0.0;
    for (int64_t blk = 0; blk < n / bs; blk++) {
        lm_dequantize_row(type, w + blk * (int64_t)info->block_bytes, wf, bs);
        for (int64_t i = 0; i < bs; i++) {
            const lm_q8a_block *ab = &a[(blk * bs + i) / 32];
            sum += (double)wf[i] * ab->d * ab->q[(blk * bs + i) % 32];
        }
    }
    return (float)sum;
}

#define SCALAR_KERNEL(name, TYPE) \
    static float name(const uint8_t *w, const lm_q8a_block *a, int64_t n) { return dot_scalar(TYPE, w, a, n); }
SCALAR_KERNEL(dot_q4_0_scalar, LM_DTYPE_Q4_0)
SCALAR_KERNEL(dot_q4_1_scalar, LM_DTYPE_Q4_1)
SCALAR_KERNEL(dot_q5_0_scalar, LM_DTYPE_Q5_0)
SCALAR_KERNEL(dot_q5_1_scalar, LM_DTYPE_Q5_1)
SCALAR_KERNEL(dot_q8_0_scalar, LM_DTYPE_Q8_0)
SCALAR_KERNEL(dot_q4_k_scalar, LM_DTYPE_Q4_K)
SCALAR_KERNEL(dot_q5_k_scalar, LM_DTYPE_Q5_K)
SCALAR_KERNEL(dot_q6_k_scalar, LM_DTYPE_Q6_K)
#undef SCALAR_KERNEL

lm_q8a_dot_fn lm_q8a_dot_scalar_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q4_0: return dot_q4_0_scalar;
    case LM_DTYPE_Q4_1: return dot_q4_1_scalar;
    case LM_DTYPE_Q5_0: return dot_q5_0_scalar;
    case LM_DTYPE_Q5_1: return dot_q5_1_scalar;
    case LM_DTYPE_Q8_0: return dot_q8_0_scalar;
    case LM_DTYPE_Q4_K: return dot_q4_k_scalar;
    case LM_DTYPE_Q5_K: return dot_q5_k_scalar;
    case LM_DTYPE_Q6_K: return dot_q6_k_scalar;
    default: return NULL;
    }
}

/* cpu_q8_avx2.c */
lm_q8a_dot_fn lm_q8a_dot_avx2_for(lm_dtype type);

lm_q8a_dot_fn lm_q8a_dot_for(lm_dtype type) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        lm_q8a_dot_fn fn = lm_q8a_dot_avx2_for(type);
        if (fn) return fn;
    }
#endif
    /* no SIMD kernel: the caller's f32 path (dequantize + dot) is faster than the
     * double-precision scalar reference */
    return NULL;
}
