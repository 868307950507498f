/*
 * test_attn_kv_formats - the KV page formats (kv/kv_format.h) through attention:
 *   1. write / read: q8_0 and q4_0 rows are byte for byte what ggml's reference quantizers
 *      (quantize_row_q8_0_ref, quantize_row_q4_0_ref, re-derived here from their definition:
 *      d = amax / 127, roundf; d = max / -8, (int8)(x / d + 8.5) capped at 15) write, and
 *      read back exactly what tensor/dtype.c's independent dequantizers (the GGUF weight
 *      path) give for the same bytes; the round-trip error is within the format's bound;
 *      kv_dim % 32 != 0 is refused naming the option.
 *   2. the scalar reference attention over per-block formats (kiln_attention_paged_kv) against
 *      attention in double precision over the same values (dequantized by tensor/dtype.c),
 *      with q and p rounded to f16 (the formats' operand): 1e-5 relative (+ 1e-6);
 *   3. the AVX-512 kernel (kiln_attention_group_avx512) against the scalar reference: 2e-5
 *      relative + 2e-3 (the f16 operand's bound of test_ops_paths; p is rounded to f16 on both
 *      paths, and a different summation order can move a rounding of p by one f16 ulp);
 *   4. bit-identical outputs on every path whatever the token tiling of the calls, and on
 *      the AVX-512 path whatever the block size (16 or 5) for one-format sequences;
 *   5. the AVX2 kernel (kiln_attention_group_avx2) bitwise equal to the scalar reference, all
 *      tokens in one call, in uneven tiles, and (one-format sequences) with block size 5;
 *      and over plain rows (f32, f16, bf16 without per-block formats, head_dim 8..256 with
 *      tails of 4 and 2, G 1 / 3 / 8, 1..100 keys) against kiln_attention_paged;
 * over head_dim 8, 16, 24, 64, 80, 128 (4 KV heads: a q8_0 / q4_0 block spans 4 or 2 heads of
 * 8 or 16; heads of 24 and 80 start inside a block and cross one), G 1 and 3, causal and
 * windowed, softcap on and off, for K/V formats q8_0/q8_0, q4_0/q4_0, q8_0/f16, f16/q4_0,
 * and sequences whose blocks mix f16 and q8_0 (the delayed transition's pages).
 * Without AVX-512 (or AVX2) the checks of that kernel are skipped (and said).
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
#include "kv/kv_format.h"
#include "tensor/dtype.h"

/* ---- 1. rows ------------------------------------------------------------------------- */

/* ggml's quantize_row_q8_0_ref, from its definition */
static void ggml_q8_0(const float *x, uint8_t *y, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i * 32 + j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kiln_fp32_to_fp16(d);
        memcpy(y + i * 34, &dh, 2);
        for (int j = 0; j < 32; j++) y[i * 34 + 2 + j] = (uint8_t)(int8_t)roundf(x[i * 32 + j] * id);
    }
}

