/* The public generation API (lumen.h) on a tiny random-weight llama model with a
 * byte-level BPE vocabulary and a ChatML template, written here: loading with
 * parameters, bad input, tokenize / detokenize / chat, greedy generation against a
 * plain argmax loop over the internal forward pass, seeds, stop strings through the
 * whole pipeline, end tokens, lengths, cancellation (before the start, from another
 * thread, from the callback), logits processors and their factory, context reuse,
 * and statistics (0 and 1 tokens, zero elapsed time). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api_internal.h"
#include "lumen.h"
#include "model/forward.h"
#include "test.h"
#include "tiny_model.h"
#include "tiny_tokenizer.h"


static char g_dir[256], g_path[512];

static lm_model *load(lm_model_params p) {
    lm_model *m = NULL;
    lm_status st = lm_model_load(g_path, p, &m);
    if (st) fprintf(stderr, "load: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    return m;
}

static lm_model_params small_params(void) {
    lm_model_params p = lm_model_default_params();
    p.n_threads = 1;
    p.n_ctx = 128;
    return p;
}

static size_t tokenize(const lm_model *m, const char *text, uint32_t flags, int32_t *ids, size_t cap) {
    size_t n = 0;
    CHECK(lm_tokenize(m, text, strlen(text), flags, ids, cap, &n) == LM_OK);
    CHECK(n <= cap);
    return n;
}

/* ---- a scripted "model": a processor that allows exactly one token per step ---- */

typedef struct script {
    const int32_t *ids;
    size_t n;
    size_t n_prompt;
    int calls, released;
} script;

static lm_status script_fn(void *user, const int32_t *history, size_t n_history, float *logits, size_t n_vocab) {
    script *s = user;
    size_t step = n_history - s->n_prompt;
    int32_t want = step < s->n ? s->ids[step] : TOK_IM_END;
    for (size_t i = 0; i < n_vocab; i++) logits[i] = (int32_t)i == want ? 0.0f : -INFINITY;
    s->calls++;
    (void)history;
    return LM_OK;
}

/* Generates with a script forcing `text`'s bytes as tokens; returns the output text
 * (malloc'd) and the finish reason; each step's text is also checked to be what the
 * callback form delivers. */
typedef struct collect {
    char buf[4096];
    size_t len;
    int steps;
    lm_finish_reason finish;
    int stop_after; /* callback returns false after this many steps (0 = never) */
} collect;

static bool collect_fn(const lm_step *s, void *user) {
    collect *c = user;
    CHECK(c->len + s->text_len < sizeof c->buf);
    memcpy(c->buf + c->len, s->text, s->text_len);
    c->len += s->text_len;
    c->buf[c->len] = '\0';
    c->steps++;
    c->finish = s->finish;
    CHECK(strlen(s->text) == s->text_len || memchr(s->text, 0, s->text_len));
    return !(c->stop_after && c->steps >= c->stop_after);
}

static lm_finish_reason run_script(lm_context *ctx, const char *forced, const char *const *stops, size_t n_stops,
                                   char *out, size_t cap) {
    int32_t prompt[1] = {'a'};
    int32_t ids[256];
    size_t n = strlen(forced);
    for (size_t i = 0; i < n; i++) ids[i] = (unsigned char)forced[i];
    script s = {ids, n, 1, 0, 0};
    lm_logits_processor proc = {script_fn, &s};
    lm_generate_params gp = lm_generate_default_params();
    gp.sampling.processors = &proc;
    gp.sampling.n_processors = 1;
    gp.stop = stops;
    gp.n_stop = n_stops;
    gp.max_tokens = (int32_t)n + 5;
    /* iterator form */
    lm_request *r = NULL;
    CHECK(lm_request_start(ctx, prompt, 1, &gp, &r) == LM_OK);
    size_t len = 0;
    lm_step st;
    lm_finish_reason why = LM_FINISH_NONE;
    while (r && lm_request_next(r, &st) == LM_OK) {
        CHECK(len + st.text_len < cap);
        memcpy(out + len, st.text, st.text_len);
        len += st.text_len;
        if ((why = st.finish)) break;
    }
    out[len] = '\0';
    lm_request_free(r);
    /* callback form: same text, same reason */
    s.calls = 0;
    collect c = {.len = 0};
    lm_stats stats;
    CHECK(lm_generate(ctx, prompt, 1, &gp, collect_fn, &c, &stats) == LM_OK);
    CHECK(c.len == len && memcmp(c.buf, out, len) == 0);
    CHECK(c.finish == why && stats.finish == why);
    return why;
}

