/* Building a vocabulary from an lm_vocab_desc: copies the token texts into one
 * arena, indexes them, indexes the merges, and settles the special ids and flags with
 * llama.cpp's defaults and per-model rules. */
#include "tokenizer/vocab.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---- small helpers ---- */

bool lm_ivec_push(lm_ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

bool lm_bytes_append(lm_bytes *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

/* FNV-1a, 64-bit: streamable, so "left" + " " + "right" hashes without building it. */
uint64_t lm_tok_hash_continue(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t lm_tok_hash(const void *p, size_t n) {
    return lm_tok_hash_continue(0xcbf29ce484222325ull, p, n);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- pre-tokenizer names ---- */

enum { F_NOCLEAN = 1, F_IGNORE_MERGES = 2, F_ADD_BOS = 4 };

static const struct {
    const char *name;
    lm_pre_kind kind;
    int flags;
} k_pre_names[] = {
    {"default", LM_PRE_DEFAULT, 0},
    {"llama3", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"llama-v3", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"llama-bpe", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"falcon3", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"falcon-h1", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"pixtral", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"midm-2.0", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"lfm2", LM_PRE_LLAMA3, F_IGNORE_MERGES | F_ADD_BOS},
    {"deepseek-llm", LM_PRE_DEEPSEEK_LLM, F_NOCLEAN},
    {"deepseek-coder", LM_PRE_DEEPSEEK_CODER, F_NOCLEAN},
    {"deepseek-v3", LM_PRE_DEEPSEEK3_LLM, F_NOCLEAN},
    {"falcon", LM_PRE_FALCON, 0},
    {"mpt", LM_PRE_MPT, 0},
    {"starcoder", LM_PRE_STARCODER, 0},
    {"gpt-2", LM_PRE_GPT2, 0},
    {"phi-2", LM_PRE_GPT2, 0},
    {"jina-es", LM_PRE_GPT2, 0},
    {"jina-de", LM_PRE_GPT2, 0},
    {"gigachat", LM_PRE_GPT2, 0},
    {"jina-v2-es", LM_PRE_GPT2, 0},
    {"jina-v2-de", LM_PRE_GPT2, 0},
    {"a.x-4.0", LM_PRE_GPT2, 0},
    {"mellum", LM_PRE_GPT2, 0},
    {"exaone4", LM_PRE_GPT2, 0},
    {"refact", LM_PRE_REFACT, 0},
    {"command-r", LM_PRE_COMMAND_R, F_NOCLEAN},
    {"qwen2", LM_PRE_QWEN2, F_NOCLEAN},
    {"deepseek-r1-qwen", LM_PRE_QWEN2, F_NOCLEAN},
    {"megrez", LM_PRE_QWEN2, 0},
    {"qwen35", LM_PRE_QWEN35, F_NOCLEAN},
    {"stablelm2", LM_PRE_STABLELM2, 0},
    {"olmo", LM_PRE_OLMO, 0},
    {"dbrx", LM_PRE_DBRX, 0},
    {"smaug-bpe", LM_PRE_SMAUG, 0},
    {"poro-chat", LM_PRE_PORO, F_NOCLEAN},
    {"glm4", LM_PRE_CHATGLM4, 0},
    {"chatglm-bpe", LM_PRE_CHATGLM4, 0},
    {"viking", LM_PRE_VIKING, F_NOCLEAN},
    {"jais", LM_PRE_JAIS, 0},
    {"tekken", LM_PRE_TEKKEN, F_NOCLEAN | F_IGNORE_MERGES | F_ADD_BOS},
    {"smollm", LM_PRE_SMOLLM, F_NOCLEAN},
    {"codeshell", LM_PRE_CODESHELL, 0},
    {"bloom", LM_PRE_BLOOM, 0},
    {"gpt3-finnish", LM_PRE_GPT3_FINNISH, 0},
    {"exaone", LM_PRE_EXAONE, 0},
    {"chameleon", LM_PRE_CHAMELEON, F_NOCLEAN | F_ADD_BOS},
    {"minerva-7b", LM_PRE_MINERVA, 0},
    {"gpt-4o", LM_PRE_GPT4O, F_NOCLEAN},
    {"llama4", LM_PRE_GPT4O, F_NOCLEAN},
    {"superbpe", LM_PRE_SUPERBPE, F_NOCLEAN},
    {"trillion", LM_PRE_TRILLION, F_NOCLEAN},
    {"bailingmoe", LM_PRE_BAILINGMOE, F_NOCLEAN},
    {"bailingmoe2", LM_PRE_BAILINGMOE, F_NOCLEAN},
    {"llada-moe", LM_PRE_BAILINGMOE, F_NOCLEAN},
    {"seed-coder", LM_PRE_SEED_CODER, F_NOCLEAN},
    {"hunyuan", LM_PRE_HUNYUAN, F_NOCLEAN},
    {"hunyuan-dense", LM_PRE_HUNYUAN_DENSE, F_NOCLEAN},
    {"grok-2", LM_PRE_GROK2, F_NOCLEAN},
};

bool lm_pre_lookup(const char *name, size_t len, lm_pre_kind *kind, bool *clean_spaces,
                   bool *ignore_merges, bool *add_bos) {
    for (size_t i = 0; i < sizeof k_pre_names / sizeof k_pre_names[0]; i++) {
        if (strlen(k_pre_names[i].name) == len && memcmp(k_pre_names[i].name, name, len) == 0) {
            int f = k_pre_names[i].flags;
            if (kind) *kind = k_pre_names[i].kind;
            if (clean_spaces) *clean_spaces = !(f & F_NOCLEAN);
            if (ignore_merges) *ignore_merges = (f & F_IGNORE_MERGES) != 0;
            if (add_bos) *add_bos = (f & F_ADD_BOS) != 0;
            return true;
        }
    }
    return false;
}

/* ---- description ---- */

void lm_vocab_desc_init(lm_vocab_desc *d, lm_vocab_model model) {
    memset(d, 0, sizeof *d);
    d->model = model;
    d->bos_id = d->eos_id = d->unk_id = d->pad_id = d->sep_id = d->eot_id = d->eom_id =
        LM_VOCAB_ID_DEFAULT;
    d->add_bos = d->add_eos = d->add_sep = d->add_space_prefix = -1;
    d->clean_spaces = d->ignore_merges = -1;
}

/* ---- lookup ---- */

int32_t lm_vocab_find(const lm_vocab *v, const char *s, size_t len) {
    size_t i = (size_t)lm_tok_hash(s, len) & v->index_mask;
    for (;;) {
        uint32_t slot = v->index[i];
        if (slot == 0) return LM_TOKEN_NULL;
        const lm_token_rec *t = &v->tok[slot - 1];
        if (t->len == len && memcmp(v->text + t->off, s, len) == 0) return (int32_t)(slot - 1);
        i = (i + 1) & v->index_mask;
    }
}

int32_t lm_vocab_merge_rank(const lm_vocab *v, const char *l, size_t ll, const char *r,
                            size_t rl) {
    if (!v->merge_index) return -1;
    uint64_t h = lm_tok_hash(l, ll);
    h = lm_tok_hash_continue(h, " ", 1);
    h = lm_tok_hash_continue(h, r, rl);
    size_t i = (size_t)h & v->merge_index_mask;
    for (;;) {
        uint32_t slot = v->merge_index[i];
        if (slot == 0) return -1;
        uint32_t m = slot - 1;
        if (v->merge_split[m] == ll && v->merge_len[m] == ll + 1 + rl) {
            const char *t = v->merge_text + v->merge_off[m];
            if (memcmp(t, l, ll) == 0 && memcmp(t + ll + 1, r, rl) == 0) return (int32_t)m;
        }
        i = (i + 1) & v->merge_index_mask;
    }
}

/* ---- build ---- */

void lm_vocab_free(lm_vocab *v) {
    if (!v) return;
    free(v->tok);
    free(v->text);
    free(v->index);
    free(v->merge_off);
    free(v->merge_len);
    free(v->merge_split);
    free(v->merge_text);
    free(v->merge_index);
    free(v->eog);
    free(v->special);
    lm_special_trie_free(v->trie);
    lm_pretok_free(v->pretok);
    free(v->piece_off);
    free(v->piece_text);
    free(v);
}

static uint32_t attr_from_type(int32_t type) {
    switch (type) {
    case LM_TOKTYPE_NORMAL: return LM_TOKEN_ATTR_NORMAL;
    case LM_TOKTYPE_UNKNOWN: return LM_TOKEN_ATTR_UNKNOWN;
    case LM_TOKTYPE_CONTROL: return LM_TOKEN_ATTR_CONTROL;
    case LM_TOKTYPE_USER_DEFINED: return LM_TOKEN_ATTR_USER_DEFINED;
    case LM_TOKTYPE_UNUSED: return LM_TOKEN_ATTR_UNUSED;
    case LM_TOKTYPE_BYTE: return LM_TOKEN_ATTR_BYTE;
    default: return LM_TOKEN_ATTR_UNDEFINED;
    }
}

static lm_status build_tokens(lm_vocab *v, const lm_vocab_desc *d) {
    size_t total = 0;
    for (uint32_t i = 0; i < d->n_tokens; i++) {
        size_t len = d->tokens[i].len;
        if (len > LM_VOCAB_MAX_TOKEN_LEN)
            return lm_error(LM_ERR_LIMIT, "tokenizer: token %u is %zu bytes long (limit %u)", i,
                            len, LM_VOCAB_MAX_TOKEN_LEN);
        if (len && !d->tokens[i].ptr)
            return lm_error(LM_ERR_INVALID_ARG, "tokenizer: token %u has no text", i);
        /* llama.cpp names empty tokens "[EMPTY_<id>]" so they stay addressable */
        total += len ? len : 32;
    }
    if (total > UINT32_MAX)
        return lm_error(LM_ERR_LIMIT, "tokenizer: token texts total %zu bytes", total);
    v->n_tokens = d->n_tokens;
    v->tok = calloc(d->n_tokens, sizeof *v->tok);
    v->text = malloc(total + 1);
    size_t cap = pow2_at_least((size_t)d->n_tokens * 2);
    v->index = calloc(cap, sizeof *v->index);
    if (!v->tok || !v->text || !v->index)
        return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory for %u tokens", d->n_tokens);
    v->index_mask = cap - 1;
    size_t off = 0;
    for (uint32_t i = 0; i < d->n_tokens; i++) {
        lm_token_rec *t = &v->tok[i];
        t->off = (uint32_t)off;
        if (d->tokens[i].len) {
            memcpy(v->text + off, d->tokens[i].ptr, d->tokens[i].len);
            t->len = (uint32_t)d->tokens[i].len;
        } else {
            int n = snprintf(v->text + off, 32, "[EMPTY_%u]", i);
            t->len = (uint32_t)n;
        }
        off += t->len;
        float s = d->scores ? d->scores[i] : 0.0f;
        t->score = s == s ? s : 0.0f; /* a NaN score would break the heap order */
        t->attr = d->types ? attr_from_type(d->types[i]) : LM_TOKEN_ATTR_NORMAL;
        /* later duplicates win, as in llama.cpp's token_to_id map */
        const char *s2 = v->text + t->off;
        size_t j = (size_t)lm_tok_hash(s2, t->len) & v->index_mask;
        for (;;) {
            uint32_t slot = v->index[j];
            if (slot == 0) {
                v->index[j] = i + 1;
                break;
            }
            const lm_token_rec *o = &v->tok[slot - 1];
            if (o->len == t->len && memcmp(v->text + o->off, s2, t->len) == 0) {
                v->index[j] = i + 1;
                break;
            }
            j = (j + 1) & v->index_mask;
        }
    }
    v->text[off] = '\0';
    return LM_OK;
}

static lm_status build_merges(lm_vocab *v, const lm_vocab_desc *d) {
    if (d->n_merges == 0) return LM_OK;
    if (!d->merges) return lm_error(LM_ERR_INVALID_ARG, "tokenizer: merges missing");
    if (d->n_merges > LM_VOCAB_MAX_MERGES)
        return lm_error(LM_ERR_LIMIT, "tokenizer: %u merges (limit %u)", d->n_merges,
                        LM_VOCAB_MAX_MERGES);
    size_t total = 0;
    for (uint32_t i = 0; i < d->n_merges; i++) {
        if (d->merges[i].len > LM_VOCAB_MAX_TOKEN_LEN)
            return lm_error(LM_ERR_LIMIT, "tokenizer: merge %u is too long", i);
        total += d->merges[i].len;
    }
    if (total > UINT32_MAX) return lm_error(LM_ERR_LIMIT, "tokenizer: merges too large");
    v->merge_off = malloc(d->n_merges * sizeof(uint32_t));
    v->merge_len = malloc(d->n_merges * sizeof(uint32_t));
    v->merge_split = malloc(d->n_merges * sizeof(uint32_t));
    v->merge_text = malloc(total + 1);
    size_t cap = pow2_at_least((size_t)d->n_merges * 2);
    v->merge_index = calloc(cap, sizeof(uint32_t));
    if (!v->merge_off || !v->merge_len || !v->merge_split || !v->merge_text || !v->merge_index)
        return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory for %u merges", d->n_merges);
    v->merge_index_mask = cap - 1;
    size_t off = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->n_merges; i++) {
        const char *s = d->merges[i].ptr;
        size_t len = d->merges[i].len;
        /* split at the first space after the first byte, like llama.cpp */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (d->merge_split) {
            uint32_t k = d->merge_split[i];
            sp = k > 0 && k + 1 < len && s[k] == ' ' ? s + k : NULL;
        }
        if (!sp)
            return lm_error(LM_ERR_FORMAT, "tokenizer: merge %u has no space separator", i);
        memcpy(v->merge_text + off, s, len);
        v->merge_off[n] = (uint32_t)off;
        v->merge_len[n] = (uint32_t)len;
        v->merge_split[n] = (uint32_t)(sp - s);
        off += len;
        /* ranks are first-come: a repeated merge keeps its lower rank */
        size_t j = (size_t)lm_tok_hash(s, len) & v->merge_index_mask;
        bool dup = false;
        for (;;) {
            uint32_t slot = v->merge_index[j];
            if (slot == 0) break;
            uint32_t m = slot - 1;
            if (v->merge_len[m] == len && v->merge_split[m] == v->merge_split[n] &&
                memcmp(v->merge_text + v->merge_off[m], s, len) == 0) {
                dup = true;
                break;
            }
            j = (j + 1) & v->merge_index_mask;
        }
        if (!dup) v->merge_index[j] = n + 1;
        n++;
    }
    v->n_merges = n;
    return LM_OK;
}

static int32_t pick_id(int32_t given, int32_t def, uint32_t n) {
    int32_t id = given == LM_VOCAB_ID_DEFAULT ? def : given;
    if (given >= 0 && (uint32_t)given >= n) id = def; /* llama.cpp: bad id -> default */
    if (id < 0 || (uint32_t)id >= n) return LM_TOKEN_NULL;
    return id;
}

static bool add_eog(lm_vocab *v, int32_t id) {
    if (id < 0) return true;
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return true;
    int32_t *e = realloc(v->eog, (v->n_eog + 1) * sizeof *e);
    if (!e) return false;
    v->eog = e;
    v->eog[v->n_eog++] = id;
    return true;
}

static int32_t find_str(const lm_vocab *v, const char *s) { return lm_vocab_find(v, s, strlen(s)); }

/* Tokens llama.cpp recognises by text (as of the reference, llama-cpp-python 0.3.36):
 * end-of-turn / end-of-generation markers and fill-in-the-middle markers. They become
 * control tokens (the bit is added to what the vocabulary says). */
#define FW_BAR "\xef\xbd\x9c"  /* U+FF5C, DeepSeek's fullwidth bar */
#define SP_LOW "\xe2\x96\x81"  /* U+2581 */
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<" FW_BAR "end" SP_LOW "of" SP_LOW "sentence" FW_BAR ">",
    "<end_of_utterance>", NULL};
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FW_BAR "end" SP_LOW "of" SP_LOW "sentence" FW_BAR ">", "[e~[", NULL};
/* one token per FIM role (the first of its list found); pad, repo and file separator
 * also end generation */
static const char *const k_fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
    "<" FW_BAR "fim" SP_LOW "begin" FW_BAR ">", "<PRE>", SP_LOW "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const k_fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<" FW_BAR "fim" SP_LOW "hole" FW_BAR ">", "<SUF>", SP_LOW "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const k_fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<" FW_BAR "fim" SP_LOW "end" FW_BAR ">", "<MID>", SP_LOW "<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const k_fim_sep[] = {"<|file_sep|>", NULL};

static void mark_control(lm_vocab *v, int32_t id) {
    if (id >= 0) v->tok[id].attr |= LM_TOKEN_ATTR_CONTROL;
}

/* With keep_types, text rules see only tokens that are already special. */
static int32_t typed(const lm_vocab *v, bool keep_types, int32_t id) {
    if (id < 0 || !keep_types) return id;
    return v->tok[id].attr & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_USER_DEFINED) ? id : LM_TOKEN_NULL;
}

