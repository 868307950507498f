/*
 * cuda_matmul.cu - y = x W^T for f32 activations and f32 / f16 / bf16 weights (cuda_kernels.h
 * kiln_cu_matmul_multi, kiln_cu_matmul_add, kiln_cu_matmul_glu): one batch-invariant kernel
 * for every number of rows, written to stream the weights at the memory roofline when the
 * rows are few (decode: 1 .. 8 rows per block, every weight byte read once per block).
 *
 * The reduction order of every y[t, o] (the same for any n_tok, any row tiling R, any
 * unrolling U, any number of outputs per warp or per launch):
 *   - vector path (n_in % 8 == 0, w rows 16-byte aligned, x 16-byte aligned): lane l of the
 *     warp that owns output o takes the 8-element chunks k = 8 l + 256 j .. 8 l + 256 j + 7
 *     (j = 0, 1, ...), and sums w[o, k] * x[t, k] over them in one fmaf chain from +0, in
 *     ascending k; then the 32 lane sums meet in the xor butterfly (offsets 16, 8, 4, 2, 1);
 *   - scalar path (otherwise): the same with one element per chunk, k = l + 32 j.
 * The row tile R (1, 2, 4 or 8 rows per block, by n_tok) decides only how many accumulators a
 * lane keeps, and U how many chunks' loads are in flight before their fmaf: neither changes
 * the chain. So a token's row computed in a one-token decode step is bitwise the row of the
 * same token inside a prefill chunk.
 *
 * Memory: a block is 4 warps, each owning 2 weight rows (2 outputs; or, for the GLU form, the
 * gate and up rows of one output), so each weight row is read by one warp, with 16-byte
 * streaming loads (ld.global.nc.L1::no_allocate) U chunks deep: 2 x U x 16 bytes in flight
 * per lane. x rows are read through L1 (__ldg), shared by the block's warps. No tensor cores:
 * the FMA units bound it from about 8 rows (f32 activations: 2 flops per weight byte per row);
 * tensor-core GEMMs with this order (or a decode path matched to theirs) are issue 16's next
 * milestone.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_elem.cuh"

#define MM_WARPS 4
#define MM_OPW   2 /* weight rows per warp */

enum { MM_STORE = 0, MM_ADD = 1, MM_GLU = 2 };

/* up to CU_MM_MAX_OUTS weights of one dtype and one load path over the same x, in one launch:
 * output j owns blocks [first[j], first[j + 1]) of the grid's y dimension (at most 65535 blocks:
 * 524280 outputs per launch) */
#define CU_MM_MAX_OUTS 4

typedef struct mm_args {
    float *y[CU_MM_MAX_OUTS];
    const void *w[CU_MM_MAX_OUTS];
    int64_t n_out[CU_MM_MAX_OUTS];
    int64_t first[CU_MM_MAX_OUTS + 1];
    const void *w_up; /* MM_GLU: the up weight (w[0] is the gate) */
    int n;
    int act; /* MM_GLU */
    int64_t n_in;
    const float *x;
    int32_t n_tok;
    int vec; /* k_matmul_q: 16-byte weight loads and float4 x loads */
} mm_args;

/* 8 weights from element k of a row (16-byte aligned): 16 bytes of f16 / bf16, 32 of f32 */
template <int E> struct chunk8 {
    uint4 v[E == CU_F32 ? 2 : 1];
};

/* volatile: the loads stay in program order, before the dependency wait (cu_pdl_wait) */
__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

template <int E> __device__ __forceinline__ chunk8<E> load_chunk(const void *row, int64_t k) {
    chunk8<E> c;
    if constexpr (E == CU_F32) {
        const float *p = (const float *)row + k;
        c.v[0] = ld_stream(p);
        c.v[1] = ld_stream(p + 4);
    } else {
        c.v[0] = ld_stream((const uint16_t *)row + k);
    }
    return c;
}

