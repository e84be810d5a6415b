/* Shared between the CUDA backend's files: the backend and weight structs, error
 * recording, growable device scratch, and host metadata uploads.
 *
 * Everything runs on one non-blocking stream per backend, in call order, so ops
 * return as soon as their kernels are queued; upload/download/weight_create wait for
 * the stream. The backend is used by one thread at a time (the engine's worker), so
 * its scratch and metadata buffers need no locking. */
#ifndef LM_BACKEND_CUDA_INTERNAL_CUH
#define LM_BACKEND_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
}

/* cuBLAS's own workspace (cublas_ws), set once: a GEMM inside a graph capture must
 * not allocate. Shared by cuBLAS and cuBLASLt, which run on the one stream. */
enum { LM_CUDA_CUBLAS_WORKSPACE = 32 << 20 };

/* Bytes allocated after every weight: kernels may read whole 16-byte words that end
 * past a weight's last byte (Q6_K's 2-byte-aligned super-blocks, cuda_matmul_q8.cu). */
enum { LM_CUDA_WEIGHT_PAD = 32 };

/* Host metadata copied to the device; one slot per kind so the kinds of one forward
 * pass do not evict each other (each is uploaded once per pass, then reused). */
enum lm_cuda_meta_kind { LM_CUDA_META_POS, LM_CUDA_META_ATTN, LM_CUDA_META_IDS, LM_CUDA_META_TILES, LM_CUDA_META_COUNT };

/* Device scratch, one buffer per purpose, grown on demand. */
enum lm_cuda_scratch_slot {
    LM_CUDA_SCR_WTILE, /* matmul: a tile of weight rows dequantized to bf16    */
    LM_CUDA_SCR_XB,    /* matmul: activations as bf16 (or padded f32)          */
    LM_CUDA_SCR_XQ,    /* matmul: swiglu's output in 8 bits for the down product */
    LM_CUDA_SCR_Y,     /* matmul: one GEMM chunk's output                      */
    LM_CUDA_SCR_YPACK, /* matmul: one chunk of packed weights' product         */
    LM_CUDA_SCR_YSPLIT, /* matmul: the precise mode's two halves of a product (gemm_call) */
    LM_CUDA_SCR_ATTN,  /* attention: split partials                            */
    LM_CUDA_SCR_COPY,  /* copy: staging for overlapping ranges                 */
    LM_CUDA_SCR_TOPK,  /* logits_topk: the candidates before their copy home    */
    LM_CUDA_SCR_COUNTS, /* attention: split counters; decode_step: its barrier's */
                        /* (zeroed when allocated; the kernels leave them at zero) */
    LM_CUDA_SCR_DECODE, /* decode_step: Q/K/V, the FFN's hidden row, attention splits */
    LM_CUDA_SCR_ROPE,   /* qkv_finish: RoPE's cos and sin by position (cuda_rope_table.cu), */
    LM_CUDA_SCR_ROPE_LAST = LM_CUDA_SCR_ROPE + 1, /* one slot per (theta, scale, rotated dims) */
    LM_CUDA_SCR_COUNT
};

/* A RoPE table's key and length (positions), one per LM_CUDA_SCR_ROPE slot; len 0: empty. */
typedef struct lm_cuda_rope_key {
    float theta, freq_scale;
    int n_rot, len;
} lm_cuda_rope_key;

typedef struct lm_cuda_meta {
    void *pinned;  /* page-locked staging the copy reads from */
    size_t pinned_cap;
    void *shadow;  /* what the device copy holds (host)       */
    size_t shadow_cap, bytes;
    bool valid;
    void *dev;
    size_t dev_cap;
    cudaEvent_t copied; /* recorded after the last copy out of `pinned` */
} lm_cuda_meta;

/* How ops behave inside a forward pass (cuda_graph.cu): DIRECT outside a pass or
 * in a pass that is not recorded; WARM: the first pass of a shape, run directly
 * but with the recorded sizes so every buffer reaches its size; CAPTURE: the ops
 * are recorded into a CUDA graph (nothing runs until pass_end launches it);
 * REPLAY: a recording of this shape exists, ops only stage their host metadata. */
enum lm_cuda_pass_mode { LM_CUDA_PASS_DIRECT, LM_CUDA_PASS_WARM, LM_CUDA_PASS_CAPTURE, LM_CUDA_PASS_REPLAY };

enum { LM_CUDA_GRAPHS = 32, LM_CUDA_SEEN = 64, LM_CUDA_WARM_RUNS = 2 };

typedef struct lm_cuda_graph {
    uint64_t key;      /* 0: free slot                                   */
    uint64_t mem_gen;  /* cu->mem_gen when recorded: buffers it points at */
    uint64_t last_use;
    cudaGraphExec_t exec;
    /* its metadata is the pass's token ids, positions and attention metadata, as
     * pass_begin can stage them itself: a replay needs no walk through the ops */
    bool self_staged;
    uint32_t meta_kinds; /* bit per meta kind its copies read */
} lm_cuda_graph;

/* The arguments of the qkv_finish kernel (cuda_qkv_finish.cu), kept whole when the
 * op is left for the attention after it to run (finish_pending). */
typedef struct qf_args {
    float *q, *k, *v;
    const float *in; /* the packed Q/K/V product [n][q + k + v] to read, or NULL: q, k, v */
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    float eps, theta, freq_scale;
    int n_head, n_head_kv, hd, n_rot, neox;
    int64_t n, bs;
    void *K, *V; /* this layer's cache */
    const float2 *rope; /* RoPE's (cos, sin) for positions [0, rope_len) (lm_cuda_rope_table), or NULL */
    int rope_len;
} qf_args;

