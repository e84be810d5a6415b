/* Q4_K products of 4 to 64 tokens on the int8 tensor cores (mma.sync m16n8k32 .s8)
 * with the 8-bit kernel's arithmetic (src/backend/cuda/cuda_matmul_q8.cu, the CPU's
 * cpu_q8.h): a prototype of a batched path for a Q4_K_M file. It answers two questions
 * before any of it goes into the backend:
 *  1. is the product bit-identical to the one-token 8-bit kernel's, so that a sequence
 *     decoded alone (today: that kernel) and in a batch (today: a bf16 GEMM on the
 *     weights' bf16 copies, which round them) would give the same logits;
 *  2. is it as fast as that bf16 GEMM, reading 4.5 bits a weight where the copy has 16.
 *
 *   nvcc -O3 -arch=sm_90a -Isrc -o bench_cuda_mmq bench/bench_cuda_mmq.cu -lcublas
 *   ./bench_cuda_mmq
 *
 * The arithmetic, per row and token, super-block by super-block from acc = 0 (256
 * values: d, dmin, 8 sub-blocks of 32 with a 6-bit scale sc_j and min m_j; the token's
 * 8-bit codes q with one scale da a super-block):
 *   S = sum_j sc_j * (sum over sub-block j of c * q),  M = sum_j m_j * (sum over j of q)
 *   acc = fma((float)S, d * da, acc);  acc = fma(-(float)M, dmin * da, acc)
 * S and M are exact integers whatever the order of their sums, so tensor cores may form
 * them: per sub-block j, one m16n8k32 of the row's codes c (nibbles 0..15) by the
 * tokens' codes gives the dots, scaled by sc_j after, and one of m_j repeated along the
 * row (every k) accumulates M over the 8 sub-blocks in the MMA's own accumulator. The
 * float steps then run per (row, token) in super-block order, as the one-token kernel
 * runs them. Checked against a host reference to the bit; timed against cublasGemmEx
 * on a bf16 matrix of the same shape (the GEMM path's call). The tokens' codes are
 * made on the host here (the backend would quantize as the 8-bit kernel does). Not
 * built by CMake: a stand-alone tool for the GPU machine.
 *
 * Answers (H200, twenty-third session, docs/BENCHMARKS.md): 1. yes, every product of
 * every shape and token count equals the host's bits; 2. only for few tokens on many
 * rows: 17,920x1,536 (gate/up) at 4 / 8 / 16 / 64 tokens 12.5 / 13.0 / 19.4 / 78.3 us
 * against the bf16 GEMM's 19.1 / 18.4 / 19.2 / 21.2; 1,536x8,960 (down: 24 blocks of
 * 64 rows, no split of the columns) 38.0 us at 4 against 13.1. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"

enum {
    WARPS = 4, ROWS_W = 16, ROWS_B = WARPS * ROWS_W, QK = 256, SB_BYTES = 144, REPS = 50,
    KC = 6, /* super-blocks of the tokens' codes staged at a time: 1,536 columns, 96 KB at 64 tokens */
};

/* D = A B + D, A 16x32 (row-major) and B 32x8 (column-major) of int8, D 16x8 of int32 */
__device__ __forceinline__ void mma_s8(int d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A Q4_K super-block's 8 scales and mins from its header words 1-3 (the CPU's
 * scales_k4, as mvq_q4k_sb decodes them) */
__host__ __device__ inline void q4k_scales(uint32_t u0, uint32_t u1, uint32_t u2, int sc[8], int m[8]) {
    const uint32_t scw[2] = {u0 & 0x3f3f3f3fu, (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u)};
    const uint32_t mw[2] = {u1 & 0x3f3f3f3fu, ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u)};
    for (int j = 0; j < 8; j++) {
        sc[j] = (int)((scw[j >> 2] >> (8 * (j & 3))) & 0xffu);
        m[j] = (int)((mw[j >> 2] >> (8 * (j & 3))) & 0xffu);
    }
}

/* y[t][r] for the block's 64 rows (16 a warp) and 8 NT tokens (NT tiles of 8). A thread
 * holds rows g and g + 8 of its warp's 16 (g = lane / 4) and tokens 2 (lane % 4) and 2
 * (lane % 4) + 1 of each tile: the MMA's accumulator layout. */
