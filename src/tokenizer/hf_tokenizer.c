/*
 * hf_tokenizer.c - loading a Hugging Face tokenizer.json (+ tokenizer_config.json) into a
 * kiln_tokenizer: added tokens, the post-processor, the pipeline's parts (run by
 * hf_pipeline.c; added tokens matched by hf_added.c). See
 * hf_tokenizer.h for the semantics (Hugging Face tokenizers: tokenizer/mod.rs,
 * tokenizer/added_vocabulary.rs, processors/ (each one); transformers' tokenizer_config.json).
 */
#include "tokenizer/hf_tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/hf_internal.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

enum { HF_MAX_IDS = 1 << 24 };

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer.json)");
}

/* ---- loading ------------------------------------------------------------------------------- */

static kiln_status parse_added(struct kiln_hf *h, const json_t *arr, const hf_where *w,
                               kiln_error *err) {
    if (!arr || json_is_null(arr)) return KILN_OK;
    if (!json_is_array(arr)) return hf_err_type(err, w, "an array");
    size_t n = json_array_size(arr);
    h->added = calloc(n + 1, sizeof *h->added);
    if (!h->added) return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        hf_where wi;
        hf_where_idx(&wi, w, i);
        if (!json_is_object(e)) return hf_err_type(err, &wi, "an object");
        hf_added *a = &h->added[h->n_added];
        uint64_t id = UINT64_MAX;
        kiln_status st = hf_get_uint(e, "id", &wi, HF_MAX_IDS - 1, &id, err);
        if (st) return st;
        const char *c = NULL;
        size_t cl = 0;
        if ((st = hf_get_str(e, "content", &wi, &c, &cl, err))) return st;
        if (id == UINT64_MAX || !c) {
            hf_where wk;
            hf_where_sub(&wk, &wi, id == UINT64_MAX ? "id" : "content");
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s is missing", wk.file, wk.path);
        }
        a->special = false;
        if ((st = hf_get_bool(e, "special", &wi, &a->special, err))) return st;
        a->normalized = !a->special;
        if ((st = hf_get_bool(e, "single_word", &wi, &a->single_word, err)) ||
            (st = hf_get_bool(e, "lstrip", &wi, &a->lstrip, err)) ||
            (st = hf_get_bool(e, "rstrip", &wi, &a->rstrip, err)) ||
            (st = hf_get_bool(e, "normalized", &wi, &a->normalized, err)))
            return st;
        if (cl == 0) continue; /* tokenizers ignores empty added tokens */
        /* the model's id wins when the content is a model token (AddedVocabulary::add_tokens) */
        int32_t mid = hf_model_find(&h->model, c, cl);
        a->id = mid >= 0 ? mid : (int32_t)id;
        if (!(a->content = hf_strndup(c, cl))) return oom(err);
        a->len = cl;
        h->n_added++;
    }
    return KILN_OK;
}

/* A special-token value of tokenizer_config.json: a string or {"content": ...}; NULL if none. */
static kiln_status config_token(const json_t *cfg, const char *key, const hf_where *w,
                                const char **out, kiln_error *err) {
    *out = NULL;
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return KILN_OK;
    if (json_is_string(v)) {
        *out = json_string_value(v);
        return KILN_OK;
    }
    hf_where wk;
    hf_where_sub(&wk, w, key);
    if (json_is_object(v)) {
        json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) {
            *out = json_string_value(c);
            return KILN_OK;
        }
    }
    return hf_err_type(err, &wk, "a string or an object with a \"content\" string");
}

/* Id of a token string: added tokens first (last with that content), then the model vocab. */
static int32_t token_id(const struct kiln_hf *h, const char *s) {
    size_t n = strlen(s);
    for (size_t i = h->n_added; i-- > 0;)
        if (h->added[i].len == n && !memcmp(h->added[i].content, s, n)) return h->added[i].id;
    return hf_model_find(&h->model, s, n);
}

