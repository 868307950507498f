/*
 * test_kv_lifecycle - the KV block lifecycle free / used / cached-evictable (src/kv/kv_pool.h,
 * DESIGN.md "Block lifecycle").
 *
 * Oracles: the contract in kv_pool.h. alloc takes a free block LIFO, else evicts the least
 * recently idle cached block (on_evict first, contents intact), else -1; a cached block whose
 * last owner lets go joins the LRU (on_idle) instead of the free list; acquire revives it;
 * set_cached(false) frees an idle one; invariant violations are ignored and counted; every
 * stats snapshot has used + cached + free == n_blocks, n_free == free and n_available ==
 * free + cached. A randomized run checks every alloc's id, every hook call and every counter
 * against a brute-force model of the free stack and the LRU list built from those rules.
 */
#include <stdint.h>
#include <string.h>

#include "kv/kv_pool.h"
#include "test.h"

#define N_LAYER 2
#define KV_DIM  4
#define BS      4

static kiln_kv_pool *make(int32_t n_blocks) {
    kiln_kv_pool_params p = {.n_layer = N_LAYER, .kv_dim = KV_DIM, .block_size = BS, .n_blocks = n_blocks, .dtype = KILN_DTYPE_F32};
    kiln_kv_pool *pool = NULL;
    kiln_error err;
    kiln_status st = kiln_kv_pool_create(&p, &pool, &err);
    if (st != KILN_OK) fprintf(stderr, "create failed: %s\n", err.message);
    REQUIRE(st == KILN_OK && pool);
    return pool;
}

/* Every counter the pool exposes, against the expected used / cached counts. */
static void check_counts(const kiln_kv_pool *pool, int32_t used, int32_t cached, int line) {
    kiln_kv_pool_stats s = kiln_kv_pool_get_stats(pool);
    int32_t n = kiln_kv_pool_n_blocks(pool);
    int32_t free_ = n - used - cached;
    CHECKF(s.n_blocks == n && s.used == used && s.cached == cached && s.free == free_ &&
               s.used + s.cached + s.free == s.n_blocks && s.peak >= s.used &&
               kiln_kv_pool_n_free(pool) == free_ &&
               kiln_kv_pool_n_available(pool) == free_ + cached,
           "line %d: used %d cached %d free %d n_free %d n_available %d peak %d "
           "(want used %d cached %d free %d)",
           line, s.used, s.cached, s.free, kiln_kv_pool_n_free(pool),
           kiln_kv_pool_n_available(pool), s.peak, used, cached, free_);
}
#define COUNTS(pool, used, cached) check_counts(pool, used, cached, __LINE__)

/* A hook recorder: every call in order, and whether the evicted block still held its pattern
 * (and was not yet handed out) when on_evict ran. */
typedef struct {
    kiln_kv_pool *pool;
    int32_t evicted[64], idle[64];
    int n_evicted, n_idle;
    int bad_contents, bad_refcount;
} hook_log;

static float pattern(int32_t block, int kv, int32_t layer, int32_t i) {
    return (float)(block * 100000 + kv * 10000 + layer * 1000 + i) + 0.25f;
}

static void write_pattern(kiln_kv_pool *pool, int32_t block) {
    for (int32_t l = 0; l < N_LAYER; l++) {
        float *k = kiln_kv_pool_k(pool, l, block), *v = kiln_kv_pool_v(pool, l, block);
        REQUIRE(k && v);
        for (int32_t i = 0; i < BS * KV_DIM; i++) {
            k[i] = pattern(block, 0, l, i);
            v[i] = pattern(block, 1, l, i);
        }
    }
}

static int pattern_intact(kiln_kv_pool *pool, int32_t block) {
    for (int32_t l = 0; l < N_LAYER; l++) {
        const float *k = kiln_kv_pool_k(pool, l, block), *v = kiln_kv_pool_v(pool, l, block);
        for (int32_t i = 0; i < BS * KV_DIM; i++)
            if (k[i] != pattern(block, 0, l, i) || v[i] != pattern(block, 1, l, i)) return 0;
    }
    return 1;
}

