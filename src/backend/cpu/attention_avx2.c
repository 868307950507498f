/*
 * attention_avx2.c - the AVX2 (+ FMA, F16C) kernel of kiln_attention_group (ops.h) over paged
 * KV in every page format with a SIMD kernel (kv/kv_format.h: f32, f16, bf16, q8_0, q4_0, and
 * blocks of several formats in one sequence), reading the pages in place: a q8_0 / q4_0
 * element is formed exactly in a register (int q times the block's f16 scale), no
 * dequantized copy of the cache exists. Only called after kiln_simd_supported(KILN_SIMD_AVX2)
 * (ops.c dispatches on kiln_simd_active()).
 *
 * Bitwise equal to the scalar reference (kiln_attention_paged / kiln_attention_paged_kv, ops.c
 * and kv_format.c's dot / axpy), so the AVX2 path keeps the bits it had when it ran that
 * reference (tests/golden pins them). Per (token, head) row, the reference's operations in
 * its order, only spread over lanes that are independent in it:
 *   q . k_t: one chain per key t, s = +0, then s = s + q[d] * k_t[d] (a multiply and an add,
 *     each rounded: the file is compiled with -ffp-contract=off, src/CMakeLists.txt) for d
 *     ascending; 8 keys in the 8 lanes (a chunk of 8 keys at absolute positions, transposed
 *     once and shared by every row that sees it); s / score_div;
 *   softcap: cap * tanhf(s / cap); max (exact in any order); e_t = expf(s_t - max) (libm, as
 *     the reference: the one scalar step) with sum = sum + e_t for t ascending; p_t = e_t /
 *     sum, rounded to the V operand (f16 / bf16, round to nearest even);
 *   out[d] = +0, then out[d] = out[d] + p_t * v_t[d] for t ascending; 8 dimensions in the 8
 *     lanes, tiles of up to 8 heads x 4 dimension chunks in registers.
 * So every output is a fixed function of its own query and keys: the same bits whatever n_tok,
 * G, the block size or the other tokens of the call (DESIGN.md principle 3). NaN inputs give
 * NaN outputs as in the reference (their payload bits may differ).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_rows.h"
#include "backend/cpu/ops_simd.h"
#include "kv/kv_format.h"
#include "tensor/dtype.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define KA static inline __attribute__((always_inline))

KA float half_at(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* element x of a row of code lf (kv_format.c's *_at: exact) */
static float elem_at(const char *row, int64_t x, int lf) {
    switch (lf) {
    case LF_F16:
        return half_at((const uint16_t *)row + x);
    case LF_BF16: {
        uint16_t h;
        memcpy(&h, (const uint16_t *)row + x, sizeof h);
        return kiln_bf16_to_fp32(h);
    }
    case LF_Q8: {
        const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + x / 32;
        return (float)b->qs[x % 32] * half_at(&b->d);
    }
    case LF_Q4: {
        const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + x / 32;
        const int j = (int)(x % 32);
        const int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
        return (float)(q - 8) * half_at(&b->d);
    }
    default: {
        float f;
        memcpy(&f, (const float *)row + x, sizeof f);
        return f;
    }
    }
}

/* elements e .. e + dn - 1 one by one, +0 in the lanes above dn (a head's last chunk when
 * head_dim % 8 != 0, or a quantized slice that crosses a block of 32 or of 16 nibbles) */
static __attribute__((noinline)) __m256 load_slow(const char *row, int64_t e, int dn, int lf) {
    float t[8] = {0};
    for (int j = 0; j < dn; j++) t[j] = elem_at(row, e + j, lf);
    return _mm256_loadu_ps(t);
}