/* A qkv_finish left for the attention after it: its kernel's arguments and the call's. */
typedef struct lm_cuda_finish {
    bool on;
    qf_args a;
    const int32_t *meta;
    const void *kv;
    int64_t layer;
} lm_cuda_finish;

enum { LM_CUDA_CARVEOUT_KERNELS = 256 };

typedef struct lm_cuda_backend {
    lm_backend base;
    lm_backend_ops ops; /* base.ops points here */
    int device, n_sm;
    char name[256];
    size_t total_mem;
    uint64_t peak_used; /* most device memory in use seen after an allocation */
    size_t bf16_budget, bf16_used; /* copies beside the weights (lm_weight.bf16, .wide): allowed, made */
    cudaStream_t stream;
    cublasHandle_t cublas;
    cublasLtHandle_t cublaslt; /* NULL: the products go through cublasGemmEx only */
    bool pools;        /* stream-ordered allocation (cudaMallocAsync) available */
    lm_status err;     /* first error not yet reported (LM_OK: none)            */
    char err_msg[512];
    lm_cuda_meta meta[LM_CUDA_META_COUNT];
    void *scr[LM_CUDA_SCR_COUNT];
    size_t scr_cap[LM_CUDA_SCR_COUNT];
    lm_cuda_rope_key rope_key[LM_CUDA_SCR_ROPE_LAST - LM_CUDA_SCR_ROPE + 1]; /* what the RoPE slots hold */
    int64_t mv_max_n;  /* matmul: exact f32 matrix-vector kernel up to this many tokens */
    int64_t mv_max_n_quant; /* the same for quantized weights (path_of, cuda_matmul.cu) */
    int64_t mv_max_n_copy;  /* the same for quantized weights with a bf16 copy */
    bool mvq;          /* matmul: Q4_K/Q6_K there over 8-bit activations (cuda_matmul_q8.cu; LUMEN_CUDA_MVQ=0: not) */
    bool mvq_wide;     /* matmul: a Q6_K head's interleaved copy for the 8-bit kernel (LUMEN_CUDA_MVQ_WIDE=0: not) */
    bool mvq_q4w;      /* matmul: Q4_K weights' interleaved copies for the 8-bit kernel (LUMEN_CUDA_MVQ_Q4W=0: not) */
    bool precise;      /* matmul: the precise mode (LUMEN_CUDA_PRECISE=1; cuda_matmul.cu, gemm_split) */
    bool mv_stage;     /* matmul: one token's quantized rows staged in shared memory (LUMEN_CUDA_MV_STAGE=0: not) */
    bool gu_stage;     /* matmul: one token's Q4_K gate/up rounds staged after its wait (LUMEN_CUDA_GU_STAGE=0: not) */
    bool q8_handoff;   /* matmul: swiglu's output handed to the down product in 8 bits (LUMEN_CUDA_Q8_HANDOFF=0: not) */
    int64_t tc_max_n;  /* matmul: tensor-core kernel up to this many tokens     */
    int64_t tc_max_n_quant; /* the same for quantized weights without a bf16 copy (none) */
    int64_t gemm_chunk; /* matmul: smallest GEMM width above both (padded)      */
    int64_t attn_dec_min_n; /* attention: tensor-core decode kernel from this many tokens */
    int attn_dec_warps;     /* attention: that kernel's warps a block, 0: by the batch (LUMEN_CUDA_ATTN_DEC_WARPS) */
    bool attn_dec_ahead;    /* its first KV blocks loaded before the PDL wait (LUMEN_CUDA_ATTN_DEC_AHEAD=0: not) */
    unsigned attn_dec_smem; /* its forms whose dynamic shared memory was allowed (cuda_attention_dec.cu) */
    int smem_optin;         /* shared memory a block may ask for (bytes)            */
    int norm_alone; /* the one-row norm alone on its SM: 1, -1 refused or LUMEN_CUDA_NORM_ALONE=0, 0 unasked */
    int carveout;           /* preferred shared-memory carveout, % (lm_cuda_launch_with; -1: the driver's) */
    const void *carveout_set[LM_CUDA_CARVEOUT_KERNELS]; /* the kernels it is set on */
    int carveout_n;
    size_t decode_smem_set[2]; /* decode_step kernels' shared memory as last set    */
    uint64_t *decode_prof;  /* LUMEN_CUDA_DECODE_PROFILE: decode_step's stage clocks (cuda_decode_step.cu) */
    int decode_prof_layers;
    bool attn_prof_on;             /* LUMEN_CUDA_ATTN_PROFILE=1                                     */
    unsigned long long *attn_prof; /* then the decode attention's phase sums (cuda_attention_dec.cu) */
    bool fused;        /* fused ops on (LUMEN_CUDA_FUSED=0 turns them off)       */
    bool finish_in_attention; /* qkv_finish left to the decode attention (LUMEN_CUDA_FINISH_IN_ATTN=0: never) */
    uint64_t op_seq;   /* entry points entered so far (lm_cuda_enter)           */
    /* the bf16 copy of its output the op before left in the XB scratch for a GEMM
     * (lm_cuda_gemm_input): its source, element count and op_seq */
    const float *gemm_in_src;
    int64_t gemm_in_count;
    uint64_t gemm_in_seq;
    bool gemm_in_lo;   /* with its lo part too (the precise mode: lm_cuda_gemm_input_split) */
    /* the 8-bit copy of its output an 8-bit gate/up product left in the XQ scratch for
     * the down product (cuda_matmul_q8h.cu): its source, element count and op_seq */
    const float *q8_in_src;
    int64_t q8_in_count;
    uint64_t q8_in_seq;
    /* a packed Q/K/V product not yet split into its outputs (cuda_matmul.cu): the next
     * op takes it in place if it is qkv_finish on those outputs, else it is split as
     * that op enters (lm_cuda_enter). ys: NULL when none. */
    struct {
        const float *ys;
        int64_t n;
        float *y[3];
        int rows[3];
    } qkv_pending;
    /* a qkv_finish on a packed Q/K/V product not yet run (cuda_qkv_finish.cu): the
     * tensor-core decode attention right after it runs it as its blocks start
     * (lm_cuda_finish_take); any other op runs it as it enters (lm_cuda_enter). */
    lm_cuda_finish finish_pending;
    /* the precise mode's product whose two halves (one GEMM over hi and lo columns,
     * cuda_matmul.cu gemm_call) are not yet summed into dst: the next op takes them
     * if it is an add_rms_norm adding dst (lm_cuda_sum_take), else they are summed as
     * that op enters (lm_cuda_enter). dst: NULL when none. */
    struct {
        float *dst;
        const float *c2; /* hi at c2, lo at c2 + count */
        int64_t count;
    } sum_pending;
    /* logits_topk's outputs come back in one copy through this page-locked buffer */
    void *topk_host;
    size_t topk_host_cap;
    /* attention metadata built on the host: [pos: n][table offset: n][tables] */
    int32_t *attn_host;
    size_t attn_host_cap;
    int32_t *seq_off;  /* per sequence id: its table's offset in attn_host (-1) */
    int64_t seq_off_cap;
    void *cublas_ws;   /* cuBLAS's workspace: no allocation inside a capture   */
    uint32_t *dec_seen;  /* attention: per sequence, the stamp of the last batch it was in */
    int64_t dec_seen_cap;
    uint32_t dec_seen_stamp;
    int32_t *tc_tiles; /* tensor-core attention: [first token, count] per tile */
    int64_t tc_tiles_cap;
    /* forward passes recorded as CUDA graphs (cuda_graph.cu) */
    bool graphs_on;    /* LUMEN_CUDA_GRAPHS=0 turns recording off              */
    bool pdl;          /* programmatic dependent launch (lm_cuda_launch)        */
    int64_t record_max_n; /* passes of more tokens run directly (LUMEN_CUDA_RECORD_MAX_N) */
    int pass_mode;     /* lm_cuda_pass_mode                                    */
    uint64_t pass_key; /* the current pass's key, buckets included             */
    int64_t pass_meta_ints; /* attention metadata of the pass, padded (ints)   */
    int pass_splits;   /* attention grid splits of the pass, rounded up        */
    uint32_t pass_meta_sent; /* bit per meta kind: uploaded in this pass       */
    const int32_t *pass_tokens, *pass_pos; /* the pass's host arrays (pass_begin's) */
    uint64_t mem_gen;  /* bumped whenever a scratch or metadata buffer moves, or a weight goes */
    /* between pass_begin and pass_end: the pass's number (0 outside a pass); the
     * attention metadata built in it, for the pass's later layers */
    uint64_t pass_epoch, pass_count;
    struct {
        uint64_t epoch;
        const void *kv, *pos, *seq; /* the batch's arrays: pass_begin's view of them is its own */
        int64_t n;
        const int32_t *dev;
    } meta_cache;
    uint64_t use_clock;
    lm_cuda_graph graphs[LM_CUDA_GRAPHS];
    uint64_t seen[LM_CUDA_SEEN]; /* keys run directly (WARM), ring           */
    int seen_runs[LM_CUDA_SEEN]; /* how many times each                      */
    uint64_t seen_gen[LM_CUDA_SEEN]; /* mem_gen while they were counted      */
    int seen_next;
    uint64_t n_captured, n_replayed; /* printed at exit with LUMEN_CUDA_GRAPHS_LOG=1 */
    /* LUMEN_CUDA_GRAPHS_LOG=1 also times each replay: on the GPU, the graph (events
     * 0 and 1 around its launch) and what follows it up to the candidates' copy to
     * the host (event 2, recorded by logits_topk); on the host, the pass's calls up to
     * the launch (the GPU idles through them unless work is queued) and the whole
     * step, pass_begin to the next pass_begin. Read at the next pass_begin: they say
     * where a step's wall time goes */
    bool graphs_log;
    cudaEvent_t replay_ev[3];
    int64_t pass_n, timed_n; /* tokens of the current pass, of the replay being timed (0: none) */
    bool timed_tail;         /* event 2 was recorded after the timed replay              */
    double t_begin, t_build; /* host clock at the timed pass's pass_begin; seconds to its launch */
    double t_ops, t_end;     /* host clock as pass_begin returned, as pass_end was entered  */
    double t_part[3];        /* the timed pass's seconds in pass_begin, its ops, the launch */
    struct {
        int64_t n, count, n_tail, n_wall;
        double ms, tail_ms, build_ms, wall_ms, part_ms[3];
    } replay_time[8];
    int64_t profile_n; /* LUMEN_CUDA_PROFILE_N: passes of this many tokens are profiled */
    bool profiling;    /* between cudaProfilerStart and cudaProfilerStop           */
} lm_cuda_backend;

