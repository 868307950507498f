#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "util/error.h"

struct kiln_sampler_scratch {
    int32_t n_vocab;
    float *vals;      /* [n_vocab] processed logits */
    float *w;         /* [n_vocab] unnormalized probabilities, indexed by token id */
    int32_t *cand;    /* [n_vocab] candidate ids (heap storage) */
    int32_t *counts;  /* [n_vocab] per-token counts of a window; all zero between uses */
    int32_t *touched; /* [n_vocab] ids with a nonzero count */
};

kiln_sampler_params kiln_sampler_defaults(void) {
    return (kiln_sampler_params){.temperature = 1.0f,
                                 .top_k = 0,
                                 .top_p = 1.0f,
                                 .min_p = 0.0f,
                                 .seed = 0,
                                 .repetition_penalty = 1.0f,
                                 .xtc_threshold = 0.1f};
}

/* ---- validation ---------------------------------------------------------------------- */

static kiln_status validate(const kiln_sampler_params *p, int32_t n_vocab, kiln_error *err) {
    if (!p) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "sampler params are NULL");
    if (!(p->temperature >= 0.0f && p->temperature <= 2.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "temperature must be in [0, 2] (got %g)", p->temperature);
    if (p->top_k < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "top_k must be >= 0 (got %d)",
                              p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1] (got %g)",
                              p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1] (got %g)",
                              p->min_p);
    if (!(p->xtc_probability >= 0.0f && p->xtc_probability <= 1.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "xtc_probability must be in [0, 1] (got %g)", p->xtc_probability);
    if (!(p->xtc_threshold >= 0.0f && p->xtc_threshold <= 1.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "xtc_threshold must be in [0, 1] (got %g)", p->xtc_threshold);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= KILN_MAX_REPETITION_PENALTY))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "repetition_penalty must be in (0, %g] (got %g)",
                              KILN_MAX_REPETITION_PENALTY, p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "presence_penalty must be in [-2, 2] (got %g)", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "frequency_penalty must be in [-2, 2] (got %g)",
                              p->frequency_penalty);
    if (p->repetition_window < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "repetition_window must be >= 0 (got %d)", p->repetition_window);
    if (p->presence_window < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "presence_window must be >= 0 (got %d)", p->presence_window);
    if (p->frequency_window < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "frequency_window must be >= 0 (got %d)", p->frequency_window);
    if (p->n_bias < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "logit_bias must have >= 0 entries (got %d)", p->n_bias);
    if (p->n_bias > 0 && (!p->bias_ids || !p->bias_values))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "logit_bias has %d entries but no arrays", p->n_bias);
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t id = p->bias_ids[i];
        float v = p->bias_values[i];
        if (id < 0 || (n_vocab > 0 && id >= n_vocab)) {
            if (n_vocab > 0)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "logit_bias token id must be in [0, %d) (got %d)", n_vocab,
                                      id);
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "logit_bias token id must be >= 0 (got %d)", id);
        }
        if (!(v == -INFINITY || (v >= -KILN_MAX_LOGIT_BIAS && v <= KILN_MAX_LOGIT_BIAS)))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "logit_bias value must be in [-100, 100] (got %g for token %d)",
                                  v, id);
    }
    return KILN_OK;
}

kiln_status kiln_sampler_validate(const kiln_sampler_params *p, kiln_error *err) {
    return validate(p, 0, err);
}

kiln_status kiln_sampler_validate_vocab(const kiln_sampler_params *p, int32_t n_vocab,
                                        kiln_error *err) {
    if (n_vocab < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_vocab must be >= 1 (got %d)",
                              n_vocab);
    return validate(p, n_vocab, err);
}

kiln_status kiln_sampler_validate_top_logprobs(int32_t top_logprobs, kiln_error *err) {
    if (top_logprobs < 0 || top_logprobs > KILN_MAX_TOP_LOGPROBS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "top_logprobs must be in [0, %d] (got %d)", KILN_MAX_TOP_LOGPROBS,
                              top_logprobs);
    return KILN_OK;
}

/* ---- RNG ----------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float kiln_rng_uniform(uint64_t seed, uint64_t step) {
    uint64_t z = splitmix64(splitmix64(seed) ^ step);
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* ---- scratch ------------------------------------------------------------------------- */

