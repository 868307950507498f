/*
 * cpu.h - CPU feature detection and the weight-type kernels: dot products and matmul of
 * quantized/half/f32 weights against f32 activations, and (Q8_0/Q4_0 weights, the default
 * for them) against activations quantized to Q8_0 as llama.cpp does ("q8 activations").
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
    KILN_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/DQ (+ AVX2/FMA/F16C); the q8-activation kernels
                           use VNNI (vpdpbusd) when cpuid reports it, else AVX-512BW */
} kiln_simd;

typedef struct kiln_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
    bool avx512dq; /* required by the AVX512 path (its file is compiled with -mavx512dq) */
    bool avxvnni;  /* AVX-VNNI: VEX-encoded vpdpbusd on ymm (Alder Lake+, Zen 5) */
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
 * True when the AVX-512 q8 kernels use VNNI: cpuid reports AVX512_VNNI and env KILN_VNNI is
 * not "0" (read once; KILN_VNNI=0 selects the AVX-512BW kernels, for benchmarks).
 */
bool kiln_cpu_use_vnni(void);

/**
 * True when the AVX2 path's packed q8 prefill kernels use AVX-VNNI (VEX vpdpbusd on ymm):
 * cpuid leaf 7.1 EAX bit 4 and env KILN_VNNI is not "0" (read once; KILN_VNNI=0 selects the
 * vpmaddubsw/vpmaddwd kernels, as on AVX2 CPUs without it, e.g. Zen 2/3). Same bits either way.
 */
bool kiln_cpu_use_avxvnni(void);

/**
 * Dot product of one weight row of dtype t (n elements, n % block_size == 0) with f32 x.
 * Returns sum_i dequant(w)[i] * x[i] with a fixed per-path reduction order:
 *   scalar: left to right in f32; block types sum q*x per block (per sub-block for the K
 *           types) and add scale * partial to the total block after block (see
 *           vec_dot_scalar.c);
 *   avx2: exact dequantization into 8-lane vectors, FMA into two accumulators
 *           alternating by lane-group index, then a fixed horizontal sum;
 *   avx512: exact dequantization into 16-lane groups, FMA into one accumulator group after
 *           group (a plain row's last group zero padded), then a fixed horizontal sum.
 * Paths agree to float rounding (tests/cpu/test_vec_dot_paths.c states the tolerance).
 */
typedef float (*kiln_vec_dot_fn)(int64_t n, const void *w, const float *x);

/** The kernel for (t, path), or NULL when t has no kernel or the path is unsupported here. */
kiln_vec_dot_fn kiln_cpu_vec_dot(kiln_dtype t, kiln_simd path);

/*
 * ---------------------------------------------------------------- q8 activations
 *
 * For Q8_0 and Q4_0 weights llama.cpp does not dot the weights with f32 activations: it
 * quantizes each activation row to Q8_0 blocks (kiln_quantize_q8_0_act, ggml's
 * quantize_row_q8_0_ref semantics) and computes, per weight row,
 *     sum over blocks b of (fp32(d_w[b]) * fp32(d_x[b])) * isum[b],
 *     isum[b] = sum_j q_w[b][j] * q_x[b][j]   (exact integer; Q4_0: q_w = nibble - 8).
 * kiln's q8 kernels compute exactly that, with one fixed float order for every path:
 * D_b = d_w * d_x (exact in f32: two fp16 values), 16 accumulators a[0..15] = +0,
 * a[b % 16] = fma(D_b, (float)isum[b], a[b % 16]) for b = 0, 1, ... (correctly rounded; isum
 * is exact in f32), then s8[j] = a[j] + a[j+8], s4[j] = s8[j] + s8[j+4],
 * s2[j] = s4[j] + s4[j+2], result = s2[0] + s2[1]. Integer sums are exact, so the scalar,
 * AVX2, AVX-512 VNNI and AVX-512BW kernels return bit-identical results (NaN for NaN).
 *
 * Quantized activation rows live in a scratch format whose block order depends on the path
 * (a "layout"): one row of n elements (n % 32 == 0, nb = n / 32 blocks, nbp = nb rounded up
 * to a multiple of 16) takes kiln_cpu_q8_row_size(n) = 40 * nbp bytes:
 *   bytes [0, 32 nbp): the int8 quants. Scalar and AVX2 ("plain"): block b's 32 quants at
 *     32 b. AVX-512 ("t16", transposed for vpdpbusd): 16-block group g at 512 g; within a
 *     full group, element e of block g*16 + l at 64 (e / 4) + 4 l + e % 4; a partial last
 *     group (nb % 16 blocks) is plain (block b at 32 b), for the kernels' per-block tail.
 *   then nbp f32 scales d_x (the fp16 d converted to f32), then nbp int32 per block: plain, the
 *   sum of the block's quants; t16, -8 times that sum (the Q4_0 correction, ready to add;
 *   the Q8_0 VNNI kernel shifts it left by 4). Used by the Q4_0 and VNNI kernels. Padding blocks
 * are all zero. Rows are 64-byte aligned when the buffer is (40 * nbp is a multiple of 64).
 */

