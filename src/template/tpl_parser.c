/* tpl_parser.c - Jinja2 3.1 parser (jinja2/parser.py grammar) producing the AST of tpl.h.
 *
 * Expression precedence, loosest first (Jinja2 "Template Designer Documentation",
 * "Expressions"): `a if c else b`, or, and, not, comparisons (== != < <= > >= in, not in;
 * chained), + -, ~, * / // %, **, unary - +, then postfix `.attr`, `[key]`, `[a:b:c]`,
 * calls, and finally filters `|f(...)` and tests `is [not] t(...)`, which bind tighter than
 * every binary operator (so `-x|abs` is `-(x|abs)` and `'a' + x|trim` trims only x).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

enum { MAX_PARSE_DEPTH = 256, MAX_EXPR_HEIGHT = 1000 };

typedef struct parser {
    tpl_arena *ar;
    token *t;
    size_t n, i;
    tpl_diag *d;
    int depth;
    int loop_depth; /* break/continue are valid when > 0 */
    signature *sig; /* innermost macro/caller signature: records caller/varargs/kwargs use */
} parser;

static const char *tok_desc(int type) {
    switch (type) {
    case T_EOF:
        return "end of template";
    case T_DATA:
        return "template data";
    case T_VBEGIN:
        return "begin of print statement";
    case T_VEND:
        return "end of print statement";
    case T_BBEGIN:
        return "begin of statement block";
    case T_BEND:
        return "end of statement block";
    case T_NAME:
        return "name";
    case T_STRING:
        return "string";
    case T_INT:
        return "integer";
    case T_FLOAT:
        return "float";
    default:
        return NULL;
    }
}

static void describe(const token *tk, char *buf, size_t cap) {
    const char *d = tok_desc(tk->type);
    if (tk->type == T_NAME || (!d && tk->len))
        snprintf(buf, cap, "%.*s", (int)(tk->len > 60 ? 60 : tk->len), tk->p);
    else
        snprintf(buf, cap, "%s", d ? d : "?");
}

__attribute__((format(printf, 3, 4))) static bool pfail(parser *P, const token *tk, const char *fmt,
                                                        ...) {
    if (P->d->kind != KILN_TEMPLATE_OK) return false; /* keep the first error */
    P->d->kind = KILN_TEMPLATE_ERR_SYNTAX;
    P->d->line = tk->line;
    P->d->col = tk->col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->d->msg, sizeof P->d->msg, fmt, ap);
    va_end(ap);
    return false;
}

static bool poom(parser *P) {
    pfail(P, &P->t[P->i], "out of memory");
    P->d->kind = KILN_TEMPLATE_ERR_MEMORY;
    return false;
}

static token *cur(parser *P) {
    return &P->t[P->i];
}

static token *look(parser *P) {
    return P->i + 1 < P->n ? &P->t[P->i + 1] : &P->t[P->n - 1];
}

static token *advance(parser *P) {
    token *t = &P->t[P->i];
    if (P->i + 1 < P->n) P->i++;
    return t;
}

static bool is_name(const token *t, const char *name) {
    return t->type == T_NAME && t->len == strlen(name) && memcmp(t->p, name, t->len) == 0;
}

static bool skip_name(parser *P, const char *name) {
    if (!is_name(cur(P), name)) return false;
    advance(P);
    return true;
}

static bool skip_type(parser *P, int type) {
    if (cur(P)->type != type) return false;
    advance(P);
    return true;
}

static const char *op_text(int type) {
    switch (type) {
    case T_ADD:
        return "+";
    case T_SUB:
        return "-";
    case T_DIV:
        return "/";
    case T_FLOORDIV:
        return "//";
    case T_MUL:
        return "*";
    case T_MOD:
        return "%";
    case T_POW:
        return "**";
    case T_TILDE:
        return "~";
    case T_LBRACKET:
        return "[";
    case T_RBRACKET:
        return "]";
    case T_LPAREN:
        return "(";
    case T_RPAREN:
        return ")";
    case T_LBRACE:
        return "{";
    case T_RBRACE:
        return "}";
    case T_EQ:
        return "==";
    case T_NE:
        return "!=";
    case T_GT:
        return ">";
    case T_GTEQ:
        return ">=";
    case T_LT:
        return "<";
    case T_LTEQ:
        return "<=";
    case T_ASSIGN:
        return "=";
    case T_DOT:
        return ".";
    case T_COLON:
        return ":";
    case T_PIPE:
        return "|";
    case T_COMMA:
        return ",";
    case T_SEMICOLON:
        return ";";
    default:
        return tok_desc(type);
    }
}

static token *expect(parser *P, int type) {
    token *t = cur(P);
    if (t->type != type) {
        char got[80];
        describe(t, got, sizeof got);
        if (t->type == T_EOF)
            pfail(P, t, "unexpected end of template, expected '%s'", op_text(type));
        else
            pfail(P, t, "expected token '%s', got '%s'", op_text(type), got);
        return NULL;
    }
    return advance(P);
}

static token *expect_name(parser *P, const char *name) {
    token *t = cur(P);
    if (!is_name(t, name)) {
        char got[80];
        describe(t, got, sizeof got);
        pfail(P, t, "expected token '%s', got '%s'", name, got);
        return NULL;
    }
    return advance(P);
}

static expr *new_expr(parser *P, int kind, const token *at) {
    expr *e = tpl_zalloc(P->ar, sizeof *e);
    if (!e) {
        poom(P);
        return NULL;
    }
    e->kind = (uint8_t)kind;
    e->line = at->line;
    e->col = at->col;
    return e;
}

/* Growable pointer vector in the arena. */
typedef struct pvec {
    void **v;
    size_t n, cap;
} pvec;

static bool pvec_push(parser *P, pvec *v, void *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        void **nv = tpl_alloc(P->ar, nc * sizeof *nv);
        if (!nv) return poom(P);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return true;
}

