/*
 * matmul.c - y = x W^T for weight rows of any supported dtype against f32 activations, or,
 * for Q8_0/Q4_0 weights in q8 mode, against activations quantized to Q8_0 once per call.
 *
 * One call may carry several weights that read the same x (kiln_cpu_matmul_multi: q/k/v,
 * gate/up): "segments". The activations are quantized once, and the rows of all segments,
 * end to end, are split over the pool's threads by contiguous ranges in one fork/join.
 * Within a thread, rows are visited in cache-sized panels; for each panel, tokens are taken
 * in groups of the kernel's max_tok and each row is decoded once per group (or, for many
 * tokens, the panel is packed once by the q8 kernel and reused by every token tile). One
 * token (decode) instead reads the thread's rows start to end through the kernel's gemv
 * (one stream, software prefetch KILN_GEMV_PF bytes ahead). The reduction of each (t, o) is
 * the kernel's own fixed order, so none of this changes any output bit. In q8 mode each
 * activation row is quantized on its own (same bits whatever the batch).
 *
 * Packed F16 weights (KILN_LAYOUT_F16_R64, cpu.h; the default for F16 model weights) go
 * through mm_r64_rows instead: 64-row groups, panels of groups, token tiles of nearly equal
 * size, and the threads' row ranges split at multiples of 64. The F16 figures quoted below
 * for the row kernels (panels, gemv) are those of the file layout (KILN_REPACK=0).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"

/* Row panels of ~PANEL_BYTES (PK_PANEL_BYTES packed) stay in the core's L2 while every
 * token tile passes over them, so the activations are re-read from L3 once per panel:
 * 256 KiB (vs 64) took F16 prefill of a 2048 x 5632 matrix from 130 to 184 GFLOP/s on one
 * core, and 2 threads from 244 to 366 */
enum { PANEL_BYTES = 256 * 1024, MAX_TILE = 128, MAX_SEG = KILN_CPU_MM_MAX_OUTS };

/* one weight of a call: rows [0, n_out) of w into y[t * n_out + o] */
typedef struct mm_seg {
    const kiln_cpu_kernel *k;      /* f32 mode */
    const kiln_cpu_q8_kernel *k8;  /* q8 mode */
    const kiln_cpu_r64_kernel *kp; /* KILN_LAYOUT_F16_R64 (either mode) */
    const uint8_t *w;
    size_t row_bytes;
    int64_t n_out;
    float *y;
    int64_t pk_rows; /* q8: rows per packed panel, 0 = unpacked */
} mm_seg;

typedef struct mm_ctx {
    int nseg;
    mm_seg seg[MAX_SEG];
    int64_t total;     /* rows of all segments */
    bool align_groups; /* a packed segment: split the rows between threads at multiples of 64 */
    int64_t n_in, n_tok;
    const float *x;    /* f32 mode */
    const uint8_t *xq; /* q8 mode */
    size_t xs;
    uint8_t *pk;     /* q8: packed-panel scratch, pk_bytes per thread; NULL: no packing */
    size_t pk_bytes; /* per thread */
} mm_ctx;

/* Small batches (2+ tokens, or kernels without gemv) stream each weight once on the first
 * pass over a panel: the rows PF_BYTES ahead of the current tile are prefetched, which the
 * hardware prefetchers alone do not reach (measured +15-25% bandwidth on a 2-core AMD EPYC
 * with 2 threads; batched decode of 16 sequences runs at 0.6x without it). One-token calls
 * go through mm_gemv instead. */
enum { PF_BYTES = 16 * 1024 };

static inline void prefetch_rows(const uint8_t *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) {
#if defined(__x86_64__) || defined(__i386__)
        /* an asm statement: GCC 12 deletes a loop of __builtin_prefetch here as effect-free */
        __asm__ volatile("prefetchnta %0" ::"m"(*(const char *)(p + i)));
#else
        __builtin_prefetch(p + i, 0, 0);
#endif
    }
}

