/* Built-ins: jinja2's filters and tests, Python's str / dict / list methods that templates call,
 * and the globals (range, namespace, dict, raise_exception, strftime_now). Each follows the
 * Python behaviour that jinja2 3.1 has, including its quirks (case-insensitive sort / unique /
 * dictsort, select/map results being generators, round() rounding half to even). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/template/tmpl_internal.h"

/* ------------------------------------------------------------------ helpers */

typedef struct targs {
    int nargs;
    const tv *args;
    int nkw;
    const char **kwnames;
    const tv *kwvals;
} targs;

/* The argument at position `pos` (after the filter's operand), or named `name`; NULL if absent. */
static const tv *arg(const targs *a, int pos, const char *name) {
    if (pos >= 0 && pos < a->nargs) return &a->args[pos];
    for (int i = 0; i < a->nkw; i++)
        if (name && strcmp(a->kwnames[i], name) == 0) return &a->kwvals[i];
    return NULL;
}

static int oomc(tmpl_ctx *c, const tnode *at) {
    if (c->arena.over_cap)
        return tmpl_fail(c, at, LM_ERR_LIMIT, "rendering needs more than %zu bytes of memory", c->arena.cap);
    return tmpl_fail(c, at, LM_ERR_NO_MEMORY, "out of memory");
}

static int mkstr(tmpl_ctx *c, const tnode *at, const char *s, size_t n, tv *out) {
    *out = tv_str(&c->arena, s, n);
    return out->t == TV_STR ? 0 : oomc(c, at);
}

static int from_buf(tmpl_ctx *c, const tnode *at, tbuf *b, tv *out) {
    int rc;
    if (b->failed) rc = tmpl_fail(c, at, LM_ERR_LIMIT, "string larger than the render's memory limit");
    else rc = mkstr(c, at, b->p ? b->p : "", b->n, out);
    free(b->p);
    return rc;
}

/* str(v) as bytes; for non-strings a temporary in the arena */
static int as_str(tmpl_ctx *c, const tnode *at, tv v, const char **s, size_t *n) {
    tv t = tv_to_str(c, v);
    if (t.t != TV_STR) return oomc(c, at);
    *s = t.u.s->s;
    *n = t.u.s->len;
    return 0;
}

static bool arg_true(const tv *v, bool def) { return v ? tv_truthy(*v) : def; }

static int need_str(tmpl_ctx *c, const tnode *at, const tv *v, const char *what) {
    if (!v || v->t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s must be a string", what);
    return 0;
}

static uint32_t lower_cp(uint32_t cp) {
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    if ((cp >= 0xc0 && cp <= 0xde && cp != 0xd7)) return cp + 32;
    if (cp >= 0x391 && cp <= 0x3a9 && cp != 0x3a2) return cp + 32;
    if (cp >= 0x410 && cp <= 0x42f) return cp + 32;
    if (cp >= 0x400 && cp <= 0x40f) return cp + 80;
    return cp;
}
static uint32_t upper_cp(uint32_t cp) {
    if (cp >= 'a' && cp <= 'z') return cp - 32;
    if ((cp >= 0xe0 && cp <= 0xfe && cp != 0xf7)) return cp - 32;
    if (cp >= 0x3b1 && cp <= 0x3c9 && cp != 0x3c2) return cp - 32;
    if (cp >= 0x430 && cp <= 0x44f) return cp - 32;
    if (cp >= 0x450 && cp <= 0x45f) return cp - 80;
    return cp;
}
static bool cased_cp(uint32_t cp) { return lower_cp(cp) != cp || upper_cp(cp) != cp; }

static void put_cp(tbuf *b, uint32_t cp) {
    char o[4];
    size_t k = 0;
    if (cp < 0x80) o[k++] = (char)cp;
    else if (cp < 0x800) { o[k++] = (char)(0xc0 | (cp >> 6)); o[k++] = (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) { o[k++] = (char)(0xe0 | (cp >> 12)); o[k++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[k++] = (char)(0x80 | (cp & 0x3f)); }
    else { o[k++] = (char)(0xf0 | (cp >> 18)); o[k++] = (char)(0x80 | ((cp >> 12) & 0x3f)); o[k++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[k++] = (char)(0x80 | (cp & 0x3f)); }
    tbuf_put(b, o, k);
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' Python str.title */
static int case_map(tmpl_ctx *c, const tnode *at, const char *s, size_t n, char mode, tv *out) {
    tbuf b = {.limit = c->lim->max_memory};
    bool first = true, prev_cased = false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
        uint32_t o = cp;
        if (mode == 'u') o = upper_cp(cp);
        else if (mode == 'l') o = lower_cp(cp);
        else if (mode == 'c') o = first ? upper_cp(cp) : lower_cp(cp);
        else o = prev_cased ? lower_cp(cp) : upper_cp(cp);
        prev_cased = cased_cp(cp);
        first = false;
        if (o == cp) tbuf_put(&b, s + i, k);
        else put_cp(&b, o);
        i += k;
    }
    return from_buf(c, at, &b, out);
}

static bool in_strip_set(const char *set, size_t setn, uint32_t cp) {
    if (!set) return tmpl_is_space_cp(cp);
    for (size_t q = 0; q < setn;) {
        uint32_t sc;
        q += tmpl_utf8_decode(set + q, setn - q, &sc);
        if (sc == cp) return true;
    }
    return false;
}

/* Python str.strip family; chars NULL = whitespace. which: 1 left, 2 right, 3 both */
static int strip_str(tmpl_ctx *c, const tnode *at, const char *s, size_t n, const tv *chars, int which, tv *out) {
    const char *set = NULL;
    size_t setn = 0;
    if (chars && chars->t == TV_STR) set = chars->u.s->s, setn = chars->u.s->len;
    else if (chars && chars->t != TV_NONE && chars->t != TV_UNDEF)
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "strip arg must be None or str");

    size_t a = 0, e = n;
    if (which & 1) {
        while (a < e) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + a, e - a, &cp);
            if (!in_strip_set(set, setn, cp)) break;
            a += k;
        }
    }
    if (which & 2) {
        while (e > a) {
            size_t k = 1;
            while (k < e - a && k < 4 && ((unsigned char)s[e - k] & 0xc0) == 0x80) k++;
            uint32_t cp;
            tmpl_utf8_decode(s + e - k, k, &cp);
            if (!in_strip_set(set, setn, cp)) break;
            e -= k;
        }
    }
    return mkstr(c, at, s + a, e - a, out);
}

static int str_replace(tmpl_ctx *c, const tnode *at, const char *s, size_t n, tv old, tv new_, int64_t count, tv *out) {
    if (old.t != TV_STR || new_.t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "replace() arguments must be strings");
    tbuf b = {.limit = c->lim->max_memory};
    const char *o = old.u.s->s, *w = new_.u.s->s;
    size_t on = old.u.s->len, wn = new_.u.s->len;
    int64_t done = 0;
    if (on == 0) {
        size_t i = 0;
        while (i <= n) {
            if (count < 0 || done < count) {
                tbuf_put(&b, w, wn);
                done++;
            }
            if (i == n) break;
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
            tbuf_put(&b, s + i, k);
            i += k;
        }
        return from_buf(c, at, &b, out);
    }
    size_t i = 0;
    while (i < n) {
        const char *hit = (count < 0 || done < count) ? memmem(s + i, n - i, o, on) : NULL;
        if (!hit) {
            tbuf_put(&b, s + i, n - i);
            break;
        }
        tbuf_put(&b, s + i, (size_t)(hit - (s + i)));
        tbuf_put(&b, w, wn);
        i = (size_t)(hit - s) + on;
        done++;
    }
    return from_buf(c, at, &b, out);
}

/* Python str.split / rsplit */
static int str_split(tmpl_ctx *c, const tnode *at, const char *s, size_t n, const tv *sepv, int64_t maxsplit,
                     bool from_right, tv *out) {
    *out = tv_list_new(&c->arena, 0);
    if (out->t != TV_LIST) return oomc(c, at);
    if (sepv && sepv->t != TV_NONE && sepv->t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "must be str or None");
    if (!sepv || sepv->t == TV_NONE) {
        /* runs of whitespace; from_right only changes which splits maxsplit keeps */
        size_t starts[2][1]; (void)starts;
        tv parts = tv_list_new(&c->arena, 0);
        if (parts.t != TV_LIST) return oomc(c, at);
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
            if (tmpl_is_space_cp(cp)) { i += k; continue; }
            size_t st = i;
            while (i < n) {
                k = tmpl_utf8_decode(s + i, n - i, &cp);
                if (tmpl_is_space_cp(cp)) break;
                i += k;
            }
            tv w = tv_str(&c->arena, s + st, i - st);
            if (w.t != TV_STR || !tv_list_push(&c->arena, &parts, w)) return oomc(c, at);
        }
        size_t np = parts.u.l->n;
        if (maxsplit < 0 || (uint64_t)maxsplit >= np) {
            *out = parts;
            return 0;
        }
        /* keep maxsplit splits: the rest stays joined with its original whitespace */
        if (!from_right) {
            size_t i2 = 0, got = 0;
            while (got < (size_t)maxsplit) {
                uint32_t cp;
                size_t k;
                while (i2 < n && (k = tmpl_utf8_decode(s + i2, n - i2, &cp), tmpl_is_space_cp(cp))) i2 += k;
                size_t st = i2;
                while (i2 < n && (k = tmpl_utf8_decode(s + i2, n - i2, &cp), !tmpl_is_space_cp(cp))) i2 += k;
                tv w = tv_str(&c->arena, s + st, i2 - st);
                if (w.t != TV_STR || !tv_list_push(&c->arena, out, w)) return oomc(c, at);
                got++;
            }
            uint32_t cp;
            size_t k;
            while (i2 < n && (k = tmpl_utf8_decode(s + i2, n - i2, &cp), tmpl_is_space_cp(cp))) i2 += k;
            size_t e = n;
            tv w = tv_str(&c->arena, s + i2, e - i2);
            if (w.t != TV_STR || !tv_list_push(&c->arena, out, w)) return oomc(c, at);
            return 0;
        }
        return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "rsplit() on whitespace with maxsplit is not supported");
    }
    const char *sep = sepv->u.s->s;
    size_t sn = sepv->u.s->len;
    if (sn == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(s + i, n - i, sep, sn) : NULL;
            size_t e = hit ? (size_t)(hit - s) : n;
            tv w = tv_str(&c->arena, s + i, e - i);
            if (w.t != TV_STR || !tv_list_push(&c->arena, out, w)) return oomc(c, at);
            if (!hit) break;
            i = e + sn;
            done++;
        }
        return 0;
    }
    /* rsplit: collect from the right, then reverse */
    tv rev = tv_list_new(&c->arena, 0);
    if (rev.t != TV_LIST) return oomc(c, at);
    size_t e = n;
    int64_t done = 0;
    for (;;) {
        const char *hit = NULL;
        if ((maxsplit < 0 || done < maxsplit) && e >= sn)
            for (size_t k = e - sn + 1; k-- > 0;)
                if (memcmp(s + k, sep, sn) == 0) { hit = s + k; break; }
        size_t st = hit ? (size_t)(hit - s) + sn : 0;
        tv w = tv_str(&c->arena, s + st, e - st);
        if (w.t != TV_STR || !tv_list_push(&c->arena, &rev, w)) return oomc(c, at);
        if (!hit) break;
        e = (size_t)(hit - s);
        done++;
    }
    for (size_t k = rev.u.l->n; k-- > 0;)
        if (!tv_list_push(&c->arena, out, rev.u.l->v[k])) return oomc(c, at);
    return 0;
}

