#include "model/hparams.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "formats/gguf.h"

static const struct {
    const char *name;
    lm_arch arch;
} k_arch_names[] = {
    {"llama", LM_ARCH_LLAMA},          {"LlamaForCausalLM", LM_ARCH_LLAMA},
    {"mistral", LM_ARCH_LLAMA},        {"MistralForCausalLM", LM_ARCH_LLAMA},
    {"qwen2", LM_ARCH_QWEN2},          {"Qwen2ForCausalLM", LM_ARCH_QWEN2},
    {"gemma3", LM_ARCH_GEMMA3},        {"gemma3_text", LM_ARCH_GEMMA3},
    {"Gemma3ForCausalLM", LM_ARCH_GEMMA3},
};

const char *lm_arch_name(lm_arch arch) {
    switch (arch) {
    case LM_ARCH_LLAMA: return "llama";
    case LM_ARCH_QWEN2: return "qwen2";
    case LM_ARCH_GEMMA3: return "gemma3";
    }
    return "unknown";
}

bool lm_arch_from_name(const char *name, lm_arch *out) {
    for (size_t i = 0; i < sizeof k_arch_names / sizeof k_arch_names[0]; i++) {
        if (strcmp(name, k_arch_names[i].name) == 0) {
            *out = k_arch_names[i].arch;
            return true;
        }
    }
    return false;
}

/* Defaults every architecture shares; readers override what their file states. */
static void set_arch_defaults(lm_hparams *hp, lm_arch arch) {
    memset(hp, 0, sizeof *hp);
    hp->arch = arch;
    hp->rms_eps = 1e-5f;
    hp->rope_theta = 10000.0f;
    hp->rope_theta_local = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->embd_scale = 1.0f;
    hp->n_ctx_train = 2048;
    switch (arch) {
    case LM_ARCH_LLAMA: hp->rope_mode = LM_ROPE_NORM; break;
    case LM_ARCH_QWEN2:
        hp->rope_mode = LM_ROPE_NEOX;
        hp->has_qkv_bias = true;
        break;
    case LM_ARCH_GEMMA3:
        hp->rope_mode = LM_ROPE_NEOX;
        hp->has_qk_norm = true;
        hp->has_post_norms = true;
        hp->ffn_gelu = true;
        hp->tied_embeddings = true;
        hp->swa_pattern = 6; /* five local layers, then one global */
        hp->rms_eps = 1e-6f;
        break;
    }
}

/* Derived values that depend on the others once all are read. */
static void finish_hparams(lm_hparams *hp) {
    if (hp->head_dim == 0 && hp->n_head > 0) hp->head_dim = hp->n_embd / hp->n_head;
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim;
    if (hp->n_head_kv == 0) hp->n_head_kv = hp->n_head;
    if (hp->attn_scale == 0.0f && hp->head_dim > 0) hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (hp->arch == LM_ARCH_GEMMA3) hp->embd_scale = sqrtf((float)hp->n_embd);
}

lm_status lm_hparams_validate(const lm_hparams *hp) {
    const int64_t big = (int64_t)1 << 20;
    if (hp->n_vocab <= 0 || hp->n_vocab > ((int64_t)1 << 24))
        return lm_error(LM_ERR_FORMAT, "vocabulary size %lld is out of range", (long long)hp->n_vocab);
    if (hp->n_embd <= 0 || hp->n_embd > big)
        return lm_error(LM_ERR_FORMAT, "embedding length %lld is out of range", (long long)hp->n_embd);
    if (hp->n_layer <= 0 || hp->n_layer > LM_MAX_LAYERS)
        return lm_error(LM_ERR_FORMAT, "layer count %lld is out of range (1..%d)", (long long)hp->n_layer,
                        LM_MAX_LAYERS);
    if (hp->n_head <= 0 || hp->n_head > 4096 || hp->n_head_kv <= 0 || hp->n_head_kv > hp->n_head ||
        hp->n_head % hp->n_head_kv != 0)
        return lm_error(LM_ERR_FORMAT, "head counts %lld (query) / %lld (key-value) are inconsistent",
                        (long long)hp->n_head, (long long)hp->n_head_kv);
    if (hp->head_dim <= 0 || hp->head_dim > 4096 || hp->head_dim % 2 != 0)
        return lm_error(LM_ERR_FORMAT, "head dimension %lld is out of range", (long long)hp->head_dim);
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return lm_error(LM_ERR_FORMAT, "rotary dimension %lld does not fit head dimension %lld",
                        (long long)hp->n_rot, (long long)hp->head_dim);
    if (hp->n_ff <= 0 || hp->n_ff > 16 * big)
        return lm_error(LM_ERR_FORMAT, "feed-forward length %lld is out of range", (long long)hp->n_ff);
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return lm_error(LM_ERR_FORMAT, "RMS norm epsilon %g is out of range", (double)hp->rms_eps);
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta) || !(hp->rope_theta_local > 0.0f))
        return lm_error(LM_ERR_FORMAT, "RoPE base %g is out of range", (double)hp->rope_theta);
    if (!(hp->rope_freq_scale > 0.0f) || !isfinite(hp->rope_freq_scale))
        return lm_error(LM_ERR_FORMAT, "RoPE scale %g is out of range", (double)hp->rope_freq_scale);
    if (hp->sliding_window < 0 || hp->n_ctx_train <= 0)
        return lm_error(LM_ERR_FORMAT, "context length %lld or sliding window %lld is out of range",
                        (long long)hp->n_ctx_train, (long long)hp->sliding_window);
    return LM_OK;
}

