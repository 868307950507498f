/*
 * kv_format.h - KV page formats: one row of a traits table per format (DESIGN.md "Page
 * formats"), as the dtype traits table has one row per weight dtype. A format says
 *   - its row layout and bytes: one position's K (or V) row is the kv_dim = n_head_kv *
 *     head_dim elements of every KV head, head-major; a format stores it as kv_dim /
 *     block_elems blocks of block_bytes each (a plain format: blocks of one element), or, for
 *     a format with per-head side data, as row_bytes() says;
 *   - how a row is written from f32 (write_row; it gets the row's geometry, so a format may
 *     work per head, e.g. rotate each head's slice);
 *   - how attention reads it: the operand semantics (kiln_kv_operand: what q and the softmax
 *     probabilities are rounded or transformed to before they meet the rows), and a scalar
 *     reference for q . k over a head's slice (dot) and for acc += p * v (axpy), which the
 *     CPU backend's reference attention calls and its SIMD paths must match (tests/cpu);
 *   - which per-block layout a backend's SIMD path has a kernel for (dtype).
 * A format is identified by its kiln_dtype id, which the block pool stores per block and per
 * side (kiln_kv_pool_block_format_k / _v); K and V may use different formats.
 *
 * Rows (every format but TurboQuant reads back exactly the values the attention computes with):
 *   f32   4 bytes per element.
 *   f16   IEEE half, round to nearest even on write.
 *   bf16  bfloat16, round to nearest even on write.
 *   q8_0  ggml's block_q8_0 (34 bytes per 32 elements: f16 d, int8 qs[32]; value qs[j] * d),
 *         written as ggml's quantize_row_q8_0_ref does (d = amax / 127 in f32, stored as f16
 *         round-to-nearest; qs = roundf(x / d) with the f32 d), so a page is byte for byte
 *         what ggml writes for the same row (kiln_quantize_q8_0_act).
 *   q4_0  ggml's block_q4_0 (18 bytes per 32 elements: f16 d, 16 bytes of nibbles: element
 *         j < 16 in the low nibble of byte j, element j + 16 in its high nibble; value
 *         (q - 8) * d), written as ggml's quantize_row_q4_0_ref does (m = the element of
 *         largest magnitude, first one on ties; d = m / -8 in f32, stored as f16; id = 1 / d
 *         from the f32 d; q = min(15, (int)(x * id + 8.5))).
 *   A quantized format's 32-element blocks run along the whole row, so a block may span KV
 *   heads when head_dim < 32 (heads of 8 or 16: one block holds 4 or 2 heads' slices), and a
 *   head need not start on a block boundary. kv_dim % 32 != 0 is refused
 *   (kiln_kv_format_check names the option).
 *   A value qs * d (|qs| <= 127, d an f16) is exact in f32, so reading a quantized row
 *   back is exact: the "dequantized value" is a number, not a rounding step.
 *   turboB, turboBq  TurboQuant (kv/turboquant.h; Zandieh et al. 2025, arXiv 2504.19874), one
 *         row per spec of B bits (1..8; q: B-1 codebook bits and the 1-bit QJL residual), ids
 *         KILN_KV_TURBO_DTYPE_BASE + 2 (B - 1) + qjl (64..79, outside the GGML id space). A row
 *         is n_head_kv head rows of kiln_turbo_head_bytes(head_dim) bytes (f32 norm, [f32
 *         gamma], codes, [signs]); head_dim must be a power of two in 8..1024. A K/V pair is
 *         named as a config, turbo:kBvB (kiln_kv_format_parse): turbo:k8v3 is K turbo8, V
 *         turbo3. The attention reads these rows in the rotated domain (backend/cpu/
 *         attn_turbo.h: q rotated once per (token, head), p . v accumulated rotated and
 *         rotated back once), which read_row's dequantized values equal up to f32 rounding;
 *         dot / axpy are the plain-domain reference on read_row's values (operand F32).
 *
 * Operand semantics (kiln_kv_operand), the same on every CPU path (scalar, AVX2, AVX-512):
 *   F32   q . k and p . v in f32 on the unrounded q and p.
 *   F16   q is rounded to f16 before q . k, the softmax probabilities p are rounded to f16
 *         before they weight v, sums in f32 (an f16 matmul pipeline, as llama.cpp's CPU path
 *         with an f16 cache; FlashAttention-2 casts P to half before P V). f16, q8_0 and q4_0
 *         rows all use it: for q8_0 / q4_0, s = sum_d f16(q_d) * (qs_d * d_blk(d)) as one f32
 *         chain, out = sum_t f16(p_t) * (qs * d) likewise: no dequantized copy of the cache
 *         exists, each element's exact value is formed in a register. (llama.cpp's CPU path
 *         instead quantizes q to q8_0 for q8_0 K; kiln keeps q in f16, which is closer to
 *         the f32 result and lets f16 and q8_0 / q4_0 blocks mix within one sequence.)
 *   BF16  the same pipeline with bf16 rounding (round to nearest even) of q and p.
 * Within one sequence all K blocks share an operand and all V blocks share an operand (the
 * delayed transition pairs f16 blocks with q8_0 / q4_0 ones, all F16); the K operand rounds q,
 * the V operand rounds p.
 *
 * Adding a format (a row of g_formats in kv_format.c): a kiln_dtype id (< KILN_DTYPE_COUNT, the
 * pool stores it per block), a name for --kv-type, its bytes (block_elems / block_bytes, or a
 * row_bytes function for per-head side data), write_row / read_row, the scalar dot / axpy the
 * CPU reference attention calls, prep_q / finish_v when the format works in a transformed
 * domain, and simd = false until backend/cpu/ops_avx512.c and attention_avx2.c have a kernel
 * for it (the reference then runs; batch invariance holds either way: each (token, head) is its
 * own fixed order).
 */
