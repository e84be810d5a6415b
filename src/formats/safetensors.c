/* safetensors reader/writer and sharded model folders, written from the format
 * description (u64 header length, JSON header, raw little-endian data). */
#include "formats/safetensors.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/name_index.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(SIZE_MAX >= UINT64_MAX, "lumen needs a 64-bit size_t");

#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: larger JSON numbers are inexact */
#define LM_ST_MAX_INDEX (64u * 1024u * 1024u)

static const struct st_dtype {
    const char *name;
    lm_dtype type;
    size_t size;
} st_dtypes[] = {
    {"F64", LM_DTYPE_F64, 8}, {"F32", LM_DTYPE_F32, 4}, {"F16", LM_DTYPE_F16, 2},  {"BF16", LM_DTYPE_BF16, 2},
    {"I64", LM_DTYPE_I64, 8}, {"I32", LM_DTYPE_I32, 4}, {"I16", LM_DTYPE_I16, 2},  {"I8", LM_DTYPE_I8, 1},
    {"U64", LM_DTYPE_U64, 8}, {"U32", LM_DTYPE_U32, 4}, {"U16", LM_DTYPE_U16, 2},  {"U8", LM_DTYPE_U8, 1},
    {"BOOL", LM_DTYPE_BOOL, 1},
};
enum { N_ST_DTYPES = sizeof st_dtypes / sizeof st_dtypes[0] };

static const struct st_dtype *dtype_by_name(const char *name) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (!strcmp(st_dtypes[i].name, name)) return &st_dtypes[i];
    return NULL;
}

static const struct st_dtype *dtype_by_type(lm_dtype type) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].type == type) return &st_dtypes[i];
    return NULL;
}

static bool mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

static uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A JSON number that is a non-negative integer represented exactly. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= MAX_EXACT_INT) || floor(d) != d) return false;
    *out = (uint64_t)d;
    return true;
}

/* ---- reader --------------------------------------------------------------------- */

struct lm_safetensors {
    lm_mapped_file map;
    char *file;
    const uint8_t *base;
    size_t size;
    lm_tensor *tensors;
    int64_t n_tensors;
    lm_name_index names;
    char **meta; /* key, value, key, value, ... */
    int64_t n_meta;
    lm_name_index meta_ix;
};

void lm_safetensors_close(lm_safetensors *st) {
    if (!st) return;
    free(st->tensors);
    lm_name_index_free(&st->names);
    for (int64_t i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->meta);
    lm_name_index_free(&st->meta_ix);
    lm_mapped_file_close(&st->map);
    free(st->file);
    free(st);
}

typedef struct entry {
    const char *name; /* inside the cJSON tree */
    lm_dtype type;
    int n_dims;
    int64_t ne[LM_MAX_DIMS];
    uint64_t begin, end;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static lm_status parse_metadata(lm_safetensors *st, const cJSON *meta) {
    if (!cJSON_IsObject(meta))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: __metadata__ is not a JSON object", st->file);
    int n = cJSON_GetArraySize(meta);
    if (n == 0) return LM_OK;
    if (!(st->meta = calloc((size_t)n * 2, sizeof *st->meta)))
        return lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory", st->file);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv))
            return lm_error(LM_ERR_FORMAT, "safetensors: %s: __metadata__ value of '%.200s' is not a string",
                            st->file, kv->string);
        int r = lm_name_index_add(&st->meta_ix, kv->string, strlen(kv->string), st->n_meta, NULL);
        if (r == LM_NAME_DUPLICATE)
            return lm_error(LM_ERR_FORMAT, "safetensors: %s: duplicate __metadata__ key '%.200s'", st->file,
                            kv->string);
        if (r != LM_NAME_ADDED) return lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory", st->file);
        char *k = strdup(kv->string), *v = strdup(kv->valuestring);
        st->meta[2 * st->n_meta] = k;
        st->meta[2 * st->n_meta + 1] = v;
        st->n_meta++;
        if (!k || !v) return lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory", st->file);
    }
    return LM_OK;
}

