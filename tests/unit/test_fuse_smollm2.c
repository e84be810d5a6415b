/* Fusing on the real SmolLM2-135M (Q4_1 GGUF, pulled with `lumen pull smollm2-135m`;
 * skipped when absent): a random rank-16 adapter on all seven projections of all 30
 * layers, PEFT layout, BF16. The fused folder (F32) must give the logits of the
 * unfused reference (base dequantized to f32, delta added in double) within 1e-3 max
 * abs, the adapter must change the greedy next token on at least one prompt, and the
 * folder must load by path and by repo id. A second fuse is a cache hit. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* scratch paths are short */
#endif
#include "adapters/codec.h"
#include "adapters/fuse.h"
#include "formats/hub.h"
#include "formats/model_store.h"
#include "test.h"
#include "test_adapter_util.h"

static const int32_t k_prompts[][8] = {
    {1, 504, 3458, 314, 2012, 30, 1780, 28},
    {1, 9690, 198, 2683, 359, 253, 5356, 5646},
    {1, 22, 23, 24, 25, 26, 27, 28},
    {1, 1096, 2102, 7380, 11, 3065, 288, 17},
};
enum { N_PROMPTS = 4, PROMPT_LEN = 8 };

int main(void) {
    char base[4096];
    if (lm_model_store_resolve("smollm2-135m", base, sizeof base) != LM_OK) {
        fprintf(stderr, "SKIP: smollm2-135m is not pulled (run `lumen pull smollm2-135m`): %s\n", lm_last_error());
        return LM_TEST_SKIP;
    }
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/lumen_test_fuse_smollm2_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char hf[300], ad[300], lmz[320];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    setenv("HF_HOME", hf, 1);
    unsetenv("HF_HUB_CACHE");
    lm_backend *b = NULL;
    if (lm_backend_cpu_create(2, &b)) return 1;

    test_lora L;
    lora_spec spec = {k_smollm2_135m, 0, 30, 16, 0x7f, LM_DTYPE_BF16, true, 1.0f, 0.05f, 2.0f, 2024};
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    CHECK(tl_write_adapter(ad, &spec, &L) == LM_OK);
    snprintf(lmz, sizeof lmz, "%s/adapter.lmz", dir);
    CHECK(lm_adapter_encode(ad, lmz) == LM_OK);

    lm_fuse_params p = lm_fuse_default_params();
    p.namespace_name = "lumen-test/smollm2-lora";
    p.out_dtype = LM_DTYPE_F32;
    lm_fuse_result r;
    lm_status st = lm_adapter_fuse(base, lmz, &p, &r);
    if (st) fprintf(stderr, "fuse: %s\n", lm_last_error());
    CHECK(st == LM_OK && !r.cached && r.weights_adapted == 7 * 30 && r.base_tensors_read > 0);
    fprintf(stderr, "fused into %s (repo id %s), %lld base tensors read\n", r.path, r.repo_id,
            (long long)r.base_tensors_read);

    ref_model R;
    lm_model_internal *fused = NULL, *plain = NULL, *by_id = NULL;
    CHECK(ref_load(base, b, &L, &R) == LM_OK);
    CHECK(lm_model_internal_load(base, b, &plain) == LM_OK);
    st = lm_model_internal_load(r.path, b, &fused);
    if (st) fprintf(stderr, "load fused: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    char resolved[4096];
    CHECK(lm_hub_resolve(r.repo_id, resolved, sizeof resolved) == LM_OK && strcmp(resolved, r.path) == 0);
    CHECK(lm_model_internal_load(resolved, b, &by_id) == LM_OK);
    if (R.m && fused && plain && by_id) {
        int64_t V = fused->hp.n_vocab;
        float *lf = malloc(sizeof(float) * (size_t)V), *lr = malloc(sizeof(float) * (size_t)V);
        float *lp = malloc(sizeof(float) * (size_t)V), *li = malloc(sizeof(float) * (size_t)V);
        int changed = 0;
        double worst = 0;
        for (int i = 0; i < N_PROMPTS; i++) {
            CHECK(tl_logits(fused, k_prompts[i], PROMPT_LEN, lf) == LM_OK);
            CHECK(tl_logits(R.m, k_prompts[i], PROMPT_LEN, lr) == LM_OK);
            CHECK(tl_logits(plain, k_prompts[i], PROMPT_LEN, lp) == LM_OK);
            if (i == 0) {
                CHECK(tl_logits(by_id, k_prompts[i], PROMPT_LEN, li) == LM_OK);
                CHECK(tl_max_diff(li, lf, V) == 0.0);
            }
            double d = tl_max_diff(lf, lr, V);
            worst = fmax(worst, d);
            int gf = tl_argmax(lf, V), gr = tl_argmax(lr, V), gp = tl_argmax(lp, V);
            fprintf(stderr, "prompt %d: fused vs reference max |diff| %.3g; greedy base %d -> adapted %d (reference %d)\n",
                    i, d, gp, gf, gr);
            CHECK(d <= 1e-3);
            CHECK(gf == gr);
            if (gf != gp) changed++;
        }
        fprintf(stderr, "worst max |diff| %.3g (tolerance 1e-3); greedy token changed on %d of %d prompts\n", worst,
                changed, N_PROMPTS);
        CHECK(changed > 0);
        free(lf), free(lr), free(lp), free(li);
    }
    lm_model_internal_free(fused);
    lm_model_internal_free(plain);
    lm_model_internal_free(by_id);
    ref_free(&R);

    /* the second fuse is a cache hit: no base tensor read */
    lm_fuse_result r2;
    CHECK(lm_adapter_fuse(base, lmz, &p, &r2) == LM_OK);
    CHECK(r2.cached && r2.base_tensors_read == 0 && strcmp(r2.path, r.path) == 0);

    tl_free(&L);
    lm_backend_free(b);
    tl_rm_tree(dir);
    TEST_MAIN_END();
}
