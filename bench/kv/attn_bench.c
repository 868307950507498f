/*
 * attn_bench - CPU attention time per layer over paged KV, per page format and SIMD path.
 *
 * One decode token of one layer of a tinyllama-1.1b-shaped model by default (32 query heads,
 * 4 KV heads, head_dim 64, so G = 8 query heads per KV head), attending over N keys (default
 * 4096) stored in blocks of 16 positions: the 4 kiln_attention_group calls (one per KV head) a
 * layer makes, on one thread. Formats f32, f16, bf16, q8_0, q4_0 (K and V alike, written by
 * kv/kv_format.h's write_row from random rows); paths scalar (the reference that
 * kiln_attention_group runs without a SIMD kernel), avx2 and avx512 (the kernels called
 * directly, where the CPU has them). Rounds run the (format, path) cells interleaved; each
 * cell's median over ROUNDS rounds of the best of REPS back-to-back layers prints in
 * microseconds, with each path's speed-up over scalar. It also checks that the AVX2 kernel's
 * output is bitwise the scalar reference's and prints the AVX-512 kernel's largest difference
 * from it.
 *
 * usage: build/attn_bench [KEYS [ROUNDS [REPS [N_HEAD N_HEAD_KV HEAD_DIM]]]]
 * The machine is shared: read the medians with its load (printed before and after).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_simd.h"
#include "kv/kv_format.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / (float)(1u << 23) - 1.0f;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_load(const char *when) {
    double l[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l[0] = l[1] = l[2] = 0;
        fclose(f);
    }
    printf("load %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

enum { P_SCALAR, P_AVX2, P_AVX512, N_PATHS };

typedef struct layer {
    int n_head, n_kv, hd, keys, bs, nblk;
    int plain; /* >= 0: plain rows of this operand (k_fmt NULL, as the engine passes f32 / f16 /
                  bf16 sequences); -1: per-block formats */
    void **kb, **vb;
    uint8_t *kf, *vf;
    float *q, *out, *scratch;
} layer;

/* one layer's attention for the one decode token on path p */
static void run_layer(const layer *L, int p) {
    const int G = L->n_head / L->n_kv;
    const int32_t begin = 0, end = L->keys;
    const int64_t kv_dim = (int64_t)L->n_kv * L->hd;
    for (int g = 0; g < L->n_kv; g++) {
        const bool pl = L->plain >= 0;
        const kiln_attn_kv kv = {(const void *const *)L->kb, (const void *const *)L->vb, L->bs,
                                 kv_dim, (int64_t)g * L->hd, L->hd, pl ? L->plain : 0,
                                 pl ? NULL : L->kf, pl ? NULL : L->vf};
        float *o = L->out + (size_t)g * G * L->hd;
        const float *q = L->q + (size_t)g * G * L->hd;
        const float div = sqrtf((float)L->hd);
        if (p == P_AVX512)
            kiln_attention_group_avx512(o, 0, q, 0, G, 1, &begin, &end, &kv, div, 0.0f,
                                        L->scratch);
        else if (p == P_AVX2)
            kiln_attention_group_avx2(o, 0, q, 0, G, 1, &begin, &end, &kv, div, 0.0f, L->scratch);
        else
            for (int h = 0; h < G; h++)
                kiln_attention_paged_kv(o + (size_t)h * L->hd, q + (size_t)h * L->hd, &kv, begin,
                                        end, div, 0.0f, L->scratch, L->scratch + L->keys + 16);
    /* (kiln_attention_paged_kv runs kiln_attention_paged for plain rows) */
    }
}

