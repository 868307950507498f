/*
 * matcher.c - the incremental pushdown recognizer over bytes (grammar.h, kiln_gmatch).
 *
 * A parse stack is a linked list of nodes, hash-consed: node (pos, parent) means "match the
 * elements from el[pos] on, then continue with node parent"; node 0 is the empty stack (the
 * sentence is complete). Expanding a node until its top is a byte set (closure) follows rule
 * references (one node per alternative; a reference that ends its alternative continues with
 * the parent directly, so right recursion such as x* does not grow the stack) and pops at the
 * end of an alternative. A state is the interned, sorted set of the nodes a closure reached;
 * advancing a state by a byte keeps the nodes whose set holds it, each advanced past its
 * element and expanded again. Transitions are cached per (state, byte): a state seen again
 * costs one table lookup per byte, which is what makes the token-mask trie walk cheap.
 *
 * This is the set-of-stacks recognizer of llama.cpp's grammar engine in spirit, determinised
 * lazily (the subset construction run on demand, as lazy DFAs in RE2 do).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

#define MAX_NODES  (1 << 22)
#define MAX_STATES (1 << 16)
#define MAX_MASKS  1024
#define UNKNOWN    (-2)

typedef struct gnode {
    int32_t pos, parent;
} gnode;

typedef struct gstate {
    int32_t first, n; /* members[first .. first + n) */
    int32_t *trans;   /* [256] or NULL until first asked */
    uint32_t *mask;   /* cached token mask or NULL */
    int16_t only;     /* -3 unknown, -2 none, -1 several, else the only byte */
    bool accept;
} gstate;

