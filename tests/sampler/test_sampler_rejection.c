/*
 * test_sampler_rejection.c - kiln_sample_verify_rejection (src/engine/sampler.h), the verify
 * step of speculative sampling with a point-mass draft (Leviathan, Kalman, Matias 2023,
 * Algorithm 1; Chen et al. 2023).
 * Usage: test_sampler_rejection <case>; each case is registered as its own CTest.
 *
 * The target distribution p is computed here independently (double precision: bias, penalty,
 * softmax with temperature, top-k, top-p, min-p, XTC, in the order and with the definitions
 * of sampler.h), never taken from the code under test. The random streams are the documented
 * ones (kiln_rng_uniform with the request seed, KILN_XTC_STREAM and KILN_SPEC_REJECT_STREAM).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "test.h"

enum { V = 64, N_DRAWS = 20000 };

static kiln_sampler_scratch *scratch(int32_t n) {
    kiln_sampler_scratch *s = NULL;
    REQUIRE(kiln_sampler_scratch_create(n, &s, NULL) == KILN_OK);
    return s;
}

/* The test's own generator (a 64-bit LCG with an output xorshift), independent of the code
 * under test; hash01(k) is a fixed function of k. */
static double hash01(uint64_t k) {
    uint64_t x = k * 6364136223846793005ull + 1442695040888963407ull;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* A fixed logits vector: roughly normal (sum of 4 uniforms), spread 2.4, distinct values. */
static void make_logits(float *logits, uint64_t salt) {
    for (int i = 0; i < V; i++) {
        double z = 0;
        for (int k = 0; k < 4; k++) z += hash01(salt * 1000003u + (uint64_t)i * 4 + (uint64_t)k);
        logits[i] = (float)((z - 2.0) * 2.4 * 1.7320508);
    }
}

/* ---- the reference distribution ------------------------------------------------------ */

/* One target distribution: order[0..n) the kept tokens in canonical order (logit desc, id
 * asc), w[id] their weights (0 elsewhere), total their sum. */
typedef struct {
    int n;
    int32_t order[V];
    double w[V];
    double total;
} ref_dist;

static const double *g_vals;
static int canon_cmp(const void *a, const void *b) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (g_vals[ia] > g_vals[ib]) return -1;
    if (g_vals[ia] < g_vals[ib]) return 1;
    return (ia > ib) - (ia < ib);
}

/* Processors 1-8 of sampler.h for these tests' parameters: logit bias, the frequency penalty
 * (whole history), then temperature, top-k, top-p, min-p, and XTC when `xtc_on` (the step's
 * XTC draw fired). The penalties are done in float, in the documented order, so the
 * processed logits are exactly the sampler's; everything after is in double. *margin gets
 * the smallest relative distance of a top-p / min-p / XTC comparison to its threshold (the
 * setup must not sit within float rounding of a boundary, where the sampler's float weights
 * and these double ones could keep different sets). */
