/* The CPU backend: host memory, weights used in place from the mapped file. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/error.h"
#include "tensor/quant.h"

void *lm_cpu_scratch(lm_backend *b, lm_cpu_scratch_slot slot, size_t bytes) {
    lm_cpu_backend *cpu = (lm_cpu_backend *)b;
    if (cpu->scratch_size[slot] >= bytes) return cpu->scratch[slot];
    free(cpu->scratch[slot]);
    cpu->scratch[slot] = NULL;
    cpu->scratch_size[slot] = 0;
    size_t want = bytes + bytes / 4; /* headroom: batches grow a little at a time */
    if (posix_memalign(&cpu->scratch[slot], 64, want) != 0) {
        cpu->scratch[slot] = NULL;
        return NULL;
    }
    cpu->scratch_size[slot] = want;
    return cpu->scratch[slot];
}

typedef struct range_job {
    int64_t n;
    void (*fn)(void *ctx, int64_t begin, int64_t end);
    void *ctx;
} range_job;

static void range_worker(void *p, int ith, int nth) {
    const range_job *job = p;
    int64_t begin, end;
    lm_split_range(job->n, ith, nth, &begin, &end);
    if (begin < end) job->fn(job->ctx, begin, end);
}

void lm_cpu_parallel_for(lm_backend *b, int64_t n, int64_t min_per_thread,
                         void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
    lm_threadpool *pool = lm_cpu_pool(b);
    if (lm_threadpool_size(pool) == 1 || n < 2 * min_per_thread) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    range_job job = {n, fn, ctx};
    lm_threadpool_run(pool, range_worker, &job);
}

static void cpu_destroy(lm_backend *b) {
    lm_cpu_backend *cpu = (lm_cpu_backend *)b;
    for (int i = 0; i < LM_SCRATCH_COUNT; i++) free(cpu->scratch[i]);
    for (int i = 0; i < 2; i++) free(cpu->rope[i].pos), free(cpu->rope[i].cs);
    lm_threadpool_free(cpu->pool);
    free(cpu);
}

static void *cpu_alloc(lm_backend *b, size_t bytes) {
    (void)b;
    void *p = NULL;
    /* 64-byte alignment: one cache line, and what AVX-512 loads like */
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void cpu_free(lm_backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_copy(lm_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    memcpy(dst, src, bytes);
}

static void cpu_move(lm_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    memmove(dst, src, bytes);
}

enum { HUGE_PAGE = 2 << 20, WEIGHT_COPY_MIN = 64 << 10 };

/* Releases the whole pages of [p, p + n) from this process's mapping of the file (they
 * stay in the page cache; touching them again reads them back). */
static void drop_mapped_pages(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t begin = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t end = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED);
}

static lm_status cpu_weight_create(lm_backend *b, const lm_tensor *t, lm_weight **out) {
    (void)b;
    *out = NULL;
    if (t->type == LM_DTYPE_AFFINE) {
        if (!t->scales || !t->biases || t->group_size <= 0)
            return lm_error(LM_ERR_FORMAT, "affine-quantized tensor %s lacks scales or biases", t->name);
    } else {
        const lm_dtype_info *info = lm_dtype_get_info(t->type);
        if (!info || t->type == LM_DTYPE_BOOL || t->type == LM_DTYPE_U32 || t->type == LM_DTYPE_U64 ||
            t->type == LM_DTYPE_I64 || t->type == LM_DTYPE_I32)
            return lm_error(LM_ERR_UNSUPPORTED, "tensor %s has type %s, which cannot be a weight matrix", t->name,
                            lm_dtype_name(t->type));
    }
    lm_weight *w = calloc(1, sizeof *w);
    if (!w) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    w->t = *t;
    w->q8 = t->type != LM_DTYPE_AFFINE ? lm_q8a_kernels_for(t->type) : (lm_q8a_kernels){0};
    const char *copy_weights = getenv("LUMEN_CPU_COPY_WEIGHTS");
    if (t->nbytes >= WEIGHT_COPY_MIN && copy_weights && atoi(copy_weights)) {
        /* Decoding streams every weight once per token. From the file mapping (4 KiB
         * pages: a TLB miss and a prefetcher restart every page) that is slower than
         * from a private copy in 2 MiB pages: measured on Qwen2.5-1.5B Q4_K_M, one
         * thread, 3.8 -> 4.7-5.1 tokens/s, but loading takes 1.6 s instead of 8 ms
         * (every page of the copy is faulted in). So the mapping is the default and
         * LUMEN_CPU_COPY_WEIGHTS=1 the choice for long-running servers. The mapped
         * pages are dropped after the copy, so resident memory stays the size of the
         * weights. */
        void *copy = NULL;
        if (posix_memalign(&copy, HUGE_PAGE, t->nbytes) == 0) {
#if defined(MADV_HUGEPAGE)
            madvise(copy, t->nbytes, MADV_HUGEPAGE);
#endif
            memcpy(copy, t->data, t->nbytes);
            drop_mapped_pages(t->data, t->nbytes);
            w->t.data = copy;
            w->owned = copy;
        } /* else: use the mapping in place, slower but correct */
    }
    *out = w;
    return LM_OK;
}

static void cpu_weight_free(lm_backend *b, lm_weight *w) {
    (void)b;
    if (w) free(w->owned);
    free(w);
}

void lm_cpu_weight_row(const lm_weight *w, int64_t r, float *dst) {
    const lm_tensor *t = &w->t;
    int64_t cols = t->ne[0];
    if (t->type == LM_DTYPE_AFFINE) {
        size_t row_bytes = lm_affine_row_bytes(t->bits, cols);
        int64_t n_groups = cols / t->group_size;
        size_t sb = lm_dtype_get_info(t->scales->type)->block_bytes;
        lm_affine_dequantize_row(t->bits, t->group_size, (const uint32_t *)((const uint8_t *)t->data + r * row_bytes),
                                 (const uint8_t *)t->scales->data + (size_t)(r * n_groups) * sb,
                                 (const uint8_t *)t->biases->data + (size_t)(r * n_groups) * sb, t->scales->type,
                                 dst, cols);
        return;
    }
    size_t row_bytes = lm_dtype_row_bytes(t->type, cols);
    const void *src = (const uint8_t *)t->data + (size_t)r * row_bytes;
    if (t->type == LM_DTYPE_F32)
        memcpy(dst, src, (size_t)cols * sizeof(float));
    else
        lm_dequantize_row(t->type, src, dst, cols);
}

static const lm_backend_ops k_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_move,
    .weight_create = cpu_weight_create,
    .weight_free = cpu_weight_free,
    .get_rows = lm_cpu_get_rows,
    .matmul = lm_cpu_matmul,
    .matmul_many = lm_cpu_matmul_many,
    .rms_norm = lm_cpu_rms_norm,
    .add = lm_cpu_add,
    .add_rms_norm = lm_cpu_add_rms_norm,
    .add_bias = lm_cpu_add_bias,
    .scale = lm_cpu_scale,
    .rope = lm_cpu_rope,
    .swiglu = lm_cpu_swiglu,
    .geglu = lm_cpu_geglu,
    .kv_store = lm_cpu_kv_store,
    .attention = lm_cpu_attention,
    .logits_topk = lm_cpu_logits_topk,
};

lm_status lm_backend_cpu_create(int n_threads, lm_backend **out) {
    *out = NULL;
    lm_cpu_backend *cpu = calloc(1, sizeof *cpu);
    if (!cpu) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    lm_status st = lm_threadpool_create(n_threads, &cpu->pool);
    if (st) {
        free(cpu);
        return st;
    }
    cpu->base.ops = &k_cpu_ops;
    *out = &cpu->base;
    return LM_OK;
}
