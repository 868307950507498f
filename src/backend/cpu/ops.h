/*
 * ops.h - row-wise CPU operations of the transformer block: RMSNorm, LayerNorm, RoPE, gated
 * and plain activations, softmax, softcapping and attention over paged KV. Every function
 * reduces in a fixed order that depends only on its own row, so results are independent of
 * batch composition (DESIGN.md principle 3).
 *
 * kiln_rmsnorm, kiln_swiglu (and kiln_glu with SiLU) and kiln_attention_group run SIMD code
 * on the AVX-512 path (kiln_simd_active(); ops_avx512.c), kiln_attention_group also on the
 * AVX2 path (attention_avx2.c, bitwise the reference); the *_ref functions are the scalar
 * references they are tested against (tests/cpu/test_ops_paths.c). The SIMD versions sum in
 * another fixed order and use their own exp (~2 ulp), so they agree with the references to
 * float rounding, not bitwise; each is still a fixed function of its own row.
 */
#ifndef KILN_BACKEND_CPU_OPS_H
#define KILN_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/**
 * RMSNorm of one row: out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)).
 * Source: Zhang & Sennrich 2019; order of operations as llama2.c run.c rmsnorm (sum of
 * squares in f32, then 1/sqrtf). out may alias x. n >= 1. w == NULL means w = 1.
 * (Gemma's (1 + w) form is obtained by passing 1 + w, computed once at load time.)
 */
void kiln_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/** Scalar reference of kiln_rmsnorm (sum of squares left to right). */
void kiln_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps);

/**
 * LayerNorm of one row (Ba et al. 2016; torch.nn.LayerNorm with biased variance):
 * out[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i], mean and var computed in two
 * passes left to right. out may alias x. n >= 1. b may be NULL (no bias).
 */
void kiln_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n,
                    float eps);

/** L2 normalisation in place: x[i] *= 1 / sqrt(sum(x^2) + eps) (the flash-linear-attention
 *  l2norm that transformers' Qwen3-Next applies to q and k). */
void kiln_l2norm(float *x, int64_t n, float eps);

/**
 * Rotate one token's heads in place: x holds n_heads vectors of head_dim floats, of which the
 * first rot_dim (even, <= head_dim) are rotated and the rest pass through (partial rotary,
 * as transformers' apply_rotary_pos_emb with rotary_dim = cos.shape[-1]).
 * For pair j (j < rot_dim/2) the angle is pos * inv_freq[j].
 * adjacent_pairs != 0 rotates (x[2j], x[2j+1]) (llama2.c run.c, llama.cpp ROPE_TYPE_NORM);
 * otherwise (x[j], x[j + rot_dim/2]) (transformers rotate_half). Source: Su et al. 2021,
 * "RoFormer: Enhanced Transformer with Rotary Position Embedding".
 */
void kiln_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t rot_dim, int32_t pos,
               const float *inv_freq, int adjacent_pairs);

/** Activation kinds for kiln_act_apply / kiln_glu (values of kiln_act in model/config.h). */
enum { KILN_OP_ACT_SILU = 0, KILN_OP_ACT_GELU_TANH = 1, KILN_OP_ACT_GELU_ERF = 2 };

/** One activation value: silu(v) = v / (1 + exp(-v)); gelu_tanh(v) = 0.5 v (1 + tanh(
 *  sqrt(2/pi) (v + 0.044715 v^3))) (Hendrycks & Gimpel 2016, torch gelu approximate="tanh");
 *  gelu_erf(v) = 0.5 v (1 + erf(v / sqrt(2))). */
float kiln_act_value(float v, int act);

/** x[i] = act(x[i]) for i < n. */
void kiln_act_apply(float *x, int64_t n, int act);

/** Gated linear unit in place: g[i] = act(g[i]) * u[i] (Shazeer 2020, "GLU Variants Improve
 *  Transformer": SwiGLU with silu, GeGLU with gelu). */
void kiln_glu(float *g, const float *u, int64_t n, int act);

/** SwiGLU in place: g[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)) (Shazeer 2020). */
void kiln_swiglu(float *g, const float *u, int64_t n);
/** Scalar reference of kiln_swiglu (libm expf). */
void kiln_swiglu_ref(float *g, const float *u, int64_t n);

/** Softmax in place over n >= 1 values, max-subtracted, summed left to right. */
void kiln_softmax(float *x, int64_t n);

/** Soft capping in place (Gemma 2): x[i] = cap * tanh(x[i] / cap); cap > 0. */
void kiln_softcap(float *x, int64_t n, float cap);

