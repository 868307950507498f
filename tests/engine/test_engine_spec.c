/*
 * Speculative decoding and fill are exact (issue 18, DESIGN.md "Speculation and fill share
 * one transaction"): with every draft source, greedy and seeded sampling under the default
 * (exact) accept rule give bitwise the tokens and the logits of every emitted position that
 * plain decoding gives, alone and among 15 other sequences with chunked prefill and a small
 * step budget; recurrent models roll back exactly. An asserted fill span continues exactly
 * like a prompt that ends with it. The prediction counters follow kiln_usage's alignment
 * rule, recomputed here independently.
 *
 * Reference for every case: the same request with speculation off, alone on its own engine.
 *
 * usage: test_engine_spec MODEL_REL [hf|-] [DRAFT_MODEL_REL]
 * The draft model defaults to the target itself (every draft then agrees).
 */
#include "engine_test_util.h"

#define N_PROMPTS 4
#define MAX_TOK   24
#define PLEN_MAX  96

typedef struct prompt {
    int32_t ids[PLEN_MAX];
    int32_t n;
} prompt;

static const kiln_model *g_m;
static const kiln_model *g_draft;
static int32_t g_nv;
static bool g_recurrent;
static prompt g_prompts[N_PROMPTS];

/* Prompt 0 repeats a phrase, so prompt lookup finds n-grams; the others are random. */
static void make_prompts(void) {
    for (int k = 0; k < N_PROMPTS; k++) {
        prompt *p = &g_prompts[k];
        p->n = 20 + 9 * k;
        et_prompt(p->ids, p->n, 100 + (uint64_t)k, g_nv);
    }
    prompt *p = &g_prompts[0];
    int32_t phrase[10];
    et_prompt(phrase, 10, 7, g_nv);
    p->n = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 10; i++) p->ids[p->n++] = phrase[i];
}

static kiln_engine_params base_params(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 256;
    p.kv_tokens = 64 * 256;
    p.n_threads = 2;
    p.draft_model = g_draft;
    return p;
}

static void make_job(et_job *j, int k, bool sampled, et_result *res) {
    memset(j, 0, sizeof *j);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = g_prompts[k].ids;
    j->req.n_prompt_ids = g_prompts[k].n;
    j->req.max_tokens = MAX_TOK;
    j->req.ignore_eos = true;
    j->req.spec = KILN_SPEC_OFF;
    if (sampled) {
        j->req.temperature = 0.8f;
        j->req.top_p = 0.9f;
        j->req.seed = 500 + (uint64_t)k;
    } else {
        j->req.temperature = 0.0f;
    }
    j->dbg.capture_logits = true;
    j->req.logprobs = true;
    j->req.top_logprobs = 3;
    j->cancel_step = -1;
    j->res = res;
}

/* Bitwise: finish, tokens (from `from` on, against the reference's), every logits row (the
 * rows of sampled positions: from row_from on). */
static void compare_rows(const char *what, const et_result *ref, const et_result *got,
                         int32_t from, int32_t row_from) {
    CHECKF(got->finish == ref->finish, "%s: finish %s, reference %s (%s)", what,
           kiln_finish_reason_name(got->finish), kiln_finish_reason_name(ref->finish),
           got->message);
    bool same_tok = got->n_tokens - from == ref->n_tokens &&
                    memcmp(got->tokens + from, ref->tokens, (size_t)ref->n_tokens * 4) == 0;
    int32_t first = -1;
    for (int32_t i = 0; !same_tok && i < ref->n_tokens && i + from < got->n_tokens; i++)
        if (got->tokens[i + from] != ref->tokens[i]) {
            first = i;
            break;
        }
    CHECKF(same_tok, "%s: tokens differ from plain decoding (%d vs %d tokens, first at %d)",
           what, got->n_tokens - from, ref->n_tokens, first);
    /* logprobs come from the rows that decided the tokens: the same bits */
    bool same_lp = same_tok;
    for (int32_t i = 0; same_lp && i < ref->n_tokens; i++) {
        same_lp = memcmp(&got->logprob[i + from], &ref->logprob[i], sizeof(float)) == 0;
        if (same_lp && i + from < 64 && i < 64)
            same_lp = got->n_top[i + from] == ref->n_top[i] &&
                      memcmp(got->top[i + from], ref->top[i],
                             (size_t)ref->n_top[i] * sizeof ref->top[i][0]) == 0;
    }
    CHECKF(same_lp, "%s: logprobs differ from plain decoding", what);
    bool same_rows = got->n_logit_rows - row_from == ref->n_logit_rows && ref->n_logit_rows > 0;
    int32_t first_diff = -1;
    for (int32_t r = 0; same_rows && r < ref->n_logit_rows; r++)
        if (memcmp(got->logits + (size_t)(r + row_from) * g_nv, ref->logits + (size_t)r * g_nv,
                   (size_t)g_nv * sizeof(float)) != 0) {
            same_rows = false;
            first_diff = r;
        }
    CHECKF(same_rows, "%s: logits not bitwise identical (rows %d vs %d, first differing row %d)",
           what, got->n_logit_rows, ref->n_logit_rows, first_diff);
}

