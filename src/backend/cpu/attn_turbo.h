/*
 * attn_turbo.h - paged attention over TurboQuant KV pages (kv/turboquant.h; Zandieh et al.
 * 2025, arXiv 2504.19874) for one KV head and the G query heads that share it.
 *
 * q . k is computed in the rotated domain: each (token, head) query is rotated (and, with a
 * QJL key spec, projected) once by kiln_turbo_prepare_query; each key row is decoded once per
 * call into f32 rotated-domain values (norm * centroid) and dotted with every query that sees
 * it (kiln_turbo_dot_f32's fixed 16-lane order); the softmax is kiln_softmax's; p . v is
 * accumulated in the rotated domain, element-wise in ascending key order, and rotated back
 * once per (token, head) by kiln_turbo_finish. Every (token, head) output is therefore a fixed
 * function of its own query and keys: the same bits whatever n_tok, G, the block size or
 * which other tokens share the call (DESIGN.md principle 3).
 */
#ifndef KILN_BACKEND_CPU_ATTN_TURBO_H
#define KILN_BACKEND_CPU_ATTN_TURBO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/turboquant.h"

/** TurboQuant pages of one KV head. Position t's K row starts at
 *  (char *)k_blocks[t / block_size] + (t % block_size) * n_head_kv * head_bytes(k) and this
 *  head's slice at + head * head_bytes(k) (likewise V). */
typedef struct kiln_attn_turbo_kv {
    const void *const *k_blocks, *const *v_blocks;
    int32_t block_size;
    int32_t n_head_kv, head; /* KV heads per row, and which one */
    const kiln_turbo *k, *v; /* borrowed quantizers (kiln_turbo_shared) of the K and V specs */
    /* Per-block formats (kv/kv_format.h ids, one per entry of k_blocks / v_blocks), or NULL:
     * every block is in k's (v's) spec. A block of another format (the delayed transition's f16
     * blocks, a plain side beside a turbo one) is read through its format's traits (exact
     * values; another turbo spec: its kiln_turbo_dequantize), rotated by k's (v's) Pi
     * (kiln_turbo_rotate; every spec of one head size shares Pi) and enters the same rotated
     * pipeline with a zero QJL part. */
    const uint8_t *k_fmt, *v_fmt;
} kiln_attn_turbo_kv;

/** Scratch floats kiln_attention_turbo needs (64-byte aligned). */
size_t kiln_attention_turbo_scratch(int32_t n_tok, int32_t G, int32_t head_dim, int32_t max_keys);

/**
 * kiln_attention_group's contract (backend/cpu/ops.h: token i, head h reads q + i * q_stride +
 * h * head_dim, writes out + i * out_stride + h * head_dim, keys [begin[i], end[i]),
 * non-decreasing, 0 <= begin[i] < end[i]) over TurboQuant pages:
 *   s_t = estimate(q . k_t) / score_div; softcap as kiln_attention_paged; p = softmax(s);
 *   out = Pi^T (sum_t p_t * rotated v~_t).
 * scratch: kiln_attention_turbo_scratch(n_tok, G, head_dim, max(end)) floats.
 */
void kiln_attention_turbo(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                          int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                          const kiln_attn_turbo_kv *kv, float score_div, float softcap,
                          float *scratch);

struct kiln_attn_kv;
/**
 * The CPU attention's entry for TurboQuant pages (backend/cpu/ops.c kiln_attention_group):
 * when any block of kv->k_fmt / v_fmt that keys [min begin, max end) touch is a TurboQuant page
 * (ids 64..79), runs kiln_attention_turbo over the call (K quantizer: the first turbo K block's
 * spec, V likewise; a side without turbo blocks takes turbo8's Pi) and returns true; otherwise
 * (no per-block formats, no turbo block, head_dim not a power of two in 8..1024) returns false
 * and writes nothing. scratch: kiln_attention_turbo_scratch floats (kiln_attention_group_scratch
 * covers it).
 */
bool kiln_attention_turbo_group(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                                int32_t G, int32_t n_tok, const int32_t *begin,
                                const int32_t *end, const struct kiln_attn_kv *kv,
                                float score_div, float softcap, float *scratch);

/** kiln_attention_turbo on a chosen path: simd true uses the AVX-512 inner loops (the caller
 *  checked the CPU), false the scalar ones; both give the same bits (tests/cpu). */
void kiln_attention_turbo_path(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                               int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                               const kiln_attn_turbo_kv *kv, float score_div, float softcap,
                               float *scratch, bool simd);

/* Inner loops (scalar reference, and AVX-512 in attn_turbo_avx512.c, bitwise equal):
 * s16[l] = one fused multiply-add chain from +0 over j < wk of qp[j] * Kt[j * 16 + l];
 * acc[j] = fmaf(p[t], Vc[t * vstride + j], acc[j]) for t = lo .. hi-1 ascending, j < wv. */
/* Decoding: Kt[j * 16 + l] = the decoded rotated row rows[l] (kiln_turbo_decode_rotated's yr,
 * zr) element j < work_floats, 0 for lanes outside [lo, hi); tmp: 16 * round16(2d) floats.
 * vrows: dst + i * stride [0 : work_floats] = the decoded rows[i], i < n. */
void kiln_turbo_kchunk_ref(const kiln_turbo *t, const unsigned char *const *rows, int lo, int hi,
                           float *Kt, float *tmp);
void kiln_turbo_kchunk_avx512(const kiln_turbo *t, const unsigned char *const *rows, int lo, int hi,
                              float *Kt, float *tmp);
void kiln_turbo_vrows_ref(const kiln_turbo *t, const unsigned char *const *rows, int n, float *dst,
                          size_t stride);
void kiln_turbo_vrows_avx512(const kiln_turbo *t, const unsigned char *const *rows, int n,
                             float *dst, size_t stride);
/* s[0:n] = softmax(s) (n >= 1): max; e_t = exp(s_t - max) by a fixed Cody-Waite + degree-6
 * polynomial (fused multiply-adds; 0 below -87); sum in 16 lanes t % 16 folded pairwise
 * (8, 4, 2, 1); s_t = e_t / sum. */
void kiln_turbo_softmax_ref(float *s, int32_t n);
void kiln_turbo_softmax_avx512(float *s, int32_t n);
void kiln_turbo_scores16_ref(const float *Kt, int32_t wk, const float *qp, float *s16);
void kiln_turbo_scores16_avx512(const float *Kt, int32_t wk, const float *qp, float *s16);
void kiln_turbo_pv16_ref(float *acc, int32_t wv, const float *Vc, size_t vstride, const float *p,
                         int lo, int hi);
void kiln_turbo_pv16_avx512(float *acc, int32_t wv, const float *Vc, size_t vstride, const float *p,
                            int lo, int hi);

#endif
