/* Internals shared by the tokenizer's files (vocab, pre-tokenizer, bpe, spm, special
 * token partitioning, detokenizer). Not part of the tokenizer API. */
#ifndef LM_TOKENIZER_INTERNAL_H
#define LM_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/vocab.h"

/* ---- growable arrays used as per-call scratch ---- */

typedef struct lm_ivec {
    int32_t *v;
    size_t n, cap;
} lm_ivec;

typedef struct lm_bytes {
    char *p;
    size_t n, cap;
} lm_bytes;

bool lm_ivec_push(lm_ivec *a, int32_t x);
bool lm_bytes_append(lm_bytes *b, const void *p, size_t n);

/* ---- the vocabulary ---- */

typedef struct lm_token_rec {
    uint32_t off;  /* into lm_vocab.text */
    uint32_t len;
    float score;
    uint32_t attr; /* LM_TOKEN_ATTR_* */
} lm_token_rec;

typedef struct lm_pretok lm_pretok;
typedef struct lm_special_trie lm_special_trie;

struct lm_vocab {
    lm_vocab_model model;
    lm_pre_kind pre;
    uint32_t n_tokens;
    lm_token_rec *tok;     /* [n_tokens] */
    char *text;            /* all token texts, concatenated */

    /* text -> id: open addressing, power-of-two capacity, slots hold id+1 (0 empty) */
    uint32_t *index;
    size_t index_mask;

    /* BPE merges: "left right" -> rank, same scheme; slots hold rank+1 */
    uint32_t n_merges;
    uint32_t *merge_off;   /* [n_merges] offset of the merge text in merge_text */
    uint32_t *merge_len;   /* [n_merges] total length */
    uint32_t *merge_split; /* [n_merges] length of the left part */
    char *merge_text;
    uint32_t *merge_index;
    size_t merge_index_mask;

    /* SPM byte fallback: <0xNN> ids, LM_TOKEN_NULL where absent */
    int32_t byte_token[256];

    int32_t bos, eos, unk, pad, sep, eot, eom;
    int32_t *eog;          /* end-of-generation ids */
    size_t n_eog;

    bool add_bos, add_eos, add_sep, add_space_prefix;
    bool clean_spaces, ignore_merges;
    bool spm_merges;           /* SPM merges by pair rank (tokenizer.json BPE + byte fallback) */
    lm_norm_kind normalizer;

    /* tokens matched in raw text before the model runs (control, user-defined,
     * unknown), longest text first */
    int32_t *special;
    size_t n_special;
    lm_special_trie *trie;

    lm_pretok *pretok;     /* BPE only */

    /* decoded piece of every token (special tokens rendered as their text), for
     * detokenization in O(output bytes) */
    uint32_t *piece_off;   /* [n_tokens + 1] into piece_text */
    char *piece_text;
};

static inline const char *lm_vocab_tok_text(const lm_vocab *v, int32_t id) {
    return v->text + v->tok[id].off;
}

/* Token id of a byte string, LM_TOKEN_NULL if none. */
int32_t lm_vocab_find(const lm_vocab *v, const char *s, size_t len);
/* Rank of the merge (left, right), -1 if none. */
int32_t lm_vocab_merge_rank(const lm_vocab *v, const char *l, size_t ll, const char *r, size_t rl);

uint64_t lm_tok_hash(const void *p, size_t n);
uint64_t lm_tok_hash_continue(uint64_t h, const void *p, size_t n);

/* ---- pre-tokenizer (pretok.c) ---- */

typedef struct lm_span {
    size_t off, len;
} lm_span;

typedef struct lm_spanvec {
    lm_span *v;
    size_t n, cap;
} lm_spanvec;

lm_status lm_pretok_create(lm_pre_kind kind, lm_pretok **out);
/* From explicit regexes (n <= LM_PRE_MAX_REGEX; n == 0: one word per fragment).
 * LM_ERR_UNSUPPORTED naming the regex when PCRE2 cannot compile it. */
lm_status lm_pretok_create_regexes(const lm_strview *re, uint32_t n, lm_pretok **out);
/* The kind whose regex list is exactly re[0..n), if any (preferring the common names). */
bool lm_pretok_kind_of(const lm_strview *re, uint32_t n, lm_pre_kind *kind);
/* lumen's spelling of a pre-tokenizer regex as tokenizer.json writes it (the GPT-2,
 * Llama 3, Qwen2, Qwen3.5 patterns), NULL if it is not one of those. */
