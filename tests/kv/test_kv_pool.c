/*
 * test_kv_pool - the paged KV block pool (src/kv/kv_pool.h).
 *
 * Oracles: sizes are computed by hand from the layout documented in kv_pool.h
 * (2 * n_layer * round_up(block_size * kv_dim * elem, 64) per block) and from published model
 * geometries (Llama 3 70B: 80 layers, 8 KV heads x 128); storage is checked by writing a
 * distinct pattern through the accessors to every (K/V, layer, block, row, column) and reading
 * it all back; free-list/refcount behaviour follows the API contract (LIFO reuse, 0 = free).
 */
#include <stdint.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "test.h"

/* The out-of-memory case asks for petabytes; under ASan that must return NULL, not abort. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}

static kiln_kv_pool *make(int32_t n_layer, int64_t kv_dim, int32_t bs, int32_t n_blocks,
                          kiln_dtype dt) {
    kiln_kv_pool_params p = {.n_layer = n_layer, .kv_dim = kv_dim, .block_size = bs, .n_blocks = n_blocks, .dtype = dt};
    kiln_kv_pool *pool = NULL;
    kiln_error err;
    kiln_status st = kiln_kv_pool_create(&p, &pool, &err);
    if (st != KILN_OK) fprintf(stderr, "create failed: %s\n", err.message);
    REQUIRE(st == KILN_OK && pool);
    return pool;
}

static void check_stats(const kiln_kv_pool *pool, int32_t used, int32_t peak, int line) {
    kiln_kv_pool_stats s = kiln_kv_pool_get_stats(pool);
    CHECKF(s.used == used && s.peak == peak && s.free == s.n_blocks - used &&
               kiln_kv_pool_n_free(pool) == s.free,
           "line %d: used %d peak %d free %d (want used %d peak %d)", line, s.used, s.peak, s.free,
           used, peak);
}
#define STATS(pool, used, peak) check_stats(pool, used, peak, __LINE__)

static void test_alloc_exhaust_and_reuse(void) {
    const int32_t n = 8;
    kiln_kv_pool *pool = make(2, 4, 0, n, KILN_DTYPE_F32);
    CHECK(kiln_kv_pool_block_size(pool) == KILN_KV_DEFAULT_BLOCK_SIZE);
    CHECK(kiln_kv_pool_n_blocks(pool) == n);
    STATS(pool, 0, 0);
    int32_t ids[8];
    int seen[8] = {0};
    for (int32_t i = 0; i < n; i++) {
        ids[i] = kiln_kv_pool_alloc(pool);
        REQUIRE(ids[i] >= 0 && ids[i] < n);
        CHECKF(!seen[ids[i]], "block %d handed out twice", ids[i]);
        seen[ids[i]] = 1;
        CHECK(kiln_kv_pool_refcount(pool, ids[i]) == 1);
        CHECK(kiln_kv_pool_block_format(pool, ids[i]) == KILN_DTYPE_F32);
        STATS(pool, i + 1, i + 1);
    }
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    STATS(pool, n, n);

    /* free list reuse: LIFO */
    kiln_kv_pool_unref(pool, ids[3]);
    CHECK(kiln_kv_pool_refcount(pool, ids[3]) == 0);
    STATS(pool, n - 1, n);
    kiln_kv_pool_unref(pool, ids[5]);
    STATS(pool, n - 2, n);
    CHECK(kiln_kv_pool_alloc(pool) == ids[5]);
    CHECK(kiln_kv_pool_alloc(pool) == ids[3]);
    CHECK(kiln_kv_pool_alloc(pool) == -1);

    /* free everything, then every id comes back exactly once */
    for (int32_t i = 0; i < n; i++) kiln_kv_pool_unref(pool, ids[i]);
    STATS(pool, 0, n);
    memset(seen, 0, sizeof(seen));
    for (int32_t i = 0; i < n; i++) {
        int32_t b = kiln_kv_pool_alloc(pool);
        REQUIRE(b >= 0 && b < n);
        CHECK(!seen[b]);
        seen[b] = 1;
    }
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

