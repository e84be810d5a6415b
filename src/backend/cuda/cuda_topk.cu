/* logits_topk (backend.h) on the GPU: each logits row reduced on the device to its
 * k best candidates, its max and log-sum-exp, so a decode step copies back k values
 * per sequence instead of the whole vocabulary (152k floats = 600 KB a row).
 *
 * Why split rows: one 1024-thread block per row took 225 us for a single row of
 * 151,936 logits on the H200 (and 235 us for 64 rows): one block streaming 600 KB
 * through four passes is bound by its own memory latency, while 131 SMs sit idle.
 * A row is now cut into slices of SLICE = 4096 logits, one block each:
 *
 *   slices  [row][slice]: the slice's k best (a radix select on registers), written
 *           IN ID ORDER (not sorted), padded to k with key 0 past a short last
 *           slice; the slice's max, first NaN, and sum of exp(l - slice max) in double.
 *   (mid)   only when slices x k > FIN_CAP (k = 256 and a vocabulary over 256k): the
 *           same kernel on the candidates, slices of 4096 candidates, until they fit.
 *   final   [row]: the k best of the <= FIN_CAP candidates by the same radix select,
 *           ranked (key descending, id ascending: the CPU reference's order) and
 *           written with their logits read from the row; the max is the first
 *           candidate's logit (bit for bit the reference's, -0 included); the lse
 *           combines the slices' sums in slice order; a NaN row is marked.
 *
 * Every candidate list keeps id order (slices in order, ids ascending inside each),
 * so "the first `need` entries equal to the k-th key" in list order are the ones of
 * lowest id, the reference's tie rule, at every level; a slice's share of the row's
 * k best is always within the slice's own k best, so nothing is lost. The number of
 * slices and levels depends on n_vocab and k only, and each row is reduced by its own
 * blocks in a fixed order: a row's outputs (max and lse bits included) do not depend
 * on how many rows share the call. Rows go in chunks of at most 65535 (the grid's y)
 * and a bounded scratch; chunking changes nothing within a row.
 *
 * Summaries first, where each slice's share of the k best is small (k / slices <= 4):
 * a block per slice (topk_summary) writes the slice's stat and its REC = 8 best
 * entries, ranked. The k-th largest of the slices' first m = ceil(k / slices) keys
 * (slices x m >= k entries of the row) is at most the row's k-th largest: a bound no
 * entry of the row's k best is below. Then a block per 8 slices (topk_slices_bounded):
 * a slice whose REC-th best is below the bound has all its entries at or above it in
 * its summary, and a warp takes them from there without reading the logits (most
 * slices, where the row's best spread over the vocabulary); any other slice leaves
 * the entries below the bound out before its select, and usually keeps fewer than k,
 * which skips the radix passes. The final block ranks its row's candidates by
 * counting when they are few (the bound leaves ~k real ones among the padding).
 * What each slice keeps of the row's k best, and so every output, is the same.
 * Measured on the H200 (test_topk_cuda's timing, k = 64 of 151,936 logits, with the
 * synchronize): 1 / 64 / 256 rows 0.034 / 0.085 / 0.26 ms with a bound from each
 * slice's 2 best keys and every slice reading its logits again, 0.027 / 0.060 / 0.156
 * ms now. (A summary taking its 8 best in 8 rounds of a block maximum over every
 * entry cost 53 us for 64 rows, more than the reads it saved; the threshold of warp
 * maxima in topk_summary leaves a few candidates to rank instead. Its keys held in 32
 * bits, 48 registers for five blocks an SM instead of four, measured slower: 64 / 256
 * rows 0.066 / 0.179 ms.)
 *
 * Floats are compared through an order-preserving uint32 key (negatives bit-flipped,
 * positives with the sign bit set; -0 keyed as +0 since they compare equal). The
 * radix select narrows the k-th largest key down on 11, 11 and 10 bits (histograms
 * in shared memory, stopping early once the chosen bin holds exactly the entries
 * still needed); a block-wide scan of ballots in item order gives each taken entry
 * its place in the id-ordered output.
 *
 * k = 1 without the log-sum-exp (a greedy step) takes two lighter launches instead
 * (cuda_topk_argmax.cu), with the same outputs. */
#include <climits>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_topk.cuh"

