/* Values: the arena they live in, containers, Python equality / ordering / truthiness, str() and
 * repr() as Python writes them, and JSON in (exact ints) and out (json.dumps, as transformers'
 * tojson filter calls it). */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/template/tmpl_internal.h"

/* ------------------------------------------------------------------ arena */

struct tmpl_chunk {
    tmpl_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void *tmpl_alloc(tmpl_arena *a, size_t n) {
    if (a->failed) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->cap && (n > a->cap || a->used + n > a->cap)) {
        a->failed = true;
        a->over_cap = true;
        return NULL;
    }
    tmpl_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > (64u << 10) ? n : (64u << 10);
        c = malloc(sizeof *c + sz);
        if (!c) {
            a->failed = true;
            return NULL;
        }
        c->size = sz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *tmpl_strndup(tmpl_arena *a, const char *s, size_t n) {
    char *o = tmpl_alloc(a, n + 1);
    if (!o) return NULL;
    memcpy(o, s, n);
    o[n] = '\0';
    return o;
}

void tmpl_arena_free(tmpl_arena *a) {
    tmpl_chunk *c = a->head;
    while (c) {
        tmpl_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used = 0;
}

/* ------------------------------------------------------------------ string buffers */

bool tbuf_put(tbuf *b, const char *s, size_t n) {
    if (b->failed) return false;
    if (b->limit && b->n + n > b->limit) {
        b->failed = true;
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->failed = true;
            return false;
        }
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

bool tbuf_putc(tbuf *b, char c) { return tbuf_put(b, &c, 1); }

bool tbuf_printf(tbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return false;
    if ((size_t)k >= sizeof tmp) k = sizeof tmp - 1;
    return tbuf_put(b, tmp, (size_t)k);
}

/* ------------------------------------------------------------------ UTF-8 */

size_t tmpl_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) {
        *cp = 0;
        return 1;
    }
    unsigned c = u[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xc0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3f);
    }
    *cp = v;
    return len;
}

size_t tmpl_utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode(s + i, n - i, &cp);
        k++;
    }
    return k;
}

bool tmpl_is_space_cp(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return true;
    if (cp < 0x80) return false;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ------------------------------------------------------------------ constructors and containers */

tv tv_str(tmpl_arena *a, const char *s, size_t n) {
    tstr *t = tmpl_alloc(a, sizeof *t + n + 1);
    if (!t) return tv_undef(NULL);
    t->len = n;
    if (n) memcpy(t->s, s, n);
    t->s[n] = '\0';
    tv v = {TV_STR, 0, {.s = t}};
    return v;
}

tv tv_cstr(tmpl_arena *a, const char *s) { return tv_str(a, s, strlen(s)); }

tv tv_list_new(tmpl_arena *a, size_t cap) {
    tlist *l = tmpl_alloc(a, sizeof *l);
    if (!l) return tv_undef(NULL);
    if (cap) {
        l->v = tmpl_alloc(a, cap * sizeof *l->v);
        if (!l->v) return tv_undef(NULL);
        l->cap = cap;
    }
    tv v = {TV_LIST, 0, {.l = l}};
    return v;
}

bool tv_list_push(tmpl_arena *a, tv *list, tv item) {
    tlist *l = list->u.l;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        tv *nv = tmpl_alloc(a, nc * sizeof *nv);
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = item;
    return true;
}

tv tv_dict_new(tmpl_arena *a, size_t cap) {
    tdict *d = tmpl_alloc(a, sizeof *d);
    if (!d) return tv_undef(NULL);
    if (cap) {
        d->k = tmpl_alloc(a, cap * sizeof *d->k);
        d->v = tmpl_alloc(a, cap * sizeof *d->v);
        if (!d->k || !d->v) return tv_undef(NULL);
        d->cap = cap;
    }
    tv v = {TV_DICT, 0, {.d = d}};
    return v;
}

tv *tv_dict_get(const tdict *d, tv key) {
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

tv *tv_dict_gets(const tdict *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].u.s->len == n && memcmp(d->k[i].u.s->s, key, n) == 0) return &d->v[i];
    return NULL;
}

