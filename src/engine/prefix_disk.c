/*
 * prefix_disk.c - the disk tier's engine side (issue 13; the tier itself is kv/disk_tier.c):
 * write-behind of cached blocks, and reading a RAM miss's blocks back while the request waits
 * in KILN_SEQ_LOADING and everything else keeps stepping.
 *
 * When a block is written. A cached block is written behind when it becomes idle (its last
 * owner let go), not only when RAM evicts it: the copy into the tier's queue is a memcpy on
 * the engine thread (the tier's I/O thread does the rest), each block is written once (the
 * tier already having it is checked first), and a restart then finds every block a finished
 * request left, not only the ones RAM happened to evict. kiln_engine_destroy flushes the queue.
 *
 * Payload layout (what the tier stores as kv_bytes): for each layer, the block's K rows then
 * its V rows, block_size * kv_dim elements each in the pool's page format, without the pool's
 * region padding.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "kv/disk_tier.h"
#include "kv/kv_format.h"
#include "util/error.h"

/* one layer's K (or V) rows of a block in the write class's formats (the indexed blocks') */
static size_t rows_bytes(const kiln_engine *e, int v) {
    const kiln_model_config *c = &e->model->cfg;
    const kiln_kv_geom g = {(int64_t)c->n_head_kv * c->head_dim, c->n_head_kv, c->head_dim};
    return (size_t)e->p.block_size *
           kiln_kv_format_row_bytes_geom(
               v ? kiln_kv_pool_dtype_v(e->pool) : kiln_kv_pool_dtype(e->pool), &g);
}

static void gather(kiln_engine *e, int32_t block, uint8_t *out) {
    const size_t rk = rows_bytes(e, 0), rv = rows_bytes(e, 1);
    for (int32_t l = 0; l < e->model->cfg.n_layer; l++) {
        e->be->ops->download(e->be, out, kiln_kv_pool_k(e->pool, l, block), rk);
        e->be->ops->download(e->be, out + rk, kiln_kv_pool_v(e->pool, l, block), rv);
        out += rk + rv;
    }
}

static void scatter(kiln_engine *e, int32_t block, const uint8_t *in) {
    const size_t rk = rows_bytes(e, 0), rv = rows_bytes(e, 1);
    for (int32_t l = 0; l < e->model->cfg.n_layer; l++) {
        e->be->ops->upload(e->be, kiln_kv_pool_k(e->pool, l, block), in, rk);
        e->be->ops->upload(e->be, kiln_kv_pool_v(e->pool, l, block), in + rk, rv);
        in += rk + rv;
    }
}

/* The prefix cache's idle callback: queue the block for the disk unless it is there. */
static void on_idle(void *user, int32_t block, uint64_t hash, uint64_t parent,
                    const int32_t *tokens, const void *state) {
    kiln_engine *e = user;
    bool has_state = false;
    if (kiln_disk_tier_has(e->disk, hash, &has_state) && (has_state || !state)) return;
    gather(e, block, e->disk_buf);
    (void)kiln_disk_tier_put(e->disk, hash, parent, tokens, e->disk_buf, state);
}

kiln_status kiln_engine_prefix_disk_open(kiln_engine *e, uint64_t fingerprint, kiln_error *err) {
    const kiln_model_config *c = &e->model->cfg;
    kiln_disk_tier_params dp = {
        .dir = e->cache_dir,
        .max_bytes = e->p.cache_disk_max,
        .fingerprint = fingerprint,
        .ns = kiln_prefix_cache_namespace(e->pcache),
        /* K's format, with V's in the next byte when they differ */
        .page_format = kiln_kv_pool_dtype_v(e->pool) == kiln_kv_pool_dtype(e->pool)
                           ? (int32_t)kiln_kv_pool_dtype(e->pool)
                           : (int32_t)kiln_kv_pool_dtype(e->pool) |
                                 (int32_t)kiln_kv_pool_dtype_v(e->pool) << 8,
        .n_layer = c->n_layer,
        .kv_dim = (int64_t)c->n_head_kv * c->head_dim,
        .block_size = e->p.block_size,
        .kv_bytes = e->disk_kv_bytes,
        .state_bytes = e->rec_state_floats * (int64_t)sizeof(float),
    };
    if (e->p.cache_disk_max < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cache_disk_max must be >= 0 (got %lld)",
                              (long long)e->p.cache_disk_max);
    if (!(e->disk_buf = malloc((size_t)e->disk_kv_bytes)))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (disk tier buffer)");
    kiln_status st = kiln_disk_tier_open(&dp, &e->disk, err);
    if (st) {
        kiln_error_prefix(err, "cache_dir: ");
        return st;
    }
    if (!e->p.cache_disk_max) e->p.cache_disk_max = (int64_t)16 << 30;
    kiln_prefix_cache_set_idle_fn(e->pcache, on_idle, e);
    return KILN_OK;
}

