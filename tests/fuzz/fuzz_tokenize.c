/* libFuzzer target: encode and decode arbitrary bytes with small built-in vocabularies.
 * The first input byte picks the tokenizer (byte-level BPE under one of several
 * pre-tokenizers, with or without NFC; SentencePiece-style by score; SentencePiece-style
 * by merge rank) and the flags; the rest is the text. Checked, beyond "no crash, no leak,
 * no sanitizer report":
 *   - every id is in range, and the needed-size convention gives the same count;
 *   - byte-level BPE without normalization is lossless: decode(encode(x)) == x;
 *   - SentencePiece without special tokens in the text and without BOS is lossless too,
 *     unless the text holds U+2581 itself (which decodes to a space, as in llama.cpp);
 *   - the streaming detokenizer returns exactly the whole decode. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "fuzz_tokenize: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                             \
        }                                                                        \
    } while (0)

enum { N_BPE_KINDS = 8, N_CONFIGS = N_BPE_KINDS * 2 + 2 };
static const char *const kPreName[N_BPE_KINDS] = {"gpt-2", "llama3", "qwen2", "smollm",
                                                  "default", "deepseek-llm", "gpt-4o", "tekken"};
static lm_tokenizer *g_tok[N_CONFIGS];

static const char *const kBpeMerges[] = {
    "\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "e r", "\xc4\xa0 a", "o n", "r e", "\xc4\xa0 \xc4\xa0",
    "\xc4\xa0\xc4\xa0 \xc4\xa0\xc4\xa0", "a n", "\xc4\xa0 s", "1 2", "12 3", "\xc3\xa4 \xc2\xbd", "\xc4\x8a \xc4\x8a"};

/* GPT-2's byte -> code point map, written out here so the fuzzer does not lean on bpe.c */
static size_t byte_text(unsigned b, char *out) {
    unsigned c = b <= 32 ? 256 + b : (b >= 127 && b <= 160) ? 289 + (b - 127) : b == 173 ? 323 : b;
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

static lm_tokenizer *make_bpe(int k, bool nfc) {
    enum { NB = 256, NM = sizeof kBpeMerges / sizeof kBpeMerges[0] };
    static char bytes[NB][2];
    static char merged[NM][32];
    lm_strview toks[NB + NM + 3];
    int32_t types[NB + NM + 3];
    lm_strview merges[NM];
    size_t n = 0;
    for (unsigned b = 0; b < NB; b++) {
        toks[n] = (lm_strview){bytes[b], byte_text(b, bytes[b])};
        types[n++] = LM_TOKTYPE_NORMAL;
    }
    for (size_t i = 0; i < NM; i++) {
        const char *m = kBpeMerges[i];
        const char *sp = strchr(m + 1, ' ');
        size_t l = (size_t)(sp - m), r = strlen(sp + 1);
        memcpy(merged[i], m, l);
        memcpy(merged[i] + l, sp + 1, r);
        toks[n] = (lm_strview){merged[i], l + r};
        types[n++] = LM_TOKTYPE_NORMAL;
        merges[i] = (lm_strview){m, strlen(m)};
    }
    toks[n] = (lm_strview){"<|im_start|>", 12}, types[n++] = LM_TOKTYPE_CONTROL;
    toks[n] = (lm_strview){"<|endoftext|>", 13}, types[n++] = LM_TOKTYPE_CONTROL;
    toks[n] = (lm_strview){"<tool>", 6}, types[n++] = LM_TOKTYPE_USER_DEFINED;
    lm_vocab_desc d;
    lm_vocab_desc_init(&d, LM_VOCAB_BPE);
    d.n_tokens = (uint32_t)n;
    d.tokens = toks;
    d.types = types;
    d.n_merges = NM;
    d.merges = merges;
    d.pre = (lm_strview){kPreName[k], strlen(kPreName[k])};
    d.clean_spaces = 0;
    d.normalizer = nfc ? LM_NORM_NFC : LM_NORM_NONE;
    d.bos_id = (int32_t)n - 3;
    d.eos_id = (int32_t)n - 2;
    d.add_bos = 1;
    lm_tokenizer *t = NULL;
    CHECK(lm_tokenizer_create(&d, &t) == LM_OK);
    return t;
}

static lm_tokenizer *make_spm(bool by_merges) {
    static const char *const pieces[] = {"\xe2\x96\x81", "\xe2\x96\x81t", "he", "\xe2\x96\x81the", "a", "b", "c",
                                         "d", "e", "h", "t", "n", "i", "in", "\xe2\x96\x81in", "\xe4\xbd\xa0",
                                         "\xe2\x96\x81\xe2\x96\x81", "ab", "abc"};
    enum { NP = sizeof pieces / sizeof pieces[0] };
    static char bytes[256][8];
    lm_strview toks[3 + 256 + NP];
    int32_t types[3 + 256 + NP];
    float scores[3 + 256 + NP];
    size_t n = 0;
    toks[n] = (lm_strview){"<unk>", 5}, types[n] = LM_TOKTYPE_UNKNOWN, scores[n++] = 0;
    toks[n] = (lm_strview){"<s>", 3}, types[n] = LM_TOKTYPE_CONTROL, scores[n++] = 0;
    toks[n] = (lm_strview){"</s>", 4}, types[n] = LM_TOKTYPE_CONTROL, scores[n++] = 0;
    for (unsigned b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = (lm_strview){bytes[b], 6}, types[n] = LM_TOKTYPE_BYTE, scores[n++] = 0;
    }
    for (size_t i = 0; i < NP; i++)
        toks[n] = (lm_strview){pieces[i], strlen(pieces[i])}, types[n] = LM_TOKTYPE_NORMAL, scores[n++] = -(float)i;
    /* merges for the merge-rank mode: every split of a piece into two pieces, by score */
    static char mtext[64][32];
    lm_strview merges[64];
    size_t nm = 0;
    for (size_t i = 0; i < NP && nm < 64; i++) {
        size_t len = strlen(pieces[i]);
        for (size_t cut = 1; cut < len && nm < 64; cut++) {
            bool l = false, r = false;
            for (size_t j = 0; j < NP; j++) {
                l |= strlen(pieces[j]) == cut && memcmp(pieces[j], pieces[i], cut) == 0;
                r |= strcmp(pieces[j], pieces[i] + cut) == 0;
            }
            if (!l || !r) continue;
            snprintf(mtext[nm], sizeof mtext[nm], "%.*s %s", (int)cut, pieces[i], pieces[i] + cut);
            merges[nm] = (lm_strview){mtext[nm], strlen(mtext[nm])};
            nm++;
        }
    }
    lm_vocab_desc d;
    lm_vocab_desc_init(&d, LM_VOCAB_SPM);
    d.n_tokens = (uint32_t)n;
    d.tokens = toks;
    d.types = types;
    d.scores = scores;
    if (by_merges) {
        d.spm_merges = true;
        d.n_merges = (uint32_t)nm;
        d.merges = merges;
    }
    lm_tokenizer *t = NULL;
    CHECK(lm_tokenizer_create(&d, &t) == LM_OK);
    return t;
}

static lm_tokenizer *get(int cfg) {
    if (!g_tok[cfg]) {
        if (cfg < 2 * N_BPE_KINDS) g_tok[cfg] = make_bpe(cfg % N_BPE_KINDS, cfg >= N_BPE_KINDS);
        else g_tok[cfg] = make_spm(cfg == 2 * N_BPE_KINDS + 1);
    }
    return g_tok[cfg];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 16 << 10) return 0;
    int cfg = data[0] % N_CONFIGS;
    bool parse_special = data[0] & 0x40, add_special = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    lm_tokenizer *t = get(cfg);
    bool spm = lm_tokenizer_model(t) == LM_VOCAB_SPM;
    bool nfc = !spm && cfg >= N_BPE_KINDS;

    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(lm_tokenizer_encode_alloc(t, text, len, add_special, parse_special, &ids, &n) == LM_OK);
    uint32_t nv = lm_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && (uint32_t)ids[i] < nv);
    size_t n2 = 0;
    int32_t small[4];
    CHECK(lm_tokenizer_encode(t, text, len, add_special, parse_special, small, 4, &n2) == LM_OK);
    CHECK(n2 == n);

    size_t cap = len * 4 + 64, m = 0;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    CHECK(lm_tokenizer_decode(t, ids, n, add_special, parse_special, buf, cap, &m) == LM_OK);
    CHECK(m <= cap);

    bool lossless = !nfc;
    if (spm) {
        /* special text would break the space-prefix rule; U+2581 decodes to a space */
        /* as llama.cpp: a removed BOS keeps the first piece's space */
        lossless = !add_special && !memmem(text, len, "\xe2\x96\x81", 3) && !memmem(text, len, "<s>", 3) &&
                   !memmem(text, len, "</s>", 4) && !memmem(text, len, "<unk>", 5);
    }
    if (lossless) CHECK(m == len && memcmp(buf, text, len) == 0);

    lm_detok_stream *s = NULL;
    CHECK(lm_detok_stream_create(t, add_special, parse_special, &s) == LM_OK);
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        CHECK((i < n ? lm_detok_stream_push(s, ids[i], &p, &pl) : lm_detok_stream_finish(s, &p, &pl)) == LM_OK);
        CHECK(k + pl <= m && memcmp(buf + k, p, pl) == 0);
        k += pl;
    }
    CHECK(k == m);
    lm_detok_stream_free(s);
    free(buf);
    free(ids);
    return 0;
}
