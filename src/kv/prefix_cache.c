/* prefix_cache.c - the prefix cache in RAM (see prefix_cache.h). The index is an open-addressing
 * table with linear probing and backward-shift deletion, sized at twice the pool's blocks, so
 * it never grows and never holds more than half its slots. */
#include "kv/prefix_cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "util/error.h"

struct kiln_prefix_cache {
    kiln_kv_pool *pool;
    uint64_t ns;
    size_t state_bytes;
    int32_t n_blocks, block_size;
    /* the index: slot -> block (-1 empty); the key is the block's hash */
    int32_t *slot;
    uint32_t mask;
    /* per block */
    uint64_t *hash, *parent;
    uint8_t *indexed;
    int32_t *tokens; /* [n_blocks][block_size] */
    void **state;    /* checkpoint or NULL */
    kiln_prefix_idle_fn idle_fn;
    void *idle_user;
    kiln_prefix_state_free_fn state_free_fn;
    void *state_free_user;
    _Atomic int32_t n_indexed, n_states;
    _Atomic int64_t inserts, evictions;
};

uint64_t kiln_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t ns) {
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, ns);
    unsigned char p[8];
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(parent >> (8 * i));
    XXH3_64bits_update(&st, p, sizeof p);
    unsigned char buf[256];
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) buf[k++] = (unsigned char)(t >> (8 * b));
        if (k == sizeof buf) {
            XXH3_64bits_update(&st, buf, k);
            k = 0;
        }
    }
    if (k) XXH3_64bits_update(&st, buf, k);
    return XXH3_64bits_digest(&st);
}

static uint32_t home(const kiln_prefix_cache *pc, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & pc->mask;
}

/* the slot holding block's entry, or -1 */
static int64_t slot_of(const kiln_prefix_cache *pc, int32_t block) {
    for (uint32_t i = home(pc, pc->hash[block]);; i = (i + 1) & pc->mask) {
        if (pc->slot[i] < 0) return -1;
        if (pc->slot[i] == block) return i;
    }
}

/* Free block's checkpoint (telling the owner first); no-op without one. */
static void free_state(kiln_prefix_cache *pc, int32_t block) {
    if (!pc->state[block]) return;
    void *st = pc->state[block];
    pc->state[block] = NULL;
    atomic_fetch_sub(&pc->n_states, 1);
    if (pc->state_free_fn) pc->state_free_fn(pc->state_free_user, block, st);
    free(st);
}

static void unindex(kiln_prefix_cache *pc, int32_t block) {
    int64_t at = slot_of(pc, block);
    if (at >= 0) { /* backward-shift deletion keeps every probe chain unbroken */
        uint32_t i = (uint32_t)at;
        for (uint32_t j = (i + 1) & pc->mask; pc->slot[j] >= 0; j = (j + 1) & pc->mask) {
            uint32_t h = home(pc, pc->hash[pc->slot[j]]);
            /* move j to i when its home is not in (i, j] (cyclically) */
            if (((j - h) & pc->mask) >= ((j - i) & pc->mask)) {
                pc->slot[i] = pc->slot[j];
                i = j;
            }
        }
        pc->slot[i] = -1;
    }
    pc->indexed[block] = 0;
    free_state(pc, block);
    atomic_fetch_sub(&pc->n_indexed, 1);
}

static void on_evict(void *user, int32_t block) {
    kiln_prefix_cache *pc = user;
    if (block < 0 || block >= pc->n_blocks || !pc->indexed[block]) return;
    unindex(pc, block);
    atomic_fetch_add(&pc->evictions, 1);
}

static void on_idle(void *user, int32_t block) {
    kiln_prefix_cache *pc = user;
    if (!pc->idle_fn || block < 0 || block >= pc->n_blocks || !pc->indexed[block]) return;
    pc->idle_fn(pc->idle_user, block, pc->hash[block], pc->parent[block],
                pc->tokens + (size_t)block * (size_t)pc->block_size, pc->state[block]);
}

kiln_status kiln_prefix_cache_create(kiln_kv_pool *pool, uint64_t ns, size_t state_bytes,
                                     kiln_prefix_cache **out, kiln_error *err) {
    if (!pool || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "prefix cache: %s is NULL",
                              !pool ? "pool" : "out");
    kiln_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "prefix cache: out of memory");
    pc->pool = pool;
    pc->ns = ns;
    pc->state_bytes = state_bytes;
    pc->n_blocks = kiln_kv_pool_n_blocks(pool);
    pc->block_size = kiln_kv_pool_block_size(pool);
    uint32_t cap = 16;
    while (cap < (uint32_t)pc->n_blocks * 2u && cap < (1u << 31)) cap <<= 1;
    pc->mask = cap - 1;
    size_t nb = (size_t)pc->n_blocks;
    pc->slot = malloc((size_t)cap * sizeof *pc->slot);
    pc->hash = calloc(nb, sizeof *pc->hash);
    pc->parent = calloc(nb, sizeof *pc->parent);
    pc->indexed = calloc(nb, 1);
    pc->tokens = malloc(nb * (size_t)pc->block_size * sizeof *pc->tokens);
    pc->state = calloc(nb, sizeof *pc->state);
    if (!pc->slot || !pc->hash || !pc->parent || !pc->indexed || !pc->tokens || !pc->state) {
        size_t bytes = (size_t)cap * 4 + nb * (8 + 8 + 1 + (size_t)pc->block_size * 4 + 8);
        kiln_prefix_cache_destroy(pc);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "prefix cache: allocating %zu bytes of index failed", bytes);
    }
    memset(pc->slot, 0xff, (size_t)cap * sizeof *pc->slot);
    kiln_kv_pool_hooks h = {.user = pc, .on_evict = on_evict, .on_idle = on_idle};
    kiln_kv_pool_set_hooks(pool, &h);
    *out = pc;
    return KILN_OK;
}

