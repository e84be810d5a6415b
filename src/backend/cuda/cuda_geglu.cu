/* out[i] = gelu_tanh(gate[i]) * up[i] with the CPU reference's f16 quirk: inside
 * (-10, 10) the input is rounded to f16 and the activation is rounded to f16 (the
 * reference looks it up in an f16 table, as llama.cpp does); outside, 0 or g. */
#include "backend/cuda/cuda_internal.cuh"

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    /* 0.5f * x * (1 + tanh(k * x * (1 + 0.044715 * x * x))), left to right */
    float inner = __fmul_rn(__fmul_rn(k, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, x), x)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

__global__ void geglu_kernel(const float *gate, const float *up, int64_t n, float *out) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i], a;
        if (g <= -10.0f)
            a = 0.0f;
        else if (g >= 10.0f)
            a = g;
        else
            a = __half2float(__float2half_rn(gelu_tanh(__half2float(__float2half_rn(g)))));
        out[i] = __fmul_rn(a, up[i]);
    }
}

extern "C" void lm_cuda_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_replaying(cu)) return;
    if (n <= 0) return;
    lm_cuda_launch(cu, geglu_kernel, lm_cuda_blocks(n, 256), 256, gate, up, n, out);
    lm_cuda_launched(cu, "geglu_kernel");
}
