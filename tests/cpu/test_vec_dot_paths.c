/*
 * test_vec_dot_paths - every SIMD dot kernel against the scalar reference, and the scalar
 * reference against an independent double-precision dequantize-then-dot, for every weight
 * dtype on random rows of several lengths (tails, odd block counts, long rows).
 *
 * Tolerance (stated): |a - b| <= 1e-5 * S + 1e-6, S = sum_i |w_i x_i| (w dequantized).
 * That is ~150 float epsilons of the absolute sum; f32 summation of n <= 4096 random terms
 * in different orders stays well inside it (worst observed ratio printed below).
 * To show the check has teeth, the same comparison is run on a deliberately perturbed
 * input (one activation changed so that the exact dot moves by 4x the tolerance) and must
 * fail for every dtype, length and path.
 */
#include <math.h>
#include <stdio.h>

#include "backend/cpu/cpu.h"
#include "cpu_test_util.h"
#include "test.h"

static const double REL_TOL = 1e-5, ABS_TOL = 1e-6;

static int within(double a, double b, double abs_sum) {
    return fabs(a - b) <= REL_TOL * abs_sum + ABS_TOL;
}

static double worst_ratio[3];
static int n_perturbed;
/* perturbed comparisons that (correctly) failed the check */ /* max |path - ref| / (REL_TOL*S +
                                                                 ABS_TOL) per path */

static void check_type(kiln_dtype t, const int64_t *lens, int n_lens) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    kiln_vec_dot_fn scalar = kiln_cpu_vec_dot(t, KILN_SIMD_SCALAR);
    REQUIRE(scalar != NULL);
    for (int li = 0; li < n_lens; li++) {
        int64_t n = lens[li];
        for (int raw = 0; raw < (tr->is_quantized ? 2 : 1); raw++) {
            enum { ROWS = 6 };
            uint8_t *w = ct_random_rows(t, ROWS, n, raw);
            size_t rs = kiln_dtype_row_size(t, n);
            float *x = malloc(sizeof(float) * (size_t)n);
            REQUIRE(x);
            for (int r = 0; r < ROWS; r++) {
                const void *wr = w + rs * (size_t)r;
                for (int64_t i = 0; i < n; i++) x[i] = ct_uniform();
                double S;
                double ref = ct_ref_dot(t, n, wr, x, &S);
                float s = scalar(n, wr, x);
                CHECKF(within(s, ref, S), "%s n=%lld raw=%d: scalar %.9g vs double ref %.9g",
                       tr->name, (long long)n, raw, s, ref);
                worst_ratio[0] = fmax(worst_ratio[0], fabs(s - ref) / (REL_TOL * S + ABS_TOL));
                for (kiln_simd p = KILN_SIMD_AVX2; p <= KILN_SIMD_AVX512; p++) {
                    if (!kiln_simd_supported(p)) continue;
                    kiln_vec_dot_fn f = kiln_cpu_vec_dot(t, p);
                    CHECKF(f != NULL, "%s has no %s kernel", tr->name, kiln_simd_name(p));
                    if (!f) continue;
                    float v = f(n, wr, x);
                    CHECKF(within(v, s, S), "%s n=%lld raw=%d: %s %.9g vs scalar %.9g (S=%g)",
                           tr->name, (long long)n, raw, kiln_simd_name(p), v, s, S);
                    worst_ratio[p] = fmax(worst_ratio[p], fabs(v - s) / (REL_TOL * S + ABS_TOL));
                    /* the check has teeth: changing one activation so that the exact dot
                     * moves by 4x the tolerance must be caught */
                    float wmid;
                    {
                        float *tmp = malloc(sizeof(float) * (size_t)n);
                        REQUIRE(tmp);
                        tr->to_float(wr, tmp, n);
                        wmid = tmp[n / 2];
                        free(tmp);
                    }
                    if (wmid != 0.0f) {
                        float keep = x[n / 2];
                        x[n / 2] += (float)(4 * (REL_TOL * S + ABS_TOL) / fabsf(wmid));
                        float vp = f(n, wr, x);
                        x[n / 2] = keep;
                        CHECKF(!within(vp, s, S),
                               "%s n=%lld: perturbed input passed the check (%s %.9g vs %.9g)",
                               tr->name, (long long)n, kiln_simd_name(p), vp, s);
                        n_perturbed++;
                    }
                }
            }
            free(x);
            free(w);
        }
    }
}

/*
 * Special values: zero activations give exactly 0; a row of equal adjacent pairs against
 * alternating +1/-1 activations cancels exactly on every path (each lane / partial sum sees
 * the negated twin of the other parity's sequence), so the result must be exactly 0.
 */
