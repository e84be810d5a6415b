/* The scheduler (on the worker): admission of waiting requests by the KV blocks
 * they need before their first sample, room in the pool for what each sequence
 * computes next (preempting the newest requests when there is none), and one step
 * of continuous batching: a token of every decoding request, then prompt chunks up
 * to max_batch_tokens, one forward pass, sampling where logits were asked for. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/forward.h"

/* Worst-case blocks of a request that reuses `cached` tokens. */
int64_t lm_eng_worst_blocks(const lm_kv_cache *kv, int64_t bound, int64_t cached) {
    int64_t bs = kv->block_size;
    return (bound + bs - 1) / bs - cached / bs;
}

/* The positions a request must hold before its next sample: the rest of its
 * prompt and the first generated token while prefilling, the next token while
 * decoding (never beyond its bound). */
static int64_t next_target(const lm_engine_request *r) {
    int64_t t = (r->state == R_DECODE ? r->n_computed : r->n_target) + 1;
    return t < r->bound ? t : r->bound;
}

/* Tries to give the request a sequence: shares the cached prefix, checks the pool
 * can hold what it computes before its first sample beside `reserved` blocks (what
 * the running requests need next). false (nothing changed) when it must wait. */
static bool admit(lm_engine *e, lm_engine_request *r, int64_t reserved) {
    if (e->n_free_slots == 0) return false;
    int32_t seq = e->free_slots[e->n_free_slots - 1];
    int64_t nb = 0;
    int64_t m = lm_prefix_cache_match(e->pc, r->tokens, r->n_target, r->n_target - 1, e->match_blocks, &nb);
    if (lm_kv_cache_attach(e->kv, seq, e->match_blocks, nb, m)) return false;
    int64_t need = lm_kv_cache_blocks_needed(e->kv, seq, next_target(r));
    int64_t avail = e->kv->n_free + lm_prefix_cache_evictable(e->pc) - reserved;
    if (need > avail) {
        lm_kv_cache_truncate(e->kv, seq, 0);
        return false;
    }
    if (r->n_preempted == 0) { /* a readmission is no new lookup of the prompt */
        lm_prefix_cache_record(e->pc, r->n_prompt, m);
        r->gen.stats.n_cached_tokens = m;
    }
    e->n_free_slots--;
    r->seq = seq;
    r->n_computed = m;
    r->state = R_PREFILL;
    return true;
}

/* Makes room for positions [n_computed, target) of the request's sequence. */
static lm_status make_room(lm_engine *e, lm_engine_request *r, int64_t target) {
    int64_t need = lm_kv_cache_blocks_needed(e->kv, r->seq, target);
    if (need > e->kv->n_free) lm_prefix_cache_evict(e->pc, need);
    lm_status st = lm_kv_cache_cow(e->kv, r->seq, r->n_computed);
    if (!st) st = lm_kv_cache_reserve(e->kv, r->seq, target);
    if (st) return lm_error_prefix(st, "KV cache");
    return LM_OK;
}

/* Hands the request's sequence back: its blocks go to the prefix cache (all the
 * positions computed, the partial last block included) and to the pool. */
void lm_eng_release_seq(lm_engine *e, lm_engine_request *r, bool keep) {
    if (r->seq < 0) return;
    if (keep && r->n_computed > 0)
        lm_prefix_cache_insert(e->pc, r->tokens, r->n_computed, e->kv->seqs[r->seq].blocks, true);
    lm_kv_cache_truncate(e->kv, r->seq, 0);
    lm_prefix_cache_trim(e->pc);
    e->free_slots[e->n_free_slots++] = r->seq;
    r->seq = -1;
}

