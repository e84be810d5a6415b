/* The down product of a decode step over swiglu's output in 8 bits, handed off by the
 * gate/up product before it (mv_q8h): dp4a on the weights' codes, for Q4_K and Q6_K
 * weights whose rows are too long for the 8-bit kernel to quantize its input itself.
 *
 * Why: the down projections (8,960 columns for a 1.5B model) took the exact f32
 * kernel (cuda_matmul.cu), which decodes every weight to f32: ~16 instructions an
 * element in its SASS, so on the H200 the Q4_K ones ran at 0.86 TB/s of their bytes,
 * bound by issuing instructions (Nsight Compute: 0.68 issued per scheduler a cycle),
 * 9 us of a 1.5B model's ~38 us layer. The 8-bit kernel (cuda_matmul_q8.cu) quantizes
 * its input in every block, which for 8,960 values costs more than the product; a
 * first form that quantized it once per launch, by ticket, was slower still. Here the
 * gate/up kernel, which has each h in a register anyway, writes the codes as it writes
 * h (a scale per 32 values: every block holds whole groups), so the down kernel only
 * reads them.
 *
 * Arithmetic: per token, per sub-block of 32 values (Q4_K's scale sc and min m, the
 * super-block's d and dmin, the activations' da), S = sum c * q over the 32 (exact in
 * int32), M = sum q, and acc = fma(sc * S, d * da, acc), acc = fma(-(m * M), dmin *
 * da, acc); Q6_K's runs of 16 under a scale each, two to a da: S = sum_run sc (dot -
 * 32 sum q), acc = fma(S, d * da, acc). In a fixed order: each lane its chunks in
 * order, then a fixed butterfly
 * over the warp. A token's result depends on its own activations alone (batch
 * invariant); it is not the CPU's bits (the CPU quantizes by 256 values) nor the f32
 * kernel's, and within the 8-bit products' tolerance of both.
 *
 * Layout: a warp a row, lane l taking chunks of 64 values l, l + 32, ..., every
 * weight byte requested before the PDL wait (weights are written at load, never by
 * the kernel before), then the activations' codes, scales and sums, which that kernel
 * writes. Q4_K (144-byte super-blocks, 16-byte aligned): a chunk is the two
 * sub-blocks that share 32 bytes of codes, loaded with the super-block's 16-byte
 * header (d, dmin, 12 bytes of scales) into registers. Q6_K (210-byte super-blocks,
 * 2-byte aligned): the warp's row copied into shared memory in 16-byte pieces and
 * read as funnel-shifted words, the block's activations staged there too.
 *
 * Measured on the H200 (Q4_K_M 1.5B-shaped, batch 1, fifteenth session, one call
 * each): Q4_K 828.5-831.7 -> 837.7-852.6 tokens/s (LUMEN_CUDA_Q8_HANDOFF=0 in the
 * same build: 809.6-827.2); in the step's timeline a Q4_K down product adds 5.8 us
 * instead of 9.0, the gate/up kernel's hand-off 0.36 us. Q6_K too: 849.1-851.8 ->
 * 862.1-872.7 (4 sequences: 1,883-1,917 -> 1,923-1,955), a Q6_K down product 8.4 us
 * instead of 10.8 (10.1 when each chunk's activations were read from L2 in turn).
 * The Q4_K kernel bounded to 5 blocks an SM (96 registers, so more of its blocks
 * could be resident under the gate/up kernel): 861.8-868.1, the same; the Q6_K
 * kernel reading its activations from global memory, unrolled, instead of staging
 * them (branch q6k-global-acts): 868.7-874.7 vs 881.5-889.6; both dropped. The Q6_K
 * chunk's words read as 9 aligned words funnel-shifted a run of 8, its scales and d
 * as 16-bit reads: 20 shared-memory reads a chunk instead of 46 (SASS; ptxas had read
 * both halves of every word apart), 912.7-929.2 -> 929.6-943.5 tokens/s (seventeenth
 * session, same call). */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_matmul.cuh"

enum {
    Q8H_THREADS = 128,
    Q8H_CPL = 5, /* chunks a lane a round: 140 chunks (8,960 columns) in one round */
    Q8H_Q6K_STAGE_MAX = 12 * 1024, /* a Q6_K row staged per warp: up to 58 super-blocks */
};

