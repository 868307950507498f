/*
 * Prompt logprobs (kiln_request.prompt_logprobs; OpenAI `echo` with `logprobs`):
 *   - one PROMPT_LOGPROB event per prompt token i >= 1, in order, before the first TOKEN;
 *   - its logprob is the log-softmax of the raw logits of position i - 1 at token i, checked
 *     against a log-softmax computed here (in double) from one full forward of the whole
 *     prompt (kiln_model_forward with every row, as `kiln logits` runs it); its top entries
 *     are that row's best, most likely first;
 *   - bitwise the same values for a prefill in chunks of 1, 7, 16 and all at once (at most
 *     256 positions a step), with speculation (the spec method's plan), and among other
 *     requests (batch invariance);
 *   - a second identical request takes no prefix-cache hit (cached_tokens 0) and gets the
 *     same values; n = 2 choices each get them (no fork);
 *   - the generated tokens are those of the same request without prompt logprobs.
 *
 * usage: test_engine_prompt_logprobs MODEL_REL
 */
#include <math.h>

#include "backend/runner.h"
#include "engine_test_util.h"

#define P    300 /* more than KILN_PROMPT_ROWS_MAX: two steps even unchunked */
#define TOPN 5

typedef struct plp {
    int32_t n; /* PROMPT_LOGPROB events */
    int32_t token[P], index[P], n_top[P];
    float logprob[P];
    kiln_token_logprob top[P][KILN_MAX_TOP_LOGPROBS];
    bool order_ok; /* indices 1, 2, ... and all before the first TOKEN */
    int32_t gen[64], n_gen;
    kiln_usage usage;
} plp;

static const kiln_model *g_m;
static int32_t g_nv;
static int32_t g_ids[P];

static kiln_engine *make_engine(int32_t chunk, bool cache) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 512;
    p.kv_tokens = 8 * 512;
    p.n_threads = 2;
    p.prefill_chunk = chunk;
    p.no_prefix_cache = !cache;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    return e;
}

static kiln_request make_req(bool prompt_lp) {
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = g_ids;
    r.n_prompt_ids = P;
    r.max_tokens = 8;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.prompt_logprobs = prompt_lp;
    r.top_prompt_logprobs = prompt_lp ? TOPN : 0;
    return r;
}

static void collect(kiln_stream *s, plp *o) {
    memset(o, 0, sizeof *o);
    o->order_ok = true;
    kiln_error err = {0};
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, -1, &ev, &err) == KILN_OK);
        if (ev.type == KILN_EVENT_PROMPT_LOGPROB) {
            if (o->n_gen > 0 || o->n >= P || ev.index != o->n + 1) o->order_ok = false;
            if (o->n < P) {
                o->token[o->n] = ev.token;
                o->index[o->n] = ev.index;
                o->logprob[o->n] = ev.logprob;
                o->n_top[o->n] = ev.n_top_logprobs;
                memcpy(o->top[o->n], ev.top_logprobs, sizeof ev.top_logprobs);
                o->n++;
            }
        } else if (ev.type == KILN_EVENT_TOKEN) {
            if (o->n_gen < 64) o->gen[o->n_gen++] = ev.token;
        } else if (ev.type == KILN_EVENT_FINISH) {
            o->usage = ev.usage;
            break;
        } else if (ev.type == KILN_EVENT_NONE) {
            o->order_ok = false;
            break;
        }
    }
    kiln_stream_destroy(s);
}

static void run_one(kiln_engine *e, const kiln_request *r, plp *o) {
    kiln_stream *s = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_submit(e, r, &s, &err) == KILN_OK);
    collect(s, o);
}

