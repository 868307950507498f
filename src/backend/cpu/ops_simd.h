/*
 * ops_simd.h - internal: the SIMD versions of ops.h's row operations that ops.c dispatches
 * to (kiln_simd_active()); semantics and reduction orders in ops_avx512.c and
 * attention_avx2.c.
 */
#ifndef KILN_BACKEND_CPU_OPS_SIMD_H
#define KILN_BACKEND_CPU_OPS_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/ops.h"

/* y[i] = e^x[i] (~2 ulp; y may alias x) */
void kiln_exp_avx512(float *y, const float *x, int64_t n);
void kiln_rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps);
void kiln_swiglu_avx512(float *g, const float *u, int64_t n);
size_t kiln_attention_group_scratch_avx512(int32_t n_tok, int32_t G, int32_t head_dim,
                                           int32_t max_keys);
void kiln_attention_group_avx512(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                                 int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                                 const kiln_attn_kv *kv, float score_div, float softcap,
                                 float *scratch);
/* attention_avx2.c: the same contract, bitwise equal to the scalar reference */
size_t kiln_attention_group_scratch_avx2(int32_t n_tok, int32_t G, int32_t head_dim,
                                         int32_t max_keys);
void kiln_attention_group_avx2(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                               int32_t G, int32_t n_tok, const int32_t *begin, const int32_t *end,
                               const kiln_attn_kv *kv, float score_div, float softcap,
                               float *scratch);

#endif
