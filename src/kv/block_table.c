/* block_table.c - a sequence's table of KV block ids (see kv_pool.h). */
#include <inttypes.h>
#include <stdlib.h>

#include "kv/kv_pool.h"
#include "util/error.h"

static int table_ok(const kiln_block_table *bt) {
    return bt->n_blocks >= 0 && bt->cap >= bt->n_blocks && (bt->cap == 0 || bt->blocks != NULL) &&
           bt->n_freed >= 0 && bt->n_freed <= bt->n_blocks;
}

/* Drop the last entry: unref its block unless it is a hole. */
static void pop_last(kiln_block_table *bt, kiln_kv_pool *pool) {
    const int32_t b = bt->blocks[--bt->n_blocks];
    if (bt->n_blocks < bt->n_freed)
        bt->n_freed = bt->n_blocks; /* a hole */
    else
        kiln_kv_pool_unref(pool, b);
}

/* Grow bt's buffer to hold at least `need` ids. Leaves bt untouched on failure. */
static kiln_status table_grow(kiln_block_table *bt, int32_t need, kiln_error *err) {
    if (need <= bt->cap) return KILN_OK;
    int32_t cap = bt->cap < 4 ? 4 : bt->cap;
    while (cap < need) cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
    int32_t *b = realloc(bt->blocks, (size_t)cap * sizeof(int32_t));
    if (!b)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "block table: allocating %zu bytes for %" PRId32 " block ids failed",
                              (size_t)cap * sizeof(int32_t), cap);
    bt->blocks = b;
    bt->cap = cap;
    return KILN_OK;
}

kiln_status kiln_block_table_reserve(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens,
                                     kiln_error *err) {
    if (!bt || !pool)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "block table reserve: %s is NULL",
                              !bt ? "table" : "pool");
    if (n_tokens < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table reserve: n_tokens must be >= 0 (got %" PRId32 ")",
                              n_tokens);
    if (!table_ok(bt))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table reserve: malformed table (n_blocks %" PRId32
                              ", cap %" PRId32 ", blocks %s)",
                              bt->n_blocks, bt->cap, bt->blocks ? "set" : "NULL");
    int32_t need = kiln_kv_blocks_for_tokens(n_tokens, kiln_kv_pool_block_size(pool));
    if (need <= bt->n_blocks) return KILN_OK;
    int32_t extra = need - bt->n_blocks;
    int32_t n_free = kiln_kv_pool_n_available(pool); /* free + cached (evicted on demand) */
    if (extra > n_free)
        return kiln_error_set(
            err, KILN_ERR_OUT_OF_MEMORY,
            "KV cache full: %" PRId32 " tokens need %" PRId32 " more blocks of %" PRId32
            " positions, only %" PRId32 " of %" PRId32 " are free or evictable",
            n_tokens, extra, kiln_kv_pool_block_size(pool), n_free, kiln_kv_pool_n_blocks(pool));
    kiln_status st = table_grow(bt, need, err);
    if (st != KILN_OK) return st;
    /* Stage: take the blocks; commit n_blocks only once all were taken. */
    int32_t have = bt->n_blocks;
    for (int32_t i = have; i < need; i++) {
        int32_t b = kiln_kv_pool_alloc(pool);
        if (b < 0) { /* the free count said otherwise: give back what we took */
            for (int32_t j = i - 1; j >= have; j--) kiln_kv_pool_unref(pool, bt->blocks[j]);
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "block table reserve: pool reported %" PRId32
                                  " free blocks but ran out after %" PRId32,
                                  n_free, i - have);
        }
        bt->blocks[i] = b;
    }
    bt->n_blocks = need;
    return KILN_OK;
}

void kiln_block_table_truncate(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens) {
    if (!bt || !pool || !table_ok(bt)) return;
    int32_t keep = kiln_kv_blocks_for_tokens(n_tokens, kiln_kv_pool_block_size(pool));
    while (bt->n_blocks > keep) pop_last(bt, pool);
}

int32_t kiln_block_table_free_below(kiln_block_table *bt, kiln_kv_pool *pool, int32_t pos) {
    if (!bt || !pool || pos <= 0 || !table_ok(bt)) return 0;
    int32_t upto = pos / kiln_kv_pool_block_size(pool); /* blocks wholly below pos */
    if (upto > bt->n_blocks) upto = bt->n_blocks;
    int32_t n = 0;
    for (; bt->n_freed < upto; bt->n_freed++, n++) {
        kiln_kv_pool_unref(pool, bt->blocks[bt->n_freed]);
        bt->blocks[bt->n_freed] = -1;
    }
    return n;
}

void kiln_block_table_release(kiln_block_table *bt, kiln_kv_pool *pool) {
    if (!bt) return;
    if (pool && table_ok(bt))
        while (bt->n_blocks > 0) pop_last(bt, pool);
    free(bt->blocks);
    bt->blocks = NULL;
    bt->n_blocks = 0;
    bt->cap = 0;
    bt->n_freed = 0;
}