static expr *parse_expression(parser *P, bool with_condexpr);
static expr *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                         bool explicit_parens, bool with_namespace);
static expr *parse_primary(parser *P, bool with_namespace);
static expr *parse_postfix(parser *P, expr *node);
static expr *parse_unary(parser *P, bool with_filter);
static bool parse_body(parser *P, const char *const *end, body *out);

static bool enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH) {
        pfail(P, cur(P), "template nested too deeply (more than %d levels)", MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

static void note_special_name(parser *P, const tstr *name) {
    if (!P->sig) return;
    if (tpl_str_eq(name, "caller")) P->sig->uses_caller = true;
    if (tpl_str_eq(name, "varargs")) P->sig->uses_varargs = true;
    if (tpl_str_eq(name, "kwargs")) P->sig->uses_kwargs = true;
}

static bool parse_call_args(parser *P, callargs *a) {
    token *lp = expect(P, T_LPAREN);
    if (!lp) return false;
    pvec args = {0}, kws = {0};
    bool require_comma = false;
    memset(a, 0, sizeof *a);
    while (cur(P)->type != T_RPAREN) {
        if (require_comma) {
            if (!expect(P, T_COMMA)) return false;
            if (cur(P)->type == T_RPAREN) break;
        }
        if (cur(P)->type == T_MUL) {
            if (a->dyn_args || a->dyn_kwargs)
                return pfail(P, lp, "invalid syntax for function call expression");
            advance(P);
            if (!(a->dyn_args = parse_expression(P, true))) return false;
        } else if (cur(P)->type == T_POW) {
            if (a->dyn_kwargs) return pfail(P, lp, "invalid syntax for function call expression");
            advance(P);
            if (!(a->dyn_kwargs = parse_expression(P, true))) return false;
        } else if (cur(P)->type == T_NAME && look(P)->type == T_ASSIGN) {
            if (a->dyn_kwargs) return pfail(P, lp, "invalid syntax for function call expression");
            kwarg *k = tpl_alloc(P->ar, sizeof *k);
            if (!k) return poom(P);
            k->name = cur(P)->s;
            advance(P);
            advance(P);
            if (!(k->value = parse_expression(P, true))) return false;
            if (!pvec_push(P, &kws, k)) return false;
        } else {
            if (a->dyn_args || a->dyn_kwargs || kws.n)
                return pfail(P, lp, "invalid syntax for function call expression");
            expr *e = parse_expression(P, true);
            if (!e || !pvec_push(P, &args, e)) return false;
        }
        require_comma = true;
    }
    if (!expect(P, T_RPAREN)) return false;
    a->args = (expr **)args.v;
    a->nargs = args.n;
    if (kws.n) {
        a->kw = tpl_alloc(P->ar, kws.n * sizeof *a->kw);
        if (!a->kw) return poom(P);
        for (size_t k = 0; k < kws.n; k++) a->kw[k] = *(kwarg *)kws.v[k];
    }
    a->nkw = kws.n;
    return true;
}

static expr *parse_call(parser *P, expr *fn) {
    expr *e = new_expr(P, E_CALL, cur(P));
    if (!e) return NULL;
    e->call.fn = fn;
    if (!parse_call_args(P, &e->call.a)) return NULL;
    return e;
}

/* `name(.name)*` after | or is, as Jinja2 allows dotted filter/test names. */
static bool dotted_name(parser *P, char *buf, size_t cap, token **first) {
    token *t = expect(P, T_NAME);
    if (!t) return false;
    *first = t;
    snprintf(buf, cap, "%.*s", (int)t->len, t->p);
    while (cur(P)->type == T_DOT) {
        advance(P);
        token *u = expect(P, T_NAME);
        if (!u) return false;
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, ".%.*s", (int)u->len, u->p);
    }
    return true;
}

static expr *parse_filter(parser *P, expr *node, bool start_inline) {
    while (cur(P)->type == T_PIPE || start_inline) {
        if (!start_inline) advance(P);
        char name[128];
        token *nt;
        if (!dotted_name(P, name, sizeof name, &nt)) return NULL;
        /* unknown filters are checked after parsing (check_names), as Jinja2 defers the check
           to run time inside if statements and conditional expressions */
        int id = tpl_filter_id(name, strlen(name));
        expr *f = new_expr(P, E_FILTER, nt);
        if (!f) return NULL;
        f->flt.obj = node;
        f->flt.id = id;
        if (!(f->flt.name = tpl_str_new(P->ar, name, strlen(name)))) {
            poom(P);
            return NULL;
        }
        if (cur(P)->type == T_LPAREN && !parse_call_args(P, &f->flt.a)) return NULL;
        node = f;
        start_inline = false;
    }
    return node;
}

static expr *parse_test(parser *P, expr *node) {
    token *is = advance(P);
    bool negated = skip_name(P, "not");
    char name[128];
    token *nt;
    if (!dotted_name(P, name, sizeof name, &nt)) return NULL;
    int id = tpl_test_id(name, strlen(name));
    expr *t = new_expr(P, E_TEST, is);
    if (!t) return NULL;
    t->flt.obj = node;
    t->flt.id = id;
    t->line = nt->line;
    t->col = nt->col;
    if (!(t->flt.name = tpl_str_new(P->ar, name, strlen(name)))) {
        poom(P);
        return NULL;
    }
    token *c = cur(P);
    if (c->type == T_LPAREN) {
        if (!parse_call_args(P, &t->flt.a)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT ||
                c->type == T_FLOAT || c->type == T_LBRACKET || c->type == T_LBRACE) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            pfail(P, c, "You cannot chain multiple tests with is");
            return NULL;
        }
        if (!enter(P)) return NULL;
        expr *arg = parse_primary(P, false);
        if (arg) arg = parse_postfix(P, arg);
        P->depth--;
        if (!arg) return NULL;
        t->flt.a.args = tpl_alloc(P->ar, sizeof(expr *));
        if (!t->flt.a.args) {
            poom(P);
            return NULL;
        }
        t->flt.a.args[0] = arg;
        t->flt.a.nargs = 1;
    }
    if (negated) {
        expr *n = new_expr(P, E_NOT, is);
        if (!n) return NULL;
        n->bin.a = t;
        return n;
    }
    return t;
}

