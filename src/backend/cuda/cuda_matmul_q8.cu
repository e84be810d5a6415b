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
 * many rows over inputs of up to 4,096 (gate/up, the output head); the others stay
 * on the f32 kernel, faster there (MVQ_MIN_ROWS).
 *
 * The arithmetic is the CPU's, bit for bit (cpu_q8.h): each token's row quantized
 * per 256 values (PER256: d = max / -127, max the signed value of largest magnitude,
 * first one on ties; codes min(127, round(x / d))), integer sums per super-block
 *   Q4_K  S = sum_j sc_j sum_{sub j} c*q,  M = sum_j m_j sum_{sub j} q
 *         acc = fma((float)S, d * da, acc);  acc = fma(-(float)M, dmin * da, acc)
 *   Q6_K  S = sum_i sc_i sum_{16 values i} (c - 32) * q;  acc = fma((float)S, d * da, acc)
 * in super-block order from acc = 0. The integer sums are exact in any order, so a
 * block forms them across its lanes; one thread per row and token then runs the
 * float steps in order. A product here equals the CPU backend's to the bit, and a
 * token's result depends on nothing else in the batch.
 *
 * A block quantizes its tokens' rows into shared memory itself (8 lanes per 256
 * values), then takes groups of rpb rows: items of (row, super-block, piece), a piece being 16
 * bytes of Q4_K codes (32 values) or 48 bytes of Q6_K codes (64 values), a thread an
 * item at a time with MVQ_UNROLL items' loads in flight. */
#include "backend/cuda/cuda_matmul.cuh"

enum {
    MVQ_THREADS = 128,
    MVQ_UNROLL = 4,
    MVQ_MAX_NT = 4,        /* tokens a launch group                            */
    MVQ_MAX_COLS = 16384,  /* the activations' codes must fit in shared memory */
    /* The shapes it takes (lm_cuda_mvq_supports): its quantization, barriers and float
     * steps add ~1-2 us a launch that only many rows repay. On the H200 at batch 1
     * (bench_cuda_matvec, us a call, this kernel vs the f32 one): Q4_K 8960x1536 9.8
     * vs 10.8, head 151936x1536 113 vs 156 (Q6_K 103 vs 176); but 1536x1536 5.9 vs
     * 3.7, 256x1536 4.5 vs 3.2, and 1536x8960 17.5 vs 11.1 (each block quantizes
     * the whole 8960-wide input). */
    MVQ_MIN_ROWS = 4096,
    MVQ_MAX_COLS_TAKEN = 4096,
    MVQ_TARGET_ITEMS = MVQ_THREADS * MVQ_UNROLL,
    MVQ_BLOCKS_PER_SM = 4, /* resident at once (the kernels' ~120 registers)      */
};

/* Shared memory of a block: codes [NT][cols], scales [NT][nsb], sums of 16 codes
 * [NT][cols / 16], then per (token, row, super-block) S and M, per (row,
 * super-block) the weight's d and dmin, per (row, token) the result. Offsets in
 * bytes. */
struct mvq_layout {
    int q, da, s16, sm, dd, res, bytes;
};

static __host__ __device__ int mvq_align16(int b) { return (b + 15) & ~15; }

static __host__ __device__ mvq_layout mvq_layout_of(int nt, int cols, int rpb) {
    const int nsb = cols / 256;
    mvq_layout l;
    l.q = 0;
    l.da = mvq_align16(nt * cols);
    l.s16 = mvq_align16(l.da + 4 * nt * nsb);
    l.sm = mvq_align16(l.s16 + 4 * nt * (cols / 16));
    l.dd = mvq_align16(l.sm + 8 * nt * rpb * nsb);
    l.res = mvq_align16(l.dd + 8 * rpb * nsb);
    l.bytes = mvq_align16(l.res + 4 * rpb * nt);
    return l;
}

/* ---- phase A: a token's 256 values to codes (8 lanes; lane g of them has values
 * 32g..32g+31), the loads of every group in flight at once ----------------------- */
