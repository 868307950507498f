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
#include "backend/backend.h"
#include "kv/kv_pool.h"
#include "model/config.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"

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

/** Sampling defaults a checkpoint ships: kiln.h's kiln_generation_defaults (transformers'
 *  generation_config.json; a field applies only when its has_ flag is set). */
typedef kiln_generation_defaults kiln_gen_defaults;

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
    /* where the weights were placed (kiln_model_load_params.backend; NULL: nowhere, they stay
     * as the file has them, host memory) and, for a device backend, on which device and the
     * backend's handle of the device copies (released by kiln_model_close) */
    const kiln_backend_ops *placed;
    int32_t device;
    void *placement;
} kiln_model;

typedef struct kiln_model_load_params {
    const char *tokenizer_path; /* llama2.c tokenizer.bin; NULL = look beside the model */
    bool require_tokenizer;     /* fail when no tokenizer can be found */
    bool keep_file_layout;      /* weights stay mapped as in the file (no forward pass) */
    /* the backend the weights are placed for (its place_weights, or place_device for a
     * backend without host memory: backend.h); NULL: none, the weights stay as the file has
     * them. kiln_model_open (backend/loader.h) fills in the CPU's */
    const kiln_backend_ops *backend;
    int32_t device; /* a device backend's device ordinal (place_device) */
} kiln_model_load_params;

/**
 * Load a model from a GGUF file, a llama2.c checkpoint, or a Hugging Face directory
 * (config.json + model.safetensors or a sharded index). Weights are memory-mapped, then:
 * norm vectors stored in f16/bf16 are converted to f32 copies; transposed (GPT-2 Conv1D)
 * matrices are copied in the row layout; and, last, the matrices the forward pass multiplies
 * by are placed for params->backend (its place_weights; the CPU backend's moves them into
 * owned huge-page memory, F16 packed: backend/cpu/cpu_backend.h), unless params or
 * params->backend is NULL or params->keep_file_layout. A backend without host memory (CUDA)
 * gets every weight the forward pass reads, vectors and embedding tables included, through
 * its place_device on params->device; the model's pointers then address device memory (never
 * dereferenced on the host) until kiln_model_close releases it. Most callers want
 * kiln_model_open (backend/loader.h), which places for the CPU backend.
 * For llama2.c checkpoints the tokenizer is params->tokenizer_path, else tokenizer.bin in the
 * model's directory, else the single tok*.bin there.
 * Errors: KILN_ERR_IO, KILN_ERR_FORMAT (missing tensor, wrong shape: named), KILN_ERR_UNSUPPORTED
 * (architecture, dtype, option; a weight dtype the device backend cannot multiply),
 * KILN_ERR_NOT_FOUND (tokenizer required but missing), KILN_ERR_INVALID_ARGUMENT (no such
 * device), KILN_ERR_OUT_OF_MEMORY (also: the weights do not fit on the device). Every message
 * names the file.
 */
kiln_status kiln_model_load_file(const char *path, const kiln_model_load_params *params,
                                 kiln_model **out, kiln_error *err);

/** Free the model and its sources (and its device copies). NULL is a no-op. */
void kiln_model_close(kiln_model *m);

/** The backend context parameters m's weights need: the kind and device they were placed for
 *  (the CPU when they were placed nowhere or for the CPU), with n_threads for the CPU. */
static inline kiln_backend_params kiln_model_backend_params(const kiln_model *m,
                                                            int32_t n_threads) {
    kiln_backend_params p = {KILN_BACKEND_CPU, n_threads, 0};
    if (m->placed && !m->placed->host_memory) {
        p.kind = m->placed->kind;
        p.device = m->device;
    }
    return p;
}

/**
 * Floats of per-sequence recurrent state the model needs (kiln_batch_seq.rec_state): for
 * every gated-delta-net layer, the conv window (conv_dim x (conv_kernel - 1)) and the delta
 * rule state (n_v_heads x k_head_dim x v_head_dim), plus a small header
 * (KILN_MODEL_STATE_HEADER_FLOATS floats; its first int32 counts the positions consumed).
 * 0 for models without recurrent layers.
 */
int64_t kiln_model_seq_state_floats(const kiln_model *m);

