/* Test helpers for adapters: random LoRA adapters of real model shapes in the MLX and
 * PEFT layouts (written with the project's safetensors writer), and a reference model
 * that applies an adapter without the fuser: the base loaded as is, with each targeted
 * weight replaced by an f32 copy of W + scale * B·A computed here in double precision
 * (in the base file's own row order, so GGUF llama Q/K deltas are permuted the way
 * the GGUF converter permutes the weights). */
#ifndef LM_TEST_ADAPTER_UTIL_H
#define LM_TEST_ADAPTER_UTIL_H

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adapters/lora.h"
#include "backend/backend.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "tensor/quant.h"

typedef struct lora_shape {
    int n_layer;
    int64_t n_embd, q_dim, kv_dim, n_ff;
} lora_shape;

static const lora_shape k_smollm2_135m = {30, 576, 576, 192, 1536};
static const lora_shape k_gemma3_270m = {18, 640, 1024, 256, 2048};

static inline void lora_dims(lora_shape s, int module, int64_t *in, int64_t *out) {
    switch (module) {
    case LM_LORA_Q: *in = s.n_embd, *out = s.q_dim; break;
    case LM_LORA_K:
    case LM_LORA_V: *in = s.n_embd, *out = s.kv_dim; break;
    case LM_LORA_O: *in = s.q_dim, *out = s.n_embd; break;
    case LM_LORA_GATE:
    case LM_LORA_UP: *in = s.n_embd, *out = s.n_ff; break;
    default: *in = s.n_ff, *out = s.n_embd; break;
    }
}

typedef struct test_lora_pair {
    int layer, module;
    int64_t in, out, rank;
    float *A; /* [rank][in], the values as stored (rounded to the file's dtype) */
    float *B; /* [out][rank] */
} test_lora_pair;

typedef struct test_lora {
    test_lora_pair p[7 * 64];
    int n;
    float scale;
} test_lora;

typedef struct lora_spec {
    lora_shape shape;
    int first_layer, n_layers, rank;
    unsigned modules;      /* bit m: adapt module m */
    lm_dtype dtype;
    bool peft;
    float a_mag, b_mag;    /* uniform ranges of A (times 1/sqrt(in)) and B */
    float scale;
    uint64_t seed;
} lora_spec;

