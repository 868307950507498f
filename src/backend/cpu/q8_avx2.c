/*
 * q8_avx2.c - AVX2 q8-activation kernels (Q8_0 and Q4_0 weights against Q8_0-quantized
 * activations in the "plain" layout) and the AVX2 activation quantizer. Only called after
 * kiln_simd_supported(KILN_SIMD_AVX2).
 *
 * Per block the exact integer sum comes from vpmaddubsw (u8 x s8 -> pairs of i16, never
 * saturating here: Q8_0 uses |w| <= 128 against sign(x, w), |x| <= 127, so a pair is at
 * most 32512; Q4_0 uses the nibble 0..15 and subtracts 8 * sum(q_x) afterwards) and
 * vpmaddwd with ones (-> 8 i32 lanes). Eight blocks' lane vectors are reduced together by a
 * vphaddd tree (lane j = block j), then D = d_w * d_x (exact) and one FMA per lane into the
 * accumulator of blocks 0-7 or 8-15 of each 16-block group: the 16 accumulators of cpu.h,
 * so results are bit-identical to the scalar reference.
 */
#include <float.h>
#include <string.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define KA      static inline __attribute__((always_inline))
#define MAX_TOK 4

KA uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

KA float hsum8(__m256 v) { /* lanes j + j+4, then j + j+2, then 0 + 1 (cpu.h order) */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* one block's 8 lane sums (Q8_0: |w| against sign(x, w); Q4_0: nibbles, corrected by 8 sum x) */
KA __m256i blk_dot(const int Q4, const int VNNI, const uint8_t *wb, __m256i x) {
    (void)VNNI;
    if (Q4) {
        __m128i q = _mm_loadu_si128((const __m128i *)(wb + 2));
        __m256i u =
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
    }
    __m256i q = _mm256_loadu_si256((const __m256i *)(wb + 2));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)),
                             _mm256_set1_epi16(1));
}

/* what a block's raw integer sum needs added, from its stored (plain layout) quant sum */
KA int32_t blk_corr(const int Q4, const int VNNI, int32_t sx) {
    (void)VNNI;
    return Q4 ? -8 * sx : 0;
}

#include "backend/cpu/q8_small.inc"

/* the fp16 scales of blocks p, p + s, ... (the first cnt; 0 for the rest) as f32 */
KA __m256 load_d8(const uint8_t *p, size_t s, const int cnt) {
#define D_(j) (short)((j) < cnt ? rd16(p + (j)*s) : 0)
    return _mm256_cvtph_ps(_mm_setr_epi16(D_(0), D_(1), D_(2), D_(3), D_(4), D_(5), D_(6), D_(7)));
#undef D_
}

/*
 * Blocks g0 .. g0 + cnt - 1 (cnt <= 8) of weight row w against R quantized rows, into the
 * accumulator half h (blocks 0-7 / 8-15 of each 16-block group). Missing blocks of a
 * partial group contribute isum 0 with scale 0: fma(0, 0, a) = a. Called with the constant
 * cnt = 8 for full groups, so the guards fold away there.
 */