/* Python str.splitlines (keepends False) */
static int split_lines(tmpl_ctx *c, const tnode *at, const char *s, size_t n, tv *out) {
    *out = tv_list_new(&c->arena, 0);
    if (out->t != TV_LIST) return oomc(c, at);
    size_t st = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
        bool br = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!br) {
            i += k;
            continue;
        }
        tv w = tv_str(&c->arena, s + st, i - st);
        if (w.t != TV_STR || !tv_list_push(&c->arena, out, w)) return oomc(c, at);
        i += k;
        if (cp == '\r' && i < n && s[i] == '\n') i++;
        st = i;
    }
    if (st < n) {
        tv w = tv_str(&c->arena, s + st, n - st);
        if (w.t != TV_STR || !tv_list_push(&c->arena, out, w)) return oomc(c, at);
    }
    return 0;
}

/* ------------------------------------------------------------------ attribute paths (map, sort, ...) */

static int get_path(tmpl_ctx *c, const tnode *at, tv obj, tv attr, tv *out) {
    if (attr.t != TV_STR) return tmpl_getitem(c, at, obj, attr, out);
    const char *p = attr.u.s->s;
    *out = obj;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        bool digits = len > 0;
        for (size_t i = 0; i < len; i++) digits = digits && isdigit((unsigned char)p[i]);
        tv key;
        if (digits) key = tv_int(strtoll(p, NULL, 10));
        else {
            key = tv_str(&c->arena, p, len);
            if (key.t != TV_STR) return oomc(c, at);
        }
        if (tmpl_getitem(c, at, *out, key, out)) return -1;
        if (!dot) return 0;
        p = dot + 1;
    }
}

/* ------------------------------------------------------------------ sorting */

typedef struct sort_item { tv key; tv val; size_t idx; } sort_item;

static int key_cmp(tmpl_ctx *c, const tnode *at, tv a, tv b, bool *err) {
    int r;
    if (!tv_compare(a, b, &r)) {
        if (!*err)
            tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'<' not supported between instances of '%s' and '%s'", tv_typename(a),
                      tv_typename(b));
        *err = true;
        return 0;
    }
    return r == 2 ? 0 : r;
}

/* stable merge sort (Python's sort is stable) */
static void merge_sort(tmpl_ctx *c, const tnode *at, sort_item *v, sort_item *tmp, size_t n, bool rev, bool *err) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, at, v, tmp, h, rev, err);
    merge_sort(c, at, v + h, tmp, n - h, rev, err);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = key_cmp(c, at, v[j].key, v[i].key, err);
        if (rev) r = -r;
        if (r < 0) tmp[k++] = v[j++];
        else tmp[k++] = v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static tv fold_key(tmpl_ctx *c, const tnode *at, tv k, bool case_sensitive) {
    if (case_sensitive || k.t != TV_STR) return k;
    tv o;
    if (case_map(c, at, k.u.s->s, k.u.s->len, 'l', &o)) return k;
    return o;
}

