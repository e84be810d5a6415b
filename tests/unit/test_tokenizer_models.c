/* The three real models' tokenizers against llama.cpp on a corpus of 300 strings (code,
 * whitespace runs, digits, emoji, CJK, RTL, odd and invalid bytes, special-token text):
 * tests/golden/tokenizer/NAME.json, written by scripts/make_tokenizer_golden.py.
 *
 * Per model, from the GGUF in ~/.cache/lumen/models/NAME/: ids with parse_special off, on,
 * and on with add_special, exactly; decode(encode(x)) == x (the three vocabularies are
 * lossless); the incremental detokenizer against the whole one. Invalid UTF-8 is where
 * lumen deliberately differs from llama.cpp (raw bytes, not U+FFFD; no swallowed bytes
 * after a bad lead byte), so there only the round trip is checked.
 *
 * Per model, from the Hugging Face folder ~/.cache/lumen/tokenizers/NAME/ (written by the
 * same script with --hf from the GGUF metadata, and checked there against the `tokenizers`
 * library): ids against what `tokenizers` gave ("hf"), and against llama.cpp with
 * parse_special off where the two references agree.
 *
 * A model that is not pulled is skipped with a line saying so; with none, exit 77. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "formats/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const char *const k_models[] = {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"};

static bool find_gguf(const char *name, char *out, size_t cap) {
    const char *home = getenv("HOME");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/.cache/lumen/models/%s", home ? home : ".", name);
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool found = false;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".gguf") == 0) {
            if ((size_t)snprintf(out, cap, "%s/%s", dir, e->d_name) >= cap) continue;
            found = true;
            break;
        }
    }
    closedir(d);
    return found;
}

static bool hf_folder(const char *name, char *out, size_t cap) {
    const char *home = getenv("HOME");
    if ((size_t)snprintf(out, cap, "%s/.cache/lumen/tokenizers/%s", home ? home : ".", name) >= cap) return false;
    char p[1100];
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    struct stat st;
    return stat(p, &st) == 0;
}

static size_t unhex(const char *h, char *out) {
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned x;
        sscanf(h + 2 * i, "%2x", &x);
        out[i] = (char)x;
    }
    return n;
}

typedef struct {
    int checked, failed;
} tally;

/* Compares encode(text) with the JSON id list `want`; prints the first mismatches. */
static bool same_ids(const lm_tokenizer *tok, const char *model, const char *what, const char *text,
                     size_t len, bool add_special, bool parse_special, const cJSON *want, tally *t) {
    int32_t *ids = NULL;
    size_t n = 0;
    lm_status st = lm_tokenizer_encode_alloc(tok, text, len, add_special, parse_special, &ids, &n);
    bool ok = st == LM_OK && (size_t)cJSON_GetArraySize(want) == n;
    for (size_t i = 0; ok && i < n; i++) ok = cJSON_GetArrayItem(want, (int)i)->valueint == ids[i];
    t->checked++;
    if (!ok) {
        t->failed++;
        if (t->failed <= 8) {
            fprintf(stderr, "%s %s: mismatch for \"%.60s\" (%zu bytes): got", model, what, text, len);
            for (size_t i = 0; i < n && i < 16; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, " | want");
            for (int i = 0; i < cJSON_GetArraySize(want) && i < 16; i++)
                fprintf(stderr, " %d", cJSON_GetArrayItem(want, i)->valueint);
            fprintf(stderr, "\n");
        }
    }
    free(ids);
    return ok;
}

/* decode(encode(x)) == x, and the stream detokenizer gives the same bytes. */
static void round_trip(const lm_tokenizer *tok, const char *model, const char *text, size_t len,
                       bool special, tally *t) {
    int32_t *ids = NULL;
    size_t n = 0, m = 0;
    t->checked++;
    if (lm_tokenizer_encode_alloc(tok, text, len, false, special, &ids, &n) != LM_OK) {
        t->failed++;
        return;
    }
    char *buf = malloc(len * 4 + 64);
    lm_status st = lm_tokenizer_decode(tok, ids, n, false, special, buf, len * 4 + 64, &m);
    bool ok = st == LM_OK && m == len && memcmp(buf, text, len) == 0;
    lm_detok_stream *s = NULL;
    if (ok && lm_detok_stream_create(tok, false, special, &s) == LM_OK) {
        size_t k = 0;
        for (size_t i = 0; i <= n && ok; i++) {
            const char *p;
            size_t pl;
            st = i < n ? lm_detok_stream_push(s, ids[i], &p, &pl) : lm_detok_stream_finish(s, &p, &pl);
            ok = st == LM_OK && k + pl <= m && memcmp(buf + k, p, pl) == 0;
            k += pl;
        }
        ok = ok && k == m;
        lm_detok_stream_free(s);
    }
    if (!ok) {
        t->failed++;
        if (t->failed <= 8)
            fprintf(stderr, "%s: round trip (special=%d) differs for \"%.60s\" -> \"%.*s\"\n", model,
                    special, text, (int)(m < 60 ? m : 60), buf);
    }
    free(buf);
    free(ids);
}

static void report(const char *model, const char *what, const tally *t) {
    printf("%-20s %-28s %4d checked, %d failed\n", model, what, t->checked, t->failed);
    if (t->failed) lm_test_failures++;
}

