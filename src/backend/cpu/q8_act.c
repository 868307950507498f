/*
 * q8_act.c - q8 activations: quantizing rows on each path, the scalar reference q8 dot
 * products of Q8_0 / Q4_0 weights, and dispatch (cpu.h documents the semantics and the fixed
 * reduction order shared by every path; q8_ref.c the row layout and reference quantizer).
 */
#include <math.h>

#include "backend/cpu/kernels.h"

void kiln_cpu_q8_quantize(kiln_simd path, int64_t n, int64_t n_rows, const float *x, void *dst) {
    size_t rs = kiln_cpu_q8_row_size(n);
    if (rs == 0) return;
    bool avx512 = path == KILN_SIMD_AVX512 && kiln_simd_supported(KILN_SIMD_AVX512);
    bool avx2 = path == KILN_SIMD_AVX2 && kiln_simd_supported(KILN_SIMD_AVX2);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        uint8_t *d = (uint8_t *)dst + (size_t)r * rs;
        if (avx512)
            kiln_cpu_q8_quantize_row_avx512(n, xr, d);
        else if (avx2)
            kiln_cpu_q8_quantize_row_avx2(n, xr, d);
        else
            kiln_cpu_q8_quantize_row_ref(n, xr, d, kiln_cpu_q8_layout_t16(path));
    }
}

/* ---------------------------------------------------------------- scalar reference */

/* the fixed final reduction of the 16 accumulators (cpu.h) */
static float reduce16(const float a[16]) {
    float s8[8], s4[4], s2[2];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    for (int j = 0; j < 2; j++) s2[j] = s4[j] + s4[j + 2];
    return s2[0] + s2[1];
}

static float q8dot_q8_0(int64_t n, const void *w, const void *xq) {
    const kiln_block_q8_0 *b = w;
    const int8_t *qx = xq;
    int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const float *dx = (const float *)((const uint8_t *)xq + KILN_Q8_D_OFF(nbp));
    float a[16] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += (int32_t)b[i].qs[j] * qx[32 * i + j];
        float D = kiln_fp16_to_fp32(b[i].d) * dx[i];
        a[i & 15] = fmaf(D, (float)isum, a[i & 15]);
    }
    return reduce16(a);
}

static float q8dot_q4_0(int64_t n, const void *w, const void *xq) {
    const kiln_block_q4_0 *b = w;
    const int8_t *qx = xq;
    int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const float *dx = (const float *)((const uint8_t *)xq + KILN_Q8_D_OFF(nbp));
    float a[16] = {0};
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        const int8_t *x = qx + 32 * i;
        for (int j = 0; j < 16; j++) {
            isum += ((int32_t)(b[i].qs[j] & 15) - 8) * x[j];
            isum += ((int32_t)(b[i].qs[j] >> 4) - 8) * x[j + 16];
        }
        float D = kiln_fp16_to_fp32(b[i].d) * dx[i];
        a[i & 15] = fmaf(D, (float)isum, a[i & 15]);
    }
    return reduce16(a);
}

static const kiln_cpu_q8_kernel k_q8_0 = {.dot = q8dot_q8_0, .max_rows = 1, .max_tok = 1};
static const kiln_cpu_q8_kernel k_q4_0 = {.dot = q8dot_q4_0, .max_rows = 1, .max_tok = 1};

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_scalar(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_Q8_0:
        return &k_q8_0;
    case KILN_DTYPE_Q4_0:
        return &k_q4_0;
    default:
        return NULL;
    }
}

/* ---------------------------------------------------------------- dispatch */

bool kiln_cpu_q8_supported(kiln_dtype t) {
    return kiln_cpu_q8_kernel_scalar(t) != NULL;
}

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_get(kiln_dtype t, kiln_simd path) {
    if (!kiln_simd_supported(path)) return NULL;
    switch (path) {
    case KILN_SIMD_SCALAR:
        return kiln_cpu_q8_kernel_scalar(t);
    case KILN_SIMD_AVX2:
        return kiln_cpu_q8_kernel_avx2(t, kiln_cpu_use_avxvnni());
    case KILN_SIMD_AVX512:
        return kiln_cpu_q8_kernel_avx512(t, kiln_cpu_use_vnni());
    }
    return NULL;
}

kiln_vec_dot_q8_fn kiln_cpu_vec_dot_q8(kiln_dtype t, kiln_simd path) {
    const kiln_cpu_q8_kernel *k = kiln_cpu_q8_kernel_get(t, path);
    return k ? k->dot : NULL;
}
