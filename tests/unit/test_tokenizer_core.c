/* Tokenizer core on small in-memory vocabularies: BPE merge order, SPM scores and byte
 * fallback, special/user-defined tokens with and without parse_special, BOS/EOS, the
 * needed-size convention, the incremental detokenizer (split characters, clean_spaces
 * against the whole-sequence passes on random input), long words, bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ---- a byte-level BPE vocabulary: 256 byte tokens + a few merges + specials ---- */

static lm_tokenizer *make_bpe(const char *pre, int add_bos) {
    lm_strview toks[256 + 16];
    int32_t types[256 + 16];
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        char *p = malloc(2);
        size_t k = lm_byte_to_utf8((uint8_t)b, p);
        toks[n] = (lm_strview){p, k};
        types[n++] = LM_TOKTYPE_NORMAL;
    }
    const char *extra[] = {"ab", "abc", ("\xc4\xa0" "a"), "aa", "aaaa", "<|s|>", "<ud>", "<|eot_id|>"};
    const int32_t et[] = {1, 1, 1, 1, 1, LM_TOKTYPE_CONTROL, LM_TOKTYPE_USER_DEFINED, LM_TOKTYPE_CONTROL};
    for (size_t i = 0; i < 8; i++) {
        toks[n] = (lm_strview){extra[i], strlen(extra[i])};
        types[n++] = et[i];
    }
    const char *mg[] = {"a b", "ab c", "\xc4\xa0 a", "a a", "aa aa"};
    lm_strview merges[5];
    for (int i = 0; i < 5; i++) merges[i] = (lm_strview){mg[i], strlen(mg[i])};
    lm_vocab_desc d;
    lm_vocab_desc_init(&d, LM_VOCAB_BPE);
    d.pre = (lm_strview){pre, strlen(pre)};
    d.n_tokens = n;
    d.tokens = toks;
    d.types = types;
    d.n_merges = 5;
    d.merges = merges;
    d.bos_id = 256 + 5; /* <|s|> */
    d.eos_id = 256 + 7;
    d.add_bos = add_bos;
    lm_tokenizer *t = NULL;
    lm_status st = lm_tokenizer_create(&d, &t);
    if (st) fprintf(stderr, "create: %s\n", lm_last_error());
    for (int b = 0; b < 256; b++) free((void *)toks[b].ptr);
    return t;
}

static int32_t byte_id(int b) { return b; } /* byte tokens come first, in byte order */