template <int NT>
__global__ void __launch_bounds__(32 * WARPS)
    mmq_q4k_kernel(const uint8_t *__restrict__ W, int rows, int cols, const int8_t *__restrict__ q,
                   const float *__restrict__ da, int n, float *__restrict__ y) {
    extern __shared__ __align__(16) uint8_t q_sh[]; /* the tokens' codes of KC super-blocks [8 NT][KC QK] */
    const int nsb = cols / QK, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int t0 = blockIdx.y * 8 * NT, nt = min(8 * NT, n - t0);
    const int ra = blockIdx.x * ROWS_B + warp * ROWS_W + g, rb = ra + 8;
    const uint8_t *wa = W + (size_t)(ra < rows ? ra : 0) * nsb * SB_BYTES;
    const uint8_t *wb = W + (size_t)(rb < rows ? rb : 0) * nsb * SB_BYTES;
    float acc[NT][4];
#pragma unroll
    for (int tl = 0; tl < NT; tl++) acc[tl][0] = acc[tl][1] = acc[tl][2] = acc[tl][3] = 0.0f;
    for (int sb = 0; sb < nsb; sb++) {
        if (sb % KC == 0) { /* the next KC super-blocks of the tokens' codes, 0 past n */
            const int words_row = KC * QK / 16, words_have = (min(nsb - sb, KC) * QK) / 16;
            __syncthreads();
            for (int i = threadIdx.x; i < 8 * NT * words_row; i += blockDim.x) {
                const int t = i / words_row, c = i % words_row;
                ((uint4 *)q_sh)[i] = t < nt && c < words_have
                                         ? ((const uint4 *)(q + (size_t)(t0 + t) * cols + (size_t)sb * QK))[c]
                                         : make_uint4(0, 0, 0, 0);
            }
            __syncthreads();
        }
        const uint8_t *sa = wa + (size_t)sb * SB_BYTES, *sbp = wb + (size_t)sb * SB_BYTES;
        const uint4 ha = __ldg((const uint4 *)sa), hb = __ldg((const uint4 *)sbp);
        uint32_t ca[8], cb[8]; /* words tig and 4 + tig of each 32-byte pair of sub-blocks */
#pragma unroll
        for (int p = 0; p < 4; p++) {
            ca[2 * p] = __ldg((const uint32_t *)(sa + 16 + 32 * p) + tig);
            ca[2 * p + 1] = __ldg((const uint32_t *)(sa + 16 + 32 * p) + 4 + tig);
            cb[2 * p] = __ldg((const uint32_t *)(sbp + 16 + 32 * p) + tig);
            cb[2 * p + 1] = __ldg((const uint32_t *)(sbp + 16 + 32 * p) + 4 + tig);
        }
        int sca[8], ma[8], scb[8], mb[8];
        q4k_scales(ha.y, ha.z, ha.w, sca, ma);
        q4k_scales(hb.y, hb.z, hb.w, scb, mb);
        int S[NT][4], M[NT][4];
#pragma unroll
        for (int tl = 0; tl < NT; tl++)
#pragma unroll
            for (int e = 0; e < 4; e++) S[tl][e] = 0, M[tl][e] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            /* sub-block j: the low nibbles of pair j / 2's bytes (j even) or their high ones */
            const int p = j >> 1, sh = 4 * (j & 1);
            const uint32_t a[4] = {(ca[2 * p] >> sh) & 0x0f0f0f0fu, (cb[2 * p] >> sh) & 0x0f0f0f0fu,
                                   (ca[2 * p + 1] >> sh) & 0x0f0f0f0fu, (cb[2 * p + 1] >> sh) & 0x0f0f0f0fu};
            const uint32_t am[4] = {(uint32_t)ma[j] * 0x01010101u, (uint32_t)mb[j] * 0x01010101u,
                                    (uint32_t)ma[j] * 0x01010101u, (uint32_t)mb[j] * 0x01010101u};
#pragma unroll
            for (int tl = 0; tl < NT; tl++) {
                const uint8_t *qt = q_sh + (size_t)(8 * tl + g) * (KC * QK) + (sb % KC) * QK + 32 * j;
                const uint32_t b[2] = {*(const uint32_t *)(qt + 4 * tig), *(const uint32_t *)(qt + 16 + 4 * tig)};
                int dot[4] = {0, 0, 0, 0};
                mma_s8(dot, a, b);
                S[tl][0] += sca[j] * dot[0], S[tl][1] += sca[j] * dot[1];
                S[tl][2] += scb[j] * dot[2], S[tl][3] += scb[j] * dot[3];
                mma_s8(M[tl], am, b);
            }
        }
        const float d_a = __half2float(__ushort_as_half((unsigned short)(ha.x & 0xffffu)));
        const float dm_a = __half2float(__ushort_as_half((unsigned short)(ha.x >> 16)));
        const float d_b = __half2float(__ushort_as_half((unsigned short)(hb.x & 0xffffu)));
        const float dm_b = __half2float(__ushort_as_half((unsigned short)(hb.x >> 16)));
#pragma unroll
        for (int tl = 0; tl < NT; tl++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = 8 * tl + 2 * tig + (e & 1);
                if (t >= nt) continue;
                const float a = da[(size_t)(t0 + t) * nsb + sb];
                const float d = e < 2 ? d_a : d_b, dm = e < 2 ? dm_a : dm_b;
                acc[tl][e] = fmaf((float)S[tl][e], __fmul_rn(d, a), acc[tl][e]);
                acc[tl][e] = fmaf(-(float)M[tl][e], __fmul_rn(dm, a), acc[tl][e]);
            }
    }