static int sorted_list(tmpl_ctx *c, const tnode *at, tv items, const tv *attr, bool case_sensitive, bool rev, tv *out) {
    size_t n = items.u.l->n;
    sort_item *v = malloc((n + 1) * sizeof *v), *tmp = malloc((n + 1) * sizeof *tmp);
    if (!v || !tmp) {
        free(v);
        free(tmp);
        return oomc(c, at);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        v[i].val = items.u.l->v[i];
        v[i].idx = i;
        tv k = v[i].val;
        if (attr && attr->t != TV_NONE && get_path(c, at, k, *attr, &k)) rc = -1;
        v[i].key = fold_key(c, at, k, case_sensitive);
    }
    bool err = false;
    if (rc == 0) merge_sort(c, at, v, tmp, n, rev, &err);
    if (err) rc = -1;
    if (rc == 0) {
        *out = tv_list_new(&c->arena, n);
        if (out->t != TV_LIST) rc = oomc(c, at);
        else {
            for (size_t i = 0; i < n; i++) out->u.l->v[i] = v[i].val;
            out->u.l->n = n;
        }
    }
    free(v);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------ tests */

bool tmpl_test_exists(const char *name) {
    static const char *const names[] = {
        "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
        "iterable", "sequence", "callable", "sameas", "escaped", "in", "odd", "even", "divisibleby", "eq", "equalto",
        "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "lessthan", "greaterthan", "lower", "upper",
        "filter", "test", NULL};
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return true;
    return false;
}

int tmpl_test(tmpl_ctx *c, const tnode *at, const char *name, tv v, int nargs, const tv *args, bool *out) {
    const tv *a0 = nargs > 0 ? &args[0] : NULL;
#define IS(s) (strcmp(name, s) == 0)
    if (IS("defined")) *out = v.t != TV_UNDEF;
    else if (IS("undefined")) *out = v.t == TV_UNDEF;
    else if (IS("none")) *out = v.t == TV_NONE;
    else if (IS("boolean")) *out = v.t == TV_BOOL;
    else if (IS("false")) *out = v.t == TV_BOOL && !v.u.b;
    else if (IS("true")) *out = v.t == TV_BOOL && v.u.b;
    else if (IS("integer")) *out = v.t == TV_INT;
    else if (IS("float")) *out = v.t == TV_FLOAT;
    else if (IS("number")) *out = tv_is_number(v);
    else if (IS("string")) *out = v.t == TV_STR;
    else if (IS("mapping")) *out = v.t == TV_DICT;
    else if (IS("iterable")) *out = v.t == TV_UNDEF || v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT;
    else if (IS("sequence")) *out = v.t == TV_UNDEF || v.t == TV_STR || (v.t == TV_LIST && !(v.flags & TVF_GEN)) || v.t == TV_DICT;
    else if (IS("callable")) *out = v.t == TV_FUNC;
    else if (IS("escaped")) *out = (v.flags & TVF_SAFE) != 0;
    else if (IS("lower") || IS("upper")) {
        const char *s;
        size_t n;
        if (as_str(c, at, v, &s, &n)) return -1;
        bool any = false, ok = true;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += tmpl_utf8_decode(s + i, n - i, &cp);
            if (!cased_cp(cp)) continue;
            any = true;
            if (IS("lower") ? lower_cp(cp) != cp : upper_cp(cp) != cp) ok = false;
        }
        *out = any && ok;
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        /* value % 2 == 1 / value % 2 == 0 / value % num == 0, with Python's % */
        tv m;
        if (IS("divisibleby") && !a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "divisibleby needs an argument");
        if (tmpl_binop(c, at, OP_MOD, v, IS("divisibleby") ? *a0 : tv_int(2), &m)) return -1;
        *out = tv_equal(m, tv_int(IS("odd") ? 1 : 0));
    } else if (IS("filter")) {
        *out = v.t == TV_STR && tmpl_filter_exists(v.u.s->s);
    } else if (IS("test")) {
        *out = v.t == TV_STR && tmpl_test_exists(v.u.s->s);
    } else if (IS("sameas")) {
        if (!a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "sameas needs an argument");
        if (v.t != a0->t) *out = false;
        else if (v.t == TV_NONE || v.t == TV_UNDEF) *out = true;
        else if (v.t == TV_BOOL) *out = v.u.b == a0->u.b;
        else if (v.t == TV_INT) *out = v.u.i == a0->u.i && v.u.i >= -5 && v.u.i <= 256;
        else *out = v.u.s == a0->u.s; /* identity of the heap object */
    } else {
        int op = 0;
        if (IS("eq") || IS("equalto") || IS("==")) op = OP_EQ;
        else if (IS("ne") || IS("!=")) op = OP_NE;
        else if (IS("lt") || IS("<") || IS("lessthan")) op = OP_LT;
        else if (IS("le") || IS("<=")) op = OP_LE;
        else if (IS("gt") || IS(">") || IS("greaterthan")) op = OP_GT;
        else if (IS("ge") || IS(">=")) op = OP_GE;
        else if (IS("in")) op = OP_IN;
        else return -2;
        if (!a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "test '%s' needs an argument", name);
        if (op == OP_EQ) *out = tv_equal(v, *a0);
        else if (op == OP_NE) *out = !tv_equal(v, *a0);
        else if (op == OP_IN) {
            tv items;
            if (a0->t == TV_STR) {
                if (v.t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'in <string>' requires string as left operand");
                *out = v.u.s->len == 0 || memmem(a0->u.s->s, a0->u.s->len, v.u.s->s, v.u.s->len) != NULL;
            } else if (a0->t == TV_DICT) {
                *out = tv_dict_get(a0->u.d, v) != NULL;
            } else {
                if (tmpl_iterate(c, at, *a0, &items)) return -1;
                *out = false;
                for (size_t i = 0; i < items.u.l->n; i++)
                    if (tv_equal(v, items.u.l->v[i])) { *out = true; break; }
            }
        } else {
            int r;
            if (!tv_compare(v, *a0, &r))
                return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", name,
                                 tv_typename(v), tv_typename(*a0));
            *out = r == 2 ? false : op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
        }
    }
#undef IS
    return 0;
}

/* ------------------------------------------------------------------ filters */

static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL};

bool tmpl_filter_exists(const char *name) {
    for (int i = 0; filter_names[i]; i++)
        if (strcmp(filter_names[i], name) == 0) return true;
    return false;
}

static int length_of(tmpl_ctx *c, const tnode *at, tv v, int64_t *n) {
    switch (v.t) {
    case TV_UNDEF: *n = 0; return 0;
    case TV_STR: *n = (int64_t)tmpl_utf8_count(v.u.s->s, v.u.s->len); return 0;
    case TV_LIST:
        if (v.flags & TVF_GEN) break;
        *n = (int64_t)v.u.l->n;
        return 0;
    case TV_DICT: *n = (int64_t)v.u.d->n; return 0;
    default: break;
    }
    return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "object of type '%s' has no len()", tv_typename(v));
}

/* select / reject / selectattr / rejectattr */
static int select_items(tmpl_ctx *c, const tnode *at, tv val, const targs *a, bool by_attr, bool keep_if, tv *out) {
    tv items;
    if (!tv_truthy(val)) val = tv_undef(NULL); /* jinja2 iterates only a truthy value */
    if (tmpl_iterate(c, at, val, &items)) return -1;
    int first = 0;
    const tv *attr = NULL;
    if (by_attr) {
        attr = arg(a, 0, NULL);
        if (!attr) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "missing parameter for attribute name");
        first = 1;
    }
    const tv *tname = arg(a, first, NULL);
    if (tname && tname->t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "test name must be a string");
    *out = tv_list_new(&c->arena, 0);
    if (out->t != TV_LIST) return oomc(c, at);
    out->flags = TVF_GEN;
    int targc = a->nargs - first - 1;
    const tv *targv = targc > 0 ? a->args + first + 1 : NULL;
    if (targc < 0) targc = 0;
    for (size_t i = 0; i < items.u.l->n; i++) {
        tv item = items.u.l->v[i], probe = item;
        if (attr && get_path(c, at, item, *attr, &probe)) return -1;
        bool r;
        if (tname) {
            int rc = tmpl_test(c, at, tname->u.s->s, probe, targc, targv, &r);
            if (rc == -2) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "no test named '%s'", tname->u.s->s);
            if (rc) return -1;
        } else {
            r = tv_truthy(probe);
        }
        if (r == keep_if && !tv_list_push(&c->arena, out, item)) return oomc(c, at);
    }
    return 0;
}

static int do_round(tmpl_ctx *c, const tnode *at, tv v, const targs *a, tv *out) {
    const tv *pv = arg(a, 0, "precision"), *mv = arg(a, 1, "method");
    int64_t prec = pv && pv->t == TV_INT ? pv->u.i : 0;
    const char *method = mv && mv->t == TV_STR ? mv->u.s->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "method must be common, ceil or floor");
    if (!tv_is_number(v)) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "round() needs a number, not %s", tv_typename(v));
    if (strcmp(method, "common") == 0 && v.t != TV_FLOAT && (!pv || prec >= 0)) {
        *out = v.t == TV_BOOL ? tv_int(v.u.b) : v;
        return 0;
    }
    double x = v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : (double)v.u.b;
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    if (strcmp(method, "common") == 0) {
        if (!isfinite(x)) *out = tv_float(x);
        else if (prec == 0) *out = tv_float(nearbyint(x));
        else if (prec > 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = tv_float(strtod(buf, NULL));
        } else {
            double m = pow(10.0, (double)-prec);
            *out = tv_float(nearbyint(x / m) * m);
        }
        return 0;
    }
    double m = pow(10.0, (double)prec);
    *out = tv_float((strcmp(method, "ceil") == 0 ? ceil(x * m) : floor(x * m)) / m);
    return 0;
}