namespace {

constexpr int SLICE = 4096;                       /* logits (or candidates) per slice block  */
constexpr int SL_THREADS = 256;                   /* slice blocks: 16 items a thread         */
constexpr int SL_ITEMS = SLICE / SL_THREADS;
constexpr int FIN_THREADS = 1024;                 /* the final block of a row                */
constexpr int FIN_ITEMS = 16;
constexpr int FIN_CAP = FIN_THREADS * FIN_ITEMS;  /* 16384 = 64 slices of k = 256            */
constexpr int NBINS = 2048;                       /* the widest digit: 11 bits               */
constexpr int REC = 8;                            /* entries a slice's summary records       */
constexpr int SL_GROUP = 8;                       /* slices a bounded slice block takes      */
constexpr size_t CHUNK_BYTES = (size_t)64 << 20;  /* work scratch for one chunk of rows      */
static_assert(LM_TOPK_MAX == 256, "the final ranks LM_TOPK_MAX candidates");
static_assert(SLICE % SL_THREADS == 0 && SL_ITEMS <= 32 && FIN_ITEMS <= 32, "a presence bit per item");

/* What a slice tells the final block of its row. */
struct slice_stat {
    double sum; /* sum of exp(l - max) over the slice, in double; 0 when max is
                 * not finite, the slice holds a NaN, or no lse is wanted      */
    float max;  /* the largest non-NaN logit (-inf for none)                   */
    int nan;    /* the first id whose logit is NaN, INT_MAX for none           */
};

/* The float of a key (order_key, cuda_topk.cuh; -0 comes back as +0). */
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Shared memory of the select and the ordered compaction of NT threads x IT items.
 * Item j of thread t is entry j * NT + t of the block's list: loads coalesce. */
template <int NT, int IT>
struct select_smem {
    static constexpr int NW = NT / 32;
    static constexpr int E = IT * NW;    /* (item, warp) counts, in list order */
    static constexpr int EL = E / 32;    /* per lane of the scanning warp      */
    int hist[NBINS];
    int warp_tot[NW];
    int counts[E + E / 32];              /* padded: lane l reads EL in a row   */
    int chosen, above, count;
};

__device__ __forceinline__ int pad32(int e) { return e + (e >> 5); }

/* Exclusive prefix sum of v over the block in thread order; *total = the sum. */
template <int NT>
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
#pragma unroll 8
    for (int w = 0; w < NT / 32; w++) {
        int t = warp_tot[w];
        base += w < warp ? t : 0;
        sum += t;
    }
    __syncthreads(); /* warp_tot may be reused right away */
    *total = sum;
    return base + incl - v;
}

/* The bin holding the need-th largest entry of a histogram of nbins (bins higher =
 * larger keys): sets chosen, above (entries in the bins above it) and count (its
 * own entries). Thread t owns bins counted down from the top, so the scan in thread
 * order sums the bins above each of them. */
template <int NT, int IT>
__device__ __forceinline__ void select_bin(select_smem<NT, IT> &sm, int nbins, int need) {
    const int per = nbins / NT;
    const int hi = nbins - 1 - (int)threadIdx.x * per;
    int mine = 0;
    for (int j = 0; j < per; j++) mine += sm.hist[hi - j];
    int total;
    int acc = block_excl_scan<NT>(mine, sm.warp_tot, &total);
    for (int j = 0; j < per; j++) {
        int c = sm.hist[hi - j];
        if (acc < need && acc + c >= need) {
            sm.chosen = hi - j;
            sm.above = acc;
            sm.count = c;
        }
        acc += c;
    }
    __syncthreads();
}

/* Where the block's k best are cut: an entry is taken when (key >> shift) > prefix,
 * or when (key >> shift) == prefix and fewer than `need` such entries come before
 * it in list order. all: every present entry is taken (no more than k present). */
struct cut {
    uint32_t prefix;
    int shift, need;
    bool all;
};

/* The radix select over the block's present entries (bit j of `present`). */
template <int NT, int IT>
__device__ cut radix_cut(const uint32_t (&key)[IT], unsigned present, int n_present, int k,
                         select_smem<NT, IT> &sm) {
    if (n_present <= k) return cut{0u, 0, 0, true};
    const int lane = threadIdx.x & 31;
    int need = k;
    uint32_t prefix = 0;
    int prev_shift = 32;
#pragma unroll
    for (int pass = 0; pass < 3; pass++) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const int width = pass == 2 ? 10 : 11, nb = 1 << width;
        for (int i = threadIdx.x; i < nb; i += NT) sm.hist[i] = 0;
        __syncthreads();
        /* lanes of a warp that fall into one bin add once: logits crowd into a few
         * bins of the top digit, and equal entries into one of the later ones */
#pragma unroll
        for (int j = 0; j < IT; j++) {
            const bool m = ((present >> j) & 1u) && (pass == 0 || (key[j] >> prev_shift) == prefix);
            if (__any_sync(0xffffffffu, m)) {
                const int bin = m ? (int)((key[j] >> shift) & (uint32_t)(nb - 1)) : -1;
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (m && lane == __ffs(peers) - 1) atomicAdd(&sm.hist[bin], __popc(peers));
            }
        }
        __syncthreads();
        select_bin(sm, nb, need);
        need -= sm.above;
        prefix = (prefix << width) | (uint32_t)sm.chosen;
        prev_shift = shift;
        if (sm.count == need || shift == 0) break; /* the bin is taken whole, or exact */
    }
    return cut{prefix, prev_shift, need, false};
}

/* The taken entries' places in list order: emit(j, pos) for each taken item j of
 * this thread, pos in [0, min(k, n_present)). A packed count per (item, warp): entries
 * above the cut in the low 16 bits, entries on it in the high 16. */
