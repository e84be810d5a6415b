/* Tests of the scalar reference tensor formats (src/tensor): dtype traits, f16/bf16,
 * every GGUF block format (hand-built blocks, gguf-py reference vectors, round trips,
 * dot products) and MLX affine quantization.
 *
 * The reference vectors in tests/data/quant/ come from scripts/make_quant_vectors.py
 * (the PyPI `gguf` package's dequantizers); dequantization must match them bit for
 * bit: both compute in IEEE float32 in the same order, with no fused multiply-add. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"
#include "tensor/quant.h"
#include "test.h"

#ifndef LUMEN_SOURCE_DIR
#define LUMEN_SOURCE_DIR "."
#endif

/* ---- helpers -------------------------------------------------------------------- */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Reads tests/data/quant/<name> into a malloc'd buffer; NULL if absent. */
static void *read_data(const char *name, size_t *size) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/quant/%s", LUMEN_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(len > 0 ? (size_t)len : 1);
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    *size = got;
    return buf;
}

/* Deterministic pseudo-random numbers: xorshift64*, and a Gaussian by Box-Muller. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rng_uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}
static float rng_gauss(void) {
    double u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Dequantizes one block (or row) of `type` into y. */
static void deq(lm_dtype type, const void *blk, float *y, int64_t n) {
    CHECK(lm_dequantize_row(type, blk, y, n));
}

#define CHECK_EQF(got, want) CHECK_NEAR((got), (want), 0.0)

/* ---- dtype traits --------------------------------------------------------------- */

static void test_dtype(void) {
    static const struct { lm_dtype t; const char *name; int64_t bs; size_t bb; } k[] = {
        {LM_DTYPE_F32, "F32", 1, 4},      {LM_DTYPE_F16, "F16", 1, 2},
        {LM_DTYPE_BF16, "BF16", 1, 2},    {LM_DTYPE_F64, "F64", 1, 8},
        {LM_DTYPE_I8, "I8", 1, 1},        {LM_DTYPE_I64, "I64", 1, 8},
        {LM_DTYPE_U32, "U32", 1, 4},      {LM_DTYPE_BOOL, "BOOL", 1, 1},
        {LM_DTYPE_Q4_0, "Q4_0", 32, 18},  {LM_DTYPE_Q4_1, "Q4_1", 32, 20},
        {LM_DTYPE_Q5_0, "Q5_0", 32, 22},  {LM_DTYPE_Q5_1, "Q5_1", 32, 24},
        {LM_DTYPE_Q8_0, "Q8_0", 32, 34},  {LM_DTYPE_Q8_1, "Q8_1", 32, 36},
        {LM_DTYPE_Q2_K, "Q2_K", 256, 84}, {LM_DTYPE_Q3_K, "Q3_K", 256, 110},
        {LM_DTYPE_Q4_K, "Q4_K", 256, 144},{LM_DTYPE_Q5_K, "Q5_K", 256, 176},
        {LM_DTYPE_Q6_K, "Q6_K", 256, 210},{LM_DTYPE_Q8_K, "Q8_K", 256, 292},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const lm_dtype_info *info = lm_dtype_get_info(k[i].t);
        CHECK(info != NULL);
        if (!info) continue;
        CHECK(strcmp(info->name, k[i].name) == 0);
        CHECK(info->block_size == k[i].bs);
        CHECK(info->block_bytes == k[i].bb);
        CHECK(info->quantized == (k[i].bs > 1));
        CHECK(strcmp(lm_dtype_name(k[i].t), k[i].name) == 0);
        lm_dtype t = LM_DTYPE_F32;
        CHECK(lm_dtype_from_name(k[i].name, &t) && t == k[i].t);
        CHECK(lm_dtype_row_bytes(k[i].t, 4 * k[i].bs) == 4 * k[i].bb);
        if (k[i].bs > 1) CHECK(lm_dtype_row_bytes(k[i].t, k[i].bs + 1) == 0);
    }
    lm_dtype t;
    CHECK(lm_dtype_from_name("q4_k", &t) && t == LM_DTYPE_Q4_K);
    CHECK(!lm_dtype_from_name("Q9_9", &t));
    CHECK(!lm_dtype_from_name(NULL, &t));
    CHECK(lm_dtype_get_info(4) == NULL); /* GGUF's removed Q4_2 */
    CHECK(lm_dtype_get_info(-1) == NULL);
    CHECK(strcmp(lm_dtype_name(12345), "unknown") == 0);
    CHECK(lm_dtype_row_bytes((lm_dtype)12345, 32) == 0);
    CHECK(lm_dtype_row_bytes(LM_DTYPE_Q4_K, 4096) == 16 * 144);
    /* affine: n * bits / 8, whole uint32 words */
    CHECK(lm_affine_row_bytes(4, 64) == 32);
    CHECK(lm_affine_row_bytes(8, 64) == 64);
    CHECK(lm_affine_row_bytes(3, 64) == 24);
    CHECK(lm_affine_row_bytes(6, 32) == 24);
    CHECK(lm_affine_row_bytes(2, 16) == 4);
    CHECK(lm_affine_row_bytes(3, 16) == 0); /* 48 bits: not whole words */
    CHECK(lm_affine_row_bytes(4, 4) == 0);
    CHECK(lm_affine_row_bytes(5, 64) == 0);
    CHECK(lm_affine_row_bytes(1, 64) == 0);
}

/* ---- f16 / bf16 ----------------------------------------------------------------- */

