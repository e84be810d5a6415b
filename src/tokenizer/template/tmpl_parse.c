/* Lexer and parser: template source -> syntax tree.
 *
 * The lexer follows jinja2's rules as transformers configures them: newlines (\r\n, \r, \v, \f,
 * \x1c-\x1e, U+0085, U+2028, U+2029) become "\n" and one trailing newline is dropped
 * (keep_trailing_newline=False); trim_blocks drops the newline after a block or comment tag;
 * lstrip_blocks drops spaces and tabs before a block or comment tag that starts a line; "-" on a
 * tag strips all whitespace on that side, "+" disables lstrip / trim for that tag. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/template/tmpl_internal.h"

typedef enum tk_type {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
} tk_type;

typedef struct tk {
    uint8_t type;
    char op[4];
    int line, col;
    const char *s; /* TEXT / NAME / STRING: bytes (arena) */
    size_t len;
    int64_t ival;
    double fval;
} tk;

typedef struct parser {
    lm_template *t;
    const char *src; /* normalized source */
    size_t n;
    tk *toks;
    size_t ntok, captok, pos;
    int depth;
    int loop_depth;
    size_t lc_pos; /* pos_to_linecol's cursor */
    int lc_line, lc_col;
    lm_status st;
    char err[300];
} parser;

static int perr(parser *p, lm_status st, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static int perr(parser *p, lm_status st, int line, int col, const char *fmt, ...) {
    if (p->st != LM_OK) return -1;
    char msg[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, sizeof p->err, "template:%d:%d: %s", line, col, msg);
    p->st = st;
    return -1;
}

/* ------------------------------------------------------------------ source normalization */

/* Length of a line break at s (0 if none), per Python's str.splitlines. */
static size_t linebreak_len(const char *s, size_t n) {
    unsigned char c = (unsigned char)s[0];
    if (c == '\r') return (n > 1 && s[1] == '\n') ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
    if (c == 0xc2 && n > 1 && (unsigned char)s[1] == 0x85) return 2;
    if (c == 0xe2 && n > 2 && (unsigned char)s[1] == 0x80 && ((unsigned char)s[2] == 0xa8 || (unsigned char)s[2] == 0xa9))
        return 3;
    return 0;
}

static char *normalize_source(tmpl_arena *a, const char *src, size_t len, size_t *out_len) {
    char *o = tmpl_alloc(a, len + 1);
    if (!o) return NULL;
    size_t j = 0;
    bool ended_with_break = false;
    for (size_t i = 0; i < len;) {
        size_t k = linebreak_len(src + i, len - i);
        if (k) {
            o[j++] = '\n';
            i += k;
            ended_with_break = (i == len);
        } else {
            o[j++] = src[i++];
        }
    }
    if (ended_with_break) j--; /* keep_trailing_newline=False */
    o[j] = '\0';
    *out_len = j;
    return o;
}

/* ------------------------------------------------------------------ lexer */

static bool push_tok(parser *p, tk t) {
    if (p->ntok == p->captok) {
        size_t nc = p->captok ? p->captok * 2 : 256;
        tk *nt = realloc(p->toks, nc * sizeof *nt);
        if (!nt) return false;
        p->toks = nt;
        p->captok = nc;
    }
    p->toks[p->ntok++] = t;
    return true;
}

static void pos_to_linecol(parser *p, size_t pos, int *line, int *col) {
    /* Tokens are asked for in source order, so a forward-moving cursor keeps this linear. */
    if (pos < p->lc_pos || p->lc_line == 0) {
        p->lc_pos = 0;
        p->lc_line = 1;
        p->lc_col = 1;
    }
    for (; p->lc_pos < pos; p->lc_pos++) {
        if (p->src[p->lc_pos] == '\n') {
            p->lc_line++;
            p->lc_col = 1;
        } else if (((unsigned char)p->src[p->lc_pos] & 0xc0) != 0x80) {
            p->lc_col++;
        }
    }
    *line = p->lc_line;
    *col = p->lc_col;
}

/* Python's \s: bytes of one whitespace code point at s, or 0. */
static size_t space_len(const char *s, size_t n) {
    uint32_t cp;
    size_t k = tmpl_utf8_decode(s, n, &cp);
    return tmpl_is_space_cp(cp) ? k : 0;
}

/* Length of the text with trailing whitespace (Python str.rstrip()) removed. */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t k = 1;
        while (k < n && k < 4 && ((unsigned char)s[n - k] & 0xc0) == 0x80) k++;
        if (space_len(s + n - k, k) != k) break;
        n -= k;
    }
    return n;
}

static size_t skip_spaces(const char *s, size_t i, size_t n) {
    while (i < n) {
        size_t k = space_len(s + i, n - i);
        if (!k) break;
        i += k;
    }
    return i;
}

static int emit_text(parser *p, const char *s, size_t len, size_t at) {
    if (len == 0) return 0;
    tk t = {.type = TK_TEXT, .s = s, .len = len};
    pos_to_linecol(p, at, &t.line, &t.col);
    if (!push_tok(p, t)) return perr(p, LM_ERR_NO_MEMORY, t.line, t.col, "out of memory");
    return 0;
}

