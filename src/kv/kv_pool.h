/*
 * kv_pool.h - the paged KV cache's block pool (DESIGN.md "KV cache"; vLLM's PagedAttention,
 * Kwon et al. 2023). A block holds the K and V rows of block_size consecutive positions of
 * one sequence, for every layer: block id b has, per layer l, K storage
 * [block_size][kv_dim] and V storage [block_size][kv_dim] in the pool's dtype. Blocks are
 * refcounted (a shared prefix is one block with several owners) and carry a format tag.
 *
 * Threading: a pool is used by one thread at a time (the engine thread); stats may be read
 * from any thread (they are atomics).
 */
#ifndef KILN_KV_KV_POOL_H
#define KILN_KV_KV_POOL_H

#include <stdint.h>

#include "kiln.h"
#include "tensor/dtype.h"

#define KILN_KV_DEFAULT_BLOCK_SIZE 16

typedef struct kiln_kv_pool kiln_kv_pool;

typedef struct kiln_kv_pool_params {
    int32_t n_layer;    /* >= 1 */
    int64_t kv_dim;     /* n_head_kv * head_dim, >= 1 */
    int32_t block_size; /* tokens per block; 0 = KILN_KV_DEFAULT_BLOCK_SIZE */
    int32_t n_blocks;   /* >= 1 */
    kiln_dtype dtype;   /* KILN_DTYPE_F32 or KILN_DTYPE_F16 */
} kiln_kv_pool_params;

typedef struct kiln_kv_pool_stats {
    int32_t n_blocks; /* total */
    int32_t used;     /* refcount > 0 */
    int32_t free;     /* n_blocks - used */
    int32_t peak;     /* max of used since creation or the last kiln_kv_pool_reset_peak */
} kiln_kv_pool_stats;

/**
 * Allocate the pool's storage (2 * n_layer * n_blocks * block_size * kv_dim elements).
 * Errors: KILN_ERR_INVALID_ARGUMENT (a field out of range, named), KILN_ERR_OUT_OF_MEMORY
 * (message gives the bytes requested).
 */
kiln_status kiln_kv_pool_create(const kiln_kv_pool_params *p, kiln_kv_pool **out, kiln_error *err);
void kiln_kv_pool_destroy(kiln_kv_pool *pool);

/** Bytes one block takes (K and V, all layers). */
int64_t kiln_kv_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t block_size, kiln_dtype dtype);

/** Blocks needed to hold n_tokens positions: ceil(n_tokens / block_size); 0 for n_tokens <= 0. */
int32_t kiln_kv_blocks_for_tokens(int32_t n_tokens, int32_t block_size);

/** Take a free block (refcount 1) or return -1 when none is free. O(1). */
int32_t kiln_kv_pool_alloc(kiln_kv_pool *pool);
/** Add an owner to a used block. */
void kiln_kv_pool_ref(kiln_kv_pool *pool, int32_t block);
/** Drop an owner; the block returns to the free list at refcount 0. */
void kiln_kv_pool_unref(kiln_kv_pool *pool, int32_t block);
int32_t kiln_kv_pool_refcount(const kiln_kv_pool *pool, int32_t block);

int32_t kiln_kv_pool_n_free(const kiln_kv_pool *pool);
kiln_kv_pool_stats kiln_kv_pool_get_stats(const kiln_kv_pool *pool);
void kiln_kv_pool_reset_peak(kiln_kv_pool *pool);

int32_t kiln_kv_pool_block_size(const kiln_kv_pool *pool);
int64_t kiln_kv_pool_kv_dim(const kiln_kv_pool *pool);
int32_t kiln_kv_pool_n_layer(const kiln_kv_pool *pool);
kiln_dtype kiln_kv_pool_dtype(const kiln_kv_pool *pool);

/** Base of K (or V) rows of `block` in `layer`: block_size rows of kv_dim elements of the
 *  pool's dtype (float or uint16_t half). Row r holds position block_index*block_size + r. */
void *kiln_kv_pool_k(kiln_kv_pool *pool, int32_t layer, int32_t block);
void *kiln_kv_pool_v(kiln_kv_pool *pool, int32_t layer, int32_t block);

/** A sequence's block table: blocks[i] holds positions [i*block_size, (i+1)*block_size). */
typedef struct kiln_block_table {
    int32_t *blocks;
    int32_t n_blocks, cap;
} kiln_block_table;

/**
 * Make the table cover n_tokens positions, allocating blocks from the pool as needed.
 * Staged: on failure (KILN_ERR_OUT_OF_MEMORY when the pool has too few free blocks, the
 * message says how many were needed and free) the table and pool are unchanged.
 */
kiln_status kiln_block_table_reserve(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens,
                                     kiln_error *err);
/** Shrink to cover n_tokens positions, unref'ing blocks past the end (rollback). */
void kiln_block_table_truncate(kiln_block_table *bt, kiln_kv_pool *pool, int32_t n_tokens);
/** Unref every block and free the table's memory. */
void kiln_block_table_release(kiln_block_table *bt, kiln_kv_pool *pool);

#endif
