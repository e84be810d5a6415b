/* Hugging Face tokenizer folders: tokenizer.json (+ tokenizer_config.json,
 * generation_config.json) -> an lm_vocab_desc -> the same lm_tokenizer as from GGUF.
 *
 * What a tokenizer.json can say and what it becomes here:
 *   model BPE + ByteLevel (pre-tokenizer or decoder)        -> LM_VOCAB_BPE (byte-level)
 *   model BPE + Replace(" ", U+2581) / Prepend / Metaspace  -> LM_VOCAB_SPM, merging by
 *       pair rank (spm_merges), byte fallback to <0xNN> tokens
 *   pre_tokenizer Sequence / Split (regex or string, "Isolated") / Digits / ByteLevel
 *       -> a list of regexes, named as a known kind when equal to one (pretok.c)
 *   normalizer NFC/NFD/NFKC/NFKD (alone or in a Sequence with the SPM ones)
 *   added_tokens -> control (special, or looking like "<|...|>") or user-defined tokens
 * Everything else (WordPiece, Unigram, WordLevel, other normalizers and pre-tokenizers,
 * Split behaviours other than Isolated, ...) is LM_ERR_UNSUPPORTED naming the part.
 *
 * The input is hostile: sizes are limited, ids are range-checked, and every field is
 * type-checked before use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define HF_MAX_TOKENIZER_JSON ((size_t)1 << 30) /* 1 GiB */
#define HF_MAX_CONFIG_JSON ((size_t)64 << 20)
#define HF_MAX_TEMPLATE ((size_t)16 << 20)

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 */

/* ---- reading files ---- */

static lm_status read_file(const char *path, size_t limit, bool optional, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT) return LM_ERR_NOT_FOUND;
        return lm_error(errno == ENOENT ? LM_ERR_NOT_FOUND : LM_ERR_IO, "tokenizer: cannot open %s: %s",
                        path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return lm_error(LM_ERR_IO, "tokenizer: %s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > limit) {
        fclose(f);
        return lm_error(LM_ERR_LIMIT, "tokenizer: %s is %lld bytes (limit %zu)", path,
                        (long long)st.st_size, limit);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory reading %s", path);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return lm_error(LM_ERR_IO, "tokenizer: short read on %s", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return LM_OK;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* ---- the conversion state ---- */

typedef struct hf_ctx {
    const char *where;
    lm_vocab_desc d;
    uint32_t n;             /* tokens (max id + 1) */
    lm_strview *tokens;     /* [n] */
    int32_t *types;         /* [n] */
    uint32_t *attr;         /* [n] extra LSTRIP/RSTRIP */
    lm_strview *merges;
    uint32_t *merge_split;  /* [n_merges] length of the left part */
    char *merge_arena;      /* joined "left right" texts of array-form merges */
    lm_strview regex[LM_PRE_MAX_REGEX];
    uint32_t n_regex;
    char *regex_arena[LM_PRE_MAX_REGEX]; /* owned regex strings (escaped literals) */
    int32_t eog[64];
    uint32_t n_eog;
    bool byte_level;        /* ByteLevel seen */
    bool spm_replace;       /* Replace(" ", U+2581) or Metaspace seen */
    int spm_prefix;         /* Prepend / Metaspace prepend scheme: -1 unknown, 0, 1 */
    lm_norm_kind norm;
} hf_ctx;

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static bool get_bool(const cJSON *o, const char *key, bool def) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(b)) return cJSON_IsTrue(b);
    return def;
}

static bool str_is(const cJSON *s, const char *v) {
    return cJSON_IsString(s) && strcmp(s->valuestring, v) == 0;
}

/* A JSON number that is an exact id in [0, limit). */
static bool get_id(const cJSON *x, uint32_t limit, uint32_t *id) {
    if (!cJSON_IsNumber(x)) return false;
    double v = x->valuedouble;
    if (!(v >= 0 && v < (double)limit) || v != (double)(uint32_t)v) return false;
    *id = (uint32_t)v;
    return true;
}

