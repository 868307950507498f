/*
 * stream.c - a request's event stream (engine_internal.h says who owns what). The engine
 * thread queues TOKEN events and its FINISH; the reader (kiln_stream_next, one thread at a
 * time, blocking with a timeout or not at all) turns them into TOKEN, TEXT and FINISH events:
 * the text pipeline of DESIGN.md "One request, end to end" step 7 runs here, on the reader's
 * thread, as vLLM V1's front-end output processor detokenizes and checks stop strings before
 * it aborts the request in the engine core.
 *
 * Stop strings, precisely. Let token i be the token whose text completes the earliest match
 * (stop.h's rule; with a partial match of another stop string pending, the match is decided by
 * a later token, which is then token i). The reader delivers TOKEN events 0..i, then the text
 * before the match (if any), then FINISH with reason stop and completion_tokens = i + 1. Tokens
 * the engine generated after i (it notices the cancel flag only at its next step boundary) are
 * never delivered and never counted; the captured debug logits are cut to i + 1 rows too. The
 * FINISH waits for the engine's own FINISH, which the engine queues after releasing the blocks,
 * so counters read after FINISH are final, as for every other finish. A stop string that only
 * the end of the text can decide (the detokenizer's or the matcher's flush) is decided when the
 * engine's FINISH arrives with reason stop (an end-of-generation token or stop id) or length:
 * the reason becomes stop and the usage is the engine's. After a cancellation or an error no
 * text is flushed (what was held back is dropped).
 *
 * Two references keep a stream alive: the consumer's handle and the engine's sequence; the
 * last to let go frees it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "util/error.h"

static void stream_free(kiln_stream *s) {
    free(s->q);
    for (int i = 0; i < s->out_n; i++) free(s->out[(s->out_head + i) % 3].owned);
    free(s->delivered);
    free(s->logits);
    kiln_detok_destroy(s->detok);
    kiln_stop_matcher_destroy(s->stop);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

kiln_status kiln_stream_create(const kiln_model *m, const kiln_req *r, kiln_stream **out,
                               kiln_error *err) {
    *out = NULL;
    kiln_stream *s = calloc(1, sizeof *s);
    if (!s) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (stream)");
    pthread_condattr_t ca;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cannot create a stream mutex");
    }
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cannot create a stream condition variable");
    }
    atomic_init(&s->refs, 2);
    atomic_init(&s->cancel, false);
    atomic_init(&s->finished, false);
    kiln_status st = KILN_OK;
    if (m->tokenizer) {
        if ((st = kiln_detok_create(m->tokenizer, &s->detok, err))) goto fail;
        kiln_detok_set_render_special(s->detok, r->render_special);
        /* Prime with the prompt so the spacing rules (leading-space removal after BOS or at
         * the start of the stream) see the whole sequence; the prompt's text is dropped. */
        for (size_t i = 0; i < r->prompt.n; i++) {
            const char *text;
            size_t len;
            if ((st = kiln_detok_push(s->detok, r->prompt.data[i], &text, &len, err))) goto fail;
        }
        if ((st = kiln_stop_matcher_create((const char *const *)r->stop, r->n_stop, &s->stop, err)))
            goto fail;
    }
    *out = s;
    return KILN_OK;
fail:
    stream_free(s);
    return st;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kiln_stream_unref(kiln_stream *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) stream_free(s);
}

/* ---- the engine's side --------------------------------------------------------------- */

static kiln_status push_event(kiln_stream *s, kiln_event_type type, int32_t token, int32_t index,
                              const kiln_logprobs *lp, bool with_logprobs, kiln_error *err);

kiln_status kiln_stream_push_token(kiln_stream *s, int32_t token, int32_t index,
                                   const kiln_logprobs *lp, bool with_logprobs, kiln_error *err) {
    return push_event(s, KILN_EVENT_TOKEN, token, index, lp, with_logprobs, err);
}

kiln_status kiln_stream_push_prompt_logprob(kiln_stream *s, int32_t index,
                                            const kiln_logprobs *lp, kiln_error *err) {
    return push_event(s, KILN_EVENT_PROMPT_LOGPROB, lp->token, index, lp, true, err);
}

static kiln_status push_event(kiln_stream *s, kiln_event_type type, int32_t token, int32_t index,
                              const kiln_logprobs *lp, bool with_logprobs, kiln_error *err) {
    kiln_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = type;
    ev.token = token;
    ev.index = index;
    ev.text = "";
    ev.message = "";
    if (lp && with_logprobs) {
        ev.logprob = lp->logprob;
        int32_t n = lp->n_top;
        if (n < 0) n = 0;
        if (n > KILN_MAX_TOP_LOGPROBS) n = KILN_MAX_TOP_LOGPROBS;
        ev.n_top_logprobs = n;
        for (int32_t i = 0; i < n; i++) {
            ev.top_logprobs[i].token = lp->top_ids[i];
            ev.top_logprobs[i].logprob = lp->top_logprobs[i];
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->q_len == s->q_cap) {
        size_t ncap = s->q_cap ? s->q_cap * 2 : 16;
        kiln_event *nq = malloc(ncap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&s->mu);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (stream events)");
        }
        for (size_t i = 0; i < s->q_len; i++) nq[i] = s->q[(s->q_head + i) % s->q_cap];
        free(s->q);
        s->q = nq;
        s->q_cap = ncap;
        s->q_head = 0;
    }
    kiln_event *slot = &s->q[(s->q_head + s->q_len) % s->q_cap];
    *slot = ev;
    slot->time_ns = mono_ns();
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KILN_OK;
}

