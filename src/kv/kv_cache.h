/* The paged KV cache: a pool of fixed-size blocks (block_size token slots each, for
 * every layer) and, per sequence, a block table mapping position p to slot
 * (table[p / block_size], p % block_size). Attention reads keys and values through
 * the table, so sequences of any length share one pool without fragmentation.
 *
 * Memory layout (backend memory), for K and V alike:
 *   [n_layer][n_blocks][block_size][n_head_kv * head_dim]  of `type` (F16 or F32)
 * F16 halves the cache and the bandwidth attention needs (the default, as in
 * llama.cpp); F32 keeps keys and values exact (reference comparisons).
 * Block bookkeeping (tables, free list, reference counts) lives in host memory. */
#ifndef LM_KV_KV_CACHE_H
#define LM_KV_KV_CACHE_H

#include "lumen.h"
#include "tensor/dtype.h"

struct lm_backend;

typedef struct lm_kv_seq {
    int32_t *blocks;   /* block ids, one per block_size positions */
    int64_t n_blocks;  /* used entries of blocks                  */
    int64_t cap;       /* capacity of blocks                      */
    int64_t n_pos;     /* positions [0, n_pos) hold valid K/V     */
} lm_kv_seq;

typedef struct lm_kv_cache {
    struct lm_backend *backend;
    int64_t n_layer, n_embd_kv; /* n_embd_kv = n_head_kv * head_dim */
    int64_t block_size, n_blocks;
    lm_dtype type;              /* LM_DTYPE_F16 or LM_DTYPE_F32     */
    size_t elem_size;           /* 2 or 4                           */
    void *k, *v;                /* backend memory, layout above     */
    int32_t *refcount;          /* per block                        */
    int32_t *free_list;         /* stack of free block ids          */
    int64_t n_free;
    lm_kv_seq *seqs;            /* indexed by sequence id           */
    int64_t n_seqs;
} lm_kv_cache;

/* A cache of n_blocks blocks of block_size tokens for up to n_seqs sequences,
 * holding keys and values as `type` (LM_DTYPE_F16 or LM_DTYPE_F32). */
lm_status lm_kv_cache_create(struct lm_backend *backend, int64_t n_layer, int64_t n_embd_kv, int64_t block_size,
                             int64_t n_blocks, int64_t n_seqs, lm_dtype type, lm_kv_cache **out);
void lm_kv_cache_free(lm_kv_cache *kv);

/* Makes room for positions [0, n_pos) of sequence `seq`, taking blocks from the
 * pool. LM_ERR_NO_MEMORY (nothing changed) if the pool has too few free blocks. */
lm_status lm_kv_cache_reserve(lm_kv_cache *kv, int32_t seq, int64_t n_pos);

/* Forgets positions >= n_pos of `seq` and returns whole unused blocks to the pool. */
void lm_kv_cache_truncate(lm_kv_cache *kv, int32_t seq, int64_t n_pos);

/* ---- sharing blocks between sequences (the engine's prefix cache) ----------------
 * A block may appear in several block tables and in the prefix tree; its reference
 * count says how many. Full blocks are read-only by construction (every position in
 * them is below each sharer's n_pos). A partially filled block that is shared must be
 * copied before a sequence writes into it: lm_kv_cache_cow. */

/* Takes a reference on block `b` (it must be in use). */
void lm_kv_cache_block_ref(lm_kv_cache *kv, int32_t b);
/* Drops a reference; the block returns to the free list when none is left. */
void lm_kv_cache_block_unref(lm_kv_cache *kv, int32_t b);

/* Makes the empty sequence `seq` start with blocks[0..n_blocks) holding positions
 * [0, n_pos) (taking a reference on each). LM_ERR_INVALID_ARG if `seq` is not empty
 * or n_pos does not fit the blocks. */
lm_status lm_kv_cache_attach(lm_kv_cache *kv, int32_t seq, const int32_t *blocks, int64_t n_blocks, int64_t n_pos);

/* Copy-on-write: if the block holding position `pos` of `seq` is allocated and
 * shared (reference count > 1), gives `seq` a private copy of it (keys and values
 * of every layer). LM_ERR_NO_MEMORY (nothing changed) if no block is free. */
lm_status lm_kv_cache_cow(lm_kv_cache *kv, int32_t seq, int64_t pos);

/* Blocks `seq` would take from the pool to hold positions [0, n_pos) (a shared
 * block holding position n_pos_now counts as one: it will be copied). */
int64_t lm_kv_cache_blocks_needed(const lm_kv_cache *kv, int32_t seq, int64_t n_pos);

/* Bytes of one block (keys and values, every layer). */
static inline size_t lm_kv_cache_block_bytes(const lm_kv_cache *kv) {
    return (size_t)(2 * kv->n_layer * kv->n_embd_kv * kv->block_size) * kv->elem_size;
}

/* Bytes of K+V one token occupies across all layers. */
static inline size_t lm_kv_cache_bytes_per_token(const lm_kv_cache *kv) {
    return (size_t)(2 * kv->n_layer * kv->n_embd_kv) * kv->elem_size;
}

/* Index of the slot holding (seq, pos), counted in token slots from the start of a
 * layer: block * block_size + offset. The position must be reserved. */
static inline int64_t lm_kv_cache_slot(const lm_kv_cache *kv, int32_t seq, int64_t pos) {
    const lm_kv_seq *s = &kv->seqs[seq];
    return (int64_t)s->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif
