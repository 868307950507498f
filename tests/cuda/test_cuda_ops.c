/*
 * test_cuda_ops - every operation of the CUDA backend against the CPU backend's, through the
 * operations table (backend/backend.h), on random inputs (issue 16, first milestone). Each
 * op runs on both contexts with the same inputs and the outputs are compared element by
 * element within a stated bound:
 *   - elementwise (add, add_bias, copy, zero, split_heads, gather_rows, embed, kv_write):
 *     bitwise equal;
 *   - elementwise with libm functions (act, glu, softcap, gate_sigmoid, rope): |gpu - cpu| <=
 *     1e-5 |cpu| + 1e-6 (the absolute term covers the cancellation in 1 + erf, 1 + tanh and
 *     a rotated pair's sum; libdevice and glibc differ by up to 2 ulp);
 *   - norms (a reduction in another order): 1e-5 |cpu| + 1e-6;
 *   - matmul: against a double-precision reference (not the CPU's), |gpu - ref| <=
 *     1e-5 sum_k |w x| + 1e-6, the bound tests/cpu/test_matmul_invariance uses; and the
 *     largest difference to the CPU's is printed; Q8_0 / Q4_0 weights likewise against the
 *     double reference over their dequantized values, and their embedding rows bitwise;
 *   - attention: |gpu - cpu| <= c max|v| with c = 1e-5 for f32 pages, 2e-3 for f16 and 1.6e-2
 *     for bf16 pages (a probability that lands on the other side of an f16 / bf16 rounding
 *     boundary moves the output by one ulp of that format).
 * Batch invariance on the GPU, bitwise: matmul rows computed alone, in a batch of 33 and at
 * another offset; attention of one decode token alone and among three other sequences.
 * Without a GPU the test prints "skipped: no CUDA device" and exits 77.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_kernels.h"
#include "device_test.h"
#include "kv/kv_format.h"
#include "kv/kv_pool.h"
#include "model/config.h"
#include "tensor/dtype.h"
#include "test.h"

static kiln_backend *cpu, *gpu;
static uint64_t rng = 0x1234567887654321ull;

static float uni(void) { /* [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_floats(size_t n, float scale) {
    float *p = malloc(n * sizeof *p);
    REQUIRE(p);
    for (size_t i = 0; i < n; i++) p[i] = uni() * scale;
    return p;
}

static void *dput(const void *h, size_t bytes) {
    void *d = NULL;
    kiln_error err = {0};
    REQUIRE(gpu->ops->buf_alloc(gpu, bytes ? bytes : 4, &d, &err) == KILN_OK);
    if (h && bytes) gpu->ops->upload(gpu, d, h, bytes);
    return d;
}

static float *dget(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    REQUIRE(h);
    gpu->ops->download(gpu, h, d, n * sizeof *h);
    return h;
}

static void dfree(void *d) {
    gpu->ops->buf_free(gpu, d);
}

/* Compare gpu against want elementwise: |g - w| <= rel |w| + abs_tol (0, 0: bitwise). Returns
 * the largest |g - w| / (rel |w| + abs_tol): the fraction of the bound used (0 for bitwise). */
static double cmp(const char *what, const float *g, const float *w, size_t n, double rel,
                  double abs_tol) {
    double worst = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)g[i] - (double)w[i]);
        const bool ok = rel == 0.0 && abs_tol == 0.0 ? memcmp(&g[i], &w[i], sizeof(float)) == 0
                                                     : d <= rel * fabs((double)w[i]) + abs_tol;
        if (!ok && bad++ < 3)
            fprintf(stderr, "%s: element %zu: gpu %.9g, cpu %.9g\n", what, i, g[i], w[i]);
        const double lim = rel * fabs((double)w[i]) + abs_tol;
        const double r = lim > 0 ? d / lim : (d > 0 ? INFINITY : 0.0);
        if (!(r <= worst)) worst = r;
    }
    CHECKF(bad == 0, "%s: %zu of %zu elements outside the bound", what, bad, n);
    return worst;
}

/* ---- elementwise ------------------------------------------------------------------------- */

static void test_elementwise(void) {
    const int64_t n = 4099;
    float *x = rand_floats(n, 4.0f), *y = rand_floats(n, 4.0f);
    float *dx = dput(x, n * 4), *dy = dput(y, n * 4);
    float *c = malloc(n * sizeof *c);
    REQUIRE(c);
    double worst = 0.0;

    /* add */
    memcpy(c, y, n * 4);
    cpu->ops->add(cpu, c, x, n);
    gpu->ops->add(gpu, dy, dx, n);
    float *g = dget(dy, n);
    cmp("add", g, c, n, 0, 0);
    free(g);

    /* add_bias: 31 rows of 129 (+ 10 extra elements untouched) */
    memcpy(c, x, n * 4);
    gpu->ops->upload(gpu, dx, x, n * 4);
    float *bias = rand_floats(129, 1.0f), *dbias = dput(bias, 129 * 4);
    cpu->ops->add_bias(cpu, c, bias, 31, 129);
    gpu->ops->add_bias(gpu, dx, dbias, 31, 129);
    g = dget(dx, n);
    cmp("add_bias", g, c, n, 0, 0);
    free(g);

    /* act and glu, every kind */
    for (int act = 0; act < 3; act++) {
        char what[64];
        memcpy(c, x, n * 4);
        gpu->ops->upload(gpu, dx, x, n * 4);
        cpu->ops->act(cpu, c, n, act);
        gpu->ops->act(gpu, dx, n, act);
        g = dget(dx, n);
        snprintf(what, sizeof what, "act %d", act);
        double r = cmp(what, g, c, n, 1e-5, 1e-6);
        if (r > worst) worst = r;
        free(g);
        memcpy(c, x, n * 4);
        gpu->ops->upload(gpu, dx, x, n * 4);
        gpu->ops->upload(gpu, dy, y, n * 4);
        cpu->ops->glu(cpu, c, y, n, act);
        gpu->ops->glu(gpu, dx, dy, n, act);
        g = dget(dx, n);
        snprintf(what, sizeof what, "glu %d", act);
        r = cmp(what, g, c, n, 1e-5, 1e-6);
        if (r > worst) worst = r;
        free(g);
    }

    /* softcap (inputs up to 200 against a cap of 30) and the sigmoid gate */
    for (int64_t i = 0; i < n; i++) c[i] = x[i] * 50.0f;
    gpu->ops->upload(gpu, dx, c, n * 4);
    cpu->ops->softcap(cpu, c, n, 30.0f);
    gpu->ops->softcap(gpu, dx, n, 30.0f);
    g = dget(dx, n);
    worst = fmax(worst, cmp("softcap", g, c, n, 1e-5, 1e-6));
    free(g);
    memcpy(c, x, n * 4);
    gpu->ops->upload(gpu, dx, x, n * 4);
    gpu->ops->upload(gpu, dy, y, n * 4);
    cpu->ops->gate_sigmoid(cpu, c, y, n);
    gpu->ops->gate_sigmoid(gpu, dx, dy, n);
    g = dget(dx, n);
    worst = fmax(worst, cmp("gate_sigmoid", g, c, n, 1e-5, 1e-6));
    free(g);

    /* split_heads: 5 rows of 3 heads of [12 | 12] */
    const int32_t rows = 5, heads = 3, hd = 12;
    const int64_t half = (int64_t)rows * heads * hd;
    float *ca = malloc(half * 4), *cb = malloc(half * 4);
    REQUIRE(ca && cb);
    gpu->ops->upload(gpu, dx, x, n * 4);
    float *da = dput(NULL, half * 4), *db = dput(NULL, half * 4);
    cpu->ops->split_heads(cpu, ca, cb, x, rows, heads, hd);
    gpu->ops->split_heads(gpu, da, db, dx, rows, heads, hd);
    g = dget(da, half);
    cmp("split_heads a", g, ca, half, 0, 0);
    free(g);
    g = dget(db, half);
    cmp("split_heads b", g, cb, half, 0, 0);
    free(g);

    /* zero, copy, gather_rows */
    gpu->ops->zero(gpu, da, half);
    g = dget(da, half);
    int nz = 0;
    for (int64_t i = 0; i < half; i++) nz += g[i] != 0.0f || signbit(g[i]);
    CHECKF(nz == 0, "zero: %d elements not +0", nz);
    free(g);
    gpu->ops->copy(gpu, da, dx, half);
    g = dget(da, half);
    cmp("copy", g, x, half, 0, 0);
    free(g);
    const int32_t rl[5] = {4, 0, 4, 2, 30};
    const int64_t d = 33;
    float *cg = malloc(5 * d * 4);
    REQUIRE(cg);
    cpu->ops->gather_rows(cpu, cg, x, rl, 5, d);
    gpu->ops->gather_rows(gpu, da, dx, rl, 5, d);
    g = dget(da, 5 * d);
    cmp("gather_rows", g, cg, 5 * d, 0, 0);
    free(g);
    printf("elementwise: bitwise where exact; act/glu/softcap/gate at most %.3g of the bound "
           "(1e-5 |cpu| + 1e-6)\n", worst);

    free(cg);
    free(ca);
    free(cb);
    dfree(da);
    dfree(db);
    free(bias);
    dfree(dbias);
    free(x);
    free(y);
    free(c);
    dfree(dx);
    dfree(dy);
}

