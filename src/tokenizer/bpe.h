/*
 * bpe.h - byte-level BPE (GPT-2 style) with pre-tokenizer regexes selected by
 * tokenizer.ggml.pre. Semantics follow llama.cpp's llm_tokenizer_bpe and Hugging Face
 * tokenizers' ByteLevel pre-tokenizer; regexes run through PCRE2 with Unicode properties.
 */
#ifndef KILN_TOKENIZER_BPE_H
#define KILN_TOKENIZER_BPE_H

#include "tokenizer/vocab.h"
#include "util/vec.h"

/**
 * Build v->bpe (merge ranks, compiled pre-tokenizer regexes) for v->type == KILN_VOCAB_BPE.
 * Errors: KILN_ERR_UNSUPPORTED (unknown v->pre, naming it), KILN_ERR_FORMAT (malformed
 * merge), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (regex failed to compile).
 */
kiln_status kiln_bpe_init(kiln_vocab *v, kiln_error *err);
/** Free v->bpe. Safe when never initialised. */
void kiln_bpe_free(kiln_vocab *v);

/**
 * Encode one fragment of raw text (no special-token parsing; the caller has already split
 * those out) and append ids to out. text need not be NUL-terminated; it is valid UTF-8.
 * Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (regex match error).
 */
kiln_status kiln_bpe_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err);

#endif