/* Decodes a string literal body (Python unicode-escape rules jinja2 applies) into the arena. */
static int lex_string(parser *p, size_t *ip, tk *t) {
    const char *s = p->src;
    size_t i = *ip, n = p->n;
    char q = s[i++];
    size_t start = i;
    while (i < n && s[i] != q) {
        if (s[i] == '\\' && i + 1 < n) i++;
        i++;
    }
    if (i >= n) return perr(p, LM_ERR_FORMAT, t->line, t->col, "unterminated string literal");
    size_t end = i;
    *ip = i + 1;
    char *o = tmpl_alloc(&p->t->arena, (end - start) * 2 + 1);
    if (!o) return perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
    size_t j = 0;
    for (i = start; i < end; i++) {
        if (s[i] != '\\') { o[j++] = s[i]; continue; }
        char e = s[++i];
        uint32_t cp = 0;
        int nhex = 0;
        switch (e) {
        case '\n': continue;
        case '\\': o[j++] = '\\'; continue;
        case '\'': o[j++] = '\''; continue;
        case '"': o[j++] = '"'; continue;
        case 'a': o[j++] = '\a'; continue;
        case 'b': o[j++] = '\b'; continue;
        case 'f': o[j++] = '\f'; continue;
        case 'n': o[j++] = '\n'; continue;
        case 'r': o[j++] = '\r'; continue;
        case 't': o[j++] = '\t'; continue;
        case 'v': o[j++] = '\v'; continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                int k = 0;
                while (k < 3 && i < end && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), k++;
                i--;
                goto put_cp;
            }
            o[j++] = '\\'; /* unknown escapes keep their backslash */
            o[j++] = e;
            continue;
        }
        for (int k = 0; k < nhex; k++) {
            char h = (i + 1 < end) ? s[i + 1] : 0;
            int d = isdigit((unsigned char)h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) return perr(p, LM_ERR_FORMAT, t->line, t->col, "truncated \\%c escape in string literal", e);
            cp = cp * 16 + (uint32_t)d;
            i++;
        }
    put_cp:
        if (cp > 0x10FFFF) return perr(p, LM_ERR_FORMAT, t->line, t->col, "escape out of Unicode range in string literal");
        if (cp < 0x80) o[j++] = (char)cp;
        else if (cp < 0x800) { o[j++] = (char)(0xc0 | (cp >> 6)); o[j++] = (char)(0x80 | (cp & 0x3f)); }
        else if (cp < 0x10000) { o[j++] = (char)(0xe0 | (cp >> 12)); o[j++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[j++] = (char)(0x80 | (cp & 0x3f)); }
        else { o[j++] = (char)(0xf0 | (cp >> 18)); o[j++] = (char)(0x80 | ((cp >> 12) & 0x3f)); o[j++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[j++] = (char)(0x80 | (cp & 0x3f)); }
    }
    o[j] = '\0';
    t->type = TK_STRING;
    t->s = o;
    t->len = j;
    return 0;
}

static int lex_number(parser *p, size_t *ip, tk *t) {
    const char *s = p->src;
    size_t i = *ip, n = p->n, start = i;
    char buf[128];
    size_t bl = 0;
    bool is_float = false;
    while (i < n && (isdigit((unsigned char)s[i]) || (s[i] == '_' && i + 1 < n && isdigit((unsigned char)s[i + 1])))) {
        if (s[i] != '_' && bl < sizeof buf - 1) buf[bl++] = s[i];
        i++;
    }
    if (i + 1 < n && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        is_float = true;
        if (bl < sizeof buf - 1) buf[bl++] = s[i];
        i++;
        while (i < n && (isdigit((unsigned char)s[i]) || (s[i] == '_' && i + 1 < n && isdigit((unsigned char)s[i + 1])))) {
            if (s[i] != '_' && bl < sizeof buf - 1) buf[bl++] = s[i];
            i++;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t k = i + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        if (k < n && isdigit((unsigned char)s[k])) {
            is_float = true;
            while (i < k && bl < sizeof buf - 1) buf[bl++] = s[i++];
            while (i < n && isdigit((unsigned char)s[i])) {
                if (bl < sizeof buf - 1) buf[bl++] = s[i];
                i++;
            }
        }
    }
    buf[bl] = '\0';
    if (i - start >= sizeof buf - 1) return perr(p, LM_ERR_LIMIT, t->line, t->col, "number literal too long");
    *ip = i;
    if (is_float) {
        t->type = TK_FLOAT;
        t->fval = strtod(buf, NULL);
    } else {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return perr(p, LM_ERR_UNSUPPORTED, t->line, t->col, "integer literal beyond 64 bits");
        t->type = TK_INT;
        t->ival = v;
    }
    return 0;
}

/* Lexes the inside of {{ }} or {% %} starting at *ip; stops after the closing tag. */
static int lex_tag(parser *p, size_t *ip, bool block, bool *line_starting) {
    const char *s = p->src;
    size_t i = *ip, n = p->n;
    int balance = 0;
    for (;;) {
        i = skip_spaces(s, i, n);
        tk t = {0};
        pos_to_linecol(p, i, &t.line, &t.col);
        if (i >= n) return perr(p, LM_ERR_FORMAT, t.line, t.col, "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        if (balance == 0) {
            const char *end = block ? "%}" : "}}";
            size_t k = 0;
            char ctrl = 0;
            if ((s[i] == '-' || s[i] == '+') && i + 2 < n + 0 && strncmp(s + i + 1, end, 2) == 0) ctrl = s[i], k = 3;
            else if (i + 1 < n && strncmp(s + i, end, 2) == 0) k = 2;
            if (k && !(ctrl == '+' && !block)) {
                i += k;
                if (ctrl == '-') {
                    i = skip_spaces(s, i, n);
                } else if (block && ctrl != '+' && i < n && s[i] == '\n') {
                    i++; /* trim_blocks */
                }
                *line_starting = i > 0 && s[i - 1] == '\n';
                t.type = block ? TK_BLOCK_END : TK_VAR_END;
                if (!push_tok(p, t)) return perr(p, LM_ERR_NO_MEMORY, t.line, t.col, "out of memory");
                *ip = i;
                return 0;
            }
        }
        unsigned char c = (unsigned char)s[i];
        if (isalpha(c) || c == '_') {
            size_t st = i;
            while (i < n && (isalnum((unsigned char)s[i]) || s[i] == '_')) i++;
            t.type = TK_NAME;
            t.s = s + st;
            t.len = i - st;
        } else if (isdigit(c)) {
            if (lex_number(p, &i, &t)) return -1;
        } else if (c == '\'' || c == '"') {
            if (lex_string(p, &i, &t)) return -1;
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
            t.type = TK_OP;
            bool two = false;
            for (int k = 0; ops2[k]; k++)
                if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) two = true;
            if (two) {
                t.op[0] = s[i];
                t.op[1] = s[i + 1];
                i += 2;
            } else if (strchr("+-/*%~[](){}><=.:|,;", c) && c) {
                t.op[0] = (char)c;
                i++;
                if (c == '(' || c == '[' || c == '{') balance++;
                if (c == ')' || c == ']' || c == '}') {
                    if (balance == 0) return perr(p, LM_ERR_FORMAT, t.line, t.col, "unexpected '%c'", c);
                    balance--;
                }
            } else {
                return perr(p, LM_ERR_FORMAT, t.line, t.col, "unexpected character '%c'", c >= 32 && c < 127 ? c : '?');
            }
        }
        if (!push_tok(p, t)) return perr(p, LM_ERR_NO_MEMORY, t.line, t.col, "out of memory");
    }
}

static bool is_raw_open(parser *p, size_t begin_tok) {
    return p->ntok == begin_tok + 3 && p->toks[begin_tok + 1].type == TK_NAME &&
           p->toks[begin_tok + 1].len == 3 && memcmp(p->toks[begin_tok + 1].s, "raw", 3) == 0;
}

static int lex(parser *p) {
    const char *s = p->src;
    size_t n = p->n, pos = 0;
    bool line_starting = true;
    while (pos < n) {
        size_t start = pos;
        int kind = 0; /* '{', '%', '#' */
        while (start + 1 < n) {
            if (s[start] == '{' && (s[start + 1] == '{' || s[start + 1] == '%' || s[start + 1] == '#')) {
                kind = s[start + 1];
                break;
            }
            start++;
        }
        if (!kind) return emit_text(p, s + pos, n - pos, pos);
        char ctrl = (start + 2 < n && (s[start + 2] == '-' || s[start + 2] == '+')) ? s[start + 2] : 0;
        size_t tlen = start - pos;
        if (ctrl == '-') {
            tlen = rstrip_len(s + pos, tlen);
        } else if (kind != '{' && ctrl != '+') {
            size_t l_pos = tlen;
            while (l_pos > 0 && s[pos + l_pos - 1] != '\n') l_pos--;
            if ((l_pos > 0 || line_starting) && l_pos < tlen) {
                size_t k = l_pos;
                while (k < tlen) {
                    size_t w = space_len(s + pos + k, tlen - k);
                    if (!w) break;
                    k += w;
                }
                if (k == tlen) tlen = l_pos;
            }
        }
        if (emit_text(p, s + pos, tlen, pos)) return -1;
        size_t i = start + 2 + (ctrl == '-' || (ctrl == '+' && kind != '{') ? 1 : 0);
        if (kind == '#') {
            size_t e = i;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) {
                int line, col;
                pos_to_linecol(p, start, &line, &col);
                return perr(p, LM_ERR_FORMAT, line, col, "missing end of comment tag");
            }
            char ectl = (e > i && (s[e - 1] == '-' || s[e - 1] == '+')) ? s[e - 1] : 0;
            e += 2;
            if (ectl == '-') e = skip_spaces(s, e, n);
            else if (ectl != '+' && e < n && s[e] == '\n') e++;
            line_starting = e > 0 && s[e - 1] == '\n';
            pos = e;
            continue;
        }
        tk bt = {.type = kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN};
        pos_to_linecol(p, start, &bt.line, &bt.col);
        size_t begin_tok = p->ntok;
        if (!push_tok(p, bt)) return perr(p, LM_ERR_NO_MEMORY, bt.line, bt.col, "out of memory");
        if (lex_tag(p, &i, kind == '%', &line_starting)) return -1;
        if (kind == '%' && is_raw_open(p, begin_tok)) {
            /* {% raw %}: text up to {% endraw %}; the opening tag does not trim its newline */
            p->ntok = begin_tok;
            size_t body = start + 2;
            while (body < n && !(s[body - 1] == '%' && s[body] == '}')) body++;
            body++;
            if (body <= n && s[body - 3] == '-') body = skip_spaces(s, body, n);
            size_t e = body;
            for (;; e++) {
                if (e + 1 >= n) return perr(p, LM_ERR_FORMAT, bt.line, bt.col, "missing {%% endraw %%}");
                if (s[e] != '{' || s[e + 1] != '%') continue;
                size_t k = e + 2;
                char c1 = (k < n && (s[k] == '-' || s[k] == '+')) ? s[k++] : 0;
                while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n')) k++;
                if (k + 6 > n || strncmp(s + k, "endraw", 6) != 0) continue;
                k += 6;
                while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n')) k++;
                char c2 = (k < n && (s[k] == '-' || s[k] == '+')) ? s[k++] : 0;
                if (k + 1 >= n + 1 || k + 2 > n || s[k] != '%' || s[k + 1] != '}') continue;
                size_t blen = e - body;
                if (c1 == '-') blen = rstrip_len(s + body, blen);
                if (emit_text(p, s + body, blen, body)) return -1;
                k += 2;
                if (c2 == '-') k = skip_spaces(s, k, n);
                else if (c2 != '+' && k < n && s[k] == '\n') k++;
                line_starting = k > 0 && s[k - 1] == '\n';
                i = k;
                break;
            }
        }
        pos = i;
    }
    return 0;
}

