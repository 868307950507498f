/*
 * matmul.c - y = x W^T for weight rows of any supported dtype against f32 activations.
 *
 * Work is split over the pool's threads by contiguous ranges of output rows. Within a
 * thread, rows are visited in cache-sized panels; for each panel, tokens are taken in
 * groups of the kernel's max_tok and each row is decoded once per group. The reduction of
 * each (t, o) is the kernel's own fixed order, so none of this changes any output bit.
 */
#include <math.h>
#include <stddef.h>

#include "backend/cpu/kernels.h"

typedef struct mm_ctx {
    const kiln_cpu_kernel *k;
    const uint8_t *w;
    size_t row_bytes;
    int64_t n_out, n_in, n_tok;
    const float *x;
    float *y;
} mm_ctx;

enum { PANEL_BYTES = 64 * 1024, MAX_TILE = 64 };

static void mm_rows(const mm_ctx *c, int64_t o0, int64_t o1) {
    const kiln_cpu_kernel *k = c->k;
    int64_t panel = (int64_t)(PANEL_BYTES / (c->row_bytes ? c->row_bytes : 1));
    if (panel < 2) panel = 2;
    int tr = k->tile ? k->max_rows : 1, tt = k->tile ? k->max_tok : 1;
    float tmp[MAX_TILE];
    if (tr * tt > MAX_TILE) tr = 1, tt = MAX_TILE; /* never with the kernels in this dir */
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = ob + panel < o1 ? ob + panel : o1;
        for (int64_t t = 0; t < c->n_tok; t += tt) {
            int nt = (int)(c->n_tok - t < tt ? c->n_tok - t : tt);
            const float *xt = c->x + t * c->n_in;
            for (int64_t o = ob; o < oe; o += tr) {
                int nr = (int)(oe - o < tr ? oe - o : tr);
                const uint8_t *wr = c->w + (size_t)o * c->row_bytes;
                float *yo = c->y + t * c->n_out + o;
                if (k->tile) {
                    k->tile(c->n_in, wr, c->row_bytes, nr, xt, c->n_in, nt, tmp);
                    for (int q = 0; q < nr; q++)
                        for (int r = 0; r < nt; r++) yo[r * c->n_out + q] = tmp[q * nt + r];
                } else {
                    for (int r = 0; r < nt; r++)
                        yo[r * c->n_out] = k->dot(c->n_in, wr, xt + r * c->n_in);
                }
            }
        }
    }
}

static void mm_worker(void *p, int ith, int nth) {
    const mm_ctx *c = p;
    int64_t o0 = c->n_out * ith / nth, o1 = c->n_out * (ith + 1) / nth;
    if (o0 < o1) mm_rows(c, o0, o1);
}

void kiln_cpu_matmul_path(kiln_threadpool *tp, kiln_simd path, const void *w, kiln_dtype wt,
                          int64_t n_out, int64_t n_in, const float *x, int64_t n_tok, float *y) {
    if (n_out <= 0 || n_tok <= 0) return;
    const kiln_cpu_kernel *k = kiln_cpu_kernel_get(wt, path);
    size_t row_bytes = kiln_dtype_row_size(wt, n_in);
    if (!k || n_in < 0 || (row_bytes == 0 && n_in != 0)) {
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = NAN;
        return;
    }
    mm_ctx c = {k, w, row_bytes, n_out, n_in, n_tok, x, y};
    /* small products are not worth waking the workers for (results are the same) */
    double work = (double)n_out * (double)n_in * (double)n_tok;
    if (tp == NULL || kiln_threadpool_size(tp) == 1 || work < 32768.0 || n_out < 2)
        mm_worker(&c, 0, 1);
    else
        kiln_threadpool_run(tp, mm_worker, &c);
}

void kiln_cpu_matmul(kiln_threadpool *tp, const void *w, kiln_dtype wt, int64_t n_out, int64_t n_in,
                     const float *x, int64_t n_tok, float *y) {
    kiln_cpu_matmul_path(tp, kiln_simd_active(), w, wt, n_out, n_in, x, n_tok, y);
}