/* ggml's quantize_row_q4_0_ref, from its definition */
static void ggml_q4_0(const float *x, uint8_t *y, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            if (amax < fabsf(v)) amax = fabsf(v), max = v;
        }
        const float d = max / -8, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kiln_fp32_to_fp16(d);
        memcpy(y + i * 18, &dh, 2);
        for (int j = 0; j < 16; j++) {
            const float x0 = x[i * 32 + j] * id, x1 = x[i * 32 + 16 + j] * id;
            int q0 = (int8_t)(x0 + 8.5f), q1 = (int8_t)(x1 + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i * 18 + 2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void test_rows(void) {
    enum { N = 256 };
    float x[N], back[N], ref[N];
    uint8_t got[N * 2], want[N * 2];
    int n_rows = 0;
    for (int trial = 0; trial < 200; trial++) {
        const float scale = trial % 3 == 0 ? 1e-3f : trial % 3 == 1 ? 1.0f : 40.0f;
        for (int i = 0; i < N; i++) x[i] = ct_uniform() * scale;
        if (trial % 7 == 0) x[trial % N] = 0.0f, x[(trial * 5) % N] = -scale; /* ties, zeros */
        if (trial == 5) memset(x, 0, sizeof x);                                /* d = 0 */
        const kiln_kv_geom g = {N, 4, N / 4};
        for (int q4 = 0; q4 < 2; q4++) {
            const kiln_dtype t = q4 ? KILN_DTYPE_Q4_0 : KILN_DTYPE_Q8_0;
            const kiln_kv_format_traits *f = kiln_kv_format_of(t);
            REQUIRE(f && f->block_elems == 32);
            const size_t rb = kiln_kv_format_row_bytes_geom(t, &g);
            CHECK(rb == (size_t)N / 32 * (q4 ? 18 : 34));
            f->write_row(got, x, &g);
            (q4 ? ggml_q4_0 : ggml_q8_0)(x, want, N);
            CHECKF(memcmp(got, want, rb) == 0, "%s trial %d: bytes differ from ggml's", f->name,
                   trial);
            f->read_row(got, back, &g);
            kiln_dtype_traits_of(t)->to_float(got, ref, N);
            CHECKF(memcmp(back, ref, sizeof back) == 0,
                   "%s trial %d: read differs from tensor/dtype.c's dequantizer", f->name, trial);
            for (int b = 0; b < N / 32; b++) {
                uint16_t dh;
                memcpy(&dh, got + (size_t)b * (q4 ? 18 : 34), 2);
                /* the step d as stored and as computed before its f16 rounding */
                float amax = 0.0f;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
                const float d = fabsf(kiln_fp16_to_fp32(dh)), dt = amax / (q4 ? 8.0f : 127.0f);
                for (int j = 0; j < 32; j++) {
                    const float e = fabsf(back[b * 32 + j] - x[b * 32 + j]);
                    /* q8_0: half a step, plus 127 x the f16 rounding of d; q4_0: a step (the
                     * side away from the signed max is cut at +7), plus 8 x that rounding */
                    const float bound = (q4 ? 1.0f : 0.5f) * d + (q4 ? 8.0f : 127.0f) * fabsf(d - dt) +
                                        1e-6f * amax + 1e-30f;
                    CHECKF(e <= bound, "%s trial %d elem %d: |err| %g > %g", f->name, trial,
                           b * 32 + j, e, bound);
                }
            }
            n_rows++;
        }
    }
    /* the option named when a row is not whole blocks */
    kiln_error err = {0};
    const kiln_kv_geom bad = {4 * 12, 4, 12};
    CHECK(kiln_kv_format_check(KILN_DTYPE_Q8_0, &bad, "--kv-type-k", &err) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "--kv-type-k") && strstr(err.message, "32"), "'%s'", err.message);
    CHECK(kiln_kv_format_check(KILN_DTYPE_F16, &bad, "--kv-type-k", &err) == KILN_OK);
    CHECK(kiln_kv_format_check(KILN_DTYPE_Q4_K, &bad, "--kv-type", &err) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_kv_format_by_name("q4_0") && !kiln_kv_format_by_name("q4_1"));
    printf("rows: %d q8_0 / q4_0 rows byte-identical to ggml's quantizers\n", n_rows);
}

/* ---- 2-4. attention ------------------------------------------------------------------- */

typedef struct store {
    void **kb, **vb;
    uint8_t *kf, *vf;
    int nblk;
} store;

/* rows of nk keys in blocks of bs; block b's K format kfmt(b), V format vfmt(b) */
static store make_store(const float *K, const float *V, int nk, int nkv, int hd, int bs,
                        kiln_dtype kf0, kiln_dtype vf0, int mix) {
    store s;
    const int64_t kv_dim = (int64_t)nkv * hd;
    const kiln_kv_geom g = {kv_dim, nkv, hd};
    s.nblk = (nk + bs - 1) / bs;
    s.kb = calloc((size_t)s.nblk, sizeof(void *));
    s.vb = calloc((size_t)s.nblk, sizeof(void *));
    s.kf = calloc((size_t)s.nblk, 1);
    s.vf = calloc((size_t)s.nblk, 1);
    for (int b = 0; b < s.nblk; b++) {
        /* mix: the first half of the blocks converted (kf0 / vf0), the rest f16 */
        const kiln_dtype fk = mix && b >= s.nblk / 2 ? KILN_DTYPE_F16 : kf0;
        const kiln_dtype fv = mix && b >= s.nblk / 2 ? KILN_DTYPE_F16 : vf0;
        s.kf[b] = (uint8_t)fk;
        s.vf[b] = (uint8_t)fv;
        const size_t rk = kiln_kv_format_row_bytes_geom(fk, &g),
                     rv = kiln_kv_format_row_bytes_geom(fv, &g);
        s.kb[b] = malloc(rk * (size_t)bs);
        s.vb[b] = malloc(rv * (size_t)bs);
        memset(s.kb[b], 0x7F, rk * (size_t)bs); /* rows past nk must never be read */
        memset(s.vb[b], 0x7F, rv * (size_t)bs);
        for (int r = 0; r < bs && b * bs + r < nk; r++) {
            const int t = b * bs + r;
            kiln_kv_format_of(fk)->write_row((char *)s.kb[b] + rk * (size_t)r, K + t * kv_dim, &g);
            kiln_kv_format_of(fv)->write_row((char *)s.vb[b] + rv * (size_t)r, V + t * kv_dim, &g);
        }
    }
    return s;
}

static void free_store(store *s) {
    for (int b = 0; b < s->nblk; b++) free(s->kb[b]), free(s->vb[b]);
    free(s->kb), free(s->vb), free(s->kf), free(s->vf);
}

/* every stored row back in f32, as tensor/dtype.c reads the format: out[t * kv_dim + e] */
static void dequant_store(const store *s, int side, int nk, int bs, int nkv, int hd, float *out) {
    const kiln_kv_geom g = {(int64_t)nkv * hd, nkv, hd};
    for (int t = 0; t < nk; t++) {
        const int b = t / bs;
        const kiln_dtype f = side ? s->vf[b] : s->kf[b];
        const size_t rb = kiln_kv_format_row_bytes_geom(f, &g);
        const char *row = (const char *)(side ? s->vb[b] : s->kb[b]) + rb * (size_t)(t % bs);
        kiln_dtype_traits_of(f)->to_float(row, out + (size_t)t * g.kv_dim, g.kv_dim);
    }
}

static float r16(float v) {
    return kiln_fp16_to_fp32(kiln_fp32_to_fp16(v));
}

/* attention of one (token, head) in double over the stored values, q and p rounded to f16 */
static void attn_double(float *out, const float *q, const float *Kd, const float *Vd,
                        int64_t kv_dim, int hd, int64_t head_off, int begin, int end, float div,
                        float cap) {
    double sc[512], mx = -INFINITY, sum = 0;
    for (int t = begin; t < end; t++) {
        double a = 0;
        for (int d = 0; d < hd; d++) a += (double)r16(q[d]) * Kd[(size_t)t * kv_dim + head_off + d];
        a /= div;
        if (cap > 0) a = cap * tanh(a / cap);
        sc[t - begin] = a;
        if (a > mx) mx = a;
    }
    for (int t = begin; t < end; t++) sum += sc[t - begin] = exp(sc[t - begin] - mx);
    for (int d = 0; d < hd; d++) out[d] = 0;
    double acc[128] = {0};
    for (int t = begin; t < end; t++) {
        const double p = r16((float)(sc[t - begin] / sum));
        for (int d = 0; d < hd; d++) acc[d] += p * Vd[(size_t)t * kv_dim + head_off + d];
    }
    for (int d = 0; d < hd; d++) out[d] = (float)acc[d];
}

static float *scratch_for(int n_tok, int G, int hd, int max_keys) {
    size_t n = kiln_attention_group_scratch(n_tok, G, hd, max_keys);
    size_t n2 = kiln_simd_supported(KILN_SIMD_AVX512)
                    ? kiln_attention_group_scratch_avx512(n_tok, G, hd, max_keys)
                    : 0;
    if (n2 > n) n = n2;
    n2 = kiln_simd_supported(KILN_SIMD_AVX2)
             ? kiln_attention_group_scratch_avx2(n_tok, G, hd, max_keys)
             : 0;
    if (n2 > n) n = n2;
    n += (size_t)max_keys + (size_t)hd + 64;
    float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
    REQUIRE(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* the scalar reference over all tokens (one per call) */
static void ref_all(float *out, int64_t q_stride, const float *Q, int G, int nk, const int32_t *begin,
                    const int32_t *end, const kiln_attn_kv *kv, float div, float cap) {
    float *scr = scratch_for(1, G, kv->head_dim, nk);
    for (int i = 0; i < nk; i++)
        for (int h = 0; h < G; h++)
            kiln_attention_paged_kv(out + i * q_stride + (int64_t)h * kv->head_dim,
                                    Q + i * q_stride + (int64_t)h * kv->head_dim, kv, begin[i],
                                    end[i], div, cap, scr, scr + nk + 16);
    free(scr);
}

/* token i of nk attends over keys [begin[i], end[i]): causal, W > 0 a window of W keys */
static void causal_ranges(int nk, int W, int32_t *begin, int32_t *end) {
    for (int i = 0; i < nk; i++) {
        begin[i] = W && i - W + 1 > 0 ? i - W + 1 : 0;
        end[i] = i + 1;
    }
}

/* kv reading store s (blocks of bs positions) instead; per-block formats kept only if kv has
 * them */
static kiln_attn_kv kv_on(const kiln_attn_kv *kv, const store *s, int bs) {
    kiln_attn_kv k = *kv;
    k.k_blocks = (const void *const *)s->kb;
    k.v_blocks = (const void *const *)s->vb;
    if (kv->k_fmt) k.k_fmt = s->kf, k.v_fmt = s->vf;
    k.block_size = bs;
    return k;
}

/* the AVX2 kernel over all tokens, then in uneven tiles (odd tiles on kv_alt when given):
 * bitwise the reference ref; returns the number of differing (token, head) rows */
static int avx2_vs_ref(const float *ref, int64_t q_stride, const float *Q, int G, int nk,
                       const int32_t *begin, const int32_t *end, const kiln_attn_kv *kv,
                       const kiln_attn_kv *kv_alt, float div, float cap) {
    const int hd = kv->head_dim;
    float *got = malloc(sizeof(float) * (size_t)nk * (size_t)q_stride);
    REQUIRE(got);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i0 = 0; i0 < nk;) {
            int nt = pass ? 1 + (i0 * 7 + 3) % 5 : nk;
            if (nt > nk - i0) nt = nk - i0;
            float *scr = scratch_for(nt, G, hd, end[i0 + nt - 1]);
            kiln_attention_group_avx2(got + i0 * q_stride, q_stride, Q + i0 * q_stride, q_stride,
                                      G, nt, begin + i0, end + i0,
                                      pass && (i0 & 1) && kv_alt ? kv_alt : kv, div, cap, scr);
            free(scr);
            i0 += nt;
        }
        for (int i = 0; i < nk; i++)
            for (int h = 0; h < G; h++)
                bad += memcmp(got + i * q_stride + h * hd, ref + i * q_stride + h * hd,
                              sizeof(float) * (size_t)hd) != 0;
    }
    free(got);
    return bad;
}

static void test_attention(void) {
    const bool avx512 = kiln_simd_supported(KILN_SIMD_AVX512);
    const bool avx2 = kiln_simd_supported(KILN_SIMD_AVX2);
    if (!avx512) printf("no AVX-512 on this CPU: the AVX-512 kernel's checks are skipped\n");
    if (!avx2) printf("no AVX2 on this CPU: the AVX2 kernel's checks are skipped\n");
    int n_avx2 = 0;
    const int hds[] = {8, 16, 24, 64, 80, 128};
    const int nks[] = {1, 17, 70};
    static const struct {
        kiln_dtype k, v;
        int mix;
        const char *name;
    } fm[] = {
        {KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0, 0, "q8_0"},
        {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, 0, "q4_0"},
        {KILN_DTYPE_Q8_0, KILN_DTYPE_F16, 0, "q8_0 K, f16 V"},
        {KILN_DTYPE_F16, KILN_DTYPE_Q4_0, 0, "f16 K, q4_0 V"},
        {KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0, 1, "q8_0 then f16 blocks"},
        {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0, 1, "q4_0 / q8_0 then f16 blocks"},
    };
    int n_cases = 0;
    double worst_ref = 0, worst_simd = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (size_t ki = 0; ki < sizeof nks / sizeof nks[0]; ki++)
            for (size_t fi = 0; fi < sizeof fm / sizeof fm[0]; fi++) {
                const int hd = hds[hi], nk = nks[ki], nkv = 4, G = (hi + fi) % 2 ? 3 : 1;
                const int64_t kv_dim = (int64_t)nkv * hd, q_stride = (int64_t)nkv * G * hd;
                float *K = malloc(sizeof(float) * nk * kv_dim), *V = malloc(sizeof(float) * nk * kv_dim);
                float *Q = malloc(sizeof(float) * nk * q_stride);
                float *ref = malloc(sizeof(float) * nk * q_stride);
                float *got = malloc(sizeof(float) * nk * q_stride);
                float *alt = malloc(sizeof(float) * nk * q_stride);
                for (int64_t i = 0; i < nk * kv_dim; i++) K[i] = ct_uniform() * 2, V[i] = ct_uniform();
                for (int64_t i = 0; i < nk * q_stride; i++) Q[i] = ct_uniform() * 2;
                store s16 = make_store(K, V, nk, nkv, hd, 16, fm[fi].k, fm[fi].v, fm[fi].mix);
                store s5 = make_store(K, V, nk, nkv, hd, 5, fm[fi].k, fm[fi].v, fm[fi].mix);
                float *Kd = malloc(sizeof(float) * nk * kv_dim), *Vd = malloc(sizeof(float) * nk * kv_dim);
                dequant_store(&s16, 0, nk, 16, nkv, hd, Kd);
                dequant_store(&s16, 1, nk, 16, nkv, hd, Vd);
                const float div = sqrtf((float)hd);
                for (int win = 0; win < 2; win++)
                    for (int sc = 0; sc < 2; sc++) {
                        const float cap = sc ? 5.0f : 0.0f;
                        const int W = win ? nk / 3 + 1 : 0;
                        int32_t begin[128], end[128];
                        causal_ranges(nk, W, begin, end);
                        for (int g = 0; g < nkv; g += 3) { /* KV heads 0 and 3 */
                            const int64_t ho = (int64_t)g * hd, qo = (int64_t)g * G * hd;
                            kiln_attn_kv kv = {(const void *const *)s16.kb,
                                               (const void *const *)s16.vb,
                                               16,
                                               kv_dim,
                                               ho,
                                               hd,
                                               0,
                                               s16.kf,
                                               s16.vf};
                            ref_all(ref, q_stride, Q + qo, G, nk, begin, end, &kv, div, cap);
                            /* 2. the reference against double precision */
                            for (int i = 0; i < nk; i++)
                                for (int h = 0; h < G; h++) {
                                    float want[128];
                                    attn_double(want, Q + i * q_stride + qo + (int64_t)h * hd, Kd,
                                                Vd, kv_dim, hd, ho, begin[i], end[i], div, cap);
                                    const float *r = ref + i * q_stride + (int64_t)h * hd;
                                    for (int d = 0; d < hd; d++) {
                                        const double e = fabs((double)r[d] - want[d]);
                                        /* p is rounded to f16 on both sides: a score a few
                                         * ulp apart can round p one f16 ulp apart */
                                        const double tol = 1e-5 * (1 + fabs(want[d])) + 1e-3;
                                        if (e / (1 + fabs(want[d])) > worst_ref)
                                            worst_ref = e / (1 + fabs(want[d]));
                                        CHECKF(e <= tol,
                                               "ref %s hd %d nk %d head %d tok %d d %d: %g vs %g",
                                               fm[fi].name, hd, nk, g, i, d, r[d], want[d]);
                                    }
                                }
                            /* 4. the reference per token is tiling-free by construction; the
                             * dispatching entry (kiln_attention_group) gives the same bits
                             * one token at a time as all at once */
                            {
                                float *scr = scratch_for(nk, G, hd, nk);
                                kiln_attention_group(got, q_stride, Q + qo, q_stride, G, nk, begin,
                                                     end, &kv, div, cap, scr);
                                free(scr);
                                for (int i = 0; i < nk; i++) {
                                    float *scr1 = scratch_for(1, G, hd, end[i]);
                                    kiln_attention_group(alt + i * q_stride, q_stride,
                                                         Q + i * q_stride + qo, q_stride, G, 1,
                                                         begin + i, end + i, &kv, div, cap, scr1);
                                    free(scr1);
                                }
                                int bad = 0;
                                for (int i = 0; i < nk; i++)
                                    bad += memcmp(alt + i * q_stride, got + i * q_stride,
                                                  sizeof(float) * (size_t)G * hd) != 0;
                                CHECKF(bad == 0, "%s hd %d nk %d: tiling changed the bits",
                                       fm[fi].name, hd, nk);
                            }
                            if (avx512) {
                                /* 3. the AVX-512 kernel against the reference */
                                float *scr = scratch_for(nk, G, hd, nk);
                                kiln_attention_group_avx512(got, q_stride, Q + qo, q_stride, G, nk,
                                                            begin, end, &kv, div, cap, scr);
                                free(scr);
                                for (int i = 0; i < nk; i++)
                                    for (int h = 0; h < G; h++)
                                        for (int d = 0; d < hd; d++) {
                                            const float a = got[i * q_stride + h * hd + d],
                                                        b = ref[i * q_stride + h * hd + d];
                                            const double e = fabs((double)a - b) / (1 + fabs(b));
                                            if (e > worst_simd) worst_simd = e;
                                            CHECKF(fabsf(a - b) <= 2e-5f * (1 + fabsf(b)) + 2e-3f,
                                                   "avx512 %s hd %d nk %d G %d win %d head %d "
                                                   "tok %d d %d: %g vs %g",
                                                   fm[fi].name, hd, nk, G, W, g, i, d, a, b);
                                        }
                                /* 4. uneven tiles and, for one-format sequences, block size 5 */
                                const kiln_attn_kv kv5 = kv_on(&kv, &s5, 5);
                                for (int i0 = 0; i0 < nk;) {
                                    int nt = 1 + (i0 * 7 + 3) % 5;
                                    if (nt > nk - i0) nt = nk - i0;
                                    float *scr2 = scratch_for(nt, G, hd, end[i0 + nt - 1]);
                                    kiln_attention_group_avx512(
                                        alt + i0 * q_stride, q_stride, Q + i0 * q_stride + qo,
                                        q_stride, G, nt, begin + i0, end + i0,
                                        (i0 & 1) && !fm[fi].mix ? &kv5 : &kv, div, cap, scr2);
                                    free(scr2);
                                    i0 += nt;
                                }
                                int bad = 0;
                                for (int i = 0; i < nk; i++)
                                    bad += memcmp(alt + i * q_stride, got + i * q_stride,
                                                  sizeof(float) * (size_t)G * hd) != 0;
                                CHECKF(bad == 0,
                                       "avx512 %s hd %d nk %d G %d win %d: tiling / block size "
                                       "changed the bits",
                                       fm[fi].name, hd, nk, G, W);
                            }
                            if (avx2) {
                                /* 5. the AVX2 kernel: bitwise the reference */
                                const kiln_attn_kv kv5 = kv_on(&kv, &s5, 5);
                                const int bad =
                                    avx2_vs_ref(ref, q_stride, Q + qo, G, nk, begin, end, &kv,
                                                fm[fi].mix ? NULL : &kv5, div, cap);
                                CHECKF(bad == 0,
                                       "avx2 %s hd %d nk %d G %d win %d cap %g: %d rows differ "
                                       "from the reference",
                                       fm[fi].name, hd, nk, G, W, cap, bad);
                                n_avx2++;
                            }
                            n_cases++;
                        }
                    }
                free_store(&s16), free_store(&s5);
                free(K), free(V), free(Q), free(ref), free(got), free(alt), free(Kd), free(Vd);
            }
    printf("attention: %d cases; worst relative error: reference vs double %.2e, AVX-512 vs "
           "reference %.2e\n",
           n_cases, worst_ref, worst_simd);
    printf("attention: AVX2 kernel checked bitwise against the reference in %d cases\n", n_avx2);
}

/* 5. plain rows (kiln_attn_kv.k_fmt NULL: f32, f16, bf16) on the AVX2 kernel against
 * kiln_attention_paged, bitwise */
static void test_attention_plain_avx2(void) {
    if (!kiln_simd_supported(KILN_SIMD_AVX2)) return;
    const int hds[] = {8, 12, 24, 64, 80, 100, 128, 256};
    const int nks[] = {1, 7, 8, 9, 33, 100};
    const int Gs[] = {1, 3, 8};
    int n_cases = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (size_t ki = 0; ki < sizeof nks / sizeof nks[0]; ki++)
            for (int op = 0; op < 3; op++) {
                static const kiln_dtype dt[3] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
                const int hd = hds[hi], nk = nks[ki], nkv = 2, G = Gs[(hi + ki + op) % 3];
                const int64_t kv_dim = (int64_t)nkv * hd, q_stride = (int64_t)nkv * G * hd;
                float *K = malloc(sizeof(float) * nk * kv_dim), *V = malloc(sizeof(float) * nk * kv_dim);
                float *Q = malloc(sizeof(float) * nk * q_stride);
                float *ref = malloc(sizeof(float) * nk * q_stride);
                for (int64_t i = 0; i < nk * kv_dim; i++) K[i] = ct_uniform() * 2, V[i] = ct_uniform();
                for (int64_t i = 0; i < nk * q_stride; i++) Q[i] = ct_uniform() * 2;
                store s16 = make_store(K, V, nk, nkv, hd, 16, dt[op], dt[op], 0);
                store s5 = make_store(K, V, nk, nkv, hd, 5, dt[op], dt[op], 0);
                const float div = sqrtf((float)hd);
                for (int win = 0; win < 2; win++)
                    for (int sc = 0; sc < 2; sc++) {
                        const float cap = sc ? 5.0f : 0.0f;
                        const int W = win ? nk / 3 + 1 : 0;
                        int32_t begin[128], end[128];
                        causal_ranges(nk, W, begin, end);
                        const int g = 1; /* KV head 1: rows start at head_off = hd */
                        const int64_t qo = (int64_t)g * G * hd;
                        const kiln_attn_kv kv = {(const void *const *)s16.kb,
                                                 (const void *const *)s16.vb,
                                                 16,
                                                 kv_dim,
                                                 (int64_t)g * hd,
                                                 hd,
                                                 op,
                                                 NULL,
                                                 NULL};
                        const kiln_attn_kv kv5 = kv_on(&kv, &s5, 5);
                        float *scr = scratch_for(1, 1, hd, nk);
                        for (int i = 0; i < nk; i++)
                            for (int h = 0; h < G; h++)
                                kiln_attention_paged(ref + i * q_stride + h * hd,
                                                     Q + i * q_stride + qo + h * hd, kv.k_blocks,
                                                     kv.v_blocks, 16, kv_dim, kv.head_off, begin[i],
                                                     end[i], hd, div, cap, op, scr, scr + nk + 16);
                        free(scr);
                        const int bad =
                            avx2_vs_ref(ref, q_stride, Q + qo, G, nk, begin, end, &kv, &kv5, div, cap);
                        CHECKF(bad == 0,
                               "avx2 plain op %d hd %d nk %d G %d win %d cap %g: %d rows differ "
                               "from kiln_attention_paged",
                               op, hd, nk, G, W, cap, bad);
                        n_cases++;
                    }
                free_store(&s16), free_store(&s5);
                free(K), free(V), free(Q), free(ref);
            }
    printf("attention: AVX2 kernel over plain f32 / f16 / bf16 rows checked bitwise against "
           "kiln_attention_paged in %d cases\n",
           n_cases);
}

int main(void) {
    test_rows();
    test_attention();
    test_attention_plain_avx2();
    return kiln_test_finish("test_attn_kv_formats");
}
