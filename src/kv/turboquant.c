/* turboquant.c - TurboQuant KV rows (turboquant.h; arXiv 2504.19874). */
#include "kv/turboquant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct kiln_turbo {
    int32_t d;
    int32_t log2d;
    kiln_turbo_spec spec;
    int32_t m; /* codebook bits: bits - qjl */
    int32_t K; /* 2^m centroids */
    float inv_sqrt_d;
    float qjl_coef; /* sqrt(pi/2) / d */
    float centroid[1 << KILN_TURBO_MAX_BITS];
    float bound[1 << KILN_TURBO_MAX_BITS]; /* K - 1 midpoints between neighbouring centroids */
    float *sign;                           /* [d] +-1 */
    float *S;                              /* [d][d] N(0,1), row-major; NULL without QJL */
};

/* ---- config ---------------------------------------------------------------------------- */

kiln_turbo_config kiln_turbo_config_default(void) {
    kiln_turbo_config c = {{8, false}, {3, false}};
    return c;
}

bool kiln_turbo_spec_valid(kiln_turbo_spec s) {
    return s.bits >= 1 && s.bits <= KILN_TURBO_MAX_BITS;
}

bool kiln_turbo_is_config(const char *text) {
    return text && strncmp(text, "turbo", 5) == 0 && (text[5] == '\0' || text[5] == ':');
}

/* One side "k8", "v3q" at *p: letter, 1-2 digits, optional 'q'. */
static kiln_status parse_side(const char *opt, const char *text, const char **p, char letter,
                              kiln_turbo_spec *out, kiln_error *err) {
    const char *s = *p;
    const char up = (char)(letter - 'a' + 'A');
    if (*s != letter) {
        if (*s == '\0')
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': missing the %c part (expected e.g. turbo:k8v3)", opt,
                                  text, up);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: '%s': expected '%c' at '%s' (expected e.g. turbo:k8v3)", opt,
                              text, letter, s);
    }
    s++;
    const char *d0 = s;
    int v = 0, nd = 0;
    while (*s >= '0' && *s <= '9') {
        if (nd < 3) v = v * 10 + (*s - '0');
        nd++;
        s++;
    }
    if (nd == 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: '%s': %c bits missing after '%c' (a number in 1..%d)", opt, text,
                              up, letter, KILN_TURBO_MAX_BITS);
    if (nd > 2 || v < 1 || v > KILN_TURBO_MAX_BITS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: '%s': %c bits '%.*s' are not in 1..%d", opt, text, up,
                              nd > 8 ? 8 : nd, d0, KILN_TURBO_MAX_BITS);
    bool q = false;
    if (*s == 'q') {
        q = true;
        s++;
    }
    out->bits = v;
    out->qjl = q;
    *p = s;
    return KILN_OK;
}

kiln_status kiln_turbo_config_parse(const char *option, const char *text, kiln_turbo_config *out,
                                    kiln_error *err) {
    const char *opt = option ? option : "kv type";
    if (!text || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: no TurboQuant config given",
                              opt);
    if (!kiln_turbo_is_config(text))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: '%.64s' is not a TurboQuant config (turbo or turbo:kBvB)", opt,
                              text);
    if (text[5] == '\0') {
        *out = kiln_turbo_config_default();
        return KILN_OK;
    }
    const char *p = text + 6;
    kiln_turbo_config c;
    kiln_status st = parse_side(opt, text, &p, 'k', &c.k, err);
    if (st) return st;
    st = parse_side(opt, text, &p, 'v', &c.v, err);
    if (st) return st;
    if (*p != '\0')
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: '%.64s': unexpected '%.32s' after the V part", opt, text, p);
    *out = c;
    return KILN_OK;
}

int kiln_turbo_config_name(const kiln_turbo_config *c, char *buf, size_t cap) {
    if (!c || !kiln_turbo_spec_valid(c->k) || !kiln_turbo_spec_valid(c->v)) return -1;
    return snprintf(buf, cap, "turbo:k%d%sv%d%s", (int)c->k.bits, c->k.qjl ? "q" : "",
                    (int)c->v.bits, c->v.qjl ? "q" : "");
}

bool kiln_turbo_head_dim_valid(int32_t d) {
    return d >= KILN_TURBO_MIN_HEAD_DIM && d <= KILN_TURBO_MAX_HEAD_DIM && (d & (d - 1)) == 0;
}

