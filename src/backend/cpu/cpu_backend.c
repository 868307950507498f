/*
 * cpu_backend.c - the CPU backend's context (thread pool, arena, host buffers), its step
 * set-up and its row-wise operations; attention, experts and the delta net are in
 * cpu_attention.c, cpu_experts.c and cpu_delta_net.c.
 *
 * Every row-wise operation here is the loop the forward pass ran before the backend seam, in
 * the same order, on the caller's thread: this file is compiled without FMA flags, so
 * `a + b * c` is never contracted, and the bits are those of commit 2e00d3f.
 */
#include "backend/cpu/cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attn_turbo.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_context.h"
#include "backend/cpu/ops.h"
#include "util/error.h"

/* ---- context and memory --------------------------------------------------------------- */

static void cpu_destroy(kiln_backend *be) {
    cpu_backend *c = cpu_be(be);
    kiln_threadpool_destroy(c->tp);
    free(c->arena);
    free(c->ptr_off);
    free(c->kb);
    free(c->kfmt);
    free(c->seq_operand);
    free(c);
}

static kiln_status cpu_buf_alloc(kiln_backend *be, size_t bytes, void **out, kiln_error *err) {
    (void)be;
    *out = NULL;
    size_t n = (bytes + KILN_BACKEND_ALIGN - 1) & ~(size_t)(KILN_BACKEND_ALIGN - 1);
    if (n < bytes || (*out = aligned_alloc(KILN_BACKEND_ALIGN, n ? n : KILN_BACKEND_ALIGN)) == NULL)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "cpu backend: allocating %zu bytes failed", bytes);
    return KILN_OK;
}

static void cpu_buf_free(kiln_backend *be, void *buf) {
    (void)be;
    free(buf);
}

static void cpu_copy(kiln_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(kiln_backend *be) {
    (void)be; /* every operation has finished when it returns */
}

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

static kiln_status cpu_arena_reserve(kiln_backend *be, const kiln_backend_reserve *r,
                                     kiln_error *err) {
    cpu_backend *c = cpu_be(be);
    kiln_backend_reserve want = *r;
    /* grow only: keep the larger of each dimension */
    if (c->arena) {
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
    size_t attn = 0;
    if (want.n_head_kv > 0 && want.head_dim > 0) {
        const int32_t G = want.n_head / want.n_head_kv;
        const int32_t tile = kiln_cpu_attn_tile(want.n_head, want.n_head_kv);
        const int32_t mk = want.max_keys > 0 ? want.max_keys : 1;
        attn = round16(kiln_attention_group_scratch(tile, G, want.head_dim, mk));
        if (kiln_turbo_head_dim_valid(want.head_dim)) { /* TurboQuant pages (attn_turbo.h) */
            const size_t t = round16(kiln_attention_turbo_scratch(tile, G, want.head_dim, mk));
            if (t > attn) attn = t;
        }
    }
    const size_t act = (want.act_bytes + 63) & ~(size_t)63;
    const size_t gdn = (size_t)c->nth * 4 * (size_t)want.gdn_head_dim;
    const size_t bytes = act + ((size_t)c->nth * attn + round16(gdn)) * sizeof(float);
    if (bytes > c->arena_cap) {
        void *p = NULL;
        if (posix_memalign(&p, KILN_BACKEND_ALIGN, bytes ? bytes : KILN_BACKEND_ALIGN) != 0)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cpu backend: out of memory for the %zu-byte scratch arena "
                                  "(%d tokens, %d keys per step)",
                                  bytes, want.max_tokens, want.max_keys);
        free(c->arena);
        c->arena = p;
        c->arena_cap = bytes;
    }
    c->res = want;
    c->attn_scratch_floats = attn;
    c->attn_scratch = (float *)((char *)c->arena + act);
    c->gdn_scratch = c->attn_scratch + (size_t)c->nth * attn;
    return KILN_OK;
}

static void *cpu_arena(kiln_backend *be) {
    return cpu_be(be)->arena;
}

/* ---- the step -------------------------------------------------------------------------- */

static kiln_status cpu_step_begin(kiln_backend *be, const kiln_step *st, kiln_error *err) {
    cpu_backend *c = cpu_be(be);
    const kiln_batch *b = st->b;
    if (!c->arena || st->n_tokens > c->res.max_tokens || st->max_keys > c->res.max_keys)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cpu backend: a step of %d tokens and %d keys exceeds the "
                              "reservation (%d tokens, %d keys)",
                              st->n_tokens, st->max_keys, c->res.max_tokens, c->res.max_keys);
    int64_t n_ptrs = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) n_ptrs += b->seqs[s].n_blocks;
    if (b->n_seqs > c->seq_cap) {
        int64_t *po = realloc(c->ptr_off, (size_t)b->n_seqs * sizeof *po);
        if (po) c->ptr_off = po;
        int *so = po ? realloc(c->seq_operand, (size_t)b->n_seqs * sizeof *so) : NULL;
        if (so) c->seq_operand = so;
        if (!po || !so)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cpu backend: out of memory for %d "
                                  "sequences",
                                  b->n_seqs);
        c->seq_cap = b->n_seqs;
    }
    if (n_ptrs > c->ptr_cap) {
        const void **kb = realloc(c->kb, (size_t)(n_ptrs > 0 ? n_ptrs : 1) * 2 * sizeof *kb);
        if (kb) c->kb = kb;
        uint8_t *bf = kb ? realloc(c->kfmt, (size_t)(n_ptrs > 0 ? n_ptrs : 1) * 2) : NULL;
        if (bf) c->kfmt = bf;
        if (!kb || !bf)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "cpu backend: out of memory for %lld block pointers",
                                  (long long)n_ptrs);
        c->kb = kb;
        c->ptr_cap = n_ptrs;
    }
    c->vb = c->kb + c->ptr_cap;
    c->vfmt = c->kfmt + c->ptr_cap;
    int64_t off = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        c->ptr_off[s] = off;
        off += b->seqs[s].n_blocks;
    }
    c->n_ptrs = n_ptrs;
    c->st = st;
    kiln_cpu_attention_deal(c, st);
    return KILN_OK;
}