static int32_t first_found(const lm_vocab *v, bool keep_types, const char *const *texts) {
    for (size_t i = 0; texts[i]; i++) {
        int32_t id = typed(v, keep_types, lm_vocab_find(v, texts[i], strlen(texts[i])));
        if (id >= 0) return id;
    }
    return LM_TOKEN_NULL;
}

static void remove_eog(lm_vocab *v, int32_t id) {
    for (size_t i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == id) {
            memmove(v->eog + i, v->eog + i + 1, (v->n_eog - i - 1) * sizeof *v->eog);
            v->n_eog--;
            return;
        }
    }
}

static bool is_eog(const lm_vocab *v, int32_t id) {
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return true;
    return false;
}

static bool name_has(const lm_vocab_desc *d, const char *needle) {
    size_t n = strlen(needle);
    if (d->name.len < n) return false;
    for (size_t i = 0; i + n <= d->name.len; i++) {
        size_t k = 0;
        while (k < n && tolower((unsigned char)d->name.ptr[i + k]) == needle[k]) k++;
        if (k == n) return true;
    }
    return false;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const lm_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->tok[x].len, ly = v->tok[y].len;
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static lm_status build_specials(lm_vocab *v, const lm_vocab_desc *d) {
    bool kt = d->keep_types;
    if (v->eot == LM_TOKEN_NULL) v->eot = first_found(v, kt, k_eot_texts);
    mark_control(v, v->eot);
    if (v->eom == LM_TOKEN_NULL) v->eom = typed(v, kt, find_str(v, "<|eom_id|>"));
    mark_control(v, v->eom);
    mark_control(v, first_found(v, kt, k_fim_pre));
    mark_control(v, first_found(v, kt, k_fim_suf));
    mark_control(v, first_found(v, kt, k_fim_mid));
    const char *const *fim_eog[] = {k_fim_pad, k_fim_rep, k_fim_sep};
    for (size_t i = 0; i < 3; i++) {
        int32_t id = first_found(v, kt, fim_eog[i]);
        mark_control(v, id);
        if (!add_eog(v, id)) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    for (size_t i = 0; k_eog_texts[i]; i++) {
        int32_t id = typed(v, kt, find_str(v, k_eog_texts[i]));
        if (id < 0) continue;
        mark_control(v, id);
        if (!add_eog(v, id)) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    /* gpt-oss: these are always rendered, so they are user-defined */
    static const char *const always[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t i = 0; i < 4; i++) {
        int32_t id = typed(v, kt, find_str(v, always[i]));
        if (id >= 0) v->tok[id].attr = LM_TOKEN_ATTR_USER_DEFINED;
    }
    if (!add_eog(v, v->eos) || !add_eog(v, v->eot) || !add_eog(v, v->eom))
        return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    /* harmony / solar-open: "<|end|>" ends a message, not the generation */
    int32_t end = find_str(v, "<|end|>");
    if (end >= 0 && is_eog(v, end)) {
        int32_t ret = find_str(v, "<|return|>"), call = find_str(v, "<|call|>");
        int32_t calls = find_str(v, "<|calls|>"), flush = find_str(v, "<|flush|>");
        bool has_call = (call >= 0 && is_eog(v, call)) || (calls >= 0 && is_eog(v, calls));
        if ((ret >= 0 && is_eog(v, ret) && has_call) || (has_call && flush >= 0 && is_eog(v, flush))) {
            remove_eog(v, end);
            v->tok[end].attr = LM_TOKEN_ATTR_USER_DEFINED;
        }
    }
    /* gemma4 / plamo: "</s>" is an ordinary token there */
    int32_t s_end = find_str(v, "</s>");
    if (s_end >= 0 && is_eog(v, s_end)) {
        int32_t a = find_str(v, "<|tool_response>"), b = find_str(v, "<|plamo:eos|>");
        if ((a >= 0 && is_eog(v, a)) || (b >= 0 && is_eog(v, b))) {
            remove_eog(v, s_end);
            v->tok[s_end].attr = LM_TOKEN_ATTR_NORMAL;
        }
    }
    /* control tokens named "unused..." are unused */
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        lm_token_rec *t = &v->tok[i];
        if ((t->attr & LM_TOKEN_ATTR_CONTROL) && memmem(v->text + t->off, t->len, "unused", 6))
            t->attr |= LM_TOKEN_ATTR_UNUSED;
    }

    size_t n = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (v->tok[i].attr & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_USER_DEFINED | LM_TOKEN_ATTR_UNKNOWN)) n++;
    v->special = malloc((n ? n : 1) * sizeof *v->special);
    if (!v->special) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    n = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (v->tok[i].attr & (LM_TOKEN_ATTR_CONTROL | LM_TOKEN_ATTR_USER_DEFINED | LM_TOKEN_ATTR_UNKNOWN))
            v->special[n++] = (int32_t)i;
    v->n_special = n;
    qsort_r(v->special, n, sizeof *v->special, cmp_special, v);

    /* per-model attributes llama.cpp sets by name */
    if (name_has(d, "phi-3") || name_has(d, "phi3")) {
        for (size_t i = 0; i < n; i++) v->tok[v->special[i]].attr |= LM_TOKEN_ATTR_RSTRIP;
        int32_t id = find_str(v, "</s>");
        if (id >= 0) v->tok[id].attr |= LM_TOKEN_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < 3; i++) {
            id = find_str(v, keep[i]);
            if (id >= 0) v->tok[id].attr &= ~(uint32_t)LM_TOKEN_ATTR_RSTRIP;
        }
    }
    return lm_special_trie_build(v);
}

