/* Exact token ids on llama.cpp's vocabulary test vectors (ggml-vocab-NAME.gguf with
 * NAME.gguf.inp / NAME.gguf.out), tokenized the way llama.cpp's test-tokenizer-0 does
 * it: add_special = false, parse_special = false. Also checks, per vector:
 * decode(encode(x)) == x where the vocabulary is lossless (no clean_spaces), the
 * incremental detokenizer against the whole one, and invalid UTF-8 input.
 *
 * The files come from $LUMEN_VOCAB_DIR, else /work/shared/vocab, else the cache that
 * scripts/fetch_tokenizer_vocab.sh fills (~/.cache/lumen/vocab); without them the test
 * is skipped (exit 77). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const struct {
    const char *name;
    bool lossless; /* decode(encode(x)) == x expected for every vector */
} k_vocabs[] = {
    {"llama-spm", true},  {"llama-bpe", false},      {"phi-3", true},     {"qwen2", true},
    {"gpt-2", false},     {"deepseek-llm", true},    {"deepseek-coder", true},
    {"falcon", false},    {"mpt", false},            {"starcoder", false}, {"refact", false},
    {"command-r", true},  {"qwen35", true},
};

static bool is_dir(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

typedef struct {
    const char *p;
    size_t n;
} str;

/* Splits the .inp text at "\n__ggml_vocab_test__\n" like llama.cpp's reader. */
static size_t split_inputs(const char *raw, size_t len, str *out, size_t cap) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t seplen = sizeof sep - 1, pos = 0, n = 0;
    while (pos < len && n < cap) {
        const char *m = memmem(raw + pos, len - pos, sep, seplen);
        if (!m) {
            out[n++] = (str){raw + pos, len - pos};
            break;
        }
        out[n++] = (str){raw + pos, (size_t)(m - (raw + pos))};
        pos = (size_t)(m - raw) + seplen;
    }
    return n;
}

static bool stream_matches(const lm_tokenizer *tok, const int32_t *ids, size_t n,
                           const char *whole, size_t whole_n) {
    lm_detok_stream *s;
    if (lm_detok_stream_create(tok, false, true, &s)) return false;
    char *acc = malloc(whole_n + 64 * (n + 1));
    size_t an = 0;
    bool ok = acc != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *t;
        size_t tl;
        lm_status st = i < n ? lm_detok_stream_push(s, ids[i], &t, &tl) : lm_detok_stream_finish(s, &t, &tl);
        if (st || an + tl > whole_n + 64 * (n + 1)) {
            ok = false;
            break;
        }
        /* a push never ends inside a character */
        if (i < n && tl) {
            size_t k = 0;
            while (k < tl && k < 4 && ((unsigned char)t[tl - 1 - k] & 0xC0) == 0x80) k++;
            if (k < tl) {
                unsigned char lead = (unsigned char)t[tl - 1 - k];
                size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 1;
                if (lead >= 0xC2 && lead <= 0xF4 && k + 1 < need) ok = false;
            }
        }
        memcpy(acc + an, t, tl);
        an += tl;
    }
    ok = ok && an == whole_n && memcmp(acc, whole, an) == 0;
    free(acc);
    lm_detok_stream_free(s);
    return ok;
}

/* The same vectors tokenized concurrently on one tokenizer (it is immutable). */
typedef struct {
    const lm_tokenizer *tok;
    const str *tests;
    size_t n;
    int32_t *const *expect;
    const size_t *n_expect;
    int failures;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    for (int rep = 0; rep < 3; rep++) {
        for (size_t t = 0; t < j->n; t++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (lm_tokenizer_encode_alloc(j->tok, j->tests[t].p, j->tests[t].n, false, false, &ids, &n) != LM_OK ||
                n != j->n_expect[t] || (n && memcmp(ids, j->expect[t], n * sizeof *ids) != 0))
                j->failures++;
            free(ids);
        }
    }
    return NULL;
}

