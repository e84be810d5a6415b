/* lumen run [MODEL] -p PROMPT: greedy generation from a prompt, streamed to stdout.
 *
 * The prompt is wrapped in the model's chat template (from the GGUF) unless --raw.
 * Sampling options, JSON output and the engine come with the generation API; this
 * command is the plain path through tokenizer, forward pass and detokenizer. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "commands.h"
#include "formats/gguf.h"
#include "formats/model_store.h"
#include "model/forward.h"
#include "tokenizer/template/template.h"
#include "tokenizer/tokenizer.h"

typedef struct run_opts {
    const char *model, *prompt, *system;
    int max_tokens, threads, ctx;
    bool raw;
} run_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen run [MODEL] -p PROMPT [options]\n"
            "  MODEL              a .gguf file or a name from `lumen pull` (default: smollm2-135m)\n"
            "  -p, --prompt TEXT  the user message (required)\n"
            "  -s, --system TEXT  a system message (default: none)\n"
            "  -n, --max-tokens N tokens to generate at most (default: 128)\n"
            "  -t, --threads N    CPU threads (default: 2)\n"
            "  -c, --ctx N        context length in tokens (default: 4096)\n"
            "  --raw              feed the prompt as is, without the chat template (default: off)\n");
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.model = "smollm2-135m", .max_tokens = 128, .threads = 2, .ctx = 4096};
    bool model_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool has_value = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--raw")) {
            o->raw = true;
            has_value = false;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v)
            o->prompt = v;
        else if ((!strcmp(a, "-s") || !strcmp(a, "--system")) && v)
            o->system = v;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && v) {
            if (!parse_int(v, 1, 1 << 20, &o->max_tokens)) goto bad_value;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v) {
            if (!parse_int(v, 1, 1024, &o->threads)) goto bad_value;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx")) && v) {
            if (!parse_int(v, 16, 1 << 22, &o->ctx)) goto bad_value;
        } else if (a[0] != '-' && !model_set) {
            o->model = a;
            model_set = true;
            has_value = false;
        } else {
            fprintf(stderr, "lumen run: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        if (has_value) i++;
        continue;
    bad_value:
        fprintf(stderr, "lumen run: invalid value for %s: %s\n", a, v);
        return 2;
    }
    if (!o->prompt) {
        fprintf(stderr, "lumen run: a prompt is required (-p TEXT)\n");
        usage(stderr);
        return 2;
    }
    return -1; /* go on */
}

