/* Jobs: functions run on the worker thread between steps, each with a future the
 * caller waits on. A future holds a reference on the engine, so it outlives
 * lm_engine_close. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void lm_eng_run_job(lm_engine *e, job *j, lm_status load_st) {
    void *result = NULL;
    lm_clear_error();
    lm_status st = load_st ? lm_error(load_st, "%s", e->load_err) : j->fn(e, j->arg, &result);
    lm_future *f = j->fut;
    bool destroy_f, destroy_e = false;
    pthread_mutex_lock(&e->mu);
    f->done = true;
    f->status = st;
    f->result = result;
    if (st) lm_eng_set_err(f->err, lm_last_error());
    e->st.n_jobs++;
    destroy_f = --f->refs == 0;
    if (destroy_f) lm_eng_unref_locked(e, &destroy_e);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    if (destroy_f) free(f);
    free(j);
    (void)destroy_e; /* the owner's reference is held while the worker runs */
}

lm_status lm_engine_submit(lm_engine *e, lm_engine_job_fn fn, void *arg, lm_future **out) {
    if (!e || !fn || !out) return lm_error(LM_ERR_INVALID_ARG, "lm_engine_submit: NULL argument");
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    lm_future *f = calloc(1, sizeof *f);
    if (!j || !f) {
        free(j);
        free(f);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    lm_status st = LM_OK;
    if (e->loaded && e->load_status)
        st = lm_error(e->load_status, "%s", e->load_err);
    else if (e->closing)
        st = lm_error(LM_ERR_INVALID_ARG, "the engine is closing: no more jobs");
    if (st) {
        pthread_mutex_unlock(&e->mu);
        free(j);
        free(f);
        return st;
    }
    f->e = e;
    f->refs = 2;
    e->refs++;
    j->fn = fn;
    j->arg = arg;
    j->fut = f;
    if (e->jobs_tail)
        e->jobs_tail->next = j;
    else
        e->jobs_head = j;
    e->jobs_tail = j;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    *out = f;
    return LM_OK;
}

lm_status lm_future_wait(lm_future *f, void **result) {
    if (!f) return lm_error(LM_ERR_INVALID_ARG, "lm_future_wait: future is NULL");
    lm_engine *e = f->e;
    pthread_mutex_lock(&e->mu);
    while (!f->done) pthread_cond_wait(&e->done_cv, &e->mu);
    lm_status st = f->status;
    if (result) *result = f->result;
    char err[ERR_CAP];
    memcpy(err, f->err, ERR_CAP);
    pthread_mutex_unlock(&e->mu);
    if (st) return lm_error(st, "%s", err);
    return LM_OK;
}

bool lm_future_done(lm_future *f) {
    if (!f) return false;
    pthread_mutex_lock(&f->e->mu);
    bool d = f->done;
    pthread_mutex_unlock(&f->e->mu);
    return d;
}

void lm_future_free(lm_future *f) {
    if (!f) return;
    lm_engine *e = f->e;
    bool destroy_e = false;
    pthread_mutex_lock(&e->mu);
    bool destroy_f = --f->refs == 0;
    if (destroy_f) lm_eng_unref_locked(e, &destroy_e);
    pthread_mutex_unlock(&e->mu);
    if (destroy_f) free(f);
    if (destroy_e) lm_eng_destroy(e);
}
