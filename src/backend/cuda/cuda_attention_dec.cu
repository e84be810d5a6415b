/* Attention of large decode batches on the tensor cores (mma.sync m16n8k16, f16
 * inputs, f32 accumulation).
 *
 * A block takes one (token, KV head): the query heads sharing that KV head are the
 * rows of the products (up to 16; rows past the group are zeros, computed and
 * dropped), so each key and value is read once for all of them and a KV block of 16
 * positions costs 16 products where the scalar kernel (cuda_attention.cu) spent a
 * lane's fused multiply-adds per position and dimension. Its DEC_WARPS warps take the
 * token's KV blocks in turn (warp w: blocks w, w + DEC_WARPS, ...), each an online
 * softmax over its blocks (tc_attend_block, as the prefill kernel); the warps' states
 * are then merged in shared memory in warp order. (The scalar kernel took 16 us a
 * layer at 64 sequences of ~200 positions and 40 us at 256 on the H200, bound by its
 * instructions.)
 *
 * Which warp takes which block depends only on the block's index, and the merge order
 * is fixed: a token's result depends on its own query, position and window, never on
 * the batch around it, within this path. It differs from the scalar kernel's by f16
 * rounding of the softmax weights (as the CPU reference rounds them), ~1e-3 relative,
 * so it serves only batches of more than tc_max_n tokens, the size from which the
 * products change path too (cuda_matmul.cu): batches of 33 or more tokens agree with
 * each other to the bit, not with a token decoded alone. F16 caches of block size 16,
 * head sizes 64 and 128, up to 16 query heads per KV head; anything else takes the
 * scalar kernel. */
#include "backend/cuda/cuda_attention_tc.cuh"

enum { DEC_WARPS = 4, DEC_THREADS = 32 * DEC_WARPS, DEC_MAX_GROUP = 16 };

template <int HD>
__global__ void __launch_bounds__(DEC_THREADS)
    attn_dec_kernel(const int32_t *__restrict__ meta, int n, int n_head, int n_head_kv, int group, int64_t d_kv,
                    const __half *__restrict__ K, const __half *__restrict__ V, const float *__restrict__ q,
                    int64_t window, float scale, float *__restrict__ out, __nv_bfloat16 *__restrict__ outb) {
    __shared__ float o_sh[DEC_WARPS][DEC_MAX_GROUP][HD + 1]; /* +1: rows fall in other banks */
    __shared__ float ml_sh[DEC_WARPS][DEC_MAX_GROUP][2];
    lm_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
    const int t = blockIdx.x / n_head_kv, hk = blockIdx.x % n_head_kv, h0 = hk * group;
    const int p = meta[t], p_lo = window > 0 && p - window + 1 > 0 ? (int)(p - window + 1) : 0;
    const int pos[2] = {p, p}, lo[2] = {p_lo, p_lo};
    /* the group's query heads as A fragments, rounded to f16 as the keys */
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i & 1), col = kc * 16 + c2 + 8 * (i >> 1);
            const float *qr = q + ((int64_t)t * n_head + h0 + r) * HD + col;
            qa[kc][i] = r < group ? pack_half2(qr[0], qr[1]) : 0u;
        }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const int32_t *table = meta + meta[n + t];
    const int64_t head_off = (int64_t)hk * HD;
    const int kb_first = p_lo / TC_ROWS + warp, kb_last = p / TC_ROWS;
    uint32_t kf[HD / 16][2][2];
    if (kb_first <= kb_last) load_keys<HD>(K, table, kb_first, d_kv, head_off, g, c2, kf);
    for (int kb = kb_first; kb <= kb_last; kb += DEC_WARPS) {
        const int next = kb + DEC_WARPS <= kb_last ? kb + DEC_WARPS : -1;
        tc_attend_block<HD>(K, V, table, kb, next, p - kb * TC_ROWS, d_kv, head_off, g, c2, qa, kf, lo, pos, scale,
                            m, l, o);
    }

    /* each warp's state, then the warps merged in warp order (a warp without blocks:
     * max -inf, weight 0) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        if (r >= group) continue;
        if (c2 == 0) ml_sh[warp][r][0] = m[i], ml_sh[warp][r][1] = l[i];
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            o_sh[warp][r][j * 8 + c2] = o[j][2 * i];
            o_sh[warp][r][j * 8 + c2 + 1] = o[j][2 * i + 1];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < group * HD; e += DEC_THREADS) {
        const int r = e / HD, d = e % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, ml_sh[w][r][0]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            const float mw = ml_sh[w][r][0];
            if (mw == -INFINITY) continue;
            const float c = expf(mw - M);
            L = fmaf(ml_sh[w][r][1], c, L);
            O = fmaf(o_sh[w][r][d], c, O);
        }
        const int64_t i = ((int64_t)t * n_head + h0 + r) * HD + d;
        const float v = O / L;
        out[i] = v;
        if (outb) outb[i] = __float2bfloat16_rn(v);
    }
}

bool lm_cuda_attention_dec(lm_cuda_backend *cu, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                           const int32_t *meta, const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           int64_t window, float scale, float *out, __nv_bfloat16 *outb) {
    const int64_t n = batch->n_tokens, group = n_head / n_head_kv;
    if (n <= cu->tc_max_n || n <= cu->mv_max_n || kv->type != LM_DTYPE_F16 || kv->block_size != TC_ROWS ||
        (head_dim != 64 && head_dim != 128) || group > DEC_MAX_GROUP || n * n_head_kv > INT32_MAX)
        return false;
    const int64_t d_kv = kv->n_embd_kv;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d_kv) * kv->elem_size;
    const __half *K = (const __half *)((const uint8_t *)kv->k + layer_off);
    const __half *V = (const __half *)((const uint8_t *)kv->v + layer_off);
    const unsigned grid = (unsigned)(n * n_head_kv);
    if (head_dim == 64)
        lm_cuda_launch(cu, attn_dec_kernel<64>, grid, DEC_THREADS, meta, (int)n, (int)n_head, (int)n_head_kv,
                       (int)group, d_kv, K, V, q, window, scale, out, outb);
    else
        lm_cuda_launch(cu, attn_dec_kernel<128>, grid, DEC_THREADS, meta, (int)n, (int)n_head, (int)n_head_kv,
                       (int)group, d_kv, K, V, q, window, scale, out, outb);
    lm_cuda_launched(cu, "attn_dec_kernel");
    return true;
}
