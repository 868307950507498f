/*
 * test_q8_act - q8 activations (cpu.h "q8 activations"):
 *
 * 1. Quantizer. kiln_quantize_q8_0_act and every path's row quantizer against an
 *    independent implementation written here from ggml's quantize_row_q8_0_ref semantics
 *    (amax, d = amax / 127 in f32, id = 1 / d, q = roundf(x * id), d stored as fp16):
 *    fp16 rounding is done here in double arithmetic, roundf by floor(|v| + 0.5) in double.
 *    Asserted bit for bit: the fp16 d, all 32 quants, the f32 scale and the stored block sum in the
 *    scratch row (read at the offsets cpu.h documents, not through kiln's reader) and zero
 *    padding. Inputs: random blocks of many magnitudes, exact halfway cases, fp16 rounding
 *    ties, fp16-subnormal and zero scales, amax < 127 * FLT_MIN, fp16 overflow, Inf, NaN.
 * 2. Dot products. The scalar q8 kernel equals the order cpu.h specifies, recomputed here
 *    (integer block sums, D = d_w * d_x, fmaf into 16 accumulators, fixed tree) bit for bit,
 *    and is within (nb / 16 + 5) * 2^-24 * sum |D isum| of the same sum in double. Every SIMD
 *    kernel (AVX2, AVX-512 VNNI, AVX-512BW; whichever this CPU has), as a one-token dot and
 *    as a tile of every token count, equals the scalar kernel BIT FOR BIT: the block sums
 *    are exact integers and the float operations are the same correctly rounded ones in the
 *    same order. The same for the short-row kernels (rows of < 16 blocks, 8 rows in lanes)
 *    with every row count 1..8. NaN activations give NaN on every path.
 * 3. Accuracy. The q8 dot against the f32-activation dot (scalar kiln_cpu_vec_dot) stays
 *    within the quantization bound derived from the stored scales:
 *      |q8 - f32| <= sum_b e_b * sum_{i in b} |w_i| + 1e-5 S + 1e-6 + float slack,
 *      e_b = d_b / 2 * (1 + 2^-14) + 127 |d_b - fp16(d_b)|  (max activation rounding error),
 *    S = sum |w_i x_i|. The worst observed fraction of the bound is printed.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "cpu_test_util.h"
#include "test.h"

/* ---------------------------------------------------------------- independent reference */

/* fp32 -> fp16 bits, round to nearest even, in double arithmetic */
static uint16_t ref_fp16(float f) {
    double v = f;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) return 0x7E00;
    v = fabs(v);
    if (v >= 65520.0) return sign | 0x7C00;
    if (v < 0x1p-14) {                    /* subnormal or zero: multiple of 2^-24 */
        double m = nearbyint(v * 0x1p24); /* default rounding mode: ties to even */
        return sign | (uint16_t)m;        /* m == 1024 is the smallest normal: bits agree */
    }
    int e;
    double fr = frexp(v, &e);          /* v = fr * 2^e, fr in [0.5, 1) */
    double m = nearbyint(fr * 2048.0); /* 11 significant bits */
    if (m == 2048.0) m = 1024.0, e++;
    if (e - 1 > 15) return sign | 0x7C00;
    return sign | (uint16_t)(((e - 1 + 15) << 10) | ((int)m - 1024));
}

