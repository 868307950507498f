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

#include "backend/cpu/ops_simd.h"

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
        _mm512_mask_storeu_ps(g + i, m,
                              swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* ---------------------------------------------------------------- attention */

/*
 * Scores. For key t, the head vector k_t (hd elements, f32 or f16) is dotted with q in
 * 16-lane chunks c = 0, 1, ...: acc = q_0 * k_0 (exact product, then) acc = fma(q_c, k_c,
 * acc) for c >= 1, the last chunk zero padded. Keys are taken 16 at a time (key_begin +
 * 16 j ...); the 16 accumulators are folded together by fold16 into one vector whose lane
 * l is key l's dot, each summed as lanes (j + j+8), (j + j+4), (j + j+2), (0 + 1): the same
 * tree for every key whatever its slot. Then s_t = dot / score_div.
 */

/* r lane l (l < 8) = a[l] + a[l+8] for l < 8 from a, lanes 8.. the same from b */
KA __m512 fold_half(__m512 a, __m512 b) {
    __m512 lo = _mm512_shuffle_f32x4(a, b, 0x44); /* a0 a1 b0 b1 (128-bit lanes) */
    __m512 hi = _mm512_shuffle_f32x4(a, b, 0xEE); /* a2 a3 b2 b3 */
    return _mm512_add_ps(lo, hi);
}

/*
 * v[0..15] -> lane l = full sum of v[l]'s 16 lanes, as (j + j+8), (j + j+4), (j + j+2),
 * (0 + 1) per vector. Step 1 folds pairs (v[2i], v[2i+1]) to 8 lanes each; step 2 folds
 * 128-bit lanes again (j + j+4 of the original); steps 3 and 4 fold within 128-bit lanes.
 */
KA __m512 fold16(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) a[i] = fold_half(v[2 * i], v[2 * i + 1]);
    /* a[i]: 128-bit lanes [v2i: j+j8 (j 0..3) | v2i: j+j8 (j 4..7) | v2i+1 ... | ...] */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        __m512 x = a[2 * i], y = a[2 * i + 1];
        __m512 lo = _mm512_shuffle_f32x4(x, y, 0x88); /* x0 x2 y0 y2 */
        __m512 hi = _mm512_shuffle_f32x4(x, y, 0xDD); /* x1 x3 y1 y3 */
        b[i] = _mm512_add_ps(lo, hi); /* 128-bit lane k: vector 4i + k, 4 partial sums */
    }
    /* within 128-bit lanes: 4 values per vector -> 2 (j + j+2), then 1 (0 + 1) */
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        __m512 x = b[2 * i], y = b[2 * i + 1];
        /* pairs: x lane k = [p0 p1 p2 p3] -> [p0+p2, p1+p3] */
        __m512 lo = _mm512_shuffle_ps(x, y, 0x44); /* x0 x1 y0 y1 per 128 */
        __m512 hi = _mm512_shuffle_ps(x, y, 0xEE); /* x2 x3 y2 y3 */
        c[i] = _mm512_add_ps(lo, hi); /* [x: p0+p2, p1+p3, y: p0+p2, p1+p3] per 128 */
    }
    __m512 lo = _mm512_shuffle_ps(c[0], c[1], 0x88); /* c0 e0, c0 e2, c1 e0, c1 e2 */
    __m512 hi = _mm512_shuffle_ps(c[0], c[1], 0xDD);
    __m512 r = _mm512_add_ps(lo, hi);
    /* r 128-bit lane k holds, in order: vector 4i+k of x=b[0] (i=0), y=b[1] (i=1) of c[0],
     * then of c[1]: lanes = [b0 vec, b1 vec, b2 vec, b3 vec] for lane k; undo below */
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(perm, r);
}

KA __m512 load_k(const void *p, int64_t d, __mmask16 m, const int F16) {
    if (F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + d));
    return _mm512_maskz_loadu_ps(m, (const float *)p + d);
}

/* dot of the (f32, f16-rounded when F16) query chunks qv[] with key row k */
KA __m512 key_dot(const __m512 *qv, int nc, __mmask16 last, const void *k, const int F16) {
    __m512 acc = _mm512_mul_ps(qv[0], load_k(k, 0, nc == 1 ? last : 0xFFFF, F16));
    _Pragma("GCC unroll 8") for (int c = 1; c < nc; c++)
        acc = _mm512_fmadd_ps(qv[c], load_k(k, 16 * c, c == nc - 1 ? last : 0xFFFF, F16), acc);
    return acc;
}

enum { MAX_HD_CHUNKS = 32 }; /* head_dim <= 512 */

/* walks key rows t = t0, t0 + 1, ... of paged storage without a division per key */
typedef struct key_cursor {
    const void *const *blocks;
    int32_t bs, blk, row;
    size_t stride, off; /* bytes */
} key_cursor;

KA key_cursor cursor_at(const void *const *blocks, int32_t bs, int32_t t, size_t stride,
                        size_t off) {
    key_cursor c = {blocks, bs, t / bs, t % bs, stride, off};
    return c;
}

KA const void *cursor_next(key_cursor *c) {
    const void *p = (const char *)c->blocks[c->blk] + c->off + (size_t)c->row * c->stride;
    if (++c->row == c->bs) c->row = 0, c->blk++;
    return p;
}

/* NC: head_dim chunks of 16 (a compile-time constant for the common head sizes, 0 =
 * runtime nc) */