/* ------------------------------------------------------------------ parser helpers */

static tk *cur(parser *p) { return &p->toks[p->pos]; }
static tk *peek(parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->ntok ? i : p->ntok - 1];
}
static void adv(parser *p) {
    if (p->pos + 1 < p->ntok) p->pos++;
}
static bool is_op(const tk *t, const char *op) { return t->type == TK_OP && strcmp(t->op, op) == 0; }
static bool is_name(const tk *t, const char *name) {
    return t->type == TK_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}
static bool skip_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) return false;
    adv(p);
    return true;
}
static bool skip_name(parser *p, const char *name) {
    if (!is_name(cur(p), name)) return false;
    adv(p);
    return true;
}

static const char *tok_desc(const tk *t, char *buf, size_t cap) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: snprintf(buf, cap, "name '%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s); return buf;
    case TK_STRING: return "string literal";
    case TK_INT: return "integer literal";
    case TK_FLOAT: return "float literal";
    case TK_OP: snprintf(buf, cap, "'%s'", t->op); return buf;
    }
    return "token";
}

static int unexpected(parser *p, const char *expected) {
    char b[80];
    tk *t = cur(p);
    if (expected) return perr(p, LM_ERR_FORMAT, t->line, t->col, "expected %s, got %s", expected, tok_desc(t, b, sizeof b));
    return perr(p, LM_ERR_FORMAT, t->line, t->col, "unexpected %s", tok_desc(t, b, sizeof b));
}

static int expect_op(parser *p, const char *op) {
    if (skip_op(p, op)) return 0;
    char b[8];
    snprintf(b, sizeof b, "'%s'", op);
    return unexpected(p, b);
}

static tnode *mk(parser *p, int kind, const tk *at) {
    tnode *n = tmpl_alloc(&p->t->arena, sizeof *n);
    if (!n) {
        perr(p, LM_ERR_NO_MEMORY, at->line, at->col, "out of memory");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static const char *tok_name(parser *p, const tk *t) {
    char *s = tmpl_strndup(&p->t->arena, t->s, t->len);
    if (!s) perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
    return s;
}

/* A growable array of node pointers, copied into the arena when done. */
typedef struct nvec { tnode **v; int n, cap; const char **names; uint8_t *ops; } nvec;
static bool nvec_push(nvec *a, tnode *x) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 8;
        tnode **nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv) return false;
        a->v = nv;
        const char **nn = realloc(a->names, (size_t)nc * sizeof *nn);
        if (!nn) return false;
        a->names = nn;
        uint8_t *no = realloc(a->ops, (size_t)nc);
        if (!no) return false;
        a->ops = no;
        a->cap = nc;
    }
    a->names[a->n] = NULL;
    a->ops[a->n] = 0;
    a->v[a->n++] = x;
    return true;
}
static void nvec_free(nvec *a) {
    free(a->v);
    free(a->names);
    free(a->ops);
}
static tnode **nvec_done(parser *p, nvec *a) {
    if (a->n == 0) return NULL;
    tnode **o = tmpl_alloc(&p->t->arena, (size_t)a->n * sizeof *o);
    if (!o) {
        perr(p, LM_ERR_NO_MEMORY, cur(p)->line, cur(p)->col, "out of memory");
        return NULL;
    }
    memcpy(o, a->v, (size_t)a->n * sizeof *o);
    return o;
}
static const char **nvec_names(parser *p, nvec *a) {
    if (a->n == 0) return NULL;
    const char **o = tmpl_alloc(&p->t->arena, (size_t)a->n * sizeof *o);
    if (!o) {
        perr(p, LM_ERR_NO_MEMORY, cur(p)->line, cur(p)->col, "out of memory");
        return NULL;
    }
    memcpy(o, a->names, (size_t)a->n * sizeof *o);
    return o;
}

