/* GGUF -> Hugging Face folder (contract in hf_export.h): plan every output tensor,
 * write the JSON files and the safetensors shards into a temporary folder beside
 * OUT_DIR, then rename it into place. */
#include "export/hf_export.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/hf_layout.h"
#include "model/hparams.h"
#include "tensor/quant.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_export.h"

enum { NAME_CAP = 192, PATH_CAP = 4096, DIR_CAP = 2 * PATH_CAP + 64, FILE_CAP = DIR_CAP + 128 };
#define BLOCK_FLOATS ((int64_t)1 << 20) /* rows converted at a time: about 4 MiB of f32 */
#define DEFAULT_SHARD ((uint64_t)4 << 30)

lm_hf_export_params lm_hf_export_default_params(void) {
    lm_hf_export_params p = {0};
    p.out_dtype = LM_DTYPE_BF16;
    return p;
}

typedef struct item {
    char name[NAME_CAP];
    const lm_tensor *src;
    lm_hf_xform xf;
    int n_dims;
    int64_t shape[4]; /* outermost first, as safetensors writes it */
    int64_t rows, cols;
    uint64_t bytes;
    int shard;
} item;

typedef struct exporter {
    const lm_hf_export_params *p;
    lm_hf_export_result *res;
    lm_gguf *g;
    lm_hparams hp;
    lm_tokenizer *tok;
    lm_dtype out_type;
    item *items;
    int64_t n_items;
    int n_shards;
    uint64_t total, done;
    float *block;    /* [BLOCK_FLOATS or one unit of rows] */
    uint8_t *packed; /* the block in the output type */
    size_t block_cap;
} exporter;

/* ---- small file helpers ------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static lm_status mkdir_one(const char *dir) {
    struct stat sb;
    if (mkdir(dir, 0755) == 0) return LM_OK;
    int err = errno;
    if (err == EEXIST && stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) err = ENOTDIR;
    else if (err == EEXIST) return LM_OK;
    return lm_error(LM_ERR_IO, "cannot create folder %s: %s", dir, strerror(err));
}

static lm_status mkdir_p(const char *path) {
    char buf[PATH_CAP];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return lm_error(LM_ERR_LIMIT, "path %s is too long", path);
    for (char *q = buf + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        lm_status st = mkdir_one(buf);
        if (st) return st;
        *q = '/';
    }
    return mkdir_one(buf);
}

static lm_status sync_close(FILE *f, const char *path) {
    int err = 0;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    return err ? lm_error(LM_ERR_IO, "cannot write %s: %s", path, strerror(err)) : LM_OK;
}

static lm_status write_file(const char *dir, const char *name, const char *text, size_t len) {
    char path[FILE_CAP];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return lm_error(LM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    if (fwrite(text, 1, len, f) != len) {
        int err = errno;
        fclose(f);
        return lm_error(LM_ERR_IO, "cannot write %s: %s", path, strerror(err));
    }
    return sync_close(f, path);
}

static lm_status write_json(const char *dir, const char *name, cJSON *j) {
    char *s = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!s) return lm_error(LM_ERR_NO_MEMORY, "out of memory writing %s", name);
    lm_status st = write_file(dir, name, s, strlen(s));
    free(s);
    return st;
}

/* ---- the plan ------------------------------------------------------------------------- */

static bool dequantizable(lm_dtype t, int64_t ne0) {
    const lm_dtype_info *info = lm_dtype_get_info((int)t);
    return info && (info->quantized || t == LM_DTYPE_F32 || t == LM_DTYPE_F16 || t == LM_DTYPE_BF16) &&
           lm_dtype_row_bytes(t, ne0) != 0;
}

