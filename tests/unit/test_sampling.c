/* Sampler tests: the counter-based RNG (Philox known answers), exact kept sets of
 * top-k / top-p / min-p (ties included) against an independent sort-based reference,
 * chi-square goodness of fit of 100k draws per setting, penalty formulas to the bit,
 * logit bias and bans, greedy, seeds and interleaving, processors, bad parameters,
 * logprobs, and a speed sanity check on a 152k vocabulary. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "sampling/rng.h"
#include "sampling/sampling.h"
#include "sampling/select.h"
#include "test.h"

/* ---- chi-square critical values -------------------------------------------------------- */

/* Regularized upper incomplete gamma Q(a, x): the power series for P when x < a + 1,
 * otherwise the continued fraction for Q (evaluated with the modified Lentz method). */
static double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    double front = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1.0) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 100000 && term > sum * 1e-17; n++) {
            term *= x / (a + n);
            sum += term;
        }
        return 1.0 - sum * front;
    }
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-16) break;
    }
    return front * h;
}

/* x with P(chi2_df > x) = alpha, by bisection. */
static double chi2_critical(int df, double alpha) {
    double lo = 0.0, hi = 10.0 * df + 100.0;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (gamma_q(0.5 * df, 0.5 * mid) > alpha)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* The significance level of every goodness-of-fit test below. With fixed seeds the
 * tests are deterministic; alpha bounds the chance that a correct sampler would have
 * been rejected for the seeds chosen. */
#define CHI2_ALPHA 1e-4

static void test_chi2_table(void) {
    /* 99.99% quantiles of chi-square: df 2 in closed form (-2 ln 1e-4 = 18.4207);
     * df 1, 10 from published tables; df 30 by numerical integration of the density */
    CHECK_NEAR(chi2_critical(1, 1e-4), 15.137, 0.01);
    CHECK_NEAR(chi2_critical(2, 1e-4), -2.0 * log(1e-4), 1e-6);
    CHECK_NEAR(chi2_critical(10, 1e-4), 35.564, 0.01);
    CHECK_NEAR(chi2_critical(30, 1e-4), 67.633, 0.01);
}

/* ---- an independent reference of the pipeline's steps 4-7 (sort-based) ------------------ */

/* Expected final distribution (double) of temperature/top-k/top-p/min-p over logits.
 * Returns 0 when a kept-set boundary is within `margin` of a threshold (ambiguous in
 * floating point), so randomized callers can skip the case. */
static int reference_dist(const float *logits, size_t n, double temp, int top_k, double top_p, double min_p,
                          double *p, double margin) {
    double lmax = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (logits[i] > lmax) lmax = logits[i];
    /* top-k: keep l >= the k-th largest finite logit (count strictly greater < k) */
    for (size_t i = 0; i < n; i++) {
        size_t greater = 0;
        for (size_t j = 0; j < n; j++) greater += logits[j] > logits[i];
        int keep = logits[i] > -INFINITY && (top_k == 0 || greater < (size_t)top_k);
        p[i] = keep ? exp(((double)logits[i] - lmax) / temp) : 0.0;
    }
    double z = 0.0;
    for (size_t i = 0; i < n; i++) z += p[i];
    for (size_t i = 0; i < n; i++) p[i] /= z;
    /* top-p: keep i iff mass strictly more probable than i < top_p */
    if (top_p < 1.0) {
        double *q = malloc(n * sizeof *q);
        for (size_t i = 0; i < n; i++) {
            double above = 0.0;
            for (size_t j = 0; j < n; j++)
                if (p[j] > p[i]) above += p[j];
            if (p[i] > 0 && fabs(above - top_p) < margin) {
                free(q);
                return 0;
            }
            q[i] = p[i] > 0 && above < top_p ? p[i] : 0.0;
        }
        memcpy(p, q, n * sizeof *q);
        free(q);
    }
    /* min-p: p >= min_p * p_max */
    double pmax = 0.0;
    for (size_t i = 0; i < n; i++)
        if (p[i] > pmax) pmax = p[i];
    for (size_t i = 0; i < n; i++) {
        if (p[i] > 0 && min_p > 0 && fabs(p[i] / pmax - min_p) < margin) return 0;
        if (p[i] < min_p * pmax) p[i] = 0.0;
    }
    z = 0.0;
    for (size_t i = 0; i < n; i++) z += p[i];
    for (size_t i = 0; i < n; i++) p[i] /= z;
    return 1;
}

static lm_sampling_params params_with(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    lm_sampling_params sp = lm_sampling_default_params();
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = seed;
    return sp;
}

/* The kept set of a setting, as a bit mask over up to 32 tokens, via the library. */
static uint32_t kept_set(const float *logits, size_t n, float temp, int top_k, float top_p, float min_p) {
    lm_sampling_params sp = params_with(temp, top_k, top_p, min_p, 1);
    lm_sampler *s = NULL;
    float probs[32];
    uint32_t mask = 0;
    if (lm_sampler_create(&sp, n, &s) != LM_OK || lm_sampler_distribution(s, logits, n, probs) != LM_OK) {
        lm_test_failures++;
        fprintf(stderr, "kept_set: %s\n", lm_last_error());
    } else {
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            if (probs[i] > 0) mask |= 1u << i;
            sum += probs[i];
        }
        CHECK_NEAR(sum, 1.0, 1e-6);
    }
    lm_sampler_free(s);
    return mask;
}

#define SET(...) set_of((const int[]){__VA_ARGS__, -1})
static uint32_t set_of(const int *ids) {
    uint32_t m = 0;
    for (; *ids >= 0; ids++) m |= 1u << *ids;
    return m;
}

