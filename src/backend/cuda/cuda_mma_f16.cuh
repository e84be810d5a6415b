/* The f16 tensor-core product both attention kernels use (cuda_attention.cu,
 * cuda_attention_tc.cu) and its operand packing. */
#ifndef LM_BACKEND_CUDA_MMA_F16_CUH
#define LM_BACKEND_CUDA_MMA_F16_CUH

#include "backend/cuda/cuda_internal.cuh"

/* D += A B on one m16n8k16 tile: A 16x16 f16 (4 regs of two halves), B 16x8 f16 (2
 * regs), D 16x8 f32 (4 floats). Fragment layouts (PTX ISA, mma.m16n8k16): with
 * g = lane / 4 and c = 2 (lane % 4): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1],
 * a2 = A[g][c+8..c+9], a3 = A[g+8][c+8..c+9]; b0 = B[c..c+1][g], b1 = B[c+8..c+9][g];
 * d0,d1 = D[g][c..c+1], d2,d3 = D[g+8][c..c+1]. */
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

#endif
