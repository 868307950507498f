/*
 * vec_dot_avx512.c - AVX-512 (F/BW/VL/DQ) dot products of weight rows against f32
 * activations. Only called after kiln_simd_supported(KILN_SIMD_AVX512).
 *
 * Weights are dequantized exactly (every GGML dequantized value used here is representable
 * in f32, so they equal the scalar path's weights) 16 at a time and FMA'd into one 16-lane
 * accumulator per (row, token); see KILN_TILE_BODY for the fixed reduction order. Tiles of
 * up to 4 rows (2 for the K-quants) x 6 tokens share weight decodes and activation loads
 * (24 independent FMA chains) and are bit-identical per (row, token) to the one-token dot.
 * (VNNI / AVX512-BF16 dot instructions would need int8 / bf16 activations, which this path
 * deliberately does not use: activations stay f32.)
 */
#include <string.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define KA static inline __attribute__((always_inline))

KA float hsum16(__m512 v) { /* lanes j + j+8, j + j+4, j + j+2, 0 + 1 */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/*
 * The tile body, per dtype NAME with UNIT elements per decode unit (16 for the plain types,
 * 32 for Q8_0/Q4_0, 256 for the K-quants) and the decoder
 *   __m512 NAME_group(const uint8_t *row, int64_t u, int g)  lanes 16g.. of unit u, exact
 * plus, for plain types, NAME_part(row, first, m): elements first..first+m-1, zero padded.
 *
 * Reduction order of one (row, token) pair, for every tile shape: one accumulator, +0 at
 * first; for each 16-lane group of the row in order (a plain row's last group zero padded
 * on both sides), acc = fma(w_group, x_group, acc); result hsum16(acc). A tile of NR rows x R
 * tokens decodes each weight group once and loads each activation group once, and runs the
 * NR * R independent FMA chains interleaved: every pair sees the same operations as alone.
 * PF (bytes, 0 = none) adds a software prefetch that far ahead of each unit (the gemv kernels;
 * NAME_UBYTES is the bytes of one unit); it changes no arithmetic.
 */
#define KILN_TILE_BODY(NAME, UNIT, PLAIN)                                                          \
    KA void NAME##_body(int64_t n, const uint8_t *w, size_t rs, const float *x, int64_t ldx,       \
                        const int NR, const int R, float *out, const size_t PF) {                  \
        __m512 acc[4][8];                                                                          \
        _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++)                                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();   \
        const int64_t nu = n / (UNIT);                                                             \
        for (int64_t u = 0; u < nu; u++) {                                                         \
            const float *xu = x + u * (UNIT);                                                      \
            if (PF) kiln_prefetch_unit(w, (size_t)u * NAME##_UBYTES, NAME##_UBYTES, PF);           \
            _Pragma("GCC unroll 16") for (int g = 0; g < (UNIT) / 16; g++) {                       \
                __m512 wv[4];                                                                      \
                _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++) wv[k] =                       \
                    NAME##_group(w + (size_t)k * rs, u, g);                                        \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                              \
                    __m512 xv = _mm512_loadu_ps(xu + g * 16 + r * ldx);                            \
                    _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++) acc[k][r] =               \
                        _mm512_fmadd_ps(wv[k], xv, acc[k][r]);                                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (PLAIN && n > nu * (UNIT)) {                                                            \
            const int64_t first = nu * (UNIT);                                                     \
            const int m = (int)(n - first); /* < 16 = UNIT */                                      \
            __m512 wv[4];                                                                          \
            _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++) wv[k] =                           \
                NAME##_part(w + (size_t)k * rs, first, m);                                         \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                  \
                __m512 xv =                                                                        \
                    _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1u), x + first + r * ldx);       \
                _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++) acc[k][r] =                   \
                    _mm512_fmadd_ps(wv[k], xv, acc[k][r]);                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int k = 0; k < NR; k++)                                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) out[k * R + r] =                   \
                hsum16(acc[k][r]);                                                                 \
    }                                                                                              \
    static float NAME##_dot(int64_t n, const void *w, const float *x) {                            \
        float o;                                                                                   \
        NAME##_body(n, (const uint8_t *)w, 0, x, 0, 1, 1, &o, 0);                                  \
        return o;                                                                                  \
    }

