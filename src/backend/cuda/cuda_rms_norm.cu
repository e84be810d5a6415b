/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, and its fused form with the residual add
 * before it (add_rms_norm): one kernel, lm_cuda_norm_row with or without the add. The
 * sum of squares is accumulated in double as the CPU reference does (each square of a
 * float is exact in double), and the scaling rounds like the reference's (x * inv) * w,
 * so rows match it to within the last bit of the sum. Rows are independent:
 * batch-invariant. */
#include "backend/cuda/cuda_internal.cuh"

enum { NORM_THREADS = 256, NORM_WARPS = NORM_THREADS / 32 };

/* A block per row: a warp per row left each lane a long chain of dependent loads
 * (10 us for one 1536-wide row); a block spreads the row over 256 threads. y is
 * written only when add is given. */
__global__ void __launch_bounds__(NORM_THREADS)
    norm_rows_kernel(float *y, const float *add, const float *__restrict__ w, int64_t d, float eps, float *out,
                     __nv_bfloat16 *outb) {
    /* the weights' trip before the wait, off the chain: they miss in L2 (a step
     * streams the whole model past it), and in a Q4_K_M file's step their misses
     * queued behind the 8-bit products' early weight requests (the norm added 2.6 us
     * to a step against 1.75 in bf16). H200, 1.5B-shaped, batch 1, one call, three
     * runs each: Q4_K_M 1,060-1,075 -> 1,084-1,094 tokens/s, bf16 812-818 -> 820-826 */
    float wv[LM_CUDA_NORM_CACHE];
    lm_cuda_norm_weights<NORM_THREADS>(w, d, wv);
    /* The next kernel let in after the wait, not before: letting the product after the
     * norm in first (its blocks then arrive under the kernel before the norm) measured
     * slower, H100, 1.5B-shaped, batch 1, one call, two runs each (thirty-first
     * session, branch norm-lif): Q4_K_M 1,096-1,101 -> 1,011-1,012 tokens/s (the 8-bit
     * products' weight requests before their wait then come in under the down
     * product), bf16 691-692 -> 681-682. */
    lm_pdl_enter();
    __shared__ double part[NORM_WARPS];
    const int64_t r = (int64_t)blockIdx.x * d;
    lm_cuda_norm_row<NORM_THREADS>(y + r, add ? add + r : NULL, w, d, eps, out + r, part, outb ? outb + r : NULL,
                                   wv);
}

/* The precise mode's form (lm_cuda_norm_row's PRECISE): add may be the hi half of a
 * product whose lo half is add_lo, written summed to add_dst; the output handed off
 * as hi (outb) and lo (outl). A kernel of its own, so the default's stays as it was. */
__global__ void __launch_bounds__(NORM_THREADS)
    norm_rows_precise_kernel(float *y, const float *add, const float *add_lo, float *add_dst,
                             const float *__restrict__ w, int64_t d, float eps, float *out, __nv_bfloat16 *outb,
                             __nv_bfloat16 *outl) {
    float wv[LM_CUDA_NORM_CACHE];
    lm_cuda_norm_weights<NORM_THREADS>(w, d, wv);
    lm_pdl_enter();
    __shared__ double part[NORM_WARPS];
    const int64_t r = (int64_t)blockIdx.x * d;
    lm_cuda_norm_row<NORM_THREADS, true>(y + r, add ? add + r : NULL, w, d, eps, out + r, part,
                                         outb ? outb + r : NULL, wv, add_lo ? add_lo + r : NULL,
                                         add_dst ? add_dst + r : NULL, outl ? outl + r : NULL);
}

