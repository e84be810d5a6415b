/* Matrix-vector products of Q4_K and Q6_K weights over activations quantized to 8
 * bits: the CPU's integer arithmetic (cpu_q8.h) on the GPU, for decode of up to
 * mv_max_n tokens.
 *
 * Why: the exact f32 kernel (cuda_matmul.cu, mv_kernel) decodes every weight to f32
 * and multiplies it by an f32 input, ~8 instructions and ~1 load an element; at batch
 * 1 on the H200 a Q4_K matrix took longer than the same matrix in bf16 (8960x1536:
 * 10.8 us vs 8.9, 0.72 TB/s of its bytes; the Q6_K head 176 us vs 110), so a Q4_K_M
 * model decoded slower than bf16. Here four weights and four activations multiply in
 * one dp4a, and the scales apply once per 16 or 32 elements. It takes products of
 * any rows over inputs of up to 4,096 (all but the down projections of a 1.5B
 * model); the others stay on the f32 kernel (MVQ_MAX_COLS_TAKEN).
 *
 * The arithmetic is the CPU's, bit for bit (cpu_q8.h): each token's row quantized
 * per 256 values (PER256: d = max / -127, max the signed value of largest magnitude,
 * first one on ties; codes min(127, round(x / d))), integer sums per super-block
 *   Q4_K  S = sum_j sc_j sum_{sub j} c*q,  M = sum_j m_j sum_{sub j} q
 *         acc = fma((float)S, d * da, acc);  acc = fma(-(float)M, dmin * da, acc)
 *   Q6_K  S = sum_i sc_i sum_{16 values i} (c - 32) * q;  acc = fma((float)S, d * da, acc)
 * in super-block order from acc = 0. The integer sums are exact in any order. A
 * product here equals the CPU backend's to the bit, and a token's result depends on
 * nothing else in the batch.
 *
 * A block quantizes its tokens' rows into shared memory itself (16 lanes per 256
 * values), then each row goes to L adjacent lanes (1, 2, 4 or 8: enough threads for
 * the GPU, mvq_lanes_per_row): lane j takes super-blocks j, j + L, ... whole, with
 * every load of one in flight, and after each round of L the row's first lane takes
 * their sums by shuffles and runs the float steps in super-block order. (A first
 * form gave each super-block to 8 lanes, 16 bytes of codes each, summed by shuffles,
 * and the float steps to one thread per row after a barrier: ~5 instructions an
 * element, 9.8 us for 8960x1536 rows, bound by issuing them.)
 *
 * A block's first round of Q4_K weights is requested before the PDL wait, so it
 * streams in while the kernel before (a norm, one block) leaves the memory idle, and
 * each round's next weights are in flight during the round. On the H200 at batch 1
 * (Q4_K_M 1.5B, fourteenth session, one call): 748.9-760.3 -> 777.3-794.4 tokens/s
 * (with the staged rows of cuda_matmul.cu requested before the wait too, 811.5-828.9);
 * after the wait but before the quantization (mvq-loads) it had measured the same
 * (748.9-760.7 vs 755.0-760.6). Staging a block's rows in shared memory while it
 * quantizes (mvq-stage) was slower: 655-660 vs 704-712. A Q4_K row's later rounds
 * requested into L2 before the wait as well (one bulk prefetch a row; the gate/up
 * product's, 2 lanes a row; branch gu-l2-prefetch) measured the same (fifteenth
 * session: 872.6-881.3 vs 877.1-890.3); copied into shared memory right after the
 * wait they gain (one token's gate/up: mvq_gu_staged_kernel, below).
 *
 * A Q6_K head (many rows, one lane a row) reads an interleaved copy of its rows made
 * at load (w->wide, MVQ_WIDE_*; LUMEN_CUDA_MVQ_WIDE=0: none), so a warp's load of
 * its 32 rows is one 512-byte run instead of 32 lines: the same bits, 191 MB more
 * device memory for a 151,936 x 1,536 head (the other paths and get_rows read the
 * rows in place). H200, Q4_K_M 1.5B-shaped, batch 1, one call (sixteenth session):
 * 889.4-892.7 -> 906.1-910.4 tokens/s; its first super-block requested before the
 * PDL wait as well (113 registers instead of 85): 889.9-911.0, not kept. A Q/K/V
 * set's Q6_K V (half a Q4_K_M file's layers) read from such a copy at 8 lanes a row
 * (aligned words, no funnel shifts; the mixed kernel 114 registers instead of 110):
 * H100, thirty-third session, branch q6v-wide, 1,142 -> 1,145-1,147 (+0.4%); not
 * worth a second copy of V.
 *
 * Q4_K weights (every one this kernel takes: Q/K/V, O, gate/up of a Q4_K_M file) read
 * interleaved copies made at load the same way (MVQ_Q4W_TILE: tiles of 32 rows by one
 * super-block, its 9 words word-major; LUMEN_CUDA_MVQ_Q4W=0: none). In place, a warp's
 * 16 rows of 2 lanes (gate/up) or 4 rows of 8 (Q/K/V, O) made each of a super-block's
 * 9 loads touch up to 32 lines, 864 bytes apart; from the copy a load is a run of 16
 * bytes a row of the warp's rows in each tile it reads. The same bytes, so the same
 * bits; it costs the weights' size again (~490 MiB for a 1.5B Q4_K_M model). H100,
 * Q4_K_M 1.5B-shaped, batch 1, one call (twenty-sixth session): 1,033.6-1,041.6 ->
 * 1,074.7-1,077.3 tokens/s (1,027.2-1,034.3 with LUMEN_CUDA_MVQ_Q4W=0 in the same
 * build). */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_matmul.cuh"

