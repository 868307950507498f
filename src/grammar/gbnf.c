/*
 * gbnf.c - the GBNF parser (grammar.h, kg_parse_gbnf): llama.cpp's grammar syntax
 * (grammars/README.md), read into the code-point builder.
 *
 *   rule        name ::= alternatives         (a newline ends it, except inside a group or
 *                                              after '|' or '::=')
 *   alternatives sequence ('|' sequence)*
 *   sequence    (item postfix?)*               postfix: * + ? {m} {m,} {m,n}
 *   item        "literal" | [class] | [^class] | . | name | ( alternatives )
 *   comments    # to the end of the line
 * Escapes in literals and classes: \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH.
 * Names are letters, digits, '-' and '_'. Characters are code points (the text is UTF-8).
 * Repetition is expanded into rules: x* = R where R ::= x R | (empty); x{m,n} = m copies of x
 * and n - m nested optionals (bounded by KG_MAX_REPEAT).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

typedef struct ps {
    const char *s;
    size_t n, i;
    kg_builder *b;
    kiln_error *err;
    kiln_status st;
    int depth;
} ps;

static void where(const ps *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)p->s[k] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

#define FAIL(p, at, ...)                                                                       \
    do {                                                                                       \
        if (!(p)->st) {                                                                        \
            char m_[400];                                                                      \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                              \
            int l_, c_;                                                                        \
            where(p, at, &l_, &c_);                                                            \
            (p)->st = kiln_error_set((p)->err, KILN_ERR_INVALID_ARGUMENT,                      \
                                     "grammar: line %d, column %d: %s", l_, c_, m_);           \
        }                                                                                      \
        return false;                                                                          \
    } while (0)

#define OOM(p)                                                                                 \
    do {                                                                                       \
        if (!(p)->st)                                                                          \
            (p)->st = kiln_error_set((p)->err, KILN_ERR_OUT_OF_MEMORY,                         \
                                     "grammar: out of memory or over %d elements",              \
                                     KG_MAX_ITEMS);                                            \
        return false;                                                                          \
    } while (0)

static int peek(const ps *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static bool is_word(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* spaces, tabs, comments; newlines too when newline_ok */
static void skip_space(ps *p, bool newline_ok) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else {
            break;
        }
    }
}

static bool decode_utf8(ps *p, uint32_t *cp) {
    size_t at = p->i;
    const unsigned char *u = (const unsigned char *)p->s;
    unsigned char c = u[p->i];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || p->i + (size_t)n > p->n) FAIL(p, at, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; k++) {
        if ((u[p->i + (size_t)k] & 0xC0) != 0x80) FAIL(p, at, "invalid UTF-8");
        v = v << 6 | (u[p->i + (size_t)k] & 0x3Fu);
    }
    static const uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        FAIL(p, at, "invalid UTF-8");
    p->i += (size_t)n;
    *cp = v;
    return true;
}

static bool hex_digits(ps *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < n; k++) {
        int c = peek(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) FAIL(p, p->i, "expected %d hex digits in an escape", n);
        v = v << 4 | (uint32_t)d;
        p->i++;
    }
    if (v > 0x10FFFF) FAIL(p, p->i, "escape U+%X is beyond U+10FFFF", v);
    *out = v;
    return true;
}

/* one character of a literal or class (escapes decoded) */
static bool parse_char(ps *p, uint32_t *cp) {
    if (p->i >= p->n) FAIL(p, p->i, "unexpected end of grammar");
    if (p->s[p->i] != '\\') return decode_utf8(p, cp);
    size_t at = p->i++;
    int c = peek(p);
    p->i++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^':
        *cp = (uint32_t)c;
        return true;
    case 'x': return hex_digits(p, 2, cp);
    case 'u': return hex_digits(p, 4, cp);
    case 'U': return hex_digits(p, 8, cp);
    default:
        if (c < 0) FAIL(p, at, "unexpected end of grammar after '\\'");
        FAIL(p, at, "unknown escape '\\%c'", c);
    }
}

static bool push(ps *p, kg_seq *s, kg_item it) {
    if (!kg_seq_push(p->b, s, it)) OOM(p);
    return true;
}

static bool parse_alternatives(ps *p, int32_t rule, bool nested);