static size_t q8h_align16(size_t b) { return (b + 15) & ~(size_t)15; }

/* the hand-off's three arrays for n tokens of ff values, from base (16-byte aligned) */
static mv_q8h q8h_at(void *base, int64_t n, int64_t ff) {
    mv_q8h h;
    uint8_t *p = (uint8_t *)base;
    h.q = (int8_t *)p;
    h.da = (float *)(p + q8h_align16((size_t)(n * ff)));
    h.s16 = (int *)((uint8_t *)h.da + q8h_align16((size_t)(n * ff / 32) * 4));
    h.ff = (int)ff;
    return h;
}

static size_t q8h_bytes(int64_t n, int64_t ff) {
    return q8h_align16((size_t)(n * ff)) + q8h_align16((size_t)(n * ff / 32) * 4) + (size_t)(n * ff / 16) * 4;
}

mv_q8h lm_cuda_q8h_offer(lm_cuda_backend *cu, const float *h, int64_t n, int64_t ff, int pairs_per_block) {
    mv_q8h none = {};
    cu->q8_in_src = NULL;
    if (!cu->fused || !cu->q8_handoff || lm_cuda_replaying(cu) || n <= 0 || ff % 256 != 0 || ff > INT32_MAX / 8 ||
        pairs_per_block % 32 != 0)
        return none;
    void *base = lm_cuda_scratch(cu, LM_CUDA_SCR_XQ, q8h_bytes(n, ff));
    if (!base) return none;
    cu->q8_in_src = h;
    cu->q8_in_count = n * ff;
    cu->q8_in_seq = cu->op_seq;
    return q8h_at(base, n, ff);
}

/* Shared memory for the activations of NT tokens of ff values: codes, sums by 16,
 * scales by 32 (the hand-off's layout, per token contiguous). */
static __host__ __device__ int q8h_acts_bytes(int nt, int ff) { return nt * ff + nt * ff / 4 + nt * ff / 8; }

/* The block's tokens t0 .. t0 + nt of the hand-off copied to sm (16-byte copies, all
 * in flight at once: the unrolled chunks' loads from L2 had been five trips in a row,
 * the registers not holding a chunk's 88 bytes five times over), as a hand-off of nt
 * tokens. They land after lm_cp_async_wait_all and a barrier. */
__device__ __forceinline__ mv_q8h q8h_stage_acts(const mv_q8h &h, int t0, int nt, uint8_t *sm) {
    const int ff = h.ff, nq = nt * ff / 16, ns = nt * ff / 64, nd = nt * ff / 128; /* 16-byte words */
    mv_q8h l;
    l.q = (int8_t *)sm, l.s16 = (int *)(sm + nt * ff), l.da = (float *)(sm + nt * ff + nt * ff / 4), l.ff = ff;
    const uint4 *q = (const uint4 *)(h.q + (size_t)t0 * ff), *s16 = (const uint4 *)(h.s16 + (size_t)t0 * ff / 16);
    const uint4 *da = (const uint4 *)(h.da + (size_t)t0 * ff / 32);
    for (int i = threadIdx.x; i < nq + ns + nd; i += Q8H_THREADS) {
        if (i < nq) lm_cp_async16((uint4 *)l.q + i, q + i);
        else if (i < nq + ns) lm_cp_async16((uint4 *)l.s16 + (i - nq), s16 + (i - nq));
        else lm_cp_async16((uint4 *)l.da + (i - nq - ns), da + (i - nq - ns));
    }
    return l;
}

/* A chunk's weights: the super-block's header and the chunk's 32 bytes of codes. */
struct q8h_chunk {
    uint4 hd, c0, c1;
};

__device__ __forceinline__ void q8h_load(const uint8_t *wr, int c, q8h_chunk &w) {
    const uint8_t *sb = wr + (size_t)(c >> 2) * 144;
    w.hd = lm_ldg_stream16(sb);
    w.c0 = lm_ldg_stream16(sb + 16 + 32 * (c & 3));
    w.c1 = lm_ldg_stream16(sb + 32 + 32 * (c & 3));
}

