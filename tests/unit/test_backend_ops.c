/* Every op of the CUDA backend against the CPU reference on random inputs, by
 * normalized error ||gpu - ref|| / ||ref|| with a stated tolerance per op:
 *  - matmul per weight format for n = 1, 3, 16, 32, 40, 64, 100, 128, 130, 200, 256, 300
 *    (the matrix-vector, the tensor-core and the GEMM paths) against the exact product
 *    of the decoded weights (double), with the CPU backend's own error printed beside
 *    it; batch invariance within each path (bit-equal rows), and the difference between
 *    the paths measured; matmul_many bit-equal to separate products on every path;
 *  - get_rows (bit-exact decoding), rms_norm, add, add_bias, scale, rope (both
 *    pairings, partial rotation, scaled positions), swiglu, geglu;
 *  - kv_store (bit-equal cache contents) and attention over a paged cache with several
 *    sequences, GQA, sliding window, long contexts (split-K), F16 and F32 caches, NaN
 *    in every cache slot no token is stored to (kv_poison);
 *  - end to end: tiny random models of all three architectures, CUDA logits against
 *    the CPU's on the exactly decoded weights, and GPU batch invariance.
 * Exits 77 (skipped) when the build has no CUDA backend or no GPU is present.
 * LUMEN_TEST_OPS_QUICK=1 leaves out the largest cases (for runs under compute-sanitizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"
#include "model/forward.h"
#include "tensor/quant.h"
#include "test.h"
#include "tiny_model.h"

static lm_backend *g_cpu, *g_gpu, *g_gpu_direct; /* direct: no graphs, no fused ops */
/* the same pair without the tensor-core products, so batches of 5 or more take
 * cuBLAS GEMMs (inside recorded graphs too) */
static lm_backend *g_gpu_gemm, *g_gpu_gemm_direct;
/* that pair in the precise mode (LUMEN_CUDA_PRECISE=1): the fused side sums a
 * product's halves in the ops after it and hands their inputs' lo parts off */
static lm_backend *g_gpu_precise_gemm, *g_gpu_precise_direct;
static lm_backend *g_gpu_nocopy; /* LUMEN_CUDA_BF16_COPY=0 */
static lm_backend *g_gpu_tc;     /* LUMEN_CUDA_TC_MAX_N=32 */
static lm_backend *g_gpu_precise; /* LUMEN_CUDA_PRECISE=1 */
static uint64_t g_rng = 0x5eed;
static int64_t g_mv_max_n = 2;    /* the CUDA backend's defaults: LUMEN_CUDA_MV_MAX_N, */
static int64_t g_mv_max_n_q = 8;  /* (quantized weights; the variable sets both)       */
static int64_t g_tc_max_n = 0;    /* LUMEN_CUDA_TC_MAX_N,                              */
static int64_t g_tc_max_n_q = 0;  /* (quantized weights: none; the variable sets both)  */
static int64_t g_mv_max_n_c = 3;  /* quantized weights with a bf16 copy (made unless     */
static bool g_copies = true;      /* LUMEN_CUDA_BF16_COPY=0: the test's weights are small) */
static int64_t g_attn_dec_min;    /* the decode attention from this many tokens (main)  */
static int64_t g_gemm_chunk = 64; /* LUMEN_CUDA_GEMM_CHUNK                             */

/* The GEMM path's chunk sizes are separate paths (another GEMM shape, so another
 * summation order): gemm64, gemm128, ... */
enum { PATH_MV, PATH_TC, PATH_GEMM, PATH_COUNT = PATH_GEMM + 8 };

static const char *path_name(int path) {
    static char names[PATH_COUNT][16];
    if (path == PATH_MV) return "mv";
    if (path == PATH_TC) return "tc";
    int64_t chunk = g_gemm_chunk << (path - PATH_GEMM);
    snprintf(names[path], sizeof names[path], "gemm%lld", (long long)chunk);
    return names[path];
}

static bool type_is_native(lm_dtype t);

/* the backend's choice of kernel for n tokens (cuda_matmul.cu, path_of and
 * gemm_chunk_of) */
static int matmul_path(lm_dtype type, int64_t cols, int64_t n) {
    /* formats without a device decoder are stored as f16: f16's thresholds */
    const bool wide =
        type == LM_DTYPE_F32 || type == LM_DTYPE_F16 || type == LM_DTYPE_BF16 || !type_is_native(type);
    const bool copy = !wide && g_copies;
    if (n <= (wide ? g_mv_max_n : copy ? g_mv_max_n_c : g_mv_max_n_q)) return PATH_MV;
    if (n <= (wide || copy ? g_tc_max_n : g_tc_max_n_q) && type != LM_DTYPE_F32 && cols % 32 == 0) return PATH_TC;
    int path = PATH_GEMM;
    for (int64_t c = g_gemm_chunk; c < n && c < 512; c *= 2) path++;
    return path;
}
static char g_dir[256];

/* The matrix-vector path's products of Q4_K and Q6_K weights over at most 4,096
 * columns run the CPU's 8-bit arithmetic (cuda_matmul_q8.cu) unless LUMEN_CUDA_MVQ=0:
 * then they equal the CPU's to the bit. */
static bool mv_is_q8(lm_dtype type, int64_t cols) {
    const char *e = getenv("LUMEN_CUDA_MVQ");
    return (type == LM_DTYPE_Q4_K || type == LM_DTYPE_Q6_K) && cols % 256 == 0 && cols <= 4096 &&
           !(e && strcmp(e, "0") == 0);
}

static float frand(void) { return (float)(tiny_rng(&g_rng) >> 40) / (float)(1u << 24) * 2.0f - 1.0f; }

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * frand();
}

static float *fmalloc(int64_t n) { return malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)); }

/* LUMEN_TEST_OPS_ON_CPU=1 runs the harness with a second CPU backend in the GPU's
 * place (checks the test itself on a machine without a GPU; the CPU's 8-bit
 * activations then fail the matmul tolerances, as expected). */
static lm_status create_gpu(lm_backend **out) {
    if (getenv("LUMEN_TEST_OPS_ON_CPU")) return lm_backend_cpu_create(2, out);
    return lm_backend_cuda_create(0, out);
}

/* ---- device helpers ------------------------------------------------------------ */

static void *gpu_upload(const void *h, size_t bytes) {
    void *d = g_gpu->ops->alloc(g_gpu, bytes);
    CHECK(d != NULL);
    if (d) g_gpu->ops->upload(g_gpu, d, h, bytes);
    return d;
}

static void gpu_download(void *h, const void *d, size_t bytes) { g_gpu->ops->download(g_gpu, h, d, bytes); }

static void gpu_free(void *d) {
    if (d) g_gpu->ops->free(g_gpu, d);
}

/* ---- comparisons --------------------------------------------------------------- */

/* ||a - ref|| / ||ref||; infinite when a holds a NaN or infinity */
static double nerr(const float *a, const float *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double nerr_d(const float *a, const double *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int g_n_checks, g_n_bad;

static void report(const char *op, const char *what, double err, double tol) {
    bool ok = err <= tol;
    g_n_checks++;
    if (!ok) g_n_bad++;
    printf("  %-10s %-40s nerr %9.2e  (tol %.0e) %s\n", op, what, err, tol, ok ? "ok" : "FAIL");
    CHECK(err <= tol);
}

static bool bit_equal(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* ---- weights ------------------------------------------------------------------- */

typedef struct test_weight {
    lm_tensor t, scales, biases; /* scales/biases: affine only */
    void *data, *sdata, *bdata;
    float *deq; /* [rows][cols]: the values the kernels must use */
} test_weight;

/* A random rows x cols matrix stored as `type` (LM_DTYPE_AFFINE: 4-bit, groups of 64,
 * F16 scales and biases). */
static void make_weight(test_weight *w, lm_dtype type, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    float *src = fmalloc(rows * cols);
    fill(src, rows * cols, 1.0f);
    w->deq = fmalloc(rows * cols);
    w->t.name = "test.weight";
    w->t.type = type;
    w->t.n_dims = 2;
    w->t.ne[0] = cols, w->t.ne[1] = rows, w->t.ne[2] = 1, w->t.ne[3] = 1;
    if (type == LM_DTYPE_AFFINE) {
        int bits = 4, group = 64;
        int64_t ng = cols / group;
        size_t rb = lm_affine_row_bytes(bits, cols);
        w->data = malloc(rb * (size_t)rows);
        w->sdata = malloc((size_t)(rows * ng) * 2);
        w->bdata = malloc((size_t)(rows * ng) * 2);
        for (int64_t r = 0; r < rows; r++) {
            uint32_t *packed = (uint32_t *)((uint8_t *)w->data + (size_t)r * rb);
            uint8_t *sc = (uint8_t *)w->sdata + (size_t)(r * ng) * 2, *bi = (uint8_t *)w->bdata + (size_t)(r * ng) * 2;
            CHECK(lm_affine_quantize_row(bits, group, src + r * cols, packed, sc, bi, LM_DTYPE_F16, cols));
            CHECK(lm_affine_dequantize_row(bits, group, packed, sc, bi, LM_DTYPE_F16, w->deq + r * cols, cols));
        }
        w->scales.name = "test.scales", w->scales.type = LM_DTYPE_F16, w->scales.n_dims = 2;
        w->scales.ne[0] = ng, w->scales.ne[1] = rows, w->scales.ne[2] = w->scales.ne[3] = 1;
        w->scales.data = w->sdata, w->scales.nbytes = (size_t)(rows * ng) * 2;
        w->biases = w->scales;
        w->biases.name = "test.biases", w->biases.data = w->bdata;
        w->t.scales = &w->scales, w->t.biases = &w->biases, w->t.group_size = group, w->t.bits = bits;
        w->t.data = w->data, w->t.nbytes = rb * (size_t)rows;
    } else {
        size_t rb = lm_dtype_row_bytes(type, cols);
        w->data = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            CHECK(lm_quantize_row(type, src + r * cols, (uint8_t *)w->data + (size_t)r * rb, cols));
            CHECK(lm_dequantize_row(type, (uint8_t *)w->data + (size_t)r * rb, w->deq + r * cols, cols));
        }
        w->t.data = w->data, w->t.nbytes = rb * (size_t)rows;
    }
    free(src);
}

static void free_weight(test_weight *w) { free(w->data), free(w->sdata), free(w->bdata), free(w->deq); }

static bool type_is_native(lm_dtype t) {
    switch (t) {
    case LM_DTYPE_F32: case LM_DTYPE_F16: case LM_DTYPE_BF16: case LM_DTYPE_Q4_0: case LM_DTYPE_Q4_1:
    case LM_DTYPE_Q5_0: case LM_DTYPE_Q5_1: case LM_DTYPE_Q8_0: case LM_DTYPE_Q2_K: case LM_DTYPE_Q3_K:
    case LM_DTYPE_Q4_K: case LM_DTYPE_Q5_K: case LM_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* y [n][rows] on the GPU for x [n][cols] (host) */
static float *gpu_matmul(lm_weight *gw, const float *x, int64_t n, int64_t rows, int64_t cols) {
    float *dx = gpu_upload(x, sizeof(float) * (size_t)(n * cols));
    float *dy = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * rows));
    float *y = fmalloc(n * rows);
    lm_status st = g_gpu->ops->matmul(g_gpu, gw, dx, n, dy);
    if (st) fprintf(stderr, "matmul: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    gpu_download(y, dy, sizeof(float) * (size_t)(n * rows));
    gpu_free(dx), gpu_free(dy);
    return y;
}

/* The exact products of the decoded weights deq [rows][cols] and x [n][cols], in
 * double: ref [n][rows]. */
static double *exact_matmul(const float *deq, const float *x, int64_t n, int64_t rows, int64_t cols) {
    double *ref = malloc(sizeof(double) * (size_t)(n * rows));
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0.0;
            for (int64_t k = 0; k < cols; k++) s += (double)deq[r * cols + k] * x[t * cols + k];
            ref[t * rows + r] = s;
        }
    return ref;
}

static void test_matmul_type(lm_dtype type, int64_t rows, int64_t cols, const int64_t *ns, int n_ns) {
    test_weight w;
    make_weight(&w, type, rows, cols);
    lm_weight *gw = NULL, *cw = NULL;
    lm_status st = g_gpu->ops->weight_create(g_gpu, &w.t, &gw);
    if (st) fprintf(stderr, "weight_create(%s): %s\n", lm_dtype_name(type), lm_last_error());
    CHECK(st == LM_OK);
    CHECK(g_cpu->ops->weight_create(g_cpu, &w.t, &cw) == LM_OK);
    if (!gw || !cw) return;
    int64_t n_max = 0;
    for (int i = 0; i < n_ns; i++) n_max = ns[i] > n_max ? ns[i] : n_max;
    float *x = fmalloc(n_max * cols);
    fill(x, n_max * cols, 1.0f);
    float *y1 = NULL, *y_path[PATH_COUNT] = {NULL}; /* the largest n of each path */
    int64_t n_path[PATH_COUNT] = {0};
    for (int i = 0; i < n_ns; i++) {
        int64_t n = ns[i];
        double *ref = exact_matmul(w.deq, x, n, rows, cols);
        float *yg = gpu_matmul(gw, x, n, rows, cols);
        float *yc = fmalloc(n * rows);
        CHECK(g_cpu->ops->matmul(g_cpu, cw, x, n, yc) == LM_OK);
        int path = matmul_path(type, cols, n);
        /* mv: exact f32 on the exactly decoded weights (formats without a device
         * decoder are stored as f16), or the CPU's 8-bit activations (Q4_K, Q6_K: its
         * bits, checked below); tc and GEMM: bf16 activations and weights, f32 sums
         * (F32 weights: f32 throughout) */
        const bool q8 = path == PATH_MV && mv_is_q8(type, cols);
        double tol = q8                     ? 1e-2
                     : path == PATH_MV      ? (type_is_native(type) ? 1e-5 : 2e-3)
                     : type == LM_DTYPE_F32 ? 1e-5
                                            : 1e-2;
        char what[96];
        snprintf(what, sizeof what, "%-6s %5lldx%-5lld n=%-4lld %-4s (cpu %.1e)", lm_dtype_name(type),
                 (long long)rows, (long long)cols, (long long)n, path_name(path), nerr_d(yc, ref, n * rows));
        report("matmul", what, nerr_d(yg, ref, n * rows), tol);
        if (q8 && !bit_equal(yg, yc, n * rows)) {
            fprintf(stderr, "%s %lldx%lld n=%lld: the 8-bit product differs from the CPU's\n", lm_dtype_name(type),
                    (long long)rows, (long long)cols, (long long)n);
            CHECK(false);
        } else if (q8) {
            printf("  %-10s %-40s == the CPU's product (bit-equal)\n", "matmul", what);
        }
        if (n == 1) y1 = yg, yg = NULL;
        else if (n > n_path[path]) free(y_path[path]), y_path[path] = yg, n_path[path] = n, yg = NULL;
        free(yg), free(yc), free(ref);
    }
    /* batch invariance: the first tokens of a smaller call within each path */
    for (int i = 0; i < n_ns; i++) {
        int64_t n = ns[i];
        int path = matmul_path(type, cols, n);
        if (n == 1 || n == n_path[path] || !y_path[path]) continue;
        float *yg = gpu_matmul(gw, x, n, rows, cols);
        if (!bit_equal(yg, y_path[path], n * rows)) {
            fprintf(stderr, "%s n=%lld: results differ from the same tokens in a batch of %lld (%s)\n",
                    lm_dtype_name(type), (long long)n, (long long)n_path[path], path_name(path));
            CHECK(false);
        }
        free(yg);
    }
    int p1 = matmul_path(type, cols, 1);
    if (y1 && y_path[p1]) CHECK(bit_equal(y1, y_path[p1], rows)); /* n=1 inside its path */
    int pg = PATH_GEMM; /* the first GEMM path the sizes reached */
    while (pg + 1 < PATH_COUNT && !y_path[pg]) pg++;
    if (y1 && y_path[pg]) {
        double d = nerr(y_path[pg], y1, rows);
        printf("  %-10s %-40s token 0 at n=1 (%s) vs in a GEMM batch: nerr %.2e\n", "invariance",
               lm_dtype_name(type), path_name(p1), d);
    }
    free(y1), free(x);
    for (int p = 0; p < PATH_COUNT; p++) free(y_path[p]);
    g_gpu->ops->weight_free(g_gpu, gw);
    g_cpu->ops->weight_free(g_cpu, cw);
    free_weight(&w);
}

/* matmul_many of n tokens into fresh outputs, downloaded: out[k] [n][rows[k]] */
static void gpu_matmul_many(lm_weight *const *gw, int n_w, const int64_t *rows, const float *x, int64_t n,
                            int64_t cols, float **out) {
    float *dx = gpu_upload(x, sizeof(float) * (size_t)(n * cols)), *dy[3];
    for (int k = 0; k < n_w; k++) dy[k] = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * rows[k]));
    lm_status st = g_gpu->ops->matmul_many(g_gpu, (const lm_weight *const *)gw, n_w, dx, n, dy);
    if (st) fprintf(stderr, "matmul_many: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    for (int k = 0; k < n_w; k++) {
        out[k] = fmalloc(n * rows[k]);
        gpu_download(out[k], dy[k], sizeof(float) * (size_t)(n * rows[k]));
        gpu_free(dy[k]);
    }
    gpu_free(dx);
}

