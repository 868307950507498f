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
#include <math.h>
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
 * hsum16 of 8 vectors at once, out[t] = hsum16(v[t]) bit for bit: the same additions on the
 * same operands in the same order (j + j+8, then j + j+4, j + j+2, 0 + 1), with the tokens
 * side by side in lanes instead of one vector each (about 26 instructions instead of 72).
 */
KA void hsum16x8(const __m512 v[8], float out[8]) {
    __m512 s8[4], s4[2];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) /* [v lo | v' lo] + [v hi | v' hi] */
        s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    /* 128-bit lanes: s8[i] = [t0 j<4, t0 j>=4, t1 j<4, t1 j>=4] -> s4 = [t0 | t1 | t2 | t3] */
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) s4[i] =
        _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0x88),
                      _mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0xDD));
    /* lane k: [t_k j=0,1 | t_{k+4} j=0,1] + [t_k j=2,3 | t_{k+4} j=2,3] */
    __m512 s2 =
        _mm512_add_ps(_mm512_shuffle_ps(s4[0], s4[1], 0x44), _mm512_shuffle_ps(s4[0], s4[1], 0xEE));
    /* lane k: [t_k, t_{k+4}, .., ..] = elements 0 + 1 */
    __m512 s1 = _mm512_add_ps(_mm512_shuffle_ps(s2, s2, 0x88), _mm512_shuffle_ps(s2, s2, 0xDD));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, s1)));
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

/* The 16 Q4_0 blocks of a group at wg (18 bytes each), transposed: lane l of p[c] holds
 * bytes 4c..4c+3 of block l's quants (two nibbles each). */
KA void q4_nibble_pairs(const uint8_t *wg, __m512i p[4]) {
    const int BSZ = (int)sizeof(kiln_block_q4_0);
    __m512i y[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) y[v] = load4x128(
        wg + v * BSZ + 2, wg + (4 + v) * BSZ + 2, wg + (8 + v) * BSZ + 2, wg + (12 + v) * BSZ + 2);
    transpose4x16(y, p);
}

/* The weight vectors of a Q4_0 group as vpdpbusd takes them: T[c] the low nibbles of p[c],
 * T[4 + c] the high ones (u8 0..15) */
KA void q4_group_t(const uint8_t *wg, __m512i T[8]) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512i p[4];
    q4_nibble_pairs(wg, p);
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        T[c] = _mm512_and_si512(p[c], low4);
        T[4 + c] = _mm512_and_si512(_mm512_srli_epi32(p[c], 4), low4);
    }
}

/* The 16 Q8_0 blocks of a group at wg (34 bytes each), transposed: lane l of T[i] holds
 * quants 4i..4i+3 of block l (signed) */
KA void q8_group_t(const uint8_t *wg, __m512i T[8]) {
    const int BSZ = (int)sizeof(kiln_block_q8_0);
    __m512i z[8];
    _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++) z[m] =
        load2x256(wg + m * BSZ + 2, wg + (m + 8) * BSZ + 2);
    transpose8x16(z, T);
}

KA uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/*
 * The fp16 scales of the 16 blocks of a group (block j's at p + j * BSZ, BSZ even) as f32.
 * A 128-byte window (two vector loads) holds the scales of 128 / BSZ consecutive blocks at
 * word offsets j * BSZ / 2; one vpermt2w per window gathers them into their lanes. Every
 * load stays inside the group (Q4_0: windows at bytes 0 and 144 of 288; Q8_0: 0, 136, 272,
 * 408 of 544). 7 (Q4_0) or 15 (Q8_0) instructions instead of 16 scalar loads and inserts.
 */
