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

/* up to CU_MM_MAX_OUTS weights of one dtype and one load path over the same x, in one launch:
 * output j owns blocks [first[j], first[j + 1]) of the grid's x dimension */
#define CU_MM_MAX_OUTS 4

typedef struct mm_args {
    float *y[CU_MM_MAX_OUTS];
    const void *w[CU_MM_MAX_OUTS];
    int64_t n_out[CU_MM_MAX_OUTS];
    int64_t first[CU_MM_MAX_OUTS + 1];
    int n;
    int64_t n_in;
    const float *x;
    int32_t n_tok;
} mm_args;

template <int E, int R, bool VEC>
__global__ void __launch_bounds__(CU_MM_WARPS * 32) k_matmul(mm_args a) {
    int j = 0;
    while (j + 1 < a.n && (int64_t)blockIdx.x >= a.first[j + 1]) j++;
    const int64_t n_out = a.n_out[j], n_in = a.n_in;
    const int lane = threadIdx.x & 31;
    const int64_t o = ((int64_t)blockIdx.x - a.first[j]) * CU_MM_WARPS + (threadIdx.x >> 5);
    if (o >= n_out) return;
    const int64_t r0 = (int64_t)blockIdx.y * R;
    const int nr = a.n_tok - r0 < R ? (int)(a.n_tok - r0) : R;
    const size_t esz = E == CU_F32 ? 4 : 2;
    const void *wr = (const char *)a.w[j] + (size_t)o * (size_t)n_in * esz;
    const float *xr = a.x + r0 * n_in;
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
    float *y = a.y[j];
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) y[(r0 + r) * n_out + o] = acc[r];
}

template <int E> static cudaError_t launch(cudaStream_t s, const mm_args &a, bool vec) {
    const dim3 grid((unsigned)a.first[a.n], a.n_tok == 1 ? 1u : (unsigned)((a.n_tok + 7) / 8));
    const dim3 block(CU_MM_WARPS * 32);
    if (a.n_tok == 1) {
        if (vec)
            k_matmul<E, 1, true><<<grid, block, 0, s>>>(a);
        else
            k_matmul<E, 1, false><<<grid, block, 0, s>>>(a);
    } else {
        if (vec)
            k_matmul<E, 8, true><<<grid, block, 0, s>>>(a);
        else
            k_matmul<E, 8, false><<<grid, block, 0, s>>>(a);
    }
    return cudaGetLastError();
}

/* the row-load path of one weight: 16-byte vectors when n_in, w and x allow them */
static bool vec_path(cu_elem e, const void *w, int64_t n_in, const float *x) {
    const size_t esz = e == CU_F32 ? 4 : 2;
    return n_in % 4 == 0 && (uintptr_t)w % (4 * esz) == 0 && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t kiln_cu_matmul_multi(cudaStream_t s, const cu_mm_out *outs, int n,
                                            int64_t n_in, const float *x, int32_t n_tok) {
    if (n_tok < 1) return cudaSuccess;
    if ((n_tok + 7) / 8 > 65535) return cudaErrorInvalidConfiguration;
    for (int i = 0; i < n;) {
        /* a group: consecutive weights of one dtype and path, at most CU_MM_MAX_OUTS */
        const cu_elem e = outs[i].w_elem;
        const bool vec = vec_path(e, outs[i].w, n_in, x);
        mm_args a = {};
        a.n_in = n_in;
        a.x = x;
        a.n_tok = n_tok;
        int k = 0;
        while (i < n && k < CU_MM_MAX_OUTS && outs[i].w_elem == e &&
               vec_path(e, outs[i].w, n_in, x) == vec) {
            a.y[k] = outs[i].y;
            a.w[k] = outs[i].w;
            a.n_out[k] = outs[i].n_out;
            a.first[k + 1] = a.first[k] + (outs[i].n_out + CU_MM_WARPS - 1) / CU_MM_WARPS;
            k++;
            i++;
        }
        a.n = k;
        if (a.first[k] == 0) continue;
        if (a.first[k] > 0x7fffffff) return cudaErrorInvalidConfiguration;
        cudaError_t err;
        if (e == CU_F16)
            err = launch<CU_F16>(s, a, vec);
        else if (e == CU_BF16)
            err = launch<CU_BF16>(s, a, vec);
        else
            err = launch<CU_F32>(s, a, vec);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}
