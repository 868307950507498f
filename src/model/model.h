/*
 * model.h - a loaded model of one of the supported families (config.h): config, weight
 * views into the mapped file(s) or, for the matrices, into owned huge-page copies made at load
 * (kiln_model_open), the tokenizer, and the forward pass of the one configurable transformer
 * block.
 */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "backend/cpu/cpu.h"
#include "kv/kv_pool.h"
#include "model/batch.h"
#include "model/config.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"
#include "util/threadpool.h"

/** A weight matrix [n_out, n_in] (as W in y = W x): rows of n_in elements (row-major), or,
 *  for F16 weights after loading, the CPU backend's packed layout (layout). */
typedef struct kiln_mat {
    const void *data; /* borrowed from a mapping or owned by the model */
    kiln_dtype dtype;
    int64_t n_out, n_in;
    const char *name;       /* for messages */
    kiln_cpu_layout layout; /* KILN_LAYOUT_ROWS, or KILN_LAYOUT_F16_R64 (backend/cpu/cpu.h) */
} kiln_mat;

/** Weights of one layer. Pointers that a configuration does not use are NULL / zero. Norm
 *  vectors are f32 with any (1 + w) offset already applied. */
typedef struct kiln_layer_weights {
    const float *attn_norm, *attn_norm_b;        /* [n_embd]; _b: LayerNorm bias */
    const float *ffn_norm, *ffn_norm_b;          /* [n_embd] */
    const float *post_attn_norm, *post_ffn_norm; /* [n_embd], sandwich norms */
    /* attention: wq [n_head*hd (x2 with the output gate, per head [q | gate]), n_embd],
     * wk/wv [n_kv*hd, n_embd], wo [n_embd, n_head*hd] */
    kiln_mat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;
    const float *q_norm, *k_norm; /* [head_dim] */
    /* dense FFN: GLU down(act(gate x) * up x), or MLP down(act(up x + b_up)) + b_down */
    kiln_mat w_gate, w_up, w_down; /* [n_ff, n_embd] x2, [n_embd, n_ff] */
    const float *b_up, *b_down;
    /* MoE FFN */
    kiln_mat w_router;                         /* [n_expert, n_embd] */
    kiln_mat *exp_gate, *exp_up, *exp_down;    /* [n_expert] each: [n_ff_expert, n_embd] x2,
                                                  [n_embd, n_ff_expert] */
    kiln_mat shexp_gate, shexp_up, shexp_down; /* shared expert (n_ff_shexp) */
    kiln_mat shexp_router;                     /* [1, n_embd] sigmoid gate of the shared expert */
    /* gated delta net */
    kiln_mat ssm_in_qkvz;     /* [2*key_dim + 2*value_dim, n_embd], grouped per key head */
    kiln_mat ssm_in_ba;       /* [2*n_v_heads, n_embd], grouped per key head */
    kiln_mat ssm_out;         /* [n_embd, value_dim] */
    const float *ssm_conv;    /* [conv_dim, conv_kernel] depthwise causal conv weights */
    const float *ssm_a_log;   /* [n_v_heads] */
    const float *ssm_dt_bias; /* [n_v_heads] */
    const float *ssm_norm;    /* [v_head_dim] gated RMSNorm weight */
    const float *inv_freq;    /* the RoPE table this layer uses ([rope_dim/2]) */
    int64_t state_off;        /* offset of this layer's recurrent state in a sequence state */
} kiln_layer_weights;

/** Sampling defaults a checkpoint ships (transformers' generation_config.json); a field
 *  applies only when its has_ flag is set. do_sample = false means greedy. */
typedef struct kiln_gen_defaults {
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty, has_do_sample;
    float temperature, top_p, min_p, repetition_penalty;
    int32_t top_k;
    bool do_sample;
} kiln_gen_defaults;

typedef struct kiln_model {
    kiln_model_config cfg;
    char *path;
    kiln_mat tok_embd;                        /* [n_vocab, n_embd] */
    kiln_mat pos_embd;                        /* [n_ctx_train, n_embd] learned positions (GPT-2) */
    const float *output_norm, *output_norm_b; /* [n_embd] */
    kiln_mat output;                          /* [n_vocab, n_embd]; tok_embd when tied */
    kiln_layer_weights *layers;
    float *inv_freq;           /* [rope_dim/2] RoPE inverse frequencies, scaling applied */
    float *inv_freq_local;     /* [rope_dim/2] for layers with rope_local (Gemma 3) */
    int64_t state_floats;      /* per-sequence recurrent state size (0: none) */
    kiln_tokenizer *tokenizer; /* may be NULL (HF dirs without tokenizer) */
    kiln_gen_defaults gen;     /* generation_config.json sampling defaults (HF dirs) */
    /* sources, owned */
    void *gguf, *llama2c, *safetensors;
    void **owned;
    int32_t n_owned;
} kiln_model;

typedef struct kiln_model_load_params {
    const char *tokenizer_path; /* llama2.c tokenizer.bin; NULL = look beside the model */
    bool require_tokenizer;     /* fail when no tokenizer can be found */
    bool keep_file_layout;      /* weights stay mapped as in the file (no forward pass) */
} kiln_model_load_params;

