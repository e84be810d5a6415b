/* A persistent pool of worker threads. Work is a function called once per thread
 * with (thread index, thread count); the caller's thread takes index 0, so a pool
 * of one thread runs everything inline. Idle workers sleep on a condition variable. */
#ifndef LM_CORE_THREADPOOL_H
#define LM_CORE_THREADPOOL_H

#include "lumen.h"

typedef struct lm_threadpool lm_threadpool;
typedef void (*lm_parallel_fn)(void *ctx, int ith, int nth);

lm_status lm_threadpool_create(int n_threads, lm_threadpool **out);
void lm_threadpool_free(lm_threadpool *pool);
int lm_threadpool_size(const lm_threadpool *pool);

/* Runs fn(ctx, i, n) for i in [0, n) across the pool and returns when all are done.
 * Not reentrant: one parallel region at a time per pool. */
void lm_threadpool_run(lm_threadpool *pool, lm_parallel_fn fn, void *ctx);

/* Splits [0, n) into nth nearly equal ranges; thread ith gets [*begin, *end). */
static inline void lm_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif
