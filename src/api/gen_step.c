/* The per-token half of a generation (gen_step.h). */
#include "api/gen_step.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

lm_status lm_gen_validate(const int32_t *prompt, size_t n_prompt, const lm_generate_params *p, size_t n_vocab,
                          int64_t n_ctx, const char *fn, const char *where, const char *knob) {
    if (n_prompt == 0) return lm_error(LM_ERR_INVALID_ARG, "the prompt is empty: give at least one token");
    if (!prompt) return lm_error(LM_ERR_INVALID_ARG, "%s: prompt is NULL", fn);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (size_t)prompt[i] >= n_vocab)
            return lm_error(LM_ERR_INVALID_ARG, "prompt token %zu is %d, outside the vocabulary [0, %zu)", i,
                            prompt[i], n_vocab);
    if ((int64_t)n_prompt >= n_ctx)
        return lm_error(LM_ERR_LIMIT,
                        "the prompt has %zu tokens and %s holds %lld: no room to generate; shorten the prompt or "
                        "raise %s",
                        n_prompt, where, (long long)n_ctx, knob);
    if (p->max_tokens < -1)
        return lm_error(LM_ERR_INVALID_ARG, "max_tokens = %d: must be >= -1 (-1 = until the context is full)",
                        p->max_tokens);
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_error(LM_ERR_INVALID_ARG, "top_logprobs = %d: must be in [0, %d]", p->top_logprobs,
                        LM_MAX_TOP_LOGPROBS);
    if (p->n_stop && !p->stop) return lm_error(LM_ERR_INVALID_ARG, "stop is NULL with n_stop = %zu", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return lm_error(LM_ERR_INVALID_ARG, "stop string %zu is empty", i);
    return lm_sampling_params_validate(&p->sampling, n_vocab);
}

lm_status lm_gen_init(lm_gen *g, const lm_model *model, const lm_generate_params *p,
                      const lm_logits_processor_factory *extra, const int32_t *prompt, size_t n_prompt) {
    g->t_start = lm_now_s();
    g->max_tokens = p->max_tokens;
    g->ignore_eos = p->ignore_eos;
    g->want_logprobs = p->logprobs;
    g->n_top = p->top_logprobs;
    g->tok = model->tok;
    g->tok_vocab = lm_tokenizer_n_vocab(model->tok);
    g->n_vocab = (size_t)model->m->hp.n_vocab;
    g->token = -1;
    g->stats.n_prompt_tokens = (int64_t)n_prompt;
    g->text_cap = 256;
    g->text = malloc(g->text_cap);
    if (!g->text) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    g->text[0] = '\0';

    /* the processors: the request's own, then the request's factory's, then extra's */
    lm_sampling_params sp = p->sampling;
    lm_logits_processor_factory fs[2] = {p->processor_factory, extra ? *extra : (lm_logits_processor_factory){0}};
    lm_logits_processor *procs = malloc(sizeof *procs * (sp.n_processors + 2));
    if (!procs) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    if (sp.n_processors) memcpy(procs, sp.processors, sizeof *procs * sp.n_processors);
    size_t np = sp.n_processors;
    lm_status st = LM_OK;
    for (int i = 0; i < 2 && !st; i++) {
        if (!fs[i].build) continue;
        lm_logits_processor built = {0};
        st = fs[i].build(fs[i].factory_user, model, &built);
        if (st) {
            st = lm_error_prefix(st, "logits processor factory");
            break;
        }
        g->factories[g->n_built] = fs[i];
        g->built[g->n_built++] = built; /* released even when unusable */
        if (!built.fn)
            st = lm_error(LM_ERR_INVALID_ARG, "the logits processor factory built a processor without a function");
        else
            procs[np++] = built;
    }
    sp.processors = procs;
    sp.n_processors = np;
    if (!st) st = lm_sampler_create(&sp, g->n_vocab, &g->sampler);
    free(procs); /* the sampler copied the array */
    if (!st) st = lm_sampler_accept_prompt(g->sampler, prompt, n_prompt);
    if (!st) st = lm_stop_matcher_create(p->stop, NULL, p->n_stop, &g->stop);
    if (!st) st = lm_detok_stream_create(model->tok, false, false, &g->detok);
    if (st) return st;
    /* SentencePiece vocabularies drop the first piece's leading space, which is right
     * for a whole text but not for a continuation: start the stream with the last
     * prompt token (its text is the prompt's, not ours) */
    if (lm_tokenizer_add_space_prefix(model->tok) && (uint32_t)prompt[n_prompt - 1] < g->tok_vocab) {
        const char *t;
        size_t n;
        lm_detok_stream_push(g->detok, prompt[n_prompt - 1], &t, &n);
    }
    return LM_OK;
}

static lm_status text_append(lm_gen *g, const char *s, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        size_t cap = g->text_cap;
        while (cap < g->text_len + n + 1) cap *= 2;
        char *t = realloc(g->text, cap);
        if (!t) return lm_error(LM_ERR_NO_MEMORY, "out of memory for generated text");
        g->text = t;
        g->text_cap = cap;
    }
    if (n) memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = '\0';
    return LM_OK;
}

/* Feeds decoded text to the stop matcher; *stopped when a stop string completed. */
static lm_status emit(lm_gen *g, const char *s, size_t n, bool *stopped) {
    lm_stop_output o;
    lm_status st = lm_stop_matcher_feed(g->stop, s, n, &o);
    if (!st) st = text_append(g, o.text, o.len);
    *stopped = !st && o.stop_index >= 0;
    return st;
}

