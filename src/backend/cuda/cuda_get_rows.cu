/* out[i] = row ids[i] of a weight table as f32 (token embeddings): each row decoded
 * with the same deq8 as the matrix kernels, so the values are bit-identical to the
 * CPU reference's lm_dequantize_row. */
#include "backend/cuda/cuda_dequant.cuh"

template <int T>
__global__ void get_rows_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t chunks_per_row,
                                const int32_t *__restrict__ ids, float *__restrict__ out) {
    lm_pdl_enter();
    const int64_t i = blockIdx.x;
    const uint8_t *row = W + (size_t)ids[i] * row_bytes;
    float4 *o = (float4 *)(out + i * chunks_per_row * 8);
    for (int64_t c = threadIdx.x; c < chunks_per_row; c += blockDim.x) {
        float v[8];
        deq8<T>(row, c, v);
        o[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
        o[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

template <int T>
static void launch(lm_cuda_backend *cu, const lm_weight *table, const int32_t *ids, int64_t n, float *out) {
    const int64_t max_grid = 2147483647LL;
    for (int64_t i0 = 0; i0 < n; i0 += max_grid) {
        int64_t nn = n - i0 < max_grid ? n - i0 : max_grid;
        lm_cuda_launch(cu, get_rows_kernel<T>, (unsigned)nn, 128,
                       (const uint8_t *)table->data, table->row_bytes, table->cols / 8, ids + i0, out + i0 * table->cols);
        if (!lm_cuda_launched(cu, "get_rows_kernel")) return;
    }
}

extern "C" void lm_cuda_get_rows(lm_backend *b, const lm_weight *table, const int32_t *ids, int64_t n, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n <= 0) return;
    if (((uintptr_t)out & 15) != 0) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "get_rows: output at %p is not 16-byte aligned", (void *)out);
        return;
    }
    const int32_t *d_ids = (const int32_t *)lm_cuda_meta_upload(cu, LM_CUDA_META_IDS, ids, (size_t)n * sizeof(int32_t));
    if (!d_ids || lm_cuda_replaying(cu)) return;
    switch (table->type) {
#define LM_X(t) \
    case t: launch<t>(cu, table, d_ids, n, out); break;
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
    default: lm_cuda_fail(cu, LM_ERR_INTERNAL, "get_rows: weight type %s has no CUDA kernel", lm_dtype_name(table->type));
    }
}
