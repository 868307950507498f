/*
 * engine_test_util.h - a harness for engine tests: run a set of jobs (requests) through one
 * engine, each joining at a chosen step and optionally cancelled at a chosen step (both from
 * the engine's step hook, so they are exact), and collect every job's events: tokens, text,
 * finish, usage and (with capture_logits) the raw logits row of each generated position.
 */
#ifndef KILN_ENGINE_TEST_UTIL_H
#define KILN_ENGINE_TEST_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device_test.h"
#include "engine/engine_debug.h"
#include "kiln.h"
#include "model/model.h"
#include "test.h"
#include "util/utf8.h"

#define ET_MAX_TOKENS 1024
#define ET_MAX_TEXT   16384

typedef struct et_result {
    int32_t tokens[ET_MAX_TOKENS];
    int32_t n_tokens;
    float logprob[ET_MAX_TOKENS];
    kiln_token_logprob top[ET_MAX_TOKENS > 64 ? 64 : ET_MAX_TOKENS][KILN_MAX_TOP_LOGPROBS];
    int32_t n_top[64];
    char text[ET_MAX_TEXT];
    size_t text_len;
    int32_t n_text_events;
    bool text_events_valid_utf8; /* every TEXT event on its own is complete UTF-8 */
    bool order_ok; /* TOKEN indices consecutive; FINISH last; event times non-decreasing */
    kiln_finish_reason finish;
    kiln_status status;
    char message[1024];
    kiln_usage usage;
    float *logits; /* [n_logit_rows][n_vocab], malloc'd copy */
    int32_t n_logit_rows;
} et_result;

/* Read a stream to its FINISH event. */
static inline void et_collect(kiln_stream *s, et_result *r, int32_t n_vocab) {
    memset(r, 0, offsetof(et_result, logits));
    r->text_events_valid_utf8 = true;
    r->order_ok = true;
    kiln_error err = {0};
    int64_t last_ns = 0;
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, -1, &ev, &err) == KILN_OK);
        if (ev.type != KILN_EVENT_NONE) {
            if (ev.time_ns <= 0 || ev.time_ns < last_ns) r->order_ok = false; /* clock order */
            last_ns = ev.time_ns;
        }
        if (ev.type == KILN_EVENT_TOKEN) {
            if (ev.index != r->n_tokens) r->order_ok = false;
            if (r->n_tokens < ET_MAX_TOKENS) {
                if (r->n_tokens < 64) {
                    r->n_top[r->n_tokens] = ev.n_top_logprobs;
                    memcpy(r->top[r->n_tokens], ev.top_logprobs, sizeof ev.top_logprobs);
                }
                r->logprob[r->n_tokens] = ev.logprob;
                r->tokens[r->n_tokens++] = ev.token;
            }
        } else if (ev.type == KILN_EVENT_TEXT) {
            r->n_text_events++;
            if (!kiln_utf8_valid(ev.text, ev.text_len, NULL) || ev.text_len == 0 ||
                strlen(ev.text) != ev.text_len)
                r->text_events_valid_utf8 = false;
            if (r->text_len + ev.text_len < ET_MAX_TEXT) {
                memcpy(r->text + r->text_len, ev.text, ev.text_len);
                r->text_len += ev.text_len;
                r->text[r->text_len] = '\0';
            }
        } else if (ev.type == KILN_EVENT_FINISH) {
            r->finish = ev.finish_reason;
            r->status = ev.status;
            snprintf(r->message, sizeof r->message, "%s", ev.message ? ev.message : "");
            r->usage = ev.usage;
            break;
        } else {
            r->order_ok = false; /* NONE with an infinite timeout before FINISH */
            break;
        }
    }
    kiln_event ev;
    REQUIRE(kiln_stream_next(s, 0, &ev, &err) == KILN_OK);
    if (ev.type != KILN_EVENT_NONE) r->order_ok = false;
    int32_t rows = 0;
    const float *lg = kiln_stream_debug_logits(s, &rows);
    r->logits = NULL;
    r->n_logit_rows = rows;
    if (rows > 0) {
        size_t bytes = (size_t)rows * (size_t)n_vocab * sizeof(float);
        r->logits = malloc(bytes);
        REQUIRE(r->logits);
        memcpy(r->logits, lg, bytes);
    }
}

