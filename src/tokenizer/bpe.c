/* bpe.c - byte-level BPE (placeholder until the real encoder lands). */
#include "tokenizer/bpe.h"

#include "util/error.h"

kiln_status kiln_bpe_init(kiln_vocab *v, kiln_error *err) {
    (void)v;
    return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "byte-level BPE not implemented yet");
}

void kiln_bpe_free(kiln_vocab *v) {
    if (v)
        v->bpe = NULL;
}

kiln_status kiln_bpe_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err) {
    (void)v;
    (void)text;
    (void)len;
    (void)out;
    return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "byte-level BPE not implemented yet");
}