static void test_kept_sets(void) {
    /* top-k, with ties at the boundary kept together */
    const float a[] = {1, 3, 3, 2, 0};
    CHECK(kept_set(a, 5, 1, 1, 1, 0) == SET(1, 2)); /* the max is tied: both */
    CHECK(kept_set(a, 5, 1, 2, 1, 0) == SET(1, 2));
    CHECK(kept_set(a, 5, 1, 3, 1, 0) == SET(1, 2, 3));
    CHECK(kept_set(a, 5, 1, 4, 1, 0) == SET(0, 1, 2, 3));
    CHECK(kept_set(a, 5, 1, 5, 1, 0) == SET(0, 1, 2, 3, 4));
    CHECK(kept_set(a, 5, 1, 9, 1, 0) == SET(0, 1, 2, 3, 4));
    const float b[] = {3, 2, 2, 1};
    CHECK(kept_set(b, 4, 1, 2, 1, 0) == SET(0, 1, 2)); /* k=2 keeps 3 tokens: 2,2 tie */
    const float c[] = {1, -INFINITY, 2, -INFINITY};
    CHECK(kept_set(c, 4, 1, 3, 1, 0) == SET(0, 2)); /* -inf never kept */

    /* top-p on p = {0.5, 0.3, 0.2}: keep t iff mass strictly above t < top_p */
    const float d[] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    CHECK(kept_set(d, 3, 1, 0, 0.49f, 0) == SET(0));
    CHECK(kept_set(d, 3, 1, 0, 0.51f, 0) == SET(0, 1));
    CHECK(kept_set(d, 3, 1, 0, 0.79f, 0) == SET(0, 1));
    CHECK(kept_set(d, 3, 1, 0, 0.81f, 0) == SET(0, 1, 2));
    CHECK(kept_set(d, 3, 1, 0, 1e-6f, 0) == SET(0)); /* the max always survives */
    /* ties in probability stay together: p = {0.4, 0.2, 0.2, 0.2} */
    const float e[] = {logf(0.4f), logf(0.2f), logf(0.2f), logf(0.2f)};
    CHECK(kept_set(e, 4, 1, 0, 0.3f, 0) == SET(0));
    CHECK(kept_set(e, 4, 1, 0, 0.5f, 0) == SET(0, 1, 2, 3));
    /* p = {0.3, 0.3, 0.2, 0.2}: tied maxima both kept even for a tiny top_p */
    const float f[] = {logf(0.3f), logf(0.3f), logf(0.2f), logf(0.2f)};
    CHECK(kept_set(f, 4, 1, 0, 0.1f, 0) == SET(0, 1));
    CHECK(kept_set(f, 4, 1, 0, 0.65f, 0) == SET(0, 1, 2, 3));
    /* top-p sees the distribution renormalized after top-k: p = {.4,.3,.2,.1} */
    const float g[] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    CHECK(kept_set(g, 4, 1, 0, 0.5f, 0) == SET(0, 1)); /* 0.4 above token 1 < 0.5 */
    CHECK(kept_set(g, 4, 1, 2, 0.5f, 0) == SET(0));    /* after top-2: 4/7 above token 1 */
    /* temperature comes before top-p: at T = 0.5, p = {16,9,4,1}/30 */
    CHECK(kept_set(g, 4, 0.5f, 0, 0.6f, 0) == SET(0, 1)); /* 16/30 = .533 above token 1 */
    CHECK(kept_set(g, 4, 0.5f, 0, 0.5f, 0) == SET(0));
    CHECK(kept_set(g, 4, 2.0f, 0, 0.5f, 0) == SET(0, 1)); /* flatter: still 2 */
    CHECK(kept_set(g, 4, 2.0f, 0, 0.68f, 0) == SET(0, 1, 2));

    /* min-p on p = {0.5, 0.3, 0.15, 0.05}: keep p >= min_p * 0.5 */
    const float h[] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    CHECK(kept_set(h, 4, 1, 0, 1, 0.25f) == SET(0, 1, 2));
    CHECK(kept_set(h, 4, 1, 0, 1, 0.35f) == SET(0, 1));
    CHECK(kept_set(h, 4, 1, 0, 1, 0.05f) == SET(0, 1, 2, 3));
    CHECK(kept_set(h, 4, 1, 0, 1, 1.0f) == SET(0));
    CHECK(kept_set(h, 4, 0.5f, 0, 1, 0.3f) == SET(0, 1)); /* T=.5: ratios .36, .09, .01 */
    const float k[] = {2, 2, 1};
    CHECK(kept_set(k, 3, 1, 0, 1, 1.0f) == SET(0, 1)); /* tied maxima */
    /* everything combined */
    CHECK(kept_set(h, 4, 1, 3, 0.7f, 0.5f) == SET(0, 1));
    CHECK(kept_set(h, 4, 1, 3, 0.9f, 0.2f) == SET(0, 1, 2));

    /* the probabilities of the kept tokens are the renormalized reference values */
    lm_sampling_params sp = params_with(0.8f, 3, 0.95f, 0.02f, 1);
    lm_sampler *s = NULL;
    float probs[4];
    double ref[4];
    CHECK(lm_sampler_create(&sp, 4, &s) == LM_OK);
    CHECK(lm_sampler_distribution(s, h, 4, probs) == LM_OK);
    CHECK(reference_dist(h, 4, 0.8, 3, 0.95, 0.02, ref, 0));
    for (int i = 0; i < 4; i++) CHECK_NEAR(probs[i], ref[i], 1e-6);
    lm_sampler_free(s);
}

/* Randomized: kept sets and probabilities equal the sort-based reference on larger
 * vocabularies full of ties (logits on a grid of 1/4). */
static void test_kept_sets_random(void) {
    uint64_t x = 88172645463325252ull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    float logits[600];
    double ref[600];
    float probs[600];
    int compared = 0, failures = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 2 + NEXT() % 599;
        for (size_t i = 0; i < n; i++) logits[i] = (float)((int)(NEXT() % 41) - 20) / 4.0f;
        if (NEXT() % 4 == 0) logits[NEXT() % n] = -INFINITY;
        float temp = 0.3f + (float)(NEXT() % 18) / 10.0f;
        int top_k = NEXT() % 3 == 0 ? 0 : (int)(NEXT() % (n + 5));
        float top_p = NEXT() % 3 == 0 ? 1.0f : (float)(1 + NEXT() % 99) / 100.0f;
        float min_p = NEXT() % 3 == 0 ? 0.0f : (float)(NEXT() % 60) / 100.0f;
        if (!reference_dist(logits, n, temp, top_k, top_p, min_p, ref, 1e-5)) continue;
        lm_sampling_params sp = params_with(temp, top_k, top_p, min_p, 7);
        lm_sampler *s = NULL;
        if (lm_sampler_create(&sp, n, &s) != LM_OK || lm_sampler_distribution(s, logits, n, probs) != LM_OK) {
            failures++;
            lm_sampler_free(s);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            if ((probs[i] > 0) != (ref[i] > 0) || fabs(probs[i] - ref[i]) > 1e-5) {
                fprintf(stderr, "random kept set trial %d: n %zu T %g k %d p %g minp %g token %zu: %g vs %g\n", trial,
                        n, (double)temp, top_k, (double)top_p, (double)min_p, i, (double)probs[i], ref[i]);
                failures++;
                break;
            }
        }
        compared++;
        lm_sampler_free(s);
    }
#undef NEXT
    CHECK(failures == 0);
    CHECK(compared > 200);
}