static lm_status unsupported(const hf_ctx *c, const char *what, const char *name) {
    return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: %s: %s '%.64s' is not supported", c->where, what,
                    name ? name : "(no type)");
}

static lm_status bad(const hf_ctx *c, const char *what) {
    return lm_error(LM_ERR_FORMAT, "tokenizer: %s: %s", c->where, what);
}

/* ---- normalizer ---- */

static lm_status set_norm(hf_ctx *c, lm_norm_kind k) {
    if (c->norm != LM_NORM_NONE && c->norm != k)
        return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: %s: two different Unicode normalizations", c->where);
    c->norm = k;
    return LM_OK;
}

static lm_status parse_normalizer(hf_ctx *c, const cJSON *n, int depth) {
    if (!n || cJSON_IsNull(n)) return LM_OK;
    if (!cJSON_IsObject(n) || depth > 8) return bad(c, "normalizer is not an object");
    const char *t = type_of(n);
    if (!t) return unsupported(c, "normalizer", NULL);
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return bad(c, "normalizer Sequence without a list");
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            lm_status st = parse_normalizer(c, x, depth + 1);
            if (st) return st;
        }
        return LM_OK;
    }
    if (strcmp(t, "NFC") == 0) return set_norm(c, LM_NORM_NFC);
    if (strcmp(t, "NFD") == 0) return set_norm(c, LM_NORM_NFD);
    if (strcmp(t, "NFKC") == 0) return set_norm(c, LM_NORM_NFKC);
    if (strcmp(t, "NFKD") == 0) return set_norm(c, LM_NORM_NFKD);
    if (strcmp(t, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (str_is(s, " ") && str_is(content, SPM_SPACE)) {
            c->spm_replace = true;
            return LM_OK;
        }
        return unsupported(c, "normalizer Replace with pattern/content other than \" \" -> U+2581",
                           cJSON_IsString(s) ? s->valuestring : "(regex)");
    }
    if (strcmp(t, "Prepend") == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(n, "prepend");
        if (!str_is(p, SPM_SPACE))
            return unsupported(c, "normalizer Prepend of", cJSON_IsString(p) ? p->valuestring : "?");
        c->spm_prefix = 1;
        return LM_OK;
    }
    return unsupported(c, "normalizer", t);
}

/* ---- pre-tokenizer ---- */

static lm_status add_regex(hf_ctx *c, const char *re, size_t len, char *owned) {
    if (c->n_regex >= LM_PRE_MAX_REGEX) {
        free(owned);
        return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: %s: more than %d pre-tokenizer splits",
                        c->where, LM_PRE_MAX_REGEX);
    }
    c->regex_arena[c->n_regex] = owned;
    c->regex[c->n_regex++] = (lm_strview){re, len};
    return LM_OK;
}

/* A literal string as a PCRE2 pattern: \Q...\E, with any \E inside broken up. */
static char *quote_literal(const char *s, size_t n, size_t *out_len) {
    char *q = malloc(n * 6 + 8);
    if (!q) return NULL;
    size_t k = 0;
    memcpy(q + k, "\\Q", 2), k += 2;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] == 'E') {
            memcpy(q + k, "\\E\\\\\\Q", 7), k += 7; /* end quote, escaped backslash, requote */
            continue;
        }
        q[k++] = s[i];
    }
    memcpy(q + k, "\\E", 2), k += 2;
    q[k] = '\0';
    *out_len = k;
    return q;
}