size_t kiln_turbo_head_bytes(int32_t d, kiln_turbo_spec s) {
    if (!kiln_turbo_head_dim_valid(d) || !kiln_turbo_spec_valid(s)) return 0;
    const size_t m = (size_t)(s.bits - (s.qjl ? 1 : 0));
    return 4 + (s.qjl ? 4 : 0) + m * (size_t)d / 8 + (s.qjl ? (size_t)d / 8 : 0);
}

double kiln_turbo_bits_per_element(int32_t d, kiln_turbo_spec s) {
    const size_t b = kiln_turbo_head_bytes(d, s);
    return b ? 8.0 * (double)b / (double)d : 0.0;
}

/* ---- seeded draws ---------------------------------------------------------------------- */

static uint64_t mix64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static double normal_at(uint64_t seed, uint64_t k) {
    const double u1 = ((double)(mix64(seed, 2 * k) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    const double u2 = (double)(mix64(seed, 2 * k + 1) >> 11) * 0x1p-53;     /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---- Lloyd-Max codebook ---------------------------------------------------------------- */

enum { GRID = 1 << 17 };

typedef struct grid {
    double L, h;
    double *F, *M; /* [GRID + 1] cumulative mass and first moment from -L */
} grid;

static double grid_at(const grid *g, const double *C, double a) {
    double u = (a + g->L) / g->h;
    if (u <= 0) return C[0];
    if (u >= GRID) return C[GRID];
    int64_t i = (int64_t)u;
    if (i >= GRID) i = GRID - 1;
    const double fr = u - (double)i;
    return C[i] + fr * (C[i + 1] - C[i]);
}

static double cell_mean(const grid *g, double a, double b) {
    const double w = grid_at(g, g->F, b) - grid_at(g, g->F, a);
    if (!(w > 1e-300)) return 0.5 * (a + b);
    return (grid_at(g, g->M, b) - grid_at(g, g->M, a)) / w;
}

static double density(double x, double e) {
    const double one = 1 - x * x;
    return one > 0 ? exp(e * log(one)) : 0.0;
}

/* one Lloyd sweep: nc[k] = the mean of centroid k's cell (boundaries at midpoints), kept
 * symmetric (the density is even) */
static void lloyd_sweep(const grid *g, int32_t K, const double *c, double *nc) {
    double lo = -g->L;
    for (int32_t k = 0; k < K; k++) {
        const double hi = k + 1 < K ? 0.5 * (c[k] + c[k + 1]) : g->L;
        nc[k] = cell_mean(g, lo, hi);
        lo = hi;
    }
    for (int32_t k = 0; k < K / 2; k++) {
        const double s = 0.5 * (nc[K - 1 - k] - nc[k]);
        nc[k] = -s;
        nc[K - 1 - k] = s;
    }
}

/* centroids c[K] (double) of the Lloyd-Max quantizer for one coordinate of a uniform unit
 * vector in R^d. Returns false on allocation failure. */
static bool lloyd_max(int32_t d, int32_t K, double *c) {
    if (K == 1) {
        c[0] = 0;
        return true;
    }
    grid g;
    g.L = 12.0 / sqrt((double)d);
    if (g.L > 1) g.L = 1;
    g.h = 2 * g.L / GRID;
    g.F = malloc(sizeof(double) * (GRID + 1));
    g.M = malloc(sizeof(double) * (GRID + 1));
    double *G = malloc(sizeof(double) * (GRID + 1));
    if (!g.F || !g.M || !G) {
        free(g.F);
        free(g.M);
        free(G);
        return false;
    }
    const double e = 0.5 * (double)(d - 3);
    double fp = 0, xp = -g.L, cp = 0;
    g.F[0] = g.M[0] = G[0] = 0;
    for (int64_t i = 0; i <= GRID; i++) {
        const double x = -g.L + (double)i * g.h;
        const double f = density(x, e);
        const double cr = cbrt(f);
        if (i > 0) {
            g.F[i] = g.F[i - 1] + 0.5 * g.h * (f + fp);
            g.M[i] = g.M[i - 1] + 0.5 * g.h * (f * x + fp * xp);
            G[i] = G[i - 1] + 0.5 * g.h * (cr + cp);
        }
        fp = f;
        xp = x;
        cp = cr;
    }
    const double Ft = g.F[GRID], Gt = G[GRID];
    for (int64_t i = 0; i <= GRID; i++) {
        g.F[i] /= Ft;
        g.M[i] /= Ft;
    }
    /* companding start: centroid k at the (k + 1/2)/K quantile of f^(1/3) */
    int64_t i = 0;
    for (int32_t k = 0; k < K; k++) {
        const double target = ((double)k + 0.5) / K * Gt;
        while (i < GRID && G[i + 1] < target) i++;
        const double span = G[i + 1] - G[i];
        const double fr = span > 0 ? (target - G[i]) / span : 0.5;
        c[k] = -g.L + ((double)i + fr) * g.h;
    }
    free(G);
    /* Lloyd sweeps from the companding start, then Newton steps on c = T(c) (T: each centroid
     * to its cell's mean), whose Jacobian is tridiagonal: for a cell [a, b] of mass P and mean
     * mu, d mu / d b = f(b) (b - mu) / P and d mu / d a = f(a) (mu - a) / P, and each inner
     * boundary is the midpoint of its two centroids. Plain Lloyd converges in O(K^2) sweeps
     * (20000 sweeps leave the 256-level book ~2e-5 from its fixed point); Newton ends it in a
     * few steps. A Newton step that does not reduce the residual is replaced by a sweep. */
    const double norm_f = Ft;
    double nc[1 << KILN_TURBO_MAX_BITS], res = 0;
    for (int it = 0; it < 20000; it++) {
        lloyd_sweep(&g, K, c, nc);
        res = 0;
        for (int32_t k = 0; k < K; k++) {
            const double dm = fabs(nc[k] - c[k]);
            if (dm > res) res = dm;
            c[k] = nc[k];
        }
        if (res < 1e-14 || it >= 200) break;
    }
    for (int it = 0; it < 100 && res >= 1e-14; it++) {
        double lo_d[1 << KILN_TURBO_MAX_BITS], di[1 << KILN_TURBO_MAX_BITS],
            up[1 << KILN_TURBO_MAX_BITS], rhs[1 << KILN_TURBO_MAX_BITS],
            trial[1 << KILN_TURBO_MAX_BITS];
        lloyd_sweep(&g, K, c, nc);
        for (int32_t k = 0; k < K; k++) {
            const double a = k > 0 ? 0.5 * (c[k - 1] + c[k]) : -g.L;
            const double b = k + 1 < K ? 0.5 * (c[k] + c[k + 1]) : g.L;
            const double P = grid_at(&g, g.F, b) - grid_at(&g, g.F, a);
            const double mu = nc[k];
            const double da = k > 0 && P > 1e-300 ? density(a, e) / norm_f * (mu - a) / P : 0;
            const double db = k + 1 < K && P > 1e-300 ? density(b, e) / norm_f * (b - mu) / P : 0;
            /* (I - J) delta = T(c) - c */
            lo_d[k] = -0.5 * da;
            up[k] = -0.5 * db;
            di[k] = 1 - 0.5 * (da + db);
            rhs[k] = mu - c[k];
        }
        for (int32_t k = 1; k < K; k++) { /* Thomas algorithm */
            const double w = lo_d[k] / di[k - 1];
            di[k] -= w * up[k - 1];
            rhs[k] -= w * rhs[k - 1];
        }
        trial[K - 1] = rhs[K - 1] / di[K - 1];
        for (int32_t k = K - 2; k >= 0; k--) trial[k] = (rhs[k] - up[k] * trial[k + 1]) / di[k];
        bool okk = true;
        for (int32_t k = 0; k < K; k++) {
            trial[k] += c[k];
            if (!isfinite(trial[k]) || trial[k] <= -g.L || trial[k] >= g.L ||
                (k > 0 && trial[k] <= trial[k - 1]))
                okk = false;
        }
        double tres = INFINITY;
        if (okk) {
            lloyd_sweep(&g, K, trial, nc);
            tres = 0;
            for (int32_t k = 0; k < K; k++)
                if (fabs(nc[k] - trial[k]) > tres) tres = fabs(nc[k] - trial[k]);
        }
        if (okk && tres < res) {
            memcpy(c, trial, sizeof(double) * (size_t)K);
            res = tres;
        } else { /* fall back to one sweep */
            lloyd_sweep(&g, K, c, nc);
            res = 0;
            for (int32_t k = 0; k < K; k++) {
                if (fabs(nc[k] - c[k]) > res) res = fabs(nc[k] - c[k]);
                c[k] = nc[k];
            }
        }
    }
    free(g.F);
    free(g.M);
    return true;
}

/* ---- create / shared ------------------------------------------------------------------- */

kiln_status kiln_turbo_create(int32_t head_dim, kiln_turbo_spec s, uint64_t seed, kiln_turbo **out,
                              kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "turboquant: out is NULL");
    if (!kiln_turbo_head_dim_valid(head_dim))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "turboquant: head_dim %d is not a power of two in %d..%d (the "
                              "Walsh-Hadamard rotation needs one)",
                              (int)head_dim, KILN_TURBO_MIN_HEAD_DIM, KILN_TURBO_MAX_HEAD_DIM);
    if (!kiln_turbo_spec_valid(s))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "turboquant: %d bits are not in 1..%d", (int)s.bits,
                              KILN_TURBO_MAX_BITS);
    kiln_turbo *t = calloc(1, sizeof *t);
    if (!t) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "turboquant: out of memory");
    t->d = head_dim;
    while ((1 << t->log2d) < head_dim) t->log2d++;
    t->spec = s;
    t->m = s.bits - (s.qjl ? 1 : 0);
    t->K = 1 << t->m;
    t->inv_sqrt_d = (float)(1.0 / sqrt((double)head_dim));
    t->qjl_coef = (float)(sqrt(M_PI / 2) / (double)head_dim);
    t->sign = malloc(sizeof(float) * (size_t)head_dim);
    if (s.qjl) t->S = malloc(sizeof(float) * (size_t)head_dim * (size_t)head_dim);
    double c[1 << KILN_TURBO_MAX_BITS];
    if (!t->sign || (s.qjl && !t->S) || !lloyd_max(head_dim, t->K, c)) {
        kiln_turbo_destroy(t);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "turboquant: out of memory");
    }
    for (int32_t k = 0; k < t->K; k++) t->centroid[k] = (float)c[k];
    for (int32_t k = 0; k + 1 < t->K; k++)
        t->bound[k] = 0.5f * (t->centroid[k] + t->centroid[k + 1]);
    const uint64_t sseed = seed ^ UINT64_C(0x5349474e);
    for (int32_t i = 0; i < head_dim; i++)
        t->sign[i] = (mix64(sseed, (uint64_t)i) & 1) ? -1.0f : 1.0f;
    if (s.qjl) {
        const uint64_t qseed = seed ^ UINT64_C(0x514a4c);
        for (int64_t k = 0; k < (int64_t)head_dim * head_dim; k++)
            t->S[k] = (float)normal_at(qseed, (uint64_t)k);
    }
    *out = t;
    return KILN_OK;
}

