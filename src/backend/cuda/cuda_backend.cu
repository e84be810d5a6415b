/* The CUDA backend: device selection, the stream, memory, weights, error recording,
 * scratch and metadata uploads, and the op vtable. The kernels live one op per file
 * (cuda_<op>.cu). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_matmul.cuh"

extern "C" {
#include "tensor/quant.h"
}

/* ---- errors ------------------------------------------------------------------- */

void lm_cuda_fail(lm_cuda_backend *cu, lm_status st, const char *fmt, ...) {
    if (cu->err != LM_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu->err_msg, sizeof cu->err_msg, fmt, ap);
    va_end(ap);
    cu->err = st;
}

bool lm_cuda_ok(lm_cuda_backend *cu, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    lm_status st = e == cudaErrorMemoryAllocation ? LM_ERR_NO_MEMORY : LM_ERR_INTERNAL;
    lm_cuda_fail(cu, st, "CUDA error in %s on GPU %d: %s (%s)", what, cu->device, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    return false;
}

lm_status lm_cuda_take_error(lm_cuda_backend *cu) {
    if (cu->err == LM_OK) return LM_OK;
    lm_status st = cu->err;
    cu->err = LM_OK;
    return lm_error(st, "%s", cu->err_msg);
}

void lm_cuda_enter(lm_cuda_backend *cu) {
    /* the current device is per host thread: the engine calls from its own thread */
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cu->device) lm_cuda_ok(cu, cudaSetDevice(cu->device), "cudaSetDevice");
    cu->op_seq++;
    if (cu->qkv_pending.ys) lm_cuda_qkv_split(cu); /* the op after the product is not its qkv_finish */
    if (cu->finish_pending.on) lm_cuda_finish_flush(cu); /* nor is the op after qkv_finish its attention */
    if (cu->sum_pending.dst) lm_cuda_sum_flush(cu);      /* nor the add after a precise product */
}

void lm_cuda_carveout(lm_cuda_backend *cu, const void *kernel) {
    for (int i = 0; i < cu->carveout_n; i++)
        if (cu->carveout_set[i] == kernel) return;
    if (cu->carveout_n == LM_CUDA_CARVEOUT_KERNELS) return; /* a hint: past the table, the driver's split */
    cu->carveout_set[cu->carveout_n++] = kernel;
    lm_cuda_ok(cu, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cu->carveout),
               "shared-memory carveout");
}

/* ---- memory ------------------------------------------------------------------- */

/* The peak is sampled after each allocation: memory in use only grows there.
 * Pool allocations may reuse memory the pool already holds, which the driver
 * already counts as used. */
static void note_memory_in_use(lm_cuda_backend *cu) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    uint64_t used = (uint64_t)(total_b - free_b);
    if (used > cu->peak_used) cu->peak_used = used;
}

static uint64_t cuda_peak_memory(lm_backend *b) { return lm_cuda(b)->peak_used; }
/* Copies already made stay: the budget only stops new ones. */
static void cuda_set_copy_limit(lm_backend *b, uint64_t bytes) { lm_cuda(b)->bf16_budget = bytes; }

static void *dev_alloc(lm_cuda_backend *cu, size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 256;
    cudaError_t e = cu->pools ? cudaMallocAsync(&p, bytes, cu->stream) : cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return NULL;
    }
    note_memory_in_use(cu);
    return p;
}

static void dev_free(lm_cuda_backend *cu, void *p) {
    if (!p) return;
    lm_cuda_ok(cu, cu->pools ? cudaFreeAsync(p, cu->stream) : cudaFree(p), "cudaFree");
}

void *lm_cuda_scratch(lm_cuda_backend *cu, int slot, size_t bytes) {
    if (cu->scr_cap[slot] >= bytes && cu->scr[slot]) return cu->scr[slot];
    if (cu->pass_mode == LM_CUDA_PASS_CAPTURE) {
        /* the WARM pass of this shape sized every buffer: growing now is a bug */
        lm_cuda_fail(cu, LM_ERR_INTERNAL, "scratch slot %d grew during a graph capture", slot);
        return NULL;
    }
    cu->mem_gen++;
    dev_free(cu, cu->scr[slot]);
    cu->scr[slot] = NULL;
    cu->scr_cap[slot] = 0;
    size_t want = bytes + bytes / 4; /* headroom: batches grow a little at a time */
    cu->scr[slot] = dev_alloc(cu, want);
    if (!cu->scr[slot]) {
        lm_cuda_fail(cu, LM_ERR_NO_MEMORY, "out of GPU memory: %zu bytes of scratch", want);
        return NULL;
    }
    cu->scr_cap[slot] = want;
    if (slot == LM_CUDA_SCR_COUNTS &&
        !lm_cuda_ok(cu, cudaMemsetAsync(cu->scr[slot], 0, want, cu->stream), "scratch (counters)"))
        return NULL;
    return cu->scr[slot];
}

static bool grow_host(void **p, size_t *cap, size_t bytes) {
    if (*cap >= bytes && *p) return true;
    void *n = realloc(*p, bytes + bytes / 4 + 64);
    if (!n) return false;
    *p = n;
    *cap = bytes + bytes / 4 + 64;
    return true;
}

