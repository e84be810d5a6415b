/* The forward pass on tiny random models of every architecture:
 *  - a sequence fed as one batch and one token at a time gives the same logits;
 *  - sequences interleaved in one batch give what each gives alone;
 *  - a GGUF file and the same weights as a Hugging Face folder give the same logits;
 *  - malformed models and batches fail with a clear error. */
#include <unistd.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "test.h"
#include "tiny_model.h"

enum { N_TOK = 23 };

static char g_dir[256];

static lm_model_internal *load(lm_backend *b, const char *path) {
    lm_model_internal *m = NULL;
    lm_status st = lm_model_internal_load(path, b, &m);
    if (st) fprintf(stderr, "load %s: %s\n", path, lm_last_error());
    CHECK(st == LM_OK);
    return m;
}

static void prompt_tokens(int32_t *tok, int n, int n_vocab, int salt) {
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + salt * 11 + 5) % n_vocab);
}

/* all logits of one sequence fed as one batch */
static void run_batch(lm_model_internal *m, const int32_t *tok, int n, float *logits) {
    int32_t pos[64], seq[64];
    int8_t want[64];
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0, want[i] = 1;
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_for_model(m, 64, 1, LM_DTYPE_F32, &kv) == LM_OK);
    lm_batch b = {n, tok, pos, seq, want};
    CHECK(lm_forward(m, kv, &b, logits) == LM_OK);
    lm_kv_cache_free(kv);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void test_batch_invariance(lm_model_internal *m) {
    int64_t V = m->hp.n_vocab;
    int32_t tok[N_TOK], tok2[N_TOK];
    prompt_tokens(tok, N_TOK, (int)V, 1);
    prompt_tokens(tok2, N_TOK, (int)V, 2);
    float *whole = malloc(sizeof(float) * (size_t)(N_TOK * V));
    float *step = malloc(sizeof(float) * (size_t)(N_TOK * V));
    float *mixed = malloc(sizeof(float) * (size_t)(2 * N_TOK * V));
    float *whole2 = malloc(sizeof(float) * (size_t)(N_TOK * V));
    run_batch(m, tok, N_TOK, whole);
    run_batch(m, tok2, N_TOK, whole2);

    /* one token at a time (decode steps) */
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_for_model(m, 64, 1, LM_DTYPE_F32, &kv) == LM_OK);
    for (int i = 0; i < N_TOK; i++) {
        int32_t p = i, s = 0;
        lm_batch b = {1, &tok[i], &p, &s, NULL};
        CHECK(lm_forward(m, kv, &b, step + i * V) == LM_OK);
    }
    lm_kv_cache_free(kv);
    double d1 = max_diff(whole, step, N_TOK * V);

    /* two sequences interleaved token by token in one batch, in two chunks */
    CHECK(lm_kv_cache_for_model(m, 64, 2, LM_DTYPE_F32, &kv) == LM_OK);
    int32_t t[2 * N_TOK], pos[2 * N_TOK], seq[2 * N_TOK];
    int8_t want[2 * N_TOK];
    for (int i = 0; i < N_TOK; i++) {
        t[2 * i] = tok[i], pos[2 * i] = i, seq[2 * i] = 0;
        t[2 * i + 1] = tok2[i], pos[2 * i + 1] = i, seq[2 * i + 1] = 1;
    }
    memset(want, 1, sizeof want);
    int split = 2 * 9;
    lm_batch b1 = {split, t, pos, seq, want};
    lm_batch b2 = {2 * N_TOK - split, t + split, pos + split, seq + split, want};
    CHECK(lm_forward(m, kv, &b1, mixed) == LM_OK);
    CHECK(lm_forward(m, kv, &b2, mixed + split * V) == LM_OK);
    lm_kv_cache_free(kv);
    double d2 = 0;
    for (int i = 0; i < N_TOK; i++) {
        d2 = fmax(d2, max_diff(mixed + (2 * i) * V, whole + i * V, V));
        d2 = fmax(d2, max_diff(mixed + (2 * i + 1) * V, whole2 + i * V, V));
    }
    printf("  %s: batch vs one-at-a-time max |diff| %.3g, interleaved vs alone %.3g\n", lm_arch_name(m->hp.arch), d1,
           d2);
    /* each token's logits are computed by the same operations in the same order
     * whatever else is in the batch: exactly equal */
    CHECK(d1 == 0.0);
    CHECK(d2 == 0.0);
    /* the logits are not degenerate */
    CHECK(max_diff(whole, whole + V, V) > 1e-3);
    free(whole), free(step), free(mixed), free(whole2);
}

