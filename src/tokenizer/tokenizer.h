/*
 * tokenizer.h - text <-> token ids for every vocab kind, special-token partitioning, and an
 * incremental detokenizer. Semantics follow llama.cpp (llama-vocab.cpp) for GGUF vocabs and
 * karpathy/llama2.c run.c (encode/decode) for tokenizer.bin.
 */
#ifndef KILN_TOKENIZER_TOKENIZER_H
#define KILN_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tokenizer/vocab.h"
#include "util/utf8.h"
#include "util/vec.h"

typedef struct kiln_tokenizer kiln_tokenizer;

/**
 * Build a tokenizer from a GGUF's tokenizer.ggml.* metadata. Errors: KILN_ERR_NOT_FOUND
 * (no tokenizer.ggml.model / tokens), KILN_ERR_UNSUPPORTED (unknown model or pre-tokenizer,
 * named), KILN_ERR_FORMAT (array lengths disagree, bad ids), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_tokenizer_from_gguf(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err);

/**
 * Build a tokenizer from a llama2.c tokenizer.bin with n_vocab entries; encodes exactly as
 * run.c's encode (BOS=1, EOS=2, dummy prefix " ", byte fallback to id byte+3).
 * Errors: as kiln_llama2c_vocab_read.
 */
kiln_status kiln_tokenizer_from_llama2c(const char *path, int32_t n_vocab, kiln_tokenizer **out,
                                        kiln_error *err);

void kiln_tokenizer_destroy(kiln_tokenizer *t);

/** The underlying vocabulary (borrowed). */
const kiln_vocab *kiln_tokenizer_vocab(const kiln_tokenizer *t);

/**
 * Tokenize text[0..len) and append ids to out.
 * add_special: prepend BOS / append EOS as the vocab's add_bos/add_eos flags say.
 * parse_special: recognise CONTROL token texts in the input (USER_DEFINED tokens are
 * always recognised, as llama.cpp does).
 * Errors: KILN_ERR_INVALID_ARGUMENT (text is not valid UTF-8; the message gives the byte
 * offset), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  bool add_special, bool parse_special, kiln_ivec *out,
                                  kiln_error *err);

int32_t kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
/** BOS/EOS ids, -1 when absent. */
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t);
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t);
/** True for end-of-generation ids (EOS, EOT, and similar control tokens). */
bool kiln_tokenizer_is_eog(const kiln_tokenizer *t, int32_t id);

/**
 * The bytes a token decodes to, in isolation (SPM: "▁" -> " ", "<0xNN>" -> byte NN;
 * byte-level BPE: unicode-to-byte mapping; control tokens: "" unless render_special).
 * Writes up to cap bytes into buf and returns the full length (like snprintf, no NUL).
 * Returns 0 for ids out of range.
 */
size_t kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, bool render_special, char *buf,
                            size_t cap);

/**
 * Incremental detokenizer: feed ids one at a time, get back only complete UTF-8.
 * Bytes of a multi-byte character split across tokens are held until complete. Handles
 * SPM leading-space rules the way llama.cpp/run.c decode does (a leading space after BOS
 * is stripped for SPM/llama2c vocabs).
 */
typedef struct kiln_detok kiln_detok;

kiln_status kiln_detok_create(const kiln_tokenizer *t, kiln_detok **out, kiln_error *err);
void kiln_detok_destroy(kiln_detok *d);
/**
 * Push one id. On return *text points to the newly complete UTF-8 text (may be empty;
 * valid until the next call; owned by d) and *len is its length.
 * Errors: KILN_ERR_INVALID_ARGUMENT (id out of range), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_detok_push(kiln_detok *d, int32_t id, const char **text, size_t *len,
                            kiln_error *err);
/** Flush held bytes at end of stream; invalid trailing bytes become U+FFFD. */
kiln_status kiln_detok_flush(kiln_detok *d, const char **text, size_t *len, kiln_error *err);

#endif
