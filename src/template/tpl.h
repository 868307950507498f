/* tpl.h - internals of the chat-template interpreter (see template.h). Not a public header.
 *
 * Its files, from the bottom up; each calls only files of the lines above its own:
 *   tpl_arena.c tpl_utf8.c       memory; UTF-8 and the Unicode data of str methods
 *   tpl_runtime.c                errors and limits of a render
 *   tpl_number.c tpl_names.c     Python number text; the built-ins' names and ids (tpl_names.h)
 *   tpl_value.c                  the value model: str(), repr(), ==, <, hash, JSON
 *   tpl_lexer.c tpl_parser.c     source -> tokens -> AST
 *   tpl_ops.c                    operators, the sandbox's attribute and item access, slices
 *   tpl_args.c                   how the built-ins take their arguments
 *   tpl_pystr.c                  Python str operations, for str methods and filters alike
 *   tpl_methods.c tpl_tests.c    the str/dict/list/loop methods; Jinja's tests
 *   tpl_filters.c                Jinja's filters (select, reject... call the tests)
 *   tpl_eval.c                   the interpreter: statements, expressions, macros, globals
 *   template.c                   the public API */
#ifndef KILN_TEMPLATE_TPL_H
#define KILN_TEMPLATE_TPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template/template.h"

/* ------------------------------------------------------------------------------------------ */
/* Arena: every AST node (per template) and every render-time value (per render) lives in an   */
/* arena freed as a whole, so values need no reference counts and cycles cannot leak.          */

typedef struct tpl_chunk tpl_chunk;
typedef struct tpl_arena {
    tpl_chunk *head;
    size_t used; /* bytes handed out, chunk overhead included */
    size_t cap;  /* 0 = unlimited */
    bool over;   /* an allocation failed because of cap (vs. malloc) */
} tpl_arena;

