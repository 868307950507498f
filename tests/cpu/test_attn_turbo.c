/*
 * test_attn_turbo - paged attention over TurboQuant pages (backend/cpu/attn_turbo.h):
 *  - against a reference built from the module's own reads: each key's score is
 *    kiln_turbo_dot(prepare_query(q), row) / score_div, softmax in double, output
 *    sum_t p_t * kiln_turbo_dequantize(v_t) in double (bound 2e-5 relative to max |out|);
 *  - against exact f32 attention over the unquantized rows, with a bound per config stated
 *    from its distortion (k8v8 tight, k8v3 / k4qv3 looser) -- a wrong layout, rotation or
 *    codebook gives errors of order 1;
 *  - mixed pages (the delayed transition's f16 blocks after turbo blocks, QJL on both sides):
 *    against a double reference over each row's own values (turbo: kiln_turbo_dot /
 *    kiln_turbo_dequantize; f16: the exact f16 values), within 1e-4 of max |out| (f16 rows go
 *    through a rotation in f32), and the scalar and AVX-512 paths bitwise equal;
 *  - batch invariance: every (token, head) output is bitwise the same when computed alone
 *    (n_tok = 1, G = 1), inside a tile of tokens with all G heads, with keys split in other
 *    block sizes, and with other heads' pages changed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attn_turbo.h"
#include "backend/cpu/cpu.h"
#include "kv/kv_format.h"
#include "tensor/dtype.h"
#include "test.h"

static uint64_t rs = 99;
static double urand(void) {
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((double)(rs >> 11) + 0.5) * 0x1p-53;
}
static float nrand(void) {
    return (float)(sqrt(-2.0 * log(urand())) * cos(2.0 * M_PI * urand()));
}

enum { NKV = 2, G = 4, DMAX = 64, T = 70, NTOK = 5 };
static int D = 64; /* head_dim of the current check */

typedef struct pages {
    int32_t bs, nb;
    unsigned char **kb, **vb;
} pages;

/* K/V rows x[T][NKV][D] written into pages of block size bs */
static pages make_pages(const kiln_turbo *tk, const kiln_turbo *tv, const float *k, const float *v,
                        int32_t bs) {
    pages p = {bs, (T + bs - 1) / bs, NULL, NULL};
    const size_t hk = kiln_turbo_head_bytes(D, kiln_turbo_get_spec(tk));
    const size_t hv = kiln_turbo_head_bytes(D, kiln_turbo_get_spec(tv));
    p.kb = calloc((size_t)p.nb, sizeof *p.kb);
    p.vb = calloc((size_t)p.nb, sizeof *p.vb);
    for (int32_t b = 0; b < p.nb; b++) {
        p.kb[b] = calloc((size_t)bs * NKV, hk);
        p.vb[b] = calloc((size_t)bs * NKV, hv);
    }
    for (int32_t t = 0; t < T; t++)
        for (int32_t g = 0; g < NKV; g++) {
            kiln_turbo_quantize(tk, k + ((size_t)t * NKV + g) * D,
                                p.kb[t / bs] + ((size_t)(t % bs) * NKV + g) * hk);
            kiln_turbo_quantize(tv, v + ((size_t)t * NKV + g) * D,
                                p.vb[t / bs] + ((size_t)(t % bs) * NKV + g) * hv);
        }
    return p;
}

static void free_pages(pages *p) {
    for (int32_t b = 0; b < p->nb; b++) {
        free(p->kb[b]);
        free(p->vb[b]);
    }
    free(p->kb);
    free(p->vb);
}

static int g_path = 0; /* 0: the active path, 1: scalar, 2: AVX-512 */

static void run(const kiln_turbo *tk, const kiln_turbo *tv, const pages *p, int g, int ntok, int gh,
                const int32_t *begin, const int32_t *end, const float *q, int64_t qs, float *out,
                int64_t os, float softcap) {
    const kiln_attn_turbo_kv kv = {
        (const void *const *)p->kb, (const void *const *)p->vb, p->bs, NKV, g, tk, tv, NULL, NULL};
    float *scr =
        aligned_alloc(64, kiln_attention_turbo_scratch(ntok, gh, D, T) * sizeof(float) + 64);
    if (g_path == 0)
        kiln_attention_turbo(out, os, q, qs, gh, ntok, begin, end, &kv, sqrtf((float)D), softcap,
                             scr);
    else
        kiln_attention_turbo_path(out, os, q, qs, gh, ntok, begin, end, &kv, sqrtf((float)D),
                                  softcap, scr, g_path == 2);
    free(scr);
}

