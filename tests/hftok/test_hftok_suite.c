/*
 * test_hftok_suite <vocab> <kiln-export-tokenizer> [export options...]
 *
 * llama.cpp's tokenizer conformance suite (../shared/tokenizer/ggml-vocab-<vocab>.gguf with
 * .gguf.inp / .gguf.out, see test_tokenizer_conformance.c) through two paths:
 *   1. the GGUF vocabulary (kiln_tokenizer_from_gguf);
 *   2. the same vocabulary exported by kiln-export-tokenizer to tokenizer.json +
 *      tokenizer_config.json in a temporary directory, loaded with kiln_tokenizer_from_hf_dir.
 * Every string must give exactly the expected ids through both (add_special = false,
 * parse_special = false). For the tokenizer.json path the incremental detokenizer must also
 * give the input back for lossless vocabularies (byte fallback, byte-level), and add_special
 * must add the same ids as the GGUF path.
 * Vocabs without .inp/.out (baichuan, gpt-neox) are cross-checked instead: the two paths must
 * agree on the suite's strings (taken from the llama-spm .inp) and round-trip them.
 *
 * With --spm=metaspace the SPM vocabulary is exported with a Metaspace pre-tokenizer
 * (prepend_scheme "first") instead of the Prepend normalizer. HF's Metaspace does not prepend
 * "▁" to text that already starts with a space (so " Hello" becomes "▁Hello", where
 * SentencePiece and the Prepend form give "▁▁Hello"), so for such strings the reference is the
 * GGUF path's ids for the string without its first space; and its decoder drops every "▁" of
 * the first token, so those strings are not round-tripped.
 * Round trips skip strings that contain non-special added tokens: HF decodes those through the
 * decoder too (deepseek's "ü" token is a byte-level character and decodes to byte 0xFC).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/gguf.h"
#include "test.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    REQUIRE(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    REQUIRE(n >= 0);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b != NULL);
    REQUIRE(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 48; i++) fprintf(stderr, " %d", ids[i]);
    if (n > 48) fprintf(stderr, " ... (%zu ids)", n);
    fputc('\n', stderr);
}

static bool same(const kiln_ivec *a, const kiln_ivec *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->data, b->data, a->n * sizeof(int32_t)));
}

/* Run the export tool; true on exit status 0. */
static bool run_tool(char **argv) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Detokenize ids with the incremental detokenizer into out (malloc'd); returns its length. */
static size_t detok_all(const kiln_tokenizer *t, const kiln_ivec *ids, char **out) {
    kiln_error err = {0};
    kiln_detok *d = NULL;
    REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    REQUIRE(buf);
    const char *s;
    size_t sl;
    for (size_t k = 0; k <= ids->n; k++) {
        if (k < ids->n)
            REQUIRE(kiln_detok_push(d, ids->data[k], &s, &sl, &err) == KILN_OK);
        else
            REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
        while (n + sl + 1 > cap) REQUIRE((buf = realloc(buf, cap *= 2)) != NULL);
        memcpy(buf + n, s, sl);
        n += sl;
    }
    kiln_detok_destroy(d);
    *out = buf;
    return n;
}

/*
 * True for a non-special added token whose text the decoder changes: with a ByteLevel decoder
 * one made only of byte-alphabet characters, not all ASCII (deepseek's "ü" decodes to byte
 * 0xFC); with a Metaspace/Replace decoder one containing "▁".
 */
static bool decoder_changes_added(const kiln_tokenizer *t, int32_t id) {
    const kiln_vocab *v = kiln_tokenizer_vocab(t);
    if (v->token_type[id] != KILN_TOKEN_USER_DEFINED) return false;
    const char *s = v->text[id];
    size_t n = v->text_len[id];
    if (v->type != KILN_VOCAB_BPE) return memmem(s, n, "\xE2\x96\x81", 3) != NULL;
    bool all = true, ascii = true;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp = c;
        size_t l = 1;
        if (c >= 0xC0 && c < 0xE0 && i + 1 < n) {
            cp = ((uint32_t)(c & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
            l = 2;
        } else if (c >= 0x80) {
            cp = 0x110000; /* 3-4 byte characters are outside the alphabet */
            l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 1;
        }
        all &= kiln_bytelevel_byte(cp) >= 0;
        ascii &= cp < 0x80;
        i += l;
    }
    return all && !ascii;
}

/* Split the .inp text into strings (each followed by the separator line). */
typedef struct cases {
    const char **s;
    size_t *len;
    size_t n;
} cases;

static cases split_inp(const char *inp, size_t inp_len) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    cases c = {0};
    size_t cap = 64;
    c.s = malloc(cap * sizeof *c.s);
    c.len = malloc(cap * sizeof *c.len);
    REQUIRE(c.s && c.len);
    for (size_t ip = 0; ip < inp_len;) {
        const char *m = memmem(inp + ip, inp_len - ip, sep, sizeof sep - 1);
        REQUIRE(m != NULL);
        if (c.n == cap) {
            cap *= 2;
            REQUIRE((c.s = realloc(c.s, cap * sizeof *c.s)) != NULL);
            REQUIRE((c.len = realloc(c.len, cap * sizeof *c.len)) != NULL);
        }
        c.s[c.n] = inp + ip;
        c.len[c.n] = (size_t)(m - (inp + ip));
        ip += c.len[c.n] + sizeof sep - 1;
        c.n++;
    }
    return c;
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 3);
    const char *name = argv[1], *tool = argv[2];
    bool metaspace = false;
    for (int i = 3; i < argc; i++) metaspace |= !strcmp(argv[i], "--spm=metaspace");
    char rel[256], gguf[4096], inp_path[4200], out_path[4200];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    snprintf(gguf, sizeof gguf, "%s", kiln_test_shared(rel));
    kiln_test_require_file(gguf);
    snprintf(inp_path, sizeof inp_path, "%s.inp", gguf);
    snprintf(out_path, sizeof out_path, "%s.out", gguf);
    bool conformance = access(inp_path, R_OK) == 0 && access(out_path, R_OK) == 0;
    if (!conformance) {
        snprintf(inp_path, sizeof inp_path, "%s",
                 kiln_test_shared("tokenizer/ggml-vocab-llama-spm.gguf.inp"));
        kiln_test_require_file(inp_path);
        printf("%s: no reference ids; cross-checking the two paths on %s\n", name, inp_path);
    }

    /* export */
    char dir[] = "/tmp/kiln-hftok-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char *targv[16];
    int ta = 0;
    targv[ta++] = (char *)tool;
    for (int i = 3; i < argc && ta < 13; i++) targv[ta++] = argv[i];
    targv[ta++] = gguf;
    targv[ta++] = dir;
    targv[ta] = NULL;
    bool exported = run_tool(targv);
    CHECKF(exported, "%s: kiln-export-tokenizer failed", name);

    kiln_error err = {0};
    kiln_gguf *g = NULL;
    REQUIRE(kiln_gguf_open(gguf, &g, &err) == KILN_OK);
    kiln_tokenizer *tg = NULL, *th = NULL;
    REQUIRE(kiln_tokenizer_from_gguf(g, &tg, &err) == KILN_OK);
    kiln_status st = exported ? kiln_tokenizer_from_hf_dir(dir, &th, &err) : KILN_ERR_IO;
    CHECKF(st == KILN_OK, "%s: tokenizer.json: %s (%s)", name, kiln_status_name(st), err.message);

    /* clean up the temporary directory right away */
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    CHECK(rmdir(dir) == 0);
    if (!th) {
        kiln_tokenizer_destroy(tg);
        kiln_gguf_close(g);
        return kiln_test_finish(name);
    }
    CHECK(kiln_tokenizer_n_vocab(th) == kiln_tokenizer_n_vocab(tg));
    CHECK(kiln_tokenizer_bos(th) == kiln_tokenizer_bos(tg) ||
          kiln_tokenizer_vocab(tg)->type == KILN_VOCAB_WPM);
    CHECK(kiln_tokenizer_eos(th) == kiln_tokenizer_eos(tg) ||
          kiln_tokenizer_vocab(tg)->type == KILN_VOCAB_WPM);

    size_t inp_len, out_len = 0;
    char *inp = slurp(inp_path, &inp_len);
    char *outs = conformance ? slurp(out_path, &out_len) : NULL;
    cases cs = split_inp(inp, inp_len);
    bool lossless = kiln_tokenizer_vocab(tg)->type != KILN_VOCAB_WPM;

    int n_gguf = 0, n_hf = 0, n_rt = 0, n_rt_cases = 0, n_special = 0;
    size_t op = 0;
    kiln_ivec want = {0}, ig = {0}, ih = {0};
    for (size_t c = 0; c < cs.n; c++) {
        const char *s = cs.s[c];
        size_t slen = cs.len[c];
        if (conformance) {
            REQUIRE(op <= out_len);
            const char *nl = memchr(outs + op, '\n', out_len - op);
            size_t llen = nl ? (size_t)(nl - (outs + op)) : out_len - op;
            want.n = 0;
            for (size_t k = op; k < op + llen;) {
                char *end;
                long x = strtol(outs + k, &end, 10);
                if (end == outs + k) {
                    k++;
                    continue;
                }
                REQUIRE(kiln_ivec_push(&want, (int32_t)x) == KILN_OK);
                k = (size_t)(end - outs);
            }
            op += llen + 1;
        }
        /* Metaspace: " X" encodes as SentencePiece encodes "X" */
        bool ms_space = metaspace && slen > 0 && s[0] == ' ';
        const char *gs = ms_space ? s + 1 : s;
        size_t gl = ms_space ? slen - 1 : slen;
        ig.n = ih.n = 0;
        kiln_status sg = kiln_tokenizer_encode(tg, gs, gl, false, false, &ig, &err);
        REQUIRE(sg == KILN_OK);
        if (ms_space && gl == 0) { /* " " alone: Metaspace gives the piece "▁" */
            int32_t sp = kiln_vocab_find(kiln_tokenizer_vocab(tg), "\xE2\x96\x81", 3);
            REQUIRE(sp >= 0 && kiln_ivec_push(&ig, sp) == KILN_OK);
        }
        kiln_status sh = kiln_tokenizer_encode(th, s, slen, false, false, &ih, &err);
        CHECKF(sh == KILN_OK, "%s: case %zu: %s", name, c + 1, err.message);
        const kiln_ivec *ref = conformance && !ms_space ? &want : &ig;
        bool okg = !conformance || ms_space || same(&ig, &want);
        bool okh = sh == KILN_OK && same(&ih, ref);
        n_gguf += okg;
        n_hf += okh;
        if (!okg || !okh) {
            fprintf(stderr, "%s: case %zu (%zu bytes) \"%.*s\":%s%s\n", name, c + 1, slen,
                    (int)(slen > 60 ? 60 : slen), s, okg ? "" : " GGUF path differs",
                    okh ? "" : " tokenizer.json path differs");
            print_ids(conformance ? "expected" : "gguf    ", ref->data, ref->n);
            if (!okg) print_ids("gguf    ", ig.data, ig.n);
            if (!okh) print_ids("json    ", ih.data, ih.n);
        }
        CHECK(okg);
        CHECK(okh);
        bool user_tokens = false;
        for (size_t k = 0; k < ih.n; k++) user_tokens |= decoder_changes_added(th, ih.data[k]);
        if (lossless && sh == KILN_OK && !ms_space && !user_tokens) {
            char *text = NULL;
            size_t tn = detok_all(th, &ih, &text);
            bool rt = tn == slen && !memcmp(text, s, slen);
            n_rt += rt;
            n_rt_cases++;
            CHECKF(rt, "%s: case %zu: tokenizer.json decode gives \"%.*s\" for \"%.*s\"", name,
                   c + 1, (int)(tn > 60 ? 60 : tn), text, (int)(slen > 60 ? 60 : slen), s);
            free(text);
        }
        /* add_special: both paths add the same BOS/EOS (or CLS/SEP) */
        ig.n = ih.n = 0;
        REQUIRE(kiln_tokenizer_encode(tg, gs, gl, true, false, &ig, &err) == KILN_OK);
        if (ms_space && gl == 0) {
            int32_t sp = kiln_vocab_find(kiln_tokenizer_vocab(tg), "\xE2\x96\x81", 3);
            kiln_ivec t2 = {0};
            for (size_t k = 0; k < ig.n; k++) {
                if (k + 1 == ig.n && ig.data[k] == kiln_tokenizer_eos(tg) &&
                    kiln_tokenizer_vocab(tg)->add_eos)
                    REQUIRE(kiln_ivec_push(&t2, sp) == KILN_OK);
                REQUIRE(kiln_ivec_push(&t2, ig.data[k]) == KILN_OK);
            }
            if (!(ig.n && ig.data[ig.n - 1] == kiln_tokenizer_eos(tg) &&
                  kiln_tokenizer_vocab(tg)->add_eos))
                REQUIRE(kiln_ivec_push(&t2, sp) == KILN_OK);
            kiln_ivec_free(&ig);
            ig = t2;
        }
        sh = kiln_tokenizer_encode(th, s, slen, true, false, &ih, &err);
        bool oks = sh == KILN_OK && same(&ig, &ih);
        n_special += oks;
        if (!oks) {
            fprintf(stderr, "%s: case %zu add_special differs\n", name, c + 1);
            print_ids("gguf    ", ig.data, ig.n);
            print_ids("json    ", ih.data, ih.n);
        }
        CHECK(oks);
    }
    printf("%s: %zu strings: GGUF path %d/%zu%s, tokenizer.json path %d/%zu, round trip %d/%d, "
           "add_special %d/%zu\n",
           name, cs.n, n_gguf, cs.n, conformance ? "" : " (not checked)", n_hf, cs.n, n_rt,
           n_rt_cases, n_special, cs.n);
    CHECK(cs.n > 0);
    kiln_ivec_free(&want);
    kiln_ivec_free(&ig);
    kiln_ivec_free(&ih);
    free(cs.s);
    free(cs.len);
    free(inp);
    free(outs);
    kiln_tokenizer_destroy(th);
    kiln_tokenizer_destroy(tg);
    kiln_gguf_close(g);
    return kiln_test_finish(name);
}
