/*
 * tokenizer.c - building a tokenizer from GGUF metadata or a llama2.c tokenizer.bin, special
 * token partitioning and encoding. Semantics follow llama.cpp's llama-vocab.cpp (vocab
 * loading defaults, end-of-generation detection, tokenizer_st_partition, tokenize) and
 * karpathy/llama2.c run.c for tokenizer.bin.
 */
#include "tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/spm.h"
#include "tokenizer/wpm.h"
#include "util/error.h"

enum { TOKF_LSTRIP = KILN_TOKF_LSTRIP, TOKF_RSTRIP = KILN_TOKF_RSTRIP };

/* ---------------------------------------------------------------- GGUF helpers */

static bool arr_num(const kiln_gguf_value *a, uint64_t i, double *out) {
    const void *d = a->arr.data;
    switch (a->arr.elem_type) {
    case KILN_GGUF_UINT8:
        *out = ((const uint8_t *)d)[i];
        return true;
    case KILN_GGUF_INT8:
        *out = ((const int8_t *)d)[i];
        return true;
    case KILN_GGUF_UINT16:
        *out = ((const uint16_t *)d)[i];
        return true;
    case KILN_GGUF_INT16:
        *out = ((const int16_t *)d)[i];
        return true;
    case KILN_GGUF_UINT32:
        *out = ((const uint32_t *)d)[i];
        return true;
    case KILN_GGUF_INT32:
        *out = ((const int32_t *)d)[i];
        return true;
    case KILN_GGUF_UINT64:
        *out = (double)((const uint64_t *)d)[i];
        return true;
    case KILN_GGUF_INT64:
        *out = (double)((const int64_t *)d)[i];
        return true;
    case KILN_GGUF_FLOAT32:
        *out = ((const float *)d)[i];
        return true;
    case KILN_GGUF_FLOAT64:
        *out = ((const double *)d)[i];
        return true;
    case KILN_GGUF_BOOL:
        *out = ((const uint8_t *)d)[i] != 0;
        return true;
    default:
        return false;
    }
}