/* ---- norms ------------------------------------------------------------------------------- */

static void test_norms(void) {
    const int64_t dims[] = {1, 7, 64, 256, 1000, 4096};
    double worst = 0.0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int64_t d = dims[di];
        const int32_t rows = 3;
        float *x = rand_floats((size_t)rows * d, 3.0f), *w = rand_floats(d, 1.0f),
              *b = rand_floats(d, 1.0f);
        float *dx = dput(x, rows * d * 4), *dw = dput(w, d * 4), *db = dput(b, d * 4),
              *dout = dput(NULL, rows * d * 4);
        float *c = malloc(rows * d * 4);
        REQUIRE(c);
        for (int kind = 0; kind < 2; kind++)
            for (int with = 0; with < 2; with++) {
                if (kind == KILN_BE_NORM_LAYER && !with) continue; /* LayerNorm needs w */
                const float *wc = with || kind ? w : NULL, *bc = kind && with ? b : NULL;
                const float *wg = with || kind ? dw : NULL, *bg = kind && with ? db : NULL;
                cpu->ops->norm(cpu, c, x, wc, bc, rows, d, kind, 1e-5f);
                gpu->ops->norm(gpu, dout, dx, wg, bg, rows, d, kind, 1e-5f);
                float *g = dget(dout, rows * d);
                char what[64];
                snprintf(what, sizeof what, "%s d=%lld%s", kind ? "layernorm" : "rmsnorm",
                         (long long)d, with ? " w" : "");
                double r = cmp(what, g, c, rows * d, 1e-5, 1e-6);
                if (r > worst) worst = r;
                free(g);
            }
        /* in place (out == x) */
        memcpy(c, x, rows * d * 4);
        cpu->ops->norm(cpu, c, c, w, NULL, rows, d, KILN_BE_NORM_RMS, 1e-6f);
        gpu->ops->norm(gpu, dx, dx, dw, NULL, rows, d, KILN_BE_NORM_RMS, 1e-6f);
        float *g = dget(dx, rows * d);
        cmp("rmsnorm in place", g, c, rows * d, 1e-5, 1e-6);
        free(g);
        free(x);
        free(w);
        free(b);
        free(c);
        dfree(dx);
        dfree(dw);
        dfree(db);
        dfree(dout);
    }
    /* head_rmsnorm: 4 rows of stride 100, 3 heads of 24 */
    const int32_t rows = 4, heads = 3, hd = 24;
    const int64_t stride = 100;
    float *x = rand_floats(rows * stride, 2.0f), *w = rand_floats(hd, 1.0f);
    float *dx = dput(x, rows * stride * 4), *dw = dput(w, hd * 4);
    cpu->ops->head_rmsnorm(cpu, x, rows, stride, heads, hd, w, 1e-6f);
    gpu->ops->head_rmsnorm(gpu, dx, rows, stride, heads, hd, dw, 1e-6f);
    float *g = dget(dx, rows * stride);
    double r = cmp("head_rmsnorm", g, x, rows * stride, 1e-5, 1e-6);
    if (r > worst) worst = r;
    printf("norms: at most %.3g of the bound (1e-5 |cpu| + 1e-6)\n", worst);
    free(g);
    free(x);
    free(w);
    dfree(dx);
    dfree(dw);
}

/* ---- steps: a batch of sequences, its block tables, both contexts' step_begin ------------- */

enum { BS = 16, N_BLOCKS = 128, SEQ_BLOCKS = 16, MAX_TOK = 256, MAX_KEYS = 4096 };

typedef struct step_fix {
    kiln_batch b;
    kiln_batch_seq seqs[8];
    int32_t tokens[MAX_TOK];
    int32_t tok_seq[MAX_TOK], tok_pos[MAX_TOK];
    int32_t tables[8][MAX_KEYS / BS];
    kiln_step st;
} step_fix;

/* seqs of (n_past, n_new); sequence s's table is the same in every step: entries
 * s * SEQ_BLOCKS .. of a fixed shuffle of the pool's ids (distinct for up to SEQ_BLOCKS blocks
 * per sequence) */
static void make_step(step_fix *f, int n, const int32_t (*shape)[2], int32_t n_vocab) {
    memset(f, 0, sizeof *f);
    int32_t next = 0, max_keys = 0;
    static int32_t perm[N_BLOCKS];
    for (int32_t i = 0; i < N_BLOCKS; i++) perm[i] = (i * 29 + 7) % N_BLOCKS; /* 29 is odd */
    REQUIRE(n * SEQ_BLOCKS <= N_BLOCKS);
    for (int s = 0; s < n; s++) {
        kiln_batch_seq *q = &f->seqs[s];
        q->n_past = shape[s][0];
        q->n_new = shape[s][1];
        q->first = next;
        q->n_blocks = kiln_kv_blocks_for_tokens(q->n_past + q->n_new, BS);
        REQUIRE(q->n_blocks <= MAX_KEYS / BS);
        /* past SEQ_BLOCKS blocks the ids repeat: only steps that read no KV (rope, embed) go
         * that far */
        for (int32_t i = 0; i < q->n_blocks; i++)
            f->tables[s][i] = perm[(s * SEQ_BLOCKS + i) % N_BLOCKS];
        q->block_table = f->tables[s];
        for (int32_t j = 0; j < q->n_new; j++) {
            f->tokens[next + j] = (s * 131 + j * 7 + 3) % n_vocab;
            f->tok_seq[next + j] = s;
            f->tok_pos[next + j] = q->n_past + j;
        }
        next += q->n_new;
        if (q->n_past + q->n_new > max_keys) max_keys = q->n_past + q->n_new;
    }
    f->b = (kiln_batch){next, f->tokens, n, f->seqs, 0, NULL};
    f->st = (kiln_step){&f->b, next, f->tok_seq, f->tok_pos, max_keys, 0};
    kiln_error err = {0};
    REQUIRE(cpu->ops->step_begin(cpu, &f->st, &err) == KILN_OK);
    REQUIRE(gpu->ops->step_begin(gpu, &f->st, &err) == KILN_OK);
}

/* ---- rope and embed ----------------------------------------------------------------------- */

static void test_rope(void) {
    const int32_t shape[2][2] = {{0, 5}, {3000, 3}};
    step_fix f;
    make_step(&f, 2, shape, 100);
    const int32_t n = f.st.n_tokens;
    const struct { int32_t heads, hd, rot; int adjacent; } cases[] = {
        {4, 64, 64, 0}, {4, 64, 64, 1}, {3, 64, 32, 0}, {2, 8, 8, 1}, {8, 128, 128, 0}};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int64_t stride = (int64_t)cases[k].heads * cases[k].hd + 5;
        float *x = rand_floats(n * stride, 1.0f), *inv = malloc(cases[k].rot / 2 * 4);
        REQUIRE(inv);
        for (int32_t j = 0; j < cases[k].rot / 2; j++)
            inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)cases[k].rot);
        float *dx = dput(x, n * stride * 4), *dinv = dput(inv, cases[k].rot / 2 * 4);
        cpu->ops->rope(cpu, x, stride, cases[k].heads, cases[k].hd, cases[k].rot, inv,
                       cases[k].adjacent, &f.st);
        gpu->ops->rope(gpu, dx, stride, cases[k].heads, cases[k].hd, cases[k].rot, dinv,
                       cases[k].adjacent, &f.st);
        float *g = dget(dx, n * stride);
        char what[64];
        snprintf(what, sizeof what, "rope case %zu", k);
        double r = cmp(what, g, x, n * stride, 1e-5, 1e-6);
        if (r > worst) worst = r;
        free(g);
        free(x);
        free(inv);
        dfree(dx);
        dfree(dinv);
    }
    printf("rope: at most %.3g of the bound (1e-5 |cpu| + 1e-6; positions up to 3002)\n", worst);
}

