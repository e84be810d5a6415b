/* The evaluator: statements and expressions over values, with jinja2's scoping (a for loop's
 * body gets a fresh scope each iteration; if blocks share their parent's; macros read the scope
 * they were defined in at call time), its attribute / item lookup order, Undefined, and Python's
 * operators. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/template/tmpl_internal.h"

enum { FLOW_OK = 0, FLOW_ERR = -1, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

int tmpl_fail(tmpl_ctx *c, const tnode *at, lm_status st, const char *fmt, ...) {
    if (c->err != LM_OK) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->err = st;
    c->errline = at ? at->line : 0;
    return -1;
}

static int oom(tmpl_ctx *c, const tnode *at) {
    if (c->arena.over_cap)
        return tmpl_fail(c, at, LM_ERR_LIMIT, "rendering needs more than %zu bytes of memory", c->arena.cap);
    return tmpl_fail(c, at, LM_ERR_NO_MEMORY, "out of memory");
}

static int step(tmpl_ctx *c, const tnode *at) {
    if (++c->steps > c->lim->max_steps)
        return tmpl_fail(c, at, LM_ERR_LIMIT, "rendering took more than %llu steps (a runaway loop?)",
                         (unsigned long long)c->lim->max_steps);
    return 0;
}

/* ------------------------------------------------------------------ scopes */

tscope *tscope_new(tmpl_ctx *c, tscope *parent) {
    tscope *s = tmpl_alloc(&c->arena, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

bool tscope_set(tmpl_ctx *c, tscope *s, const char *name, tv v) {
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return true;
        }
    }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 4;
        const char **nn = tmpl_alloc(&c->arena, nc * sizeof *nn);
        tv *nv = tmpl_alloc(&c->arena, nc * sizeof *nv);
        if (!nn || !nv) return false;
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return true;
}

tv *tscope_lookup(tscope *s, const char *name) {
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (strcmp(s->names[i], name) == 0) return &s->vals[i];
    return NULL;
}

/* The scope statements run in. Thread-local so that one template renders on many threads at once;
 * a render saves and restores it around every nested scope. */
static _Thread_local tscope *t_scope;

/* ------------------------------------------------------------------ undefined */

static const char *hintf(tmpl_ctx *c, const char *fmt, ...) {
    char buf[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tmpl_strndup(&c->arena, buf, strlen(buf));
}

static int undefined_error(tmpl_ctx *c, const tnode *at, tv u) {
    return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "%s", u.u.hint ? u.u.hint : "a value is undefined");
}

/* ------------------------------------------------------------------ attribute and item access */

static const char *const dict_methods[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "update", "setdefault", "clear", "fromkeys", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "pop", "extend", "insert", "remove", "sort", "reverse", "clear", NULL};

static bool in_set(const char *const *set, const char *name) {
    for (; *set; set++)
        if (strcmp(*set, name) == 0) return true;
    return false;
}

static int bound(tmpl_ctx *c, const tnode *at, tv self, const char *name, int kind, tv *out) {
    tfunc *f = tmpl_alloc(&c->arena, sizeof *f);
    if (!f) return oom(c, at);
    f->kind = (uint8_t)kind;
    f->name = name;
    f->self = self;
    out->t = TV_FUNC;
    out->flags = 0;
    out->u.fn = f;
    return 0;
}

static int loop_attr(tmpl_ctx *c, const tnode *at, tloop *lp, const char *name, tv *out) {
    size_t i = lp->index0, n = lp->items->n;
    if (!strcmp(name, "index")) *out = tv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = tv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = tv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = tv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = tv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = tv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = tv_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = tv_int(1);
    else if (!strcmp(name, "depth0")) *out = tv_int(0);
    else if (!strcmp(name, "previtem")) *out = i > 0 ? lp->items->v[i - 1] : tv_undef(hintf(c, "there is no previous item"));
    else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? lp->items->v[i + 1] : tv_undef(hintf(c, "there is no next item"));
    else if (!strcmp(name, "cycle")) {
        tv self = {TV_LOOP, 0, {.lp = lp}};
        return bound(c, at, self, "cycle", TF_METHOD, out);
    } else *out = tv_undef(hintf(c, "'LoopContext' object has no attribute '%s'", name));
    return 0;
}

int tmpl_getattr(tmpl_ctx *c, const tnode *at, tv obj, const char *name, tv *out) {
    switch (obj.t) {
    case TV_UNDEF: return undefined_error(c, at, obj);
    case TV_DICT:
        if (in_set(dict_methods, name)) return bound(c, at, obj, name, TF_METHOD, out);
        if (in_set(dict_unsafe, name)) return bound(c, at, obj, name, TF_UNSAFE, out);
        {
            tv *v = tv_dict_gets(obj.u.d, name);
            *out = v ? *v : tv_undef(hintf(c, "'dict object' has no attribute '%s'", name));
        }
        return 0;
    case TV_NS: {
        tv *v = tv_dict_gets(obj.u.d, name);
        *out = v ? *v : tv_undef(hintf(c, "'Namespace' object has no attribute '%s'", name));
        return 0;
    }
    case TV_STR:
        if (tmpl_has_method(obj, name)) return bound(c, at, obj, name, TF_METHOD, out);
        break;
    case TV_LIST:
        if (!(obj.flags & TVF_GEN)) {
            if (in_set(list_methods, name)) return bound(c, at, obj, name, TF_METHOD, out);
            if (in_set(list_unsafe, name)) return bound(c, at, obj, name, TF_UNSAFE, out);
        }
        break;
    case TV_LOOP: return loop_attr(c, at, obj.u.lp, name, out);
    default: break;
    }
    if (obj.t == TV_NONE) *out = tv_undef(hintf(c, "'None' has no attribute '%s'", name));
    else *out = tv_undef(hintf(c, "'%s object' has no attribute '%s'", tv_typename(obj), name));
    return 0;
}

