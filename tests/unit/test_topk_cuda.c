/* The CUDA backend's logits_topk against the CPU reference (lm_logits_topk_host):
 * rows of many kinds (random, a realistic spread, few distinct values with +-0,
 * -inf entries, fewer finite logits than k, +inf, all equal, NaN) for vocabularies
 * from 1 to 5,000,000 (one slice, many, a short last one, and the candidate levels
 * the largest need) and k from 1 to 256 (and k = n_vocab): ids, values and max bit
 * for bit, log-sum-exp within 1e-6; ties and NaNs placed on the GPU's slice
 * boundaries (slices of 4096 logits: cuda_topk.cu); a row's outputs bit for bit the
 * same alone as among 37 or 12 rows (batch invariance); outputs in page-locked and
 * in ordinary host memory; lm_forward_topk on a tiny model equal to lm_forward's
 * logits reduced on the host; and the time of the op for 1, 64 and 256 rows of a 152k
 * vocabulary beside the download it replaces. Exits 77 (skipped) without a CUDA
 * build or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "test.h"
#include "tiny_model.h"

static lm_backend *g_gpu;
static uint64_t g_rng = 0xc0dacafeULL;

static double unif(void) { return (double)(tiny_rng(&g_rng) >> 11) * (1.0 / 9007199254740992.0); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { K_RANDOM, K_SPREAD, K_TIES, K_NEG_INF, K_FEW_FINITE, K_POS_INF, K_EQUAL, K_NAN, KINDS };

static void make_row(float *row, int64_t n, int kind) {
    for (int64_t t = 0; t < n; t++) {
        float v = (float)(unif() * 40.0 - 20.0);
        switch (kind) {
        case K_SPREAD: { /* roughly normal, sigma 2: logits crowd into a few exponents */
            double s = 0;
            for (int i = 0; i < 4; i++) s += unif() - 0.5;
            v = (float)(s * 3.4);
            break;
        }
        case K_TIES:
            v = (float)((int)(unif() * 9.0) - 4) * 0.25f;
            if (v == 0.0f && unif() < 0.5) v = -0.0f;
            break;
        case K_NEG_INF:
            if (unif() < 0.4) v = -INFINITY;
            break;
        case K_FEW_FINITE:
            if (unif() < 0.995) v = -INFINITY;
            break;
        case K_POS_INF:
            if (unif() < 0.002) v = INFINITY;
            break;
        case K_EQUAL: v = -3.0f; break;
        default: break;
        }
        row[t] = v;
    }
    if (kind == K_NAN && n > 2) {
        row[n - 1] = NAN;
        row[n / 2] = -NAN;
    }
}

static void *gpu_upload(const void *h, size_t bytes) {
    void *d = g_gpu->ops->alloc(g_gpu, bytes);
    CHECK(d != NULL);
    if (d) g_gpu->ops->upload(g_gpu, d, h, bytes);
    return d;
}