/* the chunk's 8 weights as f32 (exact widening) */
template <int E> __device__ __forceinline__ void widen(const chunk8<E> &c, float *w) {
    if constexpr (E == CU_F32) {
        const uint4 a = c.v[0], b = c.v[1];
        w[0] = __uint_as_float(a.x), w[1] = __uint_as_float(a.y);
        w[2] = __uint_as_float(a.z), w[3] = __uint_as_float(a.w);
        w[4] = __uint_as_float(b.x), w[5] = __uint_as_float(b.y);
        w[6] = __uint_as_float(b.z), w[7] = __uint_as_float(b.w);
    } else {
        const uint4 a = c.v[0];
        w[0] = cu_half_lo(a.x, E), w[1] = cu_half_hi(a.x, E);
        w[2] = cu_half_lo(a.y, E), w[3] = cu_half_hi(a.y, E);
        w[4] = cu_half_lo(a.z, E), w[5] = cu_half_hi(a.z, E);
        w[6] = cu_half_lo(a.w, E), w[7] = cu_half_hi(a.w, E);
    }
}

/* the U chunks k0 + 256 u (u < U, k < n_in) of each valid weight row */
template <int E, int U, int OPW>
__device__ __forceinline__ void mm_load(chunk8<E> (&w)[U][OPW], const void *const *wr,
                                        const bool *valid, int64_t k0, int64_t n_in) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < OPW; i++)
            if (k0 + 256 * u < n_in && valid[i]) w[u][i] = load_chunk<E>(wr[i], k0 + 256 * u);
}

/* the fmafs of those chunks into the rows' accumulators, in ascending k */
template <int E, int R, int U, int OPW>
__device__ __forceinline__ void mm_fma(float (&acc)[OPW][R], const chunk8<E> (&w)[U][OPW],
                                       const bool *valid, const float *xr, int64_t n_in, int nr,
                                       int64_t k0) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t k = k0 + 256 * u;
        if (k >= n_in) break;
        float wf[OPW][8];
#pragma unroll
        for (int i = 0; i < OPW; i++) {
            if (valid[i])
                widen<E>(w[u][i], wf[i]);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) wf[i][e] = 0.0f;
        }
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) {
                const float4 xa = __ldg((const float4 *)(xr + r * n_in + k));
                const float4 xb = __ldg((const float4 *)(xr + r * n_in + k + 4));
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int i = 0; i < OPW; i++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[i][r] = fmaf(wf[i][e], xv[e], acc[i][r]);
            }
    }
}

/* the end of every matmul kernel: the 32 lane sums of each accumulator by the xor butterfly,
 * then lane 0 stores (MM_STORE), adds (MM_ADD) or applies the GLU (MM_GLU: acc[0] the gate,
 * acc[1] the up row of output o[0]) for rows r0 .. r0 + nr of y_j */
template <int R, int MODE, int OPW>
__device__ __forceinline__ void mm_epilogue(float (&acc)[OPW][R], const mm_args &a, int j,
                                            const int64_t *o, const bool *valid, int64_t r0,
                                            int nr, int lane) {
#pragma unroll
    for (int i = 0; i < OPW; i++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[i][r] = cu_warp_sum(acc[i][r]);
    if (lane != 0) return;
    float *y = a.y[j];
    const int64_t n_out = a.n_out[j];
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= nr) break;
        float *yr = y + (r0 + r) * n_out;
        if (MODE == MM_GLU) {
            yr[o[0]] = cu_glu_value(acc[0][r], acc[1][r], a.act);
        } else {
#pragma unroll
            for (int i = 0; i < OPW; i++)
                if (valid[i]) {
                    if (MODE == MM_ADD)
                        yr[o[i]] += acc[i][r];
                    else
                        yr[o[i]] = acc[i][r];
                }
        }
    }
}

/* the weight j of a that blockIdx.y falls in (returned), and this warp's OPW rows of it:
 * outputs o[i] (MM_GLU: the gate and up rows of one output), their addresses wr[i] (rows
 * row_bytes apart) and whether each exists */
template <int MODE, int WARPS, int OPW>
__device__ __forceinline__ int mm_rows(const mm_args &a, size_t row_bytes, int64_t *o,
                                       const void **wr, bool *valid) {
    int j = 0;
    while (j + 1 < a.n && (int64_t)blockIdx.y >= a.first[j + 1]) j++;
    const int64_t blk = (int64_t)blockIdx.y - a.first[j];
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < OPW; i++) {
        o[i] = MODE == MM_GLU ? blk * WARPS + warp : (blk * WARPS + warp) * OPW + i;
        valid[i] = o[i] < a.n_out[j];
        const void *base = MODE == MM_GLU && i == 1 ? a.w_up : a.w[j];
        wr[i] = (const char *)base + (size_t)(valid[i] ? o[i] : 0) * row_bytes;
    }
    return j;
}