static int run_vocab(const char *dir, const char *name, bool lossless, int *n_pass, int *n_total) {
    char path[1024], pin[1100], pout[1100];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, name);
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    lm_gguf *g = NULL;
    if (lm_gguf_open(path, &g) != LM_OK) {
        fprintf(stderr, "  %-15s missing (%s)\n", name, lm_last_error());
        return -1;
    }
    lm_tokenizer *tok = NULL;
    lm_status st = lm_tokenizer_from_gguf(g, &tok);
    lm_gguf_close(g);
    if (st) {
        fprintf(stderr, "  %-15s FAILED to load: %s\n", name, lm_last_error());
        CHECK(st == LM_OK);
        return 1;
    }
    size_t in_len = 0, out_len = 0;
    char *inp = read_file(pin, &in_len), *outp = read_file(pout, &out_len);
    CHECK(inp && outp);
    if (!inp || !outp) {
        free(inp);
        free(outp);
        lm_tokenizer_free(tok);
        return 1;
    }
    str tests[512];
    size_t nt = split_inputs(inp, in_len, tests, 512);
    int pass = 0, total = 0, rt_ok = 0, stream_ok = 0;
    int32_t *expects[512];
    size_t n_expects[512];
    char *line = outp;
    for (size_t t = 0; t < nt; t++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        int32_t expect[1024];
        size_t ne = 0;
        for (char *q = line; *q && ne < 1024;) {
            while (*q == ' ') q++;
            if (!*q) break;
            expect[ne++] = (int32_t)strtol(q, &q, 10);
        }
        line = nl ? nl + 1 : line + strlen(line);
        expects[t] = malloc((ne ? ne : 1) * sizeof(int32_t));
        if (ne) memcpy(expects[t], expect, ne * sizeof(int32_t));
        n_expects[t] = ne;

        int32_t *ids = NULL;
        size_t n = 0;
        total++;
        st = lm_tokenizer_encode_alloc(tok, tests[t].p, tests[t].n, false, false, &ids, &n);
        bool ok = st == LM_OK && n == ne && (n == 0 || memcmp(ids, expect, n * sizeof *ids) == 0);
        if (ok) {
            pass++;
        } else {
            fprintf(stderr, "  %s: mismatch on '%.*s'\n    expected:", name, (int)tests[t].n, tests[t].p);
            for (size_t i = 0; i < ne; i++) fprintf(stderr, " %d", expect[i]);
            fprintf(stderr, "\n    got:     ");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        size_t dn = 0;
        lm_tokenizer_decode(tok, ids, n, false, true, NULL, 0, &dn);
        char *dec = malloc(dn + 1);
        CHECK(lm_tokenizer_decode(tok, ids, n, false, true, dec, dn, &dn) == LM_OK);
        if (dn == tests[t].n && memcmp(dec, tests[t].p, dn) == 0)
            rt_ok++;
        else if (lossless)
            fprintf(stderr, "  %s: round trip changed '%.*s' into '%.*s'\n", name, (int)tests[t].n,
                    tests[t].p, (int)dn, dec);
        if (stream_matches(tok, ids, n, dec, dn))
            stream_ok++;
        else
            fprintf(stderr, "  %s: stream detokenizer differs on '%.*s'\n", name, (int)tests[t].n, tests[t].p);
        free(dec);
        free(ids);
    }
    fprintf(stderr, "  %-15s ids %d/%d  round-trip %d/%d%s  stream %d/%d\n", name, pass, total,
            rt_ok, total, lossless ? "" : " (clean_spaces: lossy by design)", stream_ok, total);
    CHECK(pass == total);
    CHECK(stream_ok == total);

    thread_job jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (thread_job){tok, tests, nt, expects, n_expects, 0};
        CHECK(pthread_create(&th[k], NULL, thread_main, &jobs[k]) == 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        CHECK(jobs[k].failures == 0);
    }
    for (size_t t = 0; t < nt; t++) free(expects[t]);
    if (lossless) CHECK(rt_ok == total);

    /* invalid UTF-8: tokenized without error; byte-exact round trip, except for bytes
     * that never occur in UTF-8 (C0, C1, F5..FF): byte-level vocabularies trained on
     * valid text may have no token for them, and llama.cpp then drops them too */
    static const char *bad[] = {"\xff", "a\x80z", "\xe2\x82", "ok \xc3\x28 ok", "\xf0\x9f\x98", "\xed\xa0\x80x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        size_t bl = strlen(bad[i]);
        CHECK(lm_tokenizer_encode_alloc(tok, bad[i], bl, false, false, &ids, &n) == LM_OK);
        bool representable = true;
        for (size_t k = 0; k < bl; k++) {
            unsigned char c = (unsigned char)bad[i][k];
            if (c == 0xC0 || c == 0xC1 || c >= 0xF5) representable = false;
        }
        if (!representable) {
            free(ids);
            continue;
        }
        CHECK(n > 0);
        char dec[64];
        size_t dn = 0;
        CHECK(lm_tokenizer_decode(tok, ids, n, false, true, dec, sizeof dec, &dn) == LM_OK);
        if (!(dn == bl && memcmp(dec, bad[i], bl) == 0)) {
            fprintf(stderr, "  %s: invalid UTF-8 input %zu did not round-trip\n", name, i);
            CHECK(0);
        }
        free(ids);
    }

    *n_pass += pass;
    *n_total += total;
    free(inp);
    free(outp);
    lm_tokenizer_free(tok);
    return 0;
}

static bool has_file(const char *dir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", dir, name);
    struct stat st;
    return stat(path, &st) == 0;
}

int main(void) {
    /* each vocabulary from the first place that has it */
    char cache[1024];
    const char *home = getenv("HOME");
    snprintf(cache, sizeof cache, "%s/.cache/lumen/vocab", home ? home : ".");
    const char *dirs[] = {getenv("LUMEN_VOCAB_DIR"), "/work/shared/vocab", cache};
    int pass = 0, total = 0, found = 0;
    for (size_t i = 0; i < sizeof k_vocabs / sizeof k_vocabs[0]; i++) {
        const char *dir = NULL;
        for (size_t k = 0; k < 3 && !dir; k++)
            if (is_dir(dirs[k]) && has_file(dirs[k], k_vocabs[i].name)) dir = dirs[k];
        if (!dir) {
            fprintf(stderr, "  %-15s not found (skipped)\n", k_vocabs[i].name);
            continue;
        }
        if (run_vocab(dir, k_vocabs[i].name, k_vocabs[i].lossless, &pass, &total) >= 0) found++;
    }
    if (found == 0) {
        fprintf(stderr, "SKIP: no vocab test files (set LUMEN_VOCAB_DIR or run "
                        "scripts/fetch_tokenizer_vocab.sh)\n");
        return LM_TEST_SKIP;
    }
    fprintf(stderr, "total: %d/%d vectors exact over %d vocabularies\n", pass, total, found);
    TEST_MAIN_END();
}