/* the host rows x [n_rows][n_vocab] through both, compared; `what` names the case */
static void check_rows(const float *x, int64_t n_rows, int64_t n_vocab, int k, bool pinned, const char *what) {
    size_t nx = (size_t)(n_rows * n_vocab), nk = (size_t)(n_rows * k);
    int32_t *ids = malloc(sizeof(int32_t) * nk);
    float *vals = malloc(sizeof(float) * nk), *mx = malloc(sizeof(float) * (size_t)n_rows),
          *lse = malloc(sizeof(float) * (size_t)n_rows);
    CHECK(lm_logits_topk_host(x, n_rows, n_vocab, k, ids, vals, mx, lse) == LM_OK);
    int32_t *gids = pinned ? lm_backend_host_alloc(g_gpu, sizeof(int32_t) * nk) : malloc(sizeof(int32_t) * nk);
    float *gvals = pinned ? lm_backend_host_alloc(g_gpu, sizeof(float) * nk) : malloc(sizeof(float) * nk);
    float *gmx = malloc(sizeof(float) * (size_t)n_rows), *glse = malloc(sizeof(float) * (size_t)n_rows);
    float *d = gpu_upload(x, sizeof(float) * nx);
    lm_status st = g_gpu->ops->logits_topk(g_gpu, d, n_rows, n_vocab, k, gids, gvals, gmx, glse);
    if (st) fprintf(stderr, "logits_topk: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    int bad = 0;
    for (int64_t r = 0; st == LM_OK && r < n_rows; r++) {
        const int32_t *a = ids + r * k, *b = gids + r * k;
        bool ok;
        if (isnan(mx[r])) {
            ok = isnan(gmx[r]) && isnan(glse[r]) && a[0] == b[0];
        } else {
            ok = memcmp(a, b, sizeof(int32_t) * (size_t)k) == 0 &&
                 memcmp(vals + r * k, gvals + r * k, sizeof(float) * (size_t)k) == 0 &&
                 memcmp(&mx[r], &gmx[r], sizeof(float)) == 0; /* -0 and +0 too */
            if (isinf(lse[r]))
                ok &= lse[r] == glse[r];
            else
                ok &= fabs((double)lse[r] - (double)glse[r]) <= 1e-6 * (1.0 + fabs((double)lse[r]));
        }
        if (!ok && bad++ < 3) {
            int i = 0;
            while (i < k - 1 && a[i] == b[i]) i++;
            fprintf(stderr,
                    "  %s: %lld rows x %lld, k %d, row %lld: first ids cpu %d gpu %d, at %d cpu %d gpu %d, "
                    "max %g/%g, lse %.9g/%.9g\n",
                    what, (long long)n_rows, (long long)n_vocab, k, (long long)r, a[0], b[0], i, a[i], b[i],
                    (double)mx[r], (double)gmx[r], (double)lse[r], (double)glse[r]);
        }
    }
    CHECK(bad == 0);
    /* without log-sum-exp (k = 1 takes cuda_topk_argmax.cu then): the same candidates,
     * logits and max to the bit, NaN rows marked by their first NaN */
    if (st == LM_OK && n_rows > 0) {
        CHECK(g_gpu->ops->logits_topk(g_gpu, d, n_rows, n_vocab, k, gids, gvals, gmx, NULL) == LM_OK);
        bad = 0;
        for (int64_t r = 0; r < n_rows; r++) {
            const bool ok = isnan(mx[r]) ? isnan(gmx[r]) && ids[r * k] == gids[r * k]
                                         : memcmp(ids + r * k, gids + r * k, sizeof(int32_t) * (size_t)k) == 0 &&
                                               memcmp(vals + r * k, gvals + r * k, sizeof(float) * (size_t)k) == 0 &&
                                               memcmp(&mx[r], &gmx[r], sizeof(float)) == 0;
            if (!ok && bad++ < 3)
                fprintf(stderr, "  %s without lse: %lld rows x %lld, k %d, row %lld: first ids cpu %d gpu %d\n", what,
                        (long long)n_rows, (long long)n_vocab, k, (long long)r, ids[r * k], gids[r * k]);
        }
        CHECK(bad == 0);
    }
    g_gpu->ops->free(g_gpu, d);
    if (pinned) {
        lm_backend_host_free(g_gpu, gids);
        lm_backend_host_free(g_gpu, gvals);
    } else {
        free(gids), free(gvals);
    }
    free(ids), free(vals), free(mx), free(lse), free(gmx), free(glse);
}

/* n_rows rows of n_vocab, the kinds in turn, through both, compared */
static void run_case(int64_t n_rows, int64_t n_vocab, int k, bool pinned) {
    float *x = malloc(sizeof(float) * (size_t)(n_rows * n_vocab));
    for (int64_t r = 0; r < n_rows; r++) make_row(x + r * n_vocab, n_vocab, (int)(r % KINDS));
    check_rows(x, n_rows, n_vocab, k, pinned, "kinds");
    free(x);
}

/* ties, NaNs and infinities on the GPU's slice boundaries (4096 logits a slice) */
static void test_boundaries(void) {
    enum { SL = 4096, ROWS = 8 };
    const int64_t n = 3 * SL + 17; /* a short last slice */
    float *x = malloc(sizeof(float) * (size_t)(ROWS * n));
    for (int64_t t = 0; t < ROWS * n; t++) x[t] = -1.0f;
    float *r0 = x, *r1 = x + n, *r2 = x + 2 * n, *r3 = x + 3 * n, *r4 = x + 4 * n, *r5 = x + 5 * n,
          *r6 = x + 6 * n, *r7 = x + 7 * n;
    /* row 0: equal best logits on either side of each boundary, a band of equal
     * seconds across two of them */
    const int64_t best[] = {SL - 1, SL, 2 * SL - 1, 2 * SL, 3 * SL, n - 1};
    for (size_t i = 0; i < sizeof best / sizeof best[0]; i++) r0[best[i]] = 5.0f;
    for (int64_t t = SL - 100; t < SL + 100; t++)
        if (r0[t] != 5.0f) r0[t] = 4.0f;
    for (int64_t t = 2 * SL - 150; t < 2 * SL + 150; t++)
        if (r0[t] != 5.0f) r0[t] = 4.0f;
    /* row 1: 100 equal logits at the end of slice 0, 300 at the start of slice 1,
     * the rest -inf: k = 256 takes all of the first and the lowest 156 of the second */
    for (int64_t t = 0; t < n; t++) r1[t] = (t >= SL - 100 && t < SL + 300) ? 1.0f : -INFINITY;
    /* row 2: NaNs in slices 1, 2 and the last: the first is 5000 */
    r2[9000] = -NAN;
    r2[5000] = NAN;
    r2[n - 1] = NAN;
    /* row 3: +inf on both sides of a boundary */
    r3[SL] = INFINITY;
    r3[SL - 1] = INFINITY;
    r3[7] = 3.0f;
    /* row 4: all -inf */
    for (int64_t t = 0; t < n; t++) r4[t] = -INFINITY;
    /* row 5: all zeros, -0 and +0 alternating: ids 0..k-1, the max -0 or +0 as the reference has it */
    for (int64_t t = 0; t < n; t++) r5[t] = (t & 1) ? 0.0f : -0.0f;
    /* row 6: the best only in the short last slice, equal seconds in every slice's last 40 */
    r6[n - 3] = 2.0f;
    for (int64_t s = 0; s < 4; s++)
        for (int64_t t = s * SL + SL - 40; t < s * SL + SL && t < n; t++)
            if (r6[t] != 2.0f) r6[t] = 1.5f;
    /* row 7: a NaN as the very first logit */
    r7[0] = NAN;
    const int ks[] = {1, 4, 6, 7, 64, 100, 256};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) check_rows(x, ROWS, n, ks[i], i % 2 == 0, "boundaries");
    free(x);
}

