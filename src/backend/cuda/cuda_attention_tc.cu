/* Prefill attention on the tensor cores (WMMA, f16 inputs, f32 accumulation).
 *
 * The tokens of a batch are cut into tiles of up to 16 consecutive positions of one
 * sequence (a prompt chunk makes full tiles). A warp takes one (tile, query head)
 * and walks the sequence's KV blocks: the cache's block size is 16, so one block is
 * one 16x16 tile of scores S = Q K^T (mma.sync m16n8k16, f32 accumulation), then an
 * online softmax per query row (running max and sum, the row's output rescaled),
 * then O += P V with P rounded to f16, as the CPU reference rounds its softmax
 * weights. (A first version through WMMA and shared memory took 222 us a layer for
 * a 512-token prompt of a 1.5B model; the scalar kernel 264.)
 * Each query row's result depends only on its own query, position and window: its
 * tile mates only decide how many blocks the warp visits, and a block a row cannot
 * see leaves that row exactly unchanged. So results do not depend on the batch
 * around a token, within this path; they differ from the scalar kernel's (used for
 * decode and small batches) by f16 rounding of the weights, ~1e-3 relative.
 *
 * Used for unrecorded passes of more than 4 tokens (and more than mv_max_n, the exact
 * mode's threshold) with an F16 cache of block size 16 and head sizes 64, 128 or 256,
 * when tokens come in runs (tiles of 4 or more tokens on average); anything else
 * takes the scalar kernel. */
#include "backend/cuda/cuda_attention_tc.cuh"

/* A warp per (tile of up to 16 queries, head). Everything stays in registers: the
 * scores of a KV block come out of the products in the accumulator layout, which is
 * the A layout of the next product (two n8 tiles = one k16), so P never leaves them. */
template <int HD>
__global__ void __launch_bounds__(32)
    attn_tc_kernel(const int32_t *__restrict__ meta, const int32_t *__restrict__ tiles, int n, int n_head, int group,
                   int64_t d_kv, const __half *__restrict__ K, const __half *__restrict__ V,
                   const float *__restrict__ q, int64_t window, float scale, float *__restrict__ out,
                   __nv_bfloat16 *__restrict__ outb) {
    lm_pdl_enter();
    const int lane = threadIdx.x, h = blockIdx.y, hk = h / group, g = lane >> 2, c2 = 2 * (lane & 3);
    const int t0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];
    /* this thread's two query rows g and g + 8: position and window start */
    int pos[2], lo[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        pos[i] = r < cnt ? meta[t0 + r] : -1;
        lo[i] = window > 0 && pos[i] - window + 1 > 0 ? (int)(pos[i] - window + 1) : 0;
    }
    /* the tile's positions are the rows (Q rounded to f16 as the scalar kernel rounds it) */
    uint32_t qa[HD / 16][4];
    float o[HD / 8][4], m[2], l[2];
    tc_start_rows<HD>(q + ((int64_t)t0 * n_head + h) * HD, (int64_t)n_head * HD, cnt, g, c2, qa, o, m, l);

    const int32_t *table = meta + meta[n + t0];
    const int first_pos = meta[t0], last_pos = meta[t0 + cnt - 1];
    const int first_lo = window > 0 && first_pos - window + 1 > 0 ? (int)(first_pos - window + 1) : 0;
    const int64_t head_off = (int64_t)hk * HD;
    const int kb_first = first_lo / TC_ROWS, kb_last = last_pos / TC_ROWS;
    uint32_t kf[tc_early(HD) ? HD / 16 : 1][2][2];
    int32_t blk = table[kb_first];
    if constexpr (tc_early(HD)) load_keys<HD>(K, blk, d_kv, head_off, g, c2, kf);
    for (int kb = kb_first; kb <= kb_last; kb++)
        tc_attend_block<HD, false>(K, V, table, kb, kb < kb_last ? kb + 1 : -1, blk, last_pos - kb * TC_ROWS, d_kv,
                                   head_off, g, c2, qa, kf, lo, pos, scale, m, l, o);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        if (r >= cnt) continue;
        const int64_t row = ((int64_t)(t0 + r) * n_head + h) * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            const float a = o[j][2 * i] / l[i], b = o[j][2 * i + 1] / l[i];
            out[row + j * 8 + c2] = a;
            out[row + j * 8 + c2 + 1] = b;
            if (outb) *(__nv_bfloat162 *)(outb + row + j * 8 + c2) = __floats2bfloat162_rn(a, b);
        }
    }
}