static void test_half(void) {
    /* every f16 against the definition: (-1)^s * 2^(e-15) * (1 + m/1024), or
     * 2^-14 * m/1024 when e == 0; and back again to the same bits */
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float f = lm_f16_to_f32((uint16_t)h);
        if (e == 31) {
            CHECK(m ? isnan(f) : isinf(f));
            CHECK((signbit(f) != 0) == (s != 0));
            if (m) CHECK(isnan(lm_f16_to_f32(lm_f32_to_f16(f))));
            else CHECK(lm_f32_to_f16(f) == h);
            continue;
        }
        double want = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
        if (s) want = -want;
        if ((double)f != want || (signbit(f) != 0) != (s != 0)) {
            fprintf(stderr, "f16 0x%04x -> %.9g, want %.9g\n", h, f, want);
            lm_test_failures++;
        }
        if (lm_f32_to_f16(f) != h) {
            fprintf(stderr, "f16 round trip 0x%04x -> 0x%04x\n", h, lm_f32_to_f16(f));
            lm_test_failures++;
        }
    }
    /* f32 -> f16 rounding, worked by hand */
    CHECK(lm_f32_to_f16(65504.0f) == 0x7bff);         /* largest finite          */
    CHECK(lm_f32_to_f16(65519.99f) == 0x7bff);        /* below the midpoint      */
    CHECK(lm_f32_to_f16(65520.0f) == 0x7c00);         /* tie, 0x7bff odd -> inf  */
    CHECK(lm_f32_to_f16(1e10f) == 0x7c00);
    CHECK(lm_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(lm_f32_to_f16(-0.0f) == 0x8000);
    CHECK(lm_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); /* tie between 1 and 1+2^-10 -> even */
    CHECK(lm_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02); /* tie between 0x3c01, 0x3c02 -> even */
    CHECK(lm_f32_to_f16(bitsf(0x3f801001u)) == 0x3c01);  /* 1 + 2^-11 + 2^-23: above the tie */
    CHECK(lm_f32_to_f16(0x1p-14f) == 0x0400);         /* smallest normal         */
    CHECK(lm_f32_to_f16(0x1p-24f) == 0x0001);         /* smallest subnormal      */
    CHECK(lm_f32_to_f16(0x1p-25f) == 0x0000);         /* tie 0 / 2^-24 -> 0      */
    CHECK(lm_f32_to_f16(0x1.000002p-25f) == 0x0001);  /* just above the tie      */
    CHECK(lm_f32_to_f16(0x3p-25f) == 0x0002);         /* tie 1 / 2 -> 2          */
    CHECK(lm_f32_to_f16(-0x5p-25f) == 0x8002);        /* tie 2 / 3 -> 2          */
    CHECK(lm_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400); /* tie 0x3ff / 0x400 -> 0x400 */
    CHECK(lm_f32_to_f16(0x1p-30f) == 0x0000);
    CHECK(lm_f32_to_f16(1e-45f) == 0x0000);           /* f32 subnormal           */
    uint16_t hn = lm_f32_to_f16(bitsf(0x7f800001u)); /* signalling NaN stays NaN */
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    hn = lm_f32_to_f16(bitsf(0xffc00000u));
    CHECK(hn == 0xfe00);
    CHECK(isnan(lm_f16_to_f32(0x7e00)));

    /* bf16: the top half of an f32, rounded to nearest even */
    CHECK(lm_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(lm_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(lm_bf16_to_f32(0xc0a0) == -5.0f);
    CHECK(lm_bf16_to_f32(0x0001) == 0x1p-133f);       /* subnormal, exact        */
    CHECK(lm_f32_to_bf16(bitsf(0x3f808000u)) == 0x3f80); /* tie -> even 0x3f80    */
    CHECK(lm_f32_to_bf16(bitsf(0x3f818000u)) == 0x3f82); /* tie -> even 0x3f82    */
    CHECK(lm_f32_to_bf16(bitsf(0x3f808001u)) == 0x3f81); /* above the tie         */
    CHECK(lm_f32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to inf */
    CHECK(lm_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(lm_f32_to_bf16(bitsf(0x7f800001u)) == 0x7fc0); /* NaN kept, made quiet  */
    CHECK(lm_f32_to_bf16(bitsf(0xffffffffu)) == 0xffff);
    CHECK(isnan(lm_bf16_to_f32(0x7fc1)));

    /* against numpy's float16 cast and gguf-py's BF16 (ggml's rounding) */
    size_t nin = 0, n16 = 0, nb16 = 0;
    float *in = read_data("cvt.in", &nin);
    uint16_t *r16 = read_data("cvt_f16.ref", &n16), *rb16 = read_data("cvt_bf16.ref", &nb16);
    CHECK(in && r16 && rb16 && nin / 4 == n16 / 2 && nin / 4 == nb16 / 2 && nin > 0);
    if (in && r16 && rb16) {
        for (size_t i = 0; i < nin / 4; i++) {
            uint16_t h = lm_f32_to_f16(in[i]), b = lm_f32_to_bf16(in[i]);
            if (isnan(in[i])) {
                /* numpy keeps a signalling NaN's payload as is; we quiet it, as the
                 * F16C instructions do. Both stay NaN with the sign kept. */
                CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) && (h >> 15) == (r16[i] >> 15));
            } else if (h != r16[i]) {
                fprintf(stderr, "f16(%.9g) = 0x%04x, numpy 0x%04x\n", in[i], h, r16[i]);
                lm_test_failures++;
            }
            if (b != rb16[i]) {
                fprintf(stderr, "bf16(%.9g) = 0x%04x, gguf 0x%04x\n", in[i], b, rb16[i]);
                lm_test_failures++;
            }
        }
    }
    free(in);
    free(r16);
    free(rb16);
}

/* ---- hand-built blocks, one per format ------------------------------------------ */

static void test_hand_legacy(void) {
    uint8_t b[40];
    float y[32];

    /* Q4_0: d = 0.5 (f16 0x3800); qs[j] = j | (15 - j) << 4.
     * y[j] = (j - 8) * 0.5 for j < 16; y[16 + j] = ((15 - j) - 8) * 0.5. */
    put16(b, 0x3800);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    deq(LM_DTYPE_Q4_0, b, y, 32);
    CHECK_EQF(y[0], -4.0);  /* (0 - 8) * 0.5   */
    CHECK_EQF(y[9], 0.5);   /* (9 - 8) * 0.5   */
    CHECK_EQF(y[15], 3.5);  /* (15 - 8) * 0.5  */
    CHECK_EQF(y[16], 3.5);  /* high nibble of qs[0] = 15 */
    CHECK_EQF(y[31], -4.0); /* high nibble of qs[15] = 0 */

    /* Q4_1: d = 0.25 (0x3400), m = -1 (0xbc00); qs[j] = j | 0xf0.
     * y[j] = j * 0.25 - 1; y[16 + j] = 15 * 0.25 - 1 = 2.75. */
    put16(b, 0x3400);
    put16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | 0xf0);
    deq(LM_DTYPE_Q4_1, b, y, 32);
    CHECK_EQF(y[0], -1.0);
    CHECK_EQF(y[6], 0.5);   /* 6 * 0.25 - 1 */
    CHECK_EQF(y[15], 2.75);
    CHECK_EQF(y[20], 2.75);

    /* Q5_0: d = 1 (0x3c00), qh = 0x80000001 (bits 0 and 31), qs all 0 but qs[15] = 0xf0.
     * y[0]  = (0 | 16) - 16 = 0       y[1]  = 0 - 16 = -16
     * y[15] = (0) - 16 = -16          y[31] = (15 | 16) - 16 = 15
     * y[16] = 0 - 16 = -16 (bit 16 of qh clear) */
    memset(b, 0, sizeof b);
    put16(b, 0x3c00);
    b[2] = 0x01;
    b[5] = 0x80;
    b[6 + 15] = 0xf0;
    deq(LM_DTYPE_Q5_0, b, y, 32);
    CHECK_EQF(y[0], 0.0);
    CHECK_EQF(y[1], -16.0);
    CHECK_EQF(y[15], -16.0);
    CHECK_EQF(y[16], -16.0);
    CHECK_EQF(y[31], 15.0);

    /* Q5_1: d = 2 (0x4000), m = 0.5 (0x3800), qh = 0x0000ffff, qs[j] = 0x5a.
     * y[j] = (0xa | 16) * 2 + 0.5 = 52.5 for j < 16; y[16 + j] = 5 * 2 + 0.5 = 10.5 */
    memset(b, 0, sizeof b);
    put16(b, 0x4000);
    put16(b + 2, 0x3800);
    b[4] = 0xff;
    b[5] = 0xff;
    for (int j = 0; j < 16; j++) b[8 + j] = 0x5a;
    deq(LM_DTYPE_Q5_1, b, y, 32);
    CHECK_EQF(y[0], 52.5);
    CHECK_EQF(y[15], 52.5);
    CHECK_EQF(y[16], 10.5);
    CHECK_EQF(y[31], 10.5);

    /* Q8_0: d = 0.125 (0x3000), qs[j] = j - 16, but qs[0] = -128. y = q / 8. */
    put16(b, 0x3000);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    b[2] = 0x80;
    deq(LM_DTYPE_Q8_0, b, y, 32);
    CHECK_EQF(y[0], -16.0);  /* -128 / 8 */
    CHECK_EQF(y[1], -1.875); /* -15 / 8  */
    CHECK_EQF(y[16], 0.0);
    CHECK_EQF(y[31], 1.875);

    /* Q8_1: d = 0.5 (0x3800), s ignored by dequantization, qs[j] = 127 - 8j.
     * y[j] = (127 - 8j) * 0.5: y[0] = 63.5, y[31] = -60.5 */
    put16(b, 0x3800);
    put16(b + 2, 0x7bff);
    for (int j = 0; j < 32; j++) b[4 + j] = (uint8_t)(int8_t)(127 - 8 * j);
    deq(LM_DTYPE_Q8_1, b, y, 32);
    CHECK_EQF(y[0], 63.5);
    CHECK_EQF(y[16], -0.5);
    CHECK_EQF(y[31], -60.5);
}

static void test_hand_kquants(void) {
    uint8_t b[292];
    float y[256];

    /* Q2_K: scales[i] = i | 2 << 4 (sub-block i: sc = i, m = 2); d = 1 (0x3c00),
     * dmin = 0.5 (0x3800), so y = i * q - 1. qs[0..31] = 0xe4 (2-bit fields 0,1,2,3 from
     * the bottom: q = (e % 128) / 32 for e < 128); qs[32..63] = 0x1b (fields 3,2,1,0:
     * q = 3 - (e % 128) / 32 for e >= 128); qs[5] = 0xff (q = 3 for e = 5, 37, 69, 101).
     *   e = 0:   sub 0,  q 0  -> 0 * 0 - 1 = -1
     *   e = 40:  sub 2,  q 1  -> 2 * 1 - 1 = 1
     *   e = 37:  sub 2,  q 3  -> 2 * 3 - 1 = 5
     *   e = 100: sub 6,  q 3  -> 6 * 3 - 1 = 17
     *   e = 130: sub 8,  q 3  -> 8 * 3 - 1 = 23
     *   e = 255: sub 15, q 0  -> -1
     *   e = 200: sub 12, q 3 - 72/32 = 1 -> 11 */
    memset(b, 0, sizeof b);
    for (int i = 0; i < 16; i++) b[i] = (uint8_t)(i | 2 << 4);
    for (int k = 0; k < 32; k++) b[16 + k] = 0xe4;
    for (int k = 32; k < 64; k++) b[16 + k] = 0x1b;
    b[16 + 5] = 0xff;
    put16(b + 80, 0x3c00);
    put16(b + 82, 0x3800);
    deq(LM_DTYPE_Q2_K, b, y, 256);
    CHECK_EQF(y[0], -1.0);
    CHECK_EQF(y[40], 1.0);
    CHECK_EQF(y[37], 5.0);
    CHECK_EQF(y[100], 17.0);
    CHECK_EQF(y[130], 23.0);
    CHECK_EQF(y[255], -1.0);
    CHECK_EQF(y[200], 11.0);

    /* Q3_K: d = 0.5 (0x3800) at byte 108. 6-bit scales (stored +32) in bytes 96..107:
     * s[0] = 0x21 -> low nibbles: scale 0 = 1, scale 8 = 2; s[8] = 0xe4 -> top 2 bits:
     * scale 0 gets 0, scale 4 gets 1, scale 8 gets 2, scale 12 gets 3. So
     *   u0 = 1 -> -31;  u4 = 16 -> -16;  u8 = 2 | 32 = 34 -> 2;  u12 = 48 -> 16;
     *   every other u = 0 -> -32.
     * qs all 0xe4: low 2 bits q = (e % 128) / 32. hmask[l] = 0xf0: bit e / 32 set only
     * for e >= 128, where no 4 is subtracted; for e < 128 q -= 4.
     *   e = 0:   sub 0,  q 0 - 4 = -4 -> (0.5 * -31) * -4 = 62
     *   e = 16:  sub 1,  q -4 -> (0.5 * -32) * -4 = 64
     *   e = 70:  sub 4,  q 2 - 4 = -2 -> (0.5 * -16) * -2 = 16
     *   e = 130: sub 8,  q 0 -> 0
     *   e = 200: sub 12, q 2 -> (0.5 * 16) * 2 = 16
     *   e = 255: sub 15, q 3 -> (0.5 * -32) * 3 = -48 */
    memset(b, 0, sizeof b);
    for (int l = 0; l < 32; l++) b[l] = 0xf0;
    for (int k = 0; k < 64; k++) b[32 + k] = 0xe4;
    b[96 + 0] = 0x21;
    b[96 + 8] = 0xe4;
    put16(b + 108, 0x3800);
    deq(LM_DTYPE_Q3_K, b, y, 256);
    CHECK_EQF(y[0], 62.0);
    CHECK_EQF(y[16], 64.0);
    CHECK_EQF(y[70], 16.0);
    CHECK_EQF(y[130], 0.0);
    CHECK_EQF(y[200], 16.0);
    CHECK_EQF(y[255], -48.0);

    /* Q4_K: d = 0.5 (0x3800), dmin = 0.25 (0x3400); scales bytes 4..15:
     *   s[0] = 0x45: scale 0 = 5, top bits 01 -> scale 4 gets 1 << 4
     *   s[1] = 0x07: scale 1 = 7
     *   s[4] = 0x83: min 0 = 3, top bits 10 -> min 4 gets 2 << 4
     *   s[8] = 0x72: scale 4 low nibble 2, min 4 low nibble 7
     * so sc = {5, 7, 0, 0, 18, 0, 0, 0}, m = {3, 0, 0, 0, 39, 0, 0, 0}.
     * qs (bytes 16..143) all 0x9c (low nibble 12, high 9) but qs[0] = 0x1f.
     *   e = 0:   sub 0, low nibble of qs[0] = 15 -> 2.5 * 15 - 0.75 = 36.75
     *   e = 1:   sub 0, q 12 -> 2.5 * 12 - 0.75 = 29.25
     *   e = 32:  sub 1, high nibble of qs[0] = 1 -> 3.5 * 1 - 0 = 3.5
     *   e = 40:  sub 1, q 9 -> 31.5
     *   e = 128: sub 4, low nibble of qs[64] = 12 -> 9 * 12 - 9.75 = 98.25
     *   e = 160: sub 5 -> 0 */
    memset(b, 0, sizeof b);
    put16(b, 0x3800);
    put16(b + 2, 0x3400);
    b[4 + 0] = 0x45;
    b[4 + 1] = 0x07;
    b[4 + 4] = 0x83;
    b[4 + 8] = 0x72;
    for (int k = 0; k < 128; k++) b[16 + k] = 0x9c;
    b[16] = 0x1f;
    deq(LM_DTYPE_Q4_K, b, y, 256);
    CHECK_EQF(y[0], 36.75);
    CHECK_EQF(y[1], 29.25);
    CHECK_EQF(y[32], 3.5);
    CHECK_EQF(y[40], 31.5);
    CHECK_EQF(y[128], 98.25);
    CHECK_EQF(y[160], 0.0);

    /* Q5_K: the same d, dmin, scales; qh (bytes 16..47): qh[0] = 0x01 (bit 4 for e = 0),
     * qh[l] = 0x10 for l >= 1 (bit 4 for e = 128 + l); qs (48..175) 0x9c, qs[0] = 0x1f.
     *   e = 0:   q = 15 | 16 = 31 -> 2.5 * 31 - 0.75 = 76.75
     *   e = 1:   q = 12 -> 29.25
     *   e = 32:  q = 1 (qh[0] bit 1 clear) -> 3.5
     *   e = 128: q = 12 (qh[0] bit 4 clear) -> 98.25
     *   e = 129: q = 12 | 16 = 28 -> 9 * 28 - 9.75 = 242.25 */
    memset(b + 16, 0, sizeof b - 16);
    b[16] = 0x01;
    for (int l = 1; l < 32; l++) b[16 + l] = 0x10;
    for (int k = 0; k < 128; k++) b[48 + k] = 0x9c;
    b[48] = 0x1f;
    deq(LM_DTYPE_Q5_K, b, y, 256);
    CHECK_EQF(y[0], 76.75);
    CHECK_EQF(y[1], 29.25);
    CHECK_EQF(y[32], 3.5);
    CHECK_EQF(y[128], 98.25);
    CHECK_EQF(y[129], 242.25);

    /* Q6_K: d = 0.5 (0x3800) at 208; scales (int8, 192..207) sc[i] = i - 8; ql (0..127)
     * all 0x21 (low nibble 1, high 2) but ql[64] = 0x5f; qh (128..191) all 0xe4 (2-bit
     * fields 0,1,2,3). With r = e % 128: low 4 bits = r < 64 ? 1 : 2, high 2 bits = r / 32.
     *   e = 0:   q = 1 - 32 = -31,          sc -8 -> (0.5 * -8) * -31 = 124
     *   e = 40:  q = (1 | 1 << 4) - 32 = -15, sc -6 -> -3 * -15 = 45
     *   e = 100: q = (2 | 3 << 4) - 32 = 18,  sc -2 -> -1 * 18 = -18
     *   e = 192: r = 64: high nibble of ql[64] = 5, high bits 2 -> q = 37 - 32 = 5,
     *            sc 4 -> 2 * 5 = 10
     *   e = 255: q = 18, sc 7 -> 3.5 * 18 = 63 */
    memset(b, 0, sizeof b);
    for (int k = 0; k < 128; k++) b[k] = 0x21;
    b[64] = 0x5f;
    for (int k = 0; k < 64; k++) b[128 + k] = 0xe4;
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i - 8);
    put16(b + 208, 0x3800);
    deq(LM_DTYPE_Q6_K, b, y, 256);
    CHECK_EQF(y[0], 124.0);
    CHECK_EQF(y[40], 45.0);
    CHECK_EQF(y[100], -18.0);
    CHECK_EQF(y[192], 10.0);
    CHECK_EQF(y[255], 63.0);

    /* Q8_K: d = 0.25 as f32 (0x3e800000), qs[e] = e - 128: y = (e - 128) / 4. */
    memset(b, 0, sizeof b);
    b[0] = 0x00; b[1] = 0x00; b[2] = 0x80; b[3] = 0x3e;
    for (int e = 0; e < 256; e++) b[4 + e] = (uint8_t)(int8_t)(e - 128);
    deq(LM_DTYPE_Q8_K, b, y, 256);
    CHECK_EQF(y[0], -32.0);
    CHECK_EQF(y[129], 0.25);
    CHECK_EQF(y[255], 31.75);
}

