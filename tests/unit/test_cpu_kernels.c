/* Every fast CPU kernel against the scalar reference on random inputs.
 *
 * q8 integer products: every SIMD kernel (matrix-vector, tiled; AVX2, AVX-512 VNNI)
 * must equal the scalar code of the same arithmetic (cpu_q8.h) bit for bit, for any
 * batch and tile shape; that arithmetic must stay within 1e-5 of sum |w_i * x_i| of
 * the double-precision reference and within 0.5% of it from the exact f32 dot (the
 * quantization of the activations is the only approximation). */
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_q8.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"
#include "tensor/quant.h"
#include "test.h"

static uint64_t g_rng = 42;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((g_rng >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
}

static const lm_dtype k_q8_types[] = {LM_DTYPE_Q4_0, LM_DTYPE_Q4_1, LM_DTYPE_Q5_0, LM_DTYPE_Q5_1,
                                      LM_DTYPE_Q8_0, LM_DTYPE_Q4_K, LM_DTYPE_Q5_K, LM_DTYPE_Q6_K};

/* The exact arithmetic (scalar) against the double-precision reference and the exact
 * f32 product: within 1e-5 of sum |w_i * x_i| (float rounding only), and within 0.5%
 * of that scale from the f32 dot (the 8-bit activations are the approximation). */
static void test_q8_accuracy(void) {
    enum { N = 1024, ROWS = 16 };
    static float w[N], x[N], wd[N];
    static uint8_t wq[N * 2];
    static lm_q8a_block a[N / 32];
    for (size_t ti = 0; ti < sizeof k_q8_types / sizeof k_q8_types[0]; ti++) {
        lm_dtype t = k_q8_types[ti];
        lm_q8a_dot_fn ref = lm_q8a_dot_scalar_for(t), exact = lm_q8a_dot_exact_for(t);
        CHECK(ref != NULL && exact != NULL);
        if (!ref || !exact) continue;
        double worst_ref = 0, worst_quant = 0;
        for (int r = 0; r < ROWS; r++) {
            float scale = r % 4 == 0 ? 100.0f : r % 4 == 1 ? 1e-3f : 1.0f;
            for (int i = 0; i < N; i++) {
                w[i] = frand() * scale + (r % 3 == 0 ? 0.3f * scale : 0.0f); /* some rows off-centre */
                x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
            }
            CHECK(lm_quantize_row(t, w, wq, N));
            CHECK(lm_dequantize_row(t, wq, wd, N));
            lm_q8a_quantize_row(x, a, N, lm_q8a_style_for(t));
            double f32 = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                f32 += (double)wd[i] * x[i];
                mag += fabs((double)wd[i] * x[i]);
            }
            double e = exact(wq, a, N);
            worst_ref = fmax(worst_ref, fabs(e - ref(wq, a, N)) / mag);
            worst_quant = fmax(worst_quant, fabs(e - f32) / mag);
        }
        printf("  %-5s exact arithmetic vs double reference %.2e, vs f32 dot %.2e (relative to sum|w*x|)\n",
               lm_dtype_name(t), worst_ref, worst_quant);
        CHECK(worst_ref < 1e-5);
        CHECK(worst_quant < 5e-3);
    }
}

