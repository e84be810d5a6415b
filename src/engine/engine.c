/* The engine: a worker thread that owns the model, the paged KV cache and the
 * prefix cache, runs jobs, and advances every live request together.
 *
 * Threads. Callers (any thread) only touch the engine under `mu`: they append
 * requests to `incoming`, jobs to the job queue, read step records off a request's
 * queue, and wait on `done_cv`. The worker takes what is new under `mu`, then works
 * without it (forward passes, sampling, detokenizing, the KV and prefix cache are
 * the worker's alone) and publishes each step's results under `mu` again.
 *
 * A step: admit waiting requests while the batch has room and the KV pool can hold
 * their worst case (prompt + max_tokens, less what the prefix cache already holds);
 * put one token of every decoding request in the batch, then fill the rest of the
 * max_batch_tokens budget with prompt chunks (chunked prefill); copy-on-write the
 * shared block each sequence writes into first; one forward pass; sample for every
 * sequence that needed logits. A request that finishes or is cancelled gives its
 * blocks to the prefix cache (and back to the pool) at once.
 *
 * Lifetimes. The engine struct is reference counted: the owner, each live request
 * handle and each future hold one, so a handle used after lm_engine_close still
 * finds its mutex. The model, the KV cache and the worker end in lm_engine_close. */
#include "engine/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "api/api_internal.h"
#include "api/gen_step.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"

#define ERR_CAP 512

typedef struct job {
    struct job *next;
    lm_engine_job_fn fn;
    void *arg;
    lm_future *fut;
} job;

struct lm_future {
    lm_engine *e;
    int refs; /* caller + queue, under e->mu */
    bool done;
    lm_status status;
    void *result;
    char err[ERR_CAP];
};

/* A step as the worker publishes it; the caller owns it once popped. */
typedef struct step_rec {
    struct step_rec *next;
    int32_t token;
    float logprob;
    lm_finish_reason finish;
    lm_status status; /* an error ends the request: err holds the sentence */
    size_t n_top;
    lm_token_logprob top[LM_MAX_TOP_LOGPROBS];
    size_t text_len;
    char text[];
} step_rec;

typedef enum rstate { R_WAITING, R_PREFILL, R_DECODE, R_DONE } rstate;

struct lm_engine_request {
    lm_engine *e;
    int refs; /* caller + worker, under e->mu */
    atomic_bool cancel;
    struct lm_engine_request *next_in; /* incoming list */

    /* set at start, then the worker's (gen.t_start never changes) */
    int32_t *tokens; /* prompt, then the generated tokens fed back */
    int64_t n_prompt, n_tokens, bound; /* bound: most tokens the sequence may hold */
    lm_gen gen;      /* sampling, detokenizing, stop strings, statistics */

    /* the worker's */
    rstate state;
    int32_t seq;
    int64_t n_computed; /* positions with K/V                              */
    int64_t budget, n_new; /* worst-case blocks to take from the pool; taken */
    int32_t last_token;
    int64_t pending;    /* tokens of this request in the current batch      */

    /* published under e->mu */
    step_rec *q_head, *q_tail;
    bool final_queued;
    lm_stats stats;     /* gen.stats as of the last publication */
    char err[ERR_CAP];

    /* the caller's */
    step_rec *cur;
    bool ended;
    lm_finish_reason end_reason;
};

struct lm_engine {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int refs;
    pthread_t thread;
    bool thread_started;

    /* load, under mu */
    bool loaded;
    lm_status load_status;
    char load_err[ERR_CAP];
    bool closing;

    /* the parameters (the prefix messages copied) */
    char *model_path;
    lm_engine_params p;
    lm_chat_message *prefix;
    char **prefix_strings;

    /* under mu */
    job *jobs_head, *jobs_tail;
    lm_engine_request *incoming_head, *incoming_tail;
    lm_engine_stats st;

    /* the worker's (model is read-only for others once loaded) */
    lm_model *model;
    int64_t n_vocab;
    lm_kv_cache *kv;
    lm_prefix_cache *pc;
    int32_t *free_slots;
    int32_t n_free_slots;
    int64_t n_prefix_blocks;
    int32_t *prefix_tokens;
    int64_t n_prefix_tokens;
    lm_engine_request **waiting;
    int64_t n_waiting, cap_waiting;
    lm_engine_request **running;
    int32_t n_running;
    int32_t *b_tok, *b_pos, *b_seq, *match_blocks;
    int8_t *b_want;
    float *logits;
    double occupancy_sum, step_tokens_sum;
};

/* ---- small helpers ---- */