kiln_status kiln_sampler_scratch_create(int32_t n_vocab, kiln_sampler_scratch **out,
                                        kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (n_vocab < 1) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_vocab must be >= 1");
    kiln_sampler_scratch *s = calloc(1, sizeof *s);
    if (s) {
        size_t n = (size_t)n_vocab;
        s->n_vocab = n_vocab;
        s->vals = malloc(n * sizeof *s->vals);
        s->w = malloc(n * sizeof *s->w);
        s->cand = malloc(n * sizeof *s->cand);
        s->counts = calloc(n, sizeof *s->counts);
        s->touched = malloc(n * sizeof *s->touched);
    }
    if (!s || !s->vals || !s->w || !s->cand || !s->counts || !s->touched) {
        kiln_sampler_scratch_destroy(s);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *out = s;
    return KILN_OK;
}

void kiln_sampler_scratch_destroy(kiln_sampler_scratch *s) {
    if (!s) return;
    free(s->vals);
    free(s->w);
    free(s->cand);
    free(s->counts);
    free(s->touched);
    free(s);
}

int32_t kiln_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    float bv = -INFINITY;
    bool found = false;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        if (!found || x[i] > bv) {
            bv = x[i];
            best = i;
            found = true;
        }
    }
    return best;
}

/* ---- processors 1-2: bias and penalties ---------------------------------------------- */

/* Keep processed logits finite or -inf: +inf (overflow) saturates, NaN cannot arise from
 * validated parameters but would be treated as banned. */
static inline float sanitize(float v) {
    if (isnan(v)) return -INFINITY;
    if (v == INFINITY) return FLT_MAX;
    return v;
}

/* Count the tokens of history's last `window` entries (0 = all) into s->counts; returns the
 * number of distinct ids, listed in s->touched. O(window). */
static int32_t count_window(kiln_sampler_scratch *s, const int32_t *history, int32_t n_history,
                            int32_t window, int32_t n_vocab) {
    int32_t start = (window > 0 && window < n_history) ? n_history - window : 0;
    int32_t nt = 0;
    for (int32_t i = start; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= n_vocab) continue;
        if (s->counts[t]++ == 0) s->touched[nt++] = t;
    }
    return nt;
}

static void clear_counts(kiln_sampler_scratch *s, int32_t nt) {
    for (int32_t i = 0; i < nt; i++) s->counts[s->touched[i]] = 0;
}

