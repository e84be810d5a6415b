/* The fuser (contract in fuse.h): plan every output tensor from the base, check that
 * the adapter fits, then write the merged folder under a temporary name and rename it
 * into the hub cache. */
#include "adapters/fuse.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/hub.h"
#include "adapters/lora.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_store.h"
#include "formats/safetensors.h"
#include "model/hparams.h"
#include "tensor/quant.h"

enum { NAME_CAP = 192, PATH_CAP = 4096 };

lm_fuse_params lm_fuse_default_params(void) {
    lm_fuse_params p = {0};
    p.out_dtype = -1;
    return p;
}

/* ---- GGUF -> Hugging Face tensor names ------------------------------------------- */

typedef enum xform { XF_NONE, XF_UNPERMUTE_Q, XF_UNPERMUTE_K, XF_NORM_MINUS_ONE } xform;

typedef struct name_map {
    const char *gguf, *hf; /* per-layer entries: the part after "blk.N." / "model.layers.N." */
    bool norm;
    int module; /* lm_lora_module, or -1 */
} name_map;

static const name_map k_layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight", true, -1},
    {"attn_q.weight", "self_attn.q_proj.weight", false, LM_LORA_Q},
    {"attn_k.weight", "self_attn.k_proj.weight", false, LM_LORA_K},
    {"attn_v.weight", "self_attn.v_proj.weight", false, LM_LORA_V},
    {"attn_output.weight", "self_attn.o_proj.weight", false, LM_LORA_O},
    {"attn_q.bias", "self_attn.q_proj.bias", false, -1},
    {"attn_k.bias", "self_attn.k_proj.bias", false, -1},
    {"attn_v.bias", "self_attn.v_proj.bias", false, -1},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", true, -1},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", true, -1},
    {"post_attention_norm.weight", "post_attention_layernorm.weight", true, -1},
    {"ffn_norm.weight", NULL, true, -1}, /* depends on the architecture */
    {"ffn_gate.weight", "mlp.gate_proj.weight", false, LM_LORA_GATE},
    {"ffn_up.weight", "mlp.up_proj.weight", false, LM_LORA_UP},
    {"ffn_down.weight", "mlp.down_proj.weight", false, LM_LORA_DOWN},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", true, -1},
};

/* HF projection names inside a layer, for folder bases. */
static const char *const k_hf_module_names[LM_LORA_N_MODULES] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

/* ---- the plan -------------------------------------------------------------------- */

typedef struct plan_item {
    char name[NAME_CAP];
    const lm_tensor *src;
    lm_dtype out_type;
    xform xf;
    const lm_lora_pair *lora;
    int layer;
    int n_dims;
    int64_t shape[4]; /* outermost first, as safetensors writes it */
    int64_t rows, cols;
    size_t out_bytes;
    int shard;
} plan_item;

typedef struct fuser {
    const lm_fuse_params *p;
    lm_fuse_result *res;
    char base_path[PATH_CAP];
    bool is_gguf;
    lm_gguf *gguf;
    lm_st_folder *folder;
    lm_hparams hp;
    lm_lora *lora;
    bool *lora_used; /* [n_pairs] */
    plan_item *items;
    int64_t n_items;
    int n_shards;
    uint64_t total_bytes;
} fuser;

