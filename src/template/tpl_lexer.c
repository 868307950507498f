/* tpl_lexer.c - Jinja2 3.1 lexer (jinja2/lexer.py semantics) for the environment
 * transformers uses: default delimiters, trim_blocks=True, lstrip_blocks=True, no line
 * statements. The source given here is already newline-normalized (\r\n and \r -> \n) with
 * one trailing newline removed, as Lexer.tokeniter does.
 *
 * Whitespace control, as the Jinja2 docs ("Whitespace Control") and lexer describe it:
 *   - `{%-`, `{{-`, `{#-` strip all whitespace (Python str.rstrip) before the tag;
 *   - `-%}`, `-}}`, `-#}` strip all whitespace after it;
 *   - trim_blocks: the first newline after `%}` or `#}` is removed (not after `}}`);
 *     `+%}` / `+#}` disable that;
 *   - lstrip_blocks: whitespace (Python's \s: Unicode) between the start of a line and
 *     `{%` / `{#` is removed (not before `{{`); `{%+` / `{#+` disable that. "Start of a line" is a
 * newline within the text before the tag, or the previous token ending with a newline (or the start
 * of the template).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"

typedef struct lexer {
    tpl_arena *ar;
    const char *s;
    size_t n;
    token *tok;
    size_t ntok, cap;
    tpl_diag *d;
    size_t *line_starts;
    size_t nlines;
    size_t c_off; /* cache of the last position computed (tokens come in order) */
    int c_line, c_col;
} lexer;

static void pos_of(lexer *L, size_t off, int *line, int *col) {
    if (off >= L->c_off && L->c_line > 0) { /* walk forward from the cache: linear overall */
        int ln = L->c_line, cl = L->c_col;
        for (size_t i = L->c_off; i < off; i++) {
            unsigned char ch = (unsigned char)L->s[i];
            if (ch == '\n') {
                ln++;
                cl = 1;
            } else if ((ch & 0xC0) != 0x80) {
                cl++;
            }
        }
        L->c_off = off;
        L->c_line = ln;
        L->c_col = cl;
        *line = ln;
        *col = cl;
        return;
    }
    size_t lo = 0, hi = L->nlines; /* last line start <= off */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (L->line_starts[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    *line = (int)(lo + 1);
    *col = (int)(tpl_utf8_count(L->s + L->line_starts[lo], off - L->line_starts[lo]) + 1);
    L->c_off = off;
    L->c_line = *line;
    L->c_col = *col;
}

__attribute__((format(printf, 3, 4))) static bool lfail(lexer *L, size_t off, const char *fmt,
                                                        ...) {
    pos_of(L, off > L->n ? L->n : off, &L->d->line, &L->d->col);
    L->d->kind = KILN_TEMPLATE_ERR_SYNTAX;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->d->msg, sizeof L->d->msg, fmt, ap);
    va_end(ap);
    return false;
}

static bool oom(lexer *L, size_t off) {
    lfail(L, off, "out of memory");
    L->d->kind = KILN_TEMPLATE_ERR_MEMORY;
    return false;
}

static token *push(lexer *L, int type, size_t off, size_t len) {
    if (L->ntok == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        token *t = tpl_alloc(L->ar, nc * sizeof *t);
        if (!t) return NULL;
        if (L->ntok) memcpy(t, L->tok, L->ntok * sizeof *t);
        L->tok = t;
        L->cap = nc;
    }
    token *t = &L->tok[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->p = L->s + off;
    t->len = len;
    pos_of(L, off, &t->line, &t->col);
    return t;
}

/* Length of the Python-whitespace run at s[i..n). */
static size_t ws_run(const char *s, size_t i, size_t n) {
    size_t j = i;
    while (j < n) {
        size_t adv;
        uint32_t cp = tpl_utf8_dec(s + j, n - j, &adv);
        if (!tpl_is_space(cp)) break;
        j += adv;
    }
    return j - i;
}

/* Python str.rstrip(): new length of s[0..n). */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t adv;
        uint32_t cp = tpl_utf8_dec(s + k, n - k, &adv);
        if (!tpl_is_space(cp)) break;
        n = k;
    }
    return n;
}

static bool emit_data(lexer *L, size_t off, size_t len) {
    if (len == 0) return true;
    token *t = push(L, T_DATA, off, len);
    if (!t) return oom(L, off);
    t->s = tpl_str_new(L->ar, L->s + off, len);
    return t->s ? true : oom(L, off);
}