/* batch invariance: each row alone, and among 12 rows, gives the bits it gives
 * among all n_rows (37), NaN rows' outputs included */
static void test_invariance(int64_t n_vocab, int k) {
    enum { ROWS = 37, SUB0 = 5, SUB = 12 };
    size_t nx = (size_t)(ROWS * n_vocab), nk = (size_t)(ROWS * k);
    float *x = malloc(sizeof(float) * nx);
    for (int64_t r = 0; r < ROWS; r++) make_row(x + r * n_vocab, n_vocab, (int)(r % KINDS));
    float *d = gpu_upload(x, sizeof(float) * nx);
    int32_t *ids = malloc(sizeof(int32_t) * nk), *ids1 = malloc(sizeof(int32_t) * nk);
    float *vals = malloc(sizeof(float) * nk), *vals1 = malloc(sizeof(float) * nk);
    float mx[ROWS], lse[ROWS], mx1[ROWS], lse1[ROWS];
    if (d) {
        CHECK(g_gpu->ops->logits_topk(g_gpu, d, ROWS, n_vocab, k, ids, vals, mx, lse) == LM_OK);
        for (int64_t r = 0; r < ROWS; r++)
            CHECK(g_gpu->ops->logits_topk(g_gpu, d + r * n_vocab, 1, n_vocab, k, ids1 + r * k, vals1 + r * k, mx1 + r,
                                          lse1 + r) == LM_OK);
        int bad = 0;
        for (int64_t r = 0; r < ROWS; r++) {
            bool ok = memcmp(ids + r * k, ids1 + r * k, sizeof(int32_t) * (size_t)k) == 0 &&
                      memcmp(vals + r * k, vals1 + r * k, sizeof(float) * (size_t)k) == 0 &&
                      memcmp(&mx[r], &mx1[r], sizeof(float)) == 0 && memcmp(&lse[r], &lse1[r], sizeof(float)) == 0;
            if (!ok && bad++ < 3)
                fprintf(stderr, "  invariance %lld x %lld, k %d: row %lld alone differs (lse %.9g / %.9g)\n",
                        (long long)ROWS, (long long)n_vocab, k, (long long)r, (double)lse[r], (double)lse1[r]);
        }
        CHECK(bad == 0);
        CHECK(g_gpu->ops->logits_topk(g_gpu, d + SUB0 * n_vocab, SUB, n_vocab, k, ids1, vals1, mx1, lse1) == LM_OK);
        CHECK(memcmp(ids + SUB0 * k, ids1, sizeof(int32_t) * (size_t)(SUB * k)) == 0);
        CHECK(memcmp(vals + SUB0 * k, vals1, sizeof(float) * (size_t)(SUB * k)) == 0);
        CHECK(memcmp(mx + SUB0, mx1, sizeof(float) * SUB) == 0 && memcmp(lse + SUB0, lse1, sizeof(float) * SUB) == 0);
        g_gpu->ops->free(g_gpu, d);
    }
    free(x), free(ids), free(ids1), free(vals), free(vals1);
}

