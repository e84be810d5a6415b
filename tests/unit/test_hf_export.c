/* `lumen convert MODEL OUT_DIR` on tiny random models of the three architectures, each
 * with a tokenizer in its GGUF (byte-level BPE with the smollm / qwen2 / llama-bpe
 * pre-tokenizers, and a SentencePiece-style vocabulary for Gemma 3):
 *   - the folder loads in Lumen with the GGUF's hyperparameters, and its logits equal
 *     those of the GGUF with its weights rounded to bf16 (hf_export_util.h), within
 *     the tolerance measured here (exactly equal where the forward pass is the same;
 *     llama differs only in the order of each head's q·k sum, its rows un-permuted);
 *   - its tokenizer (tokenizer.json + tokenizer_config.json) gives the GGUF
 *     tokenizer's ids on a corpus, with and without special tokens;
 *   - f32 output, sharding (model-0000i-of-0000n + index, same logits), a GGUF
 *     without a tokenizer, the chat template, generation_config.json;
 *   - bad input: an unknown architecture, an unknown tensor, an unwritable OUT_DIR, an
 *     existing non-empty OUT_DIR (refused; replaced with force; never when it holds
 *     the input), a cancelled conversion; no temporary folder is ever left behind. */
#include <cjson/cJSON.h>
#include <unistd.h>

#include "export/hf_export.h"
#include "formats/gguf_convert.h"
#include "hf_export_util.h"
#include "test.h"
#include "tiny_model.h"
#include "tiny_tokenizer.h"

/* ---- GGUF tokenizers --------------------------------------------------------------- */

typedef struct bpe_opts {
    const char *pre;
    bool add_bos;
} bpe_opts;

static void add_bpe(lm_gguf_writer *w, void *user) {
    const bpe_opts *o = user;
    add_tokenizer(w, NULL);
    lm_gguf_writer_set_str(w, "tokenizer.ggml.pre", o->pre);
    lm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", o->add_bos);
}

/* A SentencePiece-style ("llama") vocabulary: specials, 256 byte tokens, and pieces
 * whose scores decide the merges. */
static const char *const k_spm_pieces[] = {
    "\xe2\x96\x81", "a", "b", "c", "t", "h", "e", "\xe2\x96\x81" "a", "ab", "bc", "\xe2\x96\x81" "t", "he", "th",
    "\xe2\x96\x81" "ab", "abc", "\xe2\x96\x81" "the", "the", "\xe2\x96\x81" "abc", "cab", "ca", "\xe2\x96\x81\xe2\x96\x81",
    "\xe4\xb8\xad", /* 中 */
};
enum { SPM_N_SPECIAL = 4, SPM_N_PIECES = sizeof k_spm_pieces / sizeof k_spm_pieces[0] };
enum { SPM_EXTRA = 4 }; /* "\n\n" (user-defined), <start_of_turn>, <end_of_turn>, <unused0> (control) */
enum { SPM_N_VOCAB = SPM_N_SPECIAL + 256 + SPM_N_PIECES + SPM_EXTRA };

static void add_spm(lm_gguf_writer *w, void *user) {
    (void)user;
    static char bytes[256][8];
    const char *tok[SPM_N_VOCAB];
    float score[SPM_N_VOCAB];
    int32_t type[SPM_N_VOCAB];
    int n = 0;
    const char *spec[SPM_N_SPECIAL] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    for (int i = 0; i < SPM_N_SPECIAL; i++, n++) tok[n] = spec[i], score[n] = -1000, type[n] = i == 3 ? 2 : 3;
    for (int b = 0; b < 256; b++, n++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tok[n] = bytes[b], score[n] = 0, type[n] = 6;
    }
    for (int i = 0; i < SPM_N_PIECES; i++, n++) tok[n] = k_spm_pieces[i], score[n] = -(float)i, type[n] = 1;
    tok[n] = "\n\n", score[n] = -1000, type[n++] = 4;
    tok[n] = "<start_of_turn>", score[n] = -1000, type[n++] = 3;
    tok[n] = "<end_of_turn>", score[n] = -1000, type[n++] = 3;
    tok[n] = "<unused0>", score[n] = -1000, type[n++] = 3;
    lm_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    lm_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    lm_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)n);
    lm_gguf_writer_set_arr(w, "tokenizer.ggml.scores", LM_GGUF_F32, score, (uint64_t)n);
    lm_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LM_GGUF_I32, type, (uint64_t)n);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    lm_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
    lm_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    lm_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
}

