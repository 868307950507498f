/*
 * cpu_peaks - this machine's roofline, measured: the f32 FMA rate, the int8
 * multiply-accumulate rate with the instruction kiln's q8 kernels use and the streaming read
 * bandwidth from DRAM, on the threads kiln uses, for kiln's active SIMD path
 * (kiln_simd_active: AVX-512, or AVX2 on CPUs without it and under KILN_SIMD=avx2):
 *   AVX-512: zmm FMA; int8 vpdpbusd zmm (AVX-512 VNNI); 512-bit loads.
 *   AVX2:    ymm FMA; int8 vpdpbusd ymm where AVX-VNNI is used (kiln_cpu_use_avxvnni), else
 *            the vpmaddubsw + vpmaddwd + vpaddd sequence of the Q8_0 kernel (32 MACs per
 *            sequence); 256-bit loads. The CPU benchmarks' figures (bench/cpu_vs_llamacpp) are read against
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
 * with the path's vector loads (a plain 64-bit loop on the scalar path). The int8 line on
 * AVX-512 needs VNNI (KILN_VNNI not 0); without it, and on the scalar path, it says so. Use a buffer well above the last-level cache (the default), or the
 * bandwidth line measures the cache.
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

#include <errno.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,fma")))
#define VNNI   __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX2   __attribute__((target("avx2,fma")))

enum { CHAINS = 12, REPS = 7, MAX_THREADS = 512 };
#define MAX_MIB (1L << 20) /* 1 TiB */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    long iters;         /* compute: loop trips per thread */
    const uint8_t *buf; /* bandwidth: the buffer, n bytes */
    size_t n;
    volatile uint64_t sink[MAX_THREADS]; /* per thread, so nothing is optimised away */
} job;

/* the lanes' wrapping (unsigned) sum: only a sink, never an overflow */
AVX512 static uint64_t sum_u64(__m512i v) {
    uint64_t l[8], t = 0;
    _mm512_storeu_si512(l, v);
    for (int i = 0; i < 8; i++) t += l[i];
    return t;
}

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
    float v[16];
    _mm512_storeu_ps(v, s);
    j->sink[ith] = (uint64_t)(v[0] > 0);
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
    j->sink[ith] = sum_u64(s);
}

AVX2 static void fma_worker_avx2(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    __m256 a[CHAINS], m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (long t = 0; t < j->iters; t++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] =
            _mm256_fmadd_ps(a[i], m, c);
        __asm__("" : "+x"(m), "+x"(c));
    }
    __m256 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    j->sink[ith] = (uint64_t)(v[0] > 0);
}

/* the wrapping sum of the 8 int32 lanes (a sink) */
AVX2 static uint64_t sum_i32x8(__m256i v) {
    uint32_t l[8];
    uint64_t t = 0;
    _mm256_storeu_si256((__m256i *)l, v);
    for (int i = 0; i < 8; i++) t += l[i];
    return t;
}

/* AVX-VNNI (VEX vpdpbusd ymm) by inline asm, as the kernel (q8_avx2.c) */
AVX2 static void avxvnni_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    __m256i a[CHAINS], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (long t = 0; t < j->iters; t++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++)
            __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(a[i]) : "x"(w), "x"(x));
        __asm__("" : "+x"(w), "+x"(x));
    }
    __m256i s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_epi32(s, a[i]);
    j->sink[ith] = sum_i32x8(s);
}

/* vpmaddubsw + vpmaddwd + vpaddd: 32 u8 x s8 products into 8 int32 lanes */
AVX2 static void maddubs_worker(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)nth;
    __m256i a[CHAINS], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (long t = 0; t < j->iters; t++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < CHAINS; i++) a[i] =
            _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
        __asm__("" : "+x"(w), "+x"(x));
    }
    __m256i s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_epi32(s, a[i]);
    j->sink[ith] = sum_i32x8(s);
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
    j->sink[ith] = sum_u64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

