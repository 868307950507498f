/*
 * method_sample.c - the plain method (DESIGN.md "Consume", *sample*): a sequence feeds its
 * prompt in chunks, then one token per step, and samples one token from the logits of its
 * last fed position.
 *
 * Speculation and fill are another kiln_seq_method (method_spec.c): drafts after the
 * pending token, logits on several rows, and a rollback of the rejected ones. The sampling of
 * one row is shared: kiln_seq_sample_row, below.
 */
#include <math.h>
#include "engine/engine_internal.h"
#include "engine/generate.h"
#include "engine/grammar_seq.h"
#include "engine/spec.h"
#include "util/error.h"

static int32_t sample_plan(kiln_engine *e, kiln_seq *s, int32_t budget, int32_t *n_logits) {
    *n_logits = 0;
    int32_t remaining = (int32_t)s->tokens.n - s->n_computed;
    if (remaining <= 0 || budget <= 0) return 0;
    int32_t n = remaining;
    if (s->n_computed < s->n_prompt && n > e->p.prefill_chunk) n = e->p.prefill_chunk;
    if (kiln_seq_wants_prompt_rows(s) && n > KILN_PROMPT_ROWS_MAX) n = KILN_PROMPT_ROWS_MAX;
    if (n > budget) n = budget;
    /* Logits only for the last known token: the prompt's last, or the pending decode token
     * (and, for prompt logprobs, every prompt position of the chunk). */
    if (s->n_computed + n == (int32_t)s->tokens.n) *n_logits = 1;
    if (kiln_seq_wants_prompt_rows(s)) *n_logits = n;
    return n;
}

/* NaN logits mean broken numerics (e.g. a corrupt weight): an error naming where. */
static kiln_status check_nan(const float *row, int32_t n_vocab, const char *where, int32_t at,
                             kiln_error *err) {
    for (int32_t i = 0; i < n_vocab; i++)
        if (isnan(row[i]))
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "the model produced NaN logits (token %d of the vocabulary) at "
                                  "%s %d",
                                  i, where, at);
    return KILN_OK;
}

bool kiln_seq_wants_prompt_rows(const kiln_seq *s) {
    return s->req->prompt_logprobs && s->n_computed < s->n_prompt - 1;
}

kiln_status kiln_seq_prompt_logprobs(kiln_engine *e, kiln_seq *s, const float *logits,
                                     int32_t n_logits, kiln_error *err) {
    const kiln_req *r = s->req;
    if (!r->prompt_logprobs) return KILN_OK;
    /* raw logits: the log-softmax before every sampling processor (OpenAI's echo logprobs) */
    static const kiln_sampler_params raw = {.temperature = 1.0f,
                                            .top_p = 1.0f,
                                            .repetition_penalty = 1.0f,
                                            .xtc_threshold = 0.1f};
    const int32_t row0 = s->n_computed + s->n_new - n_logits; /* position of logits row 0 */
    for (int32_t j = 0; j < n_logits; j++) {
        const int32_t pos = row0 + j, next = pos + 1;
        if (pos != s->n_prompt_lp || next >= s->n_prompt) continue;
        const float *row = logits + (size_t)j * (size_t)e->n_vocab;
        kiln_status st = check_nan(row, e->n_vocab, "prompt position", pos, err);
        if (st) return st;
        kiln_logprobs lp;
        if (!kiln_sampler_logprobs_of(&raw, row, e->n_vocab, NULL, 0, s->tokens.data[next],
                                      r->top_prompt_logprobs, &lp, e->scratch))
            return kiln_error_set(err, KILN_ERR_INTERNAL, "prompt logprobs: sampler misuse");
        if ((st = kiln_stream_push_prompt_logprob(s->stream, next, &lp, err))) return st;
        s->n_prompt_lp = next;
    }
    return KILN_OK;
}

bool kiln_seq_is_stop_token(const kiln_engine *e, const kiln_seq *s, int32_t tok) {
    const kiln_req *r = s->req;
    if (!r->ignore_eos && kiln_model_is_eog(e->model, tok)) return true;
    return kiln_stop_token_match(r->stop_ids, r->n_stop_ids, tok);
}