static void compare_from(const char *what, const et_result *ref, const et_result *got,
                         int32_t from) {
    compare_rows(what, ref, got, from, 0);
}

static void compare(const char *what, const et_result *ref, const et_result *got) {
    compare_from(what, ref, got, 0);
}

/*
 * kiln_usage's alignment rule, written again here from its text: for each output token t,
 * j the next prediction index, u the output tokens since the last aligned one: t takes j if
 * pred[j] == t; j + u if u >= 1 and pred[j + u] == t; j + 1 if u == 0 and pred[j + 1] == t;
 * else q - 1 for the longest m in [2, min(4, output so far)] with the last m output tokens
 * equal to pred[q-m..q), q - 1 >= j, smallest q (plus the n-gram's unaligned tokens before t,
 * at most u, at indices >= j); then j = index + 1, u = 0; else u + 1.
 * Accepted = the output tokens that took an index.
 */
static int32_t ref_accepted(const int32_t *pred, int32_t n, const int32_t *out, int32_t n_out) {
    int32_t j = 0, u = 0, acc = 0;
    for (int32_t i = 0; i < n_out && j < n; i++) {
        int32_t t = out[i], take = -1;
        if (pred[j] == t)
            take = j;
        else if (u >= 1 && j + u < n && pred[j + u] == t)
            take = j + u;
        else if (u == 0 && j + 1 < n && pred[j + 1] == t)
            take = j + 1;
        for (int32_t m = i + 1 < 4 ? i + 1 : 4; take < 0 && m >= 2; m--)
            for (int32_t q = j + 1; q <= n && take < 0; q++) {
                if (q < m) continue;
                bool eq = true;
                for (int32_t d = 0; d < m && eq; d++) eq = pred[q - 1 - d] == out[i - d];
                if (eq) {
                    take = q - 1;
                    /* the n-gram's earlier tokens that were unaligned, at indices >= j */
                    for (int32_t d = 1; d < m; d++)
                        if (d <= u && q - 1 - d >= j) acc++;
                }
            }
        if (take < 0) {
            u++;
            continue;
        }
        j = take + 1;
        u = 0;
        acc++;
    }
    return acc;
}

typedef enum variant {
    V_PRED_SELF,   /* prediction = the plain output */
    V_PRED_EDIT,   /* ... with one token changed in the middle */
    V_PRED_LONGER, /* ... followed by 12 unrelated tokens */
    V_PRED_OTHER,  /* an unrelated prediction */
    V_NGRAM,
    V_RANDOM,
    V_FILL_VERIFY, /* a verify-policy fill of the output's first 10 tokens */
    V_K1,          /* prediction = the plain output, k = 1 */
    V_K32,         /* prediction = the plain output, k = 32 */
    V_DRAFT,       /* the draft model's greedy drafts */
    V_REJECT,      /* prediction = the edited output, rejection rule: bitwise only greedy */
    V_COUNT
} variant;

static const char *const k_variant_names[V_COUNT] = {
    "prediction=self", "prediction=edit", "prediction=longer", "prediction=unrelated",
    "ngram",           "random",          "fill:verify",       "k=1",
    "k=32", "draft-model", "rejection"};