enum {
    MVQ_THREADS = 128,
    MVQ_MIXED = -1, /* the kernel's T for sets of Q4_K and Q6_K weights (lm_cuda_mvq_mixable) */
    MVQ_Q6K_WIDE = -2, /* the kernel's T for a Q6_K head's interleaved copy (w->wide, below) */
    MVQ_Q4K_WIDE = -3, /* the kernel's T for Q4_K weights' interleaved copies (w->wide, below) */
    /* The shapes it takes (lm_cuda_mvq_supports): inputs of up to 4,096 values, which
     * every block quantizes itself (the first form of this kernel took 1536x8960 in
     * 17.5 us against the f32 kernel's 11.1, bench_cuda_matvec on the H200). Any row
     * count: from the tenth session to the eleventh it took only Q4_K of 4,096+ rows
     * and Q6_K of 32,768+; Q/K/V and O here too, with up to 8 lanes a row, measured
     * faster at batch 1 (H200, Q4_K_M 1.5B-shaped, one call: 577-578 -> 598-599
     * tokens/s; 4 lanes at most: 577). The down projections' 8,960-wide inputs
     * quantized once a launch instead, by its first blocks to start (by ticket; the
     * others waiting on a counter, then copying the codes into shared memory), with up
     * to 32 lanes a row: bit-equal, but slower (535 vs 640 tokens/s at batch 1, 898 vs
     * 1,360 at 4; eleventh session); dropped. */
    MVQ_MAX_COLS_TAKEN = 4096,
    MVQ_MAX_LANES = 8,
    /* per SM: how many lanes a row gets (mvq_lanes_per_row). Fewer lanes, more rows a
     * warp, measured faster for the large products (H200, Q4_K_M 1.5B-shaped): 16
     * gave gate/up 4 lanes a row, 641-643 tokens/s at batch 1, against 659-661 with 2
     * in the same call (8 lanes: 585-587; the head at 2 lanes instead of 1: no
     * change); 8 gives them 2: 657-662 at batch 1 and 1,507-1,520 at 4 (1,357-1,363
     * with 16, an earlier call). The small products keep 8. */
    MVQ_WARPS_WANTED = 8,
    /* The interleaved copy of a Q6_K head (mvq_q6w_load): tiles of 32 rows by one
     * super-block, its 13 16-byte words of codes and scales word-major (word k of row
     * i at 16 (32 k + i)), then the rows' 32 d. Heads only: from this many rows. */
    MVQ_WIDE_ROWS = 32,
    MVQ_WIDE_WORDS = 13,
    MVQ_WIDE_TILE = MVQ_WIDE_ROWS * (16 * MVQ_WIDE_WORDS + 2),
    MVQ_WIDE_MIN_ROWS = 32768,
    /* A Q4_K weight's interleaved copy (mvq_q4w_load): tiles of 32 rows by one
     * super-block, its 9 16-byte words word-major (word k of row i at 16 (32 k + i)):
     * the same bytes as the rows, moved. */
    MVQ_Q4W_TILE = MVQ_WIDE_ROWS * 144,
};

/* Shared memory of a block: codes [NT][cols], scales [NT][nsb], sums of 16 codes
 * [NT][cols / 16]. Offsets in bytes. */
struct mvq_layout {
    int q, da, s16, bytes;
};

static __host__ __device__ int mvq_align16(int b) { return (b + 15) & ~15; }

static __host__ __device__ mvq_layout mvq_layout_of(int nt, int cols) {
    const int nsb = cols / 256;
    mvq_layout l;
    l.q = 0;
    l.da = mvq_align16(nt * cols);
    l.s16 = mvq_align16(l.da + 4 * nt * nsb);
    l.bytes = mvq_align16(l.s16 + 4 * nt * (cols / 16));
    return l;
}

/* ---- phase A: a token's 256 values to codes (MVQ_QLANES lanes; lane g of them has
 * values 16g..16g+15), the loads of every group in flight at once ----------------- */
enum { MVQ_QLANES = 16 };

/* The first of the lane's values of largest magnitude (NaN never: it compares false,
 * as the CPU's strict > from 0 leaves it out) by a tree, first wins ties: 4 levels of
 * dependent steps where a scan took 16 (the block's quantization is on the critical
 * path after the PDL wait). am 0: mx is not used. With 16 lanes a super-block instead
 * of 8 (32 values a lane, scanned), H200, Q4_K_M 1.5B-shaped, batch 1, one call
 * (sixteenth session): 896.2-914.8 -> 911.8-929.2 tokens/s. */
__device__ __forceinline__ void mvq_lane_max(const float v[MVQ_QLANES], float *am_out, float *mx_out) {
    float a[MVQ_QLANES], m[MVQ_QLANES];
#pragma unroll
    for (int i = 0; i < MVQ_QLANES; i++) a[i] = v[i] == v[i] ? fabsf(v[i]) : 0.0f, m[i] = v[i];
#pragma unroll
    for (int w = 1; w < MVQ_QLANES; w *= 2)
#pragma unroll
        for (int i = 0; i < MVQ_QLANES; i += 2 * w) {
            const bool right = a[i + w] > a[i];
            a[i] = right ? a[i + w] : a[i], m[i] = right ? m[i + w] : m[i];
        }
    *am_out = a[0], *mx_out = m[0];
}

__device__ __forceinline__ void mvq_quantize_sb(const float *__restrict__ xs, int8_t *q, float *da, int *s16, int g,
                                                bool on) {
    float v[MVQ_QLANES];
#pragma unroll
    for (int i = 0; i < MVQ_QLANES / 4; i++) {
        const float4 a = on ? ((const float4 *)xs)[MVQ_QLANES / 4 * g + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
    }
    /* the first value of largest magnitude: the lane's first, then the lowest lane's */
    float am, mx;
    mvq_lane_max(v, &am, &mx);
    int bl = g;
#pragma unroll
    for (int off = 1; off < MVQ_QLANES; off <<= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, off), omx = __shfl_xor_sync(0xffffffffu, mx, off);
        const int obl = __shfl_xor_sync(0xffffffffu, bl, off);
        if (oam > am || (oam == am && obl < bl)) am = oam, mx = omx, bl = obl;
    }
    if (!on) return;
    const float iscale = am != 0.0f ? __fdiv_rn(-127.0f, mx) : 0.0f;
    const float d = am != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    uint32_t w[4];
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = min(127, __float2int_rn(__fmul_rn(iscale, v[4 * i + k])));
            sum += c;
            w[i] |= (uint32_t)(c & 0xff) << (8 * k);
        }
    }
    ((uint4 *)q)[g] = make_uint4(w[0], w[1], w[2], w[3]);
    s16[g] = sum;
    if (g == 0) *da = d;
}

/* The block's tokens t0 .. t0 + nt (rows of cols values from x) quantized into its
 * shared memory by THREADS threads, a super-block per MVQ_QLANES lanes, every lane
 * through the same trips (the shuffles). ONE: a single token (t0 0, nt 1), known
 * when compiled. */
template <int THREADS, bool ONE = false>
__device__ __forceinline__ void mvq_quantize_rows(const float *__restrict__ x, int t0, int nt, int nsb, int cols,
                                                  int8_t *q, float *da, int *s16) {
    for (int p0 = 0; p0 < nt * nsb; p0 += THREADS / MVQ_QLANES) {
        const int p = p0 + (int)threadIdx.x / MVQ_QLANES, t = ONE ? 0 : p / nsb, sb = ONE ? p : p % nsb;
        const bool act = p < nt * nsb;
        mvq_quantize_sb(x + (act ? (size_t)(t0 + t) * cols + 256 * sb : 0), q + t * cols + 256 * sb,
                        da + t * nsb + sb, s16 + t * (cols / 16) + 16 * sb, threadIdx.x % MVQ_QLANES, act);
    }
}

/* ---- a super-block's integer sums, one thread --------------------------------- */
/* A super-block's bytes in registers, loaded (mvq_load_sb) a round ahead of its sums:
 * Q4_K's 144 in w[0..35], Q6_K's 52 or 53 aligned words and its d apart. */
struct mvq_sbw {
    uint32_t w[53];
    unsigned short d6;
};

