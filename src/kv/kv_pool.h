/*
 * kv_pool.h - the paged KV cache's block pool (DESIGN.md "KV cache"; vLLM's PagedAttention,
 * Kwon et al. 2023). A block holds the K and V rows of block_size consecutive positions of
 * one sequence, for every layer of the pool (all of the model's, or a layer group's, below):
 * block id b has, per layer l, K storage
 * [block_size][kv_dim] and V storage [block_size][kv_dim] in the pool's dtype. Blocks are
 * refcounted (a shared prefix is one block with several owners) and carry a format tag.
 *
 * Storage: one 64-byte aligned allocation for all K and one for all V, made through the
 * pool's backend (kiln_kv_pool_params.backend: host memory on the CPU, device memory on a GPU)
 * or, without one, on the host. The (layer, block)
 * region is block_size * kv_dim elements, contiguous, row-major, padded up to a multiple of
 * KILN_KV_ALIGNMENT bytes so every region starts 64-byte aligned; region (l, b) sits at
 * offset (slot(l) * n_blocks + b) * region_bytes, slot(l) being l's index among the pool's
 * layers. Contents are unspecified until written (the attention kernels only read positions
 * a sequence has written).
 *
 * Layer groups (issue 14 item 4; the engine's use: src/engine/kv_window.c). A pool may hold
 * storage for a subset of the model's layers (kiln_kv_pool_params.layers): a model with
 * sliding-window layers gets one pool for its full-attention layers and one for its sliding
 * layers (window > 0), each sequence one table in each. A sliding group's table gives back
 * blocks no query can read any more (kiln_block_table_free_below), leaving holes (-1); the
 * attention kernels then read only the blocks inside each token's window.
 *
 * Internal invariants (unref/ref of a free block, an out-of-range block id) are bugs in the
 * caller, not bad user input: such a call is ignored (the free list is never corrupted),
 * one line goes to stderr and kiln_kv_pool_invariant_violations() counts it. Nothing aborts.
 *
 * Threading: a pool is used by one thread at a time (the engine thread); stats
 * (kiln_kv_pool_get_stats, kiln_kv_pool_n_free, kiln_kv_pool_invariant_violations) may be
 * read from any thread at any time (C11 atomics).
 */
#ifndef KILN_KV_KV_POOL_H
#define KILN_KV_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "backend/backend.h"
#include "tensor/dtype.h"

#define KILN_KV_DEFAULT_BLOCK_SIZE 16
/* Alignment in bytes of the storage and of every (layer, block) region. */
#define KILN_KV_ALIGNMENT 64

typedef struct kiln_kv_pool kiln_kv_pool;

typedef struct kiln_kv_pool_params {
    int32_t n_layer;       /* >= 1 */
    int64_t kv_dim;        /* n_head_kv * head_dim, >= 1 */
    int32_t block_size;    /* tokens per block; 0 = KILN_KV_DEFAULT_BLOCK_SIZE */
    int32_t n_blocks;      /* >= 1: blocks of the main class */
    kiln_dtype dtype;      /* K's page format (kv/kv_format.h), and V's unless dtype_v_set */
    kiln_backend *backend; /* borrowed, must outlive the pool; storage is allocated through
                              it (buf_alloc). NULL: host memory (aligned_alloc) */
    bool dtype_v_set;      /* V rows use dtype_v instead of dtype */
    kiln_dtype dtype_v;
    int32_t head_dim;      /* elements per KV head (0: kv_dim, one head): a format's geometry */
    /* The delayed transition (DESIGN.md "Delayed quantization"): n_blocks_hi > 0 adds a second
     * class of n_blocks_hi blocks, ids n_blocks .. n_blocks + n_blocks_hi - 1, whose K and V
     * rows are in dtype_hi. kiln_kv_pool_alloc then takes new blocks from it (the write
     * class); kiln_kv_pool_alloc_class(pool, KILN_KV_CLASS_MAIN) takes the main class, into
     * which the engine converts a sequence's committed full blocks. */
    int32_t n_blocks_hi;
    kiln_dtype dtype_hi;
    /* Layer groups (src/engine/kv_window.c; vLLM's hybrid KV cache manager keeps
     * one block pool per attention kind in the same way): layers NULL stores every layer;
     * else layers[l] (n_layer entries, copied) says whether this pool holds storage for layer
     * l. A block then costs only its group's layers, and kiln_kv_pool_k / _v return NULL for
     * a layer the pool does not hold. A mask selecting no layer makes a pool of block ids
     * without storage (the full group of a model whose every layer has a window). */
    const bool *layers;
    /* > 0: the pool of a sliding-window group with window W: the attention kernels read a
     * sequence's sliding table (kiln_batch_seq.block_table_swa) for its blocks, which has holes
     * (-1) for blocks outside every window that can still be computed. 0: a full group. */
    int32_t window;
} kiln_kv_pool_params;

