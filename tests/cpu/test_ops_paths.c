/*
 * test_ops_paths - the SIMD row operations (ops_avx512.c) against their scalar references
 * (ops.h *_ref), and the invariances the forward pass relies on:
 *   exp: within 3 ulp of libm's expf (double-checked against exp in double) over a range;
 *   rmsnorm / swiglu: within a few ulp-scale relative errors of the reference;
 *   grouped attention (f32, f16 and bf16 KV, head_dim 24..256, G 1/3/8, causal and windowed,
 *     softcap): within 2e-5 relative (f16 KV: + 2e-3; bf16 KV, 8 significant bits where f16 has
 *     11: + 1.6e-2) of the scalar kiln_attention_paged;
 *     bit-identical whatever the token tiling of the calls, the KV block size and the
 *     scratch contents, and for a window starting on a 16-key boundary equal to the same keys
 *     stored from position 0.
 * Skips (77) when the CPU has no AVX-512 path.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_simd.h"
#include "cpu_test_util.h"

static double ulp_err(float got, double want) {
    if (want == 0.0) return got == 0.0f ? 0.0 : 1e9;
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, e - 24);
    if (fabs(want) < 1.17549435e-38) ulp = ldexp(1.0, -149);
    return fabs((double)got - want) / ulp;
}

static void test_exp(void) {
    enum { N = 100003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N; i++) x[i] = -100.0f + 188.0f * (float)i / N;
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1.0f, x[3] = -87.0f, x[4] = 88.0f;
    kiln_exp_avx512(y, x, N);
    double worst = 0;
    int worst_i = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        if (want < 1.17549435e-38) continue; /* denormal results: not used by softmax */
        double e = ulp_err(y[i], want);
        if (e > worst) worst = e, worst_i = i;
    }
    printf("exp: worst %.2f ulp at x = %g\n", worst, x[worst_i]);
    CHECKF(worst <= 3.0, "exp error %.2f ulp at %g", worst, x[worst_i]);
    CHECK(y[0] == 1.0f && y[1] == 1.0f);
    float sp[4] = {NAN, -INFINITY, INFINITY, -200.0f}, so[4];
    kiln_exp_avx512(so, sp, 4);
    CHECK(isnan(so[0]));
    CHECK(so[1] == 0.0f && so[3] == 0.0f);
    CHECK(isinf(so[2]) && so[2] > 0);
    free(x), free(y);
}

static void test_rmsnorm_swiglu(void) {
    const int64_t ns[] = {1, 7, 16, 17, 31, 32, 33, 64, 100, 2048, 5632};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int64_t n = ns[k];
        float *x = malloc(n * sizeof *x), *w = malloc(n * sizeof *w), *a = malloc(n * sizeof *a),
              *b = malloc(n * sizeof *b), *u = malloc(n * sizeof *u);
        for (int64_t i = 0; i < n; i++)
            x[i] = ct_uniform() * 4, w[i] = ct_uniform(), u[i] = ct_uniform() * 3;
        for (int pass = 0; pass < 2; pass++) {
            const float *ww = pass ? NULL : w;
            kiln_rmsnorm_ref(a, x, ww, n, 1e-5f);
            kiln_rmsnorm_avx512(b, x, ww, n, 1e-5f);
            for (int64_t i = 0; i < n; i++)
                CHECKF(fabsf(a[i] - b[i]) <= 1e-5f * (fabsf(a[i]) + 1e-3f), "rmsnorm n=%lld %g %g",
                       (long long)n, a[i], b[i]);
            /* in place */
            memcpy(b, x, n * sizeof *b);
            kiln_rmsnorm_avx512(b, b, ww, n, 1e-5f);
            for (int64_t i = 0; i < n; i++)
                CHECKF(fabsf(a[i] - b[i]) <= 1e-5f * (fabsf(a[i]) + 1e-3f), "rmsnorm alias");
        }
        memcpy(a, x, n * sizeof *a);
        memcpy(b, x, n * sizeof *b);
        kiln_swiglu_ref(a, u, n);
        kiln_swiglu_avx512(b, u, n);
        for (int64_t i = 0; i < n; i++)
            CHECKF(fabsf(a[i] - b[i]) <= 4e-7f * fabsf(a[i]) + 1e-30f, "swiglu n=%lld x=%g %g %g",
                   (long long)n, x[i], a[i], b[i]);
        /* elementwise: an element's value does not depend on its position in the array */
        if (n > 17) {
            memcpy(a, x + 3, (n - 3) * sizeof *a);
            kiln_swiglu_avx512(a, u + 3, n - 3);
            for (int64_t i = 0; i < n - 3; i++) CHECK(a[i] == b[i + 3]);
        }
        free(x), free(w), free(a), free(b), free(u);
    }
}

