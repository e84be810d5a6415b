/* Prefill attention on the tensor cores (WMMA, f16 inputs, f32 accumulation).
 *
 * The tokens of a batch are cut into tiles of up to 16 consecutive positions of one
 * sequence (a prompt chunk makes full tiles). A warp takes one (tile, query head)
 * and walks the sequence's KV blocks: the cache's block size is 16, so one block is
 * one 16x16 tile of scores S = Q K^T (head_dim / 16 products), then an online
 * softmax per query row (running max and sum, the row's output rescaled), then
 * O += P V with P rounded to f16, as the CPU reference rounds its softmax weights.
 * Each query row's result depends only on its own query, position and window: its
 * tile mates only decide how many blocks the warp visits, and a block a row cannot
 * see leaves that row exactly unchanged. So results do not depend on the batch
 * around a token, within this path; they differ from the scalar kernel's (used for
 * decode and small batches) by f16 rounding of the weights, ~1e-3 relative.
 *
 * Used for unrecorded passes of more than mv_max_n tokens with an F16 cache of block
 * size 16 and head sizes 64, 128 or 256, when tokens come in runs (tiles of 4 or
 * more tokens on average); anything else takes the scalar kernel. */
#include <mma.h>

#include "backend/cuda/cuda_internal.cuh"

using namespace nvcuda;

enum { TC_ROWS = 16 };

template <int HD>
__global__ void __launch_bounds__(32)
    attn_tc_kernel(const int32_t *__restrict__ meta, const int32_t *__restrict__ tiles, int n, int n_head, int group,
                   int64_t d_kv, const __half *__restrict__ K, const __half *__restrict__ V,
                   const float *__restrict__ q, int64_t window, float scale, float *__restrict__ out) {
    __shared__ __align__(32) __half q_sh[TC_ROWS][HD];
    __shared__ __align__(32) __half v_sh[TC_ROWS][HD];
    __shared__ __align__(32) float o_sh[TC_ROWS][HD];
    __shared__ __align__(32) float s_sh[TC_ROWS][TC_ROWS];
    __shared__ __align__(32) __half p_sh[TC_ROWS][TC_ROWS];
    __shared__ float m_sh[TC_ROWS], l_sh[TC_ROWS], c_sh[TC_ROWS];
    __shared__ int pos_sh[TC_ROWS], lo_sh[TC_ROWS];
    const int lane = threadIdx.x, h = blockIdx.y, hk = h / group;
    const int t0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];

    for (int i = lane; i < TC_ROWS * HD; i += 32) {
        const int r = i / HD, d = i % HD;
        const float v = r < cnt ? q[((int64_t)(t0 + r) * n_head + h) * HD + d] : 0.0f;
        q_sh[r][d] = __float2half_rn(v);
        o_sh[r][d] = 0.0f;
    }
    if (lane < TC_ROWS) {
        const int p = lane < cnt ? meta[t0 + lane] : -1;
        pos_sh[lane] = p;
        lo_sh[lane] = window > 0 && p - window + 1 > 0 ? (int)(p - window + 1) : 0;
        m_sh[lane] = -INFINITY;
        l_sh[lane] = 0.0f;
    }
    __syncwarp();
    const int32_t *table = meta + meta[n + t0];
    const int first = lo_sh[0] / TC_ROWS, last = pos_sh[cnt - 1] / TC_ROWS;
    const int64_t head_off = (int64_t)hk * HD;

    for (int kb = first; kb <= last; kb++) {
        const int64_t slot0 = (int64_t)table[kb] * TC_ROWS;
        const __half *Kb = K + slot0 * d_kv + head_off;
        /* scores: the 16 keys of the block against the 16 queries */
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
        wmma::fill_fragment(sf, 0.0f);
#pragma unroll
        for (int c = 0; c < HD / 16; c++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
            wmma::load_matrix_sync(a, &q_sh[0][c * 16], HD);
            wmma::load_matrix_sync(b, Kb + c * 16, (unsigned)d_kv);
            wmma::mma_sync(sf, a, b, sf);
        }
        wmma::store_matrix_sync(&s_sh[0][0], sf, TC_ROWS, wmma::mem_row_major);
        /* value rows past the last position may never have been written (any bits,
         * NaN included): they come in as zeros, so 0-weights stay 0 */
        const __half *Vb = V + slot0 * d_kv + head_off;
        const int max_p = pos_sh[cnt - 1];
        for (int i = lane; i < TC_ROWS * (HD / 8); i += 32) {
            const int j = i / (HD / 8), c = i % (HD / 8);
            uint4 u = make_uint4(0, 0, 0, 0);
            if (kb * TC_ROWS + j <= max_p) u = *(const uint4 *)(Vb + (int64_t)j * d_kv + 8 * c);
            *(uint4 *)&v_sh[j][8 * c] = u;
        }
        __syncwarp();
        if (lane < TC_ROWS) {
            const int r = lane;
            const float m_old = m_sh[r];
            float sv[TC_ROWS], mx = m_old;
#pragma unroll
            for (int j = 0; j < TC_ROWS; j++) {
                const int p = kb * TC_ROWS + j;
                const bool ok = r < cnt && p >= lo_sh[r] && p <= pos_sh[r];
                sv[j] = ok ? __fmul_rn(scale, s_sh[r][j]) : -INFINITY;
                mx = fmaxf(mx, sv[j]);
            }
            const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - mx);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < TC_ROWS; j++) {
                const __half e = __float2half_rn(sv[j] == -INFINITY ? 0.0f : expf(sv[j] - mx));
                p_sh[r][j] = e;
                sum += __half2float(e); /* normalize by the weights actually applied */
            }
            l_sh[r] = l_sh[r] * corr + sum;
            m_sh[r] = mx;
            c_sh[r] = corr;
        }
        __syncwarp();
        for (int i = lane; i < TC_ROWS * HD; i += 32) o_sh[i / HD][i % HD] *= c_sh[i / HD];
        __syncwarp();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, &p_sh[0][0], TC_ROWS);
#pragma unroll
        for (int c = 0; c < HD / 16; c++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;
            wmma::load_matrix_sync(of, &o_sh[0][c * 16], HD, wmma::mem_row_major);
            wmma::load_matrix_sync(vb, &v_sh[0][c * 16], HD);
            wmma::mma_sync(of, pa, vb, of);
            wmma::store_matrix_sync(&o_sh[0][c * 16], of, HD, wmma::mem_row_major);
        }
        __syncwarp();
    }
    for (int i = lane; i < cnt * HD; i += 32) {
        const int r = i / HD, d = i % HD;
        out[((int64_t)(t0 + r) * n_head + h) * HD + d] = o_sh[r][d] / l_sh[r];
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
                          int64_t window, float scale, float *out) {
    const int64_t n = batch->n_tokens;
    if (lm_cuda_recorded_pass(cu) || n <= cu->mv_max_n || kv->type != LM_DTYPE_F16 || kv->block_size != TC_ROWS ||
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
        attn_tc_kernel<64><<<grid, 32, 0, cu->stream>>>(meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q,
                                                        window, scale, out);
        break;
    case 128:
        attn_tc_kernel<128><<<grid, 32, 0, cu->stream>>>(meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q,
                                                         window, scale, out);
        break;
    default:
        attn_tc_kernel<256><<<grid, 32, 0, cu->stream>>>(meta, tiles, (int)n, (int)n_head, group, d_kv, K, V, q,
                                                         window, scale, out);
        break;
    }
    lm_cuda_launched(cu, "attn_tc_kernel");
    return true;
}
