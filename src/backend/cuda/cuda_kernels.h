/*
 * cuda_kernels.h - the CUDA backend's kernel launchers (cuda_rowwise.cu, cuda_matmul.cu,
 * cuda_attention.cu), callable from C: cuda_backend.c maps each operation of the table
 * (backend/backend.h) onto one or two of them. Every launcher enqueues its work on stream s
 * and returns the launch's cudaError_t (cudaSuccess, or why the launch failed; faults inside
 * a kernel surface at the next synchronization). All pointers are device memory.
 *
 * Batch invariance (DESIGN.md principle 3): every kernel computes each output element with a
 * fixed sequence of operations that depends only on that element's own row (token, head) and
 * the shapes of the weights, never on n_tokens, on the grid, or on the other rows of the step:
 * no atomics, no split-K or split-KV whose shape follows the batch. Each launcher's comment
 * states its order. The files are compiled with -fmad=false, so a * b + c is never contracted:
 * the only fused multiply-adds are the explicit fmaf of the reductions.
 */
#ifndef KILN_BACKEND_CUDA_CUDA_KERNELS_H
#define KILN_BACKEND_CUDA_CUDA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Element types of weights and KV pages, as the kernels read them. CU_Q8_0 and CU_Q4_0
 *  (ggml's 32-element blocks, tensor/dtype.h kiln_block_q8_0 / kiln_block_q4_0) are weights
 *  only: the matmuls and the token embedding read them, never the KV pages. */
typedef enum cu_elem { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2, CU_Q8_0 = 3, CU_Q4_0 = 4 } cu_elem;

/** Activation kinds of act / glu: the values of model/config.h kiln_act and of
 *  backend/cpu/ops.h KILN_OP_ACT_* (tests/cuda/test_cuda_ops.c checks that they agree). */
enum { CU_ACT_SILU = 0, CU_ACT_GELU_TANH = 1, CU_ACT_GELU_ERF = 2 };

/** The step as the kernels see it: device copies of the runner's per-token metadata
 *  (cuda_backend.c step_begin uploads them). */
typedef struct cu_step {
    int32_t n_tokens;
    const int32_t *token;     /* [n_tokens] token ids */
    const int32_t *tok_seq;   /* [n_tokens] index of the token's sequence */
    const int32_t *tok_pos;   /* [n_tokens] position */
    const int32_t *seq_table; /* [n_seqs] offset of each sequence's block ids in tables */
    const int32_t *tables;    /* every sequence's block table, concatenated */
} cu_step;

/** One layer's paged KV storage (kv/kv_pool.h): K of block b starts at k + b * region bytes
 *  (likewise V), block_size rows of kv_dim elements of type elem. */
typedef struct cu_kv {
    char *k, *v;
    int64_t region;
    int32_t block_size;
    int64_t kv_dim;
    cu_elem elem;
} cu_kv;

/** x[i, j] = tok[token[i], j] * scale (+ pos[tok_pos[i], j] when pos != NULL), [n, d]: the
 *  CPU's order (convert, multiply when scale != 1, add). */
cudaError_t kiln_cu_embed(cudaStream_t s, float *x, const void *tok, cu_elem tok_elem,
                          const void *pos, cu_elem pos_elem, int64_t d, float scale,
                          const cu_step *st);

/** One weight of kiln_cu_matmul_multi: w row-major [n_out, n_in] of w_elem (Q8_0 / Q4_0: each
 *  row n_in / 32 blocks), y [n_tok, n_out]. */
typedef struct cu_mm_out {
    float *y;
    const void *w;
    cu_elem w_elem;
    int64_t n_out;
} cu_mm_out;

/**
 * y_i[t, o] = sum_k w_i[o, k] x[t, k] for each of the n weights, t < n_tok, o < n_out (x
 * [n_tok, n_in]); consecutive weights of one dtype and load path share a launch (4 at most).
 * With KILN_CUDA_TC=1, f16 / bf16 weights (kiln_cu_matmul_tc_ok) run on the tensor cores (kiln_cu_matmul_tc: x
 * rounded to the weights' type, f32 accumulation, its order there); xh is scratch of
 * xh_bytes for the prefill tile kernel's rounded x (n_tok * n_in * 2 bytes; NULL or too small:
 * the streaming kernel takes every row, the same bits). Otherwise (the default) the
 * CUDA-core kernel, whose order is: when n_in % 8 == 0 and w, x are 16-byte
 * aligned, lane l of the warp owning o sums the 8-element chunks k = 8l + 256j .. +7 in one
 * fmaf chain from +0 in ascending k; otherwise the elements k = l + 32j likewise; then the 32
 * lane sums are added by the xor butterfly (offsets 16, 8, 4, 2, 1). Q8_0 / Q4_0 weights
 * (n_in % 32 == 0) are dequantized in registers, exactly (w = q d, an f32 product of the
 * block's f16 scale d), by cuda_matmul.cu k_matmul_q, whose order is: lane l sums w x over
 * k = 4l + 128g + e (g ascending, e = 0..3) in one fmaf chain from +0; then the same
 * butterfly. Each y[t, o] is that fixed function of row t of x and row o of w, whatever n_tok,
 * the rows a block holds (1, 2, 4 or 8: the decode path is the same kernel), or the other
 * weights of the call.
 */
cudaError_t kiln_cu_matmul_multi(cudaStream_t s, const cu_mm_out *outs, int n, int64_t n_in,
                                 const float *x, int32_t n_tok, void *xh, size_t xh_bytes);

/** y[t, o] += (x W^T)[t, o], the dot in kiln_cu_matmul_multi's order, then one add: the bits of
 *  a matmul into a temporary followed by kiln_cu_add (the residual). y must not overlap x. */
cudaError_t kiln_cu_matmul_add(cudaStream_t s, const cu_mm_out *out, int64_t n_in,
                               const float *x, int32_t n_tok, void *xh, size_t xh_bytes);

/** y[t, o] = act(g) * u with g = (x Wg^T)[t, o], u = (x Wu^T)[t, o] each in
 *  kiln_cu_matmul_multi's order and the glu kernel's arithmetic: the bits of the two matmuls
 *  and kiln_cu_glu. w_gate and w_up are [n_out, n_in] of elem. */
cudaError_t kiln_cu_matmul_glu(cudaStream_t s, float *y, const void *w_gate, const void *w_up,
                               cu_elem elem, int64_t n_out, int64_t n_in, const float *x,
                               int32_t n_tok, int act, void *xh, size_t xh_bytes);

/** Row counts up to this take kiln_cu_matmul_tc's streaming kernel (decode), larger ones its
 *  tile kernel (prefill) when the scratch holds them: the same order, so the same bits. */
#define KILN_CU_TC_STREAM_MAX_TOK 16

/** Whether kiln_cu_matmul_tc takes a weight: KILN_CUDA_TC=1 (opt-in: its streaming kernel is
 *  slower than the CUDA-core kernel at batch-1 decode today), f16 or bf16, n_in % 8 == 0, w
 *  and x 16-byte aligned. */
bool kiln_cu_matmul_tc_ok(cu_elem e, const void *w, int64_t n_in, const float *x);

/**
 * The tensor-core matmul (cuda_matmul_tc.cu; mma.sync m16n8k16, f32 accumulation; issue 16):
 * mode 0 y = x W^T for up to 4 weights of one type (outs), 1 y += x W^T (one weight), 2 the
 * GLU form y = act(x Wg^T) * (x Wu^T) (outs[0] the gate, w_up the up weight). x [n_tok, n_in]
 * f32 is rounded to the weights' type (round to nearest even: PyTorch's bf16 / f16 matmul
 * operands). Order of every y[t, o]: k in groups of 32 from 0 (past n_in +0), each group two
 * m16n8k16 instructions (k0 + 8q + {0..3}, then k0 + 8q + {4..7}, at the instruction's slots
 * 2q, 2q+1, 2q+8, 2q+9), all into one f32 accumulator from +0; row o of w is the A operand,
 * token t the B column: the same for the streaming kernel (n_tok <= KILN_CU_TC_STREAM_MAX_TOK,
 * or no room in xh) and the tile kernel, whatever n_tok, offset or grid.
 */
cudaError_t kiln_cu_matmul_tc(cudaStream_t s, int mode, const cu_mm_out *outs, int n,
                              const void *w_up, int act, int64_t n_in, const float *x,
                              int32_t n_tok, void *xh, size_t xh_bytes);

/** The first milestone's matmul (k = 4l + 128j chunks, 8 warps of one output each), kept
 *  for before/after timings (KILN_CUDA_KERNELS=v1); other bits than kiln_cu_matmul_multi. */
cudaError_t kiln_cu_matmul_v1(cudaStream_t s, const cu_mm_out *outs, int n, int64_t n_in,
                              const float *x, int32_t n_tok);

/** Row norms of n_rows rows of d (kind 0 RMSNorm, 1 LayerNorm; w may be NULL for RMSNorm:
 *  w = 1; b NULL: no bias); out may be x. One block of 256 threads per row: thread t sums
 *  elements t + 256j in order, then a fixed shuffle and shared-memory tree. */
cudaError_t kiln_cu_norm(cudaStream_t s, float *out, const float *x, const float *w,
                         const float *b, int32_t n_rows, int64_t d, int kind, float eps);

/** RMSNorm in place of each head_dim slice of the first n_heads heads of every row (row
 *  stride `stride`); one warp per (row, head), lane sums then the xor butterfly. */
cudaError_t kiln_cu_head_rmsnorm(cudaStream_t s, float *x, int32_t n_rows, int64_t stride,
                                 int32_t n_heads, int32_t head_dim, const float *w, float eps);

/** RoPE in place at each row's position st->tok_pos[row] (ops.h kiln_rope's arithmetic). */
cudaError_t kiln_cu_rope(cudaStream_t s, float *x, int64_t stride, int32_t n_heads,
                         int32_t head_dim, int32_t rot_dim, const float *inv_freq, int adjacent,
                         const cu_step *st);

/** Elementwise operations of the table (backend.h: add_bias, add, act, glu, softcap,
 *  split_heads, gate_sigmoid, gather_rows with device row indices). */
cudaError_t kiln_cu_add_bias(cudaStream_t s, float *y, const float *bias, int32_t n_rows,
                             int64_t dim);
cudaError_t kiln_cu_add(cudaStream_t s, float *y, const float *x, int64_t n);
cudaError_t kiln_cu_act(cudaStream_t s, float *x, int64_t n, int act);
cudaError_t kiln_cu_glu(cudaStream_t s, float *g, const float *u, int64_t n, int act);
cudaError_t kiln_cu_softcap(cudaStream_t s, float *x, int64_t n, float cap);
cudaError_t kiln_cu_split_heads(cudaStream_t s, float *a, float *b, const float *src,
                                int32_t n_rows, int32_t n_heads, int32_t head_dim);
cudaError_t kiln_cu_gate_sigmoid(cudaStream_t s, float *x, const float *gate, int64_t n);
cudaError_t kiln_cu_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows,
                                int32_t n, int64_t d);

