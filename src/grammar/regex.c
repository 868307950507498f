/*
 * regex.c - a regular-expression subset to GBNF (grammar.h, kg_regex_to_gbnf).
 *
 * Supported: literal characters and escaped metacharacters; \n \r \t \f \v \xHH \uHHHH;
 * classes [...] and [^...] with ranges and \d \w \s inside; the shorthands \d \w \s \D \W \S;
 * '.' (any character but a newline); groups (...), (?:...), (?<name>...), (?P<name>...);
 * alternation |; quantifiers * + ? {m} {m,} {m,n}, also lazy (*? ...: the same language);
 * ^ at the very start and $ at the very end (the match is always of the whole text: anchors
 * are implicit, as vLLM's guided_regex and a JSON schema "pattern" fully matched).
 * Refused with the construct named and its offset: backreferences, lookahead and lookbehind,
 * word boundaries \b \B, \A \Z \z, anchors elsewhere, inline flags (?i) and the like,
 * possessive quantifiers, atomic groups, Unicode property classes \p{...}.
 *
 * json_string mode (a JSON schema "pattern"): the regex describes a JSON string's decoded
 * content, so the grammar writes '"' and '\' as the escapes \" and \\, the control characters
 * \n \r \t as their escapes, and never writes any other control character.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

typedef struct rx {
    const char *s;
    size_t n, i;
    bool json;
    kg_text *o;
    kiln_error *err;
    kiln_status st;
    int depth;
} rx;

#define RFAIL(p, at, ...)                                                                      \
    do {                                                                                       \
        if (!(p)->st) {                                                                        \
            char m_[300];                                                                      \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                              \
            (p)->st = kiln_error_set((p)->err, KILN_ERR_INVALID_ARGUMENT,                      \
                                     "regex: position %zu: %s", (size_t)(at), m_);              \
        }                                                                                      \
        return false;                                                                          \
    } while (0)
#define ROOM(p)                                                                                \
    do {                                                                                       \
        if (!(p)->st) (p)->st = kiln_error_set((p)->err, KILN_ERR_OUT_OF_MEMORY, "regex: out of memory"); \
        return false;                                                                          \
    } while (0)

typedef struct ranges {
    uint32_t *r;
    int32_t n, cap;
} ranges;

static bool rg_add(ranges *g, uint32_t lo, uint32_t hi) {
    if (g->n == g->cap) {
        int32_t nc = g->cap ? 2 * g->cap : 8;
        uint32_t *nr = realloc(g->r, (size_t)nc * 2 * sizeof *nr);
        if (!nr) return false;
        g->r = nr;
        g->cap = nc;
    }
    g->r[2 * g->n] = lo;
    g->r[2 * g->n + 1] = hi;
    g->n++;
    return true;
}

static int cmp_rg(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void rg_norm(ranges *g) {
    qsort(g->r, (size_t)g->n, 2 * sizeof *g->r, cmp_rg);
    int32_t k = 0;
    for (int32_t i = 0; i < g->n; i++) {
        if (k && g->r[2 * i] <= g->r[2 * k - 1] + 1) {
            if (g->r[2 * i + 1] > g->r[2 * k - 1]) g->r[2 * k - 1] = g->r[2 * i + 1];
        } else {
            g->r[2 * k] = g->r[2 * i];
            g->r[2 * k + 1] = g->r[2 * i + 1];
            k++;
        }
    }
    g->n = k;
}

/* complement over [0, 0x10FFFF] (g normalised) */
static bool rg_negate(ranges *g) {
    ranges c = {0};
    uint32_t next = 0;
    for (int32_t i = 0; i < g->n; i++) {
        if (g->r[2 * i] > next && !rg_add(&c, next, g->r[2 * i] - 1)) return false;
        next = g->r[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF && !rg_add(&c, next, 0x10FFFF)) return false;
    free(g->r);
    *g = c;
    return true;
}

static bool rg_has(const ranges *g, uint32_t c) {
    for (int32_t i = 0; i < g->n; i++)
        if (c >= g->r[2 * i] && c <= g->r[2 * i + 1]) return true;
    return false;
}

/* remove [lo, hi] from g (normalised) */
static bool rg_sub(ranges *g, uint32_t lo, uint32_t hi) {
    ranges c = {0};
    for (int32_t i = 0; i < g->n; i++) {
        uint32_t a = g->r[2 * i], b = g->r[2 * i + 1];
        if (b < lo || a > hi) {
            if (!rg_add(&c, a, b)) return false;
            continue;
        }
        if (a < lo && !rg_add(&c, a, lo - 1)) return false;
        if (b > hi && !rg_add(&c, hi + 1, b)) return false;
    }
    free(g->r);
    *g = c;
    return true;
}

static bool emit_class(rx *p, ranges *g, size_t at) {
    rg_norm(g);
    bool esc_q = false, esc_b = false, esc_n = false, esc_r = false, esc_t = false;
    if (p->json) {
        esc_q = rg_has(g, '"');
        esc_b = rg_has(g, '\\');
        esc_n = rg_has(g, '\n');
        esc_r = rg_has(g, '\r');
        esc_t = rg_has(g, '\t');
        if (!rg_sub(g, 0, 0x1F) || !rg_sub(g, '"', '"') || !rg_sub(g, '\\', '\\')) ROOM(p);
    }
    int alts = (g->n > 0) + esc_q + esc_b + esc_n + esc_r + esc_t;
    if (alts == 0) RFAIL(p, at, "the character class matches nothing");
    if (alts > 1 && !kg_text_add(p->o, "(", 1)) ROOM(p);
    bool first = true;
    if (g->n > 0) {
        if (!kg_text_add(p->o, "[", 1)) ROOM(p);
        for (int32_t i = 0; i < g->n; i++) {
            uint32_t lo = g->r[2 * i], hi = g->r[2 * i + 1];
            if (!kg_text_addf(p->o, "\\U%08X", lo)) ROOM(p);
            if (hi != lo && !kg_text_addf(p->o, "-\\U%08X", hi)) ROOM(p);
        }
        if (!kg_text_add(p->o, "]", 1)) ROOM(p);
        first = false;
    }
    const char *esc[5] = {"\"\\\\\\\"\"", "\"\\\\\\\\\"", "\"\\\\n\"", "\"\\\\r\"", "\"\\\\t\""};
    bool on[5] = {esc_q, esc_b, esc_n, esc_r, esc_t};
    for (int k = 0; k < 5; k++) {
        if (!on[k]) continue;
        if (!first && !kg_text_add(p->o, " | ", 3)) ROOM(p);
        if (!kg_text_add(p->o, esc[k], strlen(esc[k]))) ROOM(p);
        first = false;
    }
    if (alts > 1 && !kg_text_add(p->o, ")", 1)) ROOM(p);
    return true;
}

static bool emit_char(rx *p, uint32_t c, size_t at) {
    ranges g = {0};
    if (!rg_add(&g, c, c)) ROOM(p);
    bool ok = emit_class(p, &g, at);
    free(g.r);
    return ok;
}

static bool dec_utf8(rx *p, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)p->s;
    size_t at = p->i;
    unsigned char c = u[p->i];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || p->i + (size_t)n > p->n) RFAIL(p, at, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; k++) {
        if ((u[p->i + (size_t)k] & 0xC0) != 0x80) RFAIL(p, at, "invalid UTF-8");
        v = v << 6 | (u[p->i + (size_t)k] & 0x3F);
    }
    p->i += (size_t)n;
    *cp = v;
    return true;
}