static void ref_target(const kiln_sampler_params *p, const float *logits, const int32_t *hist,
                       int n_hist, bool xtc_on, ref_dist *d, double *margin) {
    static double v[V];
    for (int i = 0; i < V; i++) {
        float x = logits[i];
        for (int b = 0; b < p->n_bias; b++)
            if (p->bias_ids[b] == i) x += p->bias_values[b];
        int c = 0;
        for (int h = 0; h < n_hist; h++) c += hist[h] == i;
        if (p->frequency_penalty != 0.0f) x -= p->frequency_penalty * (float)c;
        v[i] = x;
    }
    int32_t all[V];
    int n_fin = 0;
    for (int i = 0; i < V; i++)
        if (isfinite(v[i])) all[n_fin++] = i;
    g_vals = v;
    qsort(all, (size_t)n_fin, sizeof *all, canon_cmp);
    int n = n_fin;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double w[V] = {0}, tot = 0, mx = v[all[0]];
    for (int j = 0; j < n; j++) tot += (w[j] = exp((v[all[j]] - mx) / p->temperature));
    *margin = 1.0;
    if (p->top_p < 1.0f) { /* shortest prefix with cumulative weight >= top_p * total */
        double cum = 0, thr = (double)p->top_p * tot;
        for (int j = 0; j < n; j++) {
            cum += w[j];
            *margin = fmin(*margin, fabs(cum - thr) / tot);
            if (cum >= thr) {
                n = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) { /* w >= min_p * w_max (w_max = w[0] = 1) */
        int k = 0;
        for (int j = 0; j < n; j++) {
            *margin = fmin(*margin, fabs(w[j] - p->min_p * w[0]) / (p->min_p * w[0]));
            if (w[j] >= p->min_p * w[0]) k = j + 1;
        }
        n = k;
    }
    int first = 0;
    if (xtc_on && p->xtc_probability > 0.0f) {
        /* the tokens with probability >= threshold: all but the least likely go */
        double kt = 0;
        for (int j = 0; j < n; j++) kt += w[j];
        int m = 0;
        for (int j = 0; j < n; j++) {
            *margin = fmin(*margin, fabs(w[j] / kt - p->xtc_threshold) / p->xtc_threshold);
            if (w[j] / kt >= p->xtc_threshold) m = j + 1;
        }
        if (m >= 2) first = m - 1;
    }
    d->n = n - first;
    d->total = 0;
    for (int i = 0; i < V; i++) d->w[i] = 0;
    for (int j = first; j < n; j++) {
        d->order[j - first] = all[j];
        d->w[all[j]] = w[j];
        d->total += w[j];
    }
}

static bool xtc_fires(const kiln_sampler_params *p, uint64_t step) {
    return p->xtc_probability > 0.0f &&
           kiln_rng_uniform(p->seed ^ KILN_XTC_STREAM, step) < p->xtc_probability;
}

/* ---- reference verifiers: the correct rule and three wrong ones ---------------------- */

typedef enum {
    VERIFY_CORRECT,          /* accept iff u_acc < p(d); else p without d, with u */
    VERIFY_WRONG_DRAFT,      /* returns the draft when it rejects (so: always the draft) */
    VERIFY_WRONG_KEEP_DRAFT, /* on reject samples from p itself, d not removed */
    VERIFY_WRONG_SHARED_U,   /* accepts with the token draw u and reuses it for the residual */
} verify_mode;

/* The walk of the draw over d's canonical order, skipping `skip`: the first token whose
 * cumulative weight exceeds target; *close when a cumulative weight is within 1e-6 of it
 * (there float and double sums may pick different neighbours). */
static int32_t ref_walk(const ref_dist *d, int32_t skip, double target, double total, bool *close) {
    double cum = 0;
    int32_t last = -1;
    for (int j = 0; j < d->n; j++) {
        int32_t t = d->order[j];
        if (t == skip) continue;
        cum += d->w[t];
        last = t;
        if (fabs(cum - target) < 1e-6 * total) *close = true;
        if (cum > target) return t;
    }
    return last;
}

static int32_t ref_verify(verify_mode mode, const ref_dist *d, const kiln_sampler_params *p,
                          uint64_t step, int32_t draft, bool *accepted, bool *close) {
    double pd = (draft >= 0 && draft < V) ? d->w[draft] / d->total : 0.0;
    double u = kiln_rng_uniform(p->seed, step);
    double u_acc = mode == VERIFY_WRONG_SHARED_U
                       ? u
                       : (double)kiln_rng_uniform(p->seed ^ KILN_SPEC_REJECT_STREAM, step);
    *close = pd > 0 && pd < 1 && fabs(u_acc - pd) < 1e-6;
    *accepted = u_acc < pd || pd == 1.0;
    if (*accepted || mode == VERIFY_WRONG_DRAFT) return draft;
    if (mode == VERIFY_WRONG_KEEP_DRAFT) return ref_walk(d, -1, u * d->total, d->total, close);
    double rest = d->total - (pd > 0 ? d->w[draft] : 0.0);
    return ref_walk(d, pd > 0 ? draft : -1, u * rest, rest, close);
}

/* ---- chi-square ---------------------------------------------------------------------- */

/* Upper quantile of chi-square with k degrees of freedom by the Wilson-Hilferty
 * approximation (Wilson & Hilferty 1931): (X/k)^(1/3) is close to normal with mean
 * 1 - 2/(9k) and variance 2/(9k), so chi2_q(k) ~= k * (1 - 2/(9k) + z_q * sqrt(2/(9k)))^3,
 * z_q the standard normal quantile (z_0.999 = 3.090232). */
static double chi2_quantile_wh(int k, double z) {
    double a = 2.0 / (9.0 * k);
    double c = 1.0 - a + z * sqrt(a);
    return k * c * c * c;
}
#define Z_0999 3.090232306167813

typedef struct {
    double stat, threshold;
    int dof;
    int impossible; /* draws of tokens with expected count 0 (or out of range) */
    bool pass;
} chi2_result;

/* Pearson's goodness-of-fit of counts[V] (plus `invalid` draws outside [0, V)) against
 * expected[V] (summing to the number of draws). Categories with expected 0 take no part but
 * any draw there fails the check; the others are sorted by expected count and pooled, the
 * smallest first, into bins of expected count >= 5 (a short last bin joins the one before).
 * Passes when the statistic is below the 0.999 quantile for bins - 1 degrees of freedom. */
static chi2_result chi2_check(const int *counts, int invalid, const double *expected) {
    chi2_result r = {0};
    int idx[V], m = 0;
    r.impossible = invalid;
    for (int i = 0; i < V; i++) {
        if (expected[i] > 0)
            idx[m++] = i;
        else
            r.impossible += counts[i];
    }
    for (int a = 1; a < m; a++) /* insertion sort by expected, ascending */
        for (int b = a; b > 0 && expected[idx[b]] < expected[idx[b - 1]]; b--) {
            int t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
    double be[V], bo[V];
    int nb = 0;
    double e = 0, o = 0;
    for (int j = 0; j < m; j++) {
        e += expected[idx[j]];
        o += counts[idx[j]];
        if (e >= 5.0) {
            be[nb] = e;
            bo[nb++] = o;
            e = o = 0;
        }
    }
    if (e > 0) {
        if (nb > 0) {
            be[nb - 1] += e;
            bo[nb - 1] += o;
        } else {
            be[nb] = e;
            bo[nb++] = o;
        }
    }
    for (int b = 0; b < nb; b++) r.stat += (bo[b] - be[b]) * (bo[b] - be[b]) / be[b];
    r.dof = nb - 1;
    r.threshold = r.dof > 0 ? chi2_quantile_wh(r.dof, Z_0999) : 0.0;
    r.pass = r.impossible == 0 && r.dof > 0 && r.stat < r.threshold;
    return r;
}

/* ---- the settings and the draft policy ----------------------------------------------- */

typedef struct {
    const char *name;
    kiln_sampler_params p;
    bool with_history;
} setting;

static int32_t g_bias_ids[2];
static float g_bias_vals[2];
enum { N_HIST = 12 };
static const int32_t g_hist[N_HIST] = {3, 3, 17, 40, 3, 9, 17, 63, 0, 40, 40, 22};

static int make_settings(setting *st, const float *logits) {
    kiln_sampler_params d = kiln_sampler_defaults();
    int n = 0;
    st[n] = (setting){"T 0.8 top_p 0.9", d, false};
    st[n].p.temperature = 0.8f;
    st[n].p.top_p = 0.9f;
    st[n++].p.seed = 11;
    st[n] = (setting){"T 1.2 top_k 20", d, false};
    st[n].p.temperature = 1.2f;
    st[n].p.top_k = 20;
    st[n++].p.seed = 22;
    st[n] = (setting){"T 1 min_p 0.05", d, false};
    st[n].p.min_p = 0.05f;
    st[n++].p.seed = 33;
    /* the likeliest token banned, another boosted, a frequency penalty over a history */
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    g_bias_ids[0] = best;
    g_bias_vals[0] = -INFINITY;
    g_bias_ids[1] = best == 5 ? 6 : 5;
    g_bias_vals[1] = 2.0f;
    st[n] = (setting){"T 0.9 top_k 40 bias freq_penalty 0.7", d, true};
    st[n].p.temperature = 0.9f;
    st[n].p.top_k = 40;
    st[n].p.n_bias = 2;
    st[n].p.bias_ids = g_bias_ids;
    st[n].p.bias_values = g_bias_vals;
    st[n].p.frequency_penalty = 0.7f;
    st[n++].p.seed = 44;
    st[n] = (setting){"T 1 top_k 30 xtc 0.5/0.08", d, false};
    st[n].p.top_k = 30;
    st[n].p.xtc_probability = 0.5f;
    st[n].p.xtc_threshold = 0.08f;
    st[n++].p.seed = 55;
    return n;
}

/* A fixed "bad" drafter: per step, from the test's own generator, the likeliest token (35%),
 * an unlikely kept one (25%), any id (20%), a token outside the kept set (10%), an id out of
 * range (10%). Depends only on the step (and the plain distribution d). */
static int32_t bad_draft(const ref_dist *d, uint64_t step) {
    double r = hash01(step ^ 0xD1A7u), r2 = hash01(step * 7 + 0xBEEFu);
    if (r < 0.35) return d->order[0];
    if (r < 0.60) return d->order[d->n / 2 + (int)(r2 * (d->n - d->n / 2))]; /* lower half */
    if (r < 0.80) return (int32_t)(r2 * V);
    if (r < 0.90) {
        for (int i = 0, t = (int)(r2 * V); i < V; i++, t = (t + 1) % V)
            if (d->w[t] == 0) return t;
        return (int32_t)(r2 * V);
    }
    const int32_t out[4] = {-1, V, V + 7, INT32_MIN};
    return out[(int)(r2 * 4)];
}

/* ---- 1. the distribution is kept ----------------------------------------------------- */

static void test_distribution(void) {
    float logits[V];
    make_logits(logits, 1);
    setting st[8];
    int n_set = make_settings(st, logits);
    kiln_sampler_scratch *s = scratch(V);
    static const char *mode_name[] = {"code under test", "returns the draft on reject",
                                      "residual keeps the draft", "acceptance reuses u"};
    for (int k = 0; k < n_set; k++) {
        const kiln_sampler_params *p = &st[k].p;
        const int32_t *hist = st[k].with_history ? g_hist : NULL;
        int nh = st[k].with_history ? N_HIST : 0;
        ref_dist d_off, d_on;
        double m_off, m_on;
        ref_target(p, logits, hist, nh, false, &d_off, &m_off);
        ref_target(p, logits, hist, nh, true, &d_on, &m_on);
        REQUIRE(m_off > 1e-5 && m_on > 1e-5);
        REQUIRE(d_off.n >= 5);

        static int counts[4][V];
        int invalid[4] = {0};
        memset(counts, 0, sizeof counts);
        double expected[V] = {0};
        int mismatch = 0, near = 0, accepts = 0, bad_accept = 0, draft_on_reject = 0;
        int xtc_steps = 0, zero_p = 0, zero_p_same = 0;
        for (uint64_t step = 0; step < N_DRAWS; step++) {
            bool on = xtc_fires(p, step);
            xtc_steps += on;
            const ref_dist *d = on ? &d_on : &d_off;
            for (int i = 0; i < V; i++) expected[i] += d->w[i] / d->total;
            int32_t draft = bad_draft(&d_off, step);
            bool acc = true;
            int32_t t =
                kiln_sample_verify_rejection(p, logits, V, hist, nh, step, draft, &acc, 0, NULL, s);
            REQUIRE(t >= 0 && t < V);
            counts[0][t]++;
            accepts += acc;
            bad_accept += acc != (t == draft);
            draft_on_reject += !acc && t == draft;
            if (!(draft >= 0 && draft < V && d->w[draft] > 0)) { /* p(draft) = 0 */
                zero_p++;
                zero_p_same += t == kiln_sample_ex(p, logits, V, hist, nh, step, 0, NULL, s);
            }
            /* the exact token of the documented rule (streams, canonical order) */
            bool racc, close = false;
            int32_t want = ref_verify(VERIFY_CORRECT, d, p, step, draft, &racc, &close);
            if (close)
                near++;
            else if (want != t || racc != acc) {
                if (mismatch++ < 3)
                    fprintf(stderr, "%s step %llu draft %d: got %d (%d), reference %d (%d)\n",
                            st[k].name, (unsigned long long)step, draft, t, acc, want, racc);
            }
            for (int m = 1; m < 4; m++) {
                int32_t x = ref_verify((verify_mode)m, d, p, step, draft, &racc, &close);
                if (x >= 0 && x < V)
                    counts[m][x]++;
                else
                    invalid[m]++;
            }
        }
        CHECKF(mismatch == 0, "%s: %d of %d tokens differ from the reference rule", st[k].name,
               mismatch, N_DRAWS - near);
        CHECKF(near < N_DRAWS / 1000, "%s: %d draws near a boundary", st[k].name, near);
        CHECK(bad_accept == 0 && draft_on_reject == 0);
        CHECKF(zero_p_same == zero_p, "%s: %d of %d p(draft) = 0 steps differ from kiln_sample_ex",
               st[k].name, zero_p - zero_p_same, zero_p);
        if (p->xtc_probability > 0)
            CHECKF(xtc_steps > N_DRAWS * 0.45 && xtc_steps < N_DRAWS * 0.55 && d_on.n < d_off.n,
                   "%s: XTC fired at %d steps", st[k].name, xtc_steps);
        for (int m = 0; m < 4; m++) {
            chi2_result r = chi2_check(counts[m], invalid[m], expected);
            printf("%-40s %-28s chi2 %10.2f  dof %2d  threshold(0.999) %6.2f  impossible %5d  "
                   "%s\n",
                   st[k].name, mode_name[m], r.stat, r.dof, r.threshold, r.impossible,
                   r.pass ? "pass" : "FAIL");
            if (m == 0)
                CHECKF(r.pass, "%s: the rejection sampler fails the chi-square check", st[k].name);
            else /* the check is sensitive: every wrong rule must fail it */
                CHECKF(!r.pass, "%s: the wrong rule '%s' passes the chi-square check", st[k].name,
                       mode_name[m]);
        }
        printf("%-40s kept %d (XTC: %d, at %d steps), accepted %d of %d, near boundary %d\n",
               st[k].name, d_off.n, p->xtc_probability > 0 ? d_on.n : d_off.n, xtc_steps, accepts,
               N_DRAWS, near);
    }
    /* the Wilson-Hilferty quantile against tabulated chi-square 0.999 quantiles (within 2%:
     * 1.2% high at dof 5, closer as dof grows) */
    const int dfs[] = {5, 10, 20, 40};
    const double tab[] = {20.515, 29.588, 45.315, 73.402};
    for (int i = 0; i < 4; i++)
        CHECKF(fabs(chi2_quantile_wh(dfs[i], Z_0999) - tab[i]) < 0.02 * tab[i],
               "WH quantile at dof %d: %g vs %g", dfs[i], chi2_quantile_wh(dfs[i], Z_0999), tab[i]);
    kiln_sampler_scratch_destroy(s);
}

/* ---- 2. acceptance rate -------------------------------------------------------------- */

static void test_acceptance(void) {
    float logits[V];
    make_logits(logits, 2);
    setting st[8];
    int n_set = make_settings(st, logits);
    kiln_sampler_scratch *s = scratch(V);
    for (int k = 0; k < n_set; k++) {
        const kiln_sampler_params *p = &st[k].p;
        const int32_t *hist = st[k].with_history ? g_hist : NULL;
        int nh = st[k].with_history ? N_HIST : 0;
        ref_dist d_off, d_on;
        double m;
        ref_target(p, logits, hist, nh, false, &d_off, &m);
        ref_target(p, logits, hist, nh, true, &d_on, &m);
        /* the argmax-probability token, and (second run) one from the middle of the kept set */
        for (int which = 0; which < 2; which++) {
            int32_t draft = which ? d_off.order[d_off.n / 2] : d_off.order[0];
            double sum_p = 0, var = 0;
            int acc_n = 0;
            for (uint64_t step = 0; step < N_DRAWS; step++) {
                const ref_dist *d = xtc_fires(p, step) ? &d_on : &d_off;
                double pd = d->w[draft] / d->total;
                sum_p += pd;
                var += pd * (1 - pd);
                bool acc = false;
                int32_t t = kiln_sample_verify_rejection(p, logits, V, hist, nh, step, draft, &acc,
                                                         0, NULL, s);
                CHECK(acc == (t == draft));
                acc_n += acc;
            }
            double rate = (double)acc_n / N_DRAWS, want = sum_p / N_DRAWS;
            double se = sqrt(var) / N_DRAWS; /* sum of independent Bernoulli(p_step) */
            printf("%-40s draft %-6s %2d: acceptance %.4f, p(draft) %.4f, se %.4f, z %+.2f\n",
                   st[k].name, which ? "middle" : "argmax", draft, rate, want, se,
                   (rate - want) / se);
            CHECKF(fabs(rate - want) < 4 * se, "%s: acceptance %g vs p(draft) %g (se %g)",
                   st[k].name, rate, want, se);
        }
    }
    /* p(draft) = 1: the only kept token is always accepted; any other draft gives it */
    kiln_sampler_params q = kiln_sampler_defaults();
    q.top_k = 1;
    q.seed = 9;
    int32_t best = kiln_argmax(logits, V);
    int ok = 0;
    for (uint64_t step = 0; step < 1000; step++) {
        bool acc = false;
        ok += kiln_sample_verify_rejection(&q, logits, V, NULL, 0, step, best, &acc, 0, NULL, s) ==
                  best &&
              acc;
        int32_t other = (best + 1 + (int32_t)step) % V;
        if (other == best) other = (other + 1) % V;
        ok += kiln_sample_verify_rejection(&q, logits, V, NULL, 0, step, other, &acc, 0, NULL, s) ==
                  best &&
              !acc;
    }
    CHECK(ok == 2000);
    kiln_sampler_scratch_destroy(s);
}

/* ---- 3. greedy, logprobs, determinism, misuse ---------------------------------------- */

static bool same_logprobs(const kiln_logprobs *a, const kiln_logprobs *b) {
    if (a->token != b->token || memcmp(&a->logprob, &b->logprob, sizeof a->logprob) ||
        a->n_top != b->n_top)
        return false;
    for (int j = 0; j < a->n_top; j++)
        if (a->top_ids[j] != b->top_ids[j] ||
            memcmp(&a->top_logprobs[j], &b->top_logprobs[j], sizeof(float)))
            return false;
    return true;
}

static void test_greedy(void) {
    float logits[V];
    make_logits(logits, 3);
    kiln_sampler_scratch *s = scratch(V);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 0.0f;
    p.seed = 5;
    /* a tie for the max between 20 and 7 after the bias (10 + 0.5, exact in float): the
     * lowest id, 7, is the argmax; the penalty touches neither (not in g_hist) */
    int32_t best = kiln_argmax(logits, V), ids[2] = {20, 7};
    float vals[2] = {0.5f, 0.5f};
    logits[7] = logits[20] = 10.0f;
    p.n_bias = 2;
    p.bias_ids = ids;
    p.bias_values = vals;
    p.frequency_penalty = 0.5f;
    const int32_t drafts[] = {7, 20, best, 0, 63, -1, V, INT32_MAX};
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        for (uint64_t step = 0; step < 50; step++) {
            kiln_logprobs lv, le;
            bool acc = !(drafts[i] == 7);
            int32_t t = kiln_sample_verify_rejection(&p, logits, V, g_hist, N_HIST, step, drafts[i],
                                                     &acc, 5, &lv, s);
            int32_t e = kiln_sample_ex(&p, logits, V, g_hist, N_HIST, step, 5, &le, s);
            ok += t == 7 && e == 7 && acc == (drafts[i] == 7) && same_logprobs(&lv, &le);
        }
    }
    CHECKF(ok == 8 * 50, "greedy: %d of 400 verifications right", ok);

    /* sampled: logprobs are kiln_sample_ex's for the returned token (top list bitwise; the
     * token's own logprob equals kiln_sample_ex's entry for it in a full top list) */
    kiln_sampler_params q = kiln_sampler_defaults();
    q.temperature = 1.3f;
    q.top_p = 0.95f;
    q.seed = 77;
    q.presence_penalty = 0.5f;
    enum { W = 16 };
    double lse = 0, mx = -INFINITY;
    float pv[W];
    for (int i = 0; i < W; i++) {
        int c = 0;
        for (int h = 0; h < N_HIST; h++) c += g_hist[h] == i;
        pv[i] = c ? logits[i] - 0.5f : logits[i];
        mx = fmax(mx, pv[i]);
    }
    for (int i = 0; i < W; i++) lse += exp(pv[i] - mx);
    lse = mx + log(lse);
    int lp_ok = 0, rejected = 0;
    for (uint64_t step = 0; step < 500; step++) {
        kiln_logprobs lv, le;
        bool acc;
        int32_t draft = (int32_t)(hash01(step) * W);
        int32_t t = kiln_sample_verify_rejection(&q, logits, W, g_hist, N_HIST, step, draft, &acc,
                                                 20, &lv, s);
        REQUIRE(t >= 0 && t < W);
        rejected += !acc;
        kiln_sample_ex(&q, logits, W, g_hist, N_HIST, step, 20, &le, s);
        bool top_same = lv.n_top == W && le.n_top == W;
        float in_ex = NAN;
        for (int j = 0; j < W && top_same; j++) {
            top_same = lv.top_ids[j] == le.top_ids[j] &&
                       !memcmp(&lv.top_logprobs[j], &le.top_logprobs[j], sizeof(float));
            if (le.top_ids[j] == t) in_ex = le.top_logprobs[j];
        }
        lp_ok += top_same && lv.token == t && lv.logprob == in_ex &&
                 fabs(lv.logprob - (pv[t] - lse)) < 1e-4;
    }
    CHECKF(lp_ok == 500, "sampled logprobs: %d of 500 right", lp_ok);
    CHECK(rejected > 100);
    kiln_sampler_scratch_destroy(s);
}

static void test_determinism(void) {
    float logits[V], other[V];
    make_logits(logits, 4);
    make_logits(other, 5);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 0.9f;
    p.top_k = 25;
    p.min_p = 0.02f;
    p.xtc_probability = 0.3f;
    p.seed = 0xC0FFEEull;
    kiln_sampler_params q = kiln_sampler_defaults();
    q.top_p = 0.5f;
    kiln_sampler_scratch *s1 = scratch(V), *s2 = scratch(3 * V);
    int32_t first[500];
    bool first_acc[500];
    for (uint64_t step = 0; step < 500; step++)
        first[step] =
            kiln_sample_verify_rejection(&p, logits, V, g_hist, N_HIST, step, (int32_t)(step % V),
                                         &first_acc[step], 0, NULL, s1);
    /* other work in between on the same scratch, reverse order, another scratch, logprobs */
    int same = 0, changes = 0;
    for (int64_t step = 499; step >= 0; step--) {
        bool a1, a2, a3;
        kiln_sample_verify_rejection(&q, other, V, NULL, 0, (uint64_t)step * 3, 1, &a3, 4, NULL,
                                     s1);
        kiln_logprobs lp;
        int32_t a = kiln_sample_verify_rejection(&p, logits, V, g_hist, N_HIST, (uint64_t)step,
                                                 (int32_t)(step % V), &a1, 7, &lp, s1);
        int32_t b = kiln_sample_verify_rejection(&p, logits, V, g_hist, N_HIST, (uint64_t)step,
                                                 (int32_t)(step % V), &a2, 0, NULL, s2);
        same += a == first[step] && b == first[step] && a1 == first_acc[step] &&
                a2 == first_acc[step] && lp.token == a;
        changes += step > 0 && first[step] != first[step - 1];
    }
    CHECK(same == 500);
    CHECK(changes > 200);
    kiln_sampler_scratch_destroy(s1);
    kiln_sampler_scratch_destroy(s2);
}

static void test_edge_cases(void) {
    float logits[V];
    make_logits(logits, 6);
    kiln_sampler_scratch *s = scratch(V);
    kiln_sampler_params p = kiln_sampler_defaults();
    p.top_k = 10;
    p.seed = 3;
    int32_t ban_id = 40;
    float ban_v = -INFINITY;
    p.n_bias = 1;
    p.bias_ids = &ban_id;
    p.bias_values = &ban_v;
    /* p(draft) = 0: out of range, banned, or cut by top-k: rejected, and the token is
     * bitwise kiln_sample_ex's */
    int32_t order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    double dv[V];
    for (int i = 0; i < V; i++) dv[i] = i == ban_id ? -INFINITY : logits[i];
    g_vals = dv;
    qsort(order, V, sizeof *order, canon_cmp);
    const int32_t drafts[] = {-1,        V,      V + 1000,  INT32_MAX,
                              INT32_MIN, ban_id, order[10], order[V - 2]};
    int ok = 0;
    for (int i = 0; i < 8; i++)
        for (uint64_t step = 0; step < 500; step++) {
            bool acc = true;
            int32_t t = kiln_sample_verify_rejection(&p, logits, V, NULL, 0, step, drafts[i], &acc,
                                                     0, NULL, s);
            ok += !acc && t == kiln_sample_ex(&p, logits, V, NULL, 0, step, 0, NULL, s);
        }
    CHECKF(ok == 8 * 500, "p(draft) = 0: %d of 4000 right", ok);

    /* every token banned: 0, accepted iff the draft is 0 (as kiln_sample_ex and greedy) */
    int32_t all_ids[V];
    float all_v[V];
    for (int i = 0; i < V; i++) all_ids[i] = i, all_v[i] = -INFINITY;
    kiln_sampler_params b = kiln_sampler_defaults();
    b.n_bias = V;
    b.bias_ids = all_ids;
    b.bias_values = all_v;
    for (int g = 0; g < 2; g++) {
        b.temperature = g ? 1.0f : 0.0f;
        bool acc = false;
        kiln_logprobs lp;
        CHECK(kiln_sample_verify_rejection(&b, logits, V, NULL, 0, 0, 0, &acc, 3, &lp, s) == 0 &&
              acc && lp.token == 0 && lp.logprob == -INFINITY && lp.n_top == 0);
        CHECK(kiln_sample_verify_rejection(&b, logits, V, NULL, 0, 0, 5, &acc, 0, NULL, s) == 0 &&
              !acc);
    }

    /* misuse: -1 and not accepted */
    bool acc = true;
    CHECK(kiln_sample_verify_rejection(NULL, logits, V, NULL, 0, 0, 1, &acc, 0, NULL, s) == -1 &&
          !acc);
    acc = true;
    CHECK(kiln_sample_verify_rejection(&p, NULL, V, NULL, 0, 0, 1, &acc, 0, NULL, s) == -1 && !acc);
    CHECK(kiln_sample_verify_rejection(&p, logits, V, NULL, 0, 0, 1, NULL, 0, NULL, s) == -1);
    acc = true;
    CHECK(kiln_sample_verify_rejection(&p, logits, V, NULL, 0, 0, 1, &acc, 21, NULL, s) == -1 &&
          !acc);
    CHECK(kiln_sample_verify_rejection(&p, logits, V, NULL, 0, 0, 1, &acc, -1, NULL, s) == -1);
    CHECK(kiln_sample_verify_rejection(&p, logits, V + 1, NULL, 0, 0, 1, &acc, 0, NULL, s) == -1);
    CHECK(kiln_sample_verify_rejection(&p, logits, 0, NULL, 0, 0, 1, &acc, 0, NULL, s) == -1);
    CHECK(kiln_sample_verify_rejection(&p, logits, V, NULL, 2, 0, 1, &acc, 0, NULL, s) == -1);
    CHECK(kiln_sample_verify_rejection(&p, logits, V, NULL, 0, 0, 1, &acc, 0, NULL, NULL) == -1);
    kiln_sampler_scratch_destroy(s);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "all";
    bool all = strcmp(c, "all") == 0;
    if (all || !strcmp(c, "distribution")) test_distribution();
    if (all || !strcmp(c, "acceptance")) test_acceptance();
    if (all || !strcmp(c, "greedy")) test_greedy();
    if (all || !strcmp(c, "determinism")) test_determinism();
    if (all || !strcmp(c, "edge_cases")) test_edge_cases();
    return kiln_test_finish(c);
}