void kiln_stream_push_finish(kiln_stream *s, kiln_finish_reason reason, kiln_usage usage,
                             kiln_status status, const char *message) {
    pthread_mutex_lock(&s->mu);
    if (!atomic_load(&s->finished)) {
        memset(&s->fin, 0, sizeof s->fin);
        s->fin.type = KILN_EVENT_FINISH;
        s->fin.time_ns = mono_ns();
        s->fin.finish_reason = reason;
        s->fin.usage = usage;
        s->fin.status = status;
        s->fin.text = "";
        snprintf(s->fin_message, sizeof s->fin_message, "%s", message ? message : "");
        s->fin.message = s->fin_message;
        atomic_store(&s->finished, true);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

kiln_status kiln_stream_capture_logits(kiln_stream *s, const float *row, int32_t n_vocab,
                                       kiln_error *err) {
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&s->mu);
    if (s->n_logit_rows == s->cap_logit_rows) {
        int32_t ncap = s->cap_logit_rows ? s->cap_logit_rows * 2 : 16;
        float *nl = realloc(s->logits, (size_t)ncap * (size_t)n_vocab * sizeof *nl);
        if (!nl) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (logits capture)");
            goto done;
        }
        s->logits = nl;
        s->cap_logit_rows = ncap;
    }
    s->n_vocab = n_vocab;
    memcpy(s->logits + (size_t)s->n_logit_rows * (size_t)n_vocab, row,
           (size_t)n_vocab * sizeof *row);
    s->n_logit_rows++;
done:
    pthread_mutex_unlock(&s->mu);
    return st;
}

const float *kiln_stream_debug_logits(kiln_stream *s, int32_t *n_rows) {
    *n_rows = 0;
    if (!s || !atomic_load(&s->finished)) return NULL;
    pthread_mutex_lock(&s->mu);
    const float *p = s->logits;
    *n_rows = s->n_logit_rows;
    pthread_mutex_unlock(&s->mu);
    /* Rows of tokens generated after the reader's stop were never part of the request. */
    if (s->r_finished && *n_rows > s->r_completion) *n_rows = s->r_completion;
    return p;
}

/* ---- the reader's side --------------------------------------------------------------- */

/* Queue an event for the reader; `owned` (or NULL) is freed after its delivery. */
static void out_push(kiln_stream *s, const kiln_event *ev, char *owned) {
    kiln_stream_out *o = &s->out[(s->out_head + s->out_n) % 3];
    o->ev = *ev;
    o->owned = owned;
    s->out_n++;
}

/* Queue a TEXT event of text[0..len) (copied) with the given time. len 0 queues nothing. */
static kiln_status out_text(kiln_stream *s, const char *text, size_t len, int64_t time_ns,
                            kiln_error *err) {
    if (len == 0) return KILN_OK;
    char *copy = malloc(len + 1);
    if (!copy) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (text event)");
    memcpy(copy, text, len);
    copy[len] = '\0';
    kiln_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KILN_EVENT_TEXT;
    ev.time_ns = time_ns;
    ev.text = copy;
    ev.text_len = len;
    ev.message = "";
    out_push(s, &ev, copy);
    return KILN_OK;
}

/* The reader ends the request at TOKEN event `tok` and asks the engine to stop it. */
static void reader_finish(kiln_stream *s, const kiln_event *tok, kiln_finish_reason reason,
                          kiln_status status, const char *message) {
    s->r_finished = true;
    s->r_reason = reason;
    s->r_status = status;
    s->r_completion = tok->index + 1;
    s->r_time_ns = tok->time_ns;
    snprintf(s->r_message, sizeof s->r_message, "%s", message ? message : "");
    atomic_store(&s->cancel, true);
}

/* A TOKEN event from the engine: deliver it, then the text it completed (if any). */
static void reader_token(kiln_stream *s, const kiln_event *tok) {
    if (s->r_finished) return; /* generated after the stop: not part of the request */
    out_push(s, tok, NULL);
    if (tok->type == KILN_EVENT_PROMPT_LOGPROB) return; /* the prompt's text is not output */
    if (!s->detok) return; /* no tokenizer: ids only */
    kiln_error err = {0};
    const char *text;
    size_t len;
    kiln_stop_result res = {.text = "", .len = 0, .stop_index = -1};
    kiln_status st = kiln_detok_push(s->detok, tok->token, &text, &len, &err);
    if (!st && len) st = kiln_stop_matcher_feed(s->stop, text, len, &res, &err);
    if (!st) st = out_text(s, res.text, res.len, tok->time_ns, &err);
    if (st)
        reader_finish(s, tok, KILN_FINISH_ERROR, st, err.message);
    else if (res.stop_index >= 0)
        reader_finish(s, tok, KILN_FINISH_STOP, KILN_OK, NULL);
}

