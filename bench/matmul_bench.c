/*
 * matmul_bench - throughput of kiln_cpu_matmul per weight dtype and SIMD path.
 *
 * Build (from the repo root, after building kiln_static in build/):
 *   cc -O2 -Iinclude -Isrc bench/matmul_bench.c build/src/libkiln.a -lpthread -lm \
 *      -o build/matmul_bench
 * Run: build/matmul_bench [n_out n_in threads]   (defaults 4096 4096 and the physical cores)
 *
 * For every dtype and path it reports: decode (1 token): weight bytes streamed per second
 * (GB/s) — this is memory-bound territory; prefill (64 tokens): GFLOP/s (2 * n_out * n_in *
 * n_tok per call). Each figure is the best of several timed repetitions. (Scalar prefill
 * is skipped, shown as 0, above 4M weights.) Also prints the pool's empty fork/join cost.
 * Q8_0 and Q4_0 get two rows per path: act f32 (f32 activations, KILN_ACT_F32) and act q8
 * (activations quantized to Q8_0 per call, the default; the time includes quantizing).
 * The avx512 q8 rows use VNNI when the CPU has it; run with KILN_VNNI=0 for AVX-512BW.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "tensor/dtype.h"
#include "util/threadpool.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void noop(void *ctx, int ith, int nth) {
    (void)ctx, (void)ith, (void)nth;
}

/* Mean cost of one empty fork/join of the pool, in microseconds. */
static double forkjoin_us(kiln_threadpool *tp) {
    for (int i = 0; i < 1000; i++) kiln_threadpool_run(tp, noop, NULL);
    enum { RUNS = 20000 };
    double t0 = now();
    for (int i = 0; i < RUNS; i++) kiln_threadpool_run(tp, noop, NULL);
    return (now() - t0) / RUNS * 1e6;
}

static double best_time(kiln_threadpool *tp, kiln_simd p, kiln_act_mode act, const void *w,
                        kiln_dtype t, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                        float *y, double budget) {
    double best = 1e30, start = now();
    int reps = 0;
    kiln_cpu_matmul_ex(tp, p, act, w, t, n_out, n_in, x, n_tok, y); /* warm up */
    while (reps < 3 || (now() - start < budget && reps < 200)) {
        double t0 = now();
        kiln_cpu_matmul_ex(tp, p, act, w, t, n_out, n_in, x, n_tok, y);
        double dt = now() - t0;
        if (dt < best) best = dt;
        reps++;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t n_out = argc > 2 ? atoll(argv[1]) : 4096, n_in = argc > 2 ? atoll(argv[2]) : 4096;
    int threads = argc > 3 ? atoi(argv[3]) : kiln_physical_cores();
    const kiln_dtype types[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    /* env MB_TYPES=f16,q4_0 limits the dtypes, MB_PREFILL=N the prefill tokens (default 64),
     * MB_PATH=avx512 the paths */
    const char *only = getenv("MB_TYPES"), *only_path = getenv("MB_PATH");
    const int PREFILL = getenv("MB_PREFILL") ? atoi(getenv("MB_PREFILL")) : 64;
    if (PREFILL < 1) return 1;
    float *x = malloc(sizeof(float) * PREFILL * (size_t)n_in);
    float *y = malloc(sizeof(float) * PREFILL * (size_t)n_out);
    float *wf = malloc(sizeof(float) * (size_t)n_in);
    if (!x || !y || !wf) return 1;
    srand(1);
    for (int64_t i = 0; i < PREFILL * n_in; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;

    kiln_threadpool *pools[2] = {NULL, NULL};
    kiln_error err;
    if (threads > 1 && kiln_threadpool_create(threads, &pools[1], &err) != KILN_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    printf("matrix %lld x %lld, threads 1 and %d, active path %s, avx512 q8 kernels %s\n",
           (long long)n_out, (long long)n_in, threads, kiln_simd_name(kiln_simd_active()),
           kiln_cpu_use_vnni() ? "vnni" : "avx512bw");
    if (pools[1])
        printf("threadpool: empty fork/join %.2f us with %d threads\n", forkjoin_us(pools[1]),
               threads);
    printf("%-5s %-7s %-3s %11s %11s %14s %14s\n", "dtype", "path", "act", "dec GB/s 1t",
           "dec GB/s Nt", "pre GFLOP/s 1t", "pre GFLOP/s Nt");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kiln_dtype t = types[ti];
        const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
        size_t rs = kiln_dtype_row_size(t, n_in);
        if (!rs) continue;
        if (only && !strstr(only, tr->name)) continue;
        uint8_t *w = malloc(rs * (size_t)n_out);
        if (!w) return 1;
        for (int64_t o = 0; o < n_out; o++) {
            for (int64_t i = 0; i < n_in; i++) wf[i] = (float)rand() / RAND_MAX - 0.5f;
            tr->from_float(wf, w + rs * (size_t)o, n_in);
        }
        double bytes = (double)rs * (double)n_out;
        for (kiln_simd p = KILN_SIMD_SCALAR; p <= KILN_SIMD_AVX512; p++) {
            if (!kiln_simd_supported(p)) continue;
            if (only_path && strcmp(only_path, kiln_simd_name(p)) != 0) continue;
            for (int q8 = 0; q8 <= (kiln_cpu_q8_supported(t) ? 1 : 0); q8++) {
                kiln_act_mode act = q8 ? KILN_ACT_Q8 : KILN_ACT_F32;
                double r[4];
                for (int k = 0; k < 2; k++) {
                    kiln_threadpool *tp = k ? pools[1] : NULL;
                    if (k && !tp) {
                        r[1] = r[0], r[3] = r[2];
                        continue;
                    }
                    double td = best_time(tp, p, act, w, t, n_out, n_in, x, 1, y, 0.3);
                    /* the scalar reference is too slow to time prefill on big matrices */
                    double tpf = p == KILN_SIMD_SCALAR && (double)n_out * n_in > 4.2e6
                                     ? 1e30
                                     : best_time(tp, p, act, w, t, n_out, n_in, x, PREFILL, y, 0.3);
                    r[k] = bytes / td * 1e-9;
                    r[2 + k] = 2.0 * (double)n_out * (double)n_in * PREFILL / tpf * 1e-9;
                }
                printf("%-5s %-7s %-3s %11.2f %11.2f %14.2f %14.2f\n", tr->name, kiln_simd_name(p),
                       q8 ? "q8" : "f32", r[0], r[1], r[2], r[3]);
                fflush(stdout);
            }
        }
        free(w);
    }
    kiln_threadpool_destroy(pools[1]);
    free(x);
    free(y);
    free(wf);
    return 0;
}
