/*
 * Scheduler behaviour on stories260K (issue 3, "Also test"):
 *   - cancellation mid-prefill and mid-decode (and before admission, and by destroying the
 *     stream): the cancelled requests finish "cancelled", every KV block is released, and the
 *     other requests' tokens and logits are bitwise those of a run without the cancelled ones;
 *   - a pool too small for all requests at once: they queue (observed), all complete, with
 *     the outputs of a big-pool run;
 *   - a step budget smaller than the number of decoding sequences (they take turns);
 *   - context_over_budget for a request that can never fit (context or whole pool), while a
 *     request exactly at the limit runs;
 *   - a request that fails (injected fault) finishes with an error, the others go on
 *     undisturbed.
 */
#include <time.h>

#include "engine_test_util.h"

static kiln_model *g_m;
static int32_t g_nv;
static int32_t g_prompts[8][256];

static void job(et_job *j, int k, int32_t n_prompt, int32_t max_tokens, int64_t join,
                et_result *res) {
    memset(j, 0, sizeof *j);
    et_prompt(g_prompts[k], n_prompt, 500 + (uint64_t)k, g_nv);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = g_prompts[k];
    j->req.n_prompt_ids = n_prompt;
    j->req.max_tokens = max_tokens;
    j->req.temperature = 0.0f;
    j->req.ignore_eos = true;
    j->dbg.capture_logits = true;
    j->join_step = join;
    j->cancel_step = -1;
    j->res = res;
}

static bool same_output(const et_result *a, const et_result *b) {
    if (a->n_tokens != b->n_tokens || a->n_logit_rows != b->n_logit_rows || a->finish != b->finish)
        return false;
    if (memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t))) return false;
    return a->n_logit_rows == 0 ||
           !memcmp(a->logits, b->logits, (size_t)a->n_logit_rows * (size_t)g_nv * sizeof(float));
}

static kiln_engine_params params(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.prefill_chunk = 7;
    p.step_tokens = 16;
    p.n_threads = 2;
    p.n_ctx = 512;
    return p;
}

static void test_cancel(void) {
    kiln_engine_params p = params();
    /* Baseline: B and D alone together. */
    et_result base[2], got[4];
    et_job jb[2];
    job(&jb[0], 1, 30, 40, 0, &base[0]);
    job(&jb[1], 3, 10, 50, 0, &base[1]);
    kiln_engine_stats st = et_run_jobs(g_m, &p, jb, 2, NULL);
    CHECK(st.kv_blocks_used == 0);
    /* With A (long prompt, cancelled mid-prefill) and C (cancelled mid-decode). */
    et_job j[4];
    job(&j[0], 0, 200, 20, 0, &got[0]);
    job(&j[1], 1, 30, 40, 0, &got[1]);
    job(&j[2], 2, 20, 30, 1, &got[2]);
    job(&j[3], 3, 10, 50, 0, &got[3]);
    j[0].cancel_step = 5;
    j[2].cancel_step = 25;
    et_run run;
    st = et_run_jobs(g_m, &p, j, 4, &run);
    CHECKF(st.kv_blocks_used == 0, "cancel: %d blocks still used after every request finished",
           st.kv_blocks_used);
    CHECKF(st.n_running == 0 && st.n_queued == 0, "cancel: engine not empty");
    CHECKF(got[0].finish == KILN_FINISH_CANCELLED && j[0].cancel_in_prefill,
           "A: finish %s, cancelled in prefill: %d", kiln_finish_reason_name(got[0].finish),
           j[0].cancel_in_prefill);
    CHECK(got[0].n_tokens == 0 && got[0].usage.completion_tokens == 0);
    CHECKF(got[2].finish == KILN_FINISH_CANCELLED && j[2].cancel_in_decode,
           "C: finish %s, cancelled in decode: %d", kiln_finish_reason_name(got[2].finish),
           j[2].cancel_in_decode);
    CHECKF(got[2].n_tokens > 0 && got[2].n_tokens < 30, "C generated %d tokens", got[2].n_tokens);
    CHECK(got[2].usage.completion_tokens == got[2].n_tokens);
    CHECKF(same_output(&got[1], &base[0]), "B differs from the run without the cancelled ones");
    CHECKF(same_output(&got[3], &base[1]), "D differs from the run without the cancelled ones");
    for (int i = 0; i < 4; i++) et_result_free(&got[i]);
    for (int i = 0; i < 2; i++) et_result_free(&base[i]);
}

