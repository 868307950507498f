/* tpl_arena.c - bump allocator for template ASTs and render-time values. */
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"

struct tpl_chunk {
    tpl_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_SIZE = 64 * 1024, BIG = 16 * 1024 };

void tpl_arena_init(tpl_arena *a, size_t cap) {
    a->head = NULL;
    a->used = 0;
    a->cap = cap;
    a->over = false;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

static tpl_chunk *new_chunk(tpl_arena *a, size_t size) {
    size_t total = sizeof(tpl_chunk) + size;
    if (a->cap && (a->used > a->cap || total > a->cap - a->used)) {
        a->over = true;
        return NULL;
    }
    tpl_chunk *c = malloc(total);
    if (!c) return NULL;
    c->size = size;
    c->used = 0;
    a->used += total;
    return c;
}

void *tpl_alloc(tpl_arena *a, size_t n) {
    if (n == 0) n = 1;
    if (n > ((size_t)1 << 40)) {
        a->over = true;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    tpl_chunk *h = a->head;
    if (h && h->size - h->used >= n) {
        void *p = h->data + h->used;
        h->used += n;
        return p;
    }
    if (n >= BIG) {
        tpl_chunk *c = new_chunk(a, n);
        if (!c) return NULL;
        c->used = n;
        if (h) { /* keep the partly used head active */
            c->next = h->next;
            h->next = c;
        } else {
            c->next = NULL;
            a->head = c;
        }
        return c->data;
    }
    tpl_chunk *c = new_chunk(a, CHUNK_SIZE);
    if (!c) return NULL;
    c->next = h;
    a->head = c;
    c->used = n;
    return c->data;
}

void *tpl_zalloc(tpl_arena *a, size_t n) {
    void *p = tpl_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void *tpl_realloc(tpl_arena *a, void *p, size_t old, size_t n) {
    if (!p) return tpl_alloc(a, n);
    size_t o16 = (old + 15) & ~(size_t)15, n16 = (n + 15) & ~(size_t)15;
    tpl_chunk *h = a->head;
    if (h && (unsigned char *)p + o16 == h->data + h->used && n >= old &&
        n16 - o16 <= h->size - h->used) {
        h->used += n16 - o16;
        return p;
    }
    void *q = tpl_alloc(a, n);
    if (q) memcpy(q, p, old < n ? old : n);
    return q;
}