static int test_model(const char *name) {
    char gguf_path[1024], golden_path[1024], hf_dir[1024];
    snprintf(golden_path, sizeof golden_path, "%s/tests/golden/tokenizer/%s.json", LUMEN_SOURCE_DIR, name);
    char *gj = test_read_text(golden_path);
    CHECK(gj != NULL);
    if (!gj) return 0;
    cJSON *doc = cJSON_Parse(gj);
    free(gj);
    CHECK(doc != NULL);
    const cJSON *cases = cJSON_GetObjectItem(doc, "cases");
    CHECK(cJSON_IsArray(cases));

    bool have_gguf = find_gguf(name, gguf_path, sizeof gguf_path);
    bool have_hf = hf_folder(name, hf_dir, sizeof hf_dir);
    int tested = 0;

    lm_gguf *g = NULL;
    lm_tokenizer *tok = NULL;
    if (have_gguf) {
        CHECK(lm_gguf_open(gguf_path, &g) == LM_OK);
        if (g) CHECK(lm_tokenizer_from_gguf(g, &tok) == LM_OK);
    } else {
        printf("%-20s SKIPPED: no GGUF under ~/.cache/lumen/models/%s (lumen pull %s)\n", name, name, name);
    }
    lm_tokenizer *hf = NULL;
    if (have_hf) {
        lm_status st = lm_tokenizer_from_hf_folder(hf_dir, &hf);
        if (st) fprintf(stderr, "%s: lm_tokenizer_from_hf_folder: %s\n", name, lm_last_error());
        CHECK(st == LM_OK);
    } else {
        printf("%-20s HF folder SKIPPED: no %s/tokenizer.json (scripts/make_tokenizer_golden.py --hf)\n",
               name, hf_dir);
    }

    tally t_plain = {0}, t_special = {0}, t_add = {0}, t_rt = {0};
    tally h_special = {0}, h_plain = {0}, h_rt = {0};
    char *text = malloc(1 << 16);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItem(c, "hex"));
        if (!hex || strlen(hex) / 2 >= (1 << 16)) continue;
        size_t len = unhex(hex, text);
        text[len] = '\0';
        bool invalid = cJSON_IsTrue(cJSON_GetObjectItem(c, "invalid_utf8"));
        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        const cJSON *ids_sp = cJSON_GetObjectItem(c, "ids_special");
        const cJSON *ids_add = cJSON_GetObjectItem(c, "ids_add_special");
        const cJSON *hf_ids = cJSON_GetObjectItem(c, "hf");
        if (tok) {
            bool bpe = lm_tokenizer_model(tok) == LM_VOCAB_BPE;
            if (!invalid) {
                same_ids(tok, name, "gguf", text, len, false, false, ids, &t_plain);
                same_ids(tok, name, "gguf special", text, len, false, true, ids_sp, &t_special);
                same_ids(tok, name, "gguf add_special", text, len, true, true, ids_add, &t_add);
            }
            /* bytes that never occur in UTF-8 may have no token in a byte-level vocabulary
             * trained on valid text (llama.cpp drops them too) */
            bool representable = true;
            for (size_t k = 0; k < len; k++) {
                unsigned char ch = (unsigned char)text[k];
                if (ch == 0xC0 || ch == 0xC1 || ch >= 0xF5) representable = false;
            }
            if (!invalid || !bpe || representable) {
                round_trip(tok, name, text, len, false, &t_rt);
                round_trip(tok, name, text, len, true, &t_rt);
            }
        }
        if (hf) {
            if (hf_ids) same_ids(hf, name, "hf special", text, len, false, true, hf_ids, &h_special);
            /* where `tokenizers` and llama.cpp agree, parse_special off must match llama.cpp */
            bool agree = hf_ids && cJSON_Compare(hf_ids, ids_sp, true);
            if (agree) same_ids(hf, name, "hf", text, len, false, false, ids, &h_plain);
            /* lossless where the normalizer leaves the text alone */
            if (!invalid && agree) round_trip(hf, name, text, len, false, &h_rt);
        }
    }
    free(text);
    if (tok) {
        report(name, "gguf parse_special=0", &t_plain);
        report(name, "gguf parse_special=1", &t_special);
        report(name, "gguf add+parse_special", &t_add);
        report(name, "gguf round trips", &t_rt);
        tested++;
    }
    if (hf) {
        report(name, "hf vs tokenizers", &h_special);
        report(name, "hf parse_special=0 vs llama", &h_plain);
        report(name, "hf round trips", &h_rt);
        CHECK(h_special.checked > 0);
        if (tok) {
            /* the two loaders agree on the special ids that matter for generation */
            CHECK(lm_tokenizer_eos(hf) == lm_tokenizer_eos(tok));
            CHECK(lm_tokenizer_add_bos(hf) == lm_tokenizer_add_bos(tok));
            CHECK(lm_tokenizer_is_eog(hf, lm_tokenizer_eos(tok)));
        }
        tested++;
    }
    lm_tokenizer_free(hf);
    lm_tokenizer_free(tok);
    lm_gguf_close(g);
    cJSON_Delete(doc);
    return tested;
}

int main(void) {
    int tested = 0;
    for (size_t i = 0; i < sizeof k_models / sizeof k_models[0]; i++) tested += test_model(k_models[i]);
    if (!tested && !lm_test_failures) {
        printf("SKIPPED: none of the models is pulled\n");
        return LM_TEST_SKIP;
    }
    TEST_MAIN_END();
}