static lm_status plan_add(fuser *F, const char *name, const lm_tensor *t, xform xf, int layer, int module,
                          lm_dtype out_type) {
    plan_item *it = &F->items[F->n_items++];
    memset(it, 0, sizeof *it);
    if ((size_t)snprintf(it->name, sizeof it->name, "%s", name) >= sizeof it->name)
        return lm_error(LM_ERR_LIMIT, "tensor name %s is too long", name);
    it->src = t;
    it->xf = xf;
    it->layer = layer;
    it->out_type = out_type;
    it->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) it->shape[d] = t->ne[t->n_dims - 1 - d];
    it->cols = t->ne[0];
    it->rows = lm_tensor_nelements(t) / (t->ne[0] ? t->ne[0] : 1);
    it->out_bytes = (size_t)lm_tensor_nelements(t) * lm_dtype_get_info(out_type)->block_bytes;
    if (module >= 0) {
        const lm_lora_pair *lp = lm_lora_find(F->lora, layer, (lm_lora_module)module);
        if (lp) {
            if (t->n_dims != 2 || lp->out != t->ne[1] || lp->in != t->ne[0])
                return lm_error(LM_ERR_FORMAT,
                                "adapter does not fit the base: '%s' and '%s' make a [%lld x %lld] delta (rank %lld) but "
                                "base weight %s is [%lld x %lld]",
                                lp->a->name, lp->b->name, (long long)lp->out, (long long)lp->in, (long long)lp->rank,
                                t->name, (long long)t->ne[1], (long long)t->ne[0]);
            it->lora = lp;
            F->lora_used[lp - F->lora->pairs] = true;
        }
    }
    return LM_OK;
}

static lm_dtype gguf_out_type(const fuser *F) {
    if (F->p->out_dtype >= 0) return (lm_dtype)F->p->out_dtype;
    const lm_tensor *q = lm_gguf_find_tensor(F->gguf, "blk.0.attn_q.weight");
    if (q && (q->type == LM_DTYPE_F32 || q->type == LM_DTYPE_F16 || q->type == LM_DTYPE_BF16)) return q->type;
    return LM_DTYPE_BF16;
}

static lm_status plan_gguf(fuser *F) {
    int64_t n = lm_gguf_n_tensors(F->gguf);
    F->items = calloc((size_t)(n ? n : 1), sizeof *F->items);
    if (!F->items) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_dtype out_type = gguf_out_type(F);
    bool gemma = F->hp.arch == LM_ARCH_GEMMA3;
    bool permuted = F->hp.rope_mode == LM_ROPE_NORM; /* llama: the converter permuted Q/K rows */
    for (int64_t i = 0; i < n; i++) {
        const lm_tensor *t = lm_gguf_tensor(F->gguf, i);
        char hf[NAME_CAP];
        xform xf = XF_NONE;
        int layer = -1, module = -1;
        bool norm = false;
        if (strcmp(t->name, "token_embd.weight") == 0) snprintf(hf, sizeof hf, "model.embed_tokens.weight");
        else if (strcmp(t->name, "output.weight") == 0) snprintf(hf, sizeof hf, "lm_head.weight");
        else if (strcmp(t->name, "output_norm.weight") == 0) snprintf(hf, sizeof hf, "model.norm.weight"), norm = true;
        else {
            int consumed = 0;
            const name_map *m = NULL;
            if (sscanf(t->name, "blk.%d.%n", &layer, &consumed) == 1 && consumed > 0 && layer >= 0 &&
                layer < F->hp.n_layer) {
                for (size_t k = 0; k < sizeof k_layer_names / sizeof k_layer_names[0]; k++)
                    if (strcmp(t->name + consumed, k_layer_names[k].gguf) == 0) m = &k_layer_names[k];
            }
            if (!m)
                return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has no Hugging Face counterpart that Lumen knows",
                                t->name);
            const char *hfpart = m->hf;
            if (!hfpart) hfpart = gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
            snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, hfpart);
            norm = m->norm;
            module = m->module;
            if (permuted && module == LM_LORA_Q) xf = XF_UNPERMUTE_Q;
            if (permuted && module == LM_LORA_K) xf = XF_UNPERMUTE_K;
        }
        if (norm && gemma) xf = XF_NORM_MINUS_ONE; /* HF Gemma stores norm weights as w - 1 */
        const lm_dtype_info *info = lm_dtype_get_info(t->type);
        if (!info || !(info->quantized || t->type == LM_DTYPE_F32 || t->type == LM_DTYPE_F16 ||
                       t->type == LM_DTYPE_BF16) || lm_dtype_row_bytes(t->type, t->ne[0]) == 0)
            return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has type %s, which Lumen cannot dequantize", t->name,
                            lm_dtype_name(t->type));
        lm_status st = plan_add(F, hf, t, xf, layer, module, out_type);
        if (st) return st;
    }
    return LM_OK;
}

