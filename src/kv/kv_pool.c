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

typedef struct pool_class {
    int32_t base, n;            /* block ids base .. base + n - 1 */
    kiln_dtype fk, fv;          /* K and V formats */
    size_t row_k, row_v;        /* bytes of one row */
    size_t region_k, region_v;  /* one (layer, block) region, padded */
    size_t total_k, total_v;    /* storage bytes */
    unsigned char *k, *v;
    int32_t *free_list;         /* [n] stack of free block ids */
    int32_t n_free;
    int32_t lru_head, lru_tail, n_lru;
} pool_class;

struct kiln_kv_pool {
    int32_t n_layer;
    int32_t n_stored; /* layers with storage (kiln_kv_pool_params.layers) */
    int32_t *slot;    /* [n_layer]: the layer's index in the storage, -1 when not held */
    int32_t window;   /* > 0: a sliding group's pool */
    int64_t kv_dim;
    int32_t head_dim;
    int32_t block_size;
    int32_t n_blocks; /* both classes */
    int n_classes, wclass;
    pool_class cls[KILN_KV_N_CLASSES];
    kiln_backend *be; /* borrowed; NULL: host memory */

    int32_t *refcount;  /* [n_blocks] */
    uint8_t *format;    /* [n_blocks]: the block's class */
    uint8_t *cached;    /* [n_blocks]: indexed by a prefix cache (kiln_kv_pool_set_cached) */
    /* The LRUs of evictable blocks (refcount 0, cached), one per class: doubly linked lists
     * through lru_prev/lru_next ([n_blocks], -1 ends), least recently idle at the head. */
    int32_t *lru_prev, *lru_next;
    kiln_kv_pool_hooks hooks;

    /* used (refcount > 0) in the low 32 bits, cached-evictable in the high 32: one atomic, so
     * a snapshot from another thread always has used + cached + free == n_blocks */
    _Atomic uint64_t counts;
    _Atomic int32_t peak;
    _Atomic int32_t avail_w; /* free + cached of the write class */
    _Atomic int32_t held[KILN_KV_N_CLASSES];
    _Atomic int64_t violations;
    _Atomic int64_t evictions;
    _Atomic int64_t converted;
};

static size_t row_bytes(kiln_dtype t, int64_t kv_dim, int32_t head_dim) {
    if (kv_dim < 1) return 0;
    if (head_dim < 1 || kv_dim % head_dim) head_dim = kv_dim > INT32_MAX ? 0 : (int32_t)kv_dim;
    if (head_dim < 1) return kiln_kv_format_row_bytes(t, kv_dim);
    const kiln_kv_geom g = {kv_dim, (int32_t)(kv_dim / head_dim), head_dim};
    return kiln_kv_format_row_bytes_geom(t, &g);
}

/* Padded bytes of one (layer, block) region of rows of rb bytes, or 0 on overflow / bad args. */
static size_t region_of(size_t rb, int32_t block_size) {
    if (rb == 0 || block_size < 1) return 0;
    uint64_t n;
    if (__builtin_mul_overflow((uint64_t)rb, (uint64_t)block_size, &n) ||
        __builtin_add_overflow(n, (uint64_t)(KILN_KV_ALIGNMENT - 1), &n))
        return 0;
    n &= ~(uint64_t)(KILN_KV_ALIGNMENT - 1);
    if (n > (uint64_t)INT64_MAX || n > (uint64_t)SIZE_MAX) return 0;
    return (size_t)n;
}

int64_t kiln_kv_block_bytes_geom(int32_t n_layer, int64_t kv_dim, int32_t head_dim,
                                 int32_t block_size, kiln_dtype k_dtype, kiln_dtype v_dtype) {
    if (n_layer < 1 || block_size < 0) return 0;
    if (block_size == 0) block_size = KILN_KV_DEFAULT_BLOCK_SIZE;
    size_t rk = region_of(row_bytes(k_dtype, kv_dim, head_dim), block_size);
    size_t rv = region_of(row_bytes(v_dtype, kv_dim, head_dim), block_size);
    if (rk == 0 || rv == 0) return 0;
    uint64_t n;
    if (__builtin_add_overflow((uint64_t)rk, (uint64_t)rv, &n) ||
        __builtin_mul_overflow(n, (uint64_t)n_layer, &n) || n > (uint64_t)INT64_MAX)
        return 0;
    return (int64_t)n;
}

int64_t kiln_kv_block_bytes_kv(int32_t n_layer, int64_t kv_dim, int32_t block_size,
                               kiln_dtype k_dtype, kiln_dtype v_dtype) {
    return kiln_kv_block_bytes_geom(n_layer, kv_dim, 0, block_size, k_dtype, v_dtype);
}