KA __m512 load_d16(const uint8_t *p, const int BSZ) {
    const int per = (128 - 2) / BSZ + 1; /* blocks per window: Q4_0 8, Q8_0 4 */
    const int nw = (16 + per - 1) / per;
    short ix[32];
    for (int l = 0; l < 32; l++) ix[l] = (short)(l < 16 ? (l % per) * (BSZ / 2) : 0);
    const __m512i idx = _mm512_loadu_si512(ix);
    __m512i d = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int w = 0; w < nw; w++) {
        const uint8_t *q = p + (size_t)(w * per * BSZ);
        __m512i t =
            _mm512_permutex2var_epi16(_mm512_loadu_si512(q), idx, _mm512_loadu_si512(q + 64));
        int lo = w * per, hi = lo + per < 16 ? lo + per : 16;
        __mmask32 k = (__mmask32)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        d = w == 0 ? t : _mm512_mask_mov_epi16(d, k, t);
    }
    return _mm512_cvtph_ps(_mm512_castsi512_si256(d));
}

/* the start of each lane's integer sum: -128 sum(q_x) (Q8_0, VNNI), -8 sum(q_x) (Q4_0), 0;
 * the t16 layout stores -8 sum(q_x) */
KA __m512i isum_init(const int Q4, const int VNNI, const uint8_t *xr, int64_t nbp, int64_t b0) {
    if (!Q4 && !VNNI) return _mm512_setzero_si512();
    __m512i c8 = _mm512_loadu_si512(xr + KILN_Q8_SUM_OFF(nbp) + 4 * (size_t)b0);
    return Q4 ? c8 : _mm512_slli_epi32(c8, 4);
}

/* a full group of 16 blocks from b0, transposed on both sides */
KA void q8_group(const int Q4, const int VNNI, const uint8_t *w, int64_t b0, int64_t nbp,
                 const uint8_t *xq, size_t xs, const int R, __m512 acc[]) {
    const int BSZ = Q4 ? (int)sizeof(kiln_block_q4_0) : (int)sizeof(kiln_block_q8_0);
    const __m512i ones = _mm512_set1_epi16(1);
    const uint8_t *wg = w + (size_t)b0 * (size_t)BSZ;
    const __m512 dw = load_d16(wg, BSZ);
    __m512i T[8], U[8];
    if (Q4) {
        q4_group_t(wg, T);
    } else {
        q8_group_t(wg, T);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            if (VNNI)
                T[i] = _mm512_xor_si512(T[i], _mm512_set1_epi8((char)0x80));
            else
                U[i] = _mm512_abs_epi8(T[i]);
        }
    }
    if (VNNI) { /* the tokens' dpbusd chains interleaved, i outer (independent chains) */
        __m512i is[MAX_TOK];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) is[r] =
            isum_init(Q4, VNNI, xq + (size_t)r * xs, nbp, b0);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) is[r] = _mm512_dpbusd_epi32(
                is[r], T[i], _mm512_loadu_si512(xq + (size_t)r * xs + 32 * b0 + 64 * i));
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + (size_t)r * xs;
            __m512 dx = _mm512_loadu_ps((const float *)(xr + KILN_Q8_D_OFF(nbp)) + b0);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is[r]), acc[r]);
        }
        return;
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        const uint8_t *xr = xq + (size_t)r * xs;
        const uint8_t *xg = xr + 32 * b0;
        __m512i is = isum_init(Q4, VNNI, xr, nbp, b0);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            __m512i x = _mm512_loadu_si512(xg + 64 * i);
            if (VNNI) {
                is = _mm512_dpbusd_epi32(is, T[i], x);
            } else if (Q4) {
                is = _mm512_add_epi32(is, _mm512_madd_epi16(_mm512_maddubs_epi16(T[i], x), ones));
            } else {
                __mmask64 neg = _mm512_movepi8_mask(T[i]);
                x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                is = _mm512_add_epi32(is, _mm512_madd_epi16(_mm512_maddubs_epi16(U[i], x), ones));
            }
        }
        __m512 dx = _mm512_loadu_ps((const float *)(xr + KILN_Q8_D_OFF(nbp)) + b0);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is), acc[r]);
    }
}

