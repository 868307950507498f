/*
 * cpu_peaks - this machine's roofline, measured: the AVX-512 f32 FMA rate, the VNNI int8
 * multiply-accumulate rate (vpdpbusd) and the streaming read bandwidth from DRAM, on the
 * threads kiln uses. The CPU benchmarks' figures (bench/cpu_vs_llamacpp) are read against
 * these: F16 prefill against the FMA rate, Q4_0/Q8_0 batched decode against the int8 rate,
 * one-sequence decode against the bandwidth.
 *
 * Run: build/bench/cpu_peaks [threads [MiB [all|bandwidth]]]
 *      (defaults: the physical cores, 1024 MiB, all; bench/cpu_vs_llamacpp/run.py samples the
 *      bandwidth before every run, as it drifts on shared machines)
 * Prints one line per figure: the median of 7 repetitions and the min-max. Compute peaks run
 * 12 independent register chains per thread (more than latency x issue width, so only the
 * issue rate limits them); bandwidth sums a huge-page buffer (MADV_HUGEPAGE, as kiln's
 * weights) that each thread first touches and then reads, one contiguous range per thread,
 * 512-bit loads. Needs AVX-512 (and VNNI for the int8 line); otherwise it
 * says so and measures bandwidth only.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "util/threadpool.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,fma")))
#define VNNI   __attribute__((target("avx512f,avx512bw,avx512vnni")))

enum { CHAINS = 12, REPS = 7 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    long iters;         /* compute: loop trips per thread */
    const uint8_t *buf; /* bandwidth: the buffer, n bytes */
    size_t n;
    volatile int64_t sink[64]; /* per thread, so nothing is optimised away */
} job;

AVX512 static void fma_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    __m512 a[CHAINS], m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long t = 0; t < j->iters; t++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] =
            _mm512_fmadd_ps(a[i], m, c);
        __asm__("" : "+v"(m), "+v"(c)); /* keep the operands opaque */
    }
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    j->sink[ith] = (int64_t)_mm512_reduce_add_ps(s);
}

VNNI static void vnni_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    __m512i a[CHAINS], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_epi32(i);
    for (long t = 0; t < j->iters; t++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] =
            _mm512_dpbusd_epi32(a[i], w, x);
        __asm__("" : "+v"(w), "+v"(x));
    }
    __m512i s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_epi32(s, a[i]);
    j->sink[ith] = _mm512_reduce_add_epi32(s);
}

/* thread ith's share: a contiguous range of whole 4 KiB pages (as kiln's matmul splits rows) */
static void share(const job *j, int ith, int nth, size_t *o0, size_t *o1) {
    const size_t pages = j->n / 4096;
    *o0 = pages * (size_t)ith / (size_t)nth * 4096;
    *o1 = pages * (size_t)(ith + 1) / (size_t)nth * 4096;
}

static void touch_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    size_t o0, o1;
    share(j, ith, nth, &o0, &o1);
    memset((uint8_t *)j->buf + o0, ith + 1, o1 - o0);
}

AVX512 static void read_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t o0, o1;
    share(j, ith, nth, &o0, &o1);
    for (size_t o = o0; o < o1; o += 4096) {
        const __m512i *p = (const __m512i *)(j->buf + o);
        for (int k = 0; k < 64; k += 4) {
            s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + k));
            s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + k + 1));
            s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + k + 2));
            s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + k + 3));
        }
    }
    j->sink[ith] = _mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* runs fn REPS times (after one warm-up); prints the median, min and max of scale / seconds */
static void report(const char *what, const char *unit, kiln_threadpool *tp, kiln_threadpool_fn fn,
                   job *j, double scale) {
    double r[REPS];
    kiln_threadpool_run(tp, fn, j);
    for (int k = 0; k < REPS; k++) {
        double t0 = now();
        kiln_threadpool_run(tp, fn, j);
        r[k] = scale / (now() - t0);
    }
    qsort(r, REPS, sizeof r[0], cmp_d);
    printf("%-28s %9.1f %s  (min %.1f, max %.1f)\n", what, r[REPS / 2], unit, r[0], r[REPS - 1]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : kiln_physical_cores();
    long mib = argc > 2 ? atol(argv[2]) : 1024;
    const char *what = argc > 3 ? argv[3] : "all";
    const bool compute = strcmp(what, "all") == 0;
    if (threads < 1 || threads > 64 || mib < 1 || (!compute && strcmp(what, "bandwidth") != 0)) {
        fprintf(stderr, "usage: cpu_peaks [threads 1..64 [MiB >= 1 [all|bandwidth]]]\n");
        return 2;
    }
    kiln_threadpool *tp = NULL;
    kiln_error err;
    if (kiln_threadpool_create(threads, &tp, &err) != KILN_OK) {
        fprintf(stderr, "cpu_peaks: %s\n", err.message);
        return 1;
    }
    static job j;
    printf("threads %d\n", threads);
    if (!compute) {
        /* bandwidth only */
    } else if (kiln_simd_supported(KILN_SIMD_AVX512)) {
        j.iters = 20000000;
        report("f32 FMA (AVX-512)", "GFLOP/s", tp, fma_worker, &j,
               2.0 * 16 * CHAINS * (double)j.iters * threads * 1e-9);
        if (kiln_cpu_use_vnni())
            report("int8 MAC (vpdpbusd)", "GMAC/s", tp, vnni_worker, &j,
                   64.0 * CHAINS * (double)j.iters * threads * 1e-9);
        else
            printf("int8 MAC (vpdpbusd)          no AVX-512 VNNI\n");
    } else {
        printf("compute peaks                no AVX-512 on this CPU\n");
    }
    j.n = (size_t)mib << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 2u << 20, j.n) != 0) {
        fprintf(stderr, "cpu_peaks: cannot allocate %ld MiB\n", mib);
        kiln_threadpool_destroy(tp);
        return 1;
    }
    madvise(buf, j.n, MADV_HUGEPAGE);
    j.buf = buf;
    kiln_threadpool_run(tp, touch_worker, &j);
    if (kiln_simd_supported(KILN_SIMD_AVX512))
        report("read bandwidth", "GB/s", tp, read_worker, &j, (double)j.n * 1e-9);
    else
        printf("read bandwidth               needs AVX-512 in this probe\n");
    free(buf);
    kiln_threadpool_destroy(tp);
    return 0;
}
