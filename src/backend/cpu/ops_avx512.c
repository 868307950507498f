/*
 * ops_avx512.c - AVX-512 versions of the row-wise operations of ops.h: RMSNorm, the SiLU
 * gate of SwiGLU, and attention over paged KV. Only called after
 * kiln_simd_supported(KILN_SIMD_AVX512) (ops.c dispatches on kiln_simd_active()).
 *
 * Each function reduces in one fixed order that depends only on its own row (or its own
 * (token, head) pair and the key range), so results do not depend on the batch, the thread
 * count or on how keys are split into blocks (DESIGN.md principle 3). They agree with the
 * scalar references in ops.c to float rounding (different summation order, and exp from
 * exp16 below instead of libm's expf); tests/cpu/test_ops_paths.c states the tolerances.
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

/* lanes j + j+8, j + j+4, j + j+2, 0 + 1: a fixed horizontal sum */
KA float hsum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KA __mmask16 tail_mask(int64_t m) {
    return (__mmask16)((1u << m) - 1u);
}

/*
 * exp of 16 lanes: x = n ln2 + r (Cody-Waite, |r| <= ln2/2), e^r by a degree-6 polynomial
 * (Taylor coefficients, Horner), times 2^n by vscalefps. Max error ~2 ulp over the f32
 * range; exp(x) = 0 for x < -104, +inf for x >= 88.73 (overflow), NaN stays NaN (the clamps take x
 * as their second operand so a NaN passes through them).
 */
KA __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.76f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

void kiln_exp_avx512(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ---------------------------------------------------------------- RMSNorm */

/* sum of squares: lane j of accumulator (i / 16) % 2 gets x[i]^2 (FMA) for i = 16 k + j,
 * tail lanes zero-padded; result hsum16(acc0 + acc1) */
void kiln_rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    if (i + 16 <= n) {
        __m512 v0 = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        i += 16;
        if (i < n) {
            __m512 v1 = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
            a1 = _mm512_fmadd_ps(v1, v1, a1);
        }
    } else if (i < n) {
        __m512 v0 = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
    }
    float ss = hsum16(_mm512_add_ps(a0, a1));
    ss /= (float)n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    const __m512 s = _mm512_set1_ps(ss);
    for (i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 v = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, x + i));
        if (w) v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v);
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

/* ---------------------------------------------------------------- SwiGLU */

/* g[i] = (g[i] * (1 / (1 + exp(-g[i])))) * u[i], elementwise (any lane, any position: the
 * same operations) */
KA __m512 swiglu16(__m512 g, __m512 u) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    return _mm512_mul_ps(_mm512_mul_ps(g, s), u);
}

void kiln_swiglu_avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, swiglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(
            g + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* ---------------------------------------------------------------- attention */

/*
 * Grouped attention (kiln_attention_group): the G query heads that share one KV head, for
 * n_tok query tokens of one sequence. Keys are taken in chunks of 16 aligned to absolute
 * positions (chunk j = keys 16j .. 16j + 15). Each chunk's K rows are converted to f32 and
 * transposed once (lane l of Kt[d] = key 16j + l, dimension d), then shared by every
 * (token, head) row whose key range [begin, end) meets the chunk.
 *
 * Order per (token, head) row, independent of the other rows, of n_tok, of the block size
 * and of the chunk's other keys (DESIGN.md principle 3):
 *   s_t = a_t / score_div, a_t = fma chain over d = 0 .. hd-1 from +0: a = fma(q[d], k_t[d], a)
 *         (F16 / BF16 rows: q rounded to f16 / bf16 first); softcap (if any)
 *         s = cap * tanhf(s / cap);
 *   m = max over [begin, end); p_t = exp16(s_t - m); l = hsum16 of the lane-wise sum over
 *         chunks ascending, lane = t % 16 (keys outside the range contribute +0);
 *   p_t = p_t / l (F16 / BF16: rounded to f16 / bf16); out[d] = fma chain over t = begin .. end-1
 * from +0.
 */

KA __m512 perm2(__m512 a, __m512 b, const int B, const int hi) {
    /* hi = 0: lanes c with (c & B) take b[c - B], else a[c];
     * hi = 1: lanes c with (c & B) keep b[c], else a[c + B] */
    int idx[16];
    for (int c = 0; c < 16; c++)
        idx[c] = hi ? ((c & B) ? 16 + c : c + B) : ((c & B) ? 16 + c - B : c);
    const __m512i iv =
        _mm512_setr_epi32(idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7], idx[8],
                          idx[9], idx[10], idx[11], idx[12], idx[13], idx[14], idx[15]);
    return _mm512_permutex2var_ps(a, iv, b);
}