/* The end of the stream: releases what the detokenizer and the matcher hold. A stop
 * string completed by the held text still wins. */
static lm_status flush(lm_gen *g, lm_finish_reason want, lm_finish_reason *got) {
    const char *t;
    size_t n;
    bool stopped = false;
    *got = want;
    lm_status st = lm_detok_stream_finish(g->detok, &t, &n);
    if (!st) st = emit(g, t, n, &stopped);
    if (st) return st;
    if (stopped) {
        *got = LM_FINISH_STOP;
        return LM_OK;
    }
    lm_stop_output o;
    st = lm_stop_matcher_finish(g->stop, &o);
    if (!st) st = text_append(g, o.text, o.len);
    return st;
}

static void clear_step(lm_gen *g) {
    g->text_len = 0;
    g->text[0] = '\0';
    g->token = -1;
    g->logprob = 0.0f;
    g->n_top_out = 0;
}

bool lm_gen_candidates_ok(const lm_gen *g, int k) {
    return g && g->sampler && !g->want_logprobs && g->n_top == 0 && lm_sampler_candidates_ok(g->sampler, k);
}

int lm_gen_candidates_k(const lm_gen *g, int k_max) {
    if (k_max < 1) return 0;
    if (lm_gen_candidates_ok(g, 1)) return 1;
    return lm_gen_candidates_ok(g, k_max) ? k_max : 0;
}

bool lm_gen_candidates_suffice(const lm_gen *g, const lm_candidates *c) {
    return c && lm_gen_candidates_ok(g, c->k) && lm_sampler_candidates_suffice(g->sampler, c);
}

/* The step from the token on: logprobs from the full row (logits; NULL on the
 * candidate path, which never has them asked), text, stop strings, finish. */
static lm_status step_after_token(lm_gen *g, const float *logits, int32_t tok, bool full, lm_finish_reason *finish);

lm_status lm_gen_sample(lm_gen *g, const float *logits, bool full, lm_finish_reason *finish) {
    clear_step(g);
    *finish = LM_FINISH_ERROR;
    int32_t tok;
    lm_status st = lm_sampler_sample(g->sampler, logits, g->n_vocab, &tok);
    if (st) return st;
    return step_after_token(g, logits, tok, full, finish);
}

lm_status lm_gen_sample_candidates(lm_gen *g, const lm_candidates *c, bool full, lm_finish_reason *finish) {
    clear_step(g);
    *finish = LM_FINISH_ERROR;
    if (!lm_gen_candidates_suffice(g, c))
        return lm_error(LM_ERR_INVALID_ARG, "generation: the candidates do not settle this step (logprobs asked, "
                                            "or sampling parameters that need the full row)");
    int32_t tok;
    lm_status st = lm_sampler_sample_candidates(g->sampler, c, &tok);
    if (st) return st;
    return step_after_token(g, NULL, tok, full, finish);
}

static lm_status step_after_token(lm_gen *g, const float *logits, int32_t tok, bool full, lm_finish_reason *finish) {
    lm_status st = LM_OK;
    if (logits && (g->want_logprobs || g->n_top)) {
        st = lm_logprobs(logits, g->n_vocab, tok, &g->logprob, (size_t)g->n_top, g->top, &g->n_top_out);
        if (st) {
            g->n_top_out = 0;
            return st;
        }
        if (!g->want_logprobs) g->logprob = 0.0f;
    }
    double now = lm_now_s();
    if (g->n_generated == 0) {
        g->t_first = now;
        g->stats.ttft_s = now - g->t_start;
    }
    g->n_generated++;
    g->stats.n_generated_tokens = g->n_generated;
    g->stats.generation_s = now - g->t_first;
    g->token = tok;

    lm_finish_reason why = LM_FINISH_NONE;
    bool stopped = false;
    if (!g->ignore_eos && lm_tokenizer_is_eog(g->tok, tok)) {
        why = LM_FINISH_EOS;
    } else {
        const char *piece = "";
        size_t len = 0;
        if ((uint32_t)tok < g->tok_vocab) st = lm_detok_stream_push(g->detok, tok, &piece, &len);
        if (!st) st = emit(g, piece, len, &stopped);
        if (st) {
            clear_step(g);
            return st;
        }
        if (stopped)
            why = LM_FINISH_STOP;
        else if ((g->max_tokens >= 0 && g->n_generated >= g->max_tokens) || full)
            why = LM_FINISH_LENGTH;
    }
    /* the last step carries everything still held back */
    if (why != LM_FINISH_NONE && why != LM_FINISH_STOP && (st = flush(g, why, &why))) {
        clear_step(g);
        return st;
    }
    *finish = why;
    return LM_OK;
}

lm_status lm_gen_end(lm_gen *g, lm_finish_reason want, lm_finish_reason *got) {
    clear_step(g);
    lm_status st = flush(g, want, got);
    if (st) {
        clear_step(g);
        *got = LM_FINISH_ERROR;
    }
    return st;
}

void lm_gen_release(lm_gen *g) {
    lm_sampler_free(g->sampler);
    lm_stop_matcher_free(g->stop);
    lm_detok_stream_free(g->detok);
    g->sampler = NULL;
    g->stop = NULL;
    g->detok = NULL;
    for (int i = 0; i < g->n_built; i++)
        if (g->factories[i].release) g->factories[i].release(g->factories[i].factory_user, &g->built[i]);
    g->n_built = 0;
}

void lm_gen_free(lm_gen *g) {
    lm_gen_release(g);
    free(g->text);
    g->text = NULL;
    g->text_len = g->text_cap = 0;
}
