/* Matrix products and row gathers over weights in any format.
 *
 * The weight is dequantized a tile of rows at a time into f32 scratch, then every
 * token's activation row is dotted with the tile while it is hot in cache: each
 * weight byte is decoded once per call, however many tokens the batch holds. */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_q8.h"
#include "core/error.h"

/* Two paths, chosen by weight type alone (never by batch size, so a token's result
 * does not depend on what else is in the batch — DESIGN.md invariant 2):
 *  - formats with an integer kernel: activations quantized to 8 bits once per call,
 *    each weight row read straight from the file and dotted with every token while
 *    it sits in L1;
 *  - the others (F32/F16/BF16, MLX affine, Q2_K, Q3_K): rows decoded to f32 a tile at
 *    a time, then a register-blocked f32 product. */
enum { ROW_TILE = 16 };

typedef struct matmul_job {
    const lm_weight *w;
    const float *x;
    int64_t n;
    float *y;
    float *tiles; /* [n_threads][ROW_TILE * cols] */
} matmul_job;

static void matmul_worker(void *ctx, int ith, int nth) {
    const matmul_job *job = ctx;
    int64_t rows = job->w->t.ne[1], cols = job->w->t.ne[0];
    int64_t n_tiles = (rows + ROW_TILE - 1) / ROW_TILE, t0, t1;
    lm_split_range(n_tiles, ith, nth, &t0, &t1);
    float *tile = job->tiles + (size_t)ith * (size_t)(ROW_TILE * cols);
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * ROW_TILE, r1 = r0 + ROW_TILE < rows ? r0 + ROW_TILE : rows;
        for (int64_t r = r0; r < r1; r++) lm_cpu_weight_row(job->w, r, tile + (r - r0) * cols);
        lm_cpu_gemm_tile(tile, r1 - r0, job->x, job->n, cols, job->y, rows, r0);
    }
}

typedef struct q8_job {
    const lm_weight *w;
    const lm_q8a_block *a; /* [n][cols / 32] */
    int64_t n;
    float *y;
    lm_q8a_kernels k;
} q8_job;

static void q8_worker(void *ctx, int ith, int nth) {
    const q8_job *job = ctx;
    int64_t rows = job->w->t.ne[1], cols = job->w->t.ne[0], stride = cols / 32, r0, r1;
    size_t row_bytes = lm_dtype_row_bytes(job->w->t.type, cols);
    lm_split_range(rows, ith, nth, &r0, &r1);
    const uint8_t *base = job->w->t.data;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = base + (size_t)r * row_bytes;
        int64_t t = 0;
        for (; t + 4 <= job->n; t += 4) {
            float out[4];
            job->k.dot4(wr, job->a + t * stride, stride, cols, out);
            for (int i = 0; i < 4; i++) job->y[(t + i) * rows + r] = out[i];
        }
        for (; t < job->n; t++) job->y[t * rows + r] = job->k.dot(wr, job->a + t * stride, cols);
    }
}

lm_status lm_cpu_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y) {
    lm_q8a_kernels k = w->q8;
    int64_t cols = w->t.ne[0];
    if (k.dot) {
        lm_q8a_block *a = lm_cpu_scratch(b, LM_SCRATCH_Q8_ACT, (size_t)(n * (cols / 32)) * sizeof *a);
        if (a) {
            lm_q8a_style style = lm_q8a_style_for(w->t.type);
            for (int64_t t = 0; t < n; t++) lm_q8a_quantize_row(x + t * cols, a + t * (cols / 32), cols, style);
            q8_job job = {w, a, n, y, k};
            lm_threadpool_run(lm_cpu_pool(b), q8_worker, &job);
            return LM_OK;
        }
        /* no memory for the quantized activations: the f32 path needs none */
    }
    int nth = lm_threadpool_size(lm_cpu_pool(b));
    float *tiles = lm_cpu_scratch(b, LM_SCRATCH_TILES, (size_t)nth * (size_t)(ROW_TILE * cols) * sizeof(float));
    if (!tiles) return lm_error(LM_ERR_NO_MEMORY, "out of memory for matrix-product tiles");
    matmul_job job = {w, x, n, y, tiles};
    lm_threadpool_run(lm_cpu_pool(b), matmul_worker, &job);
    return LM_OK;
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
