/*
 * q8_avx512.c - AVX-512 q8-activation kernels (Q8_0 and Q4_0 weights against Q8_0-quantized
 * activations in the transposed "t16" layout of cpu.h) and the AVX-512 activation quantizer.
 * Only called after kiln_simd_supported(KILN_SIMD_AVX512); the VNNI kernels only when
 * cpuid reports AVX512_VNNI (kiln_cpu_use_vnni).
 *
 * Blocks are taken 16 at a time. Each weight group is transposed in registers so that
 * int32 lane l of vector i holds elements 4i..4i+3 of block l (the activations are stored
 * that way by the quantizer, once per row): eight vpdpbusd (or, without VNNI, vpmaddubsw +
 * vpmaddwd + vpaddd) then leave block l's exact integer sum in lane l, with no horizontal
 * reduction per token. The transposition is paid once per weight row and tile of up to 8
 * tokens. vpdpbusd multiplies unsigned by signed bytes:
 *   Q8_0, VNNI: (w ^ 0x80) = w + 128 as u8, and the lane starts at -128 * sum(q_x);
 *   Q8_0, BW:   |w| (u8, <= 128) against x negated where w < 0 (pairs <= 32512, no i16
 *               saturation in vpmaddubsw);
 *   Q4_0:       the nibble 0..15 as u8, and the lane starts at -8 * sum(q_x).
 * Then D = d_w * d_x (exact) and one FMA per lane into the 16 accumulators of cpu.h, so the
 * results are bit-identical to the scalar reference.
 */
#include <float.h>
#include <string.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define KA      static inline __attribute__((always_inline))
#define MAX_TOK 8

KA float hsum16(__m512 v) { /* lanes j + j+8, j + j+4, j + j+2, 0 + 1 (cpu.h order) */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/*
 * z[m] = [block m | block m + 8] (8 int32 each) -> t[i] lane l = int32 i of block l.
 * unpack 32 and 64 give, per 128-bit lane, int32 p of 4 blocks; vpermt2q puts the four
 * 4-block pieces of each int32 index in block order.
 */
KA void transpose8x16(const __m512i z[8], __m512i t[8]) {
    __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
    __m512i b0 = _mm512_unpacklo_epi32(z[4], z[5]), b1 = _mm512_unpackhi_epi32(z[4], z[5]);
    __m512i b2 = _mm512_unpacklo_epi32(z[6], z[7]), b3 = _mm512_unpackhi_epi32(z[6], z[7]);
    __m512i v[4] = {_mm512_unpacklo_epi64(a0, a2), _mm512_unpackhi_epi64(a0, a2),
                    _mm512_unpacklo_epi64(a1, a3), _mm512_unpackhi_epi64(a1, a3)};
    __m512i w[4] = {_mm512_unpacklo_epi64(b0, b2), _mm512_unpackhi_epi64(b0, b2),
                    _mm512_unpacklo_epi64(b1, b3), _mm512_unpackhi_epi64(b1, b3)};
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
        t[p] = _mm512_permutex2var_epi64(v[p], lo, w[p]);
        t[4 + p] = _mm512_permutex2var_epi64(v[p], hi, w[p]);
    }
}

/* y[v] = [block v | block 4 + v | block 8 + v | block 12 + v] (4 int32 each) -> p[c] lane l =
 * int32 c of block l */
KA void transpose4x16(const __m512i y[4], __m512i p[4]) {
    __m512i a0 = _mm512_unpacklo_epi32(y[0], y[1]), a1 = _mm512_unpackhi_epi32(y[0], y[1]);
    __m512i a2 = _mm512_unpacklo_epi32(y[2], y[3]), a3 = _mm512_unpackhi_epi32(y[2], y[3]);
    p[0] = _mm512_unpacklo_epi64(a0, a2);
    p[1] = _mm512_unpackhi_epi64(a0, a2);
    p[2] = _mm512_unpacklo_epi64(a1, a3);
    p[3] = _mm512_unpackhi_epi64(a1, a3);
}

KA __m512i load2x256(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

KA __m512i load4x128(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d) {
    __m512i r = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)a));
    r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)b), 1);
    r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)c), 2);
    return _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)d), 3);
}

/* the 16 fp16 scales of blocks at p, p + bsz, ... as f32 (scalar loads: faster than a
 * vpgatherdd here) */
KA uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