static void test_bad_input(void) {
    lm_model *m = NULL;
    lm_model_params p = small_params();
    CHECK(lm_model_load("/nonexistent/model.gguf", p, &m) == LM_ERR_NOT_FOUND && !m);
    CHECK(strstr(lm_last_error(), "/nonexistent/model.gguf") != NULL);
    CHECK(lm_model_load("no-such-model-name", p, &m) == LM_ERR_NOT_FOUND);
    CHECK(lm_model_load("", p, &m) == LM_ERR_INVALID_ARG);
    CHECK(lm_model_load(NULL, p, &m) == LM_ERR_INVALID_ARG);
    CHECK(lm_model_load(g_path, p, NULL) == LM_ERR_INVALID_ARG);
    p.n_threads = -1;
    CHECK(lm_model_load(g_path, p, &m) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "n_threads"));
    p = small_params();
    p.n_ctx = -5;
    CHECK(lm_model_load(g_path, p, &m) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "n_ctx"));
    p = small_params();
    p.backend = "tpu";
    CHECK(lm_model_load(g_path, p, &m) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "tpu"));
    /* without a CUDA build or a GPU: a clear "unsupported" naming CUDA; with one, it loads */
    p.backend = "cuda";
    lm_status cuda_st = lm_model_load(g_path, p, &m);
    CHECK(cuda_st == LM_ERR_UNSUPPORTED ? strstr(lm_last_error(), "CUDA") != NULL : cuda_st == LM_OK);
    if (cuda_st == LM_OK) lm_model_free(m);
    p = small_params();
    p.kv_type = (lm_kv_type)7;
    CHECK(lm_model_load(g_path, p, &m) == LM_ERR_INVALID_ARG);
    p = small_params();
    p.memory_limit = 1000; /* bytes: less than the weights */
    CHECK(lm_model_load(g_path, p, &m) == LM_ERR_NO_MEMORY && strstr(lm_last_error(), "memory limit"));
    CHECK(!m);

    /* a Hugging Face folder without tokenizer.json: a clear error naming it */
    char hf[512];
    snprintf(hf, sizeof hf, "%s/hf", g_dir);
    tiny_model tq;
    tiny_build(&tq, tiny_default(LM_ARCH_QWEN2));
    CHECK(tiny_write_hf(&tq, hf) == LM_OK);
    tiny_free(&tq);
    CHECK(lm_model_load(hf, small_params(), &m) == LM_ERR_NOT_FOUND && !m);
    CHECK(strstr(lm_last_error(), "tokenizer.json") != NULL);
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf '%s'", hf);
    CHECK(system(rm) == 0);

    m = load(small_params());
    if (!m) return;
    lm_context *ctx = NULL;
    lm_context_params cp = lm_context_default_params();
    cp.n_ctx = -1;
    CHECK(lm_context_create(m, cp, &ctx) == LM_ERR_INVALID_ARG && !ctx);
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    CHECK(lm_context_n_ctx(ctx) == 128);
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = 'a' + i % 26;
    lm_generate_params gp = lm_generate_default_params();
    lm_request *r = NULL;
    /* empty prompt */
    CHECK(lm_request_start(ctx, prompt, 0, &gp, &r) == LM_ERR_INVALID_ARG && !r);
    CHECK(strstr(lm_last_error(), "empty") != NULL);
    CHECK(lm_request_start(ctx, NULL, 3, &gp, &r) == LM_ERR_INVALID_ARG);
    /* longer than the context, and exactly as long */
    CHECK(lm_request_start(ctx, prompt, 200, &gp, &r) == LM_ERR_LIMIT && strstr(lm_last_error(), "200 tokens"));
    CHECK(lm_request_start(ctx, prompt, 128, &gp, &r) == LM_ERR_LIMIT);
    /* a token outside the vocabulary */
    int32_t bad[2] = {5, N_VOCAB};
    CHECK(lm_request_start(ctx, bad, 2, &gp, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "vocabulary"));
    bad[1] = -1;
    CHECK(lm_request_start(ctx, bad, 2, &gp, &r) == LM_ERR_INVALID_ARG);
    /* invalid sampling and generation parameters, each named */
    lm_generate_params q = gp;
    q.sampling.temperature = -1.0f;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "temperature"));
    q = gp;
    q.sampling.top_p = 0.0f;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "top_p"));
    q.sampling.top_p = 1.5f;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG);
    q = gp;
    q.sampling.top_k = -2;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "top_k"));
    q = gp;
    q.sampling.min_p = 2.0f;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "min_p"));
    q = gp;
    q.sampling.repetition_penalty = 0.0f;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG);
    q = gp;
    lm_logit_bias lb = {N_VOCAB + 3, 1.0f};
    q.sampling.logit_bias = &lb;
    q.sampling.n_logit_bias = 1;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG);
    q = gp;
    q.max_tokens = -2;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "max_tokens"));
    q = gp;
    q.top_logprobs = LM_MAX_TOP_LOGPROBS + 1;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "top_logprobs"));
    q = gp;
    const char *empty_stop[] = {"ok", ""};
    q.stop = empty_stop;
    q.n_stop = 2;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "stop"));
    q.stop = NULL;
    CHECK(lm_request_start(ctx, prompt, 3, &q, &r) == LM_ERR_INVALID_ARG);
    CHECK(r == NULL);
    /* one request at a time per context */
    lm_request *r2 = NULL;
    CHECK(lm_request_start(ctx, prompt, 3, &gp, &r) == LM_OK);
    CHECK(lm_request_start(ctx, prompt, 3, &gp, &r2) == LM_ERR_INVALID_ARG && !r2);
    lm_request_free(r);
    CHECK(lm_request_start(ctx, prompt, 3, &gp, &r2) == LM_OK);
    lm_request_free(r2);
    /* NULLs */
    lm_step s;
    CHECK(lm_request_next(NULL, &s) == LM_ERR_INVALID_ARG);
    lm_stats stats;
    CHECK(lm_request_stats(NULL, &stats) == LM_ERR_INVALID_ARG);
    lm_request_cancel(NULL);
    lm_request_free(NULL);
    lm_context_free(NULL);
    lm_model_free(NULL);
    /* lm_generate reports start errors with an error finish */
    CHECK(lm_generate(ctx, prompt, 0, &gp, NULL, NULL, &stats) == LM_ERR_INVALID_ARG);
    CHECK(stats.finish == LM_FINISH_ERROR && stats.n_generated_tokens == 0);
    lm_context_free(ctx);
    /* the memory limit counts contexts too */
    p = small_params();
    lm_model *m2 = NULL;
    uint64_t weights = lm_model_weight_bytes(m), kv = lm_model_kv_bytes(m, 128, LM_KV_F16);
    p.memory_limit = weights + kv + kv / 2; /* room for one context, not two */
    CHECK(lm_model_load(g_path, p, &m2) == LM_OK);
    lm_context *c1 = NULL, *c2 = NULL;
    CHECK(lm_context_create(m2, lm_context_default_params(), &c1) == LM_OK);
    CHECK(lm_context_create(m2, lm_context_default_params(), &c2) == LM_ERR_NO_MEMORY && !c2);
    lm_context_free(c1);
    CHECK(lm_context_create(m2, lm_context_default_params(), &c2) == LM_OK);
    lm_context_free(c2);
    lm_model_free(m2);
    lm_model_free(m);
}

