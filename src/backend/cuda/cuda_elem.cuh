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
