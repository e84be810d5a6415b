/* Loading: open the file, read hyperparameters, find every tensor the architecture
 * needs under its GGUF or Hugging Face name, check its shape, and bind it. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "tensor/quant.h"

enum { NAME_CAP = 256 };

/* The roles a tensor can play, with their names in both layouts ("%d" = layer). */
typedef enum role {
    ROLE_TOK_EMBD, ROLE_OUTPUT, ROLE_OUTPUT_NORM,
    ROLE_ATTN_NORM, ROLE_WQ, ROLE_WK, ROLE_WV, ROLE_WO, ROLE_BQ, ROLE_BK, ROLE_BV,
    ROLE_Q_NORM, ROLE_K_NORM, ROLE_POST_ATTN_NORM,
    ROLE_FFN_NORM, ROLE_GATE, ROLE_UP, ROLE_DOWN, ROLE_POST_FFN_NORM,
} role;

static const char *gguf_name(role r) {
    switch (r) {
    case ROLE_TOK_EMBD: return "token_embd.weight";
    case ROLE_OUTPUT: return "output.weight";
    case ROLE_OUTPUT_NORM: return "output_norm.weight";
    case ROLE_ATTN_NORM: return "blk.%d.attn_norm.weight";
    case ROLE_WQ: return "blk.%d.attn_q.weight";
    case ROLE_WK: return "blk.%d.attn_k.weight";
    case ROLE_WV: return "blk.%d.attn_v.weight";
    case ROLE_WO: return "blk.%d.attn_output.weight";
    case ROLE_BQ: return "blk.%d.attn_q.bias";
    case ROLE_BK: return "blk.%d.attn_k.bias";
    case ROLE_BV: return "blk.%d.attn_v.bias";
    case ROLE_Q_NORM: return "blk.%d.attn_q_norm.weight";
    case ROLE_K_NORM: return "blk.%d.attn_k_norm.weight";
    case ROLE_POST_ATTN_NORM: return "blk.%d.post_attention_norm.weight";
    case ROLE_FFN_NORM: return "blk.%d.ffn_norm.weight";
    case ROLE_GATE: return "blk.%d.ffn_gate.weight";
    case ROLE_UP: return "blk.%d.ffn_up.weight";
    case ROLE_DOWN: return "blk.%d.ffn_down.weight";
    case ROLE_POST_FFN_NORM: return "blk.%d.post_ffw_norm.weight";
    }
    return "";
}

/* Hugging Face names, without the "model." / "language_model.model." prefix. */
static const char *hf_name(role r, lm_arch arch) {
    switch (r) {
    case ROLE_TOK_EMBD: return "embed_tokens.weight";
    case ROLE_OUTPUT: return "lm_head.weight"; /* at the top level, no prefix */
    case ROLE_OUTPUT_NORM: return "norm.weight";
    case ROLE_ATTN_NORM: return "layers.%d.input_layernorm.weight";
    case ROLE_WQ: return "layers.%d.self_attn.q_proj.weight";
    case ROLE_WK: return "layers.%d.self_attn.k_proj.weight";
    case ROLE_WV: return "layers.%d.self_attn.v_proj.weight";
    case ROLE_WO: return "layers.%d.self_attn.o_proj.weight";
    case ROLE_BQ: return "layers.%d.self_attn.q_proj.bias";
    case ROLE_BK: return "layers.%d.self_attn.k_proj.bias";
    case ROLE_BV: return "layers.%d.self_attn.v_proj.bias";
    case ROLE_Q_NORM: return "layers.%d.self_attn.q_norm.weight";
    case ROLE_K_NORM: return "layers.%d.self_attn.k_norm.weight";
    case ROLE_POST_ATTN_NORM: return "layers.%d.post_attention_layernorm.weight";
    case ROLE_FFN_NORM:
        /* Gemma normalizes before the FFN with its own weight; Llama/Qwen call that
         * same pre-FFN norm "post_attention_layernorm" */
        return arch == LM_ARCH_GEMMA3 ? "layers.%d.pre_feedforward_layernorm.weight"
                                      : "layers.%d.post_attention_layernorm.weight";
    case ROLE_GATE: return "layers.%d.mlp.gate_proj.weight";
    case ROLE_UP: return "layers.%d.mlp.up_proj.weight";
    case ROLE_DOWN: return "layers.%d.mlp.down_proj.weight";
    case ROLE_POST_FFN_NORM: return "layers.%d.post_feedforward_layernorm.weight";
    }
    return "";
}

typedef struct loader {
    lm_model_internal *m;
    const char *hf_prefix; /* "model." or "language_model.model." */
    int hf_bits, hf_group; /* MLX quantization from config.json (0: none) */
} loader;

