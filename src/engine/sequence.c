/*
 * sequence.c - a running sequence's life on the engine thread: its per-sequence state at
 * admission, finishing, and release (blocks back to the pool, then the FINISH event).
 *
 * The engine emits token ids only. Detokenization and stop strings run on the stream's
 * reading thread (stream.c, DESIGN.md "One request, end to end" step 7); a stop string found
 * there comes back as the stream's cancel flag, which the engine honours at the next step
 * boundary like any cancellation.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/grammar_seq.h"
#include "engine/spec.h"
#include "util/error.h"

kiln_status kiln_seq_start(kiln_engine *e, kiln_seq *s, kiln_error *err) {
    if (e->rec_state_floats > 0) {
        /* forward_batch starts the state afresh at n_past == 0. */
        s->rec_state = malloc((size_t)e->rec_state_floats * sizeof *s->rec_state);
        if (!s->rec_state)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "out of memory (recurrent state of %lld floats)",
                                  (long long)e->rec_state_floats);
    }
    return KILN_OK;
}

void kiln_seq_finish(kiln_seq *s, kiln_finish_reason reason, kiln_status status,
                     const char *message) {
    if (s->finish != KILN_FINISH_NONE) return;
    s->finish = reason;
    if (reason == KILN_FINISH_ERROR) {
        kiln_error_set(&s->finish_err, status ? status : KILN_ERR_INTERNAL, "%s",
                       message ? message : "");
    } else {
        kiln_error_set(&s->finish_err, KILN_OK, NULL);
    }
}

/* c forks from s: shares s's KV of the prompt's first n_prompt - 1 positions and runs. */
static bool fork_one(kiln_engine *e, kiln_seq *s, kiln_seq *c) {
    const int32_t m = c->n_prompt - 1;
    /* a sliding group's table (kv_window.c) is not forked: such a child runs as an ordinary
     * request, with the same output */
    if (m < 1 || e->rec_state_floats > 0 || e->pool_swa || c->req->prompt_logprobs ||
        e->n_running >= e->p.max_seqs ||
        s->n_computed < m || s->failed_forward)
        return false;
    /* the copy of the partial block, and the watermark admission keeps */
    if (kiln_kv_pool_n_available(e->pool) < 2) return false;
    kiln_error err = {0};
    if (kiln_block_table_fork_prefix(&s->bt, &c->bt, e->pool, m, &err) != KILN_OK) return false;
    atomic_fetch_sub(&e->n_queued, 1);
    c->n_computed = m;
    c->n_cached = s->n_cached;
    c->admitted_once = true;
    c->state = KILN_SEQ_RUNNING;
    e->running[e->n_running++] = c;
    atomic_fetch_add(&e->st_forked, 1);
    return true;
}

void kiln_engine_fork_kids(kiln_engine *e, kiln_seq *s, bool force) {
    if (!force && s->n_computed < s->n_prompt - 1) return;
    while (s->fork_kids) {
        kiln_seq *c = s->fork_kids;
        s->fork_kids = c->next;
        c->next = NULL;
        if (atomic_load(&c->stream->cancel)) {
            atomic_fetch_sub(&e->n_queued, 1);
            kiln_seq_finish(c, KILN_FINISH_CANCELLED, KILN_OK, NULL);
            kiln_seq_release(e, c);
            continue;
        }
        if (!force && fork_one(e, s, c)) continue;
        /* an ordinary request now, at the head of the waiting FIFO (still counted queued) */
        c->state = KILN_SEQ_QUEUED;
        c->next = e->wait_head;
        e->wait_head = c;
        if (!e->wait_tail) e->wait_tail = c;
    }
    atomic_store(&e->st_running, e->n_running);
}

void kiln_seq_release(kiln_engine *e, kiln_seq *s) {
    if (!s) return;
    if (s->fork_kids) kiln_engine_fork_kids(e, s, true);
    kiln_block_table_release(&s->bt, e->pool);
    kiln_engine_window_release(e, s);
    atomic_fetch_add(&e->st_finished, 1);
    kiln_usage usage = {.prompt_tokens = s->n_prompt,
                        .cached_tokens = s->n_cached,
                        .completion_tokens = s->n_generated};
    if (s->spec) {
        const kiln_seq_spec *sp = s->spec;
        usage.spec_drafted = sp->drafted;
        usage.spec_accepted = sp->accepted;
        usage.spec_verify_steps = sp->verify_steps;
        usage.fill_tokens = sp->n_fill;
        usage.accepted_prediction_tokens = sp->has_pred ? sp->pred.accepted : 0;
        usage.rejected_prediction_tokens = sp->has_pred ? sp->pred.n - sp->pred.accepted : 0;
    }
    kiln_finish_reason reason = s->finish != KILN_FINISH_NONE ? s->finish : KILN_FINISH_CANCELLED;
    if (s->stream) {
        s->stream->seq = NULL;
        kiln_stream_push_finish(s->stream, reason, usage,
                                reason == KILN_FINISH_ERROR ? s->finish_err.status : KILN_OK,
                                reason == KILN_FINISH_ERROR ? s->finish_err.message : "");
        kiln_stream_unref(s->stream);
    }
    kiln_seq_spec_destroy(e, s);
    kiln_seq_grammar_detach(s);
    free(s->rec_state);
    free(s->bhash);
    kiln_ivec_free(&s->tokens);
    kiln_req_destroy(s->req);
    free(s);
}
