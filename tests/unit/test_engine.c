/* The engine on a tiny random-weight llama model with a byte-level vocabulary and a
 * ChatML template: bad input (zero batch size, a model that fails to load, a
 * conversation without the prefix, an empty list, a KV budget too small), jobs and
 * futures, streaming requests equal to the standalone generator token for token,
 * many requests batched together equal each alone, prefix-cache hits equal misses,
 * the prefix messages computed once (prefill counts), admission waiting for room,
 * preemption when running sequences outgrow the pool (outputs unchanged),
 * cancellation freeing blocks, processors from the engine's factory. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "engine/engine.h"
#include "lumen.h"
#include "test.h"
#include "tiny_model.h"
#include "tiny_tokenizer.h"


static char g_dir[256], g_path[512];

static lm_engine_params small_params(void) {
    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = 1;
    p.model.n_ctx = 256;
    p.batch_size = 4;
    p.max_batch_tokens = 32;
    return p;
}

static lm_engine *open_engine(lm_engine_params p) {
    lm_engine *e = NULL;
    CHECK(lm_engine_create(g_path, &p, &e) == LM_OK);
    lm_status st = lm_engine_wait_loaded(e);
    if (st) fprintf(stderr, "load: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    return e;
}

/* greedy, never stopping at the end token: every step a token */
static lm_generate_params greedy(int max_tokens) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    return g;
}

/* runs a request to the end; returns the token count and writes the tokens */
static int run_request(lm_engine_request *r, int32_t *toks, int cap, lm_finish_reason *why) {
    int n = 0;
    lm_step s;
    do {
        lm_status st = lm_engine_request_next(r, &s);
        if (st) {
            fprintf(stderr, "next: %s\n", lm_last_error());
            CHECK(st == LM_OK);
            break;
        }
        if (s.token >= 0 && n < cap) toks[n++] = s.token;
    } while (s.finish == LM_FINISH_NONE);
    if (why) *why = s.finish;
    return n;
}

static void make_prompt(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = (i * 31 + salt * 17 + 7) % N_BYTES;
}

/* ---- bad input ---- */

static lm_status job_never(lm_engine *e, void *arg, void **result) {
    (void)e;
    (void)result;
    *(int *)arg = 1;
    return LM_OK;
}

