/*
 * test_gguf_read - the GGUF reader on the real files in ../shared.
 * Expectations come from shared/README.md (model shapes), from the llama2.c checkpoint and
 * tokenizer.bin of the same model (read by a different reader, compared byte for byte), and
 * from the v1 and v3 encodings of the same model agreeing.
 */
#include <math.h>

#include "test.h"
#include "fmt_util.h"
#include "format/gguf.h"
#include "format/llama2c.h"

static kiln_gguf *open_or_die(const char *path) {
    kiln_error e = {0};
    kiln_gguf *g = NULL;
    kiln_status s = kiln_gguf_open(path, &g, &e);
    CHECKF(s == KILN_OK, "%s: %s", path, e.message);
    REQUIRE(g);
    return g;
}

/* Every tensor's data must lie inside the mapping, after the data section start. */
static void check_tensors_in_bounds(const kiln_gguf *g) {
    const uint8_t *base = g->base;
    CHECK(g->data_offset <= g->size);
    CHECK(g->data_offset % g->alignment == 0 || g->n_tensors == 0);
    for (size_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        const uint8_t *d = t->data;
        CHECKF(d >= base + g->data_offset && d + t->nbytes <= base + g->size &&
                   d == base + g->data_offset + t->offset,
               "tensor %s out of bounds", t->name);
        CHECK(t->offset % g->alignment == 0);
        CHECK(t->n_dims >= 1 && t->n_dims <= 4);
        for (int k = 0; k < 4; k++) CHECK(t->ne[k] >= 1);
    }
}

static bool str_eq(const kiln_gguf_str *s, const char *want) {
    return s && s->len == strlen(want) && memcmp(s->data, want, s->len) == 0;
}

static size_t scalar_bytes(kiln_gguf_type t) {
    switch (t) {
    case KILN_GGUF_UINT8:
    case KILN_GGUF_INT8:
    case KILN_GGUF_BOOL:
        return 1;
    case KILN_GGUF_UINT16:
    case KILN_GGUF_INT16:
        return 2;
    case KILN_GGUF_UINT32:
    case KILN_GGUF_INT32:
    case KILN_GGUF_FLOAT32:
        return 4;
    default:
        return 8;
    }
}

static bool values_equal(const kiln_gguf_value *a, const kiln_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case KILN_GGUF_STRING:
        return a->str.len == b->str.len && memcmp(a->str.data, b->str.data, a->str.len) == 0;
    case KILN_GGUF_ARRAY:
        if (a->arr.elem_type != b->arr.elem_type || a->arr.n != b->arr.n) return false;
        for (uint64_t i = 0; i < a->arr.n; i++) {
            if (a->arr.elem_type == KILN_GGUF_STRING) {
                const kiln_gguf_str *x = (const kiln_gguf_str *)a->arr.data + i;
                const kiln_gguf_str *y = (const kiln_gguf_str *)b->arr.data + i;
                if (x->len != y->len || memcmp(x->data, y->data, x->len) != 0) return false;
            } else if (a->arr.elem_type == KILN_GGUF_ARRAY) {
                if (!values_equal((const kiln_gguf_value *)a->arr.data + i,
                                  (const kiln_gguf_value *)b->arr.data + i))
                    return false;
            }
        }
        if (a->arr.elem_type != KILN_GGUF_STRING && a->arr.elem_type != KILN_GGUF_ARRAY) {
            return a->arr.n == 0 ||
                   memcmp(a->arr.data, b->arr.data, a->arr.n * scalar_bytes(a->arr.elem_type)) == 0;
        }
        return true;
    case KILN_GGUF_FLOAT32:
    case KILN_GGUF_FLOAT64:
        return a->f64 == b->f64;
    case KILN_GGUF_BOOL:
        return a->b == b->b;
    default:
        return a->u64 == b->u64;
    }
}