static lm_status plan(exporter *X) {
    int64_t n = lm_gguf_n_tensors(X->g);
    X->items = calloc((size_t)(n ? n : 1), sizeof *X->items);
    if (!X->items) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    size_t esize = lm_dtype_get_info((int)X->out_type)->block_bytes;
    int64_t max_cols = 1;
    for (int64_t i = 0; i < n; i++) {
        const lm_tensor *t = lm_gguf_tensor(X->g, i);
        item *it = &X->items[X->n_items++];
        int layer;
        lm_status st = lm_hf_tensor_name(&X->hp, t->name, it->name, sizeof it->name, &it->xf, &layer);
        if (st) return st;
        if (!dequantizable(t->type, t->ne[0]))
            return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has type %s, which Lumen cannot dequantize", t->name,
                            lm_dtype_name(t->type));
        if (t->n_dims < 1 || t->n_dims > 2)
            return lm_error(LM_ERR_UNSUPPORTED, "GGUF tensor %s has %d dimensions (expected 1 or 2)", t->name,
                            t->n_dims);
        it->src = t;
        it->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims; d++) it->shape[d] = t->ne[t->n_dims - 1 - d];
        it->cols = t->ne[0];
        it->rows = it->cols ? lm_tensor_nelements(t) / it->cols : 0;
        it->bytes = (uint64_t)lm_tensor_nelements(t) * esize;
        int64_t unit = lm_hf_xform_rows(&X->hp, it->xf);
        if (unit <= 0 || it->rows % unit != 0)
            return lm_error(LM_ERR_FORMAT, "GGUF tensor %s has %lld rows, not whole heads of %lld", t->name,
                            (long long)it->rows, (long long)unit);
        if (it->cols * unit > max_cols) max_cols = it->cols * unit;
        if (it->cols > max_cols) max_cols = it->cols;
    }
    uint64_t limit = X->p->shard_bytes ? X->p->shard_bytes : DEFAULT_SHARD, cur = 0;
    int shard = 0;
    for (int64_t i = 0; i < X->n_items; i++) {
        item *it = &X->items[i];
        if (cur > 0 && cur + it->bytes > limit) shard++, cur = 0;
        it->shard = shard;
        cur += it->bytes;
        X->total += it->bytes;
    }
    X->n_shards = shard + 1;
    X->block_cap = (size_t)(max_cols > BLOCK_FLOATS ? max_cols : BLOCK_FLOATS);
    X->block = malloc(X->block_cap * sizeof(float));
    X->packed = malloc(X->block_cap * esize);
    if (!X->block || !X->packed) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    return LM_OK;
}

/* ---- safetensors, streamed ------------------------------------------------------------- */

static const char *st_dtype(lm_dtype t) {
    return t == LM_DTYPE_F32 ? "F32" : t == LM_DTYPE_F16 ? "F16" : "BF16";
}

static void shard_name(const exporter *X, int shard, char *buf, size_t cap) {
    if (X->n_shards == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", shard + 1, X->n_shards);
}

/* One tensor's data, a block of whole transform units of rows at a time. */
static lm_status stream_tensor(exporter *X, const item *it, FILE *f, const char *path) {
    const lm_tensor *t = it->src;
    int64_t unit = lm_hf_xform_rows(&X->hp, it->xf);
    int64_t per_block = (int64_t)X->block_cap / (it->cols ? it->cols : 1) / unit * unit;
    if (per_block < unit) per_block = unit;
    size_t row_bytes = lm_dtype_row_bytes(t->type, it->cols);
    size_t esize = lm_dtype_get_info((int)X->out_type)->block_bytes;
    for (int64_t r0 = 0; r0 < it->rows; r0 += per_block) {
        int64_t nb = it->rows - r0 < per_block ? it->rows - r0 : per_block;
        for (int64_t r = 0; r < nb; r++)
            if (!lm_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)(r0 + r) * row_bytes,
                                   X->block + r * it->cols, it->cols))
                return lm_error(LM_ERR_UNSUPPORTED, "cannot dequantize %s (%s)", t->name, lm_dtype_name(t->type));
        lm_status st = lm_hf_apply_xform(&X->hp, it->xf, X->block, nb, it->cols);
        if (st) return lm_error_prefix(st, "%s", t->name);
        int64_t n = nb * it->cols;
        lm_quantize_row(X->out_type, X->block, X->packed, n);
        if (fwrite(X->packed, esize, (size_t)n, f) != (size_t)n)
            return lm_error(LM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        X->done += (uint64_t)n * esize;
        if (X->p->progress && !X->p->progress(X->p->progress_user, X->done, X->total))
            return lm_error(LM_ERR_INVALID_ARG, "conversion cancelled");
    }
    return LM_OK;
}