const void *lm_cuda_meta_upload(lm_cuda_backend *cu, int kind, const void *host, size_t bytes) {
    lm_cuda_meta *m = &cu->meta[kind];
    if (m->valid && m->bytes == bytes && memcmp(m->shadow, host, bytes) == 0) return m->dev;
    const int mode = cu->pass_mode;
    if (mode != LM_CUDA_PASS_DIRECT) {
        /* a recorded pass copies each kind once, from one staging buffer: a second,
         * different content would overwrite the first before the graph reads it */
        if (cu->pass_meta_sent & (1u << kind)) {
            lm_cuda_fail(cu, LM_ERR_INTERNAL, "metadata kind %d changed within a recorded pass", kind);
            return NULL;
        }
        cu->pass_meta_sent |= 1u << kind;
    }
    m->valid = false;
    const bool fixed = mode == LM_CUDA_PASS_CAPTURE || mode == LM_CUDA_PASS_REPLAY;
    if (m->dev_cap < bytes || m->pinned_cap < bytes) {
        if (fixed) { /* the WARM pass sized them: the recording points at them */
            lm_cuda_fail(cu, LM_ERR_INTERNAL, "metadata kind %d grew during a recorded pass", kind);
            return NULL;
        }
        cu->mem_gen++;
    }
    if (m->dev_cap < bytes) {
        dev_free(cu, m->dev);
        m->dev_cap = 0;
        m->dev = dev_alloc(cu, bytes + bytes / 4 + 64);
        if (!m->dev) {
            lm_cuda_fail(cu, LM_ERR_NO_MEMORY, "out of GPU memory for %zu bytes of batch metadata", bytes);
            return NULL;
        }
        m->dev_cap = bytes + bytes / 4 + 64;
    }
    /* the previous copy out of the pinned buffer must be done before we overwrite it
     * (it was queued one forward pass ago: normally long finished; pass_begin waited
     * for the stream already) */
    if (mode == LM_CUDA_PASS_DIRECT && !lm_cuda_ok(cu, cudaEventSynchronize(m->copied), "cudaEventSynchronize"))
        return NULL;
    if (m->pinned_cap < bytes) {
        if (m->pinned) cudaFreeHost(m->pinned);
        m->pinned = NULL;
        m->pinned_cap = 0;
        size_t want = bytes + bytes / 4 + 64;
        if (!lm_cuda_ok(cu, cudaMallocHost(&m->pinned, want), "cudaMallocHost")) return NULL;
        m->pinned_cap = want;
    }
    if (!grow_host(&m->shadow, &m->shadow_cap, bytes)) {
        lm_cuda_fail(cu, LM_ERR_NO_MEMORY, "out of host memory for batch metadata");
        return NULL;
    }
    memcpy(m->pinned, host, bytes);
    memcpy(m->shadow, host, bytes);
    if (mode != LM_CUDA_PASS_REPLAY) { /* a replay's graph holds the copy */
        if (!lm_cuda_ok(cu, cudaMemcpyAsync(m->dev, m->pinned, bytes, cudaMemcpyHostToDevice, cu->stream),
                        "cudaMemcpyAsync (metadata)"))
            return NULL;
        if (mode == LM_CUDA_PASS_DIRECT && !lm_cuda_ok(cu, cudaEventRecord(m->copied, cu->stream), "cudaEventRecord"))
            return NULL;
    }
    m->bytes = bytes;
    m->valid = true;
    return m->dev;
}

/* The distinct sequences of a batch get their block tables once; seq_off marks them.
 * Returns the metadata's size in ints: 2 n + the tables. */
static int64_t attn_meta_layout(lm_cuda_backend *cu, const lm_kv_cache *kv, const lm_attn_batch *batch) {
    int64_t n = batch->n_tokens;
    if (cu->seq_off_cap < kv->n_seqs) {
        int32_t *s = (int32_t *)realloc(cu->seq_off, (size_t)kv->n_seqs * sizeof(int32_t));
        if (!s) {
            lm_cuda_fail(cu, LM_ERR_NO_MEMORY, "out of host memory for attention metadata");
            return -1;
        }
        for (int64_t i = cu->seq_off_cap; i < kv->n_seqs; i++) s[i] = -1;
        cu->seq_off = s;
        cu->seq_off_cap = kv->n_seqs;
    }
    int64_t total = 2 * n;
    for (int64_t t = 0; t < n; t++) {
        int32_t s = batch->seq[t];
        if (cu->seq_off[s] < 0) {
            cu->seq_off[s] = 0; /* mark; real offsets assigned by the caller */
            total += kv->seqs[s].n_blocks;
        }
    }
    for (int64_t t = 0; t < n; t++) cu->seq_off[batch->seq[t]] = -1;
    return total;
}

int64_t lm_cuda_attn_meta_ints(lm_cuda_backend *cu, const lm_kv_cache *kv, const lm_attn_batch *batch) {
    int64_t total = attn_meta_layout(cu, kv, batch);
    return total < 0 ? 0 : total;
}

