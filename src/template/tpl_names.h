/* tpl_names.h - ids of the built-in filters, tests and methods (tpl_names.c); internal. */
#ifndef KILN_TEMPLATE_TPL_NAMES_H
#define KILN_TEMPLATE_TPL_NAMES_H

#include "template/tpl.h"

/* Filters. tpl_filter_id: the id of a name, -1 when unknown, -2 for a Jinja2 filter this
 * interpreter does not implement. */
enum {
    FL_ABS,
    FL_ATTR,
    FL_BATCH,
    FL_CAPITALIZE,
    FL_CENTER,
    FL_COUNT,
    FL_D,
    FL_DEFAULT,
    FL_DICTSORT,
    FL_E,
    FL_ESCAPE,
    FL_FIRST,
    FL_FLOAT,
    FL_FORCEESCAPE,
    FL_FORMAT,
    FL_GROUPBY,
    FL_INDENT,
    FL_INT,
    FL_ITEMS,
    FL_JOIN,
    FL_LAST,
    FL_LENGTH,
    FL_LIST,
    FL_LOWER,
    FL_MAP,
    FL_MAX,
    FL_MIN,
    FL_REJECT,
    FL_REJECTATTR,
    FL_REPLACE,
    FL_REVERSE,
    FL_ROUND,
    FL_SAFE,
    FL_SELECT,
    FL_SELECTATTR,
    FL_SLICE,
    FL_SORT,
    FL_STRING,
    FL_SUM,
    FL_TITLE,
    FL_TOJSON,
    FL_TRIM,
    FL_TRUNCATE,
    FL_UNIQUE,
    FL_UPPER,
    FL_WORDCOUNT,
    FL_COUNT_
};

int tpl_filter_id(const char *name, size_t len);
const char *tpl_filter_name(int id); /* "filter" for an unknown id */

/* Tests. Several names share an id ("==", "eq", "equalto"); tpl_test_name gives the first. */
enum {
    TS_ODD,
    TS_EVEN,
    TS_DIVISIBLEBY,
    TS_DEFINED,
    TS_UNDEFINED,
    TS_FILTER,
    TS_TEST,
    TS_NONE,
    TS_BOOLEAN,
    TS_FALSE,
    TS_TRUE,
    TS_INTEGER,
    TS_FLOAT,
    TS_LOWER,
    TS_UPPER,
    TS_STRING,
    TS_MAPPING,
    TS_NUMBER,
    TS_SEQUENCE,
    TS_ITERABLE,
    TS_CALLABLE,
    TS_SAMEAS,
    TS_ESCAPED,
    TS_IN,
    TS_EQ,
    TS_NE,
    TS_GT,
    TS_GE,
    TS_LT,
    TS_LE,
    TS_COUNT_
};

int tpl_test_id(const char *name, size_t len); /* -1: unknown */
const char *tpl_test_name(int id);             /* "test" for an unknown id */

/* Methods: ids by receiver type (str below 100, dict, list/tuple, loop). */
enum {
    /* str */
    M_STRIP,
    M_LSTRIP,
    M_RSTRIP,
    M_SPLIT,
    M_RSPLIT,
    M_SPLITLINES,
    M_STARTSWITH,
    M_ENDSWITH,
    M_UPPER,
    M_LOWER,
    M_TITLE,
    M_CAPITALIZE,
    M_SWAPCASE,
    M_CASEFOLD,
    M_REPLACE,
    M_FIND,
    M_RFIND,
    M_INDEX,
    M_RINDEX,
    M_SCOUNT,
    M_JOIN,
    M_ISDIGIT,
    M_ISDECIMAL,
    M_ISNUMERIC,
    M_ISALPHA,
    M_ISALNUM,
    M_ISSPACE,
    M_ISLOWER,
    M_ISUPPER,
    M_ISTITLE,
    M_CENTER,
    M_LJUST,
    M_RJUST,
    M_ZFILL,
    M_PARTITION,
    M_RPARTITION,
    M_REMOVEPREFIX,
    M_REMOVESUFFIX,
    M_FORMAT,
    M_STR_LAST_,
    /* dict */
    M_GET = 100,
    M_ITEMS,
    M_KEYS,
    M_VALUES,
    M_DCOPY,
    M_DICT_UNSAFE, /* clear pop popitem setdefault update */
    /* list / tuple */
    M_LCOUNT = 200,
    M_LINDEX,
    M_LCOPY,
    M_LIST_UNSAFE, /* append clear extend insert pop remove reverse sort */
    /* loop */
    M_CYCLE = 300,
    M_CHANGED,
};

/* The method `name` of obj, -1 when it has none; *unsafe for the mutating methods of dict and
 * list, which the sandbox refuses. */
int tpl_method_id(tv obj, const char *name, size_t len, bool *unsafe);
const char *tpl_method_name(int id);

#endif