static lm_status write_shard(exporter *X, int shard, const char *dir) {
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int64_t i = 0; i < X->n_items; i++) {
        const item *it = &X->items[i];
        if (it->shard != shard) continue;
        cJSON *e = cJSON_AddObjectToObject(h, it->name);
        cJSON_AddStringToObject(e, "dtype", st_dtype(X->out_type));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < it->n_dims; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)it->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + it->bytes)));
        off += it->bytes;
    }
    char *hdr = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!hdr) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    /* the data section starts at a multiple of 8, the header padded with spaces */
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    char name[64], path[FILE_CAP];
    shard_name(X, shard, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return lm_error(LM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    lm_status st = ok ? LM_OK : lm_error(LM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    for (int64_t i = 0; i < X->n_items && !st; i++)
        if (X->items[i].shard == shard) st = stream_tensor(X, &X->items[i], f, path);
    if (st) {
        fclose(f);
        return st;
    }
    return sync_close(f, path);
}

static lm_status write_weights(exporter *X, const char *dir) {
    for (int s = 0; s < X->n_shards; s++) {
        lm_status st = write_shard(X, s, dir);
        if (st) return st;
    }
    if (X->n_shards == 1) return LM_OK;
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)X->total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int64_t i = 0; i < X->n_items; i++) {
        char name[64];
        shard_name(X, X->items[i].shard, name, sizeof name);
        cJSON_AddStringToObject(map, X->items[i].name, name);
    }
    return write_json(dir, "model.safetensors.index.json", root);
}

/* ---- JSON files ------------------------------------------------------------------------- */

static lm_status write_configs(exporter *X, const char *dir) {
    lm_hf_config_info info = {.tied = X->res->tied_embeddings, .dtype = X->out_type,
                              .bos_id = -1, .eos_id = -1, .pad_id = -1};
    if (X->tok) {
        info.bos_id = lm_tokenizer_bos(X->tok);
        info.eos_id = lm_tokenizer_eos(X->tok);
        info.pad_id = lm_tokenizer_pad(X->tok);
    }
    char *text = NULL;
    lm_status st = lm_hf_config_json(&X->hp, &info, &text);
    if (st) return st;
    st = write_file(dir, "config.json", text, strlen(text));
    free(text);
    if (st) return st;

    /* generation_config.json: what ends a generation */
    cJSON *gen = cJSON_CreateObject();
    if (info.bos_id >= 0) cJSON_AddNumberToObject(gen, "bos_token_id", info.bos_id);
    if (X->tok) {
        int32_t eog[64];
        size_t n = lm_tokenizer_eog_ids(X->tok, eog, 64);
        if (n > 64) n = 64;
        if (n == 1) cJSON_AddNumberToObject(gen, "eos_token_id", eog[0]);
        if (n > 1) cJSON_AddItemToObject(gen, "eos_token_id", cJSON_CreateIntArray(eog, (int)n));
    }
    if (info.pad_id >= 0) cJSON_AddNumberToObject(gen, "pad_token_id", info.pad_id);
    return write_json(dir, "generation_config.json", gen);
}

