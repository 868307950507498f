/*
 * gpu_matmul_bench - the CUDA backend's matmul kernels (cuda_kernels.h) on the Llama-3.1-8B
 * layer shapes, against the device's own copy bandwidth (issue 16):
 *   copy      cudaMemcpy device to device of 2 GiB: bytes read + written / time (the roofline
 *             of a kernel that streams its inputs once)
 *   per shape and row count M: time (median of 20 timed launches after 3 warm-ups, weights
 *             rotated over 4 copies so that no launch finds them in the 60 MB L2), the weight
 *             stream in GB/s (weight bytes / time) and TFLOP/s (2 M n_out n_in / time)
 *   decode    the sum over one layer's matmuls at M = 1, x 32 layers, + the output head: the
 *             matmul time of one batch-1 decode step, and the tok/s it allows
 * Inputs are random (never zeros: METHOD.md); every launch's error is checked.
 * Usage: gpu_matmul_bench [M ...] (default 1 2 4 8 16 64 256 2048). Prints a table. Env
 * KILN_BENCH_WTYPE=bf16 (default), q8_0 or q4_0: the weights' type (the quantized ones are
 * random bytes whose block scales are finite f16; GB/s counts their bytes).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_kernels.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { COPIES = 4, WARM = 3, REPS = 20 };

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* bf16 of a pseudo-random value in [-0.05, 0.05) */
static uint16_t rnd_bf16(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    float v = (float)((double)(*s >> 11) / 9007199254740992.0 * 0.1 - 0.05);
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void *dev_random(size_t n_bf16, uint64_t seed) {
    const size_t chunk = (size_t)1 << 24;
    uint16_t *h = malloc(chunk * 2);
    if (!h) exit(1);
    void *d = NULL;
    CK(cudaMalloc(&d, n_bf16 * 2));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t off = 0; off < n_bf16; off += chunk) {
        const size_t m = n_bf16 - off < chunk ? n_bf16 - off : chunk;
        for (size_t i = 0; i < m; i++) h[i] = rnd_bf16(&s);
        CK(cudaMemcpy((uint16_t *)d + off, h, m * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

/* the tensor-core matmul's scratch (the backend's: half its activation arena) */
static void *g_xh;
static size_t g_xh_bytes;

/* the weights' type (KILN_BENCH_WTYPE) and the bytes of a row of n elements */
static cu_elem g_elem = CU_BF16;
static size_t row_bytes(int64_t n) {
    if (g_elem == CU_Q8_0) return (size_t)n / 32 * 34;
    if (g_elem == CU_Q4_0) return (size_t)n / 32 * 18;
    return (size_t)n * 2;
}

typedef struct shape {
    const char *name;
    int64_t n_out, n_in; /* per weight */
    int n_w;             /* weights in the launch (qkv: 3 of other n_out; glu: 2) */
    int64_t outs[3];
    int glu;
} shape;

/* median ms of one launch of shape sh at M rows; x [M, n_in] f32, y [M, total out] */
static float time_shape(const shape *sh, void *const *w, int32_t M, const float *x, float *y) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[REPS];
    for (int r = 0; r < WARM + REPS; r++) {
        const int c = r % COPIES;
        CK(cudaEventRecord(a, 0));
        if (sh->glu) {
            const size_t wb = (size_t)sh->n_out * row_bytes(sh->n_in);
            CK(kiln_cu_matmul_glu(0, y, w[c], (char *)w[c] + wb, g_elem, sh->n_out, sh->n_in, x,
                                  M, CU_ACT_SILU, g_xh, g_xh_bytes));
        } else {
            cu_mm_out o[3];
            size_t off = 0, yoff = 0;
            for (int i = 0; i < sh->n_w; i++) {
                o[i] = (cu_mm_out){y + yoff, (char *)w[c] + off, g_elem, sh->outs[i]};
                off += (size_t)sh->outs[i] * row_bytes(sh->n_in);
                yoff += (size_t)M * sh->outs[i];
            }
            CK(kiln_cu_matmul_multi(0, o, sh->n_w, sh->n_in, x, M, g_xh, g_xh_bytes));
        }
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= WARM) t[r - WARM] = ms;
    }
    qsort(t, REPS, sizeof t[0], cmp_f);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[REPS / 2];
}

int main(int argc, char **argv) {
    int32_t Ms[16] = {1, 2, 4, 8, 16, 64, 256, 2048};
    int nM = 8;
    if (argc > 1) {
        nM = 0;
        for (int i = 1; i < argc && nM < 16; i++) Ms[nM++] = atoi(argv[i]);
    }
    int32_t maxM = 1;
    for (int i = 0; i < nM; i++) maxM = Ms[i] > maxM ? Ms[i] : maxM;
    const char *wt = getenv("KILN_BENCH_WTYPE");
    if (wt && !strcmp(wt, "q8_0"))
        g_elem = CU_Q8_0;
    else if (wt && !strcmp(wt, "q4_0"))
        g_elem = CU_Q4_0;
    else if (wt && strcmp(wt, "bf16")) {
        fprintf(stderr, "KILN_BENCH_WTYPE='%s': expected bf16, q8_0 or q4_0\n", wt);
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB; weights %s\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, wt ? wt : "bf16");

    /* the roofline: a 2 GiB device-to-device copy */
    {
        const size_t bytes = (size_t)2 << 30;
        void *s = dev_random(bytes / 2, 7), *d = NULL;
        CK(cudaMalloc(&d, bytes));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        float t[REPS];
        for (int r = 0; r < WARM + REPS; r++) {
            CK(cudaEventRecord(a, 0));
            CK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, 0));
            CK(cudaEventRecord(b, 0));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (r >= WARM) t[r - WARM] = ms;
        }
        qsort(t, REPS, sizeof t[0], cmp_f);
        printf("copy: 2 GiB device to device, median %.3f ms: %.0f GB/s (read + written)\n",
               t[REPS / 2], 2.0 * (double)bytes / (t[REPS / 2] * 1e-3) / 1e9);
        CK(cudaFree(s));
        CK(cudaFree(d));
    }

    const shape shapes[] = {
        {"qkv 6144x4096", 6144, 4096, 3, {4096, 1024, 1024}, 0},
        {"o 4096x4096", 4096, 4096, 1, {4096, 0, 0}, 0},
        {"gate+up (glu) 2x14336x4096", 14336, 4096, 2, {14336, 14336, 0}, 1},
        {"down 4096x14336", 4096, 14336, 1, {4096, 0, 0}, 0},
        {"head 128256x4096", 128256, 4096, 1, {128256, 0, 0}, 0},
    };
    const int n_sh = sizeof shapes / sizeof shapes[0];
    float *x = NULL, *y = NULL;
    {
        const size_t nx = (size_t)maxM * 14336;
        float *h = malloc(nx * 4);
        if (!h) return 1;
        uint64_t s = 99;
        for (size_t i = 0; i < nx; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            h[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        CK(cudaMalloc((void **)&x, nx * 4));
        CK(cudaMemcpy(x, h, nx * 4, cudaMemcpyHostToDevice));
        g_xh_bytes = nx * 2;
        CK(cudaMalloc(&g_xh, g_xh_bytes));
        free(h);
        size_t ny = 0;
        for (int i = 0; i < n_sh; i++) {
            size_t t = 0;
            for (int j = 0; j < shapes[i].n_w; j++) t += (size_t)shapes[i].outs[j];
            if (t > ny) ny = t;
        }
        CK(cudaMalloc((void **)&y, ny * (size_t)maxM * 4));
    }
    printf("%-28s %6s %10s %9s %9s\n", "shape", "M", "us", "GB/s", "TFLOP/s");
    double decode_ms = 0.0;
    for (int si = 0; si < n_sh; si++) {
        const shape *sh = &shapes[si];
        size_t wn = 0, wb = 0; /* elements, bytes */
        for (int j = 0; j < sh->n_w; j++) {
            wn += (size_t)sh->outs[j] * sh->n_in;
            wb += (size_t)sh->outs[j] * row_bytes(sh->n_in);
        }
        void *w[COPIES];
        const int copies = wb > ((size_t)1 << 29) ? 2 : COPIES;
        /* bf16 words in [-0.05, 0.05): read as Q8_0 / Q4_0 blocks, every f16 scale is finite */
        for (int c = 0; c < COPIES; c++)
            w[c] = c < copies ? dev_random((wb + 1) / 2, 100 + c) : w[c % copies];
        for (int mi = 0; mi < nM; mi++) {
            const int32_t M = Ms[mi];
            const float ms = time_shape(sh, w, M, x, y);
            const double gbs = (double)wb / (ms * 1e-3) / 1e9,
                         tf = 2.0 * M * (double)wn / (ms * 1e-3) / 1e12;
            printf("%-28s %6d %10.2f %9.0f %9.2f\n", sh->name, M, ms * 1e3, gbs, tf);
            if (M == 1) decode_ms += ms * (si == n_sh - 1 ? 1.0 : 32.0);
        }
        for (int c = 0; c < copies; c++) CK(cudaFree(w[c]));
    }
    if (decode_ms > 0)
        printf("decode matmuls at M = 1 (32 layers + head): %.3f ms per token, %.1f tok/s if "
               "nothing else ran\n",
               decode_ms, 1e3 / decode_ms);
    CK(cudaFree(x));
    CK(cudaFree(y));
    return 0;
}