/* Block classes: each has its own storage, free list and LRU, and one K and one V format. */
enum { KILN_KV_CLASS_MAIN = 0, KILN_KV_CLASS_HI = 1, KILN_KV_N_CLASSES = 2 };

typedef struct kiln_kv_pool_stats {
    int32_t n_blocks;  /* total */
    int32_t used;      /* refcount > 0 */
    int32_t cached;    /* refcount 0 but kept for a prefix cache: evictable */
    int32_t free;      /* n_blocks - used - cached */
    int32_t peak;      /* max of used since creation or the last kiln_kv_pool_reset_peak */
    int32_t reserved_; /* 0: explicit padding, so two stats compare with memcmp */
    int64_t evictions; /* cached blocks handed out again by kiln_kv_pool_alloc */
    /* per class (KILN_KV_CLASS_MAIN, _HI): blocks held (used + cached) and total; a pool
     * without a hi class has held[1] = blocks[1] = 0 */
    int32_t class_held[KILN_KV_N_CLASSES];
    int32_t class_blocks[KILN_KV_N_CLASSES];
    int64_t converted; /* blocks converted into the main class (kiln_kv_pool_note_converted) */
} kiln_kv_pool_stats;

/**
 * The block lifecycle (DESIGN.md "Block lifecycle"): a block is free, used (refcount > 0), or
 * cached and evictable (refcount 0 while a prefix cache still indexes it, in an LRU ordered
 * by when it became idle). A prefix cache marks the blocks it indexes
 * (kiln_kv_pool_set_cached) and learns of their fate through these hooks, which the pool
 * calls on the engine thread, inside the pool call that caused them.
 */
typedef struct kiln_kv_pool_hooks {
    void *user;
    /* a cached block is being reused by kiln_kv_pool_alloc (least recently idle first): forget
     * it. Its contents are still intact during the call. */
    void (*on_evict)(void *user, int32_t block);
    /* a cached block's last owner let go: it is now evictable (write-behind may copy it; its
     * contents stay intact until on_evict) */
    void (*on_idle)(void *user, int32_t block);
} kiln_kv_pool_hooks;

/**
 * Allocate the pool's storage: per class, n_layer * blocks * block_size rows of K and of V in
 * the class's formats, each (layer, block) region padded to KILN_KV_ALIGNMENT bytes; exactly
 * n_blocks * kiln_kv_block_bytes_kv(dtype, dtype_v) + n_blocks_hi * kiln_kv_block_bytes(dtype_hi).
 * All blocks start free. *out is set only on success.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL p/out, or a field out of range, named in the
 * message), KILN_ERR_OUT_OF_MEMORY (the size overflows, or the allocation failed; the
 * message gives the bytes requested).
 */
kiln_status kiln_kv_pool_create(const kiln_kv_pool_params *p, kiln_kv_pool **out, kiln_error *err);
/** Free the pool and its storage. NULL is a no-op. Block tables still pointing at it must not
 *  be used afterwards (release them first). */
void kiln_kv_pool_destroy(kiln_kv_pool *pool);

