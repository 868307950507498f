/*
 * backend.h - the table of device operations the model is written over (DESIGN.md
 * "Backends"), and the context every backend hands out. src/backend/README.md is the map.
 *
 * A backend context (kiln_backend) owns the memory the model computes in: buffers
 * (buf_alloc: KV storage, device copies), one scratch arena sized once (arena_reserve, by the
 * runner when an engine is created; activations live there), and the backend's own per-thread
 * or per-stream scratch. Every float pointer an operation takes is backend memory (an arena
 * carve or a buffer) unless its docstring says "host"; on the CPU that is host memory, on a
 * GPU device memory. The model never dereferences such a pointer: it only passes it to
 * operations. Operations run in call order; sync waits for all of them.
 *
 * Batch invariance (DESIGN.md principle 3) is every backend's contract: each output element
 * is reduced in an order that depends only on its own row (token, head, sequence), never on
 * n_tokens, on the other sequences of the step or on the thread count. The CPU backend's
 * kernels document their orders in backend/cpu/cpu.h and backend/cpu/ops.h, the CUDA
 * backend's in backend/cuda/cuda_kernels.h.
 *
 * Layering: this header is the interface (below the KV pool, which allocates through it, and
 * below src/model, which calls it); backends (backend/cpu, backend/cuda) implement it;
 * the runner (backend/runner.h) drives the model over it for one kiln_batch.
 */
#ifndef KILN_BACKEND_BACKEND_H
#define KILN_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "backend/batch.h"
#include "tensor/dtype.h"

typedef struct kiln_kv_pool kiln_kv_pool;         /* kv/kv_pool.h */
typedef struct kiln_mapped_file kiln_mapped_file; /* util/mapped_file.h */

/** Alignment in bytes of every arena carve and buffer a backend hands out. */
#define KILN_BACKEND_ALIGN 64

/** A weight matrix [n_out, n_in] (as W in y = W x), as a backend holds it: layout 0 is n_out
 *  rows of n_in elements of dtype, row-major, row stride kiln_dtype_row_size(dtype, n_in);
 *  other layouts are the backend's own (the CPU backend's are kiln_cpu_layout,
 *  backend/cpu/cpu.h), chosen when the weights are placed (kiln_cpu_place_weights). */
typedef struct kiln_mat {
    const void *data; /* borrowed from a mapping, or owned by the model's placement */
    kiln_dtype dtype;
    int64_t n_out, n_in;
    const char *name; /* for messages */
    int32_t layout;   /* 0: rows as above; else a backend layout id */
} kiln_mat;

/** Layout 0 of kiln_mat: n_out rows of n_in elements as in the file. */
#define KILN_MAT_ROWS 0

/** Allocates `bytes` of zeroed memory that stays valid as long as the weights (the caller
 *  frees it with them), or returns NULL. owner: the caller's context. */
typedef void *(*kiln_placement_alloc_fn)(void *owner, size_t bytes);

/** One output of a fused matmul: y[t * w->n_out + o] = dot(row o of w, x row t). */
typedef struct kiln_mm {
    const kiln_mat *w;
    float *y; /* [n_tok, w->n_out] */
} kiln_mm;

/** Norm kinds of the norm operation (values of kiln_norm_kind in model/config.h). */
enum { KILN_BE_NORM_RMS = 0, KILN_BE_NORM_LAYER = 1 };

/**
 * One step's batch as the backends see it, prepared by the runner from a checked kiln_batch
 * (host memory; a device backend mirrors what it needs in step_begin): per flat token its
 * sequence index and position, and the longest sequence.
 */
typedef struct kiln_step {
    const kiln_batch *b;
    int32_t n_tokens;
    const int32_t *tok_seq; /* [n_tokens] index into b->seqs */
    const int32_t *tok_pos; /* [n_tokens] position n_past + j */
    int32_t max_keys;       /* max over sequences of n_past + n_new */
    /* Nonzero: the runner vouches that every step with this key issues the same operations
     * with the same arguments (buffers, shapes, row lists of the same length), differing only
     * in the metadata step_begin takes (tokens, positions, block tables, the out rows' values):
     * a backend may record the step's operations once and replay them (CUDA graphs). 0: no
     * such promise (prefill chunks, mixed steps). */
    uint64_t graph_key;
} kiln_step;