typedef struct spec_case {
    int32_t pred[MAX_TOK + 16];
    int32_t n_pred;
} spec_case;

/* Turn job j (made by make_job) into variant v of it, given its plain reference. */
static void apply_variant(et_job *j, variant v, const et_result *ref, spec_case *c, int k) {
    c->n_pred = 0;
    j->req.spec = KILN_SPEC_OFF;
    switch (v) {
    case V_PRED_SELF:
    case V_K1:
    case V_K32:
    case V_PRED_EDIT:
    case V_REJECT:
    case V_PRED_LONGER:
        memcpy(c->pred, ref->tokens, (size_t)ref->n_tokens * sizeof(int32_t));
        c->n_pred = ref->n_tokens;
        if (v == V_REJECT) j->req.spec_accept = KILN_SPEC_ACCEPT_REJECTION;
        if (v == V_PRED_EDIT || v == V_REJECT) c->pred[ref->n_tokens / 2] = (c->pred[ref->n_tokens / 2] + 1) % g_nv;
        if (v == V_PRED_LONGER) {
            et_prompt(c->pred + c->n_pred, 12, 900 + (uint64_t)k, g_nv);
            c->n_pred += 12;
        }
        if (v == V_K1) j->req.spec_k = 1;
        if (v == V_K32) j->req.spec_k = 32;
        break;
    case V_PRED_OTHER:
        et_prompt(c->pred, MAX_TOK, 777 + (uint64_t)k, g_nv);
        c->n_pred = MAX_TOK;
        break;
    case V_NGRAM: j->req.spec = KILN_SPEC_NGRAM; break;
    case V_DRAFT: j->req.spec = KILN_SPEC_DRAFT; break;
    case V_RANDOM:
        j->req.spec = KILN_SPEC_RANDOM;
        j->req.spec_k = 4;
        break;
    case V_FILL_VERIFY:
        memcpy(c->pred, ref->tokens, 10 * sizeof(int32_t));
        j->req.fill_ids = c->pred;
        j->req.n_fill_ids = 10;
        j->req.fill_policy = KILN_FILL_VERIFY;
        return;
    default: break;
    }
    if (c->n_pred > 0) {
        j->req.prediction_ids = c->pred;
        j->req.n_prediction_ids = c->n_pred;
    }
}

static void check_prediction_usage(const char *what, const spec_case *c, const et_result *got) {
    if (c->n_pred == 0) return;
    int32_t want = ref_accepted(c->pred, c->n_pred, got->tokens, got->n_tokens);
    CHECKF(got->usage.accepted_prediction_tokens == want,
           "%s: accepted_prediction_tokens %d, the rule gives %d", what,
           got->usage.accepted_prediction_tokens, want);
    CHECKF(got->usage.rejected_prediction_tokens == c->n_pred - want,
           "%s: rejected_prediction_tokens %d, want %d", what,
           got->usage.rejected_prediction_tokens, c->n_pred - want);
}

static kiln_engine *make_engine(const kiln_engine_params *p) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    if (kiln_engine_create(g_m, p, &e, &err) != KILN_OK) {
        fprintf(stderr, "engine create: %s\n", err.message);
        exit(1);
    }
    return e;
}

static void run_one(const kiln_engine_params *p, et_job *j) {
    kiln_engine *e = make_engine(p);
    kiln_error err = {0};
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit_debug(e, &j->req, &j->dbg, &s, &err) == KILN_OK);
    et_collect(s, j->res, g_nv);
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
}