void kiln_prefix_cache_destroy(kiln_prefix_cache *pc) {
    if (!pc) return;
    if (pc->indexed && pc->slot && pc->hash)
        for (int32_t b = 0; b < pc->n_blocks; b++)
            if (pc->indexed[b]) {
                unindex(pc, b);
                kiln_kv_pool_set_cached(pc->pool, b, false);
            }
    kiln_kv_pool_set_hooks(pc->pool, NULL);
    free(pc->slot);
    free(pc->hash);
    free(pc->parent);
    free(pc->indexed);
    free(pc->tokens);
    free(pc->state);
    free(pc);
}

uint64_t kiln_prefix_cache_namespace(const kiln_prefix_cache *pc) {
    return pc ? pc->ns : 0;
}

int32_t kiln_prefix_cache_find(const kiln_prefix_cache *pc, uint64_t hash, uint64_t parent,
                               const int32_t *tokens) {
    if (!pc || !tokens) return -1;
    for (uint32_t i = home(pc, hash);; i = (i + 1) & pc->mask) {
        int32_t b = pc->slot[i];
        if (b < 0) return -1;
        if (pc->hash[b] == hash && pc->parent[b] == parent &&
            memcmp(pc->tokens + (size_t)b * (size_t)pc->block_size, tokens,
                   (size_t)pc->block_size * sizeof *tokens) == 0)
            return b;
    }
}

bool kiln_prefix_cache_insert(kiln_prefix_cache *pc, uint64_t hash, uint64_t parent,
                              const int32_t *tokens, int32_t block) {
    if (!pc || !tokens || block < 0 || block >= pc->n_blocks || pc->indexed[block] ||
        kiln_kv_pool_refcount(pc->pool, block) < 1)
        return false;
    uint32_t i = home(pc, hash);
    for (; pc->slot[i] >= 0; i = (i + 1) & pc->mask)
        if (pc->hash[pc->slot[i]] == hash) return false; /* already indexed */
    pc->slot[i] = block;
    pc->hash[block] = hash;
    pc->parent[block] = parent;
    memcpy(pc->tokens + (size_t)block * (size_t)pc->block_size, tokens,
           (size_t)pc->block_size * sizeof *tokens);
    pc->indexed[block] = 1;
    kiln_kv_pool_set_cached(pc->pool, block, true);
    atomic_fetch_add(&pc->n_indexed, 1);
    atomic_fetch_add(&pc->inserts, 1);
    return true;
}

bool kiln_prefix_cache_block(const kiln_prefix_cache *pc, int32_t block, uint64_t *hash,
                             uint64_t *parent, const int32_t **tokens) {
    if (!pc || block < 0 || block >= pc->n_blocks || !pc->indexed[block]) return false;
    if (hash) *hash = pc->hash[block];
    if (parent) *parent = pc->parent[block];
    if (tokens) *tokens = pc->tokens + (size_t)block * (size_t)pc->block_size;
    return true;
}

bool kiln_prefix_cache_set_state(kiln_prefix_cache *pc, int32_t block, const void *state) {
    if (!pc || !state || pc->state_bytes == 0 || block < 0 || block >= pc->n_blocks ||
        !pc->indexed[block])
        return false;
    void *copy = malloc(pc->state_bytes);
    if (!copy) return false;
    memcpy(copy, state, pc->state_bytes);
    free_state(pc, block);
    pc->state[block] = copy;
    atomic_fetch_add(&pc->n_states, 1);
    return true;
}

void kiln_prefix_cache_drop_state(kiln_prefix_cache *pc, int32_t block) {
    if (!pc || block < 0 || block >= pc->n_blocks) return;
    free_state(pc, block);
}

void kiln_prefix_cache_set_state_free_fn(kiln_prefix_cache *pc, kiln_prefix_state_free_fn fn,
                                         void *user) {
    if (!pc) return;
    pc->state_free_fn = fn;
    pc->state_free_user = user;
}

const void *kiln_prefix_cache_state(const kiln_prefix_cache *pc, int32_t block) {
    if (!pc || block < 0 || block >= pc->n_blocks || !pc->indexed[block]) return NULL;
    return pc->state[block];
}

void kiln_prefix_cache_remove(kiln_prefix_cache *pc, int32_t block) {
    if (!pc || block < 0 || block >= pc->n_blocks || !pc->indexed[block]) return;
    unindex(pc, block);
    kiln_kv_pool_set_cached(pc->pool, block, false);
}

void kiln_prefix_cache_set_idle_fn(kiln_prefix_cache *pc, kiln_prefix_idle_fn fn, void *user) {
    if (!pc) return;
    pc->idle_fn = fn;
    pc->idle_user = user;
}

kiln_prefix_cache_stats kiln_prefix_cache_get_stats(const kiln_prefix_cache *pc) {
    kiln_prefix_cache_stats s = {0};
    if (!pc) return s;
    s.indexed = atomic_load(&pc->n_indexed);
    s.checkpoints = atomic_load(&pc->n_states);
    s.inserts = atomic_load(&pc->inserts);
    s.evictions = atomic_load(&pc->evictions);
    return s;
}
