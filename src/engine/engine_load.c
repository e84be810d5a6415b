/* Loading, on the worker thread: the model, the KV pool sized from the budget,
 * the prefix cache, the batch buffers, and the prefix messages computed once and
 * pinned in sequence 0; and freeing all of it when the worker ends. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/forward.h"

/* Computes tokens[0..n) into sequence `seq` from position 0 (the prefix). */
static lm_status prefill_alone(lm_engine *e, int32_t seq, const int32_t *tokens, int64_t n) {
    int64_t chunk = e->p.max_batch_tokens;
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t k = n - i < chunk ? n - i : chunk;
        for (int64_t j = 0; j < k; j++) {
            e->b_tok[j] = tokens[i + j];
            e->b_pos[j] = (int32_t)(i + j);
            e->b_seq[j] = seq;
        }
        lm_status st = lm_model_forward(e->model, e->kv, e->b_tok, e->b_pos, e->b_seq, k, e->logits);
        if (st) return st;
    }
    return LM_OK;
}

lm_status lm_eng_load(lm_engine *e) {
    lm_status st = lm_model_load(e->model_path, e->p.model, &e->model);
    if (st) return st;
    lm_model *m = e->model;
    e->n_vocab = m->m->hp.n_vocab;
    if (e->p.max_kv_size == 0) e->p.max_kv_size = m->params.n_ctx;
    int64_t bs = 16;
    lm_kv_type kt = m->params.kv_type;
    lm_dtype dt = kt == LM_KV_F32 ? LM_DTYPE_F32 : LM_DTYPE_F16;
    uint64_t per_block = lm_model_kv_bytes(m, bs, kt);
    if (per_block == 0) return lm_error(LM_ERR_INTERNAL, "KV block size is 0");

    if (e->p.n_prefix_messages) {
        size_t n = 0;
        if ((st = lm_eng_render_tokens(m, e->prefix, e->p.n_prefix_messages, false, &e->prefix_tokens, &n)))
            return lm_error_prefix(st, "the engine's prefix messages");
        e->n_prefix_tokens = (int64_t)n;
        if (e->n_prefix_tokens >= e->p.max_kv_size)
            return lm_error(LM_ERR_LIMIT, "the prefix messages take %lld tokens: no room left in max_kv_size = %d",
                            (long long)e->n_prefix_tokens, e->p.max_kv_size);
    }
    e->n_prefix_blocks = (e->n_prefix_tokens + bs - 1) / bs;
    int64_t n_blocks;
    if (e->p.max_kv_bytes) {
        n_blocks = (int64_t)(e->p.max_kv_bytes / per_block);
    } else {
        n_blocks = (int64_t)e->p.batch_size * ((e->p.max_kv_size + bs - 1) / bs) + e->n_prefix_blocks;
    }
    if (n_blocks <= e->n_prefix_blocks)
        return lm_error(LM_ERR_NO_MEMORY,
                        "max_kv_bytes = %llu holds %lld KV blocks of %d tokens (%.1f KiB each); the prefix "
                        "messages alone need %lld",
                        (unsigned long long)e->p.max_kv_bytes, (long long)n_blocks, (int)bs,
                        (double)per_block / 1024.0, (long long)e->n_prefix_blocks);
    uint64_t limit = m->params.memory_limit;
    if (limit && m->m->weight_bytes + (uint64_t)n_blocks * per_block > limit)
        return lm_error(LM_ERR_NO_MEMORY, "a KV pool of %.1f MiB and the weights exceed the memory limit of %.1f MiB",
                        (double)n_blocks * (double)per_block / 1048576.0, (double)limit / 1048576.0);
    int32_t n_seqs = e->p.batch_size + 1; /* slot 0: the prefix */
    if ((st = lm_kv_cache_create(m->m->backend, m->m->hp.n_layer, m->m->hp.n_head_kv * m->m->hp.head_dim, bs, n_blocks,
                                 n_seqs, dt, &e->kv)))
        return st;
    if ((st = lm_prefix_cache_create(e->kv, e->p.prefix_cache_bytes, &e->pc))) return st;
    int64_t bt = e->p.max_batch_tokens + e->p.batch_size;
    e->free_slots = malloc(sizeof(int32_t) * (size_t)n_seqs);
    e->running = calloc((size_t)e->p.batch_size, sizeof *e->running);
    e->b_tok = malloc(sizeof(int32_t) * (size_t)bt);
    e->b_pos = malloc(sizeof(int32_t) * (size_t)bt);
    e->b_seq = malloc(sizeof(int32_t) * (size_t)bt);
    e->b_want = malloc((size_t)bt);
    e->match_blocks = malloc(sizeof(int32_t) * (size_t)(e->p.max_kv_size / bs + 2));
    /* page-locked on a GPU: the logits of every sequence come back each step */
    e->logits = lm_backend_host_alloc(m->backend,
                                      sizeof(float) * (size_t)e->n_vocab * (size_t)(e->p.batch_size + 1));
    if (!e->free_slots || !e->running || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->match_blocks ||
        !e->logits)
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for the engine's buffers");
    /* the candidate path: K best logits of each row instead of the row */
    const char *topk = getenv("LUMEN_LOGITS_TOPK");
    e->topk_k = topk && !strcmp(topk, "0") ? 0 : LM_SAMPLER_CANDIDATES;
    if (e->topk_k > e->n_vocab) e->topk_k = (int)e->n_vocab;
    if (e->topk_k) {
        size_t rows = (size_t)e->p.batch_size + 1, kk = (size_t)e->topk_k;
        e->cand_ids = lm_backend_host_alloc(m->backend, sizeof(int32_t) * rows * kk);
        e->cand_vals = lm_backend_host_alloc(m->backend, sizeof(float) * rows * kk);
        e->cand_max = lm_backend_host_alloc(m->backend, sizeof(float) * rows);
        e->cand_full = malloc(rows);
        if (!e->cand_ids || !e->cand_vals || !e->cand_max || !e->cand_full)
            return lm_error(LM_ERR_NO_MEMORY, "out of memory for the engine's buffers");
    }
    for (int32_t s = n_seqs - 1; s >= 1; s--) e->free_slots[e->n_free_slots++] = s;
    if (e->n_prefix_tokens) {
        if ((st = prefill_alone(e, 0, e->prefix_tokens, e->n_prefix_tokens)))
            return lm_error_prefix(st, "computing the prefix messages");
        /* the tree shares them; sequence 0 keeps them pinned for the engine's life */
        lm_prefix_cache_insert(e->pc, e->prefix_tokens, e->n_prefix_tokens, e->kv->seqs[0].blocks, true);
    }
    pthread_mutex_lock(&e->mu);
    e->st.n_prefix_tokens = e->n_prefix_tokens;
    e->st.n_prefill_tokens = e->n_prefix_tokens;
    e->st.kv_blocks = n_blocks;
    e->st.kv_bytes = (uint64_t)n_blocks * per_block;
    lm_eng_update_stats_locked(e); /* the device's memory with the weights and the pool */
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

void lm_eng_unload(lm_engine *e) {
    /* everything ended: free the model and the caches */
    if (e->model) {
        lm_backend *b = e->model->backend;
        lm_backend_host_free(b, e->logits);
        lm_backend_host_free(b, e->cand_ids);
        lm_backend_host_free(b, e->cand_vals);
        lm_backend_host_free(b, e->cand_max);
    }
    e->logits = NULL;
    e->cand_ids = NULL;
    e->cand_vals = NULL;
    e->cand_max = NULL;
    free(e->cand_full);
    e->cand_full = NULL;
    lm_prefix_cache_free(e->pc);
    lm_kv_cache_free(e->kv);
    lm_model_free(e->model);
    pthread_mutex_lock(&e->mu);
    e->pc = NULL;
    e->kv = NULL;
    e->model = NULL;
    pthread_mutex_unlock(&e->mu);
    free(e->free_slots);
    free(e->running);
    free(e->waiting);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
    free(e->match_blocks);
    free(e->prefix_tokens);
}
