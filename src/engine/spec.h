/*
 * spec.h - speculative decoding and fill, the engine's side (DESIGN.md "Speculation and fill
 * share one transaction"): a sequence's speculation state, the verify transaction, and the
 * draft sources (prompt lookup, a client prediction, random drafts; the draft model lives in
 * drafter.c).
 *
 * One step of a speculating sequence feeds its known tokens (the pending one, and any asserted
 * fill after it) plus k drafts, with logits for the rows where a decision is taken. The method
 * (method_spec.c) then walks the rows in order: it emits asserted tokens, samples the first
 * undecided position, and accepts drafts while they agree (kiln_spec_accept). The transaction
 * brackets this: kiln_spec_begin(k) before the forward, kiln_spec_resolve(accepted) after it.
 */
#ifndef KILN_ENGINE_SPEC_H
#define KILN_ENGINE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

typedef struct kiln_engine kiln_engine;
typedef struct kiln_seq kiln_seq;

/* ---- prediction alignment (prediction.c) --------------------------------------------- */

/** Where a client prediction stands against the output (kiln_usage gives the rule). */
typedef struct kiln_pred_align {
    const int32_t *pred; /* borrowed: [n] */
    int32_t n;
    int32_t j;        /* the next prediction index the output is expected to take */
    int32_t accepted; /* prediction tokens some output token was aligned to (<= n) */
} kiln_pred_align;

/** Longest n-gram a re-alignment matches (kiln_usage: min(4, output so far)). */
#define KILN_PRED_REALIGN_MAX 4

/** Start aligning pred[0..n) (borrowed) to an empty output. */
void kiln_pred_align_init(kiln_pred_align *a, const int32_t *pred, int32_t n);

/**
 * Account for one more output token, output[n_output - 1] (output: the whole output so far,
 * oldest first, n_output >= 1). If pred[j] is that token it takes j; otherwise the longest
 * m <= min(KILN_PRED_REALIGN_MAX, n_output) whose last m output tokens occur as pred[q-m..q)
 * with q - 1 >= j, at the smallest such q, re-aligns to j = q; if none, j stays.
 * Cost O(n * KILN_PRED_REALIGN_MAX) for a re-alignment, O(1) otherwise.
 * Source: kiln's rule (kiln_usage), written so that accepted_prediction_tokens depends only on
 * the prediction and the output, never on k, the batch or how many drafts a step verified.
 */
void kiln_pred_align_push(kiln_pred_align *a, const int32_t *output, int32_t n_output);

/** Drafts from the alignment: pred[j .. j + cap) clipped to the prediction; returns how many. */
int32_t kiln_pred_align_drafts(const kiln_pred_align *a, int32_t *out, int32_t cap);

/* ---- prompt lookup (ngram.c) ---------------------------------------------------------- */

/**
 * Prompt-lookup drafts (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's lookup): for n
 * from nmax down to nmin, find the latest earlier occurrence of tokens' last n tokens, i.e.
 * tokens[i-n..i) == tokens[len-n..len) with i < len, and propose tokens[i .. i + cap), clipped
 * to len. The first n that matches decides. tokens: [len] (prompt + output, the pending token
 * last). Returns the number of drafts (0: no match). 1 <= nmin <= nmax. Cost O(len * nmax).
 */
int32_t kiln_ngram_propose(const int32_t *tokens, int32_t len, int32_t nmin, int32_t nmax,
                           int32_t *out, int32_t cap);

/* ---- a sequence's speculation state (spec_state.c; the step's side: spec.c) ----------- */