/* A one-row norm (a decode step's, one sequence) is launched with this much dynamic
 * shared memory, which it does not use: its block then needs an SM reconfigured for
 * it (one no other kernel's block was on), and of the products' blocks after it only
 * those needing under ~5 KB of shared memory fit beside it. H100, 1.5B-shaped, batch
 * 1, three calls on one machine (thirty-sixth session, branch x-alone,
 * LUMEN_X_NORM_PAD=222): bf16 714.3 -> 719.3, 714.8 -> 719.9 tokens/s (medians of
 * three rounds), Q4_K_M 1,201.6 -> 1,203.2, 1,201.7 -> 1,202.6. Why bf16 gains is not
 * established (the blocks it keeps off its SM, or the SM it waits for). The decode
 * attention padded the same way (LUMEN_X_ATTN_PAD=222, so no output product's block
 * shares its SMs): Q4_K_M 1,188.6 -> 1,198.8 but bf16 713.2 -> 708.8; not kept (nor
 * after 8-bit products only: cuda_attention_dec.cu, dec_allow). This norm unpadded
 * (LUMEN_CUDA_NORM_ALONE=0), thirty-seventh session, one H100 call, medians of three:
 * bf16 707.3 -> 702.5. The attribute is the function's, process-wide, so it is only
 * ever raised here: every backend asks for the same size. */
enum { NORM_ALONE_SMEM = 222 * 1024 };

/* NORM_ALONE_SMEM where the device lets a block ask for it (the attribute is refused
 * past the device's opt-in limit less the kernel's static shared memory), else 0;
 * asked once a backend */
static size_t norm_alone_smem(lm_cuda_backend *cu) {
    if (!cu->norm_alone) {
        const bool ok = cudaFuncSetAttribute(norm_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             NORM_ALONE_SMEM) == cudaSuccess;
        if (!ok) cudaGetLastError(); /* an optimization refused, not an error */
        cu->norm_alone = ok ? 1 : -1;
    }
    return cu->norm_alone > 0 ? NORM_ALONE_SMEM : 0;
}

/* y += add (add not NULL), then out = rms_norm(y) * w, n rows of d; out also in bf16
 * for the product after it (lm_cuda_gemm_input). In the precise mode add may still be
 * a product's two halves (lm_cuda_sum_take), summed here, and the hand-off has its lo
 * part (lm_cuda_gemm_input_split). */
static void norm_rows(lm_backend *b, float *y, const float *add, const float *w, int64_t n, int64_t d, float eps,
                      float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    /* before entering, which would sum them (add is y: the halves summed first) */
    const float *add_lo = NULL, *add_hi = add && add != y ? lm_cuda_sum_take(cu, add, n * d, &add_lo) : NULL;
    lm_cuda_enter(cu);
    if (n <= 0 || d <= 0 || lm_cuda_replaying(cu)) return;
    __nv_bfloat16 *outl = NULL, *outb = lm_cuda_gemm_input_split(cu, out, n, d, &outl);
    float *add_dst = add_hi ? const_cast<float *>(add) : NULL; /* the product's output, written here */
    if (add_hi) add = add_hi;
    const int64_t max_rows = 2147483647LL; /* the grid's x */
    for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
        const int64_t nn = n - r0 < max_rows ? n - r0 : max_rows, off = r0 * d;
        if (cu->precise)
            lm_cuda_launch(cu, norm_rows_precise_kernel, (unsigned)nn, NORM_THREADS, y + off, add ? add + off : NULL,
                           add_lo ? add_lo + off : NULL, add_dst ? add_dst + off : NULL, w, d, eps, out + off,
                           outb ? outb + off : NULL, outl ? outl + off : NULL);
        else
            lm_cuda_launch_smem(cu, norm_rows_kernel, (unsigned)nn, NORM_THREADS, nn == 1 ? norm_alone_smem(cu) : 0,
                                y + off, add ? add + off : NULL, w, d, eps, out + off, outb ? outb + off : NULL);
        if (!lm_cuda_launched(cu, "norm_rows_kernel")) return;
    }
}

extern "C" void lm_cuda_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps,
                                 float *y) {
    /* without an add the rows are only read: the cast does not lead to a write */
    norm_rows(b, const_cast<float *>(x), NULL, w, n, d, eps, y);
}

/* y += x, then out = rms_norm(y) * w: the residual add and the norm after it in one
 * launch, bit-identical to add then rms_norm (the same __fadd_rn per element, the
 * same row normalization). */
extern "C" void lm_cuda_add_rms_norm(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d,
                                     float eps, float *out) {
    norm_rows(b, y, x, w, n, d, eps, out);
}
