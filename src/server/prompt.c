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

/* The prefill split: ids of the rendered prefix + the assistant's content tokenized as one
 * text (what a completion of that text would see), and how many of them, at the end, are the
 * fill: those past the longest common prefix with the rendered prefix's own ids (so a token
 * that merges across the boundary belongs to the fill), leaving at least one prompt id. */
static bool prefill_tokens(const srv_chat *c, const kiln_model *m, const srv_gen *g,
                           const char *text, size_t len, int32_t **ids, int32_t *n,
                           int32_t *n_fill, srv_error *e) {
    int32_t *head = NULL, n_head = 0;
    if (!chat_tokens(c, m, g, text, len, &head, &n_head, e)) return false;
    size_t fl = json_string_length(g->prefill);
    srv_buf whole = {0};
    srv_buf_add(&whole, text, len);
    srv_buf_add(&whole, json_string_value(g->prefill), fl);
    bool ok = !whole.oom || srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (ok) ok = chat_tokens(c, m, g, whole.p, whole.len, ids, n, e);
    srv_buf_free(&whole);
    if (ok) {
        int32_t common = 0;
        while (common < n_head && common < *n && head[common] == (*ids)[common]) common++;
        if (common < 1) common = *n < 1 ? *n : 1;
        *n_fill = *n - common;
    }
    free(head);
    return ok;
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
    if (g->kind == SRV_COMPLETION) {
        if (!srv_tokenize(m, g->prompt_text, g->prompt_len, g->add_special, false, ids, n, e))
            return false;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (!srv_chat_render(c, g, &text, &len, e)) return false;
        int32_t nf = 0;
        bool ok = g->prefill ? prefill_tokens(c, m, g, text, len, ids, n, &nf, e)
                             : chat_tokens(c, m, g, text, len, ids, n, e);
        kiln_free(text);
        if (!ok) return false;
        if (n_fill) *n_fill = nf;
    }
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return srv_fail(e, 400, "invalid_request_error", NULL,
                        g->kind == SRV_CHAT ? "messages" : "prompt",
                        "the prompt is empty (no tokens)");
    }
    return true;
}
