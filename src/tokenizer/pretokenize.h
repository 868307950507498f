/*
 * pretokenize.h - the two halves of a byte-level BPE front end:
 *
 *   1. GPT-2's reversible byte <-> unicode mapping ("bytes_to_unicode" in OpenAI's GPT-2
 *      encoder.py, the ByteLevel pre-tokenizer of Hugging Face tokenizers): every byte value
 *      gets a printable code point so that token texts never contain raw control bytes.
 *   2. Regex pre-tokenizers chosen by GGUF `tokenizer.ggml.pre`: the list of regexes that
 *      llama.cpp (llama-vocab.cpp, llm_tokenizer_bpe; unicode.cpp, unicode_regex_split)
 *      applies in sequence, each splitting every fragment left by the previous one into its
 *      matches and the unmatched gaps between them (both kept). Matching runs on PCRE2
 *      (UTF + UCP). To reproduce llama.cpp exactly, non-ASCII White_Space code points are
 *      seen by the regexes as U+000B and `\s` means ASCII [\t-\r ]: llama.cpp collapses the
 *      text the same way before std::regex sees it.
 */
#ifndef KILN_TOKENIZER_PRETOKENIZE_H
#define KILN_TOKENIZER_PRETOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

/* ---- GPT-2 byte-level mapping ------------------------------------------------------------ */

/**
 * The code point GPT-2's bytes_to_unicode assigns to byte b: '!'..'~', U+00A1..U+00AC and
 * U+00AE..U+00FF map to themselves; the other 68 bytes (0x00..0x20, 0x7F..0xA0, 0xAD) map,
 * in increasing byte order, to U+0100, U+0101, ... U+0143. E.g. ' ' -> U+0120 'Ġ',
 * '\n' -> U+010A 'Ċ'.
 */
uint32_t kiln_bytelevel_cpt(uint8_t b);

/** Inverse of kiln_bytelevel_cpt: the byte mapped to code point cpt, or -1 if none. */
int kiln_bytelevel_byte(uint32_t cpt);

/**
 * Byte-encode in[0..len): each byte becomes the UTF-8 of its mapped code point (1 or 2
 * bytes). out must hold 2*len bytes. Returns the number of bytes written (no NUL).
 */
size_t kiln_bytelevel_encode(const char *in, size_t len, char *out);

/**
 * Byte-decode a token text: each UTF-8 character of piece[0..len) that is in the mapping's
 * range becomes its byte. Characters outside the mapping (e.g. texts of added tokens) and
 * malformed bytes are copied through unchanged (llama.cpp's llama_decode_text writes an
 * "[UNK_BYTE_0x..]" marker there instead). out must hold len bytes (the result is never
 * longer than the input). Returns the number of bytes written (no NUL). Used by the
 * detokenizer for NORMAL tokens of byte-level BPE vocabs.
 */
size_t kiln_bytelevel_decode(const char *piece, size_t len, char *out);

/* ---- regex pre-tokenizers ---------------------------------------------------------------- */

typedef struct kiln_pretok kiln_pretok;

/** A piece of the input: bytes text[off .. off+len). */
typedef struct kiln_span {
    size_t off, len;
} kiln_span;

/** Growable list of spans; zero-initialise, free with kiln_spans_free. */
typedef struct kiln_spans {
    kiln_span *data;
    size_t n, cap;
} kiln_spans;

void kiln_spans_free(kiln_spans *s);

/**
 * Compile the pre-tokenizer for a `tokenizer.ggml.pre` value (NULL or "" = "default", as
 * llama.cpp treats a missing key). Known values follow llama.cpp's llama_vocab::load
 * mapping: default; llama3 / llama-v3 / llama-bpe / falcon3 / falcon-h1 / pixtral /
 * midm-2.0 / lfm2 (Llama-3 regex, ignore_merges); dbrx / smaug-bpe; chatglm-bpe / glm4;
 * deepseek-llm; deepseek-coder; falcon; starcoder / refact / command-r / smollm / codeshell
 * / exaone / minerva-7b; gpt-2 / phi-2 / roberta-bpe / mpt / olmo / jais / jina-* / ...;
 * qwen2 / deepseek-r1-qwen / stablelm2 / megrez / hunyuan; chameleon; poro-chat / bloom /
 * gpt3-finnish; viking; tekken (ignore_merges); gpt-4o / llama4; seed-coder; grok-2;
 * bailingmoe.
 * Errors: KILN_ERR_UNSUPPORTED (unknown value, named in the message), KILN_ERR_INTERNAL (a
 * regex failed to compile), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_pretok_create(const char *pre, kiln_pretok **out, kiln_error *err);

void kiln_pretok_destroy(kiln_pretok *p);

/** The llama.cpp pre-tokenizer family the value resolved to ("gpt2", "llama3", ...). */
const char *kiln_pretok_family(const kiln_pretok *p);

/**
 * The regexes this pre-tokenizer applies, in order, as llama.cpp lists them (PCRE2 syntax,
 * before kiln's ASCII-whitespace rewrite); *n receives their count. Borrowed static strings.
 * Used to export a GGUF vocabulary as a tokenizer.json Split sequence.
 */
const char *const *kiln_pretok_regexes(const kiln_pretok *p, int *n);

/**
 * llama.cpp's ignore_merges flag for this pre type (llama3 family, tekken): a pre-token
 * whose whole byte-encoded text is a vocab entry is emitted as that token without merging.
 */
bool kiln_pretok_ignore_merges(const kiln_pretok *p);

/**
 * Split text[0..len) into pre-tokens (byte spans of the input, in order, non-empty,
 * covering the input exactly). The regexes only see the span they split, so a lookahead
 * or `$` stops at the fragment's end, as in llama.cpp. text should be valid UTF-8; a
 * malformed byte is matched as if it were U+FFFD and kept as a one-byte span character.
 * out->n is reset to 0 first. Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (PCRE2
 * match error, e.g. its match limit).
 */
kiln_status kiln_pretok_split(const kiln_pretok *p, const char *text, size_t len, kiln_spans *out,
                              kiln_error *err);

#endif
