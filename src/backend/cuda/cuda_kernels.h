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

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Element types of weights and KV pages, as the kernels read them. */
typedef enum cu_elem { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2 } cu_elem;

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

/** One weight of kiln_cu_matmul_multi: w row-major [n_out, n_in] of w_elem, y [n_tok, n_out]. */
typedef struct cu_mm_out {
    float *y;
    const void *w;
    cu_elem w_elem;
    int64_t n_out;
} cu_mm_out;

/**
 * y_i[t, o] = sum_k w_i[o, k] x[t, k] for each of the n weights, t < n_tok, o < n_out (x
 * [n_tok, n_in]); consecutive weights of one dtype and load path share a launch (4 at most).
 * One warp per output o and up to 8 rows t: lane l sums its k (k = 4l + 128j .. +3 when
 * n_in % 4 == 0 and w, x are 16-byte aligned, else k = l + 32j) with one fmaf chain from +0 in
 * ascending k, then the 32 lane sums are added by the xor-butterfly (offsets 16, 8, 4, 2, 1).
 * Each y[t, o] is that fixed function of row t of x and row o of w, whatever n_tok, the tiling
 * of rows or the other weights of the call.
 */
cudaError_t kiln_cu_matmul_multi(cudaStream_t s, const cu_mm_out *outs, int n, int64_t n_in,
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

/**
 * Causal (optionally windowed) paged attention for every (token, query head) of the step, with
 * the semantics of ops.h kiln_attention_paged (score_div, softcap, the f16/bf16 operand
 * rounding of q and of the probabilities). One warp per (token, head), two passes over the
 * keys [begin, pos + 1): pass 1, lane l takes keys begin + l + 32j, each score one fmaf chain
 * over d ascending, keeping a running max and rescaled sum; the lanes' (max, sum) pairs merge
 * by the xor butterfly; pass 2 recomputes the scores, p = exp(s - max) / sum rounded to the
 * operand, and each lane accumulates its dims d = l + 32c over the keys in ascending order
 * (one fmaf chain each). Every output depends only on its token's query and its sequence's
 * keys, whatever else shares the step. head_dim <= KILN_CU_ATTN_MAX_HEAD_DIM.
 */
cudaError_t kiln_cu_attention(cudaStream_t s, const cu_kv *kv, const cu_step *st, int32_t n_head,
                              int32_t n_head_kv, int32_t head_dim, float score_div, float softcap,
                              int32_t window, const float *q, float *out);

#ifdef __cplusplus
}
#endif

#endif
