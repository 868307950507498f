/*
 * test_kv_stats_threads - kiln_kv_pool_get_stats read from another thread while the engine
 * thread allocates and frees (kv_pool.h: stats are atomics, readable from any thread).
 *
 * Oracle: the documented snapshot invariants (used + free == n_blocks, 0 <= used <= peak <=
 * n_blocks, peak never decreases without a reset) and the final counts the engine thread
 * knows. Meant to be run under ASan/UBSan and, by hand, TSan (-fsanitize=thread).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kv/kv_pool.h"
#include "test.h"

#define N_BLOCKS 64

static atomic_int stop;
static atomic_long bad_snapshots, n_snapshots;

static void *reader(void *arg) {
    const kiln_kv_pool *pool = arg;
    int32_t last_peak = 0;
    while (!atomic_load(&stop)) {
        kiln_kv_pool_stats s = kiln_kv_pool_get_stats(pool);
        int ok = s.n_blocks == N_BLOCKS && s.used >= 0 && s.used + s.free == s.n_blocks &&
                 s.peak >= s.used && s.peak <= s.n_blocks && s.peak >= last_peak;
        int32_t nf = kiln_kv_pool_n_free(pool);
        ok = ok && nf >= 0 && nf <= N_BLOCKS;
        if (!ok) atomic_fetch_add(&bad_snapshots, 1);
        last_peak = s.peak;
        atomic_fetch_add(&n_snapshots, 1);
    }
    return NULL;
}

int main(void) {
    kiln_kv_pool_params p = {.n_layer = 4, .kv_dim = 32, .block_size = 16, .n_blocks = N_BLOCKS, .dtype = KILN_DTYPE_F16};
    kiln_kv_pool *pool = NULL;
    REQUIRE(kiln_kv_pool_create(&p, &pool, NULL) == KILN_OK);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, reader, pool) == 0);

    /* the engine thread: tables grow and roll back, pseudo-randomly */
    kiln_block_table t[4] = {{0}};
    uint32_t rng = 12345;
    int32_t max_used = 0;
    for (int it = 0; it < 200000; it++) {
        rng = rng * 1664525u + 1013904223u;
        kiln_block_table *bt = &t[(rng >> 8) & 3];
        int32_t n = (int32_t)((rng >> 12) % (16 * 24));
        if ((rng >> 28) & 1)
            kiln_block_table_reserve(bt, pool, n, NULL); /* may fail when full: fine */
        else
            kiln_block_table_truncate(bt, pool, n);
        int32_t u = t[0].n_blocks + t[1].n_blocks + t[2].n_blocks + t[3].n_blocks;
        if (u > max_used) max_used = u;
        if (it % 1024 == 0) CHECK(kiln_kv_pool_get_stats(pool).used == u);
    }
    kiln_kv_pool_stats s = kiln_kv_pool_get_stats(pool);
    int32_t u = t[0].n_blocks + t[1].n_blocks + t[2].n_blocks + t[3].n_blocks;
    CHECK(s.used == u && s.peak == max_used && s.free == N_BLOCKS - u);
    /* keep the reader going until it has seen some snapshots */
    while (atomic_load(&n_snapshots) < 1000)
        ;
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    CHECKF(atomic_load(&bad_snapshots) == 0, "%ld of %ld snapshots inconsistent",
           atomic_load(&bad_snapshots), atomic_load(&n_snapshots));
    printf("reader took %ld snapshots; max used %d of %d\n", atomic_load(&n_snapshots), max_used,
           N_BLOCKS);
    for (int i = 0; i < 4; i++) kiln_block_table_release(&t[i], pool);
    CHECK(kiln_kv_pool_get_stats(pool).used == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
    return kiln_test_finish("test_kv_stats_threads");
}
