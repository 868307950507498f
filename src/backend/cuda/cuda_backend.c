/*
 * cuda_backend.c - the CUDA backend's context (stream, arena, step metadata, decode graphs,
 * the op timer) and its table: each operation of backend/backend.h checks what the kernels
 * cannot and enqueues one launcher of cuda_kernels.h on the context's stream.
 *
 * Host-to-device traffic per step: step_begin copies the step's per-token metadata (token ids,
 * sequences, positions, the out rows) and the sequences' block tables into one pinned buffer
 * and uploads it with one async copy. A pinned buffer is rewritten only after the event
 * recorded behind its last copy has completed.
 *
 * Decode graphs (CUDA graphs, one per graph key: backend.h kiln_step.graph_key, which the
 * runner gives decode steps, with the token count in it: the batch-size buckets are the exact
 * sizes): the first step with a key is captured while it runs (every launch between
 * step_begin and the first download or sync, on the context's stream), instantiated and
 * launched; later steps with the key upload their metadata to the same device addresses and
 * replay the graph, the operations' calls then enqueueing nothing. Anything that moves a
 * buffer a graph points at (the arena, the metadata buffer, the attention scratch growing)
 * drops every graph. KILN_CUDA_GRAPHS=0 turns them off.
 *
 * KILN_CUDA_PROFILE=1 times every operation with CUDA events and prints, when the context is
 * destroyed, the time per operation class (the interval from an operation's start to the next
 * one's, so the GPU's gaps count with the operation before them) and the host's time between
 * steps. In a graphed step the events are event record nodes of the graph, so replays time
 * the GPU's work without the host's launches in between; eager steps (prefill) are timed as
 * launched, which counts the host's launch time where the GPU waits for it. KILN_CUDA_KERNELS=v1 runs the first milestone's matmul and
 * attention kernels and no fused forms (for before/after timings; other bits).
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

/* one captured decode step */
typedef struct cu_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    /* KILN_CUDA_PROFILE: the timer's marks captured in it (event record nodes of its own
     * events, following mark0 eager ones) and their classes */
    int mark0, n_marks;
    int *cls;
    cudaEvent_t *ev;
} cu_graph;

#define CU_MAX_GRAPHS 64
enum { G_OFF = 0, G_CAPTURE = 1, G_REPLAY = 2 };

/* the op timer's classes and marks */
#define PROF_MAX_CLASSES 48
#define PROF_MAX_MARKS   8192
typedef struct prof_class {
    char name[48];
    double ms;
    int64_t calls;
} prof_class;

typedef struct cuda_backend {
    kiln_backend base; /* first: a kiln_backend * is a cuda_backend * */
    cudaStream_t stream;
    int cc_major, cc_minor;
    kiln_backend_reserve res;
    void *arena;
    size_t arena_cap;
    staged meta; /* the step's metadata */
    staged rows; /* gather_rows' row list (other lists than the step's out rows) */
    const kiln_step *st;
    cu_step cst;             /* device views of meta for this step */
    const int32_t *out_dev;  /* the step's out rows, in meta */
    const int32_t *out_host; /* ... and the host list they came from (until the step's sync) */
    int32_t n_out;
    /* attention's wide form (cuda_kernels.h cu_att_split) */
    float *att_part;
    size_t att_part_floats;
    int32_t *att_cnt;
    size_t att_cnt_ints;
    int32_t att_s_cap; /* splits of the longest reserved sequence */
    /* decode graphs */
    bool graphs_on;
    int gmode;
    uint64_t gkey;
    int gmark0; /* the op timer's marks when the capture began */
    cu_graph graphs[CU_MAX_GRAPHS];
    int n_graphs;
    int32_t *ids_dev; /* the argmax operation's ids */
    size_t ids_cap;
    /* the tensor-core matmul's rounded activations (kiln_cu_matmul_tc's xh): half the arena */
    void *xh;
    size_t xh_bytes;
    /* KILN_CUDA_KERNELS=v1 */
    bool legacy;
    float *tmp;
    size_t tmp_floats;
    /* KILN_CUDA_PROFILE=1 */
    bool prof;
    cudaEvent_t *prof_ev;   /* the eager marks' events (a pool, by mark index) */
    cudaEvent_t *prof_list; /* the step's marks: pool events, or a replayed graph's */
    int *prof_cls;
    int n_marks;
    cudaEvent_t prof_last; /* the end of the last timed step */
    bool prof_have_last;
    prof_class cls[PROF_MAX_CLASSES];
    int n_cls;
    int64_t prof_steps;
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

/* ---- the op timer (KILN_CUDA_PROFILE=1) ---------------------------------------------------- */

static int prof_class_of(cuda_backend *c, const char *name) {
    for (int i = 0; i < c->n_cls; i++)
        if (!strcmp(c->cls[i].name, name)) return i;
    if (c->n_cls == PROF_MAX_CLASSES) return PROF_MAX_CLASSES - 1;
    snprintf(c->cls[c->n_cls].name, sizeof c->cls[0].name, "%s", name);
    return c->n_cls++;
}

/* an event on the stream before the next operation, of class `name` */
static void prof_mark(cuda_backend *c, const char *name) {
    if (!c->prof || c->n_marks >= PROF_MAX_MARKS - 1) return;
    /* inside a capture: an event record node, so that replays time the GPU alone */
    cu_check(c, "profile event",
             cudaEventRecordWithFlags(c->prof_ev[c->n_marks], c->stream,
                                      c->gmode == G_CAPTURE ? cudaEventRecordExternal
                                                            : cudaEventRecordDefault));
    c->prof_list[c->n_marks] = c->prof_ev[c->n_marks];
    c->prof_cls[c->n_marks++] = prof_class_of(c, name);
}

/* an interval between two events, or a negative value when it cannot be read (the error
 * cleared: it must not surface at the next launch's check) */
static float prof_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1.0f;
    }
    return ms;
}

