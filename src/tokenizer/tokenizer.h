/* Tokenizers exact to llama.cpp: byte-level BPE (GGUF "gpt2") with the pre-tokenizers
 * named by tokenizer.ggml.pre, and SentencePiece-style BPE with byte fallback (GGUF
 * "llama": Llama 2, Gemma, Phi-3 ...), plus special/user-defined tokens in text,
 * whole and incremental detokenization.
 *
 * Thread safety: a tokenizer is immutable once created; every call below may run
 * concurrently on one tokenizer (scratch memory is per call). A detok stream is
 * single-threaded state.
 *
 * Sizes follow "returns the needed size": functions that fill a caller's buffer write
 * at most `cap` elements and always set *n_out to the full size needed; the call still
 * returns LM_OK when the buffer was too small — compare *n_out with cap (ids/buf may
 * be NULL when cap is 0, to ask for the size).
 *
 * Known, deliberate differences from llama.cpp:
 *   - invalid UTF-8 in byte-level BPE input is tokenized from its raw bytes
 *     (lossless), where llama.cpp first replaces each bad byte with U+FFFD;
 *   - in SentencePiece-style input a lead byte without its continuation bytes is a
 *     character of its own (so byte fallback keeps every byte), where llama.cpp takes
 *     the announced length whatever follows (and can swallow a following space);
 *   - a BPE token whose text holds a code point outside the GPT-2 byte alphabet
 *     decodes to that code point's UTF-8 rather than llama.cpp's "[UNK_BYTE_..]" text.
 */
#ifndef LM_TOKENIZER_TOKENIZER_H
#define LM_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "tokenizer/vocab.h"

typedef struct lm_tokenizer lm_tokenizer;
typedef struct lm_gguf lm_gguf;

/* ---- creation ---- */

/* From a plain description (see vocab.h); everything is copied. */
lm_status lm_tokenizer_create(const lm_vocab_desc *desc, lm_tokenizer **out);

/* From a GGUF file's tokenizer.ggml.* metadata (tokenizer/vocab_gguf.c):
 * tokenizer.ggml.model "gpt2" or "llama", tokens, scores, token_type, merges, pre,
 * bos/eos/unknown/padding/seperator/eot/eom ids, add_bos_token/add_eos_token/
 * add_sep_token/add_space_prefix, general.name. LM_ERR_NOT_FOUND if the file has no
 * tokenizer, LM_ERR_UNSUPPORTED for other models ("bert", "t5", "rwkv", ...) or an
 * unknown pre-tokenizer, LM_ERR_FORMAT for malformed metadata. The tokenizer does not
 * borrow from `g`. */
lm_status lm_tokenizer_from_gguf(const lm_gguf *g, lm_tokenizer **out);

/* From a Hugging Face tokenizer folder (tokenizer/vocab_hf.c): tokenizer.json (model BPE:
 * byte-level with the ByteLevel pre-tokenizer/decoder, or SentencePiece-style with
 * byte_fallback and the Metaspace / Replace(" ", "\u2581") / Prepend normalizers;
 * pre-tokenizers Sequence, Split (regex, "Isolated"), Digits, ByteLevel; normalizers NFC,
 * NFD, NFKC, NFKD; added_tokens), plus tokenizer_config.json (bos/eos/unk/pad tokens,
 * add_bos_token/add_eos_token, added_tokens_decoder, clean_up_tokenization_spaces) and
 * generation_config.json (eos_token_id: more end-of-generation ids) when present.
 * Added tokens marked special, or that look like control markers ("<|...|>"), are control
 * tokens (matched in text only with parse_special); the others are user-defined (always
 * matched), as llama.cpp's converter types them, so a folder and its GGUF conversion
 * tokenize alike. LM_ERR_NOT_FOUND without tokenizer.json, LM_ERR_UNSUPPORTED naming the
 * component for other kinds (WordPiece, Unigram, an unknown pre-tokenizer ...),
 * LM_ERR_FORMAT for malformed files.
 * Known differences from Hugging Face `tokenizers`: added tokens are matched longest
 * first (llama.cpp's rule) rather than leftmost-longest; their single_word and
 * normalized flags are ignored (always matched in the raw text); Metaspace
 * prepend_scheme "first" adds the space after special tokens too; decode follows
 * llama.cpp (a removed BOS keeps the first piece's space). Tested exactly against
 * `tokenizers` on the three real models' vocabularies (tests/unit/test_tokenizer_models.c). */
lm_status lm_tokenizer_from_hf_folder(const char *dir, lm_tokenizer **out);

/* The chat template of a Hugging Face folder: chat_template.jinja if present, else
 * tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}
 * from which "default" is taken, else the first). *template_out is malloc'd, NUL
 * terminated; the caller frees it. LM_ERR_NOT_FOUND when the folder has none. */
lm_status lm_chat_template_from_hf_folder(const char *dir, char **template_out);

void lm_tokenizer_free(lm_tokenizer *tok); /* NULL is a no-op */

/* ---- tokenize ---- */