/* x* as a rule R ::= x R | (empty); returns R */
static int32_t star_rule(ps *p, kg_item x, const char *base) {
    int32_t r = kg_rule_new(p->b, base);
    if (r < 0) return -1;
    p->b->rules[r].defined = true;
    kg_seq *a = kg_alt_add(p->b, r);
    if (!a || !kg_seq_push(p->b, a, x)) return -1;
    a = &p->b->rules[r].alts[0];
    if (!kg_seq_push(p->b, a, (kg_item){KG_ITEM_REF, r})) return -1;
    if (!kg_alt_add(p->b, r)) return -1;
    return r;
}

/* x{0,k} as nested optionals: O_k ::= x O_{k-1} | (empty), O_1 ::= x | (empty) */
static int32_t opt_chain(ps *p, kg_item x, int32_t k, const char *base) {
    int32_t prev = -1;
    for (int32_t j = 1; j <= k; j++) {
        int32_t r = kg_rule_new(p->b, base);
        if (r < 0) return -1;
        p->b->rules[r].defined = true;
        kg_seq *a = kg_alt_add(p->b, r);
        if (!a || !kg_seq_push(p->b, a, x)) return -1;
        if (prev >= 0 && !kg_seq_push(p->b, &p->b->rules[r].alts[0], (kg_item){KG_ITEM_REF, prev}))
            return -1;
        if (!kg_alt_add(p->b, r)) return -1;
        prev = r;
    }
    return prev;
}

static bool parse_int(ps *p, int64_t *v) {
    size_t at = p->i;
    int64_t x = 0;
    if (peek(p) < '0' || peek(p) > '9') FAIL(p, at, "expected a number in a repetition {m,n}");
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (peek(p) - '0');
        if (x > KG_MAX_REPEAT) FAIL(p, at, "repetition bound over %d", KG_MAX_REPEAT);
        p->i++;
    }
    *v = x;
    return true;
}

/* apply a postfix operator to the last item of the alternative (rule ri, alt ai) */
static bool apply_postfix(ps *p, int32_t ri, int32_t ai, size_t item_at) {
    int c = peek(p);
    if (c != '*' && c != '+' && c != '?' && c != '{') return true;
    size_t at = p->i;
    int64_t m, n; /* n < 0: unbounded */
    p->i++;
    if (c == '*') {
        m = 0;
        n = -1;
    } else if (c == '+') {
        m = 1;
        n = -1;
    } else if (c == '?') {
        m = 0;
        n = 1;
    } else {
        skip_space(p, false);
        if (!parse_int(p, &m)) return false;
        skip_space(p, false);
        n = m;
        if (peek(p) == ',') {
            p->i++;
            skip_space(p, false);
            if (peek(p) == '}') {
                n = -1;
            } else if (!parse_int(p, &n)) {
                return false;
            }
            skip_space(p, false);
        }
        if (peek(p) != '}') FAIL(p, p->i, "expected '}' to close a repetition");
        p->i++;
        if (n >= 0 && n < m) FAIL(p, at, "repetition {%lld,%lld}: the maximum is below the minimum",
                                  (long long)m, (long long)n);
    }
    kg_seq *s = &p->b->rules[ri].alts[ai];
    if (s->n == 0) FAIL(p, item_at, "a repetition operator needs an item before it");
    kg_item x = s->it[--s->n];
    char base[80];
    snprintf(base, sizeof base, "%.40s-rep", p->b->rules[ri].name);
    for (int64_t k = 0; k < m; k++)
        if (!push(p, &p->b->rules[ri].alts[ai], x)) return false;
    if (n < 0) {
        int32_t r = star_rule(p, x, base);
        if (r < 0) OOM(p);
        if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_REF, r})) return false;
    } else if (n > m) {
        int32_t r = opt_chain(p, x, (int32_t)(n - m), base);
        if (r < 0) OOM(p);
        if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_REF, r})) return false;
    }
    return true;
}

