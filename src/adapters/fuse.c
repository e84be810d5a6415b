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
#include "model/hf_layout.h"
#include "model/hparams.h"
#include "tensor/quant.h"

enum { NAME_CAP = 192, PATH_CAP = 4096 };

lm_fuse_params lm_fuse_default_params(void) {
    lm_fuse_params p = {0};
    p.out_dtype = -1;
    return p;
}

/* HF projection names inside a layer (GGUF names map to these through
 * model/hf_layout.h, which also knows the Q/K row order and Gemma's norm offset). */
static const char *const k_hf_module_names[LM_LORA_N_MODULES] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

/* ---- the plan -------------------------------------------------------------------- */

typedef struct plan_item {
    char name[NAME_CAP];
    const lm_tensor *src;
    lm_dtype out_type;
    lm_hf_xform xf;
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

static lm_status plan_add(fuser *F, const char *name, const lm_tensor *t, lm_hf_xform xf, int layer, int module,
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

static lm_status plan_gguf(fuser *F) {
    int64_t n = lm_gguf_n_tensors(F->gguf);
    F->items = calloc((size_t)(n ? n : 1), sizeof *F->items);
    if (!F->items) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_dtype out_type = gguf_out_type(F);
    for (int64_t i = 0; i < n; i++) {
        const lm_tensor *t = lm_gguf_tensor(F->gguf, i);
        char hf[NAME_CAP];
        lm_hf_xform xf;
        int layer, module;
        lm_status st = lm_hf_tensor_name(&F->hp, t->name, hf, sizeof hf, &xf, &layer);
        if (st) return st;
        hf_module_of(hf, &layer, &module);
        const lm_dtype_info *info = lm_dtype_get_info(t->type);
        if (!info || !(info->quantized || t->type == LM_DTYPE_F32 || t->type == LM_DTYPE_F16 ||
                       t->type == LM_DTYPE_BF16) || lm_dtype_row_bytes(t->type, t->ne[0]) == 0)
            return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has type %s, which Lumen cannot dequantize", t->name,
                            lm_dtype_name(t->type));
        st = plan_add(F, hf, t, xf, layer, module, out_type);
        if (st) return st;
    }
    return LM_OK;
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
        lm_status st = plan_add(F, t->name, t, LM_HF_AS_IS, layer, module, out_type);
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

/* *out: the tensor's bytes in its output type; *owned tells whether to free them. */
static lm_status produce(fuser *F, const plan_item *it, const void **out, bool *owned) {
    const lm_tensor *t = it->src;
    F->res->base_tensors_read++;
    if (it->xf == LM_HF_AS_IS && !it->lora && t->type == it->out_type) {
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
    lm_status st = lm_hf_apply_xform(&F->hp, it->xf, w, it->rows, it->cols);
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

static lm_status write_gguf_config(const fuser *F, const char *dir) {
    lm_hf_config_info info = {.tied = lm_gguf_find_tensor(F->gguf, "output.weight") == NULL,
                              .dtype = F->n_items ? F->items[0].out_type : LM_DTYPE_BF16,
                              .bos_id = -1, .eos_id = -1, .pad_id = -1};
    uint32_t tok;
    if (lm_gguf_get_u32(F->gguf, "tokenizer.ggml.bos_token_id", &tok) == LM_OK && tok <= INT32_MAX)
        info.bos_id = (int32_t)tok;
    if (lm_gguf_get_u32(F->gguf, "tokenizer.ggml.eos_token_id", &tok) == LM_OK && tok <= INT32_MAX)
        info.eos_id = (int32_t)tok;
    char *text = NULL;
    lm_status st = lm_hf_config_json(&F->hp, &info, &text);
    if (st) return st;
    char path[2 * PATH_CAP];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = write_text(path, text);
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
    cJSON_AddNumberToObject(c, "scale", lm_hf_short_float(F->lora->scale));
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
