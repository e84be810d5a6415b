/* logits_topk (backend.h) on the GPU: each logits row reduced on the device to its
 * k best candidates, its max and log-sum-exp, so a decode step copies back k values
 * per sequence instead of the whole vocabulary (152k floats = 600 KB a row).
 *
 * One block per row. Floats are compared through an order-preserving uint32 key
 * (negatives bit-flipped, positives with the sign bit set; -0 keyed as +0 since they
 * compare equal), so the k-th largest value is found by a radix select: three
 * histogram passes over the row on 11, 11 and 10 bits of the key narrow it down to
 * one key T and to how many entries equal to T are taken. A last pass gathers the
 * entries above T (in any order) and the first of those equal to T by increasing id
 * (a block scan per tile keeps their order), and the <= 256 candidates are sorted
 * in shared memory (bitonic: key descending, id ascending), the CPU reference's
 * order exactly. The first pass also finds the max and any NaN (the row is then
 * marked, as backend.h says); the second sums exp(l - max) in double. */
#include <climits>

#include "backend/cuda/cuda_internal.cuh"

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS = THREADS / 32;
constexpr int NBINS = 2048; /* the widest digit: 11 bits */
constexpr int SORT_MAX = 256; /* LM_TOPK_MAX, a power of two */
static_assert(SORT_MAX == LM_TOPK_MAX, "the sort holds LM_TOPK_MAX candidates");

__device__ __forceinline__ uint32_t order_key(float x) {
    uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix sum of v over the block in thread order; *total = the sum. */
__device__ __forceinline__ int block_excl_scan(int v, int *warp_tot, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
    }
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    int base = 0, sum = 0;
#pragma unroll 4
    for (int w = 0; w < WARPS; w++) {
        int t = warp_tot[w];
        base += w < warp ? t : 0;
        sum += t;
    }
    __syncthreads(); /* warp_tot may be reused right away */
    *total = sum;
    return base + incl - v;
}

/* The bin holding the need-th largest entry of a histogram of nbins (bins higher =
 * larger keys): sets *chosen and *above (entries in the bins above it). Thread t
 * owns bins counted down from the top, so the scan in thread order sums the bins
 * above each of them. */
__device__ __forceinline__ void select_bin(const int *hist, int nbins, int need, int *warp_tot, int *chosen,
                                           int *above) {
    const int per = nbins / THREADS; /* 2 or 1 */
    const int hi = nbins - 1 - (int)threadIdx.x * per;
    int mine = 0;
    for (int j = 0; j < per; j++) mine += hist[hi - j];
    int total;
    int acc = block_excl_scan(mine, warp_tot, &total);
    for (int j = 0; j < per; j++) {
        int c = hist[hi - j];
        if (acc < need && acc + c >= need) {
            *chosen = hi - j;
            *above = acc;
        }
        acc += c;
    }
    __syncthreads();
}

/* Candidate a goes before candidate b. */
__device__ __forceinline__ bool better(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
    return ka > kb || (ka == kb && ia < ib);
}