/**
 * Bytes one block takes (K and V, all layers, region padding included):
 * 2 * n_layer * round_up(block_size * kv_dim * sizeof(dtype), KILN_KV_ALIGNMENT).
 * block_size 0 means KILN_KV_DEFAULT_BLOCK_SIZE. Returns 0 for an invalid argument
 * (n_layer < 1, kv_dim < 1, block_size < 0, dtype not a KV page format) or when the size overflows.
 */
int64_t kiln_kv_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t block_size, kiln_dtype dtype);
/** kiln_kv_block_bytes with K rows in k_dtype and V rows in v_dtype (each region padded):
 *  n_layer * (round_up(block_size * row_bytes(k), 64) + round_up(block_size * row_bytes(v), 64)).
 *  0 as for kiln_kv_block_bytes, and when kv_dim is not a multiple of a format's block. */
int64_t kiln_kv_block_bytes_kv(int32_t n_layer, int64_t kv_dim, int32_t block_size,
                               kiln_dtype k_dtype, kiln_dtype v_dtype);
/** kiln_kv_block_bytes_kv for rows of KV heads of head_dim elements (0: one head of kv_dim):
 *  what a pool with that head_dim lays out; formats with per-head side data (TurboQuant's
 *  norms) need it. 0 as for kiln_kv_block_bytes_kv, and when the format cannot hold the
 *  geometry. */
int64_t kiln_kv_block_bytes_geom(int32_t n_layer, int64_t kv_dim, int32_t head_dim,
                                 int32_t block_size, kiln_dtype k_dtype, kiln_dtype v_dtype);

/** Blocks needed to hold n_tokens positions: ceil(n_tokens / block_size); 0 for n_tokens <= 0
 *  or block_size <= 0. Never overflows. */
int32_t kiln_kv_blocks_for_tokens(int32_t n_tokens, int32_t block_size);

/**
 * How many blocks fit in a memory budget of `bytes` (the CLI's --kv-memory):
 * floor(bytes / kiln_kv_block_bytes(...)), clamped to INT32_MAX. Computed in 64-bit with
 * overflow checks, so a budget of many TiB is fine. Arguments as for kiln_kv_block_bytes.
 * Returns 0 for an invalid argument, bytes <= 0, or a budget smaller than one block.
 */
int32_t kiln_kv_pool_blocks_for_budget(int32_t n_layer, int64_t kv_dim, int32_t block_size,
                                       kiln_dtype dtype, int64_t bytes);

/** Take a block of class cls (refcount 1, not cached): as kiln_kv_pool_alloc, from that
 *  class's free list, else its LRU. -1 when the class has neither or does not exist. */
int32_t kiln_kv_pool_alloc_class(kiln_kv_pool *pool, int cls);
/** The class of `block` (KILN_KV_CLASS_MAIN or _HI); -1 out of range. */
int kiln_kv_pool_block_class(const kiln_kv_pool *pool, int32_t block);
/** The class kiln_kv_pool_alloc takes from: _HI when the pool has one, else _MAIN. */
int kiln_kv_pool_write_class(const kiln_kv_pool *pool);
/** Blocks of class cls kiln_kv_pool_alloc_class can hand out now (free + cached). */
int32_t kiln_kv_pool_n_available_class(const kiln_kv_pool *pool, int cls);
/** Count one conversion in the stats (the engine's delayed transition). */
void kiln_kv_pool_note_converted(kiln_kv_pool *pool);
/** K (or V) format of class cls; KILN_DTYPE_COUNT when it does not exist. */
kiln_dtype kiln_kv_pool_class_format_k(const kiln_kv_pool *pool, int cls);
kiln_dtype kiln_kv_pool_class_format_v(const kiln_kv_pool *pool, int cls);
/** Take a block of the write class (refcount 1, format = that class's, not cached): a free one (LIFO, so
 *  a just-freed block is reused first), else the least recently idle cached block, evicted
 *  (hooks.on_evict is called first); -1 when there is neither (or pool is NULL). O(1).
 *  Updates used/cached/peak/evictions. */