static void test_embed(void) {
    const int32_t shape[2][2] = {{0, 9}, {3000, 4}};
    step_fix f;
    const int32_t n_vocab = 50, n_pos = 3010;
    const int64_t d = 37;
    make_step(&f, 2, shape, n_vocab);
    const int32_t n = f.st.n_tokens;
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    float *pe = rand_floats((size_t)n_pos * d, 1.0f);
    float *dpe = dput(pe, (size_t)n_pos * d * 4);
    for (size_t ti = 0; ti < 3; ti++) {
        const kiln_dtype t = types[ti];
        const size_t rs = kiln_dtype_row_size(t, d);
        uint8_t *tab = malloc(rs * n_vocab);
        REQUIRE(tab);
        for (int64_t i = 0; i < n_vocab * d; i++) {
            const float v = uni();
            if (t == KILN_DTYPE_F32) ((float *)tab)[i] = v;
            else if (t == KILN_DTYPE_F16) ((uint16_t *)tab)[i] = kiln_fp32_to_fp16(v);
            else ((uint16_t *)tab)[i] = kiln_fp32_to_bf16(v);
        }
        void *dtab = dput(tab, rs * n_vocab);
        const kiln_mat hm = {tab, t, n_vocab, d, "tok", 0}, gm = {dtab, t, n_vocab, d, "tok", 0};
        const kiln_mat hp = {pe, KILN_DTYPE_F32, n_pos, d, "pos", 0},
                       gp = {dpe, KILN_DTYPE_F32, n_pos, d, "pos", 0};
        float *c = malloc(n * d * 4), *cs = malloc(n * d * 4), *dout = dput(NULL, n * d * 4),
              *dscr = dput(NULL, n * d * 4);
        REQUIRE(c && cs);
        for (int v = 0; v < 2; v++) {
            const float scale = v ? 8.0f : 1.0f;
            cpu->ops->embed(cpu, c, cs, &hm, v ? &hp : NULL, scale, &f.st);
            gpu->ops->embed(gpu, dout, dscr, &gm, v ? &gp : NULL, scale, &f.st);
            float *g = dget(dout, n * d);
            char what[64];
            snprintf(what, sizeof what, "embed %s%s", kiln_dtype_name(t), v ? " scaled+pos" : "");
            cmp(what, g, c, n * d, 0, 0);
            free(g);
        }
        free(tab);
        free(c);
        free(cs);
        dfree(dtab);
        dfree(dout);
        dfree(dscr);
    }
    free(pe);
    dfree(dpe);
    printf("embed: f32, f16, bf16 tables, scale and learned positions: bitwise\n");
}

/* ---- matmul -------------------------------------------------------------------------------- */

static double elem_of(kiln_dtype t, const void *row, int64_t k) {
    if (t == KILN_DTYPE_F16) return kiln_fp16_to_fp32(((const uint16_t *)row)[k]);
    if (t == KILN_DTYPE_BF16) return kiln_bf16_to_fp32(((const uint16_t *)row)[k]);
    return ((const float *)row)[k];
}

static void test_matmul(void) {
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    const int64_t shapes[][2] = {{1, 1},      {5, 3},      {64, 64},  {172, 64}, {256, 768},
                                 {1000, 257}, {67, 515},   {300, 1000}, {40, 4104}};
    /* up to KILN_CU_TC_STREAM_MAX_TOK rows the tensor-core path streams, above it tiles */
    const int32_t ntoks[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 130, 300};
    const bool tc = getenv("KILN_CUDA_TC") && !strcmp(getenv("KILN_CUDA_TC"), "1");
    double worst_cpu = 0.0, worst_ref = 0.0;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const kiln_dtype t = types[ti];
            const int64_t n_out = shapes[si][0], n_in = shapes[si][1];
            const size_t rs = kiln_dtype_row_size(t, n_in);
            uint8_t *w = malloc(rs * n_out);
            REQUIRE(w);
            for (int64_t i = 0; i < n_out * n_in; i++) {
                const float v = uni();
                if (t == KILN_DTYPE_F32) ((float *)w)[i] = v;
                else if (t == KILN_DTYPE_F16) ((uint16_t *)w)[i] = kiln_fp32_to_fp16(v);
                else ((uint16_t *)w)[i] = kiln_fp32_to_bf16(v);
            }
            const int32_t MT = 300 + 5;
            float *x = rand_floats((size_t)MT * n_in, 1.0f);
            /* the tensor cores' B operand: x rounded to the weights' type (cuda_kernels.h
             * kiln_cu_matmul_tc); the double reference takes the same x */
            const bool rnd = tc && t != KILN_DTYPE_F32 && n_in % 8 == 0;
            float *xr = malloc((size_t)MT * n_in * sizeof *xr);
            REQUIRE(xr);
            for (size_t i = 0; i < (size_t)MT * n_in; i++)
                xr[i] = !rnd ? x[i]
                        : t == KILN_DTYPE_F16 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(x[i]))
                                              : kiln_bf16_to_fp32(kiln_fp32_to_bf16(x[i]));
            void *dw = dput(w, rs * n_out);
            float *dx = dput(x, (size_t)MT * n_in * 4), *dy = dput(NULL, (size_t)MT * n_out * 4);
            const kiln_mat hm = {w, t, n_out, n_in, "w", 0}, gm = {dw, t, n_out, n_in, "w", 0};
            float *c = malloc((size_t)MT * n_out * 4);
            REQUIRE(c);
            /* each row alone on the GPU: the invariance reference */
            float *alone = malloc((size_t)MT * n_out * 4);
            REQUIRE(alone);
            for (int32_t r = 0; r < MT; r++) {
                const kiln_mm mm = {&gm, dy + (size_t)r * n_out};
                gpu->ops->matmul(gpu, &mm, 1, dx + (size_t)r * n_in, 1);
            }
            float *g1 = dget(dy, (size_t)MT * n_out);
            memcpy(alone, g1, (size_t)MT * n_out * 4);
            free(g1);
            for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++) {
                const int32_t nt = ntoks[ni];
                const kiln_mm hmm = {&hm, c}, gmm = {&gm, dy};
                cpu->ops->matmul(cpu, &hmm, 1, x, nt);
                gpu->ops->matmul(gpu, &gmm, 1, dx, nt);
                float *g = dget(dy, (size_t)nt * n_out);
                char what[96];
                snprintf(what, sizeof what, "matmul %s %lldx%lld n_tok %d", kiln_dtype_name(t),
                         (long long)n_out, (long long)n_in, nt);
                int bad_ref = 0, bad_inv = 0;
                for (int32_t r = 0; r < nt; r++)
                    for (int64_t o = 0; o < n_out; o++) {
                        double ref = 0.0, S = 0.0;
                        for (int64_t k = 0; k < n_in; k++) {
                            const double p = elem_of(t, w + rs * o, k) * (double)xr[r * n_in + k];
                            ref += p;
                            S += fabs(p);
                        }
                        const double gv = g[r * n_out + o], cv = c[r * n_out + o];
                        if (!(fabs(gv - ref) <= 1e-5 * S + 1e-6) && bad_ref++ < 3)
                            fprintf(stderr, "%s (%d, %lld): gpu %.9g, reference %.9g\n", what, r,
                                    (long long)o, gv, ref);
                        const double e = fabs(gv - ref) / (S > 0 ? S : 1.0);
                        if (e > worst_ref) worst_ref = e;
                        const double ec = fabs(gv - cv) / (S > 0 ? S : 1.0);
                        if (ec > worst_cpu) worst_cpu = ec;
                        if (memcmp(&g[r * n_out + o], &alone[r * n_out + o], 4) != 0) bad_inv++;
                    }
                CHECKF(bad_ref == 0, "%s: %d outputs beyond 1e-5 sum|w x| + 1e-6 of the double "
                                     "reference", what, bad_ref);
                CHECKF(bad_inv == 0, "%s: %d outputs differ from the same row computed alone",
                       what, bad_inv);
                free(g);
            }
            /* rows 5 .. 37 and 5 .. 304 as one batch: the same bits at another offset */
            for (int32_t nb = 33; nb <= 300; nb += 267) {
                const kiln_mm gmm = {&gm, dy};
                gpu->ops->matmul(gpu, &gmm, 1, dx + 5 * n_in, nb);
                float *g = dget(dy, (size_t)nb * n_out);
                CHECKF(memcmp(g, alone + 5 * n_out, (size_t)nb * n_out * 4) == 0,
                       "matmul %s %lldx%lld: rows 5..%d as a batch differ from each alone",
                       kiln_dtype_name(t), (long long)n_out, (long long)n_in, 4 + nb);
                free(g);
            }
            free(w);
            free(x);
            free(xr);
            free(c);
            free(alone);
            dfree(dw);
            dfree(dx);
            dfree(dy);
        }
    /* several outputs in one call: each gets the bits of its own call */
    {
        const int64_t n_in = 96;
        float *w1 = rand_floats(40 * n_in, 1.0f), *w2 = rand_floats(24 * n_in, 1.0f),
              *x = rand_floats(5 * n_in, 1.0f);
        float *d1 = dput(w1, 40 * n_in * 4), *d2 = dput(w2, 24 * n_in * 4),
              *dx = dput(x, 5 * n_in * 4), *y1 = dput(NULL, 5 * 40 * 4),
              *y2 = dput(NULL, 5 * 24 * 4), *z = dput(NULL, 5 * 40 * 4);
        const kiln_mat m1 = {d1, KILN_DTYPE_F32, 40, n_in, "w1", 0},
                       m2 = {d2, KILN_DTYPE_F32, 24, n_in, "w2", 0};
        const kiln_mm two[2] = {{&m1, y1}, {&m2, y2}}, one = {&m1, z};
        gpu->ops->matmul(gpu, two, 2, dx, 5);
        gpu->ops->matmul(gpu, &one, 1, dx, 5);
        float *a = dget(y1, 5 * 40), *b = dget(z, 5 * 40);
        CHECK(memcmp(a, b, 5 * 40 * 4) == 0);
        free(a);
        free(b);
        free(w1);
        free(w2);
        free(x);
        dfree(d1);
        dfree(d2);
        dfree(dx);
        dfree(y1);
        dfree(y2);
        dfree(z);
    }
    printf("matmul: largest |gpu - double ref| / sum|w x| = %.3g (bound 1e-5; f16 / bf16 weights: "
           "%s), |gpu - cpu| / sum|w x| = %.3g; rows bitwise equal alone, in batches of 2..300 "
           "and at an offset\n",
           worst_ref, tc ? "x rounded to their type in the reference, the tensor cores' operand"
                         : "x in f32",
           worst_cpu);
}

