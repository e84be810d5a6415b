/* Special and user-defined tokens in raw text. llama.cpp's rule: take the special
 * tokens longest text first; for each, split every remaining raw-text fragment at all
 * of its (non-overlapping, leftmost) occurrences. Control and unknown tokens take part
 * only when parse_special is set; user-defined tokens always do. LSTRIP/RSTRIP tokens
 * eat the ASCII whitespace beside them.
 *
 * Doing that naively costs (number of special tokens) x (text length) — tens of
 * thousands of tokens in some vocabularies. A byte trie over the special texts finds,
 * in one pass, which of them occur at all; only those run the splitting loop. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct tnode {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t token;   /* token ending here, -1 if none */
    uint8_t byte;
} tnode;

struct lm_special_trie {
    tnode *n;
    size_t len, cap;
    int32_t root_child[256]; /* direct table for the root's children */
    int32_t *rank;           /* [n_tokens] position in v->special, -1 if not special */
};

void lm_special_trie_free(lm_special_trie *t) {
    if (!t) return;
    free(t->n);
    free(t->rank);
    free(t);
}

static int32_t new_node(lm_special_trie *t, uint8_t b) {
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        tnode *n = realloc(t->n, cap * sizeof *n);
        if (!n) return -1;
        t->n = n;
        t->cap = cap;
    }
    tnode *x = &t->n[t->len];
    x->child = x->sibling = x->token = -1;
    x->byte = b;
    return (int32_t)t->len++;
}

lm_status lm_special_trie_build(lm_vocab *v) {
    lm_special_trie *t = calloc(1, sizeof *t);
    if (!t) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    v->trie = t;
    for (int i = 0; i < 256; i++) t->root_child[i] = -1;
    t->rank = malloc(v->n_tokens * sizeof *t->rank);
    if (!t->rank) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    for (uint32_t i = 0; i < v->n_tokens; i++) t->rank[i] = -1;
    for (size_t k = 0; k < v->n_special; k++) {
        int32_t id = v->special[k];
        t->rank[id] = (int32_t)k;
        const uint8_t *s = (const uint8_t *)lm_vocab_tok_text(v, id);
        uint32_t len = v->tok[id].len;
        if (len == 0) continue;
        int32_t cur = t->root_child[s[0]];
        if (cur < 0) {
            cur = new_node(t, s[0]);
            if (cur < 0) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
            t->root_child[s[0]] = cur;
        }
        for (uint32_t i = 1; i < len; i++) {
            int32_t c = t->n[cur].child;
            while (c >= 0 && t->n[c].byte != s[i]) c = t->n[c].sibling;
            if (c < 0) {
                c = new_node(t, s[i]);
                if (c < 0) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
                t->n[c].sibling = t->n[cur].child;
                t->n[cur].child = c;
            }
            cur = c;
        }
        if (t->n[cur].token < 0) t->n[cur].token = id;
    }
    return LM_OK;
}

static bool frag_push(lm_fragvec *f, int32_t token, size_t off, size_t len) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        lm_fragment *v = realloc(f->v, cap * sizeof *v);
        if (!v) return false;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n].token = token;
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->n++;
    return true;
}

static bool eligible(const lm_vocab *v, int32_t id, bool parse_special) {
    uint32_t a = v->tok[id].attr;
    if (!parse_special && (a & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_UNKNOWN))) return false;
    return v->tok[id].len > 0;
}

lm_status lm_special_partition(const lm_vocab *v, const char *text, size_t len,
                               bool parse_special, lm_fragvec *out) {
    out->n = 0;
    if (len == 0) return LM_OK;
    if (!frag_push(out, LM_TOKEN_NULL, 0, len)) goto oom;
    const lm_special_trie *t = v->trie;
    if (!t || v->n_special == 0) return LM_OK;

    /* which special tokens occur (by their rank in v->special) */
    uint8_t *seen = calloc(v->n_special, 1);
    if (!seen) goto oom;
    size_t n_seen = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t p = 0; p < len; p++) {
        int32_t cur = t->root_child[s[p]];
        size_t q = p + 1;
        while (cur >= 0) {
            int32_t id = t->n[cur].token;
            if (id >= 0 && !seen[t->rank[id]] && eligible(v, id, parse_special)) {
                seen[t->rank[id]] = 1;
                n_seen++;
            }
            if (q >= len) break;
            int32_t c = t->n[cur].child;
            while (c >= 0 && t->n[c].byte != s[q]) c = t->n[c].sibling;
            cur = c;
            q++;
        }
    }
    if (n_seen == 0) {
        free(seen);
        return LM_OK;
    }

    lm_fragvec next = {0};
    for (size_t k = 0; k < v->n_special; k++) {
        if (!seen[k]) continue;
        int32_t id = v->special[k];
        const char *tt = lm_vocab_tok_text(v, id);
        size_t tl = v->tok[id].len;
        uint32_t attr = v->tok[id].attr;
        next.n = 0;
        for (size_t f = 0; f < out->n; f++) {
            lm_fragment fr = out->v[f];
            if (fr.token != LM_TOKEN_NULL) {
                if (!frag_push(&next, fr.token, 0, 0)) goto oom_all;
                continue;
            }
            size_t off = fr.off, rem = fr.len;
            for (;;) {
                const char *m = rem >= tl ? memmem(text + off, rem, tt, tl) : NULL;
                if (!m) {
                    if (rem && !frag_push(&next, LM_TOKEN_NULL, off, rem)) goto oom_all;
                    break;
                }
                size_t mo = (size_t)(m - text);
                size_t left = mo - off;
                if (attr & LM_TOKEN_ATTR_LSTRIP)
                    while (left > 0 && isspace((unsigned char)text[off + left - 1])) left--;
                if (left && !frag_push(&next, LM_TOKEN_NULL, off, left)) goto oom_all;
                if (!frag_push(&next, id, 0, 0)) goto oom_all;
                size_t roff = mo + tl, rlen = off + rem - roff;
                if (attr & LM_TOKEN_ATTR_RSTRIP)
                    while (rlen > 0 && isspace((unsigned char)text[roff])) roff++, rlen--;
                off = roff;
                rem = rlen;
                if (rem == 0) break;
            }
        }
        lm_fragvec tmp = *out;
        *out = next;
        next = tmp;
    }
    free(next.v);
    free(seen);
    return LM_OK;
oom_all:
    free(next.v);
    free(seen);
oom:
    return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
}
