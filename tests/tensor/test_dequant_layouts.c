/*
 * test_dequant_layouts - the GGML block layouts, byte by byte.
 *
 * Two kinds of expectations, neither taken from the code under test:
 *   1. literal values computed by hand (in the comments) for a few hand-written blocks;
 *   2. for random block bytes, a per-element re-derivation from the layout definition in
 *      ggml-common.h / ggml-quants.c (bit positions computed from the element index).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor/dtype.h"
#include "test.h"

static uint64_t rs = 0x243F6A8885A308D3ull;
static uint8_t rbyte(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(rs >> 56);
}

/* a random fp16 scale in a sane range (normal, |v| in [2^-10, 2^4)) */
static uint16_t rscale(int allow_negative) {
    uint16_t e = (uint16_t)(5 + rbyte() % 14), m = (uint16_t)(((rbyte() << 8) | rbyte()) & 1023);
    uint16_t s = (allow_negative && (rbyte() & 1)) ? 0x8000 : 0;
    return (uint16_t)(s | (e << 10) | m);
}

static void put16(uint8_t *p, uint16_t v) { /* little-endian, as in GGUF files */
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

static void dequant(kiln_dtype t, const void *src, float *dst, int64_t n) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    REQUIRE(tr && tr->to_float);
    tr->to_float(src, dst, n);
}

static void test_q4_0(void) {
    /* bytes: d = 0x3800 (0.5), qs[j] = j | (15 - j) << 4 */
    uint8_t b[18];
    put16(b, 0x3800);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    dequant(KILN_DTYPE_Q4_0, b, y, 32);
    /* elem j<16 = (j-8)/2; elem 16+j = ((15-j)-8)/2 */
    CHECK(y[0] == -4.0f);
    CHECK(y[8] == 0.0f);
    CHECK(y[15] == 3.5f);
    CHECK(y[16] == 3.5f);
    CHECK(y[31] == -4.0f);
    /* random blocks: nibble of element e is byte 2 + e%16, low half for e<16 */
    uint8_t r[18 * 8];
    float z[32 * 8];
    for (int k = 0; k < 8; k++) {
        put16(r + 18 * k, rscale(1));
        for (int j = 0; j < 16; j++) r[18 * k + 2 + j] = rbyte();
    }
    dequant(KILN_DTYPE_Q4_0, r, z, 32 * 8);
    int bad = 0;
    for (int k = 0; k < 8; k++) {
        double d = kiln_fp16_to_fp32((uint16_t)(r[18 * k] | r[18 * k + 1] << 8));
        for (int e = 0; e < 32; e++) {
            uint8_t byte = r[18 * k + 2 + e % 16];
            int q = e < 16 ? (byte & 15) : (byte >> 4);
            if (z[32 * k + e] != (float)(d * (q - 8))) bad++;
        }
    }
    CHECKF(bad == 0, "q4_0: %d elements differ from the layout definition", bad);
}

static void test_q8_0(void) {
    uint8_t b[34];
    put16(b, 0x3400); /* 0.25 */
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float y[32];
    dequant(KILN_DTYPE_Q8_0, b, y, 32);
    CHECK(y[0] == -32.0f); /* -128 * 0.25 */
    CHECK(y[16] == 0.0f);
    CHECK(y[31] == 30.0f); /* 120 * 0.25 */
    int bad = 0;
    uint8_t r[34 * 4];
    float z[128];
    for (int k = 0; k < 4; k++) {
        put16(r + 34 * k, rscale(1));
        for (int j = 0; j < 32; j++) r[34 * k + 2 + j] = rbyte();
    }
    dequant(KILN_DTYPE_Q8_0, r, z, 128);
    for (int k = 0; k < 4; k++) {
        double d = kiln_fp16_to_fp32((uint16_t)(r[34 * k] | r[34 * k + 1] << 8));
        for (int e = 0; e < 32; e++)
            if (z[32 * k + e] != (float)(d * (int8_t)r[34 * k + 2 + e])) bad++;
    }
    CHECKF(bad == 0, "q8_0: %d elements differ", bad);
}

