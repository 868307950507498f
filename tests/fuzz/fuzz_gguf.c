/*
 * fuzz_gguf - libFuzzer target for the GGUF reader (kiln_gguf_open_memory). On success it
 * touches every parsed value and the first and last byte of every tensor, so ASan reports
 * any pointer the reader let out of bounds.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/gguf.h"

static volatile uint64_t sink;

static void touch_value(const kiln_gguf_value *v) {
    if (v->type == KILN_GGUF_STRING) {
        if (v->str.len) sink += (uint8_t)v->str.data[v->str.len - 1];
        sink += (uint8_t)v->str.data[v->str.len]; /* the NUL terminator */
    } else if (v->type == KILN_GGUF_ARRAY && v->arr.n) {
        if (v->arr.elem_type == KILN_GGUF_STRING) {
            const kiln_gguf_str *s = v->arr.data;
            sink += s[v->arr.n - 1].len + (uint8_t)s[v->arr.n - 1].data[s[v->arr.n - 1].len];
        } else if (v->arr.elem_type == KILN_GGUF_ARRAY) {
            const kiln_gguf_value *e = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++) touch_value(&e[i]);
        } else {
            sink += ((const uint8_t *)v->arr.data)[0];
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g = NULL;
    kiln_error e;
    if (kiln_gguf_open_memory(data, size, "fuzz.gguf", &g, &e) != KILN_OK) {
        if (e.message[0] == '\0' || strstr(e.message, "fuzz.gguf") == NULL) __builtin_trap();
        return 0;
    }
    for (size_t i = 0; i < g->n_kv; i++) {
        touch_value(&g->kv[i].value);
        int64_t i64;
        uint32_t u32;
        float f;
        bool b;
        sink += kiln_gguf_get_i64(g, g->kv[i].key, &i64) +
                kiln_gguf_get_u32(g, g->kv[i].key, &u32) + kiln_gguf_get_f32(g, g->kv[i].key, &f) +
                kiln_gguf_get_bool(g, g->kv[i].key, &b);
        sink += kiln_gguf_get_str(g, g->kv[i].key) != NULL;
        if (kiln_gguf_find(g, g->kv[i].key) != &g->kv[i]) __builtin_trap(); /* keys unique */
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        const uint8_t *d = t->data;
        if (t->nbytes == 0 || d < (const uint8_t *)data || d + t->nbytes > data + size)
            __builtin_trap();
        sink += d[0] + d[t->nbytes - 1];
        if (kiln_gguf_find_tensor(g, t->name) != t) __builtin_trap(); /* names unique */
    }
    kiln_gguf_close(g);
    return 0;
}
