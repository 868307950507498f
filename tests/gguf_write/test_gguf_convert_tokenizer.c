/*
 * test_gguf_convert_tokenizer - `kiln convert` carries a Hugging Face tokenizer.json into the
 * GGUF's tokenizer metadata (issue 14, Acceptance "Quality against llama.cpp": "That command
 * must now carry the HF tokenizer.json into the GGUF's tokenizer metadata").
 *
 * On ../shared/models/pycode10M (byte-level BPE, GPT-2 pre-tokenization, eos <|endoftext|> = 0,
 * no BOS, a ChatML chat_template in tokenizer_config.json):
 *   - the GGUF's tokenizer keys are checked against tokenizer.json / tokenizer_config.json read
 *     here with jansson (model "gpt2", pre "gpt-2", every token text and id, the token types
 *     of the added tokens, every merge in rank order, eos id, no bos id, add_bos false,
 *     chat_template byte for byte);
 *   - kiln's tokenizer read from the GGUF encodes the whole of valid.txt (200 kB of held-out
 *     Python) to the same ids as kiln's tokenizer read from tokenizer.json, with and without
 *     special-token parsing, and decodes them back to the text.
 * Refusals, each naming its reason: a WordPiece model, a SentencePiece-style BPE (byte_fallback),
 * an unknown Split regex, a tokenizer.json that is not a tokenizer ("{}"); --no-tokenizer then
 * converts without tokenizer keys, --vocab with --no-tokenizer is a usage error.
 */
#include <jansson.h>
#include <sys/stat.h>

#include "format/safetensors_write.h"
#include "gw_util.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void check_keys(const char *dir, const kiln_gguf *g) {
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    json_t *tj = json_load_file(p, 0, NULL);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    json_t *cj = json_load_file(p, 0, NULL);
    REQUIRE(tj && cj);
    const kiln_gguf_str *s = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    CHECK(s && !strcmp(s->data, "gpt2"));
    s = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    CHECK(s && !strcmp(s->data, "gpt-2"));
    const kiln_gguf_value *toks = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens");
    const kiln_gguf_value *types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type");
    const kiln_gguf_value *merges = kiln_gguf_get_arr(g, "tokenizer.ggml.merges");
    REQUIRE(toks && types && merges && toks->arr.elem_type == KILN_GGUF_STRING &&
            types->arr.elem_type == KILN_GGUF_INT32 && merges->arr.elem_type == KILN_GGUF_STRING);
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    CHECK(toks->arr.n == 8192 && types->arr.n == 8192 && json_object_size(vocab) == 8192);
    const kiln_gguf_str *ts = toks->arr.data;
    const int32_t *ty = types->arr.data;
    const char *k;
    json_t *jv;
    size_t bad = 0;
    json_object_foreach(vocab, k, jv) {
        json_int_t id = json_integer_value(jv);
        if (id < 0 || id >= 8192 || strcmp(ts[id].data, k) != 0) bad++;
    }
    CHECKF(bad == 0, "%zu token texts differ from tokenizer.json", bad);
    json_t *added = json_object_get(tj, "added_tokens");
    size_t ai;
    json_t *a;
    bool is_added[8192] = {0};
    json_array_foreach(added, ai, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        REQUIRE(id >= 0 && id < 8192);
        is_added[id] = true;
        int32_t want = json_is_true(json_object_get(a, "special")) ? 3 : 4;
        CHECKF(ty[id] == want, "token %lld type %d, want %d", (long long)id, ty[id], want);
    }
    for (int i = 0; i < 8192; i++)
        if (!is_added[i]) CHECKF(ty[i] == 1, "token %d type %d, want 1 (normal)", i, ty[i]);
    json_t *jm = json_object_get(json_object_get(tj, "model"), "merges");
    CHECK(merges->arr.n == json_array_size(jm));
    const kiln_gguf_str *ms = merges->arr.data;
    bad = 0;
    for (size_t i = 0; i < merges->arr.n && i < json_array_size(jm); i++) {
        json_t *e = json_array_get(jm, i);
        char want[512];
        if (json_is_array(e))
            snprintf(want, sizeof want, "%s %s", json_string_value(json_array_get(e, 0)),
                     json_string_value(json_array_get(e, 1)));
        else
            snprintf(want, sizeof want, "%s", json_string_value(e));
        if (strcmp(ms[i].data, want) != 0) bad++;
    }
    CHECKF(bad == 0, "%zu merges differ", bad);
    /* eos_token "<|endoftext|>" -> its id; bos_token null -> no key, add_bos false */
    const char *eos = json_string_value(json_object_get(cj, "eos_token"));
    REQUIRE(eos);
    uint32_t u = 0;
    CHECK(kiln_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) &&
          u == (uint32_t)json_integer_value(json_object_get(vocab, eos)));
    CHECK(json_is_null(json_object_get(cj, "bos_token")) &&
          !kiln_gguf_find(g, "tokenizer.ggml.bos_token_id"));
    bool b = true;
    CHECK(kiln_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && !b);
    CHECK(kiln_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) && !b);
    s = kiln_gguf_get_str(g, "tokenizer.chat_template");
    const char *tmpl = json_string_value(json_object_get(cj, "chat_template"));
    CHECK(s && tmpl && !strcmp(s->data, tmpl));
    json_decref(tj);
    json_decref(cj);
}

