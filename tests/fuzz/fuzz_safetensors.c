/* libFuzzer target: parse arbitrary bytes as a safetensors file, then touch every
 * tensor's first and last byte and every metadata pair. */
#include "formats/safetensors.h"

#include <string.h>

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_safetensors *st = NULL;
    if (lm_safetensors_open_memory(data, size, &st) != LM_OK) return 0;
    for (int64_t i = 0; i < lm_safetensors_n_tensors(st); i++) {
        const lm_tensor *t = lm_safetensors_tensor(st, i);
        if (lm_safetensors_find_tensor(st, t->name) != t) __builtin_trap();
        if (t->n_dims < 0 || t->n_dims > LM_MAX_DIMS) __builtin_trap();
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
        sink += (uint64_t)lm_tensor_nelements(t);
    }
    for (int64_t i = 0; i < lm_safetensors_n_metadata(st); i++) {
        const char *k = lm_safetensors_metadata_key(st, i);
        const char *v = lm_safetensors_metadata_value(st, i);
        if (lm_safetensors_metadata(st, k) != v) __builtin_trap();
        sink += strlen(k) + strlen(v);
    }
    lm_safetensors_close(st);
    return 0;
}