/* in-place 16 x 16 transpose by recursive swaps of the off-diagonal blocks (8, 4, 2, 1) */
KA void transpose16(__m512 r[16]) {
    _Pragma("GCC unroll 4") for (int k = 3; k >= 0; k--) {
        const int B = 1 << k;
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
            if (i & B) continue;
            const __m512 a = r[i], b = r[i | B];
            r[i] = perm2(a, b, B, 0);
            r[i | B] = perm2(a, b, B, 1);
        }
    }
}

/* v rounded to bf16 (round to nearest even; NaN made quiet), widened back: the value
 * kiln_bf16_to_fp32(kiln_fp32_to_bf16(v)) lane by lane (tensor/dtype.c) */
KA __m512 round_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, hi));
}

/* v rounded to operand op (1: f16, 2: bf16; 0: v); op is a run-time value, used once per
 * q row and once per 16 probabilities */
KA __m512 round_operand(__m512 v, const int op) {
    if (op == 1)
        return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (op == 2) return round_bf16(v);
    return v;
}


KA float half_at(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* elements e .. e + dn - 1 of a quantized row one by one (a slice that crosses a block of 32:
 * only heads that do not start on a 16-element boundary within their block) */
static __attribute__((noinline)) __m512 load_quant_slow(const char *row, int64_t e, int dn,
                                                         const int LF) {
    float t[16] = {0};
    for (int j = 0; j < dn; j++) {
        const int64_t x = e + j;
        if (LF == LF_Q8) {
            const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + x / 32;
            t[j] = (float)b->qs[x % 32] * half_at(&b->d);
        } else {
            const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + x / 32;
            const int jj = (int)(x % 32);
            const int q = jj < 16 ? (b->qs[jj] & 15) : (b->qs[jj - 16] >> 4);
            t[j] = (float)(q - 8) * half_at(&b->d);
        }
    }
    return _mm512_loadu_ps(t);
}

/* 16 lanes of a row from element e (lanes of m only, the rest +0); m is a tail mask. A
 * q8_0 / q4_0 element is formed exactly: (int) q * f16 scale, in a register. */
KA __m512 load_row16(const char *row, int64_t e, __mmask16 m, const int LF) {
    if (LF == LF_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + e));
    if (LF == LF_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + e)), 16));
    if (LF == LF_Q8) {
        const int j = (int)(e & 31), dn = __builtin_popcount((unsigned)m);
        if (j + dn > 32) return load_quant_slow(row, e, dn, LF_Q8);
        const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)row + (e >> 5);
        const __m128i q = _mm_maskz_loadu_epi8(m, b->qs + j);
        return _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                                   _mm512_set1_ps(half_at(&b->d)));
    }
    if (LF == LF_Q4) {
        const int j = (int)(e & 31), dn = __builtin_popcount((unsigned)m), jj = j & 15;
        if (jj + dn > 16) return load_quant_slow(row, e, dn, LF_Q4);
        const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)row + (e >> 5);
        __m128i x = _mm_maskz_loadu_epi8(m, b->qs + jj);
        if (j >= 16) x = _mm_srli_epi16(x, 4);
        x = _mm_sub_epi8(_mm_and_si128(x, _mm_set1_epi8(15)), _mm_set1_epi8(8));
        return _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)),
                                   _mm512_set1_ps(half_at(&b->d)));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)row + e);
}

/* load_row16 for a run-time code (LF_MIX rows) */
static __attribute__((noinline)) __m512 load_row16_any(const char *row, int64_t e, __mmask16 m,
                                                        int lf) {
    switch (lf) {
    case LF_F16:
        return load_row16(row, e, m, LF_F16);
    case LF_BF16:
        return load_row16(row, e, m, LF_BF16);
    case LF_Q8:
        return load_row16(row, e, m, LF_Q8);
    case LF_Q4:
        return load_row16(row, e, m, LF_Q4);
    default:
        return load_row16(row, e, m, LF_F32);
    }
}


KA __m512 load_row(const char *row, int64_t e, __mmask16 m, const int LF, int lf) {
    return LF == LF_MIX ? load_row16_any(row, e, m, lf) : load_row16(row, e, m, LF);
}

/* Kt[d * 16 + l] = key (t0 + l)'s dimension d for l in [lo, hi) (absolute keys t0 + lo ..),
 * +0 elsewhere; d < hd */