static bool index_of(tv key, size_t n, size_t *out) {
    int64_t i;
    if (key.t == TV_INT) i = key.u.i;
    else if (key.t == TV_BOOL) i = key.u.b;
    else return false;
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

/* Byte offset of the code point with index k (k <= count). */
static size_t utf8_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k > 0 && i < n) {
        uint32_t cp;
        i += tmpl_utf8_decode(s + i, n - i, &cp);
        k--;
    }
    return i;
}

int tmpl_getitem(tmpl_ctx *c, const tnode *at, tv obj, tv key, tv *out) {
    size_t idx;
    switch (obj.t) {
    case TV_UNDEF: return undefined_error(c, at, obj);
    case TV_DICT: {
        tv *v = tv_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
        break;
    }
    case TV_LIST:
        if (!(obj.flags & TVF_GEN) && index_of(key, obj.u.l->n, &idx)) {
            *out = obj.u.l->v[idx];
            return 0;
        }
        break;
    case TV_STR:
        if (key.t == TV_INT || key.t == TV_BOOL) {
            size_t n = tmpl_utf8_count(obj.u.s->s, obj.u.s->len);
            if (index_of(key, n, &idx)) {
                size_t a = utf8_offset(obj.u.s->s, obj.u.s->len, idx);
                uint32_t cp;
                size_t k = tmpl_utf8_decode(obj.u.s->s + a, obj.u.s->len - a, &cp);
                *out = tv_str(&c->arena, obj.u.s->s + a, k);
                return out->t == TV_STR ? 0 : oom(c, at);
            }
        }
        break;
    default: break;
    }
    if (key.t == TV_STR && obj.t != TV_DICT) return tmpl_getattr(c, at, obj, key.u.s->s, out);
    if (key.t == TV_STR && obj.t == TV_DICT && (in_set(dict_methods, key.u.s->s) || in_set(dict_unsafe, key.u.s->s)))
        return tmpl_getattr(c, at, obj, key.u.s->s, out);
    tbuf kb = {.limit = 120};
    tv_write_repr(&kb, key);
    if (obj.t == TV_DICT) *out = tv_undef(hintf(c, "'dict object' has no attribute %s", kb.p ? kb.p : "?"));
    else if (obj.t == TV_NONE) *out = tv_undef(hintf(c, "'None' has no attribute %s", kb.p ? kb.p : "?"));
    else *out = tv_undef(hintf(c, "'%s object' has no attribute %s", tv_typename(obj), kb.p ? kb.p : "?"));
    free(kb.p);
    return 0;
}

/* Python slice indices for a sequence of n items. */
static int slice_bound(tmpl_ctx *c, const tnode *at, tv v, int64_t *out, bool *given) {
    *given = false;
    if (v.t == TV_NONE) return 0;
    if (v.t == TV_INT) *out = v.u.i;
    else if (v.t == TV_BOOL) *out = v.u.b;
    else return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "slice indices must be integers or None");
    *given = true;
    return 0;
}

static int do_slice(tmpl_ctx *c, const tnode *at, tv obj, tv vstart, tv vstop, tv vstep, tv *out) {
    int64_t start = 0, stop = 0, stp = 1;
    bool hs, ht, hp;
    if (slice_bound(c, at, vstart, &start, &hs) || slice_bound(c, at, vstop, &stop, &ht) ||
        slice_bound(c, at, vstep, &stp, &hp))
        return -1;
    if (stp == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "slice step cannot be zero");
    if (obj.t == TV_UNDEF) return undefined_error(c, at, obj);
    bool is_str = obj.t == TV_STR;
    if (!is_str && (obj.t != TV_LIST || (obj.flags & TVF_GEN)))
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' object is not subscriptable", tv_typename(obj));
    /* strings are sliced by code point: index their starts once */
    size_t n;
    size_t *offs = NULL;
    if (is_str) {
        n = tmpl_utf8_count(obj.u.s->s, obj.u.s->len);
        offs = malloc((n + 1) * sizeof *offs);
        if (!offs) return oom(c, at);
        size_t i = 0, k = 0;
        while (i < obj.u.s->len) {
            offs[k++] = i;
            uint32_t cp;
            i += tmpl_utf8_decode(obj.u.s->s + i, obj.u.s->len - i, &cp);
        }
        offs[k] = obj.u.s->len;
    } else {
        n = obj.u.l->n;
    }
    int64_t len = (int64_t)n;
    if (stp > 0) {
        if (!hs) start = 0;
        else if (start < 0) start = start + len < 0 ? 0 : start + len;
        else if (start > len) start = len;
        if (!ht) stop = len;
        else if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
        else if (stop > len) stop = len;
    } else {
        if (!hs) start = len - 1;
        else if (start < 0) start = start + len < 0 ? -1 : start + len;
        else if (start >= len) start = len - 1;
        if (!ht) stop = -1;
        else if (stop < 0) stop = stop + len < 0 ? -1 : stop + len;
        else if (stop >= len) stop = len - 1;
    }
    int rc = 0;
    if (is_str) {
        tbuf b = {.limit = c->lim->max_memory};
        for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
            tbuf_put(&b, obj.u.s->s + offs[i], offs[i + 1] - offs[i]);
        if (b.failed) rc = oom(c, at);
        else {
            *out = tv_str(&c->arena, b.p ? b.p : "", b.n);
            if (out->t != TV_STR) rc = oom(c, at);
        }
        free(b.p);
        free(offs);
        return rc;
    }
    *out = tv_list_new(&c->arena, 0);
    if (out->t != TV_LIST) return oom(c, at);
    out->flags = obj.flags & TVF_TUPLE;
    for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
        if (!tv_list_push(&c->arena, out, obj.u.l->v[i])) return oom(c, at);
    return 0;
}

