/*
 * test_bpe_conformance - llama.cpp's tokenizer conformance suite (../shared/tokenizer,
 * ggml-vocab-<name>.gguf + .inp/.out) for the byte-level BPE vocabs. Each .inp string is
 * tokenized with add_special = false, parse_special = false and must give exactly the ids of
 * the matching .out line.
 *
 * .inp: strings, each followed by "\n__ggml_vocab_test__\n". .out: one line of
 * space-separated ids per string.
 *
 * Until the full tokenizer (kiln_tokenizer_from_gguf) is available this runner builds the
 * kiln_vocab itself and splits out USER_DEFINED token texts first, as llama.cpp's
 * tokenizer_st_partition does even when parse_special is false (longest texts first), then
 * byte-level-BPE-encodes the raw fragments with kiln_bpe_encode.
 */
#include <stdlib.h>

#include "format/gguf.h"
#include "test.h"
#include "tokenizer/bpe.h"
#include "tokenizer/vocab.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b);
    REQUIRE(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    REQUIRE(d);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static bool load_vocab(const char *path, kiln_vocab *v) {
    kiln_gguf *g = NULL;
    kiln_error err = {0};
    if (kiln_gguf_open(path, &g, &err) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", path, err.message);
        return false;
    }
    memset(v, 0, sizeof *v);
    v->type = KILN_VOCAB_BPE;
    const kiln_gguf_value *toks = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens");
    const kiln_gguf_value *types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type");
    const kiln_gguf_value *merges = kiln_gguf_get_arr(g, "tokenizer.ggml.merges");
    const kiln_gguf_str *pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    REQUIRE(toks && toks->arr.elem_type == KILN_GGUF_STRING);
    REQUIRE(merges && merges->arr.elem_type == KILN_GGUF_STRING);
    v->n_tokens = (int32_t)toks->arr.n;
    v->text = calloc((size_t)v->n_tokens, sizeof *v->text);
    v->text_len = calloc((size_t)v->n_tokens, sizeof *v->text_len);
    v->token_type = calloc((size_t)v->n_tokens, sizeof *v->token_type);
    REQUIRE(v->text && v->text_len && v->token_type);
    const kiln_gguf_str *ts = toks->arr.data;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        v->text[i] = dupn(ts[i].data, ts[i].len);
        v->text_len[i] = (uint32_t)ts[i].len;
        v->token_type[i] = KILN_TOKEN_NORMAL;
        if (types && types->arr.elem_type == KILN_GGUF_INT32 && (size_t)i < types->arr.n)
            v->token_type[i] = ((const int32_t *)types->arr.data)[i];
    }
    v->n_merges = (int32_t)merges->arr.n;
    v->merges = calloc((size_t)v->n_merges, sizeof *v->merges);
    REQUIRE(v->merges);
    const kiln_gguf_str *ms = merges->arr.data;
    for (int32_t i = 0; i < v->n_merges; i++) v->merges[i] = dupn(ms[i].data, ms[i].len);
    v->pre = pre ? dupn(pre->data, pre->len) : NULL;
    kiln_gguf_close(g);
    REQUIRE(kiln_vocab_build_index(v, &err) == KILN_OK);
    if (kiln_bpe_init(v, &err) != KILN_OK) {
        fprintf(stderr, "%s: bpe init: %s\n", path, err.message);
        return false;
    }
    return true;
}

/* USER_DEFINED ids sorted by text length, longest first. */
static const kiln_vocab *sort_vocab;
static int by_len_desc(const void *a, const void *b) {
    uint32_t la = sort_vocab->text_len[*(const int32_t *)a];
    uint32_t lb = sort_vocab->text_len[*(const int32_t *)b];
    return la < lb ? 1 : la > lb ? -1 : 0;
}

typedef struct frag {
    size_t off, len;
    int32_t id; /* -1 = raw text */
} frag;

