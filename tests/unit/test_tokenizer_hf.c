/* tokenizer.json loading on small hand-written files: a byte-level BPE with a Split regex
 * and string-form merges, a SentencePiece-style BPE with byte fallback (Prepend +
 * Replace, and Metaspace), NFC, added tokens (special or not, lstrip/rstrip), BOS/EOS
 * from tokenizer_config.json and the post-processor, end tokens from
 * generation_config.json, unsupported kinds named in the error, malformed files, and
 * chat templates from the three places a folder keeps them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* "ab" "c" "abc" byte-level: a=a, b=b, c=c, space=Ġ (U+0120) */
static const char *k_bpe_json =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":7,\"content\":\"<|im_start|>\",\"special\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false},"
    "{\"id\":8,\"content\":\"<tool>\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false},"
    "{\"id\":9,\"content\":\"<|end|>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":false,\"vocab\":{"
    "\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,\"abc\":5,\"\\u0120ab\":6,"
    "\"\\u00c3\":10,\"\\u00a9\":11,\"\\u00c3\\u00a9\":12,\"e\":13,\"\\u00cc\":14,\"\\u0123\":15},"
    "\"merges\":[\"a b\",\"ab c\",\"\\u0120 ab\",\"\\u00c3 \\u00a9\"]}}";

static const char *k_bpe_cfg =
    "{\"bos_token\":null,\"eos_token\":\"<|end|>\",\"clean_up_tokenization_spaces\":false,"
    "\"chat_template\":\"{{ messages }}\"}";

static const char *k_spm_json =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{"
    "\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x0A>\":3,\"<0xC3>\":4,\"<0xA9>\":5,"
    "\"\\u2581\":6,\"h\":7,\"i\":8,\"hi\":9,\"\\u2581hi\":10,\"\\u2581h\":11},"
    "\"merges\":[[\"h\",\"i\"],[\"\\u2581\",\"hi\"],[\"\\u2581\",\"h\"]]}}";

static void check_ids(const lm_tokenizer *t, const char *text, bool add, bool parse,
                      const int32_t *want, size_t nwant) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(lm_tokenizer_encode_alloc(t, text, strlen(text), add, parse, &ids, &n) == LM_OK);
    bool ok = n == nwant && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "ids for \"%s\":", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    CHECK(ok);
    free(ids);
}

static void check_decode(const lm_tokenizer *t, const int32_t *ids, size_t n, const char *want) {
    char buf[256];
    size_t m = 0;
    CHECK(lm_tokenizer_decode(t, ids, n, true, false, buf, sizeof buf, &m) == LM_OK);
    CHECK(m == strlen(want) && memcmp(buf, want, m) == 0);
}

static lm_status load(const char *tj, const char *cfg, const char *gen, lm_tokenizer **t) {
    return lm_tokenizer_from_hf_json(tj, strlen(tj), cfg, cfg ? strlen(cfg) : 0, gen,
                                     gen ? strlen(gen) : 0, "test", t);
}

static void test_byte_level(void) {
    lm_tokenizer *t = NULL;
    lm_status st = load(k_bpe_json, k_bpe_cfg, "{\"eos_token_id\":[9,7]}", &t);
    if (st) fprintf(stderr, "%s\n", lm_last_error());
    CHECK(st == LM_OK);
    if (!t) return;
    CHECK(lm_tokenizer_model(t) == LM_VOCAB_BPE);
    CHECK(lm_tokenizer_pre(t) == LM_PRE_QWEN2); /* the Qwen2 regex, recognised */
    CHECK(lm_tokenizer_n_vocab(t) == 16);
    CHECK(lm_tokenizer_eos(t) == 9);
    CHECK(lm_tokenizer_bos(t) == LM_TOKEN_NULL);
    CHECK(!lm_tokenizer_add_bos(t));
    CHECK(lm_tokenizer_is_eog(t, 9) && lm_tokenizer_is_eog(t, 7));
    check_ids(t, "abc ab", false, false, (int32_t[]){5, 6}, 2);
    /* special token only with parse_special; the non-special added one always */
    check_ids(t, "<|im_start|>ab", false, true, (int32_t[]){7, 4}, 2);
    check_ids(t, "<tool>ab", false, false, (int32_t[]){8, 4}, 2);
    /* NFC: e + U+0301 composes to U+00E9 = bytes C3 A9 -> token 12 */
    check_ids(t, "e\xcc\x81", false, false, (int32_t[]){12}, 1);
    check_ids(t, "\xc3\xa9", false, false, (int32_t[]){12}, 1);
    check_decode(t, (int32_t[]){5, 6}, 2, "abc ab");
    check_decode(t, (int32_t[]){12}, 1, "\xc3\xa9");
    lm_tokenizer_free(t);
}

