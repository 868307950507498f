/*
 * schema.c - JSON Schema (draft 2020-12, the parts that constrain generation) to GBNF
 * (grammar.h, kg_schema_to_gbnf).
 *
 * Keywords: type (a name or a list), properties, required, additionalProperties, enum,
 * const, items, minItems, maxItems, anyOf, oneOf, allOf of one schema, $ref (local JSON
 * pointers: "#", "#/$defs/x", "#/definitions/x", any "#/..."), $defs/definitions, string
 * minLength/maxLength/pattern, integer and number minimum/maximum/exclusiveMinimum/
 * exclusiveMaximum. Annotations (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly, ...) and unknown keywords are ignored, as a
 * validator ignores them. Any other keyword that constrains values (multipleOf, uniqueItems,
 * format, not, if/then/else, patternProperties, minProperties, prefixItems, contains, ...) is
 * an error naming it and where it is: never silently dropped.
 *
 * Choices (README.md, "Structured output"):
 * - Output is compact JSON with at most one optional space after ':' and ',' (a bounded
 *   whitespace policy), properties in the schema's order, required ones always, optional
 *   ones may be left out.
 * - An object with declared properties gets no others, whatever additionalProperties says
 *   (leaving them out is always valid; generating extra keys could repeat a declared one);
 *   an object without properties is a map whose values follow additionalProperties (any
 *   JSON value when it is absent or true; {} when it is false).
 * - A number with bounds is generated as an integer in the bounds (always valid); integer
 *   bounds are exact (digit-range grammars).
 * - Numbers have at most 16 integer digits, 15 fraction digits and 3 exponent digits (so a
 *   model that repeats a digit still ends its number; every such number is valid JSON).
 * - Strings never contain raw control characters; \u escapes never write surrogates, so
 *   every escape is one code point for minLength/maxLength.
 * - oneOf is generated as anyOf: the branches must not overlap for the output to validate.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grammar/grammar.h"
#include "util/error.h"

#define KG_MAX_DIGITS 16

typedef struct sref {
    char *ref;
    char name[80];
} sref;

typedef struct sc {
    kg_text *out;
    const char *pre; /* rule name prefix */
    json_t *root;
    kiln_error *err;
    kiln_status st;
    int32_t n;
    sref *refs;
    int32_t n_refs, cap_refs;
    int depth;
} sc;

#define SFAIL(c, path, ...)                                                                    \
    do {                                                                                       \
        if (!(c)->st) {                                                                        \
            char m_[400];                                                                      \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                              \
            (c)->st = kiln_error_set((c)->err, KILN_ERR_INVALID_ARGUMENT,                      \
                                     "json_schema: at %s: %s", (path)[0] ? (path) : "/", m_);   \
        }                                                                                      \
        return false;                                                                          \
    } while (0)
#define SOOM(c)                                                                                \
    do {                                                                                       \
        if (!(c)->st) (c)->st = kiln_error_set((c)->err, KILN_ERR_OUT_OF_MEMORY, "json_schema: out of memory"); \
        return false;                                                                          \
    } while (0)

static const char *const k_unsupported[] = {
    "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "prefixItems",
    "additionalItems", "unevaluatedItems", "unevaluatedProperties", "minProperties",
    "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "not", "if", "then", "else", "format",
    "$dynamicRef", "$recursiveRef", "contentSchema", NULL};

/* keywords this converter reads (anything else: an annotation or unknown, ignored) */
static const char *const k_known[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items",
    "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", NULL};

static bool in_list(const char *k, const char *const *l) {
    for (; *l; l++)
        if (strcmp(k, *l) == 0) return true;
    return false;
}

/* a GBNF literal of s[0..n) */
static bool lit(kg_text *t, const char *s, size_t n) {
    if (!kg_text_add(t, "\"", 1)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok;
        if (c == '"') ok = kg_text_add(t, "\\\"", 2);
        else if (c == '\\') ok = kg_text_add(t, "\\\\", 2);
        else if (c == '\n') ok = kg_text_add(t, "\\n", 2);
        else if (c == '\r') ok = kg_text_add(t, "\\r", 2);
        else if (c == '\t') ok = kg_text_add(t, "\\t", 2);
        else if (c < 0x20 || c == 0x7F) ok = kg_text_addf(t, "\\x%02X", c);
        else ok = kg_text_add(t, (const char *)&s[i], 1);
        if (!ok) return false;
    }
    return kg_text_add(t, "\"", 1);
}