int tmpl_iterate(tmpl_ctx *c, const tnode *at, tv v, tv *out) {
    switch (v.t) {
    case TV_UNDEF: *out = tv_list_new(&c->arena, 0); break;
    case TV_LIST: *out = v; out->flags = 0; return 0;
    case TV_DICT:
        *out = tv_list_new(&c->arena, v.u.d->n);
        if (out->t != TV_LIST) return oom(c, at);
        for (size_t i = 0; i < v.u.d->n; i++) out->u.l->v[i] = v.u.d->k[i];
        out->u.l->n = v.u.d->n;
        return 0;
    case TV_STR: {
        *out = tv_list_new(&c->arena, 0);
        if (out->t != TV_LIST) return oom(c, at);
        for (size_t i = 0; i < v.u.s->len;) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode(v.u.s->s + i, v.u.s->len - i, &cp);
            tv ch = tv_str(&c->arena, v.u.s->s + i, k);
            if (ch.t != TV_STR || !tv_list_push(&c->arena, out, ch)) return oom(c, at);
            i += k;
        }
        return 0;
    }
    default:
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' object is not iterable",
                         v.t == TV_NONE ? "NoneType" : tv_typename(v));
    }
    return out->t == TV_LIST ? 0 : oom(c, at);
}

/* ------------------------------------------------------------------ operators */

tv tv_to_str(tmpl_ctx *c, tv v) {
    if (v.t == TV_STR) return v;
    tbuf b = {.limit = c->lim->max_memory};
    tv_write_str(&b, v);
    tv r = b.failed ? tv_undef(NULL) : tv_str(&c->arena, b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

static int64_t ival(tv v) { return v.t == TV_INT ? v.u.i : v.u.b; }
static double fval(tv v) { return v.t == TV_FLOAT ? v.u.f : (double)ival(v); }

static const char *op_sym(int op) {
    static const char *s[] = {"?", "+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    return op >= 0 && op <= OP_NOTIN ? s[op] : "?";
}

static int type_error(tmpl_ctx *c, const tnode *at, int op, tv a, tv b) {
    if (a.t == TV_UNDEF) return undefined_error(c, at, a);
    if (b.t == TV_UNDEF) return undefined_error(c, at, b);
    if (op == OP_ADD && a.t == TV_STR)
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "can only concatenate str (not \"%s\") to str", tv_typename(b));
    return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                     tv_typename(a), tv_typename(b));
}

static int repeat(tmpl_ctx *c, const tnode *at, tv seq, int64_t times, tv *out) {
    if (times < 0) times = 0;
    if (seq.t == TV_STR) {
        size_t n = seq.u.s->len;
        if (n && (uint64_t)times > c->lim->max_memory / n)
            return tmpl_fail(c, at, LM_ERR_LIMIT, "string repetition too large");
        tstr *s = tmpl_alloc(&c->arena, sizeof *s + n * (size_t)times + 1);
        if (!s) return oom(c, at);
        for (int64_t k = 0; k < times; k++) memcpy(s->s + n * (size_t)k, seq.u.s->s, n);
        s->len = n * (size_t)times;
        out->t = TV_STR;
        out->flags = 0;
        out->u.s = s;
        return 0;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > c->lim->max_memory / (n * sizeof(tv)))
        return tmpl_fail(c, at, LM_ERR_LIMIT, "list repetition too large");
    *out = tv_list_new(&c->arena, n * (size_t)times);
    if (out->t != TV_LIST) return oom(c, at);
    out->flags = seq.flags & TVF_TUPLE;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < n; i++) out->u.l->v[out->u.l->n++] = seq.u.l->v[i];
    return 0;
}

static int str_percent(tmpl_ctx *c, const tnode *at, tv fmt, tv args, tv *out) {
    tbuf b = {.limit = c->lim->max_memory};
    size_t ai = 0;
    bool tuple = args.t == TV_LIST && (args.flags & TVF_TUPLE);
    const char *s = fmt.u.s->s;
    size_t n = fmt.u.s->len;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (s[i] != '%') {
            tbuf_putc(&b, s[i]);
            continue;
        }
        if (++i >= n) {
            rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "incomplete format");
            break;
        }
        if (s[i] == '%') {
            tbuf_putc(&b, '%');
            continue;
        }
        tv a;
        if (tuple) {
            if (ai >= args.u.l->n) {
                rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "not enough arguments for format string");
                break;
            }
            a = args.u.l->v[ai++];
        } else {
            if (ai++ > 0) {
                rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "not enough arguments for format string");
                break;
            }
            a = args;
        }
        char conv = s[i];
        if (conv == 's') tv_write_str(&b, a);
        else if (conv == 'r') tv_write_repr(&b, a);
        else if ((conv == 'd' || conv == 'i') && tv_is_number(a))
            tbuf_printf(&b, "%lld", (long long)(a.t == TV_FLOAT ? (int64_t)a.u.f : ival(a)));
        else if (conv == 'f' && tv_is_number(a)) tbuf_printf(&b, "%f", fval(a));
        else rc = tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "unsupported %%-format '%%%c'", conv);
    }
    /* Python skips the check for anything subscriptable but str: dicts, lists, ranges */
    if (rc == 0 && !tuple && ai == 0 && args.t != TV_DICT && args.t != TV_UNDEF && !(args.t == TV_LIST && !(args.flags & TVF_GEN)))
        rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "not all arguments converted during string formatting");
    if (rc == 0 && ((tuple && ai < args.u.l->n)))
        rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "not all arguments converted during string formatting");
    if (rc == 0 && b.failed) rc = oom(c, at);
    if (rc == 0) {
        *out = tv_str(&c->arena, b.p ? b.p : "", b.n);
        if (out->t != TV_STR) rc = oom(c, at);
    }
    free(b.p);
    return rc;
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

