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
    char *messages = dump_exact(g->messages);
    char *tools = dump_exact(g->tools);
    char *kwargs = dump_exact(g->template_kwargs);
    bool oom =
        (g->messages && !messages) || (g->tools && !tools) || (g->template_kwargs && !kwargs);
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

/* A continuation of text: the ids of text + cont tokenized as one text (what a completion of
 * that text would see), and how many of them, at the end, are the continuation's: those past
 * the longest common prefix with text's own ids. With `clean` (a visible fill, whose tokens
 * must decode to exactly cont) a continuation that merges with text's last tokens is not
 * split: *ids are then text's own and *n_cont 0. Without it (a hidden prefill) a merged token
 * joins the continuation, leaving at least one id before it. */
static bool split_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g,
                         const char *text, size_t len, const char *cont, size_t cont_len,
                         bool clean, int32_t **ids, int32_t *n, int32_t *n_cont, srv_error *e) {
    int32_t *head = NULL, n_head = 0;
    *n_cont = 0;
    if (!text_tokens(c, m, g, text, len, &head, &n_head, e)) return false;
    srv_buf whole = {0};
    srv_buf_add(&whole, text, len);
    srv_buf_add(&whole, cont, cont_len);
    int32_t *w = NULL, n_w = 0;
    bool ok = !whole.oom || srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (ok) ok = text_tokens(c, m, g, whole.p, whole.len, &w, &n_w, e);
    srv_buf_free(&whole);
    if (!ok) {
        free(head);
        return false;
    }
    int32_t common = 0;
    while (common < n_head && common < n_w && head[common] == w[common]) common++;
    if (clean && common < n_head) {
        free(w);
        *ids = head;
        *n = n_head;
        return true;
    }
    if (common < 1) common = n_w < 1 ? n_w : 1;
    free(head);
    *ids = w;
    *n = n_w;
    *n_cont = n_w - common;
    return true;
}

bool srv_prompt_ids(const srv_chat *c, const kiln_model *m, const srv_gen *g, int32_t **ids,
                    int32_t *n, int32_t *n_fill, srv_error *e) {
    *ids = NULL;
    *n = 0;
    if (n_fill) *n_fill = 0;
    if (g->kind == SRV_COMPLETION && g->prompt_ids) {
        *ids = malloc((size_t)g->n_prompt_ids * sizeof **ids);
        if (!*ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, g->prompt_ids, (size_t)g->n_prompt_ids * sizeof **ids);
        *n = g->n_prompt_ids;
        return true;
    }
    char *rendered = NULL;
    const char *text = g->prompt_text;
    size_t len = g->prompt_len;
    if (g->kind == SRV_CHAT) {
        if (!srv_chat_render(c, g, &rendered, &len, e)) return false;
        text = rendered;
    }
    /* a visible asserted fill continues the prompt's text (n_fill asked: not for /tokenize) */
    bool visible = n_fill && g->has_fill && g->req.fill_policy == KILN_FILL_ASSERT && g->req.fill;
    int32_t nf = 0;
    bool ok;
    if (g->prefill)
        ok = split_tokens(c, m, g, text, len, json_string_value(g->prefill),
                          json_string_length(g->prefill), false, ids, n, &nf, e);
    else if (visible)
        ok = split_tokens(c, m, g, text, len, g->req.fill, g->req.fill_len, true, ids, n, &nf, e);
    else
        ok = text_tokens(c, m, g, text, len, ids, n, e);
    kiln_free(rendered);
    if (!ok) return false;
    if (n_fill) *n_fill = nf;
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return srv_fail(e, 400, "invalid_request_error", NULL,
                        g->kind == SRV_CHAT ? "messages" : "prompt",
                        "the prompt is empty (no tokens)");
    }
    return true;
}
