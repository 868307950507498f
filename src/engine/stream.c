/*
 * stream.c - a request's event stream: the engine thread queues events, one consumer thread
 * takes them (kiln_stream_next), blocking with a timeout or not at all. Two references keep
 * it alive: the consumer's handle and the engine's sequence; the last to let go frees it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "util/error.h"

kiln_status kiln_stream_create(kiln_stream **out, kiln_error *err) {
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
    *out = s;
    return KILN_OK;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void stream_free(kiln_stream *s) {
    for (size_t i = 0; i < s->q_len; i++) free(s->q[(s->q_head + i) % s->q_cap].owned);
    free(s->q);
    free(s->delivered);
    free(s->logits);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kiln_stream_unref(kiln_stream *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) stream_free(s);
}

/* Append under s->mu. Takes ownership of `owned` on success only. */
static kiln_status stream_push(kiln_stream *s, const kiln_event *ev, char *owned, kiln_error *err) {
    pthread_mutex_lock(&s->mu);
    if (s->q_len == s->q_cap) {
        size_t ncap = s->q_cap ? s->q_cap * 2 : 16;
        kiln_stream_ev *nq = malloc(ncap * sizeof *nq);
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
    kiln_stream_ev *slot = &s->q[(s->q_head + s->q_len) % s->q_cap];
    slot->ev = *ev;
    slot->ev.time_ns = mono_ns();
    slot->owned = owned;
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KILN_OK;
}

kiln_status kiln_stream_push_token(kiln_stream *s, int32_t token, int32_t index,
                                   const kiln_logprobs *lp, bool with_logprobs, kiln_error *err) {
    kiln_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KILN_EVENT_TOKEN;
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
    return stream_push(s, &ev, NULL, err);
}

kiln_status kiln_stream_push_text(kiln_stream *s, const char *text, size_t len, kiln_error *err) {
    if (len == 0) return KILN_OK;
    char *copy = malloc(len + 1);
    if (!copy) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (text event)");
    memcpy(copy, text, len);
    copy[len] = '\0';
    kiln_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KILN_EVENT_TEXT;
    ev.text = copy;
    ev.text_len = len;
    ev.message = "";
    kiln_status st = stream_push(s, &ev, copy, err);
    if (st) free(copy);
    return st;
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
    return p;
}

/* Take the next event under s->mu; false when there is none now. */
static bool take_locked(kiln_stream *s, kiln_event *ev) {
    free(s->delivered);
    s->delivered = NULL;
    if (s->q_len > 0) {
        kiln_stream_ev *slot = &s->q[s->q_head];
        *ev = slot->ev;
        s->delivered = slot->owned;
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        return true;
    }
    if (atomic_load(&s->finished) && !s->finish_taken) {
        *ev = s->fin;
        s->finish_taken = true;
        return true;
    }
    return false;
}

kiln_status kiln_stream_next(kiln_stream *s, int64_t timeout_ms, kiln_event *ev, kiln_error *err) {
    if (!ev) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "ev must not be NULL");
    memset(ev, 0, sizeof *ev);
    ev->type = KILN_EVENT_NONE;
    ev->text = "";
    ev->message = "";
    if (!s) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stream must not be NULL");
    struct timespec deadline = {0};
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        int64_t ns = (int64_t)deadline.tv_nsec + (timeout_ms % 1000) * 1000000;
        deadline.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000);
        deadline.tv_nsec = (long)(ns % 1000000000);
    }
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (take_locked(s, ev)) break;
        if (s->finish_taken || timeout_ms == 0) break; /* drained, or not waiting */
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->cv, &s->mu);
        } else if (pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT) {
            take_locked(s, ev);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return KILN_OK;
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
