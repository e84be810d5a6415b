/* Standalone generation: a context (one sequence's KV cache, reused across
 * requests by prefix) and requests that advance one token per lm_request_next.
 *
 * A step: (1) if the previous token is not in the cache yet, run it through the
 * model; the first step instead computes the prompt (the part not already cached),
 * in chunks so that a cancel is seen between them; (2) sample from the logits;
 * (3) decode the token incrementally and pass the text through the stop-string
 * matcher, which holds back what could still become a stop string; (4) decide
 * whether this was the last step (end token, stop string, max_tokens, context full)
 * and, if so, release everything held back.
 *
 * The token generated last is never fed to the model: nothing needs its logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "core/error.h"
#include "model/forward.h"
#include "sampling/sampling.h"
#include "sampling/stop.h"

/* Prompt tokens per forward call: big enough to keep the matmuls efficient, small
 * enough that a cancel during a long prompt is seen within a fraction of a second. */
#define PREFILL_CHUNK 256

struct lm_context {
    lm_model *model;
    lm_kv_cache *kv;
    int32_t n_ctx;
    lm_kv_type kv_type;
    uint64_t kv_bytes;   /* accounted in model->kv_bytes_live                */
    float *logits;       /* [n_vocab] the logits of the last computed token  */
    int32_t *tokens;     /* [n_ctx] the tokens whose K/V are in the cache     */
    int64_t n_tokens;
    int32_t *pos, *seq;  /* [PREFILL_CHUNK] batch scratch                     */
    lm_request *active;  /* the live request, NULL if none                   */
};

typedef enum req_state {
    REQ_PROMPT,  /* the prompt is not computed yet                     */
    REQ_READY,   /* ctx->logits hold the distribution of the next token */
    REQ_FEED,    /* the last generated token must be fed first          */
    REQ_DONE,
} req_state;

struct lm_request {
    lm_context *ctx;
    int32_t *prompt;
    size_t n_prompt;
    int32_t max_tokens;
    bool ignore_eos, want_logprobs;
    int32_t n_top;
    lm_sampler *sampler;
    lm_stop_matcher *stop;
    lm_detok_stream *detok;
    uint32_t tok_vocab;              /* tokenizer ids; the model may have padding rows beyond */
    lm_logits_processor_factory factory;
    lm_logits_processor built;
    bool has_built;
    atomic_bool cancel;
    req_state state;
    int32_t last_token;
    int64_t n_generated;
    char *text;                      /* this step's text */
    size_t text_len, text_cap;
    lm_token_logprob top[LM_MAX_TOP_LOGPROBS];
    lm_stats stats;
    double t_start, t_first;
};

/* ---- contexts ---- */

lm_context_params lm_context_default_params(void) {
    return (lm_context_params){.n_ctx = 0, .kv_type = LM_KV_DEFAULT};
}

