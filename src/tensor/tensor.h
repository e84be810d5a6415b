/* A tensor view: typed, shaped, borrowed bytes (usually inside an mmap'd file). */
#ifndef LM_TENSOR_TENSOR_H
#define LM_TENSOR_TENSOR_H

#include "tensor/dtype.h"

enum { LM_MAX_DIMS = 4 };

typedef struct lm_tensor {
    const char *name;        /* borrowed from the file it came from               */
    lm_dtype type;
    int n_dims;
    int64_t ne[LM_MAX_DIMS]; /* ne[0] is the innermost, contiguous dimension (GGUF
                              * order; safetensors shapes are stored reversed);
                              * unused dims are 1                                  */
    const void *data;        /* borrowed; lifetime of the file or model           */
    size_t nbytes;
    /* LM_DTYPE_AFFINE only: per-group scales and biases, shape [ne[1], ne[0]/group]. */
    const struct lm_tensor *scales, *biases;
    int group_size, bits;
} lm_tensor;

/* Number of elements (product of ne). */
static inline int64_t lm_tensor_nelements(const lm_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < LM_MAX_DIMS; i++) n *= t->ne[i];
    return n;
}

#endif
