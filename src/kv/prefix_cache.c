#include "kv/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct node {
    struct node *parent;
    struct node **child;
    int32_t n_child, cap_child;
    int32_t block;     /* -1 for the root                       */
    int32_t n_tokens;  /* block_size, or fewer for a partial leaf */
    int64_t index;     /* position in pc->all                    */
    uint64_t last_use;
    int32_t tokens[];  /* [block_size]                           */
} node;

struct lm_prefix_cache {
    lm_kv_cache *kv;
    node *root;
    node **all; /* every node but the root, for LRU scans */
    int64_t n_all, cap_all;
    uint64_t tick;
    uint64_t max_bytes;
    lm_prefix_cache_stats st;
};

static node *node_new(lm_prefix_cache *pc) {
    node *n = calloc(1, sizeof *n + sizeof(int32_t) * (size_t)pc->kv->block_size);
    if (n) n->block = -1;
    return n;
}

lm_status lm_prefix_cache_create(lm_kv_cache *kv, uint64_t max_bytes, lm_prefix_cache **out) {
    *out = NULL;
    lm_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return lm_error(LM_ERR_NO_MEMORY, "out of memory for the prefix cache");
    pc->kv = kv;
    uint64_t pool = (uint64_t)lm_kv_cache_block_bytes(kv) * (uint64_t)kv->n_blocks;
    pc->max_bytes = max_bytes && max_bytes < pool ? max_bytes : pool;
    pc->root = node_new(pc);
    if (!pc->root) {
        free(pc);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for the prefix cache");
    }
    *out = pc;
    return LM_OK;
}

static void node_free_rec(lm_prefix_cache *pc, node *n) {
    for (int32_t i = 0; i < n->n_child; i++) node_free_rec(pc, n->child[i]);
    if (n->block >= 0) lm_kv_cache_block_unref(pc->kv, n->block);
    free(n->child);
    free(n);
}

void lm_prefix_cache_free(lm_prefix_cache *pc) {
    if (!pc) return;
    node_free_rec(pc, pc->root);
    free(pc->all);
    free(pc);
}