/* a literal of a JSON value's compact text */
static bool lit_json(kg_text *t, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!s) return false;
    bool ok = lit(t, s, strlen(s));
    free(s);
    return ok;
}

static void new_name(sc *c, char *name, size_t cap) {
    snprintf(name, cap, "%ss%d", c->pre, c->n++);
}

/* write "name ::= body\n" */
static bool rule(sc *c, const char *name, const kg_text *body) {
    if (!kg_text_addf(c->out, "%s ::= ", name) || !kg_text_add(c->out, body->p ? body->p : "\"\"", body->p ? body->n : 2) ||
        !kg_text_add(c->out, "\n", 1))
        SOOM(c);
    return true;
}

static bool gen(sc *c, json_t *s, const char *path, char *name, size_t cap);

/* ---- integers: digit-range grammars --------------------------------------------------- */

/* same-length digit strings lo..hi (lo <= hi, length n) */
static bool digits_range(kg_text *t, const char *lo, const char *hi, int n) {
    if (n == 0) return true;
    if (lo[0] == hi[0]) {
        if (!kg_text_addf(t, "\"%c\"", lo[0])) return false;
        if (n > 1 && !kg_text_add(t, " ", 1)) return false;
        return digits_range(t, lo + 1, hi + 1, n - 1);
    }
    bool lo_z = true, hi_9 = true;
    for (int i = 1; i < n; i++) {
        if (lo[i] != '0') lo_z = false;
        if (hi[i] != '9') hi_9 = false;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    bool first = true;
    if (!kg_text_add(t, "(", 1)) return false;
    int a = lo[0] - '0', b = hi[0] - '0';
    if (!lo_z) {
        if (!kg_text_addf(t, "\"%c\" ", lo[0]) || !kg_text_add(t, "(", 1) ||
            !digits_range(t, lo + 1, nines, n - 1) || !kg_text_add(t, ")", 1))
            return false;
        first = false;
        a++;
    }
    int bb = hi_9 ? b : b - 1;
    if (a <= bb) {
        if (!first && !kg_text_add(t, " | ", 3)) return false;
        if (!kg_text_addf(t, "[%d-%d]", a, bb)) return false;
        if (n > 1 && !kg_text_addf(t, " [0-9]{%d}", n - 1)) return false;
        first = false;
    }
    if (!hi_9) {
        if (!first && !kg_text_add(t, " | ", 3)) return false;
        if (!kg_text_addf(t, "\"%c\" ", hi[0]) || !kg_text_add(t, "(", 1) ||
            !digits_range(t, zeros, hi + 1, n - 1) || !kg_text_add(t, ")", 1))
            return false;
    }
    return kg_text_add(t, ")", 1);
}

static int ndig(long long v) {
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* non-negative integers in [a, b] (b < 0: unbounded), no leading zeros */
static bool nonneg_range(kg_text *t, long long a, long long b) {
    if (!kg_text_add(t, "(", 1)) return false;
    int la = ndig(a), lb = b < 0 ? la : ndig(b);
    bool first = true;
    long long p10 = 1;
    for (int i = 1; i < la; i++) p10 *= 10;
    for (int L = la; L <= lb; L++, p10 *= 10) {
        long long lo = L == la ? a : p10;
        long long hi = (b >= 0 && L == lb) ? b : p10 * 10 - 1;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%lld", lo);
        snprintf(hs, sizeof hs, "%lld", hi);
        if (!first && !kg_text_add(t, " | ", 3)) return false;
        if (!digits_range(t, ls, hs, L)) return false;
        first = false;
    }
    if (b < 0 && la < KG_MAX_DIGITS) { /* more digits than a's, up to the bound */
        if (!kg_text_addf(t, " | [1-9] [0-9]{%d,%d}", la, KG_MAX_DIGITS - 1)) return false;
    }
    return kg_text_add(t, ")", 1);
}

static bool int_range(kg_text *t, bool has_lo, long long lo, bool has_hi, long long hi) {
    if (!has_lo && !has_hi) return kg_text_addf(t, "(\"-\"? (\"0\" | [1-9] [0-9]{0,15}))");
    if (has_lo && lo >= 0) return nonneg_range(t, lo, has_hi ? hi : -1);
    if (has_hi && hi < 0) {
        /* x <= hi < 0: |x| >= -hi, and |x| <= -lo when bounded below */
        return kg_text_add(t, "\"-\" ", 4) && nonneg_range(t, -hi, has_lo ? -lo : -1);
    }
    /* the range crosses zero (or is unbounded on the negative side) */
    if (!kg_text_add(t, "(\"-\" ", 5)) return false;
    if (!nonneg_range(t, 1, has_lo ? -lo : -1)) return false;
    if (!kg_text_add(t, " | ", 3)) return false;
    if (!nonneg_range(t, 0, has_hi ? hi : -1)) return false;
    return kg_text_add(t, ")", 1);
}

/* read integer bounds of s (number: rounded inward); false on a bad value */
static bool bounds(sc *c, json_t *s, const char *path, bool integer, bool *has_lo, long long *lo,
                   bool *has_hi, long long *hi) {
    *has_lo = *has_hi = false;
    const double lim = 1e15;
    const char *keys[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(s, keys[k]);
        if (!v) continue;
        if (!json_is_number(v)) SFAIL(c, path, "'%s' must be a number", keys[k]);
        double x = json_number_value(v);
        if (!(fabs(x) <= lim)) SFAIL(c, path, "'%s' is beyond +-1e15, not supported", keys[k]);
        (void)integer;
        long long b;
        if (k < 2) {
            b = (long long)ceil(x);
            if (k == 1 && (double)b == x) b++;
            if (!*has_lo || b > *lo) *lo = b;
            *has_lo = true;
        } else {
            b = (long long)floor(x);
            if (k == 3 && (double)b == x) b--;
            if (!*has_hi || b < *hi) *hi = b;
            *has_hi = true;
        }
    }
    if (*has_lo && *has_hi && *lo > *hi) SFAIL(c, path, "no integer satisfies the bounds");
    return true;
}

/* ---- the common rules ----------------------------------------------------------------- */

/* append tpl with every '@' replaced by the rule prefix */
static bool addp(sc *c, const char *tpl) {
    for (const char *q = tpl; *q; q++) {
        bool ok = *q == '@' ? kg_text_add(c->out, c->pre, strlen(c->pre)) : kg_text_add(c->out, q, 1);
        if (!ok) return false;
    }
    return true;
}

static bool common(sc *c) {
    return addp(c, "@sp ::= \" \"?\n"
                   "@value ::= @object | @array | @string | @number | @boolean | @null\n"
                   "@object ::= \"{\" (@string \":\" @sp @value (\",\" @sp @string \":\" @sp @value)*)? \"}\"\n"
                   "@array ::= \"[\" (@value (\",\" @sp @value)*)? \"]\"\n"
                   "@string ::= \"\\\"\" @char* \"\\\"\"\n"
                   "@char ::= [^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" @hex4)\n"
                   "@hex4 ::= ([0-9a-cA-Ce-fE-F] [0-9a-fA-F] | [dD] [0-7]) [0-9a-fA-F] [0-9a-fA-F]\n"
                   "@int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
                   "@number ::= @int (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,3})?\n"
                   "@boolean ::= \"true\" | \"false\"\n"
                   "@null ::= \"null\"\n");
}

/* ---- schemas -------------------------------------------------------------------------- */

static json_t *resolve(sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *cur = c->root;
    const char *q = ref + 1;
    while (*q == '/') {
        q++;
        char tok[256];
        size_t k = 0;
        while (*q && *q != '/' && k + 1 < sizeof tok) {
            if (q[0] == '~' && q[1] == '1') {
                tok[k++] = '/';
                q += 2;
            } else if (q[0] == '~' && q[1] == '0') {
                tok[k++] = '~';
                q += 2;
            } else {
                tok[k++] = *q++;
            }
        }
        tok[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtol(tok, NULL, 10));
        else return NULL;
        if (!cur) return NULL;
    }
    return *q ? NULL : cur;
}

static bool gen_ref(sc *c, const char *ref, const char *path, char *name, size_t cap) {
    for (int32_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) {
            snprintf(name, cap, "%s", c->refs[i].name);
            return true;
        }
    json_t *t = resolve(c, ref);
    if (!t) SFAIL(c, path, "$ref '%s' does not resolve (only local references \"#...\" are supported)", ref);
    if (c->n_refs == c->cap_refs) {
        int32_t nc = c->cap_refs ? 2 * c->cap_refs : 8;
        sref *nr = realloc(c->refs, (size_t)nc * sizeof *nr);
        if (!nr) SOOM(c);
        c->refs = nr;
        c->cap_refs = nc;
    }
    sref *r = &c->refs[c->n_refs];
    r->ref = strdup(ref);
    if (!r->ref) SOOM(c);
    new_name(c, r->name, sizeof r->name);
    c->n_refs++;
    char rname[80];
    snprintf(rname, sizeof rname, "%s", r->name);
    snprintf(name, cap, "%s", rname);
    char inner[80];
    char sub[300];
    snprintf(sub, sizeof sub, "%.200s", ref + 1);
    if (!gen(c, t, sub, inner, sizeof inner)) return false;
    kg_text b = {0};
    bool ok = kg_text_add(&b, inner, strlen(inner)) && rule(c, rname, &b);
    kg_text_free(&b);
    if (!ok) SOOM(c);
    return true;
}

static bool gen_object(sc *c, json_t *s, const char *path, kg_text *b) {
    const char *p = c->pre;
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) SFAIL(c, path, "'properties' must be an object");
    if (req && !json_is_array(req)) SFAIL(c, path, "'required' must be an array");
    if (add && !json_is_boolean(add) && !json_is_object(add))
        SFAIL(c, path, "'additionalProperties' must be a boolean or a schema");
    size_t np = props ? json_object_size(props) : 0;
    /* every required name must be a declared property */
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) SFAIL(c, path, "'required' must hold strings");
        if (!props || !json_object_get(props, json_string_value(r)))
            SFAIL(c, path, "required property '%s' is not in 'properties' (not supported)",
                  json_string_value(r));
    }
    if (np == 0) {
        char vname[80];
        if (add && json_is_object(add)) {
            char sub[300];
            snprintf(sub, sizeof sub, "%.200s/additionalProperties", path);
            if (!gen(c, add, sub, vname, sizeof vname)) return false;
        } else if (add && json_is_false(add)) {
            return kg_text_add(b, "\"{\" \"}\"", 7) ? true : (c->st = KILN_ERR_OUT_OF_MEMORY, false);
        } else {
            snprintf(vname, sizeof vname, "%svalue", p);
        }
        if (!kg_text_addf(b, "\"{\" (%sstring \":\" %ssp %s (\",\" %ssp %sstring \":\" %ssp %s)*)? \"}\"",
                          p, p, vname, p, p, p, vname))
            SOOM(c);
        return true;
    }
    /* properties in order; rules F_i (nothing written yet) and A_i (something written) */
    char (*kv)[80] = calloc(np, sizeof *kv);
    bool *required = calloc(np, sizeof *required);
    char (*fn)[80] = calloc(np + 1, sizeof *fn);
    char (*an)[80] = calloc(np + 1, sizeof *an);
    if (!kv || !required || !fn || !an) {
        free(kv); free(required); free(fn); free(an);
        SOOM(c);
    }
    bool ok = true;
    const char *key;
    json_t *ps;
    size_t i = 0;
    json_object_foreach(props, key, ps) {
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (strcmp(json_string_value(json_array_get(req, j)), key) == 0) required[i] = true;
        char sub[300], vname[80];
        snprintf(sub, sizeof sub, "%.150s/properties/%.100s", path, key);
        if (!gen(c, ps, sub, vname, sizeof vname)) {
            ok = false;
            break;
        }
        new_name(c, kv[i], sizeof kv[i]);
        kg_text body = {0};
        json_t *kj = json_string(key);
        bool w = kj && lit_json(&body, kj) && kg_text_addf(&body, " \":\" %ssp %s", p, vname) &&
                 rule(c, kv[i], &body);
        json_decref(kj);
        kg_text_free(&body);
        if (!w) {
            ok = false;
            break;
        }
        i++;
    }
    for (size_t k = 0; ok && k <= np; k++) {
        new_name(c, fn[k], sizeof fn[k]);
        new_name(c, an[k], sizeof an[k]);
    }
    for (size_t k = np + 1; ok && k-- > 0;) {
        kg_text f = {0}, a = {0};
        bool w;
        if (k == np) {
            w = kg_text_add(&f, "\"\"", 2) && kg_text_add(&a, "\"\"", 2);
        } else if (required[k]) {
            w = kg_text_addf(&f, "%s %s", kv[k], an[k + 1]) &&
                kg_text_addf(&a, "\",\" %ssp %s %s", p, kv[k], an[k + 1]);
        } else {
            w = kg_text_addf(&f, "%s %s | %s", kv[k], an[k + 1], fn[k + 1]) &&
                kg_text_addf(&a, "\",\" %ssp %s %s | %s", p, kv[k], an[k + 1], an[k + 1]);
        }
        w = w && rule(c, fn[k], &f) && rule(c, an[k], &a);
        kg_text_free(&f);
        kg_text_free(&a);
        if (!w) ok = false;
    }
    if (ok && !kg_text_addf(b, "\"{\" %s \"}\"", fn[0])) ok = false;
    free(kv); free(required); free(fn); free(an);
    if (!ok) {
        if (!c->st) SOOM(c);
        return false;
    }
    return true;
}

