/*
 * matmul.c - y = x W^T for weight rows of any supported dtype against f32 activations, or,
 * for Q8_0/Q4_0 weights in q8 mode, against activations quantized to Q8_0 once per call.
 *
 * Work is split over the pool's threads by contiguous ranges of output rows. Within a
 * thread, rows are visited in cache-sized panels; for each panel, tokens are taken in
 * groups of the kernel's max_tok and each row is decoded once per group. The reduction of
 * each (t, o) is the kernel's own fixed order, so none of this changes any output bit.
 * In q8 mode each activation row is quantized on its own (same bits whatever the batch).
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

/* ---------------------------------------------------------------- q8 activations */

typedef struct mm_q8_ctx {
    const kiln_cpu_q8_kernel *k;
    const uint8_t *w;
    size_t row_bytes, xs;
    int64_t n_out, n_in, n_tok;
    const uint8_t *xq;
    float *y;
} mm_q8_ctx;

static void mm_q8_rows(const mm_q8_ctx *c, int64_t o0, int64_t o1) {
    const kiln_cpu_q8_kernel *k = c->k;
    if (k->small && c->n_in < 512) { /* short rows: 8 rows per call, rows in lanes */
        for (int64_t t = 0; t < c->n_tok; t++)
            for (int64_t o = o0; o < o1; o += 8)
                k->small(c->n_in, c->w + (size_t)o * c->row_bytes, c->row_bytes,
                         (int)(o1 - o < 8 ? o1 - o : 8), c->xq + (size_t)t * c->xs,
                         c->y + t * c->n_out + o);
        return;
    }
    int64_t panel = (int64_t)(PANEL_BYTES / (c->row_bytes ? c->row_bytes : 1));
    if (panel < 2) panel = 2;
    int tr = k->tile ? k->max_rows : 1, tt = k->tile ? k->max_tok : 1;
    float tmp[MAX_TILE];
    if (tr * tt > MAX_TILE) tr = 1, tt = MAX_TILE; /* never with the kernels in this dir */
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = ob + panel < o1 ? ob + panel : o1;
        for (int64_t t = 0; t < c->n_tok; t += tt) {
            int nt = (int)(c->n_tok - t < tt ? c->n_tok - t : tt);
            const uint8_t *xt = c->xq + (size_t)t * c->xs;
            for (int64_t o = ob; o < oe; o += tr) {
                int nr = (int)(oe - o < tr ? oe - o : tr);
                const uint8_t *wr = c->w + (size_t)o * c->row_bytes;
                float *yo = c->y + t * c->n_out + o;
                if (k->tile) {
                    k->tile(c->n_in, wr, c->row_bytes, nr, xt, c->xs, nt, tmp);
                    for (int q = 0; q < nr; q++)
                        for (int r = 0; r < nt; r++) yo[r * c->n_out + q] = tmp[q * nt + r];
                } else {
                    for (int r = 0; r < nt; r++)
                        yo[r * c->n_out] = k->dot(c->n_in, wr, xt + (size_t)r * c->xs);
                }
            }
        }
    }
}

static void mm_q8_worker(void *p, int ith, int nth) {
    const mm_q8_ctx *c = p;
    int64_t o0 = c->n_out * ith / nth, o1 = c->n_out * (ith + 1) / nth;
    if (o0 < o1) mm_q8_rows(c, o0, o1);
}

typedef struct q8_quant_ctx {
    kiln_simd path;
    int64_t n_in, n_tok;
    const float *x;
    uint8_t *xq;
    size_t xs;
} q8_quant_ctx;

static void q8_quant_worker(void *p, int ith, int nth) {
    const q8_quant_ctx *c = p;
    int64_t t0 = c->n_tok * ith / nth, t1 = c->n_tok * (ith + 1) / nth;
    if (t0 < t1)
        kiln_cpu_q8_quantize(c->path, c->n_in, t1 - t0, c->x + t0 * c->n_in,
                             c->xq + (size_t)t0 * c->xs);
}

static bool use_pool(kiln_threadpool *tp, double work, int64_t n_items) {
    return tp != NULL && kiln_threadpool_size(tp) > 1 && work >= 32768.0 && n_items >= 2;
}

/* quantize tokens [0, n_tok) into xq, then y rows for those tokens */
static void q8_run(kiln_threadpool *tp, kiln_simd path, const kiln_cpu_q8_kernel *k, const void *w,
                   size_t row_bytes, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                   float *y, uint8_t *xq, size_t xs) {
    q8_quant_ctx qc = {path, n_in, n_tok, x, xq, xs};
    /* quantizing is ~n_in work per token: only large batches are worth a fork/join */
    if (use_pool(tp, (double)n_in * (double)n_tok / 4.0, n_tok))
        kiln_threadpool_run(tp, q8_quant_worker, &qc);
    else
        q8_quant_worker(&qc, 0, 1);
    mm_q8_ctx c = {k, w, row_bytes, xs, n_out, n_in, n_tok, xq, y};
    if (use_pool(tp, (double)n_out * (double)n_in * (double)n_tok, n_out))
        kiln_threadpool_run(tp, mm_q8_worker, &c);
    else
        mm_q8_worker(&c, 0, 1);
}

