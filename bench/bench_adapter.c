/* bench_adapter: the adapter codec on realistic-size LoRA adapters.
 *
 *   build/bench_adapter [smollm2|qwen1.5b|all] [--repeat N]
 *
 * For each model shape it builds a rank-16 adapter on all seven projections of every
 * layer (PEFT layout; A ~ N(0, 1/in) like a Kaiming-style init, B ~ N(0, 0.01) like a
 * trained B), in BF16, F16 and F32, and prints: file size, the codec's compressed size
 * and ratio, plain zstd of the whole file at the same level and its ratio, and the
 * codec's encode and decode speed in MB/s of original bytes (best of N, default 3;
 * encode once). Single-threaded, like the codec. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "adapters/codec.h"
#include "formats/safetensors.h"
#include "tensor/quant.h"

typedef struct shape {
    const char *name;
    int n_layer;
    int64_t d, q, kv, ff;
} shape;

static const shape k_shapes[] = {
    {"smollm2", 30, 576, 576, 192, 1536},     /* SmolLM2-135M    */
    {"qwen1.5b", 28, 1536, 1536, 256, 8960},  /* Qwen2.5-1.5B    */
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static double uniform(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float normal(double sd) { /* Box-Muller */
    double u = uniform() + 1e-300, v = uniform();
    return (float)(sd * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Builds the adapter as safetensors bytes in memory (via a temporary file). */
static uint8_t *make_adapter(const shape *s, lm_dtype dt, int rank, size_t *len) {
    static const char *const mods[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    void **bufs = calloc((size_t)(s->n_layer * 14), sizeof(void *));
    int nb = 0;
    size_t es = dt == LM_DTYPE_F32 ? 4 : 2;
    for (int l = 0; l < s->n_layer; l++) {
        for (int m = 0; m < 7; m++) {
            int64_t in = m == 3 ? s->q : m == 6 ? s->ff : s->d;
            int64_t out = m == 0 ? s->q : (m == 1 || m == 2) ? s->kv : (m == 4 || m == 5) ? s->ff : s->d;
            int64_t na = rank * in, nbv = out * rank;
            float *fa = malloc(sizeof(float) * (size_t)na), *fb = malloc(sizeof(float) * (size_t)nbv);
            for (int64_t i = 0; i < na; i++) fa[i] = normal(1.0 / sqrt((double)in));
            for (int64_t i = 0; i < nbv; i++) fb[i] = normal(0.01);
            void *qa = malloc(es * (size_t)na), *qb = malloc(es * (size_t)nbv);
            lm_quantize_row(dt, fa, qa, na);
            lm_quantize_row(dt, fb, qb, nbv);
            free(fa), free(fb);
            bufs[nb++] = qa, bufs[nb++] = qb;
            char name[160];
            int64_t sa[2] = {rank, in}, sb[2] = {out, rank};
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", l, mods[m]);
            lm_safetensors_writer_add(w, name, dt, 2, sa, qa);
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", l, mods[m]);
            lm_safetensors_writer_add(w, name, dt, 2, sb, qb);
        }
    }
    char path[] = "/tmp/lumen_bench_adapter.safetensors";
    uint8_t *bytes = NULL;
    if (lm_safetensors_writer_write(w, path) != LM_OK ||
        lm_adapter_read_file(path, (uint64_t)1 << 34, &bytes, len) != LM_OK)
        fprintf(stderr, "bench_adapter: %s\n", lm_last_error());
    remove(path);
    lm_safetensors_writer_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs);
    return bytes;
}

static void run(const shape *s, lm_dtype dt, int repeat) {
    size_t len = 0;
    uint8_t *st = make_adapter(s, dt, 16, &len);
    if (!st) return;
    double t0 = now();
    uint8_t *z = NULL;
    size_t zl = 0;
    if (lm_adapter_encode_memory(st, len, NULL, 0, &z, &zl) != LM_OK) {
        fprintf(stderr, "encode: %s\n", lm_last_error());
        free(st);
        return;
    }
    double enc = now() - t0, dec = 1e30;
    for (int i = 0; i < repeat; i++) {
        uint8_t *back = NULL;
        size_t bl = 0;
        t0 = now();
        lm_status r = lm_adapter_decode_memory(z, zl, NULL, 0, &back, &bl, NULL);
        double t = now() - t0;
        if (r != LM_OK || bl != len || memcmp(back, st, len) != 0) fprintf(stderr, "decode mismatch!\n");
        if (t < dec) dec = t;
        free(back);
    }
    size_t bound = ZSTD_compressBound(len);
    void *plain = malloc(bound);
    t0 = now();
    size_t pl = ZSTD_compress(plain, bound, st, len, LM_ADAPTER_ZSTD_LEVEL);
    double plain_t = now() - t0;
    printf("%-9s %-5s %8.2f MB  codec %8.2f MB  ratio %5.3f | plain zstd %8.2f MB  ratio %5.3f | "
           "encode %6.1f MB/s  decode %7.1f MB/s  (plain zstd encode %5.1f MB/s)\n",
           s->name, lm_dtype_name(dt), (double)len / 1e6, (double)zl / 1e6, (double)len / (double)zl,
           (double)pl / 1e6, (double)len / (double)pl, (double)len / 1e6 / enc, (double)len / 1e6 / dec,
           (double)len / 1e6 / plain_t);
    fflush(stdout);
    free(plain);
    free(z);
    free(st);
}

int main(int argc, char **argv) {
    const char *which = "all";
    int repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: bench_adapter [smollm2|qwen1.5b|all] [--repeat N (default 3)]\n");
            return 0;
        } else which = argv[i];
    }
    if (repeat < 1) repeat = 1;
    printf("adapter codec: rank-16 LoRA on q,k,v,o,gate,up,down of every layer; zstd level %d, zstd %s\n",
           LM_ADAPTER_ZSTD_LEVEL, ZSTD_versionString());
    static const lm_dtype dts[3] = {LM_DTYPE_BF16, LM_DTYPE_F16, LM_DTYPE_F32};
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) {
        if (strcmp(which, "all") != 0 && strcmp(which, k_shapes[s].name) != 0) continue;
        for (int d = 0; d < 3; d++) run(&k_shapes[s], dts[d], repeat);
    }
    return 0;
}
