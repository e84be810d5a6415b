/* Standalone generation: a context (one sequence's KV cache, reused across
 * requests by prefix) and requests that advance one token per lm_request_next.
 *
 * A step: (1) if the previous token is not in the cache yet, run it through the
 * model; the first step instead computes the prompt (the part not already cached),
 * in chunks so that a cancel is seen between them; (2) the rest is the engine's
 * too (api/gen_step.c): sample from the logits, decode the token incrementally,
 * pass the text through the stop-string matcher, which holds back what could still
 * become a stop string, and decide whether this was the last step (end token, stop
 * string, max_tokens, context full), releasing everything held back if so.
 *
 * The token generated last is never fed to the model: nothing needs its logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "api/gen_step.h"
#include "core/error.h"
#include "model/forward.h"

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
    /* the candidate path (sampling.h): when the request can be sampled from its
     * row's best cand_k logits, only those come back from the last token */
    int cand_k;
    int step_k;          /* the last feed's candidates a row (1 when greedy)  */
    int32_t *cand_ids;   /* [cand_k]                                          */
    float *cand_vals;    /* [cand_k]                                          */
    float *cand_max;     /* [1]                                               */
    bool have_cands;     /* the last feed gave candidates...                  */
    int8_t cand_full;    /* ...and, when they did not settle it, the logits   */
    int32_t *tokens;     /* [n_ctx] the tokens whose K/V are in the cache     */
    int64_t n_tokens;
    int32_t *pos, *seq;  /* [PREFILL_CHUNK] batch scratch                     */
    lm_request *active;  /* the live request, NULL if none                   */
};

typedef enum req_state {
    REQ_PROMPT,  /* the prompt is not computed yet                     */
    REQ_READY,   /* ctx->logits (or candidates) hold the next token's distribution */
    REQ_FEED,    /* the last generated token must be fed first          */
    REQ_DONE,
} req_state;

