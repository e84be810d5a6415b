/* Engine benchmarks (docs/BENCHMARKS.md, "Engine"):
 *
 * (a) classification: N conversations (default 512) sharing a ~300-token prefix
 *     (system message + few-shot examples), each ending with a short user message,
 *     max_tokens 1, through lm_engine_generate (prefix messages computed once,
 *     continuous batching) versus one at a time through the standalone generator
 *     (lm_context + lm_request, the context reset before each: no cache). The
 *     baseline runs the first --baseline-n conversations and is scaled to N.
 * (b) chat: a 10-turn conversation whose history reaches ~2,000 tokens; turns 1..9
 *     run on one engine (each turn's prompt extends the previous one), then the
 *     time to first token of turn 10 against a cold prefill of the same prompt on a
 *     fresh engine.
 *
 * usage: bench_engine [--model NAME] [--backend cpu|cuda] [--threads N] [--n N] [--baseline-n N]
 *                     [--batch N] [--only a|b]
 *   defaults: smollm2-135m, 2 threads, 512 conversations, baseline 64, batch 32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "lumen.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *k_model = "smollm2-135m";
static const char *k_backend = "cpu";
static int k_threads = 2, k_n = 512, k_baseline_n = 64, k_batch = 32;

static lm_engine *open_engine(const lm_chat_message *prefix, size_t n_prefix, int batch, int n_ctx) {
    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = k_threads;
    p.model.backend = k_backend;
    p.model.n_ctx = n_ctx;
    p.batch_size = batch;
    p.max_batch_tokens = 256;
    p.prefix_messages = prefix;
    p.n_prefix_messages = n_prefix;
    lm_engine *e = NULL;
    if (lm_engine_create(k_model, &p, &e) != LM_OK || lm_engine_wait_loaded(e) != LM_OK) {
        fprintf(stderr, "engine: %s\n", lm_last_error());
        exit(1);
    }
    return e;
}

static size_t render(const lm_model *m, const lm_chat_message *msgs, size_t n, int32_t *ids, size_t cap) {
    static char buf[1 << 16];
    size_t nb = 0, nt = 0;
    if (lm_chat_render(m, msgs, n, lm_chat_default_params(), buf, sizeof buf, &nb) != LM_OK || nb >= sizeof buf ||
        lm_tokenize(m, buf, nb, LM_TOKENIZE_ADD_SPECIAL | LM_TOKENIZE_PARSE_SPECIAL, ids, cap, &nt) != LM_OK ||
        nt > cap) {
        fprintf(stderr, "render: %s\n", lm_last_error());
        exit(1);
    }
    return nt;
}

/* ---- (a) ---- */

static const char *k_shots[][2] = {
    {"The pasta was overcooked and the waiter ignored us for twenty minutes.", "negative"},
    {"Absolutely loved the garden terrace, the wine list and the friendly staff.", "positive"},
    {"My package arrived two weeks late and the box was crushed on one side.", "negative"},
    {"The new update made the app faster and the battery lasts much longer now.", "positive"},
    {"Customer support hung up on me twice and never called back as promised.", "negative"},
    {"A wonderful little hotel: quiet rooms, great breakfast, and a view of the sea.", "positive"},
    {"The headphones broke after a week and the refund process was a nightmare.", "negative"},
    {"Our guide was funny and knowledgeable, and the tour was worth every penny.", "positive"},
};
static const char *k_words[] = {"great", "awful", "slow", "friendly", "broken", "tasty", "cheap", "rude",
                                "lovely", "noisy", "clean", "late", "perfect", "cold", "fresh", "boring"};
static const char *k_things[] = {"service", "food", "room", "delivery", "price", "staff", "app", "movie"};

