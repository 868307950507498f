/*
 * The public C API (include/kiln.h) on stories260K:
 *   - validation at submit: every bad field is rejected with KILN_ERR_INVALID_ARGUMENT and a
 *     message naming it, no stream is returned, and the engine thread never sees the request
 *     (no step runs, nothing is queued or finished);
 *   - engine parameter validation;
 *   - queue_full once max_queue requests wait (the engine is held at a step boundary);
 *   - stream reading: non-blocking, with a timeout, NONE after FINISH, NULL arguments;
 *   - a text prompt tokenizes as llama2.c run.c does and greedy output equals run.c's;
 *   - destroying the engine finishes running requests as cancelled, and their streams stay
 *     readable;
 *   - an idle engine sleeps (little CPU time while idle);
 *   - model accessors (n_vocab, tokenize with a short buffer, token pieces).
 */
#include <jansson.h>
#include <math.h>
#include <time.h>

#include "engine_test_util.h"

static kiln_model *g_m;
static int32_t g_nv;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A gate the step hook waits at while closed. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool closed;
    int64_t steps;
} gate;

static void gate_hook(void *user, kiln_engine *e, int64_t step) {
    (void)e;
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->steps = step + 1;
    while (g->closed) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->closed = false;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static int32_t g_ids[8] = {1, 403, 407, 261, 378, 5, 6, 7};

static kiln_request base_request(void) {
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = g_ids;
    r.n_prompt_ids = 5;
    r.max_tokens = 4;
    return r;
}

static void expect_invalid(kiln_engine *e, const kiln_request *r, const char *field) {
    kiln_error err = {0};
    kiln_stream *s = (kiln_stream *)(uintptr_t)1;
    kiln_status st = kiln_engine_submit(e, r, &s, &err);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT, "%s: status %s, want invalid_argument (%s)", field,
           kiln_status_name(st), err.message);
    CHECKF(s == NULL, "%s: a stream was returned", field);
    CHECKF(strstr(err.message, field) != NULL, "%s: message '%s' does not name the field", field,
           err.message);
    if (s && s != (kiln_stream *)(uintptr_t)1) kiln_stream_destroy(s);
}