KA __m512 load_d16(const uint8_t *p, int bsz) {
    __m256i h = _mm256_setr_epi16(
        (short)rd16(p), (short)rd16(p + bsz), (short)rd16(p + 2 * bsz), (short)rd16(p + 3 * bsz),
        (short)rd16(p + 4 * bsz), (short)rd16(p + 5 * bsz), (short)rd16(p + 6 * bsz),
        (short)rd16(p + 7 * bsz), (short)rd16(p + 8 * bsz), (short)rd16(p + 9 * bsz),
        (short)rd16(p + 10 * bsz), (short)rd16(p + 11 * bsz), (short)rd16(p + 12 * bsz),
        (short)rd16(p + 13 * bsz), (short)rd16(p + 14 * bsz), (short)rd16(p + 15 * bsz));
    return _mm512_cvtph_ps(h);
}

/*
 * One tile: weight row w (Q8_0 if !Q4, else Q4_0) against R quantized rows (t16 layout,
 * stride xs). A partial last group is copied into a zero-padded buffer (zero scales: its
 * padding blocks add fma(0, 0, a) = a).
 */
KA void q8_body(const int Q4, const int VNNI, int64_t n, const uint8_t *w, const uint8_t *xq,
                size_t xs, const int R, float *out) {
    const int BSZ = Q4 ? (int)sizeof(kiln_block_q4_0) : (int)sizeof(kiln_block_q8_0);
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const __m512i ones = _mm512_set1_epi16(1), low4 = _mm512_set1_epi8(15);
    __m512 acc[MAX_TOK];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    _Alignas(64) uint8_t tail[16 * sizeof(kiln_block_q8_0)];
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const uint8_t *wg = w + (size_t)b0 * (size_t)BSZ;
        if (nb - b0 < 16) {
            memset(tail, 0, sizeof tail);
            memcpy(tail, wg, (size_t)(nb - b0) * (size_t)BSZ);
            wg = tail;
        }
        const __m512 dw = load_d16(wg, BSZ);
        __m512i T[8], U[8];
        if (Q4) {
            __m512i y[4], p[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) y[v] =
                load4x128(wg + v * BSZ + 2, wg + (4 + v) * BSZ + 2, wg + (8 + v) * BSZ + 2,
                          wg + (12 + v) * BSZ + 2);
            transpose4x16(y, p);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                T[c] = _mm512_and_si512(p[c], low4);
                T[4 + c] = _mm512_and_si512(_mm512_srli_epi32(p[c], 4), low4);
            }
        } else {
            __m512i z[8];
            _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++) z[m] =
                load2x256(wg + m * BSZ + 2, wg + (m + 8) * BSZ + 2);
            transpose8x16(z, T);
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                if (VNNI)
                    T[i] = _mm512_xor_si512(T[i], _mm512_set1_epi8((char)0x80));
                else
                    U[i] = _mm512_abs_epi8(T[i]);
            }
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + (size_t)r * xs;
            const uint8_t *xg = xr + 32 * b0;
            __m512i is;
            if (Q4 || VNNI) {
                __m512i sx = _mm512_loadu_si512(xr + KILN_Q8_SUM_OFF(nbp) + 4 * (size_t)b0);
                is = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sx, Q4 ? 3 : 7));
            } else {
                is = _mm512_setzero_si512();
            }
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                __m512i x = _mm512_loadu_si512(xg + 64 * i);
                if (VNNI) {
                    is = _mm512_dpbusd_epi32(is, T[i], x);
                } else if (Q4) {
                    is = _mm512_add_epi32(is,
                                          _mm512_madd_epi16(_mm512_maddubs_epi16(T[i], x), ones));
                } else {
                    __mmask64 neg = _mm512_movepi8_mask(T[i]);
                    x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                    is = _mm512_add_epi32(is,
                                          _mm512_madd_epi16(_mm512_maddubs_epi16(U[i], x), ones));
                }
            }
            __m512 dx = _mm512_loadu_ps((const float *)(xr + KILN_Q8_D_OFF(nbp)) + b0);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is), acc[r]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) out[r] = hsum16(acc[r]);
}

#define KILN_Q8_CASE(Q4, VNNI, R)                                                                  \
    case R:                                                                                        \
        q8_body(Q4, VNNI, n, (const uint8_t *)w, xq, xs, R, out);                                  \
        return;

