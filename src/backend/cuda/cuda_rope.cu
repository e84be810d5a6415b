/* RoPE in place on x [n][n_head * head_dim]: a block per token, a thread per rotated
 * pair. The angle is computed in double exactly as the CPU reference writes it
 * (pos * freq_scale * theta^(-2i/n_rot), then cos/sin rounded to float), and the
 * rotation rounds each product separately, as the reference's C does. */
#include "backend/cuda/cuda_internal.cuh"

__global__ void rope_kernel(float *x, const int32_t *__restrict__ pos, int64_t n_head, int64_t head_dim,
                            int64_t n_rot, float theta, float freq_scale, int neox) {
    lm_pdl_enter();
    const int64_t t = blockIdx.x, half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        lm_cuda_rope_cs(pos[t], freq_scale, theta, i, (int)n_rot, &c, &s);
        for (int64_t h = 0; h < n_head; h++)
            lm_cuda_rope_rotate(x + (t * n_head + h) * head_dim, i, (int)half, neox, c, s);
    }
}

extern "C" void lm_cuda_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                             const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n <= 0 || n_rot < 2) return;
    if (n_rot > head_dim || n > 2147483647LL) {
        lm_cuda_fail(cu, LM_ERR_INVALID_ARG, "rope: n_rot %lld exceeds head_dim %lld or too many tokens",
                     (long long)n_rot, (long long)head_dim);
        return;
    }
    const int32_t *d_pos = (const int32_t *)lm_cuda_meta_upload(cu, LM_CUDA_META_POS, pos, (size_t)n * sizeof(int32_t));
    if (!d_pos || lm_cuda_replaying(cu)) return;
    int threads = n_rot / 2 >= 128 ? 128 : n_rot / 2 >= 64 ? 64 : 32;
    lm_cuda_launch(cu, rope_kernel, (unsigned)n, threads, x, d_pos, n_head, head_dim, n_rot, theta, freq_scale,
                   mode == LM_ROPE_NEOX);
    lm_cuda_launched(cu, "rope_kernel");
}
