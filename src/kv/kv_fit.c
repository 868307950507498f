/* kv_fit.c - KV memory arithmetic (kv_fit.h). */
#include "kv/kv_fit.h"

#include <string.h>

#include "kv/kv_format.h"
#include "kv/kv_pool.h"

const char *kiln_kv_layer_kind_name(kiln_kv_layer_kind k) {
    switch (k) {
    case KILN_KV_LAYER_FULL:
        return "full";
    case KILN_KV_LAYER_SLIDING:
        return "sliding";
    case KILN_KV_LAYER_RECURRENT:
        return "recurrent";
    }
    return "?";
}

bool kiln_kv_fit_add(kiln_kv_fit_layout *l, kiln_kv_layer_kind kind, int32_t n_layers,
                     int64_t kv_dim, int32_t head_dim, int32_t window, int64_t state_bytes) {
    if (!l || n_layers < 1 || head_dim < 0 || (head_dim > 0 && kv_dim % head_dim)) return false;
    if (head_dim == 0 || kind == KILN_KV_LAYER_RECURRENT) head_dim = (int32_t)kv_dim;
    if (kind != KILN_KV_LAYER_RECURRENT && kv_dim < 1) return false;
    if (kind == KILN_KV_LAYER_SLIDING && window < 1) return false;
    if (kind == KILN_KV_LAYER_RECURRENT && state_bytes < 0) return false;
    for (int32_t i = 0; i < l->n_groups; i++) {
        kiln_kv_fit_group *g = &l->g[i];
        if (g->kind != kind) continue;
        if (kind == KILN_KV_LAYER_RECURRENT) {
            g->n_layers += n_layers;
            g->state_bytes += state_bytes;
            return true;
        }
        if (g->kv_dim == kv_dim && g->head_dim == head_dim &&
            (kind != KILN_KV_LAYER_SLIDING || g->window == window)) {
            g->n_layers += n_layers;
            return true;
        }
    }
    if (l->n_groups >= KILN_KV_FIT_MAX_GROUPS) return false;
    kiln_kv_fit_group *g = &l->g[l->n_groups++];
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->n_layers = n_layers;
    g->kv_dim = kind == KILN_KV_LAYER_RECURRENT ? 0 : kv_dim;
    g->head_dim = kind == KILN_KV_LAYER_RECURRENT ? 0 : head_dim;
    g->window = kind == KILN_KV_LAYER_SLIDING ? window : 0;
    g->state_bytes = kind == KILN_KV_LAYER_RECURRENT ? state_bytes : 0;
    return true;
}

static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0) return 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static size_t row_bytes(kiln_dtype t, const kiln_kv_fit_group *g) {
    kiln_kv_geom geom = {.kv_dim = g->kv_dim,
                         .n_head_kv = (int32_t)(g->kv_dim / g->head_dim),
                         .head_dim = g->head_dim};
    return kiln_kv_format_row_bytes_geom(t, &geom);
}

static int64_t pad64(int64_t x) {
    return (x + KILN_KV_ALIGNMENT - 1) / KILN_KV_ALIGNMENT * KILN_KV_ALIGNMENT;
}

int64_t kiln_kv_fit_group_bytes_per_token(const kiln_kv_fit_layout *l, int32_t gi) {
    if (!l || gi < 0 || gi >= l->n_groups) return 0;
    const kiln_kv_fit_group *g = &l->g[gi];
    if (g->kind == KILN_KV_LAYER_RECURRENT) return 0;
    size_t rk = row_bytes(l->k_format, g), rv = row_bytes(l->v_format, g);
    if (!rk || !rv) return 0;
    return sat_mul(g->n_layers, (int64_t)(rk + rv));
}

