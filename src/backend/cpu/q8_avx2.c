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

/* ---------------------------------------------------------------- packed (prefill) */

/*
 * Packed panels (2+ tokens, matmul.c packs each panel of rows once per call): rows in lanes,
 * an outer product per 4 quants. A group of 8 weight rows (pmax_rows) is rewritten, block by
 * block, as 8 ymm "chunks": chunk c, lane k = quants 4c .. 4c + 3 of row k's block (u8 form
 * below), then, for Q8_0 without VNNI, the same 8 chunks of the signed quants, then the 8
 * rows' scales as f32. The kernel broadcasts a token's 4 quants (vpbroadcastd) against a
 * chunk, so one multiply instruction feeds 8 rows at once and every lane ends with its row's
 * exact integer block sum: no horizontal reduction (the unpacked tile spends a vphaddd tree
 * per 8 blocks per (row, token)). u8 forms and integer steps per chunk:
 *   Q4_0: nibbles 0..15; vpmaddubsw into i16 pairs (|pair| <= 2 * 15 * 127 = 3810, the 8
 *         chunks of a block sum to <= 30480 in i16), one vpmaddwd per block; with AVX-VNNI one
 *         vpdpbusd per chunk. Correction -8 * sum(q_x) (stored by the quantizer).
 *   Q8_0, AVX-VNNI: w ^ 0x80 = w + 128 (u8), one vpdpbusd per chunk, correction
 *         -128 * sum(q_x) (vpdpbusd sums 4 products into i32: no i16 saturation).
 *   Q8_0, no VNNI: |w| against sign(x, w) (vpsignb, vpmaddubsw; |pair| <= 32512), vpmaddwd,
 *         vpaddd: vpmaddubsw's i16 pairs leave no room to add chunks first.
 * Blocks are stored residue-major (b = j, j + 16, j + 32, ... for j = 0..15), so the kernel
 * keeps cpu.h's accumulator a[j] of every (row, token) in one register while it runs the
 * FMA chain fma(D_b, isum_b, a[j]) over those blocks in order, then the fixed tree over the
 * 16 accumulators per lane: exactly the scalar reference's operations, so the same bits.
 */
/* rows per packed group: NV ymm vectors of 8 rows; tokens per tile (registers: NV * PK_TOK
 * integer accumulators, NV weight chunks, the broadcast; the f32 accumulators stay in L1) */
#define PK_NV   2
#define PK_ROWS (8 * PK_NV)
#define PK_TOK  6
/* Q8_0 without VNNI also holds the signed chunks and the vpmaddwd ones: fewer tokens */
#define PK_TOK_Q8BW 4

/* bytes per block of one 8-row vector: chunks (+ signed chunks) + 8 f32 scales */
KA size_t pk_vec_bytes(const int Q4, const int VNNI) {
    return 256 + (!Q4 && !VNNI ? 256 : 0) + 32;
}

/* 8 x 8 transpose of 32-bit elements: out[c] lane k = in[k] lane c */
KA void transpose8(const __m256i in[8], __m256i out[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        out[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
        out[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
    }
}

/* block b of rows k0 .. k0 + kn - 1 (kn <= 8; the rest zero, scale 0: they add nothing to
 * any lane a caller reads) as one 8-row vector's packed bytes at d */
KA void pk_pack_vec(const int Q4, const int VNNI, const uint8_t *w, size_t rs, int k0, int kn,
                    int64_t b, uint8_t *d) {
    const size_t BSZ = Q4 ? sizeof(kiln_block_q4_0) : sizeof(kiln_block_q8_0);
    const __m256i low4 = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    __m256i q[8], t[8];
    uint16_t sc[8]; /* fp16 scales, converted together (exact) */
    for (int k = 0; k < 8; k++) {
        if (k >= kn) {
            q[k] = _mm256_setzero_si256();
            sc[k] = 0;
            continue;
        }
        const uint8_t *wb = w + (size_t)(k0 + k) * rs + (size_t)b * BSZ;
        sc[k] = rd16(wb);
        if (Q4) {
            __m128i h = _mm_loadu_si128((const __m128i *)(wb + 2));
            q[k] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(h, 4), h), low4);
        } else {
            q[k] = _mm256_loadu_si256((const __m256i *)(wb + 2));
        }
    }
    transpose8(q, t);
    for (int c = 0; c < 8; c++) {
        __m256i u = t[c];
        if (!Q4 && VNNI) u = _mm256_xor_si256(u, x80);
        if (!Q4 && !VNNI) {
            u = _mm256_sign_epi8(t[c], t[c]);
            _mm256_storeu_si256((__m256i *)(d + 256 + 32 * c), t[c]);
        }
        _mm256_storeu_si256((__m256i *)(d + 32 * c), u);
    }
    _mm256_storeu_ps((float *)(d + pk_vec_bytes(Q4, VNNI) - 32),
                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)));
}

/* rows [0, nrows) of w into PK_ROWS-row groups at dst (group g at dst + g * PK_ROWS *
 * pk_row_bytes), blocks residue-major, each block's PK_NV vectors one after the other */
