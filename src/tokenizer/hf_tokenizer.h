/*
 * hf_tokenizer.h - a kiln_tokenizer from a Hugging Face tokenizer.json (+ tokenizer_config.json),
 * so that a Hugging Face model directory runs without a GGUF.
 *
 * Semantics follow the Hugging Face `tokenizers` library (Tokenizer::encode / decode):
 *
 *   text -> added tokens split out of the raw text (tokens with normalized=false: special
 *           ones only when parse_special; leftmost-longest; single_word, lstrip, rstrip)
 *        -> normalizer on each remaining piece -> added tokens with normalized=true split
 *           out of the normalized pieces
 *        -> pre-tokenizer -> model (BPE, WordPiece or WordLevel) on every pre-token
 *        -> post-processor (TemplateProcessing, Roberta/BertProcessing) when add_special.
 *
 * Supported components (anything else is refused with KILN_ERR_UNSUPPORTED naming the field):
 *   model:         BPE (merges as "a b" strings or ["a","b"] pairs; byte_fallback, fuse_unk,
 *                  ignore_merges, unk_token, continuing_subword_prefix, end_of_word_suffix;
 *                  dropout is ignored: kiln is deterministic), WordPiece, WordLevel.
 *                  (Unigram is not supported.)
 *   normalizer:    Sequence, Prepend, Replace (String or Regex), NFC, NFKC, NFD, NFKD
 *                  (utf8proc), Lowercase, Strip, StripAccents, BertNormalizer, ByteLevel.
 *   pre_tokenizer: Sequence, Split (String or Regex; Removed, Isolated, MergedWithPrevious,
 *                  MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, use_regex),
 *                  Metaspace (replacement, prepend_scheme first/always/never, split; legacy
 *                  add_prefix_space), Digits, Whitespace, WhitespaceSplit, Punctuation,
 *                  BertPreTokenizer, CharDelimiterSplit.
 *   post_processor: TemplateProcessing (single), RobertaProcessing, BertProcessing,
 *                  ByteLevel (no ids), Sequence.
 *   decoder:       Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 *                  WordPiece, BPEDecoder; no decoder = tokens joined by spaces.
 * Regexes run on PCRE2 (UTF, UCP, MULTILINE: `$` ends a line as in Oniguruma's Ruby syntax,
 * which the tokenizers library uses).
 */
#ifndef KILN_TOKENIZER_HF_TOKENIZER_H
#define KILN_TOKENIZER_HF_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

/**
 * Load <dir>/tokenizer.json and, when present, <dir>/tokenizer_config.json (chat_template,
 * bos_token, eos_token, unk_token, pad_token, add_bos_token, add_eos_token),
 * <dir>/special_tokens_map.json (bos/eos/unk/pad when the config lacks them) and
 * <dir>/chat_template.jinja or chat_template.json (when the config has no chat_template).
 *
 * Token ids are tokenizer.json's (model vocab and added_tokens; an added token whose content is
 * a model token takes the model's id, as tokenizers does); n_vocab is the largest id + 1,
 * and ids in between that nothing names decode to "" (type UNUSED). Token types: model tokens
 * NORMAL ("<0xNN>" BYTE with byte_fallback), unk UNKNOWN, special added tokens CONTROL, other
 * added tokens USER_DEFINED. BOS/EOS: the config's bos_token/eos_token, else the special
 * tokens the post-processor puts before/after the sequence. add_special (kiln_tokenizer_encode)
 * applies the post-processor's single-sequence template; when tokenizer_config.json sets
 * add_bos_token or add_eos_token, [BOS] text [EOS] as those flags say instead (transformers'
 * Llama/Gemma tokenizers rebuild their template from these flags). End-of-generation ids: EOS
 * plus llama.cpp's end-of-turn texts (kiln_tokenizer_is_eog).
 *
 * Decoding (kiln_detok_*, kiln_tokenizer_piece) runs the tokenizer.json decoder token by token
 * with HF's skip_special_tokens=True semantics (special added tokens render as ""; with
 * render_special they go through the decoder like any token), so that the text of a stream
 * equals HF's decode(ids, skip_special_tokens=True) whenever that text is valid UTF-8. Bytes
 * that are not valid UTF-8 become U+FFFD one per byte (HF's ByteFallback replaces a whole
 * invalid run byte by byte too; its ByteLevel decoder uses from_utf8_lossy). Fuse followed
 * by Strip strips at the start of the stream; a Strip `stop` after Fuse and a BPEDecoder's
 * last-token rule (which need the end of the stream) are not applied, and Replace after Fuse
 * works within each token.
 *
 * Errors (messages name the file and the JSON field, e.g. "tokenizer.json: model.merges[12]"):
 * KILN_ERR_NOT_FOUND (no tokenizer.json in dir), KILN_ERR_IO, KILN_ERR_FORMAT (bad JSON, with
 * line and column; a field of the wrong type; a merge or merged token not in the vocab; ids out
 * of range or too sparse; a regex PCRE2 cannot compile; Sequences nested 16 deep),
 * KILN_ERR_UNSUPPORTED (a model, normalizer, pre-tokenizer, post-processor or decoder type kiln
 * does not implement, named), KILN_ERR_INVALID_ARGUMENT (NULL arguments),
 * KILN_ERR_OUT_OF_MEMORY.
 *
 * Not read: tokenizer_config.json's added_tokens_decoder (tokenizer.json's added_tokens are
 * used), truncation/padding, and model-class flags such as legacy or add_prefix_space that
 * transformers may use to rebuild a pipeline; the tokenizer.json pipeline is taken as written.
 */
