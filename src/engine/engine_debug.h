/*
 * engine_debug.h - test and diagnostics hooks of the engine, not part of the public API.
 *
 * Tests use them to pin down what the public API cannot show: the raw logits a request saw
 * at every generated position (batch invariance is a bitwise statement about them), the
 * exact step at which requests join or are cancelled, and fault injection.
 */
#ifndef KILN_ENGINE_ENGINE_DEBUG_H
#define KILN_ENGINE_ENGINE_DEBUG_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

/**
 * Called on the engine thread at every step boundary, before new submissions are taken
 * from the queue and admitted (so a request submitted from the hook at step s is admitted at
 * step s, pool permitting), and before cancellation flags are read. `step` counts the steps
 * the engine has begun (0 for the first). The hook runs only while the engine has work;
 * an idle engine sleeps. It may call kiln_engine_submit, kiln_stream_cancel and
 * kiln_engine_debug_progress; it must not destroy the engine.
 */
typedef void (*kiln_engine_step_hook)(void *user, kiln_engine *engine, int64_t step);

typedef struct kiln_engine_debug {
    kiln_engine_step_hook on_step; /* may be NULL */
    void *user;
} kiln_engine_debug;

/** kiln_engine_create with hooks (copied; debug may be NULL). */
kiln_status kiln_engine_create_debug(const kiln_model *model, const kiln_engine_params *params,
                                     const kiln_engine_debug *debug, kiln_engine **out,
                                     kiln_error *err);

/** Per-request diagnostics. */
typedef struct kiln_request_debug {
    /* Copy the raw logits row (the model's output, before any sampling processor) of every
     * generated position into the stream; read them with kiln_stream_debug_logits. */
    bool capture_logits;
    /* Fault injection: > 0 makes the request fail (finish error, KILN_ERR_INTERNAL) when it
     * is about to sample its fail_at_token-th token (1-based). */
    int32_t fail_at_token;
    /* Scripted output: generated token i is force_tokens[i] (i < n_force_tokens) instead of
     * the sampler's draw; it then goes through stop ids, the text pipeline and max_tokens
     * like a sampled token (the assert policy of DESIGN.md "fill", in miniature). Copied at
     * submit; each id must be in [0, n_vocab). */
    const int32_t *force_tokens;
    int32_t n_force_tokens;
    /* Fault injection in the speculation transaction: > 0 makes the spec_bad_resolve-th verify
     * step (1-based) call kiln_spec_resolve with one more accepted draft than it verified, so
     * the transaction fails (the sequence finishes with KILN_ERR_INTERNAL). */
    int32_t spec_bad_resolve;
} kiln_request_debug;

/** kiln_engine_submit with diagnostics (debug may be NULL). */
kiln_status kiln_engine_submit_debug(kiln_engine *engine, const kiln_request *req,
                                     const kiln_request_debug *debug, kiln_stream **out,
                                     kiln_error *err);

/**
 * The captured logits: *n_rows rows of n_vocab floats, row i for generated token i (the
 * stopping token included). Valid once the stream is finished (kiln_stream_finished) and
 * until it is destroyed; NULL with *n_rows = 0 before that or without capture_logits.
 */
const float *kiln_stream_debug_logits(kiln_stream *stream, int32_t *n_rows);

/** A request's progress, readable only on the engine thread (from the step hook). */
typedef struct kiln_seq_progress {
    bool admitted; /* has KV blocks and is running */
    bool loading;  /* waiting for its prefix's blocks from the disk tier */
    bool finished;
    int32_t n_prompt;    /* prompt tokens */
    int32_t n_computed;  /* positions whose KV is written */
    int32_t n_generated; /* tokens sampled */
    int32_t n_blocks;    /* blocks in its table */
} kiln_seq_progress;

/** Errors: KILN_ERR_INVALID_ARGUMENT (NULL arguments). Engine thread only. */
kiln_status kiln_engine_debug_progress(kiln_engine *engine, kiln_stream *stream,
                                       kiln_seq_progress *out, kiln_error *err);

#endif
