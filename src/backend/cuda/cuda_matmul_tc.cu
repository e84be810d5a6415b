/* Decode-sized matrix products on the tensor cores: y[t][r] = sum_k W[r][k] x[t][k]
 * for batches of up to tc_max_n tokens (LUMEN_CUDA_TC_MAX_N), weights of any format
 * but F32.
 *
 * A decode step is bound by reading the weights, so this kernel is built to keep many
 * weight loads in flight and to let the tensor cores do the arithmetic of up to 64
 * tokens for the price of one. A warp owns 16 rows and a slice of the 32-column chunks;
 * per chunk, lane (g = lane / 4, t = lane % 4) reads the 8 contiguous weights 8t..8t+7
 * of rows g and g + 8 (deq8 decodes any format; rounded to bf16) and the mma.sync
 * m16n8k16 takes them as its A fragment under a permutation of k: the fragment's k
 * slots {2t, 2t+1, 2t+8, 2t+9} of the first mma hold the chunk's 8t..8t+3, those of the
 * second its 8t+4..8t+7. The activations (token g of each 8-token tile) are loaded with
 * the same permutation as the B fragment, rounded to bf16; a sum over k does not care
 * which k sits in which slot as long as W and x agree. Sums are f32.
 *
 * Batch invariance is exact within this path: the warps per 16-row tile depend on the
 * column count only; each warp accumulates its chunks in a fixed order;
 * a tile's warps are summed in warp order; an mma's output element depends only on
 * its own row and column. A token's result is the same bits whatever batch it is in,
 * for every batch size this path serves. */
#include <limits.h>

#include "backend/cuda/cuda_matmul.cuh"

enum { TC_WARPS = 8, TC_THREADS = 32 * TC_WARPS, TC_UNROLL = 4 };

__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* D += A B on one m16n8k16 tile, bf16 inputs, f32 accumulation. Fragment layouts (PTX
 * ISA): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
 * b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0,d1 = D[g][2t..], d2,d3 = D[g+8][2t..]. */
__device__ __forceinline__ void tc_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* elements 8c..8c+7 of a row as four bf16 pairs (low half = lower index) */
template <int T>
__device__ __forceinline__ void tc_load_w(const uint8_t *__restrict__ row, int c, uint32_t *a) {
    float f[8];
    deq8<T>(row, c, f);
    a[0] = tc_pack(f[0], f[1]);
    a[1] = tc_pack(f[2], f[3]);
    a[2] = tc_pack(f[4], f[5]);
    a[3] = tc_pack(f[6], f[7]);
}

/* bf16 rows are the fragment already */
template <>
__device__ __forceinline__ void tc_load_w<LM_DTYPE_BF16>(const uint8_t *__restrict__ row, int c, uint32_t *a) {
    uint4 u = ((const uint4 *)row)[c];
    a[0] = u.x, a[1] = u.y, a[2] = u.z, a[3] = u.w;
}

/* NT: 8-token tiles per block (1, 2, 4 or 8). Block = TC_WARPS warps over
 * TC_WARPS / wpt row tiles; blockIdx.x = row block * n_groups + token group, the
 * group fastest, so the groups of one row block run together and share its weights
 * in L2. */