int tmpl_binop(tmpl_ctx *c, const tnode *at, int op, tv a, tv b, tv *out) {
    bool na = tv_is_number(a), nb = tv_is_number(b);
    bool both_int = na && nb && a.t != TV_FLOAT && b.t != TV_FLOAT;
    switch (op) {
    case OP_ADD:
        if (both_int) {
            int64_t r;
            if (__builtin_add_overflow(ival(a), ival(b), &r)) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "integer overflow");
            *out = tv_int(r);
            return 0;
        }
        if (na && nb) { *out = tv_float(fval(a) + fval(b)); return 0; }
        if (a.t == TV_STR && b.t == TV_STR && ((a.flags ^ b.flags) & TVF_SAFE)) {
            /* markupsafe: Markup + str escapes the plain side, and the sum stays Markup */
            tv esc;
            if (tmpl_filter(c, at, "escape", (a.flags & TVF_SAFE) ? b : a, 0, NULL, 0, NULL, NULL, &esc)) return -1;
            if (a.flags & TVF_SAFE) b = esc;
            else a = esc;
        }
        if (a.t == TV_STR && b.t == TV_STR) {
            size_t n = a.u.s->len + b.u.s->len;
            tstr *s = tmpl_alloc(&c->arena, sizeof *s + n + 1);
            if (!s) return oom(c, at);
            memcpy(s->s, a.u.s->s, a.u.s->len);
            memcpy(s->s + a.u.s->len, b.u.s->s, b.u.s->len);
            s->len = n;
            out->t = TV_STR;
            out->flags = a.flags & b.flags & TVF_SAFE;
            out->u.s = s;
            return 0;
        }
        if (a.t == TV_LIST && b.t == TV_LIST && !((a.flags | b.flags) & (TVF_GEN | TVF_RANGE)) &&
            (a.flags & TVF_TUPLE) == (b.flags & TVF_TUPLE)) {
            *out = tv_list_new(&c->arena, a.u.l->n + b.u.l->n);
            if (out->t != TV_LIST) return oom(c, at);
            out->flags = a.flags & TVF_TUPLE;
            tv_copy(out->u.l->v, a.u.l->v, a.u.l->n);
            tv_copy(out->u.l->v + a.u.l->n, b.u.l->v, b.u.l->n);
            out->u.l->n = a.u.l->n + b.u.l->n;
            return 0;
        }
        return type_error(c, at, op, a, b);
    case OP_SUB:
        if (both_int) {
            int64_t r;
            if (__builtin_sub_overflow(ival(a), ival(b), &r)) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "integer overflow");
            *out = tv_int(r);
            return 0;
        }
        if (na && nb) { *out = tv_float(fval(a) - fval(b)); return 0; }
        return type_error(c, at, op, a, b);
    case OP_MUL:
        if (both_int) {
            int64_t r;
            if (__builtin_mul_overflow(ival(a), ival(b), &r)) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "integer overflow");
            *out = tv_int(r);
            return 0;
        }
        if (na && nb) { *out = tv_float(fval(a) * fval(b)); return 0; }
        if ((a.t == TV_STR || (a.t == TV_LIST && !(a.flags & (TVF_GEN | TVF_RANGE)))) && nb && b.t != TV_FLOAT)
            return repeat(c, at, a, ival(b), out);
        if ((b.t == TV_STR || (b.t == TV_LIST && !(b.flags & (TVF_GEN | TVF_RANGE)))) && na && a.t != TV_FLOAT)
            return repeat(c, at, b, ival(a), out);
        return type_error(c, at, op, a, b);
    case OP_DIV:
        if (na && nb) {
            if (fval(b) == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "division by zero");
            *out = tv_float(fval(a) / fval(b));
            return 0;
        }
        return type_error(c, at, op, a, b);
    case OP_FLOORDIV:
    case OP_MOD:
        if (a.t == TV_STR && op == OP_MOD) return str_percent(c, at, a, b, out);
        if (!(na && nb)) return type_error(c, at, op, a, b);
        if (fval(b) == 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "integer division or modulo by zero");
        if (both_int) {
            int64_t x = ival(a), y = ival(b);
            if (x == INT64_MIN && y == -1) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "integer overflow");
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) q--, r += y;
            *out = tv_int(op == OP_FLOORDIV ? q : r);
        } else {
            double x = fval(a), y = fval(b);
            *out = tv_float(op == OP_FLOORDIV ? floor((x - py_fmod(x, y)) / y + 0.0) : py_fmod(x, y));
        }
        return 0;
    case OP_POW:
        if (both_int && ival(b) >= 0) {
            int64_t r = 1, base = ival(a), e = ival(b);
            while (e-- > 0) {
                if (__builtin_mul_overflow(r, base, &r)) return tmpl_fail(c, at, LM_ERR_UNSUPPORTED, "integer overflow");
                if (r == 0 || r == 1) break;
                if (step(c, at)) return -1;
            }
            *out = tv_int(r);
            return 0;
        }
        if (na && nb) {
            if (fval(a) == 0 && fval(b) < 0) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "0.0 cannot be raised to a negative power");
            *out = tv_float(pow(fval(a), fval(b)));
            return 0;
        }
        return type_error(c, at, op, a, b);
    }
    return tmpl_fail(c, at, LM_ERR_INTERNAL, "unknown operator");
}

static int contains(tmpl_ctx *c, const tnode *at, tv needle, tv hay, bool *out) {
    switch (hay.t) {
    case TV_UNDEF: *out = false; return 0;
    case TV_STR:
        if (needle.t != TV_STR)
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s", tv_typename(needle));
        *out = needle.u.s->len == 0 || memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
        return 0;
    case TV_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (tv_equal(needle, hay.u.l->v[i])) { *out = true; break; }
        return 0;
    case TV_DICT:
        if ((needle.t == TV_LIST && !(needle.flags & TVF_TUPLE)) || needle.t == TV_DICT || needle.t == TV_NS)
            return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "unhashable type: '%s'", tv_typename(needle));
        *out = tv_dict_get(hay.u.d, needle) != NULL;
        return 0;
    default:
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "argument of type '%s' is not iterable", tv_typename(hay));
    }
}

