/* Decode attention on the tensor cores (mma.sync m16n8k16, f16 inputs, f32
 * accumulation) for decode batches (no token continues the one before it in its
 * sequence; prompt chunks go to cuda_attention_tc.cu or the scalar kernel).
 *
 * A block takes one (token, KV head, split): the query heads sharing that KV head are
 * the rows of the products (up to 16; rows past the group are zeros, computed and
 * dropped), so each key and value is read once for all of them and a KV block of 16
 * positions costs 16 products where the scalar kernel (cuda_attention.cu) spent a
 * lane's fused multiply-adds per position and dimension. A split is DEC_SPLIT_KB KV
 * blocks (256 positions) of the token's context; the block's warps (8 for batches of
 * few blocks, else 4; see the launch) take them in turn (warp w of W: blocks w, w + W, ...),
 * each an online softmax over its blocks
 * (tc_attend_block, as the prefill kernel), and the warps' states are merged in shared
 * memory in warp order. A token with several splits has each write its state and the
 * last to finish merges them in split order (merge_if_last), so a long context at
 * batch 1 still spreads over the GPU. (The scalar kernel took 16 us a layer at 64
 * sequences of ~200 positions and 40 us at 256 on the H200, bound by its instructions;
 * this one 11.5 us at 64. At 1 and 8 sequences it measured slower than the scalar
 * kernel in the third session (593 vs 605 and 3,301 vs 3,368 tokens/s) and faster in
 * the eleventh (H200, 1.5B-shaped, one call: batch 1 586-588 -> 599-601 tokens/s
 * Q4_K_M, 613 -> 627-632 bf16; batch 8 bf16 3,459 -> 3,548-3,556), so every decode
 * batch takes it (at batch 1 with the qkv_finish in its blocks as well, since the
 * matrix-vector path leaves Q/K/V packed: cuda_matmul.cu, mv_packed_qkv). Shorter
 * splits, more blocks for a batch's ~200-position contexts, measured slower: splits
 * of 4 / 8 / 16 KV blocks gave 24,902 / 26,008 / 27,412 tokens/s at 64 sequences and
 * 56,640 / 60,353 / 68,309 at 256, the merges costing more than the parallelism
 * gained; and at batch 1, splits of 8, one KV block a warp: 920-938 vs 944-960 tokens/s
 * Q4_K_M, 743-750 vs 765-768 bf16, seventeenth session.)
 *
 * A warp's first KV block, when it lies wholly before the token's position (written
 * by earlier steps), is requested before the PDL wait, so its keys and values arrive
 * under the kernel before and the qkv_finish: as 16-byte copies into shared memory,
 * made fragments by ldmatrix after the wait (dec_stage_block; eighteenth session,
 * same call: bf16 batch 1 769.8-781.1 -> 786.9-793.3 tokens/s, 256 sequences
 * 79,251-79,399 -> 79,913-80,074, Q4_K_M 980-1,002 both; in block (0, 0), before
 * the wait 1.96 -> 1.15 us, qkv_finish 1.15 -> 0.77) instead of the fragments' own
 * scattered loads. (That block before the wait at all, against after it: side by
 * side on the H200, 1.5B bf16, LUMEN_CUDA_ATTN_DEC_AHEAD=0 for the other, a step's
 * GPU time at 64 sequences 2.032 -> 2.009 ms, 29,735 -> 30,094 tokens/s; at 256,
 * 73,653 -> 74,304.) Loading the
 * token's own block there as well (its row put in from the qkv_finish's shared memory
 * afterwards; branch attn-own-early) measured the same at batch 1 (fourteenth session,
 * H200, 1.5B: bf16 750.7-751.5 vs 743.0-752.0 tokens/s, Q4_K_M 762-766 vs 761-765),
 * and so did the warps' merge taking 4 elements a thread at once (attn-merge-unroll:
 * 745.7-750.6 bf16; 32,865-33,107 vs 32,976-33,504 at 64 sequences), and a merge
 * working out each row's weights once behind one more barrier (attn-merge-scales:
 * 732.7-736.6 vs 721.5-731.5, measured before the merge's shared reads and
 * exponentials left their branches, below); not kept.
 *
 * How a token is split and which warp takes which block depend only on its own
 * position and window and on the block's warp count, and the merge orders are fixed:
 * a token's result never depends on the batch around it, within each warp count (the
 * count follows the batch's size, as the GEMM chunks do). The softmax weights go through the
 * products as two f16 parts (tc_softmax_block's P32), so the result differs from the
 * scalar kernel's f32 weights by summation order only. It serves decode batches from
 * one token (not in the all-matrix-vector configuration, whose decode steps must
 * equal its prompts to the bit); LUMEN_CUDA_ATTN_DEC sets the smallest (0: never).
 * Serving the engine's mixed batches of prompt chunks and decode steps as well, it
 * moved which of the real SmolLM2's 32 prompts generated together differ from alone
 * (golden_engine): 4-5 of 32 at top-two gaps up to 0.063 (with the weights in f16
 * or as two parts alike),
 * against 2-3 at up to 0.045 with the scalar kernel there, over the 0.05 bound; so
 * those batches keep the scalar kernel. F16 caches of block size 16, head sizes 64
 * and 128, up to 16 query heads per KV head. */
#include "backend/cuda/cuda_attention_split.cuh"
#include "backend/cuda/cuda_attention_tc.cuh"
#include "backend/cuda/cuda_bulk.cuh"

enum { DEC_MAX_GROUP = 16, DEC_SPLIT_KB = 16 };

/* A warp's stage (dec_stage_block): one KV block's 16 key rows, then its 16 value
 * rows, of HD + 8 halves each in the kernel's dynamic shared memory, so the 8 rows an
 * ldmatrix reads fall in different banks. It holds the warp's first block (in the
 * 8-warp kernel each block has its own: STAGE_ALL), then (the first) the warp's
 * output state for the merge of the warps (rows of dec_f32_row floats). */
template <int HD>
__host__ __device__ constexpr int dec_stage_row() { return HD + 8; }

