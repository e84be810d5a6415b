/* The table of element and block formats. Block sizes and byte counts are those of
 * GGUF (ggml's type traits), so row sizes computed here match GGUF files. */
#include <strings.h>

#include "tensor/dtype.h"

typedef struct dtype_entry {
    int type;
    lm_dtype_info info;
} dtype_entry;

static const dtype_entry k_dtypes[] = {
    {LM_DTYPE_F32, {"F32", 1, 4, false}},
    {LM_DTYPE_F16, {"F16", 1, 2, false}},
    {LM_DTYPE_Q4_0, {"Q4_0", 32, 18, true}},  /* f16 d, 16 B nibbles          */
    {LM_DTYPE_Q4_1, {"Q4_1", 32, 20, true}},  /* f16 d, f16 m, 16 B nibbles   */
    {LM_DTYPE_Q5_0, {"Q5_0", 32, 22, true}},  /* f16 d, 4 B high bits, 16 B   */
    {LM_DTYPE_Q5_1, {"Q5_1", 32, 24, true}},  /* f16 d, f16 m, 4 B, 16 B      */
    {LM_DTYPE_Q8_0, {"Q8_0", 32, 34, true}},  /* f16 d, 32 int8               */
    {LM_DTYPE_Q8_1, {"Q8_1", 32, 36, true}},  /* f16 d, f16 s, 32 int8        */
    {LM_DTYPE_Q2_K, {"Q2_K", 256, 84, true}}, /* 16 scales, 64 qs, d, dmin    */
    {LM_DTYPE_Q3_K, {"Q3_K", 256, 110, true}},/* 32 hmask, 64 qs, 12 sc, d    */
    {LM_DTYPE_Q4_K, {"Q4_K", 256, 144, true}},/* d, dmin, 12 sc, 128 qs       */
    {LM_DTYPE_Q5_K, {"Q5_K", 256, 176, true}},/* d, dmin, 12 sc, 32 qh, 128 qs*/
    {LM_DTYPE_Q6_K, {"Q6_K", 256, 210, true}},/* 128 ql, 64 qh, 16 sc, d      */
    {LM_DTYPE_Q8_K, {"Q8_K", 256, 292, true}},/* f32 d, 256 int8, 16 int16    */
    {LM_DTYPE_I8, {"I8", 1, 1, false}},
    {LM_DTYPE_I16, {"I16", 1, 2, false}},
    {LM_DTYPE_I32, {"I32", 1, 4, false}},
    {LM_DTYPE_I64, {"I64", 1, 8, false}},
    {LM_DTYPE_F64, {"F64", 1, 8, false}},
    {LM_DTYPE_BF16, {"BF16", 1, 2, false}},
    {LM_DTYPE_U8, {"U8", 1, 1, false}},
    {LM_DTYPE_U16, {"U16", 1, 2, false}},
    {LM_DTYPE_U32, {"U32", 1, 4, false}},
    {LM_DTYPE_U64, {"U64", 1, 8, false}},
    {LM_DTYPE_BOOL, {"BOOL", 1, 1, false}},
    /* one uint32 word of 4-bit data; the real sizes come from lm_affine_row_bytes */
    {LM_DTYPE_AFFINE, {"AFFINE", 8, 4, true}},
};

enum { N_DTYPES = (int)(sizeof k_dtypes / sizeof k_dtypes[0]) };

const lm_dtype_info *lm_dtype_get_info(int type) {
    for (int i = 0; i < N_DTYPES; i++)
        if (k_dtypes[i].type == type) return &k_dtypes[i].info;
    return NULL;
}

const char *lm_dtype_name(int type) {
    const lm_dtype_info *info = lm_dtype_get_info(type);
    return info ? info->name : "unknown";
}

bool lm_dtype_from_name(const char *name, lm_dtype *out) {
    if (!name) return false;
    for (int i = 0; i < N_DTYPES; i++) {
        /* case-insensitive: tools write both "Q4_K" and "q4_k" */
        if (strcasecmp(name, k_dtypes[i].info.name) == 0) {
            if (out) *out = (lm_dtype)k_dtypes[i].type;
            return true;
        }
    }
    return false;
}

size_t lm_dtype_row_bytes(lm_dtype type, int64_t n) {
    const lm_dtype_info *info = lm_dtype_get_info((int)type);
    if (!info || n < 0 || n % info->block_size != 0) return 0;
    uint64_t blocks = (uint64_t)(n / info->block_size);
    if (blocks > SIZE_MAX / info->block_bytes) return 0;
    return (size_t)blocks * info->block_bytes;
}

size_t lm_affine_row_bytes(int bits, int64_t n) {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 6 && bits != 8) return 0;
    if (n < 0 || n > INT64_MAX / 8) return 0;
    /* whole uint32 words per row: n * bits a multiple of 32 */
    if ((n * bits) % 32 != 0) return 0;
    return (size_t)(n * bits / 8);
}