static lm_status parse_entry(lm_safetensors *st, const cJSON *j, uint64_t data_size, entry *e) {
    const char *name = j->string;
    e->name = name;
    if (!name[0]) return lm_error(LM_ERR_FORMAT, "safetensors: %s: a tensor has an empty name", st->file);
    if (!cJSON_IsObject(j))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' is not a JSON object", st->file, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' has no \"dtype\" string", st->file, name);
    const struct st_dtype *d = dtype_by_name(dt->valuestring);
    if (!d)
        return lm_error(LM_ERR_UNSUPPORTED, "safetensors: %s: tensor '%.200s' has unsupported dtype '%.32s'",
                        st->file, name, dt->valuestring);
    e->type = d->type;
    if (!cJSON_IsArray(shape))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' has no \"shape\" array", st->file, name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > LM_MAX_DIMS)
        return lm_error(LM_ERR_UNSUPPORTED, "safetensors: %s: tensor '%.200s' has %d dimensions (at most %d are supported)",
                        st->file, name, rank, LM_MAX_DIMS);
    e->n_dims = rank;
    for (int k = 0; k < LM_MAX_DIMS; k++) e->ne[k] = 1;
    uint64_t nelem = 1;
    int k = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (!json_uint(dim, &v))
            return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': shape[%d] is not a non-negative integer",
                            st->file, name, k);
        if (!mul_u64(nelem, v, &nelem) || nelem > (uint64_t)INT64_MAX)
            return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': the element count overflows",
                            st->file, name);
        e->ne[rank - 1 - k] = (int64_t)v; /* innermost first */
        k++;
    }
    uint64_t nbytes;
    if (!mul_u64(nelem, d->size, &nbytes))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': the byte size overflows", st->file, name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(cJSON_GetArrayItem(offs, 0), &e->begin) ||
        !json_uint(cJSON_GetArrayItem(offs, 1), &e->end))
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': data_offsets is not [begin, end] of two non-negative integers",
                        st->file, name);
    if (e->begin > e->end || e->end > data_size)
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': data_offsets [%llu, %llu) lie outside the %llu-byte data section",
                        st->file, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)data_size);
    if (e->end - e->begin != nbytes)
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s': data_offsets [%llu, %llu) span %llu bytes but %s of this shape needs %llu",
                        st->file, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)(e->end - e->begin), d->name, (unsigned long long)nbytes);
    return LM_OK;
}