/* The f32 rows in shared memory that the warps read or write in the accumulator
 * layout (the qkv_finish's query rows, which tc_start_rows reads; the warps' output
 * states): lane (g, c2) takes row g, columns c2 and c2 + 1. At HD + 8 floats the 8
 * rows are 8 banks apart: a half warp's 8-byte stores (the states) take every bank
 * once, a warp's 4-byte loads (the query rows) two lanes a bank. At HD floats the
 * query rows' 8 rows had fallen in one bank (8-way conflicts), and at HD + 1 the
 * states' in 14 banks. Per-warp clock points in block (0, 0) (H100, 1.5B-shaped,
 * batch 1, thirty-fourth session, branch attn-phases) had the warps ~950 cycles past
 * the qkv_finish barrier before tc_start_rows had its query rows in registers. Same
 * call, main built beside it: Q4_K_M 1,158.5 / 1,164.6 / 1,163.9 -> 1,165.1 /
 * 1,182.4 / 1,183.9 tokens/s (another call: 1,166-1,172 -> 1,184-1,188), the KV
 * phase 3.00 -> 2.61-2.64 us; bf16 the same (KV 3.27 -> 3.12-3.14 us). */
template <int HD>
__host__ __device__ constexpr int dec_f32_row() { return HD + 8; }
template <int HD>
__host__ __device__ constexpr size_t dec_stage_warp_bytes() {
    return (size_t)2 * TC_ROWS * dec_stage_row<HD>() * sizeof(__half);
}
/* A warp's stages: one for each of its blocks in the 8-warp kernel (STAGE_ALL: its
 * DEC_SPLIT_KB / 8 blocks, warp w's i-th stage at w + 8 i, ~139 KB a block at head
 * size 128), one in the 4-warp kernel. A 4-warp form for one token with 3 stages a
 * warp (~109 KB) under a launch bound of 3 blocks an SM (168 registers), meant to fit
 * beside the bf16 Q/K/V product's blocks and do its part before the wait under it
 * (a967ac1, thirty-seventh session), lost: H100, 1.5B-shaped, batch 1, one call,
 * medians of three (thirty-eighth session): bf16 715.8 -> 668.5 tokens/s, Q4_K_M
 * 1,199.7 -> 1,094.5; block (0, 0) before the wait 2.00 -> 2.38 us, the wait 0.19 ->
 * 0.06 (so it did not arrive earlier), the KV blocks 2.10 -> 3.97, the merge 0.95 ->
 * 1.23. */
template <int HD, int WARPS>
__host__ __device__ constexpr int dec_stages_per_warp() {
    return tc_early(HD) && WARPS == 8 ? DEC_SPLIT_KB / WARPS : 1;
}
template <int HD, int WARPS>
__host__ __device__ constexpr size_t dec_stage_bytes() {
    return (size_t)dec_stages_per_warp<HD, WARPS>() * WARPS * dec_stage_warp_bytes<HD>();
}

/* Stage i: warp i % WARPS's (i / WARPS)-th, which holds the split's i-th KV block */
template <int HD>
__device__ __forceinline__ __half *dec_stage_of(uint4 *stages, int i) {
    return (__half *)stages + i * (dec_stage_warp_bytes<HD>() / sizeof(__half));
}

/* Row r of warp w's output state in its stage (stages: the kernel's dynamic shared
 * memory) */
template <int HD>
__device__ __forceinline__ float *dec_state_row(uint4 *stages, int w, int r) {
    return (float *)((uint8_t *)stages + w * dec_stage_warp_bytes<HD>()) + r * dec_f32_row<HD>();
}

/* A KV block's keys and values requested into the warp's stage: 16-byte copies, 16
 * a lane at head size 128, where the fragments' own loads (load_keys, load_values)
 * are 96 a lane of 4 and 2 bytes, scattered. Issuing those before the PDL wait kept
 * the block ~2 us from its wait, and the block reaches its wait only after the kernel
 * before has finished (H200, 1.5B-shaped, batch 1: 0.02 us in the wait; with every
 * request moved after the wait, 0.33 us before it and 0.40 in it), so their issue lay
 * on the step's chain. A lane waits for its copies before the warp's ldmatrix. */
template <int HD>
__device__ __forceinline__ void dec_stage_block(__half *st, const __half *__restrict__ K, const __half *__restrict__ V,
                                                int32_t blk, int64_t d_kv, int64_t head_off, int lane,
                                                int rows = TC_ROWS) {
    constexpr int CH = HD / 8, R = dec_stage_row<HD>();
    const __half *Kb = K + (int64_t)blk * TC_ROWS * d_kv + head_off, *Vb = V + (int64_t)blk * TC_ROWS * d_kv + head_off;
#pragma unroll
    for (int i = lane; i < TC_ROWS * CH; i += 32) {
        const int row = i / CH, ch = i % CH;
        if (row >= rows) continue; /* rows: the first rows only (the token's own block) */
        lm_cp_async16(st + row * R + ch * 8, Kb + row * d_kv + ch * 8);
        lm_cp_async16(st + (TC_ROWS + row) * R + ch * 8, Vb + row * d_kv + ch * 8);
    }
}

__device__ __forceinline__ void dec_ldmatrix_x4(uint32_t r[4], const __half *p, bool trans) {
    const uint32_t a = lm_smem_addr(p);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

/* The staged block as load_keys' and load_values' fragments (the same halves, so the
 * same bits): lane l gives the row of matrix l / 8. Keys: matrices (n tile, half of
 * the 16 dimensions) of slice kc, rows the positions; values: transposed, matrices
 * (half of the 16 positions, dimension tile) for two tiles at once. */
template <int HD>
__device__ __forceinline__ void dec_keys_of_stage(const __half *st, int lane, uint32_t kf[HD / 16][2][2]) {
    constexpr int R = dec_stage_row<HD>();
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) {
        uint32_t x[4];
        dec_ldmatrix_x4(x, st + ((m >> 1) * 8 + r) * R + kc * 16 + (m & 1) * 8, false);
        kf[kc][0][0] = x[0], kf[kc][0][1] = x[1], kf[kc][1][0] = x[2], kf[kc][1][1] = x[3];
    }
}
template <int HD>
__device__ __forceinline__ void dec_values_of_stage(const __half *st, int lane, uint32_t vf[HD / 8][2]) {
    constexpr int R = dec_stage_row<HD>();
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int j = 0; j < HD / 8; j += 2) {
        uint32_t x[4];
        dec_ldmatrix_x4(x, st + (TC_ROWS + (m & 1) * 8 + r) * R + (j + (m >> 1)) * 8, true);
        vf[j][0] = x[0], vf[j][1] = x[1], vf[j + 1][0] = x[2], vf[j + 1][1] = x[3];
    }
}
template <int HD>
__device__ __forceinline__ void dec_frags_of_stage(const __half *st, int lane, uint32_t kf[HD / 16][2][2],
                                                   uint32_t vf[HD / 8][2]) {
    dec_keys_of_stage<HD>(st, lane, kf);
    dec_values_of_stage<HD>(st, lane, vf);
}