static void no_tokenizer(lm_gguf_writer *w, void *user) { (void)w, (void)user; }

static void unknown_arch(lm_gguf_writer *w, void *user) {
    (void)user;
    lm_gguf_writer_set_str(w, "general.architecture", "falcon");
}

static const char *const k_corpus[] = {
    "Hello world",
    " the cat sat on the mat",
    "abcabc abc cab the the",
    "12345 678 9",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "<|endoftext|>x",
    "tab\there\nnew line  two  spaces   ",
    "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
    "bad bytes \xff\xfe end",
    "\n\n\nx\n\n",
    "<start_of_turn>user\nabc<end_of_turn>",
    "<unused0> the",
    " ",
    "",
    "aaaaaaaaaaaaaaaa bbbbbbbb",
};
enum { N_CORPUS = sizeof k_corpus / sizeof k_corpus[0] };

/* ---- one architecture end to end ------------------------------------------------------ */

typedef struct arch_case {
    const char *label;
    lm_arch arch;
    bool spm;
    bpe_opts bpe;
    double tol; /* max |logit difference| to the bf16 reference */
} arch_case;

static char g_tmp[256];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_tmp, name); }

static lm_status convert(const char *gguf, const char *out, lm_hf_export_params *p, lm_hf_export_result *r) {
    lm_status st = lm_hf_export(gguf, out, p, r);
    if (st) fprintf(stderr, "convert %s -> %s: %s\n", gguf, out, lm_last_error());
    return st;
}

static void compare_logits(const char *label, lm_model_internal *a, lm_model_internal *b, double tol, int len) {
    int64_t V = a->hp.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    int32_t tok[40];
    double worst = 0;
    for (int p = 0; p < 3; p++) {
        for (int i = 0; i < len; i++) tok[i] = (int32_t)((i * 37 + p * 101 + 7) % V);
        CHECK(hx_logits(a, tok, len, la) == LM_OK);
        CHECK(hx_logits(b, tok, len, lb) == LM_OK);
        worst = fmax(worst, hx_max_diff(la, lb, V));
        CHECK(hx_argmax(la, V) == hx_argmax(lb, V));
    }
    fprintf(stderr, "  %s: max |logit diff| %.3g over 3 prompts of %d tokens (tolerance %.3g)\n", label, worst, len, tol);
    CHECK(worst <= tol);
    free(la);
    free(lb);
}

