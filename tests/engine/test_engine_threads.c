/*
 * 64 threads submit at once (released together by a barrier) to one engine, each reading its
 * own stream; half the prompts are text, half token ids, with a mix of greedy and seeded
 * sampling, stop strings and small max_tokens. Every result must equal the same request run
 * alone (batch invariance again, now with concurrent submission). Run under ASan+UBSan by
 * the sanitizer build.
 */
#include "engine_test_util.h"

#define N_THREADS 64

static kiln_model *g_m;
static int32_t g_nv;
static kiln_engine *g_e;
static pthread_barrier_t g_barrier;

typedef struct worker {
    int k;
    int32_t ids[40];
    char text[128];
    const char *stops[1];
    kiln_request req;
    et_result *alone, *together;
    kiln_status st;
} worker;

static void make_request(worker *w) {
    int k = w->k;
    w->req = kiln_request_defaults();
    if (k % 2 == 0) {
        static const char *starts[] = {"Once upon a time", "The cat", "Lily and Tom", "A big dog",
                                       "One day"};
        snprintf(w->text, sizeof w->text, "%s %d", starts[k % 5], k);
        w->req.prompt = w->text;
    } else {
        int32_t n = 1 + (k * 7) % 40;
        et_prompt(w->ids, n, (uint64_t)k, g_nv);
        w->req.prompt_ids = w->ids;
        w->req.n_prompt_ids = n;
    }
    w->req.max_tokens = 2 + k % 7;
    if (k % 3 == 0) {
        w->req.temperature = 0.0f;
    } else {
        w->req.temperature = 0.8f;
        w->req.top_p = 0.9f;
        w->req.seed = (uint64_t)k * 31;
    }
    if (k % 5 == 1) {
        w->stops[0] = "e";
        w->req.stop = w->stops;
        w->req.n_stop = 1;
    }
}

static void *submit_and_read(void *arg) {
    worker *w = arg;
    kiln_stream *s = NULL;
    kiln_error err = {0};
    pthread_barrier_wait(&g_barrier);
    w->st = kiln_engine_submit(g_e, &w->req, &s, &err);
    if (w->st == KILN_OK) et_collect(s, w->together, g_nv);
    kiln_stream_destroy(s);
    return NULL;
}

int main(void) {
    g_m = et_load("models/stories260K/stories260K-f32.gguf");
    g_nv = kiln_model_n_vocab(g_m);
    static worker w[N_THREADS];
    static et_result alone[N_THREADS], together[N_THREADS];
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 2;
    p.step_tokens = 64;
    p.prefill_chunk = 16;
    kiln_error err = {0};

    /* Alone, one after another. */
    REQUIRE(kiln_engine_create(g_m, &p, &g_e, &err) == KILN_OK);
    for (int k = 0; k < N_THREADS; k++) {
        w[k].k = k;
        w[k].alone = &alone[k];
        w[k].together = &together[k];
        make_request(&w[k]);
        kiln_stream *s = NULL;
        REQUIRE(kiln_engine_submit(g_e, &w[k].req, &s, &err) == KILN_OK);
        et_collect(s, &alone[k], g_nv);
        kiln_stream_destroy(s);
    }
    kiln_engine_destroy(g_e);

    /* Together, from 64 threads at once, on a fresh engine. */
    REQUIRE(kiln_engine_create(g_m, &p, &g_e, &err) == KILN_OK);
    pthread_barrier_init(&g_barrier, NULL, N_THREADS);
    pthread_t th[N_THREADS];
    for (int k = 0; k < N_THREADS; k++)
        REQUIRE(pthread_create(&th[k], NULL, submit_and_read, &w[k]) == 0);
    for (int k = 0; k < N_THREADS; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&g_barrier);
    kiln_engine_stats st;
    kiln_engine_get_stats(g_e, &st);
    CHECKF(st.kv_blocks_used == 0 && st.n_running == 0 && st.n_queued == 0,
           "after all streams finished: %d blocks, %d running, %d queued", st.kv_blocks_used,
           st.n_running, st.n_queued);
    CHECKF(st.n_requests_finished == N_THREADS, "%lld finished", (long long)st.n_requests_finished);
    printf("peak KV blocks with 64 submitters: %d\n", st.kv_blocks_peak);
    CHECKF(st.kv_blocks_peak > 4, "peak %d blocks: the requests did not overlap",
           st.kv_blocks_peak);
    kiln_engine_destroy(g_e);

    int stopped = 0;
    for (int k = 0; k < N_THREADS; k++) {
        const et_result *a = &alone[k], *b = &together[k];
        CHECKF(w[k].st == KILN_OK, "thread %d: submit failed", k);
        CHECKF(a->finish == b->finish && a->n_tokens == b->n_tokens &&
                   !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) &&
                   a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len) &&
                   a->usage.prompt_tokens == b->usage.prompt_tokens &&
                   a->usage.completion_tokens == b->usage.completion_tokens,
               "request %d differs between alone and 64 concurrent submitters", k);
        CHECK(b->order_ok && b->text_events_valid_utf8);
        CHECK(a->finish == KILN_FINISH_LENGTH || a->finish == KILN_FINISH_STOP);
        if (w[k].req.n_stop) {
            CHECK(strchr(b->text, 'e') == NULL);
            stopped += b->finish == KILN_FINISH_STOP;
        }
    }
    CHECKF(stopped > 0, "no request ended on its stop string");
    kiln_model_free(g_m);
    return kiln_test_finish("test_engine_threads");
}