#pragma unroll
    for (int tl = 0; tl < NT; tl++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int t = 8 * tl + 2 * tig + (e & 1), r = e < 2 ? ra : rb;
            if (t < nt && r < rows) y[(size_t)(t0 + t) * rows + r] = acc[tl][e];
        }
}

/* the same arithmetic on the host, in the same order */
static float host_dot(const uint8_t *row, const int8_t *qt, const float *dat, int nsb) {
    float acc = 0.0f;
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *s = row + (size_t)sb * SB_BYTES;
        uint32_t u[4];
        memcpy(u, s, 16);
        int sc[8], m[8];
        q4k_scales(u[1], u[2], u[3], sc, m);
        int S = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            int dot = 0, sum = 0;
            for (int e = 0; e < 32; e++) {
                const int byte = s[16 + 32 * (j >> 1) + e], c = (j & 1) ? byte >> 4 : byte & 15;
                const int qv = qt[sb * QK + 32 * j + e];
                dot += c * qv, sum += qv;
            }
            S += sc[j] * dot, M += m[j] * sum;
        }
        __half_raw hd, hm;
        hd.x = (unsigned short)(u[0] & 0xffffu), hm.x = (unsigned short)(u[0] >> 16);
        const float d = __half2float(__half(hd)), dm = __half2float(__half(hm)), a = dat[sb];
        acc = fmaf((float)S, d * a, acc);
        acc = fmaf(-(float)M, dm * a, acc);
    }
    return acc;
}

static uint64_t g_rng = 0x6d6d71;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* e1 recorded now; the mean microseconds of reps launches since e0; both destroyed */
static float stop_us(cudaEvent_t e0, cudaEvent_t e1, int reps) {
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1000.0f * ms / (float)reps;
}

template <int NT>
static float run_mmq(const uint8_t *W, int rows, int cols, const int8_t *q, const float *da, int n, float *y,
                     int reps) {
    const size_t smem = (size_t)8 * NT * KC * QK;
    CK(cudaFuncSetAttribute(mmq_q4k_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)((rows + ROWS_B - 1) / ROWS_B), (unsigned)((n + 8 * NT - 1) / (8 * NT)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    mmq_q4k_kernel<NT><<<grid, 32 * WARPS, smem>>>(W, rows, cols, q, da, n, y);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) mmq_q4k_kernel<NT><<<grid, 32 * WARPS, smem>>>(W, rows, cols, q, da, n, y);
    return stop_us(e0, e1, reps);
}

static float run_mmq_any(const uint8_t *W, int rows, int cols, const int8_t *q, const float *da, int n, float *y,
                         int reps) {
    if (n <= 8) return run_mmq<1>(W, rows, cols, q, da, n, y, reps);
    if (n <= 16) return run_mmq<2>(W, rows, cols, q, da, n, y, reps);
    if (n <= 32) return run_mmq<4>(W, rows, cols, q, da, n, y, reps);
    return run_mmq<8>(W, rows, cols, q, da, n, y, reps);
}

static float run_cublas(cublasHandle_t h, const __nv_bfloat16 *A, int rows, int cols, const __nv_bfloat16 *x, int n,
                        float *y, int reps) {
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i <= reps; i++) {
        if (i == 1) CK(cudaEventRecord(e0));
        if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, A, CUDA_R_16BF, cols, x, CUDA_R_16BF, cols,
                         &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx failed\n");
            exit(1);
        }
    }
    return stop_us(e0, e1, reps);
}