/* matmul_many of Q4_K and Q6_K weights in one 8-bit launch (a Q4_K_M file's Q/K/V,
 * V in Q6_K): bit-equal to separate products and to the CPU's, for as many of 1-4
 * tokens as take the matrix-vector path; rows_a: the Q4_K rows before the Q6_K weight
 * (a multiple of 32: one launch; else two). */
static void test_matmul_many_mixed(int64_t rows_a) {
    const int64_t rows[3] = {rows_a, 32, 200}, cols = 512;
    static const lm_dtype types[3] = {LM_DTYPE_Q4_K, LM_DTYPE_Q4_K, LM_DTYPE_Q6_K};
    if (!g_gpu->ops->matmul_many) return;
    test_weight w[3];
    lm_weight *gw[3] = {NULL, NULL, NULL}, *cw[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        make_weight(&w[k], types[k], rows[k], cols);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
        CHECK(g_cpu->ops->weight_create(g_cpu, &w[k].t, &cw[k]) == LM_OK);
    }
    float *x = fmalloc(4 * cols);
    fill(x, 4 * cols, 1.0f);
    for (int64_t n = 1; n <= 4 && matmul_path(LM_DTYPE_Q4_K, cols, n) == PATH_MV && gw[0] && gw[1] && gw[2] &&
                        cw[0] && cw[1] && cw[2];
         n++) {
        float *many[3];
        gpu_matmul_many(gw, 3, rows, x, n, cols, many);
        bool same = true, cpu_same = true;
        for (int k = 0; k < 3; k++) {
            float *one = gpu_matmul(gw[k], x, n, rows[k], cols), *yc = fmalloc(n * rows[k]);
            CHECK(g_cpu->ops->matmul(g_cpu, cw[k], x, n, yc) == LM_OK);
            same = same && bit_equal(many[k], one, n * rows[k]);
            cpu_same = cpu_same && bit_equal(many[k], yc, n * rows[k]);
            free(many[k]), free(one), free(yc);
        }
        char what[64];
        snprintf(what, sizeof what, "Q4_K %lld+32, Q6_K 200 x%lld n=%lld (mv)", (long long)rows_a, (long long)cols,
                 (long long)n);
        printf("  %-10s %-40s %s\n", "many", what,
               same && cpu_same ? "== separate products == the CPU's (bit-equal)" : "DIFFER");
        CHECK(same);
        CHECK(cpu_same);
    }
    free(x);
    for (int k = 0; k < 3; k++) {
        if (gw[k]) g_gpu->ops->weight_free(g_gpu, gw[k]);
        if (cw[k]) g_cpu->ops->weight_free(g_cpu, cw[k]);
        free_weight(&w[k]);
    }
}

/* matmul_many (one launch over the weights' concatenated rows on the matrix-vector and
 * tensor-core paths) against separate matmul calls: bit-equal on every path. Row
 * counts that are not multiples of 16 put each weight's rows elsewhere in the tiles.
 * packed: the weights side by side first (weight_pack), so the GEMM path runs one
 * product over all their rows: within a GEMM's rounding of the separate products
 * (another summation order is allowed), and batch-invariant: the first n - 1 tokens of
 * n give the bits they give alone (the same chunk). One token (the n - 1 of n = 2) on
 * the matrix-vector path leaves Q/K/V side by side for a qkv_finish (mv_packed_qkv):
 * the download splits them. v_type: the third weight's format (a Q4_K_M file's V is
 * Q6_K in half the layers): such a set is not packed, but its bf16 copies are, and the
 * GEMM path runs them as one product as well. */
static void test_matmul_many(lm_dtype type, lm_dtype v_type, bool packed) {
    static const int64_t rows[3] = {40, 24, 200}, ns[] = {2, 3, 24, 100, 300};
    const int64_t cols = 512, n_max = 300;
    if (!g_gpu->ops->matmul_many || (packed && !g_gpu->ops->weight_pack)) return;
    test_weight w[3];
    lm_weight *gw[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        make_weight(&w[k], k == 2 ? v_type : type, rows[k], cols);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
    }
    if (packed && gw[0] && gw[1] && gw[2]) g_gpu->ops->weight_pack(g_gpu, gw, 3);
    float *x = fmalloc(n_max * cols);
    fill(x, n_max * cols, 1.0f);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0] && gw[0] && gw[1] && gw[2]; i++) {
        const int64_t n = ns[i];
        const int path = matmul_path(type, cols, n);
        const bool one_gemm = packed && path >= PATH_GEMM && (v_type == type || g_copies);
        float *many[3], *fewer[3];
        gpu_matmul_many(gw, 3, rows, x, n, cols, many);
        gpu_matmul_many(gw, 3, rows, x, n - 1, cols, fewer);
        bool same = true, invariant = true;
        double err = 0.0;
        for (int k = 0; k < 3; k++) {
            float *one = gpu_matmul(gw[k], x, n, rows[k], cols);
            same = same && bit_equal(many[k], one, n * rows[k]);
            invariant = invariant && bit_equal(many[k], fewer[k], (n - 1) * rows[k]);
            double e = nerr(many[k], one, n * rows[k]);
            err = e > err ? e : err;
            free(many[k]), free(fewer[k]), free(one);
        }
        char what[64];
        snprintf(what, sizeof what, "%s%s%s%s 40+24+200x%lld n=%lld (%s)", packed ? "packed " : "",
                 lm_dtype_name(type), v_type == type ? "" : "+", v_type == type ? "" : lm_dtype_name(v_type),
                 (long long)cols, (long long)n, path_name(path));
        if (one_gemm) {
            report("many", what, err, 1e-5);
            if (matmul_path(type, cols, n - 1) == path) { /* n - 1 tokens in the same chunk */
                printf("  %-10s %-40s %s\n", "many", what,
                       invariant ? "n - 1 tokens == their bits in n (one GEMM)" : "DIFFER from n - 1 tokens");
                CHECK(invariant);
            }
        } else {
            printf("  %-10s %-40s %s\n", "many", what, same ? "== separate products (bit-equal)" : "DIFFER");
            CHECK(same);
            if (matmul_path(type, cols, n - 1) == path) CHECK(invariant); /* each token its own sums */
        }
    }
    free(x);
    for (int k = 0; k < 3; k++) {
        if (gw[k]) g_gpu->ops->weight_free(g_gpu, gw[k]);
        free_weight(&w[k]);
    }
}

/* matmul_swiglu (gate and up products, then swiglu; one launch on the matrix-vector
 * path) against matmul_many then swiglu: bit-equal on every path, for rows short
 * enough to pair in a block (1 and 2 warps a row) and long ones (the separate ops).
 * packed (weight_pack): on the GEMM path, swiglu read from one product's output.
 * rows: 72, 4,100 (one warp a row), or enough for the 8-bit kernel (mv_is_q8). */