/* acc[t] += chunk c of the row times token t's activations (values 64c .. 64c + 63),
 * h the block's tokens from its first (token t at h.q + t * ff) */
template <int NT>
__device__ __forceinline__ void q8h_chunk_fma(const q8h_chunk &w, int c, const mv_q8h &h, int nt, float acc[NT]) {
    const int g = c & 3, k = g >> 1, sh = 16 * (g & 1); /* sub-blocks 2g and 2g + 1 */
    const uint32_t u0 = w.hd.y, u1 = w.hd.z, u2 = w.hd.w;
    const uint32_t scw = k ? (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u) : u0 & 0x3f3f3f3fu;
    const uint32_t mw = k ? ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u) : u1 & 0x3f3f3f3fu;
    const int sc0 = (int)((scw >> sh) & 0xffu), sc1 = (int)((scw >> (sh + 8)) & 0xffu);
    const int m0 = (int)((mw >> sh) & 0xffu), m1 = (int)((mw >> (sh + 8)) & 0xffu);
    const float d = __half2float(__ushort_as_half((unsigned short)(w.hd.x & 0xffffu)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(w.hd.x >> 16)));
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const int e = t * h.ff + 64 * c;
        const int4 *a = (const int4 *)(h.q + e);
        const int4 a0 = a[0], a1 = a[1], b0 = a[2], b1 = a[3];
        const int4 s = *(const int4 *)(h.s16 + e / 16);
        const float2 da = *(const float2 *)(h.da + e / 32);
        int lo = 0, hi = 0;
        lo = __dp4a((int)(w.c0.x & 0x0f0f0f0fu), a0.x, lo), hi = __dp4a((int)((w.c0.x >> 4) & 0x0f0f0f0fu), b0.x, hi);
        lo = __dp4a((int)(w.c0.y & 0x0f0f0f0fu), a0.y, lo), hi = __dp4a((int)((w.c0.y >> 4) & 0x0f0f0f0fu), b0.y, hi);
        lo = __dp4a((int)(w.c0.z & 0x0f0f0f0fu), a0.z, lo), hi = __dp4a((int)((w.c0.z >> 4) & 0x0f0f0f0fu), b0.z, hi);
        lo = __dp4a((int)(w.c0.w & 0x0f0f0f0fu), a0.w, lo), hi = __dp4a((int)((w.c0.w >> 4) & 0x0f0f0f0fu), b0.w, hi);
        lo = __dp4a((int)(w.c1.x & 0x0f0f0f0fu), a1.x, lo), hi = __dp4a((int)((w.c1.x >> 4) & 0x0f0f0f0fu), b1.x, hi);
        lo = __dp4a((int)(w.c1.y & 0x0f0f0f0fu), a1.y, lo), hi = __dp4a((int)((w.c1.y >> 4) & 0x0f0f0f0fu), b1.y, hi);
        lo = __dp4a((int)(w.c1.z & 0x0f0f0f0fu), a1.z, lo), hi = __dp4a((int)((w.c1.z >> 4) & 0x0f0f0f0fu), b1.z, hi);
        lo = __dp4a((int)(w.c1.w & 0x0f0f0f0fu), a1.w, lo), hi = __dp4a((int)((w.c1.w >> 4) & 0x0f0f0f0fu), b1.w, hi);
        float r = acc[t];
        r = fmaf((float)(sc0 * lo), d * da.x, r);
        r = fmaf(-(float)(m0 * (s.x + s.y)), dmin * da.x, r);
        r = fmaf((float)(sc1 * hi), d * da.y, r);
        r = fmaf(-(float)(m1 * (s.z + s.w)), dmin * da.y, r);
        acc[t] = r;
    }
}

/* A warp's sums of its row, token by token, in a fixed butterfly; lane 0 stores them. */
template <int NT>
__device__ __forceinline__ void q8h_store(const float acc[NT], bool on, int lane, int t0, int nt, int row, int rows,
                                          float *__restrict__ y) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (on && lane == 0 && t < nt) y[(size_t)(t0 + t) * rows + row] = v;
    }
}

