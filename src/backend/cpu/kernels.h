/*
 * kernels.h - internal: the per-(dtype, path) kernel tables behind cpu.h.
 *
 * Every path provides, for each weight dtype it supports, a one-token dot product and,
 * optionally, a tile kernel that computes the dots of up to max_rows weight rows with up to
 * max_tok activation rows at once (each weight decoded once per tile, each activation
 * vector loaded once per tile). The tile kernel must be bit-identical, per (row, token), to
 * the one-token dot: it performs the same floating-point operations in the same order for
 * every (row, token) pair, only interleaved (batch invariance, DESIGN.md principle 3).
 */
#ifndef KILN_BACKEND_CPU_KERNELS_H
#define KILN_BACKEND_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu.h"

/**
 * out[k * ntok + r] = dot(w + k * row_stride, x + r * ldx) for k < nrows (1..max_rows),
 * r < ntok (1..max_tok); n elements per row, x rows f32 with stride ldx floats.
 */
typedef void (*kiln_vec_dot_tile_fn)(int64_t n, const void *w, size_t row_stride, int nrows,
                                     const float *x, int64_t ldx, int ntok, float *out);

/* For the gemv kernels: prefetch (NTA: streamed weights are read once) the cache lines of
 * the ub bytes at w + off + pf, where off is the byte offset of a decode unit in the row at
 * w. A unit shorter than a line prefetches one line, and only where it starts a new line
 * counted from the row start. That requests every line once when w + pf is 64-byte aligned,
 * or when ub is 32 and it is 32-byte aligned (F16/BF16 rows in GGUF files); for 18- and
 * 34-byte units (Q4_0/Q8_0 blocks with f32 activations, not the default) at other alignments
 * some lines are left to the hardware prefetcher. Deciding by the absolute address instead
 * requests every line in all cases but measured 7% slower F16 decode here (A/B pairs, 2
 * threads), so the cheaper test stays. No arithmetic: outputs do not depend on it. The
 * caller keeps the addresses inside its weight. */
static inline __attribute__((always_inline)) void kiln_prefetch_unit(const uint8_t *w, size_t off,
                                                                     size_t ub, size_t pf) {
    if (ub < 64 && off != 0 && (off & ~(size_t)63) == ((off - ub) & ~(size_t)63)) return;
    for (size_t j = 0; j < ub; j += 64) __builtin_prefetch(w + off + pf + j, 0, 0);
}

/**
 * out[k] = dot(w + k * row_stride, x) for k < nrows: one token against consecutive rows, each
 * row read start to end before the next (one sequential stream, which the hardware
 * prefetchers follow best), with a software prefetch pf bytes ahead of the read position
 * (0: none; the caller keeps w + nrows * row_stride + pf inside the weight). Bit-identical
 * to dot per row (each row runs the path's 1 x 1 tile body).
 */
typedef void (*kiln_vec_dot_gemv_fn)(int64_t n, const void *w, size_t row_stride, int64_t nrows,
                                     const float *x, float *out, size_t pf);

/* NAME##_gemv (a gemv kernel whose activation pointer has type XT) from the 1-row, 1-token
 * body call with the prefetch (WITH) and without it (WITHOUT); both may use n, wk (the row),
 * x, out, k and pf. The two calls differ only by the constant-0 prefetch distance, which the
 * compiler folds away. */
#define KILN_GEMV_LOOP(NAME, XT, WITH, WITHOUT)                                                    \
    static void NAME##_gemv(int64_t n, const void *w, size_t rs, int64_t nrows, XT x, float *out,  \
                            size_t pf) {                                                           \
        for (int64_t k = 0; k < nrows; k++) {                                                      \
            const uint8_t *wk = (const uint8_t *)w + (size_t)k * rs;                               \
            if (pf)                                                                                \
                WITH;                                                                              \
            else                                                                                   \
                WITHOUT;                                                                           \
        }                                                                                          \
    }