static lm_status st_parse(lm_safetensors *st) {
    if (st->size < 8)
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: file of %zu bytes is too short for the 8-byte header length",
                        st->file, st->size);
    uint64_t hlen = ld64(st->base);
    if (hlen > LM_ST_MAX_HEADER)
        return lm_error(LM_ERR_LIMIT, "safetensors: %s: header length %llu exceeds the limit of %u bytes", st->file,
                        (unsigned long long)hlen, LM_ST_MAX_HEADER);
    if (hlen > st->size - 8)
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: header length %llu runs past the end of the %zu-byte file",
                        st->file, (unsigned long long)hlen, st->size);
    const char *hdr = (const char *)st->base + 8;
    if (hlen < 2 || hdr[0] != '{')
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: the header at offset 8 does not start with a JSON object",
                        st->file);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at && at >= hdr && at <= hdr + hlen) ? (size_t)(at - hdr) + 8 : 8;
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: the header is not valid JSON (error near offset %zu)",
                        st->file, off);
    }
    lm_status status = LM_OK;
    entry *entries = NULL;
    for (const char *p = end; p && p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            status = lm_error(LM_ERR_FORMAT, "safetensors: %s: offset %zu: unexpected bytes after the JSON header",
                              st->file, (size_t)(p - hdr) + 8);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        status = lm_error(LM_ERR_FORMAT, "safetensors: %s: the header is not a JSON object", st->file);
        goto done;
    }
    uint64_t data_size = st->size - 8 - hlen;
    int n = cJSON_GetArraySize(root);
    if (n && !(entries = calloc((size_t)n, sizeof *entries))) {
        status = lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory for %d tensors", st->file, n);
        goto done;
    }
    int64_t ne = 0;
    bool seen_meta = false;
    const cJSON *j;
    cJSON_ArrayForEach(j, root) {
        if (!strcmp(j->string, "__metadata__")) {
            if (seen_meta) {
                status = lm_error(LM_ERR_FORMAT, "safetensors: %s: __metadata__ appears twice", st->file);
                goto done;
            }
            seen_meta = true;
            if ((status = parse_metadata(st, j))) goto done;
            continue;
        }
        if ((status = parse_entry(st, j, data_size, &entries[ne]))) goto done;
        ne++;
    }
    if (ne > 1) qsort(entries, (size_t)ne, sizeof *entries, cmp_entry);
    if (ne && !(st->tensors = calloc((size_t)ne, sizeof *st->tensors))) {
        status = lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory for %lld tensors", st->file, (long long)ne);
        goto done;
    }
    const uint8_t *data = st->base + 8 + hlen;
    uint64_t prev_end = 0;
    const char *prev_name = NULL;
    for (int64_t i = 0; i < ne; i++) {
        const entry *e = &entries[i];
        lm_tensor *t = &st->tensors[i];
        int r = lm_name_index_add(&st->names, e->name, strlen(e->name), i, &t->name);
        if (r == LM_NAME_NO_MEMORY) {
            status = lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory", st->file);
            goto done;
        }
        if (r == LM_NAME_DUPLICATE) {
            status = lm_error(LM_ERR_FORMAT, "safetensors: %s: duplicate tensor name '%.200s'", st->file, e->name);
            goto done;
        }
        st->n_tensors = i + 1;
        if (e->end > e->begin) {
            if (prev_name && e->begin < prev_end) {
                status = lm_error(LM_ERR_FORMAT, "safetensors: %s: tensors '%.200s' and '%.200s' overlap (bytes %llu..%llu)",
                                  st->file, prev_name, e->name, (unsigned long long)e->begin,
                                  (unsigned long long)prev_end);
                goto done;
            }
            prev_end = e->end;
            prev_name = t->name;
        }
        t->type = e->type;
        t->n_dims = e->n_dims;
        memcpy(t->ne, e->ne, sizeof t->ne);
        t->data = data + e->begin;
        t->nbytes = (size_t)(e->end - e->begin);
    }
done:
    free(entries);
    cJSON_Delete(root);
    return status;
}

static lm_status st_new(const char *file, lm_safetensors **out) {
    lm_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->file = strdup(file))) {
        free(st);
        return lm_error(LM_ERR_NO_MEMORY, "safetensors: %s: out of memory", file);
    }
    *out = st;
    return LM_OK;
}

lm_status lm_safetensors_open_memory(const void *data, size_t size, lm_safetensors **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "safetensors: NULL output handle");
    *out = NULL;
    if (!data && size) return lm_error(LM_ERR_INVALID_ARG, "safetensors: NULL buffer of %zu bytes", size);
    lm_safetensors *st;
    lm_status s = st_new("<memory>", &st);
    if (s) return s;
    st->base = data;
    st->size = size;
    if ((s = st_parse(st))) {
        lm_safetensors_close(st);
        return s;
    }
    *out = st;
    return LM_OK;
}

lm_status lm_safetensors_open(const char *path, lm_safetensors **out) {
    if (!out || !path) return lm_error(LM_ERR_INVALID_ARG, "safetensors: NULL path or output handle");
    *out = NULL;
    lm_safetensors *st;
    lm_status s = st_new(path, &st);
    if (s) return s;
    if ((s = lm_mapped_file_open(path, &st->map))) {
        lm_safetensors_close(st);
        return lm_error_prefix(s, "safetensors");
    }
    st->base = st->map.data;
    st->size = st->map.size;
    if ((s = st_parse(st))) {
        lm_safetensors_close(st);
        return s;
    }
    *out = st;
    return LM_OK;
}

int64_t lm_safetensors_n_tensors(const lm_safetensors *st) { return st->n_tensors; }

const lm_tensor *lm_safetensors_tensor(const lm_safetensors *st, int64_t i) {
    return (i >= 0 && i < st->n_tensors) ? &st->tensors[i] : NULL;
}