static void test_tokens_and_chat(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    CHECK(lm_model_n_vocab(m) == N_VOCAB);
    CHECK(lm_model_n_ctx(m) == 128);
    CHECK(strcmp(lm_model_arch(m), "llama") == 0);
    CHECK(lm_token_eos(m) == TOK_IM_END && lm_token_is_eog(m, TOK_IM_END) && !lm_token_is_eog(m, 'a'));
    int32_t ids[64];
    size_t n = tokenize(m, "a test", 0, ids, 64);
    CHECK(n == 5 && ids[0] == 'a' && ids[1] == TOK_T && ids[4] == 't');
    size_t need = 0;
    CHECK(lm_tokenize(m, "a test", 6, 0, NULL, 0, &need) == LM_OK && need == 5);
    n = tokenize(m, "<|im_start|>x", LM_TOKENIZE_PARSE_SPECIAL, ids, 64);
    CHECK(n == 2 && ids[0] == TOK_IM_START);
    n = tokenize(m, "<|im_start|>x", 0, ids, 64);
    CHECK(n > 2);
    CHECK(lm_tokenize(m, "x", 1, 0x80, ids, 64, &n) == LM_ERR_INVALID_ARG);
    char buf[64];
    size_t len = 0;
    int32_t t[3] = {TOK_IM_START, 'h', 'i'};
    CHECK(lm_detokenize(m, t, 3, 0, buf, sizeof buf, &len) == LM_OK && len == 2 && strcmp(buf, "hi") == 0);
    CHECK(lm_detokenize(m, t, 3, LM_DETOKENIZE_UNPARSE_SPECIAL, buf, sizeof buf, &len) == LM_OK &&
          strcmp(buf, "<|im_start|>hi") == 0);
    CHECK(lm_detokenize(m, t, 3, LM_DETOKENIZE_UNPARSE_SPECIAL, buf, 4, &len) == LM_OK && len == 14);
    int32_t badt = 999;
    CHECK(lm_detokenize(m, &badt, 1, 0, buf, sizeof buf, &len) == LM_ERR_INVALID_ARG);

    /* chat */
    CHECK(lm_model_has_chat_template(m));
    lm_chat_message msgs[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    char out[256];
    CHECK(lm_chat_render(m, msgs, 2, lm_chat_default_params(), out, sizeof out, &len) == LM_OK);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    CHECK(len == strlen(want) && strcmp(out, want) == 0);
    /* needed-size convention */
    CHECK(lm_chat_render(m, msgs, 2, lm_chat_default_params(), out, 10, &len) == LM_OK && len == strlen(want));
    CHECK(memcmp(out, want, 10) == 0);
    lm_chat_params cp = lm_chat_default_params();
    cp.add_generation_prompt = false;
    CHECK(lm_chat_render(m, msgs + 1, 1, cp, out, sizeof out, &len) == LM_OK &&
          strcmp(out, "<|im_start|>user\nHi<|im_end|>\n") == 0);
    CHECK(lm_chat_render_json(m, "[{\"role\":\"user\",\"content\":\"Yo\"}]", cp, out, sizeof out, &len) == LM_OK &&
          strcmp(out, "<|im_start|>user\nYo<|im_end|>\n") == 0);
    cp.template_source = "{{ messages[0].content | upper }}";
    CHECK(lm_chat_render(m, msgs, 2, cp, out, sizeof out, &len) == LM_OK && strcmp(out, "BE BRIEF.") == 0);
    cp.template_source = "{% if %}";
    CHECK(lm_chat_render(m, msgs, 2, cp, out, sizeof out, &len) == LM_ERR_FORMAT);
    lm_chat_message bad_msg = {"user", NULL};
    CHECK(lm_chat_render(m, &bad_msg, 1, lm_chat_default_params(), out, sizeof out, &len) == LM_ERR_INVALID_ARG);
    CHECK(lm_chat_render_json(m, "not json", lm_chat_default_params(), out, sizeof out, &len) != LM_OK);
    lm_model_free(m);
}

/* Greedy through the API equals an argmax loop over the internal forward pass. */
static void test_greedy_matches_forward(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    int32_t prompt[6] = {'H', 'e', 'l', 'l', 'o', TOK_T};
    enum { N = 20 };
    int32_t want[N];
    lm_kv_cache *kv = NULL;
    CHECK(lm_kv_cache_for_model(m->m, 64, 1, LM_DTYPE_F16, &kv) == LM_OK);
    float *logits = malloc(sizeof(float) * N_VOCAB);
    int32_t pos[6] = {0, 1, 2, 3, 4, 5}, seq[6] = {0};
    lm_batch b = {6, prompt, pos, seq, NULL};
    CHECK(lm_forward(m->m, kv, &b, logits) == LM_OK);
    for (int i = 0; i < N; i++) {
        int32_t best = 0;
        for (int32_t t = 1; t < N_VOCAB; t++)
            if (logits[t] > logits[best]) best = t;
        want[i] = best;
        int32_t p = 6 + i, s0 = 0;
        lm_batch step = {1, &best, &p, &s0, NULL};
        CHECK(lm_forward(m->m, kv, &step, logits) == LM_OK);
    }
    lm_kv_cache_free(kv);
    free(logits);

    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    lm_generate_params gp = lm_generate_default_params();
    gp.sampling.temperature = 0.0f;
    gp.max_tokens = N;
    gp.ignore_eos = true;
    gp.logprobs = true;
    gp.top_logprobs = 3;
    lm_request *r = NULL;
    CHECK(lm_request_start(ctx, prompt, 6, &gp, &r) == LM_OK);
    lm_step s;
    int n = 0;
    while (lm_request_next(r, &s) == LM_OK) {
        CHECK(n < N && s.token == want[n]);
        CHECK(s.n_top_logprobs == 3 && s.top_logprobs[0].token == s.token);
        CHECK(s.logprob <= 0.0f && s.logprob == s.top_logprobs[0].logprob);
        CHECK(s.top_logprobs[1].logprob <= s.top_logprobs[0].logprob);
        n++;
        if (s.finish) break;
    }
    CHECK(n == N && s.finish == LM_FINISH_LENGTH);
    /* after the end: the same reason, no token */
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_LENGTH && s.token == -1 && s.text_len == 0);
    lm_stats st;
    CHECK(lm_request_stats(r, &st) == LM_OK);
    CHECK(st.n_prompt_tokens == 6 && st.n_generated_tokens == N && st.n_cached_tokens == 0);
    CHECK(st.finish == LM_FINISH_LENGTH && st.peak_rss_bytes > 0 && st.kv_cache_bytes > 0);
    CHECK(isfinite(st.prompt_tps) && isfinite(st.generation_tps) && st.ttft_s >= 0 && st.total_s >= st.ttft_s);
    lm_request_free(r);

    /* the next request extends the cached tokens: only the new ones are computed,
     * and the result is the same as from scratch */
    int32_t longer[6 + N + 2];
    memcpy(longer, prompt, sizeof prompt);
    memcpy(longer + 6, want, sizeof want);
    longer[6 + N] = 'x';
    longer[6 + N + 1] = 'y';
    gp.max_tokens = 5;
    gp.logprobs = false;
    gp.top_logprobs = 0;
    int32_t a[5], c[5];
    CHECK(lm_request_start(ctx, longer, 6 + N + 2, &gp, &r) == LM_OK);
    for (int i = 0; i < 5 && lm_request_next(r, &s) == LM_OK; i++) {
        a[i] = s.token;
        CHECK(s.n_top_logprobs == 0 && s.logprob == 0.0f);
    }
    CHECK(lm_request_stats(r, &st) == LM_OK && st.n_cached_tokens == 6 + N - 1);
    lm_request_free(r);
    lm_context *fresh = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &fresh) == LM_OK);
    CHECK(lm_request_start(fresh, longer, 6 + N + 2, &gp, &r) == LM_OK);
    for (int i = 0; i < 5 && lm_request_next(r, &s) == LM_OK; i++) c[i] = s.token;
    lm_request_free(r);
    CHECK(memcmp(a, c, sizeof a) == 0);
    /* a shorter, different prompt in the used context, and after a reset */
    CHECK(lm_request_start(ctx, prompt, 3, &gp, &r) == LM_OK);
    for (int i = 0; i < 5 && lm_request_next(r, &s) == LM_OK; i++) a[i] = s.token;
    CHECK(lm_request_stats(r, &st) == LM_OK && st.n_cached_tokens == 2);
    lm_request_free(r);
    lm_context_reset(ctx);
    CHECK(lm_request_start(ctx, prompt, 3, &gp, &r) == LM_OK);
    for (int i = 0; i < 5 && lm_request_next(r, &s) == LM_OK; i++) c[i] = s.token;
    CHECK(lm_request_stats(r, &st) == LM_OK && st.n_cached_tokens == 0);
    lm_request_free(r);
    CHECK(memcmp(a, c, sizeof a) == 0);
    lm_context_free(fresh);
    lm_context_free(ctx);
    lm_model_free(m);
}