static void set_err(char *dst, const char *msg) {
    snprintf(dst, ERR_CAP, "%s", msg && *msg ? msg : "unknown error");
}

static void engine_unref_locked(lm_engine *e, bool *destroy) {
    *destroy = --e->refs == 0;
}

static void engine_destroy(lm_engine *e) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    free(e->model_path);
    if (e->prefix_strings)
        for (size_t i = 0; i < 2 * e->p.n_prefix_messages; i++) free(e->prefix_strings[i]);
    free(e->prefix_strings);
    free(e->prefix);
    free(e);
}

static void engine_unref(lm_engine *e) {
    bool destroy;
    pthread_mutex_lock(&e->mu);
    engine_unref_locked(e, &destroy);
    pthread_mutex_unlock(&e->mu);
    if (destroy) engine_destroy(e);
}

/* The load error as this thread's error, or LM_OK once loaded. Blocks while loading. */
static lm_status wait_loaded_locked(lm_engine *e) {
    while (!e->loaded) pthread_cond_wait(&e->done_cv, &e->mu);
    if (e->load_status) return lm_error(e->load_status, "%s", e->load_err);
    return LM_OK;
}

/* ---- params ---- */

lm_engine_params lm_engine_default_params(void) {
    lm_engine_params p;
    memset(&p, 0, sizeof p);
    p.model = lm_model_default_params();
    p.batch_size = 8;
    p.max_batch_tokens = 256;
    return p;
}

lm_generate_params lm_engine_generate_default_params(void) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = 1;
    return g;
}

static lm_status validate_params(const lm_engine_params *p) {
    if (p->batch_size <= 0 || p->batch_size > 4096)
        return lm_error(LM_ERR_INVALID_ARG, "engine batch_size = %d: must be in [1, 4096]", p->batch_size);
    if (p->max_batch_tokens <= 0 || p->max_batch_tokens > (1 << 20))
        return lm_error(LM_ERR_INVALID_ARG, "engine max_batch_tokens = %d: must be in [1, %d]", p->max_batch_tokens,
                        1 << 20);
    if (p->max_kv_size < 0) return lm_error(LM_ERR_INVALID_ARG, "engine max_kv_size = %d: must be >= 0", p->max_kv_size);
    if (p->n_prefix_messages && !p->prefix_messages)
        return lm_error(LM_ERR_INVALID_ARG, "prefix_messages is NULL with n_prefix_messages = %zu", p->n_prefix_messages);
    for (size_t i = 0; i < p->n_prefix_messages; i++)
        if (!p->prefix_messages[i].role || !p->prefix_messages[i].content)
            return lm_error(LM_ERR_INVALID_ARG, "prefix message %zu has a NULL role or content", i);
    if (p->processor_factory.release && !p->processor_factory.build)
        return lm_error(LM_ERR_INVALID_ARG, "processor_factory has release but no build");
    return LM_OK;
}

/* ---- rendering and tokenizing (any thread) ---- */

