/*
 * gguf_write.h - GGUF v3 writer.
 *
 * Source: the GGUF specification (ggml/docs/gguf.md). The file is, in order: magic "GGUF",
 * version (u32 = 3), tensor count (u64), metadata count (u64); the metadata key/value pairs
 * (key as u64 length + bytes, u32 type tag, value; arrays as u32 element type + u64 count +
 * elements, nested arrays allowed); the tensor infos (name, u32 n_dims, u64 ne[n_dims] with
 * ne[0] innermost, u32 ggml type, u64 offset relative to the data section); zero padding to
 * the alignment; the tensor data, each tensor starting at a multiple of the alignment
 * (general.alignment, default 32) and padded with zeros to the next multiple.
 *
 * Usage: create a writer, set metadata and declare tensors (any order; metadata keeps the
 * order in which keys were first set), then either hand all data at once
 * (kiln_gguf_writer_write_file) or stream it: kiln_gguf_writer_begin, then the bytes of the
 * tensors in declaration order through kiln_gguf_writer_write_data / _write_rows (any chunk
 * sizes), then kiln_gguf_writer_finish. Nothing holds more than one chunk of tensor data.
 *
 * Atomicity: the file is written to "<path>.tmp" and renamed onto <path> by _finish, so a
 * failed write (a full disk, a file size limit, a missing tensor) returns an error and leaves
 * neither <path> nor the temporary file behind; an existing <path> stays untouched. When
 * <path> exists and is not a regular file (a character device such as /dev/null or
 * /dev/full, a FIFO), the writer writes to it directly, without a temporary file.
 *
 * Conventions for llama.cpp compatibility are the caller's (key names and types); the writer
 * enforces what the format and ggml require: keys non-empty, <= 65535 bytes, without NUL,
 * unique (setting a key again replaces its value in place); tensor names unique, 1..63 bytes
 * (ggml's GGML_MAX_NAME is 64 with the NUL), without NUL; 1..4 dims, every ne >= 1, ne[0] a
 * multiple of the dtype's block size.
 */
#ifndef KILN_FORMAT_GGUF_WRITE_H
#define KILN_FORMAT_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "kiln.h"
#include "tensor/dtype.h"
#include "util/threadpool.h"

typedef struct kiln_gguf_writer kiln_gguf_writer;

/** A new, empty writer (no metadata, no tensors, alignment 32).
 *  Errors: KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_gguf_writer_create(kiln_gguf_writer **out, kiln_error *err);

/** Free the writer. A file begun and not finished is abandoned: its temporary file is
 *  removed (the target path is never touched). NULL is a no-op. */
void kiln_gguf_writer_destroy(kiln_gguf_writer *w);

/* ---- metadata ------------------------------------------------------------------------ */

/**
 * Set `key` to a deep copy of `v` (any type, including string arrays and nested arrays, in
 * the layout of kiln_gguf_value from gguf.h; packed scalar arrays hold the element's C type,
 * BOOL as uint8_t 0/1). Scalars are range-checked against their type (a UINT8 value > 255
 * is refused). Setting "general.alignment" also sets the data alignment: it must then be an
 * integer type holding a power of two in [1, 2^30].
 * Errors: KILN_ERR_INVALID_ARGUMENT (bad key, bad type tag, value out of range, bool not
 * 0/1, alignment not a power of two, writing already begun), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_gguf_writer_set(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v,
                                 kiln_error *err);

/** Typed setters: as kiln_gguf_writer_set with a scalar of the named GGUF type. */
kiln_status kiln_gguf_writer_set_u8(kiln_gguf_writer *w, const char *key, uint8_t v,
                                    kiln_error *err);
kiln_status kiln_gguf_writer_set_i8(kiln_gguf_writer *w, const char *key, int8_t v,
                                    kiln_error *err);
