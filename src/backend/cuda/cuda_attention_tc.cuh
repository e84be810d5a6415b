/* What the tensor-core attention kernels share (prefill: cuda_attention_tc.cu, decode
 * batches: cuda_attention_dec.cu): the m16n8k16 product on f16 inputs, the fragments
 * of a KV block of 16 positions, and the online softmax of one block's scores. */
#ifndef LM_BACKEND_CUDA_ATTENTION_TC_CUH
#define LM_BACKEND_CUDA_ATTENTION_TC_CUH

#include "backend/cuda/cuda_internal.cuh"

enum { TC_ROWS = 16 };

/* D += A B on one m16n8k16 tile: A 16x16 f16 (4 regs of two halves), B 16x8 f16 (2
 * regs), D 16x8 f32 (4 floats). Fragment layouts (PTX ISA, mma.m16n8k16): with
 * g = lane / 4 and c = 2 (lane % 4): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1],
 * a2 = A[g][c+8..c+9], a3 = A[g+8][c+8..c+9]; b0 = B[c..c+1][g], b1 = B[c+8..c+9][g];
 * d0,d1 = D[g][c..c+1], d2,d3 = D[g+8][c..c+1]. */
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}


/* The keys of KV block kb as the B fragments of S = Q K^T: for each 16-dimension
 * slice kc and n8 tile nt, this lane's two registers (key row nt * 8 + g, dimensions
 * kc * 16 + c2.. and + 8..). */
__device__ __forceinline__ void key_frag(const __half *__restrict__ Kb, int kc, int nt, int64_t d_kv, int g, int c2,
                                         uint32_t *b0, uint32_t *b1) {
    const __half *kr = Kb + (int64_t)(nt * 8 + g) * d_kv + kc * 16 + c2;
    *b0 = *(const uint32_t *)kr;
    *b1 = *(const uint32_t *)(kr + 8);
}

/* The keys of the KV block at cache block blk (its block table entry) as key_frag's
 * fragments. The callers pass the entry in a register, loaded ahead: a table read here
 * put a trip to memory before the keys' own. */
template <int HD>
__device__ __forceinline__ void load_keys(const __half *__restrict__ K, int32_t blk, int64_t d_kv, int64_t head_off,
                                          int g, int c2, uint32_t kf[HD / 16][2][2]) {
    const __half *Kb = K + (int64_t)blk * TC_ROWS * d_kv + head_off;
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) key_frag(Kb, kc, nt, d_kv, g, c2, &kf[kc][nt][0], &kf[kc][nt][1]);
}

/* This thread's A fragments of 16 query rows, row r at base + r * stride (rows from
 * `valid` on are zeros), rounded to f16 as the keys; and the empty output state.
 * base and stride even: a lane's two columns are one 8-byte load (from the decode
 * attention's shared query rows two 4-byte loads had each taken two lanes a bank). */
template <int HD>
__device__ __forceinline__ void tc_start_rows(const float *__restrict__ base, int64_t stride, int valid, int g, int c2,
                                              uint32_t qa[HD / 16][4], float o[HD / 8][4], float m[2], float l[2]) {
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i & 1), col = kc * 16 + c2 + 8 * (i >> 1);
            const float2 v = r < valid ? *(const float2 *)(base + r * stride + col) : make_float2(0.0f, 0.0f);
            qa[kc][i] = pack_half2(v.x, v.y);
        }
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
}

/* Value rows c2, c2 + 1 and c2 + 8, c2 + 9 of dimension j * 8 + g of a KV block as
 * the B fragment (two registers) of O += P V for dimension tile j. Rows past `valid`
 * (the tile's last position) may never have been written (any bits, NaN included):
 * read as zeros, so 0-weights stay 0. */
