/*
 * ops_simd.h - internal: the SIMD versions of ops.h's row operations that ops.c dispatches
 * to (kiln_simd_active()); semantics and reduction orders in ops_avx512.c.
 */
#ifndef KILN_BACKEND_CPU_OPS_SIMD_H
#define KILN_BACKEND_CPU_OPS_SIMD_H

#include <stdbool.h>
#include <stdint.h>

/* y[i] = e^x[i] (~2 ulp; y may alias x) */
void kiln_exp_avx512(float *y, const float *x, int64_t n);
void kiln_rmsnorm_avx512(float *out, const float *x, const float *w, int64_t n, float eps);
void kiln_swiglu_avx512(float *g, const float *u, int64_t n);
/* false: head_dim out of the kernel's range (> 512), nothing done */
bool kiln_attention_paged_avx512(float *out, const float *q, const void *const *k_blocks,
                                 const void *const *v_blocks, int32_t block_size,
                                 int64_t row_stride, int64_t head_off, int32_t key_begin,
                                 int32_t n_keys, int32_t head_dim, float score_div, float softcap,
                                 int kv_is_f16, float *scores);

#endif
