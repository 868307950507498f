/* hf_to_gguf.c - tokenizer.json as GGUF tokenizer metadata (hf_to_gguf.h). */
#include "tokenizer/hf_to_gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json_file.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

/* The pre-tokenizer regexes of Hugging Face tokenizer.json files that llama.cpp's pre types
 * reproduce (llama.cpp convert_hf_to_gguf.py identifies them the same way, by the tokenizer). */
static const struct {
    const char *regex, *pre;
} g_split_regex[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
};

static const char *jstr(const json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

static bool jtrue(const json_t *o, const char *k) {
    return json_is_true(json_object_get(o, k));
}

/* A ByteLevel pre-tokenizer object's check: add_prefix_space false, use_regex as wanted. */
static kiln_status check_bytelevel(const json_t *bl, bool want_regex, const char *where,
                                   kiln_error *err) {
    if (jtrue(bl, "add_prefix_space"))
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "tokenizer.json: %s: ByteLevel add_prefix_space true has no GGUF "
                              "equivalent (llama.cpp's BPE adds no prefix space)",
                              where);
    json_t *ur = json_object_get(bl, "use_regex");
    bool use_regex = ur ? json_is_true(ur) : true; /* tokenizers' default */
    if (use_regex != want_regex)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "tokenizer.json: %s: ByteLevel use_regex %s is not a combination "
                              "llama.cpp has a pre-tokenizer for",
                              where, use_regex ? "true" : "false");
    return KILN_OK;
}

/* pre_tokenizer -> llama.cpp pre name. */
static kiln_status pre_name(const json_t *pt, const char **pre, kiln_error *err) {
    const char *ty = jstr(pt, "type");
    if (!pt || json_is_null(pt) || !ty)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "tokenizer.json: pre_tokenizer: a byte-level BPE without a "
                              "ByteLevel pre-tokenizer has no GGUF equivalent");
    if (!strcmp(ty, "ByteLevel")) {
        kiln_status st = check_bytelevel(pt, true, "pre_tokenizer", err);
        if (st) return st;
        *pre = "gpt-2";
        return KILN_OK;
    }
    json_t *seq = json_object_get(pt, "pretokenizers");
    if (!strcmp(ty, "Sequence") && json_is_array(seq) && json_array_size(seq) == 2) {
        json_t *sp = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
        const char *t0 = jstr(sp, "type"), *t1 = jstr(bl, "type");
        const char *rx = json_string_value(json_object_get(json_object_get(sp, "pattern"),
                                                           "Regex"));
        const char *beh = jstr(sp, "behavior");
        if (t0 && t1 && !strcmp(t0, "Split") && !strcmp(t1, "ByteLevel") && rx && beh &&
            !strcmp(beh, "Isolated") && !jtrue(sp, "invert")) {
            kiln_status st = check_bytelevel(bl, false, "pre_tokenizer.pretokenizers[1]", err);
            if (st) return st;
            for (size_t i = 0; i < sizeof g_split_regex / sizeof g_split_regex[0]; i++)
                if (!strcmp(rx, g_split_regex[i].regex)) {
                    *pre = g_split_regex[i].pre;
                    return KILN_OK;
                }
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex "
                                  "'%.80s%s' is not one kiln knows a llama.cpp pre-tokenizer for "
                                  "(GPT-2's ByteLevel regex, Llama 3's, Qwen2's)",
                                  rx, strlen(rx) > 80 ? "..." : "");
        }
    }
    return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                          "tokenizer.json: pre_tokenizer of type '%s' is not a shape kiln "
                          "converts (ByteLevel, or Sequence [Split regex, ByteLevel])",
                          ty);
}

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tokenizer to GGUF: out of memory");
}