static void bench_a(void) {
    enum { N_SHOTS = 8 };
    lm_chat_message prefix[1 + 2 * N_SHOTS];
    prefix[0] = (lm_chat_message){"system",
                                  "You are a sentiment classifier. Read the customer's review and answer with exactly "
                                  "one word: positive or negative. Do not explain your answer, do not add punctuation, "
                                  "and treat mixed reviews by their overall tone."};
    for (int i = 0; i < N_SHOTS; i++) {
        prefix[1 + 2 * i] = (lm_chat_message){"user", k_shots[i][0]};
        prefix[2 + 2 * i] = (lm_chat_message){"assistant", k_shots[i][1]};
    }
    size_t np = 1 + 2 * N_SHOTS;
    int n = k_n;
    lm_chat_message(*msgs)[1 + 2 * N_SHOTS + 1] = malloc(sizeof *msgs * (size_t)n);
    char(*finals)[64] = malloc(sizeof *finals * (size_t)n);
    lm_conversation *convs = malloc(sizeof *convs * (size_t)n);
    for (int i = 0; i < n; i++) {
        snprintf(finals[i], 64, "The %s was %s.", k_things[(i / 16) % 8], k_words[i % 16]);
        if (i % 3 == 0) snprintf(finals[i] + strlen(finals[i]), 32, " Really %s!", k_words[(i * 7) % 16]);
        memcpy(msgs[i], prefix, sizeof prefix);
        msgs[i][np] = (lm_chat_message){"user", finals[i]};
        convs[i] = (lm_conversation){msgs[i], np + 1};
    }

    /* the engine */
    double t0 = now_s();
    lm_engine *e = open_engine(prefix, np, k_batch, 1024);
    double t_load = now_s() - t0;
    lm_engine_stats s0;
    lm_engine_get_stats(e, &s0);
    char **texts = NULL;
    t0 = now_s();
    if (lm_engine_generate(e, convs, (size_t)n, NULL, NULL, NULL, &texts) != LM_OK) {
        fprintf(stderr, "generate: %s\n", lm_last_error());
        exit(1);
    }
    double t_engine = now_s() - t0;
    lm_engine_stats st;
    lm_engine_get_stats(e, &st);
    int n_pos = 0;
    for (int i = 0; i < n; i++) n_pos += strstr(texts[i], "pos") != NULL;
    int32_t ids[4096];
    size_t n_tok = render(lm_engine_model(e), msgs[0], np + 1, ids, 4096);
    lm_engine_texts_free(texts, (size_t)n);

    /* the baseline: the standalone generator, one at a time, no reuse */
    lm_model_params mp = lm_model_default_params();
    mp.n_threads = k_threads;
    mp.backend = k_backend;
    mp.n_ctx = 1024;
    lm_model *m = NULL;
    lm_context *ctx = NULL;
    if (lm_model_load(k_model, mp, &m) || lm_context_create(m, lm_context_default_params(), &ctx)) {
        fprintf(stderr, "baseline: %s\n", lm_last_error());
        exit(1);
    }
    int nb = k_baseline_n < n ? k_baseline_n : n;
    lm_generate_params g = lm_engine_generate_default_params();
    int agree = 0;
    t0 = now_s();
    for (int i = 0; i < nb; i++) {
        size_t nt = render(m, msgs[i], np + 1, ids, 4096);
        lm_context_reset(ctx);
        lm_request *r = NULL;
        lm_step step;
        if (lm_request_start(ctx, ids, nt, &g, &r) || lm_request_next(r, &step)) {
            fprintf(stderr, "baseline: %s\n", lm_last_error());
            exit(1);
        }
        agree += strstr(step.text, "pos") != NULL;
        lm_request_free(r);
    }
    double t_base = now_s() - t0;
    double per_base = t_base / nb, per_engine = t_engine / n;
    printf("## (a) %d conversations, prefix %lld tokens (%zu messages), prompts %zu tokens (first), max_tokens 1\n", n,
           (long long)st.n_prefix_tokens, np, n_tok);
    printf("engine: load + prefix %.2f s; generate %.2f s = %.1f conversations/s (batch %d, %lld steps, %.1f "
           "tokens/step, occupancy %.2f, %lld preemptions)\n",
           t_load, t_engine, n / t_engine, k_batch, (long long)st.n_steps, st.mean_batch_tokens, st.batch_occupancy,
           (long long)st.n_preemptions);
    printf("engine: prompt tokens %lld, reused from cache %lld (hit rate %.3f), computed %lld (prefix %lld once)\n",
           (long long)(st.n_prompt_tokens - s0.n_prompt_tokens), (long long)st.n_cached_tokens, st.cache_hit_rate,
           (long long)st.n_prefill_tokens, (long long)st.n_prefix_tokens);
    printf("baseline (one at a time, no cache): %d conversations in %.2f s = %.1f conversations/s\n", nb, t_base,
           nb / t_base);
    printf("speedup: %.1fx   (positive answers: %d of %d; peak memory %.2f GiB, of which the device's %.2f GiB)\n",
           per_base / per_engine, n_pos, n, lm_engine_peak_memory_gb(e), (double)st.device_peak_bytes / 1073741824.0);
    (void)agree;
    lm_request_free(NULL);
    lm_context_free(ctx);
    lm_model_free(m);
    lm_engine_close(e);
    free(msgs);
    free(finals);
    free(convs);
}

