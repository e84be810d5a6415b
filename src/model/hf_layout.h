/* The Hugging Face layout of a model that Lumen read from GGUF: tensor names, the row
 * order of llama Q/K projections, Gemma's norm offset, and config.json written from the
 * hyperparameters in the form transformers (and lm_hparams_from_config_json) reads.
 * Shared by the LoRA fuser (adapters/fuse.c) and `lumen convert` (export/hf_export.c). */
#ifndef LM_MODEL_HF_LAYOUT_H
#define LM_MODEL_HF_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/hparams.h"
#include "tensor/dtype.h"

/* What a GGUF tensor's values need before they are the HF tensor's values. */
typedef enum lm_hf_xform {
    LM_HF_AS_IS,
    LM_HF_UNPERMUTE_Q, /* llama GGUF: rotary halves interleaved by the converter */
    LM_HF_UNPERMUTE_K,
    LM_HF_MINUS_ONE,   /* Gemma norms: GGUF stores w + 1, HF stores w            */
} lm_hf_xform;

/* The HF name of GGUF tensor `gguf_name` ("blk.3.attn_q.weight" ->
 * "model.layers.3.self_attn.q_proj.weight"), the transform its values need, and its
 * layer (-1 for embeddings, output and final norm). LM_ERR_UNSUPPORTED naming the
 * tensor when Lumen knows no HF counterpart; LM_ERR_LIMIT when `cap` is too small. */
lm_status lm_hf_tensor_name(const lm_hparams *hp, const char *gguf_name, char *hf, size_t cap, lm_hf_xform *xf,
                            int *layer);

/* Applies `xf` in place to rows [0, rows) of a [rows x cols] f32 block. Rows of the
 * unpermute transforms must hold whole heads (a multiple of lm_hf_xform_rows). */
lm_status lm_hf_apply_xform(const lm_hparams *hp, lm_hf_xform xf, float *w, int64_t rows, int64_t cols);

/* The number of rows `xf` transforms together: head_dim for the unpermutes, else 1.
 * A tensor can be converted in blocks of any multiple of it. */
int64_t lm_hf_xform_rows(const lm_hparams *hp, lm_hf_xform xf);

/* HF row a*D/2 + i of each head of D = head_rows rows came from GGUF row 2i + a.
 * LM_ERR_FORMAT when rows is not a multiple of head_rows or head_rows is odd. */
lm_status lm_hf_unpermute_rows(float *w, int64_t rows, int64_t cols, int64_t head_rows);

/* What config.json says beyond the hyperparameters. */
typedef struct lm_hf_config_info {
    bool tied;       /* tie_word_embeddings                              */
    lm_dtype dtype;  /* torch_dtype: LM_DTYPE_F32, F16 or BF16            */
    int32_t bos_id;  /* -1: not written                                   */
    int32_t eos_id;  /* -1: not written                                   */
    int32_t pad_id;  /* -1: not written                                   */
} lm_hf_config_info;

/* config.json text (malloc'd, the caller frees): architectures and model_type
 * (LlamaForCausalLM/llama, Qwen2ForCausalLM/qwen2, Gemma3ForCausalLM/gemma3_text),
 * sizes, rope_theta (+ linear rope_scaling), rms_norm_eps, activation, tied
 * embeddings, dtype, special ids; Gemma 3 adds sliding_window, sliding_window_pattern
 * and layer_types, rope_local_base_freq and query_pre_attn_scalar. LM_ERR_UNSUPPORTED
 * for what config.json cannot express (partial rotary dimensions). */
lm_status lm_hf_config_json(const lm_hparams *hp, const lm_hf_config_info *info, char **text);

/* The shortest decimal that reads back as the same float, so JSON says 1e-05, not
 * 9.99999974737875e-06. */
double lm_hf_short_float(float v);

#endif