/* one block's 8 lane sums: VNNI vpdpbusd (Q8_0: w ^ 0x80, corrected by 128 sum x), else
 * vpmaddubsw + vpmaddwd (Q8_0: |w| against sign(x, w)); Q4_0: nibbles, corrected by 8 sum x */
KA __m256i blk_dot(const int Q4, const int VNNI, const uint8_t *wb, __m256i x) {
    __m256i u, q = _mm256_setzero_si256();
    if (Q4) {
        __m128i h = _mm_loadu_si128((const __m128i *)(wb + 2));
        u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(h, 4), h), _mm256_set1_epi8(15));
    } else {
        q = _mm256_loadu_si256((const __m256i *)(wb + 2));
        u = VNNI ? _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)) : _mm256_abs_epi8(q);
    }
    if (VNNI) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
    if (!Q4) x = _mm256_sign_epi8(x, q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

/* what a block's raw integer sum needs added, from its stored t16 sum value c8 = -8 sum(q_x) */
KA int32_t blk_corr(const int Q4, const int VNNI, int32_t c8) {
    return Q4 ? c8 : VNNI ? 16 * c8 : 0;
}

#include "backend/cpu/q8_small.inc"

/* sum of the 8 int32 lanes */
KA int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* the fixed final reduction of cpu.h on 16 floats in memory (same operations as hsum16) */
KA float reduce16(const float a[16]) {
    float s8[8], s4[4];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/*
 * The partial last group: blocks b0 .. b0 + cnt - 1 (cnt < 16), plain on both sides (a
 * transposed group would waste most of its work on small rows). Block j's exact integer
 * sum comes from one 256-bit vpdpbusd (or vpmaddubsw + vpmaddwd) and a horizontal add; it
 * goes into accumulator j (b0 % 16 == 0) with a scalar FMA, the same correctly rounded
 * operation as the vector lanes. The accumulators go through memory for this, so the
 * final reduction is done there too (reduce16, same order as hsum16).
 */
KA void q8_tail(const int Q4, const int VNNI, const uint8_t *w, int64_t b0, int cnt, int64_t nbp,
                const uint8_t *xq, size_t xs, const int R, __m512 acc[], float *out) {
    const int BSZ = Q4 ? (int)sizeof(kiln_block_q4_0) : (int)sizeof(kiln_block_q8_0);
    const uint8_t *wg = w + (size_t)b0 * (size_t)BSZ;
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        const uint8_t *xr = xq + (size_t)r * xs;
        const int8_t *xg = (const int8_t *)xr + 32 * b0;
        const float *dx = (const float *)(xr + KILN_Q8_D_OFF(nbp)) + b0;
        const int32_t *sx = (const int32_t *)(xr + KILN_Q8_SUM_OFF(nbp)) + b0;
        float a[16];
        _mm512_storeu_ps(a, acc[r]);
        for (int j = 0; j < cnt; j++) {
            const uint8_t *wb = wg + j * BSZ;
            __m256i x = _mm256_loadu_si256((const __m256i *)(xg + 32 * j));
            int32_t isum = hsum8i(blk_dot(Q4, VNNI, wb, x)) + blk_corr(Q4, VNNI, sx[j]);
            uint16_t dh;
            memcpy(&dh, wb, 2);
            a[j] = fmaf(_cvtsh_ss(dh) * dx[j], (float)isum, a[j]);
        }
        out[r] = reduce16(a);
    }
}

/* One tile: weight row w (Q8_0 if !Q4, else Q4_0) against R quantized rows (t16, stride xs).
 * PF > 0 (the gemv kernels) prefetches each 16-block group's bytes PF ahead (no arithmetic). */
KA void q8_body(const int Q4, const int VNNI, int64_t n, const uint8_t *w, const uint8_t *xq,
                size_t xs, const int R, float *out, const size_t PF) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const size_t GB = 16 * (Q4 ? sizeof(kiln_block_q4_0) : sizeof(kiln_block_q8_0));
    __m512 acc[MAX_TOK];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + 16 <= nb; b0 += 16) {
        if (PF) kiln_prefetch_unit(w, (size_t)b0 / 16 * GB, GB, PF);
        q8_group(Q4, VNNI, w, b0, nbp, xq, xs, R, acc);
    }
    if (b0 < nb) {
        q8_tail(Q4, VNNI, w, b0, (int)(nb - b0), nbp, xq, xs, R, acc, out);
        return;
    }
    if (R == 8) {
        hsum16x8(acc, out);
        return;
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) out[r] = hsum16(acc[r]);
}

