/*
 * compile.c - the code-point grammar to the byte grammar (grammar.h, kg_compile).
 *
 * A character set becomes UTF-8: an ASCII-only set is one byte-set element; a single code
 * point its 1-4 bytes; any other set a rule whose alternatives are byte-range sequences,
 * found by splitting the code-point ranges where the encodings' lengths and leading bytes
 * change (the decomposition RE2 and Rust's regex-syntax use for UTF-8 automata). Surrogates
 * (U+D800-U+DFFF) are never produced. Then the left-recursion check (llama.cpp refuses such
 * grammars too: a pushdown recognizer that expands rules eagerly would never stop).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

typedef struct cbuf {
    kg_elem *el;
    int32_t n_el, cap_el;
    uint64_t (*sets)[4];
    int32_t n_sets, cap_sets;
    int32_t *alt_start;
    int32_t n_alts, cap_alts;
    bool oom;
} cbuf;

static int32_t set_id(cbuf *c, const uint64_t w[4]) {
    for (int32_t i = c->n_sets - 1; i >= 0; i--)
        if (memcmp(c->sets[i], w, 32) == 0) return i;
    if (c->n_sets == c->cap_sets) {
        int32_t nc = c->cap_sets ? 2 * c->cap_sets : 64;
        void *ns = realloc(c->sets, (size_t)nc * 32);
        if (!ns) {
            c->oom = true;
            return 0;
        }
        c->sets = ns;
        c->cap_sets = nc;
    }
    memcpy(c->sets[c->n_sets], w, 32);
    return c->n_sets++;
}

static void push_el(cbuf *c, int32_t type, int32_t arg) {
    if (c->n_el == c->cap_el) {
        int32_t nc = c->cap_el ? 2 * c->cap_el : 256;
        kg_elem *ne = realloc(c->el, (size_t)nc * sizeof *ne);
        if (!ne) {
            c->oom = true;
            return;
        }
        c->el = ne;
        c->cap_el = nc;
    }
    c->el[c->n_el].type = type;
    c->el[c->n_el].arg = arg;
    c->n_el++;
}

static void begin_alt(cbuf *c) {
    if (c->n_alts == c->cap_alts) {
        int32_t nc = c->cap_alts ? 2 * c->cap_alts : 64;
        int32_t *na = realloc(c->alt_start, (size_t)nc * sizeof *na);
        if (!na) {
            c->oom = true;
            return;
        }
        c->alt_start = na;
        c->cap_alts = nc;
    }
    c->alt_start[c->n_alts++] = c->n_el;
}

static void push_range(cbuf *c, uint8_t lo, uint8_t hi) {
    uint64_t w[4] = {0, 0, 0, 0};
    for (int b = lo; b <= hi; b++) w[b >> 6] |= 1ull << (b & 63);
    push_el(c, KG_BYTES, set_id(c, w));
}

static int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static int utf8_enc(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* One alternative per byte-range sequence of the code points [lo, hi] (lo >= 0x80 here). */
static void utf8_split(cbuf *c, uint32_t lo, uint32_t hi, int depth) {
    if (lo > hi || depth > 64) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_split(c, lo, 0xD7FF, depth + 1);
        if (hi > 0xDFFF) utf8_split(c, 0xE000, hi, depth + 1);
        return;
    }
    static const uint32_t maxes[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= maxes[i] && hi > maxes[i]) {
            utf8_split(c, lo, maxes[i], depth + 1);
            utf8_split(c, maxes[i] + 1, hi, depth + 1);
            return;
        }
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(c, lo, lo | m, depth + 1);
                utf8_split(c, (lo | m) + 1, hi, depth + 1);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(c, lo, (hi & ~m) - 1, depth + 1);
                utf8_split(c, hi & ~m, hi, depth + 1);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    utf8_enc(lo, a);
    utf8_enc(hi, b);
    begin_alt(c);
    for (int i = 0; i < n; i++) push_range(c, a[i], b[i]);
    push_el(c, KG_END, 0);
}

static bool cset_ascii(const kg_cset *s) { return s->n == 0 || s->r[2 * s->n - 1] < 0x80; }
static bool cset_single(const kg_cset *s) { return s->n == 1 && s->r[0] == s->r[1]; }