KA void load_kt(float *Kt, const kiln_attn_kv *kv, const attn_fmt *af, int32_t t0, int lo, int hi,
                const int LF) {
    const int hd = kv->head_dim, nc = (hd + 15) / 16;
    const char *rows[16];
    int lfs[16];
    for (int l = lo; l < hi; l++)
        rows[l] = attn_row_of(kv, af, kv->k_blocks, af->kf, t0 + l, LF, &lfs[l]);
    for (int c = 0; c < nc; c++) {
        const int dn = hd - 16 * c < 16 ? hd - 16 * c : 16;
        const __mmask16 m = tail_mask(dn);
        const int64_t e = kv->head_off + 16 * c;
        __m512 r[16];
        _Pragma("GCC unroll 16") for (int l = 0; l < 16; l++) r[l] =
            l >= lo && l < hi ? load_row(rows[l], e, m, LF, lfs[l]) : _mm512_setzero_ps();
        transpose16(r);
        for (int d = 0; d < dn; d++) _mm512_store_ps(Kt + (size_t)(16 * c + d) * 16, r[d]);
    }
}


enum { SROWS = 8 }; /* score rows computed together (accumulators in registers) */

/* one row's scores: row buffer sc (chunks from base = begin & ~15), lanes outside
 * [begin, end) = -inf */
KA void attn_softmax_row(float *sc, int32_t begin, int32_t end, float softcap, const int pop) {
    const int32_t base = begin & ~15, nch = (end - base + 15) / 16;
    if (softcap > 0.0f)
        for (int32_t t = begin; t < end; t++)
            sc[t - base] = softcap * tanhf(sc[t - base] / softcap);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int32_t j = 0; j < nch; j++) mx = _mm512_max_ps(mx, _mm512_load_ps(sc + 16 * j));
    const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int32_t j = 0; j < nch; j++) {
        const int32_t t0 = base + 16 * j;
        __mmask16 m = 0xFFFF;
        if (t0 < begin) m &= (__mmask16)(0xFFFFu << (begin - t0));
        if (t0 + 16 > end) m &= tail_mask(end - t0);
        __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_load_ps(sc + 16 * j), mxv)));
        _mm512_store_ps(sc + 16 * j, p);
        sum = _mm512_add_ps(sum, p);
    }
    const __m512 lv = _mm512_set1_ps(hsum16(sum));
    for (int32_t j = 0; j < nch; j++) {
        __m512 p = _mm512_div_ps(_mm512_load_ps(sc + 16 * j), lv);
        p = round_operand(p, pop);
        _mm512_store_ps(sc + 16 * j, p);
    }
}

/* acc[h][c] = sum over t in [begin, end) of p_h[t] * v_t[chunk c0 + c], one FMA chain per
 * (h, c), for NH heads x NCC chunks (constants in the fast case, so that the accumulators
 * stay in registers) */
KA void attn_pv_tile(float *out, int64_t head_stride, const float *sc, int64_t sc_stride,
                     int32_t begin, int32_t end, const kiln_attn_kv *kv, const attn_fmt *af,
                     int c0, int nc, __mmask16 last, const int NH, const int NCC, const int LF) {
    const int32_t base = begin & ~15;
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) acc[h][c] = _mm512_setzero_ps();
    int32_t blk = begin / kv->block_size, row = begin % kv->block_size;
    int lf = LF == LF_MIX ? attn_lf_of(af->vf[blk]) : LF;
    size_t rb = af->rb[lf];
    const float *p0 = sc - base;
    for (int32_t t = begin; t < end; t++) {
        const char *vr = (const char *)kv->v_blocks[blk] + (size_t)row * rb;
        const int rlf = lf; /* this row's format */
        if (++row == kv->block_size) {
            row = 0, blk++;
            if (LF == LF_MIX && t + 1 < end) lf = attn_lf_of(af->vf[blk]), rb = af->rb[lf];
        }
        __m512 v[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) v[c] =
            load_row(vr, kv->head_off + 16 * (c0 + c), c0 + c == nc - 1 ? last : 0xFFFF, LF, rlf);
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            const __m512 p = _mm512_set1_ps(p0[(size_t)h * sc_stride + t]);
            _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++) acc[h][c] =
                _mm512_fmadd_ps(p, v[c], acc[h][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < NCC; c++)
            _mm512_mask_storeu_ps(out + (size_t)h * head_stride + 16 * (c0 + c),
                                  c0 + c == nc - 1 ? last : 0xFFFF, acc[h][c]);
}

/* out rows (G heads of one token) = sum_t p_t v_t over [begin, end), in tiles of up to 4
 * heads x 4 chunks of 16 dimensions (each (head, dimension) is one chain whatever the tile) */
