/* A loaded model: hyperparameters, weights bound to backend handles, and the file
 * they came from. Immutable after load; shared by any number of sequences. */
#ifndef LM_MODEL_MODEL_H
#define LM_MODEL_MODEL_H

#include "backend/backend.h"
#include "model/hparams.h"

struct lm_gguf;
struct lm_st_folder;

typedef struct lm_layer_weights {
    lm_weight *wq, *wk, *wv, *wo;           /* [n_head*hd x n_embd], [n_kv*hd x n_embd] x2, [n_embd x n_head*hd] */
    lm_weight *w_gate, *w_up, *w_down;      /* [n_ff x n_embd] x2, [n_embd x n_ff]                              */
    float *attn_norm, *ffn_norm;            /* [n_embd] pre-attention / pre-FFN RMSNorm weights                  */
    float *post_attn_norm, *post_ffn_norm;  /* [n_embd] Gemma 3 only                                             */
    float *q_norm, *k_norm;                 /* [head_dim] Gemma 3 only                                           */
    float *bq, *bk, *bv;                    /* [n_head*hd], [n_kv*hd] x2: Qwen2 only                             */
} lm_layer_weights;

typedef enum lm_model_format { LM_FORMAT_GGUF, LM_FORMAT_HF_FOLDER } lm_model_format;

typedef struct lm_model_internal {
    lm_hparams hp;
    lm_model_format format;
    lm_backend *backend;
    struct lm_gguf *gguf;          /* GGUF source (NULL for a folder)        */
    struct lm_st_folder *folder;   /* safetensors source (NULL for GGUF)     */
    lm_weight *tok_embd;           /* [n_vocab x n_embd]                     */
    lm_weight *output;             /* [n_vocab x n_embd]; == tok_embd if tied */
    float *output_norm;            /* [n_embd]                               */
    lm_layer_weights *layers;      /* [n_layer]                              */
    lm_tensor *synthetic;          /* affine tensors assembled from 3 parts  */
    int64_t n_synthetic, cap_synthetic;
    size_t weight_bytes;           /* bytes of all weights in the file        */
    struct lm_forward_state *fwd;  /* activation buffers kept between passes  */
    char *path;
} lm_model_internal;

/* Loads a GGUF file or a Hugging Face folder (config.json + safetensors) onto
 * `backend` (borrowed; must outlive the model). Errors name the file and what was
 * wrong: missing tensor, wrong shape, unknown architecture or type. */
lm_status lm_model_internal_load(const char *path, lm_backend *backend, lm_model_internal **out);
void lm_model_internal_free(lm_model_internal *m);

#endif
