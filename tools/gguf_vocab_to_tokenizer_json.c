/*
 * kiln-export-tokenizer - write a GGUF file's vocabulary as a Hugging Face tokenizer.json and
 * tokenizer_config.json, the way Hugging Face's converters build them:
 *
 *   SPM ("llama")  BPE model with byte_fallback and fuse_unk, merges derived from the token
 *                  scores as transformers' generate_merges does (every split of every token
 *                  into two tokens, ordered by the token's score, then the left and right
 *                  lengths, descending; within a token by the ids of the two halves);
 *                  normalizer Prepend("▁") + Replace(" ", "▁") with the decoder Replace +
 *                  ByteFallback + Fuse + Strip (LlamaConverter, legacy), or with
 *                  --spm=metaspace a Metaspace pre-tokenizer (prepend_scheme "first") and
 *                  decoder ByteFallback + Metaspace.
 *   BPE ("gpt2")   BPE model with the GGUF merges; pre-tokenizer: one Split (Isolated) per
 *                  regex of llama.cpp's tokenizer.ggml.pre type, then ByteLevel without its
 *                  own regex; ByteLevel decoder; ignore_merges for the llama3/tekken types.
 *   WPM ("bert")   WordPiece model ("▁x" -> "x", "x" -> "##x", "[X]" kept, undoing llama.cpp's
 *                  conversion), BertNormalizer, BertPreTokenizer, WordPiece decoder, template
 *                  [CLS] $A [SEP].
 * CONTROL and UNKNOWN tokens become special added tokens, USER_DEFINED tokens non-special
 * ones (normalized=false, lstrip/rstrip as kiln's GGUF loader sets them). The post-processor
 * and tokenizer_config.json carry BOS/EOS, add_bos_token/add_eos_token and the chat template.
 *
 * usage: kiln-export-tokenizer [--spm=legacy|metaspace] [--merges=pairs|strings] IN.gguf OUTDIR
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/utf8.h"

static const char SPACE_MARK[] = "\xE2\x96\x81"; /* U+2581 */

static void die(const char *msg) {
    fprintf(stderr, "kiln-export-tokenizer: %s\n", msg);
    exit(1);
}

static json_t *must(json_t *j) {
    if (!j) die("out of memory building JSON");
    return j;
}

static void set(json_t *o, const char *k, json_t *v) {
    if (json_object_set_new(o, k, must(v))) die("out of memory building JSON");
}

static void push(json_t *a, json_t *v) {
    if (json_array_append_new(a, must(v))) die("out of memory building JSON");
}

/* A JSON string of the token text; invalid UTF-8 (not representable) gets a placeholder. */
static json_t *text_json(const char *s, size_t n, int32_t id, int *n_bad) {
    if (kiln_utf8_valid(s, n, NULL)) return must(json_stringn(s, n));
    char buf[48];
    snprintf(buf, sizeof buf, "[INVALID_UTF8_%d]", id);
    (*n_bad)++;
    return must(json_string(buf));
}

static json_t *obj_type(const char *type) {
    json_t *o = must(json_object());
    set(o, "type", json_string(type));
    return o;
}

static json_t *pattern(const char *key, const char *s) {
    json_t *p = must(json_object());
    set(p, key, json_string(s));
    return p;
}

static json_t *replace(const char *kind, const char *from, const char *to) {
    json_t *r = obj_type(kind);
    set(r, "pattern", pattern("String", from));
    set(r, "content", json_string(to));
    return r;
}

/* ---- merges from SPM scores (transformers generate_merges) ------------------------------- */

typedef struct cand {
    int32_t l, r; /* ids of the halves */
    float score;
    int32_t ll, rl; /* lengths in code points */
    int64_t order;  /* position before sorting (stability) */
} cand;