/* Python int(str): optional sign, digits with underscores, surrounding whitespace */
static bool parse_py_int(const char *s, size_t n, int base, int64_t *out) {
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    while (n > i && isspace((unsigned char)s[n - 1])) n--;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i >= n) return false;
    if (n - i > 2 && s[i] == '0') { /* 0x / 0o / 0b, allowed when the base matches or is 0 */
        char p = (char)tolower((unsigned char)s[i + 1]);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) {
            base = pb;
            i += 2;
            if (i < n && s[i] == '_') i++;
        }
    }
    if (base == 0) base = 10;
    int64_t v = 0;
    bool prev_us = true;
    for (; i < n; i++) {
        if (s[i] == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int d = isdigit((unsigned char)s[i]) ? s[i] - '0' : isalpha((unsigned char)s[i]) ? tolower((unsigned char)s[i]) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
        prev_us = false;
    }
    if (prev_us) return false;
    *out = neg ? -v : v;
    return true;
}

static bool parse_py_float(const char *s, size_t n, double *out) {
    char buf[128];
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    while (n > i && isspace((unsigned char)s[n - 1])) n--;
    if (n - i == 0 || n - i >= sizeof buf) return false;
    size_t k = 0;
    for (; i < n; i++)
        if (s[i] != '_') buf[k++] = s[i];
    buf[k] = '\0';
    char *e;
    double d = strtod(buf, &e);
    if (*e || (k >= 2 && (buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X')))) return false;
    *out = d;
    return true;
}

static int do_indent(tmpl_ctx *c, const tnode *at, tv v, const targs *a, tv *out) {
    const tv *wv = arg(a, 0, "width"), *fv = arg(a, 1, "first"), *bv = arg(a, 2, "blank");
    const char *ind = "    ";
    size_t indn = 4;
    char spaces[256];
    if (wv && wv->t == TV_STR) ind = wv->u.s->s, indn = wv->u.s->len;
    else if (wv && (wv->t == TV_INT || wv->t == TV_BOOL)) {
        int64_t w = wv->t == TV_INT ? wv->u.i : wv->u.b;
        if (w < 0) w = 0;
        if (w > (int64_t)sizeof spaces) return tmpl_fail(c, at, LM_ERR_LIMIT, "indent width too large");
        memset(spaces, ' ', (size_t)w);
        ind = spaces;
        indn = (size_t)w;
    }
    if (v.t != TV_STR) /* jinja2 appends "\n" to the value: only strings survive that */
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "indent needs a string, not %s", tv_typename(v));
    const char *s = v.u.s->s;
    size_t n = v.u.s->len;
    tbuf tmp = {.limit = c->lim->max_memory};
    tbuf_put(&tmp, s, n);
    tbuf_putc(&tmp, '\n');
    if (tmp.failed) {
        free(tmp.p);
        return oomc(c, at);
    }
    tv lines;
    int rc = split_lines(c, at, tmp.p, tmp.n, &lines);
    free(tmp.p);
    if (rc) return -1;
    tbuf b = {.limit = c->lim->max_memory};
    if (arg_true(fv, false)) tbuf_put(&b, ind, indn);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        tstr *ln = lines.u.l->v[i].u.s;
        if (i) {
            tbuf_putc(&b, '\n');
            if (arg_true(bv, false) || ln->len) tbuf_put(&b, ind, indn);
        }
        tbuf_put(&b, ln->s, ln->len);
    }
    return from_buf(c, at, &b, out);
}

static int do_tojson(tmpl_ctx *c, const tnode *at, tv v, const targs *a, tv *out) {
    const tv *ea = arg(a, 0, "ensure_ascii"), *iv = arg(a, 1, "indent"), *sv = arg(a, 2, "separators"),
             *sk = arg(a, 3, "sort_keys");
    tjson_opts o = {.ensure_ascii = arg_true(ea, false), .item_sep = ", ", .key_sep = ": ", .sort_keys = arg_true(sk, false)};
    char spaces[129];
    if (iv && iv->t != TV_NONE) {
        o.has_indent = true;
        o.item_sep = ",";
        if (iv->t == TV_STR) o.indent = iv->u.s->s;
        else if (iv->t == TV_INT || iv->t == TV_BOOL) {
            int64_t w = iv->t == TV_INT ? iv->u.i : iv->u.b;
            if (w < 0) w = 0;
            if (w > 128) return tmpl_fail(c, at, LM_ERR_LIMIT, "tojson indent too large");
            memset(spaces, ' ', (size_t)w);
            spaces[w] = '\0';
            o.indent = spaces;
        } else {
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "tojson indent must be an integer or a string");
        }
    }
    if (sv && sv->t != TV_NONE) {
        if (sv->t != TV_LIST || sv->u.l->n != 2 || sv->u.l->v[0].t != TV_STR || sv->u.l->v[1].t != TV_STR)
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "tojson separators must be a pair of strings");
        o.item_sep = sv->u.l->v[0].u.s->s;
        o.key_sep = sv->u.l->v[1].u.s->s;
    }
    tbuf b = {.limit = c->lim->max_memory};
    if (tv_write_json(c, at, &b, v, &o, 0)) {
        free(b.p);
        return -1;
    }
    return from_buf(c, at, &b, out);
}

static int html_escape(tmpl_ctx *c, const tnode *at, tv v, tv *out) {
    if (v.flags & TVF_SAFE) {
        *out = v;
        return 0;
    }
    const char *s = "";
    size_t n = 0;
    if (as_str(c, at, v, &s, &n)) return -1;
    tbuf b = {.limit = c->lim->max_memory};
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&': tbuf_put(&b, "&amp;", 5); break;
        case '<': tbuf_put(&b, "&lt;", 4); break;
        case '>': tbuf_put(&b, "&gt;", 4); break;
        case '"': tbuf_put(&b, "&#34;", 5); break;
        case '\'': tbuf_put(&b, "&#39;", 5); break;
        default: tbuf_putc(&b, s[i]);
        }
    }
    if (from_buf(c, at, &b, out)) return -1;
    out->flags = TVF_SAFE;
    return 0;
}

static int min_max(tmpl_ctx *c, const tnode *at, tv v, const targs *a, bool want_max, tv *out) {
    tv items;
    if (tmpl_iterate(c, at, v, &items)) return -1;
    const tv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    if (items.u.l->n == 0) {
        *out = tv_undef("No aggregated item, sequence was empty.");
        return 0;
    }
    tv best = items.u.l->v[0], bestk = best;
    if (attr && attr->t != TV_NONE && get_path(c, at, best, *attr, &bestk)) return -1;
    bestk = fold_key(c, at, bestk, arg_true(cs, false));
    for (size_t i = 1; i < items.u.l->n; i++) {
        tv k = items.u.l->v[i];
        if (attr && attr->t != TV_NONE && get_path(c, at, k, *attr, &k)) return -1;
        k = fold_key(c, at, k, arg_true(cs, false));
        int r;
        if (!tv_compare(k, bestk, &r))
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'<' not supported between instances of '%s' and '%s'",
                             tv_typename(k), tv_typename(bestk));
        if (r != 2 && (want_max ? r > 0 : r < 0)) {
            best = items.u.l->v[i];
            bestk = k;
        }
    }
    *out = best;
    return 0;
}