/* Compares a GGUF f32 tensor with `n` floats of a llama2.c weight. */
static void check_same_floats(const kiln_gguf *g, const char *name, const float *w, size_t n) {
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, name);
    CHECKF(t != NULL, "missing tensor %s", name);
    if (!t) return;
    CHECKF(t->dtype == KILN_DTYPE_F32 && t->nbytes == n * 4, "%s: dtype %d nbytes %zu want %zu",
           name, t->dtype, t->nbytes, n * 4);
    if (t->nbytes == n * 4) CHECKF(memcmp(t->data, w, n * 4) == 0, "%s differs", name);
}

/* The GGUF conversion of a llama2.c model carries exactly the checkpoint's weights. */
static void check_against_llama2c(const kiln_gguf *g, const char *bin) {
    kiln_llama2c *m = NULL;
    kiln_error e = {0};
    REQUIRE(kiln_llama2c_open(bin, &m, &e) == KILN_OK);
    const kiln_llama2c_config c = m->config;
    size_t dim = (size_t)c.dim, hid = (size_t)c.hidden_dim, hs = dim / (size_t)c.n_heads;
    size_t kvd = (size_t)c.n_kv_heads * hs;
    check_same_floats(g, "token_embd.weight", m->token_embedding, (size_t)c.vocab_size * dim);
    check_same_floats(g, "output_norm.weight", m->rms_final, dim);
    for (int l = 0; l < c.n_layers; l++) {
        char nm[64];
#define L2C(suffix, ptr, n)                                                                        \
    snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                                               \
    check_same_floats(g, nm, ptr + (size_t)l * (n), n)
        L2C("attn_norm.weight", m->rms_att, dim);
        L2C("attn_q.weight", m->wq, dim * dim);
        L2C("attn_k.weight", m->wk, dim * kvd);
        L2C("attn_v.weight", m->wv, dim * kvd);
        L2C("attn_output.weight", m->wo, dim * dim);
        L2C("ffn_norm.weight", m->rms_ffn, dim);
        L2C("ffn_gate.weight", m->w1, dim * hid);
        L2C("ffn_down.weight", m->w2, dim * hid);
        L2C("ffn_up.weight", m->w3, dim * hid);
#undef L2C
    }
    kiln_llama2c_close(m);
}

