/*
 * spm.c - SentencePiece-style BPE over scores, following the semantics of llama.cpp's
 * llm_tokenizer_spm (priority queue of adjacent pairs, highest score first, leftmost on
 * ties; byte fallback for symbols that are not tokens).
 */
#include "tokenizer/spm.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/utf8.h"

typedef struct spm_sym {
    int32_t prev, next;
    uint32_t off, n; /* n == 0: merged away */
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_pair;

/* true when a should pop before b: higher score, then smaller left index */
static bool pair_before(const spm_pair *a, const spm_pair *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

typedef struct pair_heap {
    spm_pair *a;
    size_t n, cap;
} pair_heap;

static bool heap_push(pair_heap *h, spm_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_pair *a = realloc(h->a, cap * sizeof *a);
        if (!a) return false;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
    return true;
}

static spm_pair heap_pop(pair_heap *h) {
    spm_pair top = h->a[0];
    spm_pair last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const spm_pair *bp = &last;
        if (l < h->n && pair_before(&h->a[l], bp)) {
            best = l;
            bp = &h->a[l];
        }
        if (r < h->n && pair_before(&h->a[r], bp)) best = r;
        if (best == i) break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (h->n) h->a[i] = last;
    return top;
}

int32_t kiln_spm_byte_token(const kiln_vocab *v, uint8_t b) {
    static const char hex[] = "0123456789ABCDEF";
    char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    int32_t id = kiln_vocab_find(v, buf, 6);
    if (id >= 0) return id;
    char c = (char)b;
    return kiln_vocab_find(v, &c, 1);
}

static bool try_pair(const kiln_vocab *v, const char *text, const spm_sym *syms, int32_t l,
                     int32_t r, pair_heap *h) {
    if (l < 0 || r < 0) return true;
    uint32_t size = syms[l].n + syms[r].n;
    int32_t id = kiln_vocab_find(v, text + syms[l].off, size);
    if (id < 0) return true;
    spm_pair p = {v->scores ? v->scores[id] : 0.0f, l, r, size};
    return heap_push(h, p);
}

kiln_status kiln_spm_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err) {
    if (len == 0) return KILN_OK;
    if (len > UINT32_MAX)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "spm: fragment of %zu bytes too long",
                              len);
    spm_sym *syms = malloc(len * sizeof *syms);
    pair_heap h = {0};
    if (!syms) goto oom;
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        int sl = kiln_utf8_seq_len(text + off, len - off);
        size_t cl = sl > 0 ? (size_t)sl : 1; /* callers pass valid UTF-8 */
        syms[n] = (spm_sym){n - 1, off + cl == len ? -1 : n + 1, (uint32_t)off, (uint32_t)cl};
        off += cl;
        n++;
    }
    for (int32_t i = 1; i < n; i++)
        if (!try_pair(v, text, syms, i - 1, i, &h)) goto oom;
    while (h.n) {
        spm_pair p = heap_pop(&h);
        spm_sym *ls = &syms[p.left], *rs = &syms[p.right];
        if (ls->n == 0 || rs->n == 0 || ls->n + rs->n != p.size) continue; /* stale */
        ls->n += rs->n;
        rs->n = 0;
        ls->next = rs->next;
        if (rs->next >= 0) syms[rs->next].prev = p.left;
        if (!try_pair(v, text, syms, ls->prev, p.left, &h)) goto oom;
        if (!try_pair(v, text, syms, p.left, ls->next, &h)) goto oom;
    }
    for (int32_t i = 0; i != -1; i = syms[i].next) {
        const spm_sym *s = &syms[i];
        int32_t id = kiln_vocab_find(v, text + s->off, s->n);
        if (id >= 0) {
            if (kiln_ivec_push(out, id) != KILN_OK) goto oom;
            continue;
        }
        /* byte fallback; a symbol whose bytes lack byte tokens becomes one unk (llama.cpp
         * would throw here; SentencePiece without byte fallback emits unk) */
        bool all = true;
        for (uint32_t j = 0; j < s->n && all; j++)
            all = kiln_spm_byte_token(v, (uint8_t)text[s->off + j]) >= 0;
        if (!all) {
            if (v->unk_id >= 0 && kiln_ivec_push(out, v->unk_id) != KILN_OK) goto oom;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++)
            if (kiln_ivec_push(out, kiln_spm_byte_token(v, (uint8_t)text[s->off + j])) != KILN_OK)
                goto oom;
    }
    free(syms);
    free(h.a);
    return KILN_OK;
oom:
    free(syms);
    free(h.a);
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "spm: out of memory encoding %zu bytes",
                          len);
}
