/*
 * turboquant.h - TurboQuant KV rows (Zandieh, Daliri, Hadian, Mirrokni 2025, "TurboQuant:
 * Online Vector Quantization with Near-optimal Distortion Rate", arXiv 2504.19874).
 *
 * One head's row x of d = head_dim elements is stored as
 *   norm = ||x||_2 (f32), y = Pi x / norm (a unit vector), idx_j = the nearest centroid of a
 *   Lloyd-Max codebook of 2^m levels to y_j (m "MSE bits" per coordinate),
 * which is the paper's TurboQuant_mse (its Algorithm 1) with the row's norm kept, as its
 * Section 1.3 / 4 prescribe for vectors not on the unit sphere. With the QJL flag, the row also
 * stores the paper's TurboQuant_prod stage (its Algorithm 2): the residual r = y - c[idx]
 * (rotated unit domain), gamma = ||r||_2 (f32) and d sign bits z = sign(S r), S a d x d
 * matrix of i.i.d. N(0,1) entries; then q . x is estimated as
 *   norm * (sum_j (Pi q)_j c[idx_j] + gamma * sqrt(pi/2)/d * (S Pi q) . z)
 * which is unbiased over the draw of S (the paper's Lemma 4 / Theorem 2). A config of b bits
 * with QJL spends b-1 bits on the codebook and 1 on the sign, as the paper's TurboQuant_prod
 * of bit-width b does.
 *
 * The rotation Pi: x -> (1/sqrt d) H D x, H the d x d Walsh-Hadamard matrix (Sylvester order,
 * entries +-1, applied by the fast transform in d log2 d adds) and D a fixed diagonal of
 * random signs. It is orthogonal and symmetric up to D (Pi^T = D H / sqrt d), so norms and
 * inner products are preserved; the paper draws a dense uniformly random rotation instead
 * (its Algorithm 1 line 2); the randomized Hadamard transform is the usual fast stand-in
 * (Ailon and Chazelle 2006; QuaRot, Ashkboos et al. 2024). head_dim must be a power of two in
 * [KILN_TURBO_MIN_HEAD_DIM, KILN_TURBO_MAX_HEAD_DIM]; other head sizes are refused with an
 * error (a block-diagonal transform over power-of-two pieces would not spread a row's energy
 * evenly over all d coordinates, which the codebook assumes).
 *
 * Seeds: the sign D_i is bit 0 of splitmix64(seed ^ 0x5349474e, i) (one 64-bit splitmix64
 * output per coordinate), S[i][j] is a Box-Muller normal from splitmix64 draws at counter
 * (i * d + j), both from KILN_TURBO_SEED in the engine (kiln_turbo_shared); tests draw other
 * seeds. Values are rounded to f32 once.
 *
 * Codebooks: for each (d, m) the 2^m centroids are computed at creation by the Lloyd-Max
 * iteration (Lloyd 1982, Max 1960) on the exact density of one coordinate of a uniformly
 * random unit vector in R^d, f(x) = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1-x^2)^((d-3)/2)
 * on [-1, 1] (the paper's Lemma 1), integrated on a grid of 2^17 cells over
 * [-min(1, 12/sqrt d), +min(1, 12/sqrt d)] (the mass outside is < 1e-30), started from the
 * companding point density f^(1/3) (Panter and Dite 1951) and run until no centroid moves by
 * more than 1e-12 (or 20000 sweeps); the centroids are then rounded to f32 and each code's
 * cell is bounded by the midpoints of neighbouring f32 centroids. For large d these are Max's
 * Gaussian tables scaled by 1/sqrt d (b=1: +-sqrt(2/pi)/sqrt d; b=2: +-0.4528, +-1.510).
 *
 * Row layout of one head (kiln_turbo_head_bytes): f32 norm; with QJL, f32 gamma; then m*d/8
 * bytes of codes, 8 codes per m bytes, code i of a group at bits [i*m, i*m+m) of the group's
 * little-endian m-byte word; then, with QJL, d/8 bytes of signs, bit i%8 of byte i/8 set when
 * (S r)_i >= 0. f32 fields are stored little-endian at any alignment (read with memcpy).
 *
 * All functions are pure and thread-safe on a const kiln_turbo; every output is a fixed
 * sequential reduction, so a row's bits and a dot's value never depend on the batch.
 */
