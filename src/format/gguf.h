/*
 * gguf.h - GGUF reader, versions 1, 2 and 3.
 * Source: the GGUF specification (ggml/docs/gguf.md). v1 used uint32 counts and string
 * lengths; v2 and v3 use uint64. Tensor data is mmap'd and never copied; metadata is
 * parsed into owned memory.
 */
#ifndef KILN_FORMAT_GGUF_H
#define KILN_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "tensor/dtype.h"

typedef enum kiln_gguf_type {
    KILN_GGUF_UINT8 = 0,
    KILN_GGUF_INT8 = 1,
    KILN_GGUF_UINT16 = 2,
    KILN_GGUF_INT16 = 3,
    KILN_GGUF_UINT32 = 4,
    KILN_GGUF_INT32 = 5,
    KILN_GGUF_FLOAT32 = 6,
    KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9,
    KILN_GGUF_UINT64 = 10,
    KILN_GGUF_INT64 = 11,
    KILN_GGUF_FLOAT64 = 12,
} kiln_gguf_type;

/** A length-counted string, NUL-terminated for convenience (may contain NULs). */
typedef struct kiln_gguf_str {
    char *data;
    uint64_t len;
} kiln_gguf_str;

typedef struct kiln_gguf_value kiln_gguf_value;
struct kiln_gguf_value {
    kiln_gguf_type type;
    union {
        uint64_t u64;      /* UINT8/16/32/64 */
        int64_t i64;       /* INT8/16/32/64 */
        double f64;        /* FLOAT32/64 */
        bool b;            /* BOOL */
        kiln_gguf_str str; /* STRING */
        struct {
            kiln_gguf_type elem_type;
            uint64_t n;
            /* elem_type STRING: kiln_gguf_str[n]; ARRAY: kiln_gguf_value[n];
             * otherwise a packed little-endian array of the element's C type
             * (uint8_t, int8_t, ..., float, double, bool as uint8_t). */
            void *data;
        } arr; /* ARRAY */
    };
};

typedef struct kiln_gguf_kv {
    char *key;
    kiln_gguf_value value;
} kiln_gguf_kv;

typedef struct kiln_gguf_tensor {
    char *name;
    kiln_dtype dtype;
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* GGML order: ne[0] is the innermost (contiguous) dim; unused = 1 */
    uint64_t offset;  /* relative to the start of the data section */
    const void *data; /* points into the mapping */
    size_t nbytes;
} kiln_gguf_tensor;

typedef struct kiln_gguf {
    char *path; /* owned; "<memory>" names for in-memory buffers */
    uint32_t version;
    uint64_t alignment; /* general.alignment, default 32 */
    size_t n_kv;
    kiln_gguf_kv *kv;
    size_t n_tensors;
    kiln_gguf_tensor *tensors;
    size_t data_offset; /* file offset of the tensor data section */
    const void *base;   /* start of the file bytes */
    size_t size;        /* file size */
    void *owned_map;    /* kiln_mapped_file*, or NULL for in-memory buffers */
} kiln_gguf;

/**
 * Open and validate a GGUF file (GGUF spec, ggml/docs/gguf.md; versions 1-3, little-endian).
 * Every count, size and offset is checked against the file size (overflow-safe) before
 * anything is allocated from it. Rules enforced:
 *   - magic "GGUF"; version 1..3; keys and tensor names unique and free of NUL bytes;
 *   - value type tags 0..12; bools 0 or 1; arrays nested at most 8 levels deep;
 *   - general.alignment (any integer type) a non-zero power of two, default 32;
 *   - tensors: n_dims 1..4, every ne >= 1, ne[0] a multiple of the dtype's block size,
 *     nbytes = row_size(ne[0]) * ne[1] * ne[2] * ne[3] (no overflow), offset a multiple of
 *     the alignment, [data_offset + offset, + nbytes) inside the file. Overlaps are allowed.
 * data_offset is the first multiple of the alignment after the tensor infos; in a file
 * without tensors (a vocabulary-only GGUF) that may end right after the metadata, it is
 * clamped to the file size.
 * Errors (message names the file, the field - "header.n_kv", "key 'x'", "tensor 'y'" - and
 * the byte offset):
 *   KILN_ERR_IO (cannot open/map, or a directory), KILN_ERR_FORMAT (bad magic, truncation,
 *   bad counts, bad type tags, out-of-range offsets, duplicate names), KILN_ERR_UNSUPPORTED
 *   (version > 3, tensor dtype kiln does not implement: the message gives the dtype id, its
 *   GGML name and the tensor), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_gguf_open(const char *path, kiln_gguf **out, kiln_error *err);

/** As kiln_gguf_open over a caller-owned buffer that must outlive the result (fuzzing,
 *  tests). `name` (NULL: "<memory>") is used in messages and copied to g->path. */
kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out,
                                  kiln_error *err);

/** Free everything. NULL is a no-op. */
void kiln_gguf_close(kiln_gguf *g);

/** Metadata lookup by exact key; NULL when absent. */
const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf *g, const char *key);
/** Tensor lookup by exact name; NULL when absent. */
const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name);

/*
 * Typed getters. Each returns false when the key is absent or not convertible: integer
 * getters accept any integer type whose value fits (and BOOL), float getters accept
 * FLOAT32/64 and integers. The output is untouched on false.
 */
bool kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out);
bool kiln_gguf_get_u32(const kiln_gguf *g, const char *key, uint32_t *out);
bool kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out);
bool kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out);
/** Borrowed string (owned by g); NULL when absent or not a string. */
const kiln_gguf_str *kiln_gguf_get_str(const kiln_gguf *g, const char *key);
/** Borrowed array value; NULL when absent or not an array. */
const kiln_gguf_value *kiln_gguf_get_arr(const kiln_gguf *g, const char *key);

#endif