void kiln_turbo_destroy(kiln_turbo *t) {
    if (!t) return;
    free(t->sign);
    free(t->S);
    free(t);
}

static pthread_mutex_t g_shared_mu = PTHREAD_MUTEX_INITIALIZER;
static kiln_turbo *g_shared[8][KILN_TURBO_MAX_BITS + 1][2]; /* [log2 d - 3][bits][qjl] */

const kiln_turbo *kiln_turbo_shared(int32_t head_dim, kiln_turbo_spec s) {
    if (!kiln_turbo_head_dim_valid(head_dim) || !kiln_turbo_spec_valid(s)) return NULL;
    int l = 0;
    while ((1 << l) < head_dim) l++;
    kiln_turbo **slot = &g_shared[l - 3][s.bits][s.qjl ? 1 : 0];
    pthread_mutex_lock(&g_shared_mu);
    if (!*slot) {
        kiln_turbo *t = NULL;
        if (kiln_turbo_create(head_dim, s, KILN_TURBO_SEED, &t, NULL) == KILN_OK) *slot = t;
    }
    kiln_turbo *r = *slot;
    pthread_mutex_unlock(&g_shared_mu);
    return r;
}

int32_t kiln_turbo_head_dim(const kiln_turbo *t) {
    return t->d;
}
kiln_turbo_spec kiln_turbo_get_spec(const kiln_turbo *t) {
    return t->spec;
}
int32_t kiln_turbo_codebook(const kiln_turbo *t, const float **centroids) {
    if (centroids) *centroids = t->centroid;
    return t->m;
}
int32_t kiln_turbo_work_floats(const kiln_turbo *t) {
    return t->spec.qjl ? 2 * t->d : t->d;
}