/* 8 lanes of a row from element e: lanes j < dn hold element e + j, the rest +0 */
KA __m256 load_row8(const char *row, int64_t e, int dn, const int LF) {
    if (dn < 8) return load_slow(row, e, dn, LF);
    if (LF == LF_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e)));
    if (LF == LF_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e))),
            16));
    if (LF == LF_Q8) {
        const int j = (int)(e & 31);
        if (j + 8 > 32) return load_slow(row, e, dn, LF_Q8);
        const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + (e >> 5);
        const __m128i q = _mm_loadl_epi64((const __m128i *)(b->qs + j));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                             _mm256_set1_ps(half_at(&b->d)));
    }
    if (LF == LF_Q4) {
        const int j = (int)(e & 31), jj = j & 15;
        if (jj + 8 > 16) return load_slow(row, e, dn, LF_Q4);
        const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + (e >> 5);
        __m128i x = _mm_loadl_epi64((const __m128i *)(b->qs + jj));
        if (j >= 16) x = _mm_srli_epi16(x, 4);
        x = _mm_sub_epi8(_mm_and_si128(x, _mm_set1_epi8(15)), _mm_set1_epi8(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
                             _mm256_set1_ps(half_at(&b->d)));
    }
    return _mm256_loadu_ps((const float *)row + e);
}

/* load_row8 for a run-time code (LF_MIX rows) */
static __attribute__((noinline)) __m256 load_row8_any(const char *row, int64_t e, int dn, int lf) {
    switch (lf) {
    case LF_F16:
        return load_row8(row, e, dn, LF_F16);
    case LF_BF16:
        return load_row8(row, e, dn, LF_BF16);
    case LF_Q8:
        return load_row8(row, e, dn, LF_Q8);
    case LF_Q4:
        return load_row8(row, e, dn, LF_Q4);
    default:
        return load_row8(row, e, dn, LF_F32);
    }
}

KA __m256 load_row(const char *row, int64_t e, int dn, const int LF, int lf) {
    return LF == LF_MIX ? load_row8_any(row, e, dn, lf) : load_row8(row, e, dn, LF);
}

/* v rounded to bf16 (round to nearest even; NaN made quiet), widened back: the value
 * kiln_bf16_to_fp32(kiln_fp32_to_bf16(v)) lane by lane (tensor/dtype.c) */
KA __m256 round_bf16(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* v rounded to operand op (1: f16, 2: bf16; 0: v) */
KA __m256 round_operand(__m256 v, const int op) {
    if (op == 1)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (op == 2) return round_bf16(v);
    return v;
}

/* lanes l < n all ones (integer mask for maskload / maskstore) */
KA __m256i lane_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* r[0..7] transposed in place (pure data movement) */
KA void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Kt[d * 8 + l] = key (t0 + l)'s dimension d for l in [lo, hi), +0 elsewhere; d < hd */
KA void load_kt(float *Kt, const kiln_attn_kv *kv, const attn_fmt *af, int32_t t0, int lo, int hi,
                const int LF) {
    const int hd = kv->head_dim, nc = (hd + 7) / 8;
    const char *rows[8];
    int lfs[8];
    for (int l = lo; l < hi; l++)
        rows[l] = attn_row_of(kv, af, kv->k_blocks, af->kf, t0 + l, LF, &lfs[l]);
    for (int c = 0; c < nc; c++) {
        const int dn = hd - 8 * c < 8 ? hd - 8 * c : 8;
        const int64_t e = kv->head_off + 8 * c;
        __m256 r[8];
        _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) r[l] =
            l >= lo && l < hi ? load_row(rows[l], e, dn, LF, lfs[l]) : _mm256_setzero_ps();
        transpose8(r);
        for (int d = 0; d < dn; d++) _mm256_storeu_ps(Kt + (size_t)(8 * c + d) * 8, r[d]);
    }
}

enum { SROWS = 8 }; /* score rows computed together (accumulators in registers) */

/* one row's probabilities, in place: s[begin - base .. end - base) (base = begin & ~7) holds
 * the scores; the reference's kiln_softcap and kiln_softmax, then p rounded to operand pop.
 * The buffer's chunks of 8 from base are whole (lanes outside the range are scratch). */