static kiln_status ids_of(const struct kiln_hf *h, const json_t *j, const hf_where *w,
                          kiln_ivec *out, kiln_error *err) {
    if (!json_is_array(j)) return hf_err_type(err, w, "an array of ids");
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *x = json_array_get(j, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) >= h->n_tokens) {
            hf_where wi;
            hf_where_idx(&wi, w, i);
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s must be a token id in [0, %d)",
                                  wi.file, wi.path, h->n_tokens);
        }
        if (kiln_ivec_push(out, (int32_t)json_integer_value(x))) return oom(err);
    }
    return KILN_OK;
}

/* One template piece: *seq true for "$A"-like sequences, else *name is a special token name. */
static kiln_status template_piece(const json_t *e, const hf_where *w, bool *seq, const char **name,
                                  char *buf, size_t cap, kiln_error *err) {
    if (json_is_string(e)) {
        const char *s = json_string_value(e);
        size_t n = strcspn(s, ":");
        if (n >= cap) return hf_err_type(err, w, "a shorter template piece");
        memcpy(buf, s, n);
        buf[n] = '\0';
        if (buf[0] == '$') {
            if (!strcmp(buf, "$") || !strcmp(buf, "$A") || !strcmp(buf, "$a")) {
                *seq = true;
                return KILN_OK;
            }
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: %s: template sequence '%s' (only $A is supported)", w->file,
                                  w->path, buf);
        }
        *seq = false;
        *name = buf;
        return KILN_OK;
    }
    json_t *st = json_object_get(e, "SpecialToken"), *sq = json_object_get(e, "Sequence");
    if (json_is_object(sq)) {
        json_t *id = json_object_get(sq, "id");
        if (json_is_string(id) && strcmp(json_string_value(id), "A"))
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: %s: template sequence '%s' (only A is supported)", w->file,
                                  w->path, json_string_value(id));
        *seq = true;
        return KILN_OK;
    }
    if (json_is_object(st) && json_is_string(json_object_get(st, "id"))) {
        *seq = false;
        *name = json_string_value(json_object_get(st, "id"));
        return KILN_OK;
    }
    return hf_err_type(err, w, "{\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
}

static kiln_status parse_template(struct kiln_hf *h, const json_t *j, const hf_where *w,
                                  kiln_ivec *pre, kiln_ivec *suf, kiln_error *err) {
    hf_where ws, wt;
    hf_where_sub(&ws, w, "single");
    hf_where_sub(&wt, w, "special_tokens");
    json_t *single = json_object_get(j, "single");
    json_t *toks = json_object_get(j, "special_tokens");
    if (toks && !json_is_null(toks) && !json_is_object(toks))
        return hf_err_type(err, &wt, "an object");
    json_t *arr = single, *owned = NULL;
    if (json_is_string(single)) { /* "<s> $A" */
        owned = json_array();
        if (!owned) return oom(err);
        const char *s = json_string_value(single);
        while (*s) {
            while (*s == ' ') s++;
            size_t n = strcspn(s, " ");
            if (n && json_array_append_new(owned, json_stringn(s, n))) {
                json_decref(owned);
                return oom(err);
            }
            s += n;
        }
        arr = owned;
    }
    if (!json_is_array(arr)) return hf_err_type(err, &ws, "an array or a string");
    kiln_status st = KILN_OK;
    int seen = 0;
    for (size_t i = 0; i < json_array_size(arr) && !st; i++) {
        hf_where wi;
        hf_where_idx(&wi, &ws, i);
        bool seq = false;
        const char *name = NULL;
        char buf[256];
        if ((st = template_piece(json_array_get(arr, i), &wi, &seq, &name, buf, sizeof buf, err)))
            break;
        if (seq) {
            if (seen++) {
                st = kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: %s: the sequence appears twice",
                                    wi.file, wi.path);
            }
            continue;
        }
        json_t *tok = toks ? json_object_get(toks, name) : NULL;
        if (!json_is_object(tok)) {
            st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s: special token '%s' is not in %s",
                                wi.file, wi.path, name, wt.path);
            break;
        }
        hf_where wk, wids;
        hf_where_sub(&wk, &wt, name);
        hf_where_sub(&wids, &wk, "ids");
        st = ids_of(h, json_object_get(tok, "ids"), &wids, seen ? suf : pre, err);
    }
    if (!st && !seen)
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: %s has no $A sequence", ws.file,
                            ws.path);
    json_decref(owned);
    return st;
}

