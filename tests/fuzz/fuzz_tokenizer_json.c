/* libFuzzer target: the tokenizer.json loader from memory (lm_tokenizer_from_hf_json).
 * The input is tokenizer.json text, optionally followed by "\n@@cfg\n" and a
 * tokenizer_config.json, and "\n@@gen\n" and a generation_config.json. When it loads,
 * the tokenizer encodes and decodes a few fixed strings and the input itself. Any crash,
 * leak or sanitizer report is a bug; load errors are expected and ignored. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static const char *const kTexts[] = {
    "Hello world", " hi  there\n\n", "<|im_start|>user\nHi<|im_end|>", "caf\xc3\xa9 e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd",
    "\xff\xfe bad \xc3", "123456 x=1;", "\xe2\x96\x81\xe2\x96\x81 <0x41>"};

static void exercise(const lm_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    for (int special = 0; special < 2; special++) {
        if (lm_tokenizer_encode_alloc(t, text, len, special, special, &ids, &n) != LM_OK) continue;
        char buf[4096];
        size_t m = 0;
        lm_tokenizer_decode(t, ids, n, special, special, buf, sizeof buf, &m);
        lm_detok_stream *s = NULL;
        if (lm_detok_stream_create(t, special, special, &s) == LM_OK) {
            const char *p;
            size_t pl;
            for (size_t i = 0; i < n; i++) lm_detok_stream_push(s, ids[i], &p, &pl);
            lm_detok_stream_finish(s, &p, &pl);
            lm_detok_stream_free(s);
        }
        free(ids);
        ids = NULL;
    }
}

static const char *find_sep(const char *p, size_t n, const char *sep) {
    size_t k = strlen(sep);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(p + i, sep, k) == 0) return p + i;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 << 10) return 0;
    const char *tj = (const char *)data;
    size_t tl = size;
    const char *cj = NULL, *gj = NULL;
    size_t cl = 0, gl = 0;
    const char *c = find_sep(tj, tl, "\n@@cfg\n");
    const char *g = find_sep(tj, tl, "\n@@gen\n");
    if (g) {
        gj = g + 7;
        gl = (size_t)(tj + size - gj);
        tl = (size_t)(g - tj);
    }
    if (c && c < tj + tl) {
        cj = c + 7;
        cl = (size_t)(tj + tl - cj);
        tl = (size_t)(c - tj);
    }
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_from_hf_json(tj, tl, cj, cl, gj, gl, "fuzz", &t) != LM_OK) return 0;
    for (size_t i = 0; i < sizeof kTexts / sizeof kTexts[0]; i++) exercise(t, kTexts[i], strlen(kTexts[i]));
    exercise(t, (const char *)data, size < 2048 ? size : 2048);
    for (int32_t id = -1; id < 4; id++) {
        const char *p;
        size_t pl;
        lm_tokenizer_piece(t, id, true, &p, &pl);
    }
    lm_tokenizer_free(t);
    return 0;
}
