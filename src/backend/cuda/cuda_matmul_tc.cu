/*
 * cuda_matmul_tc.cu - y = x W^T on the tensor cores for f16 / bf16 weights (cuda_kernels.h
 * kiln_cu_matmul_tc): mma.sync.m16n8k16 with f32 accumulation, the activations rounded to the
 * weights' type (round to nearest even) for the B operand, as PyTorch's bf16 / f16 matmuls
 * take them. Two kernels with one order:
 *   - the streaming kernel (decode, n_tok <= KILN_CU_TC_STREAM_MAX_TOK): one warp per 16
 *     weight rows (the GLU form: 16 gate and the 16 matching up rows) and 8 tokens, the weight
 *     bytes streamed through a private cp.async ring of shared memory, the f32 activations
 *     rounded in registers;
 *   - the tile kernel (prefill): 128 weight rows x 128 tokens per block of 4 warps (64 x 64
 *     each), 4 cp.async stages of 32 k, the activations rounded beforehand into the caller's
 *     scratch (xh) by the same rounding.
 *
 * The order of every y[t, o] (the same in both kernels, for any n_tok, any tile, any grid):
 * k is cut into groups of 32 (k0 = 0, 32, ...; past n_in the operands are +0); group k0 is
 * two mma instructions, in this order, accumulating into one f32 accumulator that starts at
 * +0: the first takes k0 + 8q + {0, 1, 2, 3} and the second k0 + 8q + {4, 5, 6, 7} (q = 0..3)
 * at the instruction's k slots {2q, 2q + 1, 2q + 8, 2q + 9}. Weight row o is the A operand's
 * row (o mod 16), token t the B operand's column (t mod 8); the instruction computes each
 * (row, column) of its output from that row and that column alone. So a token's row of y is
 * bitwise the same whether it is alone (decode) or one of a prefill's rows, at any offset.
 * The epilogues (store, residual add, GLU) are kiln_cu_matmul_multi's.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_elem.cuh"

enum { TC_STORE = 0, TC_ADD = 1, TC_GLU = 2 };

#define TC_MAX_OUTS 4

typedef struct tc_args {
    float *y[TC_MAX_OUTS];
    const uint16_t *w[TC_MAX_OUTS];
    int64_t n_out[TC_MAX_OUTS];
    int64_t first[TC_MAX_OUTS + 1]; /* output j owns the grid's y blocks [first[j], first[j+1]) */
    const uint16_t *w_up;           /* TC_GLU: the up weight (w[0] the gate) */
    int n;
    int act;
    int64_t n_in;
    const float *x;     /* [n_tok, n_in] f32 (the streaming kernel) */
    const uint32_t *xh; /* [n_tok, n_in] rounded pairs (the tile kernel) */
    int32_t n_tok;
} tc_args;

/* ---- the pieces both kernels share ---------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, zero-filled when !valid (src is then any mapped address) */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}

/* two f32 as one pair of E (the low half the first): the rounding of the activations */
template <int E> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if constexpr (E == CU_F16) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *(const uint32_t *)&h;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *(const uint32_t *)&h;
    }
}

