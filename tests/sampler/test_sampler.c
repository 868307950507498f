/*
 * test_sampler.c - the sampling pipeline of src/engine/sampler.h.
 * Usage: test_sampler <case>; each case is registered as its own CTest.
 * Expectations are computed independently here (double precision reference pipeline, the
 * documented arithmetic), never taken from the code under test.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "test.h"

static uint64_t g_lcg = 0x12345678u;
static double rnd01(void) {
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_lcg >> 11) * (1.0 / 9007199254740992.0);
}

static kiln_sampler_scratch *scratch(int32_t n) {
    kiln_sampler_scratch *s = NULL;
    REQUIRE(kiln_sampler_scratch_create(n, &s, NULL) == KILN_OK);
    return s;
}

/* canonical order on doubles: value desc, id asc */
static const double *g_ref_vals;
static int ref_cmp(const void *a, const void *b) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    double va = g_ref_vals[ia], vb = g_ref_vals[ib];
    if (va > vb) return -1;
    if (va < vb) return 1;
    return (ia > ib) - (ia < ib);
}

/* ---- greedy -------------------------------------------------------------------------- */

static void test_greedy(void) {
    enum { V = 1000 };
    static float logits[V];
    kiln_sampler_scratch *s = scratch(V);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 0.0f;
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < V; i++) logits[i] = (float)(rnd01() * 20.0 - 10.0);
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        for (uint64_t step = 0; step < 5; step++) {
            p.seed = (uint64_t)rep * 7 + step;
            CHECK(kiln_sample_ex(&p, logits, V, NULL, 0, step, 0, NULL, s) == best);
        }
        CHECK(kiln_sample(&p, logits, V, 3, s) == best);
    }
    /* ties: lowest id; non-finite logits never win */
    for (int i = 0; i < V; i++) logits[i] = 0.0f;
    logits[3] = NAN;
    logits[5] = INFINITY;
    logits[9] = 2.0f;
    logits[7] = 2.0f;
    logits[400] = 2.0f;
    CHECK(kiln_sample_ex(&p, logits, V, NULL, 0, 0, 0, NULL, s) == 7);
    /* greedy applies bias and penalties first */
    int32_t hist[] = {7, 7, 400};
    p.frequency_penalty = 0.5f; /* 7: 2 - 1.0 = 1; 400: 1.5; 9 untouched: 2 */
    CHECK(kiln_sample_ex(&p, logits, V, hist, 3, 0, 0, NULL, s) == 9);
    int32_t bid = 9;
    float bv = -1.0f; /* 9 -> 1.0; best is now 400 (1.5) */
    p.n_bias = 1;
    p.bias_ids = &bid;
    p.bias_values = &bv;
    CHECK(kiln_sample_ex(&p, logits, V, hist, 3, 0, 0, NULL, s) == 400);
    kiln_sampler_scratch_destroy(s);
}

/* ---- logit bias ---------------------------------------------------------------------- */

static void test_logit_bias(void) {
    enum { V = 500 };
    static float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(rnd01() * 10.0 - 5.0);
    kiln_sampler_scratch *s = scratch(V);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.seed = 99;
    /* +100 forces a token (all others are at least e^-90 less likely) */
    int32_t ids[3] = {42, 0, 0};
    float vals[3] = {100.0f, 0, 0};
    p.n_bias = 1;
    p.bias_ids = ids;
    p.bias_values = vals;
    int forced = 0;
    for (uint64_t step = 0; step < 500; step++)
        forced += kiln_sample_ex(&p, logits, V, NULL, 0, step, 0, NULL, s) == 42;
    CHECK(forced == 500);
    p.temperature = 0.0f;
    CHECK(kiln_sample_ex(&p, logits, V, NULL, 0, 0, 0, NULL, s) == 42);

    /* banning with -100 and -inf: a near-uniform vocabulary where the banned ids would
     * otherwise be drawn often */
    for (int i = 0; i < V; i++) logits[i] = (float)(rnd01() * 0.1);
    logits[10] = 3.0f;
    logits[11] = 3.0f;
    ids[0] = 10;
    vals[0] = -100.0f;
    ids[1] = 11;
    vals[1] = -INFINITY;
    p.n_bias = 2;
    p.temperature = 1.0f;
    int banned = 0, hits = 0;
    for (uint64_t step = 0; step < 5000; step++) {
        int32_t t = kiln_sample_ex(&p, logits, V, NULL, 0, step, 0, NULL, s);
        banned += (t == 10 || t == 11);
        hits += (t >= 0 && t < V);
    }
    CHECK(banned == 0);
    CHECK(hits == 5000);
    /* without the bias they are frequent (sanity of the setup: e^3 / (e^3*2 + ~500)) */
    p.n_bias = 0;
    banned = 0;
    for (uint64_t step = 0; step < 5000; step++) {
        int32_t t = kiln_sample_ex(&p, logits, V, NULL, 0, step, 0, NULL, s);
        banned += (t == 10 || t == 11);
    }
    CHECKF(banned > 200, "unbiased draws of 10/11: %d", banned);
    /* greedy skips banned tokens */
    p.n_bias = 2;
    p.temperature = 0.0f;
    int32_t t = kiln_sample_ex(&p, logits, V, NULL, 0, 0, 0, NULL, s);
    CHECK(t != 10 && t != 11);

    /* everything banned: id 0, logprob -inf, no top entries */
    enum { W = 4 };
    float small[W] = {1, 2, 3, 4};
    int32_t all_ids[W] = {0, 1, 2, 3};
    float all_vals[W] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    p.n_bias = W;
    p.bias_ids = all_ids;
    p.bias_values = all_vals;
    kiln_logprobs lp;
    for (int g = 0; g < 2; g++) {
        p.temperature = g ? 1.0f : 0.0f;
        CHECK(kiln_sample_ex(&p, small, W, NULL, 0, 0, 5, &lp, s) == 0);
        CHECK(lp.token == 0 && lp.n_top == 0 && lp.logprob == -INFINITY);
    }
    /* duplicate ids add up: 2 + 1.5 + 1.5 = 5 > 4 */
    int32_t dup_ids[2] = {1, 1};
    float dup_vals[2] = {1.5f, 1.5f};
    p.n_bias = 2;
    p.bias_ids = dup_ids;
    p.bias_values = dup_vals;
    p.temperature = 0.0f;
    CHECK(kiln_sample_ex(&p, small, W, NULL, 0, 0, 0, NULL, s) == 1);
    kiln_sampler_scratch_destroy(s);
}

