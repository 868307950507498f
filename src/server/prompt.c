/* prompt.c - prompts from requests: tokenization and chat templates (see prompt.h). */
#include "server/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

kiln_status srv_chat_init(srv_chat *c, const kiln_model *m, const kiln_chat_template_params *params,
                          kiln_error *err) {
    memset(c, 0, sizeof *c);
    c->bos_id = kiln_model_bos(m);
    int32_t ids[4], n = 0;
    if (c->bos_id >= 0 && kiln_model_tokenize(m, "", 0, true, false, ids, 4, &n, NULL) == KILN_OK &&
        n >= 1 && ids[0] == c->bos_id)
        c->add_bos = true;
    kiln_status st = kiln_chat_template_create(m, params, &c->tpl, err);
    if (st) return st;
    const char *why = kiln_chat_template_fallback(c->tpl);
    c->fallback = why != NULL;
    snprintf(c->reason, sizeof c->reason, "%s", why ? why : "");
    const char *src = c->fallback ? NULL
                      : params && params->source ? params->source
                                                 : kiln_model_chat_template(m);
    c->tool_format = kiln_tool_format_detect(src);
    c->native_tools = kiln_chat_template_uses_tools(src);
    return KILN_OK;
}

void srv_chat_free(srv_chat *c) {
    if (!c) return;
    kiln_chat_template_destroy(c->tpl);
    c->tpl = NULL;
}

/* JSON text for kiln_chat_input: exact (reals with 17 digits round-trip), key order kept. */
static char *dump_exact(const json_t *j) {
    return j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)) : NULL;
}

bool srv_chat_render(const srv_chat *c, const srv_gen *g, char **out, size_t *out_len,
                     srv_error *e) {
    /* tool calls and tool messages as the template expects them (tools.h) */
    json_t *prepared = g->messages ? srv_tools_messages(g->messages, g->tools, c->native_tools,
                                                        c->tool_format)
                                   : NULL;
    if (g->messages && !prepared)
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (chat template)");
    char *messages = dump_exact(prepared);
    json_decref(prepared);
    /* a template without `tools` got them in a system message instead */
    char *tools = c->native_tools ? dump_exact(g->tools) : NULL;
    char *kwargs = dump_exact(g->template_kwargs);
    bool oom = (g->messages && !messages) || (c->native_tools && g->tools && !tools) ||
               (g->template_kwargs && !kwargs);
    kiln_status st = KILN_ERR_OUT_OF_MEMORY;
    kiln_error err = {0};
    char *text = NULL;
    size_t len = 0;
    if (!oom) {
        kiln_chat_input in = {.messages_json = messages,
                              .tools_json = tools,
                              .kwargs_json = kwargs,
                              .add_generation_prompt = g->add_generation_prompt};
        st = kiln_chat_template_render(c->tpl, &in, &text, &len, &err);
    }
    free(messages);
    free(tools);
    free(kwargs);
    if (st == KILN_OK) {
        *out = text;
        *out_len = len;
        return true;
    }
    if (st == KILN_ERR_OUT_OF_MEMORY)
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (chat template)");
    /* raise_exception: the template's own text, exactly (kiln_chat_template_render). */
    return srv_fail(e, 400, "invalid_request_error", "chat_template_error", "messages", "%s",
                    err.message);
}

bool srv_tokenize(const kiln_model *m, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids, int32_t *n, srv_error *e) {
    *ids = NULL;
    *n = 0;
    size_t guess = len + 8;
    if (guess > (size_t)INT32_MAX / 2) guess = (size_t)INT32_MAX / 2;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *buf = malloc(guess * sizeof *buf);
        if (!buf) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (tokens)");
        int32_t got = 0;
        kiln_error err = {0};
        kiln_status st = kiln_model_tokenize(m, text, len, add_special, parse_special, buf,
                                             (int32_t)guess, &got, &err);
        if (st != KILN_OK) {
            free(buf);
            if (st == KILN_ERR_INVALID_ARGUMENT)
                return srv_fail(e, 400, "invalid_request_error", NULL, "prompt", "%s", err.message);
            return srv_fail(e, st == KILN_ERR_NOT_FOUND ? 400 : 500,
                            st == KILN_ERR_NOT_FOUND ? "invalid_request_error" : "server_error",
                            NULL, NULL, "%s", err.message);
        }
        if ((size_t)got <= guess) {
            *ids = buf;
            *n = got;
            return true;
        }
        free(buf);
        guess = (size_t)got;
    }
    return srv_fail(e, 500, "server_error", NULL, NULL, "tokenization did not converge");
}

/* Chat text to ids: control texts parsed; unless add_special_tokens, BOS prepended when the
 * vocabulary adds one and the template did not; with add_special_tokens a doubled BOS (the
 * template's and the tokenizer's) is made one. */
static bool chat_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g, const char *text,
                        size_t len, int32_t **ids, int32_t *n, srv_error *e) {
    if (!srv_tokenize(m, text, len, g->add_special, true, ids, n, e)) return false;
    if (!g->add_special && c->add_bos && (*n == 0 || (*ids)[0] != c->bos_id)) {
        int32_t *p = realloc(*ids, ((size_t)*n + 1) * sizeof *p);
        if (!p) {
            free(*ids);
            *ids = NULL;
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        memmove(p + 1, p, (size_t)*n * sizeof *p);
        p[0] = c->bos_id;
        *ids = p;
        (*n)++;
    } else if (g->add_special && *n >= 2 && c->bos_id >= 0 && (*ids)[0] == c->bos_id &&
               (*ids)[1] == c->bos_id) {
        memmove(*ids, *ids + 1, (size_t)(*n - 1) * sizeof **ids);
        (*n)--;
    }
    return true;
}

/* A request's text to ids: completions' as srv_tokenize (add_special per the request,
 * control texts not parsed), chat's as chat_tokens. */
static bool text_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g, const char *text,
                        size_t len, int32_t **ids, int32_t *n, srv_error *e) {
    if (g->kind == SRV_CHAT) return chat_tokens(c, m, g, text, len, ids, n, e);
    return srv_tokenize(m, text, len, g->add_special, false, ids, n, e);
}