kiln_status kiln_seq_sample_row(kiln_engine *e, kiln_seq *s, const float *logits, int32_t draft,
                                int32_t *tok_out, bool *accepted, kiln_logprobs *lp,
                                kiln_error *err) {
    kiln_req *r = s->req;
    int32_t index = (int32_t)s->tokens.n - s->n_prompt; /* the output index being decided */
    kiln_status st;
    *accepted = false;
    if (r->debug.capture_logits &&
        (st = kiln_stream_capture_logits(s->stream, logits, e->n_vocab, err)))
        return st;
    if (r->debug.fail_at_token > 0 && index + 1 == r->debug.fail_at_token)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "injected failure at generated token %d (debug.fail_at_token)",
                              r->debug.fail_at_token);
    /* NaN logits mean broken numerics (e.g. a corrupt weight): finish with an error rather
     * than sample an arbitrary token from them. */
    if ((st = check_nan(logits, e->n_vocab, "generated token", index, err))) return st;
    /* structured output: the grammar's mask comes before every other processor */
    if (s->gm && (st = kiln_seq_grammar_mask(e, s, logits, &logits, err))) return st;
    int32_t tok;
    if (draft >= 0 && s->spec && s->spec->accept == KILN_SPEC_ACCEPT_REJECTION)
        tok = kiln_sample_verify_rejection(&r->sampler, logits, e->n_vocab, s->tokens.data,
                                           (int32_t)s->tokens.n, (uint64_t)index, draft, accepted,
                                           r->top_logprobs, r->logprobs ? lp : NULL, e->scratch);
    else
        tok = kiln_sample_ex(&r->sampler, logits, e->n_vocab, s->tokens.data,
                             (int32_t)s->tokens.n, (uint64_t)index, r->top_logprobs,
                             r->logprobs ? lp : NULL, e->scratch);
    if (tok < 0 || tok >= e->n_vocab)
        return kiln_error_set(err, KILN_ERR_INTERNAL, "sampler returned %d (misuse)", tok);
    if (index < r->debug.n_force_tokens) {
        tok = r->debug.force_tokens[index];
        if (r->logprobs) {
            lp->token = tok;
            lp->logprob = 0.0f; /* not computed for a forced token */
        }
    }
    if (draft >= 0 && !(s->spec && s->spec->accept == KILN_SPEC_ACCEPT_REJECTION))
        *accepted = tok == draft;
    else if (draft >= 0)
        *accepted = *accepted && tok == draft;
    *tok_out = tok;
    return KILN_OK;
}

/* the sampled token tok (lp: its logprobs when asked for) joins s's output */
static kiln_status sample_commit(kiln_engine *e, kiln_seq *s, int32_t tok,
                                 const kiln_logprobs *lp, kiln_error *err) {
    kiln_req *r = s->req;
    kiln_status st;
    int32_t index = s->n_generated++;
    if (kiln_seq_is_stop_token(e, s, tok)) {
        kiln_seq_finish(s, KILN_FINISH_STOP, KILN_OK, NULL);
        return KILN_OK;
    }
    if ((st = kiln_ivec_push(&s->tokens, tok)))
        return kiln_error_set(err, st, "out of memory (generated tokens)");
    if ((st = kiln_seq_grammar_push(e, s, tok, err))) return st;
    if ((st = kiln_stream_push_token(s->stream, tok, index, r->logprobs ? lp : NULL, r->logprobs,
                                     err)))
        return st;
    /* Stop strings are matched on the reading side (stream.c), which cancels the sequence. */
    if (s->n_generated >= r->max_tokens) kiln_seq_finish(s, KILN_FINISH_LENGTH, KILN_OK, NULL);
    return KILN_OK;
}

static kiln_status sample_consume(kiln_engine *e, kiln_seq *s, const float *logits,
                                  int32_t n_logits, int32_t *n_keep, kiln_error *err) {
    *n_keep = s->n_new;
    kiln_status st = kiln_seq_prompt_logprobs(e, s, logits, n_logits, err);
    if (st) return st;
    if (s->n_computed + s->n_new < (int32_t)s->tokens.n) return KILN_OK; /* prompt rows only */
    if (n_logits < 1 || (n_logits != 1 && !s->req->prompt_logprobs))
        return kiln_error_set(err, KILN_ERR_INTERNAL, "sample: expected 1 logits row, got %d",
                              n_logits);
    logits += (size_t)(n_logits - 1) * (size_t)e->n_vocab; /* the last known token's row */
    kiln_logprobs lp;
    int32_t tok;
    bool acc;
    if ((st = kiln_seq_sample_row(e, s, logits, -1, &tok, &acc, &lp, err))) return st;
    return sample_commit(e, s, tok, &lp, err);
}

bool kiln_seq_plain_greedy(const kiln_seq *s) {
    const kiln_req *r = s->req;
    const kiln_sampler_params *p = &r->sampler;
    return s->method == &kiln_method_sample && s->n_logits == 1 && !s->spec && !s->gm &&
           p->temperature == 0.0f && p->n_bias == 0 &&
           (p->repetition_penalty == 1.0f || !(p->repetition_penalty > 0.0f)) &&
           p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f && !r->logprobs && !r->prompt_logprobs &&
           !r->debug.capture_logits && r->debug.fail_at_token <= 0 &&
           r->debug.n_force_tokens <= 0;
}

kiln_status kiln_seq_consume_argmax(kiln_engine *e, kiln_seq *s, int32_t tok, int32_t *n_keep,
                                    kiln_error *err) {
    *n_keep = s->n_new;
    if (tok < 0 || tok >= e->n_vocab)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "the model produced NaN logits at generated token %d",
                              (int32_t)s->tokens.n - s->n_prompt);
    return sample_commit(e, s, tok, NULL, err);
}

const kiln_seq_method kiln_method_sample = {
    .name = "sample",
    .plan = sample_plan,
    .consume = sample_consume,
};
