/*
 * test_f16_packed - the packed F16 weight layout (KILN_LAYOUT_F16_R64, cpu.h).
 *
 * - kiln_cpu_layout_bytes: sizes, the zero-padded last group, what does not apply (0).
 * - kiln_cpu_pack_f16_r64: element (o, k) at half index (o / 64) * 64 * n_in + k * 64 + o % 64,
 *   the padding rows zero; the same bytes with 1, 2 and 3 threads.
 * - The matmul on the packed layout, every supported path, n_out {1, 63, 64, 65, 130, 200}
 *   x n_in {0, 1, 17, 515} x n_tok {1, 2, 5, 6, 7, 13, 64} x threads {1, 2, 3}: every output
 *   is bit-identical to an independent reference computed here from the row-layout weights
 *   in cpu.h's order (acc = fmaf(w, x, acc) for k = 0, 1, ..., from +0), so the result does
 *   not depend on the path, the batch, the tiling or the threads; and it agrees with a
 *   double-precision dot within the tolerance of test_vec_dot_paths (1e-5 * sum|w x| + 1e-6).
 * - kiln_cpu_matmul_outs with a packed F16 weight, a row-layout F16 weight and a Q8_0 weight
 *   in one call gives each exactly the bits of its own call.
 * - A packed layout on a non-F16 dtype, or an unknown layout, fills y with NaN.
 * Registered also with KILN_GEMV_PF=0 and 100 (the decode prefetch must not change a bit).
 */
#include <math.h>
#include <stdio.h>

#include "backend/cpu/cpu.h"
#include "cpu_test_util.h"
#include "test.h"
#include "util/threadpool.h"

enum { MAX_TOK = 64 };

/* cpu.h's order from the row layout: one fused multiply-add per k, in order, from +0 */
static float ref_seq(int64_t n_in, const uint16_t *row, const float *x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < n_in; k++) acc = fmaf(kiln_fp16_to_fp32(row[k]), x[k], acc);
    return acc;
}

static uint16_t *random_f16(int64_t n_out, int64_t n_in) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n_out * n_in) + 2);
    REQUIRE(w);
    for (int64_t i = 0; i < n_out * n_in; i++) w[i] = kiln_fp32_to_fp16(ct_uniform() * 0.5f);
    return w;
}

static void *pack(kiln_threadpool *tp, int64_t n_out, int64_t n_in, const uint16_t *w,
                  size_t *bytes) {
    *bytes = kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, n_out, n_in);
    void *p = aligned_alloc(64, (*bytes + 63) / 64 * 64 + 64);
    REQUIRE(p);
    memset(p, 0xAB, *bytes); /* the padding must be written */
    kiln_cpu_pack_f16_r64(tp, n_out, n_in, w, p);
    return p;
}

static void check_layout(kiln_threadpool *pools[4]) {
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, 64, 10) == 64 * 10 * 2);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, 65, 10) == 128 * 10 * 2);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, 1, 3) == 64 * 3 * 2);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, 0, 3) == 0);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F32, 64, 10) == 0);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, -1, 10) == 0);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, INT64_MAX, INT64_MAX) == 0);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_F16_R64, KILN_DTYPE_F16, 1, INT64_MAX / 32) == 0);
    CHECK(kiln_cpu_layout_bytes(KILN_LAYOUT_ROWS, KILN_DTYPE_Q8_0, 3, 64) == 3 * 68);
    CHECK(kiln_cpu_layout_bytes((kiln_cpu_layout)7, KILN_DTYPE_F16, 64, 10) == 0);

    const int64_t n_out = 150, n_in = 37; /* 3 groups, the last with 22 rows */
    uint16_t *w = random_f16(n_out, n_in);
    size_t bytes;
    uint16_t *p1 = pack(NULL, n_out, n_in, w, &bytes);
    REQUIRE(bytes == 3 * 64 * 37 * 2);
    int bad = 0;
    for (int64_t o = 0; o < 3 * 64; o++)
        for (int64_t k = 0; k < n_in; k++) {
            uint16_t want = o < n_out ? w[o * n_in + k] : 0;
            if (p1[(o / 64) * 64 * n_in + k * 64 + o % 64] != want) bad++;
        }
    CHECKF(bad == 0, "pack: %d halves misplaced", bad);
    for (int th = 1; th <= 3; th++) {
        size_t b2;
        uint16_t *p2 = pack(pools[th], n_out, n_in, w, &b2);
        CHECKF(memcmp(p1, p2, bytes) == 0, "pack with %d threads differs", th);
        free(p2);
    }
    free(p1);
    free(w);
}

