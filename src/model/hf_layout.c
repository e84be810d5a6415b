/* GGUF -> Hugging Face: tensor names, value transforms and config.json (hf_layout.h). */
#include "model/hf_layout.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Per-layer names: the part after "blk.N." and "model.layers.N.". */
static const struct {
    const char *gguf, *hf; /* hf NULL: depends on the architecture */
    bool norm;
    lm_hf_xform permuted; /* the transform on llama GGUFs (Q/K rows interleaved) */
} k_layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight", true, LM_HF_AS_IS},
    {"attn_q.weight", "self_attn.q_proj.weight", false, LM_HF_UNPERMUTE_Q},
    {"attn_k.weight", "self_attn.k_proj.weight", false, LM_HF_UNPERMUTE_K},
    {"attn_v.weight", "self_attn.v_proj.weight", false, LM_HF_AS_IS},
    {"attn_output.weight", "self_attn.o_proj.weight", false, LM_HF_AS_IS},
    {"attn_q.bias", "self_attn.q_proj.bias", false, LM_HF_AS_IS},
    {"attn_k.bias", "self_attn.k_proj.bias", false, LM_HF_AS_IS},
    {"attn_v.bias", "self_attn.v_proj.bias", false, LM_HF_AS_IS},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", true, LM_HF_AS_IS},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", true, LM_HF_AS_IS},
    {"post_attention_norm.weight", "post_attention_layernorm.weight", true, LM_HF_AS_IS},
    {"ffn_norm.weight", NULL, true, LM_HF_AS_IS},
    {"ffn_gate.weight", "mlp.gate_proj.weight", false, LM_HF_AS_IS},
    {"ffn_up.weight", "mlp.up_proj.weight", false, LM_HF_AS_IS},
    {"ffn_down.weight", "mlp.down_proj.weight", false, LM_HF_AS_IS},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", true, LM_HF_AS_IS},
};

lm_status lm_hf_tensor_name(const lm_hparams *hp, const char *gguf_name, char *hf, size_t cap, lm_hf_xform *xf,
                            int *layer) {
    bool gemma = hp->arch == LM_ARCH_GEMMA3;
    bool permuted = hp->rope_mode == LM_ROPE_NORM; /* llama GGUF: the converter permuted Q/K rows */
    bool norm = false;
    int n = -1;
    *xf = LM_HF_AS_IS;
    *layer = -1;
    if (strcmp(gguf_name, "token_embd.weight") == 0)
        n = snprintf(hf, cap, "model.embed_tokens.weight");
    else if (strcmp(gguf_name, "output.weight") == 0)
        n = snprintf(hf, cap, "lm_head.weight");
    else if (strcmp(gguf_name, "output_norm.weight") == 0)
        n = snprintf(hf, cap, "model.norm.weight"), norm = true;
    else {
        int l = -1, consumed = 0;
        if (sscanf(gguf_name, "blk.%d.%n", &l, &consumed) == 1 && consumed > 0 && l >= 0 && l < hp->n_layer) {
            for (size_t k = 0; k < sizeof k_layer_names / sizeof k_layer_names[0]; k++) {
                if (strcmp(gguf_name + consumed, k_layer_names[k].gguf) != 0) continue;
                const char *part = k_layer_names[k].hf;
                /* Gemma has its own pre-FFN norm name; Llama/Qwen call it post_attention */
                if (!part) part = gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
                n = snprintf(hf, cap, "model.layers.%d.%s", l, part);
                norm = k_layer_names[k].norm;
                if (permuted) *xf = k_layer_names[k].permuted;
                *layer = l;
                break;
            }
        }
        if (n < 0)
            return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has no Hugging Face counterpart that Lumen knows",
                            gguf_name);
    }
    if ((size_t)n >= cap) return lm_error(LM_ERR_LIMIT, "the Hugging Face name of %s is too long", gguf_name);
    if (norm && gemma) *xf = LM_HF_MINUS_ONE; /* HF Gemma stores norm weights as w - 1 */
    return LM_OK;
}

lm_status lm_hf_unpermute_rows(float *w, int64_t rows, int64_t cols, int64_t head_rows) {
    if (head_rows <= 0 || head_rows % 2 != 0 || rows % head_rows != 0)
        return lm_error(LM_ERR_FORMAT, "cannot undo the Q/K row permutation: %lld rows in heads of %lld",
                        (long long)rows, (long long)head_rows);
    int64_t D = head_rows, half = D / 2;
    float *tmp = malloc((size_t)(D * cols) * sizeof(float));
    if (!tmp) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    for (int64_t h = 0; h < rows / D; h++) {
        float *head = w + h * D * cols;
        memcpy(tmp, head, (size_t)(D * cols) * sizeof(float));
        for (int64_t a = 0; a < 2; a++)
            for (int64_t i = 0; i < half; i++)
                memcpy(head + (a * half + i) * cols, tmp + (2 * i + a) * cols, (size_t)cols * sizeof(float));
    }
    free(tmp);
    return LM_OK;
}

int64_t lm_hf_xform_rows(const lm_hparams *hp, lm_hf_xform xf) {
    return xf == LM_HF_UNPERMUTE_Q || xf == LM_HF_UNPERMUTE_K ? hp->head_dim : 1;
}