__device__ __forceinline__ void mvq_quantize_sb(const float *__restrict__ xs, int8_t *q, float *da, int *s16, int g,
                                                bool on) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 a = on ? ((const float4 *)xs)[8 * g + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
    }
    /* the first value of largest magnitude: the lane's first, then the lowest lane's */
    float am = 0.0f, mx = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++)
        if (fabsf(v[i]) > am) am = fabsf(v[i]), mx = v[i];
    int bl = g;
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, off), omx = __shfl_xor_sync(0xffffffffu, mx, off);
        const int obl = __shfl_xor_sync(0xffffffffu, bl, off);
        if (oam > am || (oam == am && obl < bl)) am = oam, mx = omx, bl = obl;
    }
    if (!on) return;
    const float iscale = am != 0.0f ? __fdiv_rn(-127.0f, mx) : 0.0f;
    const float d = am != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    uint32_t w[8];
    int sum[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        w[i] = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int c = min(127, __float2int_rn(__fmul_rn(iscale, v[4 * i + k])));
            sum[i >> 2] += c;
            w[i] |= (uint32_t)(c & 0xff) << (8 * k);
        }
    }
    ((uint4 *)q)[2 * g] = make_uint4(w[0], w[1], w[2], w[3]);
    ((uint4 *)q)[2 * g + 1] = make_uint4(w[4], w[5], w[6], w[7]);
    s16[2 * g] = sum[0], s16[2 * g + 1] = sum[1];
    if (g == 0) *da = d;
}

/* ---- phase B: one piece's integer sums ------------------------------------------ */
/* Q4_K super-block (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins,
 * 128 bytes of codes. Piece p (0..7) holds the 16 code bytes at 32 (p / 2) + 16 (p %
 * 2): low nibbles are values 16 (p % 2) .. +15 of sub-block 2 (p / 2), high nibbles
 * the same values of sub-block 2 (p / 2) + 1. */
struct mvq_q4k {
    static constexpr int pieces = 8, sb_bytes = 144;
    uint4 head, codes;
    __device__ __forceinline__ void load(const uint8_t *sb, int p) {
        head = __ldg((const uint4 *)sb);
        codes = __ldg((const uint4 *)(sb + 16 + 16 * p));
    }
    /* sc or m of sub-block j from the packed words (as the CPU's scales_k4) */
    __device__ __forceinline__ void scales(int j, int *sc, int *m) const {
        const uint32_t u0 = head.y, u1 = head.z, u2 = head.w;
        const uint32_t sc_w = j < 4 ? (u0 & 0x3f3f3f3fu) : ((u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u));
        const uint32_t m_w = j < 4 ? (u1 & 0x3f3f3f3fu) : (((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u));
        *sc = (int)((sc_w >> (8 * (j & 3))) & 0xffu);
        *m = (int)((m_w >> (8 * (j & 3))) & 0xffu);
    }
    /* S and M of this piece for one token's codes q (the super-block's 256) */
    __device__ __forceinline__ void sums(int p, const int8_t *q, const int *s16, int *S, int *M) const {
        const int j = 2 * (p >> 1), h = p & 1;
        const int *qa = (const int *)(q + 32 * j + 16 * h), *qb = (const int *)(q + 32 * (j + 1) + 16 * h);
        const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo = __dp4a((int)(w[i] & 0x0f0f0f0fu), qa[i], lo);
            hi = __dp4a((int)((w[i] >> 4) & 0x0f0f0f0fu), qb[i], hi);
        }
        int sc0, m0, sc1, m1;
        scales(j, &sc0, &m0);
        scales(j + 1, &sc1, &m1);
        *S = sc0 * lo + sc1 * hi;
        /* the mins once a super-block: sub-block sums from the 16-value sums */
        *M = h ? 0 : m0 * (s16[2 * j] + s16[2 * j + 1]) + m1 * (s16[2 * j + 2] + s16[2 * j + 3]);
    }
    __device__ __forceinline__ float d() const {
        return __half2float(__ushort_as_half((unsigned short)(head.x & 0xffffu)));
    }
    __device__ __forceinline__ float dmin() const {
        return __half2float(__ushort_as_half((unsigned short)(head.x >> 16)));
    }
};

/* 16 bytes at p, any even address: five aligned words, funnel-shifted */
__device__ __forceinline__ void mvq_ld16_a2(const uint8_t *p, uint32_t w[4]) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 3u) * 8u;
    uint32_t r[5];
#pragma unroll
    for (int i = 0; i < 5; i++) r[i] = __ldg(a + i);
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
}

/* Q6_K super-block (210 bytes, rows at even addresses): ql[128], qh[64], 16 int8
 * scales, d (f16). Value e: half e / 128, r = e % 128; low 4 bits from ql[64 half +
 * r % 64] (high nibble when r >= 64), high 2 bits from qh[32 half + r % 32] >> 2 (r /
 * 32); scale e / 16. Piece p (0..3): half p / 2, rr = 16 (p % 2): the four runs of 16
 * values r = rr + 32k + i (k 0..3), from ql bytes rr.. and rr + 32.. and qh bytes
 * rr.. of the half. */