/* Apply the start tag's whitespace control (sign '-', '+' or 0) to the text before it. */
static size_t control_text(const lexer *L, size_t off, size_t len, char sign, bool is_var,
                           bool line_starting) {
    if (sign == '-') return rstrip_len(L->s + off, len);
    if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t k = len; k > 0; k--) {
            if (L->s[off + k - 1] == '\n') {
                l_pos = k;
                break;
            }
        }
        if (l_pos > 0 || line_starting) {
            /* Jinja2 3.1.6: whitespace_re (\s+, Unicode) must match all of text[l_pos:] */
            if (l_pos < len && ws_run(L->s, off + l_pos, off + len) == len - l_pos) return l_pos;
        }
    }
    return len;
}

/* Does `{%` [sign] \s* raw \s* (-%}\s* | %}) start at i? Returns the end offset or 0. */
static size_t match_raw_begin(const lexer *L, size_t i, char *sign) {
    const char *s = L->s;
    size_t n = L->n, j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    j += ws_run(s, j, n);
    if (n - j < 3 || memcmp(s + j, "raw", 3) != 0) return 0;
    j += 3;
    j += ws_run(s, j, n);
    if (n - j >= 3 && memcmp(s + j, "-%}", 3) == 0) return j + 3 + ws_run(s, j + 3, n);
    if (n - j >= 2 && memcmp(s + j, "%}", 2) == 0) return j + 2;
    return 0;
}

/* Find `{%` [sign] \s* endraw \s* (+%} | -%}\s* | %}\n?) from i: start and end offsets. */
static bool find_raw_end(const lexer *L, size_t i, size_t *start, size_t *end, char *sign) {
    const char *s = L->s;
    size_t n = L->n;
    for (size_t p = i; p + 1 < n; p++) {
        if (s[p] != '{' || s[p + 1] != '%') continue;
        size_t j = p + 2;
        char sg = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) sg = s[j++];
        j += ws_run(s, j, n);
        if (n - j < 6 || memcmp(s + j, "endraw", 6) != 0) continue;
        j += 6;
        j += ws_run(s, j, n);
        size_t e = 0;
        if (n - j >= 3 && memcmp(s + j, "+%}", 3) == 0)
            e = j + 3;
        else if (n - j >= 3 && memcmp(s + j, "-%}", 3) == 0)
            e = j + 3 + ws_run(s, j + 3, n);
        else if (n - j >= 2 && memcmp(s + j, "%}", 2) == 0)
            e = j + 2 + (j + 2 < n && s[j + 2] == '\n');
        if (!e) continue;
        *start = p;
        *end = e;
        *sign = sg;
        return true;
    }
    return false;
}

static bool is_name_cp(uint32_t cp) {
    if (cp < 0x80)
        return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z');
    return tpl_is_alpha(cp) || tpl_is_digit(cp);
}

static bool hexval(char c, int *v) {
    if (c >= '0' && c <= '9')
        *v = c - '0';
    else if ((c | 32) >= 'a' && (c | 32) <= 'f')
        *v = (c | 32) - 'a' + 10;
    else
        return false;
    return true;
}

/* Python's str.encode('ascii', 'backslashreplace').decode('unicode-escape') of a literal's
 * body, which is how Jinja2 unescapes string literals. */
