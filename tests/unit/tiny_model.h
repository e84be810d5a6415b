/* Tiny random-weight models of every supported architecture, written with the
 * project's own writers (GGUF and Hugging Face safetensors folders). Random weights
 * exercise every code path of loading and the forward pass and cost nothing to ship.
 *
 * Weights are drawn from a fixed-seed generator, so a (arch, seed) pair always
 * produces the same model. GGUF matrices are stored in a chosen quantized type (or a
 * per-tensor mix, see type_of); vectors (norms, biases) in F32. The same code writes
 * full-size shapes (bench/bench_make_model.c: a Qwen2.5-1.5B-shaped model), so the
 * spec's later fields, zero in the tests, configure what only large models need. */
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
    /* optional (0 / NULL: the tiny defaults) */
    bool tied;          /* qwen2: no output matrix, the embeddings serve (llama, gemma3 always) */
    int n_ctx_train;    /* context_length / max_position_embeddings (0: 512)                  */
    float rope_theta;   /* 0: 1e6 for gemma3, 1e4 otherwise                                   */
    /* per-matrix GGUF type (a quantization mix); NULL: matrix_type for every matrix */
    lm_dtype (*type_of)(const struct tiny_spec *s, const char *gguf_name, int layer);
    /* tiny_build allocates and fills nothing: rows are made one at a time with
     * tiny_lazy_row (a seed per row, so threads can share the work) into t->q */
    bool lazy;
} tiny_spec;

static inline tiny_spec tiny_default(lm_arch arch) {
    tiny_spec s = {.arch = arch, .n_vocab = 256, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                   .head_dim = 16, .n_ff = 128, .matrix_type = LM_DTYPE_Q8_0, .seed = 1234};
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
    int layer;
    float gain; /* multiplies the uniform values (the embeddings: 20) */
    /* optional: the tensor already in its GGUF type (tiny_tensor_type), rows of
     * lm_dtype_row_bytes; the writers use it instead of quantizing again (large
     * models quantize once, in parallel). Freed by tiny_free. */
    uint8_t *q;
} tiny_tensor;

typedef struct tiny_model {
    tiny_spec spec;
    tiny_tensor t[512]; /* 3 + 12 per layer: up to 42 layers */
    int n;
} tiny_model;

static inline void tiny_add(tiny_model *m, uint64_t *rng, const char *gguf, const char *hf, int layer, int64_t ne0,
                     int64_t ne1, bool is_norm) {
    if (m->n >= (int)(sizeof m->t / sizeof m->t[0])) return; /* tiny_build checks the count */
    tiny_tensor *t = &m->t[m->n++];
    t->layer = layer;
    snprintf(t->gguf_name, sizeof t->gguf_name, gguf, layer);
    snprintf(t->hf_name, sizeof t->hf_name, hf, layer);
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->is_norm = is_norm;
    t->gain = 1.0f;
    if (m->spec.lazy) return;
    t->data = malloc(sizeof(float) * (size_t)(ne0 * ne1));
    if (!t->data) return; /* callers check (only full-size models can fail) */
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
    m->t[0].gain = 20.0f; /* embeddings are O(1) */
    for (int64_t i = 0; m->t[0].data && i < d * s.n_vocab; i++) m->t[0].data[i] *= 20.0f;
    tiny_add(m, &rng, "output_norm.weight", "model.norm.weight", 0, d, 1, true);
    if (s.arch == LM_ARCH_QWEN2 && !s.tied) tiny_add(m, &rng, "output.weight", "lm_head.weight", 0, d, s.n_vocab, false);
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
    for (int i = 0; i < m->n; i++) free(m->t[i].data), free(m->t[i].q);
    m->n = 0;
}

/* The GGUF type of a tensor: F32 for vectors, else the spec's mix or matrix_type. */
static inline lm_dtype tiny_tensor_type(const tiny_model *m, const tiny_tensor *t) {
    if (t->ne1 == 1) return LM_DTYPE_F32;
    return m->spec.type_of ? m->spec.type_of(&m->spec, t->gguf_name, t->layer) : m->spec.matrix_type;
}

/* Bytes of a tensor in its GGUF type (the size of t->q). */
static inline size_t tiny_quant_bytes(const tiny_model *m, const tiny_tensor *t) {
    return lm_dtype_row_bytes(tiny_tensor_type(m, t), t->ne0) * (size_t)t->ne1;
}

/* Row r of tensor i of a lazy model, f32 [ne0]: the same distribution as the eager
 * fill, from a generator seeded by (seed, i, r). */