static void format_name(char *buf, const char *fmt, int layer) {
    /* the formats are our own constants with at most one %d */
    snprintf(buf, NAME_CAP, fmt, layer);
}

static const lm_tensor *find_raw(const loader *L, const char *name) {
    if (L->m->gguf) return lm_gguf_find_tensor(L->m->gguf, name);
    return lm_st_folder_find_tensor(L->m->folder, name);
}

/* Resolves the tensor of a role, assembling MLX affine triples (weight + scales +
 * biases) into one synthetic tensor. NULL if absent. */
static lm_status find_tensor(loader *L, role r, int layer, const lm_tensor **out, char *name) {
    *out = NULL;
    char base[NAME_CAP];
    if (L->m->gguf) {
        format_name(name, gguf_name(r), layer);
        *out = lm_gguf_find_tensor(L->m->gguf, name);
        return LM_OK;
    }
    format_name(base, hf_name(r, L->m->hp.arch), layer);
    if (r == ROLE_OUTPUT)
        snprintf(name, NAME_CAP, "%s", base);
    else
        snprintf(name, NAME_CAP, "%s%s", L->hf_prefix, base);
    const lm_tensor *t = find_raw(L, name);
    if (!t || t->type != LM_DTYPE_U32) {
        *out = t;
        return LM_OK;
    }
    /* MLX affine: "x.weight" is packed uint32, with "x.scales" and "x.biases" beside it */
    char sname[NAME_CAP + 8], bname[NAME_CAP + 8];
    size_t stem = strlen(name) - strlen("weight");
    snprintf(sname, sizeof sname, "%.*sscales", (int)stem, name);
    snprintf(bname, sizeof bname, "%.*sbiases", (int)stem, name);
    const lm_tensor *sc = find_raw(L, sname), *bi = find_raw(L, bname);
    if (!sc || !bi)
        return lm_error(LM_ERR_FORMAT, "%s is packed uint32 but %s or %s is missing", name, sname, bname);
    if (L->hf_bits == 0)
        return lm_error(LM_ERR_FORMAT, "%s is quantized but config.json has no \"quantization\" entry", name);
    int bits = L->hf_bits, group = L->hf_group;
    int64_t cols = t->ne[0] * 32 / bits, rows = t->ne[1];
    if (cols % group != 0 || sc->ne[0] != cols / group || sc->ne[1] != rows || bi->ne[0] != sc->ne[0] ||
        bi->ne[1] != rows || sc->type != bi->type ||
        (sc->type != LM_DTYPE_F32 && sc->type != LM_DTYPE_F16 && sc->type != LM_DTYPE_BF16))
        return lm_error(LM_ERR_FORMAT, "%s: scales/biases do not match %d-bit groups of %d", name, bits, group);
    lm_model_internal *m = L->m;
    if (m->n_synthetic == m->cap_synthetic) return lm_error(LM_ERR_INTERNAL, "synthetic tensor table is full");
    lm_tensor *s = &m->synthetic[m->n_synthetic++];
    *s = *t;
    s->type = LM_DTYPE_AFFINE;
    s->ne[0] = cols;
    s->scales = sc;
    s->biases = bi;
    s->bits = bits;
    s->group_size = group;
    *out = s;
    return LM_OK;
}

static lm_status need_shape(const lm_tensor *t, const char *name, int64_t ne0, int64_t ne1) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return lm_error(LM_ERR_FORMAT, "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                        (long long)ne0, (long long)ne1);
    return LM_OK;
}

static lm_status bind_matrix(loader *L, role r, int layer, int64_t ne0, int64_t ne1, bool required,
                             lm_weight **out) {
    *out = NULL;
    const lm_tensor *t;
    char name[NAME_CAP];
    lm_status st = find_tensor(L, r, layer, &t, name);
    if (st) return st;
    if (!t) return required ? lm_error(LM_ERR_FORMAT, "missing tensor %s", name) : LM_OK;
    if ((st = need_shape(t, name, ne0, ne1))) return st;
    lm_backend *b = L->m->backend;
    if ((st = b->ops->weight_create(b, t, out))) return st;
    L->m->weight_bytes += t->nbytes;
    return LM_OK;
}