static void test_matmul_swiglu(lm_dtype type, int64_t cols, bool packed, int64_t rows) {
    static const int64_t ns[] = {1, 3, 8, 24, 100, 600};
    const int64_t n_max = 600;
    if (!g_gpu->ops->matmul_swiglu || !g_gpu->ops->matmul_many || (packed && !g_gpu->ops->weight_pack)) return;
    test_weight w[2];
    lm_weight *gw[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        make_weight(&w[k], type, rows, cols);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
    }
    if (packed && gw[0] && gw[1]) g_gpu->ops->weight_pack(g_gpu, gw, 2);
    float *x = fmalloc(n_max * cols), *y1 = NULL;
    fill(x, n_max * cols, 1.0f);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0] && gw[0] && gw[1]; i++) {
        const int64_t n = ns[i];
        float *dx = gpu_upload(x, sizeof(float) * (size_t)(n * cols)), *dy[2], *dz[2];
        for (int k = 0; k < 2; k++) {
            dy[k] = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * rows));
            dz[k] = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * rows));
        }
        lm_status st = g_gpu->ops->matmul_swiglu(g_gpu, gw[0], gw[1], dx, n, dy[0], dy[1]);
        if (st) fprintf(stderr, "matmul_swiglu: %s\n", lm_last_error());
        CHECK(st == LM_OK);
        CHECK(g_gpu->ops->matmul_many(g_gpu, (const lm_weight *const *)gw, 2, dx, n, dz) == LM_OK);
        g_gpu->ops->swiglu(g_gpu, dz[0], dz[1], n * rows, dz[0]);
        float *fused = fmalloc(n * rows), *sep = fmalloc(n * rows);
        gpu_download(fused, dy[0], sizeof(float) * (size_t)(n * rows));
        gpu_download(sep, dz[0], sizeof(float) * (size_t)(n * rows));
        const bool same = bit_equal(fused, sep, n * rows);
        char what[64];
        snprintf(what, sizeof what, "%s%s 2x%lldx%lld n=%lld (%s)", packed ? "packed " : "", lm_dtype_name(type),
                 (long long)rows, (long long)cols, (long long)n, path_name(matmul_path(type, cols, n)));
        printf("  %-10s %-40s %s\n", "swiglu", what, same ? "== products, then swiglu (bit-equal)" : "DIFFER");
        CHECK(same);
        /* a token's result the same alone and among 3 where both take one path */
        if (n == 1) {
            free(y1);
            y1 = fused, fused = NULL;
        } else if (n == 3 && y1 && matmul_path(type, cols, 1) == matmul_path(type, cols, 3) &&
                   !bit_equal(fused, y1, rows)) {
            fprintf(stderr, "swiglu %s: token 0 differs from its product alone\n", what);
            CHECK(false);
        }
        free(fused), free(sep), gpu_free(dx);
        for (int k = 0; k < 2; k++) gpu_free(dy[k]), gpu_free(dz[k]);
    }
    free(x), free(y1);
    for (int k = 0; k < 2; k++) {
        if (gw[k]) g_gpu->ops->weight_free(g_gpu, gw[k]);
        free_weight(&w[k]);
    }
}

/* The down product over the 8-bit hand-off (cuda_matmul_q8h.cu): gate/up (Q4_K, d
 * columns) by matmul_swiglu into h, then the down product (`type`, ff columns) on h
 * right after, for 1-8 tokens while both take the matrix-vector path (1-4 where the
 * weights have bf16 copies: matmul_path). Within
 * the 8-bit tolerance of the product of the h downloaded; not the bits of the same
 * product over a copy of h (the f32 kernel: so the hand-off was taken; ff is large
 * enough that every block of the gate/up kernel holds whole groups of 32 values on
 * GPUs of up to 140 SMs); a token's result the same alone and among 2-8. */
static void test_q8_handoff(lm_dtype type, int64_t d, int64_t ff, int64_t rows) {
    if (!g_gpu->ops->matmul_swiglu) return;
    test_weight w[3];
    lm_weight *gw[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        make_weight(&w[k], k < 2 ? LM_DTYPE_Q4_K : type, k < 2 ? ff : rows, k < 2 ? d : ff);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
    }
    const int64_t n_max = 8;
    float *x = fmalloc(n_max * d), *y1 = NULL;
    fill(x, n_max * d, 1.0f);
    for (int64_t n = 1; n <= n_max && gw[0] && gw[1] && gw[2]; n++) {
        if (matmul_path(LM_DTYPE_Q4_K, d, n) != PATH_MV || matmul_path(type, ff, n) != PATH_MV) break;
        float *dx = gpu_upload(x, sizeof(float) * (size_t)(n * d));
        float *dg = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * ff));
        float *du = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * ff));
        float *dy = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * rows));
        CHECK(g_gpu->ops->matmul_swiglu(g_gpu, gw[0], gw[1], dx, n, dg, du) == LM_OK);
        CHECK(g_gpu->ops->matmul(g_gpu, gw[2], dg, n, dy) == LM_OK);
        float *h = fmalloc(n * ff), *y = fmalloc(n * rows);
        gpu_download(h, dg, sizeof(float) * (size_t)(n * ff));
        gpu_download(y, dy, sizeof(float) * (size_t)(n * rows));
        float *y32 = gpu_matmul(gw[2], h, n, rows, ff); /* h copied: no hand-off */
        double *ref = malloc(sizeof(double) * (size_t)(n * rows));
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                double acc = 0.0;
                for (int64_t k = 0; k < ff; k++) acc += (double)w[2].deq[r * ff + k] * h[t * ff + k];
                ref[t * rows + r] = acc;
            }
        char what[64];
        snprintf(what, sizeof what, "%s %lldx%lld n=%lld over 8-bit h", lm_dtype_name(type), (long long)rows,
                 (long long)ff, (long long)n);
        report("handoff", what, nerr_d(y, ref, n * rows), 1e-2);
        if (bit_equal(y, y32, n * rows)) {
            fprintf(stderr, "%s: the same bits as the f32 product: the hand-off was not taken\n", what);
            CHECK(false);
        }
        if (n == 1) {
            y1 = fmalloc(rows);
            memcpy(y1, y, sizeof(float) * (size_t)rows);
        } else if (!bit_equal(y, y1, rows)) {
            fprintf(stderr, "%s: token 0 differs from its product alone\n", what);
            CHECK(false);
        }
        free(h), free(y), free(y32), free(ref);
        gpu_free(dx), gpu_free(dg), gpu_free(du), gpu_free(dy);
    }
    free(x), free(y1);
    for (int k = 0; k < 3; k++) {
        if (gw[k]) g_gpu->ops->weight_free(g_gpu, gw[k]);
        free_weight(&w[k]);
    }
}

static void test_matmul(void) {
    static const lm_dtype types[] = {LM_DTYPE_F32,  LM_DTYPE_F16,  LM_DTYPE_BF16, LM_DTYPE_Q4_0, LM_DTYPE_Q4_1,
                                     LM_DTYPE_Q5_0, LM_DTYPE_Q5_1, LM_DTYPE_Q8_0, LM_DTYPE_Q2_K, LM_DTYPE_Q3_K,
                                     LM_DTYPE_Q4_K, LM_DTYPE_Q5_K, LM_DTYPE_Q6_K, LM_DTYPE_Q8_1, LM_DTYPE_Q8_K,
                                     LM_DTYPE_AFFINE};
    /* 1 (and 3 for quantized weights): the matrix-vector path; from 8 the GEMM path
     * in chunks of 64 (8-64), 128 (100, 128), 256 (130-256) and 512 (300), quantized
     * weights from their bf16 copies (the tensor cores: test_matmul_tensor_cores;
     * without copies: test_matmul_without_copies) */
    static const int64_t ns[] = {1, 3, 8, 16, 130, 40, 300, 32, 64, 100, 128, 200, 256};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        test_matmul_type(types[i], 200, 512, ns, (int)(sizeof ns / sizeof ns[0]));
    test_matmul_swiglu(LM_DTYPE_BF16, 512, false, 72); /* two warps a row */
    test_matmul_swiglu(LM_DTYPE_Q4_K, 4096, false, 72); /* two warps a row */
    test_matmul_swiglu(LM_DTYPE_Q8_0, 8960, false, 72); /* four: the separate ops */
    test_matmul_swiglu(LM_DTYPE_BF16, 512, true, 72);
    test_matmul_many(LM_DTYPE_BF16, LM_DTYPE_BF16, true);
    static const int64_t ns_mv[] = {1, 2, 3, 4, 8};
    test_matmul_type(LM_DTYPE_Q4_K, 4100, 1536, ns_mv, 5); /* the 8-bit kernel (mv_is_q8) */
    test_matmul_type(LM_DTYPE_Q6_K, 32768, 512, ns_mv, 5); /* a head: the interleaved copy (w->wide) */
    test_matmul_swiglu(LM_DTYPE_Q4_K, 1536, false, 4100); /* gate and up in one 8-bit launch */
    /* whole tile groups of the interleaved copies: one token's staged kernel
     * (mvq_gu_staged_kernel), 6 and 3 super-blocks a row */
    test_matmul_swiglu(LM_DTYPE_Q4_K, 1536, false, 4096);
    test_matmul_swiglu(LM_DTYPE_Q4_K, 768, false, 256);
    /* 16-bit rows of exactly 3, 4, 8 and 6 chunks a lane at one token (CPL in cuda_matmul.cu);
     * at 3 and 4 a warp runs two of a row's parts (mv_vparts) in blocks of 16 warps
     * (mv_wide_blocks; 199 rows: the last block part-filled), with the 2-token loop's bits */
    test_matmul_type(LM_DTYPE_BF16, 200, 1536, ns_mv, 4);
    test_matmul_type(LM_DTYPE_BF16, 199, 2048, ns_mv, 4);
    test_matmul_type(LM_DTYPE_BF16, 4000, 1536, ns_mv, 4); /* too many rows for the wide blocks: 4 warps */
    test_matmul_type(LM_DTYPE_BF16, 96, 8960, ns_mv, 2); /* 8.75 a lane: the loop */
    /* one token's quantized rows staged in shared memory (STAGE in cuda_matmul.cu): Q6_K
     * rows of 7,350 bytes start off 16-byte boundaries; 99 of them end off one (the
     * rows read in place) */
    test_matmul_type(LM_DTYPE_Q6_K, 96, 8960, ns_mv, 2);
    test_matmul_type(LM_DTYPE_Q6_K, 99, 8960, ns_mv, 1);
    test_matmul_type(LM_DTYPE_Q4_K, 100, 8960, ns_mv, 1);
    test_matmul_type(LM_DTYPE_F16, 4100, 2048, ns_mv, 2);
    test_matmul_type(LM_DTYPE_BF16, 9000, 1536, ns_mv, 2);
    test_matmul_swiglu(LM_DTYPE_BF16, 1536, false, 4100); /* a 1.5B model's gate/up: one warp a row */
    test_matmul_many_mixed(64); /* one launch */
    test_matmul_many_mixed(40); /* Q6_K's rows would share a warp with Q4_K's: two */
    test_q8_handoff(LM_DTYPE_Q4_K, 1536, 8960, 256); /* a 1.5B model's FFN: two gate/up rows a lane */
    test_q8_handoff(LM_DTYPE_Q6_K, 1536, 8960, 256); /* rows staged from every 2-byte misalignment */
    test_q8_handoff(LM_DTYPE_Q4_K, 512, 17920, 99);  /* a row a lane, two rounds of chunks, a part-filled block */
    if (getenv("LUMEN_TEST_OPS_QUICK")) return; /* under compute-sanitizer */
    test_matmul_swiglu(LM_DTYPE_Q4_K, 4096, true, 72); /* decoded whole */
    test_matmul_many(LM_DTYPE_Q4_K, LM_DTYPE_Q4_K, true);
    test_matmul_many(LM_DTYPE_Q4_K, LM_DTYPE_Q6_K, true); /* copies packed, the weights not */
    /* long rows (several warps per row), and more rows than one GEMM tile */
    static const int64_t ns2[] = {1, 24, 100, 300};
    test_matmul_type(LM_DTYPE_Q4_K, 96, 8960, ns2, 4);
    test_matmul_type(LM_DTYPE_Q6_K, 16500, 512, ns2, 4);
    test_matmul_type(LM_DTYPE_BF16, 16500, 256, ns2, 4);
    test_matmul_many(LM_DTYPE_BF16, LM_DTYPE_BF16, false);
    test_matmul_many(LM_DTYPE_Q4_K, LM_DTYPE_Q4_K, false);
}

/* Quantized weights without bf16 copies (a model under a memory limit, or past the
 * copies' budget), on a backend that makes none: the matrix-vector path up to 8 tokens
 * (the 8-bit kernel and its hand-off), the GEMMs' tiles beyond, and a set of mixed
 * formats, not packed: as separate products on the GEMM path, in one 8-bit launch on
 * the matrix-vector path. */