static bool tok_eq(const lm_tokenizer *t, const char *text, bool add, bool parse, const int32_t *want,
                   size_t nw) {
    int32_t *ids;
    size_t n;
    if (lm_tokenizer_encode_alloc(t, text, strlen(text), add, parse, &ids, &n)) return false;
    bool ok = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "  '%s': got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

static void test_bpe(void) {
    lm_tokenizer *t = make_bpe("gpt-2", 0);
    CHECK(t != NULL);
    if (!t) return;
    const int32_t AB = 256, ABC = 257, GA = 258, AA = 259, AAAA = 260, S = 261, UD = 262;
    /* merges by rank: "a b" then "ab c" */
    CHECK(tok_eq(t, "abc", false, false, (int32_t[]){ABC}, 1));
    /* " abc": "a b" (rank 0) beats "Ġ a" (rank 2), so Ġ stays alone */
    CHECK(tok_eq(t, " abc", false, false, (int32_t[]){byte_id(' '), ABC}, 2));
    CHECK(tok_eq(t, " a", false, false, (int32_t[]){GA}, 1));
    CHECK(tok_eq(t, "aaaaa", false, false, (int32_t[]){AAAA, byte_id('a')}, 2));
    /* control tokens only with parse_special; user-defined always */
    CHECK(tok_eq(t, "a<|s|>b", false, true, (int32_t[]){byte_id('a'), S, byte_id('b')}, 3));
    {
        int32_t *ids;
        size_t n;
        CHECK(lm_tokenizer_encode_alloc(t, "<|s|>", 5, false, false, &ids, &n) == LM_OK);
        CHECK(n > 1);
        for (size_t i = 0; i < n; i++) CHECK(ids[i] != S);
        free(ids);
    }
    CHECK(tok_eq(t, "x<ud>y", false, false, (int32_t[]){byte_id('x'), UD, byte_id('y')}, 3));
    /* BOS only when the model asks and add_special is set */
    CHECK(tok_eq(t, "ab", true, false, (int32_t[]){AB}, 1));
    CHECK(lm_tokenizer_is_eog(t, 263));
    /* empty input */
    CHECK(tok_eq(t, "", true, true, NULL, 0));
    /* needed-size convention */
    int32_t one[1];
    size_t need = 0;
    /* "ab ab ab" -> ab, Ġ, ab, Ġ, ab ("a b" outranks "Ġ a") */
    CHECK(lm_tokenizer_encode(t, "ab ab ab", 8, false, false, one, 1, &need) == LM_OK);
    CHECK(need == 5 && one[0] == AB);
    CHECK(lm_tokenizer_encode(t, "ab ab ab", 8, false, false, NULL, 0, &need) == LM_OK && need == 5);
    /* pieces: control tokens only with special */
    const char *p;
    size_t pl;
    CHECK(lm_tokenizer_piece(t, S, false, &p, &pl) == LM_OK && pl == 0);
    CHECK(lm_tokenizer_piece(t, S, true, &p, &pl) == LM_OK && pl == 5 && memcmp(p, "<|s|>", 5) == 0);
    CHECK(lm_tokenizer_piece(t, GA, true, &p, &pl) == LM_OK && pl == 2 && memcmp(p, " a", 2) == 0);
    CHECK(lm_tokenizer_piece(t, 99999, true, &p, &pl) == LM_ERR_INVALID_ARG);
    CHECK(lm_tokenizer_piece(t, -1, true, &p, &pl) == LM_ERR_INVALID_ARG);
    int32_t bad[] = {AB, 1 << 30};
    char buf[16];
    size_t dn;
    CHECK(lm_tokenizer_decode(t, bad, 2, false, false, buf, sizeof buf, &dn) == LM_ERR_INVALID_ARG);
    (void)AA;

    /* a long single word: the merge loop must be O(n log n), not quadratic */
    size_t big = 1u << 20;
    char *w = malloc(big);
    memset(w, 'a', big);
    clock_t c0 = clock();
    int32_t *ids;
    size_t n;
    CHECK(lm_tokenizer_encode_alloc(t, w, big, false, false, &ids, &n) == LM_OK);
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    CHECK(n == big / 4);
    fprintf(stderr, "  1 MiB single word: %zu tokens in %.3f s\n", n, secs);
    CHECK(secs < 5.0);
    free(ids);
    free(w);
    lm_tokenizer_free(t);

    /* BOS when asked */
    t = make_bpe("llama-bpe", -1); /* llama3 pre-tokenizer adds BOS by default */
    CHECK(t && lm_tokenizer_add_bos(t));
    if (t) CHECK(tok_eq(t, "ab", true, false, (int32_t[]){S, AB}, 2));
    lm_tokenizer_free(t);
}

/* ---- SPM ---- */

static lm_tokenizer *make_spm(int add_space_prefix) {
    static char bytes[256][7];
    lm_strview toks[300];
    float scores[300];
    int32_t types[300];
    uint32_t n = 0;
    const char *base[] = {"<unk>", "<s>", "</s>"};
    const int32_t bt[] = {LM_TOKTYPE_UNKNOWN, LM_TOKTYPE_CONTROL, LM_TOKTYPE_CONTROL};
    for (int i = 0; i < 3; i++) {
        toks[n] = (lm_strview){base[i], strlen(base[i])};
        scores[n] = 0;
        types[n++] = bt[i];
    }
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = (lm_strview){bytes[b], 6};
        scores[n] = 0;
        types[n++] = LM_TOKTYPE_BYTE;
    }
    const char *w[] = {"\xe2\x96\x81", "h", "e", "l", "o", "\xe2\x96\x81h", "ll", "llo", "\xe2\x96\x81he",
                       "\xe2\x96\x81hello", "<ud>"};
    const float ws[] = {-1, -2, -2, -2, -2, -3, -4, -5, -6, -7, 0};
    for (int i = 0; i < 11; i++) {
        toks[n] = (lm_strview){w[i], strlen(w[i])};
        scores[n] = ws[i];
        types[n++] = i == 10 ? LM_TOKTYPE_USER_DEFINED : LM_TOKTYPE_NORMAL;
    }
    lm_vocab_desc d;
    lm_vocab_desc_init(&d, LM_VOCAB_SPM);
    d.n_tokens = n;
    d.tokens = toks;
    d.scores = scores;
    d.types = types;
    d.add_space_prefix = add_space_prefix;
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_create(&d, &t)) fprintf(stderr, "spm create: %s\n", lm_last_error());
    return t;
}