struct mvq_q6k {
    static constexpr int pieces = 4, sb_bytes = 210;
    uint32_t la[4], lb[4], hq[4];
    int8_t sc[4];
    uint16_t dh;
    __device__ __forceinline__ void load(const uint8_t *sb, int p) {
        const int half = p >> 1, rr = 16 * (p & 1);
        mvq_ld16_a2(sb + 64 * half + rr, la);
        mvq_ld16_a2(sb + 64 * half + rr + 32, lb);
        mvq_ld16_a2(sb + 128 + 32 * half + rr, hq);
#pragma unroll
        for (int k = 0; k < 4; k++) sc[k] = (int8_t)__ldg(sb + 192 + 8 * half + (rr >> 4) + 2 * k);
        dh = __ldg((const unsigned short *)(sb + 208));
    }
    __device__ __forceinline__ void sums(int p, const int8_t *q, const int *s16, int *S, int *M) const {
        const int half = p >> 1, rr = 16 * (p & 1);
        int s = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r0 = rr + 32 * k, e0 = 128 * half + r0; /* the run's first value */
            const int *qa = (const int *)(q + e0);
            int dot = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t l = ((k & 1) ? lb[i] : la[i]) >> (k >= 2 ? 4 : 0);
                const uint32_t c = (l & 0x0f0f0f0fu) | (((hq[i] >> (2 * k)) & 0x03030303u) << 4);
                dot = __dp4a((int)c, qa[i], dot);
            }
            s += (int)sc[k] * (dot - 32 * s16[e0 >> 4]);
        }
        *S = s;
        *M = 0;
    }
    __device__ __forceinline__ float d() const { return __half2float(__ushort_as_half(dh)); }
    __device__ __forceinline__ float dmin() const { return 0.0f; }
};

template <int T>
struct mvq_format;
template <>
struct mvq_format<LM_DTYPE_Q4_K> {
    typedef mvq_q4k type;
};
template <>
struct mvq_format<LM_DTYPE_Q6_K> {
    typedef mvq_q6k type;
};

/* A block's items (row, super-block, piece) of one group of rpb rows, MVQ_UNROLL a
 * thread at a time: their weights (load) and their sums into sm (sums). */
template <int T, bool SWIGLU>
struct mvq_batch {
    typedef typename mvq_format<T>::type F;
    F f[MVQ_UNROLL];
    __device__ __forceinline__ void load(const mv_set &set, int rows_all, int r0, int per_row, int total,
                                         int base) {
#pragma unroll
        for (int u = 0; u < MVQ_UNROLL; u++) {
            const int i = base + u * MVQ_THREADS + threadIdx.x, r = r0 + i / per_row;
            if (i < total && r < rows_all) {
                int k, lr;
                if (SWIGLU) k = r & 1, lr = r >> 1;
                else k = mv_which(set, r), lr = r - (k ? set.end[k - 1] : 0);
                const int sb = (i % per_row) / F::pieces;
                f[u].load(set.W[k] + (size_t)lr * set.row_bytes[k] + (size_t)sb * F::sb_bytes, i % F::pieces);
            }
        }
    }
    template <int NT>
    __device__ __forceinline__ void sums(int rows_all, int r0, int per_row, int total, int base, int nt, int cols,
                                         int rpb, const int8_t *q, const int *s16, int2 *sm, float2 *dd) const {
        const int nsb = cols / 256;
#pragma unroll
        for (int u = 0; u < MVQ_UNROLL; u++) {
            const int i = base + u * MVQ_THREADS + threadIdx.x, rl = i / per_row;
            const bool on = i < total && r0 + rl < rows_all;
            const int sb = (i % per_row) / F::pieces, p = i % F::pieces;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int S = 0, M = 0;
                if (on && t < nt) f[u].sums(p, q + t * cols + 256 * sb, s16 + t * (cols / 16) + 16 * sb, &S, &M);
#pragma unroll
                for (int off = 1; off < F::pieces; off <<= 1) {
                    S += __shfl_xor_sync(0xffffffffu, S, off);
                    M += __shfl_xor_sync(0xffffffffu, M, off);
                }
                if (on && p == 0 && t < nt) sm[(t * rpb + rl) * nsb + sb] = make_int2(S, M);
            }
            if (on && p == 0) dd[rl * nsb + sb] = make_float2(f[u].d(), f[u].dmin());
        }
    }
};