/** Write each token's K and V rows ([n_tokens, kv_dim] f32) into its sequence's block at its
 *  position, converted to kv->elem (f16, bf16: round to nearest even). */
cudaError_t kiln_cu_kv_write(cudaStream_t s, const cu_kv *kv, const cu_step *st, const float *k,
                             const float *v);

/** The largest head_dim kiln_cu_attention takes. */
#define KILN_CU_ATTN_MAX_HEAD_DIM 512

/** Keys per split of kiln_cu_attention. */
#define KILN_CU_ATTN_SPLIT 128

/** The most tokens a step may have for kiln_cu_attention's wide form. */
#define KILN_CU_ATTN_WIDE_MAX_TOKENS 64

/** Scratch of kiln_cu_attention's wide form: partials [n_tokens][n_head][s_grid][2 + hd] (at
 *  most part_floats), one arrival counter per (token, KV head, head group) (at most cnt_ints,
 *  zero at creation; each launch leaves them zero), and s_grid splits per token in the grid
 *  (at least the step's largest split count; 0 or part NULL: the loop form). */
typedef struct cu_att_split {
    float *part;
    size_t part_floats;
    int32_t *cnt;
    size_t cnt_ints;
    int32_t s_grid;
} cu_att_split;

/** Floats of cu_att_split.part for n_tokens tokens of n_head heads of head_dim and up to
 *  max_keys keys; ints of cu_att_split.cnt for n_tokens tokens of n_head heads. */