/* [token, id] of RobertaProcessing / BertProcessing. */
static kiln_status pair_id(const struct kiln_hf *h, const json_t *j, const char *key,
                           const hf_where *w, kiln_ivec *out, kiln_error *err) {
    hf_where wk;
    hf_where_sub(&wk, w, key);
    json_t *p = json_object_get(j, key);
    if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 1)))
        return hf_err_type(err, &wk, "a pair [token, id]");
    json_t *ids = json_array();
    if (!ids || json_array_append(ids, json_array_get(p, 1))) {
        json_decref(ids);
        return oom(err);
    }
    kiln_status st = ids_of(h, ids, &wk, out, err);
    json_decref(ids);
    return st;
}

static kiln_status parse_post(struct kiln_hf *h, const json_t *j, const hf_where *w, int depth,
                              kiln_error *err) {
    if (!j || json_is_null(j)) return KILN_OK;
    const char *type = NULL;
    kiln_status st = hf_get_type(j, w, &type, err);
    if (st) return st;
    kiln_ivec pre = {0}, suf = {0};
    if (!strcmp(type, "Sequence")) {
        hf_where ws;
        hf_where_sub(&ws, w, "processors");
        json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a)) return hf_err_type(err, &ws, "an array");
        if (depth > 8) return hf_err_type(err, w, "nested less deeply");
        for (size_t i = 0; i < json_array_size(a); i++) {
            hf_where wi;
            hf_where_idx(&wi, &ws, i);
            if ((st = parse_post(h, json_array_get(a, i), &wi, depth + 1, err))) return st;
        }
        return KILN_OK;
    } else if (!strcmp(type, "ByteLevel")) {
        return KILN_OK; /* offsets only */
    } else if (!strcmp(type, "TemplateProcessing")) {
        st = parse_template(h, j, w, &pre, &suf, err);
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        st = pair_id(h, j, "cls", w, &pre, err);
        if (!st) st = pair_id(h, j, "sep", w, &suf, err);
    } else {
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: %s.type '%s' is not supported (TemplateProcessing, "
                              "RobertaProcessing, BertProcessing, ByteLevel, Sequence are)",
                              w->file, w->path, type);
    }
    /* applied after the processors before it: pre + (prefix ... suffix) + suf */
    if (!st && (kiln_ivec_append(&pre, h->prefix.data, h->prefix.n) ||
                kiln_ivec_append(&h->suffix, suf.data, suf.n)))
        st = oom(err);
    if (!st) {
        kiln_ivec t = h->prefix;
        h->prefix = pre;
        pre = t;
    }
    kiln_ivec_free(&pre);
    kiln_ivec_free(&suf);
    return st;
}

static char *slurp_file(const char *path, size_t *len, kiln_status *st, kiln_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = kiln_error_set(err, errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO,
                             "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (n < cap - 1) break;
        char *nb = cap > SIZE_MAX / 4 ? NULL : realloc(b, cap * 2);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!b) {
        *st = oom(err);
        return NULL;
    }
    if (bad) {
        free(b);
        *st = kiln_error_set(err, KILN_ERR_IO, "%s: read error", path);
        return NULL;
    }
    b[n] = '\0';
    *len = n;
    *st = KILN_OK;
    return b;
}

static kiln_status parse_json(const char *text, size_t len, const char *name, json_t **out,
                              kiln_error *err) {
    json_error_t je;
    *out = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    if (!*out)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", name, je.line,
                              je.column, je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: the top level must be an object", name);
    }
    return KILN_OK;
}