/* WARPS warps per block, OPW weight rows per warp, U chunks per group (two groups in flight):
 * none of them changes the order of any output's sum */
template <int E, int R, int MODE, bool VEC, int WARPS = MM_WARPS, int OPW = MM_OPW,
          int U = (R <= 2 ? 4 : R == 4 ? 2 : 1)>
__global__ void __launch_bounds__(WARPS * 32) k_matmul(mm_args a) {
    /* programmatic dependent launch: the next kernel may start now (it waits for this one
     * before it reads what this one writes); this one reads its weights at once and waits
     * for the kernel before it only before reading x (and y) */
    cu_pdl_launch_dependents();
    /* grid: x the row groups (fastest, so that the groups sharing a weight block run together
     * and read it from L2), y the weight blocks */
    const int64_t n_in = a.n_in;
    const int lane = threadIdx.x & 31;
    int64_t o[OPW];
    const void *wr[OPW];
    bool valid[OPW];
    const int j = mm_rows<MODE, WARPS, OPW>(a, (size_t)n_in * (E == CU_F32 ? 4 : 2), o, wr, valid);
    if (!valid[0]) {
        cu_pdl_wait();
        return;
    }
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const int nr = a.n_tok - r0 < R ? (int)(a.n_tok - r0) : R;
    const float *xr = a.x + r0 * n_in;
    float acc[OPW][R];
#pragma unroll
    for (int i = 0; i < OPW; i++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[i][r] = 0.0f;
    if (VEC) {
        /* two groups of U chunks in turn: the next group's loads are in flight while the
         * current one's fmafs run (the chain still takes the lane's chunks in ascending k) */
        chunk8<E> wa[U][OPW], wb[U][OPW];
        int64_t k0 = 8 * lane;
        mm_load<E, U, OPW>(wa, wr, valid, k0, n_in);
        cu_pdl_wait(); /* the weights are on their way; x may be read from here on */
        while (k0 < n_in) {
            const int64_t k1 = k0 + 256 * U;
            if (k1 < n_in) mm_load<E, U, OPW>(wb, wr, valid, k1, n_in);
            mm_fma<E, R, U, OPW>(acc, wa, valid, xr, n_in, nr, k0);
            if (k1 >= n_in) break;
            const int64_t k2 = k1 + 256 * U;
            if (k2 < n_in) mm_load<E, U, OPW>(wa, wr, valid, k2, n_in);
            mm_fma<E, R, U, OPW>(acc, wb, valid, xr, n_in, nr, k1);
            k0 = k2;
        }
    } else {
        cu_pdl_wait();
        for (int64_t k = lane; k < n_in; k += 32) {
            float wv[OPW];
#pragma unroll
            for (int i = 0; i < OPW; i++) wv[i] = valid[i] ? cu_load<E>(wr[i], k) : 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) {
                    const float xv = xr[r * n_in + k];
#pragma unroll
                    for (int i = 0; i < OPW; i++) acc[i][r] = fmaf(wv[i], xv, acc[i][r]);
                }
        }
    }
    mm_epilogue<R, MODE, OPW>(acc, a, j, o, valid, r0, nr, lane);
}

/* ---- Q8_0 / Q4_0 weights (ggml's block layouts, tensor/dtype.h), dequantized in registers ---- */

/* A block of 32 weights: Q8_0 an f16 scale d and 32 int8 q (34 bytes), w = q d; Q4_0 an f16 d
 * and 16 bytes of nibbles (18 bytes), element j < 16 the low nibble of byte j, j >= 16 the
 * high nibble of byte j - 16, w = (nibble - 8) d. Both products are exact in f32 (an 11-bit
 * by an 8-bit significand), so w is tensor/dtype.c to_float's value. A row of n_in weights is
 * n_in / 32 blocks. A warp owns MM_OPW rows; it walks them in tiles of 64 blocks (Q8_0 2176
 * bytes, Q4_0 1152), each tile loaded by the whole warp with coalesced 16-byte streaming
 * loads (or 2-byte loads when the rows are not 16-byte multiples) into the warp's shared
 * memory, the next tile's loads in flight while this one is summed. Lane l then takes the
 * weights k = 4l + 128g + e (e < 4: four consecutive elements of block 4g + l / 8) of the
 * tile's 16 groups g, so the warp's x loads are one coalesced 512-byte float4 row segment. */
