/* The byte-level BPE pre-tokenizer: a list of regexes applied in turn, each one
 * splitting every piece left by the previous into matches and the text between them
 * (which is kept as words too), as llama.cpp's unicode_regex_split does. The regex
 * strings are llama.cpp's (data; their Unicode classes are PCRE2's \p{..} with UCP).
 *
 * Invalid UTF-8 never matches (PCRE2_MATCH_INVALID_UTF), so such bytes end up in the
 * in-between pieces and are byte-encoded like any other byte; llama.cpp replaces them
 * with U+FFFD first, which loses the bytes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

#define MAX_REGEX LM_PRE_MAX_REGEX

struct lm_pretok {
    int n;
    pcre2_code *re[MAX_REGEX];
};

/* Regex sets by kind. Literal UTF-8 in the character classes is intended. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                           \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK_DS "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+"
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_NO_LOWER_LETTERS "((?=[\\p{L}])([^a-z]))"
#define RE_NO_UPPER_LETTERS "((?=[\\p{L}])([^A-Z]))"
#define RE_FINNISH " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"

/* deepseek-llm's letter class, code point ranges as llama.cpp spells them */
#define RE_DEEPSEEK_LETTERS                                                                \
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"     \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"   \
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"            \
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}"                 \
    "\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"           \
    "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}"           \
    "\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}"  \
    "\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}"   \
    "\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}"           \
    "\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"            \
    "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"             \
    "\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"  \
    "\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"   \
    "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}"            \
    "\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}"           \
    "\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"         \
    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"   \
    "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+"
#define RE_DEEPSEEK_PUNCT \
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+"

static int regexes_for(lm_pre_kind kind, const char **re) {
    int n = 0;
    switch (kind) {
    case LM_PRE_LLAMA3:
    case LM_PRE_DBRX:
    case LM_PRE_SMAUG:
    case LM_PRE_CHATGLM4:
        re[n++] = RE_LLAMA3;
        break;
    case LM_PRE_DEEPSEEK_LLM:
        re[n++] = "[\r\n]";
        re[n++] = RE_DEEPSEEK_LETTERS;
        re[n++] = RE_DEEPSEEK_PUNCT;
        re[n++] = "\\s+$";
        re[n++] = RE_CJK_DS;
        re[n++] = "\\p{N}+";
        break;
    case LM_PRE_DEEPSEEK3_LLM:
    case LM_PRE_HUNYUAN_DENSE:
        re[n++] = "\\p{N}{1,3}";
        re[n++] = "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+";
        re[n++] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                  "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
        break;
    case LM_PRE_DEEPSEEK_CODER:
        re[n++] = "[\r\n]";
        re[n++] = "\\s?\\p{L}+";
        re[n++] = "\\s?\\p{P}+";
        re[n++] = RE_CJK_DS;
        re[n++] = "\\p{N}";
        break;
    case LM_PRE_FALCON:
        re[n++] = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
        re[n++] = RE_GPT2;
        re[n++] = "[0-9][0-9][0-9]";
        break;
    case LM_PRE_STARCODER:
    case LM_PRE_REFACT:
    case LM_PRE_COMMAND_R:
    case LM_PRE_SMOLLM:
    case LM_PRE_CODESHELL:
    case LM_PRE_EXAONE:
    case LM_PRE_MINERVA:
        re[n++] = "\\p{N}";
        re[n++] = RE_GPT2;
        break;
    case LM_PRE_GPT2:
    case LM_PRE_MPT:
    case LM_PRE_OLMO:
    case LM_PRE_JAIS:
    case LM_PRE_TRILLION:
        re[n++] = RE_GPT2;
        break;
    case LM_PRE_STABLELM2:
    case LM_PRE_QWEN2:
    case LM_PRE_HUNYUAN:
        re[n++] = RE_QWEN2;
        break;
    case LM_PRE_QWEN35:
        re[n++] = RE_QWEN35;
        break;
    case LM_PRE_PORO:
    case LM_PRE_BLOOM:
    case LM_PRE_GPT3_FINNISH:
        re[n++] = RE_FINNISH;
        break;
    case LM_PRE_VIKING:
        re[n++] = RE_FINNISH;
        re[n++] = "\\p{N}";
        break;
    case LM_PRE_TEKKEN:
        re[n++] = "[^\\r\\n\\p{L}\\p{N}]?" RE_NO_LOWER_LETTERS "*" RE_NO_UPPER_LETTERS
                  "+|[^\\r\\n\\p{L}\\p{N}]?" RE_NO_LOWER_LETTERS "+" RE_NO_UPPER_LETTERS
                  "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        break;
    case LM_PRE_CHAMELEON:
        re[n++] = "<sentinel:[0-9]+>";
        re[n++] = "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z";
        re[n++] = "([\\t\\n]|    |  )";
        re[n++] = "\\p{N}";
        re[n++] = "[\\p{P}!-/:-@\\[-`{-~]";
        re[n++] = RE_GPT2;
        break;
    case LM_PRE_GPT4O:
        re[n++] = "[^\\r\\n\\p{L}\\p{N}]?" RE_NO_LOWER_LETTERS "*" RE_NO_UPPER_LETTERS "+" RE_CONTRACT
                  "?|[^\\r\\n\\p{L}\\p{N}]?" RE_NO_LOWER_LETTERS "+" RE_NO_UPPER_LETTERS "*" RE_CONTRACT
                  "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        break;
    case LM_PRE_SUPERBPE:
        re[n++] = "\\p{N}+";
        re[n++] = "(?=(\\d{3})+(?!\\d))";
        break;
    case LM_PRE_BAILINGMOE:
        re[n++] = "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
                  "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
        break;
    case LM_PRE_SEED_CODER:
        re[n++] = RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        break;
    case LM_PRE_GROK2:
        re[n++] = RE_QWEN2;
        break;
    case LM_PRE_DEFAULT:
    default:
        re[n++] = "[\\p{P}\\$\\+<=>\\^~\\|]+";
        re[n++] = RE_GPT2;
        re[n++] = "\\p{N}+";
        re[n++] = "[0-9][0-9][0-9]";
        break;
    }
    return n;
}