/* Small vectors (norm weights, biases) are converted to f32 once, in backend memory. */
static lm_status bind_vector(loader *L, role r, int layer, int64_t n, bool required, float **out) {
    *out = NULL;
    const lm_tensor *t;
    char name[NAME_CAP];
    lm_status st = find_tensor(L, r, layer, &t, name);
    if (st) return st;
    if (!t) return required ? lm_error(LM_ERR_FORMAT, "missing tensor %s", name) : LM_OK;
    if (t->ne[0] != n || lm_tensor_nelements(t) != n)
        return lm_error(LM_ERR_FORMAT, "tensor %s has %lld elements, expected %lld", name,
                        (long long)lm_tensor_nelements(t), (long long)n);
    if (t->type != LM_DTYPE_F32 && t->type != LM_DTYPE_F16 && t->type != LM_DTYPE_BF16)
        return lm_error(LM_ERR_UNSUPPORTED, "tensor %s has type %s; vectors must be F32, F16 or BF16", name,
                        lm_dtype_name(t->type));
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_dequantize_row(t->type, t->data, host, n);
    bool is_norm = r == ROLE_OUTPUT_NORM || r == ROLE_ATTN_NORM || r == ROLE_FFN_NORM || r == ROLE_Q_NORM ||
                   r == ROLE_K_NORM || r == ROLE_POST_ATTN_NORM || r == ROLE_POST_FFN_NORM;
    if (is_norm && L->m->hp.norm_add_one)
        for (int64_t i = 0; i < n; i++) host[i] += 1.0f;
    lm_backend *b = L->m->backend;
    *out = b->ops->alloc(b, (size_t)n * sizeof(float));
    if (!*out) {
        free(host);
        return lm_error(LM_ERR_NO_MEMORY, "out of backend memory");
    }
    b->ops->upload(b, *out, host, (size_t)n * sizeof(float));
    free(host);
    L->m->weight_bytes += t->nbytes;
    return LM_OK;
}

