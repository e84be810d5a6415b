/* Normalization, activations, RoPE and element-wise arithmetic: the plain reference. */
#include <math.h>
#include <pthread.h>

#include "backend/cpu/cpu_internal.h"
#include "tensor/quant.h"

void lm_cpu_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y) {
    (void)b;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double sum = 0.0; /* double: d can be in the thousands */
        for (int64_t j = 0; j < d; j++) sum += (double)xr[j] * xr[j];
        float inv = (float)(1.0 / sqrt(sum / (double)d + eps));
        for (int64_t j = 0; j < d; j++) yr[j] = xr[j] * inv * (w ? w[j] : 1.0f);
    }
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

void lm_cpu_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                 const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode) {
    (void)b;
    int64_t half = n_rot / 2;
    for (int64_t t = 0; t < n; t++) {
        double p = (double)pos[t] * freq_scale;
        for (int64_t i = 0; i < half; i++) {
            double angle = p * pow((double)theta, -2.0 * (double)i / (double)n_rot);
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int64_t h = 0; h < n_head; h++) {
                float *v = x + (t * n_head + h) * head_dim;
                int64_t i0 = mode == LM_ROPE_NEOX ? i : 2 * i;
                int64_t i1 = mode == LM_ROPE_NEOX ? i + half : 2 * i + 1;
                float a = v[i0], bb = v[i1];
                v[i0] = a * c - bb * s;
                v[i1] = a * s + bb * c;
            }
        }
    }
}

void lm_cpu_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
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

void lm_cpu_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    (void)b;
    pthread_once(&g_gelu_once, gelu_table_init);
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], a;
        if (g <= -10.0f)
            a = 0.0f;
        else if (g >= 10.0f)
            a = g;
        else
            a = lm_f16_to_f32(g_gelu_table[lm_f32_to_f16(g)]);
        out[i] = a * up[i];
    }
}
