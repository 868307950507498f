/* kv_format.c - the KV page-format traits table (kv_format.h). */
#include "kv/kv_format.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- f32, f16, bf16 */

static void f32_write(void *dst, const float *src, const kiln_kv_geom *g) {
    memcpy(dst, src, (size_t)g->kv_dim * sizeof(float));
}

static void f32_read(const void *src, float *dst, const kiln_kv_geom *g) {
    memcpy(dst, src, (size_t)g->kv_dim * sizeof(float));
}

static void f16_write(void *dst, const float *src, const kiln_kv_geom *g) {
    uint16_t *d = dst;
    for (int64_t e = 0; e < g->kv_dim; e++) d[e] = kiln_fp32_to_fp16(src[e]);
}

static void f16_read(const void *src, float *dst, const kiln_kv_geom *g) {
    const uint16_t *s = src;
    for (int64_t e = 0; e < g->kv_dim; e++) dst[e] = kiln_fp16_to_fp32(s[e]);
}

static void bf16_write(void *dst, const float *src, const kiln_kv_geom *g) {
    uint16_t *d = dst;
    for (int64_t e = 0; e < g->kv_dim; e++) d[e] = kiln_fp32_to_bf16(src[e]);
}

static void bf16_read(const void *src, float *dst, const kiln_kv_geom *g) {
    const uint16_t *s = src;
    for (int64_t e = 0; e < g->kv_dim; e++) dst[e] = kiln_bf16_to_fp32(s[e]);
}

/* ---------------------------------------------------------------- element access */

static inline float f32_at(const void *row, int64_t e) {
    return ((const float *)row)[e];
}
static inline float f16_at(const void *row, int64_t e) {
    return kiln_fp16_to_fp32(((const uint16_t *)row)[e]);
}
static inline float bf16_at(const void *row, int64_t e) {
    return kiln_bf16_to_fp32(((const uint16_t *)row)[e]);
}
/* element e of a q8_0 row: qs[e % 32] * d of block e / 32 (exact in f32) */
static inline float q8_0_at(const void *row, int64_t e) {
    const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + e / 32;
    uint16_t d;
    memcpy(&d, &b->d, sizeof d);
    return (float)b->qs[e % 32] * kiln_fp16_to_fp32(d);
}
/* element e of a q4_0 row: (nibble - 8) * d; j < 16 low nibble of qs[j], else high of qs[j-16] */
static inline float q4_0_at(const void *row, int64_t e) {
    const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + e / 32;
    uint16_t d;
    memcpy(&d, &b->d, sizeof d);
    const int j = (int)(e % 32);
    const int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
    return (float)(q - 8) * kiln_fp16_to_fp32(d);
}

#define DOT_AXPY(NAME, AT)                                                                         \
    static float NAME##_dot(const void *row, int64_t e0, const float *qr, int32_t n) {             \
        float s = 0.0f;                                                                            \
        for (int32_t d = 0; d < n; d++) s += qr[d] * AT(row, e0 + d);                              \
        return s;                                                                                  \
    }                                                                                              \
    static void NAME##_axpy(float *acc, float p, const void *row, int64_t e0, int32_t n) {         \
        for (int32_t d = 0; d < n; d++) acc[d] += p * AT(row, e0 + d);                             \
    }
DOT_AXPY(f32, f32_at)
DOT_AXPY(f16, f16_at)
DOT_AXPY(bf16, bf16_at)
DOT_AXPY(q8_0, q8_0_at)
DOT_AXPY(q4_0, q4_0_at)
#undef DOT_AXPY

/* ---------------------------------------------------------------- q8_0, q4_0 */

static void q8_0_write(void *dst, const float *src, const kiln_kv_geom *g) {
    /* ggml's quantize_row_q8_0_ref semantics (tensor/dtype.h) */
    kiln_quantize_q8_0_act(src, dst, g->kv_dim);
}

static void q8_0_read(const void *src, float *dst, const kiln_kv_geom *g) {
    for (int64_t e = 0; e < g->kv_dim; e++) dst[e] = q8_0_at(src, e);
}

/* ggml's quantize_row_q4_0_ref semantics (read for semantics; independent code): per block,
 * m = the first element of largest |x|, d = m / -8 (f32), id = d != 0 ? 1 / d : 0, stored
 * d = fp16(d), q_j = min(15, (int8)(x_j * id + 8.5)) (truncation toward zero). A block with
 * a NaN or Inf gets d = fp16 NaN and q = 8 (value NaN * 0: NaN), so a dot product with it is
 * NaN as with the f32 row. */
