/*
 * attn_rows.h - internal to the CPU backend's SIMD attention kernels (ops_avx512.c,
 * attention_avx2.c): how one kiln_attention_group call addresses its KV rows. ISA-neutral
 * static inline helpers only:
 *   - a row load code per page format (LF_F32 .. LF_Q4, LF_MIX when the blocks a call reads
 *     mix formats and each row's own code is looked up);
 *   - attn_fmt: bytes per row for each code, the per-block format arrays, and the q / p
 *     roundings (kv/kv_format.h kiln_kv_operand), set up once per call by attn_fmt_init;
 *   - attn_row_of: position t's row start; attn_slice_bytes: the bytes of a row that hold a
 *     head's elements; attn_prefetch_rows: those bytes of a run of keys into L1;
 *   - attn_key_span: the keys a call reads; attn_active_tokens: the tokens whose key range
 *     meets a chunk of keys.
 * Row layouts: kv/kv_format.h; kiln_attn_kv: backend/cpu/ops.h.
 */
#ifndef KILN_BACKEND_CPU_ATTN_ROWS_H
#define KILN_BACKEND_CPU_ATTN_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "tensor/dtype.h"

/* Row load codes: 0 f32, 1 f16, 2 bf16 (the plain operands), 3 q8_0, 4 q4_0; LF_MIX: each
 * block's own format (kiln_attn_kv.k_fmt / v_fmt), looked up per row. */
enum { LF_F32 = 0, LF_F16 = 1, LF_BF16 = 2, LF_Q8 = 3, LF_Q4 = 4, LF_N = 5, LF_MIX = 5 };

static inline int attn_lf_of(int dtype) {
    switch (dtype) {
    case KILN_DTYPE_F16:
        return LF_F16;
    case KILN_DTYPE_BF16:
        return LF_BF16;
    case KILN_DTYPE_Q8_0:
        return LF_Q8;
    case KILN_DTYPE_Q4_0:
        return LF_Q4;
    default:
        return LF_F32;
    }
}

/* what one call needs to address rows: bytes per row for each load code, the per-block format
 * arrays, and the q / p roundings (kiln_kv_operand) */
typedef struct attn_fmt {
    size_t rb[LF_N];
    const uint8_t *kf, *vf;
    int qop, pop;
} attn_fmt;

/* af for one call over keys [min(begin), end[n_tok - 1]); returns the call's load code: the
 * plain operand's without per-block formats; with them, one code when every block the call
 * reads has the same format on both sides, otherwise LF_MIX. q is rounded to the first K
 * block's operand, p to the first V block's (every block of one side shares it: ops.h). */
static inline int attn_fmt_init(attn_fmt *af, const kiln_attn_kv *kv, int32_t n_tok,
                                const int32_t *begin, const int32_t *end) {
    if (!kv->k_fmt) { /* plain rows of one operand, K and V alike */
        const int lf = kv->operand == 1 ? LF_F16 : kv->operand == 2 ? LF_BF16 : LF_F32;
        af->kf = af->vf = NULL;
        af->qop = af->pop = kv->operand;
        for (int i = 0; i < LF_N; i++) af->rb[i] = 0;
        af->rb[lf] = (size_t)kv->row_stride * (lf == LF_F32 ? 4 : 2);
        return lf;
    }
    const int32_t b1 = (end[n_tok - 1] - 1) / kv->block_size;
    int32_t bmin = begin[0] / kv->block_size;
    for (int32_t i = 0; i < n_tok; i++)
        if (begin[i] / kv->block_size < bmin) bmin = begin[i] / kv->block_size;
    const int f0 = kv->k_fmt[bmin];
    bool same = true;
    for (int32_t b = bmin; b <= b1 && same; b++) same = kv->k_fmt[b] == f0 && kv->v_fmt[b] == f0;
    af->kf = kv->k_fmt;
    af->vf = kv->v_fmt;
    af->qop = (int)kiln_kv_format_of(kv->k_fmt[bmin])->operand;
    af->pop = (int)kiln_kv_format_of(kv->v_fmt[bmin])->operand;
    static const int dts[LF_N] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                  KILN_DTYPE_Q4_0};
    for (int i = 0; i < LF_N; i++)
        af->rb[i] = kiln_kv_format_row_bytes((kiln_dtype)dts[i], kv->row_stride);
    return same ? attn_lf_of(f0) : LF_MIX;
}

/* position t's row (of blocks / fmts, K or V): its start and (LF_MIX) its load code in *lf */
static inline __attribute__((always_inline)) const char *
attn_row_of(const kiln_attn_kv *kv, const attn_fmt *af, const void *const *blocks,
            const uint8_t *fmts, int32_t t, const int LF, int *lf) {
    const int32_t blk = t / kv->block_size;
    *lf = LF == LF_MIX ? attn_lf_of(fmts[blk]) : LF;
    return (const char *)blocks[blk] + (size_t)(t % kv->block_size) * af->rb[*lf];
}

/* bytes [*off, *off + return) of a row that hold elements [e0, e0 + n) of code lf */
static inline size_t attn_slice_bytes(int lf, int64_t e0, int32_t n, size_t *off) {
    if (lf == LF_Q8 || lf == LF_Q4) {
        const size_t bb = lf == LF_Q8 ? sizeof(kiln_block_q8_0) : sizeof(kiln_block_q4_0);
        *off = (size_t)(e0 / 32) * bb;
        return (size_t)((e0 + n - 1) / 32 - e0 / 32 + 1) * bb;
    }
    const size_t esz = lf == LF_F32 ? 4 : 2;
    *off = (size_t)e0 * esz;
    return (size_t)n * esz;
}

/* prefetch (into L1: prefetcht0) the head slices of keys t0 + lo .. t0 + hi - 1 of one block
 * array: rows strided by the KV width, which the hardware prefetchers miss in decode (each
 * step streams every sequence's whole cache) */
static inline __attribute__((always_inline)) void
attn_prefetch_rows(const kiln_attn_kv *kv, const attn_fmt *af, const void *const *blocks,
                   const uint8_t *fmts, int32_t t0, int lo, int hi, const int LF) {
    for (int l = lo; l < hi; l++) {
        int lf;
        const char *r = attn_row_of(kv, af, blocks, fmts, t0 + l, LF, &lf);
        size_t off;
        const size_t bytes = attn_slice_bytes(lf, kv->head_off, kv->head_dim, &off);
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + off + b, 0, 3);
    }
}

/* [*kmin, *kmax): the union of the call's key ranges [begin[i], end[i]) */
static inline void attn_key_span(int32_t n_tok, const int32_t *begin, const int32_t *end,
                                 int32_t *kmin, int32_t *kmax) {
    *kmin = begin[0], *kmax = end[n_tok - 1];
    for (int32_t i = 0; i < n_tok; i++) {
        if (begin[i] < *kmin) *kmin = begin[i];
        if (end[i] > *kmax) *kmax = end[i];
    }
}

/* [*i0, *i1): the tokens whose range meets keys [t0, t0 + width) (consecutive tokens, the
 * ranges being monotone) */
static inline void attn_active_tokens(int32_t n_tok, const int32_t *begin, const int32_t *end,
                                      int32_t t0, int32_t width, int32_t *i0, int32_t *i1) {
    int32_t a = 0, b = n_tok;
    while (a < n_tok && (end[a] <= t0 || begin[a] >= t0 + width)) a++;
    while (b > a && (end[b - 1] <= t0 || begin[b - 1] >= t0 + width)) b--;
    *i0 = a, *i1 = b;
}

#endif