/* The warp's stage, once its copies have landed, as the block's fragments (every
 * lane's copies waited for, then the warp's barrier before its ldmatrix). */
template <int HD>
__device__ __forceinline__ void dec_take_stage(const __half *st, int lane, uint32_t kf[HD / 16][2][2],
                                               uint32_t vf[HD / 8][2]) {
    lm_cp_async_wait_all();
    __syncwarp();
    dec_frags_of_stage<HD>(st, lane, kf, vf);
}

/* A staged block's value fragments with the rows past `valid` (the block's last
 * written position) zeroed, as load_value_frag reads them: those rows may never have
 * been written (any bits, NaN included), and a 0 weight times NaN is NaN. */
template <int HD>
__device__ __forceinline__ void dec_mask_values(uint32_t vf[HD / 8][2], int valid, int c2) {
    const uint32_t m0 = (c2 <= valid ? 0x0000ffffu : 0u) | (c2 + 1 <= valid ? 0xffff0000u : 0u);
    const uint32_t m1 = (c2 + 8 <= valid ? 0x0000ffffu : 0u) | (c2 + 9 <= valid ? 0xffff0000u : 0u);
#pragma unroll
    for (int j = 0; j < HD / 8; j++) vf[j][0] &= m0, vf[j][1] &= m1;
}

/* A warp's two staged blocks kb0 and kb1 (> kb0, so kb0 lies wholly before p) as one:
 * both blocks' scores (two independent chains of products), one softmax over their 32
 * keys, then both P V products, where block after block put two chains of products and
 * two softmaxes one after the other. The same sums in another order (one rescale of
 * o, not two). H100, 1.5B-shaped, batch 1, one call, three runs each (thirty-fifth
 * session, branch attn-joint): Q4_K_M 1,185.3 / 1,185.9 / 1,186.2 -> 1,198.8 / 1,199.0
 * / 1,197.5 tokens/s, block (0, 0)'s KV phase 2.43 -> 2.14 us; bf16 699.9 / 698.7 /
 * 699.6 -> 698.6 / 698.5 / 698.4 (its attention arrives after the Q/K/V product, the
 * copies still landing); 64 sequences 28,959 -> 29,090 (one run). */
template <int HD>
__device__ __forceinline__ void dec_attend_pair(const __half *st0, const __half *st1, int kb0, int kb1, int p,
                                                int lane, int c2, const uint32_t qa[HD / 16][4], const int lo[2],
                                                const int pos[2], float scale, float m[2], float l[2],
                                                float o[HD / 8][4]) {
    uint32_t kf[2][HD / 16][2][2];
    lm_cp_async_wait_group<1>();
    __syncwarp();
    dec_keys_of_stage<HD>(st0, lane, kf[0]);
    lm_cp_async_wait_group<0>();
    __syncwarp();
    dec_keys_of_stage<HD>(st1, lane, kf[1]);
    float s[4][4] = {};
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            mma16816(s[nt], qa[kc], kf[0][kc][nt][0], kf[0][kc][nt][1]);
            mma16816(s[2 + nt], qa[kc], kf[1][kc][nt][0], kf[1][kc][nt][1]);
        }
    uint32_t vf[2][HD / 8][2];
    dec_values_of_stage<HD>(st0, lane, vf[0]);
    dec_values_of_stage<HD>(st1, lane, vf[1]);
    const int valid1 = p - kb1 * TC_ROWS;
    if (valid1 < TC_ROWS - 1) dec_mask_values<HD>(vf[1], valid1, c2);
    const int kbs[2] = {kb0, kb1};
    uint32_t pa[2][4], pa_lo[2][4];
    tc_softmax_block<HD, true, 2>(s, kbs, lo, pos, scale, c2, m, l, o, pa, pa_lo);
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        mma16816(o[j], pa[0], vf[0][j][0], vf[0][j][1]);
        mma16816(o[j], pa_lo[0], vf[0][j][0], vf[0][j][1]);
        mma16816(o[j], pa[1], vf[1][j][0], vf[1][j][1]);
        mma16816(o[j], pa_lo[1], vf[1][j][0], vf[1][j][1]);
    }
}

/* LUMEN_CUDA_ATTN_PROFILE=1: the phases of block (0, 0) of each launch, their sums
 * (ns) and the launch count in cu->attn_prof: before the PDL wait, the wait, the
 * qkv_finish, the warps' KV blocks, the merge of the warps (not merge_if_last). */
enum { DEC_PROF_PHASES = 5 };
static const char *const dec_prof_names[DEC_PROF_PHASES] = {"before the wait", "the wait", "qkv_finish",
                                                            "KV blocks", "merge"};

/* dec_finish's rows a pass (a thread per pair of a row, HD / 2 pairs a row) and passes
 * (the group's query rows, the key and the value), shared with its bias hint */
template <int HD, int THREADS>
__host__ __device__ constexpr int dec_finish_rows() { return THREADS / (HD / 2); }
template <int HD, int THREADS, int MAXG>
__host__ __device__ constexpr int dec_finish_passes() {
    return (MAXG + 2 + dec_finish_rows<HD, THREADS>() - 1) / dec_finish_rows<HD, THREADS>();
}

