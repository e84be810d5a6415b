/* y[t][r] = sum_k W[r][k] * x[t][k] over weights in any device format.
 *
 * Two paths, chosen by the token count n against a fixed threshold (mv_max_n, 16
 * unless LUMEN_CUDA_MV_MAX_N says otherwise):
 *
 *  - matrix-vector (n <= mv_max_n: decode): a row per warp (or per 2-4 warps when the
 *    row is long), the weight decoded on the fly eight elements per lane (deq8), f32
 *    fused multiply-adds against up to 8 tokens at once while the decoded weights sit
 *    in registers. Exact f32 arithmetic on the exactly decoded weights. A token's
 *    result never depends on the other tokens: each has its own accumulator and the
 *    same summation order (lane partials in k order, a fixed butterfly, then the
 *    row's warps in index order), whatever the group it is computed in.
 *
 *  - GEMM (n > mv_max_n: prefill, large batches): weight rows decoded to bf16 a tile
 *    at a time (F32 weights: cublasSgemm on the weights in place; BF16: used in
 *    place), activations rounded to bf16, cuBLAS with f32 accumulation. Tokens go
 *    through GEMMs of exactly GEMM_CHUNK columns (the last one zero-padded) into a
 *    scratch buffer, so every token sees the same GEMM shape, the same algorithm and
 *    the same pointer alignments whatever the batch: batch-invariant within the path.
 *
 * The two paths round differently (bf16 activations vs f32), so a token computed in a
 * decode step and the same token inside a large batch agree to about 1e-3, not to the
 * bit. LUMEN_CUDA_MV_MAX_N=1000000000 makes every product take the exact path (bit
 * batch-invariant, slower prefill). */
#include "backend/cuda/cuda_dequant.cuh"

enum { MV_THREADS = 128, MV_MAX_NT = 8, GEMM_CHUNK = 128 };

template <int T, int NT>
__global__ void __launch_bounds__(MV_THREADS)
    mv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int n_chunks, int cols,
              const float *__restrict__ x, int n, float *__restrict__ y, int wpr) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rpb = (MV_THREADS / 32) / wpr; /* rows per block */
    const int row = blockIdx.x * rpb + warp / wpr, part = warp % wpr;
    const int t0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (row < rows) {
        const uint8_t *wr = W + (size_t)row * row_bytes;
        for (int c = part * 32 + lane; c < n_chunks; c += wpr * 32) {
            float w[8];
            deq8<T>(wr, c, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t0 + t < n) {
                    const float4 *xp = (const float4 *)(x + (size_t)(t0 + t) * cols) + 2 * c;
                    float4 a = xp[0], b = xp[1];
                    float s = acc[t];
                    s = fmaf(w[0], a.x, s);
                    s = fmaf(w[1], a.y, s);
                    s = fmaf(w[2], a.z, s);
                    s = fmaf(w[3], a.w, s);
                    s = fmaf(w[4], b.x, s);
                    s = fmaf(w[5], b.y, s);
                    s = fmaf(w[6], b.z, s);
                    s = fmaf(w[7], b.w, s);
                    acc[t] = s;
                }
            }
        }
    }
    __shared__ float red[MV_THREADS / 32][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    if ((int)threadIdx.x < rpb * NT) {
        int rl = threadIdx.x / NT, t = threadIdx.x % NT, r = blockIdx.x * rpb + rl;
        if (r < rows && t0 + t < n) {
            float s = red[rl * wpr][t];
            for (int p = 1; p < wpr; p++) s += red[rl * wpr + p][t];
            y[(size_t)(t0 + t) * rows + r] = s;
        }
    }
}

/* warps per row: more for long rows, so every lane has a few chunks to stream; a
 * function of the weight's shape only (never of the batch) */
static int mv_warps_per_row(int64_t n_chunks) { return n_chunks >= 1024 ? 4 : n_chunks >= 512 ? 2 : 1; }