/* Q4_K (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of
 * codes: byte 32g + l holds value 64g + l (low nibble, sub-block 2g) and 64g + 32 + l
 * (high nibble, sub-block 2g + 1). S and M for NT tokens' codes q (token t at q + t *
 * cols, its 16-value sums at s16 + t * cols / 16). */
__device__ __forceinline__ void mvq_q4k_load(const uint8_t *sb, mvq_sbw &b) {
#pragma unroll
    for (int p = 0; p < 9; p++) {
        const uint4 v = lm_ldg_stream16((const uint4 *)sb + p);
        b.w[4 * p] = v.x, b.w[4 * p + 1] = v.y, b.w[4 * p + 2] = v.z, b.w[4 * p + 3] = v.w;
    }
}

template <int NT>
__device__ __forceinline__ void mvq_q4k_sb(const mvq_sbw &b, const int8_t *q, const int *s16, int cols, int nt,
                                           int S[NT], int M[NT], float *d, float *dmin) {
    const uint4 h = make_uint4(b.w[0], b.w[1], b.w[2], b.w[3]);
    uint4 c[8];
#pragma unroll
    for (int p = 0; p < 8; p++) c[p] = make_uint4(b.w[4 + 4 * p], b.w[5 + 4 * p], b.w[6 + 4 * p], b.w[7 + 4 * p]);
    /* the 8 scales and mins as bytes of two words each (the CPU's scales_k4) */
    const uint32_t u0 = h.y, u1 = h.z, u2 = h.w;
    const uint32_t scw[2] = {u0 & 0x3f3f3f3fu, (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u)};
    const uint32_t mw[2] = {u1 & 0x3f3f3f3fu, ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u)};
#pragma unroll
    for (int t = 0; t < NT; t++) {
        S[t] = 0, M[t] = 0;
        if (t >= nt) continue;
        const int8_t *qt = q + t * cols;
        const int *st = s16 + t * (cols / 16);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int j = 2 * g; /* sub-blocks j (low nibbles) and j + 1 (high) */
            int lo = 0, hi = 0;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const uint4 w = c[2 * g + hh];
                const int4 a = *(const int4 *)(qt + 32 * j + 16 * hh), b = *(const int4 *)(qt + 32 * (j + 1) + 16 * hh);
                lo = __dp4a((int)(w.x & 0x0f0f0f0fu), a.x, lo), hi = __dp4a((int)((w.x >> 4) & 0x0f0f0f0fu), b.x, hi);
                lo = __dp4a((int)(w.y & 0x0f0f0f0fu), a.y, lo), hi = __dp4a((int)((w.y >> 4) & 0x0f0f0f0fu), b.y, hi);
                lo = __dp4a((int)(w.z & 0x0f0f0f0fu), a.z, lo), hi = __dp4a((int)((w.z >> 4) & 0x0f0f0f0fu), b.z, hi);
                lo = __dp4a((int)(w.w & 0x0f0f0f0fu), a.w, lo), hi = __dp4a((int)((w.w >> 4) & 0x0f0f0f0fu), b.w, hi);
            }
            const int sh0 = 8 * (j & 3), sh1 = 8 * ((j + 1) & 3), k = j >> 2;
            const int sc0 = (int)((scw[k] >> sh0) & 0xffu), sc1 = (int)((scw[k] >> sh1) & 0xffu);
            const int m0 = (int)((mw[k] >> sh0) & 0xffu), m1 = (int)((mw[k] >> sh1) & 0xffu);
            S[t] += sc0 * lo + sc1 * hi;
            M[t] += m0 * (st[2 * j] + st[2 * j + 1]) + m1 * (st[2 * j + 2] + st[2 * j + 3]);
        }
    }
    *d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
    *dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
}

/* Q6_K (210 bytes at an even address): ql[128], qh[64], 16 int8 scales, d (f16).
 * Value e: half e / 128, r = e % 128; low 4 bits from ql[64 half + r % 64] (high
 * nibble when r >= 64), high 2 bits from qh[32 half + r % 32] >> 2 (r / 32); scale e /
 * 16. b.w[k] is the k-th 4-byte-aligned word from the super-block's start rounded
 * down to 4: a 32-bit value at offset o (a multiple of 4, below 208) the two words
 * around it funnel-shifted, d in the last one. They are read as the 15 16-byte words
 * from the start rounded down to 16, then moved down by the start's word offset there
 * (two rounds of selects, none indexing registers at run time): 15 loads in flight
 * where 4-byte loads took 53, which a warp's 32 rows apart make as many requests each
 * (the head, 1 lane a row, waited on the MIO queue in Nsight Compute, fifteenth
 * session). The last piece reads up to 30 bytes past the super-block: every weight's
 * allocation has LM_CUDA_WEIGHT_PAD bytes after it (cuda_backend.cu). H200, Q4_K_M
 * 1.5B-shaped, batch 1, one call: the Q6_K head 89.8 -> 69.8 us in the step's
 * timeline, 856.0-870.3 -> 869.4-886.9 tokens/s. (An earlier form loaded 16-byte
 * pieces with five loads each: 80 in all.) */
__device__ __forceinline__ void mvq_q6k_load(const uint8_t *sb, mvq_sbw &b) {
    const uint4 *a = (const uint4 *)((uintptr_t)sb & ~(uintptr_t)15);
    const uint32_t wo = ((uint32_t)(uintptr_t)sb >> 2) & 3u;
    uint32_t r[60];
#pragma unroll
    for (int i = 0; i < 15; i++) {
        const uint4 v = lm_ldg_stream16(a + i);
        r[4 * i] = v.x, r[4 * i + 1] = v.y, r[4 * i + 2] = v.z, r[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int k = 0; k < 58; k++) r[k] = (wo & 1u) ? r[k + 1] : r[k];
#pragma unroll
    for (int k = 0; k < 53; k++) b.w[k] = (wo & 2u) ? r[k + 2] : r[k];
    b.d6 = (unsigned short)(b.w[52] >> (((uint32_t)(uintptr_t)sb & 3u) * 8u));
}

template <int NT>
__device__ __forceinline__ void mvq_q6k_sb(uint32_t sh, const mvq_sbw &b, const int8_t *q, const int *s16, int cols,
                                           int nt, int S[NT], int M[NT], float *d, float *dmin) {
    const uint32_t *w = b.w;
#define MVQ_Q6K_AT(o) __funnelshift_r(w[(o) / 4], w[(o) / 4 + 1], sh)
#pragma unroll
    for (int t = 0; t < NT; t++) S[t] = 0, M[t] = 0;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int half = p >> 1, rr = 16 * (p & 1);
        const uint32_t scw0 = MVQ_Q6K_AT(192 + 8 * half), scw1 = MVQ_Q6K_AT(196 + 8 * half);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r0 = rr + 32 * k, e0 = 128 * half + r0, si = (rr >> 4) + 2 * k; /* the run, its scale */
            const int sc = (int)(int8_t)(((si < 4 ? scw0 : scw1) >> (8 * (si & 3))) & 0xffu);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) continue;
                const int *qa = (const int *)(q + t * cols + e0);
                int dot = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t l = MVQ_Q6K_AT(64 * half + rr + 32 * (k & 1) + 4 * i) >> (k >= 2 ? 4 : 0);
                    const uint32_t c = (l & 0x0f0f0f0fu) | (((MVQ_Q6K_AT(128 + 32 * half + rr + 4 * i) >> (2 * k)) &
                                                             0x03030303u)
                                                            << 4);
                    dot = __dp4a((int)c, qa[i], dot);
                }
                S[t] += sc * (dot - 32 * s16[t * (cols / 16) + (e0 >> 4)]);
            }
        }
    }
    *d = __half2float(__ushort_as_half(b.d6));
    *dmin = 0.0f;
