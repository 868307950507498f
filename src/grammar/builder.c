/*
 * builder.c - the code-point grammar under construction (grammar.h), and a growable text.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

void kg_builder_free(kg_builder *b) {
    if (!b) return;
    for (int32_t i = 0; i < b->n_rules; i++) {
        kg_rule *r = &b->rules[i];
        for (int32_t a = 0; a < r->n_alts; a++) free(r->alts[a].it);
        free(r->alts);
        free(r->name);
    }
    free(b->rules);
    for (int32_t i = 0; i < b->n_csets; i++) free(b->csets[i].r);
    free(b->csets);
    memset(b, 0, sizeof *b);
}

static int32_t rule_append(kg_builder *b, char *name) {
    if (!name) return -1;
    if (b->n_rules == b->cap_rules) {
        int32_t nc = b->cap_rules ? 2 * b->cap_rules : 32;
        kg_rule *nr = realloc(b->rules, (size_t)nc * sizeof *nr);
        if (!nr) {
            free(name);
            return -1;
        }
        b->rules = nr;
        b->cap_rules = nc;
    }
    kg_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = name;
    return b->n_rules++;
}

int32_t kg_rule_get(kg_builder *b, const char *name, size_t len) {
    for (int32_t i = 0; i < b->n_rules; i++)
        if (strlen(b->rules[i].name) == len && memcmp(b->rules[i].name, name, len) == 0) return i;
    char *s = malloc(len + 1);
    if (!s) return -1;
    memcpy(s, name, len);
    s[len] = 0;
    return rule_append(b, s);
}

int32_t kg_rule_new(kg_builder *b, const char *base) {
    char buf[96];
    snprintf(buf, sizeof buf, "%.60s-%d", base, b->n_rules);
    return rule_append(b, strdup(buf));
}

kg_seq *kg_alt_add(kg_builder *b, int32_t ri) {
    kg_rule *r = &b->rules[ri];
    if (r->n_alts == r->cap_alts) {
        int32_t nc = r->cap_alts ? 2 * r->cap_alts : 4;
        kg_seq *na = realloc(r->alts, (size_t)nc * sizeof *na);
        if (!na) return NULL;
        r->alts = na;
        r->cap_alts = nc;
    }
    kg_seq *s = &r->alts[r->n_alts++];
    memset(s, 0, sizeof *s);
    b->size++;
    return s;
}

bool kg_seq_push(kg_builder *b, kg_seq *s, kg_item it) {
    if (b->size >= KG_MAX_ITEMS) return false;
    if (s->n == s->cap) {
        int32_t nc = s->cap ? 2 * s->cap : 8;
        kg_item *ni = realloc(s->it, (size_t)nc * sizeof *ni);
        if (!ni) return false;
        s->it = ni;
        s->cap = nc;
    }
    s->it[s->n++] = it;
    b->size++;
    return true;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

int32_t kg_cset_add(kg_builder *b, const uint32_t *ranges, int32_t n, bool negate) {
    uint32_t *r = malloc((size_t)(2 * n + 2) * sizeof *r);
    if (!r) return -1;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi) continue;
        r[2 * m] = lo;
        r[2 * m + 1] = hi;
        m++;
    }
    qsort(r, (size_t)m, 2 * sizeof *r, cmp_range);
    int32_t k = 0; /* merge overlapping and adjacent */
    for (int32_t i = 0; i < m; i++) {
        if (k > 0 && r[2 * i] <= r[2 * (k - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (k - 1) + 1]) r[2 * (k - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * k] = r[2 * i];
            r[2 * k + 1] = r[2 * i + 1];
            k++;
        }
    }
    if (negate) {
        uint32_t *c = malloc((size_t)(2 * k + 2) * sizeof *c);
        if (!c) {
            free(r);
            return -1;
        }
        int32_t j = 0;
        uint32_t next = 0;
        for (int32_t i = 0; i < k; i++) {
            if (r[2 * i] > next) {
                c[2 * j] = next;
                c[2 * j + 1] = r[2 * i] - 1;
                j++;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            c[2 * j] = next;
            c[2 * j + 1] = 0x10FFFF;
            j++;
        }
        free(r);
        r = c;
        k = j;
    }
    for (int32_t i = 0; i < b->n_csets; i++)
        if (b->csets[i].n == k && memcmp(b->csets[i].r, r, (size_t)(2 * k) * sizeof *r) == 0) {
            free(r);
            return i;
        }
    if (b->n_csets == b->cap_csets) {
        int32_t nc = b->cap_csets ? 2 * b->cap_csets : 32;
        kg_cset *ns = realloc(b->csets, (size_t)nc * sizeof *ns);
        if (!ns) {
            free(r);
            return -1;
        }
        b->csets = ns;
        b->cap_csets = nc;
    }
    b->csets[b->n_csets].r = r;
    b->csets[b->n_csets].n = k;
    return b->n_csets++;
}

/* ---- text ------------------------------------------------------------------------------ */

bool kg_text_add(kg_text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t nc = t->cap ? t->cap : 256;
        while (nc < t->n + n + 1) nc *= 2;
        char *np = realloc(t->p, nc);
        if (!np) return false;
        t->p = np;
        t->cap = nc;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
    return true;
}

bool kg_text_addf(kg_text *t, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof buf) return kg_text_add(t, buf, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return false;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bool ok = kg_text_add(t, big, (size_t)n);
    free(big);
    return ok;
}

void kg_text_free(kg_text *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}
