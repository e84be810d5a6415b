/* Asynchronous copies into shared memory: 16-byte ones (the attention's and the
 * matrix-vector kernel's staging), and mbarriers with bulk copies (Hopper), as the
 * persistent decode kernel (cuda_decode_step.cu), its stream benchmark
 * (bench/bench_cuda_stream.cu) and one token's gate/up product (cuda_matmul_q8.cu)
 * use them: a producer arrives on a slot's barrier with
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

/* The L2 policy of the 8-bit products' weight bytes (cuda_matmul_q8.cu,
 * cuda_matmul_q8h.cu): evicted first. A decode step streams every weight through L2
 * once (1 GB for a 1.5B Q4_K_M model against 50 MB of L2), and under the normal
 * policy that stream evicts what the step reads again: the KV cache (written a step
 * before), the norms' weights and biases. Marked evict-first, the weights displace
 * each other instead. H100 (the H200 was not lent that session), Q4_K_M 1.5B-shaped,
 * batch 1, side by side in three calls: 1,021-1,030 -> 1,034-1,040, 1,018-1,022 ->
 * 1,028-1,037 and 1,024-1,025 -> 1,035-1,038 tokens/s. The bf16 kernel's loads
 * (lm_ld_weights16) under it measured 690 against 692-693 and 686 against 687-688:
 * they keep the normal policy. */
__device__ __forceinline__ uint64_t lm_l2_stream_policy(void) {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* lm_cp_async16 for weight bytes (lm_l2_stream_policy) */
__device__ __forceinline__ void lm_cp_async16_stream(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(lm_smem_addr(smem)), "l"(gmem),
                 "l"(lm_l2_stream_policy())
                 : "memory");
}

/* 16 bytes of weights through L1 (__ldg's load) under lm_l2_stream_policy */
__device__ __forceinline__ uint4 lm_ldg_stream16(const void *p) {
    uint4 u;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p), "l"(lm_l2_stream_policy()));
    return u;
}

__device__ __forceinline__ void lm_cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* The thread's copies requested so far as one group; waiting until at most N of its
 * groups (the latest committed) are still in flight */
__device__ __forceinline__ void lm_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void lm_cp_async_wait_group(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* `bytes` (a multiple of 16) of global memory at src (16-byte aligned) requested into
 * L2, nothing waited for (Hopper) */
__device__ __forceinline__ void lm_bulk_prefetch_l2(const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void lm_mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lm_smem_addr(b)), "r"(count) : "memory");
}

/* after a thread's lm_mbar_init calls: the barriers visible to the bulk copies (the
 * other threads see them after a barrier of the block's) */
__device__ __forceinline__ void lm_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* The barrier's arrival with `bytes` to expect, for the copies that complete them:
 * lm_bulk_copy's own, or several started after it (lm_bulk_copy_stream). */
__device__ __forceinline__ void lm_mbar_arrive_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lm_smem_addr(b)), "r"(bytes)
                 : "memory");
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
    lm_mbar_arrive_expect(b, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     lm_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(lm_smem_addr(b))
                 : "memory");
}

/* bytes of weights from global src into shared dst under lm_l2_stream_policy, their
 * completion counted down on b (whose expected bytes lm_mbar_arrive_expect set) */
__device__ __forceinline__ void lm_bulk_copy_stream(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            lm_smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(lm_smem_addr(b)), "l"(lm_l2_stream_policy())
        : "memory");
}