/* ---- Q8_0 / Q4_0 weights ------------------------------------------------------------------ */

/* n random weights in [-1, 1) as dtype t (f32, f16, bf16; Q8_0 / Q4_0 by tensor/dtype.c's
 * reference quantizer, n % 32 == 0) into w */
static void rand_weights(kiln_dtype t, void *w, int64_t n) {
    float *f = rand_floats((size_t)n, 1.0f);
    if (t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0)
        kiln_dtype_traits_of(t)->from_float(f, w, n);
    else
        for (int64_t i = 0; i < n; i++) {
            if (t == KILN_DTYPE_F32) ((float *)w)[i] = f[i];
            else if (t == KILN_DTYPE_F16) ((uint16_t *)w)[i] = kiln_fp32_to_fp16(f[i]);
            else ((uint16_t *)w)[i] = kiln_fp32_to_bf16(f[i]);
        }
    free(f);
}

/* the token embedding from Q8_0 / Q4_0 tables: bitwise the CPU's (dtype.c to_float, then the
 * scale) */
static void test_embed_quant(void) {
    const int32_t shape[2][2] = {{0, 9}, {40, 4}};
    step_fix f;
    const int32_t n_vocab = 50;
    const int64_t d = 96;
    make_step(&f, 2, shape, n_vocab);
    const int32_t n = f.st.n_tokens;
    const kiln_dtype types[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    for (size_t ti = 0; ti < 2; ti++) {
        const kiln_dtype t = types[ti];
        const size_t rs = kiln_dtype_row_size(t, d);
        uint8_t *tab = malloc(rs * n_vocab);
        REQUIRE(tab);
        rand_weights(t, tab, (int64_t)n_vocab * d);
        void *dtab = dput(tab, rs * n_vocab);
        const kiln_mat hm = {tab, t, n_vocab, d, "tok", 0}, gm = {dtab, t, n_vocab, d, "tok", 0};
        float *c = malloc(n * d * 4), *cs = malloc(n * d * 4), *dout = dput(NULL, n * d * 4),
              *dscr = dput(NULL, n * d * 4);
        REQUIRE(c && cs);
        for (int v = 0; v < 2; v++) {
            const float scale = v ? 8.0f : 1.0f;
            cpu->ops->embed(cpu, c, cs, &hm, NULL, scale, &f.st);
            gpu->ops->embed(gpu, dout, dscr, &gm, NULL, scale, &f.st);
            float *g = dget(dout, n * d);
            char what[64];
            snprintf(what, sizeof what, "embed %s%s", kiln_dtype_name(t), v ? " scaled" : "");
            cmp(what, g, c, n * d, 0, 0);
            free(g);
        }
        free(tab);
        free(c);
        free(cs);
        dfree(dtab);
        dfree(dout);
        dfree(dscr);
    }
    printf("embed: q8_0, q4_0 tables: bitwise the CPU's\n");
}

/* Q8_0 / Q4_0 weights: against a double reference over the dequantized weights (dtype.c
 * to_float; exact in f32), |gpu - ref| <= 1e-5 sum|w x| + 1e-6; each row bitwise the same row
 * computed alone, in batches of 2..130 and at an offset; several weights in one call each
 * bitwise their own call. n_in % 256 == 0 takes the 16-byte tile loads (one tile, two and a
 * partial third, 128 blocks), other multiples of 32 the 2-byte loads (the same order). */
static void test_matmul_quant(void) {
    const kiln_dtype types[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    const int64_t shapes[][2] = {{64, 64},   {33, 96},  {300, 512}, {40, 4352},
                                 {17, 2080}, {9, 8192}, {5, 32}};
    const int32_t ntoks[] = {1, 2, 3, 4, 5, 8, 9, 17, 33, 130};
    const int32_t MT = 130 + 5;
    double worst = 0.0;
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const kiln_dtype t = types[ti];
            const int64_t n_out = shapes[si][0], n_in = shapes[si][1];
            const size_t rs = kiln_dtype_row_size(t, n_in);
            uint8_t *w = malloc(rs * n_out);
            float *wd = malloc((size_t)n_out * n_in * sizeof *wd);
            REQUIRE(w && wd);
            rand_weights(t, w, n_out * n_in);
            kiln_dtype_traits_of(t)->to_float(w, wd, n_out * n_in);
            float *x = rand_floats((size_t)MT * n_in, 1.0f);
            void *dw = dput(w, rs * n_out);
            float *dx = dput(x, (size_t)MT * n_in * 4), *dy = dput(NULL, (size_t)MT * n_out * 4);
            const kiln_mat gm = {dw, t, n_out, n_in, "w", 0};
            float *alone = malloc((size_t)MT * n_out * 4);
            REQUIRE(alone);
            for (int32_t r = 0; r < MT; r++) {
                const kiln_mm mm = {&gm, dy + (size_t)r * n_out};
                gpu->ops->matmul(gpu, &mm, 1, dx + (size_t)r * n_in, 1);
            }
            float *g1 = dget(dy, (size_t)MT * n_out);
            memcpy(alone, g1, (size_t)MT * n_out * 4);
            free(g1);
            char what[96];
            for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++) {
                const int32_t nt = ntoks[ni];
                const kiln_mm gmm = {&gm, dy};
                gpu->ops->matmul(gpu, &gmm, 1, dx, nt);
                float *g = dget(dy, (size_t)nt * n_out);
                snprintf(what, sizeof what, "matmul %s %lldx%lld n_tok %d", kiln_dtype_name(t),
                         (long long)n_out, (long long)n_in, nt);
                int bad_ref = 0, bad_inv = 0;
                for (int32_t r = 0; r < nt; r++)
                    for (int64_t o = 0; o < n_out; o++) {
                        double ref = 0.0, S = 0.0;
                        for (int64_t k = 0; k < n_in; k++) {
                            const double p = (double)wd[o * n_in + k] * (double)x[r * n_in + k];
                            ref += p;
                            S += fabs(p);
                        }
                        const double gv = g[r * n_out + o];
                        if (!(fabs(gv - ref) <= 1e-5 * S + 1e-6) && bad_ref++ < 3)
                            fprintf(stderr, "%s (%d, %lld): gpu %.9g, reference %.9g\n", what, r,
                                    (long long)o, gv, ref);
                        const double e = fabs(gv - ref) / (S > 0 ? S : 1.0);
                        if (e > worst) worst = e;
                        if (memcmp(&g[r * n_out + o], &alone[r * n_out + o], 4) != 0) bad_inv++;
                    }
                CHECKF(bad_ref == 0, "%s: %d outputs beyond 1e-5 sum|w x| + 1e-6 of the double "
                                     "reference", what, bad_ref);
                CHECKF(bad_inv == 0, "%s: %d outputs differ from the same row computed alone",
                       what, bad_inv);
                free(g);
            }
            /* rows 5 .. 37 and 5 .. 134 as one batch: the same bits at another offset */
            for (int32_t nb = 33; nb <= 130; nb += 97) {
                const kiln_mm gmm = {&gm, dy};
                gpu->ops->matmul(gpu, &gmm, 1, dx + 5 * n_in, nb);
                float *g = dget(dy, (size_t)nb * n_out);
                CHECKF(memcmp(g, alone + 5 * n_out, (size_t)nb * n_out * 4) == 0,
                       "matmul %s %lldx%lld: rows 5..%d as a batch differ from each alone",
                       kiln_dtype_name(t), (long long)n_out, (long long)n_in, 4 + nb);
                free(g);
            }
            /* with a second weight (its first 8 rows) in the same call: each its own bits */
            if (n_out >= 8) {
                float *dz = dput(NULL, (size_t)9 * 8 * 4);
                const kiln_mat gm8 = {dw, t, 8, n_in, "w8", 0};
                const kiln_mm two[2] = {{&gm, dy}, {&gm8, dz}};
                gpu->ops->matmul(gpu, two, 2, dx, 9);
                float *a = dget(dy, (size_t)9 * n_out), *b = dget(dz, (size_t)9 * 8);
                CHECKF(memcmp(a, alone, (size_t)9 * n_out * 4) == 0,
                       "matmul %s %lldx%lld: first of two weights differs", kiln_dtype_name(t),
                       (long long)n_out, (long long)n_in);
                for (int32_t r = 0; r < 9; r++)
                    CHECKF(memcmp(b + r * 8, alone + (size_t)r * n_out, 8 * 4) == 0,
                           "matmul %s %lldx%lld: second of two weights, row %d differs",
                           kiln_dtype_name(t), (long long)n_out, (long long)n_in, r);
                free(a);
                free(b);
                dfree(dz);
            }
            free(w);
            free(wd);
            free(x);
            free(alone);
            dfree(dw);
            dfree(dx);
            dfree(dy);
        }
    printf("matmul q8_0, q4_0: largest |gpu - double ref| / sum|w x| = %.3g (bound 1e-5); rows "
           "bitwise equal alone, in batches of 2..130, at an offset and beside another weight\n",
           worst);
}