/* Loader inputs beyond the two JSON documents. */
typedef struct hf_extra {
    const char *template_text;   /* chat_template.jinja contents, or NULL */
    const json_t *template_json; /* chat_template.json, or NULL */
    const json_t *special_map;   /* special_tokens_map.json, or NULL */
} hf_extra;

static kiln_status set_text(char **dst, const char *s, kiln_error *err) {
    free(*dst);
    *dst = s ? strdup(s) : NULL;
    return (!s || *dst) ? KILN_OK : oom(err);
}

static kiln_status chat_template_of(const json_t *v, const hf_where *w, const char **out,
                                    kiln_error *err) {
    *out = NULL;
    if (!v || json_is_null(v)) return KILN_OK;
    if (json_is_string(v)) {
        *out = json_string_value(v);
        return KILN_OK;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *e = json_array_get(v, i);
            json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (!json_is_string(tp)) {
                hf_where wi;
                hf_where_idx(&wi, w, i);
                return hf_err_type(err, &wi, "an object {\"name\", \"template\"}");
            }
            if (!*out || (json_is_string(nm) && !strcmp(json_string_value(nm), "default")))
                *out = json_string_value(tp);
        }
        return KILN_OK;
    }
    return hf_err_type(err, w, "a string or a list of {name, template}");
}

