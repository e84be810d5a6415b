/* What the worker tells each request's caller: the steps (sampled tokens with
 * their text, the final step of a request that ended), queued during a step and
 * published under the lock at its end, with the statistics. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* A step record with the text of the generation's last step. */
step_rec *lm_eng_make_step(lm_engine_request *r, int32_t token, float logprob, const lm_token_logprob *top,
                           size_t n_top, lm_finish_reason finish, lm_status status) {
    const lm_gen *g = &r->gen;
    step_rec *s = malloc(sizeof *s + g->text_len + 1);
    if (!s) return NULL;
    s->next = NULL;
    s->token = token;
    s->logprob = logprob;
    s->finish = finish;
    s->status = status;
    s->n_top = n_top;
    if (n_top) memcpy(s->top, top, sizeof *top * n_top);
    s->text_len = g->text_len;
    if (g->text_len) memcpy(s->text, g->text, g->text_len);
    s->text[g->text_len] = '\0';
    return s;
}

void lm_eng_pubs_add(pubs *ps, lm_engine_request *r, step_rec *s, bool last, const char *err) {
    if (ps->n == ps->cap) {
        int64_t cap = ps->cap ? ps->cap * 2 : 64;
        pub *na = realloc(ps->a, sizeof *na * (size_t)cap);
        if (!na) return; /* the step is lost; the request still ends below */
        ps->a = na;
        ps->cap = cap;
    }
    pub *p = &ps->a[ps->n++];
    p->r = r;
    p->s = s;
    p->last = last;
    p->err[0] = '\0';
    if (err) lm_eng_set_err(p->err, err);
}

/* Ends a request on the worker: releases text still held (unless failed), its KV
 * and its sampler, and queues the final step. */
void lm_eng_finish_request(lm_engine *e, lm_engine_request *r, lm_finish_reason why, lm_status status,
                           const char *err, pubs *ps) {
    lm_gen *g = &r->gen;
    if (!status && (status = lm_gen_end(g, why, &why))) err = lm_last_error();
    if (status) {
        why = LM_FINISH_ERROR;
        g->text_len = 0; /* the previous step's text went out with it */
        g->text[0] = '\0';
    }
    lm_eng_release_seq(e, r, status == LM_OK);
    lm_gen_release(g);
    r->state = R_DONE;
    step_rec *s = lm_eng_make_step(r, -1, 0.0f, NULL, 0, why, status);
    lm_eng_pubs_add(ps, r, s, true, status ? err : NULL);
}

/* Samples the request's next token from `logits` or its candidates and publishes the step. */
void lm_eng_sample_step(lm_engine *e, lm_engine_request *r, const float *logits, const lm_candidates *cand,
                        pubs *ps) {
    lm_gen *g = &r->gen;
    lm_finish_reason why;
    bool full = r->n_computed >= r->bound;
    lm_status st = cand ? lm_gen_sample_candidates(g, cand, full, &why) : lm_gen_sample(g, logits, full, &why);
    if (st) {
        lm_eng_finish_request(e, r, LM_FINISH_ERROR, st, lm_last_error(), ps);
        return;
    }
    r->last_token = g->token;
    bool last = why != LM_FINISH_NONE;
    if (last) {
        lm_eng_release_seq(e, r, true);
        lm_gen_release(g);
        r->state = R_DONE;
    } else {
        r->state = R_DECODE;
    }
    step_rec *s = lm_eng_make_step(r, g->token, g->logprob, g->top, g->n_top_out, why, LM_OK);
    lm_eng_pubs_add(ps, r, s, last, NULL);
}

/* The worker's counters into the published statistics (under mu). */
void lm_eng_update_stats_locked(lm_engine *e) {
    lm_prefix_cache_stats cs = {0};
    if (e->pc) lm_prefix_cache_get_stats(e->pc, &cs);
    int64_t live = 0;
    for (int32_t i = 0; i < e->n_running; i++) live += e->running[i]->state != R_DONE;
    e->st.n_running = live;
    e->st.n_waiting = e->n_waiting;
    e->st.cache_lookups = cs.lookups;
    e->st.cache_hits = cs.hits;
    e->st.cache_misses = cs.misses;
    e->st.cache_evictions = cs.evictions;
    e->st.cache_bytes = cs.bytes;
    e->st.n_cached_tokens = cs.hit_tokens;
    e->st.cache_hit_rate = cs.lookup_tokens > 0 ? (double)cs.hit_tokens / (double)cs.lookup_tokens : 0.0;
    e->st.kv_blocks_free = e->kv ? e->kv->n_free : 0;
    e->st.n_preemptions = e->n_preemptions;
    lm_backend *b = e->model ? e->model->backend : NULL;
    if (b && b->ops->peak_memory) {
        e->st.device_peak_bytes = b->ops->peak_memory(b);
        atomic_store(&e->device_peak, e->st.device_peak_bytes);
    }
}

/* Publishes steps and lets go of finished requests (takes mu). */
void lm_eng_publish(lm_engine *e, pubs *ps) {
    if (ps->n == 0) return;
    pthread_mutex_lock(&e->mu);
    lm_eng_update_stats_locked(e);
    for (int64_t i = 0; i < ps->n; i++) {
        pub *p = &ps->a[i];
        lm_engine_request *r = p->r;
        lm_finish_reason fin = r->stats.finish;
        r->stats = r->gen.stats;
        r->stats.finish = fin;
        if (p->s) {
            if (r->q_tail)
                r->q_tail->next = p->s;
            else
                r->q_head = p->s;
            r->q_tail = p->s;
        }
        if (p->last) {
            r->final_queued = true;
            if (p->err[0]) memcpy(r->err, p->err, ERR_CAP);
            if (p->s) r->stats.finish = p->s->finish;
            else r->stats.finish = LM_FINISH_ERROR;
            r->stats.total_s = lm_now_s() - r->gen.t_start;
            lm_stats_update_rates(&r->stats);
            e->st.n_finished++;
            p->last = lm_eng_request_unref_locked(r); /* now: whether to destroy it */
        }
    }
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    for (int64_t i = 0; i < ps->n; i++)
        if (ps->a[i].last) {
            lm_eng_request_destroy(ps->a[i].r);
            lm_eng_unref(e);
        }
    ps->n = 0;
}