static void test_matmul_without_copies(void) {
    lm_backend *with = g_gpu;
    const bool copies = g_copies;
    g_gpu = g_gpu_nocopy, g_copies = false;
    printf("  without bf16 copies:\n");
    static const int64_t ns[] = {1, 5, 8, 16, 40};
    test_matmul_type(LM_DTYPE_Q4_K, 4100, 1536, ns, 5);
    test_matmul_type(LM_DTYPE_Q6_K, 200, 512, ns, 5);
    test_matmul_type(LM_DTYPE_Q8_0, 200, 512, ns, 5);
    test_q8_handoff(LM_DTYPE_Q4_K, 1536, 8960, 256);
    test_matmul_many(LM_DTYPE_Q4_K, LM_DTYPE_Q6_K, true);
    test_matmul_many_mixed(64); /* to 4 tokens on the 8-bit kernel */
    g_gpu = with, g_copies = copies;
}

/* The largest nerr over a few tokens between y [n][rows] (tokens in one product) and
 * each token's product alone, on g_gpu. */
static double alone_vs_batch(lm_weight *gw, const float *x, const float *y, int64_t n, int64_t rows, int64_t cols) {
    static const int64_t ts[] = {0, 13, 63};
    double worst = 0.0;
    for (int i = 0; i < 3; i++) {
        const int64_t t = ts[i] < n ? ts[i] : n - 1;
        float *y1 = gpu_matmul(gw, x + t * cols, 1, rows, cols);
        const double d = nerr(y + t * rows, y1, rows);
        worst = d > worst ? d : worst;
        free(y1);
    }
    return worst;
}

/* The precise mode (LUMEN_CUDA_PRECISE=1, cuda_matmul.cu's gemm_split): tokens of a
 * 64-token GEMM against the same tokens alone (the matrix-vector kernel), for single
 * weights (gemm_run) and a packed Q/K/V set (packed_run). Its GEMMs take activations
 * to ~16 bits and its one-token kernel the GEMMs' bf16 weight values, so the two
 * differ by the lo part's rounding (2^-17 of x) and the sums' order, a few 1e-6,
 * where the default paths differ by bf16's rounding of the activations, ~1e-3
 * (printed beside); and the batch's products against the exact ones. */
static void test_matmul_precise(void) {
    lm_backend *main_gpu = g_gpu;
    enum { N = 64, ROWS = 512, COLS = 1536 };
    static const lm_dtype types[] = {LM_DTYPE_BF16, LM_DTYPE_F16, LM_DTYPE_Q4_1, LM_DTYPE_Q4_K, LM_DTYPE_Q6_K};
    printf("  precise mode (LUMEN_CUDA_PRECISE=1), a token in a GEMM of %d vs alone:\n", N);
    float *x = fmalloc((int64_t)N * COLS);
    fill(x, (int64_t)N * COLS, 1.0f);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        test_weight w;
        make_weight(&w, types[i], ROWS, COLS);
        double gap[2] = {0.0, 0.0}, exact_err = 0.0;
        for (int mode = 0; mode < 2; mode++) {
            g_gpu = mode ? g_gpu_precise : main_gpu;
            lm_weight *gw = NULL;
            CHECK(g_gpu->ops->weight_create(g_gpu, &w.t, &gw) == LM_OK);
            if (!gw) continue;
            float *y = gpu_matmul(gw, x, N, ROWS, COLS);
            gap[mode] = alone_vs_batch(gw, x, y, N, ROWS, COLS);
            if (mode) {
                double *ref = exact_matmul(w.deq, x, N, ROWS, COLS);
                exact_err = nerr_d(y, ref, (int64_t)N * ROWS);
                free(ref);
            }
            free(y);
            g_gpu->ops->weight_free(g_gpu, gw);
        }
        char what[96];
        snprintf(what, sizeof what, "%-6s %dx%d alone vs in 64 (default %.1e)", lm_dtype_name(types[i]), ROWS,
                 COLS, gap[0]);
        report("precise", what, gap[1], 2e-5);
        snprintf(what, sizeof what, "%-6s %dx%d 64 tokens vs exact", lm_dtype_name(types[i]), ROWS, COLS);
        report("precise", what, exact_err, 5e-3);
        free_weight(&w);
    }
    /* Q/K/V packed into one GEMM */
    g_gpu = g_gpu_precise;
    test_weight w[3];
    lm_weight *gw[3] = {NULL, NULL, NULL};
    const int64_t rows[3] = {ROWS, 128, 128};
    for (int k = 0; k < 3; k++) {
        make_weight(&w[k], LM_DTYPE_Q4_1, rows[k], COLS);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
    }
    if (gw[0] && gw[1] && gw[2] && g_gpu->ops->weight_pack && g_gpu->ops->matmul_many) {
        g_gpu->ops->weight_pack(g_gpu, gw, 3);
        float *yb[3], *y1[3];
        gpu_matmul_many(gw, 3, rows, x, N, COLS, yb);
        double worst = 0.0;
        for (int64_t t = 0; t < N; t += 21) {
            gpu_matmul_many(gw, 3, rows, x + t * COLS, 1, COLS, y1);
            for (int k = 0; k < 3; k++) {
                const double d = nerr(yb[k] + t * rows[k], y1[k], rows[k]);
                worst = d > worst ? d : worst;
                free(y1[k]);
            }
        }
        for (int k = 0; k < 3; k++) free(yb[k]);
        report("precise", "Q4_1 Q/K/V packed, alone vs in 64", worst, 2e-5);
    }
    for (int k = 0; k < 3; k++) {
        if (gw[k]) g_gpu->ops->weight_free(g_gpu, gw[k]);
        free_weight(&w[k]);
    }
    free(x);
    g_gpu = main_gpu;
}

/* The tensor-core kernel (cuda_matmul_tc.cu), which no product takes by default (the
 * GEMMs measured faster), on a backend that gives it up to 32 tokens
 * (LUMEN_CUDA_TC_MAX_N=32, as the batch-invariant configurations do): every format
 * against the CPU, batch-invariant within it; quantized weights read from their
 * copies, packed sets and swiglu as one product. */
static void test_matmul_tensor_cores(void) {
    lm_backend *main_gpu = g_gpu;
    const int64_t tc = g_tc_max_n, tc_q = g_tc_max_n_q;
    g_gpu = g_gpu_tc, g_tc_max_n = g_tc_max_n_q = 32;
    printf("  tensor cores to 32 tokens:\n");
    static const lm_dtype types[] = {LM_DTYPE_F16, LM_DTYPE_BF16, LM_DTYPE_Q4_K, LM_DTYPE_Q6_K, LM_DTYPE_Q8_0};
    static const int64_t ns[] = {1, 5, 8, 16, 32, 40};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_matmul_type(types[i], 200, 512, ns, 6);
    test_matmul_many(LM_DTYPE_BF16, LM_DTYPE_BF16, true);
    test_matmul_many(LM_DTYPE_Q4_K, LM_DTYPE_Q6_K, true);
    test_matmul_swiglu(LM_DTYPE_BF16, 512, true, 72);
    g_gpu = main_gpu, g_tc_max_n = tc, g_tc_max_n_q = tc_q;
}

static void test_get_rows(void) {
    static const lm_dtype types[] = {LM_DTYPE_F32,  LM_DTYPE_F16,  LM_DTYPE_BF16, LM_DTYPE_Q4_0,
                                     LM_DTYPE_Q4_1, LM_DTYPE_Q5_0, LM_DTYPE_Q5_1, LM_DTYPE_Q8_0,
                                     LM_DTYPE_Q2_K, LM_DTYPE_Q3_K, LM_DTYPE_Q4_K, LM_DTYPE_Q5_K,
                                     LM_DTYPE_Q6_K, LM_DTYPE_Q8_K, LM_DTYPE_AFFINE};
    const int64_t rows = 300, cols = 768, n = 37;
    int32_t ids[37];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tiny_rng(&g_rng) % rows);
    ids[5] = ids[6]; /* repeats are fine */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        test_weight w;
        make_weight(&w, types[i], rows, cols);
        lm_weight *gw = NULL;
        CHECK(g_gpu->ops->weight_create(g_gpu, &w.t, &gw) == LM_OK);
        if (!gw) continue;
        float *d = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * cols));
        float *got = fmalloc(n * cols), *want = fmalloc(n * cols);
        g_gpu->ops->get_rows(g_gpu, gw, ids, n, d);
        gpu_download(got, d, sizeof(float) * (size_t)(n * cols));
        for (int64_t j = 0; j < n; j++) memcpy(want + j * cols, w.deq + ids[j] * cols, sizeof(float) * (size_t)cols);
        char what[64];
        snprintf(what, sizeof what, "%s%s", lm_dtype_name(types[i]),
                 type_is_native(types[i]) ? " (bit-exact)" : " (stored as f16)");
        report("get_rows", what, nerr(got, want, n * cols), type_is_native(types[i]) ? 0.0 : 1e-3);
        gpu_free(d), free(got), free(want);
        g_gpu->ops->weight_free(g_gpu, gw);
        free_weight(&w);
    }
}

/* ---- element-wise ops ---------------------------------------------------------- */

static void test_rms_norm(void) {
    struct { int64_t n, d; bool weight, alias; } cases[] = {{7, 1536, true, false}, {40 * 12, 128, true, true},
                                                            {3, 2048, false, false}, {1, 64, true, true},
                                                            {2, 4100, true, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, d = cases[c].d;
        float *x = fmalloc(n * d), *w = fmalloc(d), *ref = fmalloc(n * d), *got = fmalloc(n * d);
        fill(x, n * d, 3.0f);
        fill(w, d, 1.0f);
        g_cpu->ops->rms_norm(g_cpu, x, cases[c].weight ? w : NULL, n, d, 1e-6f, ref);
        float *dx = gpu_upload(x, sizeof(float) * (size_t)(n * d)), *dw = gpu_upload(w, sizeof(float) * (size_t)d);
        float *dy = cases[c].alias ? dx : g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * d));
        g_gpu->ops->rms_norm(g_gpu, dx, cases[c].weight ? dw : NULL, n, d, 1e-6f, dy);
        gpu_download(got, dy, sizeof(float) * (size_t)(n * d));
        char what[64];
        snprintf(what, sizeof what, "n=%lld d=%lld%s%s", (long long)n, (long long)d, cases[c].weight ? "" : " no w",
                 cases[c].alias ? " in place" : "");
        report("rms_norm", what, nerr(got, ref, n * d), 1e-6);
        if (!cases[c].alias) gpu_free(dy);
        gpu_free(dx), gpu_free(dw);
        free(x), free(w), free(ref), free(got);
    }
}

/* The fused residual add and norm: y and out bit-equal to the GPU's add then
 * rms_norm, and out within rms_norm's tolerance of the CPU (y bit-exact). */