#undef MVQ_Q6K_AT
}

/* A super-block of the interleaved copy of a Q6_K head: the row's 13 words from its
 * tile, each load of the warp's 32 rows one 512-byte run, and its d. The rows read in
 * place put a warp's 32 lanes 1,260 bytes apart (a 1,536-wide head), so each of their
 * loads touched 32 lines (the head at 2.7 TB/s, 70 us a step). A row is the lane's in
 * its warp (one lane a row). */
__device__ __forceinline__ void mvq_q6w_load(const uint8_t *tile, int lane, mvq_sbw &b) {
    const uint4 *a = (const uint4 *)tile + lane;
#pragma unroll
    for (int k = 0; k < MVQ_WIDE_WORDS; k++) {
        const uint4 v = lm_ldg_stream16(a + MVQ_WIDE_ROWS * k);
        b.w[4 * k] = v.x, b.w[4 * k + 1] = v.y, b.w[4 * k + 2] = v.z, b.w[4 * k + 3] = v.w;
    }
    b.d6 = __ldg((const unsigned short *)(tile + 16 * MVQ_WIDE_ROWS * MVQ_WIDE_WORDS) + lane);
}

/* A super-block of a Q4_K weight's interleaved copy: the row's 9 words, 512 bytes
 * apart (w its first word in the super-block's tile), so a warp's load of its rows'
 * word k is a few runs of 16 bytes a row where the rows in place (864 bytes apart at
 * 1,536 columns) made it 32 lines. */
__device__ __forceinline__ void mvq_q4w_load(const uint8_t *w, mvq_sbw &b) {
#pragma unroll
    for (int p = 0; p < 9; p++) {
        const uint4 v = lm_ldg_stream16((const uint4 *)w + MVQ_WIDE_ROWS * p);
        b.w[4 * p] = v.x, b.w[4 * p + 1] = v.y, b.w[4 * p + 2] = v.z, b.w[4 * p + 3] = v.w;
    }
}

/* The same from a copy of the tile in shared memory (mvq_gu_staged_kernel) */
__device__ __forceinline__ void mvq_q4w_load_shared(const uint8_t *w, mvq_sbw &b) {
#pragma unroll
    for (int p = 0; p < 9; p++) {
        const uint4 v = ((const uint4 *)w)[MVQ_WIDE_ROWS * p];
        b.w[4 * p] = v.x, b.w[4 * p + 1] = v.y, b.w[4 * p + 2] = v.z, b.w[4 * p + 3] = v.w;
    }
}

/* Super-block sb of a row's weights into b (MVQ_Q6K_WIDE: wr its rows' first tile;
 * MVQ_Q4K_WIDE: the row's first word in its first tile). */
template <int T>
__device__ __forceinline__ void mvq_load_sb(const uint8_t *wr, int sb, mvq_sbw &b, int lane) {
    if (T == LM_DTYPE_Q4_K) mvq_q4k_load(wr + (size_t)sb * 144, b);
    else if (T == MVQ_Q4K_WIDE) mvq_q4w_load(wr + (size_t)sb * MVQ_Q4W_TILE, b);
    else if (T == MVQ_Q6K_WIDE) mvq_q6w_load(wr + (size_t)sb * MVQ_WIDE_TILE, lane, b);
    else mvq_q6k_load(wr + (size_t)sb * 210, b);
}

/* A row's super-blocks in rounds of L (its lane j takes c0 + j), acc[t] its sums for
 * the tokens: after each round the row's first lane takes the round's integer sums by
 * shuffles, in order, and runs the float steps. With PRE, nx holds the first round's
 * bytes, loaded by the caller before the quantization. Q4_K's rounds put the next
 * round's loads in flight before their sums (two rounds' bytes, 36 registers more);
 * Q6_K's 53 words twice would not fit the launch bound's 128 registers (46-130 bytes
 * of spills), so each round loads its own. */
template <int T, int NT, bool PRE, int LC>
__device__ __forceinline__ void mvq_rows(const uint8_t *wr, bool on, int j, int lane, int L, int nsb, int nt,
                                         int cols, const int8_t *q, const float *da, const int *s16, float acc[NT],
                                         mvq_sbw &nx) {
    const int group = lane & ~(L - 1); /* the row's first lane */
    constexpr bool Q4 = T == LM_DTYPE_Q4_K || T == MVQ_Q4K_WIDE;
    for (int c0 = 0; c0 < nsb; c0 += L) {
        const int sb = c0 + j;
        mvq_sbw b; /* Q4_K: this round's bytes, nx the next round's; Q6_K: in nx */
        if (Q4) {
            b = nx;
            if (on && sb + L < nsb) mvq_load_sb<T>(wr, sb + L, nx, lane);
        } else if ((c0 > 0 || !PRE) && on && sb < nsb) {
            mvq_load_sb<T>(wr, sb, nx, lane);
        }
        int S[NT], M[NT];
        float d = 0.0f, dmin = 0.0f;
        if (on && sb < nsb) {
            if (Q4) {
                mvq_q4k_sb<NT>(b, q + 256 * sb, s16 + 16 * sb, cols, nt, S, M, &d, &dmin);
            } else {
                /* the words' shift: a Q6_K super-block in place is 2-byte aligned */
                const uint32_t sh = T == MVQ_Q6K_WIDE ? 0u : ((uint32_t)(uintptr_t)(wr + (size_t)sb * 210) & 3u) * 8u;
                mvq_q6k_sb<NT>(sh, nx, q + 256 * sb, s16 + 16 * sb, cols, nt, S, M, &d, &dmin);
            }
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++) S[t] = 0, M[t] = 0;
        }
        /* the round's super-blocks in order: lane group + s holds c0 + s */
#pragma unroll
        for (int s = 0; s < LC; s++) {
            if (s >= L || c0 + s >= nsb) break;
            const float ds = __shfl_sync(0xffffffffu, d, group + s), dms = __shfl_sync(0xffffffffu, dmin, group + s);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int St = __shfl_sync(0xffffffffu, S[t], group + s);
                const int Mt = __shfl_sync(0xffffffffu, M[t], group + s);
                const float a = NT == 1 || t < nt ? da[t * nsb + c0 + s] : 0.0f;
                acc[t] = fmaf((float)St, __fmul_rn(ds, a), acc[t]);
                if (Q4) acc[t] = fmaf(-(float)Mt, __fmul_rn(dms, a), acc[t]);
            }
        }
    }
}

