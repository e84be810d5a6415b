/* The candidate path of sampling: logits_topk on the host and the CPU backend
 * against a brute-force sort (random rows, many ties, +-0, -inf, +inf, k = 1,
 * k = n_vocab, NaN rows, bad arguments), and the candidate draw against
 * lm_sampler_sample on the full row, token for token over many rows, parameter sets
 * and steps (greedy; top_k 1..K-1 with temperature, top_p, min_p), the same errors
 * for NaN and all -inf rows, and the predicates refusing what candidates cannot
 * settle (logit bias, penalties, processors, top_k 0 or >= K, boundary ties). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "sampling/sampling.h"
#include "test.h"

static uint64_t g_rng = 0x70b4c0ffeeULL;

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

/* ---- rows ----------------------------------------------------------------------- */

typedef enum row_kind { ROW_RANDOM, ROW_TIES, ROW_NEG_INF, ROW_FEW_FINITE, ROW_POS_INF, ROW_ALL_EQUAL, ROW_KINDS } row_kind;

static void make_row(float *row, int64_t n, row_kind kind) {
    for (int64_t t = 0; t < n; t++) {
        float v = (float)(unif() * 20.0 - 10.0);
        switch (kind) {
        case ROW_TIES: /* few distinct values, +0 and -0 among them */
            v = (float)((int)(unif() * 7.0) - 3) * 0.5f;
            if (v == 0.0f && (rnd() & 1)) v = -0.0f;
            break;
        case ROW_NEG_INF:
            if (unif() < 0.3) v = -INFINITY;
            break;
        case ROW_FEW_FINITE:
            if (unif() < 0.97) v = -INFINITY;
            break;
        case ROW_POS_INF:
            if (unif() < 0.01) v = INFINITY;
            break;
        case ROW_ALL_EQUAL: v = 1.5f; break;
        default: break;
        }
        row[t] = v;
    }
}

/* ---- brute force ---------------------------------------------------------------- */

static const float *g_sort_row;

static int by_logit_then_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float vx = g_sort_row[x], vy = g_sort_row[y];
    if (vx > vy) return -1;
    if (vx < vy) return 1;
    return (x > y) - (x < y);
}

static void check_row(const float *row, int64_t n, int k, const int32_t *ids, const float *vals, float mx, float lse,
                      bool have_lse) {
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t t = 0; t < n; t++) order[t] = (int32_t)t;
    g_sort_row = row;
    qsort(order, (size_t)n, sizeof *order, by_logit_then_id);
    bool ok = true;
    for (int i = 0; i < k; i++) ok &= ids[i] == order[i] && memcmp(&vals[i], &row[order[i]], sizeof(float)) == 0;
    CHECK(ok);
    if (!ok) fprintf(stderr, "  row of %lld, k %d: first ids %d/%d\n", (long long)n, k, ids[0], order[0]);
    CHECK(mx == row[order[0]]);
    if (have_lse) {
        double ref;
        if (isinf(row[order[0]])) {
            ref = row[order[0]];
            CHECK(lse == (float)ref);
        } else {
            double sum = 0.0;
            for (int64_t t = 0; t < n; t++) sum += exp((double)row[t] - (double)row[order[0]]);
            ref = (double)row[order[0]] + log(sum);
            CHECK_NEAR(lse, ref, 1e-5 * (1.0 + fabs(ref)));
        }
    }
    free(order);
}