/* Same seed, same tokens: also when two requests advance interleaved. */
static void test_seeds(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    lm_context *c1 = NULL, *c2 = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &c1) == LM_OK);
    CHECK(lm_context_create(m, lm_context_default_params(), &c2) == LM_OK);
    int32_t prompt[3] = {'a', 'b', 'c'};
    lm_generate_params gp = lm_generate_default_params();
    gp.sampling.temperature = 100.0f; /* the tiny model is very sure of itself */
    gp.sampling.seed = 42;
    gp.max_tokens = 24;
    gp.ignore_eos = true;
    int32_t alone[24], x[24], y[24];
    lm_request *r = NULL, *r2 = NULL;
    lm_step s;
    CHECK(lm_request_start(c1, prompt, 3, &gp, &r) == LM_OK);
    for (int i = 0; i < 24 && lm_request_next(r, &s) == LM_OK; i++) alone[i] = s.token;
    lm_request_free(r);
    lm_context_reset(c1);
    CHECK(lm_request_start(c1, prompt, 3, &gp, &r) == LM_OK);
    gp.sampling.seed = 7;
    CHECK(lm_request_start(c2, prompt, 3, &gp, &r2) == LM_OK);
    for (int i = 0; i < 24; i++) {
        CHECK(lm_request_next(r, &s) == LM_OK);
        x[i] = s.token;
        CHECK(lm_request_next(r2, &s) == LM_OK);
        y[i] = s.token;
    }
    lm_request_free(r);
    lm_request_free(r2);
    CHECK(memcmp(alone, x, sizeof x) == 0);
    CHECK(memcmp(alone, y, sizeof y) != 0);
    lm_context_free(c1);
    lm_context_free(c2);
    lm_model_free(m);
}

