/* Every case of ../shared/templates/cases.json renders byte for byte; cases that expect an
 * error fail, with the template's own message when it came from raise_exception. Prints
 * pass counts per template. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"
#include "test.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static void show_diff(const char *got, size_t gl, const char *want, size_t wl) {
    size_t i = 0;
    while (i < gl && i < wl && got[i] == want[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu (got %zu bytes, want %zu)\n", i, gl, wl);
    fprintf(stderr, "    got:  ...%.*s|%.*s\n", (int)(i - from), got + from,
            (int)(gl - i > 80 ? 80 : gl - i), got + i);
    fprintf(stderr, "    want: ...%.*s|%.*s\n", (int)(i - from), want + from,
            (int)(wl - i > 80 ? 80 : wl - i), want + i);
}

int main(void) {
    const char *cases_path = kiln_test_shared("templates/cases.json");
    kiln_test_require_file(cases_path);
    json_error_t jerr;
    json_t *root = json_load_file(cases_path, 0, &jerr);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_is_array(cases) && json_array_size(cases) > 0);

    struct tm now = {.tm_year = 2026 - 1900,
                     .tm_mon = 0,
                     .tm_mday = 15,
                     .tm_hour = 9,
                     .tm_min = 30,
                     .tm_sec = 0};
    const char *names[64];
    int pass[64] = {0}, total[64] = {0}, ntpl = 0;
    int all_pass = 0, all = 0;

    size_t k;
    json_t *cs;
    json_array_foreach(cases, k, cs) {
        const char *tname = json_string_value(json_object_get(cs, "template"));
        const char *cname = json_string_value(json_object_get(cs, "case"));
        json_t *ctx = json_object_get(cs, "context");
        json_t *expected = json_object_get(cs, "expected");
        json_t *error = json_object_get(cs, "error");
        REQUIRE(tname && cname && json_is_object(ctx) && (expected || error));
        int ti = 0;
        while (ti < ntpl && strcmp(names[ti], tname) != 0) ti++;
        if (ti == ntpl) {
            REQUIRE(ntpl < 64);
            names[ntpl++] = tname;
        }
        total[ti]++;
        all++;

        char rel[512];
        snprintf(rel, sizeof rel, "templates/%s", tname);
        size_t len;
        char *src = read_file(kiln_test_shared(rel), &len);
        CHECKF(src, "%s: cannot read", rel);
        if (!src) continue;
        kiln_template *t = NULL;
        kiln_error err;
        kiln_status st = kiln_template_parse(src, len, &t, &err);
        free(src);
        if (st != KILN_OK) {
            CHECKF(0, "%s: parse failed: %s", tname, err.message);
            continue;
        }
        kiln_template_diag diag;
        kiln_template_options opts = {.now = &now, .diag = &diag};
        char *out = NULL;
        size_t out_len = 0;
        st = kiln_template_render(t, ctx, &opts, &out, &out_len, &err);
        bool ok;
        if (expected) {
            const char *want = json_string_value(expected);
            size_t wl = json_string_length(expected);
            ok = st == KILN_OK && out_len == wl && memcmp(out, want, wl) == 0;
            if (!ok) {
                fprintf(stderr, "FAIL %s / %s\n", tname, cname);
                if (st != KILN_OK)
                    fprintf(stderr, "    render error: %s\n", err.message);
                else
                    show_diff(out, out_len, want, wl);
            }
        } else {
            const char *want = json_string_value(error);
            ok = st != KILN_OK;
            const char *prefix = "TemplateError: ";
            if (ok && strncmp(want, prefix, strlen(prefix)) == 0) {
                /* raised by raise_exception(msg): the message must be the template's text */
                ok = diag.kind == KILN_TEMPLATE_ERR_RAISED &&
                     strcmp(err.message, want + strlen(prefix)) == 0;
            }
            if (!ok)
                fprintf(stderr, "FAIL %s / %s: want error \"%s\", got %s\n", tname, cname, want,
                        st == KILN_OK ? "success" : err.message);
        }
        free(out);
        kiln_template_destroy(t);
        if (ok) {
            pass[ti]++;
            all_pass++;
        }
        CHECKF(ok, "%s / %s", tname, cname);
    }
    for (int i = 0; i < ntpl; i++) printf("%-55s %d/%d\n", names[i], pass[i], total[i]);
    printf("total %d/%d\n", all_pass, all);
    json_decref(root);
    return kiln_test_finish("test_template_conformance");
}