const lm_tensor *lm_safetensors_find_tensor(const lm_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int64_t i = lm_name_index_find(&st->names, name, strlen(name));
    return i < 0 ? NULL : &st->tensors[i];
}

const char *lm_safetensors_metadata(const lm_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    int64_t i = lm_name_index_find(&st->meta_ix, key, strlen(key));
    return i < 0 ? NULL : st->meta[2 * i + 1];
}

int64_t lm_safetensors_n_metadata(const lm_safetensors *st) { return st->n_meta; }

const char *lm_safetensors_metadata_key(const lm_safetensors *st, int64_t i) {
    return (i >= 0 && i < st->n_meta) ? st->meta[2 * i] : NULL;
}

const char *lm_safetensors_metadata_value(const lm_safetensors *st, int64_t i) {
    return (i >= 0 && i < st->n_meta) ? st->meta[2 * i + 1] : NULL;
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct wtensor {
    const char *name; /* interned */
    const struct st_dtype *dt;
    int n_dims;
    int64_t shape[LM_MAX_DIMS]; /* outermost first */
    const void *data;           /* borrowed */
    size_t nbytes;
} wtensor;

struct lm_safetensors_writer {
    wtensor *tensors;
    size_t n, cap;
    lm_name_index names;
    char **meta; /* key, value pairs */
    size_t n_meta, cap_meta;
};

lm_safetensors_writer *lm_safetensors_writer_create(void) { return calloc(1, sizeof(lm_safetensors_writer)); }

void lm_safetensors_writer_free(lm_safetensors_writer *w) {
    if (!w) return;
    free(w->tensors);
    lm_name_index_free(&w->names);
    for (size_t i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    free(w);
}

lm_status lm_safetensors_writer_set_metadata(lm_safetensors_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: NULL writer, key or value");
    char *v = strdup(value);
    if (!v) return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta[2 * i], key)) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return LM_OK;
        }
    char *k = strdup(key);
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? w->cap_meta * 2 : 8;
        char **m = k ? realloc(w->meta, cap * 2 * sizeof *m) : NULL;
        if (!m) {
            free(k);
            free(v);
            return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
        }
        w->meta = m;
        w->cap_meta = cap;
    }
    if (!k) {
        free(v);
        return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
    }
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return LM_OK;
}

lm_status lm_safetensors_writer_add(lm_safetensors_writer *w, const char *name, lm_dtype type, int n_dims,
                                    const int64_t *shape, const void *data) {
    if (!w || !name || !name[0]) return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: NULL writer or empty name");
    if (!strcmp(name, "__metadata__"))
        return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: '__metadata__' cannot name a tensor");
    const struct st_dtype *dt = dtype_by_type(type);
    if (!dt)
        return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: tensor '%s': type %s cannot be stored in safetensors",
                        name, lm_dtype_name(type));
    if (n_dims < 0 || n_dims > LM_MAX_DIMS || (n_dims && !shape))
        return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: tensor '%s': rank %d is not in 0..%d", name, n_dims,
                        LM_MAX_DIMS);
    wtensor t = {.dt = dt, .n_dims = n_dims, .data = data};
    uint64_t nelem = 1, nbytes;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0 || (double)shape[d] > MAX_EXACT_INT || !mul_u64(nelem, (uint64_t)shape[d], &nelem))
            return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: tensor '%s': bad shape[%d] = %lld", name, d,
                            (long long)shape[d]);
        t.shape[d] = shape[d];
    }
    if (!mul_u64(nelem, dt->size, &nbytes) || (double)nbytes > MAX_EXACT_INT)
        return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: tensor '%s' is too large", name);
    t.nbytes = (size_t)nbytes;
    if (nbytes && !data) return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: tensor '%s': NULL data", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts) return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
        w->tensors = ts;
        w->cap = cap;
    }
    int r = lm_name_index_add(&w->names, name, strlen(name), (int64_t)w->n, &t.name);
    if (r == LM_NAME_DUPLICATE) return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: duplicate tensor name '%s'", name);
    if (r != LM_NAME_ADDED) return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
    w->tensors[w->n++] = t;
    return LM_OK;
}