int32_t kiln_kv_pool_alloc(kiln_kv_pool *pool);
/** Add an owner to a used block, or revive a cached evictable one (out of the LRU, refcount 1):
 *  how a prefix-cache hit shares a block. False (nothing changes) for a free or out-of-range
 *  block, a NULL pool, or a refcount at INT32_MAX. O(1). */
bool kiln_kv_pool_acquire(kiln_kv_pool *pool, int32_t block);
/** Mark a used or cached block as indexed by a prefix cache (cached true: at refcount 0 it
 *  goes to the LRU instead of the free list) or no longer (false: a block idle in the LRU
 *  becomes free at once). A free or out-of-range block is an invariant violation: ignored
 *  and counted. Engine thread. */
void kiln_kv_pool_set_cached(kiln_kv_pool *pool, int32_t block, bool cached);
/** Whether the block is marked as indexed by a prefix cache. */
bool kiln_kv_pool_is_cached(const kiln_kv_pool *pool, int32_t block);
/** Install (or, with NULL, remove) the prefix cache's hooks. One set per pool. */
void kiln_kv_pool_set_hooks(kiln_kv_pool *pool, const kiln_kv_pool_hooks *hooks);
/** Blocks kiln_kv_pool_alloc can hand out now: free + cached of the write class. Any thread.
 *  0 for NULL. */
int32_t kiln_kv_pool_n_available(const kiln_kv_pool *pool);
/** Add an owner to a used block. O(1). A free or out-of-range block, or a refcount at
 *  INT32_MAX, is an invariant violation: ignored and counted. */
void kiln_kv_pool_ref(kiln_kv_pool *pool, int32_t block);
/** Drop an owner; the block returns to the free list at refcount 0. O(1). A block whose
 *  refcount is already 0, or an out-of-range block, is an invariant violation: ignored and
 *  counted (the free list is left intact). */
void kiln_kv_pool_unref(kiln_kv_pool *pool, int32_t block);
/** Owners of `block` (0 when free); -1 for a NULL pool or an out-of-range block. */
int32_t kiln_kv_pool_refcount(const kiln_kv_pool *pool, int32_t block);
/** Format of `block`'s K pages (its class's; DESIGN.md "Page formats"). KILN_DTYPE_COUNT for
 *  a NULL pool or an out-of-range block. */
kiln_dtype kiln_kv_pool_block_format(const kiln_kv_pool *pool, int32_t block);
/** Format of `block`'s K (or V) pages, as kiln_kv_pool_block_format. */
kiln_dtype kiln_kv_pool_block_format_k(const kiln_kv_pool *pool, int32_t block);
kiln_dtype kiln_kv_pool_block_format_v(const kiln_kv_pool *pool, int32_t block);
/** Bytes of one K (or V) row of `block`'s format (0: bad block). */
size_t kiln_kv_pool_row_bytes_k(const kiln_kv_pool *pool, int32_t block);
size_t kiln_kv_pool_row_bytes_v(const kiln_kv_pool *pool, int32_t block);
/** Elements per KV head (the params' head_dim, or kv_dim). */
int32_t kiln_kv_pool_head_dim(const kiln_kv_pool *pool);
/** Bytes of storage the pool holds (K and V, both classes). */
int64_t kiln_kv_pool_storage_bytes(const kiln_kv_pool *pool);

/** Free blocks now (neither used nor cached). Safe from any thread. 0 for NULL. */
int32_t kiln_kv_pool_n_free(const kiln_kv_pool *pool);
/** Snapshot of the counters. Safe from any thread; within one snapshot used + cached + free ==
 *  n_blocks and peak >= used. All zero for NULL. */
kiln_kv_pool_stats kiln_kv_pool_get_stats(const kiln_kv_pool *pool);
/** Set peak to the current used count. */
void kiln_kv_pool_reset_peak(kiln_kv_pool *pool);
/** Internal-invariant violations detected so far (see the file comment). Any thread. */
int64_t kiln_kv_pool_invariant_violations(const kiln_kv_pool *pool);