/* One wave of blocks, each over groups of rpb rows (blockIdx.x, + gridDim.x, ...), so
 * a block quantizes its tokens once for all its groups. The first weights are
 * requested before the quantization, each group's first weights before the previous
 * group's float steps. SWIGLU: the set is (gate, up) with rows interleaved (gate r at
 * 2r, up r at 2r + 1) and rpb even; y[0] gets silu(gate) * up. */
template <int T, int NT, bool SWIGLU>
__global__ void __launch_bounds__(MVQ_THREADS, MVQ_BLOCKS_PER_SM)
    mvq_kernel(const __grid_constant__ mv_set set, int cols, const float *__restrict__ x, int n, int rpb) {
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    const int nsb = cols / 256;
    const int t0 = blockIdx.y * NT, nt = min(NT, n - t0);
    const int rows_all = set.end[set.n_w - 1], n_groups = (rows_all + rpb - 1) / rpb;
    const mvq_layout l = mvq_layout_of(NT, cols, rpb);
    int8_t *q = (int8_t *)(mvq_smem + l.q);
    float *da = (float *)(mvq_smem + l.da);
    int *s16 = (int *)(mvq_smem + l.s16);
    int2 *sm = (int2 *)(mvq_smem + l.sm);
    float2 *dd = (float2 *)(mvq_smem + l.dd);
    float *res = (float *)(mvq_smem + l.res); /* [rpb][NT] */
    const int per_row = nsb * mvq_format<T>::type::pieces, total = rpb * per_row;
    const int step = MVQ_THREADS * MVQ_UNROLL;
    lm_pdl_enter();
    mvq_batch<T, SWIGLU> b;
    int g = blockIdx.x;
    if (g < n_groups) b.load(set, rows_all, g * rpb, per_row, total, 0);
    /* a super-block per 8 lanes, every lane through the same trips (the shuffles) */
    for (int p0 = 0; p0 < nt * nsb; p0 += MVQ_THREADS / 8) {
        const int p = p0 + (threadIdx.x >> 3), t = p / nsb, sb = p % nsb;
        const bool on = p < nt * nsb;
        mvq_quantize_sb(x + (on ? (size_t)(t0 + t) * cols + 256 * sb : 0), q + t * cols + 256 * sb,
                        da + t * nsb + sb, s16 + t * (cols / 16) + 16 * sb, threadIdx.x & 7, on);
    }
    __syncthreads();
    for (; g < n_groups; g += gridDim.x) {
        const int r0 = g * rpb;
        for (int base = 0; base < total; base += step) {
            b.template sums<NT>(rows_all, r0, per_row, total, base, nt, cols, rpb, q, s16, sm, dd);
            if (base + step < total) b.load(set, rows_all, r0, per_row, total, base + step);
            else if (g + (int)gridDim.x < n_groups) b.load(set, rows_all, r0 + (int)gridDim.x * rpb, per_row, total, 0);
        }
        __syncthreads();
        /* the float steps, in super-block order: a thread per (row, token) */
        for (int e = threadIdx.x; e < rpb * nt; e += MVQ_THREADS) {
            const int rl = e / nt, t = e % nt;
            if (r0 + rl >= rows_all) continue;
            float acc = 0.0f;
            for (int sb = 0; sb < nsb; sb++) {
                const int2 v = sm[(t * rpb + rl) * nsb + sb];
                const float2 w = dd[rl * nsb + sb];
                const float a = da[t * nsb + sb];
                acc = fmaf((float)v.x, __fmul_rn(w.x, a), acc);
                if (T != LM_DTYPE_Q6_K) acc = fmaf(-(float)v.y, __fmul_rn(w.y, a), acc);
            }
            res[rl * NT + t] = acc;
        }
        __syncthreads();
        if (SWIGLU) { /* (gate, up) row pairs: rows_all and rpb are even */
            for (int e = threadIdx.x; e < rpb / 2 * nt; e += MVQ_THREADS) {
                const int pl = e / nt, t = e % nt, r = r0 + 2 * pl;
                if (r < rows_all)
                    set.y[0][(size_t)(t0 + t) * set.rows[0] + (r >> 1)] =
                        lm_swiglu1(res[2 * pl * NT + t], res[(2 * pl + 1) * NT + t]);
            }
        } else {
            for (int e = threadIdx.x; e < rpb * nt; e += MVQ_THREADS) {
                const int rl = e / nt, t = e % nt, r = r0 + rl;
                if (r >= rows_all) continue;
                const int k = mv_which(set, r), lr = r - (k ? set.end[k - 1] : 0);
                set.y[k][(size_t)(t0 + t) * set.rows[k] + lr] = res[rl * NT + t];
            }
        }
        /* sm, dd and res are the next group's after the sums' first writes: those come
         * after this group's readers passed the barrier above, and res's after the
         * next one */
    }
}