/* Stop strings through the whole pipeline: forced byte tokens, decoded, matched. */
static void test_stops(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    char out[512];
    const char *s1[] = {"END"};
    CHECK(run_script(ctx, "hello END world", s1, 1, out, sizeof out) == LM_FINISH_STOP && strcmp(out, "hello ") == 0);
    /* at the very start */
    CHECK(run_script(ctx, "ENDx", s1, 1, out, sizeof out) == LM_FINISH_STOP && strcmp(out, "") == 0);
    /* a partial match at the end of the stream is released, not lost */
    CHECK(run_script(ctx, "abcEN", s1, 1, out, sizeof out) == LM_FINISH_EOS && strcmp(out, "abcEN") == 0);
    /* overlapping candidates: the one that ends first wins */
    const char *s2[] = {"abcd", "bc"};
    CHECK(run_script(ctx, "xabcd", s2, 2, out, sizeof out) == LM_FINISH_STOP && strcmp(out, "xa") == 0);
    /* inside a multi-byte character: é = C3 A9, split over two byte tokens */
    const char *s3[] = {"\xC3\xA9t"};
    CHECK(run_script(ctx, "caf\xC3\xA9t\xC3\xA9", s3, 1, out, sizeof out) == LM_FINISH_STOP &&
          strcmp(out, "caf") == 0);
    /* a stop string equal to a special token's text does not match the token (it is
     * not rendered), only the text */
    const char *s4[] = {"<|im_end|>"};
    CHECK(run_script(ctx, "ok<|im_end|>more", s4, 1, out, sizeof out) == LM_FINISH_STOP && strcmp(out, "ok") == 0);
    /* no stops: the end token after the script ends it, every byte out */
    CHECK(run_script(ctx, "plain", NULL, 0, out, sizeof out) == LM_FINISH_EOS && strcmp(out, "plain") == 0);
    lm_context_free(ctx);
    lm_model_free(m);
}

