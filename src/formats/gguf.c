/* GGUF reader and writer, written from the GGUF format description:
 *   "GGUF" u32:version u64:n_tensors u64:n_kv
 *   n_kv x { string:key u32:type value }
 *   n_tensors x { string:name u32:n_dims u64:ne[n_dims] u32:type u64:offset }
 *   padding to the alignment, then the data section (offsets are relative to it).
 * Strings are u64 length + bytes; arrays are u32 element type + u64 count + elements.
 * Everything is little-endian. */
#include "formats/gguf.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/name_index.h"

#include <errno.h>
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(SIZE_MAX >= UINT64_MAX, "lumen needs a 64-bit size_t");

/* ---- shared helpers ----------------------------------------------------------- */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* a * b into *out; false on overflow. */
static bool mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

const char *lm_gguf_type_name(lm_gguf_type type) {
    switch (type) {
    case LM_GGUF_U8: return "u8";
    case LM_GGUF_I8: return "i8";
    case LM_GGUF_U16: return "u16";
    case LM_GGUF_I16: return "i16";
    case LM_GGUF_U32: return "u32";
    case LM_GGUF_I32: return "i32";
    case LM_GGUF_F32: return "f32";
    case LM_GGUF_BOOL: return "bool";
    case LM_GGUF_STRING: return "string";
    case LM_GGUF_ARRAY: return "array";
    case LM_GGUF_U64: return "u64";
    case LM_GGUF_I64: return "i64";
    case LM_GGUF_F64: return "f64";
    }
    return "unknown";
}

size_t lm_gguf_type_size(lm_gguf_type type) {
    switch (type) {
    case LM_GGUF_U8: case LM_GGUF_I8: case LM_GGUF_BOOL: return 1;
    case LM_GGUF_U16: case LM_GGUF_I16: return 2;
    case LM_GGUF_U32: case LM_GGUF_I32: case LM_GGUF_F32: return 4;
    case LM_GGUF_U64: case LM_GGUF_I64: case LM_GGUF_F64: return 8;
    case LM_GGUF_STRING: case LM_GGUF_ARRAY: return 0;
    }
    return 0;
}

static bool type_valid(uint32_t t) { return t <= LM_GGUF_F64; }

/* ---- in-memory model ------------------------------------------------------------ */

struct lm_gguf_value {
    lm_gguf_type type;
    const uint8_t *raw; /* encoded value (after the type field) */
    size_t raw_size;
    /* STRING */
    char *cstr; /* NUL-terminated copy */
    size_t len;
    /* ARRAY */
    lm_gguf_type elem_type;
    uint64_t n;
    const uint8_t *data;              /* first element                           */
    const uint8_t **strs;             /* STRING elements: each one's length field */
    struct lm_gguf_value *items;      /* ARRAY elements                           */
};

typedef struct gguf_kv {
    const char *key; /* interned in lm_gguf.keys */
    lm_gguf_value value;
} gguf_kv;

struct lm_gguf {
    lm_mapped_file map; /* empty for open_memory */
    char *file;         /* path or "<memory>", for error sentences */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    size_t alignment, data_offset;
    gguf_kv *kvs;
    int64_t n_kv;
    lm_name_index keys;
    lm_tensor *tensors;
    uint64_t *offsets; /* relative tensor offsets while parsing */
    int64_t n_tensors;
    lm_name_index names;
};

static void value_free(lm_gguf_value *v) {
    free(v->cstr);
    free(v->strs);
    if (v->items) {
        for (uint64_t i = 0; i < v->n; i++) value_free(&v->items[i]);
        free(v->items);
    }
    memset(v, 0, sizeof *v);
}

void lm_gguf_close(lm_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) value_free(&g->kvs[i].value);
    free(g->kvs);
    free(g->tensors);
    free(g->offsets);
    lm_name_index_free(&g->keys);
    lm_name_index_free(&g->names);
    lm_mapped_file_close(&g->map);
    free(g->file);
    free(g);
}

/* ---- parser --------------------------------------------------------------------- */

typedef struct parser {
    const uint8_t *p;
    size_t size, pos;
    const char *file;
    uint64_t nested; /* elements of arrays of arrays so far (each costs a node) */
    char ctx[192];   /* what is being read: "key 'general.name'", "tensor #3 'x'" */
} parser;

static lm_status perr(parser *s, lm_status st, size_t off, const char *fmt, ...) LM_PRINTF(4, 5);
static lm_status perr(parser *s, lm_status st, size_t off, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->ctx[0])
        return lm_error(st, "gguf: %s: offset %zu: %s: %s", s->file, off, s->ctx, msg);
    return lm_error(st, "gguf: %s: offset %zu: %s", s->file, off, msg);
}

/* Sets the context to `prefix` followed by a printable rendering of a name. */
static void set_ctx(parser *s, const char *prefix, const uint8_t *name, size_t len) {
    char shown[96];
    size_t n = len < sizeof shown - 4 ? len : sizeof shown - 4;
    for (size_t i = 0; i < n; i++) shown[i] = (name[i] >= 0x20 && name[i] < 0x7f) ? (char)name[i] : '?';
    if (n < len) memcpy(shown + n, "...", 3), n += 3;
    shown[n] = '\0';
    snprintf(s->ctx, sizeof s->ctx, "%s '%s'", prefix, shown);
}

static size_t left(const parser *s) { return s->size - s->pos; }

static lm_status need(parser *s, size_t n, const char *what) {
    if (left(s) < n)
        return perr(s, LM_ERR_FORMAT, s->pos, "file truncated while reading %s (%zu bytes needed, %zu left)",
                    what, n, left(s));
    return LM_OK;
}

static lm_status rd_u32(parser *s, uint32_t *v, const char *what) {
    lm_status st = need(s, 4, what);
    if (st) return st;
    *v = ld32(s->p + s->pos);
    s->pos += 4;
    return LM_OK;
}

static lm_status rd_u64(parser *s, uint64_t *v, const char *what) {
    lm_status st = need(s, 8, what);
    if (st) return st;
    *v = ld64(s->p + s->pos);
    s->pos += 8;
    return LM_OK;
}

