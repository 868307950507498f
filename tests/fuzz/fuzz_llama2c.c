/*
 * fuzz_llama2c - libFuzzer target for the llama2.c readers. Byte 0 picks the reader:
 * even = checkpoint (kiln_llama2c_open_memory on the rest), odd = tokenizer.bin
 * (kiln_llama2c_vocab_read_memory on data[3..], n_tokens = 1 + data[1] + 256 * data[2]).
 * The payload is copied into its own exact-size heap block so ASan sees any overread.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"

static volatile float fsink;
static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    bool vocab = data[0] & 1;
    size_t skip = vocab ? 3 : 1;
    size_t n = size - skip;
    uint8_t *p = malloc(n ? n : 1);
    if (!p) return 0;
    if (n) memcpy(p, data + skip, n);
    kiln_error e;
    if (!vocab) {
        kiln_llama2c *m = NULL;
        if (kiln_llama2c_open_memory(p, n, "fuzz.bin", &m, &e) == KILN_OK) {
            const kiln_llama2c_config *c = &m->config;
            /* First and last elements of the sections it maps. */
            size_t L = (size_t)c->n_layers, dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
            fsink = m->token_embedding[0] + m->w3[L * dim * hid - 1] + m->rms_final[dim - 1] +
                    m->wcls[(size_t)c->vocab_size * dim - 1];
            kiln_llama2c_close(m);
        } else if (!e.message[0] || !strstr(e.message, "fuzz.bin")) {
            __builtin_trap();
        }
    } else {
        int32_t n_tokens = 1 + data[1] + 256 * data[2];
        kiln_llama2c_vocab *v = NULL;
        if (kiln_llama2c_vocab_read_memory(p, n, "fuzz.tok", n_tokens, &v, &e) == KILN_OK) {
            for (int32_t i = 0; i < v->n_tokens; i++)
                sink += v->lens[i] + (uint8_t)v->pieces[i][v->lens[i]];
            kiln_llama2c_vocab_free(v);
        } else if (!e.message[0] || !strstr(e.message, "fuzz.tok")) {
            __builtin_trap();
        }
    }
    free(p);
    return 0;
}
