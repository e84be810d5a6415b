/* Forward passes recorded as CUDA graphs and replayed.
 *
 * A decode step is ~500 small kernels; launched one by one, the host and the gaps
 * between kernels cost more than the kernels (measured on the H200: 3.0 ms of kernel
 * time in a 7.4 ms step of a 1.5B model). A graph launches them all at once.
 *
 * Shapes: the forward pass gives each pass a key naming its shape (token count,
 * which rows return logits, its activation buffers); to it we add what varies inside
 * the backend: the attention metadata's size, padded to a power of two, and the
 * attention's split count, rounded up to one. A pass with the same key issues the same
 * kernels with the same arguments; only host metadata (token ids, positions, block
 * tables) changes, and that sits in page-locked staging buffers whose copies to the
 * device are part of the graph. So a replay writes the new metadata into the staging
 * buffers and launches the graph.
 *
 * Order of events for a key: the first LM_CUDA_WARM_RUNS passes run directly (WARM:
 * every scratch and metadata buffer grows to its size, at the padded sizes); the next
 * is captured and launched; later ones replay. Capturing and instantiating costs a
 * few passes' worth of launches, so a shape seen only a few times (the chunks of one
 * long prompt) is never recorded; decode steps repeat hundreds of times. A graph is
 * dropped when any buffer it points at moved or any weight was freed (cu->mem_gen),
 * e.g. when a long prefill grew the scratch, or a model was unloaded (the pass key
 * names the model's buffers, not its weights: another model on the same buffers must
 * not replay it). Recording never changes results: the same kernels run on the same
 * data.
 *
 * A replay launches at pass_end, or at pass_begin when the recording reads no host
 * metadata but what pass_begin can stage from the batch itself (the token ids, the
 * positions, the attention metadata; checked once, when it is captured: the copies
 * its ops staged equal those arrays): the forward pass then walks none of its ~500
 * op calls, ~15 us of host time a step before the launch at batch 1 on the H200
 * (LUMEN_CUDA_GRAPHS_LOG=1: pass_begin 3, the ops 15, the launch 9 us). (Launching at
 * get_rows, the pass's first call, while the rest of the walk went on, had measured
 * no change in the seventh session.)
 * Recording that reduction and its copy into the pass's graph (eighth session)
 * measured no change either: 2.103 vs 2.113 ms a step at 64 sequences, 1.624 ms
 * both at 1; the kernels' time moved into the graph. Dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_profiler_api.h>

#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "core/log.h"
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h ? h : 1;
}

static int64_t next_pow2(int64_t v, int64_t floor) {
    int64_t p = floor;
    while (p < v) p <<= 1;
    return p;
}

static void graph_drop(lm_cuda_graph *g) {
    if (g->key) cudaGraphExecDestroy(g->exec);
    memset(g, 0, sizeof *g);
}

void lm_cuda_graphs_free(lm_cuda_backend *cu) {
    for (int i = 0; i < LM_CUDA_GRAPHS; i++) graph_drop(&cu->graphs[i]);
}

static lm_cuda_graph *graph_find(lm_cuda_backend *cu, uint64_t key) {
    for (int i = 0; i < LM_CUDA_GRAPHS; i++) {
        lm_cuda_graph *g = &cu->graphs[i];
        if (g->key != key) continue;
        if (g->mem_gen == cu->mem_gen) return g;
        graph_drop(g); /* it points at buffers that have moved */
        return NULL;
    }
    return NULL;
}

/* How many times this key ran directly before (0: never; counted in a ring). */
static int runs_before(lm_cuda_backend *cu, uint64_t key) {
    for (int i = 0; i < LM_CUDA_SEEN; i++)
        if (cu->seen[i] == key) {
            if (cu->seen_gen[i] == cu->mem_gen) return ++cu->seen_runs[i] - 1;
            /* a buffer moved or a weight went since: the runs counted sized other
             * buffers (another model's, on the same addresses), start again */
            cu->seen_gen[i] = cu->mem_gen;
            cu->seen_runs[i] = 1;
            return 0;
        }
    cu->seen[cu->seen_next] = key;
    cu->seen_gen[cu->seen_next] = cu->mem_gen;
    cu->seen_runs[cu->seen_next] = 1;
    cu->seen_next = (cu->seen_next + 1) % LM_CUDA_SEEN;
    return 0;
}