static void test_topk_vs_sort(void) {
    lm_backend *cpu = NULL;
    CHECK(lm_backend_cpu_create(2, &cpu) == LM_OK);
    const int64_t sizes[] = {1, 7, 64, 255, 1000, 5000};
    const int ks[] = {1, 2, 16, 64, 256};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        for (size_t ki = 0; ki <= sizeof ks / sizeof ks[0]; ki++) {
            int k = ki < sizeof ks / sizeof ks[0] ? ks[ki] : (int)(n < LM_TOPK_MAX ? n : LM_TOPK_MAX); /* k = n */
            if (k > n) continue;
            const int64_t rows = ROW_KINDS * 2;
            float *x = malloc(sizeof(float) * (size_t)(rows * n));
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)(rows * k)), *ids2 = malloc(sizeof(int32_t) * (size_t)(rows * k));
            float *vals = malloc(sizeof(float) * (size_t)(rows * k)), *vals2 = malloc(sizeof(float) * (size_t)(rows * k));
            float mx[ROW_KINDS * 2], lse[ROW_KINDS * 2], mx2[ROW_KINDS * 2];
            for (int64_t r = 0; r < rows; r++) make_row(x + r * n, n, (row_kind)(r % ROW_KINDS));
            CHECK(lm_logits_topk_host(x, rows, n, k, ids, vals, mx, lse) == LM_OK);
            for (int64_t r = 0; r < rows; r++)
                check_row(x + r * n, n, k, ids + r * k, vals + r * k, mx[r], lse[r], true);
            /* the backend's op (rows across threads, no lse) gives the same */
            CHECK(cpu->ops->logits_topk(cpu, x, rows, n, k, ids2, vals2, mx2, NULL) == LM_OK);
            CHECK(memcmp(ids, ids2, sizeof(int32_t) * (size_t)(rows * k)) == 0);
            CHECK(memcmp(vals, vals2, sizeof(float) * (size_t)(rows * k)) == 0);
            CHECK(memcmp(mx, mx2, sizeof(float) * (size_t)rows) == 0);
            free(x), free(ids), free(ids2), free(vals), free(vals2);
        }
    }
    /* a row of -inf: -inf candidates by id, max and lse -inf */
    {
        float x[10];
        for (int i = 0; i < 10; i++) x[i] = -INFINITY;
        int32_t ids[3];
        float vals[3], mx, lse;
        CHECK(lm_logits_topk_host(x, 1, 10, 3, ids, vals, &mx, &lse) == LM_OK);
        CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && vals[2] == -INFINITY && mx == -INFINITY && lse == -INFINITY);
    }
    /* NaN: that row is marked (first NaN id), the others are untouched */
    {
        enum { N = 300, K = 8 };
        float x[2 * N];
        make_row(x, N, ROW_RANDOM);
        make_row(x + N, N, ROW_RANDOM);
        x[N + 200] = NAN;
        x[N + 50] = -NAN;
        int32_t ids[2 * K];
        float vals[2 * K], mx[2], lse[2];
        CHECK(lm_logits_topk_host(x, 2, N, K, ids, vals, mx, lse) == LM_OK);
        check_row(x, N, K, ids, vals, mx[0], lse[0], true);
        CHECK(isnan(mx[1]) && isnan(lse[1]) && ids[K] == 50);
        CHECK(cpu->ops->logits_topk(cpu, x, 2, N, K, ids, vals, mx, NULL) == LM_OK);
        CHECK(isnan(mx[1]) && ids[K] == 50 && !isnan(mx[0]));
    }
    /* bad arguments */
    {
        float x[4] = {0};
        int32_t ids[LM_TOPK_MAX + 1];
        float vals[LM_TOPK_MAX + 1], mx;
        CHECK(lm_logits_topk_host(x, 1, 4, 0, ids, vals, &mx, NULL) == LM_ERR_INVALID_ARG);
        CHECK(lm_logits_topk_host(x, 1, 4, 5, ids, vals, &mx, NULL) == LM_ERR_INVALID_ARG);
        CHECK(cpu->ops->logits_topk(cpu, x, 1, 4, LM_TOPK_MAX + 1, ids, vals, &mx, NULL) == LM_ERR_INVALID_ARG);
        CHECK(strstr(lm_last_error(), "k = ") != NULL);
    }
    lm_backend_free(cpu);
}

/* ---- the candidate draw against the full row -------------------------------------- */

static lm_candidates cands_of(const float *row, size_t n, int k, int32_t *ids, float *vals) {
    float mx;
    CHECK(lm_logits_topk_host(row, 1, (int64_t)n, k, ids, vals, &mx, NULL) == LM_OK);
    return (lm_candidates){n, k, ids, vals, mx};
}

static int g_n_draws, g_n_fallbacks;

/* Two samplers of the same parameters walk `steps` rows: one from candidates
 * wherever they suffice, one from the full row; every token must agree. */