/* ---- rotation -------------------------------------------------------------------------- */

/* in-place unnormalized fast Walsh-Hadamard transform (Sylvester order) */
static void fwht(float *x, int32_t d) {
    for (int32_t h = 1; h < d; h *= 2)
        for (int32_t i = 0; i < d; i += 2 * h)
            for (int32_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void kiln_turbo_rotate(const kiln_turbo *t, const float *x, float *y) {
    const int32_t d = t->d;
    for (int32_t i = 0; i < d; i++) y[i] = x[i] * t->sign[i];
    fwht(y, d);
    for (int32_t i = 0; i < d; i++) y[i] *= t->inv_sqrt_d;
}

void kiln_turbo_unrotate(const kiln_turbo *t, const float *y, float *x) {
    const int32_t d = t->d;
    if (x != y) memcpy(x, y, sizeof(float) * (size_t)d);
    fwht(x, d);
    for (int32_t i = 0; i < d; i++) x[i] = x[i] * t->inv_sqrt_d * t->sign[i];
}

/* ---- rows ------------------------------------------------------------------------------ */

static void put_f32(unsigned char *p, float v) {
    memcpy(p, &v, 4);
}
static float get_f32(const unsigned char *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

static uint32_t nearest(const kiln_turbo *t, float y) {
    uint32_t lo = 0;
    for (int32_t step = t->K / 2; step >= 1; step /= 2)
        if (y > t->bound[lo + (uint32_t)step - 1]) lo += (uint32_t)step;
    return lo;
}

void kiln_turbo_quantize(const kiln_turbo *t, const float *x, void *row) {
    const int32_t d = t->d, m = t->m;
    unsigned char *p = row;
    float y[KILN_TURBO_MAX_HEAD_DIM];
    double ss = 0;
    for (int32_t i = 0; i < d; i++) ss += (double)x[i] * (double)x[i];
    const float norm = (float)sqrt(ss);
    put_f32(p, norm);
    p += 4;
    unsigned char *gp = NULL;
    if (t->spec.qjl) {
        gp = p;
        p += 4;
    }
    unsigned char *codes = p, *signs = p + (size_t)m * d / 8;
    if (!(norm > 0)) { /* zero (or NaN) row: codes and signs 0 */
        if (gp) put_f32(gp, 0);
        memset(codes, 0, (size_t)m * d / 8 + (t->spec.qjl ? (size_t)d / 8 : 0));
        return;
    }
    kiln_turbo_rotate(t, x, y);
    const float inv = 1.0f / norm;
    for (int32_t i = 0; i < d; i++) y[i] *= inv;
    if (m > 0) {
        for (int32_t g = 0; g < d / 8; g++) {
            uint64_t w = 0;
            for (int32_t i = 0; i < 8; i++) w |= (uint64_t)nearest(t, y[g * 8 + i]) << (i * m);
            for (int32_t b = 0; b < m; b++) codes[g * m + b] = (unsigned char)(w >> (8 * b));
        }
    }
    if (t->spec.qjl) {
        float r[KILN_TURBO_MAX_HEAD_DIM];
        double rs = 0;
        for (int32_t i = 0; i < d; i++) {
            r[i] = y[i] - t->centroid[m > 0 ? nearest(t, y[i]) : 0];
            rs += (double)r[i] * (double)r[i];
        }
        put_f32(gp, (float)sqrt(rs));
        memset(signs, 0, (size_t)d / 8);
        for (int32_t i = 0; i < d; i++) {
            const float *Si = t->S + (size_t)i * d;
            float acc = 0;
            for (int32_t j = 0; j < d; j++) acc += Si[j] * r[j];
            if (acc >= 0) signs[i / 8] |= (unsigned char)(1u << (i % 8));
        }
    }
}

void kiln_turbo_decode_rotated(const kiln_turbo *t, const void *row, float *yr, float *zr) {
    const int32_t d = t->d, m = t->m;
    const unsigned char *p = row;
    const float norm = get_f32(p);
    p += 4;
    float gamma = 0;
    if (t->spec.qjl) {
        gamma = get_f32(p);
        p += 4;
    }
    const unsigned char *codes = p, *signs = p + (size_t)m * d / 8;
    if (m == 0) {
        for (int32_t i = 0; i < d; i++) yr[i] = 0;
    } else if (m == 8) {
        for (int32_t i = 0; i < d; i++) yr[i] = norm * t->centroid[codes[i]];
    } else {
        const uint64_t mask = (UINT64_C(1) << m) - 1;
        for (int32_t g = 0; g < d / 8; g++) {
            uint64_t w = 0;
            for (int32_t b = 0; b < m; b++) w |= (uint64_t)codes[g * m + b] << (8 * b);
            for (int32_t i = 0; i < 8; i++)
                yr[g * 8 + i] = norm * t->centroid[(w >> (i * m)) & mask];
        }
    }
    if (t->spec.qjl && zr) {
        const float ng = norm * gamma;
        for (int32_t i = 0; i < d; i++) zr[i] = (signs[i / 8] >> (i % 8)) & 1 ? ng : -ng;
    }
}

void kiln_turbo_dequantize(const kiln_turbo *t, const void *row, float *x) {
    float acc[2 * KILN_TURBO_MAX_HEAD_DIM];
    kiln_turbo_decode_rotated(t, row, acc, acc + t->d);
    kiln_turbo_finish(t, acc, x);
}

void kiln_turbo_prepare_query(const kiln_turbo *t, const float *q, float *qp) {
    const int32_t d = t->d;
    kiln_turbo_rotate(t, q, qp);
    if (!t->spec.qjl) return;
    for (int32_t i = 0; i < d; i++) {
        const float *Si = t->S + (size_t)i * d;
        float acc = 0;
        for (int32_t j = 0; j < d; j++) acc += Si[j] * qp[j];
        qp[d + i] = t->qjl_coef * acc;
    }
}

float kiln_turbo_dot_f32(const float *a, const float *b, int32_t n) {
    float s = 0.0f;
    for (int32_t j = 0; j < n; j++) s = fmaf(a[j], b[j], s);
    return s;
}

float kiln_turbo_dot(const kiln_turbo *t, const float *qp, const void *row) {
    float dec[2 * KILN_TURBO_MAX_HEAD_DIM];
    kiln_turbo_decode_rotated(t, row, dec, dec + t->d);
    return kiln_turbo_dot_f32(dec, qp, kiln_turbo_work_floats(t));
}

int32_t kiln_turbo_dtype_of(kiln_turbo_spec s) {
    if (!kiln_turbo_spec_valid(s)) return -1;
    return KILN_KV_TURBO_DTYPE_BASE + 2 * (s.bits - 1) + (s.qjl ? 1 : 0);
}

bool kiln_turbo_spec_of_dtype(int32_t id, kiln_turbo_spec *s) {
    if (id < KILN_KV_TURBO_DTYPE_BASE || id >= KILN_KV_TURBO_DTYPE_END) return false;
    if (s) {
        s->bits = (id - KILN_KV_TURBO_DTYPE_BASE) / 2 + 1;
        s->qjl = (id - KILN_KV_TURBO_DTYPE_BASE) % 2 != 0;
    }
    return true;
}

void kiln_turbo_accumulate(const kiln_turbo *t, float w, const void *row, float *acc) {
    const int32_t d = t->d;
    float yr[KILN_TURBO_MAX_HEAD_DIM], zr[KILN_TURBO_MAX_HEAD_DIM];
    kiln_turbo_decode_rotated(t, row, yr, zr);
    for (int32_t i = 0; i < d; i++) acc[i] = fmaf(w, yr[i], acc[i]);
    if (t->spec.qjl)
        for (int32_t i = 0; i < d; i++) acc[d + i] = fmaf(w, zr[i], acc[i + d]);
}

void kiln_turbo_finish(const kiln_turbo *t, const float *acc, float *out) {
    const int32_t d = t->d;
    float y[KILN_TURBO_MAX_HEAD_DIM];
    memcpy(y, acc, sizeof(float) * (size_t)d);
    if (t->spec.qjl) {
        const float *a2 = acc + d;
        for (int32_t j = 0; j < d; j++) {
            float s = 0;
            for (int32_t i = 0; i < d; i++) s += t->S[(size_t)i * d + j] * a2[i];
            y[j] += t->qjl_coef * s;
        }
    }
    kiln_turbo_unrotate(t, y, out);
}
