/* Decode-sized matrix products on the tensor cores: y[t][r] = sum_k W[r][k] x[t][k]
 * for batches of up to tc_max_n tokens (LUMEN_CUDA_TC_MAX_N), weights of any format
 * but F32, widths a multiple of 32.
 *
 * A decode step is bound by reading the weights, so the kernels keep many weight loads
 * in flight and let the tensor cores do the arithmetic of many tokens for the price of
 * one. The unit of work is a 16-row tile and a 32-column chunk: lane (g = lane / 4,
 * t = lane % 4) of a warp reads the 8 contiguous weights 8t..8t+7 of rows g and g + 8
 * (deq8 decodes any format; rounded to bf16) and the mma.sync m16n8k16 takes them as
 * its A fragment under a permutation of k: the fragment's k slots {2t, 2t+1, 2t+8,
 * 2t+9} of the first mma hold the chunk's 8t..8t+3, those of the second its 8t+4..8t+7.
 * The activations (token g of each 8-token tile) are rounded to bf16 and enter as the
 * B fragment under the same permutation; a sum over k does not care which k sits in
 * which slot as long as W and x agree. Sums are f32.
 *
 * The summation order, one for every batch size the path serves: a row's chunks are
 * cut into P contiguous parts of L = ceil(chunks / P) chunks (P = 1, 2, 4 or 8, from the
 * column count only: tc_order_of); a part's sum is one chain of mmas over its chunks in
 * ascending order (two per chunk, as above), starting from zero; the parts' sums are
 * added in part order, ((s0 + s1) + s2) + .... An mma's output element depends only on
 * its own row and column, so a token's result is the same bits whatever batch it is in
 * and whichever kernel below computes it. (Until tc_wide_kernel the parts interleaved,
 * part p taking chunks p, p + P, ...: a kernel that walks the parts one after another
 * would then read each weight row in 64-byte pieces eight times over, or hold eight
 * parts' sums at once; contiguous parts read a row front to back.)
 *
 *  - tc_kernel (n < tc_wide_min_n): a block of 8 warps covers 16-row tiles with one
 *    warp per part of a tile (the parts run side by side, so few rows still fill the
 *    GPU), each warp reading its activations for 8-32 tokens straight from global
 *    memory (f32, rounded as loaded); the tile's warps are added in part order in
 *    shared memory. 64-126 registers, up to 16 KiB of shared memory.
 *  - tc_wide_kernel (n >= tc_wide_min_n: 33 unless LUMEN_CUDA_TC_WIDE_N says lower,
 *    to compare the two on 5-32 tokens): a block covers 128 rows (8 warps of one 16-row
 *    tile) and 64 tokens, so each activation it stages serves 128 rows where
 *    tc_kernel's serves 16 (tc_kernel re-read the f32 activations from L2 for every 16
 *    rows, which made it slower than cuBLAS at 64 tokens). The block walks its chunks
 *    in order, 3 per step: a step's activations are copied to shared memory
 *    (cp.async, f32, each thread its own 8 columns of a token), rounded to bf16 once
 *    into the B fragments' layout and read by all 8 warps; each warp's weights go from
 *    global memory straight into its A fragments, loaded one step ahead and asked into
 *    L2 two steps ahead. A thread keeps the running sum of the finished parts in
 *    shared memory beside the current part's chain in registers, and adds the chain in
 *    when the part ends: the order above. When row blocks x token groups are fewer than
 *    the GPU's SMs (Q/K/V, the output and down projections of a small model), the parts
 *    are split over up to P blocks: the block of the first parts adds them as above and
 *    stores the sum, the others store each part's sum (LM_CUDA_SCR_Y), and the last of
 *    each tile's warps to finish (a counter per tile in LM_CUDA_SCR_COUNTS, left at
 *    zero) adds them in part order. 122-128 registers (launch bounds: two blocks an
 *    SM), no spills; 80 KiB of dynamic shared memory (24 KiB f32 staging, 2 x 12 KiB
 *    bf16 fragments, 32 KiB running sums).
 *
 * Cost: tc_wide_kernel reads each weight from memory once and once more from L2 for
 * every further 64 tokens, and the f32 activations once per 128 rows, so it was
 * estimated to beat the GEMM path up to 128 tokens. Measured on the H200 (1.5B bf16,
 * 2026-11-30), decode with it took 7.8 ms a step at 64 sequences against 4.1 ms on
 * the GEMM path, and 16.4 against 6.0 at 256; not yet profiled. So tc_max_n stays 32
 * and tc_wide_kernel serves only raised LUMEN_CUDA_TC_MAX_N (decode invariant across
 * batch sizes) and LUMEN_CUDA_TC_WIDE_N. */