#ifndef KILN_KV_TURBOQUANT_H
#define KILN_KV_TURBOQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#define KILN_TURBO_MIN_HEAD_DIM 8
#define KILN_TURBO_MAX_HEAD_DIM 1024
#define KILN_TURBO_MAX_BITS     8
/* The engine's seed for the signs and the QJL matrix ("turboKV1" in ASCII). */
#define KILN_TURBO_SEED UINT64_C(0x7475726230b4b631)

/** One side's quantizer: bits per coordinate in 1..8, including the QJL sign bit when qjl. */
typedef struct kiln_turbo_spec {
    int32_t bits;
    bool qjl;
} kiln_turbo_spec;

/** A K/V pair of quantizers: the `turbo:` part of --kv-type. */
typedef struct kiln_turbo_config {
    kiln_turbo_spec k, v;
} kiln_turbo_config;

/** The default config: turbo:k8v3 (8-bit keys, 3-bit values, no QJL). */
kiln_turbo_config kiln_turbo_config_default(void);

/**
 * Parse a TurboQuant config. Grammar (lowercase, no spaces):
 *   "turbo"                          the default, k8v3
 *   "turbo:k" BITS ["q"] "v" BITS ["q"]  BITS in 1..8; "q" adds the 1-bit QJL residual
 *                                    inside BITS (TurboQuant_prod: BITS-1 codebook bits + 1)
 * e.g. turbo:k8v3, turbo:k4v4, turbo:k3v2, turbo:k4qv3, turbo:k4qv4q.
 * option: the option's name for messages ("--kv-type"); may be NULL ("kv type").
 * Errors: KILN_ERR_INVALID_ARGUMENT naming the option, the text and the bad part
 * ("--kv-type: 'turbo:k9v3': K bits '9' are not in 1..8"); *out is written only on success.
 */
kiln_status kiln_turbo_config_parse(const char *option, const char *text, kiln_turbo_config *out,
                                    kiln_error *err);

/** Whether text names a TurboQuant config (starts with "turbo" followed by NUL or ':'). */
bool kiln_turbo_is_config(const char *text);

/** Write the canonical name ("turbo:k8v3", "turbo:k4qv3") of c into buf (cap bytes, NUL
 *  terminated, truncated); returns the untruncated length, or -1 for an invalid spec. */
int kiln_turbo_config_name(const kiln_turbo_config *c, char *buf, size_t cap);

/** Whether spec is valid (bits 1..8). */
bool kiln_turbo_spec_valid(kiln_turbo_spec s);

/** Bytes of one head's row of head_dim elements (layout above); 0 when head_dim or the spec is
 *  invalid (kiln_turbo_head_dim_valid). */
size_t kiln_turbo_head_bytes(int32_t head_dim, kiln_turbo_spec s);

/** Whether head_dim is a power of two in [KILN_TURBO_MIN_HEAD_DIM, KILN_TURBO_MAX_HEAD_DIM]. */
bool kiln_turbo_head_dim_valid(int32_t head_dim);

/** Storage bits per element of a row of head_dim elements, norms included:
 *  8 * kiln_turbo_head_bytes / head_dim (0 when invalid). */
double kiln_turbo_bits_per_element(int32_t head_dim, kiln_turbo_spec s);

typedef struct kiln_turbo kiln_turbo;

/**
 * A quantizer for rows of head_dim elements with spec s, its signs and QJL matrix drawn from
 * seed, its codebook computed by Lloyd-Max (header comment). Takes ~1-30 ms (the codebook).
 * Errors: KILN_ERR_INVALID_ARGUMENT (head_dim not a power of two in 8..1024, bits not 1..8,
 * NULL out), KILN_ERR_OUT_OF_MEMORY. *out is set only on success.
 */
kiln_status kiln_turbo_create(int32_t head_dim, kiln_turbo_spec s, uint64_t seed, kiln_turbo **out,
                              kiln_error *err);

/** Free t; NULL is a no-op. */
void kiln_turbo_destroy(kiln_turbo *t);

/**
 * The process-wide quantizer for (head_dim, s) with KILN_TURBO_SEED, created on first use and
 * kept until exit (thread-safe; the pointer stays valid). NULL when head_dim or s is invalid or
 * memory ran out.
 */
const kiln_turbo *kiln_turbo_shared(int32_t head_dim, kiln_turbo_spec s);

