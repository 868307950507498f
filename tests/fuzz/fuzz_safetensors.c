/*
 * fuzz_safetensors - libFuzzer target for the safetensors reader
 * (kiln_safetensors_open_memory). On success it touches the first and last byte of every
 * tensor and every metadata string.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/safetensors.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_safetensors *st = NULL;
    kiln_error e;
    if (kiln_safetensors_open_memory(data, size, "fuzz.safetensors", &st, &e) != KILN_OK) {
        if (e.message[0] == '\0' || strstr(e.message, "fuzz.safetensors") == NULL) __builtin_trap();
        return 0;
    }
    for (size_t i = 0; i < st->n_tensors; i++) {
        const kiln_st_tensor *t = &st->tensors[i];
        const uint8_t *d = t->data;
        if (d < data + 8 || t->nbytes > size || d > data + size - t->nbytes) __builtin_trap();
        if (t->nbytes) sink += d[0] + d[t->nbytes - 1];
        if (t->n_dims < 0 || t->n_dims > KILN_ST_MAX_DIMS) __builtin_trap();
        if (kiln_safetensors_find(st, t->name) != t) __builtin_trap();
    }
    for (size_t i = 0; i < st->n_meta; i++)
        sink += strlen(st->meta_keys[i]) + strlen(st->meta_values[i]);
    kiln_safetensors_close(st);
    return 0;
}