/* the fused forms (backend.h matmul_add, matmul_glu) give the bits of their sequences */
static void test_matmul_fused(void) {
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F16, KILN_DTYPE_Q8_0,
                                KILN_DTYPE_Q4_0};
    const int64_t shapes[][2] = {{64, 256}, {300, 72}, {33, 515}};
    const int32_t ntoks[] = {1, 3, 9, 40, 200};
    int checked = 0;
    for (size_t ti = 0; ti < 5; ti++)
        for (size_t si = 0; si < 3; si++)
            for (size_t ni = 0; ni < 5; ni++) {
                const kiln_dtype t = types[ti];
                const bool q = t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0;
                /* quantized rows are whole 32-element blocks: 256, 96, 544 */
                const int64_t n_out = shapes[si][0],
                              n_in = q ? (shapes[si][1] + 31) / 32 * 32 : shapes[si][1];
                const int32_t nt = ntoks[ni];
                const size_t rs = kiln_dtype_row_size(t, n_in);
                uint8_t *w = malloc(2 * rs * n_out);
                REQUIRE(w);
                rand_weights(t, w, 2 * n_out * n_in);
                float *x = rand_floats((size_t)nt * n_in, 1.0f),
                      *res = rand_floats((size_t)nt * n_out, 2.0f);
                uint8_t *dw = dput(w, 2 * rs * n_out);
                float *dx = dput(x, (size_t)nt * n_in * 4), *dy1 = dput(res, (size_t)nt * n_out * 4),
                      *dy2 = dput(res, (size_t)nt * n_out * 4), *dt = dput(NULL, (size_t)nt * n_out * 4),
                      *du = dput(NULL, (size_t)nt * n_out * 4);
                const kiln_mat wg = {dw, t, n_out, n_in, "g", 0},
                               wu = {dw + rs * n_out, t, n_out, n_in, "u", 0};
                /* matmul_add against matmul + add */
                gpu->ops->matmul_add(gpu, &wg, dx, nt, dy1);
                const kiln_mm mm = {&wg, dt};
                gpu->ops->matmul(gpu, &mm, 1, dx, nt);
                gpu->ops->add(gpu, dy2, dt, (int64_t)nt * n_out);
                float *a = dget(dy1, (size_t)nt * n_out), *b = dget(dy2, (size_t)nt * n_out);
                CHECKF(memcmp(a, b, (size_t)nt * n_out * 4) == 0,
                       "matmul_add %s %lldx%lld n_tok %d differs from matmul + add",
                       kiln_dtype_name(t), (long long)n_out, (long long)n_in, nt);
                free(a);
                free(b);
                /* matmul_glu against matmul (gate, up) + glu, every activation */
                for (int act = 0; act < 3; act++) {
                    gpu->ops->matmul_glu(gpu, &wg, &wu, dx, nt, act, dy1);
                    const kiln_mm two[2] = {{&wg, dt}, {&wu, du}};
                    gpu->ops->matmul(gpu, two, 2, dx, nt);
                    gpu->ops->glu(gpu, dt, du, (int64_t)nt * n_out, act);
                    a = dget(dy1, (size_t)nt * n_out);
                    b = dget(dt, (size_t)nt * n_out);
                    CHECKF(memcmp(a, b, (size_t)nt * n_out * 4) == 0,
                           "matmul_glu %s %lldx%lld n_tok %d act %d differs from matmul + glu",
                           kiln_dtype_name(t), (long long)n_out, (long long)n_in, nt, act);
                    free(a);
                    free(b);
                }
                checked++;
                free(w);
                free(x);
                free(res);
                dfree(dw);
                dfree(dx);
                dfree(dy1);
                dfree(dy2);
                dfree(dt);
                dfree(du);
            }
    printf("matmul_add, matmul_glu: bitwise the sequences they fuse (%d shapes x row counts)\n",
           checked);
}

/* ---- KV write and attention ---------------------------------------------------------------- */

typedef struct att_case {
    int32_t n_head, n_kv, hd;
    kiln_dtype page;
    float softcap;
    int32_t window;
} att_case;

static void pools_create(const att_case *a, kiln_kv_pool **pc, kiln_kv_pool **pg) {
    kiln_error err = {0};
    kiln_kv_pool_params pp = {.n_layer = 2,
                              .kv_dim = (int64_t)a->n_kv * a->hd,
                              .block_size = BS,
                              .n_blocks = N_BLOCKS,
                              .dtype = a->page,
                              .backend = cpu};
    REQUIRE(kiln_kv_pool_create(&pp, pc, &err) == KILN_OK);
    pp.backend = gpu;
    REQUIRE(kiln_kv_pool_create(&pp, pg, &err) == KILN_OK);
}

/* kv_write of random rows for every token of f into layer 1 of both pools */
static void write_kv(step_fix *f, kiln_kv_pool *pc, kiln_kv_pool *pg, int64_t kv_dim,
                     float **k_out, float **v_out) {
    const int32_t n = f->st.n_tokens;
    float *k = rand_floats((size_t)n * kv_dim, 1.0f), *v = rand_floats((size_t)n * kv_dim, 1.0f);
    float *dk = dput(k, (size_t)n * kv_dim * 4), *dv = dput(v, (size_t)n * kv_dim * 4);
    cpu->ops->kv_write(cpu, pc, 1, &f->st, k, v);
    gpu->ops->kv_write(gpu, pg, 1, &f->st, dk, dv);
    gpu->ops->sync(gpu);
    dfree(dk);
    dfree(dv);
    if (k_out) *k_out = k; else free(k);
    if (v_out) *v_out = v; else free(v);
}

