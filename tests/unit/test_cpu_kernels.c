/* Every fast CPU kernel against the scalar reference on random inputs.
 *
 * q8 integer dot products (decode path): the SIMD kernel must equal the scalar
 * kernel of the same arithmetic (weights dequantized exactly, activations quantized
 * to 8 bits) within 1e-5 of sum |w_i * x_i| — only summation order differs — and
 * stay within 0.5% of that scale from the exact f32 dot (the quantization of the
 * activations is the only approximation). */
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_q8.h"
#include "tensor/quant.h"
#include "test.h"

static uint64_t g_rng = 42;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((g_rng >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
}

static void test_q8_kernels(void) {
    const lm_dtype types[] = {LM_DTYPE_Q4_0, LM_DTYPE_Q4_1, LM_DTYPE_Q5_0, LM_DTYPE_Q5_1,
                              LM_DTYPE_Q8_0, LM_DTYPE_Q4_K, LM_DTYPE_Q5_K, LM_DTYPE_Q6_K};
    enum { N = 1024, ROWS = 16 };
    static float w[N], x[N], wd[N];
    static uint8_t wq[N * 2];
    static lm_q8a_block a[N / 32];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        lm_dtype t = types[ti];
        lm_q8a_dot_fn ref = lm_q8a_dot_scalar_for(t);
        CHECK(ref != NULL);
#if defined(__x86_64__)
        bool has_avx2 = lm_cpu_has_avx2(), has_vnni = lm_cpu_has_avx512_vnni();
        lm_q8a_kernels ka = has_avx2 ? lm_q8a_kernels_for_avx2(t) : (lm_q8a_kernels){NULL, NULL};
        lm_q8a_kernels kv = has_vnni ? lm_q8a_kernels_for_vnni(t) : (lm_q8a_kernels){NULL, NULL};
#else
        lm_q8a_kernels ka = {NULL, NULL}, kv = {NULL, NULL};
#endif
        lm_q8a_dot_fn avx2 = ka.dot, vnni = kv.dot, fast = vnni ? vnni : avx2;
        lm_q8a_dot4_fn fast4 = vnni ? kv.dot4 : ka.dot4;
        bool same_x4 = true;
        if (!fast) {
            printf("  %-5s no SIMD kernel on this CPU: SKIPPED\n", lm_dtype_name(t));
            continue;
        }
        double worst_simd = 0, worst_quant = 0;
        bool same_isa = true;
        for (int r = 0; r < ROWS; r++) {
            float scale = r % 4 == 0 ? 100.0f : r % 4 == 1 ? 1e-3f : 1.0f;
            for (int i = 0; i < N; i++) {
                w[i] = frand() * scale + (r % 3 == 0 ? 0.3f * scale : 0.0f); /* some rows off-centre */
                x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
            }
            CHECK(lm_quantize_row(t, w, wq, N));
            CHECK(lm_dequantize_row(t, wq, wd, N));
            lm_q8a_quantize_row(x, a, N, lm_q8a_style_for(t));
            double exact = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                exact += (double)wd[i] * x[i];
                mag += fabs((double)wd[i] * x[i]);
            }
            double f = fast(wq, a, N), s = ref(wq, a, N);
            /* both instruction sets compute the same integers in the same order */
            if (avx2 && vnni && avx2(wq, a, N) != vnni(wq, a, N)) same_isa = false;
            /* four activation rows at once: each result equals the one-row kernel's */
            static lm_q8a_block a4[4 * (N / 32)];
            static float x4[N];
            for (int tok = 0; tok < 4; tok++) {
                for (int i = 0; i < N; i++) x4[i] = frand() * (float)(tok + 1);
                lm_q8a_quantize_row(x4, a4 + tok * (N / 32), N, lm_q8a_style_for(t));
            }
            float out4[4];
            fast4(wq, a4, N / 32, N, out4);
            for (int tok = 0; tok < 4; tok++)
                if (out4[tok] != fast(wq, a4 + tok * (N / 32), N)) same_x4 = false;
            worst_simd = fmax(worst_simd, fabs(f - s) / mag);
            worst_quant = fmax(worst_quant, fabs(f - exact) / mag);
        }
        printf("  %-5s %s vs scalar %.2e, vs exact f32 %.2e (relative to sum|w*x|)%s\n", lm_dtype_name(t),
               vnni ? "VNNI" : "AVX2", worst_simd, worst_quant, vnni && avx2 ? ", AVX2 == VNNI and x4 == x1 bit for bit" : ", x4 == x1 bit for bit");
        CHECK(same_isa);
        CHECK(same_x4);
        CHECK(worst_simd < 1e-5);
        CHECK(worst_quant < 5e-3);
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

int main(void) {
    test_q8_quantize();
    test_q8_kernels();
    test_dot_f32();
    TEST_MAIN_END();
}