static void encode(const kiln_vocab *v, const int32_t *ud, size_t n_ud, const char *text,
                   size_t len, kiln_ivec *out) {
    frag *fr = malloc((len + 1) * 2 * sizeof *fr + sizeof *fr);
    REQUIRE(fr);
    size_t nf = 0;
    if (len) fr[nf++] = (frag){0, len, -1};
    for (size_t k = 0; k < n_ud; k++) {
        const char *t = v->text[ud[k]];
        size_t tl = v->text_len[ud[k]];
        if (tl == 0) continue;
        for (size_t f = 0; f < nf; f++) {
            if (fr[f].id >= 0 || fr[f].len < tl) continue;
            const char *base = text + fr[f].off;
            const char *hit = NULL;
            for (size_t i = 0; i + tl <= fr[f].len; i++)
                if (memcmp(base + i, t, tl) == 0) {
                    hit = base + i;
                    break;
                }
            if (!hit) continue;
            size_t pre = (size_t)(hit - base), post = fr[f].len - pre - tl;
            /* replace fr[f] by [pre raw][token][post raw] */
            frag repl[3];
            int nr = 0;
            if (pre) repl[nr++] = (frag){fr[f].off, pre, -1};
            repl[nr++] = (frag){fr[f].off + pre, tl, ud[k]};
            if (post) repl[nr++] = (frag){fr[f].off + pre + tl, post, -1};
            memmove(fr + f + nr, fr + f + 1, (nf - f - 1) * sizeof *fr);
            memcpy(fr + f, repl, (size_t)nr * sizeof *fr);
            nf += (size_t)nr - 1;
            /* continue scanning after the token (the post fragment comes next) */
            f += (size_t)(pre ? 1 : 0);
        }
    }
    for (size_t f = 0; f < nf; f++) {
        if (fr[f].id >= 0) {
            REQUIRE(kiln_ivec_push(out, fr[f].id) == KILN_OK);
        } else {
            kiln_error err = {0};
            kiln_status st = kiln_bpe_encode(v, text + fr[f].off, fr[f].len, out, &err);
            CHECKF(st == KILN_OK, "encode: %s", err.message);
        }
    }
    free(fr);
}

static void run_vocab(const char *name, int *n_pass, int *n_fail) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    const char *gguf = kiln_test_shared(rel);
    char inp[4200], outp[4200];
    snprintf(inp, sizeof inp, "%s.inp", gguf);
    snprintf(outp, sizeof outp, "%s.out", gguf);
    if (access(gguf, R_OK) != 0 || access(inp, R_OK) != 0) {
        printf("%-16s SKIP (no vocab or .inp)\n", name);
        return;
    }
    kiln_vocab v;
    if (!load_vocab(gguf, &v)) {
        CHECKF(0, "%s: cannot load", name);
        return;
    }
    int32_t *ud = malloc((size_t)v.n_tokens * sizeof *ud);
    REQUIRE(ud);
    size_t n_ud = 0;
    for (int32_t i = 0; i < v.n_tokens; i++)
        if (v.token_type[i] == KILN_TOKEN_USER_DEFINED) ud[n_ud++] = i;
    sort_vocab = &v;
    qsort(ud, n_ud, sizeof *ud, by_len_desc);

    size_t ilen, olen;
    char *in = read_all(inp, &ilen), *out = read_all(outp, &olen);
    REQUIRE(in && out);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t seplen = sizeof sep - 1;
    char *ip = in, *op = out;
    int pass = 0, fail = 0, idx = 0;
    for (;;) {
        char *end = strstr(ip, sep);
        if (!end) break;
        char *eol = strchr(op, '\n');
        REQUIRE(eol);
        kiln_ivec got = {0};
        encode(&v, ud, n_ud, ip, (size_t)(end - ip), &got);
        /* parse the expected ids */
        bool ok = true;
        size_t k = 0;
        char *p = op;
        while (p < eol) {
            char *q;
            long id = strtol(p, &q, 10);
            if (q == p) break;
            if (k >= got.n || got.data[k] != id) ok = false;
            k++;
            p = q;
        }
        if (k != got.n) ok = false;
        if (ok) {
            pass++;
        } else {
            fail++;
            fprintf(stderr, "%s case %d '%.*s'\n  want:%.*s\n  got: ", name, idx, (int)(end - ip),
                    ip, (int)(eol - op), op);
            for (size_t i = 0; i < got.n; i++) fprintf(stderr, " %d", got.data[i]);
            fprintf(stderr, "\n");
        }
        kiln_ivec_free(&got);
        ip = end + seplen;
        op = eol + 1;
        idx++;
    }
    printf("%-16s %d/%d cases match\n", name, pass, pass + fail);
    CHECKF(fail == 0 && pass > 0, "%s: %d failing cases", name, fail);
    *n_pass += pass;
    *n_fail += fail;
    free(in);
    free(out);
    free(ud);
    kiln_vocab_free(&v);
}

int main(int argc, char **argv) {
    static const char *vocabs[] = {"gpt-2",  "falcon",         "mpt",          "starcoder",
                                   "refact", "deepseek-coder", "deepseek-llm", "gpt-neox"};
    int pass = 0, fail = 0;
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        if (argc > 1 && strcmp(argv[1], vocabs[i]) != 0) continue;
        run_vocab(vocabs[i], &pass, &fail);
    }
    if (pass + fail == 0) {
        printf("SKIP: no BPE vocab with test data found\n");
        return 77;
    }
    printf("total: %d/%d\n", pass, pass + fail);
    return kiln_test_finish("test_bpe_conformance");
}