int64_t kiln_kv_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t block_size, kiln_dtype dtype) {
    return kiln_kv_block_bytes_kv(n_layer, kv_dim, block_size, dtype, dtype);
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

static kiln_status class_init(kiln_kv_pool *pool, pool_class *c, int32_t base, int32_t n,
                              kiln_dtype fk, kiln_dtype fv, kiln_error *err) {
    c->base = base;
    c->n = n;
    c->fk = fk;
    c->fv = fv;
    c->row_k = row_bytes(fk, pool->kv_dim, pool->head_dim);
    c->row_v = row_bytes(fv, pool->kv_dim, pool->head_dim);
    c->region_k = region_of(c->row_k, pool->block_size);
    c->region_v = region_of(c->row_v, pool->block_size);
    c->lru_head = c->lru_tail = -1;
    uint64_t tk = 0, tv = 0;
    if (c->region_k == 0 || c->region_v == 0 || pool->n_stored < 0 ||
        __builtin_mul_overflow((uint64_t)c->region_k, (uint64_t)pool->n_stored, &tk) ||
        __builtin_mul_overflow(tk, (uint64_t)n, &tk) ||
        __builtin_mul_overflow((uint64_t)c->region_v, (uint64_t)pool->n_stored, &tv) ||
        __builtin_mul_overflow(tv, (uint64_t)n, &tv) || tk > (uint64_t)INT64_MAX / 4 ||
        tv > (uint64_t)INT64_MAX / 4 || tk > (uint64_t)SIZE_MAX / 4 || tv > (uint64_t)SIZE_MAX / 4)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: requested size overflows (%" PRId32 " layers x %" PRId32
                              " blocks x %" PRId32 " positions x %" PRId64 " x %s/%s)",
                              pool->n_stored, n, pool->block_size, pool->kv_dim,
                              kiln_dtype_name(fk), kiln_dtype_name(fv));
    c->total_k = (size_t)tk;
    c->total_v = (size_t)tv;
    bool ok;
    if (c->total_k == 0) { /* a group without layers (kiln_kv_pool_params.layers): ids only */
        ok = true;
    } else if (pool->be) {
        kiln_error ignored;
        void *k = NULL, *v = NULL;
        ok = pool->be->ops->buf_alloc(pool->be, c->total_k, &k, &ignored) == KILN_OK &&
             pool->be->ops->buf_alloc(pool->be, c->total_v, &v, &ignored) == KILN_OK;
        c->k = k;
        c->v = v;
    } else {
        /* totals are multiples of KILN_KV_ALIGNMENT, as aligned_alloc requires */
        c->k = aligned_alloc(KILN_KV_ALIGNMENT, c->total_k);
        c->v = c->k ? aligned_alloc(KILN_KV_ALIGNMENT, c->total_v) : NULL;
        ok = c->k && c->v;
    }
    c->free_list = ok ? malloc((size_t)n * sizeof(int32_t)) : NULL;
    if (!ok || !c->free_list)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %" PRIu64 " bytes of KV storage failed "
                              "(%" PRIu64 " K + %" PRIu64 " V bytes: %" PRId32 " layers x %" PRId32
                              " blocks)",
                              tk + tv, tk, tv, pool->n_stored, n);
    /* Stack top is the end: push ids in reverse so the first block is handed out first. */
    for (int32_t i = 0; i < n; i++) {
        c->free_list[i] = base + n - 1 - i;
        pool->format[base + i] = (uint8_t)(c - pool->cls);
        pool->lru_prev[base + i] = pool->lru_next[base + i] = -1;
    }
    c->n_free = n;
    return KILN_OK;
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
    if (p->n_blocks_hi < 0 || p->n_blocks_hi > INT32_MAX - p->n_blocks)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: n_blocks_hi must be in [0, %" PRId32 "] (got %" PRId32 ")",
                              INT32_MAX - p->n_blocks, p->n_blocks_hi);
    if (p->head_dim < 0 || (p->head_dim > 0 && p->kv_dim % p->head_dim))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool: head_dim must divide kv_dim %" PRId64 " (got %" PRId32 ")",
                              p->kv_dim, p->head_dim);
    const kiln_dtype fk = p->dtype, fv = p->dtype_v_set ? p->dtype_v : p->dtype;
    const kiln_dtype fmts[3] = {fk, fv, p->n_blocks_hi > 0 ? p->dtype_hi : fk};
    const char *names[3] = {"dtype", "dtype_v", "dtype_hi"};
    const int32_t hd = p->head_dim > 0 ? p->head_dim
                                       : (p->kv_dim > INT32_MAX ? 0 : (int32_t)p->kv_dim);
    for (int i = 0; i < 3; i++) {
        if (!kiln_kv_format_of(fmts[i]))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "kv pool: %s must be a KV page format: %s (got %s, id %d)",
                                  names[i], kiln_kv_format_names(),
                                  kiln_dtype_name((int32_t)fmts[i]), (int)fmts[i]);
        if (hd > 0) {
            const kiln_kv_geom g = {p->kv_dim, (int32_t)(p->kv_dim / hd), hd};
            kiln_status s = kiln_kv_format_check(fmts[i], &g, names[i], err);
            if (s) return s;
        }
    }

    kiln_kv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %zu bytes for the pool header failed",
                              sizeof(*pool));
    pool->n_layer = p->n_layer;
    pool->window = p->window > 0 ? p->window : 0;
    pool->kv_dim = p->kv_dim;
    pool->head_dim = hd;
    pool->block_size = p->block_size ? p->block_size : KILN_KV_DEFAULT_BLOCK_SIZE;
    pool->n_blocks = p->n_blocks + p->n_blocks_hi;
    pool->n_classes = p->n_blocks_hi > 0 ? 2 : 1;
    pool->wclass = p->n_blocks_hi > 0 ? KILN_KV_CLASS_HI : KILN_KV_CLASS_MAIN;
    pool->be = p->backend;
    size_t nb = (size_t)pool->n_blocks;
    pool->refcount = calloc(nb, sizeof(int32_t));
    pool->format = calloc(nb, sizeof(uint8_t));
    pool->cached = calloc(nb, sizeof(uint8_t));
    pool->lru_prev = malloc(nb * sizeof(int32_t));
    pool->lru_next = malloc(nb * sizeof(int32_t));
    pool->slot = malloc((size_t)p->n_layer * sizeof(int32_t));
    if (pool->slot)
        for (int32_t l = 0; l < p->n_layer; l++)
            pool->slot[l] = !p->layers || p->layers[l] ? pool->n_stored++ : -1;
    if (!pool->refcount || !pool->format || !pool->cached || !pool->lru_prev || !pool->lru_next ||
        !pool->slot) {
        kiln_kv_pool_destroy(pool);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "kv pool: allocating %zu bytes of block metadata failed",
                              nb * (4 * sizeof(int32_t) + 2));
    }
    kiln_status s = class_init(pool, &pool->cls[0], 0, p->n_blocks, fk, fv, err);
    if (!s && p->n_blocks_hi > 0)
        s = class_init(pool, &pool->cls[1], p->n_blocks, p->n_blocks_hi, p->dtype_hi, p->dtype_hi,
                       err);
    if (s) {
        kiln_kv_pool_destroy(pool);
        return s;
    }
    atomic_init(&pool->counts, 0);
    atomic_init(&pool->peak, 0);
    atomic_init(&pool->avail_w, pool->cls[pool->wclass].n);
    for (int i = 0; i < KILN_KV_N_CLASSES; i++) atomic_init(&pool->held[i], 0);
    atomic_init(&pool->violations, 0);
    atomic_init(&pool->evictions, 0);
    atomic_init(&pool->converted, 0);
    *out = pool;
    return KILN_OK;
}

