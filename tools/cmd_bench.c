/* lumen bench MODEL: prompt-processing and generation speed, medians of repeated runs.
 *
 * pp: one batch of `-p` prompt tokens into an empty cache (tokens/s of the prefill);
 * tg: `-n` single-token decode steps after a short prompt (tokens/s of generation);
 * --parallel N1,N2,...: for each N, N sequences each get a prompt of
 * --parallel-prompt tokens (prefilled in batches of whole sequences), then `-n`
 * decode steps, each ONE forward pass over N tokens (one per sequence, each its own
 * KV sequence): aggregate tokens/s = N * steps / time. What each step returns to the
 * host (--logits): `topk` (the default) the 64 best candidates of every sequence's
 * row, reduced by the backend (what top-k sampling needs: the engine's candidate
 * path); `greedy` each row's best logit only (what the engine's candidate path asks
 * for when every sequence of the step decodes greedily); `all` the full logits of all
 * N tokens (what any other sampling needs: 600 KB per token of a 152k vocabulary);
 * `last` only the last token's, which leaves out the head's extra rows and the copy.
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
#include "sampling/sampling.h"

enum { MAX_PARALLEL = 16, PREFILL_BATCH = 2048 };

typedef struct bench_opts {
    const char *model;
    int n_prompt, n_gen, threads, reps;
    bool json;
    const char *backend; /* "cpu" or "cuda" */
    int device;
    int parallel[MAX_PARALLEL], n_parallel;
    int par_prompt;
    int logits; /* logits_mode */
} bench_opts;

/* what a --parallel decode step returns to the host */
typedef enum logits_mode { LOGITS_TOPK, LOGITS_ALL, LOGITS_LAST, LOGITS_GREEDY } logits_mode;
static const char *const k_logits_names[] = {"topk", "all", "last", "greedy"};
enum { TOPK_K = LM_SAMPLER_CANDIDATES };

/* one --parallel measurement: medians over the repetitions */
typedef struct par_result {
    int n_seqs;
    double prefill_tps, decode_tps, step_ms;
    lm_status st;
    char err[256];
} par_result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen bench [MODEL] [options]\n"
            "  MODEL              a .gguf file, a Hugging Face folder, or a pulled name (default: smollm2-135m)\n"
            "  -p, --prompt N     prompt tokens processed in one batch (default: 512; 0 = skip)\n"
            "  -n, --gen N        tokens generated one at a time (default: 128; 0 = skip)\n"
            "  -t, --threads N    CPU threads (default: 2)\n"
            "  -r, --reps N       repetitions; medians are reported (default: 5)\n"
            "  --backend B        cpu or cuda (default: cpu)\n"
            "  --device N         GPU index for --backend cuda (default: 0)\n"
            "  --parallel LIST    decode with N sequences together, for each N of a comma list\n"
            "                     (e.g. 1,8,64,256): -n steps of one N-token batch (default: off)\n"
            "  --parallel-prompt N  prompt tokens of each sequence before --parallel decoding (default: 128)\n"
            "  --logits topk|greedy|all|last  what --parallel steps return: the 64 best logits\n"
            "                     of every sequence, reduced on the backend (topk, default: what\n"
            "                     top-k sampling needs), the best one (greedy: what greedy decoding\n"
            "                     needs), the logits of every sequence (all), or of the last token\n"
            "                     only (last)\n"
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

/* N sequences: prompts of `prompt` tokens, prefilled in batches of whole sequences,
 * then `steps` decode steps of one N-token batch. Seconds of each phase. */