/* An asserted span continues like a prompt that ends with it (greedy). */
static void check_assert_fill(void) {
    kiln_engine_params p = base_params();
    for (int k = 0; k < 2; k++) {
        const prompt *pr = &g_prompts[k];
        int32_t span[12];
        et_prompt(span, 12, 4242 + (uint64_t)k, g_nv);
        /* reference: prompt + span, plain */
        prompt ext = *pr;
        memcpy(ext.ids + ext.n, span, sizeof span);
        ext.n += 12;
        et_job jr, jf;
        et_result rr, rf;
        make_job(&jr, k, false, &rr);
        jr.req.prompt_ids = ext.ids;
        jr.req.n_prompt_ids = ext.n;
        run_one(&p, &jr);
        make_job(&jf, k, false, &rf);
        jf.req.fill_ids = span;
        jf.req.n_fill_ids = 12;
        jf.req.max_tokens = MAX_TOK + 12;
        jf.req.logprobs = true;
        for (int chunked = 0; chunked <= 1; chunked++) {
            kiln_engine_params q = p;
            if (chunked) {
                q.prefill_chunk = 7;
                q.step_tokens = 16;
            }
            run_one(&q, &jf);
            char what[160];
            snprintf(what, sizeof what, "assert fill, prompt %d%s", k, chunked ? ", chunked" : "");
            REQUIRE(rf.n_tokens >= 12);
            CHECKF(memcmp(rf.tokens, span, sizeof span) == 0, "%s: output does not begin with it",
                   what);
            compare_from(what, &rr, &rf, 12);
            CHECKF(rf.usage.fill_tokens == 12 && rf.usage.completion_tokens == MAX_TOK + 12,
                   "%s: usage fill %d completion %d", what, rf.usage.fill_tokens,
                   rf.usage.completion_tokens);
            for (int i = 0; i < 12; i++)
                CHECKF(rf.logprob[i] <= 0.0f && rf.logprob[i] > -1e30f,
                       "%s: fill token %d has logprob %g", what, i, rf.logprob[i]);
            et_result_free(&rf);
        }
        /* hidden fill: exactly the longer prompt, nothing extra in the output */
        et_job jh;
        et_result rh;
        make_job(&jh, k, true, &rh);
        et_job jr2;
        et_result rr2;
        make_job(&jr2, k, true, &rr2);
        jr2.req.prompt_ids = ext.ids;
        jr2.req.n_prompt_ids = ext.n;
        run_one(&p, &jr2);
        jh.req.fill_ids = span;
        jh.req.n_fill_ids = 12;
        jh.req.fill_hidden = true;
        run_one(&p, &jh);
        compare("hidden fill (seeded)", &rr2, &rh);
        CHECKF(rh.usage.prompt_tokens == ext.n, "hidden fill: prompt_tokens %d, want %d",
               rh.usage.prompt_tokens, ext.n);
        et_result_free(&rh);
        et_result_free(&rr2);
        et_result_free(&rr);
    }
}

/* A fill session asserting a span at output length 5 and verifying one at 12. */
typedef struct fs_state {
    int32_t assert_span[4];
    int32_t verify_span[6];
    int calls, released;
} fs_state;

static int32_t fs_propose(void *user, const int32_t *out, int32_t n_out, int32_t *span,
                          int32_t cap, kiln_fill_policy *policy) {
    (void)out;
    fs_state *st = user;
    st->calls++;
    if (n_out == 5 && cap >= 4) {
        memcpy(span, st->assert_span, sizeof st->assert_span);
        *policy = KILN_FILL_ASSERT;
        return 4;
    }
    if (n_out == 12 && cap >= 6) {
        memcpy(span, st->verify_span, sizeof st->verify_span);
        *policy = KILN_FILL_VERIFY;
        return 6;
    }
    return 0;
}

static void fs_release(void *user) {
    ((fs_state *)user)->released++;
}

