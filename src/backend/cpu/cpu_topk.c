/* logits_topk on the host (backend.h): the k largest logits of each row, best first
 * with ties by lower id, the row's max and log-sum-exp. The plain version is the
 * op's definition; the CPU backend runs it with the rows split across its threads,
 * and the forward pass runs it on downloaded logits for a backend without the op. */
#include <math.h>
#include <stdbool.h>

#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

/* Candidate a ranks below b: a smaller logit, or an equal one with a higher id. */
static bool below(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void swap_entry(float *v, int32_t *id, int64_t i, int64_t j) {
    float tv = v[i];
    v[i] = v[j];
    v[j] = tv;
    int32_t ti = id[i];
    id[i] = id[j];
    id[j] = ti;
}

/* Min-heap by `below`: the root is the worst of the candidates kept so far. */
static void heap_down(float *v, int32_t *id, int64_t n, int64_t i) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && below(v[c + 1], id[c + 1], v[c], id[c])) c++;
        if (!below(v[c], id[c], v[i], id[i])) return;
        swap_entry(v, id, i, c);
        i = c;
    }
}

/* The row's NaN marking (backend.h): the first NaN is at t. */
static void mark_nan(const float *row, int64_t t, int k, int32_t *ids, float *vals, float *row_max, float *row_lse) {
    ids[0] = (int32_t)t;
    vals[0] = row[t];
    for (int i = 1; i < k; i++) ids[i] = -1, vals[i] = NAN;
    *row_max = NAN;
    if (row_lse) *row_lse = NAN;
}

static void topk_row(const float *row, int64_t n, int k, int32_t *ids, float *vals, float *row_max,
                     float *row_lse) {
    /* one pass with a min-heap of the k best: once it is full, almost every entry
     * fails the one comparison with its root (l <= worst: scanning ids upward, an
     * equal logit never displaces a lower id). A NaN fails every comparison, so it
     * takes the slow branch, where the first one ends the row. */
    int64_t t = 0;
    for (; t < k; t++) {
        float l = row[t];
        if (isnan(l)) return mark_nan(row, t, k, ids, vals, row_max, row_lse);
        int64_t i = t;
        vals[i] = l;
        ids[i] = (int32_t)t;
        while (i > 0 && below(vals[i], ids[i], vals[(i - 1) / 2], ids[(i - 1) / 2])) {
            swap_entry(vals, ids, i, (i - 1) / 2);
            i = (i - 1) / 2;
        }
    }
    for (; t < n; t++) {
        float l = row[t];
        if (l <= vals[0]) continue;
        if (isnan(l)) return mark_nan(row, t, k, ids, vals, row_max, row_lse);
        vals[0] = l;
        ids[0] = (int32_t)t;
        heap_down(vals, ids, k, 0);
    }
    /* heap sort in place: popping the worst to the back leaves the best first */
    for (int64_t last = k - 1; last > 0; last--) {
        swap_entry(vals, ids, 0, last);
        heap_down(vals, ids, last, 0);
    }
    const float mx = vals[0];
    *row_max = mx;
    if (!row_lse) return;
    if (isinf(mx)) { /* all -inf: -inf; a +inf logit: +inf */
        *row_lse = mx;
        return;
    }
    double sum = 0.0;
    for (t = 0; t < n; t++) sum += exp((double)row[t] - (double)mx);
    *row_lse = (float)((double)mx + log(sum));
}

static lm_status check_args(int64_t n_rows, int64_t n_vocab, int k) {
    if (n_rows < 0 || n_vocab <= 0 || n_vocab > INT32_MAX)
        return lm_error(LM_ERR_INVALID_ARG, "logits_topk: %lld rows of %lld logits", (long long)n_rows,
                        (long long)n_vocab);
    if (k < 1 || k > LM_TOPK_MAX || k > n_vocab)
        return lm_error(LM_ERR_INVALID_ARG, "logits_topk: k = %d must be in [1, %d] and at most n_vocab (%lld)", k,
                        LM_TOPK_MAX, (long long)n_vocab);
    return LM_OK;
}

lm_status lm_logits_topk_host(const float *logits, int64_t n_rows, int64_t n_vocab, int k, int32_t *ids,
                              float *vals, float *row_max, float *row_lse) {
    lm_status st = check_args(n_rows, n_vocab, k);
    if (st) return st;
    for (int64_t r = 0; r < n_rows; r++)
        topk_row(logits + r * n_vocab, n_vocab, k, ids + r * k, vals + r * k, row_max + r,
                 row_lse ? row_lse + r : NULL);
    return LM_OK;
}

typedef struct topk_job {
    const float *logits;
    int64_t n_vocab;
    int k;
    int32_t *ids;
    float *vals, *row_max, *row_lse;
} topk_job;

static void topk_rows(void *ctx, int64_t begin, int64_t end) {
    const topk_job *j = ctx;
    lm_logits_topk_host(j->logits + begin * j->n_vocab, end - begin, j->n_vocab, j->k, j->ids + begin * j->k,
                        j->vals + begin * j->k, j->row_max + begin, j->row_lse ? j->row_lse + begin : NULL);
}

lm_status lm_cpu_logits_topk(lm_backend *b, const float *logits, int64_t n_rows, int64_t n_vocab, int k,
                             int32_t *ids, float *vals, float *row_max, float *row_lse) {
    lm_status st = check_args(n_rows, n_vocab, k);
    if (st) return st;
    topk_job j = {logits, n_vocab, k, ids, vals, row_max, row_lse};
    lm_cpu_parallel_for(b, n_rows, 1, topk_rows, &j);
    return LM_OK;
}