/* The selection helpers against sorting, on both paths of kth_largest (heap for
 * small k, quickselect for large k) and with heavy ties and -inf entries. */
static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_select(void) {
    enum { N = 6000 };
    static float src[N], sorted[N], scratch[N];
    uint64_t x = 0x9E3779B97F4A7C15ull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    int failures = 0;
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + NEXT() % N, n_fin = 0;
        int grid = 1 + (int)(NEXT() % 200); /* few distinct values -> many ties */
        for (size_t i = 0; i < n; i++) {
            src[i] = NEXT() % 50 == 0 ? -INFINITY : (float)(NEXT() % (uint64_t)grid) * 0.5f;
            if (src[i] > -INFINITY) sorted[n_fin++] = src[i];
        }
        if (n_fin == 0) continue;
        qsort(sorted, n_fin, sizeof(float), cmp_desc);
        size_t k = trial % 2 ? 1 + NEXT() % n_fin : 1 + NEXT() % (n_fin < 2000 ? n_fin : 2000);
        if (lm_select_kth_largest(src, n, k, scratch) != sorted[k - 1]) failures++;

        /* mass threshold on positive weights: brute force over the sorted order */
        for (size_t i = 0; i < n_fin; i++) sorted[i] = 1.0f + sorted[i];
        double total = 0.0;
        for (size_t i = 0; i < n_fin; i++) total += sorted[i];
        double need = total * (double)(1 + NEXT() % 999) / 1000.0;
        float want = sorted[0];
        double above = 0.0;
        for (size_t i = 0; i < n_fin;) {
            size_t j = i;
            double group = 0.0;
            while (j < n_fin && sorted[j] == sorted[i]) group += sorted[j++];
            if (above < need) want = sorted[i];
            above += group;
            i = j;
        }
        memcpy(scratch, sorted, n_fin * sizeof(float));
        for (size_t i = n_fin; i > 1; i--) { /* shuffle */
            size_t j = NEXT() % i;
            float t = scratch[i - 1];
            scratch[i - 1] = scratch[j];
            scratch[j] = t;
        }
        if (lm_select_mass_threshold(scratch, n_fin, need) != want) failures++;
    }
#undef NEXT
    CHECK(failures == 0);
}

/* ---- goodness of fit of the draws ------------------------------------------------------ */

#define N_DRAWS 100000

/* Chi-square statistic of counts against probabilities; categories with expected
 * count < 5 are pooled (and pooled away if the pool stays < 5). Also fails on any
 * draw of a token with probability 0. */
static double chi2_stat(const long *counts, const double *p, size_t n, long total, int *df, long *impossible) {
    double stat = 0.0, pool_e = 0.0;
    long pool_o = 0;
    int cats = 0;
    *impossible = 0;
    for (size_t i = 0; i < n; i++) {
        double e = p[i] * (double)total;
        if (p[i] == 0.0) {
            *impossible += counts[i];
            continue;
        }
        if (e < 5.0) {
            pool_e += e;
            pool_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        cats++;
    }
    if (pool_e >= 5.0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cats++;
    }
    *df = cats - 1;
    return stat;
}

static void draw_counts(const lm_sampling_params *sp, const float *logits, size_t n, long *counts) {
    lm_sampler *s = NULL;
    memset(counts, 0, n * sizeof *counts);
    if (lm_sampler_create(sp, n, &s) != LM_OK) {
        lm_test_failures++;
        return;
    }
    for (int i = 0; i < N_DRAWS; i++) {
        int32_t tok = -1;
        if (lm_sampler_sample(s, logits, n, &tok) != LM_OK || tok < 0 || (size_t)tok >= n) {
            lm_test_failures++;
            break;
        }
        counts[tok]++;
    }
    lm_sampler_free(s);
}

static void check_fit(const char *name, float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    static const float logits[] = {2.0f, 1.5f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f};
    const size_t n = sizeof logits / sizeof logits[0];
    double p[10];
    long counts[10], impossible;
    int df;
    CHECK(reference_dist(logits, n, temp, top_k, top_p, min_p, p, 1e-4));
    lm_sampling_params sp = params_with(temp, top_k, top_p, min_p, seed);
    draw_counts(&sp, logits, n, counts);
    double stat = chi2_stat(counts, p, n, N_DRAWS, &df, &impossible);
    double crit = df > 0 ? chi2_critical(df, CHI2_ALPHA) : 0.0;
    printf("fit %-28s chi2 = %7.2f, df = %d, critical (p = %g) = %.2f\n", name, stat, df, CHI2_ALPHA, crit);
    CHECK(impossible == 0);
    if (df > 0) CHECK(stat < crit);
    if (df == 0) CHECK(counts[0] == N_DRAWS || counts[1] + counts[2] == N_DRAWS);
}

static void test_goodness_of_fit(void) {
    check_fit("temperature 1", 1.0f, 0, 1.0f, 0.0f, 11);
    check_fit("temperature 0.7", 0.7f, 0, 1.0f, 0.0f, 12);
    check_fit("temperature 1.5", 1.5f, 0, 1.0f, 0.0f, 13);
    check_fit("top-k 4 (T 1)", 1.0f, 4, 1.0f, 0.0f, 14);
    check_fit("top-k 2, tie at boundary", 1.0f, 2, 1.0f, 0.0f, 15);
    check_fit("top-p 0.8 (T 1)", 1.0f, 0, 0.8f, 0.0f, 16);
    check_fit("top-p 0.6 (T 0.7)", 0.7f, 0, 0.6f, 0.0f, 17);
    check_fit("min-p 0.1 (T 1)", 1.0f, 0, 1.0f, 0.1f, 18);
    check_fit("min-p 0.3 (T 1.3)", 1.3f, 0, 1.0f, 0.3f, 19);
    check_fit("T .8 + top-k 6 + top-p .9", 0.8f, 6, 0.9f, 0.0f, 20);
    check_fit("T 1.2 + k 8 + p .95 + min-p .05", 1.2f, 8, 0.95f, 0.05f, 21);

    /* power: the same statistic rejects draws at T = 0.7 judged against T = 1 */
    static const float logits[] = {2.0f, 1.5f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f};
    double p[10];
    long counts[10], impossible;
    int df;
    reference_dist(logits, 10, 1.0, 0, 1.0, 0.0, p, 0);
    lm_sampling_params sp = params_with(0.7f, 0, 1.0f, 0.0f, 12);
    draw_counts(&sp, logits, 10, counts);
    double stat = chi2_stat(counts, p, 10, N_DRAWS, &df, &impossible);
    CHECK(stat > 10.0 * chi2_critical(df, CHI2_ALPHA));

    /* the RNG itself: 16 equiprobable bins of 1M uniforms; and [0, 1) */
    long bins[16] = {0};
    double up[16], lo = 1.0, hi = 0.0;
    for (int i = 0; i < 16; i++) up[i] = 1.0 / 16;
    for (uint64_t i = 0; i < 1000000; i++) {
        double u = lm_rng_uniform(42, i, 0);
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        bins[(int)(u * 16)]++;
    }
    stat = chi2_stat(bins, up, 16, 1000000, &df, &impossible);
    CHECK(stat < chi2_critical(15, CHI2_ALPHA));
    CHECK(lo >= 0.0 && hi < 1.0);
}

/* ---- RNG ----------------------------------------------------------------------------------- */

static void test_rng(void) {
    /* Random123's known-answer vectors for philox4x32-10 */
    uint32_t o[4];
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    lm_philox4x32_10(c0, k0, o);
    CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u);
    const uint32_t c1[4] = {~0u, ~0u, ~0u, ~0u}, k1[2] = {~0u, ~0u};
    lm_philox4x32_10(c1, k1, o);
    CHECK(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u && o[3] == 0x6d5451fdu);
    const uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, k2[2] = {0xa4093822u, 0x299f31d0u};
    lm_philox4x32_10(c2, k2, o);
    CHECK(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u && o[3] == 0x24126ea1u);
    /* a pure function of (seed, step, lane) */
    CHECK(lm_rng_u64(5, 9, 0) == lm_rng_u64(5, 9, 0));
    CHECK(lm_rng_u64(5, 9, 0) != lm_rng_u64(5, 10, 0));
    CHECK(lm_rng_u64(5, 9, 0) != lm_rng_u64(6, 9, 0));
    CHECK(lm_rng_u64(5, 9, 0) != lm_rng_u64(5, 9, 1));
    CHECK(lm_rng_u64(1, 1ull << 32, 0) != lm_rng_u64(1, 0, 0)); /* high step bits count */
    CHECK(lm_rng_u64(1ull << 32, 0, 0) != lm_rng_u64(0, 0, 0)); /* high seed bits count */
}