/* ---- (b) ---- */

static void bench_b(void) {
    enum { TURNS = 10 };
    /* each turn: a ~60-token question; the answer is the model's own (up to 200
     * tokens), fed back verbatim as the history of the next turn, as a chat does */
    static char user[TURNS][1024];
    static char *answer[TURNS];
    const char *topics[TURNS] = {"rivers", "volcanoes", "bridges", "forests", "deserts",
                                 "glaciers", "islands", "canyons", "lakes", "caves"};
    for (int t = 0; t < TURNS; t++)
        snprintf(user[t], sizeof user[t],
                 "Now tell me about %s. I am writing a long report and need detailed notes: how %s form, where "
                 "the most famous ones are, what role they play for people and animals, and one surprising fact.",
                 topics[t], topics[t]);
    lm_chat_message msgs[2 * TURNS + 1];
    msgs[0] = (lm_chat_message){"system", "You are a patient tutor who writes clear, detailed notes."};
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = 200;

    lm_engine *e = open_engine(NULL, 0, 4, 4096);
    double ttft[TURNS];
    long long n_prompt = 0, n_cached = 0;
    for (int t = 0; t < TURNS; t++) {
        msgs[1 + 2 * t] = (lm_chat_message){"user", user[t]};
        lm_engine_request *r = NULL;
        if (lm_engine_request_start_chat(e, msgs, (size_t)(2 * t + 2), &g, &r)) {
            fprintf(stderr, "chat: %s\n", lm_last_error());
            exit(1);
        }
        size_t len = 0, cap = 4096;
        answer[t] = malloc(cap);
        lm_step s;
        do {
            lm_engine_request_next(r, &s);
            if (len + s.text_len + 1 > cap) answer[t] = realloc(answer[t], cap *= 2);
            memcpy(answer[t] + len, s.text, s.text_len);
            len += s.text_len;
        } while (s.finish == LM_FINISH_NONE);
        answer[t][len] = '\0';
        msgs[2 + 2 * t] = (lm_chat_message){"assistant", answer[t]};
        lm_stats st;
        lm_engine_request_stats(r, &st);
        ttft[t] = st.ttft_s;
        n_prompt = st.n_prompt_tokens;
        n_cached = st.n_cached_tokens;
        lm_engine_request_free(r);
    }
    lm_engine_close(e);
    printf("## (b) turn %d: prompt %lld tokens (history), %lld from the cache, TTFT %.3f s\n", TURNS, n_prompt,
           n_cached, ttft[TURNS - 1]);
    /* cold: the same last prompt on a fresh engine */
    e = open_engine(NULL, 0, 4, 4096);
    lm_engine_request *r = NULL;
    g.max_tokens = 1;
    lm_engine_request_start_chat(e, msgs, 2 * TURNS, &g, &r);
    lm_step s;
    do lm_engine_request_next(r, &s);
    while (s.finish == LM_FINISH_NONE);
    lm_stats st;
    lm_engine_request_stats(r, &st);
    lm_engine_request_free(r);
    lm_engine_close(e);
    printf("cold prefill of the same %lld-token prompt: TTFT %.3f s\n", (long long)st.n_prompt_tokens, st.ttft_s);
    printf("turn TTFTs:");
    for (int t = 0; t < TURNS; t++) printf(" %.3f", ttft[t]);
    printf("\nlater turn / cold: %.1f%%\n", 100.0 * ttft[TURNS - 1] / st.ttft_s);
    for (int t = 0; t < TURNS; t++) free(answer[t]);
}

int main(int argc, char **argv) {
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) k_model = argv[++i];
        else if (!strcmp(a, "--threads") && v) k_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--backend") && v) k_backend = argv[++i];
        else if (!strcmp(a, "--n") && v) k_n = atoi(argv[++i]);
        else if (!strcmp(a, "--baseline-n") && v) k_baseline_n = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v) k_batch = atoi(argv[++i]);
        else if (!strcmp(a, "--only") && v) only = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_engine [--model NAME (smollm2-135m)] [--backend cpu|cuda] [--threads N (2)] [--n N (512)]\n"
                    "                    [--baseline-n N (64)] [--batch N (32)] [--only a|b]\n");
            return 2;
        }
    }
    lm_set_log_callback(NULL, NULL);
    if (!only || !strcmp(only, "a")) bench_a();
    if (!only || !strcmp(only, "b")) bench_b();
    return 0;
}