/* after the stream is idle: the marks' intervals into their classes; the gap from the last
 * step's end to this step's first mark is the host's */
static void prof_collect(cuda_backend *c) {
    if (!c->prof || c->n_marks == 0) return;
    cudaEvent_t end = c->prof_ev[c->n_marks];
    cu_check(c, "profile event", cudaEventRecord(end, c->stream));
    cu_check(c, "profile sync", cudaEventSynchronize(end));
    c->prof_list[c->n_marks] = end;
    float ms;
    if (c->prof_have_last && (ms = prof_ms(c->prof_last, c->prof_list[0])) >= 0.0f) {
        prof_class *h = &c->cls[prof_class_of(c, "host, between steps")];
        h->ms += ms;
        h->calls++;
    }
    for (int i = 0; i < c->n_marks; i++) {
        if ((ms = prof_ms(c->prof_list[i], c->prof_list[i + 1])) < 0.0f || ms > 60000.0f) continue;
        c->cls[c->prof_cls[i]].ms += ms;
        c->cls[c->prof_cls[i]].calls++;
    }
    /* keep the end: swap it with the spare */
    cudaEvent_t t = c->prof_last;
    c->prof_last = end;
    c->prof_ev[c->n_marks] = t;
    c->prof_have_last = true;
    c->n_marks = 0;
    c->prof_steps++;
}

static void prof_report(const cuda_backend *c) {
    if (!c->prof || c->n_cls == 0) return;
    double total = 0.0;
    for (int i = 0; i < c->n_cls; i++) total += c->cls[i].ms;
    fprintf(stderr, "kiln cuda profile (device %d): %lld steps, %.3f ms timed\n", c->base.device,
            (long long)c->prof_steps, total);
    fprintf(stderr, "  %-40s %10s %6s %9s %9s\n", "operation", "ms", "%", "calls", "us/call");
    for (int i = 0; i < c->n_cls; i++) {
        const prof_class *p = &c->cls[i];
        fprintf(stderr, "  %-40s %10.3f %6.2f %9lld %9.2f\n", p->name, p->ms,
                total > 0 ? 100.0 * p->ms / total : 0.0, (long long)p->calls,
                p->calls ? 1000.0 * p->ms / (double)p->calls : 0.0);
    }
}

/* ---- decode graphs ------------------------------------------------------------------------ */

static void graphs_drop(cuda_backend *c) {
    for (int i = 0; i < c->n_graphs; i++) {
        cudaGraphExecDestroy(c->graphs[i].exec);
        free(c->graphs[i].cls);
        if (c->graphs[i].ev) {
            for (int j = 0; j < c->graphs[i].n_marks; j++) cudaEventDestroy(c->graphs[i].ev[j]);
            free(c->graphs[i].ev);
        }
    }
    c->n_graphs = 0;
}

/* the step's operations end (a download, an upload or a sync follows): a capture is closed,
 * instantiated and launched (a replay was launched by step_begin already) */