enum { Q8_STACK_BYTES = 16 * 1024 };

static void matmul_q8(kiln_threadpool *tp, kiln_simd path, const kiln_cpu_q8_kernel *k,
                      const void *w, size_t row_bytes, int64_t n_out, int64_t n_in, const float *x,
                      int64_t n_tok, float *y) {
    size_t xs = kiln_cpu_q8_row_size(n_in);
    _Alignas(64) uint8_t stack[Q8_STACK_BYTES];
    if (xs == 0) { /* n_in == 0: every dot is the empty sum */
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = 0.0f;
        return;
    }
    int64_t per_stack = (int64_t)(Q8_STACK_BYTES / xs);
    if (n_tok <= per_stack) {
        q8_run(tp, path, k, w, row_bytes, n_out, n_in, x, n_tok, y, stack, xs);
        return;
    }
    uint8_t *buf = NULL;
    if ((uint64_t)n_tok <= (SIZE_MAX - 63) / xs) {
        size_t bytes = ((size_t)n_tok * xs + 63) & ~(size_t)63;
        buf = aligned_alloc(64, bytes);
    }
    if (buf) {
        q8_run(tp, path, k, w, row_bytes, n_out, n_in, x, n_tok, y, buf, xs);
        free(buf);
        return;
    }
    if (per_stack == 0) { /* one quantized row does not fit the stack buffer */
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = NAN;
        return;
    }
    /* out of memory: token chunks through the stack buffer (same bits per (t, o)) */
    for (int64_t t = 0; t < n_tok; t += per_stack) {
        int64_t nt = n_tok - t < per_stack ? n_tok - t : per_stack;
        q8_run(tp, path, k, w, row_bytes, n_out, n_in, x + t * n_in, nt, y + t * n_out, stack, xs);
    }
}

/* ---------------------------------------------------------------- entry points */

static kiln_act_mode g_act_default = KILN_ACT_Q8;
static pthread_once_t g_act_once = PTHREAD_ONCE_INIT;

static void act_init(void) {
    const char *e = getenv("KILN_Q8_ACT");
    if (e && strcmp(e, "0") == 0) g_act_default = KILN_ACT_F32;
}

kiln_act_mode kiln_cpu_act_default(void) {
    pthread_once(&g_act_once, act_init);
    return g_act_default;
}

void kiln_cpu_matmul_ex(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act, const void *w,
                        kiln_dtype wt, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                        float *y) {
    if (n_out <= 0 || n_tok <= 0) return;
    if (act == KILN_ACT_AUTO) act = kiln_cpu_act_default();
    size_t row_bytes = kiln_dtype_row_size(wt, n_in);
    if (act == KILN_ACT_Q8 && kiln_cpu_q8_supported(wt)) {
        const kiln_cpu_q8_kernel *k = kiln_cpu_q8_kernel_get(wt, path);
        if (!k || n_in < 0 || (row_bytes == 0 && n_in != 0)) {
            for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = NAN;
            return;
        }
        matmul_q8(tp, path, k, w, row_bytes, n_out, n_in, x, n_tok, y);
        return;
    }
    const kiln_cpu_kernel *k = kiln_cpu_kernel_get(wt, path);
    if (!k || n_in < 0 || (row_bytes == 0 && n_in != 0)) {
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = NAN;
        return;
    }
    mm_ctx c = {k, w, row_bytes, n_out, n_in, n_tok, x, y};
    /* small products are not worth waking the workers for (results are the same) */
    if (use_pool(tp, (double)n_out * (double)n_in * (double)n_tok, n_out))
        kiln_threadpool_run(tp, mm_worker, &c);
    else
        mm_worker(&c, 0, 1);
}

void kiln_cpu_matmul_path(kiln_threadpool *tp, kiln_simd path, const void *w, kiln_dtype wt,
                          int64_t n_out, int64_t n_in, const float *x, int64_t n_tok, float *y) {
    kiln_cpu_matmul_ex(tp, path, KILN_ACT_AUTO, w, wt, n_out, n_in, x, n_tok, y);
}

void kiln_cpu_matmul(kiln_threadpool *tp, const void *w, kiln_dtype wt, int64_t n_out, int64_t n_in,
                     const float *x, int64_t n_tok, float *y) {
    kiln_cpu_matmul_ex(tp, kiln_simd_active(), KILN_ACT_AUTO, w, wt, n_out, n_in, x, n_tok, y);
}
