/* The decode step of one token in one launch: the persistent decode kernel.
 *
 * Why: one token's step reads every weight once (3.1 GB for Qwen2.5-1.5B in bf16)
 * and does almost nothing else, so its floor is the weights' bytes over the memory's
 * speed. Op by op it is ~230 small kernels, each with a ramp and a tail that the
 * memory idles through (1.57 ms a step against ~0.85 ms of bytes on the H200).
 *
 * How: one block per SM for the whole step, each with a producer warp and eight
 * consumer warps. The producer streams the block's share of every matrix of the step
 * (a contiguous run of rows per matrix, in the order the step uses them) into a ring
 * of shared-memory slots with bulk async copies (cp.async.bulk, completion counted
 * on an mbarrier per slot); another of its lanes requests the next chunks into L2.
 * Weights depend on nothing the step computes, so the stream runs ahead across the
 * stages' grid-wide barriers, as far as the ring lets it. The consumers:
 *   per layer: the attention norm (every block normalizes the whole row itself) and
 *   its share of the Q/K/V rows | barrier | attention, a unit per (KV head, split of
 *   the positions) with the biases and RoPE of its heads done in place | barrier |
 *   the splits merged and the block's output-projection rows added to the residual |
 *   barrier | the FFN norm and the block's gate/up rows with SwiGLU | barrier | the
 *   block's down-projection rows added to the residual | barrier;
 *   then the output norm and the block's rows of the head.
 * Grid-wide barriers are a counter in global memory (every block is resident: one
 * block an SM, a grid of at most the SM count); the last block out sets it back to 0.
 *
 * Results are the op-by-op pass's within rounding, not to the bit: products sum in
 * another order (f32, per lane then across the warp), the attention over other splits.
 * Serves BF16 or F16 matrices with packed Q/K/V and gate/up, an F16 cache, head sizes
 * 64 and 128, RMS norms, SwiGLU, optional Q/K/V biases (Llama, Qwen2 families);
 * lm_cuda_decode_step says LM_ERR_UNSUPPORTED for anything else and the pass runs
 * op by op.
 *
 * Off by default (LUMEN_CUDA_DECODE_STEP=1 turns it on): it is not yet faster. On the
 * H200, Qwen2.5-1.5B bf16, a step takes 2.29 ms against 1.6 op by op. The profile
 * (LUMEN_CUDA_DECODE_PROFILE=1) says why: a layer's stages that wait on the stages
 * before them (the norms, Q/K/V's few rows, attention, the merge, the barriers) add
 * up to ~37 us of latency against ~25 us of its weights' bytes, and the ring holds
 * only ~6 us of the stream. Without the dot products the gate/up and down stages
 * took 13 and 8 us instead of 19 and 13 (the same build): the consumers'
 * shared-memory reads are on the stream's critical path too (docs/BENCHMARKS.md,
 * ninth session). */
#include "backend/cuda/cuda_bulk.cuh"
#include "backend/cuda/cuda_internal.cuh"

enum {
    DS_WARPS = 8,                    /* consumer warps                                 */
    DS_THREADS = 32 * (DS_WARPS + 1), /* + the producer warp                            */
    DS_MAX_LAYERS = 128,
    DS_MAX_SPLITS = 16,              /* attention splits of a KV head                  */
    DS_MAX_GROUP = 8,                /* query heads per KV head                        */
    DS_MAX_SLOTS = 32,
    DS_SLOT_CAP = 48 * 1024,         /* the largest slot: a row must fit in one        */
    DS_POS_PER_SPLIT = 64,           /* positions a split takes before another is made */
    DS_RING_OFFSET = 2 * DS_MAX_SLOTS * 8 + 128, /* the slots' mbarriers, the copy count */
};

typedef struct ds_layer {
    const uint8_t *qkv, *o, *gu, *down; /* packed Q/K/V rows, O, packed gate/up rows, down */
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv;
} ds_layer;

typedef struct ds_args {
    int n_layer, d, n_ff, n_head, n_head_kv, hd, n_rot, n_vocab, bs, nb;
    int neox, f16, emb_type, n_slots;
    uint32_t slot_bytes;
    float eps, theta, freq_scale, attn_scale, embd_scale;
    const uint8_t *emb, *head;
    size_t emb_row_bytes;
    const float *out_norm;
    const int32_t *meta, *ids; /* [pos][table offset][table]; the token */
    __half *K, *V;              /* the cache's first layer                     */
    int64_t layer_elems;        /* elements of one layer of K (or V)           */
    float *x, *qkv, *h, *part, *logits;
    unsigned *sync;             /* [0] barrier arrivals, [1] blocks done       */
    /* shared memory (floats, from the dynamic base after the ring) */
    int sm_xs, sm_xv, sm_gate, sm_wgt, sm_rope, sm_red;
    uint64_t *prof;             /* LUMEN_CUDA_DECODE_PROFILE: block 0's clock at each stage, or NULL */
    ds_layer layers[DS_MAX_LAYERS];
} ds_args;

/* LUMEN_CUDA_DECODE_PROFILE=1: block 0's clock (ns) at each stage of the last step,
 * printed when the backend is destroyed: [0] before the PDL wait, [1] after it, [2]
 * before the head, [3] after it, [4] the producer done, [5..7] the middle layer's
 * attention unit (q ready, scores, values); per layer DS_PROF_STAGES stamps from
 * DS_PROF_LAYER; the producer's layer ends from DS_PROF_PRODUCER. */
enum { DS_PROF_STAGES = 14, DS_PROF_LAYER = 8, DS_PROF_PRODUCER = DS_PROF_LAYER + DS_MAX_LAYERS * DS_PROF_STAGES,
       DS_PROF_N = DS_PROF_PRODUCER + DS_MAX_LAYERS };

__device__ __forceinline__ void ds_stamp(uint64_t *p, int i) {
    if (p) p[i] = lm_cuda_clock_ns();
}

/* ---- barriers (the mbarriers and bulk copies: cuda_bulk.cuh) ------------------- */
/* the consumer warps' own barrier (the producer warp never joins) */
__device__ __forceinline__ void ds_sync_consumers(void) {
    asm volatile("bar.sync 1, %0;" ::"n"(32 * DS_WARPS) : "memory");
}

/* Every block's consumers here before any goes on; what they wrote before is
 * visible to every block after. */
__device__ __forceinline__ void ds_grid_sync(unsigned *ctr, unsigned *target, int nb) {
    ds_sync_consumers();
    *target += (unsigned)nb;
    if (threadIdx.x == 0) {
        /* the fence makes the block's writes (ordered before it by the barrier above)
         * visible before the arrival, as a cooperative grid sync does; the acquire
         * makes every block's visible here before the block goes on */
        __threadfence();
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while (v < *target);
    }
    ds_sync_consumers();
}

/* ---- the weight stream --------------------------------------------------------- */
/* A block's rows of a matrix: [R * b / nb, R * (b + 1) / nb) */
__device__ __forceinline__ int ds_row0(int rows, int b, int nb) { return (int)((int64_t)rows * b / nb); }

/* Rows of `cols` elements a chunk holds (1..8). */
__device__ __forceinline__ int ds_chunk_rows(const ds_args &a, int cols) {
    const uint32_t rb = (uint32_t)cols * 2u;
    const uint32_t r = a.slot_bytes / rb;
    return r > 8 ? 8 : (int)r;
}

/* The stream's order, shared by the producer and the consumers: per layer Q/K/V,
 * O, gate/up (a chunk of gate rows, then the same up rows), down; then the head.
 * f(kind, src, row0, rows, cols) is called per chunk. */
enum { DS_QKV, DS_O, DS_GATE, DS_UP, DS_DOWN, DS_HEAD };

template <typename F>
__device__ __forceinline__ void ds_matrix(const ds_args &a, int kind, const uint8_t *w, int rows, int cols, F &f) {
    const int r0 = ds_row0(rows, blockIdx.x, a.nb), r1 = ds_row0(rows, blockIdx.x + 1, a.nb);
    const int cr = ds_chunk_rows(a, cols);
    const size_t rb = (size_t)cols * 2;
    for (int r = r0; r < r1; r += cr) f(kind, w + (size_t)r * rb, r, min(cr, r1 - r), cols);
}

template <typename F>
__device__ __forceinline__ void ds_gate_up(const ds_args &a, const uint8_t *w, F &f) {
    const int r0 = ds_row0(a.n_ff, blockIdx.x, a.nb), r1 = ds_row0(a.n_ff, blockIdx.x + 1, a.nb);
    const int cr = ds_chunk_rows(a, a.d);
    const size_t rb = (size_t)a.d * 2;
    for (int r = r0; r < r1; r += cr) {
        f(DS_GATE, w + (size_t)r * rb, r, min(cr, r1 - r), a.d);
        f(DS_UP, w + (size_t)(a.n_ff + r) * rb, r, min(cr, r1 - r), a.d);
    }
}

/* The producer's lane 0 copies each chunk into the ring as a slot comes free; its
 * lane 1 requests chunks into L2 up to DS_L2_AHEAD chunks past the last copied, so
 * the memory keeps streaming while the ring is full and the consumers wait at a
 * barrier (the ring alone holds ~6 us of the stream). */
enum { DS_L2_AHEAD = 8 };

struct ds_producer {
    uint8_t *ring;
    uint64_t *full, *empty;
    volatile unsigned *copied; /* chunks lane 0 has issued (shared memory) */
    uint32_t slot_bytes;
    int n_slots;
    bool l2; /* lane 1: prefetch into L2 */
    unsigned it;
    __device__ void operator()(int, const uint8_t *src, int, int rows, int cols) {
        const uint32_t bytes = (uint32_t)rows * (uint32_t)cols * 2u;
        if (l2) {
            while (it >= *copied + DS_L2_AHEAD) __nanosleep(256);
            lm_bulk_prefetch_l2(src, bytes);
            it++;
            return;
        }
        const int s = (int)(it % (unsigned)n_slots);
        const unsigned use = it / (unsigned)n_slots;
        if (use > 0) lm_mbar_wait(&empty[s], (use - 1) & 1u);
        lm_bulk_copy(ring + (size_t)s * slot_bytes, src, bytes, &full[s]);
        *copied = ++it;
    }
};

/* ---- the consumers' arithmetic ------------------------------------------------- */
/* A product's input sits in shared memory as two arrays: element 8v + i (i < 4) at
 * lo[4v + i], 8v + 4 + i at hi[4v + i], so that a lane's 8 inputs are two 16-byte
 * reads that the warp's lanes make without bank conflicts. */
__device__ __forceinline__ void ds_put(float *xs, int cols, int e, float v) {
    const int q = (e >> 3) * 4 + (e & 3);
    xs[(e & 4) ? cols / 2 + q : q] = v;
}

template <bool F16>
__device__ __forceinline__ void ds_unpack2(uint32_t u, float &a, float &b) {
    if (F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u));
        a = f.x, b = f.y;
    } else {
        a = __uint_as_float(u << 16), b = __uint_as_float(u & 0xffff0000u);
    }
}

/* 8 weights (16 bytes) times 8 inputs, into two of the lane's partial sums */
template <bool F16>
__device__ __forceinline__ void ds_dot8(const uint4 &u, const float4 &x0, const float4 &x1, float &s0, float &s1) {
    float w0, w1;
    ds_unpack2<F16>(u.x, w0, w1);
    s0 = fmaf(w0, x0.x, s0), s1 = fmaf(w1, x0.y, s1);
    ds_unpack2<F16>(u.y, w0, w1);
    s0 = fmaf(w0, x0.z, s0), s1 = fmaf(w1, x0.w, s1);
    ds_unpack2<F16>(u.z, w0, w1);
    s0 = fmaf(w0, x1.x, s0), s1 = fmaf(w1, x1.y, s1);
    ds_unpack2<F16>(u.w, w0, w1);
    s0 = fmaf(w0, x1.z, s0), s1 = fmaf(w1, x1.w, s1);
}

/* lane's share of the dot product of a row's 16-byte vectors [v0, v1) with the input,
 * summed over the warp: two vectors a step into four partial sums, so the arithmetic
 * is not one chain of dependent multiply-adds (the consumers' time per chunk is
 * on the stream's critical path) */