size_t kiln_cu_attention_part_floats(int32_t n_tokens, int32_t n_head, int32_t head_dim,
                                     int32_t max_keys);
size_t kiln_cu_attention_cnt_ints(int32_t n_tokens, int32_t n_head);

/**
 * Causal (optionally windowed) paged attention for every (token, query head) of the step, with
 * the semantics of ops.h kiln_attention_paged (score_div, softcap, the f16/bf16 operand
 * rounding of q and of the probabilities), split over the keys by the token's own key count:
 * a token at position p attends to keys [b, p + 1) (b = 0, or p - window + 1), cut into
 * S = ceil((p + 1 - b) / KILN_CU_ATTN_SPLIT) splits of KILN_CU_ATTN_SPLIT keys from b (the
 * last shorter). Per split and query head: s_t = (q . k_t) / score_div (one fmaf chain over d
 * ascending, q rounded to the page format), softcapped; m = max s_t; p_t = exp(s_t - m);
 * l = sum p_t (lane j of a warp sums keys j + 32i in ascending i, then the xor butterfly);
 * acc[d] = sum over keys ascending of round(p_t) v_t[d] (one fmaf chain). The splits are then
 * folded in ascending order from (M, L, O) = (-inf, 0, 0): M' = max(M, m), O = O e^(M - M') +
 * acc e^(m - M'), L likewise with l; out = O / L. The split shape, the order and so the bits
 * depend only on the token's query and its own sequence's keys, never on the batch, on how
 * many splits the grid holds (sp->s_grid) or on which form runs: the wide form (a block per
 * split, the last to finish folding all, for steps of at most KILN_CU_ATTN_WIDE_MAX_TOKENS
 * tokens whose partials sp's scratch holds) or the loop form
 * (a block per (token, KV head) folding as it goes). sp may be NULL (the loop form).
 * head_dim <= KILN_CU_ATTN_MAX_HEAD_DIM.
 */