/** Shapes a backend sizes its scratch for (arena_reserve). */
typedef struct kiln_backend_reserve {
    size_t act_bytes;                    /* the model's activations for max_tokens */
    int32_t max_tokens;                  /* flat tokens per step */
    int32_t max_keys;                    /* positions per sequence (attention scratch) */
    int32_t n_head, n_head_kv, head_dim; /* attention geometry (0: no attention layers) */
    int32_t gdn_head_dim;                /* max(k, v) head dim of delta-net layers; 0: none */
} kiln_backend_reserve;

/** Attention of one layer over the paged KV (attention op). */
typedef struct kiln_attn_params {
    int32_t layer;
    int32_t n_head, n_head_kv, head_dim;
    float score_div; /* scores are q . k / score_div */
    float softcap;   /* > 0: s = softcap * tanh(s / softcap) before the softmax */
    int32_t window;  /* > 0: a token at position p attends to (p - window, p] only */
} kiln_attn_params;

/** One gated-delta-net layer (Yang et al. 2024, "Gated Delta Networks"; transformers'
 *  Qwen3NextGatedDeltaNet): shapes and the small weights the step reads. */
typedef struct kiln_gdn_params {
    int32_t n_k_heads, n_v_heads, k_head_dim, v_head_dim, conv_kernel;
    float norm_eps;
    const float *conv;    /* [conv_dim, conv_kernel], conv_dim = 2 * key_dim + value_dim */
    const float *a_log;   /* [n_v_heads] */
    const float *dt_bias; /* [n_v_heads] */
    const float *norm;    /* [v_head_dim] gated RMSNorm weight */
    int64_t state_off;    /* this layer's offset in a sequence's rec_state (floats) */
} kiln_gdn_params;

/** Which backend kiln_backend_create makes (the kind field of its operations table). */
typedef enum kiln_backend_kind {
    KILN_BACKEND_CPU = 0,
    KILN_BACKEND_CUDA = 1, /* NVIDIA GPUs (backend/cuda; built when CMake finds nvcc) */
} kiln_backend_kind;

/** An f32 vector the forward pass reads (a norm weight, a bias, a RoPE table): the address of
 *  the model's pointer to it, and its length in floats (place_device). */
typedef struct kiln_vec_ref {
    const float **p;
    int64_t n;
} kiln_vec_ref;

typedef struct kiln_backend kiln_backend;

/**
 * The operations. Shapes are in elements; "rows" are flat batch tokens unless said
 * otherwise. None fails: a backend checks what can fail in step_begin / arena_reserve.
 * A backend may leave the expert (moe_*) and delta-net (gdn_*) entries NULL when it has no
 * such kernels: the runner then refuses models that need them (KILN_ERR_UNSUPPORTED) when it
 * is created, before any step.
 */
