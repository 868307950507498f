/* kv_pool.c - the paged KV cache's block pool (see kv_pool.h). */
#include "kv/kv_pool.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_format.h"
#include "util/error.h"

struct kiln_kv_pool {
    int32_t n_layer;
    int64_t kv_dim;
    int32_t block_size;
    int32_t n_blocks;
    kiln_dtype dtype;
    kiln_backend *be; /* borrowed; NULL: host memory */

    size_t region_bytes; /* one (layer, block) region of K (or V), padded */
    size_t total_bytes;  /* of each of k and v */
    unsigned char *k, *v;

    int32_t *refcount;  /* [n_blocks] */
    uint8_t *format;    /* [n_blocks], kiln_dtype ids (all < 256) */
    uint8_t *cached;    /* [n_blocks]: indexed by a prefix cache (kiln_kv_pool_set_cached) */
    int32_t *free_list; /* [n_blocks] stack of free block ids */
    int32_t n_free;     /* engine thread only; the atomic mirror is `counts` */
    /* The LRU of evictable blocks (refcount 0, cached): a doubly linked list through
     * lru_prev/lru_next ([n_blocks], -1 ends), least recently idle at the head. */
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail, n_lru;
    kiln_kv_pool_hooks hooks;

    /* used (refcount > 0) in the low 32 bits, cached-evictable in the high 32: one atomic, so
     * a snapshot from another thread always has used + cached + free == n_blocks */
    _Atomic uint64_t counts;
    _Atomic int32_t peak;
    _Atomic int64_t violations;
    _Atomic int64_t evictions;
};

static size_t elem_size(kiln_dtype t) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    return f ? f->elem_bytes : 0;
}

/* Padded bytes of one (layer, block) region, or 0 on overflow / bad args. */
static size_t region_bytes_of(int64_t kv_dim, int32_t block_size, kiln_dtype dtype) {
    size_t es = elem_size(dtype);
    if (es == 0 || kv_dim < 1 || block_size < 1) return 0;
    uint64_t n;
    if (__builtin_mul_overflow((uint64_t)kv_dim, (uint64_t)block_size, &n) ||
        __builtin_mul_overflow(n, (uint64_t)es, &n) ||
        __builtin_add_overflow(n, (uint64_t)(KILN_KV_ALIGNMENT - 1), &n))
        return 0;
    n &= ~(uint64_t)(KILN_KV_ALIGNMENT - 1);
    if (n > (uint64_t)INT64_MAX || n > (uint64_t)SIZE_MAX) return 0;
    return (size_t)n;
}

int64_t kiln_kv_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t block_size, kiln_dtype dtype) {
    if (n_layer < 1 || block_size < 0) return 0;
    if (block_size == 0) block_size = KILN_KV_DEFAULT_BLOCK_SIZE;
    size_t r = region_bytes_of(kv_dim, block_size, dtype);
    if (r == 0) return 0;
    uint64_t n;
    if (__builtin_mul_overflow((uint64_t)r, (uint64_t)n_layer * 2u, &n) || n > (uint64_t)INT64_MAX)
        return 0;
    return (int64_t)n;
}

int32_t kiln_kv_blocks_for_tokens(int32_t n_tokens, int32_t block_size) {
    if (n_tokens <= 0 || block_size <= 0) return 0;
    return n_tokens / block_size + (n_tokens % block_size != 0);
}

