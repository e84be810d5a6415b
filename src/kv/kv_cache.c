#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

lm_status lm_kv_cache_create(lm_backend *backend, int64_t n_layer, int64_t n_embd_kv, int64_t block_size,
                             int64_t n_blocks, int64_t n_seqs, lm_dtype type, lm_kv_cache **out) {
    *out = NULL;
    if (type != LM_DTYPE_F16 && type != LM_DTYPE_F32)
        return lm_error(LM_ERR_UNSUPPORTED, "KV cache type %s is not supported (F16 or F32)", lm_dtype_name(type));
    size_t elem = type == LM_DTYPE_F16 ? 2 : 4;
    if (n_layer <= 0 || n_embd_kv <= 0 || block_size <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX || n_seqs <= 0 ||
        n_seqs > (1 << 20))
        return lm_error(LM_ERR_INVALID_ARG, "KV cache dimensions are out of range");
    double bytes = 2.0 * (double)n_layer * (double)n_blocks * (double)block_size * (double)n_embd_kv * (double)elem;
    if (bytes > 1e15) return lm_error(LM_ERR_LIMIT, "KV cache of %.3g bytes is too large", bytes);
    lm_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return lm_error(LM_ERR_NO_MEMORY, "out of memory for the KV cache");
    kv->backend = backend;
    kv->n_layer = n_layer;
    kv->n_embd_kv = n_embd_kv;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_seqs = n_seqs;
    kv->type = type;
    kv->elem_size = elem;
    size_t half = (size_t)(bytes / 2);
    kv->k = backend->ops->alloc(backend, half);
    kv->v = backend->ops->alloc(backend, half);
    kv->refcount = calloc((size_t)n_blocks, sizeof *kv->refcount);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    kv->seqs = calloc((size_t)n_seqs, sizeof *kv->seqs);
    if (!kv->k || !kv->v || !kv->refcount || !kv->free_list || !kv->seqs) {
        lm_kv_cache_free(kv);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for a KV cache of %.1f MiB", bytes / (1 << 20));
    }
    /* hand out low block ids first: pop from the end of a descending stack */
    for (int64_t i = 0; i < n_blocks; i++) kv->free_list[i] = (int32_t)(n_blocks - 1 - i);
    kv->n_free = n_blocks;
    *out = kv;
    return LM_OK;
}

void lm_kv_cache_free(lm_kv_cache *kv) {
    if (!kv) return;
    if (kv->k) kv->backend->ops->free(kv->backend, kv->k);
    if (kv->v) kv->backend->ops->free(kv->backend, kv->v);
    if (kv->seqs)
        for (int64_t i = 0; i < kv->n_seqs; i++) free(kv->seqs[i].blocks);
    free(kv->seqs);
    free(kv->refcount);
    free(kv->free_list);
    free(kv);
}