/* ---- gguf-py reference vectors ---------------------------------------------------- */

static const struct { lm_dtype type; const char *name; } k_formats[] = {
    {LM_DTYPE_Q4_0, "q4_0"}, {LM_DTYPE_Q4_1, "q4_1"}, {LM_DTYPE_Q5_0, "q5_0"},
    {LM_DTYPE_Q5_1, "q5_1"}, {LM_DTYPE_Q8_0, "q8_0"}, {LM_DTYPE_Q8_1, "q8_1"},
    {LM_DTYPE_Q2_K, "q2_k"}, {LM_DTYPE_Q3_K, "q3_k"}, {LM_DTYPE_Q4_K, "q4_k"},
    {LM_DTYPE_Q5_K, "q5_k"}, {LM_DTYPE_Q6_K, "q6_k"}, {LM_DTYPE_Q8_K, "q8_k"},
};
enum { N_FORMATS = sizeof k_formats / sizeof k_formats[0] };

static void test_reference_vectors(void) {
    for (int f = 0; f < N_FORMATS; f++) {
        char nb[64], nr[64];
        snprintf(nb, sizeof nb, "%s.blocks", k_formats[f].name);
        snprintf(nr, sizeof nr, "%s.ref", k_formats[f].name);
        size_t sb = 0, sr = 0;
        uint8_t *blocks = read_data(nb, &sb);
        float *ref = read_data(nr, &sr);
        const lm_dtype_info *info = lm_dtype_get_info(k_formats[f].type);
        CHECK(blocks && ref && info);
        if (blocks && ref && info) {
            int64_t n = (int64_t)(sr / 4);
            CHECK(sb == lm_dtype_row_bytes(k_formats[f].type, n) && n > 0);
            float *y = malloc((size_t)n * sizeof *y);
            CHECK(lm_dequantize_row(k_formats[f].type, blocks, y, n));
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                if (fbits(y[i]) != fbits(ref[i])) {
                    if (bad < 5)
                        fprintf(stderr, "%s[%lld]: %.9g, reference %.9g\n", k_formats[f].name,
                                (long long)i, y[i], ref[i]);
                    bad++;
                }
            }
            if (bad) fprintf(stderr, "%s: %d of %lld values differ\n", k_formats[f].name, bad, (long long)n);
            CHECK(bad == 0);
            free(y);
        }
        free(blocks);
        free(ref);
    }
}