kiln_status kiln_hf_tokenizer_to_gguf(const char *dir, int32_t n_vocab, kiln_gguf_writer *w,
                                      kiln_hf_gguf_info *info, kiln_error *err) {
    if (!dir || !w || !info || n_vocab < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tokenizer to GGUF: NULL argument or n_vocab < 1");
    memset(info, 0, sizeof *info);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *root = NULL;
    kiln_status st = kiln_json_load_path(path, 0, &root, err);
    if (st) return st;
    kiln_tokenizer *t = NULL;
    char **texts = NULL;
    int32_t *types = NULL;
    char **merges = NULL;
    size_t n_merges = 0;

    /* the shape of the pipeline: what llama.cpp can reproduce */
    json_t *model = json_object_get(root, "model");
    const char *mty = jstr(model, "type");
    if (!mty && json_is_object(json_object_get(model, "vocab")) &&
        json_object_get(model, "merges"))
        mty = "BPE"; /* tokenizers' untagged BPE */
    if (!mty || strcmp(mty, "BPE") != 0) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model.type '%s' cannot be written as GGUF tokenizer metadata by "
                            "kiln convert (byte-level BPE only; use --vocab FILE or "
                            "--no-tokenizer)",
                            path, mty ? mty : "(none)");
        goto done;
    }
    json_t *norm = json_object_get(root, "normalizer");
    const char *nty = jstr(norm, "type");
    if (jtrue(model, "byte_fallback") ||
        (nty && (!strcmp(nty, "Prepend") || !strcmp(nty, "Sequence"))) ||
        (jstr(json_object_get(root, "pre_tokenizer"), "type") &&
         !strcmp(jstr(json_object_get(root, "pre_tokenizer"), "type"), "Metaspace"))) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: a SentencePiece-style BPE (byte_fallback / Metaspace / Prepend "
                            "normalizer) is not converted: GGUF's \"llama\" tokenizer needs "
                            "SentencePiece scores, which tokenizer.json lacks (use --vocab FILE "
                            "with a GGUF of the same vocabulary, or --no-tokenizer)",
                            path);
        goto done;
    }
    const char *suffix = jstr(model, "end_of_word_suffix"),
               *prefix = jstr(model, "continuing_subword_prefix");
    if ((suffix && *suffix) || (prefix && *prefix)) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model.continuing_subword_prefix / end_of_word_suffix have no GGUF "
                            "equivalent",
                            path);
        goto done;
    }
    const char *pre = NULL;
    if ((st = pre_name(json_object_get(root, "pre_tokenizer"), &pre, err))) {
        kiln_error_prefix(err, "%s: ", dir);
        goto done;
    }
    if (norm && !json_is_null(norm)) {
        if (nty && !strcmp(nty, "NFC") && !strcmp(pre, "qwen2")) {
            info->note = "the NFC normalizer of tokenizer.json is not applied by llama.cpp's "
                         "qwen2 pre-tokenizer (nor by kiln reading the GGUF): text that is not "
                         "in NFC may tokenize differently";
        } else {
            st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: normalizer '%s' has no GGUF equivalent for byte-level BPE",
                                path, nty ? nty : "?");
            goto done;
        }
    }
    if (jtrue(model, "ignore_merges") && strcmp(pre, "llama-bpe") != 0) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model.ignore_merges true goes with Llama 3's pre-tokenizer only "
                            "in llama.cpp",
                            path);
        goto done;
    }
    json_t *jm = json_object_get(model, "merges");
    if (!json_is_array(jm)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: model.merges is not an array", path);
        goto done;
    }

    /* the tokens, ids and specials exactly as kiln's tokenizer.json loader sees them */
    if ((st = kiln_tokenizer_from_hf_dir(dir, &t, err))) goto done;
    const kiln_vocab *v = &t->v;
    if (v->n_tokens > n_vocab) {
        st = kiln_error_set(err, KILN_ERR_FORMAT,
                            "%s: the tokenizer has %d token ids but the model's vocab_size is %d",
                            path, v->n_tokens, n_vocab);
        goto done;
    }
    texts = calloc((size_t)n_vocab, sizeof *texts);
    types = calloc((size_t)n_vocab, sizeof *types);
    if (!texts || !types) {
        st = oom(err);
        goto done;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        bool named = i < v->n_tokens && v->token_type[i] != KILN_TOKEN_UNUSED;
        if (named) {
            if (memchr(v->text[i], '\0', v->text_len[i])) {
                st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                    "%s: token %d contains a NUL byte", path, i);
                goto done;
            }
            texts[i] = strdup(v->text[i]);
            types[i] = v->token_type[i] == KILN_TOKEN_CONTROL        ? KILN_TOKEN_CONTROL
                       : v->token_type[i] == KILN_TOKEN_USER_DEFINED ? KILN_TOKEN_USER_DEFINED
                                                                     : KILN_TOKEN_NORMAL;
            info->n_named++;
        } else {
            char buf[32];
            snprintf(buf, sizeof buf, "[PAD%d]", i);
            texts[i] = strdup(buf);
            types[i] = KILN_TOKEN_UNUSED;
        }
        if (!texts[i]) {
            st = oom(err);
            goto done;
        }
    }
    n_merges = json_array_size(jm);
    merges = calloc(n_merges ? n_merges : 1, sizeof *merges);
    if (!merges) {
        st = oom(err);
        goto done;
    }
    for (size_t i = 0; i < n_merges; i++) {
        json_t *e = json_array_get(jm, i);
        const char *a = NULL, *b = NULL;
        if (json_is_string(e)) {
            merges[i] = strdup(json_string_value(e));
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   (a = json_string_value(json_array_get(e, 0))) &&
                   (b = json_string_value(json_array_get(e, 1)))) {
            size_t la = strlen(a), lb = strlen(b);
            merges[i] = malloc(la + lb + 2);
            if (merges[i]) {
                memcpy(merges[i], a, la);
                merges[i][la] = ' ';
                memcpy(merges[i] + la + 1, b, lb + 1);
            }
        } else {
            st = kiln_error_set(err, KILN_ERR_FORMAT,
                                "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                                path, i);
            goto done;
        }
        if (!merges[i]) {
            st = oom(err);
            goto done;
        }
    }

    info->model = "gpt2";
    info->pre = pre;
    info->n_tokens = n_vocab;
    info->n_merges = (int32_t)n_merges;
    if ((st = kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", err)) ||
        (st = kiln_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre, err)) ||
        (st = kiln_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens",
                                             (const char *const *)texts, (uint64_t)n_vocab, err)) ||
        (st = kiln_gguf_writer_set_array(w, "tokenizer.ggml.token_type", KILN_GGUF_INT32, types,
                                         (uint64_t)n_vocab, err)) ||
        (st = kiln_gguf_writer_set_str_array(w, "tokenizer.ggml.merges",
                                             (const char *const *)merges, (uint64_t)n_merges,
                                             err)))
        goto done;
    const struct {
        const char *key;
        int32_t id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", v->bos_id},
        {"tokenizer.ggml.eos_token_id", v->eos_id},
        {"tokenizer.ggml.unknown_token_id", v->unk_id},
        {"tokenizer.ggml.padding_token_id", v->pad_id},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id >= 0 &&
            (st = kiln_gguf_writer_set_u32(w, ids[i].key, (uint32_t)ids[i].id, err)))
            goto done;
    if ((st = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err)) ||
        (st = kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos, err)))
        goto done;
    if (t->chat_template &&
        (st = kiln_gguf_writer_set_str(w, "tokenizer.chat_template", t->chat_template, err)))
        goto done;
done:
    if (texts)
        for (int32_t i = 0; i < n_vocab; i++) free(texts[i]);
    free(texts);
    free(types);
    if (merges)
        for (size_t i = 0; i < n_merges; i++) free(merges[i]);
    free(merges);
    kiln_tokenizer_destroy(t);
    json_decref(root);
    return st;
}