template <bool F16>
__device__ __forceinline__ float ds_dot(const uint4 *row, const float *xs, int cols, int v0, int v1, int lane) {
    const float4 *lo = (const float4 *)xs, *hi = (const float4 *)(xs + cols / 2);
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int v = v0 + lane;
    for (; v + 32 < v1; v += 64) {
        const uint4 u0 = row[v], u1 = row[v + 32];
        const float4 a0 = lo[v], b0 = hi[v], a1 = lo[v + 32], b1 = hi[v + 32];
        ds_dot8<F16>(u0, a0, b0, s0, s1);
        ds_dot8<F16>(u1, a1, b1, s2, s3);
    }
    if (v < v1) ds_dot8<F16>(row[v], lo[v], hi[v], s0, s1);
    float s = (s0 + s1) + (s2 + s3);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

struct ds_sync {
    __device__ __forceinline__ void operator()() const { ds_sync_consumers(); }
};

/* xs (product layout) = x / rms(x) * w; x is read from global memory (written by
 * other blocks before the last barrier), or given in xv already (the embedding). */
__device__ void ds_norm_input(const ds_args &a, const float *xg, float *xv, const float *w, float *xs, double *part) {
    const int T = 32 * DS_WARPS;
    double s = 0.0;
    for (int e = threadIdx.x; e < a.d; e += T) {
        const float v = xg ? __ldcg(xg + e) : xv[e];
        xv[e] = v;
        s += (double)v * (double)v;
    }
    const double total = lm_cuda_block_total<32 * DS_WARPS>(s, part, ds_sync());
    const float inv = (float)(1.0 / sqrt(total / (double)a.d + (double)a.eps));
    for (int e = threadIdx.x; e < a.d; e += T) ds_put(xs, a.d, e, __fmul_rn(__fmul_rn(xv[e], inv), w[e]));
    ds_sync_consumers();
}

/* A warp's slice of the input in registers, up to DS_XR 16-byte vectors a lane: every
 * row of a stage dots the same slice, so the slice is read from shared memory once a
 * stage and only the weights are read per chunk (reading both per row took shared
 * memory's bandwidth: 0.33 us of a 24 KB chunk). */
enum { DS_XR = 6 };

struct ds_consumer {
    const ds_args *a;
    const uint8_t *ring;
    uint64_t *full, *empty;
    float *xs, *xv, *gate, *red; /* xv: the residual stream as the stage's norm read it */
    int g0;                      /* the block's first gate row */
    unsigned it;
    int stage, xr_stage, xr_v0, xr_v1; /* the stage and vectors the registers hold */
    float4 xr[DS_XR][2];
    __device__ __forceinline__ void load_slice(int cols, int v0, int v1, int lane) {
        const float4 *lo = (const float4 *)xs, *hi = (const float4 *)(xs + cols / 2);
#pragma unroll
        for (int k = 0; k < DS_XR; k++) {
            const int v = v0 + lane + 32 * k;
            if (v < v1) xr[k][0] = lo[v], xr[k][1] = hi[v];
        }
        xr_stage = stage, xr_v0 = v0, xr_v1 = v1;
    }
    template <bool F16>
    __device__ __forceinline__ float dot_slice(const uint4 *row, int v0, int v1, int lane) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
        for (int k = 0; k < DS_XR; k++) {
            const int v = v0 + lane + 32 * k;
            if (v >= v1) continue;
            if (k & 1) ds_dot8<F16>(row[v], xr[k][0], xr[k][1], s2, s3);
            else ds_dot8<F16>(row[v], xr[k][0], xr[k][1], s0, s1);
        }
        float sum = (s0 + s1) + (s2 + s3);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        return sum;
    }
    template <bool F16>
    __device__ __forceinline__ void run(int kind, int row0, int rows, int cols) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int s = (int)(it % (unsigned)a->n_slots);
        const int wpr = DS_WARPS / rows, r = warp / wpr, piece = warp % wpr, nv = cols / 8;
        const int v0 = nv * piece / wpr, v1 = nv * (piece + 1) / wpr;
        const bool regs = v1 - v0 <= 32 * DS_XR;
        if (regs && (xr_stage != stage || xr_v0 != v0 || xr_v1 != v1)) load_slice(cols, v0, v1, lane);
        lm_mbar_wait(&full[s], (it / (unsigned)a->n_slots) & 1u);
        const uint4 *slot = (const uint4 *)(ring + (size_t)s * a->slot_bytes);
        float sum = 0.0f;
        if (r < rows)
            sum = regs ? dot_slice<F16>(slot + (size_t)r * nv, v0, v1, lane)
                       : ds_dot<F16>(slot + (size_t)r * nv, xs, cols, v0, v1, lane);
        __syncwarp();
        if (lane == 0) lm_mbar_arrive(&empty[s]);
        if (wpr > 1) { /* the row's pieces summed in warp order by its first warp */
            float *rd = red + (it & 1u) * DS_WARPS;
            if (lane == 0) rd[warp] = sum;
            ds_sync_consumers();
            if (r < rows && piece == 0)
                for (int i = 1; i < wpr; i++) sum += rd[warp + i];
        }
        it++;
        if (r >= rows || piece != 0 || lane != 0) return;
        const int row = row0 + r;
        switch (kind) {
        case DS_QKV: a->qkv[row] = sum; break;
        case DS_O: /* the residual as the stage's norm read it: no trip to memory */
        case DS_DOWN: a->x[row] = __fadd_rn(xv[row], sum); break;
        case DS_GATE: gate[row - g0] = sum; break;
        case DS_UP: a->h[row] = lm_swiglu1(gate[row - g0], sum); break;
        default: a->logits[row] = sum; break;
        }
    }
    __device__ __forceinline__ void operator()(int kind, const uint8_t *, int row0, int rows, int cols) {
        if (a->f16) run<true>(kind, row0, rows, cols);
        else run<false>(kind, row0, rows, cols);
    }
};

/* ---- attention ------------------------------------------------------------------ */
__device__ __forceinline__ int ds_splits(const ds_args &a, int n_pos) {
    int s = (n_pos + DS_POS_PER_SPLIT - 1) / DS_POS_PER_SPLIT;
    const int cap = a.nb / a.n_head_kv < DS_MAX_SPLITS ? a.nb / a.n_head_kv : DS_MAX_SPLITS;
    if (s > cap) s = cap;
    return s < 1 ? 1 : s;
}

/* The positions [p0, p1) of split s of n_split over [0, n_pos). */
__device__ __forceinline__ void ds_split_range(int n_pos, int s, int n_split, int *p0, int *p1) {
    *p0 = (int)((int64_t)n_pos * s / n_split), *p1 = (int)((int64_t)n_pos * (s + 1) / n_split);
}

/* The cache slot of position p. */
__device__ __forceinline__ int64_t ds_slot(const ds_args &a, const int32_t *table, int p) {
    return (int64_t)table[p / a.bs] * a.bs + p % a.bs;
}

/* The block's attention units' cached keys and values requested into L2 while the
 * other blocks finish the Q/K/V rows (the token's own position is not cached yet). */