void kiln_kv_pool_destroy(kiln_kv_pool *pool) {
    if (!pool) return;
    for (int i = 0; i < KILN_KV_N_CLASSES; i++) {
        pool_class *c = &pool->cls[i];
        if (pool->be) {
            if (c->k) pool->be->ops->buf_free(pool->be, c->k);
            if (c->v) pool->be->ops->buf_free(pool->be, c->v);
        } else {
            free(c->k);
            free(c->v);
        }
        free(c->free_list);
    }
    free(pool->refcount);
    free(pool->format);
    free(pool->cached);
    free(pool->lru_prev);
    free(pool->lru_next);
    free(pool->slot);
    free(pool);
}

static pool_class *class_of(kiln_kv_pool *pool, int32_t b) {
    return &pool->cls[pool->format[b]];
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
    int32_t n_free = 0, n_lru = 0;
    for (int i = 0; i < pool->n_classes; i++) {
        const pool_class *c = &pool->cls[i];
        n_free += c->n_free;
        n_lru += c->n_lru;
        atomic_store_explicit(&pool->held[i], c->n - c->n_free, memory_order_relaxed);
    }
    const pool_class *w = &pool->cls[pool->wclass];
    atomic_store_explicit(&pool->avail_w, w->n_free + w->n_lru, memory_order_relaxed);
    int32_t used = pool->n_blocks - n_free - n_lru;
    int32_t peak = atomic_load_explicit(&pool->peak, memory_order_relaxed);
    if (used > peak) atomic_store_explicit(&pool->peak, used, memory_order_release);
    atomic_store_explicit(&pool->counts, (uint64_t)(uint32_t)used | (uint64_t)n_lru << 32,
                          memory_order_release);
}

