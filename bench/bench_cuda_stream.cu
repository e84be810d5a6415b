/* How fast one block per SM streams memory through a shared-memory ring with bulk
 * async copies (cp.async.bulk, an mbarrier per slot): the weight stream of the
 * persistent decode kernel (src/backend/cuda/cuda_decode_step.cu), measured alone.
 *
 *   nvcc -O2 -arch=sm_90a -o bench_cuda_stream bench/bench_cuda_stream.cu
 *   ./bench_cuda_stream [GiB]
 *
 * Each block streams its contiguous share of a buffer (default 3 GiB, about a
 * Qwen2.5-1.5B bf16 step's weights) in chunks through `slots` slots; eight consumer
 * warps wait for each chunk and release it, either at once or after reading every
 * byte from shared memory (as the kernel's dot products do), and optionally a second
 * producer thread requests chunks into L2 ahead of the copies. Prints TB/s per
 * (chunk size, slots, consumers reading, L2 ahead), and for reference a copy kernel
 * with 16-byte loads and cudaMemcpy device to device. Answers how many bytes in
 * flight an SM needs for the memory's full speed, and what the consumers' reads cost.
 * Not built by CMake: a stand-alone tool for the GPU machine. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_bulk.cuh"
#include "cuda_check.cuh"

enum { WARPS = 8, THREADS = 32 * (WARPS + 2), MAX_SLOTS = 32 };

/* grid: one block per SM; block b streams bytes [b * share, (b + 1) * share) */
__global__ void __launch_bounds__(THREADS, 1)
    stream_kernel(const uint8_t *src, size_t share, uint32_t chunk, int slots, int read, int l2_ahead,
                  float *sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint64_t *full = (uint64_t *)smem, *empty = full + MAX_SLOTS;
    volatile unsigned *copied = (volatile unsigned *)(empty + MAX_SLOTS);
    uint8_t *ring = smem + 2 * MAX_SLOTS * 8 + 128;
    if (threadIdx.x == 0) {
        *copied = 0;
        for (int s = 0; s < slots; s++) {
            lm_mbar_init(&full[s], 1);
            lm_mbar_init(&empty[s], WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const uint8_t *base = src + (size_t)blockIdx.x * share;
    const unsigned n = (unsigned)((share + chunk - 1) / chunk);
    if (threadIdx.x == 32 * WARPS) { /* the copies */
        for (unsigned it = 0; it < n; it++) {
            const int s = (int)(it % (unsigned)slots);
            if (it >= (unsigned)slots) lm_mbar_wait(&empty[s], (it / slots - 1) & 1u);
            const uint32_t bytes = (uint32_t)((size_t)(it + 1) * chunk <= share ? chunk : share - (size_t)it * chunk);
            lm_bulk_copy(ring + (size_t)s * chunk, base + (size_t)it * chunk, bytes, &full[s]);
            *copied = it + 1;
        }
        return;
    }
    if (threadIdx.x == 32 * (WARPS + 1)) { /* the L2 requests ahead of the copies */
        if (!l2_ahead) return;
        for (unsigned it = 0; it < n; it++) {
            while (it >= *copied + (unsigned)l2_ahead) __nanosleep(128);
            const uint32_t bytes = (uint32_t)((size_t)(it + 1) * chunk <= share ? chunk : share - (size_t)it * chunk);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + (size_t)it * chunk), "r"(bytes)
                         : "memory");
        }
        return;
    }
    if (threadIdx.x >= 32 * WARPS) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (unsigned it = 0; it < n; it++) {
        const int s = (int)(it % (unsigned)slots);
        lm_mbar_wait(&full[s], (it / slots) & 1u);
        if (read) { /* every 16 bytes of the chunk once, across the warps */
            const uint4 *p = (const uint4 *)(ring + (size_t)s * chunk);
            for (uint32_t v = threadIdx.x; v < chunk / 16; v += 32 * WARPS) {
                const uint4 u = p[v];
                acc += __uint_as_float(u.x) + __uint_as_float(u.y) + __uint_as_float(u.z) + __uint_as_float(u.w);
            }
        }
        __syncwarp();
        if (lane == 0) lm_mbar_arrive(&empty[s]);
    }
    if (acc == 1.2345f) sink[blockIdx.x * WARPS + warp] = acc; /* keeps the reads */
}

__global__ void copy_kernel(const uint4 *src, uint4 *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

int main(int argc, char **argv) {
    const double gib = argc > 1 ? atof(argv[1]) : 3.0;
    int sms = 0, optin = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    const size_t share = ((size_t)(gib * (1 << 30)) / sms) & ~(size_t)4095, total = share * sms;
    uint8_t *buf;
    float *sink;
    CK(cudaMalloc(&buf, total));
    CK(cudaMalloc(&sink, sizeof(float) * sms * WARPS));
    CK(cudaMemset(buf, 1, total));
    CK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%d SMs, %d bytes of shared memory a block, %.2f GiB streamed a run (median of 5)\n", sms, optin,
           (double)total / (1 << 30));
    printf("%8s %6s %10s %6s %9s %8s\n", "chunk", "slots", "in flight", "read", "L2 ahead", "TB/s");
    static const uint32_t chunks[] = {8192, 16384, 24576, 32768, 49152};
    static const int slot_counts[] = {2, 4, 6, 8, 12, 16, 24};
    for (int read = 0; read < 2; read++)
        for (int l2 = 0; l2 <= 8; l2 += 8)
            for (uint32_t chunk : chunks)
                for (int slots : slot_counts) {
                    const size_t smem = 2 * MAX_SLOTS * 8 + 128 + (size_t)slots * chunk;
                    if (smem > (size_t)optin || slots > MAX_SLOTS) continue;
                    float ms[5];
                    for (int r = 0; r < 5; r++) {
                        CK(cudaEventRecord(e0));
                        stream_kernel<<<sms, THREADS, smem>>>(buf, share, chunk, slots, read, l2, sink);
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaGetLastError());
                        CK(cudaEventElapsedTime(&ms[r], e0, e1));
                    }
                    for (int i = 1; i < 5; i++) /* sort for the median */
                        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                            const float t = ms[j];
                            ms[j] = ms[j - 1], ms[j - 1] = t;
                        }
                    printf("%8u %6d %9zuK %6s %9d %8.2f\n", chunk, slots, (size_t)slots * chunk / 1024,
                           read ? "yes" : "no", l2, (double)total / (ms[2] * 1e-3) / 1e12);
                }
    /* references: 16-byte loads and stores over half the buffer each way, and the
     * driver's copy (bytes read + written over time) */
    float ms = 0.0f;
    const size_t half = total / 2 / 16 * 16;
    CK(cudaEventRecord(e0));
    copy_kernel<<<sms * 8, 256>>>((const uint4 *)buf, (uint4 *)(buf + half), half / 16);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("copy kernel, 16-byte loads: %.2f TB/s (read + write)\n", 2.0 * (double)half / (ms * 1e-3) / 1e12);
    CK(cudaEventRecord(e0));
    CK(cudaMemcpy(buf + half, buf, half, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("cudaMemcpy device to device: %.2f TB/s (read + write)\n", 2.0 * (double)half / (ms * 1e-3) / 1e12);
    return 0;
}