static uint64_t tl_rng(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = *s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static inline float tl_uniform(uint64_t *s) { return (float)(tl_rng(s) >> 40) / (float)(1u << 24) * 2.0f - 1.0f; }

static inline float tl_round(lm_dtype t, float v) {
    if (t == LM_DTYPE_F16) return lm_f16_to_f32(lm_f32_to_f16(v));
    if (t == LM_DTYPE_BF16) return lm_bf16_to_f32(lm_f32_to_bf16(v));
    return v;
}

static inline void tl_free(test_lora *L) {
    for (int i = 0; i < L->n; i++) free(L->p[i].A), free(L->p[i].B);
    L->n = 0;
}

static inline void tl_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Writes dir/adapters.safetensors (MLX) or dir/adapter_model.safetensors (PEFT) with
 * adapter_config.json; fills *L with the stored values. */
static inline lm_status tl_write_adapter(const char *dir, const lora_spec *s, test_lora *L) {
    static const char *const hf[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    mkdir(dir, 0755);
    memset(L, 0, sizeof *L);
    L->scale = s->scale;
    uint64_t rng = s->seed;
    lm_safetensors_writer *w = lm_safetensors_writer_create();
    void *bufs[2 * 7 * 64] = {0};
    int nb = 0;
    size_t es = s->dtype == LM_DTYPE_F32 ? 4 : 2;
    for (int l = s->first_layer; l < s->first_layer + s->n_layers; l++) {
        for (int m = 0; m < 7; m++) {
            if (!(s->modules & (1u << m))) continue;
            test_lora_pair *p = &L->p[L->n++];
            p->layer = l, p->module = m, p->rank = s->rank;
            lora_dims(s->shape, m, &p->in, &p->out);
            int64_t r = p->rank, in = p->in, out = p->out;
            p->A = malloc(sizeof(float) * (size_t)(r * in));
            p->B = malloc(sizeof(float) * (size_t)(out * r));
            float am = s->a_mag / sqrtf((float)in);
            for (int64_t i = 0; i < r * in; i++) p->A[i] = tl_round(s->dtype, am * tl_uniform(&rng));
            for (int64_t i = 0; i < out * r; i++) p->B[i] = tl_round(s->dtype, s->b_mag * tl_uniform(&rng));
            /* file orientation: PEFT A [r][in], B [out][r]; MLX a = A^T [in][r], b = B^T [r][out] */
            uint8_t *fa = malloc(es * (size_t)(r * in)), *fb = malloc(es * (size_t)(out * r));
            for (int64_t k = 0; k < r; k++)
                for (int64_t i = 0; i < in; i++) {
                    size_t idx = s->peft ? (size_t)(k * in + i) : (size_t)(i * r + k);
                    lm_quantize_row(s->dtype, &p->A[k * in + i], fa + idx * es, 1);
                }
            for (int64_t o = 0; o < out; o++)
                for (int64_t k = 0; k < r; k++) {
                    size_t idx = s->peft ? (size_t)(o * r + k) : (size_t)(k * out + o);
                    lm_quantize_row(s->dtype, &p->B[o * r + k], fb + idx * es, 1);
                }
            bufs[nb++] = fa;
            bufs[nb++] = fb;
            char na[160], nbn[160];
            if (s->peft) {
                snprintf(na, sizeof na, "base_model.model.model.layers.%d.%s.lora_A.weight", l, hf[m]);
                snprintf(nbn, sizeof nbn, "base_model.model.model.layers.%d.%s.lora_B.weight", l, hf[m]);
                int64_t sa[2] = {r, in}, sb[2] = {out, r};
                lm_safetensors_writer_add(w, na, s->dtype, 2, sa, fa);
                lm_safetensors_writer_add(w, nbn, s->dtype, 2, sb, fb);
            } else {
                snprintf(na, sizeof na, "model.layers.%d.%s.lora_a", l, hf[m]);
                snprintf(nbn, sizeof nbn, "model.layers.%d.%s.lora_b", l, hf[m]);
                int64_t sa[2] = {in, r}, sb[2] = {r, out};
                lm_safetensors_writer_add(w, na, s->dtype, 2, sa, fa);
                lm_safetensors_writer_add(w, nbn, s->dtype, 2, sb, fb);
            }
        }
    }
    char path[1024], keys[512] = "";
    snprintf(path, sizeof path, "%s/%s", dir, s->peft ? "adapter_model.safetensors" : "adapters.safetensors");
    lm_status st = lm_safetensors_writer_write(w, path);
    lm_safetensors_writer_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    static const char *const short_names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"};
    for (int m = 0; m < 7; m++) {
        if (!(s->modules & (1u << m))) continue;
        size_t n = strlen(keys);
        snprintf(keys + n, sizeof keys - n, "%s\"%s\"", n ? ", " : "", s->peft ? short_names[m] : hf[m]);
    }
    char cfg[1024];
    if (s->peft)
        snprintf(cfg, sizeof cfg,
                 "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %.9g, \"target_modules\": [%s],\n"
                 " \"lora_dropout\": 0.0, \"bias\": \"none\", \"use_rslora\": false, \"task_type\": \"CAUSAL_LM\"}\n",
                 s->rank, (double)(s->scale * (float)s->rank), keys);
    else
        snprintf(cfg, sizeof cfg,
                 "{\"fine_tune_type\": \"lora\", \"num_layers\": %d,\n"
                 " \"lora_parameters\": {\"rank\": %d, \"scale\": %.9g, \"dropout\": 0.0, \"keys\": [%s]}}\n",
                 s->n_layers, s->rank, (double)s->scale, keys);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    tl_write_text(path, cfg);
    return st;
}

/* ---- the reference (unfused) model ----------------------------------------------- */

typedef struct ref_model {
    lm_model_internal *m;
    float *bufs[7 * 512 + 2];
    int n;
} ref_model;

static inline lm_weight **tl_slot(lm_layer_weights *w, int module) {
    lm_weight **s[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return s[module];
}

/* Replaces *slot with an f32 weight: the dequantized base tensor plus the pair's delta
 * (when p is not NULL). Quantized matmuls take an 8-bit-activation path, so the
 * reference dequantizes every matrix, as the fused folder does. */
static inline lm_status ref_replace(ref_model *R, lm_backend *b, const lm_tensor *t, const test_lora_pair *p,
                                    float scale, int64_t permute_heads, lm_weight **slot) {
    int64_t rows = t->ne[1], cols = t->ne[0];
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    size_t rb = lm_dtype_row_bytes(t->type, cols);
    for (int64_t r = 0; r < rows; r++) lm_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, w + r * cols, cols);
    if (p) {
        /* GGUF llama: HF row h*D + a*D/2 + j was stored at GGUF row h*D + 2j + a */
        int64_t D = permute_heads ? rows / permute_heads : 1;
        for (int64_t o = 0; o < rows; o++) {
            int64_t dst = o;
            if (permute_heads) {
                int64_t h = o / D, within = o % D, a = within / (D / 2), j = within % (D / 2);
                dst = h * D + 2 * j + a;
            }
            for (int64_t c = 0; c < cols; c++) {
                double acc = 0;
                for (int64_t k = 0; k < p->rank; k++) acc += (double)p->B[o * p->rank + k] * p->A[k * cols + c];
                w[dst * cols + c] = (float)((double)w[dst * cols + c] + (double)scale * acc);
            }
        }
    }
    lm_tensor nt = {.name = "ref", .type = LM_DTYPE_F32, .n_dims = 2, .ne = {cols, rows, 1, 1}, .data = w,
                    .nbytes = sizeof(float) * (size_t)(rows * cols)};
    lm_weight *nw;
    lm_status st = b->ops->weight_create(b, &nt, &nw);
    if (st) {
        free(w);
        return st;
    }
    b->ops->weight_free(b, *slot);
    *slot = nw;
    R->bufs[R->n++] = w;
    return LM_OK;
}

static inline lm_status ref_load(const char *base, lm_backend *b, const test_lora *L, ref_model *R) {
    static const char *const gg[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    static const char *const hf[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    memset(R, 0, sizeof *R);
    lm_status st = lm_model_internal_load(base, b, &R->m);
    if (st) return st;
    lm_model_internal *m = R->m;
#define REF_FIND(gname, hname) (m->gguf ? lm_gguf_find_tensor(m->gguf, gname) : lm_st_folder_find_tensor(m->folder, hname))
    bool tied = m->output == m->tok_embd;
    const lm_tensor *te = REF_FIND("token_embd.weight", "model.embed_tokens.weight");
    if (!te || (st = ref_replace(R, b, te, NULL, 0, 0, &m->tok_embd))) return st ? st : LM_ERR_FORMAT;
    if (tied) m->output = m->tok_embd;
    else {
        const lm_tensor *to = REF_FIND("output.weight", "lm_head.weight");
        if (!to || (st = ref_replace(R, b, to, NULL, 0, 0, &m->output))) return st ? st : LM_ERR_FORMAT;
    }
    for (int il = 0; il < (int)m->hp.n_layer; il++) {
        for (int mod = 0; mod < 7; mod++) {
            char gname[160], hname[160];
            snprintf(gname, sizeof gname, "blk.%d.%s.weight", il, gg[mod]);
            snprintf(hname, sizeof hname, "model.layers.%d.%s.weight", il, hf[mod]);
            const lm_tensor *t = REF_FIND(gname, hname);
            const test_lora_pair *p = NULL;
            for (int i = 0; i < L->n; i++)
                if (L->p[i].layer == il && L->p[i].module == mod) p = &L->p[i];
            if (!t || (p && (t->ne[0] != p->in || t->ne[1] != p->out))) return LM_ERR_FORMAT;
            bool permute = m->gguf && m->hp.rope_mode == LM_ROPE_NORM && (mod == LM_LORA_Q || mod == LM_LORA_K);
            int64_t heads = permute ? (mod == LM_LORA_Q ? m->hp.n_head : m->hp.n_head_kv) : 0;
            if ((st = ref_replace(R, b, t, p, L->scale, heads, tl_slot(&m->layers[il], mod)))) return st;
        }
    }
#undef REF_FIND
    return LM_OK;
}

static inline void ref_free(ref_model *R) {
    lm_model_internal_free(R->m);
    for (int i = 0; i < R->n; i++) free(R->bufs[i]);
    memset(R, 0, sizeof *R);
}

/* logits of the last token of `tok` */
static inline lm_status tl_logits(const lm_model_internal *m, const int32_t *tok, int n, float *logits) {
    int32_t pos[256], seq[256];
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0;
    lm_kv_cache *kv;
    lm_status st = lm_kv_cache_for_model(m, 256, 1, LM_DTYPE_F32, &kv);
    if (st) return st;
    lm_batch b = {n, tok, pos, seq, NULL};
    st = lm_forward(m, kv, &b, logits);
    lm_kv_cache_free(kv);
    return st;
}

static inline int tl_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int)best;
}

static inline double tl_max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* ---- scratch folders ---------------------------------------------------------------- */

static inline int tl_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline void tl_rm_tree(const char *path) { nftw(path, tl_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Names in `dir` (not . or ..), joined by spaces, sorted is not needed: count only. */
static inline int tl_count_entries(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

#endif