int32_t kiln_kv_pool_blocks_for_budget(int32_t n_layer, int64_t kv_dim, int32_t block_size,
                                       kiln_dtype dtype, int64_t bytes) {
    int64_t bb = kiln_kv_block_bytes(n_layer, kv_dim, block_size, dtype);
    if (bb <= 0 || bytes <= 0) return 0;
    int64_t n = bytes / bb;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

kiln_status kiln_kv_pool_create(const kiln_kv_pool_params *p, kiln_kv_pool **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "kv pool: out is NULL");
    if (!p) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "kv pool: params is NULL");
    if (p->n_layer < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: n_layer must be >= 1 (got %" PRId32 ")", p->n_layer);
    if (p->kv_dim < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: kv_dim must be >= 1 (got %" PRId64 ")", p->kv_dim);
    if (p->block_size < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: block_size must be >= 1, or 0 for the default %d "
                              "(got %" PRId32 ")",
                              KILN_KV_DEFAULT_BLOCK_SIZE, p->block_size);
    if (p->n_blocks < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: n_blocks must be >= 1 (got %" PRId32 ")", p->n_blocks);
    if (elem_size(p->dtype) == 0)
        return kiln_error_set(
            err, KILN_ERR_INVALID_ARGUMENT,
            "kv pool: dtype must be a KV page format: f32, f16 or bf16 (got %s, id %d)",
            kiln_dtype_name((int32_t)p->dtype), (int)p->dtype);

    int32_t bs = p->block_size ? p->block_size : KILN_KV_DEFAULT_BLOCK_SIZE;
    size_t region = region_bytes_of(p->kv_dim, bs, p->dtype);
    uint64_t total = 0;
    if (region == 0 || __builtin_mul_overflow((uint64_t)region, (uint64_t)p->n_layer, &total) ||
        __builtin_mul_overflow(total, (uint64_t)p->n_blocks, &total) ||
        total > (uint64_t)INT64_MAX / 2 || total > (uint64_t)SIZE_MAX / 2)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: requested size overflows (2 x %" PRId32 " layers x %" PRId32
                              " blocks x %" PRId32 " positions x %" PRId64 " x %s)",
                              p->n_layer, p->n_blocks, bs, p->kv_dim, kiln_dtype_name(p->dtype));

    kiln_kv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %zu bytes for the pool header failed",
                              sizeof(*pool));
    pool->n_layer = p->n_layer;
    pool->kv_dim = p->kv_dim;
    pool->block_size = bs;
    pool->n_blocks = p->n_blocks;
    pool->dtype = p->dtype;
    pool->region_bytes = region;
    pool->total_bytes = (size_t)total;

    pool->be = p->backend;
    bool ok;
    if (pool->be) {
        kiln_error ignored;
        void *k = NULL, *v = NULL;
        ok = pool->be->ops->buf_alloc(pool->be, pool->total_bytes, &k, &ignored) == KILN_OK &&
             pool->be->ops->buf_alloc(pool->be, pool->total_bytes, &v, &ignored) == KILN_OK;
        pool->k = k;
        pool->v = v;
    } else {
        /* total is a multiple of KILN_KV_ALIGNMENT, as aligned_alloc requires */
        pool->k = aligned_alloc(KILN_KV_ALIGNMENT, pool->total_bytes);
        pool->v = pool->k ? aligned_alloc(KILN_KV_ALIGNMENT, pool->total_bytes) : NULL;
        ok = pool->k && pool->v;
    }
    if (!ok) {
        kiln_kv_pool_destroy(pool);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %" PRIu64 " bytes of KV storage failed "
                              "(2 x %" PRIu64 " bytes: %" PRId32 " layers x %" PRId32
                              " blocks x %zu bytes)",
                              2 * total, total, p->n_layer, p->n_blocks, region);
    }
    size_t nb = (size_t)p->n_blocks;
    pool->refcount = calloc(nb, sizeof(int32_t));
    pool->format = calloc(nb, sizeof(uint8_t));
    pool->cached = calloc(nb, sizeof(uint8_t));
    pool->free_list = malloc(nb * sizeof(int32_t));
    pool->lru_prev = malloc(nb * sizeof(int32_t));
    pool->lru_next = malloc(nb * sizeof(int32_t));
    if (!pool->refcount || !pool->format || !pool->cached || !pool->free_list ||
        !pool->lru_prev || !pool->lru_next) {
        kiln_kv_pool_destroy(pool);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %zu bytes of block metadata failed",
                              nb * (4 * sizeof(int32_t) + 2));
    }
    /* Stack top is the end: push ids in reverse so block 0 is handed out first. */
    for (int32_t i = 0; i < p->n_blocks; i++) {
        pool->free_list[i] = p->n_blocks - 1 - i;
        pool->format[i] = (uint8_t)p->dtype;
        pool->lru_prev[i] = pool->lru_next[i] = -1;
    }
    pool->n_free = p->n_blocks;
    pool->lru_head = pool->lru_tail = -1;
    atomic_init(&pool->counts, 0);
    atomic_init(&pool->peak, 0);
    atomic_init(&pool->violations, 0);
    atomic_init(&pool->evictions, 0);
    *out = pool;
    return KILN_OK;
}

void kiln_kv_pool_destroy(kiln_kv_pool *pool) {
    if (!pool) return;
    if (pool->be) {
        pool->be->ops->buf_free(pool->be, pool->k);
        pool->be->ops->buf_free(pool->be, pool->v);
    } else {
        free(pool->k);
        free(pool->v);
    }
    free(pool->refcount);
    free(pool->format);
    free(pool->cached);
    free(pool->free_list);
    free(pool->lru_prev);
    free(pool->lru_next);
    free(pool);
}

