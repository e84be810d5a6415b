/* Matrix products and row gathers over weights in any format: each weight byte is
 * decoded once per call, however many tokens the batch holds. */

#include <stdatomic.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_q8.h"
#include "core/error.h"

/* Two paths, chosen by weight type alone (never by batch size, so a token's result
 * does not depend on what else is in the batch — DESIGN.md invariant 2):
 *  - formats with an integer kernel: activations quantized to 8 bits once per call,
 *    then the matrix-vector kernel (few tokens: weights read straight from the file)
 *    or the tiled one (a panel of rows decoded once, then every token), which give
 *    the same bits (cpu_q8.h);
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

enum { MAX_MANY = 4 };

/* Batches of up to this many tokens take the matrix-vector kernel; larger ones pack
 * each panel of rows once and run the tiled kernel over all tokens. Both compute the
 * same arithmetic bit for bit (cpu_q8.h), so the choice never changes a result. */
enum { GEMV_MAX_TOKENS = 3 };

/* Rows of up to MAX_MANY weights sharing one quantized input, split across threads
 * in units of LM_Q8A_PANEL_ROWS rows (weight 0's units, then weight 1's, ...). */
typedef struct q8_job {
    const lm_weight *w[MAX_MANY];
    float *y[MAX_MANY];
    int n_w;
    const lm_q8a_block *a; /* [n][cols / 32] */
    int64_t n;
    bool tiled;
    uint8_t *panels;       /* [n_threads][panel_stride] when tiled */
    size_t panel_stride;
    _Atomic int64_t next;  /* the next unit to take */
} q8_job;

static int64_t units_of(const lm_weight *w) { return (w->t.ne[1] + LM_Q8A_PANEL_ROWS - 1) / LM_Q8A_PANEL_ROWS; }

static void q8_unit(const q8_job *job, const lm_weight *w, float *y, int64_t u, uint8_t *panel) {
    int64_t rows = w->t.ne[1], cols = w->t.ne[0], stride = cols / 32;
    size_t row_bytes = lm_dtype_row_bytes(w->t.type, cols);
    int64_t r0 = u * LM_Q8A_PANEL_ROWS;
    int nr = (int)(rows - r0 < LM_Q8A_PANEL_ROWS ? rows - r0 : LM_Q8A_PANEL_ROWS);
    const uint8_t *wr = (const uint8_t *)w->t.data + (size_t)r0 * row_bytes;
    if (job->tiled) {
        w->q8.pack(wr, row_bytes, nr, cols, panel);
        w->q8.tile(panel, nr, job->a, stride, job->n, cols, y + r0, rows);
        return;
    }
    int g = w->q8.gemv_rows;
    for (int r = 0; r < nr; r += g)
        w->q8.gemv(wr + (size_t)r * row_bytes, row_bytes, nr - r < g ? nr - r : g, job->a, stride, job->n, cols,
                   y + r0 + r, rows);
}

/* Units are handed out from a shared counter rather than split in fixed shares: on a
 * machine where a thread loses its core for a while, the others take over its units
 * instead of waiting for them. Matrix-vector work goes in runs of consecutive units
 * (about 8 runs per thread), so each thread still streams contiguous rows. A unit's
 * result is the same whichever thread computes it. */
static void q8_worker(void *ctx, int ith, int nth) {
    q8_job *job = ctx;
    uint8_t *panel = job->tiled ? job->panels + (size_t)ith * job->panel_stride : NULL;
    int64_t total = 0;
    for (int i = 0; i < job->n_w; i++) total += units_of(job->w[i]);
    int64_t run = job->tiled ? 1 : total / (8 * (int64_t)nth);
    if (run < 1) run = 1;
    for (;;) {
        int64_t u0 = atomic_fetch_add_explicit(&job->next, run, memory_order_relaxed);
        if (u0 >= total) return;
        int64_t u1 = u0 + run < total ? u0 + run : total;
        for (int64_t g = u0; g < u1; g++) {
            int64_t u = g;
            int i = 0;
            while (u >= units_of(job->w[i])) u -= units_of(job->w[i]), i++;
            q8_unit(job, job->w[i], job->y[i], u, panel);
        }
    }
}

/* Runs the integer kernels over weights sharing the quantized input a. */
static lm_status q8_run(lm_backend *b, const lm_weight *const *w, int n_w, const lm_q8a_block *a, int64_t n,
                        float *const *y) {
    q8_job job = {.n_w = n_w, .a = a, .n = n, .tiled = n > GEMV_MAX_TOKENS};
    for (int i = 0; i < n_w; i++) {
        job.w[i] = w[i], job.y[i] = y[i];
        if (!w[i]->q8.pack) job.tiled = false;
    }
    if (job.tiled) {
        for (int i = 0; i < n_w; i++) {
            size_t bytes = (w[i]->q8.panel_bytes(w[i]->t.ne[0]) + 63) & ~(size_t)63;
            if (bytes > job.panel_stride) job.panel_stride = bytes;
        }
        int nth = lm_threadpool_size(lm_cpu_pool(b));
        job.panels = lm_cpu_scratch(b, LM_SCRATCH_PANEL, job.panel_stride * (size_t)nth);
        if (!job.panels) job.tiled = false; /* the matrix-vector kernel needs no panel */
    }
    lm_threadpool_run(lm_cpu_pool(b), q8_worker, &job);
    return LM_OK;
}

typedef struct quant_job {
    const float *x;
    lm_q8a_block *a;
    int64_t cols;
    lm_q8a_style style;
} quant_job;

static void quantize_rows(void *ctx, int64_t t0, int64_t t1) {
    const quant_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) lm_q8a_quantize_row(j->x + t * j->cols, j->a + t * (j->cols / 32), j->cols, j->style);
}

/* Quantizes x once for the style of w[0]; NULL when the weights cannot share it. */
static lm_q8a_block *quantize_for(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n) {
    int64_t cols = w[0]->t.ne[0];
    lm_q8a_style style = lm_q8a_style_for(w[0]->t.type);
    for (int i = 0; i < n_w; i++)
        if (!w[i]->q8.gemv || w[i]->t.ne[0] != cols || lm_q8a_style_for(w[i]->t.type) != style) return NULL;
    lm_q8a_block *a = lm_cpu_scratch(b, LM_SCRATCH_Q8_ACT, (size_t)(n * (cols / 32)) * sizeof *a);
    if (a) {
        quant_job job = {x, a, cols, style};
        lm_cpu_parallel_for(b, n, 8, quantize_rows, &job);
    }
    return a;
}

lm_status lm_cpu_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y) {
    int64_t cols = w->t.ne[0];
    if (w->q8.gemv) {
        lm_q8a_block *a = quantize_for(b, &w, 1, x, n);
        if (a) return q8_run(b, &w, 1, a, n, &y);
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

lm_status lm_cpu_matmul_many(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                             float *const *y) {
    lm_q8a_block *a = n_w <= MAX_MANY ? quantize_for(b, w, n_w, x, n) : NULL;
    if (!a) {
        for (int i = 0; i < n_w; i++) {
            lm_status st = lm_cpu_matmul(b, w[i], x, n, y[i]);
            if (st) return st;
        }
        return LM_OK;
    }
    return q8_run(b, w, n_w, a, n, y);
}
