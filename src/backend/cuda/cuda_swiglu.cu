/* out[i] = silu(gate[i]) * up[i], rounded as the CPU reference's g / (1 + exp(-g)) * up */
#include "backend/cuda/cuda_internal.cuh"

__global__ void swiglu_kernel(const float *gate, const float *up, int64_t n, float *out) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
    }
}

extern "C" void lm_cuda_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_replaying(cu)) return;
    if (n <= 0) return;
    lm_cuda_launch(cu, swiglu_kernel, lm_cuda_blocks(n, 256), 256, gate, up, n, out);
    lm_cuda_launched(cu, "swiglu_kernel");
}
