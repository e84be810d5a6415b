/* The order logits_topk ranks candidates in, shared by its general path (cuda_topk.cu)
 * and its k = 1 path (cuda_topk_argmax.cu), so both give the same ids: floats compared
 * through an order-preserving uint32 key (negatives bit-flipped, positives with the
 * sign bit set; -0 keyed as +0 since they compare equal), ties to the lower id. No
 * logit keys to 0, which marks "none". */
#ifndef LM_BACKEND_CUDA_TOPK_CUH
#define LM_BACKEND_CUDA_TOPK_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t order_key(float x) {
    uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Candidate a goes before candidate b. */
__device__ __forceinline__ bool better(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
    return ka > kb || (ka == kb && ia < ib);
}

#endif
