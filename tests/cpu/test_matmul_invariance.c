/*
 * test_matmul_invariance - batch invariance of kiln_cpu_matmul (DESIGN.md principle 3).
 *
 * For every weight dtype and every path this CPU supports: the output for (t, o) is
 * bit-identical to the 1-token, 1-thread result for that activation row, for n_tok in
 * {1, 3, 17, 64} and thread counts {1, 2, 3} (so token tiles of every size, partial tiles,
 * several row panels and uneven row splits all occur), and equal to the path's own
 * kiln_cpu_vec_dot. It also agrees with a double-precision dequantize-then-dot reference
 * within the tolerance of test_vec_dot_paths (1e-5 * sum|w x| + 1e-6). That is the f32-
 * activation mode (KILN_ACT_F32), for every dtype.
 *
 * q8 mode (KILN_ACT_Q8, Q8_0 and Q4_0 weights): the same invariance, bit for bit, for n_tok
 * {1, 3, 17, 64} x threads {1, 2, 3} (17 and 64 tokens exceed the 16 KiB stack scratch, so
 * the heap scratch is used too), each output equals kiln_cpu_vec_dot_q8 of the quantized
 * row, and every path gives the SAME bits as the scalar path (cpu.h fixes one order for all).
 * The default mode is q8 unless KILN_Q8_ACT=0.
 *
 * kiln_cpu_matmul_multi (several weights sharing one input in one call) gives each weight
 * exactly the bits of its own kiln_cpu_matmul.
 */
#include <math.h>
#include <stdio.h>

#include "backend/cpu/cpu.h"
#include "cpu_test_util.h"
#include "test.h"
#include "util/threadpool.h"

enum { N_OUT = 67, MAX_TOK = 64 };

static void check_dtype(kiln_dtype t, kiln_simd p, kiln_threadpool *pools[4]) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    /* rows long enough that one token is worth threading; plain types get a ragged tail */
    int64_t n_in = tr->block_size == 256 ? 512 : tr->block_size == 32 ? 544 : 515;
    uint8_t *w = ct_random_rows(t, N_OUT, n_in, (int)(ct_u32() & 1));
    size_t rs = kiln_dtype_row_size(t, n_in);
    float *x = malloc(sizeof(float) * MAX_TOK * (size_t)n_in);
    float *ref = malloc(sizeof(float) * MAX_TOK * N_OUT);
    float *y = malloc(sizeof(float) * MAX_TOK * N_OUT);
    REQUIRE(x && ref && y);
    for (int64_t i = 0; i < MAX_TOK * n_in; i++) x[i] = ct_uniform();

    /* reference: each token alone, one thread */
    kiln_vec_dot_fn dot = kiln_cpu_vec_dot(t, p);
    REQUIRE(dot);
    int bad_dot = 0, bad_ref = 0;
    for (int tk = 0; tk < MAX_TOK; tk++) {
        kiln_cpu_matmul_ex(NULL, p, KILN_ACT_F32, w, t, N_OUT, n_in, x + tk * n_in, 1,
                           ref + tk * N_OUT);
        for (int o = 0; o < N_OUT; o++) {
            const void *wr = w + rs * (size_t)o;
            float d = dot(n_in, wr, x + tk * n_in);
            if (memcmp(&d, &ref[tk * N_OUT + o], sizeof d) != 0) bad_dot++;
            double S, r = ct_ref_dot(t, n_in, wr, x + tk * n_in, &S);
            if (!(fabs(ref[tk * N_OUT + o] - r) <= 1e-5 * S + 1e-6)) bad_ref++;
        }
    }
    CHECKF(bad_dot == 0, "%s/%s: %d matmul outputs differ from vec_dot", tr->name,
           kiln_simd_name(p), bad_dot);
    CHECKF(bad_ref == 0, "%s/%s: %d outputs beyond the double reference tolerance", tr->name,
           kiln_simd_name(p), bad_ref);

    const int ntoks[] = {1, 3, 17, 64};
    for (int ni = 0; ni < 4; ni++) {
        for (int th = 1; th <= 3; th++) {
            int n_tok = ntoks[ni];
            for (int i = 0; i < n_tok * N_OUT; i++) y[i] = NAN;
            kiln_cpu_matmul_ex(pools[th], p, KILN_ACT_F32, w, t, N_OUT, n_in, x, n_tok, y);
            int bad = 0;
            for (int i = 0; i < n_tok * N_OUT; i++)
                if (memcmp(&y[i], &ref[i], sizeof(float)) != 0 && bad++ < 3)
                    fprintf(stderr, "%s/%s n_tok=%d threads=%d (t=%d, o=%d): %.9g != %.9g\n",
                            tr->name, kiln_simd_name(p), n_tok, th, i / N_OUT, i % N_OUT, y[i],
                            ref[i]);
            CHECKF(bad == 0, "%s/%s n_tok=%d threads=%d: %d outputs not bit-identical", tr->name,
                   kiln_simd_name(p), n_tok, th, bad);
        }
    }
    /* the same tokens at other batch positions: rows 5..21 of x as a 17-token batch */
    kiln_cpu_matmul_ex(pools[2], p, KILN_ACT_F32, w, t, N_OUT, n_in, x + 5 * n_in, 17, y);
    CHECK(memcmp(y, ref + 5 * N_OUT, sizeof(float) * 17 * N_OUT) == 0);
    free(w);
    free(x);
    free(ref);
    free(y);
}

