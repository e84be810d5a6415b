/* `lumen convert` on a real model (golden_hf_export MODEL; MODEL pulled with `lumen
 * pull`, skipped with exit 77 when it is not):
 *   - the bf16 folder loads in Lumen, and its last-token logits equal those of the
 *     GGUF with its weights rounded to bf16 (hf_export_util.h) within TOL below —
 *     exactly for qwen2/gemma3, where the forward pass is the same; llama's un-permuted
 *     Q/K rows only change the order of each head's q·k sum — on prompts of 8 to 700
 *     tokens (Gemma: past its 512-token sliding window);
 *   - against the published quantized GGUF the folder is only as close as bf16 vs the
 *     quantization allows: printed (max |diff|, top-1 agreement), not asserted;
 *   - the folder's tokenizer gives the GGUF tokenizer's ids on the 298-string golden
 *     corpus (tests/golden/tokenizer/), with and without special tokens and BOS;
 *   - the chat template renders byte-identically through the public API. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* scratch paths are short */
#endif
#include <cjson/cJSON.h>
#include <time.h>
#include <unistd.h>

#include "export/hf_export.h"
#include "formats/model_store.h"
#include "hf_export_util.h"
#include "lumen.h"
#include "test.h"

#define TOL_LLAMA 1e-4 /* measured 2.6e-5 on smollm2-135m (logits of magnitude ~20) */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static size_t unhex(const char *hex, char *out) {
    size_t n = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned v;
        sscanf(hex, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

static const char *const k_prompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWhat is 12 * 7? Answer briefly.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
};
enum { N_PROMPTS = sizeof k_prompts / sizeof k_prompts[0] };

