/* template.c - public API of the chat-template interpreter (template.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"
#include "util/error.h"

/* transformers' historical default template (ChatML), also llama.cpp's "chatml". */
const char kiln_template_chatml[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

enum {
    DEFAULT_MAX_STEPS = 5000000,
    DEFAULT_MAX_OUTPUT = 16 << 20,
    DEFAULT_MAX_DEPTH = 1000,
};
static const size_t DEFAULT_MAX_MEMORY = (size_t)256 << 20;

static kiln_status parse_status(kiln_template_error_kind k) {
    switch (k) {
    case KILN_TEMPLATE_ERR_UNSUPPORTED:
        return KILN_ERR_UNSUPPORTED;
    case KILN_TEMPLATE_ERR_MEMORY:
        return KILN_ERR_OUT_OF_MEMORY;
    default:
        return KILN_ERR_FORMAT;
    }
}

kiln_status kiln_template_parse(const char *src, size_t len, kiln_template **out, kiln_error *err) {
    if (!out || (!src && len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "template: NULL argument");
    *out = NULL;
    if (!src) src = "";
    size_t bad;
    if (!tpl_utf8_valid(src, len, &bad))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "template: source is not valid UTF-8 (byte offset %zu)", bad);
    if (memchr(src, 0, len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "template: source contains NUL");
    kiln_template *t = calloc(1, sizeof *t);
    if (!t) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "template: out of memory");
    tpl_arena_init(&t->ar, 0);
    /* newline normalization and one trailing newline dropped (Lexer.tokeniter) */
    char *norm = tpl_alloc(&t->ar, len + 1);
    if (!norm) {
        kiln_template_destroy(t);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "template: out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    tpl_diag d = {0};
    token *toks;
    size_t ntok;
    if (!tpl_lex(&t->ar, norm, n, &toks, &ntok, &d) ||
        !tpl_parse_tokens(&t->ar, toks, ntok, &t->root, &d)) {
        kiln_template_destroy(t);
        return kiln_error_set(err, parse_status(d.kind), "template: line %d, column %d: %s", d.line,
                              d.col, d.msg);
    }
    *out = t;
    return KILN_OK;
}

void kiln_template_destroy(kiln_template *t) {
    if (!t) return;
    tpl_arena_free(&t->ar);
    free(t);
}

kiln_status kiln_template_render(const kiln_template *t, const json_t *context,
                                 const kiln_template_options *opts, char **out, size_t *out_len,
                                 kiln_error *err) {
    kiln_template_diag *diag = opts ? opts->diag : NULL;
    if (diag) memset(diag, 0, sizeof *diag);
    if (!t || !out || !out_len)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "template: NULL argument");
    if (context && !json_is_object(context))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "template: the context must be a JSON object");
    rctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "template: out of memory");
    c->max_steps = opts && opts->max_steps ? opts->max_steps : DEFAULT_MAX_STEPS;
    c->max_output = opts && opts->max_output ? opts->max_output : DEFAULT_MAX_OUTPUT;
    c->max_depth = opts && opts->max_depth > 0 ? opts->max_depth : DEFAULT_MAX_DEPTH;
    c->now = opts ? opts->now : NULL;
    tpl_arena_init(&c->ar, opts && opts->max_memory ? opts->max_memory : DEFAULT_MAX_MEMORY);
    kiln_status st = KILN_OK;
    sbuf buf = {0};
    c->root = tpl_zalloc(&c->ar, sizeof(scope));
    if (!c->root) {
        rt_oom(c);
        goto fail;
    }
    if (context) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)context, key, val) {
            tv v;
            const tstr *name = tpl_str_new(&c->ar, key, strlen(key));
            if (!name) {
                rt_oom(c);
                goto fail;
            }
            if (tv_from_json(c, val, &v)) goto fail;
            /* scope_set without the evaluator: append */
            scope *r = c->root;
            if (r->n == r->cap) {
                size_t nc = r->cap ? r->cap * 2 : 16;
                const tstr **nn =
                    tpl_realloc(&c->ar, r->names, r->cap * sizeof *nn, nc * sizeof *nn);
                tv *nv =
                    nn ? tpl_realloc(&c->ar, r->vals, r->cap * sizeof *nv, nc * sizeof *nv) : NULL;
                if (!nn || !nv) {
                    rt_oom(c);
                    goto fail;
                }
                r->names = nn;
                r->vals = nv;
                r->cap = nc;
            }
            r->names[r->n] = name;
            r->vals[r->n++] = v;
        }
    }
    if (tpl_render_root(c, &t->root, &buf)) goto fail;
    char *res = malloc(buf.n + 1);
    if (!res) {
        rt_fail(c, KILN_TEMPLATE_ERR_MEMORY, NULL, "out of memory");
        goto fail;
    }
    if (buf.n) memcpy(res, buf.p, buf.n);
    res[buf.n] = 0;
    *out = res;
    *out_len = buf.n;
    tpl_arena_free(&c->ar);
    free(c);
    return KILN_OK;
fail:
    switch (c->d.kind) {
    case KILN_TEMPLATE_ERR_MEMORY:
        st = KILN_ERR_OUT_OF_MEMORY;
        break;
    default:
        st = KILN_ERR_INVALID_ARGUMENT;
        break;
    }
    if (c->d.kind == KILN_TEMPLATE_OK) { /* defensive: a failure without a message */
        c->d.kind = KILN_TEMPLATE_ERR_TYPE;
        snprintf(c->d.msg, sizeof c->d.msg, "template error");
    }
    if (c->d.kind == KILN_TEMPLATE_ERR_RAISED)
        kiln_error_set(err, st, "%s", c->d.msg);
    else
        kiln_error_set(err, st, "%s (template line %d)", c->d.msg, c->d.line);
    if (diag) {
        diag->kind = c->d.kind;
        diag->line = c->d.line;
        diag->column = c->d.col;
        snprintf(diag->message, sizeof diag->message, "%s", c->d.msg);
    }
    tpl_arena_free(&c->ar);
    free(c);
    return st;
}