const char *lm_pretok_known_pattern(const char *hf, size_t len);
/* The regexes of a kind as lumen spells them (PCRE2), at most LM_PRE_MAX_REGEX, in
 * order; returns how many (for writing the pre-tokenizer into a tokenizer.json). */
int lm_pretok_kind_regexes(lm_pre_kind kind, const char **re);
void lm_pretok_free(lm_pretok *p);
/* Splits text[0..len) into words (spans, in order, covering all of the text). */
lm_status lm_pretok_split(const lm_pretok *p, const char *text, size_t len, lm_spanvec *out);

/* ---- models ---- */

/* Appends the tokens of one raw-text fragment. BPE keeps a per-call cache of the words it
 * has merged (*cache: NULL at first, allocated on demand, freed by the caller with
 * lm_bpe_cache_free once the whole text is done); words repeat, merging is the cost. */
typedef struct lm_bpe_cache lm_bpe_cache;
lm_status lm_bpe_encode(const lm_vocab *v, const char *text, size_t len, lm_bpe_cache **cache,
                        lm_ivec *out);
void lm_bpe_cache_free(lm_bpe_cache *c);
lm_status lm_spm_encode(const lm_vocab *v, const char *text, size_t len, lm_ivec *out);

/* ---- normalization (normalize.c) ---- */

/* Appends the normalized form of text[0..len) to out. Invalid UTF-8 bytes pass through
 * unchanged between normalized valid runs. LM_ERR_NO_MEMORY only. */
lm_status lm_normalize(lm_norm_kind kind, const char *text, size_t len, lm_bytes *out);

/* ---- tokenizer.json (vocab_hf.c) ---- */

typedef struct lm_tokenizer lm_tokenizer;
/* The from-memory core of lm_tokenizer_from_hf_folder: tokenizer.json text and,
 * optionally (NULL), tokenizer_config.json and generation_config.json texts. `where`
 * names the source in error messages. */
lm_status lm_tokenizer_from_hf_json(const char *tok_json, size_t tok_len, const char *cfg_json,
                                    size_t cfg_len, const char *gen_json, size_t gen_len,
                                    const char *where, lm_tokenizer **out);

/* ---- special tokens (special.c) ---- */

lm_status lm_special_trie_build(lm_vocab *v);
void lm_special_trie_free(lm_special_trie *t);

typedef struct lm_fragment {
    int32_t token;   /* >= 0: a special token; LM_TOKEN_NULL: raw text [off, off+len) */
    size_t off, len;
} lm_fragment;

typedef struct lm_fragvec {
    lm_fragment *v;
    size_t n, cap;
} lm_fragvec;

/* Splits text into raw fragments and special tokens the way llama.cpp does: special
 * tokens longest first, all occurrences, control/unknown tokens only when
 * parse_special (user-defined tokens always). */
lm_status lm_special_partition(const lm_vocab *v, const char *text, size_t len,
                               bool parse_special, lm_fragvec *out);

/* ---- pieces ---- */

typedef struct lm_tokenizer lm_tokenizer;
const lm_vocab *lm_tokenizer_vocab(const lm_tokenizer *tok);

lm_status lm_vocab_build_pieces(lm_vocab *v);

/* GPT-2 byte <-> unicode mapping */
/* UTF-8 of the code point byte b maps to (1 or 2 bytes); returns its length. */
size_t lm_byte_to_utf8(uint8_t b, char out[2]);
/* The byte a code point stands for, -1 if it is not in the mapping. */
int lm_cpt_to_byte(uint32_t cpt);

/* Length of the UTF-8 sequence a lead byte announces (1 for invalid leads). */
static inline size_t lm_utf8_len(uint8_t c) {
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* Length of the character at s[0..n) (n > 0): the announced length when the lead byte is
 * followed by that many continuation bytes, else 1 — so invalid bytes stand alone and
 * survive byte fallback. */
static inline size_t lm_utf8_char_len(const char *s, size_t n) {
    size_t k = lm_utf8_len((uint8_t)s[0]);
    if (k == 1 || k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if (((uint8_t)s[i] & 0xC0) != 0x80) return 1;
    return k;
}

#endif