/* A long prompt: the story repeated (past Gemma's 512-token window). */
static int long_prompt(const lm_tokenizer *tok, int32_t *ids, int cap) {
    char text[8192] = "";
    while (strlen(text) + 200 < sizeof text)
        strcat(text, "Once upon a time, in a small village by the sea, there lived an old fisherman who told "
                     "stories about the stars, the tides and the twelve ships that never came home. ");
    size_t n = 0;
    int32_t *all = NULL;
    if (lm_tokenizer_encode_alloc(tok, text, strlen(text), true, true, &all, &n)) return 0;
    int k = (int)n < cap ? (int)n : cap;
    memcpy(ids, all, sizeof(int32_t) * (size_t)k);
    free(all);
    return k;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "smollm2-135m";
    char gguf[4096];
    if (lm_model_store_resolve(name, gguf, sizeof gguf) != LM_OK) {
        fprintf(stderr, "SKIP: %s is not pulled (run `lumen pull %s`): %s\n", name, name, lm_last_error());
        return LM_TEST_SKIP;
    }
    char tmp[256], out[320], ref[320];
    snprintf(tmp, sizeof tmp, "/tmp/lumen_golden_hf_export_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    snprintf(out, sizeof out, "%s/hf", tmp);
    snprintf(ref, sizeof ref, "%s/ref-bf16.gguf", tmp);

    double t0 = now();
    lm_hf_export_result r;
    lm_status st = lm_hf_export(gguf, out, NULL, &r);
    if (st) fprintf(stderr, "convert: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    double t_convert = now() - t0;
    fprintf(stderr, "%s: converted in %.1f s: %s, %lld tensors, %.1f MiB bf16, vocab %lld, %lld merges, %lld added\n",
            name, t_convert, r.architecture, (long long)r.n_tensors, (double)r.weight_bytes / 1048576.0,
            (long long)r.n_vocab, (long long)r.n_merges, (long long)r.n_added_tokens);
    CHECK(hx_write_bf16_reference(gguf, ref) == LM_OK);

    lm_backend *be = NULL;
    if (lm_backend_cpu_create(2, &be)) return 1;
    lm_model_internal *mf = NULL, *mr = NULL, *mq = NULL;
    st = lm_model_internal_load(out, be, &mf);
    if (st) fprintf(stderr, "load folder: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    CHECK(lm_model_internal_load(ref, be, &mr) == LM_OK);
    CHECK(lm_model_internal_load(gguf, be, &mq) == LM_OK);
    lm_gguf *g = NULL;
    lm_tokenizer *tg = NULL, *tf = NULL;
    CHECK(lm_gguf_open(gguf, &g) == LM_OK && lm_tokenizer_from_gguf(g, &tg) == LM_OK);
    st = lm_tokenizer_from_hf_folder(out, &tf);
    if (st) fprintf(stderr, "folder tokenizer: %s\n", lm_last_error());
    CHECK(st == LM_OK);

    if (mf && mr && mq && tg) {
        bool llama = mf->hp.arch == LM_ARCH_LLAMA;
        double tol = llama ? TOL_LLAMA : 0.0;
        int64_t V = mf->hp.n_vocab;
        float *lf = malloc(sizeof(float) * (size_t)V), *lr = malloc(sizeof(float) * (size_t)V);
        float *lq = malloc(sizeof(float) * (size_t)V);
        int32_t ids[1024];
        double worst = 0, worst_q = 0;
        int agree_q = 0, n_runs = 0;
        bool gemma = mf->hp.arch == LM_ARCH_GEMMA3;
        for (int p = 0; p <= N_PROMPTS; p++) {
            int n;
            if (p < N_PROMPTS) {
                size_t k = 0;
                lm_tokenizer_encode(tg, k_prompts[p], strlen(k_prompts[p]), true, true, ids, 1024, &k);
                n = (int)k;
            } else {
                /* the long one: past the sliding window where there is one */
                n = long_prompt(tg, ids, gemma ? 700 : 300);
            }
            double t1 = now();
            CHECK(hx_logits(mf, ids, n, lf) == LM_OK);
            CHECK(hx_logits(mr, ids, n, lr) == LM_OK);
            CHECK(hx_logits(mq, ids, n, lq) == LM_OK);
            double d = hx_max_diff(lf, lr, V), dq = hx_max_diff(lf, lq, V);
            int64_t af = hx_argmax(lf, V), ar = hx_argmax(lr, V), aq = hx_argmax(lq, V);
            fprintf(stderr,
                    "  prompt %d (%d tokens): folder vs bf16-rounded GGUF max |diff| %.3g, top-1 %lld/%lld; vs the "
                    "quantized GGUF max |diff| %.3g, top-1 %s (%.1f s)\n",
                    p, n, d, (long long)af, (long long)ar, dq, af == aq ? "same" : "differs", now() - t1);
            CHECK(d <= tol);
            CHECK(af == ar);
            worst = fmax(worst, d);
            worst_q = fmax(worst_q, dq);
            agree_q += af == aq;
            n_runs++;
        }
        fprintf(stderr,
                "%s: logits of the folder vs the GGUF's weights rounded to bf16: max |diff| %.3g (tolerance %.3g); "
                "vs the quantized GGUF: max |diff| %.3g, top-1 agreement %d/%d\n",
                name, worst, tol, worst_q, agree_q, n_runs);
        free(lf), free(lr), free(lq);
    }

    /* tokenizer on the golden corpus */
    char gold[4096];
    const char *corpus = strncmp(name, "qwen2.5-coder", 13) == 0 ? "qwen2.5-coder-1.5b" : name;
    snprintf(gold, sizeof gold, "%s/tests/golden/tokenizer/%s.json", LUMEN_SOURCE_DIR, corpus);
    char *text = test_read_text(gold);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (root && tg && tf) {
        int n = 0, same = 0;
        const cJSON *c;
        static char buf[1 << 16];
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
            const cJSON *hex = cJSON_GetObjectItem(c, "hex");
            if (!cJSON_IsString(hex) || strlen(hex->valuestring) / 2 >= sizeof buf) continue;
            size_t len = unhex(hex->valuestring, buf);
            bool ok = hx_same_tokens(tg, tf, buf, len, false, false) && hx_same_tokens(tg, tf, buf, len, false, true) &&
                      hx_same_tokens(tg, tf, buf, len, true, true);
            if (!ok) fprintf(stderr, "  tokens differ: %.60s\n", cJSON_GetObjectItem(c, "text")->valuestring);
            n++;
            same += ok;
        }
        fprintf(stderr, "%s: tokenizer.json vs the GGUF vocabulary: %d/%d corpus strings identical (three modes)\n",
                name, same, n);
        CHECK(n > 250 && same == n);
    }
    cJSON_Delete(root);

    /* the chat template through the public API */
    lm_model_params mp = lm_model_default_params();
    mp.n_threads = 1;
    mp.n_ctx = 256;
    lm_model *pg = NULL, *pf = NULL;
    CHECK(lm_model_load(gguf, mp, &pg) == LM_OK);
    st = lm_model_load(out, mp, &pf);
    if (st) fprintf(stderr, "lm_model_load folder: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    if (pg && pf) {
        CHECK(lm_model_has_chat_template(pg) == lm_model_has_chat_template(pf));
        if (lm_model_has_chat_template(pg)) {
            lm_chat_message msgs[] = {{"system", "You are terse."}, {"user", "Hi!"}, {"assistant", "Hello."},
                                      {"user", "What is 2+2?"}};
            static char a[8192], b[8192];
            size_t na = 0, nb = 0;
            lm_chat_params cp = lm_chat_default_params();
            CHECK(lm_chat_render(pg, msgs, 4, cp, a, sizeof a, &na) == LM_OK);
            CHECK(lm_chat_render(pf, msgs, 4, cp, b, sizeof b, &nb) == LM_OK);
            CHECK(na == nb && na < sizeof a && memcmp(a, b, na) == 0);
            fprintf(stderr, "%s: chat template renders identically (%zu bytes)\n", name, na);
        }
    }
    lm_model_free(pg);
    lm_model_free(pf);

    lm_tokenizer_free(tg);
    lm_tokenizer_free(tf);
    lm_gguf_close(g);
    lm_model_internal_free(mf);
    lm_model_internal_free(mr);
    lm_model_internal_free(mq);
    lm_backend_free(be);
    hx_rm_tree(tmp);
    TEST_MAIN_END();
}