static expr *parse_subscribed(parser *P) {
    token *start = cur(P);
    expr *args[3] = {NULL, NULL, NULL};
    if (cur(P)->type == T_COLON) {
        advance(P);
    } else {
        expr *node = parse_expression(P, true);
        if (!node) return NULL;
        if (cur(P)->type != T_COLON) return node;
        advance(P);
        args[0] = node;
    }
    if (cur(P)->type != T_COLON && cur(P)->type != T_RBRACKET && cur(P)->type != T_COMMA) {
        if (!(args[1] = parse_expression(P, true))) return NULL;
    }
    if (cur(P)->type == T_COLON) {
        advance(P);
        if (cur(P)->type != T_RBRACKET && cur(P)->type != T_COMMA) {
            if (!(args[2] = parse_expression(P, true))) return NULL;
        }
    }
    expr *s = new_expr(P, E_SLICE, start);
    if (!s) return NULL;
    s->sl.lo = args[0];
    s->sl.hi = args[1];
    s->sl.step = args[2];
    return s;
}

static expr *parse_subscript(parser *P, expr *node) {
    token *t = advance(P);
    if (t->type == T_DOT) {
        token *a = advance(P);
        if (a->type == T_NAME) {
            expr *e = new_expr(P, E_GETATTR, t);
            if (!e) return NULL;
            e->ga.obj = node;
            e->ga.attr = a->s;
            return e;
        }
        if (a->type != T_INT) {
            pfail(P, a, "expected name or number");
            return NULL;
        }
        expr *k = new_expr(P, E_CONST, a);
        expr *e = new_expr(P, E_GETITEM, t);
        if (!k || !e) return NULL;
        k->cval.type = TV_INT;
        k->cval.i = a->i;
        e->gi.obj = node;
        e->gi.key = k;
        return e;
    }
    /* '[' */
    pvec args = {0};
    while (cur(P)->type != T_RBRACKET) {
        if (args.n && !expect(P, T_COMMA)) return NULL;
        if (cur(P)->type == T_EOF) {
            expect(P, T_RBRACKET);
            return NULL;
        }
        expr *a = parse_subscribed(P);
        if (!a || !pvec_push(P, &args, a)) return NULL;
    }
    if (!expect(P, T_RBRACKET)) return NULL;
    expr *key; /* x[] is x[()], as Jinja2 parses it */
    if (args.n == 1) {
        key = args.v[0];
    } else {
        key = new_expr(P, E_TUPLE, t);
        if (!key) return NULL;
        key->seq.items = (expr **)args.v;
        key->seq.n = args.n;
    }
    expr *e = new_expr(P, E_GETITEM, t);
    if (!e) return NULL;
    e->gi.obj = node;
    e->gi.key = key;
    return e;
}

static expr *parse_postfix(parser *P, expr *node) {
    while (node) {
        int tt = cur(P)->type;
        if (tt == T_DOT || tt == T_LBRACKET)
            node = parse_subscript(P, node);
        else if (tt == T_LPAREN)
            node = parse_call(P, node);
        else
            break;
    }
    return node;
}

static expr *parse_filter_expr(parser *P, expr *node) {
    while (node) {
        token *c = cur(P);
        if (c->type == T_PIPE)
            node = parse_filter(P, node, false);
        else if (is_name(c, "is"))
            node = parse_test(P, node);
        else if (c->type == T_LPAREN)
            node = parse_call(P, node);
        else
            break;
    }
    return node;
}

static expr *parse_list(parser *P) {
    token *t = expect(P, T_LBRACKET);
    if (!t) return NULL;
    pvec items = {0};
    while (cur(P)->type != T_RBRACKET) {
        if (items.n && !expect(P, T_COMMA)) return NULL;
        if (cur(P)->type == T_RBRACKET) break;
        expr *e = parse_expression(P, true);
        if (!e || !pvec_push(P, &items, e)) return NULL;
    }
    if (!expect(P, T_RBRACKET)) return NULL;
    expr *e = new_expr(P, E_LIST, t);
    if (!e) return NULL;
    e->seq.items = (expr **)items.v;
    e->seq.n = items.n;
    return e;
}

static expr *parse_dict(parser *P) {
    token *t = expect(P, T_LBRACE);
    if (!t) return NULL;
    pvec keys = {0}, vals = {0};
    while (cur(P)->type != T_RBRACE) {
        if (keys.n && !expect(P, T_COMMA)) return NULL;
        if (cur(P)->type == T_RBRACE) break;
        expr *k = parse_expression(P, true);
        if (!k || !expect(P, T_COLON)) return NULL;
        expr *v = parse_expression(P, true);
        if (!v || !pvec_push(P, &keys, k) || !pvec_push(P, &vals, v)) return NULL;
    }
    if (!expect(P, T_RBRACE)) return NULL;
    expr *e = new_expr(P, E_DICT, t);
    if (!e) return NULL;
    e->dict.keys = (expr **)keys.v;
    e->dict.vals = (expr **)vals.v;
    e->dict.n = keys.n;
    return e;
}