struct kiln_gmatch {
    kiln_grammar *g;
    gnode *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *nh; /* node hash: ids, -1 empty */
    uint32_t nh_cap;
    gstate *states;
    int32_t n_states, cap_states;
    int32_t *members;
    int64_t n_members, cap_members;
    int32_t *sh; /* state hash */
    uint32_t sh_cap;
    int32_t cur;
    bool overflow;
    int32_t n_masks;
    /* scratch of one closure */
    int32_t *out;
    int32_t n_out, cap_out;
    uint64_t *vis; /* visited (pos, parent) keys, open addressing, 0 = empty */
    uint32_t vis_cap, vis_n;
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static bool nh_grow(kiln_gmatch *m) {
    uint32_t nc = m->nh_cap ? 2 * m->nh_cap : 1024;
    int32_t *nt = malloc((size_t)nc * sizeof *nt);
    if (!nt) return false;
    memset(nt, 0xff, (size_t)nc * sizeof *nt);
    for (int32_t id = 1; id < m->n_nodes; id++) {
        uint64_t k = (uint64_t)(uint32_t)m->nodes[id].pos << 32 | (uint32_t)m->nodes[id].parent;
        uint32_t h = (uint32_t)mix(k) & (nc - 1);
        while (nt[h] >= 0) h = (h + 1) & (nc - 1);
        nt[h] = id;
    }
    free(m->nh);
    m->nh = nt;
    m->nh_cap = nc;
    return true;
}

/* the node (pos, parent), interned; -1 on overflow */
static int32_t node_of(kiln_gmatch *m, int32_t pos, int32_t parent) {
    if ((uint32_t)m->n_nodes * 2 >= m->nh_cap && !nh_grow(m)) return -1;
    uint64_t k = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t h = (uint32_t)mix(k) & (m->nh_cap - 1);
    for (;;) {
        int32_t id = m->nh[h];
        if (id < 0) break;
        if (m->nodes[id].pos == pos && m->nodes[id].parent == parent) return id;
        h = (h + 1) & (m->nh_cap - 1);
    }
    if (m->n_nodes >= MAX_NODES) return -1;
    if (m->n_nodes == m->cap_nodes) {
        int32_t nc = m->cap_nodes * 2;
        gnode *nn = realloc(m->nodes, (size_t)nc * sizeof *nn);
        if (!nn) return -1;
        m->nodes = nn;
        m->cap_nodes = nc;
    }
    int32_t id = m->n_nodes++;
    m->nodes[id].pos = pos;
    m->nodes[id].parent = parent;
    m->nh[h] = id;
    return id;
}

static bool vis_insert(kiln_gmatch *m, int32_t pos, int32_t parent) {
    if ((m->vis_n + 1) * 2 > m->vis_cap) {
        uint32_t nc = m->vis_cap ? 2 * m->vis_cap : 256;
        uint64_t *nv = calloc(nc, sizeof *nv);
        if (!nv) {
            m->overflow = true;
            return false;
        }
        for (uint32_t i = 0; i < m->vis_cap; i++)
            if (m->vis[i]) {
                uint32_t h = (uint32_t)mix(m->vis[i]) & (nc - 1);
                while (nv[h]) h = (h + 1) & (nc - 1);
                nv[h] = m->vis[i];
            }
        free(m->vis);
        m->vis = nv;
        m->vis_cap = nc;
    }
    uint64_t k = ((uint64_t)(uint32_t)(pos + 1) << 32 | (uint32_t)parent) + 1;
    uint32_t h = (uint32_t)mix(k) & (m->vis_cap - 1);
    while (m->vis[h]) {
        if (m->vis[h] == k) return false;
        h = (h + 1) & (m->vis_cap - 1);
    }
    m->vis[h] = k;
    m->vis_n++;
    return true;
}

static void vis_clear(kiln_gmatch *m) {
    if (m->vis_n) memset(m->vis, 0, (size_t)m->vis_cap * sizeof *m->vis);
    m->vis_n = 0;
}

static void out_push(kiln_gmatch *m, int32_t id) {
    if (m->n_out == m->cap_out) {
        int32_t nc = m->cap_out ? 2 * m->cap_out : 64;
        int32_t *no = realloc(m->out, (size_t)nc * sizeof *no);
        if (!no) {
            m->overflow = true;
            return;
        }
        m->out = no;
        m->cap_out = nc;
    }
    m->out[m->n_out++] = id;
}

/* closure of (pos, parent) into m->out */
static void expand(kiln_gmatch *m, int32_t pos, int32_t parent, int depth) {
    const kiln_grammar *g = m->g;
    for (;;) {
        if (m->overflow || depth > 100000) {
            m->overflow = true;
            return;
        }
        if (!vis_insert(m, pos, parent)) return;
        const kg_elem *e = &g->el[pos];
        if (e->type == KG_BYTES) {
            int32_t id = node_of(m, pos, parent);
            if (id < 0) {
                m->overflow = true;
                return;
            }
            out_push(m, id);
            return;
        }
        if (e->type == KG_END) {
            if (parent == 0) {
                out_push(m, 0);
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue; /* pop (a loop, not recursion) */
        }
        /* KG_REF */
        int32_t cont = parent;
        if (g->el[pos + 1].type != KG_END) {
            cont = node_of(m, pos + 1, parent);
            if (cont < 0) {
                m->overflow = true;
                return;
            }
        }
        int32_t r = e->arg, n = g->rule_n[r], f = g->rule_first[r];
        for (int32_t a = 0; a + 1 < n; a++) expand(m, g->alt_start[f + a], cont, depth + 1);
        if (n == 0) return;
        pos = g->alt_start[f + n - 1];
        parent = cont;
        depth++;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static bool sh_grow(kiln_gmatch *m);

static uint64_t set_hash(const int32_t *v, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = mix(h ^ (uint64_t)(uint32_t)v[i]);
    return h;
}

/* intern m->out (sorted, deduplicated here) as a state; KG_DEAD when empty */
static int32_t intern_out(kiln_gmatch *m) {
    if (m->overflow) return KG_DEAD;
    if (m->n_out == 0) return KG_DEAD;
    qsort(m->out, (size_t)m->n_out, sizeof *m->out, cmp_i32);
    int32_t k = 0;
    for (int32_t i = 0; i < m->n_out; i++)
        if (k == 0 || m->out[i] != m->out[k - 1]) m->out[k++] = m->out[i];
    m->n_out = k;
    if ((uint32_t)m->n_states * 2 >= m->sh_cap && !sh_grow(m)) {
        m->overflow = true;
        return KG_DEAD;
    }
    uint64_t hv = set_hash(m->out, k);
    uint32_t h = (uint32_t)hv & (m->sh_cap - 1);
    for (;;) {
        int32_t id = m->sh[h];
        if (id < 0) break;
        gstate *s = &m->states[id];
        if (s->n == k && memcmp(m->members + s->first, m->out, (size_t)k * sizeof *m->out) == 0)
            return id;
        h = (h + 1) & (m->sh_cap - 1);
    }
    if (m->n_states >= MAX_STATES) {
        m->overflow = true;
        return KG_DEAD;
    }
    if (m->n_states == m->cap_states) {
        int32_t nc = m->cap_states ? 2 * m->cap_states : 64;
        gstate *ns = realloc(m->states, (size_t)nc * sizeof *ns);
        if (!ns) {
            m->overflow = true;
            return KG_DEAD;
        }
        m->states = ns;
        m->cap_states = nc;
    }
    if (m->n_members + k > m->cap_members) {
        int64_t nc = m->cap_members ? 2 * m->cap_members : 1024;
        while (nc < m->n_members + k) nc *= 2;
        int32_t *nm = realloc(m->members, (size_t)nc * sizeof *nm);
        if (!nm) {
            m->overflow = true;
            return KG_DEAD;
        }
        m->members = nm;
        m->cap_members = nc;
    }
    int32_t id = m->n_states++;
    gstate *s = &m->states[id];
    s->first = (int32_t)m->n_members;
    s->n = k;
    s->trans = NULL;
    s->mask = NULL;
    s->only = -3;
    s->accept = m->out[0] == 0;
    memcpy(m->members + m->n_members, m->out, (size_t)k * sizeof *m->out);
    m->n_members += k;
    m->sh[h] = id;
    return id;
}

static bool sh_grow(kiln_gmatch *m) {
    uint32_t nc = m->sh_cap ? 2 * m->sh_cap : 256;
    int32_t *nt = malloc((size_t)nc * sizeof *nt);
    if (!nt) return false;
    memset(nt, 0xff, (size_t)nc * sizeof *nt);
    for (int32_t id = 0; id < m->n_states; id++) {
        gstate *s = &m->states[id];
        uint32_t h = (uint32_t)set_hash(m->members + s->first, s->n) & (nc - 1);
        while (nt[h] >= 0) h = (h + 1) & (nc - 1);
        nt[h] = id;
    }
    free(m->sh);
    m->sh = nt;
    m->sh_cap = nc;
    return true;
}

kiln_status kiln_gmatch_create(kiln_grammar *g, kiln_gmatch **out, kiln_error *err) {
    *out = NULL;
    kiln_gmatch *m = calloc(1, sizeof *m);
    if (!m) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar state)");
    m->g = g;
    atomic_fetch_add(&g->refs, 1);
    m->cap_nodes = 1024;
    m->nodes = malloc((size_t)m->cap_nodes * sizeof *m->nodes);
    m->n_nodes = 1; /* node 0: the empty stack */
    if (!m->nodes || !nh_grow(m) || !sh_grow(m)) {
        kiln_gmatch_destroy(m);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar state)");
    }
    m->nodes[0].pos = -1;
    m->nodes[0].parent = -1;
    m->n_out = 0;
    vis_clear(m);
    int32_t f = g->rule_first[g->root], n = g->rule_n[g->root];
    for (int32_t a = 0; a < n; a++) expand(m, g->alt_start[f + a], 0, 0);
    m->cur = intern_out(m);
    if (m->overflow) {
        kiln_gmatch_destroy(m);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar state)");
    }
    *out = m;
    return KILN_OK;
}

void kiln_gmatch_destroy(kiln_gmatch *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_states; i++) {
        free(m->states[i].trans);
        free(m->states[i].mask);
    }
    free(m->states);
    free(m->members);
    free(m->sh);
    free(m->nodes);
    free(m->nh);
    free(m->out);
    free(m->vis);
    kiln_grammar_destroy(m->g);
    free(m);
}