#include <limits.h>
#include <stdlib.h>

#include "backend/cuda/cuda_matmul.cuh"

enum { TC_WARPS = 8, TC_THREADS = 32 * TC_WARPS, TC_UNROLL = 4 };

/* tc_wide_kernel: 8 warps of one 16-row tile each, 64 tokens (8 tiles of 8), 3 chunks a
 * step. TW_THREADS == 4 * TW_TOKENS: thread i stages token i / 4, columns 8 (i % 4).. */
enum {
    TW_WARPS = 8,
    TW_THREADS = 32 * TW_WARPS,
    TW_ROWS = 16 * TW_WARPS,
    TW_NT = 8,
    TW_TOKENS = 8 * TW_NT,
    TW_STEP = 3,
    TW_MIN_N = 33, /* default tc_wide_min_n: larger batches take tc_wide_kernel */
};
static_assert(TW_THREADS == 4 * TW_TOKENS, "one staging thread per 8 columns of a token");

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

/* bf16 rows are the fragment already (loaded as deq8 loads them: past L1) */
template <>
__device__ __forceinline__ void tc_load_w<LM_DTYPE_BF16>(const uint8_t *__restrict__ row, int c, uint32_t *a) {
    const uint4 u = lm_ld_weights16((const uint4 *)row + c);
    a[0] = u.x, a[1] = u.y, a[2] = u.z, a[3] = u.w;
}

/* The A fragments of one chunk of a 16-row tile: 8-element unit c8 (= 4 chunk + t) of
 * rows w_lo (g) and w_hi (g + 8), zeros for a row past the end (NULL), in the order of
 * the two mmas' operands: {g: 8t..8t+1, g+8: 8t.., g: 8t+2..8t+3, g+8: 8t+2..} for the
 * first, the same of 8t+4..8t+7 for the second. */
template <int T>
__device__ __forceinline__ void tc_load_a(const uint8_t *w_lo, const uint8_t *w_hi, int c8, uint32_t a[8]) {
    uint32_t lo[4] = {0u, 0u, 0u, 0u}, hi[4] = {0u, 0u, 0u, 0u};
    if (w_lo) tc_load_w<T>(w_lo, c8, lo);
    if (w_hi) tc_load_w<T>(w_hi, c8, hi);
    a[0] = lo[0], a[1] = hi[0], a[2] = lo[1], a[3] = hi[1];
    a[4] = lo[2], a[5] = hi[2], a[6] = lo[3], a[7] = hi[3];
}

/* One chunk of a 16-row tile against one 8-token tile: the two mmas of the order. a: as
 * tc_load_a leaves it; b0..b3: the tokens' 8t..8t+7 as bf16 pairs. */
__device__ __forceinline__ void tc_chunk(float d[4], const uint32_t a[8], uint32_t b0, uint32_t b1, uint32_t b2,
                                         uint32_t b3) {
    tc_mma(d, a[0], a[1], a[2], a[3], b0, b1);
    tc_mma(d, a[4], a[5], a[6], a[7], b2, b3);
}

/* Row r of the set: its weight k and its row of weight k's data (NULL past the end). */
__device__ __forceinline__ const uint8_t *tc_row(const mv_set &set, int r, int *k) {
    *k = 0;
    if (r >= set.end[set.n_w - 1]) return NULL;
    *k = mv_which(set, r);
    return set.W[*k] + (size_t)(r - (*k ? set.end[*k - 1] : 0)) * set.row_bytes[*k];
}

