/* The worker thread: loads the model, then loops: take new requests and the next
 * job under the lock; run the job (jobs go first, so close lets the queue drain);
 * end cancelled requests (all of them when closing), freeing their blocks; admit
 * and run one batch step; publish. It sleeps when there is nothing to do. */
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void *lm_eng_worker(void *arg) {
    lm_engine *e = arg;
    lm_status st = lm_eng_load(e);
    pthread_mutex_lock(&e->mu);
    e->loaded = true;
    e->load_status = st;
    if (st) lm_eng_set_err(e->load_err, lm_last_error());
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);

    pubs ps = {0};
    for (;;) {
        pthread_mutex_lock(&e->mu);
        /* new requests join the queue */
        while (e->incoming_head) {
            lm_engine_request *r = e->incoming_head;
            e->incoming_head = r->next_in;
            if (e->n_waiting == e->cap_waiting) {
                int64_t cap = e->cap_waiting ? e->cap_waiting * 2 : 64;
                lm_engine_request **nw = realloc(e->waiting, sizeof *nw * (size_t)cap);
                if (!nw) {
                    e->incoming_head = r; /* try again next round */
                    break;
                }
                e->waiting = nw;
                e->cap_waiting = cap;
            }
            e->waiting[e->n_waiting++] = r;
        }
        if (!e->incoming_head) e->incoming_tail = NULL;
        job *j = e->jobs_head;
        if (j) {
            e->jobs_head = j->next;
            if (!e->jobs_head) e->jobs_tail = NULL;
        }
        bool closing = e->closing;
        bool idle = !j && e->n_running == 0 && (e->n_waiting == 0 || st) && !closing;
        if (idle) {
            pthread_cond_wait(&e->work_cv, &e->mu);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);

        if (j) {
            lm_eng_run_job(e, j, st);
            continue; /* jobs first: close lets the queue drain */
        }
        /* cancellations (and, when closing, everything) end now, freeing blocks */
        for (int64_t i = 0; i < e->n_waiting;) {
            lm_engine_request *r = e->waiting[i];
            if (closing || st || atomic_load(&r->cancel)) {
                lm_finish_reason why = st ? LM_FINISH_ERROR : LM_FINISH_CANCELLED;
                lm_eng_finish_request(e, r, why, st, st ? e->load_err : NULL, &ps);
                memmove(e->waiting + i, e->waiting + i + 1, sizeof *e->waiting * (size_t)(e->n_waiting - i - 1));
                e->n_waiting--;
            } else {
                i++;
            }
        }
        for (int32_t i = 0; i < e->n_running; i++) {
            lm_engine_request *r = e->running[i];
            if (closing || atomic_load(&r->cancel)) lm_eng_finish_request(e, r, LM_FINISH_CANCELLED, LM_OK, NULL, &ps);
        }
        lm_eng_drop_done(e);
        if (closing) {
            lm_eng_publish(e, &ps);
            pthread_mutex_lock(&e->mu);
            bool more = e->jobs_head || e->incoming_head;
            pthread_mutex_unlock(&e->mu);
            if (!more) break;
            continue;
        }
        if (!st) lm_eng_schedule(e, &ps);
        lm_eng_publish(e, &ps);
        pthread_mutex_lock(&e->mu);
        lm_eng_update_stats_locked(e);
        pthread_mutex_unlock(&e->mu);
    }
    free(ps.a);
    lm_eng_unload(e);
    return NULL;
}