static void graph_finish(cuda_backend *c) {
    if (c->gmode == G_OFF) return;
    const int mode = c->gmode;
    c->gmode = G_OFF;
    if (mode == G_REPLAY) return; /* launched by step_begin */
    cudaGraph_t g = NULL;
    cu_check(c, "cudaStreamEndCapture", cudaStreamEndCapture(c->stream, &g));
    cudaGraphExec_t exec = NULL;
    cu_check(c, "cudaGraphInstantiate", cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    cu_graph ng = {c->gkey, exec, 0, 0, NULL, NULL};
    if (c->prof && c->n_marks > c->gmark0) {
        /* the graph keeps the events its nodes record; the pool gets fresh ones */
        ng.mark0 = c->gmark0;
        ng.n_marks = c->n_marks - c->gmark0;
        ng.cls = malloc((size_t)ng.n_marks * sizeof(int));
        ng.ev = malloc((size_t)ng.n_marks * sizeof(cudaEvent_t));
        if (!ng.cls || !ng.ev) cu_die(c, "profile (out of memory)", cudaErrorMemoryAllocation);
        memcpy(ng.cls, c->prof_cls + ng.mark0, (size_t)ng.n_marks * sizeof(int));
        for (int j = 0; j < ng.n_marks; j++) {
            ng.ev[j] = c->prof_ev[ng.mark0 + j];
            cu_check(c, "profile event", cudaEventCreate(&c->prof_ev[ng.mark0 + j]));
        }
    }
    c->graphs[c->n_graphs++] = ng;
    cu_check(c, "cudaGraphLaunch", cudaGraphLaunch(exec, c->stream));
}

/* true when the operation's launch is already in the graph being replayed */
static bool replaying(const cuda_backend *c) {
    return c->gmode == G_REPLAY;
}

int32_t kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

kiln_status kiln_cuda_device_memory(int32_t device, int64_t *free_b, int64_t *total_b,
                                    kiln_error *err) {
    *free_b = *total_b = 0;
    const int32_t n = kiln_cuda_device_count();
    if (device < 0 || device >= n)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cuda backend: no device %d (%d CUDA device(s) present)", device, n);
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    size_t f = 0, t = 0;
    if (e == cudaSuccess) e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cuda backend: device %d: memory info: %s",
                              device, cudaGetErrorString(e));
    }
    (void)cudaSetDevice(prev);
    *free_b = (int64_t)f;
    *total_b = (int64_t)t;
    return KILN_OK;
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
    graphs_drop(c); /* they point at the old device buffer */
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
    prof_report(c);
    if (cudaSetDevice(c->base.device) == cudaSuccess) {
        if (c->gmode == G_CAPTURE) {
            cudaGraph_t g = NULL;
            cudaStreamEndCapture(c->stream, &g);
            if (g) cudaGraphDestroy(g);
        }
        if (c->stream) cudaStreamSynchronize(c->stream);
        graphs_drop(c);
        if (c->arena) cudaFree(c->arena);
        if (c->att_part) cudaFree(c->att_part);
        if (c->att_cnt) cudaFree(c->att_cnt);
        if (c->tmp) cudaFree(c->tmp);
        if (c->ids_dev) cudaFree(c->ids_dev);
        if (c->xh) cudaFree(c->xh);
        if (c->prof_ev) {
            for (int i = 0; i < PROF_MAX_MARKS; i++)
                if (c->prof_ev[i]) cudaEventDestroy(c->prof_ev[i]);
            free(c->prof_ev);
        }
        free(c->prof_cls);
        free(c->prof_list);
        if (c->prof_last) cudaEventDestroy(c->prof_last);
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
    graph_finish(c);
    cu_check(c, "upload",
             cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_download(kiln_backend *be, void *dst_host, const void *src, size_t bytes) {
    cuda_backend *c = cu_be(be);
    if (!bytes) return;
    cu_enter(c);
    graph_finish(c);
    prof_mark(c, "download");
    cu_check(c, "download",
             cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    cu_check(c, "download (synchronize)", cudaStreamSynchronize(c->stream));
    prof_collect(c);
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
        graphs_drop(c);
    }
    /* attention's wide form: partials for up to 64 tokens of the longest sequence, within
     * 256 MiB (the loop form, with the same bits, takes steps that do not fit) */
    if (want.n_head > 0) {
        const int32_t kmax = want.max_keys > 0 ? want.max_keys : 1;
        const size_t per_tok = kiln_cu_attention_part_floats(1, want.n_head, want.head_dim, kmax);
        int32_t w_tok = want.max_tokens < KILN_CU_ATTN_WIDE_MAX_TOKENS
                            ? want.max_tokens
                            : KILN_CU_ATTN_WIDE_MAX_TOKENS;
        while (w_tok > 1 && (size_t)w_tok * per_tok * sizeof(float) > ((size_t)256 << 20)) w_tok--;
        const size_t pf = (size_t)w_tok * per_tok, ci = kiln_cu_attention_cnt_ints(w_tok, want.n_head);
        if (pf > c->att_part_floats || ci > c->att_cnt_ints) {
            cu_enter(c);
            cudaError_t e = cudaStreamSynchronize(c->stream);
            float *part = NULL;
            int32_t *cnt = NULL;
            if (e == cudaSuccess) e = cudaMalloc((void **)&part, pf * sizeof(float));
            if (e == cudaSuccess) e = cudaMalloc((void **)&cnt, ci * sizeof(int32_t));
            if (e == cudaSuccess) e = cudaMemset(cnt, 0, ci * sizeof(int32_t));
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                if (part) cudaFree(part);
                if (cnt) cudaFree(cnt);
                return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                      "cuda backend: out of device memory for attention's %zu-byte "
                                      "split scratch (%d tokens, %d keys): %s",
                                      pf * sizeof(float), w_tok, kmax, cudaGetErrorString(e));
            }
            if (c->att_part) cudaFree(c->att_part);
            if (c->att_cnt) cudaFree(c->att_cnt);
            c->att_part = part;
            c->att_cnt = cnt;
            c->att_part_floats = pf;
            c->att_cnt_ints = ci;
            graphs_drop(c);
        }
        const int32_t s_cap = (kmax + KILN_CU_ATTN_SPLIT - 1) / KILN_CU_ATTN_SPLIT;
        if (s_cap != c->att_s_cap) graphs_drop(c);
        c->att_s_cap = s_cap;
    }
    /* the tensor-core matmul's scratch: any matmul input in the arena, rounded to 2 bytes */
    const size_t xh_want = (bytes / 2 + 255) & ~(size_t)255;
    if (xh_want > c->xh_bytes) {
        cu_enter(c);
        void *p = NULL;
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e == cudaSuccess) e = cudaMalloc(&p, xh_want);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cuda backend: out of device memory for the matmul's %zu-byte "
                                  "activation scratch (half the activation arena): %s",
                                  xh_want, cudaGetErrorString(e));
        }
        if (c->xh) cudaFree(c->xh);
        c->xh = p;
        c->xh_bytes = xh_want;
        graphs_drop(c);
    }
    if ((size_t)want.max_tokens > c->ids_cap) {
        cu_enter(c);
        int32_t *p = NULL;
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e == cudaSuccess) e = cudaMalloc((void **)&p, (size_t)want.max_tokens * sizeof(int32_t));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cuda backend: out of device memory for %d argmax ids: %s",
                                  want.max_tokens, cudaGetErrorString(e));
        }
        if (c->ids_dev) cudaFree(c->ids_dev);
        c->ids_dev = p;
        c->ids_cap = (size_t)want.max_tokens;
        graphs_drop(c);
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
    graph_finish(c);
    cu_check(c, "synchronize", cudaStreamSynchronize(c->stream));
    prof_collect(c);
    c->st = NULL; /* the step is over: its host metadata may be gone */
    c->out_host = NULL;
}

