/*
 * lumen.h — the one public header of liblumen, a local LLM inference engine.
 *
 * Conventions (they hold for every function below):
 *   - Handles are opaque. `lm_*_free(NULL)` is a no-op.
 *   - Every call that can fail returns an `lm_status` (0 = ok, negative = error) and
 *     leaves a human sentence naming what was wrong in `lm_last_error()` (per thread).
 *   - The library never prints to stdout, never exits and never aborts on bad input.
 *   - Buffers follow "returns the needed size": pass a buffer and its capacity; the
 *     call returns how much it needed, so a too-small buffer can be retried.
 */
#ifndef LUMEN_H
#define LUMEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUMEN_VERSION_MAJOR 0
#define LUMEN_VERSION_MINOR 1
#define LUMEN_VERSION_PATCH 0

/* ---- status codes ------------------------------------------------------------ */

typedef enum lm_status {
    LM_OK                 =  0,
    LM_ERR_INVALID_ARG    = -1,  /* a parameter is out of range or NULL where not allowed */
    LM_ERR_NO_MEMORY      = -2,  /* an allocation failed or a memory limit was reached     */
    LM_ERR_IO             = -3,  /* a file could not be opened, read, written or mapped    */
    LM_ERR_FORMAT         = -4,  /* a file is malformed: bad magic, truncated, out of range */
    LM_ERR_UNSUPPORTED    = -5,  /* well-formed but not supported: architecture, type, ... */
    LM_ERR_NOT_FOUND      = -6,  /* a named thing (tensor, key, model) does not exist      */
    LM_ERR_LIMIT          = -7,  /* a size or count exceeds a documented limit             */
    LM_ERR_INTERNAL       = -8,  /* a bug in lumen; please report it with lm_last_error() */
} lm_status;

/* A constant English name of a status ("invalid argument", ...). Never NULL. */
const char *lm_status_str(lm_status status);

/* The sentence describing the last error on the calling thread; "" if none.
 * The pointer stays valid until the next lumen call on this thread. */
const char *lm_last_error(void);

/* "0.1.0" */
const char *lm_version(void);

/* ---- logging ----------------------------------------------------------------- */

typedef enum lm_log_level { LM_LOG_DEBUG, LM_LOG_INFO, LM_LOG_WARN, LM_LOG_ERROR } lm_log_level;
typedef void (*lm_log_fn)(lm_log_level level, const char *message, void *user_data);

/* Route library log lines to `fn` (NULL silences them; the default writes WARN and
 * ERROR to stderr). Not thread-safe against concurrent logging: call it at start-up. */
void lm_set_log_callback(lm_log_fn fn, void *user_data);


/* ==== models ====================================================================
 *
 * An lm_model holds the weights, the tokenizer and the chat template of one model.
 * It is immutable once loaded and may be shared by any number of threads: every
 * function taking a `const lm_model *` may run concurrently with any other. Forward
 * passes of different contexts of one model are serialized inside the model (one at
 * a time, in this version). */

typedef struct lm_model lm_model;

/* How keys and values are stored in a context's KV cache. */
typedef enum lm_kv_type {
    LM_KV_DEFAULT = -1, /* context params: the model's; model params: F16         */
    LM_KV_F16 = 0, /* half the memory and bandwidth; what llama.cpp uses (default) */
    LM_KV_F32 = 1, /* exact keys and values (reference comparisons)               */
} lm_kv_type;

typedef struct lm_model_params {
    const char *backend;   /* "cpu" or "cuda" (GPU 0); "cuda" is                 default "cpu"
                              LM_ERR_UNSUPPORTED, naming what is missing, in a
                              build without CUDA or where there is no GPU;
                              NULL or "" mean "cpu"                                           */
    int32_t n_threads;     /* >= 0; 0 = the number of online CPUs                default 0   */
    int32_t n_ctx;         /* >= 0; the context length (tokens) of contexts made default 0
                              from this model; 0 = the model's trained length,
                              capped at LM_DEFAULT_N_CTX                                      */
    uint64_t memory_limit; /* bytes the model may use: weights plus the KV caches default 0
                              of its live contexts; 0 = no limit. Checked at
                              load (weights + one context of n_ctx) and at every
                              lm_context_create: LM_ERR_NO_MEMORY beyond it                   */
    lm_kv_type kv_type;    /* KV cache storage of its contexts                   default F16 */
} lm_model_params;