static void log_evict(void *user, int32_t block) {
    hook_log *h = user;
    if (h->n_evicted < 64) h->evicted[h->n_evicted] = block;
    h->n_evicted++;
    if (!pattern_intact(h->pool, block)) h->bad_contents++;
    if (kiln_kv_pool_refcount(h->pool, block) != 0) h->bad_refcount++; /* not reused yet */
}

static void log_idle(void *user, int32_t block) {
    hook_log *h = user;
    if (h->n_idle < 64) h->idle[h->n_idle] = block;
    h->n_idle++;
    if (kiln_kv_pool_refcount(h->pool, block) != 0) h->bad_refcount++;
}

static void install(kiln_kv_pool *pool, hook_log *h) {
    memset(h, 0, sizeof *h);
    h->pool = pool;
    kiln_kv_pool_hooks hooks = {.user = h, .on_evict = log_evict, .on_idle = log_idle};
    kiln_kv_pool_set_hooks(pool, &hooks);
}

static void test_free_list_lifo(void) {
    kiln_kv_pool *pool = make(6);
    hook_log h;
    install(pool, &h);
    int32_t ids[6];
    for (int i = 0; i < 6; i++) {
        ids[i] = kiln_kv_pool_alloc(pool);
        REQUIRE(ids[i] >= 0 && ids[i] < 6);
        for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
        CHECK(!kiln_kv_pool_is_cached(pool, ids[i]));
        COUNTS(pool, i + 1, 0);
    }
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    /* freed in the order 1, 4, 2: handed out again as 2, 4, 1 */
    kiln_kv_pool_unref(pool, ids[1]);
    kiln_kv_pool_unref(pool, ids[4]);
    kiln_kv_pool_unref(pool, ids[2]);
    COUNTS(pool, 3, 0);
    CHECK(kiln_kv_pool_alloc(pool) == ids[2]);
    CHECK(kiln_kv_pool_alloc(pool) == ids[4]);
    CHECK(kiln_kv_pool_alloc(pool) == ids[1]);
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    COUNTS(pool, 6, 0);
    /* uncached blocks never reach the hooks */
    for (int i = 0; i < 6; i++) kiln_kv_pool_unref(pool, ids[i]);
    COUNTS(pool, 0, 0);
    CHECK(h.n_idle == 0 && h.n_evicted == 0);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

static void test_cached_idle_and_revive(void) {
    kiln_kv_pool *pool = make(4);
    hook_log h;
    install(pool, &h);
    int32_t a = kiln_kv_pool_alloc(pool), b = kiln_kv_pool_alloc(pool);
    REQUIRE(a >= 0 && b >= 0 && a != b);
    COUNTS(pool, 2, 0);

    kiln_kv_pool_set_cached(pool, a, true);
    CHECK(kiln_kv_pool_is_cached(pool, a) && !kiln_kv_pool_is_cached(pool, b));
    kiln_kv_pool_set_cached(pool, a, true); /* again: no-op */
    COUNTS(pool, 2, 0);                     /* marking alone changes no count */

    /* a second owner: the first unref does not make it idle */
    kiln_kv_pool_ref(pool, a);
    kiln_kv_pool_unref(pool, a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 1 && h.n_idle == 0);
    COUNTS(pool, 2, 0);

    /* the last owner lets go: cached, not free, on_idle(a) once */
    kiln_kv_pool_unref(pool, a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 0);
    CHECK(kiln_kv_pool_is_cached(pool, a));
    COUNTS(pool, 1, 1);
    CHECK(kiln_kv_pool_n_free(pool) == 2 && kiln_kv_pool_n_available(pool) == 3);
    CHECK(h.n_idle == 1 && h.idle[0] == a && h.n_evicted == 0);
    kiln_kv_pool_set_cached(pool, a, true); /* already cached and idle: no-op */
    COUNTS(pool, 1, 1);

    /* free blocks are taken before the cached one: a is not evicted while others are free */
    int32_t c = kiln_kv_pool_alloc(pool), d = kiln_kv_pool_alloc(pool);
    CHECK(c >= 0 && d >= 0 && c != a && d != a && c != d && c != b && d != b);
    COUNTS(pool, 3, 1);
    CHECK(h.n_evicted == 0 && kiln_kv_pool_get_stats(pool).evictions == 0);

    /* acquire revives it: refcount 1, out of the LRU, still marked cached */
    CHECK(kiln_kv_pool_acquire(pool, a));
    CHECK(kiln_kv_pool_refcount(pool, a) == 1 && kiln_kv_pool_is_cached(pool, a));
    COUNTS(pool, 4, 0);
    CHECK(kiln_kv_pool_get_stats(pool).peak == 4);
    /* out of the LRU: nothing is left to evict */
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    CHECK(h.n_evicted == 0 && kiln_kv_pool_refcount(pool, a) == 1);
    COUNTS(pool, 4, 0);

    /* acquire of a used block adds an owner */
    CHECK(kiln_kv_pool_acquire(pool, a));
    CHECK(kiln_kv_pool_refcount(pool, a) == 2);
    kiln_kv_pool_unref(pool, a);
    CHECK(h.n_idle == 1);
    kiln_kv_pool_unref(pool, a); /* idle again */
    CHECK(h.n_idle == 2 && h.idle[1] == a);
    COUNTS(pool, 3, 1);

    /* acquire of a free block, an out-of-range block, a NULL pool: false, nothing changes */
    kiln_kv_pool_unref(pool, d);
    COUNTS(pool, 2, 1);
    CHECK(!kiln_kv_pool_acquire(pool, d));
    CHECK(kiln_kv_pool_refcount(pool, d) == 0);
    CHECK(!kiln_kv_pool_acquire(pool, -1));
    CHECK(!kiln_kv_pool_acquire(pool, 4));
    CHECK(!kiln_kv_pool_acquire(NULL, 0));
    COUNTS(pool, 2, 1);
    CHECK(kiln_kv_pool_alloc(pool) == d); /* d went back to the free list, not elsewhere */
    COUNTS(pool, 3, 1);

    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    CHECK(h.bad_refcount == 0);
    kiln_kv_pool_unref(pool, b);
    kiln_kv_pool_unref(pool, c);
    kiln_kv_pool_unref(pool, d);
    COUNTS(pool, 0, 1);
    kiln_kv_pool_destroy(pool);
}

/* Three blocks become idle in the order a, b, c; b is revived and let go again, so the LRU
 * is a, c, b; with no free block, alloc evicts a, then c, then b, then fails. */
static void test_lru_eviction_order(void) {
    kiln_kv_pool *pool = make(4);
    hook_log h;
    install(pool, &h);
    int32_t a = kiln_kv_pool_alloc(pool), b = kiln_kv_pool_alloc(pool),
            c = kiln_kv_pool_alloc(pool), d = kiln_kv_pool_alloc(pool);
    REQUIRE(a >= 0 && b >= 0 && c >= 0 && d >= 0);
    COUNTS(pool, 4, 0);
    int32_t abc[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        write_pattern(pool, abc[i]);
        kiln_kv_pool_set_cached(pool, abc[i], true);
    }
    write_pattern(pool, d);
    kiln_kv_pool_unref(pool, a);
    COUNTS(pool, 3, 1);
    kiln_kv_pool_unref(pool, b);
    COUNTS(pool, 2, 2);
    kiln_kv_pool_unref(pool, c);
    COUNTS(pool, 1, 3);
    CHECK(h.n_idle == 3 && h.idle[0] == a && h.idle[1] == b && h.idle[2] == c);
    CHECK(kiln_kv_pool_n_free(pool) == 0 && kiln_kv_pool_n_available(pool) == 3);

    CHECK(kiln_kv_pool_acquire(pool, b));
    COUNTS(pool, 2, 2);
    kiln_kv_pool_unref(pool, b);
    COUNTS(pool, 1, 3);
    CHECK(h.n_idle == 4 && h.idle[3] == b);

    int32_t x = kiln_kv_pool_alloc(pool);
    CHECKF(x == a, "first eviction took %d, want a=%d", x, a);
    CHECK(h.n_evicted == 1 && h.evicted[0] == a);
    CHECK(kiln_kv_pool_refcount(pool, a) == 1 && !kiln_kv_pool_is_cached(pool, a));
    CHECK(kiln_kv_pool_block_format(pool, a) == KILN_DTYPE_F32);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 1);
    COUNTS(pool, 2, 2);

    int32_t y = kiln_kv_pool_alloc(pool);
    CHECKF(y == c, "second eviction took %d, want c=%d", y, c);
    CHECK(h.n_evicted == 2 && h.evicted[1] == c);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 2);
    COUNTS(pool, 3, 1);

    int32_t z = kiln_kv_pool_alloc(pool);
    CHECKF(z == b, "third eviction took %d, want b=%d", z, b);
    CHECK(h.n_evicted == 3 && h.evicted[2] == b);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 3);
    COUNTS(pool, 4, 0);

    CHECK(kiln_kv_pool_alloc(pool) == -1);
    CHECK(h.n_evicted == 3 && kiln_kv_pool_get_stats(pool).evictions == 3);
    COUNTS(pool, 4, 0);
    CHECK(h.bad_contents == 0 && h.bad_refcount == 0);
    CHECK(pattern_intact(pool, d));

    /* an evicted block is an ordinary block now: its last unref frees it, no hook */
    kiln_kv_pool_unref(pool, a);
    COUNTS(pool, 3, 0);
    CHECK(h.n_idle == 4);
    CHECK(kiln_kv_pool_alloc(pool) == a);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 3);

    /* without hooks, eviction still works */
    kiln_kv_pool_set_hooks(pool, NULL);
    kiln_kv_pool_set_cached(pool, d, true);
    kiln_kv_pool_unref(pool, d);
    COUNTS(pool, 3, 1);
    CHECK(kiln_kv_pool_alloc(pool) == d);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 4);
    CHECK(h.n_idle == 4 && h.n_evicted == 3);
    COUNTS(pool, 4, 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

static void test_uncache(void) {
    kiln_kv_pool *pool = make(3);
    hook_log h;
    install(pool, &h);
    int32_t a = kiln_kv_pool_alloc(pool), b = kiln_kv_pool_alloc(pool),
            c = kiln_kv_pool_alloc(pool);
    kiln_kv_pool_set_cached(pool, a, true);
    kiln_kv_pool_set_cached(pool, b, true);
    kiln_kv_pool_unref(pool, a);
    kiln_kv_pool_unref(pool, b);
    COUNTS(pool, 1, 2);

    /* set_cached(false) on an idle cached block: free at once, and first to be reused */
    kiln_kv_pool_set_cached(pool, b, false);
    CHECK(!kiln_kv_pool_is_cached(pool, b) && kiln_kv_pool_refcount(pool, b) == 0);
    COUNTS(pool, 1, 1);
    CHECK(kiln_kv_pool_alloc(pool) == b);
    CHECK(h.n_evicted == 0 && kiln_kv_pool_get_stats(pool).evictions == 0);
    COUNTS(pool, 2, 1);
    /* b left the LRU: the next alloc evicts a, and nothing after that */
    CHECK(kiln_kv_pool_alloc(pool) == a);
    CHECK(h.n_evicted == 1 && h.evicted[0] == a);
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    COUNTS(pool, 3, 0);

    /* set_cached(false) on a used block: its last unref frees it, no on_idle */
    kiln_kv_pool_set_cached(pool, c, true);
    kiln_kv_pool_set_cached(pool, c, false);
    CHECK(!kiln_kv_pool_is_cached(pool, c));
    int idle_before = h.n_idle;
    kiln_kv_pool_unref(pool, c);
    CHECK(h.n_idle == idle_before);
    COUNTS(pool, 2, 0);
    CHECK(kiln_kv_pool_alloc(pool) == c);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

static void test_violations(void) {
    kiln_kv_pool *pool = make(4);
    hook_log h;
    install(pool, &h);
    int32_t a = kiln_kv_pool_alloc(pool), b = kiln_kv_pool_alloc(pool),
            c = kiln_kv_pool_alloc(pool);
    kiln_kv_pool_unref(pool, c); /* c is free */
    kiln_kv_pool_set_cached(pool, b, true);
    kiln_kv_pool_unref(pool, b); /* b is cached and idle */
    COUNTS(pool, 1, 1);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);

    fprintf(stderr, "(the next 6 'invariant violated' lines are expected)\n");
    kiln_kv_pool_set_cached(pool, c, true); /* a free block */
    CHECK(kiln_kv_pool_invariant_violations(pool) == 1);
    CHECK(!kiln_kv_pool_is_cached(pool, c));
    COUNTS(pool, 1, 1);
    kiln_kv_pool_set_cached(pool, c, false); /* a free block, either way */
    CHECK(kiln_kv_pool_invariant_violations(pool) == 2);
    kiln_kv_pool_set_cached(pool, 4, true); /* out of range */
    kiln_kv_pool_set_cached(pool, -1, false);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 4);
    CHECK(!kiln_kv_pool_is_cached(pool, 4) && !kiln_kv_pool_is_cached(pool, -1));
    COUNTS(pool, 1, 1);
    kiln_kv_pool_unref(pool, c); /* refcount already 0 */
    CHECK(kiln_kv_pool_invariant_violations(pool) == 5);
    COUNTS(pool, 1, 1);
    kiln_kv_pool_unref(pool, b); /* an idle cached block: refcount already 0 */
    CHECK(kiln_kv_pool_invariant_violations(pool) == 6);
    CHECK(kiln_kv_pool_refcount(pool, b) == 0 && kiln_kv_pool_is_cached(pool, b));
    COUNTS(pool, 1, 1);
    CHECK(h.n_idle == 1 && h.n_evicted == 0);

    /* nothing was corrupted: two free blocks (c, then the never-used one), then b evicted */
    int32_t x = kiln_kv_pool_alloc(pool);
    CHECK(x == c);
    int32_t y = kiln_kv_pool_alloc(pool);
    CHECK(y >= 0 && y != a && y != b && y != c);
    CHECK(kiln_kv_pool_alloc(pool) == b);
    CHECK(h.n_evicted == 1 && h.evicted[0] == b);
    CHECK(kiln_kv_pool_alloc(pool) == -1);
    COUNTS(pool, 4, 0);
    kiln_kv_pool_set_cached(NULL, 0, true);
    CHECK(!kiln_kv_pool_is_cached(NULL, 0));
    CHECK(kiln_kv_pool_n_available(NULL) == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 6);
    kiln_kv_pool_destroy(pool);
}

