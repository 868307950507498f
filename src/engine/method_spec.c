/*
 * method_spec.c - the speculation and fill method (DESIGN.md "Consume": speculate, fill):
 * plain sampling generalised to several known tokens and k drafts per step.
 *
 * A sequence's tokens are its prompt, then its output: sampled tokens and asserted fill
 * spans (asserted tokens join s->tokens before they are computed, so they are fed in bursts
 * like a prompt chunk). Output token i is decided by the row of position n_prompt + i - 1:
 * sampled from it, or, for an asserted token, only read for its logprobs. A step feeds the
 * known tokens not yet computed and, when they all fit, the drafts after them; its logits
 * rows are the tail of the chunk from the first row a decision or a logprob needs.
 *
 * Consume walks those rows in position order: it delivers the asserted tokens whose rows were
 * computed, samples the first undecided position, and while the sample agrees with the next
 * draft (kiln_seq_sample_row: exact or rejection rule) moves on to that draft's row. The
 * transaction (spec.c) keeps the known tokens and the accepted drafts.
 *
 * Bitwise equality with plain decoding: every row is computed by a batch-invariant forward,
 * so a draft position's row is the row plain decoding computes for that position once the
 * draft is accepted; the sampler is counter-based (seed, output index) and sees the same
 * history; the debug logits capture and logprobs come from the same rows.
 */
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/grammar_seq.h"
#include "engine/spec.h"
#include "util/error.h"

static int32_t spec_plan(kiln_engine *e, kiln_seq *s, int32_t budget, int32_t *n_logits) {
    kiln_seq_spec *sp = s->spec;
    *n_logits = 0;
    s->draft = sp->draft;
    s->n_draft = 0;
    int32_t known = (int32_t)s->tokens.n - s->n_computed;
    if (known <= 0 || budget <= 0) return 0;
    int32_t n = known;
    if (s->n_computed < s->n_prompt && n > e->p.prefill_chunk) n = e->p.prefill_chunk;
    if (kiln_seq_wants_prompt_rows(s) && n > KILN_PROMPT_ROWS_MAX) n = KILN_PROMPT_ROWS_MAX;
    if (n > budget) n = budget;
    bool decision = n == known;
    int32_t k = 0;
    if (decision) {
        k = sp->n_draft < budget - n ? sp->n_draft : budget - n;
        if (k < 0) k = 0;
    }
    s->n_draft = k;
    int32_t end = s->n_computed + n + k; /* positions after this step */
    int32_t first = -1;                 /* first position whose row is needed */
    int32_t n_out = (int32_t)s->tokens.n - s->n_prompt;
    if (s->req->logprobs && sp->n_emitted < n_out) {
        first = s->n_prompt + sp->n_emitted - 1; /* the next asserted token's predecessor */
        if (first < s->n_computed) first = s->n_computed;
    }
    if (decision && first < 0) first = (int32_t)s->tokens.n - 1;
    if (kiln_seq_wants_prompt_rows(s)) first = s->n_computed; /* prompt logprobs */
    if (first >= 0 && first < end) *n_logits = end - first;
    return n + k;
}

/* The row of position pos, or NULL when this step did not compute one for it. */
static const float *row_of(const kiln_engine *e, const kiln_seq *s, const float *logits,
                           int32_t n_logits, int32_t pos) {
    int32_t row0 = s->n_computed + s->n_new - n_logits;
    if (pos < row0 || pos >= s->n_computed + s->n_new) return NULL;
    return logits + (size_t)(pos - row0) * (size_t)e->n_vocab;
}

/* After output token `index` joined s->tokens: the prediction's alignment and the event. */
static kiln_status emit(kiln_engine *e, kiln_seq *s, int32_t index, const kiln_logprobs *lp,
                        kiln_error *err) {
    kiln_seq_spec *sp = s->spec;
    int32_t tok = s->tokens.data[s->n_prompt + index];
    if (sp->has_pred) kiln_pred_align_push(&sp->pred, s->tokens.data + s->n_prompt, index + 1);
    sp->n_emitted = index + 1;
    return kiln_stream_push_token(s->stream, tok, index, lp, s->req->logprobs && lp != NULL, err);
}

/* Deliver the asserted tokens whose deciding rows this step computed (or, without logprobs,
 * whose predecessors are now computed). False when max_tokens ended the sequence. */