#define LM_DEFAULT_N_CTX 4096
#define LM_MAX_THREADS 1024

lm_model_params lm_model_default_params(void);

/* Loads a model. `model` is a GGUF file, a Hugging Face folder (config.json +
 * *.safetensors + tokenizer files), a repo id in the Hugging Face cache layout
 * ("org/name": $HF_HUB_CACHE or $HF_HOME/hub/models--org--name/snapshots/REV), or a
 * name fetched by `lumen pull` ($LUMEN_HOME/models/NAME). On success *out owns the
 * model (free it with lm_model_free, after every context and request made from it).
 * Errors: LM_ERR_INVALID_ARG (a parameter out of range, named), LM_ERR_NOT_FOUND (no
 * such model: the sentence says where it looked; or a model without a tokenizer),
 * LM_ERR_UNSUPPORTED (backend, architecture, weight type), LM_ERR_FORMAT,
 * LM_ERR_IO, LM_ERR_NO_MEMORY (including the memory limit). */
lm_status lm_model_load(const char *model, lm_model_params params, lm_model **out);
void lm_model_free(lm_model *model); /* NULL is a no-op */

/* Facts about a loaded model. Strings are borrowed for the model's lifetime. */
int32_t lm_model_n_vocab(const lm_model *model);
int32_t lm_model_n_ctx(const lm_model *model);        /* the resolved params.n_ctx   */
int32_t lm_model_n_ctx_train(const lm_model *model);  /* what it was trained for      */
const char *lm_model_path(const lm_model *model);     /* the resolved file or folder  */
const char *lm_model_arch(const lm_model *model);     /* "llama", "qwen2", "gemma3"   */
uint64_t lm_model_weight_bytes(const lm_model *model);
bool lm_model_has_chat_template(const lm_model *model);

/* ==== tokens ==================================================================== */

enum {
    /* add BOS/EOS as the model asks; a text that already starts with the BOS token's
     * text (and LM_TOKENIZE_PARSE_SPECIAL) does not get a second one */
    LM_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* control tokens written in the text ("<|im_start|>") become their ids */
    LM_TOKENIZE_PARSE_SPECIAL = 1u << 1,
};

enum {
    LM_DETOKENIZE_REMOVE_SPECIAL = 1u << 0,  /* drop a leading BOS / trailing EOS the model adds */
    LM_DETOKENIZE_UNPARSE_SPECIAL = 1u << 1, /* render control tokens as their text            */
};

/* Tokenizes text[0..len) (any bytes). Writes min(needed, cap) ids and sets
 * *n_tokens = needed; returns LM_OK even when cap was too small (compare). `tokens`
 * may be NULL when cap is 0. */
lm_status lm_tokenize(const lm_model *model, const char *text, size_t len, uint32_t flags, int32_t *tokens,
                      size_t cap, size_t *n_tokens);

/* The text of tokens[0..n). Writes min(needed, cap) bytes, then a NUL if room is
 * left; *n_bytes = needed (without the NUL). LM_ERR_INVALID_ARG for a bad id. */
lm_status lm_detokenize(const lm_model *model, const int32_t *tokens, size_t n, uint32_t flags, char *buf,
                        size_t cap, size_t *n_bytes);

int32_t lm_token_bos(const lm_model *model); /* -1 when the model has none */
int32_t lm_token_eos(const lm_model *model);
bool lm_token_is_eog(const lm_model *model, int32_t token); /* EOS, EOT, end-of-turn */

/* ==== chat templates ============================================================ */