static int32_t common_len(const int32_t *a, const int32_t *b, int64_t n) {
    int32_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int64_t lm_prefix_cache_match(lm_prefix_cache *pc, const int32_t *tokens, int64_t n, int64_t max_match,
                              int32_t *blocks, int64_t *n_blocks) {
    int64_t bs = pc->kv->block_size, matched = 0, nb = 0;
    if (max_match > n) max_match = n;
    uint64_t now = ++pc->tick;
    node *cur = pc->root;
    while (matched < max_match) {
        int64_t room = max_match - matched;
        node *best = NULL;
        int32_t best_len = 0;
        for (int32_t i = 0; i < cur->n_child; i++) {
            node *c = cur->child[i];
            int64_t lim = c->n_tokens < room ? c->n_tokens : room;
            int32_t l = common_len(c->tokens, tokens + matched, lim);
            if (l > best_len || (l == best_len && best && l > 0 && c->n_tokens > best->n_tokens)) {
                best = c;
                best_len = l;
            }
        }
        if (!best) break;
        best->last_use = now;
        blocks[nb++] = best->block;
        matched += best_len;
        if (best_len < bs) break; /* a partial use: the caller copies this block on write */
        cur = best;
    }
    *n_blocks = nb;
    return matched;
}

void lm_prefix_cache_record(lm_prefix_cache *pc, int64_t n, int64_t matched) {
    pc->st.lookups++;
    pc->st.lookup_tokens += n;
    pc->st.hit_tokens += matched;
    if (matched > 0)
        pc->st.hits++;
    else
        pc->st.misses++;
}

static lm_status add_child(lm_prefix_cache *pc, node *parent, const int32_t *tokens, int32_t n_tokens, int32_t block,
                           node **out) {
    node *c = node_new(pc);
    if (!c) return lm_error(LM_ERR_NO_MEMORY, "out of memory for the prefix cache");
    if (parent->n_child == parent->cap_child) {
        int32_t cap = parent->cap_child ? parent->cap_child * 2 : 4;
        node **nc = realloc(parent->child, sizeof *nc * (size_t)cap);
        if (!nc) {
            free(c);
            return lm_error(LM_ERR_NO_MEMORY, "out of memory for the prefix cache");
        }
        parent->child = nc;
        parent->cap_child = cap;
    }
    if (pc->n_all == pc->cap_all) {
        int64_t cap = pc->cap_all ? pc->cap_all * 2 : 64;
        node **na = realloc(pc->all, sizeof *na * (size_t)cap);
        if (!na) {
            free(c);
            return lm_error(LM_ERR_NO_MEMORY, "out of memory for the prefix cache");
        }
        pc->all = na;
        pc->cap_all = cap;
    }
    memcpy(c->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
    c->n_tokens = n_tokens;
    c->block = block;
    c->parent = parent;
    c->last_use = pc->tick;
    c->index = pc->n_all;
    pc->all[pc->n_all++] = c;
    parent->child[parent->n_child++] = c;
    lm_kv_cache_block_ref(pc->kv, block);
    pc->st.n_nodes++;
    pc->st.bytes += lm_kv_cache_block_bytes(pc->kv);
    *out = c;
    return LM_OK;
}

/* Removes a leaf and drops its block reference. */
static void remove_leaf(lm_prefix_cache *pc, node *n) {
    node *p = n->parent;
    for (int32_t i = 0; i < p->n_child; i++)
        if (p->child[i] == n) {
            p->child[i] = p->child[--p->n_child];
            break;
        }
    node *last = pc->all[--pc->n_all];
    pc->all[n->index] = last;
    last->index = n->index;
    lm_kv_cache_block_unref(pc->kv, n->block);
    pc->st.n_nodes--;
    pc->st.bytes -= lm_kv_cache_block_bytes(pc->kv);
    pc->st.evictions++;
    free(n->child);
    free(n);
}

static bool evictable_leaf(const lm_prefix_cache *pc, const node *n) {
    return n->n_child == 0 && pc->kv->refcount[n->block] == 1;
}

/* Evicts the least recently used evictable leaf; false if there is none. */
static bool evict_one(lm_prefix_cache *pc) {
    node *victim = NULL;
    for (int64_t i = 0; i < pc->n_all; i++) {
        node *n = pc->all[i];
        if (evictable_leaf(pc, n) && (!victim || n->last_use < victim->last_use)) victim = n;
    }
    if (!victim) return false;
    remove_leaf(pc, victim);
    return true;
}

lm_status lm_prefix_cache_insert(lm_prefix_cache *pc, const int32_t *tokens, int64_t n, const int32_t *blocks,
                                 bool with_partial) {
    int64_t bs = pc->kv->block_size;
    uint64_t now = ++pc->tick;
    node *cur = pc->root;
    int64_t i = 0;
    lm_status st = LM_OK;
    for (; (i + 1) * bs <= n; i++) {
        const int32_t *t = tokens + i * bs;
        node *found = NULL;
        for (int32_t c = 0; c < cur->n_child && !found; c++)
            if (cur->child[c]->n_tokens == bs && common_len(cur->child[c]->tokens, t, bs) == bs) found = cur->child[c];
        if (!found && (st = add_child(pc, cur, t, (int32_t)bs, blocks[i], &found))) break;
        found->last_use = now;
        cur = found;
    }
    int64_t rest = n - i * bs;
    if (!st && with_partial && rest > 0 && (i + 1) * bs > n) {
        const int32_t *t = tokens + i * bs;
        bool covered = false;
        for (int32_t c = 0; c < cur->n_child && !covered; c++) {
            node *ch = cur->child[c];
            if (ch->n_tokens >= rest && common_len(ch->tokens, t, rest) == rest) {
                covered = true;
                ch->last_use = now;
            }
        }
        node *added;
        if (!covered) st = add_child(pc, cur, t, (int32_t)rest, blocks[i], &added);
    }
    while (pc->st.bytes > pc->max_bytes && evict_one(pc)) {
    }
    return st;
}

int64_t lm_prefix_cache_evict(lm_prefix_cache *pc, int64_t want_free) {
    int64_t n = 0;
    while (pc->kv->n_free < want_free && evict_one(pc)) n++;
    return n;
}

void lm_prefix_cache_trim(lm_prefix_cache *pc) {
    while (pc->st.bytes > pc->max_bytes && evict_one(pc)) {
    }
}

/* Evictable blocks in the subtree of n (n included when it is not the root); sets
 * *all when the whole subtree can go. */
static int64_t count_evictable(const lm_prefix_cache *pc, const node *n, bool *all) {
    int64_t count = 0;
    bool every = true;
    for (int32_t i = 0; i < n->n_child; i++) {
        bool sub;
        count += count_evictable(pc, n->child[i], &sub);
        every = every && sub;
    }
    if (n->block >= 0) {
        every = every && pc->kv->refcount[n->block] == 1;
        if (every) count++;
    }
    *all = every;
    return count;
}

int64_t lm_prefix_cache_evictable(const lm_prefix_cache *pc) {
    bool all;
    return count_evictable(pc, pc->root, &all);
}

void lm_prefix_cache_clear(lm_prefix_cache *pc) {
    while (evict_one(pc)) {
    }
}

void lm_prefix_cache_get_stats(const lm_prefix_cache *pc, lm_prefix_cache_stats *out) {
    *out = pc->st;
    out->max_bytes = pc->max_bytes;
}