static kiln_status build(const json_t *root, const json_t *cfg, const hf_extra *x,
                         const char *tok_name, const char *cfg_name, kiln_tokenizer **out,
                         kiln_error *err) {
    hf_where top = {tok_name, ""}, wcfg = {cfg_name, ""}, w;
    kiln_status st;
    kiln_tokenizer *t = kiln_tok_alloc();
    struct kiln_hf *h = calloc(1, sizeof *h);
    if (!t || !h) {
        free(h);
        kiln_tokenizer_destroy(t);
        return oom(err);
    }
    t->hf = h;
    h->v = &t->v;
    hf_trie_init(&h->raw);
    hf_trie_init(&h->normd);
    kiln_vocab *v = &t->v;

    /* model */
    hf_where_sub(&w, &top, "model");
    json_t *jm = json_object_get(root, "model");
    if (!jm) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: no \"model\"", tok_name);
        goto fail;
    }
    if ((st = hf_model_parse(jm, &w, &h->model, err))) goto fail;
    /* normalizer (needed for normalized added tokens) */
    hf_where_sub(&w, &top, "normalizer");
    json_t *jn = json_object_get(root, "normalizer");
    if (jn && !json_is_null(jn) && (st = hf_normalizer_parse(jn, &w, &h->norm, err))) goto fail;
    hf_where_sub(&w, &top, "added_tokens");
    if ((st = parse_added(h, json_object_get(root, "added_tokens"), &w, err))) goto fail;

    /* ids */
    int64_t n = h->model.n_ids;
    for (size_t i = 0; i < h->n_added; i++)
        if (h->added[i].id + 1 > n) n = h->added[i].id + 1;
    if (n <= 0) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: the vocabulary is empty", tok_name);
        goto fail;
    }
    if ((uint64_t)n > 4 * (uint64_t)(h->model.n_ids + h->n_added) + 65536) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: added_tokens ids go up to %lld (too sparse)",
                            tok_name, (long long)n - 1);
        goto fail;
    }
    h->n_tokens = (int32_t)n;
    v->type = KILN_VOCAB_BPE;
    v->text = calloc((size_t)n, sizeof *v->text);
    v->text_len = calloc((size_t)n, sizeof *v->text_len);
    v->token_type = calloc((size_t)n, sizeof *v->token_type);
    h->skip = calloc((size_t)n, sizeof *h->skip);
    h->unused = calloc((size_t)n, sizeof *h->unused);
    h->dec_text = calloc((size_t)n, sizeof *h->dec_text);
    h->dec_len = calloc((size_t)n, sizeof *h->dec_len);
    if (!v->text || !v->text_len || !v->token_type || !h->skip || !h->unused || !h->dec_text ||
        !h->dec_len)
        goto nomem;
    v->n_tokens = (int32_t)n;
    for (int32_t i = 0; i < (int32_t)n; i++) {
        const char *s = i < h->model.n_ids ? h->model.tok[i] : NULL;
        if (s) {
            v->text[i] = hf_strndup(s, h->model.tok_len[i]);
            v->text_len[i] = h->model.tok_len[i];
            v->token_type[i] = KILN_TOKEN_NORMAL;
        } else {
            char buf[32];
            int m = snprintf(buf, sizeof buf, "[UNUSED_%d]", i);
            v->text[i] = hf_strndup(buf, (size_t)m);
            v->text_len[i] = (uint32_t)m;
            v->token_type[i] = KILN_TOKEN_UNUSED;
            h->unused[i] = true;
        }
        if (!v->text[i]) goto nomem;
    }
    if (h->model.byte_fallback)
        for (int b = 0; b < 256; b++)
            if (h->model.byte_ids[b] >= 0) v->token_type[h->model.byte_ids[b]] = KILN_TOKEN_BYTE;
    if (h->model.unk_id >= 0) {
        v->unk_id = h->model.unk_id;
        v->token_type[v->unk_id] = KILN_TOKEN_UNKNOWN;
    }
    for (size_t i = 0; i < h->n_added; i++) {
        hf_added *a = &h->added[i];
        int32_t id = a->id;
        if (v->text_len[id] != a->len || memcmp(v->text[id], a->content, a->len)) {
            char *c = hf_strndup(a->content, a->len);
            if (!c) goto nomem;
            free(v->text[id]);
            v->text[id] = c;
            v->text_len[id] = (uint32_t)a->len;
        }
        h->unused[id] = false;
        v->token_type[id] = a->special ? KILN_TOKEN_CONTROL : KILN_TOKEN_USER_DEFINED;
        if (a->normalized && h->norm) {
            hf_buf nb = {0};
            bool at = true;
            st = hf_normalize(h->norm, a->content, a->len, &nb, &at, err);
            if (st) {
                hf_buf_free(&nb);
                goto fail;
            }
            if (nb.n != a->len || memcmp(nb.p, a->content, a->len)) {
                a->norm = nb.p; /* matched, and decoded, in normalized form */
                a->norm_len = nb.n;
                free(h->dec_text[id]);
                h->dec_text[id] = hf_strndup(nb.p, nb.n);
                h->dec_len[id] = (uint32_t)nb.n;
                if (!h->dec_text[id]) goto nomem;
            } else {
                hf_buf_free(&nb);
            }
        }
        const char *pat = a->norm ? a->norm : a->content;
        size_t pl = a->norm ? a->norm_len : a->len;
        if (pl && !hf_trie_add(a->normalized ? &h->normd : &h->raw, pat, pl, (int32_t)i))
            goto nomem;
    }
    /* decoding skips every id whose text is a special token's content (is_special_token) */
    for (size_t i = 0; i < h->n_added; i++) {
        if (!h->added[i].special) continue;
        h->skip[h->added[i].id] = true;
        int32_t mid = hf_model_find(&h->model, h->added[i].content, h->added[i].len);
        if (mid >= 0) h->skip[mid] = true;
    }

    hf_where_sub(&w, &top, "pre_tokenizer");
    json_t *jp = json_object_get(root, "pre_tokenizer");
    if (jp && !json_is_null(jp) && (st = hf_pretok_parse(jp, &w, &h->pretok, err))) goto fail;
    hf_where_sub(&w, &top, "decoder");
    if ((st = hf_decoder_parse(json_object_get(root, "decoder"), &w, &h->dec, err))) goto fail;
    hf_where_sub(&w, &top, "post_processor");
    if ((st = parse_post(h, json_object_get(root, "post_processor"), &w, 0, err))) goto fail;

    /* decoder family, for code that looks at the vocab type */
    {
        json_t *d = json_object_get(root, "decoder");
        const char *dump = NULL;
        char *s = d ? json_dumps(d, JSON_COMPACT) : NULL;
        dump = s ? s : "";
        if (strstr(dump, "\"ByteLevel\""))
            v->type = KILN_VOCAB_BPE;
        else if (strstr(dump, "\"WordPiece\""))
            v->type = KILN_VOCAB_WPM;
        else if (strstr(dump, "\"Metaspace\"") || strstr(dump, "\"ByteFallback\""))
            v->type = KILN_VOCAB_SPM;
        free(s);
    }

    /* special tokens: tokenizer_config.json (special_tokens_map.json), else the template */
    const char *bos = NULL, *eos = NULL, *unk = NULL, *pad = NULL;
    const json_t *srcs[2] = {cfg, x ? x->special_map : NULL};
    hf_where wsrc[2] = {wcfg, {"special_tokens_map.json", ""}};
    for (int k = 0; k < 2; k++) {
        if (!srcs[k]) continue;
        const char *b2, *e2, *u2, *p2;
        if ((st = config_token(srcs[k], "bos_token", &wsrc[k], &b2, err)) ||
            (st = config_token(srcs[k], "eos_token", &wsrc[k], &e2, err)) ||
            (st = config_token(srcs[k], "unk_token", &wsrc[k], &u2, err)) ||
            (st = config_token(srcs[k], "pad_token", &wsrc[k], &p2, err)))
            goto fail;
        if (!bos) bos = b2;
        if (!eos) eos = e2;
        if (!unk) unk = u2;
        if (!pad) pad = p2;
    }
    if (bos) {
        if ((st = set_text(&t->bos_text, bos, err))) goto fail;
        v->bos_id = token_id(h, bos);
    } else if (h->prefix.n == 1) {
        v->bos_id = h->prefix.data[0];
    }
    if (eos) {
        if ((st = set_text(&t->eos_text, eos, err))) goto fail;
        v->eos_id = token_id(h, eos);
    } else if (h->suffix.n == 1) {
        v->eos_id = h->suffix.data[0];
    }
    if (unk && token_id(h, unk) >= 0) v->unk_id = token_id(h, unk);
    if (pad) v->pad_id = token_id(h, pad);
    v->add_bos = v->bos_id >= 0 && h->prefix.n > 0 && h->prefix.data[0] == v->bos_id;
    v->add_eos = v->eos_id >= 0 && h->suffix.n > 0 && h->suffix.data[h->suffix.n - 1] == v->eos_id;
    if (cfg) {
        bool ab = v->add_bos, ae = v->add_eos;
        json_t *jab = json_object_get(cfg, "add_bos_token");
        json_t *jae = json_object_get(cfg, "add_eos_token");
        if ((st = hf_get_bool(cfg, "add_bos_token", &wcfg, &ab, err)) ||
            (st = hf_get_bool(cfg, "add_eos_token", &wcfg, &ae, err)))
            goto fail;
        if ((jab && json_is_boolean(jab)) || (jae && json_is_boolean(jae))) {
            /* transformers rebuilds the template from these flags: [BOS] $A [EOS] */
            h->prefix.n = h->suffix.n = 0;
            if (ab && v->bos_id >= 0 && kiln_ivec_push(&h->prefix, v->bos_id)) goto nomem;
            if (ae && v->eos_id >= 0 && kiln_ivec_push(&h->suffix, v->eos_id)) goto nomem;
            v->add_bos = ab && v->bos_id >= 0;
            v->add_eos = ae && v->eos_id >= 0;
        }
        const char *tmpl = NULL;
        hf_where_sub(&w, &wcfg, "chat_template");
        if ((st = chat_template_of(json_object_get(cfg, "chat_template"), &w, &tmpl, err)))
            goto fail;
        if (tmpl && (st = set_text(&t->chat_template, tmpl, err))) goto fail;
    }
    if (!t->chat_template && x && x->template_text &&
        (st = set_text(&t->chat_template, x->template_text, err)))
        goto fail;
    if (!t->chat_template && x && x->template_json) {
        const char *tmpl = NULL;
        hf_where wj = {"chat_template.json", "chat_template"};
        if ((st = chat_template_of(json_object_get(x->template_json, "chat_template"), &wj, &tmpl,
                                   err)))
            goto fail;
        if (tmpl && (st = set_text(&t->chat_template, tmpl, err))) goto fail;
    }

    if ((st = kiln_vocab_build_index(v, err))) goto fail;
    int32_t fim[6] = {-1, -1, -1, -1, -1, -1};
    if ((st = kiln_tok_finish_specials(t, NULL, -1, fim, err))) goto fail;
    *out = t;
    return KILN_OK;
