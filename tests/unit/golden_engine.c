/* Batch invariance of the engine on a real model.
 *
 * usage: golden_engine NAME     (a `lumen pull` model; skipped, exit 77, when absent)
 *
 * 32 different chat prompts, 16 greedy tokens each:
 *   - alone: one at a time on an engine with batch_size 1 and the prefix cache off
 *     (the first few also through the standalone generator, lm_context);
 *   - together: all 32 at once on an engine with batch_size 32 (continuous batching,
 *     prompt chunks beside decodes), twice: the first round computes the prompts (a
 *     miss), the second finds every prompt in the prefix cache (a hit): both rounds
 *     equal alone, token for token;
 *   - together in a KV pool too small for them all to grow: running requests are
 *     preempted and recompute their prompt and generated tokens later; still equal;
 *   - lm_engine_generate with the system prompt as the engine's prefix message: the
 *     texts equal alone, and the prefix is prefilled once per engine (asserted on
 *     the prefill-token counts of lm_engine_stats).
 * The prompts are rendered with the model's chat template; a model whose file has
 * none (the gemma3-270m GGUF) gets Gemma 3's (tests/golden/templates), and skips the
 * lm_engine_generate part, which renders with the model's own.
 * LUMEN_TEST_BACKEND=cuda runs the same on the GPU; LUMEN_TEST_THREADS sets the
 * CPU threads (default 2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "lumen.h"
#include "test.h"

enum { N = 32, MAXT = 16, N_STANDALONE = 4 };

static const char *k_questions[N] = {
    "What is the capital of France?", "Name a prime number above 50.", "Why is the sky blue?",
    "Write a haiku about rain.", "What is 17 times 3?", "Who wrote Hamlet?", "Give me a synonym for happy.",
    "What does a CPU do?", "Translate 'good morning' to Spanish.", "List three fruits.",
    "How many legs does a spider have?", "What is photosynthesis?", "Suggest a name for a cat.",
    "What is the boiling point of water?", "Explain gravity in one sentence.", "What color are bananas?",
    "Tell me a fun fact about octopuses.", "What is the largest ocean?", "How do you make tea?",
    "What is a noun?", "Name a famous painter.", "What is 2 to the power of 10?", "Describe the moon.",
    "What language is spoken in Brazil?", "Write a Python function that adds two numbers.",
    "What is the difference between a list and a tuple?", "How do I reverse a string in C?",
    "Explain recursion to a child.", "What is the speed of light?", "Give me three tips for sleeping well.",
    "Why do cats purr?", "Summarize the plot of Cinderella in one sentence."};

static const char *g_model, *g_backend;
static int g_threads = 2;
static int32_t g_ids[N][512], g_alone[N][MAXT];
static float g_gap[N][MAXT]; /* alone: the top-two logit gap at each generated token */
static float g_max_gap = 0.0f; /* the largest gap at a divergence from alone (CUDA) */
static size_t g_n_ids[N];
static int g_n_alone[N];

static lm_engine *open_engine(int batch, uint64_t cache_bytes, uint64_t kv_bytes, const lm_chat_message *prefix,
                              size_t n_prefix) {
    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = g_threads;
    p.model.backend = g_backend;
    p.model.n_ctx = 512;
    p.batch_size = batch;
    p.max_batch_tokens = 128;
    p.prefix_cache_bytes = cache_bytes;
    p.max_kv_bytes = kv_bytes;
    p.prefix_messages = prefix;
    p.n_prefix_messages = n_prefix;
    lm_engine *e = NULL;
    if (lm_engine_create(g_model, &p, &e) != LM_OK || lm_engine_wait_loaded(e) != LM_OK) {
        fprintf(stderr, "engine: %s\n", lm_last_error());
        exit(1);
    }
    return e;
}

static lm_generate_params greedy(void) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = MAXT;
    return g;
}

/* The request's tokens; with `gap`, the top-two logprob (= logit) gap at each. */
static int drain(lm_engine_request *r, int32_t *toks, float *gap) {
    int n = 0;
    lm_step s;
    do {
        if (lm_engine_request_next(r, &s) != LM_OK) {
            fprintf(stderr, "next: %s\n", lm_last_error());
            CHECK(0);
            break;
        }
        if (s.token >= 0 && n < MAXT) {
            if (gap) gap[n] = s.n_top_logprobs >= 2 ? s.top_logprobs[0].logprob - s.top_logprobs[1].logprob : INFINITY;
            toks[n++] = s.token;
        }
    } while (s.finish == LM_FINISH_NONE);
    return n;
}