int tmpl_filter(tmpl_ctx *c, const tnode *at, const char *name, tv v, int nargs, const tv *args, int nkw,
                const char **kwnames, const tv *kwvals, tv *out) {
    targs a = {nargs, args, nkw, kwnames, kwvals};
    const char *s = "";
    size_t n = 0;
#define IS(x) (strcmp(name, x) == 0)
    if (IS("default") || IS("d")) {
        const tv *dv = arg(&a, 0, "default_value"), *bv = arg(&a, 1, "boolean");
        bool use = v.t == TV_UNDEF || (arg_true(bv, false) && !tv_truthy(v));
        if (use) {
            if (dv) *out = *dv;
            else return mkstr(c, at, "", 0, out);
        } else {
            *out = v;
        }
        return 0;
    }
    if (IS("length") || IS("count")) {
        int64_t len = 0;
        if (length_of(c, at, v, &len)) return -1;
        *out = tv_int(len);
        return 0;
    }
    if (IS("tojson")) return do_tojson(c, at, v, &a, out);
    if (IS("string")) {
        if (v.t == TV_STR) {
            *out = v;
            return 0;
        }
        if (as_str(c, at, v, &s, &n)) return -1;
        return mkstr(c, at, s, n, out);
    }
    if (IS("safe")) {
        if (v.t != TV_STR) {
            if (as_str(c, at, v, &s, &n) || mkstr(c, at, s, n, out)) return -1;
        } else {
            *out = v;
        }
        out->flags |= TVF_SAFE;
        return 0;
    }
    if (IS("escape") || IS("e") || IS("forceescape")) {
        if (IS("forceescape")) v.flags &= (uint8_t)~TVF_SAFE;
        return html_escape(c, at, v, out);
    }
    if (IS("trim")) {
        if (as_str(c, at, v, &s, &n)) return -1;
        return strip_str(c, at, s, n, arg(&a, 0, "chars"), 3, out);
    }
    if (IS("upper") || IS("lower") || IS("capitalize")) {
        if (as_str(c, at, v, &s, &n)) return -1;
        return case_map(c, at, s, n, IS("upper") ? 'u' : IS("lower") ? 'l' : 'c', out);
    }
    if (IS("title")) {
        /* jinja2: words split at runs of [-\s({[<], each word's first char upper, the rest lower */
        if (as_str(c, at, v, &s, &n)) return -1;
        tbuf b = {.limit = c->lim->max_memory};
        bool word_start = true;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
            bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tmpl_is_space_cp(cp);
            if (sep) {
                tbuf_put(&b, s + i, k);
                word_start = true;
            } else {
                put_cp(&b, word_start ? upper_cp(cp) : lower_cp(cp));
                word_start = false;
            }
            i += k;
        }
        return from_buf(c, at, &b, out);
    }
    if (IS("replace")) {
        const tv *o = arg(&a, 0, "old"), *w = arg(&a, 1, "new"), *cnt = arg(&a, 2, "count");
        if (!o || !w) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "replace needs old and new");
        if (as_str(c, at, v, &s, &n)) return -1;
        tv os = tv_to_str(c, *o), ws = tv_to_str(c, *w);
        return str_replace(c, at, s, n, os, ws, cnt && cnt->t == TV_INT ? cnt->u.i : -1, out);
    }
    if (IS("join")) {
        const tv *dv = arg(&a, 0, "d"), *attr = arg(&a, 1, "attribute");
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        const char *d = "";
        size_t dn = 0;
        if (dv && as_str(c, at, *dv, &d, &dn)) return -1;
        tbuf b = {.limit = c->lim->max_memory};
        for (size_t i = 0; i < items.u.l->n; i++) {
            tv it = items.u.l->v[i];
            if (attr && attr->t != TV_NONE && get_path(c, at, it, *attr, &it)) {
                free(b.p);
                return -1;
            }
            if (i) tbuf_put(&b, d, dn);
            tv_write_str(&b, it);
        }
        return from_buf(c, at, &b, out);
    }
    if (IS("first")) {
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = items.u.l->n ? items.u.l->v[0] : tv_undef("No first item, sequence was empty.");
        return 0;
    }
    if (IS("last")) {
        if (v.t == TV_LIST && (v.flags & TVF_GEN))
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'generator' object is not reversible");
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = items.u.l->n ? items.u.l->v[items.u.l->n - 1] : tv_undef("No last item, sequence was empty.");
        return 0;
    }
    if (IS("list")) {
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = tv_list_new(&c->arena, items.u.l->n);
        if (out->t != TV_LIST) return oomc(c, at);
        tv_copy(out->u.l->v, items.u.l->v, items.u.l->n);
        out->u.l->n = items.u.l->n;
        return 0;
    }
    if (IS("items")) {
        if (v.t == TV_UNDEF) {
            *out = tv_list_new(&c->arena, 0);
            out->flags = TVF_GEN;
            return out->t == TV_LIST ? 0 : oomc(c, at);
        }
        if (v.t != TV_DICT) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
        if (tmpl_method(c, at, v, "items", 0, NULL, 0, NULL, NULL, out)) return -1;
        out->flags = TVF_GEN;
        return 0;
    }
    if (IS("dictsort")) {
        if (v.t != TV_DICT) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "You can only sort by either 'key' or 'value'");
        const tv *cs = arg(&a, 0, "case_sensitive"), *by = arg(&a, 1, "by"), *rv = arg(&a, 2, "reverse");
        bool by_value = by && by->t == TV_STR && strcmp(by->u.s->s, "value") == 0;
        tv pairs;
        if (tmpl_method(c, at, v, "items", 0, NULL, 0, NULL, NULL, &pairs)) return -1;
        tv idx = tv_int(by_value ? 1 : 0);
        return sorted_list(c, at, pairs, &idx, arg_true(cs, false), arg_true(rv, false), out);
    }
    if (IS("sort")) {
        const tv *rv = arg(&a, 0, "reverse"), *cs = arg(&a, 1, "case_sensitive"), *attr = arg(&a, 2, "attribute");
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        return sorted_list(c, at, items, attr, arg_true(cs, false), arg_true(rv, false), out);
    }
    if (IS("unique")) {
        const tv *cs = arg(&a, 0, "case_sensitive"), *attr = arg(&a, 1, "attribute");
        tv items, seen;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = tv_list_new(&c->arena, 0);
        seen = tv_list_new(&c->arena, 0);
        if (out->t != TV_LIST || seen.t != TV_LIST) return oomc(c, at);
        out->flags = TVF_GEN;
        for (size_t i = 0; i < items.u.l->n; i++) {
            tv k = items.u.l->v[i];
            if (attr && attr->t != TV_NONE && get_path(c, at, k, *attr, &k)) return -1;
            k = fold_key(c, at, k, arg_true(cs, false));
            if ((k.t == TV_LIST && !(k.flags & TVF_TUPLE)) || k.t == TV_DICT || k.t == TV_NS)
                return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "unhashable type: '%s'", tv_typename(k));
            bool dup = false;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = tv_equal(seen.u.l->v[j], k);
            if (dup) continue;
            if (!tv_list_push(&c->arena, &seen, k) || !tv_list_push(&c->arena, out, items.u.l->v[i])) return oomc(c, at);
        }
        return 0;
    }
    if (IS("reverse")) {
        if (v.t == TV_STR) {
            tv chars;
            if (tmpl_iterate(c, at, v, &chars)) return -1;
            tbuf b = {.limit = c->lim->max_memory};
            for (size_t i = chars.u.l->n; i-- > 0;) tbuf_put(&b, chars.u.l->v[i].u.s->s, chars.u.l->v[i].u.s->len);
            return from_buf(c, at, &b, out);
        }
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = tv_list_new(&c->arena, items.u.l->n);
        if (out->t != TV_LIST) return oomc(c, at);
        if (!(v.t == TV_LIST && (v.flags & TVF_GEN)) && v.t != TV_UNDEF) out->flags = TVF_GEN; /* reversed() iterator */
        for (size_t i = 0; i < items.u.l->n; i++) out->u.l->v[i] = items.u.l->v[items.u.l->n - 1 - i];
        out->u.l->n = items.u.l->n;
        return 0;
    }
    if (IS("map")) {
        tv items;
        if (!tv_truthy(v)) v = tv_undef(NULL); /* jinja2 iterates only a truthy value */
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = tv_list_new(&c->arena, items.u.l->n);
        if (out->t != TV_LIST) return oomc(c, at);
        out->flags = TVF_GEN;
        const tv *attr = arg(&a, -1, "attribute"), *def = arg(&a, -1, "default");
        const tv *fname = arg(&a, 0, NULL);
        if (!attr && (!fname || fname->t != TV_STR)) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "map needs a filter name or attribute=");
        for (size_t i = 0; i < items.u.l->n; i++) {
            tv r;
            if (attr) {
                if (get_path(c, at, items.u.l->v[i], *attr, &r)) return -1;
                if (r.t == TV_UNDEF && def) r = *def;
            } else {
                int rc = tmpl_filter(c, at, fname->u.s->s, items.u.l->v[i], nargs - 1, args + 1, nkw, kwnames, kwvals, &r);
                if (rc == -2) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "no filter named '%s'", fname->u.s->s);
                if (rc) return -1;
            }
            out->u.l->v[out->u.l->n++] = r;
        }
        return 0;
    }
    if (IS("select")) return select_items(c, at, v, &a, false, true, out);
    if (IS("reject")) return select_items(c, at, v, &a, false, false, out);
    if (IS("selectattr")) return select_items(c, at, v, &a, true, true, out);
    if (IS("rejectattr")) return select_items(c, at, v, &a, true, false, out);
    if ((IS("int") || IS("float")) && v.t == TV_UNDEF) /* Undefined.__int__ / __float__ raise */
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s", v.u.hint ? v.u.hint : "a value is undefined");
    if (IS("int")) {
        const tv *dv = arg(&a, 0, "default"), *bv = arg(&a, 1, "base");
        int base = bv && bv->t == TV_INT ? (int)bv->u.i : 10;
        tv def = dv ? *dv : tv_int(0);
        if (v.t == TV_INT) *out = v;
        else if (v.t == TV_BOOL) *out = tv_int(v.u.b);
        else if (v.t == TV_FLOAT) *out = isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? tv_int((int64_t)v.u.f) : def;
        else if (v.t == TV_STR) {
            int64_t iv;
            double fv;
            if ((base == 0 || (base >= 2 && base <= 36)) && parse_py_int(v.u.s->s, v.u.s->len, base, &iv)) *out = tv_int(iv);
            else if (parse_py_float(v.u.s->s, v.u.s->len, &fv) && isfinite(fv) && fabs(fv) < 9.2e18) *out = tv_int((int64_t)fv);
            else *out = def;
        } else *out = def;
        return 0;
    }
    if (IS("float")) {
        const tv *dv = arg(&a, 0, "default");
        tv def = dv ? *dv : tv_float(0.0);
        double fv;
        if (v.t == TV_FLOAT) *out = v;
        else if (v.t == TV_INT || v.t == TV_BOOL) *out = tv_float(v.t == TV_INT ? (double)v.u.i : v.u.b);
        else if (v.t == TV_STR && parse_py_float(v.u.s->s, v.u.s->len, &fv)) *out = tv_float(fv);
        else *out = def;
        return 0;
    }
    if (IS("abs")) {
        if (v.t == TV_INT) *out = tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.t == TV_BOOL) *out = tv_int(v.u.b);
        else if (v.t == TV_FLOAT) *out = tv_float(fabs(v.u.f));
        else return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", tv_typename(v));
        return 0;
    }
    if (IS("round")) return do_round(c, at, v, &a, out);
    if (IS("indent")) return do_indent(c, at, v, &a, out);
    if (IS("min") || IS("max")) return min_max(c, at, v, &a, IS("max"), out);
    if (IS("sum")) {
        const tv *attr = arg(&a, 0, "attribute"), *start = arg(&a, 1, "start");
        tv items, acc = start ? *start : tv_int(0);
        if (tmpl_iterate(c, at, v, &items)) return -1;
        for (size_t i = 0; i < items.u.l->n; i++) {
            tv it = items.u.l->v[i];
            if (attr && attr->t != TV_NONE && get_path(c, at, it, *attr, &it)) return -1;
            if (tmpl_binop(c, at, OP_ADD, acc, it, &acc)) return -1;
        }
        *out = acc;
        return 0;
    }
    if (IS("attr")) {
        const tv *nm = arg(&a, 0, "name");
        if (need_str(c, at, nm, "attr name")) return -1;
        return tmpl_getattr(c, at, v, nm->u.s->s, out);
    }
    if (IS("batch")) {
        const tv *cnt = arg(&a, 0, "linecount"), *fill = arg(&a, 1, "fill_with");
        if (!cnt || cnt->t != TV_INT || cnt->u.i <= 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "batch needs a positive count");
        tv items;
        if (tmpl_iterate(c, at, v, &items)) return -1;
        *out = tv_list_new(&c->arena, 0);
        if (out->t != TV_LIST) return oomc(c, at);
        out->flags = TVF_GEN;
        tv cur = tv_undef(NULL);
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (i % (size_t)cnt->u.i == 0) {
                cur = tv_list_new(&c->arena, 0);
                if (cur.t != TV_LIST || !tv_list_push(&c->arena, out, cur)) return oomc(c, at);
            }
            if (!tv_list_push(&c->arena, &out->u.l->v[out->u.l->n - 1], items.u.l->v[i])) return oomc(c, at);
        }
        if (fill && out->u.l->n) {
            tv *last = &out->u.l->v[out->u.l->n - 1];
            while (last->u.l->n < (size_t)cnt->u.i)
                if (!tv_list_push(&c->arena, last, *fill)) return oomc(c, at);
        }
        return 0;
    }
    if (IS("center")) {
        const tv *wv = arg(&a, 0, "width");
        int64_t w = wv && wv->t == TV_INT ? wv->u.i : 80;
        if (as_str(c, at, v, &s, &n)) return -1;
        int64_t len = (int64_t)tmpl_utf8_count(s, n);
        if (w > 100000) return tmpl_fail(c, at, LM_ERR_LIMIT, "center width too large");
        if (w <= len) return mkstr(c, at, s, n, out);
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        tbuf b = {.limit = c->lim->max_memory};
        for (int64_t i = 0; i < left; i++) tbuf_putc(&b, ' ');
        tbuf_put(&b, s, n);
        for (int64_t i = 0; i < pad - left; i++) tbuf_putc(&b, ' ');
        return from_buf(c, at, &b, out);
    }
    if (IS("wordcount")) {
        if (as_str(c, at, v, &s, &n)) return -1;
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += tmpl_utf8_decode(s + i, n - i, &cp);
            bool w = cp == '_' || (cp < 0x80 ? isalnum((int)cp) != 0 : !tmpl_is_space_cp(cp));
            if (w && !in) words++;
            in = w;
        }
        *out = tv_int(words);
        return 0;
    }
    if (IS("format")) {
        if (v.t != TV_STR) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "format needs a string");
        tv tup = tv_list_new(&c->arena, (size_t)nargs);
        if (tup.t != TV_LIST) return oomc(c, at);
        tup.flags = TVF_TUPLE;
        for (int i = 0; i < nargs; i++) tup.u.l->v[tup.u.l->n++] = args[i];
        return tmpl_binop(c, at, OP_MOD, v, tup, out);
    }
