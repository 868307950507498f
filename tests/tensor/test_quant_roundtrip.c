/*
 * test_quant_roundtrip - dequantize(quantize(x)) stays within each format's stated error
 * bound, the traits table is consistent, and row sizes match the block layouts.
 *
 * Bounds (per element; d, sc are the stored, dequantized scales of the element's block):
 *   F16:  |err| <= 2^-11 |x| (normal range); BF16: |err| <= 2^-8 |x|; F32 exact.
 *   Q8_0: |err| <= d/2 * (1 + 2^-20) + 1e-30, and d <= amax/127 rounded up to fp16 (so
 *         d <= amax/127 * (1 + 2^-10)).
 *   Q4_0: |err| <= |d|/2 (+ same slack) for every element with x/d <= 7.5, |err| <= |d| for
 *         the clamped extreme on the other side; |d| <= amax/8 * (1 + 2^-10).
 *   Q4_K: |err| <= d*sc/2 + 2^-20 (|x| + dmin*m) for the element's 32-wide sub-block.
 *   Q6_K: |err| <= d*sc/2 + 2^-20 |x| for the element's 16-wide sub-block.
 * The bounds are checked against the scales read from the block bytes, and separately each
 * block's max error is compared with its dynamic range (Q8_0 amax/254, Q4_0 amax/8, Q4_K
 * (max-min)/30, Q6_K amax/62, each with a small stated slack for scale rounding, plus the
 * floor set by the smallest fp16 scale 2^-24 for tiny blocks).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float rng_uniform(void) { /* [-1, 1) */
    return (float)((double)rng_u32() / 2147483648.0 - 1.0);
}

/* test vectors of several shapes: uniform, gaussian-ish, outliers, constant, zeros, tiny */
static void fill(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0:
            x[i] = rng_uniform();
            break;
        case 1:
            x[i] = (rng_uniform() + rng_uniform() + rng_uniform()) * 0.05f;
            break;
        case 2:
            x[i] = rng_uniform() * ((rng_u32() % 61 == 0) ? 40.0f : 0.5f);
            break;
        case 3:
            x[i] = 0.37f;
            break;
        case 4:
            x[i] = 0.0f;
            break;
        case 5:
            x[i] = rng_uniform() * 1e-6f;
            break;
        case 6:
            x[i] = fabsf(rng_uniform()) + 2.0f;
            break; /* all positive, min far from 0 */
        default:
            x[i] = -fabsf(rng_uniform()) * 3.0f;
            break;
        }
    }
}

enum { N = 4096, KINDS = 8 };

static const float SLACK = 0x1p-20f;

static void check_traits(void) {
    struct {
        kiln_dtype t;
        const char *name;
        int bs;
        size_t ts;
    } want[] = {
        {KILN_DTYPE_F32, "f32", 1, 4},       {KILN_DTYPE_F16, "f16", 1, 2},
        {KILN_DTYPE_BF16, "bf16", 1, 2},     {KILN_DTYPE_Q4_0, "q4_0", 32, 18},
        {KILN_DTYPE_Q8_0, "q8_0", 32, 34},   {KILN_DTYPE_Q4_K, "q4_K", 256, 144},
        {KILN_DTYPE_Q6_K, "q6_K", 256, 210}, {KILN_DTYPE_I32, "i32", 1, 4},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_dtype_traits *tr = kiln_dtype_traits_of(want[i].t);
        REQUIRE(tr != NULL);
        CHECK(strcmp(tr->name, want[i].name) == 0);
        CHECK(strcmp(kiln_dtype_name(want[i].t), want[i].name) == 0);
        CHECK(tr->block_size == want[i].bs);
        CHECK(tr->type_size == want[i].ts);
        CHECK(tr->is_quantized == (want[i].bs > 1));
        CHECK((tr->to_float == NULL) == (want[i].t == KILN_DTYPE_I32));
        CHECK(kiln_dtype_row_size(want[i].t, 512) == 512 / (size_t)want[i].bs * want[i].ts);
        CHECK(kiln_dtype_row_size(want[i].t, 0) == 0);
        CHECK(kiln_dtype_row_size(want[i].t, -want[i].bs) == 0);
        if (want[i].bs > 1) CHECK(kiln_dtype_row_size(want[i].t, want[i].bs + 1) == 0);
    }
    /* GGML ids kiln does not implement (Q4_1=3, Q5_0=6, Q2_K=10, F64=28) and out-of-range */
    int unsupported[] = {-1, 3, 4, 5, 6, 7, 9, 10, 11, 13, 15, 16, 28, 39, 40, 1000};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        CHECK(kiln_dtype_traits_of(unsupported[i]) == NULL);
        CHECK(strcmp(kiln_dtype_name(unsupported[i]), "unknown") == 0);
        CHECK(kiln_dtype_row_size((kiln_dtype)unsupported[i], 32) == 0);
    }
    /* overflow: a row whose byte size does not fit size_t */
    CHECK(kiln_dtype_row_size(KILN_DTYPE_F32, INT64_MAX - 7) == 0);
    CHECK(kiln_dtype_row_size(KILN_DTYPE_I32, INT64_MAX / 2 + 8) == 0);
}

static float h2f(uint16_t h) {
    return kiln_fp16_to_fp32(h);
}