/* prefetch the rows that follow the tile at wr by about PF_BYTES, if inside the range */
static inline void prefetch_ahead(const uint8_t *wr, size_t row_bytes, int nr, int64_t o,
                                  int64_t o1) {
    int64_t ahead = (int64_t)(PF_BYTES / (row_bytes ? row_bytes : 1));
    if (ahead < 1) ahead = 1;
    if (o + ahead < o1) prefetch_rows(wr + (size_t)ahead * row_bytes, (size_t)nr * row_bytes);
}

/* One token (decode) with a gemv kernel: rows [o0, o1) in one stream, software prefetch
 * GEMV_PF bytes ahead while that stays inside the weight. On a 2-core AMD EPYC (Zen 5),
 * tinyllama-1.1b F16 decode, A/B pairs against 4-row tiles with a per-tile prefetch burst:
 * 1 thread 12.3 -> 17.7 tok/s, 2 threads 22.8 -> 31.5 (distance 2 KiB: 1.07x, 4 KiB: 1.22x,
 * 8 KiB: 1.39x, 16 KiB: 1.44x, 32 KiB: 1.39x at 1 thread). env KILN_GEMV_PF overrides the
 * distance in bytes (benchmarks; 0 = no software prefetch; the bits are the same). */
enum { GEMV_PF = 16384 };

static size_t g_gemv_pf = GEMV_PF;
static pthread_once_t g_gemv_once = PTHREAD_ONCE_INIT;
static void gemv_init(void) { /* a decimal byte count up to 1 GiB, else the default */
    const char *e = getenv("KILN_GEMV_PF");
    if (!e || *e < '0' || *e > '9') return;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    if (errno == 0 && *end == '\0' && v <= (1ull << 30)) g_gemv_pf = (size_t)v;
}
static size_t gemv_pf(void) {
    pthread_once(&g_gemv_once, gemv_init);
    return g_gemv_pf;
}

/* One token through the segment's gemv kernel (either mode): rows [o0, safe) with the
 * prefetch, [safe, o1) without. Row o's prefetches end before byte (o + 1) * row_bytes + pf
 * of the weight, inside it when o + 1 + ceil(pf / row_bytes) <= n_out; safe keeps one row
 * more margin than that. */
static void mm_gemv(const mm_ctx *c, const mm_seg *s, int64_t o0, int64_t o1) {
    const size_t pf = gemv_pf(), rb = s->row_bytes;
    int64_t ahead = rb ? (int64_t)(pf / rb + (pf % rb != 0)) : 0;
    int64_t safe = s->n_out - 1 - ahead;
    if (safe > o1) safe = o1;
    if (safe < o0) safe = o0;
    const int64_t from[2] = {o0, safe}, to[2] = {safe, o1};
    for (int i = 0; i < 2; i++) {
        if (to[i] <= from[i]) continue;
        const uint8_t *w = s->w + (size_t)from[i] * rb;
        size_t d = i == 0 ? pf : 0;
        if (c->xq)
            s->k8->gemv(c->n_in, w, rb, to[i] - from[i], c->xq, s->y + from[i], d);
        else
            s->k->gemv(c->n_in, w, rb, to[i] - from[i], c->x, s->y + from[i], d);
    }
}

/* Rows per panel: about PANEL_BYTES of weights, a whole number of tr-row tiles (a panel that
 * ends in a partial tile runs its last rows through the 1-row tile: 23 rows of 11 KiB F16
 * left 3 of every 23 rows there, and a 2048 x 5632 F16 prefill ran at 366 GFLOP/s instead
 * of ~400 with 2 threads) */
static int64_t panel_rows(size_t row_bytes, int tr) {
    int64_t rows = (int64_t)(PANEL_BYTES / (row_bytes ? row_bytes : 1)) / tr * tr;
    return rows < tr ? tr : rows;
}

