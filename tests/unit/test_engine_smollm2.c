/* Batch invariance of the engine on a real model (smollm2-135m, `lumen pull
 * smollm2-135m`; skipped, exit 77, when absent): greedy outputs of 16 different
 * chat prompts generated together (continuous batching, batch_size 16, chunked
 * prefill) equal each prompt generated alone with the prefix cache off, token for
 * token; a second round, served from the prefix cache, gives them again; and
 * lm_engine_generate with a shared system prompt (prefix messages) equals the
 * same conversations run one at a time. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "lumen.h"
#include "test.h"

enum { N = 16, MAXT = 12 };

static const char *k_questions[24] = {
    "What is the capital of France?", "Name a prime number above 50.", "Why is the sky blue?",
    "Write a haiku about rain.", "What is 17 times 3?", "Who wrote Hamlet?", "Give me a synonym for happy.",
    "What does a CPU do?", "Translate 'good morning' to Spanish.", "List three fruits.",
    "How many legs does a spider have?", "What is photosynthesis?", "Suggest a name for a cat.",
    "What is the boiling point of water?", "Explain gravity in one sentence.", "What color are bananas?",
    "Tell me a fun fact about octopuses.", "What is the largest ocean?", "How do you make tea?",
    "What is a noun?", "Name a famous painter.", "What is 2 to the power of 10?", "Describe the moon.",
    "What language is spoken in Brazil?"};

static lm_engine *open_engine(int batch, uint64_t cache_bytes, const lm_chat_message *prefix, size_t n_prefix) {
    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = getenv("LUMEN_TEST_THREADS") ? atoi(getenv("LUMEN_TEST_THREADS")) : 2;
    p.model.n_ctx = 512;
    p.batch_size = batch;
    p.max_batch_tokens = 128;
    p.prefix_cache_bytes = cache_bytes;
    p.prefix_messages = prefix;
    p.n_prefix_messages = n_prefix;
    lm_engine *e = NULL;
    if (lm_engine_create("smollm2-135m", &p, &e) != LM_OK) return NULL;
    lm_status st = lm_engine_wait_loaded(e);
    if (st) {
        if (st == LM_ERR_NOT_FOUND) printf("SKIPPED: %s (run `lumen pull smollm2-135m`)\n", lm_last_error());
        else fprintf(stderr, "load: %s\n", lm_last_error());
        lm_engine_close(e);
        exit(st == LM_ERR_NOT_FOUND ? LM_TEST_SKIP : 1);
    }
    return e;
}

static lm_generate_params greedy(void) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = MAXT;
    return g;
}

static int drain(lm_engine_request *r, int32_t *toks) {
    int n = 0;
    lm_step s;
    do {
        if (lm_engine_request_next(r, &s) != LM_OK) {
            fprintf(stderr, "next: %s\n", lm_last_error());
            CHECK(0);
            break;
        }
        if (s.token >= 0 && n < MAXT) toks[n++] = s.token;
    } while (s.finish == LM_FINISH_NONE);
    return n;
}

int main(void) {
    lm_set_log_callback(NULL, NULL);
    lm_chat_message sys = {"system", "You are a helpful assistant. Answer briefly."};
    lm_chat_message msgs[N][2];
    for (int i = 0; i < N; i++) {
        msgs[i][0] = sys;
        msgs[i][1] = (lm_chat_message){"user", k_questions[i]};
    }
    static int32_t alone[N][MAXT], together[N][MAXT];
    int n_alone[N], n_together[N];

    /* alone: one request at a time, nothing reused */
    lm_engine *e = open_engine(1, 1, NULL, 0);
    lm_generate_params g = greedy();
    for (int i = 0; i < N; i++) {
        lm_engine_request *r;
        CHECK(lm_engine_request_start_chat(e, msgs[i], 2, &g, &r) == LM_OK);
        n_alone[i] = drain(r, alone[i]);
        lm_stats st;
        lm_engine_request_stats(r, &st);
        CHECK(st.n_cached_tokens == 0);
        lm_engine_request_free(r);
    }
    lm_engine_close(e);

    /* together: all at once, twice (the second round from the cache) */
    e = open_engine(N, 0, NULL, 0);
    for (int round = 0; round < 2; round++) {
        lm_engine_request *rs[N];
        for (int i = 0; i < N; i++) CHECK(lm_engine_request_start_chat(e, msgs[i], 2, &g, &rs[i]) == LM_OK);
        int diff = 0;
        for (int i = 0; i < N; i++) {
            n_together[i] = drain(rs[i], together[i]);
            lm_engine_request_free(rs[i]);
            if (n_together[i] != n_alone[i] || memcmp(together[i], alone[i], sizeof(int32_t) * (size_t)n_alone[i])) {
                fprintf(stderr, "round %d prompt %d differs from alone\n", round, i);
                diff++;
            }
        }
        CHECK(diff == 0);
    }
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    printf("together: %lld steps, %.1f tokens/step, occupancy %.2f, cache hit rate %.2f\n", (long long)es.n_steps,
           es.mean_batch_tokens, es.batch_occupancy, es.cache_hit_rate);
    CHECK(es.mean_batch_tokens > 4.0);
    CHECK(es.cache_hits >= N);
    lm_engine_close(e);

    /* lm_engine_generate with the system prompt as prefix messages */
    e = open_engine(8, 0, &sys, 1);
    lm_conversation convs[N];
    for (int i = 0; i < N; i++) convs[i] = (lm_conversation){msgs[i], 2};
    char **texts = NULL;
    CHECK(lm_engine_generate(e, convs, N, &g, NULL, NULL, &texts) == LM_OK);
    for (int i = 0; texts && i < N; i++) {
        char buf[1024];
        size_t nb = 0;
        CHECK(lm_detokenize(lm_engine_model(e), alone[i], (size_t)n_alone[i], 0, buf, sizeof buf, &nb) == LM_OK);
        /* an end token finishes without text */
        if (n_alone[i] && lm_token_is_eog(lm_engine_model(e), alone[i][n_alone[i] - 1])) {
            CHECK(lm_detokenize(lm_engine_model(e), alone[i], (size_t)n_alone[i] - 1, 0, buf, sizeof buf, &nb) ==
                  LM_OK);
        }
        if (strcmp(buf, texts[i]) != 0) fprintf(stderr, "generate %d: \"%s\" vs alone \"%s\"\n", i, texts[i], buf);
        CHECK(strcmp(buf, texts[i]) == 0);
    }
    lm_engine_texts_free(texts, N);
    CHECK(lm_engine_get_stats(e, &es) == LM_OK);
    CHECK(es.n_cached_tokens >= N * es.n_prefix_tokens);
    printf("generate: prefix %lld tokens computed once; %lld prompt tokens computed for %d conversations\n",
           (long long)es.n_prefix_tokens, (long long)(es.n_prefill_tokens - es.n_prefix_tokens), N);
    lm_engine_close(e);
    TEST_MAIN_END();
}