/* The end token, max_tokens 0 and 1, a full context. */
static void test_lengths(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    lm_context *ctx = NULL;
    lm_context_params cp = lm_context_default_params();
    cp.n_ctx = 16;
    CHECK(lm_context_create(m, cp, &ctx) == LM_OK);
    int32_t prompt[10];
    for (int i = 0; i < 10; i++) prompt[i] = 'a' + i;
    lm_generate_params gp = lm_generate_default_params();
    gp.sampling.temperature = 0.0f;
    gp.ignore_eos = true;
    gp.max_tokens = -1;
    lm_stats st;
    collect c = {.len = 0};
    CHECK(lm_generate(ctx, prompt, 10, &gp, collect_fn, &c, &st) == LM_OK);
    CHECK(st.finish == LM_FINISH_LENGTH && st.n_generated_tokens == 16 - 10 + 1 && c.steps == 7);
    /* max_tokens 0: nothing generated, nothing computed, rates 0 */
    gp.max_tokens = 0;
    c = (collect){.len = 0};
    CHECK(lm_generate(ctx, prompt, 10, &gp, collect_fn, &c, &st) == LM_OK);
    CHECK(st.finish == LM_FINISH_LENGTH && st.n_generated_tokens == 0 && c.steps == 1 && c.len == 0);
    CHECK(st.prompt_tps == 0.0 && st.generation_tps == 0.0 && st.ttft_s == 0.0);
    /* max_tokens 1: one token, no generation rate */
    gp.max_tokens = 1;
    CHECK(lm_generate(ctx, prompt, 10, &gp, NULL, NULL, &st) == LM_OK);
    CHECK(st.finish == LM_FINISH_LENGTH && st.n_generated_tokens == 1 && st.generation_tps == 0.0);
    CHECK(isfinite(st.prompt_tps) && st.ttft_s > 0.0);
    /* an end token forced by a bias ends the generation at once */
    gp.ignore_eos = false;
    gp.max_tokens = 10;
    lm_logit_bias b = {TOK_IM_END, 1e30f};
    gp.sampling.logit_bias = &b;
    gp.sampling.n_logit_bias = 1;
    lm_request *r = NULL;
    lm_step s;
    CHECK(lm_request_start(ctx, prompt, 10, &gp, &r) == LM_OK);
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_EOS && s.token == TOK_IM_END && s.text_len == 0);
    lm_request_free(r);
    /* ... unless ignored */
    gp.ignore_eos = true;
    gp.max_tokens = 3;
    CHECK(lm_generate(ctx, prompt, 10, &gp, NULL, NULL, &st) == LM_OK);
    CHECK(st.finish == LM_FINISH_LENGTH && st.n_generated_tokens == 3);
    lm_context_free(ctx);
    lm_model_free(m);
}