/* y of row r (weight k), token tok */
__device__ __forceinline__ void tc_store_y(const mv_set &set, int r, int k, int tok, float v) {
    set.y[k][(size_t)tok * set.rows[k] + (r - (k ? set.end[k - 1] : 0))] = v;
}

/* NT: 8-token tiles per block (1, 2 or 4). Block = TC_WARPS warps over TC_WARPS / wpt
 * row tiles, warp `part` of a tile summing part `part` (chunks [part * part_len, ...));
 * blockIdx.x = row block * n_groups + token group, the group fastest, so the groups of
 * one row block run together and share its weights in L2. */
template <int T, int NT>
__global__ void __launch_bounds__(TC_THREADS)
    tc_kernel(const __grid_constant__ mv_set set, int n_chunks, int cols, const float *__restrict__ x, int n, int wpt,
              int n_groups, int part_len, int n_parts) {
    lm_pdl_enter();
    __shared__ float red[TC_WARPS][NT][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int group = blockIdx.x % n_groups;
    const int tile = (blockIdx.x / n_groups) * (TC_WARPS / wpt) + warp / wpt, part = warp % wpt;
    const int rows_all = set.end[set.n_w - 1];
    const int r_lo = tile * 16 + g, r_hi = r_lo + 8, tok0 = group * NT * 8;
    int k_lo, k_hi;
    const uint8_t *w_lo = tc_row(set, r_lo, &k_lo), *w_hi = tc_row(set, r_hi, &k_hi);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    const int c_lo = part * part_len, c_hi = min(c_lo + part_len, n_chunks);
    if (tile * 16 < rows_all) {
        for (int c0 = c_lo; c0 < c_hi; c0 += TC_UNROLL) {
            /* every weight load of the unrolled chunks first, so they are in flight
             * together */
            uint32_t a[TC_UNROLL][8];
#pragma unroll
            for (int u = 0; u < TC_UNROLL; u++) {
                const int c = c0 + u;
                if (c < c_hi) tc_load_a<T>(w_lo, w_hi, 4 * c + t, a[u]);
            }
#pragma unroll
            for (int u = 0; u < TC_UNROLL; u++) {
                const int c = c0 + u;
                if (c >= c_hi) break;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int tok = tok0 + j * 8 + g;
                    uint32_t b0 = 0u, b1 = 0u, b2 = 0u, b3 = 0u;
                    if (tok < n) {
                        const float4 *xp = (const float4 *)(x + (size_t)tok * cols + 32 * c + 8 * t);
                        const float4 p = xp[0], q = xp[1];
                        b0 = tc_pack(p.x, p.y), b1 = tc_pack(p.z, p.w), b2 = tc_pack(q.x, q.y), b3 = tc_pack(q.z, q.w);
                    }
                    tc_chunk(acc[j], a[u], b0, b1, b2, b3);
                }
            }
        }
    }

    if (wpt > 1) { /* the tile's parts added in part order */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][j][i][lane] = acc[j][i];
        __syncthreads();
        if (part != 0) return;
        for (int p = 1; p < n_parts; p++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[j][i] += red[warp + p][j][i][lane];
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i < 2 ? r_lo : r_hi, tok = tok0 + j * 8 + 2 * t + (i & 1);
            if (r < rows_all && tok < n) tc_store_y(set, r, i < 2 ? k_lo : k_hi, tok, acc[j][i]);
        }
}

/* ---- tc_wide_kernel ---------------------------------------------------------------- */

__device__ __forceinline__ void tw_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"((uint64_t)__cvta_generic_to_global(src))
                 : "memory");
}
__device__ __forceinline__ void tw_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void tw_cp_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* Chunks of the step that starts at chunk c: up to TW_STEP, never past its part. */
__device__ __forceinline__ int tw_step_len(int c, int part_len, int n_chunks) {
    return min(TW_STEP, min((c / part_len + 1) * part_len, n_chunks) - c);
}

/* Asks L2 for the 128-byte lines of chunks [c, c + cnt) of a row (row_bytes rb, cols
 * columns; every format lays its elements out in order, so they lie in [32c rb / cols,
 * 32(c + cnt) rb / cols), headers included), below lim (the end of the weight's data):
 * two lanes a row, half = 0 or 1 taking lines 0-1 or 2-3 of the range. A hint: it
 * changes no result. */