static char *build_header(const lm_safetensors_writer *w) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    bool ok = true;
    if (w->n_meta) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (size_t i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(m, w->meta[2 * i], w->meta[2 * i + 1]) != NULL;
    }
    uint64_t off = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const wtensor *t = &w->tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offs && cJSON_AddStringToObject(e, "dtype", t->dt->name);
        for (int d = 0; ok && d < t->n_dims; d++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += t->nbytes;
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

lm_status lm_safetensors_writer_write(lm_safetensors_writer *w, const char *path) {
    if (!w || !path) return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: NULL writer or path");
    uint64_t total = 0;
    for (size_t i = 0; i < w->n; i++) total += w->tensors[i].nbytes;
    if ((double)total > MAX_EXACT_INT)
        return lm_error(LM_ERR_INVALID_ARG, "safetensors writer: %s: data of %llu bytes is too large", path,
                        (unsigned long long)total);
    char *hdr = build_header(w);
    if (!hdr) return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: %s: out of memory building the header", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        cJSON_free(hdr);
        return lm_error(LM_ERR_NO_MEMORY, "safetensors writer: out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        lm_status s = lm_error(LM_ERR_IO, "safetensors writer: cannot create %s: %s", tmp, strerror(errno));
        cJSON_free(hdr);
        free(tmp);
        return s;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < w->n; i++)
        if (w->tensors[i].nbytes) ok = fwrite(w->tensors[i].data, 1, w->tensors[i].nbytes, f) == w->tensors[i].nbytes;
    cJSON_free(hdr);
    int err = ok ? 0 : (errno ? errno : EIO);
    if (fflush(f) != 0 && !err) err = errno;
    if (!err && fsync(fileno(f)) != 0) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        remove(tmp);
        free(tmp);
        return lm_error(LM_ERR_IO, "safetensors writer: cannot write %s: %s", path, strerror(err));
    }
    free(tmp);
    return LM_OK;
}

/* ---- model folders ----------------------------------------------------------------- */

struct lm_st_folder {
    lm_safetensors **shards;
    int64_t n_shards;
    const lm_tensor **tensors;
    int64_t n;
    lm_name_index names;
};

void lm_st_folder_close(lm_st_folder *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_shards; i++) lm_safetensors_close(f->shards[i]);
    free(f->shards);
    free(f->tensors);
    lm_name_index_free(&f->names);
    free(f);
}

int64_t lm_st_folder_n_tensors(const lm_st_folder *f) { return f->n; }
int64_t lm_st_folder_n_shards(const lm_st_folder *f) { return f->n_shards; }

const lm_tensor *lm_st_folder_tensor(const lm_st_folder *f, int64_t i) {
    return (i >= 0 && i < f->n) ? f->tensors[i] : NULL;
}

const lm_tensor *lm_st_folder_find_tensor(const lm_st_folder *f, const char *name) {
    if (!f || !name) return NULL;
    int64_t i = lm_name_index_find(&f->names, name, strlen(name));
    return i < 0 ? NULL : f->tensors[i];
}