__device__ __forceinline__ void load_value_frag(const __half *__restrict__ Vb, int j, int valid, int64_t d_kv, int g,
                                                int c2, uint32_t *b0, uint32_t *b1) {
    const int col = j * 8 + g;
    __half v0 = __float2half(0.0f), v1 = v0, v2 = v0, v3 = v0;
    if (c2 <= valid) v0 = Vb[(int64_t)c2 * d_kv + col];
    if (c2 + 1 <= valid) v1 = Vb[(int64_t)(c2 + 1) * d_kv + col];
    if (c2 + 8 <= valid) v2 = Vb[(int64_t)(c2 + 8) * d_kv + col];
    if (c2 + 9 <= valid) v3 = Vb[(int64_t)(c2 + 9) * d_kv + col];
    *b0 = pack_halves(v0, v1), *b1 = pack_halves(v2, v3);
}

/* The online softmax of NB KV blocks' scores s (two n8 tiles a block, block b's
 * positions from kbs[b] * TC_ROWS; the accumulator layout: row g + 8 i in entries 2i,
 * 2i + 1) for this thread's rows g and g + 8, whose keys lie in [lo[i], pos[i]]: the
 * running max m and sum l updated once for all NB blocks, the output o rescaled, and
 * block b's weights P as the A fragment pa[b] of O += P V. A row's 16 scores a block
 * sit in the 4 lanes of its quad; l sums the weights actually applied. P32 false: P rounded to f16,
 * as the CPU reference rounds its softmax weights. P32 true: P kept to about f32
 * precision as two f16 parts, pa (the weight rounded) and pa_lo (what rounding lost),
 * each taken through the product: the result then differs from the scalar kernel's
 * f32 weights by summation order only. */
template <int HD, bool P32, int NB = 1>
__device__ __forceinline__ void tc_softmax_block(const float s[2 * NB][4], const int kbs[NB], const int lo[2],
                                                 const int pos[2], float scale, int c2, float m[2], float l[2],
                                                 float o[HD / 8][4], uint32_t pa[NB][4], uint32_t pa_lo[NB][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float sv[4 * NB];
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int p = kbs[b] * TC_ROWS + nt * 8 + c2 + e;
                    const bool ok = p >= lo[i] && p <= pos[i];
                    sv[4 * b + 2 * nt + e] = ok ? __fmul_rn(scale, s[2 * b + nt][2 * i + e]) : -INFINITY;
                }
        float mx = fmaxf(fmaxf(sv[0], sv[1]), fmaxf(sv[2], sv[3]));
#pragma unroll
        for (int b = 1; b < NB; b++)
            mx = fmaxf(mx, fmaxf(fmaxf(sv[4 * b], sv[4 * b + 1]), fmaxf(sv[4 * b + 2], sv[4 * b + 3])));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mx, m[i]);
        /* every exponential taken, then the -inf ones dropped (the same values): with
         * `x == -inf ? 0 : expf(...)` ptxas gave each its own branch, and a row's five
         * ran one after another (SASS, sm_90a) */
        float ex[4 * NB + 1];
#pragma unroll
        for (int k = 0; k < 4 * NB; k++) ex[k] = expf(sv[k] - mx);
        ex[4 * NB] = expf(m[i] - mx);
        const float corr = m[i] == -INFINITY ? 0.0f : ex[4 * NB];
        __half ph[4 * NB], pl[4 * NB];
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4 * NB; k++) {
            const float e = sv[k] == -INFINITY ? 0.0f : ex[k];
            ph[k] = __float2half_rn(e);
            if constexpr (P32) {
                pl[k] = __float2half_rn(e - __half2float(ph[k]));
                sum += e;
            } else {
                sum += __half2float(ph[k]);
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l[i] = l[i] * corr + sum;
        m[i] = mx;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) o[j][2 * i] *= corr, o[j][2 * i + 1] *= corr;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            pa[b][i] = pack_halves(ph[4 * b], ph[4 * b + 1]);         /* keys c2, c2+1      (n tile 0) */
            pa[b][2 + i] = pack_halves(ph[4 * b + 2], ph[4 * b + 3]); /* keys 8+c2, 8+c2+1 (n tile 1) */
            if constexpr (P32)
                pa_lo[b][i] = pack_halves(pl[4 * b], pl[4 * b + 1]),
                pa_lo[b][2 + i] = pack_halves(pl[4 * b + 2], pl[4 * b + 3]);
        }
    }
}

/* The values of the KV block at cache block blk (keys [0, valid] of it exist) as B
 * fragments, as tc_attend_block loads them. */