static void test_attention(void) {
    const att_case cases[] = {
        {4, 4, 64, KILN_DTYPE_F32, 0.0f, 0},  {8, 2, 64, KILN_DTYPE_F16, 0.0f, 0},
        {8, 2, 128, KILN_DTYPE_BF16, 0.0f, 0}, {6, 3, 8, KILN_DTYPE_F32, 20.0f, 0},
        {4, 2, 64, KILN_DTYPE_F32, 0.0f, 10},  {4, 1, 96, KILN_DTYPE_F16, 30.0f, 24},
        {2, 2, 256, KILN_DTYPE_F32, 0.0f, 0},
    };
    /* the step: a prefill, a decode after 37, a chunk after 5, a long chunk after 200 */
    const int32_t shape[4][2] = {{0, 20}, {37, 1}, {5, 7}, {200, 33}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const att_case *a = &cases[ci];
        const int64_t kv_dim = (int64_t)a->n_kv * a->hd, q_dim = (int64_t)a->n_head * a->hd;
        kiln_kv_pool *pc = NULL, *pg = NULL;
        pools_create(a, &pc, &pg);
        /* the sequences' past: positions 0 .. n_past - 1 (the same tables as the step) */
        static step_fix f0, f1, f2;
        const int32_t pshape[4][2] = {{0, 1}, {0, 37}, {0, 5}, {0, 200}};
        make_step(&f0, 4, pshape, 100);
        write_kv(&f0, pc, pg, kv_dim, NULL, NULL);
        make_step(&f1, 4, shape, 100);
        float *k1 = NULL, *v1 = NULL;
        write_kv(&f1, pc, pg, kv_dim, &k1, &v1);
        const int32_t n = f1.st.n_tokens;
        float *q = rand_floats((size_t)n * q_dim, 1.5f), *c = malloc((size_t)n * q_dim * 4);
        REQUIRE(c);
        float *dq = dput(q, (size_t)n * q_dim * 4), *dout = dput(NULL, (size_t)n * q_dim * 4);
        const kiln_attn_params ap = {1, a->n_head, a->n_kv, a->hd, sqrtf((float)a->hd),
                                     a->softcap, a->window};
        cpu->ops->attention(cpu, pc, &ap, &f1.st, q, c);
        gpu->ops->attention(gpu, pg, &ap, &f1.st, dq, dout);
        float *g = dget(dout, (size_t)n * q_dim);
        const double tol = a->page == KILN_DTYPE_F32 ? 1e-5 : a->page == KILN_DTYPE_F16 ? 2e-3 : 1.6e-2;
        char what[128];
        snprintf(what, sizeof what, "attention %d/%d heads, hd %d, %s pages%s%s", a->n_head,
                 a->n_kv, a->hd, kiln_dtype_name(a->page), a->softcap > 0 ? ", softcap" : "",
                 a->window > 0 ? ", window" : "");
        double worst = 0.0;
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)n * q_dim; i++) {
            const double d = fabs((double)g[i] - (double)c[i]);
            if (d > worst) worst = d;
            if (!(d <= tol) && bad++ < 3)
                fprintf(stderr, "%s: element %lld: gpu %.9g, cpu %.9g\n", what, (long long)i,
                        g[i], c[i]);
        }
        CHECKF(bad == 0, "%s: %d elements beyond %.3g (max|v| = 1)", what, bad, tol);
        printf("%s: max |gpu - cpu| %.3g (bound %.3g)\n", what, worst, tol);

        /* invariance: sequence 1's decode token alone gives the same bits */
        step_fix *fa = &f2;
        const int32_t alone[1][2] = {{37, 1}};
        make_step(fa, 1, alone, 100);
        /* its table must be sequence 1's of the big step */
        memcpy(fa->tables[0], f1.tables[1], sizeof f1.tables[1]);
        kiln_error err = {0};
        REQUIRE(gpu->ops->step_begin(gpu, &fa->st, &err) == KILN_OK);
        const int32_t i1 = f1.seqs[1].first;
        float *dk = dput(k1 + i1 * kv_dim, kv_dim * 4), *dv = dput(v1 + i1 * kv_dim, kv_dim * 4);
        gpu->ops->kv_write(gpu, pg, 1, &fa->st, dk, dv);
        float *dq1 = dput(q + i1 * q_dim, q_dim * 4), *do1 = dput(NULL, q_dim * 4);
        gpu->ops->attention(gpu, pg, &ap, &fa->st, dq1, do1);
        float *g1 = dget(do1, q_dim);
        CHECKF(memcmp(g1, g + i1 * q_dim, q_dim * 4) == 0,
               "%s: the decode token alone differs from the same token in the batch", what);
        free(g1);
        dfree(dk);
        dfree(dv);
        dfree(dq1);
        dfree(do1);
        free(g);
        free(q);
        free(c);
        free(k1);
        free(v1);
        dfree(dq);
        dfree(dout);
        kiln_kv_pool_destroy(pc);
        kiln_kv_pool_destroy(pg);
    }
}