/** True when weight dtype t has q8-activation kernels (Q8_0 and Q4_0). */
bool kiln_cpu_q8_supported(kiln_dtype t);

/** Bytes of one quantized activation row of n elements (any path); 0 if n % 32 != 0 or
 * n < 0 or the size overflows. */
size_t kiln_cpu_q8_row_size(int64_t n);

/**
 * Quantize n_rows rows of n floats (x row stride n) into dst (row stride
 * kiln_cpu_q8_row_size(n), 64-byte aligned) in path's layout; every block as
 * kiln_quantize_q8_0_act. Each row independently; all paths give the same blocks. An
 * unsupported path falls back to the scalar code for that path's layout. n % 32 == 0.
 */
void kiln_cpu_q8_quantize(kiln_simd path, int64_t n, int64_t n_rows, const float *x, void *dst);

/** Block b (< n / 32) of a quantized row in path's layout, as a GGML Q8_0 block (tests). */
void kiln_cpu_q8_get_block(kiln_simd path, int64_t n, const void *row, int64_t b,
                           kiln_block_q8_0 *out);

/**
 * q8 dot product: one weight row of dtype t (n elements) with one quantized activation row
 * xq in the path's layout (from kiln_cpu_q8_quantize with the same path). Order above.
 */
typedef float (*kiln_vec_dot_q8_fn)(int64_t n, const void *w, const void *xq);

/** The q8 kernel for (t, path): NULL when t has none or the path is unsupported here. The
 * AVX-512 kernel uses VNNI when kiln_cpu_use_vnni(). */
kiln_vec_dot_q8_fn kiln_cpu_vec_dot_q8(kiln_dtype t, kiln_simd path);

/** How kiln_cpu_matmul_ex treats the activations. */
typedef enum kiln_act_mode {
    /* KILN_ACT_Q8, unless env KILN_Q8_ACT=0 (read once) makes it KILN_ACT_F32 */
    KILN_ACT_AUTO = 0,
    /* f32 activations against exactly dequantized weights: more accurate (no activation
     * rounding), slower for Q8_0/Q4_0 */
    KILN_ACT_F32 = 1,
    /* Q8_0/Q4_0 weights: activations quantized to Q8_0 as llama.cpp does (its logits are
     * reproduced to float rounding); other dtypes: f32 activations */
    KILN_ACT_Q8 = 2,
} kiln_act_mode;

/** The mode KILN_ACT_AUTO resolves to (KILN_ACT_Q8 or KILN_ACT_F32). */
kiln_act_mode kiln_cpu_act_default(void);