static lm_status run_parallel_once(lm_model_internal *m, int N, int prompt, int steps, int mode,
                                   double *prefill_s, double *decode_s) {
    const bool all_logits = mode == LOGITS_ALL;
    int per_batch = prompt >= PREFILL_BATCH ? 1 : PREFILL_BATCH / prompt;
    if (per_batch > N) per_batch = N;
    int64_t nb = (int64_t)per_batch * prompt, n_vocab = m->hp.n_vocab;
    int64_t n_cap = nb > N ? nb : N;
    lm_kv_cache *kv = NULL;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_cap), *pos = malloc(sizeof(int32_t) * (size_t)n_cap);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n_cap);
    int8_t *want = malloc((size_t)N);
    float *logits = lm_backend_host_alloc(m->backend, sizeof(float) * (size_t)((all_logits ? N : 1) * n_vocab));
    /* topk, greedy: page-locked like the logits, as the engine keeps them */
    const bool cands = mode == LOGITS_TOPK || mode == LOGITS_GREEDY;
    int k = mode == LOGITS_GREEDY ? 1 : n_vocab < TOPK_K ? (int)n_vocab : TOPK_K;
    lm_topk_out out = {k, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (cands) {
        out.ids = lm_backend_host_alloc(m->backend, sizeof(int32_t) * (size_t)N * (size_t)k);
        out.vals = lm_backend_host_alloc(m->backend, sizeof(float) * (size_t)N * (size_t)k);
        out.row_max = lm_backend_host_alloc(m->backend, sizeof(float) * (size_t)N);
    }
    bool topk_ok = !cands || (out.ids && out.vals && out.row_max);
    lm_status st = (!tok || !pos || !seq || !want || !logits || !topk_ok)
                       ? lm_error(LM_ERR_NO_MEMORY, "out of memory for %d sequences", N)
                       : lm_kv_cache_for_model(m, prompt + steps + 1, N, LM_DTYPE_F16, &kv);
    uint32_t x = 12345;
    double t0 = now_s();
    for (int s0 = 0; st == LM_OK && s0 < N; s0 += per_batch) {
        int ns = N - s0 < per_batch ? N - s0 : per_batch;
        for (int k = 0; k < ns; k++)
            for (int i = 0; i < prompt; i++) {
                int64_t j = (int64_t)k * prompt + i;
                x = x * 1664525u + 1013904223u;
                tok[j] = (int32_t)(x % (uint32_t)n_vocab);
                pos[j] = i;
                seq[j] = s0 + k;
            }
        lm_batch batch = {(int64_t)ns * prompt, tok, pos, seq, NULL};
        st = lm_forward(m, kv, &batch, logits);
    }
    double t1 = now_s();
    for (int k = 0; k < N; k++) want[k] = 1, seq[k] = k;
    for (int i = 0; st == LM_OK && i < steps; i++) {
        for (int k = 0; k < N; k++) {
            x = x * 1664525u + 1013904223u;
            tok[k] = (int32_t)(x % (uint32_t)n_vocab);
            pos[k] = prompt + i;
        }
        lm_batch step = {N, tok, pos, seq, mode == LOGITS_LAST ? NULL : want};
        st = cands ? lm_forward_topk(m, kv, &step, &out) : lm_forward(m, kv, &step, logits);
    }
    *prefill_s = t1 - t0;
    *decode_s = now_s() - t1;
    lm_kv_cache_free(kv);
    free(tok), free(pos), free(seq), free(want);
    lm_backend_host_free(m->backend, logits);
    lm_backend_host_free(m->backend, out.ids);
    lm_backend_host_free(m->backend, out.vals);
    lm_backend_host_free(m->backend, out.row_max);
    return st;
}

static void measure_parallel(lm_model_internal *m, const bench_opts *o, int N, par_result *r) {
    memset(r, 0, sizeof *r);
    r->n_seqs = N;
    double *pf = calloc((size_t)o->reps, sizeof *pf), *dc = calloc((size_t)o->reps, sizeof *dc), a = 0, b = 0;
    if (!pf || !dc) r->st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
    /* warm-up: grows the backend's scratch and pools for this batch size */
    int wp = o->par_prompt < 16 ? o->par_prompt : 16;
    if (r->st == LM_OK) r->st = run_parallel_once(m, N, wp, o->n_gen < 2 ? o->n_gen : 2, o->logits, &a, &b);
    for (int i = 0; r->st == LM_OK && i < o->reps; i++) {
        r->st = run_parallel_once(m, N, o->par_prompt, o->n_gen, o->logits, &a, &b);
        pf[i] = a > 0 ? (double)N * o->par_prompt / a : 0.0;
        dc[i] = b > 0 ? (double)N * o->n_gen / b : 0.0;
    }
    if (r->st == LM_OK) {
        r->prefill_tps = median(pf, o->reps);
        r->decode_tps = median(dc, o->reps);
        r->step_ms = r->decode_tps > 0 ? 1e3 * N / r->decode_tps : 0.0;
    } else
        snprintf(r->err, sizeof r->err, "%s", lm_last_error());
    free(pf), free(dc);
}