/* The 8-bit hand-off (mv_q8h) of a block's h: its `pairs` values a token (a whole
 * number of groups of 32, from p0, a multiple of 32) in hs, a group per warp: the
 * largest magnitude am, da = am / 127, codes round(h * 127 / am) (0 where am is 0),
 * and the codes' sums by 16. Every token's codes depend on its own h alone. */
__device__ __forceinline__ void mvq_hand_off(const mv_q8h &h8, const float (*hs)[MVQ_THREADS / 2], int p0, int pairs,
                                             int t0, int nt) {
    __syncthreads();
    const int lane = threadIdx.x & 31, groups = pairs / 32;
    for (int job = threadIdx.x >> 5; job < nt * groups; job += MVQ_THREADS / 32) {
        const int t = job / groups, g = job % groups, e = p0 + 32 * g;
        if (e >= h8.ff) continue; /* a group past the end is wholly past it (ff % 32 == 0) */
        const float v = hs[t][32 * g + lane];
        float am = fabsf(v);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
        const float is = am > 0.0f ? __fdiv_rn(127.0f, am) : 0.0f;
        const int c = max(-127, min(127, __float2int_rn(v * is)));
        const size_t row = (size_t)(t0 + t) * h8.ff;
        h8.q[row + e + lane] = (int8_t)c;
        int s = c;
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if ((lane & 15) == 0) h8.s16[row / 16 + (e + lane) / 16] = s;
        if (lane == 0) h8.da[row / 32 + e / 32] = __fdiv_rn(am, 127.0f);
    }
}

/* L lanes a row (a power of two up to 8); SWIGLU: the set is (gate, up) with rows
 * interleaved (gate r at 2r, up r at 2r + 1), y[0] = silu(gate) * up. The launch
 * bound (4 blocks an SM, 128 registers) lets ptxas schedule the weight loads earlier,
 * as for mv_kernel (cuda_matmul.cu, MV_MIN_BLOCKS): 64-96 -> 78-117 registers, Q4_K_M
 * batch 1 on the H200 689 -> 695-698 tokens/s. */
template <int T, int NT, bool SWIGLU, int LK = 0>
__global__ void __launch_bounds__(MVQ_THREADS, 4)
    mvq_kernel(const __grid_constant__ mv_set set, int cols, const float *__restrict__ x, int n, int L_arg, mv_q8h h8) {
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    /* LK: the lanes a row known when compiled, so a round's sum over them unrolls
     * (mvq_launch_known); 0: L_arg, the loop bounded by MVQ_MAX_LANES */
    const int L = LK ? LK : L_arg;
    constexpr int LC = LK ? LK : MVQ_MAX_LANES;
    const int nsb = cols / 256, lane = threadIdx.x & 31, j = lane & (L - 1);
    const int t0 = blockIdx.y * NT, nt = min(NT, n - t0);
    const int rows_all = set.end[set.n_w - 1], r = blockIdx.x * (MVQ_THREADS / L) + (int)threadIdx.x / L;
    const mvq_layout l = mvq_layout_of(NT, cols);
    int8_t *q = (int8_t *)(mvq_smem + l.q);
    float *da = (float *)(mvq_smem + l.da);
    int *s16 = (int *)(mvq_smem + l.s16);
    const bool on = r < rows_all;
    const uint8_t *wr = NULL;
    int k = set.n_w - 1; /* rows past the end: the last weight's, as their warp's others */
    if (on) {
        int lr;
        if (SWIGLU) k = r & 1, lr = r >> 1;
        else k = mv_which(set, r), lr = r - (k ? set.end[k - 1] : 0);
        if (T == MVQ_Q6K_WIDE) wr = set.W[k] + (size_t)(lr / MVQ_WIDE_ROWS) * nsb * MVQ_WIDE_TILE;
        else if (T == MVQ_Q4K_WIDE || (T == MVQ_MIXED && set.type[k] == MVQ_Q4K_WIDE))
            wr = set.W[k] + (size_t)(lr / MVQ_WIDE_ROWS) * nsb * MVQ_Q4W_TILE + 16 * (lr % MVQ_WIDE_ROWS);
        else wr = set.W[k] + (size_t)lr * set.row_bytes[k];
    }
    /* the first round's weights in flight before the quantization, which they do not
     * depend on: they had been loaded after its barrier, their DRAM trip behind the
     * reads of x, the reductions and the shared stores (sm_90a SASS). Not for Q6_K
     * alone (the head): its 53 words live across the quantization take it from 95 to
     * 115 registers, 5 blocks an SM to 4; nor for the head's interleaved copy (85 -> 113
     * registers, no gain: the file's header). */
    constexpr bool PRE = T == LM_DTYPE_Q4_K || T == MVQ_Q4K_WIDE || T == MVQ_MIXED;
    mvq_sbw nx;
    if (PRE && on && j < nsb) {
        if (T == MVQ_Q4K_WIDE || (T == MVQ_MIXED && set.type[k] == MVQ_Q4K_WIDE))
            mvq_load_sb<MVQ_Q4K_WIDE>(wr, j, nx, lane);
        else if (T == LM_DTYPE_Q4_K || (T == MVQ_MIXED && set.type[k] == LM_DTYPE_Q4_K))
            mvq_load_sb<LM_DTYPE_Q4_K>(wr, j, nx, lane);
        else
            mvq_load_sb<LM_DTYPE_Q6_K>(wr, j, nx, lane);
    }
    /* the wait after them: weights are written at load, never by the kernels before,
     * so the first round streams in while the kernel before this one (a norm) runs.
     * The next kernel let in first, but for gate/up, whose down product (q8h)
     * requests its weights before its wait (lm_pdl_enter). With the down
     * products' kernel entering so as well: H200, Q4_K_M 1.5B-shaped, one call
     * (seventeenth session), batch 1 955.2-966.7 -> 990.7-996.6 tokens/s, 4 sequences
     * 2,061-2,069 -> 2,071-2,082. Gate/up letting the down product in first as
     * well measured the same (H100, thirty-second session: 1,105-1,110 vs 1,107-1,108). */
    lm_pdl_enter<!SWIGLU>();
    mvq_quantize_rows<MVQ_THREADS>(x, t0, nt, nsb, cols, q, da, s16);
    __syncthreads();
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if constexpr (T == MVQ_MIXED) { /* the warp's rows are of one weight (lm_cuda_mvq_mixable) */
        if (set.type[k] == MVQ_Q4K_WIDE)
            mvq_rows<MVQ_Q4K_WIDE, NT, PRE, LC>(wr, on, j, lane, L, nsb, nt, cols, q, da, s16, acc, nx);
        else if (set.type[k] == LM_DTYPE_Q4_K)
            mvq_rows<LM_DTYPE_Q4_K, NT, PRE, LC>(wr, on, j, lane, L, nsb, nt, cols, q, da, s16, acc, nx);
        else
            mvq_rows<LM_DTYPE_Q6_K, NT, PRE, LC>(wr, on, j, lane, L, nsb, nt, cols, q, da, s16, acc, nx);
    } else {
        mvq_rows<T, NT, PRE, LC>(wr, on, j, lane, L, nsb, nt, cols, q, da, s16, acc, nx);
    }
    if constexpr (SWIGLU) { /* the up row's result from the next row's lanes */
        __shared__ float hs[NT][MVQ_THREADS / 2]; /* the block's h by token, for the hand-off */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float u = __shfl_down_sync(0xffffffffu, acc[t], L);
            if (on && j == 0 && (r & 1) == 0 && t < nt) {
                const float h = lm_swiglu1(acc[t], u);
                set.y[0][(size_t)(t0 + t) * set.rows[0] + (r >> 1)] = h;
                hs[t][threadIdx.x / (2 * L)] = h;
            }
        }
        if (h8.q) mvq_hand_off(h8, hs, blockIdx.x * (MVQ_THREADS / (2 * L)), MVQ_THREADS / (2 * L), t0, nt);
        return;
    }
    if (!on || j != 0) return;
    const int lr = r - (k ? set.end[k - 1] : 0);
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < nt) set.y[k][(size_t)(t0 + t) * set.rows[k] + lr] = acc[t];
}