const int32_t *lm_cuda_attn_meta(lm_cuda_backend *cu, const lm_kv_cache *kv, const lm_attn_batch *batch) {
    int64_t n = batch->n_tokens;
    /* every layer of a forward pass asks for the same metadata (the batch and the
     * cache's tables do not change within a pass): built and compared once a pass,
     * not once per layer and op (at 256 sequences, 56 times 32 KB a step) */
    if (cu->pass_epoch && cu->meta_cache.epoch == cu->pass_epoch && cu->meta_cache.kv == kv &&
        cu->meta_cache.pos == batch->pos && cu->meta_cache.seq == batch->seq && cu->meta_cache.n == n)
        return cu->meta_cache.dev;
    int64_t total = attn_meta_layout(cu, kv, batch);
    if (total < 0) return NULL;
    /* a recorded pass copies its padded size, whatever this step's tables take */
    int64_t sent = lm_cuda_recorded_pass(cu) ? cu->pass_meta_ints : total;
    if (sent < total) {
        lm_cuda_fail(cu, LM_ERR_INTERNAL, "attention metadata outgrew its recorded size");
        return NULL;
    }
    if (!grow_host((void **)&cu->attn_host, &cu->attn_host_cap, (size_t)sent * sizeof(int32_t))) {
        lm_cuda_fail(cu, LM_ERR_NO_MEMORY, "out of host memory for attention metadata");
        return NULL;
    }
    int32_t *h = cu->attn_host;
    size_t off = (size_t)(2 * n);
    for (int64_t t = 0; t < n; t++) {
        int32_t s = batch->seq[t];
        if (cu->seq_off[s] < 0) {
            cu->seq_off[s] = (int32_t)off;
            memcpy(h + off, kv->seqs[s].blocks, (size_t)kv->seqs[s].n_blocks * sizeof(int32_t));
            off += (size_t)kv->seqs[s].n_blocks;
        }
        h[t] = batch->pos[t];
        h[n + t] = cu->seq_off[s];
    }
    for (int64_t t = 0; t < n; t++) cu->seq_off[batch->seq[t]] = -1;
    memset(h + off, 0, (size_t)(sent - (int64_t)off) * sizeof(int32_t));
    const int32_t *dev =
        (const int32_t *)lm_cuda_meta_upload(cu, LM_CUDA_META_ATTN, h, (size_t)sent * sizeof(int32_t));
    if (dev && cu->pass_epoch) {
        cu->meta_cache.epoch = cu->pass_epoch;
        cu->meta_cache.kv = kv;
        cu->meta_cache.pos = batch->pos;
        cu->meta_cache.seq = batch->seq;
        cu->meta_cache.n = n;
        cu->meta_cache.dev = dev;
    }
    return dev;
}

static void *cuda_alloc(lm_backend *b, size_t bytes) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    return dev_alloc(cu, bytes);
}

static void cuda_free(lm_backend *b, void *p) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    dev_free(cu, p);
}

static void cuda_upload(lm_backend *b, void *dst, const void *src, size_t bytes) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_recorded_pass(cu)) {
        lm_cuda_fail(cu, LM_ERR_INTERNAL, "upload inside a forward pass");
        return;
    }
    if (lm_cuda_ok(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu->stream), "upload"))
        lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "upload (synchronize)");
}

static void cuda_download(lm_backend *b, void *dst, const void *src, size_t bytes) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (lm_cuda_recorded_pass(cu)) lm_cuda_fail(cu, LM_ERR_INTERNAL, "download inside a forward pass");
    bool ok = cu->err == LM_OK && lm_cuda_ok(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream), "download") &&
              lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "download (synchronize)");
    if (!ok || cu->err != LM_OK) {
        /* the op cannot return the error: make the result unmistakably invalid (NaN)
         * until the next matmul or attention reports it */
        if (bytes % sizeof(float) == 0)
            for (size_t i = 0; i < bytes / sizeof(float); i++) ((float *)dst)[i] = __builtin_nanf("");
    }
}

static void *cuda_host_alloc(lm_backend *b, size_t bytes) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller sees NULL */
        return NULL;
    }
    return p;
}

static void cuda_host_free(lm_backend *b, void *p) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (p) lm_cuda_ok(cu, cudaFreeHost(p), "cudaFreeHost");
}

static void cuda_copy(lm_backend *b, void *dst, const void *src, size_t bytes) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (bytes == 0 || dst == src || lm_cuda_replaying(cu)) return;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d + bytes <= s || s + bytes <= d) {
        lm_cuda_ok(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu->stream), "copy");
        return;
    }
    /* overlapping ranges: through a staging buffer */
    void *tmp = lm_cuda_scratch(cu, LM_CUDA_SCR_COPY, bytes);
    if (!tmp) return;
    if (lm_cuda_ok(cu, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, cu->stream), "copy"))
        lm_cuda_ok(cu, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, cu->stream), "copy");
}

/* ---- weights ------------------------------------------------------------------ */

bool lm_cuda_native_type(lm_dtype type) {
    switch (type) {
#define LM_X(t) case t:
        LM_CUDA_FOR_EACH_TYPE(LM_X)
#undef LM_X
        return true;
    default:
        return false;
    }
}

/* Device memory for a weight, LM_CUDA_WEIGHT_PAD bytes more; on failure, gives the
 * pool's cached memory back to the driver once and retries (freed activations may
 * still sit in it). */
static void *weight_alloc(lm_cuda_backend *cu, size_t bytes) {
    void *p = NULL;
    bytes += LM_CUDA_WEIGHT_PAD;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        p = NULL;
        cudaGetLastError();
        if (!cu->pools) return NULL;
        cudaMemPool_t pool;
        cudaStreamSynchronize(cu->stream);
        if (cudaDeviceGetDefaultMemPool(&pool, cu->device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
    }
    note_memory_in_use(cu);
    return p;
}

void *lm_cuda_weight_alloc(lm_cuda_backend *cu, size_t bytes) { return weight_alloc(cu, bytes); }

static lm_status no_memory(lm_cuda_backend *cu, const char *name, size_t bytes) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    return lm_error(LM_ERR_NO_MEMORY,
                    "out of GPU memory: weight %s needs %.1f MiB, %.1f MiB free of %.1f MiB on GPU %d (%s)",
                    name ? name : "?", bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0, cu->device,
                    cu->name);
}