static int compare_op(tmpl_ctx *c, const tnode *at, int op, tv a, tv b, bool *out) {
    if (op == OP_EQ) { *out = tv_equal(a, b); return 0; }
    if (op == OP_NE) { *out = !tv_equal(a, b); return 0; }
    if (op == OP_IN || op == OP_NOTIN) {
        if (contains(c, at, a, b, out)) return -1;
        if (op == OP_NOTIN) *out = !*out;
        return 0;
    }
    int cmp;
    if (!tv_compare(a, b, &cmp)) {
        if (a.t == TV_UNDEF) return undefined_error(c, at, a);
        if (b.t == TV_UNDEF) return undefined_error(c, at, b);
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", op_sym(op),
                         tv_typename(a), tv_typename(b));
    }
    if (cmp == 2) { *out = false; return 0; }
    *out = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
    return 0;
}

/* ------------------------------------------------------------------ calls */

static int exec_body(tmpl_ctx *c, const tnode *body);

/* Runs `body` with output captured; the captured text becomes *out. */
static int capture(tmpl_ctx *c, const tnode *body, tscope *scope, tv *out) {
    tbuf saved = c->out;
    tscope *saved_scope = t_scope;
    c->out = (tbuf){.limit = c->lim->max_output};
    t_scope = scope;
    int rc = exec_body(c, body);
    t_scope = saved_scope;
    tbuf got = c->out;
    c->out = saved;
    if (rc == FLOW_ERR) {
        free(got.p);
        return -1;
    }
    if (got.failed) {
        free(got.p);
        return tmpl_fail(c, body, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
    }
    *out = tv_str(&c->arena, got.p ? got.p : "", got.n);
    free(got.p);
    return out->t == TV_STR ? 0 : oom(c, body);
}

static int call_macro(tmpl_ctx *c, const tnode *at, tfunc *fn, int nargs, const tv *args, int nkw,
                      const char **kwnames, const tv *kwvals, tv *out) {
    const tnode *m = fn->macro;
    if (c->depth >= c->lim->max_depth)
        return tmpl_fail(c, at, LM_ERR_LIMIT, "macro calls nested deeper than %d", c->lim->max_depth);
    tscope *s = tscope_new(c, fn->closure);
    if (!s) return oom(c, at);
    tv varargs = tv_list_new(&c->arena, 0), kwargs = tv_dict_new(&c->arena, 0);
    if (varargs.t != TV_LIST || kwargs.t != TV_DICT) return oom(c, at);
    varargs.flags = TVF_TUPLE;
    bool *set = calloc((size_t)m->nnames + 1, 1);
    if (!set) return oom(c, at);
    int rc = 0;
    for (int i = 0; i < nargs && rc == 0; i++) {
        if (i < m->nnames) {
            if (!tscope_set(c, s, m->names[i], args[i])) rc = oom(c, at);
            set[i] = true;
        } else if (!tv_list_push(&c->arena, &varargs, args[i])) {
            rc = oom(c, at);
        }
    }
    for (int k = 0; k < nkw && rc == 0; k++) {
        int idx = -1;
        for (int i = 0; i < m->nnames; i++)
            if (strcmp(m->names[i], kwnames[k]) == 0) idx = i;
        if (idx >= 0) {
            if (set[idx]) rc = tmpl_fail(c, at, LM_ERR_INVALID_ARG, "macro '%s' got multiple values for argument '%s'",
                                         m->name ? m->name : "caller", kwnames[k]);
            else if (!tscope_set(c, s, m->names[idx], kwvals[k])) rc = oom(c, at);
            set[idx] = true;
        } else if (!tv_dict_set(&c->arena, &kwargs, tv_cstr(&c->arena, kwnames[k]), kwvals[k])) {
            rc = oom(c, at);
        }
    }
    tscope *saved = t_scope;
    t_scope = s;
    for (int i = 0; i < m->nnames && rc == 0; i++) {
        if (set[i]) continue;
        tv v;
        if (m->items2 && m->items2[i]) {
            if (tmpl_eval(c, m->items2[i], &v)) rc = -1;
        } else {
            v = tv_undef(hintf(c, "parameter '%s' was not provided", m->names[i]));
        }
        if (rc == 0 && !tscope_set(c, s, m->names[i], v)) rc = oom(c, at);
    }
    t_scope = saved;
    free(set);
    if (rc) return -1;
    if (!tscope_set(c, s, "varargs", varargs) || !tscope_set(c, s, "kwargs", kwargs)) return oom(c, at);
    if (fn->caller.t == TV_FUNC && !tscope_set(c, s, "caller", fn->caller)) return oom(c, at);
    c->depth++;
    rc = capture(c, m->b, s, out);
    c->depth--;
    return rc;
}

int tmpl_call_value(tmpl_ctx *c, const tnode *at, tv fn, int nargs, const tv *args, int nkw,
                    const char **kwnames, const tv *kwvals, tv *out) {
    if (fn.t == TV_UNDEF) return undefined_error(c, at, fn);
    if (fn.t != TV_FUNC) return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "'%s' object is not callable", tv_typename(fn));
    tfunc *f = fn.u.fn;
    switch (f->kind) {
    case TF_MACRO:
    case TF_CALLER: return call_macro(c, at, f, nargs, args, nkw, kwnames, kwvals, out);
    case TF_METHOD: return tmpl_method(c, at, f->self, f->name, nargs, args, nkw, kwnames, kwvals, out);
    case TF_UNSAFE:
        return tmpl_fail(c, at, LM_ERR_INVALID_ARG, "access to attribute '%s' of '%s' object is unsafe", f->name,
                         tv_typename(f->self));
    case TF_BUILTIN: {
        tv self = tv_none();
        return tmpl_method(c, at, self, f->name, nargs, args, nkw, kwnames, kwvals, out);
    }
    }
    return tmpl_fail(c, at, LM_ERR_INTERNAL, "bad callable");
}