static void violation(kiln_kv_pool *pool, const char *what, int32_t block) {
    atomic_fetch_add_explicit(&pool->violations, 1, memory_order_relaxed);
    fprintf(stderr,
            "kiln: kv pool invariant violated: %s (block %" PRId32 " of %" PRId32
            "); call ignored\n",
            what, block, pool->n_blocks);
}

/* Publish the used and cached counts (from n_free, n_lru): peak first, so a reader that loads
 * counts then peak (both acquire) never sees peak < used. */
static void publish(kiln_kv_pool *pool) {
    int32_t used = pool->n_blocks - pool->n_free - pool->n_lru;
    int32_t peak = atomic_load_explicit(&pool->peak, memory_order_relaxed);
    if (used > peak) atomic_store_explicit(&pool->peak, used, memory_order_release);
    atomic_store_explicit(&pool->counts, (uint64_t)(uint32_t)used | (uint64_t)pool->n_lru << 32,
                          memory_order_release);
}

static void lru_push_tail(kiln_kv_pool *pool, int32_t b) {
    pool->lru_prev[b] = pool->lru_tail;
    pool->lru_next[b] = -1;
    if (pool->lru_tail >= 0)
        pool->lru_next[pool->lru_tail] = b;
    else
        pool->lru_head = b;
    pool->lru_tail = b;
    pool->n_lru++;
}

static void lru_remove(kiln_kv_pool *pool, int32_t b) {
    int32_t p = pool->lru_prev[b], n = pool->lru_next[b];
    if (p >= 0)
        pool->lru_next[p] = n;
    else
        pool->lru_head = n;
    if (n >= 0)
        pool->lru_prev[n] = p;
    else
        pool->lru_tail = p;
    pool->lru_prev[b] = pool->lru_next[b] = -1;
    pool->n_lru--;
}

int32_t kiln_kv_pool_alloc(kiln_kv_pool *pool) {
    if (!pool) return -1;
    int32_t b;
    if (pool->n_free > 0) {
        b = pool->free_list[--pool->n_free];
    } else if (pool->n_lru > 0) {
        /* Evict the least recently idle cached block: its owner forgets it first. */
        b = pool->lru_head;
        lru_remove(pool, b);
        pool->cached[b] = 0;
        atomic_fetch_add_explicit(&pool->evictions, 1, memory_order_relaxed);
        if (pool->hooks.on_evict) pool->hooks.on_evict(pool->hooks.user, b);
    } else {
        return -1;
    }
    pool->refcount[b] = 1;
    pool->format[b] = (uint8_t)pool->dtype;
    publish(pool);
    return b;
}

void kiln_kv_pool_ref(kiln_kv_pool *pool, int32_t block) {
    if (!pool) return;
    if (block < 0 || block >= pool->n_blocks) {
        violation(pool, "ref of an out-of-range block", block);
        return;
    }
    if (pool->refcount[block] == 0) {
        violation(pool, "ref of a free block", block);
        return;
    }
    if (pool->refcount[block] == INT32_MAX) {
        violation(pool, "refcount overflow", block);
        return;
    }
    pool->refcount[block]++;
}

bool kiln_kv_pool_acquire(kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return false;
    if (pool->refcount[block] > 0) {
        if (pool->refcount[block] == INT32_MAX) return false;
        pool->refcount[block]++;
        return true;
    }
    if (!pool->cached[block]) return false;
    lru_remove(pool, block);
    pool->refcount[block] = 1;
    publish(pool);
    return true;
}

void kiln_kv_pool_unref(kiln_kv_pool *pool, int32_t block) {
    if (!pool) return;
    if (block < 0 || block >= pool->n_blocks) {
        violation(pool, "unref of an out-of-range block", block);
        return;
    }
    if (pool->refcount[block] == 0) {
        violation(pool, "unref of a block whose refcount is already 0", block);
        return;
    }
    if (--pool->refcount[block] == 0) {
        if (pool->cached[block]) {
            lru_push_tail(pool, block);
            publish(pool);
            if (pool->hooks.on_idle) pool->hooks.on_idle(pool->hooks.user, block);
        } else {
            pool->free_list[pool->n_free++] = block;
            publish(pool);
        }
    }
}

void kiln_kv_pool_set_hooks(kiln_kv_pool *pool, const kiln_kv_pool_hooks *hooks) {
    if (!pool) return;
    if (hooks)
        pool->hooks = *hooks;
    else
        memset(&pool->hooks, 0, sizeof pool->hooks);
}