static void test_spm(void) {
    lm_tokenizer *t = NULL;
    lm_status st = load(k_spm_json, NULL, NULL, &t);
    if (st) fprintf(stderr, "%s\n", lm_last_error());
    CHECK(st == LM_OK);
    if (!t) return;
    CHECK(lm_tokenizer_model(t) == LM_VOCAB_SPM);
    CHECK(lm_tokenizer_add_space_prefix(t));
    CHECK(lm_tokenizer_add_bos(t)); /* from the TemplateProcessing post-processor */
    CHECK(lm_tokenizer_bos(t) == 1);
    CHECK(lm_tokenizer_unk(t) == 0);
    /* "hi hi" -> ▁hi ▁hi (merges h+i first, then ▁+hi) */
    check_ids(t, "hi hi", true, false, (int32_t[]){1, 10, 10}, 3);
    /* é is not a token: bytes <0xC3><0xA9>; newline -> <0x0A> */
    check_ids(t, "h\xc3\xa9\n", false, false, (int32_t[]){11, 4, 5, 3}, 4);
    check_ids(t, "</s>", false, true, (int32_t[]){2}, 1);
    /* as llama.cpp: a removed BOS keeps the first space (the prefix is stripped only without BOS) */
    check_decode(t, (int32_t[]){1, 10, 10}, 3, " hi hi");
    check_decode(t, (int32_t[]){10, 10}, 2, "hi hi");
    check_decode(t, (int32_t[]){11, 4, 5, 3}, 4, "h\xc3\xa9\n");
    lm_tokenizer_free(t);

    /* the same with a Metaspace pre-tokenizer instead of the normalizers */
    char *j = strdup(k_spm_json);
    char *a = strstr(j, "\"normalizer\":");
    char *b = strstr(j, "\"post_processor\":");
    const char *meta = "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
                       "\"prepend_scheme\":\"always\",\"split\":false},";
    size_t la = (size_t)(a - j);
    char *k = malloc(strlen(j) + strlen(meta) + 1);
    memcpy(k, j, la);
    strcpy(k + la, meta);
    strcat(k, b);
    st = load(k, NULL, NULL, &t);
    CHECK(st == LM_OK);
    if (t) {
        check_ids(t, "hi hi", false, false, (int32_t[]){10, 10}, 2);
        lm_tokenizer_free(t);
    }
    free(k);
    free(j);

    /* Gemma's files add a Split on " " after the normalizer replaced every space: a no-op */
    j = strdup(k_spm_json);
    const char *split = "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
                        "\"behavior\":\"MergedWithPrevious\",\"invert\":false}";
    a = strstr(j, "\"pre_tokenizer\":null");
    k = malloc(strlen(j) + strlen(split) + 1);
    la = (size_t)(a - j);
    memcpy(k, j, la);
    strcpy(k + la, split);
    strcat(k, a + strlen("\"pre_tokenizer\":null"));
    st = load(k, NULL, NULL, &t);
    CHECK(st == LM_OK);
    if (t) {
        check_ids(t, "hi hi", false, false, (int32_t[]){10, 10}, 2);
        lm_tokenizer_free(t);
    }
    free(k);
    free(j);
}

/* Replaces the first occurrence of `from` in the base JSON with `to` and expects `want`
 * with `needle` in the error text. */
static void expect_error(const char *base, const char *from, const char *to, lm_status want,
                         const char *needle) {
    const char *p = strstr(base, from);
    CHECK(p != NULL);
    if (!p) return;
    size_t pre = (size_t)(p - base);
    char *j = malloc(strlen(base) + strlen(to) + 1);
    memcpy(j, base, pre);
    strcpy(j + pre, to);
    strcat(j, p + strlen(from));
    lm_tokenizer *t = NULL;
    lm_status st = load(j, NULL, NULL, &t);
    if (st != want || !strstr(lm_last_error(), needle))
        fprintf(stderr, "for %s -> %s: status %d, error: %s\n", from, to, st, lm_last_error());
    CHECK(st == want);
    CHECK(strstr(lm_last_error(), needle) != NULL);
    CHECK(t == NULL);
    lm_tokenizer_free(t);
    free(j);
}

