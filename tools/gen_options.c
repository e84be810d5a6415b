/* Options shared by `lumen run` and `lumen chat` (see gen_options.h). */
#include "gen_options.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

void gen_options_init(gen_options *o, float temperature, int32_t max_tokens) {
    memset(o, 0, sizeof *o);
    o->model = GEN_DEFAULT_MODEL;
    o->model_params = lm_model_default_params();
    o->gen = lm_generate_default_params();
    o->gen.sampling.temperature = temperature;
    o->gen.max_tokens = max_tokens;
    o->gen.stop = o->stops;
    o->gen.sampling.logit_bias = o->bias;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || isnan(v)) return false;
    *out = v;
    return true;
}

/* "ID=BIAS", BIAS a number or -inf */
static bool parse_bias(const char *s, lm_logit_bias *b) {
    const char *eq = strchr(s, '=');
    if (!eq) return false;
    char id[32];
    size_t n = (size_t)(eq - s);
    if (n == 0 || n >= sizeof id) return false;
    memcpy(id, s, n);
    id[n] = '\0';
    long v;
    if (!parse_long(id, 0, INT32_MAX, &v)) return false;
    b->token = (int32_t)v;
    if (strcmp(eq + 1, "-inf") == 0) {
        b->bias = -INFINITY;
        return true;
    }
    return parse_float(eq + 1, &b->bias) && isfinite(b->bias);
}

int gen_options_parse(gen_options *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    lm_sampling_params *sp = &o->gen.sampling;
    static const char *const with_value[] = {
        "-t", "--threads", "-c", "--ctx", "--memory-limit", "--kv-type", "--backend", "-n", "--max-tokens",
        "--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
        "--presence-penalty", "--frequency-penalty", "--seed", "--stop", "--logit-bias", "-s", "--system"};
    bool known = false;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= strcmp(a, with_value[k]) == 0;
    if (!known) {
        if (strcmp(a, "--ignore-eos") == 0) {
            o->gen.ignore_eos = true;
            return 1;
        }
        return 0;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "lumen %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    long l;
    float f;
    bool ok = true;
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if ((ok = parse_long(v, 0, LM_MAX_THREADS, &l))) o->model_params.n_threads = (int32_t)l;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        if ((ok = parse_long(v, 0, INT32_MAX, &l))) o->model_params.n_ctx = (int32_t)l;
    } else if (!strcmp(a, "--memory-limit")) {
        if ((ok = parse_long(v, 0, 1L << 40, &l))) o->model_params.memory_limit = (uint64_t)l << 20;
    } else if (!strcmp(a, "--kv-type")) {
        if (!strcmp(v, "f16")) o->model_params.kv_type = LM_KV_F16;
        else if (!strcmp(v, "f32")) o->model_params.kv_type = LM_KV_F32;
        else ok = false;
    } else if (!strcmp(a, "--backend")) {
        o->model_params.backend = v;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
        if ((ok = parse_long(v, -1, INT32_MAX, &l))) o->gen.max_tokens = (int32_t)l;
    } else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) {
        if ((ok = parse_float(v, &f))) sp->temperature = f;
    } else if (!strcmp(a, "--top-k")) {
        if ((ok = parse_long(v, INT32_MIN, INT32_MAX, &l))) sp->top_k = (int32_t)l;
    } else if (!strcmp(a, "--top-p")) {
        if ((ok = parse_float(v, &f))) sp->top_p = f;
    } else if (!strcmp(a, "--min-p")) {
        if ((ok = parse_float(v, &f))) sp->min_p = f;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if ((ok = parse_float(v, &f))) sp->repetition_penalty = f;
    } else if (!strcmp(a, "--repeat-last-n")) {
        if ((ok = parse_long(v, INT32_MIN, INT32_MAX, &l))) sp->repetition_context_size = (int32_t)l;
    } else if (!strcmp(a, "--presence-penalty")) {
        if ((ok = parse_float(v, &f))) sp->presence_penalty = f;
    } else if (!strcmp(a, "--frequency-penalty")) {
        if ((ok = parse_float(v, &f))) sp->frequency_penalty = f;
    } else if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if ((ok = *v && *v != '-' && !*end && !errno && s != LM_SAMPLING_SEED_RANDOM)) sp->seed = s;
    } else if (!strcmp(a, "--stop")) {
        if (o->gen.n_stop >= GEN_MAX_STOPS) {
            fprintf(stderr, "lumen %s: at most %d stop strings\n", cmd, GEN_MAX_STOPS);
            return -1;
        }
        o->stops[o->gen.n_stop++] = v;
    } else if (!strcmp(a, "--logit-bias")) {
        if (sp->n_logit_bias >= GEN_MAX_BIAS) {
            fprintf(stderr, "lumen %s: at most %d logit biases\n", cmd, GEN_MAX_BIAS);
            return -1;
        }
        if ((ok = parse_bias(v, &o->bias[sp->n_logit_bias]))) sp->n_logit_bias++;
    } else if (!strcmp(a, "-s") || !strcmp(a, "--system")) {
        o->system = v;
    }
    if (!ok) {
        fprintf(stderr, "lumen %s: invalid value for %s: '%s'\n", cmd, a, v);
        return -1;
    }
    return 1;
}