static void test_add_rms_norm(void) {
    if (!g_gpu->ops->add_rms_norm) {
        printf("  %-10s %-40s\n", "add+norm", "no add_rms_norm op (LUMEN_CUDA_FUSED=0?): skipped");
        return;
    }
    struct { int64_t n, d; bool weight, alias; } cases[] = {{7, 1536, true, false}, {130, 896, true, false},
                                                            {3, 2051, false, false}, {1, 64, true, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, d = cases[c].d;
        size_t bytes = sizeof(float) * (size_t)(n * d);
        float *y = fmalloc(n * d), *x = fmalloc(n * d), *w = fmalloc(d), *ref = fmalloc(n * d);
        float *sep_y = fmalloc(n * d), *sep_out = fmalloc(n * d), *got_y = fmalloc(n * d), *got_out = fmalloc(n * d);
        fill(y, n * d, 3.0f);
        fill(x, n * d, 2.0f);
        fill(w, d, 1.0f);
        const float *wp = cases[c].weight ? w : NULL;
        float *dw = gpu_upload(w, sizeof(float) * (size_t)d), *dwp = cases[c].weight ? dw : NULL;
        float *dx = gpu_upload(x, bytes), *dy = gpu_upload(y, bytes), *dout = g_gpu->ops->alloc(g_gpu, bytes);
        /* the two ops on the GPU */
        g_gpu->ops->add(g_gpu, dy, dx, n * d);
        g_gpu->ops->rms_norm(g_gpu, dy, dwp, n, d, 1e-6f, dout);
        gpu_download(sep_y, dy, bytes);
        gpu_download(sep_out, dout, bytes);
        /* the fused op on the same inputs */
        g_gpu->ops->upload(g_gpu, dy, y, bytes);
        float *dres = cases[c].alias ? dy : dout;
        g_gpu->ops->add_rms_norm(g_gpu, dy, dx, dwp, n, d, 1e-6f, dres);
        gpu_download(got_out, dres, bytes);
        if (!cases[c].alias) gpu_download(got_y, dy, bytes);
        /* the CPU reference */
        g_cpu->ops->add(g_cpu, y, x, n * d);
        g_cpu->ops->rms_norm(g_cpu, y, wp, n, d, 1e-6f, ref);
        char what[64];
        snprintf(what, sizeof what, "n=%lld d=%lld%s%s", (long long)n, (long long)d, cases[c].weight ? "" : " no w",
                 cases[c].alias ? " in place" : "");
        bool same = bit_equal(got_out, sep_out, n * d) && (cases[c].alias || bit_equal(got_y, sep_y, n * d));
        printf("  %-10s %-40s %s\n", "add+norm", what, same ? "fused == add + rms_norm (bit-equal)" : "DIFFER");
        CHECK(same);
        if (!cases[c].alias) report("add+norm", "  y vs CPU add (bit-exact)", nerr(got_y, y, n * d), 0.0);
        report("add+norm", "  out vs CPU add + rms_norm", nerr(got_out, ref, n * d), 1e-6);
        gpu_free(dw), gpu_free(dx), gpu_free(dy), gpu_free(dout);
        free(y), free(x), free(w), free(ref), free(sep_y), free(sep_out), free(got_y), free(got_out);
    }
}

static void test_arith(void) {
    const int64_t n = 7, d = 1536;
    float *y = fmalloc(n * d), *x = fmalloc(n * d), *bias = fmalloc(d), *ref = fmalloc(n * d), *got = fmalloc(n * d);
    fill(y, n * d, 2.0f);
    fill(x, n * d, 2.0f);
    fill(bias, d, 1.0f);
    float *dy = gpu_upload(y, sizeof(float) * (size_t)(n * d)), *dx = gpu_upload(x, sizeof(float) * (size_t)(n * d));
    float *db = gpu_upload(bias, sizeof(float) * (size_t)d);
    memcpy(ref, y, sizeof(float) * (size_t)(n * d));
    g_cpu->ops->add(g_cpu, ref, x, n * d);
    g_cpu->ops->add_bias(g_cpu, ref, bias, n, d);
    g_cpu->ops->scale(g_cpu, ref, 0.37f, n * d);
    g_gpu->ops->add(g_gpu, dy, dx, n * d);
    g_gpu->ops->add_bias(g_gpu, dy, db, n, d);
    g_gpu->ops->scale(g_gpu, dy, 0.37f, n * d);
    gpu_download(got, dy, sizeof(float) * (size_t)(n * d));
    report("add+bias", "add, add_bias, scale (bit-exact)", nerr(got, ref, n * d), 0.0);
    gpu_free(dy), gpu_free(dx), gpu_free(db);
    free(y), free(x), free(bias), free(ref), free(got);
}

static void test_rope(void) {
    struct { int64_t n_head, hd, n_rot; float theta, fscale; lm_rope_mode mode; } cases[] = {
        {6, 64, 64, 10000.0f, 1.0f, LM_ROPE_NORM},   {6, 64, 64, 10000.0f, 1.0f, LM_ROPE_NEOX},
        {4, 128, 64, 1e6f, 0.25f, LM_ROPE_NEOX},     {2, 256, 256, 1e6f, 1.0f, LM_ROPE_NEOX},
        {3, 80, 32, 500000.0f, 1.0f, LM_ROPE_NORM}};
    const int64_t n = 9;
    int32_t pos[9];
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(tiny_rng(&g_rng) % 5000);
    pos[0] = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t len = n * cases[c].n_head * cases[c].hd;
        float *x = fmalloc(len), *got = fmalloc(len);
        fill(x, len, 1.0f);
        float *dx = gpu_upload(x, sizeof(float) * (size_t)len);
        g_cpu->ops->rope(g_cpu, x, n, cases[c].n_head, cases[c].hd, cases[c].n_rot, pos, cases[c].theta,
                         cases[c].fscale, cases[c].mode);
        g_gpu->ops->rope(g_gpu, dx, n, cases[c].n_head, cases[c].hd, cases[c].n_rot, pos, cases[c].theta,
                         cases[c].fscale, cases[c].mode);
        gpu_download(got, dx, sizeof(float) * (size_t)len);
        char what[64];
        snprintf(what, sizeof what, "%s hd=%lld rot=%lld theta=%g scale=%g", cases[c].mode == LM_ROPE_NEOX ? "neox" : "norm",
                 (long long)cases[c].hd, (long long)cases[c].n_rot, cases[c].theta, cases[c].fscale);
        report("rope", what, nerr(got, x, len), 1e-6);
        gpu_free(dx), free(x), free(got);
    }
}

static void test_activations(void) {
    const int64_t n = 20000;
    float *g = fmalloc(n), *u = fmalloc(n), *ref = fmalloc(n), *got = fmalloc(n);
    fill(g, n, 12.0f);
    fill(u, n, 2.0f);
    float *dg = gpu_upload(g, sizeof(float) * (size_t)n), *du = gpu_upload(u, sizeof(float) * (size_t)n);
    float *dout = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)n);
    g_cpu->ops->swiglu(g_cpu, g, u, n, ref);
    g_gpu->ops->swiglu(g_gpu, dg, du, n, dout);
    gpu_download(got, dout, sizeof(float) * (size_t)n);
    report("swiglu", "20000 values in [-12, 12]", nerr(got, ref, n), 1e-6);
    g_cpu->ops->geglu(g_cpu, g, u, n, ref);
    g_gpu->ops->geglu(g_gpu, dg, du, n, dg); /* in place, as the forward pass calls it */
    gpu_download(got, dg, sizeof(float) * (size_t)n);
    report("geglu", "20000 values, f16 activations, in place", nerr(got, ref, n), 1e-4);
    gpu_free(dg), gpu_free(du), gpu_free(dout);
    free(g), free(u), free(ref), free(got);
}

static void test_memory(void) {
    const int64_t n = 1000;
    float *h = fmalloc(n), *got = fmalloc(n), *want = fmalloc(n);
    fill(h, n, 1.0f);
    float *d = gpu_upload(h, sizeof(float) * (size_t)n);
    /* overlapping copy (memmove semantics), both directions */
    g_gpu->ops->copy(g_gpu, d + 10, d, sizeof(float) * 500);
    memcpy(want, h, sizeof(float) * (size_t)n);
    memmove(want + 10, want, sizeof(float) * 500);
    g_gpu->ops->copy(g_gpu, d, d + 3, sizeof(float) * 600);
    memmove(want, want + 3, sizeof(float) * 600);
    gpu_download(got, d, sizeof(float) * (size_t)n);
    report("copy", "upload, overlapping copies, download", nerr(got, want, n), 0.0);
    gpu_free(d);
    free(h), free(got), free(want);
}

/* ---- KV cache and attention ---------------------------------------------------- */

typedef struct attn_case {
    int64_t n_head, n_head_kv, hd, window;
    lm_dtype type;
} attn_case;

enum { N_SEQ = 3 };
static const int64_t k_seq_len[N_SEQ] = {5, 77, 1100};

/* The GPU's attention of `sub` (queries dq, its first tokens') gives the bits `want`
 * holds for those tokens. */
static bool attention_bits_equal(lm_kv_cache *kg, int64_t layer, const lm_attn_batch *sub, const float *dq,
                                 const attn_case *ac, float scale, const float *want) {
    const int64_t n = sub->n_tokens * ac->n_head * ac->hd;
    float *dout = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)n), *got = fmalloc(n);
    bool ok = g_gpu->ops->attention(g_gpu, kg, layer, sub, dq, ac->n_head, ac->n_head_kv, ac->hd, ac->window, scale,
                                    dout) == LM_OK;
    gpu_download(got, dout, sizeof(float) * (size_t)n);
    ok = ok && bit_equal(got, want, n);
    g_gpu->ops->free(g_gpu, dout);
    free(got);
    return ok;
}