static lm_status parse_pretok(hf_ctx *c, const cJSON *p, int depth) {
    if (!p || cJSON_IsNull(p)) return LM_OK;
    if (!cJSON_IsObject(p) || depth > 8) return bad(c, "pre_tokenizer is not an object");
    const char *t = type_of(p);
    if (!t) return unsupported(c, "pre-tokenizer", NULL);
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return bad(c, "pre-tokenizer Sequence without a list");
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            lm_status st = parse_pretok(c, x, depth + 1);
            if (st) return st;
        }
        return LM_OK;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        if (get_bool(p, "add_prefix_space", false))
            return unsupported(c, "pre-tokenizer ByteLevel option", "add_prefix_space: true");
        c->byte_level = true;
        if (get_bool(p, "use_regex", true)) {
            static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            const char *re = lm_pretok_known_pattern(gpt2, sizeof gpt2 - 1);
            if (!re) return lm_error(LM_ERR_INTERNAL, "tokenizer: GPT-2 pattern missing");
            return add_regex(c, re, strlen(re), NULL);
        }
        return LM_OK;
    }
    if (strcmp(t, "Digits") == 0) {
        const char *re = get_bool(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+";
        return add_regex(c, re, strlen(re), NULL);
    }
    if (strcmp(t, "Split") == 0) {
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        /* Gemma's files split on " " after a normalizer that left no space: a no-op */
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "String");
        if (c->spm_replace && c->n_regex == 0 && str_is(sp, " ")) return LM_OK;
        if (!str_is(beh, "Isolated"))
            return unsupported(c, "pre-tokenizer Split behavior", cJSON_IsString(beh) ? beh->valuestring : "?");
        if (get_bool(p, "invert", false)) return unsupported(c, "pre-tokenizer Split option", "invert: true");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (cJSON_IsString(re)) {
            size_t len = strlen(re->valuestring);
            const char *known = lm_pretok_known_pattern(re->valuestring, len);
            if (known) return add_regex(c, known, strlen(known), NULL);
            char *own = malloc(len + 1);
            if (!own) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
            memcpy(own, re->valuestring, len + 1);
            return add_regex(c, own, len, own);
        }
        if (cJSON_IsString(lit) && lit->valuestring[0]) {
            size_t ql;
            char *q = quote_literal(lit->valuestring, strlen(lit->valuestring), &ql);
            if (!q) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
            return add_regex(c, q, ql, q);
        }
        return bad(c, "pre-tokenizer Split without a pattern");
    }
    if (strcmp(t, "Metaspace") == 0) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "replacement");
        if (r && !str_is(r, SPM_SPACE))
            return unsupported(c, "pre-tokenizer Metaspace replacement", cJSON_IsString(r) ? r->valuestring : "?");
        if (get_bool(p, "split", false)) return unsupported(c, "pre-tokenizer Metaspace option", "split: true");
        c->spm_replace = true;
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
        if (cJSON_IsString(scheme))
            c->spm_prefix = strcmp(scheme->valuestring, "never") != 0;
        else
            c->spm_prefix = get_bool(p, "add_prefix_space", true);
        return LM_OK;
    }
    return unsupported(c, "pre-tokenizer", t);
}

/* ---- vocabulary ---- */

static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (strcmp(s, "<pad>") == 0 || strcmp(s, "<mask>") == 0 || strcmp(s, "<2mass>") == 0 ||
        strcmp(s, "[@BOS@]") == 0)
        return true;
    if (n >= 4 && memcmp(s, "<|", 2) == 0 && memcmp(s + n - 2, "|>", 2) == 0) return true;
    /* "<" U+FF5C ... U+FF5C ">" (DeepSeek) */
    if (n >= 8 && memcmp(s, "<\xef\xbd\x9c", 4) == 0 && memcmp(s + n - 4, "\xef\xbd\x9c>", 4) == 0) return true;
    if (strncmp(s, "<start_of_", 10) == 0 || strncmp(s, "<end_of_", 8) == 0) return true;
    return false;
}

static bool is_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    for (int i = 3; i < 5; i++) {
        char h = s[i];
        if (!((h >= '0' && h <= '9') || (h >= 'A' && h <= 'F') || (h >= 'a' && h <= 'f'))) return false;
    }
    return true;
}

/* The id of an AddedToken-ish value (a string, or {"content": ...}), LM_TOKEN_NULL if
 * absent or unknown. */