template <int T, int NT>
__global__ void __launch_bounds__(TC_THREADS)
    tc_kernel(const __grid_constant__ mv_set set, int n_chunks, int cols, const float *__restrict__ x, int n, int wpt,
              int n_groups) {
    lm_pdl_enter();
    __shared__ float red[TC_WARPS][NT][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int group = blockIdx.x % n_groups;
    const int tile = (blockIdx.x / n_groups) * (TC_WARPS / wpt) + warp / wpt, part = warp % wpt;
    const int rows_all = set.end[set.n_w - 1];
    const int r_lo = tile * 16 + g, r_hi = r_lo + 8, tok0 = group * NT * 8;
    int k_lo = 0, k_hi = 0;
    const uint8_t *w_lo = NULL, *w_hi = NULL;
    if (r_lo < rows_all) {
        k_lo = mv_which(set, r_lo);
        w_lo = set.W[k_lo] + (size_t)(r_lo - (k_lo ? set.end[k_lo - 1] : 0)) * set.row_bytes[k_lo];
    }
    if (r_hi < rows_all) {
        k_hi = mv_which(set, r_hi);
        w_hi = set.W[k_hi] + (size_t)(r_hi - (k_hi ? set.end[k_hi - 1] : 0)) * set.row_bytes[k_hi];
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    if (tile * 16 < rows_all) {
        for (int c0 = part; c0 < n_chunks; c0 += wpt * TC_UNROLL) {
            /* every weight load of the unrolled chunks first, so they are in flight
             * together */
            uint32_t a[TC_UNROLL][8];
#pragma unroll
            for (int u = 0; u < TC_UNROLL; u++) {
                const int c = c0 + u * wpt;
#pragma unroll
                for (int i = 0; i < 8; i++) a[u][i] = 0u;
                if (c < n_chunks) {
                    if (w_lo) tc_load_w<T>(w_lo, 4 * c + t, a[u]);
                    if (w_hi) tc_load_w<T>(w_hi, 4 * c + t, a[u] + 4);
                }
            }
#pragma unroll
            for (int u = 0; u < TC_UNROLL; u++) {
                const int c = c0 + u * wpt;
                if (c >= n_chunks) break;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int tok = tok0 + j * 8 + g;
                    uint32_t b0 = 0u, b1 = 0u, b2 = 0u, b3 = 0u;
                    if (tok < n) {
                        const float4 *xp = (const float4 *)(x + (size_t)tok * cols + 32 * c + 8 * t);
                        const float4 p = xp[0], q = xp[1];
                        b0 = tc_pack(p.x, p.y), b1 = tc_pack(p.z, p.w), b2 = tc_pack(q.x, q.y), b3 = tc_pack(q.z, q.w);
                    }
                    tc_mma(acc[j], a[u][0], a[u][4], a[u][1], a[u][5], b0, b1);
                    tc_mma(acc[j], a[u][2], a[u][6], a[u][3], a[u][7], b2, b3);
                }
            }
        }
    }

    if (wpt > 1) { /* the tile's warps summed in warp order */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][j][i][lane] = acc[j][i];
        __syncthreads();
        if (part != 0) return;
        for (int p = 1; p < wpt; p++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[j][i] += red[warp + p][j][i][lane];
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i < 2 ? r_lo : r_hi, k = i < 2 ? k_lo : k_hi, tok = tok0 + j * 8 + 2 * t + (i & 1);
            if (r < rows_all && tok < n)
                set.y[k][(size_t)tok * set.rows[k] + (r - (k ? set.end[k - 1] : 0))] = acc[j][i];
        }
}

bool lm_cuda_tc_supports(const lm_weight *w) {
    if (w->type == LM_DTYPE_F32 || w->cols % 32 != 0 || w->cols / 32 > INT_MAX) return false;
    switch (w->type) {
#define LM_X(t) \
    case t: return true;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default: return false;
    }
}

/* Warps per 16-row tile: as many as keep six or more chunks each, up to TC_WARPS. A
 * function of the column count only, so matmul_many's concatenated rows compute
 * exactly as separate products would. (At 1,536 columns, 8 warps of 6 chunks: the
 * Q/K/V and output projections of a 1.5B model have only 96-128 tiles.) */
static int tc_warps_per_tile(int64_t chunks) {
    int wpt = 1;
    while (wpt < TC_WARPS && chunks >= 6 * 2 * wpt) wpt *= 2;
    return wpt;
}

template <int T>
static void launch_tc(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                      float *const *y) {
    const mv_set set = mv_set_of(w, n_w, y);
    const int64_t rows_all = set.end[n_w - 1], chunks = w[0]->cols / 32, tiles = (rows_all + 15) / 16;
    const int wpt = tc_warps_per_tile(chunks), tiles_per_block = TC_WARPS / wpt;
    const int64_t row_blocks = (tiles + tiles_per_block - 1) / tiles_per_block;
    const int nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
    const int64_t groups = (n + 8 * nt - 1) / (8 * nt);
    if (row_blocks * groups > INT_MAX || n > INT_MAX) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "matmul: %lld tokens of %lld rows are too many for one launch",
                     (long long)n, (long long)rows_all);
        return;
    }
    const dim3 grid((unsigned)(row_blocks * groups));
    const int cols = (int)w[0]->cols, nc = (int)chunks, nn = (int)n, ng = (int)groups;
    switch (nt) {
    case 1: lm_cuda_launch(cu, tc_kernel<T, 1>, grid, TC_THREADS, set, nc, cols, x, nn, wpt, ng); break;
    case 2: lm_cuda_launch(cu, tc_kernel<T, 2>, grid, TC_THREADS, set, nc, cols, x, nn, wpt, ng); break;
    case 4: lm_cuda_launch(cu, tc_kernel<T, 4>, grid, TC_THREADS, set, nc, cols, x, nn, wpt, ng); break;
    default: lm_cuda_launch(cu, tc_kernel<T, 8>, grid, TC_THREADS, set, nc, cols, x, nn, wpt, ng); break;
    }
    lm_cuda_launched(cu, "tc_kernel");
}

void lm_cuda_matmul_tc(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                       float *const *y) {
    switch (w[0]->type) {
#define LM_X(t) \
    case t: launch_tc<t>(cu, w, n_w, x, n, y); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default: lm_cuda_fail(cu, LM_ERR_INTERNAL, "matmul: no tensor-core path for %s", lm_dtype_name(w[0]->type));
    }
}
