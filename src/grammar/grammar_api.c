/*
 * grammar_api.c - the public grammar functions of include/kiln.h ("Structured output").
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

/* any JSON object: the schema converter's common rules with an object root */
static const char k_json_object_schema[] = "{\"type\": \"object\"}";

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + (size_t)k > n) return false;
        for (int j = 1; j < k; j++)
            if ((u[i + (size_t)j] & 0xC0) != 0x80) return false;
        i += (size_t)k;
    }
    return true;
}

static kiln_status from_text(kg_text *t, const char *kind, kiln_grammar **out, kiln_error *err) {
    kiln_status st = kg_from_gbnf(t->p ? t->p : "", t->n, kind, out, err);
    kg_text_free(t);
    return st;
}

KILN_API kiln_status kiln_grammar_create(kiln_grammar_kind kind, const char *text, size_t len,
                                         kiln_grammar **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "grammar: out is NULL");
    *out = NULL;
    if (kind != KILN_GRAMMAR_JSON_OBJECT && !text)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "grammar: the text is NULL");
    if (text && len == 0) len = strlen(text);
    kg_text t = {0};
    kiln_status st;
    switch (kind) {
    case KILN_GRAMMAR_GBNF:
        return kg_from_gbnf(text, len, "gbnf", out, err);
    case KILN_GRAMMAR_JSON_SCHEMA:
        if ((st = kg_schema_to_gbnf(text, len, &t, err))) {
            kg_text_free(&t);
            return st;
        }
        return from_text(&t, "json_schema", out, err);
    case KILN_GRAMMAR_JSON_OBJECT:
        if ((st = kg_schema_to_gbnf(k_json_object_schema, sizeof k_json_object_schema - 1, &t, err))) {
            kg_text_free(&t);
            return st;
        }
        return from_text(&t, "json_object", out, err);
    case KILN_GRAMMAR_REGEX:
        if (!valid_utf8(text, len))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "regex: not valid UTF-8");
        if ((st = kg_regex_to_gbnf(text, len, "root", false, &t, err))) {
            kg_text_free(&t);
            return st;
        }
        return from_text(&t, "regex", out, err);
    default:
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "grammar: unknown kind %d", (int)kind);
    }
}

KILN_API kiln_status kiln_grammar_from_choices(const char *const *choices, int32_t n,
                                               kiln_grammar **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "grammar: out is NULL");
    *out = NULL;
    if (n < 1 || !choices)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "guided_choice: at least one choice is needed");
    kg_text t = {0};
    if (!kg_text_add(&t, "root ::= ", 9)) goto oom;
    for (int32_t i = 0; i < n; i++) {
        const char *c = choices[i];
        if (!c || !c[0]) {
            kg_text_free(&t);
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "guided_choice[%d] is empty", i);
        }
        size_t cl = strlen(c);
        if (!valid_utf8(c, cl)) {
            kg_text_free(&t);
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "guided_choice[%d] is not valid UTF-8", i);
        }
        if (i && !kg_text_add(&t, " | ", 3)) goto oom;
        if (!kg_text_add(&t, "\"", 1)) goto oom;
        for (size_t k = 0; k < cl; k++) {
            unsigned char ch = (unsigned char)c[k];
            bool ok = ch == '"' ? kg_text_add(&t, "\\\"", 2)
                      : ch == '\\' ? kg_text_add(&t, "\\\\", 2)
                      : ch < 0x20 || ch == 0x7F ? kg_text_addf(&t, "\\x%02X", ch)
                                                : kg_text_add(&t, (const char *)&c[k], 1);
            if (!ok) goto oom;
        }
        if (!kg_text_add(&t, "\"", 1)) goto oom;
    }
    if (!kg_text_add(&t, "\n", 1)) goto oom;
    return from_text(&t, "choice", out, err);
oom:
    kg_text_free(&t);
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (guided_choice)");
}

KILN_API kiln_status kiln_json_schema_to_gbnf(const char *schema, size_t len, const char *prefix,
                                              char **out, kiln_error *err) {
    if (!out || !schema)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "json_schema: NULL argument");
    *out = NULL;
    if (len == 0) len = strlen(schema);
    kg_text t = {0};
    kiln_status st = kg_schema_to_gbnf_prefixed(schema, len, prefix, &t, err);
    if (st) {
        kg_text_free(&t);
        return st;
    }
    *out = t.p;
    return KILN_OK;
}

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

KILN_API const char *kiln_grammar_gbnf(const kiln_grammar *g) {
    return g && g->gbnf ? g->gbnf : "";
}

KILN_API kiln_status kiln_grammar_match(const kiln_grammar *g, const char *text, size_t len,
                                        bool *prefix_ok, bool *complete, kiln_error *err) {
    if (!g) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "grammar: NULL grammar");
    kiln_gmatch *m;
    kiln_status st = kiln_gmatch_create((kiln_grammar *)g, &m, err);
    if (st) return st;
    bool ok = kiln_gmatch_advance(m, (const uint8_t *)text, len);
    if (kiln_gmatch_overflowed(m)) {
        kiln_gmatch_destroy(m);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "grammar: the recognizer's state tables are full");
    }
    if (prefix_ok) *prefix_ok = ok;
    if (complete) *complete = ok && kiln_gmatch_accepting(m, kiln_gmatch_state(m));
    kiln_gmatch_destroy(m);
    return KILN_OK;
}
