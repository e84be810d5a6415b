/* Activation quantization, the scalar q8 kernels, and runtime kernel selection. */
#include "backend/cpu/cpu_q8.h"
#include "backend/cpu/cpu_features.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "tensor/quant.h"

static void finish_block(lm_q8a_block *o, float d_for_s) {
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) s0 += o->q[i], s1 += o->q[i + 16];
    o->sum16[0] = (int16_t)s0;
    o->sum16[1] = (int16_t)s1;
    o->s = lm_f16_to_f32(lm_f32_to_f16(d_for_s * (float)(s0 + s1)));
}

static void quantize_per32(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        lm_q8a_block *o = &out[b];
        for (int i = 0; i < 32; i++) o->q[i] = (int8_t)lrintf(xb[i] * id); /* |x * id| <= 127 */
        o->d = lm_f16_to_f32(lm_f32_to_f16(d));
        finish_block(o, d);
    }
}

static void quantize_per256(const float *x, lm_q8a_block *out, int64_t n) {
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const float *xs = x + sb * 256;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; i++)
            if (fabsf(xs[i]) > amax) amax = fabsf(xs[i]), max = xs[i];
        float iscale = amax != 0.0f ? -127.0f / max : 0.0f, d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int b = 0; b < 8; b++) {
            lm_q8a_block *o = &out[sb * 8 + b];
            for (int i = 0; i < 32; i++) {
                long q = lrintf(iscale * xs[b * 32 + i]);
                o->q[i] = (int8_t)(q > 127 ? 127 : q); /* -max maps to +127, max to -127 */
            }
            o->d = d;
            finish_block(o, d);
        }
    }
}

void lm_q8a_quantize_row(const float *x, lm_q8a_block *out, int64_t n, lm_q8a_style style) {
    if (style == LM_Q8A_PER256)
        quantize_per256(x, out, n);
    else
        quantize_per32(x, out, n);
}

lm_q8a_style lm_q8a_style_for(lm_dtype type) {
    switch (type) {
    case LM_DTYPE_Q2_K:
    case LM_DTYPE_Q3_K:
    case LM_DTYPE_Q4_K:
    case LM_DTYPE_Q5_K:
    case LM_DTYPE_Q6_K: return LM_Q8A_PER256;
    default: return LM_Q8A_PER32;
    }
}

/* Reference: dequantize the weights to f32 (lm_dequantize_row, 256 at a time) and
 * take the dot with d * q in double. Slow and obviously right. Formats with a min
 * (Q4_1, Q5_1) take the min's share from the rounded s, as their kernels do. */
static float dot_scalar(lm_dtype type, const uint8_t *w, const lm_q8a_block *a, int64_t n) {
    const lm_dtype_info *info = lm_dtype_get_info(type);
    int64_t bs = info->block_size;
    bool has_min = type == LM_DTYPE_Q4_1 || type == LM_DTYPE_Q5_1;
    float wf[256];
    double sum = 0.0;
    for (int64_t blk = 0; blk < n / bs; blk++) {
        const uint8_t *wb = w + blk * (int64_t)info->block_bytes;
        lm_dequantize_row(type, wb, wf, bs);
        for (int64_t i = 0; i < bs; i++) {
            const lm_q8a_block *ab = &a[(blk * bs + i) / 32];
            sum += (double)wf[i] * ab->d * ab->q[(blk * bs + i) % 32];
        }
        if (has_min) {
            const lm_q8a_block *ab = &a[blk];
            float m = lm_f16_to_f32((uint16_t)(wb[2] | (wb[3] << 8)));
            sum += (double)m * ((double)ab->s - (double)ab->d * (ab->sum16[0] + ab->sum16[1]));
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


lm_q8a_kernels lm_q8a_kernels_for(lm_dtype type) {
    /* LUMEN_REFERENCE_KERNELS=1 forces the f32 reference path (debugging aid) */
    const char *reference = getenv("LUMEN_REFERENCE_KERNELS");
    if (reference && atoi(reference) != 0) return (lm_q8a_kernels){NULL, NULL};
#if defined(__x86_64__)
    bool avx2 = lm_cpu_has_avx2();
    if (lm_cpu_has_avx512_vnni() &&
        !(getenv("LUMEN_CPU_NO_VNNI") && atoi(getenv("LUMEN_CPU_NO_VNNI"))))
        return lm_q8a_kernels_for_vnni(type);
    if (avx2) return lm_q8a_kernels_for_avx2(type);
#endif
    /* no SIMD kernel: the caller's f32 path (dequantize + dot) is faster than the
     * double-precision scalar reference */
    return (lm_q8a_kernels){NULL, NULL};
}
