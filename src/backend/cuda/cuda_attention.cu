/* Causal attention over the paged KV cache, one kernel for prefill and decode.
 *
 * A warp computes one (token, query head, split): the keys of positions
 * [lo, pos] (lo = pos - window + 1 on sliding-window layers) in the token's own
 * sequence, read through its block table. Positions go 32 at a time: in the score
 * phase each lane owns one position and dots the whole query (in shared memory)
 * with that key row; an online softmax (running max and sum, rescaled per tile)
 * then turns scores into weights; in the value phase each lane owns head_dim / 32
 * output dimensions and accumulates the tile's 32 value rows (coalesced reads). The
 * warps of a block take consecutive heads of one token, which share their key/value
 * head under GQA, so its rows are read once from memory and then from L1.
 *
 * Contexts are split into pieces of ATT_SPLIT positions processed by separate
 * blocks (grid.y) and merged by a second kernel, so decode of one sequence still
 * spreads over the GPU (at 512 a 12-head decode step ran 12 warps: 19 us a layer). How a token is split depends only on its own position and
 * window, never on the rest of the batch, so results are batch-invariant.
 *
 * With an F16 cache the query is rounded to f16 like the keys, as the CPU reference
 * does; the softmax weights are not rounded to f16 (the reference rounds them; the
 * difference is within f16 rounding, ~1e-4 relative). Everything else is f32. */
#include "backend/cuda/cuda_internal.cuh"

enum { ATT_WARPS = 4, ATT_SPLIT = 64, ATT_MAX_HD = 256, ATT_DPL = ATT_MAX_HD / 32 };

__device__ __forceinline__ void token_range(const int32_t *meta, int t, int64_t window, int *pos, int *lo,
                                            int *n_split) {
    *pos = meta[t];
    *lo = window > 0 && *pos - window + 1 > 0 ? (int)(*pos - window + 1) : 0;
    *n_split = (*pos - *lo + 1 + ATT_SPLIT - 1) / ATT_SPLIT;
}

/* q·k over one key row; HD > 0: the head size known at compile time, so the loads
 * of the row are unrolled and in flight together (a runtime loop issued them one
 * after another: decode attention was bound by that latency). */
template <bool F16, int HD>
__device__ __forceinline__ float dot_key(const float *qs, const void *K, int64_t off, int hd) {
    float s = 0.0f;
    if (F16) {
        const uint4 *kr = (const uint4 *)((const __half *)K + off);
#pragma unroll
        for (int c = 0; c < (HD ? HD / 8 : hd / 8); c++) {
            uint4 u = kr[c];
            uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 f = __half22float2(*(const __half2 *)&w[i]);
                s = fmaf(qs[8 * c + 2 * i], f.x, s);
                s = fmaf(qs[8 * c + 2 * i + 1], f.y, s);
            }
        }
    } else {
        const float4 *kr = (const float4 *)((const float *)K + off);
#pragma unroll
        for (int c = 0; c < (HD ? HD / 4 : hd / 4); c++) {
            float4 f = kr[c];
            s = fmaf(qs[4 * c], f.x, s);
            s = fmaf(qs[4 * c + 1], f.y, s);
            s = fmaf(qs[4 * c + 2], f.z, s);
            s = fmaf(qs[4 * c + 3], f.w, s);
        }
    }
    return s;
}

template <bool F16>
__device__ __forceinline__ float load_v(const void *V, int64_t i) {
    return F16 ? __half2float(((const __half *)V)[i]) : ((const float *)V)[i];
}

/* The output dimension a lane's i-th accumulator holds: with the head size known, a
 * lane owns DPL contiguous dimensions (one vector load per value row); otherwise
 * dimensions lane, lane + 32, ... */
template <int HD, int DPL>
__device__ __forceinline__ int lane_dim(int lane, int i) {
    return HD ? lane * DPL + i : lane + 32 * i;
}