static inline bool lm_cuda_replaying(const lm_cuda_backend *cu) { return cu->pass_mode == LM_CUDA_PASS_REPLAY; }
static inline bool lm_cuda_recorded_pass(const lm_cuda_backend *cu) { return cu->pass_mode != LM_CUDA_PASS_DIRECT; }

/* A weight matrix in device memory. `type` is the device format: the file's own
 * block layout for the formats the kernels decode, else F16/F32 converted at load. */
struct lm_weight {
    lm_dtype type;
    int64_t rows, cols;
    size_t row_bytes;
    void *data;
    void *alloc;                 /* the memory weight_free gives back (NULL: a
                                  * packed weight's, given back with the first's) */
    const lm_weight *pack_next;  /* weight_pack: the weight whose rows follow this
                                  * one's in memory, or NULL                    */
    void *wide;                  /* a Q6_K head's or a Q4_K weight's rows again,
                                  * interleaved for the 8-bit kernel's coalesced
                                  * loads (cuda_matmul_q8.cu, lm_cuda_mvq_wide_fill),
                                  * or NULL                                     */
    const lm_weight *pack_first; /* weight_pack: the first weight of this one's pack
                                  * (itself for the first), or NULL            */
    const lm_weight *copy_next;  /* weight_pack's set whatever its formats (one
                                  * width): the next weight, whose bf16 copy follows
                                  * this one's in the same allocation, or NULL    */
    const lm_weight *copy_first; /* that set's first weight, or NULL             */
    /* A quantized or f16 weight's rows decoded to bf16 once, at its first product,
     * where the budget allows (cuda_matmul.cu, copy_decide): read by the GEMM path and,
     * for quantized weights, the tensor-core path. A weight_pack set's copies are one
     * allocation, in order (so one GEMM takes them all, even where their formats kept
     * them from being packed: a Q4_K_M file's Q4_K Q and K and Q6_K V), held by the
     * set's first weight. */
    mutable const __nv_bfloat16 *bf16;
    mutable size_t bf16_bytes;   /* the copy's bytes where this weight holds it, else 0 */
    mutable bool bf16_decided;   /* its first product has come: copy or not, for good */
};