/* ---- row-wise operations ---------------------------------------------------------------- */

static void embed_row(const kiln_mat *e, int32_t token, float *out) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(e->dtype);
    size_t row = kiln_dtype_row_size(e->dtype, e->n_in);
    tr->to_float((const char *)e->data + (size_t)token * row, out, e->n_in);
}

static void cpu_embed(kiln_backend *be, float *x, float *scratch, const kiln_mat *tok_embd,
                      const kiln_mat *pos_embd, float scale, const kiln_step *st) {
    (void)be;
    const int64_t d = tok_embd->n_in;
    for (int32_t i = 0; i < st->n_tokens; i++) {
        float *xi = x + i * d;
        embed_row(tok_embd, st->b->token[i], xi);
        if (scale != 1.0f)
            for (int64_t j = 0; j < d; j++) xi[j] *= scale;
        if (pos_embd) {
            float *pe = scratch + i * d;
            embed_row(pos_embd, st->tok_pos[i], pe);
            for (int64_t j = 0; j < d; j++) xi[j] += pe[j];
        }
    }
}

static void cpu_matmul(kiln_backend *be, const kiln_mm *outs, int n_outs, const float *x,
                       int32_t n_tok) {
    kiln_cpu_mm_out o[KILN_CPU_MM_MAX_OUTS];
    for (int i0 = 0; i0 < n_outs; i0 += KILN_CPU_MM_MAX_OUTS) {
        const int n = n_outs - i0 < KILN_CPU_MM_MAX_OUTS ? n_outs - i0 : KILN_CPU_MM_MAX_OUTS;
        for (int i = 0; i < n; i++) {
            const kiln_mat *w = outs[i0 + i].w;
            o[i] = (kiln_cpu_mm_out){w->data, w->dtype, w->n_out, outs[i0 + i].y,
                                     (kiln_cpu_layout)w->layout};
        }
        kiln_cpu_matmul_multi(cpu_be(be)->tp, o, n, outs[i0].w->n_in, x, n_tok);
    }
}

static void cpu_norm(kiln_backend *be, float *out, const float *x, const float *w, const float *b,
                     int32_t n_rows, int64_t d, int kind, float eps) {
    (void)be;
    for (int32_t i = 0; i < n_rows; i++) {
        if (kind == KILN_BE_NORM_LAYER)
            kiln_layernorm(out + i * d, x + i * d, w, b, d, eps);
        else
            kiln_rmsnorm(out + i * d, x + i * d, w, d, eps);
    }
}

static void cpu_head_rmsnorm(kiln_backend *be, float *x, int32_t n_rows, int64_t stride,
                             int32_t n_heads, int32_t head_dim, const float *w, float eps) {
    (void)be;
    for (int32_t i = 0; i < n_rows; i++)
        for (int32_t h = 0; h < n_heads; h++) {
            float *xh = x + i * stride + (int64_t)h * head_dim;
            kiln_rmsnorm(xh, xh, w, head_dim, eps);
        }
}

static void cpu_rope(kiln_backend *be, float *x, int64_t stride, int32_t n_heads, int32_t head_dim,
                     int32_t rot_dim, const float *inv_freq, int adjacent, const kiln_step *st) {
    (void)be;
    for (int32_t i = 0; i < st->n_tokens; i++)
        kiln_rope(x + i * stride, n_heads, head_dim, rot_dim, st->tok_pos[i], inv_freq, adjacent);
}

