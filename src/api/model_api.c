/* The public model API: loading with parameters, vocabulary facts, tokenize /
 * detokenize, and chat templates. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "api/api_internal.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/gguf.h"
#include "formats/model_store.h"
#include "model/forward.h"

double lm_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t lm_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "VmHWM: %llu kB", &kb) == 1;
        fclose(f);
        if (found) return (uint64_t)kb * 1024u;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss > 0) return (uint64_t)ru.ru_maxrss * 1024u;
    return 0;
}

lm_model_params lm_model_default_params(void) {
    return (lm_model_params){.backend = "cpu", .n_threads = 0, .n_ctx = 0, .memory_limit = 0, .kv_type = LM_KV_F16};
}

uint64_t lm_model_kv_bytes(const lm_model *model, int64_t n_ctx, lm_kv_type type) {
    const lm_hparams *hp = &model->m->hp;
    uint64_t elem = type == LM_KV_F32 ? 4 : 2;
    return 2u * (uint64_t)hp->n_layer * (uint64_t)(hp->n_head_kv * hp->head_dim) * elem * (uint64_t)n_ctx;
}

lm_status lm_model_forward(lm_model *model, lm_kv_cache *kv, const int32_t *tokens, const int32_t *pos,
                           const int32_t *seq, int64_t n, float *logits) {
    lm_batch batch = {n, tokens, pos, seq, NULL};
    pthread_mutex_lock(&model->forward_lock);
    lm_status st = lm_forward(model->m, kv, &batch, logits);
    pthread_mutex_unlock(&model->forward_lock);
    return st;
}

lm_status lm_model_forward_topk(lm_model *model, lm_kv_cache *kv, const int32_t *tokens, const int32_t *pos,
                                const int32_t *seq, int64_t n, const lm_topk_out *out) {
    lm_batch batch = {n, tokens, pos, seq, NULL};
    pthread_mutex_lock(&model->forward_lock);
    lm_status st = lm_forward_topk(model->m, kv, &batch, out);
    pthread_mutex_unlock(&model->forward_lock);
    return st;
}

static double mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static lm_status validate_params(const lm_model_params *p) {
    if (p->n_threads < 0 || p->n_threads > LM_MAX_THREADS)
        return lm_error(LM_ERR_INVALID_ARG, "n_threads = %d: must be in [0, %d] (0 = one per CPU)", p->n_threads,
                        LM_MAX_THREADS);
    if (p->n_ctx < 0) return lm_error(LM_ERR_INVALID_ARG, "n_ctx = %d: must be >= 0 (0 = the model's)", p->n_ctx);
    if (p->kv_type != LM_KV_DEFAULT && p->kv_type != LM_KV_F16 && p->kv_type != LM_KV_F32)
        return lm_error(LM_ERR_INVALID_ARG, "kv_type = %d: not an lm_kv_type", (int)p->kv_type);
    if (p->backend && *p->backend && strcmp(p->backend, "cpu") != 0 && strcmp(p->backend, "cuda") != 0)
        return lm_error(LM_ERR_INVALID_ARG, "backend \"%s\": unknown (known: \"cpu\", \"cuda\")", p->backend);
    return LM_OK;
}

/* Loads the tokenizer and the chat template of model->m. */
static lm_status load_tokenizer(lm_model *model) {
    lm_model_internal *m = model->m;
    if (m->gguf) {
        lm_status st = lm_tokenizer_from_gguf(m->gguf, &model->tok);
        if (st) return lm_error_prefix(st, "%s", m->path);
        const char *src;
        size_t len;
        if (lm_gguf_get_str(m->gguf, "tokenizer.chat_template", &src, &len) == LM_OK && len > 0 &&
            !(model->template_src = dup_n(src, len)))
            return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    } else {
        /* a Hugging Face folder: tokenizer.json (+ tokenizer_config.json) */
        lm_status st = lm_tokenizer_from_hf_folder(m->path, &model->tok);
        if (st) return lm_error_prefix(st, "%s", m->path);
        if (lm_chat_template_from_hf_folder(m->path, &model->template_src) != LM_OK) model->template_src = NULL;
    }
    if (model->template_src) {
        lm_status st = lm_template_parse(model->template_src, strlen(model->template_src), &model->tmpl);
        if (st) {
            /* not fatal: raw prompts still work; lm_chat_render reports it */
            model->template_error = strdup(lm_last_error());
            lm_log(LM_LOG_WARN, "%s: the chat template does not parse: %s", m->path, lm_last_error());
        }
    }
    int32_t ids[2] = {lm_tokenizer_bos(model->tok), lm_tokenizer_eos(model->tok)};
    char **dst[2] = {&model->bos_text, &model->eos_text};
    for (int i = 0; i < 2; i++) {
        size_t n;
        const char *t = ids[i] >= 0 ? lm_tokenizer_token_text(model->tok, ids[i], &n) : NULL;
        if (t && !(*dst[i] = dup_n(t, n))) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    return LM_OK;
}

lm_status lm_model_load(const char *spec, lm_model_params params, lm_model **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "lm_model_load: out is NULL");
    *out = NULL;
    if (!spec || !*spec) return lm_error(LM_ERR_INVALID_ARG, "lm_model_load: no model given (path, repo id or name)");
    lm_status st = validate_params(&params);
    if (st) return st;
    char path[4096];
    if ((st = lm_model_store_resolve(spec, path, sizeof path))) return st;

    lm_model *model = calloc(1, sizeof *model);
    if (!model) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_init(&model->forward_lock, NULL);
    atomic_init(&model->kv_bytes_live, 0);
    model->params = params;
    bool cuda = params.backend && strcmp(params.backend, "cuda") == 0;
    model->backend_name = strdup(cuda ? "cuda" : "cpu");
    model->params.backend = model->backend_name;
    if (model->params.kv_type == LM_KV_DEFAULT) model->params.kv_type = LM_KV_F16;
    if (params.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        model->params.n_threads = n < 1 ? 1 : n > LM_MAX_THREADS ? LM_MAX_THREADS : (int32_t)n;
    }
    if (!model->backend_name) st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
    /* CUDA: GPU 0; without a CUDA build or a usable GPU the error says which */
    if (!st)
        st = cuda ? lm_backend_cuda_create(0, &model->backend)
                  : lm_backend_cpu_create(model->params.n_threads, &model->backend);
    /* the limit counts weights and KV caches; copies beside the weights would pass it */
    if (!st && params.memory_limit && model->backend->ops->set_copy_limit)
        model->backend->ops->set_copy_limit(model->backend, 0);
    if (!st) st = lm_model_internal_load(path, model->backend, &model->m);
    if (!st) st = load_tokenizer(model);
    if (st) {
        lm_model_free(model);
        return st;
    }
    const lm_hparams *hp = &model->m->hp;
    int64_t train = hp->n_ctx_train > 0 ? hp->n_ctx_train : LM_DEFAULT_N_CTX;
    if (params.n_ctx == 0) {
        model->params.n_ctx = (int32_t)(train < LM_DEFAULT_N_CTX ? train : LM_DEFAULT_N_CTX);
    } else if (params.n_ctx > train) {
        lm_log(LM_LOG_WARN, "%s: n_ctx %d is beyond the %lld tokens the model was trained for", path, params.n_ctx,
               (long long)train);
    }
    uint64_t need = model->m->weight_bytes + lm_model_kv_bytes(model, model->params.n_ctx, model->params.kv_type);
    if (params.memory_limit && need > params.memory_limit) {
        st = lm_error(LM_ERR_NO_MEMORY,
                      "%s needs %.1f MiB (weights %.1f MiB + KV cache %.1f MiB for n_ctx %d), above the memory "
                      "limit of %.1f MiB; lower n_ctx or raise the limit",
                      path, mib(need), mib(model->m->weight_bytes),
                      mib(need - model->m->weight_bytes), model->params.n_ctx, mib(params.memory_limit));
        lm_model_free(model);
        return st;
    }
    *out = model;
    return LM_OK;
}

