/* Tiny random-weight models of every supported architecture, written with the
 * project's own writers (GGUF and Hugging Face safetensors folders). Random weights
 * exercise every code path of loading and the forward pass and cost nothing to ship.
 *
 * Weights are drawn from a fixed-seed generator, so a (arch, seed) pair always
 * produces the same model. GGUF matrices are stored in a chosen quantized type;
 * vectors (norms, biases) in F32. */
#ifndef LM_TEST_TINY_MODEL_H
#define LM_TEST_TINY_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/hparams.h"
#include "tensor/quant.h"

typedef struct tiny_spec {
    lm_arch arch;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, sliding_window;
    lm_dtype matrix_type; /* GGUF type of the weight matrices */
    uint64_t seed;
} tiny_spec;

static inline tiny_spec tiny_default(lm_arch arch) {
    tiny_spec s = {arch, 256, 64, 2, 4, 2, 16, 128, 0, LM_DTYPE_Q8_0, 1234};
    if (arch == LM_ARCH_GEMMA3) {
        s.n_layer = 6;       /* five sliding-window layers and one global */
        s.head_dim = 32;     /* head_dim * n_head != n_embd, as in Gemma 3  */
        s.sliding_window = 8;
        s.n_head_kv = 1;
    }
    return s;
}

static inline uint64_t tiny_rng(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = *s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* uniform in [-scale, scale) */
static inline void tiny_fill(uint64_t *rng, float *dst, int64_t n, float scale, float offset) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = offset + scale * ((float)(tiny_rng(rng) >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

typedef struct tiny_tensor {
    char gguf_name[96], hf_name[128];
    int64_t ne0, ne1; /* ne1 = 1 for vectors */
    float *data;
    bool is_norm;
} tiny_tensor;

typedef struct tiny_model {
    tiny_spec spec;
    tiny_tensor t[256];
    int n;
} tiny_model;

static inline void tiny_add(tiny_model *m, uint64_t *rng, const char *gguf, const char *hf, int layer, int64_t ne0,
                     int64_t ne1, bool is_norm) {
    tiny_tensor *t = &m->t[m->n++];
    snprintf(t->gguf_name, sizeof t->gguf_name, gguf, layer);
    snprintf(t->hf_name, sizeof t->hf_name, hf, layer);
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->is_norm = is_norm;
    t->data = malloc(sizeof(float) * (size_t)(ne0 * ne1));
    if (is_norm)
        tiny_fill(rng, t->data, ne0 * ne1, 0.2f, 1.0f);
    else
        tiny_fill(rng, t->data, ne0 * ne1, 1.0f / (float)ne0 * 3.0f, 0.0f);
}

static inline void tiny_build(tiny_model *m, tiny_spec s) {
    memset(m, 0, sizeof *m);
    m->spec = s;
    uint64_t rng = s.seed;
    int64_t d = s.n_embd, q = (int64_t)s.n_head * s.head_dim, kv = (int64_t)s.n_head_kv * s.head_dim;
    bool gemma = s.arch == LM_ARCH_GEMMA3;
    tiny_add(m, &rng, "token_embd.weight", "model.embed_tokens.weight", 0, d, s.n_vocab, false);
    for (int64_t i = 0; i < d * s.n_vocab; i++) m->t[0].data[i] *= 20.0f; /* embeddings are O(1) */
    tiny_add(m, &rng, "output_norm.weight", "model.norm.weight", 0, d, 1, true);
    if (s.arch == LM_ARCH_QWEN2) tiny_add(m, &rng, "output.weight", "lm_head.weight", 0, d, s.n_vocab, false);
    for (int il = 0; il < s.n_layer; il++) {
        tiny_add(m, &rng, "blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", il, d, 1, true);
        tiny_add(m, &rng, "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", il, d, q, false);
        tiny_add(m, &rng, "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", il, d, kv, false);
        tiny_add(m, &rng, "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", il, d, kv, false);
        tiny_add(m, &rng, "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", il, q, d, false);
        if (s.arch == LM_ARCH_QWEN2) {
            tiny_add(m, &rng, "blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", il, q, 1, false);
            tiny_add(m, &rng, "blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", il, kv, 1, false);
            tiny_add(m, &rng, "blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", il, kv, 1, false);
        }
        if (gemma) {
            tiny_add(m, &rng, "blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", il, s.head_dim, 1,
                     true);
            tiny_add(m, &rng, "blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", il, s.head_dim, 1,
                     true);
            tiny_add(m, &rng, "blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight",
                     il, d, 1, true);
            tiny_add(m, &rng, "blk.%d.ffn_norm.weight", "model.layers.%d.pre_feedforward_layernorm.weight", il, d, 1,
                     true);
            tiny_add(m, &rng, "blk.%d.post_ffw_norm.weight", "model.layers.%d.post_feedforward_layernorm.weight", il,
                     d, 1, true);
        } else {
            tiny_add(m, &rng, "blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", il, d, 1,
                     true);
        }
        tiny_add(m, &rng, "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", il, d, s.n_ff, false);
        tiny_add(m, &rng, "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", il, d, s.n_ff, false);
        tiny_add(m, &rng, "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", il, s.n_ff, d, false);
    }
}

static inline void tiny_free(tiny_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    m->n = 0;
}

static inline const char *tiny_gguf_arch(lm_arch a) { return lm_arch_name(a); }

/* Writes the model as GGUF. `skip` names a tensor to leave out (bad-input tests);
 * `extra`, if not NULL, adds metadata (a tokenizer, a chat template) to the writer. */
static inline lm_status tiny_write_gguf_ex(const tiny_model *m, const char *path, const char *skip,
                                    void (*extra)(lm_gguf_writer *w, void *user), void *user) {
    const tiny_spec *s = &m->spec;
    lm_gguf_writer *w = lm_gguf_writer_create();
    const char *arch = tiny_gguf_arch(s->arch);
    char key[128];
    lm_gguf_writer_set_str(w, "general.architecture", arch);
#define TINY_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    lm_gguf_writer_set_u32(w, TINY_KEY("embedding_length"), (uint32_t)s->n_embd);
    lm_gguf_writer_set_u32(w, TINY_KEY("block_count"), (uint32_t)s->n_layer);
    lm_gguf_writer_set_u32(w, TINY_KEY("feed_forward_length"), (uint32_t)s->n_ff);
    lm_gguf_writer_set_u32(w, TINY_KEY("attention.head_count"), (uint32_t)s->n_head);
    lm_gguf_writer_set_u32(w, TINY_KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    lm_gguf_writer_set_u32(w, TINY_KEY("attention.key_length"), (uint32_t)s->head_dim);
    lm_gguf_writer_set_u32(w, TINY_KEY("attention.value_length"), (uint32_t)s->head_dim);
    lm_gguf_writer_set_u32(w, TINY_KEY("context_length"), 512);
    lm_gguf_writer_set_u32(w, TINY_KEY("vocab_size"), (uint32_t)s->n_vocab);
    lm_gguf_writer_set_f32(w, TINY_KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    lm_gguf_writer_set_f32(w, TINY_KEY("rope.freq_base"), s->arch == LM_ARCH_GEMMA3 ? 1e6f : 10000.0f);
    if (s->sliding_window) lm_gguf_writer_set_u32(w, TINY_KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
#undef TINY_KEY
    if (extra) extra(w, user);
    void **bufs = calloc((size_t)m->n, sizeof(void *));
    lm_status st = LM_OK;
    for (int i = 0; i < m->n && st == LM_OK; i++) {
        const tiny_tensor *t = &m->t[i];
        if (skip && strcmp(skip, t->gguf_name) == 0) continue;
        lm_dtype type = t->ne1 == 1 ? LM_DTYPE_F32 : s->matrix_type;
        size_t row = lm_dtype_row_bytes(type, t->ne0);
        bufs[i] = malloc(row * (size_t)t->ne1);
        for (int64_t r = 0; r < t->ne1; r++)
            lm_quantize_row(type, t->data + r * t->ne0, (uint8_t *)bufs[i] + (size_t)r * row, t->ne0);
        int64_t ne[2] = {t->ne0, t->ne1};
        st = lm_gguf_writer_add_tensor(w, t->gguf_name, type, t->ne1 == 1 ? 1 : 2, ne, bufs[i]);
    }
    if (st == LM_OK) st = lm_gguf_writer_write(w, path);
    for (int i = 0; i < m->n; i++) free(bufs[i]);
    free(bufs);
    lm_gguf_writer_free(w);
    return st;
}

static inline lm_status tiny_write_gguf(const tiny_model *m, const char *path, const char *skip) {
    return tiny_write_gguf_ex(m, path, skip, NULL, NULL);
}

/* Writes the model as a Hugging Face folder: config.json + model.safetensors with
 * F32 weights (the HF layout: Gemma norms stored as w - 1). Only for architectures
 * whose GGUF and HF layouts share RoPE pairing (qwen2, gemma3), so both files hold
 * the same model. */
static inline lm_status tiny_write_hf(const tiny_model *m, const char *dir) {
    const tiny_spec *s = &m->spec;
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return LM_ERR_IO;
    const char *type = s->arch == LM_ARCH_QWEN2 ? "qwen2" : s->arch == LM_ARCH_GEMMA3 ? "gemma3_text" : "llama";
    fprintf(f,
            "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d,\n"
            " \"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,\n"
            " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"rope_theta\": %s,\n"
            " \"tie_word_embeddings\": %s, \"sliding_window\": %d, \"query_pre_attn_scalar\": %d,\n"
            " \"rope_local_base_freq\": 10000.0}\n",
            type, s->n_vocab, s->n_embd, s->n_layer, s->n_ff, s->n_head, s->n_head_kv, s->head_dim,
            s->arch == LM_ARCH_GEMMA3 ? "1000000.0" : "10000.0", s->arch == LM_ARCH_QWEN2 ? "false" : "true",
            s->sliding_window, s->head_dim);
    fclose(f);
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    float **bufs = calloc((size_t)m->n, sizeof(float *));
    lm_status st = LM_OK;
    for (int i = 0; i < m->n && st == LM_OK; i++) {
        const tiny_tensor *t = &m->t[i];
        int64_t n = t->ne0 * t->ne1;
        bufs[i] = malloc(sizeof(float) * (size_t)n);
        /* the GGUF side holds the quantized values: write exactly those */
        lm_dtype qt = t->ne1 == 1 ? LM_DTYPE_F32 : s->matrix_type;
        size_t row = lm_dtype_row_bytes(qt, t->ne0);
        uint8_t *q = malloc(row);
        for (int64_t r = 0; r < t->ne1; r++) {
            lm_quantize_row(qt, t->data + r * t->ne0, q, t->ne0);
            lm_dequantize_row(qt, q, bufs[i] + r * t->ne0, t->ne0);
        }
        free(q);
        if (t->is_norm && s->arch == LM_ARCH_GEMMA3)
            for (int64_t j = 0; j < n; j++) bufs[i][j] -= 1.0f;
        int64_t shape[2] = {t->ne1, t->ne0};
        st = t->ne1 == 1 ? lm_safetensors_writer_add(w, t->hf_name, LM_DTYPE_F32, 1, &shape[1], bufs[i])
                         : lm_safetensors_writer_add(w, t->hf_name, LM_DTYPE_F32, 2, shape, bufs[i]);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == LM_OK) st = lm_safetensors_writer_write(w, path);
    for (int i = 0; i < m->n; i++) free(bufs[i]);
    free(bufs);
    lm_safetensors_writer_free(w);
    return st;
}

#endif