int64_t kiln_kv_fit_group_block_bytes(const kiln_kv_fit_layout *l, int32_t gi) {
    if (!l || gi < 0 || gi >= l->n_groups || l->block_size < 1) return 0;
    const kiln_kv_fit_group *g = &l->g[gi];
    if (g->kind == KILN_KV_LAYER_RECURRENT) return 0;
    size_t rk = row_bytes(l->k_format, g), rv = row_bytes(l->v_format, g);
    if (!rk || !rv) return 0;
    int64_t per_layer = sat_add(pad64(sat_mul(l->block_size, (int64_t)rk)),
                                pad64(sat_mul(l->block_size, (int64_t)rv)));
    return sat_mul(g->n_layers, per_layer);
}

static int64_t blocks_for(int64_t n, int32_t bs) {
    return n <= 0 ? 0 : (n - 1) / bs + 1;
}

static int64_t group_blocks(const kiln_kv_fit_layout *l, const kiln_kv_fit_group *g, int64_t n,
                            bool all_full) {
    int64_t b = blocks_for(n, l->block_size);
    if (g->kind == KILN_KV_LAYER_SLIDING && !all_full) {
        int64_t cap = blocks_for(g->window, l->block_size) + 1;
        if (b > cap) b = cap;
    }
    return b;
}

int64_t kiln_kv_fit_group_tokens(const kiln_kv_fit_layout *l, int32_t gi, int64_t n) {
    if (!l || gi < 0 || gi >= l->n_groups || l->block_size < 1) return 0;
    const kiln_kv_fit_group *g = &l->g[gi];
    if (g->kind == KILN_KV_LAYER_RECURRENT) return 0;
    return sat_mul(group_blocks(l, g, n, false), l->block_size);
}

static int64_t group_bytes(const kiln_kv_fit_layout *l, int32_t gi, int64_t n, bool all_full) {
    const kiln_kv_fit_group *g = &l->g[gi];
    if (g->kind == KILN_KV_LAYER_RECURRENT) return n > 0 ? g->state_bytes : 0;
    return sat_mul(group_blocks(l, g, n, all_full), kiln_kv_fit_group_block_bytes(l, gi));
}

int64_t kiln_kv_fit_group_bytes(const kiln_kv_fit_layout *l, int32_t gi, int64_t n) {
    if (!l || gi < 0 || gi >= l->n_groups || l->block_size < 1) return 0;
    return group_bytes(l, gi, n, false);
}

int64_t kiln_kv_fit_seq_bytes(const kiln_kv_fit_layout *l, int64_t n, bool all_full) {
    if (!l || l->block_size < 1) return 0;
    int64_t s = 0;
    for (int32_t i = 0; i < l->n_groups; i++) s = sat_add(s, group_bytes(l, i, n, all_full));
    return s;
}

int64_t kiln_kv_fit_max_ctx(const kiln_kv_fit_layout *l, int64_t bytes, int64_t n_max) {
    if (!l || bytes <= 0 || n_max < 1) return 0;
    if (kiln_kv_fit_seq_bytes(l, 1, false) > bytes) return 0;
    int64_t lo = 1, hi = n_max; /* seq_bytes is non-decreasing in n */
    if (kiln_kv_fit_seq_bytes(l, hi, false) <= bytes) return hi;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (kiln_kv_fit_seq_bytes(l, mid, false) <= bytes)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int64_t kiln_kv_fit_max_seqs(const kiln_kv_fit_layout *l, int64_t bytes, int64_t n) {
    if (!l || bytes <= 0 || n < 1) return 0;
    int64_t s = kiln_kv_fit_seq_bytes(l, n, false);
    return s > 0 ? bytes / s : 0;
}

int64_t kiln_kv_fit_pool_block_bytes(int32_t n_layer, int64_t kv_dim, int32_t head_dim,
                                     int32_t block_size, kiln_dtype k_format,
                                     kiln_dtype v_format) {
    return kiln_kv_block_bytes_geom(n_layer, kv_dim, head_dim, block_size, k_format, v_format);
}

double kiln_kv_fit_decode_tok_s(double bandwidth_bytes_per_s, double bytes_per_token) {
    if (!(bandwidth_bytes_per_s > 0) || !(bytes_per_token > 0)) return 0.0;
    return bandwidth_bytes_per_s / bytes_per_token;
}
