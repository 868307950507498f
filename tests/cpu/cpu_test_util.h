/* cpu_test_util.h - shared helpers of the tests in tests/cpu: RNG and random weight rows. */
#ifndef KILN_TESTS_CPU_TEST_UTIL_H
#define KILN_TESTS_CPU_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"

static uint64_t ct_rng = 0x853C49E6748FEA9Bull;

static inline uint32_t ct_u32(void) {
    ct_rng = ct_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(ct_rng >> 33);
}

static inline float ct_uniform(void) { /* [-1, 1) */
    return (float)((double)ct_u32() / 1073741824.0 - 1.0);
}

static const kiln_dtype ct_types[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16,
                                      KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_K,
                                      KILN_DTYPE_Q6_K};
enum { CT_N_TYPES = sizeof ct_types / sizeof ct_types[0] };

/*
 * Fill `rows` weight rows of n elements of dtype t. raw = 0: quantize random floats with
 * the reference quantizer; raw = 1 (block types): random block bytes with sane fp16 scales,
 * which exercises every quant code. Returns malloc'd bytes (row stride row_size(t, n)).
 */
static inline uint8_t *ct_random_rows(kiln_dtype t, int64_t rows, int64_t n, int raw) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    size_t rs = kiln_dtype_row_size(t, n);
    uint8_t *w = malloc(rs * (size_t)rows + 1);
    float *tmp = malloc(sizeof(float) * (size_t)n);
    if (!w || !tmp) abort();
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + rs * (size_t)r;
        if (raw && tr->is_quantized) {
            for (size_t i = 0; i < rs; i++) row[i] = (uint8_t)ct_u32();
            /* overwrite the fp16 scale fields with values in [2^-9, 2^-1) of either sign */
            int64_t nb = n / tr->block_size;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = row + (size_t)b * tr->type_size;
                uint16_t h[2];
                for (int k = 0; k < 2; k++)
                    h[k] = (uint16_t)(((ct_u32() & 1) << 15) | ((6 + ct_u32() % 8) << 10) |
                                      (ct_u32() & 1023));
                if (t == KILN_DTYPE_Q4_K) h[0] &= 0x7FFF, h[1] &= 0x7FFF;
                if (t == KILN_DTYPE_Q6_K)
                    memcpy(blk + 208, &h[0], 2);
                else if (t == KILN_DTYPE_Q4_K)
                    memcpy(blk, h, 4);
                else
                    memcpy(blk, &h[0], 2);
            }
        } else {
            for (int64_t i = 0; i < n; i++) tmp[i] = ct_uniform() * (1 + (ct_u32() % 4));
            tr->from_float(tmp, row, n);
        }
    }
    free(tmp);
    return w;
}

/* Reference: dequantize with the dtype's to_float and sum in double. *abs_sum = sum|w x|. */
static inline double ct_ref_dot(kiln_dtype t, int64_t n, const void *w, const float *x,
                                double *abs_sum) {
    float *tmp = malloc(sizeof(float) * (size_t)n);
    if (!tmp) abort();
    kiln_dtype_traits_of(t)->to_float(w, tmp, n);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)tmp[i] * x[i];
        a += fabs((double)tmp[i] * x[i]);
    }
    free(tmp);
    if (abs_sum) *abs_sum = a;
    return s;
}

#endif