static void remove_running(lm_engine *e, int32_t i) {
    memmove(e->running + i, e->running + i + 1, sizeof *e->running * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

/* Takes the sequence of running[i] back (its blocks to the prefix cache, which
 * keeps what its budget allows) and puts the request at the front of the queue: it
 * will recompute every token it holds, the last one sampled included, and sample
 * again from there. Nothing it streamed changes: its sampler, detokenizer and stop
 * matcher keep their state. */
static void preempt(lm_engine *e, int32_t i, pubs *ps) {
    lm_engine_request *r = e->running[i];
    remove_running(e, i);
    if (e->n_waiting == e->cap_waiting) {
        int64_t cap = e->cap_waiting ? e->cap_waiting * 2 : 64;
        lm_engine_request **nw = realloc(e->waiting, sizeof *nw * (size_t)cap);
        if (!nw) {
            lm_eng_finish_request(e, r, LM_FINISH_ERROR,
                                  lm_error(LM_ERR_NO_MEMORY, "out of memory preempting a request"), lm_last_error(),
                                  ps);
            return;
        }
        e->waiting = nw;
        e->cap_waiting = cap;
    }
    if (r->state == R_DECODE) r->tokens[r->n_tokens++] = r->last_token;
    r->n_target = r->n_tokens;
    r->pending = 0;
    lm_eng_release_seq(e, r, true);
    r->n_computed = 0;
    r->state = R_WAITING;
    r->n_preempted++;
    e->n_preemptions++;
    memmove(e->waiting + 1, e->waiting, sizeof *e->waiting * (size_t)e->n_waiting);
    e->waiting[0] = r;
    e->n_waiting++;
}

/* What each running request computes this step (r->pending): one token per
 * decoding request, then prompt chunks, oldest first, up to max_batch_tokens. */
static void plan(lm_engine *e) {
    int64_t n_decode = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        r->pending = r->state == R_DECODE;
        n_decode += r->pending;
    }
    int64_t budget = e->p.max_batch_tokens > n_decode ? e->p.max_batch_tokens - n_decode : 0;
    if (n_decode == 0 && budget == 0) budget = 1;
    for (int32_t i = 0; i < e->n_running && budget > 0; i++) {
        lm_engine_request *r = e->running[i];
        if (r->state != R_PREFILL) continue;
        int64_t k = r->n_target - r->n_computed;
        r->pending = k < budget ? k : budget;
        budget -= r->pending;
    }
}

/* Gives every planned request, oldest first, the blocks it writes this step. When
 * the pool (after evicting unshared prefix-cache blocks) has too few, the most
 * recently admitted request gives its blocks back, until there is room or the one
 * asking was itself the newest (it waits then). A request alone that still finds
 * no room ends with the error. */
static void reserve(lm_engine *e, pubs *ps) {
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        if (!r->pending) continue;
        while (make_room(e, r, r->n_computed + r->pending)) {
            if (e->n_running == 1) {
                lm_eng_finish_request(e, r, LM_FINISH_ERROR, LM_ERR_NO_MEMORY, lm_last_error(), ps);
                r->pending = 0;
                break;
            }
            lm_clear_error();
            int32_t victim = e->n_running - 1;
            preempt(e, victim, ps);
            if (victim == i) break;
        }
    }
}

/* The candidates of row i of the last candidate pass. */
static lm_candidates row_candidates(const lm_engine *e, int64_t i) {
    size_t k = (size_t)e->step_k;
    return (lm_candidates){(size_t)e->n_vocab, e->step_k, e->cand_ids + (size_t)i * k, e->cand_vals + (size_t)i * k,
                           e->cand_max[i]};
}

typedef struct need_full_ctx {
    const lm_engine *e;
    lm_engine_request *const *rows;
} need_full_ctx;

/* lm_forward_topk's question: the rows whose candidates leave the token open (a
 * tie at the top-k boundary) come back whole. */
static bool need_full(void *user, int64_t row) {
    const need_full_ctx *c = user;
    lm_candidates cand = row_candidates(c->e, row);
    return !lm_gen_candidates_suffice(&c->rows[row]->gen, &cand);
}

/* One forward pass over the batch: the candidates of the rows when every request
 * sampling this step can take them (*cands; the best logit alone when every one is
 * greedy), else the full logits as always. */
static lm_status run_batch(lm_engine *e, const lm_batch *batch, lm_engine_request *const *with_logits, int64_t n_out,
                           bool *cands) {
    int k = n_out > 0 ? 1 : 0;
    for (int64_t i = 0; i < n_out && k > 0; i++) {
        const int need = lm_gen_candidates_k(&with_logits[i]->gen, e->topk_k);
        k = need == 0 ? 0 : need > k ? need : k;
    }
    e->step_k = k;
    *cands = k > 0;
    need_full_ctx ctx = {e, with_logits};
    lm_topk_out out = {k, e->cand_ids, e->cand_vals, e->cand_max, NULL, need_full, &ctx, e->logits,
                       e->cand_full};
    pthread_mutex_lock(&e->model->forward_lock);
    lm_status st = *cands ? lm_forward_topk(e->model->m, e->kv, batch, &out)
                          : lm_forward(e->model->m, e->kv, batch, e->logits);
    pthread_mutex_unlock(&e->model->forward_lock);
    return st;
}