static inline lm_cuda_backend *lm_cuda(lm_backend *b) { return (lm_cuda_backend *)b; }

/* Device memory for weight data (and copies of it), counted in the peak; NULL when
 * there is none (no error recorded). */
void *lm_cuda_weight_alloc(lm_cuda_backend *cu, size_t bytes);

/* Records the first error (kept until reported); later ones are dropped. */
void lm_cuda_fail(lm_cuda_backend *cu, lm_status st, const char *fmt, ...) LM_PRINTF(3, 4);

/* false (and the error recorded, naming `what`) when e is not cudaSuccess. */
bool lm_cuda_ok(lm_cuda_backend *cu, cudaError_t e, const char *what);

/* Checks that the kernel just queued was launched. */
static inline bool lm_cuda_launched(lm_cuda_backend *cu, const char *kernel) {
    return lm_cuda_ok(cu, cudaGetLastError(), kernel);
}

/* Programmatic dependent launch (Hopper). A kernel queued with lm_cuda_launch may be
 * scheduled while the kernel before it in the stream is still running: it calls
 * lm_pdl_enter() first, which waits until that kernel has finished and its writes are
 * visible, then lets the next kernel be scheduled in turn. What overlaps is the launch
 * and block scheduling of one kernel with the tail of the previous one: the gap
 * between the small kernels of a decode step. Every kernel queued with lm_cuda_launch
 * must call lm_pdl_enter() before it touches memory that kernels write; what only the
 * host writes, before the pass (weights, the pass's metadata, a RoPE table filled and
 * waited for), may be read ahead of it, and the products' weights and the attention's
 * metadata are. Kernels queued with <<<>>> (and copies, cuBLAS) keep the full stream
 * order. LUMEN_CUDA_PDL=0 turns it off.
 *
 * LET_IN_FIRST: the next kernel let in before the wait, so it may be scheduled while
 * the kernel before this one still runs (two links of the chain resident ahead
 * instead of one; its own wait still waits for this kernel, so for the one before
 * too). Only for kernels whose successors start no weight traffic before their wait:
 * with every kernel entering so, the 8-bit products' early weight requests came in
 * under the norms and the attention and slowed them (H200, 1.5B-shaped, batch 1,
 * seventeenth session: Q4_K_M 846-854 vs 954-970 tokens/s). The matrix-vector kernels
 * enter so where the product after them requests nothing early: the f32/bf16 one's
 * (cuda_matmul.cu), the 8-bit one's but gate/up (cuda_matmul_q8.cu), the 8-bit down
 * products' (cuda_matmul_q8h.cu). */
template <bool LET_IN_FIRST = false>
__device__ __forceinline__ void lm_pdl_enter(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (LET_IN_FIRST) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    if constexpr (!LET_IN_FIRST) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* The GPU's global clock in nanoseconds (profiles). */
__device__ __forceinline__ uint64_t lm_cuda_clock_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The shared-memory carveout (the split of an SM's 256 KB between L1 and shared
 * memory) is the SM's, not a block's: while blocks of one kernel run on an SM at one
 * split, blocks of a kernel that wants another cannot start there until the SM drains
 * and is reconfigured, which undoes what programmatic dependent launch overlaps. Left
 * to the driver, the 8-bit products of a few tokens (cuda_matmul_q8.cu, whose blocks
 * hold 2-3 KB, and cuda_matmul_q8h.cu, 0 or 42 KB) ran at different splits, so a Q6_K
 * down product's blocks waited for the gate/up product's SMs to drain. Those kernels
 * prefer LM_CUDA_CARVEOUT percent of the most shared memory (lm_cuda_launch_carved),
 * as do the 16-bit one-token Q/K/V and O products (cuda_matmul.cu, launch_mv); every
 * other kernel keeps the driver's split. H200, 1.5B-shaped (nineteenth session,
 * side by side in one call each): Q4_K_M batch 1 1,012-1,028 -> 1,037-1,053 tokens/s
 * (another call: 1,001-1,002 -> 1,032-1,041), 256 sequences unchanged (bf16
 * 80,310-80,337 vs 80,637-80,754, Q4_K_M 48,412-48,596 vs 48,403-49,032); the first
 * form, every kernel at 50 but the f32/bf16 matrix-vector and tensor-core products
 * (1,034-1,045 at batch 1), lost at 256 sequences what batch 1 gained (bf16 79,540 ->
 * 69,824 tokens/s in the recorded call; presumably the GEMMs' kernels run at other
 * splits, and every kernel after one waited for the drain); the f32/bf16
 * matrix-vector kernel at 50 as well, bf16 batch 1 790 -> 775-778 (its weights pass
 * through L1 unallocated; why a smaller L1 slows it is not established); the 8-bit
 * products without their down products, 998-1,017 against 1,001-1,002 (the split
 * then changes at the down products instead); at 40 / 60 / 100 (L1 28 KB), Q4_K_M
 * 1,017-1,030 / 1,047-1,051 / 871-886 with every kernel there.
 * LUMEN_CUDA_CARVEOUT=N: another percentage, -1 the driver's split. */