int32_t kiln_kv_pool_block_size(const kiln_kv_pool *pool);
int64_t kiln_kv_pool_kv_dim(const kiln_kv_pool *pool);
int32_t kiln_kv_pool_n_layer(const kiln_kv_pool *pool);
/** Layers the pool holds storage for (kiln_kv_pool_params.layers; n_layer without a mask). */
int32_t kiln_kv_pool_n_layers_stored(const kiln_kv_pool *pool);
/** Whether the pool holds storage for `layer` (false out of range or for NULL). */
bool kiln_kv_pool_holds_layer(const kiln_kv_pool *pool, int32_t layer);
/** The sliding window of a sliding group's pool (kiln_kv_pool_params.window); 0 for a full
 *  group's pool or NULL. */
int32_t kiln_kv_pool_window(const kiln_kv_pool *pool);
/** The write class's K format (what new blocks are written in). */
kiln_dtype kiln_kv_pool_dtype(const kiln_kv_pool *pool);
/** The write class's V format. */
kiln_dtype kiln_kv_pool_dtype_v(const kiln_kv_pool *pool);
/** Total blocks in the pool, both classes (0 for NULL). */
int32_t kiln_kv_pool_n_blocks(const kiln_kv_pool *pool);
/** The backend context the storage was allocated through (kiln_kv_pool_params.backend,
 *  borrowed), or NULL for host memory (or a NULL pool). */
kiln_backend *kiln_kv_pool_backend(const kiln_kv_pool *pool);

/** Base of K (or V) rows of `block` in `layer`: block_size rows of the block's K (V) format
 *  (kv/kv_format.h; kiln_kv_pool_row_bytes_k / _v bytes each), KILN_KV_ALIGNMENT-aligned,
 *  in backend memory (host memory for the CPU backend or no backend). Row r holds position
 *  block_index*block_size + r, where block_index is the block's index in a sequence's table.
 *  NULL for a NULL pool, an out-of-range layer/block, or a layer the pool holds no storage
 *  for (kiln_kv_pool_params.layers). */
void *kiln_kv_pool_k(kiln_kv_pool *pool, int32_t layer, int32_t block);
void *kiln_kv_pool_v(kiln_kv_pool *pool, int32_t layer, int32_t block);

/**
 * Copy block src's K and V storage, every layer the pool holds, into block dst (the copy-on-write of a
 * partial block when a sequence forks, DESIGN.md principle 2). Both must be of one format
 * class; the copy runs on the backend that holds the storage (host memcpy without one).
 * Refcounts are untouched. Errors: KILN_ERR_INVALID_ARGUMENT (a block out of range, dst ==
 * src, different formats).
 */
kiln_status kiln_kv_pool_copy_block(kiln_kv_pool *pool, int32_t dst, int32_t src,
                                    kiln_error *err);

/**
 * A sequence's block table: blocks[i] holds positions [i*block_size, (i+1)*block_size).
 * A zero-initialised struct ({0}) is the empty table. A table holds one reference to each of
 * its blocks and is used with one pool only. A sliding group's table may have holes: the
 * first n_freed entries are -1, their blocks given back by kiln_block_table_free_below
 * (positions no query that can still be computed attends to). Truncate and release skip
 * holes; fork and share refuse a table with holes.
 */
typedef struct kiln_block_table {
    int32_t *blocks;
    int32_t n_blocks, cap;
    int32_t n_freed; /* leading holes (-1 entries), <= n_blocks */
} kiln_block_table;

/**
 * Make the table cover n_tokens positions, allocating blocks from the pool as needed (a
 * table already covering n_tokens is left as is; reserve never shrinks).
 * Staged (DESIGN.md principle 4): on failure the table's blocks and the pool's stats are
 * exactly as before the call (cap and the blocks buffer may have grown).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL bt/pool, n_tokens < 0, a malformed table),
 * KILN_ERR_OUT_OF_MEMORY (the pool has too few free blocks, the message says how many were
 * needed and free; or growing the table's array failed).
 */
kiln_status kiln_block_table_reserve(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens,
                                     kiln_error *err);
/** Shrink to cover n_tokens positions (rollback): keeps the ceil(n_tokens / block_size)
 *  blocks covering positions < n_tokens and unrefs the rest (last first). n_tokens <= 0
 *  empties the table (its buffer is kept). No-op when the table is already that short or a
 *  pointer is NULL. */
