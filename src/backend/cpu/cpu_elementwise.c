/* Normalization, activations, RoPE and element-wise arithmetic: the plain C code, and
 * AVX-512 versions where the CPU has it (GeGLU bit-identical to the plain code; RMSNorm
 * and SwiGLU with their own fixed arithmetic — a row's result never depends on the
 * batch either way). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_exp512.h"
#include "backend/cpu/cpu_internal.h"
#include "tensor/quant.h"

#if defined(__x86_64__)
#define EW_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
/* __builtin_cpu_supports reads flags set once at startup: cheap, nothing to cache */
static bool use_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
}

#endif

/* Enough work per thread to pay for waking it: rows of a few hundred floats. */
enum { MIN_ROWS_PER_THREAD = 8, MIN_ELEMS_PER_THREAD = 16384 };

typedef struct norm_job {
    const float *x, *w;
    int64_t d;
    float eps;
    float *y;
} norm_job;

static void rms_norm_rows(void *ctx, int64_t r0, int64_t r1) {
    const norm_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + r * j->d;
        float *yr = j->y + r * j->d;
        double sum = 0.0; /* double: d can be in the thousands */
        for (int64_t k = 0; k < j->d; k++) sum += (double)xr[k] * xr[k];
        float inv = (float)(1.0 / sqrt(sum / (double)j->d + j->eps));
        for (int64_t k = 0; k < j->d; k++) yr[k] = xr[k] * inv * (j->w ? j->w[k] : 1.0f);
    }
}

#if defined(__x86_64__)
/* sum of squares in f64: 16 lanes (two vectors of 8) over the row in order, reduced in
 * a fixed tree, then the tail */
EW_TARGET static void rms_norm_rows_avx512(void *ctx, int64_t r0, int64_t r1) {
    const norm_job *j = ctx;
    const int64_t d = j->d;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + r * d;
        float *yr = j->y + r * d;
        __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
        int64_t k = 0;
        for (; k + 16 <= d; k += 16) {
            __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(xr + k)), c = _mm512_cvtps_pd(_mm256_loadu_ps(xr + k + 8));
            s0 = _mm512_fmadd_pd(a, a, s0);
            s1 = _mm512_fmadd_pd(c, c, s1);
        }
        double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
        for (int64_t t = k; t < d; t++) sum += (double)xr[t] * xr[t];
        float inv = (float)(1.0 / sqrt(sum / (double)d + j->eps));
        __m512 iv = _mm512_set1_ps(inv);
        for (k = 0; k + 16 <= d; k += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xr + k), iv);
            _mm512_storeu_ps(yr + k, j->w ? _mm512_mul_ps(v, _mm512_loadu_ps(j->w + k)) : v);
        }
        for (; k < d; k++) yr[k] = xr[k] * inv * (j->w ? j->w[k] : 1.0f);
    }
}
#endif

void lm_cpu_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y) {
    norm_job job = {x, w, d, eps, y};
#if defined(__x86_64__)
    if (use_avx512()) {
        lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, rms_norm_rows_avx512, &job);
        return;
    }
#endif
    lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, rms_norm_rows, &job);
}

/* add_rms_norm: each row's add, then that row's norm by the same row function as
 * rms_norm (so the same bits as the two ops one after the other) */
typedef struct add_norm_job {
    norm_job norm; /* x: the rows added into (y), y: out */
    float *y;
    const float *x;
    void (*rows)(void *ctx, int64_t r0, int64_t r1); /* rms_norm's row function */
} add_norm_job;

static void add_rms_norm_rows(void *ctx, int64_t r0, int64_t r1) {
    add_norm_job *j = ctx;
    const int64_t d = j->norm.d;
    for (int64_t r = r0; r < r1; r++) {
        float *yr = j->y + r * d;
        const float *xr = j->x + r * d;
        for (int64_t k = 0; k < d; k++) yr[k] += xr[k];
        j->rows(&j->norm, r, r + 1);
    }
}

void lm_cpu_add_rms_norm(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                         float *out) {
    add_norm_job job = {{y, w, d, eps, out}, y, x, rms_norm_rows};
#if defined(__x86_64__)
    if (use_avx512()) job.rows = rms_norm_rows_avx512;
#endif
    lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, add_rms_norm_rows, &job);
}

