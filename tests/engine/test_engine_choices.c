/*
 * n choices of one request (kiln_engine_submit_n, OpenAI's `n`): what a user expects, bitwise.
 *   - choice i is exactly a single request with seed + i: the same tokens, logprobs, top
 *     logprobs, text and finish (the reference runs each alone on a fresh engine without the
 *     prefix cache, so nothing is shared there);
 *   - greedy choices are all equal;
 *   - the prompt is computed once: the engine feeds P + n - 1 prompt positions (choice 0's P,
 *     then each fork's last prompt token), not n * P, and counts n - 1 forks, for prompts whose
 *     last shared position ends mid-block (a copy-on-write of the partial block) and on a block
 *     boundary (no copy); a one-token prompt cannot fork (each choice computes it);
 *   - choice 0 cancelled before it runs: the other choices still finish, as single requests;
 *   - every block goes back to the pool; n outside [1, 16] is refused.
 *
 * usage: test_engine_choices MODEL_REL
 */
#include "engine_test_util.h"

#define MAX_TOK 24
#define N_MAX   4

static const kiln_model *g_m;
static int32_t g_nv;

static kiln_engine *make_engine(bool cache) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 256;
    p.kv_tokens = 64 * 256;
    p.n_threads = 2;
    p.no_prefix_cache = !cache;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    return e;
}

static kiln_request make_req(const int32_t *ids, int32_t n, bool sampled, uint64_t seed) {
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = ids;
    r.n_prompt_ids = n;
    r.max_tokens = MAX_TOK;
    r.ignore_eos = true;
    r.logprobs = true;
    r.top_logprobs = 3;
    r.temperature = sampled ? 0.9f : 0.0f;
    r.top_p = sampled ? 0.95f : 1.0f;
    r.seed = seed;
    return r;
}

static bool same(const et_result *a, const et_result *b) {
    return a->finish == b->finish && a->n_tokens == b->n_tokens &&
           !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]) &&
           !memcmp(a->logprob, b->logprob, (size_t)a->n_tokens * sizeof a->logprob[0]) &&
           !memcmp(a->top, b->top, sizeof a->top) && !memcmp(a->n_top, b->n_top, sizeof a->n_top) &&
           a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len) &&
           a->usage.prompt_tokens == b->usage.prompt_tokens &&
           a->usage.completion_tokens == b->usage.completion_tokens;
}

/* The reference: a single request with this seed, alone on a fresh engine, no cache. */
static void single(const int32_t *ids, int32_t n, bool sampled, uint64_t seed, et_result *out) {
    kiln_engine *e = make_engine(false);
    kiln_request r = make_req(ids, n, sampled, seed);
    kiln_stream *s = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
    et_collect(s, out, g_nv);
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
}