static lm_status bind_all(loader *L) {
    lm_model_internal *m = L->m;
    const lm_hparams *hp = &m->hp;
    int64_t d = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    lm_status st;
    if ((st = bind_matrix(L, ROLE_TOK_EMBD, 0, d, hp->n_vocab, true, &m->tok_embd))) return st;
    if ((st = bind_vector(L, ROLE_OUTPUT_NORM, 0, d, true, &m->output_norm))) return st;
    if ((st = bind_matrix(L, ROLE_OUTPUT, 0, d, hp->n_vocab, false, &m->output))) return st;
    if (!m->output) {
        m->output = m->tok_embd;
        m->hp.tied_embeddings = true;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    for (int il = 0; il < (int)hp->n_layer; il++) {
        lm_layer_weights *w = &m->layers[il];
        if ((st = bind_vector(L, ROLE_ATTN_NORM, il, d, true, &w->attn_norm)) ||
            (st = bind_matrix(L, ROLE_WQ, il, d, q_dim, true, &w->wq)) ||
            (st = bind_matrix(L, ROLE_WK, il, d, kv_dim, true, &w->wk)) ||
            (st = bind_matrix(L, ROLE_WV, il, d, kv_dim, true, &w->wv)) ||
            (st = bind_matrix(L, ROLE_WO, il, q_dim, d, true, &w->wo)) ||
            (st = bind_vector(L, ROLE_FFN_NORM, il, d, true, &w->ffn_norm)) ||
            (st = bind_matrix(L, ROLE_GATE, il, d, hp->n_ff, true, &w->w_gate)) ||
            (st = bind_matrix(L, ROLE_UP, il, d, hp->n_ff, true, &w->w_up)) ||
            (st = bind_matrix(L, ROLE_DOWN, il, hp->n_ff, d, true, &w->w_down)))
            return st;
        if (m->backend->ops->weight_pack) { /* the products of one input, side by side */
            lm_weight *qkv[3] = {w->wq, w->wk, w->wv}, *gate_up[2] = {w->w_gate, w->w_up};
            m->backend->ops->weight_pack(m->backend, qkv, 3);
            m->backend->ops->weight_pack(m->backend, gate_up, 2);
        }
        if (hp->has_qkv_bias &&
            ((st = bind_vector(L, ROLE_BQ, il, q_dim, true, &w->bq)) ||
             (st = bind_vector(L, ROLE_BK, il, kv_dim, true, &w->bk)) ||
             (st = bind_vector(L, ROLE_BV, il, kv_dim, true, &w->bv))))
            return st;
        if (hp->has_qk_norm && ((st = bind_vector(L, ROLE_Q_NORM, il, hp->head_dim, true, &w->q_norm)) ||
                                (st = bind_vector(L, ROLE_K_NORM, il, hp->head_dim, true, &w->k_norm))))
            return st;
        if (hp->has_post_norms &&
            ((st = bind_vector(L, ROLE_POST_ATTN_NORM, il, d, true, &w->post_attn_norm)) ||
             (st = bind_vector(L, ROLE_POST_FFN_NORM, il, d, true, &w->post_ffn_norm))))
            return st;
    }
    return LM_OK;
}

static lm_status read_text_file(const char *path, size_t limit, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return lm_error(LM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(limit + 1);
    if (!buf) {
        fclose(f);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    size_t n = fread(buf, 1, limit + 1, f);
    bool err = ferror(f);
    fclose(f);
    if (err || n > limit) {
        free(buf);
        return err ? lm_error(LM_ERR_IO, "cannot read %s", path)
                   : lm_error(LM_ERR_LIMIT, "%s is larger than %zu bytes", path, limit);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return LM_OK;
}

static lm_status open_hf_folder(const char *dir, loader *L) {
    lm_model_internal *m = L->m;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = NULL;
    size_t len = 0;
    lm_status st = read_text_file(path, 4u << 20, &json, &len);
    if (st) return st;
    st = lm_hparams_from_config_json(json, len, &m->hp);
    if (st == LM_OK) {
        cJSON *root = cJSON_ParseWithLength(json, len);
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
        if (cJSON_IsObject(q)) {
            const cJSON *bits = cJSON_GetObjectItemCaseSensitive(q, "bits");
            const cJSON *group = cJSON_GetObjectItemCaseSensitive(q, "group_size");
            if (!cJSON_IsNumber(bits) || !cJSON_IsNumber(group) ||
                (bits->valueint != 2 && bits->valueint != 3 && bits->valueint != 4 && bits->valueint != 6 &&
                 bits->valueint != 8) ||
                (group->valueint != 32 && group->valueint != 64 && group->valueint != 128))
                st = lm_error(LM_ERR_UNSUPPORTED,
                              "config.json: quantization needs bits in {2,3,4,6,8} and group_size in {32,64,128}");
            else {
                L->hf_bits = bits->valueint;
                L->hf_group = group->valueint;
            }
        }
        cJSON_Delete(root);
    }
    free(json);
    if (st) return lm_error_prefix(st, "%s", path);
    if ((st = lm_st_folder_open(dir, &m->folder))) return st;
    L->hf_prefix = "model.";
    if (!lm_st_folder_find_tensor(m->folder, "model.embed_tokens.weight") &&
        lm_st_folder_find_tensor(m->folder, "language_model.model.embed_tokens.weight"))
        L->hf_prefix = "language_model.model.";
    m->cap_synthetic = 8 + 8 * m->hp.n_layer;
    m->synthetic = calloc((size_t)m->cap_synthetic, sizeof *m->synthetic);
    if (!m->synthetic) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    return LM_OK;
}

lm_status lm_model_internal_load(const char *path, lm_backend *backend, lm_model_internal **out) {
    *out = NULL;
    if (!path || !backend) return lm_error(LM_ERR_INVALID_ARG, "model path and backend are required");
    struct stat sb;
    if (stat(path, &sb) != 0) return lm_error(LM_ERR_NOT_FOUND, "model path %s does not exist", path);
    lm_model_internal *m = calloc(1, sizeof *m);
    if (!m) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    m->backend = backend;
    m->path = strdup(path);
    loader L = {.m = m};
    lm_status st;
    if (S_ISDIR(sb.st_mode)) {
        m->format = LM_FORMAT_HF_FOLDER;
        st = open_hf_folder(path, &L);
    } else {
        m->format = LM_FORMAT_GGUF;
        st = lm_gguf_open(path, &m->gguf); /* its errors name the path already */
        if (st == LM_OK && (st = lm_hparams_from_gguf(m->gguf, &m->hp))) st = lm_error_prefix(st, "%s", path);
    }
    if (st == LM_OK && !m->path) st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
    if (st == LM_OK && (st = bind_all(&L))) st = lm_error_prefix(st, "%s", path);
    if (st == LM_OK) st = lm_forward_state_create(&m->fwd);
    if (st) {
        lm_model_internal_free(m);
        return st;
    }
    *out = m;
    return LM_OK;
}

static void free_vec(lm_backend *b, float *p) {
    if (p) b->ops->free(b, p);
}

static void free_mat(lm_backend *b, lm_weight *w) {
    if (w) b->ops->weight_free(b, w);
}

void lm_model_internal_free(lm_model_internal *m) {
    if (!m) return;
    lm_backend *b = m->backend;
    if (m->layers) {
        for (int64_t il = 0; il < m->hp.n_layer; il++) {
            lm_layer_weights *w = &m->layers[il];
            lm_weight *mats[] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
            float *vecs[] = {w->attn_norm, w->ffn_norm, w->post_attn_norm, w->post_ffn_norm,
                             w->q_norm,    w->k_norm,   w->bq,             w->bk,
                             w->bv};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_mat(b, mats[i]);
            for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) free_vec(b, vecs[i]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd) free_mat(b, m->output);
    free_mat(b, m->tok_embd);
    free_vec(b, m->output_norm);
    lm_forward_state_free(b, m->fwd);
    free(m->synthetic);
    lm_gguf_close(m->gguf);
    lm_st_folder_close(m->folder);
    free(m->path);
    free(m);
}