#undef IS
    return -2;
}

/* ------------------------------------------------------------------ methods */

static const char *const str_method_names[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "replace", "format", "join", "find", "rfind", "count", "index", "isdigit", "isalpha",
    "isalnum", "isspace", "islower", "isupper", "removeprefix", "removesuffix", "swapcase", NULL};

bool tmpl_has_method(tv self, const char *name) {
    if (self.t != TV_STR) return false;
    for (int i = 0; str_method_names[i]; i++)
        if (strcmp(str_method_names[i], name) == 0) return true;
    return false;
}

/* str.format: {} {0} {name} {name!r} {{ }}; format specs beyond none are refused. */
static int str_format(tmpl_ctx *c, const tnode *at, tv fmt, const targs *a, tv *out) {
    const char *s = fmt.u.s->s;
    size_t n = fmt.u.s->len, auto_idx = 0;
    tbuf b = {.limit = c->lim->max_memory};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (s[i] == '}') {
            if (i + 1 < n && s[i + 1] == '}') i++;
            else rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "Single '}' encountered in format string");
            tbuf_putc(&b, '}');
            continue;
        }
        if (s[i] != '{') {
            tbuf_putc(&b, s[i]);
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            tbuf_putc(&b, '{');
            i++;
            continue;
        }
        const char *close = memchr(s + i, '}', n - i);
        if (!close) {
            rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "Single '{' encountered in format string");
            break;
        }
        size_t fs = i + 1, fe = (size_t)(close - s);
        char conv = 0;
        size_t name_end = fe;
        for (size_t k = fs; k < fe; k++) {
            if (s[k] == '!' || s[k] == ':') {
                name_end = k;
                if (s[k] == '!' && k + 1 < fe) conv = s[k + 1];
                if (s[k] == ':' || (k + 2 < fe && s[k + 2] == ':')) {
                    rc = tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "format specs in str.format() are not supported");
                }
                break;
            }
        }
        if (rc) break;
        const tv *val = NULL;
        if (name_end == fs) {
            val = auto_idx < (size_t)a->nargs ? &a->args[auto_idx] : NULL;
            auto_idx++;
        } else if (isdigit((unsigned char)s[fs])) {
            size_t idx = (size_t)strtoul(s + fs, NULL, 10);
            val = idx < (size_t)a->nargs ? &a->args[idx] : NULL;
        } else {
            for (int k = 0; k < a->nkw; k++)
                if (strlen(a->kwnames[k]) == name_end - fs && memcmp(a->kwnames[k], s + fs, name_end - fs) == 0)
                    val = &a->kwvals[k];
        }
        if (!val) {
            rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "str.format(): replacement field {%.*s} has no argument",
                           (int)(fe - fs), s + fs);
            break;
        }
        if (conv == 'r') tv_write_repr(&b, *val);
        else tv_write_str(&b, *val);
        i = fe;
    }
    if (rc) {
        free(b.p);
        return -1;
    }
    return from_buf(c, at, &b, out);
}