/* The chat template applied to [system?, user]. Returns malloc'd text or NULL. */
static char *render_chat(const lm_gguf *g, const lm_tokenizer *tok, const run_opts *o) {
    const char *src;
    size_t len;
    if (lm_gguf_get_str(g, "tokenizer.chat_template", &src, &len) != LM_OK) {
        fprintf(stderr, "lumen run: the model has no chat template; use --raw\n");
        return NULL;
    }
    lm_template *t = NULL;
    if (lm_template_parse(src, len, &t) != LM_OK) {
        fprintf(stderr, "lumen run: chat template: %s\n", lm_last_error());
        return NULL;
    }
    cJSON *msgs = cJSON_CreateArray();
    if (o->system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", o->system);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", o->prompt);
    cJSON_AddItemToArray(msgs, m);
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    char bos[256] = "", eos[256] = "";
    size_t n;
    const char *s;
    if (lm_tokenizer_bos(tok) >= 0 && (s = lm_tokenizer_token_text(tok, lm_tokenizer_bos(tok), &n)) && n < sizeof bos)
        memcpy(bos, s, n), bos[n] = '\0';
    if (lm_tokenizer_eos(tok) >= 0 && (s = lm_tokenizer_token_text(tok, lm_tokenizer_eos(tok), &n)) && n < sizeof eos)
        memcpy(eos, s, n), eos[n] = '\0';
    char *out = NULL;
    size_t out_len;
    if (lm_template_render_chat(t, json, NULL, true, bos, eos, NULL, &out, &out_len) != LM_OK)
        fprintf(stderr, "lumen run: chat template: %s\n", lm_last_error());
    free(json);
    lm_template_free(t);
    return out;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int generate(lm_model_internal *m, lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                    const run_opts *o) {
    int64_t V = m->hp.n_vocab;
    if ((int64_t)n_prompt + o->max_tokens > o->ctx) {
        fprintf(stderr, "lumen run: prompt (%zu tokens) + max tokens (%d) exceed the context (%d); use --ctx\n",
                n_prompt, o->max_tokens, o->ctx);
        return 1;
    }
    lm_kv_cache *kv = NULL;
    lm_detok_stream *ds = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *pos = malloc(sizeof(int32_t) * n_prompt), *seq = calloc(n_prompt, sizeof(int32_t));
    int rc = 1;
    if (!logits || !pos || !seq || lm_kv_cache_for_model(m, o->ctx, 1, LM_DTYPE_F16, &kv) ||
        lm_detok_stream_create(tok, true, false, &ds))
        goto done;
    for (size_t i = 0; i < n_prompt; i++) pos[i] = (int32_t)i;
    double t0 = now_s();
    lm_batch batch = {(int64_t)n_prompt, prompt, pos, seq, NULL};
    if (lm_forward(m, kv, &batch, logits)) goto done;
    double t1 = now_s();
    int n_gen = 0;
    for (; n_gen < o->max_tokens; n_gen++) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = (int32_t)i;
        if (lm_tokenizer_is_eog(tok, best)) break;
        const char *text;
        size_t len;
        if (lm_detok_stream_push(ds, best, &text, &len)) goto done;
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        int32_t p = (int32_t)(n_prompt + (size_t)n_gen), s0 = 0;
        lm_batch step = {1, &best, &p, &s0, NULL};
        if (lm_forward(m, kv, &step, logits)) goto done;
    }
    const char *text;
    size_t len;
    if (lm_detok_stream_finish(ds, &text, &len) == LM_OK) fwrite(text, 1, len, stdout);
    double t2 = now_s();
    printf("\n");
    fprintf(stderr, "[prompt %zu tokens, %.1f tok/s | generated %d tokens, %.1f tok/s]\n", n_prompt,
            (double)n_prompt / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9), n_gen,
            n_gen / (t2 - t1 > 1e-9 ? t2 - t1 : 1e-9));
    rc = 0;
done:
    if (rc) fprintf(stderr, "lumen run: %s\n", lm_last_error());
    lm_detok_stream_free(ds);
    lm_kv_cache_free(kv);
    free(logits), free(pos), free(seq);
    return rc;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    char path[4096];
    lm_backend *b = NULL;
    lm_model_internal *m = NULL;
    lm_tokenizer *tok = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rc = 1;
    if (lm_model_store_resolve(o.model, path, sizeof path) || lm_backend_cpu_create(o.threads, &b) ||
        lm_model_internal_load(path, b, &m)) {
        fprintf(stderr, "lumen run: %s\n", lm_last_error());
        goto done;
    }
    if (!m->gguf) {
        fprintf(stderr, "lumen run: %s: tokenizers of Hugging Face folders are not supported yet\n", path);
        goto done;
    }
    if (lm_tokenizer_from_gguf(m->gguf, &tok)) {
        fprintf(stderr, "lumen run: %s\n", lm_last_error());
        goto done;
    }
    text = o.raw ? strdup(o.prompt) : render_chat(m->gguf, tok, &o);
    if (!text) goto done;
    /* a template that writes the BOS token itself must not get a second one */
    size_t bos_len = 0;
    const char *bos = lm_tokenizer_bos(tok) >= 0 ? lm_tokenizer_token_text(tok, lm_tokenizer_bos(tok), &bos_len) : NULL;
    bool add_special = !(bos && bos_len && strncmp(text, bos, bos_len) == 0);
    if (lm_tokenizer_encode_alloc(tok, text, strlen(text), add_special, true, &ids, &n_ids) || n_ids == 0) {
        fprintf(stderr, "lumen run: %s\n", n_ids == 0 ? "the prompt is empty" : lm_last_error());
        goto done;
    }
    rc = generate(m, tok, ids, n_ids, &o);
done:
    free(ids);
    free(text);
    lm_tokenizer_free(tok);
    lm_model_internal_free(m);
    lm_backend_free(b);
    return rc;
}