static void test_bad_input(void) {
    lm_engine *e = NULL;
    lm_engine_params p = small_params();
    p.batch_size = 0;
    CHECK(lm_engine_create(g_path, &p, &e) == LM_ERR_INVALID_ARG && !e);
    CHECK(strstr(lm_last_error(), "batch_size") != NULL);
    p = small_params();
    p.max_batch_tokens = -3;
    CHECK(lm_engine_create(g_path, &p, &e) == LM_ERR_INVALID_ARG);
    CHECK(lm_engine_create(NULL, NULL, &e) == LM_ERR_INVALID_ARG);

    /* a model that fails to load: the error comes from wait_loaded and every later call */
    p = small_params();
    CHECK(lm_engine_create("/nonexistent/model.gguf", &p, &e) == LM_OK && e);
    lm_status st = lm_engine_wait_loaded(e);
    CHECK(st != LM_OK);
    char first[512];
    snprintf(first, sizeof first, "%s", lm_last_error());
    CHECK(strstr(first, "nonexistent") != NULL);
    CHECK(lm_engine_wait_loaded(e) == st && strcmp(lm_last_error(), first) == 0);
    lm_future *f = NULL;
    CHECK(lm_engine_submit(e, (lm_engine_job_fn)NULL, NULL, &f) == LM_ERR_INVALID_ARG);
    int ran = 0;
    CHECK(lm_engine_submit(e, job_never, &ran, &f) == st && !f && !ran);
    CHECK(strcmp(lm_last_error(), first) == 0);
    CHECK(lm_engine_model(e) == NULL);
    int32_t tok[3] = {1, 2, 3};
    lm_engine_request *r = NULL;
    CHECK(lm_engine_request_start(e, tok, 3, NULL, &r) == st && !r);
    CHECK(strcmp(lm_last_error(), first) == 0);
    lm_chat_message m = {"user", "hi"};
    CHECK(lm_engine_request_start_chat(e, &m, 1, NULL, &r) == st && !r);
    CHECK(strcmp(lm_last_error(), first) == 0);
    lm_conversation c = {&m, 1};
    char **texts = NULL;
    CHECK(lm_engine_generate(e, &c, 1, NULL, NULL, NULL, &texts) == st && !texts);
    CHECK(strcmp(lm_last_error(), first) == 0);
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK && es.n_requests == 0 && es.kv_blocks == 0);
    lm_engine_close(e);

    /* the engine works; its requests and generate reject bad input */
    p = small_params();
    lm_chat_message prefix[2] = {{"system", "You are terse."}, {"user", "Say a word."}};
    p.prefix_messages = prefix;
    p.n_prefix_messages = 1;
    e = open_engine(p);
    CHECK(lm_engine_generate(e, &c, 0, NULL, NULL, NULL, &texts) == LM_ERR_INVALID_ARG);
    CHECK(strstr(lm_last_error(), "empty") != NULL);
    CHECK(lm_engine_generate(e, NULL, 3, NULL, NULL, NULL, &texts) == LM_ERR_INVALID_ARG && !texts);
    lm_chat_message good[2] = {{"system", "You are terse."}, {"user", "Hello"}};
    lm_chat_message bad[2] = {{"system", "You are verbose."}, {"user", "Hello"}};
    lm_conversation cs[3] = {{good, 2}, {bad, 2}, {good, 2}};
    CHECK(lm_engine_generate(e, cs, 3, NULL, NULL, NULL, &texts) == LM_ERR_INVALID_ARG && !texts);
    CHECK(strstr(lm_last_error(), "conversation 1 ") != NULL);
    CHECK(strstr(lm_last_error(), "prefix") != NULL);
    lm_conversation only_user = {&m, 1};
    CHECK(lm_engine_generate(e, &only_user, 1, NULL, NULL, NULL, &texts) == LM_ERR_INVALID_ARG);
    CHECK(lm_engine_request_start(e, tok, 0, NULL, &r) == LM_ERR_INVALID_ARG);
    int32_t oov[2] = {1, N_VOCAB + 5};
    CHECK(lm_engine_request_start(e, oov, 2, NULL, &r) == LM_ERR_INVALID_ARG);
    lm_generate_params g = greedy(4);
    g.sampling.top_p = 2.0f;
    CHECK(lm_engine_request_start(e, tok, 3, &g, &r) == LM_ERR_INVALID_ARG);
    int32_t longp[300];
    make_prompt(longp, 300, 1);
    CHECK(lm_engine_request_start(e, longp, 300, NULL, &r) == LM_ERR_LIMIT);
    /* nothing was lost: the engine still answers */
    CHECK(lm_engine_generate(e, cs, 1, NULL, NULL, NULL, &texts) == LM_OK && texts && texts[0]);
    lm_engine_texts_free(texts, 1);
    lm_engine_close(e);

    /* a KV budget too small for one request: a clear error at start, no hang */
    p = small_params();
    p.max_kv_bytes = 1; /* less than a block */
    CHECK(lm_engine_create(g_path, &p, &e) == LM_OK);
    CHECK(lm_engine_wait_loaded(e) == LM_ERR_NO_MEMORY);
    CHECK(strstr(lm_last_error(), "max_kv_bytes") != NULL);
    lm_engine_close(e);
    p = small_params();
    e = open_engine(p);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    uint64_t per_block = es.kv_bytes / (uint64_t)es.kv_blocks;
    lm_engine_close(e);
    p.max_kv_bytes = per_block * 3; /* 48 tokens */
    e = open_engine(p);
    g = greedy(40);
    int32_t p20[20];
    make_prompt(p20, 20, 2);
    CHECK(lm_engine_request_start(e, p20, 20, &g, &r) == LM_ERR_NO_MEMORY && !r);
    CHECK(strstr(lm_last_error(), "KV budget") != NULL);
    g = greedy(-1); /* until max_kv_size (256): cannot fit */
    CHECK(lm_engine_request_start(e, p20, 20, &g, &r) == LM_ERR_NO_MEMORY);
    g = greedy(20); /* 40 tokens fit */
    CHECK(lm_engine_request_start(e, p20, 20, &g, &r) == LM_OK);
    int32_t out[64];
    CHECK(run_request(r, out, 64, NULL) == 20);
    lm_engine_request_free(r);
    /* in a batch: the conversation that cannot fit is named, the others (already
     * queued) are dropped, and the engine still answers */
    char long_text[80];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    lm_chat_message fits[1] = {{"user", "hi"}}, too_long[1] = {{"user", long_text}};
    lm_conversation batch[3] = {{fits, 1}, {fits, 1}, {too_long, 1}};
    g = greedy(4);
    CHECK(lm_engine_generate(e, batch, 3, &g, NULL, NULL, &texts) == LM_ERR_NO_MEMORY && !texts);
    CHECK(strstr(lm_last_error(), "conversation 2") != NULL && strstr(lm_last_error(), "KV budget") != NULL);
    CHECK(lm_engine_generate(e, batch, 2, &g, NULL, NULL, &texts) == LM_OK && texts);
    lm_engine_texts_free(texts, 2);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK && es.n_running == 0 && es.n_waiting == 0);
    lm_engine_close(e);
}

