/* Errors are values: syntax errors carry line and column; raise_exception fails the render with
 * exactly the template's message; undefined values, Python type errors and sandbox refusals
 * fail as Jinja2 3.1.6 does (messages checked where they match Jinja2's wording); resource
 * limits (steps, recursion, output, memory, nesting) stop hostile templates; bad arguments
 * are rejected. */
#include <jansson.h>
#include <string.h>

#include "template/template.h"
#include "test.h"

static kiln_status parse(const char *src, kiln_template **t, kiln_error *err) {
    return kiln_template_parse(src, strlen(src), t, err);
}

/* Render src with ctx_json (NULL = none) and opts; returns the status, fills diag. */
static kiln_status render(const char *src, const char *ctx_json, kiln_template_options *opts,
                          kiln_template_diag *diag, kiln_error *err, char **out) {
    kiln_template *t = NULL;
    kiln_status st = parse(src, &t, err);
    if (st != KILN_OK) return st;
    json_t *ctx = NULL;
    if (ctx_json) {
        json_error_t je;
        ctx = json_loads(ctx_json, 0, &je);
        REQUIRE(ctx);
    }
    kiln_template_options o = {0};
    if (opts) o = *opts;
    o.diag = diag;
    char *res = NULL;
    size_t len = 0;
    st = kiln_template_render(t, ctx, &o, &res, &len, err);
    if (out)
        *out = res;
    else
        free(res);
    json_decref(ctx);
    kiln_template_destroy(t);
    return st;
}

static void expect_syntax(const char *src, int line) {
    kiln_template *t = (kiln_template *)0x1;
    kiln_error err;
    kiln_status st = parse(src, &t, &err);
    CHECKF(st == KILN_ERR_FORMAT, "[%s] parsed (status %d)", src, st);
    CHECKF(t == NULL, "[%s] *out set on failure", src);
    char want[64];
    snprintf(want, sizeof want, "line %d, column ", line);
    CHECKF(st != KILN_ERR_FORMAT || strstr(err.message, want), "[%s] message [%s] lacks [%s]", src,
           err.message, want);
}

static void expect_runtime(const char *src, const char *ctx, kiln_template_error_kind kind,
                           const char *message) {
    kiln_template_diag diag;
    kiln_error err;
    char *out = NULL;
    kiln_status st = render(src, ctx, NULL, &diag, &err, &out);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT, "[%s] status %d, output [%s]", src, st, out ? out : "");
    CHECKF(out == NULL, "[%s] output set on failure", src);
    CHECKF(diag.kind == kind, "[%s] kind %d want %d (%s)", src, diag.kind, kind, diag.message);
    if (message)
        CHECKF(strcmp(diag.message, message) == 0, "[%s] message [%s] want [%s]", src, diag.message,
               message);
    free(out);
}

static void expect_limit(const char *src, kiln_template_options *opts) {
    kiln_template_diag diag;
    kiln_error err;
    kiln_status st = render(src, NULL, opts, &diag, &err, NULL);
    CHECKF(st != KILN_OK && diag.kind == KILN_TEMPLATE_ERR_LIMIT, "[%.60s] status %d kind %d (%s)",
           src, st, diag.kind, diag.message);
}

