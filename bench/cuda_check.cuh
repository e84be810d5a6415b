/* CK(call): the stand-alone CUDA benchmarks' check of a runtime call: on an error,
 * where and what, then exit(1). */
#ifndef LM_BENCH_CUDA_CHECK_CUH
#define LM_BENCH_CUDA_CHECK_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

#endif