/* Store n_keys K/V rows of kv_dim elements into blocks of bs tokens; returns block arrays. */
typedef struct kvstore {
    void **kb, **vb;
    int nblk;
} kvstore;

static kvstore make_store(const float *K, const float *V, int n_keys, int64_t kv_dim, int bs,
                          int f16) {
    kvstore s;
    s.nblk = (n_keys + bs - 1) / bs;
    s.kb = calloc(s.nblk, sizeof(void *));
    s.vb = calloc(s.nblk, sizeof(void *));
    size_t esz = f16 ? 2 : 4;
    for (int b = 0; b < s.nblk; b++) {
        /* garbage-filled blocks: rows past n_keys must never be read */
        s.kb[b] = malloc((size_t)bs * kv_dim * esz);
        s.vb[b] = malloc((size_t)bs * kv_dim * esz);
        memset(s.kb[b], 0x7F, (size_t)bs * kv_dim * esz);
        memset(s.vb[b], 0x7F, (size_t)bs * kv_dim * esz);
    }
    for (int t = 0; t < n_keys; t++)
        for (int64_t e = 0; e < kv_dim; e++) {
            size_t off = (size_t)(t % bs) * kv_dim + e;
            if (f16 == 2) { /* bf16 rows */
                ((uint16_t *)s.kb[t / bs])[off] = kiln_fp32_to_bf16(K[t * kv_dim + e]);
                ((uint16_t *)s.vb[t / bs])[off] = kiln_fp32_to_bf16(V[t * kv_dim + e]);
            } else if (f16) {
                ((uint16_t *)s.kb[t / bs])[off] = kiln_fp32_to_fp16(K[t * kv_dim + e]);
                ((uint16_t *)s.vb[t / bs])[off] = kiln_fp32_to_fp16(V[t * kv_dim + e]);
            } else {
                ((float *)s.kb[t / bs])[off] = K[t * kv_dim + e];
                ((float *)s.vb[t / bs])[off] = V[t * kv_dim + e];
            }
        }
    return s;
}

static void free_store(kvstore *s) {
    for (int b = 0; b < s->nblk; b++) free(s->kb[b]), free(s->vb[b]);
    free(s->kb), free(s->vb);
}

/* One (token, head) by the scalar reference. */
static void ref_one(float *out, const float *q, const kvstore *st, int bs, int64_t kv_dim, int hd,
                    int64_t head_off, int begin, int end, float div, float cap, int f16) {
    float *scores = malloc(sizeof(float) * (size_t)end);
    float q16[512];
    kiln_attention_paged(out, q, (const void *const *)st->kb, (const void *const *)st->vb, bs,
                         kv_dim, head_off, begin, end, hd, div, cap, f16, scores, q16);
    free(scores);
}

