/*
 * hf_to_gguf.h - a Hugging Face tokenizer.json (+ tokenizer_config.json) as GGUF tokenizer
 * metadata, for `kiln convert`.
 *
 * Keys written (the GGUF spec, ggml docs/gguf.md "Tokenizer", plus llama.cpp's
 * tokenizer.ggml.pre, which selects its pre-tokenizer regexes):
 *   tokenizer.ggml.model        "gpt2" (byte-level BPE)
 *   tokenizer.ggml.pre          the llama.cpp pre-tokenizer whose regexes equal the
 *                               tokenizer.json pre_tokenizer (see below)
 *   tokenizer.ggml.tokens       [n_vocab] token texts by id, as tokenizer.json stores them
 *                               (byte-level code points for BPE); ids nothing names, and ids
 *                               from the tokenizer's size up to the model's vocab_size, get
 *                               "[PAD<id>]" (what llama.cpp's convert_hf_to_gguf.py writes)
 *   tokenizer.ggml.token_type   [n_vocab] int32: 1 normal, 3 control (special added tokens),
 *                               4 user-defined (other added tokens), 5 unused (padding ids)
 *   tokenizer.ggml.merges       [n_merges] "left right", rank order
 *   tokenizer.ggml.bos_token_id / eos_token_id / unknown_token_id / padding_token_id
 *                               (uint32, only those the tokenizer has: tokenizer_config.json's
 *                               bos_token etc., else the post-processor's template tokens)
 *   tokenizer.ggml.add_bos_token / add_eos_token   (bool, always written: what add_special
 *                               does in transformers: tokenizer_config.json's flags, else the
 *                               post-processor's single-sequence template)
 *   tokenizer.chat_template     tokenizer_config.json's chat_template (or chat_template.jinja)
 *
 * The values are those kiln's own tokenizer.json loader (hf_tokenizer.h) derives, so that
 * kiln_tokenizer_from_gguf on the result encodes as kiln_tokenizer_from_hf_dir does.
 *
 * Pre-tokenizers mapped (anything else is refused, naming it): ByteLevel with use_regex
 * (GPT-2's regex) -> "gpt-2"; Sequence [Split(Regex R, Isolated), ByteLevel(use_regex false)]
 * with R Llama 3's regex -> "llama-bpe", Qwen2's -> "qwen2". add_prefix_space must be false
 * (llama.cpp's BPE never adds one). A normalizer is refused for BPE (llama.cpp applies none),
 * except NFC on the qwen2 regex, which llama.cpp ignores: *note is then set.
 *
 * Refused with KILN_ERR_UNSUPPORTED and a message naming the field: WordPiece, WordLevel and
 * Unigram models (the architectures convert writes do not use them), SentencePiece-style BPE
 * (byte_fallback, Metaspace or a Prepend normalizer: tokenizer.ggml.model "llama" needs
 * SentencePiece scores, which tokenizer.json does not have; use convert --vocab), ignore_merges
 * except with the llama3 regex, continuing_subword_prefix / end_of_word_suffix.
 */
#ifndef KILN_TOKENIZER_HF_TO_GGUF_H
#define KILN_TOKENIZER_HF_TO_GGUF_H

#include <stdint.h>

#include "format/gguf_write.h"
#include "kiln.h"

typedef struct kiln_hf_gguf_info {
    const char *model;  /* "gpt2" (static string) */
    const char *pre;    /* "gpt-2", "llama-bpe", "qwen2" (static string) */
    int32_t n_tokens;   /* tokens written (= n_vocab) */
    int32_t n_named;    /* ids tokenizer.json names */
    int32_t n_merges;
    const char *note;   /* NULL, or a static sentence about a known divergence */
} kiln_hf_gguf_info;

/**
 * Read <dir>/tokenizer.json (and tokenizer_config.json etc., as kiln_tokenizer_from_hf_dir)
 * and set the keys above on w for a model of n_vocab embedding rows.
 * Errors: KILN_ERR_NOT_FOUND (no tokenizer.json), KILN_ERR_UNSUPPORTED (a tokenizer that
 * cannot be written as GGUF metadata, named), KILN_ERR_FORMAT (malformed tokenizer.json; more
 * token ids than n_vocab), KILN_ERR_INVALID_ARGUMENT (NULL, n_vocab < 1),
 * KILN_ERR_OUT_OF_MEMORY. On error w may hold some of the keys.
 */
kiln_status kiln_hf_tokenizer_to_gguf(const char *dir, int32_t n_vocab, kiln_gguf_writer *w,
                                      kiln_hf_gguf_info *info, kiln_error *err);

#endif
