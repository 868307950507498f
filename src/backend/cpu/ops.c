#include "backend/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops_simd.h"
#include "kv/kv_format.h"
#include "tensor/dtype.h"

static bool use_avx512(void) {
    return kiln_simd_active() == KILN_SIMD_AVX512;
}

static bool use_avx2(void) {
    return kiln_simd_active() == KILN_SIMD_AVX2;
}

void kiln_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    if (use_avx512()) {
        kiln_rmsnorm_avx512(out, x, w, n, eps);
        return;
    }
    kiln_rmsnorm_ref(out, x, w, n, eps);
}

void kiln_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    ss /= (float)n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    if (w) {
        for (int64_t i = 0; i < n; i++) out[i] = w[i] * (ss * x[i]);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = ss * x[i];
    }
}

void kiln_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n,
                    float eps) {
    float mean = 0.0f;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    float var = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = x[i] - mean;
        var += d * d;
    }
    var /= (float)n;
    const float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < n; i++) {
        float y = (x[i] - mean) * rstd * w[i];
        out[i] = b ? y + b[i] : y;
    }
}

void kiln_l2norm(float *x, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void kiln_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t rot_dim, int32_t pos,
               const float *inv_freq, int adjacent_pairs) {
    const int32_t half = rot_dim / 2;
    for (int32_t j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + (int64_t)h * head_dim;
            int32_t a = adjacent_pairs ? 2 * j : j;
            int32_t b = adjacent_pairs ? 2 * j + 1 : j + half;
            float v0 = v[a], v1 = v[b];
            v[a] = v0 * c - v1 * s;
            v[b] = v0 * s + v1 * c;
        }
    }
}

