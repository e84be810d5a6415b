/* One normalized description of a model's shape, read from GGUF keys or config.json.
 * Everything the forward pass needs to know about an architecture that is not a
 * weight lives here, so forward.c is written once for all of them. */
#ifndef LM_MODEL_HPARAMS_H
#define LM_MODEL_HPARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "lumen.h"

typedef enum lm_arch { LM_ARCH_LLAMA, LM_ARCH_QWEN2, LM_ARCH_GEMMA3 } lm_arch;

/* How RoPE pairs dimensions: NORM rotates (2i, 2i+1) (GGUF llama, whose converter
 * permutes Q/K rows); NEOX rotates (i, i + d/2) (Qwen2, Gemma, HF-layout llama). */
typedef enum lm_rope_mode { LM_ROPE_NORM, LM_ROPE_NEOX } lm_rope_mode;

enum { LM_MAX_LAYERS = 512 };

typedef struct lm_hparams {
    lm_arch arch;
    int64_t n_vocab;
    int64_t n_embd;        /* d_model                                  */
    int64_t n_layer;
    int64_t n_head;        /* query heads                              */
    int64_t n_head_kv;     /* key/value heads (GQA when < n_head)      */
    int64_t head_dim;      /* per-head size of q/k/v                   */
    int64_t n_ff;          /* FFN hidden size                          */
    int64_t n_ctx_train;   /* context the model was trained for        */
    int64_t n_rot;         /* dimensions rotated by RoPE (<= head_dim) */
    float rms_eps;
    float rope_theta;          /* RoPE base of global layers              */
    float rope_theta_local;    /* RoPE base of sliding-window layers      */
    float rope_freq_scale;     /* linear RoPE scaling: positions * scale  */
    lm_rope_mode rope_mode;
    float attn_scale;          /* multiplies q·k                          */
    float embd_scale;          /* multiplies token embeddings (Gemma)     */
    int64_t sliding_window;    /* 0: no sliding-window layers             */
    int swa_pattern;           /* every swa_pattern-th layer is global     */
    bool has_qkv_bias;         /* Qwen2                                   */
    bool has_qk_norm;          /* Gemma 3: RMSNorm on q and k per head    */
    bool has_post_norms;       /* Gemma 3: norms after attention and FFN  */
    bool ffn_gelu;             /* gated GELU (tanh) instead of SwiGLU     */
    bool norm_add_one;         /* HF Gemma stores norm weights as w - 1   */
    bool tied_embeddings;      /* output projection is token_embd         */
} lm_hparams;

/* True for layers that attend within a sliding window. */
static inline bool lm_hparams_layer_is_swa(const lm_hparams *hp, int64_t il) {
    return hp->sliding_window > 0 && hp->swa_pattern > 0 && (il + 1) % hp->swa_pattern != 0;
}

const char *lm_arch_name(lm_arch arch);
/* Accepts GGUF names ("llama", "qwen2", "gemma3") and HF model_type / architectures
 * values ("LlamaForCausalLM", "mistral", "Qwen2ForCausalLM", "Gemma3ForCausalLM"...). */
bool lm_arch_from_name(const char *name, lm_arch *out);

struct lm_gguf;
/* Reads `<arch>.*` keys. Errors name the missing or absurd key. */
lm_status lm_hparams_from_gguf(const struct lm_gguf *g, lm_hparams *out);
/* Parses a Hugging Face config.json text (text_config nested for Gemma 3 multimodal). */
lm_status lm_hparams_from_config_json(const char *json, size_t len, lm_hparams *out);
/* Rejects absurd values (zero or negative sizes, heads not dividing, huge dims). */
lm_status lm_hparams_validate(const lm_hparams *hp);

#endif