/* ---- jobs ---- */

static lm_status job_add(lm_engine *e, void *arg, void **result) {
    int *x = arg;
    (void)e;
    *x += 1;
    *result = x;
    return LM_OK;
}

static lm_status job_fail(lm_engine *e, void *arg, void **result) {
    (void)e;
    (void)arg;
    (void)result;
    return lm_error(LM_ERR_NOT_FOUND, "the job could not find its thing");
}

static lm_status job_model(lm_engine *e, void *arg, void **result) {
    (void)arg;
    *result = (void *)lm_engine_model(e);
    return LM_OK;
}

static void test_jobs(void) {
    lm_engine *e = NULL;
    lm_engine_params p = small_params();
    CHECK(lm_engine_create(g_path, &p, &e) == LM_OK);
    /* submitted before the load finished: runs after it */
    int x = 41;
    lm_future *f1, *f2, *f3;
    CHECK(lm_engine_submit(e, job_add, &x, &f1) == LM_OK);
    CHECK(lm_engine_submit(e, job_fail, NULL, &f2) == LM_OK);
    CHECK(lm_engine_submit(e, job_model, NULL, &f3) == LM_OK);
    void *res = NULL;
    CHECK(lm_future_wait(f1, &res) == LM_OK && res == &x && x == 42);
    CHECK(lm_future_done(f1));
    CHECK(lm_future_wait(f2, &res) == LM_ERR_NOT_FOUND);
    CHECK(strstr(lm_last_error(), "could not find its thing") != NULL);
    CHECK(lm_future_wait(f3, &res) == LM_OK && res == lm_engine_model(e) && res != NULL);
    lm_future_free(f1);
    lm_future_free(f2);
    /* a future freed before its job ran, and one that outlives the engine */
    lm_future *f4, *f5;
    CHECK(lm_engine_submit(e, job_add, &x, &f4) == LM_OK);
    lm_future_free(f4);
    CHECK(lm_engine_submit(e, job_add, &x, &f5) == LM_OK);
    lm_engine_close(e); /* queued jobs run first */
    CHECK(lm_future_done(f5));
    CHECK(lm_future_wait(f5, NULL) == LM_OK && x == 44);
    lm_future_free(f5);
    lm_future_free(f3);
    CHECK(lm_engine_peak_memory_gb(NULL) > 0.0);

    /* peak memory: the CPU backend has no device memory of its own, so the engine's
     * peak is the process's */
    e = open_engine(small_params());
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK && es.device_peak_bytes == 0);
    double before = lm_engine_peak_memory_gb(NULL), mine = lm_engine_peak_memory_gb(e);
    CHECK(before > 0.0 && before <= mine && mine <= lm_engine_peak_memory_gb(NULL));
    lm_engine_close(e);
}

/* ---- generation ---- */

/* the standalone generator (lumen.h lm_generate on a context): the reference */
static int reference_tokens(const int32_t *prompt, int n_prompt, int max_tokens, int32_t *out) {
    lm_model_params mp = lm_model_default_params();
    mp.n_threads = 1;
    mp.n_ctx = 256;
    lm_model *m = NULL;
    CHECK(lm_model_load(g_path, mp, &m) == LM_OK);
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    lm_generate_params g = greedy(max_tokens);
    lm_request *r = NULL;
    CHECK(lm_request_start(ctx, prompt, (size_t)n_prompt, &g, &r) == LM_OK);
    int n = 0;
    lm_step s;
    do {
        CHECK(lm_request_next(r, &s) == LM_OK);
        if (s.token >= 0) out[n++] = s.token;
    } while (s.finish == LM_FINISH_NONE);
    lm_request_free(r);
    lm_context_free(ctx);
    lm_model_free(m);
    return n;
}