bool kiln_sampler_process(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                          const int32_t *history, int32_t n_history, float *out,
                          kiln_sampler_scratch *s) {
    if (!p || !logits || !out || !s || n_vocab < 1 || n_vocab > s->n_vocab || n_history < 0 ||
        (n_history > 0 && !history) || p->n_bias < 0 ||
        (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return false;
    for (int32_t i = 0; i < n_vocab; i++) out[i] = isfinite(logits[i]) ? logits[i] : -INFINITY;

    /* 1. logit bias */
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t id = p->bias_ids[i];
        if (id < 0 || id >= n_vocab) continue;
        out[id] = sanitize(out[id] + p->bias_values[i]);
    }

    /* 2. penalties, each over its own window */
    if (n_history > 0 && p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f) {
        float r = p->repetition_penalty;
        int32_t nt = count_window(s, history, n_history, p->repetition_window, n_vocab);
        for (int32_t i = 0; i < nt; i++) {
            int32_t t = s->touched[i];
            float v = out[t];
            out[t] = sanitize(v > 0.0f ? v / r : v * r);
        }
        clear_counts(s, nt);
    }
    if (n_history > 0 && p->presence_penalty != 0.0f) {
        int32_t nt = count_window(s, history, n_history, p->presence_window, n_vocab);
        for (int32_t i = 0; i < nt; i++) {
            int32_t t = s->touched[i];
            out[t] = sanitize(out[t] - p->presence_penalty);
        }
        clear_counts(s, nt);
    }
    if (n_history > 0 && p->frequency_penalty != 0.0f) {
        int32_t nt = count_window(s, history, n_history, p->frequency_window, n_vocab);
        for (int32_t i = 0; i < nt; i++) {
            int32_t t = s->touched[i];
            out[t] = sanitize(out[t] - p->frequency_penalty * (float)s->counts[t]);
        }
        clear_counts(s, nt);
    }
    return true;
}

/* ---- canonical order and heaps ------------------------------------------------------- */

/* The total order of the sampler: value descending, id ascending. */
static inline bool before(const float *v, int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Max-heap (root = first in canonical order) when max is true; otherwise a min-heap (root =
 * last in canonical order). */
static void sift_down(int32_t *h, int32_t n, int32_t i, const float *v, bool max) {
    int32_t x = h[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (max ? before(v, h[c + 1], h[c]) : before(v, h[c], h[c + 1]))) c++;
        if (!(max ? before(v, h[c], x) : before(v, x, h[c]))) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heapify(int32_t *h, int32_t n, const float *v, bool max) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i, v, max);
}

/* Sort h[0..n) into canonical order (heapsort on a min-heap whose root is the last element
 * of the order; O(n log n), no recursion). */
static void sort_canonical(int32_t *h, int32_t n, const float *v) {
    heapify(h, n, v, false);
    for (int32_t e = n - 1; e > 0; e--) {
        int32_t t = h[0];
        h[0] = h[e];
        h[e] = t;
        sift_down(h, e, 0, v, false);
    }
}

static inline void swap_i32(int32_t *a, int32_t *b) {
    int32_t t = *a;
    *a = *b;
    *b = t;
}

static inline bool passes(double cum, double t, bool inclusive) {
    return inclusive ? cum >= t : cum > t;
}

/*
 * Weighted selection: the first candidate of c[0..n) in canonical order whose inclusive
 * prefix weight passes t (cum > t, or cum >= t when inclusive). On return c[0..j) holds
 * exactly the candidates that precede it (unordered), c[j] is it, and *prefix is the prefix
 * weight through it. Quickselect on prefix mass with a deterministic median-of-three pivot:
 * O(n) expected; after 2 log2(n) + 8 rounds (adversarial input) the remaining range is
 * heap-sorted, so O(n log n) worst case. If rounding keeps t out of reach, the answer is the
 * last candidate of the range it was narrowed to.
 */
static int32_t select_mass(int32_t *c, int32_t n, const float *v, const float *w, double t,
                           bool inclusive, double *prefix) {
    int32_t lo = 0, hi = n;
    double acc = 0.0;
    int budget = 8;
    for (int32_t m = n; m > 1; m >>= 1) budget += 2;
    while (hi - lo > 16 && budget-- > 0) {
        int32_t a = lo, b = lo + (hi - lo) / 2, d = hi - 1;
        /* median of three by canonical order */
        if (before(v, c[b], c[a])) swap_i32(&a, &b);
        if (before(v, c[d], c[b])) {
            swap_i32(&b, &d);
            if (before(v, c[b], c[a])) swap_i32(&a, &b);
        }
        swap_i32(&c[b], &c[hi - 1]);
        int32_t pv = c[hi - 1], i = lo;
        double ml = 0.0;
        for (int32_t k = lo; k < hi - 1; k++) {
            if (before(v, c[k], pv)) {
                ml += w[c[k]];
                swap_i32(&c[i++], &c[k]);
            }
        }
        swap_i32(&c[i], &c[hi - 1]);
        if (passes(acc + ml, t, inclusive)) {
            hi = i;
        } else if (passes(acc + ml + w[pv], t, inclusive)) {
            *prefix = acc + ml + w[pv];
            return i;
        } else {
            acc += ml + w[pv];
            lo = i + 1;
        }
    }
    sort_canonical(c + lo, hi - lo, v);
    for (int32_t k = lo; k < hi; k++) {
        acc += w[c[k]];
        if (passes(acc, t, inclusive)) {
            *prefix = acc;
            return k;
        }
    }
    *prefix = acc;
    return hi > 0 ? hi - 1 : 0;
}

/* ---- processor 3: logprobs ----------------------------------------------------------- */

static double fill_logprobs(const float *v, int32_t n_vocab, int32_t k, kiln_logprobs *lp) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
        if (v[i] > mx) mx = v[i];
    lp->n_top = 0;
    if (mx == -INFINITY) return -INFINITY;
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (v[i] != -INFINITY) sum += exp((double)v[i] - (double)mx);
    double lse = (double)mx + log(sum);

    /* the k best in canonical order: insertion into a sorted array of at most 20 */
    int32_t n = 0;
    int32_t *top = lp->top_ids;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {
        if (v[i] == -INFINITY) continue;
        if (n == k && !before(v, i, top[k - 1])) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && before(v, i, top[j - 1])) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = i;
    }
    lp->n_top = n;
    for (int32_t j = 0; j < n; j++) lp->top_logprobs[j] = (float)((double)v[top[j]] - lse);
    return lse;
}

/* ---- processors 4-8: the final distribution ------------------------------------------ */

/* The distribution the draw samples from (temperature > 0): on return s->cand[0..keep) holds
 * the kept candidates (unordered), s->w[id] their weights, *kept_total the sum of those
 * weights (accumulated in double, in an order fixed by the inputs). Returns keep; 0 when
 * every processed logit is -inf. Shared by kiln_sample_ex and kiln_sample_verify_rejection,
 * so both draw from bit-identical weights. */