struct lm_request {
    lm_context *ctx;
    int32_t *prompt;
    size_t n_prompt;
    lm_gen gen;          /* sampling, detokenizing, stop strings; this step's output */
    atomic_bool cancel;
    req_state state;
    int32_t last_token;
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
    c->logits = lm_backend_host_alloc(model->backend, sizeof(float) * (size_t)model->m->hp.n_vocab);
    c->cand_k = model->m->hp.n_vocab < LM_SAMPLER_CANDIDATES ? (int)model->m->hp.n_vocab : LM_SAMPLER_CANDIDATES;
    c->cand_ids = lm_backend_host_alloc(model->backend, sizeof(int32_t) * (size_t)c->cand_k);
    c->cand_vals = lm_backend_host_alloc(model->backend, sizeof(float) * (size_t)c->cand_k);
    c->cand_max = lm_backend_host_alloc(model->backend, sizeof(float));
    c->tokens = malloc(sizeof(int32_t) * (size_t)n_ctx);
    c->pos = malloc(sizeof(int32_t) * PREFILL_CHUNK);
    c->seq = calloc(PREFILL_CHUNK, sizeof(int32_t));
    if (!c->logits || !c->cand_ids || !c->cand_vals || !c->cand_max || !c->tokens || !c->pos || !c->seq)
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
    lm_backend_host_free(ctx->model->backend, ctx->logits);
    lm_backend_host_free(ctx->model->backend, ctx->cand_ids);
    lm_backend_host_free(ctx->model->backend, ctx->cand_vals);
    lm_backend_host_free(ctx->model->backend, ctx->cand_max);
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

static lm_candidates ctx_candidates(const lm_context *ctx) {
    return (lm_candidates){(size_t)ctx->model->m->hp.n_vocab, ctx->step_k, ctx->cand_ids, ctx->cand_vals,
                           ctx->cand_max[0]};
}

/* lm_forward_topk's question for the one row: do the candidates settle the step? */
static bool need_full(void *user, int64_t row) {
    const lm_request *r = user;
    lm_candidates c = ctx_candidates(r->ctx);
    (void)row;
    return !lm_gen_candidates_suffice(&r->gen, &c);
}

/* Runs tokens[0..n) at the end of the cached sequence; on success the last one's
 * logits are in ctx->logits or, when the request `r` can be sampled from them, its
 * candidates (ctx->have_cands). On failure the cache is cut back to what it held
 * before. */
static lm_status ctx_feed(lm_context *ctx, lm_request *r, const int32_t *tokens, int64_t n) {
    for (int64_t i = 0; i < n; i++) ctx->pos[i] = (int32_t)(ctx->n_tokens + i);
    ctx->step_k = lm_gen_candidates_k(&r->gen, ctx->cand_k);
    ctx->have_cands = ctx->step_k > 0;
    lm_topk_out out = {.k = ctx->step_k, .ids = ctx->cand_ids, .vals = ctx->cand_vals, .row_max = ctx->cand_max,
                       .need_full = need_full, .user = r, .full = ctx->logits, .fetched = &ctx->cand_full};
    lm_status st = ctx->have_cands ? lm_model_forward_topk(ctx->model, ctx->kv, tokens, ctx->pos, ctx->seq, n, &out)
                                   : lm_model_forward(ctx->model, ctx->kv, tokens, ctx->pos, ctx->seq, n, ctx->logits);
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
    lm_gen_free(&r->gen);
    free(r->prompt);
    free(r);
}

lm_status lm_request_start(lm_context *ctx, const int32_t *prompt, size_t n_prompt, const lm_generate_params *params,
                           lm_request **out) {
    if (!ctx || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_request_start: NULL argument");
    *out = NULL;
    lm_generate_params defaults = lm_generate_default_params();
    const lm_generate_params *p = params ? params : &defaults;
    if (ctx->active)
        return lm_error(LM_ERR_INVALID_ARG, "the context already runs a request: free it before starting another");
    lm_status st = lm_gen_validate(prompt, n_prompt, p, (size_t)ctx->model->m->hp.n_vocab, ctx->n_ctx,
                                   "lm_request_start", "the context", "n_ctx");
    if (st) return st;
    lm_request *r = calloc(1, sizeof *r);
    if (!r) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    r->ctx = ctx;
    r->n_prompt = n_prompt;
    r->last_token = -1;
    atomic_init(&r->cancel, false);
    r->prompt = malloc(sizeof(int32_t) * n_prompt);
    if (!r->prompt) {
        req_release(r);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(r->prompt, prompt, sizeof(int32_t) * n_prompt);
    if ((st = lm_gen_init(&r->gen, ctx->model, p, NULL, prompt, n_prompt))) {
        req_release(r);
        return st;
    }
    r->gen.stats.kv_cache_bytes = ctx->kv_bytes;
    r->state = p->max_tokens == 0 ? REQ_READY : REQ_PROMPT;
    ctx->active = r;
    *out = r;
    return LM_OK;
}

static void finish(lm_request *r, lm_finish_reason why, lm_step *step) {
    r->state = REQ_DONE;
    step->finish = why;
    lm_stats *s = &r->gen.stats;
    s->finish = why;
    s->total_s = lm_now_s() - r->gen.t_start;
    s->peak_rss_bytes = lm_peak_rss_bytes();
    lm_stats_update_rates(s);
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
    r->gen.stats.n_cached_tokens = common;
    double t0 = lm_now_s();
    for (int64_t i = common; i < (int64_t)r->n_prompt; i += PREFILL_CHUNK) {
        if (atomic_load(&r->cancel)) {
            *cancelled = true;
            break;
        }
        int64_t n = (int64_t)r->n_prompt - i < PREFILL_CHUNK ? (int64_t)r->n_prompt - i : PREFILL_CHUNK;
        lm_status st = ctx_feed(ctx, r, r->prompt + i, n);
        if (st) return lm_error_prefix(st, "computing the prompt");
    }
    r->gen.stats.prompt_s = lm_now_s() - t0;
    return LM_OK;
}

lm_status lm_request_next(lm_request *r, lm_step *step) {
    if (!r || !step) return lm_error(LM_ERR_INVALID_ARG, "lm_request_next: NULL argument");
    *step = (lm_step){.token = -1, .text = "", .finish = LM_FINISH_NONE};
    if (r->state == REQ_DONE) {
        step->finish = r->gen.stats.finish;
        return LM_OK;
    }
    lm_context *ctx = r->ctx;
    if (!ctx) return fail(r, lm_error(LM_ERR_INVALID_ARG, "the request's context was freed"), step);
    lm_gen *g = &r->gen;
    lm_finish_reason why;
    lm_status st;

    bool cancelled = atomic_load(&r->cancel);
    if (!cancelled && r->state == REQ_PROMPT) {
        if ((st = compute_prompt(r, &cancelled))) return fail(r, st, step);
        r->state = REQ_READY;
    } else if (!cancelled && r->state == REQ_FEED) {
        if ((st = ctx_feed(ctx, r, &r->last_token, 1))) return fail(r, lm_error_prefix(st, "generating"), step);
        r->state = REQ_READY;
    }
    if (cancelled || (g->max_tokens >= 0 && g->n_generated >= g->max_tokens)) {
        st = lm_gen_end(g, cancelled ? LM_FINISH_CANCELLED : LM_FINISH_LENGTH, &why);
        step->text = g->text;
        if (st) return fail(r, st, step);
        step->text_len = g->text_len;
        finish(r, why, step);
        return LM_OK;
    }
    bool full = ctx->n_tokens >= ctx->n_ctx;
    if (ctx->have_cands && !ctx->cand_full) {
        lm_candidates c = ctx_candidates(ctx);
        st = lm_gen_sample_candidates(g, &c, full, &why);
    } else {
        st = lm_gen_sample(g, ctx->logits, full, &why);
    }
    step->text = g->text;
    if (st) return fail(r, st, step);
    r->last_token = g->token;
    step->token = g->token;
    step->text_len = g->text_len;
    step->logprob = g->logprob;
    if (g->want_logprobs || g->n_top) {
        step->top_logprobs = g->top;
        step->n_top_logprobs = g->n_top_out;
    }
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
    *stats = r->gen.stats;
    if (r->state != REQ_DONE) {
        stats->total_s = lm_now_s() - r->gen.t_start;
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