/* dec_finish's pairs: the two dimensions of pair j in a rotated row (RoPE's pair j
 * when j < half, else two dimensions past n_rot passed through) */
__device__ __forceinline__ void dec_pair_dims(const qf_args &f, int j, int *i0, int *i1) {
    const int half = f.n_rot / 2;
    *i0 = j < half ? (f.neox ? j : 2 * j) : f.n_rot + 2 * (j - half);
    *i1 = j < half ? (f.neox ? j + half : 2 * j + 1) : *i0 + 1;
}

/* The two elements of dec_finish's pair j in its row (which 1: the value, whose pairs
 * are 2j, 2j + 1; else the rotated pair's dims i0, i1) */
__device__ __forceinline__ void dec_pair_elems(int which, int j, int i0, int i1, int *e0, int *e1) {
    *e0 = which == 1 ? 2 * j : i0;
    *e1 = which == 1 ? 2 * j + 1 : i1;
}

/* The bias of dec_finish's row r (which < 0: query head h0 + r; 0: the KV head's key;
 * 1: its value) */
__device__ __forceinline__ const float *dec_bias_row(const qf_args &f, int which, int h0, int r, int hk, int hd) {
    return which < 0 ? f.bq + (h0 + r) * hd : (which ? f.bv : f.bk) + hk * hd;
}

/* The biases of dec_finish's pairs for this thread (0 without biases), read before
 * the PDL wait: weights, written at load, and in a decode step a trip to memory each
 * (the whole model streams through L2 between two reads), which after the wait had
 * lain on the chain beside the product's rows, read from L2. H100 (twenty-fifth
 * session), 1.5B-shaped, batch 1, block (0, 0)'s qkv_finish phase 0.83 -> 0.60 us
 * Q4_K_M, 0.76 -> 0.64 bf16; tokens/s Q4_K_M 1,044.6-1,045.5 -> 1,047.8-1,054.6, bf16
 * the same (691.0-692.6 vs 690.5-691.5: a bf16 step's attention block reaches its
 * wait only after the Q/K/V product's blocks have left the SMs, presumably for their
 * other shared-memory split (cuda_internal.cuh, LM_CUDA_CARVEOUT), so what it does
 * before the wait is on the chain there, 1.18 -> 1.37 us). */
template <int HD, int THREADS, int MAXG>
__device__ __forceinline__ void dec_finish_biases(const qf_args &f, int hk, int h0, int group, bool last,
                                                  float b0[dec_finish_passes<HD, THREADS, MAXG>()],
                                                  float b1[dec_finish_passes<HD, THREADS, MAXG>()]) {
    constexpr int ROWS = dec_finish_rows<HD, THREADS>(), PER = dec_finish_passes<HD, THREADS, MAXG>();
    const int j = threadIdx.x % (HD / 2), r0 = threadIdx.x / (HD / 2), rows = group + (last ? 2 : 0);
    int i0, i1;
    dec_pair_dims(f, j, &i0, &i1);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int r = r0 + k * ROWS, which = r - group; /* 0: the key, 1: the value */
        b0[k] = b1[k] = 0.0f;
        if (r >= rows || !f.bq) continue; /* all three biases or none, as qkv_finish */
        int e0, e1;
        dec_pair_elems(which, j, i0, i1, &e0, &e1);
        const float *bias = dec_bias_row(f, which, h0, r, hk, HD);
        b0[k] = bias[e0], b1[k] = bias[e1];
    }
}

/* The qkv_finish of this block's heads (FIN: the op was left to this kernel,
 * cuda_qkv_finish.cu): the group's query rows from the packed product, biased and
 * rotated as qkv_finish_kernel does them (the same roundings), into q_fin (and, by
 * split 0, into q); the split holding the token's own position also makes its KV
 * head's key and value and writes them to k, v and the cache before any warp reads
 * the cache. A thread takes pairs of elements: rows of HD / 2 pairs (the query rows,
 * then the key, then the value), pair j of a rotated row RoPE's pair j when j < half,
 * else two dimensions past n_rot passed through; a row of the value two dimensions. The
 * block's threads are a multiple of HD / 2, so a thread's pairs share j, and (c, s),
 * its angle's, comes in registers from before the wait, as do its biases (b0, b1:
 * dec_finish_biases). Every pair is loaded before the first is rotated and stored, in
 * registers: one barrier at the
 * end where going through shared memory (load, barrier, rotate, barrier, store) took
 * three (H200, 1.5B-shaped, batch 1, seventeenth session, one call: Q4_K_M 938.4-945.3
 * -> 958.4-970.4 tokens/s, bf16 751.5-754.5 -> 763.7-774.0). */
template <int HD, int THREADS, int MAXG>
__device__ void dec_finish(const qf_args &f, float c, float s, int t, int hk, int h0, int group, bool first, bool last,
                           int64_t slot, float (*q_fin)[dec_f32_row<HD>()],
                           const float b0[dec_finish_passes<HD, THREADS, MAXG>()],
                           const float b1[dec_finish_passes<HD, THREADS, MAXG>()], __half *own_st, int own_row) {
    static_assert(THREADS % (HD / 2) == 0, "a thread's pairs share their index in the row");
    constexpr int ROWS = dec_finish_rows<HD, THREADS>(), PER = dec_finish_passes<HD, THREADS, MAXG>();
    const int q_dim = f.n_head * HD, kv_dim = f.n_head_kv * HD, half = f.n_rot / 2, j = threadIdx.x % (HD / 2);
    const int r0 = threadIdx.x / (HD / 2), rows = group + (last ? 2 : 0);
    const float *in = f.in + (int64_t)t * (q_dim + 2 * kv_dim);
    int i0, i1; /* the pair's two dimensions in a rotated row (in the value: 2j, 2j + 1) */
    dec_pair_dims(f, j, &i0, &i1);
    float x0[PER], x1[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int r = r0 + k * ROWS, which = r - group; /* 0: the key, 1: the value */
        x0[k] = x1[k] = 0.0f;
        if (r >= rows) continue;
        int e0, e1;
        dec_pair_elems(which, j, i0, i1, &e0, &e1);
        const int base = which < 0 ? (h0 + r) * HD : q_dim + which * kv_dim + hk * HD;
        x0[k] = in[base + e0], x1[k] = in[base + e1];
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int r = r0 + k * ROWS, which = r - group;
        if (r >= rows) continue;
        float v0 = f.bq ? __fadd_rn(x0[k], b0[k]) : x0[k], v1 = f.bq ? __fadd_rn(x1[k], b1[k]) : x1[k];
        if (which < 1 && j < half) {
            const float u0 = __fsub_rn(__fmul_rn(v0, c), __fmul_rn(v1, s));
            v1 = __fadd_rn(__fmul_rn(v0, s), __fmul_rn(v1, c)), v0 = u0; /* lm_cuda_rope_rotate's roundings */
        }
        if (which < 0) {
            q_fin[r][i0] = v0, q_fin[r][i1] = v1;
            if (first) {
                float *qr = f.q + ((int64_t)t * f.n_head + h0 + r) * HD;
                qr[i0] = v0, qr[i1] = v1;
            }
        } else {
            int e0, e1;
            dec_pair_elems(which, j, i0, i1, &e0, &e1);
            const int64_t i = (int64_t)t * kv_dim + hk * HD, cc = slot * kv_dim + hk * HD;
            float *dst = which ? f.v : f.k;
            __half *cache = (__half *)(which ? f.V : f.K);
            dst[i + e0] = v0, dst[i + e1] = v1;
            cache[cc + e0] = __float2half_rn(v0), cache[cc + e1] = __float2half_rn(v1);
            if (own_st) { /* the row in its warp's stage too (own_st: the kernel's own_smem) */
                __half *sr = own_st + (which * TC_ROWS + own_row) * dec_stage_row<HD>();
                sr[e0] = __float2half_rn(v0), sr[e1] = __float2half_rn(v1);
            }
        }
    }
    /* q_fin for every warp; the warps' key and value loads below read the slot: only
     * this block's (the split holding the position), after this barrier (a
     * __threadfence before it, for other blocks, cost ~0.5 us a layer at 64 sequences) */
    __syncthreads();
}

/* WARPS warps a block; MAXG: the most query heads per KV head it takes (the shared
 * memory of the warps' merge holds WARPS x MAXG rows). FIN: the qkv_finish before it
 * runs here (fin; dec_finish). */