/* q8 mode; ref_scalar: the scalar path's 1-token results for the same w and x (all paths
 * must reproduce them) */
static void check_q8(kiln_dtype t, kiln_simd p, kiln_threadpool *pools[4], const uint8_t *w,
                     int64_t n_in, const float *x, const float *ref_scalar) {
    const char *tn = kiln_dtype_name(t), *pn = kiln_simd_name(p);
    size_t rs = kiln_dtype_row_size(t, n_in), qs = kiln_cpu_q8_row_size(n_in);
    float *ref = malloc(sizeof(float) * MAX_TOK * N_OUT);
    float *y = malloc(sizeof(float) * MAX_TOK * N_OUT);
    uint8_t *xq = aligned_alloc(64, qs);
    kiln_vec_dot_q8_fn dot = kiln_cpu_vec_dot_q8(t, p);
    REQUIRE(ref && y && xq && dot);
    int bad_dot = 0, bad_scalar = 0;
    for (int tk = 0; tk < MAX_TOK; tk++) {
        kiln_cpu_matmul_ex(NULL, p, KILN_ACT_Q8, w, t, N_OUT, n_in, x + tk * n_in, 1,
                           ref + tk * N_OUT);
        kiln_cpu_q8_quantize(p, n_in, 1, x + tk * n_in, xq);
        for (int o = 0; o < N_OUT; o++) {
            float d = dot(n_in, w + rs * (size_t)o, xq);
            if (memcmp(&d, &ref[tk * N_OUT + o], sizeof d) != 0) bad_dot++;
        }
    }
    if (ref_scalar)
        for (int i = 0; i < MAX_TOK * N_OUT; i++)
            if (memcmp(&ref[i], &ref_scalar[i], sizeof(float)) != 0 && bad_scalar++ < 3)
                fprintf(stderr, "q8 %s/%s (t=%d, o=%d): %.9g vs scalar %.9g\n", tn, pn, i / N_OUT,
                        i % N_OUT, ref[i], ref_scalar[i]);
    CHECKF(bad_dot == 0, "q8 %s/%s: %d matmul outputs differ from vec_dot_q8", tn, pn, bad_dot);
    CHECKF(bad_scalar == 0, "q8 %s/%s: %d outputs differ from the scalar path", tn, pn, bad_scalar);
    const int ntoks[] = {1, 3, 17, 64};
    for (int ni = 0; ni < 4; ni++) {
        for (int th = 1; th <= 3; th++) {
            int n_tok = ntoks[ni], bad = 0;
            for (int i = 0; i < n_tok * N_OUT; i++) y[i] = NAN;
            kiln_cpu_matmul_ex(pools[th], p, KILN_ACT_Q8, w, t, N_OUT, n_in, x, n_tok, y);
            for (int i = 0; i < n_tok * N_OUT; i++)
                if (memcmp(&y[i], &ref[i], sizeof(float)) != 0 && bad++ < 3)
                    fprintf(stderr, "q8 %s/%s n_tok=%d threads=%d (t=%d, o=%d): %.9g != %.9g\n", tn,
                            pn, n_tok, th, i / N_OUT, i % N_OUT, y[i], ref[i]);
            CHECKF(bad == 0, "q8 %s/%s n_tok=%d threads=%d: %d outputs not bit-identical", tn, pn,
                   n_tok, th, bad);
        }
    }
    kiln_cpu_matmul_ex(pools[3], p, KILN_ACT_Q8, w, t, N_OUT, n_in, x + 5 * n_in, 17, y);
    CHECK(memcmp(y, ref + 5 * N_OUT, sizeof(float) * 17 * N_OUT) == 0);
    /* the f32 mode really is a different computation */
    kiln_cpu_matmul_ex(NULL, p, KILN_ACT_F32, w, t, N_OUT, n_in, x, 1, y);
    CHECK(memcmp(y, ref, sizeof(float) * N_OUT) != 0);
    free(ref);
    free(y);
    free(xq);
}