static void check_fill_session(void) {
    kiln_engine_params p = base_params();
    /* plain output, to build the expectation */
    et_job j0;
    et_result r0;
    make_job(&j0, 1, false, &r0);
    run_one(&p, &j0);
    fs_state st = {0};
    et_prompt(st.assert_span, 4, 31337, g_nv);
    /* reference: prompt + plain[0..5) + assert span, plain decoding */
    prompt ext = g_prompts[1];
    memcpy(ext.ids + ext.n, r0.tokens, 5 * sizeof(int32_t));
    memcpy(ext.ids + ext.n + 5, st.assert_span, sizeof st.assert_span);
    ext.n += 9;
    et_job jr;
    et_result rr;
    make_job(&jr, 1, false, &rr);
    jr.req.prompt_ids = ext.ids;
    jr.req.n_prompt_ids = ext.n;
    jr.req.max_tokens = MAX_TOK - 9;
    run_one(&p, &jr);
    /* the verify span predicts output[12..18) correctly: the reference's tokens 3..9 */
    memcpy(st.verify_span, rr.tokens + 3, sizeof st.verify_span);
    static const kiln_fill_session fs = {.propose = fs_propose, .release = fs_release};
    et_job jf;
    et_result rf;
    make_job(&jf, 1, false, &rf);
    jf.req.fill_session = &fs;
    jf.req.fill_session_user = &st;
    run_one(&p, &jf);
    CHECKF(st.released == 1, "fill session released %d times", st.released);
    CHECKF(memcmp(rf.tokens, r0.tokens, 5 * sizeof(int32_t)) == 0 &&
               memcmp(rf.tokens + 5, st.assert_span, sizeof st.assert_span) == 0,
           "fill session: output does not hold the asserted span at 5");
    /* rows: 5 sampled before the span, then the reference's */
    compare_rows("fill session", &rr, &rf, 9, 5);
    CHECKF(rf.usage.spec_accepted >= 5, "fill session: the verify span was not used (%d accepted)",
           rf.usage.spec_accepted);
    et_result_free(&rf);
    et_result_free(&rr);
    et_result_free(&r0);
}

/* A failed transaction finishes the sequence with an error; its blocks go back, none of the
 * failed step's is indexed, and the engine goes on serving the same prompt exactly. */