/* The kernels and their orders (cuda_kernels.h) decide the bits; the device only picks the
 * machine code the same PTX becomes. */
static void cuda_numerics(const kiln_backend *be, char *buf, size_t n) {
    const cuda_backend *c = (const cuda_backend *)be;
    if (c->legacy)
        snprintf(buf, n, "cuda sm_%d%d mm=warp-v1 attn=2pass-v1", c->cc_major, c->cc_minor);
    else
        snprintf(buf, n, "cuda sm_%d%d mm=warp8-v2%s attn=split%d-v2", c->cc_major, c->cc_minor,
                 kiln_cu_matmul_tc_ok(CU_BF16, NULL, 8, NULL) ? "+mma16816-v3" : "",
                 KILN_CU_ATTN_SPLIT);
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
    graph_finish(c); /* a step left open (no download or sync after it) */
    const size_t n = (size_t)st->n_tokens, n_out = b->n_out > 0 ? (size_t)b->n_out : 0;
    size_t n_tab = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) n_tab += (size_t)b->seqs[s].n_blocks;
    /* token[n], tok_seq[n], tok_pos[n], out[n_out], seq_table[n_seqs], tables[...] */
    const size_t need = 3 * n + n_out + (size_t)b->n_seqs + n_tab;
    if (!staged_reserve(c, &c->meta, need))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "cuda backend: out of memory for the step's metadata (%zu int32)",
                              need);
    int32_t *h = c->meta.host;
    memcpy(h, b->token, n * sizeof *h);
    memcpy(h + n, st->tok_seq, n * sizeof *h);
    memcpy(h + 2 * n, st->tok_pos, n * sizeof *h);
    if (n_out) memcpy(h + 3 * n, b->out, n_out * sizeof *h);
    int32_t *seq_table = h + 3 * n + n_out, *tables = seq_table + b->n_seqs;
    size_t off = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        seq_table[s] = (int32_t)off;
        memcpy(tables + off, b->seqs[s].block_table, (size_t)b->seqs[s].n_blocks * sizeof *h);
        off += (size_t)b->seqs[s].n_blocks;
    }
    prof_mark(c, "step metadata upload");
    staged_upload(c, &c->meta, need, "uploading the step's metadata");
    const int32_t *d = c->meta.dev;
    c->cst = (cu_step){st->n_tokens, d, d + n, d + 2 * n, d + 3 * n + n_out,
                       d + 3 * n + n_out + b->n_seqs};
    c->out_dev = d + 3 * n;
    c->out_host = b->out;
    c->n_out = b->n_out;
    c->st = st;
    /* a decode step: replay its graph, or capture it */
    if (c->graphs_on && st->graph_key != 0) {
        c->gkey = st->graph_key;
        for (int i = 0; i < c->n_graphs; i++)
            if (c->graphs[i].key == c->gkey) {
                /* launched at once, behind the metadata it reads: the operations' calls that
                 * follow enqueue nothing */
                const cu_graph *g = &c->graphs[i];
                c->gmode = G_REPLAY;
                cu_check(c, "cudaGraphLaunch", cudaGraphLaunch(g->exec, c->stream));
                if (c->prof && g->ev && c->n_marks == g->mark0) { /* its event nodes */
                    memcpy(c->prof_cls + c->n_marks, g->cls, (size_t)g->n_marks * sizeof(int));
                    memcpy(c->prof_list + c->n_marks, g->ev,
                           (size_t)g->n_marks * sizeof(cudaEvent_t));
                    c->n_marks += g->n_marks;
                }
                return KILN_OK;
            }
        if (c->n_graphs < CU_MAX_GRAPHS) {
            cu_check(c, "cudaStreamBeginCapture",
                     cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed));
            c->gmode = G_CAPTURE;
            c->gmark0 = c->n_marks;
        }
    }
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