static void run_case(const arch_case *c, lm_backend *be) {
    fprintf(stderr, "%s\n", c->label);
    tiny_spec spec = tiny_default(c->arch);
    spec.n_vocab = c->spm ? SPM_N_VOCAB : N_VOCAB;
    if (c->arch == LM_ARCH_QWEN2) spec.matrix_type = LM_DTYPE_Q4_0;
    if (c->arch == LM_ARCH_GEMMA3) spec.matrix_type = LM_DTYPE_Q5_1;
    tiny_model m;
    tiny_build(&m, spec);
    char gguf[512], ref[512], out[512], out32[512], sharded[512], ref32[512];
    path_in(gguf, sizeof gguf, "model.gguf");
    path_in(ref, sizeof ref, "ref-bf16.gguf");
    path_in(ref32, sizeof ref32, "ref-f32.gguf");
    path_in(out, sizeof out, "out/model"); /* the parent "out" does not exist yet */
    path_in(out32, sizeof out32, "out32");
    path_in(sharded, sizeof sharded, "sharded");
    CHECK(tiny_write_gguf_ex(&m, gguf, NULL, c->spm ? add_spm : add_bpe, (void *)&c->bpe) == LM_OK);
    tiny_free(&m);

    lm_hf_export_params p = lm_hf_export_default_params();
    lm_hf_export_result r;
    CHECK(convert(gguf, out, &p, &r) == LM_OK);
    CHECK(r.has_tokenizer && r.n_shards == 1 && r.n_tensors > 0);
    CHECK(r.n_vocab == spec.n_vocab);
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "model.safetensors"};
    for (int i = 0; i < 5; i++) CHECK(hx_exists(out, files[i]));
    CHECK(!hx_exists(out, "model.safetensors.index.json"));

    /* the weights: loads, same shape, the logits of the bf16-rounded GGUF */
    lm_model_internal *mg = NULL, *mf = NULL, *mr = NULL;
    CHECK(hx_write_bf16_reference(gguf, ref) == LM_OK);
    CHECK(lm_model_internal_load(gguf, be, &mg) == LM_OK);
    lm_status st = lm_model_internal_load(out, be, &mf);
    if (st) fprintf(stderr, "load folder: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    CHECK(lm_model_internal_load(ref, be, &mr) == LM_OK);
    if (mg && mf && mr) {
        const lm_hparams *a = &mg->hp, *b = &mf->hp;
        CHECK(a->arch == b->arch && a->n_vocab == b->n_vocab && a->n_embd == b->n_embd && a->n_layer == b->n_layer);
        CHECK(a->n_head == b->n_head && a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim);
        CHECK(a->n_ff == b->n_ff && a->n_ctx_train == b->n_ctx_train && a->rms_eps == b->rms_eps);
        CHECK(a->rope_theta == b->rope_theta && a->attn_scale == b->attn_scale && a->embd_scale == b->embd_scale);
        CHECK(a->tied_embeddings == b->tied_embeddings && a->sliding_window == b->sliding_window);
        CHECK(a->sliding_window == 0 || (a->swa_pattern == b->swa_pattern && a->rope_theta_local == b->rope_theta_local));
        CHECK(b->rope_mode == LM_ROPE_NEOX);
        /* past the tiny Gemma window of 8 */
        compare_logits("folder vs GGUF weights rounded to bf16", mf, mr, c->tol, 24);
    }

    /* the tokenizer */
    lm_gguf *g = NULL;
    lm_tokenizer *tg = NULL, *tf = NULL;
    CHECK(lm_gguf_open(gguf, &g) == LM_OK && lm_tokenizer_from_gguf(g, &tg) == LM_OK);
    st = lm_tokenizer_from_hf_folder(out, &tf);
    if (st) fprintf(stderr, "tokenizer folder: %s\n", lm_last_error());
    CHECK(st == LM_OK);
    if (tg && tf) {
        int same = 0;
        for (int i = 0; i < N_CORPUS; i++) {
            const char *t = k_corpus[i];
            bool ok = hx_same_tokens(tg, tf, t, strlen(t), true, true) && hx_same_tokens(tg, tf, t, strlen(t), false, false);
            if (!ok) fprintf(stderr, "  tokens differ on corpus string %d \"%s\"\n", i, t);
            same += ok;
        }
        fprintf(stderr, "  tokenizer: %d/%d corpus strings identical (with and without special tokens)\n", same,
                N_CORPUS);
        CHECK(same == N_CORPUS);
        CHECK(lm_tokenizer_bos(tg) == lm_tokenizer_bos(tf) && lm_tokenizer_eos(tg) == lm_tokenizer_eos(tf));
        CHECK(lm_tokenizer_add_bos(tg) == lm_tokenizer_add_bos(tf) && lm_tokenizer_model(tg) == lm_tokenizer_model(tf));
        CHECK(lm_tokenizer_n_vocab(tf) == lm_tokenizer_n_vocab(tg));
        for (int32_t id = 0; id < (int32_t)lm_tokenizer_n_vocab(tg); id++)
            if (lm_tokenizer_is_eog(tg, id) != lm_tokenizer_is_eog(tf, id)) {
                fprintf(stderr, "  end-of-generation differs for id %d\n", id);
                CHECK(false);
            }
    }
    char *tmpl = NULL;
    lm_status ts = lm_chat_template_from_hf_folder(out, &tmpl);
    if (c->spm) CHECK(ts == LM_ERR_NOT_FOUND && !r.has_chat_template);
    else CHECK(ts == LM_OK && tmpl && strcmp(tmpl, k_template) == 0 && r.has_chat_template);
    free(tmpl);
    lm_tokenizer_free(tg);
    lm_tokenizer_free(tf);
    lm_gguf_close(g);

    /* f32 output: the exact dequantization */
    p.out_dtype = LM_DTYPE_F32;
    lm_model_internal *m32 = NULL, *mr32 = NULL;
    CHECK(convert(gguf, out32, &p, &r) == LM_OK);
    CHECK(lm_gguf_convert_file(gguf, ref32, LM_DTYPE_F32, NULL, NULL) == LM_OK);
    CHECK(lm_model_internal_load(out32, be, &m32) == LM_OK && lm_model_internal_load(ref32, be, &mr32) == LM_OK);
    if (m32 && mr32) compare_logits("f32 folder vs GGUF dequantized to f32", m32, mr32, c->tol, 12);

    /* shards: same logits as the single file */
    p = lm_hf_export_default_params();
    p.shard_bytes = 8 << 10;
    lm_model_internal *ms = NULL;
    CHECK(convert(gguf, sharded, &p, &r) == LM_OK);
    CHECK(r.n_shards > 2 && hx_exists(sharded, "model.safetensors.index.json") && !hx_exists(sharded, "model.safetensors"));
    char first[64];
    snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", r.n_shards);
    CHECK(hx_exists(sharded, first));
    CHECK(lm_model_internal_load(sharded, be, &ms) == LM_OK);
    if (ms && mf) compare_logits("sharded folder vs single file", ms, mf, 0.0, 12);
    fprintf(stderr, "  sharded into %d files\n", r.n_shards);

    lm_model_internal_free(mg);
    lm_model_internal_free(mf);
    lm_model_internal_free(mr);
    lm_model_internal_free(m32);
    lm_model_internal_free(mr32);
    lm_model_internal_free(ms);
    CHECK(hx_count_named(g_tmp, "lumen-tmp") == 0 && hx_count_named(g_tmp, "lumen-old") == 0);
    char out_parent[512];
    path_in(out_parent, sizeof out_parent, "out");
    hx_rm_tree(out_parent);
    hx_rm_tree(out32);
    hx_rm_tree(sharded);
    remove(gguf), remove(ref), remove(ref32);
}