enum { LM_CUDA_CARVEOUT = 50 };

/* The backend's carveout set on `kernel`, once (cuda_backend.cu). */
void lm_cuda_carveout(lm_cuda_backend *cu, const void *kernel);

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch
 * where the backend allows it (cu->pdl); smem: bytes of dynamic shared memory.
 * carveout: the backend's preferred split set on the kernel first (above). */
template <typename... Params, typename... Args>
static inline void lm_cuda_launch_with(lm_cuda_backend *cu, bool carveout, void (*kernel)(Params...), dim3 grid,
                                       dim3 block, size_t smem, Args... args) {
    if (carveout && cu->carveout >= 0) lm_cuda_carveout(cu, (const void *)kernel);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cu->stream;
    cfg.attrs = attr;
    cfg.numAttrs = cu->pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

/* At the driver's split. */
template <typename... Params, typename... Args>
static inline void lm_cuda_launch_smem(lm_cuda_backend *cu, void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t smem, Args... args) {
    lm_cuda_launch_with(cu, false, kernel, grid, block, smem, args...);
}

/* At the backend's split: the 8-bit products of a few tokens. */
template <typename... Params, typename... Args>
static inline void lm_cuda_launch_carved(lm_cuda_backend *cu, void (*kernel)(Params...), dim3 grid, dim3 block,
                                         size_t smem, Args... args) {
    lm_cuda_launch_with(cu, true, kernel, grid, block, smem, args...);
}

/* The same without dynamic shared memory. */
template <typename... Params, typename... Args>
static inline void lm_cuda_launch(lm_cuda_backend *cu, void (*kernel)(Params...), dim3 grid, dim3 block,
                                  Args... args) {
    lm_cuda_launch_smem(cu, kernel, grid, block, 0, args...);
}

/* LM_OK, or the recorded error as lm_error() (the error is then cleared). */
lm_status lm_cuda_take_error(lm_cuda_backend *cu);

/* LUMEN_CUDA_GRAPHS_LOG: adds the last timed replay's GPU time to its tally
 * (cuda_graph.cu; the stream must have passed the replay). */
void lm_cuda_replay_time_collect(lm_cuda_backend *cu, double now);
void lm_cuda_replay_time_tail(lm_cuda_backend *cu);
double lm_cuda_host_clock(void);

/* Makes the backend's device current for the calling thread. Every entry point
 * calls it once, first: it also counts them (op_seq). */
void lm_cuda_enter(lm_cuda_backend *cu);

/* The pending packed Q/K/V product split into its outputs (cuda_matmul.cu). */
void lm_cuda_qkv_split(lm_cuda_backend *cu);
/* For qkv_finish on q, k, v of n tokens, before it enters: the pending packed product
 * ([n][rows of q + k + v], row-major) when it is theirs (taken: no split), else NULL. */
const float *lm_cuda_qkv_take(lm_cuda_backend *cu, const float *q, const float *k, const float *v, int64_t n);

/* For an op about to write `count` floats at x (rows of a GEMM product's input):
 * where to also write them rounded to bf16, so that a GEMM-path product of x that
 * is the very next op uses them instead of converting x itself (cuda_matmul.cu).
 * NULL when the fused ops are off, on replay, or without scratch. Call after
 * lm_cuda_enter. */
__nv_bfloat16 *lm_cuda_gemm_input(lm_cuda_backend *cu, const float *x, int64_t count);

/* lm_cuda_gemm_input for n rows of cols written at x, which in the precise mode
 * (cuda_matmul.cu, gemm_split) also says where to write each value's lo part
 * (lm_bf16_lo) in *lo; elsewhere *lo is NULL and this is lm_cuda_gemm_input. */
__nv_bfloat16 *lm_cuda_gemm_input_split(lm_cuda_backend *cu, const float *x, int64_t n, int64_t cols,
                                        __nv_bfloat16 **lo);

/* The pending halves of dst (sum_pending) when an op about to add count floats of
 * dst takes them: returns the hi half and sets *lo; the op sums hi + lo as the sum's
 * kernel would and writes dst itself. NULL when there are none for it. Call before
 * lm_cuda_enter, which would sum them. */
const float *lm_cuda_sum_take(lm_cuda_backend *cu, const float *dst, int64_t count, const float **lo);

/* Sums the pending halves into dst (lm_cuda_enter). */
void lm_cuda_sum_flush(lm_cuda_backend *cu);

/* The part of v its bf16 rounding misses, rounded to bf16 itself: the precise mode's
 * lo = bf16(v - bf16(v)), shared by the conversion kernel and the ops that hand it
 * off, which must agree to the bit. */
__device__ __forceinline__ __nv_bfloat16 lm_bf16_lo(float v) {
    return __float2bfloat16_rn(__fsub_rn(v, __bfloat162float(__float2bfloat16_rn(v))));
}

/* Device scratch of at least `bytes` for `slot`; NULL (error recorded) when the GPU
 * has no memory left. Stream-ordered: earlier kernels using the old buffer finish
 * before it is released. */
void *lm_cuda_scratch(lm_cuda_backend *cu, int slot, size_t bytes);

/* A device copy of `bytes` of host memory, reused while the content is unchanged
 * (the same positions or block tables are asked for by every layer). NULL on
 * failure (error recorded). Valid until the next call for the same kind. */
const void *lm_cuda_meta_upload(lm_cuda_backend *cu, int kind, const void *host, size_t bytes);

/* Attention/kv_store metadata for a batch, on the device: int32
 * [pos: n][table offset: n][block tables of the batch's sequences]. */
const int32_t *lm_cuda_attn_meta(lm_cuda_backend *cu, const lm_kv_cache *kv, const lm_attn_batch *batch);

/* The whole block's barrier (lm_cuda_block_total's default). */
struct lm_cuda_sync_block {
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

/* The sum over the block of every thread's `sum`, in a fixed order (the warp's
 * butterfly, then the warps in index order); `part` is shared memory for THREADS / 32
 * doubles. THREADS are the block's first threads; `sync` is their barrier (a named
 * barrier where other warps of the block do not take part). REUSE: a barrier after the
 * reads, so `part` may be written again right away; callers summing once leave it out
 * (a barrier is a few hundred ns of a latency-bound kernel). */
template <int THREADS, typename SYNC = lm_cuda_sync_block, bool REUSE = true>
__device__ __forceinline__ double lm_cuda_block_total(double sum, double *part, SYNC sync = SYNC()) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) part[warp] = sum;
    sync();
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < THREADS / 32; i++) total += part[i];
    if (REUSE) sync();
    return total;
}

