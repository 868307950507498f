/*
 * dtype.h - element types and their block formats: one row of traits per dtype
 * (in the style of ggml's type-traits table), never a switch in every kernel.
 *
 * The enum values equal GGML's `ggml_type` ids, so a GGUF tensor's type field maps
 * directly (source: ggml/include/ggml.h, GGUF spec in ggml/docs/gguf.md).
 * Block layouts are GGML's (ggml-common.h): Q4_0/Q8_0 blocks of 32, Q4_K/Q6_K
 * super-blocks of 256.
 */
#ifndef KILN_TENSOR_DTYPE_H
#define KILN_TENSOR_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_Q4_0 = 2,
    KILN_DTYPE_Q8_0 = 8,
    KILN_DTYPE_Q4_K = 12,
    KILN_DTYPE_Q6_K = 14,
    KILN_DTYPE_I32 = 26,
    KILN_DTYPE_BF16 = 30,
    KILN_DTYPE_COUNT = 40 /* size of id space covered by the traits table */
} kiln_dtype;

/** Per-dtype traits. Function pointers are the scalar reference implementations. */
typedef struct kiln_dtype_traits {
    /* GGML spelling: "f32", "f16", "q4_0", "q8_0", "q4_K", "q6_K", "bf16", "i32" */
    const char *name;
    int32_t block_size; /* elements per block (1 for plain types) */
    size_t type_size;   /* bytes per block */
    bool is_quantized;
    /* Dequantize n elements (n % block_size == 0) from src to dst. NULL for I32. */
    void (*to_float)(const void *src, float *dst, int64_t n);
    /* Reference quantizer: n elements (n % block_size == 0) from src to dst. NULL for I32.
     * Not llama.cpp's search: scales are rounded up (to fp16, and to the 6/8-bit codes of
     * the K types) before the quants are picked, which bounds the error per element by half
     * a quant step (Q4_0: a full step at the clamped extreme); bounds in dtype.c. Block
     * rows (src of to_float, dst of from_float) must be 2-byte aligned. */
    void (*from_float)(const float *src, void *dst, int64_t n);
} kiln_dtype_traits;

/** Traits of `t`, or NULL when kiln does not support `t` (unknown or unimplemented id). */
const kiln_dtype_traits *kiln_dtype_traits_of(int32_t t);

/** Name of dtype id `t`, "unknown" when unsupported. Never NULL. */
const char *kiln_dtype_name(int32_t t);

/**
 * Bytes needed for a row of n elements of dtype t. Returns 0 when t is unsupported,
 * n is not a multiple of the block size, or the size would overflow.
 */
size_t kiln_dtype_row_size(kiln_dtype t, int64_t n);

/** IEEE half <-> float (round-to-nearest-even on the way down). */
float kiln_fp16_to_fp32(uint16_t h);
uint16_t kiln_fp32_to_fp16(float f);
/** bfloat16 <-> float (round-to-nearest-even on the way down; NaN stays NaN). */
float kiln_bf16_to_fp32(uint16_t h);
uint16_t kiln_fp32_to_bf16(float f);

/*
 * GGML block structs (ggml-common.h layouts; all fields are byte-aligned, sizes 18, 34, 144
 * and 210 bytes). fp16 fields hold IEEE half bits; decode with kiln_fp16_to_fp32.
 */
typedef struct kiln_block_q4_0 {
    uint16_t d;     /* scale */
    uint8_t qs[16]; /* elem j < 16: (qs[j] & 15) - 8; elem j >= 16: (qs[j-16] >> 4) - 8 */
} kiln_block_q4_0;

typedef struct kiln_block_q8_0 {
    uint16_t d;    /* scale */
    int8_t qs[32]; /* elem j: qs[j] */
} kiln_block_q8_0;

typedef struct kiln_block_q4_k {
    uint16_t d;         /* scale of the 6-bit sub-block scales */
    uint16_t dmin;      /* scale of the 6-bit sub-block mins */
    uint8_t scales[12]; /* 8 scales + 8 mins, 6 bits each (see kiln_q4k_scale_min) */
    uint8_t qs[128];    /* chunk c of 64 elems: qs[32c+l] low nibble = elem 64c+l, high = +32 */
} kiln_block_q4_k;

typedef struct kiln_block_q6_k {
    uint8_t ql[128];   /* low 4 bits of the quants */
    uint8_t qh[64];    /* high 2 bits of the quants */
    int8_t scales[16]; /* one per 16 elements */
    uint16_t d;        /* super-block scale */
} kiln_block_q6_k;

_Static_assert(sizeof(kiln_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(kiln_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(kiln_block_q4_k) == 144, "q4_K block size");
_Static_assert(sizeof(kiln_block_q6_k) == 210, "q6_K block size");

/**
 * Q8_0 quantization of activations with the semantics of ggml's quantize_row_q8_0_ref (the
 * activation quantizer llama.cpp applies before Q8_0 and Q4_0 weight dot products; read for
 * semantics, this is an independent implementation). n % 32 == 0; x: n floats; y: n / 32
 * blocks (2-byte aligned). Per block of 32:
 *   amax = max |x_j|;  d = amax / 127 (f32 division);  id = d != 0 ? 1 / d : 0;
 *   y.d = fp16(d) (round to nearest even);  y.qs[j] = (int8) roundf(x_j * id)
 * (roundf: halfway cases away from zero; id is the f32 d, not the fp16 one, so the stored
 * scale and the quants can disagree by the fp16 rounding of d, as in ggml). |qs| <= 127.
 * Inputs ggml leaves undefined are defined here: a block holding an Inf or NaN gets
 * d = fp16 NaN (0x7E00) and qs = 0 (so dot products with it are NaN); a block whose d is
 * below FLT_MIN (amax < 127 * FLT_MIN, where 1 / d would overflow) gets d = fp16(d) = 0
 * and qs = 0 (its dot contribution is 0 either way). amax / 127 above 65504 stores an
 * fp16 Inf, as ggml does.
 */
void kiln_quantize_q8_0_act(const float *x, kiln_block_q8_0 *y, int64_t n);

/**
 * Sub-block j (0..7) scale and min of a Q4_K super-block from its 12 packed bytes s, as
 * GGML's get_scale_min_k4: j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15)
 * | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
 */
void kiln_q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m);

#endif