void lm_model_free(lm_model *model) {
    if (!model) return;
    lm_template_free(model->tmpl);
    free(model->template_src);
    free(model->template_error);
    free(model->bos_text);
    free(model->eos_text);
    lm_tokenizer_free(model->tok);
    lm_model_internal_free(model->m);
    lm_backend_free(model->backend);
    free(model->backend_name);
    pthread_mutex_destroy(&model->forward_lock);
    free(model);
}

int32_t lm_model_n_vocab(const lm_model *model) { return model ? (int32_t)model->m->hp.n_vocab : 0; }
int32_t lm_model_n_ctx(const lm_model *model) { return model ? model->params.n_ctx : 0; }
int32_t lm_model_n_ctx_train(const lm_model *model) {
    return model ? (int32_t)(model->m->hp.n_ctx_train > INT32_MAX ? INT32_MAX : model->m->hp.n_ctx_train) : 0;
}
const char *lm_model_path(const lm_model *model) { return model ? model->m->path : ""; }
const char *lm_model_arch(const lm_model *model) { return model ? lm_arch_name(model->m->hp.arch) : ""; }
uint64_t lm_model_weight_bytes(const lm_model *model) { return model ? model->m->weight_bytes : 0; }
bool lm_model_has_chat_template(const lm_model *model) { return model && model->template_src; }

/* ---- tokens ---- */

