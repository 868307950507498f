/*
 * q8_act.c - q8 activations: the scratch row layouts, the reference row quantizer, the
 * scalar reference q8 dot products of Q8_0 / Q4_0 weights, and dispatch (cpu.h documents
 * the semantics and the fixed reduction order shared by every path).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"

/* ---------------------------------------------------------------- layout */

size_t kiln_cpu_q8_row_size(int64_t n) {
    if (n < 0 || n % 32 != 0) return 0;
    int64_t nbp = kiln_q8_nbp(n);
    if ((uint64_t)nbp > SIZE_MAX / 64) return 0;
    return (size_t)nbp * 40;
}

/* byte offset of element e (0..31) of block b in the quants area of a row of nb blocks */
static inline size_t qs_off(int64_t b, int e, bool t16, int64_t nb) {
    if (!t16 || b >= nb / 16 * 16) return (size_t)b * 32 + (size_t)e;
    return (size_t)(b / 16) * 512 + (size_t)(e / 4) * 64 + (size_t)(b % 16) * 4 + (size_t)(e % 4);
}

void kiln_cpu_q8_quantize_row_ref(int64_t n, const float *x, uint8_t *dst, bool t16) {
    int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    memset(dst, 0, kiln_cpu_q8_row_size(n));
    float *dx = (float *)(dst + KILN_Q8_D_OFF(nbp));
    int32_t *sx = (int32_t *)(dst + KILN_Q8_SUM_OFF(nbp));
    for (int64_t b = 0; b < nb; b++) {
        kiln_block_q8_0 blk;
        kiln_quantize_q8_0_act(x + 32 * b, &blk, 32);
        int32_t s = 0;
        for (int e = 0; e < 32; e++) {
            dst[qs_off(b, e, t16, nb)] = (uint8_t)blk.qs[e];
            s += blk.qs[e];
        }
        dx[b] = kiln_fp16_to_fp32(blk.d);
        sx[b] = t16 ? -8 * s : s; /* t16: the Q4_0 correction, ready to add */
    }
}

static bool layout_t16(kiln_simd path) {
    return path == KILN_SIMD_AVX512;
}

void kiln_cpu_q8_get_block(kiln_simd path, int64_t n, const void *row, int64_t b,
                           kiln_block_q8_0 *out) {
    const uint8_t *r = row;
    bool t16 = layout_t16(path);
    int64_t nbp = kiln_q8_nbp(n);
    float d;
    memcpy(&d, r + KILN_Q8_D_OFF(nbp) + 4 * (size_t)b, 4);
    out->d = kiln_fp32_to_fp16(d); /* exact: d holds an fp16 value */
    for (int e = 0; e < 32; e++) out->qs[e] = (int8_t)r[qs_off(b, e, t16, n / 32)];
}

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
            kiln_cpu_q8_quantize_row_ref(n, xr, d, layout_t16(path));
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
        return kiln_cpu_q8_kernel_avx2(t);
    case KILN_SIMD_AVX512:
        return kiln_cpu_q8_kernel_avx512(t, kiln_cpu_use_vnni());
    }
    return NULL;
}

kiln_vec_dot_q8_fn kiln_cpu_vec_dot_q8(kiln_dtype t, kiln_simd path) {
    const kiln_cpu_q8_kernel *k = kiln_cpu_q8_kernel_get(t, path);
    return k ? k->dot : NULL;
}
