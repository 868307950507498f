/*
 * disk_tier.h - the prefix cache's disk tier (DESIGN.md "KV cache", "Disk tier"; issue 13).
 * Blocks the RAM prefix cache (prefix_cache.h) lets go of are written behind to a directory,
 * one file per block, and read back, verified, when a later prompt (or a later process) needs
 * the same prefix. LMCache and SGLang's HiCache keep such a tier; the layout here is kiln's.
 *
 * Files. One file per block, DIR/xy/<hash>.kvb, where <hash> is the block's chain hash as 16
 * lowercase hex digits and xy its first two. One file per block because blocks are looked up,
 * evicted and lost one by one: the size cap is enforced per block, and a torn or corrupt file
 * costs one block, never a run. The 256 subdirectories keep each directory small (a 16 GiB
 * tier of 2 MiB blocks is 8192 files, 32 per subdirectory). The format is below
 * (KILN_DISK_BLOCK_*); every multi-byte field is little-endian, the payload is the engine's
 * bytes as given.
 *
 * Writes. A put copies the block on the caller's thread and queues it; the tier's one I/O
 * thread writes it to a temporary file DIR/xy/.tmp-<pid>-<seq> (a leading dot and no ".kvb":
 * never taken for a block file), then renames it over DIR/xy/<hash>.kvb, so a block name only
 * ever holds a complete file. There is no fsync: this is a cache, and a file torn by a power
 * loss fails its checksum and is removed at read time. Temporary files left by a killed
 * process are removed at open (the directory lock says no other process is writing).
 *
 * Reads are never trusted: a file whose magic, version, model fingerprint, namespace, page
 * format, geometry, size, checksums, hash, parent hash or tokens do not match what the caller
 * asked for is removed, logged (kiln_log_warn: the file and the reason), counted as corrupt
 * and reported as KILN_ERR_NOT_FOUND: the caller computes the block instead.
 *
 * Index. Open scans the directory's names, sizes and mtimes (no file is read) into an
 * in-memory index ordered by recency (mtime). A write or a verified read makes a file the
 * most recent, in memory and in its mtime (set explicitly, strictly increasing, so the order
 * survives a restart even within the file system's timestamp granularity). When a write would
 * take the files past max_bytes, the least recently used files are removed first.
 *
 * Disk full. ENOSPC or EDQUOT while writing a file removes the temporary file, logs one line,
 * sets disk_full and drops every put (counted) until the I/O thread sees free space again
 * (statvfs, every retry_ms) and a write succeeds. Serving never waits for the disk.
 *
 * Lock. A directory serves one process: open takes flock(LOCK_EX | LOCK_NB) on DIR/lock and
 * refuses a second opener (another process, or a second open in this one).
 *
 * Threading. put, has, read, fetch, flush and get_stats may be called from any thread (the
 * engine calls them from its own); the index is guarded by a mutex that is never held across
 * file I/O on the write path, and the counters are atomics. read does its I/O on the calling
 * thread; puts and fetches are done by the I/O thread, fetches (reads) before puts (writes).
 */
#ifndef KILN_KV_DISK_TIER_H
#define KILN_KV_DISK_TIER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kiln.h"

/*
 * Block file format, version 1. B = block_size. All integers little-endian.
 *
 *   offset    bytes  field
 *   0         8      magic "KILNKVB\0"
 *   8         4      version (1)
 *   12        4      header_bytes = 112 + 4 * B (everything before the payload)
 *   16        8      model fingerprint (kiln_model_fingerprint)
 *   24        8      namespace (the prefix cache's)
 *   32        8      hash: the block's chain hash
 *   40        8      parent: the previous block's chain hash (the namespace for block 0)
 *   48        8      kv_dim (int64)
 *   56        8      kv_bytes (int64): payload bytes of K and V, all layers
 *   64        8      state_bytes (int64): recurrent checkpoint bytes; 0 when flags bit 0 is 0
 *   72        8      XXH3-64 (seed 0) of the kv_bytes of K and V
 *   80        8      XXH3-64 (seed 0) of the state_bytes of state (0 without state)
 *   88        4      page format (int32, a kiln_dtype)
 *   92        4      n_layer (int32)
 *   96        4      block_size B (int32)
 *   100       4      flags (uint32): bit 0 = carries a recurrent checkpoint; others 0
 *   104       4 * B  the block's token ids (int32)
 *   104 + 4B  8      XXH3-64 (seed 0) of bytes [0, 104 + 4B): the header checksum
 *   112 + 4B  kv_bytes     K and V as the engine gathered them
 *   ...       state_bytes  the checkpoint, when flags bit 0 is set
 *
 * The file is exactly header_bytes + kv_bytes (+ state_bytes) long. Every header byte is
 * checked on read, so an accepted file is the one canonical encoding of its block.
 */
#define KILN_DISK_BLOCK_MAGIC      "KILNKVB"
#define KILN_DISK_BLOCK_VERSION    1u
#define KILN_DISK_BLOCK_FIXED      104 /* bytes before the tokens */
#define KILN_DISK_BLOCK_FLAG_STATE 1u
/* Largest block_size the tier accepts (the header stays well under 1 GiB). */
#define KILN_DISK_BLOCK_MAX_TOKENS (1 << 20)

/** Header bytes of a block file for block_size tokens: 112 + 4 * block_size (the fixed part,
 *  the tokens and the header checksum). Returns 0 for block_size outside
 *  [1, KILN_DISK_BLOCK_MAX_TOKENS]. */
int64_t kiln_disk_block_header_bytes(int32_t block_size);

/** What a block file must hold: the tier's identity and geometry, and the block asked for. */
typedef struct kiln_disk_block_desc {
    uint64_t fingerprint, ns;
    int32_t page_format, n_layer;
    int64_t kv_dim;
    int32_t block_size;
    int64_t kv_bytes;
    int64_t state_bytes; /* the tier's checkpoint size (0: none) */
    uint64_t hash, parent;
    const int32_t *tokens; /* [block_size], borrowed */
} kiln_disk_block_desc;

/**
 * Encode one block file into out (out_cap bytes): the header of d (format above), then
 * kv[d->kv_bytes], then state[d->state_bytes] when state is non-NULL (and d->state_bytes > 0;
 * otherwise the file carries no checkpoint). Returns the bytes written, or 0 when out_cap is
 * too small or d is invalid (a NULL pointer, a size <= 0, block_size out of range). Pure;
 * the tier's writer streams the same bytes, tests and the fuzz corpus build files with it.
 */
size_t kiln_disk_block_encode(const kiln_disk_block_desc *d, const void *kv, const void *state,
                              uint8_t *out, size_t out_cap);

/**
 * Encode only the header (kiln_disk_block_header_bytes(d->block_size) bytes into
 * hdr[hdr_cap]) for a payload of kv and state (NULL: none), computing both payload checksums.
 * Returns the header bytes, or 0 as kiln_disk_block_encode does.
 */
size_t kiln_disk_block_encode_header(const kiln_disk_block_desc *d, const void *kv,
                                     const void *state, uint8_t *hdr, size_t hdr_cap);

/**
 * Recompute, in place, the three checksums of a block file image buf[n] from the sizes its
 * own header states (the fuzz target uses it to get past the checksums). Does nothing when
 * those sizes do not fit in n. Pure.
 */
void kiln_disk_block_seal(uint8_t *buf, size_t n);

/**
 * Read and verify one block file from fd (read with pread from offset 0; the file offset is
 * not used) against d: every header field, the file's size (fstat), the hash, parent and
 * tokens asked for, and the checksums. K and V go to kv[d->kv_bytes]; the checkpoint to
 * state[d->state_bytes] when state is non-NULL and the file has one (*got_state, if non-NULL,
 * says whether it was copied). The state region is only read (and its checksum checked) when
 * it is copied. kv and state contents are unspecified on failure.
 * Returns KILN_OK, or KILN_ERR_FORMAT with a short reason in why[why_cap] ("bad magic",
 * "another model (fingerprint ...)", "truncated", "payload checksum mismatch", ...), or
 * KILN_ERR_IO when a read fails (why gives strerror). Pure apart from the reads.
 */
kiln_status kiln_disk_block_read_fd(int fd, const kiln_disk_block_desc *d, void *kv, void *state,
                                    bool *got_state, char *why, size_t why_cap);

typedef struct kiln_disk_tier kiln_disk_tier;

typedef struct kiln_disk_tier_params {
    const char *dir;         /* created if absent (mkdir -p); borrowed for open only (copied) */
    int64_t max_bytes;       /* cap on the files' total bytes; 0 = 16 GiB */
    uint64_t fingerprint;    /* the model's (kiln_model_fingerprint) */
    uint64_t ns;             /* the prefix cache namespace (covers fingerprint, page format, block
                                size, numerics) */
    int32_t page_format;     /* kiln_dtype of the pages, in [0, KILN_DTYPE_COUNT), or a
                                TurboQuant page id (64..79, kv/turboquant.h); K | V << 8 when
                                K and V differ */
    int32_t n_layer;         /* >= 1 */
    int64_t kv_dim;          /* >= 1 */
    int32_t block_size;      /* tokens per block, in [1, KILN_DISK_BLOCK_MAX_TOKENS] */
    int64_t kv_bytes;        /* payload bytes of one block's K and V, all layers (the engine gathers
                                them contiguous), >= 1 */
    int64_t state_bytes;     /* recurrent checkpoint bytes (0: none); a file may or may not carry
                                one */
    int64_t queue_max_bytes; /* write-behind queue cap; 0 = 256 MiB; a put beyond it is dropped
                                (counted), never blocks */
    /* optional fault injection for tests: NULL = the real write(2) */
    ssize_t (*write_fn)(int fd, const void *buf, size_t n);
    int32_t retry_ms; /* after a full disk, how often the I/O thread checks for space again;
                         0 = 5000 */
} kiln_disk_tier_params;

typedef struct kiln_disk_tier_stats {
    int64_t reads, writes, read_bytes, write_bytes; /* verified files read / files written,
                                                       bytes (whole files) */
    int64_t corrupt;      /* files that failed a check: skipped, removed, logged */
    int64_t files, bytes; /* what the directory holds now (as the index knows it) */
    int64_t dropped;      /* puts not written (queue full, disk full, write error) */
    int64_t evictions;    /* files removed to stay within max_bytes */
    bool disk_full;       /* writes paused after ENOSPC/EDQUOT */
} kiln_disk_tier_stats;

/**
 * Open (creating it if absent) the tier in p->dir: take the directory lock, remove leftover
 * temporary files, index the block files by name, size and mtime (unknown names are ignored,
 * none is read), remove least recently used files beyond max_bytes, and start the I/O thread.
 * *out is set only on success.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL p/out, NULL or empty dir, a field out of range: named
 * in the message), KILN_ERR_IO (the directory cannot be created or read, it or a component is
 * not a directory, or "cache dir X is in use by another kiln process"), KILN_ERR_OUT_OF_MEMORY,
 * KILN_ERR_INTERNAL (the I/O thread could not be started).
 */
kiln_status kiln_disk_tier_open(const kiln_disk_tier_params *p, kiln_disk_tier **out,
                                kiln_error *err);

/** Finish every queued fetch and write (a full disk drops them, counted), join the I/O
 *  thread, release the lock and free the tier. A fetch still pointing at it must already be
 *  done when close returns (it is) and may be freed after. NULL is a no-op. */
void kiln_disk_tier_close(kiln_disk_tier *dt);

/**
 * Queue one block for write-behind: copies tokens[block_size], kv[kv_bytes] and, when state is
 * non-NULL and state_bytes > 0, state[state_bytes], then returns; the I/O thread writes the
 * file. Never blocks on I/O (only on the index mutex).
 * Returns true when queued; false when the block is already on disk or queued, or when the
 * put is dropped (counted in stats.dropped): the queue would pass queue_max_bytes, the disk is
 * full, the file alone exceeds max_bytes, or memory ran out. NULL dt/tokens/kv: false.
 */
bool kiln_disk_tier_put(kiln_disk_tier *dt, uint64_t hash, uint64_t parent, const int32_t *tokens,
                        const void *kv, const void *state);

/**
 * Whether a file for hash is on disk, as the index knows it (built at open, updated by writes,
 * evictions and removals): O(1), no I/O; a queued, not yet written block is not. *has_state
 * (if non-NULL) says whether that file carries a checkpoint (from its size). A file whose size
 * fits no block of this tier is not reported (it can only be another geometry's, or torn).
 */
bool kiln_disk_tier_has(const kiln_disk_tier *dt, uint64_t hash, bool *has_state);

/**
 * Read hash's file on the calling thread and verify it (kiln_disk_block_read_fd) against this
 * tier and the block asked for (parent, tokens[block_size]): K and V into kv[kv_bytes], the
 * checkpoint into state[state_bytes] when state is non-NULL and the file has one (*got_state,
 * if non-NULL, says). A verified read makes the file the most recently used.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL dt/tokens/kv); KILN_ERR_NOT_FOUND when there is no
 * file, and also when the file failed a check: it is then removed, logged and counted as
 * corrupt (the caller just computes the block). kv/state contents are unspecified on error.
 */
kiln_status kiln_disk_tier_read(kiln_disk_tier *dt, uint64_t hash, uint64_t parent,
                                const int32_t *tokens, void *kv, void *state, bool *got_state,
                                kiln_error *err);

/**
 * An asynchronous read of a run of blocks, made by kiln_disk_tier_fetch only (the object
 * continues with private fields: never allocate or copy one). When done (set last, with
 * release order) is true, n_ok says how many LEADING blocks verified (the run stops at the
 * first missing or corrupt one); block i's K and V are kv + i * kv_bytes, its checkpoint state
 * + i * state_bytes (state is NULL when the tier's state_bytes is 0) when has_state[i].
 */
typedef struct kiln_disk_fetch {
    _Atomic bool done;
    int32_t n, n_ok;
    uint8_t *kv;     /* [n * kv_bytes] */
    uint8_t *state;  /* [n * state_bytes], or NULL */
    bool *has_state; /* [n] */
} kiln_disk_fetch;

/**
 * Queue a read of n consecutive blocks (hashes[i], parents[i], tokens + i * block_size; all
 * copied) for the I/O thread, ahead of any write. The caller polls f->done (once per engine
 * step), then uses the buffers and calls kiln_disk_fetch_free. Each block is verified as
 * kiln_disk_tier_read does (a failing file is removed, logged, counted). n == 0 gives a fetch
 * that is already done. Returns NULL for a NULL dt/array, n < 0, or when memory runs out.
 */
kiln_disk_fetch *kiln_disk_tier_fetch(kiln_disk_tier *dt, const uint64_t *hashes,
                                      const uint64_t *parents, const int32_t *tokens, int32_t n);

/** Free a fetch and its buffers. One not done yet is cancelled: dropped if the I/O thread has
 *  not started it, else abandoned to it (it stops at the next block and frees it); the tier
 *  must still be open then. A done fetch may be freed after the tier is closed (close finishes
 *  every fetch). NULL is a no-op. */
void kiln_disk_fetch_free(kiln_disk_fetch *f);

/** Wait until every put queued before the call is on disk or dropped (fetches are waited for
 *  through their done flag). NULL is a no-op. */
void kiln_disk_tier_flush(kiln_disk_tier *dt);

/** Remove hash's file, if any (not counted as an eviction or corruption). A queued write of it
 *  still happens. Returns whether a file was known. */
bool kiln_disk_tier_remove(kiln_disk_tier *dt, uint64_t hash);

/** The path hash's file has (or would have) in this tier: DIR/xy/<16 hex>.kvb into buf[cap].
 *  Returns buf, or NULL when it does not fit. */
const char *kiln_disk_tier_path(const kiln_disk_tier *dt, uint64_t hash, char *buf, size_t cap);

/** A snapshot of the counters; any thread. All zero for NULL. */
kiln_disk_tier_stats kiln_disk_tier_get_stats(const kiln_disk_tier *dt);

#endif