static void test_arch(lm_backend *b, lm_arch arch, lm_dtype type) {
    tiny_spec s = tiny_default(arch);
    s.matrix_type = type;
    tiny_model tm;
    tiny_build(&tm, s);
    char gguf[512], hf[512];
    snprintf(gguf, sizeof gguf, "%s/%s.gguf", g_dir, lm_arch_name(arch));
    CHECK(tiny_write_gguf(&tm, gguf, NULL) == LM_OK);
    lm_model_internal *m = load(b, gguf);
    if (!m) return;
    CHECK(m->hp.arch == arch);
    test_batch_invariance(m);

    if (arch != LM_ARCH_LLAMA) {
        /* the same weights as a Hugging Face folder; both files in F32, so both take
         * the same (f32) matrix path and must agree exactly */
        lm_model_internal_free(m);
        tm.spec.matrix_type = LM_DTYPE_F32;
        snprintf(gguf, sizeof gguf, "%s/%s-f32.gguf", g_dir, lm_arch_name(arch));
        CHECK(tiny_write_gguf(&tm, gguf, NULL) == LM_OK);
        m = load(b, gguf);
        snprintf(hf, sizeof hf, "%s/%s-hf", g_dir, lm_arch_name(arch));
        CHECK(tiny_write_hf(&tm, hf) == LM_OK);
        if (m) test_batch_invariance(m); /* the f32 path is batch-invariant too */
        lm_model_internal *h = m ? load(b, hf) : NULL;
        if (h) {
            int64_t V = m->hp.n_vocab;
            int32_t tok[N_TOK];
            prompt_tokens(tok, N_TOK, (int)V, 3);
            float *a = malloc(sizeof(float) * (size_t)(N_TOK * V)), *c = malloc(sizeof(float) * (size_t)(N_TOK * V));
            run_batch(m, tok, N_TOK, a);
            run_batch(h, tok, N_TOK, c);
            double d = max_diff(a, c, N_TOK * V);
            printf("  %s: GGUF vs Hugging Face folder max |diff| %.3g\n", lm_arch_name(arch), d);
            CHECK(d == 0.0);
            free(a), free(c);
            lm_model_internal_free(h);
        }
    }
    lm_model_internal_free(m);
    tiny_free(&tm);
}