/* Random raw weight blocks (every code pattern, extremes included) with sane f16 scales. */
static void random_weights(lm_dtype t, uint8_t *wq, int64_t rows, int64_t cols) {
    const lm_dtype_info *info = lm_dtype_get_info(t);
    size_t bb = info->block_bytes, nb = (size_t)(rows * cols / info->block_size);
    for (size_t i = 0; i < nb * bb; i++) wq[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t blk = 0; blk < nb; blk++) {
        uint8_t *p = wq + blk * bb;
        int offs[2] = {0, -1};
        if (t == LM_DTYPE_Q4_1 || t == LM_DTYPE_Q5_1 || t == LM_DTYPE_Q4_K || t == LM_DTYPE_Q5_K) offs[1] = 2;
        if (t == LM_DTYPE_Q6_K) offs[0] = 208;
        for (int k = 0; k < 2; k++) {
            if (offs[k] < 0) continue;
            uint16_t h = lm_f32_to_f16(frand() * 0.05f);
            p[offs[k]] = (uint8_t)h, p[offs[k] + 1] = (uint8_t)(h >> 8);
        }
    }
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Every kernel (matrix-vector AVX2 and VNNI, tiled) equals the scalar exact arithmetic
 * bit for bit: whatever the token count, the token group, the row group, the ragged
 * edges of rows and tokens. Weights: random raw blocks; activations: random, with
 * tokens at +-127 everywhere (the integer bounds) and an all-zero token. */
static void test_q8_kernels(void) {
    enum { ROWS = 45, TOK = 15, MAXC = 768 };
    static uint8_t wq[ROWS * MAXC * 2];
    static lm_q8a_block a[TOK * MAXC / 32];
    static float x[MAXC], want[TOK * ROWS], got[TOK * ROWS];
    static uint8_t panel[64 + 16 * 1024 * 1024];
    uint8_t *pan = (uint8_t *)(((uintptr_t)panel + 63) & ~(uintptr_t)63);
#if defined(__x86_64__)
    bool has_avx2 = lm_cpu_has_avx2(), has_vnni = lm_cpu_has_avx512_vnni();
#else
    bool has_avx2 = false, has_vnni = false;
#endif
    for (size_t ti = 0; ti < sizeof k_q8_types / sizeof k_q8_types[0]; ti++) {
        lm_dtype t = k_q8_types[ti];
        lm_q8a_dot_fn exact = lm_q8a_dot_exact_for(t);
        lm_q8a_kernels ka = has_avx2 ? lm_q8a_kernels_for_avx2(t) : (lm_q8a_kernels){0};
        lm_q8a_kernels kv = has_vnni ? lm_q8a_kernels_for_vnni(t) : (lm_q8a_kernels){0};
        if (!ka.gemv && !kv.gemv) {
            printf("  %-5s no SIMD kernel on this CPU: SKIPPED\n", lm_dtype_name(t));
            continue;
        }
        bool k_quant = lm_q8a_style_for(t) == LM_Q8A_PER256;
        const int64_t col_cases[] = {k_quant ? 256 : 32, k_quant ? 768 : 96, 768};
        int mismatch_gemv = 0, mismatch_tile = 0, checked = 0;
        for (int ci = 0; ci < 3; ci++) {
            int64_t cols = col_cases[ci], stride = cols / 32;
            size_t row_bytes = lm_dtype_row_bytes(t, cols);
            random_weights(t, wq, ROWS, cols);
            for (int tok = 0; tok < TOK; tok++) {
                for (int i = 0; i < cols; i++) {
                    float v = frand() * (i % 5 == 0 ? 4.0f : 1.0f);
                    x[i] = tok == 3 ? 1.0f : tok == 4 ? -1.0f : tok == 5 ? 0.0f : v;
                }
                if (tok == 6) x[cols / 2] = 1e4f; /* one outlier: the rest of its scale block near 0 */
                lm_q8a_quantize_row(x, a + tok * stride, cols, lm_q8a_style_for(t));
            }
            for (int tok = 0; tok < TOK; tok++)
                for (int r = 0; r < ROWS; r++) want[tok * ROWS + r] = exact(wq + r * row_bytes, a + tok * stride, cols);
            /* matrix-vector: all tokens at once, then token groups of every size */
            lm_q8a_kernels ks[2] = {ka, kv};
            for (int k = 0; k < 2; k++) {
                if (!ks[k].gemv) continue;
                int g = ks[k].gemv_rows;
                for (int t0 = 0, tn = TOK; t0 < TOK; t0 += tn, tn = 1 + (t0 % 5)) {
                    int nt = t0 + tn <= TOK ? tn : TOK - t0;
                    for (int r = 0; r < ROWS; r += g)
                        ks[k].gemv(wq + r * row_bytes, row_bytes, ROWS - r < g ? ROWS - r : g, a + t0 * stride, stride,
                                   nt, cols, got + t0 * ROWS + r, ROWS);
                }
                for (int i = 0; i < TOK * ROWS; i++) mismatch_gemv += !same_bits(got[i], want[i]);
            }
            /* tiled: panels of 32 rows (the last ragged), every token count 1..TOK from
             * every start */
            if (kv.pack) {
                for (int t0 = 0; t0 < TOK; t0++)
                    for (int nt = 1; t0 + nt <= TOK; nt++) {
                        if (nt > 3 && t0 > 2 && nt != TOK - t0) continue; /* enough: all sizes from 0..2 */
                        for (int r = 0; r < ROWS; r += 32) {
                            int nr = ROWS - r < 32 ? ROWS - r : 32;
                            CHECK(kv.panel_bytes(cols) <= sizeof panel - 64);
                            kv.pack(wq + r * row_bytes, row_bytes, nr, cols, pan);
                            kv.tile(pan, nr, a + t0 * stride, stride, nt, cols, got + r, ROWS);
                        }
                        for (int tt = 0; tt < nt; tt++)
                            for (int r = 0; r < ROWS; r++)
                                mismatch_tile += !same_bits(got[tt * ROWS + r], want[(t0 + tt) * ROWS + r]);
                        checked++;
                    }
            }
        }
        printf("  %-5s %s%s == exact scalar bit for bit: %s (%d tile cases)\n", lm_dtype_name(t),
               ka.gemv ? "gemv AVX2" : "", kv.gemv ? (kv.pack ? ", gemv VNNI, tiled VNNI" : ", gemv VNNI") : "",
               mismatch_gemv + mismatch_tile ? "NO" : "yes", checked);
        CHECK(mismatch_gemv == 0);
        CHECK(mismatch_tile == 0);
    }
}

/* the activation quantizer: d = max|x| / 127, codes round to nearest, sums right */
static void test_q8_quantize(void) {
    float x[256];
    lm_q8a_block a[8];
    for (int i = 0; i < 256; i++) x[i] = (float)(i - 20) * 0.25f;
    lm_q8a_quantize_row(x, a, 64, LM_Q8A_PER32);
    /* block 0: max |x| = |-5|; d is stored as f16 */
    CHECK(a[0].d == lm_f16_to_f32(lm_f32_to_f16(5.0f / 127.0f)));
    CHECK(a[0].q[0] == -127);
    CHECK(a[0].q[20] == 0);
    CHECK(a[0].q[2] == -114); /* -4.5 * 127 / 5 = -114.3 */
    int s = 0;
    for (int i = 0; i < 16; i++) s += a[1].q[i];
    CHECK(s == a[1].sum16[0]);
    CHECK_NEAR(a[1].s, (10.75f / 127.0f) * (a[1].sum16[0] + a[1].sum16[1]), 1e-3 * fabs(a[1].s));
    /* PER256: one scale for all 8 blocks, from the signed extreme (58.75 here) */
    lm_q8a_quantize_row(x, a, 256, LM_Q8A_PER256);
    CHECK(a[0].d == a[7].d);
    CHECK_NEAR(a[0].d, -58.75f / 127.0f, 1e-7);
    CHECK(a[7].q[31] == -127); /* x = 58.75 = the max, times -127 / max */
    CHECK(a[0].q[0] == (int8_t)lrintf(-5.0f * (-127.0f / 58.75f)));
    float z[32] = {0};
    lm_q8a_quantize_row(z, a, 32, LM_Q8A_PER32);
    CHECK(a[0].d == 0.0f && a[0].q[5] == 0 && a[0].sum16[0] == 0 && a[0].s == 0.0f);
    /* the vectorized quantizer equals the portable one bit for bit: random rows, ties
     * of the largest magnitude (+m and -m), zero blocks, tiny and huge values */
    static float r[1024];
    static lm_q8a_block fast[32], ref[32];
    int diff = 0;
    for (int trial = 0; trial < 200; trial++) {
        float mag = trial % 3 == 0 ? 1e-6f : trial % 3 == 1 ? 1.0f : 3e4f;
        for (int i = 0; i < 1024; i++) r[i] = frand() * mag * (i % 11 == 0 ? 5.0f : 1.0f);
        if (trial % 5 == 1) r[trial % 1024] = 7.0f * mag, r[(trial * 7 + 300) % 1024] = -7.0f * mag;
        if (trial % 5 == 2) memset(r + 256, 0, 256 * sizeof(float));
        for (int st = 0; st < 2; st++) {
            lm_q8a_style style = st ? LM_Q8A_PER256 : LM_Q8A_PER32;
            lm_q8a_quantize_row(r, fast, 1024, style);
            lm_q8a_quantize_row_ref(r, ref, 1024, style);
            diff += memcmp(fast, ref, sizeof fast) != 0;
        }
    }
    CHECK(diff == 0);
}

/* Attention over a paged cache: against a double-precision reference within
 * tolerance, and batch invariance bit for bit: each token's output computed alone
 * equals the same token's output inside a batch (several sequences interleaved,
 * sliding windows, GQA groups of 1..6, head dims 64..256, F16 and F32 caches). The
 * pool holds NaN wherever no token was stored (kv_poison): every output finite. */
typedef struct attn_shape {
    int64_t n_head, n_head_kv, hd, window;
    lm_dtype type;
    int threads;
} attn_shape;

static void attention_case(const attn_shape *sh) {
    enum { SEQS = 2, LEN = 70, N = SEQS * LEN };
    int64_t d_q = sh->n_head * sh->hd, d_kv = sh->n_head_kv * sh->hd;
    lm_backend *b = NULL;
    lm_kv_cache *kv = NULL;
    CHECK(lm_backend_cpu_create(sh->threads, &b) == LM_OK);
    CHECK(lm_kv_cache_create(b, 2, d_kv, 16, 2 * (LEN / 16 + 1) * SEQS, SEQS, sh->type, &kv) == LM_OK);
    if (!b || !kv) return;
    CHECK(kv_poison(kv));
    float *q = malloc(sizeof(float) * N * d_q), *k = malloc(sizeof(float) * N * d_kv);
    float *v = malloc(sizeof(float) * N * d_kv), *out = malloc(sizeof(float) * N * d_q);
    float *one = malloc(sizeof(float) * d_q);
    int32_t pos[N], seq[N];
    /* sequences interleaved token by token, positions 0..LEN-1 each */
    for (int i = 0; i < N; i++) seq[i] = i % SEQS, pos[i] = i / SEQS;
    for (int64_t i = 0; i < N * d_q; i++) q[i] = frand() * 2.0f;
    for (int64_t i = 0; i < N * d_kv; i++) k[i] = frand() * 2.0f, v[i] = frand();
    for (int s = 0; s < SEQS; s++) CHECK(lm_kv_cache_reserve(kv, s, LEN) == LM_OK);
    lm_attn_batch all = {N, pos, seq};
    const int layer = 1;
    b->ops->kv_store(b, kv, layer, &all, k, v);
    float scale = 1.0f / sqrtf((float)sh->hd);
    CHECK(b->ops->attention(b, kv, layer, &all, q, sh->n_head, sh->n_head_kv, sh->hd, sh->window, scale, out) == LM_OK);
    /* reference from the values as stored (F16 cache: keys, values and q rounded) */
    bool f16 = sh->type == LM_DTYPE_F16;
#define R16(x) (f16 ? lm_f16_to_f32(lm_f32_to_f16(x)) : (x))
    double worst = 0.0;
    int64_t group = sh->n_head / sh->n_head_kv, nonfinite = 0;
    for (int64_t i = 0; i < N * d_q; i++) nonfinite += !isfinite(out[i]);
    for (int t = 0; t < N; t++)
        for (int64_t h = 0; h < sh->n_head; h++) {
            int64_t hk = h / group, lo = sh->window > 0 && pos[t] - sh->window + 1 > 0 ? pos[t] - sh->window + 1 : 0;
            double sc[LEN], mx = -1e300, sum = 0.0;
            for (int64_t p = lo; p <= pos[t]; p++) {
                int u = (int)(p * SEQS + seq[t]); /* the batch index that wrote (seq, p) */
                double dot = 0.0;
                for (int64_t e = 0; e < sh->hd; e++)
                    dot += (double)R16(q[t * d_q + h * sh->hd + e]) * R16(k[u * d_kv + hk * sh->hd + e]);
                sc[p] = dot * scale;
                mx = fmax(mx, sc[p]);
            }
            for (int64_t p = lo; p <= pos[t]; p++) sum += (sc[p] = exp(sc[p] - mx));
            for (int64_t e = 0; e < sh->hd; e++) {
                double o = 0.0, mag = 0.0;
                for (int64_t p = lo; p <= pos[t]; p++) {
                    int u = (int)(p * SEQS + seq[t]);
                    o += sc[p] / sum * R16(v[u * d_kv + hk * sh->hd + e]);
                    mag += sc[p] / sum * fabs(R16(v[u * d_kv + hk * sh->hd + e]));
                }
                worst = fmax(worst, fabs(o - out[t * d_q + h * sh->hd + e]) / (mag + 1e-30));
            }
        }
#undef R16
    /* each token alone (decode), and runs of 5 tokens of one sequence */
    int mismatches = 0;
    for (int t = 0; t < N; t++) {
        lm_attn_batch single = {1, &pos[t], &seq[t]};
        CHECK(b->ops->attention(b, kv, layer, &single, q + t * d_q, sh->n_head, sh->n_head_kv, sh->hd, sh->window, scale,
                                one) == LM_OK);
        mismatches += memcmp(one, out + t * d_q, sizeof(float) * d_q) != 0;
    }
    {
        int32_t p5[5], s5[5];
        float q5[5 * 256 * 8], o5[5 * 256 * 8];
        for (int t0 = 0; t0 + 5 <= LEN && 5 * d_q <= (int64_t)(sizeof q5 / sizeof q5[0]); t0 += 13) {
            for (int i = 0; i < 5; i++) {
                int t = (t0 + i) * SEQS + 1; /* sequence 1, positions t0..t0+4 */
                p5[i] = pos[t], s5[i] = seq[t];
                memcpy(q5 + i * d_q, q + t * d_q, sizeof(float) * d_q);
            }
            lm_attn_batch five = {5, p5, s5};
            CHECK(b->ops->attention(b, kv, layer, &five, q5, sh->n_head, sh->n_head_kv, sh->hd, sh->window, scale, o5) ==
                  LM_OK);
            for (int i = 0; i < 5; i++)
                mismatches += memcmp(o5 + i * d_q, out + ((t0 + i) * SEQS + 1) * d_q, sizeof(float) * d_q) != 0;
        }
    }
    {
        /* all of sequence 1 in one contiguous run: items of many tokens and blocks */
        int32_t pl[LEN], sl[LEN];
        float *ql = malloc(sizeof(float) * LEN * d_q), *ol = malloc(sizeof(float) * LEN * d_q);
        for (int i = 0; i < LEN; i++) {
            int t = i * SEQS + 1;
            pl[i] = pos[t], sl[i] = seq[t];
            memcpy(ql + i * d_q, q + t * d_q, sizeof(float) * d_q);
        }
        lm_attn_batch run = {LEN, pl, sl};
        CHECK(b->ops->attention(b, kv, layer, &run, ql, sh->n_head, sh->n_head_kv, sh->hd, sh->window, scale, ol) ==
              LM_OK);
        for (int i = 0; i < LEN; i++) mismatches += memcmp(ol + i * d_q, out + (i * SEQS + 1) * d_q, sizeof(float) * d_q) != 0;
        free(ql), free(ol);
    }
    printf("  attention %s heads %lld/%lld dim %lld window %lld, %d thread(s): vs double %.2e, alone == batched: %s\n",
           f16 ? "F16" : "F32", (long long)sh->n_head, (long long)sh->n_head_kv, (long long)sh->hd,
           (long long)sh->window, sh->threads, worst, mismatches ? "NO" : "yes");
    CHECK(worst < (f16 ? 2e-3 : 1e-5));
    CHECK(nonfinite == 0); /* fmax above passes NaN over */
    CHECK(mismatches == 0);
    free(q), free(k), free(v), free(out), free(one);
    lm_kv_cache_free(kv);
    lm_backend_free(b);
}

static void test_attention(void) {
    const attn_shape shapes[] = {
        {4, 1, 256, 0, LM_DTYPE_F16, 1},  {4, 1, 256, 24, LM_DTYPE_F16, 2}, {12, 2, 128, 0, LM_DTYPE_F16, 2},
        {12, 2, 128, 0, LM_DTYPE_F32, 1}, {9, 3, 64, 33, LM_DTYPE_F32, 2},  {3, 3, 64, 0, LM_DTYPE_F16, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) attention_case(&shapes[i]);
}

/* f32 dot with its target clones vs a plain double loop */
static void test_dot_f32(void) {
    float a[1003], b[1003];
    double exact = 0, mag = 0;
    for (int i = 0; i < 1003; i++) {
        a[i] = frand();
        b[i] = frand();
        exact += (double)a[i] * b[i];
        mag += fabs((double)a[i] * b[i]);
    }
    CHECK(fabs(lm_cpu_dot_f32(a, b, 1003) - exact) / mag < 1e-6);
    CHECK(lm_cpu_dot_f32(a, b, 0) == 0.0f);
}

/* add_rms_norm (the fused residual add and norm) against add then rms_norm: the same
 * bits in y and in the output, across the pool's row splits, without a weight, and
 * in place (out = y) */
static void test_add_rms_norm(void) {
    struct { int64_t n, d; bool weight, in_place; int threads; } cases[] = {
        {1, 1536, true, false, 1}, {7, 1000, true, false, 1}, {40, 576, true, false, 2},
        {33, 2051, false, false, 2}, {17, 64, true, true, 2},  {3, 5, true, false, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, d = cases[c].d;
        lm_backend *b = NULL;
        CHECK(lm_backend_cpu_create(cases[c].threads, &b) == LM_OK);
        if (!b) return;
        float *y0 = malloc(sizeof(float) * n * d), *x = malloc(sizeof(float) * n * d), *w = malloc(sizeof(float) * d);
        float *y_ref = malloc(sizeof(float) * n * d), *out_ref = malloc(sizeof(float) * n * d);
        float *y = malloc(sizeof(float) * n * d), *out = malloc(sizeof(float) * n * d);
        for (int64_t i = 0; i < n * d; i++) y0[i] = frand() * 3.0f, x[i] = frand() * 2.0f;
        for (int64_t i = 0; i < d; i++) w[i] = frand();
        const float *wp = cases[c].weight ? w : NULL;
        memcpy(y_ref, y0, sizeof(float) * n * d);
        b->ops->add(b, y_ref, x, n * d);
        b->ops->rms_norm(b, y_ref, wp, n, d, 1e-6f, out_ref);
        memcpy(y, y0, sizeof(float) * n * d);
        CHECK(b->ops->add_rms_norm != NULL);
        if (cases[c].in_place) {
            b->ops->add_rms_norm(b, y, x, wp, n, d, 1e-6f, y);
            CHECK(memcmp(y, out_ref, sizeof(float) * n * d) == 0);
        } else {
            b->ops->add_rms_norm(b, y, x, wp, n, d, 1e-6f, out);
            CHECK(memcmp(y, y_ref, sizeof(float) * n * d) == 0);
            CHECK(memcmp(out, out_ref, sizeof(float) * n * d) == 0);
        }
        free(y0), free(x), free(w), free(y_ref), free(out_ref), free(y), free(out);
        lm_backend_free(b);
    }
}

int main(void) {
    test_add_rms_norm();
    test_q8_quantize();
    test_q8_accuracy();
    test_q8_kernels();
    test_dot_f32();
    test_attention();
    TEST_MAIN_END();
}