typedef struct proc_state {
    int built, released, calls;
} proc_state;

static lm_status ban_fn(void *user, const int32_t *h, size_t nh, float *logits, size_t nv) {
    (void)h;
    (void)nh;
    proc_state *ps = user;
    __atomic_add_fetch(&ps->calls, 1, __ATOMIC_RELAXED);
    for (size_t i = 128; i < nv; i++) logits[i] = -INFINITY; /* ASCII only */
    return LM_OK;
}

static lm_status build_ban(void *fu, const lm_model *m, lm_logits_processor *out) {
    (void)m;
    proc_state *ps = fu;
    __atomic_add_fetch(&ps->built, 1, __ATOMIC_RELAXED);
    out->fn = ban_fn;
    out->user = ps;
    return LM_OK;
}

static void release_ban(void *fu, lm_logits_processor *p) {
    (void)p;
    proc_state *ps = fu;
    __atomic_add_fetch(&ps->released, 1, __ATOMIC_RELAXED);
}

static void test_streaming_and_batching(void) {
    enum { N = 10, MAXT = 12 };
    int32_t prompts[N][40], ref[N][MAXT];
    int lens[N], nref[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 5 + i * 3;
        make_prompt(prompts[i], lens[i], i);
        nref[i] = reference_tokens(prompts[i], lens[i], MAXT, ref[i]);
        CHECK(nref[i] == MAXT);
    }
    lm_engine_params p = small_params();
    p.batch_size = 4;
    p.max_batch_tokens = 16; /* several prompts need more than one chunk */
    lm_engine *e = open_engine(p);
    /* one at a time */
    lm_generate_params g = greedy(MAXT);
    for (int i = 0; i < N; i++) {
        lm_engine_request *r = NULL;
        CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &g, &r) == LM_OK);
        int32_t out[MAXT + 4];
        lm_finish_reason why;
        CHECK(run_request(r, out, MAXT + 4, &why) == MAXT && why == LM_FINISH_LENGTH);
        CHECK(memcmp(out, ref[i], sizeof(int32_t) * MAXT) == 0);
        lm_stats st;
        CHECK(lm_engine_request_stats(r, &st) == LM_OK);
        CHECK(st.n_generated_tokens == MAXT && st.n_prompt_tokens == lens[i] && st.finish == LM_FINISH_LENGTH);
        CHECK(isfinite(st.prompt_tps) && isfinite(st.generation_tps));
        lm_engine_request_free(r);
    }
    /* all together (more than batch_size: they wait and join as others leave);
     * the cache now holds every prompt: hits must give the same tokens */
    lm_engine_request *rs[N];
    for (int i = 0; i < N; i++) CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &g, &rs[i]) == LM_OK);
    for (int k = 0; k < N; k++) {
        int i = (k * 7) % N; /* read in any order */
        int32_t out[MAXT + 4];
        CHECK(run_request(rs[i], out, MAXT + 4, NULL) == MAXT);
        CHECK(memcmp(out, ref[i], sizeof(int32_t) * MAXT) == 0);
        lm_stats st;
        lm_engine_request_stats(rs[i], &st);
        CHECK(st.n_cached_tokens == lens[i] - 1); /* all but the last prompt token */
    }
    for (int i = 0; i < N; i++) lm_engine_request_free(rs[i]);
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    CHECK(es.n_requests == 2 * N && es.n_finished == 2 * N);
    CHECK(es.cache_hits >= N && es.cache_hit_rate > 0.0 && es.cache_hit_rate <= 1.0);
    CHECK(es.batch_occupancy > 0.0 && es.batch_occupancy <= 1.0);
    CHECK(es.n_running == 0 && es.n_waiting == 0);
    lm_engine_close(e);

    /* a small pool: one request at a time fits, the others wait (never fail) */
    p = small_params();
    e = open_engine(p);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    uint64_t per_block = es.kv_bytes / (uint64_t)es.kv_blocks;
    lm_engine_close(e);
    p.max_kv_bytes = per_block * 4; /* 64 tokens */
    p.prefix_cache_bytes = per_block;
    e = open_engine(p);
    for (int i = 0; i < N; i++) CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &g, &rs[i]) == LM_OK);
    for (int i = 0; i < N; i++) {
        int32_t out[MAXT + 4];
        CHECK(run_request(rs[i], out, MAXT + 4, NULL) == MAXT);
        CHECK(memcmp(out, ref[i], sizeof(int32_t) * MAXT) == 0);
        lm_engine_request_free(rs[i]);
    }
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    CHECK(es.cache_bytes <= per_block);
    lm_engine_close(e);

    /* cancellation: a long request ends cancelled and its blocks come back */
    p = small_params();
    proc_state ps = {0};
    p.processor_factory = (lm_logits_processor_factory){build_ban, release_ban, &ps};
    e = open_engine(p);
    lm_engine_request *r;
    g = greedy(-1);
    CHECK(lm_engine_request_start(e, prompts[3], (size_t)lens[3], &g, &r) == LM_OK);
    lm_step s;
    for (int i = 0; i < 3; i++) {
        CHECK(lm_engine_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_NONE);
        CHECK(s.token >= 0 && s.token < 128); /* the engine's processor ran */
    }
    lm_engine_request_cancel(r);
    int guard = 0;
    do {
        CHECK(lm_engine_request_next(r, &s) == LM_OK);
    } while (s.finish == LM_FINISH_NONE && ++guard < 1000);
    CHECK(s.finish == LM_FINISH_CANCELLED);
    CHECK(lm_engine_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_CANCELLED && s.token == -1);
    lm_engine_request_free(r);
    /* a request waiting behind a full batch can be cancelled too */
    lm_engine_request *many[6];
    for (int i = 0; i < 6; i++) CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &g, &many[i]) == LM_OK);
    for (int i = 0; i < 6; i++) lm_engine_request_cancel(many[i]);
    for (int i = 0; i < 6; i++) {
        guard = 0;
        do {
            CHECK(lm_engine_request_next(many[i], &s) == LM_OK);
        } while (s.finish == LM_FINISH_NONE && ++guard < 1000);
        CHECK(s.finish == LM_FINISH_CANCELLED);
        lm_engine_request_free(many[i]);
    }
    /* freeing a running request cancels it */
    CHECK(lm_engine_request_start(e, prompts[1], (size_t)lens[1], &g, &r) == LM_OK);
    CHECK(lm_engine_request_next(r, &s) == LM_OK);
    lm_engine_request_free(r);
    /* max_tokens 0: one final step, nothing computed */
    g = greedy(0);
    CHECK(lm_engine_request_start(e, prompts[1], (size_t)lens[1], &g, &r) == LM_OK);
    CHECK(lm_engine_request_next(r, &s) == LM_OK && s.finish == LM_FINISH_LENGTH && s.token == -1);
    lm_engine_request_free(r);
    /* a job sees the pool back to the prefix cache and free blocks only */
    lm_engine_close(e);
    CHECK(ps.built == ps.released && ps.built >= 8);
}

