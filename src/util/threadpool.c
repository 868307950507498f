/*
 * threadpool.c - persistent worker threads with a cheap fork/join.
 *
 * A run publishes (fn, ctx) and bumps a generation counter; workers spin briefly on the
 * counter, then sleep on it with a futex. The caller runs share 0 itself, then waits for a
 * pending count to reach zero (spin, then futex). Sleeper counts make the wake-up
 * syscalls conditional: every flag/counter pair is accessed with seq_cst atomics, so a
 * waker either sees the sleeper registered or the sleeper sees the new value before
 * sleeping (and FUTEX_WAIT re-checks the value atomically in the kernel).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_SET (the build defines it too) */
#endif
#include "util/threadpool.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_pause() _mm_pause()
#else
#define cpu_pause() ((void)0)
#endif

/* Spin budget before sleeping: SPIN_PURE plain pauses (the fast hand-off when every thread
 * has a core), then yields, so that an oversubscribed pool (more threads than free cores)
 * lets the thread it waits for run, then a futex sleep. */
enum { SPIN_PURE = 512, SPIN_ITERS = 2048, MAX_THREADS = 512 };

static inline void cpu_relax(int i) {
    if (i >= SPIN_PURE)
        sched_yield();
    else
        cpu_pause();
}

typedef struct worker {
    kiln_threadpool *tp;
    int ith;
    pthread_t thread;
} worker;

struct kiln_threadpool {
    int n_threads;
    worker *workers; /* n_threads - 1 */
    int n_started;

    kiln_threadpool_fn fn; /* published before gen is bumped */
    void *ctx;

    _Alignas(64) atomic_uint gen;
    atomic_int n_sleeping; /* workers inside the futex wait on gen */
    atomic_int stop;
    _Alignas(64) atomic_uint pending; /* workers that have not finished the current run */
    atomic_int caller_sleeping;
};

static void futex_wait(atomic_uint *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr, int n) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    kiln_threadpool *tp = wk->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax(i);
            g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        }
        if (g == seen) {
            atomic_fetch_add(&tp->n_sleeping, 1);
            while ((g = atomic_load(&tp->gen)) == seen) futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->n_sleeping, 1);
        }
        seen = g;
        if (atomic_load(&tp->stop)) break;
        tp->fn(tp->ctx, wk->ith, tp->n_threads);
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->pending, 1);
    }
    return NULL;
}

static void noop(void *ctx, int ith, int nth) {
    (void)ctx, (void)ith, (void)nth;
}

/* Publish fn/ctx and wake the workers (they must all be idle). */
static void start_run(kiln_threadpool *tp, kiln_threadpool_fn fn, void *ctx) {
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->pending, (unsigned)tp->n_started);
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: release of fn/ctx/pending */
    if (atomic_load(&tp->n_sleeping) > 0) futex_wake(&tp->gen, INT_MAX);
}

static void wait_run(kiln_threadpool *tp) {
    unsigned p = atomic_load_explicit(&tp->pending, memory_order_acquire);
    for (int i = 0; p != 0 && i < SPIN_ITERS; i++) {
        cpu_relax(i);
        p = atomic_load_explicit(&tp->pending, memory_order_acquire);
    }
    if (p == 0) return;
    atomic_store(&tp->caller_sleeping, 1);
    while ((p = atomic_load(&tp->pending)) != 0) futex_wait(&tp->pending, p);
    atomic_store(&tp->caller_sleeping, 0);
}

kiln_status kiln_threadpool_create(int n_threads, kiln_threadpool **out, kiln_error *err) {
    if (out) *out = NULL;
    if (!out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "threadpool: out must not be NULL");
    if (n_threads < 1 || n_threads > MAX_THREADS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "threadpool: n_threads must be in [1, %d], got %d", MAX_THREADS,
                              n_threads);
    kiln_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "threadpool: out of memory");
    tp->n_threads = n_threads;
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->stop, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->caller_sleeping, 0);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "threadpool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker *wk = &tp->workers[i - 1];
        wk->tp = tp;
        wk->ith = i;
        int rc = pthread_create(&wk->thread, NULL, worker_main, wk);
        if (rc != 0) {
            kiln_threadpool_destroy(tp);
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "threadpool: pthread_create failed for thread %d of %d: %s", i,
                                  n_threads, strerror(rc));
        }
        tp->n_started = i;
    }
    /* workers see tp->n_threads as nth; an incomplete pool never runs work */
    *out = tp;
    return KILN_OK;
}

void kiln_threadpool_destroy(kiln_threadpool *tp) {
    if (!tp) return;
    if (tp->n_started > 0) {
        atomic_store(&tp->stop, 1);
        start_run(tp, noop, NULL);
        for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    }
    free(tp->workers);
    free(tp);
}

int kiln_threadpool_size(const kiln_threadpool *tp) {
    return tp ? tp->n_threads : 1;
}

void kiln_threadpool_run(kiln_threadpool *tp, kiln_threadpool_fn fn, void *ctx) {
    if (!tp || tp->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    start_run(tp, fn, ctx);
    fn(ctx, 0, tp->n_threads);
    wait_run(tp);
}

/* ---------------------------------------------------------------- physical cores */

static int read_int_file(const char *path, long *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fscanf(f, "%ld", out) == 1;
    fclose(f);
    return ok;
}

int kiln_physical_cores(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    cpu_set_t set;
    int have_mask = sched_getaffinity(0, sizeof set, &set) == 0;

    /* distinct (package, core) pairs among the CPUs we may run on */
    enum { MAX_PAIRS = 4096 };
    static const long none = -1;
    long(*pairs)[2] = malloc(sizeof(long[2]) * MAX_PAIRS);
    if (!pairs) return (int)online;
    int n_pairs = 0;
    DIR *d = opendir("/sys/devices/system/cpu");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, "cpu", 3) != 0 || !isdigit((unsigned char)e->d_name[3]))
                continue;
            char *end;
            long id = strtol(e->d_name + 3, &end, 10);
            if (*end != '\0') continue;
            if (have_mask && (id >= CPU_SETSIZE || !CPU_ISSET((int)id, &set))) continue;
            char path[128];
            long online_flag = 1, core = none, pkg = 0;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/online", id);
            if (read_int_file(path, &online_flag) && online_flag == 0) continue;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", id);
            if (!read_int_file(path, &core)) continue;
            snprintf(path, sizeof path,
                     "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id", id);
            read_int_file(path, &pkg);
            int found = 0;
            for (int i = 0; i < n_pairs && !found; i++)
                found = pairs[i][0] == pkg && pairs[i][1] == core;
            if (!found && n_pairs < MAX_PAIRS) {
                pairs[n_pairs][0] = pkg;
                pairs[n_pairs][1] = core;
                n_pairs++;
            }
        }
        closedir(d);
    }
    free(pairs);
    if (n_pairs >= 1) return n_pairs;
    if (have_mask) {
        int c = CPU_COUNT(&set);
        if (c >= 1) return c;
    }
    return (int)online;
}