static double ref_fp16_val(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? m * 0x1p-24 : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static int8_t ref_round(float v) { /* roundf, independently */
    double a = floor(fabs((double)v) + 0.5);
    return (int8_t)(v < 0 ? -a : a);
}

static void ref_quant(const float *x, kiln_block_q8_0 *y) {
    float amax = 0.0f;
    int bad = 0;
    for (int j = 0; j < 32; j++) {
        if (isnan(x[j]) || isinf(x[j]))
            bad = 1;
        else if (fabsf(x[j]) > amax)
            amax = fabsf(x[j]);
    }
    memset(y->qs, 0, 32);
    if (bad) {
        y->d = 0x7E00;
        return;
    }
    float d = amax / 127.0f;
    y->d = ref_fp16(d);
    if (d < FLT_MIN) return;
    float id = 1.0f / d;
    for (int j = 0; j < 32; j++) y->qs[j] = ref_round(x[j] * id);
}

/* the layout of cpu.h, read directly */
static int8_t lay_q(const uint8_t *row, int64_t nb, int64_t b, int e, int t16) {
    int full = b < nb / 16 * 16; /* a partial last group is stored plain */
    size_t off = t16 && full
                     ? (size_t)(b / 16) * 512 + (size_t)(e / 4) * 64 + (size_t)(b % 16) * 4 + e % 4
                     : (size_t)b * 32 + (size_t)e;
    return (int8_t)row[off];
}
static float lay_d(const uint8_t *row, int64_t nbp, int64_t b) {
    float d;
    memcpy(&d, row + nbp * 32 + 4 * b, 4);
    return d;
}
static int32_t lay_s(const uint8_t *row, int64_t nbp, int64_t b) {
    int32_t s;
    memcpy(&s, row + nbp * 36 + 4 * b, 4);
    return s;
}

static int64_t nbp_of(int64_t n) {
    return (n / 32 + 15) / 16 * 16;
}

/* ---------------------------------------------------------------- 1. quantizer */

static int n_blocks_checked;

/* fill block b of x with one of several kinds of data */
static void fill_block(float *x, int kind) {
    float scale = ldexpf(1.0f, (int)(ct_u32() % 40) - 20);
    for (int j = 0; j < 32; j++) x[j] = ct_uniform() * scale;
    switch (kind) {
    case 1: /* exact halfway cases: amax 127 -> d = 1, id = 1 */
        for (int j = 0; j < 32; j++) x[j] = (float)((int)(ct_u32() % 253) - 126) + 0.5f;
        x[0] = 127.0f;
        break;
    case 2: /* amax giving an fp16 tie or near-tie for d */
        for (int j = 0; j < 32; j++) x[j] = ct_uniform() * 100.0f;
        x[3] = (1.0f + ldexpf(1.0f, -11) + ldexpf((float)(ct_u32() % 3) - 1.0f, -23)) * 127.0f;
        break;
    case 3: /* fp16-subnormal d */
        for (int j = 0; j < 32; j++) x[j] = ct_uniform() * 1e-4f;
        break;
    case 4: /* d below FLT_MIN */
        for (int j = 0; j < 32; j++) x[j] = ct_uniform() * 1e-37f;
        break;
    case 5: /* zeros, with a negative zero */
        for (int j = 0; j < 32; j++) x[j] = 0.0f;
        x[5] = -0.0f;
        break;
    case 6: /* fp16 overflow of d */
        x[7] = 1e7f;
        break;
    case 7:
        x[ct_u32() % 32] = INFINITY;
        break;
    case 8:
        x[ct_u32() % 32] = NAN;
        break;
    case 9: /* near FLT_MIN * 127 */
        for (int j = 0; j < 32; j++) x[j] = ct_uniform() * 127.0f * FLT_MIN * 1.5f;
        break;
    default:
        break;
    }
}

static void check_quantizer(void) {
    const int64_t lens[] = {32, 64, 160, 512, 544, 1024, 1056};
    for (int li = 0; li < 7; li++) {
        int64_t n = lens[li], nb = n / 32, nbp = nbp_of(n);
        float *x = malloc(sizeof(float) * (size_t)n);
        kiln_block_q8_0 *want = malloc(sizeof *want * (size_t)nb);
        kiln_block_q8_0 *got = malloc(sizeof *got * (size_t)nb);
        size_t rs = kiln_cpu_q8_row_size(n);
        CHECK(rs == (size_t)nbp * 40);
        uint8_t *row = aligned_alloc(64, rs);
        REQUIRE(x && want && got && row);
        for (int rep = 0; rep < 4; rep++) {
            for (int64_t b = 0; b < nb; b++) fill_block(x + 32 * b, (int)((b + rep) % 12));
            for (int64_t b = 0; b < nb; b++) ref_quant(x + 32 * b, &want[b]);
            kiln_quantize_q8_0_act(x, got, n);
            for (int64_t b = 0; b < nb; b++) {
                CHECKF(memcmp(&want[b], &got[b], sizeof got[b]) == 0,
                       "kiln_quantize_q8_0_act n=%lld block %lld: d %04x vs %04x, qs[0] %d vs %d",
                       (long long)n, (long long)b, got[b].d, want[b].d, got[b].qs[0],
                       want[b].qs[0]);
                n_blocks_checked++;
            }
            for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
                if (!kiln_simd_supported(p)) continue;
                int t16 = p == KILN_SIMD_AVX512;
                memset(row, 0xAB, rs); /* padding must be written */
                kiln_cpu_q8_quantize(p, n, 1, x, row);
                int bad = 0;
                for (int64_t b = 0; b < nbp; b++) {
                    int32_t s = 0;
                    int qbad = 0;
                    for (int e = 0; e < 32; e++) {
                        int8_t q = lay_q(row, nb, b, e, t16), wq = b < nb ? want[b].qs[e] : 0;
                        qbad |= q != wq;
                        s += wq;
                    }
                    float d = lay_d(row, nbp, b);
                    double wd = b < nb ? ref_fp16_val(want[b].d) : 0.0;
                    int dbad = isnan(wd) ? !isnan(d) : (double)d != wd || signbit(d) != signbit(wd);
                    int32_t ws = t16 ? -8 * s : s; /* t16 stores -8 sum (cpu.h) */
                    int sbad = lay_s(row, nbp, b) != ws;
                    if ((qbad || dbad || sbad) && bad++ < 3)
                        fprintf(stderr,
                                "%s n=%lld block %lld: quants %s, d %g vs %g, sum %d vs %d\n",
                                kiln_simd_name(p), (long long)n, (long long)b,
                                qbad ? "differ" : "ok", d, wd, lay_s(row, nbp, b), ws);
                    if (b < nb) {
                        kiln_block_q8_0 gb;
                        kiln_cpu_q8_get_block(p, n, row, b, &gb);
                        bad += memcmp(&gb, &want[b], sizeof gb) != 0;
                    }
                }
                CHECKF(bad == 0, "%s quantizer n=%lld: %d blocks differ from the reference",
                       kiln_simd_name(p), (long long)n, bad);
            }
        }
        free(x);
        free(want);
        free(got);
        free(row);
    }
    /* spot values from the semantics: 127 * (k + 0.5) / 127 rounds away from zero */
    float x[32];
    kiln_block_q8_0 b;
    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.49999997f, x[5] = 126.5f;
    kiln_quantize_q8_0_act(x, &b, 32);
    CHECK(b.d == 0x3C00); /* 1.0 */
    CHECK(b.qs[0] == 127 && b.qs[1] == 3 && b.qs[2] == -3 && b.qs[3] == 1 && b.qs[4] == 0 &&
          b.qs[5] == 127);
}

