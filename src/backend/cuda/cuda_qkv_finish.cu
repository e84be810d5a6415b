/* The fused qkv_finish op: for each token (a block of QF_THREADS), the biases of q,
 * k and v, the per-head RMS norms of q and k, RoPE of q and k, and the store of k and
 * v into the paged cache — one launch where the separate ops took seven, each stage
 * computed exactly as its own op computes it (same roundings, same summation order:
 * lm_cuda_block_sum_sq, lm_cuda_rope_angle; the angles' cos and sin from a table of
 * them, cuda_rope_table.cu), so the results are bit-identical.
 * Right after a packed Q/K/V product (cuda_matmul.cu) it reads q, k and v from the
 * product's output, which is then never split into them by a launch of its own; and
 * there, with an F16 cache and no per-head norms, it is left pending for the
 * tensor-core decode attention after it, whose blocks run it for their own heads
 * (the same roundings, cuda_attention_dec.cu); another op entering first runs it. */
#include "backend/cuda/cuda_internal.cuh"

enum { QF_THREADS = 256, QF_MAX_ROT = 512 };

/* each head of x [n_heads][hd] normalized in place, one head at a time by the block */
__device__ void qf_norm_heads(float *x, int n_heads, int hd, const float *__restrict__ w, float eps, double *part) {
    for (int h = 0; h < n_heads; h++) {
        float *xr = x + (int64_t)h * hd;
        const double total = lm_cuda_block_sum_sq<QF_THREADS>(xr, hd, part);
        const float inv = (float)(1.0 / sqrt(total / (double)hd + (double)eps));
        for (int j = threadIdx.x; j < hd; j += QF_THREADS) xr[j] = __fmul_rn(__fmul_rn(xr[j], inv), w[j]);
        __syncthreads();
    }
}

/* The token's q, k and v sit in shared memory (dynamic) from the first
 * read to the last write: each stage's reads follow the stage before through shared
 * memory, not through global memory (the kernel that did every stage in place in
 * q, k and v took 7.7 us a layer at 64 sequences, 5.6 at one, on the H200). */
template <bool F16>
__global__ void __launch_bounds__(QF_THREADS) qkv_finish_kernel(const __grid_constant__ qf_args a,
                                                                 const int32_t *__restrict__ meta) {
    __shared__ double part[QF_THREADS / 32];
    /* the angles and the cache slot first, while the kernel before this one still
     * runs: they need only the metadata, copied before the pass's kernels */
    __shared__ float cs[QF_MAX_ROT / 2], sn[QF_MAX_ROT / 2];
    extern __shared__ __align__(16) float row[]; /* q, then k, then v */
    const int64_t t = blockIdx.x;
    const int32_t pos = meta[t];
    const int half = a.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += QF_THREADS)
        lm_cuda_rope_cs_from(a.rope, a.rope_len, pos, a.freq_scale, a.theta, i, a.n_rot, &cs[i], &sn[i]);
    const int32_t toff = meta[a.n + t];
    const int64_t slot = (int64_t)meta[toff + pos / a.bs] * a.bs + pos % a.bs;
    lm_pdl_enter();
    const int q_dim = a.n_head * a.hd, kv_dim = a.n_head_kv * a.hd, all = q_dim + 2 * kv_dim;
    float *q = a.q + t * q_dim, *k = a.k + t * kv_dim, *v = a.v + t * kv_dim;
    float *qs = row, *ks = row + q_dim, *vs = ks + kv_dim;
    /* the rows (from the packed product when given) and their biases */
    const float *in = a.in ? a.in + t * all : NULL;
    for (int i = threadIdx.x; i < all; i += QF_THREADS) {
        const bool is_q = i < q_dim, is_k = !is_q && i < q_dim + kv_dim;
        const int j = is_q ? i : is_k ? i - q_dim : i - q_dim - kv_dim;
        const float x = in ? in[i] : is_q ? q[j] : is_k ? k[j] : v[j];
        row[i] = a.bq ? __fadd_rn(x, (is_q ? a.bq : is_k ? a.bk : a.bv)[j]) : x;
    }
    __syncthreads();
    if (a.q_norm) {
        qf_norm_heads(qs, a.n_head, a.hd, a.q_norm, a.eps, part);
        qf_norm_heads(ks, a.n_head_kv, a.hd, a.k_norm, a.eps, part);
    }
    /* every (head, pair) at once: a loop over the heads per pair chained each head's
     * loads behind the last one's stores */
    for (int j = threadIdx.x; j < (a.n_head + a.n_head_kv) * half; j += QF_THREADS) {
        const int h = j / half, i = j % half;
        lm_cuda_rope_rotate(row + (int64_t)h * a.hd, i, half, a.neox, cs[i], sn[i]); /* q's heads, then k's */
    }
    __syncthreads();
    for (int i = threadIdx.x; i < q_dim; i += QF_THREADS) q[i] = qs[i];
    for (int e = threadIdx.x; e < kv_dim; e += QF_THREADS) {
        k[e] = ks[e], v[e] = vs[e];
        if (F16) {
            ((__half *)a.K)[slot * kv_dim + e] = __float2half_rn(ks[e]);
            ((__half *)a.V)[slot * kv_dim + e] = __float2half_rn(vs[e]);
        } else {
            ((float *)a.K)[slot * kv_dim + e] = ks[e];
            ((float *)a.V)[slot * kv_dim + e] = vs[e];
        }
    }
}