void kiln_engine_prefix_disk_close(kiln_engine *e) {
    if (e->pcache) kiln_prefix_cache_set_idle_fn(e->pcache, NULL, NULL);
    kiln_disk_tier_close(e->disk); /* flushes the queued writes */
    e->disk = NULL;
    free(e->disk_buf);
    e->disk_buf = NULL;
}

void kiln_engine_prefix_disk_stats(const kiln_engine *e, kiln_engine_stats *out) {
    if (!e->disk) return;
    kiln_disk_tier_stats ds = kiln_disk_tier_get_stats(e->disk);
    out->disk_reads = ds.reads;
    out->disk_writes = ds.writes;
    out->disk_read_bytes = ds.read_bytes;
    out->disk_write_bytes = ds.write_bytes;
    out->disk_corrupt = ds.corrupt;
    out->disk_files = ds.files;
    out->disk_bytes = ds.bytes;
}

bool kiln_engine_prefix_load_done(const kiln_seq *s) {
    return !s->fetch || atomic_load(&s->fetch->done);
}

void kiln_engine_prefix_cancel_load(kiln_engine *e, kiln_seq *s) {
    (void)e;
    kiln_disk_fetch_free(s->fetch);
    s->fetch = NULL;
}

bool kiln_engine_prefix_start_load(kiln_engine *e, kiln_seq *s, int32_t first) {
    if (!e->disk || !e->pcache || s->tokens.n < 2) return false;
    const int32_t bs = e->p.block_size;
    int32_t limit = (int32_t)((s->tokens.n - 1) / bs);
    if (limit > s->n_hashed) limit = s->n_hashed; /* lookup hashed these */
    int32_t end = first;
    for (int32_t i = first; i < limit; i++) {
        bool has_state = false;
        if (!kiln_disk_tier_has(e->disk, s->bhash[i], &has_state)) break;
        if (e->rec_state_floats <= 0 || has_state) end = i + 1;
    }
    const int32_t n = end - first;
    if (n <= 0) return false;
    uint64_t *parents = malloc((size_t)n * sizeof *parents);
    if (!parents) return false;
    for (int32_t i = 0; i < n; i++) parents[i] = kiln_engine_prefix_parent(e, s, first + i);
    s->fetch = kiln_disk_tier_fetch(e->disk, s->bhash + first, parents,
                                    s->tokens.data + (size_t)first * bs, n);
    free(parents);
    if (!s->fetch) return false;
    s->fetch_first = first;
    return true;
}

void kiln_engine_prefix_finish_load(kiln_engine *e, kiln_seq *s) {
    kiln_disk_fetch *f = s->fetch;
    s->fetch = NULL;
    if (!f) return;
    const int32_t bs = e->p.block_size, first = s->fetch_first;
    const size_t state_bytes = (size_t)e->rec_state_floats * sizeof(float);
    /* hold every block of the chain while the loaded ones are allocated (an allocation may
     * evict the least recently idle block, which could be one of them) */
    int32_t *held = malloc(((size_t)first + (size_t)f->n_ok + 1) * sizeof *held);
    int32_t n_held = 0;
    bool chain = held != NULL;
    for (int32_t i = 0; chain && i < first; i++) {
        int32_t b =
            kiln_prefix_cache_find(e->pcache, s->bhash[i], kiln_engine_prefix_parent(e, s, i),
                                   s->tokens.data + (size_t)i * bs);
        chain = b >= 0 && kiln_kv_pool_acquire(e->pool, b);
        if (chain) held[n_held++] = b;
    }
    for (int32_t k = 0; chain && k < f->n_ok; k++) {
        const int32_t i = first + k;
        const uint64_t parent = kiln_engine_prefix_parent(e, s, i);
        const int32_t *toks = s->tokens.data + (size_t)i * bs;
        int32_t b = kiln_prefix_cache_find(e->pcache, s->bhash[i], parent, toks);
        if (b >= 0) { /* someone else brought it back meanwhile */
            chain = kiln_kv_pool_acquire(e->pool, b);
            if (chain) held[n_held++] = b;
            continue;
        }
        if ((b = kiln_kv_pool_alloc(e->pool)) < 0) break;
        held[n_held++] = b;
        scatter(e, b, f->kv + (size_t)k * (size_t)e->disk_kv_bytes);
        chain = kiln_prefix_cache_insert(e->pcache, s->bhash[i], parent, toks, b);
        if (chain && state_bytes && f->has_state[k])
            (void)kiln_prefix_cache_set_state(e->pcache, b, f->state + (size_t)k * state_bytes);
    }
    /* let go: the loaded blocks are now cached and idle, at the LRU's most recent end, and
     * admission (next) shares them */
    for (int32_t i = n_held - 1; i >= 0; i--) kiln_kv_pool_unref(e->pool, held[i]);
    free(held);
    kiln_disk_fetch_free(f);
}