static void test_validation(void) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    gate g = {.closed = false};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    kiln_engine_debug dbg = {.on_step = gate_hook, .user = &g};
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 1;
    REQUIRE(kiln_engine_create_debug(g_m, &p, &dbg, &e, &err) == KILN_OK);

    kiln_request r = base_request();
    r.prompt_ids = NULL;
    r.n_prompt_ids = 0;
    expect_invalid(e, &r, "prompt"); /* neither text nor ids */
    r.prompt = "";
    expect_invalid(e, &r, "prompt");
    r.prompt = "ok \xC3\x28 bad";
    expect_invalid(e, &r, "prompt");
    r = base_request();
    r.n_prompt_ids = 0;
    expect_invalid(e, &r, "prompt");
    int32_t bad[3] = {1, -1, 5};
    r.prompt_ids = bad;
    r.n_prompt_ids = 3;
    expect_invalid(e, &r, "prompt_ids[1]");
    bad[1] = g_nv;
    expect_invalid(e, &r, "prompt_ids[1]");

    r = base_request();
    r.max_tokens = 0;
    expect_invalid(e, &r, "max_tokens");
    float temps[] = {-0.01f, 2.01f, NAN};
    for (int i = 0; i < 3; i++) {
        r = base_request();
        r.temperature = temps[i];
        expect_invalid(e, &r, "temperature");
    }
    float top_ps[] = {0.0f, 1.01f, NAN};
    for (int i = 0; i < 3; i++) {
        r = base_request();
        r.top_p = top_ps[i];
        expect_invalid(e, &r, "top_p");
    }
    float min_ps[] = {-0.01f, 1.01f};
    for (int i = 0; i < 2; i++) {
        r = base_request();
        r.min_p = min_ps[i];
        expect_invalid(e, &r, "min_p");
    }
    r = base_request();
    r.top_k = -1;
    expect_invalid(e, &r, "top_k");
    int32_t tls[] = {-1, 21};
    for (int i = 0; i < 2; i++) {
        r = base_request();
        r.top_logprobs = tls[i];
        expect_invalid(e, &r, "top_logprobs");
    }
    const char *five[] = {"a", "b", "c", "d", "e"};
    r = base_request();
    r.stop = five;
    r.n_stop = 5;
    expect_invalid(e, &r, "stop");
    const char *empty[] = {"x", ""};
    r.stop = empty;
    r.n_stop = 2;
    expect_invalid(e, &r, "stop");
    int32_t bias_id = g_nv;
    float bias_v = 1.0f;
    r = base_request();
    r.logit_bias_ids = &bias_id;
    r.logit_bias_values = &bias_v;
    r.n_logit_bias = 1;
    expect_invalid(e, &r, "logit_bias");
    r = base_request();
    int32_t stop_id = -3;
    r.stop_token_ids = &stop_id;
    r.n_stop_token_ids = 1;
    expect_invalid(e, &r, "stop_token_ids");
    r = base_request();
    r.presence_penalty = 2.5f;
    expect_invalid(e, &r, "presence_penalty");
    r = base_request();
    r.frequency_penalty = -2.5f;
    expect_invalid(e, &r, "frequency_penalty");
    r = base_request();
    r.repetition_penalty = 0.0f;
    expect_invalid(e, &r, "repetition_penalty");
    CHECK(kiln_engine_submit(e, NULL, &(kiln_stream *){NULL}, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_engine_submit(e, &r, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_engine_submit(NULL, &r, &(kiln_stream *){NULL}, &err) == KILN_ERR_INVALID_ARGUMENT);

    /* None of them reached the engine thread. */
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    pthread_mutex_lock(&g.mu);
    int64_t steps = g.steps;
    pthread_mutex_unlock(&g.mu);
    CHECKF(steps == 0 && st.n_steps == 0 && st.n_queued == 0 && st.n_requests_finished == 0,
           "rejected requests reached the engine: %lld hook calls, %lld steps, %d queued",
           (long long)steps, (long long)st.n_steps, st.n_queued);

    /* A valid request after all that works. */
    r = base_request();
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
    et_result res;
    et_collect(s, &res, g_nv);
    CHECK(res.finish == KILN_FINISH_LENGTH && res.n_tokens == 4 && res.order_ok);
    CHECK(res.usage.prompt_tokens == 5 && res.usage.completion_tokens == 4);
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

static void expect_bad_params(const kiln_engine_params *p, const char *field) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    kiln_status st = kiln_engine_create(g_m, p, &e, &err);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT && e == NULL && strstr(err.message, field),
           "params %s: %s '%s'", field, kiln_status_name(st), err.message);
    kiln_engine_destroy(e);
}

static void test_params(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.kv_memory = 100;
    expect_bad_params(&p, "kv_memory");
    p = kiln_engine_default_params();
    p.kv_type = (kiln_kv_type)7;
    expect_bad_params(&p, "kv_type");
    p = kiln_engine_default_params();
    p.n_threads = 1000;
    expect_bad_params(&p, "n_threads");
    p = kiln_engine_default_params();
    p.step_tokens = -1;
    expect_bad_params(&p, "step_tokens");
    kiln_error err = {0};
    CHECK(kiln_engine_create(NULL, NULL, &(kiln_engine *){NULL}, &err) ==
          KILN_ERR_INVALID_ARGUMENT);
    /* Defaults: 16 contexts of the model (512 positions) in 16-position blocks. */
    kiln_engine *e = NULL;
    REQUIRE(kiln_engine_create(g_m, NULL, &e, &err) == KILN_OK);
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_total == 16 * 512 / 16 && st.block_size == 16,
           "default pool: %d blocks of %d", st.kv_blocks_total, st.block_size);
    kiln_engine_destroy(e);
    kiln_engine_destroy(NULL);
}