static void replay(lm_cuda_backend *cu, lm_cuda_graph *g);
static lm_status pass_done(lm_cuda_backend *cu);

/* A replay of g from the batch alone (g->self_staged): the token ids and positions
 * staged as get_rows and rope would stage them (the attention metadata is already),
 * then the launch, as pass_end's. */
static lm_status replay_staged(lm_cuda_backend *cu, lm_cuda_graph *g) {
    const size_t ints = (size_t)cu->pass_n * sizeof(int32_t);
    if (g->meta_kinds & (1u << LM_CUDA_META_IDS))
        (void)lm_cuda_meta_upload(cu, LM_CUDA_META_IDS, cu->pass_tokens, ints);
    if (g->meta_kinds & (1u << LM_CUDA_META_POS))
        (void)lm_cuda_meta_upload(cu, LM_CUDA_META_POS, cu->pass_pos, ints);
    if (cu->graphs_log) cu->t_ops = cu->t_end = lm_cuda_host_clock();
    cu->pass_mode = LM_CUDA_PASS_DIRECT;
    cu->pass_epoch = 0;
    if (cu->err == LM_OK) replay(cu, g);
    return pass_done(cu);
}

/* Whether the pass just captured read no metadata but what replay_staged stages:
 * the ids get_rows staged are the batch's tokens, the positions rope staged its
 * positions (the shadows hold what was copied). */
static bool staged_from_batch(const lm_cuda_backend *cu) {
    const uint32_t own = (1u << LM_CUDA_META_IDS) | (1u << LM_CUDA_META_POS) | (1u << LM_CUDA_META_ATTN);
    const size_t ints = (size_t)cu->pass_n * sizeof(int32_t);
    if (!cu->pass_tokens || (cu->pass_meta_sent & ~own)) return false;
    const lm_cuda_meta *ids = &cu->meta[LM_CUDA_META_IDS], *pos = &cu->meta[LM_CUDA_META_POS];
    if ((cu->pass_meta_sent & (1u << LM_CUDA_META_IDS)) &&
        (ids->bytes != ints || memcmp(ids->shadow, cu->pass_tokens, ints) != 0))
        return false;
    if ((cu->pass_meta_sent & (1u << LM_CUDA_META_POS)) &&
        (pos->bytes != ints || memcmp(pos->shadow, cu->pass_pos, ints) != 0))
        return false;
    return true;
}