static int check_shape(kiln_simd path, kiln_threadpool *pools[4], int64_t n_out, int64_t n_in) {
    uint16_t *w = random_f16(n_out, n_in);
    size_t bytes;
    void *pk = pack(NULL, n_out, n_in, w, &bytes);
    float *x = malloc(sizeof(float) * (size_t)(MAX_TOK * (n_in ? n_in : 1)));
    float *ref = malloc(sizeof(float) * (size_t)(MAX_TOK * n_out));
    float *y = malloc(sizeof(float) * (size_t)(MAX_TOK * n_out));
    REQUIRE(x && ref && y);
    for (int64_t i = 0; i < MAX_TOK * n_in; i++) x[i] = ct_uniform();
    int bad_tol = 0;
    for (int t = 0; t < MAX_TOK; t++)
        for (int64_t o = 0; o < n_out; o++) {
            ref[t * n_out + o] = ref_seq(n_in, w + o * n_in, x + t * n_in);
            double S, r = ct_ref_dot(KILN_DTYPE_F16, n_in, w + o * n_in, x + t * n_in, &S);
            if (!(fabs(ref[t * n_out + o] - r) <= 1e-5 * S + 1e-6)) bad_tol++;
        }
    CHECKF(bad_tol == 0, "n_out %lld n_in %lld: %d references beyond the double tolerance",
           (long long)n_out, (long long)n_in, bad_tol);
    const int ntoks[] = {1, 2, 5, 6, 7, 13, 64};
    int fails = 0;
    for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++)
        for (int th = 1; th <= 3; th++) {
            const int nt = ntoks[ni];
            for (int i = 0; i < nt * n_out; i++) y[i] = NAN;
            kiln_cpu_mm_out out = {pk, KILN_DTYPE_F16, n_out, y, KILN_LAYOUT_F16_R64};
            /* either activation mode: F16 has no q8 kernels */
            kiln_cpu_matmul_outs(pools[th], path, th == 2 ? KILN_ACT_Q8 : KILN_ACT_F32, &out, 1,
                                 n_in, x, nt);
            int bad = 0;
            for (int i = 0; i < nt * n_out; i++)
                if (memcmp(&y[i], &ref[i], sizeof(float)) != 0 && bad++ < 2)
                    fprintf(stderr,
                            "%s n_out %lld n_in %lld n_tok %d threads %d (t %d, o %d): "
                            "%.9g != %.9g\n",
                            kiln_simd_name(path), (long long)n_out, (long long)n_in, nt, th,
                            i / (int)n_out, i % (int)n_out, y[i], ref[i]);
            if (bad) fails++;
        }
    /* tokens at other batch positions: rows 5..17 as a 13-token batch */
    if (n_in > 0) {
        kiln_cpu_mm_out out = {pk, KILN_DTYPE_F16, n_out, y, KILN_LAYOUT_F16_R64};
        kiln_cpu_matmul_outs(pools[2], path, KILN_ACT_AUTO, &out, 1, n_in, x + 5 * n_in, 13);
        if (memcmp(y, ref + 5 * n_out, sizeof(float) * (size_t)(13 * n_out)) != 0) fails++;
    }
    free(w), free(pk), free(x), free(ref), free(y);
    return fails;
}