/* the element type of a weight the matmuls and the token embedding read: elem_of's, plus
 * Q8_0 and Q4_0 (never KV pages) */
static cu_elem weight_elem(const cuda_backend *c, kiln_dtype t, const char *what) {
    if (t == KILN_DTYPE_Q8_0) return CU_Q8_0;
    if (t == KILN_DTYPE_Q4_0) return CU_Q4_0;
    return elem_of(c, t, what);
}

/* every operation starts so: the device current, nothing to enqueue while a graph replays,
 * the op timer's mark */
#define OP_BEGIN(c, name)                                                                          \
    do {                                                                                           \
        if (replaying(c)) return;                                                                  \
        cu_enter(c);                                                                               \
        prof_mark(c, name);                                                                        \
    } while (0)

static void cuda_embed(kiln_backend *be, float *x, float *scratch, const kiln_mat *tok_embd,
                       const kiln_mat *pos_embd, float scale, const kiln_step *st) {
    cuda_backend *c = cu_be(be);
    (void)scratch;
    (void)st;
    OP_BEGIN(c, "embed");
    const cu_elem te = weight_elem(c, tok_embd->dtype, "the token embedding");
    const cu_elem pe = pos_embd ? elem_of(c, pos_embd->dtype, "the position embedding") : CU_F32;
    cu_check(c, "embed",
             kiln_cu_embed(c->stream, x, tok_embd->data, te, pos_embd ? pos_embd->data : NULL, pe,
                           tok_embd->n_in, scale, &c->cst));
}

static const kiln_mat *rows_mat(const cuda_backend *c, const kiln_mat *w) {
    if (w->layout != KILN_MAT_ROWS) {
        fprintf(stderr, "kiln: cuda backend (device %d): matrix '%s' is in a CPU layout (%d)\n",
                c->base.device, w->name ? w->name : "?", (int)w->layout);
        abort();
    }
    return w;
}

/* the op timer's class of a matmul: its shape and row count */
static void mm_class(char *buf, size_t n, const char *kind, int64_t n_out, int64_t n_in,
                     int n_w, int32_t n_tok) {
    if (n_tok <= 16)
        snprintf(buf, n, "%s %lldx%lld%s (%d rows)", kind, (long long)n_out, (long long)n_in,
                 n_w > 1 ? " fused" : "", n_tok);
    else
        snprintf(buf, n, "%s %lldx%lld%s (>16 rows)", kind, (long long)n_out, (long long)n_in,
                 n_w > 1 ? " fused" : "");
}

/* a scratch of n floats for the legacy forms (KILN_CUDA_KERNELS=v1: no graphs) */
static float *legacy_tmp(cuda_backend *c, size_t n) {
    if (n > c->tmp_floats) {
        cu_check(c, "legacy scratch (synchronize)", cudaStreamSynchronize(c->stream));
        if (c->tmp) cudaFree(c->tmp);
        c->tmp = NULL;
        cu_check(c, "legacy scratch", cudaMalloc((void **)&c->tmp, n * sizeof(float)));
        c->tmp_floats = n;
    }
    return c->tmp;
}

