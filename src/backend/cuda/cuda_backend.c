/*
 * cuda_backend.c - the CUDA backend's context (stream, arena, step metadata) and its table:
 * each operation of backend/backend.h checks what the kernels cannot and enqueues one launcher
 * of cuda_kernels.h on the context's stream.
 *
 * Host-to-device traffic per step: step_begin copies the step's per-token metadata (token ids,
 * sequences, positions) and the sequences' block tables into one pinned buffer and uploads it
 * with one async copy; gather_rows stages its row list the same way. A pinned buffer is
 * rewritten only after the event recorded behind its last copy has completed.
 */
#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_kernels.h"
#include "kv/kv_format.h"
#include "kv/kv_pool.h"
#include "util/error.h"

/* a pinned host buffer, its device twin, and the event behind its last upload */
typedef struct staged {
    int32_t *host, *dev;
    size_t cap; /* int32 elements */
    cudaEvent_t done;
} staged;

typedef struct cuda_backend {
    kiln_backend base; /* first: a kiln_backend * is a cuda_backend * */
    cudaStream_t stream;
    int cc_major, cc_minor;
    kiln_backend_reserve res;
    void *arena;
    size_t arena_cap;
    staged meta; /* the step's metadata */
    staged rows; /* gather_rows' row list */
    const kiln_step *st;
    cu_step cst; /* device views of meta for this step */
} cuda_backend;

static cuda_backend *cu_be(kiln_backend *be) {
    return (cuda_backend *)be;
}

/* A CUDA error inside an operation (which cannot return one, backend.h): the device context
 * cannot be trusted any more. */
static void cu_die(const cuda_backend *c, const char *what, cudaError_t e) {
    fprintf(stderr,
            "kiln: cuda backend (device %d): %s failed: %s (%s); the GPU context cannot "
            "continue\n",
            c->base.device, what, cudaGetErrorString(e), cudaGetErrorName(e));
    abort();
}

static void cu_check(const cuda_backend *c, const char *what, cudaError_t e) {
    if (e != cudaSuccess) cu_die(c, what, e);
}

/* make the context's device current on the calling thread (the engine calls from its own) */
static void cu_enter(const cuda_backend *c) {
    cu_check(c, "cudaSetDevice", cudaSetDevice(c->base.device));
}

int32_t kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* ---- context and memory --------------------------------------------------------------- */

static void staged_free(staged *s) {
    if (s->host) cudaFreeHost(s->host);
    if (s->dev) cudaFree(s->dev);
    s->host = s->dev = NULL;
    s->cap = 0;
}

/* room for n int32 in s (waits for the last upload first); false when out of memory */
static bool staged_reserve(cuda_backend *c, staged *s, size_t n) {
    cu_check(c, "waiting for a staged upload", cudaEventSynchronize(s->done));
    if (n <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < n) cap *= 2;
    staged_free(s);
    if (cudaMallocHost((void **)&s->host, cap * sizeof(int32_t)) != cudaSuccess ||
        cudaMalloc((void **)&s->dev, cap * sizeof(int32_t)) != cudaSuccess) {
        (void)cudaGetLastError();
        staged_free(s);
        return false;
    }
    s->cap = cap;
    return true;
}

static void staged_upload(cuda_backend *c, staged *s, size_t n, const char *what) {
    if (n > 0)
        cu_check(c, what,
                 cudaMemcpyAsync(s->dev, s->host, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 c->stream));
    cu_check(c, what, cudaEventRecord(s->done, c->stream));
}

static void cuda_destroy(kiln_backend *be) {
    cuda_backend *c = cu_be(be);
    if (cudaSetDevice(c->base.device) == cudaSuccess) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->arena) cudaFree(c->arena);
        staged_free(&c->meta);
        staged_free(&c->rows);
        if (c->meta.done) cudaEventDestroy(c->meta.done);
        if (c->rows.done) cudaEventDestroy(c->rows.done);
        if (c->stream) cudaStreamDestroy(c->stream);
    }
    free(c);
}