bool lm_cuda_mvq_supports(const lm_cuda_backend *cu, const lm_weight *w) {
    return cu->mvq && (w->type == LM_DTYPE_Q4_K || w->type == LM_DTYPE_Q6_K) && w->cols % 256 == 0 &&
           w->cols <= MVQ_MAX_COLS_TAKEN && w->rows >= MVQ_MIN_ROWS && w->rows <= INT32_MAX / 8;
}

/* rows a group: about MVQ_TARGET_ITEMS items, fewer where that leaves SMs idle (a
 * 256-row V in groups of 10 took 26 blocks), never below 2 */
static int mvq_rows_per_block(int pieces, int64_t cols, int64_t rows_all, int n_sm, bool swiglu) {
    int64_t rpb = MVQ_TARGET_ITEMS / (cols / 256 * pieces);
    const int64_t spread = rows_all / (2 * (int64_t)n_sm);
    if (rpb > spread) rpb = spread;
    if (rpb < 2) rpb = 2;
    if (rpb > 32) rpb = 32;
    return swiglu ? (int)rpb & ~1 : (int)rpb;
}

template <int T, bool SWIGLU>
static void mvq_launch(lm_cuda_backend *cu, const mv_set &set, int64_t cols, const float *x, int64_t n) {
    const int pieces = T == LM_DTYPE_Q4_K ? 8 : 4;
    const int rows_all = set.end[set.n_w - 1];
    const int rpb = mvq_rows_per_block(pieces, cols, rows_all, cu->n_sm, SWIGLU);
    const int nt = n == 1 ? 1 : n == 2 ? 2 : 4;
    const size_t smem = (size_t)mvq_layout_of(nt, (int)cols, rpb).bytes;
    for (int64_t g0 = 0; g0 < n; g0 += (int64_t)nt * 65535) {
        const int nn = (int)(n - g0 < (int64_t)nt * 65535 ? n - g0 : (int64_t)nt * 65535);
        mv_set s = set;
        for (int k = 0; k < s.n_w; k++) s.y[k] += g0 * s.rows[k];
        const int groups = (rows_all + rpb - 1) / rpb, wave = MVQ_BLOCKS_PER_SM * cu->n_sm;
        const dim3 grid((unsigned)(groups < wave ? groups : wave), (unsigned)((nn + nt - 1) / nt));
        const float *xs = x + g0 * cols;
        if (smem > 48 * 1024) {
            void (*k)(mv_set, int, const float *, int, int) =
                nt == 1 ? mvq_kernel<T, 1, SWIGLU> : nt == 2 ? mvq_kernel<T, 2, SWIGLU> : mvq_kernel<T, 4, SWIGLU>;
            if (!lm_cuda_ok(cu, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                            "matmul (shared memory)"))
                return;
        }
        switch (nt) {
        case 1: lm_cuda_launch_smem(cu, mvq_kernel<T, 1, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, rpb); break;
        case 2: lm_cuda_launch_smem(cu, mvq_kernel<T, 2, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, rpb); break;
        default: lm_cuda_launch_smem(cu, mvq_kernel<T, 4, SWIGLU>, grid, MVQ_THREADS, smem, s, (int)cols, xs, nn, rpb); break;
        }
        if (!lm_cuda_launched(cu, "mvq_kernel")) return;
    }
}

void lm_cuda_mvq(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                 float *const *y, bool swiglu) {
    const mv_set set = mv_set_of(w, n_w, y);
    const int64_t cols = w[0]->cols;
    if (w[0]->type == LM_DTYPE_Q4_K) {
        if (swiglu) mvq_launch<LM_DTYPE_Q4_K, true>(cu, set, cols, x, n);
        else mvq_launch<LM_DTYPE_Q4_K, false>(cu, set, cols, x, n);
    } else {
        if (swiglu) mvq_launch<LM_DTYPE_Q6_K, true>(cu, set, cols, x, n);
        else mvq_launch<LM_DTYPE_Q6_K, false>(cu, set, cols, x, n);
    }
}