lm_status lm_tokenize(const lm_model *model, const char *text, size_t len, uint32_t flags, int32_t *tokens,
                      size_t cap, size_t *n_tokens) {
    if (!model || !n_tokens || (!text && len) || (!tokens && cap))
        return lm_error(LM_ERR_INVALID_ARG, "lm_tokenize: NULL argument");
    if (flags & ~(uint32_t)(LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL))
        return lm_error(LM_ERR_INVALID_ARG, "lm_tokenize: unknown flags 0x%x", flags);
    bool add = flags & LM_TOKENIZE_ADD_SPECIAL, parse = flags & LM_TOKENIZE_PARSE_SPECIAL;
    /* a chat template that writes the BOS token itself must not get a second one */
    if (add && parse && model->bos_text && lm_tokenizer_add_bos(model->tok)) {
        size_t bl = strlen(model->bos_text);
        if (bl && len >= bl && memcmp(text, model->bos_text, bl) == 0) add = false;
    }
    return lm_tokenizer_encode(model->tok, text ? text : "", len, add, parse, tokens, cap, n_tokens);
}

lm_status lm_detokenize(const lm_model *model, const int32_t *tokens, size_t n, uint32_t flags, char *buf,
                        size_t cap, size_t *n_bytes) {
    if (!model || !n_bytes || (!tokens && n) || (!buf && cap))
        return lm_error(LM_ERR_INVALID_ARG, "lm_detokenize: NULL argument");
    if (flags & ~(uint32_t)(LM_DETOKENIZE_REMOVE_SPECIAL | LM_DETOKENIZE_UNPARSE_SPECIAL))
        return lm_error(LM_ERR_INVALID_ARG, "lm_detokenize: unknown flags 0x%x", flags);
    lm_status st = lm_tokenizer_decode(model->tok, tokens, n, flags & LM_DETOKENIZE_REMOVE_SPECIAL,
                                       flags & LM_DETOKENIZE_UNPARSE_SPECIAL, buf, cap, n_bytes);
    if (st == LM_OK && cap > *n_bytes) buf[*n_bytes] = '\0';
    return st;
}

int32_t lm_token_bos(const lm_model *model) { return model ? lm_tokenizer_bos(model->tok) : -1; }
int32_t lm_token_eos(const lm_model *model) { return model ? lm_tokenizer_eos(model->tok) : -1; }
bool lm_token_is_eog(const lm_model *model, int32_t token) {
    return model && token >= 0 && lm_tokenizer_is_eog(model->tok, token);
}

/* ---- chat templates ---- */

lm_chat_params lm_chat_default_params(void) {
    return (lm_chat_params){.add_generation_prompt = true};
}

static lm_status render(const lm_model *model, const char *messages_json, const lm_chat_params *p, char *buf,
                        size_t cap, size_t *n_bytes) {
    lm_template *own = NULL;
    const lm_template *t = model->tmpl;
    if (p->template_source) {
        lm_status st = lm_template_parse(p->template_source, strlen(p->template_source), &own);
        if (st) return lm_error_prefix(st, "chat template");
        t = own;
    } else if (!model->template_src) {
        return lm_error(LM_ERR_NOT_FOUND, "%s has no chat template: give one, or use the prompt as raw text",
                        model->m->path);
    } else if (!t) {
        return lm_error(LM_ERR_FORMAT, "%s: the chat template does not parse: %s", model->m->path,
                        model->template_error ? model->template_error : "?");
    }
    char *text = NULL;
    size_t len = 0;
    lm_status st = lm_template_render_chat(t, messages_json, p->tools_json, p->add_generation_prompt, model->bos_text,
                                           model->eos_text, p->extra_context_json, &text, &len);
    lm_template_free(own);
    if (st) return lm_error_prefix(st, "chat template");
    *n_bytes = len;
    if (cap) {
        size_t k = len < cap ? len : cap;
        memcpy(buf, text, k);
        if (k < cap) buf[k] = '\0';
    }
    free(text);
    return LM_OK;
}

lm_status lm_chat_render_json(const lm_model *model, const char *messages_json, lm_chat_params params, char *buf,
                              size_t cap, size_t *n_bytes) {
    if (!model || !messages_json || !n_bytes || (!buf && cap))
        return lm_error(LM_ERR_INVALID_ARG, "lm_chat_render_json: NULL argument");
    return render(model, messages_json, &params, buf, cap, n_bytes);
}

lm_status lm_chat_render(const lm_model *model, const lm_chat_message *messages, size_t n_messages,
                         lm_chat_params params, char *buf, size_t cap, size_t *n_bytes) {
    if (!model || (!messages && n_messages) || !n_bytes || (!buf && cap))
        return lm_error(LM_ERR_INVALID_ARG, "lm_chat_render: NULL argument");
    cJSON *arr = cJSON_CreateArray();
    bool ok = arr != NULL;
    for (size_t i = 0; ok && i < n_messages; i++) {
        if (!messages[i].role || !messages[i].content) {
            cJSON_Delete(arr);
            return lm_error(LM_ERR_INVALID_ARG, "lm_chat_render: message %zu has no %s", i,
                            messages[i].role ? "content" : "role");
        }
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddItemToArray(arr, m) && cJSON_AddStringToObject(m, "role", messages[i].role) &&
             cJSON_AddStringToObject(m, "content", messages[i].content);
    }
    char *json = ok ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (!json) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_status st = render(model, json, &params, buf, cap, n_bytes);
    free(json);
    return st;
}
