/* logits_topk with k = 1 and no log-sum-exp (cuda_topk.cu hands it here): each row's
 * best logit, what a greedy step needs. The general path's three launches (summaries,
 * bounded slices, the final ranking) cost ~17 us a batch-1 step on the H200 for a
 * 151,936-wide row; here two light ones do (Q4_K_M-like greedy decode x1 1,083-1,097
 * -> 1,107-1,110 tokens/s, bf16 and x64 within noise):
 *
 *   slices [row][slice]  each block of ARG_SLICE logits: its best (largest key, then
 *                        lowest id) and its first NaN id, by a warp tree then a fixed
 *                        tree over the block's warps;
 *   final  [row]         one warp: the slices' results in slice order by the same
 *                        rule; writes the id, its logit read from the row (bit for bit
 *                        the reference's, -0 included) and the max, or marks a NaN row
 *                        as the general path does (the first NaN's id and logit, a
 *                        quiet NaN as the max).
 *
 * The keys and the order are the general path's (cuda_topk.cuh: -0 keyed as +0, so
 * ties between -0 and +0 go to the lower id, as the CPU reference breaks them). A
 * row's outputs depend on its own logits alone. */
#include <climits>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_topk.cuh"

namespace {

constexpr int ARG_THREADS = 256;
constexpr int ARG_ITEMS = 8;
constexpr int ARG_SLICE = ARG_THREADS * ARG_ITEMS; /* 2,048 logits a block: 75 blocks a 151,936 row */

struct arg_best {
    uint32_t key; /* 0: none (no logit of a row keys to 0) */
    int32_t id;
    int32_t nan; /* the first NaN id, INT_MAX for none */
};

/* b into a: the better candidate (cuda_topk.cuh's order); the lower NaN id */
__device__ __forceinline__ void arg_merge(arg_best &a, const arg_best &b) {
    if (better(b.key, b.id, a.key, a.id)) a.key = b.key, a.id = b.id;
    a.nan = min(a.nan, b.nan);
}

__device__ __forceinline__ arg_best arg_warp_merge(arg_best v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        arg_best o;
        o.key = __shfl_xor_sync(0xffffffffu, v.key, off);
        o.id = __shfl_xor_sync(0xffffffffu, v.id, off);
        o.nan = __shfl_xor_sync(0xffffffffu, v.nan, off);
        arg_merge(v, o);
    }
    return v;
}

__global__ void __launch_bounds__(ARG_THREADS)
    argmax_slices(const float *__restrict__ logits, int64_t n_vocab, int n_slices, arg_best *__restrict__ out) {
    lm_pdl_enter();
    __shared__ arg_best warp_best[ARG_THREADS / 32];
    const int tid = threadIdx.x, slice = blockIdx.x;
    const float *x = logits + (int64_t)blockIdx.y * n_vocab;
    const int64_t base = (int64_t)slice * ARG_SLICE;
    float v[ARG_ITEMS];
#pragma unroll
    for (int j = 0; j < ARG_ITEMS; j++) { /* every load in flight before any compare */
        const int64_t i = base + j * ARG_THREADS + tid;
        v[j] = i < n_vocab ? x[i] : 0.0f;
    }
    arg_best b = {0u, INT_MAX, INT_MAX};
#pragma unroll
    for (int j = 0; j < ARG_ITEMS; j++) {
        const int64_t i = base + j * ARG_THREADS + tid;
        if (i >= n_vocab) continue;
        if (v[j] != v[j]) {
            b.nan = min(b.nan, (int32_t)i);
            continue;
        }
        const arg_best c = {order_key(v[j]), (int32_t)i, INT_MAX};
        arg_merge(b, c);
    }
    b = arg_warp_merge(b);
    if ((tid & 31) == 0) warp_best[tid >> 5] = b;
    __syncthreads();
    if (tid < 32) {
        arg_best w = tid < ARG_THREADS / 32 ? warp_best[tid] : arg_best{0u, INT_MAX, INT_MAX};
        w = arg_warp_merge(w);
        if (tid == 0) out[(int64_t)blockIdx.y * n_slices + slice] = w;
    }
}

__global__ void __launch_bounds__(32)
    argmax_final(const float *__restrict__ logits, int64_t n_vocab, int n_slices, const arg_best *__restrict__ slices,
                 int32_t *__restrict__ out_ids, float *__restrict__ out_vals, float *__restrict__ out_max) {
    lm_pdl_enter();
    const int64_t row = blockIdx.x;
    const arg_best *s = slices + row * n_slices;
    arg_best b = {0u, INT_MAX, INT_MAX};
    for (int i = threadIdx.x; i < n_slices; i += 32) arg_merge(b, s[i]);
    b = arg_warp_merge(b);
    if (threadIdx.x != 0) return;
    const float *x = logits + row * n_vocab;
    if (b.nan != INT_MAX) { /* the row is marked; the sampler reports the first NaN */
        out_ids[row] = b.nan;
        out_vals[row] = x[b.nan];
        out_max[row] = __int_as_float(0x7fc00000);
        return;
    }
    const float v = x[b.id];
    out_ids[row] = b.id;
    out_vals[row] = v;
    out_max[row] = v;
}

} // namespace

bool lm_cuda_argmax_rows(lm_cuda_backend *cu, const float *logits, int64_t n_rows, int64_t n_vocab, int32_t *d_ids,
                         float *d_vals, float *d_max, void *work, size_t work_bytes) {
    const int n_slices = (int)((n_vocab + ARG_SLICE - 1) / ARG_SLICE);
    int64_t chunk = (int64_t)(work_bytes / (sizeof(arg_best) * (size_t)n_slices));
    chunk = chunk < 1 ? 1 : chunk > 65535 ? 65535 : chunk;
    arg_best *slices = (arg_best *)work;
    for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
        const unsigned rows = (unsigned)(n_rows - r0 < chunk ? n_rows - r0 : chunk);
        const float *x = logits + r0 * n_vocab;
        lm_cuda_launch(cu, argmax_slices, dim3((unsigned)n_slices, rows), ARG_THREADS, x, n_vocab, n_slices, slices);
        if (!lm_cuda_launched(cu, "argmax_slices")) return false;
        lm_cuda_launch(cu, argmax_final, dim3(rows), 32, x, n_vocab, n_slices, (const arg_best *)slices, d_ids + r0,
                       d_vals + r0, d_max + r0);
        if (!lm_cuda_launched(cu, "argmax_final")) return false;
    }
    return true;
}

size_t lm_cuda_argmax_work_bytes(int64_t n_rows, int64_t n_vocab) {
    const size_t per_row = sizeof(arg_best) * (size_t)((n_vocab + ARG_SLICE - 1) / ARG_SLICE);
    int64_t rows = (int64_t)(((size_t)64 << 20) / per_row); /* chunks of rows within 64 MiB */
    rows = rows < 1 ? 1 : rows > 65535 ? 65535 : rows;
    return per_row * (size_t)(n_rows < rows ? n_rows : rows);
}