static bool get_count(sc *c, json_t *s, const char *key, const char *path, long long *v, bool *has) {
    json_t *x = json_object_get(s, key);
    *has = x != NULL;
    if (!x) return true;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        SFAIL(c, path, "'%s' must be a non-negative integer", key);
    *v = json_integer_value(x);
    if (*v > KG_MAX_REPEAT) SFAIL(c, path, "'%s' above %d is not supported", key, KG_MAX_REPEAT);
    return true;
}

static bool gen_array(sc *c, json_t *s, const char *path, kg_text *b) {
    const char *p = c->pre;
    json_t *items = json_object_get(s, "items");
    char iname[80];
    if (items && json_is_array(items)) SFAIL(c, path, "'items' as an array (tuples) is not supported");
    if (items && json_is_false(items)) SFAIL(c, path, "'items': false is not supported");
    if (items && !json_is_true(items)) {
        char sub[300];
        snprintf(sub, sizeof sub, "%.200s/items", path);
        if (!gen(c, items, sub, iname, sizeof iname)) return false;
    } else {
        snprintf(iname, sizeof iname, "%svalue", p);
    }
    long long mn = 0, mx = -1;
    bool hmn, hmx;
    if (!get_count(c, s, "minItems", path, &mn, &hmn) || !get_count(c, s, "maxItems", path, &mx, &hmx))
        return false;
    if (!hmx) mx = -1;
    if (hmx && mx < mn) SFAIL(c, path, "maxItems is below minItems");
    bool ok;
    if (mx == 0) {
        ok = kg_text_add(b, "\"[\" \"]\"", 7);
    } else {
        long long lo = mn > 0 ? mn - 1 : 0;
        char rep[64];
        if (mx < 0) snprintf(rep, sizeof rep, "{%lld,}", lo);
        else snprintf(rep, sizeof rep, "{%lld,%lld}", lo, mx - 1);
        ok = kg_text_addf(b, "\"[\" (%s (\",\" %ssp %s)%s)%s \"]\"", iname, p, iname, rep,
                          mn == 0 ? "?" : "");
    }
    if (!ok) SOOM(c);
    return true;
}