/* Q4_K: sub-block j's 6-bit scale/min from the 12 bytes, written as bit fields:
 * bytes 0..3:  bits 0-5 scale[0..3],  bits 6-7 = bits 4-5 of scale[4..7]
 * bytes 4..7:  bits 0-5 min[0..3],    bits 6-7 = bits 4-5 of min[4..7]
 * bytes 8..11: bits 0-3 = bits 0-3 of scale[4..7], bits 4-7 = bits 0-3 of min[4..7] */
static void q4k_fields(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] % 64;
        *m = s[4 + j] % 64;
    } else {
        int k = j - 4;
        *sc = (s[8 + k] % 16) + 16 * (s[k] / 64);
        *m = (s[8 + k] / 16) + 16 * (s[4 + k] / 64);
    }
}

static void test_q4_k(void) {
    uint8_t b[144];
    memset(b, 0, sizeof b);
    put16(b, 0x3C00);     /* d = 1 */
    put16(b + 2, 0x3800); /* dmin = 0.5 */
    const uint8_t sc[12] = {0x41, 0x02, 0x03, 0xC4, 0x05, 0x06, 0x47, 0x08, 0x21, 0x32, 0x43, 0x54};
    memcpy(b + 4, sc, 12);
    memset(b + 16, 0x3A, 128); /* every low nibble 10, every high nibble 3 */
    float y[256];
    dequant(KILN_DTYPE_Q4_K, b, y, 256);
    /* j=0: sc=0x41&63=1, m=0x05&63=5; elem 0 is a low nibble: 1*10 - 0.5*5 */
    CHECKF(y[0] == 7.5f, "%g", y[0]);
    /* j=1: sc=2, m=6; elem 32 is chunk 0's high nibble: 2*3 - 0.5*6 */
    CHECKF(y[32] == 3.0f, "%g", y[32]);
    /* j=4: sc = (0x21&15) | (0x41>>6)<<4 = 17, m = (0x21>>4) | (0x05>>6)<<4 = 2: 17*10 - 1 */
    CHECKF(y[130] == 169.0f, "%g", y[130]);
    /* j=5: sc = 2 | (0x02>>6)<<4 = 2, m = 3 | (0x06>>6)<<4 = 3; elem 180: high: 2*3 - 1.5 */
    CHECKF(y[180] == 4.5f, "%g", y[180]);
    /* j=6: sc = 3 | (0x03>>6)<<4 = 3, m = 4 | (0x47>>6)<<4 = 20; elem 200 low: 30 - 10 */
    CHECKF(y[200] == 20.0f, "%g", y[200]);
    /* j=7: sc = 4 | (0xC4>>6)<<4 = 52, m = 5 | (0x08>>6)<<4 = 5; elem 255 high: 156 - 2.5 */
    CHECKF(y[255] == 153.5f, "%g", y[255]);
    uint8_t scm, mm;
    kiln_q4k_scale_min(7, sc, &scm, &mm);
    CHECK(scm == 52 && mm == 5);

    /* random super-blocks against the field definition */
    enum { NB = 6 };
    uint8_t r[144 * NB];
    float z[256 * NB];
    for (int k = 0; k < NB; k++) {
        uint8_t *p = r + 144 * k;
        put16(p, rscale(0));
        put16(p + 2, rscale(0));
        for (int i = 4; i < 144; i++) p[i] = rbyte();
    }
    dequant(KILN_DTYPE_Q4_K, r, z, 256 * NB);
    int bad = 0;
    for (int k = 0; k < NB; k++) {
        const uint8_t *p = r + 144 * k;
        double d = kiln_fp16_to_fp32((uint16_t)(p[0] | p[1] << 8));
        double dmin = kiln_fp16_to_fp32((uint16_t)(p[2] | p[3] << 8));
        for (int e = 0; e < 256; e++) {
            int s6, m6;
            q4k_fields(p + 4, e / 32, &s6, &m6);
            uint8_t byte = p[16 + 32 * (e / 64) + e % 32];
            int q = (e % 64 < 32) ? (byte & 15) : (byte >> 4);
            double want = d * s6 * q - dmin * m6;
            double tol = (fabs(d * s6 * q) + fabs(dmin * m6)) * 0x1p-24;
            if (fabs(z[256 * k + e] - want) > tol) bad++;
        }
    }
    CHECKF(bad == 0, "q4_K: %d elements differ from the layout definition", bad);
}

