/* y[t][r] = sum_k W[r][k] * x[t][k] over weights in any device format.
 *
 * Three paths, chosen by the token count n and the weight (path_of), never by the
 * other tokens of the batch. The thresholds were measured on the H200 with a 1.5B
 * bf16 model (bench/cuda_quick_run.sh, decode tokens/s at 1 / 8 / 64 / 256
 * sequences, 2026-11-30): matrix-vector 420 at 1; tensor cores 3,502 at 8; GEMM 1,895
 * at 8, 15,589 at 64, 42,865 at 256. A tensor-core kernel for 33-256 tokens that staged
 * the activations of 64 tokens in shared memory for 128 rows at a time measured 8,233
 * at 64 and 15,634 at 256, and its summation order (contiguous parts) made batched
 * greedy outputs of the real SmolLM2 differ from alone at a top-two gap of 0.07; it
 * was dropped.
 *
 *  - matrix-vector (n <= mv_max_n: 2 for f32 and 16-bit weights, 3 for quantized
 *    ones with a bf16 copy, 8 for quantized ones without, unless LUMEN_CUDA_MV_MAX_N
 *    says otherwise): decode of a few sequences. Without a copy, 8 tokens here beat
 *    the tensor-core kernel, which decodes a quantized weight element by element for
 *    each group of tokens (twentieth session, Q4_K_M 1.5B at 8 sequences: 2,537-2,539
 *    vs 1,845-1,851 tokens/s, the same call); with one, the GEMMs on it beat 6 and 8
 *    tokens here (twenty-first session, Q4_K_M: x6 3,357-3,359 vs 2,287-2,300, x8
 *    4,438-4,443 vs 2,557). A row per warp (or per 2-4 warps when the row is long),
 *    the weight decoded on the fly eight elements per lane (deq8), f32 fused
 *    multiply-adds against up to 8 tokens at once while the decoded weights sit in
 *    registers. Exact f32 arithmetic on the exactly decoded weights, except Q4_K
 *    and Q6_K weights over at most 4,096 columns: those take cuda_matmul_q8.cu, the
 *    CPU's 8-bit arithmetic to the bit (x1 on the H200, Q4_K_M 1.5B: 582 vs 481
 *    tokens/s with gate/up and the head there; LUMEN_CUDA_MVQ=0 keeps them here), and
 *    Q4_K and Q6_K down projections right after that kernel's gate/up product: those take
 *    cuda_matmul_q8h.cu, over the 8-bit copy of swiglu's output it hands off. A
 *    token's result never depends on the other tokens: each has its own accumulator
 *    and the same summation order (lane partials in k order, a fixed butterfly, then
 *    the row's warps in index order), whatever the group it is computed in.
 *    LUMEN_CUDA_MV_MAX_N=1000000000 sends every product here: every product exact f32
 *    (with LUMEN_CUDA_MVQ=0 for the 8-bit kernel's), bit batch-invariant, slower.
 *    Requesting a warp's first weights before the PDL wait (L2 bulk prefetch of its
 *    row, or its first four loads into registers; the grid then one resident wave
 *    striding over the rows), so the stream would start under the previous kernel,
 *    measured slower at batch 1: 571 -> 489-505 tokens/s (the early traffic delays
 *    the latency-bound kernel before); dropped.
 *    A Q4_K kernel giving a lane 32 elements from one 16-byte load of quants (instead
 *    of deq8's five loads for 8) measured the same on a Q4_K_M 1.5B model at batch
 *    1, alternating in one call: 443-444 vs 442-447 tokens/s; dropped (a Q6_K one
 *    of 2-byte loads was slower). Running the rms_norm before a product inside the
 *    product's kernel (every block normalizing the rows into shared memory as it
 *    starts, bit-identical to the norm's kernel), with the output projections adding
 *    into the residual stream themselves, so a decode step's two norm launches a layer
 *    were gone, measured slower at batch 1 (seventh session, 2026-11-30): 596 -> 517
 *    tokens/s bf16; with the norm's blocks capped at one wave, each over several groups
 *    of rows, 557 bf16 and 462 -> 380 Q4_K_M (each block's norm is a chain of dependent
 *    trips before its first weight load); dropped. One wave of blocks for the plain
 *    kernel measured the same (556 vs 557). Twelfth session (2026-12-01, H200, 1.5B,
 *    batch 1; branches kept): the add_rms_norm after a one-token product run by the
 *    product's last block (bit-equal) 682 vs 683-686 bf16, 627-632 vs 678-680 Q4_K_M;
 *    the CPL rows' weights requested before the PDL wait 649-656 vs 686 (kept since
 *    the thirty-first session, where it measured faster: mv_kernel); those rows
 *    streamed through 4-16 blocks an SM, the next group's weights ahead, 595-642 vs
 *    686; the up-front loads for 2-9 chunks a lane (the last bound-checked) 644-656
 *    vs 664-674 bf16; dropped. Thirteenth session (same setting, bf16; branches
 *    kept): the add_rms_norm folded into the CPL product after it, every block
 *    normalizing the row into shared memory while its weight words load
 *    (mv-fold-norm, bit-equal) 580 vs 677; folded as a scalar after the sums (each
 *    warp summing the squares of the h it loads anyway, the product before adding
 *    into the residual itself: no extra trip, not bit-equal; mv-rstd) 634-645 vs
 *    675-684, and 571 vs 698 under the launch bound below (127 registers); dropped.
 *    Fourteenth session: bf16 rows of 1,120 chunks (the down projections) on 5 warps
 *    a row, 160-thread blocks, so a lane had exactly 7 chunks in the CPL form
 *    (mv-down5), 716.0-727.6 vs 721.5-731.5; the launch bound at 8 blocks an SM (64
 *    registers at 6 chunks a lane; mv-mb8) 733.8-738.2 vs 741.5-750.9 bf16 and
 *    745.7-752.4 vs 755.0-760.6 Q4_K_M; one token's blocks of 256 or 512 threads, more
 *    rows a block reading the activations once (mv-wide; 35 KB a row of the down
 *    projections) 739.8-749.8 and 603.6-604.4 vs 749.9-750.8 bf16, 752.9-764.7 vs
 *    758.9-763.0 Q4_K_M; the Q4_K scale and min selected instead of branched on, and
 *    the staged loop 4 chunks at a time with no bound check between them
 *    (k4-scale-select, q4-stage-groups: each chunk's shared reads and activations
 *    then issued together, SASS) 755.7-760.7 and 748.9-762.3 vs 755.0-760.6 Q4_K_M;
 *    the block split by shifts and a row's warps summed without a loop (mv-sass)
 *    744.6-755.7 vs 749.9-750.8 bf16; the output projection's CPL weights requested
 *    before its PDL wait, under the two-block decode attention (mv-o-early, same
 *    build with LUMEN_CUDA_MV_EARLY unset for the other) 754.0-765.5 vs 746.4-758.0
 *    bf16; all dropped. A Q4_K_M file's staged rows, requested before the wait (below),
 *    did gain. Twentieth session: one token's 16-bit rows streamed by bulk copies
 *    through a ring of shared-memory slots, one block an SM (a producer lane keeping
 *    every free slot's copy in flight, the first slots requested before the PDL wait;
 *    eight consumer warps summing in this kernel's order, bit-equal to it), bf16 batch
 *    1 718-721 vs 812-816 tokens/s in one call (rings of 96 / 144 / 200 KB 735-740 /
 *    718-721 / 700-708; no slot before the wait 684-691); in the step's timeline
 *    gate/up 17.7 vs 14.6 us, down 8.8 vs 8.8, Q/K/V and O 4.2 vs 3.1 (a block's one
 *    slot waited for whole), the head 110 vs 107.5. Short-lived blocks with their
 *    words in registers keep more bytes in flight than a ring an SM; dropped.
 *
 *  - tensor cores (n <= tc_max_n: none unless LUMEN_CUDA_TC_MAX_N says so; every
 *    format but F32, widths a multiple of 32), quantized weights with a bf16 copy
 *    (copy_decide) read as the bf16 weights their copies are (tc_run). Up to the
 *    twenty-first session 16-bit weights took it for 5-32 tokens; the GEMMs on the
 *    same weights then measured faster at every size (H200, bf16 1.5B-shaped, one call
 *    each, tokens/s: 8 sequences 3,816-3,817 vs 4,546-4,560, 12 5,018-5,027 vs 6,739,
 *    16 6,478 vs 8,908-8,916, 32 8,443-8,447 vs 16,827-17,160; Q4_K_M from its copies
 *    x6 2,632 vs 3,357-3,359, x8 3,810 vs 4,438-4,443). Quantized weights without a
 *    copy had lost to the GEMMs' tiles from 9 tokens on (twentieth session, Q4_K_M: 12
 *    sequences 2,672 vs 3,415, 16 3,426 vs 4,514, 32 5,196-5,208 vs 8,917). Kept for
 *    the batch-invariant configurations (below) and checked by the op tests on a
 *    backend with LUMEN_CUDA_TC_MAX_N=32.
 *    cuda_matmul_tc.cu: weights decoded in registers, bf16 activations, f32 sums,
 *    bit batch-invariant for every n it serves (LUMEN_CUDA_MV_MAX_N=0 with
 *    LUMEN_CUDA_TC_MAX_N=256 makes every decode batch up to 256 take it: decode
 *    invariant across batch sizes, at a cost: 357 / 2,570 / 9,455 / 13,204 tokens/s at
 *    1 / 8 / 64 / 256 sequences in the third session's measurement).
 *
 *  - GEMM (larger n: prefill, large batches): weight rows decoded to bf16 a tile
 *    at a time, or read from the weight's bf16 copy where it has one (F32 weights:
 *    cublasSgemm on the weights in place; BF16: used in place), activations rounded
 *    to bf16, cuBLAS with f32 accumulation. Tokens go
 *    through GEMMs of exactly `chunk` columns (the last one padded; the padding's
 *    outputs are never read), so every token sees the same GEMM shape and algorithm
 *    whatever the batch (a column's result depends on its own column): batch-invariant
 *    within a chunk size. The chunk is the first of 64, 128, 256, 512 that holds the
 *    batch (gemm_chunk_of; LUMEN_CUDA_GEMM_CHUNK sets the smallest): four GEMM paths,
 *    each batch-invariant, so a decode batch of 64 no longer pays for 256 columns.
 *    Measured on the H200 with a 1.5B model, chunks of 128 / 256 / 512 gave prefill of
 *    512 tokens 33k / 45k / 54k tokens/s.
 *
 * matmul_many (Q/K/V, gate/up: products of one input): on the tensor-core and
 * matrix-vector paths the weights of one format are one launch over their
 * concatenated rows, and so are Q4_K and Q6_K weights on the 8-bit kernel (a Q4_K_M
 * file's Q/K/V, V in Q6_K in half the layers), each warp's rows of one format (each
 * row computed exactly as matmul computes it: the kernels' split of a row depends on
 * the column count only, which the weights share); on the
 * GEMM path the activations are rounded to bf16 once for all weights. Bit-identical
 * to separate matmul calls, in fewer launches.
 *
 * The paths round differently (f32 activations on the matrix-vector path, bf16 on
 * the others, which also sum in different orders), so a token decoded alone and the
 * same token inside a larger batch agree to about 1e-3, not to the bit. */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_matmul.cuh"

