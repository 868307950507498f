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
 * Build a tokenizer from a GGUF's tokenizer.ggml.* metadata (model "llama" = SPM, "gpt2" =
 * byte-level BPE, "bert" = WordPiece), with llama.cpp's defaults per model type (SPM: BOS 1,
 * EOS 2, UNK 0, add_bos, add_space_prefix; WordPiece: CLS 101 as BOS, UNK 100, SEP 102;
 * BPE: BOS = EOS = 11), its text-based detection of EOT/EOM/FIM tokens (which are then
 * typed CONTROL) and end-of-generation set, and its per-model strip attributes (phi-3).
 * Token texts that are empty are renamed "[EMPTY_<id>]" as llama.cpp does. g may be
 * closed after this returns (everything is copied).
 * Errors: KILN_ERR_NOT_FOUND (no tokenizer.ggml.model / tokens, BPE without merges),
 * KILN_ERR_UNSUPPORTED (unknown model or pre-tokenizer, named), KILN_ERR_FORMAT (array
 * lengths disagree, non-numeric scores/types, a BOS/EOS/UNK id outside the vocab; other
 * out-of-range special ids are ignored with llama.cpp's default kept), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_tokenizer_from_gguf(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err);

/**
 * Build a tokenizer from a llama2.c tokenizer.bin with n_vocab entries; encodes exactly as
 * run.c's encode (BOS=1, EOS=2, dummy prefix " ", byte fallback to id byte+3; where byte+3
 * is not a valid id, as in vocabs without byte tokens, id 0 <unk> instead). Token 0 is
 * UNKNOWN, 1 and 2 CONTROL, "<0xNN>" BYTE. BOS and EOS are end-of-generation ids (run.c
 * stops when it samples BOS).
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_vocab < 1), else as kiln_llama2c_vocab_read.
 */
kiln_status kiln_tokenizer_from_llama2c(const char *path, int32_t n_vocab, kiln_tokenizer **out,
                                        kiln_error *err);

void kiln_tokenizer_destroy(kiln_tokenizer *t);

/** The underlying vocabulary (borrowed). */
const kiln_vocab *kiln_tokenizer_vocab(const kiln_tokenizer *t);

/**
 * Tokenize text[0..len) and append ids to out (llama.cpp llama_vocab::tokenize semantics).
 * add_special: prepend BOS / append EOS as the vocab's add_bos/add_eos flags say
 * (WordPiece: always CLS ... SEP, as llama.cpp does).
 * parse_special: recognise CONTROL (and UNKNOWN) token texts in the input; USER_DEFINED
 * tokens are always recognised, as llama.cpp does. Special texts are split out longest
 * first; with SPM every text fragment that starts the input or follows a special token gets
 * the U+2581 prefix when add_space_prefix. llama2.c vocabs ignore parse_special (run.c
 * has no special-token parsing).
 * Empty text gives only the special tokens add_special asks for.
 * On error out is left as it was.
 * Errors: KILN_ERR_INVALID_ARGUMENT (text is not valid UTF-8; the message gives the byte
 * offset; NULL text with len > 0), KILN_ERR_OUT_OF_MEMORY, and the BPE encoder's errors.
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
 * Mark id as an end-of-generation token (for example the eos_token_id list of a Hugging Face
 * generation_config.json). Errors: KILN_ERR_INVALID_ARGUMENT (NULL t, id outside the vocab).
 */
kiln_status kiln_tokenizer_add_eog(kiln_tokenizer *t, int32_t id, kiln_error *err);

/**
 * The chat template (Jinja source) the tokenizer came with: GGUF tokenizer.chat_template, or
 * for a Hugging Face directory tokenizer_config.json's chat_template (the "default" entry
 * when it is a list), else chat_template.jinja / chat_template.json beside it. NULL when
 * there is none. Borrowed; valid until the tokenizer is destroyed.
 */
const char *kiln_tokenizer_chat_template(const kiln_tokenizer *t);

/**
 * The BOS / EOS token strings, as a chat template's bos_token / eos_token variables see
 * them: tokenizer_config.json's bos_token / eos_token (a string or an AddedToken object's
 * "content") when given, else the text of the BOS / EOS id; NULL when there is none.
 * Borrowed; valid until the tokenizer is destroyed.
 */
const char *kiln_tokenizer_bos_text(const kiln_tokenizer *t);
const char *kiln_tokenizer_eos_text(const kiln_tokenizer *t);

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
 * Bytes of a multi-byte character split across tokens are held until complete; a byte that
 * can never be part of valid UTF-8 becomes U+FFFD at once. Control tokens render as "".
 * Leading space: SPM vocabs with add_space_prefix drop one leading space from the first
 * piece of the stream that is not BOS (undoing the prefix encode adds, as llama.cpp's
 * detokenize does); llama2.c vocabs drop it from any piece that follows BOS (run.c decode).
 * Byte-level BPE and WordPiece pieces are emitted as they are (no clean-up of spaces).
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
/** Render control tokens' text too (default false: they render as ""), as
 *  kiln_tokenizer_piece(render_special) and transformers' skip_special_tokens=False do. */
void kiln_detok_set_render_special(kiln_detok *d, bool on);
/** Flush held bytes at end of stream; invalid trailing bytes become U+FFFD. */
kiln_status kiln_detok_flush(kiln_detok *d, const char **text, size_t *len, kiln_error *err);

#endif
