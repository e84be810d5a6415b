/* Streaming requests, the caller's side: checking and building a request on the
 * caller's thread, handing it to the worker, and reading its steps as the worker
 * publishes them. Any thread may use a request; each holds a reference on the
 * engine, so it outlives lm_engine_close. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

lm_status lm_eng_render_tokens(const lm_model *m, const lm_chat_message *msgs, size_t n, bool gen_prompt,
                               int32_t **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    lm_chat_params cp = lm_chat_default_params();
    cp.add_generation_prompt = gen_prompt;
    size_t need = 0;
    lm_status st = lm_chat_render(m, msgs, n, cp, NULL, 0, &need);
    if (st) return st;
    char *text = malloc(need + 1);
    if (!text) return lm_error(LM_ERR_NO_MEMORY, "out of memory rendering a conversation");
    st = lm_chat_render(m, msgs, n, cp, text, need + 1, &need);
    uint32_t flags = LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL;
    size_t nt = 0;
    if (!st) st = lm_tokenize(m, text, need, flags, NULL, 0, &nt);
    int32_t *ids = NULL;
    if (!st) {
        ids = malloc(sizeof(int32_t) * (nt ? nt : 1));
        if (!ids) st = lm_error(LM_ERR_NO_MEMORY, "out of memory tokenizing a conversation");
    }
    if (!st) st = lm_tokenize(m, text, need, flags, ids, nt, &nt);
    free(text);
    if (st) {
        free(ids);
        return st;
    }
    *out = ids;
    *n_out = nt;
    return LM_OK;
}

void lm_eng_request_destroy(lm_engine_request *r) {
    lm_gen_free(&r->gen);
    step_rec *s = r->q_head;
    while (s) {
        step_rec *n = s->next;
        free(s);
        s = n;
    }
    free(r->cur);
    free(r->tokens);
    free(r);
}

/* Builds a request (caller's thread); the worker gets it through `incoming`. */
lm_status lm_eng_request_create(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *p,
                                lm_engine_request **out) {
    *out = NULL;
    lm_status st = lm_gen_validate(prompt, n_prompt, p, (size_t)e->n_vocab, e->p.max_kv_size,
                                   "lm_engine_request_start", "a sequence", "max_kv_size");
    if (st) return st;
    int64_t bound = p->max_tokens < 0 ? e->p.max_kv_size : (int64_t)n_prompt + p->max_tokens;
    if (bound > e->p.max_kv_size) bound = e->p.max_kv_size;
    int64_t worst = lm_eng_worst_blocks(e->kv, bound, 0);
    int64_t usable = e->st.kv_blocks - e->n_prefix_blocks;
    if (worst > usable)
        return lm_error(LM_ERR_NO_MEMORY,
                        "the KV budget is too small for this request: it may need %lld tokens (%lld blocks of 16) and "
                        "the pool holds %lld blocks beside the prefix; raise max_kv_bytes or lower max_tokens",
                        (long long)bound, (long long)worst, (long long)usable);
    lm_engine_request *r = calloc(1, sizeof *r);
    if (!r) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    r->e = e;
    r->refs = 2;
    atomic_init(&r->cancel, false);
    r->seq = -1;
    r->bound = bound;
    r->n_prompt = (int64_t)n_prompt;
    r->n_tokens = (int64_t)n_prompt;
    r->n_target = (int64_t)n_prompt;
    r->last_token = -1;
    r->tokens = malloc(sizeof(int32_t) * (size_t)(bound + 1));
    if (!r->tokens) {
        lm_eng_request_destroy(r);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(r->tokens, prompt, sizeof(int32_t) * n_prompt);
    /* processors: the request's own, then the request's factory's, then the engine's */
    if ((st = lm_gen_init(&r->gen, e->model, p, &e->p.processor_factory, prompt, n_prompt))) {
        lm_eng_request_destroy(r);
        return st;
    }
    r->gen.stats.kv_cache_bytes = e->st.kv_bytes;
    r->stats = r->gen.stats;
    *out = r;
    return LM_OK;
}

/* Hands a built request to the worker (or ends it at once for max_tokens 0). */
lm_status lm_eng_request_enqueue(lm_engine *e, lm_engine_request *r) {
    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        lm_eng_request_destroy(r);
        return lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more requests");
    }
    e->refs++;
    e->st.n_requests++;
    e->st.n_prompt_tokens += r->n_prompt;
    if (r->gen.max_tokens == 0) {
        /* nothing to compute: the one step is final */
        step_rec *s = lm_eng_make_step(r, -1, 0.0f, NULL, 0, LM_FINISH_LENGTH, LM_OK);
        r->q_head = r->q_tail = s;
        r->final_queued = true;
        r->refs = 1;
        r->stats.finish = LM_FINISH_LENGTH;
        e->st.n_finished++;
        pthread_mutex_unlock(&e->mu);
        lm_gen_release(&r->gen);
        return LM_OK;
    }
    r->next_in = NULL;
    if (e->incoming_tail)
        e->incoming_tail->next_in = r;
    else
        e->incoming_head = r;
    e->incoming_tail = r;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

lm_status lm_eng_check_usable(lm_engine *e) {
    pthread_mutex_lock(&e->mu);
    lm_status st = lm_eng_wait_loaded_locked(e);
    if (!st && e->closing) st = lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more requests");
    pthread_mutex_unlock(&e->mu);
    return st;
}

lm_status lm_engine_request_start(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                                  lm_engine_request **out) {
    if (!e || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_start: NULL argument");
    *out = NULL;
    lm_status st = lm_eng_check_usable(e);
    if (st) return st;
    lm_generate_params defaults = lm_generate_default_params();
    lm_engine_request *r;
    if ((st = lm_eng_request_create(e, prompt, n_prompt, params ? params : &defaults, &r))) return st;
    if ((st = lm_eng_request_enqueue(e, r))) return st;
    *out = r;
    return LM_OK;
}

lm_status lm_engine_request_start_chat(lm_engine *e, const lm_chat_message *messages, size_t n_messages,
                                       const lm_generate_params *params, lm_engine_request **out) {
    if (!e || !out || (!messages && n_messages))
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_start_chat: NULL argument");
    *out = NULL;
    lm_status st = lm_eng_check_usable(e);
    if (st) return st;
    int32_t *ids;
    size_t n;
    if ((st = lm_eng_render_tokens(e->model, messages, n_messages, true, &ids, &n))) return st;
    st = lm_engine_request_start(e, ids, n, params, out);
    free(ids);
    return st;
}

lm_status lm_engine_request_next(lm_engine_request *r, lm_step *step) {
    if (!r || !step) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_next: NULL argument");
    *step = (lm_step){.token = -1, .text = "", .finish = LM_FINISH_NONE};
    if (r->ended) {
        step->finish = r->end_reason;
        return LM_OK;
    }
    lm_engine *e = r->e;
    free(r->cur);
    r->cur = NULL;
    pthread_mutex_lock(&e->mu);
    while (!r->q_head) pthread_cond_wait(&e->done_cv, &e->mu);
    step_rec *s = r->q_head;
    r->q_head = s->next;
    if (!r->q_head) r->q_tail = NULL;
    char err[ERR_CAP];
    if (s->status) memcpy(err, r->err, ERR_CAP);
    pthread_mutex_unlock(&e->mu);
    r->cur = s;
    step->token = s->token;
    step->text = s->text;
    step->text_len = s->text_len;
    step->logprob = s->logprob;
    step->top_logprobs = s->n_top ? s->top : NULL;
    step->n_top_logprobs = s->n_top;
    step->finish = s->finish;
    if (s->finish != LM_FINISH_NONE) {
        r->ended = true;
        r->end_reason = s->finish;
    }
    if (s->status) return lm_error(s->status, "%s", err);
    return LM_OK;
}

void lm_engine_request_cancel(lm_engine_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&r->e->mu);
    pthread_cond_signal(&r->e->work_cv);
    pthread_mutex_unlock(&r->e->mu);
}

lm_status lm_engine_request_stats(lm_engine_request *r, lm_stats *stats) {
    if (!r || !stats) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_stats: NULL argument");
    pthread_mutex_lock(&r->e->mu);
    *stats = r->stats;
    bool done = r->final_queued;
    pthread_mutex_unlock(&r->e->mu);
    if (!done) stats->total_s = lm_now_s() - r->gen.t_start;
    stats->peak_rss_bytes = lm_peak_rss_bytes();
    lm_stats_update_rates(stats);
    return LM_OK;
}

void lm_engine_request_free(lm_engine_request *r) {
    if (!r) return;
    lm_engine *e = r->e;
    atomic_store(&r->cancel, true);
    bool destroy_e = false;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->work_cv);
    bool destroy_r = lm_eng_request_unref_locked(r);
    if (destroy_r) lm_eng_unref_locked(e, &destroy_e);
    pthread_mutex_unlock(&e->mu);
    if (destroy_r) lm_eng_request_destroy(r);
    if (destroy_e) lm_eng_destroy(e);
}