static int32_t kept_set(const kiln_sampler_params *p, const float *v, int32_t n_vocab,
                        uint64_t step, kiln_sampler_scratch *s, double *kept_total_out) {
    int32_t *cand = s->cand;
    float *w = s->w;
    int32_t n = 0;
    float vmax = -INFINITY;
    *kept_total_out = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (v[i] == -INFINITY) continue;
        cand[n++] = i;
        if (v[i] > vmax) vmax = v[i];
    }
    if (n == 0) return 0;

    /* 5. top-k: bounded min-heap of the k best (root = worst kept); O(n log k) */
    if (p->top_k > 0 && p->top_k < n) {
        int32_t k = p->top_k;
        heapify(cand, k, v, false);
        for (int32_t i = k; i < n; i++) {
            if (before(v, cand[i], cand[0])) {
                cand[0] = cand[i];
                sift_down(cand, k, 0, v, false);
            }
        }
        n = k;
    }

    /* 4. temperature: weights relative to the max (the max has weight exactly 1) */
    const float t = p->temperature;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = cand[i];
        w[id] = expf((v[id] - vmax) / t);
        total += w[id];
    }

    int32_t keep = n;
    double kept_total = total;

    /* 6. top-p: shortest prefix with cumulative weight >= top_p * total */
    if (p->top_p < 1.0f) {
        double pre;
        int32_t j = select_mass(cand, n, v, w, (double)p->top_p * total, true, &pre);
        keep = j + 1;
        kept_total = pre;
    }

    /* 7. min-p: w >= min_p * w_max with w_max = 1 (a prefix of the canonical order, as w is
     * monotone in the logit); partition the kept set */
    if (p->min_p > 0.0f) {
        const float thr = p->min_p;
        int32_t k = 0;
        double sum = 0.0;
        for (int32_t i = 0; i < keep; i++) {
            if (w[cand[i]] >= thr) {
                sum += w[cand[i]];
                swap_i32(&cand[k++], &cand[i]);
            }
        }
        if (k < keep) {
            keep = k; /* >= 1: the max has w = 1 >= thr */
            kept_total = sum;
        }
    }

    /* 8. XTC: the kept tokens with probability w / kept_total >= threshold are a prefix of
     * the canonical order (w is monotone in the logit); when there are two or more, all but
     * the last (least likely) of them are removed */
    if (p->xtc_probability > 0.0f && keep >= 2 &&
        kiln_rng_uniform(p->seed ^ KILN_XTC_STREAM, step) < p->xtc_probability) {
        const double thr = (double)p->xtc_threshold * kept_total;
        int32_t m = 0, last = -1;
        for (int32_t i = 0; i < keep; i++) {
            if ((double)w[cand[i]] >= thr) {
                m++;
                if (last < 0 || before(v, last, cand[i])) last = cand[i];
            }
        }
        if (m >= 2) {
            int32_t k = 0;
            double sum = 0.0;
            for (int32_t i = 0; i < keep; i++) {
                if ((double)w[cand[i]] >= thr && cand[i] != last) continue;
                sum += w[cand[i]];
                swap_i32(&cand[k++], &cand[i]);
            }
            keep = k;
            kept_total = sum;
        }
    }
    *kept_total_out = kept_total;
    return keep;
}

/* ---- processor 9: the draw ------------------------------------------------------------ */

/* The first of c[0..n) in canonical order whose cumulative weight exceeds
 * u * total, u = kiln_rng_uniform(seed, step). n >= 1. */
static int32_t draw_from(const kiln_sampler_params *p, const float *v, const float *w, int32_t *c,
                         int32_t n, double total, uint64_t step) {
    double pre;
    double target = (double)kiln_rng_uniform(p->seed, step) * total;
    return c[select_mass(c, n, v, w, target, false, &pre)];
}

static int32_t draw(const kiln_sampler_params *p, const float *v, int32_t n_vocab, uint64_t step,
                    kiln_sampler_scratch *s) {
    double kept_total;
    int32_t keep = kept_set(p, v, n_vocab, step, s, &kept_total);
    if (keep == 0) return 0;
    return draw_from(p, v, s->w, s->cand, keep, kept_total, step);
}

/* Speculative sampling's verify step with a point-mass draft (kiln_sample_verify_rejection):
 * accept with probability p(draft) by its own draw, else draw from p without the draft. */