static int cmp_local(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

static int cmp_global(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->ll != y->ll) return x->ll > y->ll ? -1 : 1;
    if (x->rl != y->rl) return x->rl > y->rl ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int32_t cp_count(const char *s, size_t n) {
    int32_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static cand *spm_merges(const kiln_vocab *v, size_t *n_out) {
    size_t n = 0, cap = 1024;
    cand *c = malloc(cap * sizeof *c);
    if (!c) die("out of memory");
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text[id];
        size_t len = v->text_len[id];
        size_t first = n;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80) continue; /* split at characters */
            int32_t l = kiln_vocab_find(v, s, k), r = kiln_vocab_find(v, s + k, len - k);
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                cap *= 2;
                cand *c2 = realloc(c, cap * sizeof *c);
                if (!c2) die("out of memory");
                c = c2;
            }
            c[n++] = (cand){
                l, r, v->scores ? v->scores[id] : 0.0f, cp_count(s, k), cp_count(s + k, len - k),
                0};
        }
        qsort(c + first, n - first, sizeof *c, cmp_local);
    }
    for (size_t i = 0; i < n; i++) c[i].order = (int64_t)i;
    qsort(c, n, sizeof *c, cmp_global);
    *n_out = n;
    return c;
}

static json_t *merge_json(const kiln_vocab *v, int32_t l, int32_t r, bool strings, int *n_bad) {
    if (strings) {
        if (memchr(v->text[l], ' ', v->text_len[l]) || memchr(v->text[r], ' ', v->text_len[r]))
            die("a merge has a space in a token: use --merges=pairs");
        size_t n = v->text_len[l] + 1 + v->text_len[r];
        char *b = malloc(n + 1);
        if (!b) die("out of memory");
        memcpy(b, v->text[l], v->text_len[l]);
        b[v->text_len[l]] = ' ';
        memcpy(b + v->text_len[l] + 1, v->text[r], v->text_len[r]);
        json_t *j = text_json(b, n, l, n_bad);
        free(b);
        return j;
    }
    json_t *p = must(json_array());
    push(p, text_json(v->text[l], v->text_len[l], l, n_bad));
    push(p, text_json(v->text[r], v->text_len[r], r, n_bad));
    return p;
}

/* ---- the export ---------------------------------------------------------------------------- */

/* WordPiece: undo llama.cpp's phantom-space conversion of BERT vocabularies. */
static char *wpm_text(const char *s, size_t n, size_t *out_n) {
    char *o = malloc(n + 3);
    if (!o) die("out of memory");
    if (n >= 3 && !memcmp(s, SPACE_MARK, 3)) {
        memcpy(o, s + 3, n - 3);
        *out_n = n - 3;
    } else if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        memcpy(o, s, n);
        *out_n = n;
    } else {
        o[0] = o[1] = '#';
        memcpy(o + 2, s, n);
        *out_n = n + 2;
    }
    o[*out_n] = '\0';
    return o;
}

static json_t *token_text(const kiln_vocab *v, int32_t id, int *n_bad) {
    if (v->type != KILN_VOCAB_WPM) return text_json(v->text[id], v->text_len[id], id, n_bad);
    size_t n;
    char *s = wpm_text(v->text[id], v->text_len[id], &n);
    json_t *j = text_json(s, n, id, n_bad);
    free(s);
    return j;
}

static json_t *special_entry(const kiln_vocab *v, int32_t id, int *n_bad) {
    json_t *e = must(json_object());
    set(e, "id", token_text(v, id, n_bad));
    json_t *ids = must(json_array());
    push(ids, json_integer(id));
    set(e, "ids", ids);
    json_t *toks = must(json_array());
    push(toks, token_text(v, id, n_bad));
    set(e, "tokens", toks);
    return e;
}

static json_t *template_post(const kiln_vocab *v, int32_t pre, int32_t suf, int *n_bad) {
    json_t *t = obj_type("TemplateProcessing");
    json_t *single = must(json_array()), *pair = must(json_array());
    json_t *specials = must(json_object());
    int32_t ends[2] = {pre, suf};
    for (int k = 0; k < 3; k++) {
        json_t *piece = must(json_object()), *inner = must(json_object());
        if (k == 1) {
            set(inner, "id", json_string("A"));
            set(inner, "type_id", json_integer(0));
            set(piece, "Sequence", inner);
        } else {
            int32_t id = ends[k / 2];
            if (id < 0) {
                json_decref(piece);
                json_decref(inner);
                continue;
            }
            set(inner, "id", token_text(v, id, n_bad));
            set(inner, "type_id", json_integer(0));
            set(piece, "SpecialToken", inner);
            json_t *name = token_text(v, id, n_bad);
            set(specials, json_string_value(name), special_entry(v, id, n_bad));
            json_decref(name);
        }
        push(single, json_deep_copy(piece));
        push(pair, piece);
    }
    set(t, "single", single);
    set(t, "pair", pair);
    set(t, "special_tokens", specials);
    return t;
}

