/*
 * vec_dot_scalar.c - the scalar reference dot products of every weight dtype against f32
 * activations. Reduction order (fixed): plain types sum w[i]*x[i] left to right in f32;
 * block types sum q*x left to right within a block (f32), then add scale * block_sum (or,
 * for the K types, the per-sub-block terms) to the running total block after block.
 */
#include <stddef.h>
#include <string.h>

#include "backend/cpu/kernels.h"

/* Plain-type rows may be only byte-aligned (safetensors), so elements are read by memcpy
 * (a plain load after optimisation). Block rows are 2-byte aligned (GGUF aligns to 32). */
static float dot_f32(int64_t n, const void *w, const float *x) {
    const uint8_t *a = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, a + 4 * i, 4);
        s += v * x[i];
    }
    return s;
}

static float dot_f16(int64_t n, const void *w, const float *x) {
    const uint8_t *a = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, a + 2 * i, 2);
        s += kiln_fp16_to_fp32(h) * x[i];
    }
    return s;
}

static float dot_bf16(int64_t n, const void *w, const float *x) {
    const uint8_t *a = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, a + 2 * i, 2);
        s += kiln_bf16_to_fp32(h) * x[i];
    }
    return s;
}

/* sum over blocks of d * sum_j(q_j * x_j) */
static float dot_q8_0(int64_t n, const void *w, const float *x) {
    const kiln_block_q8_0 *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        const float *xb = x + 32 * i;
        float bs = 0.0f;
        for (int j = 0; j < 32; j++) bs += (float)b[i].qs[j] * xb[j];
        s += kiln_fp16_to_fp32(b[i].d) * bs;
    }
    return s;
}

/* sum over blocks of d * sum_j((q_j - 8) * x_j) */
static float dot_q4_0(int64_t n, const void *w, const float *x) {
    const kiln_block_q4_0 *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        const float *xb = x + 32 * i;
        float bs = 0.0f;
        for (int j = 0; j < 16; j++) bs += (float)((int)(b[i].qs[j] & 15) - 8) * xb[j];
        for (int j = 0; j < 16; j++) bs += (float)((int)(b[i].qs[j] >> 4) - 8) * xb[j + 16];
        s += kiln_fp16_to_fp32(b[i].d) * bs;
    }
    return s;
}

/* per sub-block j: d*sc_j * sum(q*x) - dmin*m_j * sum(x), sub-blocks in element order */
static float dot_q4_k(int64_t n, const void *w, const float *x) {
    const kiln_block_q4_k *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kiln_fp16_to_fp32(b[i].d), dmin = kiln_fp16_to_fp32(b[i].dmin);
        const float *xb = x + 256 * i;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            int shift = (j & 1) * 4;
            uint8_t sc, m;
            kiln_q4k_scale_min(j, b[i].scales, &sc, &m);
            float sqx = 0.0f, sx = 0.0f;
            for (int l = 0; l < 32; l++) {
                sqx += (float)((q[l] >> shift) & 15) * xb[32 * j + l];
                sx += xb[32 * j + l];
            }
            s += d * (float)sc * sqx;
            s -= dmin * (float)m * sx;
        }
    }
    return s;
}

/* per 16-element sub-block j: d*scales[j] * sum((q6 - 32) * x), in element order */
static float dot_q6_k(int64_t n, const void *w, const float *x) {
    const kiln_block_q6_k *b = w;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kiln_fp16_to_fp32(b[i].d);
        const float *xb = x + 256 * i;
        for (int j = 0; j < 16; j++) {
            int h = j / 8;         /* 128-element half */
            int k = (j % 8) / 2;   /* 32-element group within the half */
            int l0 = (j % 2) * 16; /* first l of this sub-block */
            const uint8_t *ql = b[i].ql + 64 * h + (k & 1) * 32;
            const uint8_t *qh = b[i].qh + 32 * h;
            int lshift = (k >> 1) * 4, hshift = 2 * k;
            float sq = 0.0f;
            for (int l = l0; l < l0 + 16; l++) {
                int q = (((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4)) - 32;
                sq += (float)q * xb[16 * j + (l - l0)];
            }
            s += d * (float)b[i].scales[j] * sq;
        }
    }
    return s;
}

static const kiln_cpu_kernel k_f32 = {dot_f32, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_f16 = {dot_f16, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_bf16 = {dot_bf16, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_q8_0 = {dot_q8_0, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_q4_0 = {dot_q4_0, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_q4_k = {dot_q4_k, NULL, 1, 1, NULL};
static const kiln_cpu_kernel k_q6_k = {dot_q6_k, NULL, 1, 1, NULL};

const kiln_cpu_kernel *kiln_cpu_kernel_scalar(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32:
        return &k_f32;
    case KILN_DTYPE_F16:
        return &k_f16;
    case KILN_DTYPE_BF16:
        return &k_bf16;
    case KILN_DTYPE_Q8_0:
        return &k_q8_0;
    case KILN_DTYPE_Q4_0:
        return &k_q4_0;
    case KILN_DTYPE_Q4_K:
        return &k_q4_k;
    case KILN_DTYPE_Q6_K:
        return &k_q6_k;
    default:
        return NULL;
    }
}