static int peekc(const rx *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static bool hexn(rx *p, int n, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < n; k++) {
        int c = peekc(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) RFAIL(p, p->i, "expected %d hex digits", n);
        *v = *v << 4 | (uint32_t)d;
        p->i++;
    }
    return true;
}

/* shorthand class letter into g; false when c is not one */
static bool shorthand(ranges *g, int c, bool *neg, bool *ok) {
    *ok = true;
    *neg = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd': case 'D':
        *ok = rg_add(g, '0', '9');
        return true;
    case 'w': case 'W':
        *ok = rg_add(g, 'a', 'z') && rg_add(g, 'A', 'Z') && rg_add(g, '0', '9') && rg_add(g, '_', '_');
        return true;
    case 's': case 'S':
        *ok = rg_add(g, ' ', ' ') && rg_add(g, '\t', '\r');
        return true;
    default:
        return false;
    }
}

/* an escape after '\' (p->i at the letter): a single code point into *cp, or a class into g
 * (*is_class) */
static bool escape(rx *p, uint32_t *cp, ranges *g, bool *is_class, bool *neg) {
    size_t at = p->i - 1;
    int c = peekc(p);
    *is_class = false;
    if (c < 0) RFAIL(p, at, "the pattern ends with '\\'");
    bool ok;
    if (shorthand(g, c, neg, &ok)) {
        p->i++;
        if (!ok) ROOM(p);
        *is_class = true;
        return true;
    }
    p->i++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x': return hexn(p, 2, cp);
    case 'u': return hexn(p, 4, cp);
    case 'b': case 'B': RFAIL(p, at, "word boundaries (\\b, \\B) are not supported");
    case 'A': case 'Z': case 'z': case 'G': RFAIL(p, at, "the anchor \\%c is not supported", c);
    case 'p': case 'P': RFAIL(p, at, "Unicode property classes (\\p{...}) are not supported");
    case 'k': RFAIL(p, at, "backreferences are not supported");
    default:
        if (c >= '1' && c <= '9') RFAIL(p, at, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            RFAIL(p, at, "unknown escape '\\%c'", c);
        p->i--;
        return dec_utf8(p, cp);
    }
}