static bool str_eq(const kiln_gguf_str *s, const char *lit) {
    size_t n = strlen(lit);
    return s && s->len == n && memcmp(s->data, lit, n) == 0;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* ---------------------------------------------------------------- construction helpers */

kiln_tokenizer *kiln_tok_alloc(void) {
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    kiln_vocab *v = &t->v;
    v->bos_id = v->eos_id = v->eot_id = v->unk_id = v->sep_id = v->pad_id = v->cls_id = v->mask_id =
        -1;
    return t;
}

void kiln_tokenizer_destroy(kiln_tokenizer *t) {
    if (!t) return;
    kiln_vocab_free(&t->v);
    kiln_hf_free(t->hf);
    free(t->chat_template);
    free(t->bos_text);
    free(t->eos_text);
    free(t->flags);
    free(t->eog);
    free(t->special);
    free(t);
}

static int32_t find_cstr(const kiln_vocab *v, const char *s) {
    return kiln_vocab_find(v, s, strlen(s));
}

/* llama.cpp marks these texts CONTROL when they name end-of-turn / FIM tokens */
static void force_control(kiln_vocab *v, int32_t id) {
    if (id >= 0 && id < v->n_tokens) v->token_type[id] = KILN_TOKEN_CONTROL;
}

static int32_t first_of(const kiln_vocab *v, const char *const *texts, size_t n) {
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = find_cstr(v, texts[i]);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

/* Special ids, end-of-generation set, special-token cache, per-token strip flags. */
kiln_status kiln_tok_finish_specials(kiln_tokenizer *t, const kiln_gguf *g, int32_t eom_id,
                                     int32_t fim[6], kiln_error *err) {
    kiln_vocab *v = &t->v;
    int32_t n = v->n_tokens;

    /* auto-detect by text, as llama.cpp does (lowest matching id here, for determinism) */
    static const char *const eot_texts[] = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "<EOT>",
                                            "<\xEF\xBD\x9C"
                                            "end\xE2\x96\x81"
                                            "of\xE2\x96\x81"
                                            "sentence\xEF\xBD\x9C>"};
    static const char *const fim_texts[6][4] = {
        {"<|fim_prefix|>", "<fim-prefix>",
         "<\xEF\xBD\x9C"
         "fim\xE2\x96\x81"
         "begin\xEF\xBD\x9C>",
         "<PRE>"},
        {"<|fim_suffix|>", "<fim-suffix>",
         "<\xEF\xBD\x9C"
         "fim\xE2\x96\x81"
         "hole\xEF\xBD\x9C>",
         "<SUF>"},
        {"<|fim_middle|>", "<fim-middle>",
         "<\xEF\xBD\x9C"
         "fim\xE2\x96\x81"
         "end\xEF\xBD\x9C>",
         "<MID>"},
        {"<|fim_pad|>", "<fim-pad>", "<PAD>", NULL},
        {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"},
        {"<|file_sep|>", NULL, NULL, NULL},
    };
    if (v->eot_id < 0) {
        v->eot_id = first_of(v, eot_texts, sizeof eot_texts / sizeof eot_texts[0]);
        force_control(v, v->eot_id);
    }
    if (eom_id < 0) {
        eom_id = find_cstr(v, "<|eom_id|>");
        force_control(v, eom_id);
    }
    for (int k = 0; k < 6; k++) {
        if (fim[k] >= 0) continue;
        size_t m = 0;
        while (m < 4 && fim_texts[k][m]) m++;
        fim[k] = first_of(v, fim_texts[k], m);
        force_control(v, fim[k]);
    }

    t->eog = calloc((size_t)n ? (size_t)n : 1, sizeof *t->eog);
    if (!t->eog) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int k = 3; k < 6; k++) /* fim pad, rep, sep */
        if (fim[k] >= 0) t->eog[fim[k]] = true;
    static const char *const eog_texts[] = {"<|eot_id|>",    "<|im_end|>",    "<|end|>",
                                            "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                                            "<EOT>"};
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = find_cstr(v, eog_texts[i]);
        if (id >= 0) {
            t->eog[id] = true;
            force_control(v, id);
        }
    }
    if (v->eos_id >= 0) t->eog[v->eos_id] = true;
    if (v->eot_id >= 0) t->eog[v->eot_id] = true;
    if (eom_id >= 0) t->eog[eom_id] = true;

    /* cache of tokens partitioned out of raw text: CONTROL, USER_DEFINED, UNKNOWN */
    t->special = malloc(((size_t)n ? (size_t)n : 1) * sizeof *t->special);
    t->flags = calloc((size_t)n ? (size_t)n : 1, 1);
    if (!t->special || !t->flags)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->n_special = 0;
    for (int32_t id = 0; id < n; id++) {
        int32_t ty = v->token_type[id];
        if (ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_USER_DEFINED || ty == KILN_TOKEN_UNKNOWN)
            t->special[t->n_special++] = id;
    }
    /* longest text first; ties by id (stable insertion sort on a mostly short list) */
    for (size_t i = 1; i < t->n_special; i++) {
        int32_t x = t->special[i];
        size_t j = i;
        while (j > 0 && v->text_len[t->special[j - 1]] < v->text_len[x]) {
            t->special[j] = t->special[j - 1];
            j--;
        }
        t->special[j] = x;
    }

    /* per-model strip attributes (llama.cpp sets these by model / pre-tokenizer name) */
    const kiln_gguf_str *name = g ? kiln_gguf_get_str(g, "general.name") : NULL;
    char lname[256] = {0};
    if (name) {
        size_t m = name->len < sizeof lname - 1 ? name->len : sizeof lname - 1;
        for (size_t i = 0; i < m; i++) lname[i] = (char)tolower((unsigned char)name->data[i]);
    }
    if (v->pre && (strstr(v->pre, "jina-v2-de") || strstr(v->pre, "jina-v2-es") ||
                   strstr(v->pre, "jina-v2-code"))) {
        int32_t id = find_cstr(v, "<mask>");
        if (id >= 0) t->flags[id] |= TOKF_LSTRIP;
    } else if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
        for (size_t i = 0; i < t->n_special; i++) t->flags[t->special[i]] |= TOKF_RSTRIP;
        int32_t id = find_cstr(v, "</s>");
        if (id >= 0) t->flags[id] |= TOKF_RSTRIP;
        static const char *const no_strip[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < 3; i++) {
            id = find_cstr(v, no_strip[i]);
            if (id >= 0) t->flags[id] &= (uint8_t)~TOKF_RSTRIP;
        }
    }

    t->max_token_len = 0;
    for (int32_t id = 0; id < n; id++)
        if ((int32_t)v->text_len[id] > t->max_token_len)
            t->max_token_len = (int32_t)v->text_len[id];
    return KILN_OK;
}

