/* attn_turbo.c - paged attention over TurboQuant pages (attn_turbo.h). */
#include "backend/cpu/attn_turbo.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

size_t kiln_attention_turbo_scratch(int32_t n_tok, int32_t G, int32_t head_dim, int32_t max_keys) {
    const size_t rows = (size_t)n_tok * (size_t)G, w = round16(2 * (size_t)head_dim);
    /* qp and acc per row, scores per row, a transposed K chunk, a V chunk, one decoded row */
    return rows * w * 2 + rows * round16((size_t)max_keys + 16) + 16 * w * 3 + w + 16;
}

void kiln_turbo_scores16_ref(const float *Kt, int32_t wk, const float *qp, float *s16) {
    for (int l = 0; l < 16; l++) {
        float s = 0.0f;
        for (int32_t j = 0; j < wk; j++) s = fmaf(qp[j], Kt[(size_t)j * 16 + l], s);
        s16[l] = s;
    }
}

void kiln_turbo_kchunk_ref(const kiln_turbo *t, const unsigned char *const *rows, int lo, int hi,
                           float *Kt, float *tmp) {
    const int32_t d = kiln_turbo_head_dim(t), wk = kiln_turbo_work_floats(t);
    memset(Kt, 0, sizeof(float) * 16 * (size_t)wk);
    for (int l = lo; l < hi; l++) {
        kiln_turbo_decode_rotated(t, rows[l], tmp, tmp + d);
        for (int32_t j = 0; j < wk; j++) Kt[(size_t)j * 16 + l] = tmp[j];
    }
}

void kiln_turbo_vrows_ref(const kiln_turbo *t, const unsigned char *const *rows, int n, float *dst,
                          size_t stride) {
    for (int i = 0; i < n; i++)
        kiln_turbo_decode_rotated(t, rows[i], dst + (size_t)i * stride,
                                  dst + (size_t)i * stride + kiln_turbo_head_dim(t));
}

void kiln_turbo_pv16_ref(float *acc, int32_t wv, const float *Vc, size_t vstride, const float *p,
                         int lo, int hi) {
    for (int t = lo; t < hi; t++)
        for (int32_t j = 0; j < wv; j++) acc[j] = fmaf(p[t], Vc[(size_t)t * vstride + j], acc[j]);
}

/* exp(x) for x <= 0 as Cody-Waite reduction and a degree-6 Taylor polynomial in fused
 * multiply-adds (relative error ~2e-7), 0 below -87 (the AVX-512 twin computes the same ops) */
