/* Matrix-product throughput of the CUDA backend on Qwen2.5-1.5B-shaped weights.
 *
 * usage: bench_cuda_matvec [FORMAT...]      (default: Q4_K Q6_K Q8_0 BF16 F16)
 *        bench_cuda_matvec --copy-only         (only the ceilings: device copy, host download;
 *                                               and the matmul_many check)
 *
 * For each format: the model's four matrix shapes (q/o 1536x1536, k/v 256x1536,
 * gate/up 8960x1536, down 1536x8960), timed at n = 1 .. 512 tokens. Prints, per call,
 * the time, the weight bytes streamed per second (the decode figure: at small n a
 * product is bound by reading the weights once) and the arithmetic rate (the prefill
 * figure), plus the device-to-device copy rate as the bandwidth ceiling and the
 * matrix-product time of one decode step of the whole model (28 layers + output head).
 * Method: 3 warm-up calls, then enough calls for ~0.1 s; the clock stops after a
 * download that waits for the stream. Random weights; the work is the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "tensor/quant.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(g_rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct shape {
    const char *name;
    int64_t rows, cols, per_layer; /* matrices of this shape per layer */
} shape;

static const shape k_shapes[] = {
    {"q/o  1536x1536", 1536, 1536, 2},
    {"k/v   256x1536", 256, 1536, 2},
    {"gate 8960x1536", 8960, 1536, 2},
    {"down 1536x8960", 1536, 8960, 1},
};
enum { N_LAYER = 28, VOCAB = 151936 };

static lm_backend *g_b;

/* seconds per call of matmul(w, x[n]) */
static double time_matmul(lm_weight *w, const float *dx, int64_t n, float *dy) {
    float probe;
    for (int i = 0; i < 3; i++)
        if (g_b->ops->matmul(g_b, w, dx, n, dy)) return -1;
    g_b->ops->download(g_b, &probe, dy, sizeof probe);
    int iters = 1;
    double t;
    for (;;) {
        double t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (g_b->ops->matmul(g_b, w, dx, n, dy)) return -1;
        g_b->ops->download(g_b, &probe, dy, sizeof probe);
        t = now_s() - t0;
        if (t > 0.1 || iters >= 1 << 16) break;
        iters *= t < 0.02 ? 8 : 2;
    }
    return t / iters;
}

static int64_t g_period = 256;

static lm_weight *make_weight(lm_dtype type, int64_t rows, int64_t cols) {
    /* g_period (256) random rows, repeated: quantizing a 151936-row head on the host
     * would take longer than the whole benchmark, and the content does not change the
     * work */
    size_t rb = lm_dtype_row_bytes(type, cols);
    uint8_t *data = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        if (r >= g_period) {
            memcpy(data + (size_t)r * rb, data + (size_t)(r % g_period) * rb, rb);
            continue;
        }
        for (int64_t j = 0; j < cols; j++) row[j] = frand() * 0.05f;
        lm_quantize_row(type, row, data + (size_t)r * rb, cols);
    }
    lm_tensor t = {"bench", type, 2, {cols, rows, 1, 1}, data, rb * (size_t)rows, NULL, NULL, 0, 0};
    lm_weight *w = NULL;
    if (g_b->ops->weight_create(g_b, &t, &w)) fprintf(stderr, "weight_create: %s\n", lm_last_error());
    free(row);
    free(data); /* the backend holds its own copy */
    return w;
}

/* matmul_many must equal one matmul per weight bit for bit, on both paths: sets like
 * the forward pass's (Q/K/V with V in another format, gate/up, F32 next to BF16). */