/*
 * Two Q4_0 rows x R <= 8 tokens (VNNI), for batched decode: each activation vector is loaded once
 * and feeds both rows' vpdpbusd, halving the activation loads of two q8_body calls. The rows'
 * nibble pairs stay packed (p0, p1) and are split per step i, so the integer sums, the
 * D * isum FMA per lane and the final reduction are those of q8_body: the same bits. The 16
 * float accumulators live in memory (updated once per group). Rows with a partial last group
 * go through q8_body.
 */
KA void q4_body2(int64_t n, const uint8_t *w0, const uint8_t *w1, const uint8_t *xq, size_t xs,
                 const int R, float *out) {
    const int BSZ = (int)sizeof(kiln_block_q4_0);
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n), ng = nb / 16;
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[2][8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const int64_t b0 = 16 * g;
        const uint8_t *g0 = w0 + (size_t)b0 * (size_t)BSZ, *g1 = w1 + (size_t)b0 * (size_t)BSZ;
        __m512i p0[4], p1[4];
        q4_nibble_pairs(g0, p0);
        q4_nibble_pairs(g1, p1);
        __m512i is0[8], is1[8];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) is0[r] = is1[r] =
            isum_init(1, 1, xq + (size_t)r * xs, nbp, b0);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            const int c = i & 3;
            __m512i t0 = i < 4 ? p0[c] : _mm512_srli_epi32(p0[c], 4);
            __m512i t1 = i < 4 ? p1[c] : _mm512_srli_epi32(p1[c], 4);
            t0 = _mm512_and_si512(t0, low4);
            t1 = _mm512_and_si512(t1, low4);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                __m512i xv = _mm512_loadu_si512(xq + (size_t)r * xs + 32 * b0 + 64 * i);
                __asm__("" : "+v"(xv)); /* one load for both rows */
                is0[r] = _mm512_dpbusd_epi32(is0[r], t0, xv);
                is1[r] = _mm512_dpbusd_epi32(is1[r], t1, xv);
            }
        }
        const __m512 dw0 = load_d16(g0, BSZ), dw1 = load_d16(g1, BSZ);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const __m512 dx =
                _mm512_loadu_ps((const float *)(xq + (size_t)r * xs + KILN_Q8_D_OFF(nbp)) + b0);
            acc[0][r] =
                _mm512_fmadd_ps(_mm512_mul_ps(dw0, dx), _mm512_cvtepi32_ps(is0[r]), acc[0][r]);
            acc[1][r] =
                _mm512_fmadd_ps(_mm512_mul_ps(dw1, dx), _mm512_cvtepi32_ps(is1[r]), acc[1][r]);
        }
    }
    if (R == 8) {
        hsum16x8(acc[0], out);
        hsum16x8(acc[1], out + 8);
        return;
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        out[r] = hsum16(acc[0][r]);
        out[R + r] = hsum16(acc[1][r]);
    }
}

/* ---------------------------------------------------------------- packed (prefill) */

/*
 * A packed row holds its full 16-block groups, 576 bytes each: the 8 transposed vectors of
 * q8_group (VNNI form: Q8_0 as w ^ 0x80, Q4_0 as the nibbles, both u8) then the 16 block
 * scales as f32. A tile of PR rows x up to PC tokens then runs, per group, PR x PC chains
 * of 8 vpdpbusd from registers (each weight vector loaded once per tile, each activation
 * vector once per row tile) and the same D * isum FMA per lane as q8_group; the partial last
 * group comes from the original row through q8_tail. Same operations per (row, token) as
 * q8_body, so the same bits.
 */
