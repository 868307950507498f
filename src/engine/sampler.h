/*
 * sampler.h - per-request token sampling from logits.
 *
 * Processor order (DESIGN.md "Sampling"):
 *   1. logit bias                 logits[id] += bias (OpenAI `logit_bias`)
 *   2. penalties                  repetition, then presence, then frequency; each counts the
 *                                 tokens of its own window of the sequence (prompt + generated)
 *   3. logprobs capture           log-softmax of the logits at this point (before temperature)
 *   4. temperature                0 = greedy: argmax of the logits after 1-2 (lowest id on ties)
 *   5. top-k
 *   6. top-p
 *   7. min-p
 *   8. XTC                        "exclude top choices" (p-e-w, text-generation-webui PR 6335;
 *                                 llama.cpp's xtc sampler): with probability xtc_probability
 *                                 (its own draw, see kiln_sampler_params), when two or more
 *                                 kept tokens have probability >= xtc_threshold, all of them
 *                                 but the least likely are removed
 *   9. the draw                   u = kiln_rng_uniform(seed, step)
 *
 * Canonical order. Truncation (top-k, top-p, min-p) and the draw are defined on one total
 * order of the candidates: processed logit descending, token id ascending, so ties never
 * depend on the selection algorithm. The result depends only on (params, logits, history,
 * step): never on other sequences in the batch or on earlier calls (batch invariance).
 *
 * Non-finite logits (NaN, +-inf) coming from the model are treated as -inf (never sampled).
 */
#ifndef KILN_ENGINE_SAMPLER_H
#define KILN_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

/** Largest `top_logprobs` a request may ask for (the OpenAI API's limit). */
#define KILN_MAX_TOP_LOGPROBS 20
/** Largest accepted repetition_penalty (vLLM accepts any > 0; kiln bounds it). */
#define KILN_MAX_REPETITION_PENALTY 10.0f
/** logit_bias values must be in [-KILN_MAX_LOGIT_BIAS, KILN_MAX_LOGIT_BIAS] or -inf. */
#define KILN_MAX_LOGIT_BIAS 100.0f

typedef struct kiln_sampler_params {
    float temperature; /* 0 = greedy (argmax, lowest id on ties); valid range [0, 2] */
    int32_t top_k;     /* 0 = off; keep the k most likely tokens */
    float top_p;       /* (0, 1]; 1 = off; keep the smallest prefix of the canonical order
                          whose cumulative prob >= top_p (Holtzman et al. 2019, "The Curious
                          Case of Neural Text Degeneration") */
    float min_p;       /* [0, 1]; 0 = off; keep tokens with p >= min_p * p_max (Nguyen et al.
                          2024, "Turning Up the Heat: Min-p Sampling") */
    uint64_t seed;

    /* Penalties (0 / 1.0 = off). Each looks at the last *_window tokens of the history
     * passed to kiln_sample_ex (prompt + generated); window 0 = the whole history. */
    float repetition_penalty; /* (0, 10]; 1 = off. CTRL (Keskar et al. 2019), as llama.cpp's
                                 penalties sampler: for a token present in the window a
                                 logit > 0 is divided by it, a logit <= 0 multiplied */
    int32_t repetition_window;
    float presence_penalty; /* [-2, 2]; logit -= presence_penalty if count > 0 (OpenAI) */
    int32_t presence_window;
    float frequency_penalty; /* [-2, 2]; logit -= frequency_penalty * count (OpenAI) */
    int32_t frequency_window;

    /* Logit bias (OpenAI `logit_bias`): added to logits[id] before anything else.
     * Borrowed arrays of n_bias entries. Values in [-100, 100], or -inf to ban a token.
     * A repeated id adds each of its values. */
    int32_t n_bias;
    const int32_t *bias_ids;
    const float *bias_values;

    /* XTC (processor 8), on the distribution left after min-p (temperature applied, kept
     * weights renormalised). It triggers when u_xtc < xtc_probability, u_xtc =
     * kiln_rng_uniform(seed ^ KILN_XTC_STREAM, step): a draw of its own, so the token draw
     * (processor 9) is the same whether XTC is on or off. xtc_threshold > 0.5 can never
     * find two tokens and turns it off (as llama.cpp). */
    float xtc_probability; /* [0, 1]; 0 = off (default) */
    float xtc_threshold;   /* [0, 1]; default 0.1 */
} kiln_sampler_params;