typedef struct kiln_backend_ops {
    const char *name; /* "cpu", "cuda" */
    kiln_backend_kind kind;
    bool host_memory; /* backend memory is host memory: host pointers may be passed to the
                         operations directly (the runner then skips the logits download) */

    /** Place a model's weight matrices for this backend, once, at load (no context: every
     *  context of the backend shares them). mats[0 .. n_mats) are the matrices the forward
     *  pass multiplies by (NULL entries skipped), maps the file mappings they were bound in
     *  (whose pages may be released), alloc the model's owned memory. A matrix that cannot be
     *  placed stays as it is, so this never fails. The CPU's: backend/cpu/placement.c. */
    void (*place_weights)(kiln_mat *const *mats, size_t n_mats,
                          const kiln_mapped_file *const *maps, size_t n_maps,
                          kiln_placement_alloc_fn alloc, void *owner);
    /** Placement of a backend whose memory is not host memory (NULL for the CPU, which uses
     *  place_weights): copy everything the forward pass reads into the memory of device
     *  `device` and point the model's handles at the copies: the matrices mats[0 .. n_mats)
     *  (matmul weights and the embedding tables read by row; NULL entries and entries without
     *  data are skipped; entries sharing host data, such as a tied output head, share one
     *  copy) and the f32 vectors vecs[0 .. n_vecs) (entries whose pointer is NULL skipped).
     *  On success *handle owns the copies (release_weights frees them); on failure nothing
     *  has changed. Errors: KILN_ERR_INVALID_ARGUMENT (no such device), KILN_ERR_UNSUPPORTED
     *  (a matrix dtype or layout the backend cannot multiply, named), KILN_ERR_OUT_OF_MEMORY
     *  (the message gives the bytes needed and free). */
    kiln_status (*place_device)(int32_t device, kiln_mat *const *mats, size_t n_mats,
                                const kiln_vec_ref *vecs, size_t n_vecs, void **handle,
                                kiln_error *err);
    /** Free what place_device made (NULL is a no-op); the model's handles then dangle. */
    void (*release_weights)(void *handle);

    /* ---- context ---- */
    void (*destroy)(kiln_backend *be);
    /** Backend memory of `bytes` (KILN_BACKEND_ALIGN-aligned, contents unspecified).
     *  Errors: KILN_ERR_OUT_OF_MEMORY (message gives the bytes). */
    kiln_status (*buf_alloc)(kiln_backend *be, size_t bytes, void **out, kiln_error *err);
    void (*buf_free)(kiln_backend *be, void *buf); /* NULL is a no-op */
    /** Copy host -> backend memory and backend -> host (ordered after earlier ops). */
    void (*upload)(kiln_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(kiln_backend *be, void *dst_host, const void *src, size_t bytes);
    /** Size the scratch arena and the backend's own scratch for these shapes; grows only
     *  (a smaller reservation keeps what is there). Errors: KILN_ERR_OUT_OF_MEMORY. */
    kiln_status (*arena_reserve)(kiln_backend *be, const kiln_backend_reserve *r, kiln_error *err);
    /** Base of the arena (reserve.act_bytes usable bytes), KILN_BACKEND_ALIGN-aligned. */
    void *(*arena)(kiln_backend *be);
    /** Wait for every operation issued so far. */
    void (*sync)(kiln_backend *be);
    /** What decides this context's bits beyond the weights and the inputs (kernel paths,
     *  activation rounding), as a short NUL-terminated string into buf[n]: KV computed under
     *  two contexts with the same string is bitwise the same, so the prefix cache (kv/) keys
     *  its blocks by it and never mixes blocks of another kernel path. */
    void (*numerics)(const kiln_backend *be, char *buf, size_t n);

    /* ---- the step ---- */
    /** Take the step's metadata (the backend keeps the pointer until the step's last
     *  operation) and make per-step decisions (the CPU backend: how attention work is dealt,
     *  the block pointer lists). The step must fit the reservation (max_tokens, max_keys).
     *  Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INVALID_ARGUMENT (over the reservation). */
    kiln_status (*step_begin)(kiln_backend *be, const kiln_step *st, kiln_error *err);

    /* ---- operations ---- */
    /** x[i] = embed(b->token[i]) * scale (+ pos_embd(tok_pos[i]) when pos_embd != NULL),
     *  [n_tokens, n_embd]; scratch: [n_tokens, n_embd] backend memory for the position row. */
    void (*embed)(kiln_backend *be, float *x, float *scratch, const kiln_mat *tok_embd,
                  const kiln_mat *pos_embd, float scale, const kiln_step *st);
    /** y_i = x w_i^T for n_out weights of the same n_in, x [n_tok, n_in]; one pass over x
     *  (bit-identical to each weight alone). n_out <= 4 per call is the fused case. */
    void (*matmul)(kiln_backend *be, const kiln_mm *outs, int n_outs, const float *x,
                   int32_t n_tok);
    /** out row i = norm(x row i) * w (+ b), n_rows x d; kind KILN_BE_NORM_*; out may be x.
     *  RMSNorm: Zhang & Sennrich 2019; LayerNorm: Ba et al. 2016 (biased variance). */
    void (*norm)(kiln_backend *be, float *out, const float *x, const float *w, const float *b,
                 int32_t n_rows, int64_t d, int kind, float eps);
    /** RMSNorm in place of every head_dim slice of the first n_heads * head_dim elements of
     *  each row (row stride `stride`): Qwen3's q/k norm. */
    void (*head_rmsnorm)(kiln_backend *be, float *x, int32_t n_rows, int64_t stride,
                         int32_t n_heads, int32_t head_dim, const float *w, float eps);
    /** RoPE in place (Su et al. 2021) on n_heads heads of each row (stride `stride`) at
     *  position st->tok_pos[row]; rot_dim of head_dim rotated; adjacent pairs (llama2.c) or
     *  rotate_half (transformers). */
    void (*rope)(kiln_backend *be, float *x, int64_t stride, int32_t n_heads, int32_t head_dim,
                 int32_t rot_dim, const float *inv_freq, int adjacent, const kiln_step *st);
    /** y[i, j] += bias[j] for n_rows x dim; bias NULL is a no-op. */
    void (*add_bias)(kiln_backend *be, float *y, const float *bias, int32_t n_rows, int64_t dim);
    /** y[i] += x[i] for i < n (the residual). */
    void (*add)(kiln_backend *be, float *y, const float *x, int64_t n);
    /** x[i] = act(x[i]) (kind: backend/cpu/ops.h KILN_OP_ACT_*). */
    void (*act)(kiln_backend *be, float *x, int64_t n, int act);
    /** g[i] = act(g[i]) * u[i] (Shazeer 2020, GLU variants). */
    void (*glu)(kiln_backend *be, float *g, const float *u, int64_t n, int act);
    /** x[i] = cap * tanh(x[i] / cap) (Gemma 2's final softcap). */
    void (*softcap)(kiln_backend *be, float *x, int64_t n, float cap);
    /** Per row and head h: a[h] = src[h][0, hd), b[h] = src[h][hd, 2 hd) (src rows of
     *  n_heads * 2 * head_dim, a and b rows of n_heads * head_dim): Qwen3-Next's [q | gate]. */
    void (*split_heads)(kiln_backend *be, float *a, float *b, const float *src, int32_t n_rows,
                        int32_t n_heads, int32_t head_dim);
    /** x[i] = x[i] * sigmoid(gate[i]) (the attention output gate). */
    void (*gate_sigmoid)(kiln_backend *be, float *x, const float *gate, int64_t n);
    /** x[i] = +0 for i < n. */
    void (*zero)(kiln_backend *be, float *x, int64_t n);
    /** dst[i] = src[i] for i < n (backend memory both; no overlap). */
    void (*copy)(kiln_backend *be, float *dst, const float *src, int64_t n);
    /** Rows src[rows[r]] -> dst[r], d elements each (logits rows, MoE gathers). */
    void (*gather_rows)(kiln_backend *be, float *dst, const float *src, const int32_t *rows_host,
                        int32_t n, int64_t d);

    /* ---- fused forms (optional): NULL, and the model issues the plain sequence named;
     *      a backend that provides one gives exactly that sequence's bits ---- */
    /** y[t, o] += (x w^T)[t, o] for n_tok rows: matmul into a temporary, then add (the
     *  residual); y [n_tok, w->n_out] does not overlap x. */
    void (*matmul_add)(kiln_backend *be, const kiln_mat *w, const float *x, int32_t n_tok,
                       float *y);
    /** g = act(x wg^T) * (x wu^T), [n_tok, wg->n_out]: matmul of wg into g and of wu into u,
     *  then glu(g, u) (wg and wu of one shape and dtype). */
    void (*matmul_glu)(kiln_backend *be, const kiln_mat *wg, const kiln_mat *wu, const float *x,
                       int32_t n_tok, int act, float *g);
    /** rope(q, q_stride, n_head, ...), rope(k, kv_dim, n_head_kv, ...), then
     *  kv_write(pool, layer, st, k, v) (k [n_tokens, n_head_kv * head_dim]). */
    void (*rope_kv_write)(kiln_backend *be, kiln_kv_pool *pool, int32_t layer, const kiln_step *st,
                          float *q, int64_t q_stride, int32_t n_head, float *k, const float *v,
                          int32_t n_head_kv, int32_t head_dim, int32_t rot_dim,
                          const float *inv_freq, int adjacent);

    /** Greedy decoding on the device (optional; NULL: the runner takes the argmax of the
     *  downloaded logits): ids_host[r] = the index of the largest finite value of row r of
     *  logits [n_rows, n_vocab] (the lowest index among equals, 0 when none is finite: sampler.h
     *  kiln_argmax), or -1 when the row holds a NaN. Ordered after the earlier operations; the
     *  ids are in host memory when it returns (only they are copied). */
    void (*argmax)(kiln_backend *be, int32_t *ids_host, const float *logits, int32_t n_rows,
                   int64_t n_vocab);

    /* ---- KV and attention ---- */
    /** Write each token's K and V rows ([n_tokens, kv_dim] f32) into its sequence's block at
     *  its position, converted to the block's page format (kv/kv_format.h). */
    void (*kv_write)(kiln_backend *be, kiln_kv_pool *pool, int32_t layer, const kiln_step *st,
                     const float *k, const float *v);
    /** out = causal (optionally windowed) softmax(q K^T / score_div) V for every token of the
     *  step over its own sequence's pages (Kwon et al. 2023, PagedAttention), q and out
     *  [n_tokens, n_head * head_dim], grouped-query heads sharing KV heads. */
    void (*attention)(kiln_backend *be, kiln_kv_pool *pool, const kiln_attn_params *p,
                      const kiln_step *st, const float *q, float *out);

    /* ---- mixture of experts (Mixtral, Qwen3-MoE routers) ---- */
    /** Per row: softmax over E router logits (in place in probs), top-k by probability (ties:
     *  lower id) into sel [n_rows, k] (host) and their probabilities into wt [n_rows, k],
     *  renormalised to sum 1 when renorm. */
    void (*moe_route)(kiln_backend *be, float *probs, int32_t *sel_host, float *wt_host,
                      int32_t n_rows, int32_t n_expert, int32_t k, bool renorm);
    /** Gather the rows routed to `expert` (ascending row, then slot) into xe [m, d]; erow[r] =
     *  row * k + slot of gathered row r (host). Returns m. */
    int32_t (*moe_gather)(kiln_backend *be, float *xe, int32_t *erow_host, const float *x,
                          const int32_t *sel_host, int32_t n_rows, int32_t k, int64_t d,
                          int32_t expert);
    /** acc[erow[r] / k] += y[r] * wt[erow[r]] for r < m, element by element. */
    void (*moe_scatter)(kiln_backend *be, float *acc, const float *y, const int32_t *erow_host,
                        const float *wt_host, int32_t m, int32_t k, int64_t d);
    /** o[i] = acc[i] + g_i * y[i] per row, g_i = sigmoid(gate_logit[i]) or 1 when NULL: the
     *  shared expert's contribution. */
    void (*moe_shared)(kiln_backend *be, float *o, const float *acc, const float *y,
                       const float *gate_logit, int32_t n_rows, int64_t d);

    /* ---- gated delta net (Qwen3-Next linear attention) ---- */
    /** The causal depthwise conv over the [q | k | v] channels of proj (rows of
     *  2 key_dim + 2 value_dim, grouped per key head), then silu, into c [n_tokens, conv_dim];
     *  advances each sequence's conv window in rec_state. */
    void (*gdn_conv)(kiln_backend *be, float *c, const float *proj, const kiln_gdn_params *p,
                     const kiln_step *st);
    /** The delta rule and gated RMSNorm per (sequence, value head) along its tokens into out
     *  [n_tokens, value_dim]; reads c (gdn_conv), proj (z) and ba [n_tokens, 2 n_v_heads]. */
    void (*gdn_rule)(kiln_backend *be, float *out, const float *c, const float *proj,
                     const float *ba, const kiln_gdn_params *p, const kiln_step *st);
} kiln_backend_ops;

/** Every backend context starts with this (implementations embed it first). */
struct kiln_backend {
    const kiln_backend_ops *ops;
    int32_t device; /* the device ordinal of a device backend (0 on the CPU) */
};

typedef struct kiln_backend_params {
    kiln_backend_kind kind;
    int32_t n_threads; /* CPU: compute threads including the caller, >= 1 (1: no pool) */
    int32_t device;    /* CUDA: the GPU ordinal, [0, kiln_backend_device_count(kind)) */
} kiln_backend_params;

/**
 * Create a backend context (backend/registry.c). Errors: KILN_ERR_INVALID_ARGUMENT (kind
 * unknown, n_threads out of [1, 512], no such device), KILN_ERR_UNSUPPORTED (CUDA in a build
 * without it), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (threads, a CUDA stream).
 */
kiln_status kiln_backend_create(const kiln_backend_params *p, kiln_backend **out, kiln_error *err);

/** The operations table of a kind (backend/registry.c), or NULL for an unknown kind or one
 *  this build does not include (CUDA without nvcc). */
const kiln_backend_ops *kiln_backend_ops_of(kiln_backend_kind kind);

/** Devices of a kind this build and machine can run on: 1 for the CPU; for CUDA the GPUs the
 *  driver reports (0 without a driver or a GPU, or in a build without CUDA). */
int32_t kiln_backend_device_count(kiln_backend_kind kind);

/** Free and total bytes of device `device` of `kind` (CUDA: cudaMemGetInfo). Errors:
 *  KILN_ERR_INVALID_ARGUMENT (the CPU, or no such device), KILN_ERR_INTERNAL. */
kiln_status kiln_backend_device_memory(kiln_backend_kind kind, int32_t device, int64_t *free_b,
                                       int64_t *total_b, kiln_error *err);

/** Destroy a context and everything it owns. NULL is a no-op. */
void kiln_backend_destroy(kiln_backend *be);

#endif