/* d += A B for one m16n8k16 (A 4 registers, B 2, f32 accumulators) */
template <int E>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
    if constexpr (E == CU_F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* one group of 32 k: lo / hi the 16 bytes (k0 + 8q .. + 7) of the thread's rows gid and gid + 8,
 * b the 16 bytes of its token column gid (all as pairs) */
template <int E>
__device__ __forceinline__ void mma_group(float (&d)[4], const uint4 &lo, const uint4 &hi,
                                          const uint4 &b) {
    mma<E>(d, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    mma<E>(d, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

template <int MODE>
__device__ __forceinline__ void put(float *yr, int64_t o, float v) {
    if (MODE == TC_ADD)
        yr[o] += v;
    else
        yr[o] = v;
}

/* ---- the streaming kernel ------------------------------------------------------------------ */

#define TS_KS 8     /* groups of 32 k per stage */
#define TS_STAGES 4 /* stages in the ring (3 in flight while one is multiplied) */

/* bytes of shared memory of one warp: per stage, MT x 2 row halves x KS groups x 32 lanes x 16
 * bytes of weights, and 2 x KS x (4 lanes per token, mx tokens) x 16 bytes of f32 activations */
static size_t ts_smem(int mt, int mx) {
    return (size_t)TS_STAGES * ((size_t)mt * 2 * TS_KS * 512 + (size_t)2 * TS_KS * mx * 64);
}

template <int E, int MODE>
__global__ void __launch_bounds__(32) k_mm_stream(tc_args a) {
    constexpr int MT = MODE == TC_GLU ? 2 : 1;
    extern __shared__ __align__(16) unsigned char sm[];
    cu_pdl_launch_dependents();
    int j = 0;
    while (j + 1 < a.n && (int64_t)blockIdx.y >= a.first[j + 1]) j++;
    const int64_t n_out = a.n_out[j], K = a.n_in;
    const int lane = threadIdx.x, gid = lane >> 2, q = lane & 3;
    const int64_t o0 = ((int64_t)blockIdx.y - a.first[j]) * 16;
    const int32_t t0 = (int32_t)blockIdx.x * 8;
    const int mx = a.n_tok - t0 < 8 ? a.n_tok - t0 : 8; /* tokens of this block */
    const int32_t tok = t0 + gid;
    const bool xv = gid < mx;
    const uint16_t *wr[MT][2];
    bool rv[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t o = o0 + gid + 8 * h;
            rv[m][h] = o < n_out;
            const uint16_t *base = MODE == TC_GLU && m == 1 ? a.w_up : a.w[j];
            wr[m][h] = base + (rv[m][h] ? o : 0) * K;
        }
    const float *xr = a.x + (int64_t)(xv ? tok : 0) * K;
    const int64_t G = (K + 31) / 32;
    const int64_t NS = (G + TS_KS - 1) / TS_KS;
    const size_t a_stage = (size_t)MT * 2 * TS_KS * 512, x_stage = (size_t)2 * TS_KS * mx * 64;
    const uint32_t s_a = smem_addr(sm), s_x = s_a + (uint32_t)(TS_STAGES * a_stage);
    /* slot addresses: weights (stage, group, m, h), activations (stage, group, half) */
    auto a_slot = [&](int st, int g, int m, int h) {
        return s_a + (uint32_t)(st * a_stage + (((g * MT + m) * 2 + h) * 32 + lane) * 16);
    };
    auto x_slot = [&](int st, int g, int h) {
        return s_x + (uint32_t)(st * x_stage + ((g * 2 + h) * mx * 4 + lane) * 16);
    };
    auto issue_w = [&](int64_t s) {
        if (s >= NS) return;
        const int st = (int)(s % TS_STAGES);
#pragma unroll
        for (int g = 0; g < TS_KS; g++) {
            const int64_t k = (s * TS_KS + g) * 32 + 8 * q;
            const bool kv = k < K;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    cp16(a_slot(st, g, m, h), kv && rv[m][h] ? (const void *)(wr[m][h] + k)
                                                             : (const void *)a.w[j],
                         kv && rv[m][h]);
        }
    };
    auto issue_x = [&](int64_t s) {
        if (s >= NS || !xv) return;
        const int st = (int)(s % TS_STAGES);
#pragma unroll
        for (int g = 0; g < TS_KS; g++) {
            const int64_t k = (s * TS_KS + g) * 32 + 8 * q;
            const bool kv = k < K;
#pragma unroll
            for (int h = 0; h < 2; h++)
                cp16(x_slot(st, g, h), kv ? (const void *)(xr + k + 4 * h) : (const void *)a.x, kv);
        }
    };
    /* the weights of the first stages stream before the wait on the kernel ahead */
#pragma unroll
    for (int s = 0; s < TS_STAGES - 1; s++) {
        issue_w(s);
        cp_commit();
    }
    cu_pdl_wait();
#pragma unroll
    for (int s = 0; s < TS_STAGES - 1; s++) issue_x(s);
    cp_commit();
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[m][i] = 0.0f;
    for (int64_t s = 0; s < NS; s++) {
        if (s == 0)
            cp_wait<0>();
        else
            cp_wait<TS_STAGES - 2>();
        issue_w(s + TS_STAGES - 1);
        issue_x(s + TS_STAGES - 1);
        cp_commit();
        const int st = (int)(s % TS_STAGES);
#pragma unroll
        for (int g = 0; g < TS_KS; g++) {
            if (s * TS_KS + g >= G) break;
            uint4 b = make_uint4(0u, 0u, 0u, 0u);
            if (xv) {
                const uint4 f0 = lds128(x_slot(st, g, 0)), f1 = lds128(x_slot(st, g, 1));
                b.x = pack2<E>(__uint_as_float(f0.x), __uint_as_float(f0.y));
                b.y = pack2<E>(__uint_as_float(f0.z), __uint_as_float(f0.w));
                b.z = pack2<E>(__uint_as_float(f1.x), __uint_as_float(f1.y));
                b.w = pack2<E>(__uint_as_float(f1.z), __uint_as_float(f1.w));
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint4 lo = lds128(a_slot(st, g, m, 0)), hi = lds128(a_slot(st, g, m, 1));
                mma_group<E>(acc[m], lo, hi, b);
            }
        }
    }
    cp_wait<0>();
    /* acc[m][2h + c]: row o0 + gid + 8h, token t0 + 2q + c */
    float *y = a.y[j];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int32_t t = t0 + 2 * q + c;
            const int64_t o = o0 + gid + 8 * h;
            if (t >= a.n_tok || o >= n_out) continue;
            float *yr = y + (int64_t)t * n_out;
            if (MODE == TC_GLU)
                yr[o] = cu_glu_value(acc[0][2 * h + c], acc[1][2 * h + c], a.act);
            else
                put<MODE>(yr, o, acc[0][2 * h + c]);
        }
}

/* ---- the tile kernel ---------------------------------------------------------------------- */

#define TT_BM 128
#define TT_BN 128
#define TT_STAGES 4
#define TT_STAGE_BYTES ((TT_BM + TT_BN) * 64) /* 32 k of 2 bytes per row */

/* the block's A-tile row of m-tile i of warp row wm (GLU: gate rows 0..63, up rows 64..127,
 * m-tiles 2 and 3 the up rows of m-tiles 0 and 1) */
template <int MODE> __device__ __forceinline__ int tt_arow(int wm, int i) {
    return MODE == TC_GLU ? (i >> 1) * 64 + wm * 32 + (i & 1) * 16 : wm * 64 + i * 16;
}

template <int E, int MODE>
__global__ void __launch_bounds__(128, 2) k_mm_tile(tc_args a) {
    extern __shared__ __align__(16) unsigned char sm[];
    cu_pdl_launch_dependents();
    int j = 0;
    while (j + 1 < a.n && (int64_t)blockIdx.y >= a.first[j + 1]) j++;
    const int64_t n_out = a.n_out[j], K = a.n_in;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, q = lane & 3, wm = warp >> 1, wn = warp & 1;
    const int64_t rows_per = MODE == TC_GLU ? 64 : 128;
    const int64_t o0 = ((int64_t)blockIdx.y - a.first[j]) * rows_per;
    const int64_t t0 = (int64_t)blockIdx.x * TT_BN;
    const int64_t G = (K + 31) / 32;
    const uint32_t s0 = smem_addr(sm);
    /* this thread's copies: chunk c of rows r = tid / 4 + 32 u (u < 4) of A and of B */
    const int c = tid & 3, r_base = tid >> 2;
    const uint16_t *ap[4];
    bool av[4];
    const uint32_t *bp[4];
    bool bv[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int r = r_base + 32 * u;
        int64_t o;
        const uint16_t *base;
        if (MODE == TC_GLU) {
            o = o0 + (r & 63);
            base = r < 64 ? a.w[0] : a.w_up;
        } else {
            o = o0 + r;
            base = a.w[j];
        }
        av[u] = o < n_out;
        ap[u] = base + (av[u] ? o : 0) * K + 8 * c;
        const int64_t t = t0 + r;
        bv[u] = t < a.n_tok;
        bp[u] = a.xh + (bv[u] ? t : 0) * (K / 2) + 4 * c;
    }
    auto issue_a = [&](int64_t s) {
        if (s >= G) return;
        const uint32_t st = s0 + (uint32_t)((s % TT_STAGES) * TT_STAGE_BYTES);
        const bool kv = s * 32 + 8 * c < K;
#pragma unroll
        for (int u = 0; u < 4; u++)
            cp16(st + (uint32_t)(((r_base + 32 * u) * 4 + c) * 16),
                 kv && av[u] ? (const void *)(ap[u] + s * 32) : (const void *)a.w[j], kv && av[u]);
    };
    auto issue_b = [&](int64_t s) {
        if (s >= G) return;
        const uint32_t st = s0 + (uint32_t)((s % TT_STAGES) * TT_STAGE_BYTES + TT_BM * 64);
        const bool kv = s * 32 + 8 * c < K;
#pragma unroll
        for (int u = 0; u < 4; u++)
            cp16(st + (uint32_t)(((r_base + 32 * u) * 4 + c) * 16),
                 kv && bv[u] ? (const void *)(bp[u] + s * 16) : (const void *)a.xh, kv && bv[u]);
    };
#pragma unroll
    for (int s = 0; s < TT_STAGES - 1; s++) {
        issue_a(s);
        cp_commit();
    }
    cu_pdl_wait();
#pragma unroll
    for (int s = 0; s < TT_STAGES - 1; s++) issue_b(s);
    cp_commit();
    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
    for (int64_t s = 0; s < G; s++) {
        if (s == 0)
            cp_wait<0>();
        else
            cp_wait<TT_STAGES - 2>();
        __syncthreads();
        issue_a(s + TT_STAGES - 1);
        issue_b(s + TT_STAGES - 1);
        cp_commit();
        const uint32_t sa = s0 + (uint32_t)((s % TT_STAGES) * TT_STAGE_BYTES),
                       sb = sa + TT_BM * 64;
        uint4 b[8];
#pragma unroll
        for (int n = 0; n < 8; n++) b[n] = lds128(sb + (uint32_t)(((wn * 64 + n * 8 + gid) * 4 + q) * 16));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int ar = tt_arow<MODE>(wm, i) + gid;
            const uint4 lo = lds128(sa + (uint32_t)((ar * 4 + q) * 16)),
                        hi = lds128(sa + (uint32_t)(((ar + 8) * 4 + q) * 16));
#pragma unroll
            for (int n = 0; n < 8; n++) mma<E>(acc[i][n], lo.x, hi.x, lo.y, hi.y, b[n].x, b[n].y);
#pragma unroll
            for (int n = 0; n < 8; n++) mma<E>(acc[i][n], lo.z, hi.z, lo.w, hi.w, b[n].z, b[n].w);
        }
    }
    cp_wait<0>();
    float *y = a.y[j];
    const int MI = MODE == TC_GLU ? 2 : 4;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t t = t0 + wn * 64 + n * 8 + 2 * q + (e & 1);
                const int64_t o = MODE == TC_GLU ? o0 + wm * 32 + i * 16 + gid + 8 * (e >> 1)
                                                 : o0 + wm * 64 + i * 16 + gid + 8 * (e >> 1);
                if (t >= a.n_tok || o >= n_out) continue;
                float *yr = y + t * n_out;
                if (MODE == TC_GLU)
                    yr[o] = cu_glu_value(acc[i][n][e], acc[i + 2][n][e], a.act);
                else
                    put<MODE>(yr, o, acc[i][n][e]);
            }
}

/* ---- the rounding of the activations (the tile kernel's B operand) ----------------------- */

template <int E> __global__ void k_round_pairs(const float *x, uint32_t *xh, int64_t n4) {
    CU_GRID_STRIDE(i, n4) {
        const float4 v = ((const float4 *)x)[i];
        ((uint2 *)xh)[i] = make_uint2(pack2<E>(v.x, v.y), pack2<E>(v.z, v.w));
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

bool cu_tc_enabled(void) {
    static int on = -1;
    if (on < 0) {
        /* opt-in (KILN_CUDA_TC=1) until the streaming kernel reaches the CUDA-core kernel's
         * decode speed (bench/gpu/README.md, run 5) */
        const char *e = getenv("KILN_CUDA_TC");
        on = e && !strcmp(e, "1");
    }
    return on != 0;
}

template <typename K>
static cudaError_t launch_pdl(K kern, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              const tc_args &a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cu_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, a);
}

/* the kernels' dynamic shared memory limit, raised once per kernel (E, MODE, TILE) */
template <int E, int MODE, bool TILE>
static cudaError_t smem_limit(void (*kern)(tc_args), size_t bytes) {
    static size_t set = 0;
    if (bytes <= 48 * 1024 || bytes <= set) return cudaSuccess;
    const cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) set = bytes;
    return e;
}

template <int E, int MODE>
static cudaError_t launch_stream(cudaStream_t s, tc_args a, int64_t per_w_blocks_unused) {
    (void)per_w_blocks_unused;
    const int mt = MODE == TC_GLU ? 2 : 1;
    const int mx = a.n_tok < 8 ? a.n_tok : 8;
    const size_t smem = ts_smem(mt, mx);
    cudaError_t e = smem_limit<E, MODE, false>(k_mm_stream<E, MODE>, ts_smem(mt, 8));
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((a.n_tok + 7) / 8), (unsigned)a.first[a.n]);
    e = launch_pdl(k_mm_stream<E, MODE>, grid, dim3(32), smem, s, a);
    return e != cudaSuccess ? e : cudaGetLastError();
}

