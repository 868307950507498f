/*
 * runner.h - the model runner (DESIGN.md "Backends"; the split vLLM makes between scheduler,
 * block manager and model runner): it executes one kiln_batch of the scheduler on a backend
 * context and a KV pool. It checks the batch, prepares the step's metadata (per-token
 * sequence and position), keeps the backend's arena reserved for the step, resets and counts
 * each sequence's recurrent state, runs the model's dataflow (model.h
 * kiln_model_forward_step) and copies the selected logits rows to the host.
 *
 * The scheduler talks to the runner; the runner to the model and the operations table. A
 * runner is used by one thread at a time (the engine thread).
 */
#ifndef KILN_BACKEND_RUNNER_H
#define KILN_BACKEND_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv_pool.h"
#include "model/model.h"

typedef struct kiln_runner kiln_runner;

/**
 * A runner of model m on backend context be over pool (all borrowed: they must outlive the
 * runner). Reserves be's arena for steps of up to max_tokens flat tokens over sequences of up
 * to max_keys positions (DESIGN.md: the scratch arena is sized when the engine is created, not
 * on every forward); a larger step later grows the reservation once (and says so in no log:
 * it is a sizing choice of the caller).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL argument, max_tokens < 1, the pool's geometry
 * does not match the model), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_runner_create(const kiln_model *m, kiln_backend *be, kiln_kv_pool *pool,
                               int32_t max_tokens, int32_t max_keys, kiln_runner **out,
                               kiln_error *err);
void kiln_runner_destroy(kiln_runner *r);

/**
 * Give the runner a second pool for the sliding-window layer group (DESIGN.md "Sliding-window
 * memory"; borrowed, it must outlive the runner; NULL removes it): the layers pool_swa holds
 * (kv_pool.h kiln_kv_pool_params.layers) then keep their K/V there, addressed through each
 * sequence's block_table_swa, whose blocks wholly before the window of the step's first token
 * may be holes. The kernels never read a block outside a token's window (p - W, p].
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL runner; the pool's layers, kv_dim or block size
 * differ from the model and main pool; it holds a layer without a window or with a window
 * wider than the pool's), KILN_ERR_UNSUPPORTED (a backend without host memory: the CUDA
 * kernels read only block_table today). On error the runner is unchanged.
 */
kiln_status kiln_runner_set_sliding_pool(kiln_runner *r, kiln_kv_pool *pool_swa,
                                         kiln_error *err);

/**
 * One forward over a flat batch (DESIGN.md principle 1): every sequence's new tokens are
 * embedded, their K/V rows written into the sequence's paged KV blocks at positions
 * n_past .. n_past+n_new-1, and each token at position p attends causally over positions
 * [0, p], or (p - W, p] in a layer with sliding window W (only those blocks are read; the
 * table must still cover every position). Linear-attention layers (gated delta net) read
 * and advance the sequence's rec_state instead of the KV pool (their pool slots stay
 * unused).
 * Logits are computed only for the rows listed in batch->out, into logits[n_out, n_vocab]
 * (host memory; NULL: none).
 *
 * Batch invariance (principle 3): a token's logits depend only on its sequence's tokens
 * and KV, never on the other sequences in the batch, on how its prompt was chunked, or on
 * the thread count: every reduction has a fixed order per output element.
 *
 * Preconditions checked (KILN_ERR_INVALID_ARGUMENT, naming the sequence/token): token ids in
 * [0, n_vocab); seqs partition [0, n_tokens) in order; each block table covers
 * n_past + n_new positions of the pool with live blocks; out indices ascending and in range;
 * positions below the model's learned-position limit (GPT-2); for models with recurrent
 * layers, a rec_state per sequence holding exactly n_past positions (or n_past == 0).
 * Errors also: KILN_ERR_OUT_OF_MEMORY. On error the KV blocks of this step's positions may
 * have been partly written; callers roll those sequences back (their n_past is unchanged).
 */
kiln_status kiln_runner_step(kiln_runner *r, const kiln_batch *batch, float *logits,
                             kiln_error *err);

