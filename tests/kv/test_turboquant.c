/*
 * test_turboquant - TurboQuant KV rows (kv/turboquant.h) against the paper (arXiv 2504.19874):
 *  - the rotation is orthogonal (norms, round trip and Gram matrix to 1e-6);
 *  - the Lloyd-Max codebooks: b=1 against the closed form E|X| of the coordinate density, b=2
 *    and b=3 at d=1024 against Max's (1960) Gaussian tables (what the paper quotes for b=1,2);
 *  - measured MSE distortion E||x - x~||^2 of unit vectors per bit width b=1..4 against the
 *    paper's Theorem 1 figures (0.36, 0.117, 0.03, 0.009: within 20% of the rounded figure)
 *    and between its lower bound 4^-b (Theorem 3) and upper bound sqrt(3) pi/2 4^-b;
 *  - measured inner-product distortion of TurboQuant_prod against Theorem 2's figures
 *    (1.57/d, 0.56/d, 0.18/d, 0.047/d, within 25%) and its bounds;
 *  - the QJL estimator is unbiased: over fresh seeds, the mean error of q . x~ is within 4
 *    standard errors of 0, while the MSE-only quantizer's (shrinkage) bias is beyond 10;
 *  - round trips: stored norm, nearest-centroid codes, relative error bounds, zero rows, and the
 *    rotated-domain dot / accumulate equal the dequantized arithmetic;
 *  - the config parser: valid and invalid texts, messages naming the option and the bad part,
 *    and a random-string robustness loop (parse -> name -> parse is the identity).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/turboquant.h"
#include "test.h"

static uint64_t rng_state = 0x1234567u;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((double)(rng_state >> 11) + 0.5) * 0x1p-53;
}
static double nrand(void) {
    return sqrt(-2.0 * log(urand())) * cos(2.0 * M_PI * urand());
}
static void unit_vec(float *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) {
        x[i] = (float)nrand();
        s += (double)x[i] * x[i];
    }
    const double inv = 1.0 / sqrt(s);
    for (int i = 0; i < d; i++) x[i] = (float)(x[i] * inv);
}
static double dotd(const float *a, const float *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)a[i] * b[i];
    return s;
}

static kiln_turbo *mk(int d, int bits, bool qjl, uint64_t seed) {
    kiln_turbo *t = NULL;
    kiln_turbo_spec s = {bits, qjl};
    kiln_error e = {0};
    kiln_status st = kiln_turbo_create(d, s, seed, &t, &e);
    if (st != KILN_OK) fprintf(stderr, "create(%d, %d, %d): %s\n", d, bits, qjl, e.message);
    REQUIRE(st == KILN_OK && t);
    return t;
}

static void test_rotation(void) {
    const int dims[] = {8, 16, 64, 128, 1024};
    float x[1024], y[1024], z[1024];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int d = dims[di];
        kiln_turbo *t = mk(d, 3, false, 7 + di);
        double worst_norm = 0, worst_rt = 0;
        for (int r = 0; r < 200; r++) {
            const double scale = pow(10.0, -3 + 6 * urand());
            for (int i = 0; i < d; i++) x[i] = (float)(nrand() * scale);
            kiln_turbo_rotate(t, x, y);
            kiln_turbo_unrotate(t, y, z);
            const double nx = sqrt(dotd(x, x, d)), ny = sqrt(dotd(y, y, d));
            double e2 = 0;
            for (int i = 0; i < d; i++) e2 += (double)(z[i] - x[i]) * (z[i] - x[i]);
            if (fabs(ny - nx) / nx > worst_norm) worst_norm = fabs(ny - nx) / nx;
            if (sqrt(e2) / nx > worst_rt) worst_rt = sqrt(e2) / nx;
        }
        CHECKF(worst_norm < 1e-6, "d=%d: rotation changes a norm by %.3g relative", d, worst_norm);
        CHECKF(worst_rt < 1e-6, "d=%d: unrotate(rotate(x)) off by %.3g relative", d, worst_rt);
        /* Gram matrix of the rotated basis (d <= 128 to keep it quick) */
        if (d <= 128) {
            static float cols[128][128];
            for (int j = 0; j < d; j++) {
                memset(x, 0, sizeof(float) * d);
                x[j] = 1;
                kiln_turbo_rotate(t, x, cols[j]);
            }
            double worst = 0;
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) {
                    const double g = dotd(cols[a], cols[b], d) - (a == b ? 1.0 : 0.0);
                    if (fabs(g) > worst) worst = fabs(g);
                }
            CHECKF(worst < 1e-6, "d=%d: rotated basis not orthonormal (%.3g)", d, worst);
        }
        printf("rotation d=%4d: max |norm change| %.2e, max round trip %.2e\n", d, worst_norm,
               worst_rt);
        kiln_turbo_destroy(t);
    }
}