bool tv_dict_set(tmpl_arena *a, tv *dict, tv key, tv val) {
    tdict *d = dict->u.d;
    tv *slot = tv_dict_get(d, key);
    if (slot) {
        *slot = val;
        return true;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        tv *nk = tmpl_alloc(a, nc * sizeof *nk), *nv = tmpl_alloc(a, nc * sizeof *nv);
        if (!nk || !nv) return false;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    return true;
}

/* ------------------------------------------------------------------ Python semantics */

bool tv_is_str(tv v) { return v.t == TV_STR; }
bool tv_is_number(tv v) { return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; }

static double num_of(tv v) { return v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : (double)v.u.b; }

bool tv_truthy(tv v) {
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s->len != 0;
    case TV_LIST: return (v.flags & TVF_GEN) || v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

bool tv_equal(tv a, tv b) {
    if (tv_is_number(a) && tv_is_number(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) {
            int64_t x = a.t == TV_INT ? a.u.i : a.u.b, y = b.t == TV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num_of(a) == num_of(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return true;
    case TV_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case TV_LIST:
        if ((a.flags & TVF_GEN) || (b.flags & TVF_GEN)) return a.u.l == b.u.l;
        if ((a.flags & (TVF_TUPLE | TVF_RANGE)) != (b.flags & (TVF_TUPLE | TVF_RANGE)) || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tv_equal(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tv *o = tv_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !tv_equal(a.u.d->v[i], *o)) return false;
        }
        return true;
    case TV_NS: return a.u.d == b.u.d;
    case TV_FUNC: return a.u.fn == b.u.fn;
    case TV_LOOP: return a.u.lp == b.u.lp;
    }
    return false;
}

bool tv_compare(tv a, tv b, int *cmp) {
    if (tv_is_number(a) && tv_is_number(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT) {
            int64_t x = a.t == TV_INT ? a.u.i : a.u.b, y = b.t == TV_INT ? b.u.i : b.u.b;
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = num_of(a), y = num_of(b);
            if (isnan(x) || isnan(y)) {
                *cmp = 2; /* unordered: every comparison false */
                return true;
            }
            *cmp = x < y ? -1 : x > y;
        }
        return true;
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, n);
        *cmp = r < 0 ? -1 : r > 0 ? 1 : (a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len);
        return true;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && !((a.flags | b.flags) & (TVF_GEN | TVF_RANGE)) &&
        (a.flags & TVF_TUPLE) == (b.flags & TVF_TUPLE)) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return tv_compare(a.u.l->v[i], b.u.l->v[i], cmp);
        }
        *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return true;
    }
    return false;
}

const char *tv_typename(tv v) {
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST:
        return (v.flags & TVF_GEN) ? "generator" : (v.flags & TVF_RANGE) ? "range" : (v.flags & TVF_TUPLE) ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC: return "function";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

/* ------------------------------------------------------------------ printing */

void tv_format_float(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    /* shortest digits that round-trip, then Python's repr layout */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = "-d.ddde+XX" */
    const char *s = e;
    bool neg = false;
    if (*s == '-') neg = true, s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char *o = out;
    size_t room = cap;
#define PUT(c) do { if (room > 1) { *o++ = (c); room--; } } while (0)
    if (neg) PUT('-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT('0');
            PUT('.');
            for (int k = -1; k > exp; k--) PUT('0');
            for (int k = 0; k < nd; k++) PUT(digits[k]);
        } else {
            for (int k = 0; k <= exp; k++) PUT(k < nd ? digits[k] : '0');
            PUT('.');
            if (nd > exp + 1)
                for (int k = exp + 1; k < nd; k++) PUT(digits[k]);
            else
                PUT('0');
        }
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int k = 1; k < nd; k++) PUT(digits[k]);
        }
        char ex[24];
        snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        for (char *x = ex; *x; x++) PUT(*x);
    }
#undef PUT
    *o = '\0';
}

static bool cp_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x80) return true;
    if (cp <= 0xa0 || cp == 0xad) return false;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
        (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) ||
        (cp >= 0xd800 && cp <= 0xf8ff) || cp >= 0xf0000 || (cp >= 0xe0000 && cp <= 0xe0fff))
        return false;
    return true;
}