static kiln_status cuda_buf_alloc(kiln_backend *be, size_t bytes, void **out, kiln_error *err) {
    cuda_backend *c = cu_be(be);
    *out = NULL;
    cu_enter(c);
    const size_t n = bytes ? bytes : KILN_BACKEND_ALIGN;
    const cudaError_t e = cudaMalloc(out, n); /* 256-byte aligned */
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "cuda backend: allocating %zu bytes on device %d failed (%s; %.1f "
                              "MiB free of %.1f MiB)",
                              bytes, c->base.device, cudaGetErrorString(e),
                              (double)free_b / 1048576.0, (double)total_b / 1048576.0);
    }
    return KILN_OK;
}

static void cuda_buf_free(kiln_backend *be, void *buf) {
    cuda_backend *c = cu_be(be);
    if (!buf) return;
    cu_enter(c);
    cu_check(c, "cudaFree", cudaFree(buf));
}

/* src_host is ordinary (pageable) memory: the copy has taken it when this returns */
static void cuda_upload(kiln_backend *be, void *dst, const void *src_host, size_t bytes) {
    cuda_backend *c = cu_be(be);
    if (!bytes) return;
    cu_enter(c);
    cu_check(c, "upload",
             cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_download(kiln_backend *be, void *dst_host, const void *src, size_t bytes) {
    cuda_backend *c = cu_be(be);
    if (!bytes) return;
    cu_enter(c);
    cu_check(c, "download",
             cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    cu_check(c, "download (synchronize)", cudaStreamSynchronize(c->stream));
}

static kiln_status cuda_arena_reserve(kiln_backend *be, const kiln_backend_reserve *r,
                                      kiln_error *err) {
    cuda_backend *c = cu_be(be);
    kiln_backend_reserve want = *r;
    if (c->arena) { /* grow only */
        if (c->res.act_bytes > want.act_bytes) want.act_bytes = c->res.act_bytes;
        if (c->res.max_tokens > want.max_tokens) want.max_tokens = c->res.max_tokens;
        if (c->res.max_keys > want.max_keys) want.max_keys = c->res.max_keys;
        if (c->res.gdn_head_dim > want.gdn_head_dim) want.gdn_head_dim = c->res.gdn_head_dim;
        if (want.n_head == 0) {
            want.n_head = c->res.n_head;
            want.n_head_kv = c->res.n_head_kv;
            want.head_dim = c->res.head_dim;
        }
    }
    if (want.head_dim > KILN_CU_ATTN_MAX_HEAD_DIM)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "cuda backend: head_dim %d is above the attention kernel's %d",
                              want.head_dim, KILN_CU_ATTN_MAX_HEAD_DIM);
    const size_t bytes = (want.act_bytes + 255) & ~(size_t)255;
    if (bytes > c->arena_cap || !c->arena) {
        cu_enter(c);
        void *p = NULL;
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e == cudaSuccess) e = cudaMalloc(&p, bytes ? bytes : 256);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cuda backend: out of device memory for the %zu-byte activation "
                                  "arena (%d tokens, %d keys per step): %s",
                                  bytes, want.max_tokens, want.max_keys, cudaGetErrorString(e));
        }
        if (c->arena) cudaFree(c->arena);
        c->arena = p;
        c->arena_cap = bytes;
    }
    c->res = want;
    return KILN_OK;
}

static void *cuda_arena(kiln_backend *be) {
    return cu_be(be)->arena;
}

static void cuda_sync(kiln_backend *be) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "synchronize", cudaStreamSynchronize(c->stream));
}

/* The kernels and their orders (cuda_kernels.h) decide the bits; the device only picks the
 * machine code the same PTX becomes. */
static void cuda_numerics(const kiln_backend *be, char *buf, size_t n) {
    const cuda_backend *c = (const cuda_backend *)be;
    snprintf(buf, n, "cuda sm_%d%d mm=warp-v1 attn=2pass-v1", c->cc_major, c->cc_minor);
}

/* ---- the step -------------------------------------------------------------------------- */

