/* wpm.h - WordPiece (tokenizer.ggml.model = "bert") as llama.cpp's llm_tokenizer_wpm does it. */
#ifndef KILN_TOKENIZER_WPM_H
#define KILN_TOKENIZER_WPM_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/vocab.h"
#include "util/vec.h"

/**
 * Encode one fragment of valid UTF-8 and append ids to out. Semantics of llama.cpp's WPM:
 * each code point is replaced by the first code point of its NFD decomposition (which drops
 * the accents of precomposed letters) and lowercased (single code point mappings only);
 * words split on White_Space; NUL, U+FFFD and control/format/private-use code points are
 * dropped; punctuation (P*), ASCII symbols and CJK ideographs become one-character words.
 * Each word, prefixed with U+2581 (the word-start marker llama.cpp's converter stores in
 * the GGUF vocab), is split greedily longest-match-first (matches at most max_token_len
 * bytes); a word with an unmatchable position becomes one unk_id.
 * Errors: KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_wpm_encode(const kiln_vocab *v, int32_t max_token_len, const char *text,
                            size_t len, kiln_ivec *out, kiln_error *err);

/* Unicode helpers used by the WordPiece pre-processing (Unicode tables in wpm.c). */
uint32_t kiln_wpm_nfd_first(uint32_t cp); /* first code point of NFD(cp) */
uint32_t kiln_wpm_lower(uint32_t cp);     /* simple lowercase, cp when none */

#endif