/* ---- quantize -> dequantize round trips ------------------------------------------- */

static void test_round_trip(void) {
    /* Bounds on RMS error / RMS of the data, for Gaussian data (n = 4096), with margin
     * over what these plain quantizers reach (printed on failure). */
    static const struct { lm_dtype type; double max_rel_rms; } k[] = {
        {LM_DTYPE_Q4_0, 0.12}, {LM_DTYPE_Q4_1, 0.10}, {LM_DTYPE_Q5_0, 0.06},
        {LM_DTYPE_Q5_1, 0.05}, {LM_DTYPE_Q8_0, 0.008}, {LM_DTYPE_Q8_1, 0.008},
        {LM_DTYPE_Q2_K, 0.45}, {LM_DTYPE_Q3_K, 0.22}, {LM_DTYPE_Q4_K, 0.10},
        {LM_DTYPE_Q5_K, 0.05}, {LM_DTYPE_Q6_K, 0.03}, {LM_DTYPE_Q8_K, 0.014},
        {LM_DTYPE_F16, 0.0005}, {LM_DTYPE_BF16, 0.004}, {LM_DTYPE_F32, 0.0},
    };
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (int i = 0; i < N; i++) x[i] = rng_gauss() * (i % 97 == 0 ? 4.0f : 1.0f);
    for (size_t t = 0; t < sizeof k / sizeof k[0]; t++) {
        memset(q, 0xaa, sizeof q);
        CHECK(lm_quantize_row(k[t].type, x, q, N));
        CHECK(lm_dequantize_row(k[t].type, q, y, N));
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        if (getenv("LM_TEST_VERBOSE")) fprintf(stderr, "%s rel rms %.5f\n", lm_dtype_name(k[t].type), rel);
        if (!(rel <= k[t].max_rel_rms))
            fprintf(stderr, "%s round trip: relative RMS error %.5f > %.5f\n",
                    lm_dtype_name(k[t].type), rel, k[t].max_rel_rms);
        CHECK(rel <= k[t].max_rel_rms);
        /* quantizing the dequantized values again must reproduce them closely */
        static float y2[N];
        CHECK(lm_quantize_row(k[t].type, y, q, N));
        CHECK(lm_dequantize_row(k[t].type, q, y2, N));
        double se2 = 0;
        for (int i = 0; i < N; i++) se2 += (double)(y2[i] - y[i]) * (y2[i] - y[i]);
        CHECK(sqrt(se2 / sx) <= k[t].max_rel_rms);
    }
    /* constant and all-zero blocks stay exact for the formats that can hold them */
    for (int i = 0; i < N; i++) x[i] = 0.0f;
    for (int f = 0; f < N_FORMATS; f++) {
        CHECK(lm_quantize_row(k_formats[f].type, x, q, 256));
        CHECK(lm_dequantize_row(k_formats[f].type, q, y, 256));
        for (int i = 0; i < 256; i++) CHECK(y[i] == 0.0f);
    }
    /* Q8_1's s and Q8_K's bsums are consistent with the codes */
    for (int i = 0; i < 256; i++) x[i] = rng_gauss();
    CHECK(lm_quantize_row(LM_DTYPE_Q8_1, x, q, 32));
    {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)q[4 + j];
        float d = lm_f16_to_f32((uint16_t)(q[0] | q[1] << 8));
        float s = lm_f16_to_f32((uint16_t)(q[2] | q[3] << 8));
        CHECK_NEAR(s, d * sum, fabs(d * sum) * 1e-3 + 1e-6);
    }
    CHECK(lm_quantize_row(LM_DTYPE_Q8_K, x, q, 256));
    for (int s = 0; s < 16; s++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += (int8_t)q[4 + 16 * s + j];
        CHECK((int16_t)(q[260 + 2 * s] | q[261 + 2 * s] << 8) == sum);
    }
    /* unsupported */
    CHECK(!lm_quantize_row(LM_DTYPE_I32, x, q, 32));
    CHECK(!lm_quantize_row(LM_DTYPE_Q4_0, x, q, 31));
    CHECK(!lm_dequantize_row(LM_DTYPE_AFFINE, q, y, 32));
    CHECK(!lm_dequantize_row(LM_DTYPE_Q4_K, q, y, 255));
}