static void compare_paths(const lm_sampling_params *p, size_t n, int k, row_kind kind, int steps) {
    lm_sampler *a = NULL, *b = NULL;
    CHECK(lm_sampler_create(p, n, &a) == LM_OK && lm_sampler_create(p, n, &b) == LM_OK);
    if (!a || !b) return;
    CHECK(lm_sampler_candidates_ok(a, k));
    float *row = malloc(sizeof(float) * n);
    int32_t ids[LM_TOPK_MAX];
    float vals[LM_TOPK_MAX];
    for (int s = 0; s < steps; s++) {
        make_row(row, (int64_t)n, kind);
        lm_candidates c = cands_of(row, n, k, ids, vals);
        int32_t ta = -1, tb = -2;
        lm_status sa, sb = lm_sampler_sample(b, row, n, &tb);
        char eb[512];
        snprintf(eb, sizeof eb, "%s", lm_last_error());
        if (lm_sampler_candidates_suffice(a, &c)) {
            sa = lm_sampler_sample_candidates(a, &c, &ta);
            g_n_draws++;
        } else {
            sa = lm_sampler_sample(a, row, n, &ta);
            g_n_fallbacks++;
        }
        CHECK(sa == sb);
        if (sa == LM_OK && ta != tb) {
            fprintf(stderr, "  n %zu k %d kind %d T %g top_k %d top_p %g min_p %g step %d: %d vs %d\n", n, k, (int)kind,
                    (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p, s, ta, tb);
            CHECK(ta == tb);
        }
        if (sa) {
            CHECK(strcmp(eb, lm_last_error()) == 0);
            /* keep the histories aligned */
            lm_sampler_accept(a, 0);
            lm_sampler_accept(b, 0);
        }
    }
    CHECK(lm_sampler_n_generated(a) == lm_sampler_n_generated(b));
    free(row);
    lm_sampler_free(a);
    lm_sampler_free(b);
}

static void test_draw_equals_full(void) {
    const size_t sizes[] = {300, 2000, 20000};
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
    const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.2f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    int trial = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < ROW_KINDS; kind++)
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
                lm_sampling_params p = lm_sampling_default_params();
                p.temperature = temps[ti];
                p.seed = 1000 + (uint64_t)trial;
                int k = (trial % 3 == 0) ? 16 : LM_SAMPLER_CANDIDATES;
                p.top_k = p.temperature == 0.0f ? 0 : 1 + (int)(rnd() % (uint64_t)(k - 1));
                p.top_p = top_ps[rnd() % 4];
                p.min_p = min_ps[rnd() % 3];
                compare_paths(&p, sizes[si], k, (row_kind)kind, sizes[si] > 5000 ? 6 : 20);
                trial++;
            }
    /* every top_k from 1 to K-1 */
    for (int tk = 1; tk < LM_SAMPLER_CANDIDATES; tk++) {
        lm_sampling_params p = lm_sampling_default_params();
        p.temperature = 0.9f;
        p.top_k = tk;
        p.top_p = tk % 2 ? 0.8f : 1.0f;
        p.min_p = tk % 3 ? 0.0f : 0.02f;
        p.seed = 77 + (uint64_t)tk;
        compare_paths(&p, 1000, LM_SAMPLER_CANDIDATES, (row_kind)(tk % ROW_KINDS), 10);
    }
    /* the candidates are the whole row: any parameters */
    {
        lm_sampling_params p = lm_sampling_default_params();
        p.temperature = 0.7f;
        p.top_p = 0.9f;
        p.seed = 5;
        compare_paths(&p, 40, 40, ROW_RANDOM, 50);
        compare_paths(&p, 40, 40, ROW_TIES, 50);
    }
    printf("candidate draws: %d equal to the full row's, %d fell back (boundary ties)\n", g_n_draws, g_n_fallbacks);
    CHECK(g_n_draws > 1000);
}

static lm_status noop_proc(void *user, const int32_t *h, size_t nh, float *logits, size_t nv) {
    (void)user, (void)h, (void)nh, (void)logits, (void)nv;
    return LM_OK;
}

static bool ok_for(lm_sampling_params p, size_t n, int k) {
    lm_sampler *s = NULL;
    CHECK(lm_sampler_create(&p, n, &s) == LM_OK);
    bool ok = lm_sampler_candidates_ok(s, k);
    lm_sampler_free(s);
    return ok;
}

