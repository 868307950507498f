/* vocab.c - the lifetime of a kiln_vocab: freeing everything it owns. */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

void kiln_vocab_free(kiln_vocab *v) {
    if (!v) return;
    kiln_bpe_free(v);
    if (v->text)
        for (int32_t i = 0; i < v->n_tokens; i++) free(v->text[i]);
    free(v->text);
    free(v->text_len);
    free(v->scores);
    free(v->token_type);
    if (v->merges)
        for (int32_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->merges);
    free(v->pre);
    kiln_vocab_index_free(v);
    memset(v, 0, sizeof *v);
}