/* ---- one token's gate/up product, its later rounds staged ---------------------- */
/* The Q4_K gate/up product of one token over the interleaved copies, a block the 32
 * rows of one tile group of each weight (64 rows, 32 values of h: the hand-off's
 * group), 3 lanes a row: warp w takes super-blocks j = w / 2 and j + 3 of rows i =
 * 16 (w % 2) + l % 16 of weight k = l / 16 (gate, up), so a quarter warp's 16-byte
 * loads are one 128-byte run of a tile, in shared memory without bank conflicts. The
 * first super-blocks of j = 0 and 1 are loaded into registers before the PDL wait, as
 * in mvq_kernel; right after the wait one thread copies every later super-block of
 * the block's rows into shared memory (two bulk copies: the group's tiles of each
 * weight are contiguous), so they stream in during the quantization and the first
 * sums, where mvq_kernel requested each lane's third round only after its first
 * round's sums. Each lane leaves its super-blocks' integer sums, d and dmin in shared
 * memory, and one warp runs the float steps in super-block order for its row's gate
 * and up, so the arithmetic and its order are mvq_kernel's (the same bits).
 *
 * H100, Q4_K_M 1.5B-shaped, batch 1 (thirty-third session; one tree, the knob per
 * line, or main built beside it; medians of 3, three rounds a call). A first form, 2
 * lanes a row in 4 warps (each lane three rounds, the lanes' sums by shuffles; branch
 * gu-stage): 1,107-1,115 tokens/s with LUMEN_CUDA_GU_STAGE=0 (mvq_kernel) ->
 * 1,138-1,152 over three calls, in the step's timeline gate/up adding 7.9 us instead
 * of 8.7; this form over it 1,148-1,151 -> 1,163-1,174 (branch gu-l3). Where the
 * copies start matters (first form): before the wait (with the first round)
 * 1,096-1,098, the quantization's reads and the norm before slowed by the traffic (so
 * did mvq_kernel's rounds all requested early: twenty-eighth session, -2%); after the
 * quantization 1,094-1,100; a barrier and two copies a round of super-blocks instead
 * of one barrier for all, 1,124-1,129; the first round after the wait as well,
 * 1,114-1,118; started by a thread the quantization leaves idle, the barrier set up
 * before the wait (branch gu-issuer), the same. Its bytes are not what bounds it:
 * every layer's gate/up reading layer 0's weights (so they can stay in L2; outputs
 * wrong) gained at most 3%, and the O product's blocks prefetching the layer's gate/up
 * weights into L2 (cp.async.bulk.prefetch) under the attention lost 5%, after its wait
 * 4% (thirty-fourth session, branch l2-pf). */
enum {
    MVQ_GU_THREADS = 192,
    /* 36 KB staged and 5 KB of sums a block at 6 super-blocks: three blocks an SM at
     * the backend's carveout (132 KB), so the 280 blocks of a 1.5B model run in one wave */
    MVQ_GU_MAX_NSB = 6,
};

static __host__ __device__ int mvq_gu_staged_bytes(int nsb) { return 2 * (nsb - 2) * MVQ_Q4W_TILE; }

__global__ void __launch_bounds__(MVQ_GU_THREADS, 3)
    mvq_gu_staged_kernel(const __grid_constant__ mv_set set, int cols, const float *__restrict__ x, mv_q8h h8) {
    extern __shared__ __align__(128) uint8_t mvq_smem[];
    __shared__ uint64_t staged_full; /* the staged super-blocks' bytes */
    __shared__ float hs[1][MVQ_THREADS / 2];
    /* each (super-block, weight, row)'s integer sums, and its d and dmin (the weight's
     * f16 values, exact as halves), for the float steps */
    __shared__ int sS[MVQ_GU_MAX_NSB][2][32], sM[MVQ_GU_MAX_NSB][2][32];
    __shared__ __half2 sD[MVQ_GU_MAX_NSB][2][32];
    const int nsb = cols / 256, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = blockIdx.x;
    const int j = w >> 1, i = 16 * (w & 1) + (lane & 15), k = lane >> 4;
    const int staged = nsb - 2, st_bytes = mvq_gu_staged_bytes(nsb);
    const uint8_t *wg = set.W[k] + (size_t)g * nsb * MVQ_Q4W_TILE; /* the group's tiles of weight k */
    mvq_sbw nx;
    if (j < 2) mvq_q4w_load(wg + (size_t)j * MVQ_Q4W_TILE + 16 * i, nx);
    lm_pdl_enter<false>(); /* as mvq_kernel's gate/up */
    if (threadIdx.x == 0) {
        lm_mbar_init(&staged_full, 1);
        lm_mbar_init_fence();
        lm_mbar_arrive_expect(&staged_full, (uint32_t)st_bytes);
        for (int kk = 0; kk < 2; kk++)
            lm_bulk_copy_stream(mvq_smem + kk * staged * MVQ_Q4W_TILE,
                                set.W[kk] + ((size_t)g * nsb + 2) * MVQ_Q4W_TILE, (uint32_t)(staged * MVQ_Q4W_TILE),
                                &staged_full);
    }
    const mvq_layout l = mvq_layout_of(1, cols);
    int8_t *q = (int8_t *)(mvq_smem + st_bytes + l.q);
    float *da = (float *)(mvq_smem + st_bytes + l.da);
    int *s16 = (int *)(mvq_smem + st_bytes + l.s16);
    mvq_quantize_rows<MVQ_GU_THREADS, true>(x, 0, 1, nsb, cols, q, da, s16);
    __syncthreads(); /* the codes, and the barrier's initialization, for every thread */
    bool waited = false;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int sb = j + 3 * r;
        if (sb >= nsb) break;
        mvq_sbw b;
        if (sb < 2) {
            b = nx;
        } else {
            if (!waited) lm_mbar_wait(&staged_full, 0), waited = true;
            mvq_q4w_load_shared(mvq_smem + (k * staged + sb - 2) * MVQ_Q4W_TILE + 16 * i, b);
        }
        int S[1], M[1];
        float d, dmin;
        mvq_q4k_sb<1>(b, q + 256 * sb, s16 + 16 * sb, cols, 1, S, M, &d, &dmin);
        sS[sb][k][i] = S[0], sM[sb][k][i] = M[0], sD[sb][k][i] = __floats2half2_rn(d, dmin);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float acc[2] = {0.0f, 0.0f};
        for (int sb = 0; sb < nsb; sb++) {
            const float a = da[sb];
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                const float2 dd = __half22float2(sD[sb][kk][lane]);
                acc[kk] = fmaf((float)sS[sb][kk][lane], __fmul_rn(dd.x, a), acc[kk]);
                acc[kk] = fmaf(-(float)sM[sb][kk][lane], __fmul_rn(dd.y, a), acc[kk]);
            }
        }
        const float h = lm_swiglu1(acc[0], acc[1]);
        set.y[0][32 * g + lane] = h;
        hs[0][lane] = h;
    }
    if (h8.q) mvq_hand_off(h8, hs, 32 * g, 32, 0, 1);
}