#define KILN_Q8_DEFINE(NAME, Q4, VNNI)                                                             \
    static float NAME##_dot(int64_t n, const void *w, const void *xq) {                            \
        float o;                                                                                   \
        q8_body(Q4, VNNI, n, (const uint8_t *)w, (const uint8_t *)xq, 0, 1, &o);                   \
        return o;                                                                                  \
    }                                                                                              \
    static void NAME##_tile(int64_t n, const void *w, size_t rs, int nrows, const uint8_t *xq,     \
                            size_t xs, int ntok, float *out) {                                     \
        (void)rs, (void)nrows; /* max_rows is 1 */                                                 \
        switch (ntok) {                                                                            \
            KILN_Q8_CASE(Q4, VNNI, 1)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 2)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 3)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 4)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 5)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 6)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 7)                                                              \
        default:                                                                                   \
            q8_body(Q4, VNNI, n, (const uint8_t *)w, xq, xs, 8, out);                              \
            return;                                                                                \
        }                                                                                          \
    }                                                                                              \
    static const kiln_cpu_q8_kernel NAME##_kernel = {NAME##_dot, NAME##_tile, 1, MAX_TOK};

KILN_Q8_DEFINE(q8_0_vnni, 0, 1)
KILN_Q8_DEFINE(q4_0_vnni, 1, 1)
KILN_Q8_DEFINE(q8_0_bw, 0, 0)
KILN_Q8_DEFINE(q4_0_bw, 1, 0)

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx512(kiln_dtype t, bool vnni) {
    switch (t) {
    case KILN_DTYPE_Q8_0:
        return vnni ? &q8_0_vnni_kernel : &q8_0_bw_kernel;
    case KILN_DTYPE_Q4_0:
        return vnni ? &q4_0_vnni_kernel : &q4_0_bw_kernel;
    default:
        return NULL;
    }
}

/* ---------------------------------------------------------------- quantizer */

/* the product x * id must be rounded to f32 before round_away (as in the scalar code): an
 * empty asm hides it from -ffp-contract, which could otherwise fuse it into v - t */
KA __m512 opaque(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* roundf (halfway away from zero) of every lane, |v| < 2^23: trunc, then +-1 where the
 * (exact) fractional part is >= 0.5 in magnitude */
KA __m512 round_away(__m512 v) {
    const __m512i sgn = _mm512_set1_epi32((int)0x80000000u);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 ge = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), sgn),
                                                     _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, ge, t, one);
}

/* one block of 32 floats -> 32 quants at q, its f32 scale and quant sum */
KA void quant_block(const float *x, int8_t *q, float *dxo, int32_t *sxo) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    if (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) {
        memset(q, 0, 32);
        *dxo = kiln_fp16_to_fp32(0x7E00u);
        *sxo = 0;
        return;
    }
    float d = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / 127.0f;
    *dxo = _cvtsh_ss((unsigned short)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    if (!(d >= FLT_MIN)) {
        memset(q, 0, 32);
        *sxo = 0;
        return;
    }
    const __m512 id = _mm512_set1_ps(1.0f / d);
    __m512i q0 = _mm512_cvtps_epi32(round_away(opaque(_mm512_mul_ps(v0, id))));
    __m512i q1 = _mm512_cvtps_epi32(round_away(opaque(_mm512_mul_ps(v1, id))));
    *sxo = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
}

void kiln_cpu_q8_quantize_row_avx512(int64_t n, const float *x, uint8_t *dst) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    float *dxo = (float *)(dst + KILN_Q8_D_OFF(nbp));
    int32_t *sxo = (int32_t *)(dst + KILN_Q8_SUM_OFF(nbp));
    _Alignas(64) int8_t tmp[16][32];
    for (int64_t b0 = 0; b0 < nbp; b0 += 16) {
        for (int l = 0; l < 16; l++) {
            int64_t b = b0 + l;
            if (b < nb) {
                quant_block(x + 32 * b, tmp[l], &dxo[b], &sxo[b]);
            } else {
                memset(tmp[l], 0, 32);
                dxo[b] = 0.0f;
                sxo[b] = 0;
            }
        }
        __m512i z[8], t[8];
        _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++) z[m] =
            load2x256((const uint8_t *)tmp[m], (const uint8_t *)tmp[m + 8]);
        transpose8x16(z, t);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
            _mm512_storeu_si512(dst + 32 * b0 + 64 * i, t[i]);
    }
}

#else

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx512(kiln_dtype t, bool vnni) {
    (void)t, (void)vnni;
    return NULL;
}
void kiln_cpu_q8_quantize_row_avx512(int64_t n, const float *x, uint8_t *dst) {
    kiln_cpu_q8_quantize_row_ref(n, x, dst, true);
}

#endif