template <int HD>
__device__ void ds_attend_prefetch(const ds_args &a, int layer, int n_split, int pos, const int32_t *table) {
    const int kv_dim = a.n_head_kv * HD, T = 32 * DS_WARPS;
    const __half *K = a.K + (int64_t)layer * a.layer_elems, *V = a.V + (int64_t)layer * a.layer_elems;
    for (int u = blockIdx.x; u < a.n_head_kv * n_split; u += a.nb) {
        const int g = u / n_split;
        int p0, p1;
        ds_split_range(pos + 1, u % n_split, n_split, &p0, &p1);
        /* a row of a head is HD halves: 2 * HD / 128 lines of 128 bytes */
        constexpr int LINES = HD * 2 / 128;
        for (int i = threadIdx.x; i < (p1 - p0) * 2 * LINES; i += T) {
            const int p = p0 + i / (2 * LINES), kv = (i / LINES) & 1, line = i % LINES;
            if (p >= pos) continue;
            const __half *row = (kv ? V : K) + ds_slot(a, table, p) * kv_dim + g * HD + line * 64;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(row));
        }
    }
}

/* q, k or v element j from the Q/K/V product (at off), with its bias */
__device__ __forceinline__ float ds_qkv_in(const ds_args &a, int off, const float *bias, int j) {
    const float v = __ldcg(a.qkv + off + j);
    return bias ? __fadd_rn(v, bias[j]) : v;
}

enum { DS_ATT_TILE = 128 }; /* positions scored at once */

/* Unit (KV head g, split s): the softmax state of each of the group's query heads over
 * the split's positions, to part[head][s] = {acc[0..HD), max, sum} (acc unnormalized).
 * A tile of positions at a time: every (position, head) score by a thread, each head's
 * softmax by a warp, each (head, dimension) of the values by a thread, so each stage
 * is one round of independent loads. The token's own key and value come from the
 * product (and go to the cache from the split that holds the position). */
template <int HD>
__device__ void ds_attend_unit(const ds_args &a, int layer, int g, int s, int n_split, int pos,
                               const int32_t *table, const float *cs, const float *sn, float *sm, uint64_t *ap) {
    const ds_layer &L = a.layers[layer];
    const int T = 32 * DS_WARPS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = a.n_head / a.n_head_kv, q_dim = a.n_head * HD, kv_dim = a.n_head_kv * HD;
    int p0, p1;
    ds_split_range(pos + 1, s, n_split, &p0, &p1);
    const bool own = p1 == pos + 1; /* this split holds the token's own position */
    /* q [G][HD], k, v [HD], scores [G][TILE], per head max, sum, rescale */
    float *qs = sm, *ks = qs + DS_MAX_GROUP * HD, *vs = ks + HD, *sc = vs + HD;
    float *mh = sc + DS_MAX_GROUP * DS_ATT_TILE, *lh = mh + DS_MAX_GROUP, *ch = lh + DS_MAX_GROUP;
    int64_t *slots = (int64_t *)(((uintptr_t)(ch + DS_MAX_GROUP) + 7) & ~(uintptr_t)7); /* the tile's rows */
    const int half = a.n_rot / 2;
    float *qt = sc; /* the rotated q again as [dim][head], for the scores' reads: the threads of a
                     * position read one dimension of several heads from adjacent banks */
    for (int i = threadIdx.x; i < G * HD; i += T) qs[i] = ds_qkv_in(a, 0, L.bq, g * G * HD + i);
    if (own)
        for (int i = threadIdx.x; i < HD; i += T) {
            ks[i] = ds_qkv_in(a, q_dim, L.bk, g * HD + i);
            vs[i] = ds_qkv_in(a, q_dim + kv_dim, L.bv, g * HD + i);
        }
    if (threadIdx.x < DS_MAX_GROUP) mh[threadIdx.x] = -INFINITY, lh[threadIdx.x] = 0.0f;
    ds_sync_consumers();
    for (int j = threadIdx.x; j < (G + (own ? 1 : 0)) * half; j += T) {
        const int h = j / half, i = j % half;
        lm_cuda_rope_rotate(h < G ? qs + h * HD : ks, i, half, a.neox, cs[i], sn[i]);
    }
    ds_sync_consumers();
    for (int i = threadIdx.x; i < G * HD; i += T) qt[(i % HD) * DS_MAX_GROUP + i / HD] = qs[i];
    ds_sync_consumers();
    for (int i = threadIdx.x; i < DS_MAX_GROUP * HD; i += T) qs[i] = qt[i]; /* qs: now [dim][DS_MAX_GROUP] */
    ds_sync_consumers();
    ds_stamp(ap, 0);

    const __half *K = a.K + (int64_t)layer * a.layer_elems, *V = a.V + (int64_t)layer * a.layer_elems;
    /* the values: a warp's positions (every DS_WARPS-th), a lane's E dimensions of every
     * head of the group, so a warp's loads of its positions' rows go out together */
    constexpr int E = HD / 32;
    float acc[DS_MAX_GROUP][E];
#pragma unroll
    for (int h = 0; h < DS_MAX_GROUP; h++)
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] = 0.0f;
    for (int t0 = p0; t0 < p1; t0 += DS_ATT_TILE) {
        const int nt = min(DS_ATT_TILE, p1 - t0);
        for (int j = threadIdx.x; j < nt; j += T) slots[j] = (ds_slot(a, table, t0 + j) * kv_dim + g * HD);
        ds_sync_consumers();
        /* scores: (position, head) by thread, the key row read 16 bytes at a time */
        for (int i = threadIdx.x; i < nt * G; i += T) {
            const int p = t0 + i / G, h = i % G;
            const float *q = qs + h; /* q[d * DS_MAX_GROUP] */
            float dot = 0.0f;
            if (p == pos) {
                for (int d = 0; d < HD; d++) dot = fmaf(q[d * DS_MAX_GROUP], ks[d], dot);
            } else {
                const uint4 *kr = (const uint4 *)(K + slots[p - t0]);
#pragma unroll 4
                for (int c = 0; c < HD / 8; c++) {
                    const uint4 u = kr[c];
                    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[k]));
                        dot = fmaf(q[(8 * c + 2 * k) * DS_MAX_GROUP], f.x, dot);
                        dot = fmaf(q[(8 * c + 2 * k + 1) * DS_MAX_GROUP], f.y, dot);
                    }
                }
            }
            sc[h * DS_ATT_TILE + (p - t0)] = dot * a.attn_scale;
        }
        ds_sync_consumers();
        ds_stamp(ap, 1);
        /* each head's softmax over the tile, by a warp: weights in place, the state
         * rescaled */
        for (int h = warp; h < G; h += DS_WARPS) {
            float mx = -INFINITY;
            for (int i = lane; i < nt; i += 32) mx = fmaxf(mx, sc[h * DS_ATT_TILE + i]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(mh[h], mx);
            float sum = 0.0f;
            for (int i = lane; i < nt; i += 32) {
                const float w = expf(sc[h * DS_ATT_TILE + i] - m_new);
                sc[h * DS_ATT_TILE + i] = w;
                sum += w;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane == 0) {
                const float corr = expf(mh[h] - m_new); /* 0 on the first tile: max was -inf */
                ch[h] = corr, lh[h] = lh[h] * corr + sum, mh[h] = m_new;
            }
        }
        ds_sync_consumers();
#pragma unroll
        for (int h = 0; h < DS_MAX_GROUP; h++)
#pragma unroll
            for (int e = 0; e < E; e++) acc[h][e] *= h < G ? ch[h] : 0.0f;
        for (int j = warp; j < nt; j += DS_WARPS) {
            float v[E];
            if (t0 + j == pos) {
#pragma unroll
                for (int e = 0; e < E; e++) v[e] = vs[lane * E + e];
            } else {
                const __half *vr = V + slots[j] + lane * E;
#pragma unroll
                for (int e = 0; e < E; e += 2) {
                    const float2 f = __half22float2(*(const __half2 *)(vr + e));
                    v[e] = f.x, v[e + 1] = f.y;
                }
            }
#pragma unroll
            for (int h = 0; h < DS_MAX_GROUP; h++) {
                if (h >= G) break;
                const float w = sc[h * DS_ATT_TILE + j];
#pragma unroll
                for (int e = 0; e < E; e++) acc[h][e] = fmaf(w, v[e], acc[h][e]);
            }
        }
        ds_sync_consumers(); /* the scores' space is the next tile's */
        ds_stamp(ap, 2);
    }
    /* the warps' sums, then their total per (head, dimension) in warp order */
    float *wacc = (float *)(slots + DS_ATT_TILE); /* [warp][head][HD] */