static int32_t draw_verify(const kiln_sampler_params *p, const float *v, int32_t n_vocab,
                           uint64_t step, int32_t draft, kiln_sampler_scratch *s) {
    double kept_total;
    int32_t keep = kept_set(p, v, n_vocab, step, s, &kept_total);
    if (keep == 0) return 0; /* all banned: kiln_sample_ex's token */
    int32_t *cand = s->cand;
    const float *w = s->w;
    int32_t at = -1; /* the draft's index in cand[0..keep); -1 when p(draft) = 0 */
    if (draft >= 0 && draft < n_vocab)
        for (int32_t i = 0; i < keep && at < 0; i++)
            if (cand[i] == draft) at = i;
    /* p(draft) = 0: always rejected, and the residual is p itself */
    if (at < 0) return draw_from(p, v, w, cand, keep, kept_total, step);
    /* accept iff u_acc < p(draft) = w[draft] / kept_total */
    double u_acc = (double)kiln_rng_uniform(p->seed ^ KILN_SPEC_REJECT_STREAM, step);
    if (keep == 1 || u_acc * kept_total < (double)w[draft]) return draft;
    /* reject: the residual normalize(max(0, p - q)) is p without the draft, renormalised */
    swap_i32(&cand[at], &cand[keep - 1]);
    double rest = 0.0;
    for (int32_t i = 0; i < keep - 1; i++) rest += w[cand[i]];
    return rest > 0.0 ? draw_from(p, v, w, cand, keep - 1, rest, step) : draft;
}

/* Processors 1-3 into s->vals (and *lp_out without its token); false on misuse. */
static bool prepare(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                    const int32_t *history, int32_t n_history, int32_t top_logprobs,
                    kiln_logprobs *lp_out, kiln_sampler_scratch *s, double *lse) {
    if (top_logprobs < 0 || top_logprobs > KILN_MAX_TOP_LOGPROBS) return false;
    if (!kiln_sampler_process(p, logits, n_vocab, history, n_history, s ? s->vals : NULL, s))
        return false;
    *lse = -INFINITY;
    if (lp_out) *lse = fill_logprobs(s->vals, n_vocab, top_logprobs, lp_out);
    return true;
}

/* The chosen token's entry of *lp_out (processor 3's log-softmax, independent of the draw). */
static void finish_logprobs(const float *v, double lse, int32_t tok, kiln_logprobs *lp_out) {
    if (!lp_out) return;
    lp_out->token = tok;
    lp_out->logprob =
        (lse == -INFINITY || v[tok] == -INFINITY) ? -INFINITY : (float)((double)v[tok] - lse);
}

int32_t kiln_sample_ex(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                       const int32_t *history, int32_t n_history, uint64_t step,
                       int32_t top_logprobs, kiln_logprobs *lp_out, kiln_sampler_scratch *s) {
    double lse;
    if (!prepare(p, logits, n_vocab, history, n_history, top_logprobs, lp_out, s, &lse)) return -1;
    const float *v = s->vals;
    int32_t tok = p->temperature > 0.0f ? draw(p, v, n_vocab, step, s) : kiln_argmax(v, n_vocab);
    finish_logprobs(v, lse, tok, lp_out);
    return tok;
}

int32_t kiln_sample_verify_rejection(const kiln_sampler_params *p, const float *logits,
                                     int32_t n_vocab, const int32_t *history, int32_t n_history,
                                     uint64_t step, int32_t draft, bool *accepted,
                                     int32_t top_logprobs, kiln_logprobs *lp_out,
                                     kiln_sampler_scratch *s) {
    if (accepted) *accepted = false;
    double lse;
    if (!accepted ||
        !prepare(p, logits, n_vocab, history, n_history, top_logprobs, lp_out, s, &lse))
        return -1;
    const float *v = s->vals;
    int32_t tok = p->temperature > 0.0f ? draw_verify(p, v, n_vocab, step, draft, s)
                                        : kiln_argmax(v, n_vocab);
    *accepted = tok == draft;
    finish_logprobs(v, lse, tok, lp_out);
    return tok;
}

int32_t kiln_sample(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                    uint64_t step, kiln_sampler_scratch *s) {
    int32_t tok = kiln_sample_ex(p, logits, n_vocab, NULL, 0, step, 0, NULL, s);
    return tok < 0 ? 0 : tok;
}

bool kiln_sampler_logprobs_of(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                              const int32_t *history, int32_t n_history, int32_t token,
                              int32_t top_logprobs, kiln_logprobs *lp, kiln_sampler_scratch *s) {
    if (!lp || top_logprobs < 0 || top_logprobs > KILN_MAX_TOP_LOGPROBS || token < 0 ||
        token >= n_vocab)
        return false;
    if (!kiln_sampler_process(p, logits, n_vocab, history, n_history, s ? s->vals : NULL, s))
        return false;
    const float *v = s->vals;
    double lse = fill_logprobs(v, n_vocab, top_logprobs, lp);
    lp->token = token;
    lp->logprob = (lse == -INFINITY || v[token] == -INFINITY) ? -INFINITY
                                                              : (float)((double)v[token] - lse);
    return true;
}