enum { MV_THREADS = 128, MV_WIDE_THREADS = 512 /* mv_wide_blocks */, MV_MAX_NT = 8 };

/* The blocks an SM that ptxas must allow mv_kernel (its launch bound), so its
 * register budget: at most 128 a thread. Without it ptxas keeps registers few by
 * sinking each weight load of the CPL form to just before its chunk's multiply-adds,
 * so a lane had two of its weight words in flight at a time (SASS, sm_90a, CUDA 13);
 * with it the lane requests them all first (80 registers at 6 chunks a lane). H200,
 * 1.5B, batch 1, same call: bf16 687 -> 697-700 tokens/s; Q4_K_M (with the 8-bit
 * kernel's bound, cuda_matmul_q8.cu, and this one on the loop too) 677-689 -> 698-700.
 * Requesting the loop's 8-9 chunks a lane first as well (bf16 down projections; the
 * last bound-checked, 122 registers) measured 697 vs 700: not done. */
enum { MV_MIN_BLOCKS = 4 };

/* Formats whose rows are staged (mv_kernel's STAGE): the quantized ones, whose
 * decoders read generic addresses. (Not the 16-bit ones: bf16 down projections
 * staged, 17.5 KB a block, measured 609-615 vs 679-693 tokens/s at batch 1; their
 * decoders load with global-only instructions anyway.) */
static constexpr bool mv_stageable(int t) {
    return t != LM_DTYPE_F32 && t != LM_DTYPE_F16 && t != LM_DTYPE_BF16;
}

/* Which weight of the set row `row` is in, and its row there. SWIGLU: the set is
 * (gate, up) interleaved, gate row r at 2r and up row r at 2r + 1. */
template <bool SWIGLU>
__device__ __forceinline__ int mv_row_of(const mv_set &set, int row, int *lr) {
    if (SWIGLU) {
        *lr = row >> 1;
        return row & 1;
    }
    const int k = mv_which(set, row);
    *lr = row - (k ? set.end[k - 1] : 0);
    return k;
}

/* The precise mode's weights (set.round_w) where a weight has no bf16 copy (with one,
 * the kernel reads the copy: mv_dispatch): the 8 decoded values rounded to bf16, the
 * values the GEMMs read. Not compiled for BF16 and F32 weights, whose kernels stay
 * the default's instruction for instruction: with the run-time branch there too
 * (never taken for them), their PTX grew by half and bf16 batch 1 measured 720
 * instead of ~825 tokens/s (H200, 1.5B, twenty-third session). */
template <int T>
__device__ __forceinline__ void mv_round_weights(const mv_set &set, float *w) {
    if constexpr (T != LM_DTYPE_BF16 && T != LM_DTYPE_F32) {
        if (set.round_w)
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = __bfloat162float(__float2bfloat16_rn(w[i]));
    }
}

/* acc[t] += the 8 weights of chunk c times token t0 + t's activations there, for the
 * block's NT tokens, one multiply-add at a time in element order (both of mv_kernel's
 * loops: their sums are the same to the bit). */
