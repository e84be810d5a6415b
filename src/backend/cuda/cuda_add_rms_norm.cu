/* y += x, then out = rms_norm(y) * w: the residual add and the norm after it in one
 * launch. Bit-identical to add_kernel then rms_norm_kernel: the same __fadd_rn per
 * element, the same row normalization (lm_cuda_norm_row, 256 threads). */
#include "backend/cuda/cuda_internal.cuh"

enum { ADD_NORM_THREADS = 256, ADD_NORM_WARPS = ADD_NORM_THREADS / 32 };

__global__ void __launch_bounds__(ADD_NORM_THREADS)
    add_rms_norm_kernel(float *y, const float *x, const float *__restrict__ w, int64_t d, float eps, float *out,
                        __nv_bfloat16 *outb) {
    lm_pdl_enter();
    __shared__ double part[ADD_NORM_WARPS];
    const int64_t r = (int64_t)blockIdx.x * d;
    lm_cuda_norm_row<ADD_NORM_THREADS>(y + r, x + r, w, d, eps, out + r, part, outb ? outb + r : NULL);
}

extern "C" void lm_cuda_add_rms_norm(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d,
                                     float eps, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n <= 0 || d <= 0 || lm_cuda_replaying(cu)) return;
    const int64_t max_rows = 2147483647LL;
    __nv_bfloat16 *outb = n <= max_rows ? lm_cuda_gemm_input(cu, out, n * d) : NULL; /* the next product's input */
    for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
        int64_t nn = n - r0 < max_rows ? n - r0 : max_rows;
        lm_cuda_launch(cu, add_rms_norm_kernel, (unsigned)nn, ADD_NORM_THREADS, y + r0 * d, x + r0 * d, w, d, eps,
                       out + r0 * d, outb);
        if (!lm_cuda_launched(cu, "add_rms_norm_kernel")) return;
    }
}
