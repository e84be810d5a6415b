/* libFuzzer target: parse arbitrary bytes as GGUF, then touch every key, value
 * (recursively through nested arrays) and tensor byte range. */
#include "formats/gguf.h"

#include <string.h>

static volatile uint64_t sink;

static void walk(const lm_gguf_value *v, int depth) {
    uint64_t u;
    int64_t i;
    double f;
    bool b;
    const char *s;
    size_t len;
    if (lm_gguf_value_u64(v, &u) == LM_OK) sink += u;
    if (lm_gguf_value_i64(v, &i) == LM_OK) sink += (uint64_t)i;
    if (lm_gguf_value_f64(v, &f) == LM_OK) sink += f == f;
    if (lm_gguf_value_bool(v, &b) == LM_OK) sink += b;
    if (lm_gguf_value_str(v, &s, &len) == LM_OK) sink += len ? (uint8_t)s[len - 1] + (uint8_t)s[len] : 0;
    lm_gguf_type et;
    uint64_t n;
    const void *data;
    if (lm_gguf_value_arr(v, &et, &n, &data) != LM_OK) return;
    size_t es = lm_gguf_type_size(et);
    if (es && n) sink += ((const uint8_t *)data)[n * es - 1];
    for (uint64_t k = 0; k < n; k++) {
        if (et == LM_GGUF_STRING && lm_gguf_value_arr_str(v, k, &s, &len) == LM_OK && len)
            sink += (uint8_t)s[len - 1];
        if (et == LM_GGUF_ARRAY) walk(lm_gguf_value_arr_item(v, k), depth + 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_gguf *g = NULL;
    if (lm_gguf_open_memory(data, size, &g) != LM_OK) return 0;
    for (int64_t i = 0; i < lm_gguf_n_kv(g); i++) {
        const char *key = lm_gguf_kv_key(g, i);
        sink += strlen(key) + (uint64_t)lm_gguf_kv_type(g, i);
        if (lm_gguf_find_key(g, key) != i) __builtin_trap();
        walk(lm_gguf_kv_value(g, i), 0);
        uint32_t u32;
        float f32;
        const char *s;
        size_t len;
        lm_gguf_type et;
        uint64_t n;
        const void *d;
        (void)lm_gguf_get_u32(g, key, &u32);
        (void)lm_gguf_get_f32(g, key, &f32);
        (void)lm_gguf_get_str(g, key, &s, &len);
        (void)lm_gguf_get_arr(g, key, &et, &n, &d);
        (void)lm_gguf_get_arr_str(g, key, 0, &s, &len);
        (void)lm_gguf_get_arr_arr(g, key, 0, &et, &n, &d);
    }
    for (int64_t i = 0; i < lm_gguf_n_tensors(g); i++) {
        const lm_tensor *t = lm_gguf_tensor(g, i);
        if (lm_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    lm_gguf_close(g);
    return 0;
}