template <int NT>
__device__ __forceinline__ void mv_fma8(float *acc, const float *w, const float *__restrict__ x, int cols, int c,
                                        int t0, int n) {
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

/* The block's rows [r0, r1) of the set's one weight requested whole into shared
 * memory (16-byte copies, all at once; the caller checked that the weight's bytes end
 * on a 16-byte boundary, so the last copy stays inside it), and row r0's first byte
 * there: addresses keep their offset modulo 16, so the decoders' aligned reads stay
 * aligned. The copies land after lm_cp_async_wait_all and a barrier. */
__device__ __forceinline__ const uint8_t *mv_stage_rows(const mv_set &set, int r0, int r1, uint4 *stage) {
    const uintptr_t b0 = (uintptr_t)(set.W[0] + (size_t)r0 * set.row_bytes[0]);
    const uintptr_t b1 = (uintptr_t)(set.W[0] + (size_t)r1 * set.row_bytes[0]), a0 = b0 & ~(uintptr_t)15;
    const int words = (int)((b1 - a0 + 15) / 16);
    for (int i = threadIdx.x; i < words; i += MV_THREADS)
        lm_cp_async16(stage + i, (const void *)(a0 + 16 * (uintptr_t)i));
    return (const uint8_t *)stage + (b0 - a0);
}

/* SWIGLU: the set is (gate, up) with rpb even, and y[0] gets silu(gate) * up, each
 * row summed exactly as without it (the per-row code does not change). STAGE (one
 * weight, one token, the loop): the block's rows are first copied whole into shared
 * memory (mv_stage_rows) and decoded from there, so a chunk's dependent reads (a
 * K-quant's scales, then its quants) are shared-memory trips, not memory ones. */
template <int T, int NT, bool SWIGLU, int CPL = 0, bool STAGE = false, int VP = 1, int BT = MV_THREADS>
__global__ void __launch_bounds__(BT, MV_THREADS * MV_MIN_BLOCKS / BT)
    mv_kernel(const __grid_constant__ mv_set set, int n_chunks, int cols, const float *__restrict__ x, int n,
              int t_base, int wpr) {
    static_assert(!STAGE || (CPL == 0 && NT == 1 && !SWIGLU), "rows are staged for the loop of one token");
    static_assert(VP == 1 || (CPL > 0 && !SWIGLU), "a warp runs several parts of a row in the CPL form only");
    static_assert(BT == MV_THREADS || (VP > 1 && NT == 1), "wide blocks (mv_wide_blocks) are the VP form's");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rpb = (BT / 32) / wpr; /* rows per block */
    const int row = blockIdx.x * rpb + warp / wpr, part = warp % wpr;
    const int t0 = blockIdx.y * NT;
    const int rows_all = set.end[set.n_w - 1];
    const uint8_t *staged = NULL;
    if constexpr (STAGE) {
        /* requested before the PDL wait: weights are written at load, never by the
         * kernels before, so the block's rows stream into shared memory while the
         * kernel before this one still runs (a Q4_K_M file's down projections follow
         * the 8-bit gate/up product, which leaves the memory idle at 1.7 TB/s; H200,
         * 1.5B, batch 1: 748.9-760.3 -> 780.6-796.8 tokens/s, same call) */
        extern __shared__ __align__(16) uint4 mv_stage[];
        const int r0 = blockIdx.x * rpb;
        staged = mv_stage_rows(set, r0, min(r0 + rpb, rows_all), mv_stage) + (size_t)(row - r0) * set.row_bytes[0];
    }
    /* The CPL form's weight words, every one requested before the PDL wait: no kernel
     * before a product writes its weights (they are written at load, a bf16 copy at
     * its weight's first product, synchronized there: copy_decide), so the product's
     * first bytes arrive under the kernel before it (a norm, the attention, or the
     * down product). H100, 1.5B-shaped bf16,
     * batch 1, seven alternating pairs over three calls (thirty-first session, branch
     * mv-early): 687.1-693.9 -> 687.4-698.9 tokens/s, medians 690.0 -> 697.4 (+1.1%);
     * the same op tests, 411 comparisons, 0 over tolerance. (The twelfth session had
     * measured this slower, 649-656 vs 686, before the launch bound and the carveout
     * below. The loop form's first 2 or 4 chunks early, the down projections', lost:
     * 669-676 and 683 vs 690-694, its registers 36 -> 48 and 72.) */
    /* VP (mv_vparts): this warp runs the row's parts VP part .. VP part + VP - 1 of
     * VP wpr, each as its own warp would */
    uint4 raw[CPL > 0 ? CPL * VP : 1];
    if constexpr (CPL > 0) {
        if (row < rows_all) {
            int lr;
            const int k = mv_row_of<SWIGLU>(set, row, &lr);
            const uint4 *wq = (const uint4 *)(set.W[k] + (size_t)lr * set.row_bytes[k]) + VP * part * 32 + lane;
#pragma unroll
            for (int v = 0; v < VP; v++)
#pragma unroll
                for (int j = 0; j < CPL; j++) raw[v * CPL + j] = lm_ld_weights16_early(wq + v * 32 + j * VP * wpr * 32);
        }
    }
    /* 16-bit weights: the next kernel let in before the wait (bf16 batch 1, H200,
     * 1.5B-shaped, one call: 759.3-763.4 -> 763.0-777.7 tokens/s, 4 sequences
     * 1,573-1,593 -> 1,595-1,602; in this form, another call: 757.1-764.3 ->
     * 763.0-770.0, Q4_K_M unchanged). Not for staged rows: the product after a staged one
     * (gate/up, then down) is staged as well, and its weight requests before its wait
     * would come in under the kernel before this one (lm_pdl_enter). */
    lm_pdl_enter<!STAGE>();
    if constexpr (STAGE) {
        lm_cp_async_wait_all();
        __syncthreads();
    }
    float acc[VP][NT];
#pragma unroll
    for (int v = 0; v < VP; v++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[v][t] = 0.0f;
    if (row < rows_all) {
        int lr;
        const int k = mv_row_of<SWIGLU>(set, row, &lr);
        const uint8_t *wr = STAGE ? staged : set.W[k] + (size_t)lr * set.row_bytes[k];
        if constexpr (CPL > 0) {
            /* exactly CPL chunks a lane (16-bit formats; the launch checked n_chunks ==
             * CPL * wpr * 32): every weight word was requested before the PDL wait
             * (raw, above), with no bound check between them; the sums keep the loop's
             * order below, so the results are the same to the bit */
#pragma unroll
            for (int v = 0; v < VP; v++)
#pragma unroll
                for (int j = 0; j < CPL; j++) {
                    const int c = (VP * part + v) * 32 + lane + j * VP * wpr * 32;
                    float w[8];
                    deq8_words<T>(raw[v * CPL + j], w);
                    mv_round_weights<T>(set, w);
                    mv_fma8<NT>(acc[v], w, x, cols, c, t0, n);
                }
        } else {
            /* unrolled by 4 so several chunks' loads would be in flight at once (one at a
             * time left a 1536-column row latency-bound); but in its SASS (Q4_K, BF16) a
             * chunk's loads still follow the chunk before's multiply-adds, each chunk
             * behind its own bound check (hence CPL above). Grouping the loads here (4
             * chunks' decoded before their multiply-adds, 16-bit words through shared
             * memory by asynchronous copies) was slower: 628 vs 662 tokens/s Q4_K_M,
             * 487 vs 647 bf16 (branch mv-loads-first). The sums keep their order. */
#pragma unroll 4
            for (int c = part * 32 + lane; c < n_chunks; c += wpr * 32) {
                float w[8];
                deq8<T>(wr, c, w);
                mv_round_weights<T>(set, w);
                mv_fma8<NT>(acc[0], w, x, cols, c, t0, n);
            }
        }
    }
    __shared__ float red[BT / 32][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = 0.0f;
#pragma unroll
        for (int p = 0; p < VP; p++) { /* the parts' sums added in order, as below */
            float v = acc[p][t];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            s = p ? s + v : v;
        }
        if (lane == 0) red[warp][t] = s;
    }
    __syncthreads();
    if (SWIGLU) { /* a (gate, up) pair of rows per thread and token */
        if ((int)threadIdx.x < rpb / 2 * NT) {
            const int pl = threadIdx.x / NT, t = threadIdx.x % NT, r = blockIdx.x * rpb + 2 * pl;
            if (r < rows_all && t0 + t < n) {
                float g = red[2 * pl * wpr][t], u = red[(2 * pl + 1) * wpr][t];
                for (int p = 1; p < wpr; p++) g += red[2 * pl * wpr + p][t];
                for (int p = 1; p < wpr; p++) u += red[(2 * pl + 1) * wpr + p][t];
                set.y[0][(size_t)(t_base + t0 + t) * set.rows[0] + (r >> 1)] = lm_swiglu1(g, u);
            }
        }
        return;
    }
    if ((int)threadIdx.x < rpb * NT) {
        int rl = threadIdx.x / NT, t = threadIdx.x % NT, r = blockIdx.x * rpb + rl;
        if (r < rows_all && t0 + t < n) {
            float s = red[rl * wpr][t];
            for (int p = 1; p < wpr; p++) s += red[rl * wpr + p][t];
            int lr;
            const int k = mv_row_of<false>(set, r, &lr);
            set.y[k][(size_t)(t_base + t0 + t) * set.rows[k] + lr] = s;
        }
    }
}

/* Products of few rows: a model's attention projections (Q/K/V, O), not its FFN or
 * head (mv_warps_per_row, launch_mv's split) */
enum { MV_FEW_ROWS = 4096 };

/* Whether mv_kernel_of takes its CPL form: 16-bit rows of exactly 3, 4, 6 or 8
 * chunks a lane at one token. */
static bool mv_cpl_form(int T, int nt, int per_lane) {
    return (T == LM_DTYPE_BF16 || T == LM_DTYPE_F16) && nt == 1 &&
           (per_lane == 3 || per_lane == 4 || per_lane == 6 || per_lane == 8);
}

/* warps per row: more for long rows, so every lane has a few chunks to stream, and
 * two for short rows of products with few rows (bf16 Q/K/V and O of a 1.5B model:
 * 1,536 columns are 6 chunks a lane at one warp a row, two serial rounds of the
 * unrolled loop; at two, one round, and 3-4% more tokens/s at batch 1 on the H200).
 * A function of the weight's shape, never of the batch: it fixes the sums' order.
 * (One token's CPL form may run two of them on one warp: mv_vparts.) */
static int mv_warps_per_row(int64_t n_chunks, int64_t rows) {
    if (n_chunks >= 1024) return 4;
    if (n_chunks >= 512) return 2;
    return rows <= MV_FEW_ROWS && n_chunks >= 64 ? 2 : 1;
}

/* How many of a row's wpr warps (mv_warps_per_row) one physical warp runs in the CPL
 * form (VP: each lane keeps a sum for each, summed over the warp apart and added in
 * the warps' order, so the bits are those of wpr warps): the bf16 Q/K/V and O
 * products at one token on half the warps, at most 8 words a lane as the widest CPL
 * form. H100, 1.5B-shaped bf16, one call and one more on the same machine, pairs
 * alternating (thirty-ninth session): batch 1 715.7 / 716.7 / 715.2 / 717.8 / 718.3
 * -> 721.9 / 721.5 / 719.7 / 720.2 / 722.1 tokens/s (+0.7%); 2 and 4 tokens (the loop
 * form, two warps) unchanged. One warp a row outright (other sums, so a token's bits
 * alone would not be its bits beside another) had measured +1.3% at one token, -2.7%
 * at two (the loop form on one warp), 4 and 8 the same; the decode attention's block
 * still 0.17 us in its wait, so neither gains by its early arrival. The VP kernels
 * take 90 registers at 3 chunks a part against 80 for 6 chunks on one warp (sm_90a). */
static int mv_vparts(int T, int nt, int wpr, int per_lane, bool swiglu) {
    return !swiglu && wpr == 2 && mv_cpl_form(T, nt, per_lane) && per_lane * 2 <= 8 ? 2 : 1;
}

/* The VP products (mv_vparts) in blocks of 16 warps, one an SM by registers (~90 x
 * 512 of 64 K), where that leaves at least 2 SMs without one: a 1.5B model's Q/K/V
 * product is 128 blocks instead of 512 spread 3-4 an SM, so the decode attention
 * after it (8 warps of ~190 registers, 48 K) finds 4 of the H100's or H200's 132 SMs
 * empty once the product lets it in (before the product's own wait). The same rows a
 * warp and the same sums, so the same bits. H100, 1.5B-shaped bf16, batch 1, six
 * alternating pairs over two calls on one machine (thirty-ninth session, switched by
 * LUMEN_X_MV_WIDE=1 then): 724.1 / 723.4 / 723.7 / 724.0 / 717.9 / 719.6 -> 726.5 /
 * 725.5 / 727.2 / 726.5 / 727.4 / 724.9 tokens/s (+0.4%); the attention's block (0, 0)
 * waits 0.31 us instead of 0.04, so it arrives earlier, but by ~0.3 us, not by its
 * ~2 us before the wait. */
static bool mv_wide_blocks(const lm_cuda_backend *cu, int vp, int wpr, int rows_all) {
    const int rpb = (MV_WIDE_THREADS / 32) / wpr;
    return vp == 2 && (rows_all + rpb - 1) / rpb <= cu->n_sm - 2;
}

typedef void (*mv_fn)(const mv_set, int, int, const float *, int, int, int);

/* mv_kernel for nt tokens a block. The CPL form (mv_cpl_form) has the weight words
 * all requested up front (H200, 1.5B bf16, batch 1: 671-684 vs 653-663 tokens/s with
 * the loop, same build, alternating). */
/* The VP form's kernel (mv_vparts: 3 or 4 chunks a part) in blocks of BT threads */
template <int T, int BT>
static mv_fn mv_vp_kernel(int per_lane) {
    return per_lane == 3 ? mv_kernel<T, 1, false, 3, false, 2, BT> : mv_kernel<T, 1, false, 4, false, 2, BT>;
}

template <int T, bool SWIGLU>
static mv_fn mv_kernel_of(int nt, int per_lane, bool stage, int vp, bool wide) {
    if constexpr ((T == LM_DTYPE_BF16 || T == LM_DTYPE_F16) && !SWIGLU) {
        if (vp == 2) return wide ? mv_vp_kernel<T, MV_WIDE_THREADS>(per_lane) : mv_vp_kernel<T, MV_THREADS>(per_lane);
    }
    if constexpr (T == LM_DTYPE_BF16 || T == LM_DTYPE_F16) {
        if (mv_cpl_form(T, nt, per_lane)) switch (per_lane) {
            case 3: return mv_kernel<T, 1, SWIGLU, 3>;
            case 4: return mv_kernel<T, 1, SWIGLU, 4>;
            case 6: return mv_kernel<T, 1, SWIGLU, 6>;
            case 8: return mv_kernel<T, 1, SWIGLU, 8>;
            default: break;
            }
    }
    if constexpr (!SWIGLU && mv_stageable(T))
        if (stage) return mv_kernel<T, 1, false, 0, true>;
    switch (nt) {
    case 1: return mv_kernel<T, 1, SWIGLU>;
    case 2: return mv_kernel<T, 2, SWIGLU>;
    case 4: return mv_kernel<T, 4, SWIGLU>;
    default: return mv_kernel<T, 8, SWIGLU>;
    }
}

/* The weights w[0..n_w) (one format, one column count; n_w <= MV_MAX_SET) times x in
 * one launch per group of tokens. SWIGLU: w = (gate, up) of one shape and rows
 * short enough for two to a block; y[0] = silu(gate x) * (up x). */
template <int T, bool SWIGLU = false>
static void launch_mv(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                      float *const *y) {
    mv_set set = mv_set_of(w, n_w, y);
    set.round_w = cu->precise && T != LM_DTYPE_F32 && T != LM_DTYPE_BF16; /* the GEMMs' values (gemm_split) */
    const int rows_all = set.end[n_w - 1];
    const int n_chunks = (int)(w[0]->cols / 8), wpr_sums = mv_warps_per_row(n_chunks, w[0]->rows);
    const int per_lane = n_chunks % (wpr_sums * 32) == 0 ? n_chunks / (wpr_sums * 32) : 0, cols = (int)w[0]->cols;
    /* the staged loop (mv_kernel's STAGE): one quantized weight at one token, whose
     * bytes end on a 16-byte boundary, a block's rows within 48 KB (its warps are the
     * row's, mv_vparts being 1 for quantized weights) */
    const size_t stage_bytes = (size_t)((MV_THREADS / 32) / wpr_sums) * w[0]->row_bytes + 32;
    const bool stage = cu->mv_stage && !SWIGLU && n == 1 && n_w == 1 && mv_stageable(T) && stage_bytes <= 48 * 1024 &&
                       (w[0]->rows * w[0]->row_bytes) % 16 == 0 && ((uintptr_t)w[0]->data & 15) == 0;
    const int64_t max_per_launch = (int64_t)MV_MAX_NT * 65535;
    for (int64_t t0 = 0; t0 < n; t0 += max_per_launch) {
        int nn = (int)(n - t0 < max_per_launch ? n - t0 : max_per_launch);
        const int nt = nn == 1 ? 1 : nn == 2 ? 2 : nn <= 4 ? 4 : 8;
        const int vp = mv_vparts(T, nt, wpr_sums, per_lane, SWIGLU), wpr = wpr_sums / vp;
        const bool wide = mv_wide_blocks(cu, vp, wpr, rows_all);
        const int bt = wide ? MV_WIDE_THREADS : MV_THREADS, rpb = (bt / 32) / wpr;
        dim3 grid((unsigned)((rows_all + rpb - 1) / rpb), (unsigned)((nn + nt - 1) / nt));
        /* The CPL form's products of few rows (a 1.5B model's Q/K/V and O; not gate/up,
         * not the head) at the backend's split (cuda_internal.cuh, LM_CUDA_CARVEOUT),
         * not the driver's. H100, 1.5B-shaped bf16, batch 1, two calls on one machine
         * (twenty-seventh session): 680.0-681.4 -> 688.6-689.2 tokens/s, the same at
         * 25, 50 or 100 %; with the decode attention at 50 as well, 683.6-683.8. The
         * attention's block still reaches its wait after the Q/K/V product has left
         * (0.02 us in it), so the gain is not its early start; where it comes from is
         * not established. The others keep the driver's: every 16-bit one-token
         * product at 50 lost (nineteenth session, 790 -> 775-778). */
        const bool carved = !SWIGLU && mv_cpl_form(T, nt, per_lane) && rows_all <= MV_FEW_ROWS;
        /* the kernel indexes tokens from t_base, so x and y need no offset per weight */
        lm_cuda_launch_with(cu, carved, mv_kernel_of<T, SWIGLU>(nt, per_lane, stage, vp, wide), grid, dim3(bt),
                            stage ? stage_bytes : 0, set, n_chunks, cols, x + t0 * cols, nn, (int)t0, wpr);
        if (!lm_cuda_launched(cu, "mv_kernel")) return;
    }
}

/* rows [r0, r0 + nr) of W decoded to bf16, row-major [nr][cols] */
template <int T>
__global__ void dequant_bf16_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t chunks_per_row,
                                    int64_t n_chunks, __nv_bfloat16 *__restrict__ out) {
    lm_pdl_enter();
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

/* out[i] = bf16(x[i]) for i < n_valid, 0 up to n_total; eight elements a thread
 * (16-byte stores: the scalar form ran a 512-token prompt's conversions at a third of
 * the memory rate). lo: also lo[i] = bf16(x[i] - out[i]), the part of x its bf16
 * value misses (the precise mode: gemm_split). n_valid and n_total are multiples of 8,
 * x and out 16-byte aligned. */
__device__ __forceinline__ uint32_t bf16_pair(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&h;
}

__device__ __forceinline__ float bf16_lo(float v) { return v - __bfloat162float(__float2bfloat16_rn(v)); }

__global__ void to_bf16_kernel(const float4 *__restrict__ x, int64_t n_valid8, int64_t n_total8,
                               uint4 *__restrict__ out, uint4 *__restrict__ lo) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_total8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (i < n_valid8) a = x[2 * i], b = x[2 * i + 1];
        out[i] = make_uint4(bf16_pair(a.x, a.y), bf16_pair(a.z, a.w), bf16_pair(b.x, b.y), bf16_pair(b.z, b.w));
        if (lo)
            lo[i] = make_uint4(bf16_pair(bf16_lo(a.x), bf16_lo(a.y)), bf16_pair(bf16_lo(a.z), bf16_lo(a.w)),
                               bf16_pair(bf16_lo(b.x), bf16_lo(b.y)), bf16_pair(bf16_lo(b.z), bf16_lo(b.w)));
    }
}