template <int NT>
__global__ void __launch_bounds__(Q8H_THREADS, 4)
    q8h_q4k_kernel(const uint8_t *__restrict__ W, int rows, int cols, const mv_q8h h, float *__restrict__ y, int n) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * (Q8H_THREADS / 32) + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * NT, nt = min(NT, n - t0), n_chunks = cols / 64;
    const bool on = row < rows; /* the warp's, whole */
    const uint8_t *wr = W + (size_t)(on ? row : 0) * (size_t)(cols / 256) * 144;
    q8h_chunk w[Q8H_CPL];
#pragma unroll
    for (int i = 0; i < Q8H_CPL; i++)
        if (on && lane + 32 * i < n_chunks) q8h_load(wr, lane + 32 * i, w[i]);
    /* Every chunk before the wait, and the more the better: with only the first k of
     * a lane's chunks (Q4_K) or 32 k words (Q6_K) early, the rest after the wait, H100,
     * Q4_K_M 1.5B-shaped, batch 1, one call (thirty-second session, branch q8h-early):
     * k = 0 / 2 / 4 gave 1,052-1,055 / 1,079-1,082 / 1,095-1,102 tokens/s against
     * 1,100-1,113 for all. So the gap between the gate/up product's last warp and
     * this kernel's release is not its early traffic delaying that product. Nor do
     * bulk copies into shared memory serve it better (thirty-third session, branch
     * q8h-stage, same setting: 1,149-1,155 all in registers; the first 2 or 0 chunks
     * of a lane in registers and the rest of the row copied right after the wait,
     * 1,138-1,140 and 1,111-1,117; the whole row copied before the wait, no weights in
     * registers, 54 registers instead of 112, 1,127-1,128). */
    lm_pdl_enter<true>(); /* the next kernel (a norm) let in first */
    /* the chunks' activations read in turn: all requested at once they would not fit
     * the registers; staged in shared memory behind a barrier they took longer (6.5 us
     * a launch in the step's timeline against 5.9), prefetched into L1 far longer (13.4) */
    const mv_q8h hs = {h.q + (size_t)t0 * h.ff, h.da + (size_t)t0 * h.ff / 32, h.s16 + (size_t)t0 * h.ff / 16, h.ff};
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int c0 = 0; on && c0 < n_chunks; c0 += 32 * Q8H_CPL) {
#pragma unroll
        for (int i = 0; i < Q8H_CPL; i++) {
            const int c = c0 + lane + 32 * i;
            if (c < n_chunks) q8h_chunk_fma<NT>(w[i], c, hs, nt, acc);
        }
        if (c0 + 32 * Q8H_CPL < n_chunks) {
#pragma unroll
            for (int i = 0; i < Q8H_CPL; i++) {
                const int c = c0 + 32 * Q8H_CPL + lane + 32 * i;
                if (c < n_chunks) q8h_load(wr, c, w[i]);
            }
        }
    }
    q8h_store<NT>(acc, on, lane, t0, nt, row, rows, y);
}

/* ---- Q6_K: rows of 210-byte super-blocks, 2-byte aligned, staged ----------------- */

/* The 8 words at byte o of a staged row (o even), from the 9 aligned words under them
 * funnel-shifted: 9 shared-memory reads where reading each word's two halves apart
 * took 16 (ptxas does not see that neighbours share a word). */
__device__ __forceinline__ void q8h_at32x8(const uint32_t *s, int o, uint32_t v[8]) {
    const uint32_t *p = s + (o >> 2), sh = (uint32_t)(o & 3) * 8u;
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 9; i++) w[i] = p[i];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

/* acc[t] += chunk c of a Q6_K row staged at byte `base` of s: super-block c / 4, its
 * half hh = (c / 2) % 2 and quarter k = c % 2: the values r = 32k + i (low nibbles of
 * ql[64hh + 32k + i], qh bits 2k) and 64 + r (high nibbles, qh bits 4 + 2k), i < 32,
 * in runs of 16 under one scale each; codes q - 32, so sum (q - 32) a = dot - 32 * sum a.
 * The scales and d are 16-bit reads (every offset is even). */
