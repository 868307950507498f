/* Lexer whitespace rules in transformers' environment (trim_blocks, lstrip_blocks), as the
 * Jinja2 docs ("Whitespace Control") describe them: trim_blocks removes the first newline
 * after a block or comment tag (not after {{ }}); lstrip_blocks removes whitespace from the
 * start of a line up to a block or comment tag (not before {{ }}); '-' strips all whitespace
 * on that side; '+' disables lstrip/trim for the tag; one trailing newline of the template is
 * dropped; \r\n and \r become \n; raw blocks render verbatim. The expected outputs were
 * rendered by Python Jinja2 3.1.6 with those settings. */
#include <string.h>

#include "template/template.h"
#include "test.h"

static const struct {
    const char *name, *src, *want;
} cases[] = {
    {"block_trim", "a\n{% if true %}\nb\n{% endif %}\nc", "a\nb\nc"},
    {"block_lstrip", "a\n    {% if true %}\n    b\n    {% endif %}\nc", "a\n    b\nc"},
    {"lstrip_tabs", "a\n\t \t{% if true %}x{% endif %}", "a\nx"},
    {"lstrip_not_after_text", "a x {% if true %}b{% endif %}", "a x b"},
    {"lstrip_unicode_space", "a\n\343\200\200{% if true %}b{% endif %}", "a\nb"},
    {"lstrip_start_of_template", "   {% if true %}b{% endif %}", "b"},
    {"lstrip_not_var", "a\n    {{ 'v' }}\n", "a\n    v"},
    {"trim_not_var", "{{ 'v' }}\nnext", "v\nnext"},
    {"trim_one_newline_only", "{% if true %}\n\nb{% endif %}", "\nb"},
    {"trim_crlf", "{% if true %}\r\nb{% endif %}", "b"},
    {"minus_left", "a  \n  {%- if true %}b{% endif %}", "ab"},
    {"minus_right", "{% if true -%}  \n\n  b{% endif %}", "b"},
    {"minus_var", "a  \n  {{- 'v' -}}  \n  b", "avb"},
    {"minus_unicode", "a\343\200\200\342\200\203{{- 'v' }}", "av"},
    {"plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}", "a\n    b"},
    {"plus_disables_trim", "{% if true +%}\nb{% endif %}", "\nb"},
    {"comment_trim", "a\n{# c #}\nb", "a\nb"},
    {"comment_lstrip", "a\n   {# c #}\nb", "a\nb"},
    {"comment_minus", "a  {#- c -#}  b", "ab"},
    {"comment_plus", "a\n   {#+ c +#}\nb", "a\n   \nb"},
    {"comment_multiline", "a\n{# one\ntwo #}\nb", "a\nb"},
    {"raw_block", "{% raw %}{{ x }}{% if %}{% endraw %}", "{{ x }}{% if %}"},
    {"raw_minus", " a  {%- raw -%}  {{ x }}  {%- endraw -%}  b", " a{{ x }}b"},
    {"raw_keeps_newline", "{% raw %}\nx\n{% endraw %}\ny", "\nx\ny"},
    {"raw_lstrip", "a\n  {% raw %}b{% endraw %}", "a\nb"},
    {"trailing_newline_dropped", "text\n", "text"},
    {"only_one_trailing_newline", "text\n\n", "text\n"},
    {"crlf_normalized", "a\r\nb\rc", "a\nb\nc"},
    {"nested_loops_layout",
     "{% for i in [1, 2] %}\n  {% for j in 'ab' %}\n    {{ i }}{{ j }}\n  {% endfor %}\n{% endfor "
     "%}",
     "    1a\n    1b\n    2a\n    2b\n"},
    {"macro_layout", "{% macro m(x) %}\n  [{{ x }}]\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}",
     "  [1]\n  [2]\n"},
    {"set_block_layout", "{% set s %}\n  inner\n{% endset %}({{ s }})", "(  inner\n)"},
    {"chat_like",
     "{%- for m in [{'r': 'user', 'c': 'hi'}, {'r': 'assistant', 'c': 'yo'}] %}\n    {{- '<|' + "
     "m.r + '|>\n' + m.c + '\n' }}\n{%- endfor %}\n{%- if true %}\n    {{- '<|assistant|>\n' "
     "}}\n{%- endif %}",
     "<|user|>\nhi\n<|assistant|>\nyo\n<|assistant|>\n"},
};

int main(void) {
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kiln_template *t = NULL;
        kiln_error err;
        kiln_status st = kiln_template_parse(cases[k].src, strlen(cases[k].src), &t, &err);
        CHECKF(st == KILN_OK, "%s: parse: %s", cases[k].name, err.message);
        if (st != KILN_OK) continue;
        char *out = NULL;
        size_t len = 0;
        st = kiln_template_render(t, NULL, NULL, &out, &len, &err);
        CHECKF(st == KILN_OK, "%s: render: %s", cases[k].name, err.message);
        if (st == KILN_OK) {
            CHECKF(len == strlen(cases[k].want) && memcmp(out, cases[k].want, len) == 0,
                   "%s: got [%s] want [%s]", cases[k].name, out, cases[k].want);
            free(out);
        }
        kiln_template_destroy(t);
    }
    return kiln_test_finish("test_template_whitespace");
}
