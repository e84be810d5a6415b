/* Asynchronous copies into shared memory: 16-byte ones (the attention's and the
 * matrix-vector kernel's staging), and mbarriers with bulk copies (Hopper), as the
 * persistent decode kernel (cuda_decode_step.cu) and its stream benchmark
 * (bench/bench_cuda_stream.cu) use them: a producer arrives on a slot's barrier with
 * the bytes to expect and starts the copy, whose completion counts them down;
 * consumers wait on the barrier's phase parity; and bulk requests into L2 (the decode
 * kernel's). Depends on the CUDA runtime headers only. */
#pragma once

#include <stdint.h>

__device__ __forceinline__ uint32_t lm_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes from global gmem to shared smem (both 16-byte aligned), asynchronously and
 * past L1; lm_cp_async_wait_all waits for the thread's copies (then a barrier, for
 * the block's) */
__device__ __forceinline__ void lm_cp_async16(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(lm_smem_addr(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void lm_cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* `bytes` (a multiple of 16) of global memory at src (16-byte aligned) requested into
 * L2, nothing waited for (Hopper) */
__device__ __forceinline__ void lm_bulk_prefetch_l2(const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void lm_mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lm_smem_addr(b)), "r"(count) : "memory");
}

/* until the barrier's phase of this parity has completed */
__device__ __forceinline__ void lm_mbar_wait(uint64_t *b, unsigned parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(lm_smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

__device__ __forceinline__ void lm_mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(lm_smem_addr(b)) : "memory");
}

/* bytes from global src into shared dst: the arrival on b with the bytes to expect,
 * then the copy, which completes them */
__device__ __forceinline__ void lm_bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lm_smem_addr(b)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     lm_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(lm_smem_addr(b))
                 : "memory");
}