static bool parse_sequence(ps *p, int32_t ri, bool nested) {
    kg_seq *a = kg_alt_add(p->b, ri);
    if (!a) OOM(p);
    int32_t ai = p->b->rules[ri].n_alts - 1;
    for (;;) {
        skip_space(p, nested);
        int c = peek(p);
        size_t at = p->i;
        if (c < 0 || c == '|' || c == ')' || c == '\n' || c == '\r') return true;
        if (c == '"') {
            p->i++;
            int32_t first_item = p->b->rules[ri].alts[ai].n;
            while (peek(p) != '"') {
                if (p->i >= p->n || peek(p) == '\n') FAIL(p, at, "unterminated string literal");
                uint32_t cp;
                if (!parse_char(p, &cp)) return false;
                uint32_t rg[2] = {cp, cp};
                int32_t id = kg_cset_add(p->b, rg, 1, false);
                if (id < 0) OOM(p);
                if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_CSET, id})) return false;
            }
            p->i++;
            int32_t n_chars = p->b->rules[ri].alts[ai].n - first_item;
            if (n_chars > 1 && (peek(p) == '*' || peek(p) == '+' || peek(p) == '?' ||
                                peek(p) == '{')) {
                /* a postfix applies to the whole literal: move it into a rule */
                int32_t r = kg_rule_new(p->b, "lit");
                if (r < 0) OOM(p);
                p->b->rules[r].defined = true;
                kg_seq *la = kg_alt_add(p->b, r);
                if (!la) OOM(p);
                kg_seq *src = &p->b->rules[ri].alts[ai];
                for (int32_t k = first_item; k < src->n; k++)
                    if (!push(p, &p->b->rules[r].alts[0], p->b->rules[ri].alts[ai].it[k]))
                        return false;
                p->b->rules[ri].alts[ai].n = first_item;
                if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_REF, r})) return false;
            } else if (n_chars == 0 && (peek(p) == '*' || peek(p) == '+' || peek(p) == '?' ||
                                        peek(p) == '{')) {
                FAIL(p, at, "a repetition of an empty literal");
            }
        } else if (c == '[') {
            p->i++;
            bool neg = false;
            if (peek(p) == '^') {
                neg = true;
                p->i++;
            }
            uint32_t *rg = NULL;
            int32_t nr = 0, cap = 0;
            while (peek(p) != ']') {
                if (p->i >= p->n) {
                    free(rg);
                    FAIL(p, at, "unterminated character class");
                }
                uint32_t lo, hi;
                if (!parse_char(p, &lo)) {
                    free(rg);
                    return false;
                }
                hi = lo;
                if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
                    p->i++;
                    if (!parse_char(p, &hi)) {
                        free(rg);
                        return false;
                    }
                    if (hi < lo) {
                        free(rg);
                        FAIL(p, at, "character range out of order (U+%04X-U+%04X)", lo, hi);
                    }
                }
                if (nr == cap) {
                    cap = cap ? 2 * cap : 8;
                    uint32_t *nrg = realloc(rg, (size_t)cap * 2 * sizeof *nrg);
                    if (!nrg) {
                        free(rg);
                        OOM(p);
                    }
                    rg = nrg;
                }
                rg[2 * nr] = lo;
                rg[2 * nr + 1] = hi;
                nr++;
            }
            p->i++;
            int32_t id = kg_cset_add(p->b, rg, nr, neg);
            free(rg);
            if (id < 0) OOM(p);
            if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_CSET, id})) return false;
        } else if (c == '.') {
            p->i++;
            uint32_t rg[2] = {0, 0x10FFFF};
            int32_t id = kg_cset_add(p->b, rg, 1, false);
            if (id < 0) OOM(p);
            if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_CSET, id})) return false;
        } else if (c == '(') {
            p->i++;
            if (++p->depth > 200) FAIL(p, at, "groups nested deeper than 200");
            int32_t r = kg_rule_new(p->b, p->b->rules[ri].name);
            if (r < 0) OOM(p);
            p->b->rules[r].defined = true;
            if (!parse_alternatives(p, r, true)) return false;
            p->depth--;
            skip_space(p, true);
            if (peek(p) != ')') FAIL(p, at, "unclosed group: expected ')'");
            p->i++;
            if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_REF, r})) return false;
        } else if (is_word(c)) {
            size_t s0 = p->i;
            while (is_word(peek(p))) p->i++;
            size_t s1 = p->i;
            /* a name followed by ::= starts the next rule: this sequence has ended */
            size_t save = p->i;
            skip_space(p, false);
            if (p->i + 2 < p->n + 0 && strncmp(p->s + p->i, "::=", 3) == 0)
                FAIL(p, s0, "expected a newline before the rule '%.*s'", (int)(s1 - s0), p->s + s0);
            p->i = save;
            int32_t r = kg_rule_get(p->b, p->s + s0, s1 - s0);
            if (r < 0) OOM(p);
            if (p->b->rules[r].ref_line == 0) where(p, s0, &p->b->rules[r].ref_line,
                                                    &p->b->rules[r].ref_col);
            if (!push(p, &p->b->rules[ri].alts[ai], (kg_item){KG_ITEM_REF, r})) return false;
        } else if (c == '<') {
            FAIL(p, at, "token references (<...>) are not supported");
        } else {
            FAIL(p, at, "unexpected character '%c'", c);
        }
        if (!apply_postfix(p, ri, ai, at)) return false;
    }
}