typedef struct kiln_seq_spec {
    kiln_spec_source source; /* resolved: OFF, NGRAM, DRAFT or RANDOM */
    kiln_spec_accept accept;
    int32_t k_max, k_cur;     /* adaptive k: drafts to propose next, <= k_max */
    int32_t miss_streak;      /* verify steps in a row that accepted nothing */
    int32_t cooldown;         /* decisions left without drafting (after misses) */
    int32_t ngram_min, ngram_max;
    bool has_pred;
    kiln_pred_align pred; /* over req->prediction */
    /* fill session */
    int32_t fs_asked_at;                /* output length when it was last asked; -1: never */
    int32_t *fs_span;                   /* a verify span it proposed: drafts until consumed */
    int32_t fs_n, fs_pos, fs_cap;
    int32_t fs_start;                   /* output index fs_span[0] predicts */
    /* this step's transaction */
    int32_t draft[KILN_MAX_SPEC_K];
    int32_t n_draft;  /* proposed for this step (plan may cut some) */
    bool in_txn;      /* begin() called, resolve() not yet */
    int32_t txn_base; /* n_computed at begin */
    int32_t txn_k;    /* drafts in the forward */
    float *rec_ckpt;  /* recurrent state at begin (models with recurrent layers), or NULL */
    bool ckpt_taken;
    int32_t drafter_slot; /* KILN_SPEC_DRAFT: the drafter's slot, or -1 */
    uint64_t rng;         /* KILN_SPEC_RANDOM's stream */
    /* output accounting */
    int32_t n_emitted;   /* output tokens delivered as TOKEN events */
    int32_t n_fill;      /* asserted fill tokens in the output */
    int32_t drafted, accepted, verify_steps;
} kiln_seq_spec;

/**
 * Give s (not yet admitted) its speculation state when its request asks for any of: drafts
 * (the request's spec, or the engine's default), a prediction, a fill or a fill session; the
 * caller then gives s kiln_method_spec. With none, s->spec stays NULL (plain sampling).
 * Asserted fill tokens are appended to s->tokens here, so they ride in the prompt's prefill
 * chunks. Runs on the submitting thread: it reads only s and the engine's immutable settings.
 * Errors: KILN_ERR_INVALID_ARGUMENT (KILN_SPEC_DRAFT on an engine without a draft model; the
 * prompt and the prediction together longer than n_ctx), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_seq_spec_create(kiln_engine *e, kiln_seq *s, kiln_error *err);
/** Free s->spec (and close its drafter slot). */
void kiln_seq_spec_destroy(kiln_engine *e, kiln_seq *s);

/**
 * Propose this step's drafts for every running speculating sequence that sits at a decision
 * (all its known tokens fit in one chunk): fill-session spans, the prediction, then its draft
 * source; the draft-model ones in one batched drafter call. Engine thread, before planning.
 */
void kiln_engine_spec_propose(kiln_engine *e);

/**
 * The transaction's first half: s is about to feed n_known known tokens and k drafts
 * (s->spec->draft[0..k)). Checks that the drafts fit: k >= 0, k <= KILN_MAX_SPEC_K, the
 * positions n_computed + n_known + k within the engine's n_ctx, and the block table already
 * covering them (the scheduler reserved them); a window layer keeps every block (DESIGN.md
 * "KV cache"), so rollback never needs a freed block. Takes a checkpoint of the recurrent
 * state when k > 0. Errors: KILN_ERR_INTERNAL (misuse: then the sequence is invalid).
 */
kiln_status kiln_spec_begin(kiln_engine *e, kiln_seq *s, int32_t n_known, int32_t k,
                            kiln_error *err);

/**
 * The second half: of the k drafts, the first `accepted` were accepted (0 <= accepted <= k).
 * Returns through *n_keep the positions of this step that stay in the KV: the known tokens and
 * the accepted drafts. With recurrent layers and a rejection, the state is restored from the
 * checkpoint and *n_keep is 0: the kept tokens are recomputed in the next step (they are in
 * s->tokens, so they ride ahead of its next verify). Updates adaptive k and the counters.
 * Errors: KILN_ERR_INTERNAL (accepted out of range, no transaction open): the sequence is
 * invalid; the caller finishes it with the error and indexes none of its new blocks.
 */
kiln_status kiln_spec_resolve(kiln_engine *e, kiln_seq *s, int32_t accepted, int32_t *n_keep,
                              kiln_error *err);

#endif