#ifndef KILN_KV_KV_FORMAT_H
#define KILN_KV_KV_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"
#include "util/error.h"

/** How attention reads a format's rows (the operand rounding it computes with). */
typedef enum kiln_kv_operand {
    KILN_KV_OPERAND_F32 = 0,  /* q . k and p . v in f32 */
    KILN_KV_OPERAND_F16 = 1,  /* q and p rounded to f16, f32 sums */
    KILN_KV_OPERAND_BF16 = 2, /* q and p rounded to bf16, f32 sums */
} kiln_kv_operand;

/** The geometry a row is written and read with: one position of one layer. */
typedef struct kiln_kv_geom {
    int64_t kv_dim;    /* elements of the row: n_head_kv * head_dim */
    int32_t n_head_kv; /* KV heads in the row */
    int32_t head_dim;  /* elements per head */
} kiln_kv_geom;

typedef struct kiln_kv_format_traits {
    kiln_dtype dtype;    /* the format's id (what the pool stores per block) */
    const char *name;    /* "f32", "f16", "bf16", "q8_0", "q4_0" (the --kv-type names) */
    int32_t block_elems; /* elements per block along the row (1: a plain format) */
    size_t block_bytes;  /* bytes per block (plain: bytes per element) */
    kiln_kv_operand operand;
    /** Bytes of one row for geometry g; NULL: kv_dim / block_elems * block_bytes. */
    size_t (*row_bytes)(const kiln_kv_geom *g);
    /** dst row (row bytes) = the f32 row src [g->kv_dim] in this format. */
    void (*write_row)(void *dst, const float *src, const kiln_kv_geom *g);
    /** dst [g->kv_dim] f32 = the row's values (exact for every format above). */
    void (*read_row)(const void *src, float *dst, const kiln_kv_geom *g);
    /** Scalar reference of q . k over one head's slice: elements [e0, e0 + n) of the row,
     *  with qr already rounded to the operand: s = +0, then s += qr[d] * x[e0 + d] for
     *  d = 0 .. n-1 in order (f32, one rounding per step). */
    float (*dot)(const void *row, int64_t e0, const float *qr, int32_t n);
    /** Scalar reference of acc[d] += p * x[e0 + d] for d < n (p already rounded). */
    void (*axpy)(float *acc, float p, const void *row, int64_t e0, int32_t n);
    /** Optional (NULL: qr[d] = kiln_kv_operand_round(q[d], operand)): q of one head
     *  (head_dim floats) as dot expects it, once per (token, head) and call; e.g. a format
     *  storing rotated rows rotates q here (attention then computes q . k in the rotated
     *  domain). K side only. */
    void (*prep_q)(float *qr, const float *q, int32_t head_dim);
    /** Optional (NULL: nothing): applied in place to one head's accumulated sum_t p_t v_t
     *  (head_dim floats) after the last key, e.g. the inverse rotation of rotated V rows.
     *  V side only. Every V block of one call must share it. */
    void (*finish_v)(float *out, int32_t head_dim);
    /** Whether the CPU backend's SIMD attention paths have a kernel for this format (the
     *  formats of this file do); false: those calls run the scalar reference above. */
    bool simd;
} kiln_kv_format_traits;