KA void attn_pv(float *out, int64_t head_stride, const float *sc, int64_t sc_stride, int G,
                int32_t begin, int32_t end, const kiln_attn_kv *kv, const attn_fmt *af,
                const int FMT, const int NC) {
    const int hd = kv->head_dim, nc = NC ? NC : (hd + 15) / 16;
    const __mmask16 last = !NC && hd % 16 ? tail_mask(hd % 16) : (__mmask16)0xFFFF;
    for (int h0 = 0; h0 < G; h0 += 4) {
        const int nh = G - h0 < 4 ? G - h0 : 4;
        float *o = out + (size_t)h0 * head_stride;
        const float *s = sc + (size_t)h0 * sc_stride;
        for (int c0 = 0; c0 < nc; c0 += 4) {
            const int ncc = nc - c0 < 4 ? nc - c0 : 4;
#define PV(NH, NCC)                                                                                \
    attn_pv_tile(o, head_stride, s, sc_stride, begin, end, kv, af, c0, nc, last, NH, NCC, FMT)
            if (nh == 4 && ncc == 4)
                PV(4, 4);
            else if (nh == 4)
                switch (ncc) {
                case 1:
                    PV(4, 1);
                    break;
                case 2:
                    PV(4, 2);
                    break;
                default:
                    PV(4, 3);
                    break;
                }
            else
                for (int h = 0; h < nh; h++) { /* one head at a time */
                    float *oh = o + (size_t)h * head_stride;
                    const float *sh = s + (size_t)h * sc_stride;
#undef PV
#define PV(NCC)                                                                                    \
    attn_pv_tile(oh, head_stride, sh, sc_stride, begin, end, kv, af, c0, nc, last, 1, NCC, FMT)
                    switch (ncc) {
                    case 1:
                        PV(1);
                        break;
                    case 2:
                        PV(2);
                        break;
                    case 3:
                        PV(3);
                        break;
                    default:
                        PV(4);
                        break;
                    }
#undef PV
                }
        }
    }
}

KA void attn_group(float *out, int64_t out_stride, const float *q, int64_t q_stride, int G,
                   int32_t n_tok, const int32_t *begin, const int32_t *end, const kiln_attn_kv *kv,
                   const attn_fmt *af, float score_div, float softcap, float *scratch,
                   const int FMT, const int NC) {
    const int hd = kv->head_dim;
    int32_t kmin, kmax;
    attn_key_span(n_tok, begin, end, &kmin, &kmax);
    const int32_t base0 = kmin & ~15;
    const int64_t sc_stride = ((kmax - base0 + 15) & ~15) + 16;
    float *Kt = scratch;              /* hd x 16 */
    float *qs = Kt + (size_t)hd * 16; /* rows x hd (rounded for F16 / BF16 rows) */
    float *sc = qs + (((size_t)n_tok * G * hd + 15) & ~(size_t)15); /* rows x sc_stride */
    const int rows = n_tok * G;
    for (int r = 0; r < rows; r++) {
        const float *qr = q + (size_t)(r / G) * q_stride + (size_t)(r % G) * hd;
        for (int d = 0; d < hd; d += 16) {
            const __mmask16 m = hd - d >= 16 ? (__mmask16)0xFFFF : tail_mask(hd - d);
            __m512 v = _mm512_maskz_loadu_ps(m, qr + d);
            v = round_operand(v, af->qop);
            _mm512_mask_storeu_ps(qs + (size_t)r * hd + d, m, v);
        }
    }
    /* scores, chunk by chunk; row r's buffer starts at its own base (begin & ~15) */
    const __m512 div = _mm512_set1_ps(score_div);
    for (int32_t t0 = base0; t0 < kmax; t0 += 16) {
        int lo = kmin > t0 ? kmin - t0 : 0, hi = kmax - t0 < 16 ? kmax - t0 : 16;
        if (t0 + 16 < kmax) /* the next chunk's keys, this chunk's values (for attn_pv) */
            attn_prefetch_rows(kv, af, kv->k_blocks, af->kf, t0 + 16, 0,
                           kmax - t0 - 16 < 16 ? kmax - t0 - 16 : 16, FMT);
        attn_prefetch_rows(kv, af, kv->v_blocks, af->vf, t0, lo, hi, FMT);
        load_kt(Kt, kv, af, t0, lo, hi, FMT);
        /* active rows: tokens whose range meets the chunk (consecutive tokens) */
        int32_t i0, i1;
        attn_active_tokens(n_tok, begin, end, t0, 16, &i0, &i1);
        for (int r0 = i0 * G; r0 < i1 * G; r0 += SROWS) {
            const int nr = i1 * G - r0 < SROWS ? i1 * G - r0 : SROWS;
            __m512 acc[SROWS];
            _Pragma("GCC unroll 8") for (int r = 0; r < SROWS; r++) acc[r] = _mm512_setzero_ps();
            const float *qb = qs + (size_t)r0 * hd;
            if (nr == SROWS) {
                for (int d = 0; d < hd; d++) {
                    const __m512 kt = _mm512_load_ps(Kt + (size_t)d * 16);
                    _Pragma("GCC unroll 8") for (int r = 0; r < SROWS; r++) acc[r] =
                        _mm512_fmadd_ps(_mm512_set1_ps(qb[(size_t)r * hd + d]), kt, acc[r]);
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    const __m512 kt = _mm512_load_ps(Kt + (size_t)d * 16);
                    for (int r = 0; r < nr; r++)
                        acc[r] =
                            _mm512_fmadd_ps(_mm512_set1_ps(qb[(size_t)r * hd + d]), kt, acc[r]);
                }
            }
            for (int r = 0; r < nr; r++) {
                const int32_t i = (r0 + r) / G, base = begin[i] & ~15;
                if (end[i] <= t0 || begin[i] >= t0 + 16) continue; /* row not in this chunk */
                __mmask16 m = 0xFFFF;
                if (t0 < begin[i]) m &= (__mmask16)(0xFFFFu << (begin[i] - t0));
                if (t0 + 16 > end[i]) m &= tail_mask(end[i] - t0);
                const __m512 s = _mm512_mask_div_ps(_mm512_set1_ps(-INFINITY), m, acc[r], div);
                _mm512_store_ps(sc + (size_t)(r0 + r) * sc_stride + (t0 - base), s);
            }
        }
    }
    for (int32_t i = 0; i < n_tok; i++) {
        for (int h = 0; h < G; h++)
            attn_softmax_row(sc + (size_t)(i * G + h) * sc_stride, begin[i], end[i], softcap,
                             af->pop);
        attn_pv(out + (size_t)i * out_stride, hd, sc + (size_t)i * G * sc_stride, sc_stride, G,
                begin[i], end[i], kv, af, FMT, NC);
    }
}