/** Salt of XTC's random stream (kiln_rng_uniform(seed ^ KILN_XTC_STREAM, step)). */
#define KILN_XTC_STREAM 0x58544321u /* "XTC!" */
/** Salt of the acceptance draw of kiln_sample_verify_rejection
 *  (kiln_rng_uniform(seed ^ KILN_SPEC_REJECT_STREAM, step)). */
#define KILN_SPEC_REJECT_STREAM 0x52454A21u /* "REJ!" */

/** Defaults: temperature 1, top_k 0, top_p 1, min_p 0, seed 0, penalties off, no bias, XTC
 *  off (xtc_probability 0, xtc_threshold 0.1). */
kiln_sampler_params kiln_sampler_defaults(void);

/**
 * Check ranges. Errors: KILN_ERR_INVALID_ARGUMENT, the message names the field as the OpenAI
 * API does (e.g. "top_p must be in (0, 1] (got 1.5)"):
 *   temperature in [0, 2]; top_k >= 0; top_p in (0, 1]; min_p in [0, 1]; xtc_probability and
 *   xtc_threshold in [0, 1];
 *   repetition_penalty in (0, 10]; presence_penalty and frequency_penalty in [-2, 2];
 *   repetition_window, presence_window, frequency_window >= 0;
 *   n_bias >= 0 with non-NULL arrays when n_bias > 0; logit_bias ids >= 0, values in
 *   [-100, 100] or -inf.
 * NaN fails every range. Bias ids are not checked against a vocabulary here (see
 * kiln_sampler_validate_vocab).
 */
kiln_status kiln_sampler_validate(const kiln_sampler_params *p, kiln_error *err);

/**
 * kiln_sampler_validate plus: every logit_bias id is in [0, n_vocab).
 * Errors: KILN_ERR_INVALID_ARGUMENT (also when n_vocab < 1).
 */
kiln_status kiln_sampler_validate_vocab(const kiln_sampler_params *p, int32_t n_vocab,
                                        kiln_error *err);

/**
 * top_logprobs in [0, KILN_MAX_TOP_LOGPROBS] (OpenAI `top_logprobs`).
 * Errors: KILN_ERR_INVALID_ARGUMENT ("top_logprobs must be in [0, 20] (got 21)").
 */
kiln_status kiln_sampler_validate_top_logprobs(int32_t top_logprobs, kiln_error *err);

/**
 * A uniform float in [0, 1) that depends only on (seed, step): SplitMix64 finalizer
 * (Steele et al. 2014, "Fast splittable pseudorandom number generators") applied to the seed
 * and then to (mixed seed XOR step); the top 24 bits form the float.
 */
float kiln_rng_uniform(uint64_t seed, uint64_t step);

/**
 * Scratch space for the sampler, sized for a vocabulary; reusable across steps and
 * sequences (its contents never influence a result). Not thread-safe: one per thread.
 * Holds O(n_vocab) floats/ints (about 20 bytes per vocabulary entry).
 */
typedef struct kiln_sampler_scratch kiln_sampler_scratch;

/** Errors: KILN_ERR_INVALID_ARGUMENT (n_vocab < 1), KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_sampler_scratch_create(int32_t n_vocab, kiln_sampler_scratch **out,
                                        kiln_error *err);
void kiln_sampler_scratch_destroy(kiln_sampler_scratch *s);

/** Log-probabilities of one sampled position (OpenAI `logprobs` / `top_logprobs`). */
typedef struct kiln_logprobs {
    int32_t token; /* the chosen token */
    float logprob; /* natural-log probability of `token` at the capture point (processor 3:
                      log-softmax after bias and penalties, before temperature); -inf only
                      when every token was banned */
    int32_t n_top; /* entries in top_*: min(top_logprobs, number of tokens whose logprob is
                      finite) */
    int32_t top_ids[KILN_MAX_TOP_LOGPROBS]; /* the n_top most likely tokens, logprob
                                               descending, ties by id ascending; may or may
                                               not contain `token` */
    float top_logprobs[KILN_MAX_TOP_LOGPROBS];
} kiln_logprobs;

