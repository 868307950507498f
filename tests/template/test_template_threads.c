/* A parsed template is immutable: several threads render it at once and each gets the
 * single-threaded output (the server renders one template for all requests). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"
#include "test.h"

enum { THREADS = 4, ROUNDS = 40 };

static const kiln_template *tpl;
static json_t *ctx;
static const char *want;
static size_t want_len;
static int failures[THREADS];

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    struct tm now = {.tm_year = 126, .tm_mon = 0, .tm_mday = 15, .tm_hour = 9, .tm_min = 30};
    kiln_template_options o = {.now = &now};
    for (int r = 0; r < ROUNDS; r++) {
        char *out = NULL;
        size_t len = 0;
        kiln_error err;
        if (kiln_template_render(tpl, ctx, &o, &out, &len, &err) != KILN_OK || len != want_len ||
            memcmp(out, want, len) != 0)
            failures[id]++;
        free(out);
    }
    return NULL;
}

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
    *len = (size_t)n;
    return buf;
}

int main(void) {
    const char *cases_path = kiln_test_shared("templates/cases.json");
    kiln_test_require_file(cases_path);
    json_t *root = json_load_file(cases_path, 0, NULL);
    REQUIRE(root);
    /* a tool-calling case: macros, loops, tojson */
    json_t *cs = NULL, *c;
    size_t k;
    json_array_foreach(json_object_get(root, "cases"), k, c) {
        const char *tn = json_string_value(json_object_get(c, "template"));
        const char *cn = json_string_value(json_object_get(c, "case"));
        if (tn && cn && strcmp(tn, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja") == 0 &&
            strcmp(cn, "tools_call_roundtrip") == 0)
            cs = c;
    }
    REQUIRE(cs);
    size_t len;
    char *src = read_file(
        kiln_test_shared("templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"), &len);
    REQUIRE(src);
    kiln_template *t = NULL;
    kiln_error err;
    REQUIRE(kiln_template_parse(src, len, &t, &err) == KILN_OK);
    tpl = t;
    ctx = json_object_get(cs, "context");
    want = json_string_value(json_object_get(cs, "expected"));
    REQUIRE(want);
    want_len = json_string_length(json_object_get(cs, "expected"));
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++)
        CHECKF(failures[i] == 0, "thread %d: %d bad renders", i, failures[i]);
    kiln_template_destroy(t);
    free(src);
    json_decref(root);
    return kiln_test_finish("test_template_threads");
}