nomem:
    st = oom(err);
fail:
    kiln_tokenizer_destroy(t);
    return st;
}

kiln_status kiln_tokenizer_from_hf_json(const char *json, size_t json_len, const char *config,
                                        size_t config_len, kiln_tokenizer **out, kiln_error *err) {
    if (!out || !json)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer.json: NULL argument");
    *out = NULL;
    json_t *root = NULL, *cfg = NULL;
    kiln_status st = parse_json(json, json_len, "tokenizer.json", &root, err);
    if (!st && config) st = parse_json(config, config_len, "tokenizer_config.json", &cfg, err);
    if (!st) st = build(root, cfg, NULL, "tokenizer.json", "tokenizer_config.json", out, err);
    json_decref(root);
    json_decref(cfg);
    return st;
}

static kiln_status load_json_file(const char *path, json_t **out, kiln_error *err) {
    size_t len = 0;
    kiln_status st;
    char *text = slurp_file(path, &len, &st, err);
    if (!text) return st;
    st = parse_json(text, len, path, out, err);
    free(text);
    return st;
}

static kiln_status load_files(const char *tok_path, const char *cfg_path, const hf_extra *x,
                              kiln_tokenizer **out, kiln_error *err) {
    json_t *root = NULL, *cfg = NULL;
    kiln_status st = load_json_file(tok_path, &root, err);
    if (!st && cfg_path) st = load_json_file(cfg_path, &cfg, err);
    if (!st)
        st = build(root, cfg, x, tok_path, cfg_path ? cfg_path : "tokenizer_config.json", out, err);
    json_decref(root);
    json_decref(cfg);
    return st;
}