static void run_attention_case(const attn_case *ac) {
    const int64_t n_layer = 2, layer = 1, bs = 16, d_kv = ac->n_head_kv * ac->hd, d_q = ac->n_head * ac->hd;
    int64_t total = 0, max_len = 0;
    for (int s = 0; s < N_SEQ; s++) total += k_seq_len[s], max_len = k_seq_len[s] > max_len ? k_seq_len[s] : max_len;
    lm_kv_cache *kc = NULL, *kg = NULL;
    int64_t n_blocks = (max_len / bs + 2) * N_SEQ;
    CHECK(lm_kv_cache_create(g_cpu, n_layer, d_kv, bs, n_blocks, N_SEQ, ac->type, &kc) == LM_OK);
    CHECK(lm_kv_cache_create(g_gpu, n_layer, d_kv, bs, n_blocks, N_SEQ, ac->type, &kg) == LM_OK);
    if (!kc || !kg) return;
    /* NaN in every slot no token is stored to, as recycled memory may hold: a kernel
     * that lets a row past a sequence's last position into its sums fails below */
    CHECK(kv_poison(kc) && kv_poison(kg));
    /* reserve in rounds so the sequences' blocks interleave in the pool */
    for (int64_t upto = bs; upto < max_len + bs; upto += bs)
        for (int s = 0; s < N_SEQ; s++) {
            int64_t want = upto < k_seq_len[s] ? upto : k_seq_len[s];
            CHECK(lm_kv_cache_reserve(kc, s, want) == LM_OK);
            CHECK(lm_kv_cache_reserve(kg, s, want) == LM_OK);
        }
    /* every position of every sequence, stored in one batch */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)total), *seq = malloc(sizeof(int32_t) * (size_t)total);
    int64_t t = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int64_t p = 0; p < k_seq_len[s]; p++) pos[t] = (int32_t)p, seq[t] = s, t++;
    float *k = fmalloc(total * d_kv), *v = fmalloc(total * d_kv);
    fill(k, total * d_kv, 1.0f);
    fill(v, total * d_kv, 1.0f);
    lm_attn_batch all = {total, pos, seq};
    float *dk = gpu_upload(k, sizeof(float) * (size_t)(total * d_kv));
    float *dv = gpu_upload(v, sizeof(float) * (size_t)(total * d_kv));
    g_cpu->ops->kv_store(g_cpu, kc, layer, &all, k, v);
    g_gpu->ops->kv_store(g_gpu, kg, layer, &all, dk, dv);
    size_t layer_bytes = (size_t)(n_blocks * bs * d_kv) * kc->elem_size;
    /* compare the slots written (the rest of the pool is uninitialized memory) */
    uint8_t *cache = malloc(layer_bytes);
    bool same = true;
    size_t row = (size_t)d_kv * kc->elem_size;
    for (int kvi = 0; kvi < 2; kvi++) {
        const uint8_t *want = (const uint8_t *)(kvi ? kc->v : kc->k) + layer_bytes;
        gpu_download(cache, (uint8_t *)(kvi ? kg->v : kg->k) + layer_bytes, layer_bytes);
        for (int64_t i = 0; i < total; i++) {
            size_t off = (size_t)lm_kv_cache_slot(kc, seq[i], pos[i]) * row;
            same = same && lm_kv_cache_slot(kc, seq[i], pos[i]) == lm_kv_cache_slot(kg, seq[i], pos[i]) &&
                   memcmp(cache + off, want + off, row) == 0;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s cache, %lld tokens of %d sequences (bit-exact)", lm_dtype_name(ac->type),
             (long long)total, N_SEQ);
    report("kv_store", what, same ? 0.0 : 1.0, 0.0);
    free(cache);

    /* batches: decode (the last position of each sequence), a prefill-like mix, and a
     * large decode-like batch (48 tokens of the three sequences in turn, no runs; the
     * first three are the decode batch's tokens) */
    int32_t bpos[64], bseq[64], lpos[48], lseq[48];
    int64_t nb[3] = {0, 0, 48};
    for (int i = 0; i < 48; i++)
        lseq[i] = i % N_SEQ, lpos[i] = (int32_t)(k_seq_len[i % N_SEQ] - 1 - (i / N_SEQ * 7) % k_seq_len[i % N_SEQ]);
    for (int s = 0; s < N_SEQ; s++) bpos[nb[0]] = (int32_t)(k_seq_len[s] - 1), bseq[nb[0]++] = s;
    int32_t *ppos = bpos + 8, *pseq = bseq + 8;
    for (int64_t p = k_seq_len[1] - 40; p < k_seq_len[1]; p++) ppos[nb[1]] = (int32_t)p, pseq[nb[1]++] = 1;
    for (int64_t p = 0; p < k_seq_len[0]; p++) ppos[nb[1]] = (int32_t)p, pseq[nb[1]++] = 0;
    for (int64_t p = k_seq_len[2] - 3; p < k_seq_len[2]; p++) ppos[nb[1]] = (int32_t)p, pseq[nb[1]++] = 2;
    const float scale = 1.0f / sqrtf((float)ac->hd);
    float *dec_q = NULL, *dec_out = NULL; /* the decode batch's queries and GPU results */
    for (int bi = 0; bi < 3; bi++) {
        int64_t n = nb[bi];
        lm_attn_batch b = {n, bi == 0 ? bpos : bi == 1 ? ppos : lpos, bi == 0 ? bseq : bi == 1 ? pseq : lseq};
        float *q = fmalloc(n * d_q), *ref = fmalloc(n * d_q), *got = fmalloc(n * d_q);
        fill(q, n * d_q, 2.0f);
        if (bi == 1) {
            /* the last tokens of seq 1 and seq 2 again, with their decode queries */
            memcpy(q + 39 * d_q, dec_q + 1 * d_q, sizeof(float) * (size_t)d_q);
            memcpy(q + (n - 1) * d_q, dec_q + 2 * d_q, sizeof(float) * (size_t)d_q);
        } else if (bi == 2) {
            /* its first three tokens are the decode batch's, with their queries */
            memcpy(q, dec_q, sizeof(float) * (size_t)(N_SEQ * d_q));
        }
        float *dq = gpu_upload(q, sizeof(float) * (size_t)(n * d_q));
        float *dout = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(n * d_q));
        CHECK(g_cpu->ops->attention(g_cpu, kc, layer, &b, q, ac->n_head, ac->n_head_kv, ac->hd, ac->window, scale,
                                    ref) == LM_OK);
        lm_status st = g_gpu->ops->attention(g_gpu, kg, layer, &b, dq, ac->n_head, ac->n_head_kv, ac->hd,
                                             ac->window, scale, dout);
        if (st) fprintf(stderr, "attention: %s\n", lm_last_error());
        CHECK(st == LM_OK);
        gpu_download(got, dout, sizeof(float) * (size_t)(n * d_q));
        snprintf(what, sizeof what, "%s %s hd=%lld heads %lld/%lld win=%lld n=%lld", lm_dtype_name(ac->type),
                 bi == 0 ? "decode " : bi == 1 ? "prefill" : "batch  ", (long long)ac->hd, (long long)ac->n_head,
                 (long long)ac->n_head_kv, (long long)ac->window, (long long)n);
        /* the F16 reference rounds the softmax weights to f16; we keep them f32 */
        report("attention", what, nerr(got, ref, n * d_q), ac->type == LM_DTYPE_F16 ? 2e-3 : 1e-5);
        /* batches of more than 4 (and mv_max_n) tokens in runs take the tensor-core
         * kernel for F16 caches and head sizes 64/128/256 (cuda_attention_tc.cu) */
        bool tc = bi == 1 && ac->type == LM_DTYPE_F16 && n > 4 && n > g_mv_max_n &&
                  (ac->hd == 64 || ac->hd == 128 || ac->hd == 256);
        if (bi == 0) {
            dec_q = q, dec_out = got, q = got = NULL;
        } else if (bi == 2) {
            /* a token's result does not depend on the batch around it: the first 40
             * tokens alone give the same bits, and where this batch does not take the
             * tensor-core decode kernel (F16, head size 64/128, a decode batch of
             * g_attn_dec_min tokens or more; its warps a block follow the batch's
             * size), the decode batch of 3 gives them too */
            bool dec = ac->type == LM_DTYPE_F16 && (ac->hd == 64 || ac->hd == 128) && n >= g_attn_dec_min &&
                       ac->n_head / ac->n_head_kv <= 16;
            if (!dec) CHECK(bit_equal(got, dec_out, N_SEQ * d_q));
            lm_attn_batch sub = {40, lpos, lseq};
            CHECK(attention_bits_equal(kg, layer, &sub, dq, ac, scale, got));
        } else if (!tc) {
            /* a token's result does not depend on the batch around it (split-K included) */
            CHECK(bit_equal(got + 39 * d_q, dec_out + 1 * d_q, d_q));
            CHECK(bit_equal(got + (n - 1) * d_q, dec_out + 2 * d_q, d_q));
        } else {
            /* nor on the tiles around it on the tensor-core path: sequence 1's 40
             * tokens alone, without the other sequences' tiles, give the same bits */
            lm_attn_batch one = {40, ppos, pseq};
            CHECK(attention_bits_equal(kg, layer, &one, dq, ac, scale, got));
        }
        free(q), free(ref), free(got), gpu_free(dq), gpu_free(dout);
    }
    free(dec_q), free(dec_out);
    gpu_free(dk), gpu_free(dv);
    free(k), free(v), free(pos), free(seq);
    lm_kv_cache_free(kc);
    lm_kv_cache_free(kg);
}