static lm_status rd_str(parser *s, const uint8_t **str, uint64_t *len, const char *what) {
    size_t at = s->pos;
    lm_status st = rd_u64(s, len, what);
    if (st) return st;
    if (*len > left(s))
        return perr(s, LM_ERR_FORMAT, at, "%s has length %llu but only %zu bytes are left in the file",
                    what, (unsigned long long)*len, left(s));
    *str = s->p + s->pos;
    s->pos += (size_t)*len;
    return LM_OK;
}

/* A key or tensor name: non-empty, bounded, no NUL (lookups use C strings). */
static lm_status rd_name(parser *s, const uint8_t **str, uint64_t *len, const char *what) {
    size_t at = s->pos;
    lm_status st = rd_str(s, str, len, what);
    if (st) return st;
    if (*len == 0) return perr(s, LM_ERR_FORMAT, at, "%s is empty", what);
    if (*len > LM_GGUF_MAX_NAME)
        return perr(s, LM_ERR_LIMIT, at, "%s is %llu bytes long (limit %d)", what,
                    (unsigned long long)*len, LM_GGUF_MAX_NAME);
    if (memchr(*str, 0, (size_t)*len))
        return perr(s, LM_ERR_FORMAT, at, "%s contains a NUL byte", what);
    return LM_OK;
}

static lm_status parse_value(parser *s, lm_gguf_type type, lm_gguf_value *v, int depth) {
    size_t start = s->pos;
    lm_status st;
    v->type = type;
    v->raw = s->p + start;
    if (type == LM_GGUF_STRING) {
        const uint8_t *str;
        uint64_t len;
        if ((st = rd_str(s, &str, &len, "a string value"))) return st;
        v->cstr = malloc((size_t)len + 1);
        if (!v->cstr) return perr(s, LM_ERR_NO_MEMORY, start, "out of memory copying a string of %llu bytes",
                                  (unsigned long long)len);
        if (len) memcpy(v->cstr, str, (size_t)len);
        v->cstr[len] = '\0';
        v->len = (size_t)len;
    } else if (type == LM_GGUF_ARRAY) {
        if (depth >= LM_GGUF_MAX_DEPTH)
            return perr(s, LM_ERR_LIMIT, start, "arrays nested more than %d deep", LM_GGUF_MAX_DEPTH);
        uint32_t et;
        uint64_t n;
        if ((st = rd_u32(s, &et, "an array's element type"))) return st;
        if (!type_valid(et)) return perr(s, LM_ERR_FORMAT, start, "array of unknown element type %u", et);
        if ((st = rd_u64(s, &n, "an array's length"))) return st;
        v->elem_type = (lm_gguf_type)et;
        size_t es = lm_gguf_type_size(v->elem_type);
        /* Each element takes at least this many bytes, which bounds n by the file. */
        size_t min_bytes = es ? es : (et == LM_GGUF_STRING ? 8 : 12);
        if (n > left(s) / min_bytes)
            return perr(s, LM_ERR_FORMAT, start,
                        "array of %llu %s elements does not fit in the %zu bytes left in the file",
                        (unsigned long long)n, lm_gguf_type_name(v->elem_type), left(s));
        v->data = s->p + s->pos;
        if (es) {
            if (et == LM_GGUF_BOOL)
                for (uint64_t i = 0; i < n; i++)
                    if (v->data[i] > 1)
                        return perr(s, LM_ERR_FORMAT, s->pos + i, "bool array element %llu is %u (must be 0 or 1)",
                                    (unsigned long long)i, v->data[i]);
            s->pos += (size_t)(n * es);
            v->n = n;
        } else if (et == LM_GGUF_STRING) {
            v->data = NULL;
            if (n && !(v->strs = malloc((size_t)n * sizeof *v->strs)))
                return perr(s, LM_ERR_NO_MEMORY, start, "out of memory indexing %llu strings", (unsigned long long)n);
            v->n = n;
            for (uint64_t i = 0; i < n; i++) {
                const uint8_t *str;
                uint64_t len;
                v->strs[i] = s->p + s->pos;
                if ((st = rd_str(s, &str, &len, "a string array element"))) return st;
            }
        } else {
            v->data = NULL;
            s->nested += n;
            if (s->nested > LM_GGUF_MAX_NESTED)
                return perr(s, LM_ERR_LIMIT, start, "more than %d elements in arrays of arrays", LM_GGUF_MAX_NESTED);
            if (n && !(v->items = calloc((size_t)n, sizeof *v->items)))
                return perr(s, LM_ERR_NO_MEMORY, start, "out of memory for %llu nested arrays", (unsigned long long)n);
            v->n = n;
            for (uint64_t i = 0; i < n; i++)
                if ((st = parse_value(s, LM_GGUF_ARRAY, &v->items[i], depth + 1))) return st;
        }
    } else {
        size_t es = lm_gguf_type_size(type);
        if ((st = need(s, es, "a scalar value"))) return st;
        if (type == LM_GGUF_BOOL && s->p[s->pos] > 1)
            return perr(s, LM_ERR_FORMAT, s->pos, "bool value is %u (must be 0 or 1)", s->p[s->pos]);
        s->pos += es;
    }
    v->raw_size = s->pos - start;
    return LM_OK;
}

/* ---- value access ------------------------------------------------------------- */

/* Reads an integer value as sign + 64-bit payload. */
static bool int_read(const lm_gguf_value *v, bool *is_signed, uint64_t *u, int64_t *i) {
    const uint8_t *p = v->raw;
    *is_signed = false;
    switch (v->type) {
    case LM_GGUF_U8: *u = p[0]; return true;
    case LM_GGUF_U16: *u = ld16(p); return true;
    case LM_GGUF_U32: *u = ld32(p); return true;
    case LM_GGUF_U64: *u = ld64(p); return true;
    case LM_GGUF_I8: *is_signed = true; *i = (int8_t)p[0]; return true;
    case LM_GGUF_I16: *is_signed = true; *i = (int16_t)ld16(p); return true;
    case LM_GGUF_I32: *is_signed = true; *i = (int32_t)ld32(p); return true;
    case LM_GGUF_I64: *is_signed = true; *i = (int64_t)ld64(p); return true;
    default: return false;
    }
}