/* c[i] = c2[i] + c2[i + half]: the precise mode's two halves of one GEMM summed
 * (gemm_call); four floats a thread with vec (half a multiple of 4, c 16-byte
 * aligned; c2 is scratch). */
__global__ void halves_sum_kernel(const float *__restrict__ c2, int64_t half, float *__restrict__ c, bool vec) {
    lm_pdl_enter();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (vec) {
        const float4 *a4 = (const float4 *)c2, *b4 = (const float4 *)(c2 + half);
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < half / 4; i += stride) {
            const float4 a = a4[i], b = b4[i];
            ((float4 *)c)[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    } else {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < half; i += stride) c[i] = c2[i] + c2[i + half];
    }
}

static void halves_sum(lm_cuda_backend *cu, const float *c2, int64_t half, float *c) {
    const bool vec = half % 4 == 0 && (uintptr_t)c % 16 == 0;
    lm_cuda_launch(cu, halves_sum_kernel, lm_cuda_blocks(vec ? half / 4 : half, 256), 256, c2, half, c, vec);
    lm_cuda_launched(cu, "halves_sum_kernel");
}

template <int T>
static void launch_dequant_bf16(lm_cuda_backend *cu, const lm_weight *w, int64_t r0, int64_t nr, __nv_bfloat16 *out) {
    int64_t cpr = w->cols / 8, total = nr * cpr;
    lm_cuda_launch(cu, dequant_bf16_kernel<T>, lm_cuda_blocks(total, 256), 256,
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

/* Columns per GEMM for a batch of n tokens: the first of gemm_chunk, twice that, four
 * times... that holds n, at most GEMM_CHUNK_MAX (or gemm_chunk, if larger). A
 * function of n only (see the header). */
enum { GEMM_CHUNK_MAX = 512 };
static int64_t gemm_chunk_of(const lm_cuda_backend *cu, int64_t n) {
    int64_t c = cu->gemm_chunk;
    while (c < n && c < GEMM_CHUNK_MAX) c *= 2;
    return c;
}

static bool cublas_ok(lm_cuda_backend *cu, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    lm_cuda_fail(cu, s == CUBLAS_STATUS_ALLOC_FAILED ? LM_ERR_NO_MEMORY : LM_ERR_INTERNAL, "cuBLAS error in %s: %s",
                 what, cublasGetStatusString(s));
    return false;
}

/* The bf16 hand-off: an op whose output is the input of the next op's GEMM-path
 * product (a norm, swiglu) writes it a second time rounded to bf16 into the XB
 * scratch, the very bytes to_bf16_kernel would write, so the product skips that
 * launch. The product takes them only when it is the next op (op_seq) on the same
 * buffer and element count, and the scratch needs no growing (which would lose them);
 * anything else converts as before. Cheap when unused: 2 bytes an element. */
__nv_bfloat16 *lm_cuda_gemm_input(lm_cuda_backend *cu, const float *x, int64_t count) {
    cu->gemm_in_src = NULL;
    if (!cu->fused || cu->precise || lm_cuda_replaying(cu) || count <= 0 || count % 8 != 0) return NULL;
    void *xb = lm_cuda_scratch(cu, LM_CUDA_SCR_XB, (size_t)count * 2);
    if (!xb) return NULL;
    cu->gemm_in_src = x;
    cu->gemm_in_count = count;
    cu->gemm_in_seq = cu->op_seq;
    cu->gemm_in_lo = false;
    return (__nv_bfloat16 *)xb;
}

/* The precise mode (LUMEN_CUDA_PRECISE=1): the GEMM path takes its bf16 activations
 * in two parts, hi = bf16(x) and lo = bf16(x - hi), whose products are summed (C = W
 * hi + W lo: x to ~16 significant bits instead of 8; gemm_call), and
 * the matrix-vector kernel reads the values the GEMMs read: a quantized or f16
 * weight's bf16 copy where it has one (mv_dispatch), else its decoded weights rounded
 * to bf16 (set.round_w; the 8-bit kernel off: cuda_backend.cu), so a token's
 * products in a batch and alone differ only by the lo part's rounding (2^-17 of x) and
 * their f32 summation order (~3e-6, test_backend_ops). Why: the default paths are two slightly
 * different models (f32 vs bf16 activations, exact vs bf16-rounded weights), and any
 * rounding to bf16 between layers amplifies a difference to bf16's scale within a few
 * layers. Measured on the H200 (twenty-third session): `golden_engine` on the real
 * SmolLM2 Q4_1 file, 2 / 2 / 3 of 32 prompts differ from alone at top-two gaps up to
 * 0.0696 by default, 0 / 0 / 0 in this mode (1 of 32 at 0.0109 with the split alone,
 * 2-3 at 0.0509 with the rounding alone), 0 / 0 / 0 on its bf16 conversion (4 / 4 / 4
 * by default). Its cost: twice the columns in the products, one GEMM for both parts
 * where one chunk holds the batch (gemm_call), its halves summed by the op after it
 * (an add_rms_norm through sum_pending, the packed swiglu) or a light kernel, the lo
 * parts handed off by the norms and swiglu (lm_cuda_gemm_input_split). H200, 1.5B
 * bf16, tokens/s, default -> this mode (twenty-fourth session): x8 ~4,550 ->
 * 3,770-3,819, x64 ~34,400 -> 29,460-29,523, x256 ~80,260 -> 52,818-52,931; Q4_K_M x64
 * ~32,900 -> 28,078-28,388, x1 1,079-1,085 -> 813-816 (the copies' bytes; 611 when it
 * rounded the decoded weights instead). F32 weights take f32 activations anyway. */
static bool gemm_split(const lm_cuda_backend *cu, bool f32) { return cu->precise && !f32; }

/* Where the lo part starts in prepared activations (elements after xs), 0 for none. */
static int64_t gemm_lo_offset(const lm_cuda_backend *cu, bool f32, int64_t n, int64_t cols) {
    const int64_t chunk = gemm_chunk_of(cu, n);
    return gemm_split(cu, f32) ? (n + chunk - 1) / chunk * chunk * cols : 0;
}

/* The precise mode's hand-off: hi where gemm_prepare_x would write it, lo at its lo
 * offset, so the norms and swiglu that write both spare a product its conversion
 * launch (H200, 1.5B bf16, 64 sequences: 113 launches, ~160 us a step, before). With
 * the halves summed by the ops after the products (sum_pending, the packed swiglu):
 * x8 3,610-3,623 -> 3,770-3,819 tokens/s, x64 27,493-27,744 -> 29,460-29,523, x256
 * 49,850-50,195 -> 52,818-52,931, Q4_K_M x64 25,426-26,357 -> 28,078-28,388 (one call;
 * batch 1 unchanged: the default's kernels compile as before). */
__nv_bfloat16 *lm_cuda_gemm_input_split(lm_cuda_backend *cu, const float *x, int64_t n, int64_t cols,
                                        __nv_bfloat16 **lo) {
    *lo = NULL;
    if (!cu->precise) return lm_cuda_gemm_input(cu, x, n * cols);
    cu->gemm_in_src = NULL;
    if (!cu->fused || lm_cuda_replaying(cu) || n <= 0 || cols <= 0 || (n * cols) % 8 != 0) return NULL;
    const int64_t lo_off = gemm_lo_offset(cu, false, n, cols);
    __nv_bfloat16 *xb = (__nv_bfloat16 *)lm_cuda_scratch(cu, LM_CUDA_SCR_XB, (size_t)lo_off * 2 * 2);
    if (!xb) return NULL;
    cu->gemm_in_src = x;
    cu->gemm_in_count = n * cols;
    cu->gemm_in_seq = cu->op_seq;
    cu->gemm_in_lo = true;
    *lo = xb + lo_off;
    return xb;
}

/* The GEMM path's activations: x [n][cols] padded to a whole number of chunks, as f32
 * (F32 weights) or rounded to bf16 (and its lo part after it, gemm_split), in the XB
 * scratch (the padding's columns of the product are never read, so a handed-off bf16
 * copy needs none). NULL on failure (error recorded). */
static const void *gemm_prepare_x(lm_cuda_backend *cu, bool f32, const float *x, int64_t n, int64_t cols) {
    const int64_t chunk = gemm_chunk_of(cu, n), n_pad = (n + chunk - 1) / chunk * chunk;
    const int64_t lo_off = gemm_lo_offset(cu, f32, n, cols);
    const size_t bytes = (size_t)(n_pad * cols) * (f32 ? 4 : 2) * (lo_off ? 2 : 1);
    if (!f32 && (!lo_off || cu->gemm_in_lo) && cu->gemm_in_src == x && cu->gemm_in_count == n * cols &&
        cu->gemm_in_seq + 1 == cu->op_seq && cu->scr_cap[LM_CUDA_SCR_XB] >= bytes)
        return cu->scr[LM_CUDA_SCR_XB];
    cu->gemm_in_src = NULL; /* XB is rewritten below */
    void *xs = lm_cuda_scratch(cu, LM_CUDA_SCR_XB, bytes);
    if (!xs) return NULL;
    if (f32) {
        if (!lm_cuda_ok(cu, cudaMemcpyAsync(xs, x, (size_t)(n * cols) * 4, cudaMemcpyDeviceToDevice, cu->stream),
                        "matmul (activations)") ||
            !lm_cuda_ok(cu, cudaMemsetAsync((float *)xs + n * cols, 0, (size_t)((n_pad - n) * cols) * 4, cu->stream),
                        "matmul (padding)"))
            return NULL;
    } else {
        /* cols is a multiple of 8 (every format's rows are), the buffers aligned */
        uint4 *lo = lo_off ? (uint4 *)((__nv_bfloat16 *)xs + lo_off) : NULL;
        lm_cuda_launch(cu, to_bf16_kernel, lm_cuda_blocks(n_pad * cols / 8, 256), 256, (const float4 *)x,
                       n * cols / 8, n_pad * cols / 8, (uint4 *)xs, lo);
        if (!lm_cuda_launched(cu, "to_bf16_kernel")) return NULL;
    }
    return xs;
}

/* Rows per GEMM of a weight for chunks of `chunk` columns: a function of the weight's
 * shape and the chunk only. Quantized weights are decoded to bf16 a tile at a time
 * (at most 64 MiB and 16,384 rows of scratch); BF16 and F32 weights are used in
 * place, so they take one GEMM over all rows unless a partial chunk's output (which
 * goes through scratch) would exceed 192 MiB, as the output head's at 512 columns. */
static int64_t gemm_row_tile(const lm_weight *w, int64_t chunk) {
    const int64_t rows = w->rows, cols = w->cols;
    if ((w->type == LM_DTYPE_BF16 || w->type == LM_DTYPE_F32) && chunk * rows * 4 <= (192LL << 20)) return rows;
    int64_t rt = (64LL << 20) / (cols * 2) / 128 * 128;
    if (rt < 128) rt = 128;
    if (rt > 16384) rt = 16384;
    return rt > rows ? rows : rt;
}

/* Room kept free on the device beside the weights' bf16 copies: the scratch and
 * activations of later passes grow into it. */
enum : size_t { BF16_COPY_MARGIN = (size_t)2 << 30 };

/* Whether w (a quantized or f16 weight, and the rest of its pack) gets a bf16 copy of
 * its rows: decided at its first product, for good, so its paths (path_of) and so its
 * results never change afterwards. Made then while the budget (cu->bf16_budget) and
 * the free memory, less BF16_COPY_MARGIN, hold it; never when that product is being
 * recorded (cudaMalloc may not run in a capture; a pass is recorded only after it ran
 * unrecorded, so a weight's first product never is in practice). The copy holds what
 * the GEMM path's tiles and the tensor-core kernel decode: the same bf16 values, so
 * those paths give the same bits from it. */
static void copy_decide(lm_cuda_backend *cu, const lm_weight *w) {
    const lm_weight *first = w->copy_first ? w->copy_first : w;
    if (first->bf16_decided) return;
    first->bf16_decided = true;
    bool decoded = false; /* a member the GEMMs would decode (weight_pack keeps F32 out of sets) */
    for (const lm_weight *m = first; m; m = m->copy_next)
        decoded = decoded || (m->type != LM_DTYPE_BF16 && m->type != LM_DTYPE_F32);
    if (!decoded || !cu->bf16_budget || cu->pass_mode == LM_CUDA_PASS_CAPTURE) return;
    int64_t rows = 0;
    for (const lm_weight *m = first; m; m = m->copy_next) rows += m->rows;
    const size_t bytes = (size_t)rows * (size_t)w->cols * 2;
    size_t free_b = 0, total_b = 0;
    int cur = -1; /* the current device is the host thread's (matmul_swiglu decides before entering) */
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cu->device) cudaSetDevice(cu->device);
    if (cu->bf16_used + bytes > cu->bf16_budget || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ||
        free_b < bytes + BF16_COPY_MARGIN) {
        cudaGetLastError();
        return;
    }
    __nv_bfloat16 *p = (__nv_bfloat16 *)lm_cuda_weight_alloc(cu, bytes);
    if (!p) return;
    int64_t r0 = 0;
    for (const lm_weight *m = first; m && !cu->err; m = m->copy_next) {
        dispatch_dequant_bf16(cu, m, 0, m->rows, p + r0 * w->cols); /* each in its own format */
        r0 += m->rows;
    }
    /* the copy whole before any later kernel starts: the one-token 16-bit products
     * (the precise mode reads copies there: mv_dispatch) request their weight words
     * before their PDL wait (mv_kernel), which the decoding kernel, letting the next
     * one in at its start, would still be writing. Once a weight (never in a capture). */
    if (!cu->err) lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "bf16 copy of a weight");
    if (cu->err) {
        cudaFree(p);
        return;
    }
    first->bf16_bytes = bytes;
    cu->bf16_used += bytes;
    r0 = 0;
    for (const lm_weight *m = first; m; m = m->copy_next) {
        m->bf16 = p + r0 * w->cols;
        r0 += m->rows;
    }
}

