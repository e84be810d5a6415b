/* Shared by the `lumen convert` (GGUF -> Hugging Face folder) tests: the reference the
 * converted folder must equal, logits, and tokenizer comparisons.
 *
 * The reference: the GGUF with every tensor dequantized and rounded to bf16 (Gemma
 * norms as the folder holds them: bf16(w - 1) + 1), kept in the GGUF layout (llama Q/K
 * rows stay permuted: rounding is per element, so it commutes with the permutation),
 * written as an F32 GGUF. Loading it runs exactly the weights the folder holds, through
 * the GGUF code path. */
#ifndef LM_TEST_HF_EXPORT_UTIL_H
#define LM_TEST_HF_EXPORT_UTIL_H

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "tensor/quant.h"
#include "tokenizer/tokenizer.h"

static inline bool hx_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static inline float hx_bf16(float x) { return lm_bf16_to_f32(lm_f32_to_bf16(x)); }

/* Writes `out` (F32 GGUF): `in`'s metadata and every tensor as the bf16 folder holds it. */
static inline lm_status hx_write_bf16_reference(const char *in, const char *out) {
    lm_gguf *g = NULL;
    lm_status st = lm_gguf_open(in, &g);
    if (st) return st;
    const char *arch = "";
    size_t arch_len = 0;
    lm_gguf_get_str(g, "general.architecture", &arch, &arch_len);
    bool gemma = arch_len == 6 && memcmp(arch, "gemma3", 6) == 0;
    lm_gguf_writer *w = lm_gguf_writer_create();
    int64_t n = lm_gguf_n_tensors(g);
    float **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
    for (int64_t i = 0; i < lm_gguf_n_kv(g) && !st; i++) {
        lm_gguf_type vt;
        const void *bytes;
        size_t size;
        st = lm_gguf_kv_raw(g, i, &vt, &bytes, &size);
        if (!st) st = lm_gguf_writer_set_raw(w, lm_gguf_kv_key(g, i), vt, bytes, size);
    }
    for (int64_t i = 0; i < n && !st; i++) {
        const lm_tensor *t = lm_gguf_tensor(g, i);
        int64_t ne = lm_tensor_nelements(t), cols = t->ne[0], rows = ne / cols;
        float *f = bufs[i] = malloc(sizeof(float) * (size_t)ne);
        if (!f) {
            st = LM_ERR_NO_MEMORY;
            break;
        }
        size_t rb = lm_dtype_row_bytes(t->type, cols);
        for (int64_t r = 0; r < rows; r++)
            lm_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, f + r * cols, cols);
        bool norm = gemma && hx_ends_with(t->name, "norm.weight");
        for (int64_t k = 0; k < ne; k++) f[k] = norm ? hx_bf16(f[k] - 1.0f) + 1.0f : hx_bf16(f[k]);
        st = lm_gguf_writer_add_tensor(w, t->name, LM_DTYPE_F32, t->n_dims, t->ne, f);
    }
    if (!st) st = lm_gguf_writer_write(w, out);
    for (int64_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    lm_gguf_writer_free(w);
    lm_gguf_close(g);
    return st;
}

/* Logits of the last token of tok[0..n) (F32 KV cache), into logits[n_vocab]. */
static inline lm_status hx_logits(const lm_model_internal *m, const int32_t *tok, int n, float *logits) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0;
    lm_kv_cache *kv = NULL;
    lm_status st = lm_kv_cache_for_model(m, n + 16, 1, LM_DTYPE_F32, &kv);
    lm_batch b = {n, tok, pos, seq, NULL};
    if (!st) st = lm_forward(m, kv, &b, logits);
    lm_kv_cache_free(kv);
    free(pos);
    free(seq);
    return st;
}

static inline double hx_max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

static inline int64_t hx_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Tokenizes text both ways; true when the ids are identical. */
static inline bool hx_same_tokens(const lm_tokenizer *a, const lm_tokenizer *b, const char *text, size_t len,
                                  bool add_special, bool parse_special) {
    int32_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    bool ok = lm_tokenizer_encode_alloc(a, text, len, add_special, parse_special, &ia, &na) == LM_OK &&
              lm_tokenizer_encode_alloc(b, text, len, add_special, parse_special, &ib, &nb) == LM_OK && na == nb &&
              (na == 0 || memcmp(ia, ib, na * sizeof *ia) == 0);
    free(ia);
    free(ib);
    return ok;
}

static inline int hx_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline void hx_rm_tree(const char *path) { nftw(path, hx_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Entries of `dir` whose name contains `needle` (leftover temporary folders). */
static inline int hx_count_named(const char *dir, const char *needle) {
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

static inline bool hx_exists(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

#endif