/* ---- penalties, bias, processors ----------------------------------------------------------- */

typedef struct recorder {
    float seen[8];
    int32_t hist[16];
    size_t n_hist;
    int calls;
} recorder;

static lm_status record_proc(void *user, const int32_t *history, size_t n_history, float *logits, size_t n_vocab) {
    recorder *r = user;
    memcpy(r->seen, logits, (n_vocab < 8 ? n_vocab : 8) * sizeof(float));
    r->n_hist = n_history;
    memcpy(r->hist, history, (n_history < 16 ? n_history : 16) * sizeof(int32_t));
    r->calls++;
    return LM_OK;
}

/* Runs one draw with a recorder as the last processor and returns what it saw. */
static void logits_after(lm_sampling_params sp, const float *logits, size_t n, const int32_t *prompt, size_t n_prompt,
                         const int32_t *gen, size_t n_gen, recorder *rec) {
    lm_logits_processor procs[4];
    size_t np = sp.n_processors;
    for (size_t i = 0; i < np; i++) procs[i] = sp.processors[i];
    procs[np] = (lm_logits_processor){record_proc, rec};
    sp.processors = procs;
    sp.n_processors = np + 1;
    memset(rec, 0, sizeof *rec);
    lm_sampler *s = NULL;
    int32_t tok;
    CHECK(lm_sampler_create(&sp, n, &s) == LM_OK);
    if (!s) return;
    CHECK(lm_sampler_accept_prompt(s, prompt, n_prompt) == LM_OK);
    for (size_t i = 0; i < n_gen; i++) CHECK(lm_sampler_accept(s, gen[i]) == LM_OK);
    CHECK(lm_sampler_draw(s, logits, n, &tok) == LM_OK);
    CHECK(rec->calls == 1);
    lm_sampler_free(s);
}