static bool enter(parser *p) {
    if (++p->depth > LM_TEMPLATE_MAX_NESTING) {
        perr(p, LM_ERR_LIMIT, cur(p)->line, cur(p)->col, "nesting deeper than %d levels", LM_TEMPLATE_MAX_NESTING);
        return false;
    }
    return true;
}
static void leave(parser *p) { p->depth--; }

/* ------------------------------------------------------------------ expressions */

static tnode *parse_expression(parser *p, bool with_condexpr);
static tnode *parse_or(parser *p);
static tnode *parse_unary(parser *p, bool with_filter);
static tnode *parse_primary(parser *p);
static tnode *parse_postfix(parser *p, tnode *node);
static tnode *parse_filter_expr(parser *p, tnode *node);

static bool is_tuple_end(parser *p, const char *extra_end) {
    tk *t = cur(p);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(t, ")")) return true;
    return extra_end && is_name(t, extra_end);
}

/* Comma-separated expressions; a single one without a comma is returned as is. */
static tnode *parse_tuple(parser *p, bool simplified, bool with_condexpr, bool explicit_parens,
                          const char *extra_end) {
    tk *start = cur(p);
    nvec items = {0};
    bool is_tuple = false;
    tnode *res = NULL;
    if (!enter(p)) return NULL;
    for (;;) {
        if (items.n) {
            if (!skip_op(p, ",")) break;
            is_tuple = true;
        }
        if (is_tuple_end(p, extra_end)) break;
        tnode *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!e || !nvec_push(&items, e)) goto done;
        if (!is_op(cur(p), ",")) break;
    }
    if (!is_tuple) {
        if (items.n) {
            res = items.v[0];
            goto done;
        }
        if (!explicit_parens) {
            unexpected(p, "an expression");
            goto done;
        }
    }
    res = mk(p, N_TUPLE, start);
    if (res) {
        res->nitems = items.n;
        res->items = nvec_done(p, &items);
    }
done:
    nvec_free(&items);
    leave(p);
    return p->st == LM_OK ? res : NULL;
}

static int parse_call_args(parser *p, tnode *call) {
    nvec args = {0}, kw = {0};
    if (expect_op(p, "(")) return -1;
    while (!is_op(cur(p), ")")) {
        if (args.n || kw.n) {
            if (expect_op(p, ",")) goto fail;
            if (is_op(cur(p), ")")) break;
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) {
            unexpected(p, "an argument (*args and **kwargs are not supported)");
            goto fail;
        }
        if (cur(p)->type == TK_NAME && is_op(peek(p, 1), "=")) {
            const char *nm = tok_name(p, cur(p));
            adv(p);
            adv(p);
            tnode *v = parse_expression(p, true);
            if (!nm || !v || !nvec_push(&kw, v)) goto fail;
            kw.names[kw.n - 1] = nm;
        } else {
            if (kw.n) {
                perr(p, LM_ERR_FORMAT, cur(p)->line, cur(p)->col, "positional argument after keyword argument");
                goto fail;
            }
            tnode *v = parse_expression(p, true);
            if (!v || !nvec_push(&args, v)) goto fail;
        }
    }
    adv(p);
    call->nitems = args.n;
    call->items = nvec_done(p, &args);
    call->nitems2 = kw.n;
    call->items2 = nvec_done(p, &kw);
    call->nnames = kw.n;
    call->names = nvec_names(p, &kw);
    nvec_free(&args);
    nvec_free(&kw);
    return p->st == LM_OK ? 0 : -1;
fail:
    if (p->st == LM_OK) perr(p, LM_ERR_NO_MEMORY, cur(p)->line, cur(p)->col, "out of memory");
    nvec_free(&args);
    nvec_free(&kw);
    return -1;
}

static const char *parse_dotted_name(parser *p) {
    tk *t = cur(p);
    if (t->type != TK_NAME) {
        unexpected(p, "a name");
        return NULL;
    }
    char buf[256];
    size_t bl = 0;
    for (;;) {
        t = cur(p);
        if (t->len + bl + 2 > sizeof buf) {
            perr(p, LM_ERR_LIMIT, t->line, t->col, "name too long");
            return NULL;
        }
        memcpy(buf + bl, t->s, t->len);
        bl += t->len;
        adv(p);
        if (is_op(cur(p), ".") && peek(p, 1)->type == TK_NAME) {
            buf[bl++] = '.';
            adv(p);
            continue;
        }
        break;
    }
    char *s = tmpl_strndup(&p->t->arena, buf, bl);
    if (!s) perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
    return s;
}

static tnode *parse_filter(parser *p, tnode *node, bool start_inline) {
    while (start_inline || is_op(cur(p), "|")) {
        if (!start_inline) adv(p);
        start_inline = false;
        tk *at = cur(p);
        tnode *f = mk(p, N_FILTER, at);
        if (!f) return NULL;
        f->name = parse_dotted_name(p);
        if (!f->name) return NULL;
        f->a = node;
        if (is_op(cur(p), "(") && parse_call_args(p, f)) return NULL;
        node = f;
    }
    return node;
}

static tnode *parse_test(parser *p, tnode *node) {
    tk *at = cur(p);
    adv(p); /* 'is' */
    bool neg = skip_name(p, "not");
    tnode *t = mk(p, N_TEST, at);
    if (!t) return NULL;
    t->name = parse_dotted_name(p);
    if (!t->name) return NULL;
    t->a = node;
    t->op = neg;
    tk *c = cur(p);
    if (is_op(c, "(")) {
        if (parse_call_args(p, t)) return NULL;
    } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            perr(p, LM_ERR_FORMAT, c->line, c->col, "you cannot chain multiple tests with 'is'");
            return NULL;
        }
        tnode *arg = parse_primary(p);
        if (!arg) return NULL;
        arg = parse_postfix(p, arg);
        if (!arg) return NULL;
        t->items = tmpl_alloc(&p->t->arena, sizeof *t->items);
        if (!t->items) {
            perr(p, LM_ERR_NO_MEMORY, c->line, c->col, "out of memory");
            return NULL;
        }
        t->items[0] = arg;
        t->nitems = 1;
    }
    return t;
}