static void cpu_add_bias(kiln_backend *be, float *y, const float *bias, int32_t n_rows,
                         int64_t dim) {
    (void)be;
    if (!bias) return;
    for (int32_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < dim; j++) y[i * dim + j] += bias[j];
}

static void cpu_add(kiln_backend *be, float *y, const float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_act(kiln_backend *be, float *x, int64_t n, int act) {
    (void)be;
    kiln_act_apply(x, n, act);
}

static void cpu_glu(kiln_backend *be, float *g, const float *u, int64_t n, int act) {
    (void)be;
    kiln_glu(g, u, n, act);
}

static void cpu_softcap(kiln_backend *be, float *x, int64_t n, float cap) {
    (void)be;
    kiln_softcap(x, n, cap);
}

static void cpu_split_heads(kiln_backend *be, float *a, float *b, const float *src, int32_t n_rows,
                            int32_t n_heads, int32_t head_dim) {
    (void)be;
    const int64_t hd = head_dim, dim = (int64_t)n_heads * hd;
    for (int32_t i = 0; i < n_rows; i++)
        for (int32_t h = 0; h < n_heads; h++) {
            const float *s = src + i * 2 * dim + (int64_t)h * 2 * hd;
            memcpy(a + i * dim + (int64_t)h * hd, s, (size_t)hd * sizeof(float));
            memcpy(b + i * dim + (int64_t)h * hd, s + hd, (size_t)hd * sizeof(float));
        }
}

static void cpu_gate_sigmoid(kiln_backend *be, float *x, const float *gate, int64_t n) {
    (void)be;
    for (int64_t e = 0; e < n; e++) x[e] = x[e] * kiln_cpu_sigmoid(gate[e]);
}

static void cpu_zero(kiln_backend *be, float *x, int64_t n) {
    (void)be;
    memset(x, 0, (size_t)n * sizeof(float));
}

static void cpu_copy_floats(kiln_backend *be, float *dst, const float *src, int64_t n) {
    (void)be;
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void cpu_gather_rows(kiln_backend *be, float *dst, const float *src, const int32_t *rows,
                            int32_t n, int64_t d) {
    (void)be;
    for (int32_t r = 0; r < n; r++)
        memcpy(dst + r * d, src + (int64_t)rows[r] * d, (size_t)d * sizeof(float));
}

/* The SIMD path, the VNNI choice and the activation mode pick the kernels' reduction order
 * and rounding; the thread count does not (backend.h: invariance over threads). */
static void cpu_numerics(const kiln_backend *be, char *buf, size_t n) {
    (void)be;
    snprintf(buf, n, "cpu simd=%s vnni=%d act=%d", kiln_simd_name(kiln_simd_active()),
             (int)kiln_cpu_use_vnni(), (int)kiln_cpu_act_default());
}

const kiln_backend_ops kiln_cpu_backend_ops = {
    .numerics = cpu_numerics,
    .name = "cpu",
    .kind = KILN_BACKEND_CPU,
    .host_memory = true,
    .place_weights = kiln_cpu_place_weights,
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .arena_reserve = cpu_arena_reserve,
    .arena = cpu_arena,
    .sync = cpu_sync,
    .step_begin = cpu_step_begin,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .norm = cpu_norm,
    .head_rmsnorm = cpu_head_rmsnorm,
    .rope = cpu_rope,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .act = cpu_act,
    .glu = cpu_glu,
    .softcap = cpu_softcap,
    .split_heads = cpu_split_heads,
    .gate_sigmoid = cpu_gate_sigmoid,
    .zero = cpu_zero,
    .copy = cpu_copy_floats,
    .gather_rows = cpu_gather_rows,
    .kv_write = kiln_cpu_kv_write,
    .attention = kiln_cpu_attention,
    .moe_route = kiln_cpu_moe_route,
    .moe_gather = kiln_cpu_moe_gather,
    .moe_scatter = kiln_cpu_moe_scatter,
    .moe_shared = kiln_cpu_moe_shared,
    .gdn_conv = kiln_cpu_gdn_conv,
    .gdn_rule = kiln_cpu_gdn_rule,
};

kiln_status kiln_cpu_backend_create(int n_threads, kiln_backend **out, kiln_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 512)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cpu backend: n_threads must be in [1, 512] (got %d)", n_threads);
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    c->base.ops = &kiln_cpu_backend_ops;
    c->nth = n_threads;
    if (n_threads > 1) {
        kiln_status st = kiln_threadpool_create(n_threads, &c->tp, err);
        if (st) {
            free(c);
            return st;
        }
    }
    *out = &c->base;
    return KILN_OK;
}

kiln_threadpool *kiln_cpu_backend_threadpool(kiln_backend *be) {
    return be ? cpu_be(be)->tp : NULL;
}