const lm_safetensors *lm_st_folder_shard(const lm_st_folder *f, int64_t i) {
    return (i >= 0 && i < f->n_shards) ? f->shards[i] : NULL;
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static lm_status folder_add(lm_st_folder *f, const lm_tensor *t, const char *index_path) {
    int r = lm_name_index_add(&f->names, t->name, strlen(t->name), f->n, NULL);
    if (r == LM_NAME_DUPLICATE)
        return lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' is listed twice", index_path, t->name);
    if (r != LM_NAME_ADDED) return lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
    f->tensors[f->n++] = t;
    return LM_OK;
}

static lm_status open_single(lm_st_folder *f, const char *path) {
    lm_status s;
    if (!(f->shards = calloc(1, sizeof *f->shards))) return lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
    if ((s = lm_safetensors_open(path, &f->shards[0]))) return s;
    f->n_shards = 1;
    int64_t n = lm_safetensors_n_tensors(f->shards[0]);
    if (n && !(f->tensors = calloc((size_t)n, sizeof *f->tensors)))
        return lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
    for (int64_t i = 0; i < n; i++)
        if ((s = folder_add(f, lm_safetensors_tensor(f->shards[0], i), path))) return s;
    return LM_OK;
}

static bool shard_name_ok(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static lm_status open_index(lm_st_folder *f, const char *dir, const char *index_path) {
    lm_mapped_file m;
    lm_status s = lm_mapped_file_open(index_path, &m);
    if (s) return lm_error_prefix(s, "safetensors index");
    lm_name_index shard_ix = {0};
    cJSON *root = NULL;
    if (m.size > LM_ST_MAX_INDEX) {
        s = lm_error(LM_ERR_LIMIT, "safetensors: %s: index of %zu bytes exceeds the limit of %u", index_path, m.size,
                     LM_ST_MAX_INDEX);
        goto done;
    }
    root = m.size ? cJSON_ParseWithLength((const char *)m.data, m.size) : NULL;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!root || !cJSON_IsObject(wm)) {
        s = lm_error(LM_ERR_FORMAT, "safetensors: %s: %s", index_path,
                     root ? "no \"weight_map\" object" : "not valid JSON");
        goto done;
    }
    int n = cJSON_GetArraySize(wm);
    if (n && (!(f->tensors = calloc((size_t)n, sizeof *f->tensors)) || !(f->shards = calloc((size_t)n, sizeof *f->shards)))) {
        s = lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e)) {
            s = lm_error(LM_ERR_FORMAT, "safetensors: %s: weight_map entry '%.200s' is not a string", index_path,
                         e->string);
            goto done;
        }
        const char *shard = e->valuestring;
        if (!shard_name_ok(shard)) {
            s = lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' names shard '%.200s', which is not a plain file name in the folder",
                         index_path, e->string, shard);
            goto done;
        }
        int64_t si = lm_name_index_find(&shard_ix, shard, strlen(shard));
        if (si < 0) {
            char *path = join(dir, shard);
            if (!path) {
                s = lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
                goto done;
            }
            s = lm_safetensors_open(path, &f->shards[f->n_shards]);
            free(path);
            if (s) {
                s = lm_error_prefix(s, "safetensors: %s lists shard '%.200s' for tensor '%.200s'", index_path, shard,
                                    e->string);
                goto done;
            }
            si = f->n_shards++;
            if (lm_name_index_add(&shard_ix, shard, strlen(shard), si, NULL) != LM_NAME_ADDED) {
                s = lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
                goto done;
            }
        }
        const lm_tensor *t = lm_safetensors_find_tensor(f->shards[si], e->string);
        if (!t) {
            s = lm_error(LM_ERR_FORMAT, "safetensors: %s: tensor '%.200s' is listed in shard '%.200s', which lacks it",
                         index_path, e->string, shard);
            goto done;
        }
        if ((s = folder_add(f, t, index_path))) goto done;
    }
done:
    cJSON_Delete(root);
    lm_name_index_free(&shard_ix);
    lm_mapped_file_close(&m);
    return s;
}

lm_status lm_st_folder_open(const char *dir, lm_st_folder **out) {
    if (!out || !dir) return lm_error(LM_ERR_INVALID_ARG, "safetensors: NULL folder or output handle");
    *out = NULL;
    lm_st_folder *f = calloc(1, sizeof *f);
    char *index = join(dir, "model.safetensors.index.json"), *single = join(dir, "model.safetensors");
    lm_status s = LM_OK;
    if (!f || !index || !single)
        s = lm_error(LM_ERR_NO_MEMORY, "safetensors: out of memory");
    else if (is_file(index))
        s = open_index(f, dir, index);
    else if (is_file(single))
        s = open_single(f, single);
    else
        s = lm_error(LM_ERR_NOT_FOUND, "safetensors: %s has neither model.safetensors.index.json nor model.safetensors",
                     dir);
    free(index);
    free(single);
    if (s) {
        lm_st_folder_close(f);
        return s;
    }
    *out = f;
    return LM_OK;
}
