/* The engine's public declarations, kept here until they move into include/lumen.h
 * (one section at its end). See src/engine/engine.c for how it works. */
#ifndef LM_ENGINE_ENGINE_H
#define LM_ENGINE_ENGINE_H

#include "lumen.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef LM_ENGINE_API_IN_LUMEN_H
/* ==== the engine ================================================================
 *
 * An engine owns a model, a paged KV cache and a worker thread. Every forward pass
 * runs on the worker, which batches the live requests together (continuous
 * batching: requests join and leave between steps; long prompts are computed in
 * chunks so they do not stall decodes) and reuses every common prefix through a
 * prefix cache (a radix tree over KV blocks with LRU eviction). Outputs do not
 * depend on what else runs: the forward pass is batch-invariant, so a greedy
 * request gives the same tokens alone or among 32 others, cached or not.
 *
 * Every function may be called from any thread, except lm_engine_close (once, by
 * the owner, when no other thread uses the handle any more). */

typedef struct lm_engine lm_engine;
typedef struct lm_future lm_future;
typedef struct lm_engine_request lm_engine_request;

typedef struct lm_engine_params {
    lm_model_params model;            /* backend, threads, kv_type, memory limit; n_ctx
                                         is the default of max_kv_size              default lm_model_default_params() */
    int32_t batch_size;               /* > 0: sequences computed together             default 8 */
    int32_t max_batch_tokens;         /* > 0: tokens per forward step (prefill chunk)  default 256 */
    uint64_t max_kv_bytes;            /* KV pool bytes; 0 = batch_size sequences of    default 0
                                         max_kv_size tokens plus the prefix                    */
    int32_t max_kv_size;              /* >= 0: tokens one sequence may hold (prompt +  default 0
                                         generated); 0 = the model's n_ctx                     */
    uint64_t prefix_cache_bytes;      /* bytes of KV the prefix cache may keep;        default 0
                                         0 = the whole pool                                    */
    const lm_chat_message *prefix_messages; /* computed once at load; every       default none
                                         lm_engine_generate conversation starts with them (copied) */
    size_t n_prefix_messages;
    lm_logits_processor_factory processor_factory; /* builds a processor for every default none
                                         generation of the engine (after the request's own)    */
} lm_engine_params;

lm_engine_params lm_engine_default_params(void);

/* Creates an engine for `model` (a path or a name, as lm_model_load) and returns at
 * once: the model loads on the worker thread. Parameters are checked here
 * (LM_ERR_INVALID_ARG naming the one out of range); load errors come from
 * lm_engine_wait_loaded and from every later call. */
lm_status lm_engine_create(const char *model, const lm_engine_params *params, lm_engine **out);

/* Blocks until the model is loaded (and the prefix messages computed); returns the
 * load error if any, with its sentence. */
lm_status lm_engine_wait_loaded(lm_engine *e);

/* The engine's model (borrowed for the engine's lifetime) once loaded, else NULL.
 * For tokenizing and rendering chat templates on any thread. */
const lm_model *lm_engine_model(lm_engine *e);

/* ---- jobs on the worker thread ---- */

/* A job: runs on the worker thread between steps. `*result` (NULL beforehand) is
 * handed to lm_future_wait. A status other than LM_OK is the future's error (its
 * lm_last_error() sentence travels with it). */
typedef lm_status (*lm_engine_job_fn)(lm_engine *engine, void *arg, void **result);

/* Queues fn(engine, arg, &result) on the worker; *out receives a future (free it
 * with lm_future_free, before or after it completes). Jobs run in submission order.
 * Errors: the load error; LM_ERR_INVALID_ARG after lm_engine_close began. */
lm_status lm_engine_submit(lm_engine *e, lm_engine_job_fn fn, void *arg, lm_future **out);

/* Blocks until the job ran; returns its status (and its sentence) and its result. */
lm_status lm_future_wait(lm_future *f, void **result);
/* Whether the job ran (never blocks). */
bool lm_future_done(lm_future *f);
void lm_future_free(lm_future *f); /* NULL is a no-op; does not cancel the job */

/* ---- streaming requests, from any thread ---- */

/* Starts a generation on the engine (waiting for the load first). Checks like
 * lm_request_start: LM_ERR_INVALID_ARG (empty prompt, bad token, bad parameter),
 * LM_ERR_LIMIT (the prompt leaves no room within max_kv_size), LM_ERR_NO_MEMORY
 * (the KV pool cannot hold this request even alone: prompt plus max_tokens, or
 * max_kv_size when max_tokens is -1). When the pool is busy the request waits for
 * room; it never fails for lack of it. `params` NULL = lm_generate_default_params(). */