kiln_status kiln_gguf_writer_set_u16(kiln_gguf_writer *w, const char *key, uint16_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_i16(kiln_gguf_writer *w, const char *key, int16_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_i32(kiln_gguf_writer *w, const char *key, int32_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_i64(kiln_gguf_writer *w, const char *key, int64_t v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_f32(kiln_gguf_writer *w, const char *key, float v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_f64(kiln_gguf_writer *w, const char *key, double v,
                                     kiln_error *err);
kiln_status kiln_gguf_writer_set_bool(kiln_gguf_writer *w, const char *key, bool v,
                                      kiln_error *err);
/** A NUL-terminated UTF-8 string value (GGUF strings are not NUL-terminated on disk). */
kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *v,
                                     kiln_error *err);

/**
 * An array of n scalars of type elem (UINT8..FLOAT64, BOOL) packed in the element's C type
 * (bool as uint8_t 0/1). For string arrays use kiln_gguf_writer_set_str_array; for nested
 * arrays, kiln_gguf_writer_set with a kiln_gguf_value. n may be 0 (data may then be NULL).
 * Errors: as kiln_gguf_writer_set (KILN_ERR_INVALID_ARGUMENT for STRING/ARRAY elements).
 */
kiln_status kiln_gguf_writer_set_array(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem,
                                       const void *data, uint64_t n, kiln_error *err);

/** An array of n NUL-terminated strings. Errors: as kiln_gguf_writer_set. */
kiln_status kiln_gguf_writer_set_str_array(kiln_gguf_writer *w, const char *key,
                                           const char *const *strs, uint64_t n, kiln_error *err);

/** Remove `key`; false when it was not set. Removing "general.alignment" restores 32. */
bool kiln_gguf_writer_remove(kiln_gguf_writer *w, const char *key);

/** The value set for `key` (borrowed, valid until the key changes), or NULL. */
const kiln_gguf_value *kiln_gguf_writer_get(const kiln_gguf_writer *w, const char *key);

/**
 * Copy every metadata pair of `src` whose key starts with `prefix` (NULL or "": all of
 * them), in src's order, replacing keys already set. Errors: as kiln_gguf_writer_set.
 */
kiln_status kiln_gguf_writer_copy_kv(kiln_gguf_writer *w, const kiln_gguf *src, const char *prefix,
                                     kiln_error *err);

/**
 * llama.cpp's general.file_type (enum llama_ftype, llama.h) for a file whose weight matrices
 * are stored as `t`: F32 0 (ALL_F32), F16 1, Q4_0 2, Q8_0 7, Q4_K 15 (MOSTLY_Q4_K_M, what
 * llama-quantize's "Q4_K" alias names), Q6_K 18, BF16 32. Returns UINT32_MAX for other types.
 */
uint32_t kiln_gguf_file_type(kiln_dtype t);

/**
 * Set general.file_type (u32, kiln_gguf_file_type(t)) and, when t is block-quantized,
 * general.quantization_version = 2 (u32), the ggml quantization format revision llama.cpp
 * writes (GGML_QNT_VERSION); for plain types the latter key is removed.
 * Errors: KILN_ERR_INVALID_ARGUMENT (t has no file type), as kiln_gguf_writer_set.
 */
kiln_status kiln_gguf_writer_set_file_type(kiln_gguf_writer *w, kiln_dtype t, kiln_error *err);

/** Data alignment in bytes (general.alignment, default 32). */
uint64_t kiln_gguf_writer_alignment(const kiln_gguf_writer *w);

/* ---- tensors ------------------------------------------------------------------------- */

/**
 * Declare a tensor: name, dtype (any kiln dtype with traits), n_dims 1..4 and ne[n_dims] in
 * GGML order (ne[0] innermost, contiguous). Its data comes in declaration order.
 * Errors: KILN_ERR_INVALID_ARGUMENT (bad or duplicate name, dims, ne[0] not a multiple of the
 * block size, size overflow, writing already begun), KILN_ERR_UNSUPPORTED (dtype without
 * traits), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_dtype dtype,
                                        uint32_t n_dims, const int64_t *ne, kiln_error *err);

/** Number of tensors declared. */
size_t kiln_gguf_writer_n_tensors(const kiln_gguf_writer *w);

/** Bytes of tensor i's data (row_size(ne[0]) * ne[1] * ne[2] * ne[3]); 0 when out of range. */
uint64_t kiln_gguf_writer_tensor_nbytes(const kiln_gguf_writer *w, size_t i);

/* ---- writing ------------------------------------------------------------------------- */

/**
 * Open "<path>.tmp" (or <path> itself when it exists and is not a regular file) and write
 * the header, the metadata, the tensor infos and the padding before the data section. After
 * this, metadata and tensors can no longer change.
 * Errors: KILN_ERR_IO (cannot create, write failed; errno text in the message),
 * KILN_ERR_INVALID_ARGUMENT (already begun, path too long), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_gguf_writer_begin(kiln_gguf_writer *w, const char *path, kiln_error *err);

/**
 * Append n bytes of tensor data, continuing the current tensor and moving on to the next
 * one (with its alignment padding) when a tensor is complete. Chunks may span tensors.
 * Errors: KILN_ERR_INVALID_ARGUMENT (not begun, more bytes than the declared tensors hold),
 * KILN_ERR_IO (write failed: the temporary file is removed and the writer is dead; every
 * later call fails with KILN_ERR_IO).
 */
kiln_status kiln_gguf_writer_write_data(kiln_gguf_writer *w, const void *data, size_t n,
                                        kiln_error *err);

/** Produces row `row` (0-based within the current tensor, ne[0] floats) into out. Called
 *  concurrently from the pool's threads: it must be thread-safe. */
typedef void (*kiln_gguf_row_fn)(void *ctx, int64_t row, float *out);

/**
 * Append n_rows rows of the current tensor, each produced as ne[0] floats by fn and
 * converted to the tensor's dtype with its reference quantizer (kiln_dtype_traits
 * from_float; F32 copies). The tensor must be at a row boundary and have n_rows rows left
 * (rows count all dims but ne[0]). Rows are produced in chunks of a few MB spread over the
 * threads of tp (NULL: the calling thread); the output bytes do not depend on tp.
 * Errors: KILN_ERR_INVALID_ARGUMENT (not begun, no current tensor, not at a row boundary,
 * too many rows, dtype without a quantizer), KILN_ERR_IO, KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_gguf_writer_write_rows(kiln_gguf_writer *w, kiln_gguf_row_fn fn, void *ctx,
                                        int64_t n_rows, kiln_threadpool *tp, kiln_error *err);

/**
 * Finish: check that every declared tensor got all its bytes, flush, fsync (regular files),
 * close, and rename the temporary file onto the target path.
 * Errors: KILN_ERR_INVALID_ARGUMENT (not begun, tensor data incomplete: names the tensor),
 * KILN_ERR_IO (flush/fsync/close/rename failed). On error nothing is left at the target path
 * (an existing file there is untouched) and the temporary file is removed.
 */
kiln_status kiln_gguf_writer_finish(kiln_gguf_writer *w, kiln_error *err);

/**
 * Convenience: begin, write data[i] (kiln_gguf_writer_tensor_nbytes(w, i) bytes) for every
 * tensor, finish. Errors: as the three calls.
 */
kiln_status kiln_gguf_writer_write_file(kiln_gguf_writer *w, const char *path,
                                        const void *const *data, kiln_error *err);

#endif