static void check_q8_all(kiln_threadpool *pools[4]) {
    const kiln_dtype q8t[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    const int64_t lens[] = {544, 64, 1056, 1024}; /* 1024: full 16-block groups only */
    for (int ti = 0; ti < 2; ti++) {
        for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
            kiln_dtype t = q8t[ti];
            int64_t n_in = lens[li];
            uint8_t *w = ct_random_rows(t, N_OUT, n_in, (int)(ct_u32() & 1));
            float *x = malloc(sizeof(float) * MAX_TOK * (size_t)n_in);
            float *ref = malloc(sizeof(float) * MAX_TOK * N_OUT);
            REQUIRE(x && ref);
            for (int64_t i = 0; i < MAX_TOK * n_in; i++)
                x[i] = ct_uniform() * (float)(1 + (i / 32) % 5);
            for (int tk = 0; tk < MAX_TOK; tk++)
                kiln_cpu_matmul_ex(NULL, KILN_SIMD_SCALAR, KILN_ACT_Q8, w, t, N_OUT, n_in,
                                   x + tk * n_in, 1, ref + tk * N_OUT);
            for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++)
                if (kiln_simd_supported(p)) check_q8(t, p, pools, w, n_in, x, ref);
            free(w);
            free(x);
            free(ref);
        }
    }
}

/* kiln_cpu_matmul_multi: each output bit-identical to its own kiln_cpu_matmul, for mixed
 * dtypes (q8-mode and f32-mode weights in one call), several thread counts and token counts
 * on both sides of the packed-path threshold, and more weights than one fused call takes */
static void check_multi(kiln_threadpool *pools[4]) {
    const kiln_dtype ts[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_F16, KILN_DTYPE_Q4_0,
                             KILN_DTYPE_Q8_0};
    const int64_t n_outs[] = {37, 64, 9, 130, 5};
    enum { NW = 5, MAXT = 40 };
    const int64_t n_in = 1024;
    uint8_t *w[NW];
    float *y[NW], *ref[NW];
    float *x = malloc(sizeof(float) * MAXT * n_in);
    REQUIRE(x);
    for (int64_t i = 0; i < MAXT * n_in; i++) x[i] = ct_uniform();
    for (int i = 0; i < NW; i++) {
        w[i] = ct_random_rows(ts[i], n_outs[i], n_in, 0);
        y[i] = malloc(sizeof(float) * MAXT * (size_t)n_outs[i]);
        ref[i] = malloc(sizeof(float) * MAXT * (size_t)n_outs[i]);
        REQUIRE(y[i] && ref[i]);
    }
    const int ntoks[] = {1, 5, 40};
    int bad = 0;
    for (int ni = 0; ni < 3; ni++)
        for (int th = 1; th <= 3; th++) {
            int nt = ntoks[ni];
            kiln_cpu_mm_out outs[NW];
            for (int i = 0; i < NW; i++) {
                kiln_cpu_matmul(NULL, w[i], ts[i], n_outs[i], n_in, x, nt, ref[i]);
                for (int64_t j = 0; j < nt * n_outs[i]; j++) y[i][j] = NAN;
                outs[i] = (kiln_cpu_mm_out){w[i], ts[i], n_outs[i], y[i], KILN_LAYOUT_ROWS};
            }
            kiln_cpu_matmul_multi(pools[th], outs, NW, n_in, x, nt);
            for (int i = 0; i < NW; i++)
                if (memcmp(y[i], ref[i], sizeof(float) * (size_t)(nt * n_outs[i])) != 0 &&
                    bad++ < 3)
                    fprintf(stderr, "multi: weight %d (%s) n_tok %d threads %d differs\n", i,
                            kiln_dtype_name(ts[i]), nt, th);
        }
    CHECKF(bad == 0, "kiln_cpu_matmul_multi: %d outputs differ from kiln_cpu_matmul", bad);
    for (int i = 0; i < NW; i++) free(w[i]), free(y[i]), free(ref[i]);
    free(x);
}