/* ---------------------------------------------------------------- 2. dots */

/* the cpu.h order, recomputed from GGML blocks: weight row w (t), activation blocks xb */
static float spec_dot(kiln_dtype t, int64_t n, const uint8_t *w, const kiln_block_q8_0 *xb,
                      double *exact, double *abs_terms) {
    float a[16] = {0};
    double ex = 0, at = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        int32_t isum = 0;
        uint16_t dwh;
        if (t == KILN_DTYPE_Q8_0) {
            const kiln_block_q8_0 *wb = (const kiln_block_q8_0 *)w + b;
            for (int j = 0; j < 32; j++) isum += wb->qs[j] * xb[b].qs[j];
            dwh = wb->d;
        } else {
            const kiln_block_q4_0 *wb = (const kiln_block_q4_0 *)w + b;
            for (int j = 0; j < 32; j++) {
                int q = j < 16 ? (wb->qs[j] & 15) : (wb->qs[j - 16] >> 4);
                isum += (q - 8) * xb[b].qs[j];
            }
            dwh = wb->d;
        }
        double D = ref_fp16_val(dwh) * ref_fp16_val(xb[b].d); /* exact in f32 */
        a[b % 16] = fmaf((float)D, (float)isum, a[b % 16]);
        ex += D * isum;
        at += fabs(D * isum);
    }
    float s8[8], s4[4], s2[2];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    for (int j = 0; j < 2; j++) s2[j] = s4[j] + s4[j + 2];
    *exact = ex;
    *abs_terms = at;
    return s2[0] + s2[1];
}