/* n choices on a fresh engine; returns its stats after they all finished. */
static kiln_engine_stats choices(const int32_t *ids, int32_t n_prompt, bool sampled,
                                 uint64_t seed, int32_t n, bool cache, bool cancel_first,
                                 et_result *out) {
    kiln_engine *e = make_engine(cache);
    kiln_request r = make_req(ids, n_prompt, sampled, seed);
    kiln_stream *s[N_MAX] = {0};
    kiln_error err = {0};
    kiln_status st = kiln_engine_submit_n(e, &r, n, s, &err);
    CHECKF(st == KILN_OK, "submit_n: %s", err.message);
    REQUIRE(st == KILN_OK);
    if (cancel_first) kiln_stream_cancel(s[0]);
    for (int32_t i = 0; i < n; i++) {
        et_collect(s[i], &out[i], g_nv);
        kiln_stream_destroy(s[i]);
    }
    kiln_engine_stats stats;
    kiln_engine_get_stats(e, &stats);
    kiln_engine_destroy(e);
    return stats;
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    kiln_model *m = et_load_opt(argv[1], false);
    g_m = m;
    g_nv = kiln_model_n_vocab(m);
    int32_t ids[64];
    et_prompt(ids, 64, 7, g_nv);

    /* P = 38: the forks share 2 full blocks and copy the third (positions 32..36); P = 33:
     * the 32 shared positions are 2 full blocks, nothing to copy; P = 1: no fork. */
    const int32_t lens[] = {38, 33, 1};
    for (int li = 0; li < 3; li++) {
        const int32_t P = lens[li];
        for (int cache = 0; cache <= 1; cache++) {
            et_result ref[N_MAX], got[N_MAX];
            for (int32_t i = 0; i < N_MAX; i++) single(ids, P, true, 500 + (uint64_t)i, &ref[i]);
            kiln_engine_stats st = choices(ids, P, true, 500, N_MAX, cache, false, got);
            for (int32_t i = 0; i < N_MAX; i++) {
                CHECKF(same(&got[i], &ref[i]),
                       "P=%d cache=%d: choice %d differs from the single request with seed "
                       "500+%d (%d vs %d tokens, finish %s: %s)",
                       P, cache, i, i, got[i].n_tokens, ref[i].n_tokens,
                       kiln_finish_reason_name(got[i].finish), got[i].message);
                CHECK(got[i].usage.prompt_tokens == P);
            }
            /* the choices sample apart (seeds differ) */
            CHECKF(!same(&got[0], &got[1]), "P=%d: choices 0 and 1 are equal", P);
            const int64_t want_forks = P > 1 ? N_MAX - 1 : 0;
            const int64_t want_prefill = P > 1 ? P + N_MAX - 1 : (int64_t)N_MAX * P;
            CHECKF(st.n_forked == want_forks, "P=%d cache=%d: %lld forks, expected %lld", P,
                   cache, (long long)st.n_forked, (long long)want_forks);
            CHECKF(st.n_prefill_tokens == want_prefill,
                   "P=%d cache=%d: %lld prompt positions computed, expected %lld (n*P = %d)", P,
                   cache, (long long)st.n_prefill_tokens, (long long)want_prefill, N_MAX * P);
            CHECKF(st.kv_blocks_used == 0, "P=%d: %d blocks still used", P, st.kv_blocks_used);
            CHECK(st.n_requests_finished == N_MAX);
            for (int32_t i = 0; i < N_MAX; i++) {
                et_result_free(&ref[i]);
                et_result_free(&got[i]);
            }
        }
    }

    /* greedy: every choice equals the greedy single request */
    {
        et_result ref, got[3];
        single(ids, 38, false, 1, &ref);
        kiln_engine_stats st = choices(ids, 38, false, 1, 3, true, false, got);
        for (int i = 0; i < 3; i++)
            CHECKF(same(&got[i], &ref), "greedy choice %d differs from the single request", i);
        CHECK(st.n_forked == 2);
        et_result_free(&ref);
        for (int i = 0; i < 3; i++) et_result_free(&got[i]);
    }

    /* choice 0 cancelled at once: the others run as single requests */
    {
        et_result ref[3], got[3];
        for (int i = 0; i < 3; i++) single(ids, 38, true, 77 + (uint64_t)i, &ref[i]);
        kiln_engine_stats st = choices(ids, 38, true, 77, 3, false, true, got);
        CHECK(got[0].finish == KILN_FINISH_CANCELLED || same(&got[0], &ref[0]));
        for (int i = 1; i < 3; i++)
            CHECKF(same(&got[i], &ref[i]), "after cancelling choice 0, choice %d differs", i);
        CHECK(st.kv_blocks_used == 0 && st.n_requests_finished == 3);
        for (int i = 0; i < 3; i++) {
            et_result_free(&ref[i]);
            et_result_free(&got[i]);
        }
    }

    /* bad n */
    {
        kiln_engine *e = make_engine(true);
        kiln_request r = make_req(ids, 8, false, 0);
        kiln_stream *s[KILN_MAX_CHOICES + 1];
        kiln_error err = {0};
        CHECK(kiln_engine_submit_n(e, &r, 0, s, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_engine_submit_n(e, &r, KILN_MAX_CHOICES + 1, s, &err) ==
              KILN_ERR_INVALID_ARGUMENT);
        CHECK(strstr(err.message, "n must be in [1, 16]") != NULL);
        CHECK(kiln_engine_submit_n(e, &r, 2, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
        r.n_prompt_ids = 0; /* a validation error: no stream is left behind */
        s[0] = s[1] = (kiln_stream *)1;
        CHECK(kiln_engine_submit_n(e, &r, 2, s, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(s[0] == NULL && s[1] == NULL);
        kiln_engine_destroy(e);
    }
    kiln_model_free(m);
    return kiln_test_finish("test_engine_choices");
}
