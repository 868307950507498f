/*
 * spm.h - SentencePiece-style BPE over token scores (tokenizer.ggml.model = "llama") and the
 * llama2.c tokenizer.bin variant that run.c implements.
 */
#ifndef KILN_TOKENIZER_SPM_H
#define KILN_TOKENIZER_SPM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/vocab.h"
#include "util/vec.h"

/**
 * Encode one already-escaped fragment (spaces replaced by U+2581, the optional leading
 * U+2581 already added) and append the ids to out. Semantics of llama.cpp's
 * llm_tokenizer_spm: the text is split into UTF-8 characters, then the adjacent pair whose
 * concatenation is a vocab token with the highest score is merged, repeatedly (ties: the
 * leftmost pair); finally each symbol that is not a token is emitted as byte tokens
 * "<0xNN>" (or the one-byte token, or unk_id when neither exists).
 * text[0..len) must be valid UTF-8. Errors: KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_spm_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err);

/** The id of the SPM byte token for byte b ("<0xNN>", else the one-byte text), or -1. */
int32_t kiln_spm_byte_token(const kiln_vocab *v, uint8_t b);

/**
 * Encode text[0..len) exactly as karpathy/llama2.c run.c's encode() does: BOS=1 when bos,
 * the token " " as a dummy prefix when the text is non-empty (skipped if the vocab has no
 * " " token, where run.c would emit -1), one token per UTF-8 code point (looked up by exact
 * text), byte fallback to id byte+3 for code points not in the vocab (unk_id, or 0, where
 * byte+3 is not a valid id), then repeated merging of the adjacent pair whose concatenated
 * text is a token with the highest score (strictly above -1e10; ties: leftmost), and EOS=2
 * when eos. Text may contain NUL bytes (run.c would stop at the first); it must be valid
 * UTF-8. Errors: KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_llama2c_encode(const kiln_vocab *v, const char *text, size_t len, bool bos,
                                bool eos, kiln_ivec *out, kiln_error *err);

/**
 * Fill v (type KILN_VOCAB_LLAMA2C) from a llama2.c tokenizer.bin holding n_vocab entries:
 * int32 max_token_length, then per token {float32 score, int32 len, len bytes}. Token 0 is
 * UNKNOWN, 1 (BOS) and 2 (EOS) are CONTROL, "<0xNN>" tokens are BYTE, the rest NORMAL.
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_vocab < 1), KILN_ERR_IO, KILN_ERR_FORMAT (truncated
 * file, negative length; the message gives the offset), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_llama2c_vocab_load(const char *path, int32_t n_vocab, kiln_vocab *v,
                                    kiln_error *err);

#endif