/* ---- GGUF ---------------------------------------------------------------------- */

static lm_status gguf_i64(const lm_gguf *g, const char *arch, const char *suffix, bool required,
                          int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    lm_status st = lm_gguf_get_i64(g, key, out);
    if (st == LM_ERR_NOT_FOUND && !required) return LM_OK;
    if (st == LM_ERR_NOT_FOUND) return lm_error(LM_ERR_FORMAT, "GGUF metadata lacks the key %s", key);
    if (st != LM_OK) return lm_error_prefix(st, "GGUF key %s", key);
    return LM_OK;
}

static lm_status gguf_f32(const lm_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    lm_status st = lm_gguf_get_f32(g, key, out);
    if (st == LM_ERR_NOT_FOUND) return LM_OK;
    if (st != LM_OK) return lm_error_prefix(st, "GGUF key %s", key);
    return LM_OK;
}

lm_status lm_hparams_from_gguf(const lm_gguf *g, lm_hparams *out) {
    const char *arch_str;
    size_t arch_len;
    lm_status st = lm_gguf_get_str(g, "general.architecture", &arch_str, &arch_len);
    if (st != LM_OK) return lm_error(LM_ERR_FORMAT, "GGUF metadata lacks general.architecture");
    char arch[64];
    if (arch_len >= sizeof arch) return lm_error(LM_ERR_UNSUPPORTED, "architecture name is too long");
    memcpy(arch, arch_str, arch_len);
    arch[arch_len] = '\0';
    lm_arch a;
    if (!lm_arch_from_name(arch, &a))
        return lm_error(LM_ERR_UNSUPPORTED, "unknown architecture '%s' (supported: llama, qwen2, gemma3)", arch);
    lm_hparams hp;
    set_arch_defaults(&hp, a);

    if ((st = gguf_i64(g, arch, "embedding_length", true, &hp.n_embd)) ||
        (st = gguf_i64(g, arch, "block_count", true, &hp.n_layer)) ||
        (st = gguf_i64(g, arch, "feed_forward_length", true, &hp.n_ff)) ||
        (st = gguf_i64(g, arch, "attention.head_count", true, &hp.n_head)) ||
        (st = gguf_i64(g, arch, "attention.head_count_kv", false, &hp.n_head_kv)) ||
        (st = gguf_i64(g, arch, "attention.key_length", false, &hp.head_dim)) ||
        (st = gguf_i64(g, arch, "rope.dimension_count", false, &hp.n_rot)) ||
        (st = gguf_i64(g, arch, "context_length", false, &hp.n_ctx_train)) ||
        (st = gguf_i64(g, arch, "attention.sliding_window", false, &hp.sliding_window)) ||
        (st = gguf_i64(g, arch, "vocab_size", false, &hp.n_vocab)) ||
        (st = gguf_f32(g, arch, "attention.layer_norm_rms_epsilon", &hp.rms_eps)) ||
        (st = gguf_f32(g, arch, "rope.freq_base", &hp.rope_theta)) ||
        (st = gguf_f32(g, arch, "rope.freq_base_swa", &hp.rope_theta_local)))
        return st;
    float rope_scale = 0.0f;
    if ((st = gguf_f32(g, arch, "rope.scaling.factor", &rope_scale))) return st;
    if (rope_scale > 0.0f) hp.rope_freq_scale = 1.0f / rope_scale;
    if (hp.n_vocab == 0) {
        /* older files carry the vocabulary size only as the token list's length */
        lm_gguf_type type;
        uint64_t n = 0;
        const void *data;
        if (lm_gguf_get_arr(g, "tokenizer.ggml.tokens", &type, &n, &data) == LM_OK) hp.n_vocab = (int64_t)n;
    }
    if (a != LM_ARCH_GEMMA3) hp.tied_embeddings = lm_gguf_find_tensor(g, "output.weight") == NULL;
    finish_hparams(&hp);
    if ((st = lm_hparams_validate(&hp))) return st;
    *out = hp;
    return LM_OK;
}