static void test_codebooks(void) {
    /* b = 1: the optimal 1-bit quantizer of a symmetric density is +-E|X| */
    const int dims[] = {8, 64, 128, 1024};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int d = dims[di];
        kiln_turbo *t = mk(d, 1, false, 1);
        const float *c;
        REQUIRE(kiln_turbo_codebook(t, &c) == 1);
        /* E|X| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) for f(x) ~ (1-x^2)^((d-3)/2) */
        const double ea = exp(lgamma(d / 2.0) - lgamma((d + 1) / 2.0)) / sqrt(M_PI);
        CHECKF(fabs(c[1] - ea) / ea < 1e-5 && c[0] == -c[1], "d=%d: 1-bit centroid %.8f, E|X| %.8f",
               d, c[1], ea);
        kiln_turbo_destroy(t);
    }
    /* Max (1960), Table I: Gaussian N = 4 and N = 8 output levels (unit variance) */
    const double max4[] = {0.4528, 1.510};
    const double max8[] = {0.2451, 0.7560, 1.344, 2.152};
    for (int b = 2; b <= 3; b++) {
        kiln_turbo *t = mk(1024, b, false, 1);
        const float *c;
        REQUIRE(kiln_turbo_codebook(t, &c) == b);
        const int K = 1 << b;
        for (int k = 0; k < K / 2; k++) {
            const double got = c[K / 2 + k] * sqrt(1024.0), want = b == 2 ? max4[k] : max8[k];
            CHECKF(fabs(got - want) < 3e-3, "b=%d level %d: %.4f vs Max %.4f", b, k, got, want);
        }
        kiln_turbo_destroy(t);
    }
    /* every codebook ascending and symmetric */
    for (int b = 1; b <= 8; b++) {
        kiln_turbo *t = mk(64, b, false, 1);
        const float *c;
        kiln_turbo_codebook(t, &c);
        const int K = 1 << b;
        for (int k = 0; k + 1 < K; k++) CHECKF(c[k] < c[k + 1], "b=%d not ascending at %d", b, k);
        for (int k = 0; k < K; k++) CHECKF(c[k] == -c[K - 1 - k], "b=%d not symmetric at %d", b, k);
        kiln_turbo_destroy(t);
    }
}

/* E ||x - x~||^2 over n random unit vectors */
static double mse_distortion(kiln_turbo *t, int n) {
    const int d = kiln_turbo_head_dim(t);
    float x[1024], xr[1024];
    unsigned char row[2048];
    double s = 0;
    for (int r = 0; r < n; r++) {
        unit_vec(x, d);
        kiln_turbo_quantize(t, x, row);
        kiln_turbo_dequantize(t, row, xr);
        for (int i = 0; i < d; i++) s += (double)(x[i] - xr[i]) * (x[i] - xr[i]);
    }
    return s / n;
}

