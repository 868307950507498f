/*
 * batch.h - one step's work for the forward pass (DESIGN.md principle 1): a flat batch of
 * tokens from several sequences, each sequence contributing n_new consecutive positions
 * after the n_past already in its paged KV cache.
 */
#ifndef KILN_BACKEND_BATCH_H
#define KILN_BACKEND_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_batch_seq {
    const int32_t *block_table; /* borrowed; covers n_past + n_new positions */
    int32_t n_past;             /* positions already in the KV cache */
    int32_t n_new;              /* tokens this step, at positions n_past .. n_past+n_new-1 */
    int32_t first;              /* index of its first token in the flat batch */
    int32_t n_blocks;           /* entries in block_table (checked against n_past + n_new) */
    /* Recurrent state of this sequence (models with linear-attention layers, e.g.
     * Qwen3-Next): kiln_model_seq_state_floats(model) floats, owned by the caller, not paged.
     * NULL ("none") for models without recurrent layers. It records how many positions it
     * has consumed: forward_batch starts it afresh when n_past == 0, else requires it to hold
     * exactly n_past positions, and leaves it holding n_past + n_new. Rolling the KV back
     * does not roll this state back. */
    float *rec_state;
    /* Layer groups (src/engine/kv_window.c): the sequence's table in the sliding
     * group's pool (runner.h kiln_runner_set_sliding_pool), n_blocks_swa entries covering
     * n_past + n_new positions, of which the entries wholly below the first key any of this
     * step's tokens attends to may be holes (-1). NULL when the runner has no sliding pool. */
    const int32_t *block_table_swa;
    int32_t n_blocks_swa;
} kiln_batch_seq;

/** The table a kernel reads for sequence q in a pool of a sliding group (sliding true:
 *  block_table_swa, when the batch carries one) or of the full group (block_table). */
static inline const int32_t *kiln_batch_seq_blocks(const kiln_batch_seq *q, bool sliding) {
    return sliding && q->block_table_swa ? q->block_table_swa : q->block_table;
}

typedef struct kiln_batch {
    int32_t n_tokens;
    const int32_t *token; /* [n_tokens]; seq s owns token[first .. first + n_new) */
    int32_t n_seqs;
    const kiln_batch_seq *seqs;
    int32_t n_out;
    const int32_t *out; /* [n_out] flat token indices whose logits are wanted, ascending */
} kiln_batch;

#endif