static void test_spm(void) {
    lm_tokenizer *t = make_spm(-1);
    CHECK(t != NULL);
    if (!t) return;
    const int32_t SP = 259, HELLO = 268, UD = 269, BOS = 1, EOS = 2;
    CHECK(lm_tokenizer_add_bos(t) && lm_tokenizer_bos(t) == BOS && lm_tokenizer_eos(t) == EOS);
    CHECK(tok_eq(t, "hello", false, false, (int32_t[]){HELLO}, 1));
    CHECK(tok_eq(t, "hello", true, false, (int32_t[]){BOS, HELLO}, 2));
    /* "é" is not a token: byte fallback */
    CHECK(tok_eq(t, "\xc3\xa9", false, false, (int32_t[]){SP, 3 + 0xC3, 3 + 0xA9}, 3));
    /* the space prefix returns after a special token */
    CHECK(tok_eq(t, "hello<s>hello", false, true, (int32_t[]){HELLO, BOS, HELLO}, 3));
    CHECK(tok_eq(t, "<ud>hello", false, false, (int32_t[]){UD, HELLO}, 2));

    /* detokenize: the first piece loses the prefix space; a removed BOS keeps it */
    char buf[64];
    size_t n;
    int32_t seq[] = {BOS, HELLO, SP, 3 + 0xC3, 3 + 0xA9};
    CHECK(lm_tokenizer_decode(t, seq + 1, 4, false, false, buf, sizeof buf, &n) == LM_OK);
    CHECK(n == 8 && memcmp(buf, "hello \xc3\xa9", 8) == 0);
    CHECK(lm_tokenizer_decode(t, seq, 5, true, false, buf, sizeof buf, &n) == LM_OK);
    CHECK(n == 9 && memcmp(buf, " hello \xc3\xa9", 9) == 0);

    /* stream: the split character is held back until complete */
    lm_detok_stream *s;
    CHECK(lm_detok_stream_create(t, false, false, &s) == LM_OK);
    const char *out;
    size_t ol;
    CHECK(lm_detok_stream_push(s, HELLO, &out, &ol) == LM_OK && ol == 5 && memcmp(out, "hello", 5) == 0);
    CHECK(lm_detok_stream_push(s, SP, &out, &ol) == LM_OK && ol == 1);
    CHECK(lm_detok_stream_push(s, 3 + 0xC3, &out, &ol) == LM_OK && ol == 0);
    CHECK(lm_detok_stream_push(s, 3 + 0xA9, &out, &ol) == LM_OK && ol == 2 && memcmp(out, "\xc3\xa9", 2) == 0);
    /* an unfinished character comes out at the end, as in the whole text */
    CHECK(lm_detok_stream_push(s, 3 + 0xE2, &out, &ol) == LM_OK && ol == 0);
    CHECK(lm_detok_stream_finish(s, &out, &ol) == LM_OK && ol == 1 && (unsigned char)out[0] == 0xE2);
    /* after finish the stream starts over (prefix space removed again) */
    CHECK(lm_detok_stream_push(s, HELLO, &out, &ol) == LM_OK && ol == 5);
    lm_detok_stream_free(s);
    lm_tokenizer_free(t);

    t = make_spm(0); /* Gemma-style: no space prefix */
    CHECK(t && !lm_tokenizer_add_space_prefix(t));
    /* no "▁": h e l l o -> "ll" (-4) -> "llo" (-5) */
    if (t) CHECK(tok_eq(t, "hello", false, false, (int32_t[]){260, 261, 266}, 3));
    lm_tokenizer_free(t);
}