static void cuda_matmul(kiln_backend *be, const kiln_mm *outs, int n_outs, const float *x,
                        int32_t n_tok) {
    cuda_backend *c = cu_be(be);
    if (replaying(c)) return;
    char cls[96] = "matmul";
    if (c->prof) {
        int64_t tot = 0;
        for (int i = 0; i < n_outs; i++) tot += outs[i].w->n_out;
        mm_class(cls, sizeof cls, "matmul", tot, outs[0].w->n_in, n_outs, n_tok);
    }
    OP_BEGIN(c, cls);
    enum { GROUP = 8 };
    for (int i0 = 0; i0 < n_outs; i0 += GROUP) {
        cu_mm_out o[GROUP];
        const int n = n_outs - i0 < GROUP ? n_outs - i0 : GROUP;
        for (int i = 0; i < n; i++) {
            const kiln_mat *w = rows_mat(c, outs[i0 + i].w);
            o[i] = (cu_mm_out){outs[i0 + i].y, w->data, weight_elem(c, w->dtype, "a matrix"),
                               w->n_out};
        }
        cu_check(c, "matmul",
                 c->legacy ? kiln_cu_matmul_v1(c->stream, o, n, outs[i0].w->n_in, x, n_tok)
                           : kiln_cu_matmul_multi(c->stream, o, n, outs[i0].w->n_in, x, n_tok,
                                                  c->xh, c->xh_bytes));
    }
}

static void cuda_matmul_add(kiln_backend *be, const kiln_mat *w, const float *x, int32_t n_tok,
                            float *y) {
    cuda_backend *c = cu_be(be);
    if (replaying(c)) return;
    char cls[96] = "matmul+add";
    if (c->prof) mm_class(cls, sizeof cls, "matmul+add", w->n_out, w->n_in, 1, n_tok);
    OP_BEGIN(c, cls);
    rows_mat(c, w);
    cu_mm_out o = {y, w->data, weight_elem(c, w->dtype, "a matrix"), w->n_out};
    if (c->legacy) { /* the first milestone's sequence: matmul, then add */
        o.y = legacy_tmp(c, (size_t)n_tok * (size_t)w->n_out);
        cu_check(c, "matmul", kiln_cu_matmul_v1(c->stream, &o, 1, w->n_in, x, n_tok));
        prof_mark(c, "add");
        cu_check(c, "add", kiln_cu_add(c->stream, y, o.y, (int64_t)n_tok * w->n_out));
        return;
    }
    cu_check(c, "matmul_add", kiln_cu_matmul_add(c->stream, &o, w->n_in, x, n_tok, c->xh,
                                                     c->xh_bytes));
}

static void cuda_matmul_glu(kiln_backend *be, const kiln_mat *wg, const kiln_mat *wu,
                            const float *x, int32_t n_tok, int act, float *g) {
    cuda_backend *c = cu_be(be);
    if (replaying(c)) return;
    char cls[96] = "matmul+glu";
    if (c->prof) mm_class(cls, sizeof cls, "matmul+glu", 2 * wg->n_out, wg->n_in, 2, n_tok);
    OP_BEGIN(c, cls);
    rows_mat(c, wg);
    rows_mat(c, wu);
    const cu_elem e = weight_elem(c, wg->dtype, "a matrix");
    if (c->legacy) { /* matmul of both (one launch), then glu */
        float *u = legacy_tmp(c, (size_t)n_tok * (size_t)wu->n_out);
        const cu_mm_out o[2] = {{g, wg->data, e, wg->n_out}, {u, wu->data, e, wu->n_out}};
        cu_check(c, "matmul", kiln_cu_matmul_v1(c->stream, o, 2, wg->n_in, x, n_tok));
        prof_mark(c, "glu");
        cu_check(c, "glu", kiln_cu_glu(c->stream, g, u, (int64_t)n_tok * wg->n_out, act));
        return;
    }
    cu_check(c, "matmul_glu", kiln_cu_matmul_glu(c->stream, g, wg->data, wu->data, e, wg->n_out,
                                                 wg->n_in, x, n_tok, act, c->xh, c->xh_bytes));
}

static void cuda_norm(kiln_backend *be, float *out, const float *x, const float *w, const float *b,
                      int32_t n_rows, int64_t d, int kind, float eps) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "norm");
    cu_check(c, "norm",
             kiln_cu_norm(c->stream, out, x, w, b, n_rows, d, kind == KILN_BE_NORM_LAYER, eps));
}

static void cuda_head_rmsnorm(kiln_backend *be, float *x, int32_t n_rows, int64_t stride,
                              int32_t n_heads, int32_t head_dim, const float *w, float eps) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "head_rmsnorm");
    cu_check(c, "head_rmsnorm",
             kiln_cu_head_rmsnorm(c->stream, x, n_rows, stride, n_heads, head_dim, w, eps));
}