/**
 * kiln_runner_step for greedy decoding: instead of logits, ids[k] = the argmax of out row k
 * (sampler.h kiln_argmax: the lowest id among the largest finite logits, 0 when none is
 * finite), or -1 when the row holds a NaN. On a backend with an argmax operation (the GPU) it
 * runs there and only the ids are copied back; otherwise the runner takes it from the logits.
 * Same checks and errors as kiln_runner_step.
 */
kiln_status kiln_runner_step_argmax(kiln_runner *r, const kiln_batch *batch, int32_t *ids,
                                    kiln_error *err);

/**
 * kiln_runner_step through a runner made for this batch alone (tests, tools): the same
 * checks, errors and bits. be is a backend context (backend.h kiln_backend_create); NULL makes
 * a one-thread CPU context for the call.
 */
kiln_status kiln_model_forward_batch(const kiln_model *m, kiln_kv_pool *pool, kiln_backend *be,
                                     const kiln_batch *batch, float *logits, kiln_error *err);

/** KV cache of one sequence: a private host block pool holding exactly its n_ctx positions
 *  (the single-sequence path: kiln logits, kiln_generate; the engine shares one pool). */
typedef struct kiln_kv_seq {
    int32_t n_ctx;
    kiln_kv_pool *pool;
    kiln_block_table table;
    float *rec_state; /* kiln_model_seq_state_floats(m) floats, or NULL */
} kiln_kv_seq;

/**
 * Allocate a cache for n_ctx positions stored in page format dtype (kv/kv_format.h: F32; F16
 * or BF16, half the memory, the attention then runs with f16 / bf16 operands, see
 * kiln_attention_paged).
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_ctx < 1, not a page format), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_kv_seq_create(const kiln_model *m, int32_t n_ctx, kiln_dtype dtype,
                               kiln_kv_seq **out, kiln_error *err);

/** kiln_kv_seq_create with the pool's storage allocated through backend context be (borrowed,
 *  it must outlive the cache; NULL: host memory): the cache a runner on a device backend
 *  needs. Errors: as kiln_kv_seq_create; KILN_ERR_UNSUPPORTED for a model with recurrent
 *  state on a backend without host memory (its state is not kept on a device yet). */
kiln_status kiln_kv_seq_create_on(const kiln_model *m, kiln_backend *be, int32_t n_ctx,
                                  kiln_dtype dtype, kiln_kv_seq **out, kiln_error *err);
/** kiln_kv_seq_create_on with K rows in dtype and V rows in dtype_v (kv/kv_format.h: f32, f16,
 *  bf16, q8_0, q4_0). Errors: as kiln_kv_seq_create; KILN_ERR_INVALID_ARGUMENT when a format
 *  cannot hold the model's KV rows (q8_0 / q4_0 need kv_dim % 32 == 0; the message names it). */
kiln_status kiln_kv_seq_create_kv(const kiln_model *m, kiln_backend *be, int32_t n_ctx,
                                  kiln_dtype dtype, kiln_dtype dtype_v, kiln_kv_seq **out,
                                  kiln_error *err);
void kiln_kv_seq_destroy(kiln_kv_seq *kv);

/**
 * Run the transformer over n tokens of one sequence at positions pos0 .. pos0+n-1, writing
 * their K/V into kv and attending causally over kv positions [0, pos]: one
 * kiln_model_forward_batch of a single sequence (be as there: NULL is a one-thread CPU).
 * logits: if non-NULL, [n_out_rows, n_vocab] f32 (host) receives the logits of the rows
 * selected by want_all (every row, n_out_rows = n) or only the last row (n_out_rows = 1).
 * Errors: KILN_ERR_INVALID_ARGUMENT (token id out of [0, n_vocab), n < 1, pos0 + n > n_ctx),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_model_forward(const kiln_model *m, kiln_kv_seq *kv, kiln_backend *be,
                               const int32_t *tokens, int32_t n, int32_t pos0, bool want_all,
                               float *logits, kiln_error *err);

/** kiln_model_forward through a runner created over kv->pool (kiln_generate keeps one for
 *  its prefill and every decode step). Same checks, errors and bits. */
kiln_status kiln_runner_forward_seq(kiln_runner *r, kiln_kv_seq *kv, const int32_t *tokens,
                                    int32_t n, int32_t pos0, bool want_all, float *logits,
                                    kiln_error *err);

#endif