/**
 * y[t * n_out + o] = dot(row o of W, x[t * n_in .. + n_in]) for t < n_tok, o < n_out.
 * W: n_out rows of n_in elements of dtype wt, contiguous (row stride =
 * kiln_dtype_row_size(wt, n_in)). x: [n_tok, n_in] f32. y: [n_tok, n_out] f32.
 * The activation mode is KILN_ACT_AUTO: for Q8_0 and Q4_0 weights the dot is the q8 dot of
 * the row with x's Q8_0-quantized row (llama.cpp's semantics, see "q8 activations" above)
 * unless env KILN_Q8_ACT=0; every other dtype (and KILN_Q8_ACT=0) uses the f32 dot
 * (kiln_cpu_vec_dot). kiln_cpu_matmul_ex selects the mode per call.
 * Uses kiln_simd_active(); work is split over tp's threads (tp may be NULL) by contiguous
 * ranges of output rows; products under ~32K multiply-adds run on the caller alone.
 * n_in must be a multiple of wt's block size (callers check at load time). Block-type rows
 * must be 2-byte aligned (GGUF data is 32-aligned); plain types may be at any address.
 * Bit-exact per (t, o) for a given path whatever n_tok, the thread count or the tiling
 * (f32 mode: SIMD paths compute tiles of up to 2 rows x 3 (AVX2) / 4 rows (2 for the
 * K-quants) x 6 tokens (AVX-512) that share weight decodes and activation loads; q8 mode:
 * 1 row x 4 (AVX2) / 8 (AVX-512) tokens, or 8 rows x 1 token for rows under 512 elements,
 * or, from 32 tokens on with AVX-512 VNNI, panels of rows packed once into the kernel's
 * transposed form and tiles of 3 rows x 4 tokens over them, or, from 16 tokens on with AVX2,
 * panels packed into 16-row groups with the rows in lanes and tiles of 16 rows x 6 tokens (4
 * for Q8_0 without AVX-VNNI); each (t, o) is reduced exactly as alone). In q8 mode the bits are moreover the same on every path.
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

/**
 * As kiln_cpu_matmul_path with an explicit activation mode (kiln_cpu_matmul and
 * kiln_cpu_matmul_path use KILN_ACT_AUTO). In q8 mode with Q8_0/Q4_0 weights, the caller's
 * thread (or the pool, for large batches) quantizes every activation row once into scratch
 * memory (a 16 KiB stack buffer, else one heap buffer per call; if that allocation fails,
 * the tokens go through the stack buffer in chunks, and only when one quantized row does not
 * fit there (n_in > ~13000) is y filled with NaN), then each y[t, o] is the q8 dot product of
 * row o with token t's quantized row: bit-identical whatever n_tok, the thread count, the
 * tiling or the path (scalar, AVX2, AVX-512 VNNI or BW all agree), see above.
 */
void kiln_cpu_matmul_ex(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act, const void *w,
                        kiln_dtype wt, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                        float *y);

/*
 * ---------------------------------------------------------------- packed F16 weights
 *
 * KILN_LAYOUT_F16_R64: an F16 weight [n_out, n_in] rewritten once, at model load, as
 * ceil(n_out / 64) groups of 64 rows, each group column-interleaved: element (o, k) at half
 * index (o / 64) * 64 * n_in + k * 64 + o % 64 (the rows past n_out in the last group are
 * zero). A group is one contiguous stream of 128 bytes per input element, and a 16-lane
 * vector holds 16 rows at one k, so the kernels broadcast one activation value against 16
 * rows (an outer-product micro-kernel, as in BLIS/GotoBLAS: Goto and van de Geijn, "Anatomy
 * of high-performance matrix multiplication", ACM TOMS 34(3), 2008) instead of reducing 16
 * products of one row across lanes.
 *
 * Reduction order of every (t, o), on every path and for every tile shape: acc = +0, then
 * acc = fma(fp32(w[o][k]), x[t][k], acc) for k = 0, 1, ..., n_in - 1 (one rounding per step);
 * y = acc. The scalar, AVX2 and AVX-512 kernels therefore return the same bits (the f16 -> f32
 * conversion and the fused multiply-add are exact/correctly rounded everywhere), whatever
 * n_tok, the thread count or the tiling. This is a different order from the row layout's
 * dot kernels (kiln_cpu_vec_dot), so the two layouts agree to float rounding only, and one
 * chain per output is less accurate than the row layout's 16 lane sums and tree: against a
 * double-precision dot, |error| / sum|w x| measured rms 2.5e-8 / max 1.9e-7 (n_in 2048 to
 * 14336) vs 6.5e-9 / 2.8e-8 for the row layout (AVX-512), far below the f16 rounding of the
 * weights themselves (llama.cpp's F16 matmul rounds the activations to f16 as well).
 */
