/* y[r][j] += bias[j]; y [n][d] */
#include "backend/cuda/cuda_internal.cuh"

__global__ void add_bias_kernel(float *y, const float *__restrict__ bias, int64_t total, int64_t d) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], bias[i % d]);
}

extern "C" void lm_cuda_add_bias(lm_backend *b, float *y, const float *bias, int64_t n, int64_t d) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_replaying(cu)) return;
    if (n <= 0 || d <= 0) return;
    lm_cuda_launch(cu, add_bias_kernel, lm_cuda_blocks(n * d, 256), 256, y, bias, n * d, d);
    lm_cuda_launched(cu, "add_bias_kernel");
}
