/* lumen inspect MODEL [--json] [--no-tensors]: what a model file holds. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "commands.h"
#include "formats/gguf.h"
#include "formats/model_store.h"
#include "formats/safetensors.h"
#include "model/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen inspect MODEL [options]\n"
            "  MODEL          a .gguf file, a Hugging Face folder, or a name from `lumen pull`\n"
            "  --json         print one JSON object instead of text (default: text)\n"
            "  --no-tensors   leave out the tensor list (default: listed)\n");
}

static const char *tokenizer_kind(const lm_model_internal *m, char *buf, size_t cap) {
    if (m->gguf) {
        const char *s;
        size_t n;
        if (lm_gguf_get_str(m->gguf, "tokenizer.ggml.model", &s, &n) != LM_OK) return "none";
        const char *kind = n == 4 && memcmp(s, "gpt2", 4) == 0    ? "byte-level BPE"
                           : n == 5 && memcmp(s, "llama", 5) == 0 ? "SentencePiece"
                                                                   : "other";
        snprintf(buf, cap, "%s (%.*s)", kind, (int)n, s);
        return buf;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", m->path);
    FILE *f = fopen(path, "rb");
    if (!f) return "none (no tokenizer.json)";
    fclose(f);
    return "tokenizer.json";
}

static int64_t n_tensors(const lm_model_internal *m) {
    return m->gguf ? lm_gguf_n_tensors(m->gguf) : lm_st_folder_n_tensors(m->folder);
}

static const lm_tensor *tensor_at(const lm_model_internal *m, int64_t i) {
    return m->gguf ? lm_gguf_tensor(m->gguf, i) : lm_st_folder_tensor(m->folder, i);
}

static void shape_str(const lm_tensor *t, char *buf, size_t cap) {
    int n = 0;
    for (int d = 0; d < t->n_dims && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ", %lld" : "%lld", (long long)t->ne[d]);
}

static void print_text(const lm_model_internal *m, bool tensors) {
    const lm_hparams *hp = &m->hp;
    char kind[128];
    uint64_t total = 0;
    for (int64_t i = 0; i < n_tensors(m); i++) total += tensor_at(m, i)->nbytes;
    printf("model         %s\n", m->path);
    printf("format        %s\n", m->format == LM_FORMAT_GGUF ? "GGUF" : "Hugging Face folder (safetensors)");
    printf("architecture  %s\n", lm_arch_name(hp->arch));
    printf("vocabulary    %lld\n", (long long)hp->n_vocab);
    printf("layers        %lld\n", (long long)hp->n_layer);
    printf("embedding     %lld\n", (long long)hp->n_embd);
    printf("heads         %lld query, %lld key/value, head dim %lld\n", (long long)hp->n_head,
           (long long)hp->n_head_kv, (long long)hp->head_dim);
    printf("feed-forward  %lld (%s)\n", (long long)hp->n_ff, hp->ffn_gelu ? "GeGLU" : "SwiGLU");
    printf("context       %lld (trained)\n", (long long)hp->n_ctx_train);
    printf("rope          base %g, %lld dims, %s%s\n", (double)hp->rope_theta, (long long)hp->n_rot,
           hp->rope_mode == LM_ROPE_NEOX ? "neox" : "normal", hp->rope_freq_scale != 1.0f ? ", scaled" : "");
    if (hp->sliding_window)
        printf("sliding       window %lld, every %d-th layer global, local base %g\n", (long long)hp->sliding_window,
               hp->swa_pattern, (double)hp->rope_theta_local);
    printf("rms eps       %g\n", (double)hp->rms_eps);
    printf("embeddings    %s\n", hp->tied_embeddings ? "tied to output" : "separate output");
    printf("tokenizer     %s\n", tokenizer_kind(m, kind, sizeof kind));
    printf("tensors       %lld, %.1f MiB\n", (long long)n_tensors(m), (double)total / (1 << 20));
    if (!tensors) return;
    for (int64_t i = 0; i < n_tensors(m); i++) {
        const lm_tensor *t = tensor_at(m, i);
        char shape[128] = "";
        shape_str(t, shape, sizeof shape);
        printf("  %-48s %-6s [%s] %zu bytes\n", t->name, lm_dtype_name(t->type), shape, t->nbytes);
    }
}

static void print_json(const lm_model_internal *m, bool tensors) {
    const lm_hparams *hp = &m->hp;
    char kind[128];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", m->path);
    cJSON_AddStringToObject(o, "format", m->format == LM_FORMAT_GGUF ? "gguf" : "hf-folder");
    cJSON_AddStringToObject(o, "architecture", lm_arch_name(hp->arch));
    cJSON *h = cJSON_AddObjectToObject(o, "hparams");
    cJSON_AddNumberToObject(h, "n_vocab", (double)hp->n_vocab);
    cJSON_AddNumberToObject(h, "n_embd", (double)hp->n_embd);
    cJSON_AddNumberToObject(h, "n_layer", (double)hp->n_layer);
    cJSON_AddNumberToObject(h, "n_head", (double)hp->n_head);
    cJSON_AddNumberToObject(h, "n_head_kv", (double)hp->n_head_kv);
    cJSON_AddNumberToObject(h, "head_dim", (double)hp->head_dim);
    cJSON_AddNumberToObject(h, "n_ff", (double)hp->n_ff);
    cJSON_AddNumberToObject(h, "n_ctx_train", (double)hp->n_ctx_train);
    cJSON_AddNumberToObject(h, "n_rot", (double)hp->n_rot);
    cJSON_AddNumberToObject(h, "rope_theta", hp->rope_theta);
    cJSON_AddNumberToObject(h, "rope_theta_local", hp->rope_theta_local);
    cJSON_AddStringToObject(h, "rope_mode", hp->rope_mode == LM_ROPE_NEOX ? "neox" : "normal");
    cJSON_AddNumberToObject(h, "rms_eps", hp->rms_eps);
    cJSON_AddNumberToObject(h, "sliding_window", (double)hp->sliding_window);
    cJSON_AddBoolToObject(h, "tied_embeddings", hp->tied_embeddings);
    cJSON_AddStringToObject(o, "tokenizer", tokenizer_kind(m, kind, sizeof kind));
    double total = 0;
    cJSON *list = tensors ? cJSON_AddArrayToObject(o, "tensors") : NULL;
    for (int64_t i = 0; i < n_tensors(m); i++) {
        const lm_tensor *t = tensor_at(m, i);
        total += (double)t->nbytes;
        if (!list) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "type", lm_dtype_name(t->type));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->ne[d]));
        cJSON_AddNumberToObject(e, "bytes", (double)t->nbytes);
        cJSON_AddItemToArray(list, e);
    }
    cJSON_AddNumberToObject(o, "n_tensors", (double)n_tensors(m));
    cJSON_AddNumberToObject(o, "tensor_bytes", total);
    char *s = cJSON_Print(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

int cmd_inspect(int argc, char **argv) {
    const char *spec = NULL;
    bool json = false, tensors = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--no-tensors") == 0)
            tensors = false;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || spec) {
            usage(stderr);
            return 2;
        } else
            spec = argv[i];
    }
    if (!spec) {
        usage(stderr);
        return 2;
    }
    char path[4096];
    lm_backend *b = NULL;
    lm_model_internal *m = NULL;
    if (lm_model_store_resolve(spec, path, sizeof path) || lm_backend_cpu_create(1, &b) ||
        lm_model_internal_load(path, b, &m)) {
        fprintf(stderr, "lumen inspect: %s\n", lm_last_error());
        lm_backend_free(b);
        return 1;
    }
    if (json)
        print_json(m, tensors);
    else
        print_text(m, tensors);
    lm_model_internal_free(m);
    lm_backend_free(b);
    return 0;
}