/* One scheduler step over the running requests. */
static void step(lm_engine *e, pubs *ps) {
    plan(e);
    reserve(e, ps);
    int64_t n = 0, n_out = 0;
    int32_t n_decode = 0;
    lm_engine_request *with_logits[4096];
    /* decodes first: one token each */
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        if (r->state != R_DECODE || !r->pending) continue;
        e->b_tok[n] = r->last_token;
        e->b_pos[n] = (int32_t)r->n_computed;
        e->b_seq[n] = r->seq;
        e->b_want[n] = 1;
        r->tokens[r->n_tokens++] = r->last_token;
        n++;
        with_logits[n_out++] = r;
        n_decode++;
    }
    /* then prompt chunks, oldest first */
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        if (r->state != R_PREFILL || !r->pending) continue;
        for (int64_t j = 0; j < r->pending; j++) {
            e->b_tok[n] = r->tokens[r->n_computed + j];
            e->b_pos[n] = (int32_t)(r->n_computed + j);
            e->b_seq[n] = r->seq;
            e->b_want[n] = 0;
            n++;
        }
        if (r->n_computed + r->pending == r->n_target) {
            e->b_want[n - 1] = 1;
            with_logits[n_out++] = r;
        }
    }
    if (n == 0) return;
    lm_batch batch = {n, e->b_tok, e->b_pos, e->b_seq, e->b_want};
    double t0 = lm_now_s();
    bool cands;
    lm_status st = run_batch(e, &batch, with_logits, n_out, &cands);
    double dt = lm_now_s() - t0;
    int64_t n_prefill = n - n_decode;
    if (st) {
        char msg[ERR_CAP];
        lm_eng_set_err(msg, lm_last_error());
        for (int32_t i = 0; i < e->n_running; i++) {
            lm_engine_request *r = e->running[i];
            r->pending = 0;
            if (r->state == R_PREFILL || r->state == R_DECODE)
                lm_eng_finish_request(e, r, LM_FINISH_ERROR, st, msg, ps);
        }
        return;
    }
    /* advance every sequence in the batch */
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        if (r->pending && r->state == R_PREFILL) r->gen.stats.prompt_s += dt;
        r->n_computed += r->pending;
        r->pending = 0;
    }
    for (int64_t i = 0; i < n_out; i++) {
        lm_engine_request *r = with_logits[i];
        if (r->state == R_PREFILL) /* the prompt is in: share its full blocks */
            lm_prefix_cache_insert(e->pc, r->tokens, r->n_computed, e->kv->seqs[r->seq].blocks, false);
        const float *row = e->logits + (size_t)i * (size_t)e->n_vocab;
        if (cands && !e->cand_full[i]) {
            lm_candidates c = row_candidates(e, i);
            lm_eng_sample_step(e, r, NULL, &c, ps);
        } else {
            lm_eng_sample_step(e, r, row, NULL, ps);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->st.n_steps++;
    e->st.n_prefill_tokens += n_prefill;
    e->st.n_decode_tokens += n_decode;
    e->st.n_generated_tokens += n_out;
    if (cands) {
        e->n_cand_steps++;
        for (int64_t i = 0; i < n_out; i++) e->n_cand_rows_full += e->cand_full[i];
    }
    e->step_tokens_sum += (double)n;
    e->occupancy_sum += (double)e->n_running / (double)e->p.batch_size;
    pthread_mutex_unlock(&e->mu);
}

void lm_eng_drop_done(lm_engine *e) {
    for (int32_t i = 0; i < e->n_running;)
        if (e->running[i]->state == R_DONE)
            remove_running(e, i);
        else
            i++;
}

void lm_eng_schedule(lm_engine *e, pubs *ps) {
    /* admission, in arrival order (preempted requests first) */
    int64_t reserved = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        reserved += lm_kv_cache_blocks_needed(e->kv, r->seq, next_target(r));
    }
    while (e->n_waiting > 0 && e->n_running < e->p.batch_size) {
        lm_engine_request *r = e->waiting[0];
        if (!admit(e, r, reserved)) break;
        reserved += lm_kv_cache_blocks_needed(e->kv, r->seq, next_target(r));
        e->running[e->n_running++] = r;
        memmove(e->waiting, e->waiting + 1, sizeof *e->waiting * (size_t)(e->n_waiting - 1));
        e->n_waiting--;
    }
    if (e->n_running > 0) step(e, ps);
    lm_eng_drop_done(e);
}
