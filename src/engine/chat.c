/*
 * chat.c - chat templates in the public API (kiln.h "Chat templates"): the model's Jinja
 * template (or ChatML) compiled once by src/template, rendered with the variables
 * transformers' apply_chat_template passes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kiln.h"
#include "model/model.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

struct kiln_chat_template {
    kiln_template *tpl;
    char *bos_text, *eos_text; /* "" when none */
    bool fallback;
    char reason[1200]; /* why ChatML is used ("" when it is not) */
};

void kiln_free(void *p) {
    free(p);
}

void kiln_chat_template_destroy(kiln_chat_template *t) {
    if (!t) return;
    kiln_template_destroy(t->tpl);
    free(t->bos_text);
    free(t->eos_text);
    free(t);
}

const char *kiln_chat_template_fallback(const kiln_chat_template *t) {
    return t && t->fallback ? t->reason : NULL;
}

kiln_status kiln_chat_template_create(const kiln_model *m, const kiln_chat_template_params *params,
                                      kiln_chat_template **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    kiln_chat_template_params p = {0};
    if (params) p = *params;
    const kiln_tokenizer *tk = m ? m->tokenizer : NULL;
    kiln_chat_template *t = calloc(1, sizeof *t);
    if (!t) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (chat template)");
    const char *bos = p.bos_token ? p.bos_token : tk ? kiln_tokenizer_bos_text(tk) : NULL;
    const char *eos = p.eos_token ? p.eos_token : tk ? kiln_tokenizer_eos_text(tk) : NULL;
    t->bos_text = strdup(bos ? bos : "");
    t->eos_text = strdup(eos ? eos : "");
    if (!t->bos_text || !t->eos_text) {
        kiln_chat_template_destroy(t);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (chat template)");
    }
    kiln_status st;
    if (p.source) {
        if ((st = kiln_template_parse(p.source, strlen(p.source), &t->tpl, err))) {
            kiln_chat_template_destroy(t);
            return st;
        }
        *out = t;
        return KILN_OK;
    }
    const char *src = tk ? kiln_tokenizer_chat_template(tk) : NULL;
    if (src) {
        kiln_error perr = {0};
        st = kiln_template_parse(src, strlen(src), &t->tpl, &perr);
        if (st == KILN_OK) {
            *out = t;
            return KILN_OK;
        }
        if (st == KILN_ERR_OUT_OF_MEMORY) {
            kiln_chat_template_destroy(t);
            return kiln_error_set(err, st, "%s", perr.message);
        }
        snprintf(t->reason, sizeof t->reason, "the model's chat template does not parse (%s)",
                 perr.message);
    } else {
        snprintf(t->reason, sizeof t->reason, "the model has no chat template");
    }
    t->fallback = true;
    kiln_error perr = {0};
    st = kiln_template_parse(kiln_template_chatml, strlen(kiln_template_chatml), &t->tpl, &perr);
    if (st != KILN_OK) {
        kiln_chat_template_destroy(t);
        return kiln_error_set(err, st == KILN_ERR_OUT_OF_MEMORY ? st : KILN_ERR_INTERNAL,
                              "the ChatML template does not parse: %s", perr.message);
    }
    *out = t;
    return KILN_OK;
}

/* Parse one JSON input (NULL = absent: *out NULL). want: 'a' array, 'o' object. */
static kiln_status load_json(const char *name, const char *text, char want, json_t **out,
                             kiln_error *err) {
    *out = NULL;
    if (!text) return KILN_OK;
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s is not valid JSON: %s (line %d, column %d)", name, je.text,
                              je.line, je.column);
    if ((want == 'a' && !json_is_array(j)) || (want == 'o' && !json_is_object(j))) {
        json_decref(j);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s must be a JSON %s", name,
                              want == 'a' ? "array" : "object");
    }
    *out = j;
    return KILN_OK;
}

kiln_status kiln_chat_template_render(const kiln_chat_template *t, const kiln_chat_input *in,
                                      char **out, size_t *out_len, kiln_error *err) {
    if (!t || !in || !out || !out_len)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tpl, in, out and out_len must not be NULL");
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    kiln_status st = load_json("messages_json", in->messages_json, 'a', &messages, err);
    if (!st) st = load_json("tools_json", in->tools_json, 'a', &tools, err);
    if (!st) st = load_json("kwargs_json", in->kwargs_json, 'o', &kwargs, err);
    json_t *ctx = st ? NULL : json_object();
    if (!st && !ctx) st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (!st && !messages && !(messages = json_array()))
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (!st) {
        /* The kwargs first, so that the conversation's own variables win over them. */
        if (kwargs) {
            const char *k;
            json_t *v;
            json_object_foreach(kwargs, k, v) json_object_set(ctx, k, v);
        }
        json_object_set(ctx, "messages", messages);
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(in->add_generation_prompt));
        if (!json_object_get(ctx, "bos_token"))
            json_object_set_new(ctx, "bos_token", json_string(t->bos_text));
        if (!json_object_get(ctx, "eos_token"))
            json_object_set_new(ctx, "eos_token", json_string(t->eos_text));
        json_object_set(ctx, "tools", tools ? tools : json_null());
        if (!json_object_get(ctx, "documents")) json_object_set_new(ctx, "documents", json_null());
        kiln_template_diag diag = {0};
        kiln_template_options opts = {.diag = &diag};
        kiln_error rerr = {0};
        st = kiln_template_render(t->tpl, ctx, &opts, out, out_len, &rerr);
        if (st) {
            /* raise_exception: the template's own text, exactly. */
            const char *msg = diag.kind == KILN_TEMPLATE_ERR_RAISED && diag.message[0]
                                  ? diag.message
                                  : rerr.message;
            kiln_error_set(err, st, "%s", msg);
        }
    }
    json_decref(ctx);
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return st;
}
