#include "formats/name_index.h"

#include <stdlib.h>
#include <string.h>

struct lm_name_slot {
    const char *name; /* NULL: empty slot */
    size_t len;
    uint64_t hash;
    int64_t value;
};

struct lm_name_chunk {
    lm_name_chunk *next;
    size_t used, cap;
    char bytes[];
};

enum { CHUNK_BYTES = 64 * 1024 };

static uint64_t hash_name(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

void lm_name_index_free(lm_name_index *ix) {
    if (!ix) return;
    free(ix->slots);
    for (lm_name_chunk *c = ix->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    memset(ix, 0, sizeof *ix);
}

static char *intern(lm_name_index *ix, const char *s, size_t len) {
    lm_name_chunk *c = ix->chunks;
    if (!c || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > CHUNK_BYTES ? len + 1 : CHUNK_BYTES;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        /* A big one-off name gets its own chunk behind the current one so that the
         * current chunk's free space is not abandoned. */
        if (ix->chunks && cap > CHUNK_BYTES) {
            c->next = ix->chunks->next;
            ix->chunks->next = c;
        } else {
            c->next = ix->chunks;
            ix->chunks = c;
        }
    }
    char *p = c->bytes + c->used;
    memcpy(p, s, len);
    p[len] = '\0';
    c->used += len + 1;
    return p;
}

static struct lm_name_slot *probe(struct lm_name_slot *slots, size_t cap, const char *s,
                                  size_t len, uint64_t h) {
    size_t i = (size_t)h & (cap - 1);
    for (;;) {
        struct lm_name_slot *sl = &slots[i];
        if (!sl->name) return sl;
        if (sl->hash == h && sl->len == len && memcmp(sl->name, s, len) == 0) return sl;
        i = (i + 1) & (cap - 1);
    }
}

static int grow(lm_name_index *ix) {
    size_t cap = ix->cap ? ix->cap * 2 : 64;
    struct lm_name_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < ix->cap; i++) {
        struct lm_name_slot *old = &ix->slots[i];
        if (old->name) *probe(slots, cap, old->name, old->len, old->hash) = *old;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    return 0;
}

int lm_name_index_add(lm_name_index *ix, const char *name, size_t len, int64_t value,
                      const char **interned) {
    if ((ix->count + 1) * 2 > ix->cap && grow(ix) != 0) return LM_NAME_NO_MEMORY;
    uint64_t h = hash_name(name, len);
    struct lm_name_slot *sl = probe(ix->slots, ix->cap, name, len, h);
    if (sl->name) {
        if (interned) *interned = sl->name;
        return LM_NAME_DUPLICATE;
    }
    char *copy = intern(ix, name, len);
    if (!copy) return LM_NAME_NO_MEMORY;
    sl->name = copy;
    sl->len = len;
    sl->hash = h;
    sl->value = value;
    ix->count++;
    if (interned) *interned = copy;
    return LM_NAME_ADDED;
}

int64_t lm_name_index_find(const lm_name_index *ix, const char *name, size_t len) {
    if (!ix->cap) return -1;
    const struct lm_name_slot *sl =
        probe(ix->slots, ix->cap, name, len, hash_name(name, len));
    return sl->name ? sl->value : -1;
}