static void check_matmul_many(void) {
    if (!g_b->ops->matmul_many) {
        printf("matmul_many: not used (LUMEN_CUDA_MATMUL_MANY=0)\n\n");
        return;
    }
    typedef struct set {
        int n_w;
        lm_dtype type[3];
        int64_t rows[3], cols;
    } set;
    static const set sets[] = {
        {3, {LM_DTYPE_Q4_K, LM_DTYPE_Q4_K, LM_DTYPE_Q6_K}, {1536, 256, 256}, 1536},
        {3, {LM_DTYPE_BF16, LM_DTYPE_BF16, LM_DTYPE_BF16}, {1536, 256, 256}, 1536},
        {2, {LM_DTYPE_Q4_K, LM_DTYPE_Q4_K}, {1024, 1024}, 1536},
        {2, {LM_DTYPE_F32, LM_DTYPE_BF16}, {256, 512}, 1536},
        {3, {LM_DTYPE_Q8_0, LM_DTYPE_Q6_K, LM_DTYPE_Q8_0}, {64, 128, 96}, 512},
    };
    static const int64_t ns[] = {1, 3, 8, 16, 17, 64, 200};
    int cases = 0, differ = 0;
    g_period = 1 << 30; /* every row its own: an indexing error cannot hide */
    int64_t max_n = 200, cols_max = 1536, rows_max = 1536;
    float *dx = g_b->ops->alloc(g_b, sizeof(float) * (size_t)(max_n * cols_max));
    float *hx = malloc(sizeof(float) * (size_t)(max_n * cols_max));
    float *dref[3], *dy[3], *href = malloc(sizeof(float) * (size_t)(max_n * rows_max)),
                          *hy = malloc(sizeof(float) * (size_t)(max_n * rows_max));
    for (int i = 0; i < 3; i++) {
        dref[i] = g_b->ops->alloc(g_b, sizeof(float) * (size_t)(max_n * rows_max));
        dy[i] = g_b->ops->alloc(g_b, sizeof(float) * (size_t)(max_n * rows_max));
    }
    for (int64_t i = 0; i < max_n * cols_max; i++) hx[i] = frand();
    g_b->ops->upload(g_b, dx, hx, sizeof(float) * (size_t)(max_n * cols_max));
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const set *st = &sets[si];
        lm_weight *w[3] = {NULL, NULL, NULL};
        for (int i = 0; i < st->n_w; i++) w[i] = make_weight(st->type[i], st->rows[i], st->cols);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int64_t n = ns[ni];
            bool ok = true;
            for (int i = 0; i < st->n_w; i++) ok = ok && g_b->ops->matmul(g_b, w[i], dx, n, dref[i]) == LM_OK;
            ok = ok && g_b->ops->matmul_many(g_b, (const lm_weight *const *)w, st->n_w, dx, n, dy) == LM_OK;
            for (int i = 0; ok && i < st->n_w; i++) {
                size_t bytes = sizeof(float) * (size_t)(n * st->rows[i]);
                g_b->ops->download(g_b, href, dref[i], bytes);
                g_b->ops->download(g_b, hy, dy[i], bytes);
                ok = memcmp(href, hy, bytes) == 0;
            }
            cases++;
            if (!ok) {
                differ++;
                printf("matmul_many DIFFERS: set %zu (%s ...), n=%lld: %s\n", si, lm_dtype_name(st->type[0]),
                       (long long)n, lm_last_error());
            }
        }
        for (int i = 0; i < st->n_w; i++) g_b->ops->weight_free(g_b, w[i]);
    }
    printf("matmul_many check: %d cases, %d differ from separate matmuls\n\n", cases, differ);
    g_period = 256;
    for (int i = 0; i < 3; i++) g_b->ops->free(g_b, dref[i]), g_b->ops->free(g_b, dy[i]);
    g_b->ops->free(g_b, dx);
    free(hx), free(href), free(hy);
}