/* Row r of a tensor in any format the CPU reference reads, as f32. */
static bool host_row_f32(const lm_tensor *t, int64_t r, float *dst) {
    int64_t cols = t->ne[0];
    if (t->type == LM_DTYPE_AFFINE) {
        size_t row_bytes = lm_affine_row_bytes(t->bits, cols);
        int64_t n_groups = cols / t->group_size;
        size_t sb = lm_dtype_get_info(t->scales->type)->block_bytes;
        return lm_affine_dequantize_row(t->bits, t->group_size,
                                        (const uint32_t *)((const uint8_t *)t->data + r * row_bytes),
                                        (const uint8_t *)t->scales->data + (size_t)(r * n_groups) * sb,
                                        (const uint8_t *)t->biases->data + (size_t)(r * n_groups) * sb,
                                        t->scales->type, dst, cols);
    }
    size_t row_bytes = lm_dtype_row_bytes(t->type, cols);
    return lm_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * row_bytes, dst, cols);
}

/* Formats without a device decoder (MLX affine, Q8_1, Q8_K, F64, ...): decoded on the
 * host once, stored as F16 when every value fits it exactly enough (|v| <= 65504),
 * else as F32. */
static lm_status upload_converted(lm_cuda_backend *cu, const lm_tensor *t, lm_weight *w) {
    int64_t rows = w->rows, cols = w->cols;
    float *row = (float *)malloc((size_t)cols * sizeof(float));
    if (!row) return lm_error(LM_ERR_NO_MEMORY, "out of host memory converting %s", t->name);
    bool fits_f16 = true;
    for (int64_t r = 0; r < rows && fits_f16; r++) {
        if (!host_row_f32(t, r, row)) {
            free(row);
            return lm_error(LM_ERR_UNSUPPORTED, "tensor %s has type %s, which the CUDA backend cannot read",
                            t->name, lm_dtype_name(t->type));
        }
        for (int64_t j = 0; j < cols; j++)
            if (!(row[j] >= -65504.0f && row[j] <= 65504.0f)) fits_f16 = false;
    }
    w->type = fits_f16 ? LM_DTYPE_F16 : LM_DTYPE_F32;
    size_t es = fits_f16 ? 2 : 4;
    w->row_bytes = (size_t)cols * es;
    size_t bytes = w->row_bytes * (size_t)rows;
    w->data = w->alloc = weight_alloc(cu, bytes);
    if (!w->data) {
        free(row);
        return no_memory(cu, t->name, bytes);
    }
    /* convert and upload in slabs of about 16 MiB */
    int64_t slab_rows = (int64_t)((16u << 20) / w->row_bytes);
    if (slab_rows < 1) slab_rows = 1;
    if (slab_rows > rows) slab_rows = rows;
    uint8_t *slab = (uint8_t *)malloc((size_t)slab_rows * w->row_bytes);
    if (!slab) {
        free(row);
        cudaFree(w->data);
        return lm_error(LM_ERR_NO_MEMORY, "out of host memory converting %s", t->name);
    }
    lm_status st = LM_OK;
    for (int64_t r0 = 0; r0 < rows && st == LM_OK; r0 += slab_rows) {
        int64_t nr = rows - r0 < slab_rows ? rows - r0 : slab_rows;
        for (int64_t r = 0; r < nr; r++) {
            host_row_f32(t, r0 + r, row);
            if (fits_f16) {
                uint16_t *o = (uint16_t *)(slab + (size_t)r * w->row_bytes);
                for (int64_t j = 0; j < cols; j++) o[j] = lm_f32_to_f16(row[j]);
            } else {
                memcpy(slab + (size_t)r * w->row_bytes, row, w->row_bytes);
            }
        }
        cudaError_t e = cudaMemcpy((uint8_t *)w->data + (size_t)r0 * w->row_bytes, slab, (size_t)nr * w->row_bytes,
                                   cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            st = lm_error(LM_ERR_INTERNAL, "CUDA error uploading %s: %s", t->name, cudaGetErrorString(e));
    }
    free(slab);
    free(row);
    if (st) cudaFree(w->data);
    return st;
}

static lm_status cuda_weight_create(lm_backend *b, const lm_tensor *t, lm_weight **out) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
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
    int64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (cols <= 0 || rows <= 0 || cols % 8 != 0 || cols > INT32_MAX || rows > INT32_MAX)
        return lm_error(LM_ERR_UNSUPPORTED,
                        "tensor %s has %lld columns: the CUDA backend needs a positive multiple of 8", t->name,
                        (long long)cols);
    lm_weight *w = (lm_weight *)calloc(1, sizeof *w);
    if (!w) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    w->rows = rows;
    w->cols = cols;
    lm_status st = LM_OK;
    if (lm_cuda_native_type(t->type)) {
        w->type = t->type;
        w->row_bytes = lm_dtype_row_bytes(t->type, cols);
        size_t bytes = w->row_bytes * (size_t)rows;
        if (w->row_bytes == 0 || t->nbytes < bytes) {
            st = lm_error(LM_ERR_FORMAT, "tensor %s holds %zu bytes, %zu expected", t->name, t->nbytes, bytes);
        } else if (!(w->data = w->alloc = weight_alloc(cu, bytes))) {
            st = no_memory(cu, t->name, bytes);
        } else {
            cudaError_t e = cudaMemcpy(w->data, t->data, bytes, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) {
                st = lm_error(LM_ERR_INTERNAL, "CUDA error uploading %s: %s", t->name, cudaGetErrorString(e));
                cudaFree(w->data);
            }
        }
    } else {
        st = upload_converted(cu, t, w);
    }
    if (st) {
        free(w);
        return st;
    }
    /* a Q6_K head's or a Q4_K weight's rows again, interleaved for the 8-bit product,
     * within the budget of copies beside the weights (which the bf16 copies share, so
     * a memory limit, which sets it to 0, holds); without it the product reads the rows
     * in place */
    const size_t wide_bytes = lm_cuda_mvq_wide_wanted(cu, w) ? lm_cuda_mvq_wide_bytes(w) : 0;
    if (wide_bytes && cu->bf16_used + wide_bytes <= cu->bf16_budget) {
        void *p = weight_alloc(cu, wide_bytes);
        if (p && lm_cuda_mvq_wide_fill(cu, w, p)) w->wide = p, cu->bf16_used += wide_bytes;
        else cudaFree(p);
    }
    *out = w;
    return LM_OK;
}

