/*
 * grammar_seq.h - structured output on the engine's side: a sequence's grammar recognizer,
 * its token masks in the sampler, and jump-forward spans for the fill path (DESIGN.md
 * "Sampling": the mask runs before the other processors; "Speculation and fill": a grammar's
 * forced spans are asserted fill).
 */
#ifndef KILN_ENGINE_GRAMMAR_SEQ_H
#define KILN_ENGINE_GRAMMAR_SEQ_H

#include <stdint.h>

#include "kiln.h"

typedef struct kiln_engine kiln_engine;
typedef struct kiln_seq kiln_seq;

/**
 * Give s (submitting thread, not yet queued) its recognizer when its request has a grammar:
 * builds the engine's vocabulary trie on first use (once per engine, under e->mu), then runs
 * the recognizer over the output tokens s already has (an asserted fill). Errors:
 * KILN_ERR_INVALID_ARGUMENT (the fill does not match the grammar; the model has no
 * tokenizer), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_seq_grammar_attach(kiln_engine *e, kiln_seq *s, kiln_error *err);
/** Free s->gm (NULL-safe). */
void kiln_seq_grammar_detach(kiln_seq *s);

/**
 * The logits row with the grammar's mask applied (disallowed tokens -inf): tokens whose bytes
 * keep the output a prefix of a sentence; end-of-generation and stop ids only when the output
 * is a whole sentence. *out = e->gram_row (valid until the next call). Errors:
 * KILN_ERR_INVALID_ARGUMENT (no token of the vocabulary can continue), KILN_ERR_OUT_OF_MEMORY
 * (the recognizer's tables outgrew their limits).
 */
kiln_status kiln_seq_grammar_mask(kiln_engine *e, kiln_seq *s, const float *logits,
                                  const float **out, kiln_error *err);

/** Token tok joined s's output (not a stopping token): advance the recognizer. Errors:
 *  KILN_ERR_INVALID_ARGUMENT (the grammar rejects it: an asserted span that disagrees). */
kiln_status kiln_seq_grammar_push(kiln_engine *e, kiln_seq *s, int32_t tok, kiln_error *err);

/** Jump-forward: the tokens the grammar forces from s's output on (at most cap); 0 when the
 *  request turned it off or nothing is forced. */
int32_t kiln_seq_grammar_forced(kiln_engine *e, kiln_seq *s, int32_t *out, int32_t cap);

/** Free the engine's grammar state (trie, buffers). */
void kiln_engine_grammar_shutdown(kiln_engine *e);

#endif
