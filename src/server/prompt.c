/* prompt.c - prompts from requests: tokenization and chat templates (see prompt.h). */
#include "server/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

kiln_status srv_chat_init(srv_chat *c, const kiln_model *m, kiln_error *err) {
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    const kiln_tokenizer *tk = m ? m->tokenizer : NULL;
    const char *src = tk ? kiln_tokenizer_chat_template(tk) : NULL;
    if (tk) {
        c->bos_text = kiln_tokenizer_bos_text(tk);
        c->eos_text = kiln_tokenizer_eos_text(tk);
        c->bos_id = kiln_tokenizer_bos(tk);
        int32_t ids[4], n = 0;
        if (c->bos_id >= 0 &&
            kiln_model_tokenize(m, "", 0, true, false, ids, 4, &n, NULL) == KILN_OK && n >= 1 &&
            ids[0] == c->bos_id)
            c->add_bos = true;
    }
    if (src) {
        kiln_error perr = {0};
        kiln_status st = kiln_template_parse(src, strlen(src), &c->tpl, &perr);
        if (st == KILN_OK) return KILN_OK;
        if (st == KILN_ERR_OUT_OF_MEMORY) return kiln_error_set(err, st, "%s", perr.message);
        snprintf(c->reason, sizeof c->reason, "the model's chat template does not parse (%s)",
                 perr.message);
    } else {
        snprintf(c->reason, sizeof c->reason, "the model has no chat template");
    }
    c->fallback = true;
    kiln_error perr = {0};
    kiln_status st =
        kiln_template_parse(kiln_template_chatml, strlen(kiln_template_chatml), &c->tpl, &perr);
    if (st != KILN_OK)
        return kiln_error_set(err, st == KILN_ERR_OUT_OF_MEMORY ? st : KILN_ERR_INTERNAL,
                              "the ChatML template does not parse: %s", perr.message);
    return KILN_OK;
}

void srv_chat_free(srv_chat *c) {
    if (!c) return;
    kiln_template_destroy(c->tpl);
    c->tpl = NULL;
}

bool srv_chat_render(const srv_chat *c, const srv_gen *g, char **out, size_t *out_len,
                     srv_error *e) {
    json_t *ctx = json_object();
    if (!ctx) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    /* chat_template_kwargs first, so the request's own fields win over them. */
    if (g->template_kwargs) {
        const char *k;
        json_t *v;
        json_object_foreach(g->template_kwargs, k, v) json_object_set(ctx, k, v);
    }
    json_object_set(ctx, "messages", g->messages);
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(g->add_generation_prompt));
    if (!json_object_get(ctx, "bos_token"))
        json_object_set_new(ctx, "bos_token", json_string(c->bos_text ? c->bos_text : ""));
    if (!json_object_get(ctx, "eos_token"))
        json_object_set_new(ctx, "eos_token", json_string(c->eos_text ? c->eos_text : ""));
    json_object_set(ctx, "tools", g->tools ? g->tools : json_null());
    if (!json_object_get(ctx, "documents")) json_object_set_new(ctx, "documents", json_null());
    kiln_template_diag diag = {0};
    kiln_template_options opts = {.diag = &diag};
    kiln_error err = {0};
    kiln_status st = kiln_template_render(c->tpl, ctx, &opts, out, out_len, &err);
    json_decref(ctx);
    if (st == KILN_OK) return true;
    if (st == KILN_ERR_OUT_OF_MEMORY)
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (chat template)");
    /* raise_exception: the template's own text, exactly. */
    const char *msg =
        diag.kind == KILN_TEMPLATE_ERR_RAISED && diag.message[0] ? diag.message : err.message;
    return srv_fail(e, 400, "invalid_request_error", "chat_template_error", "messages", "%s", msg);
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

bool srv_prompt_ids(const srv_chat *c, const kiln_model *m, const srv_gen *g, int32_t **ids,
                    int32_t *n, srv_error *e) {
    *ids = NULL;
    *n = 0;
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
        bool ok = srv_tokenize(m, text, len, g->add_special, true, ids, n, e);
        free(text);
        if (!ok) return false;
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