__device__ __forceinline__ void tw_prefetch(const uint8_t *row, size_t rb, int cols, uintptr_t lim, int c, int cnt,
                                            int half) {
    const uintptr_t b = (uintptr_t)(row + (size_t)32 * c * rb / cols) & ~(uintptr_t)127;
    const uintptr_t e = (uintptr_t)(row + ((size_t)32 * (c + cnt) * rb + cols - 1) / cols);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const uintptr_t p = b + 128 * (2 * half + q);
        if (p < e && p < lim)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"((uint64_t)__cvta_generic_to_global((const void *)p)));
    }
}

/* The A fragments of chunks [c, c + cnt) of the warp's rows (zeros for rows past the end) */
template <int T>
__device__ __forceinline__ void tw_load_a(const uint8_t *w_lo, const uint8_t *w_hi, int c, int cnt, int t,
                                          uint32_t a[TW_STEP][8]) {
#pragma unroll
    for (int s = 0; s < TW_STEP; s++)
        if (s < cnt) tc_load_a<T>(w_lo, w_hi, 4 * (c + s) + t, a[s]);
}

/* The 8 token tiles' sums of one tile as float4s at partial[(base + j) * 32 + lane]. */
__device__ __forceinline__ void tw_store_partial(float4 *partial, size_t base, const float v[TW_NT][4], int ntv,
                                                 int lane) {
#pragma unroll
    for (int j = 0; j < TW_NT; j++)
        if (j < ntv) __stcg(&partial[(base + j) * 32 + lane], make_float4(v[j][0], v[j][1], v[j][2], v[j][3]));
}

/* Shared memory of tc_wide_kernel (dynamic: more than the 48 KiB of static shared
 * memory): a step's activations as copied (f32, each thread its own 8 columns of each
 * chunk) and in the B fragments' layout (bf16, double-buffered: [buffer][chunk][token][t]),
 * and each thread's running sum of its finished parts. */
struct tw_shared {
    float4 xf[TW_STEP][2][TW_THREADS];
    uint4 xb[2][TW_STEP][TW_TOKENS][4];
    float4 tot[TW_NT][TW_THREADS];
};
static constexpr size_t TW_SMEM = sizeof(tw_shared);

/* This thread's f32 activations of a step of cnt chunks (its own copies: visible to it
 * once waited for) rounded to bf16 into buffer b; zeros for a token past n. */
__device__ __forceinline__ void tw_round(tw_shared &sh, int b, int cnt, bool ok, int tid) {
#pragma unroll
    for (int s = 0; s < TW_STEP; s++)
        if (s < cnt) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (ok) {
                const float4 f0 = sh.xf[s][0][tid], f1 = sh.xf[s][1][tid];
                v = make_uint4(tc_pack(f0.x, f0.y), tc_pack(f0.z, f0.w), tc_pack(f1.x, f1.y), tc_pack(f1.z, f1.w));
            }
            sh.xb[b][s][tid >> 2][tid & 3] = v;
        }
}

/* One step of the warp's tile: cnt chunks against the token tiles (the first ntv of
 * them when PARTIAL). */
template <bool PARTIAL>
__device__ __forceinline__ void tw_compute(float cur[TW_NT][4], const uint32_t a[TW_STEP][8],
                                           const uint4 (*xb)[TW_TOKENS][4], int cnt, int ntv, int g, int t) {
#pragma unroll
    for (int s = 0; s < TW_STEP; s++)
        if (s < cnt)
#pragma unroll
            for (int j = 0; j < TW_NT; j++)
                if (!PARTIAL || j < ntv) {
                    const uint4 b = xb[s][8 * j + g][t];
                    tc_chunk(cur[j], a[s], b.x, b.y, b.z, b.w);
                }
}

