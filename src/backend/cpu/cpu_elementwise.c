/* Normalization, activations, RoPE and element-wise arithmetic: the plain reference. */
#include <math.h>
#include <pthread.h>

#include "backend/cpu/cpu_internal.h"
#include "tensor/quant.h"

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

void lm_cpu_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y) {
    norm_job job = {x, w, d, eps, y};
    lm_cpu_parallel_for(b, n, MIN_ROWS_PER_THREAD, rms_norm_rows, &job);
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
    const int32_t *pos;
    float freq_scale;
    lm_rope_mode mode;
    const double *inv_freq; /* [n_rot / 2]: theta^(-2i / n_rot) */
} rope_job;

static void rope_rows(void *ctx, int64_t t0, int64_t t1) {
    const rope_job *j = ctx;
    int64_t half = j->n_rot / 2;
    for (int64_t t = t0; t < t1; t++) {
        double p = (double)j->pos[t] * j->freq_scale;
        for (int64_t i = 0; i < half; i++) {
            double angle = p * j->inv_freq[i];
            float c = (float)cos(angle), s = (float)sin(angle);
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

void lm_cpu_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                 const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode) {
    double inv_freq[2048]; /* n_rot <= head_dim <= 4096 (lm_hparams_validate) */
    for (int64_t i = 0; i < n_rot / 2; i++) inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)n_rot);
    rope_job job = {x, n_head, head_dim, n_rot, pos, freq_scale, mode, inv_freq};
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

void lm_cpu_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    glu_job job = {gate, up, out};
    lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, swiglu_range, &job);
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

/* GELU of every f16 value, rounded to f16: a table lookup instead of a tanh per
 * element. Inputs are rounded to f16 first, as llama.cpp does, so our activations
 * match the reference engine's to the bit here. */
static uint16_t g_gelu_table[1 << 16];
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

void lm_cpu_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    pthread_once(&g_gelu_once, gelu_table_init);
    glu_job job = {gate, up, out};
    lm_cpu_parallel_for(b, n, MIN_ELEMS_PER_THREAD, geglu_range, &job);
}
