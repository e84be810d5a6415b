/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w. The sum of squares is
 * accumulated in double as the CPU reference does (each square of a float is exact
 * in double), and the scaling rounds like the reference's (x * inv) * w, so rows
 * match it to within the last bit of the sum. Rows are independent: batch-invariant. */
#include "backend/cuda/cuda_internal.cuh"

enum { NORM_THREADS = 256, NORM_WARPS = NORM_THREADS / 32 };

/* A block per row: a warp per row left each lane a long chain of dependent loads
 * (10 us for one 1536-wide row); a block spreads the row over 256 threads. */
__global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_kernel(const float *x, const float *__restrict__ w, int64_t d, float eps, float *y, __nv_bfloat16 *yb) {
    lm_pdl_enter();
    __shared__ double part[NORM_WARPS];
    const int64_t r = (int64_t)blockIdx.x * d;
    /* without an add the row is only read: the cast does not lead to a write */
    lm_cuda_norm_row<NORM_THREADS>(const_cast<float *>(x) + r, NULL, w, d, eps, y + r, part, yb ? yb + r : NULL);
}

extern "C" void lm_cuda_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps,
                                 float *y) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n <= 0 || d <= 0 || lm_cuda_replaying(cu)) return;
    const int64_t max_rows = 2147483647LL;
    __nv_bfloat16 *yb = n <= max_rows ? lm_cuda_gemm_input(cu, y, n * d) : NULL; /* the next product's input */
    for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
        int64_t nn = n - r0 < max_rows ? n - r0 : max_rows;
        lm_cuda_launch(cu, rms_norm_kernel, (unsigned)nn, NORM_THREADS, x + r0 * d, w, d, eps, y + r0 * d, yb);
        if (!lm_cuda_launched(cu, "rms_norm_kernel")) return;
    }
}