/* ---------------------------------------------------------------- from GGUF */

static kiln_status read_special_id(const kiln_gguf *g, const char *key, int32_t n_tokens,
                                   bool strict, int32_t *id, kiln_error *err) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return KILN_OK;
    int64_t x;
    if (!kiln_gguf_get_i64(g, key, &x)) {
        if (strict)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s is not an integer", g->path, key);
        return KILN_OK;
    }
    if (x < 0 || x >= n_tokens) {
        /* llama.cpp warns and keeps the default; kiln refuses bad BOS/EOS/UNK ids */
        if (strict)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: %s = %lld is outside the vocabulary (%d tokens)", g->path,
                                  key, (long long)x, n_tokens);
        return KILN_OK;
    }
    *id = (int32_t)x;
    return KILN_OK;
}

kiln_status kiln_tokenizer_from_gguf(const kiln_gguf *g, kiln_tokenizer **out, kiln_error *err) {
    if (!g || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    *out = NULL;
    const char *path = g->path ? g->path : "<gguf>";
    const kiln_gguf_str *model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    if (!model)
        return kiln_error_set(err, KILN_ERR_NOT_FOUND, "%s: no tokenizer.ggml.model key", path);
    kiln_vocab_type type;
    if (str_eq(model, "llama"))
        type = KILN_VOCAB_SPM;
    else if (str_eq(model, "gpt2"))
        type = KILN_VOCAB_BPE;
    else if (str_eq(model, "bert"))
        type = KILN_VOCAB_WPM;
    else
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: tokenizer model '%.*s' is not supported (llama, gpt2, bert are)",
                              path, (int)(model->len > 64 ? 64 : model->len), model->data);

    const kiln_gguf_value *toks = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens");
    if (!toks)
        return kiln_error_set(err, KILN_ERR_NOT_FOUND, "%s: no tokenizer.ggml.tokens array", path);
    if (toks->arr.elem_type != KILN_GGUF_STRING)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tokenizer.ggml.tokens is not a string array", path);
    if (toks->arr.n == 0 || toks->arr.n > (uint64_t)INT32_MAX / 2)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                              path, (unsigned long long)toks->arr.n);
    int32_t n = (int32_t)toks->arr.n;
    const kiln_gguf_value *scores = kiln_gguf_get_arr(g, "tokenizer.ggml.scores");
    const kiln_gguf_value *types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type");
    if (!scores && kiln_gguf_find(g, "tokenizer.ggml.scores"))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.scores is not an array",
                              path);
    if (!types && kiln_gguf_find(g, "tokenizer.ggml.token_type"))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an array",
                              path);
    if (scores && scores->arr.n != (uint64_t)n)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tokenizer.ggml.scores has %llu entries, tokens has %d", path,
                              (unsigned long long)scores->arr.n, n);
    if (types && types->arr.n != (uint64_t)n)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tokenizer.ggml.token_type has %llu entries, tokens has %d", path,
                              (unsigned long long)types->arr.n, n);
    double tmp;
    if (scores && !arr_num(scores, 0, &tmp))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.scores is not numeric",
                              path);
    if (types && !arr_num(types, 0, &tmp))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not numeric",
                              path);
    const kiln_gguf_value *merges = NULL;
    if (type == KILN_VOCAB_BPE) {
        merges = kiln_gguf_get_arr(g, "tokenizer.ggml.merges");
        if (!merges)
            return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                                  "%s: BPE vocab without tokenizer.ggml.merges", path);
        if (merges->arr.elem_type != KILN_GGUF_STRING || merges->arr.n > (uint64_t)INT32_MAX / 2)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tokenizer.ggml.merges is malformed",
                                  path);
    }

    kiln_tokenizer *t = kiln_tok_alloc();
    if (!t) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    kiln_vocab *v = &t->v;
    kiln_status st;
    v->type = type;
    v->n_tokens = 0;
    v->text = calloc((size_t)n, sizeof *v->text);
    v->text_len = calloc((size_t)n, sizeof *v->text_len);
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->token_type = calloc((size_t)n, sizeof *v->token_type);
    if (!v->text || !v->text_len || !v->scores || !v->token_type) goto oom;
    v->n_tokens = n;
    const kiln_gguf_str *ts = toks->arr.data;
    for (int32_t i = 0; i < n; i++) {
        if (ts[i].len == 0) {
            char buf[32];
            int m = snprintf(buf, sizeof buf, "[EMPTY_%d]", i); /* llama.cpp's renaming */
            v->text[i] = dup_bytes(buf, (size_t)m);
            v->text_len[i] = (uint32_t)m;
        } else {
            if (ts[i].len > UINT32_MAX / 2) {
                st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: token %d is %llu bytes long", path,
                                    i, (unsigned long long)ts[i].len);
                goto fail;
            }
            v->text[i] = dup_bytes(ts[i].data, (size_t)ts[i].len);
            v->text_len[i] = (uint32_t)ts[i].len;
        }
        if (!v->text[i]) goto oom;
        if (scores) {
            arr_num(scores, (uint64_t)i, &tmp);
            v->scores[i] = (float)tmp;
        }
        int32_t ty = KILN_TOKEN_NORMAL;
        if (types) {
            arr_num(types, (uint64_t)i, &tmp);
            ty = (tmp >= 0 && tmp <= 6 && tmp == floor(tmp)) ? (int32_t)tmp : KILN_TOKEN_UNDEFINED;
        }
        v->token_type[i] = ty;
        uint8_t byte;
        if (ty == KILN_TOKEN_BYTE && type != KILN_VOCAB_BPE &&
            !kiln_vocab_byte_piece(v->text[i], v->text_len[i], &byte)) {
            /* llama.cpp's token_to_byte parses the hex digits and throws on anything else */
            char eb[40];
            snprintf(eb, sizeof eb, "%.32s", v->text[i]);
            st = kiln_error_set(err, KILN_ERR_FORMAT,
                                "%s: token %d has type byte (6) but its text '%s' is not a byte "
                                "token's \"<0xNN>\" (two hex digits)",
                                path, i, eb);
            goto fail;
        }
    }
    if (merges) {
        v->merges = calloc(merges->arr.n ? (size_t)merges->arr.n : 1, sizeof *v->merges);
        if (!v->merges) goto oom;
        const kiln_gguf_str *ms = merges->arr.data;
        for (uint64_t i = 0; i < merges->arr.n; i++) {
            v->merges[i] = dup_bytes(ms[i].data, (size_t)ms[i].len);
            if (!v->merges[i]) goto oom;
            v->n_merges = (int32_t)i + 1;
        }
    }
    const kiln_gguf_str *tmpl = kiln_gguf_get_str(g, "tokenizer.chat_template");
    if (tmpl) {
        t->chat_template = dup_bytes(tmpl->data, (size_t)tmpl->len);
        if (!t->chat_template) goto oom;
    }
    const kiln_gguf_str *pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    if (pre) {
        v->pre = dup_bytes(pre->data, (size_t)pre->len);
        if (!v->pre) goto oom;
    }

    /* defaults per model type (llama.cpp llama_vocab::impl::load) */
    switch (type) {
    case KILN_VOCAB_SPM:
        v->bos_id = 1, v->eos_id = 2, v->unk_id = 0;
        v->add_space_prefix = true, v->add_bos = true, v->add_eos = false;
        break;
    case KILN_VOCAB_WPM:
        v->bos_id = 101, v->unk_id = 100, v->sep_id = 102, v->pad_id = 0, v->mask_id = 103;
        v->add_space_prefix = false, v->add_bos = true, v->add_eos = false;
        break;
    default: /* BPE */
        v->bos_id = 11, v->eos_id = 11;
        v->add_space_prefix = false, v->add_bos = false, v->add_eos = false;
        if (v->pre && (!strcmp(v->pre, "llama3") || !strcmp(v->pre, "llama-v3") ||
                       !strcmp(v->pre, "llama-bpe") || !strcmp(v->pre, "falcon3") ||
                       !strcmp(v->pre, "tekken") || !strcmp(v->pre, "chameleon")))
            v->add_bos = true;
        if (v->pre && !strcmp(v->pre, "chatglm-bpe")) v->bos_id = -1;
        break;
    }
    int32_t *defaults[] = {&v->bos_id, &v->eos_id, &v->unk_id, &v->sep_id, &v->pad_id, &v->mask_id};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (*defaults[i] >= n) *defaults[i] = -1; /* tiny vocab: default id does not exist */
    bool b;
    if (kiln_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) v->add_space_prefix = b;
    if (kiln_gguf_get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &b))
        v->remove_extra_whitespaces = b;

    int32_t eom_id = -1, fim[6] = {-1, -1, -1, -1, -1, -1};
    bool had_bos = kiln_gguf_find(g, "tokenizer.ggml.bos_token_id") != NULL;
    struct {
        const char *key;
        int32_t *id;
        bool strict;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", &v->bos_id, true},
        {"tokenizer.ggml.eos_token_id", &v->eos_id, true},
        {"tokenizer.ggml.eot_token_id", &v->eot_id, false},
        {"tokenizer.ggml.eom_token_id", &eom_id, false},
        {"tokenizer.ggml.unknown_token_id", &v->unk_id, true},
        {"tokenizer.ggml.seperator_token_id", &v->sep_id, false},
        {"tokenizer.ggml.padding_token_id", &v->pad_id, false},
        {"tokenizer.ggml.cls_token_id", &v->cls_id, false},
        {"tokenizer.ggml.mask_token_id", &v->mask_id, false},
        {"tokenizer.ggml.fim_pre_token_id", &fim[0], false},
        {"tokenizer.ggml.fim_suf_token_id", &fim[1], false},
        {"tokenizer.ggml.fim_mid_token_id", &fim[2], false},
        {"tokenizer.ggml.fim_pad_token_id", &fim[3], false},
        {"tokenizer.ggml.fim_rep_token_id", &fim[4], false},
        {"tokenizer.ggml.fim_sep_token_id", &fim[5], false},
        {"tokenizer.ggml.prefix_token_id", &fim[0], false},
        {"tokenizer.ggml.suffix_token_id", &fim[1], false},
        {"tokenizer.ggml.middle_token_id", &fim[2], false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        st = read_special_id(g, keys[i].key, n, keys[i].strict, keys[i].id, err);
        if (st != KILN_OK) goto fail;
    }
    /* WordPiece: CLS is the sequence-start token llama.cpp adds as BOS */
    if (type == KILN_VOCAB_WPM && !had_bos && v->cls_id >= 0) v->bos_id = v->cls_id;
    if (type == KILN_VOCAB_WPM && v->cls_id < 0) v->cls_id = v->bos_id;
    if (kiln_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) v->add_bos = b;
    if (kiln_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b)) v->add_eos = b;

    st = kiln_vocab_build_index(v, err);
    if (st != KILN_OK) goto fail;
    st = kiln_tok_finish_specials(t, g, eom_id, fim, err);
    if (st != KILN_OK) goto fail;
    if (type == KILN_VOCAB_BPE) {
        st = kiln_bpe_init(v, err);
        if (st != KILN_OK) {
            kiln_error_prefix(err, "%s: ", path);
            goto fail;
        }
    }
    *out = t;
    return KILN_OK;