int32_t kiln_gmatch_state(const kiln_gmatch *m) { return m->cur; }
bool kiln_gmatch_overflowed(const kiln_gmatch *m) { return m->overflow; }
int32_t kiln_gmatch_n_states(const kiln_gmatch *m) { return m->n_states; }

bool kiln_gmatch_accepting(const kiln_gmatch *m, int32_t s) {
    return s >= 0 && s < m->n_states && m->states[s].accept;
}

static int32_t compute(kiln_gmatch *m, int32_t s, uint8_t b) {
    const kiln_grammar *g = m->g;
    m->n_out = 0;
    vis_clear(m);
    int32_t first = m->states[s].first, n = m->states[s].n;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = m->members[first + i];
        if (id == 0) continue;
        gnode nd = m->nodes[id];
        const uint64_t *w = g->sets[g->el[nd.pos].arg];
        if (w[b >> 6] >> (b & 63) & 1) expand(m, nd.pos + 1, nd.parent, 0);
        if (m->overflow) break;
    }
    int32_t r = intern_out(m);
    if (m->overflow) return KG_DEAD;
    m->states[s].trans[b] = r;
    return r;
}

int32_t kiln_gmatch_next(kiln_gmatch *m, int32_t s, uint8_t b) {
    if (s < 0 || s >= m->n_states) return KG_DEAD;
    gstate *st = &m->states[s];
    if (!st->trans) {
        st->trans = malloc(256 * sizeof *st->trans);
        if (!st->trans) {
            m->overflow = true;
            return KG_DEAD;
        }
        for (int i = 0; i < 256; i++) st->trans[i] = UNKNOWN;
    }
    int32_t v = st->trans[b];
    return v != UNKNOWN ? v : compute(m, s, b);
}