lm_status lm_hf_apply_xform(const lm_hparams *hp, lm_hf_xform xf, float *w, int64_t rows, int64_t cols) {
    switch (xf) {
    case LM_HF_AS_IS: return LM_OK;
    case LM_HF_UNPERMUTE_Q:
    case LM_HF_UNPERMUTE_K: return lm_hf_unpermute_rows(w, rows, cols, hp->head_dim);
    case LM_HF_MINUS_ONE:
        for (int64_t i = 0; i < rows * cols; i++) w[i] -= 1.0f;
        return LM_OK;
    }
    return lm_error(LM_ERR_INTERNAL, "unknown tensor transform %d", (int)xf);
}

double lm_hf_short_float(float v) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return strtod(buf, NULL);
}

lm_status lm_hf_config_json(const lm_hparams *hp, const lm_hf_config_info *info, char **text) {
    *text = NULL;
    if (hp->n_rot != hp->head_dim)
        return lm_error(LM_ERR_UNSUPPORTED, "partial rotary embeddings (%lld of %lld dims) cannot be expressed in "
                                            "config.json yet", (long long)hp->n_rot, (long long)hp->head_dim);
    bool gemma = hp->arch == LM_ARCH_GEMMA3, qwen2 = hp->arch == LM_ARCH_QWEN2;
    const char *model_type = gemma ? "gemma3_text" : qwen2 ? "qwen2" : "llama";
    const char *arch = gemma ? "Gemma3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    const char *torch_dtype = info->dtype == LM_DTYPE_F32   ? "float32"
                              : info->dtype == LM_DTYPE_F16 ? "float16"
                                                            : "bfloat16";
    cJSON *c = cJSON_CreateObject();
    if (!c) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    cJSON *archs = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(arch));
    cJSON_AddStringToObject(c, "model_type", model_type);
    cJSON_AddNumberToObject(c, "vocab_size", (double)hp->n_vocab);
    cJSON_AddNumberToObject(c, "hidden_size", (double)hp->n_embd);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)hp->n_ff);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)hp->n_layer);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)hp->n_head);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)hp->n_head_kv);
    cJSON_AddNumberToObject(c, "head_dim", (double)hp->head_dim);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)hp->n_ctx_train);
    cJSON_AddNumberToObject(c, "rms_norm_eps", lm_hf_short_float(hp->rms_eps));
    cJSON_AddNumberToObject(c, "rope_theta", lm_hf_short_float(hp->rope_theta));
    /* Gemma 3's config class names the activation hidden_activation */
    cJSON_AddStringToObject(c, gemma ? "hidden_activation" : "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
    cJSON_AddBoolToObject(c, "tie_word_embeddings", info->tied);
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype);
    if (hp->rope_freq_scale != 1.0f) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddNumberToObject(rs, "factor", lm_hf_short_float(1.0f / hp->rope_freq_scale));
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    cJSON_AddBoolToObject(c, "attention_bias", qwen2);
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(c, "use_cache", true);
    if (hp->arch == LM_ARCH_LLAMA) cJSON_AddBoolToObject(c, "mlp_bias", false);
    if (qwen2) {
        cJSON_AddBoolToObject(c, "use_sliding_window", false);
        cJSON_AddNumberToObject(c, "max_window_layers", (double)hp->n_layer);
    }
    if (gemma) {
        cJSON_AddNumberToObject(c, "sliding_window", (double)hp->sliding_window);
        cJSON_AddNumberToObject(c, "sliding_window_pattern", (double)hp->swa_pattern);
        cJSON *types = cJSON_AddArrayToObject(c, "layer_types");
        for (int64_t il = 0; il < hp->n_layer; il++)
            cJSON_AddItemToArray(types, cJSON_CreateString(lm_hparams_layer_is_swa(hp, il) ? "sliding_attention"
                                                                                           : "full_attention"));
        cJSON_AddNumberToObject(c, "rope_local_base_freq", lm_hf_short_float(hp->rope_theta_local));
        /* the scalar is an integer in practice (head_dim, or hidden / heads): say so
         * exactly, so reading it back gives the same attn_scale */
        double qpas = 1.0 / ((double)hp->attn_scale * (double)hp->attn_scale);
        if (fabs(qpas - round(qpas)) < 1e-4 * qpas) qpas = round(qpas);
        cJSON_AddNumberToObject(c, "query_pre_attn_scalar", qpas);
        cJSON_AddNullToObject(c, "final_logit_softcapping");
        cJSON_AddNullToObject(c, "attn_logit_softcapping");
    }
    if (info->bos_id >= 0) cJSON_AddNumberToObject(c, "bos_token_id", info->bos_id);
    if (info->eos_id >= 0) cJSON_AddNumberToObject(c, "eos_token_id", info->eos_id);
    if (info->pad_id >= 0) cJSON_AddNumberToObject(c, "pad_token_id", info->pad_id);
    char *s = cJSON_Print(c);
    cJSON_Delete(c);
    if (!s) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    *text = s;
    return LM_OK;
}