template <int E, int MODE> static cudaError_t launch_tile(cudaStream_t s, tc_args a) {
    const size_t smem = (size_t)TT_STAGES * TT_STAGE_BYTES;
    cudaError_t e = smem_limit<E, MODE, true>(k_mm_tile<E, MODE>, smem);
    if (e != cudaSuccess) return e;
    const int64_t n4 = (int64_t)a.n_tok * a.n_in / 4;
    k_round_pairs<E><<<cu_ew_blocks(n4), CU_EW_THREADS, 0, s>>>(a.x, (uint32_t *)a.xh, n4);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((a.n_tok + TT_BN - 1) / TT_BN), (unsigned)a.first[a.n]);
    e = launch_pdl(k_mm_tile<E, MODE>, grid, dim3(128), smem, s, a);
    return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" bool kiln_cu_matmul_tc_ok(cu_elem e, const void *w, int64_t n_in, const float *x) {
    return cu_tc_enabled() && (e == CU_F16 || e == CU_BF16) && n_in % 8 == 0 && n_in > 0 &&
           (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t kiln_cu_matmul_tc(cudaStream_t s, int mode, const cu_mm_out *outs, int n,
                                         const void *w_up, int act, int64_t n_in, const float *x,
                                         int32_t n_tok, void *xh, size_t xh_bytes) {
    if (n_tok < 1 || n < 1) return cudaSuccess;
    if (n > TC_MAX_OUTS || (mode == TC_GLU && n != 1)) return cudaErrorInvalidValue;
    const cu_elem e = outs[0].w_elem;
    const bool tile = n_tok > KILN_CU_TC_STREAM_MAX_TOK && xh &&
                      (size_t)n_tok * (size_t)n_in * 2 <= xh_bytes && (uintptr_t)xh % 16 == 0;
    tc_args a = {};
    a.n = n;
    a.act = act;
    a.n_in = n_in;
    a.x = x;
    a.xh = (const uint32_t *)xh;
    a.n_tok = n_tok;
    a.w_up = (const uint16_t *)w_up;
    const int64_t per = tile ? (mode == TC_GLU ? 64 : 128) : 16;
    for (int i = 0; i < n; i++) {
        if (outs[i].w_elem != e) return cudaErrorInvalidValue;
        a.y[i] = outs[i].y;
        a.w[i] = (const uint16_t *)outs[i].w;
        a.n_out[i] = outs[i].n_out;
        a.first[i + 1] = a.first[i] + (outs[i].n_out + per - 1) / per;
    }
    if (a.first[n] == 0) return cudaSuccess;
    if (a.first[n] > 65535) return cudaErrorInvalidConfiguration;
    const bool f16 = e == CU_F16;
#define TC_GO(M)                                                                                   \
    return tile ? (f16 ? launch_tile<CU_F16, M>(s, a) : launch_tile<CU_BF16, M>(s, a))             \
                : (f16 ? launch_stream<CU_F16, M>(s, a, 0) : launch_stream<CU_BF16, M>(s, a, 0))
    if (mode == TC_GLU) TC_GO(TC_GLU);
    if (mode == TC_ADD) TC_GO(TC_ADD);
    TC_GO(TC_STORE);
#undef TC_GO
}
