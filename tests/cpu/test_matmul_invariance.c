/*
 * test_matmul_invariance - batch invariance of kiln_cpu_matmul (DESIGN.md principle 3).
 *
 * For every weight dtype and every path this CPU supports: the output for (t, o) is
 * bit-identical to the 1-token, 1-thread result for that activation row, for n_tok in
 * {1, 3, 17, 64} and thread counts {1, 2, 3} (so token tiles of every size, partial tiles,
 * several row panels and uneven row splits all occur), and equal to the path's own
 * kiln_cpu_vec_dot. It also agrees with a double-precision dequantize-then-dot reference
 * within the tolerance of test_vec_dot_paths (1e-5 * sum|w x| + 1e-6).
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
        kiln_cpu_matmul_path(NULL, p, w, t, N_OUT, n_in, x + tk * n_in, 1, ref + tk * N_OUT);
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
            kiln_cpu_matmul_path(pools[th], p, w, t, N_OUT, n_in, x, n_tok, y);
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
    kiln_cpu_matmul_path(pools[2], p, w, t, N_OUT, n_in, x + 5 * n_in, 17, y);
    CHECK(memcmp(y, ref + 5 * N_OUT, sizeof(float) * 17 * N_OUT) == 0);
    free(w);
    free(x);
    free(ref);
    free(y);
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
    printf("checked %d paths x %d dtypes\n", n_paths, CT_N_TYPES);

    /* kiln_cpu_matmul uses the active path */
    {
        int64_t n_in = 64;
        uint8_t *w = ct_random_rows(KILN_DTYPE_Q8_0, 4, n_in, 0);
        float x[2 * 64], y1[8], y2[8];
        for (int i = 0; i < 2 * 64; i++) x[i] = ct_uniform();
        kiln_cpu_matmul(pools[2], w, KILN_DTYPE_Q8_0, 4, n_in, x, 2, y1);
        kiln_cpu_matmul_path(NULL, kiln_simd_active(), w, KILN_DTYPE_Q8_0, 4, n_in, x, 2, y2);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
        /* no kernel: NaN-filled, never a crash */
        kiln_cpu_matmul(NULL, w, KILN_DTYPE_I32, 4, 16, x, 2, y1);
        CHECK(isnan(y1[0]) && isnan(y1[7]));
        free(w);
    }
    for (int th = 1; th <= 3; th++) kiln_threadpool_destroy(pools[th]);
    return kiln_test_finish("test_matmul_invariance");
}
