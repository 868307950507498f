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
 * Merges are "left right" strings split at the first space after the first byte; rank =
 * index, the first of duplicate pairs wins, and a merge without a space is ignored (all as
 * llama.cpp). The pre-tokenizer is chosen by v->pre (NULL = "default"), see
 * kiln_pretok_create in tokenizer/pretokenize.h. Calling it again rebuilds the state.
 * Errors: KILN_ERR_UNSUPPORTED (unknown v->pre, naming it), KILN_ERR_FORMAT (merges list
 * missing or a NULL entry), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (regex failed to
 * compile).
 */
kiln_status kiln_bpe_init(kiln_vocab *v, kiln_error *err);
/** Free v->bpe. Safe when never initialised. */
void kiln_bpe_free(kiln_vocab *v);

/**
 * Encode one fragment of raw text (no special-token parsing; the caller has already split
 * those out) and append ids to out, as llama.cpp's llm_tokenizer_bpe_session::tokenize:
 * pre-tokenize, byte-map each pre-token, merge by lowest rank (ties: leftmost pair), look
 * each final symbol up with kiln_vocab_find; a symbol missing from the vocab becomes the ids
 * of its single (mapped) bytes, and bytes without an id are dropped. With ignore_merges
 * (llama3 family, tekken) a pre-token that is itself a token is emitted whole. text need not
 * be NUL-terminated; it should be valid UTF-8. Thread-safe for concurrent calls on one vocab.
 * Errors: KILN_ERR_INVALID_ARGUMENT (kiln_bpe_init not run), KILN_ERR_OUT_OF_MEMORY,
 * KILN_ERR_INTERNAL (regex match error).
 */
kiln_status kiln_bpe_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err);

#endif