static void check_special(void) {
    for (int ti = 0; ti < CT_N_TYPES; ti++) {
        kiln_dtype t = ct_types[ti];
        const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
        int64_t n = tr->block_size == 256 ? 512 : 64;
        float *wf = calloc((size_t)n, sizeof(float)), *x = calloc((size_t)n, sizeof(float));
        float *wd = calloc((size_t)n, sizeof(float));
        uint8_t *w = calloc(1, kiln_dtype_row_size(t, n));
        REQUIRE(wf && x && w && wd);
        for (int64_t i = 0; i < n; i += 2) wf[i] = wf[i + 1] = ct_uniform();
        tr->from_float(wf, w, n);
        tr->to_float(w, wd, n);
        int pairs_equal = 1;
        for (int64_t i = 0; i < n; i += 2) pairs_equal &= wd[i] == wd[i + 1];
        CHECKF(pairs_equal, "%s: equal inputs quantized differently", tr->name);
        for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
            if (!kiln_simd_supported(p)) continue;
            kiln_vec_dot_fn f = kiln_cpu_vec_dot(t, p);
            for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
            CHECK(f(n, w, x) == 0.0f);
            for (int64_t i = 0; i < n; i++) x[i] = (i % 2) ? -1.0f : 1.0f;
            float v = f(n, w, x);
            CHECKF(v == 0.0f, "%s %s: paired row . (+1,-1,...) = %g", tr->name, kiln_simd_name(p),
                   v);
        }
        free(wf);
        free(wd);
        free(x);
        free(w);
    }
}

/* Plain-type rows may sit at any byte offset (safetensors): same bits as an aligned copy. */
static void check_unaligned(void) {
    kiln_dtype plain[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    for (int ti = 0; ti < 3; ti++) {
        int64_t n = 77;
        uint8_t *w = ct_random_rows(plain[ti], 1, n, 0);
        size_t rs = kiln_dtype_row_size(plain[ti], n);
        uint8_t *buf = malloc(rs + 8);
        float x[77], y[77], z[77];
        REQUIRE(buf);
        for (int i = 0; i < n; i++) x[i] = ct_uniform();
        for (int off = 1; off < 4; off++) {
            memcpy(buf + off, w, rs);
            kiln_dtype_traits_of(plain[ti])->to_float(w, y, n);
            kiln_dtype_traits_of(plain[ti])->to_float(buf + off, z, n);
            CHECK(memcmp(y, z, sizeof y) == 0);
            for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
                if (!kiln_simd_supported(p)) continue;
                kiln_vec_dot_fn f = kiln_cpu_vec_dot(plain[ti], p);
                float a = f(n, w, x), b = f(n, buf + off, x);
                CHECKF(memcmp(&a, &b, sizeof a) == 0, "%s %s offset %d: %g vs %g",
                       kiln_dtype_name(plain[ti]), kiln_simd_name(p), off, a, b);
            }
        }
        free(buf);
        free(w);
    }
}

int main(void) {
    const kiln_cpu_features *cf = kiln_cpu_features_get();
    printf("paths: scalar%s%s\n", kiln_simd_supported(KILN_SIMD_AVX2) ? " avx2" : "",
           kiln_simd_supported(KILN_SIMD_AVX512) ? " avx512" : "");
    (void)cf;
    const int64_t plain[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 100, 515, 1000, 4096};
    const int64_t b32[] = {32, 64, 96, 160, 544, 1024, 4096};
    const int64_t b256[] = {256, 512, 768, 2304, 4096};
    for (int ti = 0; ti < CT_N_TYPES; ti++) {
        kiln_dtype t = ct_types[ti];
        int bs = kiln_dtype_traits_of(t)->block_size;
        if (bs == 1)
            check_type(t, plain, (int)(sizeof plain / sizeof plain[0]));
        else if (bs == 32)
            check_type(t, b32, (int)(sizeof b32 / sizeof b32[0]));
        else
            check_type(t, b256, (int)(sizeof b256 / sizeof b256[0]));
    }
    check_special();
    check_unaligned();
    /* no kernels for I32 or unknown ids, and none for a path the CPU lacks */
    for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
        CHECK(kiln_cpu_vec_dot(KILN_DTYPE_I32, p) == NULL);
        CHECK(kiln_cpu_vec_dot((kiln_dtype)3, p) == NULL);
        if (!kiln_simd_supported(p)) CHECK(kiln_cpu_vec_dot(KILN_DTYPE_F32, p) == NULL);
    }
    printf("%d perturbed inputs all rejected by the check\n", n_perturbed);
    printf("worst |err| / tolerance: scalar-vs-double %.4f, avx2-vs-scalar %.4f, "
           "avx512-vs-scalar %.4f\n",
           worst_ratio[0], worst_ratio[1], worst_ratio[2]);
    return kiln_test_finish("test_vec_dot_paths");
}