extern "C" lm_status lm_cuda_pass_begin(lm_backend *b, uint64_t key, const lm_kv_cache *kv,
                                        const lm_attn_batch *batch, const int32_t *tokens, bool *ran) {
    lm_cuda_backend *cu = lm_cuda(b);
    *ran = false;
    const double now = cu->graphs_log ? lm_cuda_host_clock() : 0.0;
    lm_cuda_enter(cu);
    lm_status st = lm_cuda_take_error(cu);
    if (st) return st;
    if (cu->pass_mode != LM_CUDA_PASS_DIRECT)
        return lm_error(LM_ERR_INTERNAL, "pass_begin: the previous pass was not ended");
    /* a profiler started with profiling off (ncu --profile-from-start off) sees the
     * passes of exactly LUMEN_CUDA_PROFILE_N tokens: e.g. a benchmark's decode steps
     * without its prefill (bench/cuda_profile_run.sh) */
    if (cu->profile_n && batch && batch->n_tokens == cu->profile_n && !cu->profiling)
        cu->profiling = cudaProfilerStart() == cudaSuccess;
    /* a pass that began (pass_end follows): metadata is built once in it */
    if (key == 0 || !cu->graphs_on || !kv || !batch || batch->n_tokens > cu->record_max_n) {
        cu->t_begin = 0.0; /* a timed replay's step, if one is pending, is not this long */
        cu->pass_epoch = ++cu->pass_count;
        return LM_OK;
    }
    cu->pass_meta_ints = next_pow2(lm_cuda_attn_meta_ints(cu, kv, batch), 1024);
    cu->pass_splits = (int)next_pow2(lm_cuda_attn_max_splits(batch, 0), 1);
    if (cu->err) return lm_cuda_take_error(cu);
    key = mix(mix(key, (uint64_t)cu->pass_meta_ints), (uint64_t)cu->pass_splits);
    /* the staging buffers are rewritten below: the last pass must have read them */
    if (!lm_cuda_ok(cu, cudaStreamSynchronize(cu->stream), "pass_begin (synchronize)")) return lm_cuda_take_error(cu);
    lm_cuda_replay_time_collect(cu, now);
    cu->t_begin = now;
    cu->pass_n = batch->n_tokens;
    cu->pass_tokens = tokens, cu->pass_pos = batch->pos;
    cu->pass_key = key;
    cu->pass_meta_sent = 0;
    for (int i = 0; i < LM_CUDA_META_COUNT; i++) cu->meta[i].valid = false;
    lm_cuda_graph *g = graph_find(cu, key);
    if (g) {
        cu->pass_mode = LM_CUDA_PASS_REPLAY;
    } else if (runs_before(cu, key) >= LM_CUDA_WARM_RUNS) {
        if (!lm_cuda_ok(cu, cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture"))
            return lm_cuda_take_error(cu);
        cu->pass_mode = LM_CUDA_PASS_CAPTURE;
    } else {
        cu->pass_mode = LM_CUDA_PASS_WARM;
    }
    cu->pass_epoch = ++cu->pass_count;
    /* the attention metadata first, so its copy opens the recording beside the token
     * ids' instead of sitting between the first layer's Q/K/V product and attention,
     * a copy node in the chain of launches (at batch 1 it added ~7.5 us a step in the
     * trace, and that attention could not start early). A failure waits for pass_end,
     * as an op's would: a capture must be ended. */
    (void)lm_cuda_attn_meta(cu, kv, batch);
    if (g && g->self_staged && tokens) {
        *ran = true;
        return replay_staged(cu, g);
    }
    if (cu->graphs_log) cu->t_ops = lm_cuda_host_clock();
    return LM_OK;
}

/* A slot for a new graph: a free one, else the least recently used. */
static lm_cuda_graph *graph_slot(lm_cuda_backend *cu) {
    lm_cuda_graph *best = &cu->graphs[0];
    for (int i = 0; i < LM_CUDA_GRAPHS; i++) {
        lm_cuda_graph *g = &cu->graphs[i];
        if (!g->key) return g;
        if (g->last_use < best->last_use) best = g;
    }
    graph_drop(best);
    return best;
}

double lm_cuda_host_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the finished timed replay's times to its token count's tally (`now`: the
 * next pass_begin's clock, 0 at exit: the step's wall time is not known). */
void lm_cuda_replay_time_collect(lm_cuda_backend *cu, double now) {
    float ms = 0.0f, tail = 0.0f;
    const bool timed_tail = cu->timed_tail;
    cu->timed_tail = false;
    if (!cu->timed_n || cudaEventElapsedTime(&ms, cu->replay_ev[0], cu->replay_ev[1]) != cudaSuccess) {
        cu->timed_n = 0;
        return;
    }
    for (int i = 0; i < 8; i++) {
        if (cu->replay_time[i].n != cu->timed_n && cu->replay_time[i].count) continue;
        cu->replay_time[i].n = cu->timed_n;
        cu->replay_time[i].count++;
        cu->replay_time[i].ms += ms;
        cu->replay_time[i].build_ms += 1e3 * cu->t_build;
        for (int k = 0; k < 3; k++) cu->replay_time[i].part_ms[k] += 1e3 * cu->t_part[k];
        if (timed_tail && cudaEventElapsedTime(&tail, cu->replay_ev[1], cu->replay_ev[2]) == cudaSuccess)
            cu->replay_time[i].n_tail++, cu->replay_time[i].tail_ms += tail;
        if (now > 0.0 && cu->t_begin > 0.0)
            cu->replay_time[i].n_wall++, cu->replay_time[i].wall_ms += 1e3 * (now - cu->t_begin);
        break;
    }
    cu->timed_n = 0;
}

/* Marks the end of the work that follows a timed replay (logits_topk's copy). */
void lm_cuda_replay_time_tail(lm_cuda_backend *cu) {
    if (cu->timed_n && !cu->timed_tail && cu->replay_ev[2])
        cu->timed_tail = cudaEventRecord(cu->replay_ev[2], cu->stream) == cudaSuccess;
}

static void launch(lm_cuda_backend *cu, lm_cuda_graph *g, bool timed) {
    g->last_use = ++cu->use_clock;
    timed = timed && cu->graphs_log && cu->replay_ev[0] &&
            cudaEventRecord(cu->replay_ev[0], cu->stream) == cudaSuccess;
    if (!lm_cuda_ok(cu, cudaGraphLaunch(g->exec, cu->stream), "cudaGraphLaunch")) return;
    if (timed && cudaEventRecord(cu->replay_ev[1], cu->stream) == cudaSuccess) {
        const double now = lm_cuda_host_clock();
        cu->timed_n = cu->pass_n;
        cu->t_build = now - cu->t_begin;
        cu->t_part[0] = cu->t_ops - cu->t_begin, cu->t_part[1] = cu->t_end - cu->t_ops, cu->t_part[2] = now - cu->t_end;
    }
    /* the graph's metadata copies read the staging buffers: a direct upload after
     * this pass waits for them through these events */
    for (int i = 0; i < LM_CUDA_META_COUNT; i++) lm_cuda_ok(cu, cudaEventRecord(cu->meta[i].copied, cu->stream), "cudaEventRecord");
}

static void replay(lm_cuda_backend *cu, lm_cuda_graph *g) {
    cu->n_replayed++;
    launch(cu, g, true);
}

/* A pass's end, whoever launched it: the profiler stopped where this pass started
 * it, and the first error of the pass. */
static lm_status pass_done(lm_cuda_backend *cu) {
    if (cu->profiling) {
        cudaProfilerStop();
        cu->profiling = false;
    }
    return lm_cuda_take_error(cu);
}

extern "C" lm_status lm_cuda_pass_end(lm_backend *b) {
    lm_cuda_backend *cu = lm_cuda(b);
    if (cu->graphs_log) cu->t_end = lm_cuda_host_clock();
    lm_cuda_enter(cu);
    int mode = cu->pass_mode;
    cu->pass_mode = LM_CUDA_PASS_DIRECT;
    cu->pass_epoch = 0;
    if (mode == LM_CUDA_PASS_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(cu->stream, &graph);
        if (cu->err == LM_OK && lm_cuda_ok(cu, e, "cudaStreamEndCapture")) {
            lm_cuda_graph *g = graph_slot(cu);
            if (lm_cuda_ok(cu, cudaGraphInstantiate(&g->exec, graph, 0), "cudaGraphInstantiate")) {
                g->key = cu->pass_key;
                g->mem_gen = cu->mem_gen;
                g->meta_kinds = cu->pass_meta_sent;
                g->self_staged = staged_from_batch(cu);
                cu->n_captured++;
                launch(cu, g, false);
            }
        }
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError(); /* a failed capture leaves its error behind: it is recorded */
        if (cu->err != LM_OK && cu->graphs_on) {
            /* the caller runs the pass again unrecorded; keep later passes from
             * failing the same way */
            cu->graphs_on = false;
            lm_log(LM_LOG_WARN, "CUDA graphs turned off after a failed capture: %s", cu->err_msg);
        }
    } else if (mode == LM_CUDA_PASS_REPLAY) {
        lm_cuda_graph *g = graph_find(cu, cu->pass_key);
        if (!g)
            lm_cuda_fail(cu, LM_ERR_INTERNAL, "pass_end: the recording of this pass was dropped during it");
        else
            replay(cu, g);
    }
    return pass_done(cu);
}
