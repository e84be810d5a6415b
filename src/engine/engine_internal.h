/* The engine's internals, shared by its files (the public API is include/lumen.h,
 * section "the engine"):
 *
 *   engine.c            parameters, create, wait for the load, statistics, close
 *   engine_load.c       loading on the worker: model, KV pool, prefix messages
 *   engine_worker.c     the worker thread's loop: intake, jobs, cancellations
 *   engine_scheduler.c  admission, KV room, building and running one batch step
 *   engine_output.c     each request's steps: sampling, ending, publishing
 *   engine_jobs.c       jobs and futures
 *   engine_requests.c   streaming requests (the caller's side)
 *   engine_generate.c   lm_engine_generate over conversations
 *
 * Threads. Callers (any thread) only touch the engine under `mu`: they append
 * requests to `incoming`, jobs to the job queue, read step records off a request's
 * queue, and wait on `done_cv`. The worker takes what is new under `mu`, then works
 * without it (forward passes, sampling, detokenizing, the KV and prefix cache are
 * the worker's alone) and publishes each step's results under `mu` again.
 *
 * A step: admit waiting requests, oldest first, while the batch has room and the KV
 * pool can hold their prompt and first token (less what the prefix cache already
 * holds) beside what the running requests need next; plan one token of every
 * decoding request, then prompt chunks up to max_batch_tokens (chunked prefill);
 * give each running request, oldest first, the blocks its tokens need, evicting
 * unshared prefix-cache blocks, and when none are left preempting the most recently
 * admitted request (its blocks go to the prefix cache, it goes back to the front of
 * the queue and later recomputes its prompt and the tokens it generated; its
 * sampler keeps its state, so the output is unchanged); copy-on-write the shared
 * block each sequence writes into first; one forward pass; sample for every
 * sequence that needed logits. A request that finishes or is cancelled gives its
 * blocks to the prefix cache (and back to the pool) at once.
 *
 * Lifetimes. The engine struct is reference counted: the owner, each live request
 * handle and each future hold one, so a handle used after lm_engine_close still
 * finds its mutex. The model, the KV cache and the worker end in lm_engine_close. */
#ifndef LM_ENGINE_ENGINE_INTERNAL_H
#define LM_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "api/api_internal.h"
#include "api/gen_step.h"
#include "engine/engine.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"

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
    int64_t n_target; /* tokens to compute before sampling: the prompt, or after a
                         preemption every token so far (the last sampled included) */
    lm_gen gen;      /* sampling, detokenizing, stop strings, statistics */

    /* the worker's */
    rstate state;
    int32_t seq;
    int64_t n_computed; /* positions with K/V                              */
    int32_t n_preempted; /* times its blocks were taken back               */
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
    /* the candidate path (sampling.h): when every sequence of a step can be sampled
     * from its row's topk_k best logits, only those come back (page-locked like
     * `logits`); topk_k 0: off (LUMEN_LOGITS_TOPK=0) */
    int topk_k;
    int step_k;         /* the last candidate pass's candidates a row: 1 when every row was greedy */
    int32_t *cand_ids;  /* [batch_size + 1][topk_k] */
    float *cand_vals;   /* [batch_size + 1][topk_k] */
    float *cand_max;    /* [batch_size + 1]         */
    int8_t *cand_full;  /* [batch_size + 1] rows whose full logits came back instead */
    int64_t n_cand_steps, n_cand_rows_full; /* steps that took candidates, rows fetched whole (under mu; tests) */
    int64_t n_preemptions;
    double occupancy_sum, step_tokens_sum;

    /* the backend's peak device memory, sampled by the worker, read by any thread */
    _Atomic uint64_t device_peak;
};

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

/* ---- engine.c ---- */

/* Copies a sentence into an ERR_CAP buffer ("unknown error" if empty). */
void lm_eng_set_err(char *dst, const char *msg);
/* Drops a reference under e->mu; *destroy when it was the last. */
void lm_eng_unref_locked(lm_engine *e, bool *destroy);
/* Drops a reference (takes e->mu) and frees the engine after the last. */
void lm_eng_unref(lm_engine *e);
void lm_eng_destroy(lm_engine *e);
/* The load error as this thread's error, or LM_OK once loaded. Blocks while loading. */
lm_status lm_eng_wait_loaded_locked(lm_engine *e);

/* ---- engine_load.c (the worker) ---- */

lm_status lm_eng_load(lm_engine *e);
/* Frees what lm_eng_load made, when the worker ends. */
void lm_eng_unload(lm_engine *e);

/* ---- engine_worker.c ---- */

/* The worker thread: loads, then runs jobs and steps until closed. */
void *lm_eng_worker(void *arg);

/* ---- engine_scheduler.c (the worker) ---- */

/* Blocks a request that may hold `bound` tokens takes at most, reusing `cached`. */
int64_t lm_eng_worst_blocks(const lm_kv_cache *kv, int64_t bound, int64_t cached);
/* Hands the request's sequence back: its blocks go to the prefix cache (if `keep`)
 * and to the pool. */
void lm_eng_release_seq(lm_engine *e, lm_engine_request *r, bool keep);
/* Drops requests that ended from the running list. */
void lm_eng_drop_done(lm_engine *e);
/* Admits waiting requests while there is room, then runs one step of the batch. */
void lm_eng_schedule(lm_engine *e, pubs *ps);

/* ---- engine_output.c (the worker) ---- */

/* A step record with the text of the generation's last step. */
step_rec *lm_eng_make_step(lm_engine_request *r, int32_t token, float logprob, const lm_token_logprob *top,
                           size_t n_top, lm_finish_reason finish, lm_status status);
void lm_eng_pubs_add(pubs *ps, lm_engine_request *r, step_rec *s, bool last, const char *err);
/* Ends a request: releases text still held (unless failed), its KV and its sampler,
 * and queues the final step. */
void lm_eng_finish_request(lm_engine *e, lm_engine_request *r, lm_finish_reason why, lm_status status,
                           const char *err, pubs *ps);
/* Samples the request's next token from `logits` (its row's full logits) or, when
 * `cand` is not NULL, from its row's candidates, and queues the step. */
void lm_eng_sample_step(lm_engine *e, lm_engine_request *r, const float *logits, const lm_candidates *cand,
                        pubs *ps);
/* The worker's counters into the published statistics (under mu). */
void lm_eng_update_stats_locked(lm_engine *e);
/* Publishes the queued steps and lets go of finished requests (takes mu). */
void lm_eng_publish(lm_engine *e, pubs *ps);

/* ---- engine_jobs.c ---- */

/* Runs a job on the worker (or fails it with the load error) and completes its future. */
void lm_eng_run_job(lm_engine *e, job *j, lm_status load_st);

/* ---- engine_requests.c ---- */

/* Renders a conversation with the model's chat template and tokenizes it. */
lm_status lm_eng_render_tokens(const lm_model *m, const lm_chat_message *msgs, size_t n, bool gen_prompt,
                               int32_t **out, size_t *n_out);
/* LM_OK once loaded and not closing; else the load error or LM_ERR_INVALID_ARG. */
lm_status lm_eng_check_usable(lm_engine *e);
/* Builds a request (the caller's thread); lm_eng_request_enqueue hands it over. */
lm_status lm_eng_request_create(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *p,
                                lm_engine_request **out);
lm_status lm_eng_request_enqueue(lm_engine *e, lm_engine_request *r);
void lm_eng_request_destroy(lm_engine_request *r);
/* Drops a reference under e->mu; true when it was the last. */
static inline bool lm_eng_request_unref_locked(lm_engine_request *r) { return --r->refs == 0; }

#endif