#pragma unroll
    for (int h = 0; h < DS_MAX_GROUP; h++) {
        if (h >= G) break;
#pragma unroll
        for (int e = 0; e < E; e++) wacc[(warp * DS_MAX_GROUP + h) * HD + lane * E + e] = acc[h][e];
    }
    ds_sync_consumers();
    for (int i = threadIdx.x; i < G * HD; i += T) {
        const int h = i / HD, d = i % HD;
        float o = 0.0f;
        for (int w = 0; w < DS_WARPS; w++) o += wacc[(w * DS_MAX_GROUP + h) * HD + d];
        float *dst = a.part + ((int64_t)(g * G + h) * DS_MAX_SPLITS + s) * (HD + 2);
        dst[d] = o;
        if (d == 0) dst[HD] = mh[h], dst[HD + 1] = lh[h];
    }
    if (own) { /* the token's key and value into the cache for later steps */
        const int64_t slot = ds_slot(a, table, pos);
        __half *Kw = a.K + (int64_t)layer * a.layer_elems, *Vw = a.V + (int64_t)layer * a.layer_elems;
        for (int i = threadIdx.x; i < HD; i += T) {
            Kw[slot * kv_dim + g * HD + i] = __float2half_rn(ks[i]);
            Vw[slot * kv_dim + g * HD + i] = __float2half_rn(vs[i]);
        }
    }
    ds_sync_consumers(); /* the shared state is reused by the next unit */
}

/* The splits of every query head merged into the O product's input (xs): the splits'
 * max and sum first (one load each, all at once), then each element's sum over the
 * splits. */
template <int HD>
__device__ void ds_merge(const ds_args &a, int n_split, float *wgt, float *xs) {
    const int T = 32 * DS_WARPS, q_dim = a.n_head * HD;
    for (int i = threadIdx.x; i < a.n_head * n_split; i += T) {
        const int h = i / n_split, s = i % n_split;
        const float *p = a.part + ((int64_t)h * DS_MAX_SPLITS + s) * (HD + 2);
        wgt[2 * (h * DS_MAX_SPLITS + s)] = __ldcg(p + HD);
        wgt[2 * (h * DS_MAX_SPLITS + s) + 1] = __ldcg(p + HD + 1);
    }
    ds_sync_consumers();
    for (int h = threadIdx.x; h < a.n_head; h += T) {
        float *w = wgt + 2 * h * DS_MAX_SPLITS;
        float mx = -INFINITY, den = 0.0f;
        for (int s = 0; s < n_split; s++) mx = fmaxf(mx, w[2 * s]);
        for (int s = 0; s < n_split; s++) {
            const float f = expf(w[2 * s] - mx);
            den += f * w[2 * s + 1];
            w[2 * s] = f;
        }
        for (int s = 0; s < n_split; s++) w[2 * s] /= den;
    }
    ds_sync_consumers();
    for (int e = threadIdx.x; e < q_dim; e += T) {
        const int h = e / HD, j = e % HD;
        const float *p = a.part + (int64_t)h * DS_MAX_SPLITS * (HD + 2) + j;
        const float *w = wgt + 2 * h * DS_MAX_SPLITS;
        float o = 0.0f;
#pragma unroll 4
        for (int s = 0; s < n_split; s++) o = fmaf(__ldcg(p + s * (HD + 2)), w[2 * s], o);
        ds_put(xs, q_dim, e, o);
    }
    ds_sync_consumers();
}