template <int NT, int IT, typename Emit>
__device__ __forceinline__ void compact(const uint32_t (&key)[IT], unsigned present, const cut &c,
                                        select_smem<NT, IT> &sm, Emit emit) {
    using S = select_smem<NT, IT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned lt = (1u << lane) - 1u;
#pragma unroll
    for (int j = 0; j < IT; j++) {
        const bool p = (present >> j) & 1u;
        const bool gt = p && (c.all || (key[j] >> c.shift) > c.prefix);
        const bool eq = p && !c.all && (key[j] >> c.shift) == c.prefix;
        const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) sm.counts[pad32(j * S::NW + warp)] = __popc(bg) | (__popc(be) << 16);
    }
    __syncthreads();
    if (warp == 0) { /* exclusive scan of the E counts in (item, warp) order */
        int v[S::EL], run = 0;
#pragma unroll
        for (int m = 0; m < S::EL; m++) {
            v[m] = sm.counts[pad32(lane * S::EL + m)];
            run += v[m];
        }
        int incl = run;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        int base = incl - run;
#pragma unroll
        for (int m = 0; m < S::EL; m++) {
            sm.counts[pad32(lane * S::EL + m)] = base;
            base += v[m];
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < IT; j++) {
        const bool p = (present >> j) & 1u;
        const bool gt = p && (c.all || (key[j] >> c.shift) > c.prefix);
        const bool eq = p && !c.all && (key[j] >> c.shift) == c.prefix;
        const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
        const int base = sm.counts[pad32(j * S::NW + warp)];
        const int gb = (base & 0xffff) + __popc(bg & lt), eb = (base >> 16) + __popc(be & lt);
        if (gt)
            emit(j, gb + min(eb, c.need));
        else if (eq && eb < c.need)
            emit(j, gb + eb);
    }
}

/* A slice block's shared memory. */
struct slice_smem {
    select_smem<SL_THREADS, SL_ITEMS> sel;
    float max[SL_THREADS / 32];
    int nan[SL_THREADS / 32];
    double sum[SL_THREADS / 32];
    int present[SL_THREADS / 32];
    uint32_t bound_keys[SL_THREADS], bound;
    uint32_t last_key[SL_GROUP]; /* a bounded block's slices' REC-th best keys */
};

/* The slice's k best of a list of n entries per row, in list order, to
 * out[row][slice][k] (n_slices slices a row). RAW: the list is the logits row (ids
 * are positions); else (key, id) candidates of a level before. RAW without a bound
 * (bounded false): the slice's stat is written here; with it, the stats are the
 * summaries' and entries below `bound` are not candidates. */
template <bool RAW, bool BOUNDED>
__device__ void slice_select(slice_smem &sh, const float *__restrict__ logits, const uint32_t *__restrict__ in_key,
                             const int32_t *__restrict__ in_id, int64_t n, int k, bool want_lse,
                             uint32_t *__restrict__ out_key, int32_t *__restrict__ out_id,
                             slice_stat *__restrict__ stats, int64_t row, int slice, int n_slices, uint32_t bound) {
    constexpr int NW = SL_THREADS / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t start = (int64_t)slice * SLICE, obase = (row * n_slices + slice) * k;
    const int len = (int)min((int64_t)SLICE, n - start);
    uint32_t key[SL_ITEMS];
    unsigned present = 0;
    float mx = -INFINITY;
    int nan = INT_MAX;
    if (RAW) {
        const float *x = logits + row * n + start;
#pragma unroll
        for (int j = 0; j < SL_ITEMS; j++) {
            const int i = j * SL_THREADS + tid;
            float v = i < len ? x[i] : -INFINITY;
            key[j] = order_key(v);
            if (i < len) present |= 1u << j;
            if (isnan(v))
                nan = min(nan, (int)(start + i));
            else
                mx = fmaxf(mx, v);
        }
    } else {
        const uint32_t *kin = in_key + row * n + start;
#pragma unroll
        for (int j = 0; j < SL_ITEMS; j++) {
            const int i = j * SL_THREADS + tid;
            key[j] = i < len ? kin[i] : 0u;
            if (i < len) present |= 1u << j;
        }
    }

    if (RAW && !BOUNDED) { /* the slice's max and first NaN, then its sum of exp in double */
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            nan = min(nan, __shfl_xor_sync(0xffffffffu, nan, off));
        }
        if (lane == 0) sh.max[warp] = mx, sh.nan[warp] = nan;
        __syncthreads();
        mx = -INFINITY, nan = INT_MAX;
#pragma unroll
        for (int w = 0; w < NW; w++) mx = fmaxf(mx, sh.max[w]), nan = min(nan, sh.nan[w]);
        double sum = 0.0;
        if (want_lse && nan == INT_MAX && isfinite(mx)) {
#pragma unroll
            for (int j = 0; j < SL_ITEMS; j++)
                if ((present >> j) & 1u) sum += exp((double)key_value(key[j]) - (double)mx);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0) sh.sum[warp] = sum; /* read after the select's barriers */
    }

    /* every entry of the row's k best is at or above the bound, so the entries below
     * are not candidates */
    int n_present = len;
    if (BOUNDED) {
#pragma unroll
        for (int j = 0; j < SL_ITEMS; j++)
            if (key[j] < bound) present &= ~(1u << j);
        int cnt = __popc(present);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, off);
        if (lane == 0) sh.present[warp] = cnt;
        __syncthreads();
        n_present = 0;