/* text + cont tokenized as one text into *w (malloc'd), *n_w ids. */
static bool joined_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g,
                          const char *text, size_t len, const char *cont, size_t cont_len,
                          int32_t **w, int32_t *n_w, srv_error *e) {
    srv_buf whole = {0};
    srv_buf_add(&whole, text, len);
    srv_buf_add(&whole, cont, cont_len);
    bool ok = !whole.oom || srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (ok) ok = text_tokens(c, m, g, whole.p ? whole.p : "", whole.len, w, n_w, e);
    srv_buf_free(&whole);
    return ok;
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* A span that continues the prompt's text (a fill, a prediction): the ids past the prompt's
 * own in the joined text's, when those are a prefix of them (so the span's ids decode to
 * exactly its text after the prompt); else *ids stays NULL (the engine tokenizes the text).
 * An empty span is left as text too. */
static bool span_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g,
                        const char *text, size_t len, const int32_t *base, int32_t n_base,
                        const char *span, size_t span_len, int32_t **ids, int32_t *n,
                        srv_error *e) {
    *ids = NULL;
    *n = 0;
    if (!span || span_len == 0) return true;
    int32_t *w = NULL, n_w = 0;
    if (!joined_tokens(c, m, g, text, len, span, span_len, &w, &n_w, e)) return false;
    if (n_w > n_base && common_prefix(base, n_base, w, n_w) == n_base) {
        memmove(w, w + n_base, (size_t)(n_w - n_base) * sizeof *w);
        *ids = w;
        *n = n_w - n_base;
    } else {
        free(w);
    }
    return true;
}

void srv_prompt_free(srv_prompt *p) {
    if (!p) return;
    free(p->ids);
    free(p->fill_ids);
    free(p->pred_ids);
    memset(p, 0, sizeof *p);
}

bool srv_prompt_build(const srv_chat *c, const kiln_model *m, const srv_gen *g, bool spans,
                      srv_prompt *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    if (g->kind == SRV_COMPLETION && g->prompt_ids) {
        p->ids = malloc((size_t)g->n_prompt_ids * sizeof *p->ids);
        if (!p->ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(p->ids, g->prompt_ids, (size_t)g->n_prompt_ids * sizeof *p->ids);
        p->n = g->n_prompt_ids;
        return true; /* no text: fill and prediction stay text, for the engine */
    }
    char *rendered = NULL;
    const char *text = g->prompt_text;
    size_t len = g->prompt_len;
    if (g->kind == SRV_CHAT) {
        if (!srv_chat_render(c, g, &rendered, &len, e)) return false;
        text = rendered;
    }
    srv_buf base = {0}; /* the prompt's text: the rendering, then a prefill's content */
    srv_buf_add(&base, text ? text : "", len);
    bool ok = text_tokens(c, m, g, base.p, base.len, &p->ids, &p->n, e);
    if (ok && g->prefill) {
        /* the prefill's ids: past the longest common prefix of the rendered text's ids and the
         * joined text's, so a token merged across the boundary belongs to the prefill; at
         * least one prompt id stays before it */
        int32_t *w = NULL, n_w = 0;
        ok = joined_tokens(c, m, g, base.p, base.len, json_string_value(g->prefill),
                           json_string_length(g->prefill), &w, &n_w, e);
        if (ok) {
            int32_t k = common_prefix(p->ids, p->n, w, n_w);
            if (k < 1) k = n_w < 1 ? n_w : 1;
            free(p->ids);
            p->ids = w;
            p->n = n_w;
            p->n_prefill = n_w - k;
            srv_buf_add(&base, json_string_value(g->prefill), json_string_length(g->prefill));
            if (base.oom) ok = srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (ok && spans && p->n > 0) {
        if (g->has_fill)
            ok = span_tokens(c, m, g, base.p, base.len, p->ids, p->n, g->req.fill, g->req.fill_len,
                             &p->fill_ids, &p->n_fill, e);
        if (ok && g->has_prediction)
            ok = span_tokens(c, m, g, base.p, base.len, p->ids, p->n, g->req.prediction,
                             g->req.prediction_len, &p->pred_ids, &p->n_pred, e);
    }
    srv_buf_free(&base);
    kiln_free(rendered);
    if (ok && p->n == 0)
        ok = srv_fail(e, 400, "invalid_request_error", NULL,
                      g->kind == SRV_CHAT ? "messages" : "prompt", "the prompt is empty (no tokens)");
    if (!ok) srv_prompt_free(p);
    return ok;
}

bool srv_prompt_ids(const srv_chat *c, const kiln_model *m, const srv_gen *g, int32_t **ids,
                    int32_t *n, srv_error *e) {
    srv_prompt p;
    *ids = NULL;
    *n = 0;
    if (!srv_prompt_build(c, m, g, false, &p, e)) return false;
    *ids = p.ids;
    *n = p.n;
    p.ids = NULL;
    srv_prompt_free(&p);
    return true;
}