static kiln_status cuda_step_begin(kiln_backend *be, const kiln_step *st, kiln_error *err) {
    cuda_backend *c = cu_be(be);
    const kiln_batch *b = st->b;
    if (!c->arena || st->n_tokens > c->res.max_tokens || st->max_keys > c->res.max_keys)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cuda backend: a step of %d tokens and %d keys exceeds the "
                              "reservation (%d tokens, %d keys)",
                              st->n_tokens, st->max_keys, c->res.max_tokens, c->res.max_keys);
    cu_enter(c);
    const size_t n = (size_t)st->n_tokens;
    size_t n_tab = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) n_tab += (size_t)b->seqs[s].n_blocks;
    const size_t need = 3 * n + (size_t)b->n_seqs + n_tab;
    if (!staged_reserve(c, &c->meta, need))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "cuda backend: out of memory for the step's metadata (%zu int32)",
                              need);
    int32_t *h = c->meta.host;
    memcpy(h, b->token, n * sizeof *h);
    memcpy(h + n, st->tok_seq, n * sizeof *h);
    memcpy(h + 2 * n, st->tok_pos, n * sizeof *h);
    int32_t *seq_table = h + 3 * n, *tables = seq_table + b->n_seqs;
    size_t off = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        seq_table[s] = (int32_t)off;
        memcpy(tables + off, b->seqs[s].block_table, (size_t)b->seqs[s].n_blocks * sizeof *h);
        off += (size_t)b->seqs[s].n_blocks;
    }
    staged_upload(c, &c->meta, need, "uploading the step's metadata");
    const int32_t *d = c->meta.dev;
    c->cst = (cu_step){st->n_tokens, d, d + n, d + 2 * n, d + 3 * n, d + 3 * n + b->n_seqs};
    c->st = st;
    return KILN_OK;
}

/* ---- operations ---------------------------------------------------------------------------- */

static cu_elem elem_of(const cuda_backend *c, kiln_dtype t, const char *what) {
    if (t == KILN_DTYPE_F32) return CU_F32;
    if (t == KILN_DTYPE_F16) return CU_F16;
    if (t == KILN_DTYPE_BF16) return CU_BF16;
    fprintf(stderr, "kiln: cuda backend (device %d): %s has dtype %s, which it cannot read\n",
            c->base.device, what, kiln_dtype_name(t));
    abort();
}

static void cuda_embed(kiln_backend *be, float *x, float *scratch, const kiln_mat *tok_embd,
                       const kiln_mat *pos_embd, float scale, const kiln_step *st) {
    cuda_backend *c = cu_be(be);
    (void)scratch;
    (void)st;
    cu_enter(c);
    const cu_elem te = elem_of(c, tok_embd->dtype, "the token embedding");
    const cu_elem pe = pos_embd ? elem_of(c, pos_embd->dtype, "the position embedding") : CU_F32;
    cu_check(c, "embed",
             kiln_cu_embed(c->stream, x, tok_embd->data, te, pos_embd ? pos_embd->data : NULL, pe,
                           tok_embd->n_in, scale, &c->cst));
}

static void cuda_matmul(kiln_backend *be, const kiln_mm *outs, int n_outs, const float *x,
                        int32_t n_tok) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    enum { GROUP = 8 };
    for (int i0 = 0; i0 < n_outs; i0 += GROUP) {
        cu_mm_out o[GROUP];
        const int n = n_outs - i0 < GROUP ? n_outs - i0 : GROUP;
        for (int i = 0; i < n; i++) {
            const kiln_mat *w = outs[i0 + i].w;
            if (w->layout != KILN_MAT_ROWS) {
                fprintf(stderr, "kiln: cuda backend: matrix '%s' is in a CPU layout (%d)\n",
                        w->name ? w->name : "?", (int)w->layout);
                abort();
            }
            o[i] = (cu_mm_out){outs[i0 + i].y, w->data, elem_of(c, w->dtype, "a matrix"),
                               w->n_out};
        }
        cu_check(c, "matmul",
                 kiln_cu_matmul_multi(c->stream, o, n, outs[i0].w->n_in, x, n_tok));
    }
}