static void test_mse_distortion(void) {
    const double paper[] = {0.36, 0.117, 0.03, 0.009}; /* Theorem 1, b = 1..4 */
    const int dims[] = {64, 128};
    for (size_t di = 0; di < 2; di++) {
        const int d = dims[di];
        for (int b = 1; b <= 8; b++) {
            kiln_turbo *t = mk(d, b, false, KILN_TURBO_SEED);
            const double D = mse_distortion(t, 4000);
            const double lo = pow(4.0, -b), hi = sqrt(3.0) * M_PI / 2 * pow(4.0, -b);
            if (b <= 4)
                printf("D_mse d=%d b=%d: %.3e (paper %.3g, bounds [%.3e, %.3e])\n", d, b, D,
                       paper[b - 1], lo, hi);
            else
                printf("D_mse d=%d b=%d: %.3e (bounds [%.3e, %.3e])\n", d, b, D, lo, hi);
            CHECKF(D >= lo && D <= hi, "d=%d b=%d: D_mse %.5f outside [%.5f, %.5f]", d, b, D, lo,
                   hi);
            if (b <= 4)
                CHECKF(fabs(D - paper[b - 1]) <= 0.2 * paper[b - 1],
                       "d=%d b=%d: D_mse %.5f vs paper %.3g", d, b, D, paper[b - 1]);
            kiln_turbo_destroy(t);
        }
    }
}

static void test_prod_distortion(void) {
    const double paper[] = {1.57, 0.56, 0.18, 0.047}; /* Theorem 2, times ||y||^2 / d */
    const int d = 128, n = 4000;
    float x[128], y[128], qp[256];
    unsigned char row[512];
    for (int b = 1; b <= 4; b++) {
        kiln_turbo *t = mk(d, b, true, KILN_TURBO_SEED);
        double s = 0;
        for (int r = 0; r < n; r++) {
            unit_vec(x, d);
            unit_vec(y, d);
            kiln_turbo_quantize(t, x, row);
            kiln_turbo_prepare_query(t, y, qp);
            const double e = kiln_turbo_dot(t, qp, row) - dotd(x, y, d);
            s += e * e;
        }
        const double D = s / n * d; /* in units of ||y||^2 / d */
        const double lo = pow(4.0, -b), hi = sqrt(3.0) * M_PI * M_PI * pow(4.0, -b);
        printf("D_prod d=%d b=%d: %.4f/d (paper %.3g/d, bounds [%.4f, %.4f]/d)\n", d, b, D,
               paper[b - 1], lo, hi);
        CHECKF(D >= lo && D <= hi, "b=%d: D_prod %.4f/d outside bounds", b, D);
        CHECKF(fabs(D - paper[b - 1]) <= 0.25 * paper[b - 1], "b=%d: D_prod %.4f/d vs paper %.3g/d",
               b, D, paper[b - 1]);
        kiln_turbo_destroy(t);
    }
}

/* mean error of q . x~ for correlated pairs (y = x + noise, so <x, y> ~ 1), each seed a fresh
 * quantizer; returns mean and its standard error over seeds */
static void bias(int d, int bits, bool qjl, int seeds, int pairs, double *mean, double *se) {
    float x[128], y[128], qp[256];
    unsigned char row[512];
    double sum = 0, sum2 = 0;
    for (int s = 0; s < seeds; s++) {
        kiln_turbo *t = mk(d, bits, qjl, 1000 + (uint64_t)s * 7919);
        double m = 0;
        for (int p = 0; p < pairs; p++) {
            unit_vec(x, d);
            unit_vec(y, d);
            for (int i = 0; i < d; i++) y[i] = x[i] + 0.5f * y[i];
            kiln_turbo_quantize(t, x, row);
            kiln_turbo_prepare_query(t, y, qp);
            m += kiln_turbo_dot(t, qp, row) - dotd(x, y, d);
        }
        m /= pairs;
        sum += m;
        sum2 += m * m;
        kiln_turbo_destroy(t);
    }
    *mean = sum / seeds;
    const double var = (sum2 - sum * sum / seeds) / (seeds - 1);
    *se = sqrt(var / seeds);
}