static bool same(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0;
}

/* The first position where two token lists differ (for the report). */
static int first_diff(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* The first of prompt i's alone tokens at which `text` no longer continues the
 * alone text (g_n_alone[i]: none). */
static int text_diverges_at(const lm_model *m, int i, const char *text) {
    char buf[2048];
    size_t nb = 0;
    for (int k = 1; k <= g_n_alone[i]; k++) {
        if (lm_detokenize(m, g_alone[i], (size_t)k, 0, buf, sizeof buf, &nb) != LM_OK) return 0;
        if (strncmp(buf, text, nb) != 0) return k - 1;
    }
    return g_n_alone[i];
}

/* The same prompt through the standalone generator (lm_context + lm_request). */
static int standalone(lm_model *m, const int32_t *ids, size_t nt, int32_t *toks) {
    lm_context_params cp = lm_context_default_params();
    cp.n_ctx = 512;
    lm_context *ctx = NULL;
    CHECK(lm_context_create(m, cp, &ctx) == LM_OK);
    lm_generate_params g = greedy();
    lm_request *r = NULL;
    int n = 0;
    if (ctx && lm_request_start(ctx, ids, nt, &g, &r) == LM_OK) {
        lm_step s;
        do {
            CHECK(lm_request_next(r, &s) == LM_OK);
            if (s.token >= 0 && n < MAXT) toks[n++] = s.token;
        } while (s.finish == LM_FINISH_NONE);
    }
    lm_request_free(r);
    lm_context_free(ctx);
    return n;
}

/* The prompt's tokens: the conversation rendered with `tmpl` (NULL: the model's). */
static size_t render(const lm_model *m, const lm_chat_message *msgs, const char *tmpl, int32_t *ids, size_t cap) {
    static char text[8192];
    lm_chat_params cp = lm_chat_default_params();
    cp.template_source = tmpl;
    size_t nb = 0, nt = 0;
    CHECK(lm_chat_render(m, msgs, 2, cp, text, sizeof text, &nb) == LM_OK && nb < sizeof text);
    CHECK(lm_tokenize(m, text, nb, LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL, ids, cap, &nt) == LM_OK &&
          nt <= cap);
    return nt;
}

/* Holds the worker until *arg is set, so every request of a round is queued when it
 * looks: the batch forms the same way each run. */
static lm_status gate_job(lm_engine *e, void *arg, void **result) {
    (void)e;
    (void)result;
    while (!__atomic_load_n((int *)arg, __ATOMIC_ACQUIRE)) usleep(1000);
    return LM_OK;
}

/* All prompts at once on `e`; checks each equals alone (and, if `hit`, that all of
 * its prompt but the last token came from the prefix cache). */
static void together_round(lm_engine *e, const char *what, bool hit) {
    lm_generate_params g = greedy();
    lm_engine_request *rs[N];
    int open = 0;
    lm_future *gate = NULL;
    CHECK(lm_engine_submit(e, gate_job, &open, &gate) == LM_OK);
    for (int i = 0; i < N; i++) CHECK(lm_engine_request_start(e, g_ids[i], g_n_ids[i], &g, &rs[i]) == LM_OK);
    __atomic_store_n(&open, 1, __ATOMIC_RELEASE);
    CHECK(lm_future_wait(gate, NULL) == LM_OK);
    lm_future_free(gate);
    int diff = 0;
    for (int i = 0; i < N; i++) {
        int32_t toks[MAXT];
        int n = drain(rs[i], toks, NULL);
        lm_stats rst;
        lm_engine_request_stats(rs[i], &rst);
        if (hit) CHECK(rst.n_cached_tokens == rst.n_prompt_tokens - 1);
        lm_engine_request_free(rs[i]);
        if (!same(toks, n, g_alone[i], g_n_alone[i])) {
            int at = first_diff(toks, n, g_alone[i], g_n_alone[i]);
            float gap = at < g_n_alone[i] ? g_gap[i][at] : INFINITY;
            fprintf(stderr, "%s: prompt %d differs from alone at token %d (top-two logit gap alone %.4f)\n", what, i,
                    at, gap);
            g_max_gap = gap > g_max_gap ? gap : g_max_gap;
            diff++;
        }
    }
    /* On the CPU every kernel is batch-invariant: equal, always. On a GPU the matrix
     * products of a decode batch take other kernels than one token alone (cuda_matmul.cu:
     * f32 vs bf16 activations), so a token may flip, but only at a near-tie: the
     * alone run's two best logits within 0.05 (issue 7's bound). */
    if (strcmp(g_backend, "cpu") == 0) CHECK(diff == 0);
    else {
        printf("%s: %d of %d prompts differ from alone (largest top-two gap there %.4f)\n", what, diff, N, g_max_gap);
        CHECK(g_max_gap < 0.05f);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: golden_engine MODEL\n");
        return 2;
    }
    g_model = argv[1];
    g_backend = getenv("LUMEN_TEST_BACKEND") ? getenv("LUMEN_TEST_BACKEND") : "cpu";
    if (getenv("LUMEN_TEST_THREADS")) g_threads = atoi(getenv("LUMEN_TEST_THREADS"));
    lm_set_log_callback(NULL, NULL);
    lm_chat_message sys = {"system", "You are a helpful assistant. Answer briefly."};
    static lm_chat_message msgs[N][2];
    for (int i = 0; i < N; i++) {
        msgs[i][0] = sys;
        msgs[i][1] = (lm_chat_message){"user", k_questions[i]};
    }
    static int32_t ref[MAXT];
    lm_generate_params g = greedy();
    lm_generate_params g_alone_params = greedy(); /* the same tokens, with the top two logprobs */
    g_alone_params.top_logprobs = 2;

    lm_model_params mp = lm_model_default_params();
    mp.n_threads = g_threads;
    mp.backend = g_backend;
    lm_model *model = NULL;
    lm_status st = lm_model_load(g_model, mp, &model);
    if (st == LM_ERR_NOT_FOUND || st == LM_ERR_UNSUPPORTED) { /* not pulled; no GPU */
        printf("SKIPPED: %s (run `lumen pull %s`)\n", lm_last_error(), g_model);
        return LM_TEST_SKIP;
    }
    if (st) {
        fprintf(stderr, "load: %s\n", lm_last_error());
        return 1;
    }
    bool own_template = lm_model_has_chat_template(model);
    char *tmpl =
        own_template ? NULL : test_read_text(LUMEN_SOURCE_DIR "/tests/golden/templates/google-gemma-3-it.jinja");
    CHECK(own_template || tmpl);
    for (int i = 0; i < N; i++) g_n_ids[i] = render(model, msgs[i], tmpl, g_ids[i], 512);

    /* alone: one request at a time, nothing reused */
    lm_engine *e = open_engine(1, 1, 0, NULL, 0);
    for (int i = 0; i < N; i++) {
        lm_engine_request *r;
        CHECK(lm_engine_request_start(e, g_ids[i], g_n_ids[i], &g_alone_params, &r) == LM_OK);
        g_n_alone[i] = drain(r, g_alone[i], g_gap[i]);
        lm_stats rs;
        lm_engine_request_stats(r, &rs);
        CHECK(rs.n_cached_tokens == 0 && g_n_alone[i] > 0);
        lm_engine_request_free(r);
    }
    lm_engine_close(e);
    for (int i = 0; i < N_STANDALONE; i++) {
        int n = standalone(model, g_ids[i], g_n_ids[i], ref);
        if (!same(ref, n, g_alone[i], g_n_alone[i]))
            fprintf(stderr, "prompt %d: the engine differs from the standalone generator at token %d\n", i,
                    first_diff(ref, n, g_alone[i], g_n_alone[i]));
        CHECK(same(ref, n, g_alone[i], g_n_alone[i]));
    }
    lm_model_free(model);
    free(tmpl);

    /* together: all at once, twice (the second round from the cache) */
    e = open_engine(N, 0, 0, NULL, 0);
    together_round(e, "together, miss", false);
    together_round(e, "together, hit", true);
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    printf("%s together: %lld steps, %.1f tokens/step, occupancy %.2f, cache hit rate %.2f\n", g_model,
           (long long)es.n_steps, es.mean_batch_tokens, es.batch_occupancy, es.cache_hit_rate);
    CHECK(es.mean_batch_tokens > 8.0); /* they did run together */
    CHECK(es.cache_hits >= N && es.n_preemptions == 0);
    /* a GPU reports its peak, which lm_engine_peak_memory_gb adds to the process's */
    bool gpu = strcmp(g_backend, "cuda") == 0;
    CHECK(gpu ? es.device_peak_bytes > es.kv_bytes : es.device_peak_bytes == 0);
    double gb = lm_engine_peak_memory_gb(e);
    printf("%s peak memory: %.2f GiB (device %.2f GiB)\n", g_model, gb, (double)es.device_peak_bytes / 1073741824.0);
    CHECK(gb > (double)es.device_peak_bytes / 1073741824.0);
    uint64_t per_block = es.kv_bytes / (uint64_t)es.kv_blocks;
    lm_engine_close(e);

    /* together in a pool of 40 blocks: each prompt and its first token fit (2-3
     * blocks), 32 grown sequences (~3 each) do not */
    e = open_engine(N, 0, per_block * 40, NULL, 0);
    together_round(e, "preempted", false);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    printf("%s preempted: %lld preemptions, %lld prefill tokens for %lld prompt tokens\n", g_model,
           (long long)es.n_preemptions, (long long)es.n_prefill_tokens, (long long)es.n_prompt_tokens);
    CHECK(es.n_preemptions > 0);
    lm_engine_close(e);

    if (!own_template) {
        printf("%s has no chat template: lm_engine_generate not run\n", g_model);
        TEST_MAIN_END();
    }
    /* lm_engine_generate with the system prompt as the prefix message */
    e = open_engine(8, 0, 0, &sys, 1);
    const lm_model *m = lm_engine_model(e);
    lm_engine_stats es0;
    CHECK(lm_engine_get_stats(e, &es0) == LM_OK);
    CHECK(es0.n_prefix_tokens > 0 && es0.n_prefill_tokens == es0.n_prefix_tokens); /* computed at load */
    int64_t own = 0; /* the conversations' tokens after the prefix */
    for (int i = 0; i < N; i++) own += (int64_t)g_n_ids[i] - es0.n_prefix_tokens;
    lm_conversation convs[N];
    for (int i = 0; i < N; i++) convs[i] = (lm_conversation){msgs[i], 2};
    char **texts = NULL;
    CHECK(lm_engine_generate(e, convs, N, &g, NULL, NULL, &texts) == LM_OK);
    for (int i = 0; texts && i < N; i++) {
        char buf[2048];
        size_t nb = 0;
        /* an end token finishes without text */
        size_t n = (size_t)g_n_alone[i];
        if (n && lm_token_is_eog(m, g_alone[i][n - 1])) n--;
        CHECK(lm_detokenize(m, g_alone[i], n, 0, buf, sizeof buf, &nb) == LM_OK);
        if (strcmp(buf, texts[i]) == 0) continue;
        int at = text_diverges_at(m, i, texts[i]);
        float gap = at < g_n_alone[i] ? g_gap[i][at] : INFINITY;
        fprintf(stderr, "generate %d: \"%s\" vs alone \"%s\" (from token %d, top-two logit gap alone %.4f)\n", i,
                texts[i], buf, at, gap);
        /* The CPU: equal. A GPU: here the prefix's K/V come from a pass of its own and
         * the rest of the prompt from another, each on the kernels of its size, so the
         * logits drift further from alone than in together_round: measured on the H200
         * with SmolLM2, 2-4 of 32 flip, at gaps up to 0.09 (docs/BENCHMARKS.md). A flip
         * must still be at a small margin, never at a confident token. */
        CHECK(strcmp(g_backend, "cpu") != 0 && gap < 0.25f);
    }
    lm_engine_texts_free(texts, N);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    int64_t computed = es.n_prefill_tokens - es0.n_prefill_tokens;
    printf("%s generate: prefix %lld tokens prefilled once; %lld tokens computed for %d conversations "
           "(%lld after the prefix, %lld reused)\n",
           g_model, (long long)es.n_prefix_tokens, (long long)computed, N, (long long)own,
           (long long)es.n_cached_tokens);
    /* every conversation reused the whole prefix and computed at most its own tokens */
    CHECK(es.n_cached_tokens >= N * es.n_prefix_tokens);
    CHECK(computed <= own && computed > 0);
    CHECK(es.n_prefill_tokens + es.n_cached_tokens == es.n_prefix_tokens + es.n_prompt_tokens);
    lm_engine_close(e);
    TEST_MAIN_END();
}