kiln_status kiln_block_table_fork(const kiln_block_table *src, kiln_block_table *dst,
                                  kiln_kv_pool *pool, kiln_error *err) {
    if (!src || !dst || !pool)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "block table fork: %s is NULL",
                              !src   ? "src"
                              : !dst ? "dst"
                                     : "pool");
    if (src == dst)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table fork: src and dst are the same table");
    if (!table_ok(src) || !table_ok(dst))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table fork: malformed %s table",
                              !table_ok(src) ? "src" : "dst");
    if (dst->n_blocks != 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table fork: dst must be empty (holds %" PRId32 " blocks)",
                              dst->n_blocks);
    /* Check every block before touching any refcount, so failure changes nothing. */
    for (int32_t i = 0; i < src->n_blocks; i++) {
        int32_t rc = kiln_kv_pool_refcount(pool, src->blocks[i]);
        if (rc <= 0 || rc == INT32_MAX)
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "block table fork: src entry %" PRId32 " (block %" PRId32
                                  ") is %s",
                                  i, src->blocks[i],
                                  rc < 0    ? "out of range"
                                  : rc == 0 ? "a free block"
                                            : "at the maximum refcount");
    }
    kiln_status st = table_grow(dst, src->n_blocks, err);
    if (st != KILN_OK) return st;
    for (int32_t i = 0; i < src->n_blocks; i++) {
        kiln_kv_pool_ref(pool, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = src->n_blocks;
    return KILN_OK;
}

kiln_status kiln_block_table_share(kiln_block_table *bt, kiln_kv_pool *pool, const int32_t *blocks,
                                   int32_t n, kiln_error *err) {
    if (!bt || !pool || n < 0 || (n > 0 && !blocks))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table share: bad argument (bt %p, pool %p, n %" PRId32 ")",
                              (void *)bt, (void *)pool, n);
    if (!table_ok(bt))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "block table share: malformed table");
    if (n == 0) return KILN_OK;
    if (n > INT32_MAX - bt->n_blocks)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "block table share: too many blocks");
    kiln_status st = table_grow(bt, bt->n_blocks + n, err);
    if (st != KILN_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        if (kiln_kv_pool_acquire(pool, blocks[i])) {
            bt->blocks[bt->n_blocks + i] = blocks[i];
            continue;
        }
        int32_t rc = kiln_kv_pool_refcount(pool, blocks[i]);
        for (int32_t j = i - 1; j >= 0; j--) kiln_kv_pool_unref(pool, blocks[j]);
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "block table share: block %" PRId32 " (entry %" PRId32 ") is %s",
                              blocks[i], i,
                              rc < 0    ? "out of range"
                              : rc == 0 ? "free"
                                        : "at the maximum refcount");
    }
    bt->n_blocks += n;
    return KILN_OK;
}

kiln_status kiln_block_table_holes(kiln_block_table *bt, int32_t n, kiln_error *err) {
    if (!bt || n < 0 || !table_ok(bt) || bt->n_blocks != 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table holes: needs an empty table and n >= 0 (got %" PRId32
                              ")",
                              n);
    kiln_status st = table_grow(bt, n, err);
    if (st != KILN_OK) return st;
    for (int32_t i = 0; i < n; i++) bt->blocks[i] = -1;
    bt->n_blocks = bt->n_freed = n;
    return KILN_OK;
}

kiln_status kiln_block_table_fork_prefix(const kiln_block_table *src, kiln_block_table *dst,
                                         kiln_kv_pool *pool, int32_t n_tokens, kiln_error *err) {
    if (!src || !dst || !pool || src == dst || !table_ok(src) || !table_ok(dst) ||
        dst->n_blocks != 0 || n_tokens < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table fork_prefix: bad arguments (need two distinct tables, "
                              "dst empty, n_tokens >= 0)");
    const int32_t bs = kiln_kv_pool_block_size(pool);
    const int32_t n_full = n_tokens / bs, n_blocks = kiln_kv_blocks_for_tokens(n_tokens, bs);
    if (n_blocks > src->n_blocks)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "block table fork_prefix: %" PRId32 " positions need %" PRId32
                              " blocks, src has %" PRId32,
                              n_tokens, n_blocks, src->n_blocks);
    kiln_status st = table_grow(dst, n_blocks, err);
    if (st != KILN_OK) return st;
    int32_t copy = -1;
    if (n_blocks > n_full) {
        const int32_t from = src->blocks[n_full];
        copy = kiln_kv_pool_alloc_class(pool, kiln_kv_pool_block_class(pool, from));
        if (copy < 0)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "block table fork_prefix: no free block for the copy of the "
                                  "partial block");
        if ((st = kiln_kv_pool_copy_block(pool, copy, from, err))) {
            kiln_kv_pool_unref(pool, copy);
            return st;
        }
    }
    kiln_block_table part = {.blocks = src->blocks, .n_blocks = n_full, .cap = n_full};
    if ((st = kiln_block_table_fork(&part, dst, pool, err))) {
        if (copy >= 0) kiln_kv_pool_unref(pool, copy);
        return st;
    }
    if (copy >= 0) dst->blocks[dst->n_blocks++] = copy;
    return KILN_OK;
}