void lm_cpu_add(lm_backend *b, float *y, const float *x, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void lm_cpu_add_bias(lm_backend *b, float *y, const float *bias, int64_t n, int64_t d) {
    (void)b;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < d; j++) y[r * d + j] += bias[j];
}

void lm_cpu_scale(lm_backend *b, float *y, float s, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) y[i] *= s;
}

typedef struct rope_job {
    float *x;
    int64_t n_head, head_dim, n_rot;
    lm_rope_mode mode;
    const float *cs; /* [n][n_rot / 2][2] */
    const int32_t *pos;
    float freq_scale;
    const double *inv_freq;
} rope_job;

static void rope_table_rows(void *ctx, int64_t t0, int64_t t1) {
    const rope_job *j = ctx;
    int64_t half = j->n_rot / 2;
    float *cs = (float *)j->cs;
    for (int64_t t = t0; t < t1; t++) {
        double p = (double)j->pos[t] * j->freq_scale;
        for (int64_t i = 0; i < half; i++) {
            double angle = p * j->inv_freq[i];
            cs[(t * half + i) * 2] = (float)cos(angle);
            cs[(t * half + i) * 2 + 1] = (float)sin(angle);
        }
    }
}

static void rope_rows(void *ctx, int64_t t0, int64_t t1) {
    const rope_job *j = ctx;
    int64_t half = j->n_rot / 2;
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t i = 0; i < half; i++) {
            float c = j->cs[(t * half + i) * 2], s = j->cs[(t * half + i) * 2 + 1];
            int64_t i0 = j->mode == LM_ROPE_NEOX ? i : 2 * i;
            int64_t i1 = j->mode == LM_ROPE_NEOX ? i + half : 2 * i + 1;
            for (int64_t h = 0; h < j->n_head; h++) {
                float *v = j->x + (t * j->n_head + h) * j->head_dim;
                float a = v[i0], bb = v[i1];
                v[i0] = a * c - bb * s;
                v[i1] = a * s + bb * c;
            }
        }
    }
}

/* The cos/sin table for these positions and parameters: the cached one, or a new one
 * (computed across the pool) in the least recently used slot; NULL without memory. */
static const float *rope_table(lm_backend *b, int64_t n, const int32_t *pos, int64_t n_rot, float theta,
                               float freq_scale, lm_rope_mode mode) {
    lm_cpu_backend *cpu = (lm_cpu_backend *)b;
    cpu->rope_clock++;
    for (int i = 0; i < 2; i++) {
        lm_cpu_rope_cache *c = &cpu->rope[i];
        if (c->cs && c->n == n && c->n_rot == n_rot && c->theta == theta && c->freq_scale == freq_scale &&
            c->mode == (int)mode && memcmp(c->pos, pos, (size_t)n * sizeof *pos) == 0) {
            c->used = cpu->rope_clock;
            return c->cs;
        }
    }
    lm_cpu_rope_cache *c = cpu->rope[0].used <= cpu->rope[1].used ? &cpu->rope[0] : &cpu->rope[1];
    c->n = -1; /* invalid until filled */
    if (n > c->pos_cap) {
        int32_t *p = realloc(c->pos, (size_t)n * sizeof *p);
        if (!p) return NULL;
        c->pos = p, c->pos_cap = n;
    }
    if (n * n_rot > c->cs_cap) {
        float *cs = realloc(c->cs, (size_t)(n * n_rot) * sizeof *cs);
        if (!cs) return NULL;
        c->cs = cs, c->cs_cap = n * n_rot;
    }
    double inv_freq[2048]; /* n_rot <= head_dim <= 4096 (lm_hparams_validate) */
    for (int64_t i = 0; i < n_rot / 2; i++) inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)n_rot);
    rope_job job = {.n_rot = n_rot, .cs = c->cs, .pos = pos, .freq_scale = freq_scale, .inv_freq = inv_freq};
    lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, rope_table_rows, &job);
    memcpy(c->pos, pos, (size_t)n * sizeof *pos);
    c->n = n, c->n_rot = n_rot, c->theta = theta, c->freq_scale = freq_scale, c->mode = (int)mode;
    c->used = cpu->rope_clock;
    return c->cs;
}