static int32_t token_id_of(const hf_ctx *c, const cJSON *x) {
    const char *s = NULL;
    if (cJSON_IsString(x)) s = x->valuestring;
    else if (cJSON_IsObject(x)) {
        const cJSON *cont = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (cJSON_IsString(cont)) s = cont->valuestring;
    }
    if (!s) return LM_TOKEN_NULL;
    size_t n = strlen(s);
    /* added tokens win over model tokens of the same text: search from the top */
    for (uint32_t i = c->n; i-- > 0;) {
        if (c->types[i] == LM_TOKTYPE_CONTROL || c->types[i] == LM_TOKTYPE_USER_DEFINED) {
            if (c->tokens[i].len == n && memcmp(c->tokens[i].ptr, s, n) == 0) return (int32_t)i;
        }
    }
    for (uint32_t i = 0; i < c->n; i++)
        if (c->tokens[i].len == n && c->tokens[i].ptr && memcmp(c->tokens[i].ptr, s, n) == 0) return (int32_t)i;
    return LM_TOKEN_NULL;
}

/* One added token: {"id", "content", "special", "lstrip", "rstrip", ...}. */
static lm_status add_token(hf_ctx *c, uint32_t id, const cJSON *t) {
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(t, "content");
    if (!cJSON_IsString(content)) return bad(c, "an added token has no content");
    if (id >= c->n) return bad(c, "an added token id is out of range");
    c->tokens[id] = (lm_strview){content->valuestring, strlen(content->valuestring)};
    bool special = get_bool(t, "special", false);
    c->types[id] = special || looks_special(content->valuestring) ? LM_TOKTYPE_CONTROL : LM_TOKTYPE_USER_DEFINED;
    c->attr[id] = (get_bool(t, "lstrip", false) ? LM_TOKEN_ATTR_LSTRIP : 0) |
                  (get_bool(t, "rstrip", false) ? LM_TOKEN_ATTR_RSTRIP : 0);
    return LM_OK;
}

static lm_status parse_merges(hf_ctx *c, const cJSON *merges) {
    if (!merges || cJSON_IsNull(merges)) return LM_OK;
    if (!cJSON_IsArray(merges)) return bad(c, "model.merges is not a list");
    int n = cJSON_GetArraySize(merges);
    if ((uint64_t)n > LM_VOCAB_MAX_MERGES)
        return lm_error(LM_ERR_LIMIT, "tokenizer: %s: %d merges (limit %u)", c->where, n, LM_VOCAB_MAX_MERGES);
    if (n == 0) return LM_OK;
    c->merges = malloc((size_t)n * sizeof *c->merges);
    c->merge_split = malloc((size_t)n * sizeof *c->merge_split);
    if (!c->merges || !c->merge_split) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    /* array-form merges ["a", "b"] are joined into one arena as "a b" */
    size_t arena = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsArray(m)) {
            const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
            if (cJSON_GetArraySize(m) != 2 || !cJSON_IsString(a) || !cJSON_IsString(b))
                return bad(c, "a merge is not a pair of strings");
            arena += strlen(a->valuestring) + strlen(b->valuestring) + 2;
        }
    }
    if (arena) {
        c->merge_arena = malloc(arena);
        if (!c->merge_arena) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    size_t off = 0;
    uint32_t k = 0;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring;
            size_t len = strlen(s);
            const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                return bad(c, "a merge is not two tokens separated by one space");
            c->merge_split[k] = (uint32_t)(sp - s);
            c->merges[k++] = (lm_strview){s, len};
        } else if (cJSON_IsArray(m)) {
            const char *a = cJSON_GetArrayItem(m, 0)->valuestring, *b = cJSON_GetArrayItem(m, 1)->valuestring;
            size_t la = strlen(a), lb = strlen(b);
            if (la == 0 || lb == 0) return bad(c, "a merge has an empty token");
            if (la > LM_VOCAB_MAX_TOKEN_LEN) return bad(c, "a merge part is too long");
            c->merge_split[k] = (uint32_t)la;
            char *dst = c->merge_arena + off;
            memcpy(dst, a, la);
            dst[la] = ' ';
            memcpy(dst + la + 1, b, lb);
            c->merges[k++] = (lm_strview){dst, la + 1 + lb};
            off += la + lb + 2;
        } else {
            return bad(c, "a merge is neither a string nor a pair");
        }
    }
    c->d.merges = c->merges;
    c->d.merge_split = c->merge_split;
    c->d.n_merges = k;
    return LM_OK;
}