static lm_status render_tokens(const lm_model *m, const lm_chat_message *msgs, size_t n, bool gen_prompt,
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

/* ---- the worker: KV and requests ---- */

static void request_destroy(lm_engine_request *r) {
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

/* Drops a reference under e->mu; *destroy when it was the last. */
static bool request_unref_locked(lm_engine_request *r) { return --r->refs == 0; }

/* A step record with the text of the generation's last step. */
static step_rec *make_step(lm_engine_request *r, int32_t token, float logprob, const lm_token_logprob *top,
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

/* A pending publication: the step, and whether the worker lets go of the request. */
typedef struct pub {
    lm_engine_request *r;
    step_rec *s;
    bool last;
    char err[ERR_CAP];
} pub;

typedef struct pubs {
    pub *a;
    int64_t n, cap;
} pubs;

static void pubs_add(pubs *ps, lm_engine_request *r, step_rec *s, bool last, const char *err) {
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
    if (err) set_err(p->err, err);
}

/* Hands the request's sequence back: its blocks go to the prefix cache (all the
 * positions computed, the partial last block included) and to the pool. */
static void release_seq(lm_engine *e, lm_engine_request *r, bool keep) {
    if (r->seq < 0) return;
    if (keep && r->n_computed > 0)
        lm_prefix_cache_insert(e->pc, r->tokens, r->n_computed, e->kv->seqs[r->seq].blocks, true);
    lm_kv_cache_truncate(e->kv, r->seq, 0);
    lm_prefix_cache_trim(e->pc);
    e->free_slots[e->n_free_slots++] = r->seq;
    r->seq = -1;
}

/* Ends a request on the worker: releases text still held (unless failed), its KV
 * and its sampler, and queues the final step. */
static void finish_request(lm_engine *e, lm_engine_request *r, lm_finish_reason why, lm_status status,
                           const char *err, pubs *ps) {
    lm_gen *g = &r->gen;
    if (!status && (status = lm_gen_end(g, why, &why))) err = lm_last_error();
    if (status) {
        why = LM_FINISH_ERROR;
        g->text_len = 0; /* the previous step's text went out with it */
        g->text[0] = '\0';
    }
    release_seq(e, r, status == LM_OK);
    lm_gen_release(g);
    r->state = R_DONE;
    step_rec *s = make_step(r, -1, 0.0f, NULL, 0, why, status);
    pubs_add(ps, r, s, true, status ? err : NULL);
}

/* Worst-case blocks of a request that reuses `cached` tokens. */
static int64_t worst_blocks(const lm_kv_cache *kv, int64_t bound, int64_t cached) {
    int64_t bs = kv->block_size;
    return (bound + bs - 1) / bs - cached / bs;
}

/* Tries to give the request a sequence: shares the cached prefix, checks the pool
 * can hold the rest at worst. false (nothing changed) when it must wait. */
static bool admit(lm_engine *e, lm_engine_request *r, int64_t outstanding) {
    if (e->n_free_slots == 0) return false;
    int32_t seq = e->free_slots[e->n_free_slots - 1];
    int64_t nb = 0;
    int64_t m = lm_prefix_cache_match(e->pc, r->tokens, r->n_prompt, r->n_prompt - 1, e->match_blocks, &nb);
    if (lm_kv_cache_attach(e->kv, seq, e->match_blocks, nb, m)) return false;
    int64_t need = worst_blocks(e->kv, r->bound, m);
    int64_t avail = e->kv->n_free + lm_prefix_cache_evictable(e->pc) - outstanding;
    if (need > avail) {
        lm_kv_cache_truncate(e->kv, seq, 0);
        return false;
    }
    lm_prefix_cache_record(e->pc, r->n_prompt, m);
    e->n_free_slots--;
    r->seq = seq;
    r->n_computed = m;
    r->budget = need;
    r->n_new = 0;
    r->state = R_PREFILL;
    r->gen.stats.n_cached_tokens = m;
    return true;
}

/* Makes room for positions [n_computed, target) of the request's sequence. */
static lm_status make_room(lm_engine *e, lm_engine_request *r, int64_t target) {
    int64_t need = lm_kv_cache_blocks_needed(e->kv, r->seq, target);
    if (need > e->kv->n_free) lm_prefix_cache_evict(e->pc, need);
    lm_status st = lm_kv_cache_cow(e->kv, r->seq, r->n_computed);
    if (!st) st = lm_kv_cache_reserve(e->kv, r->seq, target);
    if (st) return lm_error_prefix(st, "KV cache");
    r->n_new += need;
    return LM_OK;
}

/* Samples the request's next token from `logits` and publishes the step. */
static void sample_step(lm_engine *e, lm_engine_request *r, const float *logits, pubs *ps) {
    lm_gen *g = &r->gen;
    lm_finish_reason why;
    lm_status st = lm_gen_sample(g, logits, r->n_computed >= r->bound, &why);
    if (st) {
        finish_request(e, r, LM_FINISH_ERROR, st, lm_last_error(), ps);
        return;
    }
    r->last_token = g->token;
    bool last = why != LM_FINISH_NONE;
    if (last) {
        release_seq(e, r, true);
        lm_gen_release(g);
        r->state = R_DONE;
    } else {
        r->state = R_DECODE;
    }
    step_rec *s = make_step(r, g->token, g->logprob, g->top, g->n_top_out, why, LM_OK);
    pubs_add(ps, r, s, last, NULL);
}

static void remove_running(lm_engine *e, int32_t i) {
    memmove(e->running + i, e->running + i + 1, sizeof *e->running * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

/* The worker's counters into the published statistics (under mu). */
static void update_stats_locked(lm_engine *e) {
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
}

/* Publishes steps and lets go of finished requests (under mu). */
static void publish(lm_engine *e, pubs *ps) {
    if (ps->n == 0) return;
    pthread_mutex_lock(&e->mu);
    update_stats_locked(e);
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
            p->last = request_unref_locked(r); /* now: whether to destroy it */
        }
    }
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    for (int64_t i = 0; i < ps->n; i++)
        if (ps->a[i].last) {
            request_destroy(ps->a[i].r);
            engine_unref(e);
        }
    ps->n = 0;
}

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

static lm_status load(lm_engine *e) {
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
        if ((st = render_tokens(m, e->prefix, e->p.n_prefix_messages, false, &e->prefix_tokens, &n)))
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
    e->logits = malloc(sizeof(float) * (size_t)e->n_vocab * (size_t)(e->p.batch_size + 1));
    if (!e->free_slots || !e->running || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->match_blocks ||
        !e->logits)
        return lm_error(LM_ERR_NO_MEMORY, "out of memory for the engine's buffers");
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
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

static void run_job(lm_engine *e, job *j, lm_status load_st) {
    void *result = NULL;
    lm_clear_error();
    lm_status st = load_st ? lm_error(load_st, "%s", e->load_err) : j->fn(e, j->arg, &result);
    lm_future *f = j->fut;
    bool destroy_f, destroy_e = false;
    pthread_mutex_lock(&e->mu);
    f->done = true;
    f->status = st;
    f->result = result;
    if (st) set_err(f->err, lm_last_error());
    e->st.n_jobs++;
    destroy_f = --f->refs == 0;
    if (destroy_f) engine_unref_locked(e, &destroy_e);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    if (destroy_f) free(f);
    free(j);
    (void)destroy_e; /* the owner's reference is held while the worker runs */
}

/* One scheduler step over the running requests. */
static void step(lm_engine *e, pubs *ps) {
    int64_t n = 0, n_out = 0;
    int32_t n_decode = 0;
    lm_engine_request *with_logits[4096];
    int64_t budget = e->p.max_batch_tokens;
    /* decodes first: one token each */
    for (int32_t i = 0; i < e->n_running; i++) {
        lm_engine_request *r = e->running[i];
        if (r->state != R_DECODE) continue;
        if (make_room(e, r, r->n_computed + 1)) {
            finish_request(e, r, LM_FINISH_ERROR, LM_ERR_NO_MEMORY, lm_last_error(), ps);
            continue;
        }
        e->b_tok[n] = r->last_token;
        e->b_pos[n] = (int32_t)r->n_computed;
        e->b_seq[n] = r->seq;
        e->b_want[n] = 1;
        r->tokens[r->n_tokens++] = r->last_token;
        r->pending = 1;
        n++;
        with_logits[n_out++] = r;
        n_decode++;
    }
    budget = budget > n_decode ? budget - n_decode : 0;
    if (n_decode == 0 && budget == 0) budget = 1;
    /* then prompt chunks, oldest first */
    for (int32_t i = 0; i < e->n_running && budget > 0; i++) {
        lm_engine_request *r = e->running[i];
        if (r->state != R_PREFILL) continue;
        int64_t k = r->n_prompt - r->n_computed;
        if (k > budget) k = budget;
        if (make_room(e, r, r->n_computed + k)) {
            finish_request(e, r, LM_FINISH_ERROR, LM_ERR_NO_MEMORY, lm_last_error(), ps);
            continue;
        }
        for (int64_t j = 0; j < k; j++) {
            e->b_tok[n] = r->tokens[r->n_computed + j];
            e->b_pos[n] = (int32_t)(r->n_computed + j);
            e->b_seq[n] = r->seq;
            e->b_want[n] = 0;
            n++;
        }
        budget -= k;
        r->pending = k;
        if (r->n_computed + k == r->n_prompt) {
            e->b_want[n - 1] = 1;
            with_logits[n_out++] = r;
        }
    }
    /* requests that failed above are done: drop them from the batch list */
    if (n == 0) return;
    lm_batch batch = {n, e->b_tok, e->b_pos, e->b_seq, e->b_want};
    double t0 = lm_now_s();
    pthread_mutex_lock(&e->model->forward_lock);
    lm_status st = lm_forward(e->model->m, e->kv, &batch, e->logits);
    pthread_mutex_unlock(&e->model->forward_lock);
    double dt = lm_now_s() - t0;
    int64_t n_prefill = n - n_decode;
    if (st) {
        char msg[ERR_CAP];
        set_err(msg, lm_last_error());
        for (int32_t i = 0; i < e->n_running; i++) {
            lm_engine_request *r = e->running[i];
            r->pending = 0;
            if (r->state == R_PREFILL || r->state == R_DECODE)
                finish_request(e, r, LM_FINISH_ERROR, st, msg, ps);
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
        sample_step(e, r, e->logits + (size_t)i * (size_t)e->n_vocab, ps);
    }
    pthread_mutex_lock(&e->mu);
    e->st.n_steps++;
    e->st.n_prefill_tokens += n_prefill;
    e->st.n_decode_tokens += n_decode;
    e->st.n_generated_tokens += n_out;
    e->step_tokens_sum += (double)n;
    e->occupancy_sum += (double)e->n_running / (double)e->p.batch_size;
    pthread_mutex_unlock(&e->mu);
}

static void *worker(void *arg) {
    lm_engine *e = arg;
    lm_status st = load(e);
    pthread_mutex_lock(&e->mu);
    e->loaded = true;
    e->load_status = st;
    if (st) set_err(e->load_err, lm_last_error());
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);

    pubs ps = {0};
    for (;;) {
        pthread_mutex_lock(&e->mu);
        /* new requests join the queue */
        while (e->incoming_head) {
            lm_engine_request *r = e->incoming_head;
            e->incoming_head = r->next_in;
            if (e->n_waiting == e->cap_waiting) {
                int64_t cap = e->cap_waiting ? e->cap_waiting * 2 : 64;
                lm_engine_request **nw = realloc(e->waiting, sizeof *nw * (size_t)cap);
                if (!nw) {
                    e->incoming_head = r; /* try again next round */
                    break;
                }
                e->waiting = nw;
                e->cap_waiting = cap;
            }
            e->waiting[e->n_waiting++] = r;
        }
        if (!e->incoming_head) e->incoming_tail = NULL;
        job *j = e->jobs_head;
        if (j) {
            e->jobs_head = j->next;
            if (!e->jobs_head) e->jobs_tail = NULL;
        }
        bool closing = e->closing;
        bool idle = !j && e->n_running == 0 && (e->n_waiting == 0 || st) && !closing;
        if (idle) {
            pthread_cond_wait(&e->work_cv, &e->mu);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);

        if (j) {
            run_job(e, j, st);
            continue; /* jobs first: close lets the queue drain */
        }
        /* cancellations (and, when closing, everything) end now, freeing blocks */
        for (int64_t i = 0; i < e->n_waiting;) {
            lm_engine_request *r = e->waiting[i];
            if (closing || st || atomic_load(&r->cancel)) {
                finish_request(e, r, st ? LM_FINISH_ERROR : LM_FINISH_CANCELLED, st, st ? e->load_err : NULL, &ps);
                memmove(e->waiting + i, e->waiting + i + 1, sizeof *e->waiting * (size_t)(e->n_waiting - i - 1));
                e->n_waiting--;
            } else {
                i++;
            }
        }
        for (int32_t i = 0; i < e->n_running; i++) {
            lm_engine_request *r = e->running[i];
            if (closing || atomic_load(&r->cancel)) finish_request(e, r, LM_FINISH_CANCELLED, LM_OK, NULL, &ps);
        }
        for (int32_t i = 0; i < e->n_running;)
            if (e->running[i]->state == R_DONE)
                remove_running(e, i);
            else
                i++;
        if (closing) {
            publish(e, &ps);
            pthread_mutex_lock(&e->mu);
            bool more = e->jobs_head || e->incoming_head;
            pthread_mutex_unlock(&e->mu);
            if (!more) break;
            continue;
        }
        /* admission, in arrival order */
        if (!st) {
            int64_t outstanding = 0;
            for (int32_t i = 0; i < e->n_running; i++) outstanding += e->running[i]->budget - e->running[i]->n_new;
            while (e->n_waiting > 0 && e->n_running < e->p.batch_size) {
                lm_engine_request *r = e->waiting[0];
                if (!admit(e, r, outstanding)) break;
                outstanding += r->budget;
                e->running[e->n_running++] = r;
                memmove(e->waiting, e->waiting + 1, sizeof *e->waiting * (size_t)(e->n_waiting - 1));
                e->n_waiting--;
            }
            if (e->n_running > 0) step(e, &ps);
            for (int32_t i = 0; i < e->n_running;)
                if (e->running[i]->state == R_DONE)
                    remove_running(e, i);
                else
                    i++;
        }
        publish(e, &ps);
        pthread_mutex_lock(&e->mu);
        update_stats_locked(e);
        pthread_mutex_unlock(&e->mu);
    }
    free(ps.a);
    /* everything ended: free the model and the caches */
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
    free(e->logits);
    free(e->prefix_tokens);
    return NULL;
}

/* ---- the public functions ---- */

lm_status lm_engine_create(const char *model, const lm_engine_params *params, lm_engine **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_create: out is NULL");
    *out = NULL;
    if (!model || !*model) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_create: no model given");
    lm_engine_params p = params ? *params : lm_engine_default_params();
    lm_status st = validate_params(&p);
    if (st) return st;
    lm_engine *e = calloc(1, sizeof *e);
    if (!e) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    e->p = p;
    e->refs = 1;
    e->model_path = strdup(model);
    size_t np = p.n_prefix_messages;
    if (np) {
        e->prefix = calloc(np, sizeof *e->prefix);
        e->prefix_strings = calloc(2 * np, sizeof *e->prefix_strings);
        bool ok = e->prefix && e->prefix_strings;
        for (size_t i = 0; ok && i < np; i++) {
            e->prefix_strings[2 * i] = strdup(p.prefix_messages[i].role);
            e->prefix_strings[2 * i + 1] = strdup(p.prefix_messages[i].content);
            ok = e->prefix_strings[2 * i] && e->prefix_strings[2 * i + 1];
            if (ok) e->prefix[i] = (lm_chat_message){e->prefix_strings[2 * i], e->prefix_strings[2 * i + 1]};
        }
        if (!ok) {
            e->p.n_prefix_messages = np;
            pthread_mutex_init(&e->mu, NULL);
            pthread_cond_init(&e->work_cv, NULL);
            pthread_cond_init(&e->done_cv, NULL);
            engine_destroy(e);
            return lm_error(LM_ERR_NO_MEMORY, "out of memory");
        }
    }
    e->p.prefix_messages = e->prefix;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    if (!e->model_path || pthread_create(&e->thread, NULL, worker, e) != 0) {
        engine_destroy(e);
        return lm_error(LM_ERR_NO_MEMORY, "could not start the engine's worker thread");
    }
    e->thread_started = true;
    *out = e;
    return LM_OK;
}

lm_status lm_engine_wait_loaded(lm_engine *e) {
    if (!e) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_wait_loaded: engine is NULL");
    pthread_mutex_lock(&e->mu);
    lm_status st = wait_loaded_locked(e);
    pthread_mutex_unlock(&e->mu);
    return st;
}

const lm_model *lm_engine_model(lm_engine *e) {
    if (!e) return NULL;
    pthread_mutex_lock(&e->mu);
    const lm_model *m = e->loaded && !e->load_status ? e->model : NULL;
    pthread_mutex_unlock(&e->mu);
    return m;
}

lm_status lm_engine_submit(lm_engine *e, lm_engine_job_fn fn, void *arg, lm_future **out) {
    if (!e || !fn || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_submit: NULL argument");
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    lm_future *f = calloc(1, sizeof *f);
    if (!j || !f) {
        free(j);
        free(f);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    lm_status st = LM_OK;
    if (e->loaded && e->load_status)
        st = lm_error(e->load_status, "%s", e->load_err);
    else if (e->closing)
        st = lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more jobs");
    if (st) {
        pthread_mutex_unlock(&e->mu);
        free(j);
        free(f);
        return st;
    }
    f->e = e;
    f->refs = 2;
    e->refs++;
    j->fn = fn;
    j->arg = arg;
    j->fut = f;
    if (e->jobs_tail)
        e->jobs_tail->next = j;
    else
        e->jobs_head = j;
    e->jobs_tail = j;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    *out = f;
    return LM_OK;
}

lm_status lm_future_wait(lm_future *f, void **result) {
    if (!f) return lm_error(LM_ERR_INVALID_ARG, "lm_future_wait: future is NULL");
    lm_engine *e = f->e;
    pthread_mutex_lock(&e->mu);
    while (!f->done) pthread_cond_wait(&e->done_cv, &e->mu);
    lm_status st = f->status;
    if (result) *result = f->result;
    char err[ERR_CAP];
    memcpy(err, f->err, ERR_CAP);
    pthread_mutex_unlock(&e->mu);
    if (st) return lm_error(st, "%s", err);
    return LM_OK;
}

bool lm_future_done(lm_future *f) {
    if (!f) return false;
    pthread_mutex_lock(&f->e->mu);
    bool d = f->done;
    pthread_mutex_unlock(&f->e->mu);
    return d;
}

void lm_future_free(lm_future *f) {
    if (!f) return;
    lm_engine *e = f->e;
    bool destroy_e = false;
    pthread_mutex_lock(&e->mu);
    bool destroy_f = --f->refs == 0;
    if (destroy_f) engine_unref_locked(e, &destroy_e);
    pthread_mutex_unlock(&e->mu);
    if (destroy_f) free(f);
    if (destroy_e) engine_destroy(e);
}

/* ---- requests ---- */

/* Builds a request (caller's thread); the worker gets it through `incoming`. */
static lm_status request_create(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *p,
                                lm_engine_request **out) {
    *out = NULL;
    lm_status st = lm_gen_validate(prompt, n_prompt, p, (size_t)e->n_vocab, e->p.max_kv_size,
                                   "lm_engine_request_start", "a sequence", "max_kv_size");
    if (st) return st;
    int64_t bound = p->max_tokens < 0 ? e->p.max_kv_size : (int64_t)n_prompt + p->max_tokens;
    if (bound > e->p.max_kv_size) bound = e->p.max_kv_size;
    int64_t worst = worst_blocks(e->kv, bound, 0);
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
    r->last_token = -1;
    r->tokens = malloc(sizeof(int32_t) * (size_t)(bound + 1));
    if (!r->tokens) {
        request_destroy(r);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(r->tokens, prompt, sizeof(int32_t) * n_prompt);
    /* processors: the request's own, then the request's factory's, then the engine's */
    if ((st = lm_gen_init(&r->gen, e->model, p, &e->p.processor_factory, prompt, n_prompt))) {
        request_destroy(r);
        return st;
    }
    r->gen.stats.kv_cache_bytes = e->st.kv_bytes;
    r->stats = r->gen.stats;
    *out = r;
    return LM_OK;
}

/* Hands a built request to the worker (or ends it at once for max_tokens 0). */
static lm_status request_enqueue(lm_engine *e, lm_engine_request *r) {
    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        request_destroy(r);
        return lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more requests");
    }
    e->refs++;
    e->st.n_requests++;
    e->st.n_prompt_tokens += r->n_prompt;
    if (r->gen.max_tokens == 0) {
        /* nothing to compute: the one step is final */
        step_rec *s = make_step(r, -1, 0.0f, NULL, 0, LM_FINISH_LENGTH, LM_OK);
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

static lm_status check_usable(lm_engine *e) {
    pthread_mutex_lock(&e->mu);
    lm_status st = wait_loaded_locked(e);
    if (!st && e->closing) st = lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more requests");
    pthread_mutex_unlock(&e->mu);
    return st;
}

lm_status lm_engine_request_start(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                                  lm_engine_request **out) {
    if (!e || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_start: NULL argument");
    *out = NULL;
    lm_status st = check_usable(e);
    if (st) return st;
    lm_generate_params defaults = lm_generate_default_params();
    lm_engine_request *r;
    if ((st = request_create(e, prompt, n_prompt, params ? params : &defaults, &r))) return st;
    if ((st = request_enqueue(e, r))) return st;
    *out = r;
    return LM_OK;
}

lm_status lm_engine_request_start_chat(lm_engine *e, const lm_chat_message *messages, size_t n_messages,
                                       const lm_generate_params *params, lm_engine_request **out) {
    if (!e || !out || (!messages && n_messages))
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_request_start_chat: NULL argument");
    *out = NULL;
    lm_status st = check_usable(e);
    if (st) return st;
    int32_t *ids;
    size_t n;
    if ((st = render_tokens(e->model, messages, n_messages, true, &ids, &n))) return st;
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
    bool destroy_r = request_unref_locked(r);
    if (destroy_r) engine_unref_locked(e, &destroy_e);
    pthread_mutex_unlock(&e->mu);
    if (destroy_r) request_destroy(r);
    if (destroy_e) engine_destroy(e);
}

/* ---- batch generation ---- */

static bool same_message(const lm_chat_message *a, const lm_chat_message *b) {
    return a->role && a->content && strcmp(a->role, b->role) == 0 && strcmp(a->content, b->content) == 0;
}

typedef struct order {
    size_t index, len;
} order;

static int order_cmp(const void *a, const void *b) {
    const order *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

void lm_engine_texts_free(char **texts, size_t n) {
    if (!texts) return;
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
}

lm_status lm_engine_generate(lm_engine *e, const lm_conversation *convs, size_t n, const lm_generate_params *params,
                             lm_engine_progress_fn on_progress, void *user, char ***texts_out) {
    if (!e || !texts_out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate: NULL argument");
    *texts_out = NULL;
    lm_status st = check_usable(e);
    if (st) return st;
    if (pthread_equal(pthread_self(), e->thread))
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate cannot run inside a job (it waits for the worker)");
    if (n == 0 || !convs)
        return lm_error(LM_ERR_INVALID_ARG, "lm_engine_generate: the list of conversations is empty");
    size_t np = e->p.n_prefix_messages;
    for (size_t i = 0; i < n; i++) {
        const lm_conversation *c = &convs[i];
        if (!c->messages || c->n_messages == 0)
            return lm_error(LM_ERR_INVALID_ARG, "conversation %zu has no messages", i);
        for (size_t k = 0; k < c->n_messages; k++)
            if (!c->messages[k].role || !c->messages[k].content)
                return lm_error(LM_ERR_INVALID_ARG, "conversation %zu: message %zu has a NULL role or content", i, k);
        if (c->n_messages < np)
            return lm_error(LM_ERR_INVALID_ARG,
                            "conversation %zu does not start with the engine's %zu prefix messages: it has only %zu "
                            "messages",
                            i, np, c->n_messages);
        for (size_t k = 0; k < np; k++)
            if (!same_message(&c->messages[k], &e->prefix[k]))
                return lm_error(LM_ERR_INVALID_ARG,
                                "conversation %zu does not start with the engine's prefix messages: its message %zu "
                                "(role \"%s\") differs from prefix message %zu (role \"%s\")",
                                i, k, c->messages[k].role, k, e->prefix[k].role);
    }
    lm_generate_params defaults = lm_engine_generate_default_params();
    const lm_generate_params *gp = params ? params : &defaults;
    order *ord = malloc(sizeof *ord * n);
    lm_engine_request **reqs = calloc(n, sizeof *reqs);
    char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens), *caps = calloc(n, sizeof *caps);
    if (!ord || !reqs || !texts || !lens || !caps) {
        st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const lm_conversation *c = &convs[i];
        ord[i] = (order){i, strlen(c->messages[c->n_messages - 1].content)};
    }
    qsort(ord, n, sizeof *ord, order_cmp);
    /* every request joins the queue at once, shortest final message first; the
     * worker admits batch_size at a time and refills the batch as they finish */
    for (size_t k = 0; k < n && !st; k++) {
        size_t i = ord[k].index;
        int32_t *ids;
        size_t nt;
        st = render_tokens(e->model, convs[i].messages, convs[i].n_messages, true, &ids, &nt);
        if (st) {
            st = lm_error_prefix(st, "conversation %zu", i);
            break;
        }
        lm_engine_request *r;
        st = request_create(e, ids, nt, gp, &r);
        free(ids);
        if (!st) st = request_enqueue(e, r);
        if (st) {
            st = lm_error_prefix(st, "conversation %zu", i);
            break;
        }
        reqs[i] = r;
    }
    size_t chunk = (size_t)e->p.batch_size, done = 0;
    for (size_t k = 0; k < n && !st; k++) {
        size_t i = ord[k].index;
        lm_step s;
        do {
            st = lm_engine_request_next(reqs[i], &s);
            if (st) {
                st = lm_error_prefix(st, "conversation %zu", i);
                break;
            }
            if (lens[i] + s.text_len + 1 > caps[i]) {
                size_t cap = caps[i] ? caps[i] : 64;
                while (cap < lens[i] + s.text_len + 1) cap *= 2;
                char *t = realloc(texts[i], cap);
                if (!t) {
                    st = lm_error(LM_ERR_NO_MEMORY, "out of memory for generated text");
                    break;
                }
                texts[i] = t;
                caps[i] = cap;
            }
            memcpy(texts[i] + lens[i], s.text, s.text_len);
            lens[i] += s.text_len;
            texts[i][lens[i]] = '\0';
        } while (s.finish == LM_FINISH_NONE);
        done++;
        if (!st && on_progress && (done % chunk == 0 || done == n)) on_progress(done, n, user);
    }
out:
    if (reqs)
        for (size_t i = 0; i < n; i++) lm_engine_request_free(reqs[i]);
    if (st) {
        lm_engine_texts_free(texts, n);
    } else {
        *texts_out = texts;
    }
    free(ord);
    free(reqs);
    free(lens);
    free(caps);
    return st;
}

/* ---- statistics, memory, shutdown ---- */

lm_status lm_engine_get_stats(lm_engine *e, lm_engine_stats *out) {
    if (!e || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_get_stats: NULL argument");
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    double steps = (double)e->st.n_steps;
    out->mean_batch_tokens = steps > 0 ? e->step_tokens_sum / steps : 0.0;
    out->batch_occupancy = steps > 0 ? e->occupancy_sum / steps : 0.0;
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

double lm_engine_peak_memory_gb(const lm_engine *e) {
    (void)e;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_maxrss * 1024.0 / (1024.0 * 1024.0 * 1024.0); /* ru_maxrss is in KiB on Linux */
}

void lm_engine_close(lm_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->closing = true;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    engine_unref(e);
}
