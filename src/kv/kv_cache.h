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