template <int HD>
__device__ __forceinline__ void load_values(const __half *__restrict__ V, int32_t blk, int valid, int64_t d_kv,
                                            int64_t head_off, int g, int c2, uint32_t vf[HD / 8][2]) {
    const __half *Vb = V + (int64_t)blk * TC_ROWS * d_kv + head_off;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) load_value_frag(Vb, j, valid, d_kv, g, c2, &vf[j][0], &vf[j][1]);
}

/* Keys and values in registers ahead of their use (HD <= 128); at head size 256 the
 * registers hold neither: each is loaded where it is used. */
__host__ __device__ constexpr bool tc_early(int hd) { return hd <= 128; }

/* KV block kb (keys [0, valid] of it exist) through this warp's query rows qa: S =
 * Q K^T (two n8 tiles), the online softmax (tc_softmax_block, P32 as there), O += P V.
 * With
 * tc_early(HD), kf holds kb's keys as B fragments on entry and block `next`'s on exit
 * (next < 0: none), loaded while this block's scores and softmax are computed, and
 * the values are loaded as the block starts: a block costs about one trip to memory
 * instead of two after each other. blk: kb's block table entry on entry, next's on
 * exit. Reading the table here for kb (again: its entry came with its keys) and for
 * next only after the products had each block's values, and with them its products
 * (ptxas put them after the loads), wait on a table read, and next's keys on another
 * (SASS, sm_90a). */
template <int HD, bool P32, bool V_IN = false>
__device__ __forceinline__ void tc_attend_block(const __half *__restrict__ K, const __half *__restrict__ V,
                                                const int32_t *table, int kb, int next, int32_t &blk, int valid,
                                                int64_t d_kv, int64_t head_off, int g, int c2,
                                                const uint32_t qa[HD / 16][4], uint32_t kf[][2][2], const int lo[2],
                                                const int pos[2], float scale, float m[2], float l[2],
                                                float o[HD / 8][4], const uint32_t (*v_in)[2] = nullptr) {
    constexpr bool early = tc_early(HD);
    static_assert(early || !V_IN, "values loaded ahead need the registers of tc_early");
    /* (at head size 256 next's entry is read at the end: held across the block it
     * cost a spill) */
    const int32_t blk_next = early && next >= 0 ? table[next] : 0;
    const __half *Vb = V + (int64_t)blk * TC_ROWS * d_kv + head_off;
    uint32_t vf[early ? HD / 8 : 1][2];
    if constexpr (early)
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            if constexpr (V_IN) /* V_IN: this block's values, loaded by the caller (load_values) */
                vf[j][0] = v_in[j][0], vf[j][1] = v_in[j][1];
            else
                load_value_frag(Vb, j, valid, d_kv, g, c2, &vf[j][0], &vf[j][1]);
        }
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if constexpr (early) {
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) mma16816(s[nt], qa[kc], kf[kc][nt][0], kf[kc][nt][1]);
        if (next >= 0) load_keys<HD>(K, blk_next, d_kv, head_off, g, c2, kf);
    } else {
        const __half *Kb = K + (int64_t)blk * TC_ROWS * d_kv + head_off;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                uint32_t b0, b1;
                key_frag(Kb, kc, nt, d_kv, g, c2, &b0, &b1);
                mma16816(s[nt], qa[kc], b0, b1);
            }
    }
    uint32_t pa[1][4], pa_lo[1][4];
    const int kbs[1] = {kb};
    tc_softmax_block<HD, P32, 1>(s, kbs, lo, pos, scale, c2, m, l, o, pa, pa_lo);
    if constexpr (early) {
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            mma16816(o[j], pa[0], vf[j][0], vf[j][1]);
            if constexpr (P32) mma16816(o[j], pa_lo[0], vf[j][0], vf[j][1]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            uint32_t b0, b1;
            load_value_frag(Vb, j, valid, d_kv, g, c2, &b0, &b1);
            mma16816(o[j], pa[0], b0, b1);
            if constexpr (P32) mma16816(o[j], pa_lo[0], b0, b1);
        }
    }
    blk = early ? blk_next : next >= 0 ? table[next] : 0;
}

#endif
