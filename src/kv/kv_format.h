/*
 * kv_format.h - KV page formats: one row of a traits table per format (DESIGN.md "Page
 * formats"), as the dtype traits table has one row per weight dtype. A format says how one
 * position's K (or V) row of kv_dim elements is laid out in a page, how many bytes it takes,
 * how a row is written from f32, and how attention reads it (its operand kind).
 *
 * Formats today: f32, f16 and bf16 rows of plain elements. Quantized formats (q8_0, q4_0,
 * TurboQuant) are further rows (the KV-formats issue). A format is identified by its
 * kiln_dtype id, which is what the block pool stores per block (kiln_kv_pool_block_format).
 */
#ifndef KILN_KV_KV_FORMAT_H
#define KILN_KV_KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

/** How attention reads a format's rows (the operand rounding it computes with). */
typedef enum kiln_kv_operand {
    /* f32 rows: q . k and p . v in f32 */
    KILN_KV_OPERAND_F32 = 0,
    /* f16 rows: q rounded to f16 before q . k, softmax probabilities rounded to f16 before
     * they weight v, f32 accumulation (an f16 matmul pipeline: llama.cpp's CPU path with an
     * f16 cache; FlashAttention-2 casts P to half before P V) */
    KILN_KV_OPERAND_F16 = 1,
    /* bf16 rows: the same pipeline with bf16 rounding (round to nearest even) of q and of the
     * probabilities; bf16 -> f32 widening is exact */
    KILN_KV_OPERAND_BF16 = 2,
} kiln_kv_operand;

typedef struct kiln_kv_format_traits {
    kiln_dtype dtype;  /* the format's id */
    const char *name;  /* "f32", "f16", "bf16" */
    size_t elem_bytes; /* bytes per element of a plain-row format */
    kiln_kv_operand operand;
    /** dst row (row_bytes(n) bytes) = src [n] f32 converted (f16/bf16: round to nearest even,
     *  kiln_fp32_to_fp16 / kiln_fp32_to_bf16). */
    void (*write_row)(void *dst, const float *src, int64_t n);
    /** dst [n] f32 = the row's values (exact widening). */
    void (*read_row)(const void *src, float *dst, int64_t n);
} kiln_kv_format_traits;

/** The traits of format t, or NULL when t is not a KV page format. */
const kiln_kv_format_traits *kiln_kv_format_of(kiln_dtype t);

/** Bytes of one row of n elements in format t; 0 when t is not a format, n < 1 or the size
 *  overflows. */
size_t kiln_kv_format_row_bytes(kiln_dtype t, int64_t n);

#endif