/* "…layers.N.<proj>.weight" -> layer and module of a folder tensor, or -1. */
static void hf_module_of(const char *name, int *layer, int *module) {
    *layer = -1;
    *module = -1;
    const char *p = strstr(name, "layers.");
    if (!p) return;
    int l = 0, consumed = 0;
    if (sscanf(p, "layers.%d.%n", &l, &consumed) != 1 || consumed == 0) return;
    for (int m = 0; m < LM_LORA_N_MODULES; m++)
        if (strcmp(p + consumed, k_hf_module_names[m]) == 0) {
            *layer = l;
            *module = m;
        }
}

static lm_status plan_folder(fuser *F) {
    int64_t n = lm_st_folder_n_tensors(F->folder);
    F->items = calloc((size_t)(n ? n : 1), sizeof *F->items);
    if (!F->items) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        const lm_tensor *t = lm_st_folder_tensor(F->folder, i);
        if (t->type == LM_DTYPE_U32)
            return lm_error(LM_ERR_UNSUPPORTED, "base tensor %s is packed (MLX-quantized); fusing into quantized "
                                                "folder bases is not supported yet", t->name);
        if (t->type != LM_DTYPE_F32 && t->type != LM_DTYPE_F16 && t->type != LM_DTYPE_BF16)
            return lm_error(LM_ERR_UNSUPPORTED, "base tensor %s has dtype %s; only F32, F16 and BF16 folders can be fused",
                            t->name, lm_dtype_name(t->type));
        int layer, module;
        hf_module_of(t->name, &layer, &module);
        lm_dtype out_type = F->p->out_dtype >= 0 ? (lm_dtype)F->p->out_dtype : t->type;
        lm_status st = plan_add(F, t->name, t, XF_NONE, layer, module, out_type);
        if (st) return st;
    }
    return LM_OK;
}

/* Every adapter pair must have found its weight; then split into shards. */
static lm_status plan_finish(fuser *F) {
    for (int64_t i = 0; i < F->lora->n_pairs; i++) {
        const lm_lora_pair *lp = &F->lora->pairs[i];
        if (!F->lora_used[i])
            return lm_error(LM_ERR_FORMAT, "adapter does not fit the base: '%s' targets layer %d %s, but the base (%lld "
                                           "layers) has no such weight",
                            lp->a->name, lp->layer, lm_lora_module_name(lp->module), (long long)F->hp.n_layer);
    }
    uint64_t limit = F->p->shard_bytes ? F->p->shard_bytes : ((uint64_t)2 << 30), cur = 0;
    int shard = 0;
    for (int64_t i = 0; i < F->n_items; i++) {
        plan_item *it = &F->items[i];
        if (cur > 0 && cur + it->out_bytes > limit) shard++, cur = 0;
        it->shard = shard;
        cur += it->out_bytes;
        F->total_bytes += it->out_bytes;
    }
    F->n_shards = shard + 1;
    return LM_OK;
}

/* ---- producing one output tensor --------------------------------------------------- */

/* HF row a*D/2 + i of a head came from GGUF row 2i + a: the converter interleaved the
 * two rotary halves so that "normal" RoPE pairs neighbours. */
static lm_status unpermute(float *w, int64_t rows, int64_t cols, int64_t n_head) {
    if (n_head <= 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0)
        return lm_error(LM_ERR_FORMAT, "cannot undo the Q/K row permutation: %lld rows in %lld heads", (long long)rows,
                        (long long)n_head);
    int64_t D = rows / n_head, half = D / 2;
    float *tmp = malloc((size_t)(D * cols) * sizeof(float));
    if (!tmp) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    for (int64_t h = 0; h < n_head; h++) {
        float *head = w + h * D * cols;
        memcpy(tmp, head, (size_t)(D * cols) * sizeof(float));
        for (int64_t a = 0; a < 2; a++)
            for (int64_t i = 0; i < half; i++)
                memcpy(head + (a * half + i) * cols, tmp + (2 * i + a) * cols, (size_t)cols * sizeof(float));
    }
    free(tmp);
    return LM_OK;
}

