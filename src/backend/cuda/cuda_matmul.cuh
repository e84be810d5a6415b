/* What the matrix-product kernels share: a set of weights of one format and column
 * count whose rows are concatenated, so Q/K/V or gate/up take one launch. */
#ifndef LM_BACKEND_CUDA_MATMUL_CUH
#define LM_BACKEND_CUDA_MATMUL_CUH

#include <string.h>

#include "backend/cuda/cuda_dequant.cuh"

enum { MV_MAX_SET = 4 };

/* Up to MV_MAX_SET weights of one format (or Q4_K and Q6_K on the 8-bit kernel) and
 * column count, their rows concatenated:
 * global row r belongs to the first weight k with r < end[k]. A kernel parameter read
 * in place (__grid_constant__), so indexing it by k costs no local copy. */
typedef struct mv_set {
    const uint8_t *W[MV_MAX_SET];
    float *y[MV_MAX_SET];
    size_t row_bytes[MV_MAX_SET];
    int rows[MV_MAX_SET], end[MV_MAX_SET];
    int type[MV_MAX_SET]; /* lm_dtype: the 8-bit kernel's sets may mix Q4_K and Q6_K */
    int n_w;
    /* the matrix-vector kernel rounds the decoded weights to bf16, the values the
     * GEMMs read (the precise mode for weights without a copy: cuda_matmul.cu,
     * gemm_split) */
    bool round_w;
} mv_set;

__device__ __forceinline__ int mv_which(const mv_set &s, int row) {
    int k = 0;
    while (k + 1 < s.n_w && row >= s.end[k]) k++;
    return k;
}

/* The set of w[0..n_w) writing to y[0..n_w). */
static inline mv_set mv_set_of(const lm_weight *const *w, int n_w, float *const *y) {
    mv_set set;
    memset(&set, 0, sizeof set);
    int rows_all = 0;
    for (int k = 0; k < n_w; k++) {
        set.W[k] = (const uint8_t *)w[k]->data;
        set.y[k] = y[k];
        set.row_bytes[k] = w[k]->row_bytes;
        set.type[k] = (int)w[k]->type;
        set.rows[k] = (int)w[k]->rows;
        rows_all += (int)w[k]->rows;
        set.end[k] = rows_all;
    }
    set.n_w = n_w;
    return set;
}

/* The matrix-vector path's Q4_K and Q6_K products over 8-bit activations, the CPU
 * backend's arithmetic bit for bit (cuda_matmul_q8.cu): whether it takes w (the
 * backend allows it, the format and shape are ones it serves faster: a function of
 * the weight alone, so matmul_many gives each weight matmul's bits), and y[k] = w[k]
 * x for n tokens, every w[k] one it takes (swiglu: w = (gate, up), y[0] = silu(gate
 * x) * (up x)). Errors are recorded. */
bool lm_cuda_mvq_supports(const lm_cuda_backend *cu, const lm_weight *w);
/* whether b may follow a in one launch of the 8-bit kernel although their formats
 * differ (Q4_K and Q6_K: Q/K/V of a Q4_K_M file, whose V is Q6_K in half the layers),
 * rows_before the set's rows before b */
bool lm_cuda_mvq_mixable(const lm_cuda_backend *cu, const lm_weight *a, const lm_weight *b, int64_t rows_before);
void lm_cuda_mvq(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                 float *const *y, bool swiglu);

/* A Q6_K head's or a Q4_K weight's interleaved copy (w->wide) for the 8-bit kernel:
 * whether w gets one (the kernel takes it; rows a multiple of 32, and for Q6_K many:
 * a head, one lane a row), its bytes, and its filling from w's rows (false: not made,
 * the error cleared; the product then reads the rows in place). */
bool lm_cuda_mvq_wide_wanted(const lm_cuda_backend *cu, const lm_weight *w);
size_t lm_cuda_mvq_wide_bytes(const lm_weight *w);
bool lm_cuda_mvq_wide_fill(lm_cuda_backend *cu, const lm_weight *w, void *dst);

/* The 8-bit hand-off from the gate/up product to the down product (cuda_matmul_q8h.cu):
 * swiglu's output h [n][ff] also written as codes q [n][ff] with a scale da [n][ff /
 * 32] per 32 values (h ~ q * da) and the codes' sum s16 [n][ff / 16] per 16. q NULL:
 * none. */
typedef struct mv_q8h {
    int8_t *q;
    float *da;
    int *s16;
    int ff;
} mv_q8h;

/* Where the 8-bit gate/up kernel writes swiglu's output h [n][ff] in 8 bits too: a
 * hand-off the next op takes if it is the down product on h (lm_cuda_q8h_take), or
 * q NULL when none is offered (fused ops or the hand-off off, a block's pairs not whole
 * groups of 32, the scratch not had). pairs_per_block: the kernel's rows a block / 2. */
mv_q8h lm_cuda_q8h_offer(lm_cuda_backend *cu, const float *h, int64_t n, int64_t ff, int pairs_per_block);
/* Whether y = w x is done from the hand-off (w Q4_K or Q6_K of as many columns as h,
 * x the h offered by the op just before, n its tokens): then done (errors recorded). */
bool lm_cuda_q8h_take(lm_cuda_backend *cu, const lm_weight *w, const float *x, int64_t n, float *y);

/* The tensor-core path (cuda_matmul_tc.cu): y = W x for the n tokens of x, W of a
 * format tc_supports() accepts. Errors are recorded on the backend. */
bool lm_cuda_tc_supports(const lm_weight *w);
void lm_cuda_matmul_tc(lm_cuda_backend *cu, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                       float *const *y);

/* C (f32, column-major rows x chunk) = A^T B, or C += A^T B where accumulate, A bf16
 * [rows][cols], B bf16 [chunk][cols], through cuBLASLt with the shape's timed
 * algorithm (cuda_gemm_algo.cu). false: not done, the caller uses cublasGemmEx; true:
 * done or failed (error recorded). */
bool lm_cuda_gemm_lt(lm_cuda_backend *cu, const void *A, int64_t rows, int64_t cols, const void *B, int64_t chunk,
                     float *C, bool accumulate);

/* The packed gate/up product's chunk ys [nv][2 * ff] (gate then up, per token; ff a
 * multiple of 4, ys and out 16-byte aligned) to out[t][r] = silu(gate) * up
 * (cuda_swiglu.cu); hand_off: also the bf16 copy the down projection's GEMM takes.
 * ys_lo (the precise mode's merged product, cuda_matmul.cu gemm_call; else NULL): the
 * product's lo half, summed with ys first as its sum kernel would, and the hand-off
 * with its lo part too. */
void lm_cuda_swiglu_packed(lm_cuda_backend *cu, const float *ys, const float *ys_lo, int64_t nv, int64_t ff,
                           float *out, bool hand_off);

#endif