template <int HD, int WARPS, int MAXG, bool FIN>
__global__ void __launch_bounds__(32 * WARPS)
    attn_dec_kernel(const int32_t *__restrict__ meta, int n, int n_head, int n_head_kv, int group, int64_t d_kv,
                    const __half *__restrict__ K, const __half *__restrict__ V, const float *__restrict__ q,
                    int64_t window, float scale, int max_splits, float *__restrict__ out,
                    __nv_bfloat16 *__restrict__ outb, float *__restrict__ part, int *__restrict__ counts,
                    bool ahead, const __grid_constant__ qf_args fin,
                    unsigned long long *prof) {
    constexpr int THREADS = 32 * WARPS;
    /* prof (LUMEN_CUDA_ATTN_PROFILE): block (0, 0)'s clock at its phases, in shared
     * memory (no registers held across the kernel), summed into prof at its end */
    __shared__ uint64_t stamp[DEC_PROF_PHASES + 1];
    const bool profiled = prof && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0;
    if (profiled) stamp[0] = lm_cuda_clock_ns();
    /* a warp's output state (MAXG rows of dec_f32_row floats) goes into its own stage
     * once its last block is in registers: ~33 KB less shared memory a block at head
     * size 128 (~75 KB in the 8-warp block instead of ~107) */
    static_assert(MAXG * dec_f32_row<HD>() * sizeof(float) <= dec_stage_warp_bytes<HD>(),
                  "a warp's state fits its stage");
    __shared__ float ml_sh[WARPS][MAXG][2];
    __shared__ __align__(16) float q_fin[FIN ? MAXG : 1][dec_f32_row<HD>()]; /* 8-byte reads: tc_start_rows */
    __shared__ int last_sh;
    /* the token's place and block table first, while the kernel before this one still
     * runs: the metadata was copied before it (cuda_qkv_finish.cu does the same) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
    const int t = blockIdx.x / n_head_kv, hk = blockIdx.x % n_head_kv, h0 = hk * group, split = blockIdx.y;
    const int p = meta[t], p_lo = window > 0 && p - window + 1 > 0 ? (int)(p - window + 1) : 0;
    const int pos[2] = {p, p}, lo[2] = {p_lo, p_lo};
    const int kb_lo = p_lo / TC_ROWS, kb_last = p / TC_ROWS, n_split = (kb_last - kb_lo) / DEC_SPLIT_KB + 1;
    if (split >= n_split) return; /* a recorded pass's grid holds its longest context */
    const int kb_begin = kb_lo + split * DEC_SPLIT_KB, kb_end = min(kb_last, kb_begin + DEC_SPLIT_KB - 1);
    const int32_t *table = meta + meta[n + t];
    float rc = 1.0f, rs = 0.0f; /* the angle of this thread's RoPE pair (dec_finish) */
    if (FIN && threadIdx.x % (HD / 2) < fin.n_rot / 2)
        lm_cuda_rope_cs_from(fin.rope, fin.rope_len, p, fin.freq_scale, fin.theta, threadIdx.x % (HD / 2), fin.n_rot,
                             &rc, &rs);
    /* ahead: a warp's first KV block, when it lies wholly before the token's own
     * position, was written by earlier steps: its keys and values are loaded before
     * the wait, under the kernel before and this one's qkv_finish */
    const int64_t head_off = (int64_t)hk * HD;
    const int kb_first = kb_begin + warp;
    /* STAGE_ALL with the qkv_finish here (own_smem): the token's own block's rows before
     * p, written by earlier steps, requested before the wait as well, and row p written
     * into the warp's stage by dec_finish as it goes to the cache, so no warp requests
     * copies after the wait. Against requesting the own block after the qkv_finish
     * (H100, 1.5B-shaped, batch 1, one call, four runs each, thirty-fifth session,
     * branch attn-more, LUMEN_X_OWN=1): bf16 702.9 / 701.2 / 703.0 / 702.8 (main) ->
     * 706.0 / 705.8 / 706.0 / 705.4 tokens/s, block (0, 0)'s KV phase 2.55 -> 2.07 us;
     * Q4_K_M 2.18 -> 2.12 us. This form against the commit before it (56668f2), one
     * H100, two rounds (thirty-sixth session, branch own-only): bf16 706.0 / 706.8 ->
     * 714.8 / 713.8 tokens/s, KV phase 2.64 -> 2.04 us; Q4_K_M 1,175.3 / 1,192.7 ->
     * 1,185.9 / 1,193.8, 2.14 -> 2.06 us. */
    constexpr bool STAGE_ALL = tc_early(HD) && WARPS == 8;
    const bool own_smem = STAGE_ALL && FIN && ahead && split == n_split - 1;
    const int own_row = p % TC_ROWS;
    const bool early = ahead && tc_early(HD) && kb_first <= kb_end && (kb_first < kb_last || own_smem);
    uint32_t kf[HD / 16][2][2], vf[tc_early(HD) ? HD / 8 : 1][2];
    /* the first block's table entry before the wait as well, early or not: a warp
     * starting on the token's own block then reads no table after the qkv_finish */
    int32_t blk = kb_first <= kb_end ? table[kb_first] : 0;
    /* STAGE_ALL: its second block's too, so its copies wait on no table read */
    static_assert(!STAGE_ALL || dec_stages_per_warp<HD, WARPS>() == 2, "a warp's two blocks, a stage and a group each");
    const bool has2 = STAGE_ALL && kb_first + WARPS <= kb_end;
    const int32_t blk2 = has2 ? table[kb_first + WARPS] : 0;
    extern __shared__ __align__(16) uint4 dec_stage_words[]; /* dec_stage_bytes */
    __half *const stage = dec_stage_of<HD>(dec_stage_words, warp);
    __half *const stage2 = STAGE_ALL ? dec_stage_of<HD>(dec_stage_words, warp + WARPS) : nullptr;
    /* STAGE_ALL: a commit group a block, block 0's first (early2 implies early) */
    const bool early2 = has2 && ahead && (kb_first + WARPS < kb_last || own_smem);
    const int rows1 = kb_first == kb_last ? own_row : TC_ROWS, rows2 = kb_first + WARPS == kb_last ? own_row : TC_ROWS;
    if (early) dec_stage_block<HD>(stage, K, V, blk, d_kv, head_off, lane, rows1);
    if constexpr (STAGE_ALL) {
        if (early) lm_cp_async_commit();
        if (early2) dec_stage_block<HD>(stage2, K, V, blk2, d_kv, head_off, lane, rows2), lm_cp_async_commit();
    }
    float fb0[FIN ? dec_finish_passes<HD, THREADS, MAXG>() : 1], fb1[FIN ? dec_finish_passes<HD, THREADS, MAXG>() : 1];
    if constexpr (FIN) dec_finish_biases<HD, THREADS, MAXG>(fin, hk, h0, group, split == n_split - 1, fb0, fb1);
    if (profiled) stamp[1] = lm_cuda_clock_ns();
    lm_pdl_enter();
    if (profiled) stamp[2] = lm_cuda_clock_ns();
    if constexpr (FIN)
        dec_finish<HD, THREADS, MAXG>(fin, rc, rs, t, hk, h0, group, split == 0, split == n_split - 1,
                                      (int64_t)table[p / TC_ROWS] * TC_ROWS + p % TC_ROWS, q_fin, fb0, fb1,
                                      own_smem ? dec_stage_of<HD>(dec_stage_words, kb_last - kb_begin) : nullptr,
                                      own_row);
    if (profiled) stamp[3] = lm_cuda_clock_ns();
    if constexpr (STAGE_ALL) { /* the blocks not requested before the wait (the token's own), in order */
        if (!early && kb_first <= kb_end)
            dec_stage_block<HD>(stage, K, V, blk, d_kv, head_off, lane), lm_cp_async_commit();
        if (has2 && !early2) dec_stage_block<HD>(stage2, K, V, blk2, d_kv, head_off, lane), lm_cp_async_commit();
    }
    /* the group's query heads are the rows */
    uint32_t qa[HD / 16][4];
    float o[HD / 8][4], m[2], l[2];
    tc_start_rows<HD>(FIN ? &q_fin[0][0] : q + ((int64_t)t * n_head + h0) * HD, FIN ? dec_f32_row<HD>() : HD, group,
                      g, c2, qa, o, m, l);

    if constexpr (STAGE_ALL) {
        /* a stage a block, each requested before the wait (ahead; the token's own
         * block's row p then comes from dec_finish: own_smem) or else right after the
         * qkv_finish's barrier, each waited for by its own commit group; a warp's two
         * blocks taken as one (dec_attend_pair).
         * Against the first block alone staged (H200, 1.5B-shaped, same call, eighteenth
         * session): batch 1 bf16 785.7-794.2 -> 800.9-807.1 tokens/s, Q4_K_M
         * 989.8-997.8 -> 1,013.9-1,019.9; 64 sequences 33,540 -> 33,971 (one run each;
         * 187 registers instead of 254). The 4-warp kernel (more items than twice the
         * SMs) keeps the fragments' own loads for its later blocks: staged, its 256
         * sequences went 79,997-80,086 -> 78,605-78,631 (up to 4 blocks a warp, each
         * copy waited for in turn).
         * The second block had shared the first's stage, requested once the first was in
         * registers; per-warp clock points (H100, 1.5B-shaped, batch 1, thirty-fourth
         * session, branch attn-phases) had a warp 700-1,000 cycles issuing those copies
         * and ~450 more until they had landed, on the step's chain. Its own stage, the
         * copies requested before the wait (H100, 1.5B-shaped, same calls, 8 runs each,
         * thirty-fifth session, branch attn-2stage): Q4_K_M batch 1 median 1,164.3 ->
         * 1,176.5 tokens/s, with the query rows read 8 bytes a load (tc_start_rows)
         * 1,178.4; bf16 703.8 / 701.0 -> 703.7 / 701.6; 64 sequences 29,324 -> 29,277
         * (one run). What the phase was made of before (same branch, parts left out,
         * outputs wrong): without the Q K products, the P V products or the exponentials
         * it was at most ~0.2 us shorter each, without a block's work altogether
         * (copies and ldmatrix kept) 3.2 -> 2.0 us. */
        if (has2) {
            dec_attend_pair<HD>(stage, stage2, kb_first, kb_first + WARPS, p, lane, c2, qa, lo, pos, scale, m, l, o);
        } else if (kb_first <= kb_end) {
            dec_take_stage<HD>(stage, lane, kf, vf);
            const int valid = p - kb_first * TC_ROWS;
            if (valid < TC_ROWS - 1) dec_mask_values<HD>(vf, valid, c2);
            int32_t none = 0; /* no next block: tc_attend_block reads no table */
            tc_attend_block<HD, true, true>(K, V, table, kb_first, -1, none, valid, d_kv, head_off, g, c2, qa, kf, lo,
                                            pos, scale, m, l, o, vf);
        }
    } else {
        int kb = kb_first;
        if (early) {
            if constexpr (tc_early(HD)) {
                dec_take_stage<HD>(stage, lane, kf, vf);
                const int next = kb + WARPS <= kb_end ? kb + WARPS : -1;
                tc_attend_block<HD, true, true>(K, V, table, kb, next, blk, p - kb * TC_ROWS, d_kv, head_off, g, c2,
                                                qa, kf, lo, pos, scale, m, l, o, vf);
            }
            kb += WARPS;
        } else if (kb_first <= kb_end) {
            load_keys<HD>(K, blk, d_kv, head_off, g, c2, kf);
        }
        for (; kb <= kb_end; kb += WARPS) {
            const int next = kb + WARPS <= kb_end ? kb + WARPS : -1;
            tc_attend_block<HD, true>(K, V, table, kb, next, blk, p - kb * TC_ROWS, d_kv, head_off, g, c2, qa, kf,
                                      lo, pos, scale, m, l, o);
        }
    }

    /* each warp's state, then the warps merged in warp order (a warp without blocks:
     * max -inf, weight 0): the output, or with several splits this split's state
     * (max, sum, unnormalized output) for merge_if_last */
    __syncwarp(); /* every lane past its last ldmatrix of the stage */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        if (r >= group) continue;
        if (c2 == 0) ml_sh[warp][r][0] = m[i], ml_sh[warp][r][1] = l[i];
        float *const orow = dec_state_row<HD>(dec_stage_words, warp, r);
#pragma unroll
        for (int j = 0; j < HD / 8; j++) *(float2 *)(orow + j * 8 + c2) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
    }
    __syncthreads();
    if (profiled) stamp[4] = lm_cuda_clock_ns();
    for (int e = threadIdx.x; e < group * HD; e += THREADS) {
        const int r = e / HD, d = e % HD;
        /* every warp's state read and every weight taken before the sums in warp order,
         * a warp without blocks dropped by selects (the same sums): with `if (mw ==
         * -inf) continue` each warp had a branch, its shared read and exponential inside
         * it waiting on the warp before (SASS, sm_90a). Each row's weights taken once
         * by a thread for up to 4 of the row's elements instead (3ca5c72), measured in a
         * tree of knobs first, was slower in main's form: H100, 1.5B-shaped, batch 1, one
         * machine, five rounds (thirty-sixth session, against branch own-only, this
         * form): this loop 0.98 -> 1.21 us Q4_K_M, 0.94 -> 1.07 bf16 (block (0, 0)),
         * Q4_K_M 1,193.8 -> 1,188.6 tokens/s, bf16 714.7 -> 713.2 (medians). 4 elements
         * at a time with every element's weights: 1.34 -> 2.09 us, Q4_K_M -3%. Each
         * row's weights worked out by one thread behind one more barrier (branch
         * merge-wt, thirty-fourth session): this loop 0.93 -> 0.64 us, but the phase
         * before it 2.61 -> 2.89, tokens/s within 0.3%. The warps merged in a tree of
         * pairs in registers instead (the upper half's warps writing their states
         * lane-major into their stages, the lower half's taking them at a named barrier
         * a pair, warp 0 writing the output; commit ac7f7f8, thirty-seventh
         * session, H100): this phase 0.95 -> 2.77 us, Q4_K_M 1,191.5 -> 1,133.3 tokens/s,
         * bf16 710.2 -> 690.5 (medians of three); presumably one warp's 32 divisions and
         * 32 output stores a lane, not established. */
        float mw[WARPS], lw[WARPS], ow[WARPS], c[WARPS];
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            mw[w] = ml_sh[w][r][0], lw[w] = ml_sh[w][r][1], ow[w] = dec_state_row<HD>(dec_stage_words, w, r)[d];
            M = fmaxf(M, mw[w]);
        }
