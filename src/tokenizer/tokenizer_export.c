/* tokenizer.json / tokenizer_config.json from a built vocabulary (contract in
 * tokenizer_export.h). The large parts (vocab, merges, added tokens) are written by
 * hand into one buffer; the small objects (normalizer, pre-tokenizer, decoder,
 * post-processor) are built with cJSON and printed into it. */
#include "tokenizer/tokenizer_export.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 */

/* The tokenizer.json spellings (Oniguruma, as Hugging Face writes them) of the
 * pre-tokenizer patterns Lumen knows by another spelling; lm_pretok_known_pattern says
 * which of ours each one is. */
static const char *const k_hf_patterns[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
enum { HF_PATTERN_GPT2 = 0 };

/* ---- output buffer ---------------------------------------------------------------- */

typedef struct out {
    lm_bytes b;
    bool oom;
} out;

static void put(out *o, const char *s, size_t n) {
    if (!o->oom && !lm_bytes_append(&o->b, s, n)) o->oom = true;
}

static void puts_(out *o, const char *s) { put(o, s, strlen(s)); }

static void putf(out *o, const char *fmt, long long v) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, fmt, v);
    put(o, buf, (size_t)n);
}

/* s[0..n) as a JSON string (valid UTF-8 checked by the caller). */
static void put_str(out *o, const char *s, size_t n) {
    put(o, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(o, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': put(o, "\\\"", 2); break;
        case '\\': put(o, "\\\\", 2); break;
        case '\n': put(o, "\\n", 2); break;
        case '\r': put(o, "\\r", 2); break;
        case '\t': put(o, "\\t", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(o, esc, 6);
        }
    }
    put(o, s + run, n - run);
    put(o, "\"", 1);
}

static void put_json(out *o, cJSON *j) {
    if (!j) {
        o->oom = true;
        return;
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) {
        o->oom = true;
        return;
    }
    puts_(o, s);
    free(s);
}

static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                                                            : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (k == 0 || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        if (k == 3 && ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F))) return false;
        if (k == 4 && ((c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))) return false;
        i += k;
    }
    return true;
}

/* ---- which ids the files carry ---------------------------------------------------------- */

typedef struct exporter {
    const lm_vocab *v;
    bool *in_vocab; /* [n_tokens]: the id is model.vocab's entry for its text */
    lm_hf_tokenizer_stats st;
} exporter;

static const char *text_of(const exporter *E, int32_t id, size_t *len) {
    *len = E->v->tok[id].len;
    return lm_vocab_tok_text(E->v, id);
}

/* The vocab id a text resolves to in the written files, LM_TOKEN_NULL if none. */
static int32_t vocab_id(const exporter *E, const char *s, size_t n) {
    int32_t id = lm_vocab_find(E->v, s, n);
    return id != LM_TOKEN_NULL && E->in_vocab[id] ? id : LM_TOKEN_NULL;
}

static lm_status plan_vocab(exporter *E) {
    const lm_vocab *v = E->v;
    E->in_vocab = calloc(v->n_tokens, sizeof *E->in_vocab);
    if (!E->in_vocab) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        size_t n;
        const char *s = text_of(E, (int32_t)i, &n);
        if (!utf8_valid(s, n))
            return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: token %u is not valid UTF-8, which tokenizer.json cannot hold",
                            i);
        if (v->tok[i].attr & LM_TOKEN_ATTR_UNUSED) E->st.n_unused++;
        if (n == 0 || lm_vocab_find(v, s, n) != (int32_t)i) {
            E->st.n_duplicates++;
            continue;
        }
        E->in_vocab[i] = true;
        E->st.n_vocab++;
    }
    return LM_OK;
}

static bool is_added(const lm_vocab *v, uint32_t id) {
    uint32_t a = v->tok[id].attr;
    /* what the source matches in text ("<unused0>" is control as well as unused) */
    return (a & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_UNKNOWN | LM_TOKEN_ATTR_USER_DEFINED)) != 0;
}

static bool is_special(const lm_vocab *v, uint32_t id) {
    return (v->tok[id].attr & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_UNKNOWN)) != 0;
}

/* One AddedToken's fields after "id" (tokenizer.json) or as the whole value
 * (added_tokens_decoder). */