static lm_status parse_vocab(hf_ctx *c, const cJSON *model, const cJSON *added, const cJSON *cfg_added) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return bad(c, "model.vocab is not an object");
    /* size: the largest id of the vocabulary and the added tokens, plus one */
    uint64_t count = 0, max_id = 0;
    bool any = false;
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        uint32_t id;
        if (!get_id(x, LM_VOCAB_MAX_TOKENS, &id)) return bad(c, "a model.vocab id is not an integer in range");
        if (!any || id > max_id) max_id = id;
        any = true;
        count++;
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(x, added) {
            uint32_t id;
            if (!get_id(cJSON_GetObjectItemCaseSensitive(x, "id"), LM_VOCAB_MAX_TOKENS, &id))
                return bad(c, "an added token id is not an integer in range");
            if (!any || id > max_id) max_id = id;
            any = true;
            count++;
        }
    } else if (added && !cJSON_IsNull(added)) {
        return bad(c, "added_tokens is not a list");
    }
    if (cJSON_IsObject(cfg_added)) {
        cJSON_ArrayForEach(x, cfg_added) {
            char *end;
            unsigned long id = strtoul(x->string ? x->string : "", &end, 10);
            if (!x->string || !x->string[0] || *end || id >= LM_VOCAB_MAX_TOKENS) continue;
            if (!any || id > max_id) max_id = id;
            any = true;
            count++;
        }
    }
    if (!any) return bad(c, "the vocabulary is empty");
    /* dense ids in practice; a few gaps (padding rows) are fine, a sparse table is not */
    if (max_id > 2 * count + 65536) return bad(c, "token ids are too sparse");
    c->n = (uint32_t)max_id + 1;
    c->tokens = calloc(c->n, sizeof *c->tokens);
    c->types = malloc(c->n * sizeof *c->types);
    c->attr = calloc(c->n, sizeof *c->attr);
    if (!c->tokens || !c->types || !c->attr) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    for (uint32_t i = 0; i < c->n; i++) c->types[i] = LM_TOKTYPE_UNUSED; /* gaps */
    cJSON_ArrayForEach(x, vocab) {
        uint32_t id = (uint32_t)x->valuedouble;
        if (c->tokens[id].ptr) return bad(c, "two model.vocab entries share an id");
        const char *s = x->string ? x->string : "";
        c->tokens[id] = (lm_strview){s, strlen(s)};
        c->types[id] = LM_TOKTYPE_NORMAL;
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    bool byte_fallback = get_bool(model, "byte_fallback", false);
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->types[i] != LM_TOKTYPE_NORMAL) continue;
        if (byte_fallback && is_byte_token(c->tokens[i].ptr, c->tokens[i].len)) c->types[i] = LM_TOKTYPE_BYTE;
        if (cJSON_IsString(unk) && strcmp(unk->valuestring, c->tokens[i].ptr) == 0) c->types[i] = LM_TOKTYPE_UNKNOWN;
    }
    /* tokenizer_config.json's added_tokens_decoder first, tokenizer.json's list wins */
    if (cJSON_IsObject(cfg_added)) {
        cJSON_ArrayForEach(x, cfg_added) {
            char *end;
            unsigned long id = strtoul(x->string ? x->string : "", &end, 10);
            if (!x->string || !x->string[0] || *end || id >= c->n || !cJSON_IsObject(x)) continue;
            lm_status st = add_token(c, (uint32_t)id, x);
            if (st) return st;
        }
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(x, added) {
            uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(x, "id")->valuedouble;
            lm_status st = add_token(c, id, x);
            if (st) return st;
        }
    }
    c->d.n_tokens = c->n;
    c->d.tokens = c->tokens;
    c->d.types = c->types;
    c->d.extra_attr = c->attr;
    return LM_OK;
}

/* ---- post-processor: does the model add BOS/EOS? ---- */

