/*
 * vocab_trie.c - the vocabulary trie and token masks (grammar.h).
 *
 * The trie holds every token's byte string (kiln_model_token_piece), laid out in preorder:
 * node i has its byte, its depth and skip[i], the index just past its subtree. The mask walk
 * visits nodes in order, keeping the recognizer state of each depth; a byte the grammar
 * rejects skips the node's whole subtree, so the cost is the number of trie nodes whose prefix
 * the grammar still allows, each one cached transition (matcher.c). Tokens that share a
 * prefix share its work, as in llama.cpp's and XGrammar's vocabulary tries.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

struct kiln_vocab_trie {
    int32_t n_vocab;
    int32_t n_nodes;
    uint8_t *byte;    /* [n_nodes] */
    uint16_t *depth;  /* [n_nodes], >= 1 */
    int32_t *skip;    /* [n_nodes] */
    int32_t *tok_lo;  /* [n_nodes]: tokens ending here: order[tok_lo .. tok_hi) */
    int32_t *tok_hi;
    int32_t *order;   /* token ids sorted by bytes */
    int32_t max_depth;
    uint8_t *bytes;   /* all token bytes */
    int64_t *off;     /* [n_vocab + 1] */
};

typedef struct sort_ctx {
    const uint8_t *bytes;
    const int64_t *off;
} sort_ctx;
static sort_ctx g_sort; /* qsort has no context argument in C17; guarded by build order */

static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = g_sort.off[x + 1] - g_sort.off[x], ly = g_sort.off[y + 1] - g_sort.off[y];
    int64_t l = lx < ly ? lx : ly;
    int c = memcmp(g_sort.bytes + g_sort.off[x], g_sort.bytes + g_sort.off[y], (size_t)l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

#include <pthread.h>
static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

kiln_status kiln_vocab_trie_create(int32_t n_vocab,
                                   size_t (*piece)(void *user, int32_t id, char *buf, size_t cap),
                                   void *user, kiln_vocab_trie **out, kiln_error *err) {
    *out = NULL;
    kiln_vocab_trie *t = calloc(1, sizeof *t);
    if (!t || n_vocab < 1) {
        free(t);
        return kiln_error_set(err, n_vocab < 1 ? KILN_ERR_INVALID_ARGUMENT : KILN_ERR_OUT_OF_MEMORY,
                              "vocab trie: bad vocabulary");
    }
    t->n_vocab = n_vocab;
    t->off = malloc((size_t)(n_vocab + 1) * sizeof *t->off);
    size_t cap = 1 << 16, used = 0;
    t->bytes = malloc(cap);
    if (!t->off || !t->bytes) goto oom;
    char buf[1024];
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t n = piece(user, id, buf, sizeof buf);
        if (n > sizeof buf) n = 0; /* absurdly long token: never allowed */
        if (n > 65000) n = 0;
        if (used + n > cap) {
            while (used + n > cap) cap *= 2;
            uint8_t *nb = realloc(t->bytes, cap);
            if (!nb) goto oom;
            t->bytes = nb;
        }
        t->off[id] = (int64_t)used;
        memcpy(t->bytes + used, buf, n);
        used += n;
    }
    t->off[n_vocab] = (int64_t)used;
    int32_t n_tok = 0;
    t->order = malloc((size_t)n_vocab * sizeof *t->order);
    if (!t->order) goto oom;
    for (int32_t id = 0; id < n_vocab; id++)
        if (t->off[id + 1] > t->off[id]) t->order[n_tok++] = id;
    pthread_mutex_lock(&g_sort_mu);
    g_sort.bytes = t->bytes;
    g_sort.off = t->off;
    qsort(t->order, (size_t)n_tok, sizeof *t->order, cmp_tok);
    pthread_mutex_unlock(&g_sort_mu);
    /* nodes: at most the total bytes */
    size_t maxn = used + 1;
    t->byte = malloc(maxn);
    t->depth = malloc(maxn * sizeof *t->depth);
    t->skip = malloc(maxn * sizeof *t->skip);
    t->tok_lo = malloc(maxn * sizeof *t->tok_lo);
    t->tok_hi = malloc(maxn * sizeof *t->tok_hi);
    int32_t *path = malloc((size_t)(65536 + 1) * sizeof *path); /* node at each depth */
    if (!t->byte || !t->depth || !t->skip || !t->tok_lo || !t->tok_hi || !path) {
        free(path);
        goto oom;
    }
    int32_t nn = 0;
    int64_t prev_len = 0;
    const uint8_t *prev = NULL;
    for (int32_t k = 0; k < n_tok; k++) {
        int32_t id = t->order[k];
        const uint8_t *s = t->bytes + t->off[id];
        int64_t len = t->off[id + 1] - t->off[id];
        int64_t lcp = 0;
        if (prev)
            while (lcp < len && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        for (int64_t d = lcp; d < len; d++) {
            t->byte[nn] = s[d];
            t->depth[nn] = (uint16_t)(d + 1);
            t->tok_lo[nn] = t->tok_hi[nn] = 0;
            path[d + 1] = nn;
            nn++;
        }
        int32_t node = path[len];
        if (t->tok_hi[node] == 0 && t->tok_lo[node] == 0) t->tok_lo[node] = k;
        t->tok_hi[node] = k + 1;
        if (len > t->max_depth) t->max_depth = (int32_t)len;
        prev = s;
        prev_len = len;
    }
    /* fix tok_lo of nodes without tokens (lo == hi == 0 means none) and compute skips */
    for (int32_t i = 0; i < nn; i++)
        if (t->tok_hi[i] == 0) t->tok_lo[i] = 0;
    /* skip: the next node whose depth <= this one's */
    int32_t sp = 0;
    for (int32_t i = 0; i < nn; i++) {
        while (sp > 0 && t->depth[path[sp - 1]] >= t->depth[i]) t->skip[path[--sp]] = i;
        path[sp++] = i;
    }
    while (sp > 0) t->skip[path[--sp]] = nn;
    free(path);
    t->n_nodes = nn;
    *out = t;
    return KILN_OK;
oom:
    kiln_vocab_trie_destroy(t);
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (vocabulary trie)");
}

void kiln_vocab_trie_destroy(kiln_vocab_trie *t) {
    if (!t) return;
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok_lo);
    free(t->tok_hi);
    free(t->order);
    free(t->bytes);
    free(t->off);
    free(t);
}