#pragma unroll
        for (int w = 0; w < WARPS; w++) c[w] = expf(mw[w] - M);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const bool none = mw[w] == -INFINITY;
            const float Lw = fmaf(lw[w], c[w], L), Ow = fmaf(ow[w], c[w], O);
            L = none ? L : Lw, O = none ? O : Ow;
        }
        if (n_split == 1) {
            store_out(out, outb, ((int64_t)t * n_head + h0 + r) * HD + d, O / L);
        } else {
            float *pp = part + (((size_t)t * n_head + h0 + r) * max_splits + split) * (HD + 2);
            if (d == 0) pp[0] = M, pp[1] = L;
            pp[2 + d] = O;
        }
    }
    if (profiled) {
        stamp[5] = lm_cuda_clock_ns();
        for (int i = 0; i < DEC_PROF_PHASES; i++) atomicAdd(prof + i, stamp[i + 1] - stamp[i]);
        atomicAdd(prof + DEC_PROF_PHASES, 1ull);
    }
    if (n_split > 1)
        merge_if_last<HD / 32, WARPS>(part, out, outb, counts, blockIdx.x, t, n_head, h0, group, HD, n_split,
                                          max_splits, &last_sh);
}

/* The kernel's dynamic shared memory (its warps' stages, past 48 KB in the 8-warp
 * kernel at head size 128) allowed once a backend for each form
 * (cu->attn_dec_smem: a bit a form; the attribute is the function's, on the
 * backend's device). An error is recorded when it is refused.
 * The 8-warp block at batch 1 padded to 222 KB after 8-bit Q/K/V products only, so it
 * had an SM to itself as the one-row norm does (cuda_rms_norm.cu; 06e942c, thirty-
 * seventh session, one H100 call, medians of three): Q4_K_M 1,195.7 -> 1,177.1
 * tokens/s; not kept. Its op tests decoded the Qwen2 Q4_K model wrong, presumably
 * because the attribute is the function's, process-wide: another backend of the test
 * set it back to the stages' size and the padded launches failed. A size that differs
 * between backends must be asked for again before each launch. */