/* bytes of one decode unit per dtype */
#define f32_UBYTES  64
#define f16_UBYTES  32
#define bf16_UBYTES 32
#define q8_0_UBYTES ((size_t)sizeof(kiln_block_q8_0))
#define q4_0_UBYTES ((size_t)sizeof(kiln_block_q4_0))
#define q4_k_UBYTES ((size_t)sizeof(kiln_block_q4_k))
#define q6_k_UBYTES ((size_t)sizeof(kiln_block_q6_k))

KA __m512 i8x16_to_ps(__m128i v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}

KA __m512 u8x16_to_ps(__m128i v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}

KA uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* ---------------------------------------------------------------- plain types (unit 32) */

KA __m512 f32_group(const uint8_t *row, int64_t u, int g) {
    return _mm512_loadu_ps((const float *)row + u * 16 + g * 16);
}
KA __m512 f32_part(const uint8_t *row, int64_t first, int m) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1u), (const float *)row + first);
}

KA __m512 f16_group(const uint8_t *row, int64_t u, int g) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (u * 16 + g * 16))));
}
KA __m512 f16_part(const uint8_t *row, int64_t first, int m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << m) - 1u), row + 2 * first));
}

KA __m512 bf16_to_ps(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
KA __m512 bf16_group(const uint8_t *row, int64_t u, int g) {
    return bf16_to_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (u * 16 + g * 16))));
}
KA __m512 bf16_part(const uint8_t *row, int64_t first, int m) {
    return bf16_to_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << m) - 1u), row + 2 * first));
}

/* ---------------------------------------------------------------- Q8_0 / Q4_0 (unit 32) */

KA __m512 q8_0_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + u;
    __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16((const uint8_t *)&b->d)));
    return _mm512_mul_ps(i8x16_to_ps(_mm_loadu_si128((const __m128i *)(b->qs + 16 * g))), d);
}

KA __m512 q4_0_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + u;
    __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16((const uint8_t *)&b->d)));
    __m128i v = _mm_loadu_si128((const __m128i *)b->qs);
    if (g) v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    return _mm512_mul_ps(i8x16_to_ps(v), d);
}

/* ---------------------------------------------------------------- Q4_K (unit 256) */

/* Units are whole super-blocks, so g (0..15) is a compile-time constant after unrolling:
 * sub-block j = g / 2 and every index below folds; repeated loads of d/dmin/scales within
 * a unit are common subexpressions. */
KA __m512 q4_k_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q4_k *b = (const kiln_block_q4_k *)row + u;
    const int j = g / 2;
    const uint8_t *s = b->scales;
    int sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    int m = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    float d1 = _cvtsh_ss(rd16((const uint8_t *)&b->d)) * (float)sc;
    float m1 = _cvtsh_ss(rd16((const uint8_t *)&b->dmin)) * (float)m;
    __m128i v = _mm_loadu_si128((const __m128i *)(b->qs + 32 * (j / 2) + 16 * (g % 2)));
    if (j & 1) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    return _mm512_fmsub_ps(_mm512_set1_ps(d1), u8x16_to_ps(v), _mm512_set1_ps(m1));
}

/* ---------------------------------------------------------------- Q6_K (unit 256) */

KA __m512 q6_k_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q6_k *b = (const kiln_block_q6_k *)row + u;
    const int t = g / 2, h = t / 4, grp = t % 4, part = g % 2; /* 32-element group t */
    __m128i l = _mm_loadu_si128((const __m128i *)(b->ql + 64 * h + 32 * (grp & 1) + 16 * part));
    __m128i q = _mm_loadu_si128((const __m128i *)(b->qh + 32 * h + 16 * part));
    if (grp >= 2) l = _mm_srli_epi16(l, 4);
    l = _mm_and_si128(l, _mm_set1_epi8(15));
    if (grp) q = _mm_srli_epi16(q, 2 * grp);
    q = _mm_and_si128(q, _mm_set1_epi8(3));
    q = _mm_sub_epi8(_mm_or_si128(l, _mm_slli_epi16(q, 4)), _mm_set1_epi8(32));
    float ds = _cvtsh_ss(rd16((const uint8_t *)&b->d)) * (float)b->scales[g];
    return _mm512_mul_ps(i8x16_to_ps(q), _mm512_set1_ps(ds));
}

