/* libFuzzer target: arbitrary bytes as a compressed adapter. The header reader and the
 * decoder must fail cleanly or restore a valid safetensors file; whatever decodes must
 * re-encode and decode to the same bytes. Decoded sizes are capped at 64 MiB. */
#include "adapters/codec.h"

#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_adapter_info info;
    (void)lm_adapter_info_memory(data, size, &info);
    uint8_t *st = NULL;
    size_t st_len = 0;
    char *cfg = NULL;
    if (lm_adapter_decode_memory(data, size, NULL, (uint64_t)64 << 20, &st, &st_len, &cfg) != LM_OK) {
        if (st || cfg) __builtin_trap(); /* failures leave no output */
        return 0;
    }
    lm_safetensors *sf = NULL;
    if (lm_safetensors_open_memory(st, st_len, &sf) != LM_OK) __builtin_trap();
    lm_safetensors_close(sf);
    uint8_t *z = NULL, *back = NULL;
    size_t z_len = 0, back_len = 0;
    /* a valid file with one shared dtype re-encodes; mixed dtypes may not have been
     * what the fuzzer's header claimed, so encode may refuse them */
    if (lm_adapter_encode_memory(st, st_len, cfg, cfg ? strlen(cfg) : 0, &z, &z_len) == LM_OK) {
        if (lm_adapter_decode_memory(z, z_len, NULL, 0, &back, &back_len, NULL) != LM_OK) __builtin_trap();
        if (back_len != st_len || memcmp(back, st, st_len) != 0) __builtin_trap();
    }
    free(z);
    free(back);
    free(st);
    free(cfg);
    return 0;
}