template <int NT>
__device__ __forceinline__ void q8h_q6k_chunk_fma(const uint32_t *s, int base, int c, const mv_q8h &h, int nt,
                                                  float acc[NT]) {
    const int sb = c >> 2, hh = (c >> 1) & 1, k = c & 1, o = base + 210 * sb;
    uint32_t lo[8], hi[8], l[8], q[8];
    q8h_at32x8(s, o + 64 * hh + 32 * k, l);
    q8h_at32x8(s, o + 128 + 32 * hh, q);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        lo[i] = (l[i] & 0x0f0f0f0fu) | (((q[i] >> (2 * k)) & 0x03030303u) << 4);
        hi[i] = ((l[i] >> 4) & 0x0f0f0f0fu) | (((q[i] >> (4 + 2 * k)) & 0x03030303u) << 4);
    }
    const unsigned short *s16 = (const unsigned short *)s;
    const uint32_t sw0 = s16[(o + 192 + 8 * hh + 2 * k) >> 1], sw1 = s16[(o + 196 + 8 * hh + 2 * k) >> 1];
    const int sa = (int)(int8_t)sw0, sbb = (int)(int8_t)(sw0 >> 8);
    const int sc = (int)(int8_t)sw1, sd = (int)(int8_t)(sw1 >> 8);
    const float d = __half2float(__ushort_as_half(s16[(o + 208) >> 1]));
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const int e = t * h.ff + 256 * sb + 128 * hh + 32 * k;
        const int4 *a = (const int4 *)(h.q + e), *b = (const int4 *)(h.q + e + 64);
        const int4 a0 = a[0], a1 = a[1], b0 = b[0], b1 = b[1];
        const int2 s_lo = *(const int2 *)(h.s16 + e / 16), s_hi = *(const int2 *)(h.s16 + e / 16 + 4);
        const float da_lo = h.da[e / 32], da_hi = h.da[e / 32 + 2];
        int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        d0 = __dp4a((int)lo[0], a0.x, d0), d0 = __dp4a((int)lo[1], a0.y, d0);
        d0 = __dp4a((int)lo[2], a0.z, d0), d0 = __dp4a((int)lo[3], a0.w, d0);
        d1 = __dp4a((int)lo[4], a1.x, d1), d1 = __dp4a((int)lo[5], a1.y, d1);
        d1 = __dp4a((int)lo[6], a1.z, d1), d1 = __dp4a((int)lo[7], a1.w, d1);
        d2 = __dp4a((int)hi[0], b0.x, d2), d2 = __dp4a((int)hi[1], b0.y, d2);
        d2 = __dp4a((int)hi[2], b0.z, d2), d2 = __dp4a((int)hi[3], b0.w, d2);
        d3 = __dp4a((int)hi[4], b1.x, d3), d3 = __dp4a((int)hi[5], b1.y, d3);
        d3 = __dp4a((int)hi[6], b1.z, d3), d3 = __dp4a((int)hi[7], b1.w, d3);
        const int S_lo = sa * (d0 - 32 * s_lo.x) + sbb * (d1 - 32 * s_lo.y);
        const int S_hi = sc * (d2 - 32 * s_hi.x) + sd * (d3 - 32 * s_hi.y);
        float r = acc[t];
        r = fmaf((float)S_lo, d * da_lo, r);
        r = fmaf((float)S_hi, d * da_hi, r);
        acc[t] = r;
    }
}

/* A warp a row: the row's bytes copied into the warp's part of shared memory (16-byte
 * copies from the aligned address below its start, all requested before the PDL
 * wait), then chunks of 64 values (four a super-block) lane, lane + 32, ... */
