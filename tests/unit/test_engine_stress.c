/* The engine under concurrent use, for ThreadSanitizer (make test-tsan): several
 * threads start requests, stream them (two each at a time), cancel some mid-way,
 * free some without reading them to the end, submit jobs and read statistics, all
 * at once, in a KV pool so small that the scheduler preempts running requests; a
 * batch generate runs beside them; then the engine closes with jobs still queued
 * (they run) and requests still held (they end cancelled). Greedy outputs of the
 * requests that ran to the end must equal the same prompt run alone. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "lumen.h"
#include "test.h"
#include "tiny_model.h"

enum { N_THREADS = 4, PER_THREAD = 6, MAXT = 32 };

static char g_dir[256], g_path[512];
static lm_engine *g_engine;
static int32_t g_ref[8][MAXT];
static _Atomic int g_jobs_run;

static void make_prompt(int32_t *p, int n, int salt) {
    for (int i = 0; i < n; i++) p[i] = (i * 29 + salt * 13 + 3) % 200;
}

static lm_generate_params greedy(int max_tokens) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    return g;
}

static lm_status count_job(lm_engine *e, void *arg, void **result) {
    (void)e;
    (void)result;
    (void)arg;
    g_jobs_run++;
    usleep(1000);
    return LM_OK;
}

/* One of a client's requests in flight. mode 0, 1: to the end; 2: cancelled after
 * two tokens; 3: freed after three without reading on. */
typedef struct live {
    lm_engine_request *r;
    int mode, which, got;
    int32_t toks[64];
    bool over;
    lm_finish_reason finish;
} live;

static void *client(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int k = 0; k < PER_THREAD; k++) {
        /* two requests at once, read a step at a time in turn: more live sequences
         * than the pool can grow, so the scheduler preempts while others stream */
        live L[2] = {{0}};
        for (int j = 0; j < 2; j++) {
            L[j].which = (id + k + 3 * j) % 8;
            L[j].mode = (id * PER_THREAD + k + j) % 4;
            int32_t prompt[40];
            int n = 8 + L[j].which * 3;
            make_prompt(prompt, n, L[j].which);
            lm_generate_params g = greedy(L[j].mode >= 2 ? -1 : MAXT);
            if (lm_engine_request_start(g_engine, prompt, (size_t)n, &g, &L[j].r) != LM_OK) {
                CHECK(!"request_start failed");
                L[j].over = true;
            }
        }
        while (!L[0].over || !L[1].over) {
            for (int j = 0; j < 2; j++) {
                live *l = &L[j];
                if (l->over) continue;
                lm_step s;
                if (lm_engine_request_next(l->r, &s) != LM_OK) {
                    CHECK(!"next failed");
                    l->over = true;
                    continue;
                }
                if (s.token >= 0 && l->got < 64) l->toks[l->got++] = s.token;
                if (l->mode == 2 && l->got == 2) lm_engine_request_cancel(l->r);
                l->finish = s.finish;
                l->over = s.finish != LM_FINISH_NONE || (l->mode == 3 && l->got == 3);
            }
        }
        for (int j = 0; j < 2; j++) {
            if (L[j].mode < 2) {
                CHECK(L[j].got == MAXT);
                CHECK(memcmp(L[j].toks, g_ref[L[j].which], sizeof(int32_t) * MAXT) == 0);
            }
            /* the worker runs ahead of the reader: it may have produced the request's
             * last token (the pool's limit) before the cancel lands, and a cancel
             * after the end changes nothing */
            if (L[j].mode == 2) CHECK(L[j].finish == LM_FINISH_CANCELLED || L[j].finish == LM_FINISH_LENGTH);
        }
        lm_engine_stats st;
        CHECK(lm_engine_get_stats(g_engine, &st) == LM_OK);
        lm_future *f;
        if (lm_engine_submit(g_engine, count_job, NULL, &f) == LM_OK) {
            if (k % 2) CHECK(lm_future_wait(f, NULL) == LM_OK);
            lm_future_free(f);
        }
        lm_engine_request_free(L[0].r);
        lm_engine_request_free(L[1].r);
    }
    return NULL;
}

static void *batch_client(void *arg) {
    (void)arg;
    lm_chat_message sys = {"system", "Answer with one word."};
    lm_chat_message msgs[5][2];
    lm_conversation convs[5];
    const char *q[5] = {"red?", "blue or green", "why", "a", "count to three"};
    for (int i = 0; i < 5; i++) {
        msgs[i][0] = sys;
        msgs[i][1] = (lm_chat_message){"user", q[i]};
        convs[i] = (lm_conversation){msgs[i], 2};
    }
    char **texts = NULL;
    lm_generate_params g = lm_engine_generate_default_params();
    g.max_tokens = 3;
    CHECK(lm_engine_generate(g_engine, convs, 5, &g, NULL, NULL, &texts) == LM_OK);
    lm_engine_texts_free(texts, 5);
    return NULL;
}