int main(int argc, char **argv) {
    const int keys = argc > 1 ? atoi(argv[1]) : 4096;
    const int rounds = argc > 2 ? atoi(argv[2]) : 7;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    layer L = {argc > 6 ? atoi(argv[4]) : 32, argc > 6 ? atoi(argv[5]) : 4,
               argc > 6 ? atoi(argv[6]) : 64, keys, 16, 0, -1, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL};
    if (keys < 1 || rounds < 1 || reps < 1 || L.n_kv < 1 || L.n_head % L.n_kv || L.hd < 1) {
        fprintf(stderr, "usage: %s [KEYS [ROUNDS [REPS [N_HEAD N_HEAD_KV HEAD_DIM]]]]\n", argv[0]);
        return 2;
    }
    static const kiln_dtype fmts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                      KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    enum { NF = sizeof fmts / sizeof fmts[0] };
    bool have[N_PATHS] = {true, kiln_simd_supported(KILN_SIMD_AVX2),
                          kiln_simd_supported(KILN_SIMD_AVX512)};
    const int G = L.n_head / L.n_kv;
    const int64_t kv_dim = (int64_t)L.n_kv * L.hd;
    const kiln_kv_geom geom = {kv_dim, L.n_kv, L.hd};
    L.nblk = (keys + L.bs - 1) / L.bs;
    float *K = malloc(sizeof(float) * (size_t)kv_dim * keys);
    float *V = malloc(sizeof(float) * (size_t)kv_dim * keys);
    L.q = malloc(sizeof(float) * (size_t)L.n_head * L.hd);
    L.out = malloc(sizeof(float) * (size_t)L.n_head * L.hd);
    float *ref = malloc(sizeof(float) * (size_t)L.n_head * L.hd);
    size_t ns = kiln_attention_group_scratch_avx2(1, G, L.hd, keys);
    if (have[P_AVX512] && kiln_attention_group_scratch_avx512(1, G, L.hd, keys) > ns)
        ns = kiln_attention_group_scratch_avx512(1, G, L.hd, keys);
    ns += (size_t)keys + (size_t)L.hd + 64;
    L.scratch = aligned_alloc(64, (ns * sizeof(float) + 63) & ~(size_t)63);
    L.kb = calloc((size_t)L.nblk, sizeof(void *));
    L.vb = calloc((size_t)L.nblk, sizeof(void *));
    L.kf = malloc((size_t)L.nblk);
    L.vf = malloc((size_t)L.nblk);
    if (!K || !V || !L.q || !L.out || !ref || !L.scratch || !L.kb || !L.vb || !L.kf || !L.vf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < kv_dim * keys; i++) K[i] = uniform() * 2, V[i] = uniform();
    for (int i = 0; i < L.n_head * L.hd; i++) L.q[i] = uniform() * 2;
    /* [format][path][round] */
    double *t_us = calloc((size_t)NF * N_PATHS * rounds, sizeof(double));
    double worst512[NF] = {0};
    bool avx2_equal[NF];
    void **kb[NF], **vb[NF];
    for (int f = 0; f < NF; f++) {
        const kiln_kv_format_traits *tr = kiln_kv_format_of(fmts[f]);
        const size_t rb = kiln_kv_format_row_bytes_geom(fmts[f], &geom);
        kb[f] = calloc((size_t)L.nblk, sizeof(void *));
        vb[f] = calloc((size_t)L.nblk, sizeof(void *));
        for (int b = 0; b < L.nblk; b++) {
            kb[f][b] = aligned_alloc(64, (rb * L.bs + 63) & ~(size_t)63);
            vb[f][b] = aligned_alloc(64, (rb * L.bs + 63) & ~(size_t)63);
            for (int r = 0; r < L.bs && b * L.bs + r < keys; r++) {
                const size_t t = (size_t)b * L.bs + r;
                tr->write_row((char *)kb[f][b] + r * rb, K + t * kv_dim, &geom);
                tr->write_row((char *)vb[f][b] + r * rb, V + t * kv_dim, &geom);
            }
        }
    }
    print_load("before");
    printf("attention per layer: %d heads, %d KV heads, head_dim %d, 1 token over %d keys, "
           "block size %d, 1 thread; median of %d rounds of the best of %d\n",
           L.n_head, L.n_kv, L.hd, keys, L.bs, rounds, reps);
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f < NF; f++) {
            memcpy(L.kb, kb[f], sizeof(void *) * (size_t)L.nblk);
            memcpy(L.vb, vb[f], sizeof(void *) * (size_t)L.nblk);
            memset(L.kf, (int)fmts[f], (size_t)L.nblk);
            memset(L.vf, (int)fmts[f], (size_t)L.nblk);
            L.plain = kiln_kv_format_of(fmts[f])->block_elems == 1
                          ? (int)kiln_kv_format_of(fmts[f])->operand
                          : -1;
            for (int p = 0; p < N_PATHS; p++) {
                if (!have[p]) continue;
                double best = 1e30;
                for (int k = 0; k < reps; k++) {
                    const double t0 = now();
                    run_layer(&L, p);
                    const double dt = now() - t0;
                    if (dt < best) best = dt;
                }
                t_us[((size_t)f * N_PATHS + p) * rounds + r] = best * 1e6;
                if (r == 0) {
                    if (p == P_SCALAR) memcpy(ref, L.out, sizeof(float) * (size_t)L.n_head * L.hd);
                    if (p == P_AVX2)
                        avx2_equal[f] =
                            !memcmp(ref, L.out, sizeof(float) * (size_t)L.n_head * L.hd);
                    if (p == P_AVX512)
                        for (int i = 0; i < L.n_head * L.hd; i++) {
                            const double e = fabs((double)L.out[i] - ref[i]) / (1 + fabs(ref[i]));
                            if (e > worst512[f]) worst512[f] = e;
                        }
                }
            }
        }
    print_load("after");
    printf("%-6s %12s %12s %12s %10s %10s   checks\n", "format", "scalar us", "avx2 us",
           "avx512 us", "avx2/sc", "avx512/sc");
    for (int f = 0; f < NF; f++) {
        double med[N_PATHS] = {0};
        for (int p = 0; p < N_PATHS; p++) {
            if (!have[p]) continue;
            double *v = t_us + ((size_t)f * N_PATHS + p) * rounds;
            qsort(v, (size_t)rounds, sizeof(double), cmp_double);
            med[p] = rounds % 2 ? v[rounds / 2] : 0.5 * (v[rounds / 2 - 1] + v[rounds / 2]);
        }
        printf("%-6s %12.1f %12.1f %12.1f %9.2fx %9.2fx   avx2 %s", kiln_kv_format_of(fmts[f])->name,
               med[0], med[1], med[2], have[1] ? med[0] / med[1] : 0.0,
               have[2] ? med[0] / med[2] : 0.0,
               !have[1] ? "-" : avx2_equal[f] ? "bitwise = scalar" : "DIFFERS from scalar");
        if (have[2]) printf(", avx512 max rel diff %.1e", worst512[f]);
        printf("\n");
    }
    int bad = 0;
    for (int f = 0; f < NF; f++) bad += have[1] && !avx2_equal[f];
    return bad ? 1 : 0;
}