static bool parse_list(const char *v, bench_opts *o) {
    o->n_parallel = 0;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > 65536 || o->n_parallel == MAX_PARALLEL || (*end && *end != ',')) return false;
        o->parallel[o->n_parallel++] = (int)n;
        p = *end ? end + 1 : end;
    }
    return o->n_parallel > 0;
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
    bench_opts o = {"smollm2-135m", 512, 128, 2, 5, false, "cpu", 0, {0}, 0, 128, LOGITS_TOPK};
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
        else if (!strcmp(a, "--device"))
            target = &o.device;
        else if (!strcmp(a, "--parallel-prompt"))
            target = &o.par_prompt;
        else if (!strcmp(a, "--backend") || !strcmp(a, "--parallel") || !strcmp(a, "--logits")) {
            bool ok = v != NULL;
            if (ok && !strcmp(a, "--backend")) {
                ok = !strcmp(v, "cpu") || !strcmp(v, "cuda");
                o.backend = v;
            } else if (ok && !strcmp(a, "--logits")) {
                ok = false;
                for (int mde = 0; mde < (int)(sizeof k_logits_names / sizeof k_logits_names[0]); mde++)
                    if (!strcmp(v, k_logits_names[mde])) ok = true, o.logits = mde;
            } else if (ok)
                ok = parse_list(v, &o);
            if (!ok) {
                fprintf(stderr, "lumen bench: invalid value for %s\n", a);
                return 2;
            }
            i++;
        }
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
    if (o.n_parallel > 0 && o.par_prompt < 1) {
        fprintf(stderr, "lumen bench: --parallel-prompt must be at least 1\n");
        return 2;
    }
    bool cuda = !strcmp(o.backend, "cuda");
    char path[4096];
    lm_backend *b = NULL;
    lm_model_internal *m = NULL;
    double t_load = now_s();
    if (lm_model_store_resolve(o.model, path, sizeof path) ||
        (cuda ? lm_backend_cuda_create(o.device, &b) : lm_backend_cpu_create(o.threads, &b)) ||
        lm_model_internal_load(path, b, &m)) {
        fprintf(stderr, "lumen bench: %s\n", lm_last_error());
        lm_backend_free(b);
        return 1;
    }
    t_load = now_s() - t_load;
    double pp = 0, tg = 0;
    lm_status st = LM_OK;
    par_result par[MAX_PARALLEL];
    bool par_failed = false;
    if (o.n_prompt > 0) st = measure(m, o.n_prompt, false, o.reps, &pp);
    if (st == LM_OK && o.n_gen > 0 && o.n_parallel == 0) st = measure(m, o.n_gen, true, o.reps, &tg);
    /* each batch size on its own: one that fails (out of memory) does not hide the rest */
    for (int i = 0; st == LM_OK && i < o.n_parallel && o.n_gen > 0; i++) {
        measure_parallel(m, &o, o.parallel[i], &par[i]);
        if (par[i].st) {
            fprintf(stderr, "lumen bench: %d sequences: %s\n", o.parallel[i], par[i].err);
            par_failed = true;
        }
    }
    int n_par = o.n_gen > 0 ? o.n_parallel : 0;
    if (st) {
        fprintf(stderr, "lumen bench: %s\n", lm_last_error());
    } else {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double peak_mib = (double)ru.ru_maxrss / 1024.0;
        if (o.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "model", path);
            cJSON_AddStringToObject(j, "backend", o.backend);
            cJSON_AddNumberToObject(j, "threads", o.threads);
            cJSON_AddNumberToObject(j, "reps", o.reps);
            cJSON_AddNumberToObject(j, "n_prompt", o.n_prompt);
            cJSON_AddNumberToObject(j, "n_gen", o.n_gen);
            cJSON_AddNumberToObject(j, "pp_tokens_per_s", pp);
            cJSON_AddNumberToObject(j, "tg_tokens_per_s", tg);
            cJSON_AddNumberToObject(j, "load_s", t_load);
            cJSON_AddNumberToObject(j, "weight_bytes", (double)m->weight_bytes);
            cJSON_AddNumberToObject(j, "peak_rss_mib", peak_mib);
            if (n_par) {
                cJSON_AddNumberToObject(j, "parallel_prompt", o.par_prompt);
                cJSON_AddStringToObject(j, "logits", k_logits_names[o.logits]);
                if (o.logits == LOGITS_TOPK || o.logits == LOGITS_GREEDY)
                    cJSON_AddNumberToObject(j, "logits_topk_k",
                                            o.logits == LOGITS_GREEDY ? 1
                                            : m->hp.n_vocab < TOPK_K  ? m->hp.n_vocab
                                                                      : TOPK_K);
                cJSON *arr = cJSON_AddArrayToObject(j, "parallel");
                for (int i = 0; i < n_par; i++) {
                    cJSON *e = cJSON_CreateObject();
                    cJSON_AddNumberToObject(e, "n_seqs", par[i].n_seqs);
                    if (par[i].st) {
                        cJSON_AddStringToObject(e, "error", par[i].err);
                    } else {
                        cJSON_AddNumberToObject(e, "prefill_tokens_per_s", par[i].prefill_tps);
                        cJSON_AddNumberToObject(e, "decode_tokens_per_s", par[i].decode_tps);
                        cJSON_AddNumberToObject(e, "step_ms", par[i].step_ms);
                    }
                    cJSON_AddItemToArray(arr, e);
                }
            }
            char *s = cJSON_PrintUnformatted(j);
            puts(s);
            free(s);
            cJSON_Delete(j);
        } else {
            printf("model    %s (%.1f MiB of weights, loaded in %.3f s)\n", path, (double)m->weight_bytes / (1 << 20),
                   t_load);
            if (cuda)
                printf("backend  cuda (GPU %d), %d repetitions (medians)\n", o.device, o.reps);
            else
                printf("threads  %d, %d repetitions (medians)\n", o.threads, o.reps);
            if (o.n_prompt) printf("pp%-6d %10.1f tokens/s\n", o.n_prompt, pp);
            if (o.n_gen && !n_par) printf("tg%-6d %10.1f tokens/s\n", o.n_gen, tg);
            if (n_par)
                printf("parallel: %d-token prompts, %d decode steps, --logits %s (%s)\n%8s %16s %16s %10s\n",
                       o.par_prompt, o.n_gen, k_logits_names[o.logits],
                       o.logits == LOGITS_TOPK     ? "the 64 best logits of every sequence"
                       : o.logits == LOGITS_GREEDY ? "the best logit of every sequence"
                       : o.logits == LOGITS_ALL    ? "the logits of every sequence"
                                                   : "the logits of the last token",
                       "seqs",
                       "prefill tok/s", "decode tok/s", "ms/step");
            for (int i = 0; i < n_par; i++) {
                if (par[i].st)
                    printf("%8d   failed: %s\n", par[i].n_seqs, par[i].err);
                else
                    printf("%8d %16.1f %16.1f %10.3f\n", par[i].n_seqs, par[i].prefill_tps, par[i].decode_tps,
                           par[i].step_ms);
            }
            printf("peak RSS %.1f MiB\n", peak_mib);
        }
    }
    lm_model_internal_free(m);
    lm_backend_free(b);
    return st || par_failed ? 1 : 0;
}