static float exp_neg(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    const float n = rintf(x * 1.44269504f);
    float r = fmaf(n, -0.693145752f, x);
    r = fmaf(n, -1.42860677e-6f, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float sc;
    memcpy(&sc, &bits, 4);
    return p * sc;
}

void kiln_turbo_softmax_ref(float *s, int32_t n) {
    float mx = s[0];
    for (int32_t t = 1; t < n; t++) mx = s[t] > mx ? s[t] : mx;
    float l[16] = {0};
    for (int32_t t = 0; t < n; t++) {
        s[t] = exp_neg(s[t] - mx);
        l[t % 16] += s[t];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) l[k] += l[k + w];
    for (int32_t t = 0; t < n; t++) s[t] = s[t] / l[0];
}

static const unsigned char *row_at(const void *const *blocks, int32_t bs, size_t row_bytes,
                                   size_t head_bytes, int32_t head, int32_t t) {
    return (const unsigned char *)blocks[t / bs] + (size_t)(t % bs) * row_bytes +
           (size_t)head * head_bytes;
}

/* Whether position t's row (K: k_fmt, V: v_fmt) is in quantizer t_'s spec (the fast decoders). */
static bool in_spec(const uint8_t *fmt, int32_t bs, int32_t t, int32_t id) {
    return !fmt || fmt[t / bs] == id;
}

/* dst[0 : work_floats(t)] = the rotated-domain row of position pos for a block whose format is
 * not t's spec: the head's exact values from its format's traits (another turbo spec: its
 * dequantized head), rotated by t's Pi, with a zero QJL part. x: head_dim floats. */
static void other_rotated(const kiln_turbo *t, const void *const *blocks, const uint8_t *fmt,
                          int32_t bs, int32_t n_head_kv, int32_t head, int32_t pos, float *dst,
                          float *x) {
    const int32_t d = kiln_turbo_head_dim(t);
    const kiln_dtype f = (kiln_dtype)fmt[pos / bs];
    const kiln_kv_geom g = {(int64_t)n_head_kv * d, n_head_kv, d};
    const char *row = (const char *)blocks[pos / bs] +
                      (size_t)(pos % bs) * kiln_kv_format_row_bytes_geom(f, &g);
    kiln_turbo_spec s;
    const kiln_turbo *o;
    memset(x, 0, sizeof(float) * (size_t)d);
    if (kiln_turbo_spec_of_dtype((int32_t)f, &s) && (o = kiln_turbo_shared(d, s)))
        kiln_turbo_dequantize(o, row + (size_t)head * kiln_turbo_head_bytes(d, s), x);
    else if (kiln_kv_format_of(f))
        kiln_kv_format_of(f)->axpy(x, 1.0f, row, (int64_t)head * d, d); /* 0 + 1 * v: exact */
    kiln_turbo_rotate(t, x, dst);
    const int32_t w = kiln_turbo_work_floats(t);
    if (w > d) memset(dst + d, 0, sizeof(float) * (size_t)(w - d));
}

void kiln_attention_turbo_path(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                               int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                               const kiln_attn_turbo_kv *kv, float score_div, float softcap,
                               float *scratch, bool simd) {
    const kiln_turbo *tk = kv->k, *tv = kv->v;
    const int32_t d = kiln_turbo_head_dim(tk), bs = kv->block_size;
    const kiln_turbo_spec sk = kiln_turbo_get_spec(tk), sv = kiln_turbo_get_spec(tv);
    const size_t hbk = kiln_turbo_head_bytes(d, sk), hbv = kiln_turbo_head_bytes(d, sv);
    const size_t rbk = hbk * (size_t)kv->n_head_kv, rbv = hbv * (size_t)kv->n_head_kv;
    const int32_t wk = kiln_turbo_work_floats(tk), wv = kiln_turbo_work_floats(tv);
    const int32_t idk = kiln_turbo_dtype_of(sk), idv = kiln_turbo_dtype_of(sv);
    const int32_t kmin = begin[0], kmax = end[n_tok - 1], base = kmin & ~15;
    const size_t rows = (size_t)n_tok * (size_t)G, w = round16(2 * (size_t)d);
    const size_t sstride = round16((size_t)(kmax - base) + 16);
    float *qp = scratch, *acc = qp + rows * w, *sc = acc + rows * w;
    float *Kt = sc + rows * sstride, *Vc = Kt + 16 * w, *tmp = Vc + 16 * w;
    void (*scores16)(const float *, int32_t, const float *, float *) =
        simd ? kiln_turbo_scores16_avx512 : kiln_turbo_scores16_ref;
    void (*pv16)(float *, int32_t, const float *, size_t, const float *, int, int) =
        simd ? kiln_turbo_pv16_avx512 : kiln_turbo_pv16_ref;
    void (*softmax)(float *, int32_t) = simd ? kiln_turbo_softmax_avx512 : kiln_turbo_softmax_ref;
    void (*kchunk)(const kiln_turbo *, const unsigned char *const *, int, int, float *, float *) =
        simd ? kiln_turbo_kchunk_avx512 : kiln_turbo_kchunk_ref;
    void (*vrows)(const kiln_turbo *, const unsigned char *const *, int, float *, size_t) =
        simd ? kiln_turbo_vrows_avx512 : kiln_turbo_vrows_ref;

    for (int32_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < G; h++) {
            kiln_turbo_prepare_query(tk, q + i * q_stride + (int64_t)h * d,
                                     qp + ((size_t)i * G + h) * w);
            memset(acc + ((size_t)i * G + h) * w, 0, sizeof(float) * (size_t)wv);
        }
    /* scores: chunks of 16 keys at absolute positions, each row decoded once into the
     * transposed chunk Kt[j][lane] and dotted with every (token, head) whose range meets it */
    for (int32_t t0 = base; t0 < kmax; t0 += 16) {
        const int lo = t0 < kmin ? kmin - t0 : 0, hi = kmax - t0 < 16 ? kmax - t0 : 16;
        const unsigned char *rw[16] = {0};
        bool fast = true;
        for (int l = lo; l < hi; l++) fast = fast && in_spec(kv->k_fmt, bs, t0 + l, idk);
        if (fast) {
            for (int l = lo; l < hi; l++)
                rw[l] = row_at(kv->k_blocks, bs, rbk, hbk, kv->head, t0 + l);
            kchunk(tk, rw, lo, hi, Kt, tmp);
        } else { /* a chunk with rows of other formats: row by row, scattered into Kt */
            memset(Kt, 0, sizeof(float) * 16 * (size_t)wk);
            for (int l = lo; l < hi; l++) {
                if (in_spec(kv->k_fmt, bs, t0 + l, idk))
                    kiln_turbo_decode_rotated(
                        tk, row_at(kv->k_blocks, bs, rbk, hbk, kv->head, t0 + l), tmp, tmp + d);
                else
                    other_rotated(tk, kv->k_blocks, kv->k_fmt, bs, kv->n_head_kv, kv->head,
                                  t0 + l, tmp, tmp + w);
                for (int32_t j = 0; j < wk; j++) Kt[(size_t)j * 16 + l] = tmp[j];
            }
        }
        for (int32_t i = 0; i < n_tok; i++) {
            if (end[i] <= t0 + lo || begin[i] >= t0 + hi) continue;
            for (int32_t h = 0; h < G; h++) {
                const size_t r = (size_t)i * G + h;
                scores16(Kt, wk, qp + r * w, sc + r * sstride + (size_t)(t0 - base));
            }
        }
    }
    for (size_t r = 0; r < rows; r++) {
        const int32_t i = (int32_t)(r / (size_t)G);
        float *s = sc + r * sstride + (begin[i] - base);
        const int64_t n = end[i] - begin[i];
        for (int64_t t = 0; t < n; t++) s[t] = s[t] / score_div;
        if (softcap > 0.0f) kiln_softcap(s, n, softcap);
        softmax(s, (int32_t)n);
    }
    /* p . v in the rotated domain: chunks of 16 decoded V rows, each (token, head) adding its
     * keys in ascending order (element-wise fused multiply-adds) */
    for (int32_t t0 = base; t0 < kmax; t0 += 16) {
        const int lo = t0 < kmin ? kmin - t0 : 0, hi = kmax - t0 < 16 ? kmax - t0 : 16;
        const unsigned char *rw[16] = {0};
        bool fast = true;
        for (int l = lo; l < hi; l++) fast = fast && in_spec(kv->v_fmt, bs, t0 + l, idv);
        if (fast) {
            for (int l = lo; l < hi; l++)
                rw[l] = row_at(kv->v_blocks, bs, rbv, hbv, kv->head, t0 + l);
            if (hi > lo) vrows(tv, rw + lo, hi - lo, Vc + (size_t)lo * w, w);
        } else {
            for (int l = lo; l < hi; l++) {
                float *dst = Vc + (size_t)l * w;
                if (in_spec(kv->v_fmt, bs, t0 + l, idv))
                    kiln_turbo_decode_rotated(
                        tv, row_at(kv->v_blocks, bs, rbv, hbv, kv->head, t0 + l), dst, dst + d);
                else
                    other_rotated(tv, kv->v_blocks, kv->v_fmt, bs, kv->n_head_kv, kv->head,
                                  t0 + l, dst, tmp);
            }
        }
        for (int32_t i = 0; i < n_tok; i++) {
            const int a = begin[i] > t0 + lo ? begin[i] - t0 : lo;
            const int b = end[i] < t0 + hi ? end[i] - t0 : hi;
            if (a >= b) continue;
            for (int32_t h = 0; h < G; h++) {
                const size_t r = (size_t)i * G + h;
                pv16(acc + r * w, wv, Vc, w, sc + r * sstride + (size_t)(t0 - base), a, b);
            }
        }
    }
    for (int32_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < G; h++)
            kiln_turbo_finish(tv, acc + ((size_t)i * G + h) * w,
                              out + i * out_stride + (int64_t)h * d);
}

void kiln_attention_turbo(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                          int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                          const kiln_attn_turbo_kv *kv, float score_div, float softcap,
                          float *scratch) {
    kiln_attention_turbo_path(out, out_stride, q, q_stride, G, n_tok, begin, end, kv, score_div,
                              softcap, scratch, kiln_simd_active() == KILN_SIMD_AVX512);
}

/* the spec of the first TurboQuant block among blocks [b0, b1] of fmt; false: none */
static bool first_turbo(const uint8_t *fmt, int32_t b0, int32_t b1, kiln_turbo_spec *s) {
    for (int32_t b = b0; b <= b1; b++)
        if (kiln_turbo_spec_of_dtype(fmt[b], s)) return true;
    return false;
}

bool kiln_attention_turbo_group(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                                int32_t G, int32_t n_tok, const int32_t *begin,
                                const int32_t *end, const struct kiln_attn_kv *kv,
                                float score_div, float softcap, float *scratch) {
    if (!kv->k_fmt || !kv->v_fmt || n_tok < 1 || !kiln_turbo_head_dim_valid(kv->head_dim))
        return false;
    int32_t b0 = begin[0];
    for (int32_t i = 0; i < n_tok; i++)
        if (begin[i] < b0) b0 = begin[i];
    b0 /= kv->block_size;
    const int32_t b1 = (end[n_tok - 1] - 1) / kv->block_size;
    kiln_turbo_spec sk = {8, false}, sv = {8, false};
    const bool tk = first_turbo(kv->k_fmt, b0, b1, &sk), tv = first_turbo(kv->v_fmt, b0, b1, &sv);
    if (!tk && !tv) return false;
    const kiln_attn_turbo_kv t = {kv->k_blocks,
                                  kv->v_blocks,
                                  kv->block_size,
                                  (int32_t)(kv->row_stride / kv->head_dim),
                                  (int32_t)(kv->head_off / kv->head_dim),
                                  kiln_turbo_shared(kv->head_dim, sk),
                                  kiln_turbo_shared(kv->head_dim, sv),
                                  kv->k_fmt,
                                  kv->v_fmt};
    if (!t.k || !t.v) return false; /* out of memory for a codebook: the reference path */
    kiln_attention_turbo(out, out_stride, q, q_stride, G, n_tok, begin, end, &t, score_div,
                         softcap, scratch);
    return true;
}