template <int Q> struct qfmt {
    static constexpr int BS = Q == CU_Q8_0 ? 34 : 18; /* bytes per block */
    static constexpr int TB = 64 * BS;                /* bytes per tile */
    static constexpr int TU = TB / 16;                /* 16-byte units per tile: 136, 72 */
    static constexpr int NU = (TU + 31) / 32;         /* units per lane: 5, 3 */
};

/* the 4 weights of elements 4m .. 4m + 3 (m < 8) of the block at p (shared memory, 2-byte
 * aligned), exactly: each quant byte b becomes the f32 2^23 + b (bits 0x4B0000bb), from which
 * 2^23 + the bias (Q8_0: 128 after the sign flip, Q4_0: 8) is subtracted exactly, then times
 * d (no int-to-float conversion instruction) */
template <int Q> __device__ __forceinline__ void q_four(const unsigned char *p, int m, float *w) {
    const float d = __half2float(__ushort_as_half(*(const unsigned short *)p));
    const int off = Q == CU_Q8_0 ? 2 + 4 * m : 2 + 4 * (m & 3);
    uint32_t v = (uint32_t) * (const unsigned short *)(p + off) |
                 (uint32_t) * (const unsigned short *)(p + off + 2) << 16;
    float bias;
    if constexpr (Q == CU_Q8_0) {
        v ^= 0x80808080u; /* q + 128 as u8 */
        bias = 8388608.0f + 128.0f;
    } else {
        v = (m >= 4 ? v >> 4 : v) & 0x0F0F0F0Fu; /* elements 16.. are the high nibbles */
        bias = 8388608.0f + 8.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; e++)
        w[e] = (__int_as_float(__byte_perm(v, 0x4B000000u, 0x7440 + e)) - bias) * d;
}

/* The order of every y[t, o] (for any n_tok, any row tile R, any grid): lane l of the warp
 * owning o sums w[o, k] x[t, k] over k = 4l + 128g + e (g ascending, e = 0..3, k < n_in) in one
 * fmaf chain from +0, w the exact dequantized weight; then the xor butterfly over the lanes:
 * the CUDA-core kernel's order with chunks of 4. The rows a block holds (R) change only how
 * many accumulators a lane keeps. */