static bool gen_string(sc *c, json_t *s, const char *path, kg_text *b) {
    const char *p = c->pre;
    json_t *pat = json_object_get(s, "pattern");
    long long mn = 0, mx = -1;
    bool hmn, hmx;
    if (!get_count(c, s, "minLength", path, &mn, &hmn) || !get_count(c, s, "maxLength", path, &mx, &hmx))
        return false;
    if (!hmx) mx = -1;
    if (hmx && mx < mn) SFAIL(c, path, "maxLength is below minLength");
    if (pat) {
        if (!json_is_string(pat)) SFAIL(c, path, "'pattern' must be a string");
        if (hmn || hmx) SFAIL(c, path, "'pattern' together with minLength/maxLength is not supported");
        char rname[80];
        new_name(c, rname, sizeof rname);
        kiln_error e2;
        kiln_status st = kg_regex_to_gbnf(json_string_value(pat), json_string_length(pat), rname,
                                          true, c->out, &e2);
        if (st) SFAIL(c, path, "pattern: %.300s", e2.message);
        if (!kg_text_addf(b, "\"\\\"\" %s \"\\\"\"", rname)) SOOM(c);
        return true;
    }
    if (!hmn && !hmx) {
        if (!kg_text_addf(b, "%sstring", p)) SOOM(c);
        return true;
    }
    bool ok = mx < 0 ? kg_text_addf(b, "\"\\\"\" %schar{%lld,} \"\\\"\"", p, mn)
                     : kg_text_addf(b, "\"\\\"\" %schar{%lld,%lld} \"\\\"\"", p, mn, mx);
    if (!ok) SOOM(c);
    return true;
}

