/*
 * fuzz_tool_calls.c - libFuzzer target for the tool-call parser (kiln_tool_parser_*).
 * Input: byte 0 picks the format (low 2 bits) and the mode (bit 2), byte 1 seeds the feed
 * split; the rest is the reply text. Checks, besides the sanitizers: the events are the same
 * for the whole text and for the text fed in pieces; in hold mode every call's arguments are
 * one JSON object (jansson) and a reply without calls is all content, unchanged; the NONE
 * format gives the text back as it is.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kiln.h"

typedef struct out {
    char *content;
    size_t n_content;
    int n_calls;
    char *args[64];
    size_t n_args[64];
    char *all; /* every event serialised, for comparing splits */
    size_t n_all;
} out;

static void app(char **b, size_t *n, const char *s, size_t k) {
    char *q = realloc(*b, *n + k + 1);
    if (!q) abort();
    memcpy(q + *n, s, k);
    *n += k;
    q[*n] = '\0';
    *b = q;
}

static void take(kiln_tool_parser *p, out *o) {
    kiln_tool_event ev;
    while (kiln_tool_parser_next(p, &ev)) {
        char tag[32];
        snprintf(tag, sizeof tag, "|%d:%d:", (int)ev.type, (int)ev.index);
        app(&o->all, &o->n_all, tag, strlen(tag));
        if (ev.type == KILN_TOOL_EVENT_CONTENT) {
            app(&o->content, &o->n_content, ev.text, ev.len);
            app(&o->all, &o->n_all, ev.text, ev.len);
        } else if (ev.type == KILN_TOOL_EVENT_CALL) {
            if (ev.index != o->n_calls || strlen(ev.name) != ev.name_len) abort();
            app(&o->all, &o->n_all, ev.name, ev.name_len);
            app(&o->all, &o->n_all, ev.id, strlen(ev.id));
            if (o->n_calls < 64) o->n_args[o->n_calls] = 0, o->args[o->n_calls] = NULL;
            o->n_calls++;
        } else {
            if (ev.index != o->n_calls - 1) abort();
            if (ev.index < 64) app(&o->args[ev.index], &o->n_args[ev.index], ev.text, ev.len);
        }
    }
}

/* Events of text fed by pieces (split = 0: whole); a merged content event may be cut
 * differently, so o->all records only types and indexes in order, text compared apart. */
static void run(kiln_tool_format f, bool stream, const uint8_t *d, size_t n, unsigned split,
                out *o) {
    memset(o, 0, sizeof *o);
    kiln_tool_parser_params pp = {.format = f, .stream_arguments = stream, .seed = 3};
    kiln_tool_parser *p;
    if (kiln_tool_parser_create(&pp, &p, NULL) != KILN_OK) abort();
    size_t at = 0;
    unsigned s = split * 2654435761u + 1;
    while (at < n) {
        size_t k = split ? 1 + (s >> 16) % 7 : n - at;
        s = s * 1103515245u + 12345u;
        if (k > n - at) k = n - at;
        if (kiln_tool_parser_feed(p, (const char *)d + at, k, NULL) != KILN_OK) abort();
        take(p, o);
        at += k;
    }
    if (kiln_tool_parser_finish(p, NULL) != KILN_OK) abort();
    take(p, o);
    kiln_tool_parser_destroy(p);
}

static void free_out(out *o) {
    free(o->content);
    free(o->all);
    for (int i = 0; i < o->n_calls && i < 64; i++) free(o->args[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    kiln_tool_format f = (kiln_tool_format)(data[0] & 3);
    bool stream = data[0] & 4;
    unsigned split = data[1];
    const uint8_t *d = data + 2;
    size_t n = size - 2;
    out a, b;
    run(f, stream, d, n, 0, &a);
    run(f, stream, d, n, split | 1, &b);
    /* the same content and calls, whatever the pieces */
    if (a.n_content != b.n_content || (a.n_content && memcmp(a.content, b.content, a.n_content)))
        abort();
    if (a.n_calls != b.n_calls) abort();
    for (int i = 0; i < a.n_calls && i < 64; i++)
        if (a.n_args[i] != b.n_args[i] || (a.n_args[i] && memcmp(a.args[i], b.args[i], a.n_args[i])))
            abort();
    if (f == KILN_TOOL_FORMAT_NONE && (a.n_content != n || (n && memcmp(a.content, d, n))))
        abort();
    if (!stream) {
        if (a.n_calls == 0 && (a.n_content != n || (n && memcmp(a.content, d, n)))) abort();
        for (int i = 0; i < a.n_calls && i < 64; i++) {
            json_error_t je;
            json_t *v = json_loadb(a.args[i], a.n_args[i], JSON_ALLOW_NUL, &je);
            if (!json_is_object(v)) abort();
            json_decref(v);
        }
    }
    free_out(&a);
    free_out(&b);
    return 0;
}
