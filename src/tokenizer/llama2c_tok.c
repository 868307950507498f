/*
 * llama2c_tok.c - the llama2.c tokenizer.bin vocabulary and an encoder with the exact
 * semantics of karpathy/llama2.c run.c's encode() (see spm.h). run.c rescans all pairs after
 * every merge; this uses a priority queue ordered the same way (highest score, then the
 * leftmost pair), which picks the same merge at every step.
 */
#include "tokenizer/spm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"
#include "util/error.h"
#include "util/utf8.h"

kiln_status kiln_llama2c_vocab_load(const char *path, int32_t n_vocab, kiln_vocab *v,
                                    kiln_error *err) {
    if (n_vocab < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: vocab size %d must be positive",
                              path ? path : "tokenizer.bin", n_vocab);
    kiln_llama2c_vocab *lv = NULL;
    kiln_status st = kiln_llama2c_vocab_read(path, n_vocab, &lv, err);
    if (st != KILN_OK) return st;
    memset(v, 0, sizeof *v);
    v->type = KILN_VOCAB_LLAMA2C;
    v->bos_id = v->eos_id = v->eot_id = v->unk_id = v->sep_id = v->pad_id = v->cls_id = v->mask_id =
        -1;
    int32_t n = lv->n_tokens;
    v->text = calloc((size_t)n, sizeof *v->text);
    v->text_len = calloc((size_t)n, sizeof *v->text_len);
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->token_type = calloc((size_t)n, sizeof *v->token_type);
    if (!v->text || !v->text_len || !v->scores || !v->token_type) {
        free(v->text), free(v->text_len), free(v->scores), free(v->token_type);
        memset(v, 0, sizeof *v);
        kiln_llama2c_vocab_free(lv);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    v->n_tokens = n;
    for (int32_t i = 0; i < n; i++) {
        v->text[i] = lv->pieces[i]; /* take ownership */
        lv->pieces[i] = NULL;
        v->text_len[i] = lv->lens[i];
        v->scores[i] = lv->scores[i];
        uint8_t b;
        if (i == 0)
            v->token_type[i] = KILN_TOKEN_UNKNOWN;
        else if (i == 1 || i == 2)
            v->token_type[i] = KILN_TOKEN_CONTROL;
        else if (kiln_vocab_byte_piece(v->text[i], v->text_len[i], &b))
            v->token_type[i] = KILN_TOKEN_BYTE;
        else
            v->token_type[i] = KILN_TOKEN_NORMAL;
    }
    kiln_llama2c_vocab_free(lv);
    v->unk_id = 0;
    v->bos_id = n > 1 ? 1 : -1;
    v->eos_id = n > 2 ? 2 : -1;
    v->add_bos = true;
    v->add_eos = false;
    v->add_space_prefix = true;
    return KILN_OK;
}

/* ---------------------------------------------------------------- encode */

typedef struct l2_node {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
} l2_node;

typedef struct l2_pair {
    float score;
    int32_t left, right; /* node indices */
    int32_t left_id, right_id, merged_id;
} l2_pair;

static bool l2_before(const l2_pair *a, const l2_pair *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

typedef struct l2_heap {
    l2_pair *a;
    size_t n, cap;
} l2_heap;

static bool l2_push(l2_heap *h, l2_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        l2_pair *a = realloc(h->a, cap * sizeof *a);
        if (!a) return false;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!l2_before(&p, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
    return true;
}

static l2_pair l2_pop(l2_heap *h) {
    l2_pair top = h->a[0];
    l2_pair last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const l2_pair *bp = &last;
        if (l < h->n && l2_before(&h->a[l], bp)) {
            best = l;
            bp = &h->a[l];
        }
        if (r < h->n && l2_before(&h->a[r], bp)) best = r;
        if (best == i) break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (h->n) h->a[i] = last;
    return top;
}

typedef struct l2_ctx {
    const kiln_vocab *v;
    l2_node *nodes;
    l2_heap heap;
    char *buf; /* concatenation scratch */
    size_t buf_cap;
} l2_ctx;

/* queue the pair (l, r) when run.c would consider merging it */
static bool l2_try(l2_ctx *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const kiln_vocab *v = c->v;
    int32_t a = c->nodes[l].id, b = c->nodes[r].id;
    size_t la = v->text_len[a], lb = v->text_len[b];
    if (la + lb > c->buf_cap) {
        size_t cap = (la + lb) * 2;
        char *nb = realloc(c->buf, cap);
        if (!nb) return false;
        c->buf = nb;
        c->buf_cap = cap;
    }
    memcpy(c->buf, v->text[a], la);
    memcpy(c->buf + la, v->text[b], lb);
    int32_t id = kiln_vocab_find(v, c->buf, la + lb);
    if (id < 0) return true;
    float s = v->scores[id];
    if (!(s > -1e10f)) return true; /* run.c: best_score starts at -1e10 and compares with > */
    return l2_push(&c->heap, (l2_pair){s, l, r, a, b, id});
}

kiln_status kiln_llama2c_encode(const kiln_vocab *v, const char *text, size_t len, bool bos,
                                bool eos, kiln_ivec *out, kiln_error *err) {
    /* at most: BOS + dummy prefix + one token per byte */
    if (len > (size_t)INT32_MAX - 4)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "llama2.c encode: input too long");
    l2_ctx c = {.v = v};
    c.nodes = malloc((len + 2) * sizeof *c.nodes);
    if (!c.nodes) goto oom;
    int32_t n = 0;
#define ADD(x)                                                                                     \
    (c.nodes[n] = (l2_node){(x), n - 1, -1, true}, n > 0 ? (c.nodes[n - 1].next = n) : 0, n++)
    if (bos) ADD(v->bos_id);
    if (len > 0) {
        int32_t sp = kiln_vocab_find(v, " ", 1);
        if (sp >= 0) ADD(sp);
    }
    for (size_t off = 0; off < len;) {
        int sl = kiln_utf8_seq_len(text + off, len - off);
        size_t cl = sl > 0 ? (size_t)sl : 1;
        int32_t id = kiln_vocab_find(v, text + off, cl);
        if (id >= 0) {
            ADD(id);
        } else {
            for (size_t j = 0; j < cl; j++) {
                int32_t b = (int32_t)(uint8_t)text[off + j] + 3;
                if (b >= v->n_tokens) b = v->unk_id >= 0 ? v->unk_id : 0;
                ADD(b);
            }
        }
        off += cl;
    }
#undef ADD
    for (int32_t i = 1; i < n; i++)
        if (!l2_try(&c, i - 1, i)) goto oom;
    while (c.heap.n) {
        l2_pair p = l2_pop(&c.heap);
        l2_node *ln = &c.nodes[p.left], *rn = &c.nodes[p.right];
        if (!ln->alive || !rn->alive || ln->next != p.right || ln->id != p.left_id ||
            rn->id != p.right_id)
            continue; /* stale */
        ln->id = p.merged_id;
        rn->alive = false;
        ln->next = rn->next;
        if (rn->next >= 0) c.nodes[rn->next].prev = p.left;
        if (!l2_try(&c, ln->prev, p.left) || !l2_try(&c, p.left, ln->next)) goto oom;
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = c.nodes[i].next)
        if (kiln_ivec_push(out, c.nodes[i].id) != KILN_OK) goto oom;
    if (eos && kiln_ivec_push(out, v->eos_id) != KILN_OK) goto oom;
    free(c.nodes);
    free(c.heap.a);
    free(c.buf);
    return KILN_OK;
oom:
    free(c.nodes);
    free(c.heap.a);
    free(c.buf);
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "llama2.c encode: out of memory");
}
