/*
 * q8_ref.c - the q8 activation row layout (cpu.h): its size, where each quant lies in either
 * layout, the reference row quantizer (which the AVX2 and AVX-512 quantizers also use for rows
 * they do not cover) and reading a block back.
 */
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

void kiln_cpu_q8_get_block(kiln_simd path, int64_t n, const void *row, int64_t b,
                           kiln_block_q8_0 *out) {
    const uint8_t *r = row;
    bool t16 = kiln_cpu_q8_layout_t16(path);
    int64_t nbp = kiln_q8_nbp(n);
    float d;
    memcpy(&d, r + KILN_Q8_D_OFF(nbp) + 4 * (size_t)b, 4);
    out->d = kiln_fp32_to_fp16(d); /* exact: d holds an fp16 value */
    for (int e = 0; e < 32; e++) out->qs[e] = (int8_t)r[qs_off(b, e, t16, n / 32)];
}
