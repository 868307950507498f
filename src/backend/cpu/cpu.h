/*
 * cpu.h - CPU feature detection and the weight-type kernels: dot products and matmul of
 * quantized/half/f32 weights against f32 activations.
 *
 * Batch invariance (DESIGN.md principle 3): the value written for output (t, o) depends
 * only on weight row o and activation row t, never on n_tok, the thread count or the
 * tiling: every path fixes its reduction order per output element.
 */
#ifndef KILN_BACKEND_CPU_CPU_H
#define KILN_BACKEND_CPU_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/dtype.h"
#include "util/threadpool.h"

typedef enum kiln_simd {
    KILN_SIMD_SCALAR = 0,
    KILN_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KILN_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/DQ (+ AVX2/FMA/F16C); VNNI and BF16 are detected
                           but unused while activations stay f32 */
} kiln_simd;

typedef struct kiln_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
    bool avx512dq; /* required by the AVX512 path (its file is compiled with -mavx512dq) */
} kiln_cpu_features;

/** Features from cpuid/xgetbv, detected once. Never NULL. */
const kiln_cpu_features *kiln_cpu_features_get(void);

/** True when the CPU (and OS) support the path. SCALAR is always supported. */
bool kiln_simd_supported(kiln_simd s);

/**
 * Best supported path, or the one named by env KILN_SIMD=scalar|avx2|avx512 if supported
 * (a named path this CPU lacks gives the best supported path below it; an unknown name is
 * ignored). Read once, on first use.
 */
kiln_simd kiln_simd_active(void);

/** "scalar", "avx2", "avx512". */
const char *kiln_simd_name(kiln_simd s);

/**
 * Dot product of one weight row of dtype t (n elements, n % block_size == 0) with f32 x.
 * Returns sum_i dequant(w)[i] * x[i] with a fixed per-path reduction order:
 *   scalar: left to right in f32; block types sum q*x per block (per sub-block for the K
 *           types) and add scale * partial to the total block after block (see
 *           vec_dot_scalar.c);
 *   avx2 / avx512: exact dequantization into 8 / 16-lane vectors, FMA into two
 *           accumulators alternating by lane-group index, then a fixed horizontal sum.
 * Paths agree to float rounding (tests/cpu/test_vec_dot_paths.c states the tolerance).
 */
typedef float (*kiln_vec_dot_fn)(int64_t n, const void *w, const float *x);

/** The kernel for (t, path), or NULL when t has no kernel or the path is unsupported here. */
kiln_vec_dot_fn kiln_cpu_vec_dot(kiln_dtype t, kiln_simd path);

/**
 * y[t * n_out + o] = dot(row o of W, x[t * n_in .. + n_in]) for t < n_tok, o < n_out.
 * W: n_out rows of n_in elements of dtype wt, contiguous (row stride =
 * kiln_dtype_row_size(wt, n_in)). x: [n_tok, n_in] f32. y: [n_tok, n_out] f32.
 * Uses kiln_simd_active(); work is split over tp's threads (tp may be NULL) by contiguous
 * ranges of output rows; products under ~32K multiply-adds run on the caller alone.
 * n_in must be a multiple of wt's block size (callers check at load time). Block-type rows
 * must be 2-byte aligned (GGUF data is 32-aligned); plain types may be at any address.
 * Bit-exact per (t, o) for a given path whatever n_tok, the thread count or the tiling
 * (SIMD paths compute tiles of up to 2 rows x 3 (AVX2) / 6 (AVX-512) tokens that share
 * weight decodes and activation loads; each (t, o) is reduced exactly as alone).
 * When wt has no kernel on the path (I32, unknown ids) or n_in is not a multiple of its
 * block size, y is filled with NaN.
 */
void kiln_cpu_matmul(kiln_threadpool *tp, const void *w, kiln_dtype wt, int64_t n_out, int64_t n_in,
                     const float *x, int64_t n_tok, float *y);

/**
 * As kiln_cpu_matmul with an explicit path (for tests comparing paths). A path this CPU
 * does not support fills y with NaN (check kiln_simd_supported first).
 */
void kiln_cpu_matmul_path(kiln_threadpool *tp, kiln_simd path, const void *w, kiln_dtype wt,
                          int64_t n_out, int64_t n_in, const float *x, int64_t n_tok, float *y);

#endif