static expr *parse_primary(parser *P, bool with_namespace) {
    token *t = cur(P);
    expr *e;
    switch (t->type) {
    case T_NAME:
        advance(P);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
            is_name(t, "False")) {
            if (!(e = new_expr(P, E_CONST, t))) return NULL;
            e->cval.type = TV_BOOL;
            e->cval.b = t->p[0] == 't' || t->p[0] == 'T';
            return e;
        }
        if (is_name(t, "none") || is_name(t, "None")) {
            if (!(e = new_expr(P, E_CONST, t))) return NULL;
            e->cval.type = TV_NONE;
            return e;
        }
        if (with_namespace && cur(P)->type == T_DOT) {
            advance(P);
            token *a = expect(P, T_NAME);
            if (!a || !(e = new_expr(P, E_NSREF, t))) return NULL;
            e->nm.name = t->s;
            e->nm.attr = a->s;
            return e;
        }
        if (!(e = new_expr(P, E_NAME, t))) return NULL;
        e->nm.name = t->s;
        note_special_name(P, t->s);
        return e;
    case T_STRING: {
        advance(P);
        const tstr *s = t->s;
        if (cur(P)->type == T_STRING) { /* adjacent literals concatenate */
            size_t total = s->len;
            for (size_t k = P->i; P->t[k].type == T_STRING; k++) total += P->t[k].s->len;
            char *buf = tpl_alloc(P->ar, total + 1);
            if (!buf) {
                poom(P);
                return NULL;
            }
            memcpy(buf, s->s, s->len);
            size_t o = s->len;
            while (cur(P)->type == T_STRING) {
                memcpy(buf + o, cur(P)->s->s, cur(P)->s->len);
                o += cur(P)->s->len;
                advance(P);
            }
            if (!(s = tpl_str_new(P->ar, buf, o))) {
                poom(P);
                return NULL;
            }
        }
        if (!(e = new_expr(P, E_CONST, t))) return NULL;
        e->cval.type = TV_STR;
        e->cval.s = s;
        return e;
    }
    case T_INT:
    case T_FLOAT:
        advance(P);
        if (!(e = new_expr(P, E_CONST, t))) return NULL;
        if (t->type == T_INT) {
            e->cval.type = TV_INT;
            e->cval.i = t->i;
        } else {
            e->cval.type = TV_FLOAT;
            e->cval.f = t->f;
        }
        return e;
    case T_LPAREN:
        advance(P);
        if (!enter(P)) return NULL;
        e = parse_tuple(P, false, true, NULL, true, false);
        P->depth--;
        if (!e || !expect(P, T_RPAREN)) return NULL;
        return e;
    case T_LBRACKET:
        if (!enter(P)) return NULL;
        e = parse_list(P);
        P->depth--;
        return e;
    case T_LBRACE:
        if (!enter(P)) return NULL;
        e = parse_dict(P);
        P->depth--;
        return e;
    default: {
        char got[80];
        describe(t, got, sizeof got);
        pfail(P, t, "unexpected '%s'", got);
        return NULL;
    }
    }
}

static expr *parse_unary(parser *P, bool with_filter) {
    token *t = cur(P);
    expr *node;
    if (!enter(P)) return NULL;
    if (t->type == T_SUB || t->type == T_ADD) {
        advance(P);
        node = new_expr(P, t->type == T_SUB ? E_NEG : E_POS, t);
        if (node && !(node->bin.a = parse_unary(P, false))) node = NULL;
    } else {
        node = parse_primary(P, false);
    }
    P->depth--;
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    return node;
}

static expr *bin(parser *P, int kind, int op, token *at, expr *a, expr *b) {
    if (!a || !b) return NULL;
    expr *e = new_expr(P, kind, at);
    if (!e) return NULL;
    e->op = (uint8_t)op;
    e->bin.a = a;
    e->bin.b = b;
    return e;
}

static expr *parse_pow(parser *P) {
    expr *left = parse_unary(P, true);
    while (left && cur(P)->type == T_POW) {
        token *t = advance(P);
        left = bin(P, E_BIN, OP_POW, t, left, parse_unary(P, true));
    }
    return left;
}

static expr *parse_math2(parser *P) {
    expr *left = parse_pow(P);
    for (;;) {
        int tt = cur(P)->type;
        int op = tt == T_MUL        ? OP_MUL
                 : tt == T_DIV      ? OP_DIV
                 : tt == T_FLOORDIV ? OP_FLOORDIV
                 : tt == T_MOD      ? OP_MOD
                                    : -1;
        if (!left || op < 0) return left;
        token *t = advance(P);
        left = bin(P, E_BIN, op, t, left, parse_pow(P));
    }
}

static expr *parse_concat(parser *P) {
    token *t = cur(P);
    expr *first = parse_math2(P);
    if (!first || cur(P)->type != T_TILDE) return first;
    pvec args = {0};
    if (!pvec_push(P, &args, first)) return NULL;
    while (cur(P)->type == T_TILDE) {
        advance(P);
        expr *e = parse_math2(P);
        if (!e || !pvec_push(P, &args, e)) return NULL;
    }
    expr *c = new_expr(P, E_CONCAT, t);
    if (!c) return NULL;
    c->seq.items = (expr **)args.v;
    c->seq.n = args.n;
    return c;
}

static expr *parse_math1(parser *P) {
    expr *left = parse_concat(P);
    while (left && (cur(P)->type == T_ADD || cur(P)->type == T_SUB)) {
        token *t = advance(P);
        left = bin(P, E_BIN, t->type == T_ADD ? OP_ADD : OP_SUB, t, left, parse_concat(P));
    }
    return left;
}