/**
 * Apply processors 1-2 (logit bias, then repetition, presence and frequency penalties) to
 * logits[n_vocab], writing the processed logits to out[n_vocab] (out may equal logits).
 * Non-finite inputs become -inf. history[0..n_history) is the sequence so far (prompt +
 * generated, oldest first); ids outside [0, n_vocab) in it are ignored. Each penalty counts
 * the tokens in history[max(0, n_history - window) .. n_history) (window 0 = all).
 * Cost: O(n_vocab + n_bias + windows); penalties touch only tokens present in their window.
 * Arithmetic per token, in float, in this order:
 *   v += bias;  if (rep count > 0) v = v > 0 ? v / repetition_penalty : v * repetition_penalty;
 *   if (presence count > 0) v -= presence_penalty;  v -= frequency_penalty * (float)count.
 * Bias ids outside [0, n_vocab) are skipped (validate first). n_vocab must not exceed the
 * scratch's vocabulary. Returns false (out untouched) on misuse: NULL p/logits/out/scratch,
 * n_vocab < 1 or larger than the scratch, n_history < 0, or history NULL with n_history > 0.
 */
bool kiln_sampler_process(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                          const int32_t *history, int32_t n_history, float *out,
                          kiln_sampler_scratch *scratch);

/**
 * Pick a token: the full pipeline of this header (processors 1-9).
 *
 * p:            validated parameters (kiln_sampler_validate_vocab).
 * logits:       [n_vocab] raw logits of this position; not modified.
 * history:      [n_history] the sequence so far (prompt + generated tokens, oldest first),
 *               for the penalties; may be NULL when n_history is 0.
 * step:         the generation step counter of this request (0 for its first generated
 *               token); the draw uses u = kiln_rng_uniform(p->seed, step) only.
 * top_logprobs: [0, KILN_MAX_TOP_LOGPROBS]: how many top entries to fill in *lp_out.
 * lp_out:       NULL to skip the logprobs work (the log-softmax costs O(n_vocab)); otherwise
 *               filled (token, its logprob, and the top_logprobs best entries).
 * scratch:      created for a vocabulary >= n_vocab.
 *
 * Greedy (temperature 0): argmax of the processed logits, lowest id on ties.
 * Otherwise: candidates = tokens with a finite processed logit, in the canonical order
 * (logit desc, id asc); weight w = exp((logit - max) / temperature); top-k keeps the first k;
 * top-p keeps the shortest prefix whose cumulative weight >= top_p * (sum of weights kept by
 * top-k); min-p keeps those with w >= min_p * w_max; the draw walks the kept prefix in order
 * and returns the first token whose cumulative weight exceeds u * (sum of kept weights).
 * Sums are accumulated in double (in an order fixed by the inputs, so the result is exact-
 * reproducible; against an exact sequential sum, only draws within ~1e-7 relative of a
 * cumulative boundary can differ).
 * Cost: O(n_vocab) expected. top-k uses a bounded heap (O(n log k)); top-p and the draw use
 * a quickselect on prefix weight with a deterministic pivot (O(n) expected, heap-sort
 * fallback bounds it by O(n log n)); no full sort of the vocabulary. About 1.5 ms at
 * n_vocab = 128k with a high-entropy distribution, 0.2 ms with top_k 40 (one core).
 *
 * Returns an id in [0, n_vocab); 0 when every token is -inf (all banned). Returns -1 only
 * on misuse (see kiln_sampler_process, or top_logprobs out of range).
 * Deterministic: depends only on (p, logits, history, step).
 */