static void test_attention(void) {
    const attn_case cases[] = {
        {8, 2, 64, 0, LM_DTYPE_F32},    {8, 2, 64, 0, LM_DTYPE_F16},   {12, 2, 128, 0, LM_DTYPE_F16},
        {12, 2, 128, 0, LM_DTYPE_F32},  {4, 1, 256, 37, LM_DTYPE_F16}, {4, 1, 256, 700, LM_DTYPE_F32},
        {4, 4, 64, 0, LM_DTYPE_F16},    {6, 3, 16, 8, LM_DTYPE_F32},
        /* 48 tokens x 8 KV heads: more blocks than the decode kernel gives 8 warps
         * (twice the SMs: 264 on the H200), so its 4-warp form */
        {16, 8, 64, 0, LM_DTYPE_F16},
        /* 16 query heads a KV head: the decode kernel's 4-warp form with both rows of
         * its accumulators in use (heads 8-15 in the second) */
        {16, 1, 64, 0, LM_DTYPE_F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attention_case(&cases[i]);
}

/* A decode step's Q/K/V product (packed weights, the GEMM path), qkv_finish and
 * attention called back to back, where the backend may run qkv_finish inside the
 * attention's blocks: q, k, v, the cache and the attention's output bit-equal to the
 * same calls with a download after the product (which splits the product and runs
 * qkv_finish on its own). Contexts of 20 to 527 positions: one split and several;
 * RoPE over the whole head (NEOX) and over part of it (NORM); head sizes 128 and 64
 * (the CUDA decode attention's two instantiations). */
static void test_qkv_attention_fused(int hd, int n_rot, lm_rope_mode mode) {
    if (!g_gpu->ops->qkv_finish || !g_gpu->ops->matmul_many || !g_gpu->ops->weight_pack) {
        printf("  %-10s %-40s\n", "qkv+attn", "no fused ops (LUMEN_CUDA_FUSED=0?): skipped");
        return;
    }
    enum { N = 40, NH = 12, NKV = 2, D = 256, BS = 16 };
    const int64_t HD = hd;
    const int64_t rows[3] = {NH * HD, NKV * HD, NKV * HD}, d_kv = NKV * HD, max_ctx = 20 + 13 * (N - 1) + 1;
    test_weight w[3];
    lm_weight *gw[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        make_weight(&w[k], LM_DTYPE_BF16, rows[k], D);
        CHECK(g_gpu->ops->weight_create(g_gpu, &w[k].t, &gw[k]) == LM_OK);
    }
    lm_kv_cache *kv = NULL;
    const int64_t n_blocks = (max_ctx / BS + 1) * N;
    CHECK(lm_kv_cache_create(g_gpu, 1, d_kv, BS, n_blocks, N, LM_DTYPE_F16, &kv) == LM_OK);
    if (!gw[0] || !gw[1] || !gw[2] || !kv) return;
    CHECK(kv_poison(kv)); /* NaN where no token is stored: the output below must stay finite */
    g_gpu->ops->weight_pack(g_gpu, gw, 3);
    /* sequence s: 20 + 13 s positions, the last one this step's */
    int32_t pos[N], seq[N];
    int64_t ctx_total = 0;
    for (int s = 0; s < N; s++) {
        pos[s] = 20 + 13 * s - 1, seq[s] = s;
        CHECK(lm_kv_cache_reserve(kv, s, pos[s] + 1) == LM_OK);
        ctx_total += pos[s];
    }
    /* the earlier positions' keys and values */
    int32_t *cpos = malloc(sizeof(int32_t) * (size_t)ctx_total), *cseq = malloc(sizeof(int32_t) * (size_t)ctx_total);
    float *ck = fmalloc(ctx_total * d_kv), *cv = fmalloc(ctx_total * d_kv);
    for (int s = 0, t = 0; s < N; s++)
        for (int p = 0; p < pos[s]; p++) cpos[t] = p, cseq[t++] = s;
    fill(ck, ctx_total * d_kv, 1.0f);
    fill(cv, ctx_total * d_kv, 1.0f);
    float *dck = gpu_upload(ck, sizeof(float) * (size_t)(ctx_total * d_kv));
    float *dcv = gpu_upload(cv, sizeof(float) * (size_t)(ctx_total * d_kv));
    lm_attn_batch ctx = {ctx_total, cpos, cseq};
    g_gpu->ops->kv_store(g_gpu, kv, 0, &ctx, dck, dcv);
    /* the step */
    float *x = fmalloc(N * D), *bias = fmalloc(NH * HD + 2 * d_kv);
    fill(x, N * D, 1.0f);
    fill(bias, NH * HD + 2 * d_kv, 0.5f);
    float *dx = gpu_upload(x, sizeof(float) * N * D), *dbias = gpu_upload(bias, sizeof(float) * (NH * HD + 2 * d_kv));
    float *dy[3], *dout = g_gpu->ops->alloc(g_gpu, sizeof(float) * N * NH * HD);
    for (int k = 0; k < 3; k++) dy[k] = g_gpu->ops->alloc(g_gpu, sizeof(float) * (size_t)(N * rows[k]));
    lm_attn_batch step = {N, pos, seq};
    lm_qkv_finish f = {dy[0], dy[1], dy[2], dbias, dbias + NH * HD, dbias + NH * HD + d_kv, NULL, NULL, 1e-6f,
                       NH, NKV, HD, n_rot, 1e6f, 1.0f, mode};
    const size_t cache_bytes = (size_t)(n_blocks * BS * d_kv) * kv->elem_size;
    uint8_t *cache[2][2];
    float *got[2][4];
    for (int run = 0; run < 2; run++) { /* 0: back to back; 1: a download after the product */
        CHECK(g_gpu->ops->matmul_many(g_gpu, (const lm_weight *const *)gw, 3, dx, N, dy) == LM_OK);
        if (run == 1) {
            float one;
            gpu_download(&one, dy[0], sizeof one);
        }
        g_gpu->ops->qkv_finish(g_gpu, kv, 0, &step, &f);
        CHECK(g_gpu->ops->attention(g_gpu, kv, 0, &step, dy[0], NH, NKV, HD, 0, 1.0f / sqrtf((float)HD), dout) ==
              LM_OK);
        for (int k = 0; k < 3; k++) {
            got[run][k] = fmalloc(N * rows[k]);
            gpu_download(got[run][k], dy[k], sizeof(float) * (size_t)(N * rows[k]));
        }
        got[run][3] = fmalloc(N * NH * HD);
        gpu_download(got[run][3], dout, sizeof(float) * N * NH * HD);
        for (int c = 0; c < 2; c++) {
            cache[run][c] = malloc(cache_bytes);
            gpu_download(cache[run][c], c ? kv->v : kv->k, cache_bytes);
        }
    }
    bool same = memcmp(cache[0][0], cache[1][0], cache_bytes) == 0 &&
                memcmp(cache[0][1], cache[1][1], cache_bytes) == 0;
    for (int k = 0; k < 3; k++) same = same && bit_equal(got[0][k], got[1][k], N * rows[k]);
    same = same && bit_equal(got[0][3], got[1][3], N * NH * HD);
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < (int64_t)N * NH * HD; i++) nonfinite += !isfinite(got[0][3][i]);
    if (nonfinite) printf("  %-10s %lld outputs not finite (a row past its position read)\n", "qkv+attn",
                          (long long)nonfinite);
    CHECK(nonfinite == 0);
    char what[64];
    snprintf(what, sizeof what, "BF16 packed, 40 tokens, hd %d 12/2 %s rot %d", hd,
             mode == LM_ROPE_NEOX ? "neox" : "norm", n_rot);
    printf("  %-10s %-40s %s\n", "qkv+attn", what,
           same ? "back to back == apart (q, k, v, cache, output bit-equal)" : "DIFFER");
    CHECK(same);
    for (int run = 0; run < 2; run++) {
        for (int k = 0; k < 4; k++) free(got[run][k]);
        free(cache[run][0]), free(cache[run][1]);
    }
    gpu_free(dx), gpu_free(dbias), gpu_free(dout), gpu_free(dck), gpu_free(dcv);
    for (int k = 0; k < 3; k++) gpu_free(dy[k]);
    free(x), free(bias), free(ck), free(cv), free(cpos), free(cseq);
    lm_kv_cache_free(kv);
    for (int k = 0; k < 3; k++) {
        g_gpu->ops->weight_free(g_gpu, gw[k]);
        free_weight(&w[k]);
    }
}

/* ---- end to end: tiny random models -------------------------------------------- */

enum { E2E_TOK = 23 };

static lm_model_internal *load_model(lm_backend *b, const char *path) {
    lm_model_internal *m = NULL;
    lm_status st = lm_model_internal_load(path, b, &m);
    if (st) fprintf(stderr, "load %s: %s\n", path, lm_last_error());
    CHECK(st == LM_OK);
    return m;
}

/* logits of every token of a batch of `n_seq` sequences, interleaved token by token
 * (n_seq = 1: one sequence as one batch); out [n_seq * E2E_TOK][n_vocab] */
static void run_interleaved(lm_model_internal *m, lm_dtype kv_type, int n_seq, float *out) {
    int32_t tok[2 * E2E_TOK], pos[2 * E2E_TOK], seq[2 * E2E_TOK];
    int8_t want[2 * E2E_TOK];
    for (int i = 0; i < E2E_TOK; i++)
        for (int s = 0; s < n_seq; s++) {
            int j = i * n_seq + s;
            tok[j] = (int32_t)((i * 37 + s * 101 + 5) % m->hp.n_vocab), pos[j] = i, seq[j] = s, want[j] = 1;
        }
    lm_kv_cache *kv = NULL;
    CHECK(lm_kv_cache_for_model(m, 64, 2, kv_type, &kv) == LM_OK);
    lm_batch b = {n_seq * E2E_TOK, tok, pos, seq, want};
    lm_status st = lm_forward(m, kv, &b, out);
    if (st) fprintf(stderr, "forward: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    lm_kv_cache_free(kv);
}

/* sequence 0 fed one token at a time (decode steps); out [E2E_TOK][n_vocab] */
static void run_steps(lm_model_internal *m, lm_dtype kv_type, float *out) {
    lm_kv_cache *kv = NULL;
    CHECK(lm_kv_cache_for_model(m, 64, 1, kv_type, &kv) == LM_OK);
    for (int i = 0; i < E2E_TOK; i++) {
        int32_t tok = (int32_t)((i * 37 + 5) % m->hp.n_vocab), p = i, s = 0;
        lm_batch b = {1, &tok, &p, &s, NULL};
        CHECK(lm_forward(m, kv, &b, out + (int64_t)i * m->hp.n_vocab) == LM_OK);
    }
    lm_kv_cache_free(kv);
}

enum { MAX_PAR_SEQ = 12 };

/* n_seq sequences decoded together, one token each per step (the steps after the
 * first two replay a recorded CUDA graph); out [E2E_TOK][n_seq][n_vocab] */
static void run_parallel_steps(lm_model_internal *m, lm_dtype kv_type, int n_seq, float *out) {
    lm_kv_cache *kv = NULL;
    CHECK(lm_kv_cache_for_model(m, 64, n_seq, kv_type, &kv) == LM_OK);
    for (int i = 0; i < E2E_TOK; i++) {
        int32_t tok[MAX_PAR_SEQ], pos[MAX_PAR_SEQ], seq[MAX_PAR_SEQ];
        int8_t want[MAX_PAR_SEQ];
        for (int s = 0; s < n_seq; s++)
            tok[s] = (int32_t)((i * 37 + s * 11 + 5) % m->hp.n_vocab), pos[s] = i, seq[s] = s, want[s] = 1;
        lm_batch b = {n_seq, tok, pos, seq, want};
        CHECK(lm_forward(m, kv, &b, out + (int64_t)i * n_seq * m->hp.n_vocab) == LM_OK);
    }
    lm_kv_cache_free(kv);
}

/* Decode steps replayed from CUDA graphs, with the fused qkv_finish op, equal the
 * same steps launched op by op with the separate ops, bit for bit. */
static bool graphs_equal_direct(lm_backend *graphs, lm_backend *direct, const char *path, lm_dtype kv_type) {
    lm_model_internal *mg = load_model(graphs, path), *md = load_model(direct, path);
    bool same = mg && md;
    int64_t V = same ? mg->hp.n_vocab : 1;
    float *a = fmalloc(E2E_TOK * MAX_PAR_SEQ * V), *b = fmalloc(E2E_TOK * MAX_PAR_SEQ * V);
    static const int k_n_seq[] = {1, 3, 6, 12};
    for (size_t c = 0; same && c < sizeof k_n_seq / sizeof k_n_seq[0]; c++) {
        const int n_seq = k_n_seq[c];
        run_parallel_steps(mg, kv_type, n_seq, a);
        run_parallel_steps(md, kv_type, n_seq, b);
        same = same && bit_equal(a, b, E2E_TOK * n_seq * V);
    }
    free(a), free(b);
    if (mg) lm_model_internal_free(mg);
    if (md) lm_model_internal_free(md);
    return same;
}

/* 1 and 3 sequences: matrix-vector products; 6 and 12: tensor-core products of
 * 16-bit weights (F32 weights: GEMMs), quantized ones on the matrix-vector path at 6
 * and GEMMs at 12; GEMMs from 6 on the backends without the tensor-core path, whose
 * GEMMs of quantized weights read the weights' bf16 copies with graphs and decode
 * tiles without. Every step after the third is a replay: of the batch alone where
 * the recording allows it (pass_begin's *ran). The precise pair (both with copies)
 * checks its fused side: the halves summed by the add and swiglu after a product and
 * the lo parts handed off equal the sum and conversion kernels' bits. */
static void test_graphs_equal_direct(const char *path, lm_dtype kv_type, const char *what) {
    bool same = graphs_equal_direct(g_gpu, g_gpu_direct, path, kv_type);
    bool same_gemm = graphs_equal_direct(g_gpu_gemm, g_gpu_gemm_direct, path, kv_type);
    bool same_precise = graphs_equal_direct(g_gpu_precise_gemm, g_gpu_precise_direct, path, kv_type);
    printf("  %-10s %-40s %s\n", "graphs", what,
           same && same_gemm && same_precise ? "graphs + fused == op by op (bit-equal; precise too)" : "DIFFER");
    CHECK(same);
    CHECK(same_gemm);
    CHECK(same_precise);
}

static int64_t argmax_row(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_e2e(lm_backend *gpu_exact, lm_arch arch, lm_dtype type, lm_dtype kv_type) {
    tiny_spec s = tiny_default(arch);
    s.matrix_type = type;
    if (type == LM_DTYPE_Q4_K || type == LM_DTYPE_Q6_K || type == LM_DTYPE_Q5_K) {
        s.n_embd = 256, s.n_ff = 512, s.head_dim = 64; /* K-quant rows are multiples of 256 */
    }
    tiny_model tm;
    tiny_build(&tm, s);
    char pq[512], pf[512];
    snprintf(pq, sizeof pq, "%s/%s-%s.gguf", g_dir, lm_arch_name(arch), lm_dtype_name(type));
    snprintf(pf, sizeof pf, "%s/%s-%s-exact.gguf", g_dir, lm_arch_name(arch), lm_dtype_name(type));
    CHECK(tiny_write_gguf(&tm, pq, NULL) == LM_OK);
    /* the same weights exactly decoded, as F32: the exact math of the quantized model */
    for (int i = 0; i < tm.n; i++) {
        tiny_tensor *t = &tm.t[i];
        if (t->ne1 == 1 || type == LM_DTYPE_F32) continue;
        size_t rb = lm_dtype_row_bytes(type, t->ne0);
        uint8_t *q = malloc(rb);
        for (int64_t r = 0; r < t->ne1; r++) {
            lm_quantize_row(type, t->data + r * t->ne0, q, t->ne0);
            lm_dequantize_row(type, q, t->data + r * t->ne0, t->ne0);
        }
        free(q);
    }
    tm.spec.matrix_type = LM_DTYPE_F32;
    CHECK(tiny_write_gguf(&tm, pf, NULL) == LM_OK);
    tiny_free(&tm);
    lm_model_internal *mg = load_model(g_gpu, pq), *mc = load_model(g_cpu, pq), *mf = load_model(g_cpu, pf);
    lm_model_internal *mx = load_model(gpu_exact, pq);
    if (!mg || !mc || !mf || !mx) return;
    int64_t V = mg->hp.n_vocab, n = 2 * E2E_TOK;
    float *ref = fmalloc(n * V), *gpu = fmalloc(n * V), *cpu = fmalloc(n * V), *alone = fmalloc(E2E_TOK * V);
    float *steps = fmalloc(E2E_TOK * V);
    run_interleaved(mf, LM_DTYPE_F32, 2, ref);
    run_interleaved(mg, kv_type, 2, gpu);
    run_interleaved(mc, kv_type, 2, cpu);
    double eg = nerr(gpu, ref, n * V), ec = nerr(cpu, ref, n * V);
    int agree = 0;
    for (int64_t i = 0; i < n; i++) agree += argmax_row(gpu + i * V, V) == argmax_row(ref + i * V, V);
    /* within the CPU backend's own distance from the exact math (8-bit activations),
     * or close to exact where the CPU is exact too (F32 weights) */
    double tol = type == LM_DTYPE_F32 ? (kv_type == LM_DTYPE_F32 ? 1e-4 : 2e-3) : fmax(2.0 * ec, 5e-3);
    char what[96];
    snprintf(what, sizeof what, "%-6s %-4s KV %s: top-1 %d/%lld (cpu %.1e)", lm_arch_name(arch), lm_dtype_name(type),
             lm_dtype_name(kv_type), agree, (long long)n, ec);
    report("model", what, eg, tol);

    /* batch invariance on the GPU: sequence 0 alone vs interleaved with another */
    run_interleaved(mg, kv_type, 1, alone);
    bool same_path = matmul_path(type, 32, E2E_TOK) == matmul_path(type, 32, n);
    bool inv = true;
    for (int i = 0; i < E2E_TOK; i++) inv = inv && bit_equal(alone + i * V, gpu + (2 * i) * V, V);
    if (same_path) CHECK(inv);
    run_steps(mg, kv_type, steps);
    printf("  %-10s %-40s %s, decode steps vs batch nerr %.2e\n", "invariance", what,
           inv ? "alone == interleaved (bit-equal)" : "alone != interleaved", nerr(steps, alone, E2E_TOK * V));
    /* the all-matrix-vector configuration is bit batch-invariant, decode steps included */
    run_interleaved(mx, kv_type, 2, gpu);
    run_steps(mx, kv_type, steps);
    inv = true;
    for (int i = 0; i < E2E_TOK; i++) inv = inv && bit_equal(steps + i * V, gpu + (2 * i) * V, V);
    printf("  %-10s %-40s %s\n", "invariance", "LUMEN_CUDA_MV_MAX_N=1e9",
           inv ? "decode steps == interleaved batch (bit-equal)" : "decode steps != interleaved batch");
    CHECK(inv);
    test_graphs_equal_direct(pq, kv_type, what);
    free(ref), free(gpu), free(cpu), free(alone), free(steps);
    lm_model_internal_free(mg), lm_model_internal_free(mc), lm_model_internal_free(mf), lm_model_internal_free(mx);
    unlink(pq), unlink(pf);
}

static void test_models(void) {
    /* a second CUDA backend whose products all take the matrix-vector path */
    setenv("LUMEN_CUDA_MV_MAX_N", "1000000000", 1);
    lm_backend *exact = NULL;
    CHECK(create_gpu(&exact) == LM_OK);
    if (!exact) return;
    static const lm_arch archs[] = {LM_ARCH_LLAMA, LM_ARCH_QWEN2, LM_ARCH_GEMMA3};
    for (int a = 0; a < 3; a++) {
        if (getenv("LUMEN_TEST_OPS_QUICK")) {
            test_e2e(exact, archs[a], a == 2 ? LM_DTYPE_F32 : LM_DTYPE_Q8_0, a == 2 ? LM_DTYPE_F32 : LM_DTYPE_F16);
            continue;
        }
        test_e2e(exact, archs[a], LM_DTYPE_F32, LM_DTYPE_F32);
        test_e2e(exact, archs[a], LM_DTYPE_Q8_0, LM_DTYPE_F16);
        test_e2e(exact, archs[a], LM_DTYPE_Q4_K, LM_DTYPE_F16);
        test_e2e(exact, archs[a], LM_DTYPE_Q6_K, LM_DTYPE_F32);
    }
    lm_backend_free(exact);
    (void)tiny_write_hf;
}

/* ---- the one-kernel decode step ---------------------------------------------- */
enum { DS_STEPS = 100 }; /* past 32 positions: the attention runs in several splits */

/* Sequence 0 decoded one token at a time; out [DS_STEPS][n_vocab]. The first step
 * calls the backend's decode_step op itself (it must serve the model: LM_OK), the
 * others go through lm_forward (direct, then recorded and replayed passes). */
static void run_decode_steps(lm_model_internal *m, bool call_op, float *out) {
    lm_backend *b = m->backend;
    const int64_t V = m->hp.n_vocab;
    lm_kv_cache *kv = NULL;
    CHECK(lm_kv_cache_for_model(m, DS_STEPS + 16, 1, LM_DTYPE_F16, &kv) == LM_OK);
    for (int i = 0; i < DS_STEPS; i++) {
        int32_t tok = (int32_t)((i * 37 + 5) % V), p = i, s = 0;
        if (i == 0 && call_op) {
            static lm_decode_layer layers[LM_DECODE_MAX_LAYERS];
            lm_decode_model dm;
            lm_decode_model_of(m, layers, &dm);
            CHECK(lm_kv_cache_reserve(kv, 0, 1) == LM_OK);
            float *x = b->ops->alloc(b, (size_t)m->hp.n_embd * sizeof(float));
            float *logits = b->ops->alloc(b, (size_t)V * sizeof(float));
            lm_attn_batch ab = {1, &p, &s};
            lm_status st = b->ops->decode_step(b, &dm, kv, &ab, &tok, x, logits);
            if (st) fprintf(stderr, "decode_step: %d %s\n", (int)st, st == LM_ERR_UNSUPPORTED ? "unsupported" : lm_last_error());
            CHECK(st == LM_OK);
            b->ops->download(b, out, logits, (size_t)V * sizeof(float));
            b->ops->free(b, x), b->ops->free(b, logits);
            continue;
        }
        lm_batch batch = {1, &tok, &p, &s, NULL};
        lm_status st = lm_forward(m, kv, &batch, out + (int64_t)i * V);
        if (st) fprintf(stderr, "forward: %s\n", lm_last_error());
        CHECK(st == LM_OK);
    }
    lm_kv_cache_free(kv);
}

/* decode_step (on a backend with it turned on) against the same steps op by op on the
 * GPU (exact f32 products: the sums' order alone differs) and against the CPU
 * reference. */
static void test_decode_step(lm_arch arch, int head_dim, lm_dtype type) {
    setenv("LUMEN_CUDA_DECODE_STEP", "1", 1);
    lm_backend *stepper = NULL;
    CHECK(create_gpu(&stepper) == LM_OK);
    unsetenv("LUMEN_CUDA_DECODE_STEP");
    if (!stepper) return;
    if (!stepper->ops->decode_step) {
        printf("  %-10s SKIPPED: this backend has no decode_step\n", "decode");
        lm_backend_free(stepper);
        return;
    }
    tiny_spec s = tiny_default(arch);
    s.matrix_type = type, s.n_embd = 256, s.head_dim = head_dim, s.n_ff = 512, s.n_vocab = 1000;
    s.n_head = arch == LM_ARCH_QWEN2 ? 6 : 4, s.n_head_kv = 2;
    tiny_model tm;
    tiny_build(&tm, s);
    char path[512];
    snprintf(path, sizeof path, "%s/decode-%s-%s.gguf", g_dir, lm_arch_name(arch), lm_dtype_name(type));
    CHECK(tiny_write_gguf(&tm, path, NULL) == LM_OK);
    tiny_free(&tm);
    lm_model_internal *mg = load_model(stepper, path), *mo = load_model(g_gpu, path);
    lm_model_internal *mc = load_model(g_cpu, path);
    if (mg && mo && mc) {
        const int64_t V = mg->hp.n_vocab, n = DS_STEPS * V;
        float *step = fmalloc(n), *ref = fmalloc(n), *cpu = fmalloc(n);
        run_decode_steps(mg, true, step);
        run_decode_steps(mo, false, ref);
        run_decode_steps(mc, false, cpu);
        int agree = 0;
        for (int i = 0; i < DS_STEPS; i++) agree += argmax_row(step + i * V, V) == argmax_row(ref + i * V, V);
        char what[96];
        snprintf(what, sizeof what, "%-6s %-4s hd %d: top-1 %d/%d vs op by op", lm_arch_name(arch),
                 lm_dtype_name(type), head_dim, agree, DS_STEPS);
        report("decode", what, nerr(step, ref, n), 1e-4);
        snprintf(what, sizeof what, "%-6s %-4s hd %d vs CPU (op by op %.1e)", lm_arch_name(arch), lm_dtype_name(type),
                 head_dim, nerr(ref, cpu, n));
        report("decode", what, nerr(step, cpu, n), fmax(2.0 * nerr(ref, cpu, n), 1e-4));
        CHECK(agree >= DS_STEPS - 2); /* a near tie may go either way */
        free(step), free(ref), free(cpu);
    }
    if (mg) lm_model_internal_free(mg);
    if (mo) lm_model_internal_free(mo);
    if (mc) lm_model_internal_free(mc);
    lm_backend_free(stepper);
    unlink(path);
}

int main(void) {
    lm_status st = create_gpu(&g_gpu);
    if (st == LM_ERR_UNSUPPORTED) {
        printf("SKIPPED: %s\n", lm_last_error());
        return LM_TEST_SKIP;
    }
    if (st) {
        fprintf(stderr, "lm_backend_cuda_create: %s\n", lm_last_error());
        return 1;
    }
    const char *mv = getenv("LUMEN_CUDA_MV_MAX_N"), *tc = getenv("LUMEN_CUDA_TC_MAX_N");
    if (mv && mv[0] && atoll(mv) >= 0) g_mv_max_n = g_mv_max_n_q = g_mv_max_n_c = atoll(mv);
    if (tc && tc[0] && atoll(tc) >= 0) g_tc_max_n = g_tc_max_n_q = atoll(tc);
    /* as the backend decides it (cuda_backend.cu, LUMEN_CUDA_ATTN_DEC) */
    const char *dec = getenv("LUMEN_CUDA_ATTN_DEC");
    g_attn_dec_min = dec && dec[0] ? (atoll(dec) > 0 ? atoll(dec) : INT64_MAX)
                                   : g_mv_max_n >= 512 ? g_mv_max_n + 1 : 1;
    const char *chunk = getenv("LUMEN_CUDA_GEMM_CHUNK"); /* as the backend reads it */
    if (chunk && atoll(chunk) >= 16 && atoll(chunk) <= 4096) g_gemm_chunk = atoll(chunk) / 16 * 16;
    char tc_env[32];
    snprintf(tc_env, sizeof tc_env, "%s", tc ? tc : "");
    setenv("LUMEN_CUDA_TC_MAX_N", "0", 1);
    /* its GEMMs read the weights' bf16 copies, its direct twin's decode tiles: the
     * same bits (test_graphs_equal_direct); both on the matrix-vector path up to 8
     * tokens (with a copy a quantized weight would leave it after 4) */
    const char *copy = getenv("LUMEN_CUDA_BF16_COPY");
    char copy_env[32], mv_env[32];
    snprintf(copy_env, sizeof copy_env, "%s", copy ? copy : "");
    snprintf(mv_env, sizeof mv_env, "%s", mv ? mv : "");
    g_copies = !(copy && copy[0] && atoll(copy) <= 0);
    if (!mv_env[0]) setenv("LUMEN_CUDA_MV_MAX_N", "8", 1);
    setenv("LUMEN_CUDA_BF16_COPY", "1024", 1);
    CHECK(create_gpu(&g_gpu_gemm) == LM_OK);
    setenv("LUMEN_CUDA_PRECISE", "1", 1);
    CHECK(create_gpu(&g_gpu_precise_gemm) == LM_OK);
    setenv("LUMEN_CUDA_GRAPHS", "0", 1);
    setenv("LUMEN_CUDA_FUSED", "0", 1);
    CHECK(create_gpu(&g_gpu_precise_direct) == LM_OK); /* with copies: the same kernels, unfused */
    unsetenv("LUMEN_CUDA_PRECISE");
    setenv("LUMEN_CUDA_BF16_COPY", "0", 1);
    CHECK(create_gpu(&g_gpu_gemm_direct) == LM_OK);
    if (copy_env[0]) setenv("LUMEN_CUDA_BF16_COPY", copy_env, 1);
    else unsetenv("LUMEN_CUDA_BF16_COPY");
    if (!mv_env[0]) unsetenv("LUMEN_CUDA_MV_MAX_N");
    if (tc_env[0]) setenv("LUMEN_CUDA_TC_MAX_N", tc_env, 1);
    else unsetenv("LUMEN_CUDA_TC_MAX_N");
    CHECK(create_gpu(&g_gpu_direct) == LM_OK);
    setenv("LUMEN_CUDA_BF16_COPY", "0", 1);
    CHECK(create_gpu(&g_gpu_nocopy) == LM_OK);
    if (copy_env[0]) setenv("LUMEN_CUDA_BF16_COPY", copy_env, 1);
    else unsetenv("LUMEN_CUDA_BF16_COPY");
    setenv("LUMEN_CUDA_TC_MAX_N", "32", 1);
    CHECK(create_gpu(&g_gpu_tc) == LM_OK);
    setenv("LUMEN_CUDA_PRECISE", "1", 1);
    CHECK(create_gpu(&g_gpu_precise) == LM_OK);
    unsetenv("LUMEN_CUDA_PRECISE");
    if (tc_env[0]) setenv("LUMEN_CUDA_TC_MAX_N", tc_env, 1);
    else unsetenv("LUMEN_CUDA_TC_MAX_N");
    unsetenv("LUMEN_CUDA_GRAPHS");
    unsetenv("LUMEN_CUDA_FUSED");
    CHECK(lm_backend_cpu_create(2, &g_cpu) == LM_OK);
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_backend_ops_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    /* the model tests set LUMEN_CUDA_MV_MAX_N for a second backend: read ours first */
    printf("CUDA backend vs CPU reference (exact matrix-vector path up to n=%lld, quantized %lld; tensor cores up "
           "to %lld, quantized %lld: %s bf16 copies)\n",
           (long long)g_mv_max_n, g_copies ? (long long)g_mv_max_n_c : (long long)g_mv_max_n_q, (long long)g_tc_max_n,
           g_copies ? (long long)g_tc_max_n : (long long)g_tc_max_n_q, g_copies ? "with" : "without");
    test_memory();
    test_get_rows();
    test_matmul();
    test_matmul_without_copies();
    test_matmul_tensor_cores();
    test_matmul_precise();
    test_rms_norm();
    test_add_rms_norm();
    test_arith();
    test_rope();
    test_activations();
    test_attention();
    test_qkv_attention_fused(128, 128, LM_ROPE_NEOX);
    test_qkv_attention_fused(128, 64, LM_ROPE_NORM);
    test_qkv_attention_fused(64, 64, LM_ROPE_NEOX);
    test_models();
    test_decode_step(LM_ARCH_QWEN2, 128, LM_DTYPE_BF16);
    test_decode_step(LM_ARCH_LLAMA, 64, LM_DTYPE_F16);
    printf("%d comparisons, %d over tolerance\n", g_n_checks, g_n_bad);
    lm_backend_free(g_gpu);
    lm_backend_free(g_gpu_direct);
    lm_backend_free(g_gpu_nocopy);
    lm_backend_free(g_gpu_tc);
    lm_backend_free(g_gpu_precise);
    lm_backend_free(g_gpu_gemm);
    lm_backend_free(g_gpu_gemm_direct);
    lm_backend_free(g_gpu_precise_gemm);
    lm_backend_free(g_gpu_precise_direct);
    lm_backend_free(g_cpu);
    TEST_MAIN_END();
}