/* ---- dot products ----------------------------------------------------------------- */

static void test_dot(void) {
    enum { N = 1024 };
    static float x[N], w[N], y[N];
    static uint8_t q[N * 8];
    static const lm_dtype plain[] = {LM_DTYPE_F32, LM_DTYPE_F16, LM_DTYPE_BF16};
    for (int i = 0; i < N; i++) {
        x[i] = rng_gauss();
        w[i] = rng_gauss();
    }
    for (int f = 0; f < N_FORMATS + 3; f++) {
        lm_dtype t = f < N_FORMATS ? k_formats[f].type : plain[f - N_FORMATS];
        CHECK(lm_quantize_row(t, w, q, N));
        CHECK(lm_dequantize_row(t, q, y, N));
        double ref = 0, mag = 0;
        for (int i = 0; i < N; i++) {
            ref += (double)y[i] * x[i];
            mag += fabs((double)y[i] * x[i]);
        }
        float got = lm_dot_row_f32(t, q, x, N);
        /* relative to the sum of |terms|, so cancellation cannot make it flaky */
        if (!(fabs(got - ref) <= 1e-5 * mag))
            fprintf(stderr, "%s dot %.9g vs %.9g\n", lm_dtype_name(t), got, ref);
        CHECK(fabs(got - ref) <= 1e-5 * mag);
    }
    /* the reference vectors too (random bit patterns, odd scales) */
    for (int f = 0; f < N_FORMATS; f++) {
        char nb[64];
        snprintf(nb, sizeof nb, "%s.blocks", k_formats[f].name);
        size_t sb = 0;
        uint8_t *blocks = read_data(nb, &sb);
        if (!blocks) { CHECK(0); continue; }
        const lm_dtype_info *info = lm_dtype_get_info(k_formats[f].type);
        int64_t n = (int64_t)(sb / info->block_bytes) * info->block_size;
        CHECK(n <= N);
        CHECK(lm_dequantize_row(k_formats[f].type, blocks, y, n));
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)y[i] * x[i];
            mag += fabs((double)y[i] * x[i]);
        }
        float got = lm_dot_row_f32(k_formats[f].type, blocks, x, n);
        CHECK(fabs(got - ref) <= 1e-5 * mag);
        free(blocks);
    }
    /* integer rows convert exactly */
    int32_t iv[4] = {-3, 0, 7, 100000};
    float xs[4] = {1, 2, 3, 0.5f}, yv[4];
    CHECK(lm_dequantize_row(LM_DTYPE_I32, iv, yv, 4));
    CHECK(yv[0] == -3.0f && yv[3] == 100000.0f);
    CHECK(lm_dot_row_f32(LM_DTYPE_I32, iv, xs, 4) == -3.0f + 21.0f + 50000.0f);
    CHECK(lm_dot_row_f32(LM_DTYPE_Q4_0, q, xs, 4) == 0.0f); /* bad n -> 0 */
}