static void check_encode(const char *dir, const kiln_gguf *g) {
    size_t len = 0;
    char p[1024];
    snprintf(p, sizeof p, "%s/valid.txt", dir);
    char *text = read_all(p, &len);
    REQUIRE(text);
    kiln_error e = {0};
    kiln_tokenizer *th = NULL, *tg = NULL;
    REQUIRE(kiln_tokenizer_from_hf_dir(dir, &th, &e) == KILN_OK);
    REQUIRE(kiln_tokenizer_from_gguf(g, &tg, &e) == KILN_OK);
    for (int pass = 0; pass < 2; pass++) {
        bool sp = pass == 1;
        kiln_ivec a = {0}, b = {0};
        REQUIRE(kiln_tokenizer_encode(th, text, len, sp, sp, &a, &e) == KILN_OK);
        REQUIRE(kiln_tokenizer_encode(tg, text, len, sp, sp, &b, &e) == KILN_OK);
        size_t i = 0;
        while (i < a.n && i < b.n && a.data[i] == b.data[i]) i++;
        CHECKF(a.n == b.n && i == a.n,
               "valid.txt (%s specials): %zu ids from tokenizer.json, %zu from the GGUF, first "
               "difference at %zu",
               sp ? "with" : "without", a.n, b.n, i);
        CHECK(a.n > 40000); /* 200 kB of Python at ~3.6 bytes per token */
        if (pass == 0) {
            /* the GGUF's tokenizer decodes back to the text */
            kiln_detok *d = NULL;
            REQUIRE(kiln_detok_create(tg, &d, &e) == KILN_OK);
            char *out = malloc(len + 64);
            size_t o = 0;
            bool fits = true;
            for (size_t j = 0; j < b.n; j++) {
                const char *piece;
                size_t pl;
                REQUIRE(kiln_detok_push(d, b.data[j], &piece, &pl, &e) == KILN_OK);
                if (o + pl > len + 64) fits = false;
                if (fits) memcpy(out + o, piece, pl), o += pl;
            }
            CHECKF(fits && o == len && !memcmp(out, text, len), "decode: %zu bytes of %zu", o,
                   len);
            free(out);
            kiln_detok_destroy(d);
        }
        kiln_ivec_free(&a);
        kiln_ivec_free(&b);
    }
    CHECK(kiln_tokenizer_eos(tg) == kiln_tokenizer_eos(th));
    kiln_tokenizer_destroy(th);
    kiln_tokenizer_destroy(tg);
    free(text);
}

static void test_pycode(void) {
    const char *dir = kiln_test_shared("models/pycode10M");
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (access(p, R_OK) != 0) {
        printf("SKIP pycode10M: %s missing\n", p);
        return;
    }
    const char *out = gw_path("pycode.gguf");
    const char *args[] = {"convert", dir, out, NULL};
    REQUIRE(gw_kiln(args) == 0);
    kiln_error e = {0};
    kiln_gguf *g = NULL;
    REQUIRE(kiln_gguf_open(out, &g, &e) == KILN_OK);
    check_keys(dir, g);
    check_encode(dir, g);
    kiln_gguf_close(g);
}