int32_t kiln_sample_ex(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                       const int32_t *history, int32_t n_history, uint64_t step,
                       int32_t top_logprobs, kiln_logprobs *lp_out, kiln_sampler_scratch *scratch);

/**
 * Verify one draft token by speculative sampling (KILN_SPEC_ACCEPT_REJECTION): Leviathan,
 * Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
 * Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
 * Sampling"; with the drafter's distribution q a point mass on `draft`.
 *
 * p(.) is exactly the distribution kiln_sample_ex draws from at (p, logits, history, step):
 * processors 1-8, the kept candidates with their normalised weights (XTC with its own draw).
 * - Accept with probability min(1, p(draft) / q(draft)) = p(draft): accept iff
 *   u_acc < p(draft), u_acc = kiln_rng_uniform(p->seed ^ KILN_SPEC_REJECT_STREAM, step)
 *   (compared as u_acc * kept_total < w(draft), in double). Returns draft, *accepted = true.
 *   A draft that is the only kept token (p(draft) = 1) is always accepted.
 * - Otherwise draw from the residual normalize(max(0, p - q)), which is p with `draft`
 *   removed and renormalised, with the request's ordinary draw u = kiln_rng_uniform(p->seed,
 *   step) walking the canonical order (logit desc, id asc) as kiln_sample_ex's draw does.
 *   *accepted = false. A draft with p(draft) = 0 (not kept, banned, or outside [0, n_vocab))
 *   is always rejected and the token is then bitwise kiln_sample_ex's.
 * The returned token is distributed as p whatever the draft; it is not bitwise
 * kiln_sample_ex's (use KILN_SPEC_ACCEPT_EXACT for that).
 * - Greedy (temperature 0): returns the argmax of kiln_sample_ex (processed logits, lowest id
 *   on ties); *accepted iff draft equals it.
 * - Every token banned: returns 0 (as kiln_sample_ex); *accepted iff draft == 0.
 *
 * Arguments as kiln_sample_ex, plus draft (any id; out of range means p(draft) = 0) and
 * accepted (out: whether the returned token is the draft). lp_out is what kiln_sample_ex
 * reports for the returned token (the capture point, processor 3, does not depend on the
 * draw): token = the returned token.
 * Returns an id in [0, n_vocab), or -1 on misuse (as kiln_sample_ex, or accepted NULL);
 * *accepted is false on misuse. Cost: that of kiln_sample_ex plus O(kept).
 * Deterministic: depends only on (p, logits, history, step, draft).
 */
int32_t kiln_sample_verify_rejection(const kiln_sampler_params *p, const float *logits,
                                     int32_t n_vocab, const int32_t *history, int32_t n_history,
                                     uint64_t step, int32_t draft, bool *accepted,
                                     int32_t top_logprobs, kiln_logprobs *lp_out,
                                     kiln_sampler_scratch *scratch);

/**
 * Compatibility wrapper: kiln_sample_ex with an empty history (so penalties are inert; logit
 * bias still applies) and no logprobs. Returns an id in [0, n_vocab).
 */
int32_t kiln_sample(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                    uint64_t step, kiln_sampler_scratch *scratch);

/**
 * The logprobs kiln_sample_ex would report (processor 3) if it had returned `token`: the
 * log-softmax of logits[n_vocab] after bias and penalties over history[0..n_history), for
 * token and the top_logprobs best. For tokens that are not sampled (asserted fill). False on
 * misuse (as kiln_sample_ex; token outside [0, n_vocab)).
 */
bool kiln_sampler_logprobs_of(const kiln_sampler_params *p, const float *logits, int32_t n_vocab,
                              const int32_t *history, int32_t n_history, int32_t token,
                              int32_t top_logprobs, kiln_logprobs *lp,
                              kiln_sampler_scratch *scratch);

/** Index of the largest finite value (lowest index on ties); 0 when none is finite. */
int32_t kiln_argmax(const float *x, int32_t n);

#endif