typedef struct lm_chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* NUL-terminated UTF-8               */
} lm_chat_message;

typedef struct lm_chat_params {
    bool add_generation_prompt;     /* end with the assistant turn's opening     default true */
    const char *tools_json;         /* JSON array of tools, or NULL             default NULL */
    const char *extra_context_json; /* JSON object of extra template variables  default NULL
                                       ({"enable_thinking": false}); they win              */
    const char *template_source;    /* a Jinja template to use instead of the   default NULL
                                       model's own                                         */
} lm_chat_params;

lm_chat_params lm_chat_default_params(void);

/* Renders a conversation with the model's chat template (tokenizer.chat_template of
 * the GGUF, chat_template of tokenizer_config.json), byte for byte as transformers'
 * apply_chat_template would. Output: min(needed, cap) bytes then a NUL if room is
 * left; *n_bytes = needed (without the NUL); LM_OK even when cap was too small.
 * Tokenize the result with LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL.
 * LM_ERR_NOT_FOUND when the model has no template (and none is given), LM_ERR_FORMAT
 * for a template that does not parse or a render error (raise_exception's message). */
lm_status lm_chat_render(const lm_model *model, const lm_chat_message *messages, size_t n_messages,
                         lm_chat_params params, char *buf, size_t cap, size_t *n_bytes);

/* Same, with the messages as a JSON array of objects (any fields the template reads:
 * "role", "content", "tool_calls", ...). */
lm_status lm_chat_render_json(const lm_model *model, const char *messages_json, lm_chat_params params, char *buf,
                              size_t cap, size_t *n_bytes);

/* ==== sampling ================================================================== */

/* The seed value that asks for a fresh, unpredictable seed. */
#define LM_SAMPLING_SEED_RANDOM UINT64_MAX

typedef struct lm_logit_bias {
    int32_t token; /* in [0, n_vocab)                                */
    float bias;    /* added to the token's logit; -INFINITY bans it */
} lm_logit_bias;

/* A logits processor: reads the history (prompt then generated tokens) and rewrites
 * logits[0..n_vocab) in place, every step, after bias and penalties and before
 * temperature and the filters. A status other than LM_OK ends the generation with
 * that error (set a sentence with your own words; lumen supplies one otherwise).
 * Runs on the thread that advances the request; `history` is valid during the call. */
typedef lm_status (*lm_logits_processor_fn)(void *user, const int32_t *history, size_t n_history, float *logits,
                                            size_t n_vocab);

typedef struct lm_logits_processor {
    lm_logits_processor_fn fn; /* required                                */
    void *user;                /* passed to fn; must outlive the request  */
} lm_logits_processor;

/* Builds a processor for one request from the loaded model (its vocabulary, via
 * lm_detokenize and friends): how a processor that needs the tokenizer (a grammar, a
 * banned-phrase list) is given once and instantiated per request. `release`, if not
 * NULL, is called with the built processor when the request is freed. */
typedef struct lm_logits_processor_factory {
    lm_status (*build)(void *factory_user, const lm_model *model, lm_logits_processor *out);
    void (*release)(void *factory_user, lm_logits_processor *built);
    void *factory_user;
} lm_logits_processor_factory;

/* Applied in this order each step: logit bias, penalties, processors, then (unless
 * temperature is 0, greedy: argmax, ties to the lowest id) temperature, top-k, top-p,
 * min-p and a draw from a counter-based RNG keyed by (seed, step), so the same seed
 * gives the same tokens whatever runs beside it. */