static void q4_0_write(void *dst, const float *src, const kiln_kv_geom *g) {
    kiln_block_q4_0 *y = dst;
    for (int64_t i = 0; i < g->kv_dim / 32; i++) {
        const float *x = src + i * 32;
        float amax = 0.0f, max = 0.0f;
        int finite = 1;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(x[j]);
            if (!(a <= 3.402823466e38f)) finite = 0;
            if (amax < a) amax = a, max = x[j];
        }
        kiln_block_q4_0 b;
        if (!finite) {
            b.d = 0x7E00u;
            memset(b.qs, 0x88, sizeof b.qs);
            memcpy(&y[i], &b, sizeof b);
            continue;
        }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = kiln_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[j + 16] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            b.qs[j] = (uint8_t)(q0 | q1 << 4);
        }
        memcpy(&y[i], &b, sizeof b);
    }
}

static void q4_0_read(const void *src, float *dst, const kiln_kv_geom *g) {
    for (int64_t e = 0; e < g->kv_dim; e++) dst[e] = q4_0_at(src, e);
}

/* ---------------------------------------------------------------- the table */

static const kiln_kv_format_traits g_formats[] = {
    {KILN_DTYPE_F32, "f32", 1, 4, KILN_KV_OPERAND_F32, NULL, f32_write, f32_read, f32_dot,
     f32_axpy, NULL, NULL, true},
    {KILN_DTYPE_F16, "f16", 1, 2, KILN_KV_OPERAND_F16, NULL, f16_write, f16_read, f16_dot,
     f16_axpy, NULL, NULL, true},
    {KILN_DTYPE_BF16, "bf16", 1, 2, KILN_KV_OPERAND_BF16, NULL, bf16_write, bf16_read, bf16_dot,
     bf16_axpy, NULL, NULL, true},
    {KILN_DTYPE_Q8_0, "q8_0", 32, sizeof(kiln_block_q8_0), KILN_KV_OPERAND_F16, NULL, q8_0_write,
     q8_0_read, q8_0_dot, q8_0_axpy, NULL, NULL, true},
    {KILN_DTYPE_Q4_0, "q4_0", 32, sizeof(kiln_block_q4_0), KILN_KV_OPERAND_F16, NULL, q4_0_write,
     q4_0_read, q4_0_dot, q4_0_axpy, NULL, NULL, true},
};
enum { N_FORMATS = sizeof g_formats / sizeof g_formats[0] };

const kiln_kv_format_traits *kiln_kv_format_of(kiln_dtype t) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (g_formats[i].dtype == t) return &g_formats[i];
    return NULL;
}

const kiln_kv_format_traits *kiln_kv_format_by_name(const char *s) {
    if (!s) return NULL;
    for (size_t i = 0; i < N_FORMATS; i++)
        if (!strcmp(g_formats[i].name, s)) return &g_formats[i];
    return NULL;
}

const char *kiln_kv_format_names(void) {
    return "f32, f16, bf16, q8_0 or q4_0";
}

size_t kiln_kv_format_row_bytes_geom(kiln_dtype t, const kiln_kv_geom *g) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    if (!f || !g || g->kv_dim < 1 || g->kv_dim % f->block_elems) return 0;
    if (f->row_bytes) return f->row_bytes(g);
    size_t b;
    if (__builtin_mul_overflow((size_t)(g->kv_dim / f->block_elems), f->block_bytes, &b)) return 0;
    return b;
}

size_t kiln_kv_format_row_bytes(kiln_dtype t, int64_t n) {
    if (n < 1 || n > INT32_MAX) {
        /* plain formats only past int32 head sizes */
        const kiln_kv_format_traits *f = kiln_kv_format_of(t);
        if (!f || n < 1 || f->block_elems != 1 || f->row_bytes) return 0;
        size_t b;
        if (__builtin_mul_overflow((size_t)n, f->block_bytes, &b)) return 0;
        return b;
    }
    const kiln_kv_geom g = {n, 1, (int32_t)n};
    return kiln_kv_format_row_bytes_geom(t, &g);
}

kiln_status kiln_kv_format_check(kiln_dtype t, const kiln_kv_geom *g, const char *option,
                                 kiln_error *err) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    if (!option) option = "kv format";
    if (!f)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s must be %s (got %s, id %d)",
                              option, kiln_kv_format_names(), kiln_dtype_name((int32_t)t), (int)t);
    if (!g || g->kv_dim < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: no KV row geometry", option);
    if (g->kv_dim % f->block_elems)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s %s needs a KV row (n_head_kv x head_dim = %d x %d = %lld) that "
                              "is a multiple of %d elements; use f16, bf16 or f32 for this model",
                              option, f->name, g->n_head_kv, g->head_dim, (long long)g->kv_dim,
                              f->block_elems);
    return KILN_OK;
}

float kiln_kv_operand_round(float v, kiln_kv_operand op) {
    if (op == KILN_KV_OPERAND_F16) return kiln_fp16_to_fp32(kiln_fp32_to_fp16(v));
    if (op == KILN_KV_OPERAND_BF16) return kiln_bf16_to_fp32(kiln_fp32_to_bf16(v));
    return v;
}
