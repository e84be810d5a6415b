/* Causal attention over the paged KV cache: decode, small batches and recorded
 * passes (prefill runs of 16 positions take the tensor-core kernel,
 * cuda_attention_tc.cu, and decode batches the tensor-core decode kernel,
 * cuda_attention_dec.cu, where it serves the cache; the engine's mixed batches of
 * prompt chunks and decode steps stay here).
 *
 * A block takes one (token, KV head, chunk of up to ATT_HEADS of the query heads
 * sharing that KV head, split). A split is ATT_SPLIT positions of the token's
 * context; each runs in its own block (grid.y), so one sequence's decode still
 * spreads over the GPU. The block copies a tile of key rows and the tile's value
 * rows into shared memory with asynchronous copies, all issued at once, then every
 * warp works from shared memory on its query heads: a lane scores one or two
 * positions (q·k in dimension order), an online softmax (running max and sum per
 * head), and the lane's output dimensions accumulate the tile's value rows. So a
 * tile costs one trip to memory, and the KV head's rows are read once for all its
 * query heads. (The kernel before this one gave each query head a warp that walked
 * its keys 32 positions at a time with a load chain per tile: 21 us a layer at batch
 * 1, 28 us at 64 sequences, a quarter of a decode step. A variant that gave a block
 * several splits in a row with the next tile's copies in flight during the current
 * one, fewer blocks for large batches, measured the same: x64 20,444 vs 21,058 with a
 * split per block, x256 52,049 vs 51,722 tokens/s; the work inside a tile, not the
 * loads, bounds it at large batches.)
 *
 * A token with more than one split has each split write its partial state (max,
 * sum, unnormalized output); the block that finishes a (token, KV head, chunk) last
 * (a counter per item, back to 0 after) merges them in split order. How a token is
 * split depends only on its own position and window, never on the rest of the
 * batch, and the merge order is fixed, so results are batch-invariant.
 *
 * With an F16 cache the query is rounded to f16 like the keys, as the CPU reference
 * does; the softmax weights are not rounded to f16 (the reference rounds them; the
 * difference is within f16 rounding, ~1e-4 relative). Everything else is f32. */
#include <string.h>

#include "backend/cuda/cuda_attention_split.cuh"
#include "backend/cuda/cuda_bulk.cuh"

enum {
    ATT_WARPS = 8,   /* a warp per query head of the block */
    ATT_THREADS = 32 * ATT_WARPS,
    ATT_SPLIT = 64,  /* positions per split                          */
    ATT_HEADS = 8,   /* query heads per block (of one KV head)       */
    ATT_MAX_HD = 256,
};

/* Head size and element size of an instance: HD = 0 is any multiple of 8 up to
 * ATT_MAX_HD, known at run time. */
template <bool F16, int HD>
struct att_shape {
    static constexpr int hd_max = HD ? HD : ATT_MAX_HD;
    static constexpr int elem = F16 ? 2 : 4;
    /* positions per shared-memory tile: about 16 KB of keys and 16 KB of values */
    static constexpr int tile = 16384 / (hd_max * elem) < ATT_SPLIT ? 16384 / (hd_max * elem) : ATT_SPLIT;
    static constexpr int k_stride = hd_max + 16 / elem; /* a key row padded by 16 bytes: no bank conflicts */
    static constexpr int per_lane = (tile + 31) / 32;   /* positions a lane scores per tile */
    static constexpr int dpl = hd_max / 32;             /* output dimensions per lane       */
    static constexpr int heads_per_warp = ATT_HEADS / ATT_WARPS;
};

__device__ __forceinline__ void token_range(const int32_t *meta, int t, int64_t window, int *pos, int *lo,
                                            int *n_split) {
    *pos = meta[t];
    *lo = window > 0 && *pos - window + 1 > 0 ? (int)(*pos - window + 1) : 0;
    *n_split = (*pos - *lo + 1 + ATT_SPLIT - 1) / ATT_SPLIT;
}

