/* What the attention kernels that split a token's context over blocks share
 * (cuda_attention.cu, cuda_attention_dec.cu): the merge of the splits' partial
 * states, done by the block that finishes last. */
#ifndef LM_BACKEND_CUDA_ATTENTION_SPLIT_CUH
#define LM_BACKEND_CUDA_ATTENTION_SPLIT_CUH

#include "backend/cuda/cuda_internal.cuh"

/* out[i] = v, and its bf16 copy for the product after (outb, may be NULL) */
__device__ __forceinline__ void store_out(float *out, __nv_bfloat16 *outb, int64_t i, float v) {
    out[i] = v;
    if (outb) outb[i] = __float2bfloat16_rn(v);
}

/* After each split of an item (token t, query heads h0..h0+nh) wrote its state
 * (max, sum, unnormalized output: hd + 2 floats per head and split in `part`): the
 * block that finishes last merges the splits in split order, a warp per head (WARPS
 * warps), a lane per split for the max and the sum (32 at a time), then the lanes'
 * output dimensions (DPL each) over the splits, loads of a round in flight together. */
template <int DPL, int WARPS>
__device__ void merge_if_last(const float *part, float *__restrict__ out, __nv_bfloat16 *__restrict__ outb,
                              int *__restrict__ counts, int item, int t, int n_head, int h0, int nh, int hd,
                              int n_split, int max_splits, int *last_sh) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t stride = (size_t)hd + 2;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int done = atomicAdd(&counts[item], 1) + 1;
        *last_sh = done == n_split;
        if (*last_sh) counts[item] = 0; /* ready for the next call */
    }
    __syncthreads();
    if (!*last_sh) return;
    __threadfence();
    for (int hl = warp; hl < nh; hl += WARPS) {
        const float *pp = part + ((size_t)t * n_head + h0 + hl) * max_splits * stride;
        float M = -INFINITY;
        for (int s0 = 0; s0 < n_split; s0 += 32)
            if (s0 + lane < n_split) M = fmaxf(M, __ldcg(pp + (s0 + lane) * stride));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        float L = 0.0f, o[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = 0.0f;
        for (int s0 = 0; s0 < n_split; s0 += 32) {
            const int ns = min(32, n_split - s0);
            const float *ps = pp + (s0 + lane) * stride;
            const float c = lane < ns ? expf(__ldcg(ps) - M) : 0.0f;
            float ls = lane < ns ? __ldcg(ps + 1) * c : 0.0f;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, off);
            L += ls;
#pragma unroll 4
            for (int sp = 0; sp < ns; sp++) {
                const float cs = __shfl_sync(0xffffffffu, c, sp);
                const float *a = pp + (s0 + sp) * stride + 2 + lane * DPL;
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    if (lane * DPL + i < hd) o[i] = fmaf(__ldcg(a + i), cs, o[i]);
            }
        }
        const int64_t row = ((int64_t)t * n_head + h0 + hl) * hd;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            if (lane * DPL + i < hd) store_out(out, outb, row + lane * DPL + i, o[i] / L);
    }
}

#endif