/* rope_kv_write gives the bits of rope(q), rope(k), kv_write: q, k and the pages */
static void test_rope_kv(void) {
    const kiln_dtype pages[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    const struct { int32_t nh, nkv, hd, rot; int adjacent; } cases[] = {
        {8, 2, 64, 64, 0}, {4, 4, 32, 16, 1}, {6, 3, 24, 24, 1}};
    for (int pi = 0; pi < 3; pi++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int32_t nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
            const int64_t kvd = (int64_t)nkv * hd, qd = (int64_t)nh * hd;
            kiln_error err = {0};
            kiln_kv_pool *p1 = NULL, *p2 = NULL;
            kiln_kv_pool_params pp = {.n_layer = 2, .kv_dim = kvd, .block_size = BS,
                                      .n_blocks = N_BLOCKS, .dtype = pages[pi], .backend = gpu};
            REQUIRE(kiln_kv_pool_create(&pp, &p1, &err) == KILN_OK);
            REQUIRE(kiln_kv_pool_create(&pp, &p2, &err) == KILN_OK);
            const int32_t shape[3][2] = {{0, 17}, {40, 1}, {2000 % (SEQ_BLOCKS * BS - 8), 5}};
            step_fix f;
            make_step(&f, 3, shape, 100);
            const int32_t n = f.st.n_tokens;
            float *q = rand_floats((size_t)n * qd, 1.0f), *k = rand_floats((size_t)n * kvd, 1.0f),
                  *v = rand_floats((size_t)n * kvd, 1.0f), *inv = malloc(cases[ci].rot / 2 * 4);
            REQUIRE(inv);
            for (int32_t j = 0; j < cases[ci].rot / 2; j++)
                inv[j] = 1.0f / powf(500000.0f, (float)(2 * j) / (float)cases[ci].rot);
            float *dq1 = dput(q, n * qd * 4), *dq2 = dput(q, n * qd * 4), *dk1 = dput(k, n * kvd * 4),
                  *dk2 = dput(k, n * kvd * 4), *dv = dput(v, n * kvd * 4),
                  *dinv = dput(inv, cases[ci].rot / 2 * 4);
            gpu->ops->rope_kv_write(gpu, p1, 1, &f.st, dq1, qd, nh, dk1, dv, nkv, hd, cases[ci].rot,
                                    dinv, cases[ci].adjacent);
            gpu->ops->rope(gpu, dq2, qd, nh, hd, cases[ci].rot, dinv, cases[ci].adjacent, &f.st);
            gpu->ops->rope(gpu, dk2, kvd, nkv, hd, cases[ci].rot, dinv, cases[ci].adjacent, &f.st);
            gpu->ops->kv_write(gpu, p2, 1, &f.st, dk2, dv);
            float *a = dget(dq1, n * qd), *b = dget(dq2, n * qd);
            int bad = memcmp(a, b, n * qd * 4) != 0;
            free(a);
            free(b);
            a = dget(dk1, n * kvd);
            b = dget(dk2, n * kvd);
            bad += memcmp(a, b, n * kvd * 4) != 0;
            free(a);
            free(b);
            const size_t region = (size_t)kiln_kv_block_bytes(2, kvd, BS, pages[pi]) / 4;
            uint8_t *h1 = malloc(region), *h2 = malloc(region);
            REQUIRE(h1 && h2);
            for (int sq = 0; sq < 3; sq++)
                for (int32_t i = 0; i < f.seqs[sq].n_blocks; i++)
                    for (int kvv = 0; kvv < 2; kvv++) {
                        const int32_t blk = f.tables[sq][i];
                        gpu->ops->download(gpu, h1, kvv ? kiln_kv_pool_v(p1, 1, blk) : kiln_kv_pool_k(p1, 1, blk), region);
                        gpu->ops->download(gpu, h2, kvv ? kiln_kv_pool_v(p2, 1, blk) : kiln_kv_pool_k(p2, 1, blk), region);
                        const size_t rb = kiln_kv_format_row_bytes(pages[pi], kvd);
                        for (int32_t r = 0; r < BS; r++) {
                            const int32_t pos = i * BS + r;
                            if (pos < f.seqs[sq].n_past || pos >= f.seqs[sq].n_past + f.seqs[sq].n_new)
                                continue;
                            bad += memcmp(h1 + r * rb, h2 + r * rb, rb) != 0;
                        }
                    }
            CHECKF(bad == 0, "rope_kv_write %s case %zu: %d buffers or rows differ from rope + "
                             "rope + kv_write", kiln_dtype_name(pages[pi]), ci, bad);
            free(h1);
            free(h2);
            free(q);
            free(k);
            free(v);
            free(inv);
            dfree(dq1);
            dfree(dq2);
            dfree(dk1);
            dfree(dk2);
            dfree(dv);
            dfree(dinv);
            kiln_kv_pool_destroy(p1);
            kiln_kv_pool_destroy(p2);
        }
    printf("rope_kv_write: q, k and the pages bitwise rope + rope + kv_write (f32, f16, bf16)\n");
}

/* Long sequences (split-KV attention over many splits): against the CPU; a decode token alone
 * (the wide form, one token) bitwise equal to the same token in a step of 51 tokens (the wide
 * form) and in a step of 131 tokens (more than the 64 the wide form takes: the loop form). */
enum { LONG_SEQ_BLOCKS = 80 }; /* 1280 positions per sequence */
static void step_distinct(step_fix *f, int n, const int32_t (*shape)[2], const int *ids) {
    /* like make_step, but sequence ids[s]'s blocks are its own: LONG_SEQ_BLOCKS ids of the
     * pool from ids[s] * LONG_SEQ_BLOCKS, shuffled */
    make_step(f, n, shape, 100);
    static int32_t perm[4 * N_BLOCKS];
    for (int32_t i = 0; i < 4 * N_BLOCKS; i++) perm[i] = (i * 37 + 11) % (4 * N_BLOCKS);
    for (int s = 0; s < n; s++) {
        REQUIRE(f->seqs[s].n_blocks <= LONG_SEQ_BLOCKS && ids[s] < 4);
        for (int32_t i = 0; i < f->seqs[s].n_blocks; i++)
            f->tables[s][i] = perm[ids[s] * LONG_SEQ_BLOCKS + i];
    }
    kiln_error err = {0};
    REQUIRE(cpu->ops->step_begin(cpu, &f->st, &err) == KILN_OK);
    REQUIRE(gpu->ops->step_begin(gpu, &f->st, &err) == KILN_OK);
}

static void test_attention_long(void) {
    const att_case cases[] = {
        {8, 2, 128, KILN_DTYPE_BF16, 0.0f, 0}, {32, 8, 128, KILN_DTYPE_BF16, 0.0f, 0},
        {4, 4, 64, KILN_DTYPE_F32, 0.0f, 0},    {4, 2, 64, KILN_DTYPE_F16, 0.0f, 300},
        {6, 3, 96, KILN_DTYPE_F32, 25.0f, 0},   {4, 1, 256, KILN_DTYPE_F16, 0.0f, 0},
    };
    /* the step: a decode after 1000 (8 splits), a chunk across the 256 boundary, a prefill */
    const int32_t shape[4][2] = {{1000, 1}, {250, 20}, {0, 30}, {0, 80}};
    const int32_t past[4][2] = {{0, 1000}, {0, 250}, {0, 0}, {0, 0}};
    double worst[3] = {0, 0, 0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const att_case *a = &cases[ci];
        const int64_t kv_dim = (int64_t)a->n_kv * a->hd, q_dim = (int64_t)a->n_head * a->hd;
        kiln_error err = {0};
        kiln_kv_pool *pc = NULL, *pg = NULL;
        kiln_kv_pool_params pp = {.n_layer = 2, .kv_dim = kv_dim, .block_size = BS,
                                  .n_blocks = 4 * N_BLOCKS, .dtype = a->page, .backend = cpu};
        REQUIRE(kiln_kv_pool_create(&pp, &pc, &err) == KILN_OK);
        pp.backend = gpu;
        REQUIRE(kiln_kv_pool_create(&pp, &pg, &err) == KILN_OK);
        /* the past, written in chunks of at most 200 positions */
        static step_fix fp, fa, fb, fc;
        for (int s = 0; s < 2; s++)
            for (int32_t p0 = 0; p0 < past[s][1]; p0 += 200) {
                const int32_t sh[1][2] = {{p0, past[s][1] - p0 < 200 ? past[s][1] - p0 : 200}};
                step_distinct(&fp, 1, sh, &s);
                write_kv(&fp, pc, pg, kv_dim, NULL, NULL);
            }
        /* step A: sequences 0..2 (51 tokens) */
        static const int ids[4] = {0, 1, 2, 3};
        step_distinct(&fa, 3, shape, ids);
        float *k1 = NULL, *v1 = NULL;
        write_kv(&fa, pc, pg, kv_dim, &k1, &v1);
        const int32_t n = fa.st.n_tokens;
        float *q = rand_floats((size_t)n * q_dim, 1.5f), *c = malloc((size_t)n * q_dim * 4);
        REQUIRE(c);
        float *dq = dput(q, (size_t)n * q_dim * 4), *dout = dput(NULL, (size_t)n * q_dim * 4);
        const kiln_attn_params ap = {1, a->n_head, a->n_kv, a->hd, sqrtf((float)a->hd),
                                     a->softcap, a->window};
        cpu->ops->attention(cpu, pc, &ap, &fa.st, q, c);
        gpu->ops->attention(gpu, pg, &ap, &fa.st, dq, dout);
        float *g = dget(dout, (size_t)n * q_dim);
        const int ti = a->page == KILN_DTYPE_F32 ? 0 : a->page == KILN_DTYPE_F16 ? 1 : 2;
        const double tol = ti == 0 ? 1e-5 : ti == 1 ? 2e-3 : 1.6e-2;
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)n * q_dim; i++) {
            const double d = fabs((double)g[i] - (double)c[i]);
            if (d > worst[ti]) worst[ti] = d;
            if (!(d <= tol) && bad++ < 3)
                fprintf(stderr, "long attention case %zu: element %lld: gpu %.9g, cpu %.9g\n", ci,
                        (long long)i, g[i], c[i]);
        }
        CHECKF(bad == 0, "long attention case %zu: %d elements beyond %.3g", ci, bad, tol);
        /* step B: the same three and an 80-token prefill (131 tokens: the loop form) */
        step_distinct(&fb, 4, shape, ids);
        const int32_t nb = fb.st.n_tokens;
        float *qb = malloc((size_t)nb * q_dim * 4);
        REQUIRE(qb);
        memcpy(qb, q, (size_t)n * q_dim * 4);
        for (int64_t i = (int64_t)n * q_dim; i < (int64_t)nb * q_dim; i++) qb[i] = uni();
        /* sequence 3's K/V (the first three rewrite the same values) */
        {
            float *kb = rand_floats((size_t)nb * kv_dim, 1.0f), *vb = rand_floats((size_t)nb * kv_dim, 1.0f);
            memcpy(kb, k1, (size_t)n * kv_dim * 4);
            memcpy(vb, v1, (size_t)n * kv_dim * 4);
            float *dk = dput(kb, (size_t)nb * kv_dim * 4), *dv = dput(vb, (size_t)nb * kv_dim * 4);
            gpu->ops->kv_write(gpu, pg, 1, &fb.st, dk, dv);
            dfree(dk);
            dfree(dv);
            free(kb);
            free(vb);
        }
        float *dqb = dput(qb, (size_t)nb * q_dim * 4), *doutb = dput(NULL, (size_t)nb * q_dim * 4);
        gpu->ops->attention(gpu, pg, &ap, &fb.st, dqb, doutb);
        float *gb = dget(doutb, (size_t)nb * q_dim);
        CHECKF(memcmp(gb, g, (size_t)n * q_dim * 4) == 0,
               "long attention case %zu: rows of the 51-token step differ inside the 131-token "
               "step (loop form against wide form)", ci);
        /* the decode token alone */
        const int32_t alone[1][2] = {{1000, 1}};
        step_distinct(&fc, 1, alone, ids);
        float *do1 = dput(NULL, q_dim * 4);
        gpu->ops->attention(gpu, pg, &ap, &fc.st, dq, do1);
        float *g1 = dget(do1, q_dim);
        CHECKF(memcmp(g1, g, q_dim * 4) == 0,
               "long attention case %zu: the decode token alone differs from it in the step", ci);
        free(g1);
        dfree(do1);
        free(gb);
        free(qb);
        dfree(dqb);
        dfree(doutb);
        free(g);
        free(q);
        free(c);
        free(k1);
        free(v1);
        dfree(dq);
        dfree(dout);
        kiln_kv_pool_destroy(pc);
        kiln_kv_pool_destroy(pg);
    }
    printf("long attention (1001 keys, window 300, GQA 1..4, hd 64..256): max |gpu - cpu| f32 "
           "%.3g (bound 1e-5), f16 %.3g (2e-3), bf16 %.3g (1.6e-2); the decode token alone, in 51 "
           "tokens (wide) and in 131 tokens (loop form) bitwise equal\n",
           worst[0], worst[1], worst[2]);
}

