/* Internals of the chat-template interpreter: values, the syntax tree, the arena both live in,
 * and the entry points shared by the lexer, parser, evaluator and built-ins.
 *
 * Memory: a template's tree lives in the template's arena (freed by lm_template_free); every value
 * made while rendering lives in the render's arena (freed when the render returns). Values are
 * never freed one by one, so they are plain structs that copy freely; the arena has a byte cap so
 * that a template cannot grow memory without bound. */
#ifndef LM_TMPL_INTERNAL_H
#define LM_TMPL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/template/template.h"

/* ------------------------------------------------------------------ arena */

typedef struct tmpl_chunk tmpl_chunk;
typedef struct tmpl_arena {
    tmpl_chunk *head;
    size_t used;  /* bytes handed out, all chunks */
    size_t cap;   /* 0 = unlimited */
    bool failed;  /* an allocation failed or passed the cap */
    bool over_cap; /* ... and it was the cap */
} tmpl_arena;

void *tmpl_alloc(tmpl_arena *a, size_t n); /* zeroed; NULL (and a->failed) past the cap */
char *tmpl_strndup(tmpl_arena *a, const char *s, size_t n);
void tmpl_arena_free(tmpl_arena *a);

/* ------------------------------------------------------------------ values */

typedef enum tv_type {
    TV_UNDEF = 0, /* jinja2's Undefined: prints empty, iterates empty, fails on most use */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,  /* list or tuple (flags), also the result of select/map (a "generator") */
    TV_DICT,  /* insertion-ordered mapping */
    TV_NS,    /* namespace(): a dict whose attributes can be assigned */
    TV_FUNC,  /* a callable: built-in global, bound method, macro, caller */
    TV_LOOP,  /* the `loop` object of a for loop */
} tv_type;

/* TVF_GEN: a generator (select/map/...: no len, no index, prints as an object); TVF_RANGE: a range()
 * (indexes like a list, prints as range(a, b), no + or *); TVF_SAFE: markupsafe.Markup */
enum { TVF_TUPLE = 1, TVF_GEN = 2, TVF_SAFE = 4, TVF_RANGE = 8 };

typedef struct tstr { size_t len; char s[]; } tstr;     /* UTF-8, NUL-terminated after len */
typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tfunc tfunc;
typedef struct tloop tloop;

typedef struct tv {
    uint8_t t;     /* tv_type */
    uint8_t flags; /* TVF_* */
    union {
        bool b;
        int64_t i;
        double f;
        tstr *s;
        tlist *l;
        tdict *d;
        tfunc *fn;
        tloop *lp;
        const char *hint; /* TV_UNDEF: why it is undefined, for the error sentence (may be NULL) */
    } u;
} tv;

struct tlist { size_t n, cap; tv *v; int64_t rstart, rstop, rstep; /* TVF_RANGE */ };
struct tdict { size_t n, cap; tv *k; tv *v; };

/* ------------------------------------------------------------------ syntax tree */

typedef enum tnode_kind {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE,
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_BINOP, N_AND, N_OR, N_COMPARE, N_COND, N_CONCAT,
} tnode_kind;

typedef enum tmpl_op {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
} tmpl_op;

typedef struct tnode tnode;
struct tnode {
    uint8_t kind;
    uint8_t op;       /* N_BINOP: tmpl_op; N_TEST: 1 = negated; N_FOR: 1 = recursive */
    int line, col;
    tnode *a, *b, *c, *d;
    tnode **items;    /* body statements, call args, list items, dict keys, compare operands */
    int nitems;
    tnode **items2;   /* else body, kwarg values, dict values */
    int nitems2;
    const char **names; /* kwarg names, for/set targets, macro params */
    int nnames;
    uint8_t *ops;     /* N_COMPARE: the operators, one per operand */
    const char *name; /* identifier, attribute, filter or test name */
    tv k;             /* N_CONST / N_TEXT value (in the template's arena) */
};

/* ------------------------------------------------------------------ the template */

struct lm_template {
    tmpl_arena arena;
    tnode *root;
};

/* Parses source into t->root (t->arena); on failure returns an lm_status with the sentence set,
 * naming line and column. */
lm_status tmpl_parse(lm_template *t, const char *src, size_t len);

/* ------------------------------------------------------------------ rendering */

typedef struct tscope tscope;
typedef struct tmpl_ctx tmpl_ctx;

/* A string being built in the render arena's budget (malloc'd, capped). */
typedef struct tbuf { char *p; size_t n, cap, limit; bool failed; } tbuf;
bool tbuf_put(tbuf *b, const char *s, size_t n);
bool tbuf_putc(tbuf *b, char c);
bool tbuf_printf(tbuf *b, const char *fmt, ...);

struct tmpl_ctx {
    tmpl_arena arena;
    tbuf out;
    const lm_template_limits *lim;
    uint64_t steps;
    int depth;
    int64_t now;           /* strftime_now instant; < 0 = the real clock */
    tscope *globals;
    lm_status err;         /* first error, LM_OK while none */
    char errmsg[512];
    int errline;
};

/* Records the first error (later ones are ignored) and returns -1, so that failure paths read
 * `return tmpl_fail(c, node, LM_ERR_FORMAT, "...")`. */
