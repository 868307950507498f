/*
 * bpe.c - byte-level BPE as llama.cpp's llm_tokenizer_bpe_session does it:
 *
 *   text --pre-tokenizer regexes--> pre-tokens --GPT-2 byte mapping--> mapped words;
 *   each word starts as one symbol per UTF-8 character; the adjacent pair with the lowest
 *   merge rank (ties: leftmost) is merged until no adjacent pair has a rank; every final
 *   symbol is looked up in the vocab, and one that is missing falls back to the vocab ids of
 *   its single bytes (bytes without an id are dropped, as llama.cpp does).
 *   ignore_merges (llama3 family, tekken): a word that is itself a vocab entry is emitted
 *   whole.
 *
 * Merge ranks live in an open-addressing hash keyed by the (left, right) strings.
 */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/pretokenize.h"
#include "util/error.h"

typedef struct merge_ent {
    uint32_t off;  /* left then right text in the arena */
    uint32_t llen; /* left length */
    uint32_t rlen; /* right length */
    int32_t rank;
} merge_ent;

typedef struct bpe_state {
    kiln_pretok *pretok;
    bool ignore_merges;
    char *arena;
    merge_ent *ents;
    size_t n_ents;
    uint32_t *slots; /* ent index + 1; 0 = empty */
    size_t mask;
} bpe_state;

static uint64_t hash_pair(const char *l, size_t ll, const char *r, size_t rl) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < ll; i++) h = (h ^ (uint8_t)l[i]) * 1099511628211ull;
    h = (h ^ 0x100u) * 1099511628211ull; /* separator outside the byte range */
    for (size_t i = 0; i < rl; i++) h = (h ^ (uint8_t)r[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Rank of merging left+right, or -1. */
static int32_t bpe_rank(const bpe_state *b, const char *l, size_t ll, const char *r, size_t rl) {
    if (!b->slots) return -1;
    size_t i = (size_t)hash_pair(l, ll, r, rl) & b->mask;
    for (;;) {
        uint32_t s = b->slots[i];
        if (!s) return -1;
        const merge_ent *e = &b->ents[s - 1];
        if (e->llen == ll && e->rlen == rl && memcmp(b->arena + e->off, l, ll) == 0 &&
            memcmp(b->arena + e->off + ll, r, rl) == 0)
            return e->rank;
        i = (i + 1) & b->mask;
    }
}

void kiln_bpe_free(kiln_vocab *v) {
    if (!v || !v->bpe) return;
    bpe_state *b = v->bpe;
    kiln_pretok_destroy(b->pretok);
    free(b->arena);
    free(b->ents);
    free(b->slots);
    free(b);
    v->bpe = NULL;
}

kiln_status kiln_bpe_init(kiln_vocab *v, kiln_error *err) {
    if (!v) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "kiln_bpe_init: no vocab");
    kiln_bpe_free(v);
    if (v->n_merges < 0 || (v->n_merges > 0 && !v->merges))
        return kiln_error_set(err, KILN_ERR_FORMAT, "BPE vocab: bad merges list");

    bpe_state *b = calloc(1, sizeof *b);
    if (!b) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (BPE state)");
    kiln_status st = kiln_pretok_create(v->pre, &b->pretok, err);
    if (st != KILN_OK) {
        free(b);
        return st;
    }
    b->ignore_merges = kiln_pretok_ignore_merges(b->pretok);

    size_t n = (size_t)v->n_merges, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v->merges[i]) {
            st = kiln_error_set(err, KILN_ERR_FORMAT, "BPE vocab: merge %zu is missing", i);
            goto fail;
        }
        total += strlen(v->merges[i]);
    }
    if (total > UINT32_MAX) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "BPE vocab: merges too large (%zu bytes)", total);
        goto fail;
    }
    if (n > 0) {
        size_t cap = 16;
        while (cap < 2 * n) cap *= 2;
        b->arena = malloc(total + 1);
        b->ents = malloc(n * sizeof *b->ents);
        b->slots = calloc(cap, sizeof *b->slots);
        if (!b->arena || !b->ents || !b->slots) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (%zu BPE merges)", n);
            goto fail;
        }
        b->mask = cap - 1;
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            /* "left right", split at the first space after the first byte (llama.cpp). A
             * merge without one maps to an empty pair that can never apply: skipped. */
            const char *s = v->merges[i];
            size_t len = strlen(s);
            const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            if (!sp) continue;
            size_t ll = (size_t)(sp - s), rl = len - ll - 1;
            if (bpe_rank(b, s, ll, sp + 1, rl) >= 0) continue; /* duplicate: first rank wins */
            memcpy(b->arena + off, s, ll);
            memcpy(b->arena + off + ll, sp + 1, rl);
            merge_ent *e = &b->ents[b->n_ents];
            e->off = (uint32_t)off;
            e->llen = (uint32_t)ll;
            e->rlen = (uint32_t)rl;
            e->rank = (int32_t)i;
            size_t h = (size_t)hash_pair(s, ll, sp + 1, rl) & b->mask;
            while (b->slots[h]) h = (h + 1) & b->mask;
            b->slots[h] = (uint32_t)(++b->n_ents);
            off += ll + rl;
        }
    }
    v->bpe = b;
    return KILN_OK;