/* The lane's dimensions of the value row at voff, as floats (0 past hd). */
template <bool F16, int HD, int DPL>
__device__ __forceinline__ void load_v_dims(const void *V, int64_t voff, int lane, int hd, float *v) {
    if (HD && F16 && DPL % 2 == 0) {
        /* DPL halves at a multiple of DPL: aligned to their size (up to 16 bytes) */
        const __half2 *p = (const __half2 *)__builtin_assume_aligned((const __half *)V + voff + lane * DPL,
                                                                     DPL * 2 > 16 ? 16 : DPL * 2);
#pragma unroll
        for (int i = 0; i < DPL / 2; i++) {
            const float2 f = __half22float2(p[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else if (HD && !F16 && DPL % 2 == 0) {
        const float2 *p = (const float2 *)__builtin_assume_aligned((const float *)V + voff + lane * DPL,
                                                                   DPL * 4 > 16 ? 16 : DPL * 4);
#pragma unroll
        for (int i = 0; i < DPL / 2; i++) {
            const float2 f = p[i];
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane_dim<HD, DPL>(lane, i);
            v[i] = d < hd ? load_v<F16>(V, voff + d) : 0.0f;
        }
    }
}

template <bool F16, int HD>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_kernel(const int32_t *__restrict__ meta, int n, int n_head, int group, int hd, int64_t d_kv, int bs,
                const void *__restrict__ K, const void *__restrict__ V, const float *__restrict__ q, int64_t window,
                float scale, int max_splits, float *__restrict__ out, float *__restrict__ part) {
    lm_pdl_enter();
    __shared__ float q_sh[ATT_WARPS][ATT_MAX_HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * ATT_WARPS + warp;
    if (item >= (int64_t)n * n_head) return;
    const int t = (int)(item / n_head), h = (int)(item % n_head), hk = h / group;
    int pos, lo, n_split;
    token_range(meta, t, window, &pos, &lo, &n_split);
    const int split = blockIdx.y;
    if (split >= n_split) return;
    const int pb = lo + split * ATT_SPLIT, pe = min(pos, pb + ATT_SPLIT - 1);
    const int32_t *table = meta + meta[n + t];

    float *qs = q_sh[warp];
    const float *qrow = q + item * hd;
    for (int d = lane; d < hd; d += 32) qs[d] = F16 ? __half2float(__float2half_rn(qrow[d])) : qrow[d];
    __syncwarp();

    constexpr int DPL = HD ? HD / 32 : ATT_DPL; /* output dims per lane */
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    const int64_t head_off = (int64_t)hk * hd;
    for (int p0 = pb; p0 <= pe; p0 += 32) {
        const int p = p0 + lane;
        const bool valid = p <= pe;
        int64_t slot = valid ? (int64_t)table[p / bs] * bs + p % bs : 0;
        float s = -INFINITY;
        if (valid) s = __fmul_rn(scale, dot_key<F16, HD>(qs, K, slot * d_kv + head_off, hd));
        float tmax = s;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
        const float m_new = fmaxf(m, tmax);
        const float corr = expf(m - m_new);
        const float e = valid ? expf(s - m_new) : 0.0f;
        float esum = e;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) esum += __shfl_xor_sync(0xffffffffu, esum, off);
        l = l * corr + esum;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
        const int nv = min(32, pe - p0 + 1);
        /* value rows four at a time: their loads issued together, then the
         * multiply-adds in position order (the same sums as one row at a time) */
        int j = 0;
        for (; j + 4 <= nv; j += 4) {
            float wj[4], vv[4][DPL];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                wj[u] = __shfl_sync(0xffffffffu, e, j + u);
                const int64_t voff = __shfl_sync(0xffffffffu, slot, j + u) * d_kv + head_off;
                load_v_dims<F16, HD, DPL>(V, voff, lane, hd, vv[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[i] = fmaf(wj[u], vv[u][i], acc[i]);
        }
        for (; j < nv; j++) {
            const float wj = __shfl_sync(0xffffffffu, e, j);
            const int64_t voff = __shfl_sync(0xffffffffu, slot, j) * d_kv + head_off;
            float vv[DPL];
            load_v_dims<F16, HD, DPL>(V, voff, lane, hd, vv);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = fmaf(wj, vv[i], acc[i]);
        }
        m = m_new;
    }
    if (n_split == 1) {
        float *o = out + item * hd;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane_dim<HD, DPL>(lane, i);
            if (d < hd) o[d] = acc[i] / l;
        }
    } else {
        float *pp = part + ((size_t)item * max_splits + split) * (size_t)(hd + 2);
        if (lane == 0) pp[0] = m, pp[1] = l;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane_dim<HD, DPL>(lane, i);
            if (d < hd) pp[2 + d] = acc[i];
        }
    }
}

/* merges the splits of the tokens that have more than one, in split order */
__global__ void attn_combine_kernel(const int32_t *__restrict__ meta, int n, int n_head, int hd, int64_t window,
                                    int max_splits, const float *__restrict__ part, float *__restrict__ out) {
    lm_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * ATT_WARPS + warp;
    if (item >= (int64_t)n * n_head) return;
    int pos, lo, n_split;
    token_range(meta, (int)(item / n_head), window, &pos, &lo, &n_split);
    if (n_split <= 1) return;
    const float *pp = part + (size_t)item * max_splits * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pp[(size_t)s * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) L += pp[(size_t)s * (hd + 2) + 1] * expf(pp[(size_t)s * (hd + 2)] - M);
    for (int d = lane; d < hd; d += 32) {
        float o = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float *ps = pp + (size_t)s * (hd + 2);
            o += ps[2 + d] * expf(ps[0] - M);
        }
        out[item * hd + d] = o / L;
    }
}

int lm_cuda_attn_max_splits(const lm_attn_batch *batch, int64_t window) {
    int max_splits = 1;
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        int64_t pos = batch->pos[t], lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        int64_t ns = (pos - lo + 1 + ATT_SPLIT - 1) / ATT_SPLIT;
        if (ns > max_splits) max_splits = ns > INT32_MAX ? INT32_MAX : (int)ns;
    }
    return max_splits;
}

extern "C" lm_status lm_cuda_attention(lm_backend *b, const lm_kv_cache *kv, int64_t layer,
                                       const lm_attn_batch *batch, const float *q, int64_t n_head, int64_t n_head_kv,
                                       int64_t head_dim, int64_t window, float scale, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    const bool in_pass = lm_cuda_recorded_pass(cu); /* errors wait for pass_end */
    lm_status st = in_pass ? LM_OK : lm_cuda_take_error(cu);
    if (st) return st;
    const int64_t n = batch->n_tokens;
    if (n <= 0) return LM_OK;
    if (kv->backend != b) return lm_error(LM_ERR_INVALID_ARG, "attention: the KV cache belongs to another backend");
    if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > ATT_MAX_HD)
        return lm_error(LM_ERR_UNSUPPORTED, "attention: head_dim %lld is not supported by the CUDA backend "
                        "(a multiple of 8 up to %d)", (long long)head_dim, ATT_MAX_HD);
    if (n_head_kv <= 0 || n_head % n_head_kv != 0 || n_head_kv * head_dim != kv->n_embd_kv)
        return lm_error(LM_ERR_INVALID_ARG, "attention: %lld query heads, %lld KV heads of %lld do not match the "
                        "cache's %lld values per token", (long long)n_head, (long long)n_head_kv,
                        (long long)head_dim, (long long)kv->n_embd_kv);
    if (kv->type != LM_DTYPE_F16 && kv->type != LM_DTYPE_F32)
        return lm_error(LM_ERR_UNSUPPORTED, "attention: KV cache type %s", lm_dtype_name(kv->type));
    if (n * n_head > (int64_t)INT32_MAX * ATT_WARPS || n > INT32_MAX)
        return lm_error(LM_ERR_LIMIT, "attention: %lld tokens x %lld heads is too many for one call", (long long)n,
                        (long long)n_head);
    /* a recorded pass launches the grid of its whole shape (extra splits exit) */
    int max_splits = in_pass ? cu->pass_splits : lm_cuda_attn_max_splits(batch, window);
    if (max_splits > 65535) return lm_error(LM_ERR_LIMIT, "attention: context too long for one call");
    const int32_t *meta = lm_cuda_attn_meta(cu, kv, batch);
    if (!meta) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    if (lm_cuda_replaying(cu)) return LM_OK;
    if (lm_cuda_attention_tc(cu, kv, layer, batch, meta, q, n_head, n_head_kv, head_dim, window, scale, out))
        return in_pass ? LM_OK : lm_cuda_take_error(cu);
    float *part = NULL;
    if (max_splits > 1) {
        part = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_ATTN,
                                        (size_t)(n * n_head) * (size_t)max_splits * (size_t)(head_dim + 2) * 4);
        if (!part) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    }
    const int64_t d_kv = kv->n_embd_kv;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d_kv) * kv->elem_size;
    const void *K = (const uint8_t *)kv->k + layer_off, *V = (const uint8_t *)kv->v + layer_off;
    const int64_t items = n * n_head;
    dim3 grid((unsigned)((items + ATT_WARPS - 1) / ATT_WARPS), (unsigned)max_splits);
    const int group = (int)(n_head / n_head_kv);
    const bool f16 = kv->type == LM_DTYPE_F16;
#define LM_ATTN(F, H)                                                                                                  \
    lm_cuda_launch(cu, attn_kernel<F, H>, grid, ATT_WARPS * 32, meta, (int)n, (int)n_head, group, (int)head_dim, d_kv, \
                   (int)kv->block_size, K, V, q, window, scale, max_splits, out, part)
    switch (head_dim) { /* the real models' head sizes unrolled; others at run time */
    case 64: f16 ? LM_ATTN(true, 64) : LM_ATTN(false, 64); break;
    case 128: f16 ? LM_ATTN(true, 128) : LM_ATTN(false, 128); break;
    case 256: f16 ? LM_ATTN(true, 256) : LM_ATTN(false, 256); break;
    default: f16 ? LM_ATTN(true, 0) : LM_ATTN(false, 0); break;
    }
#undef LM_ATTN
    if (!lm_cuda_launched(cu, "attn_kernel")) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    if (max_splits > 1) {
        lm_cuda_launch(cu, attn_combine_kernel, grid.x, ATT_WARPS * 32, meta, (int)n, (int)n_head, (int)head_dim,
                       window, max_splits, part, out);
        lm_cuda_launched(cu, "attn_combine_kernel");
    }
    return in_pass ? LM_OK : lm_cuda_take_error(cu);
}