__global__ void __launch_bounds__(THREADS)
    topk_rows(const float *__restrict__ logits, int64_t n, int k, bool want_lse, int32_t *out_ids, float *out_vals,
              float *out_max, float *out_lse) {
    __shared__ int hist[NBINS];
    __shared__ uint32_t cand_key[SORT_MAX];
    __shared__ int32_t cand_id[SORT_MAX];
    __shared__ int warp_tot[WARPS];
    __shared__ float warp_max[WARPS];
    __shared__ double warp_sum[WARPS];
    __shared__ int s_nan, s_chosen, s_above, s_gt;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.x;
    const float *x = logits + row * n;
    int32_t *oid = out_ids + row * k;
    float *oval = out_vals + row * k;

    for (int i = tid; i < NBINS; i += THREADS) hist[i] = 0;
    if (tid == 0) s_nan = INT_MAX, s_gt = 0;
    __syncthreads();

    /* pass 1: max, NaN, histogram of the key's top 11 bits (lanes of a warp that
     * fall into one bin add once: logits crowd into a few bins here) */
    float mx = -INFINITY;
    for (int64_t base = 0; base < n; base += THREADS) {
        const int64_t i = base + tid;
        int bin = -1;
        if (i < n) {
            float v = x[i];
            if (isnan(v)) {
                atomicMin(&s_nan, (int)i);
            } else {
                mx = fmaxf(mx, v);
                bin = (int)(order_key(v) >> 21);
            }
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) warp_max[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, warp_max[w]);

    if (s_nan != INT_MAX) { /* the row is marked; the sampler reports the first NaN */
        for (int i = tid; i < k; i++) {
            oid[i] = i == 0 ? s_nan : -1;
            oval[i] = __int_as_float(0x7fc00000);
        }
        if (tid == 0) {
            out_max[row] = __int_as_float(0x7fc00000);
            if (want_lse) out_lse[row] = __int_as_float(0x7fc00000);
        }
        return;
    }

    /* the radix select: after each digit, `prefix` holds the key bits known so far
     * and `need` how many entries with that prefix are still to take */
    int need = k;
    select_bin(hist, NBINS, need, warp_tot, &s_chosen, &s_above);
    uint32_t prefix = (uint32_t)s_chosen; /* bits 31..21 */
    need -= s_above;
    for (int i = tid; i < NBINS; i += THREADS) hist[i] = 0;
    __syncthreads();

    /* pass 2: bits 20..10 among the entries of that prefix, and the sum of exp */
    const bool sum_exp = want_lse && isfinite(mx);
    double sum = 0.0;
    for (int64_t i = tid; i < n; i += THREADS) {
        float v = x[i];
        if (sum_exp) sum += exp((double)v - (double)mx);
        uint32_t key = order_key(v);
        if ((key >> 21) == prefix) atomicAdd(&hist[(key >> 10) & 0x7ff], 1);
    }
    __syncthreads();
    select_bin(hist, NBINS, need, warp_tot, &s_chosen, &s_above);
    prefix = (prefix << 11) | (uint32_t)s_chosen; /* bits 31..10 */
    need -= s_above;
    for (int i = tid; i < NBINS; i += THREADS) hist[i] = 0;
    __syncthreads();

    /* pass 3: bits 9..0 */
    for (int64_t i = tid; i < n; i += THREADS) {
        uint32_t key = order_key(x[i]);
        if ((key >> 10) == prefix) atomicAdd(&hist[key & 0x3ff], 1);
    }
    __syncthreads();
    select_bin(hist, 1024, need, warp_tot, &s_chosen, &s_above);
    const uint32_t thr = (prefix << 10) | (uint32_t)s_chosen; /* the k-th largest key */
    need -= s_above; /* entries equal to thr to take, lowest ids first */
    const int n_gt = k - need;

    /* gather: the entries above thr anywhere, the first `need` equal to it in id
     * order (tiles in order, a scan inside a tile; only tiles that hold one) */
    int eq_base = 0;
    for (int64_t base = 0; base < n; base += THREADS) {
        const int64_t i = base + tid;
        uint32_t key = i < n ? order_key(x[i]) : 0u;
        const bool eq = i < n && key == thr;
        if (i < n && key > thr) {
            int slot = atomicAdd(&s_gt, 1);
            cand_key[slot] = key;
            cand_id[slot] = (int32_t)i;
        }
        if (eq_base < need && __syncthreads_or(eq)) {
            int total;
            int r = block_excl_scan(eq ? 1 : 0, warp_tot, &total);
            if (eq && eq_base + r < need) {
                cand_key[n_gt + eq_base + r] = key;
                cand_id[n_gt + eq_base + r] = (int32_t)i;
            }
            eq_base += total;
        }
    }
    int p2 = 1;
    while (p2 < k) p2 <<= 1;
    for (int i = k + tid; i < p2; i += THREADS) {
        cand_key[i] = 0u; /* below every key of a non-NaN float */
        cand_id[i] = INT_MAX;
    }

    /* bitonic sort of p2 <= 256 entries, best first */
    for (int size = 2; size <= p2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            if (tid < p2 / 2) {
                const int i = 2 * tid - (tid & (stride - 1)), j = i + stride;
                const bool desc = (i & size) == 0;
                uint32_t ki = cand_key[i], kj = cand_key[j];
                int32_t ii = cand_id[i], ij = cand_id[j];
                if (desc ? better(kj, ij, ki, ii) : better(ki, ii, kj, ij)) {
                    cand_key[i] = kj;
                    cand_key[j] = ki;
                    cand_id[i] = ij;
                    cand_id[j] = ii;
                }
            }
        }
    __syncthreads();
    for (int i = tid; i < k; i += THREADS) {
        int32_t id = cand_id[i];
        oid[i] = id;
        oval[i] = x[id];
    }

    if (want_lse) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0) warp_sum[warp] = sum;
        __syncthreads();
        if (tid == 0) {
            double total = 0.0;
            for (int w = 0; w < WARPS; w++) total += warp_sum[w];
            out_lse[row] = sum_exp ? (float)((double)mx + log(total)) : mx; /* -inf or +inf rows: the max */
        }
    }
    if (tid == 0) out_max[row] = mx;
}

} // namespace