KA void pk_pack(const int Q4, const int VNNI, int64_t n, const uint8_t *w, size_t rs, int nrows,
                uint8_t *dst) {
    const size_t VB = pk_vec_bytes(Q4, VNNI);
    const int64_t nb = n / 32;
    for (int k0 = 0; k0 < nrows; k0 += PK_ROWS) {
        uint8_t *d = dst + (size_t)k0 * (size_t)nb * VB / 8;
        for (int j = 0; j < 16; j++)
            for (int64_t b = j; b < nb; b += 16)
                for (int v = 0; v < PK_NV; v++, d += VB) {
                    int kv = k0 + 8 * v, kn = nrows - kv < 8 ? nrows - kv : 8;
                    pk_pack_vec(Q4, VNNI, w, rs, kv, kn < 0 ? 0 : kn, b, d);
                }
    }
}

/* vpdpbusd ymm (AVX-VNNI, VEX encoded) by inline asm: the file is built for AVX2 only, and
 * the kernels that use it run only after kiln_cpu_use_avxvnni() */
KA __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}

/* the block's correction -(sum of token row xr's quants in block b) << shift, in every lane */
KA __m256i pk_corr(const uint8_t *xr, int64_t nbp, int64_t b, int shift) {
    int32_t sx;
    memcpy(&sx, xr + KILN_Q8_SUM_OFF(nbp) + 4 * (size_t)b, 4);
    return _mm256_set1_epi32(-(int32_t)((uint32_t)sx << shift));
}

KA __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* one PK_ROWS-row group (packed at pk) against R tokens (xq + r * xs): out[k * R + r] for
 * k < nrows */
KA void pk_body(const int Q4, const int VNNI, int64_t n, const uint8_t *pk, const uint8_t *xq,
                size_t xs, const int R, int nrows, float *out) {
    const int64_t nb = n / 32, nbp = kiln_q8_nbp(n);
    const size_t VB = pk_vec_bytes(Q4, VNNI);
    const __m256i ones = _mm256_set1_epi16(1);
    const int shift = Q4 ? 3 : 7; /* the correction -(8 or 128) * sum(q_x) */
    __m256 A[PK_NV][PK_TOK][16]; /* cpu.h's accumulators a[j] of each (row, token) */
    const uint8_t *p = pk;
    for (int j = 0; j < 16; j++) {
        _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++)
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) A[v][r][j] = _mm256_setzero_ps();
        for (int64_t b = j; b < nb; b += 16, p += PK_NV * VB) {
            __m256i is[PK_NV][PK_TOK];
            if (VNNI || Q4) {
                __m256i s16[PK_NV][PK_TOK]; /* Q4_0 without VNNI: i16 pair sums */
                if (VNNI)
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                        const __m256i corr = pk_corr(xq + (size_t)r * xs, nbp, b, shift);
                        _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) is[v][r] = corr;
                    }
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                    __m256i U[PK_NV];
                    _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) U[v] =
                        _mm256_load_si256((const __m256i *)(p + v * VB + 32 * c));
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                        const __m256i x = bcast4(xq + (size_t)r * xs + 32 * b + 4 * c);
                        _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) {
                            if (VNNI) {
                                is[v][r] = dpbusd(is[v][r], U[v], x);
                            } else {
                                __m256i m = _mm256_maddubs_epi16(U[v], x);
                                s16[v][r] = c == 0 ? m : _mm256_add_epi16(s16[v][r], m);
                            }
                        }
                    }
                }
                if (!VNNI)
                    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                        const __m256i corr = pk_corr(xq + (size_t)r * xs, nbp, b, shift);
                        _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) is[v][r] =
                            _mm256_add_epi32(corr, _mm256_madd_epi16(s16[v][r], ones));
                    }
            } else {
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                    _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) {
                        const __m256i U = _mm256_load_si256((const __m256i *)(p + v * VB + 32 * c));
                        const __m256i S =
                            _mm256_load_si256((const __m256i *)(p + v * VB + 256 + 32 * c));
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                            __m256i x = _mm256_sign_epi8(
                                bcast4(xq + (size_t)r * xs + 32 * b + 4 * c), S);
                            __m256i m = _mm256_madd_epi16(_mm256_maddubs_epi16(U, x), ones);
                            is[v][r] = c == 0 ? m : _mm256_add_epi32(is[v][r], m);
                        }
                    }
                }
            }
            _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++) {
                const __m256 dw = _mm256_load_ps((const float *)(p + v * VB + VB - 32));
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    const float *dx = (const float *)(xq + (size_t)r * xs + KILN_Q8_D_OFF(nbp));
                    A[v][r][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(dx + b)),
                                                 _mm256_cvtepi32_ps(is[v][r]), A[v][r][j]);
                }
            }
        }
    }
    _Pragma("GCC unroll 2") for (int v = 0; v < PK_NV; v++)
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) { /* cpu.h's tree, per lane */
            __m256 s8[8], s4[4];
            for (int j = 0; j < 8; j++) s8[j] = _mm256_add_ps(A[v][r][j], A[v][r][j + 8]);
            for (int j = 0; j < 4; j++) s4[j] = _mm256_add_ps(s8[j], s8[j + 4]);
            __m256 s = _mm256_add_ps(_mm256_add_ps(s4[0], s4[2]), _mm256_add_ps(s4[1], s4[3]));
            float o[8];
            _mm256_storeu_ps(o, s);
            for (int k = 8 * v; k < nrows && k < 8 * v + 8; k++) out[k * R + r] = o[k - 8 * v];
        }
}

