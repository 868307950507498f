/*
 * test_fp16_bf16 - IEEE binary16 and bfloat16 conversions.
 *
 * Oracles (all independent of the code under test):
 *   - fp16 -> fp32 against the binary16 definition evaluated with ldexp, for all 65536 halves;
 *   - fp32 -> fp16 round trip of every non-NaN half, and round-to-nearest-even at every
 *     midpoint between adjacent halves (and one float ulp either side of it);
 *   - fp32 -> fp16 against the CPU's F16C conversion (vcvtps2ph, RNE) on 16.7M float bit
 *     patterns spread over the whole 2^32 space (when the CPU has F16C);
 *   - fp32 -> bf16 against nearest-even rounding computed in double arithmetic;
 *   - a table of known encodings from the IEEE 754 / bfloat16 definitions.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor/dtype.h"
#include "test.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary16 value by definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormal 2^-14 * m/1024 */
static double half_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp(1024.0 + m, e - 25);
    return s ? -v : v;
}

static void test_fp16_to_fp32_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_fp16_to_fp32((uint16_t)h);
        double want = half_value((uint16_t)h);
        int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31 && m) {
            /* NaN: stays NaN, sign and payload kept (payload in the top mantissa bits) */
            uint32_t u = fbits(f);
            if (!isnan(f) || (u >> 31) != (h >> 15) || ((u >> 13) & 1023) != (uint32_t)m) bad++;
        } else if ((double)f != want || (signbit(f) != 0) != (int)(h >> 15)) {
            if (bad++ < 5) fprintf(stderr, "fp16 0x%04x -> %g, want %g\n", h, f, want);
        }
    }
    CHECKF(bad == 0, "%d halves decode wrongly", bad);
}

static void test_fp16_round_trip_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = kiln_fp32_to_fp16(kiln_fp16_to_fp32((uint16_t)h));
        int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31 && m) {
            /* NaN round trip: NaN, same sign, payload kept with the quiet bit set */
            if (((back >> 10) & 31) != 31 || (back & 1023) != (m | 0x200) ||
                (back >> 15) != (h >> 15))
                bad++;
        } else if (back != h) {
            if (bad++ < 5) fprintf(stderr, "round trip 0x%04x -> 0x%04x\n", h, back);
        }
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);
}

static void test_fp16_midpoints_rne(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7BFF; h++) { /* adjacent finite pairs (h, h+1), both signs */
        for (int sign = 0; sign < 2; sign++) {
            double a = half_value((uint16_t)h), b = half_value((uint16_t)(h + 1));
            float mid = (float)((a + b) / 2); /* exact: 12 significant bits at most */
            if ((double)mid != (a + b) / 2) bad++;
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            uint16_t s = sign ? 0x8000 : 0;
            float fm = sign ? -mid : mid;
            float below = nextafterf(fm, 0.0f), above = nextafterf(fm, sign ? -INFINITY : INFINITY);
            if (kiln_fp32_to_fp16(fm) != (even | s)) bad++;
            if (kiln_fp32_to_fp16(below) != (h | s)) bad++;
            if (kiln_fp32_to_fp16(above) != ((h + 1) | s)) bad++;
        }
    }
    CHECKF(bad == 0, "%d midpoint roundings wrong", bad);
}

static void test_fp16_known(void) {
    struct {
        float f;
        uint16_t h;
    } k[] =
        {
            {0.0f, 0x0000},       {-0.0f, 0x8000},        {1.0f, 0x3C00},
            {-2.0f, 0xC000},      {0.5f, 0x3800},         {65504.0f, 0x7BFF},
            {65519.99f, 0x7BFF},  {65520.0f, 0x7C00},     {1e9f, 0x7C00},
            {-1e9f, 0xFC00},      {INFINITY, 0x7C00},     {-INFINITY, 0xFC00},
            {0x1p-14f, 0x0400},   {0x1p-24f, 0x0001},     {0x1p-25f, 0x0000},
            {0x1.8p-25f, 0x0001}, {0x1.8p-24f, 0x0002},   {0x1p-26f, 0x0000},
            {1e-30f, 0x0000},     {0.1f, 0x2E66},         {1.0f / 3.0f, 0x3555},
            {0x1p-149f, 0x0000},  {0x1.ffcp-15f, 0x0400}, /* rounds up into the normals */
        };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        uint16_t got = kiln_fp32_to_fp16(k[i].f);
        CHECKF(got == k[i].h, "fp16(%a) = 0x%04x, want 0x%04x", k[i].f, got, k[i].h);
    }
    uint16_t qn = kiln_fp32_to_fp16(NAN);
    CHECK(((qn >> 10) & 31) == 31 && (qn & 0x200));
    /* a signalling float NaN whose payload lives only in the low bits must stay NaN */
    uint16_t sn = kiln_fp32_to_fp16(bitsf(0x7F800001u));
    CHECK(((sn >> 10) & 31) == 31 && (sn & 1023) != 0);
}