static tnode *parse_subscribed(parser *p) {
    tk *at = cur(p);
    tnode *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), ":")) {
        adv(p);
    } else {
        tnode *e = parse_expression(p, true);
        if (!e) return NULL;
        if (!is_op(cur(p), ":")) return e;
        adv(p);
        args[0] = e;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) {
        args[1] = parse_expression(p, true);
        if (!args[1]) return NULL;
    }
    if (is_op(cur(p), ":")) {
        adv(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) {
            args[2] = parse_expression(p, true);
            if (!args[2]) return NULL;
        }
    }
    tnode *s = mk(p, N_SLICE, at);
    if (!s) return NULL;
    s->b = args[0];
    s->c = args[1];
    s->d = args[2];
    return s;
}

static tnode *parse_postfix(parser *p, tnode *node) {
    for (;;) {
        tk *at = cur(p);
        if (is_op(at, ".")) {
            adv(p);
            tk *nt = cur(p);
            if (nt->type == TK_NAME) {
                tnode *g = mk(p, N_GETATTR, at);
                if (!g) return NULL;
                g->a = node;
                g->name = tok_name(p, nt);
                if (!g->name) return NULL;
                adv(p);
                node = g;
            } else if (nt->type == TK_INT) {
                tnode *g = mk(p, N_GETITEM, at), *k = mk(p, N_CONST, nt);
                if (!g || !k) return NULL;
                k->k = tv_int(nt->ival);
                g->a = node;
                g->b = k;
                adv(p);
                node = g;
            } else {
                unexpected(p, "an attribute name");
                return NULL;
            }
        } else if (is_op(at, "[")) {
            adv(p);
            nvec args = {0};
            for (;;) {
                if (args.n) {
                    if (!skip_op(p, ",")) break;
                    if (is_op(cur(p), "]")) break;
                }
                tnode *s = parse_subscribed(p);
                if (!s || !nvec_push(&args, s)) {
                    nvec_free(&args);
                    if (p->st == LM_OK) perr(p, LM_ERR_NO_MEMORY, at->line, at->col, "out of memory");
                    return NULL;
                }
                if (!is_op(cur(p), ",")) break;
            }
            if (expect_op(p, "]") || args.n == 0) {
                nvec_free(&args);
                if (p->st == LM_OK) unexpected(p, "a subscript");
                return NULL;
            }
            tnode *g = mk(p, N_GETITEM, at);
            if (!g) {
                nvec_free(&args);
                return NULL;
            }
            g->a = node;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                tnode *tup = mk(p, N_TUPLE, at);
                if (!tup) {
                    nvec_free(&args);
                    return NULL;
                }
                tup->nitems = args.n;
                tup->items = nvec_done(p, &args);
                g->b = tup;
            }
            nvec_free(&args);
            node = g;
        } else if (is_op(at, "(")) {
            tnode *c = mk(p, N_CALL, at);
            if (!c) return NULL;
            c->a = node;
            if (parse_call_args(p, c)) return NULL;
            node = c;
        } else {
            return node;
        }
    }
}

static tnode *parse_filter_expr(parser *p, tnode *node) {
    for (;;) {
        tk *at = cur(p);
        if (is_op(at, "|")) {
            node = parse_filter(p, node, false);
        } else if (is_name(at, "is")) {
            node = parse_test(p, node);
        } else if (is_op(at, "(")) {
            tnode *c = mk(p, N_CALL, at);
            if (!c) return NULL;
            c->a = node;
            if (parse_call_args(p, c)) return NULL;
            node = c;
        } else {
            return node;
        }
        if (!node) return NULL;
    }
}

static tnode *parse_primary(parser *p) {
    tk *t = cur(p);
    tnode *n = NULL;
    if (!enter(p)) return NULL;
    if (t->type == TK_NAME) {
        static const struct { const char *s; int v; } consts[] = {
            {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", 2}, {"None", 2}};
        for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
            if (is_name(t, consts[k].s)) {
                n = mk(p, N_CONST, t);
                if (n) n->k = consts[k].v == 2 ? tv_none() : tv_bool(consts[k].v);
                adv(p);
                goto out;
            }
        }
        n = mk(p, N_NAME, t);
        if (n) n->name = tok_name(p, t);
        adv(p);
    } else if (t->type == TK_STRING) {
        /* adjacent literals concatenate */
        size_t total = 0, k = p->pos;
        while (p->toks[k].type == TK_STRING) total += p->toks[k++].len;
        char *s = tmpl_alloc(&p->t->arena, total + 1);
        n = mk(p, N_CONST, t);
        if (!s || !n) goto out;
        size_t o = 0;
        while (cur(p)->type == TK_STRING) {
            memcpy(s + o, cur(p)->s, cur(p)->len);
            o += cur(p)->len;
            adv(p);
        }
        n->k = tv_str(&p->t->arena, s, o);
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        n = mk(p, N_CONST, t);
        if (n) n->k = t->type == TK_INT ? tv_int(t->ival) : tv_float(t->fval);
        adv(p);
    } else if (is_op(t, "(")) {
        adv(p);
        n = parse_tuple(p, false, true, true, NULL);
        if (n && expect_op(p, ")")) n = NULL;
    } else if (is_op(t, "[")) {
        adv(p);
        nvec items = {0};
        while (!is_op(cur(p), "]")) {
            if (items.n && expect_op(p, ",")) break;
            if (is_op(cur(p), "]")) break;
            tnode *e = parse_expression(p, true);
            if (!e || !nvec_push(&items, e)) break;
        }
        if (p->st == LM_OK && expect_op(p, "]") == 0) {
            n = mk(p, N_LIST, t);
            if (n) {
                n->nitems = items.n;
                n->items = nvec_done(p, &items);
            }
        }
        nvec_free(&items);
    } else if (is_op(t, "{")) {
        adv(p);
        nvec keys = {0}, vals = {0};
        while (!is_op(cur(p), "}")) {
            if (keys.n && expect_op(p, ",")) break;
            if (is_op(cur(p), "}")) break;
            tnode *k = parse_expression(p, true);
            if (!k || expect_op(p, ":")) break;
            tnode *v = parse_expression(p, true);
            if (!v || !nvec_push(&keys, k) || !nvec_push(&vals, v)) break;
        }
        if (p->st == LM_OK && expect_op(p, "}") == 0) {
            n = mk(p, N_DICT, t);
            if (n) {
                n->nitems = keys.n;
                n->items = nvec_done(p, &keys);
                n->nitems2 = vals.n;
                n->items2 = nvec_done(p, &vals);
            }
        }
        nvec_free(&keys);
        nvec_free(&vals);
    } else {
        unexpected(p, "an expression");
    }
out:
    leave(p);
    if (p->st != LM_OK) return NULL;
    if (!n) perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
    return n;
}

static tnode *parse_unary(parser *p, bool with_filter) {
    tk *t = cur(p);
    tnode *node;
    if (!enter(p)) return NULL;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(p);
        tnode *inner = parse_unary(p, false);
        node = inner ? mk(p, is_op(t, "-") ? N_NEG : N_POS, t) : NULL;
        if (node) node->a = inner;
    } else {
        node = parse_primary(p);
    }
    if (node) node = parse_postfix(p, node);
    if (node && with_filter) node = parse_filter_expr(p, node);
    leave(p);
    return node;
}