lm_status lm_context_create(lm_model *model, lm_context_params params, lm_context **out) {
    if (!model || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_context_create: NULL argument");
    *out = NULL;
    if (params.n_ctx < 0)
        return lm_error(LM_ERR_INVALID_ARG, "context n_ctx = %d: must be >= 0 (0 = the model's)", params.n_ctx);
    if (params.kv_type != LM_KV_DEFAULT && params.kv_type != LM_KV_F16 && params.kv_type != LM_KV_F32)
        return lm_error(LM_ERR_INVALID_ARG, "context kv_type = %d: not an lm_kv_type", (int)params.kv_type);
    int32_t n_ctx = params.n_ctx ? params.n_ctx : model->params.n_ctx;
    lm_kv_type type = params.kv_type == LM_KV_DEFAULT ? model->params.kv_type : params.kv_type;
    uint64_t kv_bytes = lm_model_kv_bytes(model, n_ctx, type);
    uint64_t limit = model->params.memory_limit;
    uint64_t live = atomic_fetch_add(&model->kv_bytes_live, kv_bytes);
    if (limit && model->m->weight_bytes + live + kv_bytes > limit) {
        atomic_fetch_sub(&model->kv_bytes_live, kv_bytes);
        return lm_error(LM_ERR_NO_MEMORY,
                        "a context of %d tokens needs %.1f MiB of KV cache; with the weights (%.1f MiB) and the "
                        "live contexts (%.1f MiB) that exceeds the memory limit of %.1f MiB",
                        n_ctx, (double)kv_bytes / 1048576.0, (double)model->m->weight_bytes / 1048576.0,
                        (double)live / 1048576.0, (double)limit / 1048576.0);
    }
    lm_context *c = calloc(1, sizeof *c);
    lm_status st = LM_OK;
    if (!c) {
        atomic_fetch_sub(&model->kv_bytes_live, kv_bytes);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    c->model = model;
    c->n_ctx = n_ctx;
    c->kv_type = type;
    c->kv_bytes = kv_bytes;
    c->logits = malloc(sizeof(float) * (size_t)model->m->hp.n_vocab);
    c->tokens = malloc(sizeof(int32_t) * (size_t)n_ctx);
    c->pos = malloc(sizeof(int32_t) * PREFILL_CHUNK);
    c->seq = calloc(PREFILL_CHUNK, sizeof(int32_t));
    if (!c->logits || !c->tokens || !c->pos || !c->seq)
        st = lm_error(LM_ERR_NO_MEMORY, "out of memory for a context of %d tokens", n_ctx);
    if (!st) st = lm_kv_cache_for_model(model->m, n_ctx, 1, type == LM_KV_F32 ? LM_DTYPE_F32 : LM_DTYPE_F16, &c->kv);
    if (st) {
        lm_context_free(c);
        return st;
    }
    *out = c;
    return LM_OK;
}

void lm_context_free(lm_context *ctx) {
    if (!ctx) return;
    if (ctx->active) ctx->active->ctx = NULL; /* a misuse; the request then fails cleanly */
    atomic_fetch_sub(&ctx->model->kv_bytes_live, ctx->kv_bytes);
    lm_kv_cache_free(ctx->kv);
    free(ctx->logits);
    free(ctx->tokens);
    free(ctx->pos);
    free(ctx->seq);
    free(ctx);
}

int32_t lm_context_n_ctx(const lm_context *ctx) { return ctx ? ctx->n_ctx : 0; }

void lm_context_reset(lm_context *ctx) {
    if (!ctx || ctx->active) return;
    lm_kv_cache_truncate(ctx->kv, 0, 0);
    ctx->n_tokens = 0;
}

/* Runs tokens[0..n) at the end of the cached sequence; on success ctx->logits holds
 * the last one's logits. On failure the cache is cut back to what it held before. */
static lm_status ctx_feed(lm_context *ctx, const int32_t *tokens, int64_t n) {
    for (int64_t i = 0; i < n; i++) ctx->pos[i] = (int32_t)(ctx->n_tokens + i);
    lm_status st = lm_model_forward(ctx->model, ctx->kv, tokens, ctx->pos, ctx->seq, n, ctx->logits);
    if (st) {
        lm_kv_cache_truncate(ctx->kv, 0, ctx->n_tokens);
        return st;
    }
    memcpy(ctx->tokens + ctx->n_tokens, tokens, sizeof(int32_t) * (size_t)n);
    ctx->n_tokens += n;
    return LM_OK;
}

/* ---- requests ---- */

lm_generate_params lm_generate_default_params(void) {
    return (lm_generate_params){.sampling = lm_sampling_default_params(), .max_tokens = 256};
}

const char *lm_finish_reason_str(lm_finish_reason r) {
    switch (r) {
    case LM_FINISH_STOP: return "stop";
    case LM_FINISH_EOS: return "eos";
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_CANCELLED: return "cancelled";
    case LM_FINISH_ERROR: return "error";
    default: return "";
    }
}

static void req_release(lm_request *r) {
    lm_sampler_free(r->sampler);
    lm_stop_matcher_free(r->stop);
    lm_detok_stream_free(r->detok);
    if (r->has_built && r->factory.release) r->factory.release(r->factory.factory_user, &r->built);
    free(r->prompt);
    free(r->text);
    free(r);
}

static lm_status validate(const lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *p) {
    int32_t n_vocab = (int32_t)ctx->model->m->hp.n_vocab;
    if (n_prompt == 0) return lm_error(LM_ERR_INVALID_ARG, "the prompt is empty: give at least one token");
    if (!prompt) return lm_error(LM_ERR_INVALID_ARG, "lm_request_start: prompt is NULL");
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return lm_error(LM_ERR_INVALID_ARG, "prompt token %zu is %d, outside the vocabulary [0, %d)", i, prompt[i],
                            n_vocab);
    if (n_prompt >= (size_t)ctx->n_ctx)
        return lm_error(LM_ERR_LIMIT,
                        "the prompt has %zu tokens and the context holds %d: no room to generate; shorten the prompt "
                        "or raise n_ctx",
                        n_prompt, ctx->n_ctx);
    if (p->max_tokens < -1)
        return lm_error(LM_ERR_INVALID_ARG, "max_tokens = %d: must be >= -1 (-1 = until the context is full)",
                        p->max_tokens);
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_error(LM_ERR_INVALID_ARG, "top_logprobs = %d: must be in [0, %d]", p->top_logprobs,
                        LM_MAX_TOP_LOGPROBS);
    if (p->n_stop && !p->stop) return lm_error(LM_ERR_INVALID_ARG, "stop is NULL with n_stop = %zu", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return lm_error(LM_ERR_INVALID_ARG, "stop string %zu is empty", i);
    return lm_sampling_params_validate(&p->sampling, (size_t)n_vocab);
}

lm_status lm_request_start(lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                           lm_request **out) {
    if (!ctx || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_request_start: NULL argument");
    *out = NULL;
    lm_generate_params defaults = lm_generate_default_params();
    const lm_generate_params *p = params ? params : &defaults;
    if (ctx->active)
        return lm_error(LM_ERR_INVALID_ARG, "the context already runs a request: free it before starting another");
    lm_status st = validate(ctx, prompt, n_prompt, p);
    if (st) return st;
    lm_request *r = calloc(1, sizeof *r);
    if (!r) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    r->t_start = lm_now_s();
    r->ctx = ctx;
    r->n_prompt = n_prompt;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->want_logprobs = p->logprobs;
    r->n_top = p->top_logprobs;
    r->factory = p->processor_factory;
    r->tok_vocab = lm_tokenizer_n_vocab(ctx->model->tok);
    r->last_token = -1;
    atomic_init(&r->cancel, false);
    r->stats.n_prompt_tokens = (int64_t)n_prompt;
    r->stats.kv_cache_bytes = ctx->kv_bytes;
    r->text_cap = 256;
    r->text = malloc(r->text_cap);
    r->prompt = malloc(sizeof(int32_t) * n_prompt);
    if (!r->text || !r->prompt) {
        req_release(r);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    r->text[0] = '\0';
    memcpy(r->prompt, prompt, sizeof(int32_t) * n_prompt);

    /* the processors: the caller's, then the one the factory builds */
    lm_sampling_params sp = p->sampling;
    lm_logits_processor *procs = NULL;
    if (r->factory.build) {
        st = r->factory.build(r->factory.factory_user, ctx->model, &r->built);
        if (st) {
            req_release(r);
            return lm_error_prefix(st, "logits processor factory");
        }
        r->has_built = true;
        if (!r->built.fn) {
            req_release(r);
            return lm_error(LM_ERR_INVALID_ARG, "the logits processor factory built a processor without a function");
        }
        procs = malloc(sizeof *procs * (sp.n_processors + 1));
        if (!procs) {
            req_release(r);
            return lm_error(LM_ERR_NO_MEMORY, "out of memory");
        }
        if (sp.n_processors) memcpy(procs, sp.processors, sizeof *procs * sp.n_processors);
        procs[sp.n_processors] = r->built;
        sp.processors = procs;
        sp.n_processors++;
    }
    size_t n_vocab = (size_t)ctx->model->m->hp.n_vocab;
    st = lm_sampler_create(&sp, n_vocab, &r->sampler);
    free(procs); /* the sampler copied the array */
    if (!st) st = lm_sampler_accept_prompt(r->sampler, prompt, n_prompt);
    if (!st) st = lm_stop_matcher_create(p->stop, NULL, p->n_stop, &r->stop);
    if (!st) st = lm_detok_stream_create(ctx->model->tok, false, false, &r->detok);
    if (st) {
        req_release(r);
        return st;
    }
    /* SentencePiece vocabularies drop the first piece's leading space, which is right
     * for a whole text but not for a continuation: start the stream with the last
     * prompt token (its text is the prompt's, not ours) */
    if (lm_tokenizer_add_space_prefix(ctx->model->tok) && (uint32_t)prompt[n_prompt - 1] < r->tok_vocab) {
        const char *t;
        size_t n;
        lm_detok_stream_push(r->detok, prompt[n_prompt - 1], &t, &n);
    }
    r->state = r->max_tokens == 0 ? REQ_READY : REQ_PROMPT;
    ctx->active = r;
    *out = r;
    return LM_OK;
}

static lm_status text_append(lm_request *r, const char *s, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = r->text_cap;
        while (cap < r->text_len + n + 1) cap *= 2;
        char *t = realloc(r->text, cap);
        if (!t) return lm_error(LM_ERR_NO_MEMORY, "out of memory for generated text");
        r->text = t;
        r->text_cap = cap;
    }
    if (n) memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return LM_OK;
}

/* Feeds decoded text to the stop matcher; *stopped when a stop string completed. */
static lm_status emit(lm_request *r, const char *s, size_t n, bool *stopped) {
    lm_stop_output o;
    lm_status st = lm_stop_matcher_feed(r->stop, s, n, &o);
    if (!st) st = text_append(r, o.text, o.len);
    *stopped = o.stop_index >= 0;
    return st;
}

/* The end of the stream: releases what the detokenizer and the matcher hold. A stop
 * string completed by the held text still wins. Returns the final reason. */
static lm_status flush(lm_request *r, lm_finish_reason want, lm_finish_reason *got) {
    const char *t;
    size_t n;
    bool stopped = false;
    *got = want;
    lm_status st = lm_detok_stream_finish(r->detok, &t, &n);
    if (!st) st = emit(r, t, n, &stopped);
    if (st) return st;
    if (stopped) {
        *got = LM_FINISH_STOP;
        return LM_OK;
    }
    lm_stop_output o;
    st = lm_stop_matcher_finish(r->stop, &o);
    if (!st) st = text_append(r, o.text, o.len);
    return st;
}

static void finish(lm_request *r, lm_finish_reason why, lm_step *step) {
    r->state = REQ_DONE;
    step->finish = why;
    r->stats.finish = why;
    double now = lm_now_s();
    r->stats.total_s = now - r->t_start;
    r->stats.peak_rss_bytes = lm_peak_rss_bytes();
    lm_stats_update_rates(&r->stats);
    if (r->ctx && r->ctx->active == r) r->ctx->active = NULL;
}

static lm_status fail(lm_request *r, lm_status st, lm_step *step) {
    finish(r, LM_FINISH_ERROR, step);
    return st;
}

/* Computes the uncached part of the prompt, reusing the longest cached prefix (but
 * always recomputing the last prompt token, whose logits are needed). Returns
 * LM_OK with *cancelled set if a cancel arrived between chunks. */
static lm_status compute_prompt(lm_request *r, bool *cancelled) {
    lm_context *ctx = r->ctx;
    int64_t common = 0, limit = (int64_t)r->n_prompt - 1;
    while (common < ctx->n_tokens && common < limit && ctx->tokens[common] == r->prompt[common]) common++;
    lm_kv_cache_truncate(ctx->kv, 0, common);
    ctx->n_tokens = common;
    r->stats.n_cached_tokens = common;
    double t0 = lm_now_s();
    for (int64_t i = common; i < (int64_t)r->n_prompt; i += PREFILL_CHUNK) {
        if (atomic_load(&r->cancel)) {
            *cancelled = true;
            break;
        }
        int64_t n = (int64_t)r->n_prompt - i < PREFILL_CHUNK ? (int64_t)r->n_prompt - i : PREFILL_CHUNK;
        lm_status st = ctx_feed(ctx, r->prompt + i, n);
        if (st) return lm_error_prefix(st, "computing the prompt");
    }
    r->stats.prompt_s = lm_now_s() - t0;
    return LM_OK;
}

lm_status lm_request_next(lm_request *r, lm_step *step) {
    if (!r || !step) return lm_error(LM_ERR_INVALID_ARG, "lm_request_next: NULL argument");
    *step = (lm_step){.token = -1, .text = "", .finish = LM_FINISH_NONE};
    if (r->state == REQ_DONE) {
        step->finish = r->stats.finish;
        return LM_OK;
    }
    lm_context *ctx = r->ctx;
    if (!ctx) return fail(r, lm_error(LM_ERR_INVALID_ARG, "the request's context was freed"), step);
    r->text_len = 0;
    r->text[0] = '\0';
    step->text = r->text;
    lm_finish_reason why;
    lm_status st;

    bool cancelled = atomic_load(&r->cancel);
    if (!cancelled && r->state == REQ_PROMPT) {
        if ((st = compute_prompt(r, &cancelled))) return fail(r, st, step);
        r->state = REQ_READY;
    } else if (!cancelled && r->state == REQ_FEED) {
        if ((st = ctx_feed(ctx, &r->last_token, 1))) return fail(r, lm_error_prefix(st, "generating"), step);
        r->state = REQ_READY;
    }
    if (cancelled || (r->max_tokens >= 0 && r->n_generated >= r->max_tokens)) {
        why = cancelled ? LM_FINISH_CANCELLED : LM_FINISH_LENGTH;
        if ((st = flush(r, why, &why))) return fail(r, st, step);
        step->text_len = r->text_len;
        finish(r, why, step);
        return LM_OK;
    }

    size_t n_vocab = (size_t)ctx->model->m->hp.n_vocab;
    int32_t tok;
    if ((st = lm_sampler_sample(r->sampler, ctx->logits, n_vocab, &tok))) return fail(r, st, step);
    if (r->want_logprobs || r->n_top) {
        size_t n_top = 0;
        st = lm_logprobs(ctx->logits, n_vocab, tok, &step->logprob, (size_t)r->n_top, r->top, &n_top);
        if (st) return fail(r, st, step);
        step->top_logprobs = r->top;
        step->n_top_logprobs = n_top;
        if (!r->want_logprobs) step->logprob = 0.0f;
    }
    double now = lm_now_s();
    if (r->n_generated == 0) {
        r->t_first = now;
        r->stats.ttft_s = now - r->t_start;
    }
    r->n_generated++;
    r->stats.n_generated_tokens = r->n_generated;
    r->stats.generation_s = now - r->t_first;
    r->last_token = tok;
    step->token = tok;

    why = LM_FINISH_NONE;
    bool stopped = false;
    if (!r->ignore_eos && lm_tokenizer_is_eog(ctx->model->tok, tok)) {
        why = LM_FINISH_EOS;
    } else {
        const char *piece = "";
        size_t len = 0;
        if ((uint32_t)tok < r->tok_vocab && (st = lm_detok_stream_push(r->detok, tok, &piece, &len)))
            return fail(r, st, step);
        if ((st = emit(r, piece, len, &stopped))) return fail(r, st, step);
        if (stopped)
            why = LM_FINISH_STOP;
        else if ((r->max_tokens >= 0 && r->n_generated >= r->max_tokens) || ctx->n_tokens >= ctx->n_ctx)
            why = LM_FINISH_LENGTH;
    }
    if (why != LM_FINISH_NONE && why != LM_FINISH_STOP && (st = flush(r, why, &why))) return fail(r, st, step);
    step->text_len = r->text_len;
    if (why != LM_FINISH_NONE) {
        finish(r, why, step);
    } else {
        r->state = REQ_FEED;
    }
    return LM_OK;
}

void lm_request_cancel(lm_request *r) {
    if (r) atomic_store(&r->cancel, true);
}

lm_status lm_request_stats(const lm_request *r, lm_stats *stats) {
    if (!r || !stats) return lm_error(LM_ERR_INVALID_ARG, "lm_request_stats: NULL argument");
    *stats = r->stats;
    if (r->state != REQ_DONE) {
        stats->total_s = lm_now_s() - r->t_start;
        stats->peak_rss_bytes = lm_peak_rss_bytes();
        lm_stats_update_rates(stats);
    }
    return LM_OK;
}

void lm_request_free(lm_request *r) {
    if (!r) return;
    if (r->ctx && r->ctx->active == r) r->ctx->active = NULL;
    req_release(r);
}

lm_status lm_generate(lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                      lm_step_fn on_step, void *user_data, lm_stats *stats) {
    if (stats) *stats = (lm_stats){.n_prompt_tokens = (int64_t)n_prompt};
    lm_request *r = NULL;
    lm_status st = lm_request_start(ctx, prompt, n_prompt, params, &r);
    if (st) {
        if (stats) stats->finish = LM_FINISH_ERROR;
        return st;
    }
    lm_step step;
    for (;;) {
        if ((st = lm_request_next(r, &step))) break;
        if (on_step && !on_step(&step, user_data) && step.finish == LM_FINISH_NONE) {
            lm_request_cancel(r);
            st = lm_request_next(r, &step); /* ends the request; this step is not delivered */
            break;
        }
        if (step.finish != LM_FINISH_NONE) break;
    }
    if (stats) lm_request_stats(r, stats);
    lm_request_free(r);
    return st;
}

void lm_stats_update_rates(lm_stats *s) {
    if (!s) return;
    double computed = (double)(s->n_prompt_tokens - s->n_cached_tokens);
    s->prompt_tps = computed > 0 && isfinite(s->prompt_s) && s->prompt_s > 0 ? computed / s->prompt_s : 0.0;
    double after_first = (double)(s->n_generated_tokens - 1);
    s->generation_tps =
        after_first > 0 && isfinite(s->generation_s) && s->generation_s > 0 ? after_first / s->generation_s : 0.0;
    if (!isfinite(s->prompt_tps)) s->prompt_tps = 0.0;
    if (!isfinite(s->generation_tps)) s->generation_tps = 0.0;
}
