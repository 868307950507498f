#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "util/error.h"

struct kiln_sampler_scratch {
    int32_t n_vocab;
    int32_t *ids;
    float *vals;
    float *prob;
};

kiln_sampler_params kiln_sampler_defaults(void) {
    return (kiln_sampler_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                 .seed = 0, .repetition_penalty = 1.0f};
}

kiln_status kiln_sampler_validate(const kiln_sampler_params *p, kiln_error *err) {
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
    return KILN_OK;
}

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

kiln_status kiln_sampler_scratch_create(int32_t n_vocab, kiln_sampler_scratch **out,
                                        kiln_error *err) {
    *out = NULL;
    if (n_vocab < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_vocab must be >= 1");
    kiln_sampler_scratch *s = calloc(1, sizeof *s);
    if (s) {
        s->n_vocab = n_vocab;
        s->ids = malloc((size_t)n_vocab * sizeof *s->ids);
        s->vals = malloc((size_t)n_vocab * sizeof *s->vals);
        s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    }
    if (!s || !s->ids || !s->vals || !s->prob) {
        kiln_sampler_scratch_destroy(s);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *out = s;
    return KILN_OK;
}

void kiln_sampler_scratch_destroy(kiln_sampler_scratch *s) {
    if (!s) return;
    free(s->ids);
    free(s->vals);
    free(s->prob);
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

/* Candidates sorted by value descending, ties by id ascending (a total order, so the result
 * does not depend on the sort algorithm). */
/* qsort has no context argument: the values being sorted are passed thread-locally. */
static _Thread_local const float *g_sort_vals;
static int cmp_desc(const void *a, const void *b) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float va = g_sort_vals[ia], vb = g_sort_vals[ib];
    if (va > vb) return -1;
    if (va < vb) return 1;
    return (ia > ib) - (ia < ib);
}

int32_t kiln_sample(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                    uint64_t step, kiln_sampler_scratch *s) {
    if (p->temperature <= 0.0f) return kiln_argmax(logits, n_vocab);
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (!isfinite(logits[i])) continue;
        s->vals[i] = logits[i] / p->temperature;
        s->ids[n++] = i;
    }
    if (n == 0) return 0;
    g_sort_vals = s->vals;
    qsort(s->ids, (size_t)n, sizeof *s->ids, cmp_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    /* softmax over the kept candidates, in sorted order */
    float mx = s->vals[s->ids[0]], sum = 0.0f;
    float *prob = s->prob;
    for (int32_t i = 0; i < n; i++) {
        prob[i] = expf(s->vals[s->ids[i]] - mx);
        sum += prob[i];
    }
    for (int32_t i = 0; i < n; i++) prob[i] /= sum;
    if (p->top_p < 1.0f) {
        float cum = 0.0f;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += prob[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        float thresh = p->min_p * prob[0];
        int32_t keep = 1;
        while (keep < n && prob[keep] >= thresh) keep++;
        n = keep;
    }
    float total = 0.0f;
    for (int32_t i = 0; i < n; i++) total += prob[i];
    float r = kiln_rng_uniform(p->seed, step) * total, cum = 0.0f;
    int32_t pick = s->ids[n - 1];
    for (int32_t i = 0; i < n; i++) {
        cum += prob[i];
        if (r < cum) {
            pick = s->ids[i];
            break;
        }
    }
    return pick;
}