/* Tiles of the batch: runs of consecutive positions of one sequence, at most 16
 * tokens each; [first token, count] pairs in cu->tc_tiles. Returns the count. */
static int64_t make_tiles(lm_cuda_backend *cu, const lm_attn_batch *batch) {
    const int64_t n = batch->n_tokens;
    if (cu->tc_tiles_cap < 2 * n) {
        int32_t *t = (int32_t *)realloc(cu->tc_tiles, sizeof(int32_t) * (size_t)(2 * n));
        if (!t) return -1;
        cu->tc_tiles = t;
        cu->tc_tiles_cap = 2 * n;
    }
    int64_t n_tiles = 0;
    for (int64_t t = 0; t < n; t++) {
        int32_t *cur = cu->tc_tiles + 2 * (n_tiles - 1);
        bool extend = n_tiles > 0 && cur[1] < TC_ROWS && batch->seq[t] == batch->seq[t - 1] &&
                      batch->pos[t] == batch->pos[t - 1] + 1;
        if (extend) {
            cur[1]++;
        } else {
            cu->tc_tiles[2 * n_tiles] = (int32_t)t;
            cu->tc_tiles[2 * n_tiles + 1] = 1;
            n_tiles++;
        }
    }
    return n_tiles;
}

bool lm_cuda_attention_tc(lm_cuda_backend *cu, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                          const int32_t *meta, const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                          int64_t window, float scale, float *out, __nv_bfloat16 *outb) {
    const int64_t n = batch->n_tokens;
    if (lm_cuda_recorded_pass(cu) || n <= 4 || n <= cu->mv_max_n || kv->type != LM_DTYPE_F16 || kv->block_size != TC_ROWS ||
        (head_dim != 64 && head_dim != 128 && head_dim != 256) || n > INT32_MAX / 2)
        return false;
    const int64_t n_tiles = make_tiles(cu, batch);
    if (n_tiles <= 0 || n_tiles * 4 > n || n_tiles > INT32_MAX) return false; /* short runs: decode-like */
    const int32_t *tiles = (const int32_t *)lm_cuda_meta_upload(cu, LM_CUDA_META_TILES, cu->tc_tiles,
                                                               sizeof(int32_t) * (size_t)(2 * n_tiles));
    if (!tiles) return true; /* error recorded */
    const int64_t d_kv = kv->n_embd_kv;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d_kv) * kv->elem_size;
    const __half *K = (const __half *)((const uint8_t *)kv->k + layer_off);
    const __half *V = (const __half *)((const uint8_t *)kv->v + layer_off);
    dim3 grid((unsigned)n_tiles, (unsigned)n_head);
    const int group = (int)(n_head / n_head_kv);
    switch (head_dim) {
    case 64:
        lm_cuda_launch(cu, attn_tc_kernel<64>, grid, 32, meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q, window,
                       scale, out, outb);
        break;
    case 128:
        lm_cuda_launch(cu, attn_tc_kernel<128>, grid, 32, meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q,
                       window, scale, out, outb);
        break;
    default:
        lm_cuda_launch(cu, attn_tc_kernel<256>, grid, 32, meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q,
                       window, scale, out, outb);
        break;
    }
    lm_cuda_launched(cu, "attn_tc_kernel");
    return true;
}