static void test_predicates(void) {
    const int K = LM_SAMPLER_CANDIDATES;
    lm_sampling_params g = lm_sampling_default_params();
    g.temperature = 0.0f;
    CHECK(ok_for(g, 1000, K));
    lm_sampling_params p = g;
    lm_logit_bias bias = {3, 1.0f};
    p.logit_bias = &bias;
    p.n_logit_bias = 1;
    CHECK(!ok_for(p, 1000, K));
    p = g;
    p.repetition_penalty = 1.1f;
    CHECK(!ok_for(p, 1000, K));
    p = g;
    p.presence_penalty = 0.5f;
    CHECK(!ok_for(p, 1000, K));
    p = g;
    p.frequency_penalty = 0.5f;
    CHECK(!ok_for(p, 1000, K));
    p = g;
    lm_logits_processor proc = {noop_proc, NULL};
    p.processors = &proc;
    p.n_processors = 1;
    CHECK(!ok_for(p, 1000, K));
    lm_sampling_params t = lm_sampling_default_params(); /* temperature 1, top_k 0 */
    CHECK(!ok_for(t, 1000, K));
    t.top_k = K;
    CHECK(!ok_for(t, 1000, K));
    t.top_k = K - 1;
    CHECK(ok_for(t, 1000, K));
    t.top_k = 0; /* the whole row as candidates */
    CHECK(ok_for(t, 40, 40));
    CHECK(!ok_for(t, 41, 40));

    /* boundary ties: every logit equal leaves top-k's kept set unknown */
    {
        enum { N = 500 };
        float row[N];
        make_row(row, N, ROW_ALL_EQUAL);
        int32_t ids[LM_TOPK_MAX];
        float vals[LM_TOPK_MAX];
        lm_candidates c = cands_of(row, N, K, ids, vals);
        lm_sampler *s = NULL;
        t.top_k = 5;
        CHECK(lm_sampler_create(&t, N, &s) == LM_OK);
        CHECK(!lm_sampler_candidates_suffice(s, &c));
        int32_t tok;
        CHECK(lm_sampler_sample_candidates(s, &c, &tok) == LM_ERR_INVALID_ARG);
        CHECK(lm_sampler_n_generated(s) == 0);
        /* a tie at the top-k value that ends inside the candidates is fine */
        row[0] = 3.0f;
        row[1] = 2.0f;
        c = cands_of(row, N, K, ids, vals);
        t.top_k = 2;
        lm_sampler_free(s);
        CHECK(lm_sampler_create(&t, N, &s) == LM_OK);
        CHECK(lm_sampler_candidates_suffice(s, &c));
        t.top_k = 3; /* the 3rd value, 1.5, is shared by 498 tokens */
        lm_sampler_free(s);
        CHECK(lm_sampler_create(&t, N, &s) == LM_OK);
        CHECK(!lm_sampler_candidates_suffice(s, &c));
        lm_sampler_free(s);
        /* greedy never needs more than the first */
        CHECK(lm_sampler_create(&g, N, &s) == LM_OK);
        CHECK(lm_sampler_candidates_suffice(s, &c));
        CHECK(lm_sampler_sample_candidates(s, &c, &tok) == LM_OK && tok == 0);
        lm_sampler_free(s);
    }
    /* errors are the full row's, sentence included */
    {
        enum { N = 100 };
        float row[N];
        make_row(row, N, ROW_RANDOM);
        row[70] = NAN;
        row[30] = NAN;
        int32_t ids[8], tok;
        float vals[8];
        lm_sampler *s = NULL;
        CHECK(lm_sampler_create(&g, N, &s) == LM_OK);
        CHECK(lm_sampler_sample(s, row, N, &tok) == LM_ERR_INVALID_ARG);
        char full_err[512];
        snprintf(full_err, sizeof full_err, "%s", lm_last_error());
        lm_candidates c = cands_of(row, N, 8, ids, vals);
        CHECK(lm_sampler_candidates_suffice(s, &c));
        CHECK(lm_sampler_sample_candidates(s, &c, &tok) == LM_ERR_INVALID_ARG);
        CHECK(strcmp(full_err, lm_last_error()) == 0 && strstr(full_err, "token 30") != NULL);
        for (int i = 0; i < N; i++) row[i] = -INFINITY;
        CHECK(lm_sampler_sample(s, row, N, &tok) == LM_ERR_INVALID_ARG);
        snprintf(full_err, sizeof full_err, "%s", lm_last_error());
        c = cands_of(row, N, 8, ids, vals);
        CHECK(lm_sampler_sample_candidates(s, &c, &tok) == LM_ERR_INVALID_ARG);
        CHECK(strcmp(full_err, lm_last_error()) == 0);
        CHECK(lm_sampler_n_generated(s) == 0);
        /* candidates of another vocabulary size never suffice */
        c.n_vocab = N + 1;
        CHECK(!lm_sampler_candidates_suffice(s, &c));
        lm_sampler_free(s);
    }
}

int main(void) {
    test_topk_vs_sort();
    test_draw_equals_full();
    test_predicates();
    TEST_MAIN_END();
}
