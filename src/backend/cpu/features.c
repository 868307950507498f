/*
 * features.c - CPU feature detection (cpuid + xgetbv) and kernel dispatch.
 *
 * Sources: Intel SDM vol. 2A "CPUID" (leaf 1 ECX: FMA bit 12, OSXSAVE 27, AVX 28, F16C 29;
 * leaf 7.0 EBX: AVX2 5, AVX512F 16, AVX512DQ 17, AVX512BW 30, AVX512VL 31; leaf 7.0 ECX:
 * AVX512_VNNI 11; leaf 7.1 EAX: AVX-VNNI 4, AVX512_BF16 5) and vol. 1 13.3 (XCR0 bits 1-2: SSE/AVX state,
 * bits 5-7: opmask/ZMM state, all needed before the OS lets us use the registers).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(kiln_cpu_features *f) {
    unsigned a, b, c, d;
    memset(f, 0, sizeof *f);
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    bool os_avx = (xcr0 & 0x6) == 0x6;
    bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
    if (!os_avx) return;
    f->fma = fma;
    f->f16c = f16c;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_sub = a;
    f->avx2 = (b >> 5) & 1;
    if (max_sub >= 1) {
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        (void)b1, (void)c1, (void)d1;
        f->avxvnni = (a1 >> 4) & 1; /* VEX encoding: needs only the AVX state */
    }
    if (os_avx512) {
        f->avx512f = (b >> 16) & 1;
        f->avx512dq = (b >> 17) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512vnni = (c >> 11) & 1;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f->avx512bf16 = (a >> 5) & 1;
        }
    }
}
#else
static void detect(kiln_cpu_features *f) {
    memset(f, 0, sizeof *f);
}
#endif

static kiln_cpu_features g_features;
static kiln_simd g_active;
static bool g_vnni, g_avxvnni;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool supported(const kiln_cpu_features *f, kiln_simd s) {
    switch (s) {
    case KILN_SIMD_SCALAR:
        return true;
    case KILN_SIMD_AVX2:
        return f->avx2 && f->fma && f->f16c;
    case KILN_SIMD_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl &&
               f->avx512dq;
    }
    return false;
}

static void init_once(void) {
    detect(&g_features);
    kiln_simd best = KILN_SIMD_SCALAR;
    if (supported(&g_features, KILN_SIMD_AVX2)) best = KILN_SIMD_AVX2;
    if (supported(&g_features, KILN_SIMD_AVX512)) best = KILN_SIMD_AVX512;
    g_active = best;
    const char *vn = getenv("KILN_VNNI");
    g_vnni = g_features.avx512vnni && !(vn && strcmp(vn, "0") == 0);
    g_avxvnni = g_features.avxvnni && !(vn && strcmp(vn, "0") == 0);
    const char *env = getenv("KILN_SIMD");
    if (env && *env) {
        /* a named path is used if this CPU has it; otherwise the best path below it */
        kiln_simd want = best;
        if (strcmp(env, "scalar") == 0)
            want = KILN_SIMD_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            want = KILN_SIMD_AVX2;
        else if (strcmp(env, "avx512") == 0)
            want = KILN_SIMD_AVX512;
        if (want < best) g_active = want;
    }
}

const kiln_cpu_features *kiln_cpu_features_get(void) {
    pthread_once(&g_once, init_once);
    return &g_features;
}

bool kiln_simd_supported(kiln_simd s) {
    return supported(kiln_cpu_features_get(), s);
}

kiln_simd kiln_simd_active(void) {
    pthread_once(&g_once, init_once);
    return g_active;
}

bool kiln_cpu_use_vnni(void) {
    pthread_once(&g_once, init_once);
    return g_vnni;
}

bool kiln_cpu_use_avxvnni(void) {
    pthread_once(&g_once, init_once);
    return g_avxvnni;
}

const char *kiln_simd_name(kiln_simd s) {
    switch (s) {
    case KILN_SIMD_SCALAR:
        return "scalar";
    case KILN_SIMD_AVX2:
        return "avx2";
    case KILN_SIMD_AVX512:
        return "avx512";
    }
    return "unknown";
}

const kiln_cpu_kernel *kiln_cpu_kernel_get(kiln_dtype t, kiln_simd path) {
    if (!kiln_simd_supported(path)) return NULL;
    switch (path) {
    case KILN_SIMD_SCALAR:
        return kiln_cpu_kernel_scalar(t);
    case KILN_SIMD_AVX2:
        return kiln_cpu_kernel_avx2(t);
    case KILN_SIMD_AVX512:
        return kiln_cpu_kernel_avx512(t);
    }
    return NULL;
}

kiln_vec_dot_fn kiln_cpu_vec_dot(kiln_dtype t, kiln_simd path) {
    const kiln_cpu_kernel *k = kiln_cpu_kernel_get(t, path);
    return k ? k->dot : NULL;
}