static void parse_post(hf_ctx *c, const cJSON *post, int *add_bos, int *add_eos, int32_t *bos, int32_t *eos) {
    if (!cJSON_IsObject(post)) return;
    const char *t = type_of(post);
    if (t && strcmp(t, "Sequence") == 0) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(post, "processors"))
            parse_post(c, x, add_bos, add_eos, bos, eos);
        return;
    }
    if (!t || strcmp(t, "TemplateProcessing") != 0) return;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(post, "single");
    int n = cJSON_GetArraySize(single);
    if (!cJSON_IsArray(single) || n == 0) return;
    const cJSON *first = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 0), "SpecialToken");
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, n - 1), "SpecialToken");
    *add_bos = first != NULL;
    *add_eos = n > 1 && last != NULL;
    if (first) *bos = token_id_of(c, cJSON_GetObjectItemCaseSensitive(first, "id"));
    if (last && n > 1) *eos = token_id_of(c, cJSON_GetObjectItemCaseSensitive(last, "id"));
}

static void hf_ctx_free(hf_ctx *c) {
    free(c->tokens);
    free(c->types);
    free(c->attr);
    free(c->merges);
    free(c->merge_split);
    free(c->merge_arena);
    for (uint32_t i = 0; i < c->n_regex; i++) free(c->regex_arena[i]);
}

static cJSON *parse_json(const char *text, size_t len, const char *what, const char *where, lm_status *st) {
    *st = LM_OK;
    if (!text) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *st = lm_error(LM_ERR_FORMAT, "tokenizer: %s: %s is not a JSON object", where, what);
        return NULL;
    }
    return j;
}

static void add_gen_eog(hf_ctx *c, const cJSON *x) {
    uint32_t id;
    if (get_id(x, c->n, &id) && c->n_eog < sizeof c->eog / sizeof c->eog[0]) c->eog[c->n_eog++] = (int32_t)id;
}

