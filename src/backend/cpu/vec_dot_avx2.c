/*
 * vec_dot_avx2.c - AVX2 + FMA + F16C dot products of weight rows against f32 activations.
 * Only called after kiln_simd_supported(KILN_SIMD_AVX2).
 *
 * Weights are dequantized exactly (every GGML dequantized value used here is representable
 * in f32, so they equal the scalar path's weights) 8 at a time and FMA'd into two 8-lane
 * accumulators per (row, token), alternating by group; see vec_dot_tile.inc for the fixed
 * reduction order. Tiles of up to 2 rows x 3 tokens share weight decodes and activation
 * loads and are bit-identical per (row, token) to the one-token dot. Only explicit
 * FMA/mul/add intrinsics are used, so compiler contraction cannot differ between shapes.
 */
#include <string.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define VEC      __m256
#define LANES    8
#define MAX_ROWS 2
#define MAX_TOK  3

static inline __attribute__((always_inline)) __m256i tail_mask(int m) {
    static const int32_t src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(src + 8 - m));
}

static inline __attribute__((always_inline)) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define V_ZERO()        _mm256_setzero_ps()
#define V_FMA(a, b, c)  _mm256_fmadd_ps((a), (b), (c))
#define V_ADD(a, b)     _mm256_add_ps((a), (b))
#define V_LOADX(p)      _mm256_loadu_ps(p)
#define V_LOADX_N(p, m) _mm256_maskload_ps((p), tail_mask(m))
#define V_HSUM(v)       hsum8(v)

#include "backend/cpu/vec_dot_tile.inc"

KA __m256 i8x8_to_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

KA __m256 u8x8_to_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

KA uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

KA __m128i load8(const uint8_t *p) {
    return _mm_loadl_epi64((const __m128i *)p);
}

/* ---------------------------------------------------------------- plain types (unit 32) */

KA __m256 f32_group(const uint8_t *row, int64_t u, int g) {
    return _mm256_loadu_ps((const float *)row + u * 32 + g * 8);
}
KA __m256 f32_part(const uint8_t *row, int64_t first, int m) {
    return _mm256_maskload_ps((const float *)row + first, tail_mask(m));
}

KA __m256 f16_group(const uint8_t *row, int64_t u, int g) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (u * 32 + g * 8))));
}
KA __m256 f16_part(const uint8_t *row, int64_t first, int m) {
    uint16_t t[8] = {0};
    memcpy(t, row + 2 * first, (size_t)m * 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

KA __m256 bf16_to_ps(__m128i v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
KA __m256 bf16_group(const uint8_t *row, int64_t u, int g) {
    return bf16_to_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (u * 32 + g * 8))));
}
KA __m256 bf16_part(const uint8_t *row, int64_t first, int m) {
    uint16_t t[8] = {0};
    memcpy(t, row + 2 * first, (size_t)m * 2);
    return bf16_to_ps(_mm_loadu_si128((const __m128i *)t));
}

/* ---------------------------------------------------------------- Q8_0 / Q4_0 (unit 32) */

KA __m256 q8_0_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + u;
    __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16((const uint8_t *)&b->d)));
    return _mm256_mul_ps(i8x8_to_ps(load8((const uint8_t *)b->qs + 8 * g)), d);
}

KA __m256 q4_0_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + u;
    __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16((const uint8_t *)&b->d)));
    __m128i v = load8(b->qs + 8 * (g & 1));
    if (g >= 2) v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    return _mm256_mul_ps(i8x8_to_ps(v), d);
}

/* ---------------------------------------------------------------- Q4_K (unit 256) */

/* Units are whole super-blocks, so g (0..31) is a compile-time constant after unrolling:
 * sub-block j = g / 4 and every index below folds; repeated loads of d/dmin/scales within
 * a unit are common subexpressions. */
KA __m256 q4_k_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q4_k *b = (const kiln_block_q4_k *)row + u;
    const int j = g / 4;
    const uint8_t *s = b->scales;
    int sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    int m = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    float d1 = _cvtsh_ss(rd16((const uint8_t *)&b->d)) * (float)sc;
    float m1 = _cvtsh_ss(rd16((const uint8_t *)&b->dmin)) * (float)m;
    __m128i v = load8(b->qs + 32 * (j / 2) + 8 * (g % 4));
    if (j & 1) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    return _mm256_fmsub_ps(_mm256_set1_ps(d1), u8x8_to_ps(v), _mm256_set1_ps(m1));
}