/* Sum of x[j]^2 for j < d, in double, by a whole block of THREADS threads (a thread
 * sums j = its index, + THREADS, ... in order). One summation order for every caller,
 * so a fused kernel normalizes bit-identically to rms_norm. */
template <int THREADS>
__device__ __forceinline__ double lm_cuda_block_sum_sq(const float *x, int64_t d, double *part) {
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += THREADS) sum += (double)x[j] * (double)x[j];
    return lm_cuda_block_total<THREADS>(sum, part);
}

/* A thread's first LM_CUDA_NORM_CACHE elements of a row (and of its weights) are
 * held in registers by lm_cuda_norm_row. */
enum { LM_CUDA_NORM_CACHE = 8 };

/* The weights of a thread's first LM_CUDA_NORM_CACHE elements (1 past d or where w
 * is NULL), for lm_cuda_norm_row. Weights are written at load, never by kernels, so
 * they may be read before the PDL wait, their trip off the chain. */
template <int THREADS>
__device__ __forceinline__ void lm_cuda_norm_weights(const float *__restrict__ w, int64_t d,
                                                     float wv[LM_CUDA_NORM_CACHE]) {
#pragma unroll
    for (int c = 0; c < LM_CUDA_NORM_CACHE; c++) {
        const int64_t j = threadIdx.x + (int64_t)c * THREADS;
        wv[c] = w && j < d ? w[j] : 1.0f;
    }
}

/* One row of d by a block of THREADS: y += add first when add is not NULL (each
 * thread adds exactly the elements it later reads: no other thread's writes are
 * needed), then out = y / sqrt(mean(y^2) + eps) * w (w NULL: no weight), the sum of
 * squares in double in lm_cuda_block_sum_sq's order, the scaling rounded as the CPU
 * reference's (y * inv) * w. A thread's first LM_CUDA_NORM_CACHE elements stay in
 * registers across the reduction, so the row is not read twice from memory (the
 * kernels are a chain of dependent memory trips), and their weights come in wv
 * (lm_cuda_norm_weights, loaded by the caller before its PDL wait). out may be y; y
 * is written only when add is given. outb (may be NULL): out again, rounded to bf16.
 * Shared by rms_norm and add_rms_norm, which must agree to the bit. `part` is summed
 * into once, with no barrier after: a row a block, or a `part` per call.
 * PRECISE (the precise mode's form; the default's code is the same without it): add
 * is the hi half of a product whose lo half is add_lo (both given or neither), summed
 * as lm_cuda_sum_flush sums them and written to add_dst, the product's output; outl
 * (may be NULL): each output's lo part (lm_bf16_lo). */