/* copy_decide for every weight of a product, before its paths are chosen. */
static void copies_decide(lm_cuda_backend *cu, const lm_weight *const *w, int n_w) {
    for (int i = 0; i < n_w; i++) copy_decide(cu, w[i]);
}

/* C [chunk][nr] (column-major nr x chunk) = A [nr][cols] times the chunk of prepared
 * activations xs starting at token c0: the one cuBLAS call of the GEMM path, or two
 * with a lo part lo_off elements after xs (gemm_split), the second adding into C. */
static bool gemm_call1(lm_cuda_backend *cu, bool f32, const void *A, int64_t nr, int64_t cols, const void *xs,
                       int64_t c0, int64_t chunk, float *C, bool accumulate) {
    if (!f32 && lm_cuda_gemm_lt(cu, A, nr, cols, (const __nv_bfloat16 *)xs + c0 * cols, chunk, C, accumulate))
        return cu->err == LM_OK;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s;
    if (f32)
        s = cublasSgemm(cu->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)chunk, (int)cols, &one, (const float *)A,
                        (int)cols, (const float *)xs + c0 * cols, (int)cols, &beta, C, (int)nr);
    else
        s = cublasGemmEx(cu->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)chunk, (int)cols, &one, A, CUDA_R_16BF,
                         (int)cols, (const __nv_bfloat16 *)xs + c0 * cols, CUDA_R_16BF, (int)cols, &beta, C,
                         CUDA_R_32F, (int)nr, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return cublas_ok(cu, s, f32 ? "cublasSgemm" : "cublasGemmEx");
}

