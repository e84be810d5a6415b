/* The candidate path end to end on the CPU backend (tiny random llama model, byte
 * vocabulary): the engine's outputs with candidates (the default) equal those with
 * full logits (LUMEN_LOGITS_TOPK=0) token for token, for greedy and top-k sampled
 * requests batched together, with a logprobs request in the mix (its steps take the
 * full rows); the candidate steps really ran; the standalone generator agrees with
 * the engine, with and without logprobs (full rows vs candidates). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "engine/engine_internal.h"
#include "lumen.h"
#include "test.h"
#include "tiny_model.h"
#include "tiny_tokenizer.h"

enum { N_REQ = 9, MAXT = 16 };

static char g_dir[256], g_path[512];

static void make_prompt(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = (i * 31 + salt * 17 + 7) % N_BYTES;
}

/* request i: greedy, top-k sampled (seeded), or greedy with logprobs */
static lm_generate_params params_for(int i) {
    lm_generate_params g = lm_generate_default_params();
    g.max_tokens = MAXT;
    g.ignore_eos = true;
    switch (i % 3) {
    case 0: g.sampling.temperature = 0.0f; break;
    case 1:
        g.sampling.temperature = 0.9f;
        g.sampling.top_k = 1 + i % 20;
        g.sampling.top_p = i % 2 ? 0.9f : 1.0f;
        g.sampling.seed = 100 + (uint64_t)i;
        break;
    default:
        g.sampling.temperature = 0.0f;
        g.logprobs = i == 2; /* one request needs full rows: its steps take them */
        break;
    }
    return g;
}

static int run_request(lm_engine_request *r, int32_t *toks) {
    int n = 0;
    lm_step s;
    do {
        lm_status st = lm_engine_request_next(r, &s);
        if (st) {
            fprintf(stderr, "next: %s\n", lm_last_error());
            CHECK(st == LM_OK);
            break;
        }
        if (s.token >= 0 && n < MAXT) toks[n++] = s.token;
    } while (s.finish == LM_FINISH_NONE);
    return n;
}

/* all requests together through an engine; returns the steps that took candidates */
static int64_t run_engine(bool topk, int32_t out[N_REQ][MAXT]) {
    if (topk)
        unsetenv("LUMEN_LOGITS_TOPK");
    else
        setenv("LUMEN_LOGITS_TOPK", "0", 1);
    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = 1;
    p.model.n_ctx = 256;
    p.batch_size = 4;
    p.max_batch_tokens = 16;
    lm_engine *e = NULL;
    CHECK(lm_engine_create(g_path, &p, &e) == LM_OK);
    CHECK(lm_engine_wait_loaded(e) == LM_OK);
    lm_engine_request *rs[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        int32_t prompt[40];
        make_prompt(prompt, 5 + 3 * i, i);
        lm_generate_params g = params_for(i);
        CHECK(lm_engine_request_start(e, prompt, (size_t)(5 + 3 * i), &g, &rs[i]) == LM_OK);
    }
    for (int i = 0; i < N_REQ; i++) {
        CHECK(run_request(rs[i], out[i]) == MAXT);
        lm_engine_request_free(rs[i]);
    }
    pthread_mutex_lock(&e->mu);
    int64_t steps = e->n_cand_steps;
    CHECK(e->topk_k == (topk ? LM_SAMPLER_CANDIDATES : 0));
    pthread_mutex_unlock(&e->mu);
    lm_engine_close(e);
    unsetenv("LUMEN_LOGITS_TOPK");
    return steps;
}

/* request i alone through the standalone generator, optionally with logprobs */
static void run_alone(int i, bool logprobs, int32_t *out) {
    lm_model_params mp = lm_model_default_params();
    mp.n_threads = 1;
    mp.n_ctx = 256;
    lm_model *m = NULL;
    CHECK(lm_model_load(g_path, mp, &m) == LM_OK);
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, lm_context_default_params(), &ctx) == LM_OK);
    int32_t prompt[40];
    make_prompt(prompt, 5 + 3 * i, i);
    lm_generate_params g = params_for(i);
    g.logprobs = logprobs;
    lm_request *r = NULL;
    CHECK(lm_request_start(ctx, prompt, (size_t)(5 + 3 * i), &g, &r) == LM_OK);
    int n = 0;
    lm_step s;
    do {
        CHECK(lm_request_next(r, &s) == LM_OK);
        if (s.token >= 0 && n < MAXT) out[n++] = s.token;
        if (logprobs && s.token >= 0) CHECK(s.logprob <= 0.0f);
    } while (s.finish == LM_FINISH_NONE);
    CHECK(n == MAXT);
    lm_request_free(r);
    lm_context_free(ctx);
    lm_model_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_topk_engine_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_path, sizeof g_path, "%s/tiny.gguf", g_dir);
    tiny_model tm;
    tiny_spec spec = tiny_default(LM_ARCH_LLAMA);
    spec.n_vocab = N_VOCAB;
    tiny_build(&tm, spec);
    CHECK(tiny_write_gguf_ex(&tm, g_path, NULL, add_tokenizer, NULL) == LM_OK);
    tiny_free(&tm);
    lm_set_log_callback(NULL, NULL);

    static int32_t full[N_REQ][MAXT], cand[N_REQ][MAXT];
    int64_t steps_full = run_engine(false, full);
    int64_t steps_cand = run_engine(true, cand);
    CHECK(steps_full == 0);
    CHECK(steps_cand > 0);
    printf("engine: %lld steps took candidates\n", (long long)steps_cand);
    for (int i = 0; i < N_REQ; i++) {
        bool same = memcmp(full[i], cand[i], sizeof full[i]) == 0;
        if (!same) fprintf(stderr, "request %d differs between full logits and candidates\n", i);
        CHECK(same);
    }
    /* the standalone generator: candidates (no logprobs) and full rows (logprobs) */
    for (int i = 0; i < 6; i++) {
        int32_t a[MAXT], b[MAXT];
        run_alone(i, false, a);
        run_alone(i, true, b);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK(memcmp(a, full[i], sizeof a) == 0);
    }

    unlink(g_path);
    rmdir(g_dir);
    TEST_MAIN_END();
}