/* NAME##_gemv from a tile body NAME##_body(n, w, rs, x, ldx, NR, R, out, PF) */
#define KILN_GEMV_FN(NAME)                                                                         \
    KILN_GEMV_LOOP(NAME, const float *, NAME##_body(n, wk, rs, x, 0, 1, 1, out + k, pf),           \
                   NAME##_body(n, wk, rs, x, 0, 1, 1, out + k, 0))

typedef struct kiln_cpu_kernel {
    kiln_vec_dot_fn dot;
    kiln_vec_dot_tile_fn tile; /* NULL: the matmul calls dot once per (row, token) */
    int max_rows, max_tok;
    kiln_vec_dot_gemv_fn gemv; /* optional: one-token products (decode) */
} kiln_cpu_kernel;

/* Kernel of dtype t on each path, or NULL when the path has none (or is not compiled). */
const kiln_cpu_kernel *kiln_cpu_kernel_scalar(kiln_dtype t);
const kiln_cpu_kernel *kiln_cpu_kernel_avx2(kiln_dtype t);
const kiln_cpu_kernel *kiln_cpu_kernel_avx512(kiln_dtype t);

/* The kernel for (t, path) when the path is supported by this CPU, else NULL. */
const kiln_cpu_kernel *kiln_cpu_kernel_get(kiln_dtype t, kiln_simd path);

/* ---------------------------------------------------------------- packed F16 (cpu.h) */

/*
 * One group of a KILN_LAYOUT_F16_R64 weight (g: its first byte, 64 * n * 2 bytes; 64-byte
 * alignment is for speed, any address works) against ntok (1..max_tok) activation rows x + r * ldx:
 *   y[r * ldy + j] = sum over k of w[j][k] * x[r * ldx + k] for lo <= j < hi (0 <= lo < hi
 *   <= 64), in cpu.h's order; other y entries untouched.
 * pf > 0 adds an NTA software prefetch pf bytes ahead of the read position in the group's
 * stream, issued only for addresses below pf_end (the end of the weight); it does no
 * arithmetic.
 */
typedef void (*kiln_r64_tile_fn)(int64_t n, const uint8_t *g, const float *x, int64_t ldx, int ntok,
                                 float *y, int64_t ldy, int lo, int hi, const uint8_t *pf_end,
                                 size_t pf);

typedef struct kiln_cpu_r64_kernel {
    kiln_r64_tile_fn tile;
    int max_tok;
} kiln_cpu_r64_kernel;

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_scalar(void);
const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx2(void);   /* NULL when not compiled */
const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx512(void); /* NULL when not compiled */

/* The packed-F16 kernel for path when the path is supported by this CPU, else NULL. */
const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_get(kiln_simd path);

/* ---------------------------------------------------------------- q8 activations */

/* Byte offsets inside one quantized activation row (layout in cpu.h). */
static inline int64_t kiln_q8_nbp(int64_t n) {
    return ((n / 32 + 15) / 16) * 16;
}
#define KILN_Q8_D_OFF(nbp)   ((size_t)(nbp)*32)
#define KILN_Q8_SUM_OFF(nbp) ((size_t)(nbp)*36)

/*
 * out[k * ntok + r] = q8 dot of weight row k (w + k * row_stride) with quantized activation
 * row r (xq + r * xq_stride) for k < nrows (1..max_rows), r < ntok (1..max_tok); each bit
 * identical to the one-token dot (cpu.h fixes the order).
 */
typedef void (*kiln_q8_tile_fn)(int64_t n, const void *w, size_t row_stride, int nrows,
                                const uint8_t *xq, size_t xq_stride, int ntok, float *out);

/* out[k] = q8 dot of weight row k (w + k * row_stride) with quantized row xq, k < nrows
 * (1..8), for rows of fewer than 16 blocks (n < 512); bit-identical to the dot */
typedef void (*kiln_q8_small_fn)(int64_t n, const void *w, size_t row_stride, int nrows,
                                 const uint8_t *xq, float *out);

/*
 * Packed weights (prefill): pack rewrites nrows weight rows (w + k * row_stride) into dst,
 * packed_row_bytes(n) per row, in the kernel's own register-ready form (AVX-512: packed row
 * k at dst + k * packed_row_bytes(n), its full 16-block groups transposed, 576 bytes each;
 * AVX2: groups of pmax_rows = 8 rows with the rows in lanes, group g at
 * dst + 8 g * packed_row_bytes(n), a partial last group zero padded); ptile then computes
 * out[k * ntok + r] for k < nrows (1..pmax_rows), r < ntok (1..pmax_tok) from the packed rows
 * at pk (a multiple of pmax_rows rows into the panel; stride packed_row_bytes) and, for any
 * blocks the packed form leaves out, the original rows. Packing is done once per panel of rows and reused by every token tile,
 * and each (row, token) is still bit-identical to the one-token dot.
 */
typedef size_t (*kiln_q8_packed_bytes_fn)(int64_t n);
typedef void (*kiln_q8_pack_fn)(int64_t n, const void *w, size_t row_stride, int nrows,
                                uint8_t *dst);
typedef void (*kiln_q8_ptile_fn)(int64_t n, const uint8_t *pk, size_t pk_stride, const void *w,
                                 size_t row_stride, int nrows, const uint8_t *xq, size_t xq_stride,
                                 int ntok, float *out);

/* kiln_vec_dot_gemv_fn for a quantized activation row xq (bit-identical to dot per row) */
typedef void (*kiln_q8_gemv_fn)(int64_t n, const void *w, size_t row_stride, int64_t nrows,
                                const uint8_t *xq, float *out, size_t pf);

typedef struct kiln_cpu_q8_kernel {
    kiln_vec_dot_q8_fn dot;
    kiln_q8_tile_fn tile; /* NULL: one dot per (row, token) */
    int max_rows, max_tok;
    kiln_q8_small_fn small; /* NULL: short rows use tile / dot too */
    /* NULL: no packed path */
    kiln_q8_packed_bytes_fn packed_row_bytes;
    kiln_q8_pack_fn pack;
    kiln_q8_ptile_fn ptile;
    int pmax_rows, pmax_tok;
    kiln_q8_gemv_fn gemv; /* optional: one-token products (decode) */
    int pmin_tok; /* fewest tokens for the packed path (0: matmul.c's default, 32) */
} kiln_cpu_q8_kernel;

/* Per path: q8 kernel of weight dtype t (NULL if none) and the row quantizer of the path's
 * layout (n % 32 == 0, one row). avx512: vnni selects vpdpbusd or the AVX-512BW kernels;
 * avx2: vnni (AVX-VNNI) selects vpdpbusd on ymm for the packed panels, else vpmaddubsw. */
const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_scalar(kiln_dtype t);
const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx2(kiln_dtype t, bool vnni);
const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx512(kiln_dtype t, bool vnni);
void kiln_cpu_q8_quantize_row_avx2(int64_t n, const float *x, uint8_t *dst);
void kiln_cpu_q8_quantize_row_avx512(int64_t n, const float *x, uint8_t *dst);

/* Reference row quantizer into either layout (t16 = the AVX-512 transposed one); q8_ref.c. */
void kiln_cpu_q8_quantize_row_ref(int64_t n, const float *x, uint8_t *dst, bool t16);

/* Whether path's q8 rows use the t16 (AVX-512 transposed) layout (cpu.h). */
static inline bool kiln_cpu_q8_layout_t16(kiln_simd path) {
    return path == KILN_SIMD_AVX512;
}

/* The q8 kernel for (t, path) when supported here (AVX-512: VNNI per kiln_cpu_use_vnni). */
const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_get(kiln_dtype t, kiln_simd path);

#endif
