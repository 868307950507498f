/*
 * vocab.h - a tokenizer vocabulary as GGUF stores it (tokenizer.ggml.* keys, see the GGUF
 * spec and llama.cpp's llama-vocab.cpp for semantics): token texts, scores, token types,
 * BPE merges, special ids and flags. Shared by the SPM, BPE and WordPiece encoders.
 */
#ifndef KILN_TOKENIZER_VOCAB_H
#define KILN_TOKENIZER_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef enum kiln_vocab_type {
    KILN_VOCAB_SPM = 1,     /* SentencePiece-style BPE with scores, byte fallback ("llama") */
    KILN_VOCAB_BPE = 2,     /* byte-level BPE with merges ("gpt2") */
    KILN_VOCAB_WPM = 3,     /* WordPiece ("bert") */
    KILN_VOCAB_LLAMA2C = 4, /* llama2.c tokenizer.bin, encoded exactly as run.c does */
} kiln_vocab_type;

/* tokenizer.ggml.token_type values (llama.cpp llama_token_type). */
typedef enum kiln_token_type {
    KILN_TOKEN_UNDEFINED = 0,
    KILN_TOKEN_NORMAL = 1,
    KILN_TOKEN_UNKNOWN = 2,
    KILN_TOKEN_CONTROL = 3,
    KILN_TOKEN_USER_DEFINED = 4,
    KILN_TOKEN_UNUSED = 5,
    KILN_TOKEN_BYTE = 6,
} kiln_token_type;

typedef struct kiln_vocab {
    kiln_vocab_type type;
    int32_t n_tokens;
    char **text;         /* [n_tokens] owned, NUL-terminated token texts as stored */
    uint32_t *text_len;  /* [n_tokens] byte lengths */
    float *scores;       /* [n_tokens] or NULL */
    int32_t *token_type; /* [n_tokens] kiln_token_type */
    int32_t n_merges;
    char **merges; /* [n_merges] owned "left right" strings, rank = index; BPE only */
    char *pre;     /* tokenizer.ggml.pre, or NULL ("default") */

    /* special ids, -1 when absent */
    int32_t bos_id, eos_id, eot_id, unk_id, sep_id, pad_id, cls_id, mask_id;
    bool add_bos, add_eos, add_space_prefix, remove_extra_whitespaces;

    void *index; /* text -> id hash, private to vocab_index.c */
    void *bpe;   /* BPE state (merge ranks, pre-tokenizer), private to bpe.c */
} kiln_vocab;

/** Id of the token whose text is exactly text[0..len), or -1. O(1) average. */
int32_t kiln_vocab_find(const kiln_vocab *v, const char *text, size_t len);

/**
 * Build v->index (text -> id hash) over v->text[0..n_tokens). When two ids share a text the
 * later id wins, as llama.cpp's token_to_id map does. Rebuilding replaces the old index.
 * Errors: KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_vocab_build_index(kiln_vocab *v, kiln_error *err);

/** Free v->index and set it to NULL (kiln_vocab_find then finds nothing). NULL v is a no-op. */
void kiln_vocab_index_free(kiln_vocab *v);

/**
 * Free everything the vocab owns (texts, scores, types, merges, pre, index, and the BPE
 * state through kiln_bpe_free) and zero the struct. NULL is a no-op.
 */
void kiln_vocab_free(kiln_vocab *v);

/**
 * Whether s[0..n) is a byte token's text, exactly "<0xNN>" with two hex digits (either case),
 * as SentencePiece's byte_fallback pieces and llama2.c's tokenizer.bin spell them; *b gets NN.
 * False for anything else ("<0x-1>", "<0xZZ>", "<0x100>"), *b untouched.
 */
bool kiln_vocab_byte_piece(const char *s, uint32_t n, uint8_t *b);

#endif