/* Block: rows [128 rb, +128) (warp w: the tile at 128 rb + 16 w), tokens [64 tg, +64),
 * parts [pg * group_parts, +group_parts) of n_parts; blockIdx.x = (rb * n_tgroups + tg)
 * * n_pgroups + pg, the part groups, then the token groups fastest, so the blocks of one
 * row block run together (its weights are read from memory once). With n_pgroups > 1,
 * partial holds n_parts - group_parts + 1 slots of each (rb, tg, warp) tile: slot 0 the
 * first group's sum, slot s the sum of part group_parts + s - 1; counts one counter per
 * (rb, tg, warp), zero on entry and on exit. */
template <int T>
__global__ void __launch_bounds__(TW_THREADS, 2)
    tc_wide_kernel(const __grid_constant__ mv_set set, int n_chunks, int cols, const float *__restrict__ x, int n,
                   int part_len, int n_parts, int group_parts, int n_pgroups, int n_tgroups,
                   float4 *__restrict__ partial, int *__restrict__ counts) {
    extern __shared__ __align__(16) uint8_t tw_smem[];
    tw_shared &sh = *reinterpret_cast<tw_shared *>(tw_smem);
    lm_pdl_enter();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int pg = blockIdx.x % n_pgroups, unit = blockIdx.x / n_pgroups;
    const int tok0 = (unit % n_tgroups) * TW_TOKENS, row0 = (unit / n_tgroups) * TW_ROWS + warp * 16;
    const int rows_all = set.end[set.n_w - 1];
    const bool active = row0 < rows_all;
    const int ntv = min(TW_NT, (n - tok0 + 7) >> 3); /* token tiles with a token */
    const int r_lo = row0 + g, r_hi = r_lo + 8;
    int k_lo, k_hi;
    const uint8_t *w_lo = tc_row(set, r_lo, &k_lo), *w_hi = tc_row(set, r_hi, &k_hi);

    /* staging: this thread copies token s_tok's columns 8 s_t..8 s_t+7 of each chunk */
    const int s_tok = tid >> 2, s_t = tid & 3;
    const bool s_ok = tok0 + s_tok < n;
    const float *s_src = x + (size_t)(s_ok ? tok0 + s_tok : 0) * cols + 8 * s_t;

    /* L2 prefetch: lanes i and i + 16 ask for row row0 + i */
    int pf_k;
    const uint8_t *pf = tc_row(set, row0 + (lane & 15), &pf_k);
    const size_t pf_rb = set.row_bytes[pf_k];
    const uintptr_t pf_lim = (uintptr_t)set.W[pf_k] + (size_t)set.rows[pf_k] * pf_rb;
    const int pf_half = lane >> 4;

    const int p_first = pg * group_parts, n_slots = n_parts - group_parts + 1;
    const int c_end = min(min(p_first + group_parts, n_parts) * part_len, n_chunks);
    int c = p_first * part_len, cnt = tw_step_len(c, part_len, n_chunks);

    float cur[TW_NT][4];
#pragma unroll
    for (int j = 0; j < TW_NT; j++) cur[j][0] = cur[j][1] = cur[j][2] = cur[j][3] = 0.0f;
    uint32_t a[TW_STEP][8];

    /* step 0 staged; step 1 copying and asked into L2; step 0's weights loading */
#pragma unroll
    for (int s = 0; s < TW_STEP; s++)
        if (s < cnt && s_ok) {
            tw_cp16(&sh.xf[s][0][tid], s_src + 32 * (c + s));
            tw_cp16(&sh.xf[s][1][tid], s_src + 32 * (c + s) + 4);
        }
    tw_cp_commit();
    tw_cp_wait();
    tw_round(sh, 0, cnt, s_ok, tid);
    {
        const int c1 = c + cnt, cnt1 = c1 < c_end ? tw_step_len(c1, part_len, n_chunks) : 0;
#pragma unroll
        for (int s = 0; s < TW_STEP; s++)
            if (s < cnt1 && s_ok) {
                tw_cp16(&sh.xf[s][0][tid], s_src + 32 * (c1 + s));
                tw_cp16(&sh.xf[s][1][tid], s_src + 32 * (c1 + s) + 4);
            }
        tw_cp_commit();
        if (cnt1 && pf) tw_prefetch(pf, pf_rb, cols, pf_lim, c1, cnt1, pf_half);
    }
    if (active) tw_load_a<T>(w_lo, w_hi, c, cnt, t, a);
    __syncthreads();

    int buf = 0;
    while (c < c_end) { /* the same steps in every thread */
        const int c1 = c + cnt, cnt1 = c1 < c_end ? tw_step_len(c1, part_len, n_chunks) : 0;
        const int c2 = c1 + cnt1, cnt2 = c2 < c_end ? tw_step_len(c2, part_len, n_chunks) : 0;
        if (cnt2 && pf) tw_prefetch(pf, pf_rb, cols, pf_lim, c2, cnt2, pf_half);
        /* step c1's activations: wait for this thread's copies, round them into the
         * other buffer (its last readers passed the barrier closing the last step) */
        if (cnt1) {
            tw_cp_wait();
            tw_round(sh, buf ^ 1, cnt1, s_ok, tid);
        }
        /* step c2's copies into this thread's own f32 slots, just read */
#pragma unroll
        for (int s = 0; s < TW_STEP; s++)
            if (s < cnt2 && s_ok) {
                tw_cp16(&sh.xf[s][0][tid], s_src + 32 * (c2 + s));
                tw_cp16(&sh.xf[s][1][tid], s_src + 32 * (c2 + s) + 4);
            }
        tw_cp_commit();

        if (active) {
            /* all 8 token tiles without a test where the group is full, so the 8
             * independent chains interleave */
            if (ntv == TW_NT) tw_compute<false>(cur, a, sh.xb[buf], cnt, ntv, g, t);
            else tw_compute<true>(cur, a, sh.xb[buf], cnt, ntv, g, t);
            if (c + cnt == min((c / part_len + 1) * part_len, n_chunks)) { /* the end of part p */
                const int p = c / part_len;
                if (pg == 0) { /* tot = part 0's sum, then tot + the sum of each next part */
#pragma unroll
                    for (int j = 0; j < TW_NT; j++)
                        if (j < ntv) {
                            float4 v = make_float4(cur[j][0], cur[j][1], cur[j][2], cur[j][3]);
                            if (p > 0) {
                                const float4 o = sh.tot[j][tid];
                                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                            }
                            sh.tot[j][tid] = v;
                        }
                } else {
                    const size_t slot = (size_t)unit * n_slots + (p - group_parts + 1);
                    tw_store_partial(partial, (slot * TW_WARPS + warp) * TW_NT, cur, ntv, lane);
                }
#pragma unroll
                for (int j = 0; j < TW_NT; j++) cur[j][0] = cur[j][1] = cur[j][2] = cur[j][3] = 0.0f;
            }
            if (cnt1) tw_load_a<T>(w_lo, w_hi, c1, cnt1, t, a);
        }
        __syncthreads();
        c = c1, cnt = cnt1, buf ^= 1;
    }

    if (!active) return;
    /* the sum into cur: tot (this thread's own), or the slots added in part order */
    if (n_pgroups == 1) {
#pragma unroll
        for (int j = 0; j < TW_NT; j++)
            if (j < ntv) {
                const float4 v = sh.tot[j][tid];
                cur[j][0] = v.x, cur[j][1] = v.y, cur[j][2] = v.z, cur[j][3] = v.w;
            }
    } else {
        /* the tile's sums to memory; the last of its n_pgroups warps adds them */
        if (pg == 0) {
            const size_t base = ((size_t)unit * n_slots * TW_WARPS + warp) * TW_NT;
#pragma unroll
            for (int j = 0; j < TW_NT; j++)
                if (j < ntv) __stcg(&partial[(base + j) * 32 + lane], sh.tot[j][tid]);
        }
        __threadfence();
        __syncwarp();
        int last = 0;
        if (lane == 0) {
            int *cnt_p = &counts[unit * TW_WARPS + warp];
            last = atomicAdd(cnt_p, 1) + 1 == n_pgroups;
            if (last) *cnt_p = 0; /* ready for the next call */
        }
        if (!__shfl_sync(0xffffffffu, last, 0)) return;
        __threadfence();
        for (int sl = 0; sl < n_slots; sl++) {
            const size_t base = (((size_t)unit * n_slots + sl) * TW_WARPS + warp) * TW_NT;
#pragma unroll
            for (int j = 0; j < TW_NT; j++)
                if (j < ntv) {
                    const float4 v = __ldcg(&partial[(base + j) * 32 + lane]);
                    if (sl == 0) {
                        cur[j][0] = v.x, cur[j][1] = v.y, cur[j][2] = v.z, cur[j][3] = v.w;
                    } else {
                        cur[j][0] += v.x, cur[j][1] += v.y, cur[j][2] += v.z, cur[j][3] += v.w;
                    }
                }
        }
    }
#pragma unroll
    for (int j = 0; j < TW_NT; j++)
        if (j < ntv)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i < 2 ? r_lo : r_hi, tok = tok0 + j * 8 + 2 * t + (i & 1);
                if (r < rows_all && tok < n) tc_store_y(set, r, i < 2 ? k_lo : k_hi, tok, cur[j][i]);
            }
}