kiln_status kiln_tokenizer_from_hf_files(const char *tokenizer_json, const char *config_json,
                                         kiln_tokenizer **out, kiln_error *err) {
    if (!out || !tokenizer_json)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer.json: NULL argument");
    *out = NULL;
    return load_files(tokenizer_json, config_json, NULL, out, err);
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

kiln_status kiln_tokenizer_from_hf_dir(const char *dir, kiln_tokenizer **out, kiln_error *err) {
    if (!out || !dir)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer.json: NULL argument");
    *out = NULL;
    char tok[4096], cfg[4096], tmpl[4096], tjson[4096], smap[4096];
    if (snprintf(tok, sizeof tok, "%s/tokenizer.json", dir) >= (int)sizeof tok)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: path too long", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(tmpl, sizeof tmpl, "%s/chat_template.jinja", dir);
    snprintf(tjson, sizeof tjson, "%s/chat_template.json", dir);
    snprintf(smap, sizeof smap, "%s/special_tokens_map.json", dir);
    if (!is_file(tok))
        return kiln_error_set(err, KILN_ERR_NOT_FOUND, "%s: no tokenizer.json in the directory",
                              dir);
    hf_extra x = {0};
    json_t *tj = NULL, *sm = NULL;
    char *ttext = NULL;
    kiln_status st = KILN_OK;
    size_t len;
    if (is_file(tmpl) && !(ttext = slurp_file(tmpl, &len, &st, err))) return st;
    if (!st && is_file(tjson)) st = load_json_file(tjson, &tj, err);
    if (!st && is_file(smap)) st = load_json_file(smap, &sm, err);
    if (!st) {
        x.template_text = ttext;
        x.template_json = tj;
        x.special_map = sm;
        st = load_files(tok, is_file(cfg) ? cfg : NULL, &x, out, err);
    }
    free(ttext);
    json_decref(tj);
    json_decref(sm);
    return st;
}