/* One token's Q4_K gate/up product by mvq_gu_staged_kernel where it takes it: whole
 * tile groups (the interleaved copies), 3 to MVQ_GU_MAX_NSB super-blocks a row. */
static bool mvq_gu_staged(lm_cuda_backend *cu, const mv_set &set, int64_t cols, const float *x, int64_t n) {
    const int nsb = (int)(cols / 256), ff = set.rows[0];
    if (!cu->gu_stage || n != 1 || nsb < 3 || nsb > MVQ_GU_MAX_NSB || ff % MVQ_WIDE_ROWS != 0 ||
        set.rows[1] != ff)
        return false;
    const mv_q8h h8 = lm_cuda_q8h_offer(cu, set.y[0], n, ff, 32);
    const size_t smem = (size_t)mvq_gu_staged_bytes(nsb) + (size_t)mvq_layout_of(1, (int)cols).bytes;
    lm_cuda_launch_carved(cu, mvq_gu_staged_kernel, dim3((unsigned)(ff / MVQ_WIDE_ROWS)), MVQ_GU_THREADS, smem, set,
                          (int)cols, x, h8);
    lm_cuda_launched(cu, "mvq_gu_staged_kernel");
    return true;
}

bool lm_cuda_mvq_supports(const lm_cuda_backend *cu, const lm_weight *w) {
    return cu->mvq && (w->type == LM_DTYPE_Q4_K || w->type == LM_DTYPE_Q6_K) && w->cols % 256 == 0 &&
           w->cols <= MVQ_MAX_COLS_TAKEN && w->rows <= INT32_MAX / 8;
}

/* lanes a row: the fewest (1, 2, 4, 8) that give every SM MVQ_WARPS_WANTED warps */
static int mvq_lanes_per_row(int64_t rows_all, int n_sm) {
    int L = 1;
    while (L < MVQ_MAX_LANES && rows_all * L < (int64_t)n_sm * MVQ_WARPS_WANTED * 32) L *= 2;
    return L;
}

/* One token's product at lanes a row known when compiled, where such a kernel exists:
 * gate/up's 2 and Q/K/V's and O's 8 (Qwen2.5-1.5B's shapes on 132 SMs); false sends
 * the launch to the kernel bounded at run time. Why: with L a constant the round's sum
 * over a row's lanes unrolls (gate/up's round loop 560 -> 367 SASS instructions, 56 ->
 * 8 shuffles); Q4_K_M batch 1 on an H100 1,073-1,074 -> 1,098 tokens/s (thirtieth
 * session). Other L stay on the general kernel, to keep the build's kernel count. */
template <int T, bool SWIGLU>
static bool mvq_launch_known(lm_cuda_backend *cu, dim3 grid, size_t smem, const mv_set &s, int cols, const float *x,
                             int n, int L, const mv_q8h &h8) {
    if constexpr (T == MVQ_Q6K_WIDE) { /* always a lane a row (mvq_launch): no kernel of 2 or 8 to build */
        return false;
    } else {
        if (L == 2) {
            lm_cuda_launch_carved(cu, mvq_kernel<T, 1, SWIGLU, 2>, grid, MVQ_THREADS, smem, s, cols, x, n, L, h8);
            return true;
        }
        if constexpr (!SWIGLU) {
            if (L == 8) {
                lm_cuda_launch_carved(cu, mvq_kernel<T, 1, SWIGLU, 8>, grid, MVQ_THREADS, smem, s, cols, x, n, L, h8);
                return true;
            }
        }
        return false;
    }
}

template <int T, bool SWIGLU>
static void mvq_launch(lm_cuda_backend *cu, const mv_set &set, int64_t cols, const float *x, int64_t n) {
    /* the interleaved copy: a lane a row, its warp's 32 rows one tile */
    const int rows_all = set.end[set.n_w - 1];
    const int L = T == MVQ_Q6K_WIDE ? 1 : mvq_lanes_per_row(rows_all, cu->n_sm), rpb = MVQ_THREADS / L;
    /* 5-8 tokens in two groups of 4, each reading the weights: one group of 8 (its
     * sums in registers, the weights read once) measured slower on the H200, Q4_K_M
     * 1.5B-shaped, one call (twentieth session): 8 sequences 2,326 vs 2,554-2,571
     * tokens/s, 6 sequences 2,060-2,064 vs 2,282-2,302 */
    const int nt = n == 1 ? 1 : n == 2 ? 2 : 4;
    mv_q8h h8 = {};
    if (SWIGLU) h8 = lm_cuda_q8h_offer(cu, set.y[0], n, set.rows[0], rpb / 2);
    const size_t smem = (size_t)mvq_layout_of(nt, (int)cols).bytes;
    for (int64_t g0 = 0; g0 < n; g0 += (int64_t)nt * 65535) {
        const int nn = (int)(n - g0 < (int64_t)nt * 65535 ? n - g0 : (int64_t)nt * 65535);
        mv_set s = set;
        for (int k = 0; k < s.n_w; k++) s.y[k] += g0 * s.rows[k];
        mv_q8h hg = h8; /* the same offset into the hand-off */
        if (hg.q) hg.q += g0 * hg.ff, hg.da += g0 * (hg.ff / 32), hg.s16 += g0 * (hg.ff / 16);
        const dim3 grid((unsigned)((rows_all + rpb - 1) / rpb), (unsigned)((nn + nt - 1) / nt));
        const float *xs = x + g0 * cols;
        switch (nt) {
        case 1:
            if (mvq_launch_known<T, SWIGLU>(cu, grid, smem, s, (int)cols, xs, nn, L, hg)) break;
            lm_cuda_launch_carved(cu, mvq_kernel<T, 1, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, L, hg);
            break;
        case 2:
            lm_cuda_launch_carved(cu, mvq_kernel<T, 2, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, L, hg);
            break;
        default:
            lm_cuda_launch_carved(cu, mvq_kernel<T, 4, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, L, hg);
            break;
        }
        if (!lm_cuda_launched(cu, "mvq_kernel")) return;
    }
}