static void cuda_weight_free(lm_backend *b, lm_weight *w) {
    if (!w) return;
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    /* kernels queued on the weight must finish before its memory goes */
    cudaStreamSynchronize(cu->stream);
    cudaFree(w->alloc);
    if (w->wide) cu->bf16_used -= lm_cuda_mvq_wide_bytes(w);
    cudaFree(w->wide);
    if (w->bf16_bytes) {
        cudaFree((void *)w->bf16);
        cu->bf16_used -= w->bf16_bytes;
    }
    free(w);
    /* recorded passes read weights by address: another model's passes may come to
     * have the same key on buffers at the same addresses (cuda_graph.cu) */
    cu->mem_gen++;
}

/* weight_pack (backend.h): the weights' rows copied side by side into one allocation
 * (pack_next links them), so that the GEMM path runs them as one product
 * (cuda_matmul.cu). Only weights of one format and width, each a whole number of
 * 256-byte units (every kernel's alignment holds at any member's start); otherwise,
 * or when memory is short, they stay where they are. Weights of one width are a copy
 * set whatever their formats (copy_next links them): their bf16 copies, if made, are
 * one allocation, which the GEMM path runs as one product too. */
static void cuda_weight_pack(lm_backend *b, lm_weight *const *w, int n_w) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (n_w < 2) return;
    /* not with F32 weights, whose products stay in f32 */
    bool copy_set = true;
    for (int i = 0; i < n_w; i++)
        copy_set = copy_set && w[i]->cols == w[0]->cols && w[i]->type != LM_DTYPE_F32 && !w[i]->copy_first &&
                   !w[i]->bf16_decided;
    for (int i = 0; copy_set && i < n_w; i++) {
        w[i]->copy_next = i + 1 < n_w ? w[i + 1] : NULL;
        w[i]->copy_first = w[0];
    }
    size_t total = 0;
    for (int i = 0; i < n_w; i++) {
        const size_t bytes = (size_t)w[i]->rows * w[i]->row_bytes;
        if (w[i]->type != w[0]->type || w[i]->cols != w[0]->cols || w[i]->row_bytes != w[0]->row_bytes ||
            w[i]->alloc != w[i]->data || w[i]->pack_next || bytes % 256 != 0)
            return;
        total += bytes;
    }
    uint8_t *p = (uint8_t *)weight_alloc(cu, total);
    if (!p) return;
    size_t off = 0;
    for (int i = 0; i < n_w; i++) {
        const size_t bytes = (size_t)w[i]->rows * w[i]->row_bytes;
        if (cudaMemcpy(p + off, w[i]->data, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess) {
            cudaGetLastError();
            cudaFree(p);
            return;
        }
        off += bytes;
    }
    off = 0;
    for (int i = 0; i < n_w; i++) {
        cudaFree(w[i]->alloc);
        w[i]->data = p + off;
        w[i]->alloc = i == 0 ? p : NULL;
        w[i]->pack_next = i + 1 < n_w ? w[i + 1] : NULL;
        w[i]->pack_first = w[0];
        off += (size_t)w[i]->rows * w[i]->row_bytes;
    }
}

/* ---- lifetime ------------------------------------------------------------------ */

static void cuda_destroy(lm_backend *b) {
    lm_cuda_backend *cu = lm_cuda(b);
    lm_cuda_enter(cu);
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    for (int i = 0; i < LM_CUDA_SCR_COUNT; i++) dev_free(cu, cu->scr[i]);
    for (int i = 0; i < LM_CUDA_META_COUNT; i++) {
        lm_cuda_meta *m = &cu->meta[i];
        dev_free(cu, m->dev);
        if (m->pinned) cudaFreeHost(m->pinned);
        free(m->shadow);
        if (m->copied) cudaEventDestroy(m->copied);
    }
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    if (cu->topk_host) cudaFreeHost(cu->topk_host);
    if (cu->graphs_log) {
        fprintf(stderr, "CUDA graphs: %llu passes recorded, %llu replayed\n", (unsigned long long)cu->n_captured,
                (unsigned long long)cu->n_replayed);
        lm_cuda_replay_time_collect(cu, 0.0);
        for (int i = 0; i < 8; i++) {
            const auto *r = &cu->replay_time[i];
            if (!r->count) continue;
            fprintf(stderr, "CUDA graphs: %lld replays of %lld-token passes, %.3f ms of GPU time each "
                    "(host to the launch %.3f ms: pass_begin %.3f, the ops %.3f, the launch %.3f",
                    (long long)r->count, (long long)r->n, r->ms / (double)r->count, r->build_ms / (double)r->count,
                    r->part_ms[0] / (double)r->count, r->part_ms[1] / (double)r->count,
                    r->part_ms[2] / (double)r->count);
            if (r->n_tail)
                fprintf(stderr, "; GPU after the graph to the candidates' copy %.3f ms",
                        r->tail_ms / (double)r->n_tail);
            if (r->n_wall) fprintf(stderr, "; step %.3f ms", r->wall_ms / (double)r->n_wall);
            fprintf(stderr, ")\n");
        }
        for (int i = 0; i < 3; i++)
            if (cu->replay_ev[i]) cudaEventDestroy(cu->replay_ev[i]);
    }
    lm_cuda_decode_profile_print(cu);
    lm_cuda_attention_profile_print(cu);
    lm_cuda_graphs_free(cu);
    if (cu->cublas) cublasDestroy(cu->cublas);
    if (cu->cublaslt) cublasLtDestroy(cu->cublaslt);
    if (cu->cublas_ws) cudaFree(cu->cublas_ws);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    free(cu->attn_host);
    free(cu->seq_off);
    free(cu->dec_seen);
    free(cu->tc_tiles);
    free(cu);
}