static bool gen_type(sc *c, json_t *s, const char *t, const char *path, kg_text *b) {
    const char *p = c->pre;
    if (strcmp(t, "null") == 0) return kg_text_addf(b, "%snull", p) ? true : (c->st = KILN_ERR_OUT_OF_MEMORY, false);
    if (strcmp(t, "boolean") == 0) return kg_text_addf(b, "%sboolean", p) ? true : (c->st = KILN_ERR_OUT_OF_MEMORY, false);
    if (strcmp(t, "string") == 0) return gen_string(c, s, path, b);
    if (strcmp(t, "object") == 0) return gen_object(c, s, path, b);
    if (strcmp(t, "array") == 0) return gen_array(c, s, path, b);
    if (strcmp(t, "integer") == 0 || strcmp(t, "number") == 0) {
        bool hl, hh;
        long long lo = 0, hi = 0;
        if (!bounds(c, s, path, t[0] == 'i', &hl, &lo, &hh, &hi)) return false;
        if (!hl && !hh) {
            if (!kg_text_addf(b, "%s%s", p, t[0] == 'i' ? "int" : "number")) SOOM(c);
            return true;
        }
        if (!int_range(b, hl, lo, hh, hi)) SOOM(c);
        return true;
    }
    SFAIL(c, path, "unknown type '%s'", t);
}