template <int Q, int R, int MODE>
__global__ void __launch_bounds__(MM_WARPS * 32) k_matmul_q(mm_args a) {
    using F = qfmt<Q>;
    constexpr int OPW = MM_OPW;
    __shared__ __align__(16) uint4 sm[MM_WARPS][OPW][F::TU];
    cu_pdl_launch_dependents();
    const int64_t n_in = a.n_in;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t nb = n_in / 32, row_bytes = nb * F::BS;
    int64_t o[OPW];
    const void *wr[OPW];
    bool valid[OPW];
    const int j = mm_rows<MODE, MM_WARPS, OPW>(a, (size_t)row_bytes, o, wr, valid);
    if (!valid[0]) {
        cu_pdl_wait();
        return;
    }
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const int nr = a.n_tok - r0 < R ? (int)(a.n_tok - r0) : R;
    const float *xr = a.x + r0 * n_in;
    const bool vec = a.vec != 0;
    const int64_t n_tiles = (nb + 63) / 64;
    float acc[OPW][R];
#pragma unroll
    for (int i = 0; i < OPW; i++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[i][r] = 0.0f;
    uint4 reg[OPW][F::NU];
    /* tile t's 16-byte units into reg (vec): unit u of a row when it lies inside the row */
    auto load_regs = [&](int64_t t) {
        const int64_t off = t * F::TB, lim = row_bytes - off;
#pragma unroll
        for (int m = 0; m < F::NU; m++) {
            const int u = lane + 32 * m;
#pragma unroll
            for (int i = 0; i < OPW; i++)
                if (u < F::TU && 16 * u < lim && valid[i])
                    reg[i][m] = ld_stream((const char *)wr[i] + off + 16 * u);
        }
    };
    if (vec) load_regs(0);
    cu_pdl_wait(); /* the weights are on their way; x may be read from here on */
    for (int64_t t = 0; t < n_tiles; t++) {
        __syncwarp(); /* the lanes are done with the previous tile */
        const int64_t off = t * F::TB, lim = row_bytes - off;
        if (vec) {
#pragma unroll
            for (int m = 0; m < F::NU; m++) {
                const int u = lane + 32 * m;
#pragma unroll
                for (int i = 0; i < OPW; i++)
                    if (u < F::TU && 16 * u < lim && valid[i]) sm[warp][i][u] = reg[i][m];
            }
            if (t + 1 < n_tiles) load_regs(t + 1);
        } else {
#pragma unroll
            for (int i = 0; i < OPW; i++) {
                if (!valid[i]) continue;
                uint16_t *d = (uint16_t *)sm[warp][i];
                const uint16_t *src = (const uint16_t *)((const char *)wr[i] + off);
                for (int u = lane; u < F::TB / 2 && 2 * u < lim; u += 32) d[u] = src[u];
            }
        }
        __syncwarp();
        /* the tile's groups of 4 blocks; a group past the row's end stops the warp, a block
         * past it idles its 8 lanes */
        const int sub = lane & 7, bq = lane >> 3;
#pragma unroll 4
        for (int g = 0; g < 16; g++) {
            const int64_t b = t * 64 + 4 * g + bq;
            if (t * 64 + 4 * g >= nb) break;
            if (b >= nb) continue;
            float xv[R][4];
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) {
                    const float *xk = xr + r * n_in + 32 * b + 4 * sub;
                    if (vec) {
                        const float4 v4 = __ldg((const float4 *)xk);
                        xv[r][0] = v4.x, xv[r][1] = v4.y, xv[r][2] = v4.z, xv[r][3] = v4.w;
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) xv[r][e] = xk[e];
                    }
                }
#pragma unroll
            for (int i = 0; i < OPW; i++) {
                if (!valid[i]) continue;
                float w[4];
                q_four<Q>((const unsigned char *)sm[warp][i] + (4 * g + bq) * F::BS, sub, w);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < nr)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i][r] = fmaf(w[e], xv[r][e], acc[i][r]);
            }
        }
    }
    mm_epilogue<R, MODE, OPW>(acc, a, j, o, valid, r0, nr, lane);
}

/* launched with programmatic stream serialization: it may start while the kernel before it
 * finishes (k_matmul waits for it before reading anything it wrote) */
/* Launch shapes (gpu_matmul_bench's variant table on the H200, run 3 of bench/gpu/README.md:
 * one row, 32 launches chained in a graph): SH_WIDE, 16 warps of one row each with groups of 2
 * chunks, streamed the narrow and the long-row weights fastest (4096x4096: 10.7 us against
 * 12.5, 4096x14336: 30.7 against 36.8); SH_PAIR, 4 warps of two rows with groups of 2, the
 * others (6144x4096: 16.8 against 20.8; 14336x4096: 33.5 against 35.7); the output head was
 * the same under all. Rows beyond one keep 4 warps of two rows. No shape changes the order. */
enum { SH_DEF = 0, SH_WIDE = 1, SH_PAIR = 2 };

static int mm_shape(cu_elem e, int32_t n_tok, int64_t n_out_total, int64_t n_in, int mode) {
    if (n_tok != 1 || e == CU_Q8_0 || e == CU_Q4_0) return SH_DEF;
    if (mode == MM_GLU) return SH_PAIR; /* a warp holds the gate and up rows of one output */
    return n_in >= 8192 || n_out_total <= 4096 ? SH_WIDE : SH_PAIR;
}

/* outputs per block of a shape */
static int64_t mm_per_block(int shape, int mode) {
    if (mode == MM_GLU) return MM_WARPS;
    return shape == SH_WIDE ? 16 : MM_WARPS * MM_OPW;
}

/* one launch of kernel k with programmatic stream serialization: it may start while the
 * kernel before it finishes (the matmul kernels wait for it before reading anything it wrote) */
template <typename K> static void launch_pdl(cudaStream_t s, K k, dim3 grid, int warps,
                                             const mm_args &a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(warps * 32);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cu_pdl_enabled() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, a);
}

template <int E, int R, int MODE, int W = MM_WARPS, int O = MM_OPW,
          int U = (R <= 2 ? 4 : R == 4 ? 2 : 1)>
static void launch_r(cudaStream_t s, const mm_args &a, bool vec, dim3 grid) {
    if (vec)
        launch_pdl(s, k_matmul<E, R, MODE, true, W, O, U>, grid, W, a);
    else
        launch_pdl(s, k_matmul<E, R, MODE, false, W, O, U>, grid, W, a);
}

