/*
 * drafter.h - the draft model of speculative decoding (kiln.h KILN_SPEC_DRAFT; DESIGN.md
 * "Speculation and fill share one transaction"; Leviathan, Kalman, Matias 2023 and Chen et
 * al. 2023 for the scheme, llama.cpp's speculative example for the draft-model loop).
 *
 * A drafter owns a second model's compute, apart from the target's: its own CPU backend
 * context, its own paged KV pool (f32 pages, KILN_KV_DEFAULT_BLOCK_SIZE positions per block)
 * and its own runner. It keeps one slot per target sequence: a block table in that pool and
 * the tokens whose KV the table holds. kiln_drafter_propose drafts greedily for many slots at
 * once, their catch-up chunks and draft steps mixed in one flat batch per forward (DESIGN.md
 * principle 1), so a call costs about max over its requests of (catch-up chunks + k) forwards,
 * not their sum.
 *
 * Bits: by batch invariance (principle 3) a slot's drafts are exactly the draft model's own
 * greedy continuation of the history it is given (what an engine running the draft model
 * alone at temperature 0 with ignore_eos generates), whatever else shares the forwards, how
 * the history was chunked, or what the slot held before.
 *
 * Private to the engine (not public API). A drafter is used by one thread at a time (the
 * engine thread); kiln_drafter_get_stats may be called from that thread only.
 */
#ifndef KILN_ENGINE_DRAFTER_H
#define KILN_ENGINE_DRAFTER_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "model/model.h"

typedef struct kiln_drafter kiln_drafter;

typedef struct kiln_drafter_params {
    int32_t n_threads;   /* compute threads of the drafter's backend, [0, 512]; 0 = 1 */
    int64_t kv_tokens;   /* the drafter's KV pool in positions, >= 1 (rounded up to whole
                            blocks; the engine passes draft_kv_tokens, 0 there = the target's) */
    int32_t step_tokens; /* most tokens per forward, [0, 1 << 20]; 0 = 512 */
    int32_t n_ctx;       /* most positions per sequence, [0, 1 << 24]; 0 = the draft model's
                            training context (4096 when unknown). A draft model with learned
                            positions (GPT-2) drafts only within its n_ctx_train */
    int32_t max_slots;   /* most slots open at once, [0, 1 << 16]; 0 = 256 */
} kiln_drafter_params;

/** Counters since creation (engine thread). */
typedef struct kiln_drafter_stats {
    int64_t proposes;       /* kiln_drafter_propose calls that succeeded */
    int64_t forwards;       /* forwards of the draft model (runner steps) */
    int64_t catchup_tokens; /* history tokens fed (a new prompt, accepted drafts, the pending
                               token, tokens after a rollback) */
    int64_t draft_tokens;   /* drafted tokens fed back to draft the next one */
    int64_t drafted;        /* drafts written to requests' out */
    int64_t rolled_back;    /* positions dropped from slots: history that diverged from the
                               slot's (target rejections), or the pending token re-fed */
    int64_t short_pool;     /* requests given fewer drafts than asked because the pool ran out */
    int64_t short_ctx;      /* ... because n_ctx was reached */
} kiln_drafter_stats;

/**
 * A drafter of model draft for model target (both borrowed: they must outlive the drafter).
 * p is required (kv_tokens has no default).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL argument; a field of p out of range, named; the
 * vocabularies differ: kiln_model_vocab_compatible's reason, prefixed "the draft model cannot
 * draft for the target: "; the draft model has recurrent layers, which a drafter cannot roll
 * back), KILN_ERR_OUT_OF_MEMORY (the pool: the message gives the bytes; buffers), and
 * kiln_backend_create's / kiln_runner_create's errors.
 */
kiln_status kiln_drafter_create(const kiln_model *draft, const kiln_model *target,
                                const kiln_drafter_params *p, kiln_drafter **out, kiln_error *err);
/** Free the drafter, its slots, pool, runner and backend. NULL is a no-op. */
void kiln_drafter_destroy(kiln_drafter *d);

/**
 * Open a new empty slot (a sequence of the target that will ask for drafts); *slot receives
 * its index in [0, max_slots).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL d/slot), KILN_ERR_OUT_OF_MEMORY (all max_slots
 * slots are open).
 */
kiln_status kiln_drafter_open(kiln_drafter *d, int32_t *slot, kiln_error *err);
/** Close a slot: release its KV blocks and forget its tokens. A slot that is not open (or
 *  out of range, or NULL d) is ignored. */
void kiln_drafter_close(kiln_drafter *d, int32_t slot);

/** One sequence's request for drafts. */
typedef struct kiln_draft_req {
    int32_t slot;          /* an open slot, at most once per kiln_drafter_propose call */
    const int32_t *tokens; /* [n_tokens] the target sequence's whole history, prompt then
                              output, each in [0, n_vocab); its last token is the pending one
                              (sampled, not yet in the target's KV) */
    int32_t n_tokens;      /* >= 1 */
    int32_t k;             /* drafts wanted, >= 0 (0: only catch up on the history) */
    int32_t *out;          /* [k] out: out[0..n_out) the drafts */
    int32_t n_out;         /* out: drafts written, <= k */
} kiln_draft_req;

/**
 * Draft for reqs[0..n) at once. For each request: the common prefix of the slot's tokens
 * and `tokens` is kept (at most n_tokens - 1 of them: the pending token is always fed, for
 * its logits); the slot's KV is rolled back to it (the block table truncated; this is how a
 * target rejection is undone), the rest of `tokens` is fed (catch-up, chunked by
 * step_tokens), then k greedy steps: each draft is the argmax of the last position's logits
 * (kiln_argmax: lowest id on ties; no sampling, no end-of-generation stop), and each but the
 * last is fed back to draft the next. Drafted tokens stay in the slot as its history: the next
 * call's common prefix keeps the ones the target accepted and rolls back the rest.
 *
 * All requests share each forward: draft steps first (one token per request), then catch-up
 * chunks in request order with what is left of step_tokens; logits are computed only for the
 * last position of each request that drafts in that forward.
 *
 * Fewer drafts, never an error: n_out < k when n_tokens + k would pass n_ctx (n_out =
 * n_ctx - n_tokens, at least 0; a history longer than n_ctx is not fed at all), or when the
 * pool cannot hold the n_tokens + k - 1 positions drafting writes (blocks are taken in request
 * order; n_out = what fits, 0 when not even the history does; then nothing of it is fed).
 *
 * Staged validation: every request is checked before any slot changes.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL d, reqs NULL with n > 0, n < 0; a request whose
 * slot is not open or repeats an earlier request's, n_tokens < 1, tokens NULL, k < 0, out
 * NULL with k > 0, a token id outside [0, n_vocab): named by request and index),
 * KILN_ERR_OUT_OF_MEMORY (buffers), and a forward's errors (kiln_runner_step). After a forward
 * error each slot holds the tokens fed before the failed forward and n_out is what was
 * drafted by then.
 */
kiln_status kiln_drafter_propose(kiln_drafter *d, kiln_draft_req *reqs, int32_t n, kiln_error *err);

/** The counters (all zero for NULL d). */
kiln_drafter_stats kiln_drafter_get_stats(const kiln_drafter *d);

/** Positions slot holds in the drafter's KV (its tokens), or -1 for a slot that is not open.
 *  For tests and the engine's bookkeeping. */
int32_t kiln_drafter_slot_tokens(const kiln_drafter *d, int32_t slot);

/** The drafter's pool blocks in use (refcount > 0) and in total; for tests and metrics. */
void kiln_drafter_pool_usage(const kiln_drafter *d, int32_t *used, int32_t *total);

#endif
