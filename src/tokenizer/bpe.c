/* Byte-level BPE: pre-tokenize into words, map every byte of a word to its GPT-2
 * "printable" code point, then merge adjacent symbols by lowest merge rank (ties: the
 * leftmost pair) with a binary heap and lazy invalidation — O(n log n) per word. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68
 * bytes to 256, 257, ... in byte order. */
static uint32_t byte_cpt(uint8_t b) {
    if (b <= 32) return 256u + b;               /* 0..32    -> 256..288 */
    if (b >= 127 && b <= 160) return 289u + (b - 127u); /* 127..160 -> 289..322 */
    if (b == 173) return 323;
    return b;
}

size_t lm_byte_to_utf8(uint8_t b, char out[2]) {
    uint32_t c = byte_cpt(b);
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

int lm_cpt_to_byte(uint32_t cpt) {
    if (cpt < 256) return (cpt <= 32 || (cpt >= 127 && cpt <= 160) || cpt == 173) ? -1 : (int)cpt;
    if (cpt <= 288) return (int)(cpt - 256);
    if (cpt <= 322) return (int)(cpt - 289 + 127);
    if (cpt == 323) return 173;
    return -1;
}

typedef struct sym {
    uint32_t off, n; /* into the encoded word */
    int32_t prev, next;
} sym;

typedef struct bigram {
    int32_t rank;
    int32_t left, right;
    uint32_t lsize, rsize; /* sizes when queued: a changed size means the pair is stale */
} bigram;

/* min-heap: lower rank first, then leftmost */
static bool before(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

#define T bigram
#define BEFORE before
#include "tokenizer/merge_heap.h"
#undef T
#undef BEFORE

typedef struct bpe_ctx {
    const lm_vocab *v;
    lm_bytes word; /* the byte-encoded word */
    sym *syms;
    size_t nsyms, capsyms;
    heap q;
} bpe_ctx;

static bool add_bigram(bpe_ctx *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &c->syms[l], *b = &c->syms[r];
    int32_t rank = lm_vocab_merge_rank(c->v, c->word.p + a->off, a->n, c->word.p + b->off, b->n);
    if (rank < 0) return true;
    bigram g = {rank, l, r, a->n, b->n};
    return heap_push(&c->q, g);
}

static lm_status emit(bpe_ctx *c, const char *s, size_t n, lm_ivec *out) {
    int32_t id = lm_vocab_find(c->v, s, n);
    if (id != LM_TOKEN_NULL) return lm_ivec_push(out, id) ? LM_OK : LM_ERR_NO_MEMORY;
    /* not a token: fall back to single bytes of the encoded text that are tokens
     * (llama.cpp's behaviour; with a complete byte alphabet this never happens) */
    for (size_t i = 0; i < n; i++) {
        id = lm_vocab_find(c->v, s + i, 1);
        if (id != LM_TOKEN_NULL && !lm_ivec_push(out, id)) return LM_ERR_NO_MEMORY;
    }
    return LM_OK;
}

static lm_status encode_word(bpe_ctx *c, const char *raw, size_t len, lm_ivec *out) {
    c->word.n = 0;
    for (size_t i = 0; i < len; i++) {
        char u[2];
        size_t k = lm_byte_to_utf8((uint8_t)raw[i], u);
        if (!lm_bytes_append(&c->word, u, k)) return LM_ERR_NO_MEMORY;
    }
    const char *w = c->word.p;
    size_t wn = c->word.n;
    if (c->v->ignore_merges) {
        int32_t id = lm_vocab_find(c->v, w, wn);
        if (id != LM_TOKEN_NULL) return lm_ivec_push(out, id) ? LM_OK : LM_ERR_NO_MEMORY;
    }
    /* one symbol per code point of the encoded word */
    c->nsyms = 0;
    if (wn > c->capsyms) {
        sym *s = realloc(c->syms, wn * sizeof *s);
        if (!s) return LM_ERR_NO_MEMORY;
        c->syms = s;
        c->capsyms = wn;
    }
    for (size_t off = 0; off < wn;) {
        size_t n = lm_utf8_len((uint8_t)w[off]);
        if (n > wn - off) n = wn - off;
        sym *s = &c->syms[c->nsyms];
        s->off = (uint32_t)off;
        s->n = (uint32_t)n;
        s->prev = (int32_t)c->nsyms - 1;
        off += n;
        s->next = off == wn ? -1 : (int32_t)c->nsyms + 1;
        c->nsyms++;
    }
    c->q.n = 0;
    for (size_t i = 1; i < c->nsyms; i++)
        if (!add_bigram(c, (int32_t)i - 1, (int32_t)i)) return LM_ERR_NO_MEMORY;
    while (c->q.n) {
        bigram g = heap_pop(&c->q);
        sym *l = &c->syms[g.left], *r = &c->syms[g.right];
        if (l->n == 0 || r->n == 0 || l->n != g.lsize || r->n != g.rsize || l->next != g.right)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->syms[r->next].prev = g.left;
        if (!add_bigram(c, l->prev, g.left) || !add_bigram(c, g.left, l->next))
            return LM_ERR_NO_MEMORY;
    }
    for (int32_t i = 0; i >= 0 && (size_t)i < c->nsyms; i = c->syms[i].next) {
        const sym *s = &c->syms[i];
        if (s->n == 0) continue;
        lm_status st = emit(c, w + s->off, s->n, out);
        if (st) return st;
    }
    return LM_OK;
}

/* ---- the per-call word cache ----
 * Open addressing over (hash, word) -> the word's ids, both kept in arenas. Words longer
 * than CACHE_MAX_WORD are not cached (rare, and they would crowd the arenas); the table
 * stops growing at CACHE_MAX_ENTRIES so a text of all-distinct words costs only the
 * probes. */
#define CACHE_MAX_WORD 64
#define CACHE_MAX_ENTRIES (1u << 18)

typedef struct cache_ent {
    uint64_t h;        /* 0: empty */
    uint32_t woff, wlen;
    uint32_t ioff, nids;
} cache_ent;

struct lm_bpe_cache {
    cache_ent *tab;
    size_t mask, count;
    lm_bytes words;
    lm_ivec ids;
};

void lm_bpe_cache_free(lm_bpe_cache *c) {
    if (!c) return;
    free(c->tab);
    free(c->words.p);
    free(c->ids.v);
    free(c);
}

static uint64_t word_hash(const char *s, size_t n) {
    uint64_t h = lm_tok_hash(s, n);
    return h ? h : 1;
}

static cache_ent *cache_slot(lm_bpe_cache *c, uint64_t h, const char *w, size_t n) {
    size_t i = (size_t)h & c->mask;
    for (;;) {
        cache_ent *e = &c->tab[i];
        if (e->h == 0) return e;
        if (e->h == h && e->wlen == n && memcmp(c->words.p + e->woff, w, n) == 0) return e;
        i = (i + 1) & c->mask;
    }
}

static bool cache_grow(lm_bpe_cache *c) {
    size_t cap = c->tab ? (c->mask + 1) * 2 : 1024;
    cache_ent *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (size_t i = 0; c->tab && i <= c->mask; i++) {
        cache_ent *e = &c->tab[i];
        if (!e->h) continue;
        size_t j = (size_t)e->h & (cap - 1);
        while (t[j].h) j = (j + 1) & (cap - 1);
        t[j] = *e;
    }
    free(c->tab);
    c->tab = t;
    c->mask = cap - 1;
    return true;
}

lm_status lm_bpe_encode(const lm_vocab *v, const char *text, size_t len, lm_bpe_cache **cachep,
                        lm_ivec *out) {
    lm_spanvec words = {0};
    lm_status st = lm_pretok_split(v->pretok, text, len, &words);
    if (st) {
        free(words.v);
        return st;
    }
    lm_bpe_cache *cache = *cachep;
    if (!cache) {
        cache = calloc(1, sizeof *cache);
        if (!cache || !cache_grow(cache)) {
            lm_bpe_cache_free(cache);
            free(words.v);
            return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
        }
        *cachep = cache;
    }
    bpe_ctx c = {.v = v};
    for (size_t i = 0; i < words.n && !st; i++) {
        const char *w = text + words.v[i].off;
        size_t wn = words.v[i].len;
        if (wn > CACHE_MAX_WORD) {
            st = encode_word(&c, w, wn, out);
            continue;
        }
        uint64_t h = word_hash(w, wn);
        cache_ent *e = cache_slot(cache, h, w, wn);
        if (e->h) {
            for (uint32_t k = 0; k < e->nids; k++)
                if (!lm_ivec_push(out, cache->ids.v[e->ioff + k])) st = LM_ERR_NO_MEMORY;
            continue;
        }
        size_t start = out->n;
        st = encode_word(&c, w, wn, out);
        if (st || cache->count >= CACHE_MAX_ENTRIES || cache->ids.n > UINT32_MAX / 2 ||
            cache->words.n > UINT32_MAX / 2)
            continue;
        uint32_t woff = (uint32_t)cache->words.n, ioff = (uint32_t)cache->ids.n;
        bool ok = lm_bytes_append(&cache->words, w, wn);
        for (size_t k = start; ok && k < out->n; k++) ok = lm_ivec_push(&cache->ids, out->v[k]);
        if (!ok) {
            st = LM_ERR_NO_MEMORY;
            continue;
        }
        *e = (cache_ent){h, woff, (uint32_t)wn, ioff, (uint32_t)(out->n - start)};
        /* keep the load under 1/2 */
        if (++cache->count * 2 > cache->mask + 1 && !cache_grow(cache)) st = LM_ERR_NO_MEMORY;
    }
    free(words.v);
    free(c.word.p);
    free(c.syms);
    free(c.q.v);
    if (st == LM_ERR_NO_MEMORY) return lm_error(st, "tokenizer: out of memory");
    return st;
}
