/* The thread pool. Between the many short parallel regions of a forward pass (one
 * per matrix product), workers poll for the next one for a little while (~50-100 us)
 * instead of sleeping at once: waking a sleeping thread costs more than most of the
 * regions themselves. After that they sleep on a condition variable, so an idle pool
 * burns no CPU. The caller waits for stragglers the same way. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"

enum { SPIN_ROUNDS = 2000 };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

struct lm_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;       /* sleeping workers wait here               */
    _Atomic uint64_t generation;     /* bumped once per lm_threadpool_run        */
    _Atomic int n_pending;           /* workers still running the current region */
    _Atomic int n_sleeping;          /* workers blocked on work_ready            */
    _Atomic bool stopping;
    lm_parallel_fn fn;               /* published by the generation bump         */
    void *ctx;
};

typedef struct worker_arg {
    lm_threadpool *pool;
    int index;
} worker_arg;

/* Waits until the generation moves past `seen` or the pool stops. */
static uint64_t wait_for_work(lm_threadpool *pool, uint64_t seen) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        uint64_t g = atomic_load(&pool->generation);
        if (g != seen || atomic_load(&pool->stopping)) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->n_sleeping, 1);
    /* re-checked after announcing the sleep: the publisher reads n_sleeping after
     * bumping the generation, so one of the two always sees the other */
    while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stopping))
        pthread_cond_wait(&pool->work_ready, &pool->mutex);
    atomic_fetch_sub(&pool->n_sleeping, 1);
    pthread_mutex_unlock(&pool->mutex);
    return atomic_load(&pool->generation);
}

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    lm_threadpool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_work(pool, seen);
        if (atomic_load(&pool->stopping)) break;
        pool->fn(pool->ctx, arg.index, pool->n_threads);
        atomic_fetch_sub(&pool->n_pending, 1);
    }
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
    atomic_store(&pool->stopping, true);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->work_ready);
    free(pool->threads);
    free(pool);
}

int lm_threadpool_size(const lm_threadpool *pool) { return pool->n_threads; }

void lm_threadpool_run(lm_threadpool *pool, lm_parallel_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->n_pending, pool->n_threads - 1);
    atomic_fetch_add(&pool->generation, 1); /* publishes fn and ctx */
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->work_ready);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(ctx, 0, pool->n_threads);
    for (int i = 0; atomic_load(&pool->n_pending) > 0; i++) {
        if (i < SPIN_ROUNDS)
            cpu_relax();
        else
            sched_yield(); /* a worker was descheduled: let it run */
    }
}