/* the quantized kernel: row tiles as launch() below (the order does not depend on them) */
template <int Q, int MODE> static cudaError_t launch_q(cudaStream_t s, const mm_args &a) {
    const int R = a.n_tok <= 1 ? 1 : a.n_tok <= 2 ? 2 : a.n_tok <= 4 ? 4 : 8;
    const dim3 grid((unsigned)((a.n_tok + R - 1) / R), (unsigned)a.first[a.n]);
    if (R == 1)
        launch_pdl(s, k_matmul_q<Q, 1, MODE>, grid, MM_WARPS, a);
    else if (R == 2)
        launch_pdl(s, k_matmul_q<Q, 2, MODE>, grid, MM_WARPS, a);
    else if (R == 4)
        launch_pdl(s, k_matmul_q<Q, 4, MODE>, grid, MM_WARPS, a);
    else
        launch_pdl(s, k_matmul_q<Q, 8, MODE>, grid, MM_WARPS, a);
    return cudaGetLastError();
}

static bool is_quant(cu_elem e) { return e == CU_Q8_0 || e == CU_Q4_0; }

/* the row tile: the smallest of 1, 2, 4, 8 that holds n_tok, else 8 with grid.x row groups */
template <int E, int MODE>
static cudaError_t launch(cudaStream_t s, const mm_args &a, bool vec, int shape) {
    const int R = a.n_tok <= 1 ? 1 : a.n_tok <= 2 ? 2 : a.n_tok <= 4 ? 4 : 8;
    const dim3 grid((unsigned)((a.n_tok + R - 1) / R), (unsigned)a.first[a.n]);
    if (R == 1) {
        if (shape == SH_WIDE && MODE != MM_GLU)
            launch_r<E, 1, MODE, 16, 1, 2>(s, a, vec, grid);
        else if (shape == SH_PAIR)
            launch_r<E, 1, MODE, MM_WARPS, MM_OPW, 2>(s, a, vec, grid);
        else
            launch_r<E, 1, MODE>(s, a, vec, grid);
    } else if (R == 2)
        launch_r<E, 2, MODE>(s, a, vec, grid);
    else if (R == 4)
        launch_r<E, 4, MODE>(s, a, vec, grid);
    else
        launch_r<E, 8, MODE>(s, a, vec, grid);
    return cudaGetLastError();
}

template <int MODE>
static cudaError_t launch_e(cudaStream_t s, cu_elem e, mm_args a, bool vec, int shape) {
    a.vec = vec;
    if (e == CU_Q8_0) return launch_q<CU_Q8_0, MODE>(s, a);
    if (e == CU_Q4_0) return launch_q<CU_Q4_0, MODE>(s, a);
    if (e == CU_F16) return launch<CU_F16, MODE>(s, a, vec, shape);
    if (e == CU_BF16) return launch<CU_BF16, MODE>(s, a, vec, shape);
    return launch<CU_F32, MODE>(s, a, vec, shape);
}

/* the row-load path of one weight: 16-byte vectors when n_in, w and x allow them */
static bool vec_path(cu_elem e, const void *w, int64_t n_in, const float *x) {
    if (is_quant(e)) /* every row a multiple of 16 bytes: n_in / 32 blocks a multiple of 8 */
        return n_in % 256 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
    return n_in % 8 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
}

static bool grid_ok(int32_t n_tok, int64_t blocks) {
    (void)n_tok;
    return blocks <= 65535;
}