static void add_tokenizer(lm_gguf_writer *w, void *user) {
    (void)user;
    static char names[256][8];
    const char *tokens[259];
    int32_t types[259];
    for (int b = 0; b < 256; b++) {
        /* GPT-2 byte alphabet, as in test_engine.c */
        int n = 0, cp = -1;
        for (int x = 0; x < 256; x++) {
            bool pr = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            int c = pr ? x : 256 + n++;
            if (x == b) cp = c;
        }
        if (cp < 0x80) {
            names[b][0] = (char)cp;
            names[b][1] = 0;
        } else {
            names[b][0] = (char)(0xC0 | (cp >> 6));
            names[b][1] = (char)(0x80 | (cp & 0x3F));
            names[b][2] = 0;
        }
        tokens[b] = names[b];
        types[b] = 1;
    }
    tokens[256] = "<|endoftext|>";
    tokens[257] = "<|im_start|>";
    tokens[258] = "<|im_end|>";
    types[256] = types[257] = types[258] = 3;
    const char *merges[] = {"a b"};
    lm_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    lm_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    lm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 259);
    lm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LM_GGUF_I32, types, 259);
    lm_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 258);
    lm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    lm_gguf_writer_set_str(w, "tokenizer.chat_template",
                           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_engine_stress_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_path, sizeof g_path, "%s/tiny.gguf", g_dir);
    tiny_model tm;
    tiny_spec spec = tiny_default(LM_ARCH_LLAMA);
    spec.n_vocab = 259;
    tiny_build(&tm, spec);
    CHECK(tiny_write_gguf_ex(&tm, g_path, NULL, add_tokenizer, NULL) == LM_OK);
    tiny_free(&tm);
    lm_set_log_callback(NULL, NULL);

    lm_engine_params p = lm_engine_default_params();
    p.model.n_threads = 2;
    p.model.n_ctx = 128;
    p.batch_size = 3;
    p.max_batch_tokens = 16;
    lm_chat_message sys = {"system", "Answer with one word."};
    p.prefix_messages = &sys;
    p.n_prefix_messages = 1;

    /* references: each prompt alone on a fresh engine */
    CHECK(lm_engine_create(g_path, &p, &g_engine) == LM_OK);
    CHECK(lm_engine_wait_loaded(g_engine) == LM_OK);
    for (int w = 0; w < 8; w++) {
        int32_t prompt[40];
        int n = 8 + w * 3;
        make_prompt(prompt, n, w);
        lm_generate_params g = greedy(MAXT);
        lm_engine_request *r;
        CHECK(lm_engine_request_start(g_engine, prompt, (size_t)n, &g, &r) == LM_OK);
        lm_step s;
        int got = 0;
        do {
            CHECK(lm_engine_request_next(r, &s) == LM_OK);
            if (s.token >= 0 && got < MAXT) g_ref[w][got++] = s.token;
        } while (s.finish == LM_FINISH_NONE);
        lm_engine_request_free(r);
    }
    lm_engine_stats es;
    CHECK(lm_engine_get_stats(g_engine, &es) == LM_OK);
    lm_engine_close(g_engine);

    /* a small pool: admission waits, running sequences outgrow it (preemption) */
    p.max_kv_bytes = es.kv_bytes / (uint64_t)es.kv_blocks * 11;
    CHECK(lm_engine_create(g_path, &p, &g_engine) == LM_OK);
    CHECK(lm_engine_wait_loaded(g_engine) == LM_OK);
    pthread_t th[N_THREADS + 1];
    for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, client, (void *)(intptr_t)i);
    pthread_create(&th[N_THREADS], NULL, batch_client, NULL);
    for (int i = 0; i <= N_THREADS; i++) pthread_join(th[i], NULL);

    lm_engine_stats es2;
    CHECK(lm_engine_get_stats(g_engine, &es2) == LM_OK);
    printf("%lld requests, %lld preemptions, %lld jobs\n", (long long)es2.n_requests, (long long)es2.n_preemptions,
           (long long)es2.n_jobs);

    /* close with jobs queued and requests held */
    lm_engine_request *held[3];
    for (int i = 0; i < 3; i++) {
        int32_t prompt[20];
        make_prompt(prompt, 20, i);
        lm_generate_params g = greedy(-1);
        CHECK(lm_engine_request_start(g_engine, prompt, 20, &g, &held[i]) == LM_OK);
    }
    lm_future *fs[8];
    int before = g_jobs_run;
    for (int i = 0; i < 8; i++) CHECK(lm_engine_submit(g_engine, count_job, NULL, &fs[i]) == LM_OK);
    lm_engine_close(g_engine);
    CHECK(g_jobs_run == before + 8);
    for (int i = 0; i < 8; i++) {
        CHECK(lm_future_done(fs[i]));
        CHECK(lm_future_wait(fs[i], NULL) == LM_OK);
        lm_future_free(fs[i]);
    }
    for (int i = 0; i < 3; i++) {
        lm_step s;
        int guard = 0;
        do {
            CHECK(lm_engine_request_next(held[i], &s) == LM_OK);
        } while (s.finish == LM_FINISH_NONE && ++guard < 10000);
        CHECK(s.finish == LM_FINISH_CANCELLED || s.finish == LM_FINISH_LENGTH);
        lm_engine_request_free(held[i]);
    }
    unlink(g_path);
    rmdir(g_dir);
    TEST_MAIN_END();
}
