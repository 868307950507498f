/*
 * test_block_table - sequences' block tables over the KV pool (src/kv/kv_pool.h).
 *
 * Oracles: the API contract and DESIGN.md principles 2 and 4: a table covering n tokens holds
 * ceil(n / block_size) blocks; a failed reserve leaves table and pool stats exactly as they
 * were; forking shares blocks (refcount + 1, no new blocks); a block is freed only when its
 * last owner lets go.
 */
#include <stdint.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "test.h"

static kiln_kv_pool *make(int32_t n_blocks) {
    kiln_kv_pool_params p = {.n_layer = 2, .kv_dim = 8, .block_size = 16, .n_blocks = n_blocks, .dtype = KILN_DTYPE_F16};
    kiln_kv_pool *pool = NULL;
    REQUIRE(kiln_kv_pool_create(&p, &pool, NULL) == KILN_OK);
    return pool;
}

static int32_t used(const kiln_kv_pool *pool) {
    return kiln_kv_pool_get_stats(pool).used;
}

static void test_reserve_truncate(void) {
    kiln_kv_pool *pool = make(8);
    kiln_block_table bt = {0};
    kiln_error err;

    CHECK(kiln_block_table_reserve(&bt, pool, 0, &err) == KILN_OK);
    CHECK(bt.n_blocks == 0 && used(pool) == 0);
    CHECK(kiln_block_table_reserve(&bt, pool, 1, &err) == KILN_OK);
    CHECK(bt.n_blocks == 1 && used(pool) == 1);
    CHECK(kiln_block_table_reserve(&bt, pool, 16, &err) == KILN_OK);
    CHECK(bt.n_blocks == 1 && used(pool) == 1);
    int32_t first = bt.blocks[0];
    CHECK(kiln_block_table_reserve(&bt, pool, 17, &err) == KILN_OK);
    CHECK(bt.n_blocks == 2 && used(pool) == 2 && bt.blocks[0] == first);
    CHECK(kiln_block_table_reserve(&bt, pool, 33, &err) == KILN_OK);
    CHECK(bt.n_blocks == 3 && used(pool) == 3 && bt.blocks[0] == first);
    /* blocks distinct, each owned once */
    for (int32_t i = 0; i < bt.n_blocks; i++) {
        CHECK(kiln_kv_pool_refcount(pool, bt.blocks[i]) == 1);
        for (int32_t j = 0; j < i; j++) CHECK(bt.blocks[i] != bt.blocks[j]);
    }
    /* reserve never shrinks */
    CHECK(kiln_block_table_reserve(&bt, pool, 5, &err) == KILN_OK);
    CHECK(bt.n_blocks == 3 && used(pool) == 3);

    /* rollback 33 -> 16: frees 2 blocks, keeps the first */
    int32_t b1 = bt.blocks[1], b2 = bt.blocks[2];
    kiln_block_table_truncate(&bt, pool, 16);
    CHECK(bt.n_blocks == 1 && bt.blocks[0] == first && used(pool) == 1);
    CHECK(kiln_kv_pool_refcount(pool, b1) == 0 && kiln_kv_pool_refcount(pool, b2) == 0);
    CHECK(kiln_kv_pool_refcount(pool, first) == 1);
    /* growing again reuses the just-freed blocks, in their old order */
    CHECK(kiln_block_table_reserve(&bt, pool, 40, &err) == KILN_OK);
    CHECK(bt.n_blocks == 3 && bt.blocks[1] == b1 && bt.blocks[2] == b2);
    kiln_block_table_truncate(&bt, pool, 17); /* position 16 is in block 1: keep 2 */
    CHECK(bt.n_blocks == 2 && used(pool) == 2);
    kiln_block_table_truncate(&bt, pool, 32); /* longer than it is: no-op */
    CHECK(bt.n_blocks == 2 && used(pool) == 2);
    kiln_block_table_truncate(&bt, pool, 1);
    CHECK(bt.n_blocks == 1 && used(pool) == 1);
    kiln_block_table_truncate(&bt, pool, 0);
    CHECK(bt.n_blocks == 0 && used(pool) == 0);
    kiln_block_table_truncate(&bt, pool, -4);
    CHECK(bt.n_blocks == 0 && used(pool) == 0);

    /* the whole pool, exactly */
    CHECK(kiln_block_table_reserve(&bt, pool, 8 * 16, &err) == KILN_OK);
    CHECK(bt.n_blocks == 8 && used(pool) == 8 && kiln_kv_pool_n_free(pool) == 0);
    kiln_block_table_release(&bt, pool);
    CHECK(bt.blocks == NULL && bt.n_blocks == 0 && bt.cap == 0 && used(pool) == 0);
    CHECK(kiln_kv_pool_get_stats(pool).peak == 8);

    /* bad arguments */
    CHECK(kiln_block_table_reserve(&bt, pool, -1, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "n_tokens") != NULL, "'%s'", err.message);
    CHECK(kiln_block_table_reserve(NULL, pool, 1, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_block_table_reserve(&bt, NULL, 1, NULL) == KILN_ERR_INVALID_ARGUMENT);
    kiln_block_table bad = {NULL, 3, 0, 0};
    CHECK(kiln_block_table_reserve(&bad, pool, 100, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(used(pool) == 0);
    kiln_block_table_truncate(NULL, pool, 0);
    kiln_block_table_release(NULL, pool);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

static void test_reserve_staged(void) {
    kiln_kv_pool *pool = make(5);
    kiln_block_table a = {0}, b = {0};
    kiln_error err;
    CHECK(kiln_block_table_reserve(&a, pool, 33, &err) == KILN_OK); /* 3 blocks */
    CHECK(kiln_block_table_reserve(&b, pool, 16, &err) == KILN_OK); /* 1 block, 1 free left */
    kiln_kv_pool_stats before = kiln_kv_pool_get_stats(pool);
    CHECK(before.used == 4 && before.free == 1 && before.peak == 4);
    int32_t b0 = b.blocks[0];

    /* 48 tokens need 2 more blocks; 1 is free: fails, nothing changes */
    err.status = KILN_OK;
    CHECK(kiln_block_table_reserve(&b, pool, 48, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(err.status == KILN_ERR_OUT_OF_MEMORY);
    CHECKF(strstr(err.message, "need 2") != NULL && strstr(err.message, "only 1") != NULL,
           "message '%s' should say 2 needed, 1 free", err.message);
    kiln_kv_pool_stats after = kiln_kv_pool_get_stats(pool);
    CHECK(memcmp(&before, &after, sizeof(before)) == 0);
    CHECK(b.n_blocks == 1 && b.blocks[0] == b0);
    /* same from an empty table, and a request bigger than the whole pool */
    kiln_block_table c = {0};
    CHECK(kiln_block_table_reserve(&c, pool, 17, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(kiln_block_table_reserve(&c, pool, INT32_MAX, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(c.n_blocks == 0);
    after = kiln_kv_pool_get_stats(pool);
    CHECK(memcmp(&before, &after, sizeof(before)) == 0);
    /* the last free block is still there */
    CHECK(kiln_block_table_reserve(&c, pool, 1, &err) == KILN_OK && c.n_blocks == 1);
    CHECK(kiln_kv_pool_n_free(pool) == 0);
    kiln_block_table_release(&c, pool);

    /* roll a back; now b fits */
    kiln_block_table_truncate(&a, pool, 16);
    CHECK(kiln_block_table_reserve(&b, pool, 48, &err) == KILN_OK);
    CHECK(b.n_blocks == 3 && b.blocks[0] == b0 && used(pool) == 4);
    kiln_block_table_release(&a, pool);
    kiln_block_table_release(&b, pool);
    CHECK(used(pool) == 0 && kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_block_table_release(&c, pool); /* releasing an empty table is fine */
    kiln_kv_pool_destroy(pool);
}

static void test_fork(void) {
    kiln_kv_pool *pool = make(8);
    kiln_block_table a = {0}, b = {0};
    kiln_error err;
    CHECK(kiln_block_table_reserve(&a, pool, 40, &err) == KILN_OK); /* 3 blocks */
    CHECK(kiln_block_table_fork(&a, &b, pool, &err) == KILN_OK);
    CHECK(b.n_blocks == 3 && memcmp(a.blocks, b.blocks, 3 * sizeof(int32_t)) == 0);
    CHECK(b.blocks != a.blocks);
    for (int i = 0; i < 3; i++) CHECK(kiln_kv_pool_refcount(pool, a.blocks[i]) == 2);
    CHECK(used(pool) == 3); /* sharing takes no blocks */

    /* fork into a non-empty table, into itself, NULLs: rejected, nothing changes */
    CHECK(kiln_block_table_fork(&a, &b, pool, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_block_table_fork(&a, &a, pool, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_block_table_fork(NULL, &b, pool, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_block_table_fork(&a, &b, NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 3; i++) CHECK(kiln_kv_pool_refcount(pool, a.blocks[i]) == 2);

    /* b diverges: rolls back into block 1, then grows on a new block of its own */
    int32_t shared2 = a.blocks[2];
    kiln_block_table_truncate(&b, pool, 20);
    CHECK(b.n_blocks == 2 && kiln_kv_pool_refcount(pool, shared2) == 1 && used(pool) == 3);
    CHECK(kiln_block_table_reserve(&b, pool, 40, &err) == KILN_OK);
    CHECK(b.blocks[2] != shared2 && used(pool) == 4);
    CHECK(kiln_kv_pool_refcount(pool, b.blocks[2]) == 1);

    /* release one owner: shared blocks stay used until the last owner releases */
    int32_t ids[3];
    memcpy(ids, b.blocks, sizeof(ids));
    kiln_block_table_release(&a, pool);
    CHECK(used(pool) == 3);
    CHECK(kiln_kv_pool_refcount(pool, ids[0]) == 1 && kiln_kv_pool_refcount(pool, ids[1]) == 1);
    CHECK(kiln_kv_pool_refcount(pool, shared2) == 0);

    /* fork of an empty table is an empty table */
    kiln_block_table e = {0}, f = {0};
    CHECK(kiln_block_table_fork(&e, &f, pool, &err) == KILN_OK && f.n_blocks == 0);

    /* forking a stale table (holding a freed block) is an internal error and changes nothing */
    kiln_block_table stale = {0};
    int32_t st_ids[2] = {ids[0], shared2};
    stale.blocks = st_ids;
    stale.n_blocks = stale.cap = 2;
    CHECK(kiln_block_table_fork(&stale, &f, pool, &err) == KILN_ERR_INTERNAL);
    CHECK(f.n_blocks == 0 && kiln_kv_pool_refcount(pool, ids[0]) == 1);

    kiln_block_table_release(&b, pool);
    CHECK(used(pool) == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);

    /* fork, then release in the other order */
    CHECK(kiln_block_table_reserve(&a, pool, 100, &err) == KILN_OK); /* 7 blocks */
    CHECK(kiln_block_table_fork(&a, &b, pool, &err) == KILN_OK);
    CHECK(kiln_block_table_fork(&b, &f, pool, &err) == KILN_OK);
    CHECK(kiln_kv_pool_refcount(pool, a.blocks[6]) == 3 && used(pool) == 7);
    kiln_block_table_release(&b, pool);
    kiln_block_table_release(&a, pool);
    CHECK(used(pool) == 7);
    kiln_block_table_release(&f, pool);
    CHECK(used(pool) == 0 && kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_block_table_release(&e, pool);
    kiln_kv_pool_destroy(pool);
}

/* Layer groups and holes (src/engine/kv_window.c): a pool with a layer mask holds
 * storage only for its layers; free_below gives back the blocks wholly below a position and
 * leaves holes that truncate, release and reserve skip. */
static void test_groups_and_holes(void) {
    const bool sliding[4] = {true, true, false, true};
    kiln_kv_pool_params p = {.n_layer = 4, .kv_dim = 8, .block_size = 16, .n_blocks = 6,
                             .dtype = KILN_DTYPE_F32, .layers = sliding, .window = 20};
    kiln_kv_pool *pool = NULL;
    REQUIRE(kiln_kv_pool_create(&p, &pool, NULL) == KILN_OK);
    CHECK(kiln_kv_pool_n_layers_stored(pool) == 3 && kiln_kv_pool_window(pool) == 20);
    CHECK(kiln_kv_pool_holds_layer(pool, 1) && !kiln_kv_pool_holds_layer(pool, 2) &&
          !kiln_kv_pool_holds_layer(pool, 4) && !kiln_kv_pool_holds_layer(NULL, 0));
    /* storage: 3 layers x 6 blocks x (16 rows x 32 bytes) for K and for V */
    CHECK(kiln_kv_pool_storage_bytes(pool) == 2 * 3 * 6 * 16 * 32);
    CHECK(kiln_kv_pool_k(pool, 2, 0) == NULL && kiln_kv_pool_k(pool, 3, 0) != NULL);
    CHECK((char *)kiln_kv_pool_k(pool, 3, 0) - (char *)kiln_kv_pool_k(pool, 1, 0) == 6 * 16 * 32);

    kiln_block_table bt = {0};
    kiln_error err;
    CHECK(kiln_block_table_reserve(&bt, pool, 80, &err) == KILN_OK); /* 5 blocks */
    const int32_t b2 = bt.blocks[2];
    CHECK(kiln_block_table_free_below(&bt, pool, 0) == 0);
    CHECK(kiln_block_table_free_below(&bt, pool, 47) == 2); /* blocks 0, 1 (32 <= 47 < 48) */
    CHECK(bt.n_freed == 2 && bt.blocks[0] == -1 && bt.blocks[1] == -1 && bt.blocks[2] == b2);
    CHECK(bt.n_blocks == 5 && used(pool) == 3);
    CHECK(kiln_block_table_free_below(&bt, pool, 40) == 0); /* already gone */
    /* the freed blocks are reusable: 3 free now */
    CHECK(kiln_block_table_reserve(&bt, pool, 128, &err) == KILN_OK); /* 8 entries, 6 live */
    CHECK(bt.n_blocks == 8 && used(pool) == 6 && bt.n_freed == 2);
    /* truncate into the holes: only live blocks are unref'd */
    kiln_block_table_truncate(&bt, pool, 20);
    CHECK(bt.n_blocks == 2 && bt.n_freed == 2 && used(pool) == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    /* a table with holes cannot be forked (the holes are not blocks) */
    kiln_block_table f = {0};
    CHECK(kiln_block_table_fork(&bt, &f, pool, &err) == KILN_ERR_INTERNAL);
    CHECK(kiln_block_table_reserve(&bt, pool, 64, &err) == KILN_OK);
    CHECK(used(pool) == 2 && bt.n_blocks == 4);
    kiln_block_table_release(&bt, pool);
    CHECK(used(pool) == 0 && bt.n_freed == 0 && kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);

    /* a mask selecting no layer: block ids without storage (Mistral's full group) */
    const bool none[2] = {false, false};
    kiln_kv_pool_params q = {.n_layer = 2, .kv_dim = 8, .block_size = 16, .n_blocks = 4,
                             .dtype = KILN_DTYPE_F16, .layers = none};
    REQUIRE(kiln_kv_pool_create(&q, &pool, NULL) == KILN_OK);
    CHECK(kiln_kv_pool_storage_bytes(pool) == 0 && kiln_kv_pool_k(pool, 0, 0) == NULL);
    CHECK(kiln_block_table_reserve(&bt, pool, 64, &err) == KILN_OK && used(pool) == 4);
    kiln_block_table_release(&bt, pool);
    kiln_kv_pool_destroy(pool);
}

/* fork_prefix: full blocks shared, the partial one copied (its bytes, every layer, K and V) */
static void test_fork_prefix(void) {
    kiln_kv_pool *pool = make(6);
    kiln_block_table a = {0}, b = {0}, c = {0};
    kiln_error err;
    CHECK(kiln_block_table_reserve(&a, pool, 40, &err) == KILN_OK); /* 3 blocks */
    /* fill a's storage with a pattern per (layer, block, side) */
    const size_t region = 16 * 8 * 2; /* f16 rows of kv_dim 8, 16 positions */
    for (int32_t l = 0; l < 2; l++)
        for (int32_t i = 0; i < 3; i++) {
            memset(kiln_kv_pool_k(pool, l, a.blocks[i]), 1 + l * 10 + i, region);
            memset(kiln_kv_pool_v(pool, l, a.blocks[i]), 101 + l * 10 + i, region);
        }
    /* 37 positions: blocks 0 and 1 shared, block 2 (positions 32..36) copied */
    CHECK(kiln_block_table_fork_prefix(&a, &b, pool, 37, &err) == KILN_OK);
    CHECK(b.n_blocks == 3 && b.blocks[0] == a.blocks[0] && b.blocks[1] == a.blocks[1]);
    CHECK(b.blocks[2] != a.blocks[2] && used(pool) == 4);
    CHECK(kiln_kv_pool_refcount(pool, a.blocks[0]) == 2 &&
          kiln_kv_pool_refcount(pool, a.blocks[2]) == 1 &&
          kiln_kv_pool_refcount(pool, b.blocks[2]) == 1);
    for (int32_t l = 0; l < 2; l++) {
        CHECK(memcmp(kiln_kv_pool_k(pool, l, b.blocks[2]), kiln_kv_pool_k(pool, l, a.blocks[2]),
                     region) == 0);
        CHECK(memcmp(kiln_kv_pool_v(pool, l, b.blocks[2]), kiln_kv_pool_v(pool, l, a.blocks[2]),
                     region) == 0);
    }
    /* 32 positions: two full blocks, nothing copied */
    CHECK(kiln_block_table_fork_prefix(&a, &c, pool, 32, &err) == KILN_OK);
    CHECK(c.n_blocks == 2 && used(pool) == 4 && kiln_kv_pool_refcount(pool, a.blocks[1]) == 3);
    kiln_block_table_release(&c, pool);
    /* errors change nothing: beyond src, non-empty dst, no block left for the copy */
    CHECK(kiln_block_table_fork_prefix(&a, &c, pool, 49, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_block_table_fork_prefix(&a, &b, pool, 5, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_block_table d = {0};
    CHECK(kiln_block_table_reserve(&d, pool, 32, &err) == KILN_OK); /* the pool is full */
    CHECK(kiln_block_table_fork_prefix(&a, &c, pool, 37, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(c.n_blocks == 0 && used(pool) == 6 && kiln_kv_pool_refcount(pool, a.blocks[0]) == 2);
    kiln_block_table_release(&d, pool);
    kiln_block_table_release(&a, pool);
    kiln_block_table_release(&b, pool);
    kiln_block_table_release(&c, pool);
    CHECK(used(pool) == 0 && kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

int main(void) {
    test_reserve_truncate();
    test_reserve_staged();
    test_fork();
    test_groups_and_holes();
    test_fork_prefix();
    return kiln_test_finish("test_block_table");
}
