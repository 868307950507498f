/* attn_turbo.c - paged attention over TurboQuant pages (attn_turbo.h). */
#include "backend/cpu/attn_turbo.h"

#include <string.h>

#include "backend/cpu/ops.h"

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

size_t kiln_attention_turbo_scratch(int32_t n_tok, int32_t G, int32_t head_dim, int32_t max_keys) {
    const size_t rows = (size_t)n_tok * (size_t)G;
    return rows * round16(2 * (size_t)head_dim) * 2 + rows * round16((size_t)max_keys) +
           round16(2 * (size_t)head_dim) + 16;
}

static const unsigned char *row_at(const void *const *blocks, int32_t bs, size_t row_bytes,
                                   size_t head_bytes, int32_t head, int32_t t) {
    return (const unsigned char *)blocks[t / bs] + (size_t)(t % bs) * row_bytes +
           (size_t)head * head_bytes;
}

void kiln_attention_turbo(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                          int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                          const kiln_attn_turbo_kv *kv, float score_div, float softcap,
                          float *scratch) {
    const kiln_turbo *tk = kv->k, *tv = kv->v;
    const int32_t d = kiln_turbo_head_dim(tk), bs = kv->block_size;
    const kiln_turbo_spec sk = kiln_turbo_get_spec(tk), sv = kiln_turbo_get_spec(tv);
    const size_t hbk = kiln_turbo_head_bytes(d, sk), hbv = kiln_turbo_head_bytes(d, sv);
    const size_t rbk = hbk * (size_t)kv->n_head_kv, rbv = hbv * (size_t)kv->n_head_kv;
    const int32_t wk = kiln_turbo_work_floats(tk), wv = kiln_turbo_work_floats(tv);
    const int32_t kmin = begin[0], kmax = end[n_tok - 1];
    const size_t rows = (size_t)n_tok * (size_t)G, wstride = round16(2 * (size_t)d);
    const size_t sstride = round16((size_t)(kmax - kmin));
    float *qp = scratch, *acc = qp + rows * wstride, *sc = acc + rows * wstride;
    float *dec = sc + rows * sstride; /* [2d]: yr then zr of the row being read */

    for (int32_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < G; h++)
            kiln_turbo_prepare_query(tk, q + i * q_stride + (int64_t)h * d,
                                     qp + ((size_t)i * G + h) * wstride);
    /* scores: each key row decoded once, dotted with every (token, head) that sees it */
    for (int32_t t = kmin; t < kmax; t++) {
        kiln_turbo_decode_rotated(tk, row_at(kv->k_blocks, bs, rbk, hbk, kv->head, t), dec,
                                  dec + d);
        for (int32_t i = 0; i < n_tok; i++) {
            if (t < begin[i] || t >= end[i]) continue;
            for (int32_t h = 0; h < G; h++) {
                const float *qq = qp + ((size_t)i * G + h) * wstride;
                float s = kiln_turbo_dot_f32(dec, qq, d);
                if (wk > d) s += kiln_turbo_dot_f32(dec + d, qq + d, d);
                sc[((size_t)i * G + h) * sstride + (size_t)(t - kmin)] = s / score_div;
            }
        }
    }
    for (size_t r = 0; r < rows; r++) {
        const int32_t i = (int32_t)(r / (size_t)G);
        float *s = sc + r * sstride + (begin[i] - kmin);
        const int64_t n = end[i] - begin[i];
        if (softcap > 0.0f) kiln_softcap(s, n, softcap);
        kiln_softmax(s, n);
        memset(acc + r * wstride, 0, sizeof(float) * (size_t)wv);
    }
    /* p . v in the rotated domain, ascending t per (token, head) */
    for (int32_t t = kmin; t < kmax; t++) {
        kiln_turbo_decode_rotated(tv, row_at(kv->v_blocks, bs, rbv, hbv, kv->head, t), dec,
                                  dec + d);
        for (int32_t i = 0; i < n_tok; i++) {
            if (t < begin[i] || t >= end[i]) continue;
            for (int32_t h = 0; h < G; h++) {
                const size_t r = (size_t)i * G + h;
                const float p = sc[r * sstride + (size_t)(t - kmin)];
                float *a = acc + r * wstride;
                for (int32_t j = 0; j < wv; j++) a[j] = a[j] + p * dec[j];
            }
        }
    }
    for (int32_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < G; h++)
            kiln_turbo_finish(tv, acc + ((size_t)i * G + h) * wstride,
                              out + i * out_stride + (int64_t)h * d);
}