/* ---- penalties ----------------------------------------------------------------------- */

static void test_penalties(void) {
    enum { V = 6 };
    const float logits[V] = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f, 0.0f};
    float out[V];
    kiln_sampler_scratch *s = scratch(V);
    kiln_sampler_params p = kiln_sampler_defaults();

    /* repetition (CTRL / llama.cpp): positive / r, non-positive * r; exact float ops */
    const int32_t hist[] = {0, 1, 1, 3, 5, 4};
    p.repetition_penalty = 1.5f;
    p.repetition_window = 0; /* whole history: 0,1,3,5,4 */
    REQUIRE(kiln_sampler_process(&p, logits, V, hist, 6, out, s));
    CHECK(out[0] == 2.0f / 1.5f);
    CHECK(out[1] == -1.0f * 1.5f);
    CHECK(out[2] == 0.5f); /* absent */
    CHECK(out[3] == -3.0f * 1.5f);
    CHECK(out[4] == 1.0f / 1.5f);
    CHECK(out[5] == 0.0f);
    /* window 3: only 3, 5, 4 count */
    p.repetition_window = 3;
    REQUIRE(kiln_sampler_process(&p, logits, V, hist, 6, out, s));
    CHECK(out[0] == 2.0f && out[1] == -1.0f && out[2] == 0.5f);
    CHECK(out[3] == -4.5f && out[4] == 1.0f / 1.5f);
    /* window larger than the history = whole history */
    p.repetition_window = 100;
    REQUIRE(kiln_sampler_process(&p, logits, V, hist, 6, out, s));
    CHECK(out[0] == 2.0f / 1.5f && out[1] == -1.5f);
    /* repeated counts do not compound the repetition penalty */
    const int32_t hist2[] = {0, 0, 0, 0};
    p.repetition_window = 0;
    REQUIRE(kiln_sampler_process(&p, logits, V, hist2, 4, out, s));
    CHECK(out[0] == 2.0f / 1.5f);

    /* presence and frequency (OpenAI): v -= presence * (c > 0); v -= frequency * c */
    p = kiln_sampler_defaults();
    const int32_t h[] = {2, 2, 4, 2, 5, 4, 1};
    p.presence_penalty = 0.5f;
    p.presence_window = 3; /* {5, 4, 1} */
    p.frequency_penalty = 0.25f;
    p.frequency_window = 0; /* counts: 1:1 2:3 4:2 5:1 */
    REQUIRE(kiln_sampler_process(&p, logits, V, h, 7, out, s));
    const int cnt[V] = {0, 1, 3, 0, 2, 1};
    const int pres[V] = {0, 1, 0, 0, 1, 1};
    for (int i = 0; i < V; i++) {
        float e = logits[i];
        if (pres[i]) e = e - 0.5f;
        e = e - 0.25f * (float)cnt[i];
        CHECKF(out[i] == e, "token %d: got %g want %g", i, out[i], e);
    }
    /* frequency window 2 ({5, 4, 1}'s last two = {4, 1}), negative presence rewards */
    p.presence_penalty = -1.0f;
    p.presence_window = 0; /* 1, 2, 4, 5 present */
    p.frequency_penalty = 2.0f;
    p.frequency_window = 2;
    REQUIRE(kiln_sampler_process(&p, logits, V, h, 7, out, s));
    const float want[V] = {2.0f,  -1.0f + 1.0f - 2.0f, 0.5f + 1.0f,
                           -3.0f, 1.0f + 1.0f - 2.0f,  0.0f + 1.0f};
    for (int i = 0; i < V; i++) CHECKF(out[i] == want[i], "token %d: %g vs %g", i, out[i], want[i]);

    /* all three + bias on one token, documented order: bias, rep, presence, frequency */
    p = kiln_sampler_defaults();
    int32_t bid = 0;
    float bv = 1.0f;
    p.n_bias = 1;
    p.bias_ids = &bid;
    p.bias_values = &bv;
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.5f;
    const int32_t h3[] = {0, 0};
    REQUIRE(kiln_sampler_process(&p, logits, V, h3, 2, out, s));
    CHECK(out[0] == (2.0f + 1.0f) / 2.0f - 0.5f - 0.5f * 2.0f); /* 0 */
    /* out-of-range ids in the history are ignored */
    const int32_t bad[] = {-1, 6, 1000, 1};
    p = kiln_sampler_defaults();
    p.frequency_penalty = 1.0f;
    REQUIRE(kiln_sampler_process(&p, logits, V, bad, 4, out, s));
    CHECK(out[1] == -2.0f && out[0] == 2.0f && out[5] == 0.0f);
    /* misuse */
    CHECK(!kiln_sampler_process(&p, logits, V + 1, NULL, 0, out, s));
    CHECK(!kiln_sampler_process(&p, logits, V, NULL, 3, out, s));
    CHECK(kiln_sample_ex(&p, logits, V, NULL, 0, 0, 21, NULL, s) == -1);

    /* a long history with a small window: only the window counts (a vocabulary-sized check
     * that the counts are cleared between calls) */
    enum { BV = 50000, NH = 20000 };
    static float big[BV], bout[BV];
    static int32_t bh[NH];
    kiln_sampler_scratch *bs = scratch(BV);
    for (int i = 0; i < BV; i++) big[i] = (float)(rnd01() * 4.0 - 2.0);
    for (int i = 0; i < NH; i++) bh[i] = (int32_t)(rnd01() * BV);
    p = kiln_sampler_defaults();
    p.frequency_penalty = 1.0f;
    p.frequency_window = 16;
    for (int rep = 0; rep < 3; rep++) {
        REQUIRE(kiln_sampler_process(&p, big, BV, bh, NH, bout, bs));
        static int c[BV];
        memset(c, 0, sizeof c);
        for (int i = NH - 16; i < NH; i++) c[bh[i]]++;
        int bad_n = 0;
        for (int i = 0; i < BV; i++) bad_n += bout[i] != big[i] - 1.0f * (float)c[i];
        CHECK(bad_n == 0);
    }
    kiln_sampler_scratch_destroy(bs);
    kiln_sampler_scratch_destroy(s);
}

