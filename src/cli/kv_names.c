/* kv_names.c - KV page-format names for the command line, from the format traits table
 * (kv/kv_format.h), so a format added to that table is accepted by perplexity and fit at
 * once. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kv/kv_format.h"

bool cli_parse_kv_format(const char *s, kiln_dtype *out) {
    if (!s) return false;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        const kiln_kv_format_traits *f = kiln_kv_format_of((kiln_dtype)d);
        if (f && f->name && !strcmp(f->name, s)) {
            *out = (kiln_dtype)d;
            return true;
        }
    }
    return false;
}

const char *cli_kv_format_names(void) {
    static char buf[256];
    size_t o = 0;
    buf[0] = '\0';
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        const kiln_kv_format_traits *f = kiln_kv_format_of((kiln_dtype)d);
        if (!f || !f->name) continue;
        int n = snprintf(buf + o, sizeof buf - o, "%s%s", o ? ", " : "", f->name);
        if (n < 0 || (size_t)n >= sizeof buf - o) break;
        o += (size_t)n;
    }
    return buf;
}

const char *cli_kv_format_name(kiln_dtype t) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    return f && f->name ? f->name : "?";
}