static bool parse_alt(rx *p, bool top);

static bool parse_class(rx *p) {
    size_t at = p->i++;
    bool neg = false;
    if (peekc(p) == '^') {
        neg = true;
        p->i++;
    }
    ranges g = {0};
    bool first = true;
    while (p->i < p->n && (peekc(p) != ']' || first)) {
        first = false;
        uint32_t lo, hi;
        bool is_class = false, sneg = false;
        if (peekc(p) == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            free(g.r);
            RFAIL(p, p->i, "POSIX classes ([:alpha:]) are not supported");
        }
        if (peekc(p) == '\\') {
            p->i++;
            if (!escape(p, &lo, &g, &is_class, &sneg)) {
                free(g.r);
                return false;
            }
            if (is_class) {
                if (sneg) {
                    free(g.r);
                    RFAIL(p, p->i - 2, "negated shorthands (\\D \\W \\S) inside a class are not supported");
                }
                continue;
            }
        } else if (!dec_utf8(p, &lo)) {
            free(g.r);
            return false;
        }
        hi = lo;
        if (peekc(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            if (peekc(p) == '\\') {
                p->i++;
                if (!escape(p, &hi, &g, &is_class, &sneg)) {
                    free(g.r);
                    return false;
                }
                if (is_class) {
                    free(g.r);
                    RFAIL(p, p->i, "a class shorthand cannot end a range");
                }
            } else if (!dec_utf8(p, &hi)) {
                free(g.r);
                return false;
            }
            if (hi < lo) {
                free(g.r);
                RFAIL(p, at, "range out of order in a character class");
            }
        }
        if (!rg_add(&g, lo, hi)) {
            free(g.r);
            ROOM(p);
        }
    }
    if (peekc(p) != ']') {
        free(g.r);
        RFAIL(p, at, "unterminated character class");
    }
    p->i++;
    rg_norm(&g);
    if (neg && !rg_negate(&g)) {
        free(g.r);
        ROOM(p);
    }
    bool ok = emit_class(p, &g, at);
    free(g.r);
    return ok;
}

static bool parse_int(rx *p, long *v) {
    if (peekc(p) < '0' || peekc(p) > '9') return false;
    long x = 0;
    while (peekc(p) >= '0' && peekc(p) <= '9') {
        x = x * 10 + (peekc(p) - '0');
        if (x > KG_MAX_REPEAT) x = KG_MAX_REPEAT + 1;
        p->i++;
    }
    *v = x;
    return true;
}

static bool parse_quant(rx *p) {
    int c = peekc(p);
    size_t at = p->i;
    if (c == '*' || c == '+' || c == '?') {
        p->i++;
        if (!kg_text_add(p->o, (const char *)&p->s[at], 1)) ROOM(p);
    } else if (c == '{') {
        size_t save = p->i;
        p->i++;
        long m, n = -2;
        if (!parse_int(p, &m)) {
            p->i = save; /* a literal '{' */
            return true;
        }
        if (peekc(p) == ',') {
            p->i++;
            if (!parse_int(p, &n)) n = -1;
        }
        if (peekc(p) != '}') {
            p->i = save;
            return true;
        }
        p->i++;
        if (m > KG_MAX_REPEAT || n > KG_MAX_REPEAT) RFAIL(p, at, "repetition bound over %d", KG_MAX_REPEAT);
        if (n >= 0 && n < m) RFAIL(p, at, "repetition {%ld,%ld}: the maximum is below the minimum", m, n);
        bool ok = n == -2   ? kg_text_addf(p->o, "{%ld}", m)
                  : n == -1 ? kg_text_addf(p->o, "{%ld,}", m)
                            : kg_text_addf(p->o, "{%ld,%ld}", m, n);
        if (!ok) ROOM(p);
    } else {
        return true;
    }
    if (peekc(p) == '?') p->i++; /* lazy: the same language */
    else if (peekc(p) == '+') RFAIL(p, p->i, "possessive quantifiers are not supported");
    c = peekc(p);
    if (c == '*' || c == '+' || c == '{') RFAIL(p, p->i, "a quantifier cannot follow a quantifier");
    return true;
}

static bool parse_atom(rx *p, bool top, bool *end) {
    int c = peekc(p);
    size_t at = p->i;
    *end = false;
    switch (c) {
    case '(': {
        p->i++;
        if (peekc(p) == '?') {
            p->i++;
            int d = peekc(p);
            if (d == ':') {
                p->i++;
            } else if (d == 'P' && p->i + 1 < p->n && p->s[p->i + 1] == '<') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                p->i++;
            } else if (d == '<' && p->i + 1 < p->n && p->s[p->i + 1] != '=' && p->s[p->i + 1] != '!') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                p->i++;
            } else if (d == '=' || d == '!') {
                RFAIL(p, at, "lookahead (?%c...) is not supported", d);
            } else if (d == '<') {
                RFAIL(p, at, "lookbehind is not supported");
            } else if (d == '>') {
                RFAIL(p, at, "atomic groups are not supported");
            } else if (d == 'P' && p->i + 1 < p->n && p->s[p->i + 1] == '=') {
                RFAIL(p, at, "backreferences are not supported");
            } else {
                RFAIL(p, at, "inline flags and other (?...) groups are not supported");
            }
        }
        if (++p->depth > 200) RFAIL(p, at, "groups nested deeper than 200");
        if (!kg_text_add(p->o, "(", 1)) ROOM(p);
        if (!parse_alt(p, false)) return false;
        if (peekc(p) != ')') RFAIL(p, at, "unclosed group");
        p->i++;
        p->depth--;
        if (!kg_text_add(p->o, ")", 1)) ROOM(p);
        return true;
    }
    case '[':
        return parse_class(p);
    case '.': {
        p->i++;
        ranges g = {0};
        if (!rg_add(&g, 0, '\n' - 1) || !rg_add(&g, '\n' + 1, 0x10FFFF)) ROOM(p);
        bool ok = emit_class(p, &g, at);
        free(g.r);
        return ok;
    }
    case '\\': {
        p->i++;
        uint32_t cp;
        ranges g = {0};
        bool is_class, neg;
        if (!escape(p, &cp, &g, &is_class, &neg)) {
            free(g.r);
            return false;
        }
        bool ok;
        if (is_class) {
            rg_norm(&g);
            if (neg && !rg_negate(&g)) {
                free(g.r);
                ROOM(p);
            }
            ok = emit_class(p, &g, at);
        } else {
            ok = emit_char(p, cp, at);
        }
        free(g.r);
        return ok;
    }
    case '^':
        if (!(top && at == 0)) RFAIL(p, at, "the anchor '^' is supported only at the start");
        p->i++;
        *end = true; /* nothing emitted */
        return true;
    case '$':
        if (!(top && at + 1 == p->n)) RFAIL(p, at, "the anchor '$' is supported only at the end");
        p->i++;
        *end = true;
        return true;
    case '*': case '+': case '?':
        RFAIL(p, at, "nothing to repeat before '%c'", c);
    default: {
        uint32_t cp;
        if (!dec_utf8(p, &cp)) return false;
        return emit_char(p, cp, at);
    }
    }
}