typedef struct canceller {
    lm_request *req;
    int delay_us;
} canceller;

static void *cancel_thread(void *arg) {
    canceller *c = arg;
    if (c->delay_us) usleep((useconds_t)c->delay_us);
    lm_request_cancel(c->req);
    return NULL;
}

static void test_cancel(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    int32_t prompt[4] = {'a', 'b', 'c', 'd'};
    lm_generate_params gp = lm_generate_default_params();
    gp.sampling.seed = 1;
    gp.ignore_eos = true;
    gp.max_tokens = -1;
    lm_request *r = NULL;
    lm_step s;
    lm_stats st;
    /* before the start: no token, nothing computed */
    CHECK(lm_request_start(ctx, prompt, 4, &gp, &r) == LM_OK);
    lm_request_cancel(r);
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_CANCELLED && s.token == -1);
    CHECK(lm_request_stats(r, &st) == LM_OK && st.n_generated_tokens == 0 && st.finish == LM_FINISH_CANCELLED);
    CHECK(st.prompt_tps == 0.0 && st.generation_tps == 0.0);
    lm_request_free(r);
    /* from another thread, mid-stream */
    CHECK(lm_request_start(ctx, prompt, 4, &gp, &r) == LM_OK);
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_NONE);
    canceller c = {r, 0};
    pthread_t th;
    pthread_create(&th, NULL, cancel_thread, &c);
    pthread_join(th, NULL);
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_CANCELLED);
    lm_request_cancel(r); /* after the end: harmless */
    lm_request_free(r);
    /* from another thread while the caller loops (no max_tokens: the context ends it
     * at worst) */
    CHECK(lm_request_start(ctx, prompt, 4, &gp, &r) == LM_OK);
    c = (canceller){r, 2000};
    pthread_create(&th, NULL, cancel_thread, &c);
    int steps = 0;
    while (lm_request_next(r, &s) == LM_OK && !s.finish) steps++;
    pthread_join(th, NULL);
    CHECK(s.finish == LM_FINISH_CANCELLED || s.finish == LM_FINISH_LENGTH);
    lm_request_free(r);
    /* the callback says stop */
    collect col = {.len = 0, .stop_after = 3};
    CHECK(lm_generate(ctx, prompt, 4, &gp, collect_fn, &col, &st) == LM_OK);
    CHECK(col.steps == 3 && st.finish == LM_FINISH_CANCELLED && st.n_generated_tokens == 3);
    /* free while running */
    CHECK(lm_request_start(ctx, prompt, 4, &gp, &r) == LM_OK);
    CHECK(lm_request_next(r, &s) == LM_OK);
    lm_request_free(r);
    CHECK(lm_request_start(ctx, prompt, 4, &gp, &r) == LM_OK);
    lm_request_free(r);
    lm_context_free(ctx);
    lm_model_free(m);
}

/* Processors see the history and rewrite logits; a factory builds one per request. */
typedef struct factory_state {
    int built, released;
    script s;
} factory_state;

static lm_status build_proc(void *user, const lm_model *model, lm_logits_processor *out) {
    factory_state *f = user;
    if (lm_model_n_vocab(model) != N_VOCAB) return LM_ERR_INTERNAL;
    f->built++;
    *out = (lm_logits_processor){script_fn, &f->s};
    return LM_OK;
}

static void release_proc(void *user, lm_logits_processor *p) {
    factory_state *f = user;
    CHECK(p->user == &f->s);
    f->released++;
}

static lm_status failing_proc(void *user, const int32_t *h, size_t n, float *logits, size_t nv) {
    (void)user, (void)h, (void)n, (void)logits, (void)nv;
    return LM_ERR_INTERNAL;
}