static expr *parse_compare(parser *P) {
    token *start = cur(P);
    expr *first = parse_math1(P);
    if (!first) return NULL;
    pvec rest = {0};
    pvec opv = {0};
    for (;;) {
        token *c = cur(P);
        int op = -1;
        switch (c->type) {
        case T_EQ:
            op = CMP_EQ;
            break;
        case T_NE:
            op = CMP_NE;
            break;
        case T_LT:
            op = CMP_LT;
            break;
        case T_LTEQ:
            op = CMP_LE;
            break;
        case T_GT:
            op = CMP_GT;
            break;
        case T_GTEQ:
            op = CMP_GE;
            break;
        default:
            break;
        }
        if (op >= 0) {
            advance(P);
        } else if (is_name(c, "in")) {
            advance(P);
            op = CMP_IN;
        } else if (is_name(c, "not") && is_name(look(P), "in")) {
            advance(P);
            advance(P);
            op = CMP_NOTIN;
        } else {
            break;
        }
        expr *e = parse_math1(P);
        if (!e || !pvec_push(P, &rest, e) || !pvec_push(P, &opv, (void *)(uintptr_t)op))
            return NULL;
    }
    if (!rest.n) return first;
    expr *e = new_expr(P, E_CMP, start);
    if (!e) return NULL;
    e->cmp.first = first;
    e->cmp.rest = (expr **)rest.v;
    e->cmp.n = rest.n;
    e->cmp.ops = tpl_alloc(P->ar, rest.n);
    if (!e->cmp.ops) {
        poom(P);
        return NULL;
    }
    for (size_t k = 0; k < rest.n; k++) e->cmp.ops[k] = (uint8_t)(uintptr_t)opv.v[k];
    return e;
}

static expr *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        token *t = advance(P);
        if (!enter(P)) return NULL;
        expr *a = parse_not(P);
        P->depth--;
        if (!a) return NULL;
        expr *e = new_expr(P, E_NOT, t);
        if (e) e->bin.a = a;
        return e;
    }
    return parse_compare(P);
}

static expr *parse_and(parser *P) {
    expr *left = parse_not(P);
    while (left && is_name(cur(P), "and")) {
        token *t = advance(P);
        left = bin(P, E_AND, 0, t, left, parse_not(P));
    }
    return left;
}

static expr *parse_or(parser *P) {
    expr *left = parse_and(P);
    while (left && is_name(cur(P), "or")) {
        token *t = advance(P);
        left = bin(P, E_OR, 0, t, left, parse_and(P));
    }
    return left;
}

static expr *parse_condexpr(parser *P) {
    token *start = cur(P);
    expr *e1 = parse_or(P);
    while (e1 && is_name(cur(P), "if")) {
        advance(P);
        expr *e2 = parse_or(P);
        if (!e2) return NULL;
        expr *e3 = NULL;
        if (skip_name(P, "else")) {
            if (!enter(P)) return NULL;
            e3 = parse_condexpr(P);
            P->depth--;
            if (!e3) return NULL;
        }
        expr *c = new_expr(P, E_COND, start);
        if (!c) return NULL;
        c->cond.cond = e2;
        c->cond.a = e1;
        c->cond.b = e3;
        e1 = c;
        start = cur(P);
    }
    return e1;
}

static expr *parse_expression(parser *P, bool with_condexpr) {
    if (!enter(P)) return NULL;
    expr *e = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return e;
}

static bool is_tuple_end(parser *P, const char *extra_end) {
    int tt = cur(P)->type;
    if (tt == T_VEND || tt == T_BEND || tt == T_RPAREN) return true;
    return extra_end && is_name(cur(P), extra_end);
}

static expr *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                         bool explicit_parens, bool with_namespace) {
    token *start = cur(P);
    pvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect(P, T_COMMA)) return NULL;
        if (is_tuple_end(P, extra_end)) break;
        expr *e =
            simplified ? parse_primary(P, with_namespace) : parse_expression(P, with_condexpr);
        if (!e || !pvec_push(P, &args, e)) return NULL;
        if (cur(P)->type == T_COMMA)
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char got[80];
            describe(cur(P), got, sizeof got);
            pfail(P, cur(P), "Expected an expression, got '%s'", got);
            return NULL;
        }
    }
    expr *e = new_expr(P, E_TUPLE, start);
    if (!e) return NULL;
    e->seq.items = (expr **)args.v;
    e->seq.n = args.n;
    return e;
}

static bool can_assign(const expr *e) {
    if (e->kind == E_NAME) {
        const tstr *n = e->nm.name;
        return !(tpl_str_eq(n, "true") || tpl_str_eq(n, "false") || tpl_str_eq(n, "none") ||
                 tpl_str_eq(n, "True") || tpl_str_eq(n, "False") || tpl_str_eq(n, "None"));
    }
    if (e->kind == E_NSREF) return true;
    if (e->kind == E_TUPLE) {
        for (size_t k = 0; k < e->seq.n; k++)
            if (!can_assign(e->seq.items[k])) return false;
        return true;
    }
    return false;
}

static const char *node_name(const expr *e) {
    switch (e->kind) {
    case E_CONST:
        return "const";
    case E_LIST:
        return "list";
    case E_DICT:
        return "dict";
    case E_TUPLE:
        return "tuple";
    default:
        return "expression";
    }
}

static expr *parse_assign_target(parser *P, bool name_only, const char *extra_end,
                                 bool with_namespace) {
    expr *t;
    if (name_only) {
        token *nt = expect(P, T_NAME);
        if (!nt || !(t = new_expr(P, E_NAME, nt))) return NULL;
        t->nm.name = nt->s;
    } else {
        token *at = cur(P);
        t = parse_tuple(P, true, true, extra_end, false, with_namespace);
        if (!t) return NULL;
        (void)at;
    }
    if (!can_assign(t)) {
        pfail(P, &(token){.line = t->line, .col = t->col}, "can't assign to '%s'", node_name(t));
        return NULL;
    }
    return t;
}

