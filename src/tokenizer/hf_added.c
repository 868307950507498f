/*
 * hf_added.c - tokenizer.json's added tokens at encode time: a byte trie for leftmost-longest
 * matching and the split of a text into plain pieces and added tokens (Hugging Face
 * tokenizers: tokenizer/added_vocabulary.rs). hf_internal.h documents the functions.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/hf_internal.h"

void hf_trie_init(hf_trie *t) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 256; i++) t->root[i] = -1;
    t->empty = true;
}

static int32_t trie_new(hf_trie *t, uint8_t b) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        hf_tnode *a = realloc(t->nodes, cap * sizeof *a);
        if (!a) return -1;
        t->nodes = a;
        t->cap = cap;
    }
    t->nodes[t->n] = (hf_tnode){-1, -1, -1, b};
    return (int32_t)t->n++;
}

static int32_t trie_child(const hf_trie *t, int32_t node, uint8_t b) {
    int32_t c = node < 0 ? t->root[b] : t->nodes[node].child;
    while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
    return c;
}

bool hf_trie_add(hf_trie *t, const char *s, size_t n, int32_t tok) {
    int32_t node = -1; /* the root */
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(t, node, b);
        if (c < 0) {
            if ((c = trie_new(t, b)) < 0) return false;
            if (node < 0) {
                t->root[b] = c;
            } else {
                t->nodes[c].sibling = t->nodes[node].child;
                t->nodes[node].child = c;
            }
        }
        node = c;
    }
    t->nodes[node].token = tok;
    t->empty = false;
    return true;
}

/* Longest token starting at s[0..n): its index, with *len its length; -1 when none. */
static int32_t trie_longest(const hf_trie *t, const char *s, size_t n, size_t *len) {
    int32_t node = t->root[(uint8_t)s[0]], best = -1;
    for (size_t i = 0; node >= 0;) {
        if (t->nodes[node].token >= 0) {
            best = t->nodes[node].token;
            *len = i + 1;
        }
        if (++i >= n) break;
        node = trie_child(t, node, (uint8_t)s[i]);
    }
    return best;
}

void hf_trie_free(hf_trie *t) {
    free(t->nodes);
    t->nodes = NULL;
}

/* Rust regex: \w at the end of s[0..n) / at the start. */
static bool ends_with_word(const char *s, size_t n) {
    if (n == 0) return false;
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    hf_utf8_next(s, n, k, &cp);
    return hf_is_word(cp);
}

static bool starts_with_word(const char *s, size_t n) {
    if (n == 0) return false;
    uint32_t cp;
    hf_utf8_next(s, n, 0, &cp);
    return hf_is_word(cp);
}

bool hf_added_split(const hf_added *added, const hf_trie *t, const char *s, size_t n, bool at_start,
                    bool parse_special, hf_pieces *out) {
    if (t->empty || n == 0) return n == 0 || hf_pieces_add(out, s, n, -1, at_start);
    size_t start_offset = 0;
    for (size_t pos = 0; pos < n;) {
        size_t mlen = 0;
        int32_t k = trie_longest(t, s + pos, n - pos, &mlen);
        if (k < 0) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + mlen;
        pos = stop; /* the matcher moves on past every match, used or not */
        const hf_added *a = &added[k];
        if (a->special && !parse_special) continue;
        if (a->single_word) {
            bool start_space = start == 0 || !ends_with_word(s, start);
            bool stop_space = stop == n || !starts_with_word(s + stop, n - stop);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                hf_utf8_next(s, n, b, &cp);
                if (!hf_is_whitespace(cp)) break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = hf_utf8_next(s, n, stop, &cp);
                if (!hf_is_whitespace(cp)) break;
                stop += l;
            }
        }
        if (start_offset < start && !hf_pieces_add(out, s + start_offset, start - start_offset, -1,
                                                   at_start && start_offset == 0))
            return false;
        if (!hf_pieces_add(out, "", 0, a->id, false)) return false;
        start_offset = stop;
    }
    if (start_offset < n &&
        !hf_pieces_add(out, s + start_offset, n - start_offset, -1, at_start && start_offset == 0))
        return false;
    return true;
}
