/* kv_names.c - KV page-format names for the command line, from the format traits table
 * (kv/kv_format.h: kiln_kv_format_by_name / kiln_kv_format_names), so a format added to that
 * table is accepted by perplexity and fit at once. */
#include <string.h>

#include "cli/cli.h"
#include "kv/kv_format.h"

bool cli_parse_kv_format(const char *s, kiln_dtype *out) {
    const kiln_kv_format_traits *f = kiln_kv_format_by_name(s);
    if (!f) return false;
    *out = f->dtype;
    return true;
}

const char *cli_kv_format_names(void) {
    return kiln_kv_format_names();
}

int cli_kv_side_option(const char *cmd, const char *opt, const char *arg, kiln_dtype *k,
                       kiln_dtype *v) {
    kiln_dtype t;
    if (!arg || !cli_parse_kv_format(arg, &t))
        return cli_usage_error(cmd, "%s must be one of %s (got '%s')", opt, cli_kv_format_names(),
                               arg ? arg : "");
    const bool only_k = !strcmp(opt, "--kv-type-k"), only_v = !strcmp(opt, "--kv-type-v");
    if (!only_v) *k = t;
    if (!only_k) *v = t;
    return 0;
}

const char *cli_kv_format_name(kiln_dtype t) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    return f && f->name ? f->name : "?";
}
