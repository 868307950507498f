/*
 * test_threadpool - fork/join semantics of kiln_threadpool: every run calls fn exactly once
 * per thread index with the right nth, runs are fully joined before run() returns (the
 * caller sees all writes), argument errors, NULL pools, and kiln_physical_cores bounds.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "test.h"
#include "util/threadpool.h"

typedef struct ctx {
    int nth_expected;
    int calls[16]; /* written by thread ith only */
    atomic_int total;
    int bad_nth;
    long long sum[16];
    int round;
} ctx;

static void work(void *p, int ith, int nth) {
    ctx *c = p;
    if (nth != c->nth_expected) c->bad_nth = 1;
    c->calls[ith]++;
    c->sum[ith] += c->round;
    atomic_fetch_add(&c->total, 1);
}

int main(void) {
    kiln_error err;
    kiln_threadpool *tp = (kiln_threadpool *)1;
    CHECK(kiln_threadpool_create(0, &tp, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(tp == NULL);
    CHECK(kiln_threadpool_create(513, &tp, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "513") != NULL);
    kiln_threadpool_destroy(NULL);
    CHECK(kiln_threadpool_size(NULL) == 1);

    /* NULL pool runs inline as thread 0 of 1 */
    ctx c0 = {.nth_expected = 1};
    kiln_threadpool_run(NULL, work, &c0);
    CHECK(c0.calls[0] == 1 && atomic_load(&c0.total) == 1 && !c0.bad_nth);

    for (int n = 1; n <= 4; n++) {
        REQUIRE(kiln_threadpool_create(n, &tp, &err) == KILN_OK);
        CHECK(kiln_threadpool_size(tp) == n);
        ctx c = {.nth_expected = n};
        enum { ROUNDS = 3000 };
        long long want_sum = 0;
        for (int r = 0; r < ROUNDS; r++) {
            c.round = r;
            want_sum += r;
            kiln_threadpool_run(tp, work, &c);
            /* joined: every thread's plain writes for this round are visible now */
            for (int i = 0; i < n; i++)
                if (c.calls[i] != r + 1) {
                    CHECKF(0, "n=%d round %d: thread %d ran %d times", n, r, i, c.calls[i]);
                    r = ROUNDS;
                    break;
                }
        }
        CHECK(!c.bad_nth);
        CHECK(atomic_load(&c.total) == n * ROUNDS);
        for (int i = 0; i < n; i++) CHECK(c.sum[i] == want_sum);
        /* a pause long enough for the workers to fall asleep, then more runs */
        usleep(20000);
        for (int r = 0; r < 10; r++) kiln_threadpool_run(tp, work, &c);
        CHECK(atomic_load(&c.total) == n * (ROUNDS + 10));
        kiln_threadpool_destroy(tp);
    }

    int cores = kiln_physical_cores();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    printf("physical cores %d, online cpus %ld\n", cores, online);
    CHECK(cores >= 1);
    CHECK(online < 1 || cores <= online);
    return kiln_test_finish("test_threadpool");
}
