/* The GEMM path's bf16 products through cuBLASLt, with the algorithm of each shape
 * chosen by timing.
 *
 * cublasGemmEx takes its heuristic's first algorithm, which for decode-sized products
 * is often not the fastest: measured on the H200 at 64 columns (bench_cuda_gemm.cu),
 * a 1.5B model's gate and up products (17,920 rows) 20.9 us with it and 18.0 us with
 * the best of the eight algorithms cuBLASLt offers, its output projection 8.8 vs 7.1
 * us, its output head 132 vs 124 us. So the first product of each shape (rows,
 * columns, chunk) runs every offered algorithm a few times (the L2 cache flushed
 * before each run, as a decode step finds it: every weight is read once) and keeps
 * the fastest by median. That happens on a direct pass (the first passes of a shape
 * are never recorded, cuda_graph.cu); a shape first met while recording takes the
 * heuristic's first. LUMEN_CUDA_GEMM_TUNE=0: always the heuristic's first, the same
 * algorithms in every process.
 *
 * The choice is made once per process and shape, shared by every backend on the GPU:
 * a column's result depends on its own column and the algorithm, so the GEMM path
 * stays batch-invariant within a chunk size, and two backends agree to the bit. Two
 * processes may choose differently where candidates time alike: their results then
 * differ in the last bits. */
#include <pthread.h>

#include <cublasLt.h>

#include "backend/cuda/cuda_internal.cuh"

namespace {

enum { CANDIDATES = 8, CACHE = 256, RUNS = 5 };
constexpr size_t FLUSH_BYTES = (size_t)128 << 20; /* over the H200's 60 MB of L2 */

struct gemm_shape {
    int device;
    int64_t rows, cols, chunk;
    bool usable; /* false: cuBLASLt offered nothing (cublasGemmEx instead) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
gemm_shape g_shapes[CACHE];
int g_n_shapes;

/* C = A^T B (+ C where accumulate) for this shape's descriptors: A bf16 [rows][cols],
 * B bf16 [chunk][cols], C f32 column-major rows x chunk. */
cublasStatus_t run_algo(lm_cuda_backend *cu, const gemm_shape *s, const cublasLtMatmulAlgo_t *algo, const void *A,
                        const void *B, float *C, bool accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return cublasLtMatmul(cu->cublaslt, s->desc, &one, A, s->la, B, s->lb, &beta, C, s->lc, C, s->lc, algo,
                          cu->cublas_ws, LM_CUDA_CUBLAS_WORKSPACE, cu->stream);
}

bool make_descriptors(gemm_shape *s) {
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    return cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&s->la, CUDA_R_16BF, (uint64_t)s->cols, (uint64_t)s->rows, s->cols) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&s->lb, CUDA_R_16BF, (uint64_t)s->cols, (uint64_t)s->chunk, s->cols) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&s->lc, CUDA_R_32F, (uint64_t)s->rows, (uint64_t)s->chunk, s->rows) ==
               CUBLAS_STATUS_SUCCESS;
}

/* The median of RUNS timed runs of one candidate, each after an L2 flush; a negative
 * value when it fails. */
float time_algo(lm_cuda_backend *cu, const gemm_shape *s, const cublasLtMatmulAlgo_t *algo, const void *A,
                const void *B, float *C, void *flush, cudaEvent_t ev[2]) {
    float ms[RUNS];
    for (int r = 0; r < RUNS; r++) {
        if (flush) cudaMemsetAsync(flush, r, FLUSH_BYTES, cu->stream);
        cudaEventRecord(ev[0], cu->stream);
        if (run_algo(cu, s, algo, A, B, C, false) != CUBLAS_STATUS_SUCCESS) return -1.0f;
        cudaEventRecord(ev[1], cu->stream);
        if (cudaEventSynchronize(ev[1]) != cudaSuccess || cudaEventElapsedTime(&ms[r], ev[0], ev[1]) != cudaSuccess)
            return -1.0f;
    }
    for (int i = 1; i < RUNS; i++) /* insertion sort: five values */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            const float x = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = x;
        }
    return ms[RUNS / 2];
}

/* The shape's algorithm: the heuristic's candidates timed on these very operands
 * (their outputs are overwritten by the real product after), or its first when the
 * stream is being recorded or tuning is off. */
void choose_algo(lm_cuda_backend *cu, gemm_shape *s, const void *A, const void *B, float *C) {
    cublasLtMatmulPreference_t pref;
    const uint64_t ws = LM_CUDA_CUBLAS_WORKSPACE;
    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    int got = 0;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return;
    if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
        CUBLAS_STATUS_SUCCESS)
        cublasLtMatmulAlgoGetHeuristic(cu->cublaslt, s->desc, s->la, s->lb, s->lc, s->lc, pref, CANDIDATES, res, &got);
    cublasLtMatmulPreferenceDestroy(pref);
    int first = -1;
    for (int i = 0; i < got && first < 0; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) first = i;
    if (first < 0) return;
    s->algo = res[first].algo;
    s->usable = true;
    const char *tune = getenv("LUMEN_CUDA_GEMM_TUNE");
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if ((tune && strcmp(tune, "0") == 0) || cudaStreamIsCapturing(cu->stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone || got - first < 2)
        return;
    cudaEvent_t ev[2];
    if (cudaEventCreate(&ev[0]) != cudaSuccess) return;
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return;
    }
    void *flush = NULL;
    if (cudaMalloc(&flush, FLUSH_BYTES) != cudaSuccess) flush = NULL; /* timed without flushing */
    cudaGetLastError();
    float best = -1.0f;
    for (int i = first; i < got; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float t = time_algo(cu, s, &res[i].algo, A, B, C, flush, ev);
        if (t >= 0.0f && (best < 0.0f || t < best)) best = t, s->algo = res[i].algo;
    }
    cudaStreamSynchronize(cu->stream);
    if (flush) cudaFree(flush);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    cudaGetLastError(); /* a failed candidate's error is not the caller's */
}

} // namespace

bool lm_cuda_gemm_lt(lm_cuda_backend *cu, const void *A, int64_t rows, int64_t cols, const void *B, int64_t chunk,
                     float *C, bool accumulate) {
    if (!cu->cublaslt) return false;
    pthread_mutex_lock(&g_lock);
    gemm_shape *s = NULL;
    for (int i = 0; i < g_n_shapes && !s; i++) {
        gemm_shape *e = &g_shapes[i];
        if (e->device == cu->device && e->rows == rows && e->cols == cols && e->chunk == chunk) s = e;
    }
    if (!s && g_n_shapes < CACHE) {
        s = &g_shapes[g_n_shapes];
        memset(s, 0, sizeof *s);
        s->device = cu->device, s->rows = rows, s->cols = cols, s->chunk = chunk;
        if (make_descriptors(s)) choose_algo(cu, s, A, B, C);
        g_n_shapes++; /* kept even when unusable: the same answer every time */
    }
    pthread_mutex_unlock(&g_lock);
    if (!s || !s->usable) return false; /* the cache is full or cuBLASLt cannot: cublasGemmEx */
    const cublasStatus_t st = run_algo(cu, s, &s->algo, A, B, C, accumulate);
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    lm_cuda_fail(cu, st == CUBLAS_STATUS_ALLOC_FAILED ? LM_ERR_NO_MEMORY : LM_ERR_INTERNAL,
                 "cuBLASLt error in a %lld x %lld x %lld product: %s", (long long)rows, (long long)chunk,
                 (long long)cols, cublasGetStatusString(st));
    return true;
}