lm_status lm_kv_cache_reserve(lm_kv_cache *kv, int32_t seq, int64_t n_pos) {
    if (seq < 0 || seq >= kv->n_seqs)
        return lm_error(LM_ERR_INVALID_ARG, "sequence id %d is out of range (0..%lld)", seq, (long long)kv->n_seqs - 1);
    if (n_pos < 0) return lm_error(LM_ERR_INVALID_ARG, "negative position count");
    lm_kv_seq *s = &kv->seqs[seq];
    int64_t need = (n_pos + kv->block_size - 1) / kv->block_size;
    if (need <= s->n_blocks) {
        if (n_pos > s->n_pos) s->n_pos = n_pos;
        return LM_OK;
    }
    int64_t extra = need - s->n_blocks;
    if (extra > kv->n_free)
        return lm_error(LM_ERR_NO_MEMORY, "KV cache is full: %lld more blocks needed, %lld free",
                        (long long)extra, (long long)kv->n_free);
    if (need > s->cap) {
        int64_t cap = s->cap ? s->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *blocks = realloc(s->blocks, (size_t)cap * sizeof *blocks);
        if (!blocks) return lm_error(LM_ERR_NO_MEMORY, "out of memory for a block table");
        s->blocks = blocks;
        s->cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t b = kv->free_list[--kv->n_free];
        kv->refcount[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    s->n_pos = n_pos;
    return LM_OK;
}

void lm_kv_cache_truncate(lm_kv_cache *kv, int32_t seq, int64_t n_pos) {
    if (seq < 0 || seq >= kv->n_seqs || n_pos < 0) return;
    lm_kv_seq *s = &kv->seqs[seq];
    if (n_pos < s->n_pos) s->n_pos = n_pos;
    int64_t keep = (n_pos + kv->block_size - 1) / kv->block_size;
    while (s->n_blocks > keep) {
        int32_t b = s->blocks[--s->n_blocks];
        if (--kv->refcount[b] == 0) kv->free_list[kv->n_free++] = b;
    }
}

void lm_kv_cache_block_ref(lm_kv_cache *kv, int32_t b) {
    if (b >= 0 && b < kv->n_blocks) kv->refcount[b]++;
}

void lm_kv_cache_block_unref(lm_kv_cache *kv, int32_t b) {
    if (b < 0 || b >= kv->n_blocks || kv->refcount[b] <= 0) return;
    if (--kv->refcount[b] == 0) kv->free_list[kv->n_free++] = b;
}

lm_status lm_kv_cache_attach(lm_kv_cache *kv, int32_t seq, const int32_t *blocks, int64_t n_blocks, int64_t n_pos) {
    if (seq < 0 || seq >= kv->n_seqs) return lm_error(LM_ERR_INVALID_ARG, "sequence id %d is out of range", seq);
    lm_kv_seq *s = &kv->seqs[seq];
    if (s->n_blocks != 0) return lm_error(LM_ERR_INVALID_ARG, "sequence %d is not empty: cannot attach blocks", seq);
    if (n_blocks < 0 || n_pos < 0 || n_pos > n_blocks * kv->block_size ||
        (n_blocks > 0 && n_pos <= (n_blocks - 1) * kv->block_size))
        return lm_error(LM_ERR_INVALID_ARG, "%lld positions do not fit %lld blocks", (long long)n_pos,
                        (long long)n_blocks);
    for (int64_t i = 0; i < n_blocks; i++)
        if (blocks[i] < 0 || blocks[i] >= kv->n_blocks || kv->refcount[blocks[i]] <= 0)
            return lm_error(LM_ERR_INVALID_ARG, "block %d is not in use: cannot share it", blocks[i]);
    if (n_blocks > s->cap) {
        int64_t cap = s->cap ? s->cap : 8;
        while (cap < n_blocks) cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return lm_error(LM_ERR_NO_MEMORY, "out of memory for a block table");
        s->blocks = nb;
        s->cap = cap;
    }
    for (int64_t i = 0; i < n_blocks; i++) {
        s->blocks[i] = blocks[i];
        kv->refcount[blocks[i]]++;
    }
    s->n_blocks = n_blocks;
    s->n_pos = n_pos;
    return LM_OK;
}

lm_status lm_kv_cache_cow(lm_kv_cache *kv, int32_t seq, int64_t pos) {
    if (seq < 0 || seq >= kv->n_seqs || pos < 0) return lm_error(LM_ERR_INVALID_ARG, "copy-on-write: bad sequence or position");
    lm_kv_seq *s = &kv->seqs[seq];
    int64_t bi = pos / kv->block_size;
    if (bi >= s->n_blocks) return LM_OK; /* not allocated yet: it will be a fresh block */
    int32_t old = s->blocks[bi];
    if (kv->refcount[old] <= 1) return LM_OK;
    if (kv->n_free == 0) return lm_error(LM_ERR_NO_MEMORY, "KV cache is full: no block free for a copy-on-write");
    int32_t nb = kv->free_list[--kv->n_free];
    kv->refcount[nb] = 1;
    size_t row = (size_t)(kv->block_size * kv->n_embd_kv) * kv->elem_size;
    for (int64_t l = 0; l < kv->n_layer; l++) {
        size_t dst = ((size_t)l * (size_t)kv->n_blocks + (size_t)nb) * row;
        size_t src = ((size_t)l * (size_t)kv->n_blocks + (size_t)old) * row;
        kv->backend->ops->copy(kv->backend, (char *)kv->k + dst, (char *)kv->k + src, row);
        kv->backend->ops->copy(kv->backend, (char *)kv->v + dst, (char *)kv->v + src, row);
    }
    kv->refcount[old]--; /* still > 0: another holder keeps it */
    s->blocks[bi] = nb;
    return LM_OK;
}

int64_t lm_kv_cache_blocks_needed(const lm_kv_cache *kv, int32_t seq, int64_t n_pos) {
    const lm_kv_seq *s = &kv->seqs[seq];
    int64_t need = (n_pos + kv->block_size - 1) / kv->block_size;
    int64_t extra = need > s->n_blocks ? need - s->n_blocks : 0;
    int64_t bi = s->n_pos / kv->block_size; /* the block the next write lands in */
    if (n_pos > s->n_pos && bi < s->n_blocks && kv->refcount[s->blocks[bi]] > 1) extra++;
    return extra;
}