/* A backend's op table: its own, since LUMEN_CUDA_FUSED is read per backend (a
 * table shared by every backend took the first one's setting). */
static void init_ops(lm_backend_ops *o, bool fused) {
    o->name = "cuda";
    o->destroy = cuda_destroy;
    o->peak_memory = cuda_peak_memory;
    o->set_copy_limit = cuda_set_copy_limit;
    o->alloc = cuda_alloc;
    o->free = cuda_free;
    o->upload = cuda_upload;
    o->download = cuda_download;
    o->copy = cuda_copy;
    o->host_alloc = cuda_host_alloc;
    o->host_free = cuda_host_free;
    o->weight_create = cuda_weight_create;
    o->weight_free = cuda_weight_free;
    /* LUMEN_CUDA_PACK=0: Q/K/V and gate/up stay apart (separate GEMMs; A/B switch) */
    const char *pack = getenv("LUMEN_CUDA_PACK");
    o->weight_pack = pack && strcmp(pack, "0") == 0 ? NULL : cuda_weight_pack;
    o->get_rows = lm_cuda_get_rows;
    o->matmul = lm_cuda_matmul;
    /* LUMEN_CUDA_MATMUL_MANY=0: one launch per product (the fused path's A/B switch) */
    const char *many = getenv("LUMEN_CUDA_MATMUL_MANY");
    o->matmul_many = many && strcmp(many, "0") == 0 ? NULL : lm_cuda_matmul_many;
    o->rms_norm = lm_cuda_rms_norm;
    o->add = lm_cuda_add;
    o->add_bias = lm_cuda_add_bias;
    o->scale = lm_cuda_scale;
    o->rope = lm_cuda_rope;
    o->swiglu = lm_cuda_swiglu;
    o->geglu = lm_cuda_geglu;
    o->kv_store = lm_cuda_kv_store;
    o->add_rms_norm = fused ? lm_cuda_add_rms_norm : NULL;
    o->qkv_finish = fused ? lm_cuda_qkv_finish : NULL;
    o->matmul_swiglu = fused ? lm_cuda_matmul_swiglu : NULL;
    o->attention = lm_cuda_attention;
    o->pass_begin = lm_cuda_pass_begin;
    o->pass_end = lm_cuda_pass_end;
    o->logits_topk = lm_cuda_logits_topk;
    /* LUMEN_CUDA_DECODE_STEP=1: one-token passes as one persistent kernel (not yet
     * faster than op by op: off by default, and the forward pass then never asks) */
    const char *step = getenv("LUMEN_CUDA_DECODE_STEP");
    o->decode_step = step && strcmp(step, "1") == 0 ? lm_cuda_decode_step : NULL;
}

