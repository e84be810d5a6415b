/* The priority queue of candidate merges, shared by the BPE and SentencePiece
 * tokenizers: a binary heap over an element type T ordered by BEFORE(a, b) (true when
 * a must come out first). Including this file with T and BEFORE defined gives
 *   typedef struct heap { T *v; size_t n, cap; } heap;
 *   static bool heap_push(heap *h, T x);   false when out of memory
 *   static T heap_pop(heap *h);            h->n must be > 0
 * (one instantiation per translation unit). */
#include <stdbool.h>
#include <stdlib.h>

typedef struct heap {
    T *v;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, T x) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        T *v = realloc(h->v, cap * sizeof *v);
        if (!v) return false;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!BEFORE(&x, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = x;
    return true;
}

static T heap_pop(heap *h) {
    T top = h->v[0];
    T x = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const T *best = &x;
        if (l < h->n && BEFORE(&h->v[l], best)) m = l, best = &h->v[l];
        if (r < h->n && BEFORE(&h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = x;
    return top;
}