static void put_added_fields(const exporter *E, out *o, uint32_t id) {
    size_t n;
    const char *s = text_of(E, (int32_t)id, &n);
    uint32_t a = E->v->tok[id].attr;
    puts_(o, "\"content\": ");
    put_str(o, s, n);
    puts_(o, ", \"single_word\": false, \"lstrip\": ");
    puts_(o, a & LM_TOKEN_ATTR_LSTRIP ? "true" : "false");
    puts_(o, ", \"rstrip\": ");
    puts_(o, a & LM_TOKEN_ATTR_RSTRIP ? "true" : "false");
    /* matched in the raw text, as llama.cpp matches them */
    puts_(o, ", \"normalized\": false, \"special\": ");
    puts_(o, is_special(E->v, id) ? "true" : "false");
}

/* ---- small objects -------------------------------------------------------------------- */

static const char *norm_name(lm_norm_kind k) {
    switch (k) {
    case LM_NORM_NFC: return "NFC";
    case LM_NORM_NFD: return "NFD";
    case LM_NORM_NFKC: return "NFKC";
    case LM_NORM_NFKD: return "NFKD";
    case LM_NORM_NONE: break;
    }
    return NULL;
}

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *replace_obj(const char *from, const char *to) {
    cJSON *r = typed("Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", from);
    cJSON_AddStringToObject(r, "content", to);
    return r;
}

static cJSON *byte_level(bool use_regex) {
    cJSON *b = typed("ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", false);
    cJSON_AddBoolToObject(b, "trim_offsets", true);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

/* One step, or a Sequence of several under `key`; NULL (JSON null) for none. */
static cJSON *seq_or_one(cJSON **steps, int n, const char *key) {
    if (n == 0) return cJSON_CreateNull();
    if (n == 1) return steps[0];
    cJSON *s = typed("Sequence");
    cJSON *list = cJSON_AddArrayToObject(s, key);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(list, steps[i]);
    return s;
}

static cJSON *normalizer(const lm_vocab *v) {
    cJSON *steps[2];
    int n = 0;
    const char *nf = norm_name(v->normalizer);
    if (nf) steps[n++] = typed(nf);
    if (v->model == LM_VOCAB_SPM && !v->add_space_prefix) steps[n++] = replace_obj(" ", SPM_SPACE);
    return seq_or_one(steps, n, "normalizers");
}

/* The HF spelling of one of our regexes (ours verbatim when no other is known). */
static const char *hf_regex(const char *ours, bool *is_gpt2) {
    *is_gpt2 = false;
    for (size_t i = 0; i < sizeof k_hf_patterns / sizeof k_hf_patterns[0]; i++) {
        const char *known = lm_pretok_known_pattern(k_hf_patterns[i], strlen(k_hf_patterns[i]));
        if (known && strcmp(known, ours) == 0) {
            *is_gpt2 = i == HF_PATTERN_GPT2;
            return k_hf_patterns[i];
        }
    }
    return ours;
}

static lm_status pre_tokenizer(const lm_vocab *v, cJSON **outj) {
    *outj = NULL;
    if (v->model == LM_VOCAB_SPM) {
        if (!v->add_space_prefix) {
            *outj = cJSON_CreateNull();
            return LM_OK;
        }
        cJSON *m = typed("Metaspace");
        cJSON_AddStringToObject(m, "replacement", SPM_SPACE);
        cJSON_AddStringToObject(m, "prepend_scheme", "first");
        cJSON_AddBoolToObject(m, "split", false);
        *outj = m;
        return LM_OK;
    }
    if (v->pre == LM_PRE_CUSTOM)
        return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: a custom pre-tokenizer cannot be written to tokenizer.json");
    const char *re[LM_PRE_MAX_REGEX];
    int n = lm_pretok_kind_regexes(v->pre, re);
    cJSON *steps[LM_PRE_MAX_REGEX + 1];
    int k = 0;
    bool regex_in_byte_level = false;
    for (int i = 0; i < n; i++) {
        bool gpt2;
        const char *hf = hf_regex(re[i], &gpt2);
        if (strcmp(re[i], "\\p{N}") == 0 || strcmp(re[i], "\\p{N}+") == 0) {
            cJSON *d = typed("Digits");
            cJSON_AddBoolToObject(d, "individual_digits", re[i][5] == '\0');
            steps[k++] = d;
        } else if (gpt2 && i == n - 1) {
            /* the GPT-2 pattern last: ByteLevel's own regex, as Hugging Face writes it */
            steps[k++] = byte_level(true);
            regex_in_byte_level = true;
        } else {
            cJSON *s = typed("Split");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(s, "pattern"), "Regex", hf);
            cJSON_AddStringToObject(s, "behavior", "Isolated");
            cJSON_AddBoolToObject(s, "invert", false);
            steps[k++] = s;
        }
    }
    if (!regex_in_byte_level) steps[k++] = byte_level(false);
    *outj = seq_or_one(steps, k, "pretokenizers");
    return LM_OK;
}