static tnode *binop(parser *p, const tk *at, int op, tnode *a, tnode *b) {
    tnode *n = mk(p, N_BINOP, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static tnode *parse_pow(parser *p) {
    tnode *left = parse_unary(p, true);
    while (left && is_op(cur(p), "**")) {
        tk *at = cur(p);
        adv(p);
        tnode *right = parse_unary(p, true);
        left = right ? binop(p, at, OP_POW, left, right) : NULL;
    }
    return left;
}

static tnode *parse_math2(parser *p) {
    tnode *left = parse_pow(p);
    for (;;) {
        if (!left) return NULL;
        tk *at = cur(p);
        int op = is_op(at, "*") ? OP_MUL : is_op(at, "/") ? OP_DIV : is_op(at, "//") ? OP_FLOORDIV : is_op(at, "%") ? OP_MOD : 0;
        if (!op) return left;
        adv(p);
        tnode *right = parse_pow(p);
        left = right ? binop(p, at, op, left, right) : NULL;
    }
}

static tnode *parse_concat(parser *p) {
    tk *at = cur(p);
    tnode *first = parse_math2(p);
    if (!first || !is_op(cur(p), "~")) return first;
    nvec items = {0};
    if (!nvec_push(&items, first)) goto oom;
    while (skip_op(p, "~")) {
        tnode *e = parse_math2(p);
        if (!e) {
            nvec_free(&items);
            return NULL;
        }
        if (!nvec_push(&items, e)) goto oom;
    }
    tnode *n = mk(p, N_CONCAT, at);
    if (n) {
        n->nitems = items.n;
        n->items = nvec_done(p, &items);
    }
    nvec_free(&items);
    return p->st == LM_OK ? n : NULL;
oom:
    nvec_free(&items);
    perr(p, LM_ERR_NO_MEMORY, at->line, at->col, "out of memory");
    return NULL;
}

static tnode *parse_math1(parser *p) {
    tnode *left = parse_concat(p);
    for (;;) {
        if (!left) return NULL;
        tk *at = cur(p);
        int op = is_op(at, "+") ? OP_ADD : is_op(at, "-") ? OP_SUB : 0;
        if (!op) return left;
        adv(p);
        tnode *right = parse_concat(p);
        left = right ? binop(p, at, op, left, right) : NULL;
    }
}

static tnode *parse_compare(parser *p) {
    tk *at = cur(p);
    tnode *expr = parse_math1(p);
    if (!expr) return NULL;
    nvec ops = {0};
    for (;;) {
        tk *t = cur(p);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
               : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : 0;
        if (op) {
            adv(p);
        } else if (is_name(t, "in")) {
            adv(p);
            op = OP_IN;
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            adv(p);
            adv(p);
            op = OP_NOTIN;
        } else {
            break;
        }
        tnode *e = parse_math1(p);
        if (!e || !nvec_push(&ops, e)) {
            nvec_free(&ops);
            if (p->st == LM_OK) perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
            return NULL;
        }
        ops.ops[ops.n - 1] = (uint8_t)op;
    }
    if (!ops.n) {
        nvec_free(&ops);
        return expr;
    }
    tnode *n = mk(p, N_COMPARE, at);
    if (n) {
        n->a = expr;
        n->nitems = ops.n;
        n->items = nvec_done(p, &ops);
        n->ops = tmpl_alloc(&p->t->arena, (size_t)ops.n);
        if (n->ops) memcpy(n->ops, ops.ops, (size_t)ops.n);
        else perr(p, LM_ERR_NO_MEMORY, at->line, at->col, "out of memory");
    }
    nvec_free(&ops);
    return p->st == LM_OK ? n : NULL;
}

static tnode *parse_not(parser *p) {
    tk *t = cur(p);
    if (is_name(t, "not")) {
        adv(p);
        if (!enter(p)) return NULL;
        tnode *inner = parse_not(p);
        leave(p);
        tnode *n = inner ? mk(p, N_NOT, t) : NULL;
        if (n) n->a = inner;
        return n;
    }
    return parse_compare(p);
}

static tnode *parse_and(parser *p) {
    tnode *left = parse_not(p);
    while (left && is_name(cur(p), "and")) {
        tk *at = cur(p);
        adv(p);
        tnode *right = parse_not(p);
        tnode *n = right ? mk(p, N_AND, at) : NULL;
        if (n) n->a = left, n->b = right;
        left = n;
    }
    return left;
}

static tnode *parse_or(parser *p) {
    tnode *left = parse_and(p);
    while (left && is_name(cur(p), "or")) {
        tk *at = cur(p);
        adv(p);
        tnode *right = parse_and(p);
        tnode *n = right ? mk(p, N_OR, at) : NULL;
        if (n) n->a = left, n->b = right;
        left = n;
    }
    return left;
}

static tnode *parse_expression(parser *p, bool with_condexpr) {
    if (!enter(p)) return NULL;
    tnode *expr = parse_or(p);
    while (with_condexpr && expr && is_name(cur(p), "if")) {
        tk *at = cur(p);
        adv(p);
        tnode *cond = parse_or(p);
        tnode *other = NULL;
        if (cond && skip_name(p, "else")) {
            other = parse_expression(p, true);
            if (!other) {
                expr = NULL;
                break;
            }
        }
        tnode *n = cond ? mk(p, N_COND, at) : NULL;
        if (n) n->a = cond, n->b = expr, n->c = other;
        expr = n;
    }
    leave(p);
    return expr;
}

/* ------------------------------------------------------------------ statements */

static tnode *parse_body(parser *p, const char *const *end_names, const char **which);

static int expect_block_end(parser *p) {
    if (cur(p)->type == TK_BLOCK_END) {
        adv(p);
        return 0;
    }
    return unexpected(p, "end of statement '%}'");
}

/* Assignment target: a name, a tuple of names, or (with_ns) name.attr. */
static tnode *parse_assign_target(parser *p, bool with_ns, const char *extra_end) {
    tk *t = cur(p);
    if (with_ns && t->type == TK_NAME && is_op(peek(p, 1), ".") && peek(p, 2)->type == TK_NAME) {
        tnode *n = mk(p, N_GETATTR, t);
        if (!n) return NULL;
        n->a = mk(p, N_NAME, t);
        if (!n->a) return NULL;
        n->a->name = tok_name(p, t);
        adv(p);
        adv(p);
        n->name = tok_name(p, cur(p));
        adv(p);
        return p->st == LM_OK ? n : NULL;
    }
    tnode *n = parse_tuple(p, true, false, false, extra_end);
    if (!n) return NULL;
    if (n->kind == N_NAME) return n;
    if (n->kind == N_TUPLE && n->nitems > 0) {
        bool ok = true;
        for (int i = 0; i < n->nitems; i++) ok = ok && n->items[i]->kind == N_NAME;
        if (ok) return n;
    }
    perr(p, LM_ERR_FORMAT, t->line, t->col, "cannot assign to this expression");
    return NULL;
}

static tnode *parse_if(parser *p, tk *at) {
    tnode *n = mk(p, N_IF, at);
    if (!n) return NULL;
    n->a = parse_tuple(p, false, false, false, NULL);
    if (!n->a || expect_block_end(p)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which = NULL;
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    tk *t2 = cur(p);
    adv(p); /* the end name */
    if (strcmp(which, "elif") == 0) {
        if (!enter(p)) return NULL;
        n->c = parse_if(p, t2);
        leave(p);
        return n->c ? n : NULL;
    }
    if (strcmp(which, "else") == 0) {
        static const char *const ends2[] = {"endif", NULL};
        if (expect_block_end(p)) return NULL;
        n->c = parse_body(p, ends2, &which);
        if (!n->c) return NULL;
        adv(p);
    }
    return expect_block_end(p) ? NULL : n;
}

static tnode *parse_for(parser *p, tk *at) {
    tnode *n = mk(p, N_FOR, at);
    if (!n) return NULL;
    n->a = parse_assign_target(p, false, "in");
    if (!n->a) return NULL;
    if (!skip_name(p, "in")) {
        unexpected(p, "'in'");
        return NULL;
    }
    n->b = parse_tuple(p, false, false, false, "recursive");
    if (!n->b) return NULL;
    if (skip_name(p, "if")) {
        n->c = parse_expression(p, true);
        if (!n->c) return NULL;
    }
    if (is_name(cur(p), "recursive")) {
        perr(p, LM_ERR_UNSUPPORTED, cur(p)->line, cur(p)->col, "recursive for loops are not supported");
        return NULL;
    }
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *which = NULL;
    p->loop_depth++;
    n->d = parse_body(p, ends, &which);
    p->loop_depth--;
    if (!n->d) return NULL;
    adv(p);
    if (strcmp(which, "else") == 0) {
        static const char *const ends2[] = {"endfor", NULL};
        if (expect_block_end(p)) return NULL;
        tnode *els = parse_body(p, ends2, &which);
        if (!els) return NULL;
        n->items2 = tmpl_alloc(&p->t->arena, sizeof *n->items2);
        if (!n->items2) return NULL;
        n->items2[0] = els;
        n->nitems2 = 1;
        adv(p);
    }
    return expect_block_end(p) ? NULL : n;
}

static tnode *parse_set(parser *p, tk *at) {
    tnode *target = parse_assign_target(p, true, NULL);
    if (!target) return NULL;
    if (skip_op(p, "=")) {
        tnode *n = mk(p, N_SET, at);
        if (!n) return NULL;
        n->a = target;
        n->b = parse_tuple(p, false, true, false, NULL);
        if (!n->b || expect_block_end(p)) return NULL;
        return n;
    }
    tnode *n = mk(p, N_SETBLOCK, at);
    if (!n) return NULL;
    n->a = target;
    if (is_op(cur(p), "|")) {
        n->c = parse_filter(p, NULL, false);
        if (!n->c) return NULL;
    }
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *which;
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    adv(p);
    return expect_block_end(p) ? NULL : n;
}

/* (a, b=default, ...) for macros and call blocks: names in n->names, defaults in n->items2. */
static int parse_signature(parser *p, tnode *n) {
    nvec params = {0};
    if (expect_op(p, "(")) return -1;
    while (!is_op(cur(p), ")")) {
        if (params.n && expect_op(p, ",")) goto fail;
        if (is_op(cur(p), ")")) break;
        tk *t = cur(p);
        if (t->type != TK_NAME) {
            unexpected(p, "a parameter name");
            goto fail;
        }
        const char *nm = tok_name(p, t);
        adv(p);
        tnode *def = NULL;
        if (skip_op(p, "=")) {
            def = parse_expression(p, true);
            if (!def) goto fail;
        } else if (params.n && params.v[params.n - 1]) {
            perr(p, LM_ERR_FORMAT, t->line, t->col, "non-default argument follows default argument");
            goto fail;
        }
        if (!nm || !nvec_push(&params, def)) goto fail;
        params.names[params.n - 1] = nm;
    }
    adv(p);
    n->nnames = params.n;
    n->names = nvec_names(p, &params);
    n->nitems2 = params.n;
    n->items2 = nvec_done(p, &params);
    nvec_free(&params);
    return p->st == LM_OK ? 0 : -1;
fail:
    if (p->st == LM_OK) perr(p, LM_ERR_NO_MEMORY, cur(p)->line, cur(p)->col, "out of memory");
    nvec_free(&params);
    return -1;
}

static tnode *parse_macro(parser *p, tk *at) {
    tnode *n = mk(p, N_MACRO, at);
    if (!n) return NULL;
    if (cur(p)->type != TK_NAME) {
        unexpected(p, "a macro name");
        return NULL;
    }
    n->name = tok_name(p, cur(p));
    adv(p);
    if (parse_signature(p, n) || expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *which;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    n->b = parse_body(p, ends, &which);
    p->loop_depth = saved;
    if (!n->b) return NULL;
    adv(p);
    if (cur(p)->type == TK_NAME) adv(p); /* {% endmacro name %} */
    return expect_block_end(p) ? NULL : n;
}

static tnode *parse_call_block(parser *p, tk *at) {
    tnode *n = mk(p, N_CALLBLOCK, at);
    if (!n) return NULL;
    if (is_op(cur(p), "(") && parse_signature(p, n)) return NULL;
    n->a = parse_expression(p, true);
    if (!n->a) return NULL;
    if (n->a->kind != N_CALL) {
        perr(p, LM_ERR_FORMAT, at->line, at->col, "expected a call after 'call'");
        return NULL;
    }
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endcall", NULL};
    const char *which;
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    adv(p);
    return expect_block_end(p) ? NULL : n;
}

static tnode *parse_filter_block(parser *p, tk *at) {
    tnode *n = mk(p, N_FILTERBLOCK, at);
    if (!n) return NULL;
    n->a = parse_filter(p, NULL, true);
    if (!n->a || expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    const char *which;
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    adv(p);
    return expect_block_end(p) ? NULL : n;
}

static tnode *parse_statement(parser *p) {
    tk *at = cur(p); /* the '{%' */
    adv(p);
    tk *t = cur(p);
    if (t->type != TK_NAME) {
        unexpected(p, "a statement name");
        return NULL;
    }
    tnode *n = NULL;
    if (!enter(p)) return NULL;
    adv(p);
    if (is_name(t, "if")) n = parse_if(p, at);
    else if (is_name(t, "for")) n = parse_for(p, at);
    else if (is_name(t, "set")) n = parse_set(p, at);
    else if (is_name(t, "macro")) n = parse_macro(p, at);
    else if (is_name(t, "call")) n = parse_call_block(p, at);
    else if (is_name(t, "filter")) n = parse_filter_block(p, at);
    else if (is_name(t, "break") || is_name(t, "continue")) {
        if (p->loop_depth == 0) {
            perr(p, LM_ERR_FORMAT, t->line, t->col, "'%.*s' outside of a loop", (int)t->len, t->s);
        } else {
            n = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, at);
            if (n && expect_block_end(p)) n = NULL;
        }
    } else if (is_name(t, "generation")) {
        /* transformers' {% generation %}: marks assistant text for masks, renders its body as is */
        if (expect_block_end(p) == 0) {
            static const char *const ends[] = {"endgeneration", NULL};
            const char *which;
            n = parse_body(p, ends, &which);
            if (n) {
                adv(p);
                if (expect_block_end(p)) n = NULL;
            }
        }
    } else if (is_name(t, "include") || is_name(t, "import") || is_name(t, "from") || is_name(t, "extends") ||
               is_name(t, "block") || is_name(t, "with") || is_name(t, "autoescape")) {
        perr(p, LM_ERR_UNSUPPORTED, t->line, t->col, "the '%.*s' statement is not supported in chat templates",
             (int)t->len, t->s);
    } else {
        perr(p, LM_ERR_FORMAT, t->line, t->col, "unknown tag '%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s);
    }
    leave(p);
    return p->st == LM_OK ? n : NULL;
}

/* Statements until EOF (end_names NULL) or until '{% <one of end_names>' (left current at the name). */
static tnode *parse_body(parser *p, const char *const *end_names, const char **which) {
    tk *start = cur(p);
    nvec items = {0};
    tnode *body = NULL;
    if (!enter(p)) return NULL;
    for (;;) {
        tk *t = cur(p);
        if (t->type == TK_EOF) {
            if (end_names) {
                char want[160] = "";
                for (int k = 0; end_names[k]; k++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'{%% %s %%}'",
                             k == 0 ? "" : end_names[k + 1] ? ", " : " or ", end_names[k]);
                perr(p, LM_ERR_FORMAT, t->line, t->col, "unexpected end of template, expected %s", want);
                goto done;
            }
            break;
        }
        tnode *n = NULL;
        if (t->type == TK_TEXT) {
            n = mk(p, N_TEXT, t);
            if (n) n->k = tv_str(&p->t->arena, t->s, t->len);
            adv(p);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(p);
            n = mk(p, N_OUTPUT, t);
            if (n) {
                n->a = parse_tuple(p, false, true, false, NULL);
                if (!n->a) goto done;
                if (cur(p)->type != TK_VAR_END) {
                    unexpected(p, "end of print statement '}}'");
                    goto done;
                }
                adv(p);
            }
        } else if (t->type == TK_BLOCK_BEGIN) {
            tk *nt = peek(p, 1);
            if (end_names && nt->type == TK_NAME) {
                for (int k = 0; end_names[k]; k++) {
                    if (is_name(nt, end_names[k])) {
                        adv(p);
                        *which = end_names[k];
                        goto finish;
                    }
                }
            }
            if (nt->type == TK_NAME && (is_name(nt, "endif") || is_name(nt, "endfor") || is_name(nt, "endmacro") ||
                                        is_name(nt, "endset") || is_name(nt, "elif") || is_name(nt, "else") ||
                                        is_name(nt, "endcall") || is_name(nt, "endfilter") ||
                                        is_name(nt, "endgeneration"))) {
                perr(p, LM_ERR_FORMAT, nt->line, nt->col, "unexpected '%.*s'", (int)nt->len, nt->s);
                goto done;
            }
            n = parse_statement(p);
            if (!n) goto done;
        } else {
            unexpected(p, NULL);
            goto done;
        }
        if (!n || !nvec_push(&items, n)) {
            if (p->st == LM_OK) perr(p, LM_ERR_NO_MEMORY, t->line, t->col, "out of memory");
            goto done;
        }
    }
finish:
    body = mk(p, N_BODY, start);
    if (body) {
        body->nitems = items.n;
        body->items = nvec_done(p, &items);
    }
done:
    nvec_free(&items);
    leave(p);
    return p->st == LM_OK ? body : NULL;
}

lm_status tmpl_parse(lm_template *t, const char *src, size_t len) {
    parser p = {.t = t};
    p.src = normalize_source(&t->arena, src, len, &p.n);
    if (!p.src) return lm_error(LM_ERR_NO_MEMORY, "template: out of memory");
    int rc = lex(&p);
    if (rc == 0) {
        tk eof = {.type = TK_EOF};
        pos_to_linecol(&p, p.n, &eof.line, &eof.col);
        if (!push_tok(&p, eof)) perr(&p, LM_ERR_NO_MEMORY, eof.line, eof.col, "out of memory");
    }
    if (p.st == LM_OK) t->root = parse_body(&p, NULL, NULL);
    free(p.toks);
    if (p.st != LM_OK) return lm_error(p.st, "%s", p.err);
    if (!t->root) return lm_error(LM_ERR_INTERNAL, "template: parser returned no tree");
    return LM_OK;
}