static bool write_str_repr(tbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    bool ok = tbuf_putc(b, q);
    for (size_t i = 0; i < n && ok;) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') ok = tbuf_putc(b, '\\') && tbuf_putc(b, (char)cp);
        else if (cp == '\n') ok = tbuf_put(b, "\\n", 2);
        else if (cp == '\r') ok = tbuf_put(b, "\\r", 2);
        else if (cp == '\t') ok = tbuf_put(b, "\\t", 2);
        else if (cp_printable(cp)) ok = tbuf_put(b, s + i, k);
        else if (cp < 0x100) ok = tbuf_printf(b, "\\x%02x", cp);
        else if (cp < 0x10000) ok = tbuf_printf(b, "\\u%04x", cp);
        else ok = tbuf_printf(b, "\\U%08x", cp);
        i += k;
    }
    return ok && tbuf_putc(b, q);
}

static bool write_repr_depth(tbuf *b, tv v, int depth);

static bool write_items(tbuf *b, tv v, int depth) {
    bool ok = true;
    if (v.t == TV_LIST) {
        bool tup = v.flags & TVF_TUPLE;
        ok = tbuf_putc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n && ok; i++) {
            if (i) ok = tbuf_put(b, ", ", 2);
            ok = ok && write_repr_depth(b, v.u.l->v[i], depth + 1);
        }
        if (tup && v.u.l->n == 1) ok = ok && tbuf_putc(b, ',');
        return ok && tbuf_putc(b, tup ? ')' : ']');
    }
    ok = tbuf_putc(b, '{');
    for (size_t i = 0; i < v.u.d->n && ok; i++) {
        if (i) ok = tbuf_put(b, ", ", 2);
        ok = ok && write_repr_depth(b, v.u.d->k[i], depth + 1) && tbuf_put(b, ": ", 2) &&
             write_repr_depth(b, v.u.d->v[i], depth + 1);
    }
    return ok && tbuf_putc(b, '}');
}

static bool write_repr_depth(tbuf *b, tv v, int depth) {
    char tmp[64];
    if (depth > 200) return tbuf_put(b, "...", 3);
    switch (v.t) {
    case TV_UNDEF: return tbuf_put(b, "Undefined", 9);
    case TV_NONE: return tbuf_put(b, "None", 4);
    case TV_BOOL: return v.u.b ? tbuf_put(b, "True", 4) : tbuf_put(b, "False", 5);
    case TV_INT: return tbuf_printf(b, "%lld", (long long)v.u.i);
    case TV_FLOAT: tv_format_float(v.u.f, tmp, sizeof tmp); return tbuf_put(b, tmp, strlen(tmp));
    case TV_STR: return write_str_repr(b, v.u.s->s, v.u.s->len);
    case TV_LIST:
        if (v.flags & TVF_GEN) return tbuf_put(b, "<generator object>", 18);
        if (v.flags & TVF_RANGE) {
            if (v.u.l->rstep == 1) return tbuf_printf(b, "range(%lld, %lld)", (long long)v.u.l->rstart, (long long)v.u.l->rstop);
            return tbuf_printf(b, "range(%lld, %lld, %lld)", (long long)v.u.l->rstart, (long long)v.u.l->rstop,
                               (long long)v.u.l->rstep);
        }
        return write_items(b, v, depth);
    case TV_DICT: return write_items(b, v, depth);
    case TV_NS: {
        tv d = {TV_DICT, 0, {.d = v.u.d}};
        return tbuf_put(b, "<Namespace ", 11) && write_items(b, d, depth) && tbuf_putc(b, '>');
    }
    case TV_FUNC: return tbuf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?");
    case TV_LOOP: return tbuf_printf(b, "<LoopContext %zu/%zu>", v.u.lp->index0 + 1, v.u.lp->items->n);
    }
    return false;
}

bool tv_write_repr(tbuf *b, tv v) { return write_repr_depth(b, v, 0); }

bool tv_write_str(tbuf *b, tv v) {
    if (v.t == TV_STR) return tbuf_put(b, v.u.s->s, v.u.s->len);
    if (v.t == TV_UNDEF) return true;
    return tv_write_repr(b, v);
}

/* ------------------------------------------------------------------ JSON in */

typedef struct jparse {
    tmpl_arena *a;
    const char *s;
    size_t n, i;
    char *err;
    size_t errcap;
} jparse;

static bool jfail(jparse *j, const char *what) {
    if (j->err && j->errcap) snprintf(j->err, j->errcap, "%s at byte %zu", what, j->i);
    return false;
}