static inline void tiny_lazy_row(const tiny_model *m, int i, int64_t r, float *row) {
    const tiny_tensor *t = &m->t[i];
    uint64_t rng = m->spec.seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1)) ^ (0xD1B54A32D192ED03ULL * (uint64_t)(r + 1));
    tiny_rng(&rng);
    if (t->is_norm)
        tiny_fill(&rng, row, t->ne0, 0.2f, 1.0f);
    else
        tiny_fill(&rng, row, t->ne0, 1.0f / (float)t->ne0 * 3.0f, 0.0f);
    if (t->gain != 1.0f)
        for (int64_t j = 0; j < t->ne0; j++) row[j] *= t->gain;
}

/* One row of GGUF type `qt` as a Hugging Face row of `hf_type` (F32 or BF16): the
 * quantized values decoded (Gemma norms stored as w - 1). rowf: scratch [ne0]. */
static inline void tiny_hf_row(const tiny_model *m, const tiny_tensor *t, const uint8_t *qrow, lm_dtype hf_type,
                               void *out, float *rowf) {
    lm_dequantize_row(tiny_tensor_type(m, t), qrow, rowf, t->ne0);
    if (t->is_norm && m->spec.arch == LM_ARCH_GEMMA3)
        for (int64_t j = 0; j < t->ne0; j++) rowf[j] -= 1.0f;
    lm_quantize_row(hf_type, rowf, out, t->ne0);
}

/* Rows [r0, r1) of tensor i quantized into t->q (allocated by the caller with
 * tiny_quant_bytes) and, when hf is not NULL, written to hf (the whole tensor's
 * buffer) as the Hugging Face rows of hf_type. Threads may make disjoint row ranges.
 * row: scratch of 2 * ne0 floats. */
static inline void tiny_make_rows(const tiny_model *m, int i, int64_t r0, int64_t r1, lm_dtype hf_type, void *hf,
                                  float *row) {
    const tiny_tensor *t = &m->t[i];
    lm_dtype type = tiny_tensor_type(m, t);
    size_t qb = lm_dtype_row_bytes(type, t->ne0), hb = lm_dtype_row_bytes(hf_type, t->ne0);
    for (int64_t r = r0; r < r1; r++) {
        const float *src = t->data ? t->data + r * t->ne0 : row;
        if (!t->data) tiny_lazy_row(m, i, r, row);
        lm_quantize_row(type, src, t->q + (size_t)r * qb, t->ne0);
        if (hf) tiny_hf_row(m, t, t->q + (size_t)r * qb, hf_type, (uint8_t *)hf + (size_t)r * hb, row + t->ne0);
    }
}

static inline const char *tiny_gguf_arch(lm_arch a) { return lm_arch_name(a); }