static int same_bits(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

typedef struct simd_kernel {
    const char *name;
    kiln_simd layout_path;
    const kiln_cpu_q8_kernel *k;
} simd_kernel;

static int n_simd_kernels(kiln_dtype t, simd_kernel *out) {
    int c = 0;
    if (kiln_simd_supported(KILN_SIMD_AVX2)) {
        out[c++] = (simd_kernel){"avx2", KILN_SIMD_AVX2, kiln_cpu_q8_kernel_avx2(t, false)};
        if (kiln_cpu_features_get()->avxvnni)
            out[c++] = (simd_kernel){"avx2vnni", KILN_SIMD_AVX2, kiln_cpu_q8_kernel_avx2(t, true)};
    }
    if (kiln_simd_supported(KILN_SIMD_AVX512)) {
        out[c++] = (simd_kernel){"avx512bw", KILN_SIMD_AVX512, kiln_cpu_q8_kernel_avx512(t, false)};
        if (kiln_cpu_features_get()->avx512vnni)
            out[c++] =
                (simd_kernel){"avx512vnni", KILN_SIMD_AVX512, kiln_cpu_q8_kernel_avx512(t, true)};
    }
    return c;
}

static double worst_float_ratio, worst_q8_vs_f32;
static int n_dots_compared;

static void check_dots(kiln_dtype t) {
    const int64_t lens[] = {32, 64, 96, 160, 256, 288, 480, 512, 544, 736, 1024, 1056, 4096};
    enum { TOK = 9 };
    simd_kernel sk[4];
    int nsk = n_simd_kernels(t, sk);
    kiln_vec_dot_q8_fn scalar = kiln_cpu_vec_dot_q8(t, KILN_SIMD_SCALAR);
    kiln_vec_dot_fn f32dot = kiln_cpu_vec_dot(t, KILN_SIMD_SCALAR);
    REQUIRE(scalar && f32dot);
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        int64_t n = lens[li], nb = n / 32;
        size_t rs = kiln_cpu_q8_row_size(n);
        for (int raw = 0; raw < 2; raw++) {
            uint8_t *w = ct_random_rows(t, 1, n, raw);
            float *x = malloc(sizeof(float) * (size_t)n * TOK);
            kiln_block_q8_0 *xb = malloc(sizeof *xb * (size_t)nb * TOK);
            uint8_t *xs = aligned_alloc(64, rs * TOK), *xv = aligned_alloc(64, rs * TOK);
            float *wf = malloc(sizeof(float) * (size_t)n);
            REQUIRE(x && xb && xs && xv && wf);
            kiln_dtype_traits_of(t)->to_float(w, wf, n);
            for (int64_t i = 0; i < n * TOK; i++) x[i] = ct_uniform();
            /* varying block magnitudes, and a NaN in the last token */
            for (int64_t b = 0; b < nb * TOK; b++) {
                float sc = ldexpf(1.0f, (int)(ct_u32() % 12) - 6);
                for (int j = 0; j < 32; j++) x[32 * b + j] *= sc;
            }
            x[n * (TOK - 1) + n / 3] = NAN;
            kiln_quantize_q8_0_act(x, xb, n * TOK);
            kiln_cpu_q8_quantize(KILN_SIMD_SCALAR, n, TOK, x, xs);
            float ref[TOK];
            for (int r = 0; r < TOK; r++) {
                double exact, at;
                float spec = spec_dot(t, n, w, xb + nb * r, &exact, &at);
                ref[r] = scalar(n, w, xs + rs * r);
                CHECKF(same_bits(ref[r], spec), "%s n=%lld raw=%d tok %d: scalar %.9g vs spec %.9g",
                       kiln_dtype_name(t), (long long)n, raw, r, ref[r], spec);
                if (r == TOK - 1) {
                    CHECKF(isnan(ref[r]), "%s: NaN activation gave %g", kiln_dtype_name(t), ref[r]);
                    continue;
                }
                double tol = (double)(nb / 16 + 5) * 0x1p-24 * at;
                CHECKF(fabs(ref[r] - exact) <= tol, "%s n=%lld: scalar %.9g vs exact %.9g (tol %g)",
                       kiln_dtype_name(t), (long long)n, ref[r], exact, tol);
                if (tol > 0)
                    worst_float_ratio = fmax(worst_float_ratio, fabs(ref[r] - exact) / tol);
                /* 3. q8 vs f32 activations */
                const float *xr = x + n * r;
                double bound = 0, S = 0;
                for (int64_t b = 0; b < nb; b++) {
                    float amax = 0;
                    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xr[32 * b + j]));
                    double d = amax / 127.0f, d16 = ref_fp16_val(ref_fp16((float)d));
                    double e = d / 2 * (1 + 0x1p-14) + 127 * fabs(d - d16);
                    for (int j = 0; j < 32; j++) {
                        bound += e * fabs(wf[32 * b + j]);
                        S += fabs((double)wf[32 * b + j] * xr[32 * b + j]);
                    }
                }
                float fv = f32dot(n, w, xr);
                double lim = bound + 1e-5 * S + 1e-6 + tol;
                CHECKF(fabs(ref[r] - fv) <= lim, "%s n=%lld: q8 %.9g vs f32 %.9g, bound %g",
                       kiln_dtype_name(t), (long long)n, ref[r], fv, lim);
                worst_q8_vs_f32 = fmax(worst_q8_vs_f32, fabs(ref[r] - fv) / lim);
            }
            for (int s = 0; s < nsk; s++) {
                REQUIRE(sk[s].k);
                kiln_cpu_q8_quantize(sk[s].layout_path, n, TOK, x, xv);
                int bad = 0;
                for (int r = 0; r < TOK; r++) {
                    float v = sk[s].k->dot(n, w, xv + rs * r);
                    if (!same_bits(v, ref[r]) && bad++ < 3)
                        fprintf(stderr, "%s %s n=%lld raw=%d tok %d: %.9g vs scalar %.9g\n",
                                sk[s].name, kiln_dtype_name(t), (long long)n, raw, r, v, ref[r]);
                    n_dots_compared++;
                }
                /* tiles of every token count, at every start */
                for (int nt = 1; nt <= sk[s].k->max_tok; nt++) {
                    float out[64];
                    for (int r0 = 0; r0 + nt <= TOK; r0 += nt) {
                        sk[s].k->tile(n, w, kiln_dtype_row_size(t, n), 1, xv + rs * r0, rs, nt,
                                      out);
                        for (int r = 0; r < nt; r++)
                            if (!same_bits(out[r], ref[r0 + r]) && bad++ < 3)
                                fprintf(stderr, "%s %s tile ntok=%d tok %d: %.9g vs %.9g\n",
                                        sk[s].name, kiln_dtype_name(t), nt, r0 + r, out[r],
                                        ref[r0 + r]);
                    }
                }
                /* the short-row kernel (rows in lanes), every row count */
                if (sk[s].k->small && n < 512) {
                    uint8_t *w8 = ct_random_rows(t, 8, n, raw);
                    size_t wrs = kiln_dtype_row_size(t, n);
                    for (int r = 0; r < TOK; r++) {
                        float want8[8], got8[8];
                        for (int k = 0; k < 8; k++)
                            want8[k] = scalar(n, w8 + wrs * (size_t)k, xs + rs * r);
                        for (int nr = 1; nr <= 8; nr++) {
                            for (int k = 0; k < 8; k++) got8[k] = -1.0f;
                            sk[s].k->small(n, w8, wrs, nr, xv + rs * r, got8);
                            for (int k = 0; k < 8; k++)
                                if ((k < nr ? !same_bits(got8[k], want8[k]) : got8[k] != -1.0f) &&
                                    bad++ < 3)
                                    fprintf(stderr,
                                            "%s %s small n=%lld nrows=%d row %d: %.9g vs %.9g\n",
                                            sk[s].name, kiln_dtype_name(t), (long long)n, nr, k,
                                            got8[k], want8[k]);
                        }
                        n_dots_compared += 8;
                    }
                    free(w8);
                }
                CHECKF(bad == 0, "%s %s n=%lld raw=%d: %d results not bit-identical to scalar",
                       sk[s].name, kiln_dtype_name(t), (long long)n, raw, bad);
            }
            free(w);
            free(x);
            free(xb);
            free(xs);
            free(xv);
            free(wf);
        }
    }
}

