/* The vocabulary of a tokenizer: token strings, scores and attributes, a hash index
 * from token text to id, BPE merge ranks, special ids and the flags that shape
 * tokenization (add_bos, add_space_prefix, pre-tokenizer kind, ...).
 *
 * A vocabulary is built from a plain in-memory description (lm_vocab_desc) so that
 * every source — GGUF metadata (vocab_gguf.c), later tokenizer.json — only has to fill
 * that struct. The defaults and per-pre-tokenizer settings follow llama.cpp, which is
 * the reference for token ids. A built vocabulary is immutable; all tokenization state
 * lives in per-call scratch, so one vocabulary serves any number of threads.
 */
#ifndef LM_TOKENIZER_VOCAB_H
#define LM_TOKENIZER_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

#define LM_TOKEN_NULL (-1)

/* Largest vocabulary / merge list / token accepted (hostile-input limits). */
#define LM_VOCAB_MAX_TOKENS  (1u << 24)
#define LM_VOCAB_MAX_MERGES  (1u << 24)
#define LM_VOCAB_MAX_TOKEN_LEN (1u << 16)

typedef enum lm_vocab_model {
    LM_VOCAB_BPE = 1, /* byte-level BPE ("gpt2" in GGUF)                           */
    LM_VOCAB_SPM = 2, /* SentencePiece-style score-merging with byte fallback ("llama") */
} lm_vocab_model;

/* Token types as stored in GGUF tokenizer.ggml.token_type. */
enum {
    LM_TOKTYPE_UNDEFINED = 0,
    LM_TOKTYPE_NORMAL = 1,
    LM_TOKTYPE_UNKNOWN = 2,
    LM_TOKTYPE_CONTROL = 3,
    LM_TOKTYPE_USER_DEFINED = 4,
    LM_TOKTYPE_UNUSED = 5,
    LM_TOKTYPE_BYTE = 6,
};

/* Token attributes (bit flags), derived from the type plus per-model rules. */
enum {
    LM_TOKEN_ATTR_UNDEFINED = 0,
    LM_TOKEN_ATTR_UNKNOWN = 1 << 0,
    LM_TOKEN_ATTR_UNUSED = 1 << 1,
    LM_TOKEN_ATTR_NORMAL = 1 << 2,
    LM_TOKEN_ATTR_CONTROL = 1 << 3,
    LM_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    LM_TOKEN_ATTR_BYTE = 1 << 5,
    LM_TOKEN_ATTR_LSTRIP = 1 << 7,
    LM_TOKEN_ATTR_RSTRIP = 1 << 8,
};

/* Pre-tokenizer kinds (the regex sets of pretok.c), named by tokenizer.ggml.pre. */
typedef enum lm_pre_kind {
    LM_PRE_DEFAULT = 0,
    LM_PRE_LLAMA3,
    LM_PRE_DEEPSEEK_LLM,
    LM_PRE_DEEPSEEK_CODER,
    LM_PRE_DEEPSEEK3_LLM,
    LM_PRE_FALCON,
    LM_PRE_MPT,
    LM_PRE_STARCODER,
    LM_PRE_GPT2,
    LM_PRE_REFACT,
    LM_PRE_COMMAND_R,
    LM_PRE_STABLELM2,
    LM_PRE_QWEN2,
    LM_PRE_QWEN35,
    LM_PRE_OLMO,
    LM_PRE_DBRX,
    LM_PRE_SMAUG,
    LM_PRE_PORO,
    LM_PRE_CHATGLM4,
    LM_PRE_VIKING,
    LM_PRE_JAIS,
    LM_PRE_TEKKEN,
    LM_PRE_SMOLLM,
    LM_PRE_CODESHELL,
    LM_PRE_BLOOM,
    LM_PRE_GPT3_FINNISH,
    LM_PRE_EXAONE,
    LM_PRE_CHAMELEON,
    LM_PRE_MINERVA,
    LM_PRE_GPT4O,
    LM_PRE_SUPERBPE,
    LM_PRE_TRILLION,
    LM_PRE_BAILINGMOE,
    LM_PRE_SEED_CODER,
    LM_PRE_HUNYUAN,
    LM_PRE_HUNYUAN_DENSE,
    LM_PRE_GROK2,
    LM_PRE_CUSTOM, /* regexes given by the vocabulary description (tokenizer.json) */
    LM_PRE_COUNT_
} lm_pre_kind;

/* A byte string that is not NUL-terminated. */
typedef struct lm_strview {
    const char *ptr;
    size_t len;
} lm_strview;