extern "C" lm_status lm_cuda_logits_topk(lm_backend *b, const float *logits, int64_t n_rows, int64_t n_vocab, int k,
                                         int32_t *ids, float *vals, float *row_max, float *row_lse) {
    lm_cuda_backend *cu = lm_cuda(b);
    if (n_rows < 0 || n_vocab <= 0 || n_vocab > INT32_MAX || n_rows > INT32_MAX)
        return lm_error(LM_ERR_INVALID_ARG, "logits_topk: %lld rows of %lld logits", (long long)n_rows,
                        (long long)n_vocab);
    if (k < 1 || k > LM_TOPK_MAX || k > n_vocab)
        return lm_error(LM_ERR_INVALID_ARG, "logits_topk: k = %d must be in [1, %d] and at most n_vocab (%lld)", k,
                        LM_TOPK_MAX, (long long)n_vocab);
    if (!logits || !ids || !vals || !row_max)
        return lm_error(LM_ERR_INVALID_ARG, "logits_topk: NULL buffer");
    if (n_rows == 0) return LM_OK;
    lm_cuda_enter(cu);
    if (lm_cuda_recorded_pass(cu)) lm_cuda_fail(cu, LM_ERR_INTERNAL, "logits_topk inside a forward pass");
    lm_status st = lm_cuda_take_error(cu); /* an earlier op's error: the logits are not valid */
    if (st) return st;

    /* the results on the device: [ids n_rows*k][vals n_rows*k][max n_rows][lse n_rows] */
    const size_t nk = (size_t)n_rows * (size_t)k, nr = (size_t)n_rows;
    void *dev = lm_cuda_scratch(cu, LM_CUDA_SCR_TOPK, (2 * nk + 2 * nr) * sizeof(float));
    if (!dev) return lm_cuda_take_error(cu);
    int32_t *d_ids = (int32_t *)dev;
    float *d_vals = (float *)(d_ids + nk), *d_max = d_vals + nk, *d_lse = d_max + nr;
    topk_rows<<<(unsigned)n_rows, THREADS, 0, cu->stream>>>(logits, n_vocab, k, row_lse != NULL, d_ids, d_vals, d_max,
                                                             d_lse);
    bool ok = lm_cuda_launched(cu, "logits_topk") &&
              lm_cuda_ok(cu, cudaMemcpyAsync(ids, d_ids, nk * sizeof(int32_t), cudaMemcpyDeviceToHost, cu->stream),
                         "logits_topk (ids to the host)") &&
              lm_cuda_ok(cu, cudaMemcpyAsync(vals, d_vals, nk * sizeof(float), cudaMemcpyDeviceToHost, cu->stream),
                         "logits_topk (values to the host)") &&
              lm_cuda_ok(cu, cudaMemcpyAsync(row_max, d_max, nr * sizeof(float), cudaMemcpyDeviceToHost, cu->stream),
                         "logits_topk (max to the host)");
    if (ok && row_lse)
        lm_cuda_ok(cu, cudaMemcpyAsync(row_lse, d_lse, nr * sizeof(float), cudaMemcpyDeviceToHost, cu->stream),
                   "logits_topk (log-sum-exp to the host)");
    lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "logits_topk (synchronize)");
    return lm_cuda_take_error(cu);
}