static void softmax_row(float *s, int32_t begin, int32_t end, float softcap, int pop) {
    const int32_t base = begin & ~7, n = end - begin, nch = (end - base + 7) / 8;
    float *x = s + (begin - base);
    if (softcap > 0.0f)
        for (int32_t t = 0; t < n; t++) x[t] = softcap * tanhf(x[t] / softcap);
    /* the max: exact in any order (a zero's sign aside, which no exp(s - max) sees) */
    __m256 mx = _mm256_set1_ps(x[0]);
    for (int32_t j = 0; j < nch; j++) {
        const int32_t t0 = base + 8 * j;
        const __m256i in = _mm256_andnot_si256(lane_mask(begin - t0), lane_mask(end - t0));
        mx = _mm256_max_ps(
            mx, _mm256_blendv_ps(mx, _mm256_loadu_ps(s + 8 * j), _mm256_castsi256_ps(in)));
    }
    float m8[8];
    _mm256_storeu_ps(m8, mx);
    float m = m8[0];
    for (int l = 1; l < 8; l++) m = m8[l] > m ? m8[l] : m;
    float sum = 0.0f;
    for (int32_t t = 0; t < n; t++) {
        x[t] = expf(x[t] - m);
        sum += x[t];
    }
    const __m256 lv = _mm256_set1_ps(sum);
    for (int32_t j = 0; j < nch; j++) {
        const __m256 p = _mm256_div_ps(_mm256_loadu_ps(s + 8 * j), lv);
        if (pop == 1)
            _mm256_storeu_ps(s + 8 * j, round_operand(p, 1));
        else if (pop == 2)
            _mm256_storeu_ps(s + 8 * j, round_operand(p, 2));
        else
            _mm256_storeu_ps(s + 8 * j, p);
    }
}

/* out[h][c0 + c] = sum over t in [begin, end) of p_h[t] * v_t[chunk c0 + c] (+0 first, then
 * multiply and add, t ascending): one chain per (head, dimension) for NH heads x NCC chunks of
 * 8 dimensions, accumulators in registers. sc: row h's probabilities at sc + h * sc_stride,
 * indexed from base = begin & ~7. */
KA void pv_tile(float *out, int64_t head_stride, const float *sc, int64_t sc_stride, int32_t begin,
                int32_t end, const kiln_attn_kv *kv, const attn_fmt *af, int c0, const int NH,
                const int NCC, const int LF) {
    const int hd = kv->head_dim;
    const int32_t base = begin & ~7;
    __m256 acc[8][4];
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) acc[h][c] = _mm256_setzero_ps();
    int dn[4];
    for (int c = 0; c < NCC; c++) dn[c] = hd - 8 * (c0 + c) < 8 ? hd - 8 * (c0 + c) : 8;
    int32_t blk = begin / kv->block_size, row = begin % kv->block_size;
    int lf = LF == LF_MIX ? attn_lf_of(af->vf[blk]) : LF;
    size_t rb = af->rb[lf];
    const float *p0 = sc - base;
    for (int32_t t = begin; t < end; t++) {
        const char *vr = (const char *)kv->v_blocks[blk] + (size_t)row * rb;
        const int rlf = lf; /* this row's code */
        if (++row == kv->block_size) {
            row = 0, blk++;
            if (LF == LF_MIX && t + 1 < end) lf = attn_lf_of(af->vf[blk]), rb = af->rb[lf];
        }
        __m256 v[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) v[c] =
            load_row(vr, kv->head_off + 8 * (c0 + c), dn[c], LF, rlf);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
            const __m256 p = _mm256_broadcast_ss(p0 + (size_t)h * sc_stride + t);
            _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) acc[h][c] =
                _mm256_add_ps(acc[h][c], _mm256_mul_ps(p, v[c]));
        }
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) {
        float *o = out + (size_t)h * head_stride + 8 * (c0 + c);
        if (dn[c] == 8)
            _mm256_storeu_ps(o, acc[h][c]);
        else
            _mm256_maskstore_ps(o, lane_mask(dn[c]), acc[h][c]);
    }
}