/* The engine's FINISH (fin, with its message copied to s->fin_message): the last text of a
 * natural end, then the FINISH the reader delivers. */
static void reader_engine_finish(kiln_stream *s, const kiln_event *engine_fin) {
    kiln_event fin = *engine_fin;
    if (s->r_finished) {
        fin.finish_reason = s->r_reason;
        fin.status = s->r_status;
        fin.message = s->r_message;
        fin.usage.completion_tokens = s->r_completion;
        fin.time_ns = s->r_time_ns;
    } else if ((fin.finish_reason == KILN_FINISH_STOP || fin.finish_reason == KILN_FINISH_LENGTH) &&
               s->detok) {
        /* Natural end: release what the detokenizer and the matcher hold. Bytes of an
         * unfinished character become U+FFFD (kiln_detok_flush); the flushed text can still
         * complete a stop string, and a complete match that waited on an earlier partial one
         * is reported by the matcher's flush. */
        kiln_error ferr = {0};
        const char *text;
        size_t len;
        kiln_stop_result res = {.text = "", .len = 0, .stop_index = -1};
        kiln_status st = kiln_detok_flush(s->detok, &text, &len, &ferr);
        if (!st && len) st = kiln_stop_matcher_feed(s->stop, text, len, &res, &ferr);
        if (!st) st = out_text(s, res.text, res.len, fin.time_ns, &ferr);
        if (!st && res.stop_index < 0) {
            kiln_stop_matcher_flush(s->stop, &res);
            st = out_text(s, res.text, res.len, fin.time_ns, &ferr);
        }
        if (!st && res.stop_index >= 0) fin.finish_reason = KILN_FINISH_STOP;
        if (st) {
            fin.finish_reason = KILN_FINISH_ERROR;
            fin.status = st;
            snprintf(s->r_message, sizeof s->r_message, "%s", ferr.message);
            fin.message = s->r_message;
        }
    }
    out_push(s, &fin, NULL);
    s->r_done = true;
}

/* Take the engine's next event under s->mu: 1 a TOKEN, 2 its FINISH, 0 none now. */
static int take_locked(kiln_stream *s, kiln_event *ev) {
    if (s->q_len > 0) {
        *ev = s->q[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        return 1;
    }
    if (atomic_load(&s->finished) && !s->fin_taken) {
        *ev = s->fin;
        s->fin_taken = true;
        return 2;
    }
    return 0;
}

/* Wait for the engine's next event until the deadline (timeout_ms < 0: forever; 0: no wait). */
static int take(kiln_stream *s, int64_t timeout_ms, const struct timespec *deadline,
                kiln_event *ev) {
    int got;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if ((got = take_locked(s, ev)) || timeout_ms == 0) break;
        if (s->fin_taken) break; /* nothing will come */
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->cv, &s->mu);
        } else if (pthread_cond_timedwait(&s->cv, &s->mu, deadline) == ETIMEDOUT) {
            got = take_locked(s, ev);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

kiln_status kiln_stream_next(kiln_stream *s, int64_t timeout_ms, kiln_event *ev, kiln_error *err) {
    if (!ev) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "ev must not be NULL");
    memset(ev, 0, sizeof *ev);
    ev->type = KILN_EVENT_NONE;
    ev->text = "";
    ev->message = "";
    if (!s) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stream must not be NULL");
    free(s->delivered);
    s->delivered = NULL;
    struct timespec deadline = {0};
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        int64_t ns = (int64_t)deadline.tv_nsec + (timeout_ms % 1000) * 1000000;
        deadline.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000);
        deadline.tv_nsec = (long)(ns % 1000000000);
    }
    for (;;) {
        if (s->out_n > 0) {
            kiln_stream_out *o = &s->out[s->out_head];
            *ev = o->ev;
            s->delivered = o->owned;
            s->out_head = (s->out_head + 1) % 3;
            s->out_n--;
            return KILN_OK;
        }
        if (s->r_done) return KILN_OK; /* finished and drained */
        kiln_event raw;
        int got = take(s, timeout_ms, &deadline, &raw);
        if (got == 0) return KILN_OK; /* the timeout passed */
        if (got == 1)
            reader_token(s, &raw);
        else
            reader_engine_finish(s, &raw);
    }
}

bool kiln_stream_finished(const kiln_stream *s) {
    return s && atomic_load(&((kiln_stream *)s)->finished);
}

void kiln_stream_cancel(kiln_stream *s) {
    if (s) atomic_store(&s->cancel, true);
}

void kiln_stream_destroy(kiln_stream *s) {
    if (!s) return;
    atomic_store(&s->cancel, true);
    kiln_stream_unref(s);
}