lm_status lm_tokenizer_from_hf_json(const char *tok_json, size_t tok_len, const char *cfg_json,
                                    size_t cfg_len, const char *gen_json, size_t gen_len,
                                    const char *where, lm_tokenizer **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: out is NULL");
    *out = NULL;
    if (!tok_json) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: no tokenizer.json text");
    if (!where) where = "tokenizer.json";
    hf_ctx c;
    memset(&c, 0, sizeof c);
    c.where = where;
    c.spm_prefix = -1;
    lm_status st;
    cJSON *root = parse_json(tok_json, tok_len, "tokenizer.json", where, &st);
    if (st) return st;
    cJSON *cfg = parse_json(cfg_json, cfg_len, "tokenizer_config.json", where, &st);
    cJSON *gen = NULL;
    if (!st) gen = parse_json(gen_json, gen_len, "generation_config.json", where, &st);
    if (st) goto done;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = bad(&c, "no \"model\" object");
        goto done;
    }
    const char *mt = type_of(model);
    if (!mt && cJSON_GetObjectItemCaseSensitive(model, "merges")) mt = "BPE"; /* old files omit it */
    if (!mt || strcmp(mt, "BPE") != 0) {
        st = unsupported(&c, "tokenizer model", mt);
        goto done;
    }
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *ew = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((cJSON_IsString(cs) && cs->valuestring[0]) || (cJSON_IsString(ew) && ew->valuestring[0])) {
        st = unsupported(&c, "BPE option", cJSON_IsString(cs) && cs->valuestring[0] ? "continuing_subword_prefix"
                                                                                    : "end_of_word_suffix");
        goto done;
    }

    if ((st = parse_normalizer(&c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0))) goto done;
    if ((st = parse_pretok(&c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), 0))) goto done;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dt = type_of(dec);
    if (dt && strcmp(dt, "ByteLevel") == 0) c.byte_level = true;

    bool byte_fallback = get_bool(model, "byte_fallback", false);
    if (c.byte_level && (c.spm_replace || byte_fallback)) {
        st = unsupported(&c, "mix of", "ByteLevel with byte_fallback or U+2581 spaces");
        goto done;
    }
    if (!c.byte_level && !c.spm_replace) {
        st = unsupported(&c, "BPE without a ByteLevel or SentencePiece-style (U+2581) space handling;", mt);
        goto done;
    }
    if (c.spm_replace && c.n_regex) {
        st = unsupported(&c, "pre-tokenizer splits with", "SentencePiece-style BPE");
        goto done;
    }
    lm_vocab_desc_init(&c.d, c.byte_level ? LM_VOCAB_BPE : LM_VOCAB_SPM);
    c.d.normalizer = c.norm;
    c.d.keep_types = true;

    if ((st = parse_vocab(&c, model, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"),
                          cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder"))))
        goto done;
    if ((st = parse_merges(&c, cJSON_GetObjectItemCaseSensitive(model, "merges")))) goto done;

    if (c.byte_level) {
        c.d.pre_explicit = true;
        c.d.n_pre_regex = c.n_regex;
        c.d.pre_regex = c.regex;
        c.d.ignore_merges = get_bool(model, "ignore_merges", false);
        if (c.d.n_merges == 0) {
            st = bad(&c, "a byte-level BPE model without merges");
            goto done;
        }
    } else {
        c.d.spm_merges = true;
        c.d.add_space_prefix = c.spm_prefix == 1;
        c.d.ignore_merges = get_bool(model, "ignore_merges", false);
    }

    /* special ids and flags: tokenizer_config.json, else the post-processor */
    int add_bos = 0, add_eos = 0;
    int32_t bos = LM_TOKEN_NULL, eos = LM_TOKEN_NULL;
    parse_post(&c, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &add_bos, &add_eos, &bos, &eos);
    if (cfg) {
        const cJSON *x;
        if ((x = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"))) bos = token_id_of(&c, x);
        if ((x = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"))) eos = token_id_of(&c, x);
        if (cJSON_IsBool(x = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"))) add_bos = cJSON_IsTrue(x);
        if (cJSON_IsBool(x = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token"))) add_eos = cJSON_IsTrue(x);
        c.d.unk_id = token_id_of(&c, cJSON_GetObjectItemCaseSensitive(cfg, "unk_token"));
        c.d.pad_id = token_id_of(&c, cJSON_GetObjectItemCaseSensitive(cfg, "pad_token"));
        if (cJSON_IsBool(x = cJSON_GetObjectItemCaseSensitive(cfg, "clean_up_tokenization_spaces")))
            c.d.clean_spaces = cJSON_IsTrue(x);
    }
    if (c.d.unk_id == LM_VOCAB_ID_DEFAULT || c.d.unk_id == LM_TOKEN_NULL)
        c.d.unk_id = token_id_of(&c, cJSON_GetObjectItemCaseSensitive(model, "unk_token"));
    if (c.d.pad_id == LM_VOCAB_ID_DEFAULT) c.d.pad_id = LM_TOKEN_NULL;
    c.d.bos_id = bos;
    c.d.eos_id = eos;
    c.d.add_bos = add_bos;
    c.d.add_eos = add_eos;
    c.d.add_sep = 0;
    if (gen) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"), *x;
        if (cJSON_IsArray(e)) {
            cJSON_ArrayForEach(x, e) add_gen_eog(&c, x);
        } else {
            add_gen_eog(&c, e);
        }
        if (c.d.eos_id == LM_TOKEN_NULL && c.n_eog) c.d.eos_id = c.eog[0];
        c.d.n_extra_eog = c.n_eog;
        c.d.extra_eog = c.eog;
    }
    st = lm_tokenizer_create(&c.d, out);
    if (st) lm_error_prefix(st, "%s", where);
done:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    hf_ctx_free(&c);
    return st;
}

lm_status lm_tokenizer_from_hf_folder(const char *dir, lm_tokenizer **out) {
    if (!dir || !out) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    char *p_tok = join_path(dir, "tokenizer.json");
    char *p_cfg = join_path(dir, "tokenizer_config.json");
    char *p_gen = join_path(dir, "generation_config.json");
    char *tj = NULL, *cj = NULL, *gj = NULL;
    size_t tl = 0, cl = 0, gl = 0;
    lm_status st = LM_OK;
    if (!p_tok || !p_cfg || !p_gen) {
        st = lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
        goto done;
    }
    st = read_file(p_tok, HF_MAX_TOKENIZER_JSON, false, &tj, &tl);
    if (st) goto done;
    st = read_file(p_cfg, HF_MAX_CONFIG_JSON, true, &cj, &cl);
    if (st == LM_ERR_NOT_FOUND) st = LM_OK;
    if (st) goto done;
    st = read_file(p_gen, HF_MAX_CONFIG_JSON, true, &gj, &gl);
    if (st == LM_ERR_NOT_FOUND) st = LM_OK;
    if (st) goto done;
    st = lm_tokenizer_from_hf_json(tj, tl, cj, cl, gj, gl, p_tok, out);
done:
    free(p_tok);
    free(p_cfg);
    free(p_gen);
    free(tj);
    free(cj);
    free(gj);
    return st;
}

/* ---- chat template ---- */

static lm_status dup_template(const char *s, char **out) {
    size_t n = strlen(s);
    if (n > HF_MAX_TEMPLATE) return lm_error(LM_ERR_LIMIT, "chat template: %zu bytes (limit %zu)", n, HF_MAX_TEMPLATE);
    *out = malloc(n + 1);
    if (!*out) return lm_error(LM_ERR_NO_MEMORY, "chat template: out of memory");
    memcpy(*out, s, n + 1);
    return LM_OK;
}

/* "chat_template": a string, or [{"name": ..., "template": ...}] ("default" wins). */
static lm_status template_from_value(const cJSON *t, const char *where, char **out) {
    if (cJSON_IsString(t)) return dup_template(t->valuestring, out);
    if (cJSON_IsArray(t)) {
        const cJSON *x, *first = NULL;
        cJSON_ArrayForEach(x, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(x, "template");
            if (!cJSON_IsString(tmpl)) continue;
            if (str_is(name, "default")) return dup_template(tmpl->valuestring, out);
            if (!first) first = tmpl;
        }
        if (first) return dup_template(first->valuestring, out);
    }
    return lm_error(LM_ERR_FORMAT, "chat template: %s: \"chat_template\" is neither a string nor a list of named templates", where);
}

lm_status lm_chat_template_from_hf_folder(const char *dir, char **template_out) {
    if (!dir || !template_out) return lm_error(LM_ERR_INVALID_ARG, "chat template: NULL argument");
    *template_out = NULL;
    char *path = join_path(dir, "chat_template.jinja");
    if (!path) return lm_error(LM_ERR_NO_MEMORY, "chat template: out of memory");
    char *text = NULL;
    size_t len = 0;
    lm_status st = read_file(path, HF_MAX_TEMPLATE, true, &text, &len);
    free(path);
    if (st == LM_OK) {
        if (memchr(text, 0, len)) {
            free(text);
            return lm_error(LM_ERR_FORMAT, "chat template: %s/chat_template.jinja holds a NUL byte", dir);
        }
        *template_out = text;
        return LM_OK;
    }
    if (st != LM_ERR_NOT_FOUND) return st;
    /* processor folders keep it in chat_template.json; tokenizers in tokenizer_config.json */
    static const char *const files[] = {"tokenizer_config.json", "chat_template.json"};
    for (size_t i = 0; i < 2; i++) {
        path = join_path(dir, files[i]);
        if (!path) return lm_error(LM_ERR_NO_MEMORY, "chat template: out of memory");
        st = read_file(path, HF_MAX_CONFIG_JSON, true, &text, &len);
        if (st == LM_ERR_NOT_FOUND) {
            free(path);
            continue;
        }
        if (st) {
            free(path);
            return st;
        }
        cJSON *j = cJSON_ParseWithLength(text, len);
        free(text);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
        if (t && !cJSON_IsNull(t)) {
            st = template_from_value(t, path, template_out);
            cJSON_Delete(j);
            free(path);
            return st;
        }
        if (!j) {
            st = lm_error(LM_ERR_FORMAT, "chat template: %s is not valid JSON", path);
            free(path);
            return st;
        }
        cJSON_Delete(j);
        free(path);
    }
    return lm_error(LM_ERR_NOT_FOUND, "chat template: %s has no chat_template.jinja and no \"chat_template\" in tokenizer_config.json", dir);
}