/* *out: the tensor's bytes in its output type; *owned tells whether to free them. */
static lm_status produce(fuser *F, const plan_item *it, const void **out, bool *owned) {
    const lm_tensor *t = it->src;
    F->res->base_tensors_read++;
    if (it->xf == XF_NONE && !it->lora && t->type == it->out_type) {
        *out = t->data; /* copied into the output file as is */
        *owned = false;
        return LM_OK;
    }
    int64_t n = it->rows * it->cols;
    float *w = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!w) return lm_error(LM_ERR_NO_MEMORY, "out of memory converting %s", t->name);
    size_t row_bytes = lm_dtype_row_bytes(t->type, it->cols);
    for (int64_t r = 0; r < it->rows; r++)
        lm_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * row_bytes, w + r * it->cols, it->cols);
    lm_status st = LM_OK;
    if (it->xf == XF_UNPERMUTE_Q) st = unpermute(w, it->rows, it->cols, F->hp.n_head);
    if (it->xf == XF_UNPERMUTE_K) st = unpermute(w, it->rows, it->cols, F->hp.n_head_kv);
    if (it->xf == XF_NORM_MINUS_ONE)
        for (int64_t i = 0; i < n; i++) w[i] -= 1.0f;
    if (!st && it->lora) {
        const lm_lora_pair *lp = it->lora;
        float *scratch = malloc((size_t)(lp->rank * (lp->in + lp->out)) * sizeof(float));
        if (!scratch) st = lm_error(LM_ERR_NO_MEMORY, "out of memory applying the adapter to %s", t->name);
        else {
            lm_lora_apply(F->lora, lp, w, scratch);
            F->res->weights_adapted++;
        }
        free(scratch);
    }
    if (st) {
        free(w);
        return st;
    }
    if (it->out_type == LM_DTYPE_F32) {
        *out = w;
        *owned = true;
        return LM_OK;
    }
    uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
    if (!h) {
        free(w);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory converting %s", t->name);
    }
    for (int64_t i = 0; i < n; i++) h[i] = it->out_type == LM_DTYPE_F16 ? lm_f32_to_f16(w[i]) : lm_f32_to_bf16(w[i]);
    free(w);
    *out = h;
    *owned = true;
    return LM_OK;
}

/* ---- files of the output folder ------------------------------------------------------- */

static lm_status write_text(const char *path, const char *text) {
    return lm_adapter_write_file_atomic(path, text, strlen(text));
}

static void shard_name(const fuser *F, int shard, char *buf, size_t cap) {
    if (F->n_shards == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", shard + 1, F->n_shards);
}

static lm_status write_weights(fuser *F, const char *dir) {
    uint64_t done = 0;
    lm_status st = LM_OK;
    int64_t first = 0;
    const void **bufs = calloc((size_t)(F->n_items ? F->n_items : 1), sizeof *bufs);
    bool *owned = calloc((size_t)(F->n_items ? F->n_items : 1), sizeof *owned);
    if (!bufs || !owned) st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
    for (int shard = 0; shard < F->n_shards && !st; shard++) {
        lm_safetensors_writer *w = lm_safetensors_writer_create();
        if (!w) {
            st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
            break;
        }
        lm_safetensors_writer_set_metadata(w, "format", "pt");
        int64_t i = first;
        for (; i < F->n_items && F->items[i].shard == shard && !st; i++) {
            plan_item *it = &F->items[i];
            if ((st = produce(F, it, &bufs[i], &owned[i]))) break;
            st = lm_safetensors_writer_add(w, it->name, it->out_type, it->n_dims, it->shape, bufs[i]);
            done += it->out_bytes;
            if (!st && F->p->progress && !F->p->progress(F->p->progress_user, done, F->total_bytes))
                st = lm_error(LM_ERR_INVALID_ARG, "fuse cancelled by its progress callback");
        }
        char name[64], path[2 * PATH_CAP];
        shard_name(F, shard, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!st) st = lm_safetensors_writer_write(w, path);
        lm_safetensors_writer_free(w);
        for (int64_t k = first; k < i; k++)
            if (owned[k]) free((void *)bufs[k]), owned[k] = false;
        first = i;
    }
    if (!st && F->n_shards > 1) {
        cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)F->total_bytes);
        cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
        for (int64_t i = 0; i < F->n_items; i++) {
            char name[64];
            shard_name(F, F->items[i].shard, name, sizeof name);
            cJSON_AddStringToObject(map, F->items[i].name, name);
        }
        char *text = cJSON_Print(root);
        char path[2 * PATH_CAP];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        st = text ? write_text(path, text) : lm_error(LM_ERR_NO_MEMORY, "out of memory");
        free(text);
        cJSON_Delete(root);
    }
    if (bufs && owned)
        for (int64_t k = 0; k < F->n_items; k++)
            if (owned[k]) free((void *)bufs[k]);
    free(bufs);
    free(owned);
    return st;
}

