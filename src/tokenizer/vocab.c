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

bool kiln_vocab_byte_piece(const char *s, uint32_t n, uint8_t *b) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return false;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return false;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return true;
}
