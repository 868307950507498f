/*
 * f16_r64_avx2.c - the packed-F16 kernel on AVX2 (+FMA, F16C): a group's 64 rows are 8 ymm
 * vectors; several tokens go through sub-blocks of 2 vectors x up to 6 tokens (12
 * accumulators of the 16 registers), one token through all 8 vectors in one pass over the
 * group's stream. Same bits as the scalar and AVX-512 kernels (cpu.h). Only called after
 * kiln_simd_supported(KILN_SIMD_AVX2).
 */
#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define VEC            __m256
#define LANES          8
#define V_ZERO()       _mm256_setzero_ps()
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_HALF(p)      _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define V_BCAST(p)     _mm256_broadcast_ss(p)
#define V_STORE(p, v)  _mm256_storeu_ps(p, v)
#define NV_TOK         2
#define NV_ONE         8
#define MAX_TOK        6
#define R64_TOK_CASES                                                                              \
    R64_CASE(2) R64_CASE(3) R64_CASE(4) R64_CASE(5) R64_CASE(6) default : R64_CASE(1)

#include "backend/cpu/f16_r64_tile.inc"

static const kiln_cpu_r64_kernel k_r64_avx2 = {r64_tile, MAX_TOK};

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx2(void) {
    return &k_r64_avx2;
}

#else

const kiln_cpu_r64_kernel *kiln_cpu_r64_kernel_avx2(void) {
    return NULL;
}

#endif