#define KILN_PK_CASE(Q4, VNNI, R)                                                                  \
    case R:                                                                                        \
        pk_body(Q4, VNNI, n, pk, xq, xs, R, nrows, out);                                           \
        return;

/* NAME##_pack / NAME##_ptile / NAME##_prow (kiln_cpu_q8_kernel's packed path) */
#define KILN_PK_DEFINE(NAME, Q4, VNNI)                                                             \
    static size_t NAME##_prow(int64_t n) {                                                         \
        return (size_t)(n / 32) * pk_vec_bytes(Q4, VNNI) / 8;                                      \
    }                                                                                              \
    static void NAME##_pack(int64_t n, const void *w, size_t rs, int nrows, uint8_t *dst) {        \
        pk_pack(Q4, VNNI, n, (const uint8_t *)w, rs, nrows, dst);                                  \
    }                                                                                              \
    static void NAME##_ptile(int64_t n, const uint8_t *pk, size_t ps, const void *w, size_t rs,    \
                             int nrows, const uint8_t *xq, size_t xs, int ntok, float *out) {      \
        (void)ps, (void)w, (void)rs; /* groups of 8 rows, no unpacked blocks */                    \
        switch (ntok) {                                                                            \
            KILN_PK_CASE(Q4, VNNI, 1)                                                              \
            KILN_PK_CASE(Q4, VNNI, 2)                                                              \
            KILN_PK_CASE(Q4, VNNI, 3)                                                              \
            KILN_PK_CASE(Q4, VNNI, 4)                                                              \
            KILN_PK_CASE(Q4, VNNI, 5)                                                              \
        default:                                                                                   \
            pk_body(Q4, VNNI, n, pk, xq, xs, PK_TOK, nrows, out);                                  \
            return;                                                                                \
        }                                                                                          \
    }

KILN_PK_DEFINE(q8_0_pk, 0, 0)
KILN_PK_DEFINE(q4_0_pk, 1, 0)
KILN_PK_DEFINE(q8_0_pkv, 0, 1)
KILN_PK_DEFINE(q4_0_pkv, 1, 1)

#define KILN_Q8_DEFINE(NAME, Q4, PK, PT, PMIN)                                                             \
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
                                                     .packed_row_bytes = PK##_prow,                \
                                                     .pack = PK##_pack,                            \
                                                     .ptile = PK##_ptile,                          \
                                                     .pmax_rows = PK_ROWS,                         \
                                                     .pmax_tok = PT,                               \
                                                     .pmin_tok = PMIN,                             \
                                                     .gemv = NAME##_gemv};

/* fewest tokens for the packed panels on AVX2 (matmul.c; env KILN_PK_MIN_TOK overrides): the
 * panel is packed once per call, so few tokens do not pay for it. One core, Q4_0 64 x 2048
 * panel in L2 (pack included), packed vs the 1 x 4 tiles, thread CPU time on a shared noisy
 * 2-core Zen 5: 16 tokens with VNNI ~75 vs ~55 GMAC/s, vpmaddubsw ~50 vs ~45; 8 tokens
 * about even, 4 tokens behind */
enum { PK_MIN_TOK_VNNI = 16, PK_MIN_TOK_BW = 16 };

KILN_Q8_DEFINE(q8_0, 0, q8_0_pk, PK_TOK_Q8BW, PK_MIN_TOK_BW)
KILN_Q8_DEFINE(q4_0, 1, q4_0_pk, PK_TOK, PK_MIN_TOK_BW)
KILN_Q8_DEFINE(q8_0v, 0, q8_0_pkv, PK_TOK, PK_MIN_TOK_VNNI)
KILN_Q8_DEFINE(q4_0v, 1, q4_0_pkv, PK_TOK, PK_MIN_TOK_VNNI)

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx2(kiln_dtype t, bool vnni) {
    switch (t) {
    case KILN_DTYPE_Q8_0:
        return vnni ? &q8_0v_kernel : &q8_0_kernel;
    case KILN_DTYPE_Q4_0:
        return vnni ? &q4_0v_kernel : &q4_0_kernel;
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

const kiln_cpu_q8_kernel *kiln_cpu_q8_kernel_avx2(kiln_dtype t, bool vnni) {
    (void)t, (void)vnni;
    return NULL;
}
void kiln_cpu_q8_quantize_row_avx2(int64_t n, const float *x, uint8_t *dst) {
    kiln_cpu_q8_quantize_row_ref(n, x, dst, false);
}

#endif