extern "C" void lm_cuda_qkv_finish(lm_backend *b, lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                                   const lm_qkv_finish *p) {
    lm_cuda_backend *cu = lm_cuda(b);
    /* taken before entering, which would split it */
    const float *in = lm_cuda_qkv_take(cu, p->q, p->k, p->v, batch->n_tokens);
    lm_cuda_enter(cu);
    const int64_t n = batch->n_tokens;
    if (n <= 0) return;
    if (kv->backend != b) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "qkv_finish: the KV cache belongs to another backend");
        return;
    }
    if (n > 2147483647LL || p->n_rot > p->head_dim || p->n_rot > QF_MAX_ROT ||
        p->n_head_kv * p->head_dim != kv->n_embd_kv ||
        (kv->type != LM_DTYPE_F16 && kv->type != LM_DTYPE_F32) || (p->q_norm && !p->k_norm) ||
        (p->bq && (!p->bk || !p->bv))) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "qkv_finish: inconsistent arguments (%lld tokens, rot %lld of %lld)",
                     (long long)n, (long long)p->n_rot, (long long)p->head_dim);
        return;
    }
    const int32_t *meta = lm_cuda_attn_meta(cu, kv, batch);
    if (!meta || lm_cuda_replaying(cu)) return;
    qf_args a;
    a.q = p->q, a.k = p->k, a.v = p->v, a.in = in;
    a.bq = p->bq, a.bk = p->bk, a.bv = p->bv, a.q_norm = p->q_norm, a.k_norm = p->k_norm;
    a.eps = p->eps, a.theta = p->theta, a.freq_scale = p->freq_scale;
    a.n_head = (int)p->n_head, a.n_head_kv = (int)p->n_head_kv, a.hd = (int)p->head_dim, a.n_rot = (int)p->n_rot;
    a.neox = p->mode == LM_ROPE_NEOX;
    a.n = n, a.bs = kv->block_size;
    const size_t layer_off = (size_t)(layer * kv->n_blocks * kv->block_size * kv->n_embd_kv) * kv->elem_size;
    a.K = (uint8_t *)kv->k + layer_off, a.V = (uint8_t *)kv->v + layer_off;
    a.rope = lm_cuda_rope_table(cu, a.theta, a.freq_scale, a.n_rot, kv->n_blocks * kv->block_size, &a.rope_len);
    /* on a packed product (a decode step's GEMM path), with an F16 cache and no
     * per-head norms: left for the attention right after it to run in its blocks
     * (cuda_attention_dec.cu), one launch and one trip through memory fewer; any
     * other op runs it first */
    if (cu->fused && cu->finish_in_attention && in && !p->q_norm && kv->type == LM_DTYPE_F16) {
        cu->finish_pending.on = true;
        cu->finish_pending.a = a;
        cu->finish_pending.meta = meta;
        cu->finish_pending.kv = kv;
        cu->finish_pending.layer = layer;
        return;
    }
    lm_cuda_finish_run(cu, a, meta, kv->type == LM_DTYPE_F16);
}

void lm_cuda_finish_run(lm_cuda_backend *cu, const qf_args &a, const int32_t *meta, bool f16) {
    const size_t smem = (size_t)(a.n_head + 2 * a.n_head_kv) * (size_t)a.hd * sizeof(float);
    void (*kernel)(qf_args, const int32_t *) = f16 ? qkv_finish_kernel<true> : qkv_finish_kernel<false>;
    if (smem > 48 * 1024 &&
        !lm_cuda_ok(cu, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    "qkv_finish (shared memory for a token's q, k and v)"))
        return;
    lm_cuda_launch_smem(cu, kernel, (unsigned)a.n, QF_THREADS, smem, a, meta);
    lm_cuda_launched(cu, "qkv_finish_kernel");
}

void lm_cuda_finish_flush(lm_cuda_backend *cu) {
    cu->finish_pending.on = false;
    lm_cuda_finish_run(cu, cu->finish_pending.a, cu->finish_pending.meta, true);
}

bool lm_cuda_finish_take(lm_cuda_backend *cu, const void *kv, int64_t layer, const float *q, int64_t n,
                         lm_cuda_finish *f) {
    const lm_cuda_finish *p = &cu->finish_pending;
    if (!p->on || p->kv != kv || p->layer != layer || p->a.q != q || p->a.n != n) return false;
    *f = *p;
    cu->finish_pending.on = false;
    return true;
}

void lm_cuda_finish_put_back(lm_cuda_backend *cu, const lm_cuda_finish *f) { cu->finish_pending = *f; }