/* With a lo part right after the chunk (one chunk holds the batch: lo_off = chunk x
 * cols), both parts go through one GEMM of twice the columns, so the weights are read
 * once, and a light kernel sums its halves into C; else the second GEMM adds into C.
 * Merged, on the H200 (1.5B bf16, tokens/s, twenty-fourth session, one call): x8
 * 2,563-2,613 -> 3,620-3,658, x64 19,824-20,077 -> 27,702-27,729, x256 48,341-48,390
 * -> 50,501-50,728; Q4_K_M x64 19,336-19,449 -> 26,178-26,454. With halves (not NULL)
 * a merged product leaves its halves unsummed, hi at *halves and lo chunk x nr floats
 * after, for an op that sums them itself (*halves NULL: C was written). */
static bool gemm_call(lm_cuda_backend *cu, bool f32, const void *A, int64_t nr, int64_t cols, const void *xs,
                      int64_t lo_off, int64_t c0, int64_t chunk, float *C, const float **halves = NULL) {
    if (halves) *halves = NULL;
    if (lo_off && lo_off == chunk * cols && c0 == 0) {
        float *C2 = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_YSPLIT, (size_t)(2 * chunk * nr) * 4);
        if (!C2 || !gemm_call1(cu, f32, A, nr, cols, xs, 0, 2 * chunk, C2, false)) return false;
        if (halves) {
            *halves = C2;
            return true;
        }
        halves_sum(cu, C2, chunk * nr, C);
        return cu->err == LM_OK;
    }
    return gemm_call1(cu, f32, A, nr, cols, xs, c0, chunk, C, false) &&
           (!lo_off ||
            gemm_call1(cu, f32, A, nr, cols, (const __nv_bfloat16 *)xs + lo_off, c0, chunk, C, true));
}

/* y = W x on prepared activations xs (gemm_prepare_x with f32 = W is F32). A GEMM of a
 * whole chunk over all rows writes y in place (column-major [chunk][rows] is y's
 * layout); a partial last chunk or a row tile goes through scratch and is copied out.
 * Both have the same shape and leading dimensions, so the same algorithm. defer: the
 * precise mode's halves of an in-place output left for the next op (sum_pending). */
static void gemm_run(lm_cuda_backend *cu, const lm_weight *w, const void *xs, int64_t n, float *y, bool defer = false) {
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t chunk = gemm_chunk_of(cu, n), n_pad = (n + chunk - 1) / chunk * chunk;
    const bool f32 = w->type == LM_DTYPE_F32, bf16 = w->type == LM_DTYPE_BF16;
    const int64_t rt = gemm_row_tile(w, chunk), lo_off = gemm_lo_offset(cu, f32, n, cols);
    const bool whole_rows = rt == rows;

    float *ys = NULL;
    if (!whole_rows || n % chunk != 0) ys = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_Y, (size_t)(chunk * rt) * 4);
    const __nv_bfloat16 *copy = f32 || bf16 ? NULL : w->bf16;
    __nv_bfloat16 *wt = NULL;
    if (!f32 && !bf16 && !copy) wt = (__nv_bfloat16 *)lm_cuda_scratch(cu, LM_CUDA_SCR_WTILE, (size_t)(rt * cols) * 2);
    if (cu->err) return;
    for (int64_t r0 = 0; r0 < rows; r0 += rt) {
        int64_t nr = rows - r0 < rt ? rows - r0 : rt;
        const void *A;
        if (f32)
            A = (const float *)w->data + r0 * cols;
        else if (bf16)
            A = (const __nv_bfloat16 *)w->data + r0 * cols;
        else if (copy)
            A = copy + r0 * cols; /* the tile's rows, decoded once */
        else {
            dispatch_dequant_bf16(cu, w, r0, nr, wt);
            if (cu->err) return;
            A = wt;
        }
        for (int64_t c0 = 0; c0 < n_pad; c0 += chunk) {
            const int64_t nv = n - c0 < chunk ? n - c0 : chunk;
            const bool in_place = whole_rows && nv == chunk;
            float *C = in_place ? y + c0 * rows : ys;
            const float *halves = NULL;
            if (!gemm_call(cu, f32, A, nr, cols, xs, lo_off, c0, chunk, C,
                           in_place && defer && cu->fused ? &halves : NULL))
                return;
            if (halves) cu->sum_pending.dst = C, cu->sum_pending.c2 = halves, cu->sum_pending.count = chunk * rows;
            if (in_place) continue;
            /* ys is column-major [chunk][nr]: token t's nr values are contiguous */
            if (!lm_cuda_ok(cu,
                            cudaMemcpy2DAsync(y + c0 * rows + r0, (size_t)rows * 4, ys, (size_t)nr * 4,
                                              (size_t)nr * 4, (size_t)nv, cudaMemcpyDeviceToDevice, cu->stream),
                            "matmul (output)"))
                return;
        }
    }
}

static bool is_wide(const lm_weight *w) {
    return w->type == LM_DTYPE_F32 || w->type == LM_DTYPE_F16 || w->type == LM_DTYPE_BF16;
}

/* A quantized weight with a bf16 copy (copy_decide): the 16-bit kernels read the copy
 * above the matrix-vector path (which keeps reading the quantized rows: fewer bytes,
 * but in the precise mode the copy too: mv_dispatch). */
static bool reads_copy(const lm_weight *w) { return w->bf16 && !is_wide(w); }

/* w as the bf16 weights its copy holds (view filled in) where it has one, else w */
static const lm_weight *as_copy(const lm_weight *w, lm_weight *view) {
    if (!reads_copy(w)) return w;
    *view = *w;
    view->type = LM_DTYPE_BF16;
    view->data = (void *)w->bf16;
    view->row_bytes = (size_t)w->cols * 2;
    return view;
}