static bool parse_signature(parser *P, signature *sig) {
    if (!expect(P, T_LPAREN)) return false;
    pvec params = {0}, defaults = {0};
    while (cur(P)->type != T_RPAREN) {
        if (params.n && !expect(P, T_COMMA)) return false;
        expr *arg = parse_assign_target(P, true, NULL, false);
        if (!arg) return false;
        if (skip_type(P, T_ASSIGN)) {
            expr *d = parse_expression(P, true);
            if (!d || !pvec_push(P, &defaults, d)) return false;
        } else if (defaults.n) {
            return pfail(P, cur(P), "non-default argument follows default argument");
        }
        if (!pvec_push(P, &params, (void *)arg->nm.name)) return false;
    }
    if (!expect(P, T_RPAREN)) return false;
    sig->params = (const tstr **)params.v;
    sig->nparams = params.n;
    sig->defaults = (expr **)defaults.v;
    sig->ndefaults = defaults.n;
    return true;
}

static stmt *new_stmt(parser *P, int kind, const token *at) {
    stmt *s = tpl_zalloc(P->ar, sizeof *s);
    if (!s) {
        poom(P);
        return NULL;
    }
    s->kind = (uint8_t)kind;
    s->line = at->line;
    s->col = at->col;
    return s;
}

/* parse_statements: optional ':', '%}', then the body up to one of `end` (left current). */
static bool parse_statements(parser *P, const char *const *end, bool drop_needle, body *out) {
    skip_type(P, T_COLON);
    if (!expect(P, T_BEND)) return false;
    if (!parse_body(P, end, out)) return false;
    if (cur(P)->type == T_EOF) {
        char want[160] = "";
        for (int k = 0; end[k]; k++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", end[k]);
        }
        return pfail(P, cur(P),
                     "Unexpected end of template. Jinja was looking for the following tags: %s.",
                     want);
    }
    if (drop_needle) advance(P);
    return true;
}

static bool parse_macro_like(parser *P, signature *sig, const char *end, body *out) {
    signature *saved_sig = P->sig;
    int saved_loop = P->loop_depth;
    P->sig = sig;
    P->loop_depth = 0;
    const char *ends[] = {end, NULL};
    bool ok = parse_statements(P, ends, true, out);
    P->sig = saved_sig;
    P->loop_depth = saved_loop;
    return ok;
}

static stmt *parse_statement(parser *P) {
    token *t = cur(P);
    if (t->type != T_NAME) {
        pfail(P, t, "tag name expected");
        return NULL;
    }
    stmt *s;
    if (is_name(t, "for")) {
        advance(P);
        if (!(s = new_stmt(P, S_FOR, t))) return NULL;
        if (!(s->loop.target = parse_assign_target(P, false, "in", false))) return NULL;
        if (!expect_name(P, "in")) return NULL;
        if (!(s->loop.iter = parse_tuple(P, false, false, "recursive", false, false))) return NULL;
        if (skip_name(P, "if") && !(s->loop.filter = parse_expression(P, true))) return NULL;
        s->loop.recursive = skip_name(P, "recursive");
        const char *ends[] = {"endfor", "else", NULL};
        P->loop_depth++;
        bool ok = parse_statements(P, ends, false, &s->loop.body);
        P->loop_depth--;
        if (!ok) return NULL;
        if (is_name(advance(P), "else")) {
            const char *ends2[] = {"endfor", NULL};
            if (!parse_statements(P, ends2, true, &s->loop.els)) return NULL;
        }
        return s;
    }
    if (is_name(t, "if")) {
        advance(P);
        if (!(s = new_stmt(P, S_IF, t))) return NULL;
        pvec conds = {0}, bodies = {0};
        for (;;) {
            expr *c = parse_tuple(P, false, false, NULL, false, false);
            if (!c) return NULL;
            body *b = tpl_zalloc(P->ar, sizeof *b);
            if (!b) {
                poom(P);
                return NULL;
            }
            const char *ends[] = {"elif", "else", "endif", NULL};
            if (!parse_statements(P, ends, false, b)) return NULL;
            if (!pvec_push(P, &conds, c) || !pvec_push(P, &bodies, b)) return NULL;
            token *e = advance(P);
            if (is_name(e, "elif")) continue;
            if (is_name(e, "else")) {
                const char *ends2[] = {"endif", NULL};
                if (!parse_statements(P, ends2, true, &s->ifs.els)) return NULL;
            }
            break;
        }
        s->ifs.conds = (expr **)conds.v;
        s->ifs.n = conds.n;
        s->ifs.bodies = tpl_alloc(P->ar, conds.n * sizeof(body));
        if (!s->ifs.bodies) {
            poom(P);
            return NULL;
        }
        for (size_t k = 0; k < conds.n; k++) s->ifs.bodies[k] = *(body *)bodies.v[k];
        return s;
    }
    if (is_name(t, "set")) {
        advance(P);
        expr *target = parse_assign_target(P, false, NULL, true);
        if (!target) return NULL;
        if (skip_type(P, T_ASSIGN)) {
            if (!(s = new_stmt(P, S_SET, t))) return NULL;
            s->set.target = target;
            if (!(s->set.value = parse_tuple(P, false, true, NULL, false, false))) return NULL;
            return s;
        }
        if (!(s = new_stmt(P, S_SETBLOCK, t))) return NULL;
        s->setblock.target = target;
        if (cur(P)->type == T_PIPE && !(s->setblock.filter = parse_filter(P, NULL, false)))
            return NULL;
        const char *ends[] = {"endset", NULL};
        if (!parse_statements(P, ends, true, &s->setblock.body)) return NULL;
        return s;
    }
    if (is_name(t, "macro")) {
        advance(P);
        if (!(s = new_stmt(P, S_MACRO, t))) return NULL;
        expr *name = parse_assign_target(P, true, NULL, false);
        if (!name) return NULL;
        s->macro.name = name->nm.name;
        if (!parse_signature(P, &s->macro.sig)) return NULL;
        if (!parse_macro_like(P, &s->macro.sig, "endmacro", &s->macro.body)) return NULL;
        return s;
    }
    if (is_name(t, "call")) {
        advance(P);
        if (!(s = new_stmt(P, S_CALLBLOCK, t))) return NULL;
        if (cur(P)->type == T_LPAREN && !parse_signature(P, &s->callblock.sig)) return NULL;
        expr *c = parse_expression(P, true);
        if (!c) return NULL;
        if (c->kind != E_CALL) {
            pfail(P, t, "expected call");
            return NULL;
        }
        s->callblock.call = c;
        if (!parse_macro_like(P, &s->callblock.sig, "endcall", &s->callblock.body)) return NULL;
        return s;
    }
    if (is_name(t, "filter")) {
        advance(P);
        if (!(s = new_stmt(P, S_FILTERBLOCK, t))) return NULL;
        if (!(s->filterblock.filter = parse_filter(P, NULL, true))) return NULL;
        const char *ends[] = {"endfilter", NULL};
        if (!parse_statements(P, ends, true, &s->filterblock.body)) return NULL;
        return s;
    }
    if (is_name(t, "with")) {
        advance(P);
        if (!(s = new_stmt(P, S_WITH, t))) return NULL;
        pvec targets = {0}, values = {0};
        while (cur(P)->type != T_BEND) {
            if (targets.n && !expect(P, T_COMMA)) return NULL;
            expr *tg = parse_assign_target(P, false, NULL, false);
            if (!tg || !expect(P, T_ASSIGN)) return NULL;
            expr *v = parse_expression(P, true);
            if (!v || !pvec_push(P, &targets, tg) || !pvec_push(P, &values, v)) return NULL;
        }
        s->with.targets = (expr **)targets.v;
        s->with.values = (expr **)values.v;
        s->with.n = targets.n;
        const char *ends[] = {"endwith", NULL};
        if (!parse_statements(P, ends, true, &s->with.body)) return NULL;
        return s;
    }
    if (is_name(t, "print")) {
        advance(P);
        if (!(s = new_stmt(P, S_OUTPUT, t))) return NULL;
        pvec es = {0};
        while (cur(P)->type != T_BEND) {
            if (es.n && !expect(P, T_COMMA)) return NULL;
            expr *e = parse_expression(P, true);
            if (!e || !pvec_push(P, &es, e)) return NULL;
        }
        s->out.e = (expr **)es.v;
        s->out.n = es.n;
        return s;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        advance(P);
        if (P->loop_depth <= 0) {
            pfail(P, t, "'%.*s' outside loop", (int)t->len, t->p);
            return NULL;
        }
        return new_stmt(P, is_name(t, "break") ? S_BREAK : S_CONTINUE, t);
    }
    if (is_name(t, "generation")) { /* transformers' AssistantTracker extension */
        advance(P);
        if (!(s = new_stmt(P, S_SCOPE, t))) return NULL;
        const char *ends[] = {"endgeneration", NULL};
        if (!parse_statements(P, ends, true, &s->scope)) return NULL;
        return s;
    }
    static const char *const unsupported[] = {"extends", "block",      "include", "import",
                                              "from",    "autoescape", "do",      NULL};
    for (int k = 0; unsupported[k]; k++) {
        if (is_name(t, unsupported[k])) {
            pfail(P, t, "unsupported: the '%s' tag", unsupported[k]);
            P->d->kind = KILN_TEMPLATE_ERR_UNSUPPORTED;
            return NULL;
        }
    }
    pfail(P, t, "Encountered unknown tag '%.*s'.", (int)(t->len > 60 ? 60 : t->len), t->p);
    return NULL;
}