kiln_status kg_compile(const kg_builder *b, int32_t root, kiln_grammar **out, kiln_error *err) {
    *out = NULL;
    cbuf c;
    memset(&c, 0, sizeof c);
    int32_t nb = b->n_rules;
    int32_t *cset_rule = malloc((size_t)(b->n_csets + 1) * sizeof *cset_rule);
    int32_t n_rules = nb;
    if (!cset_rule) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar)");
    for (int32_t i = 0; i < b->n_csets; i++) {
        const kg_cset *s = &b->csets[i];
        cset_rule[i] = cset_ascii(s) || cset_single(s) ? -1 : n_rules++;
    }
    int32_t *rule_first = calloc((size_t)n_rules + 1, sizeof *rule_first);
    int32_t *rule_n = calloc((size_t)n_rules + 1, sizeof *rule_n);
    kiln_grammar *g = calloc(1, sizeof *g);
    if (!rule_first || !rule_n || !g) c.oom = true;
    for (int32_t r = 0; r < nb && !c.oom; r++) {
        const kg_rule *ru = &b->rules[r];
        rule_first[r] = c.n_alts;
        rule_n[r] = ru->n_alts;
        for (int32_t a = 0; a < ru->n_alts; a++) {
            begin_alt(&c);
            const kg_seq *sq = &ru->alts[a];
            for (int32_t k = 0; k < sq->n; k++) {
                kg_item it = sq->it[k];
                if (it.kind == KG_ITEM_REF) {
                    push_el(&c, KG_REF, it.id);
                    continue;
                }
                const kg_cset *s = &b->csets[it.id];
                if (cset_rule[it.id] >= 0) {
                    push_el(&c, KG_REF, cset_rule[it.id]);
                } else if (cset_ascii(s)) {
                    uint64_t w[4] = {0, 0, 0, 0};
                    for (int32_t j = 0; j < s->n; j++)
                        for (uint32_t x = s->r[2 * j]; x <= s->r[2 * j + 1]; x++)
                            w[x >> 6] |= 1ull << (x & 63);
                    push_el(&c, KG_BYTES, set_id(&c, w));
                } else {
                    uint8_t enc[4];
                    int n = utf8_enc(s->r[0], enc);
                    for (int j = 0; j < n; j++) push_range(&c, enc[j], enc[j]);
                }
            }
            push_el(&c, KG_END, r);
        }
    }
    for (int32_t i = 0; i < b->n_csets && !c.oom; i++) {
        int32_t r = cset_rule[i];
        if (r < 0) continue;
        const kg_cset *s = &b->csets[i];
        rule_first[r] = c.n_alts;
        int32_t before = c.n_alts;
        uint64_t w[4] = {0, 0, 0, 0};
        bool any_ascii = false;
        for (int32_t j = 0; j < s->n; j++)
            for (uint32_t x = s->r[2 * j]; x <= s->r[2 * j + 1] && x < 0x80; x++) {
                w[x >> 6] |= 1ull << (x & 63);
                any_ascii = true;
            }
        if (any_ascii) {
            begin_alt(&c);
            push_el(&c, KG_BYTES, set_id(&c, w));
            push_el(&c, KG_END, r);
        }
        for (int32_t j = 0; j < s->n; j++) {
            uint32_t lo = s->r[2 * j] < 0x80 ? 0x80 : s->r[2 * j], hi = s->r[2 * j + 1];
            if (lo <= hi) utf8_split(&c, lo, hi, 0);
        }
        rule_n[r] = c.n_alts - before;
        for (int32_t k = c.alt_start[before]; k < c.n_el && !c.oom; k++)
            if (c.el[k].type == KG_END) c.el[k].arg = r;
    }
    free(cset_rule);
    if (c.oom) {
        free(c.el);
        free(c.sets);
        free(c.alt_start);
        free(rule_first);
        free(rule_n);
        free(g);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar)");
    }
    g->el = c.el;
    g->n_el = c.n_el;
    g->sets = c.sets;
    g->n_sets = c.n_sets;
    g->alt_start = c.alt_start;
    g->n_alts = c.n_alts;
    g->rule_first = rule_first;
    g->rule_n = rule_n;
    g->n_rules = n_rules;
    g->root = root;
    atomic_init(&g->refs, 1);

    /* left recursion: nullable rules, then cycles of "r may start with x" */
    bool *nullable = calloc((size_t)n_rules, 1);
    uint8_t *color = calloc((size_t)n_rules, 1);
    int32_t *stack = malloc((size_t)(2 * n_rules + 2) * sizeof *stack);
    kiln_status st = KILN_OK;
    if (!nullable || !color || !stack) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar check)");
        goto done;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < n_rules; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < rule_n[r] && !nullable[r]; a++) {
                const kg_elem *e = &g->el[g->alt_start[rule_first[r] + a]];
                while (e->type == KG_REF && nullable[e->arg]) e++;
                if (e->type == KG_END) nullable[r] = changed = true;
            }
        }
    }
    /* productive rules: those that can finish (derive a finite byte string); the fixpoint of
     * "some alternative's elements are all productive" (an empty byte set is not). A root
     * that cannot finish would only fail at generation time ("no token continues the
     * grammar"): refuse it here, naming a rule that never finishes. */
    {
        bool *prod = nullable ? calloc((size_t)n_rules, 1) : NULL;
        if (!prod) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar check)");
            goto done;
        }
        for (bool changed = true; changed;) {
            changed = false;
            for (int32_t r = 0; r < n_rules; r++) {
                if (prod[r]) continue;
                for (int32_t a = 0; a < rule_n[r] && !prod[r]; a++) {
                    const kg_elem *e = &g->el[g->alt_start[rule_first[r] + a]];
                    for (; e->type != KG_END; e++) {
                        if (e->type == KG_REF && !prod[e->arg]) break;
                        if (e->type == KG_BYTES) {
                            const uint64_t *w = g->sets[e->arg];
                            if (!(w[0] | w[1] | w[2] | w[3])) break;
                        }
                    }
                    if (e->type == KG_END) prod[r] = changed = true;
                }
            }
        }
        if (!prod[root]) {
            /* name a rule the root refers to that cannot finish, else the root itself */
            int32_t bad = root;
            for (int32_t a = 0; a < rule_n[root] && bad == root; a++)
                for (const kg_elem *e = &g->el[g->alt_start[rule_first[root] + a]];
                     e->type != KG_END; e++)
                    if (e->type == KG_REF && !prod[e->arg] && e->arg != root && e->arg < nb) {
                        bad = e->arg;
                        break;
                    }
            const char *rn = root < nb ? b->rules[root].name : "root";
            const char *bn = bad < nb ? b->rules[bad].name : "?";
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                "grammar: rule '%s' can never finish: no alternative derives a "
                                "finite string (rule '%s' only refers back to itself or to an "
                                "empty character set)",
                                rn, bn);
        }
        free(prod);
        if (st) goto done;
    }
    /* iterative DFS: stack holds (rule, next alternative-element cursor) pairs */
    for (int32_t r0 = 0; r0 < n_rules && !st; r0++) {
        if (color[r0]) continue;
        int32_t sp = 0;
        stack[sp++] = r0;
        stack[sp++] = 0;
        color[r0] = 1;
        while (sp > 0 && !st) {
            int32_t r = stack[sp - 2], cur = stack[sp - 1];
            /* cur enumerates (alternative, element) pairs flattened: element index offsets */
            int32_t next = -1;
            while (cur < rule_n[r] * 1) {
                int32_t a = cur++;
                const kg_elem *e = &g->el[g->alt_start[rule_first[r] + a]];
                for (; e->type == KG_REF; e++) {
                    int32_t x = e->arg;
                    /* a reference that ends its alternative continues with the caller's
                     * continuation (matcher.c): reaching it again adds no stack, and the
                     * closure's visited set ends the loop */
                    if (e[1].type == KG_END) break;
                    if (color[x] == 1) {
                        st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                            "grammar: rule '%s' is left-recursive (it can reach "
                                            "itself before any character); rewrite it with "
                                            "repetition",
                                            x < nb ? b->rules[x].name : "?");
                        break;
                    }
                    if (color[x] == 0 && next < 0) next = x;
                    if (!nullable[x]) break;
                }
                if (st || next >= 0) break;
            }
            if (st) break;
            stack[sp - 1] = cur;
            if (next >= 0) {
                /* revisit this alternative later for refs after next (nullable chains) */
                stack[sp - 1] = cur - 1 < 0 ? 0 : cur - 1;
                color[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
                if (sp >= 2 * n_rules + 2) sp -= 2; /* cannot happen: each rule once on stack */
            } else {
                color[r] = 2;
                sp -= 2;
            }
        }
    }
done:
    free(nullable);
    free(color);
    free(stack);
    if (st) {
        g->gbnf = NULL;
        free(g->el);
        free(g->sets);
        free(g->alt_start);
        free(g->rule_first);
        free(g->rule_n);
        free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

/* here, beside kg_compile that builds it (the layering check forbids call circles) */
KILN_API void kiln_grammar_destroy(kiln_grammar *g) {
    if (!g) return;
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    free(g->el);
    free(g->sets);
    free(g->alt_start);
    free(g->rule_first);
    free(g->rule_n);
    free(g->gbnf);
    free(g->kind);
    free(g);
}