static void lru_push_tail(kiln_kv_pool *pool, int32_t b) {
    pool_class *c = class_of(pool, b);
    pool->lru_prev[b] = c->lru_tail;
    pool->lru_next[b] = -1;
    if (c->lru_tail >= 0)
        pool->lru_next[c->lru_tail] = b;
    else
        c->lru_head = b;
    c->lru_tail = b;
    c->n_lru++;
}

static void lru_remove(kiln_kv_pool *pool, int32_t b) {
    pool_class *c = class_of(pool, b);
    int32_t p = pool->lru_prev[b], n = pool->lru_next[b];
    if (p >= 0)
        pool->lru_next[p] = n;
    else
        c->lru_head = n;
    if (n >= 0)
        pool->lru_prev[n] = p;
    else
        c->lru_tail = p;
    pool->lru_prev[b] = pool->lru_next[b] = -1;
    c->n_lru--;
}

static void push_free(kiln_kv_pool *pool, int32_t b) {
    pool_class *c = class_of(pool, b);
    c->free_list[c->n_free++] = b;
}

int32_t kiln_kv_pool_alloc_class(kiln_kv_pool *pool, int cls) {
    if (!pool || cls < 0 || cls >= pool->n_classes) return -1;
    pool_class *c = &pool->cls[cls];
    int32_t b;
    if (c->n_free > 0) {
        b = c->free_list[--c->n_free];
    } else if (c->n_lru > 0) {
        /* Evict the least recently idle cached block: its owner forgets it first. */
        b = c->lru_head;
        lru_remove(pool, b);
        pool->cached[b] = 0;
        atomic_fetch_add_explicit(&pool->evictions, 1, memory_order_relaxed);
        if (pool->hooks.on_evict) pool->hooks.on_evict(pool->hooks.user, b);
    } else {
        return -1;
    }
    pool->refcount[b] = 1;
    publish(pool);
    return b;
}

int32_t kiln_kv_pool_alloc(kiln_kv_pool *pool) {
    return pool ? kiln_kv_pool_alloc_class(pool, pool->wclass) : -1;
}

int kiln_kv_pool_block_class(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return -1;
    return pool->format[block];
}

int kiln_kv_pool_write_class(const kiln_kv_pool *pool) {
    return pool ? pool->wclass : KILN_KV_CLASS_MAIN;
}

int32_t kiln_kv_pool_n_available_class(const kiln_kv_pool *pool, int cls) {
    if (!pool || cls < 0 || cls >= pool->n_classes) return 0;
    return pool->cls[cls].n_free + pool->cls[cls].n_lru;
}

void kiln_kv_pool_note_converted(kiln_kv_pool *pool) {
    if (pool) atomic_fetch_add_explicit(&pool->converted, 1, memory_order_relaxed);
}

kiln_dtype kiln_kv_pool_class_format_k(const kiln_kv_pool *pool, int cls) {
    if (!pool || cls < 0 || cls >= pool->n_classes) return KILN_DTYPE_COUNT;
    return pool->cls[cls].fk;
}

kiln_dtype kiln_kv_pool_class_format_v(const kiln_kv_pool *pool, int cls) {
    if (!pool || cls < 0 || cls >= pool->n_classes) return KILN_DTYPE_COUNT;
    return pool->cls[cls].fv;
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
            push_free(pool, block);
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
        push_free(pool, block);
        publish(pool);
    }
}

bool kiln_kv_pool_is_cached(const kiln_kv_pool *pool, int32_t block) {
    return pool && block >= 0 && block < pool->n_blocks && pool->cached[block];
}

int32_t kiln_kv_pool_n_available(const kiln_kv_pool *pool) {
    if (!pool) return 0;
    if (pool->n_classes == 1) {
        uint64_t c = atomic_load_explicit(&pool->counts, memory_order_acquire);
        return pool->n_blocks - (int32_t)(uint32_t)c;
    }
    return atomic_load_explicit(&pool->avail_w, memory_order_acquire);
}

int32_t kiln_kv_pool_refcount(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return -1;
    return pool->refcount[block];
}

kiln_dtype kiln_kv_pool_block_format(const kiln_kv_pool *pool, int32_t block) {
    return kiln_kv_pool_block_format_k(pool, block);
}

