/* Writes k, v [n][n_embd_kv] into the paged cache slots of each token's (seq, pos):
 * slot = table[pos / block_size] * block_size + pos % block_size, F16 rounded to
 * nearest even as the CPU reference does, or F32 as is. */
#include "backend/cuda/cuda_internal.cuh"

template <bool F16>
__global__ void kv_store_kernel(const int32_t *__restrict__ meta, int64_t n, int64_t bs, int64_t d,
                                const float *__restrict__ k, const float *__restrict__ v, void *K, void *V) {
    lm_pdl_enter();
    const int64_t t = blockIdx.x;
    const int32_t pos = meta[t], toff = meta[n + t];
    const int64_t slot = (int64_t)meta[toff + pos / bs] * bs + pos % bs;
    const float *kt = k + t * d, *vt = v + t * d;
    for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
        if (F16) {
            ((__half *)K)[slot * d + e] = __float2half_rn(kt[e]);
            ((__half *)V)[slot * d + e] = __float2half_rn(vt[e]);
        } else {
            ((float *)K)[slot * d + e] = kt[e];
            ((float *)V)[slot * d + e] = vt[e];
        }
    }
}

extern "C" void lm_cuda_kv_store(lm_backend *b, lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                                 const float *k, const float *v) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    int64_t n = batch->n_tokens;
    if (n <= 0) return;
    if (kv->backend != b) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "kv_store: the KV cache belongs to another backend");
        return;
    }
    if (n > 2147483647LL) {
        lm_cuda_fail(cu, LM_ERR_LIMIT, "kv_store: %lld tokens in one batch", (long long)n);
        return;
    }
    const int32_t *meta = lm_cuda_attn_meta(cu, kv, batch);
    if (!meta || lm_cuda_replaying(cu)) return;
    int64_t d = kv->n_embd_kv;
    size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * d) * kv->elem_size;
    void *K = (uint8_t *)kv->k + layer_off, *V = (uint8_t *)kv->v + layer_off;
    int threads = d >= 256 ? 256 : 128;
    if (kv->type == LM_DTYPE_F16)
        lm_cuda_launch(cu, kv_store_kernel<true>, (unsigned)n, threads, meta, n, kv->block_size, d, k, v, K, V);
    else
        lm_cuda_launch(cu, kv_store_kernel<false>, (unsigned)n, threads, meta, n, kv->block_size, d, k, v, K, V);
    lm_cuda_launched(cu, "kv_store_kernel");
}