static void check_outs(kiln_simd path, kiln_threadpool *pools[4]) {
    const int64_t n_in = 96, n_out[3] = {70, 33, 129};
    uint16_t *wp = random_f16(n_out[0], n_in), *wr = random_f16(n_out[1], n_in);
    uint8_t *wq = ct_random_rows(KILN_DTYPE_Q8_0, n_out[2], n_in, 0);
    size_t bytes;
    void *pk = pack(NULL, n_out[0], n_in, wp, &bytes);
    float x[9 * 96], y[3][9 * 129], r[3][9 * 129];
    for (int i = 0; i < 9 * 96; i++) x[i] = ct_uniform();
    kiln_cpu_mm_out outs[3] = {{pk, KILN_DTYPE_F16, n_out[0], y[0], KILN_LAYOUT_F16_R64},
                               {wr, KILN_DTYPE_F16, n_out[1], y[1], KILN_LAYOUT_ROWS},
                               {wq, KILN_DTYPE_Q8_0, n_out[2], y[2], KILN_LAYOUT_ROWS}};
    for (int nt = 1; nt <= 9; nt += 4) {
        for (int i = 0; i < 3; i++) {
            kiln_cpu_mm_out one = outs[i];
            one.y = r[i];
            kiln_cpu_matmul_outs(NULL, path, KILN_ACT_AUTO, &one, 1, n_in, x, nt);
        }
        kiln_cpu_matmul_outs(pools[3], path, KILN_ACT_AUTO, outs, 3, n_in, x, nt);
        for (int i = 0; i < 3; i++)
            CHECKF(memcmp(y[i], r[i], sizeof(float) * (size_t)(nt * n_out[i])) == 0,
                   "%s outs: weight %d, n_tok %d differs from its own call", kiln_simd_name(path),
                   i, nt);
    }
    /* a packed layout on Q8_0 rows, and an unknown layout: NaN */
    kiln_cpu_mm_out badq = {wq, KILN_DTYPE_Q8_0, n_out[2], y[2], KILN_LAYOUT_F16_R64};
    kiln_cpu_matmul_outs(NULL, path, KILN_ACT_AUTO, &badq, 1, n_in, x, 2);
    CHECK(isnan(y[2][0]) && isnan(y[2][2 * n_out[2] - 1]));
    kiln_cpu_mm_out badl = {pk, KILN_DTYPE_F16, n_out[0], y[0], (kiln_cpu_layout)9};
    kiln_cpu_matmul_outs(NULL, path, KILN_ACT_AUTO, &badl, 1, n_in, x, 2);
    CHECK(isnan(y[0][0]) && isnan(y[0][2 * n_out[0] - 1]));
    free(wp), free(wr), free(wq), free(pk);
}

int main(void) {
    kiln_threadpool *pools[4] = {NULL, NULL, NULL, NULL};
    for (int th = 1; th <= 3; th++) {
        kiln_error err;
        REQUIRE(kiln_threadpool_create(th, &pools[th], &err) == KILN_OK);
    }
    check_layout(pools);
    const int64_t outs[] = {1, 63, 64, 65, 130, 200}, ins[] = {0, 1, 17, 515};
    for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
        if (!kiln_simd_supported(p)) {
            printf("note: path %s not supported here, skipped\n", kiln_simd_name(p));
            continue;
        }
        int fails = 0, shapes = 0;
        for (size_t a = 0; a < sizeof outs / sizeof outs[0]; a++)
            for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b++, shapes++)
                fails += check_shape(p, pools, outs[a], ins[b]);
        CHECKF(fails == 0, "%s: %d (shape, n_tok, threads) runs not bit-identical to the reference",
               kiln_simd_name(p), fails);
        printf("%s: %d shapes x 7 batch sizes x 3 thread counts bit-identical to the reference\n",
               kiln_simd_name(p), shapes);
        check_outs(p, pools);
    }
    for (int th = 1; th <= 3; th++) kiln_threadpool_destroy(pools[th]);
    return kiln_test_finish("test_f16_packed");
}