/* ---- preemption ---- */

typedef struct run_out {
    int32_t toks[64];
    int n;
    char text[512];
    size_t len;
    lm_finish_reason why;
} run_out;

static void run_text(lm_engine_request *r, run_out *o) {
    o->n = 0;
    o->len = 0;
    o->text[0] = '\0';
    lm_step s;
    do {
        lm_status st = lm_engine_request_next(r, &s);
        CHECK(st == LM_OK);
        if (st) break;
        if (s.token >= 0 && o->n < 64) o->toks[o->n++] = s.token;
        if (o->len + s.text_len < sizeof o->text) {
            memcpy(o->text + o->len, s.text, s.text_len);
            o->len += s.text_len;
            o->text[o->len] = '\0';
        }
    } while (s.finish == LM_FINISH_NONE);
    o->why = s.finish;
}

/* Holds the worker until the flag is set: requests started meanwhile are all queued
 * when it looks, so the schedule (and the preemptions) do not depend on timing. */
static lm_status gate_job(lm_engine *e, void *arg, void **result) {
    (void)e;
    (void)result;
    while (!__atomic_load_n((int *)arg, __ATOMIC_ACQUIRE)) usleep(1000);
    return LM_OK;
}

/* A pool too small for the batch's growth: the newest running requests give their
 * blocks back and recompute later. Every request's tokens and text equal the same
 * request run alone with room to spare, greedy (and the standalone generator) and
 * sampled with a seed; with the prefix cache on (recomputing from the blocks it kept)
 * and off (from scratch). */