int main(int argc, char **argv) {
    bool metaspace = false, strings = false;
    int ai = 1;
    for (; ai < argc && !strncmp(argv[ai], "--", 2); ai++) {
        if (!strcmp(argv[ai], "--spm=legacy"))
            metaspace = false;
        else if (!strcmp(argv[ai], "--spm=metaspace"))
            metaspace = true;
        else if (!strcmp(argv[ai], "--merges=pairs"))
            strings = false;
        else if (!strcmp(argv[ai], "--merges=strings"))
            strings = true;
        else
            die("unknown option (--spm=legacy|metaspace, --merges=pairs|strings)");
    }
    if (argc - ai != 2) {
        fprintf(stderr, "usage: kiln-export-tokenizer [--spm=legacy|metaspace] "
                        "[--merges=pairs|strings] IN.gguf OUTDIR\n");
        return 2;
    }
    const char *in = argv[ai], *outdir = argv[ai + 1];
    kiln_error err = {0};
    kiln_gguf *g = NULL;
    kiln_tokenizer *tok = NULL;
    if (kiln_gguf_open(in, &g, &err) != KILN_OK || kiln_tokenizer_from_gguf(g, &tok, &err))
        die(err.message);
    const kiln_vocab *v = kiln_tokenizer_vocab(tok);
    int n_bad = 0, n_dropped = 0;

    json_t *root = must(json_object());
    set(root, "version", json_string("1.0"));
    set(root, "truncation", json_null());
    set(root, "padding", json_null());

    /* added tokens */
    json_t *added = must(json_array());
    for (int32_t id = 0; id < v->n_tokens; id++) {
        int32_t ty = v->token_type[id];
        if (ty != KILN_TOKEN_CONTROL && ty != KILN_TOKEN_USER_DEFINED && ty != KILN_TOKEN_UNKNOWN)
            continue;
        json_t *a = must(json_object());
        set(a, "id", json_integer(id));
        set(a, "content", token_text(v, id, &n_bad));
        set(a, "single_word", json_false());
        set(a, "lstrip", json_boolean(tok->flags[id] & KILN_TOKF_LSTRIP));
        set(a, "rstrip", json_boolean(tok->flags[id] & KILN_TOKF_RSTRIP));
        set(a, "normalized", json_false());
        set(a, "special", json_boolean(ty != KILN_TOKEN_USER_DEFINED));
        push(added, a);
    }
    set(root, "added_tokens", added);

    /* model vocab */
    json_t *vocab = must(json_object());
    for (int32_t id = 0; id < v->n_tokens; id++) {
        json_t *k = token_text(v, id, &n_bad);
        if (json_object_get(vocab, json_string_value(k)))
            fprintf(stderr,
                    "kiln-export-tokenizer: warning: token %d '%s' repeats an earlier "
                    "token's text; the later id wins\n",
                    id, json_string_value(k));
        set(vocab, json_string_value(k), json_integer(id));
        json_decref(k);
    }
    json_t *model = must(json_object());
    json_t *merges = must(json_array());
    json_t *post = NULL, *decoder = NULL, *pretok = json_null(), *norm = json_null();
    const char *unk = v->unk_id >= 0 ? v->text[v->unk_id] : NULL;

    if (v->type == KILN_VOCAB_SPM) {
        set(model, "type", json_string("BPE"));
        set(model, "dropout", json_null());
        set(model, "unk_token", unk ? json_string(unk) : json_null());
        set(model, "continuing_subword_prefix", json_null());
        set(model, "end_of_word_suffix", json_null());
        set(model, "fuse_unk", json_true());
        set(model, "byte_fallback", json_true());
        set(model, "ignore_merges", json_false());
        set(model, "vocab", vocab);
        size_t nm = 0;
        cand *c = spm_merges(v, &nm);
        for (size_t i = 0; i < nm; i++)
            push(merges, merge_json(v, c[i].l, c[i].r, strings, &n_bad));
        free(c);
        set(model, "merges", merges);
        json_t *dseq = must(json_array());
        if (metaspace) {
            json_t *ms = obj_type("Metaspace");
            set(ms, "replacement", json_string(SPACE_MARK));
            set(ms, "prepend_scheme", json_string(v->add_space_prefix ? "first" : "never"));
            set(ms, "split", json_false());
            pretok = json_deep_copy(ms);
            push(dseq, obj_type("ByteFallback"));
            push(dseq, ms);
        } else {
            json_t *nseq = must(json_array());
            if (v->add_space_prefix) {
                json_t *p = obj_type("Prepend");
                set(p, "prepend", json_string(SPACE_MARK));
                push(nseq, p);
            }
            push(nseq, replace("Replace", " ", SPACE_MARK));
            norm = obj_type("Sequence");
            set(norm, "normalizers", nseq);
            push(dseq, replace("Replace", SPACE_MARK, " "));
            push(dseq, obj_type("ByteFallback"));
            push(dseq, obj_type("Fuse"));
            if (v->add_space_prefix) {
                json_t *s = obj_type("Strip");
                set(s, "content", json_string(" "));
                set(s, "start", json_integer(1));
                set(s, "stop", json_integer(0));
                push(dseq, s);
            }
        }
        decoder = obj_type("Sequence");
        set(decoder, "decoders", dseq);
        post = template_post(v, v->add_bos ? v->bos_id : -1, v->add_eos ? v->eos_id : -1, &n_bad);
    } else if (v->type == KILN_VOCAB_BPE) {
        kiln_pretok *pt = NULL;
        if (kiln_pretok_create(v->pre, &pt, &err)) die(err.message);
        set(model, "type", json_string("BPE"));
        set(model, "dropout", json_null());
        set(model, "unk_token", json_null());
        set(model, "continuing_subword_prefix", json_null());
        set(model, "end_of_word_suffix", json_null());
        set(model, "fuse_unk", json_false());
        set(model, "byte_fallback", json_false());
        set(model, "ignore_merges", json_boolean(kiln_pretok_ignore_merges(pt)));
        set(model, "vocab", vocab);
        for (int32_t i = 0; i < v->n_merges; i++) {
            const char *m = v->merges[i];
            size_t ml = strlen(m);
            const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
            int32_t l = sp ? kiln_vocab_find(v, m, (size_t)(sp - m)) : -1;
            int32_t r = sp ? kiln_vocab_find(v, sp + 1, ml - (size_t)(sp - m) - 1) : -1;
            char *cat = malloc(ml + 1);
            if (!cat) die("out of memory");
            size_t cl = 0;
            if (sp) {
                memcpy(cat, m, (size_t)(sp - m));
                memcpy(cat + (sp - m), sp + 1, ml - (size_t)(sp - m) - 1);
                cl = ml - 1;
            }
            bool ok = l >= 0 && r >= 0 && kiln_vocab_find(v, cat, cl) >= 0;
            free(cat);
            if (!ok) { /* tokenizers refuses merges whose parts or result are not tokens */
                n_dropped++;
                continue;
            }
            push(merges, merge_json(v, l, r, strings, &n_bad));
        }
        set(model, "merges", merges);
        int nrx = 0;
        const char *const *rx = kiln_pretok_regexes(pt, &nrx);
        json_t *seq = must(json_array());
        for (int i = 0; i < nrx; i++) {
            json_t *s = obj_type("Split");
            set(s, "pattern", pattern("Regex", rx[i]));
            set(s, "behavior", json_string("Isolated"));
            set(s, "invert", json_false());
            push(seq, s);
        }
        json_t *bl = obj_type("ByteLevel");
        set(bl, "add_prefix_space", json_false());
        set(bl, "trim_offsets", json_true());
        set(bl, "use_regex", json_false());
        push(seq, bl);
        pretok = obj_type("Sequence");
        set(pretok, "pretokenizers", seq);
        kiln_pretok_destroy(pt);
        decoder = obj_type("ByteLevel");
        set(decoder, "add_prefix_space", json_true());
        set(decoder, "trim_offsets", json_true());
        set(decoder, "use_regex", json_true());
        json_t *pseq = must(json_array());
        json_t *bpost = obj_type("ByteLevel");
        set(bpost, "add_prefix_space", json_true());
        set(bpost, "trim_offsets", json_false());
        set(bpost, "use_regex", json_true());
        push(pseq, bpost);
        push(pseq,
             template_post(v, v->add_bos ? v->bos_id : -1, v->add_eos ? v->eos_id : -1, &n_bad));
        post = obj_type("Sequence");
        set(post, "processors", pseq);
    } else if (v->type == KILN_VOCAB_WPM) {
        set(model, "type", json_string("WordPiece"));
        set(model, "unk_token",
            v->unk_id >= 0 ? token_text(v, v->unk_id, &n_bad) : json_string("[UNK]"));
        set(model, "continuing_subword_prefix", json_string("##"));
        set(model, "max_input_chars_per_word", json_integer(100));
        set(model, "vocab", vocab);
        json_decref(merges);
        norm = obj_type("BertNormalizer");
        set(norm, "clean_text", json_true());
        set(norm, "handle_chinese_chars", json_true());
        set(norm, "strip_accents", json_null());
        set(norm, "lowercase", json_true());
        pretok = obj_type("BertPreTokenizer");
        decoder = obj_type("WordPiece");
        set(decoder, "prefix", json_string("##"));
        set(decoder, "cleanup", json_true());
        post = template_post(v, v->cls_id >= 0 ? v->cls_id : v->bos_id, v->sep_id, &n_bad);
    } else {
        die("unsupported vocabulary type");
    }
    set(root, "normalizer", norm);
    set(root, "pre_tokenizer", pretok);
    set(root, "model", model);
    set(root, "post_processor", post);
    set(root, "decoder", decoder);

    /* tokenizer_config.json */
    json_t *cfg = must(json_object());
    set(cfg, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    if (v->type != KILN_VOCAB_WPM) {
        set(cfg, "bos_token", v->bos_id >= 0 ? token_text(v, v->bos_id, &n_bad) : json_null());
        set(cfg, "eos_token", v->eos_id >= 0 ? token_text(v, v->eos_id, &n_bad) : json_null());
        set(cfg, "add_bos_token", json_boolean(v->add_bos && v->bos_id >= 0));
        set(cfg, "add_eos_token", json_boolean(v->add_eos && v->eos_id >= 0));
    } else {
        if (v->cls_id >= 0) set(cfg, "cls_token", token_text(v, v->cls_id, &n_bad));
        if (v->sep_id >= 0) set(cfg, "sep_token", token_text(v, v->sep_id, &n_bad));
    }
    if (v->unk_id >= 0) set(cfg, "unk_token", token_text(v, v->unk_id, &n_bad));
    if (v->pad_id >= 0) set(cfg, "pad_token", token_text(v, v->pad_id, &n_bad));
    const char *tmpl = kiln_tokenizer_chat_template(tok);
    if (tmpl && kiln_utf8_valid(tmpl, strlen(tmpl), NULL))
        set(cfg, "chat_template", json_string(tmpl));

    mkdir(outdir, 0777); /* may exist */
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", outdir);
    if (json_dump_file(root, path, JSON_COMPACT)) die("cannot write tokenizer.json");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", outdir);
    if (json_dump_file(cfg, path, JSON_INDENT(2))) die("cannot write tokenizer_config.json");
    if (n_bad)
        fprintf(stderr,
                "kiln-export-tokenizer: %d token texts are not valid UTF-8 (written as "
                "placeholders)\n",
                n_bad);
    if (n_dropped)
        fprintf(stderr,
                "kiln-export-tokenizer: %d merges dropped (a part or the result is not a "
                "token)\n",
                n_dropped);
    json_decref(root);
    json_decref(cfg);
    kiln_tokenizer_destroy(tok);
    kiln_gguf_close(g);
    return 0;
}