static void test_refcounts_and_peak(void) {
    kiln_kv_pool *pool = make(1, 8, 4, 4, KILN_DTYPE_F16);
    int32_t a = kiln_kv_pool_alloc(pool), b = kiln_kv_pool_alloc(pool);
    STATS(pool, 2, 2);
    kiln_kv_pool_ref(pool, a);
    kiln_kv_pool_ref(pool, a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 3);
    STATS(pool, 2, 2); /* sharing does not use blocks */
    kiln_kv_pool_unref(pool, a);
    kiln_kv_pool_unref(pool, a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 1);
    STATS(pool, 2, 2);
    kiln_kv_pool_unref(pool, a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 0);
    STATS(pool, 1, 2);

    /* peak: reset to current, then grows only past it */
    kiln_kv_pool_reset_peak(pool);
    STATS(pool, 1, 1);
    int32_t c = kiln_kv_pool_alloc(pool), d = kiln_kv_pool_alloc(pool);
    STATS(pool, 3, 3);
    kiln_kv_pool_unref(pool, c);
    kiln_kv_pool_unref(pool, d);
    STATS(pool, 1, 3);
    int32_t e = kiln_kv_pool_alloc(pool);
    STATS(pool, 2, 3);

    /* invariant violations: ignored, counted, the free list intact */
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    fprintf(stderr, "(the next 4 'invariant violated' lines are expected)\n");
    kiln_kv_pool_unref(pool, a); /* refcount already 0 */
    kiln_kv_pool_ref(pool, a);   /* ref of a free block */
    kiln_kv_pool_unref(pool, 4); /* out of range */
    kiln_kv_pool_unref(pool, -1);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 4);
    CHECK(kiln_kv_pool_refcount(pool, a) == 0);
    STATS(pool, 2, 3);
    int32_t f = kiln_kv_pool_alloc(pool), g = kiln_kv_pool_alloc(pool);
    CHECK(f >= 0 && g >= 0 && f != g && f != b && g != b && f != e && g != e);
    CHECK(kiln_kv_pool_alloc(pool) == -1); /* a double free would have left an extra entry */
    STATS(pool, 4, 4);

    CHECK(kiln_kv_pool_refcount(pool, 4) == -1);
    CHECK(kiln_kv_pool_refcount(NULL, 0) == -1);
    CHECK(kiln_kv_pool_block_format(pool, 4) == KILN_DTYPE_COUNT);
    CHECK(kiln_kv_pool_block_format(pool, b) == KILN_DTYPE_F16);
    CHECK(kiln_kv_pool_alloc(NULL) == -1);
    kiln_kv_pool_ref(NULL, 0);
    kiln_kv_pool_unref(NULL, 0);
    kiln_kv_pool_destroy(pool);
    kiln_kv_pool_destroy(NULL);
}

static void test_sizes(void) {
    /* Llama 3 8B f16: 32 layers, kv_dim 1024: 16 * 1024 * 2 = 32 KiB per region, 2 MiB/block */
    CHECK(kiln_kv_block_bytes(32, 1024, 16, KILN_DTYPE_F16) == 2 * 32 * 32768);
    CHECK(kiln_kv_block_bytes(32, 1024, 0, KILN_DTYPE_F16) == 2 * 32 * 32768);
    CHECK(kiln_kv_block_bytes(32, 1024, 16, KILN_DTYPE_F32) == 2 * 32 * 65536);
    /* padding: 5 * 3 * 2 = 30 bytes -> 64 per region */
    CHECK(kiln_kv_block_bytes(2, 3, 5, KILN_DTYPE_F16) == 2 * 2 * 64);
    CHECK(kiln_kv_block_bytes(1, 16, 1, KILN_DTYPE_F32) == 2 * 64);
    CHECK(kiln_kv_block_bytes(1, 17, 1, KILN_DTYPE_F32) == 2 * 128);
    /* invalid / overflow -> 0 */
    CHECK(kiln_kv_block_bytes(0, 1024, 16, KILN_DTYPE_F16) == 0);
    CHECK(kiln_kv_block_bytes(32, 0, 16, KILN_DTYPE_F16) == 0);
    CHECK(kiln_kv_block_bytes(32, 1024, -1, KILN_DTYPE_F16) == 0);
    /* q8_0: 34 bytes per 32 elements (16 x 1088 = 17408, a multiple of 64); q4_0: 18; a row
     * that is not whole blocks of 32 is not a q8_0 row; q4_k is not a KV format */
    CHECK(kiln_kv_block_bytes(32, 1024, 16, KILN_DTYPE_Q8_0) == 2 * 32 * 17408);
    CHECK(kiln_kv_block_bytes(32, 1024, 16, KILN_DTYPE_Q4_0) == 2 * 32 * 9216);
    CHECK(kiln_kv_block_bytes(32, 1000, 16, KILN_DTYPE_Q8_0) == 0);
    CHECK(kiln_kv_block_bytes(32, 1024, 16, KILN_DTYPE_Q4_K) == 0);
    CHECK(kiln_kv_block_bytes_kv(32, 1024, 16, KILN_DTYPE_Q8_0, KILN_DTYPE_F16) ==
          32 * (17408 + 32768));
    CHECK(kiln_kv_block_bytes(32, INT64_MAX, 16, KILN_DTYPE_F32) == 0);
    CHECK(kiln_kv_block_bytes(INT32_MAX, INT64_MAX / 64, INT32_MAX, KILN_DTYPE_F32) == 0);

    CHECK(kiln_kv_blocks_for_tokens(0, 16) == 0);
    CHECK(kiln_kv_blocks_for_tokens(-5, 16) == 0);
    CHECK(kiln_kv_blocks_for_tokens(1, 16) == 1);
    CHECK(kiln_kv_blocks_for_tokens(16, 16) == 1);
    CHECK(kiln_kv_blocks_for_tokens(17, 16) == 2);
    CHECK(kiln_kv_blocks_for_tokens(33, 16) == 3);
    CHECK(kiln_kv_blocks_for_tokens(INT32_MAX, 16) == (INT32_MAX / 16) + 1);
    CHECK(kiln_kv_blocks_for_tokens(INT32_MAX, 1) == INT32_MAX);
    CHECK(kiln_kv_blocks_for_tokens(10, 0) == 0);

    /* --kv-memory: Llama 3 70B f16, 80 layers x kv_dim 1024: 16 * 1024 * 2 * 2 * 80 =
     * 5,242,880 bytes per block. */
    const int64_t blk70 = 5242880;
    CHECK(kiln_kv_block_bytes(80, 1024, 16, KILN_DTYPE_F16) == blk70);
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, 64LL << 30) ==
          (int32_t)((64LL << 30) / blk70)); /* 64 GiB -> 13107 */
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, 64LL << 30) == 13107);
    /* 8 PiB: 2^53 / 5242880 = 1717986918.4 -> 1717986918 (int32 arithmetic would overflow) */
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, 1LL << 53) == 1717986918);
    /* clamp at INT32_MAX */
    CHECK(kiln_kv_pool_blocks_for_budget(1, 1, 16, KILN_DTYPE_F32, INT64_MAX) == INT32_MAX);
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, blk70 - 1) == 0);
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, blk70) == 1);
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, 0) == 0);
    CHECK(kiln_kv_pool_blocks_for_budget(80, 1024, 16, KILN_DTYPE_F16, -1) == 0);
    CHECK(kiln_kv_pool_blocks_for_budget(80, INT64_MAX, 16, KILN_DTYPE_F16, INT64_MAX) == 0);
    CHECK(kiln_kv_pool_blocks_for_budget(0, 1024, 16, KILN_DTYPE_F16, INT64_MAX) == 0);
}

