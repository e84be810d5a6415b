/* The fuser on tiny random models (fast; no downloads):
 *  - fused logits == a reference that applies the adapter unfused, for a llama GGUF
 *    base (Q/K un-permuted into the HF layout), a gemma3 GGUF base (norm offsets) and
 *    a qwen2 HF-folder base, MLX and PEFT layouts; a zero-scale adapter on the llama
 *    GGUF gives exactly the base's logits from the HF folder;
 *  - the fused folder loads by path and by repo id;
 *  - cache: a second fuse is a hit with zero base reads; another adapter gets another
 *    digest and folder;
 *  - bad input (corrupt, truncated, digest mismatch, shapes that do not fit, unknown
 *    module, mixed dtypes, missing base): clear errors and nothing left in the cache. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* scratch paths are short */
#endif
#include "adapters/codec.h"
#include "adapters/fuse.h"
#include "formats/hub.h"
#include "test.h"
#include "test_adapter_util.h"
#include "tiny_model.h"

static char g_dir[256], g_hub[300];
static lm_backend *g_b;

static const int32_t k_prompt[] = {5, 17, 99, 3, 250, 42, 7, 128, 64, 1, 200, 33};
enum { N_PROMPT = sizeof k_prompt / sizeof k_prompt[0] };

static lora_shape tiny_shape(const tiny_spec *s) {
    lora_shape l = {s->n_layer, s->n_embd, (int64_t)s->n_head * s->head_dim, (int64_t)s->n_head_kv * s->head_dim,
                    s->n_ff};
    return l;
}

/* Fuses `adapter` into `base`, checks fused logits against the reference. */
static void check_fused(const char *label, const char *base, const char *adapter_dir, const test_lora *L,
                        int out_dtype, double tol, lm_fuse_result *res_out) {
    char lmz[600];
    snprintf(lmz, sizeof lmz, "%s.lmz", adapter_dir);
    CHECK(lm_adapter_encode(adapter_dir, lmz) == LM_OK);
    lm_fuse_params p = lm_fuse_default_params();
    p.namespace_name = "test/fused";
    p.out_dtype = out_dtype;
    lm_fuse_result r;
    lm_status st = lm_adapter_fuse(base, lmz, &p, &r);
    if (st) fprintf(stderr, "%s: fuse: %s\n", label, lm_last_error());
    CHECK(st == LM_OK);
    if (st) return;
    CHECK(!r.cached && r.base_tensors_read > 0 && r.weights_adapted == L->n);
    ref_model R;
    lm_model_internal *fused = NULL;
    st = ref_load(base, g_b, L, &R);
    CHECK(st == LM_OK);
    lm_status fs = lm_model_internal_load(r.path, g_b, &fused);
    if (fs) fprintf(stderr, "%s: load fused: %s\n", label, lm_last_error());
    CHECK(fs == LM_OK);
    if (st == LM_OK && fs == LM_OK) {
        int64_t V = fused->hp.n_vocab;
        float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
        float *base_logits = malloc(sizeof(float) * (size_t)V);
        CHECK(tl_logits(fused, k_prompt, N_PROMPT, a) == LM_OK);
        CHECK(tl_logits(R.m, k_prompt, N_PROMPT, b) == LM_OK);
        double d = tl_max_diff(a, b, V);
        lm_model_internal *bm = NULL;
        CHECK(lm_model_internal_load(base, g_b, &bm) == LM_OK);
        CHECK(tl_logits(bm, k_prompt, N_PROMPT, base_logits) == LM_OK);
        double moved = tl_max_diff(base_logits, b, V);
        lm_model_internal_free(bm);
        fprintf(stderr, "%-28s fused vs reference max |diff| %.3g (tol %.0e); adapter moved logits by %.3g\n", label,
                d, tol, moved);
        CHECK(d <= tol);
        if (L->scale != 0.0f) CHECK(moved > 100 * tol); /* the adapter did something */
        free(a), free(b), free(base_logits);
    }
    lm_model_internal_free(fused);
    ref_free(&R);
    if (res_out) *res_out = r;
}