static void cuda_norm(kiln_backend *be, float *out, const float *x, const float *w, const float *b,
                      int32_t n_rows, int64_t d, int kind, float eps) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "norm",
             kiln_cu_norm(c->stream, out, x, w, b, n_rows, d, kind == KILN_BE_NORM_LAYER, eps));
}

static void cuda_head_rmsnorm(kiln_backend *be, float *x, int32_t n_rows, int64_t stride,
                              int32_t n_heads, int32_t head_dim, const float *w, float eps) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "head_rmsnorm",
             kiln_cu_head_rmsnorm(c->stream, x, n_rows, stride, n_heads, head_dim, w, eps));
}

static void cuda_rope(kiln_backend *be, float *x, int64_t stride, int32_t n_heads,
                      int32_t head_dim, int32_t rot_dim, const float *inv_freq, int adjacent,
                      const kiln_step *st) {
    cuda_backend *c = cu_be(be);
    (void)st;
    cu_enter(c);
    cu_check(c, "rope",
             kiln_cu_rope(c->stream, x, stride, n_heads, head_dim, rot_dim, inv_freq, adjacent,
                          &c->cst));
}

static void cuda_add_bias(kiln_backend *be, float *y, const float *bias, int32_t n_rows,
                          int64_t dim) {
    cuda_backend *c = cu_be(be);
    if (!bias) return;
    cu_enter(c);
    cu_check(c, "add_bias", kiln_cu_add_bias(c->stream, y, bias, n_rows, dim));
}

static void cuda_add(kiln_backend *be, float *y, const float *x, int64_t n) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "add", kiln_cu_add(c->stream, y, x, n));
}

static void cuda_act(kiln_backend *be, float *x, int64_t n, int act) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "act", kiln_cu_act(c->stream, x, n, act));
}

static void cuda_glu(kiln_backend *be, float *g, const float *u, int64_t n, int act) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "glu", kiln_cu_glu(c->stream, g, u, n, act));
}

static void cuda_softcap(kiln_backend *be, float *x, int64_t n, float cap) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "softcap", kiln_cu_softcap(c->stream, x, n, cap));
}

static void cuda_split_heads(kiln_backend *be, float *a, float *b, const float *src,
                             int32_t n_rows, int32_t n_heads, int32_t head_dim) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "split_heads", kiln_cu_split_heads(c->stream, a, b, src, n_rows, n_heads, head_dim));
}

static void cuda_gate_sigmoid(kiln_backend *be, float *x, const float *gate, int64_t n) {
    cuda_backend *c = cu_be(be);
    cu_enter(c);
    cu_check(c, "gate_sigmoid", kiln_cu_gate_sigmoid(c->stream, x, gate, n));
}

static void cuda_zero(kiln_backend *be, float *x, int64_t n) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    cu_enter(c);
    cu_check(c, "zero", cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), c->stream));
}

static void cuda_copy(kiln_backend *be, float *dst, const float *src, int64_t n) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    cu_enter(c);
    cu_check(c, "copy",
             cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                             c->stream));
}

static void cuda_gather_rows(kiln_backend *be, float *dst, const float *src,
                             const int32_t *rows_host, int32_t n, int64_t d) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    cu_enter(c);
    if (!staged_reserve(c, &c->rows, (size_t)n)) cu_die(c, "gather_rows (row list)", cudaErrorMemoryAllocation);
    memcpy(c->rows.host, rows_host, (size_t)n * sizeof(int32_t));
    staged_upload(c, &c->rows, (size_t)n, "gather_rows (row list)");
    cu_check(c, "gather_rows", kiln_cu_gather_rows(c->stream, dst, src, c->rows.dev, n, d));
}

/* ---- KV and attention ------------------------------------------------------------------ */

/* Layer `layer`'s storage as the kernels address it. Every block of a pool has the pool's
 * format today (kv_pool.h); mixed formats within a sequence arrive with delayed KV
 * quantization and add their reads here, as in backend/cpu/cpu_attention.c. */
