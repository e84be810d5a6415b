/* The prefix cache: a radix tree over KV blocks keyed by the token ids they hold, so
 * a prompt that starts with tokens computed before (a shared system prompt, earlier
 * turns of a chat) reuses their keys and values instead of recomputing them.
 *
 * Each node is one block of the paged cache (kv_cache.h) and the block_size token
 * ids whose K/V it holds, following its parent's tokens; the root is the empty
 * prefix. A leaf may be a partially filled block (fewer tokens): those come from
 * finished sequences and from the engine's prefix messages, and are shared under
 * copy-on-write (lm_kv_cache_cow) by whoever writes after them. A lookup may also
 * use the first k tokens of a full block, the same way.
 *
 * The tree holds one reference on each of its blocks. A block whose only reference
 * is the tree's is evictable; eviction takes least-recently-used leaves first, to
 * keep the tree's bytes under a budget and to free blocks when the pool runs out.
 *
 * Not thread-safe: the engine's worker thread owns it. Because the forward pass is
 * deterministic and batch-invariant, K/V reused from the tree are bit-identical to
 * recomputed ones, so a cache hit gives exactly the output of a miss. */
#ifndef LM_KV_PREFIX_CACHE_H
#define LM_KV_PREFIX_CACHE_H

#include "kv/kv_cache.h"

typedef struct lm_prefix_cache lm_prefix_cache;

typedef struct lm_prefix_cache_stats {
    int64_t lookups;       /* lm_prefix_cache_match calls                          */
    int64_t hits;          /* lookups that reused at least one token               */
    int64_t misses;        /* lookups that reused none                             */
    int64_t lookup_tokens; /* tokens asked for                                     */
    int64_t hit_tokens;    /* tokens reused                                        */
    int64_t n_nodes;       /* blocks the tree holds                                */
    uint64_t bytes;        /* their bytes                                          */
    uint64_t max_bytes;    /* the budget                                           */
    int64_t evictions;     /* blocks dropped from the tree                         */
} lm_prefix_cache_stats;

/* A tree over the blocks of `kv` (borrowed), keeping at most max_bytes of blocks
 * (0 = the whole pool). */
lm_status lm_prefix_cache_create(lm_kv_cache *kv, uint64_t max_bytes, lm_prefix_cache **out);
/* Drops the tree's references (blocks shared with live sequences stay with them). */
void lm_prefix_cache_free(lm_prefix_cache *pc);

/* The longest cached prefix of tokens[0..n), at most max_match tokens: writes the
 * blocks holding it to blocks[] (room for max_match / block_size + 1) and returns
 * the matched token count; *n_blocks = blocks written (the last may be partially
 * used: copy it on write). Marks the path as recently used. Counts nothing: call
 * lm_prefix_cache_record once the lookup is used (a caller may retry one later). */
int64_t lm_prefix_cache_match(lm_prefix_cache *pc, const int32_t *tokens, int64_t n, int64_t max_match,
                              int32_t *blocks, int64_t *n_blocks);

/* Counts a lookup of n tokens of which `matched` were reused (a hit if > 0). */
void lm_prefix_cache_record(lm_prefix_cache *pc, int64_t n, int64_t matched);

/* Records that blocks[i] holds tokens[i*bs .. (i+1)*bs) for every full block of
 * tokens[0..n), and, if with_partial, that the last block holds the remaining
 * n % bs tokens. Blocks already in the tree for the same tokens are kept (the
 * given duplicates are not taken). Then evicts down to the byte budget. */
lm_status lm_prefix_cache_insert(lm_prefix_cache *pc, const int32_t *tokens, int64_t n, const int32_t *blocks,
                                 bool with_partial);

/* Evicts least-recently-used evictable leaves until the pool has `want_free` free
 * blocks or nothing more can go. Returns the number of blocks evicted. */
int64_t lm_prefix_cache_evict(lm_prefix_cache *pc, int64_t want_free);

/* Evicts down to the byte budget (after sequences let go of blocks). */
void lm_prefix_cache_trim(lm_prefix_cache *pc);

/* Blocks that evicting everything evictable would return to the pool. */
int64_t lm_prefix_cache_evictable(const lm_prefix_cache *pc);

/* Drops every evictable block (the tree keeps only blocks live sequences share). */
void lm_prefix_cache_clear(lm_prefix_cache *pc);

void lm_prefix_cache_get_stats(const lm_prefix_cache *pc, lm_prefix_cache_stats *out);

#endif