/* subparse: data, {{ }} and {% %} until a block whose tag name is in `end` (NULL-terminated
 * list; NULL = the whole template). */
static bool parse_body(parser *P, const char *const *end, body *out) {
    if (!enter(P)) return false;
    pvec v = {0};
    bool ok = true;
    for (;;) {
        token *t = cur(P);
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            stmt *s = new_stmt(P, S_DATA, t);
            if (!s || !pvec_push(P, &v, s)) goto fail;
            s->data = t->s;
            advance(P);
        } else if (t->type == T_VBEGIN) {
            advance(P);
            stmt *s = new_stmt(P, S_OUTPUT, t);
            if (!s) goto fail;
            expr *e = parse_tuple(P, false, true, NULL, false, false);
            if (!e || !expect(P, T_VEND)) goto fail;
            s->out.e = tpl_alloc(P->ar, sizeof(expr *));
            if (!s->out.e) {
                poom(P);
                goto fail;
            }
            s->out.e[0] = e;
            s->out.n = 1;
            if (!pvec_push(P, &v, s)) goto fail;
        } else if (t->type == T_BBEGIN) {
            advance(P);
            bool at_end = false;
            for (int k = 0; end && end[k]; k++)
                if (is_name(cur(P), end[k])) at_end = true;
            if (at_end) break;
            stmt *s = parse_statement(P);
            if (!s || !pvec_push(P, &v, s) || !expect(P, T_BEND)) goto fail;
        } else {
            pfail(P, t, "internal parsing error");
            goto fail;
        }
    }
    out->s = (stmt **)v.v;
    out->n = v.n;
    P->depth--;
    return ok;
fail:
    P->depth--;
    return false;
}

/* Jinja2 reports an unknown filter or test when compiling, except inside an `if` statement
 * (test and branches) or a conditional expression ("soft" frames), where the call raises
 * at run time instead (compiler.py _filter_test_common). Loops, macros, blocks and `with`
 * bodies are not soft. */
static bool check_expr(parser *P, const expr *e, bool soft, int h);
static bool check_body(parser *P, const body *b, bool soft);