/* ---- config.json ---------------------------------------------------------------- */

static bool json_i64(const cJSON *obj, const char *key, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) return false;
    if (!(v->valuedouble >= -9.0e15 && v->valuedouble <= 9.0e15)) return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool json_f32(const cJSON *obj, const char *key, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) return false;
    *out = (float)v->valuedouble;
    return true;
}

lm_status lm_hparams_from_config_json(const char *json, size_t len, lm_hparams *out) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lm_error(LM_ERR_FORMAT, "config.json is not a JSON object");
    }
    const cJSON *cfg = root;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(text)) cfg = text;

    const char *type_name = NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cJSON_IsString(mt)) mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt)) type_name = mt->valuestring;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    lm_arch a;
    bool found = type_name && lm_arch_from_name(type_name, &a);
    if (!found && cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        found = lm_arch_from_name(cJSON_GetArrayItem(archs, 0)->valuestring, &a);
    if (!found) {
        lm_status st = lm_error(LM_ERR_UNSUPPORTED, "config.json names an unknown architecture '%s'",
                                type_name ? type_name : "(none)");
        cJSON_Delete(root);
        return st;
    }
    lm_hparams hp;
    set_arch_defaults(&hp, a);
    hp.rope_mode = LM_ROPE_NEOX; /* HF checkpoints keep Q/K rows unpermuted */
    hp.norm_add_one = (a == LM_ARCH_GEMMA3);

    bool ok = json_i64(cfg, "vocab_size", &hp.n_vocab) && json_i64(cfg, "hidden_size", &hp.n_embd) &&
              json_i64(cfg, "num_hidden_layers", &hp.n_layer) &&
              json_i64(cfg, "intermediate_size", &hp.n_ff) &&
              json_i64(cfg, "num_attention_heads", &hp.n_head);
    if (!ok) {
        cJSON_Delete(root);
        return lm_error(LM_ERR_FORMAT, "config.json lacks one of vocab_size, hidden_size, num_hidden_layers, "
                                       "intermediate_size, num_attention_heads (or one is not a number)");
    }
    json_i64(cfg, "num_key_value_heads", &hp.n_head_kv);
    json_i64(cfg, "head_dim", &hp.head_dim);
    json_i64(cfg, "max_position_embeddings", &hp.n_ctx_train);
    json_f32(cfg, "rms_norm_eps", &hp.rms_eps);
    json_f32(cfg, "rope_theta", &hp.rope_theta);
    json_f32(cfg, "rope_local_base_freq", &hp.rope_theta_local);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings");
    if (!cJSON_IsBool(tie)) tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (cJSON_IsBool(tie)) hp.tied_embeddings = cJSON_IsTrue(tie);
    if (a == LM_ARCH_GEMMA3) {
        json_i64(cfg, "sliding_window", &hp.sliding_window);
        int64_t pattern = 0;
        if (json_i64(cfg, "sliding_window_pattern", &pattern)) hp.swa_pattern = (int)pattern;
        float qpas = 0.0f;
        if (json_f32(cfg, "query_pre_attn_scalar", &qpas) && qpas > 0.0f) hp.attn_scale = 1.0f / sqrtf(qpas);
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (cJSON_IsObject(rs)) {
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(kind)) kind = cJSON_GetObjectItemCaseSensitive(rs, "type");
        float factor = 0.0f;
        if (cJSON_IsString(kind) && strcmp(kind->valuestring, "linear") == 0 && json_f32(rs, "factor", &factor) &&
            factor > 0.0f)
            hp.rope_freq_scale = 1.0f / factor;
        else if (cJSON_IsString(kind) && strcmp(kind->valuestring, "default") != 0) {
            lm_status st = lm_error(LM_ERR_UNSUPPORTED, "config.json: rope_scaling type '%s' is not supported",
                                    kind->valuestring);
            cJSON_Delete(root);
            return st;
        }
    }
    cJSON_Delete(root);
    finish_hparams(&hp);
    lm_status st = lm_hparams_validate(&hp);
    if (st) return lm_error_prefix(st, "config.json");
    *out = hp;
    return LM_OK;
}
