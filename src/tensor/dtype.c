/*
 * dtype.c - the dtype traits table, half/bfloat16 conversions, and the scalar reference
 * dequantizers and quantizers of GGML's block formats.
 *
 * Block layouts follow GGML's ggml-common.h (read for semantics; this is an independent
 * implementation):
 *   Q4_0 (32 elems, 18 bytes):  fp16 d; uint8 qs[16]. elem j < 16: ((qs[j] & 15) - 8) * d,
 *                               elem j >= 16: ((qs[j-16] >> 4) - 8) * d.
 *   Q8_0 (32 elems, 34 bytes):  fp16 d; int8 qs[32]. elem j: qs[j] * d.
 *   Q4_K (256 elems, 144 bytes): fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128].
 *                               8 sub-blocks of 32 with 6-bit scale sc and min m (packing in
 *                               kiln_q4k_scale_min); elem = d*sc * q - dmin*m, q a nibble:
 *                               64-element chunk c uses qs[32c .. 32c+31], low nibbles are
 *                               sub-block 2c, high nibbles sub-block 2c+1.
 *   Q6_K (256 elems, 210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d.
 *                               elem = d * scales[e/16] * (q6 - 32); per 128-element half h
 *                               (ql += 64h, qh += 32h), for l < 32:
 *                               e=l:    ql[l] & 15     | ((qh[l] >> 0) & 3) << 4
 *                               e=l+32: ql[l+32] & 15  | ((qh[l] >> 2) & 3) << 4
 *                               e=l+64: ql[l] >> 4     | ((qh[l] >> 4) & 3) << 4
 *                               e=l+96: ql[l+32] >> 4  | ((qh[l] >> 6) & 3) << 4
 *
 * The quantizers are simple and exact about their error bound (not llama.cpp's iterative
 * search): every scale is rounded to fp16 (and, for the K types, to its 6/8-bit code)
 * *before* the quants are chosen, rounding scales up so the grid always covers the data.
 * Resulting per-element bounds (see tests/tensor/test_quant_roundtrip.c):
 *   Q8_0: |err| <= d/2;  Q4_0: |err| <= d/2 on the side of the signed max, <= d at the
 *   other extreme;  Q4_K: |err| <= (d*sc)/2;  Q6_K: |err| <= (d*sc)/2  (plus float rounding).
 */
#include "tensor/dtype.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- half / bfloat16 */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kiln_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13)); /* Inf / NaN */
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kiln_fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 rounds (to even) past the largest half 65504: Inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) { /* below 2^-14: half subnormal or zero */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7FFFFFu) | (e ? 0x800000u : 0u);
        /* value = m * 2^(e-150) (e >= 1) = m * 2^(e-126) units of 2^-24 */
        uint32_t s = (e ? 126u - e : 125u);
        if (s > 24) return sign;
        uint32_t r = m >> s;
        uint32_t rem = m & ((1u << s) - 1u);
        uint32_t half = 1u << (s - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t base = (a >> 13) - (112u << 10);
    uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (base & 1u))) base++;
    return (uint16_t)(sign | base);
}

float kiln_bf16_to_fp32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t kiln_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The smallest fp16 value >= v (v >= 0); saturates at the largest finite half 65504. */
static uint16_t fp16_ceil(float v) {
    if (!(v <= 65504.0f)) return 0x7BFFu;
    uint16_t h = kiln_fp32_to_fp16(v);
    if (kiln_fp16_to_fp32(h) < v) h++; /* positive halves are ordered like their bits */
    return h;
}

/* ---------------------------------------------------------------- plain types */

static void f32_to_float(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* 16-bit element access through memcpy: plain-type rows may be only byte-aligned (a
 * safetensors data section can start at any offset). */
static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_fp16_to_fp32(ld16(s + 2 * i));
}

static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kiln_fp32_to_fp16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_fp32(ld16(s + 2 * i));
}

static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kiln_fp32_to_bf16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

/* ---------------------------------------------------------------- Q8_0 */

static void q8_0_to_float(const void *src, float *dst, int64_t n) {
    const kiln_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kiln_fp16_to_fp32(b[i].d);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = (float)b[i].qs[j] * d;
    }
}

static void q8_0_from_float(const float *src, void *dst, int64_t n) {
    kiln_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = src + i * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        /* d rounded up so that |x| / d <= 127 holds with the stored scale */
        uint16_t dh = amax > 0.0f ? fp16_ceil(amax / 127.0f) : 0u;
        float d = kiln_fp16_to_fp32(dh);
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        b[i].d = dh;
        for (int j = 0; j < 32; j++) {
            float q = nearbyintf(x[j] * id);
            q = fminf(127.0f, fmaxf(-127.0f, q));
            b[i].qs[j] = (int8_t)q;
        }
    }
}

