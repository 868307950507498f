/* attn_turbo_avx512.c - the AVX-512 inner loops of attn_turbo.c: row decoding (16 codes at a
 * time: a table permute or gather, times the row's norm: the same single rounding as
 * kiln_turbo_decode_rotated), the 16 x 16 transposes of a key chunk, and the same fused
 * multiply-add chains as kiln_turbo_scores16_ref / kiln_turbo_pv16_ref, 16 lanes at a time.
 * Every result is bitwise the scalar path's (tests/cpu/test_attn_turbo). */
#include "backend/cpu/attn_turbo.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

typedef struct dec16 {
    int32_t d, m, wk;
    bool qjl;
    const float *cb;
    __m512 t0, t1; /* the codebook in registers (m <= 5) */
} dec16;

static void dec16_init(dec16 *z, const kiln_turbo *t) {
    z->d = kiln_turbo_head_dim(t);
    z->m = kiln_turbo_codebook(t, &z->cb);
    z->qjl = kiln_turbo_get_spec(t).qjl;
    z->wk = kiln_turbo_work_floats(t);
    float tb[32] = {0};
    const int K = 1 << z->m;
    memcpy(tb, z->cb, sizeof(float) * (size_t)(K < 32 ? K : 32));
    z->t0 = _mm512_loadu_ps(tb);
    z->t1 = _mm512_loadu_ps(tb + 16);
}

#define KA static inline __attribute__((always_inline))

/* codes of dims 16 g .. 16 g + 15 (8 codes per M bytes); d: the head size */
KA __m512i codes16(const unsigned char *codes, int32_t g, int32_t d, const int M) {
    if (M == 8) {
        if (d - 16 * g < 16) {
            uint64_t w;
            memcpy(&w, codes + 16 * g, 8);
            return _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)w));
        }
        return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16 * g)));
    }
    const __m512i sh = _mm512_set_epi64(7 * M, 6 * M, 5 * M, 4 * M, 3 * M, 2 * M, M, 0);
    const __m512i msk = _mm512_set1_epi64((1 << M) - 1);
    /* bytes assembled in a register (a narrow memcpy into a wide load stalls forwarding) */
    const unsigned char *c0 = codes + (size_t)(2 * g) * M, *c1 = c0 + M;
    uint64_t w0 = 0, w1 = 0;
    for (int b = 0; b < M; b++) w0 |= (uint64_t)c0[b] << (8 * b);
    if (d - 16 * g > 8)
        for (int b = 0; b < M; b++) w1 |= (uint64_t)c1[b] << (8 * b);
    const __m512i v0 = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((int64_t)w0), sh), msk);
    const __m512i v1 = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((int64_t)w1), sh), msk);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(v0)),
                              _mm512_cvtepi64_epi32(v1), 1);
}

KA __m512 lookup16(__m512i idx, __m512 t0, __m512 t1, const float *cb, const int M) {
    if (M == 0) return _mm512_setzero_ps();
    if (M <= 4) return _mm512_permutexvar_ps(idx, t0);
    if (M == 5) return _mm512_permutex2var_ps(t0, idx, t1);
    return _mm512_i32gather_ps(idx, cb, 4);
}

/* dec[0 : wk] = kiln_turbo_decode_rotated's yr (then zr at dec + d); nothing else written */
KA void decode_row_m(const dec16 *z, const unsigned char *row, float *dec, const int M) {
    const int32_t d = z->d;
    const __m512 t0 = z->t0, t1 = z->t1;
    const float *cb = z->cb;
    float norm, gamma = 0;
    memcpy(&norm, row, 4);
    row += 4;
    if (z->qjl) {
        memcpy(&gamma, row, 4);
        row += 4;
    }
    const unsigned char *codes = row, *signs = row + (size_t)M * d / 8;
    const __m512 nv = _mm512_set1_ps(norm);
    const int32_t ng = (d + 15) / 16;
    for (int32_t g = 0; g < ng; g++) {
        const __mmask16 mk = d - 16 * g >= 16 ? 0xFFFF : (__mmask16)0x00FF;
        const __m512 v = _mm512_mul_ps(nv, lookup16(codes16(codes, g, d, M), t0, t1, cb, M));
        _mm512_mask_storeu_ps(dec + 16 * g, mk, v);
    }
    if (z->qjl) {
        const float p = norm * gamma;
        const __m512 pos = _mm512_set1_ps(p), neg = _mm512_set1_ps(-p);
        for (int32_t g = 0; g < ng; g++) {
            uint16_t bits = signs[2 * g];
            if (d - 16 * g > 8) bits |= (uint16_t)(signs[2 * g + 1] << 8);
            const __mmask16 mk = d - 16 * g >= 16 ? 0xFFFF : (__mmask16)0x00FF;
            _mm512_mask_storeu_ps(dec + d + 16 * g, mk, _mm512_mask_blend_ps(bits, neg, pos));
        }
    }
}

/* n rows: rows[i] decoded into dst + i * stride (a switch on the codebook bits, so each
 * width's loop has its constants) */
static void decode_rows(const dec16 *z, const unsigned char *const *rows, int n, float *dst,
                        size_t stride) {
#define DEC(M)                                                                                     \
    for (int i = 0; i < n; i++) decode_row_m(z, rows[i], dst + (size_t)i * stride, M);             \
    break
    switch (z->m) {
    case 0:
        DEC(0);
    case 1:
        DEC(1);
    case 2:
        DEC(2);
    case 3:
        DEC(3);
    case 4:
        DEC(4);
    case 5:
        DEC(5);
    case 6:
        DEC(6);
    case 7:
        DEC(7);
    default:
        DEC(8);
    }
#undef DEC
}