/** The traits of format t, or NULL when t is not a KV page format. */
const kiln_kv_format_traits *kiln_kv_format_of(kiln_dtype t);

/** The format named s ("f32", "f16", "bf16", "q8_0", "q4_0"); NULL for an unknown name. */
const kiln_kv_format_traits *kiln_kv_format_by_name(const char *s);

/** The accepted names, for messages: "f32, f16, bf16, q8_0, q4_0 or a TurboQuant config ...". */
const char *kiln_kv_format_names(void);

/** Which side(s) a --kv-type style option sets. */
typedef enum kiln_kv_side {
    KILN_KV_SIDE_BOTH = 0, /* --kv-type */
    KILN_KV_SIDE_K = 1,    /* --kv-type-k */
    KILN_KV_SIDE_V = 2,    /* --kv-type-v */
} kiln_kv_side;

/**
 * The value text of a KV format option (option: its name for messages, e.g. "--kv-type-k").
 * text is a format's name (a row of the table: "f16", "q8_0", "turbo8", "turbo3q", ...: both
 * sides get it) or a TurboQuant config (kiln_turbo_config_parse: "turbo" = "turbo:k8v3",
 * "turbo:k4v3", "turbo:k4qv3": K gets the config's K spec, V its V spec). side picks what is set:
 * BOTH sets *k and *v, K sets *k alone (so --kv-type-k turbo:k4v3 = turbo4), V *v alone.
 * Errors: KILN_ERR_INVALID_ARGUMENT naming option and the text (unknown name; a bad turbo config
 * such as turbo:k9v3, turbo:x or turbo:k8, with the bad part); *k, *v unchanged then.
 */
kiln_status kiln_kv_format_parse(const char *option, const char *text, kiln_kv_side side,
                                 kiln_dtype *k, kiln_dtype *v, kiln_error *err);

/** The name of a K/V format pair for people: "turbo:k8v3" when both are TurboQuant, the one name
 *  when k == v ("q8_0"), else "k/v" ("q8_0/f16"). Written into buf (cap bytes, NUL terminated,
 *  truncated); returns the untruncated length, -1 when k or v is not a format. */
int kiln_kv_format_pair_name(kiln_dtype k, kiln_dtype v, char *buf, size_t cap);

/**
 * Whether format t can hold rows of geometry g. Errors (KILN_ERR_INVALID_ARGUMENT, the message
 * naming `option`, e.g. "--kv-type-k"): t not a format; kv_dim not a multiple of the format's
 * block_elems (q8_0 / q4_0: 32; the message gives n_head_kv x head_dim).
 */
kiln_status kiln_kv_format_check(kiln_dtype t, const kiln_kv_geom *g, const char *option,
                                 kiln_error *err);

/** Bytes of one row of n elements (n_head_kv 1, head_dim n) in format t; 0 when t is not a
 *  format, n < 1, n is not a multiple of the format's block, or the size overflows. */
size_t kiln_kv_format_row_bytes(kiln_dtype t, int64_t n);

/** Bytes of one row of geometry g in format t (0 as for kiln_kv_format_row_bytes). */
size_t kiln_kv_format_row_bytes_geom(kiln_dtype t, const kiln_kv_geom *g);

/** q (or p) rounded to operand op (f16 / bf16: round to nearest even; f32: v). */
float kiln_kv_operand_round(float v, kiln_kv_operand op);

#endif