static bool has_key(json_t *s, const char *k) { return json_object_get(s, k) != NULL; }

static bool gen(sc *c, json_t *s, const char *path, char *name, size_t cap) {
    const char *p = c->pre;
    if (c->st) return false;
    if (++c->depth > 64) SFAIL(c, path, "schema nested deeper than 64");
    if (json_is_true(s)) {
        snprintf(name, cap, "%svalue", p);
        c->depth--;
        return true;
    }
    if (json_is_false(s)) SFAIL(c, path, "the schema false accepts nothing");
    if (!json_is_object(s)) SFAIL(c, path, "a schema must be an object or a boolean");
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (in_list(key, k_unsupported)) {
            if (strcmp(key, "allOf") == 0) continue;
            SFAIL(c, path, "keyword '%s' is not supported", key);
        }
    }
    json_t *allof = json_object_get(s, "allOf");
    if (allof) {
        if (!json_is_array(allof) || json_array_size(allof) != 1)
            SFAIL(c, path, "keyword 'allOf' is supported only with one schema");
        int n_known = 0;
        json_object_foreach(s, key, v) if (in_list(key, k_known) && strcmp(key, "$defs") && strcmp(key, "definitions")) n_known++;
        if (n_known > 1) SFAIL(c, path, "'allOf' together with other keywords is not supported");
        char sub[300];
        snprintf(sub, sizeof sub, "%.200s/allOf/0", path);
        bool ok = gen(c, json_array_get(allof, 0), sub, name, cap);
        c->depth--;
        return ok;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) SFAIL(c, path, "'$ref' must be a string");
        json_object_foreach(s, key, v) if (in_list(key, k_known) && strcmp(key, "$ref") && strcmp(key, "$defs") && strcmp(key, "definitions"))
            SFAIL(c, path, "'$ref' together with '%s' is not supported", key);
        bool ok = gen_ref(c, json_string_value(ref), path, name, cap);
        c->depth--;
        return ok;
    }
    kg_text b = {0};
    bool ok = true;
    json_t *cst = json_object_get(s, "const");
    json_t *en = json_object_get(s, "enum");
    json_t *any = json_object_get(s, "anyOf");
    json_t *one = json_object_get(s, "oneOf");
    json_t *ty = json_object_get(s, "type");
    if (cst) {
        ok = lit_json(&b, cst);
        if (!ok) c->st = KILN_ERR_OUT_OF_MEMORY;
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            kg_text_free(&b);
            SFAIL(c, path, "'enum' must be a non-empty array");
        }
        for (size_t i = 0; ok && i < json_array_size(en); i++)
            ok = (i == 0 || kg_text_add(&b, " | ", 3)) && lit_json(&b, json_array_get(en, i));
        if (!ok) c->st = KILN_ERR_OUT_OF_MEMORY;
    } else if (any || one) {
        json_t *l = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        if (any && one) {
            kg_text_free(&b);
            SFAIL(c, path, "'anyOf' together with 'oneOf' is not supported");
        }
        if (ty || has_key(s, "properties") || has_key(s, "items")) {
            kg_text_free(&b);
            SFAIL(c, path, "'%s' together with type/properties/items is not supported", kw);
        }
        if (!json_is_array(l) || json_array_size(l) == 0) {
            kg_text_free(&b);
            SFAIL(c, path, "'%s' must be a non-empty array", kw);
        }
        for (size_t i = 0; ok && i < json_array_size(l); i++) {
            char sub[300], sname[80];
            snprintf(sub, sizeof sub, "%.200s/%s/%zu", path, kw, i);
            ok = gen(c, json_array_get(l, i), sub, sname, sizeof sname);
            ok = ok && (i == 0 || kg_text_add(&b, " | ", 3)) && kg_text_add(&b, sname, strlen(sname));
        }
    } else if (ty) {
        if (json_is_string(ty)) {
            ok = gen_type(c, s, json_string_value(ty), path, &b);
        } else if (json_is_array(ty) && json_array_size(ty) > 0) {
            for (size_t i = 0; ok && i < json_array_size(ty); i++) {
                json_t *t = json_array_get(ty, i);
                if (!json_is_string(t)) {
                    kg_text_free(&b);
                    SFAIL(c, path, "'type' must hold strings");
                }
                kg_text one_t = {0};
                ok = gen_type(c, s, json_string_value(t), path, &one_t) &&
                     (i == 0 || kg_text_add(&b, " | ", 3)) && kg_text_add(&b, "(", 1) &&
                     kg_text_add(&b, one_t.p, one_t.n) && kg_text_add(&b, ")", 1);
                kg_text_free(&one_t);
            }
        } else {
            kg_text_free(&b);
            SFAIL(c, path, "'type' must be a string or a non-empty array of strings");
        }
    } else if (has_key(s, "properties") || has_key(s, "additionalProperties") || has_key(s, "required")) {
        ok = gen_object(c, s, path, &b);
    } else if (has_key(s, "items") || has_key(s, "minItems") || has_key(s, "maxItems")) {
        ok = gen_array(c, s, path, &b);
    } else if (has_key(s, "pattern") || has_key(s, "minLength") || has_key(s, "maxLength")) {
        ok = gen_string(c, s, path, &b);
    } else if (has_key(s, "minimum") || has_key(s, "maximum") || has_key(s, "exclusiveMinimum") ||
               has_key(s, "exclusiveMaximum")) {
        ok = gen_type(c, s, "number", path, &b);
    } else {
        ok = kg_text_addf(&b, "%svalue", p);
    }
    if (ok) {
        new_name(c, name, cap);
        ok = rule(c, name, &b);
    }
    kg_text_free(&b);
    c->depth--;
    if (!ok && !c->st) c->st = kiln_error_set(c->err, KILN_ERR_OUT_OF_MEMORY, "json_schema: out of memory");
    return ok;
}

kiln_status kg_schema_to_gbnf_prefixed(const char *schema, size_t len, const char *prefix,
                                       kg_text *out, kiln_error *err) {
    json_error_t je;
    json_t *root = json_loadb(schema ? schema : "", schema ? len : 0, JSON_DECODE_ANY, &je);
    if (!root)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "json_schema: not valid JSON: %s (line %d, column %d)", je.text,
                              je.line, je.column);
    sc c = {.out = out, .pre = prefix ? prefix : "", .root = root, .err = err};
    char name[80];
    bool ok = common(&c);
    if (!ok) c.st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "json_schema: out of memory");
    if (ok) ok = gen(&c, root, "", name, sizeof name);
    if (ok && !kg_text_addf(out, "%sroot ::= %s\n", c.pre, name))
        c.st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "json_schema: out of memory");
    for (int32_t i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    json_decref(root);
    if (!ok && !c.st) c.st = kiln_error_set(err, KILN_ERR_INTERNAL, "json_schema: conversion failed");
    return c.st;
}

kiln_status kg_schema_to_gbnf(const char *schema, size_t len, kg_text *out, kiln_error *err) {
    return kg_schema_to_gbnf_prefixed(schema, len, "", out, err);
}