static void test_op(void) {
    const int64_t vocabs[] = {1, 3, 100, 1000, 4097, 32000, 151936, 262144};
    const int ks[] = {1, 2, 8, 64, 100, 256};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        int64_t n = vocabs[vi];
        int64_t rows = n >= 100000 ? 2 * KINDS : 3 * KINDS;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            if (ks[ki] <= n) run_case(rows, n, ks[ki], ki % 2 == 0);
        if (n <= LM_TOPK_MAX) run_case(rows, n, (int)n, true); /* k = n_vocab */
    }
    run_case(256, 2048, 64, true); /* many blocks */
    run_case(KINDS, 300000, 256, false); /* 74 slices x 256 candidates: a level between */
    run_case(KINDS, 300000, 100, true);
    run_case(2, 5000000, 256, true); /* two levels between */
    run_case(2, 5000000, 3, false);
    test_boundaries();
    test_invariance(151936, 64);
    test_invariance(151936, 256);
    test_invariance(300000, 256);
    test_invariance(1000, 8);
    /* bad arguments */
    int32_t ids[4];
    float vals[4], mx;
    float *d = g_gpu->ops->alloc(g_gpu, 64);
    CHECK(g_gpu->ops->logits_topk(g_gpu, d, 1, 4, 0, ids, vals, &mx, NULL) == LM_ERR_INVALID_ARG);
    CHECK(g_gpu->ops->logits_topk(g_gpu, d, 1, 4, 5, ids, vals, &mx, NULL) == LM_ERR_INVALID_ARG);
    CHECK(g_gpu->ops->logits_topk(g_gpu, d, 0, 4, 2, ids, vals, &mx, NULL) == LM_OK);
    g_gpu->ops->free(g_gpu, d);
}

static bool want_row_two(void *user, int64_t row) {
    (void)user;
    return row == 2;
}

/* lm_forward_topk on the GPU equals the GPU's logits reduced on the host, over
 * enough steps that the pass runs directly, is recorded and is replayed
 * (cuda_graph.cu): first without the log-sum-exp, then with it and one row's full
 * logits asked for; then the first steps again on a new cache, equal to the first
 * time. */
