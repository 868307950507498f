/* kv_names.c - KV page-format names for the command line, from the format traits table
 * (kv/kv_format.h: kiln_kv_format_by_name / kiln_kv_format_names), so a format added to that
 * table is accepted by perplexity and fit at once. */
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

const char *cli_kv_format_name(kiln_dtype t) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    return f && f->name ? f->name : "?";
}