template <int T>
static void launch_mv(lm_cuda_backend *cu, const lm_weight *w, const float *x, int64_t n, float *y) {
    int n_chunks = (int)(w->cols / 8), wpr = mv_warps_per_row(n_chunks);
    int rpb = (MV_THREADS / 32) / wpr;
    dim3 block(MV_THREADS);
    const int64_t max_per_launch = (int64_t)MV_MAX_NT * 65535;
    for (int64_t t0 = 0; t0 < n; t0 += max_per_launch) {
        int nn = (int)(n - t0 < max_per_launch ? n - t0 : max_per_launch);
        int nt = nn == 1 ? 1 : nn == 2 ? 2 : nn <= 4 ? 4 : 8;
        dim3 grid((unsigned)((w->rows + rpb - 1) / rpb), (unsigned)((nn + nt - 1) / nt));
        const uint8_t *W = (const uint8_t *)w->data;
        const float *xs = x + t0 * w->cols;
        float *ys = y + t0 * w->rows;
        int rows = (int)w->rows, cols = (int)w->cols;
        switch (nt) {
        case 1: mv_kernel<T, 1><<<grid, block, 0, cu->stream>>>(W, w->row_bytes, rows, n_chunks, cols, xs, nn, ys, wpr); break;
        case 2: mv_kernel<T, 2><<<grid, block, 0, cu->stream>>>(W, w->row_bytes, rows, n_chunks, cols, xs, nn, ys, wpr); break;
        case 4: mv_kernel<T, 4><<<grid, block, 0, cu->stream>>>(W, w->row_bytes, rows, n_chunks, cols, xs, nn, ys, wpr); break;
        default: mv_kernel<T, 8><<<grid, block, 0, cu->stream>>>(W, w->row_bytes, rows, n_chunks, cols, xs, nn, ys, wpr); break;
        }
        if (!lm_cuda_launched(cu, "mv_kernel")) return;
    }
}

/* rows [r0, r0 + nr) of W decoded to bf16, row-major [nr][cols] */
template <int T>
__global__ void dequant_bf16_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t chunks_per_row,
                                    int64_t n_chunks, __nv_bfloat16 *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_chunks;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / chunks_per_row, c = i % chunks_per_row;
        float v[8];
        deq8<T>(W + (size_t)r * row_bytes, c, v);
        __nv_bfloat162 h0 = __floats2bfloat162_rn(v[0], v[1]), h1 = __floats2bfloat162_rn(v[2], v[3]);
        __nv_bfloat162 h2 = __floats2bfloat162_rn(v[4], v[5]), h3 = __floats2bfloat162_rn(v[6], v[7]);
        uint4 o;
        o.x = *(uint32_t *)&h0;
        o.y = *(uint32_t *)&h1;
        o.z = *(uint32_t *)&h2;
        o.w = *(uint32_t *)&h3;
        ((uint4 *)out)[i] = o;
    }
}

/* out[i] = bf16(x[i]) for i < n_valid, 0 up to n_total */
__global__ void to_bf16_kernel(const float *__restrict__ x, int64_t n_valid, int64_t n_total,
                               __nv_bfloat16 *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_total;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(i < n_valid ? x[i] : 0.0f);
}