static void test_processors(void) {
    lm_model *m = load(small_params());
    if (!m) return;
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    int32_t prompt[2] = {'q', 'r'};
    int32_t forced[3] = {'x', 'y', 'z'};
    factory_state f = {0, 0, {forced, 3, 2, 0, 0}};
    lm_generate_params gp = lm_generate_default_params();
    gp.processor_factory = (lm_logits_processor_factory){build_proc, release_proc, &f};
    collect c = {.len = 0};
    lm_stats st;
    CHECK(lm_generate(ctx, prompt, 2, &gp, collect_fn, &c, &st) == LM_OK);
    CHECK(strcmp(c.buf, "xyz") == 0 && st.finish == LM_FINISH_EOS && st.n_generated_tokens == 4);
    CHECK(f.built == 1 && f.released == 1 && f.s.calls == 4);
    /* a processor's error ends the request with that status */
    lm_logits_processor bad = {failing_proc, NULL};
    gp = lm_generate_default_params();
    gp.sampling.processors = &bad;
    gp.sampling.n_processors = 1;
    lm_request *r = NULL;
    lm_step s;
    CHECK(lm_request_start(ctx, prompt, 2, &gp, &r) == LM_OK);
    CHECK(lm_request_next(r, &s) == LM_ERR_INTERNAL && s.finish == LM_FINISH_ERROR);
    CHECK(lm_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_ERROR);
    lm_request_free(r);
    lm_context_free(ctx);
    lm_model_free(m);
}

static bool finite_stats(const lm_stats *s) {
    return isfinite(s->prompt_tps) && isfinite(s->generation_tps) && s->prompt_tps >= 0 && s->generation_tps >= 0;
}

static void test_stats_rates(void) {
    lm_stats s = {0};
    lm_stats_update_rates(&s);
    CHECK(s.prompt_tps == 0.0 && s.generation_tps == 0.0);
    /* zero elapsed time with tokens */
    s = (lm_stats){.n_prompt_tokens = 10, .n_generated_tokens = 5};
    lm_stats_update_rates(&s);
    CHECK(finite_stats(&s) && s.prompt_tps == 0.0 && s.generation_tps == 0.0);
    /* one token: no rate after the first */
    s = (lm_stats){.n_prompt_tokens = 10, .n_generated_tokens = 1, .prompt_s = 0.5, .generation_s = 0.0};
    lm_stats_update_rates(&s);
    CHECK(s.prompt_tps == 20.0 && s.generation_tps == 0.0);
    /* all of the prompt cached: no prompt rate */
    s = (lm_stats){.n_prompt_tokens = 10, .n_cached_tokens = 10, .prompt_s = 0.0};
    lm_stats_update_rates(&s);
    CHECK(s.prompt_tps == 0.0);
    /* ordinary */
    s = (lm_stats){.n_prompt_tokens = 8, .n_cached_tokens = 4, .n_generated_tokens = 11, .prompt_s = 2.0,
                   .generation_s = 5.0};
    lm_stats_update_rates(&s);
    CHECK(s.prompt_tps == 2.0 && s.generation_tps == 2.0);
    /* absurd inputs stay finite */
    s = (lm_stats){.n_prompt_tokens = 8, .n_generated_tokens = 3, .prompt_s = NAN, .generation_s = INFINITY};
    lm_stats_update_rates(&s);
    CHECK(finite_stats(&s));
    s = (lm_stats){.n_prompt_tokens = 8, .n_generated_tokens = 3, .prompt_s = 1e-320, .generation_s = -1.0};
    lm_stats_update_rates(&s);
    CHECK(finite_stats(&s));
    lm_stats_update_rates(NULL);
    CHECK(strcmp(lm_finish_reason_str(LM_FINISH_STOP), "stop") == 0);
    CHECK(strcmp(lm_finish_reason_str(LM_FINISH_NONE), "") == 0);
    CHECK(strcmp(lm_finish_reason_str((lm_finish_reason)99), "") == 0);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_generate_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_path, sizeof g_path, "%s/tiny.gguf", g_dir);
    tiny_model tm;
    tiny_spec spec = tiny_default(LM_ARCH_LLAMA);
    spec.n_vocab = N_VOCAB;
    tiny_build(&tm, spec);
    CHECK(tiny_write_gguf_ex(&tm, g_path, NULL, add_tokenizer, NULL) == LM_OK);
    tiny_free(&tm);
    lm_set_log_callback(NULL, NULL);

    test_bad_input();
    test_tokens_and_chat();
    test_greedy_matches_forward();
    test_seeds();
    test_stops();
    test_lengths();
    test_cancel();
    test_processors();
    test_stats_rates();

    unlink(g_path);
    rmdir(g_dir);
    TEST_MAIN_END();
}