static void test_queue_and_stream(void) {
    gate g = {.closed = true};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    kiln_engine_debug dbg = {.on_step = gate_hook, .user = &g};
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 1;
    p.max_queue = 3;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create_debug(g_m, &p, &dbg, &e, &err) == KILN_OK);
    kiln_request r = base_request();
    kiln_stream *s[4] = {0};
    for (int i = 0; i < 3; i++) REQUIRE(kiln_engine_submit(e, &r, &s[i], &err) == KILN_OK);
    kiln_status st = kiln_engine_submit(e, &r, &s[3], &err);
    CHECKF(st == KILN_ERR_QUEUE_FULL && s[3] == NULL && strstr(err.message, "max_queue"),
           "4th submit: %s '%s'", kiln_status_name(st), err.message);
    CHECK(!strcmp(kiln_status_name(KILN_ERR_QUEUE_FULL), "queue_full"));

    /* Nothing can arrive while the engine is held. */
    kiln_event ev;
    double t = now_ms();
    CHECK(kiln_stream_next(s[0], 0, &ev, &err) == KILN_OK && ev.type == KILN_EVENT_NONE);
    CHECK(now_ms() - t < 20);
    t = now_ms();
    CHECK(kiln_stream_next(s[0], 60, &ev, &err) == KILN_OK && ev.type == KILN_EVENT_NONE);
    double waited = now_ms() - t;
    CHECKF(waited >= 50 && waited < 2000, "timeout 60 ms waited %.1f ms", waited);
    CHECK(!kiln_stream_finished(s[0]));
    CHECK(kiln_stream_next(NULL, 0, &ev, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stream_next(s[0], 0, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);

    gate_open(&g);
    for (int i = 0; i < 3; i++) {
        et_result res;
        et_collect(s[i], &res, g_nv); /* also checks NONE right after FINISH */
        CHECK(res.finish == KILN_FINISH_LENGTH && res.n_tokens == 4);
        CHECK(kiln_stream_finished(s[i]));
        t = now_ms();
        CHECK(kiln_stream_next(s[i], 1000, &ev, &err) == KILN_OK && ev.type == KILN_EVENT_NONE);
        CHECKF(now_ms() - t < 500, "next after FINISH waited");
    }
    for (int i = 0; i < 3; i++) kiln_stream_destroy(s[i]);
    /* Room again. */
    REQUIRE(kiln_engine_submit(e, &r, &s[0], &err) == KILN_OK);
    kiln_stream_destroy(s[0]);
    kiln_stream_destroy(NULL);
    kiln_stream_cancel(NULL);
    kiln_engine_destroy(e);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

static void test_text_prompt_golden(void) {
    const char *gpath = kiln_test_shared("golden/llama2c-greedy.json");
    kiln_test_require_file(gpath);
    json_error_t jerr;
    json_t *root = json_load_file(gpath, 0, &jerr);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases");
    kiln_engine *e = NULL;
    kiln_error err = {0};
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 2;
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    int n_cases = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        if (strcmp(json_string_value(json_object_get(c, "model")), "stories260K")) continue;
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        if (!prompt[0]) continue; /* empty text is rejected by design */
        json_t *pi = json_object_get(c, "prompt_ids"), *gi = json_object_get(c, "generated_ids");
        kiln_request r = kiln_request_defaults();
        r.prompt = prompt;
        r.temperature = 0.0f;
        r.max_tokens = 40;
        kiln_stream *s = NULL;
        REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
        et_result res;
        et_collect(s, &res, g_nv);
        CHECKF(res.usage.prompt_tokens == (int32_t)json_array_size(pi),
               "'%s': %d prompt tokens, run.c %zu", prompt, res.usage.prompt_tokens,
               json_array_size(pi));
        bool same = res.n_tokens == 40;
        for (int32_t k = 0; same && k < 40; k++)
            same = res.tokens[k] == (int32_t)json_integer_value(json_array_get(gi, (size_t)k));
        CHECKF(same, "'%s': greedy tokens differ from llama2.c run.c's", prompt);
        CHECK(res.text_events_valid_utf8 && res.order_ok && res.text_len > 0);
        kiln_stream_destroy(s);
        n_cases++;
    }
    CHECK(n_cases == 5);
    json_decref(root);
    kiln_engine_destroy(e);
}

static void test_destroy_engine_and_idle(void) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 2;
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    kiln_request r = base_request();
    r.max_tokens = 4;
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
    et_result res;
    et_collect(s, &res, g_nv);
    kiln_stream_destroy(s);
    /* Idle: the engine thread sleeps on its condition variable. */
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    double c0 = cpu_ms(), w0 = now_ms();
    ts.tv_nsec = 300000000;
    nanosleep(&ts, NULL);
    double used = cpu_ms() - c0, wall = now_ms() - w0;
    CHECKF(used < 0.2 * wall, "idle engine used %.1f ms of CPU in %.1f ms", used, wall);

    /* Destroying the engine with requests running and queued. */
    r.max_tokens = 400;
    r.n_prompt_ids = 5;
    r.ignore_eos = true;
    kiln_stream *a = NULL, *b = NULL;
    REQUIRE(kiln_engine_submit(e, &r, &a, &err) == KILN_OK);
    REQUIRE(kiln_engine_submit(e, &r, &b, &err) == KILN_OK);
    kiln_event ev;
    do REQUIRE(kiln_stream_next(a, -1, &ev, &err) == KILN_OK);
    while (ev.type != KILN_EVENT_TOKEN);
    kiln_engine_destroy(e);
    CHECK(kiln_stream_finished(a) && kiln_stream_finished(b));
    et_result ra, rb;
    et_collect(a, &ra, g_nv);
    et_collect(b, &rb, g_nv);
    CHECKF(ra.finish == KILN_FINISH_CANCELLED && rb.finish == KILN_FINISH_CANCELLED,
           "after engine destroy: %s, %s", kiln_finish_reason_name(ra.finish),
           kiln_finish_reason_name(rb.finish));
    CHECK(ra.usage.completion_tokens < 400);
    kiln_stream_destroy(a);
    kiln_stream_destroy(b);
}