template <int HD>
__global__ void __launch_bounds__(DS_THREADS, 1) decode_step_kernel(const __grid_constant__ ds_args a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int n_slots = a.n_slots;
    uint64_t *full = (uint64_t *)smem, *empty = full + DS_MAX_SLOTS;
    volatile unsigned *copied = (volatile unsigned *)(empty + DS_MAX_SLOTS);
    uint8_t *ring = smem + DS_RING_OFFSET;
    float *fs = (float *)(ring + (size_t)n_slots * a.slot_bytes);
    if (threadIdx.x == 0) {
        *copied = 0;
        for (int s = 0; s < n_slots; s++) lm_mbar_init(&full[s], 1), lm_mbar_init(&empty[s], DS_WARPS);
        lm_mbar_init_fence();
    }
    __syncthreads();
    const int q_dim = a.n_head * a.hd, kv_dim = a.n_head_kv * a.hd;

    if (threadIdx.x >= 32 * DS_WARPS) { /* the producer: weights need no wait for the kernel before */
        const int lane = threadIdx.x - 32 * DS_WARPS;
        if (lane > 1) return;
        ds_producer p = {ring, full, empty, copied, a.slot_bytes, n_slots, lane == 1, 0};
        for (int il = 0; il < a.n_layer; il++) {
            const ds_layer &L = a.layers[il];
            ds_matrix(a, DS_QKV, L.qkv, q_dim + 2 * kv_dim, a.d, p);
            ds_matrix(a, DS_O, L.o, a.d, q_dim, p);
            ds_gate_up(a, L.gu, p);
            ds_matrix(a, DS_DOWN, L.down, a.d, a.n_ff, p);
            if (blockIdx.x == 0 && lane == 0) ds_stamp(a.prof, DS_PROF_PRODUCER + il);
        }
        ds_matrix(a, DS_HEAD, a.head, a.n_vocab, a.d, p);
        if (blockIdx.x == 0 && lane == 0) ds_stamp(a.prof, 4);
        return;
    }

    /* before the wait: the metadata was copied before the kernel before this one, and
     * the angles (one set for every layer) and the embedding need nothing else */
    const int T = 32 * DS_WARPS;
    const int32_t pos = a.meta[0];
    const int32_t *table = a.meta + a.meta[1];
    const int n_split = ds_splits(a, pos + 1);
    float *cs = fs + a.sm_rope, *sn = cs + a.hd / 2;
    for (int i = threadIdx.x; i < a.n_rot / 2; i += T) lm_cuda_rope_cs(pos, a.freq_scale, a.theta, i, a.n_rot, &cs[i], &sn[i]);
    /* the attention's state shares the products' input: neither outlives the stage */
    float *xs = fs + a.sm_xs, *xv = fs + a.sm_xv, *gate = fs + a.sm_gate, *att = xs, *wgt = fs + a.sm_wgt;
    float *red = fs + a.sm_red;
    double *part = (double *)(red + 2 * DS_WARPS);
    const uint8_t *emb = a.emb + (size_t)a.ids[0] * a.emb_row_bytes;
    for (int e = threadIdx.x; e < a.d; e += T) {
        float v = a.emb_type == LM_DTYPE_F32   ? ((const float *)emb)[e]
                  : a.emb_type == LM_DTYPE_F16 ? __half2float(((const __half *)emb)[e])
                                               : __bfloat162float(((const __nv_bfloat16 *)emb)[e]);
        if (a.embd_scale != 1.0f) v = __fmul_rn(v, a.embd_scale);
        xv[e] = v;
    }
    uint64_t *prof = blockIdx.x == 0 && threadIdx.x == 0 ? a.prof : NULL;
    ds_stamp(prof, 0);
    lm_pdl_enter();
    /* block 0 writes the residual stream; every block keeps the embedding for its
     * first norm */
    if (blockIdx.x == 0)
        for (int e = threadIdx.x; e < a.d; e += T) a.x[e] = xv[e];
    ds_sync_consumers();
    ds_stamp(prof, 1);
    unsigned target = 0;

    ds_consumer c = {&a, ring, full, empty, xs, xv, gate, red, ds_row0(a.n_ff, blockIdx.x, a.nb), 0, 0, -1, 0, 0, {}};
    for (int il = 0; il < a.n_layer; il++) {
        const ds_layer &L = a.layers[il];
        uint64_t *lp = prof ? prof + DS_PROF_LAYER + il * DS_PROF_STAGES : NULL;
        ds_norm_input(a, il == 0 ? NULL : a.x, xv, L.attn_norm, xs, part);
        ds_stamp(lp, 0);
        c.stage++;
        ds_matrix(a, DS_QKV, L.qkv, q_dim + 2 * kv_dim, a.d, c);
        ds_attend_prefetch<HD>(a, il, n_split, pos, table);
        ds_stamp(lp, 1);
        ds_grid_sync(a.sync, &target, a.nb);
        ds_stamp(lp, 2);
        for (int u = blockIdx.x; u < a.n_head_kv * n_split; u += a.nb)
            ds_attend_unit<HD>(a, il, u / n_split, u % n_split, n_split, pos, table, cs, sn, att,
                              prof && il == a.n_layer / 2 ? prof + 5 : NULL);
        ds_stamp(lp, 3);
        ds_grid_sync(a.sync, &target, a.nb);
        ds_stamp(lp, 4);
        ds_merge<HD>(a, n_split, wgt, xs);
        ds_stamp(lp, 5);
        c.stage++;
        ds_matrix(a, DS_O, L.o, a.d, q_dim, c);
        ds_stamp(lp, 6);
        ds_grid_sync(a.sync, &target, a.nb);
        ds_stamp(lp, 7);
        ds_norm_input(a, a.x, xv, L.ffn_norm, xs, part);
        ds_stamp(lp, 8);
        c.stage++;
        ds_gate_up(a, L.gu, c);
        ds_stamp(lp, 9);
        ds_grid_sync(a.sync, &target, a.nb);
        ds_stamp(lp, 10);
        for (int e = threadIdx.x; e < a.n_ff; e += T) ds_put(xs, a.n_ff, e, __ldcg(a.h + e));
        ds_sync_consumers();
        ds_stamp(lp, 11);
        c.stage++;
        ds_matrix(a, DS_DOWN, L.down, a.d, a.n_ff, c);
        ds_stamp(lp, 12);
        ds_grid_sync(a.sync, &target, a.nb);
        ds_stamp(lp, 13);
    }
    ds_norm_input(a, a.x, xv, a.out_norm, xs, part);
    ds_stamp(prof, 2);
    c.stage++;
    ds_matrix(a, DS_HEAD, a.head, a.n_vocab, a.d, c);
    ds_stamp(prof, 3);
    /* the last block out sets the counters back for the next launch: every block
     * has passed every barrier by then */
    ds_sync_consumers();
    if (threadIdx.x == 0 && atomicAdd(&a.sync[1], 1u) == (unsigned)a.nb - 1) {
        a.sync[0] = 0;
        a.sync[1] = 0;
        __threadfence();
    }
}

/* ---- the host side ---------------------------------------------------------------- */
static bool ds_matrix_ok(const lm_weight *w, lm_dtype type, int64_t rows, int64_t cols) {
    return w && w->type == type && w->rows == rows && w->cols == cols && cols % 8 == 0 &&
           w->row_bytes == (size_t)cols * 2;
}

/* b's rows follow a's in one allocation (weight_pack) */
static bool ds_packed(const lm_weight *a, const lm_weight *b) {
    return a->pack_next == b && (const uint8_t *)b->data == (const uint8_t *)a->data + a->rows * a->row_bytes;
}

/* The shared memory after the ring (floats): the products' input (which the attention
 * units' state shares), the normalized row, the block's gate rows, the merge
 * weights, the pieces' sums and a block sum's doubles. */
struct ds_layout {
    int xs, xv, gate, wgt, rope, red, floats;
};