static inline void et_result_free(et_result *r) {
    free(r->logits);
    r->logits = NULL;
}

typedef struct et_job {
    kiln_request req;
    kiln_request_debug dbg;
    int64_t join_step;   /* the step at which it is submitted (0: before the engine starts) */
    int64_t cancel_step; /* < 0: never; else kiln_stream_cancel at that step */
    bool cancel_in_prefill, cancel_in_decode; /* out: what the job was doing when cancelled */
    /* out */
    bool claimed; /* under et_run.mu: someone is submitting it */
    kiln_stream *stream;
    kiln_status submit_status;
    char submit_message[1024];
    et_result *res;
} et_job;

typedef struct et_run {
    et_job *jobs;
    int n_jobs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t last_step;
    int32_t max_queued; /* most requests seen waiting at a step boundary */
    int32_t max_running;
} et_run;

/* Claim job j for submission (exactly one caller wins). */
static inline bool et_claim(et_run *run, et_job *j) {
    pthread_mutex_lock(&run->mu);
    bool mine = !j->claimed;
    j->claimed = true;
    pthread_mutex_unlock(&run->mu);
    return mine;
}

static inline void et_submit(kiln_engine *e, et_run *run, et_job *j) {
    kiln_error err = {0};
    kiln_stream *s = NULL;
    kiln_status st = kiln_engine_submit_debug(e, &j->req, &j->dbg, &s, &err);
    pthread_mutex_lock(&run->mu);
    j->submit_status = st;
    snprintf(j->submit_message, sizeof j->submit_message, "%s", st ? err.message : "");
    j->stream = s;
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

static inline bool et_job_done_submitting(const et_job *j) {
    return j->stream || j->submit_status != KILN_OK;
}

static void et_hook(void *user, kiln_engine *e, int64_t step) {
    et_run *run = user;
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    if (st.n_queued > run->max_queued) run->max_queued = st.n_queued;
    if (st.n_running > run->max_running) run->max_running = st.n_running;
    run->last_step = step;
    for (int i = 0; i < run->n_jobs; i++) {
        et_job *j = &run->jobs[i];
        if (j->join_step <= step && et_claim(run, j)) et_submit(e, run, j);
        pthread_mutex_lock(&run->mu);
        bool submitted = j->stream != NULL;
        pthread_mutex_unlock(&run->mu);
        if (submitted && j->stream && j->cancel_step == step) {
            kiln_seq_progress pr;
            if (kiln_engine_debug_progress(e, j->stream, &pr, NULL) == KILN_OK && pr.admitted &&
                !pr.finished) {
                j->cancel_in_prefill = pr.n_computed < pr.n_prompt;
                j->cancel_in_decode = pr.n_computed >= pr.n_prompt && pr.n_generated > 0;
            }
            kiln_stream_cancel(j->stream);
        }
    }
}

/*
 * Run jobs[0..n) on a new engine with params p; fills each job's res (caller-allocated).
 * Jobs with join_step 0 are submitted from this thread before any step runs; the others
 * from the step hook at their step. Should the engine go idle before a job's join step
 * (everything earlier finished), the job is submitted from here instead.
 * Returns the engine stats after all jobs finished (pool usage must be back to 0).
 */
static inline kiln_engine_stats et_run_jobs(const kiln_model *m, const kiln_engine_params *p,
                                            et_job *jobs, int n, et_run *run_out) {
    et_run run = {.jobs = jobs, .n_jobs = n};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    kiln_engine_debug dbg = {.on_step = et_hook, .user = &run};
    kiln_engine *e = NULL;
    kiln_error err = {0};
    if (kiln_engine_create_debug(m, p, &dbg, &e, &err) != KILN_OK) {
        fprintf(stderr, "engine create: %s\n", err.message);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        jobs[i].stream = NULL;
        jobs[i].claimed = false;
        jobs[i].submit_status = KILN_OK;
        jobs[i].cancel_in_prefill = jobs[i].cancel_in_decode = false;
    }
    /* The engine steps only once it has work: submit the first step-0 job from here; the
     * step hook submits the others at their steps (the rest of step 0's before that step
     * takes its submissions, so they all join at step 0). */
    for (int i = 0; i < n; i++)
        if (jobs[i].join_step <= 0) {
            if (et_claim(&run, &jobs[i])) et_submit(e, &run, &jobs[i]);
            break;
        }
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&run.mu);
        while (!et_job_done_submitting(&jobs[i])) {
            /* Should the engine be idle with this job not yet joined (everything before it
             * finished), submit it from here. */
            bool idle = true;
            for (int k = 0; k < n; k++) {
                bool in_flight =
                    jobs[k].claimed && (!et_job_done_submitting(&jobs[k]) ||
                                        (jobs[k].stream && !kiln_stream_finished(jobs[k].stream)));
                if (in_flight) idle = false;
            }
            if (idle && !jobs[i].claimed) {
                pthread_mutex_unlock(&run.mu);
                kiln_engine_stats st;
                kiln_engine_get_stats(e, &st);
                if (st.n_running == 0 && st.n_queued == 0 && et_claim(&run, &jobs[i]))
                    et_submit(e, &run, &jobs[i]);
                pthread_mutex_lock(&run.mu);
                if (et_job_done_submitting(&jobs[i])) break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&run.cv, &run.mu, &ts);
        }
        pthread_mutex_unlock(&run.mu);
        if (jobs[i].stream) {
            et_collect(jobs[i].stream, jobs[i].res, m->cfg.n_vocab);
        } else {
            memset(jobs[i].res, 0, sizeof *jobs[i].res);
            jobs[i].res->finish = KILN_FINISH_ERROR;
            jobs[i].res->status = jobs[i].submit_status;
            memcpy(jobs[i].res->message, jobs[i].submit_message, sizeof jobs[i].res->message);
        }
    }
    /* Every stream has finished; the FINISH event is queued only after the blocks are
     * released, so the pool must be empty now. */
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    for (int i = 0; i < n; i++) {
        kiln_stream_destroy(jobs[i].stream);
        jobs[i].stream = NULL;
    }
    kiln_engine_destroy(e);
    pthread_cond_destroy(&run.cv);
    pthread_mutex_destroy(&run.mu);
    if (run_out) {
        run_out->last_step = run.last_step;
        run_out->max_queued = run.max_queued;
        run_out->max_running = run.max_running;
    }
    return st;
}

/* Deterministic pseudo-random prompt ids in [3, n_vocab) (no BOS/EOS/UNK). */
static inline void et_prompt(int32_t *ids, int32_t n, uint64_t seed, int32_t n_vocab) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
    for (int32_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = 3 + (int32_t)(x % (uint64_t)(n_vocab - 3));
    }
}

/* Load a model under ../shared (skip when absent); require_tokenizer as named; on the device
 * env KILN_TEST_DEVICE names (device_test.h: the CPU by default). */
static inline kiln_model *et_load_opt(const char *rel, bool require_tokenizer) {
    const char *path = kiln_test_shared(rel);
    kiln_test_require_file(path);
    kiln_model *m = NULL;
    kiln_error err = {0};
    kiln_model_params mp = {.require_tokenizer = require_tokenizer};
    kiln_test_device(&mp);
    if (kiln_model_load(path, &mp, &m, &err) != KILN_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.message);
        exit(1);
    }
    return m;
}

static inline kiln_model *et_load(const char *rel) {
    return et_load_opt(rel, true);
}

#endif
