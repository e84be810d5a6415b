/* Decode-shaped GEMMs on the GPU: cublasGemmEx's default algorithm against every
 * algorithm cuBLASLt's heuristic offers, for the products of a Qwen2.5-1.5B-shaped
 * model at 64-512 columns (the GEMM path's chunk sizes). Weights are bf16 [rows][cols]
 * (used as the transposed A), activations bf16 [n][cols], outputs f32 [n][rows]: the
 * layout of cuda_matmul.cu's gemm_run. Each timing cycles over enough copies of the
 * weight to exceed the L2 (as a decode step, which reads each weight once).
 *
 *   nvcc -O2 -arch=sm_90a -o bench_cuda_gemm bench/bench_cuda_gemm.cu -lcublasLt -lcublas
 *   ./bench_cuda_gemm [reps]
 *
 * Prints, per shape and column count: the default's microseconds, the best cuBLASLt
 * algorithm's, the weight bytes per second it reaches and its configuration (tile,
 * split-K, reduction scheme, stages); the heuristic's first algorithm's time; and the
 * best time with split-K (2-16 parts, deterministic reductions) forced onto each
 * offered algorithm. Not built by CMake: a stand-alone tool for the GPU machine. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A failed CUDA or cuBLAS call ends the benchmark, naming the call. */
static void check(bool ok, const char *file, int line, const char *call, const char *why) {
    if (ok) return;
    fprintf(stderr, "%s:%d %s: %s\n", file, line, call, why);
    exit(1);
}
#define CK(x)                                                                           \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        check(e_ == cudaSuccess, __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
    } while (0)
#define CB(x)                                                                           \
    do {                                                                                \
        cublasStatus_t s_ = (x);                                                        \
        check(s_ == CUBLAS_STATUS_SUCCESS, __FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
    } while (0)

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
    }
}

enum { WS_BYTES = 32 << 20, MAX_ALGOS = 32 };
static const size_t L2_SPAN = (size_t)256 << 20;

typedef struct {
    const char *name;
    int rows, cols;
} shape;

static float time_loop(cudaStream_t st, int reps, void (*body)(void *, int), void *arg) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) body(arg, i);
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++) body(arg, i);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms * 1000.0f / reps;
}

typedef struct {
    cublasHandle_t h;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    const cublasLtMatmulAlgo_t *algo;
    __nv_bfloat16 **w;
    int n_copies;
    __nv_bfloat16 *x;
    float *y;
    int rows, cols, n;
    void *ws;
    cudaStream_t st;
    int batch;
} run_ctx;

static void run_default(void *p, int i) {
    run_ctx *c = (run_ctx *)p;
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, c->rows, c->n, c->cols, &one, c->w[i % c->n_copies], CUDA_R_16BF,
                    c->cols, c->x, CUDA_R_16BF, c->cols, &zero, c->y, CUDA_R_32F, c->rows, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
}

static void run_lt(void *p, int i) {
    run_ctx *c = (run_ctx *)p;
    const float one = 1.0f, zero = 0.0f;
    CB(cublasLtMatmul(c->lt, c->desc, &one, c->w[i % c->n_copies], c->la, c->x, c->lb, &zero, c->y, c->lc, c->y,
                      c->lc, c->algo, c->ws, WS_BYTES, c->st));
}

static int cfg(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t got = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &got) != CUBLAS_STATUS_SUCCESS) return -1;
    return (int)v;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    const shape shapes[] = {{"q/o", 1536, 1536}, {"k/v", 256, 1536}, {"qkv", 2048, 1536},
                            {"gate", 8960, 1536}, {"gate+up", 17920, 1536}, {"down", 1536, 8960},
                            {"head", 151936, 1536}};
    const int ns[] = {64, 128, 256, 512};
    run_ctx c;
    memset(&c, 0, sizeof c);
    CK(cudaStreamCreate(&c.st));
    CB(cublasCreate(&c.h));
    CB(cublasSetStream(c.h, c.st));
    CB(cublasLtCreate(&c.lt));
    CK(cudaMalloc(&c.ws, WS_BYTES));
    CB(cublasSetWorkspace(c.h, c.ws, WS_BYTES));
    CK(cudaMalloc(&c.x, (size_t)512 * 8960 * 2));
    CK(cudaMalloc(&c.y, (size_t)512 * 151936 * 4));
    fill_kernel<<<1024, 256, 0, c.st>>>(c.x, (size_t)512 * 8960, 7u);
    printf("%-8s %4s %9s %9s %7s %6s  %s\n", "shape", "n", "default", "best-lt", "TB/s", "algos",
           "best: tile splitk red stages; heuristic #0; best with split-K forced");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t wbytes = (size_t)shapes[s].rows * shapes[s].cols * 2;
        c.n_copies = (int)((L2_SPAN + wbytes - 1) / wbytes);
        if (c.n_copies < 2) c.n_copies = 2;
        c.w = (__nv_bfloat16 **)calloc(c.n_copies, sizeof *c.w);
        for (int i = 0; i < c.n_copies; i++) {
            CK(cudaMalloc(&c.w[i], wbytes));
            fill_kernel<<<1024, 256, 0, c.st>>>(c.w[i], wbytes / 2, 100u + i);
        }
        c.rows = shapes[s].rows, c.cols = shapes[s].cols;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            c.n = ns[k];
            const float t_def = time_loop(c.st, reps, run_default, &c);
            CB(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
            CB(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
            CB(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_16BF, c.cols, c.rows, c.cols));
            CB(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, c.cols, c.n, c.cols));
            CB(cublasLtMatrixLayoutCreate(&c.lc, CUDA_R_32F, c.rows, c.n, c.rows));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            const size_t wsb = WS_BYTES;
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
            int got = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(c.lt, c.desc, c.la, c.lb, c.lc, c.lc, pref, MAX_ALGOS, res, &got));
            float best = 1e30f;
            int bi = -1;
            for (int a = 0; a < got; a++) {
                if (res[a].state != CUBLAS_STATUS_SUCCESS) continue;
                c.algo = &res[a].algo;
                const float t = time_loop(c.st, reps, run_lt, &c);
                if (t < best) best = t, bi = a;
            }
            /* split-K forced onto each offered algorithm, deterministic reductions only */
            float best_s = 1e30f;
            int bs_k = 0, bs_red = 0, bs_tile = 0;
            const int splits[] = {2, 3, 4, 6, 8, 12, 16};
            const uint32_t reds[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
            for (int a = 0; a < got; a++) {
                if (res[a].state != CUBLAS_STATUS_SUCCESS) continue;
                for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++)
                    for (size_t ri = 0; ri < 2; ri++) {
                        cublasLtMatmulAlgo_t al = res[a].algo;
                        const uint32_t sk = (uint32_t)splits[si], rd = reds[ri];
                        if (cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                                                 sizeof sk) ||
                            cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &rd,
                                                                 sizeof rd))
                            continue;
                        cublasLtMatmulHeuristicResult_t chk;
                        if (cublasLtMatmulAlgoCheck(c.lt, c.desc, c.la, c.lb, c.lc, c.lc, &al, &chk) !=
                                CUBLAS_STATUS_SUCCESS ||
                            chk.workspaceSize > WS_BYTES)
                            continue;
                        c.algo = &al;
                        const float t = time_loop(c.st, reps, run_lt, &c);
                        if (t < best_s) best_s = t, bs_k = (int)sk, bs_red = (int)rd,
                                                bs_tile = cfg(&al, CUBLASLT_ALGO_CONFIG_TILE_ID);
                    }
            }
            const float t_first = got > 0 ? (c.algo = &res[0].algo, time_loop(c.st, reps, run_lt, &c)) : 0;
            char split[64] = "none offered";
            if (best_s < 1e29f)
                snprintf(split, sizeof split, "%.1fu (tile %d, split %d, reduction %d)", best_s, bs_tile, bs_k, bs_red);
            printf("%-8s %4d %8.1fu %8.1fu %7.2f %6d  #%d tile=%d splitk=%d red=%d stages=%d; %.1fu; %s\n",
                   shapes[s].name, c.n, t_def, best, wbytes / (best * 1e-6) / 1e12, got, bi,
                   bi >= 0 ? cfg(&res[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID) : -1,
                   bi >= 0 ? cfg(&res[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) : -1,
                   bi >= 0 ? cfg(&res[bi].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) : -1,
                   bi >= 0 ? cfg(&res[bi].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) : -1, t_first, split);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(c.la);
            cublasLtMatrixLayoutDestroy(c.lb);
            cublasLtMatrixLayoutDestroy(c.lc);
            cublasLtMatmulDescDestroy(c.desc);
        }
        for (int i = 0; i < c.n_copies; i++) CK(cudaFree(c.w[i]));
        free(c.w);
    }
    return 0;
}