static ds_layout ds_layout_of(const lm_hparams *hp, int nb) {
    const int64_t hd = hp->head_dim, q_dim = hp->n_head * hd;
    int64_t xs = hp->n_ff > q_dim ? hp->n_ff : q_dim;
    if (hp->n_embd > xs) xs = hp->n_embd;
    /* ds_attend_unit: q, k, v, a tile's scores, each head's max, sum and rescale, the
     * tile's cache rows, the warps' value sums */
    const int64_t att = DS_MAX_GROUP * hd + 2 * hd + DS_MAX_GROUP * DS_ATT_TILE + 3 * DS_MAX_GROUP + 2 +
                        2 * DS_ATT_TILE + DS_WARPS * DS_MAX_GROUP * hd;
    if (att > xs) xs = att;
    ds_layout l;
    l.xs = 0;
    l.xv = (int)xs;
    l.gate = l.xv + (int)hp->n_embd;
    l.wgt = l.gate + (int)((hp->n_ff + nb - 1) / nb + 1);
    l.rope = l.wgt + 2 * (int)hp->n_head * DS_MAX_SPLITS;
    l.red = (l.rope + (int)hd + 1) & ~1; /* the doubles after red: 8-byte aligned */
    l.floats = l.red + 2 * DS_WARPS + 2 * DS_WARPS;
    return l;
}

/* The slot size (a multiple of 16): a row of every matrix, and 8 rows of n_embd
 * columns where that fits under DS_SLOT_CAP; 0 when a row does not fit. */
static uint32_t ds_slot_bytes(const lm_hparams *hp) {
    const int64_t q_dim = hp->n_head * hp->head_dim;
    int64_t s = 16 * hp->n_embd < (int64_t)DS_SLOT_CAP ? 16 * hp->n_embd : (int64_t)DS_SLOT_CAP;
    if (2 * hp->n_ff > s) s = 2 * hp->n_ff;
    if (2 * q_dim > s) s = 2 * q_dim;
    if (2 * hp->n_embd > s) s = 2 * hp->n_embd;
    return s > (int64_t)DS_SLOT_CAP ? 0 : (uint32_t)s;
}

/* Whether the kernel serves this model, cache and backend (nothing recorded). */
static bool ds_supported(const lm_cuda_backend *cu, const lm_decode_model *m, const lm_kv_cache *kv,
                         lm_backend *b) {
    const lm_hparams *hp = m->hp;
    const int64_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd, d = hp->n_embd;
    if (cu->n_sm < 1 || hp->n_layer < 1 || hp->n_layer > DS_MAX_LAYERS) return false;
    if (hp->has_qk_norm || hp->has_post_norms || hp->ffn_gelu || hp->sliding_window > 0) return false;
    if ((hd != 64 && hd != 128) || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0 ||
        hp->n_head / hp->n_head_kv > DS_MAX_GROUP || hp->n_head_kv > cu->n_sm || hp->n_rot > hd ||
        hp->n_rot % 2 != 0 || hp->n_vocab > INT32_MAX || hp->n_ff > INT32_MAX / 2)
        return false;
    if (!kv || kv->backend != b || kv->type != LM_DTYPE_F16 || kv->n_embd_kv != kv_dim || kv->n_layer < hp->n_layer)
        return false;
    const lm_weight *e = m->tok_embd;
    if (!e || e->cols != d || (e->type != LM_DTYPE_BF16 && e->type != LM_DTYPE_F16 && e->type != LM_DTYPE_F32))
        return false;
    const lm_dtype t = m->layers[0].wq ? m->layers[0].wq->type : LM_DTYPE_F32;
    if (t != LM_DTYPE_BF16 && t != LM_DTYPE_F16) return false;
    if (!ds_matrix_ok(m->output, t, hp->n_vocab, d) || !m->output_norm) return false;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const lm_decode_layer *L = &m->layers[il];
        if (!ds_matrix_ok(L->wq, t, q_dim, d) || !ds_matrix_ok(L->wk, t, kv_dim, d) ||
            !ds_matrix_ok(L->wv, t, kv_dim, d) || !ds_matrix_ok(L->wo, t, d, q_dim) ||
            !ds_matrix_ok(L->w_gate, t, hp->n_ff, d) || !ds_matrix_ok(L->w_up, t, hp->n_ff, d) ||
            !ds_matrix_ok(L->w_down, t, d, hp->n_ff))
            return false;
        if (!ds_packed(L->wq, L->wk) || !ds_packed(L->wk, L->wv) || !ds_packed(L->w_gate, L->w_up)) return false;
        if (!L->attn_norm || !L->ffn_norm || (L->bq != NULL) != hp->has_qkv_bias ||
            (hp->has_qkv_bias && (!L->bk || !L->bv)))
            return false;
    }
    const uint32_t slot = ds_slot_bytes(hp);
    if (!slot) return false;
    const ds_layout l = ds_layout_of(hp, cu->n_sm);
    const int64_t fixed = DS_RING_OFFSET + (int64_t)l.floats * 4;
    return (cu->smem_optin - fixed) / (int64_t)slot >= 3;
}