static cu_kv layer_kv(const cuda_backend *c, kiln_kv_pool *pool, int32_t layer) {
    const kiln_dtype t = kiln_kv_pool_dtype(pool);
    const int64_t bb = kiln_kv_block_bytes(kiln_kv_pool_n_layer(pool), kiln_kv_pool_kv_dim(pool),
                                           kiln_kv_pool_block_size(pool), t);
    const cu_kv kv = {(char *)kiln_kv_pool_k(pool, layer, 0), (char *)kiln_kv_pool_v(pool, layer, 0),
                      bb / (2 * kiln_kv_pool_n_layer(pool)), kiln_kv_pool_block_size(pool),
                      kiln_kv_pool_kv_dim(pool), elem_of(c, t, "the KV pool")};
    return kv;
}

static void cuda_kv_write(kiln_backend *be, kiln_kv_pool *pool, int32_t layer, const kiln_step *st,
                          const float *k, const float *v) {
    cuda_backend *c = cu_be(be);
    (void)st;
    cu_enter(c);
    const cu_kv kv = layer_kv(c, pool, layer);
    cu_check(c, "kv_write", kiln_cu_kv_write(c->stream, &kv, &c->cst, k, v));
}

static void cuda_attention(kiln_backend *be, kiln_kv_pool *pool, const kiln_attn_params *p,
                           const kiln_step *st, const float *q, float *out) {
    cuda_backend *c = cu_be(be);
    (void)st;
    cu_enter(c);
    const cu_kv kv = layer_kv(c, pool, p->layer);
    cu_check(c, "attention",
             kiln_cu_attention(c->stream, &kv, &c->cst, p->n_head, p->n_head_kv, p->head_dim,
                               p->score_div, p->softcap, p->window, q, out));
}

const kiln_backend_ops kiln_cuda_backend_ops = {
    .name = "cuda",
    .kind = KILN_BACKEND_CUDA,
    .host_memory = false,
    .place_weights = NULL,
    .place_device = kiln_cuda_place_device,
    .release_weights = kiln_cuda_release_weights,
    .destroy = cuda_destroy,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .arena_reserve = cuda_arena_reserve,
    .arena = cuda_arena,
    .sync = cuda_sync,
    .numerics = cuda_numerics,
    .step_begin = cuda_step_begin,
    .embed = cuda_embed,
    .matmul = cuda_matmul,
    .norm = cuda_norm,
    .head_rmsnorm = cuda_head_rmsnorm,
    .rope = cuda_rope,
    .add_bias = cuda_add_bias,
    .add = cuda_add,
    .act = cuda_act,
    .glu = cuda_glu,
    .softcap = cuda_softcap,
    .split_heads = cuda_split_heads,
    .gate_sigmoid = cuda_gate_sigmoid,
    .zero = cuda_zero,
    .copy = cuda_copy,
    .gather_rows = cuda_gather_rows,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    /* not yet (issue 16): the runner refuses models that need these */
    .moe_route = NULL,
    .moe_gather = NULL,
    .moe_scatter = NULL,
    .moe_shared = NULL,
    .gdn_conv = NULL,
    .gdn_rule = NULL,
};

kiln_status kiln_cuda_backend_create(int32_t device, kiln_backend **out, kiln_error *err) {
    *out = NULL;
    int n = 0;
    const cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cuda backend: no CUDA device is usable (%s)", cudaGetErrorString(ce));
    }
    if (device < 0 || device >= n)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cuda backend: no device %d (%d CUDA device(s) present)", device, n);
    cuda_backend *c = calloc(1, sizeof *c);
    if (!c) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
    c->base.ops = &kiln_cuda_backend_ops;
    c->base.device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->cc_minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->meta.done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->rows.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cuda_destroy(&c->base);
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "cuda backend: setting up device %d failed: %s", device,
                              cudaGetErrorString(e));
    }
    *out = &c->base;
    return KILN_OK;
}
