/*
 * f16_r64.c - the packed F16 weight layout (KILN_LAYOUT_F16_R64, cpu.h): its size, the
 * packing from the row layout, and the scalar reference kernel whose order every path
 * reproduces bit for bit (acc = fma(w[o][k], x[t][k], acc) for k = 0, 1, ...).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"

size_t kiln_cpu_layout_bytes(kiln_cpu_layout layout, kiln_dtype wt, int64_t n_out, int64_t n_in) {
    if (n_out < 0 || n_in < 0) return 0;
    switch (layout) {
    case KILN_LAYOUT_ROWS: {
        size_t rs = kiln_dtype_row_size(wt, n_in);
        if (n_out > 0 && rs > SIZE_MAX / (uint64_t)n_out) return 0;
        return rs * (size_t)n_out;
    }
    case KILN_LAYOUT_F16_R64: {
        if (wt != KILN_DTYPE_F16) return 0;
        uint64_t groups = ((uint64_t)n_out + KILN_CPU_R64 - 1) / KILN_CPU_R64;
        uint64_t per = (uint64_t)n_in * KILN_CPU_R64 * 2; /* n_in < 2^63: no overflow */
        if ((uint64_t)n_in > SIZE_MAX / (KILN_CPU_R64 * 2)) return 0;
        if (groups > 0 && per > SIZE_MAX / groups) return 0;
        return (size_t)(groups * per);
    }
    }
    return 0;
}

/* Group by group, in blocks of 16 input elements: the 64 rows' 32-byte pieces of a block are
 * read and written as 16 contiguous 128-byte lines (a 2 KiB block that stays in L1; writing
 * whole columns instead walked the group's 128 * n_in bytes for every row, ~10x slower). */
enum { PACK_KB = 16 };

typedef struct pack_ctx {
    int64_t n_out, n_in;
    const uint8_t *src;
    uint16_t *dst;
} pack_ctx;

/* groups [g0, g1) */
static void pack_groups(const pack_ctx *c, int64_t g0, int64_t g1) {
    const int64_t n_out = c->n_out, n_in = c->n_in;
    const size_t rs = (size_t)n_in * 2;
    for (int64_t g = g0; g < g1; g++) {
        uint16_t *dg = c->dst + (size_t)g * KILN_CPU_R64 * (size_t)n_in;
        const int rows = n_out - g * KILN_CPU_R64 < KILN_CPU_R64 ? (int)(n_out - g * KILN_CPU_R64)
                                                                 : KILN_CPU_R64;
        for (int64_t k0 = 0; k0 < n_in; k0 += PACK_KB) {
            const int kn = n_in - k0 < PACK_KB ? (int)(n_in - k0) : PACK_KB;
            uint16_t *db = dg + (size_t)k0 * KILN_CPU_R64;
            for (int j = 0; j < KILN_CPU_R64; j++) {
                uint16_t h[PACK_KB] = {0}; /* rows past n_out stay zero */
                if (j < rows)
                    memcpy(h, c->src + (size_t)(g * KILN_CPU_R64 + j) * rs + (size_t)k0 * 2,
                           (size_t)kn * 2);
                for (int kk = 0; kk < kn; kk++) db[(size_t)kk * KILN_CPU_R64 + j] = h[kk];
            }
        }
    }
}

static void pack_worker(void *p, int ith, int nth) {
    const pack_ctx *c = p;
    const int64_t ng = (c->n_out + KILN_CPU_R64 - 1) / KILN_CPU_R64;
    pack_groups(c, ng * ith / nth, ng * (ith + 1) / nth);
}

void kiln_cpu_pack_f16_r64(kiln_threadpool *tp, int64_t n_out, int64_t n_in, const void *w,
                           void *dst) {
    pack_ctx c = {n_out, n_in, w, dst};
    if (n_out > KILN_CPU_R64)
        kiln_threadpool_run(tp, pack_worker, &c);
    else
        pack_worker(&c, 0, 1);
}

/* The reference: one (row, token) at a time, in cpu.h's order. fmaf is correctly rounded
 * (C99 7.12.13.1) like the SIMD fused multiply-add, and fp16 -> f32 is exact. */
static void r64_tile_scalar(int64_t n, const uint8_t *g, const float *x, int64_t ldx, int ntok,
                            float *y, int64_t ldy, int lo, int hi, const uint8_t *pf_end,
                            size_t pf) {
    (void)pf_end, (void)pf;
    for (int r = 0; r < ntok; r++) {
        const float *xr = x + (size_t)r * (size_t)ldx;
        for (int j = lo; j < hi; j++) {
            const uint8_t *col = g + 2 * j;
            float acc = 0.0f;
            for (int64_t k = 0; k < n; k++) {
                uint16_t h;
                memcpy(&h, col + (size_t)k * KILN_CPU_R64 * 2, 2);
                acc = fmaf(kiln_fp16_to_fp32(h), xr[k], acc);
            }
            y[(size_t)r * (size_t)ldy + j] = acc;
        }
    }
}

static const kiln_cpu_r64_kernel k_r64_scalar = {r64_tile_scalar, 8};

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_scalar(void) {
    return &k_r64_scalar;
}

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_get(kiln_simd path) {
    if (!kiln_simd_supported(path)) return NULL;
    switch (path) {
    case KILN_SIMD_SCALAR:
        return kiln_cpu_r64_kernel_scalar();
    case KILN_SIMD_AVX2:
        return kiln_cpu_r64_kernel_avx2();
    case KILN_SIMD_AVX512:
        return kiln_cpu_r64_kernel_avx512();
    }
    return NULL;
}