/* Evaluates a node's positional and keyword arguments into arrays (malloc'd; caller frees). */
static int eval_args(tmpl_ctx *c, const tnode *n, tv **args, tv **kw) {
    *args = NULL;
    *kw = NULL;
    if (n->nitems) {
        *args = malloc((size_t)n->nitems * sizeof **args);
        if (!*args) return oom(c, n);
        for (int i = 0; i < n->nitems; i++)
            if (tmpl_eval(c, n->items[i], &(*args)[i])) return -1;
    }
    if (n->nitems2) {
        *kw = malloc((size_t)n->nitems2 * sizeof **kw);
        if (!*kw) return oom(c, n);
        for (int i = 0; i < n->nitems2; i++)
            if (tmpl_eval(c, n->items2[i], &(*kw)[i])) return -1;
    }
    return 0;
}

static int apply_filter(tmpl_ctx *c, const tnode *f, tv val, tv *out) {
    tv *args, *kw;
    int rc = eval_args(c, f, &args, &kw);
    if (rc == 0) {
        rc = tmpl_filter(c, f, f->name, val, f->nitems, args, f->nitems2, f->names, kw, out);
        if (rc == -2) rc = tmpl_fail(c, f, LM_ERR_UNSUPPORTED, "no filter named '%s'", f->name);
    }
    free(args);
    free(kw);
    return rc;
}

/* Applies a filter chain whose innermost operand is NULL (filter blocks, set blocks) to val. */
static int apply_filter_chain(tmpl_ctx *c, const tnode *f, tv val, tv *out) {
    if (!f) {
        *out = val;
        return 0;
    }
    tv inner;
    if (apply_filter_chain(c, f->a, val, &inner)) return -1;
    return apply_filter(c, f, inner, out);
}

/* ------------------------------------------------------------------ expressions */

int tmpl_eval(tmpl_ctx *c, const tnode *n, tv *out) {
    if (step(c, n)) return -1;
    switch (n->kind) {
    case N_CONST: *out = n->k; return 0;
    case N_NAME: {
        tv *v = tscope_lookup(t_scope, n->name);
        *out = v ? *v : tv_undef(hintf(c, "'%s' is undefined", n->name));
        return 0;
    }
    case N_LIST:
    case N_TUPLE:
        *out = tv_list_new(&c->arena, (size_t)n->nitems);
        if (out->t != TV_LIST) return oom(c, n);
        if (n->kind == N_TUPLE) out->flags = TVF_TUPLE;
        for (int i = 0; i < n->nitems; i++) {
            if (tmpl_eval(c, n->items[i], &out->u.l->v[i])) return -1;
            out->u.l->n++;
        }
        return 0;
    case N_DICT:
        *out = tv_dict_new(&c->arena, (size_t)n->nitems);
        if (out->t != TV_DICT) return oom(c, n);
        for (int i = 0; i < n->nitems; i++) {
            tv k, v;
            if (tmpl_eval(c, n->items[i], &k) || tmpl_eval(c, n->items2[i], &v)) return -1;
            if (k.t == TV_LIST && !(k.flags & TVF_TUPLE)) return tmpl_fail(c, n, LM_ERR_INVALID_ARG, "unhashable type: 'list'");
            if (k.t == TV_DICT || k.t == TV_NS) return tmpl_fail(c, n, LM_ERR_INVALID_ARG, "unhashable type: 'dict'");
            if (!tv_dict_set(&c->arena, out, k, v)) return oom(c, n);
        }
        return 0;
    case N_GETATTR: {
        tv obj;
        if (tmpl_eval(c, n->a, &obj)) return -1;
        return tmpl_getattr(c, n, obj, n->name, out);
    }
    case N_GETITEM: {
        tv obj, key;
        if (tmpl_eval(c, n->a, &obj)) return -1;
        if (n->b->kind == N_SLICE) {
            tv s = tv_none(), e = tv_none(), st = tv_none();
            if ((n->b->b && tmpl_eval(c, n->b->b, &s)) || (n->b->c && tmpl_eval(c, n->b->c, &e)) ||
                (n->b->d && tmpl_eval(c, n->b->d, &st)))
                return -1;
            return do_slice(c, n, obj, s, e, st, out);
        }
        if (tmpl_eval(c, n->b, &key)) return -1;
        return tmpl_getitem(c, n, obj, key, out);
    }
    case N_SLICE: return tmpl_fail(c, n, LM_ERR_FORMAT, "a slice outside of a subscript");
    case N_CALL: {
        tv fn, *args, *kw;
        if (tmpl_eval(c, n->a, &fn)) return -1;
        int rc = eval_args(c, n, &args, &kw);
        if (rc == 0) rc = tmpl_call_value(c, n, fn, n->nitems, args, n->nitems2, n->names, kw, out);
        free(args);
        free(kw);
        return rc;
    }
    case N_FILTER: {
        tv val;
        if (tmpl_eval(c, n->a, &val)) return -1;
        return apply_filter(c, n, val, out);
    }
    case N_TEST: {
        tv val, *args, *kw;
        bool r = false;
        if (tmpl_eval(c, n->a, &val)) return -1;
        int rc = eval_args(c, n, &args, &kw);
        if (rc == 0) {
            rc = tmpl_test(c, n, n->name, val, n->nitems, args, &r);
            if (rc == -2) rc = tmpl_fail(c, n, LM_ERR_UNSUPPORTED, "no test named '%s'", n->name);
        }
        free(args);
        free(kw);
        if (rc) return -1;
        *out = tv_bool(n->op ? !r : r);
        return 0;
    }
    case N_NEG:
    case N_POS: {
        tv v;
        if (tmpl_eval(c, n->a, &v)) return -1;
        if (v.t == TV_UNDEF) return undefined_error(c, n, v);
        if (v.t == TV_INT || v.t == TV_BOOL) {
            if (n->kind == N_NEG && ival(v) == INT64_MIN) return tmpl_fail(c, n, LM_ERR_UNSUPPORTED, "integer overflow");
            *out = tv_int(n->kind == N_NEG ? -ival(v) : ival(v));
        } else if (v.t == TV_FLOAT) {
            *out = tv_float(n->kind == N_NEG ? -v.u.f : v.u.f);
        } else {
            return tmpl_fail(c, n, LM_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+',
                             tv_typename(v));
        }
        return 0;
    }
    case N_NOT: {
        tv v;
        if (tmpl_eval(c, n->a, &v)) return -1;
        *out = tv_bool(!tv_truthy(v));
        return 0;
    }
    case N_AND:
    case N_OR: {
        tv a;
        if (tmpl_eval(c, n->a, &a)) return -1;
        bool t = tv_truthy(a);
        if ((n->kind == N_AND && !t) || (n->kind == N_OR && t)) {
            *out = a;
            return 0;
        }
        return tmpl_eval(c, n->b, out);
    }
    case N_BINOP: {
        tv a, b;
        if (tmpl_eval(c, n->a, &a) || tmpl_eval(c, n->b, &b)) return -1;
        return tmpl_binop(c, n, n->op, a, b, out);
    }
    case N_COMPARE: {
        tv left;
        if (tmpl_eval(c, n->a, &left)) return -1;
        for (int i = 0; i < n->nitems; i++) {
            tv right;
            bool r = false;
            if (tmpl_eval(c, n->items[i], &right) || compare_op(c, n, n->ops[i], left, right, &r)) return -1;
            if (!r) {
                *out = tv_bool(false);
                return 0;
            }
            left = right;
        }
        *out = tv_bool(true);
        return 0;
    }
    case N_COND: {
        tv cond;
        if (tmpl_eval(c, n->a, &cond)) return -1;
        if (tv_truthy(cond)) return tmpl_eval(c, n->b, out);
        if (n->c) return tmpl_eval(c, n->c, out);
        *out = tv_undef(hintf(c, "the inline if-expression evaluated to false and no else section was defined"));
        return 0;
    }
    case N_CONCAT: {
        tbuf b = {.limit = c->lim->max_memory};
        for (int i = 0; i < n->nitems; i++) {
            tv v;
            if (tmpl_eval(c, n->items[i], &v)) {
                free(b.p);
                return -1;
            }
            tv_write_str(&b, v);
        }
        int rc = 0;
        if (b.failed) rc = tmpl_fail(c, n, LM_ERR_LIMIT, "string too large");
        else {
            *out = tv_str(&c->arena, b.p ? b.p : "", b.n);
            if (out->t != TV_STR) rc = oom(c, n);
        }
        free(b.p);
        return rc;
    }
    default: return tmpl_fail(c, n, LM_ERR_INTERNAL, "statement where an expression was expected");
    }
}