static bool same(const plp *a, const plp *b) {
    return a->n == b->n && !memcmp(a->token, b->token, sizeof a->token) &&
           !memcmp(a->logprob, b->logprob, sizeof a->logprob) &&
           !memcmp(a->n_top, b->n_top, sizeof a->n_top) && !memcmp(a->top, b->top, sizeof a->top) &&
           a->n_gen == b->n_gen && !memcmp(a->gen, b->gen, sizeof a->gen);
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    kiln_model *m = et_load_opt(argv[1], false);
    g_m = m;
    g_nv = kiln_model_n_vocab(m);
    et_prompt(g_ids, P, 11, g_nv);

    /* the reference: every row of one forward over the whole prompt */
    float *ref = malloc((size_t)P * (size_t)g_nv * sizeof *ref);
    REQUIRE(ref);
    kiln_kv_seq *kv = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_kv_seq_create(m, P, KILN_DTYPE_F32, &kv, &err) == KILN_OK);
    REQUIRE(kiln_model_forward(m, kv, NULL, g_ids, P, 0, true, ref, &err) == KILN_OK);
    kiln_kv_seq_destroy(kv);

    /* unchunked, alone */
    kiln_engine *e = make_engine(0, false);
    plp base;
    kiln_request req = make_req(true);
    run_one(e, &req, &base);
    CHECK(base.order_ok);
    CHECK(base.n == P - 1);
    double max_err = 0.0;
    bool top_ok = true, tok_ok = true;
    for (int32_t i = 1; i < P && i <= base.n; i++) {
        const float *row = ref + (size_t)(i - 1) * (size_t)g_nv; /* position i - 1 */
        double mx = -INFINITY, sum = 0.0;
        for (int32_t v = 0; v < g_nv; v++) mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < g_nv; v++) sum += exp((double)row[v] - mx);
        double lse = mx + log(sum);
        if (base.token[i - 1] != g_ids[i] || base.index[i - 1] != i) tok_ok = false;
        double d = fabs(((double)row[g_ids[i]] - lse) - (double)base.logprob[i - 1]);
        if (d > max_err) max_err = d;
        if (base.n_top[i - 1] != TOPN) top_ok = false;
        for (int32_t k = 0; k < base.n_top[i - 1] && k < TOPN; k++) {
            const kiln_token_logprob t = base.top[i - 1][k];
            /* most likely first; no token outside the top beats the k-th */
            if (k > 0 && t.logprob > base.top[i - 1][k - 1].logprob) top_ok = false;
            if (fabs(((double)row[t.token] - lse) - (double)t.logprob) > 1e-4) top_ok = false;
            int32_t better = 0;
            for (int32_t v = 0; v < g_nv; v++) better += row[v] > row[t.token] + 1e-5f;
            if (better > k) top_ok = false;
        }
    }
    printf("prompt logprobs vs full-forward log-softmax: max |err| = %.3g over %d tokens\n",
           max_err, base.n);
    CHECK(tok_ok);
    CHECK(max_err < 1e-4);
    CHECK(top_ok);
    CHECK(base.n_gen == 8);

    /* the generated tokens are unchanged by prompt logprobs */
    plp plain;
    kiln_request req0 = make_req(false);
    run_one(e, &req0, &plain);
    CHECK(plain.n == 0);
    CHECK(plain.n_gen == base.n_gen && !memcmp(plain.gen, base.gen, sizeof plain.gen));
    kiln_engine_destroy(e);

    /* chunked: bitwise; and through the speculation method (random drafts, greedy: the
     * output is unchanged) */
    const int32_t chunks[] = {1, 7, 16, 7};
    for (int c = 0; c < 4; c++) {
        e = make_engine(chunks[c], false);
        plp got;
        kiln_request rq = req;
        if (c == 3) {
            rq.spec = KILN_SPEC_RANDOM;
            rq.spec_k = 3;
        }
        run_one(e, &rq, &got);
        printf("prefill_chunk %d%s: %s\n", chunks[c], c == 3 ? " (speculation)" : "",
               same(&got, &base) ? "bitwise" : "DIFFERS");
        CHECK(got.order_ok);
        CHECK(same(&got, &base));
        kiln_engine_destroy(e);
    }

    /* with the prefix cache: the second request must not take a hit; among other requests */
    e = make_engine(7, true);
    plp a, b;
    run_one(e, &req, &a);
    run_one(e, &req0, &plain); /* this one may hit the cache */
    kiln_stream *ss[3] = {0};
    REQUIRE(kiln_engine_submit_n(e, &req, 2, ss, &err) == KILN_OK);
    REQUIRE(kiln_engine_submit(e, &req0, &ss[2], &err) == KILN_OK);
    plp c0, c1, other;
    collect(ss[0], &c0);
    collect(ss[1], &c1);
    collect(ss[2], &other);
    run_one(e, &req, &b);
    CHECK(same(&a, &base));
    CHECK(same(&b, &base));
    CHECK(b.usage.cached_tokens == 0);
    CHECK(plain.usage.cached_tokens > 0); /* the cache works, and prompt logprobs skip it */
    CHECK(same(&c0, &base) && c0.order_ok);
    CHECK(same(&c1, &base) && c1.order_ok);
    CHECK(other.n == 0);
    kiln_engine_destroy(e);

    /* top_prompt_logprobs out of range is refused */
    kiln_request bad = make_req(true);
    bad.top_prompt_logprobs = 21;
    e = make_engine(0, false);
    kiln_stream *s = NULL;
    CHECK(kiln_engine_submit(e, &bad, &s, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "top_prompt_logprobs") != NULL);
    kiln_engine_destroy(e);

    free(ref);
    kiln_model_close(m);
    return kiln_test_finish("test_engine_prompt_logprobs");
}