static void test_stories_v3_and_v1(void) {
    const char *v3p = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    const char *v1p = kiln_test_shared("models/stories260K/stories260K-f32-gguf-v1.gguf");
    kiln_test_require_file(v3p);
    kiln_test_require_file(v1p);
    kiln_gguf *g = open_or_die(v3p);
    kiln_gguf *g1 = open_or_die(v1p);
    CHECK(g->version == 3);
    CHECK(g1->version == 1);
    CHECK(g->alignment == 32);
    CHECK(str_eq(kiln_gguf_get_str(g, "general.architecture"), "llama"));
    /* README: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, vocab 512, seq 512. */
    uint32_t u = 0;
    int64_t i64 = 0;
    CHECK(kiln_gguf_get_u32(g, "llama.embedding_length", &u) && u == 64);
    CHECK(kiln_gguf_get_i64(g, "llama.embedding_length", &i64) && i64 == 64);
    CHECK(kiln_gguf_get_u32(g, "llama.feed_forward_length", &u) && u == 172);
    CHECK(kiln_gguf_get_u32(g, "llama.block_count", &u) && u == 5);
    CHECK(kiln_gguf_get_u32(g, "llama.attention.head_count", &u) && u == 8);
    CHECK(kiln_gguf_get_u32(g, "llama.attention.head_count_kv", &u) && u == 4);
    CHECK(kiln_gguf_get_u32(g, "llama.context_length", &u) && u == 512);
    float eps = 0;
    CHECK(kiln_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps) &&
          fabsf(eps - 1e-5f) < 1e-9f);
    CHECK(!kiln_gguf_get_u32(g, "general.architecture", &u)); /* a string, not an integer */
    CHECK(kiln_gguf_get_str(g, "llama.block_count") == NULL);
    CHECK(kiln_gguf_find(g, "no.such.key") == NULL);

    const kiln_gguf_value *toks = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens");
    const kiln_gguf_value *scores = kiln_gguf_get_arr(g, "tokenizer.ggml.scores");
    REQUIRE(toks && scores);
    CHECK(toks->arr.elem_type == KILN_GGUF_STRING && toks->arr.n == 512);
    CHECK(scores->arr.elem_type == KILN_GGUF_FLOAT32 && scores->arr.n == 512);

    /* The same vocabulary as tok512.bin (llama2.c writes SentencePiece's U+2581 as a space
     * and wraps BOS/EOS in newlines). */
    const char *tokp = kiln_test_shared("models/stories260K/tok512.bin");
    kiln_llama2c_vocab *v = NULL;
    kiln_error e = {0};
    if (kiln_llama2c_vocab_read(tokp, 512, &v, &e) == KILN_OK) {
        int mismatches = 0;
        const kiln_gguf_str *ts = toks->arr.data;
        const float *sc = scores->arr.data;
        for (int i = 0; i < 512; i++) {
            char piece[64];
            size_t n = 0;
            for (uint64_t k = 0; k < ts[i].len && n < sizeof piece - 1; k++) {
                if (k + 2 < ts[i].len && memcmp(ts[i].data + k, "\xe2\x96\x81", 3) == 0) {
                    piece[n++] = ' ';
                    k += 2;
                } else {
                    piece[n++] = ts[i].data[k];
                }
            }
            piece[n] = '\0';
            bool same =
                (n == v->lens[i] && memcmp(piece, v->pieces[i], n) == 0) ||
                (i == 1 && strcmp(v->pieces[i], "\n<s>\n") == 0 && strcmp(piece, "<s>") == 0) ||
                (i == 2 && strcmp(v->pieces[i], "\n</s>\n") == 0 && strcmp(piece, "</s>") == 0);
            if (!same || sc[i] != v->scores[i]) mismatches++;
        }
        CHECKF(mismatches == 0, "%d tokens differ from tok512.bin", mismatches);
        kiln_llama2c_vocab_free(v);
    } else {
        CHECKF(0, "tok512.bin: %s", e.message);
    }

    /* Tensors: 9 per layer x 5 + embedding, final norm, output = 48. */
    CHECK(g->n_tensors == 48);
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, "token_embd.weight");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 &&
          t->nbytes == 64 * 512 * 4);
    t = kiln_gguf_find_tensor(g, "blk.0.attn_k.weight");
    REQUIRE(t);
    CHECK(t->ne[0] == 64 && t->ne[1] == 32 && t->nbytes == 64 * 32 * 4); /* 4 kv heads x 8 */
    t = kiln_gguf_find_tensor(g, "blk.4.ffn_down.weight");
    REQUIRE(t);
    CHECK(t->ne[0] == 172 && t->ne[1] == 64);
    t = kiln_gguf_find_tensor(g, "output_norm.weight");
    REQUIRE(t);
    CHECK(t->n_dims == 1 && t->ne[0] == 64 && t->ne[1] == 1);
    CHECK(kiln_gguf_find_tensor(g, "blk.5.attn_q.weight") == NULL);
    check_tensors_in_bounds(g);
    check_tensors_in_bounds(g1);

    /* v1 and v3 hold the same metadata and tensors. */
    CHECK(g1->n_kv == g->n_kv);
    for (size_t i = 0; i < g->n_kv; i++) {
        const kiln_gguf_kv *o = kiln_gguf_find(g1, g->kv[i].key);
        CHECKF(o && values_equal(&o->value, &g->kv[i].value), "v1 key %s differs", g->kv[i].key);
    }
    CHECK(g1->n_tensors == g->n_tensors);
    for (size_t i = 0; i < g->n_tensors; i++) {
        const kiln_gguf_tensor *a = &g->tensors[i];
        const kiln_gguf_tensor *b = kiln_gguf_find_tensor(g1, a->name);
        CHECKF(b && b->dtype == a->dtype && b->n_dims == a->n_dims &&
                   memcmp(b->ne, a->ne, sizeof a->ne) == 0 && b->nbytes == a->nbytes &&
                   memcmp(a->data, b->data, a->nbytes) == 0,
               "v1 tensor %s differs", a->name);
    }
    check_against_llama2c(g, kiln_test_shared("models/stories260K/stories260K.bin"));
    kiln_gguf_close(g1);
    kiln_gguf_close(g);
}