/* ---- MLX affine ------------------------------------------------------------------- */

static void test_affine(void) {
    enum { N = 256 };
    uint32_t packed[N];
    float y[N], sf[8], bf[8];
    uint16_t sh[8], bh[8];

    /* 4 bits, code i = i % 16: words alternate 0x76543210 (codes 0..7, code 0 in the
     * lowest nibble) and 0xfedcba98 (codes 8..15). */
    for (int k = 0; k < N / 8; k++) packed[k] = (k % 2) ? 0xfedcba98u : 0x76543210u;

    /* group 32, f32 scales: s_g = 0.25 * (g + 1), b_g = -g.
     *   y[0]   = 0.25 * 0 + 0 = 0        y[15] = 0.25 * 15 = 3.75
     *   y[33]  = 0.5 * 1 - 1 = -0.5      y[255] = 2 * 15 - 7 = 23 */
    for (int g = 0; g < 8; g++) {
        sf[g] = 0.25f * (float)(g + 1);
        bf[g] = (float)-g;
    }
    CHECK(lm_affine_dequantize_row(4, 32, packed, sf, bf, LM_DTYPE_F32, y, N));
    CHECK_EQF(y[0], 0.0);
    CHECK_EQF(y[15], 3.75);
    CHECK_EQF(y[33], -0.5);
    CHECK_EQF(y[255], 23.0);
    for (int i = 0; i < N; i++) CHECK_EQF(y[i], sf[i / 32] * (float)(i % 16) + bf[i / 32]);

    /* group 64, f16 scales: s = {0.5, 2, 0.125, 1} (0x3800, 0x4000, 0x3000, 0x3c00),
     * b = {1, -2, 0.5, -0.25} (0x3c00, 0xc000, 0x3800, 0xb400).
     *   y[3]   = 0.5 * 3 + 1 = 2.5        y[64+15] = 2 * 15 - 2 = 28
     *   y[128+8] = 0.125 * 8 + 0.5 = 1.5  y[255] = 1 * 15 - 0.25 = 14.75 */
    const uint16_t s64[4] = {0x3800, 0x4000, 0x3000, 0x3c00}, b64[4] = {0x3c00, 0xc000, 0x3800, 0xb400};
    memcpy(sh, s64, sizeof s64);
    memcpy(bh, b64, sizeof b64);
    CHECK(lm_affine_dequantize_row(4, 64, packed, sh, bh, LM_DTYPE_F16, y, N));
    CHECK_EQF(y[3], 2.5);
    CHECK_EQF(y[64 + 15], 28.0);
    CHECK_EQF(y[128 + 8], 1.5);
    CHECK_EQF(y[255], 14.75);

    /* group 128, bf16 scales: s = {0.0625, -1} (0x3d80, 0xbf80), b = {-0.5, 8}
     * (0xbf00, 0x4100).  y[10] = 0.0625 * 10 - 0.5 = 0.125;  y[128+13] = -13 + 8 = -5 */
    sh[0] = 0x3d80; sh[1] = 0xbf80;
    bh[0] = 0xbf00; bh[1] = 0x4100;
    CHECK(lm_affine_dequantize_row(4, 128, packed, sh, bh, LM_DTYPE_BF16, y, N));
    CHECK_EQF(y[10], 0.125);
    CHECK_EQF(y[128 + 13], -5.0);
    CHECK_EQF(y[127], 0.0625 * 15 - 0.5);

    /* 8 bits, code i = (7 i) & 255, four to a word, code 4k in the low byte of word k.
     * group 32 f32: y[i] = s_g * code + b_g as above.
     *   word 0 = 0x150e0700 (codes 0, 7, 14, 21); y[3] = 0.25 * 21 = 5.25
     *   y[37] = code 259 & 255 = 3 -> 0.5 * 3 - 1 = 0.5
     * group 64 f16 (s64, b64): y[150] = code 1050 & 255 = 26 -> 0.125 * 26 + 0.5 = 3.75
     * group 128 bf16: y[130] = code 910 & 255 = 142 -> -142 + 8 = -134 */
    for (int k = 0; k < N / 4; k++) {
        packed[k] = 0;
        for (int j = 0; j < 4; j++) packed[k] |= (uint32_t)((7 * (4 * k + j)) & 255) << (8 * j);
    }
    CHECK(packed[0] == 0x150e0700u);
    CHECK(lm_affine_dequantize_row(8, 32, packed, sf, bf, LM_DTYPE_F32, y, N));
    CHECK_EQF(y[3], 5.25);
    CHECK_EQF(y[37], 0.5);
    for (int i = 0; i < N; i++) CHECK_EQF(y[i], sf[i / 32] * (float)((7 * i) & 255) + bf[i / 32]);
    memcpy(sh, s64, sizeof s64);
    memcpy(bh, b64, sizeof b64);
    CHECK(lm_affine_dequantize_row(8, 64, packed, sh, bh, LM_DTYPE_F16, y, N));
    CHECK_EQF(y[150], 3.75);
    sh[0] = 0x3d80; sh[1] = 0xbf80;
    bh[0] = 0xbf00; bh[1] = 0x4100;
    CHECK(lm_affine_dequantize_row(8, 128, packed, sh, bh, LM_DTYPE_BF16, y, N));
    CHECK_EQF(y[130], -134.0);

    /* 3 bits: one little-endian bit stream, so codes straddle words. Codes 0..7 = 0..7
     * (0xfac688 in bits 0..23), code 8 = 5 (bits 24..26), code 9 = 2 (bits 27..29),
     * code 10 = 7 (bits 30, 31 of word 0 = 0b11 and bit 0 of word 1 = 1), code 11 = 6
     * (bits 1..3 of word 1). Scale 1, bias 0, group 32. */
    memset(packed, 0, sizeof packed);
    packed[0] = 0x00fac688u | (5u << 24) | (2u << 27) | (3u << 30);
    packed[1] = 1u | (6u << 1);
    sf[0] = 1.0f;
    bf[0] = 0.0f;
    CHECK(lm_affine_dequantize_row(3, 32, packed, sf, bf, LM_DTYPE_F32, y, 32));
    for (int i = 0; i < 8; i++) CHECK_EQF(y[i], i);
    CHECK_EQF(y[8], 5.0);
    CHECK_EQF(y[9], 2.0);
    CHECK_EQF(y[10], 7.0);
    CHECK_EQF(y[11], 6.0);
    CHECK_EQF(y[12], 0.0);

    /* 6 bits: codes 0..4 = 1, 2, 3, 4, 63 in bits 0..29; code 5 = bits 30, 31 of word 0
     * (0b10) and bits 0..3 of word 1 (0b1011) = 2 | 11 << 2 = 46; code 6 = 17 (bits 4..9
     * of word 1). */
    memset(packed, 0, sizeof packed);
    packed[0] = 1u | (2u << 6) | (3u << 12) | (4u << 18) | (63u << 24) | (2u << 30);
    packed[1] = 0xbu | (17u << 4);
    CHECK(lm_affine_dequantize_row(6, 32, packed, sf, bf, LM_DTYPE_F32, y, 32));
    CHECK_EQF(y[0], 1.0);
    CHECK_EQF(y[3], 4.0);
    CHECK_EQF(y[4], 63.0);
    CHECK_EQF(y[5], 46.0);
    CHECK_EQF(y[6], 17.0);
    CHECK_EQF(y[7], 0.0);

    /* 2 bits: 16 codes a word. word 0 = 0xe4 -> codes 0, 1, 2, 3, then zeros. */
    memset(packed, 0, sizeof packed);
    packed[0] = 0xe4u;
    CHECK(lm_affine_dequantize_row(2, 32, packed, sf, bf, LM_DTYPE_F32, y, 32));
    CHECK_EQF(y[1], 1.0);
    CHECK_EQF(y[3], 3.0);
    CHECK_EQF(y[4], 0.0);

    /* quantize -> dequantize round trips and dot products, every width, group, type */
    static const int bits_list[] = {2, 3, 4, 6, 8}, groups[] = {32, 64, 128};
    static const lm_dtype stypes[] = {LM_DTYPE_F32, LM_DTYPE_F16, LM_DTYPE_BF16};
    float x[N], w[N];
    uint8_t sbuf[64], bbuf[64];
    for (int i = 0; i < N; i++) {
        w[i] = rng_gauss();
        x[i] = rng_gauss();
    }
    for (int bi = 0; bi < 5; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int ti = 0; ti < 3; ti++) {
                int bits = bits_list[bi], gs = groups[gi];
                CHECK(lm_affine_quantize_row(bits, gs, w, packed, sbuf, bbuf, stypes[ti], N));
                CHECK(lm_affine_dequantize_row(bits, gs, packed, sbuf, bbuf, stypes[ti], y, N));
                /* every value within half a step of its group (plus scale rounding) */
                double worst = 0;
                for (int g = 0; g < N / gs; g++) {
                    float mn = w[g * gs], mx = w[g * gs];
                    for (int i = g * gs; i < (g + 1) * gs; i++) {
                        if (w[i] < mn) mn = w[i];
                        if (w[i] > mx) mx = w[i];
                    }
                    double step = (mx - mn) / ((1 << bits) - 1);
                    double tol = 0.5 * step + (stypes[ti] == LM_DTYPE_BF16 ? 0.02 : 0.002) * (fabs(mx) + fabs(mn));
                    for (int i = g * gs; i < (g + 1) * gs; i++) {
                        double e = fabs(y[i] - w[i]) / tol;
                        if (e > worst) worst = e;
                    }
                }
                if (worst > 1.0)
                    fprintf(stderr, "affine bits %d group %d %s: error %.3f steps\n", bits, gs,
                            lm_dtype_name(stypes[ti]), worst);
                CHECK(worst <= 1.0);
                double ref = 0, mag = 0;
                for (int i = 0; i < N; i++) {
                    ref += (double)y[i] * x[i];
                    mag += fabs((double)y[i] * x[i]);
                }
                float got = lm_affine_dot_row_f32(bits, gs, packed, sbuf, bbuf, stypes[ti], x, N);
                CHECK(fabs(got - ref) <= 1e-5 * mag);
            }
    /* bad arguments */
    CHECK(!lm_affine_dequantize_row(5, 32, packed, sf, bf, LM_DTYPE_F32, y, 32));
    CHECK(!lm_affine_dequantize_row(4, 32, packed, sf, bf, LM_DTYPE_F32, y, 48));
    CHECK(!lm_affine_dequantize_row(4, 32, packed, sf, bf, LM_DTYPE_Q8_0, y, 32));
    CHECK(!lm_affine_quantize_row(4, 0, w, packed, sf, bf, LM_DTYPE_F32, 32));
}

int main(void) {
    test_dtype();
    test_half();
    test_hand_legacy();
    test_hand_kquants();
    test_reference_vectors();
    test_round_trip();
    test_dot();
    test_affine();
    TEST_MAIN_END();
}