/* The packed panels (pack + ptile) of every SIMD kernel that has them, called directly:
 * 13 rows (a partial last group on AVX2), every row-tile start and token count, raw rows
 * (extreme quants, -128) and quantizer rows, against the scalar dot bit for bit */
static void check_packed(kiln_dtype t) {
    const int64_t lens[] = {32, 64, 96, 512, 544, 1024, 1056};
    enum { TOK = 9, ROWS = 13 };
    simd_kernel sk[4];
    int nsk = n_simd_kernels(t, sk);
    kiln_vec_dot_q8_fn scalar = kiln_cpu_vec_dot_q8(t, KILN_SIMD_SCALAR);
    for (int s = 0; s < nsk; s++) {
        const kiln_cpu_q8_kernel *k = sk[s].k;
        if (!k || !k->pack) continue;
        for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++)
            for (int raw = 0; raw < 2; raw++) {
                int64_t n = lens[li];
                size_t rs = kiln_cpu_q8_row_size(n), wrs = kiln_dtype_row_size(t, n);
                size_t pb = k->packed_row_bytes(n);
                if (pb == 0) continue; /* AVX-512: rows without a full 16-block group */
                int prow = (ROWS + k->pmax_rows - 1) / k->pmax_rows * k->pmax_rows;
                uint8_t *w = ct_random_rows(t, ROWS, n, raw);
                float *x = malloc(sizeof(float) * (size_t)n * TOK);
                uint8_t *xs = aligned_alloc(64, rs * TOK), *xv = aligned_alloc(64, rs * TOK);
                uint8_t *pk = aligned_alloc(64, (pb * (size_t)prow + 63) / 64 * 64);
                REQUIRE(w && x && xs && xv && pk);
                for (int64_t i = 0; i < n * TOK; i++) x[i] = ct_uniform() * (float)(1 + i % 7);
                kiln_cpu_q8_quantize(KILN_SIMD_SCALAR, n, TOK, x, xs);
                kiln_cpu_q8_quantize(sk[s].layout_path, n, TOK, x, xv);
                k->pack(n, w, wrs, ROWS, pk);
                int bad = 0;
                for (int nt = 1; nt <= k->pmax_tok; nt++)
                    for (int r0 = 0; r0 + nt <= TOK; r0 += nt)
                        for (int o = 0; o < ROWS; o += k->pmax_rows) {
                            int nr = ROWS - o < k->pmax_rows ? ROWS - o : k->pmax_rows;
                            float out[128];
                            REQUIRE(k->pmax_rows * k->pmax_tok <= 128);
                            k->ptile(n, pk + (size_t)o * pb, pb, w + (size_t)o * wrs, wrs, nr,
                                     xv + rs * (size_t)r0, rs, nt, out);
                            for (int q = 0; q < nr; q++)
                                for (int r = 0; r < nt; r++) {
                                    float want = scalar(n, w + (size_t)(o + q) * wrs,
                                                        xs + rs * (size_t)(r0 + r));
                                    n_dots_compared++;
                                    if (!same_bits(out[q * nt + r], want) && bad++ < 3)
                                        fprintf(stderr,
                                                "%s %s packed n=%lld raw=%d ntok=%d row %d tok "
                                                "%d: %.9g vs %.9g\n",
                                                sk[s].name, kiln_dtype_name(t), (long long)n, raw,
                                                nt, o + q, r0 + r, out[q * nt + r], want);
                                }
                        }
                CHECKF(bad == 0, "%s %s packed n=%lld raw=%d: %d results not bit-identical",
                       sk[s].name, kiln_dtype_name(t), (long long)n, raw, bad);
                free(w), free(x), free(xs), free(xv), free(pk);
            }
    }
}

