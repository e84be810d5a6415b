/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, a warp per row. The sum of squares is
 * accumulated in double as the CPU reference does (each square of a float is exact
 * in double), and the scaling rounds like the reference's (x * inv) * w, so rows
 * match it to within the last bit of the sum. Rows are independent: batch-invariant. */
#include "backend/cuda/cuda_internal.cuh"

enum { NORM_THREADS = 256 };

__global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(const float *x, const float *__restrict__ w, int64_t n, int64_t d, float eps, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * (NORM_THREADS / 32) + (threadIdx.x >> 5);
    if (r >= n) return;
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double sum = 0.0;
    for (int64_t j = lane; j < d; j += 32) sum += (double)xr[j] * (double)xr[j];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = (float)(1.0 / sqrt(sum / (double)d + (double)eps));
    for (int64_t j = lane; j < d; j += 32) {
        float v = __fmul_rn(xr[j], inv);
        yr[j] = w ? __fmul_rn(v, w[j]) : v;
    }
}

extern "C" void lm_cuda_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps,
                                 float *y) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n <= 0 || d <= 0) return;
    const int rows_per_block = NORM_THREADS / 32;
    const int64_t max_rows = 2147483647LL * rows_per_block;
    for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
        int64_t nn = n - r0 < max_rows ? n - r0 : max_rows;
        rms_norm_kernel<<<(unsigned)((nn + rows_per_block - 1) / rows_per_block), NORM_THREADS, 0, cu->stream>>>(
            x + r0 * d, w, nn, d, eps, y + r0 * d);
        if (!lm_cuda_launched(cu, "rms_norm_kernel")) return;
    }
}