static void cuda_rope(kiln_backend *be, float *x, int64_t stride, int32_t n_heads,
                      int32_t head_dim, int32_t rot_dim, const float *inv_freq, int adjacent,
                      const kiln_step *st) {
    cuda_backend *c = cu_be(be);
    (void)st;
    OP_BEGIN(c, "rope");
    cu_check(c, "rope",
             kiln_cu_rope(c->stream, x, stride, n_heads, head_dim, rot_dim, inv_freq, adjacent,
                          &c->cst));
}

static void cuda_add_bias(kiln_backend *be, float *y, const float *bias, int32_t n_rows,
                          int64_t dim) {
    cuda_backend *c = cu_be(be);
    if (!bias) return;
    OP_BEGIN(c, "add_bias");
    cu_check(c, "add_bias", kiln_cu_add_bias(c->stream, y, bias, n_rows, dim));
}

static void cuda_add(kiln_backend *be, float *y, const float *x, int64_t n) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "add");
    cu_check(c, "add", kiln_cu_add(c->stream, y, x, n));
}

static void cuda_act(kiln_backend *be, float *x, int64_t n, int act) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "act");
    cu_check(c, "act", kiln_cu_act(c->stream, x, n, act));
}

static void cuda_glu(kiln_backend *be, float *g, const float *u, int64_t n, int act) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "glu");
    cu_check(c, "glu", kiln_cu_glu(c->stream, g, u, n, act));
}

static void cuda_softcap(kiln_backend *be, float *x, int64_t n, float cap) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "softcap");
    cu_check(c, "softcap", kiln_cu_softcap(c->stream, x, n, cap));
}

static void cuda_split_heads(kiln_backend *be, float *a, float *b, const float *src,
                             int32_t n_rows, int32_t n_heads, int32_t head_dim) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "split_heads");
    cu_check(c, "split_heads", kiln_cu_split_heads(c->stream, a, b, src, n_rows, n_heads, head_dim));
}

static void cuda_gate_sigmoid(kiln_backend *be, float *x, const float *gate, int64_t n) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "gate_sigmoid");
    cu_check(c, "gate_sigmoid", kiln_cu_gate_sigmoid(c->stream, x, gate, n));
}

static void cuda_zero(kiln_backend *be, float *x, int64_t n) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    OP_BEGIN(c, "zero");
    cu_check(c, "zero", cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), c->stream));
}

static void cuda_copy(kiln_backend *be, float *dst, const float *src, int64_t n) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    OP_BEGIN(c, "copy");
    cu_check(c, "copy",
             cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                             c->stream));
}

static void cuda_gather_rows(kiln_backend *be, float *dst, const float *src,
                             const int32_t *rows_host, int32_t n, int64_t d) {
    cuda_backend *c = cu_be(be);
    if (n < 1) return;
    /* the step's out rows (the logits rows) are in the step's metadata already */
    const bool step_rows = c->out_host && rows_host == c->out_host && n == c->n_out;
    if (!step_rows && c->gmode != G_OFF)
        cu_die(c, "gather_rows of another row list inside a graphed step", cudaErrorInvalidValue);
    OP_BEGIN(c, "gather_rows");
    const int32_t *rows_dev = c->out_dev;
    if (!step_rows) {
        if (!staged_reserve(c, &c->rows, (size_t)n))
            cu_die(c, "gather_rows (row list)", cudaErrorMemoryAllocation);
        memcpy(c->rows.host, rows_host, (size_t)n * sizeof(int32_t));
        staged_upload(c, &c->rows, (size_t)n, "gather_rows (row list)");
        rows_dev = c->rows.dev;
    }
    cu_check(c, "gather_rows", kiln_cu_gather_rows(c->stream, dst, src, rows_dev, n, d));
}

/* greedy decoding: the argmax kernel into ids_dev (inside the step's graph), then a copy of
 * the n_rows ids only */
static void cuda_argmax(kiln_backend *be, int32_t *ids_host, const float *logits, int32_t n_rows,
                        int64_t n_vocab) {
    cuda_backend *c = cu_be(be);
    if (n_rows < 1) return;
    if (!replaying(c)) {
        cu_enter(c);
        if ((size_t)n_rows > c->ids_cap) {
            if (c->gmode != G_OFF)
                cu_die(c, "argmax's buffer growing inside a graphed step", cudaErrorInvalidValue);
            cu_check(c, "argmax buffer (synchronize)", cudaStreamSynchronize(c->stream));
            if (c->ids_dev) cudaFree(c->ids_dev);
            c->ids_dev = NULL;
            size_t cap = c->ids_cap ? c->ids_cap : 64;
            while (cap < (size_t)n_rows) cap *= 2;
            cu_check(c, "argmax buffer", cudaMalloc((void **)&c->ids_dev, cap * sizeof(int32_t)));
            c->ids_cap = cap;
            graphs_drop(c);
        }
        prof_mark(c, "argmax");
        cu_check(c, "argmax", kiln_cu_argmax(c->stream, c->ids_dev, logits, n_rows, n_vocab));
    }
    cuda_download(be, ids_host, c->ids_dev, (size_t)n_rows * sizeof(int32_t));
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
    OP_BEGIN(c, "kv_write");
    const cu_kv kv = layer_kv(c, pool, layer);
    cu_check(c, "kv_write", kiln_cu_kv_write(c->stream, &kv, &c->cst, k, v));
}