extern "C" cudaError_t kiln_cu_matmul_multi(cudaStream_t s, const cu_mm_out *outs, int n,
                                            int64_t n_in, const float *x, int32_t n_tok,
                                            void *xh, size_t xh_bytes) {
    if (n_tok < 1) return cudaSuccess;
    for (int i = 0; i < n;) {
        if (kiln_cu_matmul_tc_ok(outs[i].w_elem, outs[i].w, n_in, x)) {
            /* a tensor-core group: consecutive weights of one type that it takes */
            int k = 1;
            while (i + k < n && k < CU_MM_MAX_OUTS && outs[i + k].w_elem == outs[i].w_elem &&
                   kiln_cu_matmul_tc_ok(outs[i + k].w_elem, outs[i + k].w, n_in, x))
                k++;
            const cudaError_t err =
                kiln_cu_matmul_tc(s, MM_STORE, outs + i, k, NULL, 0, n_in, x, n_tok, xh, xh_bytes);
            if (err != cudaSuccess) return err;
            i += k;
            continue;
        }
        /* a group: consecutive weights of one dtype and path, at most CU_MM_MAX_OUTS */
        const cu_elem e = outs[i].w_elem;
        const bool vec = vec_path(e, outs[i].w, n_in, x);
        int64_t tot = 0;
        for (int q = i; q < n && q < i + CU_MM_MAX_OUTS; q++) tot += outs[q].n_out;
        const int shape = vec ? mm_shape(e, n_tok, tot, n_in, MM_STORE) : SH_DEF;
        const int64_t per_block = mm_per_block(shape, MM_STORE);
        mm_args a = {};
        a.n_in = n_in;
        a.x = x;
        a.n_tok = n_tok;
        int k = 0;
        while (i < n && k < CU_MM_MAX_OUTS && outs[i].w_elem == e &&
               vec_path(e, outs[i].w, n_in, x) == vec &&
               !kiln_cu_matmul_tc_ok(outs[i].w_elem, outs[i].w, n_in, x)) {
            a.y[k] = outs[i].y;
            a.w[k] = outs[i].w;
            a.n_out[k] = outs[i].n_out;
            a.first[k + 1] = a.first[k] + (outs[i].n_out + per_block - 1) / per_block;
            k++;
            i++;
        }
        a.n = k;
        if (a.first[k] == 0) continue;
        if (!grid_ok(n_tok, a.first[k])) return cudaErrorInvalidConfiguration;
        const cudaError_t err = launch_e<MM_STORE>(s, e, a, vec, shape);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

extern "C" cudaError_t kiln_cu_matmul_add(cudaStream_t s, const cu_mm_out *out, int64_t n_in,
                                          const float *x, int32_t n_tok, void *xh,
                                          size_t xh_bytes) {
    if (n_tok < 1 || out->n_out < 1) return cudaSuccess;
    if (kiln_cu_matmul_tc_ok(out->w_elem, out->w, n_in, x))
        return kiln_cu_matmul_tc(s, MM_ADD, out, 1, NULL, 0, n_in, x, n_tok, xh, xh_bytes);
    mm_args a = {};
    a.n_in = n_in;
    a.x = x;
    a.n_tok = n_tok;
    a.n = 1;
    a.y[0] = out->y;
    a.w[0] = out->w;
    a.n_out[0] = out->n_out;
    const bool vec = vec_path(out->w_elem, out->w, n_in, x);
    const int shape = vec ? mm_shape(out->w_elem, n_tok, out->n_out, n_in, MM_ADD) : SH_DEF;
    const int64_t per_block = mm_per_block(shape, MM_ADD);
    a.first[1] = (out->n_out + per_block - 1) / per_block;
    if (!grid_ok(n_tok, a.first[1])) return cudaErrorInvalidConfiguration;
    return launch_e<MM_ADD>(s, out->w_elem, a, vec, shape);
}

extern "C" cudaError_t kiln_cu_matmul_glu(cudaStream_t s, float *y, const void *w_gate,
                                          const void *w_up, cu_elem elem, int64_t n_out,
                                          int64_t n_in, const float *x, int32_t n_tok, int act,
                                          void *xh, size_t xh_bytes) {
    if (n_tok < 1 || n_out < 1) return cudaSuccess;
    if (kiln_cu_matmul_tc_ok(elem, w_gate, n_in, x) && kiln_cu_matmul_tc_ok(elem, w_up, n_in, x)) {
        const cu_mm_out g = {y, w_gate, elem, n_out};
        return kiln_cu_matmul_tc(s, MM_GLU, &g, 1, w_up, act, n_in, x, n_tok, xh, xh_bytes);
    }
    mm_args a = {};
    a.n_in = n_in;
    a.x = x;
    a.n_tok = n_tok;
    a.n = 1;
    a.act = act;
    a.y[0] = y;
    a.w[0] = w_gate;
    a.w_up = w_up;
    a.n_out[0] = n_out;
    a.first[1] = (n_out + MM_WARPS - 1) / MM_WARPS;
    if (!grid_ok(n_tok, a.first[1])) return cudaErrorInvalidConfiguration;
    const bool vec = vec_path(elem, w_gate, n_in, x) && vec_path(elem, w_up, n_in, x);
    return launch_e<MM_GLU>(s, elem, a, vec, vec ? mm_shape(elem, n_tok, n_out, n_in, MM_GLU) : SH_DEF);
}

/* ---- the first milestone's kernel, unchanged (KILN_CUDA_KERNELS=v1: before/after timings) ---- */

#define MM1_WARPS 8

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

typedef struct mm1_args {
    float *y[CU_MM_MAX_OUTS];
    const void *w[CU_MM_MAX_OUTS];
    int64_t n_out[CU_MM_MAX_OUTS];
    int64_t first[CU_MM_MAX_OUTS + 1];
    int n;
    int64_t n_in;
    const float *x;
    int32_t n_tok;
} mm1_args;

template <int E, int R, bool VEC>
__global__ void __launch_bounds__(MM1_WARPS * 32) k_matmul_v1(mm1_args a) {
    int j = 0;
    while (j + 1 < a.n && (int64_t)blockIdx.x >= a.first[j + 1]) j++;
    const int64_t n_out = a.n_out[j], n_in = a.n_in;
    const int lane = threadIdx.x & 31;
    const int64_t o = ((int64_t)blockIdx.x - a.first[j]) * MM1_WARPS + (threadIdx.x >> 5);
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

template <int E> static cudaError_t launch_v1(cudaStream_t s, const mm1_args &a, bool vec) {
    const dim3 grid((unsigned)a.first[a.n], a.n_tok == 1 ? 1u : (unsigned)((a.n_tok + 7) / 8));
    const dim3 block(MM1_WARPS * 32);
    if (a.n_tok == 1) {
        if (vec)
            k_matmul_v1<E, 1, true><<<grid, block, 0, s>>>(a);
        else
            k_matmul_v1<E, 1, false><<<grid, block, 0, s>>>(a);
    } else {
        if (vec)
            k_matmul_v1<E, 8, true><<<grid, block, 0, s>>>(a);
        else
            k_matmul_v1<E, 8, false><<<grid, block, 0, s>>>(a);
    }
    return cudaGetLastError();
}

/* the row-load path of one weight: 16-byte vectors when n_in, w and x allow them */
static bool vec_path_v1(cu_elem e, const void *w, int64_t n_in, const float *x) {
    const size_t esz = e == CU_F32 ? 4 : 2;
    return n_in % 4 == 0 && (uintptr_t)w % (4 * esz) == 0 && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t kiln_cu_matmul_v1(cudaStream_t s, const cu_mm_out *outs, int n,
                                            int64_t n_in, const float *x, int32_t n_tok) {
    if (n_tok < 1) return cudaSuccess;
    if ((n_tok + 7) / 8 > 65535) return cudaErrorInvalidConfiguration;
    for (int i = 0; i < n; i++) /* the first milestone's kernel reads no quantized weights */
        if (is_quant(outs[i].w_elem)) return cudaErrorInvalidValue;
    for (int i = 0; i < n;) {
        /* a group: consecutive weights of one dtype and path, at most CU_MM_MAX_OUTS */
        const cu_elem e = outs[i].w_elem;
        const bool vec = vec_path_v1(e, outs[i].w, n_in, x);
        mm1_args a = {};
        a.n_in = n_in;
        a.x = x;
        a.n_tok = n_tok;
        int k = 0;
        while (i < n && k < CU_MM_MAX_OUTS && outs[i].w_elem == e &&
               vec_path_v1(e, outs[i].w, n_in, x) == vec) {
            a.y[k] = outs[i].y;
            a.w[k] = outs[i].w;
            a.n_out[k] = outs[i].n_out;
            a.first[k + 1] = a.first[k] + (outs[i].n_out + MM1_WARPS - 1) / MM1_WARPS;
            k++;
            i++;
        }
        a.n = k;
        if (a.first[k] == 0) continue;
        if (a.first[k] > 0x7fffffff) return cudaErrorInvalidConfiguration;
        cudaError_t err;
        if (e == CU_F16)
            err = launch_v1<CU_F16>(s, a, vec);
        else if (e == CU_BF16)
            err = launch_v1<CU_BF16>(s, a, vec);
        else
            err = launch_v1<CU_F32>(s, a, vec);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}