kiln_dtype kiln_kv_pool_block_format_k(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return KILN_DTYPE_COUNT;
    return pool->cls[pool->format[block]].fk;
}

kiln_dtype kiln_kv_pool_block_format_v(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return KILN_DTYPE_COUNT;
    return pool->cls[pool->format[block]].fv;
}

size_t kiln_kv_pool_row_bytes_k(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return 0;
    return pool->cls[pool->format[block]].row_k;
}

size_t kiln_kv_pool_row_bytes_v(const kiln_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return 0;
    return pool->cls[pool->format[block]].row_v;
}

int32_t kiln_kv_pool_head_dim(const kiln_kv_pool *pool) {
    return pool ? pool->head_dim : 0;
}

int64_t kiln_kv_pool_storage_bytes(const kiln_kv_pool *pool) {
    if (!pool) return 0;
    int64_t t = 0;
    for (int i = 0; i < pool->n_classes; i++)
        t += (int64_t)pool->cls[i].total_k + (int64_t)pool->cls[i].total_v;
    return t;
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
    for (int i = 0; i < pool->n_classes; i++) {
        s.class_held[i] = atomic_load_explicit(&pool->held[i], memory_order_relaxed);
        s.class_blocks[i] = pool->cls[i].n;
    }
    s.converted = atomic_load_explicit(&pool->converted, memory_order_relaxed);
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
int32_t kiln_kv_pool_n_layers_stored(const kiln_kv_pool *pool) {
    return pool ? pool->n_stored : 0;
}
bool kiln_kv_pool_holds_layer(const kiln_kv_pool *pool, int32_t layer) {
    return pool && layer >= 0 && layer < pool->n_layer && pool->slot[layer] >= 0;
}
int32_t kiln_kv_pool_window(const kiln_kv_pool *pool) {
    return pool ? pool->window : 0;
}
kiln_dtype kiln_kv_pool_dtype(const kiln_kv_pool *pool) {
    return pool ? pool->cls[pool->wclass].fk : KILN_DTYPE_COUNT;
}
kiln_dtype kiln_kv_pool_dtype_v(const kiln_kv_pool *pool) {
    return pool ? pool->cls[pool->wclass].fv : KILN_DTYPE_COUNT;
}
int32_t kiln_kv_pool_n_blocks(const kiln_kv_pool *pool) {
    return pool ? pool->n_blocks : 0;
}

kiln_backend *kiln_kv_pool_backend(const kiln_kv_pool *pool) {
    return pool ? pool->be : NULL;
}

static void *region(kiln_kv_pool *pool, int32_t layer, int32_t block, int v) {
    if (!pool || layer < 0 || layer >= pool->n_layer || block < 0 || block >= pool->n_blocks ||
        pool->slot[layer] < 0)
        return NULL;
    const pool_class *c = class_of(pool, block);
    size_t idx = (size_t)pool->slot[layer] * (size_t)c->n + (size_t)(block - c->base);
    return v ? c->v + idx * c->region_v : c->k + idx * c->region_k;
}

void *kiln_kv_pool_k(kiln_kv_pool *pool, int32_t layer, int32_t block) {
    return region(pool, layer, block, 0);
}

void *kiln_kv_pool_v(kiln_kv_pool *pool, int32_t layer, int32_t block) {
    return region(pool, layer, block, 1);
}

kiln_status kiln_kv_pool_copy_block(kiln_kv_pool *pool, int32_t dst, int32_t src,
                                    kiln_error *err) {
    if (!pool || dst < 0 || src < 0 || dst >= pool->n_blocks || src >= pool->n_blocks ||
        dst == src)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool copy: bad blocks (dst %" PRId32 ", src %" PRId32 ")", dst,
                              src);
    if (pool->format[dst] != pool->format[src])
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv pool copy: blocks %" PRId32 " and %" PRId32
                              " are of different formats",
                              dst, src);
    const pool_class *c = class_of(pool, src);
    for (int32_t l = 0; l < pool->n_layer; l++)
        for (int v = 0; v < 2 && pool->slot[l] >= 0; v++) { /* only the layers it holds */
            void *d = region(pool, l, dst, v);
            const void *sp = region(pool, l, src, v);
            const size_t bytes = v ? c->region_v : c->region_k;
            /* regions are KILN_KV_ALIGNMENT-padded, so a whole number of floats; the backend's
             * copy moves bytes on the device that holds them */
            if (pool->be && pool->be->ops->copy)
                pool->be->ops->copy(pool->be, d, sp, (int64_t)(bytes / sizeof(float)));
            else
                memcpy(d, sp, bytes);
        }
    return KILN_OK;
}