static void expect_invalid(kiln_kv_pool_params p, const char *field) {
    kiln_kv_pool *pool = (kiln_kv_pool *)&p; /* sentinel: must stay untouched */
    kiln_error err = {KILN_OK, ""};
    kiln_status st = kiln_kv_pool_create(&p, &pool, &err);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT && err.status == st, "%s: status %d", field, st);
    CHECKF(strstr(err.message, field) != NULL, "message '%s' does not name %s", err.message, field);
    CHECK(pool == (kiln_kv_pool *)&p);
}

static void test_invalid_params(void) {
    kiln_kv_pool_params ok = {.n_layer = 2, .kv_dim = 64, .block_size = 16, .n_blocks = 4, .dtype = KILN_DTYPE_F16};
    kiln_kv_pool_params p;
    p = ok, p.n_layer = 0, expect_invalid(p, "n_layer");
    p = ok, p.n_layer = -3, expect_invalid(p, "n_layer");
    p = ok, p.kv_dim = 0, expect_invalid(p, "kv_dim");
    p = ok, p.kv_dim = -1, expect_invalid(p, "kv_dim");
    p = ok, p.block_size = -16, expect_invalid(p, "block_size");
    p = ok, p.n_blocks = 0, expect_invalid(p, "n_blocks");
    p = ok, p.n_blocks = INT32_MIN, expect_invalid(p, "n_blocks");
    /* q8_0 / q4_0 rows are whole blocks of 32: kv_dim 48 cannot be one; q4_K is no KV format */
    p = ok, p.dtype = KILN_DTYPE_Q8_0, p.kv_dim = 48, expect_invalid(p, "dtype");
    p = ok, p.dtype = KILN_DTYPE_Q4_0, p.kv_dim = 48, expect_invalid(p, "dtype");
    p = ok, p.dtype = KILN_DTYPE_Q4_K, expect_invalid(p, "dtype");
    p = ok, p.dtype_v_set = true, p.dtype_v = KILN_DTYPE_Q6_K, expect_invalid(p, "dtype_v");
    p = ok, p.dtype = (kiln_dtype)-7, expect_invalid(p, "dtype");

    kiln_error err;
    kiln_kv_pool *pool = NULL;
    CHECK(kiln_kv_pool_create(NULL, &pool, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_kv_pool_create(&ok, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_kv_pool_create(&ok, NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);

    /* size overflow -> OUT_OF_MEMORY naming the request */
    kiln_kv_pool_params big = {.n_layer = INT32_MAX, .kv_dim = INT64_MAX / 8, .block_size = 16, .n_blocks = INT32_MAX, .dtype = KILN_DTYPE_F32};
    CHECK(kiln_kv_pool_create(&big, &pool, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECKF(strstr(err.message, "overflow") != NULL, "'%s'", err.message);
    CHECK(pool == NULL);
    /* representable but unallocatable: 1024 layers x 2^20 blocks x 4 MiB = 4 PiB per K and V */
    kiln_kv_pool_params huge = {.n_layer = 1024, .kv_dim = 65536, .block_size = 16, .n_blocks = 1 << 20, .dtype = KILN_DTYPE_F32};
    CHECK(kiln_kv_pool_create(&huge, &pool, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECKF(strstr(err.message, "9007199254740992 bytes") != NULL, "'%s'", err.message);
    CHECK(pool == NULL);
}

/* Write a distinct pattern to every element of every region through the accessors, then read
 * it all back: any overlap between regions, or a region outside its allocation (ASan), shows. */
static void test_storage(kiln_dtype dt) {
    const int32_t L = 3, NB = 7, BS = 5;
    const int64_t D = 9; /* odd: regions need padding */
    const size_t es = dt == KILN_DTYPE_F32 ? 4 : 2;
    kiln_kv_pool *pool = make(L, D, BS, NB, dt);
    CHECK(kiln_kv_pool_dtype(pool) == dt && kiln_kv_pool_n_layer(pool) == L &&
          kiln_kv_pool_kv_dim(pool) == D && kiln_kv_pool_block_size(pool) == BS);
    const size_t region = (size_t)BS * D * es;
    const size_t total = (size_t)NB * (size_t)kiln_kv_block_bytes(L, D, BS, dt) / 2;
    unsigned char *kbase = kiln_kv_pool_k(pool, 0, 0), *vbase = kiln_kv_pool_v(pool, 0, 0);
    REQUIRE(kbase && vbase);
    CHECK(kbase + total <= vbase || vbase + total <= kbase); /* K and V apart */

    for (int kv = 0; kv < 2; kv++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t b = 0; b < NB; b++) {
                unsigned char *p = kv ? kiln_kv_pool_v(pool, l, b) : kiln_kv_pool_k(pool, l, b);
                unsigned char *base = kv ? vbase : kbase;
                REQUIRE(p);
                CHECKF((uintptr_t)p % KILN_KV_ALIGNMENT == 0, "kv %d l %d b %d unaligned", kv, l,
                       b);
                CHECKF(p >= base && p + region <= base + total, "kv %d l %d b %d outside", kv, l,
                       b);
                for (int64_t i = 0; i < BS * D; i++) {
                    uint32_t tag = (uint32_t)(((kv * L + l) * NB + b) * BS * D + i);
                    if (dt == KILN_DTYPE_F32) {
                        float f = (float)tag + 0.5f;
                        memcpy(p + i * 4, &f, 4);
                    } else {
                        uint16_t h = (uint16_t)(tag * 2654435761u >> 16);
                        memcpy(p + i * 2, &h, 2);
                    }
                }
            }
    int64_t bad = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t b = 0; b < NB; b++) {
                unsigned char *p = kv ? kiln_kv_pool_v(pool, l, b) : kiln_kv_pool_k(pool, l, b);
                for (int64_t i = 0; i < BS * D; i++) {
                    uint32_t tag = (uint32_t)(((kv * L + l) * NB + b) * BS * D + i);
                    if (dt == KILN_DTYPE_F32) {
                        float f;
                        memcpy(&f, p + i * 4, 4);
                        bad += f != (float)tag + 0.5f;
                    } else {
                        uint16_t h;
                        memcpy(&h, p + i * 2, 2);
                        bad += h != (uint16_t)(tag * 2654435761u >> 16);
                    }
                }
            }
    CHECKF(bad == 0, "%s: %lld elements overwritten", kiln_dtype_name(dt), (long long)bad);

    CHECK(kiln_kv_pool_k(pool, L, 0) == NULL);
    CHECK(kiln_kv_pool_k(pool, -1, 0) == NULL);
    CHECK(kiln_kv_pool_v(pool, 0, NB) == NULL);
    CHECK(kiln_kv_pool_v(pool, 0, -1) == NULL);
    CHECK(kiln_kv_pool_k(NULL, 0, 0) == NULL);
    kiln_kv_pool_destroy(pool);
}

int main(void) {
    test_alloc_exhaust_and_reuse();
    test_refcounts_and_peak();
    test_sizes();
    test_invalid_params();
    test_storage(KILN_DTYPE_F32);
    test_storage(KILN_DTYPE_F16);
    test_storage(KILN_DTYPE_BF16);
    return kiln_test_finish("test_kv_pool");
}
