/*
 * sampler.h - per-request token sampling from logits.
 * Processor order (DESIGN.md "Sampling"): logit bias; repetition, presence and frequency
 * penalties (each over its own window of recent tokens); logprobs capture (log-softmax at
 * this point); temperature; top-k; top-p; min-p; the draw. The random state is
 * counter-based: the draw at step s uses only (seed, s).
 */
#ifndef KILN_ENGINE_SAMPLER_H
#define KILN_ENGINE_SAMPLER_H

#include <stdint.h>

#include "kiln.h"

typedef struct kiln_sampler_params {
    float temperature; /* 0 = greedy (argmax, lowest id on ties); valid range [0, 2] */
    int32_t top_k;     /* 0 = off; keep the k most likely tokens */
    float top_p;       /* (0, 1]; 1 = off; keep the smallest set with cumulative prob >= top_p
                          (Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration") */
    float min_p;       /* [0, 1]; 0 = off; keep tokens with p >= min_p * p_max (Nguyen et al. 2024) */
    uint64_t seed;

    /* Penalties (0 / 1.0 = off). Each looks at the last *_window tokens of the sequence
     * (prompt + generated); window 0 = the whole sequence. */
    float repetition_penalty; /* > 0; 1 = off. CTRL (Keskar et al. 2019): positive logits
                                 are divided by it, negative multiplied */
    int32_t repetition_window;
    float presence_penalty;   /* [-2, 2]; subtracted once from every token present
                                 (OpenAI API semantics) */
    int32_t presence_window;
    float frequency_penalty;  /* [-2, 2]; subtracted count(token) times */
    int32_t frequency_window;

    /* Logit bias: added to logits[id] before anything else. Borrowed arrays of n_bias. */
    int32_t n_bias;
    const int32_t *bias_ids;
    const float *bias_values;
} kiln_sampler_params;

/** Defaults: temperature 1, top_k 0, top_p 1, min_p 0, seed 0, penalties off, no bias. */
kiln_sampler_params kiln_sampler_defaults(void);

/**
 * Check ranges; the message names the field. Errors: KILN_ERR_INVALID_ARGUMENT.
 * temperature in [0, 2], top_k >= 0, top_p in (0, 1], min_p in [0, 1].
 */
kiln_status kiln_sampler_validate(const kiln_sampler_params *p, kiln_error *err);

/**
 * A uniform float in [0, 1) that depends only on (seed, step): SplitMix64 finalizer
 * (Steele et al. 2014, "Fast splittable pseudorandom number generators") applied to the seed
 * and then to (mixed seed XOR step); the top 24 bits form the float.
 */
float kiln_rng_uniform(uint64_t seed, uint64_t step);

/** Scratch space for kiln_sample, sized for a vocabulary; reusable across steps. */
typedef struct kiln_sampler_scratch kiln_sampler_scratch;
kiln_status kiln_sampler_scratch_create(int32_t n_vocab, kiln_sampler_scratch **out,
                                        kiln_error *err);
void kiln_sampler_scratch_destroy(kiln_sampler_scratch *s);

/**
 * Pick a token from logits[n_vocab] (not modified) at generation step `step`.
 * Returns an id in [0, n_vocab). Deterministic for a given (params, logits, step).
 * Non-finite logits are treated as -inf; if every logit is -inf the lowest id is returned.
 */
int32_t kiln_sample(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                    uint64_t step, kiln_sampler_scratch *scratch);

/** Index of the largest finite value (lowest index on ties); 0 when none is finite. */
int32_t kiln_argmax(const float *x, int32_t n);

#endif