static lm_status write_tokenizer(exporter *X, const char *dir) {
    if (!X->tok) return LM_OK;
    const char *tmpl = NULL;
    size_t tl = 0;
    char *chat = NULL;
    if (lm_gguf_get_str(X->g, "tokenizer.chat_template", &tmpl, &tl) == LM_OK && tl > 0) {
        if (memchr(tmpl, 0, tl)) return lm_error(LM_ERR_FORMAT, "tokenizer.chat_template holds a NUL byte");
        if (!(chat = malloc(tl + 1))) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
        memcpy(chat, tmpl, tl);
        chat[tl] = '\0';
    }
    char *tj = NULL, *tc = NULL;
    size_t tj_len = 0;
    lm_hf_tokenizer_stats ts;
    lm_status st = lm_tokenizer_export_hf(X->tok, chat, X->hp.n_ctx_train, &tj, &tj_len, &tc, &ts);
    free(chat);
    if (!st) st = write_file(dir, "tokenizer.json", tj, tj_len);
    if (!st) st = write_file(dir, "tokenizer_config.json", tc, strlen(tc));
    free(tj);
    free(tc);
    if (st) return st;
    X->res->has_chat_template = tl > 0;
    X->res->n_vocab = ts.n_vocab;
    X->res->n_added_tokens = ts.n_added;
    X->res->n_merges = ts.n_merges;
    return LM_OK;
}

/* ---- OUT_DIR ------------------------------------------------------------------------------ */

static bool dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = false;
    closedir(d);
    return empty;
}

/* May `out` be written (replaced with force)? Never when the input lies inside it. */
static lm_status check_out_dir(const char *in, const char *out, bool force, bool *exists) {
    struct stat sb;
    *exists = stat(out, &sb) == 0;
    if (!*exists) return LM_OK;
    if (!S_ISDIR(sb.st_mode)) return lm_error(LM_ERR_INVALID_ARG, "%s exists and is not a folder", out);
    if (dir_is_empty(out)) return LM_OK;
    if (!force)
        return lm_error(LM_ERR_INVALID_ARG, "%s exists and is not empty (use --force to replace it)", out);
    char rin[PATH_MAX], rout[PATH_MAX];
    if (realpath(in, rin) && realpath(out, rout)) {
        size_t n = strlen(rout);
        if (strcmp(rout, "/") == 0 || (strncmp(rin, rout, n) == 0 && rin[n] == '/'))
            return lm_error(LM_ERR_INVALID_ARG, "%s holds the input model %s; it cannot be replaced", out, in);
    }
    return LM_OK;
}

