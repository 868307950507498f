/* attn_turbo_avx512.c - the AVX-512 inner loops of attn_turbo.c: the same fused multiply-add
 * chains as kiln_turbo_scores16_ref / kiln_turbo_pv16_ref, 16 lanes at a time (bitwise equal). */
#include "backend/cpu/attn_turbo.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

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
