/*
 * safetensors.h - safetensors reader (single file, or sharded through
 * model.safetensors.index.json). Source: huggingface/safetensors format docs: an 8-byte
 * little-endian header length N, an N-byte JSON header mapping tensor names to
 * {dtype, shape, data_offsets:[begin,end]} (offsets relative to the byte after the
 * header) plus an optional "__metadata__" string map. Data is mmap'd, never copied.
 */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "tensor/dtype.h"

#define KILN_ST_MAX_DIMS 8

typedef struct kiln_st_tensor {
    char *name;
    kiln_dtype dtype;                /* F32, F16, BF16 or I32 */
    int32_t n_dims;                  /* 0..KILN_ST_MAX_DIMS */
    int64_t shape[KILN_ST_MAX_DIMS]; /* row-major, outermost first (PyTorch order) */
    const void *data;                /* into the mapping of the shard holding it */
    size_t nbytes;
    int32_t shard; /* index into the shard list */
} kiln_st_tensor;

typedef struct kiln_safetensors {
    size_t n_tensors;
    kiln_st_tensor *tensors;
    size_t n_shards;
    void **shards;      /* kiln_mapped_file* per shard (NULL entries for memory buffers) */
    char **shard_paths; /* owned */
    size_t n_meta;      /* "__metadata__" entries of the first shard */
    char **meta_keys, **meta_values;
} kiln_safetensors;

/**
 * Open `path`: a .safetensors file, a model.safetensors.index.json (any *.json path is read
 * as an index), or a directory. A directory resolves to its model.safetensors.index.json,
 * else model.safetensors, else its only *.safetensors file (several without an index, or
 * none: KILN_ERR_NOT_FOUND).
 * Index: "weight_map" maps tensor name -> shard file relative to the index's directory
 * (absolute paths and ".." components are refused). Shards are opened in sorted order
 * (shard indices follow that order); every weight_map entry must name a tensor held by that
 * shard, and no tensor may appear in two shards. Metadata comes from the first shard.
 * Per file: header length N <= file size - 8 and <= 100 MB; JSON well-formed, an object,
 * no duplicate keys; known dtype (F32, F16, BF16, I32; others -> KILN_ERR_UNSUPPORTED
 * naming the dtype, e.g. "F64"); shape of <= 8 non-negative integers (more dims:
 * UNSUPPORTED); data_offsets [begin, end] with begin <= end <= data section size, and
 * shape product * dtype size == end - begin (overflow-checked). Overlaps and holes are not
 * checked. Data pointers are not necessarily aligned to the element size.
 * Errors name the file, the tensor/field and the byte offset: KILN_ERR_IO,
 * KILN_ERR_FORMAT, KILN_ERR_UNSUPPORTED, KILN_ERR_NOT_FOUND (no safetensors in a
 * directory), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out, kiln_error *err);

/** Parse one safetensors file image held in memory (for fuzzing). Buffer must outlive result. */
kiln_status kiln_safetensors_open_memory(const void *data, size_t size, const char *name,
                                         kiln_safetensors **out, kiln_error *err);

/** Free everything. NULL is a no-op. */
void kiln_safetensors_close(kiln_safetensors *st);

/** Tensor lookup by exact name; NULL when absent. */
const kiln_st_tensor *kiln_safetensors_find(const kiln_safetensors *st, const char *name);

#endif