/* Activation quantizer with ggml's quantize_row_q8_0_ref semantics (see dtype.h). */
void kiln_quantize_q8_0_act(const float *x, kiln_block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(x[j]);
            if (!(a <= FLT_MAX))
                finite = false;
            else if (a > amax)
                amax = a;
        }
        memset(y[i].qs, 0, sizeof y[i].qs);
        if (!finite) {
            y[i].d = 0x7E00u;
            continue;
        }
        float d = amax / 127.0f;
        y[i].d = kiln_fp32_to_fp16(d);
        if (!(d >= FLT_MIN)) continue; /* fp16(d) == 0 here */
        float id = 1.0f / d;
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ---------------------------------------------------------------- Q4_0 */

static void q4_0_to_float(const void *src, float *dst, int64_t n) {
    const kiln_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kiln_fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[i * 32 + j] = (float)((int)(b[i].qs[j] & 15) - 8) * d;
            dst[i * 32 + j + 16] = (float)((int)(b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_0_from_float(const float *src, void *dst, int64_t n) {
    kiln_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = src + i * 32;
        /* As GGML: the element of largest magnitude maps to code 0 (value -8*d), so d takes
         * the opposite sign of that element and the full [-8, 7] range is used. */
        float vmax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > fabsf(vmax)) vmax = x[j];
        float amax = fabsf(vmax);
        uint16_t dh = amax > 0.0f ? fp16_ceil(amax / 8.0f) : 0u;
        if (vmax > 0.0f) dh |= 0x8000u; /* negative scale */
        float d = kiln_fp16_to_fp32(dh);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = dh;
        for (int j = 0; j < 16; j++) {
            float q0 = fminf(15.0f, fmaxf(0.0f, nearbyintf(x[j] * id) + 8.0f));
            float q1 = fminf(15.0f, fmaxf(0.0f, nearbyintf(x[j + 16] * id) + 8.0f));
            b[i].qs[j] = (uint8_t)((uint8_t)q0 | ((uint8_t)q1 << 4));
        }
    }
}

/* ---------------------------------------------------------------- Q4_K */

void kiln_q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Inverse of kiln_q4k_scale_min: pack eight 6-bit scales and mins into 12 bytes. */
static void q4k_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t s[12]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void q4_k_to_float(const void *src, float *dst, int64_t n) {
    const kiln_block_q4_k *b = src;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kiln_fp16_to_fp32(b[i].d);
        float dmin = kiln_fp16_to_fp32(b[i].dmin);
        float *y = dst + i * 256;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            uint8_t sc, m;
            kiln_q4k_scale_min(2 * c, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            kiln_q4k_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[64 * c + l] = d1 * (float)(q[l] & 15) - m1;
            for (int l = 0; l < 32; l++) y[64 * c + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void q4_k_from_float(const float *src, void *dst, int64_t n) {
    kiln_block_q4_k *b = dst;
    for (int64_t i = 0; i < n / 256; i++) {
        const float *x = src + i * 256;
        float need_min[8], hi[8], max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = 0.0f, h = 0.0f; /* the grid's bottom is -dmin*m <= 0 */
            for (int l = 0; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                h = fmaxf(h, x[32 * j + l]);
            }
            need_min[j] = -lo;
            hi[j] = h;
            max_min = fmaxf(max_min, -lo);
        }
        /* dmin rounded up: every need_min[j] <= 63 * dmin, m[j] = ceil(need_min / dmin) */
        uint16_t dminh = max_min > 0.0f ? fp16_ceil(max_min / 63.0f) : 0u;
        float dmin = kiln_fp16_to_fp32(dminh);
        uint8_t sc[8], m[8];
        float off[8], need_scale[8], max_scale = 0.0f;
        for (int j = 0; j < 8; j++) {
            float mm = dmin > 0.0f ? ceilf(need_min[j] / dmin) : 0.0f;
            if (mm > 63.0f) mm = 63.0f;
            m[j] = (uint8_t)mm;
            off[j] = dmin * (float)m[j];
            /* the 16 levels must reach from -off up to hi */
            need_scale[j] = (hi[j] + off[j]) / 15.0f;
            max_scale = fmaxf(max_scale, need_scale[j]);
        }
        uint16_t dh = max_scale > 0.0f ? fp16_ceil(max_scale / 63.0f) : 0u;
        float d = kiln_fp16_to_fp32(dh);
        for (int j = 0; j < 8; j++) {
            float s = d > 0.0f ? ceilf(need_scale[j] / d) : 0.0f;
            if (s > 63.0f) s = 63.0f;
            sc[j] = (uint8_t)s;
        }
        b[i].d = dh;
        b[i].dmin = dminh;
        q4k_pack_scales(sc, m, b[i].scales);
        for (int c = 0; c < 4; c++) {
            for (int half = 0; half < 2; half++) {
                int j = 2 * c + half;
                float ds = d * (float)sc[j], ms = dmin * (float)m[j];
                float ids = ds > 0.0f ? 1.0f / ds : 0.0f;
                for (int l = 0; l < 32; l++) {
                    float q = nearbyintf((x[32 * j + l] + ms) * ids);
                    q = fminf(15.0f, fmaxf(0.0f, q));
                    uint8_t qi = (uint8_t)q;
                    if (half == 0)
                        b[i].qs[32 * c + l] = qi;
                    else
                        b[i].qs[32 * c + l] |= (uint8_t)(qi << 4);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- Q6_K */

static void q6_k_to_float(const void *src, float *dst, int64_t n) {
    const kiln_block_q6_k *b = src;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kiln_fp16_to_fp32(b[i].d);
        float *y = dst + i * 256;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b[i].ql + 64 * h;
            const uint8_t *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            float *yh = y + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                int is = l / 16;
                yh[l] = d * (float)sc[is + 0] * (float)q1;
                yh[l + 32] = d * (float)sc[is + 2] * (float)q2;
                yh[l + 64] = d * (float)sc[is + 4] * (float)q3;
                yh[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static void q6_k_from_float(const float *src, void *dst, int64_t n) {
    kiln_block_q6_k *b = dst;
    for (int64_t i = 0; i < n / 256; i++) {
        const float *x = src + i * 256;
        /* symmetric: sub-block scale s = amax/31 so q-32 stays in [-31, 31] */
        float need[16], max_need = 0.0f;
        for (int j = 0; j < 16; j++) {
            float a = 0.0f;
            for (int l = 0; l < 16; l++) a = fmaxf(a, fabsf(x[16 * j + l]));
            need[j] = a / 31.0f;
            max_need = fmaxf(max_need, need[j]);
        }
        uint16_t dh = max_need > 0.0f ? fp16_ceil(max_need / 127.0f) : 0u;
        float d = kiln_fp16_to_fp32(dh);
        uint8_t q[256];
        for (int j = 0; j < 16; j++) {
            float s = d > 0.0f ? ceilf(need[j] / d) : 0.0f;
            if (s > 127.0f) s = 127.0f;
            b[i].scales[j] = (int8_t)s;
            float ds = d * (float)b[i].scales[j];
            float ids = ds > 0.0f ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 16; l++) {
                float v = nearbyintf(x[16 * j + l] * ids);
                v = fminf(31.0f, fmaxf(-32.0f, v));
                q[16 * j + l] = (uint8_t)((int)v + 32);
            }
        }
        b[i].d = dh;
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b[i].ql + 64 * h;
            uint8_t *qh = b[i].qh + 32 * h;
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
                ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
                qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                  ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---------------------------------------------------------------- traits table */

static const kiln_dtype_traits traits[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_F32] = {"f32", 1, 4, false, f32_to_float, f32_from_float},
    [KILN_DTYPE_F16] = {"f16", 1, 2, false, f16_to_float, f16_from_float},
    [KILN_DTYPE_BF16] = {"bf16", 1, 2, false, bf16_to_float, bf16_from_float},
    [KILN_DTYPE_Q4_0] = {"q4_0", 32, sizeof(kiln_block_q4_0), true, q4_0_to_float, q4_0_from_float},
    [KILN_DTYPE_Q8_0] = {"q8_0", 32, sizeof(kiln_block_q8_0), true, q8_0_to_float, q8_0_from_float},
    [KILN_DTYPE_Q4_K] = {"q4_K", 256, sizeof(kiln_block_q4_k), true, q4_k_to_float,
                         q4_k_from_float},
    [KILN_DTYPE_Q6_K] = {"q6_K", 256, sizeof(kiln_block_q6_k), true, q6_k_to_float,
                         q6_k_from_float},
    [KILN_DTYPE_I32] = {"i32", 1, 4, false, NULL, NULL},
};

const kiln_dtype_traits *kiln_dtype_traits_of(int32_t t) {
    if (t < 0 || t >= KILN_DTYPE_COUNT || traits[t].name == NULL) return NULL;
    return &traits[t];
}

const char *kiln_dtype_name(int32_t t) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t);
    return tr ? tr->name : "unknown";
}

size_t kiln_dtype_row_size(kiln_dtype t, int64_t n) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)t);
    if (!tr || n < 0 || n % tr->block_size != 0) return 0;
    uint64_t blocks = (uint64_t)(n / tr->block_size);
    if (blocks > SIZE_MAX / tr->type_size) return 0;
    return (size_t)blocks * tr->type_size;
}