void lm_cpu_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                 const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode) {
    const float *cs = rope_table(b, n, pos, n_rot, theta, freq_scale, mode);
    if (!cs) { /* no memory for the cache: a table for this call alone, row by row */
        for (int64_t t = 0; t < n; t++) {
            float row[4096];
            double inv_freq[2048];
            for (int64_t i = 0; i < n_rot / 2; i++) inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)n_rot);
            rope_job tj = {.n_rot = n_rot, .cs = row, .pos = pos + t, .freq_scale = freq_scale, .inv_freq = inv_freq};
            rope_table_rows(&tj, 0, 1);
            rope_job rj = {x + t * n_head * head_dim, n_head, head_dim, n_rot, mode, row, NULL, 0, NULL};
            rope_rows(&rj, 0, 1);
        }
        return;
    }
    rope_job job = {x, n_head, head_dim, n_rot, mode, cs, NULL, 0, NULL};
    lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, rope_rows, &job);
}

typedef struct glu_job {
    const float *gate, *up;
    float *out;
} glu_job;

static void swiglu_range(void *ctx, int64_t i0, int64_t i1) {
    const glu_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i];
        j->out[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

#if defined(__x86_64__)
EW_TARGET static void swiglu_range_avx512(void *ctx, int64_t i0, int64_t i1) {
    const glu_job *j = ctx;
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_loadu_ps(j->gate + i);
        __m512 e = lm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(j->out + i, _mm512_mul_ps(sg, _mm512_loadu_ps(j->up + i)));
    }
    if (i < i1) {
        __mmask16 m = (__mmask16)((1u << (i1 - i)) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, j->gate + i);
        __m512 e = lm_exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(j->out + i, m, _mm512_mul_ps(sg, _mm512_maskz_loadu_ps(m, j->up + i)));
    }
}
#endif

void lm_cpu_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    glu_job job = {gate, up, out};
#if defined(__x86_64__)
    if (use_avx512()) {
        lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, swiglu_range_avx512, &job);
        return;
    }
#endif
    lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, swiglu_range, &job);
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

/* GELU of every f16 value, rounded to f16: a table lookup instead of a tanh per
 * element. Inputs are rounded to f16 first, as llama.cpp does, so our activations
 * match the reference engine's to the bit here. */
static uint16_t g_gelu_table[(1 << 16) + 2]; /* + 2: 32-bit gathers of the last entry */
static pthread_once_t g_gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) g_gelu_table[h] = lm_f32_to_f16(gelu_tanh(lm_f16_to_f32((uint16_t)h)));
}

static void geglu_range(void *ctx, int64_t i0, int64_t i1) {
    const glu_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i], a;
        if (g <= -10.0f)
            a = 0.0f;
        else if (g >= 10.0f)
            a = g;
        else
            a = lm_f16_to_f32(g_gelu_table[lm_f32_to_f16(g)]);
        j->out[i] = a * j->up[i];
    }
}

#if defined(__x86_64__)
/* the same lookups 16 at a time: F16C rounds like lm_f32_to_f16 */
EW_TARGET static void geglu_range_avx512(void *ctx, int64_t i0, int64_t i1) {
    const glu_job *j = ctx;
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_loadu_ps(j->gate + i);
        __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
        __m512i t = _mm512_i32gather_epi32(h, (const void *)g_gelu_table, 2);
        __m512 a = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t));
        a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(g, hi, _CMP_GE_OQ), g);
        a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(g, lo, _CMP_LE_OQ), _mm512_setzero_ps());
        _mm512_storeu_ps(j->out + i, _mm512_mul_ps(a, _mm512_loadu_ps(j->up + i)));
    }
    if (i < i1) geglu_range(ctx, i, i1);
}
#endif

void lm_cpu_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    pthread_once(&g_gelu_once, gelu_table_init);
    glu_job job = {gate, up, out};
#if defined(__x86_64__)
    if (use_avx512()) {
        lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, geglu_range_avx512, &job);
        return;
    }
#endif
    lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, geglu_range, &job);
}
