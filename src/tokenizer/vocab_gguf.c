/* GGUF glue: fills an lm_vocab_desc from tokenizer.ggml.* metadata and builds the
 * tokenizer. Strings are borrowed from the (validated) GGUF handle for the duration of
 * the build only. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

static int get_flag(const lm_gguf *g, const char *key) {
    bool b;
    return lm_gguf_get_bool(g, key, &b) == LM_OK ? (int)b : -1;
}

static int32_t get_id(const lm_gguf *g, const char *key) {
    uint32_t u;
    if (lm_gguf_find_key(g, key) < 0) return LM_VOCAB_ID_DEFAULT;
    if (lm_gguf_get_u32(g, key, &u) != LM_OK) {
        int32_t i;
        /* some converters store -1 for "none" */
        if (lm_gguf_get_i32(g, key, &i) == LM_OK && i < 0) return LM_TOKEN_NULL;
        return LM_VOCAB_ID_DEFAULT;
    }
    return u > (uint32_t)INT32_MAX ? LM_VOCAB_ID_DEFAULT : (int32_t)u;
}

static lm_status fail(lm_status st, void *a, void *b, void *c, void *d) {
    free(a);
    free(b);
    free(c);
    free(d);
    return st;
}

lm_status lm_tokenizer_from_gguf(const lm_gguf *g, lm_tokenizer **out) {
    if (!g || !out) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    const char *model;
    size_t model_len;
    if (lm_gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len) != LM_OK)
        return lm_error(LM_ERR_NOT_FOUND, "tokenizer: the GGUF file has no tokenizer.ggml.model");
    lm_vocab_model kind;
    if (model_len == 4 && memcmp(model, "gpt2", 4) == 0)
        kind = LM_VOCAB_BPE;
    else if (model_len == 5 && memcmp(model, "llama", 5) == 0)
        kind = LM_VOCAB_SPM;
    else if (model_len == 8 && memcmp(model, "no_vocab", 8) == 0)
        return lm_error(LM_ERR_NOT_FOUND, "tokenizer: the model has no vocabulary (no_vocab)");
    else
        return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: tokenizer model '%.*s' is not supported",
                        (int)(model_len > 64 ? 64 : model_len), model);

    lm_vocab_desc d;
    lm_vocab_desc_init(&d, kind);

    lm_gguf_type et;
    uint64_t n;
    const void *data;
    if (lm_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) != LM_OK || et != LM_GGUF_STRING)
        return lm_error(LM_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens missing or not strings");
    if (n == 0 || n > LM_VOCAB_MAX_TOKENS)
        return lm_error(n ? LM_ERR_LIMIT : LM_ERR_FORMAT, "tokenizer: %llu tokens",
                        (unsigned long long)n);
    d.n_tokens = (uint32_t)n;
    lm_strview *tokens = malloc(n * sizeof *tokens);
    float *scores = NULL;
    int32_t *types = NULL;
    lm_strview *merges = NULL;
    if (!tokens) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    for (uint64_t i = 0; i < n; i++) {
        if (lm_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &tokens[i].ptr, &tokens[i].len) != LM_OK)
            return fail(lm_error(LM_ERR_FORMAT, "tokenizer: token %llu unreadable", (unsigned long long)i),
                        tokens, 0, 0, 0);
    }
    d.tokens = tokens;

    if (lm_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data) == LM_OK) {
        if (n != d.n_tokens || (et != LM_GGUF_F32 && et != LM_GGUF_F64))
            return fail(lm_error(LM_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores has %llu %s values for %u tokens",
                                 (unsigned long long)n, lm_gguf_type_name(et), d.n_tokens),
                        tokens, 0, 0, 0);
        scores = malloc(n * sizeof *scores);
        if (!scores) return fail(lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory"), tokens, 0, 0, 0);
        for (uint64_t i = 0; i < n; i++) {
            if (et == LM_GGUF_F32) {
                memcpy(&scores[i], (const char *)data + 4 * i, 4);
            } else {
                double x;
                memcpy(&x, (const char *)data + 8 * i, 8);
                scores[i] = (float)x;
            }
        }
        d.scores = scores;
    }
    if (lm_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data) == LM_OK) {
        if (n != d.n_tokens || (et != LM_GGUF_I32 && et != LM_GGUF_U32))
            return fail(lm_error(LM_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type has %llu %s values for %u tokens",
                                 (unsigned long long)n, lm_gguf_type_name(et), d.n_tokens),
                        tokens, scores, 0, 0);
        types = malloc(n * sizeof *types);
        if (!types) return fail(lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory"), tokens, scores, 0, 0);
        memcpy(types, data, n * 4);
        d.types = types;
    }
    if (lm_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &data) == LM_OK) {
        if (et != LM_GGUF_STRING || n > LM_VOCAB_MAX_MERGES)
            return fail(lm_error(LM_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges is not a list of strings"),
                        tokens, scores, types, 0);
        if (n) {
            merges = malloc(n * sizeof *merges);
            if (!merges)
                return fail(lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory"), tokens, scores, types, 0);
            for (uint64_t i = 0; i < n; i++) {
                if (lm_gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &merges[i].ptr, &merges[i].len) != LM_OK)
                    return fail(lm_error(LM_ERR_FORMAT, "tokenizer: merge %llu unreadable", (unsigned long long)i),
                                tokens, scores, types, merges);
            }
        }
        d.n_merges = (uint32_t)n;
        d.merges = merges;
    }
    const char *s;
    size_t sl;
    if (lm_gguf_get_str(g, "tokenizer.ggml.pre", &s, &sl) == LM_OK) d.pre = (lm_strview){s, sl};
    if (lm_gguf_get_str(g, "general.name", &s, &sl) == LM_OK) d.name = (lm_strview){s, sl};

    d.bos_id = get_id(g, "tokenizer.ggml.bos_token_id");
    d.eos_id = get_id(g, "tokenizer.ggml.eos_token_id");
    d.unk_id = get_id(g, "tokenizer.ggml.unknown_token_id");
    d.sep_id = get_id(g, "tokenizer.ggml.seperator_token_id");
    d.pad_id = get_id(g, "tokenizer.ggml.padding_token_id");
    d.eot_id = get_id(g, "tokenizer.ggml.eot_token_id");
    d.eom_id = get_id(g, "tokenizer.ggml.eom_token_id");
    d.add_bos = get_flag(g, "tokenizer.ggml.add_bos_token");
    d.add_eos = get_flag(g, "tokenizer.ggml.add_eos_token");
    d.add_sep = get_flag(g, "tokenizer.ggml.add_sep_token");
    d.add_space_prefix = get_flag(g, "tokenizer.ggml.add_space_prefix");

    lm_status st = lm_tokenizer_create(&d, out);
    return fail(st, tokens, scores, types, merges);
}