static void wait_engine_empty(kiln_engine *e, const char *what) {
    kiln_engine_stats st;
    for (int i = 0; i < 2000; i++) {
        kiln_engine_get_stats(e, &st);
        if (st.n_running == 0 && st.n_queued == 0 && st.kv_blocks_used == 0) return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    CHECKF(false, "%s: engine never emptied (running %d, queued %d, blocks %d)", what, st.n_running,
           st.n_queued, st.kv_blocks_used);
}

/* Destroying a stream cancels its request; destroying one still queued never admits it. */
static void test_destroy_cancels(void) {
    kiln_engine_params p = params();
    p.max_seqs = 1;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    int32_t ids[64];
    et_prompt(ids, 64, 9, g_nv);
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = ids;
    r.n_prompt_ids = 64;
    r.max_tokens = 400;
    r.ignore_eos = true;
    kiln_stream *a = NULL, *b = NULL;
    REQUIRE(kiln_engine_submit(e, &r, &a, &err) == KILN_OK);
    REQUIRE(kiln_engine_submit(e, &r, &b, &err) == KILN_OK); /* waits: max_seqs 1 */
    kiln_event ev;
    do REQUIRE(kiln_stream_next(a, -1, &ev, &err) == KILN_OK);
    while (ev.type != KILN_EVENT_TOKEN);
    kiln_stream_destroy(b); /* still queued */
    kiln_stream_destroy(a); /* decoding */
    wait_engine_empty(e, "destroy");
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    CHECKF(st.n_requests_finished == 2, "finished %lld of 2", (long long)st.n_requests_finished);
    kiln_engine_destroy(e);
}

static void test_small_pool(void) {
    kiln_engine_params big = params();
    et_job j[8];
    et_result a[8], b[8];
    for (int k = 0; k < 8; k++) job(&j[k], k, 20 + 9 * k, 30 + 3 * k, 0, &a[k]);
    et_run_jobs(g_m, &big, j, 8, NULL);
    /* Room for two or three whole requests: each needs 4 to 9 blocks of 16 over its life.
     * Blocks are taken as sequences grow, so more start at once and the pool runs dry
     * while they decode: the newest are preempted and resumed, with the same output. */
    kiln_engine_params small = params();
    small.kv_tokens = 16 * 14;
    for (int k = 0; k < 8; k++) job(&j[k], k, 20 + 9 * k, 30 + 3 * k, 0, &b[k]);
    et_run run;
    kiln_engine_stats st = et_run_jobs(g_m, &small, j, 8, &run);
    CHECKF(st.kv_blocks_total == 14, "pool of %d blocks", st.kv_blocks_total);
    CHECKF(run.max_queued >= 4, "small pool: at most %d requests were seen waiting",
           run.max_queued);
    CHECKF(run.max_running > 3, "small pool: only %d ran at once (blocks reserved up front?)",
           run.max_running);
    CHECKF(st.preemptions > 0, "small pool: no preemption although demand exceeds the pool");
    CHECKF(st.kv_blocks_peak <= 14 && st.kv_blocks_used == 0, "peak %d used %d", st.kv_blocks_peak,
           st.kv_blocks_used);
    CHECKF(st.kv_blocks_cached + st.kv_blocks_free == 14, "cached %d + free %d != 14",
           st.kv_blocks_cached, st.kv_blocks_free);
    for (int k = 0; k < 8; k++) {
        CHECKF(b[k].finish == KILN_FINISH_LENGTH, "small pool: request %d finished %s (%s)", k,
               kiln_finish_reason_name(b[k].finish), b[k].message);
        CHECKF(same_output(&a[k], &b[k]), "small pool: request %d differs from the big pool", k);
        et_result_free(&a[k]);
        et_result_free(&b[k]);
    }
}

/* A step budget smaller than the number of decoding sequences: they take turns (no
 * starvation), and every output equals the roomy run's. */
static void test_tiny_budget(void) {
    kiln_engine_params big = params();
    et_job j[8];
    et_result a[8], b[8];
    for (int k = 0; k < 8; k++) job(&j[k], k, 5 + 3 * k, 12 + k, 0, &a[k]);
    et_run_jobs(g_m, &big, j, 8, NULL);
    kiln_engine_params tiny = params();
    tiny.step_tokens = 3;
    tiny.prefill_chunk = 2;
    for (int k = 0; k < 8; k++) job(&j[k], k, 5 + 3 * k, 12 + k, 0, &b[k]);
    et_run run;
    kiln_engine_stats st = et_run_jobs(g_m, &tiny, j, 8, &run);
    CHECKF(run.max_running == 8, "tiny budget: %d ran at once", run.max_running);
    CHECK(st.kv_blocks_used == 0);
    for (int k = 0; k < 8; k++) {
        CHECKF(b[k].finish == KILN_FINISH_LENGTH && same_output(&a[k], &b[k]),
               "tiny budget: request %d differs (%s, %d tokens)", k,
               kiln_finish_reason_name(b[k].finish), b[k].n_tokens);
        et_result_free(&a[k]);
        et_result_free(&b[k]);
    }
}

static void test_context_over_budget(void) {
    kiln_engine_params p = params();
    p.n_ctx = 64;
    p.kv_tokens = 16 * 8; /* 8 blocks: 128 positions */
    et_job j[4];
    et_result r[4];
    job(&j[0], 0, 40, 25, 0, &r[0]); /* 64 positions: exactly the context */
    job(&j[1], 1, 40, 26, 0, &r[1]); /* 65 > 64 */
    job(&j[2], 2, 70, 1, 0, &r[2]);  /* the prompt alone is longer than the context */
    job(&j[3], 3, 10, 10, 0, &r[3]);
    kiln_engine_stats st = et_run_jobs(g_m, &p, j, 4, NULL);
    CHECKF(r[0].finish == KILN_FINISH_LENGTH && r[0].n_tokens == 25,
           "at the limit: %s, %d tokens (%s)", kiln_finish_reason_name(r[0].finish), r[0].n_tokens,
           r[0].message);
    for (int k = 1; k <= 2; k++) {
        CHECKF(r[k].finish == KILN_FINISH_ERROR && r[k].status == KILN_ERR_CONTEXT_OVER_BUDGET,
               "request %d: finish %s status %d", k, kiln_finish_reason_name(r[k].finish),
               (int)r[k].status);
        CHECKF(strstr(r[k].message, "context_over_budget") && strstr(r[k].message, "context"),
               "request %d: message '%s'", k, r[k].message);
        CHECK(r[k].n_tokens == 0 && r[k].usage.completion_tokens == 0);
    }
    CHECK(r[3].finish == KILN_FINISH_LENGTH && r[3].n_tokens == 10);
    CHECK(st.kv_blocks_used == 0);
    for (int k = 0; k < 4; k++) et_result_free(&r[k]);

    /* Bigger than the whole pool (but within the context). */
    p.n_ctx = 512;
    p.kv_tokens = 16 * 4;
    job(&j[0], 0, 40, 40, 0, &r[0]); /* 79 positions: 5 blocks > 4 */
    job(&j[1], 1, 20, 20, 0, &r[1]);
    st = et_run_jobs(g_m, &p, j, 2, NULL);
    CHECKF(r[0].finish == KILN_FINISH_ERROR && r[0].status == KILN_ERR_CONTEXT_OVER_BUDGET &&
               strstr(r[0].message, "pool"),
           "pool: finish %s status %d '%s'", kiln_finish_reason_name(r[0].finish), (int)r[0].status,
           r[0].message);
    CHECK(r[1].finish == KILN_FINISH_LENGTH && r[1].n_tokens == 20);
    CHECK(st.kv_blocks_used == 0);
    for (int k = 0; k < 2; k++) et_result_free(&r[k]);
}

static void test_failure_isolated(void) {
    kiln_engine_params p = params();
    et_job j[3];
    et_result a[3], b[3];
    for (int k = 0; k < 3; k++) job(&j[k], k, 15 + 10 * k, 20, 0, &a[k]);
    et_run_jobs(g_m, &p, j, 3, NULL);
    for (int k = 0; k < 3; k++) job(&j[k], k, 15 + 10 * k, 20, 0, &b[k]);
    j[1].dbg.fail_at_token = 5;
    kiln_engine_stats st = et_run_jobs(g_m, &p, j, 3, NULL);
    CHECKF(b[1].finish == KILN_FINISH_ERROR && b[1].status == KILN_ERR_INTERNAL &&
               strstr(b[1].message, "injected"),
           "failing request: %s %d '%s'", kiln_finish_reason_name(b[1].finish), (int)b[1].status,
           b[1].message);
    CHECK(b[1].n_tokens == 4);
    CHECK(same_output(&a[0], &b[0]) && same_output(&a[2], &b[2]));
    CHECK(st.kv_blocks_used == 0);
    for (int k = 0; k < 3; k++) {
        et_result_free(&a[k]);
        et_result_free(&b[k]);
    }
}

int main(void) {
    g_m = et_load("models/stories260K/stories260K-f32.gguf");
    g_nv = kiln_model_n_vocab(g_m);
    test_cancel();
    test_destroy_cancels();
    test_small_pool();
    test_tiny_budget();
    test_context_over_budget();
    test_failure_isolated();
    kiln_model_free(g_m);
    return kiln_test_finish("test_engine_scheduling");
}