static void test_forward(void) {
    char dir[] = "/tmp/lumen_topk_cuda_XXXXXX", path[256];
    if (!mkdtemp(dir)) {
        CHECK(false);
        return;
    }
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    tiny_spec s = tiny_default(LM_ARCH_LLAMA);
    tiny_model tm;
    tiny_build(&tm, s);
    CHECK(tiny_write_gguf(&tm, path, NULL) == LM_OK);
    tiny_free(&tm);
    lm_model_internal *m = NULL;
    CHECK(lm_model_internal_load(path, g_gpu, &m) == LM_OK);
    if (m) {
        enum { N = 6, K = 16, STEPS = 12, LSE_FROM = 6 };
        int64_t nv = m->hp.n_vocab;
        lm_kv_cache *kv1 = NULL, *kv2 = NULL;
        CHECK(lm_kv_cache_for_model(m, 64, N, LM_DTYPE_F16, &kv1) == LM_OK);
        CHECK(lm_kv_cache_for_model(m, 64, N, LM_DTYPE_F16, &kv2) == LM_OK);
        float *logits = malloc(sizeof(float) * (size_t)(N * nv)), *full = malloc(sizeof(float) * (size_t)(N * nv));
        float mx[N], hmx[N], lse[N], hlse[N];
        int32_t ids[N * K], hids[N * K];
        float vals[N * K], hvals[N * K];
        int8_t fetched[N];
        int32_t first_ids[LSE_FROM][N * K];
        float first_vals[LSE_FROM][N * K];
        int lse_bad = 0;
        for (int step = 0; step < STEPS && kv1 && kv2 && logits && full; step++) {
            int32_t tok[N], pos[N], seq[N];
            int8_t want[N];
            for (int i = 0; i < N; i++) tok[i] = (step * 7 + i * 13) % (int32_t)nv, pos[i] = step, seq[i] = i, want[i] = 1;
            lm_batch b = {N, tok, pos, seq, want};
            const bool with_lse = step >= LSE_FROM;
            lm_topk_out out = {K, ids, vals, mx, NULL, NULL, NULL, NULL, NULL};
            if (with_lse) out.row_lse = lse, out.need_full = want_row_two, out.full = full, out.fetched = fetched;
            CHECK(lm_forward_topk(m, kv1, &b, &out) == LM_OK);
            CHECK(lm_forward(m, kv2, &b, logits) == LM_OK);
            CHECK(lm_logits_topk_host(logits, N, nv, K, hids, hvals, hmx, hlse) == LM_OK);
            CHECK(memcmp(ids, hids, sizeof ids) == 0 && memcmp(vals, hvals, sizeof vals) == 0);
            CHECK(memcmp(mx, hmx, sizeof mx) == 0);
            if (!with_lse) {
                memcpy(first_ids[step], ids, sizeof ids);
                memcpy(first_vals[step], vals, sizeof vals);
                continue;
            }
            for (int i = 0; i < N; i++) {
                lse_bad += fabsf(lse[i] - hlse[i]) > 1e-6f * fmaxf(1.0f, fabsf(hlse[i]));
                CHECK(fetched[i] == (i == 2));
            }
            CHECK(memcmp(full + 2 * nv, logits + 2 * nv, sizeof(float) * (size_t)nv) == 0);
        }
        CHECK(lse_bad == 0);
        /* a new cache (its passes replay the first cache's recordings where its key
         * is the same, else record their own): the first steps again give the same
         * candidates */
        lm_kv_cache_free(kv1);
        kv1 = NULL;
        CHECK(lm_kv_cache_for_model(m, 64, N, LM_DTYPE_F16, &kv1) == LM_OK);
        for (int step = 0; step < LSE_FROM && kv1; step++) {
            int32_t tok[N], pos[N], seq[N];
            int8_t want[N];
            for (int i = 0; i < N; i++) tok[i] = (step * 7 + i * 13) % (int32_t)nv, pos[i] = step, seq[i] = i, want[i] = 1;
            lm_batch b = {N, tok, pos, seq, want};
            lm_topk_out out = {K, ids, vals, mx, NULL, NULL, NULL, NULL, NULL};
            CHECK(lm_forward_topk(m, kv1, &b, &out) == LM_OK);
            CHECK(memcmp(ids, first_ids[step], sizeof ids) == 0 && memcmp(vals, first_vals[step], sizeof vals) == 0);
        }
        free(logits);
        free(full);
        lm_kv_cache_free(kv1);
        lm_kv_cache_free(kv2);
        lm_model_internal_free(m);
    }
    unlink(path);
    rmdir(dir);
}

