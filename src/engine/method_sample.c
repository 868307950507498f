/*
 * method_sample.c - the plain method (DESIGN.md "Consume", *sample*): a sequence feeds its
 * prompt in chunks, then one token per step, and samples one token from the logits of its
 * last fed position.
 *
 * Speculation and fill plug in as other kiln_seq_method tables: their plan appends drafts
 * (or known tokens) after the pending one and asks for logits on several rows; their consume
 * accepts a prefix and reports n_keep < n_new, which the engine turns into a rollback.
 * (Models with recurrent layers cannot roll back their state: such methods must checkpoint
 * kiln_seq.rec_state first, or be refused for them.)
 */
#include <math.h>
#include "engine/engine_internal.h"
#include "engine/generate.h"
#include "util/error.h"

static int32_t sample_plan(kiln_engine *e, kiln_seq *s, int32_t budget, int32_t *n_logits) {
    *n_logits = 0;
    int32_t remaining = (int32_t)s->tokens.n - s->n_computed;
    if (remaining <= 0 || budget <= 0) return 0;
    int32_t n = remaining;
    if (s->n_computed < s->n_prompt && n > e->p.prefill_chunk) n = e->p.prefill_chunk;
    if (n > budget) n = budget;
    /* Logits only for the last known token: the prompt's last, or the pending decode token. */
    if (s->n_computed + n == (int32_t)s->tokens.n) *n_logits = 1;
    return n;
}

static bool is_stop_token(const kiln_engine *e, const kiln_req *r, int32_t tok) {
    if (!r->ignore_eos && kiln_model_is_eog(e->model, tok)) return true;
    return kiln_stop_token_match(r->stop_ids, r->n_stop_ids, tok);
}

static kiln_status sample_consume(kiln_engine *e, kiln_seq *s, const float *logits,
                                  int32_t n_logits, int32_t *n_keep, kiln_error *err) {
    *n_keep = s->n_new;
    if (n_logits != 1)
        return kiln_error_set(err, KILN_ERR_INTERNAL, "sample: expected 1 logits row, got %d",
                              n_logits);
    kiln_req *r = s->req;
    kiln_status st;
    if (r->debug.capture_logits &&
        (st = kiln_stream_capture_logits(s->stream, logits, e->n_vocab, err)))
        return st;
    if (r->debug.fail_at_token > 0 && s->n_generated + 1 == r->debug.fail_at_token)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "injected failure at generated token %d (debug.fail_at_token)",
                              r->debug.fail_at_token);
    /* NaN logits mean broken numerics (e.g. a corrupt weight): finish with an error rather
     * than sample an arbitrary token from them. */
    for (int32_t i = 0; i < e->n_vocab; i++)
        if (isnan(logits[i]))
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "the model produced NaN logits (token %d of the vocabulary) at "
                                  "generated token %d",
                                  i, s->n_generated);
    kiln_logprobs lp;
    int32_t tok = kiln_sample_ex(&r->sampler, logits, e->n_vocab, s->tokens.data,
                                 (int32_t)s->tokens.n, (uint64_t)s->n_generated, r->top_logprobs,
                                 r->logprobs ? &lp : NULL, e->scratch);
    if (tok < 0 || tok >= e->n_vocab)
        return kiln_error_set(err, KILN_ERR_INTERNAL, "sampler returned %d (misuse)", tok);
    if (s->n_generated < r->debug.n_force_tokens) {
        tok = r->debug.force_tokens[s->n_generated];
        if (r->logprobs) {
            lp.token = tok;
            lp.logprob = 0.0f; /* not computed for a forced token */
        }
    }
    int32_t index = s->n_generated++;
    if (is_stop_token(e, r, tok)) {
        kiln_seq_finish(s, KILN_FINISH_STOP, KILN_OK, NULL);
        return KILN_OK;
    }
    if ((st = kiln_ivec_push(&s->tokens, tok)))
        return kiln_error_set(err, st, "out of memory (generated tokens)");
    if ((st = kiln_stream_push_token(s->stream, tok, index, r->logprobs ? &lp : NULL, r->logprobs,
                                     err)))
        return st;
    /* Stop strings are matched on the reading side (stream.c), which cancels the sequence. */
    if (s->n_generated >= r->max_tokens) kiln_seq_finish(s, KILN_FINISH_LENGTH, KILN_OK, NULL);
    return KILN_OK;
}

const kiln_seq_method kiln_method_sample = {
    .name = "sample",
    .plan = sample_plan,
    .consume = sample_consume,
};