int main(void) {
    /* a 1.5B model's gate and up together, Q/K/V, the output projection, down */
    static const int shapes[][2] = {{17920, 1536}, {2048, 1536}, {1536, 1536}, {1536, 8960}};
    static const int ns[] = {4, 8, 16, 32, 64};
    const int n_max = 64;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    printf("%-12s %4s %10s %9s %12s %8s %s\n", "rows x cols", "n", "int8 us", "GB/s", "bf16 GEMM us", "ratio",
           "bits vs host");
    int failures = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1], nsb = cols / QK;
        const size_t wbytes = (size_t)rows * nsb * SB_BYTES;
        uint8_t *hw = (uint8_t *)malloc(wbytes);
        for (size_t b = 0; b < wbytes; b++) hw[b] = (uint8_t)rnd();
        for (size_t r = 0; r < (size_t)rows * nsb; r++) { /* finite d and dmin */
            __half_raw d = __half(rndf(1e-3f, 1e-2f)), dm = __half(rndf(1e-3f, 1e-2f));
            memcpy(hw + r * SB_BYTES, &d.x, 2);
            memcpy(hw + r * SB_BYTES + 2, &dm.x, 2);
        }
        int8_t *hq = (int8_t *)malloc((size_t)n_max * cols);
        float *hda = (float *)malloc(sizeof(float) * n_max * nsb);
        for (size_t i = 0; i < (size_t)n_max * cols; i++) hq[i] = (int8_t)((int)(rnd() % 255) - 127);
        for (int i = 0; i < n_max * nsb; i++) hda[i] = rndf(1e-3f, 1e-2f);
        uint8_t *dw;
        int8_t *dq;
        float *dda, *dy;
        __nv_bfloat16 *da16, *dx16;
        CK(cudaMalloc(&dw, wbytes));
        CK(cudaMalloc(&dq, (size_t)n_max * cols));
        CK(cudaMalloc(&dda, sizeof(float) * n_max * nsb));
        CK(cudaMalloc(&dy, sizeof(float) * (size_t)n_max * rows));
        CK(cudaMalloc(&da16, sizeof(__nv_bfloat16) * (size_t)rows * cols));
        CK(cudaMalloc(&dx16, sizeof(__nv_bfloat16) * (size_t)n_max * cols));
        CK(cudaMemcpy(dw, hw, wbytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dq, hq, (size_t)n_max * cols, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dda, hda, sizeof(float) * n_max * nsb, cudaMemcpyHostToDevice));
        CK(cudaMemset(da16, 0x3c, sizeof(__nv_bfloat16) * (size_t)rows * cols)); /* finite bf16 values */
        CK(cudaMemset(dx16, 0x3c, sizeof(__nv_bfloat16) * (size_t)n_max * cols));
        float *hy = (float *)malloc(sizeof(float) * (size_t)n_max * rows);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int n = ns[k];
            CK(cudaMemset(dy, 0xff, sizeof(float) * (size_t)n * rows)); /* NaN where nothing is written */
            const float us = run_mmq_any(dw, rows, cols, dq, dda, n, dy, REPS);
            CK(cudaMemcpy(hy, dy, sizeof(float) * (size_t)n * rows, cudaMemcpyDeviceToHost));
            /* every token of a few rows (first, last, and spread) against the host */
            long bad = 0, checked = 0;
            for (int r = 0; r < rows; r += (r < 64 || r >= rows - 64) ? 1 : 997)
                for (int t = 0; t < n; t++) {
                    const float want = host_dot(hw + (size_t)r * nsb * SB_BYTES, hq + (size_t)t * cols,
                                                hda + (size_t)t * nsb, nsb);
                    const float got = hy[(size_t)t * rows + r];
                    bad += memcmp(&want, &got, sizeof got) != 0;
                    checked++;
                }
            failures += bad != 0;
            const float gemm = run_cublas(h, da16, rows, cols, dx16, n, dy, REPS);
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", rows, cols);
            printf("%-12s %4d %10.2f %9.0f %12.2f %8.2f %ld of %ld differ\n", shape, n, us,
                   (double)wbytes / (us * 1e-6) / 1e9, gemm, gemm / us, bad, checked);
        }
        free(hy), free(hq), free(hda), free(hw);
        CK(cudaFree(dw));
        CK(cudaFree(dq));
        CK(cudaFree(dda));
        CK(cudaFree(dy));
        CK(cudaFree(da16));
        CK(cudaFree(dx16));
    }
    cublasDestroy(h);
    printf("%s\n", failures ? "FAILED: products differ from the host's bits" : "every product equals the host's bits");
    return failures ? 1 : 0;
}