/* what the op saves: rows of a 152k vocabulary, reduced vs downloaded */
static void time_op(int64_t rows) {
    const int64_t nv = 151936;
    const int k = 64, reps = rows < 16 ? 200 : 20;
    size_t nx = (size_t)(rows * nv);
    float *x = malloc(sizeof(float) * nx);
    for (int64_t r = 0; r < rows; r++) make_row(x + r * nv, nv, K_SPREAD);
    float *d = gpu_upload(x, sizeof(float) * nx);
    float *host = lm_backend_host_alloc(g_gpu, sizeof(float) * nx);
    int32_t *ids = lm_backend_host_alloc(g_gpu, sizeof(int32_t) * (size_t)(rows * k));
    float *vals = lm_backend_host_alloc(g_gpu, sizeof(float) * (size_t)(rows * k));
    float *mx = lm_backend_host_alloc(g_gpu, sizeof(float) * (size_t)rows);
    if (d && host && ids && vals && mx) {
        CHECK(g_gpu->ops->logits_topk(g_gpu, d, rows, nv, k, ids, vals, mx, NULL) == LM_OK); /* warm */
        double t0 = now_s();
        for (int i = 0; i < reps; i++) g_gpu->ops->logits_topk(g_gpu, d, rows, nv, k, ids, vals, mx, NULL);
        double t1 = now_s();
        for (int i = 0; i < reps; i++) g_gpu->ops->download(g_gpu, host, d, sizeof(float) * nx);
        double t2 = now_s();
        printf("%3lld row%s x 151936: logits_topk (k=64) %.3f ms, full download %.3f ms (each with its synchronize)\n",
               (long long)rows, rows == 1 ? " " : "s", (t1 - t0) * 1e3 / reps, (t2 - t1) * 1e3 / reps);
    }
    if (d) g_gpu->ops->free(g_gpu, d);
    lm_backend_host_free(g_gpu, host);
    lm_backend_host_free(g_gpu, ids);
    lm_backend_host_free(g_gpu, vals);
    lm_backend_host_free(g_gpu, mx);
    free(x);
}

int main(void) {
    /* LUMEN_TEST_TOPK_ON_CPU=1: a CPU backend in the GPU's place (checks the test
     * itself on a machine without a GPU) */
    lm_status st = getenv("LUMEN_TEST_TOPK_ON_CPU") ? lm_backend_cpu_create(2, &g_gpu) : lm_backend_cuda_create(0, &g_gpu);
    if (st == LM_ERR_UNSUPPORTED) {
        printf("SKIPPED: no CUDA device (%s)\n", lm_last_error());
        return LM_TEST_SKIP;
    }
    if (st) {
        fprintf(stderr, "lm_backend_cuda_create: %s\n", lm_last_error());
        return 1;
    }
    if (!g_gpu->ops->logits_topk) {
        fprintf(stderr, "the CUDA backend does not register logits_topk (init_ops in cuda_backend.cu: "
                        "o->logits_topk = lm_cuda_logits_topk;)\n");
        lm_backend_free(g_gpu);
        return 1;
    }
    test_op();
    test_forward();
    time_op(1);
    time_op(64);
    time_op(256);
    lm_backend_free(g_gpu);
    TEST_MAIN_END();
}
