/* lumen bench MODEL: prompt-processing and generation speed, medians of repeated runs.
 *
 * pp: one batch of `-p` prompt tokens into an empty cache (tokens/s of the prefill);
 * tg: `-n` single-token decode steps after a short prompt (tokens/s of generation).
 * Token ids are fixed pseudo-random ids, so no tokenizer is involved. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "backend/backend.h"
#include "commands.h"
#include "core/error.h"
#include "formats/model_store.h"
#include "model/forward.h"

typedef struct bench_opts {
    const char *model;
    int n_prompt, n_gen, threads, reps;
    bool json;
} bench_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen bench [MODEL] [options]\n"
            "  MODEL              a .gguf file, a Hugging Face folder, or a pulled name (default: smollm2-135m)\n"
            "  -p, --prompt N     prompt tokens processed in one batch (default: 512; 0 = skip)\n"
            "  -n, --gen N        tokens generated one at a time (default: 128; 0 = skip)\n"
            "  -t, --threads N    CPU threads (default: 2)\n"
            "  -r, --reps N       repetitions; medians are reported (default: 5)\n"
            "  --json             one JSON object on stdout (default: a table)\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* seconds to prefill n tokens, or to generate n tokens after an 8-token prompt */
static lm_status run_once(lm_model_internal *m, int n, bool generate, double *seconds) {
    int n_ctx = generate ? n + 9 : n;
    int n_batch = generate ? 8 : n;
    lm_kv_cache *kv = NULL;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_batch), *pos = malloc(sizeof(int32_t) * (size_t)n_batch);
    int32_t *seq = calloc((size_t)n_batch, sizeof(int32_t));
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    lm_status st = (!tok || !pos || !seq || !logits) ? lm_error(LM_ERR_NO_MEMORY, "out of memory")
                                                     : lm_kv_cache_for_model(m, n_ctx, 1, LM_DTYPE_F16, &kv);
    uint32_t x = 12345;
    for (int i = 0; st == LM_OK && i < n_batch; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (int32_t)(x % (uint32_t)m->hp.n_vocab);
        pos[i] = i;
    }
    if (st == LM_OK) {
        lm_batch batch = {n_batch, tok, pos, seq, NULL};
        double t0 = now_s();
        st = lm_forward(m, kv, &batch, logits);
        double t1 = now_s();
        for (int i = 0; st == LM_OK && generate && i < n; i++) {
            int32_t t = tok[i % n_batch], p = n_batch + i, s = 0;
            lm_batch step = {1, &t, &p, &s, NULL};
            st = lm_forward(m, kv, &step, logits);
        }
        *seconds = generate ? now_s() - t1 : t1 - t0;
    }
    lm_kv_cache_free(kv);
    free(tok), free(pos), free(seq), free(logits);
    return st;
}

static lm_status measure(lm_model_internal *m, int n, bool generate, int reps, double *tps) {
    double *rates = calloc((size_t)reps, sizeof *rates), s = 0;
    if (!rates) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_status st = run_once(m, n < 16 ? n : 16, generate, &s); /* warm-up: page in weights, grow scratch */
    for (int r = 0; st == LM_OK && r < reps; r++) {
        st = run_once(m, n, generate, &s);
        rates[r] = s > 0 ? n / s : 0.0;
    }
    if (st == LM_OK) *tps = median(rates, reps);
    free(rates);
    return st;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o = {"smollm2-135m", 512, 128, 2, 5, false};
    bool model_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *target = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json"))
            o.json = true;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
            target = &o.n_prompt;
        else if (!strcmp(a, "-n") || !strcmp(a, "--gen"))
            target = &o.n_gen;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            target = &o.threads;
        else if (!strcmp(a, "-r") || !strcmp(a, "--reps"))
            target = &o.reps;
        else if (a[0] != '-' && !model_set) {
            o.model = a;
            model_set = true;
        } else {
            usage(stderr);
            return 2;
        }
        if (target) {
            char *end;
            long n = v ? strtol(v, &end, 10) : -1;
            if (!v || *end || n < 0 || n > 1000000) {
                fprintf(stderr, "lumen bench: invalid value for %s\n", a);
                return 2;
            }
            *target = (int)n;
            i++;
        }
    }
    if (o.threads < 1 || o.reps < 1) {
        fprintf(stderr, "lumen bench: threads and reps must be at least 1\n");
        return 2;
    }
    char path[4096];
    lm_backend *b = NULL;
    lm_model_internal *m = NULL;
    double t_load = now_s();
    if (lm_model_store_resolve(o.model, path, sizeof path) || lm_backend_cpu_create(o.threads, &b) ||
        lm_model_internal_load(path, b, &m)) {
        fprintf(stderr, "lumen bench: %s\n", lm_last_error());
        lm_backend_free(b);
        return 1;
    }
    t_load = now_s() - t_load;
    double pp = 0, tg = 0;
    lm_status st = LM_OK;
    if (o.n_prompt > 0) st = measure(m, o.n_prompt, false, o.reps, &pp);
    if (st == LM_OK && o.n_gen > 0) st = measure(m, o.n_gen, true, o.reps, &tg);
    if (st) {
        fprintf(stderr, "lumen bench: %s\n", lm_last_error());
    } else {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double peak_mib = (double)ru.ru_maxrss / 1024.0;
        if (o.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "model", path);
            cJSON_AddNumberToObject(j, "threads", o.threads);
            cJSON_AddNumberToObject(j, "reps", o.reps);
            cJSON_AddNumberToObject(j, "n_prompt", o.n_prompt);
            cJSON_AddNumberToObject(j, "n_gen", o.n_gen);
            cJSON_AddNumberToObject(j, "pp_tokens_per_s", pp);
            cJSON_AddNumberToObject(j, "tg_tokens_per_s", tg);
            cJSON_AddNumberToObject(j, "load_s", t_load);
            cJSON_AddNumberToObject(j, "weight_bytes", (double)m->weight_bytes);
            cJSON_AddNumberToObject(j, "peak_rss_mib", peak_mib);
            char *s = cJSON_PrintUnformatted(j);
            puts(s);
            free(s);
            cJSON_Delete(j);
        } else {
            printf("model    %s (%.1f MiB of weights, loaded in %.3f s)\n", path, (double)m->weight_bytes / (1 << 20),
                   t_load);
            printf("threads  %d, %d repetitions (medians)\n", o.threads, o.reps);
            if (o.n_prompt) printf("pp%-6d %10.1f tokens/s\n", o.n_prompt, pp);
            if (o.n_gen) printf("tg%-6d %10.1f tokens/s\n", o.n_gen, tg);
            printf("peak RSS %.1f MiB\n", peak_mib);
        }
    }
    lm_model_internal_free(m);
    lm_backend_free(b);
    return st ? 1 : 0;
}