/* ---------------------------------------------------------------- Q6_K (unit 256) */

KA __m256 q6_k_group(const uint8_t *row, int64_t u, int g) {
    const kiln_block_q6_k *b = (const kiln_block_q6_k *)row + u;
    const int t = g / 4, h = t / 4, grp = t % 4, part = g % 4; /* 32-element group t */
    __m128i l = load8(b->ql + 64 * h + 32 * (grp & 1) + 8 * part);
    __m128i q = load8(b->qh + 32 * h + 8 * part);
    if (grp >= 2) l = _mm_srli_epi16(l, 4);
    l = _mm_and_si128(l, _mm_set1_epi8(15));
    if (grp) q = _mm_srli_epi16(q, 2 * grp);
    q = _mm_and_si128(q, _mm_set1_epi8(3));
    q = _mm_sub_epi8(_mm_or_si128(l, _mm_slli_epi16(q, 4)), _mm_set1_epi8(32));
    float ds = _cvtsh_ss(rd16((const uint8_t *)&b->d)) * (float)b->scales[g / 2];
    return _mm256_mul_ps(i8x8_to_ps(q), _mm256_set1_ps(ds));
}

/* ---------------------------------------------------------------- instantiation */

#define KILN_DEFINE(NAME, UNIT, PLAIN)                                                             \
    KILN_TILE_BODY(NAME, UNIT, PLAIN)                                                              \
    static void NAME##_tile(int64_t n, const void *w, size_t rs, int nrows, const float *x,        \
                            int64_t ldx, int ntok, float *out) {                                   \
        if (nrows >= 2) {                                                                          \
            switch (ntok) {                                                                        \
                KILN_TILE_CASE_R(NAME, 2, 1)                                                       \
                KILN_TILE_CASE_R(NAME, 2, 2)                                                       \
            default:                                                                               \
                NAME##_body(n, (const uint8_t *)w, rs, x, ldx, 2, 3, out, 0);                      \
                return;                                                                            \
            }                                                                                      \
        }                                                                                          \
        switch (ntok) {                                                                            \
            KILN_TILE_CASE_R(NAME, 1, 1)                                                           \
            KILN_TILE_CASE_R(NAME, 1, 2)                                                           \
        default:                                                                                   \
            NAME##_body(n, (const uint8_t *)w, rs, x, ldx, 1, 3, out, 0);                          \
            return;                                                                                \
        }                                                                                          \
    }                                                                                              \
    KILN_GEMV_FN(NAME)                                                                             \
    static const kiln_cpu_kernel NAME##_kernel = {NAME##_dot, NAME##_tile, MAX_ROWS, MAX_TOK,      \
                                                  NAME##_gemv};

/* bytes of one 32-element (256 for the K-quants) decode unit */
#define f32_UBYTES  128
#define f16_UBYTES  64
#define bf16_UBYTES 64
#define q8_0_UBYTES ((size_t)sizeof(kiln_block_q8_0))
#define q4_0_UBYTES ((size_t)sizeof(kiln_block_q4_0))
#define q4_k_UBYTES ((size_t)sizeof(kiln_block_q4_k))
#define q6_k_UBYTES ((size_t)sizeof(kiln_block_q6_k))

/* block types never have a partial tail; these keep the skeleton well-formed */
#define q8_0_part(row, first, m) V_ZERO()
#define q4_0_part(row, first, m) V_ZERO()
#define q4_k_part(row, first, m) V_ZERO()
#define q6_k_part(row, first, m) V_ZERO()

KILN_DEFINE(f32, 32, 1)
KILN_DEFINE(f16, 32, 1)
KILN_DEFINE(bf16, 32, 1)
KILN_DEFINE(q8_0, 32, 0)
KILN_DEFINE(q4_0, 32, 0)
KILN_DEFINE(q4_k, 256, 0)
KILN_DEFINE(q6_k, 256, 0)

const kiln_cpu_kernel *kiln_cpu_kernel_avx2(kiln_dtype t) {
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

const kiln_cpu_kernel *kiln_cpu_kernel_avx2(kiln_dtype t) {
    (void)t;
    return NULL;
}

#endif