int main(void) {
    /* --- syntax errors (Jinja2 TemplateSyntaxError for each) --- */
    expect_syntax("{% if x %}", 1);
    expect_syntax("{% for %}", 1);
    expect_syntax("{% endfor %}", 1);
    expect_syntax("a\n{% if t %}{% else %}{% else %}{% endif %}", 2);
    expect_syntax("{{ x | }}", 1);
    expect_syntax("line one\nline two\n{{ )( }}", 3);
    expect_syntax("{{ 'unterminated }}", 1);
    expect_syntax("{{ x ]] }}", 1);
    expect_syntax("{# unterminated comment", 1);
    expect_syntax("{% raw %} unterminated raw", 1);
    expect_syntax("{{ 1 + }}", 1);
    expect_syntax("{% set 1 = 2 %}", 1);
    expect_syntax("{% set true = 2 %}", 1);
    expect_syntax("{% macro m(a=1, b) %}{% endmacro %}", 1);
    expect_syntax("{{ x|nonexistentfilter }}", 1);
    expect_syntax("{{ x is nonexistenttest }}", 1);
    expect_syntax("{% unknowntag %}", 1);
    expect_syntax("{% break %}", 1);
    expect_syntax("{% for i in x %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", 1);
    expect_syntax("{{ '\\xZZ' }}", 1);
    expect_syntax("{{ x is not is defined }}", 1);
    expect_syntax("{{ f(a=1, 2) }}", 1);
    /* an unknown filter inside an if or a conditional expression fails only when it runs */
    {
        kiln_template_diag diag;
        kiln_error err;
        char *out = NULL;
        CHECK(render("{% if false %}{{ x|nonexistent }}{% endif %}ok", NULL, NULL, &diag, &err,
                     &out) == KILN_OK &&
              out && strcmp(out, "ok") == 0);
        free(out);
        expect_runtime("{{ 1|nonexistent if true else 2 }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                       "TemplateRuntimeError: No filter named 'nonexistent' found.");
    }

    /* --- unsupported, bad arguments --- */
    static const char *const unsupported[] = {
        "{% extends 'base' %}",        "{% include 'x' %}", "{% import 'x' as y %}",
        "{% block b %}{% endblock %}", "{{ x|urlize }}",    NULL};
    for (int k = 0; unsupported[k]; k++) {
        kiln_template *t = NULL;
        kiln_error err;
        CHECKF(parse(unsupported[k], &t, &err) == KILN_ERR_UNSUPPORTED, "[%s]", unsupported[k]);
        CHECK(t == NULL);
    }
    {
        kiln_template *t = NULL;
        kiln_error err;
        CHECK(kiln_template_parse("a\xff", 2, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_parse("a\0b", 3, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_parse(NULL, 1, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_parse("x", 1, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_parse(NULL, 0, &t, NULL) == KILN_OK); /* empty template */
        char *out = (char *)0x1;
        size_t len = 7;
        CHECK(kiln_template_render(t, NULL, NULL, &out, &len, &err) == KILN_OK && len == 0 &&
              out[0] == 0);
        free(out);
        json_t *arr = json_array();
        CHECK(kiln_template_render(t, arr, NULL, &out, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_render(NULL, NULL, NULL, &out, &len, &err) ==
              KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_template_render(t, NULL, NULL, NULL, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
        json_decref(arr);
        kiln_template_destroy(t);
        kiln_template_destroy(NULL);
    }

    /* --- raise_exception: the message is exactly the template's --- */
    {
        kiln_template_diag diag;
        kiln_error err;
        kiln_status st = render("line 1\n{% if messages[0]['role'] == 'system' %}"
                                "{{ raise_exception('System role not supported') }}{% endif %}",
                                "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", NULL,
                                &diag, &err, NULL);
        CHECK(st == KILN_ERR_INVALID_ARGUMENT);
        CHECK(diag.kind == KILN_TEMPLATE_ERR_RAISED);
        CHECKF(strcmp(err.message, "System role not supported") == 0, "[%s]", err.message);
        CHECK(strcmp(diag.message, "System role not supported") == 0);
        CHECK(diag.line == 2);
        expect_runtime("{{ raise_exception('n=' ~ 3) }}", NULL, KILN_TEMPLATE_ERR_RAISED, "n=3");
    }

    /* --- runtime errors (messages as Jinja2 3.1.6 words them) --- */
    expect_runtime("{{ zz + 'a' }}", NULL, KILN_TEMPLATE_ERR_UNDEFINED,
                   "UndefinedError: 'zz' is undefined");
    expect_runtime("{{ zz.attr }}", NULL, KILN_TEMPLATE_ERR_UNDEFINED,
                   "UndefinedError: 'zz' is undefined");
    expect_runtime("{{ zz() }}", NULL, KILN_TEMPLATE_ERR_UNDEFINED, NULL);
    expect_runtime("{{ 'x: ' + d.missing }}", "{\"d\":{\"a\":1}}", KILN_TEMPLATE_ERR_UNDEFINED,
                   "UndefinedError: 'dict object' has no attribute 'missing'");
    expect_runtime("{{ 'a' + d }}", "{\"d\":{\"a\":1}}", KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: can only concatenate str (not \"dict\") to str");
    expect_runtime("{{ 1 + 'a' }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: unsupported operand type(s) for +: 'int' and 'str'");
    expect_runtime("{{ 1 / 0 }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "ZeroDivisionError: division by zero");
    expect_runtime("{{ 1 < 'a' }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: '<' not supported between instances of 'int' and 'str'");
    expect_runtime("{{ zz|tojson }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: Object of type Undefined is not JSON serializable");
    expect_runtime("{{ [1]|map('string')|tojson }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: Object of type generator is not JSON serializable");
    expect_runtime("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "ValueError: too many values to unpack (expected 2)");
    expect_runtime("{% for i in 5 %}{% endfor %}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: 'int' object is not iterable");
    expect_runtime("{% set x.y = 1 %}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TemplateRuntimeError: cannot assign attribute on non-namespace object");
    expect_runtime("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: macro 'm' takes not more than 1 argument(s)");
    expect_runtime("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", NULL, KILN_TEMPLATE_ERR_TYPE,
                   "TypeError: macro 'm' takes no keyword argument 'b'");
    {
        /* context strings may hold NUL (as JSON allows); the output keeps it */
        json_t *ctx = json_object();
        json_object_set_new(ctx, "s", json_stringn("a\0b", 3));
        kiln_template *t = NULL;
        kiln_error err;
        REQUIRE(parse("[{{ s }}|{{ s|length }}]", &t, &err) == KILN_OK);
        char *out = NULL;
        size_t len = 0;
        CHECK(kiln_template_render(t, ctx, NULL, &out, &len, &err) == KILN_OK && len == 7 &&
              memcmp(out, "[a\0b|3]", 7) == 0);
        free(out);
        kiln_template_destroy(t);
        json_decref(ctx);
    }
    expect_runtime("{% filter length %}abc{% endfilter %}", NULL, KILN_TEMPLATE_ERR_TYPE, NULL);
    expect_runtime("{{ x|tojson(indent=2.5) }}", "{\"x\":[1]}", KILN_TEMPLATE_ERR_TYPE, NULL);
    expect_runtime("{{ x[1:2:0] }}", "{\"x\":[1]}", KILN_TEMPLATE_ERR_TYPE,
                   "ValueError: slice step cannot be zero");
    /* the sandbox (ImmutableSandboxedEnvironment) refuses mutation */
    expect_runtime("{{ x.append(4) }}", "{\"x\":[1]}", KILN_TEMPLATE_ERR_SECURITY,
                   "SecurityError: access to attribute 'append' of 'list' object is unsafe.");
    expect_runtime("{{ d.update({'z': 1}) }}", "{\"d\":{}}", KILN_TEMPLATE_ERR_SECURITY, NULL);
    expect_runtime("{{ d.__class__() }}", "{\"d\":{}}", KILN_TEMPLATE_ERR_SECURITY, NULL);
    expect_runtime("{{ range(100001)|length }}", NULL, KILN_TEMPLATE_ERR_LIMIT,
                   "OverflowError: Range too big. The sandbox blocks ranges larger than "
                   "MAX_RANGE (100000).");

    /* --- resource limits --- */
    kiln_template_options lim = {.max_steps = 100000};
    expect_limit("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 &lim);
    expect_limit("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", NULL);
    expect_limit(
        "{% macro m(n) %}{% for i in [1] %}{{ m(n + 1) }}{% endfor %}{% endmacro %}{{ m(0) }}",
        NULL);
    {
        /* empty sequences repeated a huge number of times are empty, at once */
        kiln_template_diag diag;
        kiln_error err;
        char *out = NULL;
        CHECK(render("[{{ '' * 4611686018427387904 }}|{{ [] * 4611686018427387904 }}]", NULL, NULL,
                     &diag, &err, &out) == KILN_OK &&
              out && strcmp(out, "[|[]]") == 0);
        free(out);
    }
    kiln_template_options small_out = {.max_output = 1000};
    expect_limit("{{ 'x' * 100000 }}", &small_out);
    expect_limit("{% for i in range(2000) %}x{% endfor %}", &small_out);
    kiln_template_options small_mem = {.max_memory = 1 << 20};
    expect_limit("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                 &small_mem);
    expect_limit("{% set ns = namespace(l=[0]) %}{% for i in range(40) %}"
                 "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
                 NULL);
    {
        /* nesting beyond the parser's bound is a syntax error, not a stack overflow */
        char deep[4096];
        size_t o = 0;
        o += (size_t)snprintf(deep + o, sizeof deep - o, "{{ ");
        for (int k = 0; k < 1000; k++) deep[o++] = '(';
        deep[o++] = '1';
        for (int k = 0; k < 1000; k++) deep[o++] = ')';
        snprintf(deep + o, sizeof deep - o, " }}");
        expect_syntax(deep, 1);
        o = 0;
        for (int k = 0; k < 400; k++)
            o += (size_t)snprintf(deep + o, sizeof deep - o, "{%%if 1%%}");
        expect_syntax(deep, 1);
        /* operator chains are parsed by loops; their height is bounded before evaluation */
        char *chain = malloc(20000);
        REQUIRE(chain);
        o = (size_t)snprintf(chain, 20000, "{{ 1");
        for (int k = 0; k < 3000; k++) o += (size_t)snprintf(chain + o, 20000 - o, "+1");
        snprintf(chain + o, 20000 - o, " }}");
        expect_syntax(chain, 1);
        o = (size_t)snprintf(chain, 20000, "{{ x");
        for (int k = 0; k < 3000; k++) o += (size_t)snprintf(chain + o, 20000 - o, "|trim");
        snprintf(chain + o, 20000 - o, " }}");
        expect_syntax(chain, 1);
        o = (size_t)snprintf(chain, 20000, "{{ 1");
        for (int k = 0; k < 700; k++) o += (size_t)snprintf(chain + o, 20000 - o, "+1");
        snprintf(chain + o, 20000 - o, " }}");
        kiln_template_options shallow = {.max_depth = 500};
        expect_limit(chain, &shallow); /* parses, but evaluation is deeper than max_depth */
        free(chain);
        o = 0;
        o += (size_t)snprintf(deep + o, sizeof deep - o, "{{ ");
        for (int k = 0; k < 1000; k++) o += (size_t)snprintf(deep + o, sizeof deep - o, "not ");
        snprintf(deep + o, sizeof deep - o, "1 }}");
        expect_syntax(deep, 1);
    }

    /* --- a failed render leaves the template usable; diag reports the position --- */
    {
        kiln_template *t = NULL;
        kiln_error err;
        REQUIRE(parse("a\nb\n{{ 1 if ok else zz.boom }}", &t, &err) == KILN_OK);
        json_t *yes = json_loads("{\"ok\":true}", 0, NULL), *no = json_loads("{}", 0, NULL);
        kiln_template_diag diag;
        kiln_template_options o = {.diag = &diag};
        char *out = NULL;
        size_t len;
        CHECK(kiln_template_render(t, no, &o, &out, &len, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(diag.kind == KILN_TEMPLATE_ERR_UNDEFINED && diag.line == 3 && diag.column > 1);
        CHECKF(strstr(err.message, "line 3") != NULL, "[%s]", err.message);
        CHECK(kiln_template_render(t, yes, &o, &out, &len, &err) == KILN_OK);
        CHECK(diag.kind == KILN_TEMPLATE_OK);
        CHECK(out && strcmp(out, "a\nb\n1") == 0);
        free(out);
        json_decref(yes);
        json_decref(no);
        kiln_template_destroy(t);
    }

    /* --- the ChatML fallback (transformers' former default template) --- */
    {
        kiln_template_diag diag;
        kiln_error err;
        char *out = NULL;
        kiln_status st = render(kiln_template_chatml,
                                "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                                "{\"role\":\"user\",\"content\":\"Hi\"}],"
                                "\"add_generation_prompt\":true}",
                                NULL, &diag, &err, &out);
        CHECK(st == KILN_OK);
        CHECKF(out &&
                   strcmp(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\n") == 0,
               "[%s]", out ? out : "");
        free(out);
    }
    return kiln_test_finish("test_template_errors");
}
