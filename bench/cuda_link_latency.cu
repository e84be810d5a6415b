/* What one link of a chain of dependent kernels costs on this GPU, by the way the
 * link is made. A batch-1 decode step is ~200 small kernels, each waiting for the one
 * before it; this measures that wait alone, with nothing else in the kernels but a
 * norm-sized trip (every block reads the whole d-float vector the kernel before it
 * wrote, sums it, and writes its share of the next one).
 *
 * Ways (a chain of K kernels recorded in a CUDA graph, replayed R times):
 *   plain  stream order: a kernel starts when the one before has finished
 *   pdl    programmatic dependent launch: launched early, griddepcontrol.wait
 *   flag   launched early the same way, but the wait is a spin on a counter that the
 *          kernel before increments (release) as each of its blocks finishes
 *   grid   one persistent kernel, its K steps separated by a grid-wide barrier (a
 *          counter in global memory): the floor of any in-kernel synchronization
 *
 * Build and run (on the GPU machine):
 *   nvcc -O3 -arch=sm_90a -o /tmp/link bench/cuda_link_latency.cu && /tmp/link
 * Prints µs a link for each way at 1, 132 and 264 blocks. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_check.cuh"

enum { THREADS = 256, K = 200, REPS = 50, D = 1536 };

/* Every block: sum the whole input vector, then write its share of the output. */
__device__ void link_body(const float *in, float *out) {
    __shared__ float part[THREADS / 32];
    float s = 0.0f;
    for (int j = threadIdx.x; j < D; j += THREADS) s += in[j];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < THREADS / 32; w++) t += part[w];
    int chunk = (D + gridDim.x - 1) / gridDim.x;
    for (int j = blockIdx.x * chunk + threadIdx.x; j < (blockIdx.x + 1) * chunk && j < D; j += THREADS)
        out[j] = in[j] * 0.5f + t * 1e-9f;
}

__global__ void k_plain(const float *in, float *out) { link_body(in, out); }

__global__ void k_pdl(const float *in, float *out) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    link_body(in, out);
}

__device__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* ctr[i - 1]: blocks of the kernel before that are done; this kernel counts itself
 * into ctr[i] and sets ctr[i - 2] back to 0 (every block of kernel i - 1 has read it). */
__global__ void k_flag(const float *in, float *out, unsigned *ctr, int i, unsigned prev_blocks) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    if (threadIdx.x == 0 && i > 0) {
        while (ld_acquire(ctr + i - 1) < prev_blocks) {
        }
        if (blockIdx.x == 0 && i > 1) ctr[i - 2] = 0;
    }
    __syncthreads();
    link_body(in, out);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr + i, 1u);
    }
}

__global__ void k_grid(float *bufs, unsigned *bar) {
    for (int i = 0; i < K; i++) {
        link_body(bufs + (size_t)(i & 1) * D, bufs + (size_t)((i + 1) & 1) * D);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned target = (unsigned)(i + 1) * gridDim.x;
            atomicAdd(bar, 1u);
            while (ld_acquire(bar) < target) {
            }
        }
        __syncthreads();
    }
}

static void launch(cudaStream_t s, bool pdl, void (*kernel)(const float *, float *), int g, const float *in,
                   float *out) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(g);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    if (pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    CK(cudaLaunchKernelEx(&cfg, kernel, in, out));
}

static void launch_flag(cudaStream_t s, int g, const float *in, float *out, unsigned *ctr, int i) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(g);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k_flag, in, out, ctr, i, (unsigned)g));
}

/* µs a link: the graph of the chain replayed REPS times. */
static double time_chain(const char *way, int g, float *bufs, unsigned *ctr) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (way[0] == 'f') CK(cudaMemsetAsync(ctr, 0, (K + 2) * sizeof(unsigned), s));
    if (way[0] == 'g') {
        CK(cudaMemsetAsync(ctr, 0, sizeof(unsigned), s));
        k_grid<<<g, THREADS, 0, s>>>(bufs, ctr);
    } else {
        for (int i = 0; i < K; i++) {
            const float *in = bufs + (size_t)(i & 1) * D;
            float *out = bufs + (size_t)((i + 1) & 1) * D;
            if (way[0] == 'f')
                launch_flag(s, g, in, out, ctr, i);
            else
                launch(s, way[0] == 'p' && way[1] == 'd', way[1] == 'd' ? k_pdl : k_plain, g, in, out);
        }
    }
    CK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; w++) CK(cudaGraphLaunch(exec, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < REPS; r++) CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
    return ms * 1000.0 / REPS / K;
}

int main(void) {
    float *bufs;
    unsigned *ctr;
    CK(cudaMalloc(&bufs, 2 * D * sizeof(float)));
    CK(cudaMemset(bufs, 0, 2 * D * sizeof(float)));
    CK(cudaMalloc(&ctr, (K + 2) * sizeof(unsigned)));
    const char *ways[] = {"plain", "pdl", "flag", "grid"};
    const int grids[] = {1, 132, 264};
    printf("| way | 1 block | 132 blocks | 264 blocks |\n|---|---|---|---|\n");
    for (int w = 0; w < 4; w++) {
        printf("| %s |", ways[w]);
        for (int gi = 0; gi < 3; gi++) printf(" %.2f |", time_chain(ways[w], grids[gi], bufs, ctr));
        printf("\n");
    }
    printf("(µs a link, chains of %d kernels, %d replays, %d threads a block, a %d-float trip a link)\n", K, REPS,
           THREADS, D);
    return 0;
}