KA void attn_body(float *out, const float *q, const void *const *k_blocks,
                  const void *const *v_blocks, int32_t block_size, int64_t row_stride,
                  int64_t head_off, int32_t key_begin, int32_t n_keys, int32_t head_dim,
                  float score_div, float softcap, float *scores, const int F16, const int NC) {
    const size_t esz = F16 ? 2 : 4;
    const int nc = NC ? NC : (head_dim + 15) / 16;
    const __mmask16 last =
        !NC && head_dim % 16 ? tail_mask(head_dim % 16) : (__mmask16)0xFFFF; /* NC: hd % 16 == 0 */
    __m512 qv[MAX_HD_CHUNKS];
    _Pragma("GCC unroll 8") for (int c = 0; c < nc; c++) {
        __m512 v = _mm512_maskz_loadu_ps(c == nc - 1 ? last : 0xFFFF, q + 16 * c);
        if (F16) /* q rounded to f16 (round to nearest even), as the scalar reference */
            v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        qv[c] = v;
    }
    const int32_t n = n_keys - key_begin;
    const __m512 div = _mm512_set1_ps(score_div);
    key_cursor kc = cursor_at(k_blocks, block_size, key_begin, (size_t)row_stride * esz,
                              (size_t)head_off * esz);
    for (int32_t t0 = key_begin; t0 < n_keys; t0 += 16) {
        int cnt = n_keys - t0 < 16 ? n_keys - t0 : 16;
        __m512 v[16];
        if (cnt == 16) {
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) v[j] =
                key_dot(qv, nc, last, cursor_next(&kc), F16);
        } else {
            for (int j = 0; j < 16; j++)
                v[j] = j < cnt ? key_dot(qv, nc, last, cursor_next(&kc), F16) : _mm512_setzero_ps();
        }
        __m512 s = _mm512_div_ps(fold16(v), div);
        _mm512_mask_storeu_ps(scores + (t0 - key_begin), tail_mask(cnt), s);
    }
    if (softcap > 0.0f)
        for (int32_t t = 0; t < n; t++) scores[t] = softcap * tanhf(scores[t] / softcap);
    /* softmax: max, then p_t = exp(s_t - max) summed lane-wise over 16-key groups from
     * key_begin (lane (t - key_begin) % 16), hsum16; then p_t / sum (F16: p rounded to f16) */
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xFFFF : tail_mask(n - t);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, scores + t));
    }
    const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xFFFF : tail_mask(n - t);
        __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + t), mxv));
        p = _mm512_maskz_mov_ps(m, p);
        _mm512_mask_storeu_ps(scores + t, m, p);
        sum = _mm512_add_ps(sum, p);
    }
    const __m512 sv = _mm512_set1_ps(hsum16(sum));
    for (int32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xFFFF : tail_mask(n - t);
        __m512 p = _mm512_div_ps(_mm512_maskz_loadu_ps(m, scores + t), sv);
        if (F16)
            p = _mm512_cvtph_ps(_mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(scores + t, m, p);
    }
    /* out[d] = sum_t p_t v_t[d], t ascending, one FMA per (t, d) */
    __m512 acc[MAX_HD_CHUNKS];
    _Pragma("GCC unroll 8") for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    key_cursor vc = cursor_at(v_blocks, block_size, key_begin, (size_t)row_stride * esz,
                              (size_t)head_off * esz);
    for (int32_t t = 0; t < n; t++) {
        const void *vr = cursor_next(&vc);
        const __m512 p = _mm512_set1_ps(scores[t]);
        _Pragma("GCC unroll 8") for (int c = 0; c < nc; c++) acc[c] =
            _mm512_fmadd_ps(p, load_k(vr, 16 * c, c == nc - 1 ? last : 0xFFFF, F16), acc[c]);
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < nc; c++)
        _mm512_mask_storeu_ps(out + 16 * c, c == nc - 1 ? last : 0xFFFF, acc[c]);
}

#define ATTN_CALL(F16, NC)                                                                         \
    attn_body(out, q, k_blocks, v_blocks, block_size, row_stride, head_off, key_begin, n_keys,     \
              head_dim, score_div, softcap, scores, F16, NC)

bool kiln_attention_paged_avx512(float *out, const float *q, const void *const *k_blocks,
                                 const void *const *v_blocks, int32_t block_size,
                                 int64_t row_stride, int64_t head_off, int32_t key_begin,
                                 int32_t n_keys, int32_t head_dim, float score_div, float softcap,
                                 int kv_is_f16, float *scores) {
    if (head_dim < 1 || head_dim > 16 * MAX_HD_CHUNKS) return false;
    /* the same operations whatever NC: a constant only lets the compiler unroll */
    if (kv_is_f16) {
        if (head_dim == 64)
            ATTN_CALL(1, 4);
        else if (head_dim == 128)
            ATTN_CALL(1, 8);
        else
            ATTN_CALL(1, 0);
    } else {
        if (head_dim == 64)
            ATTN_CALL(0, 4);
        else if (head_dim == 128)
            ATTN_CALL(0, 8);
        else
            ATTN_CALL(0, 0);
    }
    return true;
}

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
bool kiln_attention_paged_avx512(float *out, const float *q, const void *const *k_blocks,
                                 const void *const *v_blocks, int32_t block_size,
                                 int64_t row_stride, int64_t head_off, int32_t key_begin,
                                 int32_t n_keys, int32_t head_dim, float score_div, float softcap,
                                 int kv_is_f16, float *scores) {
    return false;
}

#endif
