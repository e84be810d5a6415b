/* The engine's handle: parameters, creation (the worker thread starts and loads),
 * waiting for the load, statistics, peak memory and close. The overview of the
 * engine is in engine_internal.h. */
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/error.h"

void lm_eng_set_err(char *dst, const char *msg) {
    snprintf(dst, ERR_CAP, "%s", msg && *msg ? msg : "unknown error");
}

void lm_eng_unref_locked(lm_engine *e, bool *destroy) {
    *destroy = --e->refs == 0;
}

void lm_eng_destroy(lm_engine *e) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    free(e->model_path);
    if (e->prefix_strings)
        for (size_t i = 0; i < 2 * e->p.n_prefix_messages; i++) free(e->prefix_strings[i]);
    free(e->prefix_strings);
    free(e->prefix);
    free(e);
}

void lm_eng_unref(lm_engine *e) {
    bool destroy;
    pthread_mutex_lock(&e->mu);
    lm_eng_unref_locked(e, &destroy);
    pthread_mutex_unlock(&e->mu);
    if (destroy) lm_eng_destroy(e);
}

/* The load error as this thread's error, or LM_OK once loaded. Blocks while loading. */
lm_status lm_eng_wait_loaded_locked(lm_engine *e) {
    while (!e->loaded) pthread_cond_wait(&e->done_cv, &e->mu);
    if (e->load_status) return lm_error(e->load_status, "%s", e->load_err);
    return LM_OK;
}

/* ---- params ---- */

lm_engine_params lm_engine_default_params(void) {
    lm_engine_params p;
    memset(&p, 0, sizeof p);
    p.model = lm_model_default_params();
    p.batch_size = 8;
    p.max_batch_tokens = 256;
    return p;
}

lm_generate_params lm_engine_generate_default_params(void) {
    lm_generate_params g = lm_generate_default_params();
    g.sampling.temperature = 0.0f;
    g.max_tokens = 1;
    return g;
}

static lm_status validate_params(const lm_engine_params *p) {
    if (p->batch_size <= 0 || p->batch_size > 4096)
        return lm_error(LM_ERR_INVALID_ARG, "engine batch_size = %d: must be in [1, 4096]", p->batch_size);
    if (p->max_batch_tokens <= 0 || p->max_batch_tokens > (1 << 20))
        return lm_error(LM_ERR_INVALID_ARG, "engine max_batch_tokens = %d: must be in [1, %d]", p->max_batch_tokens,
                        1 << 20);
    if (p->max_kv_size < 0) return lm_error(LM_ERR_INVALID_ARG, "engine max_kv_size = %d: must be >= 0", p->max_kv_size);
    if (p->n_prefix_messages && !p->prefix_messages)
        return lm_error(LM_ERR_INVALID_ARG, "prefix_messages is NULL with n_prefix_messages = %zu", p->n_prefix_messages);
    for (size_t i = 0; i < p->n_prefix_messages; i++)
        if (!p->prefix_messages[i].role || !p->prefix_messages[i].content)
            return lm_error(LM_ERR_INVALID_ARG, "prefix message %zu has a NULL role or content", i);
    if (p->processor_factory.release && !p->processor_factory.build)
        return lm_error(LM_ERR_INVALID_ARG, "processor_factory has release but no build");
    return LM_OK;
}

lm_status lm_engine_create(const char *model, const lm_engine_params *params, lm_engine **out) {
    if (!out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_create: out is NULL");
    *out = NULL;
    if (!model || !*model) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_create: no model given");
    lm_engine_params p = params ? *params : lm_engine_default_params();
    lm_status st = validate_params(&p);
    if (st) return st;
    lm_engine *e = calloc(1, sizeof *e);
    if (!e) return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    e->p = p;
    e->refs = 1;
    atomic_init(&e->device_peak, 0);
    e->model_path = strdup(model);
    size_t np = p.n_prefix_messages;
    if (np) {
        e->prefix = calloc(np, sizeof *e->prefix);
        e->prefix_strings = calloc(2 * np, sizeof *e->prefix_strings);
        bool ok = e->prefix && e->prefix_strings;
        for (size_t i = 0; ok && i < np; i++) {
            e->prefix_strings[2 * i] = strdup(p.prefix_messages[i].role);
            e->prefix_strings[2 * i + 1] = strdup(p.prefix_messages[i].content);
            ok = e->prefix_strings[2 * i] && e->prefix_strings[2 * i + 1];
            if (ok) e->prefix[i] = (lm_chat_message){e->prefix_strings[2 * i], e->prefix_strings[2 * i + 1]};
        }
        if (!ok) {
            e->p.n_prefix_messages = np;
            pthread_mutex_init(&e->mu, NULL);
            pthread_cond_init(&e->work_cv, NULL);
            pthread_cond_init(&e->done_cv, NULL);
            lm_eng_destroy(e);
            return lm_error(LM_ERR_NO_MEMORY, "out of memory");
        }
    }
    e->p.prefix_messages = e->prefix;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    if (!e->model_path || pthread_create(&e->thread, NULL, lm_eng_worker, e) != 0) {
        lm_eng_destroy(e);
        return lm_error(LM_ERR_NO_MEMORY, "could not start the engine's worker thread");
    }
    e->thread_started = true;
    *out = e;
    return LM_OK;
}

lm_status lm_engine_wait_loaded(lm_engine *e) {
    if (!e) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_wait_loaded: engine is NULL");
    pthread_mutex_lock(&e->mu);
    lm_status st = lm_eng_wait_loaded_locked(e);
    pthread_mutex_unlock(&e->mu);
    return st;
}

const lm_model *lm_engine_model(lm_engine *e) {
    if (!e) return NULL;
    pthread_mutex_lock(&e->mu);
    const lm_model *m = e->loaded && !e->load_status ? e->model : NULL;
    pthread_mutex_unlock(&e->mu);
    return m;
}

/* ---- statistics, memory, shutdown ---- */

lm_status lm_engine_get_stats(lm_engine *e, lm_engine_stats *out) {
    if (!e || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_get_stats: NULL argument");
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    double steps = (double)e->st.n_steps;
    out->mean_batch_tokens = steps > 0 ? e->step_tokens_sum / steps : 0.0;
    out->batch_occupancy = steps > 0 ? e->occupancy_sum / steps : 0.0;
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

double lm_engine_peak_memory_gb(const lm_engine *e) {
    struct rusage ru;
    double bytes = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0.0; /* KiB on Linux */
    if (e) bytes += (double)atomic_load(&e->device_peak);
    return bytes / (1024.0 * 1024.0 * 1024.0);
}

void lm_engine_close(lm_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->closing = true;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    lm_eng_unref(e);
}