static bool parse_concat(rx *p, bool top) {
    bool any = false;
    while (p->i < p->n && peekc(p) != '|' && peekc(p) != ')') {
        bool end;
        if (any && !kg_text_add(p->o, " ", 1)) ROOM(p);
        if (!parse_atom(p, top, &end)) return false;
        if (end) continue;
        any = true;
        if (!parse_quant(p)) return false;
    }
    if (!any && !kg_text_add(p->o, "\"\"", 2)) ROOM(p);
    return true;
}

static bool parse_alt(rx *p, bool top) {
    if (!parse_concat(p, top)) return false;
    while (peekc(p) == '|') {
        p->i++;
        if (!kg_text_add(p->o, " | ", 3)) ROOM(p);
        if (!parse_concat(p, top)) return false;
    }
    return true;
}

kiln_status kg_regex_to_gbnf(const char *re, size_t len, const char *name, bool json_string,
                             kg_text *out, kiln_error *err) {
    rx p = {.s = re ? re : "", .n = re ? len : 0, .json = json_string, .o = out, .err = err};
    if (!kg_text_addf(out, "%s ::= ", name)) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "regex: out of memory");
    if (!parse_alt(&p, true)) return p.st;
    if (p.i < p.n)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "regex: position %zu: unbalanced ')'",
                              p.i);
    if (!kg_text_add(out, "\n", 1)) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "regex: out of memory");
    return KILN_OK;
}
