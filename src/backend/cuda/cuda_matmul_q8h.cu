/* The down product of a decode step over swiglu's output in 8 bits, handed off by the
 * gate/up product before it (mv_q8h): dp4a on the weights' codes, for Q4_K weights
 * whose rows are too long for the 8-bit kernel to quantize its input itself.
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
 * da, acc), in a fixed order: each lane its chunks in order, then a fixed butterfly
 * over the warp. A token's result depends on its own activations alone (batch
 * invariant); it is not the CPU's bits (the CPU quantizes by 256 values) nor the f32
 * kernel's, and within the 8-bit products' tolerance of both.
 *
 * Layout: a warp a row, lane l taking chunks of 64 values (the two sub-blocks that
 * share 32 bytes of codes) l, l + 32, ...: for every chunk a 16-byte header (d,
 * dmin, the 12 bytes of scales) and 32 bytes of codes, all requested before the PDL
 * wait (weights are written at load, never by the kernel before), then the
 * activations' codes, scales and sums, which that kernel writes.
 *
 * Measured on the H200 (Q4_K_M 1.5B-shaped, batch 1, fifteenth session, one call):
 * 828.5-831.7 -> 837.7-852.6 tokens/s (LUMEN_CUDA_Q8_HANDOFF=0 in the same build:
 * 809.6-827.2); in the step's timeline a Q4_K down product adds 5.8 us instead of
 * 9.0, the gate/up kernel's hand-off 0.36 us. */
#include "backend/cuda/cuda_matmul.cuh"

enum {
    Q8H_THREADS = 128,
    Q8H_CPL = 5, /* chunks a lane a round: 140 chunks (8,960 columns) in one round */
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

/* A chunk's weights: the super-block's header and the chunk's 32 bytes of codes. */
struct q8h_chunk {
    uint4 hd, c0, c1;
};

__device__ __forceinline__ void q8h_load(const uint8_t *wr, int c, q8h_chunk &w) {
    const uint8_t *sb = wr + (size_t)(c >> 2) * 144;
    w.hd = __ldg((const uint4 *)sb);
    w.c0 = __ldg((const uint4 *)(sb + 16 + 32 * (c & 3)));
    w.c1 = __ldg((const uint4 *)(sb + 32 + 32 * (c & 3)));
}

/* acc[t] += chunk c of the row times token t's activations (values 64c .. 64c + 63) */
template <int NT>
__device__ __forceinline__ void q8h_chunk_fma(const q8h_chunk &w, int c, const mv_q8h &h, int t0, int nt,
                                              float acc[NT]) {
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
        const size_t e = (size_t)(t0 + t) * h.ff + 64 * (size_t)c;
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
    lm_pdl_enter();
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int c0 = 0; on && c0 < n_chunks; c0 += 32 * Q8H_CPL) {
#pragma unroll
        for (int i = 0; i < Q8H_CPL; i++) {
            const int c = c0 + lane + 32 * i;
            if (c < n_chunks) q8h_chunk_fma<NT>(w[i], c, h, t0, nt, acc);
        }
        if (c0 + 32 * Q8H_CPL < n_chunks) {
#pragma unroll
            for (int i = 0; i < Q8H_CPL; i++) {
                const int c = c0 + 32 * Q8H_CPL + lane + 32 * i;
                if (c < n_chunks) q8h_load(wr, c, w[i]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (on && lane == 0 && t < nt) y[(size_t)(t0 + t) * rows + row] = v;
    }
}

bool lm_cuda_q8h_take(lm_cuda_backend *cu, const lm_weight *w, const float *x, int64_t n, float *y) {
    if (!cu->q8_in_src || cu->q8_in_src != x || cu->q8_in_seq + 1 != cu->op_seq || cu->q8_in_count != n * w->cols)
        return false;
    if (w->type != LM_DTYPE_Q4_K || w->cols % 256 != 0 || ((uintptr_t)w->data & 15) != 0 || w->rows > INT32_MAX ||
        n > 65535 * 4)
        return false;
    cu->q8_in_src = NULL;
    const mv_q8h h = q8h_at(cu->scr[LM_CUDA_SCR_XQ], n, w->cols);
    const int nt = n == 1 ? 1 : n == 2 ? 2 : 4;
    const dim3 grid((unsigned)((w->rows + 3) / 4), (unsigned)((n + nt - 1) / nt));
    const uint8_t *W = (const uint8_t *)w->data;
    const int rows = (int)w->rows, cols = (int)w->cols, nn = (int)n;
    switch (nt) {
    case 1: lm_cuda_launch(cu, q8h_q4k_kernel<1>, grid, dim3(Q8H_THREADS), W, rows, cols, h, y, nn); break;
    case 2: lm_cuda_launch(cu, q8h_q4k_kernel<2>, grid, dim3(Q8H_THREADS), W, rows, cols, h, y, nn); break;
    default: lm_cuda_launch(cu, q8h_q4k_kernel<4>, grid, dim3(Q8H_THREADS), W, rows, cols, h, y, nn); break;
    }
    lm_cuda_launched(cu, "q8h_q4k_kernel");
    return true;
}