extern "C" lm_status lm_backend_cuda_create(int device, lm_backend **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "lm_backend_cuda_create: out is NULL");
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        if (e == cudaErrorInsufficientDriver)
            return lm_error(LM_ERR_UNSUPPORTED,
                            "no usable NVIDIA driver: the driver is missing or older than this CUDA runtime needs (%s)",
                            cudaGetErrorString(e));
        if (e == cudaErrorNoDevice || count == 0)
            return lm_error(LM_ERR_UNSUPPORTED, "no CUDA GPU is present (%s)",
                            e == cudaSuccess ? "no devices found" : cudaGetErrorString(e));
        return lm_error(LM_ERR_UNSUPPORTED, "CUDA is not available: %s (%s)", cudaGetErrorString(e),
                        cudaGetErrorName(e));
    }
    if (device < 0 || device >= count)
        return lm_error(LM_ERR_INVALID_ARG, "GPU %d does not exist (this machine has %d)", device, count);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return lm_error(LM_ERR_UNSUPPORTED, "cannot query GPU %d: %s", device, cudaGetErrorString(e));
    if (prop.major < 9)
        return lm_error(LM_ERR_UNSUPPORTED,
                        "GPU %d (%s) has compute capability %d.%d; this build of the CUDA backend needs 9.0 or newer",
                        device, prop.name, prop.major, prop.minor);
    lm_cuda_backend *cu = (lm_cuda_backend *)calloc(1, sizeof *cu);
    if (!cu) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    /* LUMEN_CUDA_FUSED=0: the separate ops (the fused ops' A/B switch and their
     * test), and no bf16 hand-off to the products (lm_cuda_gemm_input) */
    const char *fused = getenv("LUMEN_CUDA_FUSED");
    cu->fused = !(fused && strcmp(fused, "0") == 0);
    init_ops(&cu->ops, cu->fused);
    cu->base.ops = &cu->ops;
    cu->device = device;
    cu->n_sm = prop.multiProcessorCount;
    cu->total_mem = prop.totalGlobalMem;
    snprintf(cu->name, sizeof cu->name, "%s", prop.name);
    const char *graphs = getenv("LUMEN_CUDA_GRAPHS"); /* 0: every op launched as called */
    cu->graphs_on = !(graphs && strcmp(graphs, "0") == 0);
    cu->graphs_log = getenv("LUMEN_CUDA_GRAPHS_LOG") != NULL;
    const char *pdl = getenv("LUMEN_CUDA_PDL"); /* 0: every kernel waits for the previous */
    cu->pdl = prop.major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    /* long passes are bound by their kernels rather than by launches, and a recorded
     * 512-token prefill measured slower than direct launches (cause not established) */
    const char *rec = getenv("LUMEN_CUDA_RECORD_MAX_N");
    cu->record_max_n = rec && atoll(rec) > 0 ? atoll(rec) : 256;
    /* exact f32 products up to this many tokens, the GEMMs beyond: 2 for 16-bit and
     * f32 weights, 3 for quantized ones with a bf16 copy, 8 for quantized ones without
     * (cuda_matmul.cu, path_of); LUMEN_CUDA_MV_MAX_N sets all three. The GEMMs win
     * from there (H200, 1.5B-shaped, one call, tokens/s, matrix-vector vs GEMMs): bf16
     * x2 1,195 vs 1,153, x3 1,415 vs 1,727, x4 1,635 vs 2,308; Q4_K_M x3 1,772 vs
     * 1,702, x4 2,114 vs 2,206 */
    const char *mv = getenv("LUMEN_CUDA_MV_MAX_N");
    const bool mv_set = mv && mv[0] && atoll(mv) >= 0;
    cu->mv_max_n = mv_set ? atoll(mv) : 2;
    cu->mv_max_n_quant = mv_set ? atoll(mv) : 8;
    cu->mv_max_n_copy = mv_set ? atoll(mv) : 3;
    /* quantized and f16 weights decoded to bf16 once for the GEMM path instead of a
     * tile at a time in every product (cuda_matmul.cu, copy_decide; Q4_K_M at 64
     * sequences: 17.6k -> 30.0k tokens/s), up to a quarter of the device's memory
     * (35 GB of an H200: the copies of a 17B-parameter model), so a context made later
     * still finds room; LUMEN_CUDA_BF16_COPY=MiB sets the budget, 0: none. The 8-bit
     * kernel's interleaved copies (w->wide, made at load) count against it too */
    const char *bc = getenv("LUMEN_CUDA_BF16_COPY");
    cu->bf16_budget = bc && bc[0] ? (atoll(bc) > 0 ? (size_t)atoll(bc) << 20 : 0) : cu->total_mem / 4;
    const char *stage = getenv("LUMEN_CUDA_MV_STAGE"); /* 0: quantized rows read in place */
    cu->mv_stage = !(stage && strcmp(stage, "0") == 0);
    /* the precise mode (cuda_matmul.cu, gemm_split): batched outputs that follow the
     * single-sequence ones, at ~15% less batched throughput at 8-64 sequences */
    const char *precise = getenv("LUMEN_CUDA_PRECISE");
    cu->precise = precise && strcmp(precise, "1") == 0;
    const char *mvq = getenv("LUMEN_CUDA_MVQ"); /* 0: Q4_K/Q6_K products in f32 too */
    cu->mvq = !(mvq && strcmp(mvq, "0") == 0) && !cu->precise;
    const char *mvq_wide = getenv("LUMEN_CUDA_MVQ_WIDE"); /* 0: no interleaved copy of a Q6_K head */
    cu->mvq_wide = !(mvq_wide && strcmp(mvq_wide, "0") == 0);
    const char *mvq_q4w = getenv("LUMEN_CUDA_MVQ_Q4W"); /* 0: no interleaved copies of Q4_K weights */
    cu->mvq_q4w = !(mvq_q4w && strcmp(mvq_q4w, "0") == 0);
    const char *gu_stage = getenv("LUMEN_CUDA_GU_STAGE"); /* 0: mvq_kernel for one token's gate/up too */
    cu->gu_stage = !(gu_stage && strcmp(gu_stage, "0") == 0);
    const char *handoff = getenv("LUMEN_CUDA_Q8_HANDOFF"); /* 0: down products over f32 activations */
    cu->q8_handoff = !(handoff && strcmp(handoff, "0") == 0);
    /* tensor-core products up to this many tokens above the matrix-vector path: none by
     * default, the GEMMs measured faster at every size (H200, 1.5B-shaped, one call
     * each, tokens/s, the tensor cores vs the GEMMs: bf16 x8 3,816-3,817 vs 4,546-4,560,
     * x16 6,478 vs 8,908-8,916, x32 8,443-8,447 vs 16,827-17,160; Q4_K_M from its bf16
     * copies x6 2,632 vs 3,357-3,359, x8 3,810 vs 4,438-4,443; the limit had been 32
     * for 16-bit weights since the third session); LUMEN_CUDA_TC_MAX_N sets it for
     * 16-bit weights and copies (tc_max_n) and quantized weights without (_quant) */
    const char *tc = getenv("LUMEN_CUDA_TC_MAX_N");
    const bool tc_set = tc && tc[0] && atoll(tc) >= 0;
    cu->tc_max_n = tc_set ? atoll(tc) : 0;
    cu->tc_max_n_quant = tc_set ? atoll(tc) : 0;
    const char *prof = getenv("LUMEN_CUDA_PROFILE_N"); /* see lm_cuda_pass_begin */
    cu->profile_n = prof && atoll(prof) > 0 ? atoll(prof) : 0;
    const char *chunk = getenv("LUMEN_CUDA_GEMM_CHUNK"); /* the smallest GEMM width (cuda_matmul.cu) */
    cu->gemm_chunk = chunk && atoll(chunk) >= 16 && atoll(chunk) <= 4096 ? atoll(chunk) / 16 * 16 : 64;
    /* LUMEN_CUDA_ATTN_DEC: the tensor-core decode attention from this many tokens
     * (0: never; default: every decode batch, cuda_attention_dec.cu; but when the
     * matrix-vector path serves whole prompts (LUMEN_CUDA_MV_MAX_N of 512 or more, as
     * in the bit batch-invariant configuration LUMEN_CUDA_MV_MAX_N=1e9), only above
     * that: a decode step then attends as the prompt's tokens do, in the scalar kernel) */
    const char *dec = getenv("LUMEN_CUDA_ATTN_DEC");
    const int64_t dec_default = cu->mv_max_n >= 512 ? cu->mv_max_n + 1 : 1;
    cu->attn_dec_min_n = dec && dec[0] ? (atoll(dec) > 0 ? atoll(dec) : INT64_MAX) : dec_default;
    /* LUMEN_CUDA_ATTN_DEC_WARPS=4 or 8: that kernel's warps a block (default: by the
     * batch's size, lm_cuda_attention_dec) */
    const char *fin = getenv("LUMEN_CUDA_FINISH_IN_ATTN"); /* 0: qkv_finish always runs on its own */
    cu->finish_in_attention = !(fin && strcmp(fin, "0") == 0);
    cu->attn_prof_on = getenv("LUMEN_CUDA_ATTN_PROFILE") != NULL;
    const char *dec_warps = getenv("LUMEN_CUDA_ATTN_DEC_WARPS");
    cu->attn_dec_warps = dec_warps && (atoi(dec_warps) == 4 || atoi(dec_warps) == 8) ? atoi(dec_warps) : 0;
    const char *dec_ahead = getenv("LUMEN_CUDA_ATTN_DEC_AHEAD");
    cu->attn_dec_ahead = !(dec_ahead && strcmp(dec_ahead, "0") == 0);
    const char *norm_alone = getenv("LUMEN_CUDA_NORM_ALONE");
    if (norm_alone && strcmp(norm_alone, "0") == 0) cu->norm_alone = -1; /* as if refused: never padded */
    cu->smem_optin = (int)prop.sharedMemPerBlockOptin;
    const char *carve = getenv("LUMEN_CUDA_CARVEOUT"); /* percent, or -1: the driver's split */
    cu->carveout = carve && carve[0] && atoi(carve) >= -1 && atoi(carve) <= 100 ? atoi(carve) : LM_CUDA_CARVEOUT;
    lm_status st = LM_OK;
    int pools = 0;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        st = lm_error(LM_ERR_UNSUPPORTED, "cannot start GPU %d (%s): %s", device, prop.name, cudaGetErrorString(e));
    } else if (cublasCreate(&cu->cublas) != CUBLAS_STATUS_SUCCESS ||
               cublasSetStream(cu->cublas, cu->stream) != CUBLAS_STATUS_SUCCESS ||
               cudaMalloc(&cu->cublas_ws, LM_CUDA_CUBLAS_WORKSPACE) != cudaSuccess ||
               cublasSetWorkspace(cu->cublas, cu->cublas_ws, LM_CUDA_CUBLAS_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
        st = lm_error(LM_ERR_UNSUPPORTED, "cannot start cuBLAS on GPU %d (%s)", device, prop.name);
    } else {
        if (cublasLtCreate(&cu->cublaslt) != CUBLAS_STATUS_SUCCESS) cu->cublaslt = NULL; /* cublasGemmEx only */
        for (int i = 0; i < LM_CUDA_META_COUNT && st == LM_OK; i++)
            if ((e = cudaEventCreateWithFlags(&cu->meta[i].copied, cudaEventDisableTiming)) != cudaSuccess)
                st = lm_error(LM_ERR_INTERNAL, "cudaEventCreate: %s", cudaGetErrorString(e));
        if (cu->graphs_log && (cudaEventCreate(&cu->replay_ev[0]) != cudaSuccess ||
                               cudaEventCreate(&cu->replay_ev[1]) != cudaSuccess ||
                               cudaEventCreate(&cu->replay_ev[2]) != cudaSuccess)) {
            for (int i = 0; i < 3; i++) /* without them, replays are not timed */
                if (cu->replay_ev[i]) cudaEventDestroy(cu->replay_ev[i]), cu->replay_ev[i] = NULL;
        }
    }
    if (st == LM_OK && cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess &&
        pools) {
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
            /* keep freed activation memory for the next forward pass instead of
             * handing it back to the driver at every synchronization */
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
            cu->pools = true;
        }
    }
    cudaGetLastError();
    if (st) {
        cuda_destroy(&cu->base);
        return st;
    }
    *out = &cu->base;
    return LM_OK;
}
