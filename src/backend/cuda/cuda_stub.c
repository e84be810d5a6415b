/* lm_backend_cuda_create for builds without the CUDA backend (LUMEN_CUDA=OFF): a
 * clear error instead of a missing symbol. With LUMEN_CUDA=ON, cuda_backend.cu
 * defines the real one and this file compiles to nothing. */
#include "backend/backend.h"
#include "core/error.h"

#ifndef LUMEN_HAVE_CUDA
lm_status lm_backend_cuda_create(int device, lm_backend **out) {
    (void)device;
    if (out) *out = NULL;
    return lm_error(LM_ERR_UNSUPPORTED, "this build has no CUDA backend (configure with -DLUMEN_CUDA=ON)");
}
#else
typedef int lm_cuda_stub_unused; /* ISO C wants a non-empty translation unit */
#endif
