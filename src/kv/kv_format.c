/* kv_format.c - the KV page-format traits table (kv_format.h). */
#include "kv/kv_format.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kv/turboquant.h"

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


/* ---------------------------------------------------------------- TurboQuant (turboquant.h)
 * One row = n_head_kv head rows of kiln_turbo_head_bytes(head_dim, spec) bytes each, head-major,
 * each written by kiln_turbo_quantize with the engine's quantizer (kiln_turbo_shared, seed
 * KILN_TURBO_SEED). The value a row reads back is kiln_turbo_dequantize's (Pi^T of the decoded
 * rotated row, QJL term included). Attention over these rows runs in the rotated domain
 * (backend/cpu/attn_turbo.h); dot / axpy here are the plain-domain reference over the
 * dequantized head (operand F32), for tests and any path without the rotated kernel. */

static size_t turbo_row_bytes_spec(kiln_turbo_spec s, const kiln_kv_geom *g) {
    const size_t hb = kiln_turbo_head_bytes(g->head_dim, s);
    if (!hb || g->n_head_kv < 1 || (int64_t)g->n_head_kv * g->head_dim != g->kv_dim) return 0;
    return hb * (size_t)g->n_head_kv;
}

static void turbo_write_spec(kiln_turbo_spec s, void *dst, const float *src,
                             const kiln_kv_geom *g) {
    const kiln_turbo *t = kiln_turbo_shared(g->head_dim, s);
    const size_t hb = kiln_turbo_head_bytes(g->head_dim, s);
    if (!t) { /* out of memory creating the quantizer: a row that reads back as zeros */
        memset(dst, 0, turbo_row_bytes_spec(s, g));
        return;
    }
    for (int32_t h = 0; h < g->n_head_kv; h++)
        kiln_turbo_quantize(t, src + (int64_t)h * g->head_dim, (char *)dst + (size_t)h * hb);
}

static void turbo_read_spec(kiln_turbo_spec s, const void *src, float *dst,
                            const kiln_kv_geom *g) {
    const kiln_turbo *t = kiln_turbo_shared(g->head_dim, s);
    const size_t hb = kiln_turbo_head_bytes(g->head_dim, s);
    for (int32_t h = 0; h < g->n_head_kv; h++) {
        float *x = dst + (int64_t)h * g->head_dim;
        if (t)
            kiln_turbo_dequantize(t, (const char *)src + (size_t)h * hb, x);
        else
            memset(x, 0, sizeof(float) * (size_t)g->head_dim);
    }
}

/* one head's dequantized slice: the head at e0 / n of a row of heads of n elements */
static bool turbo_head(kiln_turbo_spec s, const void *row, int64_t e0, int32_t n, float *x) {
    const kiln_turbo *t = kiln_turbo_shared(n, s);
    if (!t || e0 % n) return false;
    kiln_turbo_dequantize(t, (const char *)row + (size_t)(e0 / n) * kiln_turbo_head_bytes(n, s),
                          x);
    return true;
}

static float turbo_dot_spec(kiln_turbo_spec s, const void *row, int64_t e0, const float *qr,
                            int32_t n) {
    float x[KILN_TURBO_MAX_HEAD_DIM], acc = 0.0f;
    if (!turbo_head(s, row, e0, n, x)) return NAN;
    for (int32_t d = 0; d < n; d++) acc += qr[d] * x[d];
    return acc;
}

static void turbo_axpy_spec(kiln_turbo_spec s, float *acc, float p, const void *row, int64_t e0,
                            int32_t n) {
    float x[KILN_TURBO_MAX_HEAD_DIM];
    if (!turbo_head(s, row, e0, n, x))
        for (int32_t d = 0; d < n; d++) x[d] = NAN;
    for (int32_t d = 0; d < n; d++) acc[d] += p * x[d];
}

/* the traits functions of spec (B bits, QJL Q): thin wrappers fixing the spec */
#define TURBO_FNS(B, Q, SFX)                                                                       \
    static const kiln_turbo_spec turbo_spec_##B##SFX = {B, Q};                                     \
    static size_t turbo_rb_##B##SFX(const kiln_kv_geom *g) {                                       \
        return turbo_row_bytes_spec(turbo_spec_##B##SFX, g);                                       \
    }                                                                                              \
    static void turbo_w_##B##SFX(void *dst, const float *src, const kiln_kv_geom *g) {             \
        turbo_write_spec(turbo_spec_##B##SFX, dst, src, g);                                        \
    }                                                                                              \
    static void turbo_r_##B##SFX(const void *src, float *dst, const kiln_kv_geom *g) {             \
        turbo_read_spec(turbo_spec_##B##SFX, src, dst, g);                                         \
    }                                                                                              \
    static float turbo_dot_##B##SFX(const void *row, int64_t e0, const float *qr, int32_t n) {     \
        return turbo_dot_spec(turbo_spec_##B##SFX, row, e0, qr, n);                                \
    }                                                                                              \
    static void turbo_axpy_##B##SFX(float *acc, float p, const void *row, int64_t e0, int32_t n) { \
        turbo_axpy_spec(turbo_spec_##B##SFX, acc, p, row, e0, n);                                  \
    }