void tpl_arena_init(tpl_arena *a, size_t cap);
void tpl_arena_free(tpl_arena *a);
/* n bytes, 16-byte aligned, uninitialised; NULL when over cap or out of memory. */
void *tpl_alloc(tpl_arena *a, size_t n);
void *tpl_zalloc(tpl_arena *a, size_t n);
/* Grow (or move) the block p of old bytes to n bytes. */
void *tpl_realloc(tpl_arena *a, void *p, size_t old, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and Python str helpers (tpl_utf8.c)                                                   */

/* Decode one code point at s[0..n) (n >= 1); *adv = bytes used. Assumes valid UTF-8. */
uint32_t tpl_utf8_dec(const char *s, size_t n, size_t *adv);
size_t tpl_utf8_enc(uint32_t cp, char out[4]);
bool tpl_utf8_valid(const char *s, size_t n, size_t *bad_off);
size_t tpl_utf8_count(const char *s, size_t n);
/* Python str.isspace() for one code point (also re's \s for str patterns). */
bool tpl_is_space(uint32_t cp);
/* Python str.splitlines() boundaries: \n \r \v \f \x1c \x1d \x1e \x85 \u2028 \u2029. */
bool tpl_is_linebreak(uint32_t cp);
bool tpl_is_printable(uint32_t cp);
uint32_t tpl_upper(uint32_t cp);
uint32_t tpl_lower(uint32_t cp);
bool tpl_is_alpha(uint32_t cp);
bool tpl_is_digit(uint32_t cp);
bool tpl_is_cased_lower(uint32_t cp);
bool tpl_is_cased_upper(uint32_t cp);

/* ------------------------------------------------------------------------------------------ */
/* Values (tpl_value.c)                                                                        */

typedef enum {
    TV_UNDEF,
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* list, tuple, generator, dict views, range: see tlist.kind */
    TV_DICT,
    TV_NS,   /* namespace(): a tdict with str keys, the one mutable object */
    TV_FUNC, /* macros, globals, bound methods, caller, loop.cycle */
    TV_LOOP, /* a for loop's `loop` */
} tv_type;

typedef struct tstr {
    size_t len;    /* bytes */
    size_t nchars; /* code points */
    char s[];      /* NUL-terminated */
} tstr;

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tfunc tfunc;
typedef struct tloop tloop;
typedef struct tundef tundef;

typedef struct tv {
    uint8_t type;
    uint8_t markup; /* TV_STR: a markupsafe.Markup (|safe), which escapes what is added to it */
    union {
        bool b;
        int64_t i;
        double f;
        const tstr *s;
        tlist *l;
        tdict *d;
        tfunc *fn;
        tloop *lp;
        tundef *u; /* may be NULL: a plain undefined without a hint */
    };
} tv;

enum { L_LIST, L_TUPLE, L_GEN, L_ITEMS, L_KEYS, L_VALUES, L_RANGE };

struct tlist {
    uint8_t kind;
    size_t n, cap;
    size_t pos; /* L_GEN: items before pos are consumed */
    tv *v;
    int64_t r_start, r_stop, r_step; /* L_RANGE, for repr */
    const char *gen_name;            /* L_GEN: the generator function, for repr;
                                        L_TUPLE: tpl_group_tuple for groupby's results */
};
extern const char tpl_group_tuple[];

typedef struct tentry {
    tv k, v;
    uint64_t h;
} tentry;

struct tdict {
    size_t n, cap;
    tentry *e;
    uint32_t *idx; /* open addressing over e (index + 1, 0 = empty) when n > 8 */
    size_t icap;
};

enum { UX_UNDEFINED, UX_SECURITY };
struct tundef {
    const char *hint; /* full message, or NULL to build one from obj/name */
    tv obj;           /* TV_UNDEF type here means "no object" */
    tv name;
    uint8_t exc;
};

/* Functions */
enum { F_BUILTIN, F_MACRO, F_METHOD, F_CALLER };
struct stmt;
struct scope;
struct tfunc {
    uint8_t kind;
    int id;                  /* F_BUILTIN: global id; F_METHOD: method id */
    tv self;                 /* F_METHOD receiver */
    const struct stmt *node; /* F_MACRO: the macro; F_CALLER: the call block */
    struct scope *sc;        /* F_MACRO, F_CALLER: the scope they were defined in */
};

struct tloop {
    const tlist *items;
    size_t i, n;
    int depth;
    bool has_last;
    tv last;                 /* loop.changed */
    const struct stmt *node; /* the for statement (recursive loops call it again) */
    struct scope *sc;        /* the scope it runs in */
};

/* ------------------------------------------------------------------------------------------ */
/* AST (tpl_parser.c)                                                                          */

typedef struct expr expr;
typedef struct stmt stmt;

typedef struct kwarg {
    const tstr *name;
    expr *value;
} kwarg;

typedef struct callargs {
    expr **args;
    size_t nargs;
    kwarg *kw;
    size_t nkw;
    expr *dyn_args, *dyn_kwargs;
} callargs;

enum {
    E_CONST,
    E_NAME,
    E_NSREF, /* assignment target ns.attr */
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_GETATTR,
    E_GETITEM,
    E_SLICE,
    E_CALL,
    E_FILTER, /* obj NULL: the body of a filter/set block */
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_CMP,
    E_COND,
    E_CONCAT,
};

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct expr {
    uint8_t kind;
    uint8_t op;
    int line, col;
    union {
        tv cval;
        struct {
            const tstr *name;
            const tstr *attr; /* E_NSREF */
        } nm;
        struct {
            expr **items;
            size_t n;
        } seq; /* E_LIST, E_TUPLE, E_CONCAT */
        struct {
            expr **keys, **vals;
            size_t n;
        } dict;
        struct {
            expr *obj;
            const tstr *attr;
        } ga;
        struct {
            expr *obj, *key;
        } gi;
        struct {
            expr *lo, *hi, *step;
        } sl;
        struct {
            expr *fn;
            callargs a;
        } call;
        struct {
            expr *obj;
            int id;
            const tstr *name;
            callargs a;
        } flt; /* E_FILTER, E_TEST */
        struct {
            expr *a, *b;
        } bin; /* E_BIN, E_AND, E_OR; E_NOT/NEG/POS use a */
        struct {
            expr *first;
            uint8_t *ops;
            expr **rest;
            size_t n;
        } cmp;
        struct {
            expr *cond, *a, *b; /* a if cond else b (b may be NULL) */
        } cond;
    };
};

typedef struct body {
    stmt **s;
    size_t n;
} body;

enum {
    S_DATA,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_WITH,
    S_BREAK,
    S_CONTINUE,
    S_SCOPE, /* {% generation %}: renders its body */
};

typedef struct signature {
    const tstr **params;
    expr **defaults; /* for the last ndefaults params */
    size_t nparams, ndefaults;
    bool uses_caller, uses_varargs, uses_kwargs;
} signature;

struct stmt {
    uint8_t kind;
    int line, col;
    union {
        const tstr *data;
        struct {
            expr **e;
            size_t n;
        } out;
        struct {
            expr **conds;
            body *bodies;
            size_t n;
            body els;
        } ifs;
        struct {
            expr *target;
            expr *iter, *filter;
            body body, els;
            bool recursive;
        } loop;
        struct {
            expr *target, *value;
        } set;
        struct {
            expr *target;
            expr *filter; /* may be NULL */
            body body;
        } setblock;
        struct {
            const tstr *name; /* NULL for a call block's caller */
            signature sig;
            body body;
        } macro;
        struct {
            signature sig; /* the caller's */
            expr *call;
            body body;
        } callblock;
        struct {
            expr *filter;
            body body;
        } filterblock;
        struct {
            expr **targets, **values;
            size_t n;
            body body;
        } with;
        body scope;
    };
};

struct kiln_template {
    tpl_arena ar;
    body root;
};

/* ------------------------------------------------------------------------------------------ */
/* Lexer (tpl_lexer.c)                                                                         */

enum {
    T_EOF,
    T_DATA,
    T_VBEGIN,
    T_VEND,
    T_BBEGIN,
    T_BEND,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    /* operators */
    T_ADD,
    T_SUB,
    T_DIV,
    T_FLOORDIV,
    T_MUL,
    T_MOD,
    T_POW,
    T_TILDE,
    T_LBRACKET,
    T_RBRACKET,
    T_LPAREN,
    T_RPAREN,
    T_LBRACE,
    T_RBRACE,
    T_EQ,
    T_NE,
    T_GT,
    T_GTEQ,
    T_LT,
    T_LTEQ,
    T_ASSIGN,
    T_DOT,
    T_COLON,
    T_PIPE,
    T_COMMA,
    T_SEMICOLON,
};

typedef struct token {
    int type;
    int line, col;
    const char *p; /* source text (names: the identifier) */
    size_t len;
    union {
        const tstr *s; /* T_DATA, T_STRING: decoded value; T_NAME: interned name */
        int64_t i;
        double f;
    };
} token;

typedef struct tpl_diag {
    kiln_template_error_kind kind;
    int line, col;
    char msg[1024];
} tpl_diag;

/* Tokenize normalized source. Returns false with d filled on error. */
bool tpl_lex(tpl_arena *ar, const char *src, size_t n, token **out, size_t *ntok, tpl_diag *d);

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                              */

const tstr *tpl_str_new(tpl_arena *a, const char *s, size_t n); /* NULL on OOM */
bool tpl_str_eq(const tstr *a, const char *s);

/* Parser (tpl_parser.c): tokens -> root body. */
bool tpl_parse_tokens(tpl_arena *ar, token *toks, size_t n, body *root, tpl_diag *d);

/* ------------------------------------------------------------------------------------------ */
/* Numbers (tpl_number.c)                                                                      */

/* repr(x) of a float: the shortest digits that read back, laid out as Python prints them. */
void tpl_fmt_float(double x, char out[40]);
/* Python float(s) and int(s, base) (base 0: from the prefix): false where Python raises
 * ValueError; *overflow (and true) where the integer needs more than 64 bits. */
bool tpl_parse_py_float(const tstr *s, double *out);
bool tpl_parse_py_int(const tstr *s, int base, int64_t *out, bool *overflow);
/* Python round(x, ndigits) of a float, correctly rounded. */
double tpl_py_round(double x, int64_t nd);

/* ------------------------------------------------------------------------------------------ */
/* Render-time state                                                                           */

typedef struct sbuf { /* string builder in the render arena */
    char *p;
    size_t n, cap;
} sbuf;

typedef struct scope {
    struct scope *parent;
    const tstr **names;
    tv *vals;
    size_t n, cap;
} scope;

typedef struct rctx {
    tpl_arena ar;
    scope *root;
    sbuf *out;
    uint64_t steps, max_steps;
    size_t max_output;
    int depth, max_depth;
    const struct tm *now;
    tpl_diag d;
    int line, col;  /* position of the node being evaluated, for errors */
    tv block_value; /* input of a filter whose operand is a filter/set block */
    bool has_block_value;
} rctx;

/* Errors and limits (tpl_runtime.c). Errors: record (first one wins) and return -1. `exc` is
 * the Python exception name put in front of the message ("TypeError"), or NULL. */
int rt_fail(rctx *c, kiln_template_error_kind kind, const char *exc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int rt_type_error(rctx *c, const char *fmt, ...) /* a TypeError */
    __attribute__((format(printf, 2, 3)));
int rt_oom(rctx *c);              /* memory cap or malloc: LIMIT or MEMORY */
int rt_step(rctx *c, uint64_t n); /* count work; fails past max_steps */

/* sbuf (tpl_value.c) */
int sb_put(rctx *c, sbuf *b, const char *s, size_t n);
int sb_puts(rctx *c, sbuf *b, const char *s);
int sb_putc(rctx *c, sbuf *b, char ch);
int sb_printf(rctx *c, sbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Finish: an arena tstr of the contents. */
int sb_str(rctx *c, sbuf *b, tv *out);

/* ------------------------------------------------------------------------------------------ */
/* Values (tpl_value.c)                                                                        */

static inline tv tv_undef(void) {
    tv v = {.type = TV_UNDEF};
    v.u = NULL;
    return v;
}
static inline tv tv_none(void) {
    tv v = {.type = TV_NONE};
    v.i = 0;
    return v;
}
static inline tv tv_bool(bool b) {
    tv v = {.type = TV_BOOL};
    v.b = b;
    return v;
}
static inline tv tv_int(int64_t i) {
    tv v = {.type = TV_INT};
    v.i = i;
    return v;
}
static inline tv tv_float(double f) {
    tv v = {.type = TV_FLOAT};
    v.f = f;
    return v;
}
static inline tv tv_str(const tstr *s) {
    tv v = {.type = TV_STR};
    v.s = s;
    return v;
}
static inline tv tv_list(tlist *l) {
    tv v = {.type = TV_LIST};
    v.l = l;
    return v;
}
static inline tv tv_dict(tdict *d) {
    tv v = {.type = TV_DICT};
    v.d = d;
    return v;
}
static inline bool tv_is_num(tv v) {
    return v.type == TV_INT || v.type == TV_FLOAT || v.type == TV_BOOL;
}
/* The integer of a number: a bool's 0 or 1, a float truncated. */
static inline int64_t tv_ival(tv v) {
    return v.type == TV_BOOL ? (int64_t)v.b : v.type == TV_FLOAT ? (int64_t)v.f : v.i;
}
/* Sequence-like lists that support len() and indexing (list, tuple, range). */
static inline bool tv_is_seq(tv v) {
    return v.type == TV_LIST &&
           (v.l->kind == L_LIST || v.l->kind == L_TUPLE || v.l->kind == L_RANGE);
}

int tv_strc(rctx *c, const char *s, size_t n, tv *out);
tv tv_undef_named(rctx *c, const tstr *name);             /* 'x' is undefined */
tv tv_undef_attr(rctx *c, tv obj, tv name);               /* obj has no attribute/element */
tv tv_undef_hint(rctx *c, const char *hint, uint8_t exc); /* explicit message */
int tv_undef_fail(rctx *c, tv u);                         /* raise the UndefinedError */
const char *tv_type_name(tv v);                           /* Python type(x).__name__ */

tlist *tl_new(rctx *c, int kind, size_t cap);
int tl_push(rctx *c, tlist *l, tv v);
tdict *td_new(rctx *c);
int td_set(rctx *c, tdict *d, tv k, tv v);           /* TypeError for unhashable keys */
int td_get(rctx *c, const tdict *d, tv k, tv **out); /* *out NULL when absent */
tv *td_get_str(const tdict *d, const char *k, size_t n);

bool tv_truthy(tv v);
bool tv_eq(tv a, tv b);
int tv_lt(rctx *c, tv a, tv b, bool *out); /* Python a < b; TypeError when unordered */
int tv_le(rctx *c, tv a, tv b, bool *out);
bool tv_hashable(tv v);
int tv_hash(rctx *c, tv v, uint64_t *h);

/* str(v) and repr(v) appended to b. */
int tv_to_sb(rctx *c, tv v, sbuf *b);
int tv_repr_sb(rctx *c, tv v, sbuf *b);
/* str(v) as a value (strings are returned as is). */
int tv_to_str(rctx *c, tv v, tv *out);

/* JSON */
int tv_from_json(rctx *c, const void *json, tv *out);
typedef struct json_opts {
    const char *indent; /* NULL: no newlines */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
    bool sort_keys;
} json_opts;
int tv_to_json(rctx *c, tv v, const json_opts *o, sbuf *b);

/* Items of an iterable as a list (consumes generators). TypeError for non-iterables;
 * undefined iterates as empty. Strings give their characters, dicts their keys. */
int tv_iterate(rctx *c, tv v, tlist **out);
/* len(); TypeError when it has none. */
int tv_len(rctx *c, tv v, int64_t *out);

/* ------------------------------------------------------------------------------------------ */
/* Operators (tpl_ops.c): Python's, with Python's errors                                       */

int tpl_binop(rctx *c, int op, tv a, tv b, tv *out);         /* a OP_ADD... b */
int rt_add(rctx *c, tv a, tv b, tv *out);                    /* a + b */
int tpl_unary(rctx *c, bool neg, tv v, tv *out);             /* -v or +v */
int tpl_percent_format(rctx *c, tv fmt, tv args, tv *out);   /* str % args */
int tpl_escape(rctx *c, tv v, tv *out);                      /* markupsafe.escape(v) */
int tpl_contains(rctx *c, tv item, tv container, bool *out); /* item in container */
/* The sandbox's obj.attr and obj[key]: each tries the other after its own lookup; undefined
 * when neither finds anything. */
int rt_getattr(rctx *c, tv obj, const tstr *attr, tv *out);
int rt_getitem(rctx *c, tv obj, tv key, tv *out);
int tpl_slice(rctx *c, tv obj, tv lo, tv hi, tv step, tv *out); /* obj[lo:hi:step]; None: absent */

/* ------------------------------------------------------------------------------------------ */
/* Built-in filters, tests and methods                                                         */

/* Arguments (tpl_args.c). tpl_bind_args binds positional and keyword arguments to the np
 * parameters `names` of fname, the first req of them required: out[k] is the argument, or
 * TV_UNDEF with u == NULL and given[k] false for an absent optional one. */
int tpl_bind_args(rctx *c, const char *fname, const char *const *names, size_t np, size_t req,
                  const tv *args, size_t nargs, const tstr **kwnames, const tv *kwvals, size_t nkw,
                  tv *out, bool *given);
/* A TypeError of fmt with two %s (a and b). */
int tpl_arg_error(rctx *c, const char *fmt, const char *a, const char *b);
/* An int or bool argument, or a TypeError naming `what`. */
int tpl_need_int(rctx *c, tv v, const char *what, int64_t *out);

/* Python str operations (tpl_pystr.c) on str values; results live in the render arena. */
typedef struct cpbuf { /* a str as code points */
    uint32_t *cp;
    size_t n;
} cpbuf;
int tpl_to_cps(rctx *c, const tstr *s, cpbuf *o);
int tpl_from_cps(rctx *c, const uint32_t *cp, size_t n, tv *out);
size_t tpl_cp_off(const tstr *s, int64_t idx); /* byte offset of code point idx */
/* lower(), upper() and swapcase() for mode 0, 1 and 2; capitalize(). */
int tpl_str_case(rctx *c, tv s, int mode, tv *out);
int tpl_str_capitalize(rctx *c, tv s, tv *out);
/* strip(chars) on the left (which 1), the right (2) or both sides (3). */
int tpl_str_strip(rctx *c, tv s, tv chars, int which, tv *out);
/* replace(old, new, count), count -1 for all; split(sep, maxsplit), rsplit when right. */
int tpl_str_replace(rctx *c, tv s, tv old, tv new_, int64_t count, tv *out);
int tpl_str_split(rctx *c, tv s, tv sep, int64_t maxsplit, bool right, tv *out);
int tpl_str_splitlines(rctx *c, tv s, bool keepends, tlist **out);
/* center (align 0), ljust (1) or rjust (2) to width with fill, one character (else a space). */
int tpl_str_pad(rctx *c, tv s, int64_t width, tv fill, int align, tv *out);

/* Filters (tpl_filters.c), tests (tpl_tests.c), methods (tpl_methods.c) */
int tpl_apply_filter(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwnames,
                     const tv *kwvals, size_t nkw, tv *out);
int tpl_apply_test(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwnames,
                   const tv *kwvals, size_t nkw, bool *out);
int tpl_call_method(rctx *c, tv self, int id, const tv *args, size_t nargs, const tstr **kwnames,
                    const tv *kwvals, size_t nkw, tv *out);

/* ------------------------------------------------------------------------------------------ */
/* The interpreter (tpl_eval.c)                                                                */

int rt_call(rctx *c, tv fn, const tv *args, size_t nargs, const tstr **kwnames, const tv *kwvals,
            size_t nkw, tv *out);
/* Render root into out, c set up by kiln_template_render; -1 with c->d filled on error. */
int tpl_render_root(rctx *c, const body *root, sbuf *out);

#endif
