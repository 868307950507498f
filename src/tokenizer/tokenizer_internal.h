/*
 * tokenizer_internal.h - the kiln_tokenizer struct and construction helpers shared by the
 * tokenizer's loaders (tokenizer.c: GGUF and llama2.c; hf_tokenizer.c: tokenizer.json).
 * Private to src/tokenizer.
 */
#ifndef KILN_TOKENIZER_INTERNAL_H
#define KILN_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

struct kiln_hf; /* tokenizer.json pipeline, hf_internal.h */

enum { KILN_TOKF_LSTRIP = 1, KILN_TOKF_RSTRIP = 2 };

struct kiln_tokenizer {
    kiln_vocab v;
    uint8_t *flags;   /* [n_tokens] KILN_TOKF_* (GGUF partitioning) */
    bool *eog;        /* [n_tokens] end-of-generation ids */
    int32_t *special; /* ids partitioned out of raw text, longest text first (GGUF path) */
    size_t n_special;
    int32_t max_token_len; /* longest token text in bytes */
    struct kiln_hf *hf;    /* owned; non-NULL for tokenizers loaded from tokenizer.json */
    char *chat_template;   /* owned, NUL-terminated, or NULL */
    char *bos_text;        /* owned: the BOS token string tokenizer_config.json names, or NULL */
    char *eos_text;        /* owned: likewise for EOS */
};

/** A zeroed tokenizer with every special id at -1, or NULL when out of memory. */
kiln_tokenizer *kiln_tok_alloc(void);

/**
 * Detect EOT/EOM/FIM tokens by text (llama.cpp's list), fill t->eog (EOS, EOT, EOM, FIM
 * pad/rep/sep and the usual end-of-turn texts), build the special-token partition cache and
 * the per-model strip flags (from g's general.name; g may be NULL), and t->max_token_len.
 * Needs v->index. Errors: KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_tok_finish_specials(kiln_tokenizer *t, const kiln_gguf *g, int32_t eom_id,
                                     int32_t fim[6], kiln_error *err);

#endif