static void test_q6_k(void) {
    uint8_t b[210];
    memset(b, 0x21, 128);      /* ql: low nibble 1, high nibble 2 */
    memset(b + 128, 0xE4, 64); /* qh: 2-bit fields 0,1,2,3 (from bit 0 up) */
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(int8_t)(i - 8);
    put16(b + 208, 0x3C00); /* d = 1 */
    float y[256];
    dequant(KILN_DTYPE_Q6_K, b, y, 256);
    /* elem 0: group 0: low nibble 1 | field0 (0) << 4 = 1 -> -31, scale[0] = -8 -> 248 */
    CHECKF(y[0] == 248.0f, "%g", y[0]);
    /* elem 40: group 1: low nibble of ql[40] 1 | 1<<4 = 17 -> -15, scale[2] = -6 -> 90 */
    CHECKF(y[40] == 90.0f, "%g", y[40]);
    /* elem 70: group 2: high nibble 2 | 2<<4 = 34 -> 2, scale[4] = -4 -> -8 */
    CHECKF(y[70] == -8.0f, "%g", y[70]);
    /* elem 100: group 3: 2 | 3<<4 = 50 -> 18, scale[6] = -2 -> -36 */
    CHECKF(y[100] == -36.0f, "%g", y[100]);
    /* elem 128: second half, group 0: -31 * scale[8] (0) = 0 */
    CHECKF(y[128] == 0.0f, "%g", y[128]);
    /* elem 255: second half, group 3: 18 * scale[15] (7) = 126 */
    CHECKF(y[255] == 126.0f, "%g", y[255]);

    enum { NB = 6 };
    uint8_t r[210 * NB];
    float z[256 * NB];
    for (int k = 0; k < NB; k++) {
        uint8_t *p = r + 210 * k;
        for (int i = 0; i < 208; i++) p[i] = rbyte();
        put16(p + 208, rscale(1));
    }
    dequant(KILN_DTYPE_Q6_K, r, z, 256 * NB);
    int bad = 0;
    for (int k = 0; k < NB; k++) {
        const uint8_t *p = r + 210 * k;
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *scales = (const int8_t *)(p + 192);
        double d = kiln_fp16_to_fp32((uint16_t)(p[208] | p[209] << 8));
        for (int e = 0; e < 256; e++) {
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            uint8_t lb = ql[64 * h + 32 * (g % 2) + l];
            int lo4 = g < 2 ? (lb & 15) : (lb >> 4);
            int hi2 = (qh[32 * h + l] >> (2 * g)) & 3;
            double want = d * scales[e / 16] * ((lo4 | hi2 << 4) - 32);
            if (z[256 * k + e] != (float)want) bad++;
        }
    }
    CHECKF(bad == 0, "q6_K: %d elements differ from the layout definition", bad);
}

static void test_plain(void) {
    const uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
    float y[4];
    dequant(KILN_DTYPE_F16, h, y, 4);
    CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == 65504.0f && y[3] == 0x1p-24f);
    const uint16_t bf[3] = {0x3F80, 0xC049, 0x0000};
    dequant(KILN_DTYPE_BF16, bf, y, 3);
    CHECK(y[0] == 1.0f && y[1] == -3.140625f && y[2] == 0.0f);
    const float f[2] = {1.5f, -7.25f};
    dequant(KILN_DTYPE_F32, f, y, 2);
    CHECK(y[0] == 1.5f && y[1] == -7.25f);
}

int main(void) {
    test_q4_0();
    test_q8_0();
    test_q4_k();
    test_q6_k();
    test_plain();
    return kiln_test_finish("test_dequant_layouts");
}