static void check_config(int kb, bool kq, int vb, bool vq, double exact_tol, float softcap) {
    const kiln_turbo_spec sk = {kb, kq}, sv = {vb, vq};
    const kiln_turbo *tk = kiln_turbo_shared(D, sk), *tv = kiln_turbo_shared(D, sv);
    REQUIRE(tk && tv);
    static float k[T * NKV * DMAX], v[T * NKV * DMAX], q[NTOK * NKV * G * DMAX];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = nrand() * 1.5f + 0.3f;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = nrand();
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = nrand();
    const int64_t qs = NKV * G * D; /* q row of one token: all heads */
    int32_t begin[NTOK], end[NTOK];
    for (int i = 0; i < NTOK; i++) { /* consecutive positions T-NTOK .. T-1, a window of 40 */
        end[i] = T - NTOK + i + 1;
        begin[i] = i < 2 ? 0 : end[i] - 40 > 0 ? end[i] - 40 : 0;
    }
    pages p16 = make_pages(tk, tv, k, v, 16);
    static float out[NTOK * NKV * G * DMAX], alone[DMAX];
    for (int g = 0; g < NKV; g++)
        run(tk, tv, &p16, g, NTOK, G, begin, end, q + g * G * D, qs, out + g * G * D, qs, softcap);
    /* reference from the module's reads, and exact attention */
    double worst_ref = 0, worst_exact = 0, mag = 0, e2 = 0, x2 = 0;
    for (int i = 0; i < NTOK; i++)
        for (int g = 0; g < NKV; g++)
            for (int h = 0; h < G; h++) {
                const float *qq = q + (size_t)i * qs + (g * G + h) * D;
                const float *o = out + (size_t)i * qs + (g * G + h) * D;
                float qp[2 * DMAX], xr[DMAX];
                double s[T], se[T], mx = -1e300, mxe = -1e300;
                kiln_turbo_prepare_query(tk, qq, qp);
                for (int t = begin[i]; t < end[i]; t++) {
                    const unsigned char *row = p16.kb[t / 16] + ((size_t)(t % 16) * NKV + g) *
                                                                    kiln_turbo_head_bytes(D, sk);
                    s[t] = kiln_turbo_dot(tk, qp, row) / sqrt((double)D);
                    double e = 0;
                    for (int j = 0; j < D; j++)
                        e += (double)qq[j] * k[((size_t)t * NKV + g) * D + j];
                    se[t] = e / sqrt((double)D);
                    if (softcap > 0) {
                        s[t] = softcap * tanh(s[t] / softcap);
                        se[t] = softcap * tanh(se[t] / softcap);
                    }
                    if (s[t] > mx) mx = s[t];
                    if (se[t] > mxe) mxe = se[t];
                }
                double z = 0, ze = 0, ref[DMAX] = {0}, ex[DMAX] = {0};
                for (int t = begin[i]; t < end[i]; t++) {
                    z += exp(s[t] - mx);
                    ze += exp(se[t] - mxe);
                }
                for (int t = begin[i]; t < end[i]; t++) {
                    const unsigned char *row = p16.vb[t / 16] + ((size_t)(t % 16) * NKV + g) *
                                                                    kiln_turbo_head_bytes(D, sv);
                    kiln_turbo_dequantize(tv, row, xr);
                    const double pt = exp(s[t] - mx) / z, pe = exp(se[t] - mxe) / ze;
                    for (int j = 0; j < D; j++) {
                        ref[j] += pt * xr[j];
                        ex[j] += pe * v[((size_t)t * NKV + g) * D + j];
                    }
                }
                for (int j = 0; j < D; j++) {
                    if (fabs(ref[j] - o[j]) > worst_ref) worst_ref = fabs(ref[j] - o[j]);
                    if (fabs(ex[j] - o[j]) > worst_exact) worst_exact = fabs(ex[j] - o[j]);
                    if (fabs(ex[j]) > mag) mag = fabs(ex[j]);
                    e2 += (ex[j] - o[j]) * (ex[j] - o[j]);
                    x2 += ex[j] * ex[j];
                }
                /* alone: one token, one head */
                run(tk, tv, &p16, g, 1, 1, &begin[i], &end[i], qq, qs, alone, D, softcap);
                CHECKF(memcmp(alone, o, sizeof(float) * (size_t)D) == 0,
                       "k%d%sv%d%s token %d head %d,%d: alone differs from the group", kb,
                       kq ? "q" : "", vb, vq ? "q" : "", i, g, h);
            }
    CHECKF(worst_ref <= 2e-5 * mag, "k%d%sv%d%s: vs module reference %.3g (max |out| %.3g)", kb,
           kq ? "q" : "", vb, vq ? "q" : "", worst_ref, mag);
    const double rel = sqrt(e2 / x2);
    CHECKF(rel <= exact_tol, "k%d%sv%d%s: vs exact attention: relative rms error %.3g > %.3g", kb,
           kq ? "q" : "", vb, vq ? "q" : "", rel, exact_tol);
    printf("d=%d k%d%sv%d%s softcap %g: vs module reference %.2e; vs exact f32 attention: relative "
           "rms %.3f (bound %.2f), max %.3f (max |out| %.2f)\n",
           D, kb, kq ? "q" : "", vb, vq ? "q" : "", softcap, worst_ref, rel, exact_tol, worst_exact,
           mag);
    /* the scalar and AVX-512 paths: same bits */
    for (int path = 1; path <= (kiln_simd_supported(KILN_SIMD_AVX512) ? 2 : 1); path++) {
        static float o3[NTOK * NKV * G * DMAX];
        g_path = path;
        for (int g = 0; g < NKV; g++)
            run(tk, tv, &p16, g, NTOK, G, begin, end, q + g * G * D, qs, o3 + g * G * D, qs,
                softcap);
        g_path = 0;
        CHECKF(memcmp(o3, out, sizeof(float) * (size_t)(NTOK * NKV * G * D)) == 0,
               "k%dv%d: the %s path differs", kb, vb, path == 1 ? "scalar" : "AVX-512");
    }
    /* other block sizes and another head's pages changed: same bits */
    const int32_t sizes[] = {1, 7, 32};
    for (size_t si = 0; si < 3; si++) {
        if (si == 2) /* scribble over head 1's rows: head 0 must not see it */
            for (int t = 0; t < T; t++)
                for (int j = 0; j < D; j++) k[((size_t)t * NKV + 1) * D + j] = nrand();
        pages pb = make_pages(tk, tv, k, v, sizes[si]);
        static float o2[NTOK * NKV * G * DMAX];
        run(tk, tv, &pb, 0, NTOK, G, begin, end, q, qs, o2, qs, softcap);
        bool same = true;
        for (int i = 0; i < NTOK; i++)
            same &= memcmp(o2 + (size_t)i * qs, out + (size_t)i * qs, sizeof(float) * G * D) == 0;
        CHECKF(same, "k%dv%d: block size %d changes the bits", kb, vb, (int)sizes[si]);
        free_pages(&pb);
    }
    free_pages(&p16);
}