static int affix(tmpl_ctx *c, const tnode *at, tv self, const tv *pv, bool ends, bool *out) {
    if (!pv) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s() takes at least 1 argument", ends ? "endswith" : "startswith");
    const char *s = self.u.s->s;
    size_t n = self.u.s->len;
    const tv *cands = pv;
    size_t nc = 1;
    if (pv->t == TV_LIST && (pv->flags & TVF_TUPLE)) cands = pv->u.l->v, nc = pv->u.l->n;
    *out = false;
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].t != TV_STR)
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s first arg must be str or a tuple of str", ends ? "endswith" : "startswith");
        size_t pn = cands[i].u.s->len;
        if (pn <= n && memcmp(ends ? s + n - pn : s, cands[i].u.s->s, pn) == 0) *out = true;
    }
    return 0;
}

static int dict_items(tmpl_ctx *c, const tnode *at, tdict *d, int which, tv *out) {
    *out = tv_list_new(&c->arena, d->n);
    if (out->t != TV_LIST) return oomc(c, at);
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) {
            tv pair = tv_list_new(&c->arena, 2);
            if (pair.t != TV_LIST) return oomc(c, at);
            pair.flags = TVF_TUPLE;
            pair.u.l->v[0] = d->k[i];
            pair.u.l->v[1] = d->v[i];
            pair.u.l->n = 2;
            out->u.l->v[i] = pair;
        } else {
            out->u.l->v[i] = which == 1 ? d->k[i] : d->v[i];
        }
    }
    out->u.l->n = d->n;
    return 0;
}

static int find_sub(tv self, const tv *sub, bool right, int64_t *out) {
    const char *s = self.u.s->s, *p = sub->u.s->s;
    size_t n = self.u.s->len, pn = sub->u.s->len;
    *out = -1;
    const char *hit = NULL;
    if (!right) hit = pn == 0 ? s : memmem(s, n, p, pn);
    else if (pn <= n)
        for (size_t k = n - pn + 1; k-- > 0;)
            if (memcmp(s + k, p, pn) == 0) { hit = s + k; break; }
    if (hit) *out = (int64_t)tmpl_utf8_count(s, (size_t)(hit - s));
    return 0;
}

static int str_method(tmpl_ctx *c, const tnode *at, tv self, const char *name, const targs *a, tv *out) {
    const char *s = self.u.s->s;
    size_t n = self.u.s->len;
    const tv *a0 = arg(a, 0, NULL);
#define IS(x) (strcmp(name, x) == 0)
    if (IS("strip")) return strip_str(c, at, s, n, arg(a, 0, "chars"), 3, out);
    if (IS("lstrip")) return strip_str(c, at, s, n, arg(a, 0, "chars"), 1, out);
    if (IS("rstrip")) return strip_str(c, at, s, n, arg(a, 0, "chars"), 2, out);
    if (IS("split") || IS("rsplit")) {
        const tv *mv = arg(a, 1, "maxsplit");
        return str_split(c, at, s, n, arg(a, 0, "sep"), mv && mv->t == TV_INT ? mv->u.i : -1, IS("rsplit"), out);
    }
    if (IS("splitlines")) return split_lines(c, at, s, n, out);
    if (IS("startswith") || IS("endswith")) {
        bool r;
        if (affix(c, at, self, a0, IS("endswith"), &r)) return -1;
        *out = tv_bool(r);
        return 0;
    }
    if (IS("upper")) return case_map(c, at, s, n, 'u', out);
    if (IS("lower")) return case_map(c, at, s, n, 'l', out);
    if (IS("title")) return case_map(c, at, s, n, 't', out);
    if (IS("capitalize")) return case_map(c, at, s, n, 'c', out);
    if (IS("swapcase")) {
        tbuf b = {.limit = c->lim->max_memory};
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(s + i, n - i, &cp);
            uint32_t o = lower_cp(cp) != cp ? lower_cp(cp) : upper_cp(cp);
            put_cp(&b, o);
            i += k;
        }
        return from_buf(c, at, &b, out);
    }
    if (IS("replace")) {
        const tv *w = arg(a, 1, NULL), *cnt = arg(a, 2, "count");
        if (!a0 || !w) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "replace() takes at least 2 arguments");
        return str_replace(c, at, s, n, *a0, *w, cnt && cnt->t == TV_INT ? cnt->u.i : -1, out);
    }
    if (IS("format")) return str_format(c, at, self, a, out);
    if (IS("join")) {
        if (!a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "join() takes exactly one argument");
        tv items;
        if (tmpl_iterate(c, at, *a0, &items)) return -1;
        tbuf b = {.limit = c->lim->max_memory};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (items.u.l->v[i].t != TV_STR) {
                free(b.p);
                return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found", i,
                                 tv_typename(items.u.l->v[i]));
            }
            if (i) tbuf_put(&b, s, n);
            tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
        }
        return from_buf(c, at, &b, out);
    }
    if (IS("find") || IS("rfind") || IS("index")) {
        if (need_str(c, at, a0, "substring")) return -1;
        int64_t r;
        find_sub(self, a0, IS("rfind"), &r);
        if (r < 0 && IS("index")) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "substring not found");
        *out = tv_int(r);
        return 0;
    }
    if (IS("count")) {
        if (need_str(c, at, a0, "substring")) return -1;
        size_t pn = a0->u.s->len;
        int64_t k = 0;
        if (pn == 0) k = (int64_t)tmpl_utf8_count(s, n) + 1;
        else
            for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), a0->u.s->s, pn)); p += pn) k++;
        *out = tv_int(k);
        return 0;
    }
    if (IS("removeprefix") || IS("removesuffix")) {
        if (need_str(c, at, a0, "affix")) return -1;
        bool r;
        if (affix(c, at, self, a0, IS("removesuffix"), &r)) return -1;
        if (!r) {
            *out = self;
            return 0;
        }
        size_t pn = a0->u.s->len;
        return mkstr(c, at, IS("removeprefix") ? s + pn : s, n - pn, out);
    }
    if (IS("isdigit") || IS("isalpha") || IS("isalnum") || IS("isspace") || IS("islower") || IS("isupper")) {
        bool r = n > 0, any_cased = false;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += tmpl_utf8_decode(s + i, n - i, &cp);
            bool digit = cp >= '0' && cp <= '9', alpha = cp >= 0x80 ? cased_cp(cp) : isalpha((int)cp) != 0;
            if (IS("isdigit")) r = r && digit;
            else if (IS("isalpha")) r = r && alpha;
            else if (IS("isalnum")) r = r && (alpha || digit);
            else if (IS("isspace")) r = r && tmpl_is_space_cp(cp);
            else if (cased_cp(cp)) {
                any_cased = true;
                if (IS("islower") ? lower_cp(cp) != cp : upper_cp(cp) != cp) r = false;
            }
        }
        if (IS("islower") || IS("isupper")) r = r && any_cased;
        *out = tv_bool(r);
        return 0;
    }