void kiln_kv_pool_set_cached(kiln_kv_pool *pool, int32_t block, bool cached) {
    if (!pool) return;
    if (block < 0 || block >= pool->n_blocks) {
        violation(pool, "set_cached of an out-of-range block", block);
        return;
    }
    if (pool->refcount[block] == 0 && !pool->cached[block]) {
        violation(pool, "set_cached of a free block", block);
        return;
    }
    if (cached == (pool->cached[block] != 0)) return;
    pool->cached[block] = cached;
    if (!cached && pool->refcount[block] == 0) { /* idle and forgotten: it is free now */
        lru_remove(pool, block);
        pool->free_list[pool->n_free++] = block;
        publish(pool);
    }
}

bool kiln_kv_pool_is_cached(const kiln_kv_pool *pool, int32_t block) {
    return pool && block >= 0 && block < pool->n_blocks && pool->cached[block];
}

int32_t kiln_kv_pool_n_available(const kiln_kv_pool *pool) {
    if (!pool) return 0;
    uint64_t c = atomic_load_explicit(&pool->counts, memory_order_acquire);
    return pool->n_blocks - (int32_t)(uint32_t)c;
}

int32_t kiln_kv_pool_refcount(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return -1;
    return pool->refcount[block];
}

kiln_dtype kiln_kv_pool_block_format(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return KILN_DTYPE_COUNT;
    return (kiln_dtype)pool->format[block];
}

int32_t kiln_kv_pool_n_free(const kiln_kv_pool *pool) {
    if (!pool) return 0;
    uint64_t c = atomic_load_explicit(&pool->counts, memory_order_acquire);
    return pool->n_blocks - (int32_t)(uint32_t)c - (int32_t)(c >> 32);
}

kiln_kv_pool_stats kiln_kv_pool_get_stats(const kiln_kv_pool *pool) {
    kiln_kv_pool_stats s = {0};
    if (!pool) return s;
    s.n_blocks = pool->n_blocks;
    uint64_t c = atomic_load_explicit(&pool->counts, memory_order_acquire);
    s.used = (int32_t)(uint32_t)c;
    s.cached = (int32_t)(c >> 32);
    s.peak = atomic_load_explicit(&pool->peak, memory_order_acquire);
    if (s.peak < s.used) /* cannot happen given publish's order; keep the promise anyway */
        s.peak = s.used;
    s.free = s.n_blocks - s.used - s.cached;
    s.evictions = atomic_load_explicit(&pool->evictions, memory_order_relaxed);
    return s;
}

void kiln_kv_pool_reset_peak(kiln_kv_pool *pool) {
    if (!pool) return;
    uint64_t c = atomic_load_explicit(&pool->counts, memory_order_relaxed);
    atomic_store_explicit(&pool->peak, (int32_t)(uint32_t)c, memory_order_release);
}

int64_t kiln_kv_pool_invariant_violations(const kiln_kv_pool *pool) {
    return pool ? atomic_load_explicit(&pool->violations, memory_order_relaxed) : 0;
}

int32_t kiln_kv_pool_block_size(const kiln_kv_pool *pool) {
    return pool ? pool->block_size : 0;
}
int64_t kiln_kv_pool_kv_dim(const kiln_kv_pool *pool) {
    return pool ? pool->kv_dim : 0;
}
int32_t kiln_kv_pool_n_layer(const kiln_kv_pool *pool) {
    return pool ? pool->n_layer : 0;
}
kiln_dtype kiln_kv_pool_dtype(const kiln_kv_pool *pool) {
    return pool ? pool->dtype : KILN_DTYPE_COUNT;
}
int32_t kiln_kv_pool_n_blocks(const kiln_kv_pool *pool) {
    return pool ? pool->n_blocks : 0;
}

kiln_backend *kiln_kv_pool_backend(const kiln_kv_pool *pool) {
    return pool ? pool->be : NULL;
}

static void *region(unsigned char *base, const kiln_kv_pool *pool, int32_t layer, int32_t block) {
    if (layer < 0 || layer >= pool->n_layer || block < 0 || block >= pool->n_blocks) return NULL;
    size_t idx = (size_t)layer * (size_t)pool->n_blocks + (size_t)block;
    return base + idx * pool->region_bytes;
}

void *kiln_kv_pool_k(kiln_kv_pool *pool, int32_t layer, int32_t block) {
    return pool ? region(pool->k, pool, layer, block) : NULL;
}

void *kiln_kv_pool_v(kiln_kv_pool *pool, int32_t layer, int32_t block) {
    return pool ? region(pool->v, pool, layer, block) : NULL;
}