static void expect_load_error(lm_backend *b, const char *path, lm_status want, const char *needle) {
    lm_model_internal *m = NULL;
    lm_status st = lm_model_internal_load(path, b, &m);
    printf("  bad input -> %s: %s\n", lm_status_str(st), lm_last_error());
    CHECK(st == want);
    CHECK(m == NULL);
    CHECK(strstr(lm_last_error(), needle) != NULL);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_bad_models(lm_backend *b) {
    tiny_model tm;
    tiny_build(&tm, tiny_default(LM_ARCH_LLAMA));
    char path[512];

    snprintf(path, sizeof path, "%s/missing.gguf", g_dir);
    CHECK(tiny_write_gguf(&tm, path, "blk.1.ffn_up.weight") == LM_OK);
    expect_load_error(b, path, LM_ERR_FORMAT, "blk.1.ffn_up.weight");

    /* a layer's tensor with the wrong shape: swap n_ff for something else */
    tiny_spec s = tiny_default(LM_ARCH_LLAMA);
    tiny_model bad;
    tiny_build(&bad, s);
    for (int i = 0; i < bad.n; i++)
        if (strcmp(bad.t[i].gguf_name, "blk.0.attn_k.weight") == 0) bad.t[i].ne1 = 16; /* expected 32 */
    snprintf(path, sizeof path, "%s/shape.gguf", g_dir);
    CHECK(tiny_write_gguf(&bad, path, NULL) == LM_OK);
    expect_load_error(b, path, LM_ERR_FORMAT, "blk.0.attn_k.weight");
    tiny_free(&bad);

    /* unknown architecture */
    lm_gguf_writer *w = lm_gguf_writer_create();
    lm_gguf_writer_set_str(w, "general.architecture", "mamba9");
    snprintf(path, sizeof path, "%s/arch.gguf", g_dir);
    CHECK(lm_gguf_writer_write(w, path) == LM_OK);
    lm_gguf_writer_free(w);
    expect_load_error(b, path, LM_ERR_UNSUPPORTED, "mamba9");

    /* absurd dimensions: zero heads */
    w = lm_gguf_writer_create();
    lm_gguf_writer_set_str(w, "general.architecture", "llama");
    lm_gguf_writer_set_u32(w, "llama.embedding_length", 64);
    lm_gguf_writer_set_u32(w, "llama.block_count", 2);
    lm_gguf_writer_set_u32(w, "llama.feed_forward_length", 128);
    lm_gguf_writer_set_u32(w, "llama.attention.head_count", 0);
    lm_gguf_writer_set_u32(w, "llama.vocab_size", 256);
    snprintf(path, sizeof path, "%s/heads.gguf", g_dir);
    CHECK(lm_gguf_writer_write(w, path) == LM_OK);
    lm_gguf_writer_free(w);
    expect_load_error(b, path, LM_ERR_FORMAT, "head");

    /* truncated file */
    snprintf(path, sizeof path, "%s/llama.gguf", g_dir);
    CHECK(tiny_write_gguf(&tm, path, NULL) == LM_OK);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(truncate(path, size / 2) == 0);
    expect_load_error(b, path, LM_ERR_FORMAT, "llama.gguf");

    /* config.json that does not parse; unknown model_type */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/badcfg", g_dir);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{\"model_type\": \"llama\", \"hidden_size\": 64,");
    expect_load_error(b, dir, LM_ERR_FORMAT, "config.json");
    write_text(path, "{\"model_type\": \"rwkv\"}");
    expect_load_error(b, dir, LM_ERR_UNSUPPORTED, "rwkv");

    expect_load_error(b, "/nonexistent/model.gguf", LM_ERR_NOT_FOUND, "/nonexistent/model.gguf");
    tiny_free(&tm);
}

static void test_bad_batch(lm_backend *b) {
    tiny_model tm;
    tiny_build(&tm, tiny_default(LM_ARCH_LLAMA));
    char path[512];
    snprintf(path, sizeof path, "%s/ok.gguf", g_dir);
    CHECK(tiny_write_gguf(&tm, path, NULL) == LM_OK);
    lm_model_internal *m = load(b, path);
    if (!m) return;
    lm_kv_cache *kv;
    CHECK(lm_kv_cache_for_model(m, 32, 1, LM_DTYPE_F32, &kv) == LM_OK);
    float logits[256];
    int32_t tok = 256, pos = 0, seq = 0; /* vocabulary is 256: out of range */
    lm_batch batch = {1, &tok, &pos, &seq, NULL};
    CHECK(lm_forward(m, kv, &batch, logits) == LM_ERR_INVALID_ARG);
    tok = 1, seq = 5;
    CHECK(lm_forward(m, kv, &batch, logits) == LM_ERR_INVALID_ARG);
    seq = 0, pos = 40; /* beyond the cache's 32 positions */
    CHECK(lm_forward(m, kv, &batch, logits) == LM_ERR_NO_MEMORY);
    batch.n_tokens = 0;
    CHECK(lm_forward(m, kv, &batch, logits) == LM_ERR_INVALID_ARG);
    lm_kv_cache_free(kv);
    lm_model_internal_free(m);
    tiny_free(&tm);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen-test-forward-%d", (int)getpid());
    mkdir(g_dir, 0755);
    lm_backend *b;
    CHECK(lm_backend_cpu_create(2, &b) == LM_OK);
    test_arch(b, LM_ARCH_LLAMA, LM_DTYPE_Q4_1);
    test_arch(b, LM_ARCH_QWEN2, LM_DTYPE_Q8_0);
    test_arch(b, LM_ARCH_GEMMA3, LM_DTYPE_Q5_0);
    test_bad_models(b);
    test_bad_batch(b);
    lm_backend_free(b);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_MAIN_END();
}
