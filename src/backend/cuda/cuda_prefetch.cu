/* prefetch (backend.h): the next products' weights requested into L2 ahead of them.
 *
 * Why: at batch 1 a layer's attention (~5.5 us on the H200) and the norm after it read
 * almost nothing, and the memory idles through them, while the output projection and
 * the gate/up product after them are bound by reading their weights (gate/up 55 MB of
 * bf16 in 14.6 us). Requested into L2 meanwhile, part of those bytes would arrive
 * under the idle stretch. Earlier attempts that moved weight loads ahead inside the
 * products' own kernels (before their PDL wait) slowed the latency-bound kernel before
 * them: the early blocks sat on its SMs (cuda_matmul.cu). Here a one-warp-a-block
 * kernel on a second stream issues bulk L2 prefetches (cp.async.bulk.prefetch.L2,
 * nothing waited for) and exits.
 *
 * How: the hint forks a second stream from the main one at its current point (an
 * event), so the prefetch kernel starts once the kernels queued before it (the Q/K/V
 * product) are done, and runs beside the attention; pass_end joins the stream back
 * (a recorded pass's graph gets the prefetch kernels as a branch). The forward pass
 * names the rest of the layer (the output projection, gate and up, down) and the next
 * layer's Q/K/V (or the head): weights are requested whole, in order, while
 * LUMEN_CUDA_L2_AHEAD holds them; the first run of equal-sized weights that does not
 * fit (gate and up, read row by row together) shares what is left from their first
 * rows (the rows a product's first blocks read), and the rest are left. A bf16 layer
 * of a 1.5B model is 93.5 MB, more than L2 (50 MB): its budget reaches into gate/up; a
 * Q4_K_M layer is ~28 MB: all of it and the next Q/K/V, for kernels bound by their
 * loads' latency rather than by bandwidth. A hint changes no result: it only reads
 * the weights. Off until measured (LUMEN_CUDA_L2_AHEAD=MiB turns it on); passes of up
 * to mv_max_n_quant tokens only (the GEMMs of larger ones read each weight once per
 * chunk of tokens anyway). */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_internal.cuh"

enum { PF_MAX = 8, PF_PIECE = 64 * 1024, PF_THREADS = 32 };

typedef struct pf_ranges {
    const char *p[PF_MAX];
    unsigned long long bytes[PF_MAX]; /* multiples of 16 */
    int n;
} pf_ranges;

/* Lane i of the grid requests pieces i, i + stride, ... of the ranges in order. */
__global__ void l2_prefetch_kernel(const __grid_constant__ pf_ranges r) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < r.n; k++) {
        const unsigned long long pieces = (r.bytes[k] + PF_PIECE - 1) / PF_PIECE;
        for (; i < pieces; i += stride) {
            const unsigned long long off = i * PF_PIECE, left = r.bytes[k] - off;
            const unsigned size = (unsigned)(left < PF_PIECE ? left : PF_PIECE);
            lm_bulk_prefetch_l2(r.p[k] + off, size);
        }
        i -= pieces; /* the next range's pieces continue the same numbering */
    }
}

static bool side_ready(lm_cuda_backend *cu) {
    if (cu->side) return true;
    if (cudaStreamCreateWithFlags(&cu->side, cudaStreamNonBlocking) != cudaSuccess) goto fail;
    if (cudaEventCreateWithFlags(&cu->side_fork, cudaEventDisableTiming) != cudaSuccess) goto fail;
    if (cudaEventCreateWithFlags(&cu->side_join, cudaEventDisableTiming) != cudaSuccess) goto fail;
    return true;
fail:
    cudaGetLastError();
    lm_cuda_prefetch_free(cu);
    cu->l2_ahead = 0; /* a hint: without its stream, none */
    return false;
}

extern "C" void lm_cuda_prefetch(lm_backend *b, const lm_weight *const *w, int n_w, int64_t n) {
    lm_cuda_backend *cu = lm_cuda(b);
    /* not lm_cuda_enter: a hint between a product and the op it hands off to (the
     * Q/K/V product's pending split, a qkv_finish waiting for its attention) must not
     * flush them */
    if (!cu->l2_ahead || n <= 0 || n > cu->mv_max_n_quant || n_w <= 0 || lm_cuda_replaying(cu) || cu->err)
        return;
    if (!side_ready(cu)) return;
    pf_ranges r;
    memset(&r, 0, sizeof r);
    size_t left = cu->l2_ahead;
    if (n_w > PF_MAX) n_w = PF_MAX;
    for (int k = 0; k < n_w; k++)
        if (!w[k]) n_w = k; /* the list ends at a weight the model lacks */
    for (int k = 0; k < n_w && left >= 16;) {
        const size_t size = (size_t)w[k]->rows * w[k]->row_bytes;
        int run = 1; /* equal-sized weights after it: one product's, read together */
        while (k + run < n_w && (size_t)w[k + run]->rows * w[k + run]->row_bytes == size) run++;
        const bool fits = size * (size_t)run <= left;
        const size_t each = (fits ? size : left / (size_t)run) & ~(size_t)15;
        for (int j = 0; j < run && each; j++) {
            r.p[r.n] = (const char *)w[k + j]->data;
            r.bytes[r.n++] = each;
            left -= each;
        }
        if (!fits) break;
        k += run;
    }
    if (!r.n) return;
    unsigned long long pieces = 0;
    for (int k = 0; k < r.n; k++) pieces += (r.bytes[k] + PF_PIECE - 1) / PF_PIECE;
    const unsigned blocks = (unsigned)((pieces + PF_THREADS - 1) / PF_THREADS);
    if (!lm_cuda_ok(cu, cudaEventRecord(cu->side_fork, cu->stream), "prefetch (fork)") ||
        !lm_cuda_ok(cu, cudaStreamWaitEvent(cu->side, cu->side_fork, 0), "prefetch (fork)"))
        return;
    cu->side_forked = true;
    l2_prefetch_kernel<<<blocks, PF_THREADS, 0, cu->side>>>(r);
    lm_cuda_launched(cu, "l2_prefetch_kernel");
}

void lm_cuda_prefetch_join(lm_cuda_backend *cu) {
    if (!cu->side_forked) return;
    cu->side_forked = false;
    if (lm_cuda_ok(cu, cudaEventRecord(cu->side_join, cu->side), "prefetch (join)"))
        lm_cuda_ok(cu, cudaStreamWaitEvent(cu->stream, cu->side_join, 0), "prefetch (join)");
}

void lm_cuda_prefetch_free(lm_cuda_backend *cu) {
    if (cu->side) cudaStreamSynchronize(cu->side);
    if (cu->side_fork) cudaEventDestroy(cu->side_fork);
    if (cu->side_join) cudaEventDestroy(cu->side_join);
    if (cu->side) cudaStreamDestroy(cu->side);
    cu->side = NULL, cu->side_fork = cu->side_join = NULL;
    cu->side_forked = false;
}