#pragma unroll
        for (int w = 0; w < NW; w++) n_present += sh.present[w];
    }

    const cut c = radix_cut(key, present, n_present, k, sh.sel);
    compact(key, present, c, sh.sel, [&](int j, int pos) {
        const int i = j * SL_THREADS + tid;
        out_key[obase + pos] = key[j];
        out_id[obase + pos] = RAW ? (int32_t)(start + i) : in_id[row * n + start + i];
    });
    for (int i = min(n_present, k) + tid; i < k; i += SL_THREADS) { /* fewer entries: padding below every float */
        out_key[obase + i] = 0u;
        out_id[obase + i] = -1;
    }
    if (RAW && !BOUNDED && tid == 0) {
        double sum = 0.0;
        for (int w = 0; w < NW; w++) sum += sh.sum[w];
        stats[row * n_slices + slice] = slice_stat{sum, mx, nan};
    }
}

/* One block per (slice, row) of a list of n entries per row: the slice's k best
 * (slice_select, without a bound). */
template <bool RAW>
__global__ void __launch_bounds__(SL_THREADS, 4)
    topk_slices(const float *__restrict__ logits, const uint32_t *__restrict__ in_key,
                const int32_t *__restrict__ in_id, int64_t n, int k, bool want_lse, uint32_t *__restrict__ out_key,
                int32_t *__restrict__ out_id, slice_stat *__restrict__ stats) {
    __shared__ slice_smem sh;
    lm_pdl_enter();
    slice_select<RAW, false>(sh, logits, in_key, in_id, n, k, want_lse, out_key, out_id, stats, blockIdx.y,
                             blockIdx.x, gridDim.x, 0u);
}

/* One block per (SL_GROUP slices, row) of the logits, after the slices' summaries
 * (topk_summary: their stats and REC best entries). The row's bound: the k-th largest
 * of its slices' bm best keys, at most the row's k-th largest, so no entry of the
 * row's k best is below it. A slice whose REC-th best is below the bound has every
 * entry at or above it in its summary: a warp takes them from there (the first
 * min(k, count), a prefix of the summary, placed in id order), reading no logits;
 * that is most slices when the row's best spread over the vocabulary. The others go
 * through slice_select with the bound, one after another. */
__global__ void __launch_bounds__(SL_THREADS, 4)
    topk_slices_bounded(const float *__restrict__ logits, int64_t n, int n_slices, int k,
                        uint32_t *__restrict__ out_key, int32_t *__restrict__ out_id,
                        const uint32_t *__restrict__ rec_key, const int32_t *__restrict__ rec_id, int bm) {
    __shared__ slice_smem sh;
    lm_pdl_enter();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.y;
    const int first = blockIdx.x * SL_GROUP;
    const uint32_t *rk = rec_key + row * n_slices * REC;
    const int32_t *ri = rec_id + row * n_slices * REC;

    /* every read of the summaries issued at once, none depends on the bound: a bound
     * key a thread, the REC entries of warp w's slice first + w a lane, and its REC-th
     * key to shared for every thread (read after the bound, they were three trips one
     * after another, and one more a slice in the loop at the end) */
    static_assert(SL_GROUP <= SL_THREADS / 32 && REC <= 32, "a warp a slice, a lane an entry");
    const int n_bounds = n_slices * bm;
    const int s = first + warp;
    const bool rec_lane = warp < SL_GROUP && s < n_slices && lane < REC;
    const uint32_t bound_key = tid < n_bounds ? rk[(tid / bm) * REC + tid % bm] : 0u;
    const uint32_t rec_k = rec_lane ? rk[s * REC + lane] : 0u;
    const int32_t rec_i = rec_lane ? ri[s * REC + lane] : -1;
    if (tid < n_bounds) sh.bound_keys[tid] = bound_key;
    if (rec_lane && lane == REC - 1) sh.last_key[warp] = rec_k;

    /* the bound, by counting: one of the n_slices x bm <= SL_THREADS keys a thread */
    __syncthreads();
    if (tid < n_bounds) {
        const uint32_t mine = sh.bound_keys[tid];
        int gt = 0, ge = 0;
        for (int j = 0; j < n_bounds; j++) gt += sh.bound_keys[j] > mine, ge += sh.bound_keys[j] >= mine;
        if (gt < k && ge >= k) sh.bound = mine; /* every such thread holds the same key */
    }
    __syncthreads();
    const uint32_t bound = sh.bound;
    auto in_summary = [&](int s) { /* all its entries at or above the bound are in its summary */
        return min((int64_t)SLICE, n - (int64_t)s * SLICE) <= REC || sh.last_key[s - first] < bound;
    };

    if (warp < SL_GROUP && s < n_slices && in_summary(s)) {
        const bool take = lane < REC && lane < k && rec_i >= 0 && rec_k >= bound;
        const int32_t id = take ? rec_i : INT_MAX;
        const unsigned taken = __ballot_sync(0xffffffffu, take);
        int pos = 0;
        for (int j = 0; j < REC; j++) pos += (taken >> j & 1u) && __shfl_sync(0xffffffffu, id, j) < id;
        const int64_t obase = (row * n_slices + s) * k;
        if (take) out_key[obase + pos] = rec_k, out_id[obase + pos] = id;
        for (int i = __popc(taken) + lane; i < k; i += 32) out_key[obase + i] = 0u, out_id[obase + i] = -1;
    }
    for (int g = 0; g < SL_GROUP && first + g < n_slices; g++)
        if (!in_summary(first + g)) {
            __syncthreads(); /* the shared memory of the slice before */
            slice_select<true, true>(sh, logits, NULL, NULL, n, k, false, out_key, out_id, NULL, row, first + g,
                                     n_slices, bound);
        }
}