template <int HD, int WARPS, int MAXG, bool FIN>
static bool dec_allow(lm_cuda_backend *cu) {
    const size_t bytes = dec_stage_bytes<HD, WARPS>();
    const unsigned bit = 1u << ((HD == 64 ? 0 : 4) + (WARPS == 8 ? 0 : 2) + (FIN ? 1 : 0));
    if (cu->attn_dec_smem & bit) return true;
    if (!lm_cuda_ok(cu, cudaFuncSetAttribute(attn_dec_kernel<HD, WARPS, MAXG, FIN>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                    "decode attention (shared memory for its KV stages)"))
        return false;
    cu->attn_dec_smem |= bit;
    return true;
}

bool lm_cuda_attention_dec_supports(const lm_kv_cache *kv, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return kv->type == LM_DTYPE_F16 && kv->block_size == TC_ROWS && (head_dim == 64 || head_dim == 128) &&
           n_head / n_head_kv <= DEC_MAX_GROUP;
}

void lm_cuda_attention_dec(lm_cuda_backend *cu, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                           const int32_t *meta, const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           int64_t window, float scale, int max_splits, float *out, __nv_bfloat16 *outb, float *part,
                           int *counts, const qf_args *fin) {
    const int64_t n = batch->n_tokens, group = n_head / n_head_kv;
    const int64_t d_kv = kv->n_embd_kv;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d_kv) * kv->elem_size;
    const __half *K = (const __half *)((const uint8_t *)kv->k + layer_off);
    const __half *V = (const __half *)((const uint8_t *)kv->v + layer_off);
    const dim3 grid((unsigned)(n * n_head_kv), (unsigned)max_splits);
    /* 8 warps a block while the blocks with work (a (token, KV head) each, for contexts
     * up to a split) are fewer than the 4-warp kernel's resident slots (2 an SM at its
     * registers), so the SMs' idle warp slots take half of each block's KV blocks;
     * 4 warps beyond (measured on the H200, 1.5B bf16: 27,829 vs 27,089 tokens/s at 64
     * sequences, 128 items; 61,823 vs 67,692 at 256, 512 items). And 4 where the group
     * does not fit the 8-warp merge's shared memory. LUMEN_CUDA_ATTN_DEC_WARPS=4 or 8
     * forces one. */
    if (cu->attn_prof_on && !cu->attn_prof && cu->pass_mode != LM_CUDA_PASS_CAPTURE) {
        const size_t bytes = (DEC_PROF_PHASES + 1) * sizeof(unsigned long long);
        if (cudaMalloc(&cu->attn_prof, bytes) != cudaSuccess || cudaMemset(cu->attn_prof, 0, bytes) != cudaSuccess) {
            cudaFree(cu->attn_prof); /* no profile; the error is not the attention's */
            cu->attn_prof = NULL;
            cudaGetLastError();
        }
    }
    const int64_t items = n * n_head_kv;
    const bool eight = group <= 8 && (cu->attn_dec_warps ? cu->attn_dec_warps == 8 : items <= 2 * (int64_t)cu->n_sm);
    qf_args none;
    memset(&none, 0, sizeof none);
    const qf_args &f = fin ? *fin : none;
#define LM_DEC(H, W, G, F)                                                                                           \
    (dec_allow<H, W, G, F>(cu)                                                                                       \
         ? lm_cuda_launch_smem(cu, attn_dec_kernel<H, W, G, F>, grid, 32 * W, dec_stage_bytes<H, W>(), meta,         \
                               (int)n, (int)n_head, (int)n_head_kv, (int)group, d_kv, K, V, q, window, scale,        \
                               max_splits, out, outb, part, counts, cu->attn_dec_ahead, f, cu->attn_prof)            \
         : (void)0)
#define LM_DEC_WARPS(H, F) (eight ? LM_DEC(H, 8, 8, F) : LM_DEC(H, 4, DEC_MAX_GROUP, F))
    if (head_dim == 64)
        fin ? LM_DEC_WARPS(64, true) : LM_DEC_WARPS(64, false);
    else
        fin ? LM_DEC_WARPS(128, true) : LM_DEC_WARPS(128, false);
#undef LM_DEC_WARPS
#undef LM_DEC
    lm_cuda_launched(cu, "attn_dec_kernel");
}

void lm_cuda_attention_profile_print(lm_cuda_backend *cu) {
    if (!cu->attn_prof) return;
    unsigned long long t[DEC_PROF_PHASES + 1];
    if (cudaStreamSynchronize(cu->stream) == cudaSuccess &&
        cudaMemcpy(t, cu->attn_prof, sizeof t, cudaMemcpyDeviceToHost) == cudaSuccess && t[DEC_PROF_PHASES]) {
        fprintf(stderr, "decode attention profile: block (0, 0) of %llu launches, mean us:", t[DEC_PROF_PHASES]);
        for (int i = 0; i < DEC_PROF_PHASES; i++)
            fprintf(stderr, " %s %.2f%s", dec_prof_names[i], 1e-3 * (double)t[i] / (double)t[DEC_PROF_PHASES],
                    i + 1 < DEC_PROF_PHASES ? "," : "\n");
    }
    cudaFree(cu->attn_prof);
    cu->attn_prof = NULL;
}