KA void q8_group(const int Q4, const int cnt, const uint8_t *w, int64_t g0, int64_t nbp,
                 const uint8_t *xq, size_t xs, const int R, const int h, __m256 acc[][2]) {
    const size_t BSZ = Q4 ? sizeof(kiln_block_q4_0) : sizeof(kiln_block_q8_0);
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
    const uint8_t *wg = w + (size_t)g0 * BSZ;
    const __m256 dw = load_d8(wg, BSZ, cnt);
    __m256i W[8]; /* Q8_0: |w|; Q4_0: the 32 nibbles in element order */
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
        if (j >= cnt) {
            W[j] = _mm256_setzero_si256();
        } else if (Q4) {
            __m128i q = _mm_loadu_si128((const __m128i *)(wg + j * BSZ + 2));
            W[j] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        } else {
            __m256i q = _mm256_loadu_si256((const __m256i *)(wg + j * BSZ + 2));
            W[j] = _mm256_sign_epi8(q, q);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const uint8_t *xr = xq + (size_t)r * xs;
        const int8_t *xg = (const int8_t *)xr + 32 * g0;
        __m256i v[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            if (j >= cnt) {
                v[j] = _mm256_setzero_si256();
                continue;
            }
            __m256i x = _mm256_loadu_si256((const __m256i *)(xg + 32 * j));
            if (!Q4) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(wg + j * BSZ + 2));
                x = _mm256_sign_epi8(x, q);
            }
            v[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(W[j], x), ones);
        }
        __m256i is = tree8(v);
        if (Q4) {
            __m256i sx =
                _mm256_loadu_si256((const __m256i *)(xr + KILN_Q8_SUM_OFF(nbp) + 4 * (size_t)g0));
            is = _mm256_sub_epi32(is, _mm256_slli_epi32(sx, 3));
        }
        __m256 dx = _mm256_loadu_ps((const float *)(xr + KILN_Q8_D_OFF(nbp)) + g0);
        acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(is), acc[r][h]);
    }
}

/* One tile: weight row w (n elements, Q8_0 if !Q4 else Q4_0) against R quantized rows.
 * PF > 0 (the gemv kernels) prefetches each 16-block group's bytes PF ahead (no arithmetic). */
KA void q8_body(const int Q4, int64_t n, const uint8_t *w, const uint8_t *xq, size_t xs,
                const int R, float *out, const size_t PF) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const size_t GB = 16 * (Q4 ? sizeof(kiln_block_q4_0) : sizeof(kiln_block_q8_0));
    __m256 acc[MAX_TOK][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + 16 <= nb; g0 += 16) {
        if (PF) kiln_prefetch_unit(w, (size_t)g0 / 16 * GB, GB, PF);
        q8_group(Q4, 8, w, g0, nbp, xq, xs, R, 0, acc);
        q8_group(Q4, 8, w, g0 + 8, nbp, xq, xs, R, 1, acc);
    }
    if (g0 + 8 <= nb) {
        q8_group(Q4, 8, w, g0, nbp, xq, xs, R, 0, acc);
        if (g0 + 8 < nb) q8_group(Q4, (int)(nb - g0 - 8), w, g0 + 8, nbp, xq, xs, R, 1, acc);
    } else if (g0 < nb) {
        q8_group(Q4, (int)(nb - g0), w, g0, nbp, xq, xs, R, 0, acc);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r] =
        hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
}

#define KILN_Q8_DEFINE(NAME, Q4)                                                                   \
    static float NAME##_dot(int64_t n, const void *w, const void *xq) {                            \
        float o;                                                                                   \
        q8_body(Q4, n, (const uint8_t *)w, (const uint8_t *)xq, 0, 1, &o, 0);                      \
        return o;                                                                                  \
    }                                                                                              \
    static void NAME##_tile(int64_t n, const void *w, size_t rs, int nrows, const uint8_t *xq,     \
                            size_t xs, int ntok, float *out) {                                     \
        (void)rs, (void)nrows; /* max_rows is 1 */                                                 \
        switch (ntok) {                                                                            \
        case 1:                                                                                    \
            q8_body(Q4, n, (const uint8_t *)w, xq, xs, 1, out, 0);                                 \
            return;                                                                                \
        case 2:                                                                                    \
            q8_body(Q4, n, (const uint8_t *)w, xq, xs, 2, out, 0);                                 \
            return;                                                                                \
        case 3:                                                                                    \
            q8_body(Q4, n, (const uint8_t *)w, xq, xs, 3, out, 0);                                 \
            return;                                                                                \
        default:                                                                                   \
            q8_body(Q4, n, (const uint8_t *)w, xq, xs, 4, out, 0);                                 \
            return;                                                                                \
        }                                                                                          \
    }                                                                                              \
    static void NAME##_small(int64_t n, const void *w, size_t rs, int nrows, const uint8_t *xq,    \
                             float *out) {                                                         \
        q8_small_body(Q4, 0, n, (const uint8_t *)w, rs, nrows, xq, out);                           \
    }                                                                                              \
    KILN_GEMV_LOOP(NAME, const uint8_t *, q8_body(Q4, n, wk, x, 0, 1, out + k, pf),                \
                   q8_body(Q4, n, wk, x, 0, 1, out + k, 0))                                        \
    static const kiln_cpu_q8_kernel NAME##_kernel = {.dot = NAME##_dot,                            \
                                                     .tile = NAME##_tile,                          \
                                                     .max_rows = 1,                                \
                                                     .max_tok = MAX_TOK,                           \
                                                     .small = NAME##_small,                        \
                                                     .gemv = NAME##_gemv};