static void cuda_rope_kv_write(kiln_backend *be, kiln_kv_pool *pool, int32_t layer,
                               const kiln_step *st, float *q, int64_t q_stride, int32_t n_head,
                               float *k, const float *v, int32_t n_head_kv, int32_t head_dim,
                               int32_t rot_dim, const float *inv_freq, int adjacent) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "rope+kv_write");
    const cu_kv kv = layer_kv(c, pool, layer);
    if (c->legacy) {
        cu_check(c, "rope", kiln_cu_rope(c->stream, q, q_stride, n_head, head_dim, rot_dim,
                                         inv_freq, adjacent, &c->cst));
        cu_check(c, "rope", kiln_cu_rope(c->stream, k, kv.kv_dim, n_head_kv, head_dim, rot_dim,
                                         inv_freq, adjacent, &c->cst));
        cu_check(c, "kv_write", kiln_cu_kv_write(c->stream, &kv, &c->cst, k, v));
        (void)st;
        return;
    }
    cu_check(c, "rope_kv_write",
             kiln_cu_rope_kv(c->stream, &kv, &c->cst, q, q_stride, n_head, k, v, n_head_kv,
                             head_dim, rot_dim, inv_freq, adjacent));
}

static void cuda_attention(kiln_backend *be, kiln_kv_pool *pool, const kiln_attn_params *p,
                           const kiln_step *st, const float *q, float *out) {
    cuda_backend *c = cu_be(be);
    OP_BEGIN(c, "attention");
    const cu_kv kv = layer_kv(c, pool, p->layer);
    if (c->legacy) {
        cu_check(c, "attention",
                 kiln_cu_attention_v1(c->stream, &kv, &c->cst, p->n_head, p->n_head_kv,
                                      p->head_dim, p->score_div, p->softcap, p->window, q, out));
        return;
    }
    /* the wide form's grid: every split the step can need; a graph's: the reservation's, so
     * that replays of any length fit */
    const int32_t s_step = (st->max_keys + KILN_CU_ATTN_SPLIT - 1) / KILN_CU_ATTN_SPLIT;
    const cu_att_split sp = {c->att_part, c->att_part_floats, c->att_cnt, c->att_cnt_ints,
                             c->gmode == G_CAPTURE ? c->att_s_cap : s_step};
    cu_check(c, "attention",
             kiln_cu_attention(c->stream, &kv, &c->cst, p->n_head, p->n_head_kv, p->head_dim,
                               p->score_div, p->softcap, p->window, q, out, &sp));
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
    .matmul_add = cuda_matmul_add,
    .matmul_glu = cuda_matmul_glu,
    .rope_kv_write = cuda_rope_kv_write,
    .argmax = cuda_argmax,
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
    const char *kern = getenv("KILN_CUDA_KERNELS"), *gr = getenv("KILN_CUDA_GRAPHS"),
               *pr = getenv("KILN_CUDA_PROFILE");
    c->legacy = kern && !strcmp(kern, "v1");
    c->prof = pr && *pr && strcmp(pr, "0") != 0;
    c->graphs_on = !c->legacy && !(gr && !strcmp(gr, "0"));
    if (e == cudaSuccess && c->prof) {
        c->prof_ev = calloc(PROF_MAX_MARKS, sizeof *c->prof_ev);
        c->prof_list = calloc(PROF_MAX_MARKS, sizeof *c->prof_list);
        c->prof_cls = calloc(PROF_MAX_MARKS, sizeof *c->prof_cls);
        if (!c->prof_ev || !c->prof_list || !c->prof_cls) e = cudaErrorMemoryAllocation;
        for (int i = 0; i < PROF_MAX_MARKS && e == cudaSuccess; i++)
            e = cudaEventCreate(&c->prof_ev[i]);
        if (e == cudaSuccess) e = cudaEventCreate(&c->prof_last);
    }
    /* the step metadata's buffer, large enough that decode steps never move it */
    if (e == cudaSuccess && !staged_reserve(c, &c->meta, (size_t)1 << 16))
        e = cudaErrorMemoryAllocation;
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