/* Q8_0 weights of -128 (not produced by quantizers, legal in the format) and extreme nibbles */
static void check_extremes(void) {
    int64_t n = 544;
    size_t rs = kiln_cpu_q8_row_size(n);
    kiln_block_q8_0 w8[17];
    kiln_block_q4_0 w4[17];
    float x[544];
    for (int b = 0; b < 17; b++) {
        w8[b].d = w4[b].d = 0x3C00;
        for (int j = 0; j < 32; j++) w8[b].qs[j] = (int8_t)(b & 1 ? -128 : 127);
        for (int j = 0; j < 16; j++) w4[b].qs[j] = b & 1 ? 0x00 : 0xFF;
    }
    for (int i = 0; i < 544; i++) x[i] = (i & 1) ? -1.0f : 1.0f;
    x[1] = 1.0f; /* not all cancelling */
    uint8_t *xq = aligned_alloc(64, rs);
    REQUIRE(xq);
    for (int ti = 0; ti < 2; ti++) {
        kiln_dtype t = ti ? KILN_DTYPE_Q4_0 : KILN_DTYPE_Q8_0;
        const void *w = ti ? (const void *)w4 : (const void *)w8;
        kiln_cpu_q8_quantize(KILN_SIMD_SCALAR, n, 1, x, xq);
        float ref = kiln_cpu_vec_dot_q8(t, KILN_SIMD_SCALAR)(n, w, xq);
        kiln_block_q8_0 xb[17];
        double ex, at;
        kiln_quantize_q8_0_act(x, xb, n);
        CHECK(same_bits(ref, spec_dot(t, n, w, xb, &ex, &at)));
        simd_kernel sk[4];
        int nsk = n_simd_kernels(t, sk);
        for (int s = 0; s < nsk; s++) {
            kiln_cpu_q8_quantize(sk[s].layout_path, n, 1, x, xq);
            float v = sk[s].k->dot(n, w, xq);
            CHECKF(same_bits(v, ref), "%s %s extremes: %.9g vs %.9g", sk[s].name,
                   kiln_dtype_name(t), v, ref);
        }
    }
    free(xq);
}

