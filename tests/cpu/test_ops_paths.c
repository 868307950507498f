/*
 * test_ops_paths - the SIMD row operations (ops_avx512.c) against their scalar references
 * (ops.h *_ref), and the invariances the forward pass relies on:
 *   exp: within 3 ulp of libm's expf (double-checked against exp in double) over a range;
 *   rmsnorm / swiglu: within a few ulp-scale relative errors of the reference;
 *   attention (f32 and f16 KV, head_dim 24..256, windows, softcap): within 2e-5 relative of
 *     the reference; bit-identical whatever the KV block size (the keys' split into blocks)
 *     and whatever the scratch contents; key order tree independent of key_begin's slot is
 *     checked by comparing a window [b, n) against the same keys stored from position 0.
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
            if (f16) {
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

static void test_attention(void) {
    const int hds[] = {24, 64, 80, 128, 256};
    const int nks[] = {1, 2, 15, 16, 17, 33, 100, 300};
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (size_t ki = 0; ki < sizeof nks / sizeof nks[0]; ki++)
            for (int f16 = 0; f16 < 2; f16++) {
                const int hd = hds[hi], nk = nks[ki], nkv = 2;
                const int64_t kv_dim = (int64_t)nkv * hd;
                float *K = malloc(sizeof(float) * nk * kv_dim), *V = malloc(sizeof(float) * nk * kv_dim);
                float q[256], ref[256], got[256], alt[256];
                float *scores = malloc(sizeof(float) * nk);
                uint16_t q16[256];
                for (int64_t i = 0; i < nk * kv_dim; i++) K[i] = ct_uniform() * 2, V[i] = ct_uniform();
                for (int d = 0; d < hd; d++) q[d] = ct_uniform() * 2;
                kvstore s16 = make_store(K, V, nk, kv_dim, 16, f16);
                kvstore s5 = make_store(K, V, nk, kv_dim, 5, f16);
                const int begins[] = {0, nk / 3, nk - 1};
                for (int bi = 0; bi < 3; bi++)
                    for (int sc = 0; sc < 2; sc++) {
                        const int begin = begins[bi];
                        const float cap = sc ? 5.0f : 0.0f;
                        const float div = sqrtf((float)hd);
                        kiln_attention_paged_ref(ref, q, (const void *const *)s16.kb,
                                                 (const void *const *)s16.vb, 16, kv_dim, hd,
                                                 begin, nk, hd, div, cap, f16, scores, q16);
                        REQUIRE(kiln_attention_paged_avx512(got, q, (const void *const *)s16.kb,
                                                            (const void *const *)s16.vb, 16, kv_dim,
                                                            hd, begin, nk, hd, div, cap, f16, scores));
                        for (int d = 0; d < hd; d++)
                            CHECKF(fabsf(got[d] - ref[d]) <= 2e-5f * (1.0f + fabsf(ref[d])) +
                                                                 (f16 ? 2e-3f : 0.0f),
                                   "attn hd %d nk %d f16 %d begin %d cap %g d %d: %g vs %g", hd, nk,
                                   f16, begin, cap, d, got[d], ref[d]);
                        /* another block size, dirty scratch: the same bits */
                        for (int t = 0; t < nk; t++) scores[t] = NAN;
                        REQUIRE(kiln_attention_paged_avx512(alt, q, (const void *const *)s5.kb,
                                                            (const void *const *)s5.vb, 5, kv_dim, hd,
                                                            begin, nk, hd, div, cap, f16, scores));
                        CHECKF(memcmp(alt, got, sizeof(float) * hd) == 0,
                               "attn differs with block size 5 (hd %d nk %d begin %d)", hd, nk, begin);
                        /* the window's keys stored from position 0: the same bits (the key
                         * order tree does not depend on where the range starts) */
                        if (begin > 0) {
                            kvstore sw = make_store(K + begin * kv_dim, V + begin * kv_dim,
                                                    nk - begin, kv_dim, 16, f16);
                            REQUIRE(kiln_attention_paged_avx512(
                                alt, q, (const void *const *)sw.kb, (const void *const *)sw.vb, 16,
                                kv_dim, hd, 0, nk - begin, hd, div, cap, f16, scores));
                            CHECKF(memcmp(alt, got, sizeof(float) * hd) == 0,
                                   "attn window differs from the same keys at 0 (hd %d nk %d)", hd,
                                   nk);
                            free_store(&sw);
                        }
                    }
                free_store(&s16), free_store(&s5);
                free(K), free(V), free(scores);
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
    return kiln_test_finish("test_ops_paths");
}