int lm_pretok_kind_regexes(lm_pre_kind kind, const char **re) { return regexes_for(kind, re); }

void lm_pretok_free(lm_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    free(p);
}

static lm_status compile_all(const lm_strview *src, int n, bool hostile, lm_pretok **out) {
    *out = NULL;
    lm_pretok *p = calloc(1, sizeof *p);
    if (!p) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    for (int i = 0; i < n; i++) {
        int err = 0;
        PCRE2_SIZE eoff = 0;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
        p->re[i] = pcre2_compile((PCRE2_SPTR)src[i].ptr, src[i].len, opts, &err, &eoff, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            lm_pretok_free(p);
            if (hostile)
                return lm_error(LM_ERR_UNSUPPORTED,
                                "tokenizer: pre-tokenizer regex '%.80s' is not supported: %s at offset %zu",
                                src[i].ptr, (const char *)msg, (size_t)eoff);
            return lm_error(LM_ERR_INTERNAL, "tokenizer: pre-tokenizer regex %d: %s at %zu", i,
                            (const char *)msg, (size_t)eoff);
        }
        p->n = i + 1;
        /* JIT is an optimisation: without it (no JIT support) matching still works */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return LM_OK;
}

lm_status lm_pretok_create(lm_pre_kind kind, lm_pretok **out) {
    const char *src[MAX_REGEX];
    lm_strview sv[MAX_REGEX];
    int n = regexes_for(kind, src);
    for (int i = 0; i < n; i++) sv[i] = (lm_strview){src[i], strlen(src[i])};
    return compile_all(sv, n, false, out);
}

lm_status lm_pretok_create_regexes(const lm_strview *re, uint32_t n, lm_pretok **out) {
    *out = NULL;
    if (n > MAX_REGEX)
        return lm_error(LM_ERR_LIMIT, "tokenizer: %u pre-tokenizer regexes (limit %d)", n, MAX_REGEX);
    for (uint32_t i = 0; i < n; i++)
        if (re[i].len > 4096 || memchr(re[i].ptr, 0, re[i].len))
            return lm_error(LM_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer regex %u is too long or holds NUL", i);
    return compile_all(re, (int)n, true, out);
}

bool lm_pretok_kind_of(const lm_strview *re, uint32_t n, lm_pre_kind *kind) {
    /* the common names first, then every kind in order */
    static const lm_pre_kind prefer[] = {LM_PRE_LLAMA3, LM_PRE_QWEN2, LM_PRE_QWEN35, LM_PRE_SMOLLM, LM_PRE_GPT2};
    for (int pass = 0; pass < 2; pass++) {
        int count = pass == 0 ? (int)(sizeof prefer / sizeof prefer[0]) : (int)LM_PRE_CUSTOM;
        for (int k = 0; k < count; k++) {
            lm_pre_kind kk = pass == 0 ? prefer[k] : (lm_pre_kind)k;
            const char *src[MAX_REGEX];
            int m = regexes_for(kk, src);
            if ((uint32_t)m != n) continue;
            bool same = true;
            for (int i = 0; i < m && same; i++)
                same = strlen(src[i]) == re[i].len && memcmp(src[i], re[i].ptr, re[i].len) == 0;
            if (same) {
                *kind = kk;
                return true;
            }
        }
    }
    return false;
}

/* tokenizer.json spellings (Oniguruma syntax, as Hugging Face writes them) of the patterns
 * above. (?i:'s|...) is written out as [sS] classes: PCRE2's caseless matching with UCP
 * would also fold U+017F and U+212A into s and k. */
static const struct {
    const char *hf;
    const char *ours;
} k_known[] = {
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", RE_GPT2},
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", RE_GPT2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", RE_LLAMA3},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", RE_QWEN2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", RE_QWEN35},
};