int32_t kiln_vocab_trie_n_nodes(const kiln_vocab_trie *t) { return t ? t->n_nodes : 0; }

const uint8_t *kiln_vocab_trie_bytes(const kiln_vocab_trie *t, int32_t id, int32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = (int32_t)(t->off[id + 1] - t->off[id]);
    return t->bytes + t->off[id];
}

static int32_t walk(kiln_gmatch *m, const kiln_vocab_trie *t, int32_t s, uint32_t *bits) {
    int32_t words = (t->n_vocab + 31) / 32;
    memset(bits, 0, (size_t)words * sizeof *bits);
    int32_t stk[1025];
    int32_t *st = t->max_depth < 1024 ? stk : malloc((size_t)(t->max_depth + 1) * sizeof *st);
    if (!st) return 0;
    st[0] = s;
    int32_t count = 0;
    int32_t i = 0, n = t->n_nodes;
    while (i < n) {
        int32_t d = t->depth[i];
        int32_t ns = kiln_gmatch_next(m, st[d - 1], t->byte[i]);
        if (ns < 0) {
            i = t->skip[i];
            continue;
        }
        st[d] = ns;
        for (int32_t k = t->tok_lo[i]; k < t->tok_hi[i]; k++) {
            int32_t id = t->order[k];
            bits[id >> 5] |= 1u << (id & 31);
            count++;
        }
        i++;
    }
    if (st != stk) free(st);
    return count;
}

int32_t kiln_gmatch_token_mask(kiln_gmatch *m, const kiln_vocab_trie *t, int32_t s,
                               uint32_t *bits, bool use_cache) {
    int32_t words = (t->n_vocab + 31) / 32;
    if (s < 0) {
        memset(bits, 0, (size_t)words * sizeof *bits);
        return 0;
    }
    if (use_cache) {
        bool fresh;
        uint32_t *c = kiln_gmatch_mask_cache(m, s, words, false, &fresh);
        if (c) {
            memcpy(bits, c, (size_t)words * sizeof *bits);
            int32_t count = 0;
            for (int32_t w = 0; w < words; w++) count += __builtin_popcount(bits[w]);
            return count;
        }
    }
    int32_t count = walk(m, t, s, bits);
    if (use_cache && !kiln_gmatch_overflowed(m)) {
        bool fresh;
        uint32_t *c = kiln_gmatch_mask_cache(m, s, words, true, &fresh);
        if (c) memcpy(c, bits, (size_t)words * sizeof *bits);
    }
    return count;
}

int32_t kiln_gmatch_forced_tokens(kiln_gmatch *m, const kiln_vocab_trie *t, int32_t *out,
                                  int32_t cap) {
    uint8_t forced[256];
    int32_t nf = 0;
    int32_t s = kiln_gmatch_state(m);
    while (nf < (int32_t)sizeof forced && !kiln_gmatch_accepting(m, s)) {
        int32_t b = kiln_gmatch_only_byte(m, s);
        if (b < 0) break;
        forced[nf++] = (uint8_t)b;
        s = kiln_gmatch_next(m, s, (uint8_t)b);
    }
    if (nf == 0) return 0;
    bool closed = kiln_gmatch_accepting(m, s) && !kiln_gmatch_can_continue(m, s);
    int32_t n = 0, at = 0;
    int32_t ends[256];
    while (at < nf && n < cap) {
        /* the longest token that is a prefix of forced[at..] */
        int32_t best = -1, best_len = 0;
        int32_t i = 0, d = 0;
        while (i < t->n_nodes && at + d < nf) {
            /* find the child of the current node (depth d) with byte forced[at + d] */
            int32_t want = forced[at + d];
            int32_t j = i, found = -1;
            while (j < t->n_nodes && t->depth[j] == d + 1) {
                if (t->byte[j] == want) {
                    found = j;
                    break;
                }
                j = t->skip[j];
            }
            if (found < 0) break;
            d++;
            if (t->tok_hi[found] > t->tok_lo[found]) {
                best = t->order[t->tok_lo[found]];
                best_len = d;
            }
            i = found + 1;
            if (i >= t->n_nodes || t->depth[i] != d + 1) break;
        }
        if (best < 0) break;
        ends[n] = at + best_len;
        out[n++] = best;
        at += best_len;
    }
    /* keep the last token only when it ends exactly where the grammar closes */
    if (n > 0 && !(closed && ends[n - 1] == nf)) n--;
    return n;
}
