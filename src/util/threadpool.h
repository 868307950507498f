/* threadpool.h - a persistent pool of worker threads with a cheap fork/join. */
#ifndef KILN_UTIL_THREADPOOL_H
#define KILN_UTIL_THREADPOOL_H

#include "kiln.h"

typedef struct kiln_threadpool kiln_threadpool;

/** Work item: called once on each of the nth threads with ith in [0, nth). */
typedef void (*kiln_threadpool_fn)(void *ctx, int ith, int nth);

/**
 * Create a pool of n_threads (>= 1) threads; the calling thread acts as thread 0, so
 * n_threads - 1 workers are started. Errors: KILN_ERR_INVALID_ARGUMENT (n_threads < 1 or
 * > 512), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (pthread_create failed).
 */
kiln_status kiln_threadpool_create(int n_threads, kiln_threadpool **out, kiln_error *err);

/** Stop and join the workers. NULL is a no-op. */
void kiln_threadpool_destroy(kiln_threadpool *tp);

/** Number of threads including the caller; 1 when tp is NULL. */
int kiln_threadpool_size(const kiln_threadpool *tp);

/**
 * Run fn(ctx, ith, nth) on every thread and return when all have finished. tp == NULL runs
 * fn(ctx, 0, 1) inline. Not reentrant: one run at a time per pool.
 */
void kiln_threadpool_run(kiln_threadpool *tp, kiln_threadpool_fn fn, void *ctx);

/** Number of physical cores (best effort from /sys; falls back to online CPUs). >= 1. */
int kiln_physical_cores(void);

#endif
