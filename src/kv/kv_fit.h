/*
 * kv_fit.h - the memory arithmetic of a model's KV cache (`kiln fit`, the engine's
 * memory_budget): bytes per token per layer kind and page format, bytes of one sequence of N
 * tokens, the longest context and the most concurrent sequences a budget holds, and a decode
 * speed bound from memory bandwidth. Pure arithmetic, no allocation.
 *
 * The layers are described in groups of one kind and geometry:
 *   - full attention: every position's K and V rows are kept: ceil(N / block_size) blocks;
 *   - sliding window W: a position p attends to (p - W, p], so a sequence needs at most
 *     ceil(W / block_size) + 1 blocks (W tokens plus one block, rounded to blocks) once blocks
 *     wholly outside the window are freed (src/engine/kv_window.c; issue 14 item 4).
 *     The engine's sliding group holds exactly min(ceil(N/bs), ceil(W/bs) + 1) blocks once N
 *     positions are committed (src/engine/kv_window.c; test_engine_window checks a real
 *     8192-token gemma3 sequence against kiln_kv_fit_seq_bytes); during a step it may hold
 *     ceil(n_new/bs) more. A pool that keeps every block (kv_keep_window) is what
 *     kiln_kv_fit_pool_block_bytes describes;
 *   - recurrent (gated delta net): a fixed state per sequence, no per-token rows.
 * A (layer, block) region holds block_size K rows (then, separately, V rows) of kv_dim
 * elements of the page format, padded up to KILN_KV_ALIGNMENT bytes, as the pool lays it out;
 * a row's bytes come from the format traits (kiln_kv_format_row_bytes), so a format added to
 * that table is sized here without change.
 */
#ifndef KILN_KV_KV_FIT_H
#define KILN_KV_KV_FIT_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "tensor/dtype.h"

typedef enum kiln_kv_layer_kind {
    KILN_KV_LAYER_FULL = 0,
    KILN_KV_LAYER_SLIDING = 1,
    KILN_KV_LAYER_RECURRENT = 2,
} kiln_kv_layer_kind;

/** "full", "sliding", "recurrent". */
const char *kiln_kv_layer_kind_name(kiln_kv_layer_kind k);

typedef struct kiln_kv_fit_group {
    kiln_kv_layer_kind kind;
    int32_t n_layers;    /* >= 1 */
    int64_t kv_dim;      /* attention: n_head_kv * head_dim elements per K (and V) row */
    int32_t head_dim;    /* attention: elements per KV head (a format's row geometry); 0: kv_dim */
    int32_t window;      /* sliding: W >= 1 */
    int64_t state_bytes; /* recurrent: bytes of one sequence's state for the whole group */
} kiln_kv_fit_group;

#define KILN_KV_FIT_MAX_GROUPS 8

typedef struct kiln_kv_fit_layout {
    kiln_kv_fit_group g[KILN_KV_FIT_MAX_GROUPS];
    int32_t n_groups;
    int32_t block_size; /* tokens per block, >= 1 */
    kiln_dtype k_format, v_format;
} kiln_kv_fit_layout;

/** Add n_layers of a kind to the layout, merged into an existing group of the same kind and
 *  geometry (head_dim: elements per KV head, 0 = kv_dim). False when the layout is full or an
 *  argument is out of range. */
bool kiln_kv_fit_add(kiln_kv_fit_layout *l, kiln_kv_layer_kind kind, int32_t n_layers,
                     int64_t kv_dim, int32_t head_dim, int32_t window, int64_t state_bytes);

/** Bytes per token of group g's K and V rows over all its layers, unpadded:
 *  n_layers * (row_bytes(k_format) + row_bytes(v_format)) for the group's row geometry
 *  (kiln_kv_format_row_bytes_geom); 0 for recurrent groups and formats that cannot hold the
 *  rows. */
int64_t kiln_kv_fit_group_bytes_per_token(const kiln_kv_fit_layout *l, int32_t g);

/** Bytes of one block of group g (all its layers, K and V, padded regions). */
int64_t kiln_kv_fit_group_block_bytes(const kiln_kv_fit_layout *l, int32_t g);

/** Tokens group g holds for a sequence of n tokens: full: ceil(n/bs)*bs; sliding:
 *  min(ceil(n/bs), ceil(W/bs) + 1) * bs; recurrent: 0. */
int64_t kiln_kv_fit_group_tokens(const kiln_kv_fit_layout *l, int32_t g, int64_t n);

/** Bytes of group g for one sequence of n tokens (blocks * block bytes; the state for
 *  recurrent groups, n > 0). */
int64_t kiln_kv_fit_group_bytes(const kiln_kv_fit_layout *l, int32_t g, int64_t n);

/** kv_bytes: the sum over groups for one sequence of n tokens (what the engine holds). With
 *  all_full, sliding groups count as full attention (what they would need without a window).
 *  Saturates at INT64_MAX. */
int64_t kiln_kv_fit_seq_bytes(const kiln_kv_fit_layout *l, int64_t n, bool all_full);

/** The longest n (<= n_max) whose kiln_kv_fit_seq_bytes fits in `bytes`; 0 when none. */
int64_t kiln_kv_fit_max_ctx(const kiln_kv_fit_layout *l, int64_t bytes, int64_t n_max);

/** How many sequences of n tokens fit in `bytes`: floor(bytes / seq_bytes(n)); 0 when
 *  bytes <= 0, n < 1. */
int64_t kiln_kv_fit_max_seqs(const kiln_kv_fit_layout *l, int64_t bytes, int64_t n);

/** A pool keeping every block (kv_pool.h; kv_keep_window, or a model without windows): every
 *  layer of the model (n_layer, recurrent ones included) keeps a block for every block_size
 *  positions, so one block costs
 *  kiln_kv_block_bytes_geom(n_layer, kv_dim, head_dim, block_size, k_format, v_format)
 *  (head_dim: elements per KV head, 0 = kv_dim; TurboQuant keeps a norm per head row).
 *  Returns that block's bytes (0 on invalid input). */
int64_t kiln_kv_fit_pool_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t head_dim,
                                     int32_t block_size, kiln_dtype k_format,
                                     kiln_dtype v_format);

/** Decode tokens per second bounded by memory bandwidth: bandwidth_bytes_per_s /
 *  bytes_per_token (0 when either is <= 0). The model: every weight byte and every KV byte
 *  the sequence holds is read once per decode step (a bandwidth-bound step). */
double kiln_kv_fit_decode_tok_s(double bandwidth_bytes_per_s, double bytes_per_token);

#endif
