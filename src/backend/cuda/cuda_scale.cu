/* y[i] *= s */
#include "backend/cuda/cuda_internal.cuh"

__global__ void scale_kernel(float *y, float s, int64_t n) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fmul_rn(y[i], s);
}

extern "C" void lm_cuda_scale(lm_backend *b, float *y, float s, int64_t n) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_replaying(cu)) return;
    if (n <= 0) return;
    lm_cuda_launch(cu, scale_kernel, lm_cuda_blocks(n, 256), 256, y, s, n);
    lm_cuda_launched(cu, "scale_kernel");
}
