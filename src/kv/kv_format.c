/* kv_format.c - the KV page-format traits table (kv_format.h). */
#include "kv/kv_format.h"

#include <string.h>

static void f32_write(void *dst, const float *src, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f32_read(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_write(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    for (int64_t e = 0; e < n; e++) d[e] = kiln_fp32_to_fp16(src[e]);
}

static void f16_read(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t e = 0; e < n; e++) dst[e] = kiln_fp16_to_fp32(s[e]);
}

static void bf16_write(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    for (int64_t e = 0; e < n; e++) d[e] = kiln_fp32_to_bf16(src[e]);
}

static void bf16_read(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t e = 0; e < n; e++) dst[e] = kiln_bf16_to_fp32(s[e]);
}

static const kiln_kv_format_traits g_formats[] = {
    {KILN_DTYPE_F32, "f32", 4, KILN_KV_OPERAND_F32, f32_write, f32_read},
    {KILN_DTYPE_F16, "f16", 2, KILN_KV_OPERAND_F16, f16_write, f16_read},
    {KILN_DTYPE_BF16, "bf16", 2, KILN_KV_OPERAND_BF16, bf16_write, bf16_read},
};

const kiln_kv_format_traits *kiln_kv_format_of(kiln_dtype t) {
    for (size_t i = 0; i < sizeof g_formats / sizeof g_formats[0]; i++)
        if (g_formats[i].dtype == t) return &g_formats[i];
    return NULL;
}

size_t kiln_kv_format_row_bytes(kiln_dtype t, int64_t n) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    if (!f || n < 1) return 0;
    size_t b;
    if (__builtin_mul_overflow((size_t)n, f->elem_bytes, &b)) return 0;
    return b;
}