static void test_errors(void) {
    expect_error(k_bpe_json, "\"type\":\"BPE\"", "\"type\":\"WordPiece\"", LM_ERR_UNSUPPORTED, "WordPiece");
    expect_error(k_bpe_json, "\"type\":\"BPE\"", "\"type\":\"Unigram\"", LM_ERR_UNSUPPORTED, "Unigram");
    expect_error(k_bpe_json, "{\"type\":\"NFC\"}", "{\"type\":\"Lowercase\"}", LM_ERR_UNSUPPORTED, "Lowercase");
    expect_error(k_bpe_json, "\"type\":\"Split\"", "\"type\":\"Whitespace\"", LM_ERR_UNSUPPORTED, "Whitespace");
    expect_error(k_bpe_json, "\"Isolated\"", "\"MergedWithPrevious\"", LM_ERR_UNSUPPORTED, "MergedWithPrevious");
    expect_error(k_bpe_json, "(?i:'s|'t", "(?<bad", LM_ERR_UNSUPPORTED, "regex");
    expect_error(k_bpe_json, "\"ab\":4", "\"ab\":-4", LM_ERR_FORMAT, "vocab id");
    expect_error(k_bpe_json, "\"ab\":4", "\"ab\":99999999", LM_ERR_FORMAT, "id");
    expect_error(k_bpe_json, "\"a b\"", "\"ab\"", LM_ERR_FORMAT, "merge");
    expect_error(k_bpe_json, "\"a b\"", "7", LM_ERR_FORMAT, "merge");
    expect_error(k_bpe_json, "\"model\":{", "\"modelx\":{", LM_ERR_FORMAT, "model");
    expect_error(k_bpe_json, "{\"version\"", "[{\"version\"", LM_ERR_FORMAT, "JSON");
    expect_error(k_spm_json, "\"byte_fallback\":true", "\"byte_fallback\":true,\"continuing_subword_prefix\":\"##\"",
                 LM_ERR_UNSUPPORTED, "continuing_subword_prefix");
    expect_error(k_spm_json, "\"content\":\"\\u2581\"}", "\"content\":\"_\"}", LM_ERR_UNSUPPORTED, "Replace");
    /* a config that is JSON but not an object (found by fuzzing: was freed twice) */
    lm_tokenizer *t0 = NULL;
    CHECK(load(k_bpe_json, "[1]", NULL, &t0) == LM_ERR_FORMAT);
    CHECK(load(k_bpe_json, NULL, "\"x\"", &t0) == LM_ERR_FORMAT);
    CHECK(t0 == NULL);
    /* a missing folder */
    lm_tokenizer *t = NULL;
    CHECK(lm_tokenizer_from_hf_folder("/nonexistent/lumen-test", &t) == LM_ERR_NOT_FOUND);
    CHECK(t == NULL);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

static void test_folder(void) {
    char dir[] = "/tmp/lumen-hf-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    write_file(dir, "tokenizer.json", k_bpe_json);
    write_file(dir, "tokenizer_config.json", k_bpe_cfg);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": 7}");
    lm_tokenizer *t = NULL;
    CHECK(lm_tokenizer_from_hf_folder(dir, &t) == LM_OK);
    if (t) {
        CHECK(lm_tokenizer_is_eog(t, 7));
        CHECK(lm_tokenizer_eos(t) == 9);
    }
    lm_tokenizer_free(t);

    char *tmpl = NULL;
    CHECK(lm_chat_template_from_hf_folder(dir, &tmpl) == LM_OK);
    CHECK(tmpl && strcmp(tmpl, "{{ messages }}") == 0);
    free(tmpl);
    /* a list of named templates: "default" */
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D\"}]}");
    CHECK(lm_chat_template_from_hf_folder(dir, &tmpl) == LM_OK);
    CHECK(tmpl && strcmp(tmpl, "D") == 0);
    free(tmpl);
    /* chat_template.jinja wins */
    write_file(dir, "chat_template.jinja", "J{{ x }}");
    CHECK(lm_chat_template_from_hf_folder(dir, &tmpl) == LM_OK);
    CHECK(tmpl && strcmp(tmpl, "J{{ x }}") == 0);
    free(tmpl);
    remove_file(dir, "chat_template.jinja");
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(lm_chat_template_from_hf_folder(dir, &tmpl) == LM_ERR_FORMAT);
    write_file(dir, "tokenizer_config.json", "{}");
    CHECK(lm_chat_template_from_hf_folder(dir, &tmpl) == LM_ERR_NOT_FOUND);
    CHECK(tmpl == NULL);
    /* a broken tokenizer_config.json is an error, not ignored */
    write_file(dir, "tokenizer_config.json", "{not json");
    CHECK(lm_tokenizer_from_hf_folder(dir, &t) == LM_ERR_FORMAT);
    remove_file(dir, "tokenizer_config.json");
    remove_file(dir, "generation_config.json");
    CHECK(lm_tokenizer_from_hf_folder(dir, &t) == LM_OK);
    lm_tokenizer_free(t);
    remove_file(dir, "tokenizer.json");
    rmdir(dir);
}

int main(void) {
    test_byte_level();
    test_spm();
    test_errors();
    test_folder();
    TEST_MAIN_END();
}
