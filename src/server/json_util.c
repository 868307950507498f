/* json_util.c - JSON field reads and SSE event framing (see json_util.h). */
#include "server/json_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *srv_json_type_name(const json_t *v) {
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

json_t *srv_json_field(const json_t *root, const char *key) {
    json_t *v = json_is_object(root) ? json_object_get(root, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

bool srv_bad(srv_error *e, const char *param, const char *fmt, ...) {
    if (!e) return false;
    e->http_status = 400;
    e->type = "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

bool srv_oom(srv_error *e, const char *what) {
    return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (%s)", what);
}

bool srv_sse_event(const char *name, json_t *o, srv_buf *out) {
    if (!o) return false;
    size_t n = 0;
    char *s = srv_json_dump(o, &n);
    json_decref(o);
    if (!s) return false;
    bool ok = srv_buf_adds(out, "event: ") && srv_buf_adds(out, name) &&
              srv_buf_adds(out, "\ndata: ") && srv_buf_add(out, s, n) &&
              srv_buf_adds(out, "\n\n");
    free(s);
    return ok;
}

json_t *srv_json_text(const char *s, size_t n) {
    json_t *j = json_stringn(s ? s : "", s ? n : 0);
    if (j) return j;
    srv_buf b = {0};
    if (srv_utf8_repair(s, n, &b)) j = json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return j;
}