/* The shortest decimal that reads back as the same float, so config.json says 1e-05,
 * not 9.99999974737875e-06. */
static double short_float(float v) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return strtod(buf, NULL);
}

static lm_status write_gguf_config(const fuser *F, const char *dir) {
    const lm_hparams *hp = &F->hp;
    if (hp->n_rot != hp->head_dim)
        return lm_error(LM_ERR_UNSUPPORTED, "partial rotary embeddings (%lld of %lld dims) cannot be expressed in "
                                            "config.json yet", (long long)hp->n_rot, (long long)hp->head_dim);
    const char *model_type = "llama", *arch = "LlamaForCausalLM", *act = "silu";
    if (hp->arch == LM_ARCH_QWEN2) model_type = "qwen2", arch = "Qwen2ForCausalLM";
    if (hp->arch == LM_ARCH_GEMMA3) model_type = "gemma3_text", arch = "Gemma3ForCausalLM", act = "gelu_pytorch_tanh";
    lm_dtype dt = F->n_items ? F->items[0].out_type : LM_DTYPE_BF16;
    const char *torch_dtype = dt == LM_DTYPE_F32 ? "float32" : dt == LM_DTYPE_F16 ? "float16" : "bfloat16";
    cJSON *c = cJSON_CreateObject();
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
    cJSON_AddNumberToObject(c, "rms_norm_eps", short_float(hp->rms_eps));
    cJSON_AddNumberToObject(c, "rope_theta", short_float(hp->rope_theta));
    cJSON_AddStringToObject(c, "hidden_act", act);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", lm_gguf_find_tensor(F->gguf, "output.weight") == NULL);
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype);
    if (hp->rope_freq_scale != 1.0f) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddNumberToObject(rs, "factor", short_float(1.0f / hp->rope_freq_scale));
    }
    if (hp->arch == LM_ARCH_GEMMA3) {
        cJSON_AddNumberToObject(c, "sliding_window", (double)hp->sliding_window);
        cJSON_AddNumberToObject(c, "sliding_window_pattern", (double)hp->swa_pattern);
        cJSON_AddNumberToObject(c, "rope_local_base_freq", short_float(hp->rope_theta_local));
        cJSON_AddNumberToObject(c, "query_pre_attn_scalar",
                                short_float(1.0f / (hp->attn_scale * hp->attn_scale)));
    }
    uint32_t tok;
    if (lm_gguf_get_u32(F->gguf, "tokenizer.ggml.bos_token_id", &tok) == LM_OK)
        cJSON_AddNumberToObject(c, "bos_token_id", tok);
    if (lm_gguf_get_u32(F->gguf, "tokenizer.ggml.eos_token_id", &tok) == LM_OK)
        cJSON_AddNumberToObject(c, "eos_token_id", tok);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    if (!text) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    char path[2 * PATH_CAP];
    snprintf(path, sizeof path, "%s/config.json", dir);
    lm_status st = write_text(path, text);
    free(text);
    return st;
}