/* Moves the finished folder `tmp` to `out`, replacing what is there. */
static lm_status install(const char *tmp, const char *out, const char *parent, const char *base, bool exists) {
    if (!exists || dir_is_empty(out)) {
        if (rename(tmp, out) != 0)
            return lm_error(LM_ERR_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
        return LM_OK;
    }
    char old[DIR_CAP];
    snprintf(old, sizeof old, "%s/.%s.lumen-old-XXXXXX", parent, base);
    if (!mkdtemp(old)) return lm_error(LM_ERR_IO, "cannot create a folder in %s: %s", parent, strerror(errno));
    if (rename(out, old) != 0) { /* onto the empty folder mkdtemp made */
        int err = errno;
        rmdir(old);
        return lm_error(LM_ERR_IO, "cannot move %s aside: %s", out, strerror(err));
    }
    if (rename(tmp, out) != 0) {
        int err = errno;
        rename(old, out);
        return lm_error(LM_ERR_IO, "cannot rename %s to %s: %s", tmp, out, strerror(err));
    }
    rm_tree(old);
    return LM_OK;
}

static void exporter_free(exporter *X) {
    lm_tokenizer_free(X->tok);
    lm_gguf_close(X->g);
    free(X->items);
    free(X->block);
    free(X->packed);
}

lm_status lm_hf_export(const char *gguf_path, const char *out_dir, const lm_hf_export_params *params,
                       lm_hf_export_result *result) {
    lm_hf_export_params defaults = lm_hf_export_default_params();
    lm_hf_export_result local;
    if (!params) params = &defaults;
    if (!result) result = &local;
    memset(result, 0, sizeof *result);
    if (!gguf_path || !out_dir || !*out_dir) return lm_error(LM_ERR_INVALID_ARG, "convert needs a model and OUT_DIR");
    if (params->out_dtype != LM_DTYPE_BF16 && params->out_dtype != LM_DTYPE_F16 && params->out_dtype != LM_DTYPE_F32)
        return lm_error(LM_ERR_INVALID_ARG, "the output dtype must be bf16, f16 or f32");

    /* OUT_DIR without trailing slashes, its parent and its name */
    char out[PATH_CAP], parent[PATH_CAP], base[PATH_CAP];
    if ((size_t)snprintf(out, sizeof out, "%s", out_dir) >= sizeof out - 64)
        return lm_error(LM_ERR_LIMIT, "OUT_DIR %s is too long", out_dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = '\0';
    const char *slash = strrchr(out, '/');
    if (slash) {
        snprintf(parent, sizeof parent, "%.*s", slash == out ? 1 : (int)(slash - out), out);
        snprintf(base, sizeof base, "%s", slash + 1);
    } else {
        snprintf(parent, sizeof parent, ".");
        snprintf(base, sizeof base, "%s", out);
    }
    if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return lm_error(LM_ERR_INVALID_ARG, "OUT_DIR %s must name a folder (not . or ..)", out_dir);
    struct stat in_sb;
    if (stat(gguf_path, &in_sb) == 0 && S_ISDIR(in_sb.st_mode))
        return lm_error(LM_ERR_INVALID_ARG, "%s is a folder; convert reads a GGUF file", gguf_path);
    bool exists;
    lm_status st = check_out_dir(gguf_path, out, params->force, &exists);
    if (st) return st;

    exporter X = {.p = params, .res = result, .out_type = (lm_dtype)params->out_dtype};
    if ((st = lm_gguf_open(gguf_path, &X.g))) return st;
    const char *arch;
    size_t arch_len;
    if (lm_gguf_get_str(X.g, "general.architecture", &arch, &arch_len) == LM_OK)
        snprintf(result->gguf_arch, sizeof result->gguf_arch, "%.*s", (int)arch_len, arch);
    if ((st = lm_hparams_from_gguf(X.g, &X.hp))) {
        lm_error_prefix(st, "%s", gguf_path);
        exporter_free(&X);
        return st;
    }
    result->tied_embeddings = lm_gguf_find_tensor(X.g, "output.weight") == NULL;
    snprintf(result->architecture, sizeof result->architecture, "%s",
             X.hp.arch == LM_ARCH_GEMMA3 ? "Gemma3ForCausalLM"
             : X.hp.arch == LM_ARCH_QWEN2 ? "Qwen2ForCausalLM"
                                          : "LlamaForCausalLM");
    st = lm_tokenizer_from_gguf(X.g, &X.tok);
    if (st == LM_ERR_NOT_FOUND) st = LM_OK; /* weights only: no tokenizer files */
    result->has_tokenizer = X.tok != NULL;
    if (!st) st = plan(&X);
    if (st) {
        lm_error_prefix(st, "%s", gguf_path);
        exporter_free(&X);
        return st;
    }
    result->n_tensors = X.n_items;
    result->n_shards = X.n_shards;
    result->weight_bytes = X.total;

    if ((st = mkdir_p(parent))) {
        exporter_free(&X);
        return st;
    }
    char tmp[DIR_CAP];
    snprintf(tmp, sizeof tmp, "%s/.%s.lumen-tmp-XXXXXX", parent, base);
    if (!mkdtemp(tmp)) {
        st = lm_error(LM_ERR_IO, "cannot create a folder in %s: %s", parent, strerror(errno));
        exporter_free(&X);
        return st;
    }
    chmod(tmp, 0755); /* mkdtemp made it private; a model folder is an ordinary folder */
    st = write_configs(&X, tmp);
    if (!st) st = write_tokenizer(&X, tmp);
    if (!st) st = write_weights(&X, tmp);
    if (!st) st = install(tmp, out, parent, base, exists);
    if (st) rm_tree(tmp);
    exporter_free(&X);
    return st;
}