typedef struct lm_sampling_params {
    float temperature;               /* >= 0; 0 = greedy                          default 1 */
    int32_t top_k;                   /* >= 0; 0 = off                             default 0 */
    float top_p;                     /* (0, 1]; 1 = off                           default 1 */
    float min_p;                     /* [0, 1]; 0 = off                           default 0 */
    float repetition_penalty;        /* > 0; 1 = off                              default 1 */
    int32_t repetition_context_size; /* >= 0; last N history tokens, 0 = all      default 64 */
    float presence_penalty;          /* finite, may be negative; 0 = off          default 0 */
    float frequency_penalty;         /* finite, may be negative; 0 = off          default 0 */
    const lm_logit_bias *logit_bias; /* n_logit_bias entries; copied at start    default none */
    size_t n_logit_bias;
    const lm_logits_processor *processors; /* applied in order; copied at start   default none */
    size_t n_processors;
    uint64_t seed;                   /* LM_SAMPLING_SEED_RANDOM = pick one        default random */
} lm_sampling_params;

/* Temperature 1, no filters, no penalties (OpenAI's defaults), a random seed. */
lm_sampling_params lm_sampling_default_params(void);

/* LM_OK, or LM_ERR_INVALID_ARG naming the parameter and its value (negative
 * temperature, top_p outside (0, 1], a bias token outside [0, n_vocab), ...). */
lm_status lm_sampling_params_validate(const lm_sampling_params *params, size_t n_vocab);

typedef struct lm_token_logprob {
    int32_t token;
    float logprob; /* log-softmax of the model's raw logits (before sampling changes) */
} lm_token_logprob;

/* ==== generation ================================================================
 *
 * A context is where a standalone generation runs: a KV cache of n_ctx tokens and
 * scratch memory for one sequence, used by one request at a time on the caller's
 * thread. It remembers the tokens it holds, so a request whose prompt starts with
 * them (the next turn of a chat) computes only the new tokens.
 *
 * A request is one generation in flight: start it, then pull steps with
 * lm_request_next (or hand a callback to lm_generate), and free it. Requests will
 * also come from the engine (lm_engine_*, a worker thread batching many requests);
 * lm_request_next / _cancel / _stats / _free work the same on those. */

typedef struct lm_context lm_context;
typedef struct lm_request lm_request;

typedef struct lm_context_params {
    int32_t n_ctx;      /* >= 0; 0 = the model's (lm_model_params.n_ctx)   default 0  */
    lm_kv_type kv_type; /* LM_KV_DEFAULT = the model's                     default LM_KV_DEFAULT */
} lm_context_params;

lm_context_params lm_context_default_params(void);

/* A context for `model` (borrowed: it must outlive the context). LM_ERR_NO_MEMORY
 * when the KV cache would exceed the model's memory limit. */
lm_status lm_context_create(lm_model *model, lm_context_params params, lm_context **out);
void lm_context_free(lm_context *ctx); /* NULL is a no-op; no request may be live */
int32_t lm_context_n_ctx(const lm_context *ctx);
/* Forgets the cached tokens (the next request computes its whole prompt). */
void lm_context_reset(lm_context *ctx);

typedef enum lm_finish_reason {
    LM_FINISH_NONE = 0,      /* still going                                         */
    LM_FINISH_STOP = 1,      /* a stop string matched (its text is not in the output) */
    LM_FINISH_EOS = 2,       /* the model produced an end-of-generation token       */
    LM_FINISH_LENGTH = 3,    /* max_tokens reached, or the context is full          */
    LM_FINISH_CANCELLED = 4, /* lm_request_cancel, or the callback said stop        */
    LM_FINISH_ERROR = 5,     /* a step failed (lm_request_next returned the error)  */
} lm_finish_reason;

/* "stop", "eos", "length", "cancelled", "error", "" (none). Never NULL. */
const char *lm_finish_reason_str(lm_finish_reason reason);

#define LM_MAX_TOP_LOGPROBS 20

typedef struct lm_generate_params {
    lm_sampling_params sampling;           /* see above                                  */
    int32_t max_tokens;                    /* >= -1; -1 = until the context is full;     default 256
                                              0 = generate nothing (finish "length")     */
    const char *const *stop;               /* n_stop stop strings (UTF-8, not empty),    default none
                                              matched on the decoded text; copied        */
    size_t n_stop;
    bool ignore_eos;                       /* do not stop at end-of-generation tokens    default false */
    bool logprobs;                         /* report each token's logprob                default false */
    int32_t top_logprobs;                  /* [0, LM_MAX_TOP_LOGPROBS]: the N most       default 0
                                              likely tokens at each step                 */
    lm_logits_processor_factory processor_factory; /* build == NULL: none            default none */
} lm_generate_params;