int32_t kiln_turbo_head_dim(const kiln_turbo *t);
kiln_turbo_spec kiln_turbo_get_spec(const kiln_turbo *t);
/** Codebook bits m (bits - qjl, 0..8) and its 2^m ascending f32 centroids (unit-sphere
 *  coordinate units; m = 0: one centroid 0). */
int32_t kiln_turbo_codebook(const kiln_turbo *t, const float **centroids);

/** y[d] = Pi x[d] (rotation above). x and y may alias. */
void kiln_turbo_rotate(const kiln_turbo *t, const float *x, float *y);
/** x[d] = Pi^T y[d]. x and y may alias. */
void kiln_turbo_unrotate(const kiln_turbo *t, const float *y, float *x);

/** row (kiln_turbo_head_bytes bytes) = the quantized x[d]. A zero row stores norm 0 (and
 *  reads back as 0); non-finite input gives a non-finite norm (never UB). */
void kiln_turbo_quantize(const kiln_turbo *t, const float *x, void *row);

/** x[d] = the row's reconstruction norm * Pi^T (c[idx] + gamma sqrt(pi/2)/d S^T z) (QJL term
 *  only with QJL). */
void kiln_turbo_dequantize(const kiln_turbo *t, const void *row, float *x);

/** Floats of a prepared query / a value accumulator: d, or 2d with QJL. */
int32_t kiln_turbo_work_floats(const kiln_turbo *t);

/** qp[kiln_turbo_work_floats] = (Pi q, and with QJL sqrt(pi/2)/d * S Pi q): a query in the
 *  rotated domain, computed once per (token, head) and then dotted with every key row. */
void kiln_turbo_prepare_query(const kiln_turbo *t, const float *q, float *qp);

/** The estimate of q . x for a row of x and qp from kiln_turbo_prepare_query(q):
 *  kiln_turbo_dot_f32 over the row's kiln_turbo_decode_rotated values (yr, then zr with QJL)
 *  and qp[0 : work_floats]: norm * (c[idx] . qp[0:d] + gamma * z . qp[d:2d]). */
float kiln_turbo_dot(const kiln_turbo *t, const float *qp, const void *row);

/** sum_j a[j] b[j] for j = 0 .. n-1 as one fused multiply-add chain from +0 in ascending j
 *  (s = fmaf(a[j], b[j], s)): the order the attention kernels use on every path (one key per
 *  SIMD lane there). */
float kiln_turbo_dot_f32(const float *a, const float *b, int32_t n);

/** Decode a row into the rotated domain: yr[j] = norm * c[idx_j]; with QJL also
 *  zr[j] = +-norm * gamma (the sign of z_j), so that kiln_turbo_dot == yr . qp[0:d] +
 *  zr . qp[d:2d] in the same order. zr may be NULL without QJL. */
void kiln_turbo_decode_rotated(const kiln_turbo *t, const void *row, float *yr, float *zr);

/** acc[j] = fmaf(w, (the row's decode_rotated yr, zr)[j], acc[j]) for j < work_floats. */
void kiln_turbo_accumulate(const kiln_turbo *t, float w, const void *row, float *acc);

/** out[d] = Pi^T (acc[0:d] + sqrt(pi/2)/d * S^T acc[d:2d]): the original-domain value of an
 *  accumulated weighted sum of rows (acc is left unchanged). */
void kiln_turbo_finish(const kiln_turbo *t, const float *acc, float *out);

/* KV page format ids (kiln_dtype values, kv/kv_format.h) of TurboQuant rows: outside the
 * GGML id space that kiln_dtype mirrors (no weight tensor has them), one per spec:
 * KILN_KV_TURBO_DTYPE_BASE + 2 * (bits - 1) + qjl, so 64 .. 79. */
#define KILN_KV_TURBO_DTYPE_BASE 64
#define KILN_KV_TURBO_DTYPE_END  (KILN_KV_TURBO_DTYPE_BASE + 2 * KILN_TURBO_MAX_BITS)

/** The page format id of spec s (-1 when s is invalid). */
int32_t kiln_turbo_dtype_of(kiln_turbo_spec s);
/** Whether id is a TurboQuant page format id; if so and s is non-NULL, *s = its spec. */
bool kiln_turbo_spec_of_dtype(int32_t id, kiln_turbo_spec *s);

#endif