typedef enum kiln_cpu_layout {
    KILN_LAYOUT_ROWS = 0,    /* n_out rows of n_in elements, row stride kiln_dtype_row_size */
    KILN_LAYOUT_F16_R64 = 1, /* F16 only: 64-row column-interleaved groups (above) */
} kiln_cpu_layout;

/** Rows per group of KILN_LAYOUT_F16_R64. */
#define KILN_CPU_R64 64

/**
 * Bytes of weight [n_out, n_in] of dtype wt in layout: for KILN_LAYOUT_ROWS n_out times the
 * row size; for KILN_LAYOUT_F16_R64 (wt must be F16) ceil(n_out / 64) * 64 * n_in * 2. 0 when
 * the layout does not apply to wt, a size is negative or the size overflows.
 */
size_t kiln_cpu_layout_bytes(kiln_cpu_layout layout, kiln_dtype wt, int64_t n_out, int64_t n_in);

/**
 * Rewrite an F16 weight [n_out, n_in] in the row layout (w, any alignment) into dst
 * (kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, ...) bytes; 64-byte aligned keeps each k's 128
 * bytes on two cache lines) in KILN_LAYOUT_F16_R64, zero padding the last group. Bit copies:
 * no value changes. The groups are split over tp's threads (tp may be NULL).
 */
void kiln_cpu_pack_f16_r64(kiln_threadpool *tp, int64_t n_out, int64_t n_in, const void *w,
                           void *dst);

/** One weight of kiln_cpu_matmul_multi: y[t * n_out + o] = dot(row o of w, x row t), w
 *  stored as layout says (zero: KILN_LAYOUT_ROWS). */
typedef struct kiln_cpu_mm_out {
    const void *w;
    kiln_dtype wt;
    int64_t n_out;
    float *y;
    kiln_cpu_layout layout;
} kiln_cpu_mm_out;

/* weights per fused call (more are done in further calls) */
#define KILN_CPU_MM_MAX_OUTS 4

/**
 * kiln_cpu_matmul for n weights that read the same activations x ([n_tok, n_in]), e.g. the
 * q, k and v projections: in q8 mode x is quantized once for all of them, and all their rows
 * are split over tp's threads in one fork/join. Each outs[i].y is bit-identical to the same
 * weight alone (for the row layout: kiln_cpu_matmul(tp, outs[i].w, outs[i].wt, outs[i].n_out,
 * n_in, x, n_tok, outs[i].y)). With a packed weight among them, the rows are split between
 * threads at multiples of 64 of the concatenated rows. The y buffers must not overlap x or each
 * other.
 */
void kiln_cpu_matmul_multi(kiln_threadpool *tp, const kiln_cpu_mm_out *outs, int n, int64_t n_in,
                           const float *x, int64_t n_tok);

/**
 * kiln_cpu_matmul_multi with an explicit path and activation mode (tests comparing paths;
 * a path this CPU does not support fills the y buffers with NaN). A KILN_LAYOUT_F16_R64
 * weight runs the packed kernels (same bits on every path, see above) in either mode; a
 * layout that does not fit wt (a non-F16 weight marked F16_R64) fills its y with NaN.
 */
void kiln_cpu_matmul_outs(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act,
                          const kiln_cpu_mm_out *outs, int n, int64_t n_in, const float *x,
                          int64_t n_tok);

#endif