/* the G heads of one token: tiles of 8 heads x 1 chunk, 4 x 2, 2 x 4 or 1 x 4 (the tile only
 * decides which chains share registers; each chain is the same whatever the tile) */
KA void attn_pv(float *out, int64_t head_stride, const float *sc, int64_t sc_stride, int G,
                int32_t begin, int32_t end, const kiln_attn_kv *kv, const attn_fmt *af,
                const int LF) {
    const int nc = (kv->head_dim + 7) / 8;
    for (int h0 = 0; h0 < G;) {
        const int nh = G - h0 >= 8 ? 8 : G - h0 >= 4 ? 4 : G - h0 >= 2 ? 2 : 1;
        float *o = out + (size_t)h0 * head_stride;
        const float *s = sc + (size_t)h0 * sc_stride;
        const int ncc = nh == 8 ? 1 : nh == 4 ? 2 : 4;
        int c0 = 0;
#define PV(NH, NCC) pv_tile(o, head_stride, s, sc_stride, begin, end, kv, af, c0, NH, NCC, LF)
        for (; c0 + ncc <= nc; c0 += ncc) {
            if (nh == 8)
                PV(8, 1);
            else if (nh == 4)
                PV(4, 2);
            else if (nh == 2)
                PV(2, 4);
            else
                PV(1, 4);
        }
        for (; c0 < nc; c0++) { /* the chunks left over */
            if (nh == 4)
                PV(4, 1);
            else if (nh == 2)
                PV(2, 1);
            else
                PV(1, 1);
        }
#undef PV
        h0 += nh;
    }
}

KA void attn_group(float *out, int64_t out_stride, const float *q, int64_t q_stride, int G,
                   int32_t n_tok, const int32_t *begin, const int32_t *end, const kiln_attn_kv *kv,
                   const attn_fmt *af, float score_div, float softcap, float *scratch,
                   const int LF) {
    const int hd = kv->head_dim;
    int32_t kmin, kmax;
    attn_key_span(n_tok, begin, end, &kmin, &kmax);
    const int32_t base0 = kmin & ~7;
    const int64_t sc_stride = ((kmax - base0 + 7) & ~7) + 8;
    const int rows = n_tok * G;
    float *Kt = scratch;                                      /* hd x 8 */
    float *qs = Kt + (size_t)hd * 8;                          /* rows x hd, rounded */
    float *sc = qs + (((size_t)rows * hd + 7) & ~(size_t)7); /* rows x sc_stride */
    for (int r = 0; r < rows; r++) {
        const float *qr = q + (size_t)(r / G) * q_stride + (size_t)(r % G) * hd;
        float *qd = qs + (size_t)r * hd;
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(qd + d, round_operand(_mm256_loadu_ps(qr + d), af->qop));
        for (; d < hd; d++) qd[d] = kiln_kv_operand_round(qr[d], (kiln_kv_operand)af->qop);
    }
    /* scores, chunk by chunk; row r's buffer starts at its own base (begin & ~7) */
    const __m256 div = _mm256_set1_ps(score_div);
    for (int32_t t0 = base0; t0 < kmax; t0 += 8) {
        const int lo = kmin > t0 ? kmin - t0 : 0, hi = kmax - t0 < 8 ? kmax - t0 : 8;
        if (t0 + 8 < kmax) /* the next chunk's keys, this chunk's values (for attn_pv) */
            attn_prefetch_rows(kv, af, kv->k_blocks, af->kf, t0 + 8, 0,
                          kmax - t0 - 8 < 8 ? kmax - t0 - 8 : 8, LF);
        attn_prefetch_rows(kv, af, kv->v_blocks, af->vf, t0, lo, hi, LF);
        load_kt(Kt, kv, af, t0, lo, hi, LF);
        /* active rows: tokens whose range meets the chunk (consecutive tokens) */
        int32_t i0, i1;
        attn_active_tokens(n_tok, begin, end, t0, 8, &i0, &i1);
        for (int r0 = i0 * G; r0 < i1 * G; r0 += SROWS) {
            const int nr = i1 * G - r0 < SROWS ? i1 * G - r0 : SROWS;
            __m256 acc[SROWS];
            _Pragma("GCC unroll 8") for (int r = 0; r < SROWS; r++) acc[r] = _mm256_setzero_ps();
            const float *qb = qs + (size_t)r0 * hd;
            if (nr == SROWS) {
                for (int d = 0; d < hd; d++) {
                    const __m256 kt = _mm256_loadu_ps(Kt + (size_t)d * 8);
                    _Pragma("GCC unroll 8") for (int r = 0; r < SROWS; r++) acc[r] = _mm256_add_ps(
                        acc[r], _mm256_mul_ps(_mm256_broadcast_ss(qb + (size_t)r * hd + d), kt));
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    const __m256 kt = _mm256_loadu_ps(Kt + (size_t)d * 8);
                    for (int r = 0; r < nr; r++)
                        acc[r] = _mm256_add_ps(
                            acc[r],
                            _mm256_mul_ps(_mm256_broadcast_ss(qb + (size_t)r * hd + d), kt));
                }
            }
            for (int r = 0; r < nr; r++) {
                const int32_t i = (r0 + r) / G, base = begin[i] & ~7;
                if (end[i] <= t0 || begin[i] >= t0 + 8) continue; /* row not in this chunk */
                _mm256_storeu_ps(sc + (size_t)(r0 + r) * sc_stride + (t0 - base),
                                 _mm256_div_ps(acc[r], div));
            }
        }
    }
    for (int32_t i = 0; i < n_tok; i++) {
        for (int h = 0; h < G; h++)
            softmax_row(sc + (size_t)(i * G + h) * sc_stride, begin[i], end[i], softcap, af->pop);
        attn_pv(out + (size_t)i * out_stride, hd, sc + (size_t)i * G * sc_stride, sc_stride, G,
                begin[i], end[i], kv, af, LF);
    }
}