static void test_llama_gguf(void) {
    tiny_spec s = tiny_default(LM_ARCH_LLAMA);
    tiny_model m;
    tiny_build(&m, s);
    char base[600], ad[600];
    snprintf(base, sizeof base, "%s/llama.gguf", g_dir);
    CHECK(tiny_write_gguf(&m, base, NULL) == LM_OK);
    tiny_free(&m);

    /* zero scale: the folder must reproduce the GGUF model exactly */
    test_lora L;
    lora_spec z = {tiny_shape(&s), 0, 2, 4, 0x7f, LM_DTYPE_F32, false, 1.0f, 0.5f, 0.0f, 1};
    snprintf(ad, sizeof ad, "%s/llama_zero", g_dir);
    CHECK(tl_write_adapter(ad, &z, &L) == LM_OK);
    check_fused("llama gguf, zero adapter", base, ad, &L, LM_DTYPE_F32, 1e-4, NULL);
    tl_free(&L);

    lora_spec a = {tiny_shape(&s), 0, 2, 4, 0x7f, LM_DTYPE_BF16, false, 1.0f, 0.5f, 2.0f, 2};
    snprintf(ad, sizeof ad, "%s/llama_mlx", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    lm_fuse_result r1;
    check_fused("llama gguf, mlx bf16", base, ad, &L, LM_DTYPE_F32, 1e-3, &r1);

    /* by repo id */
    char resolved[4096];
    CHECK(lm_hub_resolve(r1.repo_id, resolved, sizeof resolved) == LM_OK);
    CHECK(strcmp(resolved, r1.path) == 0);
    char want_id[128];
    snprintf(want_id, sizeof want_id, "test/fused-%s", r1.digest);
    CHECK(strcmp(r1.repo_id, want_id) == 0);
    lm_model_internal *mm = NULL;
    CHECK(lm_model_internal_load(resolved, g_b, &mm) == LM_OK);
    lm_model_internal_free(mm);
    char base_by_id[4096];
    CHECK(lm_fuse_resolve_base(r1.repo_id, base_by_id, sizeof base_by_id) == LM_OK);

    /* second fuse: a cache hit that reads no base weight (the base is even gone) */
    char lmz[600], moved[600];
    snprintf(lmz, sizeof lmz, "%s.lmz", ad);
    snprintf(moved, sizeof moved, "%s.away", base);
    CHECK(rename(base, moved) == 0);
    lm_fuse_params p = lm_fuse_default_params();
    p.namespace_name = "test/fused";
    p.out_dtype = LM_DTYPE_F32;
    lm_fuse_result r2;
    CHECK(lm_adapter_fuse(base, lmz, &p, &r2) == LM_OK);
    CHECK(r2.cached && r2.base_tensors_read == 0 && strcmp(r2.path, r1.path) == 0);
    CHECK(rename(moved, base) == 0);
    /* the uncompressed folder has the same digest, so it hits too */
    CHECK(lm_adapter_fuse(base, ad, &p, &r2) == LM_OK);
    CHECK(r2.cached && r2.base_tensors_read == 0 && strcmp(r2.digest, r1.digest) == 0);
    tl_free(&L);

    /* another adapter: another digest, another folder; default dtype (bf16) */
    a.seed = 3;
    snprintf(ad, sizeof ad, "%s/llama_mlx2", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    snprintf(lmz, sizeof lmz, "%s.lmz", ad);
    CHECK(lm_adapter_encode(ad, lmz) == LM_OK);
    p.out_dtype = -1;
    lm_fuse_result r3;
    CHECK(lm_adapter_fuse(base, lmz, &p, &r3) == LM_OK);
    CHECK(!r3.cached && strcmp(r3.digest, r1.digest) != 0 && strcmp(r3.path, r1.path) != 0);
    char st_path[4200];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", r3.path);
    lm_safetensors *sf = NULL;
    CHECK(lm_safetensors_open(st_path, &sf) == LM_OK);
    if (sf) {
        const lm_tensor *t = lm_safetensors_find_tensor(sf, "model.layers.0.self_attn.q_proj.weight");
        CHECK(t && t->type == LM_DTYPE_BF16);
        CHECK(lm_safetensors_find_tensor(sf, "lm_head.weight") == NULL); /* tied */
    }
    lm_safetensors_close(sf);
    tl_free(&L);

    /* sharded output loads the same */
    a.seed = 4;
    snprintf(ad, sizeof ad, "%s/llama_mlx3", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    p.shard_bytes = 40000;
    p.out_dtype = LM_DTYPE_F32;
    CHECK(lm_adapter_fuse(base, ad, &p, &r3) == LM_OK);
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", r3.path);
    CHECK(access(idx, F_OK) == 0);
    CHECK(lm_model_internal_load(r3.path, g_b, &mm) == LM_OK);
    lm_model_internal_free(mm);
    tl_free(&L);
}

static void test_gemma3_gguf(void) {
    tiny_spec s = tiny_default(LM_ARCH_GEMMA3);
    tiny_model m;
    tiny_build(&m, s);
    char base[600], ad[600];
    snprintf(base, sizeof base, "%s/gemma3.gguf", g_dir);
    CHECK(tiny_write_gguf(&m, base, NULL) == LM_OK);
    tiny_free(&m);
    test_lora L;
    lora_spec a = {tiny_shape(&s), 1, 4, 8, 0x7f, LM_DTYPE_F16, true, 1.0f, 0.3f, 1.5f, 5};
    snprintf(ad, sizeof ad, "%s/gemma_peft", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    check_fused("gemma3 gguf, peft f16", base, ad, &L, LM_DTYPE_F32, 1e-3, NULL);
    tl_free(&L);
}

static void test_qwen2_folder(void) {
    tiny_spec s = tiny_default(LM_ARCH_QWEN2);
    tiny_model m;
    tiny_build(&m, s);
    char base[600], ad[600];
    snprintf(base, sizeof base, "%s/qwen2_hf", g_dir);
    CHECK(tiny_write_hf(&m, base) == LM_OK);
    tiny_free(&m);
    char tok[700];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", base);
    tl_write_text(tok, "{\"model\": {}}\n");
    test_lora L;
    lora_spec a = {tiny_shape(&s), 0, 2, 4, (1u << LM_LORA_Q) | (1u << LM_LORA_V) | (1u << LM_LORA_DOWN), LM_DTYPE_F32,
                   true, 1.0f, 0.5f, 2.0f, 6};
    snprintf(ad, sizeof ad, "%s/qwen_peft", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    lm_fuse_result r;
    check_fused("qwen2 folder, peft f32", base, ad, &L, -1, 1e-3, &r);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", r.path);
    CHECK(access(tok, F_OK) == 0); /* tokenizer files travel with a folder base */
    tl_free(&L);
}

/* ---- bad input ------------------------------------------------------------------- */

static void expect_fail(const char *label, const char *base, const char *adapter, const char *digest,
                        const char *needle) {
    int before = tl_count_entries(g_hub);
    lm_fuse_params p = lm_fuse_default_params();
    p.namespace_name = "test/bad";
    p.expected_digest = digest;
    lm_fuse_result r;
    lm_status st = lm_adapter_fuse(base, adapter, &p, &r);
    fprintf(stderr, "%-22s -> %s\n", label, lm_last_error());
    CHECK(st != LM_OK);
    CHECK(strstr(lm_last_error(), needle) != NULL);
    CHECK(tl_count_entries(g_hub) == before);
    char bad_repo[400];
    snprintf(bad_repo, sizeof bad_repo, "%s/models--test--bad-%s", g_hub, r.digest);
    CHECK(access(bad_repo, F_OK) != 0);
}

static int g_progress_calls;
static bool cancel_halfway(void *user, uint64_t done, uint64_t total) {
    (void)user;
    g_progress_calls++;
    return done < total / 2;
}

static void write_custom_adapter(const char *dir, const char *name_a, const char *name_b, lm_dtype ta, lm_dtype tb,
                                 const char *config) {
    mkdir(dir, 0755);
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    static float f[64 * 4];
    static uint16_t h[64 * 4];
    int64_t sa[2] = {64, 4}, sb[2] = {4, 64}; /* MLX: a [in, r], b [r, out] */
    lm_safetensors_writer_add(w, name_a, ta, 2, sa, ta == LM_DTYPE_F32 ? (void *)f : (void *)h);
    lm_safetensors_writer_add(w, name_b, tb, 2, sb, tb == LM_DTYPE_F32 ? (void *)f : (void *)h);
    char path[700];
    snprintf(path, sizeof path, "%s/adapters.safetensors", dir);
    lm_safetensors_writer_write(w, path);
    lm_safetensors_writer_free(w);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    tl_write_text(path, config);
}

static void test_bad_input(void) {
    char base[600], ad[600], lmz[600], bad[600];
    snprintf(base, sizeof base, "%s/llama.gguf", g_dir);
    tiny_spec s = tiny_default(LM_ARCH_LLAMA);
    test_lora L;
    lora_spec a = {tiny_shape(&s), 0, 2, 4, 0x7f, LM_DTYPE_BF16, false, 1.0f, 0.5f, 2.0f, 99};
    snprintf(ad, sizeof ad, "%s/bad_src", g_dir);
    CHECK(tl_write_adapter(ad, &a, &L) == LM_OK);
    tl_free(&L);
    snprintf(lmz, sizeof lmz, "%s.lmz", ad);
    CHECK(lm_adapter_encode(ad, lmz) == LM_OK);
    uint8_t *z = NULL;
    size_t zl = 0;
    CHECK(lm_adapter_read_file(lmz, 1 << 30, &z, &zl) == LM_OK);
    if (!z) return;

    snprintf(bad, sizeof bad, "%s/corrupt.lmz", g_dir);
    z[zl / 2] ^= 0x21;
    lm_adapter_write_file_atomic(bad, z, zl);
    z[zl / 2] ^= 0x21;
    expect_fail("corrupt adapter", base, bad, NULL, "corrupt");

    snprintf(bad, sizeof bad, "%s/truncated.lmz", g_dir);
    lm_adapter_write_file_atomic(bad, z, zl - 100);
    expect_fail("truncated adapter", base, bad, NULL, "truncated");
    free(z);

    expect_fail("digest mismatch", base, lmz, "ffffffffffffffff", "digest mismatch");

    /* SmolLM2-shaped adapter on the tiny base */
    lora_spec big = {k_smollm2_135m, 0, 1, 4, 0x1, LM_DTYPE_BF16, true, 1.0f, 0.5f, 2.0f, 8};
    snprintf(ad, sizeof ad, "%s/bad_shape", g_dir);
    CHECK(tl_write_adapter(ad, &big, &L) == LM_OK);
    tl_free(&L);
    expect_fail("shape mismatch", base, ad, NULL, "does not fit the base");

    /* a layer the base does not have */
    lora_spec deep = a;
    deep.first_layer = 5;
    deep.n_layers = 1;
    snprintf(ad, sizeof ad, "%s/bad_layer", g_dir);
    CHECK(tl_write_adapter(ad, &deep, &L) == LM_OK);
    tl_free(&L);
    expect_fail("layer out of range", base, ad, NULL, "no such weight");

    /* unknown target module: in the config, and as a tensor */
    snprintf(ad, sizeof ad, "%s/bad_target_cfg", g_dir);
    write_custom_adapter(ad, "model.layers.0.self_attn.q_proj.lora_a", "model.layers.0.self_attn.q_proj.lora_b",
                         LM_DTYPE_F32, LM_DTYPE_F32,
                         "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", "
                         "\"c_attn\"]}");
    expect_fail("unknown module (config)", base, ad, NULL, "unknown target module 'c_attn'");
    snprintf(ad, sizeof ad, "%s/bad_target_tensor", g_dir);
    write_custom_adapter(ad, "model.layers.0.self_attn.qkv_proj.lora_a", "model.layers.0.self_attn.qkv_proj.lora_b",
                         LM_DTYPE_F32, LM_DTYPE_F32,
                         "{\"lora_parameters\": {\"rank\": 4, \"scale\": 2.0}, \"num_layers\": 1}");
    expect_fail("unknown module (tensor)", base, ad, NULL, "unknown module 'qkv_proj'");

    /* mixed dtypes */
    snprintf(ad, sizeof ad, "%s/bad_mixed", g_dir);
    write_custom_adapter(ad, "model.layers.0.self_attn.q_proj.lora_a", "model.layers.0.self_attn.q_proj.lora_b",
                         LM_DTYPE_F32, LM_DTYPE_BF16, "{\"lora_parameters\": {\"rank\": 4, \"scale\": 2.0}}");
    expect_fail("mixed dtypes", base, ad, NULL, "mixed dtypes");

    /* no config travelled with a bare safetensors file */
    snprintf(ad, sizeof ad, "%s/bad_src/adapters.safetensors", g_dir);
    snprintf(bad, sizeof bad, "%s/bare.lmz", g_dir);
    CHECK(lm_adapter_encode(ad, bad) == LM_OK);
    expect_fail("no adapter_config", base, bad, NULL, "adapter_config.json");

    /* cancelled halfway through writing: the temporary folder goes away */
    {
        int before = tl_count_entries(g_hub);
        lm_fuse_params p = lm_fuse_default_params();
        p.namespace_name = "test/cancel";
        p.progress = cancel_halfway;
        lm_fuse_result r;
        CHECK(lm_adapter_fuse(base, lmz, &p, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "cancelled"));
        fprintf(stderr, "%-22s -> %s\n", "cancelled", lm_last_error());
        CHECK(g_progress_calls > 3);
        CHECK(tl_count_entries(g_hub) == before);
    }

    /* a base that is nowhere */
    expect_fail("missing base", "someorg/no-such-model", lmz, NULL, "models--someorg--no-such-model");
    CHECK(strstr(lm_last_error(), "/models/someorg/no-such-model") != NULL);
    lm_fuse_params p = lm_fuse_default_params();
    p.namespace_name = "../escape";
    lm_fuse_result r;
    CHECK(lm_adapter_fuse(base, lmz, &p, &r) == LM_ERR_INVALID_ARG && strstr(lm_last_error(), "namespace"));
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/lumen_test_fuse_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    char hf[300];
    snprintf(hf, sizeof hf, "%s/hf", g_dir);
    setenv("HF_HOME", hf, 1);
    unsetenv("HF_HUB_CACHE");
    snprintf(g_hub, sizeof g_hub, "%s/hub", hf);
    mkdir(hf, 0755);
    mkdir(g_hub, 0755);
    if (lm_backend_cpu_create(1, &g_b)) return 1;
    test_llama_gguf();
    test_gemma3_gguf();
    test_qwen2_folder();
    test_bad_input();
    lm_backend_free(g_b);
    tl_rm_tree(g_dir);
    TEST_MAIN_END();
}