static lm_status copy_file(const char *src, const char *dst) {
    uint8_t *buf = NULL;
    size_t len = 0;
    lm_status st = lm_adapter_read_file(src, (uint64_t)1 << 30, &buf, &len);
    if (!st) st = lm_adapter_write_file_atomic(dst, buf, len);
    free(buf);
    return st;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* config.json, tokenizer and generation files of a folder base. */
static lm_status copy_folder_files(const fuser *F, const char *dir) {
    DIR *d = opendir(F->base_path);
    if (!d) return lm_error(LM_ERR_IO, "cannot list %s: %s", F->base_path, strerror(errno));
    struct dirent *e;
    lm_status st = LM_OK;
    while (!st && (e = readdir(d))) {
        const char *n = e->d_name;
        if (n[0] == '.' || strcmp(n, "model.safetensors.index.json") == 0 || strcmp(n, "adapter_config.json") == 0 ||
            strcmp(n, "lumen_fuse.json") == 0)
            continue;
        if (!has_suffix(n, ".json") && !has_suffix(n, ".txt") && !has_suffix(n, ".model") && !has_suffix(n, ".jinja"))
            continue;
        char src[2 * PATH_CAP], dst[2 * PATH_CAP];
        snprintf(src, sizeof src, "%s/%s", F->base_path, n);
        snprintf(dst, sizeof dst, "%s/%s", dir, n);
        struct stat sb;
        if (stat(src, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        st = copy_file(src, dst);
    }
    closedir(d);
    return st;
}

static lm_status write_provenance(const fuser *F, const char *dir) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "base", F->base_path);
    cJSON_AddStringToObject(c, "adapter_digest", F->res->digest);
    cJSON_AddStringToObject(c, "adapter_layout", F->lora->layout == LM_LORA_LAYOUT_MLX ? "mlx" : "peft");
    cJSON_AddNumberToObject(c, "scale", short_float(F->lora->scale));
    cJSON_AddNumberToObject(c, "adapted_weights", (double)F->lora->n_pairs);
    cJSON_AddStringToObject(c, "tool", "lumen " "fuse");
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    if (!text) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    char path[2 * PATH_CAP];
    snprintf(path, sizeof path, "%s/lumen_fuse.json", dir);
    lm_status st = write_text(path, text);
    free(text);
    return st;
}

/* ---- folders ------------------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static lm_status mkdir_p(const char *path) {
    char buf[PATH_CAP];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return lm_error(LM_ERR_LIMIT, "path %s is too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return lm_error(LM_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return lm_error(LM_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
    return LM_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

lm_status lm_fuse_resolve_base(const char *base, char *buf, size_t cap) {
    if (!base || !*base) return lm_error(LM_ERR_INVALID_ARG, "no base model given");
    struct stat sb;
    if (stat(base, &sb) == 0) {
        if ((size_t)snprintf(buf, cap, "%s", base) >= cap) return lm_error(LM_ERR_LIMIT, "base path is too long");
        return LM_OK;
    }
    if (!strchr(base, '/') && lm_model_store_resolve(base, buf, cap) == LM_OK) return LM_OK;
    if (lm_hub_repo_id_valid(base) && lm_hub_resolve(base, buf, cap) == LM_OK) return LM_OK;
    char home[2048], hub[2048], folder[512] = "models--?";
    lm_model_store_home(home, sizeof home);
    lm_hub_dir(hub, sizeof hub);
    lm_hub_repo_folder(base, folder, sizeof folder);
    return lm_error(LM_ERR_NOT_FOUND,
                    "base model '%s' not found; looked for a file or folder at that path, a pulled model in "
                    "%s/models/%s, and a Hugging Face cache snapshot in %s/%s/snapshots/",
                    base, home, base, hub, folder);
}

/* The adapter's compressed bytes: the file, or an adapter folder encoded now. */
static lm_status load_adapter(const char *adapter, uint8_t **z, size_t *z_len) {
    if (!is_dir(adapter)) return lm_adapter_read_file(adapter, (uint64_t)1 << 36, z, z_len);
    char st_path[PATH_CAP + 40], cfg_path[PATH_CAP + 40];
    snprintf(st_path, sizeof st_path, "%s/adapters.safetensors", adapter);
    struct stat sb;
    if (stat(st_path, &sb) != 0) snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", adapter);
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", adapter);
    uint8_t *st_bytes = NULL, *cfg = NULL;
    size_t st_len = 0, cfg_len = 0;
    lm_status st = lm_adapter_read_file(st_path, (uint64_t)1 << 36, &st_bytes, &st_len);
    if (!st && stat(cfg_path, &sb) == 0) st = lm_adapter_read_file(cfg_path, LM_ADAPTER_MAX_CONFIG, &cfg, &cfg_len);
    if (!st) st = lm_adapter_encode_memory(st_bytes, st_len, (const char *)cfg, cfg_len, z, z_len);
    free(st_bytes);
    free(cfg);
    return st;
}

static lm_status open_base(fuser *F) {
    lm_status st;
    struct stat sb;
    if (stat(F->base_path, &sb) != 0) return lm_error(LM_ERR_NOT_FOUND, "base %s vanished", F->base_path);
    if (S_ISDIR(sb.st_mode)) {
        char path[PATH_CAP + 16];
        snprintf(path, sizeof path, "%s/config.json", F->base_path);
        uint8_t *json = NULL;
        size_t len = 0;
        if ((st = lm_adapter_read_file(path, 4u << 20, &json, &len))) return st;
        st = lm_hparams_from_config_json((const char *)json, len, &F->hp);
        free(json);
        if (st) return lm_error_prefix(st, "%s", path);
        return lm_st_folder_open(F->base_path, &F->folder);
    }
    F->is_gguf = true;
    if ((st = lm_gguf_open(F->base_path, &F->gguf))) return st;
    if ((st = lm_hparams_from_gguf(F->gguf, &F->hp))) return lm_error_prefix(st, "%s", F->base_path);
    return LM_OK;
}

static void fuser_free(fuser *F) {
    lm_gguf_close(F->gguf);
    lm_st_folder_close(F->folder);
    lm_lora_free(F->lora);
    free(F->lora_used);
    free(F->items);
}

lm_status lm_adapter_fuse(const char *base, const char *adapter, const lm_fuse_params *params,
                          lm_fuse_result *out) {
    memset(out, 0, sizeof *out);
    lm_fuse_params defaults = lm_fuse_default_params();
    if (!params) params = &defaults;
    if (!base || !adapter) return lm_error(LM_ERR_INVALID_ARG, "fuse needs a base model and an adapter");
    const char *ns = params->namespace_name;
    if (!ns || !lm_hub_repo_id_valid(ns))
        return lm_error(LM_ERR_INVALID_ARG, "namespace '%s' is not valid (use name or org/name of [A-Za-z0-9._-])",
                        ns ? ns : "(none)");
    if (params->out_dtype >= 0 && params->out_dtype != LM_DTYPE_F32 && params->out_dtype != LM_DTYPE_F16 &&
        params->out_dtype != LM_DTYPE_BF16)
        return lm_error(LM_ERR_INVALID_ARG, "output dtype must be F32, F16 or BF16");

    /* 1. the digest, and the cache */
    uint8_t *z = NULL;
    size_t z_len = 0;
    lm_status st = load_adapter(adapter, &z, &z_len);
    if (st) return lm_error_prefix(st, "adapter %s", adapter);
    if ((st = lm_adapter_digest_memory(z, z_len, out->digest))) goto early;
    if (params->expected_digest && strcmp(params->expected_digest, out->digest) != 0) {
        st = lm_error(LM_ERR_FORMAT, "adapter %s: digest mismatch: expected %s, the file's is %s", adapter,
                      params->expected_digest, out->digest);
        goto early;
    }
    snprintf(out->repo_id, sizeof out->repo_id, "%s-%s", ns, out->digest);
    char hub[2048], folder[512], repo[PATH_CAP], snap_rel[64];
    lm_hub_dir(hub, sizeof hub);
    if (!lm_hub_repo_folder(out->repo_id, folder, sizeof folder)) {
        st = lm_error(LM_ERR_INVALID_ARG, "repo id %s is not valid", out->repo_id);
        goto early;
    }
    if ((size_t)snprintf(repo, sizeof repo, "%s/%s", hub, folder) >= sizeof repo ||
        (size_t)snprintf(out->path, sizeof out->path, "%s/snapshots/%s", repo, out->digest) >= sizeof out->path) {
        st = lm_error(LM_ERR_LIMIT, "hub path %s is too long", hub);
        goto early;
    }
    snprintf(snap_rel, sizeof snap_rel, "snapshots/%s", out->digest);
    if (is_dir(out->path)) {
        out->cached = true;
        free(z);
        return LM_OK;
    }

    /* 2. decode and check everything before touching the cache */
    fuser F = {.p = params, .res = out};
    uint8_t *st_bytes = NULL;
    size_t st_len = 0;
    char *config = NULL;
    st = lm_adapter_decode_memory(z, z_len, out->digest, 0, &st_bytes, &st_len, &config);
    free(z);
    z = NULL;
    if (st) return lm_error_prefix(st, "adapter %s", adapter);
    st = lm_lora_open(st_bytes, st_len, config, &F.lora); /* takes st_bytes */
    free(config);
    if (st) return lm_error_prefix(st, "adapter %s", adapter);
    if (!(F.lora_used = calloc((size_t)F.lora->n_pairs, sizeof *F.lora_used))) {
        fuser_free(&F);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    if ((st = lm_fuse_resolve_base(base, F.base_path, sizeof F.base_path)) || (st = open_base(&F)) ||
        (st = F.is_gguf ? plan_gguf(&F) : plan_folder(&F)) || (st = plan_finish(&F))) {
        fuser_free(&F);
        return st;
    }

    /* 3. write under a temporary name, then rename into place */
    char tmp[PATH_CAP], dir[PATH_CAP + 96], path[PATH_CAP + 128];
    if ((st = mkdir_p(hub))) {
        fuser_free(&F);
        return st;
    }
    snprintf(tmp, sizeof tmp, "%s/.lumen-fuse-XXXXXX", hub);
    if (!mkdtemp(tmp)) {
        st = lm_error(LM_ERR_IO, "cannot create a temporary folder in %s: %s", hub, strerror(errno));
        fuser_free(&F);
        return st;
    }
    chmod(tmp, 0755); /* mkdtemp made it private; the cache is shared like the rest of the hub */
    snprintf(dir, sizeof dir, "%s/%s", tmp, snap_rel);
    snprintf(path, sizeof path, "%s/refs", tmp);
    if (!(st = mkdir_p(dir)) && !(st = mkdir_p(path))) {
        snprintf(path, sizeof path, "%s/refs/main", tmp);
        st = write_text(path, out->digest);
    }
    if (!st) st = F.is_gguf ? write_gguf_config(&F, dir) : copy_folder_files(&F, dir);
    if (!st) st = write_weights(&F, dir);
    if (!st) st = write_provenance(&F, dir);
    if (!st && rename(tmp, repo) != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY) {
            /* the repo folder exists: someone fused the same adapter meanwhile, or an
             * older snapshot lives there; move just our snapshot in */
            char snaps[PATH_CAP + 16];
            snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
            if (!is_dir(out->path) && (mkdir_p(snaps) || rename(dir, out->path) != 0) && !is_dir(out->path))
                st = lm_error(LM_ERR_IO, "cannot move the fused model into %s: %s", out->path, strerror(errno));
        } else {
            st = lm_error(LM_ERR_IO, "cannot rename %s to %s: %s", tmp, repo, strerror(errno));
        }
        rm_tree(tmp);
    }
    if (st) rm_tree(tmp);
    fuser_free(&F);
    if (st) {
        out->base_tensors_read = 0;
        return st;
    }
    return LM_OK;
early:
    free(z);
    return st;
}