static cJSON *decoder(const lm_vocab *v) {
    if (v->model == LM_VOCAB_BPE) {
        cJSON *b = typed("ByteLevel");
        cJSON_AddBoolToObject(b, "add_prefix_space", true);
        cJSON_AddBoolToObject(b, "trim_offsets", true);
        cJSON_AddBoolToObject(b, "use_regex", true);
        return b;
    }
    cJSON *steps[4];
    int n = 0;
    steps[n++] = replace_obj(SPM_SPACE, " ");
    steps[n++] = typed("ByteFallback");
    steps[n++] = typed("Fuse");
    if (v->add_space_prefix) {
        cJSON *s = typed("Strip");
        cJSON_AddStringToObject(s, "content", " ");
        cJSON_AddNumberToObject(s, "start", 1);
        cJSON_AddNumberToObject(s, "stop", 0);
        steps[n++] = s;
    }
    return seq_or_one(steps, n, "decoders");
}

static void add_piece(cJSON *list, const char *kind, const char *id, int type_id) {
    cJSON *item = cJSON_CreateObject();
    cJSON *x = cJSON_AddObjectToObject(item, kind);
    cJSON_AddStringToObject(x, "id", id);
    cJSON_AddNumberToObject(x, "type_id", type_id);
    cJSON_AddItemToArray(list, item);
}

static void add_special_entry(cJSON *map, const char *text, int32_t id) {
    if (cJSON_GetObjectItemCaseSensitive(map, text)) return;
    cJSON *e = cJSON_AddObjectToObject(map, text);
    cJSON_AddStringToObject(e, "id", text);
    cJSON *ids = cJSON_AddArrayToObject(e, "ids");
    cJSON_AddItemToArray(ids, cJSON_CreateNumber(id));
    cJSON *toks = cJSON_AddArrayToObject(e, "tokens");
    cJSON_AddItemToArray(toks, cJSON_CreateString(text));
}