#ifndef KILN_PR
#define KILN_PR 3
#define KILN_PC 4
#endif
enum { PK_GROUP = 576, PR = KILN_PR, PC = KILN_PC };

static size_t pk_row_bytes(int64_t n) {
    return (size_t)(n / 32 / 16) * PK_GROUP;
}

KA void pk_pack(const int Q4, int64_t n, const uint8_t *w, size_t rs, int nrows, uint8_t *dst) {
    const int BSZ = Q4 ? (int)sizeof(kiln_block_q4_0) : (int)sizeof(kiln_block_q8_0);
    const int64_t ng = n / 32 / 16;
    const size_t pb = pk_row_bytes(n);
    for (int k = 0; k < nrows; k++) {
        const uint8_t *wr = w + (size_t)k * rs;
        uint8_t *d = dst + (size_t)k * pb;
        for (int64_t g = 0; g < ng; g++, d += PK_GROUP) {
            const uint8_t *wg = wr + (size_t)(16 * g) * (size_t)BSZ;
            __m512i T[8];
            if (Q4) {
                q4_group_t(wg, T);
            } else {
                q8_group_t(wg, T);
                for (int i = 0; i < 8; i++)
                    T[i] = _mm512_xor_si512(T[i], _mm512_set1_epi8((char)0x80));
            }
            for (int i = 0; i < 8; i++) _mm512_storeu_si512(d + 64 * i, T[i]);
            _mm512_storeu_ps(d + 512, load_d16(wg, BSZ));
        }
    }
}

KA void pk_body(const int Q4, int64_t n, const uint8_t *pk, size_t ps, const uint8_t *w, size_t rs,
                const uint8_t *xq, size_t xs, const int R, const int C, float *out) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n), ng = nb / 16;
    __m512 facc[PR][PC];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) facc[r][c] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const int64_t b0 = 16 * g;
        __m512i is[PR][PC];
        _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
            const __m512i corr = isum_init(Q4, 1, xq + (size_t)c * xs, nbp, b0);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) is[r][c] = corr;
        }
        const uint8_t *pg = pk + (size_t)g * PK_GROUP;
        /* the empty asm statements pin each weight and activation vector in a register (GCC
         * would otherwise fold the activation loads into every vpdpbusd: R x more loads) */
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            __m512i W[PR];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                W[r] = _mm512_load_si512(pg + (size_t)r * ps + 64 * i);
                __asm__("" : "+v"(W[r]));
            }
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
                __m512i xv = _mm512_loadu_si512(xq + (size_t)c * xs + 32 * b0 + 64 * i);
                __asm__("" : "+v"(xv));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) is[r][c] =
                    _mm512_dpbusd_epi32(is[r][c], W[r], xv);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m512 dw = _mm512_load_ps((const float *)(pg + (size_t)r * ps + 512));
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
                const __m512 dx =
                    _mm512_loadu_ps((const float *)(xq + (size_t)c * xs + KILN_Q8_D_OFF(nbp)) + b0);
                facc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(is[r][c]),
                                             facc[r][c]);
            }
        }
    }
    if (ng * 16 < nb) {
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            q8_tail(Q4, 1, w + (size_t)r * rs, ng * 16, (int)(nb - ng * 16), nbp, xq, xs, C,
                    facc[r], out + r * C);
        return;
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) out[r * C + c] = hsum16(facc[r][c]);
}

#define KILN_PK_CASE(Q4, NR, C)                                                                    \
    case C:                                                                                        \
        pk_body(Q4, n, pk, ps, (const uint8_t *)w, rs, xq, xs, NR, C, out);                        \
        return;