static void jws(jparse *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) j->i++;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static bool jhex4(jparse *j, uint32_t *out) {
    if (j->i + 4 > j->n) return jfail(j, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(j->s[j->i + k]);
        if (h < 0) return jfail(j, "bad \\u escape");
        v = v * 16 + (uint32_t)h;
    }
    j->i += 4;
    *out = v;
    return true;
}

static void put_utf8(char *o, size_t *k, uint32_t cp) {
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xc0 | (cp >> 6)); o[(*k)++] = (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) { o[(*k)++] = (char)(0xe0 | (cp >> 12)); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[(*k)++] = (char)(0x80 | (cp & 0x3f)); }
    else { o[(*k)++] = (char)(0xf0 | (cp >> 18)); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3f)); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[(*k)++] = (char)(0x80 | (cp & 0x3f)); }
}

static bool jstring(jparse *j, tv *out) {
    j->i++; /* opening quote */
    size_t start = j->i, end = start;
    while (end < j->n && j->s[end] != '"') {
        if (j->s[end] == '\\') end++;
        end++;
    }
    if (end >= j->n) return jfail(j, "unterminated string");
    char *o = tmpl_alloc(j->a, end - start + 1);
    if (!o) return jfail(j, "out of memory");
    size_t k = 0;
    while (j->i < end) {
        unsigned char c = (unsigned char)j->s[j->i];
        if (c < 0x20) return jfail(j, "control character in string");
        if (c != '\\') {
            o[k++] = (char)c;
            j->i++;
            continue;
        }
        char e = j->s[++j->i];
        j->i++;
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!jhex4(j, &cp)) return false;
            if (cp >= 0xd800 && cp < 0xdc00 && j->i + 6 <= end && j->s[j->i] == '\\' && j->s[j->i + 1] == 'u') {
                size_t save = j->i;
                uint32_t lo;
                j->i += 2;
                if (jhex4(j, &lo) && lo >= 0xdc00 && lo < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                else j->i = save;
            }
            if (cp >= 0xd800 && cp < 0xe000) cp = 0xFFFD; /* lone surrogate */
            put_utf8(o, &k, cp);
            break;
        }
        default: return jfail(j, "bad escape in string");
        }
    }
    j->i = end + 1;
    *out = tv_str(j->a, o, k);
    return out->t == TV_STR || jfail(j, "out of memory");
}

static bool jvalue(jparse *j, tv *out, int depth);

static bool jnumber(jparse *j, tv *out) {
    size_t st = j->i;
    bool is_float = false;
    if (j->i < j->n && j->s[j->i] == '-') j->i++;
    if (j->i >= j->n || j->s[j->i] < '0' || j->s[j->i] > '9') return jfail(j, "bad number");
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    if (j->i < j->n && j->s[j->i] == '.') {
        is_float = true;
        j->i++;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        is_float = true;
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    }
    char buf[64];
    size_t len = j->i - st;
    if (len >= sizeof buf) {
        is_float = true; /* beyond 64 bits anyway */
        len = sizeof buf - 1;
    }
    memcpy(buf, j->s + st, len);
    buf[len] = '\0';
    if (!is_float) {
        char *e;
        long long v = strtoll(buf, &e, 10);
        if ((v == LLONG_MAX || v == LLONG_MIN) && len > 18) is_float = true;
        else {
            *out = tv_int(v);
            return true;
        }
    }
    *out = tv_float(strtod(buf, NULL));
    return true;
}

