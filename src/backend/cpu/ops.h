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
 * Attention of one query head over n_keys cached positions stored in blocks (paged KV,
 * Kwon et al. 2023): key t lives in block t / block_size at row t % block_size, and its
 * elements start at (elem *)k_blocks[t / block_size] + head_off + (t % block_size) * row_stride
 * (likewise v). Causal masking is the caller's choice of n_keys.
 *   out[d] = sum_t softmax_t(q . k_t / score_div) * v_t[d]
 * score_div is usually sqrtf(head_dim); dividing, as llama2.c run.c does. Reduction is
 * sequential over t and d, so the result does not depend on how keys are split into blocks.
 * kv_type KILN_DTYPE_F32: f32 rows. KILN_DTYPE_F16: half rows, computed as an f16 matmul
 * pipeline does: q is rounded to f16 before q . k and the softmax probabilities are rounded
 * to f16 before they weight v, with f32 accumulation (llama.cpp's CPU path with its f16 KV
 * cache computes this; FlashAttention-2 likewise casts P to half before P.V).
 * scores: scratch of n_keys floats; q16: scratch of head_dim halves (F16 only).
 */
void kiln_attention_paged(float *out, const float *q, const void *const *k_blocks,
                          const void *const *v_blocks, int32_t block_size, int64_t row_stride,
                          int64_t head_off, int32_t n_keys, int32_t head_dim, float score_div,
                          int kv_is_f16, float *scores, uint16_t *q16);

#endif