lm_generate_params lm_generate_default_params(void);

/* One step of a generation. Every pointer is borrowed from the request and valid
 * until the next call on it (next, free). */
typedef struct lm_step {
    int32_t token;           /* the token generated at this step; -1 for a final step
                                that carries no token (cancelled, max_tokens 0)        */
    const char *text;        /* newly final text, NUL-terminated; may be empty: text that
                                could still become a stop string, or part of a character,
                                is held back and released by a later step              */
    size_t text_len;
    float logprob;           /* the token's logprob if params.logprobs, else 0       */
    const lm_token_logprob *top_logprobs; /* n_top_logprobs entries, most likely first */
    size_t n_top_logprobs;
    lm_finish_reason finish; /* LM_FINISH_NONE, or why this was the last step        */
} lm_step;

/* Statistics of one request. Every rate is 0 when it cannot be measured (no tokens,
 * no measurable time): never NaN, never infinite. */
typedef struct lm_stats {
    int64_t n_prompt_tokens;    /* tokens in the prompt                                 */
    int64_t n_cached_tokens;    /* of those, reused from the context's cache           */
    int64_t n_generated_tokens; /* tokens generated (an end token included)            */
    double prompt_s;            /* time computing the prompt                           */
    double ttft_s;              /* from lm_request_start to the first token            */
    double generation_s;        /* from the first token to the last                    */
    double total_s;             /* from lm_request_start to the last step              */
    double prompt_tps;          /* computed prompt tokens / prompt_s                   */
    double generation_tps;      /* tokens after the first / generation_s               */
    uint64_t peak_rss_bytes;    /* the process's peak resident memory so far           */
    uint64_t kv_cache_bytes;    /* the context's KV cache                              */
    lm_finish_reason finish;    /* LM_FINISH_NONE while running                        */
} lm_stats;

/* Starts a generation of `prompt[0..n_prompt)` (tokens, e.g. from lm_tokenize) in
 * `ctx`. Checks everything up front: LM_ERR_INVALID_ARG for an empty prompt, a token
 * outside the vocabulary or an invalid parameter (the sentence names it);
 * LM_ERR_LIMIT for a prompt that leaves no room in the context (n_prompt >= n_ctx);
 * LM_ERR_INVALID_ARG when ctx already has a live request. The prompt and the stop
 * strings are copied; no model work happens until the first lm_request_next. */
lm_status lm_request_start(lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                           lm_request **out);

/* Advances the request by one token and describes the step. LM_OK with
 * step->finish == LM_FINISH_NONE: more will come; with another reason: this was the
 * last step (later calls return LM_OK, no token, empty text and the same reason).
 * An error status (a failed forward pass, a processor's error) ends the request
 * (finish LM_FINISH_ERROR). */
lm_status lm_request_next(lm_request *req, lm_step *step);

/* Asks the request to stop; safe from any thread, at any time (before the first
 * next, during a step, after the end). The next step (or the current one, if a
 * prompt is being computed) ends with LM_FINISH_CANCELLED, releasing held text. */
void lm_request_cancel(lm_request *req);

/* Statistics so far (final once a step had a finish reason). */
lm_status lm_request_stats(const lm_request *req, lm_stats *stats);

/* Ends the request (cancelling it if running) and frees it; the context keeps the
 * tokens it computed for the next request. NULL is a no-op. */
void lm_request_free(lm_request *req);

/* Receives each step; return false to stop (the generation then ends cancelled, and
 * no further step is delivered). */
typedef bool (*lm_step_fn)(const lm_step *step, void *user_data);