/* Special-id fields of lm_vocab_desc use these: an id >= 0 sets the id, LM_TOKEN_NULL
 * says "explicitly none", LM_VOCAB_ID_DEFAULT takes the model's default. */
#define LM_VOCAB_ID_DEFAULT (-2)
/* Tri-state flags: -1 = model default, 0 = false, 1 = true. */

/* Unicode normalization applied to raw text before the model (tokenizer.json). */
typedef enum lm_norm_kind {
    LM_NORM_NONE = 0,
    LM_NORM_NFC,
    LM_NORM_NFD,
    LM_NORM_NFKC,
    LM_NORM_NFKD,
} lm_norm_kind;

#define LM_PRE_MAX_REGEX 8

/* The plain description a vocabulary is built from. Every pointer is borrowed for the
 * duration of lm_vocab_build only (everything is copied). */
typedef struct lm_vocab_desc {
    lm_vocab_model model;
    lm_strview pre;             /* pre-tokenizer name (tokenizer.ggml.pre); empty = default */
    lm_strview name;            /* general.name (a few per-model token attributes key on it) */
    uint32_t n_tokens;
    const lm_strview *tokens;   /* [n_tokens] token texts (BPE: byte-encoded form)         */
    const float *scores;        /* [n_tokens] or NULL (all 0)                               */
    const int32_t *types;       /* [n_tokens] LM_TOKTYPE_* or NULL (all NORMAL)             */
    uint32_t n_merges;
    const lm_strview *merges;   /* [n_merges] "left right", rank = index (BPE only)         */
    const uint32_t *merge_split; /* [n_merges] or NULL: length of "left" in merges[i] (for
                                  * parts holding spaces); NULL: split at the first space
                                  * after the first byte, as llama.cpp does */
    int32_t bos_id, eos_id, unk_id, pad_id, sep_id, eot_id, eom_id; /* LM_VOCAB_ID_DEFAULT... */
    int add_bos, add_eos, add_sep, add_space_prefix; /* tri-state, -1 = default */

    /* Sources other than GGUF (tokenizer.json) also say: */
    int clean_spaces, ignore_merges; /* tri-state, -1 = the pre-tokenizer's default        */
    /* pre_explicit: the pre-tokenizer is the list of regexes below (each splits every
     * piece into matches and the text between them), overriding `pre`; a list equal to
     * a known kind's is reported as that kind, any other is LM_PRE_CUSTOM. */
    bool pre_explicit;
    uint32_t n_pre_regex;       /* <= LM_PRE_MAX_REGEX                                      */
    const lm_strview *pre_regex;
    /* SPM only: merge adjacent symbols by the rank of the pair in `merges` (a BPE model
     * with byte fallback, as tokenizer.json writes SentencePiece vocabularies) instead of
     * by the merged token's score. */
    bool spm_merges;
    lm_norm_kind normalizer;
    /* keep_types: the token types are authoritative (tokenizer.json): the by-text rules
     * (end-of-turn, FIM, "unused" markers) only touch tokens already typed control or
     * user-defined, never ordinary ones. */
    bool keep_types;
    const uint32_t *extra_attr; /* [n_tokens] or NULL: LM_TOKEN_ATTR_LSTRIP/RSTRIP bits to add */
    uint32_t n_extra_eog;       /* more end-of-generation ids (generation_config.json)      */
    const int32_t *extra_eog;
} lm_vocab_desc;

/* Fills `d` with "everything default": ids LM_VOCAB_ID_DEFAULT, flags -1, no tokens. */
void lm_vocab_desc_init(lm_vocab_desc *d, lm_vocab_model model);

typedef struct lm_vocab lm_vocab;

/* Builds a vocabulary. LM_ERR_INVALID_ARG for a malformed description (no tokens, a
 * special id out of range, ...), LM_ERR_UNSUPPORTED for an unknown pre-tokenizer name,
 * LM_ERR_LIMIT over the limits above, LM_ERR_NO_MEMORY. *out is NULL on failure. */
lm_status lm_vocab_build(const lm_vocab_desc *d, lm_vocab **out);
void lm_vocab_free(lm_vocab *v); /* NULL is a no-op */

/* The pre-tokenizer kind and flags for a tokenizer.ggml.pre name; false if unknown. */
bool lm_pre_lookup(const char *name, size_t len, lm_pre_kind *kind, bool *clean_spaces,
                   bool *ignore_merges, bool *add_bos);

#endif