void gen_options_usage(FILE *f, float temperature, int32_t max_tokens) {
    fprintf(f,
            "model:\n"
            "  MODEL                     a .gguf file, a Hugging Face folder, a repo id in the HF cache\n"
            "                            (org/name) or a name from `lumen pull` (default: " GEN_DEFAULT_MODEL ")\n"
            "  -t, --threads N           CPU threads; 0 = one per CPU (default: 0)\n"
            "  -c, --ctx N               context length in tokens; 0 = the model's, at most %d (default: 0)\n"
            "  --memory-limit MIB        refuse to use more than MIB MiB for weights + KV cache; 0 = no limit\n"
            "                            (default: 0)\n"
            "  --kv-type f16|f32         KV cache storage (default: f16)\n"
            "  --backend NAME            compute backend: cpu (default: cpu)\n"
            "generation:\n"
            "  -s, --system TEXT         a system message (default: none)\n"
            "  -n, --max-tokens N        tokens to generate at most; -1 = until the context is full\n"
            "                            (default: %d)\n"
            "  --stop TEXT               stop before this text; repeatable (default: none)\n"
            "  --ignore-eos              keep going after end-of-generation tokens (default: off)\n"
            "sampling:\n"
            "  --temp, --temperature F   0 = greedy (default: %g)\n"
            "  --top-k N                 keep the N most likely tokens; 0 = off (default: 0)\n"
            "  --top-p F                 nucleus sampling in (0, 1]; 1 = off (default: 1)\n"
            "  --min-p F                 drop tokens below F x the top probability; 0 = off (default: 0)\n"
            "  --repeat-penalty F        repetition penalty, > 0; 1 = off (default: 1)\n"
            "  --repeat-last-n N         tokens the repetition penalty looks back; 0 = all (default: 64)\n"
            "  --presence-penalty F      subtracted once per token already generated (default: 0)\n"
            "  --frequency-penalty F     subtracted per occurrence of a generated token (default: 0)\n"
            "  --logit-bias ID=BIAS      add BIAS to token ID's logit (-inf bans it); repeatable (default: none)\n"
            "  --seed N                  random seed, same seed same text (default: random)\n",
            LM_DEFAULT_N_CTX, (int)max_tokens, (double)temperature);
}

int gen_load_model(const gen_options *o, const char *cmd, lm_model **model) {
    if (lm_model_load(o->model, o->model_params, model) != LM_OK) {
        fprintf(stderr, "lumen %s: %s\n", cmd, lm_last_error());
        return 1;
    }
    return 0;
}

void gen_json_string(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', o);
            fputc(c, o);
        } else if (c == '\n') {
            fputs("\\n", o);
        } else if (c == '\t') {
            fputs("\\t", o);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(o, "\\u%04x", c);
        } else if (c < 0x80) {
            fputc(c, o);
        } else {
            /* a whole, valid UTF-8 sequence is copied; anything else is escaped */
            size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
            size_t k = 1;
            while (need && k < need && i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
            if (need && k == need) {
                fwrite(s + i, 1, need, o);
                i += need - 1;
            } else {
                fprintf(o, "\\u%04x", c);
            }
        }
    }
    fputc('"', o);
}

void gen_json_stats(FILE *f, const lm_stats *s) {
    fprintf(f,
            "{\"prompt_tokens\": %lld, \"cached_tokens\": %lld, \"generated_tokens\": %lld, \"prompt_s\": %.6f, "
            "\"ttft_s\": %.6f, \"generation_s\": %.6f, \"total_s\": %.6f, \"prompt_tps\": %.3f, "
            "\"generation_tps\": %.3f, \"peak_rss_bytes\": %llu, \"kv_cache_bytes\": %llu, \"finish_reason\": \"%s\"}",
            (long long)s->n_prompt_tokens, (long long)s->n_cached_tokens, (long long)s->n_generated_tokens,
            s->prompt_s, s->ttft_s, s->generation_s, s->total_s, s->prompt_tps, s->generation_tps,
            (unsigned long long)s->peak_rss_bytes, (unsigned long long)s->kv_cache_bytes,
            lm_finish_reason_str(s->finish));
}

void gen_print_stats(FILE *f, const lm_stats *s) {
    fprintf(f,
            "[prompt %lld tokens (%lld cached), %.1f tok/s | generated %lld tokens, %.1f tok/s | first token "
            "%.2f s | peak memory %.0f MiB | %s]\n",
            (long long)s->n_prompt_tokens, (long long)s->n_cached_tokens, s->prompt_tps,
            (long long)s->n_generated_tokens, s->generation_tps, s->ttft_s, (double)s->peak_rss_bytes / 1048576.0,
            lm_finish_reason_str(s->finish));
}

/* ---- Ctrl-C ---- */

volatile int gen_sigint_pending;
static lm_request *volatile g_watched;

static void on_sigint(int sig) {
    (void)sig;
    lm_request *r = g_watched;
    if (r)
        lm_request_cancel(r); /* an atomic store: async-signal-safe */
    else
        gen_sigint_pending = 1;
}

void gen_sigint_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a read at the chat prompt returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

void gen_sigint_watch(lm_request *req) { g_watched = req; }