static bool jvalue(jparse *j, tv *out, int depth) {
    if (depth > 256) return jfail(j, "nesting too deep");
    jws(j);
    if (j->i >= j->n) return jfail(j, "unexpected end");
    char c = j->s[j->i];
    if (c == '{') {
        j->i++;
        *out = tv_dict_new(j->a, 0);
        if (out->t != TV_DICT) return jfail(j, "out of memory");
        jws(j);
        if (j->i < j->n && j->s[j->i] == '}') {
            j->i++;
            return true;
        }
        for (;;) {
            jws(j);
            if (j->i >= j->n || j->s[j->i] != '"') return jfail(j, "expected a string key");
            tv k, v;
            if (!jstring(j, &k)) return false;
            jws(j);
            if (j->i >= j->n || j->s[j->i] != ':') return jfail(j, "expected ':'");
            j->i++;
            if (!jvalue(j, &v, depth + 1)) return false;
            if (!tv_dict_set(j->a, out, k, v)) return jfail(j, "out of memory");
            jws(j);
            if (j->i < j->n && j->s[j->i] == ',') {
                j->i++;
                continue;
            }
            if (j->i < j->n && j->s[j->i] == '}') {
                j->i++;
                return true;
            }
            return jfail(j, "expected ',' or '}'");
        }
    }
    if (c == '[') {
        j->i++;
        *out = tv_list_new(j->a, 0);
        if (out->t != TV_LIST) return jfail(j, "out of memory");
        jws(j);
        if (j->i < j->n && j->s[j->i] == ']') {
            j->i++;
            return true;
        }
        for (;;) {
            tv v;
            if (!jvalue(j, &v, depth + 1)) return false;
            if (!tv_list_push(j->a, out, v)) return jfail(j, "out of memory");
            jws(j);
            if (j->i < j->n && j->s[j->i] == ',') {
                j->i++;
                continue;
            }
            if (j->i < j->n && j->s[j->i] == ']') {
                j->i++;
                return true;
            }
            return jfail(j, "expected ',' or ']'");
        }
    }
    if (c == '"') return jstring(j, out);
    if (c == '-' || (c >= '0' && c <= '9')) return jnumber(j, out);
    if (j->n - j->i >= 4 && memcmp(j->s + j->i, "true", 4) == 0) { j->i += 4; *out = tv_bool(true); return true; }
    if (j->n - j->i >= 5 && memcmp(j->s + j->i, "false", 5) == 0) { j->i += 5; *out = tv_bool(false); return true; }
    if (j->n - j->i >= 4 && memcmp(j->s + j->i, "null", 4) == 0) { j->i += 4; *out = tv_none(); return true; }
    return jfail(j, "unexpected character");
}

bool tv_from_json(tmpl_arena *a, const char *s, size_t n, tv *out, char *err, size_t errcap) {
    jparse j = {a, s, n, 0, err, errcap};
    if (!jvalue(&j, out, 0)) return false;
    jws(&j);
    if (j.i != n) return jfail(&j, "trailing characters");
    return true;
}

/* ------------------------------------------------------------------ JSON out */

static bool json_str(tbuf *b, const char *s, size_t n, bool ascii) {
    bool ok = tbuf_putc(b, '"');
    for (size_t i = 0; i < n && ok;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') ok = tbuf_put(b, "\\\"", 2);
        else if (c == '\\') ok = tbuf_put(b, "\\\\", 2);
        else if (c == '\n') ok = tbuf_put(b, "\\n", 2);
        else if (c == '\r') ok = tbuf_put(b, "\\r", 2);
        else if (c == '\t') ok = tbuf_put(b, "\\t", 2);
        else if (c == '\b') ok = tbuf_put(b, "\\b", 2);
        else if (c == '\f') ok = tbuf_put(b, "\\f", 2);
        else if (c < 0x20 || (ascii && c == 0x7f)) ok = tbuf_printf(b, "\\u%04x", c);
        else if (c < 0x80 || !ascii) {
            ok = tbuf_putc(b, (char)c);
            i++;
            continue;
        } else {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                ok = tbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                ok = tbuf_printf(b, "\\u%04x", cp);
            }
            i += k;
            continue;
        }
        i++;
    }
    return ok && tbuf_putc(b, '"');
}

static bool json_newline(tbuf *b, const tjson_opts *o, int level) {
    if (!o->has_indent) return true;
    bool ok = tbuf_putc(b, '\n');
    for (int k = 0; k < level && ok; k++) ok = tbuf_put(b, o->indent, strlen(o->indent));
    return ok;
}

static int json_fail_type(tmpl_ctx *c, const tnode *at, tv v) {
    return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "Object of type %s is not JSON serializable", tv_typename(v));
}

/* A dict key as json.dumps converts it, or false for a key type it rejects. */
static bool json_key(tbuf *b, tv k, bool ascii) {
    char tmp[64];
    switch (k.t) {
    case TV_STR: return json_str(b, k.u.s->s, k.u.s->len, ascii);
    case TV_BOOL: return tbuf_put(b, k.u.b ? "\"true\"" : "\"false\"", k.u.b ? 6 : 7);
    case TV_NONE: return tbuf_put(b, "\"null\"", 6);
    case TV_INT: return tbuf_printf(b, "\"%lld\"", (long long)k.u.i);
    case TV_FLOAT:
        if (isnan(k.u.f)) return tbuf_put(b, "\"NaN\"", 5);
        if (isinf(k.u.f)) return tbuf_put(b, k.u.f < 0 ? "\"-Infinity\"" : "\"Infinity\"", k.u.f < 0 ? 11 : 10);
        tv_format_float(k.u.f, tmp, sizeof tmp);
        return tbuf_printf(b, "\"%s\"", tmp);
    default: return false;
    }
}

