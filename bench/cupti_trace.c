/* A kernel tracer for machines without Nsight Systems (bench/cuda_timeline_run.sh).
 *
 * Preloaded into a CUDA program (LD_PRELOAD=libcupti_trace.so), it asks CUPTI for a
 * record of every kernel, copy and memset, graph nodes included (the concurrent-kernel
 * activity does not serialize kernels, so programmatic dependent launch still overlaps
 * them), and at exit writes one CSV line per record to $LUMEN_TRACE_OUT: start and
 * duration in nanoseconds on the GPU's clock, and the kernel's name (a copy's:
 * "[memcpy HtoD 64 bytes]"), as Nsight Systems' cuda_gpu_trace report does
 * (cuda_timeline_table.py reads either). */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER = 8 << 20 };

static FILE *trace_out;
static size_t trace_records, trace_dropped;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER);
    *size = *buffer ? TRACE_BUFFER : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size; /* valid is what was written */
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        uint64_t start, end, node;
        char what[64];
        const char *name = what;
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
            start = k->start, end = k->end, node = k->graphNodeId, name = k->name ? k->name : "?";
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
            static const char *const kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH",
                                                "AtoA", "AtoD", "DtoA", "DtoD", "HtoH"};
            start = m->start, end = m->end, node = m->graphNodeId;
            snprintf(what, sizeof what, "[memcpy %s %llu bytes]", m->copyKind < 10 ? kinds[m->copyKind] : "?",
                     (unsigned long long)m->bytes);
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)record;
            start = m->start, end = m->end, node = m->graphNodeId;
            snprintf(what, sizeof what, "[memset %llu bytes]", (unsigned long long)m->bytes);
        } else {
            continue;
        }
        /* names are C++ signatures with commas: quoted, quotes doubled */
        fprintf(trace_out, "%llu,%llu,%llu,\"", (unsigned long long)start, (unsigned long long)(end - start),
                (unsigned long long)node);
        for (const char *c = name; *c; c++) {
            if (*c == '"') fputc('"', trace_out);
            fputc(*c, trace_out);
        }
        fputs("\"\n", trace_out);
        trace_records++;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) trace_dropped += dropped;
    free(buffer);
}

static void trace_finish(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    fclose(trace_out);
    fprintf(stderr, "cupti_trace: %zu records (%zu dropped) in %s\n", trace_records, trace_dropped,
            getenv("LUMEN_TRACE_OUT"));
}

__attribute__((constructor)) static void trace_start(void) {
    const char *path = getenv("LUMEN_TRACE_OUT");
    if (!path || !(trace_out = fopen(path, "w"))) {
        fprintf(stderr, "cupti_trace: set LUMEN_TRACE_OUT to a writable file\n");
        return;
    }
    fputs("Start (ns),Duration (ns),Graph node,Name\n", trace_out);
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: CUPTI refused the kernel activity\n");
        fclose(trace_out);
        trace_out = NULL;
        return;
    }
    atexit(trace_finish);
}