/* one stage of the 16 x 16 transpose: rows i and i | B exchange their off-diagonal lanes */
static inline void tstage(__m512 r[16], int B) {
    int ia[16], ib[16];
    for (int j = 0; j < 16; j++) {
        ia[j] = (j & B) ? 16 + j - B : j;
        ib[j] = (j & B) ? 16 + j : j + B;
    }
    const __m512i xa = _mm512_loadu_si512(ia), xb = _mm512_loadu_si512(ib);
    for (int i = 0; i < 16; i++) {
        if (i & B) continue;
        const __m512 a = r[i], b = r[i | B];
        r[i] = _mm512_permutex2var_ps(a, xa, b);
        r[i | B] = _mm512_permutex2var_ps(a, xb, b);
    }
}

void kiln_turbo_kchunk_avx512(const kiln_turbo *t, const unsigned char *const *rows, int lo, int hi,
                              float *Kt, float *tmp) {
    dec16 z;
    dec16_init(&z, t);
    const int32_t wk = z.wk, w = (2 * z.d + 15) & ~15;
    /* tmp: 16 decoded rows of w floats (zeros past wk and for lanes outside [lo, hi)) */
    memset(tmp, 0, sizeof(float) * 16 * (size_t)w);
    if (hi > lo) decode_rows(&z, rows + lo, hi - lo, tmp + (size_t)lo * w, (size_t)w);
    for (int32_t c = 0; c < wk; c += 16) {
        __m512 r[16];
        for (int l = 0; l < 16; l++) r[l] = _mm512_loadu_ps(tmp + (size_t)l * w + c);
        tstage(r, 8);
        tstage(r, 4);
        tstage(r, 2);
        tstage(r, 1);
        const int32_t n = wk - c < 16 ? wk - c : 16;
        for (int32_t j = 0; j < n; j++) _mm512_storeu_ps(Kt + (size_t)(c + j) * 16, r[j]);
    }
}

void kiln_turbo_vrows_avx512(const kiln_turbo *t, const unsigned char *const *rows, int n,
                             float *dst, size_t stride) {
    dec16 z;
    dec16_init(&z, t);
    decode_rows(&z, rows, n, dst, stride);
}

KA __m512 exp_neg16(__m512 x) {
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145752f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_maskz_cvtps_epi32(ok, n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}

void kiln_turbo_softmax_avx512(float *s, int32_t n) {
    const int32_t nf = n & ~15;
    const __mmask16 tm = (__mmask16)((1u << (n - nf)) - 1);
    __m512 mx = _mm512_set1_ps(s[0]);
    for (int32_t t = 0; t < nf; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
    if (tm) mx = _mm512_mask_max_ps(mx, tm, mx, _mm512_maskz_loadu_ps(tm, s + nf));
    const float m = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int32_t t = 0; t < nf; t += 16) {
        const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv));
        _mm512_storeu_ps(s + t, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (tm) {
        const __m512 e = _mm512_maskz_mov_ps(
            tm, exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + nf), mv)));
        _mm512_mask_storeu_ps(s + nf, tm, e);
        sum = _mm512_add_ps(sum, e);
    }
    float l[16];
    _mm512_storeu_ps(l, sum);
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    const __m512 z = _mm512_set1_ps(l[0]);
    for (int32_t t = 0; t < nf; t += 16)
        _mm512_storeu_ps(s + t, _mm512_div_ps(_mm512_loadu_ps(s + t), z));
    if (tm) _mm512_mask_storeu_ps(s + nf, tm, _mm512_div_ps(_mm512_maskz_loadu_ps(tm, s + nf), z));
}

void kiln_turbo_scores16_avx512(const float *Kt, int32_t wk, const float *qp, float *s16) {
    __m512 a0 = _mm512_setzero_ps();
    for (int32_t j = 0; j < wk; j++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(qp[j]), _mm512_loadu_ps(Kt + (size_t)j * 16), a0);
    _mm512_storeu_ps(s16, a0);
}

void kiln_turbo_pv16_avx512(float *acc, int32_t wv, const float *Vc, size_t vstride, const float *p,
                            int lo, int hi) {
    for (int32_t j = 0; j < wv; j += 64) {
        const int32_t n = wv - j < 64 ? wv - j : 64;
        const __mmask16 m0 = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
        const __mmask16 m1 = n >= 32 ? 0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
        const __mmask16 m2 = n >= 48 ? 0xFFFF : n > 32 ? (__mmask16)((1u << (n - 32)) - 1) : 0;
        const __mmask16 m3 = n >= 64 ? 0xFFFF : n > 48 ? (__mmask16)((1u << (n - 48)) - 1) : 0;
        __m512 a0 = _mm512_maskz_loadu_ps(m0, acc + j),
               a1 = _mm512_maskz_loadu_ps(m1, acc + j + 16);
        __m512 a2 = _mm512_maskz_loadu_ps(m2, acc + j + 32),
               a3 = _mm512_maskz_loadu_ps(m3, acc + j + 48);
        for (int t = lo; t < hi; t++) {
            const float *v = Vc + (size_t)t * vstride + j;
            const __m512 pt = _mm512_set1_ps(p[t]);
            a0 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m0, v), a0);
            a1 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m1, v + 16), a1);
            a2 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m2, v + 32), a2);
            a3 = _mm512_fmadd_ps(pt, _mm512_maskz_loadu_ps(m3, v + 48), a3);
        }
        _mm512_mask_storeu_ps(acc + j, m0, a0);
        _mm512_mask_storeu_ps(acc + j + 16, m1, a1);
        _mm512_mask_storeu_ps(acc + j + 32, m2, a2);
        _mm512_mask_storeu_ps(acc + j + 48, m3, a3);
    }
}
#endif
