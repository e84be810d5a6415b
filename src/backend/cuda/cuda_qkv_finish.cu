/* The fused qkv_finish op: for each token (a block of QF_THREADS), the biases of q,
 * k and v, the per-head RMS norms of q and k, RoPE of q and k, and the store of k and
 * v into the paged cache — one launch where the separate ops took seven, each stage
 * computed exactly as its own op computes it (same roundings, same summation order:
 * lm_cuda_block_sum_sq, lm_cuda_rope_angle), so the results are bit-identical.
 * Right after a packed Q/K/V product (cuda_matmul.cu) it reads q, k and v from the
 * product's output, which is then never split into them by a launch of its own. */
#include "backend/cuda/cuda_internal.cuh"

enum { QF_THREADS = 256, QF_MAX_ROT = 512 };

typedef struct qf_args {
    float *q, *k, *v;
    const float *in; /* the packed Q/K/V product [n][q + k + v] to read, or NULL: q, k, v */
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    float eps, theta, freq_scale;
    int n_head, n_head_kv, hd, n_rot, neox;
    int64_t n, bs;
    void *K, *V; /* this layer's cache */
} qf_args;

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

template <bool F16>
__global__ void __launch_bounds__(QF_THREADS) qkv_finish_kernel(const __grid_constant__ qf_args a,
                                                                 const int32_t *__restrict__ meta) {
    __shared__ double part[QF_THREADS / 32];
    /* the angles and the cache slot first, while the kernel before this one still
     * runs: they need only the metadata, copied before the pass's kernels */
    __shared__ float cs[QF_MAX_ROT / 2], sn[QF_MAX_ROT / 2];
    const int64_t t = blockIdx.x;
    const int32_t pos = meta[t];
    const int half = a.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += QF_THREADS) {
        const double angle = lm_cuda_rope_angle(pos, a.freq_scale, a.theta, i, a.n_rot);
        cs[i] = (float)cos(angle), sn[i] = (float)sin(angle);
    }
    const int32_t toff = meta[a.n + t];
    const int64_t slot = (int64_t)meta[toff + pos / a.bs] * a.bs + pos % a.bs;
    lm_pdl_enter();
    const int q_dim = a.n_head * a.hd, kv_dim = a.n_head_kv * a.hd;
    float *q = a.q + t * q_dim, *k = a.k + t * kv_dim, *v = a.v + t * kv_dim;
    if (a.bq || a.in) { /* the biases, and the packed product's rows copied out */
        const float *qi = a.in ? a.in + t * (q_dim + 2 * kv_dim) : q, *ki = a.in ? qi + q_dim : k;
        const float *vi = a.in ? ki + kv_dim : v;
        for (int i = threadIdx.x; i < q_dim; i += QF_THREADS) q[i] = a.bq ? __fadd_rn(qi[i], a.bq[i]) : qi[i];
        for (int i = threadIdx.x; i < kv_dim; i += QF_THREADS) {
            k[i] = a.bq ? __fadd_rn(ki[i], a.bk[i]) : ki[i];
            v[i] = a.bq ? __fadd_rn(vi[i], a.bv[i]) : vi[i];
        }
        __syncthreads();
    }
    if (a.q_norm) {
        qf_norm_heads(q, a.n_head, a.hd, a.q_norm, a.eps, part);
        qf_norm_heads(k, a.n_head_kv, a.hd, a.k_norm, a.eps, part);
    }
    __syncthreads(); /* the angles; every (head, pair) at once: a loop over the heads
                      * per pair chained each head's loads behind the last one's stores */
    for (int j = threadIdx.x; j < (a.n_head + a.n_head_kv) * half; j += QF_THREADS) {
        const int h = j / half, i = j % half;
        const float c = cs[i], s = sn[i];
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
        float *x = h < a.n_head ? q + (int64_t)h * a.hd : k + (int64_t)(h - a.n_head) * a.hd;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        x[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kv_dim; e += QF_THREADS) {
        if (F16) {
            ((__half *)a.K)[slot * kv_dim + e] = __float2half_rn(k[e]);
            ((__half *)a.V)[slot * kv_dim + e] = __float2half_rn(v[e]);
        } else {
            ((float *)a.K)[slot * kv_dim + e] = k[e];
            ((float *)a.V)[slot * kv_dim + e] = v[e];
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
    if (kv->type == LM_DTYPE_F16)
        lm_cuda_launch(cu, qkv_finish_kernel<true>, (unsigned)n, QF_THREADS, a, meta);
    else
        lm_cuda_launch(cu, qkv_finish_kernel<false>, (unsigned)n, QF_THREADS, a, meta);
    lm_cuda_launched(cu, "qkv_finish_kernel");
}