#undef IS
    return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "str.%s() is not supported", name);
}

/* ------------------------------------------------------------------ globals */

static int g_range(tmpl_ctx *c, const tnode *at, const targs *a, tv *out) {
    int64_t start = 0, stop, stp = 1;
    for (int i = 0; i < a->nargs; i++)
        if (a->args[i].t != TV_INT && a->args[i].t != TV_BOOL)
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' object cannot be interpreted as an integer", tv_typename(a->args[i]));
#define IV(k) (a->args[k].t == TV_INT ? a->args[k].u.i : (int64_t)a->args[k].u.b)
    if (a->nargs == 1) stop = IV(0);
    else if (a->nargs == 2) start = IV(0), stop = IV(1);
    else if (a->nargs == 3) start = IV(0), stop = IV(1), stp = IV(2);
    else return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "range expected 1 to 3 arguments, got %d", a->nargs);
#undef IV
    if (stp == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "range() arg 3 must not be zero");
    double count = stp > 0 ? ceil(((double)stop - (double)start) / (double)stp) : ceil(((double)start - (double)stop) / (double)-stp);
    if (count < 0) count = 0;
    if (count > 100000) return tmpl_fail(c, at, LM_ERR_LIMIT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    *out = tv_list_new(&c->arena, (size_t)count);
    if (out->t != TV_LIST) return oomc(c, at);
    out->flags = TVF_RANGE;
    out->u.l->rstart = start;
    out->u.l->rstop = stop;
    out->u.l->rstep = stp;
    for (int64_t x = start; stp > 0 ? x < stop : x > stop; x += stp) out->u.l->v[out->u.l->n++] = tv_int(x);
    return 0;
}

static int g_strftime(tmpl_ctx *c, const tnode *at, const targs *a, tv *out) {
    const tv *f = arg(a, 0, "format");
    if (need_str(c, at, f, "strftime_now format")) return -1;
    time_t t = c->now > 0 ? (time_t)c->now : time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm)) return tmpl_fail(c, at, LM_ERR_INTERNAL, "localtime failed");
    char buf[512];
    size_t k = f->u.s->len ? strftime(buf, sizeof buf, f->u.s->s, &tm) : 0;
    if (k == 0 && f->u.s->len) return tmpl_fail(c, at, LM_ERR_LIMIT, "strftime_now: result empty or too long");
    return mkstr(c, at, buf, k, out);
}

static int call_global(tmpl_ctx *c, const tnode *at, const char *name, const targs *a, tv *out) {
    if (strcmp(name, "range") == 0) return g_range(c, at, a, out);
    if (strcmp(name, "namespace") == 0 || strcmp(name, "dict") == 0) {
        *out = tv_dict_new(&c->arena, 0);
        if (out->t != TV_DICT) return oomc(c, at);
        for (int i = 0; i < a->nargs; i++) { /* namespace({'a': 1}) / dict({'a': 1}) */
            if (a->args[i].t != TV_DICT) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s() positional argument must be a mapping", name);
            for (size_t k = 0; k < a->args[i].u.d->n; k++)
                if (!tv_dict_set(&c->arena, out, a->args[i].u.d->k[k], a->args[i].u.d->v[k])) return oomc(c, at);
        }
        for (int i = 0; i < a->nkw; i++)
            if (!tv_dict_set(&c->arena, out, tv_cstr(&c->arena, a->kwnames[i]), a->kwvals[i])) return oomc(c, at);
        if (name[0] == 'n') out->t = TV_NS;
        return 0;
    }
    if (strcmp(name, "raise_exception") == 0) {
        const tv *m = arg(a, 0, "message");
        const char *s = "raise_exception() called";
        size_t n = strlen(s);
        if (m && as_str(c, at, *m, &s, &n)) return -1;
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%.*s", (int)(n > 400 ? 400 : n), s);
    }
    if (strcmp(name, "strftime_now") == 0) return g_strftime(c, at, a, out);
    return tmpl_fail(c, at, LM_ERR_INTERNAL, "unknown global '%s'", name);
}

tscope *tmpl_make_globals(tmpl_ctx *c) {
    static const char *const names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};
    tscope *g = tscope_new(c, NULL);
    if (!g) return NULL;
    for (int i = 0; names[i]; i++) {
        tfunc *f = tmpl_alloc(&c->arena, sizeof *f);
        if (!f) return NULL;
        f->kind = TF_BUILTIN;
        f->name = names[i];
        tv v = {TV_FUNC, 0, {.fn = f}};
        if (!tscope_set(c, g, names[i], v)) return NULL;
    }
    return g;
}

int tmpl_method(tmpl_ctx *c, const tnode *at, tv self, const char *name, int nargs, const tv *args, int nkw,
                const char **kwnames, const tv *kwvals, tv *out) {
    targs a = {nargs, args, nkw, kwnames, kwvals};
    const tv *a0 = arg(&a, 0, NULL);
    switch (self.t) {
    case TV_NONE: return call_global(c, at, name, &a, out);
    case TV_STR: return str_method(c, at, self, name, &a, out);
    case TV_DICT:
        if (!strcmp(name, "get")) {
            if (!a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "get expected at least 1 argument, got 0");
            tv *v = tv_dict_get(self.u.d, *a0);
            const tv *d = arg(&a, 1, NULL);
            *out = v ? *v : d ? *d : tv_none();
            return 0;
        }
        if (!strcmp(name, "items")) return dict_items(c, at, self.u.d, 0, out);
        if (!strcmp(name, "keys")) return dict_items(c, at, self.u.d, 1, out);
        if (!strcmp(name, "values")) return dict_items(c, at, self.u.d, 2, out);
        if (!strcmp(name, "copy")) {
            *out = tv_dict_new(&c->arena, self.u.d->n);
            if (out->t != TV_DICT) return oomc(c, at);
            for (size_t i = 0; i < self.u.d->n; i++)
                if (!tv_dict_set(&c->arena, out, self.u.d->k[i], self.u.d->v[i])) return oomc(c, at);
            return 0;
        }
        break;
    case TV_LIST:
        if (!strcmp(name, "copy")) {
            *out = tv_list_new(&c->arena, self.u.l->n);
            if (out->t != TV_LIST) return oomc(c, at);
            tv_copy(out->u.l->v, self.u.l->v, self.u.l->n);
            out->u.l->n = self.u.l->n;
            out->flags = self.flags & TVF_TUPLE;
            return 0;
        }
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            if (!a0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s() takes exactly one argument", name);
            int64_t k = 0, first = -1;
            for (size_t i = 0; i < self.u.l->n; i++)
                if (tv_equal(self.u.l->v[i], *a0)) {
                    if (first < 0) first = (int64_t)i;
                    k++;
                }
            if (name[0] == 'i' && first < 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "x not in list");
            *out = tv_int(name[0] == 'i' ? first : k);
            return 0;
        }
        break;
    case TV_LOOP:
        if (!strcmp(name, "cycle")) {
            if (nargs == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "no items for cycling given");
            *out = args[self.u.lp->index0 % (size_t)nargs];
            return 0;
        }
        break;
    default: break;
    }
    return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "'%s' object has no method '%s'", tv_typename(self), name);
}