static void test_penalties(void) {
    const float L[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
    const int32_t prompt[2] = {0, 1}, gen[3] = {3, 3, 4};
    recorder rec;

    /* repetition over the whole history (window 0), once per distinct token;
     * presence/frequency over generated tokens only */
    lm_sampling_params sp = lm_sampling_default_params();
    sp.seed = 3;
    sp.repetition_penalty = 1.5f;
    sp.repetition_context_size = 0;
    sp.presence_penalty = 0.25f;
    sp.frequency_penalty = 0.5f;
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    const float r = 1.5f, pres = 0.25f, freq = 0.5f;
    CHECK(rec.seen[0] == 2.0f / r);                              /* prompt token, positive */
    CHECK(rec.seen[1] == -1.0f * r);                             /* prompt token, negative */
    CHECK(rec.seen[2] == 0.5f);                                  /* never seen            */
    CHECK(rec.seen[3] == 3.0f / r - (2.0f * freq + pres));       /* twice: divided once   */
    CHECK(rec.seen[4] == -2.0f * r - (1.0f * freq + pres));      /* once                  */
    CHECK(rec.seen[5] == 1.0f);
    CHECK(rec.n_hist == 5 && rec.hist[0] == 0 && rec.hist[1] == 1 && rec.hist[2] == 3 && rec.hist[4] == 4);

    /* a window of the last 2 tokens ([3, 4]) and of the last 3 ([3, 3, 4]) */
    sp.presence_penalty = sp.frequency_penalty = 0.0f;
    sp.repetition_context_size = 2;
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    CHECK(rec.seen[0] == 2.0f && rec.seen[1] == -1.0f);
    CHECK(rec.seen[3] == 3.0f / r && rec.seen[4] == -2.0f * r);
    sp.repetition_context_size = 4; /* [1, 3, 3, 4] */
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    CHECK(rec.seen[0] == 2.0f && rec.seen[1] == -1.0f * r && rec.seen[3] == 3.0f / r);
    /* a zero logit is unchanged by the repetition penalty */
    const float Z[3] = {0.0f, 1.0f, 2.0f};
    const int32_t g0[1] = {0};
    logits_after(sp, Z, 3, NULL, 0, g0, 1, &rec);
    CHECK(rec.seen[0] == 0.0f);

    /* presence alone, and a negative frequency penalty (encourages repeats) */
    sp = lm_sampling_default_params();
    sp.seed = 3;
    sp.presence_penalty = 1.0f;
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    CHECK(rec.seen[0] == 2.0f && rec.seen[3] == 2.0f && rec.seen[4] == -3.0f);
    sp.presence_penalty = 0.0f;
    sp.frequency_penalty = -0.75f;
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    CHECK(rec.seen[3] == 3.0f + 1.5f && rec.seen[4] == -2.0f + 0.75f && rec.seen[1] == -1.0f);

    /* logit bias comes before the penalties; entries add up; -inf bans */
    const lm_logit_bias bias[] = {{3, 1.0f}, {5, 0.5f}, {5, 0.25f}, {2, -INFINITY}};
    sp = lm_sampling_default_params();
    sp.seed = 3;
    sp.logit_bias = bias;
    sp.n_logit_bias = 4;
    sp.repetition_penalty = 2.0f;
    sp.repetition_context_size = 0;
    logits_after(sp, L, 6, prompt, 2, gen, 3, &rec);
    CHECK(rec.seen[3] == (3.0f + 1.0f) / 2.0f);
    CHECK(rec.seen[5] == 1.0f + 0.5f + 0.25f);
    CHECK(isinf(rec.seen[2]) && rec.seen[2] < 0);
}

static lm_status add_one_to_2(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    l[2] += 1.0f;
    return LM_OK;
}
static lm_status times_ten_2(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    l[2] *= 10.0f;
    return LM_OK;
}
static lm_status failing_proc(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    return lm_error(LM_ERR_UNSUPPORTED, "grammar has no allowed token at position %zu", nh);
}
static lm_status silent_failing_proc(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    return LM_ERR_INTERNAL;
}
static lm_status ban_all_but_1(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (i != 1) l[i] = -INFINITY;
    return LM_OK;
}
static lm_status make_nan(void *user, const int32_t *h, size_t nh, float *l, size_t n) {
    l[n - 1] = NAN;
    return LM_OK;
}

static void test_processors(void) {
    const float L[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
    recorder rec;
    /* chain order: (0.5 + 1) * 10 */
    lm_logits_processor chain[2] = {{add_one_to_2, NULL}, {times_ten_2, NULL}};
    lm_sampling_params sp = lm_sampling_default_params();
    sp.seed = 1;
    sp.processors = chain;
    sp.n_processors = 2;
    logits_after(sp, L, 6, NULL, 0, NULL, 0, &rec);
    CHECK(rec.seen[2] == 15.0f);

    /* a processor's edit decides the draw: only token 1 left, at any temperature */
    lm_logits_processor ban[1] = {{ban_all_but_1, NULL}};
    sp.processors = ban;
    sp.n_processors = 1;
    lm_sampler *s = NULL;
    CHECK(lm_sampler_create(&sp, 6, &s) == LM_OK);
    for (int i = 0; i < 50; i++) {
        int32_t tok = -1;
        CHECK(lm_sampler_sample(s, L, 6, &tok) == LM_OK && tok == 1);
    }
    lm_sampler_free(s);

    /* an error aborts the step with the processor's status and sentence, and the
     * sampler does not advance */
    lm_logits_processor bad[2] = {{add_one_to_2, NULL}, {failing_proc, NULL}};
    sp.processors = bad;
    sp.n_processors = 2;
    CHECK(lm_sampler_create(&sp, 6, &s) == LM_OK);
    int32_t tok = 77;
    CHECK(lm_sampler_accept(s, 3) == LM_OK);
    CHECK(lm_sampler_sample(s, L, 6, &tok) == LM_ERR_UNSUPPORTED);
    CHECK(strstr(lm_last_error(), "logits processor 1") != NULL);
    CHECK(strstr(lm_last_error(), "grammar has no allowed token at position 1") != NULL);
    CHECK(lm_sampler_n_generated(s) == 1);
    float probs[6];
    CHECK(lm_sampler_distribution(s, L, 6, probs) == LM_ERR_UNSUPPORTED);
    lm_sampler_free(s);
    /* a processor that fails without a sentence still gets one */
    lm_logits_processor silent[1] = {{silent_failing_proc, NULL}};
    sp.processors = silent;
    sp.n_processors = 1;
    sp.temperature = 0.0f; /* greedy runs the processors too */
    CHECK(lm_sampler_create(&sp, 6, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, L, 6, &tok) == LM_ERR_INTERNAL);
    CHECK(strstr(lm_last_error(), "logits processor 0") != NULL && strstr(lm_last_error(), "internal") != NULL);
    lm_sampler_free(s);
    /* NaN from a processor is an error naming the token */
    lm_logits_processor nan_proc[1] = {{make_nan, NULL}};
    sp.processors = nan_proc;
    CHECK(lm_sampler_create(&sp, 6, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, L, 6, &tok) == LM_ERR_INVALID_ARG);
    CHECK(strstr(lm_last_error(), "token 5 is NaN") != NULL);
    lm_sampler_free(s);
}

static void test_bias_and_greedy(void) {
    enum { N = 1000 };
    static float logits[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((x >> 40) % 1000) / 100.0f;
    }
    logits[500] = 20.0f;
    logits[700] = 20.0f; /* tied maximum: greedy takes the lower id */
    logits[900] = 19.5f;
    lm_sampling_params sp = params_with(0.0f, 0, 1.0f, 0.0f, 1);
    lm_sampler *s = NULL;
    int32_t tok = -1;
    CHECK(lm_sampler_create(&sp, N, &s) == LM_OK);
    for (int i = 0; i < 20; i++) CHECK(lm_sampler_sample(s, logits, N, &tok) == LM_OK && tok == 500);
    static float probs[N];
    CHECK(lm_sampler_distribution(s, logits, N, probs) == LM_OK && probs[500] == 1.0f && probs[700] == 0.0f);
    lm_sampler_free(s);

    /* greedy ignores the filters but not the bias: ban both maxima -> 900; a bias
     * of +1 on token 3 (at most 9.99 + 1 < 20) changes nothing; +1 +24 = +25 wins */
    const lm_logit_bias ban[] = {{500, -INFINITY}, {700, -INFINITY}};
    sp.logit_bias = ban;
    sp.n_logit_bias = 2;
    sp.top_k = 5;
    sp.top_p = 0.5f;
    CHECK(lm_sampler_create(&sp, N, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, logits, N, &tok) == LM_OK && tok == 900);
    lm_sampler_free(s);
    const lm_logit_bias plus[] = {{3, 1.0f}, {3, 24.0f}};
    sp.logit_bias = plus;
    sp.n_logit_bias = 1;
    CHECK(lm_sampler_create(&sp, N, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, logits, N, &tok) == LM_OK && tok == 500);
    lm_sampler_free(s);
    sp.n_logit_bias = 2;
    CHECK(lm_sampler_create(&sp, N, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, logits, N, &tok) == LM_OK && tok == 3);
    lm_sampler_free(s);

    /* sampling with a ban: the banned token never comes, though it was the likeliest */
    const float small[4] = {3.0f, 1.0f, 1.0f, 0.0f};
    const lm_logit_bias ban0[] = {{0, -INFINITY}};
    sp = params_with(1.0f, 0, 1.0f, 0.0f, 99);
    sp.logit_bias = ban0;
    sp.n_logit_bias = 1;
    long counts[4];
    draw_counts(&sp, small, 4, counts);
    CHECK(counts[0] == 0 && counts[1] > 0 && counts[2] > 0 && counts[3] > 0);
    /* ... and a positive bias shifts the distribution as exp(bias) */
    const lm_logit_bias up3[] = {{3, 3.0f}}; /* token 3 now 3.0 like token 0 */
    sp.logit_bias = up3;
    draw_counts(&sp, small, 4, counts);
    double p3 = exp(3.0) / (2 * exp(3.0) + 2 * exp(1.0));
    CHECK(fabs((double)counts[3] / N_DRAWS - p3) < 0.01);

    /* every token banned: a clear error */
    const float two[2] = {1.0f, 2.0f};
    const lm_logit_bias all[] = {{0, -INFINITY}, {1, -INFINITY}};
    sp.logit_bias = all;
    sp.n_logit_bias = 2;
    CHECK(lm_sampler_create(&sp, 2, &s) == LM_OK);
    CHECK(lm_sampler_sample(s, two, 2, &tok) == LM_ERR_INVALID_ARG);
    CHECK(strstr(lm_last_error(), "banned") != NULL);
    lm_sampler_free(s);

    /* +inf logits: uniform over them */
    const float inf3[3] = {INFINITY, 0.0f, INFINITY};
    sp = params_with(1.0f, 0, 1.0f, 0.0f, 5);
    CHECK(lm_sampler_create(&sp, 3, &s) == LM_OK);
    float pr[3];
    CHECK(lm_sampler_distribution(s, inf3, 3, pr) == LM_OK && pr[0] == 0.5f && pr[1] == 0.0f && pr[2] == 0.5f);
    lm_sampler_free(s);
    /* a tiny temperature behaves like greedy with ties shared, never NaN */
    sp.temperature = 1e-30f;
    const float near[3] = {1.0f, 1.0001f, 1.0001f};
    CHECK(lm_sampler_create(&sp, 3, &s) == LM_OK);
    CHECK(lm_sampler_distribution(s, near, 3, pr) == LM_OK && pr[0] == 0.0f && pr[1] == 0.5f && pr[2] == 0.5f);
    lm_sampler_free(s);
}

/* ---- seeds, steps and interleaving ------------------------------------------------------------ */

/* A stand-in for a model: logits that depend on the previous token and the step. */
static void fake_model(int32_t prev, size_t step, float *logits, size_t n) {
    uint64_t x = (uint64_t)(prev + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)step * 0xD1B54A32D192ED03ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 32;
        logits[i] = (float)(x % 1000) / 250.0f;
    }
}

enum { GEN_VOCAB = 64, GEN_LEN = 200 };

static void generate(lm_sampler *s, int32_t *out, size_t n) {
    float logits[GEN_VOCAB];
    int32_t prev = -1;
    for (size_t i = 0; i < n; i++) {
        fake_model(prev, i, logits, GEN_VOCAB);
        if (lm_sampler_sample(s, logits, GEN_VOCAB, &out[i]) != LM_OK) {
            lm_test_failures++;
            return;
        }
        prev = out[i];
    }
}

static void test_seeds_and_interleaving(void) {
    lm_sampling_params a = params_with(0.9f, 20, 0.95f, 0.01f, 1234);
    lm_sampling_params b = params_with(1.1f, 0, 1.0f, 0.0f, 98765);
    b.repetition_penalty = 1.2f;
    b.presence_penalty = 0.3f;
    lm_sampling_params g = params_with(0.0f, 0, 1.0f, 0.0f, 5);
    lm_sampling_params params[3] = {a, b, g};

    int32_t alone[3][GEN_LEN], again[GEN_LEN], mixed[3][GEN_LEN];
    for (int k = 0; k < 3; k++) {
        lm_sampler *s = NULL;
        CHECK(lm_sampler_create(&params[k], GEN_VOCAB, &s) == LM_OK);
        if (!s) return;
        generate(s, alone[k], GEN_LEN);
        lm_sampler_free(s);
    }
    /* same seed, same sequence */
    lm_sampler *s = NULL;
    CHECK(lm_sampler_create(&a, GEN_VOCAB, &s) == LM_OK);
    generate(s, again, GEN_LEN);
    lm_sampler_free(s);
    CHECK(memcmp(alone[0], again, sizeof again) == 0);
    /* another seed, another sequence */
    lm_sampling_params a2 = a;
    a2.seed = 1235;
    CHECK(lm_sampler_create(&a2, GEN_VOCAB, &s) == LM_OK);
    generate(s, again, GEN_LEN);
    lm_sampler_free(s);
    CHECK(memcmp(alone[0], again, sizeof again) != 0);

    /* round-robin interleaving, with extra draws on a fourth sampler in between */
    lm_sampler *ss[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) CHECK(lm_sampler_create(&params[k], GEN_VOCAB, &ss[k]) == LM_OK);
    lm_sampling_params noise = params_with(1.0f, 0, 1.0f, 0.0f, 1234); /* even the same seed */
    CHECK(lm_sampler_create(&noise, GEN_VOCAB, &ss[3]) == LM_OK);
    float logits[GEN_VOCAB];
    for (size_t i = 0; i < GEN_LEN; i++) {
        for (int k = 2; k >= 0; k--) {
            int32_t junk;
            fake_model((int32_t)(i * 7 % GEN_VOCAB), i + 1000, logits, GEN_VOCAB);
            CHECK(lm_sampler_sample(ss[3], logits, GEN_VOCAB, &junk) == LM_OK);
            fake_model(i ? mixed[k][i - 1] : -1, i, logits, GEN_VOCAB);
            CHECK(lm_sampler_sample(ss[k], logits, GEN_VOCAB, &mixed[k][i]) == LM_OK);
        }
    }
    for (int k = 0; k < 3; k++) CHECK(memcmp(alone[k], mixed[k], sizeof mixed[k]) == 0);
    for (int k = 0; k < 4; k++) lm_sampler_free(ss[k]);

    /* draw does not advance; accept does; token i always uses the uniform of step i */
    CHECK(lm_sampler_create(&b, GEN_VOCAB, &s) == LM_OK);
    fake_model(-1, 0, logits, GEN_VOCAB);
    int32_t t1, t2, t3;
    CHECK(lm_sampler_draw(s, logits, GEN_VOCAB, &t1) == LM_OK);
    CHECK(lm_sampler_draw(s, logits, GEN_VOCAB, &t2) == LM_OK && t1 == t2);
    CHECK(lm_sampler_n_generated(s) == 0);
    CHECK(lm_sampler_sample(s, logits, GEN_VOCAB, &t3) == LM_OK && t3 == t1 && t3 == alone[1][0]);
    CHECK(lm_sampler_n_generated(s) == 1 && lm_sampler_seed(s) == 98765);
    lm_sampler_free(s);

    /* a random seed is resolved, reported, and replays the same text */
    lm_sampling_params r = params_with(1.0f, 0, 1.0f, 0.0f, LM_SAMPLING_SEED_RANDOM);
    lm_sampler *r1 = NULL, *r2 = NULL;
    CHECK(lm_sampler_create(&r, GEN_VOCAB, &r1) == LM_OK && lm_sampler_create(&r, GEN_VOCAB, &r2) == LM_OK);
    if (!r1 || !r2) return;
    CHECK(lm_sampler_seed(r1) != LM_SAMPLING_SEED_RANDOM && lm_sampler_seed(r1) != lm_sampler_seed(r2));
    r.seed = lm_sampler_seed(r1);
    CHECK(lm_sampler_create(&r, GEN_VOCAB, &s) == LM_OK);
    generate(r1, mixed[0], GEN_LEN);
    generate(s, mixed[1], GEN_LEN);
    CHECK(memcmp(mixed[0], mixed[1], sizeof mixed[0]) == 0);
    lm_sampler_free(r1);
    lm_sampler_free(r2);
    lm_sampler_free(s);
}

/* ---- invalid parameters and calls -------------------------------------------------------------- */

static void expect_invalid(lm_sampling_params sp, size_t n_vocab, const char *needle1, const char *needle2) {
    lm_sampler *s = (lm_sampler *)&sp;
    lm_status st = lm_sampler_create(&sp, n_vocab, &s);
    CHECK(st == LM_ERR_INVALID_ARG && s == NULL);
    int ok = strstr(lm_last_error(), needle1) && strstr(lm_last_error(), needle2);
    if (!ok) {
        fprintf(stderr, "expected \"%s\" and \"%s\" in \"%s\"\n", needle1, needle2, lm_last_error());
        lm_test_failures++;
    }
    CHECK(lm_sampling_params_validate(&sp, n_vocab) == LM_ERR_INVALID_ARG);
}

static lm_sampling_params dp(void) { return lm_sampling_default_params(); }

static void test_invalid(void) {
    lm_sampling_params sp = dp();
    CHECK(lm_sampling_params_validate(&sp, 10) == LM_OK);
    CHECK(sp.temperature == 1.0f && sp.top_k == 0 && sp.top_p == 1.0f && sp.min_p == 0.0f &&
          sp.repetition_penalty == 1.0f && sp.seed == LM_SAMPLING_SEED_RANDOM);

#define BAD(field, value, n1, n2)                                                                       \
    do {                                                                                                \
        sp = dp();                                                                                      \
        sp.field = value;                                                                               \
        expect_invalid(sp, 10, n1, n2);                                                                 \
    } while (0)
    BAD(temperature, -0.5f, "temperature", "-0.5");
    BAD(temperature, INFINITY, "temperature", "inf");
    BAD(temperature, NAN, "temperature", "nan");
    BAD(top_k, -1, "top_k", "-1");
    BAD(top_p, 0.0f, "top_p", "got 0");
    BAD(top_p, 1.5f, "top_p", "1.5");
    BAD(top_p, -0.2f, "top_p", "-0.2");
    BAD(top_p, NAN, "top_p", "nan");
    BAD(min_p, -0.1f, "min_p", "-0.1");
    BAD(min_p, 1.25f, "min_p", "1.25");
    BAD(repetition_penalty, 0.0f, "repetition_penalty", "got 0");
    BAD(repetition_penalty, -1.0f, "repetition_penalty", "-1");
    BAD(repetition_penalty, INFINITY, "repetition_penalty", "inf");
    BAD(repetition_context_size, -3, "repetition_context_size", "-3");
    BAD(presence_penalty, NAN, "presence_penalty", "nan");
    BAD(frequency_penalty, -INFINITY, "frequency_penalty", "-inf");
#undef BAD
    const lm_logit_bias out_of_vocab[] = {{1, 1.0f}, {10, 2.0f}};
    sp = dp();
    sp.logit_bias = out_of_vocab;
    sp.n_logit_bias = 2;
    expect_invalid(sp, 10, "logit_bias[1]", "token 10");
    const lm_logit_bias negative[] = {{-1, 1.0f}};
    sp.logit_bias = negative;
    sp.n_logit_bias = 1;
    expect_invalid(sp, 10, "logit_bias[0]", "token -1");
    const lm_logit_bias plus_inf[] = {{2, INFINITY}};
    sp.logit_bias = plus_inf;
    expect_invalid(sp, 10, "logit_bias[0]", "inf");
    const lm_logit_bias nan_bias[] = {{2, NAN}};
    sp.logit_bias = nan_bias;
    expect_invalid(sp, 10, "logit_bias[0]", "nan");
    sp.logit_bias = NULL;
    expect_invalid(sp, 10, "logit_bias", "NULL");
    sp = dp();
    const lm_logits_processor no_fn[] = {{NULL, NULL}};
    sp.processors = no_fn;
    sp.n_processors = 1;
    expect_invalid(sp, 10, "processors[0]", "no function");
    expect_invalid(dp(), 0, "n_vocab", "0");
    CHECK(lm_sampling_params_validate(NULL, 10) == LM_ERR_INVALID_ARG);

    /* valid edge values */
    sp = dp();
    sp.top_p = 1.0f;
    sp.min_p = 1.0f;
    sp.temperature = 0.0f;
    sp.repetition_penalty = 0.5f;
    sp.presence_penalty = -2.0f;
    CHECK(lm_sampling_params_validate(&sp, 10) == LM_OK);

    /* bad calls */
    lm_sampler *s = NULL;
    sp = params_with(1.0f, 0, 1.0f, 0.0f, 1);
    CHECK(lm_sampler_create(&sp, 4, &s) == LM_OK);
    const float four[4] = {0, 1, 2, 3};
    const float nan4[4] = {0, NAN, 2, 3};
    int32_t tok;
    CHECK(lm_sampler_sample(s, four, 3, &tok) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "n_vocab = 4"));
    CHECK(lm_sampler_sample(s, nan4, 4, &tok) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "token 1 is NaN"));
    CHECK(lm_sampler_sample(s, NULL, 4, &tok) == LM_ERR_INVALID_ARG);
    CHECK(lm_sampler_accept(s, 4) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "token 4"));
    CHECK(lm_sampler_accept(s, -1) == LM_ERR_INVALID_ARG);
    const int32_t bad_prompt[2] = {1, 9};
    CHECK(lm_sampler_accept_prompt(s, bad_prompt, 2) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "prompt token 1 (9)"));
    CHECK(lm_sampler_n_generated(s) == 0);
    CHECK(lm_sampler_sample(s, four, 4, &tok) == LM_OK);
    CHECK(lm_sampler_accept_prompt(s, bad_prompt, 1) == LM_ERR_INVALID_ARG &&
          strstr(lm_last_error(), "before the first generated token"));
    lm_sampler_free(s);
    lm_sampler_free(NULL);
}