/* q·k over one key row in shared memory, in dimension order. */
template <bool F16, int HD>
__device__ __forceinline__ float dot_key(const float *qs, const void *krow, int hd) {
    float s = 0.0f;
    if (F16) {
        const uint4 *kr = (const uint4 *)krow;
#pragma unroll
        for (int c = 0; c < (HD ? HD / 8 : hd / 8); c++) {
            const uint4 u = kr[c];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 f = __half22float2(*(const __half2 *)&w[i]);
                s = fmaf(qs[8 * c + 2 * i], f.x, s);
                s = fmaf(qs[8 * c + 2 * i + 1], f.y, s);
            }
        }
    } else {
        const float4 *kr = (const float4 *)krow;
#pragma unroll
        for (int c = 0; c < (HD ? HD / 4 : hd / 4); c++) {
            const float4 f = kr[c];
            s = fmaf(qs[4 * c], f.x, s);
            s = fmaf(qs[4 * c + 1], f.y, s);
            s = fmaf(qs[4 * c + 2], f.z, s);
            s = fmaf(qs[4 * c + 3], f.w, s);
        }
    }
    return s;
}

/* The DPL dimensions lane * DPL.. of a value row in shared memory, as floats, in
 * one load of DPL elements. */
template <bool F16, int DPL>
__device__ __forceinline__ void load_v_dims(const void *vrow, int lane, float *v) {
    constexpr int bytes = DPL * (F16 ? 2 : 4);
    uint32_t w[bytes / 4];
    const uint8_t *p = (const uint8_t *)vrow + lane * bytes;
    if constexpr (bytes % 16 == 0) {
#pragma unroll
        for (int i = 0; i < bytes / 16; i++) {
            const uint4 u = ((const uint4 *)p)[i];
            w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
        }
    } else if constexpr (bytes == 8) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else {
        w[0] = *(const uint32_t *)p;
    }
#pragma unroll
    for (int i = 0; i < bytes / 4; i++) {
        if constexpr (F16) {
            const float2 f = __half22float2(*(const __half2 *)&w[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        } else {
            v[i] = __uint_as_float(w[i]);
        }
    }
}

template <bool F16, int HD>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_kernel(const int32_t *__restrict__ meta, int n, int n_head, int n_head_kv, int group, int chunks, int hd,
                int64_t d_kv, int bs, const void *__restrict__ K, const void *__restrict__ V,
                const float *__restrict__ q, int64_t window, float scale, int max_splits, float *__restrict__ out,
                __nv_bfloat16 *__restrict__ outb, float *__restrict__ part, int *__restrict__ counts) {
    using S = att_shape<F16, HD>;
    constexpr int TILE = S::tile, KST = S::k_stride, DPL = S::dpl, HPW = S::heads_per_warp;
    constexpr int ELEM = S::elem;
    __shared__ __align__(16) uint8_t k_sh[TILE * KST * ELEM];
    __shared__ __align__(16) uint8_t v_sh[TILE * S::hd_max * ELEM];
    __shared__ __align__(16) float q_sh[ATT_HEADS][S::hd_max];
    __shared__ int64_t slot_sh[TILE];
    __shared__ int last_sh;

    /* the token's place, its split and the first tile's slots first, while the kernel
     * before this one still runs: the metadata was copied before it (the keys and
     * values, written by that kernel, wait) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int item = blockIdx.x; /* (token, KV head, chunk of query heads) */
    const int t = item / (n_head_kv * chunks), hk = (item / chunks) % n_head_kv, chunk = item % chunks;
    const int h0 = hk * group + chunk * ATT_HEADS, nh = min(ATT_HEADS, group - chunk * ATT_HEADS);
    int pos, lo, n_split;
    token_range(meta, t, window, &pos, &lo, &n_split);
    const int split = blockIdx.y;
    if (split >= n_split) return;
    const int pb = lo + split * ATT_SPLIT, pe = min(pos, pb + ATT_SPLIT - 1);
    const int32_t *table = meta + meta[n + t];
    const int64_t head_off = (int64_t)hk * hd;
    const int row_bytes = hd * ELEM, chunks_per_row = row_bytes / 16;
    for (int r = threadIdx.x; r < min(TILE, pe - pb + 1); r += ATT_THREADS) {
        const int p = pb + r;
        slot_sh[r] = (int64_t)table[p / bs] * bs + p % bs;
    }
    lm_pdl_enter();

    for (int i = threadIdx.x; i < nh * hd; i += ATT_THREADS) {
        const float v = q[((int64_t)t * n_head + h0) * hd + i];
        q_sh[i / hd][i % hd] = F16 ? __half2float(__float2half_rn(v)) : v;
    }

    float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
    for (int j = 0; j < HPW; j++) {
        m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[j][i] = 0.0f;
    }

    for (int p0 = pb; p0 <= pe; p0 += TILE) {
        const int nr = min(TILE, pe - p0 + 1);
        if (p0 != pb) { /* the first tile's slots are in already */
            __syncthreads(); /* the last tile's rows are read */
            for (int r = threadIdx.x; r < nr; r += ATT_THREADS) {
                const int p = p0 + r;
                slot_sh[r] = (int64_t)table[p / bs] * bs + p % bs;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nr * chunks_per_row; i += ATT_THREADS) {
            const int r = i / chunks_per_row, c = i % chunks_per_row;
            const int64_t off = (slot_sh[r] * d_kv + head_off) * ELEM + (int64_t)c * 16;
            lm_cp_async16(k_sh + (r * KST) * ELEM + c * 16, (const uint8_t *)K + off);
            lm_cp_async16(v_sh + (r * S::hd_max) * ELEM + c * 16, (const uint8_t *)V + off);
        }
        lm_cp_async_wait_all();
        __syncthreads();

#pragma unroll
        for (int j = 0; j < HPW; j++) {
            const int hl = warp + j * ATT_WARPS;
            if (hl >= nh) break;
            float s[S::per_lane], e[S::per_lane];
            float tmax = -INFINITY;
#pragma unroll
            for (int u = 0; u < S::per_lane; u++) {
                const int r = lane + 32 * u;
                s[u] = r < nr ? __fmul_rn(scale, dot_key<F16, HD>(q_sh[hl], k_sh + (r * KST) * ELEM, hd)) : -INFINITY;
                tmax = fmaxf(tmax, s[u]);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float m_new = fmaxf(m[j], tmax), corr = expf(m[j] - m_new);
            float esum = 0.0f;
#pragma unroll
            for (int u = 0; u < S::per_lane; u++) {
                e[u] = lane + 32 * u < nr ? expf(s[u] - m_new) : 0.0f;
                esum += e[u];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) esum += __shfl_xor_sync(0xffffffffu, esum, off);
            l[j] = l[j] * corr + esum;
            m[j] = m_new;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[j][i] *= corr;
#pragma unroll
            for (int u = 0; u < S::per_lane; u++) {
                const int rn = min(32, nr - 32 * u);
#pragma unroll 8
                for (int r = 0; r < rn; r++) {
                    const float w = __shfl_sync(0xffffffffu, e[u], r);
                    float v[DPL];
                    load_v_dims<F16, DPL>(v_sh + ((32 * u + r) * S::hd_max) * ELEM, lane, v);
#pragma unroll
                    for (int i = 0; i < DPL; i++) acc[j][i] = fmaf(w, v[i], acc[j][i]);
                }
            }
        }
    }

    if (n_split == 1) {
#pragma unroll
        for (int j = 0; j < HPW; j++) {
            const int hl = warp + j * ATT_WARPS;
            if (hl >= nh) break;
            const int64_t row = ((int64_t)t * n_head + h0 + hl) * hd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane * DPL + i < hd) store_out(out, outb, row + lane * DPL + i, acc[j][i] / l[j]);
        }
        return;
    }

    /* this split's state, then the last split of the item to finish merges */
    const size_t stride = (size_t)hd + 2;
#pragma unroll
    for (int j = 0; j < HPW; j++) {
        const int hl = warp + j * ATT_WARPS;
        if (hl >= nh) break;
        float *pp = part + (((size_t)t * n_head + h0 + hl) * max_splits + split) * stride;
        if (lane == 0) pp[0] = m[j], pp[1] = l[j];
#pragma unroll
        for (int i = 0; i < DPL; i++)
            if (lane * DPL + i < hd) pp[2 + lane * DPL + i] = acc[j][i];
    }
    merge_if_last<DPL, ATT_WARPS>(part, out, outb, counts, item, t, n_head, h0, nh, hd, n_split, max_splits, &last_sh);
}

/* Each sequence once: a batch of decode steps, not one holding a prompt's chunk
 * (which the engine's batches of prefill and decode mixed do: those keep the scalar
 * kernel, as a prompt decoded alone does). The decode kernel relies on it: its fused
 * qkv_finish writes each token's own slot while the other blocks read theirs, and its
 * early loads read the slots before the position as written by earlier steps; two
 * tokens of one sequence (a prompt interleaved with another) would race. */
static bool decode_batch(lm_cuda_backend *cu, const lm_attn_batch *batch, int64_t n_seqs) {
    if (n_seqs > cu->dec_seen_cap) {
        uint32_t *p = (uint32_t *)realloc(cu->dec_seen, (size_t)n_seqs * sizeof *p);
        if (!p) return false;
        memset(p + cu->dec_seen_cap, 0, (size_t)(n_seqs - cu->dec_seen_cap) * sizeof *p);
        cu->dec_seen = p, cu->dec_seen_cap = n_seqs;
    }
    if (++cu->dec_seen_stamp == 0) { /* wrapped: clear the old stamps */
        memset(cu->dec_seen, 0, (size_t)cu->dec_seen_cap * sizeof *cu->dec_seen);
        cu->dec_seen_stamp = 1;
    }
    for (int64_t t = 0; t < batch->n_tokens; t++) {
        const int32_t sq = batch->seq[t];
        if (sq < 0 || sq >= n_seqs || cu->dec_seen[sq] == cu->dec_seen_stamp) return false;
        cu->dec_seen[sq] = cu->dec_seen_stamp;
    }
    return true;
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

/* The attention call, with `dec`: whether it takes the tensor-core decode kernel (as
 * decided by lm_cuda_attention), and `fin`: the qkv_finish before it, left pending,
 * for that kernel to run (*used: it did). */
static lm_status attention_run(lm_cuda_backend *cu, lm_backend *b, const lm_kv_cache *kv, int64_t layer,
                               const lm_attn_batch *batch, const float *q, int64_t n_head, int64_t n_head_kv,
                               int64_t head_dim, int64_t window, float scale, float *out, bool dec,
                               const lm_cuda_finish *fin, bool *used) {
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
    const bool f16 = kv->type == LM_DTYPE_F16;
    const int group = (int)(n_head / n_head_kv), chunks = (group + ATT_HEADS - 1) / ATT_HEADS;
    const int64_t items = n * n_head_kv * chunks;
    if (items > INT32_MAX)
        return lm_error(LM_ERR_LIMIT, "attention: %lld tokens x %lld heads is too many for one call", (long long)n,
                        (long long)n_head);
    /* a recorded pass launches the grid of its whole shape (extra splits exit) */
    int max_splits = in_pass ? cu->pass_splits : lm_cuda_attn_max_splits(batch, window);
    if (max_splits > 65535) return lm_error(LM_ERR_LIMIT, "attention: context too long for one call");
    const int32_t *meta = lm_cuda_attn_meta(cu, kv, batch);
    if (!meta) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    if (lm_cuda_replaying(cu)) return LM_OK;
    /* the output projection's input in bf16 where that takes a GEMM */
    __nv_bfloat16 *outb = lm_cuda_gemm_input(cu, out, n * n_head * head_dim);
    if (lm_cuda_attention_tc(cu, kv, layer, batch, meta, q, n_head, n_head_kv, head_dim, window, scale, out, outb))
        return in_pass ? LM_OK : lm_cuda_take_error(cu);
    float *part = NULL;
    int *counts = NULL;
    if (max_splits > 1) {
        part = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_ATTN,
                                        (size_t)(n * n_head) * (size_t)max_splits * (size_t)(head_dim + 2) * 4);
        counts = (int *)lm_cuda_scratch(cu, LM_CUDA_SCR_COUNTS, (size_t)items * sizeof(int));
        if (!part || !counts) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    }
    if (dec) {
        lm_cuda_attention_dec(cu, kv, layer, batch, meta, q, n_head, n_head_kv, head_dim, window, scale, max_splits,
                              out, outb, part, counts, fin ? &fin->a : NULL);
        *used = fin != NULL;
        return in_pass ? LM_OK : lm_cuda_take_error(cu);
    }
    const int64_t d_kv = kv->n_embd_kv;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d_kv) * kv->elem_size;
    const void *K = (const uint8_t *)kv->k + layer_off, *V = (const uint8_t *)kv->v + layer_off;
    const dim3 grid((unsigned)items, (unsigned)max_splits);
#define LM_ATTN(F, H)                                                                                                \
    lm_cuda_launch(cu, attn_kernel<F, H>, grid, ATT_THREADS, meta, (int)n, (int)n_head, (int)n_head_kv, group,      \
                   chunks, (int)head_dim, d_kv, (int)kv->block_size, K, V, q, window, scale, max_splits, out, outb,     \
                   part, counts)
    switch (head_dim) { /* the real models' head sizes unrolled; others at run time */
    case 64: f16 ? LM_ATTN(true, 64) : LM_ATTN(false, 64); break;
    case 128: f16 ? LM_ATTN(true, 128) : LM_ATTN(false, 128); break;
    case 256: f16 ? LM_ATTN(true, 256) : LM_ATTN(false, 256); break;
    default: f16 ? LM_ATTN(true, 0) : LM_ATTN(false, 0); break;
    }
#undef LM_ATTN
    lm_cuda_launched(cu, "attn_kernel");
    return in_pass ? LM_OK : lm_cuda_take_error(cu);
}

extern "C" lm_status lm_cuda_attention(lm_backend *b, const lm_kv_cache *kv, int64_t layer,
                                       const lm_attn_batch *batch, const float *q, int64_t n_head, int64_t n_head_kv,
                                       int64_t head_dim, int64_t window, float scale, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    /* decode batches take the tensor-core decode kernel (cuda_attention_dec.cu); the
     * engine's mixed batches of prompt chunks and decode steps do not */
    const bool dec = batch->n_tokens >= cu->attn_dec_min_n && kv->backend == b && n_head_kv > 0 &&
                     n_head % n_head_kv == 0 && n_head_kv * head_dim == kv->n_embd_kv &&
                     lm_cuda_attention_dec_supports(kv, n_head, n_head_kv, head_dim) &&
                     decode_batch(cu, batch, kv->n_seqs);
    /* that kernel runs a qkv_finish left pending before it in its blocks: taken before
     * entering (which would run it), put back if the call ends before its launch */
    lm_cuda_finish fin;
    const bool taken = dec && lm_cuda_finish_take(cu, kv, layer, q, batch->n_tokens, &fin);
    bool used = false;
    const lm_status st = attention_run(cu, b, kv, layer, batch, q, n_head, n_head_kv, head_dim, window, scale, out,
                                       dec, taken ? &fin : NULL, &used);
    if (taken && !used) lm_cuda_finish_put_back(cu, &fin);
    return st;
}