/* NUL-terminated copy of a token's text (token texts are not terminated in the arena). */
static char *dup_text(const exporter *E, int32_t id) {
    size_t n;
    const char *s = text_of(E, id, &n);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static cJSON *post_processor(const exporter *E) {
    const lm_vocab *v = E->v;
    bool bos = v->add_bos && v->bos >= 0, eos = v->add_eos && v->eos >= 0;
    if (!bos && !eos) {
        if (v->model != LM_VOCAB_BPE) return cJSON_CreateNull();
        cJSON *b = typed("ByteLevel");
        cJSON_AddBoolToObject(b, "add_prefix_space", true);
        cJSON_AddBoolToObject(b, "trim_offsets", false);
        cJSON_AddBoolToObject(b, "use_regex", true);
        return b;
    }
    char *bt = bos ? dup_text(E, v->bos) : NULL, *et = eos ? dup_text(E, v->eos) : NULL;
    if ((bos && !bt) || (eos && !et)) {
        free(bt), free(et);
        return NULL;
    }
    cJSON *t = typed("TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(t, "single"), *pair = cJSON_AddArrayToObject(t, "pair");
    if (bos) add_piece(single, "SpecialToken", bt, 0);
    add_piece(single, "Sequence", "A", 0);
    if (eos) add_piece(single, "SpecialToken", et, 0);
    for (int part = 0; part < 2; part++) {
        if (bos) add_piece(pair, "SpecialToken", bt, part);
        add_piece(pair, "Sequence", part ? "B" : "A", part);
        if (eos) add_piece(pair, "SpecialToken", et, part);
    }
    cJSON *map = cJSON_AddObjectToObject(t, "special_tokens");
    if (bos) add_special_entry(map, bt, v->bos);
    if (eos) add_special_entry(map, et, v->eos);
    free(bt), free(et);
    return t;
}

/* ---- merges ----------------------------------------------------------------------------- */

static void put_merge(exporter *E, out *o, const char *a, size_t na, const char *b, size_t nb) {
    puts_(o, E->st.n_merges ? ",\n[" : "\n[");
    put_str(o, a, na);
    put(o, ",", 1);
    put_str(o, b, nb);
    put(o, "]", 1);
    E->st.n_merges++;
}

/* byte-level BPE: the vocabulary's own merges, in rank order */
static void bpe_merges(exporter *E, out *o) {
    const lm_vocab *v = E->v;
    lm_bytes joined = {0};
    for (uint32_t i = 0; i < v->n_merges && !o->oom; i++) {
        const char *m = v->merge_text + v->merge_off[i];
        size_t len = v->merge_len[i], na = v->merge_split[i];
        const char *a = m, *b = m + na + 1;
        size_t nb = len - na - 1;
        joined.n = 0;
        if (!lm_bytes_append(&joined, a, na) || !lm_bytes_append(&joined, b, nb)) {
            o->oom = true;
            break;
        }
        /* tokenizers refuses a merge whose parts or result are not in the vocabulary */
        if (vocab_id(E, a, na) == LM_TOKEN_NULL || vocab_id(E, b, nb) == LM_TOKEN_NULL ||
            vocab_id(E, joined.p, joined.n) == LM_TOKEN_NULL) {
            E->st.n_dropped_merges++;
            continue;
        }
        put_merge(E, o, a, na, b, nb);
    }
    free(joined.p);
}

typedef struct ranked {
    float score;
    int32_t id;
} ranked;

static int by_score(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* SentencePiece-style: the score merger joins two adjacent symbols when their
 * concatenation is a token, best score first; a BPE whose merges are every split of
 * every token into two tokens, ranked by the token's score, makes the same choices. */
static lm_status spm_merges(exporter *E, out *o) {
    const lm_vocab *v = E->v;
    ranked *order = malloc((size_t)v->n_tokens * sizeof *order);
    if (!order) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (E->in_vocab[i] && v->tok[i].len >= 2) order[n++] = (ranked){v->tok[i].score, (int32_t)i};
    qsort(order, n, sizeof *order, by_score);
    for (uint32_t k = 0; k < n && !o->oom; k++) {
        size_t len;
        const char *s = text_of(E, order[k].id, &len);
        for (size_t cut = lm_utf8_char_len(s, len); cut < len; cut += lm_utf8_char_len(s + cut, len - cut)) {
            if (vocab_id(E, s, cut) == LM_TOKEN_NULL || vocab_id(E, s + cut, len - cut) == LM_TOKEN_NULL) continue;
            put_merge(E, o, s, cut, s + cut, len - cut);
        }
    }
    free(order);
    return LM_OK;
}

/* ---- the files -------------------------------------------------------------------------- */

static lm_status write_tokenizer_json(exporter *E, out *o) {
    const lm_vocab *v = E->v;
    puts_(o, "{\n\"version\": \"1.0\",\n\"truncation\": null,\n\"padding\": null,\n\"added_tokens\": [");
    bool first = true;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!is_added(v, i)) continue;
        puts_(o, first ? "\n{\"id\": " : ",\n{\"id\": ");
        putf(o, "%lld, ", (long long)i);
        put_added_fields(E, o, i);
        puts_(o, "}");
        first = false;
        E->st.n_added++;
    }
    puts_(o, "\n],\n\"normalizer\": ");
    put_json(o, normalizer(v));
    puts_(o, ",\n\"pre_tokenizer\": ");
    cJSON *pre;
    lm_status st = pre_tokenizer(v, &pre);
    if (st) return st;
    put_json(o, pre);
    puts_(o, ",\n\"post_processor\": ");
    put_json(o, post_processor(E));
    puts_(o, ",\n\"decoder\": ");
    put_json(o, decoder(v));

    bool spm = v->model == LM_VOCAB_SPM;
    puts_(o, ",\n\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": ");
    if (spm && v->unk >= 0 && E->in_vocab[v->unk]) {
        size_t n;
        const char *s = text_of(E, v->unk, &n);
        put_str(o, s, n);
    } else {
        puts_(o, "null");
    }
    puts_(o, ", \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": ");
    puts_(o, spm ? "true" : "false");
    puts_(o, ", \"byte_fallback\": ");
    puts_(o, spm ? "true" : "false");
    puts_(o, ", \"ignore_merges\": ");
    puts_(o, v->ignore_merges ? "true" : "false");
    puts_(o, ",\n\"vocab\": {");
    first = true;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!E->in_vocab[i]) continue;
        size_t n;
        const char *s = text_of(E, (int32_t)i, &n);
        puts_(o, first ? "\n" : ",\n");
        put_str(o, s, n);
        putf(o, ": %lld", (long long)i);
        first = false;
    }
    puts_(o, "\n},\n\"merges\": [");
    if (spm) {
        if ((st = spm_merges(E, o))) return st;
    } else {
        bpe_merges(E, o);
    }
    puts_(o, "\n]\n}\n}\n");
    return LM_OK;
}

static void add_token_or_null(const exporter *E, cJSON *c, const char *key, int32_t id) {
    if (id < 0 || (uint32_t)id >= E->v->n_tokens) {
        cJSON_AddNullToObject(c, key);
        return;
    }
    char *s = dup_text(E, id);
    if (s) cJSON_AddStringToObject(c, key, s);
    free(s);
}

static lm_status write_tokenizer_config(const exporter *E, const char *chat_template, int64_t max_len, char **text) {
    const lm_vocab *v = E->v;
    cJSON *c = cJSON_CreateObject();
    if (!c) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    /* the plain fast tokenizer: transformers uses tokenizer.json as it is */
    cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
    add_token_or_null(E, c, "bos_token", v->bos);
    add_token_or_null(E, c, "eos_token", v->eos);
    add_token_or_null(E, c, "unk_token", v->unk);
    add_token_or_null(E, c, "pad_token", v->pad);
    cJSON_AddBoolToObject(c, "add_bos_token", v->add_bos);
    cJSON_AddBoolToObject(c, "add_eos_token", v->add_eos);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", v->clean_spaces);
    if (max_len > 0) cJSON_AddNumberToObject(c, "model_max_length", (double)max_len);
    if (chat_template) cJSON_AddStringToObject(c, "chat_template", chat_template);
    cJSON *dec = cJSON_AddObjectToObject(c, "added_tokens_decoder");
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!is_added(v, i)) continue;
        char key[16];
        snprintf(key, sizeof key, "%u", i);
        cJSON *e = cJSON_AddObjectToObject(dec, key);
        char *s = dup_text(E, (int32_t)i);
        if (s) cJSON_AddStringToObject(e, "content", s);
        free(s);
        uint32_t a = v->tok[i].attr;
        cJSON_AddBoolToObject(e, "single_word", false);
        cJSON_AddBoolToObject(e, "lstrip", (a & LM_TOKEN_ATTR_LSTRIP) != 0);
        cJSON_AddBoolToObject(e, "rstrip", (a & LM_TOKEN_ATTR_RSTRIP) != 0);
        cJSON_AddBoolToObject(e, "normalized", false);
        cJSON_AddBoolToObject(e, "special", is_special(v, i));
    }
    *text = cJSON_Print(c);
    cJSON_Delete(c);
    return *text ? LM_OK : lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
}