/* A tiny llama checkpoint (vocab 8) whose tokenizer.json is `tok`. */
static const char *make_dir(const char *name, const char *tok) {
    const char *dir = gw_path(name);
    REQUIRE(mkdir(dir, 0700) == 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    const char *cfg = "{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 32, "
                      "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                      "\"num_key_value_heads\": 1, \"intermediate_size\": 64, "
                      "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true}";
    REQUIRE(write_whole(p, cfg, strlen(cfg)) == 0);
    static float zeros[64 * 64];
    struct {
        const char *n;
        int64_t r, c;
    } ts[] = {
        {"model.embed_tokens.weight", 8, 32},
        {"model.norm.weight", 0, 32},
        {"model.layers.0.input_layernorm.weight", 0, 32},
        {"model.layers.0.post_attention_layernorm.weight", 0, 32},
        {"model.layers.0.self_attn.q_proj.weight", 32, 32},
        {"model.layers.0.self_attn.k_proj.weight", 16, 32},
        {"model.layers.0.self_attn.v_proj.weight", 16, 32},
        {"model.layers.0.self_attn.o_proj.weight", 32, 32},
        {"model.layers.0.mlp.gate_proj.weight", 64, 32},
        {"model.layers.0.mlp.up_proj.weight", 64, 32},
        {"model.layers.0.mlp.down_proj.weight", 32, 64},
    };
    kiln_st_out_tensor out[11];
    int64_t shapes[11][2];
    for (size_t i = 0; i < 11; i++) {
        shapes[i][0] = ts[i].r ? ts[i].r : ts[i].c;
        shapes[i][1] = ts[i].c;
        out[i] = (kiln_st_out_tensor){ts[i].n, KILN_DTYPE_F32, ts[i].r ? 2 : 1,
                                      ts[i].r ? shapes[i] : &shapes[i][1], zeros};
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    kiln_error e = {0};
    REQUIRE(kiln_safetensors_write(p, out, 11, &e) == KILN_OK);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    REQUIRE(write_whole(p, tok, strlen(tok)) == 0);
    return dir;
}

#define VOCAB8 "\"vocab\": {\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7}"

static void expect_refused(const char *name, const char *tok, const char *needle) {
    char dir[1024], errbuf[4096];
    snprintf(dir, sizeof dir, "%s", make_dir(name, tok));
    const char *out = gw_path("refused.gguf");
    const char *args[] = {"convert", dir, out, NULL};
    int rc = run_kiln(args, errbuf, sizeof errbuf);
    CHECKF(rc == 1 && strstr(errbuf, needle) && strstr(errbuf, "--no-tokenizer"),
           "%s: exit %d, want 1 naming '%s': %s", name, rc, needle, errbuf);
    CHECKF(access(out, F_OK) != 0, "%s: a file was left behind", name);
    const char *args2[] = {"convert", dir, out, "--no-tokenizer", NULL};
    CHECKF(gw_kiln(args2) == 0, "%s with --no-tokenizer", name);
    kiln_error e = {0};
    kiln_gguf *g = NULL;
    if (kiln_gguf_open(out, &g, &e) == KILN_OK) {
        CHECK(!kiln_gguf_find(g, "tokenizer.ggml.model"));
        kiln_gguf_close(g);
    }
    unlink(out);
}

static void test_refusals(void) {
    expect_refused("wp", "{\"model\": {\"type\": \"WordPiece\", " VOCAB8 "}}", "WordPiece");
    expect_refused("spm",
                   "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, " VOCAB8
                   ", \"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
                   "SentencePiece");
    expect_refused("rx",
                   "{\"model\": {\"type\": \"BPE\", " VOCAB8
                   ", \"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
                   "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d+\"}, "
                   "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
                   "\"add_prefix_space\": false, \"use_regex\": false}]}}",
                   "Regex");
    expect_refused("empty", "{}", "model.type");
    char errbuf[4096];
    const char *args[] = {"convert", "x", "y.gguf", "--no-tokenizer", "--vocab", "z", NULL};
    CHECK(run_kiln(args, errbuf, sizeof errbuf) == 2 && strstr(errbuf, "--no-tokenizer"));
}

int main(void) {
    gw_setup("gguf-convert-tok");
    test_pycode();
    test_refusals();
    rm_rf(g_tmpdir);
    return kiln_test_finish("test_gguf_convert_tokenizer");
}
