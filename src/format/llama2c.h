/*
 * llama2c.h - llama2.c checkpoints (v0 "legacy" format) and tokenizer.bin.
 * Source: karpathy/llama2.c run.c (read_checkpoint, memory_map_weights, build_tokenizer).
 *
 * Checkpoint: a header of 7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len}; a negative vocab_size means the classifier is NOT shared
 * (a separate wcls follows). Then f32 weights in this order:
 *   token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, n_heads*head_size],
 *   wk [L, dim, n_kv_heads*head_size], wv [same as wk], wo [L, n_heads*head_size, dim],
 *   rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
 *   rms_final [dim], freq_cis_real [seq_len, head_size/2], freq_cis_imag [same],
 *   wcls [vocab, dim] (only when not shared; else wcls = token_embedding).
 * All matrices are row-major [out, in] as used by run.c's matmul (W @ x).
 */
#ifndef KILN_FORMAT_LLAMA2C_H
#define KILN_FORMAT_LLAMA2C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef struct kiln_llama2c_config {
    /* vocab_size is the absolute value of the header field; its sign is shared_classifier
     * (header vocab_size > 0: wcls is token_embedding; < 0: a separate wcls follows). */
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    bool shared_classifier;
} kiln_llama2c_config;

typedef struct kiln_llama2c {
    kiln_llama2c_config config;
    void *map; /* kiln_mapped_file*, NULL for kiln_llama2c_open_memory */
    /* Borrowed pointers into the mapping, f32. Per-layer arrays are [n_layers][...]. */
    const float *token_embedding, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final,
        *wcls;
} kiln_llama2c;

/**
 * Map and validate a llama2.c checkpoint. All header fields must be positive (vocab by
 * absolute value), dim divisible by n_heads, n_heads divisible by n_kv_heads, and the file
 * at least as large as the weights it declares (checked with overflow-safe arithmetic;
 * trailing bytes are ignored, as run.c does). Weight offsets follow run.c's
 * memory_map_weights, including the skipped freq_cis_real/imag blocks of
 * seq_len * head_size / 2 floats each (head_size = dim / n_heads).
 * Errors: KILN_ERR_IO (cannot open/map, or a directory), KILN_ERR_FORMAT (message names
 * the file, field and offset), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_llama2c_open(const char *path, kiln_llama2c **out, kiln_error *err);
/** As kiln_llama2c_open over a caller-owned buffer that must outlive the result (fuzzing,
 *  tests). The buffer must be 4-byte aligned (KILN_ERR_INVALID_ARGUMENT otherwise), since
 *  the weight pointers are f32. `name` (may be NULL) is used in messages. */
kiln_status kiln_llama2c_open_memory(const void *data, size_t size, const char *name,
                                     kiln_llama2c **out, kiln_error *err);
/** Unmap and free. NULL is a no-op. */
void kiln_llama2c_close(kiln_llama2c *m);

/** The contents of a llama2.c tokenizer.bin: int32 max_token_length, then per token
 *  {float score, int32 len, len bytes}. */
typedef struct kiln_llama2c_vocab {
    int32_t n_tokens;
    int32_t max_token_length;
    float *scores;  /* [n_tokens] */
    char **pieces;  /* [n_tokens], each NUL-terminated, owned */
    uint32_t *lens; /* [n_tokens] byte lengths */
} kiln_llama2c_vocab;

/**
 * Read tokenizer.bin holding exactly `n_tokens` entries (the checkpoint's vocab size, as
 * run.c's build_tokenizer). max_token_length must be positive and every length 0..max;
 * bytes left over after n_tokens entries are an error (a tokenizer for another model).
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_tokens <= 0), KILN_ERR_IO, KILN_ERR_FORMAT
 * (truncated, negative or too long length, trailing bytes; names file, token and offset),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_llama2c_vocab_read(const char *path, int32_t n_tokens, kiln_llama2c_vocab **out,
                                    kiln_error *err);
/** As kiln_llama2c_vocab_read over a tokenizer.bin image in memory (copied; the buffer
 *  need not outlive the result). `name` (may be NULL) is used in messages. */
kiln_status kiln_llama2c_vocab_read_memory(const void *data, size_t size, const char *name,
                                           int32_t n_tokens, kiln_llama2c_vocab **out,
                                           kiln_error *err);
/** Free everything. NULL is a no-op. */
void kiln_llama2c_vocab_free(kiln_llama2c_vocab *v);

#endif
