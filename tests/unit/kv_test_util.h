/* KV cache helpers shared by the attention tests. */
#ifndef LM_KV_TEST_UTIL_H
#define LM_KV_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"

/* Every byte of the cache's K and V pools (all layers, all blocks) set to 0xff: NaN
 * in F16 and F32 alike. A pool is recycled memory that may hold NaN where no token
 * was stored (a block's slots past a sequence's last position, blocks of other
 * sequences), so an attention that lets such a row into its sums, even at weight 0
 * (0 x NaN = NaN), gives NaN here instead of passing on zeros. Returns false when
 * the host buffer cannot be had. */
static inline bool kv_poison(lm_kv_cache *kv) {
    const size_t bytes = (size_t)(kv->n_layer * kv->n_blocks * kv->block_size * kv->n_embd_kv) * kv->elem_size;
    uint8_t *ones = malloc(bytes);
    if (!ones) return false;
    memset(ones, 0xff, bytes);
    kv->backend->ops->upload(kv->backend, kv->k, ones, bytes);
    kv->backend->ops->upload(kv->backend, kv->v, ones, bytes);
    free(ones);
    return true;
}

#endif
