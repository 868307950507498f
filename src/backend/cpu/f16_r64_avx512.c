/*
 * f16_r64_avx512.c - the packed-F16 kernel on AVX-512: a group's 64 rows are 4 zmm vectors;
 * tiles of 4 vectors x up to 6 tokens (24 accumulators), one token reads the group's stream
 * once with 4 FMA chains. Only called after kiln_simd_supported(KILN_SIMD_AVX512).
 *
 * 2-core AMD EPYC (Zen 5), 2 threads, 512 tokens, against the row layout's 4 x 6 dot tiles
 * (probe in the same process): 5632 x 2048 491 vs 426 GFLOP/s, 2048 x 5632 481 vs 418
 * (this machine's FMA peak is ~538 GFLOP/s on 2 cores).
 */
#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define VEC            __m512
#define LANES          16
#define V_ZERO()       _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_HALF(p)      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define V_BCAST(p)     _mm512_set1_ps(*(p))
#define V_STORE(p, v)  _mm512_storeu_ps(p, v)
#define NV_TOK         4
#define NV_ONE         4
#define MAX_TOK        6
#define R64_TOK_CASES                                                                              \
    R64_CASE(2) R64_CASE(3) R64_CASE(4) R64_CASE(5) R64_CASE(6) default : R64_CASE(1)

#include "backend/cpu/f16_r64_tile.inc"

static const kiln_cpu_r64_kernel k_r64_avx512 = {r64_tile, MAX_TOK};

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx512(void) {
    return &k_r64_avx512;
}

#else

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx512(void) {
    return NULL;
}

#endif