static void test_qjl_unbiased(void) {
    for (int bits = 1; bits <= 3; bits++) {
        double m, se;
        bias(64, bits, true, 300, 16, &m, &se);
        printf("QJL b=%d: mean error of q.x~ %.2e, standard error %.2e (%.2f SE)\n", bits, m, se,
               m / se);
        CHECKF(fabs(m) <= 4 * se, "b=%d QJL: mean error %.3g is %.1f standard errors from 0", bits,
               m, m / se);
    }
    /* the MSE quantizer alone shrinks: the same test sees its bias */
    double m, se;
    bias(64, 2, false, 300, 16, &m, &se);
    printf("MSE-only b=2: mean error %.2e, standard error %.2e (%.1f SE)\n", m, se, m / se);
    CHECKF(m < -10 * se, "MSE-only b=2: expected a clear negative bias, got %.3g (%.1f SE)", m,
           m / se);
}

static void test_round_trip(void) {
    const int d = 64;
    float x[64], xr[64], y[64], yr[64], zr[64], q[64], qp[128], acc[128], out[64], ref[64];
    unsigned char row[256];
    const double bound[] = {0.68, 0.17, 0.0425, 0.0106, 2.7e-3, 6.7e-4, 1.7e-4, 4.2e-5};
    for (int bits = 1; bits <= 8; bits++)
        for (int qjl = 0; qjl <= 1; qjl++) {
            kiln_turbo *t = mk(d, bits, qjl, KILN_TURBO_SEED);
            const kiln_turbo_spec sp = {bits, qjl};
            REQUIRE(kiln_turbo_head_bytes(d, sp) <= sizeof row);
            const float *c;
            const int m = kiln_turbo_codebook(t, &c);
            double worst = 0, worst_dot = 0, worst_acc = 0;
            int bad_code = 0, bad_norm = 0;
            memset(acc, 0, sizeof acc);
            memset(ref, 0, sizeof ref);
            for (int i = 0; i < d; i++) q[i] = (float)nrand();
            kiln_turbo_prepare_query(t, q, qp);
            for (int r = 0; r < 500; r++) {
                const double scale = pow(10.0, -3 + 6 * urand());
                unit_vec(x, d);
                for (int i = 0; i < d; i++) x[i] = (float)(x[i] * scale);
                memset(row, 0xa5, sizeof row);
                kiln_turbo_quantize(t, x, row);
                float nstored;
                memcpy(&nstored, row, 4);
                if (fabsf(nstored - (float)sqrt(dotd(x, x, d))) > 0) bad_norm++;
                kiln_turbo_dequantize(t, row, xr);
                double e2 = 0;
                for (int i = 0; i < d; i++) e2 += (double)(x[i] - xr[i]) * (x[i] - xr[i]);
                const double rel2 = e2 / dotd(x, x, d);
                if (rel2 > worst) worst = rel2;
                /* codes are the nearest centroids of the rotated unit row */
                kiln_turbo_rotate(t, x, y);
                kiln_turbo_decode_rotated(t, row, yr, zr);
                for (int i = 0; i < d; i++) {
                    const float u = y[i] * (1.0f / nstored);
                    int best = 0;
                    for (int k = 1; k < (1 << m); k++)
                        if (fabsf(u - c[k]) < fabsf(u - c[best])) best = k;
                    if (yr[i] != nstored * c[best] &&
                        fabsf(u - c[best]) + 1e-6f < fabsf(u - yr[i] / nstored))
                        bad_code++;
                }
                /* rotated-domain dot == q . dequantized row */
                const double dq = dotd(q, xr, d), dr = kiln_turbo_dot(t, qp, row);
                const double de = fabs(dq - dr) / (sqrt(dotd(q, q, d)) * scale);
                if (de > worst_dot) worst_dot = de;
                const float w = (float)urand();
                kiln_turbo_accumulate(t, w, row, acc);
                for (int i = 0; i < d; i++) ref[i] += w * xr[i];
            }
            kiln_turbo_finish(t, acc, out);
            for (int i = 0; i < d; i++) {
                const double e = fabs(out[i] - ref[i]) / (1e-3 + fabs(ref[i]));
                if (e > worst_acc) worst_acc = e;
            }
            /* loose stated bounds: 20x Theorem 1's mean bound per row (a row with one outlying
             * coordinate lands in a wide outer cell), 40x with the QJL residual, 5 for pure QJL */
            const double lim = m == 0 ? 5.0 : bound[m - 1] * (qjl ? 40 : 20);
            CHECKF(worst <= lim, "b=%d qjl=%d: worst relative squared error %.3g > %.3g", bits, qjl,
                   worst, lim);
            CHECKF(bad_norm == 0, "b=%d qjl=%d: %d stored norms differ", bits, qjl, bad_norm);
            CHECKF(bad_code == 0, "b=%d qjl=%d: %d codes not the nearest centroid", bits, qjl,
                   bad_code);
            CHECKF(worst_dot < 1e-4, "b=%d qjl=%d: rotated dot vs dequantized dot %.3g", bits, qjl,
                   worst_dot);
            CHECKF(worst_acc < 1e-3, "b=%d qjl=%d: accumulate/finish vs sum %.3g", bits, qjl,
                   worst_acc);
            printf(
                "round trip b=%d%s: worst |x-x~|^2/|x|^2 %.3g (limit %.3g), dot %.1e, acc %.1e\n",
                bits, qjl ? "q" : " ", worst, lim, worst_dot, worst_acc);
            /* zero row */
            memset(x, 0, sizeof x);
            kiln_turbo_quantize(t, x, row);
            kiln_turbo_dequantize(t, row, xr);
            for (int i = 0; i < d; i++) CHECK(xr[i] == 0);
            CHECK(kiln_turbo_dot(t, qp, row) == 0);
            kiln_turbo_destroy(t);
        }
}

