/*
 * prefix_cache.h - the prefix cache in RAM (DESIGN.md "KV cache", "Block lifecycle"; the
 * automatic prefix caching of vLLM, Kwon et al. 2023, and SGLang's RadixAttention, Zheng et al.
 * 2024, keyed as vLLM keys it: one hash per full block, chained).
 *
 * Keys. A full block i of a sequence (tokens [i*B, (i+1)*B), B = block_size) is keyed by the
 * chain hash h_i = XXH3-64(h_{i-1} || tokens_i, seed = namespace), with h_{-1} = namespace.
 * The namespace is the engine's: the model's fingerprint, the KV page format, the block size
 * and the backend's numerics, so that blocks computed by another model, format or kernel path
 * never match. A lookup also compares the stored tokens and the parent hash, so a hit is
 * exact up to a 64-bit collision of the parent chain.
 *
 * Blocks. The cache indexes blocks of one pool (kv_pool.h) and marks them cached there: a
 * cached block whose last owner lets go stays in the pool's LRU of evictable blocks instead
 * of becoming free, and the pool evicts it (through the hooks this cache installs) only when
 * it needs a block. A block is indexed once, under one hash; a second block with the same
 * contents (two sequences that computed the same prefix side by side) is simply not indexed
 * and is freed with its sequence.
 *
 * Checkpoints. For models with recurrent layers a hit also needs the state after the
 * block's last position; for a sliding-window group, the sliding blocks of the window before
 * it: a block may carry one checkpoint of state_bytes (copied in), freed with the entry. A
 * caller that needs one looks for the longest run whose last block has one.
 *
 * Threading: engine thread only, like the pool; kiln_prefix_cache_get_stats from any thread.
 */
#ifndef KILN_KV_PREFIX_CACHE_H
#define KILN_KV_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "kv/kv_pool.h"

typedef struct kiln_prefix_cache kiln_prefix_cache;

/** Called when a cached block becomes evictable (its last owner let go): the disk tier's
 *  write-behind copies it then. Engine thread; the block's contents are intact. */
typedef void (*kiln_prefix_idle_fn)(void *user, int32_t block, uint64_t hash, uint64_t parent,
                                    const int32_t *tokens, const void *state);

/** Called just before a block's checkpoint is freed (dropped, replaced, or its block
 *  unindexed or evicted), with the checkpoint's bytes: what a checkpoint refers to elsewhere
 *  (the sliding-window blocks of src/engine/kv_window.c) can be let go. Engine thread; the
 *  callback may call back into the cache only for other blocks. */
typedef void (*kiln_prefix_state_free_fn)(void *user, int32_t block, const void *state);

typedef struct kiln_prefix_cache_stats {
    int32_t indexed;     /* blocks indexed now (used or cached) */
    int32_t checkpoints; /* of those, the ones carrying recurrent state */
    int64_t inserts, evictions;
} kiln_prefix_cache_stats;

/**
 * A cache over pool (borrowed; it must outlive the cache, and gets this cache's hooks) for
 * blocks of block_size tokens (the pool's), in namespace ns. state_bytes: the size of one
 * recurrent-state checkpoint (0: the model has none).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL pool/out), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_prefix_cache_create(kiln_kv_pool *pool, uint64_t ns, size_t state_bytes,
                                     kiln_prefix_cache **out, kiln_error *err);
/** Unindex everything (idle cached blocks become free), remove the pool hooks, free. NULL is a
 *  no-op. */
void kiln_prefix_cache_destroy(kiln_prefix_cache *pc);

/** The chain hash of a block: XXH3-64 over parent (8 bytes, little-endian) then the n token
 *  ids (int32, little-endian), seeded with ns. Pure. */
uint64_t kiln_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t ns);
/** The cache's namespace (h_{-1} of every chain). */
uint64_t kiln_prefix_cache_namespace(const kiln_prefix_cache *pc);

/** The block indexed under hash whose stored parent hash and tokens ([block_size]) equal
 *  these, or -1. Does not take a reference (kiln_kv_pool_acquire does). */
int32_t kiln_prefix_cache_find(const kiln_prefix_cache *pc, uint64_t hash, uint64_t parent,
                               const int32_t *tokens);

/**
 * Index a used, full block under hash (tokens [block_size] and parent are stored; the block is
 * marked cached in the pool). Returns true when indexed; false when the hash is already
 * indexed (by this or another block), the block is already indexed, the block is not used,
 * or memory ran out (the cache is an optimisation: a failure only costs a future hit).
 */
bool kiln_prefix_cache_insert(kiln_prefix_cache *pc, uint64_t hash, uint64_t parent,
                              const int32_t *tokens, int32_t block);

/** Whether block is indexed; its hash, parent and tokens ([block_size], borrowed while it stays
 *  indexed) through the non-NULL out pointers. */
bool kiln_prefix_cache_block(const kiln_prefix_cache *pc, int32_t block, uint64_t *hash,
                             uint64_t *parent, const int32_t **tokens);

/** Attach a copy of state[state_bytes] to an indexed block (replacing any). False when the
 *  block is not indexed, state_bytes is 0, or memory ran out. */
bool kiln_prefix_cache_set_state(kiln_prefix_cache *pc, int32_t block, const void *state);
/** Drop an indexed block's checkpoint (no-op without one). */
void kiln_prefix_cache_drop_state(kiln_prefix_cache *pc, int32_t block);
/** An indexed block's checkpoint (state_bytes, borrowed while indexed), or NULL. */
const void *kiln_prefix_cache_state(const kiln_prefix_cache *pc, int32_t block);

/** Forget one indexed block (its checkpoint too); an idle one becomes free. */
void kiln_prefix_cache_remove(kiln_prefix_cache *pc, int32_t block);

/** Install the checkpoint-free callback (NULL: none). */
void kiln_prefix_cache_set_state_free_fn(kiln_prefix_cache *pc, kiln_prefix_state_free_fn fn,
                                         void *user);

/** Install the idle callback (NULL: none). */
void kiln_prefix_cache_set_idle_fn(kiln_prefix_cache *pc, kiln_prefix_idle_fn fn, void *user);

kiln_prefix_cache_stats kiln_prefix_cache_get_stats(const kiln_prefix_cache *pc);

#endif
