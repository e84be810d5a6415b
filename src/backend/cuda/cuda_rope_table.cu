/* RoPE's cos and sin by position, computed once into a device table for the kernels
 * that rotate q and k in a forward pass (qkv_finish and the decode attention that runs
 * it, cuda_qkv_finish.cu and cuda_attention_dec.cu).
 *
 * Why: those kernels work out a token's angles while the kernel before them still
 * runs, before their PDL wait, and at batch 1 that work is on the step's path: the
 * angle's pow and then its cos and sin in double precision are a chain of some 250
 * dependent instructions (sm_90a SASS) between a block's start and its first use of
 * q. A table row is one load, issued beside the block-table load that the same
 * position already needs. The table is filled by lm_cuda_rope_cs itself, so it holds
 * the very floats the kernels computed: results are bit-identical.
 *
 * One table per (theta, frequency scale, rotated dimensions), at most
 * LM_CUDA_SCR_ROPE_LAST - LM_CUDA_SCR_ROPE + 1 of them (a model with local and global
 * layers has two); a further kind, and positions past a table's length, are computed
 * by the kernels as before. A table covers the cache's positions, up to
 * ROPE_MAX_POS (16 MB at 128 rotated dimensions). It grows only outside a graph
 * capture (a growth moves the buffer, which drops the recorded graphs: mem_gen). */
#include "backend/cuda/cuda_internal.cuh"

enum { ROPE_MIN_POS = 1024, ROPE_MAX_POS = 32768, ROPE_THREADS = 256 };

__global__ void __launch_bounds__(ROPE_THREADS)
    rope_table_kernel(float2 *tab, int64_t positions, int half, float freq_scale, float theta, int n_rot) {
    for (int64_t e = (int64_t)blockIdx.x * ROPE_THREADS + threadIdx.x; e < positions * half;
         e += (int64_t)gridDim.x * ROPE_THREADS) {
        float c, s;
        lm_cuda_rope_cs((int32_t)(e / half), freq_scale, theta, (int)(e % half), n_rot, &c, &s);
        tab[e] = make_float2(c, s);
    }
}

static int64_t pow2_at_least(int64_t n) {
    int64_t p = ROPE_MIN_POS;
    while (p < n && p < ROPE_MAX_POS) p *= 2;
    return p;
}

const float2 *lm_cuda_rope_table(lm_cuda_backend *cu, float theta, float freq_scale, int n_rot, int64_t positions,
                                 int *len) {
    *len = 0;
    if (n_rot < 2 || n_rot % 2) return NULL;
    const int half = n_rot / 2, n_slots = LM_CUDA_SCR_ROPE_LAST - LM_CUDA_SCR_ROPE + 1;
    int slot = -1;
    for (int i = 0; i < n_slots && slot < 0; i++) {
        const lm_cuda_rope_key *k = &cu->rope_key[i];
        if (k->len == 0 || (k->theta == theta && k->freq_scale == freq_scale && k->n_rot == n_rot)) slot = i;
    }
    if (slot < 0) return NULL; /* every slot holds another kind */
    lm_cuda_rope_key *k = &cu->rope_key[slot];
    const int64_t want = pow2_at_least(positions);
    /* in a capture, a table is used as it stands: growing it would record its fill */
    if (k->len < want && cu->pass_mode != LM_CUDA_PASS_CAPTURE && cu->pass_mode != LM_CUDA_PASS_REPLAY) {
        float2 *tab = (float2 *)lm_cuda_scratch(cu, LM_CUDA_SCR_ROPE + slot, (size_t)want * half * sizeof(float2));
        if (!tab) return NULL;
        /* a grown buffer may be a new one: every row is filled again; and waited for,
         * since the kernels read the table before their PDL wait, which would not
         * order them after this kernel (the op tests' recorded passes differed) */
        rope_table_kernel<<<264, ROPE_THREADS, 0, cu->stream>>>(tab, want, half, freq_scale, theta, n_rot);
        if (!lm_cuda_launched(cu, "rope_table_kernel") ||
            !lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "rope table (synchronize)"))
            return NULL;
        k->theta = theta, k->freq_scale = freq_scale, k->n_rot = n_rot, k->len = (int)want;
    }
    if (k->len == 0) return NULL;
    *len = k->len;
    return (const float2 *)cu->scr[LM_CUDA_SCR_ROPE + slot];
}
