/* out[i] = silu(gate[i]) * up[i] (lm_swiglu1) */
#include "backend/cuda/cuda_matmul.cuh"

/* four elements a thread with 16-byte loads (a prompt's gate/up rows are 55 MB a
 * layer of a 1.5B model: scalar loads left the kernel at half the memory rate) */
/* out[i] = silu(g) * u for four elements, and in bf16 at outb[i] (outb may be NULL) */
__device__ __forceinline__ void swiglu4_store(float4 g, float4 u, float4 *out, uint2 *outb, int64_t i) {
    const float4 o =
        make_float4(lm_swiglu1(g.x, u.x), lm_swiglu1(g.y, u.y), lm_swiglu1(g.z, u.z), lm_swiglu1(g.w, u.w));
    out[i] = o;
    if (outb) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
        outb[i] = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
    }
}

__global__ void swiglu4_kernel(const float4 *gate, const float4 *up, int64_t n4, float4 *out, uint2 *outb) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x)
        swiglu4_store(gate[i], up[i], out, outb, i);
}

__global__ void swiglu_kernel(const float *gate, const float *up, int64_t n, float *out) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = lm_swiglu1(gate[i], up[i]);
}

extern "C" void lm_cuda_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_replaying(cu)) return;
    if (n <= 0) return;
    const bool vec = n % 4 == 0 && (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)out) & 15) == 0;
    if (vec) /* with the down projection's input in bf16 where that takes a GEMM */
        lm_cuda_launch(cu, swiglu4_kernel, lm_cuda_blocks(n / 4, 256), 256, (const float4 *)gate, (const float4 *)up,
                       n / 4, (float4 *)out, (uint2 *)lm_cuda_gemm_input(cu, out, n));
    else
        lm_cuda_launch(cu, swiglu_kernel, lm_cuda_blocks(n, 256), 256, gate, up, n, out);
    lm_cuda_launched(cu, "swiglu_kernel");
}

/* The packed gate/up product (cuda_matmul.cu): token t's gate and up are ys[t][0..ff)
 * and ys[t][ff..2ff); four elements a thread. */
__global__ void swiglu_packed_kernel(const float4 *__restrict__ ys, int64_t ff4, int64_t total4, float4 *out,
                                     uint2 *outb) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / ff4, r = i - t * ff4;
        swiglu4_store(ys[2 * t * ff4 + r], ys[(2 * t + 1) * ff4 + r], out, outb, i);
    }
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ uint2 bf16_lo4(float4 o) {
    const __nv_bfloat16 a = lm_bf16_lo(o.x), b = lm_bf16_lo(o.y), c = lm_bf16_lo(o.z), d = lm_bf16_lo(o.w);
    return make_uint2((uint32_t)__bfloat16_as_ushort(a) | (uint32_t)__bfloat16_as_ushort(b) << 16,
                      (uint32_t)__bfloat16_as_ushort(c) | (uint32_t)__bfloat16_as_ushort(d) << 16);
}

/* The precise mode's form: gate and up each the sum of the product's two halves (as
 * halves_sum_kernel adds them), the output handed off as hi (outb) and lo (outl). */
__global__ void swiglu_packed_halves_kernel(const float4 *__restrict__ ys, const float4 *__restrict__ ys_lo,
                                            int64_t ff4, int64_t total4, float4 *out, uint2 *outb, uint2 *outl) {
    lm_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / ff4, r = i - t * ff4, g = 2 * t * ff4 + r, u = (2 * t + 1) * ff4 + r;
        swiglu4_store(add4(ys[g], ys_lo[g]), add4(ys[u], ys_lo[u]), out, outb, i);
        if (outl) outl[i] = bf16_lo4(out[i]);
    }
}

void lm_cuda_swiglu_packed(lm_cuda_backend *cu, const float *ys, const float *ys_lo, int64_t nv, int64_t ff,
                           float *out, bool hand_off) {
    const int64_t total4 = nv * ff / 4;
    if (ys_lo) {
        __nv_bfloat16 *lo = NULL;
        uint2 *outb = hand_off ? (uint2 *)lm_cuda_gemm_input_split(cu, out, nv, ff, &lo) : NULL;
        lm_cuda_launch(cu, swiglu_packed_halves_kernel, lm_cuda_blocks(total4, 256), 256, (const float4 *)ys,
                       (const float4 *)ys_lo, ff / 4, total4, (float4 *)out, outb, (uint2 *)lo);
        lm_cuda_launched(cu, "swiglu_packed_halves_kernel");
        return;
    }
    uint2 *outb = hand_off ? (uint2 *)lm_cuda_gemm_input(cu, out, nv * ff) : NULL;
    lm_cuda_launch(cu, swiglu_packed_kernel, lm_cuda_blocks(total4, 256), 256, (const float4 *)ys, ff / 4, total4,
                   (float4 *)out, outb);
    lm_cuda_launched(cu, "swiglu_packed_kernel");
}