lm_status lm_tokenizer_export_hf(const lm_tokenizer *tok, const char *chat_template, int64_t model_max_length,
                                 char **tokenizer_json, size_t *tokenizer_json_len, char **tokenizer_config_json,
                                 lm_hf_tokenizer_stats *stats) {
    if (!tok || !tokenizer_json || !tokenizer_config_json)
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *tokenizer_json = *tokenizer_config_json = NULL;
    if (tokenizer_json_len) *tokenizer_json_len = 0;
    exporter E = {.v = lm_tokenizer_vocab(tok)};
    out o = {0};
    lm_status st = plan_vocab(&E);
    if (!st) st = write_tokenizer_json(&E, &o);
    if (!st && o.oom) st = lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory writing tokenizer.json");
    if (!st) st = write_tokenizer_config(&E, chat_template, model_max_length, tokenizer_config_json);
    free(E.in_vocab);
    if (st) {
        free(o.b.p);
        return st;
    }
    *tokenizer_json = o.b.p;
    if (tokenizer_json_len) *tokenizer_json_len = o.b.n;
    if (stats) *stats = E.st;
    return LM_OK;
}

size_t lm_tokenizer_eog_ids(const lm_tokenizer *tok, int32_t *ids, size_t cap) {
    const lm_vocab *v = lm_tokenizer_vocab(tok);
    size_t n = 0;
    if (v->eos >= 0) {
        if (n < cap) ids[n] = v->eos;
        n++;
    }
    for (size_t i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == v->eos) continue;
        if (n < cap) ids[n] = v->eog[i];
        n++;
    }
    return n;
}