/* The largest of a warp's 64-bit values: the high halves' maximum, then the low
 * halves' among the lanes holding it (two warp reductions, not five shuffle steps). */
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
    const uint32_t hi = (uint32_t)(v >> 32), top = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t lo = __reduce_max_sync(0xffffffffu, hi == top ? (uint32_t)v : 0u);
    return ((unsigned long long)top << 32) | lo;
}

/* One block per (slice, row) of the logits: the slice's stat (as topk_slices writes
 * it without a summary) and its REC best entries, by key, equal keys by position,
 * to rec_key / rec_id [row][slice][REC] (key 0 and id -1 past a short slice's end).
 * A (key, position) pair is made one unique number, larger key first, then lower
 * position. (REC rounds of a block maximum over every entry took 53 us for 64 rows
 * of 152k on the H200; the threshold below leaves a few candidates to rank.) */
__global__ void __launch_bounds__(SL_THREADS)
    topk_summary(const float *__restrict__ logits, int64_t n, bool want_lse, uint32_t *__restrict__ rec_key,
                 int32_t *__restrict__ rec_id, slice_stat *__restrict__ stats) {
    constexpr int NW = SL_THREADS / 32;
    __shared__ unsigned long long s_cut[NW], s_cand[NW * REC * SL_ITEMS]; /* at most REC threads a warp */
    __shared__ int s_count;
    __shared__ float s_max[NW];
    __shared__ int s_nan[NW];
    __shared__ double s_sum[NW];
    lm_pdl_enter();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int slice = blockIdx.x;
    const int64_t row = blockIdx.y, start = (int64_t)slice * SLICE;
    const int len = (int)min((int64_t)SLICE, n - start);
    const float *x = logits + row * n + start;
    unsigned long long item[SL_ITEMS];
    float mx = -INFINITY;
    int nan = INT_MAX;
#pragma unroll
    for (int j = 0; j < SL_ITEMS; j++) {
        const int i = j * SL_THREADS + tid;
        const float v = i < len ? x[i] : -INFINITY;
        item[j] = i < len ? ((unsigned long long)order_key(v) << 32) | (uint32_t)(SLICE - i) : 0ull;
        if (isnan(v))
            nan = min(nan, (int)(start + i));
        else
            mx = fmaxf(mx, v);
    }
    /* the threshold: each warp's REC-th largest thread maximum (REC rounds of a warp
     * maximum over one value a lane), the largest of those over the warps. A warp
     * holds REC entries at or above its own, so the block's REC best are at or above
     * it; at most REC threads of a warp hold entries above it: few candidates */
    unsigned long long v = 0, warp_cut = 0;
#pragma unroll
    for (int j = 0; j < SL_ITEMS; j++) v = item[j] > v ? item[j] : v;
    for (int r = 0; r < REC; r++) {
        warp_cut = warp_max_u64(v);
        if (v == warp_cut) v = 0; /* entries are unique: the one lane holding it */
    }
    if (lane == 0) s_cut[warp] = warp_cut;
    if (tid == 0) s_count = 0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        nan = min(nan, __shfl_xor_sync(0xffffffffu, nan, off));
    }
    if (lane == 0) s_max[warp] = mx, s_nan[warp] = nan;
    __syncthreads();
    unsigned long long cut = 0;
    mx = -INFINITY, nan = INT_MAX;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        mx = fmaxf(mx, s_max[w]), nan = min(nan, s_nan[w]);
        cut = s_cut[w] > cut ? s_cut[w] : cut;
    }
#pragma unroll
    for (int j = 0; j < SL_ITEMS; j++)
        if (item[j] && item[j] >= cut) s_cand[atomicAdd(&s_count, 1)] = item[j];
    __syncthreads();
    /* each candidate ranked by counting the larger ones; the REC best recorded */
    const int count = s_count;
    const int64_t o = (row * gridDim.x + slice) * REC;
    for (int c = tid; c < count; c += SL_THREADS) {
        const unsigned long long mine = s_cand[c];
        int r = 0;
        for (int j = 0; j < count; j++) r += s_cand[j] > mine;
        if (r < REC) {
            rec_key[o + r] = (uint32_t)(mine >> 32);
            rec_id[o + r] = (int32_t)(start + SLICE - (int64_t)(uint32_t)mine);
        }
    }
    if (tid >= count && tid < REC) rec_key[o + tid] = 0u, rec_id[o + tid] = -1;
    /* the sum of exp as topk_slices takes it: a thread's entries in order, a fixed
     * butterfly, the warps in order */
    double sum = 0.0;
    if (want_lse && nan == INT_MAX && isfinite(mx)) {
#pragma unroll
        for (int j = 0; j < SL_ITEMS; j++)
            if (item[j]) sum += exp((double)key_value((uint32_t)(item[j] >> 32)) - (double)mx);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        sum = 0.0;
        for (int w = 0; w < NW; w++) sum += s_sum[w];
        stats[row * gridDim.x + slice] = slice_stat{sum, mx, nan};
    }
}