/* ---- clean_spaces: the streaming transducers against the whole-text passes ---- */

static void test_clean_stream(void) {
    lm_tokenizer *t = make_bpe("gpt-2", 0); /* gpt-2: clean_spaces on */
    CHECK(t != NULL);
    if (!t) return;
    const char alpha[] = " '?.,!smrvetdlx";
    int32_t ids[24];
    char whole[256];
    srand(1234);
    int bad = 0;
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = (size_t)(rand() % 24);
        for (size_t i = 0; i < n; i++) ids[i] = byte_id((unsigned char)alpha[rand() % (sizeof alpha - 1)]);
        size_t wn;
        CHECK(lm_tokenizer_decode(t, ids, n, false, false, whole, sizeof whole, &wn) == LM_OK);
        lm_detok_stream *s;
        if (lm_detok_stream_create(t, false, false, &s)) break;
        char acc[256];
        size_t an = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *o;
            size_t ol;
            if (i < n) lm_detok_stream_push(s, ids[i], &o, &ol);
            else lm_detok_stream_finish(s, &o, &ol);
            memcpy(acc + an, o, ol);
            an += ol;
        }
        lm_detok_stream_free(s);
        if (an != wn || memcmp(acc, whole, an) != 0) {
            if (bad++ < 5) fprintf(stderr, "  stream '%.*s' != whole '%.*s'\n", (int)an, acc, (int)wn, whole);
        }
    }
    CHECK(bad == 0);
    lm_tokenizer_free(t);
}

static void test_bad_desc(void) {
    lm_vocab_desc d;
    lm_vocab_desc_init(&d, LM_VOCAB_BPE);
    lm_tokenizer *t = (lm_tokenizer *)1;
    CHECK(lm_tokenizer_create(&d, &t) == LM_ERR_INVALID_ARG && t == NULL);
    lm_strview tok[2] = {{"a", 1}, {"b", 1}};
    lm_strview mg[1] = {{"ab", 2}}; /* no separator */
    d.n_tokens = 2;
    d.tokens = tok;
    d.n_merges = 1;
    d.merges = mg;
    CHECK(lm_tokenizer_create(&d, &t) == LM_ERR_FORMAT);
    mg[0] = (lm_strview){"a b", 3};
    d.pre = (lm_strview){"no-such-pre", 11};
    CHECK(lm_tokenizer_create(&d, &t) == LM_ERR_UNSUPPORTED);
    d.pre = (lm_strview){"qwen2", 5};
    d.bos_id = 7; /* out of range: falls back to the default (also out of range: none) */
    CHECK(lm_tokenizer_create(&d, &t) == LM_OK);
    CHECK(lm_tokenizer_bos(t) == LM_TOKEN_NULL);
    lm_tokenizer_free(t);
    lm_tokenizer_free(NULL);
    lm_detok_stream_free(NULL);
}

int main(void) {
    test_bpe();
    test_spm();
    test_clean_stream();
    test_bad_desc();
    TEST_MAIN_END();
}