lm_status lm_vocab_build(const lm_vocab_desc *d, lm_vocab **out) {
    *out = NULL;
    if (!d || (d->model != LM_VOCAB_BPE && d->model != LM_VOCAB_SPM))
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer: unknown vocabulary model");
    if (d->n_tokens == 0 || !d->tokens)
        return lm_error(LM_ERR_INVALID_ARG, "tokenizer: the vocabulary has no tokens");
    if (d->n_tokens > LM_VOCAB_MAX_TOKENS)
        return lm_error(LM_ERR_LIMIT, "tokenizer: %u tokens (limit %u)", d->n_tokens,
                        LM_VOCAB_MAX_TOKENS);
    lm_vocab *v = calloc(1, sizeof *v);
    if (!v) return lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
    v->model = d->model;
    lm_status st = build_tokens(v, d);
    if (st) goto fail;

    int32_t def_bos, def_eos, def_unk;
    bool add_bos = false, add_space_prefix = false;
    v->clean_spaces = false;
    v->ignore_merges = false;
    v->pre = LM_PRE_DEFAULT;
    if (d->model == LM_VOCAB_BPE) {
        if (d->n_merges == 0) {
            st = lm_error(LM_ERR_FORMAT, "tokenizer: a BPE vocabulary needs merges");
            goto fail;
        }
        st = build_merges(v, d);
        if (st) goto fail;
        def_bos = 11, def_eos = 11, def_unk = LM_TOKEN_NULL;
        v->clean_spaces = true;
        if (d->pre_explicit) {
            if (d->n_pre_regex > LM_PRE_MAX_REGEX || (d->n_pre_regex && !d->pre_regex)) {
                st = lm_error(LM_ERR_LIMIT, "tokenizer: %u pre-tokenizer regexes (limit %d)",
                              d->n_pre_regex, LM_PRE_MAX_REGEX);
                goto fail;
            }
            if (!lm_pretok_kind_of(d->pre_regex, d->n_pre_regex, &v->pre)) v->pre = LM_PRE_CUSTOM;
            /* a tokenizer.json says what it wants; nothing comes from the kind */
            v->clean_spaces = false;
            def_bos = def_eos = LM_TOKEN_NULL;
        } else if (d->pre.len) {
            if (!lm_pre_lookup(d->pre.ptr, d->pre.len, &v->pre, &v->clean_spaces,
                               &v->ignore_merges, &add_bos)) {
                st = lm_error(LM_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer type '%.*s'",
                              (int)(d->pre.len > 64 ? 64 : d->pre.len), d->pre.ptr);
                goto fail;
            }
        }
    } else {
        def_bos = 1, def_eos = 2, def_unk = 0;
        add_bos = true;
        add_space_prefix = true;
        if (d->spm_merges) {
            v->spm_merges = true;
            st = build_merges(v, d);
            if (st) goto fail;
        }
    }
    if (d->clean_spaces >= 0) v->clean_spaces = d->clean_spaces != 0;
    if (d->ignore_merges >= 0) v->ignore_merges = d->ignore_merges != 0;
    v->normalizer = d->normalizer;
    if (d->extra_attr)
        for (uint32_t i = 0; i < v->n_tokens; i++)
            v->tok[i].attr |= d->extra_attr[i] & (LM_TOKEN_ATTR_LSTRIP | LM_TOKEN_ATTR_RSTRIP);
    v->bos = pick_id(d->bos_id, def_bos, v->n_tokens);
    v->eos = pick_id(d->eos_id, def_eos, v->n_tokens);
    v->unk = pick_id(d->unk_id, def_unk, v->n_tokens);
    v->pad = pick_id(d->pad_id, LM_TOKEN_NULL, v->n_tokens);
    v->sep = pick_id(d->sep_id, LM_TOKEN_NULL, v->n_tokens);
    v->eot = pick_id(d->eot_id, LM_TOKEN_NULL, v->n_tokens);
    v->eom = pick_id(d->eom_id, LM_TOKEN_NULL, v->n_tokens);
    if (d->model == LM_VOCAB_BPE && v->pre == LM_PRE_CHATGLM4 && d->bos_id == LM_VOCAB_ID_DEFAULT)
        v->bos = LM_TOKEN_NULL;
    v->add_bos = d->add_bos >= 0 ? d->add_bos != 0 : add_bos;
    v->add_eos = d->add_eos >= 0 ? d->add_eos != 0 : false;
    v->add_sep = d->add_sep >= 0 ? d->add_sep != 0 : false;
    v->add_space_prefix = d->add_space_prefix >= 0 ? d->add_space_prefix != 0 : add_space_prefix;
    if (v->add_bos && v->bos == LM_TOKEN_NULL) v->add_bos = false;
    if (v->add_eos && v->eos == LM_TOKEN_NULL) v->add_eos = false;

    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        v->byte_token[b] = lm_vocab_find(v, buf, 6);
        if (v->byte_token[b] == LM_TOKEN_NULL && d->model == LM_VOCAB_SPM) {
            /* llama.cpp falls back to the byte itself as a token */
            char c = (char)b;
            v->byte_token[b] = lm_vocab_find(v, &c, 1);
        }
    }

    st = build_specials(v, d);
    if (st) goto fail;
    for (uint32_t i = 0; i < d->n_extra_eog && d->extra_eog; i++) {
        int32_t id = d->extra_eog[i];
        if (id >= 0 && (uint32_t)id < v->n_tokens && !add_eog(v, id)) {
            st = lm_error(LM_ERR_NO_MEMORY, "tokenizer: out of memory");
            goto fail;
        }
    }
    if (d->model == LM_VOCAB_BPE) {
        st = d->pre_explicit ? lm_pretok_create_regexes(d->pre_regex, d->n_pre_regex, &v->pretok)
                             : lm_pretok_create(v->pre, &v->pretok);
        if (st) goto fail;
    }
    st = lm_vocab_build_pieces(v);
    if (st) goto fail;
    *out = v;
    return LM_OK;
fail:
    lm_vocab_free(v);
    return st;
}