/**
 * Attention of one query head over the cached positions [key_begin, n_keys) stored in blocks
 * (paged KV, Kwon et al. 2023): key t lives in block t / block_size at row t % block_size,
 * and its elements start at (elem *)k_blocks[t / block_size] + head_off +
 * (t % block_size) * row_stride (likewise v). Causal masking and sliding windows are the
 * caller's choice of key_begin and n_keys (a window W at position p: key_begin =
 * max(0, p - W + 1), n_keys = p + 1). Only the blocks holding [key_begin, n_keys) are read.
 *   s_t = q . k_t / score_div;   if softcap > 0: s_t = softcap * tanh(s_t / softcap)
 *   out[d] = sum_t softmax_t(s) * v_t[d]
 * score_div is usually sqrtf(head_dim); dividing, as llama2.c run.c does. Reduction is
 * sequential over t and d, so the result does not depend on how keys are split into blocks.
 * operand (kv/kv_format.h kiln_kv_operand): 0 f32 rows. 1 f16 rows, computed as an f16
 * matmul pipeline does: q is rounded to f16 before q . k and the softmax probabilities are
 * rounded to f16 before they weight v, with f32 accumulation (llama.cpp's CPU path with its
 * f16 KV cache computes this; FlashAttention-2 likewise casts P to half before P.V). 2 bf16
 * rows, the same pipeline with bf16 rounding (round to nearest even) of q and P.
 * scores: scratch of n_keys - key_begin floats; q_round: scratch of head_dim floats.
 * Requires 0 <= key_begin < n_keys.
 * This is the scalar reference; the forward pass uses kiln_attention_group.
 */
void kiln_attention_paged(float *out, const float *q, const void *const *k_blocks,
                          const void *const *v_blocks, int32_t block_size, int64_t row_stride,
                          int64_t head_off, int32_t key_begin, int32_t n_keys, int32_t head_dim,
                          float score_div, float softcap, int operand, float *scores,
                          float *q_round);

/** Paged K/V of one KV head (see kiln_attention_paged for the addressing of plain rows). */
typedef struct kiln_attn_kv {
    const void *const *k_blocks, *const *v_blocks; /* per block of block_size positions */
    int32_t block_size;
    int64_t row_stride; /* elements from one position's row to the next (kv_dim) */
    int64_t head_off;   /* elements from a row's start to this head's head_dim elements */
    int32_t head_dim;
    int operand; /* without k_fmt: plain rows of this kv/kv_format.h kiln_kv_operand: 0 f32,
                    1 f16, 2 bf16, K and V alike */
    /* Per-block formats (kiln_dtype ids of kv/kv_format.h, one per entry of k_blocks /
     * v_blocks), or NULL: plain rows of `operand`. With them, a row of format f takes
     * kiln_kv_format_row_bytes(f, row_stride) bytes, position t's row starts at
     * (char *)blocks[t / block_size] + (t % block_size) * row_bytes, and this head's elements
     * are elements head_off .. head_off + head_dim - 1 of that row (a q8_0 / q4_0 block of 32
     * may hold several heads, or a head may start inside a block). q is rounded to the K
     * blocks' operand and p to the V blocks' (kv_format.h "Operand semantics"); every K block
     * the call reads must share one operand, and every V block one. */
    const uint8_t *k_fmt, *v_fmt;
} kiln_attn_kv;

/**
 * The scalar reference over a kiln_attn_kv (plain or per-block formats): kiln_attention_paged's
 * semantics, each element read through its format's traits (kv_format.h dot / axpy: sums left
 * to right in f32), q rounded to the K operand and p to the V operand. scores: n_keys -
 * key_begin floats; q_round: head_dim floats.
 */
void kiln_attention_paged_kv(float *out, const float *q, const kiln_attn_kv *kv, int32_t key_begin,
                             int32_t n_keys, float score_div, float softcap, float *scores,
                             float *q_round);

/** Scratch floats kiln_attention_group needs for n_tok tokens, G heads, keys below max_keys. */
size_t kiln_attention_group_scratch(int32_t n_tok, int32_t G, int32_t head_dim, int32_t max_keys);

/**
 * Attention of n_tok query tokens of one sequence for the G query heads that share one KV
 * head (grouped-query attention; G = 1 for plain multi-head): token i, head h reads its query
 * at q + i * q_stride + h * head_dim and writes out + i * out_stride + h * head_dim, attending
 * over keys [begin[i], end[i]) (0 <= begin[i] < end[i]; begin and end non-decreasing in i, as
 * for consecutive positions of one sequence under a causal mask and an optional window),
 * with the semantics of kiln_attention_paged (score_div, softcap, f16/bf16 operand rounding).
 * scratch: kiln_attention_group_scratch(n_tok, G, head_dim, max(end)) floats, 64-byte aligned.
 *
 * AVX-512 path (ops_avx512.c): keys in chunks of 16 at absolute positions, each chunk's K
 * transposed once and shared by all rows; per (token, head) row the order is fixed: q . k_t
 * as one FMA chain over d from +0, softmax max / exp / sum with lanes t % 16 then the hsum16
 * tree, out[d] one FMA chain over t ascending. So every output is bit-identical whatever
 * n_tok, G, the block size, or which other tokens share the call (DESIGN.md principle 3).
 * Per-block formats (kiln_attn_kv.k_fmt): each row is read in its format (q8_0 / q4_0
 * elements formed exactly in registers, no dequantized copy), in the same order.
 * AVX2 path (attention_avx2.c): bitwise equal to the scalar reference, the same formats read
 * in place (keys in chunks of 8, transposed once and shared by all rows; the reference's
 * separate multiplies and adds in its order, its libm expf and left-to-right softmax sum).
 * Scalar path: the reference per (token, head) (kiln_attention_paged, or
 * kiln_attention_paged_kv with per-block formats). AVX-512 path: head_dim <= 512 (larger heads
 * run the reference).
 */
void kiln_attention_group(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                          int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                          const kiln_attn_kv *kv, float score_div, float softcap, float *scratch);

#endif