template <int NT>
__global__ void __launch_bounds__(Q8H_THREADS, 4)
    q8h_q6k_kernel(const uint8_t *__restrict__ W, int rows, int cols, int stage_words, const mv_q8h h,
                   float *__restrict__ y, int n) {
    extern __shared__ __align__(16) uint8_t q8h_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = blockIdx.x * (Q8H_THREADS / 32) + warp;
    const int t0 = blockIdx.y * NT, nt = min(NT, n - t0), n_chunks = cols / 64;
    const bool on = row < rows; /* the warp's, whole */
    const size_t row_bytes = (size_t)(cols / 256) * 210;
    const uintptr_t start = (uintptr_t)(W + (size_t)(on ? row : 0) * row_bytes), a0 = start & ~(uintptr_t)15;
    const int words = (int)((start + row_bytes - a0 + 15) / 16);
    uint4 *stage = (uint4 *)(q8h_smem + q8h_acts_bytes(NT, h.ff)) + (size_t)warp * stage_words;
    if (on)
        for (int i = lane; i < words; i += 32) lm_cp_async16_stream(stage + i, (const void *)(a0 + 16 * (uintptr_t)i));
    lm_pdl_enter<true>(); /* the next kernel (a norm) let in first */
    const mv_q8h hs = q8h_stage_acts(h, t0, nt, q8h_smem);
    lm_cp_async_wait_all();
    __syncthreads();
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int c0 = 0; on && c0 < n_chunks; c0 += 32 * Q8H_CPL) {
#pragma unroll
        for (int i = 0; i < Q8H_CPL; i++) {
            const int c = c0 + lane + 32 * i;
            if (c < n_chunks) q8h_q6k_chunk_fma<NT>((const uint32_t *)stage, (int)(start - a0), c, hs, nt, acc);
        }
    }
    q8h_store<NT>(acc, on, lane, t0, nt, row, rows, y);
}

bool lm_cuda_q8h_take(lm_cuda_backend *cu, const lm_weight *w, const float *x, int64_t n, float *y) {
    if (!cu->q8_in_src || cu->q8_in_src != x || cu->q8_in_seq + 1 != cu->op_seq || cu->q8_in_count != n * w->cols)
        return false;
    const bool q4k = w->type == LM_DTYPE_Q4_K;
    /* Q6_K: a row staged per warp, its 16-byte copies inside the weight (which ends on
     * a 16-byte boundary) */
    const int stage_words = (int)((w->row_bytes + 30) / 16);
    if (w->cols % 256 != 0 || ((uintptr_t)w->data & 15) != 0 || w->rows > INT32_MAX || n > 65535 * 4)
        return false;
    if (!q4k && (w->type != LM_DTYPE_Q6_K || (w->rows * w->row_bytes) % 16 != 0 ||
                 (size_t)stage_words * 16 > Q8H_Q6K_STAGE_MAX))
        return false;
    const mv_q8h h = q8h_at(cu->scr[LM_CUDA_SCR_XQ], n, w->cols);
    const int nt = n == 1 ? 1 : n == 2 ? 2 : 4;
    const dim3 grid((unsigned)((w->rows + 3) / 4), (unsigned)((n + nt - 1) / nt)), block(Q8H_THREADS);
    const uint8_t *W = (const uint8_t *)w->data;
    const int rows = (int)w->rows, cols = (int)w->cols, nn = (int)n;
    const size_t smem = q4k ? 0 : (size_t)q8h_acts_bytes(nt, cols) + (size_t)stage_words * 16 * (Q8H_THREADS / 32);
    if (smem > (size_t)cu->smem_optin) return false;
    void (*q4k_fn)(const uint8_t *, int, int, const mv_q8h, float *, int) =
        nt == 1 ? q8h_q4k_kernel<1> : nt == 2 ? q8h_q4k_kernel<2> : q8h_q4k_kernel<4>;
    void (*q6k_fn)(const uint8_t *, int, int, int, const mv_q8h, float *, int) =
        nt == 1 ? q8h_q6k_kernel<1> : nt == 2 ? q8h_q6k_kernel<2> : q8h_q6k_kernel<4>;
    const void *fn = q4k ? (const void *)q4k_fn : (const void *)q6k_fn;
    if (smem > 48 * 1024 &&
        !lm_cuda_ok(cu, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    "down product (shared memory)"))
        return true; /* recorded */
    cu->q8_in_src = NULL;
    if (q4k) lm_cuda_launch_carved(cu, q4k_fn, grid, block, smem, W, rows, cols, h, y, nn);
    else lm_cuda_launch_carved(cu, q6k_fn, grid, block, smem, W, rows, cols, stage_words, h, y, nn);
    lm_cuda_launched(cu, q4k ? "q8h_q4k_kernel" : "q8h_q6k_kernel");
    return true;
}