static void test_preemption(void) {
    enum { N = 6, MAXT = 40 };
    int32_t prompts[N][40];
    int lens[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 18 + i;
        make_prompt(prompts[i], lens[i], 40 + i);
    }
    const char *stops[1] = {"zq"}; /* exercised, hardly ever matched */
    lm_generate_params gs[2] = {greedy(MAXT), greedy(MAXT)};
    gs[1].sampling.temperature = 0.9f;
    gs[1].sampling.top_k = 40;
    gs[1].sampling.seed = 1234;
    gs[1].stop = stops;
    gs[1].n_stop = 1;
    gs[1].logprobs = true;

    /* alone, with room to spare */
    static run_out alone[2][N];
    lm_engine *e = open_engine(small_params());
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    uint64_t per_block = es.kv_bytes / (uint64_t)es.kv_blocks;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N; i++) {
            lm_engine_request *r;
            CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &gs[k], &r) == LM_OK);
            run_text(r, &alone[k][i]);
            lm_engine_request_free(r);
            CHECK(alone[k][i].n == MAXT && alone[k][i].why == LM_FINISH_LENGTH);
        }
    lm_engine_close(e);
    int32_t ref[MAXT];
    CHECK(reference_tokens(prompts[0], lens[0], MAXT, ref) == MAXT);
    CHECK(memcmp(ref, alone[0][0].toks, sizeof ref) == 0);

    /* 4 running sequences of 2 blocks take 8 of 9; each grows to 4 (58-63 tokens) */
    int64_t recomputed[2];
    for (int cache = 0; cache < 2; cache++) {
        lm_engine_params p = small_params();
        p.batch_size = 4;
        p.max_kv_bytes = per_block * 9;
        p.prefix_cache_bytes = cache ? 0 : 1; /* 1 byte: keeps nothing */
        e = open_engine(p);
        for (int k = 0; k < 2; k++) {
            lm_engine_request *rs[N];
            int open = 0;
            lm_future *gate;
            CHECK(lm_engine_submit(e, gate_job, &open, &gate) == LM_OK);
            for (int i = 0; i < N; i++)
                CHECK(lm_engine_request_start(e, prompts[i], (size_t)lens[i], &gs[k], &rs[i]) == LM_OK);
            __atomic_store_n(&open, 1, __ATOMIC_RELEASE);
            CHECK(lm_future_wait(gate, NULL) == LM_OK);
            lm_future_free(gate);
            for (int i = 0; i < N; i++) {
                run_out o;
                run_text(rs[i], &o);
                if (o.n != alone[k][i].n || memcmp(o.toks, alone[k][i].toks, sizeof(int32_t) * (size_t)o.n) ||
                    strcmp(o.text, alone[k][i].text) != 0)
                    fprintf(stderr, "preemption: cache %d, params %d, request %d differs from alone\n", cache, k, i);
                CHECK(o.n == alone[k][i].n && memcmp(o.toks, alone[k][i].toks, sizeof(int32_t) * (size_t)o.n) == 0);
                CHECK(strcmp(o.text, alone[k][i].text) == 0 && o.why == alone[k][i].why);
                lm_stats st;
                CHECK(lm_engine_request_stats(rs[i], &st) == LM_OK);
                CHECK(st.n_generated_tokens == MAXT && st.n_prompt_tokens == lens[i]);
                lm_engine_request_free(rs[i]);
            }
        }
        CHECK(lm_engine_get_stats(e, &es) == LM_OK);
        recomputed[cache] = es.n_prefill_tokens - (es.n_prompt_tokens - es.n_cached_tokens);
        printf("preemption, prefix cache %s: %lld preemptions, %lld tokens recomputed\n", cache ? "on" : "off",
               (long long)es.n_preemptions, (long long)recomputed[cache]);
        CHECK(es.n_preemptions > 0 && recomputed[cache] > 0);
        CHECK(es.n_finished == 2 * N && es.n_running == 0 && es.n_waiting == 0);
        lm_engine_close(e);
    }
    CHECK(recomputed[1] < recomputed[0]); /* the cache kept some of what preempted requests had */
}