void kiln_block_table_truncate(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens);
/**
 * Give back every block wholly below position `pos` (blocks i with (i+1)*block_size <= pos),
 * leaving holes (-1) in their entries: what a sliding-window group does at the commit step
 * (src/engine/kv_window.c). The table keeps its length (n_blocks), so block i still
 * holds positions [i*bs, (i+1)*bs). Returns the number of blocks given back (0 when pos <= 0,
 * a pointer is NULL, or they are gone already). O(blocks freed).
 */
int32_t kiln_block_table_free_below(kiln_block_table *bt, kiln_kv_pool *pool, int32_t pos);
/**
 * Make an empty table start with n holes (entries -1, n_freed = n): a sliding group's table
 * that resumes at block n from a prefix-cache hit and then shares the window's blocks
 * (kiln_block_table_share). Errors: KILN_ERR_INVALID_ARGUMENT (NULL or non-empty table, n < 0),
 * KILN_ERR_OUT_OF_MEMORY (the table's array; the table stays empty).
 */
kiln_status kiln_block_table_holes(kiln_block_table *bt, int32_t n, kiln_error *err);
/** Unref every block and free the table's memory; the table is left empty ({0}) and may be
 *  reused. NULL bt is a no-op. */
void kiln_block_table_release(kiln_block_table *bt, kiln_kv_pool *pool);

/**
 * Make dst share all of src's blocks (each block's refcount + 1; no storage is copied,
 * DESIGN.md principle 2). dst must be empty (n_blocks == 0; its buffer is reused if large
 * enough). src and dst must be distinct tables of the same pool.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL pointer, dst == src, dst not empty, a malformed
 * table), KILN_ERR_OUT_OF_MEMORY (dst's array), KILN_ERR_INTERNAL (src holds a free or
 * out-of-range block, or a refcount would overflow). On failure dst and the pool are unchanged.
 */
kiln_status kiln_block_table_fork(const kiln_block_table *src, kiln_block_table *dst,
                                  kiln_kv_pool *pool, kiln_error *err);

/**
 * Fork the first n_tokens positions of src into the empty table dst (DESIGN.md principle 2:
 * forking is bookkeeping on the block table): dst shares src's full blocks among them (each
 * refcount + 1, no storage copied) and gets a private copy of the block holding the partial
 * tail, when n_tokens is not a multiple of the block size (copy-on-write of that one block,
 * kiln_kv_pool_copy_block, so that dst may write the block's later positions). src must
 * cover n_tokens positions. Staged: on failure dst and the pool are unchanged.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL pointer, dst == src, dst not empty, n_tokens < 0
 * or beyond src), KILN_ERR_OUT_OF_MEMORY (no free or evictable block for the copy; dst's
 * array), KILN_ERR_INTERNAL (a block of src is free or at the maximum refcount).
 */
kiln_status kiln_block_table_fork_prefix(const kiln_block_table *src, kiln_block_table *dst,
                                         kiln_kv_pool *pool, int32_t n_tokens, kiln_error *err);

/**
 * Append n blocks found in a prefix cache to the end of bt, each gaining an owner through
 * kiln_kv_pool_acquire (a used block gets one more reference; a cached, evictable one is
 * revived out of the LRU). This is how a prefix-cache hit shares blocks into a new table
 * (DESIGN.md "Block lifecycle"; vLLM's automatic prefix caching): no storage is copied.
 * Staged: on failure bt and the pool are as before (cap may have grown).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL bt/pool, blocks NULL with n > 0, n < 0, a malformed
 * table), KILN_ERR_OUT_OF_MEMORY (the table's array), KILN_ERR_INTERNAL (a block is free, out
 * of range, or at the maximum refcount: nothing was acquired).
 */
kiln_status kiln_block_table_share(kiln_block_table *bt, kiln_kv_pool *pool, const int32_t *blocks,
                                   int32_t n, kiln_error *err);

#endif
