/*
 * sequence.c - a running request's streaming state: the incremental detokenizer and the
 * stop-string matcher between sampled tokens and TEXT events (DESIGN.md "Read": hold back
 * incomplete UTF-8 and any text that could still begin a stop string), and finishing.
 *
 * The text is produced on the engine thread, right after each token is sampled, because a
 * stop string ends generation: the engine must know at once to stop feeding the sequence.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/error.h"

kiln_status kiln_seq_start(kiln_engine *e, kiln_seq *s, kiln_error *err) {
    kiln_status st;
    const kiln_model *m = e->model;
    if (e->rec_state_floats > 0) {
        /* forward_batch starts the state afresh at n_past == 0. */
        s->rec_state = malloc((size_t)e->rec_state_floats * sizeof *s->rec_state);
        if (!s->rec_state)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "out of memory (recurrent state of %lld floats)",
                                  (long long)e->rec_state_floats);
    }
    if (m->tokenizer) {
        if ((st = kiln_detok_create(m->tokenizer, &s->detok, err))) return st;
        /* Prime with the prompt so the spacing rules (leading-space removal after BOS or at
         * the start of the stream) see the whole sequence; the prompt's text is dropped. */
        for (int32_t i = 0; i < s->n_prompt; i++) {
            const char *text;
            size_t len;
            if ((st = kiln_detok_push(s->detok, s->tokens.data[i], &text, &len, err))) return st;
        }
    }
    kiln_req *r = s->req;
    if ((st = kiln_stop_matcher_create((const char *const *)r->stop, r->n_stop, &s->stop, err)))
        return st;
    return KILN_OK;
}

/* Pass newly decoded text through the stop matcher and queue what may be shown. */
static kiln_status feed_text(kiln_seq *s, const char *text, size_t len, bool *stopped,
                             kiln_error *err) {
    kiln_stop_result res;
    kiln_status st = kiln_stop_matcher_feed(s->stop, text, len, &res, err);
    if (st) return st;
    if ((st = kiln_stream_push_text(s->stream, res.text, res.len, err))) return st;
    if (res.stop_index >= 0) *stopped = true;
    return KILN_OK;
}

kiln_status kiln_seq_emit_text(kiln_seq *s, int32_t token, bool *stopped, kiln_error *err) {
    *stopped = false;
    if (!s->detok) return KILN_OK; /* no tokenizer: ids only */
    const char *text;
    size_t len;
    kiln_status st = kiln_detok_push(s->detok, token, &text, &len, err);
    if (st) return st;
    if (len == 0) return KILN_OK;
    return feed_text(s, text, len, stopped, err);
}

void kiln_seq_finish(kiln_seq *s, kiln_finish_reason reason, kiln_status status,
                     const char *message) {
    if (s->finish != KILN_FINISH_NONE) return;
    if ((reason == KILN_FINISH_STOP || reason == KILN_FINISH_LENGTH) && s->detok &&
        kiln_stop_matcher_matched(s->stop) < 0) {
        /* Natural end: release what the detokenizer and the matcher hold. Bytes of an
         * unfinished character become U+FFFD (kiln_detok_flush); the flushed text can still
         * complete a stop string. */
        kiln_error ferr = {0};
        const char *text;
        size_t len;
        bool stopped = false;
        kiln_status st = kiln_detok_flush(s->detok, &text, &len, &ferr);
        if (!st && len) st = feed_text(s, text, len, &stopped, &ferr);
        if (!st && stopped) reason = KILN_FINISH_STOP;
        if (!st && !stopped) {
            kiln_stop_result res;
            kiln_stop_matcher_flush(s->stop, &res);
            st = kiln_stream_push_text(s->stream, res.text, res.len, &ferr);
            /* A complete match that waited on an earlier partial one is reported by flush. */
            if (!st && res.stop_index >= 0) reason = KILN_FINISH_STOP;
        }
        if (st) {
            reason = KILN_FINISH_ERROR;
            status = st;
            message = ferr.message;
        }
    }
    s->finish = reason;
    if (reason == KILN_FINISH_ERROR) {
        kiln_error_set(&s->finish_err, status ? status : KILN_ERR_INTERNAL, "%s",
                       message ? message : "");
    } else {
        kiln_error_set(&s->finish_err, KILN_OK, NULL);
    }
}

void kiln_seq_release(kiln_engine *e, kiln_seq *s) {
    if (!s) return;
    kiln_block_table_release(&s->bt, e->pool);
    atomic_fetch_add(&e->st_finished, 1);
    kiln_usage usage = {.prompt_tokens = s->n_prompt, .completion_tokens = s->n_generated};
    kiln_finish_reason reason = s->finish != KILN_FINISH_NONE ? s->finish : KILN_FINISH_CANCELLED;
    if (s->stream) {
        s->stream->seq = NULL;
        kiln_stream_push_finish(s->stream, reason, usage,
                                reason == KILN_FINISH_ERROR ? s->finish_err.status : KILN_OK,
                                reason == KILN_FINISH_ERROR ? s->finish_err.message : "");
        kiln_stream_unref(s->stream);
    }
    free(s->rec_state);
    kiln_detok_destroy(s->detok);
    kiln_stop_matcher_destroy(s->stop);
    kiln_ivec_free(&s->tokens);
    kiln_req_destroy(s->req);
    free(s);
}