bool lm_cuda_mvq_mixable(const lm_cuda_backend *cu, const lm_weight *a, const lm_weight *b, int64_t rows_before) {
    /* a warp's rows must be of one format: b's first row starts a warp at any lanes a
     * row (32 rows a warp at one lane) */
    return lm_cuda_mvq_supports(cu, a) && lm_cuda_mvq_supports(cu, b) && a->cols == b->cols &&
           rows_before % 32 == 0;
}

void lm_cuda_mvq(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                 float *const *y, bool swiglu) {
    mv_set set = mv_set_of(w, n_w, y);
    const int64_t cols = w[0]->cols;
    bool mixed = false, wide = true;
    for (int k = 1; k < n_w; k++) mixed = mixed || w[k]->type != w[0]->type;
    for (int k = 0; k < n_w; k++) wide = wide && w[k]->wide;
    if (n_w == 1 && w[0]->wide && w[0]->type == LM_DTYPE_Q6_K) {
        set.W[0] = (const uint8_t *)w[0]->wide;
        mvq_launch<MVQ_Q6K_WIDE, false>(cu, set, cols, x, n);
    } else if (wide && !mixed && w[0]->type == LM_DTYPE_Q4_K) {
        for (int k = 0; k < n_w; k++) set.W[k] = (const uint8_t *)w[k]->wide;
        if (swiglu) {
            if (!mvq_gu_staged(cu, set, cols, x, n)) mvq_launch<MVQ_Q4K_WIDE, true>(cu, set, cols, x, n);
        } else {
            mvq_launch<MVQ_Q4K_WIDE, false>(cu, set, cols, x, n);
        }
    } else if (mixed && !swiglu) {
        for (int k = 0; k < n_w; k++)
            if (w[k]->type == LM_DTYPE_Q4_K && w[k]->wide)
                set.W[k] = (const uint8_t *)w[k]->wide, set.type[k] = MVQ_Q4K_WIDE;
        mvq_launch<MVQ_MIXED, false>(cu, set, cols, x, n);
    } else if (w[0]->type == LM_DTYPE_Q4_K) {
        if (swiglu) mvq_launch<LM_DTYPE_Q4_K, true>(cu, set, cols, x, n);
        else mvq_launch<LM_DTYPE_Q4_K, false>(cu, set, cols, x, n);
    } else {
        if (swiglu) mvq_launch<LM_DTYPE_Q6_K, true>(cu, set, cols, x, n);
        else mvq_launch<LM_DTYPE_Q6_K, false>(cu, set, cols, x, n);
    }
}

/* ---- the interleaved copies (a Q6_K head, Q4_K weights) -------------------------- */

bool lm_cuda_mvq_wide_wanted(const lm_cuda_backend *cu, const lm_weight *w) {
    if (!lm_cuda_mvq_supports(cu, w) || w->rows % MVQ_WIDE_ROWS != 0) return false;
    if (w->type == LM_DTYPE_Q4_K) return cu->mvq_q4w;
    return cu->mvq_wide && w->rows >= MVQ_WIDE_MIN_ROWS;
}

size_t lm_cuda_mvq_wide_bytes(const lm_weight *w) {
    return (size_t)(w->rows / MVQ_WIDE_ROWS) * (size_t)(w->cols / 256) *
           (w->type == LM_DTYPE_Q4_K ? MVQ_Q4W_TILE : MVQ_WIDE_TILE);
}

/* a thread a (row, super-block) to the tile: Q4K, a Q4_K super-block's 9 words
 * (16-byte aligned); else a Q6_K one's 210 bytes (2-byte aligned) as 13 words and d */
template <bool Q4K>
__global__ void mvq_wide_fill_kernel(const uint8_t *__restrict__ src, size_t row_bytes, int64_t rows, int nsb,
                                     uint8_t *__restrict__ dst) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * nsb) return;
    const int64_t r = e / nsb;
    const int sb = (int)(e % nsb), i = (int)(r % MVQ_WIDE_ROWS);
    const uint8_t *from = src + (size_t)r * row_bytes + (size_t)sb * (Q4K ? 144 : 210);
    uint8_t *tile = dst + ((size_t)(r / MVQ_WIDE_ROWS) * nsb + sb) * (Q4K ? MVQ_Q4W_TILE : MVQ_WIDE_TILE);
    if constexpr (Q4K) {
        for (int k = 0; k < 9; k++) ((uint4 *)tile)[MVQ_WIDE_ROWS * k + i] = ((const uint4 *)from)[k];
        return;
    }
    const unsigned short *h = (const unsigned short *)from;
    for (int k = 0; k < MVQ_WIDE_WORDS; k++) {
        uint32_t v[4];
        for (int m = 0; m < 4; m++) v[m] = (uint32_t)h[8 * k + 2 * m] | (uint32_t)h[8 * k + 2 * m + 1] << 16;
        ((uint4 *)tile)[MVQ_WIDE_ROWS * k + i] = make_uint4(v[0], v[1], v[2], v[3]);
    }
    ((unsigned short *)(tile + 16 * MVQ_WIDE_ROWS * MVQ_WIDE_WORDS))[i] = h[104];
}

bool lm_cuda_mvq_wide_fill(lm_cuda_backend *cu, const lm_weight *w, void *dst) {
    const bool q4k = w->type == LM_DTYPE_Q4_K;
    if (!dst || (q4k && ((uintptr_t)w->data & 15) != 0)) return false; /* a Q4_K weight's words unaligned */
    const int64_t items = w->rows * (w->cols / 256);
    (q4k ? mvq_wide_fill_kernel<true> : mvq_wide_fill_kernel<false>)<<<(unsigned)((items + 255) / 256), 256, 0,
                                                                        cu->stream>>>(
        (const uint8_t *)w->data, w->row_bytes, w->rows, (int)(w->cols / 256), (uint8_t *)dst);
    if (cudaGetLastError() == cudaSuccess && cudaStreamSynchronize(cu->stream) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
}