static bool decode_string(lexer *L, size_t off, const char *s, size_t n, const tstr **out) {
    char *buf = tpl_alloc(L->ar, n * 2 + 16); /* '\é' grows to '\xe9' (at most 2x + 6) */
    if (!buf) return oom(L, off);
    size_t o = 0, i = 0;
    while (i < n) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            buf[o++] = c;
            i++;
            continue;
        }
        char e = s[i + 1];
        if ((unsigned char)e >= 0x80) { /* backslashreplace, then '\\' decodes to '\' */
            size_t adv;
            uint32_t cp = tpl_utf8_dec(s + i + 1, n - i - 1, &adv);
            o += (size_t)sprintf(buf + o,
                                 cp <= 0xFF     ? "\\x%02x"
                                 : cp <= 0xFFFF ? "\\u%04x"
                                                : "\\U%08x",
                                 cp);
            i += 1 + adv;
            continue;
        }
        i += 2;
        uint32_t cp;
        switch (e) {
        case '\n':
            continue;
        case '\\':
            buf[o++] = '\\';
            continue;
        case '\'':
            buf[o++] = '\'';
            continue;
        case '"':
            buf[o++] = '"';
            continue;
        case 'a':
            buf[o++] = '\a';
            continue;
        case 'b':
            buf[o++] = '\b';
            continue;
        case 'f':
            buf[o++] = '\f';
            continue;
        case 'n':
            buf[o++] = '\n';
            continue;
        case 'r':
            buf[o++] = '\r';
            continue;
        case 't':
            buf[o++] = '\t';
            continue;
        case 'v':
            buf[o++] = '\v';
            continue;
        case 'x':
        case 'u':
        case 'U': {
            int need = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < need; k++) {
                int v;
                if (i >= n || !hexval(s[i], &v))
                    return lfail(L, off, "truncated \\%c%s escape", e,
                                 e == 'x'   ? "XX"
                                 : e == 'u' ? "XXXX"
                                            : "XXXXXXXX");
                cp = cp * 16 + (uint32_t)v;
                i++;
            }
            break;
        }
        case 'N':
            return lfail(L, off, "unsupported: \\N{...} escapes in string literals");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                break;
            }
            buf[o++] = '\\';
            buf[o++] = e;
            continue;
        }
        if (cp > 0x10FFFF) return lfail(L, off, "illegal Unicode character");
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return lfail(L, off, "unsupported: lone surrogate in a string literal");
        o += tpl_utf8_enc(cp, buf + o);
    }
    *out = tpl_str_new(L->ar, buf, o);
    return *out ? true : oom(L, off);
}

/* Python int/float literal regexes of jinja2/lexer.py. Return match length or 0. */
static size_t digits_us(const char *s, size_t i, size_t n) { /* (\d+_)*\d+ */
    size_t j = i;
    if (j >= n || s[j] < '0' || s[j] > '9') return 0;
    for (;;) {
        while (j < n && s[j] >= '0' && s[j] <= '9') j++;
        if (j + 1 < n && s[j] == '_' && s[j + 1] >= '0' && s[j + 1] <= '9') {
            j++;
            continue;
        }
        return j - i;
    }
}

static size_t match_float(const char *s, size_t i, size_t n) {
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t a = digits_us(s, i, n);
    if (!a) return 0;
    size_t j = i + a;
    size_t frac = 0;
    if (j < n && s[j] == '.') frac = digits_us(s, j + 1, n);
    size_t k = frac ? j + 1 + frac : j;
    if (k < n && (s[k] | 32) == 'e') { /* exponent alternative */
        size_t m = k + 1;
        if (m < n && (s[m] == '+' || s[m] == '-')) m++;
        size_t ex = digits_us(s, m, n);
        if (ex) return m + ex - i;
    }
    if (frac) return j + 1 + frac - i;
    return 0;
}

static size_t match_int(const char *s, size_t i, size_t n, int *base) {
    if (s[i] == '0' && i + 1 < n) {
        char p = (char)(s[i + 1] | 32);
        int b = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
        if (b) {
            size_t j = i + 2;
            for (;;) {
                size_t k = j;
                if (k < n && s[k] == '_') k++;
                int v;
                if (k < n && hexval(s[k], &v) && v < b) {
                    j = k + 1;
                    continue;
                }
                break;
            }
            if (j > i + 2) {
                *base = b;
                return j - i;
            }
        }
    }
    *base = 10;
    if (s[i] >= '1' && s[i] <= '9') {
        size_t j = i + 1;
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_') k++;
            if (k < n && s[k] >= '0' && s[k] <= '9') {
                j = k + 1;
                continue;
            }
            return j - i;
        }
    }
    if (s[i] == '0') {
        size_t j = i + 1;
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_') k++;
            if (k < n && s[k] == '0') {
                j = k + 1;
                continue;
            }
            return j - i;
        }
    }
    return 0;
}

static const struct {
    const char *op;
    int type;
} ops[] = {
    {"//", T_FLOORDIV}, {"**", T_POW},   {"==", T_EQ},      {"!=", T_NE},      {">=", T_GTEQ},
    {"<=", T_LTEQ},     {"+", T_ADD},    {"-", T_SUB},      {"/", T_DIV},      {"*", T_MUL},
    {"%", T_MOD},       {"~", T_TILDE},  {"[", T_LBRACKET}, {"]", T_RBRACKET}, {"(", T_LPAREN},
    {")", T_RPAREN},    {"{", T_LBRACE}, {"}", T_RBRACE},   {">", T_GT},       {"<", T_LT},
    {"=", T_ASSIGN},    {".", T_DOT},    {":", T_COLON},    {"|", T_PIPE},     {",", T_COMMA},
    {";", T_SEMICOLON},
};