int main(int argc, char **argv) {
    /* `test_q8_act novnni`: KILN_VNNI=0 before the first query must select the AVX-512BW
     * kernels (the matmul invariance test then runs them through the dispatcher too) */
    int novnni = argc > 1 && strcmp(argv[1], "novnni") == 0;
    if (novnni)
        setenv("KILN_VNNI", "0", 1);
    else
        unsetenv("KILN_VNNI");
    CHECK(kiln_cpu_use_vnni() == (!novnni && kiln_cpu_features_get()->avx512vnni));
    if (kiln_simd_supported(KILN_SIMD_AVX512))
        CHECK(kiln_cpu_q8_kernel_get(KILN_DTYPE_Q4_0, KILN_SIMD_AVX512) ==
              kiln_cpu_q8_kernel_avx512(KILN_DTYPE_Q4_0, kiln_cpu_use_vnni()));
    printf("paths: scalar%s%s%s%s\n", kiln_simd_supported(KILN_SIMD_AVX2) ? " avx2" : "",
           kiln_simd_supported(KILN_SIMD_AVX2) && kiln_cpu_features_get()->avxvnni ? " avx2vnni"
                                                                                   : "",
           kiln_simd_supported(KILN_SIMD_AVX512) ? " avx512bw" : "",
           kiln_simd_supported(KILN_SIMD_AVX512) && kiln_cpu_features_get()->avx512vnni
               ? " avx512vnni"
               : "");
    check_quantizer();
    check_dots(KILN_DTYPE_Q8_0);
    check_dots(KILN_DTYPE_Q4_0);
    check_packed(KILN_DTYPE_Q8_0);
    check_packed(KILN_DTYPE_Q4_0);
    check_extremes();
    /* dispatch */
    CHECK(kiln_cpu_q8_supported(KILN_DTYPE_Q8_0) && kiln_cpu_q8_supported(KILN_DTYPE_Q4_0));
    CHECK(!kiln_cpu_q8_supported(KILN_DTYPE_F32) && !kiln_cpu_q8_supported(KILN_DTYPE_Q4_K));
    for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
        CHECK(kiln_cpu_vec_dot_q8(KILN_DTYPE_Q6_K, p) == NULL);
        CHECK((kiln_cpu_vec_dot_q8(KILN_DTYPE_Q4_0, p) != NULL) == kiln_simd_supported(p));
    }
    CHECK(kiln_cpu_q8_row_size(33) == 0 && kiln_cpu_q8_row_size(-32) == 0);
    CHECK(kiln_cpu_q8_row_size(32) == 640);
    printf("%d blocks quantized bit-exactly; %d SIMD dots bit-identical to scalar\n",
           n_blocks_checked, n_dots_compared);
    printf("worst |scalar - exact| / float bound %.4f; worst |q8 - f32| / quantization bound "
           "%.4f\n",
           worst_float_ratio, worst_q8_vs_f32);
    return kiln_test_finish("test_q8_act");
}