size_t kiln_attention_group_scratch_avx512(int32_t n_tok, int32_t G, int32_t head_dim,
                                           int32_t max_keys) {
    const size_t rows = (size_t)n_tok * (size_t)G;
    return (size_t)head_dim * 16 + ((rows * (size_t)head_dim + 15) & ~(size_t)15) +
           rows * (((size_t)max_keys + 15 + 15) / 16 * 16 + 16) + 16;
}

#define ATTN_G(FMT, NC)                                                                            \
    attn_group(out, out_stride, q, q_stride, G, n_tok, begin, end, kv, &af, score_div, softcap,    \
               scratch, FMT, NC)
#define ATTN_NC(FMT)                                                                               \
    do {                                                                                           \
        if (kv->head_dim == 64)                                                                    \
            ATTN_G(FMT, 4);                                                                        \
        else if (kv->head_dim == 128)                                                              \
            ATTN_G(FMT, 8);                                                                        \
        else                                                                                       \
            ATTN_G(FMT, 0);                                                                        \
    } while (0)

void kiln_attention_group_avx512(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                                 int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                                 const kiln_attn_kv *kv, float score_div, float softcap,
                                 float *scratch) {
    attn_fmt af;
    const int lf = attn_fmt_init(&af, kv, n_tok, begin, end);
    /* the same operations whatever NC: a constant only lets the compiler unroll */
    switch (lf) {
    case LF_F16:
        ATTN_NC(LF_F16);
        break;
    case LF_BF16:
        ATTN_NC(LF_BF16);
        break;
    case LF_Q8:
        ATTN_NC(LF_Q8);
        break;
    case LF_Q4:
        ATTN_NC(LF_Q4);
        break;
    case LF_MIX:
        ATTN_G(LF_MIX, 0);
        break;
    default:
        ATTN_NC(LF_F32);
        break;
    }
}
#undef ATTN_NC
#undef ATTN_G

#else

void kiln_exp_avx512(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}
void kiln_rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps) {
    (void)out, (void)x, (void)w, (void)n, (void)eps;
}
void kiln_swiglu_avx512(float *g, const float *u, int64_t n) {
    (void)g, (void)u, (void)n;
}
size_t kiln_attention_group_scratch_avx512(int32_t n_tok, int32_t G, int32_t head_dim,
                                           int32_t max_keys) {
    return 0;
}
void kiln_attention_group_avx512(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                                 int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                                 const kiln_attn_kv *kv, float score_div, float softcap,
                                 float *scratch) {}

#endif
