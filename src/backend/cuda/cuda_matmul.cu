/*
 * cuda_matmul.cu - y = x W^T for f32 activations and f32 / f16 / bf16 weights (cuda_kernels.h
 * kiln_cu_matmul): a plain, batch-invariant kernel. A block of 8 warps covers 8 outputs and up
 * to R rows (R = 1 for one row, 8 otherwise); warp w owns output o = 8 * blockIdx.x + w, each
 * lane accumulates its share of k in one fmaf chain per row, and the lane sums meet in the
 * xor butterfly. The order of every y[t, o] is fixed by n_in and the alignment of w and x
 * alone: the rows a block holds, n_tok and R change nothing (each row has its own
 * accumulator and the same k sequence). Weights stream once per 8 rows; no tensor cores yet
 * (the fast GEMM is issue 16's next milestone).
 */
#include "backend/cuda/cuda_elem.cuh"

#define CU_MM_WARPS 8

/* 4 consecutive weights from element k (k % 4 == 0, row 16-byte aligned for f32, 8 for f16 and
 * bf16) */
template <int E> __device__ __forceinline__ void cu_load4(const void *row, int64_t k, float *w) {
    if (E == CU_F32) {
        const float4 v = *(const float4 *)((const float *)row + k);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else {
        const uint2 v = *(const uint2 *)((const uint16_t *)row + k);
        const uint16_t h[4] = {(uint16_t)(v.x & 0xffff), (uint16_t)(v.x >> 16),
                               (uint16_t)(v.y & 0xffff), (uint16_t)(v.y >> 16)};
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = E == CU_F16 ? __half2float(__ushort_as_half(h[i]))
                               : __uint_as_float((uint32_t)h[i] << 16);
    }
}

template <int E, int R, bool VEC>
__global__ void __launch_bounds__(CU_MM_WARPS * 32)
    k_matmul(float *__restrict__ y, const void *__restrict__ w, int64_t n_out, int64_t n_in,
             const float *__restrict__ x, int32_t n_tok) {
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * CU_MM_WARPS + (threadIdx.x >> 5);
    if (o >= n_out) return;
    const int64_t r0 = (int64_t)blockIdx.y * R;
    const int nr = n_tok - r0 < R ? (int)(n_tok - r0) : R;
    const size_t esz = E == CU_F32 ? 4 : 2;
    const void *wr = (const char *)w + (size_t)o * (size_t)n_in * esz;
    const float *xr = x + r0 * n_in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if (VEC) {
        for (int64_t k = 4 * lane; k < n_in; k += 128) {
            float wv[4];
            cu_load4<E>(wr, k, wv);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) {
                    const float4 xv = *(const float4 *)(xr + r * n_in + k);
                    acc[r] = fmaf(wv[0], xv.x, acc[r]);
                    acc[r] = fmaf(wv[1], xv.y, acc[r]);
                    acc[r] = fmaf(wv[2], xv.z, acc[r]);
                    acc[r] = fmaf(wv[3], xv.w, acc[r]);
                }
        }
    } else {
        for (int64_t k = lane; k < n_in; k += 32) {
            const float wv = cu_load<E>(wr, k);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) acc[r] = fmaf(wv, xr[r * n_in + k], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = cu_warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) y[(r0 + r) * n_out + o] = acc[r];
}

template <int E>
static cudaError_t launch(cudaStream_t s, float *y, const void *w, int64_t n_out, int64_t n_in,
                          const float *x, int32_t n_tok) {
    const size_t esz = E == CU_F32 ? 4 : 2;
    const bool vec = n_in % 4 == 0 && (uintptr_t)w % (4 * esz) == 0 && (uintptr_t)x % 16 == 0;
    const unsigned gx = (unsigned)((n_out + CU_MM_WARPS - 1) / CU_MM_WARPS);
    const dim3 block(CU_MM_WARPS * 32);
    if (n_tok == 1) {
        if (vec)
            k_matmul<E, 1, true><<<dim3(gx, 1), block, 0, s>>>(y, w, n_out, n_in, x, n_tok);
        else
            k_matmul<E, 1, false><<<dim3(gx, 1), block, 0, s>>>(y, w, n_out, n_in, x, n_tok);
    } else {
        const unsigned gy = (unsigned)((n_tok + 7) / 8);
        if (vec)
            k_matmul<E, 8, true><<<dim3(gx, gy), block, 0, s>>>(y, w, n_out, n_in, x, n_tok);
        else
            k_matmul<E, 8, false><<<dim3(gx, gy), block, 0, s>>>(y, w, n_out, n_in, x, n_tok);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_matmul(cudaStream_t s, float *y, const void *w, cu_elem w_elem,
                                      int64_t n_out, int64_t n_in, const float *x,
                                      int32_t n_tok) {
    if (n_tok < 1 || n_out < 1) return cudaSuccess;
    if ((n_tok + 7) / 8 > 65535) return cudaErrorInvalidConfiguration;
    if (w_elem == CU_F16) return launch<CU_F16>(s, y, w, n_out, n_in, x, n_tok);
    if (w_elem == CU_BF16) return launch<CU_BF16>(s, y, w, n_out, n_in, x, n_tok);
    return launch<CU_F32>(s, y, w, n_out, n_in, x, n_tok);
}
