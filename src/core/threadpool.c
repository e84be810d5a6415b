#include "core/threadpool.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/error.h"

struct lm_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;  /* workers wait here for a new generation */
    pthread_cond_t work_done;   /* the caller waits here for n_pending == 0 */
    uint64_t generation;        /* bumped once per lm_threadpool_run        */
    int n_pending;
    bool stopping;
    lm_parallel_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    lm_threadpool *pool;
    int index;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    lm_threadpool *pool = arg.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (!pool->stopping && pool->generation == seen) pthread_cond_wait(&pool->work_ready, &pool->mutex);
        if (pool->stopping) break;
        seen = pool->generation;
        lm_parallel_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mutex);
        fn(ctx, arg.index, pool->n_threads);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->n_pending == 0) pthread_cond_signal(&pool->work_done);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

lm_status lm_threadpool_create(int n_threads, lm_threadpool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return lm_error(LM_ERR_INVALID_ARG, "thread count %d is out of range (1..1024)", n_threads);
    lm_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return lm_error(LM_ERR_NO_MEMORY, "out of memory creating a thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->work_ready, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        lm_threadpool_free(pool);
        return lm_error(LM_ERR_NO_MEMORY, "out of memory creating a thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (worker_arg){.pool = pool, .index = i};
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i; /* only join the ones that started */
            lm_threadpool_free(pool);
            return lm_error(LM_ERR_NO_MEMORY, "cannot start worker thread %d", i);
        }
    }
    *out = pool;
    return LM_OK;
}

void lm_threadpool_free(lm_threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->work_ready);
    pthread_cond_destroy(&pool->work_done);
    free(pool->threads);
    free(pool);
}

int lm_threadpool_size(const lm_threadpool *pool) { return pool->n_threads; }

void lm_threadpool_run(lm_threadpool *pool, lm_parallel_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    fn(ctx, 0, pool->n_threads);
    pthread_mutex_lock(&pool->mutex);
    while (pool->n_pending > 0) pthread_cond_wait(&pool->work_done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