fail:
    kiln_pretok_destroy(b->pretok);
    free(b->arena);
    free(b->ents);
    free(b->slots);
    free(b);
    return st;
}

/* ---- per-call merge workspace -------------------------------------------------------------- */

typedef struct sym {
    uint32_t start, n; /* bytes of the mapped word; n == 0 once merged away */
    int32_t prev, next;
} sym;

typedef struct bigram {
    int32_t rank, left, right;
    uint32_t llen, rlen; /* symbol lengths when queued: a changed length means stale */
} bigram;

typedef struct work {
    char *word;
    size_t word_cap;
    sym *syms;
    bigram *heap;
    size_t sym_cap, heap_n, heap_cap;
} work;

static bool bigram_less(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool heap_push(work *w, bigram g) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        bigram *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return false;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_less(&g, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = g;
    return true;
}

static bigram heap_pop(work *w) {
    bigram top = w->heap[0];
    bigram last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static bool add_bigram(const bpe_state *b, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *L = &w->syms[l], *R = &w->syms[r];
    int32_t rank = bpe_rank(b, w->word + L->start, L->n, w->word + R->start, R->n);
    if (rank < 0) return true;
    bigram g = {rank, l, r, L->n, R->n};
    return heap_push(w, g);
}

static size_t utf8_lead_len(unsigned char c) {
    if (c < 0xC0) return 1;
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    return 4;
}

static kiln_status emit(const kiln_vocab *v, const char *s, size_t n, kiln_ivec *out) {
    int32_t id = kiln_vocab_find(v, s, n);
    if (id >= 0) return kiln_ivec_push(out, id);
    /* llama.cpp: fall back to single-byte tokens of the mapped text; drop bytes without one */
    for (size_t i = 0; i < n; i++) {
        id = kiln_vocab_find(v, s + i, 1);
        if (id >= 0 && kiln_ivec_push(out, id) != KILN_OK) return KILN_ERR_OUT_OF_MEMORY;
    }
    return KILN_OK;
}

static kiln_status encode_word(const kiln_vocab *v, const bpe_state *b, work *w, size_t wlen,
                               kiln_ivec *out) {
    if (b->ignore_merges) {
        int32_t id = kiln_vocab_find(v, w->word, wlen);
        if (id >= 0) return kiln_ivec_push(out, id);
    }
    int32_t ns = 0;
    for (size_t i = 0; i < wlen;) {
        size_t n = utf8_lead_len((unsigned char)w->word[i]);
        if (n > wlen - i) n = wlen - i;
        w->syms[ns] = (sym){(uint32_t)i, (uint32_t)n, ns - 1, -1};
        if (ns > 0) w->syms[ns - 1].next = ns;
        ns++;
        i += n;
    }
    w->heap_n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (!add_bigram(b, w, i - 1, i)) return KILN_ERR_OUT_OF_MEMORY;
    while (w->heap_n) {
        bigram g = heap_pop(w);
        sym *L = &w->syms[g.left], *R = &w->syms[g.right];
        if (L->n == 0 || R->n == 0 || L->n != g.llen || R->n != g.rlen) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->syms[R->next].prev = g.left;
        if (!add_bigram(b, w, L->prev, g.left) || !add_bigram(b, w, g.left, L->next))
            return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = w->syms[i].next) {
        kiln_status st = emit(v, w->word + w->syms[i].start, w->syms[i].n, out);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

kiln_status kiln_bpe_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out,
                            kiln_error *err) {
    if (!v || !v->bpe)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kiln_bpe_encode: vocab has no BPE state (kiln_bpe_init not run)");
    if (len == 0) return KILN_OK;
    const bpe_state *b = v->bpe;
    kiln_spans spans = {0};
    work w = {0};
    kiln_status st = kiln_pretok_split(b->pretok, text, len, &spans, err);
    if (st != KILN_OK) goto done;

    size_t maxlen = 0;
    for (size_t i = 0; i < spans.n; i++)
        if (spans.data[i].len > maxlen) maxlen = spans.data[i].len;
    if (maxlen > UINT32_MAX / 4) {
        st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "BPE: pre-token of %zu bytes too long",
                            maxlen);
        goto done;
    }
    w.word_cap = 2 * maxlen;
    w.sym_cap = 2 * maxlen;
    w.word = malloc(w.word_cap ? w.word_cap : 1);
    w.syms = malloc((w.sym_cap ? w.sym_cap : 1) * sizeof *w.syms);
    if (!w.word || !w.syms) goto oom;

    for (size_t i = 0; i < spans.n; i++) {
        size_t wlen = kiln_bytelevel_encode(text + spans.data[i].off, spans.data[i].len, w.word);
        st = encode_word(v, b, &w, wlen, out);
        if (st == KILN_ERR_OUT_OF_MEMORY) goto oom;
        if (st != KILN_OK) goto done;
    }
    goto done;
oom:
    st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (BPE encode)");
done:
    kiln_spans_free(&spans);
    free(w.word);
    free(w.syms);
    free(w.heap);
    return st;
}