static void test_model_accessors(void) {
    CHECK(kiln_model_n_vocab(g_m) == 512 && kiln_model_n_ctx_train(g_m) == 512);
    int32_t ids[3], n = 0;
    kiln_error err = {0};
    CHECK(kiln_model_tokenize(g_m, "Once upon a time", 16, true, false, ids, 3, &n, &err) ==
          KILN_OK);
    CHECK(n == 5 && ids[0] == 1 && ids[1] == 403 && ids[2] == 407);
    CHECK(kiln_model_tokenize(g_m, "\xFF", 1, true, false, ids, 3, &n, &err) ==
          KILN_ERR_INVALID_ARGUMENT);
    char buf[16];
    CHECK(kiln_model_token_piece(g_m, 403, buf, sizeof buf) > 0);
    CHECK(kiln_model_token_piece(g_m, g_nv, buf, sizeof buf) == 0);
    kiln_model *m = NULL;
    CHECK(kiln_model_load("/nonexistent/model.gguf", NULL, &m, &err) != KILN_OK && m == NULL);
    CHECK(strstr(err.message, "/nonexistent/model.gguf") != NULL);
    kiln_model_free(NULL);
}

int main(void) {
    g_m = et_load("models/stories260K/stories260K-f32.gguf");
    g_nv = kiln_model_n_vocab(g_m);
    test_validation();
    test_params();
    test_queue_and_stream();
    test_text_prompt_golden();
    test_destroy_engine_and_idle();
    test_model_accessors();
    kiln_model_free(g_m);
    return kiln_test_finish("test_engine_api");
}