float kiln_act_value(float v, int act) {
    switch (act) {
    case KILN_OP_ACT_GELU_TANH: {
        const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
        return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    case KILN_OP_ACT_GELU_ERF:
        return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    default:
        return v * (1.0f / (1.0f + expf(-v)));
    }
}

void kiln_act_apply(float *x, int64_t n, int act) {
    for (int64_t i = 0; i < n; i++) x[i] = kiln_act_value(x[i], act);
}

void kiln_glu(float *g, const float *u, int64_t n, int act) {
    if (act == KILN_OP_ACT_SILU) {
        kiln_swiglu(g, u, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) g[i] = kiln_act_value(g[i], act) * u[i];
}

void kiln_swiglu(float *g, const float *u, int64_t n) {
    if (use_avx512()) {
        kiln_swiglu_avx512(g, u, n);
        return;
    }
    kiln_swiglu_ref(g, u, n);
}

void kiln_swiglu_ref(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = g[i];
        v *= 1.0f / (1.0f + expf(-v));
        g[i] = v * u[i];
    }
}

void kiln_softmax(float *x, int64_t n) {
    float mx = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

void kiln_softcap(float *x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

/* one element of a row of the given operand kind (kv/kv_format.h kiln_kv_operand values) */
static inline float kv_elem(const void *row, int32_t d, const int operand) {
    if (operand == 1) return kiln_fp16_to_fp32(((const uint16_t *)row)[d]);
    if (operand == 2) return kiln_bf16_to_fp32(((const uint16_t *)row)[d]);
    return ((const float *)row)[d];
}

/* v rounded to the operand's precision (f16, bf16: round to nearest even; f32: v) */
static inline float kv_round(float v, const int operand) {
    if (operand == 1) return kiln_fp16_to_fp32(kiln_fp32_to_fp16(v));
    if (operand == 2) return kiln_bf16_to_fp32(kiln_fp32_to_bf16(v));
    return v;
}

static inline const void *kv_row_ref(const void *const *blocks, int32_t block_size,
                                     int64_t row_stride, int64_t head_off, int32_t t, size_t esz) {
    return (const char *)blocks[t / block_size] +
           (size_t)(head_off + (int64_t)(t % block_size) * row_stride) * esz;
}

/* the reference body for one operand kind (a constant, so each kind gets its own loops) */
static inline void attention_ref(float *out, const float *q, const void *const *k_blocks,
                                 const void *const *v_blocks, int32_t block_size,
                                 int64_t row_stride, int64_t head_off, int32_t key_begin,
                                 int32_t n_keys, int32_t head_dim, float score_div, float softcap,
                                 const int operand, float *scores, float *qr) {
    const int32_t n = n_keys - key_begin;
    const size_t esz = operand ? 2 : 4;
    for (int32_t d = 0; d < head_dim; d++) qr[d] = kv_round(q[d], operand);
    for (int32_t t = key_begin; t < n_keys; t++) {
        const void *kt = kv_row_ref(k_blocks, block_size, row_stride, head_off, t, esz);
        float s = 0.0f;
        for (int32_t d = 0; d < head_dim; d++) s += qr[d] * kv_elem(kt, d, operand);
        scores[t - key_begin] = s / score_div;
    }
    if (softcap > 0.0f) kiln_softcap(scores, n, softcap);
    kiln_softmax(scores, n);
    memset(out, 0, (size_t)head_dim * sizeof *out);
    for (int32_t t = key_begin; t < n_keys; t++) {
        const void *vt = kv_row_ref(v_blocks, block_size, row_stride, head_off, t, esz);
        const float a = kv_round(scores[t - key_begin], operand);
        for (int32_t d = 0; d < head_dim; d++) out[d] += a * kv_elem(vt, d, operand);
    }
}

void kiln_attention_paged(float *out, const float *q, const void *const *k_blocks,
                          const void *const *v_blocks, int32_t block_size, int64_t row_stride,
                          int64_t head_off, int32_t key_begin, int32_t n_keys, int32_t head_dim,
                          float score_div, float softcap, int operand, float *scores,
                          float *q_round) {
#define KILN_ATT_REF(OP)                                                                           \
    attention_ref(out, q, k_blocks, v_blocks, block_size, row_stride, head_off, key_begin, n_keys, \
                  head_dim, score_div, softcap, OP, scores, q_round)
    if (operand == 1)
        KILN_ATT_REF(1);
    else if (operand == 2)
        KILN_ATT_REF(2);
    else
        KILN_ATT_REF(0);
#undef KILN_ATT_REF
}

void kiln_attention_paged_kv(float *out, const float *q, const kiln_attn_kv *kv, int32_t key_begin,
                             int32_t n_keys, float score_div, float softcap, float *scores,
                             float *q_round) {
    if (!kv->k_fmt) {
        kiln_attention_paged(out, q, kv->k_blocks, kv->v_blocks, kv->block_size, kv->row_stride,
                             kv->head_off, key_begin, n_keys, kv->head_dim, score_div, softcap,
                             kv->operand, scores, q_round);
        return;
    }
    const int32_t n = n_keys - key_begin, bs = kv->block_size, hd = kv->head_dim;
    const kiln_kv_format_traits *fk = kiln_kv_format_of(kv->k_fmt[key_begin / bs]);
    const kiln_kv_format_traits *fv = kiln_kv_format_of(kv->v_fmt[key_begin / bs]);
    if (fk->prep_q)
        fk->prep_q(q_round, q, hd);
    else
        for (int32_t d = 0; d < hd; d++) q_round[d] = kiln_kv_operand_round(q[d], fk->operand);
    int32_t cur = -1;
    size_t rb = 0;
    for (int32_t t = key_begin; t < n_keys; t++) {
        if (t / bs != cur) {
            cur = t / bs;
            fk = kiln_kv_format_of(kv->k_fmt[cur]);
            rb = kiln_kv_format_row_bytes(fk->dtype, kv->row_stride);
        }
        const char *row = (const char *)kv->k_blocks[cur] + (size_t)(t % bs) * rb;
        scores[t - key_begin] = fk->dot(row, kv->head_off, q_round, hd) / score_div;
    }
    if (softcap > 0.0f) kiln_softcap(scores, n, softcap);
    kiln_softmax(scores, n);
    memset(out, 0, (size_t)hd * sizeof *out);
    const kiln_kv_operand pop = fv->operand;
    void (*finish)(float *, int32_t) = fv->finish_v;
    cur = -1;
    for (int32_t t = key_begin; t < n_keys; t++) {
        if (t / bs != cur) {
            cur = t / bs;
            fv = kiln_kv_format_of(kv->v_fmt[cur]);
            rb = kiln_kv_format_row_bytes(fv->dtype, kv->row_stride);
        }
        const char *row = (const char *)kv->v_blocks[cur] + (size_t)(t % bs) * rb;
        fv->axpy(out, kiln_kv_operand_round(scores[t - key_begin], pop), row, kv->head_off, hd);
    }
    if (finish) finish(out, hd);
}

/* whether every block a call reads has a format the SIMD kernels read */
static bool simd_formats(const kiln_attn_kv *kv, int32_t n_tok, const int32_t *begin,
                         const int32_t *end) {
    if (!kv->k_fmt) return true;
    int32_t b0 = begin[0];
    for (int32_t i = 0; i < n_tok; i++)
        if (begin[i] < b0) b0 = begin[i];
    const int32_t bl = (end[n_tok - 1] - 1) / kv->block_size;
    for (int32_t b = b0 / kv->block_size; b <= bl; b++) {
        const kiln_kv_format_traits *fk = kiln_kv_format_of(kv->k_fmt[b]);
        const kiln_kv_format_traits *fv = kiln_kv_format_of(kv->v_fmt[b]);
        if (!fk || !fv || !fk->simd || !fv->simd) return false;
    }
    return true;
}

size_t kiln_attention_group_scratch(int32_t n_tok, int32_t G, int32_t head_dim, int32_t max_keys) {
    size_t ref = (size_t)max_keys + (size_t)head_dim + 16; /* scores + rounded q (reference) */
    size_t v = 0;
    if (use_avx512())
        v = kiln_attention_group_scratch_avx512(n_tok, G, head_dim, max_keys);
    else if (use_avx2())
        v = kiln_attention_group_scratch_avx2(n_tok, G, head_dim, max_keys);
    return v > ref ? v : ref;
}

void kiln_attention_group(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                          int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                          const kiln_attn_kv *kv, float score_div, float softcap, float *scratch) {
    if (use_avx512() && kv->head_dim <= 512 && simd_formats(kv, n_tok, begin, end)) {
        kiln_attention_group_avx512(out, out_stride, q, q_stride, G, n_tok, begin, end, kv,
                                    score_div, softcap, scratch);
        return;
    }
    if (use_avx2() && simd_formats(kv, n_tok, begin, end)) {
        kiln_attention_group_avx2(out, out_stride, q, q_stride, G, n_tok, begin, end, kv,
                                  score_div, softcap, scratch);
        return;
    }
    int32_t max_keys = 0;
    for (int32_t i = 0; i < n_tok; i++)
        if (end[i] > max_keys) max_keys = end[i];
    float *q_round = scratch + max_keys;
    for (int32_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < G; h++)
            kiln_attention_paged_kv(out + i * out_stride + (int64_t)h * kv->head_dim,
                                    q + i * q_stride + (int64_t)h * kv->head_dim, kv, begin[i],
                                    end[i], score_div, softcap, scratch, q_round);
}