enum { MAX_BALANCE = 256 };

/* Lex the inside of a `{{` or `{%` tag from i. On success *end is the offset after the end
 * delimiter (whitespace control applied) and *line_starting tells whether it ended with \n. */
static bool lex_tag(lexer *L, size_t i, bool is_block, size_t *end, bool *line_starting) {
    const char *s = L->s;
    size_t n = L->n;
    char stack[MAX_BALANCE];
    size_t depth = 0;
    size_t tag_start = i;
    while (i < n) {
        if (depth == 0) {
            size_t e = 0;
            if (is_block) {
                if (n - i >= 3 && memcmp(s + i, "+%}", 3) == 0)
                    e = i + 3;
                else if (n - i >= 3 && memcmp(s + i, "-%}", 3) == 0)
                    e = i + 3 + ws_run(s, i + 3, n);
                else if (n - i >= 2 && memcmp(s + i, "%}", 2) == 0)
                    e = i + 2 + (i + 2 < n && s[i + 2] == '\n');
            } else {
                if (n - i >= 3 && memcmp(s + i, "-}}", 3) == 0)
                    e = i + 3 + ws_run(s, i + 3, n);
                else if (n - i >= 2 && memcmp(s + i, "}}", 2) == 0)
                    e = i + 2;
            }
            if (e) {
                if (!push(L, is_block ? T_BEND : T_VEND, i, e - i)) return oom(L, i);
                *end = e;
                *line_starting = s[e - 1] == '\n';
                return true;
            }
        }
        size_t w = ws_run(s, i, n);
        if (w) {
            i += w;
            continue;
        }
        size_t m;
        int base;
        if ((m = match_float(s, i, n))) {
            char tmp[64];
            size_t k = 0;
            for (size_t j = 0; j < m && k < sizeof tmp - 1; j++)
                if (s[i + j] != '_') tmp[k++] = s[i + j];
            tmp[k] = 0;
            token *t = push(L, T_FLOAT, i, m);
            if (!t) return oom(L, i);
            t->f = strtod(tmp, NULL);
            i += m;
            continue;
        }
        if ((m = match_int(s, i, n, &base))) {
            token *t = push(L, T_INT, i, m);
            if (!t) return oom(L, i);
            size_t j = base == 10 ? i : i + 2;
            uint64_t v = 0;
            for (; j < i + m; j++) {
                int d;
                if (s[j] == '_' || !hexval(s[j], &d)) continue;
                if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base ||
                    v * (uint64_t)base + (uint64_t)d > (uint64_t)INT64_MAX)
                    return lfail(L, i, "unsupported: integer literal beyond 64 bits");
                v = v * (uint64_t)base + (uint64_t)d;
            }
            t->i = (int64_t)v;
            i += m;
            continue;
        }
        {
            size_t adv;
            uint32_t cp = tpl_utf8_dec(s + i, n - i, &adv);
            if (is_name_cp(cp)) {
                size_t j = i;
                while (j < n) {
                    cp = tpl_utf8_dec(s + j, n - j, &adv);
                    if (!is_name_cp(cp)) break;
                    j += adv;
                }
                cp = tpl_utf8_dec(s + i, n - i, &adv);
                if (tpl_is_digit(cp)) return lfail(L, i, "Invalid character in identifier");
                token *t = push(L, T_NAME, i, j - i);
                if (!t) return oom(L, i);
                t->s = tpl_str_new(L->ar, s + i, j - i);
                if (!t->s) return oom(L, i);
                i = j;
                continue;
            }
        }
        if (s[i] == '\'' || s[i] == '"') {
            char q = s[i];
            size_t j = i + 1;
            while (j < n && s[j] != q) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j >= n) return lfail(L, i, "unexpected char '%c' at %zu", q, i);
            token *t = push(L, T_STRING, i, j + 1 - i);
            if (!t) return oom(L, i);
            if (!decode_string(L, i, s + i + 1, j - i - 1, &t->s)) return false;
            i = j + 1;
            continue;
        }
        int type = -1;
        size_t olen = 0;
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            size_t l = strlen(ops[k].op);
            if (n - i >= l && memcmp(s + i, ops[k].op, l) == 0) {
                type = ops[k].type;
                olen = l;
                break;
            }
        }
        if (type < 0) {
            size_t adv;
            uint32_t cp = tpl_utf8_dec(s + i, n - i, &adv);
            if (cp < 0x80 && cp >= 0x20)
                return lfail(L, i, "unexpected char '%c' at %zu", (char)cp, i);
            return lfail(L, i, "unexpected char U+%04X at %zu", cp, i);
        }
        if (type == T_LBRACE || type == T_LPAREN || type == T_LBRACKET) {
            if (depth == MAX_BALANCE) return lfail(L, i, "brackets nested too deeply");
            stack[depth++] = type == T_LBRACE ? '}' : type == T_LPAREN ? ')' : ']';
        } else if (type == T_RBRACE || type == T_RPAREN || type == T_RBRACKET) {
            if (depth == 0) return lfail(L, i, "unexpected '%c'", s[i]);
            char want = stack[--depth];
            if (want != s[i]) return lfail(L, i, "unexpected '%c', expected '%c'", s[i], want);
        }
        if (!push(L, type, i, olen)) return oom(L, i);
        i += olen;
    }
    (void)tag_start;
    *end = n;
    *line_starting = false;
    return true; /* the parser reports the missing end of the tag */
}