int main(void) {
    kiln_threadpool *pools[4] = {NULL, NULL, NULL, NULL};
    for (int th = 1; th <= 3; th++) {
        kiln_error err;
        REQUIRE(kiln_threadpool_create(th, &pools[th], &err) == KILN_OK);
        REQUIRE(kiln_threadpool_size(pools[th]) == th);
    }
    int n_paths = 0;
    for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
        if (!kiln_simd_supported(p)) {
            printf("note: path %s not supported here, skipped\n", kiln_simd_name(p));
            continue;
        }
        n_paths++;
        for (int ti = 0; ti < CT_N_TYPES; ti++) check_dtype(ct_types[ti], p, pools);
    }
    printf("checked %d paths x %d dtypes (f32 activations)\n", n_paths, CT_N_TYPES);
    check_q8_all(pools);
    printf("q8 activations: Q8_0 and Q4_0, %d paths, bit-identical across paths\n", n_paths);
    check_multi(pools);

    /* kiln_cpu_matmul uses the active path */
    {
        int64_t n_in = 64;
        uint8_t *w = ct_random_rows(KILN_DTYPE_Q8_0, 4, n_in, 0);
        float x[2 * 64], y1[8], y2[8];
        for (int i = 0; i < 2 * 64; i++) x[i] = ct_uniform();
        kiln_cpu_matmul(pools[2], w, KILN_DTYPE_Q8_0, 4, n_in, x, 2, y1);
        kiln_cpu_matmul_path(NULL, kiln_simd_active(), w, KILN_DTYPE_Q8_0, 4, n_in, x, 2, y2);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
        /* the default activation mode (q8 unless KILN_Q8_ACT=0) */
        const char *env = getenv("KILN_Q8_ACT");
        kiln_act_mode want = env && strcmp(env, "0") == 0 ? KILN_ACT_F32 : KILN_ACT_Q8;
        CHECK(kiln_cpu_act_default() == want);
        kiln_cpu_matmul_ex(NULL, kiln_simd_active(), want, w, KILN_DTYPE_Q8_0, 4, n_in, x, 2, y2);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
        /* q8 mode on a dtype without q8 kernels is the f32 mode */
        uint8_t *wk = ct_random_rows(KILN_DTYPE_Q4_K, 4, 256, 0);
        float xk[256], yk1[4], yk2[4];
        for (int i = 0; i < 256; i++) xk[i] = ct_uniform();
        kiln_cpu_matmul_ex(NULL, kiln_simd_active(), KILN_ACT_Q8, wk, KILN_DTYPE_Q4_K, 4, 256, xk,
                           1, yk1);
        kiln_cpu_matmul_ex(NULL, kiln_simd_active(), KILN_ACT_F32, wk, KILN_DTYPE_Q4_K, 4, 256, xk,
                           1, yk2);
        CHECK(memcmp(yk1, yk2, sizeof yk1) == 0);
        free(wk);
        /* bad n_in in q8 mode: NaN, never a crash */
        kiln_cpu_matmul_ex(NULL, KILN_SIMD_SCALAR, KILN_ACT_Q8, w, KILN_DTYPE_Q8_0, 4, 48, x, 2,
                           y1);
        CHECK(isnan(y1[0]) && isnan(y1[7]));
        /* no kernel: NaN-filled, never a crash */
        kiln_cpu_matmul(NULL, w, KILN_DTYPE_I32, 4, 16, x, 2, y1);
        CHECK(isnan(y1[0]) && isnan(y1[7]));
        free(w);
    }
    for (int th = 1; th <= 3; th++) kiln_threadpool_destroy(pools[th]);
    return kiln_test_finish("test_matmul_invariance");
}