static void check_failed_transaction(void) {
    kiln_engine_params p = base_params();
    et_job j0;
    et_result r0;
    make_job(&j0, 1, false, &r0);
    run_one(&p, &j0);
    kiln_engine *e = make_engine(&p);
    for (int round = 0; round < 2; round++) {
        et_job jf;
        et_result rf;
        spec_case c;
        make_job(&jf, 1, false, &rf);
        apply_variant(&jf, V_PRED_SELF, &r0, &c, 1);
        jf.req.spec_k = 4; /* several verify steps, so the second one fails mid-output */
        jf.dbg.spec_bad_resolve = 2;
        kiln_error err = {0};
        kiln_stream *s = NULL;
        REQUIRE(kiln_engine_submit_debug(e, &jf.req, &jf.dbg, &s, &err) == KILN_OK);
        et_collect(s, &rf, g_nv);
        kiln_stream_destroy(s);
        CHECKF(rf.finish == KILN_FINISH_ERROR && rf.status == KILN_ERR_INTERNAL &&
                   strstr(rf.message, "misuse"),
               "failed transaction: finish %s status %d '%s'", kiln_finish_reason_name(rf.finish),
               (int)rf.status, rf.message);
        /* what it emitted before the failure is a prefix of the plain output */
        CHECKF(rf.n_tokens < r0.n_tokens &&
                   memcmp(rf.tokens, r0.tokens, (size_t)rf.n_tokens * sizeof(int32_t)) == 0,
               "failed transaction: %d tokens emitted, not a prefix of the plain output",
               rf.n_tokens);
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        CHECKF(st.kv_blocks_used == 0, "failed transaction: %d blocks still used",
               st.kv_blocks_used);
        et_result_free(&rf);
        /* the same request, plain, on the same engine (its cache holds the prompt) */
        et_job jp;
        et_result rp;
        make_job(&jp, 1, false, &rp);
        REQUIRE(kiln_engine_submit_debug(e, &jp.req, &jp.dbg, &s, &err) == KILN_OK);
        et_collect(s, &rp, g_nv);
        kiln_stream_destroy(s);
        compare("after a failed transaction", &r0, &rp);
        et_result_free(&rp);
    }
    kiln_engine_destroy(e);
    et_result_free(&r0);
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    bool hf = argc >= 3 && !strcmp(argv[2], "hf");
    kiln_model *m = et_load_opt(argv[1], !hf);
    g_m = m;
    kiln_model *dm = argc >= 4 ? et_load_opt(argv[3], !hf) : NULL;
    g_nv = kiln_model_n_vocab(m);
    /* a recurrent model cannot draft (the drafter cannot roll it back): no draft variant */
    g_draft = dm ? dm : kiln_model_seq_state_floats(m) > 0 ? NULL : m;
    g_recurrent = kiln_model_seq_state_floats(m) > 0;
    make_prompts();
    kiln_engine_params p = base_params();
    int64_t drafted = 0, accepted = 0;

    for (int sampled = 0; sampled <= 1; sampled++) {
        const char *mode = sampled ? "seeded" : "greedy";
        et_job j[N_PROMPTS];
        et_result ref[N_PROMPTS];
        for (int k = 0; k < N_PROMPTS; k++) {
            make_job(&j[k], k, sampled, &ref[k]);
            run_one(&p, &j[k]);
            REQUIRE(ref[k].finish == KILN_FINISH_LENGTH && ref[k].n_tokens == MAX_TOK);
        }
        for (int v = 0; v < V_COUNT; v++) {
            if (v == V_DRAFT && !g_draft) continue;
            /* alone */
            for (int k = 0; k < N_PROMPTS; k++) {
                et_job js;
                et_result got;
                spec_case c;
                make_job(&js, k, sampled, &got);
                apply_variant(&js, (variant)v, &ref[k], &c, k);
                run_one(&p, &js);
                char what[200];
                snprintf(what, sizeof what, "%s %s, prompt %d alone", mode, k_variant_names[v], k);
                if (v == V_REJECT && sampled) {
                    /* the distribution is kept, not the bits (test_sampler_rejection) */
                    CHECKF(got.finish == KILN_FINISH_LENGTH && got.n_tokens == MAX_TOK,
                           "%s: finish %s after %d tokens (%s)", what,
                           kiln_finish_reason_name(got.finish), got.n_tokens, got.message);
                    et_result_free(&got);
                    continue;
                }
                compare(what, &ref[k], &got);
                check_prediction_usage(what, &c, &got);
                CHECKF(got.usage.spec_accepted <= got.usage.spec_drafted,
                       "%s: accepted %d > drafted %d", what, got.usage.spec_accepted,
                       got.usage.spec_drafted);
                if (v == V_PRED_SELF || v == V_K32)
                    CHECKF(got.usage.spec_accepted >= MAX_TOK / 2,
                           "%s: only %d drafts accepted of a correct prediction", what,
                           got.usage.spec_accepted);
                drafted += got.usage.spec_drafted;
                accepted += got.usage.spec_accepted;
                et_result_free(&got);
            }
            if (v == V_REJECT && sampled) continue;
            /* among 15 others: 4 copies of each prompt (16 jobs), the first speculating with
             * variant v, the rest alternating plain and variant v, chunked prefill, small
             * step budget, joining at different steps */
            for (int budget = 0; budget <= 1; budget++) {
                kiln_engine_params q = p;
                q.prefill_chunk = budget ? 7 : 64;
                q.step_tokens = budget ? 16 : 512;
                et_job jobs[16];
                et_result got[16];
                spec_case cs[16];
                for (int i = 0; i < 16; i++) {
                    int k = i % N_PROMPTS;
                    make_job(&jobs[i], k, sampled, &got[i]);
                    jobs[i].join_step = i / 3;
                    cs[i].n_pred = 0;
                    if (i == 0 || i % 2 == 1) apply_variant(&jobs[i], (variant)v, &ref[k], &cs[i], k);
                }
                et_run_jobs(m, &q, jobs, 16, NULL);
                for (int i = 0; i < 16; i++) {
                    char what[200];
                    snprintf(what, sizeof what, "%s %s, job %d of 16 (budget %d)", mode,
                             k_variant_names[v], i, q.step_tokens);
                    compare(what, &ref[i % N_PROMPTS], &got[i]);
                    check_prediction_usage(what, &cs[i], &got[i]);
                    et_result_free(&got[i]);
                }
            }
        }
        for (int k = 0; k < N_PROMPTS; k++) et_result_free(&ref[k]);
    }
    printf("drafts: %lld drafted, %lld accepted over all cases\n", (long long)drafted,
           (long long)accepted);
    CHECK(drafted > 0 && accepted > 0);
    check_assert_fill();
    check_fill_session();
    check_failed_transaction();
    kiln_model_free(dm);
    kiln_model_free(m);
    if (kiln_test_failures) {
        fprintf(stderr, "test_engine_spec %s: %d check(s) failed\n", argv[1], kiln_test_failures);
        return 1;
    }
    printf("test_engine_spec %s: all checks passed\n", argv[1]);
    return 0;
}
