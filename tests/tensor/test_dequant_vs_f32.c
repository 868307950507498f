/*
 * test_dequant_vs_f32 - kiln's Q8_0 / Q4_0 dequantization of real llama.cpp-quantized
 * tensors (../shared/models/llama2xs-260K/llama2xs-{Q8_0,Q4_0}.gguf) against the same
 * tensors in llama2xs-f32.gguf.
 *
 * llama.cpp's reference quantizers (ggml-quants.c, quantize_row_q8_0_ref / q4_0_ref)
 * compute the quants with the f32 scale d and store d rounded to fp16 (dh):
 *   Q8_0: d = amax/127, q = round(x/d).  Per element |deq - x| <= d/2 + 127*|d - dh|
 *         <= (0.5 + 127 * 2^-11) * |dh| (1 + 2^-10), i.e. about 0.563 |dh|.
 *   Q4_0: d = m/-8 where m is the element of largest magnitude, q = min(15, floor(x/d+8.5)).
 *         |deq - x| <= |d|/2 + 8|d - dh| for elements with x/d <= 7.5 (about 0.504 |dh|);
 *         the clamped side (x/d in (7.5, 8]) can be off by up to |d| (+ 8|d - dh|).
 * Also checked per block: dh is fp16(amax/127) (Q8_0) or fp16(-m/8) (Q4_0), within one
 * fp16 ulp; F32 tensors carried in the quantized files are bit-identical to the f32 file.
 * The observed worst ratios are printed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tensor/dtype.h"
#include "test.h"

typedef struct stats {
    int n_tensors_quant, n_tensors_f32;
    double worst_q8, worst_q4, worst_q4_clamped; /* max |deq - f32| / |dh| */
    long long n_elems;
} stats;

static void compare_file(const char *qpath, const kiln_gguf *ref, stats *st) {
    kiln_gguf *g = NULL;
    kiln_error err;
    kiln_status s = kiln_gguf_open(qpath, &g, &err);
    CHECKF(s == KILN_OK, "%s", err.message);
    if (s != KILN_OK) return;
    CHECK(g->n_tensors == ref->n_tensors);
    for (size_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        const kiln_gguf_tensor *r = kiln_gguf_find_tensor(ref, t->name);
        CHECKF(r != NULL, "%s: tensor %s missing from the f32 file", qpath, t->name);
        if (!r) continue;
        CHECK(r->dtype == KILN_DTYPE_F32);
        int64_t n = 1;
        for (int k = 0; k < 4; k++) {
            CHECK(t->ne[k] == r->ne[k]);
            n *= t->ne[k];
        }
        const float *x = r->data;
        if (t->dtype == KILN_DTYPE_F32) {
            CHECKF(memcmp(t->data, r->data, (size_t)n * 4) == 0, "%s: f32 tensor %s differs", qpath,
                   t->name);
            st->n_tensors_f32++;
            continue;
        }
        REQUIRE(t->dtype == KILN_DTYPE_Q8_0 || t->dtype == KILN_DTYPE_Q4_0);
        REQUIRE(n % 32 == 0);
        CHECK(t->nbytes == kiln_dtype_row_size(t->dtype, n));
        float *y = malloc((size_t)n * sizeof(float));
        REQUIRE(y);
        kiln_dtype_traits_of(t->dtype)->to_float(t->data, y, n);
        st->n_tensors_quant++;
        int bad = 0, bad_scale = 0;
        size_t bsize = kiln_dtype_traits_of(t->dtype)->type_size;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = (const uint8_t *)t->data + (size_t)b * bsize;
            float dh = kiln_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8));
            const float *xb = x + 32 * b;
            float m = 0.0f;
            for (int j = 0; j < 32; j++)
                if (fabsf(xb[j]) > fabsf(m)) m = xb[j];
            /* the scale the reference quantizer derives from the f32 block */
            float d_ref = t->dtype == KILN_DTYPE_Q8_0 ? fabsf(m) / 127.0f : m / -8.0f;
            if (fabsf(dh - d_ref) > fabsf(d_ref) * 0x1p-10f + 1e-30f) bad_scale++;
            float ad = fabsf(dh);
            for (int j = 0; j < 32; j++) {
                double e = fabs((double)y[32 * b + j] - (double)xb[j]);
                double ratio = ad > 0 ? e / ad : (e == 0 ? 0 : INFINITY);
                int clamped = t->dtype == KILN_DTYPE_Q4_0 && dh != 0.0f && xb[j] / dh > 7.5f;
                double bound;
                if (t->dtype == KILN_DTYPE_Q8_0)
                    bound = (0.5 + 127 * 0x1p-11) * (1 + 0x1p-10);
                else
                    bound = (clamped ? 1.0 : 0.5) * (1 + 0x1p-10) + 8 * 0x1p-11;
                double *worst = t->dtype == KILN_DTYPE_Q8_0 ? &st->worst_q8
                                : clamped                   ? &st->worst_q4_clamped
                                                            : &st->worst_q4;
                *worst = fmax(*worst, ratio);
                if (!(ratio <= bound) && bad++ < 3)
                    fprintf(stderr, "%s %s elem %lld: deq %.9g f32 %.9g d %g ratio %g\n", qpath,
                            t->name, (long long)(32 * b + j), y[32 * b + j], xb[j], dh, ratio);
            }
        }
        st->n_elems += n;
        CHECKF(bad == 0, "%s: %s: %d elements beyond the bound", qpath, t->name, bad);
        CHECKF(bad_scale == 0, "%s: %s: %d block scales differ from the f32 block's", qpath,
               t->name, bad_scale);
        free(y);
    }
    kiln_gguf_close(g);
}

int main(void) {
    const char *fref = kiln_test_shared("models/llama2xs-260K/llama2xs-f32.gguf");
    const char *fq8 = kiln_test_shared("models/llama2xs-260K/llama2xs-Q8_0.gguf");
    const char *fq4 = kiln_test_shared("models/llama2xs-260K/llama2xs-Q4_0.gguf");
    kiln_test_require_file(fref);
    kiln_test_require_file(fq8);
    kiln_test_require_file(fq4);
    kiln_gguf *ref = NULL;
    kiln_error err;
    REQUIRE(kiln_gguf_open(fref, &ref, &err) == KILN_OK);

    stats s8 = {0}, s4 = {0};
    compare_file(fq8, ref, &s8);
    compare_file(fq4, ref, &s4);
    printf("Q8_0 file: %d quantized tensors (%lld elems), %d f32; worst |deq-f32|/|d| = %.4f\n",
           s8.n_tensors_quant, s8.n_elems, s8.n_tensors_f32, s8.worst_q8);
    printf("Q4_0 file: %d quantized tensors (%lld elems), %d f32; worst |deq-f32|/|d|: q4_0 "
           "%.4f (clamped side %.4f), q8_0 (output.weight) %.4f\n",
           s4.n_tensors_quant, s4.n_elems, s4.n_tensors_f32, s4.worst_q4, s4.worst_q4_clamped,
           s4.worst_q8);
    CHECK(s8.n_tensors_quant > 0);
    CHECK(s4.n_tensors_quant > 0);
    kiln_gguf_close(ref);
    return kiln_test_finish("test_dequant_vs_f32");
}