oom:
    st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory loading the vocabulary",
                        path);
fail:
    kiln_tokenizer_destroy(t);
    return st;
}

/* ---------------------------------------------------------------- from llama2.c */

kiln_status kiln_tokenizer_from_llama2c(const char *path, int32_t n_vocab, kiln_tokenizer **out,
                                        kiln_error *err) {
    if (!path || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    *out = NULL;
    kiln_tokenizer *t = kiln_tok_alloc();
    if (!t) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    kiln_status st = kiln_llama2c_vocab_load(path, n_vocab, &t->v, err);
    if (st == KILN_OK) st = kiln_vocab_build_index(&t->v, err);
    if (st == KILN_OK) {
        kiln_vocab *v = &t->v;
        int32_t n = v->n_tokens;
        t->eog = calloc((size_t)n, sizeof *t->eog);
        t->flags = calloc((size_t)n, 1);
        t->special = calloc(1, sizeof *t->special);
        if (!t->eog || !t->flags || !t->special) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        } else {
            /* run.c stops generating at BOS (id 1); EOS (id 2) ends a sequence as well */
            if (v->bos_id >= 0) t->eog[v->bos_id] = true;
            if (v->eos_id >= 0) t->eog[v->eos_id] = true;
            for (int32_t id = 0; id < n; id++)
                if ((int32_t)v->text_len[id] > t->max_token_len)
                    t->max_token_len = (int32_t)v->text_len[id];
        }
    }
    if (st != KILN_OK) {
        kiln_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

/* ---------------------------------------------------------------- accessors */

const kiln_vocab *kiln_tokenizer_vocab(const kiln_tokenizer *t) {
    return t ? &t->v : NULL;
}

int32_t kiln_tokenizer_n_vocab(const kiln_tokenizer *t) {
    return t ? t->v.n_tokens : 0;
}

int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) {
    return t ? t->v.bos_id : -1;
}

int32_t kiln_tokenizer_eos(const kiln_tokenizer *t) {
    return t ? t->v.eos_id : -1;
}

bool kiln_tokenizer_is_eog(const kiln_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->v.n_tokens && t->eog[id];
}

kiln_status kiln_tokenizer_add_eog(kiln_tokenizer *t, int32_t id, kiln_error *err) {
    if (!t || !t->eog || id < 0 || id >= t->v.n_tokens)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tokenizer: end-of-generation id %d is outside the vocabulary (%d "
                              "tokens)",
                              id, t ? t->v.n_tokens : 0);
    t->eog[id] = true;
    return KILN_OK;
}

const char *kiln_tokenizer_chat_template(const kiln_tokenizer *t) {
    return t ? t->chat_template : NULL;
}

const char *kiln_tokenizer_bos_text(const kiln_tokenizer *t) {
    if (!t) return NULL;
    if (t->bos_text) return t->bos_text;
    return t->v.bos_id >= 0 ? t->v.text[t->v.bos_id] : NULL;
}

const char *kiln_tokenizer_eos_text(const kiln_tokenizer *t) {
    if (!t) return NULL;
    if (t->eos_text) return t->eos_text;
    return t->v.eos_id >= 0 ? t->v.text[t->v.eos_id] : NULL;
}

/* ---------------------------------------------------------------- encoding */

typedef struct fragment {
    int32_t id; /* token id, or -1 for raw text */
    size_t off, len;
} fragment;

typedef struct frag_list {
    fragment *a;
    size_t n, cap;
} frag_list;

static bool frag_push(frag_list *l, int32_t id, size_t off, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        fragment *a = realloc(l->a, cap * sizeof *a);
        if (!a) return false;
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = (fragment){id, off, len};
    return true;
}

static bool is_c_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/*
 * llama.cpp's tokenizer_st_partition: for each special token (longest text first), split
 * every raw fragment at each occurrence of its text, left to right. Without parse_special
 * only USER_DEFINED tokens are recognised (CONTROL and UNKNOWN are skipped).
 */
static bool partition(const kiln_tokenizer *t, const char *text, size_t len, bool parse_special,
                      frag_list *frags) {
    const kiln_vocab *v = &t->v;
    frags->n = 0;
    if (!frag_push(frags, -1, 0, len)) return false;
    frag_list next = {0};
    for (size_t si = 0; si < t->n_special; si++) {
        int32_t sid = t->special[si];
        int32_t ty = v->token_type[sid];
        if (!parse_special && (ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_UNKNOWN)) continue;
        const char *st = v->text[sid];
        size_t sl = v->text_len[sid];
        bool any = false;
        for (size_t fi = 0; fi < frags->n && !any; fi++)
            any = frags->a[fi].id < 0 && frags->a[fi].len >= sl &&
                  memmem(text + frags->a[fi].off, frags->a[fi].len, st, sl) != NULL;
        if (!any) continue;
        next.n = 0;
        for (size_t fi = 0; fi < frags->n; fi++) {
            fragment f = frags->a[fi];
            if (f.id >= 0) {
                if (!frag_push(&next, f.id, 0, 0)) goto oom;
                continue;
            }
            size_t off = f.off, flen = f.len;
            for (;;) {
                const char *m = flen >= sl ? memmem(text + off, flen, st, sl) : NULL;
                if (!m) {
                    if (flen > 0 && !frag_push(&next, -1, off, flen)) goto oom;
                    break;
                }
                size_t mpos = (size_t)(m - text);
                size_t llen = mpos - off;
                if (t->flags[sid] & TOKF_LSTRIP)
                    while (llen > 0 && is_c_space(text[off + llen - 1])) llen--;
                if (llen > 0 && !frag_push(&next, -1, off, llen)) goto oom;
                if (!frag_push(&next, sid, 0, 0)) goto oom;
                size_t roff = mpos + sl, rlen = off + flen - roff;
                if (t->flags[sid] & TOKF_RSTRIP)
                    while (rlen > 0 && is_c_space(text[roff])) roff++, rlen--;
                off = roff;
                flen = rlen;
                if (flen == 0) break;
            }
        }
        frag_list tmp = *frags;
        *frags = next;
        next = tmp;
    }
    free(next.a);
    return true;
oom:
    free(next.a);
    return false;
}

/* SPM: prepend U+2581 when asked, then replace every ' ' with U+2581 */
static kiln_status spm_fragment(const kiln_vocab *v, const char *s, size_t n, bool prefix,
                                char **buf, size_t *cap, kiln_ivec *out, kiln_error *err) {
    size_t spaces = prefix ? 1 : 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    size_t need = n + spaces * 2 + (prefix ? 1 : 0) + 1;
    if (need > *cap) {
        char *b = realloc(*buf, need);
        if (!b) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        *buf = b;
        *cap = need;
    }
    char *o = *buf;
    size_t k = 0;
    if (prefix) o[k++] = '\xE2', o[k++] = '\x96', o[k++] = '\x81';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            o[k++] = '\xE2', o[k++] = '\x96', o[k++] = '\x81';
        else
            o[k++] = s[i];
    }
    return kiln_spm_encode(v, o, k, out, err);
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  bool add_special, bool parse_special, kiln_ivec *out,
                                  kiln_error *err) {
    if (!t || !out || (!text && len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    size_t bad;
    if (!kiln_utf8_valid(text, len, &bad))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tokenizer: input is not valid UTF-8 (byte offset %zu, byte 0x%02X)",
                              bad, (unsigned)(uint8_t)text[bad]);
    if (t->hf) return kiln_hf_encode(t->hf, text, len, add_special, parse_special, out, err);
    const kiln_vocab *v = &t->v;
    size_t n0 = out->n;
    kiln_status st = KILN_OK;

    if (v->type == KILN_VOCAB_LLAMA2C) {
        st = kiln_llama2c_encode(v, text, len, add_special && v->add_bos && v->bos_id >= 0,
                                 add_special && v->add_eos && v->eos_id >= 0, out, err);
        if (st != KILN_OK) out->n = n0;
        return st;
    }

    frag_list frags = {0};
    if (len > 0 && !partition(t, text, len, parse_special, &frags)) {
        free(frags.a);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    char *buf = NULL;
    size_t cap = 0;
    bool bos = false, eos = false;
    if (add_special) {
        if (v->type == KILN_VOCAB_WPM) {
            bos = v->bos_id >= 0;
            eos = false;
        } else {
            bos = v->add_bos && v->bos_id >= 0;
            eos = v->add_eos && v->eos_id >= 0;
        }
    }
    if (bos && kiln_ivec_push(out, v->bos_id) != KILN_OK) goto oom;
    bool prev_special = true; /* SPM: space-prefix the first fragment and those after tokens */
    for (size_t i = 0; i < frags.n && st == KILN_OK; i++) {
        const fragment *f = &frags.a[i];
        if (f->id >= 0) {
            if (kiln_ivec_push(out, f->id) != KILN_OK) goto oom;
            prev_special = true;
            continue;
        }
        switch (v->type) {
        case KILN_VOCAB_SPM:
            st = spm_fragment(v, text + f->off, f->len, v->add_space_prefix && prev_special, &buf,
                              &cap, out, err);
            break;
        case KILN_VOCAB_BPE:
            st = kiln_bpe_encode(v, text + f->off, f->len, out, err);
            break;
        case KILN_VOCAB_WPM:
            st = kiln_wpm_encode(v, t->max_token_len, text + f->off, f->len, out, err);
            break;
        default:
            st = kiln_error_set(err, KILN_ERR_INTERNAL, "tokenizer: bad vocab type %d", v->type);
        }
        prev_special = false;
    }
    if (st == KILN_OK && add_special) {
        if (v->type == KILN_VOCAB_WPM) {
            if (v->sep_id >= 0 && kiln_ivec_push(out, v->sep_id) != KILN_OK) goto oom;
        } else if (eos && kiln_ivec_push(out, v->eos_id) != KILN_OK) {
            goto oom;
        }
    }
    free(buf);
    free(frags.a);
    if (st != KILN_OK) out->n = n0;
    return st;
oom:
    free(buf);
    free(frags.a);
    out->n = n0;
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
}