#ifdef HAVE_X86
__attribute__((target("f16c"))) static uint16_t hw_fp16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* F16C (CPUID.1:ECX bit 29) with the OS saving AVX state (OSXSAVE bit 27, XCR0 bits 1-2) */
static int have_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 29) & 1) || !((c >> 27) & 1)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6) == 6;
}

static void test_fp16_vs_f16c(void) {
    if (!have_f16c()) {
        printf("note: no F16C on this CPU, hardware comparison skipped\n");
        return;
    }
    int bad = 0;
    uint64_t n = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 257, n++) {
        float f = bitsf((uint32_t)u);
        uint16_t want = hw_fp16(f), got = kiln_fp32_to_fp16(f);
        if (got != want && bad++ < 5)
            fprintf(stderr, "fp16(bits 0x%08x) = 0x%04x, F16C says 0x%04x\n", (uint32_t)u, got,
                    want);
    }
    CHECKF(bad == 0, "%d of %llu conversions disagree with F16C", bad, (unsigned long long)n);
}
#endif

/* bf16 nearest-even by arithmetic: the two candidates around |f| and the exact distances */
static uint16_t bf16_oracle(float f) {
    uint32_t u = fbits(f);
    if (isnan(f)) return 0; /* not used */
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    double a = fabs((double)bitsf(lo)), x = fabs((double)f);
    double b = ((hi & 0x7FFFFFFFu) == 0x7F800000u) ? ldexp(1.0, 128) : fabs((double)bitsf(hi));
    if (isinf(f)) return (uint16_t)(u >> 16);
    double da = x - a, db = b - x;
    if (da < db) return (uint16_t)(lo >> 16);
    if (db < da) return (uint16_t)(hi >> 16);
    return ((lo >> 16) & 1) ? (uint16_t)(hi >> 16) : (uint16_t)(lo >> 16);
}

static void test_bf16(void) {
    int bad = 0;
    /* exhaustive decode + round trip */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_bf16_to_fp32((uint16_t)h);
        if (fbits(f) != h << 16) bad++;
        uint16_t back = kiln_fp32_to_bf16(f);
        if (isnan(f)) {
            if (!isnan(kiln_bf16_to_fp32(back)) || (back >> 15) != (h >> 15)) bad++;
        } else if (back != h) {
            bad++;
        }
    }
    CHECKF(bad == 0, "%d bf16 decode/round-trip failures", bad);
    /* strided sample of all float bit patterns against the arithmetic oracle */
    bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        float f = bitsf((uint32_t)u);
        if (isnan(f)) {
            if (!isnan(kiln_bf16_to_fp32(kiln_fp32_to_bf16(f)))) bad++;
            continue;
        }
        uint16_t want = bf16_oracle(f), got = kiln_fp32_to_bf16(f);
        if (got != want && bad++ < 5)
            fprintf(stderr, "bf16(bits 0x%08x) = 0x%04x, want 0x%04x\n", (uint32_t)u, got, want);
    }
    CHECKF(bad == 0, "%d bf16 roundings disagree with the oracle", bad);
    /* every tie: (h << 16) | 0x8000 rounds to the even neighbour */
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 7) & 0xFF) == 0xFF) continue; /* Inf/NaN exponent */
        uint32_t tie = (h << 16) | 0x8000u;
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (kiln_fp32_to_bf16(bitsf(tie)) != want) bad++;
    }
    CHECKF(bad == 0, "%d bf16 ties not rounded to even", bad);
    CHECK(kiln_fp32_to_bf16(1.0f) == 0x3F80);
    CHECK(kiln_fp32_to_bf16(3.14159265f) == 0x4049);
    CHECK(kiln_fp32_to_bf16(bitsf(0x3F808000u)) == 0x3F80);
    CHECK(kiln_fp32_to_bf16(bitsf(0x3F818000u)) == 0x3F82);
    CHECK(kiln_fp32_to_bf16(bitsf(0x7F7FFFFFu)) == 0x7F80); /* FLT_MAX rounds to Inf */
    CHECK(kiln_fp32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(kiln_fp32_to_bf16(bitsf(0x00000001u)) == 0x0000); /* tiny subnormal -> 0 */
    CHECK(kiln_fp32_to_bf16(bitsf(0x00008000u)) == 0x0000); /* subnormal tie -> even 0 */
    CHECK(kiln_fp32_to_bf16(bitsf(0x00018000u)) == 0x0002);
    uint16_t n = kiln_fp32_to_bf16(bitsf(0x7F800001u)); /* sNaN with low payload only */
    CHECK(isnan(kiln_bf16_to_fp32(n)));
}

int main(void) {
    test_fp16_to_fp32_exhaustive();
    test_fp16_round_trip_exhaustive();
    test_fp16_midpoints_rne();
    test_fp16_known();
#ifdef HAVE_X86
    test_fp16_vs_f16c();
#endif
    test_bf16();
    return kiln_test_finish("test_fp16_bf16");
}