/**
 * Load a model from a GGUF file, a llama2.c checkpoint, or a Hugging Face directory
 * (config.json + model.safetensors or a sharded index). Weights are memory-mapped, then:
 * norm vectors stored in f16/bf16 are converted to f32 copies; transposed (GPT-2 Conv1D)
 * matrices are copied in the row layout; and the matrices the forward pass multiplies by are
 * moved into owned memory with transparent huge pages, F16 ones packed into the CPU
 * backend's KILN_LAYOUT_F16_R64 (backend/cpu/cpu.h), the others copied as they are (the
 * mapped pages of each source are released), unless env KILN_REPACK=0,
 * params->keep_file_layout, or the copies would exceed 3/4 of MemAvailable; a matrix whose
 * copy cannot be allocated stays mapped.
 * For llama2.c checkpoints the tokenizer is params->tokenizer_path, else tokenizer.bin in the
 * model's directory, else the single tok*.bin there.
 * Errors: KILN_ERR_IO, KILN_ERR_FORMAT (missing tensor, wrong shape: named), KILN_ERR_UNSUPPORTED
 * (architecture, dtype, option), KILN_ERR_NOT_FOUND (tokenizer required but missing),
 * KILN_ERR_OUT_OF_MEMORY. Every message names the file.
 */
kiln_status kiln_model_open(const char *path, const kiln_model_load_params *params,
                            kiln_model **out, kiln_error *err);

/** Free the model and its sources. NULL is a no-op. */
void kiln_model_close(kiln_model *m);

/** KV cache of one sequence: a private block pool holding exactly its n_ctx positions.
 *  (The engine shares one pool among many sequences; this is the single-sequence path.) */
typedef struct kiln_kv_seq {
    int32_t n_ctx;
    kiln_kv_pool *pool;
    kiln_block_table table;
    float *rec_state; /* kiln_model_seq_state_floats(m) floats, or NULL */
} kiln_kv_seq;

/**
 * Floats of per-sequence recurrent state the model needs (kiln_batch_seq.rec_state): for
 * every gated-delta-net layer, the conv window (conv_dim x (conv_kernel - 1)) and the delta
 * rule state (n_v_heads x k_head_dim x v_head_dim), plus a small header. 0 for models
 * without recurrent layers.
 */
int64_t kiln_model_seq_state_floats(const kiln_model *m);

/**
 * Allocate a cache for n_ctx positions stored as dtype (F32, or F16: half the memory; the
 * attention then runs with f16 operands, see kiln_attention_paged).
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_ctx < 1, other dtype), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_kv_seq_create(const kiln_model *m, int32_t n_ctx, kiln_dtype dtype,
                               kiln_kv_seq **out, kiln_error *err);
void kiln_kv_seq_destroy(kiln_kv_seq *kv);

/**
 * Run the transformer over n tokens of one sequence at positions pos0 .. pos0+n-1, writing
 * their K/V into kv and attending causally over kv positions [0, pos].
 * logits: if non-NULL, [n_out_rows, n_vocab] f32 receives the logits of the rows selected by
 * want_all (every row, n_out_rows = n) or only the last row (n_out_rows = 1).
 * tp may be NULL (single thread).
 * Errors: KILN_ERR_INVALID_ARGUMENT (token id out of [0, n_vocab), n < 1, pos0 + n > n_ctx),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_model_forward(const kiln_model *m, kiln_kv_seq *kv, kiln_threadpool *tp,
                               const int32_t *tokens, int32_t n, int32_t pos0, bool want_all,
                               float *logits, kiln_error *err);

/**
 * One forward over a flat batch (DESIGN.md principle 1): every sequence's new tokens are
 * embedded, their K/V rows written into the sequence's paged KV blocks at positions
 * n_past .. n_past+n_new-1, and each token at position p attends causally over positions
 * [0, p], or (p - W, p] in a layer with sliding window W (only those blocks are read; the
 * table must still cover every position). Linear-attention layers (gated delta net) read
 * and advance the sequence's rec_state instead of the KV pool (their pool slots stay
 * unused).
 * Logits are computed only for the rows listed in batch->out, into logits[n_out, n_vocab].
 *
 * Batch invariance (principle 3): a token's logits depend only on its sequence's tokens
 * and KV, never on the other sequences in the batch, on how its prompt was chunked, or on
 * the thread count: every reduction has a fixed order per output element.
 *
 * Preconditions checked (KILN_ERR_INVALID_ARGUMENT, naming the sequence/token): token ids in
 * [0, n_vocab); seqs partition [0, n_tokens) in order; each block table covers
 * n_past + n_new positions of the pool; the pool's n_layer and kv_dim match the model; out
 * indices ascending and in range; positions below the model's learned-position limit
 * (GPT-2); for models with recurrent layers, a rec_state per sequence holding exactly n_past
 * positions (or n_past == 0). Errors also: KILN_ERR_OUT_OF_MEMORY. On error the KV
 * blocks of this step's positions may have been partly written; callers roll those
 * sequences back (their n_past is unchanged).
 */
kiln_status kiln_model_forward_batch(const kiln_model *m, kiln_kv_pool *pool, kiln_threadpool *tp,
                                     const kiln_batch *batch, float *logits, kiln_error *err);

#endif