bool tpl_lex(tpl_arena *ar, const char *src, size_t n, token **out, size_t *ntok, tpl_diag *d) {
    lexer L = {.ar = ar, .s = src, .n = n, .d = d};
    size_t nl = 1;
    for (size_t k = 0; k < n; k++) nl += src[k] == '\n';
    L.line_starts = tpl_alloc(ar, nl * sizeof(size_t));
    if (!L.line_starts) return oom(&L, 0);
    L.line_starts[0] = 0;
    L.nlines = 1;
    for (size_t k = 0; k < n; k++)
        if (src[k] == '\n') L.line_starts[L.nlines++] = k + 1;

    size_t pos = 0;
    bool line_starting = true;
    while (pos < n) {
        /* the next tag start: {{, {% or {# */
        size_t i = pos;
        const char *hit = NULL;
        while (i + 1 < n) {
            hit = memchr(src + i, '{', n - i - 1);
            if (!hit) break;
            i = (size_t)(hit - src);
            char c = src[i + 1];
            if (c == '{' || c == '%' || c == '#') break;
            i++;
            hit = NULL;
        }
        if (!hit) {
            if (!emit_data(&L, pos, n - pos)) return false;
            break;
        }
        char kind = src[i + 1];
        char sign = 0;
        size_t raw_end = kind == '%' ? match_raw_begin(&L, i, &sign) : 0;
        if (!raw_end)
            sign = (i + 2 < n && (src[i + 2] == '-' || src[i + 2] == '+')) ? src[i + 2] : 0;
        size_t tlen = control_text(&L, pos, i - pos, sign, kind == '{', line_starting);
        if (!emit_data(&L, pos, tlen)) return false;
        if (raw_end) {
            size_t rs, re;
            char rsign;
            if (!find_raw_end(&L, raw_end, &rs, &re, &rsign))
                return lfail(&L, i, "Missing end of raw directive");
            bool ls = src[raw_end - 1] == '\n';
            size_t rl = control_text(&L, raw_end, rs - raw_end, rsign, false, ls);
            if (!emit_data(&L, raw_end, rl)) return false;
            pos = re;
            line_starting = src[re - 1] == '\n';
            continue;
        }
        size_t inner = i + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = 0;
            for (size_t p = inner; p + 1 < n && !e; p++) {
                if (src[p] == '+' && p + 2 < n && src[p + 1] == '#' && src[p + 2] == '}')
                    e = p + 3;
                else if (src[p] == '-' && p + 2 < n && src[p + 1] == '#' && src[p + 2] == '}')
                    e = p + 3 + ws_run(src, p + 3, n);
                else if (src[p] == '#' && src[p + 1] == '}')
                    e = p + 2 + (p + 2 < n && src[p + 2] == '\n');
            }
            if (!e) return lfail(&L, i, "Missing end of comment tag");
            pos = e;
            line_starting = src[e - 1] == '\n';
            continue;
        }
        bool is_block = kind == '%';
        if (!push(&L, is_block ? T_BBEGIN : T_VBEGIN, i, inner - i)) return oom(&L, i);
        size_t end = n;
        if (!lex_tag(&L, inner, is_block, &end, &line_starting)) return false;
        pos = end;
    }
    if (!push(&L, T_EOF, n, 0)) return oom(&L, n);
    *out = L.tok;
    *ntok = L.ntok;
    return true;
}