/* argmax on the device against the sampler's rule, computed here: the first largest finite
 * value (non-finite skipped, 0 when none), -1 for a row with a NaN */
static void test_argmax(void) {
    enum { ROWS = 6 };
    const int64_t n = 128256;
    float *x = rand_floats((size_t)ROWS * n, 10.0f);
    x[1 * n + 77777] = 50.0f; /* row 1: a tie of two maxima: the lower wins */
    x[1 * n + 5] = 50.0f;
    x[2 * n + 9] = INFINITY; /* row 2: +inf and -inf are skipped */
    x[2 * n + 10] = -INFINITY;
    for (int64_t i = 0; i < n; i++) x[3 * n + i] = -INFINITY; /* row 3: none finite */
    x[4 * n + 100000] = NAN;                                 /* row 4: a NaN */
    x[5 * n + n - 1] = 30.0f;                                /* row 5: the last element */
    int32_t want[ROWS];
    for (int r = 0; r < ROWS; r++) {
        int32_t best = -1;
        bool nan = false;
        for (int64_t i = 0; i < n; i++) {
            const float v = x[r * n + i];
            if (isnan(v)) nan = true;
            else if (isfinite(v) && (best < 0 || v > x[r * n + best])) best = (int32_t)i;
        }
        want[r] = nan ? -1 : best < 0 ? 0 : best;
    }
    float *dx = dput(x, (size_t)ROWS * n * 4);
    int32_t got[ROWS];
    gpu->ops->argmax(gpu, got, dx, ROWS, n);
    int bad = 0;
    for (int r = 0; r < ROWS; r++)
        if (got[r] != want[r] && bad++ < 3)
            fprintf(stderr, "argmax row %d: gpu %d, want %d\n", r, got[r], want[r]);
    CHECKF(bad == 0, "argmax: %d of %d rows differ", bad, ROWS);
    CHECK(want[1] == 5 && want[3] == 0 && want[4] == -1 && want[5] == n - 1);
    printf("argmax: %d rows of %lld (ties, infinities, none finite, NaN) as the sampler's rule\n",
           ROWS, (long long)n);
    free(x);
    dfree(dx);
}

/* kv_write: the GPU pool's pages hold exactly what the CPU wrote (f32, f16, bf16 rounding) */
static void test_kv_pages(void) {
    const kiln_dtype pages[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    for (int pi = 0; pi < 3; pi++) {
        const att_case a = {4, 2, 24, pages[pi], 0.0f, 0};
        kiln_kv_pool *pc = NULL, *pg = NULL;
        pools_create(&a, &pc, &pg);
        const int32_t shape[3][2] = {{0, 17}, {3, 30}, {50, 2}};
        step_fix f;
        make_step(&f, 3, shape, 100);
        write_kv(&f, pc, pg, 48, NULL, NULL);
        const size_t region = (size_t)kiln_kv_block_bytes(2, 48, BS, pages[pi]) / 4;
        int bad = 0;
        uint8_t *h = malloc(region);
        REQUIRE(h);
        for (int s = 0; s < 3; s++)
            for (int32_t i = 0; i < f.seqs[s].n_blocks; i++) {
                const int32_t blk = f.tables[s][i];
                for (int kvv = 0; kvv < 2; kvv++) {
                    const void *cp = kvv ? kiln_kv_pool_v(pc, 1, blk) : kiln_kv_pool_k(pc, 1, blk);
                    const void *gp = kvv ? kiln_kv_pool_v(pg, 1, blk) : kiln_kv_pool_k(pg, 1, blk);
                    gpu->ops->download(gpu, h, gp, region);
                    /* only the rows the step wrote */
                    const size_t rb = kiln_kv_format_row_bytes(pages[pi], 48);
                    for (int32_t r = 0; r < BS; r++) {
                        const int32_t pos = i * BS + r;
                        if (pos < f.seqs[s].n_past || pos >= f.seqs[s].n_past + f.seqs[s].n_new)
                            continue;
                        if (memcmp(h + r * rb, (const uint8_t *)cp + r * rb, rb) != 0) bad++;
                    }
                }
            }
        CHECKF(bad == 0, "kv_write %s: %d rows differ from the CPU's", kiln_dtype_name(pages[pi]),
               bad);
        free(h);
        kiln_kv_pool_destroy(pc);
        kiln_kv_pool_destroy(pg);
    }
    printf("kv_write: f32, f16 and bf16 pages bitwise equal to the CPU's\n");
}

int main(void) {
    /* the activation kinds the CUDA kernels assume */
    CHECK((int)CU_ACT_SILU == (int)KILN_OP_ACT_SILU && (int)CU_ACT_SILU == (int)KILN_ACT_SILU);
    CHECK((int)CU_ACT_GELU_TANH == (int)KILN_OP_ACT_GELU_TANH &&
          (int)CU_ACT_GELU_TANH == (int)KILN_ACT_GELU_TANH);
    CHECK((int)CU_ACT_GELU_ERF == (int)KILN_OP_ACT_GELU_ERF &&
          (int)CU_ACT_GELU_ERF == (int)KILN_ACT_GELU_ERF);
    kiln_test_require_cuda(0);
    kiln_error err = {0};
    const kiln_backend_params cp = {KILN_BACKEND_CPU, 1, 0}, gp = {KILN_BACKEND_CUDA, 1, 0};
    REQUIRE(kiln_backend_create(&cp, &cpu, &err) == KILN_OK);
    if (kiln_backend_create(&gp, &gpu, &err) != KILN_OK) {
        fprintf(stderr, "cuda backend: %s\n", err.message);
        return 1;
    }
    const kiln_backend_reserve res = {.act_bytes = 8 << 20, .max_tokens = MAX_TOK,
                                      .max_keys = MAX_KEYS, .n_head = 8, .n_head_kv = 2,
                                      .head_dim = 256};
    REQUIRE(cpu->ops->arena_reserve(cpu, &res, &err) == KILN_OK);
    REQUIRE(gpu->ops->arena_reserve(gpu, &res, &err) == KILN_OK);
    char num[128];
    gpu->ops->numerics(gpu, num, sizeof num);
    printf("cuda context: %s\n", num);
    CHECK(!strncmp(num, "cuda ", 5));

    test_elementwise();
    test_norms();
    test_rope();
    test_embed();
    test_embed_quant();
    test_matmul();
    test_matmul_quant();
    test_matmul_fused();
    test_kv_pages();
    test_rope_kv();
    test_attention();
    test_attention_long();
    test_argmax();

    kiln_backend_destroy(gpu);
    kiln_backend_destroy(cpu);
    return kiln_test_finish("test_cuda_ops");
}