static lm_status mv_dispatch(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                             float *const *y) {
    /* the precise mode: weights with a copy as the bf16 values the GEMMs read, at the
     * bf16 kernel's speed (H200, Q4_K_M 1.5B-shaped, batch 1: 813-816 tokens/s, where
     * rounding its decoded weights, set.round_w, had measured ~611); a run of weights
     * of which only some have copies goes a weight a launch */
    lm_weight view[MV_MAX_SET];
    const lm_weight *vw[MV_MAX_SET];
    int copies = 0;
    for (int k = 0; k < n_w; k++) copies += cu->precise && reads_copy(w[k]);
    if (copies > 0 && (copies < n_w || n_w > MV_MAX_SET)) { /* one format a launch */
        for (int k = 0; k < n_w; k++) {
            lm_status st = mv_dispatch(cu, w + k, 1, x, n, y + k);
            if (st) return st;
        }
        return LM_OK;
    }
    if (copies > 0) {
        for (int k = 0; k < n_w; k++) vw[k] = as_copy(w[k], &view[k]);
        w = vw;
    }
    /* the 8-bit kernel where it takes every weight of the run, else each weight on its
     * own kernel (lm_cuda_mvq_supports is the weight's alone) */
    int q8 = 0;
    for (int k = 0; k < n_w; k++) q8 += lm_cuda_mvq_supports(cu, w[k]);
    if (q8 == n_w) {
        lm_cuda_mvq(cu, w, n_w, x, n, y, false);
        return LM_OK;
    }
    if (q8 > 0) {
        for (int k = 0; k < n_w; k++) {
            lm_status st = mv_dispatch(cu, w + k, 1, x, n, y + k);
            if (st) return st;
        }
        return LM_OK;
    }
    switch (w[0]->type) {
#define LM_X(t) \
    case t: launch_mv<t>(cu, w, n_w, x, n, y); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default:
        return lm_error(LM_ERR_INTERNAL, "matmul: weight type %s has no CUDA kernel", lm_dtype_name(w[0]->type));
    }
    return LM_OK;
}

static lm_status matmul_begin(lm_cuda_backend *cu, const float *x) {
    lm_cuda_enter(cu);
    /* in a pass, errors wait for pass_end (a capture must not be cut short) */
    lm_status st = lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
    if (st) return st;
    if (((uintptr_t)x & 15) != 0)
        return lm_error(LM_ERR_INVALID_ARG, "matmul: activations at %p are not 16-byte aligned", (const void *)x);
    return LM_OK;
}

typedef enum { PATH_MV, PATH_TC, PATH_GEMM } matmul_path;

/* The kernel of n tokens through w: a function of the backend's settings, the weight
 * and n only (so of no other token in the batch). */
static matmul_path path_of(const lm_cuda_backend *cu, const lm_weight *w, int64_t n) {
    const bool wide = is_wide(w), copy = reads_copy(w);
    if (n <= (wide ? cu->mv_max_n : copy ? cu->mv_max_n_copy : cu->mv_max_n_quant)) return PATH_MV;
    if (n <= (wide || copy ? cu->tc_max_n : cu->tc_max_n_quant) && lm_cuda_tc_supports(w)) return PATH_TC;
    return PATH_GEMM;
}

/* The tensor-core product of w[0..n_w) (at most MV_MAX_SET, one format as the kernel
 * reads them): quantized weights with a copy as the bf16 weights their copies are. */
static void tc_run(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                   float *const *y) {
    lm_weight view[MV_MAX_SET];
    const lm_weight *vw[MV_MAX_SET];
    for (int k = 0; k < n_w; k++) vw[k] = as_copy(w[k], &view[k]);
    lm_cuda_matmul_tc(cu, vw, n_w, x, n, y);
}

/* The format the tensor-core kernel reads w in. */
static lm_dtype tc_type(const lm_weight *w) { return reads_copy(w) ? LM_DTYPE_BF16 : w->type; }

/* ---- packed weights on the GEMM path ---------------------------------------------- */

/* w[0..n_w) packed side by side (weight_pack) on the GEMM path for n tokens: one
 * product over all their rows, where separate ones would each pay a small GEMM's
 * latency (measured on the H200 at 64 columns: Q, K and V of a 1.5B model 19.7 us
 * apart, 6.7 us as one; gate and up 20.9 vs 18.1). Or their bf16 copies side by side
 * (a copy set's, whatever the formats: copy_decide). A function of the weights, their
 * outputs' alignment and n only. Quantized packs without copies are decoded whole: at
 * most 64 MiB. */
static bool copies_adjacent(const lm_weight *const *w, int n_w) {
    for (int i = 0; i < n_w; i++)
        if (!w[i]->bf16 || (i > 0 && w[i]->bf16 != w[i - 1]->bf16 + w[i - 1]->rows * w[i - 1]->cols)) return false;
    return true;
}

static bool gemm_packed(const lm_cuda_backend *cu, const lm_weight *const *w, int n_w, int64_t n, float *const *y) {
    if (n_w < 2 || n_w > MV_MAX_SET) return false;
    const bool copies = copies_adjacent(w, n_w);
    bool packed = true;
    int64_t rows_all = 0;
    for (int i = 0; i < n_w; i++) {
        packed = packed && (i == 0 || w[i - 1]->pack_next == w[i]);
        if (path_of(cu, w[i], n) != PATH_GEMM || w[i]->rows % 4 != 0 || ((uintptr_t)y[i] & 15) != 0) return false;
        rows_all += w[i]->rows;
    }
    const bool in_place = w[0]->type == LM_DTYPE_BF16 || w[0]->type == LM_DTYPE_F32;
    return copies || (packed && (in_place || rows_all * w[0]->cols * 2 <= (64LL << 20)));
}

/* Tokens [t0, t0 + nv) of a packed product, ys [nv][rows_all] (row counts multiples of
 * 4), to their weights' outputs y[k] [n][rows[k]]; four floats a thread. */
__global__ void unpack_kernel(const __grid_constant__ mv_set set, const float4 *__restrict__ ys, int64_t t0,
                              int64_t total4) {
    lm_pdl_enter();
    const int rows4 = set.end[set.n_w - 1] / 4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / rows4;
        const int r = (int)(i - t * rows4) * 4, k = mv_which(set, r);
        ((float4 *)(set.y[k] + (t0 + t) * set.rows[k] + r - (k ? set.end[k - 1] : 0)))[0] = ys[i];
    }
}

static void launch_unpack(lm_cuda_backend *cu, const mv_set &set, const float *ys, int64_t c0, int64_t nv) {
    const int64_t total4 = nv * set.end[set.n_w - 1] / 4;
    lm_cuda_launch(cu, unpack_kernel, lm_cuda_blocks(total4, 256), 256, set, (const float4 *)ys, c0, total4);
    lm_cuda_launched(cu, "unpack_kernel");
}

void lm_cuda_qkv_split(lm_cuda_backend *cu) {
    mv_set set;
    memset(&set, 0, sizeof set);
    for (int k = 0; k < 3; k++) {
        set.y[k] = cu->qkv_pending.y[k];
        set.rows[k] = cu->qkv_pending.rows[k];
        set.end[k] = (k ? set.end[k - 1] : 0) + set.rows[k];
    }
    set.n_w = 3;
    const float *ys = cu->qkv_pending.ys;
    cu->qkv_pending.ys = NULL;
    launch_unpack(cu, set, ys, 0, cu->qkv_pending.n);
}

void lm_cuda_sum_flush(lm_cuda_backend *cu) {
    float *dst = cu->sum_pending.dst;
    cu->sum_pending.dst = NULL;
    halves_sum(cu, cu->sum_pending.c2, cu->sum_pending.count, dst);
}

const float *lm_cuda_sum_take(lm_cuda_backend *cu, const float *dst, int64_t count, const float **lo) {
    *lo = NULL;
    if (!cu->sum_pending.dst || cu->sum_pending.dst != dst || cu->sum_pending.count != count) return NULL;
    cu->sum_pending.dst = NULL;
    *lo = cu->sum_pending.c2 + count;
    return cu->sum_pending.c2;
}

const float *lm_cuda_qkv_take(lm_cuda_backend *cu, const float *q, const float *k, const float *v, int64_t n) {
    const float *ys = cu->qkv_pending.ys;
    if (!ys || cu->qkv_pending.n != n || cu->qkv_pending.y[0] != q || cu->qkv_pending.y[1] != k ||
        cu->qkv_pending.y[2] != v)
        return NULL;
    cu->qkv_pending.ys = NULL;
    return ys;
}

/* The packed product (gemm_packed), a chunk of tokens at a time into the YPACK scratch,
 * then split into y[k]; or, with swiglu_out, (gate, up) made silu(gate) * up there.
 * Three weights in one chunk (Q/K/V of a decode step) with the fused ops on are left
 * unsplit (qkv_pending): a qkv_finish right after reads them in place, one launch and
 * one trip through memory fewer. */