/* The callback form: start, call `on_step` for every step (the last one has
 * finish != LM_FINISH_NONE), free. `stats` (may be NULL) receives the statistics,
 * also on error. `on_step` may be NULL (run to the end; see stats). */
lm_status lm_generate(lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                      lm_step_fn on_step, void *user_data, lm_stats *stats);

/* Computes the rates of `stats` from its counts and times (what lm_request_stats
 * does): prompt_tps = (n_prompt - n_cached) / prompt_s, generation_tps =
 * (n_generated - 1) / generation_s, 0 where a count or time is 0 or not finite. */
void lm_stats_update_rates(lm_stats *stats);

/* ==== the engine ================================================================
 *
 * An engine owns a model, a paged KV cache and a worker thread. Every forward pass
 * runs on the worker, which batches the live requests together (continuous
 * batching: requests join and leave between steps; long prompts are computed in
 * chunks so they do not stall decodes) and reuses every common prefix through a
 * prefix cache (a radix tree over KV blocks with LRU eviction). On the CPU, outputs
 * do not depend on what else runs: the forward pass is batch-invariant, so a greedy
 * request gives the same tokens alone or among 32 others, cached or not, preempted
 * or not. On a GPU, batches of more than a few tokens take faster paths that round
 * differently (bf16 activations; about 1e-3 relative), so greedy continuations can
 * change (3 of 32 prompts within 16 tokens, measured); LUMEN_CUDA_MV_MAX_N=1000000000
 * in the environment keeps the outputs identical, at a prefill cost (every product
 * exact f32, except large Q4_K and Q6_K matrices, which take the CPU's 8-bit
 * arithmetic as the CPU does; LUMEN_CUDA_MVQ=0 makes those f32 too).
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
 * room; it never fails for lack of it. Requests are admitted when their prompt fits;
 * when running sequences outgrow the pool, the most recently admitted gives its
 * blocks back and later recomputes what it had (lm_engine_stats.n_preemptions):
 * its output is the same as if it had never stopped. `params` NULL =
 * lm_generate_default_params(). */
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
    int64_t n_prefill_tokens;   /* prompt tokens computed (the prefix's included, and
                                   those recomputed after a preemption)                   */
    int64_t n_decode_tokens;    /* generated tokens fed back to the model                */
    int64_t n_generated_tokens; /* tokens sampled                                        */
    int64_t n_steps;            /* forward passes                                        */
    int64_t n_preemptions;      /* running requests whose KV blocks were taken back for
                                   older ones (each recomputes what it had: the tokens
                                   are recounted in n_prefill_tokens)                   */
    double mean_batch_tokens;   /* tokens per forward pass                               */
    double batch_occupancy;     /* mean running sequences per step / batch_size           */
    int64_t cache_lookups, cache_hits, cache_misses, cache_evictions;
    double cache_hit_rate;      /* reused tokens / looked-up tokens                       */
    uint64_t cache_bytes;       /* KV bytes the prefix tree holds                         */
    int64_t kv_blocks, kv_blocks_free;
    uint64_t kv_bytes;          /* the pool                                               */
    uint64_t device_peak_bytes; /* the most device memory in use at once (a GPU backend:
                                   weights, KV pool, activations; as the driver reports
                                   it); 0 on the CPU, whose memory is the process's       */
    int64_t n_jobs;             /* jobs run                                               */
} lm_engine_stats;

lm_status lm_engine_get_stats(lm_engine *e, lm_engine_stats *out);

/* The process's peak resident memory in GiB (getrusage), plus, on a GPU backend,
 * the device's peak (lm_engine_stats.device_peak_bytes, sampled after the load and
 * after every step). `e` may be NULL: the process's alone. */
double lm_engine_peak_memory_gb(const lm_engine *e);

/* Stops the engine: already-queued jobs run, live requests end cancelled, the
 * worker thread exits, the model and the KV cache are freed. Futures and requests
 * still held stay valid until freed. NULL is a no-op. */
void lm_engine_close(lm_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* LUMEN_H */