static float *scratch_for(int n_tok, int G, int hd, int max_keys) {
    size_t n = kiln_attention_group_scratch(n_tok, G, hd, max_keys);
    float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
    REQUIRE(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN; /* dirty: results must not depend on it */
    return p;
}

static void test_attention(void) {
    const int hds[] = {24, 64, 80, 128, 256};
    const int nks[] = {1, 2, 15, 16, 17, 33, 100, 300};
    const int Gs[] = {1, 3, 8};
    int n_cases = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (size_t ki = 0; ki < sizeof nks / sizeof nks[0]; ki++)
            for (int f16 = 0; f16 < 3; f16++) { /* the operand: 0 f32, 1 f16, 2 bf16 rows */
                const int hd = hds[hi], nk = nks[ki], nkv = 2, G = Gs[(hi + ki) % 3];
                const int64_t kv_dim = (int64_t)nkv * hd, q_stride = (int64_t)nkv * G * hd;
                float *K = malloc(sizeof(float) * nk * kv_dim),
                      *V = malloc(sizeof(float) * nk * kv_dim);
                float *Q = malloc(sizeof(float) * nk * q_stride);
                float *got = malloc(sizeof(float) * nk * q_stride);
                float *alt = malloc(sizeof(float) * nk * q_stride);
                float ref[512];
                for (int64_t i = 0; i < nk * kv_dim; i++)
                    K[i] = ct_uniform() * 2, V[i] = ct_uniform();
                for (int64_t i = 0; i < nk * q_stride; i++) Q[i] = ct_uniform() * 2;
                kvstore s16 = make_store(K, V, nk, kv_dim, 16, f16);
                kvstore s5 = make_store(K, V, nk, kv_dim, 5, f16);
                const float div = sqrtf((float)hd);
                for (int win = 0; win < 2; win++)
                    for (int sc = 0; sc < 2; sc++) {
                        /* every position 0..nk-1 as a query token of KV head 1 (causal; win:
                         * a sliding window of nk / 3 + 1 keys) */
                        const float cap = sc ? 5.0f : 0.0f;
                        const int W = win ? nk / 3 + 1 : 0;
                        int32_t *begin = malloc(sizeof(int32_t) * nk),
                                *end = malloc(sizeof(int32_t) * nk);
                        for (int i = 0; i < nk; i++) {
                            begin[i] = W && i - W + 1 > 0 ? i - W + 1 : 0;
                            end[i] = i + 1;
                        }
                        kiln_attn_kv kv = {(const void *const *)s16.kb,
                                           (const void *const *)s16.vb,
                                           16,
                                           kv_dim,
                                           hd,
                                           hd,
                                           f16,
                                           NULL,
                                           NULL};
                        /* all tokens in one call */
                        float *scr = scratch_for(nk, G, hd, nk);
                        kiln_attention_group(got, q_stride, Q + hd * G, q_stride, G, nk, begin, end,
                                             &kv, div, cap, scr);
                        free(scr);
                        for (int i = 0; i < nk; i++)
                            for (int h = 0; h < G; h++) {
                                ref_one(ref, Q + i * q_stride + (int64_t)(G + h) * hd, &s16, 16,
                                        kv_dim, hd, hd, begin[i], end[i], div, cap, f16);
                                const float *g = got + i * q_stride + (int64_t)h * hd;
                                for (int d = 0; d < hd; d++)
                                    CHECKF(
                                        fabsf(g[d] - ref[d]) <=
                                            2e-5f * (1.0f + fabsf(ref[d])) + (f16 == 2 ? 1.6e-2f
                                                                              : f16    ? 2e-3f
                                                                                       : 0.0f),
                                        "attn hd %d nk %d G %d f16 %d win %d cap %g tok %d head %d "
                                        "d %d: %g vs %g",
                                        hd, nk, G, f16, W, cap, i, h, d, g[d], ref[d]);
                            }
                        /* one token at a time, uneven tiles, and block size 5: the same bits */
                        kiln_attn_kv kv5 = kv;
                        kv5.k_blocks = (const void *const *)s5.kb;
                        kv5.v_blocks = (const void *const *)s5.vb;
                        kv5.block_size = 5;
                        for (int i0 = 0; i0 < nk;) {
                            int nt = 1 + (i0 * 7 + 3) % 5;
                            if (nt > nk - i0) nt = nk - i0;
                            float *scr2 = scratch_for(nt, G, hd, end[i0 + nt - 1]);
                            kiln_attention_group(
                                alt + i0 * q_stride, q_stride, Q + i0 * q_stride + hd * G, q_stride,
                                G, nt, begin + i0, end + i0, (i0 & 1) ? &kv5 : &kv, div, cap, scr2);
                            free(scr2);
                            i0 += nt;
                        }
                        int bad = 0;
                        for (int i = 0; i < nk; i++)
                            bad += memcmp(alt + i * q_stride, got + i * q_stride,
                                          sizeof(float) * (size_t)G * hd) != 0;
                        CHECKF(bad == 0,
                               "attn tiling changed the bits (hd %d nk %d G %d f16 %d win %d)", hd,
                               nk, G, f16, W);
                        /* a window's keys stored from position 0: the same bits (the order does
                         * not depend on where the range starts within a chunk of 16) */
                        if (W) {
                            const int i = nk - 1, b = begin[i];
                            kvstore sw =
                                make_store(K + b * kv_dim, V + b * kv_dim, nk - b, kv_dim, 16, f16);
                            kiln_attn_kv kvw = {(const void *const *)sw.kb,
                                                (const void *const *)sw.vb,
                                                16,
                                                kv_dim,
                                                hd,
                                                hd,
                                                f16,
                                                NULL,
                                                NULL};
                            int32_t b0 = 0, e0 = nk - b;
                            float *scr3 = scratch_for(1, G, hd, e0);
                            kiln_attention_group(alt, q_stride, Q + i * q_stride + hd * G, q_stride,
                                                 G, 1, &b0, &e0, &kvw, div, cap, scr3);
                            free(scr3);
                            /* the softmax sum's lanes are t % 16: the same lanes only when the
                             * shift is a multiple of 16 */
                            if (b % 16 == 0)
                                CHECKF(memcmp(alt, got + i * q_stride,
                                              sizeof(float) * (size_t)G * hd) == 0,
                                       "attn window at a chunk boundary differs (hd %d nk %d)", hd,
                                       nk);
                            free_store(&sw);
                        }
                        free(begin), free(end);
                        n_cases++;
                    }
                free_store(&s16), free_store(&s5);
                free(K), free(V), free(Q), free(got), free(alt);
            }
    printf("attention: %d cases\n", n_cases);
}

/* The operand rounding of f16 / bf16 rows, seen directly: with two keys whose values are
 * v0 = 1 and v1 = 0, out[d] = P0 * 1 + P1 * 0 = P0 as the pipeline rounded it, so out must be
 * exactly representable in the rows' precision (a kernel that skips rounding P gives an f32
 * value with more significant bits); the scores go through q . k with q rounded too, checked
 * by a q with more bits than the format keeps. Both paths: the scalar reference and the
 * AVX-512 group kernel. */
static void test_operand_rounding(void) {
    const int hd = 64, bs = 16;
    float K[2 * 64], V[2 * 64], Q[64];
    for (int d = 0; d < hd; d++) {
        K[d] = d == 0 ? 1.0f : 0.0f, K[hd + d] = d == 1 ? 1.0f : 0.0f;
        V[d] = 1.0f, V[hd + d] = 0.0f;
        Q[d] = d < 2 ? (d == 0 ? 1.2345679f : -0.7654321f) : 0.0f;
    }
    for (int op = 1; op <= 2; op++) {
        kvstore s = make_store(K, V, 2, hd, bs, op);
        float ref[64], got[64];
        ref_one(ref, Q, &s, bs, hd, hd, 0, 0, 2, 1.0f, 0.0f, op);
        kiln_attn_kv kv = {(const void *const *)s.kb, (const void *const *)s.vb, bs, hd, 0, hd, op, NULL, NULL};
        int32_t b0 = 0, e0 = 2;
        float *scr = scratch_for(1, 1, hd, 2);
        kiln_attention_group(got, hd, Q, hd, 1, 1, &b0, &e0, &kv, 1.0f, 0.0f, scr);
        free(scr);
        for (int d = 0; d < hd; d++) {
            const float r16 = op == 1 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(ref[d]))
                                      : kiln_bf16_to_fp32(kiln_fp32_to_bf16(ref[d]));
            const float g16 = op == 1 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(got[d]))
                                      : kiln_bf16_to_fp32(kiln_fp32_to_bf16(got[d]));
            CHECKF(r16 == ref[d], "reference op %d: P not rounded (%.9g)", op, ref[d]);
            CHECKF(g16 == got[d], "avx512 op %d: P not rounded (%.9g)", op, got[d]);
        }
        /* the score difference q0 - q1 with q rounded: P0 = sigmoid(round(q0) - round(q1)) */
        const float q0 = op == 1 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(Q[0]))
                                 : kiln_bf16_to_fp32(kiln_fp32_to_bf16(Q[0]));
        const float q1 = op == 1 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(Q[1]))
                                 : kiln_bf16_to_fp32(kiln_fp32_to_bf16(Q[1]));
        const double p0 = 1.0 / (1.0 + exp((double)q1 - (double)q0));
        CHECKF(fabs(ref[0] - p0) <= (op == 1 ? 1e-3 : 4e-3), "op %d: %.9g vs %.9g", op, ref[0], p0);
        free_store(&s);
    }
}

int main(void) {
    if (!kiln_simd_supported(KILN_SIMD_AVX512)) {
        printf("no AVX-512 path on this CPU: skipped\n");
        return 77;
    }
    test_exp();
    test_rmsnorm_swiglu();
    test_attention();
    test_operand_rounding();
    return kiln_test_finish("test_ops_paths");
}
