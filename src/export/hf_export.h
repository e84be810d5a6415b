/* GGUF -> a Hugging Face model folder that transformers loads with
 * AutoModelForCausalLM / AutoTokenizer and that Lumen loads back (`lumen convert`):
 *
 *   config.json              architecture and hyperparameters (model/hf_layout.h)
 *   generation_config.json   bos / end-of-generation / pad ids
 *   tokenizer.json           the GGUF vocabulary as a `tokenizers` BPE model
 *   tokenizer_config.json    special tokens, BOS/EOS flags, the chat template
 *                            (tokenizer/tokenizer_export.h)
 *   model.safetensors        every weight in bf16 (or f16/f32), Hugging Face names and
 *                            layout: quantized tensors dequantized, llama Q/K rows put
 *                            back in HF order, Gemma norms stored as w - 1; above
 *                            shard_bytes: model-0000i-of-0000n.safetensors +
 *                            model.safetensors.index.json
 *
 * Weights are streamed a block of rows at a time (memory stays a few MiB whatever the
 * model size). Everything is written into a temporary folder beside OUT_DIR, which is
 * renamed into place at the end; on any failure it is removed and OUT_DIR is as it was.
 * An OUT_DIR that exists and is not empty is refused unless `force` (then it is
 * replaced as a whole; never when it holds the input file). Missing parents of OUT_DIR
 * are created. */
#ifndef LM_EXPORT_HF_EXPORT_H
#define LM_EXPORT_HF_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "lumen.h"

/* After each block of weights: bytes of safetensors data written so far of the total.
 * Returning false cancels (LM_ERR_INVALID_ARG, nothing left behind). */
typedef bool (*lm_hf_export_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

typedef struct lm_hf_export_params {
    int out_dtype;          /* LM_DTYPE_BF16 (default), LM_DTYPE_F16 or LM_DTYPE_F32     */
    uint64_t shard_bytes;   /* largest safetensors file; 0: 4 GiB                        */
    bool force;             /* replace an existing non-empty OUT_DIR                     */
    lm_hf_export_progress_fn progress;
    void *progress_user;
} lm_hf_export_params;

lm_hf_export_params lm_hf_export_default_params(void);

typedef struct lm_hf_export_result {
    char architecture[64];   /* "LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma3ForCausalLM" */
    char gguf_arch[32];      /* general.architecture                                       */
    int64_t n_tensors;
    int n_shards;
    uint64_t weight_bytes;   /* safetensors data bytes                                     */
    int64_t n_vocab;         /* model.vocab entries of tokenizer.json (0: no tokenizer)     */
    int64_t n_added_tokens;
    int64_t n_merges;
    bool has_tokenizer;      /* the GGUF had one; else no tokenizer files are written       */
    bool has_chat_template;
    bool tied_embeddings;
} lm_hf_export_result;

/* Converts `gguf_path` (a file) into `out_dir`. Errors name what was wrong: an unknown
 * architecture or tensor, a tensor type that cannot be dequantized, an unwritable or
 * non-empty OUT_DIR, I/O failures with the path. */
lm_status lm_hf_export(const char *gguf_path, const char *out_dir, const lm_hf_export_params *params,
                       lm_hf_export_result *result);

#endif
