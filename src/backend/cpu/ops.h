/*
 * ops.h - row-wise CPU operations of the transformer block: RMSNorm, RoPE, SwiGLU, softmax
 * and causal attention. Every function reduces in a fixed order that depends only on its own
 * row, so results are independent of batch composition (DESIGN.md principle 3).
 */
#ifndef KILN_BACKEND_CPU_OPS_H
#define KILN_BACKEND_CPU_OPS_H

#include <stdint.h>

/**
 * RMSNorm of one row: out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)).
 * Source: Zhang & Sennrich 2019; order of operations as llama2.c run.c rmsnorm (sum of
 * squares in f32, then 1/sqrtf). out may alias x. n >= 1.
 */
void kiln_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

/**
 * Rotate one token's heads in place: x holds n_heads vectors of head_dim floats.
 * For pair j (j < head_dim/2) the angle is pos * inv_freq[j].
 * adjacent_pairs != 0 rotates (x[2j], x[2j+1]) (llama2.c run.c, llama.cpp ROPE_TYPE_NORM);
 * otherwise (x[j], x[j + head_dim/2]) (transformers rotate_half). Source: Su et al. 2021,
 * "RoFormer: Enhanced Transformer with Rotary Position Embedding".
 */
void kiln_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t pos, const float *inv_freq,
               int adjacent_pairs);

/** SwiGLU in place: g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)) (Shazeer 2020). */
void kiln_swiglu(float *g, const float *u, int64_t n);

/** Softmax in place over n >= 1 values, max-subtracted, summed left to right. */
void kiln_softmax(float *x, int64_t n);

/**
 * Attention of one query head over n_keys cached positions (causal masking is the caller's
 * choice of n_keys): out[d] = sum_t softmax_t(q . k_t / score_div) * v_t[d]
 * (score_div is usually sqrtf(head_dim); dividing, as run.c does, rather than multiplying
 * by a rounded reciprocal).
 * k_t = k + t * kv_stride, v_t likewise (floats). scores: scratch of n_keys floats.
 * Reduction is sequential over t, as llama2.c run.c.
 */
void kiln_attention_head(float *out, const float *q, const float *k, const float *v,
                         int64_t kv_stride, int32_t n_keys, int32_t head_dim, float score_div,
                         float *scores);

/**
 * As kiln_attention_head over an f16 KV cache (k, v: IEEE half, strides in elements). The
 * arithmetic is that of an f16 matmul pipeline: q is rounded to f16 before q . k, and the
 * softmax probabilities are rounded to f16 before they weight v; products accumulate in f32.
 * This is what llama.cpp's CPU path computes with its default f16 KV cache (q and the
 * probabilities become the f16 operand of ggml_mul_mat), and what tensor-core attention
 * kernels compute (FlashAttention-2 casts P to half before P.V).
 * q16: scratch of head_dim halves.
 */
void kiln_attention_head_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                             int64_t kv_stride, int32_t n_keys, int32_t head_dim, float score_div,
                             float *scores, uint16_t *q16);

#endif