/* Tokenizes text[0..len) (any bytes; need not be NUL-terminated or valid UTF-8).
 * add_special: add BOS/EOS as the model asks (tokenizer.ggml.add_bos_token ...).
 * parse_special: control tokens written in the text ("<|im_start|>") become their ids;
 * otherwise they are tokenized as plain text. User-defined tokens are always matched,
 * as in llama.cpp. Writes min(needed, cap) ids; *n_out = needed. */
lm_status lm_tokenizer_encode(const lm_tokenizer *tok, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out);

/* Same, into a malloc'd array the caller frees (*ids is NULL when *n is 0). */
lm_status lm_tokenizer_encode_alloc(const lm_tokenizer *tok, const char *text, size_t len,
                            bool add_special, bool parse_special, int32_t **ids, size_t *n);

/* ---- detokenize ---- */

/* The text of one token: byte-decoded for BPE, U+2581 -> space for SPM, <0xNN> -> that
 * byte. Control and unknown tokens give their text when `special`, else nothing.
 * Borrowed, valid for the tokenizer's lifetime; LM_ERR_INVALID_ARG for a bad id. */
lm_status lm_tokenizer_piece(const lm_tokenizer *tok, int32_t id, bool special,
                             const char **piece, size_t *len);

/* Same into a buffer (needed-size convention). */
lm_status lm_tokenizer_token_to_piece(const lm_tokenizer *tok, int32_t id, bool special, char *buf,
                            size_t cap, size_t *n_out);

/* Text of a token sequence, as llama_detokenize: remove_special drops a leading BOS
 * and a trailing EOS when the model adds them; unparse_special renders control
 * tokens; SPM vocabularies with add_space_prefix drop the first piece's leading
 * space; vocabularies with clean_spaces tidy " ." " ' " " 's" ... The output is raw
 * bytes (a sequence cut inside a character ends in an incomplete UTF-8 sequence). */
lm_status lm_tokenizer_decode(const lm_tokenizer *tok, const int32_t *ids, size_t n,
                        bool remove_special, bool unparse_special, char *buf, size_t cap,
                        size_t *n_out);

/* ---- incremental detokenizer ---- */

/* Turns a token stream into text as it arrives. The concatenation of everything
 * push and finish return equals lm_tokenizer_decode of the whole sequence (same flags).
 * Text is released as soon as it is final: an incomplete UTF-8 sequence at the end
 * (a character split across byte tokens) and, for clean_spaces vocabularies, a
 * trailing " ", " '", " 'r"... whose fate depends on what follows are held back, so
 * push never returns a broken character. Cost is O(bytes of the new token). */
typedef struct lm_detok_stream lm_detok_stream;

lm_status lm_detok_stream_create(const lm_tokenizer *tok, bool remove_special,
                                 bool unparse_special, lm_detok_stream **out);
void lm_detok_stream_free(lm_detok_stream *s); /* NULL is a no-op */
/* Back to the start of a new sequence. */
void lm_detok_stream_reset(lm_detok_stream *s);
/* Adds one token; *text and *len: the newly final text, borrowed until the next call on s. */
lm_status lm_detok_stream_push(lm_detok_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the sequence: returns whatever was held back (possibly an incomplete UTF-8
 * sequence, exactly as lm_tokenizer_decode would end) and resets the stream. */
lm_status lm_detok_stream_finish(lm_detok_stream *s, const char **text, size_t *len);

/* ---- vocabulary facts ---- */

uint32_t lm_tokenizer_n_vocab(const lm_tokenizer *tok);
lm_vocab_model lm_tokenizer_model(const lm_tokenizer *tok);
lm_pre_kind lm_tokenizer_pre(const lm_tokenizer *tok);
/* Special ids; LM_TOKEN_NULL (-1) when the model has none. */
int32_t lm_tokenizer_bos(const lm_tokenizer *tok);
int32_t lm_tokenizer_eos(const lm_tokenizer *tok);
int32_t lm_tokenizer_eot(const lm_tokenizer *tok);
int32_t lm_tokenizer_eom(const lm_tokenizer *tok);
int32_t lm_tokenizer_unk(const lm_tokenizer *tok);
int32_t lm_tokenizer_pad(const lm_tokenizer *tok);
int32_t lm_tokenizer_sep(const lm_tokenizer *tok);
bool lm_tokenizer_add_bos(const lm_tokenizer *tok);
bool lm_tokenizer_add_eos(const lm_tokenizer *tok);
bool lm_tokenizer_add_space_prefix(const lm_tokenizer *tok);
/* End of generation: EOS, EOT, EOM and the end-of-turn markers llama.cpp knows. */
bool lm_tokenizer_is_eog(const lm_tokenizer *tok, int32_t id);
/* The stored text of a token (BPE: byte-encoded form), borrowed; NULL for a bad id. */
const char *lm_tokenizer_token_text(const lm_tokenizer *tok, int32_t id, size_t *len);
float lm_tokenizer_token_score(const lm_tokenizer *tok, int32_t id);
/* LM_TOKEN_ATTR_* bits; 0 for a bad id. */
uint32_t lm_tokenizer_token_attr(const lm_tokenizer *tok, int32_t id);
/* The id whose stored text is exactly text[0..len), LM_TOKEN_NULL if none. */
int32_t lm_tokenizer_find(const lm_tokenizer *tok, const char *text, size_t len);

#endif