static bool parse_alternatives(ps *p, int32_t ri, bool nested) {
    if (!parse_sequence(p, ri, nested)) return false;
    for (;;) {
        skip_space(p, nested);
        if (peek(p) != '|') return true;
        p->i++;
        skip_space(p, true);
        if (!parse_sequence(p, ri, nested)) return false;
    }
}

static bool parse_rules(ps *p) {
    kg_builder *b = p->b;
    for (;;) {
        skip_space(p, true);
        if (p->i >= p->n) return true;
        size_t at = p->i;
        if (!is_word(peek(p))) FAIL(p, at, "expected a rule name");
        while (is_word(peek(p))) p->i++;
        int32_t r = kg_rule_get(b, p->s + at, p->i - at);
        if (r < 0) OOM(p);
        if (b->rules[r].defined) FAIL(p, at, "rule '%s' is defined twice", b->rules[r].name);
        b->rules[r].defined = true;
        skip_space(p, false);
        if (p->i + 3 > p->n || strncmp(p->s + p->i, "::=", 3) != 0)
            FAIL(p, p->i, "expected '::=' after the rule name '%s'", b->rules[r].name);
        p->i += 3;
        skip_space(p, true);
        if (!parse_alternatives(p, r, false)) return false;
        skip_space(p, false);
        if (p->i < p->n && peek(p) != '\n' && peek(p) != '\r')
            FAIL(p, p->i, "unexpected '%c' (unbalanced ')'?)", peek(p));
    }
}

kiln_status kg_parse_gbnf(const char *text, size_t len, kg_builder *b, int32_t *root,
                          kiln_error *err) {
    ps p = {.s = text ? text : "", .n = text ? len : 0, .i = 0, .b = b, .err = err};
    if (!parse_rules(&p) && !p.st)
        p.st = kiln_error_set(err, KILN_ERR_INTERNAL, "grammar: parse failed");
    if (p.st) return p.st;
    for (int32_t i = 0; i < b->n_rules; i++)
        if (!b->rules[i].defined)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "grammar: line %d, column %d: rule '%s' is not defined",
                                  b->rules[i].ref_line, b->rules[i].ref_col, b->rules[i].name);
    int32_t rt = -1;
    for (int32_t i = 0; i < b->n_rules; i++)
        if (strcmp(b->rules[i].name, "root") == 0) rt = i;
    if (rt < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "grammar: there is no rule named 'root' (the start rule)");
    *root = rt;
    return KILN_OK;
}

kiln_status kg_from_gbnf(const char *text, size_t len, const char *kind, kiln_grammar **out,
                         kiln_error *err) {
    kg_builder b;
    memset(&b, 0, sizeof b);
    int32_t root;
    kiln_status st = kg_parse_gbnf(text, len, &b, &root, err);
    if (!st) st = kg_compile(&b, root, out, err);
    kg_builder_free(&b);
    if (st) return st;
    (*out)->gbnf = malloc(len + 1);
    (*out)->kind = strdup(kind ? kind : "gbnf");
    if (!(*out)->gbnf || !(*out)->kind) {
        kiln_grammar_destroy(*out);
        *out = NULL;
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar)");
    }
    memcpy((*out)->gbnf, text, len);
    (*out)->gbnf[len] = 0;
    return KILN_OK;
}