int main(int argc, char **argv) {
    if (lm_backend_cuda_create(0, &g_b) != LM_OK) {
        printf("SKIPPED: %s\n", lm_last_error());
        return 0;
    }
    const char *mv = getenv("LUMEN_CUDA_MV_MAX_N");
    printf("CUDA matrix products, Qwen2.5-1.5B shapes (matrix-vector path up to n=%s)\n", mv ? mv : "16");

    /* bandwidth ceiling: a 1 GiB device-to-device copy (bytes read + written) */
    size_t big = (size_t)1 << 30;
    void *a = g_b->ops->alloc(g_b, big), *c = g_b->ops->alloc(g_b, big);
    if (a && c) {
        float probe;
        g_b->ops->copy(g_b, c, a, big);
        g_b->ops->download(g_b, &probe, c, sizeof probe);
        double t0 = now_s();
        for (int i = 0; i < 10; i++) g_b->ops->copy(g_b, c, a, big);
        g_b->ops->download(g_b, &probe, c, sizeof probe);
        double t = (now_s() - t0) / 10;
        printf("device copy: %.0f GB/s (read + written)\n\n", 2.0 * big / t / 1e9);
    }
    if (a) g_b->ops->free(g_b, a);
    if (c) g_b->ops->free(g_b, c);

    /* what a decode step of many sequences pays to bring every sequence's logits to
     * the host (pageable memory, as lm_forward's caller gives it) */
    size_t lbytes = (size_t)256 * VOCAB * sizeof(float);
    void *dl = g_b->ops->alloc(g_b, lbytes);
    float *hl = malloc(lbytes);
    if (dl && hl) {
        g_b->ops->download(g_b, hl, dl, lbytes);
        double t0 = now_s();
        for (int i = 0; i < 5; i++) g_b->ops->download(g_b, hl, dl, lbytes);
        double t = (now_s() - t0) / 5;
        printf("host download: %.1f GB/s (pageable; 256 rows of logits, %.0f MB, in %.2f ms)\n\n", lbytes / t / 1e9,
               lbytes / 1e6, t * 1e3);
    }
    if (dl) g_b->ops->free(g_b, dl);
    free(hl);
    check_matmul_many();
    if (argc > 1 && strcmp(argv[1], "--copy-only") == 0) {
        lm_backend_free(g_b);
        return 0;
    }

    static const char *def[] = {"Q4_K", "Q6_K", "Q8_0", "BF16", "F16"};
    int n_fmt = argc > 1 ? argc - 1 : 5;
    const char **fmts = argc > 1 ? (const char **)argv + 1 : def;
    static const int64_t ns[] = {1, 2, 4, 8, 16, 17, 32, 64, 128, 256, 512};
    const int n_ns = (int)(sizeof ns / sizeof ns[0]);
    int64_t max_n = 512, max_cols = 8960, max_rows = VOCAB;
    float *hx = malloc(sizeof(float) * (size_t)(max_n * max_cols));
    for (int64_t i = 0; i < max_n * max_cols; i++) hx[i] = frand();
    float *dx = g_b->ops->alloc(g_b, sizeof(float) * (size_t)(max_n * max_cols));
    float *dy = g_b->ops->alloc(g_b, sizeof(float) * (size_t)(max_n * max_rows));
    if (!dx || !dy) {
        printf("out of GPU memory for the activations\n");
        return 1;
    }
    g_b->ops->upload(g_b, dx, hx, sizeof(float) * (size_t)(max_n * max_cols));

    printf("%-6s %-15s %5s %10s %9s %9s\n", "format", "matrix", "n", "us/call", "GB/s", "TFLOP/s");
    for (int f = 0; f < n_fmt; f++) {
        lm_dtype type;
        if (!lm_dtype_from_name(fmts[f], &type) || !lm_dtype_row_bytes(type, 1536)) {
            printf("%s: unknown format\n", fmts[f]);
            continue;
        }
        double step_s = 0.0; /* n = 1: matrix time of one decode step of the whole model */
        double step_bytes = 0.0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) {
            const shape *sh = &k_shapes[s];
            lm_weight *w = make_weight(type, sh->rows, sh->cols);
            if (!w) continue;
            double bytes = (double)lm_dtype_row_bytes(type, sh->cols) * (double)sh->rows;
            for (int i = 0; i < n_ns; i++) {
                double t = time_matmul(w, dx, ns[i], dy);
                if (t < 0) {
                    printf("matmul failed: %s\n", lm_last_error());
                    break;
                }
                printf("%-6s %-15s %5lld %10.1f %9.0f %9.2f\n", fmts[f], sh->name, (long long)ns[i], t * 1e6,
                       bytes / t / 1e9, 2.0 * (double)sh->rows * (double)sh->cols * (double)ns[i] / t / 1e12);
                if (ns[i] == 1) {
                    step_s += t * sh->per_layer * N_LAYER;
                    step_bytes += bytes * sh->per_layer * N_LAYER;
                }
            }
            g_b->ops->weight_free(g_b, w);
        }
        lm_weight *head = make_weight(type, VOCAB, 1536);
        if (head) {
            double t = time_matmul(head, dx, 1, dy);
            double bytes = (double)lm_dtype_row_bytes(type, 1536) * VOCAB;
            printf("%-6s %-15s %5d %10.1f %9.0f\n", fmts[f], "head 151936x1536", 1, t * 1e6, bytes / t / 1e9);
            step_s += t;
            step_bytes += bytes;
            g_b->ops->weight_free(g_b, head);
        }
        printf("%-6s decode step, all matrices (28 layers + head), n=1: %.3f ms, %.0f GB/s, <= %.0f tokens/s\n\n",
               fmts[f], step_s * 1e3, step_bytes / step_s / 1e9, 1.0 / step_s);
    }
    g_b->ops->free(g_b, dx);
    g_b->ops->free(g_b, dy);
    free(hx);
    lm_backend_free(g_b);
    return 0;
}
