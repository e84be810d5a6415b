/* A tokenizer as Hugging Face files: tokenizer.json (a `tokenizers` BPE model) and
 * tokenizer_config.json, written so that both `tokenizers`/transformers and
 * lm_tokenizer_from_hf_folder tokenize exactly as the source tokenizer does.
 *
 *   byte-level BPE ("gpt2" GGUF vocabularies): vocab and merges as they are; the
 *     pre-tokenizer of the vocabulary's kind (tokenizer.ggml.pre) as Split regexes /
 *     Digits followed by ByteLevel; ByteLevel decoder.
 *   SentencePiece-style ("llama" GGUF vocabularies, merged by token score): the
 *     equivalent BPE with byte fallback: every split of a token into two tokens becomes
 *     a merge, ranked by the merged token's score (best first, ties by id); spaces
 *     become U+2581 (Replace normalizer, or Metaspace with prepend_scheme "first" when
 *     the vocabulary adds a space prefix); Replace/ByteFallback/Fuse decoder.
 *   Control and unknown tokens are special added tokens, user-defined ones non-special
 *   added tokens (matched in raw text, never normalized); unused tokens (padding rows,
 *   "<unused0>") stay plain vocabulary entries, so every id keeps its text but none is
 *   matched as a special token (as in the source); a post-processor adds BOS/EOS where
 *   the vocabulary does. Only a token whose text an earlier id already has is left
 *   out (its id stays an added token when it is one).
 *
 * Known limits: a SentencePiece merge whose two candidates tie on score is taken
 * leftmost by the score merger but by rank here (they differ only when two different
 * splits of equal-score tokens compete in one text); user-defined tokens that look like
 * control markers ("<start_of_image>") read back from the files as control tokens. */
#ifndef LM_TOKENIZER_TOKENIZER_EXPORT_H
#define LM_TOKENIZER_TOKENIZER_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct lm_hf_tokenizer_stats {
    int64_t n_vocab;       /* entries of model.vocab                                   */
    int64_t n_added;       /* added_tokens (special and user-defined)                  */
    int64_t n_merges;      /* merges written                                            */
    int64_t n_unused;      /* unused tokens (padding rows, "<unused0>"): plain vocab entries */
    int64_t n_duplicates;  /* ids whose text an earlier id already has (not in vocab)   */
    int64_t n_dropped_merges; /* source merges naming a token that is not in the vocab  */
} lm_hf_tokenizer_stats;

/* The two files' texts (malloc'd, NUL-terminated; the caller frees them).
 * chat_template: written into tokenizer_config.json when not NULL; model_max_length:
 * written when > 0. LM_ERR_UNSUPPORTED for what the format cannot carry (a token that
 * is not valid UTF-8, a custom pre-tokenizer), LM_ERR_NO_MEMORY. stats may be NULL. */
lm_status lm_tokenizer_export_hf(const lm_tokenizer *tok, const char *chat_template, int64_t model_max_length,
                                 char **tokenizer_json, size_t *tokenizer_json_len, char **tokenizer_config_json,
                                 lm_hf_tokenizer_stats *stats);

/* The end-of-generation ids (EOS first when it is one), at most cap; returns how many
 * there are (generation_config.json's eos_token_id). */
size_t lm_tokenizer_eog_ids(const lm_tokenizer *tok, int32_t *ids, size_t cap);

#endif