template <int T>
static void launch_dequant_bf16(lm_cuda_backend *cu, const lm_weight *w, int64_t r0, int64_t nr, __nv_bfloat16 *out) {
    int64_t cpr = w->cols / 8, total = nr * cpr;
    dequant_bf16_kernel<T><<<lm_cuda_blocks(total, 256), 256, 0, cu->stream>>>(
        (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, cpr, total, out);
    lm_cuda_launched(cu, "dequant_bf16_kernel");
}

static void dispatch_dequant_bf16(lm_cuda_backend *cu, const lm_weight *w, int64_t r0, int64_t nr, __nv_bfloat16 *out) {
    switch (w->type) {
#define LM_X(t) \
    case t: launch_dequant_bf16<t>(cu, w, r0, nr, out); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default: lm_cuda_fail(cu, LM_ERR_INTERNAL, "matmul: no bf16 decoder for %s", lm_dtype_name(w->type));
    }
}

static bool cublas_ok(lm_cuda_backend *cu, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    lm_cuda_fail(cu, s == CUBLAS_STATUS_ALLOC_FAILED ? LM_ERR_NO_MEMORY : LM_ERR_INTERNAL, "cuBLAS error in %s: %s",
                 what, cublasGetStatusString(s));
    return false;
}

static void gemm_path(lm_cuda_backend *cu, const lm_weight *w, const float *x, int64_t n, float *y) {
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t n_pad = (n + GEMM_CHUNK - 1) / GEMM_CHUNK * GEMM_CHUNK;
    const bool f32 = w->type == LM_DTYPE_F32, bf16 = w->type == LM_DTYPE_BF16;
    /* row tile: at most 64 MiB of bf16 and 16384 rows (bounds the scratch); depends
     * on the weight's shape only */
    int64_t rt = (64LL << 20) / (cols * 2) / 128 * 128;
    if (rt < 128) rt = 128;
    if (rt > 16384) rt = 16384;
    if (rt > rows) rt = rows;

    void *xs = lm_cuda_scratch(cu, LM_CUDA_SCR_XB, (size_t)(n_pad * cols) * (f32 ? 4 : 2));
    float *ys = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_Y, (size_t)(GEMM_CHUNK * rt) * 4);
    __nv_bfloat16 *wt = NULL;
    if (!f32 && !bf16) wt = (__nv_bfloat16 *)lm_cuda_scratch(cu, LM_CUDA_SCR_WTILE, (size_t)(rt * cols) * 2);
    if (!xs || !ys || (!f32 && !bf16 && !wt)) return;

    if (f32) {
        if (!lm_cuda_ok(cu, cudaMemcpyAsync(xs, x, (size_t)(n * cols) * 4, cudaMemcpyDeviceToDevice, cu->stream),
                        "matmul (activations)") ||
            !lm_cuda_ok(cu, cudaMemsetAsync((float *)xs + n * cols, 0, (size_t)((n_pad - n) * cols) * 4, cu->stream),
                        "matmul (padding)"))
            return;
    } else {
        to_bf16_kernel<<<lm_cuda_blocks(n_pad * cols, 256), 256, 0, cu->stream>>>(x, n * cols, n_pad * cols,
                                                                                (__nv_bfloat16 *)xs);
        if (!lm_cuda_launched(cu, "to_bf16_kernel")) return;
    }
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += rt) {
        int64_t nr = rows - r0 < rt ? rows - r0 : rt;
        const void *A;
        if (f32)
            A = (const float *)w->data + r0 * cols;
        else if (bf16)
            A = (const __nv_bfloat16 *)w->data + r0 * cols;
        else {
            dispatch_dequant_bf16(cu, w, r0, nr, wt);
            if (cu->err) return;
            A = wt;
        }
        for (int64_t c0 = 0; c0 < n_pad; c0 += GEMM_CHUNK) {
            cublasStatus_t s;
            if (f32)
                s = cublasSgemm(cu->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, GEMM_CHUNK, (int)cols, &one,
                                (const float *)A, (int)cols, (const float *)xs + c0 * cols, (int)cols, &zero, ys,
                                (int)nr);
            else
                s = cublasGemmEx(cu->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, GEMM_CHUNK, (int)cols, &one, A,
                                 CUDA_R_16BF, (int)cols, (const __nv_bfloat16 *)xs + c0 * cols, CUDA_R_16BF,
                                 (int)cols, &zero, ys, CUDA_R_32F, (int)nr, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (!cublas_ok(cu, s, f32 ? "cublasSgemm" : "cublasGemmEx")) return;
            int64_t nv = n - c0 < (int64_t)GEMM_CHUNK ? n - c0 : (int64_t)GEMM_CHUNK;
            /* ys is column-major [GEMM_CHUNK][nr]: token t's nr values are contiguous */
            if (!lm_cuda_ok(cu,
                            cudaMemcpy2DAsync(y + c0 * rows + r0, (size_t)rows * 4, ys, (size_t)nr * 4,
                                              (size_t)nr * 4, (size_t)nv, cudaMemcpyDeviceToDevice, cu->stream),
                            "matmul (output)"))
                return;
        }
    }
}

extern "C" lm_status lm_cuda_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    lm_status st = lm_cuda_take_error(cu); /* an earlier void op's failure */
    if (st) return st;
    if (n <= 0) return LM_OK;
    if (((uintptr_t)x & 15) != 0)
        return lm_error(LM_ERR_INVALID_ARG, "matmul: activations at %p are not 16-byte aligned", (const void *)x);
    if (n <= cu->mv_max_n) {
        switch (w->type) {
#define LM_X(t) \
    case t: launch_mv<t>(cu, w, x, n, y); break;
            LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
        default:
            return lm_error(LM_ERR_INTERNAL, "matmul: weight type %s has no CUDA kernel", lm_dtype_name(w->type));
        }
    } else {
        gemm_path(cu, w, x, n, y);
    }
    return lm_cuda_take_error(cu);
}