/* ------------------------------------------------------------------ statements */

static int exec_stmt(tmpl_ctx *c, const tnode *n);

static int exec_body(tmpl_ctx *c, const tnode *body) {
    for (int i = 0; i < body->nitems; i++) {
        int rc = exec_stmt(c, body->items[i]);
        if (rc != FLOW_OK) return rc;
    }
    return FLOW_OK;
}

static int assign(tmpl_ctx *c, const tnode *target, tv v) {
    if (target->kind == N_NAME) {
        if (!tscope_set(c, t_scope, target->name, v)) return oom(c, target);
        return 0;
    }
    if (target->kind == N_GETATTR) {
        tv *ns = tscope_lookup(t_scope, target->a->name);
        if (!ns || ns->t != TV_NS)
            return tmpl_fail(c, target, LM_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
        tv nsd = {TV_DICT, 0, {.d = ns->u.d}};
        if (!tv_dict_set(&c->arena, &nsd, tv_cstr(&c->arena, target->name), v)) return oom(c, target);
        return 0;
    }
    /* tuple unpacking */
    tv items;
    if (v.t == TV_UNDEF) return undefined_error(c, target, v);
    if (tmpl_iterate(c, target, v, &items)) return -1;
    if (items.u.l->n != (size_t)target->nitems)
        return tmpl_fail(c, target, LM_ERR_INVALID_ARG, "%s values to unpack (expected %d, got %zu)",
                         items.u.l->n > (size_t)target->nitems ? "too many" : "not enough", target->nitems, items.u.l->n);
    for (int i = 0; i < target->nitems; i++)
        if (assign(c, target->items[i], items.u.l->v[i])) return -1;
    return 0;
}

static int exec_for(tmpl_ctx *c, const tnode *n) {
    tv seqv, seq;
    if (tmpl_eval(c, n->b, &seqv) || tmpl_iterate(c, n->b, seqv, &seq)) return -1;
    tscope *outer = t_scope;
    if (n->c) { /* for x in y if cond: filter first, so that loop.length counts what is kept */
        tv kept = tv_list_new(&c->arena, 0);
        if (kept.t != TV_LIST) return oom(c, n);
        for (size_t i = 0; i < seq.u.l->n; i++) {
            tscope *s = tscope_new(c, outer);
            if (!s) return oom(c, n);
            t_scope = s;
            tv cond;
            int rc = assign(c, n->a, seq.u.l->v[i]);
            if (rc == 0) rc = tmpl_eval(c, n->c, &cond);
            t_scope = outer;
            if (rc) return -1;
            if (tv_truthy(cond) && !tv_list_push(&c->arena, &kept, seq.u.l->v[i])) return oom(c, n);
        }
        seq = kept;
    }
    tloop *lp = tmpl_alloc(&c->arena, sizeof *lp);
    if (!lp) return oom(c, n);
    lp->items = seq.u.l;
    tv loopv = {TV_LOOP, 0, {.lp = lp}};
    size_t count = seq.u.l->n;
    for (size_t i = 0; i < count; i++) {
        if (step(c, n)) return -1;
        lp->index0 = i;
        tscope *s = tscope_new(c, outer);
        if (!s) return oom(c, n);
        t_scope = s;
        int rc = assign(c, n->a, seq.u.l->v[i]);
        if (rc == 0 && !tscope_set(c, s, "loop", loopv)) rc = oom(c, n);
        if (rc == 0) rc = exec_body(c, n->d);
        t_scope = outer;
        if (rc == FLOW_ERR) return FLOW_ERR;
        if (rc == FLOW_BREAK) break;
    }
    if (count == 0 && n->nitems2) return exec_body(c, n->items2[0]);
    return FLOW_OK;
}

static int make_macro(tmpl_ctx *c, const tnode *n, int kind, tv *out) {
    tfunc *f = tmpl_alloc(&c->arena, sizeof *f);
    if (!f) return oom(c, n);
    f->kind = (uint8_t)kind;
    f->name = n->name ? n->name : "caller";
    f->macro = n;
    f->closure = t_scope;
    out->t = TV_FUNC;
    out->flags = 0;
    out->u.fn = f;
    return 0;
}

static int exec_stmt(tmpl_ctx *c, const tnode *n) {
    if (step(c, n)) return FLOW_ERR;
    switch (n->kind) {
    case N_TEXT:
        if (!tbuf_put(&c->out, n->k.u.s->s, n->k.u.s->len))
            return tmpl_fail(c, n, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
        return FLOW_OK;
    case N_OUTPUT: {
        tv v;
        if (tmpl_eval(c, n->a, &v)) return FLOW_ERR;
        if (!tv_write_str(&c->out, v))
            return tmpl_fail(c, n, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
        return FLOW_OK;
    }
    case N_BODY: return exec_body(c, n);
    case N_IF: {
        tv cond;
        if (tmpl_eval(c, n->a, &cond)) return FLOW_ERR;
        if (tv_truthy(cond)) return exec_body(c, n->b);
        if (n->c) return n->c->kind == N_IF ? exec_stmt(c, n->c) : exec_body(c, n->c);
        return FLOW_OK;
    }
    case N_FOR: return exec_for(c, n);
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_SET: {
        tv v;
        if (tmpl_eval(c, n->b, &v) || assign(c, n->a, v)) return FLOW_ERR;
        return FLOW_OK;
    }
    case N_SETBLOCK: {
        tv v, f;
        tscope *s = tscope_new(c, t_scope);
        if (!s) return oom(c, n);
        if (capture(c, n->b, s, &v) || apply_filter_chain(c, n->c, v, &f) || assign(c, n->a, f)) return FLOW_ERR;
        return FLOW_OK;
    }
    case N_MACRO: {
        tv m;
        if (make_macro(c, n, TF_MACRO, &m)) return FLOW_ERR;
        if (!tscope_set(c, t_scope, n->name, m)) return oom(c, n);
        return FLOW_OK;
    }
    case N_CALLBLOCK: {
        const tnode *call = n->a;
        tv fn, caller, *args, *kw, result;
        if (tmpl_eval(c, call->a, &fn)) return FLOW_ERR;
        if (fn.t != TV_FUNC || fn.u.fn->kind != TF_MACRO)
            return tmpl_fail(c, n, LM_ERR_UNSUPPORTED, "{%% call %%} needs a macro");
        if (make_macro(c, n, TF_CALLER, &caller)) return FLOW_ERR;
        tfunc *copy = tmpl_alloc(&c->arena, sizeof *copy);
        if (!copy) return oom(c, n);
        *copy = *fn.u.fn;
        copy->caller = caller;
        fn.u.fn = copy;
        int rc = eval_args(c, call, &args, &kw);
        if (rc == 0) rc = call_macro(c, n, copy, call->nitems, args, call->nitems2, call->names, kw, &result);
        free(args);
        free(kw);
        if (rc) return FLOW_ERR;
        if (!tv_write_str(&c->out, result))
            return tmpl_fail(c, n, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
        return FLOW_OK;
    }
    case N_FILTERBLOCK: {
        tv v, f;
        if (capture(c, n->b, t_scope, &v) || apply_filter_chain(c, n->a, v, &f)) return FLOW_ERR;
        if (!tv_write_str(&c->out, f))
            return tmpl_fail(c, n, LM_ERR_LIMIT, "output larger than %zu bytes", c->lim->max_output);
        return FLOW_OK;
    }
    default: return tmpl_fail(c, n, LM_ERR_INTERNAL, "expression where a statement was expected");
    }
}

/* Entry point used by template.c: runs the tree with `vars` (a dict) as the context. */
int tmpl_run(tmpl_ctx *c, const tnode *root, tv vars) {
    tscope *g = tmpl_make_globals(c);
    if (!g) return oom(c, root);
    tscope *top = tscope_new(c, g);
    if (!top) return oom(c, root);
    if (vars.t == TV_DICT) {
        for (size_t i = 0; i < vars.u.d->n; i++) {
            if (vars.u.d->k[i].t != TV_STR) continue;
            if (!tscope_set(c, top, vars.u.d->k[i].u.s->s, vars.u.d->v[i])) return oom(c, root);
        }
    }
    c->globals = top;
    tscope *saved = t_scope;
    t_scope = top;
    int rc = exec_body(c, root);
    t_scope = saved;
    return rc == FLOW_ERR ? -1 : 0;
}