static lm_status type_mismatch(const lm_gguf_value *v, const char *want) {
    return lm_error(LM_ERR_FORMAT, "a value of type %s cannot be read as %s", lm_gguf_type_name(v->type), want);
}

lm_gguf_type lm_gguf_value_type(const lm_gguf_value *v) { return v ? v->type : (lm_gguf_type)-1; }

lm_status lm_gguf_value_u64(const lm_gguf_value *v, uint64_t *out) {
    bool sg;
    uint64_t u = 0;
    int64_t i = 0;
    if (!v || !out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value or output");
    if (!int_read(v, &sg, &u, &i)) return type_mismatch(v, "an unsigned integer");
    if (sg) {
        if (i < 0) return lm_error(LM_ERR_FORMAT, "value %lld is negative, expected an unsigned integer", (long long)i);
        u = (uint64_t)i;
    }
    *out = u;
    return LM_OK;
}

lm_status lm_gguf_value_i64(const lm_gguf_value *v, int64_t *out) {
    bool sg;
    uint64_t u = 0;
    int64_t i = 0;
    if (!v || !out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value or output");
    if (!int_read(v, &sg, &u, &i)) return type_mismatch(v, "an integer");
    if (!sg) {
        if (u > (uint64_t)INT64_MAX)
            return lm_error(LM_ERR_FORMAT, "value %llu does not fit in i64", (unsigned long long)u);
        i = (int64_t)u;
    }
    *out = i;
    return LM_OK;
}

lm_status lm_gguf_value_f64(const lm_gguf_value *v, double *out) {
    bool sg;
    uint64_t u = 0;
    int64_t i = 0;
    if (!v || !out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value or output");
    if (v->type == LM_GGUF_F32) {
        uint32_t bits = ld32(v->raw);
        float f;
        memcpy(&f, &bits, 4);
        *out = f;
    } else if (v->type == LM_GGUF_F64) {
        uint64_t bits = ld64(v->raw);
        memcpy(out, &bits, 8);
    } else if (int_read(v, &sg, &u, &i)) {
        *out = sg ? (double)i : (double)u;
    } else {
        return type_mismatch(v, "a number");
    }
    return LM_OK;
}

lm_status lm_gguf_value_bool(const lm_gguf_value *v, bool *out) {
    if (!v || !out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value or output");
    if (v->type != LM_GGUF_BOOL) return type_mismatch(v, "bool");
    *out = v->raw[0] != 0;
    return LM_OK;
}

lm_status lm_gguf_value_str(const lm_gguf_value *v, const char **str, size_t *len) {
    if (!v) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value");
    if (v->type != LM_GGUF_STRING) return type_mismatch(v, "string");
    if (str) *str = v->cstr;
    if (len) *len = v->len;
    return LM_OK;
}

lm_status lm_gguf_value_arr(const lm_gguf_value *v, lm_gguf_type *elem_type, uint64_t *n,
                            const void **data) {
    if (!v) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value");
    if (v->type != LM_GGUF_ARRAY) return type_mismatch(v, "array");
    if (elem_type) *elem_type = v->elem_type;
    if (n) *n = v->n;
    if (data) *data = v->data;
    return LM_OK;
}

lm_status lm_gguf_value_arr_str(const lm_gguf_value *v, uint64_t i, const char **str, size_t *len) {
    if (!v) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL value");
    if (v->type != LM_GGUF_ARRAY || v->elem_type != LM_GGUF_STRING) {
        if (v->type == LM_GGUF_ARRAY)
            return lm_error(LM_ERR_FORMAT, "an array of %s is not an array of strings",
                            lm_gguf_type_name(v->elem_type));
        return type_mismatch(v, "array of strings");
    }
    if (i >= v->n)
        return lm_error(LM_ERR_NOT_FOUND, "index %llu is out of range for an array of %llu strings",
                        (unsigned long long)i, (unsigned long long)v->n);
    if (str) *str = (const char *)v->strs[i] + 8;
    if (len) *len = (size_t)ld64(v->strs[i]);
    return LM_OK;
}

const lm_gguf_value *lm_gguf_value_arr_item(const lm_gguf_value *v, uint64_t i) {
    if (!v || v->type != LM_GGUF_ARRAY || v->elem_type != LM_GGUF_ARRAY || i >= v->n) return NULL;
    return &v->items[i];
}

/* ---- reader API ------------------------------------------------------------------ */

uint32_t lm_gguf_version(const lm_gguf *g) { return g->version; }
size_t lm_gguf_alignment(const lm_gguf *g) { return g->alignment; }
size_t lm_gguf_data_offset(const lm_gguf *g) { return g->data_offset; }
int64_t lm_gguf_n_kv(const lm_gguf *g) { return g->n_kv; }
int64_t lm_gguf_n_tensors(const lm_gguf *g) { return g->n_tensors; }

const char *lm_gguf_kv_key(const lm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].key : NULL;
}

lm_gguf_type lm_gguf_kv_type(const lm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].value.type : (lm_gguf_type)-1;
}

const lm_gguf_value *lm_gguf_kv_value(const lm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? &g->kvs[i].value : NULL;
}

lm_status lm_gguf_kv_raw(const lm_gguf *g, int64_t i, lm_gguf_type *type, const void **bytes,
                         size_t *size) {
    if (i < 0 || i >= g->n_kv)
        return lm_error(LM_ERR_NOT_FOUND, "gguf: %s: no key/value pair #%lld", g->file, (long long)i);
    const lm_gguf_value *v = &g->kvs[i].value;
    if (type) *type = v->type;
    if (bytes) *bytes = v->raw;
    if (size) *size = v->raw_size;
    return LM_OK;
}

int64_t lm_gguf_find_key(const lm_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return lm_name_index_find(&g->keys, key, strlen(key));
}

const lm_tensor *lm_gguf_tensor(const lm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const lm_tensor *lm_gguf_find_tensor(const lm_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t i = lm_name_index_find(&g->names, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

/* Finds `key` for a getter, or fails with NOT_FOUND naming the file and key. */
static lm_status find_value(const lm_gguf *g, const char *key, const lm_gguf_value **v) {
    if (!g || !key) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL handle or key");
    int64_t i = lm_gguf_find_key(g, key);
    if (i < 0) return lm_error(LM_ERR_NOT_FOUND, "gguf: %s: key '%s' is absent", g->file, key);
    *v = &g->kvs[i].value;
    return LM_OK;
}

#define GETTER_PROLOGUE(want)                                                            \
    const lm_gguf_value *v = NULL;                                                       \
    lm_status st = find_value(g, key, &v);                                               \
    if (st) return st;                                                                   \
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL output for key '%s'", key)

#define GETTER_FAIL(st) lm_error_prefix((st), "gguf: %s: key '%s'", g->file, key)

lm_status lm_gguf_get_u64(const lm_gguf *g, const char *key, uint64_t *out) {
    GETTER_PROLOGUE("u64");
    if ((st = lm_gguf_value_u64(v, out))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_u32(const lm_gguf *g, const char *key, uint32_t *out) {
    GETTER_PROLOGUE("u32");
    uint64_t u;
    if ((st = lm_gguf_value_u64(v, &u))) return GETTER_FAIL(st);
    if (u > UINT32_MAX)
        return lm_error(LM_ERR_FORMAT, "gguf: %s: key '%s': value %llu does not fit in u32", g->file, key,
                        (unsigned long long)u);
    *out = (uint32_t)u;
    return LM_OK;
}

lm_status lm_gguf_get_i64(const lm_gguf *g, const char *key, int64_t *out) {
    GETTER_PROLOGUE("i64");
    if ((st = lm_gguf_value_i64(v, out))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_i32(const lm_gguf *g, const char *key, int32_t *out) {
    GETTER_PROLOGUE("i32");
    int64_t i;
    if ((st = lm_gguf_value_i64(v, &i))) return GETTER_FAIL(st);
    if (i < INT32_MIN || i > INT32_MAX)
        return lm_error(LM_ERR_FORMAT, "gguf: %s: key '%s': value %lld does not fit in i32", g->file, key,
                        (long long)i);
    *out = (int32_t)i;
    return LM_OK;
}

lm_status lm_gguf_get_f64(const lm_gguf *g, const char *key, double *out) {
    GETTER_PROLOGUE("f64");
    if ((st = lm_gguf_value_f64(v, out))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_f32(const lm_gguf *g, const char *key, float *out) {
    GETTER_PROLOGUE("f32");
    double d;
    if ((st = lm_gguf_value_f64(v, &d))) return GETTER_FAIL(st);
    if (d == d && (d > FLT_MAX || d < -FLT_MAX) && d - d == 0.0) /* finite, out of range */
        return lm_error(LM_ERR_FORMAT, "gguf: %s: key '%s': value %g does not fit in f32", g->file, key, d);
    *out = (float)d;
    return LM_OK;
}

lm_status lm_gguf_get_bool(const lm_gguf *g, const char *key, bool *out) {
    GETTER_PROLOGUE("bool");
    if ((st = lm_gguf_value_bool(v, out))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_str(const lm_gguf *g, const char *key, const char **str, size_t *len) {
    const lm_gguf_value *v = NULL;
    lm_status st = find_value(g, key, &v);
    if (st) return st;
    if ((st = lm_gguf_value_str(v, str, len))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_arr(const lm_gguf *g, const char *key, lm_gguf_type *elem_type, uint64_t *n,
                          const void **data) {
    const lm_gguf_value *v = NULL;
    lm_status st = find_value(g, key, &v);
    if (st) return st;
    if ((st = lm_gguf_value_arr(v, elem_type, n, data))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_arr_str(const lm_gguf *g, const char *key, uint64_t i, const char **str,
                              size_t *len) {
    const lm_gguf_value *v = NULL;
    lm_status st = find_value(g, key, &v);
    if (st) return st;
    if ((st = lm_gguf_value_arr_str(v, i, str, len))) return GETTER_FAIL(st);
    return LM_OK;
}

lm_status lm_gguf_get_arr_arr(const lm_gguf *g, const char *key, uint64_t i, lm_gguf_type *elem_type,
                              uint64_t *n, const void **data) {
    const lm_gguf_value *v = NULL;
    lm_status st = find_value(g, key, &v);
    if (st) return st;
    if (v->type != LM_GGUF_ARRAY || v->elem_type != LM_GGUF_ARRAY)
        return lm_error(LM_ERR_FORMAT, "gguf: %s: key '%s' is not an array of arrays", g->file, key);
    if (i >= v->n)
        return lm_error(LM_ERR_NOT_FOUND, "gguf: %s: key '%s': index %llu is out of range (%llu arrays)",
                        g->file, key, (unsigned long long)i, (unsigned long long)v->n);
    return lm_gguf_value_arr(&v->items[i], elem_type, n, data);
}

/* ---- open ------------------------------------------------------------------------ */

static lm_status parse_header(lm_gguf *g, parser *s, uint64_t *n_tensors, uint64_t *n_kv) {
    lm_status st;
    if (s->size < 4 || memcmp(s->p, "GGUF", 4) != 0) {
        if (s->size < 4 && memcmp(s->p ? (const void *)s->p : "", "GGUF", s->size) == 0)
            return perr(s, LM_ERR_FORMAT, 0, "file truncated inside the magic (%zu bytes)", s->size);
        return perr(s, LM_ERR_FORMAT, 0, "not a GGUF file (the magic is not \"GGUF\")");
    }
    s->pos = 4;
    if ((st = rd_u32(s, &g->version, "the version"))) return st;
    if (g->version == 1)
        return perr(s, LM_ERR_UNSUPPORTED, 4, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return perr(s, LM_ERR_UNSUPPORTED, 4, "big-endian GGUF files are not supported");
    if (g->version != 2 && g->version != 3)
        return perr(s, LM_ERR_UNSUPPORTED, 4, "GGUF version %u is not supported (only versions 2 and 3)",
                    g->version);
    if ((st = rd_u64(s, n_tensors, "the tensor count"))) return st;
    if ((st = rd_u64(s, n_kv, "the key/value count"))) return st;
    if (*n_tensors > LM_GGUF_MAX_TENSORS)
        return perr(s, LM_ERR_LIMIT, 8, "tensor count %llu exceeds the limit of %d",
                    (unsigned long long)*n_tensors, LM_GGUF_MAX_TENSORS);
    if (*n_kv > LM_GGUF_MAX_KV)
        return perr(s, LM_ERR_LIMIT, 16, "key/value count %llu exceeds the limit of %d",
                    (unsigned long long)*n_kv, LM_GGUF_MAX_KV);
    /* Smallest encodings: a pair is 8+1+4+1 bytes, a tensor info 8+1+4+4+8. */
    if (*n_kv > left(s) / 14 || *n_tensors > (left(s) - *n_kv * 14) / 25)
        return perr(s, LM_ERR_FORMAT, 8, "%llu tensors and %llu key/value pairs cannot fit in a %zu-byte file",
                    (unsigned long long)*n_tensors, (unsigned long long)*n_kv, s->size);
    return LM_OK;
}

static lm_status parse_kvs(lm_gguf *g, parser *s, uint64_t n_kv) {
    lm_status st;
    if (n_kv && !(g->kvs = calloc((size_t)n_kv, sizeof *g->kvs)))
        return perr(s, LM_ERR_NO_MEMORY, s->pos, "out of memory for %llu key/value pairs", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(s->ctx, sizeof s->ctx, "key/value pair #%llu", (unsigned long long)i);
        const uint8_t *key;
        uint64_t len;
        size_t at = s->pos;
        if ((st = rd_name(s, &key, &len, "the key"))) return st;
        set_ctx(s, "key", key, (size_t)len);
        gguf_kv *kv = &g->kvs[i];
        int r = lm_name_index_add(&g->keys, (const char *)key, (size_t)len, (int64_t)i, &kv->key);
        if (r == LM_NAME_NO_MEMORY) return perr(s, LM_ERR_NO_MEMORY, at, "out of memory");
        if (r == LM_NAME_DUPLICATE) return perr(s, LM_ERR_FORMAT, at, "duplicate key");
        g->n_kv = (int64_t)i + 1; /* kv->key is set: close() may free this pair */
        uint32_t type;
        at = s->pos;
        if ((st = rd_u32(s, &type, "the value type"))) return st;
        if (!type_valid(type)) return perr(s, LM_ERR_FORMAT, at, "unknown value type %u", type);
        if ((st = parse_value(s, (lm_gguf_type)type, &kv->value, 0))) return st;
    }
    s->ctx[0] = '\0';
    g->alignment = LM_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = lm_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        uint64_t a;
        const lm_gguf_value *v = &g->kvs[ai].value;
        if (lm_gguf_value_u64(v, &a) != LM_OK)
            return perr(s, LM_ERR_FORMAT, (size_t)(v->raw - s->p), "general.alignment is a %s, not an integer",
                        lm_gguf_type_name(v->type));
        if (!is_pow2(a) || a > UINT32_MAX)
            return perr(s, LM_ERR_FORMAT, (size_t)(v->raw - s->p),
                        "general.alignment is %llu; it must be a non-zero power of two", (unsigned long long)a);
        g->alignment = (size_t)a;
    }
    return LM_OK;
}

static lm_status parse_tensor_infos(lm_gguf *g, parser *s, uint64_t n) {
    lm_status st;
    if (n && (!(g->tensors = calloc((size_t)n, sizeof *g->tensors)) ||
              !(g->offsets = calloc((size_t)n, sizeof *g->offsets))))
        return perr(s, LM_ERR_NO_MEMORY, s->pos, "out of memory for %llu tensors", (unsigned long long)n);
    g->n_tensors = (int64_t)n;
    for (uint64_t i = 0; i < n; i++) {
        lm_tensor *t = &g->tensors[i];
        snprintf(s->ctx, sizeof s->ctx, "tensor #%llu", (unsigned long long)i);
        const uint8_t *name;
        uint64_t len;
        size_t at = s->pos;
        if ((st = rd_name(s, &name, &len, "the tensor name"))) return st;
        char prefix[40];
        snprintf(prefix, sizeof prefix, "tensor #%llu", (unsigned long long)i);
        set_ctx(s, prefix, name, (size_t)len);
        int r = lm_name_index_add(&g->names, (const char *)name, (size_t)len, (int64_t)i, &t->name);
        if (r == LM_NAME_NO_MEMORY) return perr(s, LM_ERR_NO_MEMORY, at, "out of memory");
        if (r == LM_NAME_DUPLICATE) return perr(s, LM_ERR_FORMAT, at, "duplicate tensor name");

        uint32_t n_dims;
        at = s->pos;
        if ((st = rd_u32(s, &n_dims, "n_dims"))) return st;
        if (n_dims > LM_MAX_DIMS)
            return perr(s, LM_ERR_FORMAT, at, "n_dims is %u; at most %d dimensions are allowed", n_dims, LM_MAX_DIMS);
        t->n_dims = (int)n_dims;
        uint64_t nelem = 1;
        for (int d = 0; d < LM_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            at = s->pos;
            if ((st = rd_u64(s, &ne, "a dimension"))) return st;
            if (ne > (uint64_t)INT64_MAX)
                return perr(s, LM_ERR_FORMAT, at, "ne[%u] = %llu is out of range", d, (unsigned long long)ne);
            if (!mul_u64(nelem, ne, &nelem) || nelem > (uint64_t)INT64_MAX)
                return perr(s, LM_ERR_FORMAT, at, "the element count overflows at ne[%u] = %llu", d,
                            (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
        }
        uint32_t type;
        at = s->pos;
        if ((st = rd_u32(s, &type, "the tensor type"))) return st;
        const lm_dtype_info *info = type < 1000 ? lm_dtype_get_info((int)type) : NULL;
        if (!info) return perr(s, LM_ERR_UNSUPPORTED, at, "unknown tensor type id %u", type);
        t->type = (lm_dtype)type;
        if (info->block_size <= 0 || t->ne[0] % info->block_size != 0)
            return perr(s, LM_ERR_FORMAT, at, "ne[0] = %lld is not a multiple of the %s block size %lld",
                        (long long)t->ne[0], info->name, (long long)info->block_size);
        uint64_t rows = 1, nbytes = 0;
        for (int d = 1; d < LM_MAX_DIMS; d++)
            if (!mul_u64(rows, (uint64_t)t->ne[d], &rows))
                return perr(s, LM_ERR_FORMAT, at, "the row count overflows");
        if (t->ne[0] > 0) {
            size_t row = lm_dtype_row_bytes(t->type, t->ne[0]);
            if (row == 0)
                return perr(s, LM_ERR_UNSUPPORTED, at, "no row size for type %s with ne[0] = %lld", info->name,
                            (long long)t->ne[0]);
            if (!mul_u64(row, rows, &nbytes))
                return perr(s, LM_ERR_FORMAT, at, "the byte size overflows");
        }
        t->nbytes = (size_t)nbytes;
        if ((st = rd_u64(s, &g->offsets[i], "the data offset"))) return st;
    }
    s->ctx[0] = '\0';
    return LM_OK;
}

typedef struct span {
    uint64_t off;
    int64_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->off, y = ((const span *)b)->off;
    return x < y ? -1 : x > y;
}

static lm_status place_tensors(lm_gguf *g, parser *s) {
    size_t pad = (g->alignment - s->pos % g->alignment) % g->alignment;
    g->data_offset = s->pos + pad;
    if (g->n_tensors == 0) return LM_OK;
    if (pad > left(s))
        return perr(s, LM_ERR_FORMAT, s->pos, "file truncated before the data section (it starts at offset %zu, the file has %zu bytes)",
                    g->data_offset, s->size);
    size_t data_size = s->size - g->data_offset;
    const uint8_t *data = s->p + g->data_offset;
    int64_t n_nonempty = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        lm_tensor *t = &g->tensors[i];
        uint64_t off = g->offsets[i];
        if (off % g->alignment)
            return lm_error(LM_ERR_FORMAT, "gguf: %s: tensor '%s': data offset %llu is not a multiple of the alignment %zu",
                            g->file, t->name, (unsigned long long)off, g->alignment);
        if (off > data_size || t->nbytes > data_size - off)
            return lm_error(LM_ERR_FORMAT,
                            "gguf: %s: tensor '%s': data [%llu, +%zu) lies outside the %zu-byte data section at file offset %zu",
                            g->file, t->name, (unsigned long long)off, t->nbytes, data_size, g->data_offset);
        t->data = data + off;
        if (t->nbytes) n_nonempty++;
    }
    /* No two tensors may share bytes: sort non-empty ones by offset, compare neighbours. */
    span *order = malloc((size_t)(n_nonempty ? n_nonempty : 1) * sizeof *order);
    if (!order) return lm_error(LM_ERR_NO_MEMORY, "gguf: %s: out of memory", g->file);
    int64_t k = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes) order[k++] = (span){g->offsets[i], i};
    if (k > 1) qsort(order, (size_t)k, sizeof *order, cmp_span);
    for (int64_t j = 1; j < k; j++) {
        const lm_tensor *a = &g->tensors[order[j - 1].idx], *b = &g->tensors[order[j].idx];
        if (order[j - 1].off + a->nbytes > order[j].off) {
            lm_status st = lm_error(LM_ERR_FORMAT, "gguf: %s: tensors '%s' (offset %llu, %zu bytes) and '%s' (offset %llu) overlap",
                                    g->file, a->name, (unsigned long long)order[j - 1].off, a->nbytes,
                                    b->name, (unsigned long long)order[j].off);
            free(order);
            return st;
        }
    }
    free(order);
    return LM_OK;
}

static lm_status gguf_parse(lm_gguf *g) {
    parser s = {.p = g->base, .size = g->size, .pos = 0, .file = g->file};
    uint64_t n_tensors, n_kv;
    lm_status st;
    if ((st = parse_header(g, &s, &n_tensors, &n_kv))) return st;
    if ((st = parse_kvs(g, &s, n_kv))) return st;
    if ((st = parse_tensor_infos(g, &s, n_tensors))) return st;
    if ((st = place_tensors(g, &s))) return st;
    free(g->offsets);
    g->offsets = NULL;
    return LM_OK;
}

static lm_status gguf_new(const char *file, lm_gguf **out) {
    lm_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->file = strdup(file))) {
        free(g);
        return lm_error(LM_ERR_NO_MEMORY, "gguf: %s: out of memory", file);
    }
    *out = g;
    return LM_OK;
}

lm_status lm_gguf_open_memory(const void *data, size_t size, lm_gguf **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL output handle");
    *out = NULL;
    if (!data && size) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL buffer of %zu bytes", size);
    lm_gguf *g;
    lm_status st = gguf_new("<memory>", &g);
    if (st) return st;
    g->base = data;
    g->size = size;
    if ((st = gguf_parse(g))) {
        lm_gguf_close(g);
        return st;
    }
    *out = g;
    return LM_OK;
}

lm_status lm_gguf_open(const char *path, lm_gguf **out) {
    if (!out || !path) return lm_error(LM_ERR_INVALID_ARG, "gguf: NULL path or output handle");
    *out = NULL;
    lm_gguf *g;
    lm_status st = gguf_new(path, &g);
    if (st) return st;
    if ((st = lm_mapped_file_open(path, &g->map))) {
        lm_gguf_close(g);
        return lm_error_prefix(st, "gguf");
    }
    g->base = g->map.data;
    g->size = g->map.size;
    if ((st = gguf_parse(g))) {
        lm_gguf_close(g);
        return st;
    }
    *out = g;
    return LM_OK;
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct wkv {
    char *key; /* interned in lm_gguf_writer.keys */
    lm_gguf_type type;
    uint8_t *bytes; /* encoded value */
    size_t size;
} wkv;

typedef struct wtensor {
    const char *name;
    lm_dtype type;
    int n_dims;
    int64_t ne[LM_MAX_DIMS];
    const void *data; /* borrowed */
    size_t nbytes;
} wtensor;

struct lm_gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    lm_name_index keys;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    lm_name_index names;
};

lm_gguf_writer *lm_gguf_writer_create(void) { return calloc(1, sizeof(lm_gguf_writer)); }

void lm_gguf_writer_free(lm_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) free(w->kvs[i].bytes);
    free(w->kvs);
    free(w->tensors);
    lm_name_index_free(&w->keys);
    lm_name_index_free(&w->names);
    free(w);
}

static lm_status check_name(const char *what, const char *name) {
    if (!name || !name[0]) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: empty or NULL %s", what);
    if (strlen(name) > LM_GGUF_MAX_NAME)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: %s '%.64s...' is longer than %d bytes", what, name,
                        LM_GGUF_MAX_NAME);
    return LM_OK;
}

/* Stores an encoded value under `key`, taking ownership of `bytes` (freed on error). */
static lm_status set_encoded(lm_gguf_writer *w, const char *key, lm_gguf_type type, uint8_t *bytes, size_t size) {
    lm_status st;
    if (!w) {
        free(bytes);
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: NULL writer");
    }
    if ((st = check_name("key", key))) {
        free(bytes);
        return st;
    }
    int64_t i = lm_name_index_find(&w->keys, key, strlen(key));
    if (i >= 0) {
        free(w->kvs[i].bytes);
        w->kvs[i].type = type;
        w->kvs[i].bytes = bytes;
        w->kvs[i].size = size;
        return LM_OK;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *kvs = realloc(w->kvs, cap * sizeof *kvs);
        if (!kvs) {
            free(bytes);
            return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory adding key '%s'", key);
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    const char *interned;
    if (lm_name_index_add(&w->keys, key, strlen(key), (int64_t)w->n_kv, &interned) != LM_NAME_ADDED) {
        free(bytes);
        return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory adding key '%s'", key);
    }
    w->kvs[w->n_kv++] = (wkv){(char *)interned, type, bytes, size};
    return LM_OK;
}

static void st64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static lm_status set_scalar(lm_gguf_writer *w, const char *key, lm_gguf_type type, uint64_t bits) {
    size_t n = lm_gguf_type_size(type);
    uint8_t *b = malloc(n);
    if (!b) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(bits >> (8 * i));
    return set_encoded(w, key, type, b, n);
}

lm_status lm_gguf_writer_set_u8(lm_gguf_writer *w, const char *key, uint8_t value) {
    return set_scalar(w, key, LM_GGUF_U8, value);
}
lm_status lm_gguf_writer_set_i8(lm_gguf_writer *w, const char *key, int8_t value) {
    return set_scalar(w, key, LM_GGUF_I8, (uint8_t)value);
}
lm_status lm_gguf_writer_set_u16(lm_gguf_writer *w, const char *key, uint16_t value) {
    return set_scalar(w, key, LM_GGUF_U16, value);
}
lm_status lm_gguf_writer_set_i16(lm_gguf_writer *w, const char *key, int16_t value) {
    return set_scalar(w, key, LM_GGUF_I16, (uint16_t)value);
}
lm_status lm_gguf_writer_set_u32(lm_gguf_writer *w, const char *key, uint32_t value) {
    return set_scalar(w, key, LM_GGUF_U32, value);
}
lm_status lm_gguf_writer_set_i32(lm_gguf_writer *w, const char *key, int32_t value) {
    return set_scalar(w, key, LM_GGUF_I32, (uint32_t)value);
}
lm_status lm_gguf_writer_set_u64(lm_gguf_writer *w, const char *key, uint64_t value) {
    return set_scalar(w, key, LM_GGUF_U64, value);
}
lm_status lm_gguf_writer_set_i64(lm_gguf_writer *w, const char *key, int64_t value) {
    return set_scalar(w, key, LM_GGUF_I64, (uint64_t)value);
}
lm_status lm_gguf_writer_set_f32(lm_gguf_writer *w, const char *key, float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    return set_scalar(w, key, LM_GGUF_F32, bits);
}
lm_status lm_gguf_writer_set_f64(lm_gguf_writer *w, const char *key, double value) {
    uint64_t bits;
    memcpy(&bits, &value, 8);
    return set_scalar(w, key, LM_GGUF_F64, bits);
}
lm_status lm_gguf_writer_set_bool(lm_gguf_writer *w, const char *key, bool value) {
    return set_scalar(w, key, LM_GGUF_BOOL, value ? 1 : 0);
}

lm_status lm_gguf_writer_set_strn(lm_gguf_writer *w, const char *key, const char *value, size_t len) {
    if (!value && len) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: NULL string for key '%s'", key ? key : "");
    uint8_t *b = malloc(8 + len);
    if (!b) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    st64(b, len);
    if (len) memcpy(b + 8, value, len);
    return set_encoded(w, key, LM_GGUF_STRING, b, 8 + len);
}

lm_status lm_gguf_writer_set_str(lm_gguf_writer *w, const char *key, const char *value) {
    if (!value) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: NULL string for key '%s'", key ? key : "");
    return lm_gguf_writer_set_strn(w, key, value, strlen(value));
}

lm_status lm_gguf_writer_set_arr(lm_gguf_writer *w, const char *key, lm_gguf_type elem_type, const void *data,
                                 uint64_t n) {
    size_t es = lm_gguf_type_size(elem_type);
    if (!es)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': set_arr needs a fixed-size element type, not %s",
                        key ? key : "", lm_gguf_type_name(elem_type));
    if (!data && n) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': NULL array data", key ? key : "");
    if (n > (SIZE_MAX - 12) / es)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': array of %llu elements is too large",
                        key ? key : "", (unsigned long long)n);
    if (elem_type == LM_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': bool element %llu is not 0 or 1",
                                key ? key : "", (unsigned long long)i);
    size_t size = 12 + (size_t)n * es;
    uint8_t *b = malloc(size);
    if (!b) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    st32(b, (uint32_t)elem_type);
    st64(b + 4, n);
    if (n) memcpy(b + 12, data, (size_t)n * es); /* host order is little-endian */
    return set_encoded(w, key, LM_GGUF_ARRAY, b, size);
}

lm_status lm_gguf_writer_set_arr_str(lm_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!strs && n) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': NULL string array", key ? key : "");
    size_t size = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': string %llu is NULL", key ? key : "",
                            (unsigned long long)i);
        size += 8 + strlen(strs[i]);
    }
    uint8_t *b = malloc(size), *p = b;
    if (!b) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    st32(p, LM_GGUF_STRING);
    st64(p + 4, n);
    p += 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = strlen(strs[i]);
        st64(p, len);
        memcpy(p + 8, strs[i], len);
        p += 8 + len;
    }
    return set_encoded(w, key, LM_GGUF_ARRAY, b, size);
}

lm_status lm_gguf_writer_set_raw(lm_gguf_writer *w, const char *key, lm_gguf_type type, const void *bytes,
                                 size_t size) {
    if (!type_valid((uint32_t)type))
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': unknown value type %d", key ? key : "", (int)type);
    if (!bytes && size) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': NULL bytes", key ? key : "");
    parser s = {.p = bytes, .size = size, .pos = 0, .file = "<raw value>"};
    snprintf(s.ctx, sizeof s.ctx, "key '%.100s'", key ? key : "");
    lm_gguf_value v = {0};
    lm_status st = parse_value(&s, type, &v, 0);
    value_free(&v);
    if (st) return lm_error_prefix(LM_ERR_INVALID_ARG, "gguf writer");
    if (s.pos != size)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: key '%s': %zu trailing bytes after the %s value",
                        key ? key : "", size - s.pos, lm_gguf_type_name(type));
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    if (size) memcpy(b, bytes, size);
    return set_encoded(w, key, type, b, size);
}

lm_status lm_gguf_writer_add_tensor(lm_gguf_writer *w, const char *name, lm_dtype type, int n_dims,
                                    const int64_t *ne, const void *data) {
    lm_status st;
    if (!w) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: NULL writer");
    if ((st = check_name("tensor name", name))) return st;
    const lm_dtype_info *info = (int)type < 1000 ? lm_dtype_get_info((int)type) : NULL;
    if (!info)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': type %d cannot be stored in GGUF", name,
                        (int)type);
    if (n_dims < 0 || n_dims > LM_MAX_DIMS || (n_dims && !ne))
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %d is not in 0..%d", name, n_dims,
                        LM_MAX_DIMS);
    wtensor t = {.name = NULL, .type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .data = data};
    uint64_t nelem = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 0 || !mul_u64(nelem, (uint64_t)ne[d], &nelem) || nelem > (uint64_t)INT64_MAX)
            return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': bad ne[%d] = %lld", name, d,
                            (long long)ne[d]);
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % info->block_size)
        return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld",
                        name, (long long)t.ne[0], info->name, (long long)info->block_size);
    uint64_t nbytes = 0;
    if (t.ne[0] > 0) {
        size_t row = lm_dtype_row_bytes(type, t.ne[0]);
        if (!row || !mul_u64(row, (uint64_t)(t.ne[1] * t.ne[2] * t.ne[3]), &nbytes))
            return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': cannot size %s data", name, info->name);
    }
    t.nbytes = (size_t)nbytes;
    if (!data && nbytes) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: tensor '%s': NULL data", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory adding tensor '%s'", name);
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    int r = lm_name_index_add(&w->names, name, strlen(name), (int64_t)w->n_tensors, &t.name);
    if (r == LM_NAME_DUPLICATE) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: duplicate tensor name '%s'", name);
    if (r != LM_NAME_ADDED) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory adding tensor '%s'", name);
    w->tensors[w->n_tensors++] = t;
    return LM_OK;
}

typedef struct wfile {
    FILE *f;
    uint64_t pos;
    bool failed;
} wfile;

static void wbytes(wfile *o, const void *p, size_t n) {
    if (o->failed || !n) return;
    if (fwrite(p, 1, n, o->f) != n) o->failed = true;
    o->pos += n;
}
static void wu32(wfile *o, uint32_t v) {
    uint8_t b[4];
    st32(b, v);
    wbytes(o, b, 4);
}
static void wu64(wfile *o, uint64_t v) {
    uint8_t b[8];
    st64(b, v);
    wbytes(o, b, 8);
}
static void wpad(wfile *o, size_t align) {
    static const uint8_t zeros[256];
    size_t pad = (size_t)((align - o->pos % align) % align);
    while (pad) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        wbytes(o, zeros, n);
        pad -= n;
    }
}