/* ---- logprobs ---------------------------------------------------------------------------------- */

static void test_logprobs(void) {
    const float L[6] = {1.0f, 2.0f, 3.0f, 3.0f, -INFINITY, 0.5f};
    double lse = 0.0;
    for (int i = 0; i < 6; i++) lse += exp((double)L[i]);
    lse = log(lse);
    lm_token_logprob top[8];
    size_t n_top = 0;
    float lp = 0.0f;
    CHECK(lm_logprobs(L, 6, 5, &lp, 3, top, &n_top) == LM_OK);
    CHECK(n_top == 3);
    CHECK(top[0].token == 2 && top[1].token == 3 && top[2].token == 1); /* tie: lower id first */
    CHECK_NEAR(top[0].logprob, 3.0 - lse, 1e-6);
    CHECK_NEAR(top[2].logprob, 2.0 - lse, 1e-6);
    CHECK_NEAR(lp, 0.5 - lse, 1e-6);
    /* more requested than the vocabulary: all, sorted; -inf last */
    CHECK(lm_logprobs(L, 6, 4, &lp, 8, top, &n_top) == LM_OK && n_top == 6);
    CHECK(top[3].token == 0 && top[4].token == 5 && top[5].token == 4 && isinf(top[5].logprob) && isinf(lp));
    double sum = 0.0;
    for (int i = 0; i < 6; i++) sum += exp((double)top[i].logprob);
    CHECK_NEAR(sum, 1.0, 1e-6);
    /* the raw distribution: independent of any sampler setting */
    CHECK(lm_logprobs(L, 6, -1, NULL, 0, NULL, NULL) == LM_OK);
    const float bad[2] = {0.0f, NAN};
    CHECK(lm_logprobs(bad, 2, 0, &lp, 1, top, &n_top) == LM_ERR_INVALID_ARG);
    CHECK(lm_logprobs(L, 6, 6, &lp, 1, top, &n_top) == LM_ERR_INVALID_ARG);
    const float none[2] = {-INFINITY, -INFINITY};
    CHECK(lm_logprobs(none, 2, 0, &lp, 1, top, &n_top) == LM_ERR_INVALID_ARG);
    /* a large vocabulary: the heap agrees with a scan */
    enum { N = 50000 };
    static float big[N];
    uint64_t x = 777;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1;
        big[i] = (float)((x >> 33) % 20000) / 1000.0f;
    }
    lm_token_logprob t5[5];
    CHECK(lm_logprobs(big, N, -1, NULL, 5, t5, &n_top) == LM_OK && n_top == 5);
    for (int k = 0; k < 5; k++) {
        /* t5[k] is the (k+1)-th best by (logit desc, id asc) */
        int better = 0;
        for (int i = 0; i < N; i++)
            better += big[i] > big[t5[k].token] || (big[i] == big[t5[k].token] && i < t5[k].token);
        CHECK(better == k);
    }
}