#define KILN_PK_DEFINE(NAME, Q4)                                                                   \
    static void NAME##_pack(int64_t n, const void *w, size_t rs, int nrows, uint8_t *dst) {        \
        pk_pack(Q4, n, (const uint8_t *)w, rs, nrows, dst);                                        \
    }                                                                                              \
    static void NAME##_ptile(int64_t n, const uint8_t *pk, size_t ps, const void *w, size_t rs,    \
                             int nrows, const uint8_t *xq, size_t xs, int ntok, float *out) {      \
        if (nrows >= PR) {                                                                         \
            switch (ntok) {                                                                        \
                KILN_PK_CASE(Q4, PR, 1)                                                            \
                KILN_PK_CASE(Q4, PR, 2)                                                            \
                KILN_PK_CASE(Q4, PR, 3)                                                            \
            default:                                                                               \
                pk_body(Q4, n, pk, ps, (const uint8_t *)w, rs, xq, xs, PR, PC, out);               \
                return;                                                                            \
            }                                                                                      \
        }                                                                                          \
        for (int k = 0; k < nrows; k++) {                                                          \
            const uint8_t *pkk = pk + (size_t)k * ps;                                              \
            const uint8_t *wk = (const uint8_t *)w + (size_t)k * rs;                               \
            float *ok = out + k * ntok;                                                            \
            if (ntok == 1)                                                                         \
                pk_body(Q4, n, pkk, ps, wk, rs, xq, xs, 1, 1, ok);                                 \
            else if (ntok == 2)                                                                    \
                pk_body(Q4, n, pkk, ps, wk, rs, xq, xs, 1, 2, ok);                                 \
            else if (ntok == 3)                                                                    \
                pk_body(Q4, n, pkk, ps, wk, rs, xq, xs, 1, 3, ok);                                 \
            else                                                                                   \
                pk_body(Q4, n, pkk, ps, wk, rs, xq, xs, 1, PC, ok);                                \
        }                                                                                          \
    }

KILN_PK_DEFINE(q8_0_pk, 0)
KILN_PK_DEFINE(q4_0_pk, 1)

#define KILN_Q8_CASE(Q4, VNNI, R)                                                                  \
    case R:                                                                                        \
        q8_body(Q4, VNNI, n, (const uint8_t *)w, xq, xs, R, out, 0);                               \
        return;

/* the 2-row Q4_0 tile for R tokens (rows w and w1) */
#define KILN_Q4X2_CASE(R)                                                                          \
    case R:                                                                                        \
        q4_body2(n, (const uint8_t *)w, w1, xq, xs, R, out);                                       \
        return;