const char *lm_pretok_known_pattern(const char *hf, size_t len) {
    for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++)
        if (strlen(k_known[i].hf) == len && memcmp(k_known[i].hf, hf, len) == 0) return k_known[i].ours;
    return NULL;
}

static bool span_push(lm_spanvec *s, size_t off, size_t len) {
    if (len == 0) return true;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        lm_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return true;
}

/* Splits each span of `in` with one regex into `out`. */
static lm_status split_one(const pcre2_code *re, pcre2_match_data *md, const char *text,
                           const lm_spanvec *in, lm_spanvec *out) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *sub = text + in->v[k].off;
        size_t len = in->v[k].len, base = in->v[k].off;
        size_t start = 0; /* start of the text not yet emitted */
        size_t pos = 0;   /* where the next search begins */
        while (pos <= len) {
            int rc = pcre2_match(re, (PCRE2_SPTR)sub, len, pos, 0, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return lm_error(LM_ERR_INTERNAL, "tokenizer: pre-tokenizer match failed: %s",
                                (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (ms > start && !span_push(out, base + start, ms - start)) goto oom;
            if (me > ms) {
                if (!span_push(out, base + ms, me - ms)) goto oom;
                start = me;
                pos = me;
            } else {
                /* an empty match only marks a split point; step over one character */
                start = ms;
                if (ms >= len) break;
                pos = ms + lm_utf8_len((uint8_t)sub[ms]);
                if (pos > len) pos = len;
            }
        }
        if (start < len && !span_push(out, base + start, len - start)) goto oom;
    }
    return LM_OK;
oom:
    return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
}

lm_status lm_pretok_split(const lm_pretok *p, const char *text, size_t len, lm_spanvec *out) {
    out->n = 0;
    if (len == 0) return LM_OK;
    lm_spanvec tmp = {0};
    lm_spanvec *a = out, *b = &tmp;
    if (!span_push(a, 0, len)) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    if (!md) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    lm_status st = LM_OK;
    for (int i = 0; i < p->n; i++) {
        st = split_one(p->re[i], md, text, a, b);
        if (st) break;
        lm_spanvec *t = a;
        a = b;
        b = t;
    }
    pcre2_match_data_free(md);
    if (!st && a != out) {
        /* the result ended in tmp: hand its storage to out */
        lm_spanvec t = *out;
        *out = *a;
        *a = t;
    }
    free(tmp.v);
    return st;
}