extern "C" lm_status lm_cuda_decode_step(lm_backend *b, const lm_decode_model *m, lm_kv_cache *kv,
                                         const lm_attn_batch *batch, const int32_t *tokens, float *x,
                                         float *logits) {
    lm_cuda_backend *cu = lm_cuda(b);
    if (!m || !batch || batch->n_tokens != 1 || !tokens || !ds_supported(cu, m, kv, b)) return LM_ERR_UNSUPPORTED;
    lm_cuda_enter(cu);
    const bool in_pass = lm_cuda_recorded_pass(cu); /* errors wait for pass_end */
    const lm_hparams *hp = m->hp;
    const int64_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int32_t *meta = lm_cuda_attn_meta(cu, kv, batch);
    const int32_t *ids = (const int32_t *)lm_cuda_meta_upload(cu, LM_CUDA_META_IDS, tokens, sizeof(int32_t));
    const size_t qkv_n = (size_t)(q_dim + 2 * kv_dim + 3) & ~(size_t)3, h_n = (size_t)(hp->n_ff + 3) & ~(size_t)3;
    const size_t part_n = (size_t)hp->n_head * DS_MAX_SPLITS * (size_t)(hd + 2);
    float *scr = (float *)lm_cuda_scratch(cu, LM_CUDA_SCR_DECODE, (qkv_n + h_n + part_n) * sizeof(float));
    unsigned *sync = (unsigned *)lm_cuda_scratch(cu, LM_CUDA_SCR_COUNTS, 2 * sizeof(unsigned));
    if (!cu->decode_prof && getenv("LUMEN_CUDA_DECODE_PROFILE") && cu->pass_mode != LM_CUDA_PASS_CAPTURE)
        if (cudaMalloc(&cu->decode_prof, DS_PROF_N * sizeof(uint64_t)) != cudaSuccess) {
            cu->decode_prof = NULL; /* no profile; the error is not the step's */
            cudaGetLastError();
        }
    if (!meta || !ids || !scr || !sync) return in_pass ? LM_OK : lm_cuda_take_error(cu);
    if (lm_cuda_replaying(cu)) return LM_OK;

    static thread_local ds_args a; /* ~10 KB: not on the stack; the launch copies it */
    memset(&a, 0, sizeof a);
    a.n_layer = (int)hp->n_layer, a.d = (int)hp->n_embd, a.n_ff = (int)hp->n_ff;
    a.n_head = (int)hp->n_head, a.n_head_kv = (int)hp->n_head_kv, a.hd = (int)hd, a.n_rot = (int)hp->n_rot;
    a.n_vocab = (int)hp->n_vocab, a.bs = (int)kv->block_size, a.nb = cu->n_sm;
    a.neox = hp->rope_mode == LM_ROPE_NEOX, a.f16 = m->layers[0].wq->type == LM_DTYPE_F16;
    a.emb_type = (int)m->tok_embd->type;
    a.slot_bytes = ds_slot_bytes(hp);
    const ds_layout l = ds_layout_of(hp, a.nb);
    const size_t fixed = DS_RING_OFFSET + (size_t)l.floats * 4;
    a.n_slots = (int)(((size_t)cu->smem_optin - fixed) / a.slot_bytes);
    if (a.n_slots > DS_MAX_SLOTS) a.n_slots = DS_MAX_SLOTS;
    const size_t smem = DS_RING_OFFSET + (size_t)a.n_slots * a.slot_bytes + (size_t)l.floats * 4;
    a.eps = hp->rms_eps, a.theta = hp->rope_theta, a.freq_scale = hp->rope_freq_scale;
    a.attn_scale = hp->attn_scale, a.embd_scale = hp->embd_scale;
    a.emb = (const uint8_t *)m->tok_embd->data, a.emb_row_bytes = m->tok_embd->row_bytes;
    a.head = (const uint8_t *)m->output->data, a.out_norm = m->output_norm;
    a.meta = meta, a.ids = ids;
    a.K = (__half *)kv->k, a.V = (__half *)kv->v;
    a.layer_elems = kv->n_blocks * kv->block_size * kv->n_embd_kv;
    a.x = x, a.logits = logits;
    a.qkv = scr, a.h = scr + qkv_n, a.part = scr + qkv_n + h_n;
    a.sync = sync;
    a.sm_xs = l.xs, a.sm_xv = l.xv, a.sm_gate = l.gate, a.sm_wgt = l.wgt, a.sm_rope = l.rope, a.sm_red = l.red;
    a.prof = cu->decode_prof;
    cu->decode_prof_layers = a.n_layer;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const lm_decode_layer *L = &m->layers[il];
        ds_layer *o = &a.layers[il];
        o->qkv = (const uint8_t *)L->wq->data, o->o = (const uint8_t *)L->wo->data;
        o->gu = (const uint8_t *)L->w_gate->data, o->down = (const uint8_t *)L->w_down->data;
        o->attn_norm = L->attn_norm, o->ffn_norm = L->ffn_norm, o->bq = L->bq, o->bk = L->bk, o->bv = L->bv;
    }
    void (*kernel)(ds_args) = hd == 64 ? decode_step_kernel<64> : decode_step_kernel<128>;
    /* set once per size (a direct pass comes before any capture) */
    size_t *set = &cu->decode_smem_set[hd == 64 ? 0 : 1];
    if (*set != smem) {
        if (!lm_cuda_ok(cu, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        "decode_step (shared memory)"))
            return in_pass ? LM_OK : lm_cuda_take_error(cu);
        *set = smem;
    }
    lm_cuda_launch_smem(cu, kernel, (unsigned)a.nb, DS_THREADS, smem, a);
    lm_cuda_launched(cu, "decode_step_kernel");
    return in_pass ? LM_OK : lm_cuda_take_error(cu);
}

extern "C" void lm_cuda_decode_profile_print(lm_cuda_backend *cu) {
    if (!cu->decode_prof) return;
    static uint64_t t[DS_PROF_N];
    if (cudaStreamSynchronize(cu->stream) != cudaSuccess ||
        cudaMemcpy(t, cu->decode_prof, sizeof t, cudaMemcpyDeviceToHost) != cudaSuccess || !t[1]) return;
    static const char *names[DS_PROF_STAGES] = {"norm",   "qkv",   "sync",  "attend", "sync", "merge", "o",
                                                "sync",   "norm2", "gate/up", "sync", "h load", "down", "sync"};
    double sum[DS_PROF_STAGES] = {0};
    int n = 0;
    uint64_t prev = t[1];
    for (int il = 0; il < cu->decode_prof_layers; il++) {
        const uint64_t *lp = t + DS_PROF_LAYER + il * DS_PROF_STAGES;
        fprintf(stderr, "decode_step profile: layer %d ends at %.1f us, its weights issued by %.1f us:", il,
                1e-3 * (double)(lp[DS_PROF_STAGES - 1] - t[1]), 1e-3 * (double)(t[DS_PROF_PRODUCER + il] - t[1]));
        for (int k = 0; k < DS_PROF_STAGES; k++) {
            const double dt = (double)(int64_t)(lp[k] - prev);
            sum[k] += dt, prev = lp[k];
            fprintf(stderr, " %.2f", 1e-3 * dt);
        }
        fprintf(stderr, "\n");
        n++;
    }
    if (!n) return;
    fprintf(stderr, "decode_step profile: wait %.1f us, %d layers, a layer on average:", 1e-3 * (double)(t[1] - t[0]), n);
    for (int k = 0; k < DS_PROF_STAGES; k++) fprintf(stderr, " %s %.2f", names[k], 1e-3 * sum[k] / n);
    {
        const int mid = cu->decode_prof_layers / 2;
        const uint64_t a0 = t[DS_PROF_LAYER + mid * DS_PROF_STAGES + 2];
        fprintf(stderr, " us\ndecode_step profile: layer %d's attention: q %.2f, scores %.2f, softmax and values %.2f",
                mid, 1e-3 * (double)(int64_t)(t[5] - a0), 1e-3 * (double)(int64_t)(t[6] - t[5]),
                1e-3 * (double)(int64_t)(t[7] - t[6]));
    }
    fprintf(stderr, " us\ndecode_step profile: head norm %.1f us, head %.1f us, producer done at %.1f us, total %.1f us\n",
            1e-3 * (double)(t[2] - prev), 1e-3 * (double)(t[3] - t[2]), 1e-3 * (double)(t[4] - t[1]),
            1e-3 * (double)(t[3] - t[1]));
    cudaFree(cu->decode_prof);
    cu->decode_prof = NULL;
}