static void packed_run(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                       float *const *y, float *swiglu_out) {
    const mv_set set = mv_set_of(w, n_w, y);
    const int64_t rows_all = set.end[n_w - 1], cols = w[0]->cols, chunk = gemm_chunk_of(cu, n);
    const bool f32 = w[0]->type == LM_DTYPE_F32, in_place = f32 || w[0]->type == LM_DTYPE_BF16;
    const void *xs = gemm_prepare_x(cu, f32, x, n, cols);
    if (!xs) return;
    const void *A = w[0]->data; /* in place: a pack of BF16 or F32 weights */
    if (copies_adjacent(w, n_w)) {
        A = w[0]->bf16; /* F32 weights are in no copy set: f32 is false */
    } else if (!in_place) { /* a pack of one format (gemm_packed) */
        __nv_bfloat16 *wt = (__nv_bfloat16 *)lm_cuda_scratch(cu, LM_CUDA_SCR_WTILE, (size_t)(rows_all * cols) * 2);
        if (!wt) return;
        lm_weight span = *w[0];
        span.rows = rows_all;
        dispatch_dequant_bf16(cu, &span, 0, rows_all, wt);
        A = wt;
    }
    float *ys = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_YPACK, (size_t)(chunk * rows_all) * 4);
    if (!ys || cu->err) return;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        const int64_t nv = n - c0 < chunk ? n - c0 : chunk;
        const float *halves = NULL; /* the precise mode's: swiglu sums them itself (a fused op) */
        if (!gemm_call(cu, f32, A, rows_all, cols, xs, gemm_lo_offset(cu, f32, n, cols), c0, chunk, ys,
                       swiglu_out && cu->fused ? &halves : NULL))
            return;
        if (swiglu_out) {
            /* the down projection's bf16 input handed off only when no later chunk's
             * GEMM still reads the activations from the same scratch */
            lm_cuda_swiglu_packed(cu, halves ? halves : ys, halves ? halves + chunk * rows_all : NULL, nv, w[0]->rows,
                                  swiglu_out + c0 * w[0]->rows, nv == n);
        } else if (n_w == 3 && nv == n && cu->fused) {
            cu->qkv_pending.ys = ys;
            cu->qkv_pending.n = n;
            for (int k = 0; k < 3; k++) cu->qkv_pending.y[k] = y[k], cu->qkv_pending.rows[k] = set.rows[k];
        } else {
            launch_unpack(cu, set, ys, c0, nv);
        }
    }
}

extern "C" lm_status lm_cuda_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_status st = matmul_begin(cu, x);
    if (st || n <= 0 || lm_cuda_replaying(cu)) return st;
    copy_decide(cu, w);
    switch (path_of(cu, w, n)) {
    case PATH_MV:
        if (lm_cuda_q8h_take(cu, w, x, n, y)) break; /* a down product over swiglu's 8-bit hand-off */
        if ((st = mv_dispatch(cu, &w, 1, x, n, &y))) return st;
        break;
    case PATH_TC: tc_run(cu, &w, 1, x, n, &y); break;
    case PATH_GEMM: {
        const void *xs = gemm_prepare_x(cu, w->type == LM_DTYPE_F32, x, n, w->cols);
        if (xs) gemm_run(cu, w, xs, n, y, true);
        break;
    }
    }
    return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
}

/* Q/K/V of one token on the matrix-vector path: their outputs side by side in the
 * YPACK scratch (ys[0..3)), as the GEMM path's packed product leaves them
 * (packed_run), so a qkv_finish right after reads them in place or leaves itself to
 * the decode attention (cuda_qkv_finish.cu): at batch 1 one launch and one trip
 * through memory fewer. One token only: the kernels write token t of weight k at
 * y[k] + t * rows[k], the packed layout only for t = 0. */
static bool mv_packed_qkv(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, int64_t n, float *ys[3]) {
    if (n != 1 || n_w != 3 || !cu->fused) return false;
    int64_t rows_all = 0;
    for (int k = 0; k < 3; k++) {
        if (path_of(cu, w[k], n) != PATH_MV || w[k]->rows % 4 != 0) return false; /* the split's float4 copies */
        rows_all += w[k]->rows;
    }
    float *p = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_YPACK, (size_t)rows_all * 4);
    if (!p) return false;
    ys[0] = p, ys[1] = p + w[0]->rows, ys[2] = ys[1] + w[1]->rows;
    return true;
}

extern "C" lm_status lm_cuda_matmul_many(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                                         float *const *y) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_status st = matmul_begin(cu, x);
    if (st || n <= 0 || n_w <= 0 || lm_cuda_replaying(cu)) return st;
    for (int i = 1; i < n_w; i++)
        if (w[i]->cols != w[0]->cols)
            return lm_error(LM_ERR_INVALID_ARG, "matmul_many: weights of %lld and %lld columns share one input",
                            (long long)w[0]->cols, (long long)w[i]->cols);
    copies_decide(cu, w, n_w);
    if (gemm_packed(cu, w, n_w, n, y)) {
        packed_run(cu, w, n_w, x, n, y, NULL);
        return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
    }
    float *const *y_out = y, *y_packed[3];
    if (mv_packed_qkv(cu, w, n_w, n, y_packed)) y = y_packed;
    /* one launch per run of consecutive weights on one path in one format (the
     * tensor-core kernel's: a quantized weight's copy is bf16), or of Q4_K and Q6_K on
     * the 8-bit kernel (lm_cuda_mvq_mixable); on the GEMM path the activations are
     * rounded once for every weight of the same kind (F32 weights take them in f32) */
    const void *xs = NULL;
    int kind = -1;
    for (int i = 0; i < n_w && !cu->err;) {
        const matmul_path path = path_of(cu, w[i], n);
        int j = i + 1;
        int64_t rows = w[i]->rows;
        while (j < n_w && j - i < MV_MAX_SET && path_of(cu, w[j], n) == path &&
               (path == PATH_TC ? tc_type(w[j]) == tc_type(w[j - 1])
                                : w[j]->type == w[j - 1]->type ||
                                      (path == PATH_MV && lm_cuda_mvq_mixable(cu, w[j - 1], w[j], rows))))
            rows += w[j++]->rows;
        switch (path) {
        case PATH_MV:
            if ((st = mv_dispatch(cu, w + i, j - i, x, n, y + i))) return st;
            break;
        case PATH_TC: tc_run(cu, w + i, j - i, x, n, y + i); break;
        case PATH_GEMM:
            for (int k = i; k < j && !cu->err; k++) {
                int f32 = w[k]->type == LM_DTYPE_F32;
                if (f32 != kind) xs = gemm_prepare_x(cu, f32, x, n, w[k]->cols), kind = f32;
                if (xs) gemm_run(cu, w[k], xs, n, y[k]);
            }
            break;
        }
        i = j;
    }
    if (y != y_out && !cu->err) {
        cu->qkv_pending.ys = y[0];
        cu->qkv_pending.n = n;
        for (int k = 0; k < 3; k++) cu->qkv_pending.y[k] = y_out[k], cu->qkv_pending.rows[k] = (int)w[k]->rows;
    }
    return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
}

/* The gate and up products and swiglu (backend.h, matmul_swiglu). On the
 * matrix-vector path one launch computes each (gate, up) row pair and writes silu(g)
 * * u, the swiglu launch of a decode step gone; packed weights on the GEMM path take
 * one product, whose output swiglu reads in place; elsewhere (and for rows so long
 * that four warps take one) the separate ops. */
extern "C" lm_status lm_cuda_matmul_swiglu(lm_backend *b, const lm_weight *w_gate, const lm_weight *w_up,
                                           const float *x, int64_t n, float *gate, float *up) {
    lm_cuda_backend *cu = lm_cuda(b);
    const lm_weight *w[2] = {w_gate, w_up};
    float *y[2] = {gate, up};
    copies_decide(cu, w, 2); /* before the paths; done already when replaying */
    lm_weight view[2]; /* the precise mode's one-token kernel reads the copies (mv_dispatch) */
    const lm_weight *wv[2] = {w_gate, w_up};
    if (cu->precise) wv[0] = as_copy(w_gate, &view[0]), wv[1] = as_copy(w_up, &view[1]);
    if (w_up->rows == w_gate->rows && gemm_packed(cu, w, 2, n, y)) {
        lm_status st = matmul_begin(cu, x);
        if (st || n <= 0 || lm_cuda_replaying(cu)) return st;
        packed_run(cu, w, 2, x, n, y, gate);
        return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
    }
    const bool same = path_of(cu, w_gate, n) == PATH_MV && wv[1]->type == wv[0]->type &&
                      w_up->rows == w_gate->rows && w_up->cols == w_gate->cols;
    if (same && lm_cuda_mvq_supports(cu, w_gate)) {
        lm_status st = matmul_begin(cu, x);
        if (st || n <= 0 || lm_cuda_replaying(cu)) return st;
        lm_cuda_mvq(cu, w, 2, x, n, y, true);
        return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
    }
    const bool one_launch = same && mv_warps_per_row(w_gate->cols / 8, w_gate->rows) <= 2;
    if (!one_launch) {
        lm_status st = lm_cuda_matmul_many(b, w, 2, x, n, y);
        if (st) return st;
        lm_cuda_swiglu(b, gate, up, n * w_gate->rows, gate);
        return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
    }
    lm_status st = matmul_begin(cu, x);
    if (st || n <= 0 || lm_cuda_replaying(cu)) return st;
    switch (wv[0]->type) {
#define LM_X(t) \
    case t: launch_mv<t, true>(cu, wv, 2, x, n, y); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default:
        return lm_error(LM_ERR_INTERNAL, "matmul: weight type %s has no CUDA kernel", lm_dtype_name(wv[0]->type));
    }
    return lm_cuda_recorded_pass(cu) ? LM_OK : lm_cuda_take_error(cu);
}