static void find_only(kiln_gmatch *m, int32_t s) {
    int32_t only = -2;
    for (int b = 0; b < 256; b++)
        if (kiln_gmatch_next(m, s, (uint8_t)b) != KG_DEAD) {
            if (only != -2) {
                only = -1;
                break;
            }
            only = b;
        }
    m->states[s].only = (int16_t)only;
}

bool kiln_gmatch_can_continue(kiln_gmatch *m, int32_t s) {
    if (s < 0 || s >= m->n_states) return false;
    if (m->states[s].only == -3) find_only(m, s);
    return m->states[s].only != -2;
}

int32_t kiln_gmatch_only_byte(kiln_gmatch *m, int32_t s) {
    if (s < 0 || s >= m->n_states) return -1;
    if (m->states[s].only == -3) find_only(m, s);
    return m->states[s].only >= 0 ? m->states[s].only : -1;
}

bool kiln_gmatch_advance(kiln_gmatch *m, const uint8_t *bytes, size_t n) {
    int32_t s = m->cur;
    for (size_t i = 0; i < n && s >= 0; i++) s = kiln_gmatch_next(m, s, bytes[i]);
    if (s < 0) return false;
    m->cur = s;
    return true;
}

uint32_t *kiln_gmatch_mask_cache(kiln_gmatch *m, int32_t s, int32_t words, bool create,
                                 bool *fresh) {
    *fresh = false;
    if (s < 0 || s >= m->n_states) return NULL;
    gstate *st = &m->states[s];
    if (st->mask || !create) return st->mask;
    if (m->n_masks >= MAX_MASKS) return NULL;
    st->mask = malloc((size_t)words * sizeof *st->mask);
    if (st->mask) {
        m->n_masks++;
        *fresh = true;
    }
    return st->mask;
}