/* ---- host side ------------------------------------------------------------------------ */

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

/* The path's summation order for rows of `chunks` chunks: `parts` contiguous parts of
 * `len` chunks (the last one shorter). P, a power of two up to 8, is as large as keeps
 * six or more chunks a part: a function of the column count only, so matmul_many's
 * concatenated rows compute exactly as separate products would, and so is every block
 * layout below. (At 1,536 columns, 8 parts of 6 chunks: tc_kernel's 8 warps per tile
 * give the Q/K/V and output projections of a 1.5B model enough warps at 5-32 tokens.) */
typedef struct tc_order {
    int parts, len;
    int warps; /* tc_kernel's warps per tile: P, one per part (parts may be fewer) */
} tc_order;

static tc_order tc_order_of(int64_t chunks) {
    int p = 1;
    while (p < 8 && chunks >= 6 * 2 * p) p *= 2;
    tc_order o;
    o.warps = p;
    o.len = (int)((chunks + p - 1) / p);
    o.parts = (int)((chunks + o.len - 1) / o.len); /* <= p: no empty part */
    return o;
}

/* Batches of at least this many tokens take tc_wide_kernel: TW_MIN_N, or lower with
 * LUMEN_CUDA_TC_WIDE_N (to measure the two kernels against each other; 1..TW_MIN_N).
 * Either kernel gives the same bits. */
