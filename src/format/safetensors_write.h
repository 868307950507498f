/* safetensors_write.h - write a safetensors file (format: huggingface/safetensors docs). */
#ifndef KILN_FORMAT_SAFETENSORS_WRITE_H
#define KILN_FORMAT_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "tensor/dtype.h"

typedef struct kiln_st_out_tensor {
    const char *name;
    kiln_dtype dtype;     /* F32, F16, BF16 or I32 */
    int32_t n_dims;       /* 1..8 */
    const int64_t *shape; /* row-major, outermost first */
    const void *data;
} kiln_st_out_tensor;

/**
 * Write tensors in order to `path` (the header JSON is padded with spaces to a multiple of
 * 8 bytes). The file is written to path.tmp and renamed, so a failed write (full disk)
 * never leaves a truncated file behind; an existing target that is not a regular file (a
 * device, a FIFO, a symlink) is written in place instead of being replaced. Errors:
 * KILN_ERR_INVALID_ARGUMENT (bad dtype or shape), KILN_ERR_IO (with errno text),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_safetensors_write(const char *path, const kiln_st_out_tensor *tensors, size_t n,
                                   kiln_error *err);

#endif
