/* Rewriting a GGUF file with its weights in another type. */
#ifndef LM_FORMATS_GGUF_CONVERT_H
#define LM_FORMATS_GGUF_CONVERT_H

#include "lumen.h"
#include "tensor/dtype.h"

/* Called after each tensor with (done, total) tensor counts; return false to cancel
 * (the call then fails with LM_ERR_INVALID_ARG and writes nothing). */
typedef bool (*lm_convert_progress_fn)(int64_t done, int64_t total, void *user);

/* Writes `out_path`: the metadata of `in_path` unchanged (general.file_type set to
 * match) and every tensor of a floating or block-quantized type converted to `type`
 * (LM_DTYPE_F32 or LM_DTYPE_F16) by exact dequantization (rounded once for F16).
 * Used to build reference models without quantization noise. Atomic: out_path is
 * written under a temporary name and renamed. */
lm_status lm_gguf_convert_file(const char *in_path, const char *out_path, lm_dtype type,
                               lm_convert_progress_fn progress, void *user);

#endif