size_t kiln_attention_group_scratch_avx2(int32_t n_tok, int32_t G, int32_t head_dim,
                                         int32_t max_keys) {
    const size_t rows = (size_t)n_tok * (size_t)G;
    return (size_t)head_dim * 8 + ((rows * (size_t)head_dim + 7) & ~(size_t)7) +
           rows * (((size_t)max_keys + 7 + 7) / 8 * 8 + 8) + 8;
}

void kiln_attention_group_avx2(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                               int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                               const kiln_attn_kv *kv, float score_div, float softcap,
                               float *scratch) {
    attn_fmt af;
    const int lf = attn_fmt_init(&af, kv, n_tok, begin, end);
#define ATTN_G(LF)                                                                                 \
    attn_group(out, out_stride, q, q_stride, G, n_tok, begin, end, kv, &af, score_div, softcap,    \
               scratch, LF)
    switch (lf) {
    case LF_F16:
        ATTN_G(LF_F16);
        break;
    case LF_BF16:
        ATTN_G(LF_BF16);
        break;
    case LF_Q8:
        ATTN_G(LF_Q8);
        break;
    case LF_Q4:
        ATTN_G(LF_Q4);
        break;
    case LF_MIX:
        ATTN_G(LF_MIX);
        break;
    default:
        ATTN_G(LF_F32);
        break;
    }
#undef ATTN_G
}

#else

size_t kiln_attention_group_scratch_avx2(int32_t n_tok, int32_t G, int32_t head_dim,
                                         int32_t max_keys) {
    (void)n_tok, (void)G, (void)head_dim, (void)max_keys;
    return 0;
}
void kiln_attention_group_avx2(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                               int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                               const kiln_attn_kv *kv, float score_div, float softcap,
                               float *scratch) {
    (void)out, (void)out_stride, (void)q, (void)q_stride, (void)G, (void)n_tok, (void)begin;
    (void)end, (void)kv, (void)score_div, (void)softcap, (void)scratch;
}

#endif
