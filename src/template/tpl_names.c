/* tpl_names.c - the names of the built-ins a template can reach and their ids (tpl_names.h):
 * Jinja2's filters and tests, which the parser resolves, and the methods of str, dict, list
 * and loop objects, which attribute access resolves at render time. What they do is in
 * tpl_filters.c, tpl_tests.c and tpl_methods.c. */
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

/* ---------------------------------------------------------------------------------------- */
/* filters and tests                                                                        */

static const char *const filter_names[FL_COUNT_] = {
    "abs",        "attr",     "batch",   "capitalize", "center", "count",  "d",
    "default",    "dictsort", "e",       "escape",     "first",  "float",  "forceescape",
    "format",     "groupby",  "indent",  "int",        "items",  "join",   "last",
    "length",     "list",     "lower",   "map",        "max",    "min",    "reject",
    "rejectattr", "replace",  "reverse", "round",      "safe",   "select", "selectattr",
    "slice",      "sort",     "string",  "sum",        "title",  "tojson", "trim",
    "truncate",   "unique",   "upper",   "wordcount",
};

/* Jinja2 filters this interpreter does not implement (parse error UNSUPPORTED). */
static const char *const unsupported_filters[] = {
    "filesizeformat", "pprint",   "random",  "striptags", "urlencode",
    "urlize",         "wordwrap", "xmlattr", NULL,
};

static const struct {
    const char *name;
    int id;
} test_names[] = {
    {"odd", TS_ODD},
    {"even", TS_EVEN},
    {"divisibleby", TS_DIVISIBLEBY},
    {"defined", TS_DEFINED},
    {"undefined", TS_UNDEFINED},
    {"filter", TS_FILTER},
    {"test", TS_TEST},
    {"none", TS_NONE},
    {"boolean", TS_BOOLEAN},
    {"false", TS_FALSE},
    {"true", TS_TRUE},
    {"integer", TS_INTEGER},
    {"float", TS_FLOAT},
    {"lower", TS_LOWER},
    {"upper", TS_UPPER},
    {"string", TS_STRING},
    {"mapping", TS_MAPPING},
    {"number", TS_NUMBER},
    {"sequence", TS_SEQUENCE},
    {"iterable", TS_ITERABLE},
    {"callable", TS_CALLABLE},
    {"sameas", TS_SAMEAS},
    {"escaped", TS_ESCAPED},
    {"in", TS_IN},
    {"==", TS_EQ},
    {"eq", TS_EQ},
    {"equalto", TS_EQ},
    {"!=", TS_NE},
    {"ne", TS_NE},
    {">", TS_GT},
    {"gt", TS_GT},
    {"greaterthan", TS_GT},
    {">=", TS_GE},
    {"ge", TS_GE},
    {"<", TS_LT},
    {"lt", TS_LT},
    {"lessthan", TS_LT},
    {"<=", TS_LE},
    {"le", TS_LE},
};

static bool name_is(const char *a, size_t n, const char *b) {
    return strlen(b) == n && memcmp(a, b, n) == 0;
}

int tpl_filter_id(const char *name, size_t len) {
    for (int k = 0; k < FL_COUNT_; k++)
        if (name_is(name, len, filter_names[k])) return k;
    for (int k = 0; unsupported_filters[k]; k++)
        if (name_is(name, len, unsupported_filters[k])) return -2;
    return -1;
}

const char *tpl_filter_name(int id) {
    return (id >= 0 && id < FL_COUNT_) ? filter_names[id] : "filter";
}

int tpl_test_id(const char *name, size_t len) {
    for (size_t k = 0; k < sizeof test_names / sizeof test_names[0]; k++)
        if (name_is(name, len, test_names[k].name)) return test_names[k].id;
    return -1;
}

const char *tpl_test_name(int id) {
    for (size_t k = 0; k < sizeof test_names / sizeof test_names[0]; k++)
        if (test_names[k].id == id) return test_names[k].name;
    return "test";
}

/* ---------------------------------------------------------------------------------------- */
/* methods                                                                                  */