static void test_reserve_evicts(void) {
    kiln_kv_pool *pool = make(4);
    hook_log h;
    install(pool, &h);
    kiln_error err;
    kiln_block_table a = {0}, b = {0}, c = {0};

    CHECK(kiln_block_table_reserve(&a, pool, 4 * BS, &err) == KILN_OK);
    REQUIRE(a.n_blocks == 4);
    for (int i = 0; i < 4; i++) kiln_kv_pool_set_cached(pool, a.blocks[i], true);
    int32_t ab[4];
    memcpy(ab, a.blocks, sizeof ab);
    kiln_block_table_release(&a, pool); /* last block first */
    COUNTS(pool, 0, 4);
    CHECK(h.n_idle == 4);
    for (int i = 0; i < 4; i++) CHECK(h.idle[i] == ab[3 - i]);

    /* no free block, 4 evictable: reserving 2 blocks evicts the two least recently idle */
    CHECK(kiln_block_table_reserve(&b, pool, 2 * BS, &err) == KILN_OK);
    CHECK(b.n_blocks == 2 && b.blocks[0] == ab[3] && b.blocks[1] == ab[2]);
    CHECK(h.n_evicted == 2 && h.evicted[0] == ab[3] && h.evicted[1] == ab[2]);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 2);
    COUNTS(pool, 2, 2);

    /* 3 more blocks with only 2 evictable: fails, staged, nothing evicted */
    kiln_kv_pool_stats before = kiln_kv_pool_get_stats(pool);
    CHECK(kiln_block_table_reserve(&c, pool, 3 * BS, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(c.n_blocks == 0);
    kiln_kv_pool_stats after = kiln_kv_pool_get_stats(pool);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    CHECK(h.n_evicted == 2);
    CHECK(kiln_kv_pool_is_cached(pool, ab[1]) && kiln_kv_pool_is_cached(pool, ab[0]));
    /* growing b from 2 to 5 blocks: also 3 more, also fails and leaves b as it was */
    CHECK(kiln_block_table_reserve(&b, pool, 5 * BS, &err) == KILN_ERR_OUT_OF_MEMORY);
    CHECK(b.n_blocks == 2 && b.blocks[0] == ab[3] && b.blocks[1] == ab[2]);
    after = kiln_kv_pool_get_stats(pool);
    CHECK(memcmp(&before, &after, sizeof before) == 0);

    /* one free block plus one evictable: 2 fit (free first, then eviction), 3 do not */
    kiln_block_table_truncate(&b, pool, BS); /* ab[2] is not cached any more: freed */
    COUNTS(pool, 1, 2);
    kiln_kv_pool_set_cached(pool, ab[1], false); /* ab[1] leaves the LRU: free */
    COUNTS(pool, 1, 1);
    before = kiln_kv_pool_get_stats(pool);
    CHECK(kiln_block_table_reserve(&c, pool, 3 * BS + 1, &err) == KILN_ERR_OUT_OF_MEMORY);
    after = kiln_kv_pool_get_stats(pool);
    CHECK(memcmp(&before, &after, sizeof before) == 0 && c.n_blocks == 0);
    CHECK(kiln_block_table_reserve(&c, pool, 3 * BS, &err) == KILN_OK);
    CHECK(c.n_blocks == 3);
    /* LIFO free list: ab[1] was freed last, so it comes first; then ab[2]; then ab[0] evicted */
    CHECK(c.blocks[0] == ab[1] && c.blocks[1] == ab[2] && c.blocks[2] == ab[0]);
    CHECK(h.n_evicted == 3 && h.evicted[2] == ab[0]);
    CHECK(kiln_kv_pool_get_stats(pool).evictions == 3);
    COUNTS(pool, 4, 0);

    kiln_block_table_release(&b, pool);
    kiln_block_table_release(&c, pool);
    COUNTS(pool, 0, 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    kiln_kv_pool_destroy(pool);
}

/* ---- randomized: the pool against a brute-force model of its rules ---- */

#define MN 12 /* blocks */

typedef struct {
    int32_t ref[MN];
    int cached[MN];
    int32_t free_stack[MN], n_free; /* top at the end */
    int32_t lru[MN], n_lru;         /* least recently idle first */
    int64_t evictions;
} model;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void lru_del(model *m, int32_t b) {
    for (int i = 0; i < m->n_lru; i++)
        if (m->lru[i] == b) {
            memmove(&m->lru[i], &m->lru[i + 1], (size_t)(m->n_lru - i - 1) * sizeof(int32_t));
            m->n_lru--;
            return;
        }
    REQUIRE(0 && "block not in the model's LRU");
}

static void test_random_against_model(void) {
    kiln_kv_pool *pool = make(MN);
    hook_log h;
    install(pool, &h);
    model m;
    memset(&m, 0, sizeof m);
    /* learn the initial order by taking every block, then free them in a known order */
    int32_t ids[MN];
    for (int i = 0; i < MN; i++) ids[i] = kiln_kv_pool_alloc(pool);
    for (int i = 0; i < MN; i++) {
        kiln_kv_pool_unref(pool, ids[i]);
        m.free_stack[m.n_free++] = ids[i];
    }
    int64_t steps = 0;
    for (int step = 0; step < 20000 && !kiln_test_failures; step++) {
        int32_t b = (int32_t)rnd(MN);
        int n_idle0 = h.n_idle, n_ev0 = h.n_evicted;
        int32_t exp_idle = -1, exp_evict = -1;
        /* weights 3 alloc, 3 unref, 1 acquire, 2 mark, 1 unmark: the pool runs dry often */
        static const int op_of[10] = {0, 0, 0, 2, 2, 2, 3, 4, 4, 5};
        switch (op_of[rnd(10)]) {
        case 0: { /* alloc */
            int32_t want = -1;
            if (m.n_free > 0) {
                want = m.free_stack[--m.n_free];
            } else if (m.n_lru > 0) {
                want = m.lru[0];
                lru_del(&m, want);
                m.cached[want] = 0;
                m.evictions++;
                exp_evict = want;
            }
            if (want >= 0) {
                m.ref[want] = 1;
                m.cached[want] = 0;
            }
            int32_t got = kiln_kv_pool_alloc(pool);
            CHECKF(got == want, "step %d: alloc gave %d, want %d", step, got, want);
            if (want >= 0) write_pattern(pool, want);
            break;
        }
        case 2: /* unref an owned block */
            if (m.ref[b] == 0) break;
            if (--m.ref[b] == 0) {
                if (m.cached[b]) {
                    m.lru[m.n_lru++] = b;
                    exp_idle = b;
                } else {
                    m.free_stack[m.n_free++] = b;
                }
            }
            kiln_kv_pool_unref(pool, b);
            break;
        case 3: { /* acquire any block */
            bool want = m.ref[b] > 0 || m.cached[b];
            if (m.ref[b] == 0 && m.cached[b]) lru_del(&m, b);
            if (want) m.ref[b]++;
            CHECKF(kiln_kv_pool_acquire(pool, b) == want, "step %d: acquire(%d)", step, b);
            break;
        }
        case 4:                                       /* mark cached */
            if (m.ref[b] == 0 && !m.cached[b]) break; /* free: a violation, tested elsewhere */
            m.cached[b] = 1;
            kiln_kv_pool_set_cached(pool, b, true);
            break;
        case 5: /* unmark */
            if (m.ref[b] == 0 && !m.cached[b]) break;
            if (m.ref[b] == 0 && m.cached[b]) {
                lru_del(&m, b);
                m.free_stack[m.n_free++] = b;
            }
            m.cached[b] = 0;
            kiln_kv_pool_set_cached(pool, b, false);
            break;
        }
        steps++;
        /* hooks: exactly the expected call, with the expected block */
        CHECKF(h.n_idle == n_idle0 + (exp_idle >= 0) &&
                   (exp_idle < 0 || h.idle[(h.n_idle - 1) % 64] == exp_idle),
               "step %d: on_idle calls %d -> %d (want block %d)", step, n_idle0, h.n_idle,
               exp_idle);
        CHECKF(h.n_evicted == n_ev0 + (exp_evict >= 0) &&
                   (exp_evict < 0 || h.evicted[(h.n_evicted - 1) % 64] == exp_evict),
               "step %d: on_evict calls %d -> %d (want block %d)", step, n_ev0, h.n_evicted,
               exp_evict);
        if (h.n_idle >= 64) h.n_idle = 0;
        if (h.n_evicted >= 64) h.n_evicted = 0;
        /* counters and per-block state */
        int32_t used = 0;
        for (int i = 0; i < MN; i++) {
            used += m.ref[i] > 0;
            CHECKF(kiln_kv_pool_refcount(pool, i) == m.ref[i], "step %d: refcount(%d) %d want %d",
                   step, i, kiln_kv_pool_refcount(pool, i), m.ref[i]);
            CHECKF(kiln_kv_pool_is_cached(pool, i) == (m.cached[i] != 0), "step %d: is_cached(%d)",
                   step, i);
        }
        check_counts(pool, used, m.n_lru, __LINE__);
        CHECK(m.n_free == MN - used - m.n_lru);
        CHECK(kiln_kv_pool_get_stats(pool).evictions == m.evictions);
    }
    CHECK(steps == 20000);
    CHECK(h.bad_contents == 0 && h.bad_refcount == 0);
    CHECK(kiln_kv_pool_invariant_violations(pool) == 0);
    fprintf(stderr, "random run: %lld evictions\n", (long long)m.evictions);
    CHECKF(m.evictions > 500, "only %lld evictions: the run did not exercise the LRU",
           (long long)m.evictions);
    kiln_kv_pool_destroy(pool);
}

int main(void) {
    test_free_list_lifo();
    test_cached_idle_and_revive();
    test_lru_eviction_order();
    test_uncache();
    test_violations();
    test_reserve_evicts();
    test_random_against_model();
    return kiln_test_finish("test_kv_lifecycle");
}