static void test_head_dims(void) {
    kiln_turbo *t = NULL;
    kiln_error e = {0};
    const kiln_turbo_spec s = {3, false};
    CHECK(kiln_turbo_create(96, s, 1, &t, &e) == KILN_ERR_INVALID_ARGUMENT && !t);
    CHECK(strstr(e.message, "head_dim 96") != NULL);
    CHECK(kiln_turbo_create(4, s, 1, &t, &e) == KILN_ERR_INVALID_ARGUMENT && !t);
    CHECK(kiln_turbo_create(2048, s, 1, &t, &e) == KILN_ERR_INVALID_ARGUMENT && !t);
    const kiln_turbo_spec b9 = {9, false};
    CHECK(kiln_turbo_create(64, b9, 1, &t, &e) == KILN_ERR_INVALID_ARGUMENT && !t);
    CHECK(kiln_turbo_head_bytes(96, s) == 0);
    CHECK(kiln_turbo_head_bytes(64, s) == 4 + 24);
    const kiln_turbo_spec k4q = {4, true};
    CHECK(kiln_turbo_head_bytes(64, k4q) == 8 + 24 + 8);
    CHECK(kiln_turbo_shared(64, s) == kiln_turbo_shared(64, s) && kiln_turbo_shared(64, s));
    CHECK(kiln_turbo_shared(96, s) == NULL);
    kiln_turbo_destroy(NULL);
}