static const struct {
    const char *name;
    int id;
} str_methods[] = {
    {"strip", M_STRIP},
    {"lstrip", M_LSTRIP},
    {"rstrip", M_RSTRIP},
    {"split", M_SPLIT},
    {"rsplit", M_RSPLIT},
    {"splitlines", M_SPLITLINES},
    {"startswith", M_STARTSWITH},
    {"endswith", M_ENDSWITH},
    {"upper", M_UPPER},
    {"lower", M_LOWER},
    {"title", M_TITLE},
    {"capitalize", M_CAPITALIZE},
    {"swapcase", M_SWAPCASE},
    {"casefold", M_CASEFOLD},
    {"replace", M_REPLACE},
    {"find", M_FIND},
    {"rfind", M_RFIND},
    {"index", M_INDEX},
    {"rindex", M_RINDEX},
    {"count", M_SCOUNT},
    {"join", M_JOIN},
    {"isdigit", M_ISDIGIT},
    {"isdecimal", M_ISDECIMAL},
    {"isnumeric", M_ISNUMERIC},
    {"isalpha", M_ISALPHA},
    {"isalnum", M_ISALNUM},
    {"isspace", M_ISSPACE},
    {"islower", M_ISLOWER},
    {"isupper", M_ISUPPER},
    {"istitle", M_ISTITLE},
    {"center", M_CENTER},
    {"ljust", M_LJUST},
    {"rjust", M_RJUST},
    {"zfill", M_ZFILL},
    {"partition", M_PARTITION},
    {"rpartition", M_RPARTITION},
    {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX},
    {"format", M_FORMAT},
};

static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const list_unsafe[] = {"append", "clear",   "extend", "insert", "pop",
                                          "remove", "reverse", "sort",   NULL};

const char *tpl_method_name(int id) {
    for (size_t k = 0; k < sizeof str_methods / sizeof str_methods[0]; k++)
        if (str_methods[k].id == id) return str_methods[k].name;
    switch (id) {
    case M_GET:
        return "get";
    case M_ITEMS:
        return "items";
    case M_KEYS:
        return "keys";
    case M_VALUES:
        return "values";
    case M_DCOPY:
    case M_LCOPY:
        return "copy";
    case M_LCOUNT:
        return "count";
    case M_LINDEX:
        return "index";
    case M_CYCLE:
        return "cycle";
    case M_CHANGED:
        return "changed";
    }
    return "method";
}

int tpl_method_id(tv obj, const char *name, size_t len, bool *unsafe) {
    *unsafe = false;
    switch (obj.type) {
    case TV_STR:
        for (size_t k = 0; k < sizeof str_methods / sizeof str_methods[0]; k++)
            if (name_is(name, len, str_methods[k].name)) return str_methods[k].id;
        return -1;
    case TV_DICT:
        if (name_is(name, len, "get")) return M_GET;
        if (name_is(name, len, "items")) return M_ITEMS;
        if (name_is(name, len, "keys")) return M_KEYS;
        if (name_is(name, len, "values")) return M_VALUES;
        if (name_is(name, len, "copy")) return M_DCOPY;
        for (int k = 0; dict_unsafe[k]; k++)
            if (name_is(name, len, dict_unsafe[k])) {
                *unsafe = true;
                return M_DICT_UNSAFE;
            }
        return -1;
    case TV_LIST:
        if (obj.l->kind == L_LIST || obj.l->kind == L_TUPLE || obj.l->kind == L_RANGE) {
            if (name_is(name, len, "count")) return M_LCOUNT;
            if (name_is(name, len, "index")) return M_LINDEX;
        }
        if (obj.l->kind == L_LIST) {
            if (name_is(name, len, "copy")) return M_LCOPY;
            for (int k = 0; list_unsafe[k]; k++)
                if (name_is(name, len, list_unsafe[k])) {
                    *unsafe = true;
                    return M_LIST_UNSAFE;
                }
        }
        return -1;
    case TV_LOOP:
        if (name_is(name, len, "cycle")) return M_CYCLE;
        if (name_is(name, len, "changed")) return M_CHANGED;
        return -1;
    default:
        return -1;
    }
}