/* Mixed pages: blocks 0..2 TurboQuant (K spec sk, V spec sv), blocks 3.. f16 rows of NKV heads
 * (per-block formats in kiln_attn_turbo_kv.k_fmt / v_fmt). */
static void check_mixed(kiln_turbo_spec sk, kiln_turbo_spec sv) {
    D = 64;
    enum { BS = 16, NB = (T + BS - 1) / BS, TURBO_BLOCKS = 3 };
    const kiln_turbo *tk = kiln_turbo_shared(D, sk), *tv = kiln_turbo_shared(D, sv);
    REQUIRE(tk && tv);
    static float k[T * NKV * DMAX], v[T * NKV * DMAX], q[NTOK * G * DMAX];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = nrand() * 1.5f + 0.3f;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = nrand();
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = nrand();
    pages p = make_pages(tk, tv, k, v, BS);
    uint8_t kf[NB], vf[NB];
    for (int b = 0; b < NB; b++) {
        kf[b] = (uint8_t)(b < TURBO_BLOCKS ? kiln_turbo_dtype_of(sk) : KILN_DTYPE_F16);
        vf[b] = (uint8_t)(b < TURBO_BLOCKS ? kiln_turbo_dtype_of(sv) : KILN_DTYPE_F16);
        if (b < TURBO_BLOCKS) continue;
        free(p.kb[b]);
        free(p.vb[b]);
        p.kb[b] = calloc((size_t)BS * NKV * D, 2);
        p.vb[b] = calloc((size_t)BS * NKV * D, 2);
        for (int r = 0; r < BS && b * BS + r < T; r++)
            for (int e = 0; e < NKV * D; e++) {
                const size_t src = (size_t)(b * BS + r) * NKV * D + e;
                ((uint16_t *)p.kb[b])[(size_t)r * NKV * D + e] = kiln_fp32_to_fp16(k[src]);
                ((uint16_t *)p.vb[b])[(size_t)r * NKV * D + e] = kiln_fp32_to_fp16(v[src]);
            }
    }
    const int g = 1;
    const kiln_attn_turbo_kv kv = {(const void *const *)p.kb, (const void *const *)p.vb, BS, NKV,
                                   g, tk, tv, kf, vf};
    int32_t begin[NTOK], end[NTOK];
    for (int i = 0; i < NTOK; i++) {
        end[i] = T - NTOK + i + 1;
        begin[i] = i == 0 ? 0 : 20 + i; /* one token whose keys are all f16: begin 52.. */
    }
    begin[NTOK - 1] = 3 * BS + 2;
    static float out[2][NTOK * G * DMAX];
    const int npath = kiln_simd_supported(KILN_SIMD_AVX512) ? 2 : 1;
    for (int path = 0; path < npath; path++) {
        float *scr = aligned_alloc(64, kiln_attention_turbo_scratch(NTOK, G, D, T) * sizeof(float) + 64);
        REQUIRE(scr);
        kiln_attention_turbo_path(out[path], G * D, q, G * D, G, NTOK, begin, end, &kv,
                                  sqrtf((float)D), 0.0f, scr, path == 1);
        free(scr);
    }
    if (npath == 2)
        CHECKF(memcmp(out[0], out[1], sizeof out[0]) == 0, "mixed pages: the AVX-512 path differs");
    double worst = 0, mag = 0;
    const size_t hk = kiln_turbo_head_bytes(D, sk), hv = kiln_turbo_head_bytes(D, sv);
    for (int i = 0; i < NTOK; i++)
        for (int h = 0; h < G; h++) {
            const float *qq = q + ((size_t)i * G + h) * D;
            float qp[2 * DMAX], xr[DMAX];
            double s[T], mx = -1e300, z = 0, ref[DMAX] = {0};
            kiln_turbo_prepare_query(tk, qq, qp);
            for (int t = begin[i]; t < end[i]; t++) {
                if (t / BS < TURBO_BLOCKS) {
                    s[t] = kiln_turbo_dot(tk, qp, p.kb[t / BS] + ((size_t)(t % BS) * NKV + g) * hk);
                } else {
                    double e = 0;
                    for (int j = 0; j < D; j++)
                        e += (double)qq[j] * kiln_fp16_to_fp32(kiln_fp32_to_fp16(
                                                 k[((size_t)t * NKV + g) * D + j]));
                    s[t] = e;
                }
                s[t] /= sqrt((double)D);
                if (s[t] > mx) mx = s[t];
            }
            for (int t = begin[i]; t < end[i]; t++) z += exp(s[t] - mx);
            for (int t = begin[i]; t < end[i]; t++) {
                const double w = exp(s[t] - mx) / z;
                if (t / BS < TURBO_BLOCKS)
                    kiln_turbo_dequantize(tv, p.vb[t / BS] + ((size_t)(t % BS) * NKV + g) * hv, xr);
                else
                    for (int j = 0; j < D; j++)
                        xr[j] = kiln_fp16_to_fp32(kiln_fp32_to_fp16(v[((size_t)t * NKV + g) * D + j]));
                for (int j = 0; j < D; j++) ref[j] += w * xr[j];
            }
            for (int j = 0; j < D; j++) {
                const double d = fabs(ref[j] - out[0][((size_t)i * G + h) * D + j]);
                if (d > worst) worst = d;
                if (fabs(ref[j]) > mag) mag = fabs(ref[j]);
            }
        }
    CHECKF(worst <= 1e-4 * mag, "mixed pages k%d%sv%d%s + f16: vs reference %.3g (max |out| %.3g)",
           sk.bits, sk.qjl ? "q" : "", sv.bits, sv.qjl ? "q" : "", worst, mag);
    printf("mixed pages (3 blocks k%d%sv%d%s, then f16): vs reference %.2e (max |out| %.2f)\n",
           sk.bits, sk.qjl ? "q" : "", sv.bits, sv.qjl ? "q" : "", worst, mag);
    free_pages(&p);
}

int main(void) {
    /* head sizes of the HF references (8, 16) with every codebook lookup kind: a register
     * permute (<= 4 bits), a two-register permute (5), a gather (6-8), and QJL signs */
    D = 8;
    check_config(8, true, 5, false, 0.6, 0);
    check_config(3, false, 6, true, 0.6, 0);
    D = 16;
    check_config(7, false, 2, false, 0.6, 0);
    check_config(5, true, 8, true, 0.6, 0);
    D = 64;
    check_config(8, false, 8, false, 0.02, 0);
    check_config(8, false, 3, false, 0.25, 0);
    check_config(4, false, 4, false, 0.25, 0);
    check_config(4, true, 3, false, 0.4, 0);
    check_config(4, true, 4, true, 0.6, 0);
    check_config(8, false, 3, false, 0.25, 30.0f);
    check_mixed((kiln_turbo_spec){8, false}, (kiln_turbo_spec){3, false});
    check_mixed((kiln_turbo_spec){4, true}, (kiln_turbo_spec){3, true});
    return kiln_test_finish("test_attn_turbo");
}