static int64_t tc_wide_min_n(void) {
    static int64_t v = 0;
    if (v == 0) {
        const char *e = getenv("LUMEN_CUDA_TC_WIDE_N");
        const int64_t dflt = TW_MIN_N, k = e && e[0] ? (int64_t)atoll(e) : dflt;
        v = k < 1 ? 1 : k > dflt ? dflt : k;
    }
    return v;
}

template <int T>
static void launch_tc(lm_cuda_backend *cu, const mv_set &set, int64_t chunks, int64_t cols, const float *x,
                      int64_t n) {
    const int64_t rows_all = set.end[set.n_w - 1], tiles = (rows_all + 15) / 16;
    const tc_order o = tc_order_of(chunks);
    const int wpt = o.warps, tiles_per_block = TC_WARPS / wpt;
    const int64_t row_blocks = (tiles + tiles_per_block - 1) / tiles_per_block;
    const int nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
    const int64_t groups = (n + 8 * nt - 1) / (8 * nt);
    if (row_blocks * groups > INT_MAX) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "matmul: %lld tokens of %lld rows are too many for one launch",
                     (long long)n, (long long)rows_all);
        return;
    }
    const dim3 grid((unsigned)(row_blocks * groups));
    const int nc = (int)chunks, nn = (int)n, ng = (int)groups, cl = (int)cols;
    switch (nt) {
    case 1: lm_cuda_launch(cu, tc_kernel<T, 1>, grid, TC_THREADS, set, nc, cl, x, nn, wpt, ng, o.len, o.parts); break;
    case 2: lm_cuda_launch(cu, tc_kernel<T, 2>, grid, TC_THREADS, set, nc, cl, x, nn, wpt, ng, o.len, o.parts); break;
    default: lm_cuda_launch(cu, tc_kernel<T, 4>, grid, TC_THREADS, set, nc, cl, x, nn, wpt, ng, o.len, o.parts); break;
    }
    lm_cuda_launched(cu, "tc_kernel");
}

