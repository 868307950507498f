/*
 * cuda_elem.cuh - device helpers shared by the CUDA kernels: reading f32 / f16 / bf16
 * elements as f32 (exact widening), rounding f32 to them (round to nearest even, as
 * tensor/dtype.h kiln_fp32_to_fp16 / kiln_fp32_to_bf16), the warp butterfly sum, and the
 * launch geometry of elementwise kernels.
 */
#ifndef KILN_BACKEND_CUDA_CUDA_ELEM_CUH
#define KILN_BACKEND_CUDA_CUDA_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

/* element i of a row of type E, as f32 */
template <int E> __device__ __forceinline__ float cu_load(const void *p, int64_t i) {
    if (E == CU_F16) return __half2float(((const __half *)p)[i]);
    if (E == CU_BF16) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    return ((const float *)p)[i];
}

/* the low / high 16-bit element of a 32-bit word (little-endian pairs) of type e, as f32 */
__device__ __forceinline__ float cu_half_lo(uint32_t u, int e) {
    const uint16_t h = (uint16_t)(u & 0xffff);
    return e == CU_F16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ float cu_half_hi(uint32_t u, int e) {
    const uint16_t h = (uint16_t)(u >> 16);
    return e == CU_F16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(u & 0xffff0000u);
}

/* v rounded to the precision of E and widened back (f32: v) */
template <int E> __device__ __forceinline__ float cu_round(float v) {
    if (E == CU_F16) return __half2float(__float2half_rn(v));
    if (E == CU_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

/* store v into element i of a row of type E */
template <int E> __device__ __forceinline__ void cu_store(void *p, int64_t i, float v) {
    if (E == CU_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else if (E == CU_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* sum over the 32 lanes by the xor butterfly (16, 8, 4, 2, 1): every lane gets the same bits
 * (each stage adds the same two values, in either order) */
__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* ops.c kiln_act_value */
__device__ __forceinline__ float cu_act(float v, int act) {
    if (act == CU_ACT_GELU_TANH) {
        const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
        return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
    if (act == CU_ACT_GELU_ERF) return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    return v * (1.0f / (1.0f + expf(-v)));
}

/* act(g) * u: the glu operation's value (silu as ops.c kiln_swiglu_ref), shared by the glu
 * kernel and the matmul's GLU epilogue so that both give the same bits */
__device__ __forceinline__ float cu_glu_value(float g, float u, int act) {
    if (act == CU_ACT_SILU) {
        float v = g;
        v *= 1.0f / (1.0f + expf(-v));
        return v * u;
    }
    return cu_act(g, act) * u;
}

/* Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
 * serialization may start before the kernel ahead of it ends; it must call cu_pdl_wait before
 * touching anything that kernel writes or reads (both no-ops without such a launch). Kernels
 * call cu_pdl_launch_dependents early so that the next one may be scheduled. */
__device__ __forceinline__ void cu_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void cu_pdl_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* whether matmuls launch with programmatic stream serialization (KILN_CUDA_PDL=0: no) */
bool cu_pdl_enabled(void);

/* elementwise launches: 256 threads, a grid-stride loop over at most 65535 * 4 blocks */
#define CU_EW_THREADS 256
static inline unsigned cu_ew_blocks(int64_t n) {
    int64_t b = (n + CU_EW_THREADS - 1) / CU_EW_THREADS;
    if (b > 65535 * 4) b = 65535 * 4;
    return (unsigned)(b > 0 ? b : 1);
}

#define CU_GRID_STRIDE(i, n)                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

#endif