static void roundtrip(kiln_dtype t, int kind, double *worst_rel) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    size_t bytes = kiln_dtype_row_size(t, N);
    uint8_t *q = malloc(bytes);
    REQUIRE(x && y && q && bytes);
    fill(x, N, kind);
    tr->from_float(x, q, N);
    tr->to_float(q, y, N);
    int bad = 0;
    for (int64_t i = 0; i < N; i++) {
        float err = fabsf(y[i] - x[i]), bound = 0.0f;
        switch (t) {
        case KILN_DTYPE_F32:
            bound = 0.0f;
            break;
        case KILN_DTYPE_F16:
            bound = fabsf(x[i]) * 0x1p-11f + 0x1p-25f;
            break;
        case KILN_DTYPE_BF16:
            bound = fabsf(x[i]) * 0x1p-8f;
            break;
        case KILN_DTYPE_Q8_0: {
            const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)q + i / 32;
            bound = 0.5f * h2f(b->d) * (1 + SLACK) + 1e-30f;
            break;
        }
        case KILN_DTYPE_Q4_0: {
            const kiln_block_q4_0 *b = (const kiln_block_q4_0 *)q + i / 32;
            float d = h2f(b->d);
            int clamped = d != 0.0f && x[i] / d > 7.5f;
            bound = (clamped ? 1.0f : 0.5f) * fabsf(d) * (1 + SLACK) + 1e-30f;
            break;
        }
        case KILN_DTYPE_Q4_K: {
            const kiln_block_q4_k *b = (const kiln_block_q4_k *)q + i / 256;
            int j = (int)(i % 256) / 32;
            uint8_t sc, m;
            kiln_q4k_scale_min(j, b->scales, &sc, &m);
            float dm = h2f(b->dmin) * m;
            bound = 0.5f * h2f(b->d) * sc + SLACK * (fabsf(x[i]) + dm) + 1e-30f;
            break;
        }
        case KILN_DTYPE_Q6_K: {
            const kiln_block_q6_k *b = (const kiln_block_q6_k *)q + i / 256;
            int j = (int)(i % 256) / 16;
            bound = 0.5f * h2f(b->d) * b->scales[j] + SLACK * fabsf(x[i]) + 1e-30f;
            break;
        }
        default:
            break;
        }
        if (!(err <= bound) && bad++ < 5)
            fprintf(stderr, "%s kind %d elem %lld: x=%g y=%g err=%g bound=%g\n", tr->name, kind,
                    (long long)i, x[i], y[i], err, bound);
    }
    CHECKF(bad == 0, "%s kind %d: %d elements beyond the bound", tr->name, kind, bad);

    /* the stored scales are near-minimal: error relative to the block's range */
    int64_t bs = tr->block_size > 1 ? tr->block_size : 32;
    for (int64_t b0 = 0; b0 < N; b0 += bs) {
        float lo = 0, hi = 0, amax = 0, maxerr = 0;
        for (int64_t i = b0; i < b0 + bs; i++) {
            lo = fminf(lo, x[i]);
            hi = fmaxf(hi, x[i]);
            amax = fmaxf(amax, fabsf(x[i]));
            maxerr = fmaxf(maxerr, fabsf(y[i] - x[i]));
        }
        if (amax > 0) *worst_rel = fmax(*worst_rel, maxerr / amax);
        /* limits from the quantizers' construction (scales rounded up by at most one
         * fp16 ulp and, for the K types, one 6/8-bit code step). fp16 scales cannot go
         * below 2^-24, which sets a floor of half that step for tiny blocks (kind 5). */
        const float floor_step = 0x1p-24f;
        float limit;
        switch (t) {
        case KILN_DTYPE_Q8_0:
            limit = amax * (0.5f / 127) * 1.002f + 0.5f * floor_step;
            break;
        case KILN_DTYPE_Q4_0:
            limit = amax * (1.0f / 8) * 1.002f + floor_step;
            break;
        case KILN_DTYPE_Q4_K:
            limit = (hi - lo) * (0.5f / 15) * 1.04f + floor_step;
            break;
        case KILN_DTYPE_Q6_K:
            limit = amax * (0.5f / 31) * 1.01f + 0.5f * floor_step;
            break;
        default:
            limit = amax * 0x1p-8f + 0x1p-24f;
            break;
        }
        CHECKF(maxerr <= limit + 1e-30f, "%s kind %d block %lld: max err %g > limit %g", tr->name,
               kind, (long long)(b0 / bs), maxerr, limit);
    }
    free(x);
    free(y);
    free(q);
}

/* Non-finite and huge inputs: the quantizers must not hit undefined behaviour (checked under
 * UBSan) and must store finite scales, so every dequantized value is finite. */
static void check_nonfinite(void) {
    kiln_dtype types[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    float x[512], y[512];
    for (int v = 0; v < 4; v++) {
        for (int i = 0; i < 512; i++) x[i] = rng_uniform();
        for (int i = 0; i < 512; i += 37)
            x[i] = v == 0 ? NAN : v == 1 ? INFINITY : v == 2 ? -INFINITY : 3e38f;
        for (int t = 0; t < 4; t++) {
            const kiln_dtype_traits *tr = kiln_dtype_traits_of(types[t]);
            uint8_t q[2 * 210 * 2];
            tr->from_float(x, q, 512);
            tr->to_float(q, y, 512);
            int finite = 1;
            for (int i = 0; i < 512; i++) finite &= isfinite(y[i]);
            CHECKF(finite, "%s: non-finite output for input kind %d", tr->name, v);
        }
    }
}

int main(void) {
    check_traits();
    check_nonfinite();
    kiln_dtype types[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                          KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        double worst = 0;
        for (int kind = 0; kind < KINDS; kind++) roundtrip(types[t], kind, &worst);
        printf("%-5s worst block max|err|/amax = %.5f\n", kiln_dtype_name(types[t]), worst);
    }
    return kiln_test_finish("test_quant_roundtrip");
}