static kiln_status emit_asserted(kiln_engine *e, kiln_seq *s, const float *logits,
                                 int32_t n_logits, int32_t computed_end, bool *done,
                                 kiln_error *err) {
    kiln_seq_spec *sp = s->spec;
    const kiln_req *r = s->req;
    int32_t n_out = (int32_t)s->tokens.n - s->n_prompt;
    *done = false;
    while (sp->n_emitted < n_out) {
        int32_t i = sp->n_emitted, pos = s->n_prompt + i - 1;
        if (pos >= computed_end) break;
        kiln_logprobs lp;
        memset(&lp, 0, sizeof lp);
        lp.token = s->tokens.data[s->n_prompt + i];
        const float *row = r->logprobs ? row_of(e, s, logits, n_logits, pos) : NULL;
        if (row && !kiln_sampler_logprobs_of(&r->sampler, row, e->n_vocab, s->tokens.data,
                                             pos + 1, lp.token, r->top_logprobs, &lp,
                                             e->scratch))
            return kiln_error_set(err, KILN_ERR_INTERNAL, "fill: logprobs misuse");
        kiln_status st = emit(e, s, i, r->logprobs ? &lp : NULL, err);
        if (st) return st;
        if (i + 1 >= r->max_tokens) {
            kiln_seq_finish(s, KILN_FINISH_LENGTH, KILN_OK, NULL);
            *done = true;
            return KILN_OK;
        }
    }
    return KILN_OK;
}

static kiln_status spec_consume(kiln_engine *e, kiln_seq *s, const float *logits,
                                int32_t n_logits, int32_t *n_keep, kiln_error *err) {
    const kiln_req *r = s->req;
    int32_t k = s->n_draft;
    int32_t known = s->n_new - k;
    int32_t computed_end = s->n_computed + known; /* the known tokens' positions end here */
    bool done = false;
    kiln_status st = kiln_seq_prompt_logprobs(e, s, logits, n_logits, err);
    if (st) return st;
    if ((st = emit_asserted(e, s, logits, n_logits, computed_end, &done, err))) return st;
    int32_t accepted = 0;
    int32_t dpos = (int32_t)s->tokens.n - 1; /* the first undecided output's deciding row */
    const float *row = row_of(e, s, logits, n_logits, dpos);
    if (!done && computed_end == (int32_t)s->tokens.n && row) {
        for (int32_t j = 0; j <= k; j++) {
            int32_t draft = j < k ? s->draft[j] : -1;
            int32_t tok;
            bool acc;
            kiln_logprobs lp;
            if ((st = kiln_seq_sample_row(e, s, row, draft, &tok, &acc, &lp, err))) return st;
            int32_t index = (int32_t)s->tokens.n - s->n_prompt;
            s->n_generated++;
            if (kiln_seq_is_stop_token(e, s, tok)) {
                kiln_seq_finish(s, KILN_FINISH_STOP, KILN_OK, NULL);
                break;
            }
            if ((st = kiln_ivec_push(&s->tokens, tok)))
                return kiln_error_set(err, st, "out of memory (generated tokens)");
            if ((st = kiln_seq_grammar_push(e, s, tok, err))) return st;
            if ((st = emit(e, s, index, r->logprobs ? &lp : NULL, err))) return st;
            if (acc) accepted++;
            if (index + 1 >= r->max_tokens) {
                kiln_seq_finish(s, KILN_FINISH_LENGTH, KILN_OK, NULL);
                break;
            }
            if (!acc) break;
            /* a grammar's forced span starts here: plain decoding would assert it now
             * (jump-forward), so the drafts after this token are not taken */
            int32_t forced[4];
            if (s->gm && kiln_seq_grammar_forced(e, s, forced, 4) > 0) break;
            /* the accepted draft sits at dpos + 1 + j; its row decides the next output */
            row = row_of(e, s, logits, n_logits, dpos + 1 + j);
            if (!row) break;
        }
    }
    if (k > 0 && r->debug.spec_bad_resolve == s->spec->verify_steps + 1) accepted = k + 1;
    return kiln_spec_resolve(e, s, accepted, n_keep, err);
}

const kiln_seq_method kiln_method_spec = {
    .name = "spec",
    .plan = spec_plan,
    .consume = spec_consume,
};