KILN_Q8_DEFINE(q8_0, 0)
KILN_Q8_DEFINE(q4_0, 1)

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx2(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_Q8_0:
        return &q8_0_kernel;
    case KILN_DTYPE_Q4_0:
        return &q4_0_kernel;
    default:
        return NULL;
    }
}

/* ---------------------------------------------------------------- quantizer */

/* the product x * id must be rounded to f32 before round_away (as in the scalar code): an
 * empty asm hides it from -ffp-contract, which could otherwise fuse it into v - t */
KA __m256 opaque(__m256 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* roundf (halfway away from zero) of every lane, |v| < 2^23: trunc, then +-1 where the
 * (exact) fractional part is >= 0.5 in magnitude */
KA __m256 round_away(__m256 v) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_andnot_ps(sgn, _mm256_sub_ps(v, t));
    __m256 ge = _mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sgn), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(ge, one));
}

void kiln_cpu_q8_quantize_row_avx2(int64_t n, const float *x, uint8_t *dst) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    float *dxo = (float *)(dst + KILN_Q8_D_OFF(nbp));
    int32_t *sxo = (int32_t *)(dst + KILN_Q8_SUM_OFF(nbp));
    const __m256 sgn = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    for (int64_t b = 0; b < nb; b++, x += 32) {
        __m256 v[4], a[4];
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            a[i] = _mm256_andnot_ps(sgn, v[i]);
            bad |= _mm256_movemask_ps(_mm256_cmp_ps(a[i], big, _CMP_NLE_UQ));
        }
        __m256i *qo = (__m256i *)(dst + 32 * b);
        if (bad) {
            _mm256_storeu_si256(qo, _mm256_setzero_si256());
            dxo[b] = kiln_fp16_to_fp32(0x7E00u);
            sxo[b] = 0;
            continue;
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.0f;
        uint16_t dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        dxo[b] = _cvtsh_ss(dh);
        if (!(d >= FLT_MIN)) {
            _mm256_storeu_si256(qo, _mm256_setzero_si256());
            sxo[b] = 0;
            continue;
        }
        const __m256 id = _mm256_set1_ps(1.0f / d);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(round_away(opaque(_mm256_mul_ps(v[i], id))));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        sxo[b] = _mm_cvtsi128_si32(s4);
        /* packs: lane halves interleave as q0 q1 q2 q3 (4 each) | q0 q1 q2 q3 (upper 4) */
        __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qo, p);
    }
    /* padding blocks */
    memset(dst + 32 * nb, 0, (size_t)(nbp - nb) * 32);
    for (int64_t b = nb; b < nbp; b++) dxo[b] = 0.0f, sxo[b] = 0;
}

#else

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx2(kiln_dtype t) {
    (void)t;
    return NULL;
}
void kiln_cpu_q8_quantize_row_avx2(int64_t n, const float *x, uint8_t *dst) {
    kiln_cpu_q8_quantize_row_ref(n, x, dst, false);
}

#endif