static bool check_args(parser *P, const callargs *a, bool soft, int h) {
    for (size_t k = 0; k < a->nargs; k++)
        if (!check_expr(P, a->args[k], soft, h)) return false;
    for (size_t k = 0; k < a->nkw; k++)
        if (!check_expr(P, a->kw[k].value, soft, h)) return false;
    if (a->dyn_args && !check_expr(P, a->dyn_args, soft, h)) return false;
    if (a->dyn_kwargs && !check_expr(P, a->dyn_kwargs, soft, h)) return false;
    return true;
}

static bool check_expr(parser *P, const expr *e, bool soft, int h) {
    if (!e) return true;
    token at = {.line = e->line, .col = e->col};
    /* operator chains (a + b + ...) are built by loops, not recursion: bound the height
       of the tree here, before anything walks it recursively */
    if (++h > MAX_EXPR_HEIGHT)
        return pfail(P, &at, "expression nested too deeply (more than %d levels)", MAX_EXPR_HEIGHT);
    switch (e->kind) {
    case E_LIST:
    case E_TUPLE:
    case E_CONCAT:
        for (size_t k = 0; k < e->seq.n; k++)
            if (!check_expr(P, e->seq.items[k], soft, h)) return false;
        return true;
    case E_DICT:
        for (size_t k = 0; k < e->dict.n; k++)
            if (!check_expr(P, e->dict.keys[k], soft, h) ||
                !check_expr(P, e->dict.vals[k], soft, h))
                return false;
        return true;
    case E_GETATTR:
        return check_expr(P, e->ga.obj, soft, h);
    case E_GETITEM:
        return check_expr(P, e->gi.obj, soft, h) && check_expr(P, e->gi.key, soft, h);
    case E_SLICE:
        return check_expr(P, e->sl.lo, soft, h) && check_expr(P, e->sl.hi, soft, h) &&
               check_expr(P, e->sl.step, soft, h);
    case E_CALL:
        return check_expr(P, e->call.fn, soft, h) && check_args(P, &e->call.a, soft, h);
    case E_FILTER:
    case E_TEST:
        if (e->flt.id < 0 && !soft) {
            bool filter = e->kind == E_FILTER;
            if (e->flt.id == -2) {
                pfail(P, &at, "unsupported: the '%s' filter", e->flt.name->s);
                P->d->kind = KILN_TEMPLATE_ERR_UNSUPPORTED;
                return false;
            }
            return pfail(P, &at, "No %s named '%s'.", filter ? "filter" : "test", e->flt.name->s);
        }
        return check_expr(P, e->flt.obj, soft, h) && check_args(P, &e->flt.a, soft, h);
    case E_NOT:
    case E_NEG:
    case E_POS:
        return check_expr(P, e->bin.a, soft, h);
    case E_BIN:
    case E_AND:
    case E_OR:
        return check_expr(P, e->bin.a, soft, h) && check_expr(P, e->bin.b, soft, h);
    case E_CMP:
        if (!check_expr(P, e->cmp.first, soft, h)) return false;
        for (size_t k = 0; k < e->cmp.n; k++)
            if (!check_expr(P, e->cmp.rest[k], soft, h)) return false;
        return true;
    case E_COND:
        return check_expr(P, e->cond.cond, true, h) && check_expr(P, e->cond.a, true, h) &&
               check_expr(P, e->cond.b, true, h);
    default:
        return true;
    }
}

static bool check_sig(parser *P, const signature *sig, bool soft) {
    for (size_t k = 0; k < sig->ndefaults; k++)
        if (!check_expr(P, sig->defaults[k], soft, 0)) return false;
    return true;
}

static bool check_stmt(parser *P, const stmt *s, bool soft) {
    switch (s->kind) {
    case S_OUTPUT:
        for (size_t k = 0; k < s->out.n; k++)
            if (!check_expr(P, s->out.e[k], soft, 0)) return false;
        return true;
    case S_IF:
        for (size_t k = 0; k < s->ifs.n; k++)
            if (!check_expr(P, s->ifs.conds[k], true, 0) || !check_body(P, &s->ifs.bodies[k], true))
                return false;
        return check_body(P, &s->ifs.els, true);
    case S_FOR:
        return check_expr(P, s->loop.iter, soft, 0) && check_expr(P, s->loop.filter, false, 0) &&
               check_body(P, &s->loop.body, false) && check_body(P, &s->loop.els, false);
    case S_SET:
        return check_expr(P, s->set.value, soft, 0);
    case S_SETBLOCK:
        return check_expr(P, s->setblock.filter, false, 0) &&
               check_body(P, &s->setblock.body, false);
    case S_MACRO:
        return check_sig(P, &s->macro.sig, false) && check_body(P, &s->macro.body, false);
    case S_CALLBLOCK:
        return check_sig(P, &s->callblock.sig, false) &&
               check_expr(P, s->callblock.call, soft, 0) &&
               check_body(P, &s->callblock.body, false);
    case S_FILTERBLOCK:
        return check_expr(P, s->filterblock.filter, false, 0) &&
               check_body(P, &s->filterblock.body, false);
    case S_WITH:
        for (size_t k = 0; k < s->with.n; k++)
            if (!check_expr(P, s->with.values[k], soft, 0)) return false;
        return check_body(P, &s->with.body, false);
    case S_SCOPE:
        return check_body(P, &s->scope, false);
    default:
        return true;
    }
}

static bool check_body(parser *P, const body *b, bool soft) {
    for (size_t k = 0; k < b->n; k++)
        if (!check_stmt(P, b->s[k], soft)) return false;
    return true;
}

bool tpl_parse_tokens(tpl_arena *ar, token *toks, size_t n, body *root, tpl_diag *d) {
    parser P = {.ar = ar, .t = toks, .n = n, .d = d};
    if (!parse_body(&P, NULL, root)) return false;
    if (cur(&P)->type != T_EOF) return pfail(&P, cur(&P), "unexpected token");
    return check_body(&P, root, false);
}
