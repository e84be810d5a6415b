/* LoRA adapters in the two common layouts, read into one description: for each
 * adapted weight (layer, projection), the factors A [r x in] and B [out x r] and the
 * scale, so that the adapted weight is W' = W + scale * B·A (W is [out x in], the
 * Hugging Face orientation of a linear layer's weight).
 *
 *   MLX  (adapters.safetensors): "<...>.layers.N.<...>.q_proj.lora_a" shape [in, r],
 *        "...lora_b" shape [r, out]; adapter_config.json {"lora_parameters":
 *        {"rank": r, "scale": s, "keys": [...]}, "num_layers": n}; ΔW = s * (a·b)^T.
 *        ("alpha" instead of "scale" means s = alpha / rank.)
 *   PEFT (adapter_model.safetensors): "<...>.layers.N.<...>.q_proj.lora_A.weight"
 *        shape [r, in], "...lora_B.weight" shape [out, r]; adapter_config.json {"r",
 *        "lora_alpha", "target_modules", "use_rslora"}; ΔW = alpha / r * B·A
 *        (alpha / sqrt(r) with use_rslora).
 *
 * Supported projections: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (the
 * linear layers of llama, qwen2 and gemma3). Anything else named as a target or found
 * as a tensor is an "unknown target module" error naming it; factors whose shapes
 * disagree with each other, the config's rank, or (at fuse time) the base weight are
 * errors naming the tensors and shapes. Factor dtypes: F32, F16, BF16. */
#ifndef LM_ADAPTERS_LORA_H
#define LM_ADAPTERS_LORA_H

#include <stdint.h>

#include "formats/safetensors.h"
#include "lumen.h"

typedef enum lm_lora_module {
    LM_LORA_Q, LM_LORA_K, LM_LORA_V, LM_LORA_O, LM_LORA_GATE, LM_LORA_UP, LM_LORA_DOWN, LM_LORA_N_MODULES
} lm_lora_module;

typedef enum lm_lora_layout { LM_LORA_LAYOUT_MLX, LM_LORA_LAYOUT_PEFT } lm_lora_layout;

typedef struct lm_lora_pair {
    int layer;
    lm_lora_module module;
    const lm_tensor *a, *b; /* as stored in the file (orientation per layout) */
    int64_t rank, in, out;
} lm_lora_pair;

typedef struct lm_lora {
    lm_lora_layout layout;
    float scale;
    lm_lora_pair *pairs; /* sorted by (layer, module) */
    int64_t n_pairs;
    int max_layer;       /* highest adapted layer index */
    lm_safetensors *st;
    uint8_t *bytes;      /* the safetensors file, owned */
} lm_lora;

/* "q_proj", ...; and back (false if not one of the seven). */
const char *lm_lora_module_name(lm_lora_module m);
bool lm_lora_module_from_name(const char *name, size_t len, lm_lora_module *out);

/* Takes ownership of `bytes` (malloc'ed safetensors file; freed on failure too) and
 * reads `config_json` (NUL-terminated adapter_config.json text, required). */
lm_status lm_lora_open(uint8_t *bytes, size_t len, const char *config_json, lm_lora **out);
void lm_lora_free(lm_lora *l); /* NULL is a no-op */

/* The pair adapting (layer, module), or NULL. */
const lm_lora_pair *lm_lora_find(const lm_lora *l, int layer, lm_lora_module module);

/* w [out x in], row-major f32: w += scale * B·A. `scratch` must hold
 * (rank * (in + out)) floats. */
void lm_lora_apply(const lm_lora *l, const lm_lora_pair *p, float *w, float *scratch);

#endif