/* ---- configs and bad input ------------------------------------------------------------- */

static cJSON *read_json(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return cJSON_Parse(buf);
}

static int g_calls;
static bool cancel_after_two(void *user, uint64_t done, uint64_t total) {
    (void)user, (void)done, (void)total;
    return ++g_calls < 2;
}

static bool expect_fail(const char *what, const char *gguf, const char *out, lm_hf_export_params *p,
                        lm_status want, const char *needle) {
    lm_hf_export_result r;
    lm_status st = lm_hf_export(gguf, out, p, &r);
    const char *msg = lm_last_error();
    /* want LM_OK: any error will do, the sentence is what matters */
    bool ok = (want == LM_OK ? st != LM_OK : st == want) && strstr(msg, needle) != NULL;
    fprintf(stderr, "%s: %s \"%s\"\n", ok ? "ok  " : "FAIL", what, st ? msg : "(succeeded)");
    CHECK(ok);
    return ok;
}

static void run_configs_and_errors(void) {
    tiny_spec spec = tiny_default(LM_ARCH_GEMMA3);
    spec.n_vocab = N_VOCAB;
    tiny_model m;
    tiny_build(&m, spec);
    char gguf[512], out[512], file[512], bad[512], notok[512];
    path_in(gguf, sizeof gguf, "g.gguf");
    path_in(out, sizeof out, "cfg");
    path_in(file, sizeof file, "plain-file");
    path_in(bad, sizeof bad, "falcon.gguf");
    path_in(notok, sizeof notok, "notok.gguf");
    bpe_opts o = {"gpt-2", false};
    CHECK(tiny_write_gguf_ex(&m, gguf, NULL, add_bpe, &o) == LM_OK);
    CHECK(tiny_write_gguf_ex(&m, bad, NULL, unknown_arch, NULL) == LM_OK);
    CHECK(tiny_write_gguf_ex(&m, notok, NULL, no_tokenizer, NULL) == LM_OK);
    tiny_free(&m);

    lm_hf_export_params p = lm_hf_export_default_params();
    lm_hf_export_result r;
    CHECK(convert(gguf, out, &p, &r) == LM_OK);
    cJSON *cfg = read_json(out, "config.json"), *gen = read_json(out, "generation_config.json");
    cJSON *tc = read_json(out, "tokenizer_config.json");
    CHECK(cfg && gen && tc);
    if (cfg && gen && tc) {
        const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItem(cfg, "architectures"), 0);
        CHECK(cJSON_IsString(arch) && strcmp(arch->valuestring, "Gemma3ForCausalLM") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(cfg, "model_type")->valuestring, "gemma3_text") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(cfg, "torch_dtype")->valuestring, "bfloat16") == 0);
        CHECK(cJSON_GetObjectItem(cfg, "sliding_window")->valuedouble == 8);
        CHECK(cJSON_GetObjectItem(cfg, "rope_theta")->valuedouble == 1e6);
        CHECK(cJSON_GetObjectItem(cfg, "rms_norm_eps")->valuedouble == 1e-6);
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "tie_word_embeddings")));
        const cJSON *types = cJSON_GetObjectItem(cfg, "layer_types");
        CHECK(cJSON_GetArraySize(types) == 6 &&
              strcmp(cJSON_GetArrayItem(types, 5)->valuestring, "full_attention") == 0 &&
              strcmp(cJSON_GetArrayItem(types, 0)->valuestring, "sliding_attention") == 0);
        CHECK(cJSON_GetObjectItem(cfg, "bos_token_id")->valuedouble == TOK_EOT);
        CHECK(cJSON_GetObjectItem(cfg, "eos_token_id")->valuedouble == TOK_IM_END);
        const cJSON *eos = cJSON_GetObjectItem(gen, "eos_token_id");
        CHECK(eos && (cJSON_IsArray(eos) ? cJSON_GetArrayItem(eos, 0)->valuedouble : eos->valuedouble) == TOK_IM_END);
        CHECK(strcmp(cJSON_GetObjectItem(tc, "eos_token")->valuestring, "<|im_end|>") == 0);
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(tc, "add_bos_token")));
        CHECK(strcmp(cJSON_GetObjectItem(tc, "chat_template")->valuestring, k_template) == 0);
    }
    cJSON_Delete(cfg), cJSON_Delete(gen), cJSON_Delete(tc);

    /* existing OUT_DIR: refused when not empty, untouched; replaced with force */
    char marker[600];
    snprintf(marker, sizeof marker, "%s/keep.txt", out);
    FILE *f = fopen(marker, "w");
    if (f) fputs("mine", f), fclose(f);
    expect_fail("non-empty OUT_DIR", gguf, out, &p, LM_ERR_INVALID_ARG, "not empty (use --force");
    CHECK(hx_exists(out, "keep.txt") && hx_exists(out, "model.safetensors"));
    p.force = true;
    CHECK(convert(gguf, out, &p, &r) == LM_OK);
    CHECK(!hx_exists(out, "keep.txt") && hx_exists(out, "model.safetensors"));
    /* an empty OUT_DIR is fine without force */
    p.force = false;
    char empty[512];
    path_in(empty, sizeof empty, "empty");
    mkdir(empty, 0755);
    CHECK(convert(gguf, empty, &p, &r) == LM_OK && hx_exists(empty, "config.json"));
    /* never when OUT_DIR holds the input */
    char inner[600];
    snprintf(inner, sizeof inner, "%s/in.gguf", empty);
    CHECK(rename(gguf, inner) == 0);
    p.force = true;
    expect_fail("OUT_DIR holding the input", inner, empty, &p, LM_ERR_INVALID_ARG, "holds the input model");
    CHECK(hx_exists(empty, "in.gguf"));
    CHECK(rename(inner, gguf) == 0);
    p.force = false;

    /* unknown architecture, unwritable OUT_DIR, OUT_DIR that is a file, missing input */
    char out2[512];
    path_in(out2, sizeof out2, "never");
    expect_fail("unknown architecture", bad, out2, &p, LM_ERR_UNSUPPORTED, "unknown architecture 'falcon'");
    f = fopen(file, "w");
    if (f) fputs("x", f), fclose(f);
    char under_file[600];
    snprintf(under_file, sizeof under_file, "%s/out", file);
    expect_fail("OUT_DIR under a file", gguf, under_file, &p, LM_ERR_IO, "plain-file: Not a directory");
    expect_fail("OUT_DIR is a file", gguf, file, &p, LM_ERR_INVALID_ARG, "is not a folder");
    char missing[512];
    path_in(missing, sizeof missing, "missing.gguf");
    expect_fail("missing input", missing, out2, &p, LM_OK, "missing.gguf");
    expect_fail("OUT_DIR '.'", gguf, ".", &p, LM_ERR_INVALID_ARG, "must name a folder");
    expect_fail("a folder as the input", g_tmp, out2, &p, LM_ERR_INVALID_ARG, "is a folder; convert reads a GGUF");
    p.out_dtype = LM_DTYPE_Q8_0;
    expect_fail("quantized output dtype", gguf, out2, &p, LM_ERR_INVALID_ARG, "bf16, f16 or f32");
    p.out_dtype = LM_DTYPE_BF16;
    /* cancelled by the progress callback: nothing left */
    p.progress = cancel_after_two;
    expect_fail("cancelled", gguf, out2, &p, LM_ERR_INVALID_ARG, "cancelled");
    p.progress = NULL;
    struct stat sb;
    CHECK(stat(out2, &sb) != 0);

    /* a GGUF without a tokenizer: weights and config only */
    char wt[512];
    path_in(wt, sizeof wt, "weights-only");
    CHECK(convert(notok, wt, &p, &r) == LM_OK);
    CHECK(!r.has_tokenizer && hx_exists(wt, "config.json") && !hx_exists(wt, "tokenizer.json"));

    CHECK(hx_count_named(g_tmp, "lumen-tmp") == 0 && hx_count_named(g_tmp, "lumen-old") == 0);
    hx_rm_tree(out), hx_rm_tree(empty), hx_rm_tree(wt);
    remove(gguf), remove(bad), remove(notok), remove(file);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/lumen_test_hf_export_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    snprintf(g_dir, sizeof g_dir, "%s", g_tmp);
    snprintf(g_path, sizeof g_path, "%s", g_tmp);
    lm_backend *be = NULL;
    if (lm_backend_cpu_create(1, &be)) return 1;
    /* llama: Q/K rows un-permuted, so each head's q·k sums in another order */
    arch_case cases[] = {
        {"llama, smollm pre-tokenizer", LM_ARCH_LLAMA, false, {"smollm", false}, 1e-5},
        {"llama, llama-bpe pre-tokenizer (adds BOS, ignores merges)", LM_ARCH_LLAMA, false, {"llama-bpe", true}, 1e-5},
        {"qwen2, qwen2 pre-tokenizer", LM_ARCH_QWEN2, false, {"qwen2", false}, 0.0},
        {"gemma3, SentencePiece-style vocabulary", LM_ARCH_GEMMA3, true, {NULL, false}, 0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], be);
    run_configs_and_errors();
    lm_backend_free(be);
    hx_rm_tree(g_tmp);
    TEST_MAIN_END();
}