static void test_llama2xs(void) {
    const char *f32p = kiln_test_shared("models/llama2xs-260K/llama2xs-f32.gguf");
    const char *q8p = kiln_test_shared("models/llama2xs-260K/llama2xs-Q8_0.gguf");
    const char *q4p = kiln_test_shared("models/llama2xs-260K/llama2xs-Q4_0.gguf");
    kiln_test_require_file(f32p);
    kiln_gguf *gf = open_or_die(f32p);
    kiln_gguf *g8 = open_or_die(q8p);
    kiln_gguf *g4 = open_or_die(q4p);
    uint32_t u;
    /* README: dim 64, hidden 192, 5 layers, 8/4 heads, vocab 512, seq 256. */
    CHECK(kiln_gguf_get_u32(gf, "llama.feed_forward_length", &u) && u == 192);
    /* (llama.context_length is 128 here: the converter's default, not the model's 256.) */
    CHECK(kiln_gguf_get_u32(gf, "llama.attention.head_count_kv", &u) && u == 4);
    CHECK(str_eq(kiln_gguf_get_str(g4, "general.architecture"), "llama"));
    check_against_llama2c(gf, kiln_test_shared("models/llama2xs-260K/llama2xs.bin"));
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g8, "token_embd.weight");
    REQUIRE(t);
    /* q8_0: blocks of 32 elements in 34 bytes. */
    CHECK(t->dtype == KILN_DTYPE_Q8_0 && t->nbytes == 512 * (64 / 32) * 34);
    /* README: in the Q4_0 file output.weight is Q8_0 and the norms are F32. */
    t = kiln_gguf_find_tensor(g4, "output.weight");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_Q8_0);
    t = kiln_gguf_find_tensor(g4, "blk.0.ffn_up.weight");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_Q4_0 && t->nbytes == 192 * (64 / 32) * 18);
    const kiln_gguf_tensor *n4 = kiln_gguf_find_tensor(g4, "blk.2.attn_norm.weight");
    const kiln_gguf_tensor *nf = kiln_gguf_find_tensor(gf, "blk.2.attn_norm.weight");
    REQUIRE(n4 && nf);
    CHECK(n4->dtype == KILN_DTYPE_F32 && n4->nbytes == nf->nbytes &&
          memcmp(n4->data, nf->data, nf->nbytes) == 0);
    check_tensors_in_bounds(gf);
    check_tensors_in_bounds(g8);
    check_tensors_in_bounds(g4);
    kiln_gguf_close(gf);
    kiln_gguf_close(g8);
    kiln_gguf_close(g4);
}

/* Counts the test strings of a .gguf.out file and its largest id. */
static long max_id_in(const char *path) {
    size_t n = 0;
    uint8_t *p = read_whole(path, &n);
    if (!p) return -1;
    long best = -1, cur = -1;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? (char)p[i] : ' ';
        if (c >= '0' && c <= '9') {
            cur = (cur < 0 ? 0 : cur * 10) + (c - '0');
        } else {
            if (cur > best) best = cur;
            cur = -1;
        }
    }
    free(p);
    return best;
}