#define TURBO_BOTH(B) TURBO_FNS(B, false, ) TURBO_FNS(B, true, q)
TURBO_BOTH(1)
TURBO_BOTH(2)
TURBO_BOTH(3)
TURBO_BOTH(4)
TURBO_BOTH(5)
TURBO_BOTH(6)
TURBO_BOTH(7)
TURBO_BOTH(8)
#undef TURBO_BOTH
#undef TURBO_FNS

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
    /* TurboQuant, one row per spec: id KILN_KV_TURBO_DTYPE_BASE + 2 (bits - 1) + qjl */
#define TURBO_ROW(B, Q, SFX)                                                                       \
    {(kiln_dtype)(KILN_KV_TURBO_DTYPE_BASE + 2 * ((B)-1) + (Q)), "turbo" #B #SFX, 1, 0,            \
     KILN_KV_OPERAND_F32, turbo_rb_##B##SFX, turbo_w_##B##SFX, turbo_r_##B##SFX,                   \
     turbo_dot_##B##SFX, turbo_axpy_##B##SFX, NULL, NULL, false},
#define TURBO_ROWS(B) TURBO_ROW(B, 0, ) TURBO_ROW(B, 1, q)
    TURBO_ROWS(1) TURBO_ROWS(2) TURBO_ROWS(3) TURBO_ROWS(4)
    TURBO_ROWS(5) TURBO_ROWS(6) TURBO_ROWS(7) TURBO_ROWS(8)
#undef TURBO_ROWS
#undef TURBO_ROW
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
    return "f32, f16, bf16, q8_0, q4_0 or a TurboQuant config turbo:kBvB (B bits 1..8, a q "
           "after B adds the QJL bit; turbo = turbo:k8v3)";
}

kiln_status kiln_kv_format_parse(const char *option, const char *text, kiln_kv_side side,
                                 kiln_dtype *k, kiln_dtype *v, kiln_error *err) {
    if (!option) option = "kv format";
    if (!k || !v)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: no output given", option);
    kiln_dtype fk, fv;
    if (text && kiln_turbo_is_config(text)) {
        kiln_turbo_config c;
        kiln_status st = kiln_turbo_config_parse(option, text, &c, err);
        if (st) return st;
        fk = (kiln_dtype)kiln_turbo_dtype_of(c.k);
        fv = (kiln_dtype)kiln_turbo_dtype_of(c.v);
    } else {
        const kiln_kv_format_traits *f = kiln_kv_format_by_name(text);
        if (!f)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s must be one of %s (got '%.64s')",
                                  option, kiln_kv_format_names(), text ? text : "");
        fk = fv = f->dtype;
    }
    if (side != KILN_KV_SIDE_V) *k = fk;
    if (side != KILN_KV_SIDE_K) *v = fv;
    return KILN_OK;
}

int kiln_kv_format_pair_name(kiln_dtype k, kiln_dtype v, char *buf, size_t cap) {
    const kiln_kv_format_traits *fk = kiln_kv_format_of(k), *fv = kiln_kv_format_of(v);
    if (!fk || !fv) return -1;
    kiln_turbo_config c;
    if (kiln_turbo_spec_of_dtype((int32_t)k, &c.k) && kiln_turbo_spec_of_dtype((int32_t)v, &c.v))
        return kiln_turbo_config_name(&c, buf, cap);
    if (k == v) return snprintf(buf, cap, "%s", fk->name);
    return snprintf(buf, cap, "%s/%s", fk->name, fv->name);
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
    if (kiln_turbo_spec_of_dtype((int32_t)t, NULL) &&
        (!kiln_turbo_head_dim_valid(g->head_dim) ||
         (int64_t)g->n_head_kv * g->head_dim != g->kv_dim))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s %s (TurboQuant) needs a head size that is a power of two in "
                              "%d..%d for its Walsh-Hadamard rotation (this model: n_head_kv x "
                              "head_dim = %d x %d); use f16, q8_0 or q4_0 for this model",
                              option, f->name, KILN_TURBO_MIN_HEAD_DIM, KILN_TURBO_MAX_HEAD_DIM,
                              g->n_head_kv, g->head_dim);
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