lm_status lm_gguf_writer_write(lm_gguf_writer *w, const char *path) {
    if (!w || !path) return lm_error(LM_ERR_INVALID_ARG, "gguf writer: NULL writer or path");
    size_t align = LM_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = lm_name_index_find(&w->keys, "general.alignment", strlen("general.alignment"));
    if (ai >= 0) {
        const wkv *kv = &w->kvs[ai];
        if (kv->type != LM_GGUF_U32 || !is_pow2(ld32(kv->bytes)))
            return lm_error(LM_ERR_INVALID_ARG, "gguf writer: %s: general.alignment must be a u32 power of two", path);
        align = ld32(kv->bytes);
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return lm_error(LM_ERR_NO_MEMORY, "gguf writer: out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    wfile o = {.f = fopen(tmp, "wb")};
    if (!o.f) {
        lm_status st = lm_error(LM_ERR_IO, "gguf writer: cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    wbytes(&o, "GGUF", 4);
    wu32(&o, 3);
    wu64(&o, w->n_tensors);
    wu64(&o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t len = strlen(w->kvs[i].key);
        wu64(&o, len);
        wbytes(&o, w->kvs[i].key, len);
        wu32(&o, (uint32_t)w->kvs[i].type);
        wbytes(&o, w->kvs[i].bytes, w->kvs[i].size);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        size_t len = strlen(t->name);
        wu64(&o, len);
        wbytes(&o, t->name, len);
        wu32(&o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) wu64(&o, (uint64_t)t->ne[d]);
        wu32(&o, (uint32_t)t->type);
        wu64(&o, off);
        off += t->nbytes;
        off += (align - off % align) % align;
    }
    /* Every tensor, the last one included, is padded to the alignment: readers that
     * load the data section as one blob of padded sizes expect the trailing padding. */
    if (w->n_tensors) wpad(&o, align);
    for (size_t i = 0; i < w->n_tensors; i++) {
        wbytes(&o, w->tensors[i].data, w->tensors[i].nbytes);
        wpad(&o, align);
    }
    int err = 0;
    if (o.failed) err = errno ? errno : EIO;
    if (fflush(o.f) != 0 && !err) err = errno;
    if (!err && fsync(fileno(o.f)) != 0) err = errno;
    if (fclose(o.f) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        remove(tmp);
        lm_status st = lm_error(LM_ERR_IO, "gguf writer: cannot write %s: %s", path, strerror(err));
        free(tmp);
        return st;
    }
    free(tmp);
    return LM_OK;
}