static void test_parser(void) {
    struct {
        const char *text;
        int kb, kq, vb, vq;
    } ok[] = {{"turbo", 8, 0, 3, 0},       {"turbo:k8v3", 8, 0, 3, 0},
              {"turbo:k4v4", 4, 0, 4, 0},  {"turbo:k3v2", 3, 0, 2, 0},
              {"turbo:k4qv3", 4, 1, 3, 0}, {"turbo:k4qv4q", 4, 1, 4, 1},
              {"turbo:k1qv1", 1, 1, 1, 0}, {"turbo:k08v3", 8, 0, 3, 0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        kiln_turbo_config c;
        kiln_error e = {0};
        CHECKF(kiln_turbo_config_parse("--kv-type", ok[i].text, &c, &e) == KILN_OK, "%s: %s",
               ok[i].text, e.message);
        CHECKF(c.k.bits == ok[i].kb && c.k.qjl == ok[i].kq && c.v.bits == ok[i].vb &&
                   c.v.qjl == ok[i].vq,
               "%s parsed wrong", ok[i].text);
    }
    struct {
        const char *text, *must;
    } bad[] = {{"turbo:", "missing the K part"},
               {"turbo:k9v3", "K bits '9'"},
               {"turbo:k0v3", "K bits '0'"},
               {"turbo:k8v", "V bits missing"},
               {"turbo:k8", "missing the V part"},
               {"turbo:kv3", "K bits missing"},
               {"turbo:v3k8", "expected 'k' at 'v3k8'"},
               {"turbo:k8v3x", "unexpected 'x'"},
               {"turbo:k8qqv3", "expected 'v' at 'qv3'"},
               {"turbo:k123v3", "K bits '123'"},
               {"turbo:k8v33", "V bits '33'"},
               {"turbo:K8V3", "expected 'k' at 'K8V3'"},
               {"turbox", "not a TurboQuant config"},
               {"q8_0", "not a TurboQuant config"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_turbo_config c = {{77, 0}, {77, 0}};
        kiln_error e = {0};
        CHECKF(kiln_turbo_config_parse("--kv-type-k", bad[i].text, &c, &e) ==
                   KILN_ERR_INVALID_ARGUMENT,
               "'%s' accepted", bad[i].text);
        CHECKF(strstr(e.message, "--kv-type-k") && strstr(e.message, bad[i].must),
               "'%s': message '%s' lacks '%s'", bad[i].text, e.message, bad[i].must);
        CHECK(c.k.bits == 77); /* untouched */
    }
    char buf[64];
    const kiln_turbo_config c = {{4, true}, {3, false}};
    CHECK(kiln_turbo_config_name(&c, buf, sizeof buf) == 11 && strcmp(buf, "turbo:k4qv3") == 0);
    const kiln_turbo_config dflt = kiln_turbo_config_default();
    CHECK(kiln_turbo_config_name(&dflt, buf, sizeof buf) > 0 && strcmp(buf, "turbo:k8v3") == 0);
    /* robustness: random strings over the grammar's alphabet */
    const char alpha[] = "turbo:kvq0123456789x";
    int accepted = 0;
    for (int it = 0; it < 200000; it++) {
        char s[40];
        if (urand() < 0.5) { /* near-valid: a well-formed config, then up to 2 mutations */
            snprintf(s, sizeof s, "turbo:k%d%sv%d%s", (int)(urand() * 11), urand() < 0.3 ? "q" : "",
                     (int)(urand() * 11), urand() < 0.3 ? "q" : "");
            const int len = (int)strlen(s);
            for (int mu = (int)(urand() * 3); mu > 0; mu--)
                s[(int)(urand() * len)] = alpha[(int)(urand() * (sizeof alpha - 1))];
        } else {
            int n = (int)(urand() * 20);
            int i = 0;
            if (urand() < 0.7) {
                memcpy(s, "turbo:", 6);
                i = 6;
            }
            for (; i < n; i++) s[i] = alpha[(int)(urand() * (sizeof alpha - 1))];
            s[i > n ? i : n] = '\0';
        }
        kiln_turbo_config a, b;
        kiln_error e = {0};
        if (kiln_turbo_config_parse("--kv-type", s, &a, &e) == KILN_OK) {
            accepted++;
            CHECK(kiln_turbo_spec_valid(a.k) && kiln_turbo_spec_valid(a.v));
            REQUIRE(kiln_turbo_config_name(&a, buf, sizeof buf) > 0);
            CHECK(kiln_turbo_config_parse(NULL, buf, &b, NULL) == KILN_OK);
            CHECK(a.k.bits == b.k.bits && a.k.qjl == b.k.qjl && a.v.bits == b.v.bits &&
                  a.v.qjl == b.v.qjl);
        } else {
            CHECKF(strstr(e.message, "--kv-type") != NULL, "'%s': '%s'", s, e.message);
        }
    }
    printf("parser robustness: %d of 200000 random texts accepted\n", accepted);
    CHECK(accepted > 0);
}

int main(void) {
    test_head_dims();
    test_parser();
    test_rotation();
    test_codebooks();
    test_round_trip();
    test_mse_distortion();
    test_prod_distortion();
    test_qjl_unbiased();
    return kiln_test_finish("test_turboquant");
}