/* ---------------------------------------------------------------- instantiation */

#define KILN_TILE_CASE(NAME, NR, R)                                                                \
    case R:                                                                                        \
        NAME##_body(n, (const uint8_t *)w, rs, x, ldx, NR, R, out, 0);                             \
        return;

/* tiles of MR rows (or 1, for the last rows of a range) x 1..6 tokens */
#define KILN_DEFINE(NAME, UNIT, PLAIN, MR)                                                         \
    KILN_TILE_BODY(NAME, UNIT, PLAIN)                                                              \
    static void NAME##_tile(int64_t n, const void *w, size_t rs, int nrows, const float *x,        \
                            int64_t ldx, int ntok, float *out) {                                   \
        if (nrows >= MR) {                                                                         \
            switch (ntok) {                                                                        \
                KILN_TILE_CASE(NAME, MR, 1)                                                        \
                KILN_TILE_CASE(NAME, MR, 2)                                                        \
                KILN_TILE_CASE(NAME, MR, 3)                                                        \
                KILN_TILE_CASE(NAME, MR, 4)                                                        \
                KILN_TILE_CASE(NAME, MR, 5)                                                        \
            default:                                                                               \
                NAME##_body(n, (const uint8_t *)w, rs, x, ldx, MR, 6, out, 0);                     \
                return;                                                                            \
            }                                                                                      \
        }                                                                                          \
        for (int k = 0; k < nrows; k++) { /* the same per-pair operations, one row at a time */    \
            const uint8_t *wk = (const uint8_t *)w + (size_t)k * rs;                               \
            float *ok = out + k * ntok;                                                            \
            switch (ntok) {                                                                        \
            case 1:                                                                                \
                NAME##_body(n, wk, rs, x, ldx, 1, 1, ok, 0);                                       \
                break;                                                                             \
            case 2:                                                                                \
                NAME##_body(n, wk, rs, x, ldx, 1, 2, ok, 0);                                       \
                break;                                                                             \
            case 3:                                                                                \
                NAME##_body(n, wk, rs, x, ldx, 1, 3, ok, 0);                                       \
                break;                                                                             \
            case 4:                                                                                \
                NAME##_body(n, wk, rs, x, ldx, 1, 4, ok, 0);                                       \
                break;                                                                             \
            case 5:                                                                                \
                NAME##_body(n, wk, rs, x, ldx, 1, 5, ok, 0);                                       \
                break;                                                                             \
            default:                                                                               \
                NAME##_body(n, wk, rs, x, ldx, 1, 6, ok, 0);                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    KILN_GEMV_FN(NAME)                                                                             \
    static const kiln_cpu_kernel NAME##_kernel = {NAME##_dot, NAME##_tile, MR, 6, NAME##_gemv};

/* block types never have a partial tail; these keep the skeleton well-formed */
#define q8_0_part(row, first, m) _mm512_setzero_ps()
#define q4_0_part(row, first, m) _mm512_setzero_ps()
#define q4_k_part(row, first, m) _mm512_setzero_ps()
#define q6_k_part(row, first, m) _mm512_setzero_ps()

KILN_DEFINE(f32, 16, 1, 4)
KILN_DEFINE(f16, 16, 1, 4)
KILN_DEFINE(bf16, 16, 1, 4)
KILN_DEFINE(q8_0, 32, 0, 4)
KILN_DEFINE(q4_0, 32, 0, 4)
KILN_DEFINE(q4_k, 256, 0, 2)
KILN_DEFINE(q6_k, 256, 0, 2)

const kiln_cpu_kernel *kiln_cpu_kernel_avx512(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32:
        return &f32_kernel;
    case KILN_DTYPE_F16:
        return &f16_kernel;
    case KILN_DTYPE_BF16:
        return &bf16_kernel;
    case KILN_DTYPE_Q8_0:
        return &q8_0_kernel;
    case KILN_DTYPE_Q4_0:
        return &q4_0_kernel;
    case KILN_DTYPE_Q4_K:
        return &q4_k_kernel;
    case KILN_DTYPE_Q6_K:
        return &q6_k_kernel;
    default:
        return NULL;
    }
}

#else

const kiln_cpu_kernel *kiln_cpu_kernel_avx512(kiln_dtype t) {
    (void)t;
    return NULL;
}

#endif