int tv_write_json(tmpl_ctx *c, const tnode *at, tbuf *b, tv v, const tjson_opts *o, int depth) {
    char tmp[64];
    bool ok = true;
    if (depth > 256) return tmpl_fail(c, at, LM_ERR_LIMIT, "tojson: value nested too deeply");
    switch (v.t) {
    case TV_NONE: ok = tbuf_put(b, "null", 4); break;
    case TV_BOOL: ok = v.u.b ? tbuf_put(b, "true", 4) : tbuf_put(b, "false", 5); break;
    case TV_INT: ok = tbuf_printf(b, "%lld", (long long)v.u.i); break;
    case TV_FLOAT:
        if (isnan(v.u.f)) ok = tbuf_put(b, "NaN", 3);
        else if (isinf(v.u.f)) ok = v.u.f < 0 ? tbuf_put(b, "-Infinity", 9) : tbuf_put(b, "Infinity", 8);
        else {
            tv_format_float(v.u.f, tmp, sizeof tmp);
            ok = tbuf_put(b, tmp, strlen(tmp));
        }
        break;
    case TV_STR: ok = json_str(b, v.u.s->s, v.u.s->len, o->ensure_ascii); break;
    case TV_LIST:
        if (v.flags & (TVF_GEN | TVF_RANGE)) return json_fail_type(c, at, v);
        if (v.u.l->n == 0) {
            ok = tbuf_put(b, "[]", 2);
            break;
        }
        ok = tbuf_putc(b, '[') && json_newline(b, o, depth + 1);
        for (size_t i = 0; i < v.u.l->n && ok; i++) {
            if (i) ok = tbuf_put(b, o->item_sep, strlen(o->item_sep)) && json_newline(b, o, depth + 1);
            if (ok && tv_write_json(c, at, b, v.u.l->v[i], o, depth + 1)) return -1;
        }
        ok = ok && json_newline(b, o, depth) && tbuf_putc(b, ']');
        break;
    case TV_DICT: {
        tdict *d = v.u.d;
        if (d->n == 0) {
            ok = tbuf_put(b, "{}", 2);
            break;
        }
        size_t *order = NULL;
        size_t stack_order[32];
        order = d->n <= 32 ? stack_order : malloc(d->n * sizeof *order);
        if (!order) return tmpl_fail(c, at, LM_ERR_NO_MEMORY, "out of memory");
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {
            for (size_t i = 1; i < d->n; i++) { /* insertion sort: dicts here are small */
                size_t x = order[i], k = i;
                while (k > 0) {
                    int cmp = 0;
                    if (!tv_compare(d->k[order[k - 1]], d->k[x], &cmp)) {
                        if (order != stack_order) free(order);
                        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "tojson: sort_keys needs keys of one type");
                    }
                    if (cmp <= 0) break;
                    order[k] = order[k - 1];
                    k--;
                }
                order[k] = x;
            }
        }
        ok = tbuf_putc(b, '{') && json_newline(b, o, depth + 1);
        int rc = 0;
        for (size_t i = 0; i < d->n && ok && rc == 0; i++) {
            if (i) ok = tbuf_put(b, o->item_sep, strlen(o->item_sep)) && json_newline(b, o, depth + 1);
            tv k = d->k[order[i]];
            if (ok && !json_key(b, k, o->ensure_ascii)) {
                if (b->failed) break;
                rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "keys must be str, int, float, bool or None, not %s",
                               tv_typename(k));
                break;
            }
            ok = ok && tbuf_put(b, o->key_sep, strlen(o->key_sep));
            if (ok && tv_write_json(c, at, b, d->v[order[i]], o, depth + 1)) rc = -1;
        }
        if (order != stack_order) free(order);
        if (rc) return -1;
        ok = ok && json_newline(b, o, depth) && tbuf_putc(b, '}');
        break;
    }
    default: return json_fail_type(c, at, v);
    }
    if (!ok) return tmpl_fail(c, at, LM_ERR_LIMIT, "tojson: output too large");
    return 0;
}