cudaError_t kiln_cu_attention(cudaStream_t s, const cu_kv *kv, const cu_step *st, int32_t n_head,
                              int32_t n_head_kv, int32_t head_dim, float score_div, float softcap,
                              int32_t window, const float *q, float *out, const cu_att_split *sp);

/** The first milestone's attention (one warp per (token, head), two passes over all keys),
 *  kept for before/after timings (KILN_CUDA_KERNELS=v1). */
cudaError_t kiln_cu_attention_v1(cudaStream_t s, const cu_kv *kv, const cu_step *st,
                                 int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                 float score_div, float softcap, int32_t window, const float *q,
                                 float *out);

/** RoPE of q (n_head heads, row stride q_stride) and k (n_head_kv heads, stride kv_dim) at each
 *  token's position, then k (rotated) and v written to the token's page row: the bits of
 *  kiln_cu_rope on q and on k followed by kiln_cu_kv_write (k keeps its rotated values). */
cudaError_t kiln_cu_rope_kv(cudaStream_t s, const cu_kv *kv, const cu_step *st, float *q,
                            int64_t q_stride, int32_t n_head, float *k, const float *v,
                            int32_t n_head_kv, int32_t head_dim, int32_t rot_dim,
                            const float *inv_freq, int adjacent);

/** Greedy decoding on the device: ids[r] = the index of the largest finite one of the n_vocab
 *  logits of row r (the lowest among equals, 0 when none is finite: sampler.h kiln_argmax), or
 *  -1 when the row holds a NaN, for n_rows rows. */
cudaError_t kiln_cu_argmax(cudaStream_t s, int32_t *ids, const float *logits, int32_t n_rows,
                           int64_t n_vocab);

#ifdef __cplusplus
}
#endif

#endif