static void test_vocab_files(void) {
    static const char *names[] = {"llama-spm",    "phi-3",     "gpt-2",    "falcon",
                                  "mpt",          "starcoder", "refact",   "deepseek-coder",
                                  "deepseek-llm", "bert-bge",  "baichuan", "gpt-neox"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", names[i]);
        const char *path = kiln_test_shared(rel);
        if (access(path, R_OK) != 0) {
            printf("note: %s missing, skipped\n", path);
            continue;
        }
        kiln_gguf *g = open_or_die(path);
        CHECK(g->version == 3 && g->n_tensors == 0);
        CHECK(kiln_gguf_get_str(g, "general.architecture") != NULL);
        const kiln_gguf_str *model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
        CHECKF(model && model->len > 0, "%s: tokenizer.ggml.model", names[i]);
        const kiln_gguf_value *toks = kiln_gguf_get_arr(g, "tokenizer.ggml.tokens");
        const kiln_gguf_value *types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type");
        CHECKF(toks && toks->arr.elem_type == KILN_GGUF_STRING && toks->arr.n > 100, "%s: tokens",
               names[i]);
        CHECKF(types && toks && types->arr.n == toks->arr.n, "%s: token_type", names[i]);
        /* Every id the conformance suite expects exists in the vocabulary. */
        char outrel[160];
        snprintf(outrel, sizeof outrel, "%s.out", rel);
        long mx = max_id_in(kiln_test_shared(outrel));
        if (mx >= 0 && toks) {
            CHECKF((uint64_t)mx < toks->arr.n, "%s: id %ld >= %llu tokens", names[i], mx,
                   (unsigned long long)toks->arr.n);
        }
        int64_t vs;
        if (toks && kiln_gguf_get_i64(g, "llama.vocab_size", &vs)) {
            CHECKF((uint64_t)vs == toks->arr.n, "%s: vocab_size", names[i]);
        }
        const kiln_gguf_value *merges = kiln_gguf_get_arr(g, "tokenizer.ggml.merges");
        if (merges) CHECK(merges->arr.elem_type == KILN_GGUF_STRING);
        CHECK(g->data_offset <= g->size);
        kiln_gguf_close(g);
    }
}

static void test_open_memory_matches_file(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    size_t n = 0;
    uint8_t *buf = read_whole(path, &n);
    REQUIRE(buf);
    kiln_gguf *gm = NULL, *gf = open_or_die(path);
    kiln_error e = {0};
    REQUIRE(kiln_gguf_open_memory(buf, n, "mem.gguf", &gm, &e) == KILN_OK);
    CHECK(strcmp(gm->path, "mem.gguf") == 0 && gm->owned_map == NULL && gm->base == buf);
    CHECK(gm->n_tensors == gf->n_tensors && gm->data_offset == gf->data_offset);
    for (size_t i = 0; i < gm->n_tensors; i++) {
        CHECK((const uint8_t *)gm->tensors[i].data - buf ==
              (const uint8_t *)gf->tensors[i].data - (const uint8_t *)gf->base);
    }
    kiln_gguf_close(gm);
    kiln_gguf_close(gf);
    kiln_gguf_close(NULL);
    free(buf);
    /* Missing file and directory: IO errors naming the path. */
    kiln_gguf *g = (kiln_gguf *)1;
    CHECK(kiln_gguf_open("/nonexistent/x.gguf", &g, &e) == KILN_ERR_IO && g == NULL);
    CHECK(msg_names(&e, "/nonexistent/x.gguf"));
    CHECK(kiln_gguf_open(KILN_SHARED_DIR, &g, &e) == KILN_ERR_IO && g == NULL);
}

int main(void) {
    kiln_test_require_file(kiln_test_shared("models/stories260K/stories260K-f32.gguf"));
    test_stories_v3_and_v1();
    test_llama2xs();
    test_vocab_files();
    test_open_memory_matches_file();
    return kiln_test_finish("test_gguf_read");
}
