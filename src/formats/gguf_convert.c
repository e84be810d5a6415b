#include "formats/gguf_convert.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "tensor/quant.h"

/* GGUF general.file_type values ("mostly F32 / F16") */
enum { FILE_TYPE_ALL_F32 = 0, FILE_TYPE_MOSTLY_F16 = 1 };

static lm_status convert_tensor(const lm_tensor *t, lm_dtype type, void **out) {
    int64_t n = lm_tensor_nelements(t), row = t->ne[0];
    size_t bytes = (size_t)n * (type == LM_DTYPE_F32 ? 4 : 2);
    *out = malloc(bytes ? bytes : 1);
    float *tmp = type == LM_DTYPE_F16 ? malloc((size_t)row * sizeof(float)) : NULL;
    if (!*out || (type == LM_DTYPE_F16 && !tmp)) {
        free(*out), free(tmp);
        *out = NULL;
        return lm_error(LM_ERR_NO_MEMORY, "out of memory converting %s", t->name);
    }
    size_t src_row = lm_dtype_row_bytes(t->type, row);
    for (int64_t r = 0; row > 0 && r < n / row; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * src_row;
        if (type == LM_DTYPE_F32) {
            lm_dequantize_row(t->type, src, (float *)*out + r * row, row);
        } else {
            lm_dequantize_row(t->type, src, tmp, row);
            uint16_t *dst = (uint16_t *)*out + r * row;
            for (int64_t i = 0; i < row; i++) dst[i] = lm_f32_to_f16(tmp[i]);
        }
    }
    free(tmp);
    return LM_OK;
}

static bool convertible(lm_dtype t) {
    const lm_dtype_info *info = lm_dtype_get_info(t);
    return info && (info->quantized || t == LM_DTYPE_F16 || t == LM_DTYPE_BF16 || t == LM_DTYPE_F32);
}

lm_status lm_gguf_convert_file(const char *in_path, const char *out_path, lm_dtype type,
                               lm_convert_progress_fn progress, void *user) {
    if (type != LM_DTYPE_F32 && type != LM_DTYPE_F16)
        return lm_error(LM_ERR_UNSUPPORTED, "conversion to %s is not supported (F32 or F16)", lm_dtype_name(type));
    lm_gguf *g = NULL;
    lm_status st = lm_gguf_open(in_path, &g);
    if (st) return st;
    lm_gguf_writer *w = lm_gguf_writer_create();
    int64_t n = lm_gguf_n_tensors(g);
    void **bufs = calloc((size_t)(n > 0 ? n : 1), sizeof *bufs);
    if (!w || !bufs) {
        st = lm_error(LM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < lm_gguf_n_kv(g) && st == LM_OK; i++) {
        const char *key = lm_gguf_kv_key(g, i);
        if (strcmp(key, "general.file_type") == 0) continue;
        lm_gguf_type vt;
        const void *bytes;
        size_t size;
        st = lm_gguf_kv_raw(g, i, &vt, &bytes, &size);
        if (st == LM_OK) st = lm_gguf_writer_set_raw(w, key, vt, bytes, size);
    }
    if (st == LM_OK)
        st = lm_gguf_writer_set_u32(w, "general.file_type",
                                    type == LM_DTYPE_F32 ? FILE_TYPE_ALL_F32 : FILE_TYPE_MOSTLY_F16);
    for (int64_t i = 0; i < n && st == LM_OK; i++) {
        const lm_tensor *t = lm_gguf_tensor(g, i);
        /* 1-D tensors (norms, biases) stay F32 as every GGUF keeps them */
        lm_dtype out_type = t->n_dims <= 1 && t->type == LM_DTYPE_F32 ? LM_DTYPE_F32 : type;
        const void *data = t->data;
        if (convertible(t->type) && t->type != out_type) {
            if ((st = convert_tensor(t, out_type, &bufs[i]))) break;
            data = bufs[i];
        } else {
            out_type = t->type;
        }
        st = lm_gguf_writer_add_tensor(w, t->name, out_type, t->n_dims, t->ne, data);
        if (st == LM_OK && progress && !progress(i + 1, n, user))
            st = lm_error(LM_ERR_INVALID_ARG, "conversion of %s cancelled", in_path);
    }
    if (st == LM_OK) st = lm_gguf_writer_write(w, out_path);
done:
    if (bufs)
        for (int64_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    lm_gguf_writer_free(w);
    lm_gguf_close(g);
    return st;
}