kiln_status kiln_tokenizer_from_hf_dir(const char *dir, kiln_tokenizer **out, kiln_error *err);

/**
 * As kiln_tokenizer_from_hf_dir, from explicit files: tokenizer_json is required; config_json
 * (tokenizer_config.json) may be NULL. No other file is read.
 */
kiln_status kiln_tokenizer_from_hf_files(const char *tokenizer_json, const char *config_json,
                                         kiln_tokenizer **out, kiln_error *err);

/**
 * As kiln_tokenizer_from_hf_files, from JSON text in memory (tokenizer.json text of json_len
 * bytes; config text may be NULL). Used by tests and fuzzing; error messages call the inputs
 * "tokenizer.json" and "tokenizer_config.json".
 */
kiln_status kiln_tokenizer_from_hf_json(const char *json, size_t json_len, const char *config,
                                        size_t config_len, kiln_tokenizer **out, kiln_error *err);

/* ---- hooks used by tokenizer.c and detok.c (not for other callers); hf_pipeline.c -------- */

struct kiln_hf;

/** Free a tokenizer.json pipeline (NULL is a no-op). */
void kiln_hf_free(struct kiln_hf *h);

/**
 * Encode text[0..len) (valid UTF-8) through the pipeline and append ids to out; on error out
 * is left as it was. Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (regex match error),
 * KILN_ERR_FORMAT (the text needs unk_token and the model names one that is not in its vocab).
 */
kiln_status kiln_hf_encode(const struct kiln_hf *h, const char *text, size_t len, bool add_special,
                           bool parse_special, kiln_ivec *out, kiln_error *err);

/** Per-stream decoder state; zero-initialise (kiln_hf_dstate s = {0}) at stream start. */
typedef struct kiln_hf_dstate {
    uint64_t index;         /* tokens decoded so far (skipped special tokens not counted) */
    uint32_t fused_left[4]; /* leading chars still to strip for each Strip after Fuse */
    bool started;           /* fused_left initialised */
} kiln_hf_dstate;

/**
 * The bytes token id contributes to a decoded stream in state s (advanced unless the token is
 * skipped): writes up to cap bytes into buf and returns the full length (snprintf-like, no
 * NUL); call again with a larger buffer and the same state copy when it did not fit.
 * skip_special: special added tokens contribute nothing and do not advance s. Ids out of
 * range and unused ids contribute nothing.
 */
size_t kiln_hf_decode_token(const struct kiln_hf *h, int32_t id, bool skip_special,
                            kiln_hf_dstate *s, char *buf, size_t cap);

#endif
