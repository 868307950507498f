/*
 * gguf_builder.h - a hand-written GGUF writer for tests (GGUF spec, ggml/docs/gguf.md),
 * independent of src/format/gguf.c. Version 1 writes uint32 counts, string lengths, array
 * lengths and dims; versions 2 and 3 write uint64.
 */
#ifndef KILN_TEST_GGUF_BUILDER_H
#define KILN_TEST_GGUF_BUILDER_H

#include "fmt_util.h"

typedef struct gb {
    bb b;
    uint32_t version;
} gb;

static inline void gb_count(gb *g, uint64_t n) {
    if (g->version == 1) {
        bb_u32(&g->b, (uint32_t)n);
    } else {
        bb_u64(&g->b, n);
    }
}
static inline void gb_strn(gb *g, const char *s, size_t n) {
    gb_count(g, n);
    bb_bytes(&g->b, s, n);
}
static inline void gb_str(gb *g, const char *s) {
    gb_strn(g, s, strlen(s));
}
static inline void gb_header(gb *g, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    g->version = version;
    bb_bytes(&g->b, "GGUF", 4);
    bb_u32(&g->b, version);
    gb_count(g, n_tensors);
    gb_count(g, n_kv);
}
/* Key + type tag; the caller appends the value. */
static inline void gb_key(gb *g, const char *key, uint32_t type) {
    gb_str(g, key);
    bb_u32(&g->b, type);
}
static inline void gb_kv_u32(gb *g, const char *key, uint32_t v) {
    gb_key(g, key, 4);
    bb_u32(&g->b, v);
}
static inline void gb_kv_str(gb *g, const char *key, const char *v) {
    gb_key(g, key, 8);
    gb_str(g, v);
}
/* Array header (after gb_key(..., 9)). */
static inline void gb_arr(gb *g, uint32_t elem_type, uint64_t n) {
    bb_u32(&g->b, elem_type);
    gb_count(g, n);
}
static inline void gb_tensor(gb *g, const char *name, uint32_t n_dims, const uint64_t *ne,
                             uint32_t type, uint64_t offset) {
    gb_str(g, name);
    bb_u32(&g->b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) gb_count(g, ne[i]);
    bb_u32(&g->b, type);
    bb_u64(&g->b, offset);
}

#endif