int tmpl_fail(tmpl_ctx *c, const tnode *at, lm_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* value constructors */
static inline tv tv_undef(const char *hint) { tv v = {TV_UNDEF, 0, {.hint = hint}}; return v; }
static inline tv tv_none(void) { tv v = {TV_NONE, 0, {.i = 0}}; return v; }
static inline tv tv_bool(bool b) { tv v = {TV_BOOL, 0, {.b = b}}; return v; }
static inline tv tv_int(int64_t i) { tv v = {TV_INT, 0, {.i = i}}; return v; }
static inline tv tv_float(double f) { tv v = {TV_FLOAT, 0, {.f = f}}; return v; }
tv tv_str(tmpl_arena *a, const char *s, size_t n);     /* TV_UNDEF with hint NULL on OOM: check arena */
tv tv_cstr(tmpl_arena *a, const char *s);
tv tv_list_new(tmpl_arena *a, size_t cap);
bool tv_list_push(tmpl_arena *a, tv *list, tv item);
tv tv_dict_new(tmpl_arena *a, size_t cap);
bool tv_dict_set(tmpl_arena *a, tv *dict, tv key, tv val); /* replaces an equal key in place */
tv *tv_dict_get(const tdict *d, tv key);                   /* NULL when absent */
tv *tv_dict_gets(const tdict *d, const char *key);

/* memcpy of n values that tolerates empty (NULL) arrays */
static inline void tv_copy(tv *dst, const tv *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

bool tv_truthy(tv v);
bool tv_equal(tv a, tv b);
/* Python ordering; returns false (no error set) when the types do not order. */
bool tv_compare(tv a, tv b, int *cmp);
const char *tv_typename(tv v); /* Python's type name, for error sentences */
bool tv_is_str(tv v);
bool tv_is_number(tv v); /* int, float or bool */

/* str(v) and repr(v) as Python writes them, appended to b */
bool tv_write_str(tbuf *b, tv v);
bool tv_write_repr(tbuf *b, tv v);
void tv_format_float(double f, char *out, size_t cap); /* Python repr of a float */
tv tv_to_str(tmpl_ctx *c, tv v);                      /* str(v) as a TV_STR */

/* JSON: parse into values (ints stay ints), and json.dumps as transformers' tojson calls it. */
bool tv_from_json(tmpl_arena *a, const char *s, size_t n, tv *out, char *err, size_t errcap);
typedef struct tjson_opts { bool ensure_ascii; const char *indent; bool has_indent; const char *item_sep;
                            const char *key_sep; bool sort_keys; } tjson_opts;
int tv_write_json(tmpl_ctx *c, const tnode *at, tbuf *b, tv v, const tjson_opts *o, int depth);

/* UTF-8 helpers */
size_t tmpl_utf8_count(const char *s, size_t n);
size_t tmpl_utf8_decode(const char *s, size_t n, uint32_t *cp); /* bytes used, >= 1 */
bool tmpl_is_space_cp(uint32_t cp);                              /* Python str.isspace */

/* ------------------------------------------------------------------ evaluator <-> built-ins */

int tmpl_eval(tmpl_ctx *c, const tnode *n, tv *out);
int tmpl_call_value(tmpl_ctx *c, const tnode *at, tv fn, int nargs, const tv *args, int nkw,
                    const char **kwnames, const tv *kwvals, tv *out);
int tmpl_getattr(tmpl_ctx *c, const tnode *at, tv obj, const char *name, tv *out);
int tmpl_getitem(tmpl_ctx *c, const tnode *at, tv obj, tv key, tv *out);
/* Materializes anything iterable (list, tuple, dict keys, string chars, undefined = empty). */
int tmpl_iterate(tmpl_ctx *c, const tnode *at, tv v, tv *out_list);
int tmpl_binop(tmpl_ctx *c, const tnode *at, int op, tv a, tv b, tv *out);

/* Built-in filters / tests / globals / methods (tmpl_builtins.c). Each returns 0 or -1 (error set);
 * a name that does not exist returns -2 with no error set. */
int tmpl_filter(tmpl_ctx *c, const tnode *at, const char *name, tv val, int nargs, const tv *args,
                int nkw, const char **kwnames, const tv *kwvals, tv *out);
int tmpl_test(tmpl_ctx *c, const tnode *at, const char *name, tv val, int nargs, const tv *args, bool *out);
bool tmpl_filter_exists(const char *name);
bool tmpl_test_exists(const char *name);
int tmpl_method(tmpl_ctx *c, const tnode *at, tv self, const char *name, int nargs, const tv *args,
                int nkw, const char **kwnames, const tv *kwvals, tv *out);
bool tmpl_has_method(tv self, const char *name);
tscope *tmpl_make_globals(tmpl_ctx *c);
/* Runs the tree with `vars` (a dict, or undefined for none) as the context; 0 or -1 (c->err set). */
int tmpl_run(tmpl_ctx *c, const tnode *root, tv vars);

/* callables */
typedef enum tfunc_kind { TF_BUILTIN, TF_METHOD, TF_MACRO, TF_CALLER, TF_UNSAFE } tfunc_kind;
struct tfunc {
    uint8_t kind;
    const char *name;     /* built-in / method name */
    tv self;              /* TF_METHOD receiver */
    const tnode *macro;   /* TF_MACRO / TF_CALLER: the N_MACRO or N_CALLBLOCK node */
    tscope *closure;      /* scope the macro or caller body reads through */
    tv caller;            /* TF_MACRO called from {% call %}: the caller function */
};

struct tloop {
    tlist *items;
    size_t index0;
    tv self_fn; /* unused placeholder to keep loop.cycle simple */
};

/* scopes: a chain of small name -> value maps */
struct tscope {
    tscope *parent;
    size_t n, cap;
    const char **names;
    tv *vals;
};
tscope *tscope_new(tmpl_ctx *c, tscope *parent);
bool tscope_set(tmpl_ctx *c, tscope *s, const char *name, tv v);
tv *tscope_lookup(tscope *s, const char *name);

#endif