AVX2 static void read_worker_avx2(void *ctx, int ith, int nth) {
    job *j = ctx;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t o0, o1;
    share(j, ith, nth, &o0, &o1);
    for (size_t o = o0; o < o1; o += 4096) {
        const __m256i *p = (const __m256i *)(j->buf + o);
        for (int k = 0; k < 128; k += 4) {
            s0 = _mm256_add_epi64(s0, _mm256_load_si256(p + k));
            s1 = _mm256_add_epi64(s1, _mm256_load_si256(p + k + 1));
            s2 = _mm256_add_epi64(s2, _mm256_load_si256(p + k + 2));
            s3 = _mm256_add_epi64(s3, _mm256_load_si256(p + k + 3));
        }
    }
    j->sink[ith] = sum_i32x8(_mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
}

/* the same without AVX-512: 64-bit loads in 4 chains (the compiler may vectorize them) */
static void read_worker_plain(void *ctx, int ith, int nth) {
    job *j = ctx;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t o0, o1;
    share(j, ith, nth, &o0, &o1);
    for (const uint64_t *p = (const uint64_t *)(j->buf + o0), *e = (const uint64_t *)(j->buf + o1);
         p < e; p += 4) {
        s0 += p[0], s1 += p[1], s2 += p[2], s3 += p[3];
    }
    j->sink[ith] = s0 + s1 + s2 + s3;
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

/* a whole decimal integer in [lo, hi], or -1 */
static long parse_int(const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < lo || v > hi ? -1 : v;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? parse_int(argv[1], 1, MAX_THREADS) : kiln_physical_cores();
    long mib = argc > 2 ? parse_int(argv[2], 1, MAX_MIB) : 1024;
    const char *what = argc > 3 ? argv[3] : "all";
    const bool compute = strcmp(what, "all") == 0;
    if (argc > 4 || threads < 1 || mib < 1 || (!compute && strcmp(what, "bandwidth") != 0)) {
        fprintf(stderr, "usage: cpu_peaks [threads 1..%d [MiB 1..%ld [all|bandwidth]]]\n",
                MAX_THREADS, MAX_MIB);
        return 2;
    }
    kiln_threadpool *tp = NULL;
    kiln_error err;
    if (kiln_threadpool_create((int)threads, &tp, &err) != KILN_OK) {
        fprintf(stderr, "cpu_peaks: %s\n", err.message);
        return 1;
    }
    static job j;
    printf("threads %ld\n", threads);
    const kiln_simd path = kiln_simd_active();
    printf("path %s\n", kiln_simd_name(path));
    if (!compute) {
        /* bandwidth only */
    } else if (path == KILN_SIMD_AVX512) {
        j.iters = 20000000;
        report("f32 FMA (AVX-512)", "GFLOP/s", tp, fma_worker, &j,
               2.0 * 16 * CHAINS * (double)j.iters * threads * 1e-9);
        if (kiln_cpu_use_vnni())
            report("int8 MAC (vpdpbusd)", "GMAC/s", tp, vnni_worker, &j,
                   64.0 * CHAINS * (double)j.iters * threads * 1e-9);
        else
            printf("int8 MAC (vpdpbusd)          not measured: no AVX-512 VNNI, or KILN_VNNI=0\n");
    } else if (path == KILN_SIMD_AVX2) {
        j.iters = 20000000;
        report("f32 FMA (AVX2 ymm)", "GFLOP/s", tp, fma_worker_avx2, &j,
               2.0 * 8 * CHAINS * (double)j.iters * threads * 1e-9);
        if (kiln_cpu_use_avxvnni())
            report("int8 MAC (vpdpbusd ymm)", "GMAC/s", tp, avxvnni_worker, &j,
                   32.0 * CHAINS * (double)j.iters * threads * 1e-9);
        else
            report("int8 MAC (vpmaddubsw+vpmaddwd)", "GMAC/s", tp, maddubs_worker, &j,
                   32.0 * CHAINS * (double)j.iters * threads * 1e-9);
    } else {
        printf("compute peaks                no AVX2 or AVX-512 on this path\n");
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
    report("read bandwidth", "GB/s", tp,
           path == KILN_SIMD_AVX512 ? read_worker
           : path == KILN_SIMD_AVX2 ? read_worker_avx2
                                    : read_worker_plain,
           &j,
           (double)j.n * 1e-9);
    free(buf);
    kiln_threadpool_destroy(tp);
    return 0;
}