lm_status lm_engine_request_start(lm_engine *e, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                                  lm_engine_request **out);

/* Same, with a conversation rendered by the model's chat template (with the
 * assistant's opening) and tokenized. */
lm_status lm_engine_request_start_chat(lm_engine *e, const lm_chat_message *messages, size_t n_messages,
                                       const lm_generate_params *params, lm_engine_request **out);

/* Blocks until the next step (same contract as lm_request_next). */
lm_status lm_engine_request_next(lm_engine_request *r, lm_step *step);
/* Stops the request from any thread; its KV blocks are released at the next step
 * boundary (a waiting request leaves the queue at once). */
void lm_engine_request_cancel(lm_engine_request *r);
lm_status lm_engine_request_stats(lm_engine_request *r, lm_stats *stats);
/* Cancels if running and frees; NULL is a no-op. May outlive lm_engine_close. */
void lm_engine_request_free(lm_engine_request *r);

/* ---- batch generation ---- */

typedef struct lm_conversation {
    const lm_chat_message *messages;
    size_t n_messages;
} lm_conversation;

/* Called on the caller's thread after each chunk of batch_size conversations. */
typedef void (*lm_engine_progress_fn)(size_t n_done, size_t n_total, void *user);

/* lm_generate_default_params() with greedy sampling (temperature 0) and
 * max_tokens 1: the single-token classification case. */
lm_generate_params lm_engine_generate_default_params(void);

/* Generates one answer per conversation. Every conversation must start with the
 * engine's prefix messages (LM_ERR_INVALID_ARG names the first that does not and
 * the message that differs). Conversations run in order of their final message's
 * length, continuously batched batch_size at a time; on_progress (may be NULL)
 * follows each chunk. On success *texts_out holds n NUL-terminated texts in input
 * order (free with lm_engine_texts_free). `params` NULL =
 * lm_engine_generate_default_params(). Not from inside a job (LM_ERR_INVALID_ARG). */
lm_status lm_engine_generate(lm_engine *e, const lm_conversation *conversations, size_t n,
                             const lm_generate_params *params, lm_engine_progress_fn on_progress, void *user,
                             char ***texts_out);
void lm_engine_texts_free(char **texts, size_t n);

/* ---- statistics and shutdown ---- */

/* Counters since creation. Rates and fractions are 0 when nothing was measured. */
typedef struct lm_engine_stats {
    int64_t n_requests;         /* requests started (generate counts each conversation)  */
    int64_t n_finished;         /* requests that ended                                   */
    int64_t n_running;          /* in the batch now                                      */
    int64_t n_waiting;          /* queued for room                                       */
    int64_t n_prefix_tokens;    /* tokens of the prefix messages (computed once)         */
    int64_t n_prompt_tokens;    /* prompt tokens of all requests                         */
    int64_t n_cached_tokens;    /* of those, reused from the prefix cache                */
    int64_t n_prefill_tokens;   /* prompt tokens computed (the prefix's included)         */
    int64_t n_decode_tokens;    /* generated tokens fed back to the model                */
    int64_t n_generated_tokens; /* tokens sampled                                        */
    int64_t n_steps;            /* forward passes                                        */
    double mean_batch_tokens;   /* tokens per forward pass                               */
    double batch_occupancy;     /* mean running sequences per step / batch_size           */
    int64_t cache_lookups, cache_hits, cache_misses, cache_evictions;
    double cache_hit_rate;      /* reused tokens / looked-up tokens                       */
    uint64_t cache_bytes;       /* KV bytes the prefix tree holds                         */
    int64_t kv_blocks, kv_blocks_free;
    uint64_t kv_bytes;          /* the pool                                               */
    int64_t n_jobs;             /* jobs run                                               */
} lm_engine_stats;

lm_status lm_engine_get_stats(lm_engine *e, lm_engine_stats *out);

/* The process's peak resident memory in GiB (getrusage); on a GPU backend the
 * device's peak will be added. `e` may be NULL. */
double lm_engine_peak_memory_gb(const lm_engine *e);

/* Stops the engine: already-queued jobs run, live requests end cancelled, the
 * worker thread exits, the model and the KV cache are freed. Futures and requests
 * still held stay valid until freed. NULL is a no-op. */
void lm_engine_close(lm_engine *e);
#endif

#ifdef __cplusplus
}
#endif
#endif