template <int T>
static void launch_tc_wide(lm_cuda_backend *cu, const mv_set &set, int64_t chunks, int64_t cols, const float *x,
                           int64_t n) {
    const int64_t rows_all = set.end[set.n_w - 1];
    const tc_order o = tc_order_of(chunks);
    const int64_t row_blocks = (rows_all + TW_ROWS - 1) / TW_ROWS, tgroups = (n + TW_TOKENS - 1) / TW_TOKENS;
    const int64_t units = row_blocks * tgroups;
    /* parts over more blocks while the blocks are fewer than the SMs (the split changes
     * no result: the order is the same) */
    int pgroups = 1;
    while (pgroups < o.parts && units * pgroups < cu->n_sm) pgroups *= 2;
    const int group_parts = (o.parts + pgroups - 1) / pgroups;
    pgroups = (o.parts + group_parts - 1) / group_parts; /* none empty */
    if (units * pgroups > INT_MAX || units * TW_WARPS > INT_MAX) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "matmul: %lld tokens of %lld rows are too many for one launch",
                     (long long)n, (long long)rows_all);
        return;
    }
    float4 *partial = NULL;
    int *counts = NULL;
    if (pgroups > 1) {
        const int64_t slots = o.parts - group_parts + 1;
        partial = (float4 *)lm_cuda_scratch(cu, LM_CUDA_SCR_Y,
                                            (size_t)(units * slots * TW_WARPS * TW_NT * 32) * sizeof(float4));
        counts = (int *)lm_cuda_scratch(cu, LM_CUDA_SCR_COUNTS, (size_t)(units * TW_WARPS) * sizeof(int));
        if (!partial || !counts) return;
    }
    /* lm_cuda_launch with the dynamic shared memory, which the kernel is allowed once
     * per device (a bit per device; more than 32 devices ask every time), with the
     * largest shared-memory carveout so two blocks fit on an SM */
    static unsigned allowed = 0;
    const unsigned bit = cu->device >= 0 && cu->device < 32 ? 1u << cu->device : 0u;
    if (!bit || !(__atomic_load_n(&allowed, __ATOMIC_RELAXED) & bit)) {
        if (!lm_cuda_ok(cu,
                        cudaFuncSetAttribute(tc_wide_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)TW_SMEM),
                        "tc_wide_kernel (shared memory)") ||
            !lm_cuda_ok(cu,
                        cudaFuncSetAttribute(tc_wide_kernel<T>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared),
                        "tc_wide_kernel (carveout)"))
            return;
        __atomic_fetch_or(&allowed, bit, __ATOMIC_RELAXED);
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3((unsigned)(units * pgroups));
    cfg.blockDim = dim3(TW_THREADS);
    cfg.dynamicSmemBytes = TW_SMEM;
    cfg.stream = cu->stream;
    cfg.attrs = attr;
    cfg.numAttrs = cu->pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, tc_wide_kernel<T>, set, (int)chunks, (int)cols, x, (int)n, o.len, o.parts, group_parts,
                       pgroups, (int)tgroups, partial, counts);
    lm_cuda_launched(cu, "tc_wide_kernel");
}

template <int T>
static void launch_tc_any(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                          float *const *y) {
    if (n > INT_MAX) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "matmul: %lld tokens are too many for one launch", (long long)n);
        return;
    }
    const mv_set set = mv_set_of(w, n_w, y);
    if (n >= tc_wide_min_n()) launch_tc_wide<T>(cu, set, w[0]->cols / 32, w[0]->cols, x, n);
    else launch_tc<T>(cu, set, w[0]->cols / 32, w[0]->cols, x, n);
}

void lm_cuda_matmul_tc(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                       float *const *y) {
    switch (w[0]->type) {
#define LM_X(t) \
    case t: launch_tc_any<t>(cu, w, n_w, x, n, y); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default: lm_cuda_fail(cu, LM_ERR_INTERNAL, "matmul: no tensor-core path for %s", lm_dtype_name(w[0]->type));
    }
}