/* One block per row: the k best of the row's n_in candidates (list order = id
 * order), ranked and written out with the max and lse combined from the row's
 * n_stats slices. */
__global__ void __launch_bounds__(FIN_THREADS)
    topk_final(const float *__restrict__ logits, int64_t n_vocab, const uint32_t *__restrict__ in_key,
               const int32_t *__restrict__ in_id, int n_in, const slice_stat *__restrict__ stats, int n_stats, int k,
               bool want_lse, int32_t *__restrict__ out_ids, float *__restrict__ out_vals,
               float *__restrict__ out_max, float *__restrict__ out_lse) {
    using S = select_smem<FIN_THREADS, FIN_ITEMS>;
    __shared__ S sm;
    __shared__ uint32_t cand_key[LM_TOPK_MAX];
    __shared__ int32_t cand_id[LM_TOPK_MAX];
    __shared__ int rank[LM_TOPK_MAX];
    __shared__ uint32_t few_key[FIN_THREADS];
    __shared__ int32_t few_id[FIN_THREADS];
    __shared__ double s_sum[S::NW];
    __shared__ double st_sum[FIN_THREADS]; /* slice tid's sum and max, for the lse */
    __shared__ float st_max[FIN_THREADS];
    __shared__ int s_nan;
    __shared__ float s_mx;
    lm_pdl_enter();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.x;
    const float *x = logits + row * n_vocab;
    const slice_stat *st = stats + row * n_stats;
    int32_t *oid = out_ids + row * k;
    float *oval = out_vals + row * k;

    /* the reads that depend on nothing issued first, together: the candidates' keys,
     * and the stat of slice tid whole (its nan now; its sum and max kept in shared
     * memory for the lse at the end, not in registers, which would spill with the
     * wait on the load before the keys' loads). Behind the barriers, the stats, the
     * keys and the stats again were three trips one after another. */
    const uint32_t *kin = in_key + row * n_in;
    const int32_t *iin = in_id + row * n_in;
    uint32_t key[FIN_ITEMS];
    unsigned present = 0;
#pragma unroll
    for (int j = 0; j < FIN_ITEMS; j++) {
        const int i = j * FIN_THREADS + tid;
        key[j] = i < n_in ? kin[i] : 0u;
        if (i < n_in) present |= 1u << j;
    }
    const slice_stat st0 = tid < n_stats ? st[tid] : slice_stat{0.0, -INFINITY, INT_MAX};

    if (tid == 0) s_nan = INT_MAX;
    for (int i = tid; i < k; i += FIN_THREADS) rank[i] = 0;
    __syncthreads();
    int nan = st0.nan;
    st_sum[tid] = st0.sum, st_max[tid] = st0.max;
    for (int s = tid + FIN_THREADS; s < n_stats; s += FIN_THREADS) nan = min(nan, st[s].nan);
    if (nan != INT_MAX) atomicMin(&s_nan, nan);
    __syncthreads();
    if (s_nan != INT_MAX) { /* the row is marked; the sampler reports the first NaN */
        const float qnan = __int_as_float(0x7fc00000);
        for (int i = tid; i < k; i += FIN_THREADS) {
            oid[i] = i == 0 ? s_nan : -1;
            oval[i] = i == 0 ? x[s_nan] : qnan;
        }
        if (tid == 0) {
            out_max[row] = qnan;
            if (want_lse) out_lse[row] = qnan;
        }
        return;
    }

    /* the candidate of rank r: its id and logit v = x[id] out; the first's logit is
     * the max (bit for bit the reference's). v is read as soon as the id is known,
     * before the ranking, which then hides the trip. */
    auto write_out = [&](int r, int32_t id, float v) {
        oid[r] = id;
        oval[r] = v;
        if (r == 0) s_mx = v, out_max[row] = v;
    };
    /* few real candidates (padding has key 0, which no logit of a row without a NaN
     * has; the slices' bound leaves ~k of them): each is ranked by counting the ones
     * before it (ids are distinct: the ranks are a permutation), no select */
    int n_real = 0;
#pragma unroll
    for (int j = 0; j < FIN_ITEMS; j++) n_real += key[j] != 0u;
    int total;
    int at = block_excl_scan<FIN_THREADS>(n_real, sm.warp_tot, &total);
    if (total >= k && total <= FIN_THREADS) {
#pragma unroll
        for (int j = 0; j < FIN_ITEMS; j++)
            if (key[j]) few_key[at] = key[j], few_id[at] = iin[j * FIN_THREADS + tid], at++;
        __syncthreads();
        if (tid < total) {
            const uint32_t kc = few_key[tid];
            const int32_t ic = few_id[tid];
            const float v = x[ic];
            int r = 0;
            for (int j = 0; j < total; j++) r += better(few_key[j], few_id[j], kc, ic) ? 1 : 0;
            if (r < k) write_out(r, ic, v);
        }
    } else {
        const cut c = radix_cut(key, present, n_in, k, sm);
        compact(key, present, c, sm, [&](int j, int pos) {
            cand_key[pos] = key[j];
            cand_id[pos] = iin[j * FIN_THREADS + tid];
        });
        __syncthreads();

        /* rank each candidate by counting the ones before it; 1024 / p2 threads count
         * a share of each */
        int p2 = 1;
        while (p2 < k) p2 <<= 1;
        const int parts = FIN_THREADS / p2, cidx = tid & (p2 - 1), part = tid / p2;
        float v = 0.0f;
        if (cidx < k) {
            const uint32_t kc = cand_key[cidx];
            const int32_t ic = cand_id[cidx];
            if (part == 0) v = x[ic];
            int cnt = 0;
            for (int j = part; j < k; j += parts) cnt += better(cand_key[j], cand_id[j], kc, ic) ? 1 : 0;
            if (cnt) atomicAdd(&rank[cidx], cnt);
        }
        __syncthreads();
        if (part == 0 && cidx < k) write_out(rank[cidx], cand_id[cidx], v);
    }
    if (!want_lse) return;
    __syncthreads();
    const float mx = s_mx;
    if (isinf(mx)) { /* all -inf: -inf; a +inf logit: +inf */
        if (tid == 0) out_lse[row] = mx;
        return;
    }
    /* slices in a fixed order: thread t sums slices t, t + 1024, ..., then a fixed tree */
    double sum = 0.0;
    if (tid < n_stats && st_sum[tid] != 0.0) sum += st_sum[tid] * exp((double)st_max[tid] - (double)mx);
    for (int s = tid + FIN_THREADS; s < n_stats; s += FIN_THREADS) {
        const slice_stat q = st[s];
        if (q.sum != 0.0) sum += q.sum * exp((double)q.max - (double)mx);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (int w = 0; w < S::NW; w++) total += s_sum[w];
        out_lse[row] = (float)((double)mx + log(total));
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* LUMEN_CUDA_TOPK_BOUND=0: no bound (every slice selects among all its entries) */
bool bound_turned_off() {
    const char *e = getenv("LUMEN_CUDA_TOPK_BOUND");
    return e && strcmp(e, "0") == 0;
}
size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

/* The outputs at dev ([ids nk][vals nk][max nr][lse nr], side by side on the device)
 * to the caller's buffers: one copy into the page-locked staging buffer, then to the
 * host buffers (each copy of the four apart cost its own few microseconds a step). */
lm_status copy_home(lm_cuda_backend *cu, const void *dev, size_t nk, size_t nr, bool ok, int32_t *ids, float *vals,
                    float *row_max, float *row_lse) {
    const size_t out_used = (2 * nk + (row_lse ? 2 : 1) * nr) * sizeof(float);
    if (ok && cu->topk_host_cap < out_used) {
        if (cu->topk_host) cudaFreeHost(cu->topk_host);
        cu->topk_host = NULL;
        cu->topk_host_cap = 0;
        ok = lm_cuda_ok(cu, cudaMallocHost(&cu->topk_host, out_used), "logits_topk (page-locked staging)");
        if (ok) cu->topk_host_cap = out_used;
    }
    ok = ok && lm_cuda_ok(cu, cudaMemcpyAsync(cu->topk_host, dev, out_used, cudaMemcpyDeviceToHost, cu->stream),
                          "logits_topk (candidates to the host)");
    lm_cuda_replay_time_tail(cu);
    lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "logits_topk (synchronize)");
    if (ok && cu->err == LM_OK) {
        const char *h = (const char *)cu->topk_host;
        memcpy(ids, h, nk * sizeof(int32_t));
        memcpy(vals, h + nk * sizeof(int32_t), nk * sizeof(float));
        memcpy(row_max, h + 2 * nk * sizeof(float), nr * sizeof(float));
        if (row_lse) memcpy(row_lse, h + (2 * nk + nr) * sizeof(float), nr * sizeof(float));
    }
    return lm_cuda_take_error(cu);
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
    const size_t nk = (size_t)n_rows * (size_t)k, nr = (size_t)n_rows;
    const size_t out_bytes = align16((2 * nk + 2 * nr) * sizeof(float));
    if (k == 1 && !row_lse) { /* a greedy step's: cuda_topk_argmax.cu */
        const size_t work = lm_cuda_argmax_work_bytes(n_rows, n_vocab);
        char *dev = (char *)lm_cuda_scratch(cu, LM_CUDA_SCR_TOPK, out_bytes + work);
        if (!dev) return lm_cuda_take_error(cu);
        int32_t *d_ids = (int32_t *)dev;
        float *d_vals = (float *)(d_ids + nk), *d_max = d_vals + nk;
        const bool ok = lm_cuda_argmax_rows(cu, logits, n_rows, n_vocab, d_ids, d_vals, d_max, dev + out_bytes, work);
        return copy_home(cu, dev, nk, nr, ok, ids, vals, row_max, NULL);
    }

    /* the levels, from n_vocab and k only: n_list[0] = slices x k candidates a row,
     * then each mid level's, until they fit the final block */
    const int64_t n_slices = ceil_div(n_vocab, SLICE);
    int64_t n_list[8];
    int levels = 0;
    n_list[levels++] = n_slices * k;
    while (n_list[levels - 1] > FIN_CAP) { /* shrinks by SLICE / k >= 16 a level */
        n_list[levels] = ceil_div(n_list[levels - 1], SLICE) * k;
        levels++;
    }
    const bool want_lse = row_lse != NULL;
    /* the slices' summaries and the row's bound from them where each slice's share
     * of it is small: bm best keys a slice, at most 4, and at most SL_THREADS keys a
     * row (row_bound counts them) */
    const int64_t bound_m = ceil_div(k, n_slices);
    const bool bound = n_slices > 1 && bound_m <= 4 && n_slices * bound_m <= SL_THREADS && !bound_turned_off();
    const int64_t n_rec = bound ? n_slices * REC : 0; /* summary entries a row */

    /* scratch: [ids n_rows*k][vals n_rows*k][max n_rows][lse n_rows], then a chunk's
     * work: [stats rows][slices] [list A keys, ids: rows x n_list[0]] [list B: rows x
     * n_list[1]] (the mid levels go A -> B -> A ..., each smaller than the one before) */
    const size_t per_row = sizeof(slice_stat) * (size_t)n_slices + 8 * (size_t)n_list[0] +
                           (levels > 1 ? 8 * (size_t)n_list[1] : 0) + 8 * (size_t)n_rec;
    int64_t chunk = (int64_t)(CHUNK_BYTES / per_row);
    chunk = chunk < 1 ? 1 : chunk > 65535 ? 65535 : chunk;
    if (chunk > n_rows) chunk = n_rows;
    const size_t a_len = (size_t)chunk * (size_t)n_list[0], b_len = levels > 1 ? (size_t)chunk * (size_t)n_list[1] : 0;
    const size_t stats_bytes = sizeof(slice_stat) * (size_t)chunk * (size_t)n_slices;
    const size_t rec_len = (size_t)chunk * (size_t)n_rec;
    char *dev = (char *)lm_cuda_scratch(cu, LM_CUDA_SCR_TOPK, out_bytes + stats_bytes + align16(8 * a_len) +
                                                                  align16(8 * b_len) + 8 * rec_len);
    if (!dev) return lm_cuda_take_error(cu);
    int32_t *d_ids = (int32_t *)dev;
    float *d_vals = (float *)(d_ids + nk), *d_max = d_vals + nk, *d_lse = d_max + nr;
    slice_stat *d_stats = (slice_stat *)(dev + out_bytes);
    uint32_t *key_a = (uint32_t *)(dev + out_bytes + stats_bytes);
    int32_t *id_a = (int32_t *)(key_a + a_len);
    uint32_t *key_b = (uint32_t *)((char *)key_a + align16(8 * a_len));
    int32_t *id_b = (int32_t *)(key_b + b_len);
    uint32_t *rec_key = bound ? (uint32_t *)((char *)key_b + align16(8 * b_len)) : NULL;
    int32_t *rec_id = bound ? (int32_t *)(rec_key + rec_len) : NULL;

    bool ok = true;
    for (int64_t r0 = 0; ok && r0 < n_rows; r0 += chunk) {
        const unsigned rows = (unsigned)(n_rows - r0 < chunk ? n_rows - r0 : chunk);
        const float *x = logits + r0 * n_vocab;
        if (bound) {
            lm_cuda_launch(cu, topk_summary, dim3((unsigned)n_slices, rows), SL_THREADS, x, n_vocab, want_lse, rec_key,
                           rec_id, d_stats);
            ok = lm_cuda_launched(cu, "topk_summary");
            lm_cuda_launch(cu, topk_slices_bounded, dim3((unsigned)ceil_div(n_slices, SL_GROUP), rows), SL_THREADS, x,
                           n_vocab, (int)n_slices, k, key_a, id_a, (const uint32_t *)rec_key, (const int32_t *)rec_id,
                           (int)bound_m);
            ok = ok && lm_cuda_launched(cu, "topk_slices_bounded");
        } else {
            lm_cuda_launch(cu, topk_slices<true>, dim3((unsigned)n_slices, rows), SL_THREADS, x,
                           (const uint32_t *)NULL, (const int32_t *)NULL, n_vocab, k, want_lse, key_a, id_a, d_stats);
            ok = lm_cuda_launched(cu, "topk_slices (logits)");
        }
        uint32_t *src_key = key_a, *dst_key = key_b;
        int32_t *src_id = id_a, *dst_id = id_b;
        for (int l = 1; ok && l < levels; l++) {
            lm_cuda_launch(cu, topk_slices<false>, dim3((unsigned)ceil_div(n_list[l - 1], SLICE), rows), SL_THREADS,
                           (const float *)NULL, (const uint32_t *)src_key, (const int32_t *)src_id, n_list[l - 1], k,
                           false, dst_key, dst_id, (slice_stat *)NULL);
            ok = lm_cuda_launched(cu, "topk_slices (candidates)");
            uint32_t *tk = src_key;
            int32_t *ti = src_id;
            src_key = dst_key, src_id = dst_id, dst_key = tk, dst_id = ti;
        }
        if (!ok) break;
        lm_cuda_launch(cu, topk_final, dim3(rows), FIN_THREADS, x, n_vocab, (const uint32_t *)src_key,
                       (const int32_t *)src_id, (int)n_list[levels - 1], (const slice_stat *)d_stats, (int)n_slices, k,
                       want_lse, d_ids + r0 * k, d_vals + r0 * k, d_max + r0, d_lse + r0);
        ok = lm_cuda_launched(cu, "topk_final");
    }
    return copy_home(cu, dev, nk, nr, ok, ids, vals, row_max, row_lse);
}