#define KILN_Q8_DEFINE(NAME, Q4, VNNI, MR)                                                         \
    static float NAME##_dot(int64_t n, const void *w, const void *xq) {                            \
        float o;                                                                                   \
        q8_body(Q4, VNNI, n, (const uint8_t *)w, (const uint8_t *)xq, 0, 1, &o, 0);                \
        return o;                                                                                  \
    }                                                                                              \
    static void NAME##_tile(int64_t n, const void *w, size_t rs, int nrows, const uint8_t *xq,     \
                            size_t xs, int ntok, float *out) {                                     \
        if (MR == 2 && nrows == 2) { /* out[k * ntok + r] */                                       \
            const uint8_t *w1 = (const uint8_t *)w + rs;                                           \
            if ((n / 32) % 16 == 0 && ntok >= 2) {                                                 \
                switch (ntok) {                                                                    \
                    KILN_Q4X2_CASE(2)                                                              \
                    KILN_Q4X2_CASE(3)                                                              \
                    KILN_Q4X2_CASE(4)                                                              \
                    KILN_Q4X2_CASE(5)                                                              \
                    KILN_Q4X2_CASE(6)                                                              \
                    KILN_Q4X2_CASE(7)                                                              \
                default:                                                                           \
                    q4_body2(n, (const uint8_t *)w, w1, xq, xs, 8, out);                           \
                    return;                                                                        \
                }                                                                                  \
            }                                                                                      \
            NAME##_tile(n, w, rs, 1, xq, xs, ntok, out);                                           \
            NAME##_tile(n, (const uint8_t *)w + rs, rs, 1, xq, xs, ntok, out + ntok);              \
            return;                                                                                \
        }                                                                                          \
        switch (ntok) {                                                                            \
            KILN_Q8_CASE(Q4, VNNI, 1)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 2)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 3)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 4)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 5)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 6)                                                              \
            KILN_Q8_CASE(Q4, VNNI, 7)                                                              \
        default:                                                                                   \
            q8_body(Q4, VNNI, n, (const uint8_t *)w, xq, xs, 8, out, 0);                           \
            return;                                                                                \
        }                                                                                          \
    }                                                                                              \
    static void NAME##_small(int64_t n, const void *w, size_t rs, int nrows, const uint8_t *xq,    \
                             float *out) {                                                         \
        q8_small_body(Q4, VNNI, n, (const uint8_t *)w, rs, nrows, xq, out);                        \
    }                                                                                              \
    KILN_GEMV_LOOP(NAME, const uint8_t *, q8_body(Q4, VNNI, n, wk, x, 0, 1, out + k, pf),          \
                   q8_body(Q4, VNNI, n, wk, x, 0, 1, out + k, 0))                                  \
    static const kiln_cpu_q8_kernel NAME##_kernel = {                                              \
        NAME##_dot, NAME##_tile, MR, MAX_TOK, NAME##_small, PKB, PKP, PKT, PR, PC, NAME##_gemv, 0};

/* the packed kernels are VNNI only */
#define PKB NULL
#define PKP NULL
#define PKT NULL
KILN_Q8_DEFINE(q8_0_bw, 0, 0, 1)
KILN_Q8_DEFINE(q4_0_bw, 1, 0, 1)
#undef PKB
#undef PKP
#undef PKT
#define PKB pk_row_bytes
#define PKP q8_0_pk_pack
#define PKT q8_0_pk_ptile
KILN_Q8_DEFINE(q8_0_vnni, 0, 1, 1)
#undef PKP
#undef PKT
#define PKP q4_0_pk_pack
#define PKT q4_0_pk_ptile
KILN_Q8_DEFINE(q4_0_vnni, 1, 1, 2)
#undef PKB
#undef PKP
#undef PKT

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
    *sxo = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)); /* t16: -8 sum */
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
}

void kiln_cpu_q8_quantize_row_avx512(int64_t n, const float *x, uint8_t *dst) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n), nfull = nb / 16 * 16;
    float *dxo = (float *)(dst + KILN_Q8_D_OFF(nbp));
    int32_t *sxo = (int32_t *)(dst + KILN_Q8_SUM_OFF(nbp));
    _Alignas(64) int8_t tmp[16][32];
    for (int64_t b0 = 0; b0 < nfull; b0 += 16) {
        _Pragma("GCC unroll 16") for (int l = 0; l < 16; l++)
            quant_block(x + 32 * (b0 + l), tmp[l], &dxo[b0 + l], &sxo[b0 + l]);
        __m512i z[8], t[8];
        _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++) z[m] =
            load2x256((const uint8_t *)tmp[m], (const uint8_t *)tmp[m + 8]);
        transpose8x16(z, t);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
            _mm512_storeu_si512(dst + 32 * b0 + 64 * i, t[i]);
    }
    /* the partial last group, plain, and the zero padding */
    for (int64_t b = nfull; b < nb; b++)
        quant_block(x + 32 * b, (int8_t *)dst + 32 * b, &dxo[b], &sxo[b]);
    memset(dst + 32 * nb, 0, (size_t)(nbp - nb) * 32);
    for (int64_t b = nb; b < nbp; b++) dxo[b] = 0.0f, sxo[b] = 0;
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