static void mm_rows(const mm_ctx *c, const mm_seg *s, int64_t o0, int64_t o1) {
    const kiln_cpu_kernel *k = s->k;
    if (c->n_tok == 1 && k->gemv) {
        mm_gemv(c, s, o0, o1);
        return;
    }
    int tr = k->tile ? k->max_rows : 1, tt = k->tile ? k->max_tok : 1;
    float tmp[MAX_TILE];
    if (tr * tt > MAX_TILE) tr = 1, tt = MAX_TILE; /* never with the kernels in this dir */
    const int64_t panel = panel_rows(s->row_bytes, tr);
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = ob + panel < o1 ? ob + panel : o1;
        for (int64_t t = 0; t < c->n_tok; t += tt) {
            int nt = (int)(c->n_tok - t < tt ? c->n_tok - t : tt);
            const float *xt = c->x + t * c->n_in;
            for (int64_t o = ob; o < oe; o += tr) {
                int nr = (int)(oe - o < tr ? oe - o : tr);
                const uint8_t *wr = s->w + (size_t)o * s->row_bytes;
                float *yo = s->y + t * s->n_out + o;
                if (t == 0) /* the first pass over the panel streams the weights */
                    prefetch_ahead(wr, s->row_bytes, nr, o, o1);
                if (k->tile) {
                    k->tile(c->n_in, wr, s->row_bytes, nr, xt, c->n_in, nt, tmp);
                    for (int q = 0; q < nr; q++)
                        for (int r = 0; r < nt; r++) yo[r * s->n_out + q] = tmp[q * nt + r];
                } else {
                    for (int r = 0; r < nt; r++)
                        yo[r * s->n_out] = k->dot(c->n_in, wr, xt + r * c->n_in);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- q8 activations */

enum { PK_PANEL_BYTES = 384 * 1024 };

/* fewest tokens for the packed path: env KILN_PK_MIN_TOK (benchmarks; the bits are the same
 * either way), else the kernel's pmin_tok, else 32 (AVX-512: below it the in-register
 * transposes of the 1 x 8 tiles cost less than packing) */
static int g_pk_min_tok = 0;
static pthread_once_t g_pk_once = PTHREAD_ONCE_INIT;
static void pk_init(void) {
    const char *e = getenv("KILN_PK_MIN_TOK");
    if (e && atoi(e) > 0) g_pk_min_tok = atoi(e);
}

/* rows per packed panel (a multiple of the tile's rows), or 0 when packing does not apply */
static int64_t pk_panel_rows(const kiln_cpu_q8_kernel *k, int64_t n_in, int64_t n_tok) {
    pthread_once(&g_pk_once, pk_init);
    const int min_tok = g_pk_min_tok ? g_pk_min_tok : k->pmin_tok ? k->pmin_tok : 32;
    if (!k->pack || n_tok < min_tok || k->pmax_rows * k->pmax_tok > MAX_TILE) return 0;
    size_t pb = k->packed_row_bytes(n_in);
    if (pb == 0) return 0;
    int64_t rows = (int64_t)(PK_PANEL_BYTES / pb) / k->pmax_rows * k->pmax_rows;
    return rows < k->pmax_rows ? k->pmax_rows : rows;
}

/* rows [o0, o1) through packed panels: each panel is packed once, then every token tile
 * runs over it (same bits per (t, o) as the unpacked kernels) */
static void mm_q8_packed(const mm_ctx *c, const mm_seg *s, uint8_t *pk, int64_t o0, int64_t o1) {
    const kiln_cpu_q8_kernel *k = s->k8;
    const size_t pb = k->packed_row_bytes(c->n_in);
    const int tr = k->pmax_rows, tt = k->pmax_tok;
    float tmp[MAX_TILE]; /* pk_panel_rows: tr * tt <= MAX_TILE */
    for (int64_t ob = o0; ob < o1; ob += s->pk_rows) {
        int64_t oe = ob + s->pk_rows < o1 ? ob + s->pk_rows : o1;
        const uint8_t *wb = s->w + (size_t)ob * s->row_bytes;
        k->pack(c->n_in, wb, s->row_bytes, (int)(oe - ob), pk);
        for (int64_t t = 0; t < c->n_tok; t += tt) {
            int nt = (int)(c->n_tok - t < tt ? c->n_tok - t : tt);
            const uint8_t *xt = c->xq + (size_t)t * c->xs;
            for (int64_t o = ob; o < oe; o += tr) {
                int nr = (int)(oe - o < tr ? oe - o : tr);
                k->ptile(c->n_in, pk + (size_t)(o - ob) * pb, pb, s->w + (size_t)o * s->row_bytes,
                         s->row_bytes, nr, xt, c->xs, nt, tmp);
                float *yo = s->y + t * s->n_out + o;
                for (int q = 0; q < nr; q++)
                    for (int r = 0; r < nt; r++) yo[r * s->n_out + q] = tmp[q * nt + r];
            }
        }
    }
}

static void mm_q8_rows(const mm_ctx *c, const mm_seg *s, int64_t o0, int64_t o1) {
    const kiln_cpu_q8_kernel *k = s->k8;
    const bool short_rows = k->small && c->n_in < 512;
    if (c->n_tok == 1 && k->gemv && !short_rows) {
        mm_gemv(c, s, o0, o1);
        return;
    }
    if (short_rows) { /* 8 rows per call, rows in lanes */
        for (int64_t t = 0; t < c->n_tok; t++)
            for (int64_t o = o0; o < o1; o += 8)
                k->small(c->n_in, s->w + (size_t)o * s->row_bytes, s->row_bytes,
                         (int)(o1 - o < 8 ? o1 - o : 8), c->xq + (size_t)t * c->xs,
                         s->y + t * s->n_out + o);
        return;
    }
    int tr = k->tile ? k->max_rows : 1, tt = k->tile ? k->max_tok : 1;
    float tmp[MAX_TILE];
    if (tr * tt > MAX_TILE) tr = 1, tt = MAX_TILE; /* never with the kernels in this dir */
    const int64_t panel = panel_rows(s->row_bytes, tr);
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = ob + panel < o1 ? ob + panel : o1;
        for (int64_t t = 0; t < c->n_tok; t += tt) {
            int nt = (int)(c->n_tok - t < tt ? c->n_tok - t : tt);
            const uint8_t *xt = c->xq + (size_t)t * c->xs;
            for (int64_t o = ob; o < oe; o += tr) {
                int nr = (int)(oe - o < tr ? oe - o : tr);
                const uint8_t *wr = s->w + (size_t)o * s->row_bytes;
                float *yo = s->y + t * s->n_out + o;
                if (t == 0) /* the first pass over the panel streams the weights */
                    prefetch_ahead(wr, s->row_bytes, nr, o, o1);
                if (k->tile) {
                    k->tile(c->n_in, wr, s->row_bytes, nr, xt, c->xs, nt, tmp);
                    for (int q = 0; q < nr; q++)
                        for (int r = 0; r < nt; r++) yo[r * s->n_out + q] = tmp[q * nt + r];
                } else {
                    for (int r = 0; r < nt; r++)
                        yo[r * s->n_out] = k->dot(c->n_in, wr, xt + (size_t)r * c->xs);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- packed F16 */

/* Rows [o0, o1) of a KILN_LAYOUT_F16_R64 segment (f32 activations). A group the range only
 * partly covers is computed whole and only the range's rows stored. One token reads each
 * group's stream once with the software prefetch; several tokens visit panels of about
 * PANEL_BYTES of groups (kept in L2), every token tile over each group of the panel, the
 * first tile with the prefetch. */
static void mm_r64_rows(const mm_ctx *c, const mm_seg *s, int64_t o0, int64_t o1) {
    const kiln_cpu_r64_kernel *k = s->kp;
    const size_t gb = (size_t)c->n_in * KILN_CPU_R64 * 2; /* bytes per group */
    const int64_t ng = (s->n_out + KILN_CPU_R64 - 1) / KILN_CPU_R64;
    const uint8_t *end = s->w + gb * (size_t)ng;
    const int64_t g0 = o0 / KILN_CPU_R64, g1 = (o1 + KILN_CPU_R64 - 1) / KILN_CPU_R64;
    const size_t pf = gemv_pf();
    int64_t panel = gb ? (int64_t)(PANEL_BYTES / gb) : 1;
    if (panel < 1) panel = 1;
    /* token tiles of nearly equal size (512 tokens: 82 of 6 and 4 of 5, not 85 of 6 and one of
     * 2, whose 8 accumulators leave most of the FMA units idle) */
    const int64_t ntiles = (c->n_tok + k->max_tok - 1) / k->max_tok;
    for (int64_t pb = g0; pb < g1; pb += panel) {
        int64_t pe = pb + panel < g1 ? pb + panel : g1;
        for (int64_t ti = 0; ti < ntiles; ti++) {
            const int64_t t = c->n_tok * ti / ntiles;
            const int nt = (int)(c->n_tok * (ti + 1) / ntiles - t);
            for (int64_t g = pb; g < pe; g++) {
                int64_t r0 = g * KILN_CPU_R64;
                int lo = o0 > r0 ? (int)(o0 - r0) : 0;
                int hi = o1 - r0 < KILN_CPU_R64 ? (int)(o1 - r0) : KILN_CPU_R64;
                k->tile(c->n_in, s->w + gb * (size_t)g, c->x + t * c->n_in, c->n_in, nt,
                        s->y + t * s->n_out + r0, s->n_out, lo, hi, end, t == 0 ? pf : 0);
            }
        }
    }
}

/* thread ith's share of the rows (i / nth of them, at a multiple of 64 when c->align_groups) */
static int64_t split_at(const mm_ctx *c, int i, int nth) {
    if (i >= nth) return c->total;
    int64_t g = c->total * i / nth;
    return c->align_groups ? g / KILN_CPU_R64 * KILN_CPU_R64 : g;
}

/* thread ith's contiguous share of all segments' rows, end to end */
static void mm_worker(void *p, int ith, int nth) {
    const mm_ctx *c = p;
    int64_t g0 = split_at(c, ith, nth), g1 = split_at(c, ith + 1, nth), off = 0;
    for (int i = 0; i < c->nseg && off < g1; off += c->seg[i].n_out, i++) {
        const mm_seg *s = &c->seg[i];
        int64_t o0 = g0 - off > 0 ? g0 - off : 0, o1 = g1 - off < s->n_out ? g1 - off : s->n_out;
        if (o0 >= o1) continue;
        if (s->kp)
            mm_r64_rows(c, s, o0, o1);
        else if (!c->xq)
            mm_rows(c, s, o0, o1);
        else if (c->pk && s->pk_rows > 0)
            mm_q8_packed(c, s, c->pk + (size_t)ith * c->pk_bytes, o0, o1);
        else
            mm_q8_rows(c, s, o0, o1);
    }
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

/* run the segments of c (x or xq set) over the pool */
static void mm_run(kiln_threadpool *tp, mm_ctx *c) {
    c->total = 0;
    for (int i = 0; i < c->nseg; i++) {
        c->total += c->seg[i].n_out;
        if (c->seg[i].kp) c->align_groups = true;
    }
    /* small products are not worth waking the workers for (results are the same) */
    bool pool = use_pool(tp, (double)c->total * (double)c->n_in * (double)c->n_tok, c->total);
    uint8_t *pk = NULL;
    if (c->xq) {
        size_t per = 0;
        for (int i = 0; i < c->nseg; i++) {
            mm_seg *s = &c->seg[i];
            s->pk_rows = pk_panel_rows(s->k8, c->n_in, c->n_tok);
            size_t b = s->pk_rows ? s->k8->packed_row_bytes(c->n_in) * (size_t)s->pk_rows : 0;
            if (b > per) per = b;
        }
        if (per > 0) { /* without the scratch, the unpacked kernels give the same bits */
            per = (per + 63) & ~(size_t)63;
            int nth = pool ? kiln_threadpool_size(tp) : 1;
            pk = aligned_alloc(64, per * (size_t)nth);
            if (pk) c->pk = pk, c->pk_bytes = per;
        }
    }
    if (pool)
        kiln_threadpool_run(tp, mm_worker, c);
    else
        mm_worker(c, 0, 1);
    free(pk);
    c->pk = NULL;
}

/* quantize tokens [0, n_tok) of x into xq, then the segments' rows for those tokens */
static void q8_run(kiln_threadpool *tp, kiln_simd path, mm_ctx *c, const float *x, int64_t n_tok,
                   uint8_t *xq) {
    q8_quant_ctx qc = {path, c->n_in, n_tok, x, xq, c->xs};
    /* quantizing is ~n_in work per token: only large batches are worth a fork/join */
    if (use_pool(tp, (double)c->n_in * (double)n_tok / 4.0, n_tok))
        kiln_threadpool_run(tp, q8_quant_worker, &qc);
    else
        q8_quant_worker(&qc, 0, 1);
    c->n_tok = n_tok;
    c->xq = xq;
    mm_run(tp, c);
}

enum { Q8_STACK_BYTES = 16 * 1024 };

static void fill(mm_ctx *c, int64_t n_tok, float v) {
    for (int i = 0; i < c->nseg; i++)
        for (int64_t j = 0; j < n_tok * c->seg[i].n_out; j++) c->seg[i].y[j] = v;
}

/* c: segments, n_in and xs set */
static void matmul_q8(kiln_threadpool *tp, kiln_simd path, mm_ctx *c, const float *x,
                      int64_t n_tok) {
    const size_t xs = c->xs;
    const int64_t n_in = c->n_in;
    _Alignas(64) uint8_t stack[Q8_STACK_BYTES];
    if (xs == 0) { /* n_in == 0: every dot is the empty sum */
        fill(c, n_tok, 0.0f);
        return;
    }
    int64_t per_stack = (int64_t)(Q8_STACK_BYTES / xs);
    if (n_tok <= per_stack) {
        q8_run(tp, path, c, x, n_tok, stack);
        return;
    }
    uint8_t *buf = NULL;
    if ((uint64_t)n_tok <= (SIZE_MAX - 63) / xs) {
        size_t bytes = ((size_t)n_tok * xs + 63) & ~(size_t)63;
        buf = aligned_alloc(64, bytes);
    }
    if (buf) {
        q8_run(tp, path, c, x, n_tok, buf);
        free(buf);
        return;
    }
    if (per_stack == 0) { /* one quantized row does not fit the stack buffer */
        fill(c, n_tok, NAN);
        return;
    }
    /* out of memory: token chunks through the stack buffer (same bits per (t, o)) */
    float *y0[MAX_SEG];
    for (int i = 0; i < c->nseg; i++) y0[i] = c->seg[i].y;
    for (int64_t t = 0; t < n_tok; t += per_stack) {
        int64_t nt = n_tok - t < per_stack ? n_tok - t : per_stack;
        for (int i = 0; i < c->nseg; i++) c->seg[i].y = y0[i] + t * c->seg[i].n_out;
        q8_run(tp, path, c, x + t * n_in, nt, stack);
    }
    for (int i = 0; i < c->nseg; i++) c->seg[i].y = y0[i];
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

/* Segment for out: true when its kernel exists (else its y is NaN-filled); *q8 says which
 * mode it runs in. */
static bool make_seg(kiln_simd path, kiln_act_mode act, const kiln_cpu_mm_out *out, int64_t n_in,
                     int64_t n_tok, mm_seg *s, bool *q8) {
    memset(s, 0, sizeof *s);
    s->w = out->w;
    s->n_out = out->n_out;
    s->y = out->y;
    s->row_bytes = kiln_dtype_row_size(out->wt, n_in);
    *q8 = act == KILN_ACT_Q8 && kiln_cpu_q8_supported(out->wt) && out->layout == KILN_LAYOUT_ROWS;
    bool ok = n_in >= 0 && (s->row_bytes != 0 || n_in == 0);
    if (out->layout != KILN_LAYOUT_ROWS)
        ok = ok && out->layout == KILN_LAYOUT_F16_R64 && out->wt == KILN_DTYPE_F16 &&
             (kiln_cpu_layout_bytes(out->layout, out->wt, out->n_out, n_in) != 0 || n_in == 0) &&
             (s->kp = kiln_cpu_r64_kernel_get(path)) != NULL;
    else if (*q8)
        ok = ok && (s->k8 = kiln_cpu_q8_kernel_get(out->wt, path)) != NULL;
    else
        ok = ok && (s->k = kiln_cpu_kernel_get(out->wt, path)) != NULL;
    if (!ok)
        for (int64_t i = 0; i < n_tok * out->n_out; i++) out->y[i] = NAN;
    return ok;
}

static void matmul_outs(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act,
                        const kiln_cpu_mm_out *outs, int n, int64_t n_in, const float *x,
                        int64_t n_tok) {
    if (n_tok <= 0) return;
    if (act == KILN_ACT_AUTO) act = kiln_cpu_act_default();
    /* one call per mode: the q8 segments share one quantization, the f32 ones one run */
    mm_ctx c8 = {0}, cf = {0};
    c8.n_in = cf.n_in = n_in;
    cf.n_tok = n_tok;
    cf.x = x;
    for (int i = 0; i < n && i < MAX_SEG; i++) {
        mm_seg s;
        bool q8;
        if (outs[i].n_out <= 0 || !make_seg(path, act, &outs[i], n_in, n_tok, &s, &q8)) continue;
        if (q8)
            c8.seg[c8.nseg++] = s;
        else
            cf.seg[cf.nseg++] = s;
    }
    if (c8.nseg > 0) {
        c8.xs = kiln_cpu_q8_row_size(n_in);
        matmul_q8(tp, path, &c8, x, n_tok);
    }
    if (cf.nseg > 0) mm_run(tp, &cf);
}

void kiln_cpu_matmul_ex(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act, const void *w,
                        kiln_dtype wt, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                        float *y) {
    const kiln_cpu_mm_out out = {w, wt, n_out, y, KILN_LAYOUT_ROWS};
    matmul_outs(tp, path, act, &out, 1, n_in, x, n_tok);
}

void kiln_cpu_matmul_path(kiln_threadpool *tp, kiln_simd path, const void *w, kiln_dtype wt,
                          int64_t n_out, int64_t n_in, const float *x, int64_t n_tok, float *y) {
    kiln_cpu_matmul_ex(tp, path, KILN_ACT_AUTO, w, wt, n_out, n_in, x, n_tok, y);
}

void kiln_cpu_matmul(kiln_threadpool *tp, const void *w, kiln_dtype wt, int64_t n_out, int64_t n_in,
                     const float *x, int64_t n_tok, float *y) {
    kiln_cpu_matmul_ex(tp, kiln_simd_active(), KILN_ACT_AUTO, w, wt, n_out, n_in, x, n_tok, y);
}

void kiln_cpu_matmul_outs(kiln_threadpool *tp, kiln_simd path, kiln_act_mode act,
                          const kiln_cpu_mm_out *outs, int n, int64_t n_in, const float *x,
                          int64_t n_tok) {
    for (int i = 0; i < n; i += MAX_SEG)
        matmul_outs(tp, path, act, outs + i, n - i < MAX_SEG ? n - i : MAX_SEG, n_in, x, n_tok);
}

void kiln_cpu_matmul_multi(kiln_threadpool *tp, const kiln_cpu_mm_out *outs, int n, int64_t n_in,
                           const float *x, int64_t n_tok) {
    kiln_cpu_matmul_outs(tp, kiln_simd_active(), KILN_ACT_AUTO, outs, n, n_in, x, n_tok);
}