#define KILN_MODEL_STATE_HEADER_FLOATS 16

/**
 * True when generating `id` ends a generation for m (model_vocab.c; public in kiln.h): the
 * tokenizer's end-of-generation ids (EOS, EOT and similar, see kiln_tokenizer_is_eog), or
 * the config's eos_id for a model without a tokenizer; for llama2.c checkpoints also BOS
 * (id 1), as llama2.c's run.c stops on it. False for a NULL model.
 */
bool kiln_model_is_eog(const kiln_model *m, int32_t id);

/**
 * Whether draft can propose tokens for target (speculative decoding with a draft model,
 * kiln.h kiln_engine_params.draft_model; llama.cpp's speculative example checks the same):
 * the token ids must mean the same tokens. In order:
 *   - the same n_vocab (the models' logits width);
 *   - when both have a tokenizer: the same tokenizer size, and for every id the same bytes
 *     (kiln_tokenizer_piece with control tokens rendered: a llama2.c tokenizer.bin and a GGUF
 *     of the same vocabulary, one storing spaces as ' ' and the other as U+2581, agree);
 *   - the same end-of-generation ids (kiln_model_is_eog for every id).
 * A model without a tokenizer (a Hugging Face directory that ships none) has no texts to
 * compare: such a pair is compared by n_vocab only, and its ids are taken on trust.
 * On false, reason[0..n) (may be NULL) receives the first difference, e.g. "vocabulary sizes
 * differ: target 32000, draft 512", "token 17 differs: target \"ab\", draft \"cd\"" (bytes
 * outside printable ASCII as \xNN), "end-of-generation ids differ: token 1 ends generation
 * for the target, not for the draft"; on true it is "". NULL models: false.
 */
bool kiln_model_vocab_compatible(const kiln_model *target, const kiln_model *draft, char *reason,
                                 size_t n);

/**
 * A 64-bit identity of m's weights (model_fingerprint.c): XXH3-64 over the architecture's
 * geometry and samples of the source files (the GGUF / llama2.c file, or a Hugging Face
 * directory's config.json and *.safetensors: names, sizes, the first and last 64 KiB and 64
 * evenly spaced 4 KiB pieces), read from disk, under 1 MiB per file. Equal models give equal
 * fingerprints across processes and machines.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_IO (a source file cannot be read: named),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_model_fingerprint(const kiln_model *m, uint64_t *out, kiln_error *err);

/**
 * The backend reservation (backend.h) a step of up to max_tokens flat tokens over sequences
 * of up to max_keys positions needs: the activation bytes of this model's layout, the
 * attention geometry and the delta-net head size. Pure; never fails.
 */
kiln_backend_reserve kiln_model_reserve(const kiln_model *m, int32_t max_tokens, int32_t max_keys);

/**
 * The model's dataflow for one prepared step (DESIGN.md principle 1): every token is
 * embedded, each layer's mixer (attention over the paged KV, writing the step's K/V rows at
 * their positions; or the gated delta net over each sequence's rec_state) and FFN run, and
 * the logits of the rows st->b->out are written to logits ([n_out, n_vocab], backend memory;
 * NULL: none). Activations are carved from be's arena, which must hold
 * kiln_model_reserve(m, st->n_tokens, st->max_keys); step_begin must have been called for st.
 * Layer groups (src/engine/kv_window.c): pool_swa NULL keeps every layer's K/V in
 * pool; else the layers pool_swa holds (kiln_kv_pool_holds_layer) use pool_swa and each
 * sequence's block_table_swa, the others pool and block_table.
 * Written once over the operations table: it calls nothing else. The batch must have been
 * checked (backend/runner.h does). Sources: Touvron et al. 2023 (LLaMA), Radford et al. 2019
 * (GPT-2), Gemma Team 2024, Jiang et al. 2024 (Mixtral), Yang et al. 2024 (Gated Delta
 * Networks), transformers' modeling_*.py for the order of operations.
 */
void kiln_model_forward_step(const kiln_model *m, kiln_backend *be, kiln_kv_pool *pool,
                             kiln_kv_pool *pool_swa, const kiln_step *st, float *logits);

#endif
