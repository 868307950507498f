/*
 * vocab_index.c - the text -> id index of a kiln_vocab: open addressing over a power-of-two
 * table, FNV-1a hashed (vocab.h documents the semantics).
 */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef struct vocab_index {
    size_t mask;    /* capacity - 1, capacity a power of two */
    int32_t *slots; /* token id or -1 */
} vocab_index;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

kiln_status kiln_vocab_build_index(kiln_vocab *v, kiln_error *err) {
    if (!v || v->n_tokens < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "vocab index: bad vocab");
    kiln_vocab_index_free(v);

    size_t cap = 16;
    while (cap < (size_t)v->n_tokens * 2) cap *= 2;
    vocab_index *ix = malloc(sizeof *ix);
    int32_t *slots = malloc(cap * sizeof *slots);
    if (!ix || !slots) {
        free(ix);
        free(slots);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "vocab index: out of memory (%zu slots)",
                              cap);
    }
    memset(slots, 0xff, cap * sizeof *slots); /* -1 */
    ix->mask = cap - 1;
    ix->slots = slots;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *t = v->text[id];
        size_t n = v->text_len[id];
        size_t i = (size_t)hash_bytes(t, n) & ix->mask;
        for (;;) {
            int32_t o = slots[i];
            if (o < 0) {
                slots[i] = id;
                break;
            }
            if (v->text_len[o] == n && memcmp(v->text[o], t, n) == 0) {
                slots[i] = id; /* later duplicate wins */
                break;
            }
            i = (i + 1) & ix->mask;
        }
    }
    v->index = ix;
    return KILN_OK;
}

int32_t kiln_vocab_find(const kiln_vocab *v, const char *text, size_t len) {
    if (!v || !v->index || (!text && len)) return -1;
    const vocab_index *ix = v->index;
    size_t i = (size_t)hash_bytes(text, len) & ix->mask;
    for (;;) {
        int32_t o = ix->slots[i];
        if (o < 0) return -1;
        if (v->text_len[o] == len && memcmp(v->text[o], text, len) == 0) return o;
        i = (i + 1) & ix->mask;
    }
}

void kiln_vocab_index_free(kiln_vocab *v) {
    if (!v) return;
    if (v->index) free(((vocab_index *)v->index)->slots);
    free(v->index);
    v->index = NULL;
}