template <int THREADS, bool PRECISE = false>
__device__ __forceinline__ void lm_cuda_norm_row(float *y, const float *add, const float *__restrict__ w, int64_t d,
                                                 float eps, float *out, double *part, __nv_bfloat16 *outb,
                                                 const float wv[LM_CUDA_NORM_CACHE], const float *add_lo = NULL,
                                                 float *add_dst = NULL, __nv_bfloat16 *outl = NULL) {
    constexpr int NORM_CACHE = LM_CUDA_NORM_CACHE;
    float v[NORM_CACHE], av[NORM_CACHE];
    double sum = 0.0;
    /* every load first, then the adds and their stores: a store to y between them
     * (y and add may be one buffer) kept ptxas from issuing a load before the store
     * ahead of it, a trip to memory an element (SASS, sm_90a) */
#pragma unroll
    for (int c = 0; c < NORM_CACHE; c++) {
        const int64_t j = threadIdx.x + (int64_t)c * THREADS;
        v[c] = 0.0f, av[c] = 0.0f;
        if (j < d) {
            v[c] = y[j];
            if (add) av[c] = add[j];
            if constexpr (PRECISE) {
                if (add_lo) av[c] = __fadd_rn(av[c], add_lo[j]), add_dst[j] = av[c];
            }
        }
    }
#pragma unroll
    for (int c = 0; c < NORM_CACHE; c++) {
        const int64_t j = threadIdx.x + (int64_t)c * THREADS;
        if (j < d) {
            float a = v[c];
            if (add) a = __fadd_rn(a, av[c]), y[j] = a;
            v[c] = a;
            sum += (double)a * (double)a;
        }
    }
    for (int64_t j = threadIdx.x + (int64_t)NORM_CACHE * THREADS; j < d; j += THREADS) {
        float a = y[j];
        if constexpr (PRECISE) {
            if (add_lo) {
                const float s = __fadd_rn(add[j], add_lo[j]);
                add_dst[j] = s, a = __fadd_rn(a, s), y[j] = a;
                sum += (double)a * (double)a;
                continue;
            }
        }
        if (add) a = __fadd_rn(a, add[j]), y[j] = a;
        sum += (double)a * (double)a;
    }
    const double total = lm_cuda_block_total<THREADS, lm_cuda_sync_block, false>(sum, part); /* one row a block */
    const float inv = (float)(1.0 / sqrt(total / (double)d + (double)eps));
#pragma unroll
    for (int c = 0; c < NORM_CACHE; c++) {
        const int64_t j = threadIdx.x + (int64_t)c * THREADS;
        if (j < d) {
            float o = __fmul_rn(v[c], inv);
            if (w) o = __fmul_rn(o, wv[c]);
            out[j] = o;
            if (outb) outb[j] = __float2bfloat16_rn(o);
            if constexpr (PRECISE) {
                if (outl) outl[j] = lm_bf16_lo(o);
            }
        }
    }
    for (int64_t j = threadIdx.x + (int64_t)NORM_CACHE * THREADS; j < d; j += THREADS) {
        float o = __fmul_rn(y[j], inv);
        if (w) o = __fmul_rn(o, w[j]);
        out[j] = o;
        if (outb) outb[j] = __float2bfloat16_rn(o);
        if constexpr (PRECISE) {
            if (outl) outl[j] = lm_bf16_lo(o);
        }
    }
}

/* silu(g) * u, rounded as the CPU reference's g / (1 + exp(-g)) * u: shared by swiglu
 * and the fused gate/up product (cuda_matmul.cu), which must agree to the bit. */
__device__ __forceinline__ float lm_swiglu1(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* The RoPE angle of rotated pair i at position pos, as the CPU reference computes it. */
__device__ __forceinline__ double lm_cuda_rope_angle(int32_t pos, float freq_scale, float theta, int64_t i,
                                                     int64_t n_rot) {
    return (double)pos * (double)freq_scale * pow((double)theta, -2.0 * (double)i / (double)n_rot);
}

/* cos and sin of RoPE pair i's angle at pos, as every kernel that rotates takes them. */
__device__ __forceinline__ void lm_cuda_rope_cs(int32_t pos, float freq_scale, float theta, int i, int n_rot, float *c,
                                                float *s) {
    const double angle = lm_cuda_rope_angle(pos, freq_scale, theta, i, n_rot);
    *c = (float)cos(angle), *s = (float)sin(angle);
}

/* lm_cuda_rope_cs read from a RoPE table (lm_cuda_rope_table: tab[pos][i], filled by
 * lm_cuda_rope_cs itself, so the same floats) where it holds pos, else computed. */
__device__ __forceinline__ void lm_cuda_rope_cs_from(const float2 *tab, int len, int32_t pos, float freq_scale,
                                                     float theta, int i, int n_rot, float *c, float *s) {
    if (tab && pos >= 0 && pos < len) {
        const float2 v = tab[(int64_t)pos * (n_rot / 2) + i];
        *c = v.x, *s = v.y;
    } else {
        lm_cuda_rope_cs(pos, freq_scale, theta, i, n_rot, c, s);
    }
}

/* Pair i of head x rotated by (c, s): dimensions (i, i + half) in NEOX mode, else
 * (2i, 2i + 1); each product and sum rounded on its own. */
__device__ __forceinline__ void lm_cuda_rope_rotate(float *x, int i, int half, bool neox, float c, float s) {
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* Blocks for a grid-stride loop over n items with `threads` per block. */
static inline unsigned lm_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65536LL * 8) b = 65536LL * 8;
    return (unsigned)b;
}

/* The attention metadata of a batch in ints (what lm_cuda_attn_meta uploads), and
 * the most splits any of its tokens needs (cuda_attention.cu). */
int64_t lm_cuda_attn_meta_ints(lm_cuda_backend *cu, const lm_kv_cache *kv, const lm_attn_batch *batch);
int lm_cuda_attn_max_splits(const lm_attn_batch *batch, int64_t window);

/* kernels' entry points (one file each) */
extern "C" {
void lm_cuda_get_rows(lm_backend *b, const lm_weight *table, const int32_t *ids, int64_t n, float *out);
lm_status lm_cuda_matmul(lm_backend *b, const lm_weight *w, const float *x, int64_t n, float *y);
lm_status lm_cuda_matmul_many(lm_backend *b, const lm_weight *const *w, int n_w, const float *x, int64_t n,
                              float *const *y);
void lm_cuda_rms_norm(lm_backend *b, const float *x, const float *w, int64_t n, int64_t d, float eps, float *y);
void lm_cuda_add(lm_backend *b, float *y, const float *x, int64_t n);
void lm_cuda_add_rms_norm(lm_backend *b, float *y, const float *x, const float *w, int64_t n, int64_t d,
                          float eps, float *out);
void lm_cuda_add_bias(lm_backend *b, float *y, const float *bias, int64_t n, int64_t d);
void lm_cuda_scale(lm_backend *b, float *y, float s, int64_t n);
void lm_cuda_rope(lm_backend *b, float *x, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot,
                  const int32_t *pos, float theta, float freq_scale, lm_rope_mode mode);
void lm_cuda_swiglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);
lm_status lm_cuda_matmul_swiglu(lm_backend *b, const lm_weight *w_gate, const lm_weight *w_up, const float *x,
                                int64_t n, float *gate, float *up);
void lm_cuda_geglu(lm_backend *b, const float *gate, const float *up, int64_t n, float *out);
void lm_cuda_kv_store(lm_backend *b, struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                      const float *k, const float *v);
void lm_cuda_qkv_finish(lm_backend *b, lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                        const lm_qkv_finish *p);
/* Tensor-core prefill attention (cuda_attention_tc.cu): false when the batch is not
 * for it (the caller runs the scalar kernel); true when launched or failed (error
 * recorded). */
bool lm_cuda_attention_tc(lm_cuda_backend *cu, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                          const int32_t *meta, const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                          int64_t window, float scale, float *out,
                          __nv_bfloat16 *outb);
/* Tensor-core decode attention (cuda_attention_dec.cu): whether it serves this cache
 * and these heads; the launch over a grid of max_splits splits (part and counts: the
 * scalar kernel's scratch, enough for it; NULL when max_splits is 1); fin (may be
 * NULL): the qkv_finish before it, on a packed product, run by its blocks. Errors are
 * recorded. */
bool lm_cuda_attention_dec_supports(const lm_kv_cache *kv, int64_t n_head, int64_t n_head_kv, int64_t head_dim);
void lm_cuda_attention_dec(lm_cuda_backend *cu, const lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                           const int32_t *meta, const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           int64_t window, float scale, int max_splits, float *out, __nv_bfloat16 *outb, float *part,
                           int *counts, const qf_args *fin);
/* The pending qkv_finish (finish_pending) if it is the one before this attention
 * (same cache, layer, q and token count): taken into *f (true), the caller runs it or
 * puts it back; else false. Before lm_cuda_enter, which would run it. */
bool lm_cuda_finish_take(lm_cuda_backend *cu, const void *kv, int64_t layer, const float *q, int64_t n,
                         lm_cuda_finish *f);
/* A taken qkv_finish made pending again (its caller did not run it): the next op runs it. */
void lm_cuda_finish_put_back(lm_cuda_backend *cu, const lm_cuda_finish *f);
/* The pending qkv_finish run now by its own kernel. */
void lm_cuda_finish_flush(lm_cuda_backend *cu);
/* qkv_finish's kernel on a (taken) finish's arguments. */
void lm_cuda_finish_run(lm_cuda_backend *cu, const qf_args &a, const int32_t *meta, bool f16);
/* RoPE's (cos, sin) for positions [0, *len) of pairs [0, n_rot / 2), [pos][pair], as
 * lm_cuda_rope_cs computes them, for a cache of `positions` tokens (cuda_rope_table.cu);
 * NULL (*len 0) where there is none to give: the kernels compute them. */
const float2 *lm_cuda_rope_table(lm_cuda_backend *cu, float theta, float freq_scale, int n_rot, int64_t positions,
                                 int *len);
void lm_cuda_decode_profile_print(lm_cuda_backend *cu);
/* LUMEN_CUDA_ATTN_PROFILE=1: the decode attention's phases, printed (and the counts
 * freed) when the backend is destroyed. */
void lm_cuda_attention_profile_print(lm_cuda_backend *cu);
lm_status lm_cuda_decode_step(lm_backend *b, const lm_decode_model *m, struct lm_kv_cache *kv,
                              const lm_attn_batch *batch, const int32_t *tokens, float *x, float *logits);
lm_status lm_cuda_pass_begin(lm_backend *b, uint64_t key, const struct lm_kv_cache *kv, const lm_attn_batch *batch,
                             const int32_t *tokens, bool *ran);
lm_status lm_cuda_pass_end(lm_backend *b);
void lm_cuda_graphs_free(lm_cuda_backend *cu);
lm_status lm_cuda_attention(lm_backend *b, const struct lm_kv_cache *kv, int64_t layer, const lm_attn_batch *batch,
                            const float *q, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t window,
                            float scale, float *out);
lm_status lm_cuda_logits_topk(lm_backend *b, const float *logits, int64_t n_rows, int64_t n_vocab, int k,
                              int32_t *ids, float *vals, float *row_max, float *row_lse);
}

/* logits_topk's k = 1 without a log-sum-exp (cuda_topk_argmax.cu): each row's best id,
 * its logit and the max (or the NaN mark) into the device outputs, the slices' results
 * in work (lm_cuda_argmax_work_bytes of it). false: a launch failed (recorded). */
bool lm_cuda_argmax_rows(lm_cuda_backend *cu, const float *logits, int64_t n_rows, int64_t n_vocab, int32_t *d_ids,
                         float *d_vals, float *d_max, void *work, size_t work_bytes);
size_t lm_cuda_argmax_work_bytes(int64_t n_rows, int64_t n_vocab);

/* The weight formats the kernels decode on the device (cuda_dequant.cuh). */
bool lm_cuda_native_type(lm_dtype type);

#endif