/* ---- speed sanity: no full sort per token ------------------------------------------------------ */

static double ms_since(const struct timespec *a) {
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e3 + (double)(b.tv_nsec - a->tv_nsec) * 1e-6;
}

/* Sampling a token must cost less than sorting the row once, measured in the same run
 * (so a sanitizer build or a busy machine slows both): a sampler that sorted every
 * row would fail it. Expected: ~1-3 ms a token against ~10-15 ms a sort, unsanitized. */
static void test_speed(void) {
    enum { N = 151936, STEPS = 200, SORTS = 5 };
    float *logits = malloc(N * sizeof(float)), *copy = malloc(N * sizeof(float));
    if (!logits || !copy) {
        free(logits), free(copy);
        return;
    }
    uint64_t x = 31337;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* a peaked, realistic-looking spread: most mass on few tokens */
        double u = (double)(x >> 11) * 0x1.0p-53;
        logits[i] = (float)(-8.0 * log(-log(u * 0.999999 + 5e-7)));
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < SORTS; r++) {
        memcpy(copy, logits, N * sizeof(float));
        qsort(copy, N, sizeof(float), cmp_desc);
    }
    const double ms_sort = ms_since(&t0) / SORTS;
    printf("speed: one sort of the row              %.2f ms\n", ms_sort);
    lm_sampling_params settings[3] = {params_with(0.8f, 0, 0.95f, 0.0f, 1), params_with(0.7f, 40, 0.9f, 0.05f, 2),
                                      params_with(1.0f, 0, 1.0f, 0.0f, 3)};
    const char *names[3] = {"T .8, top-p .95", "T .7, k 40, p .9, min-p .05", "T 1"};
    for (int k = 0; k < 3; k++) {
        settings[k].repetition_penalty = 1.1f;
        lm_sampler *s = NULL;
        CHECK(lm_sampler_create(&settings[k], N, &s) == LM_OK);
        if (!s) continue;
        struct timespec a;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < STEPS; i++) {
            int32_t tok;
            CHECK(lm_sampler_sample(s, logits, N, &tok) == LM_OK);
        }
        const double ms = ms_since(&a) / STEPS;
        printf("speed: %-30s %.2f ms per token over %d logits\n", names[k], ms, N);
        CHECK(ms < ms_sort);
        lm_sampler_free(s);
    }
    free(logits);
    free(copy);
}

int main(void) {
    test_chi2_table();
    test_rng();
    test_kept_sets();
    test_kept_sets_random();
    test_select();
    test_goodness_of_fit();
    test_penalties();
    test_processors();
    test_bias_and_greedy();
    test_seeds_and_interleaving();
    test_invalid();
    test_logprobs();
    test_speed();
    TEST_MAIN_END();
}