static int g_progress_calls;
static size_t g_progress_last;
static void on_progress(size_t done, size_t total, void *user) {
    (void)user;
    CHECK(done > g_progress_last && done <= total);
    g_progress_last = done;
    g_progress_calls++;
}

static void test_generate_prefix(void) {
    enum { N = 9 };
    lm_chat_message prefix[3] = {
        {"system", "You classify the sentiment of a review as positive or negative."},
        {"user", "The food was cold and late."},
        {"assistant", "negative"},
    };
    const char *finals[N] = {"Great!", "Awful service, never again.", "ok", "Loved the soup and the staff",
                             "meh", "It was fine I guess, nothing special", "Terrible", "Wonderful evening",
                             "Too salty"};
    lm_chat_message msgs[N][4];
    lm_conversation convs[N];
    for (int i = 0; i < N; i++) {
        memcpy(msgs[i], prefix, sizeof prefix);
        msgs[i][3] = (lm_chat_message){"user", finals[i]};
        convs[i] = (lm_conversation){msgs[i], 4};
    }
    lm_engine_params p = small_params();
    p.batch_size = 4;
    p.prefix_messages = prefix;
    p.n_prefix_messages = 3;
    lm_engine *e = open_engine(p);
    const lm_model *m = lm_engine_model(e);
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    CHECK(es.n_prefix_tokens > 50 && es.n_prefill_tokens == es.n_prefix_tokens);

    /* the token counts of each rendered conversation */
    int64_t total_new = 0;
    int32_t ids[N][512];
    size_t nids[N];
    char buf[2048];
    for (int i = 0; i < N; i++) {
        size_t nb = 0;
        CHECK(lm_chat_render(m, msgs[i], 4, lm_chat_default_params(), buf, sizeof buf, &nb) == LM_OK);
        CHECK(lm_tokenize(m, buf, nb, LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL, ids[i], 512, &nids[i]) ==
              LM_OK);
        total_new += (int64_t)nids[i] - es.n_prefix_tokens;
    }
    lm_generate_params g = lm_engine_generate_default_params();
    g.max_tokens = 4;
    g.ignore_eos = true;
    char **texts = NULL;
    g_progress_calls = 0;
    g_progress_last = 0;
    CHECK(lm_engine_generate(e, convs, N, &g, on_progress, NULL, &texts) == LM_OK && texts);
    CHECK(g_progress_calls == 3 && g_progress_last == N); /* chunks of 4: 4, 8, 9 */
    lm_engine_stats es2;
    CHECK(lm_engine_get_stats(e, &es2) == LM_OK);
    /* the prefix was computed once: each conversation computed only its own tokens */
    /* the prefix was computed once: every conversation reused at least all of it,
     * and computed nothing but what the cache did not have */
    int64_t reused = es2.n_cached_tokens - es.n_cached_tokens;
    CHECK(reused >= N * es.n_prefix_tokens);
    CHECK(es2.n_prefill_tokens == es.n_prefix_tokens + total_new + N * es.n_prefix_tokens - reused);
    CHECK(es2.cache_hits == N);
    /* each text equals its conversation generated alone (in input order) */
    for (int i = 0; i < N; i++) {
        lm_engine_request *r;
        lm_generate_params g1 = greedy(4);
        CHECK(lm_engine_request_start(e, ids[i], nids[i], &g1, &r) == LM_OK);
        char alone[256] = "";
        size_t len = 0;
        lm_step s;
        do {
            CHECK(lm_engine_request_next(r, &s) == LM_OK);
            if (len + s.text_len < sizeof alone) {
                memcpy(alone + len, s.text, s.text_len);
                len += s.text_len;
                alone[len] = '\0';
            }
        } while (s.finish == LM_FINISH_NONE);
        lm_engine_request_free(r);
        CHECK(strcmp(alone, texts[i]) == 0);
    }
    lm_engine_texts_free(texts, N);
    /* the default: greedy, one token per conversation */
    CHECK(lm_engine_generate(e, convs, 2, NULL, NULL, NULL, &texts) == LM_OK);
    lm_engine_texts_free(texts, 2);
    lm_engine_close(e);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_engine_XXXXXX");
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
    test_jobs();
    test_streaming_and_batching();
    test_preemption();
    test_generate_prefix();

    unlink(g_path);
    rmdir(g_dir);
    TEST_MAIN_END();
}