/* ---- logprobs ------------------------------------------------------------------------ */

static void test_logprobs(void) {
    enum { V = 300, NH = 40 };
    static float logits[V];
    static double ref[V], lsm[V];
    int32_t hist[NH];
    for (int i = 0; i < V; i++) logits[i] = (float)(rnd01() * 16.0 - 8.0);
    for (int i = 0; i < NH; i++) hist[i] = (int32_t)(rnd01() * 60); /* dense in 0..59 */
    int32_t bias_ids[3] = {5, 77, 123};
    float bias_vals[3] = {4.0f, -2.5f, -INFINITY};

    kiln_sampler_params p = kiln_sampler_defaults();
    p.n_bias = 3;
    p.bias_ids = bias_ids;
    p.bias_values = bias_vals;
    p.repetition_penalty = 1.3f;
    p.repetition_window = 30;
    p.presence_penalty = 0.4f;
    p.presence_window = 10;
    p.frequency_penalty = 0.3f;
    p.frequency_window = 0;
    p.temperature = 1.7f; /* logprobs are captured before temperature: no effect on them */
    p.top_k = 40;
    p.seed = 5;

    /* independent reference in double */
    for (int i = 0; i < V; i++) ref[i] = logits[i];
    for (int b = 0; b < 3; b++) ref[bias_ids[b]] += bias_vals[b];
    int rc[V] = {0}, pc[V] = {0}, fc[V] = {0};
    for (int i = NH - 30; i < NH; i++) rc[hist[i]]++;
    for (int i = NH - 10; i < NH; i++) pc[hist[i]]++;
    for (int i = 0; i < NH; i++) fc[hist[i]]++;
    for (int i = 0; i < V; i++) {
        if (rc[i] && isfinite(ref[i])) ref[i] = ref[i] > 0 ? ref[i] / 1.3 : ref[i] * 1.3;
        if (pc[i]) ref[i] -= 0.4;
        ref[i] -= 0.3 * fc[i];
    }
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (ref[i] > mx) mx = ref[i];
    for (int i = 0; i < V; i++) sum += isfinite(ref[i]) ? exp(ref[i] - mx) : 0.0;
    for (int i = 0; i < V; i++) lsm[i] = isfinite(ref[i]) ? ref[i] - mx - log(sum) : -INFINITY;
    int32_t order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    g_ref_vals = lsm;
    qsort(order, V, sizeof *order, ref_cmp);

    kiln_sampler_scratch *s = scratch(V);
    const int ks[] = {0, 1, 5, 20};
    int outside_top = 0;
    for (int ki = 0; ki < 4; ki++) {
        for (uint64_t step = 0; step < 200; step++) {
            kiln_logprobs lp;
            memset(&lp, 0xAB, sizeof lp);
            int32_t t = kiln_sample_ex(&p, logits, V, hist, NH, step, ks[ki], &lp, s);
            REQUIRE(t >= 0 && t < V);
            CHECK(lp.token == t);
            CHECK(t != 123);
            CHECKF(fabs(lp.logprob - lsm[t]) < 1e-4, "token %d: %g vs %g", t, lp.logprob, lsm[t]);
            CHECK(lp.n_top == ks[ki]);
            bool in_top = false;
            for (int j = 0; j < lp.n_top && j < KILN_MAX_TOP_LOGPROBS; j++) {
                CHECKF(lp.top_ids[j] == order[j], "top %d: id %d vs %d", j, lp.top_ids[j],
                       order[j]);
                CHECK(fabs(lp.top_logprobs[j] - lsm[order[j]]) < 1e-4);
                if (j) CHECK(lp.top_logprobs[j] <= lp.top_logprobs[j - 1]);
                in_top |= lp.top_ids[j] == t;
            }
            outside_top += !in_top;
            /* the same token as without logprobs */
            CHECK(kiln_sample_ex(&p, logits, V, hist, NH, step, 0, NULL, s) == t);
        }
    }
    CHECKF(outside_top > 50, "chosen token outside the top list only %d times", outside_top);

    /* log-probabilities sum to 1 (checked through top 20 of a 20-token vocabulary), and
     * ties are ordered by id */
    enum { W = 20 };
    float flat[W];
    for (int i = 0; i < W; i++) flat[i] = (i % 4 == 0) ? 1.0f : 0.0f;
    kiln_sampler_params q = kiln_sampler_defaults();
    kiln_logprobs lp;
    kiln_sample_ex(&q, flat, W, NULL, 0, 0, 20, &lp, s);
    CHECK(lp.n_top == 20);
    double tot = 0;
    for (int j = 0; j < lp.n_top; j++) tot += exp(lp.top_logprobs[j]);
    CHECK(fabs(tot - 1.0) < 1e-5);
    const int32_t want[W] = {0, 4, 8, 12, 16, 1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19};
    for (int j = 0; j < W; j++) CHECKF(lp.top_ids[j] == want[j], "tie order at %d", j);
    /* fewer finite tokens than requested: n_top counts only finite ones */
    int32_t ban[3] = {0, 1, 2};
    float banv[3] = {-INFINITY, -INFINITY, -INFINITY};
    float four[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    q.n_bias = 3;
    q.bias_ids = ban;
    q.bias_values = banv;
    CHECK(kiln_sample_ex(&q, four, 4, NULL, 0, 0, 5, &lp, s) == 3);
    CHECK(lp.n_top == 1 && lp.top_ids[0] == 3 && fabs(lp.logprob) < 1e-6);
    kiln_sampler_scratch_destroy(s);
}

/* ---- filtering and the draw ---------------------------------------------------------- */

/* Reference pipeline in double on toy vocabularies: returns the number of kept tokens and
 * fills order[] (canonical order) and w[] (weights by id, kept ones only nonzero). */
static int ref_filter(const float *logits, int V, const kiln_sampler_params *p, int32_t *order,
                      double *w, double *kept_total) {
    static double v[4096];
    for (int i = 0; i < V; i++) v[i] = logits[i];
    for (int i = 0; i < V; i++) order[i] = i;
    g_ref_vals = v;
    qsort(order, (size_t)V, sizeof *order, ref_cmp);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double mx = v[order[0]], tot = 0;
    for (int i = 0; i < V; i++) w[i] = 0;
    for (int j = 0; j < n; j++) tot += (w[order[j]] = exp((v[order[j]] - mx) / p->temperature));
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int j = 0; j < n; j++) {
            cum += w[order[j]];
            if (cum >= p->top_p * tot) {
                n = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int j = 1;
        while (j < n && w[order[j]] >= p->min_p * w[order[0]]) j++;
        n = j;
    }
    for (int j = n; j < V; j++) w[order[j]] = 0;
    *kept_total = 0;
    for (int j = 0; j < n; j++) *kept_total += w[order[j]];
    return n;
}

static void check_distribution(const char *name, const float *logits, int V,
                               const kiln_sampler_params *p, int n_expected) {
    int32_t order[4096];
    static double w[4096];
    double kt;
    int n = ref_filter(logits, V, p, order, w, &kt);
    if (n_expected > 0) CHECKF(n == n_expected, "%s: reference keeps %d", name, n);
    kiln_sampler_scratch *s = scratch(V);
    enum { N = 20000 };
    static int hist[4096];
    memset(hist, 0, sizeof hist);
    int exact = 0, near_boundary = 0;
    for (uint64_t step = 0; step < N; step++) {
        int32_t t = kiln_sample_ex(p, logits, V, NULL, 0, step, 0, NULL, s);
        REQUIRE(t >= 0 && t < V);
        hist[t]++;
        /* the draw: first kept token (canonical order) whose cumulative weight exceeds
         * u * total; skip draws within 1e-6 of a boundary (float vs double) */
        double target = kiln_rng_uniform(p->seed, step) * kt, cum = 0;
        int32_t want = order[n - 1];
        bool close = false;
        for (int j = 0; j < n; j++) {
            cum += w[order[j]];
            if (fabs(cum - target) < 1e-6 * kt) close = true;
            if (cum > target) {
                want = order[j];
                break;
            }
        }
        if (close)
            near_boundary++;
        else
            exact += (t == want);
    }
    CHECKF(exact + near_boundary == N, "%s: %d of %d draws differ from the reference", name,
           N - exact - near_boundary, N);
    /* only kept ids appear; Pearson chi-square against the renormalized distribution.
     * df = n - 1 <= 7 here; 35 is beyond the 0.9999 quantile for df <= 7 (df 7: 29.9) */
    double chi2 = 0;
    int outside = 0;
    for (int i = 0; i < V; i++) {
        double e = N * w[i] / kt;
        if (w[i] == 0) {
            outside += hist[i];
            continue;
        }
        chi2 += (hist[i] - e) * (hist[i] - e) / e;
    }
    CHECKF(outside == 0, "%s: %d draws of filtered-out tokens", name, outside);
    CHECKF(chi2 < 35.0, "%s: chi-square %.2f with %d categories", name, chi2, n);
    kiln_sampler_scratch_destroy(s);
}

static void test_filters(void) {
    const double pr[8] = {0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.04, 0.01};
    float logits[8];
    /* a permutation so the canonical order is not the id order */
    const int perm[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    for (int i = 0; i < 8; i++) logits[perm[i]] = (float)log(pr[i]) + 1.25f;
    kiln_sampler_params p = kiln_sampler_defaults();
    p.seed = 1234;
    check_distribution("plain", logits, 8, &p, 8);
    p.temperature = 0.5f;
    check_distribution("temperature 0.5", logits, 8, &p, 8);
    p.temperature = 1.8f;
    check_distribution("temperature 1.8", logits, 8, &p, 8);
    p.temperature = 1.0f;
    p.top_k = 3;
    check_distribution("top_k 3", logits, 8, &p, 3);
    p.top_k = 1;
    check_distribution("top_k 1", logits, 8, &p, 1);
    p.top_k = 0;
    p.top_p = 0.7f; /* 0.3 0.5 0.65 0.77 -> 4 */
    check_distribution("top_p 0.7", logits, 8, &p, 4);
    p.top_p = 0.25f; /* the first alone */
    check_distribution("top_p 0.25", logits, 8, &p, 1);
    p.top_p = 1.0f;
    p.min_p = 0.45f; /* threshold 0.135 -> 3 */
    check_distribution("min_p 0.45", logits, 8, &p, 3);
    p.min_p = 0.3f; /* 0.09 -> 5 */
    check_distribution("min_p 0.3", logits, 8, &p, 5);
    /* combined: T 0.7 sharpens, top_k 6, top_p 0.9, min_p 0.1 on the sharpened weights */
    p.temperature = 0.7f;
    p.top_k = 6;
    p.top_p = 0.9f;
    p.min_p = 0.1f;
    check_distribution("combined", logits, 8, &p, 0);
    p.seed = 777;
    p.temperature = 1.3f;
    p.top_k = 7;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    check_distribution("combined 2", logits, 8, &p, 0);

    /* larger vocabulary with many ties: top_k by partial selection must equal the first k
     * of a full sort in canonical order */
    enum { V = 3000 };
    static float big[V];
    for (int i = 0; i < V; i++) big[i] = (float)((int)(rnd01() * 40)) * 0.25f; /* ties */
    /* also top-p / min-p / plain draws over thousands of candidates (the quickselect path) */
    const int32_t ks[] = {1, 2, 10, 64, V - 1, V, V + 5, 0, 0, 0, 0, 500};
    const float tps[] = {1, 1, 1, 1, 1, 1, 1, 0.5f, 0.95f, 1, 1, 0.8f};
    const float mps[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0.02f, 0, 0.1f};
    const float ts[] = {2, 2, 2, 2, 2, 2, 2, 2, 1, 0.5f, 1, 1.5f};
    for (int ki = 0; ki < 12; ki++) {
        kiln_sampler_params q = kiln_sampler_defaults();
        q.top_k = ks[ki];
        q.top_p = tps[ki];
        q.min_p = mps[ki];
        q.temperature = ts[ki];
        q.seed = (uint64_t)ki;
        char name[96];
        snprintf(name, sizeof name, "V %d with ties: top_k %d top_p %g min_p %g T %g", V, ks[ki],
                 tps[ki], mps[ki], ts[ki]);
        /* chi-square is meaningless for thousands of categories at N=20000; check the set and
         * the exact draw against the reference, with a loose chi-square-free path */
        int32_t order[V];
        static double w[V];
        double kt;
        int n = ref_filter(big, V, &q, order, w, &kt);
        kiln_sampler_scratch *s = scratch(V);
        int bad = 0, mism = 0;
        for (uint64_t step = 0; step < 3000; step++) {
            int32_t t = kiln_sample_ex(&q, big, V, NULL, 0, step, 0, NULL, s);
            bad += !(t >= 0 && t < V && w[t] > 0);
            double target = kiln_rng_uniform(q.seed, step) * kt, cum = 0;
            int32_t want = order[n - 1];
            bool close = false;
            for (int j = 0; j < n; j++) {
                cum += w[order[j]];
                if (fabs(cum - target) < 1e-6 * kt) close = true;
                if (cum > target) {
                    want = order[j];
                    break;
                }
            }
            mism += !close && t != want;
        }
        CHECKF(bad == 0, "%s: %d draws outside the kept set", name, bad);
        CHECKF(mism == 0, "%s: %d draws differ from the reference draw", name, mism);
        kiln_sampler_scratch_destroy(s);
    }
}

/* ---- determinism --------------------------------------------------------------------- */

/* XTC (processor 8) against an independent reference: ref_filter's kept set, then, at the
 * steps where kiln_rng_uniform(seed ^ KILN_XTC_STREAM, step) < xtc_probability, the kept
 * tokens with probability >= threshold (a prefix of the canonical order) lose all but their
 * last when there are two or more; then the draw as in check_distribution. Returns the
 * number of steps at which XTC removed tokens. */
static int check_xtc(const char *name, const float *logits, int V, const kiln_sampler_params *p) {
    int32_t order[64];
    double w[64], kt;
    REQUIRE(V <= 64);
    int n = ref_filter(logits, V, p, order, w, &kt);
    kiln_sampler_scratch *s = scratch(V);
    enum { N = 4000 };
    int mismatched = 0, acted = 0;
    for (uint64_t step = 0; step < N; step++) {
        int first = 0;
        double total = kt;
        if (p->xtc_probability > 0 &&
            kiln_rng_uniform(p->seed ^ KILN_XTC_STREAM, step) < p->xtc_probability) {
            int m = 0;
            while (m < n && w[order[m]] >= p->xtc_threshold * kt) m++;
            if (m >= 2) {
                first = m - 1;
                for (int j = 0; j < first; j++) total -= w[order[j]];
                acted++;
            }
        }
        double target = kiln_rng_uniform(p->seed, step) * total, cum = 0;
        int32_t want = order[n - 1];
        bool close = false;
        for (int j = first; j < n; j++) {
            cum += w[order[j]];
            if (fabs(cum - target) < 1e-6 * total) close = true;
            if (cum > target) {
                want = order[j];
                break;
            }
        }
        int32_t t = kiln_sample_ex(p, logits, V, NULL, 0, step, 0, NULL, s);
        if (!close && t != want && mismatched++ < 3)
            fprintf(stderr, "%s step %llu: sampled %d, reference %d\n", name,
                    (unsigned long long)step, t, want);
    }
    CHECKF(mismatched == 0, "%s: %d of %d draws differ from the reference", name, mismatched, N);
    kiln_sampler_scratch_destroy(s);
    return acted;
}

static void test_xtc(void) {
    const double pr[8] = {0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.04, 0.01};
    float logits[8];
    const int perm[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    for (int i = 0; i < 8; i++) logits[perm[i]] = (float)log(pr[i]) + 0.5f;
    kiln_sampler_params p = kiln_sampler_defaults();
    CHECK(p.xtc_probability == 0.0f && p.xtc_threshold == 0.1f);
    p.seed = 99;
    /* always on, threshold 0.11: 0.3 0.2 0.15 0.12 qualify, the first three go */
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.11f;
    CHECK(check_xtc("xtc p=1 t=0.11", logits, 8, &p) == 4000);
    kiln_sampler_scratch *s = scratch(8);
    for (uint64_t step = 0; step < 2000; step++) {
        int32_t t = kiln_sample_ex(&p, logits, 8, NULL, 0, step, 0, NULL, s);
        CHECKF(t != perm[0] && t != perm[1] && t != perm[2], "step %llu: removed token %d drawn",
               (unsigned long long)step, t);
    }
    /* one qualifying token (0.3 >= 0.25): never acts, and the draw is the plain one */
    p.xtc_threshold = 0.25f;
    CHECK(check_xtc("xtc one above threshold", logits, 8, &p) == 0);
    kiln_sampler_params off = p;
    off.xtc_probability = 0.0f;
    for (uint64_t step = 0; step < 2000; step++)
        CHECK(kiln_sample_ex(&p, logits, 8, NULL, 0, step, 0, NULL, s) ==
              kiln_sample_ex(&off, logits, 8, NULL, 0, step, 0, NULL, s));
    /* threshold above 0.5 can never find two */
    p.xtc_threshold = 0.6f;
    CHECK(check_xtc("xtc threshold 0.6", logits, 8, &p) == 0);
    /* half of the steps, after temperature, top-k and min-p */
    p.xtc_probability = 0.5f;
    p.xtc_threshold = 0.1f;
    p.temperature = 0.8f;
    p.top_k = 6;
    p.min_p = 0.05f;
    int acted = check_xtc("xtc p=0.5 combined", logits, 8, &p);
    CHECKF(acted > 1800 && acted < 2200, "XTC acted at %d of 4000 steps, want ~2000", acted);
    kiln_sampler_scratch_destroy(s);
    /* validation */
    kiln_error e = {0};
    p = kiln_sampler_defaults();
    p.xtc_probability = 1.5f;
    CHECK(kiln_sampler_validate(&p, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "xtc_probability") != NULL);
    p.xtc_probability = 0.5f;
    p.xtc_threshold = -0.1f;
    CHECK(kiln_sampler_validate(&p, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "xtc_threshold") != NULL);
}

static void test_determinism(void) {
    enum { V = 2000, NH = 64 };
    static float logits[V], other[V];
    int32_t hist[NH];
    for (int i = 0; i < V; i++) logits[i] = (float)(rnd01() * 6.0);
    for (int i = 0; i < V; i++) other[i] = (float)(rnd01() * 6.0);
    for (int i = 0; i < NH; i++) hist[i] = (int32_t)(rnd01() * V);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.seed = 0xDEADBEEFull;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.2f;
    kiln_sampler_params q = kiln_sampler_defaults();
    q.top_k = 5;
    q.seed = 3;
    kiln_sampler_scratch *s1 = scratch(V), *s2 = scratch(V + 100);
    int32_t first[200];
    for (uint64_t step = 0; step < 200; step++)
        first[step] = kiln_sample_ex(&p, logits, V, hist, NH, step, 0, NULL, s1);
    int same = 0, distinct_steps = 0;
    /* other work in between (another request on the same scratch), reverse step order,
     * another scratch of a different size, logprobs on: same tokens */
    for (int64_t step = 199; step >= 0; step--) {
        kiln_sample_ex(&q, other, V, NULL, 0, (uint64_t)step * 31, 3, NULL, s1);
        kiln_logprobs lp;
        int32_t a = kiln_sample_ex(&p, logits, V, hist, NH, (uint64_t)step, 7, &lp, s1);
        int32_t b = kiln_sample_ex(&p, logits, V, hist, NH, (uint64_t)step, 0, NULL, s2);
        same += (a == first[step] && b == first[step]);
        distinct_steps += step > 0 && first[step] != first[step - 1];
    }
    CHECK(same == 200);
    CHECKF(distinct_steps > 100, "different steps give different draws (%d)", distinct_steps);
    /* different seeds give different sequences */
    p.seed++;
    int diff = 0;
    for (uint64_t step = 0; step < 200; step++)
        diff += kiln_sample_ex(&p, logits, V, hist, NH, step, 0, NULL, s1) != first[step];
    CHECK(diff > 100);
    /* the RNG itself */
    CHECK(kiln_rng_uniform(1, 2) == kiln_rng_uniform(1, 2));
    CHECK(kiln_rng_uniform(1, 2) != kiln_rng_uniform(1, 3));
    for (uint64_t i = 0; i < 10000; i++) {
        float u = kiln_rng_uniform(i * 3, i);
        REQUIRE(u >= 0.0f && u < 1.0f);
    }
    kiln_sampler_scratch_destroy(s1);
    kiln_sampler_scratch_destroy(s2);
}

/* ---- validation ---------------------------------------------------------------------- */

static void expect_error(const kiln_sampler_params *p, int32_t n_vocab, const char *needle) {
    kiln_error e = {0};
    kiln_status st =
        n_vocab ? kiln_sampler_validate_vocab(p, n_vocab, &e) : kiln_sampler_validate(p, &e);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT, "expected an error containing '%s'", needle);
    CHECKF(strstr(e.message, needle) != NULL, "message '%s' lacks '%s'", e.message, needle);
}

static void test_validation(void) {
    kiln_sampler_params d = kiln_sampler_defaults(), p;
    CHECK(kiln_sampler_validate(&d, NULL) == KILN_OK);
    CHECK(kiln_sampler_validate_vocab(&d, 10, NULL) == KILN_OK);
#define BAD(field, value, msg)                                                                     \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = value;                                                                           \
        expect_error(&p, 0, msg);                                                                  \
    } while (0)
#define GOOD(field, value)                                                                         \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = value;                                                                           \
        CHECKF(kiln_sampler_validate(&p, NULL) == KILN_OK, #field " = " #value);                   \
    } while (0)
    BAD(temperature, -0.1f, "temperature must be in [0, 2] (got -0.1)");
    BAD(temperature, 2.5f, "temperature");
    BAD(temperature, NAN, "temperature");
    GOOD(temperature, 0.0f);
    GOOD(temperature, 2.0f);
    BAD(top_k, -1, "top_k must be >= 0 (got -1)");
    BAD(top_p, 0.0f, "top_p must be in (0, 1]");
    BAD(top_p, 1.5f, "top_p must be in (0, 1] (got 1.5)");
    GOOD(top_p, 1.0f);
    BAD(min_p, -0.01f, "min_p must be in [0, 1]");
    BAD(min_p, 1.01f, "min_p");
    GOOD(min_p, 1.0f);
    BAD(repetition_penalty, 0.0f, "repetition_penalty must be in (0, 10]");
    BAD(repetition_penalty, 11.0f, "repetition_penalty");
    BAD(repetition_penalty, NAN, "repetition_penalty");
    GOOD(repetition_penalty, 10.0f);
    BAD(presence_penalty, 2.5f, "presence_penalty must be in [-2, 2] (got 2.5)");
    BAD(presence_penalty, -2.01f, "presence_penalty");
    GOOD(presence_penalty, -2.0f);
    BAD(frequency_penalty, -3.0f, "frequency_penalty must be in [-2, 2]");
    GOOD(frequency_penalty, 2.0f);
    BAD(repetition_window, -1, "repetition_window must be >= 0");
    BAD(presence_window, -1, "presence_window must be >= 0");
    BAD(frequency_window, -5, "frequency_window must be >= 0 (got -5)");
    BAD(n_bias, -1, "logit_bias");
    BAD(n_bias, 2, "logit_bias"); /* arrays missing */

    int32_t ids[2] = {3, 9};
    float vals[2] = {1.0f, -INFINITY};
    p = d;
    p.n_bias = 2;
    p.bias_ids = ids;
    p.bias_values = vals;
    CHECK(kiln_sampler_validate(&p, NULL) == KILN_OK);
    CHECK(kiln_sampler_validate_vocab(&p, 10, NULL) == KILN_OK);
    expect_error(&p, 9, "logit_bias token id must be in [0, 9) (got 9)");
    ids[0] = -4;
    expect_error(&p, 0, "logit_bias token id must be >= 0 (got -4)");
    ids[0] = 3;
    vals[0] = 100.5f;
    expect_error(&p, 0, "logit_bias value must be in [-100, 100]");
    vals[0] = INFINITY;
    expect_error(&p, 0, "logit_bias value");
    vals[0] = NAN;
    expect_error(&p, 0, "logit_bias value");
    vals[0] = -100.0f;
    CHECK(kiln_sampler_validate_vocab(&p, 10, NULL) == KILN_OK);
    kiln_error e = {0};
    CHECK(kiln_sampler_validate_vocab(&p, 0, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_sampler_validate(NULL, &e) == KILN_ERR_INVALID_ARGUMENT);

    CHECK(kiln_sampler_validate_top_logprobs(0, NULL) == KILN_OK);
    CHECK(kiln_sampler_validate_top_logprobs(20, NULL) == KILN_OK);
    CHECK(kiln_sampler_validate_top_logprobs(21, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "top_logprobs must be in [0, 20] (got 21)") != NULL);
    CHECK(kiln_sampler_validate_top_logprobs(-1, NULL) == KILN_ERR_INVALID_ARGUMENT);

    kiln_sampler_scratch *s = (kiln_sampler_scratch *)1;
    CHECK(kiln_sampler_scratch_create(0, &s, &e) == KILN_ERR_INVALID_ARGUMENT && s == NULL);
    kiln_sampler_scratch_destroy(NULL);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "all";
    bool all = strcmp(c, "all") == 0;
    if (all || !strcmp(c, "greedy")) test_greedy();
    if (all || !strcmp(c, "logit_bias")) test_logit_bias();
    if (all || !strcmp(c, "penalties")) test_penalties();
    if (all || !strcmp(c, "logprobs")) test_logprobs();
    if (all || !strcmp(c, "filters")) test_filters();
    if (all || !strcmp(c, "determinism")) test_determinism();
    if (all || !strcmp(c, "xtc")) test_xtc();
    if (all || !strcmp(c, "validation")) test_validation();
    return kiln_test_finish(c);
}
