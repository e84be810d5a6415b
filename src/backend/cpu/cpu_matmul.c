/* Matrix products and row gathers over weights in any format.
 *
 * The weight is dequantized a tile of rows at a time into f32 scratch, then every
 * token's activation row is dotted with the tile while it is hot in cache: each
 * weight byte is decoded once per call, however many tokens the batch holds. */
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_q8.h"

enum {
    ROW_TILE = 8,
    /* up to this many tokens, quantized weights take the integer path: activations
     * quantized to 8 bits once, each weight row read once per token straight from
     * the file; beyond, decoding rows to f32 once per call pays off */
    Q8_MAX_TOKENS = 4,
};

__attribute__((target_clones("avx512f", "avx2", "default")))
float lm_cpu_dot_f32(const float *a, const float *b, int64_t n) {
    /* 16 independent partial sums: lets the compiler keep them in vector lanes
     * without reassociating a single running sum. */
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    for (int j = 0; j < 8; j++) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; j++) acc[j] += acc[j + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]) + tail;
}

typedef struct matmul_job {
    const lm_weight *w;
    const float *x;
    int64_t n;
    float *y;
} matmul_job;

static void matmul_worker(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    int64_t rows = job->w->t.ne[1], cols = job->w->t.ne[0];
    int64_t n_tiles = (rows + ROW_TILE - 1) / ROW_TILE, t0, t1;
    lm_split_range(n_tiles, ith, nth, &t0, &t1);
    if (t0 >= t1) return;
    float *tile = malloc((size_t)(ROW_TILE * cols) * sizeof(float));
    if (!tile) return; /* unreachable in practice: a few KiB; output stays as is */
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * ROW_TILE, r1 = r0 + ROW_TILE < rows ? r0 + ROW_TILE : rows;
        for (int64_t r = r0; r < r1; r++) lm_cpu_weight_row(job->w, r, tile + (r - r0) * cols);
        for (int64_t tok = 0; tok < job->n; tok++) {
            const float *xr = job->x + tok * cols;
            float *yr = job->y + tok * rows;
            for (int64_t r = r0; r < r1; r++) yr[r] = lm_cpu_dot_f32(tile + (r - r0) * cols, xr, cols);
        }
    }
    free(tile);
}

typedef struct q8_job {
    const lm_weight *w;
    const lm_q8a_block *a; /* [n][cols / 32] */
    int64_t n;
    float *y;
    lm_q8a_dot_fn dot;
} q8_job;

static void q8_worker(void *ctx, int ith, int nth) {
    const q8_job *job = ctx;
    int64_t rows = job->w->t.ne[1], cols = job->w->t.ne[0], r0, r1;
    size_t row_bytes = lm_dtype_row_bytes(job->w->t.type, cols);
    lm_split_range(rows, ith, nth, &r0, &r1);
    const uint8_t *base = job->w->t.data;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < job->n; t++)
            job->y[t * rows + r] = job->dot(base + (size_t)r * row_bytes, job->a + t * (cols / 32), cols);
}

void lm_cpu_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y) {
    lm_q8a_dot_fn dot = n <= Q8_MAX_TOKENS && w->t.type != LM_DTYPE_AFFINE ? lm_q8a_dot_for(w->t.type) : NULL;
    lm_q8a_block stack[Q8_MAX_TOKENS * 512];
    int64_t cols = w->t.ne[0], n_blocks = n * (cols / 32);
    if (dot && n_blocks <= (int64_t)(sizeof stack / sizeof stack[0])) {
        for (int64_t t = 0; t < n; t++) lm_q8a_quantize_row(x + t * cols, stack + t * (cols / 32), cols);
        q8_job job = {w, stack, n, y, dot};
        lm_threadpool_run(lm_cpu_pool(b), q8_worker, &job);
        return;
    }
    matmul_job job = {w, x, n, y};
    lm_threadpool_run(lm_cpu_pool(b), matmul_worker, &job);
}

typedef struct get_rows_job {
    const lm_weight *table;
    const int32_t *ids;
    int64_t n;
    float *out;
} get_rows_job;

static void get_rows_worker(void *ctx, int ith, int nth) {
    const get_rows_job *job = ctx;
    int64_t i0, i1, cols = job->table->t.ne[0];
    lm_split_range(job->n, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) lm_cpu_weight_row(job->table, job->ids[i], job->out + i * cols);
}

void lm_cpu_get_rows(lm_backend *b, const lm_weight *table, const int32_t *ids, int64_t n, float *out) {
    get_rows_job job = {table, ids, n, out};
    lm_threadpool_run(lm_cpu_pool(b), get_rows_worker, &job);
}
