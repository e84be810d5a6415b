/* SentencePiece-style tokenization as llama.cpp does it for "llama" vocabularies:
 * spaces become U+2581, the text splits into UTF-8 characters, and adjacent symbols
 * whose concatenation is a token merge greedily by highest token score (ties: the
 * leftmost pair). Symbols that are not tokens fall back to <0xNN> byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct sym {
    uint32_t off, n;
    int32_t prev, next;
} sym;

typedef struct bigram {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of the merged text when queued */
} bigram;

/* max-heap on score, ties: leftmost first */
static bool before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

#define T bigram
#define BEFORE before
#include "tokenizer/merge_heap.h"
#undef T
#undef BEFORE

typedef struct spm_ctx {
    const lm_vocab *v;
    const char *text;
    sym *syms;
    heap q;
} spm_ctx;

static bool try_bigram(spm_ctx *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &c->syms[l], *b = &c->syms[r];
    if (c->v->spm_merges) {
        /* tokenizer.json BPE: only listed pairs merge, lowest rank first (exact as a
         * float: ranks are below 2^24) */
        int32_t rank = lm_vocab_merge_rank(c->v, c->text + a->off, a->n, c->text + b->off, b->n);
        if (rank < 0) return true;
        bigram g = {-(float)rank, l, r, a->n + b->n};
        return heap_push(&c->q, g);
    }
    /* symbols are contiguous in the text, so the pair is one substring */
    int32_t id = lm_vocab_find(c->v, c->text + a->off, a->n + b->n);
    if (id == LM_TOKEN_NULL) return true;
    bigram g = {c->v->tok[id].score, l, r, a->n + b->n};
    return heap_push(&c->q, g);
}

lm_status lm_spm_encode(const lm_vocab *v, const char *text, size_t len, lm_ivec *out) {
    /* escape spaces: ' ' -> U+2581 */
    lm_bytes esc = {0};
    for (size_t i = 0; i < len; i++) {
        bool ok = text[i] == ' ' ? lm_bytes_append(&esc, "\xe2\x96\x81", 3)
                                 : lm_bytes_append(&esc, text + i, 1);
        if (!ok) {
            free(esc.p);
            return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
        }
    }
    if (esc.n == 0) return LM_OK;
    if (esc.n > INT32_MAX) {
        free(esc.p);
        return lm_error(LM_ERR_LIMIT, "tokenizer: text fragment of %zu bytes is too long", len);
    }
    spm_ctx c = {.v = v, .text = esc.p};
    c.syms = malloc(esc.n * sizeof *c.syms);
    if (!c.syms) {
        free(esc.p);
        return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    size_t ns = 0;
    for (size_t off = 0; off < esc.n;) {
        size_t n = lm_utf8_char_len(esc.p + off, esc.n - off);
        sym *s = &c.syms[ns];
        s->off = (uint32_t)off;
        s->n = (uint32_t)n;
        s->prev = (int32_t)ns - 1;
        off += n;
        s->next = off == esc.n ? -1 : (int32_t)ns + 1;
        ns++;
    }
    lm_status st = LM_OK;
    for (size_t i = 1; i < ns; i++)
        if (!try_bigram(&c, (int32_t)i - 1, (int32_t)i)) goto oom;
    while (c.q.n) {
        bigram g = heap_pop(&c.q);
        sym *l = &c.syms[g.left], *r = &c.syms[g.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c.syms[r->next].prev = g.left;
        if (!try_bigram(&c, l->prev, g.left) || !try_bigram(&c, g.left, l->next)) goto oom;
    }
    for (int32_t i = 0; i >= 0; i = c.syms[i].next) {
        const sym *s = &c.syms[i];
        int32_t id = lm_vocab_find(v, esc.p + s->off, s->n);
        if (id != LM_TOKEN_NULL) {
            if (!lm_ivec_push(out, id)) goto oom;
            continue;
        }
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t b = v->byte_token[(uint8_t)esc.p[s->off + k]];
            if (b == LM_TOKEN_NULL) b = v->unk;
            if (b != LM_TOKEN_NULL && !lm_ivec_push(out, b)) goto oom;
        }
    }
    goto done;
oom:
    st = lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
done:
    free(c.syms);
    free(c.q.v);
    free(esc.p);
    return st;
}