static inline float tiny_rope_theta(const tiny_spec *s) {
    return s->rope_theta > 0 ? s->rope_theta : s->arch == LM_ARCH_GEMMA3 ? 1e6f : 10000.0f;
}

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
    lm_gguf_writer_set_u32(w, TINY_KEY("context_length"), s->n_ctx_train > 0 ? (uint32_t)s->n_ctx_train : 512);
    lm_gguf_writer_set_u32(w, TINY_KEY("vocab_size"), (uint32_t)s->n_vocab);
    lm_gguf_writer_set_f32(w, TINY_KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    lm_gguf_writer_set_f32(w, TINY_KEY("rope.freq_base"), tiny_rope_theta(s));
    if (s->sliding_window) lm_gguf_writer_set_u32(w, TINY_KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
#undef TINY_KEY
    if (extra) extra(w, user);
    void **bufs = calloc((size_t)m->n, sizeof(void *));
    lm_status st = LM_OK;
    for (int i = 0; i < m->n && st == LM_OK; i++) {
        const tiny_tensor *t = &m->t[i];
        if (skip && strcmp(skip, t->gguf_name) == 0) continue;
        lm_dtype type = tiny_tensor_type(m, t);
        size_t row = lm_dtype_row_bytes(type, t->ne0);
        const void *data = t->q;
        if (!data) {
            bufs[i] = malloc(row * (size_t)t->ne1);
            if (!bufs[i]) {
                st = LM_ERR_NO_MEMORY;
                break;
            }
            for (int64_t r = 0; r < t->ne1; r++)
                lm_quantize_row(type, t->data + r * t->ne0, (uint8_t *)bufs[i] + (size_t)r * row, t->ne0);
            data = bufs[i];
        }
        int64_t ne[2] = {t->ne0, t->ne1};
        st = lm_gguf_writer_add_tensor(w, t->gguf_name, type, t->ne1 == 1 ? 1 : 2, ne, data);
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
 * weights of `st_type` (F32 or BF16; the HF layout: Gemma norms stored as w - 1).
 * Only for architectures whose GGUF and HF layouts share RoPE pairing (qwen2,
 * gemma3). Matrices hold the GGUF file's quantized values decoded, so both files hold
 * the same model (exactly in F32; BF16 rounds them). */
static inline lm_status tiny_write_hf_ex(const tiny_model *m, const char *dir, lm_dtype st_type, void *const *pre) {
    const tiny_spec *s = &m->spec;
    if (st_type != LM_DTYPE_F32 && st_type != LM_DTYPE_BF16) return LM_ERR_INVALID_ARG;
    mkdir(dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return LM_ERR_IO;
    bool qwen2 = s->arch == LM_ARCH_QWEN2, gemma = s->arch == LM_ARCH_GEMMA3;
    const char *type = qwen2 ? "qwen2" : gemma ? "gemma3_text" : "llama";
    const char *cls = qwen2 ? "Qwen2ForCausalLM" : gemma ? "Gemma3ForCausalLM" : "LlamaForCausalLM";
    int n_ctx = s->n_ctx_train > 0 ? s->n_ctx_train : 512;
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d,\n"
            " \"num_hidden_layers\": %d, \"intermediate_size\": %d, \"num_attention_heads\": %d,\n"
            " \"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"%s\",\n"
            " \"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": %.1f,\n"
            " \"tie_word_embeddings\": %s, \"sliding_window\": %d, \"query_pre_attn_scalar\": %d,\n"
            " \"rope_local_base_freq\": 10000.0, \"torch_dtype\": \"%s\", \"use_cache\": true}\n",
            cls, type, s->n_vocab, s->n_embd, s->n_layer, s->n_ff, s->n_head, s->n_head_kv, s->head_dim,
            gemma ? "gelu_pytorch_tanh" : "silu", n_ctx, (double)tiny_rope_theta(s),
            qwen2 && !s->tied ? "false" : "true", qwen2 ? n_ctx : s->sliding_window, s->head_dim,
            st_type == LM_DTYPE_BF16 ? "bfloat16" : "float32");
    fclose(f);
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    void **bufs = calloc((size_t)m->n, sizeof(void *));
    float *rowf = NULL;
    lm_status st = w && bufs ? LM_OK : LM_ERR_NO_MEMORY;
    size_t esz = st_type == LM_DTYPE_BF16 ? 2 : 4;
    for (int i = 0; i < m->n && st == LM_OK; i++) {
        const tiny_tensor *t = &m->t[i];
        const void *data = pre ? pre[i] : NULL;
        if (!data) {
            bufs[i] = malloc(esz * (size_t)(t->ne0 * t->ne1));
            free(rowf);
            rowf = malloc(sizeof(float) * (size_t)t->ne0);
            lm_dtype qt = tiny_tensor_type(m, t);
            size_t row = lm_dtype_row_bytes(qt, t->ne0);
            uint8_t *q = t->q ? NULL : malloc(row);
            if (!bufs[i] || !rowf || (!t->q && !q)) {
                free(q);
                st = LM_ERR_NO_MEMORY;
                break;
            }
            /* the GGUF side holds the quantized values: write exactly those */
            for (int64_t r = 0; r < t->ne1; r++) {
                if (!t->q) lm_quantize_row(qt, t->data + r * t->ne0, q, t->ne0);
                tiny_hf_row(m, t, t->q ? t->q + (size_t)r * row : q, st_type,
                            (uint8_t *)bufs[i] + (size_t)(r * t->ne0) * esz, rowf);
            }
            free(q);
            data = bufs[i];
        }
        int64_t shape[2] = {t->ne1, t->ne0};
        st = t->ne1 == 1 ? lm_safetensors_writer_add(w, t->hf_name, st_type, 1, &shape[1], data)
                         : lm_safetensors_writer_add(w, t->hf_name, st_type, 2, shape, data);
    }
    free(rowf);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == LM_OK) st = lm_safetensors_writer_write(w, path);
    for (int i = 0; bufs && i < m->n; i++) free(bufs[i]);
    free(bufs);
    lm_safetensors_writer_free(w);
    return st;
}

static inline lm_status tiny_write_hf(const tiny_model *m, const char *dir) {
    return tiny_write_hf_ex(m, dir, LM_DTYPE_F32, NULL);
}

#endif
