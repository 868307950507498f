/*
 * test_llama2c - llama2.c checkpoints and tokenizer.bin: the real models of ../shared
 * (shapes from shared/README.md, sizes from run.c's layout computed here independently),
 * the pointer layout on synthetic checkpoints whose every section holds a distinct marker
 * (shared and separate classifier), and bad input (truncation, bad dims, absurd sizes,
 * bad tokenizer files).
 */
#include "test.h"
#include "fmt_util.h"
#include "format/llama2c.h"

#define NAME "bad.bin"

typedef struct model_case {
    const char *bin, *tok;
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq; /* -1: not in README */
} model_case;

/* Floats run.c's memory_map_weights spans for a header (sections in order). */
static uint64_t expected_floats(const int32_t h[7]) {
    uint64_t dim = (uint64_t)h[0], hid = (uint64_t)h[1], L = (uint64_t)h[2];
    uint64_t hs = dim / (uint64_t)h[3], kv = (uint64_t)h[4] * hs;
    uint64_t V = (uint64_t)(h[5] < 0 ? -h[5] : h[5]), S = (uint64_t)h[6];
    uint64_t n = V * dim + L * dim + L * dim * dim + 2 * L * dim * kv + L * dim * dim + L * dim +
                 3 * L * dim * hid + dim + 2 * (S * hs / 2);
    return h[5] < 0 ? n + V * dim : n;
}

static void test_real(const model_case *mc) {
    const char *bin = kiln_test_shared(mc->bin);
    if (access(bin, R_OK) != 0) {
        printf("note: %s missing, skipped\n", bin);
        return;
    }
    kiln_llama2c *m = NULL;
    kiln_error e = {0};
    kiln_status s = kiln_llama2c_open(bin, &m, &e);
    CHECKF(s == KILN_OK, "%s: %s", bin, e.message);
    if (s) return;
    const kiln_llama2c_config *c = &m->config;
    if (mc->dim > 0) CHECKF(c->dim == mc->dim, "%s dim %d", mc->bin, c->dim);
    if (mc->hidden > 0) CHECKF(c->hidden_dim == mc->hidden, "%s hidden %d", mc->bin, c->hidden_dim);
    CHECK(c->n_layers == mc->layers && c->n_heads == mc->heads);
    if (mc->kv_heads > 0) CHECK(c->n_kv_heads == mc->kv_heads);
    CHECK(c->vocab_size == mc->vocab && c->seq_len == mc->seq);
    CHECK(c->shared_classifier && m->wcls == m->token_embedding);
    /* The file holds exactly header + the floats run.c maps. */
    size_t n = 0;
    uint8_t *raw = read_whole(bin, &n);
    REQUIRE(raw);
    int32_t h[7];
    memcpy(h, raw, sizeof h);
    CHECK((uint64_t)n == 28 + 4 * expected_floats(h));
    /* Pointers in order, inside the mapping, with run.c's gaps. */
    const float *base = (const float *)((const char *)m->token_embedding - 0);
    uint64_t dim = (uint64_t)c->dim, L = (uint64_t)c->n_layers, hs = dim / (uint64_t)c->n_heads;
    uint64_t kv = (uint64_t)c->n_kv_heads * hs, hid = (uint64_t)c->hidden_dim;
    CHECK(m->rms_att == base + (uint64_t)c->vocab_size * dim);
    CHECK(m->wq == m->rms_att + L * dim);
    CHECK(m->wk == m->wq + L * dim * dim);
    CHECK(m->wv == m->wk + L * dim * kv);
    CHECK(m->wo == m->wv + L * dim * kv);
    CHECK(m->rms_ffn == m->wo + L * dim * dim);
    CHECK(m->w1 == m->rms_ffn + L * dim);
    CHECK(m->w2 == m->w1 + L * dim * hid);
    CHECK(m->w3 == m->w2 + L * dim * hid);
    CHECK(m->rms_final == m->w3 + L * dim * hid);
    /* The first weight is the float right after the 28-byte header in the file. */
    float first;
    memcpy(&first, raw + 28, 4);
    CHECK(m->token_embedding[0] == first);
    float fin;
    memcpy(&fin, raw + 28 + 4 * (size_t)(m->rms_final - base), 4);
    CHECK(m->rms_final[0] == fin);
    free(raw);

    /* tokenizer.bin for this vocabulary. */
    kiln_llama2c_vocab *v = NULL;
    s = kiln_llama2c_vocab_read(kiln_test_shared(mc->tok), c->vocab_size, &v, &e);
    CHECKF(s == KILN_OK, "%s: %s", mc->tok, e.message);
    if (s == KILN_OK) {
        CHECK(v->n_tokens == c->vocab_size && v->max_token_length > 0);
        /* llama2.c's vocab: <unk>, then BOS/EOS, then 256 byte tokens <0x00>..<0xFF>
         * (sentencepiece byte fallback), each piece at most max_token_length bytes. */
        CHECK(strcmp(v->pieces[0], "<unk>") == 0);
        int bytes_ok = 1;
        if (c->vocab_size > 259) {
            for (int i = 0; i < 256; i++) {
                char want[8];
                snprintf(want, sizeof want, "<0x%02X>", i);
                if (strcmp(v->pieces[3 + i], want) != 0) bytes_ok = 0;
            }
        }
        CHECKF(bytes_ok, "%s: byte tokens", mc->tok);
        for (int i = 0; i < v->n_tokens; i++) {
            CHECK(v->lens[i] <= (uint32_t)v->max_token_length &&
                  strlen(v->pieces[i]) == v->lens[i]);
        }
        kiln_llama2c_vocab_free(v);
    }
    /* A different vocabulary size is caught (too many: truncated; too few: trailing bytes). */
    CHECK(kiln_llama2c_vocab_read(kiln_test_shared(mc->tok), c->vocab_size + 1, &v, &e) ==
          KILN_ERR_FORMAT);
    CHECK(kiln_llama2c_vocab_read(kiln_test_shared(mc->tok), c->vocab_size - 1, &v, &e) ==
              KILN_ERR_FORMAT &&
          strstr(e.message, "follow"));
    kiln_llama2c_close(m);
}

/* A synthetic checkpoint whose section k is filled with the value k+1 (1 = embedding ...
 * 12 = rms_final, 13/14 = freq_cis real/imag, 15 = wcls). Returns malloc'd floats. */
static float *synth(const int32_t h[7], size_t *n_bytes) {
    uint64_t dim = (uint64_t)h[0], hid = (uint64_t)h[1], L = (uint64_t)h[2];
    uint64_t hs = dim / (uint64_t)h[3], kv = (uint64_t)h[4] * hs;
    uint64_t V = (uint64_t)(h[5] < 0 ? -h[5] : h[5]), S = (uint64_t)h[6];
    uint64_t sec[15] = {
        V * dim,       L * dim,    L * dim * dim, L * dim * kv,           L * dim * kv,
        L * dim * dim, L * dim,    L * dim * hid, L * dim * hid,          L * dim * hid,
        dim,           S * hs / 2, S * hs / 2,    h[5] < 0 ? V * dim : 0, 0};
    uint64_t total = 7;
    for (int i = 0; i < 15; i++) total += sec[i];
    float *p = malloc(total * 4);
    REQUIRE(p);
    memcpy(p, h, 28);
    uint64_t o = 7;
    for (int i = 0; i < 15; i++) {
        for (uint64_t k = 0; k < sec[i]; k++) p[o + k] = (float)(i == 13 ? 15 : i + 1);
        o += sec[i];
    }
    *n_bytes = total * 4;
    return p;
}

static void test_layout(void) {
    const int32_t heads[2][7] = {{16, 24, 3, 4, 2, 10, 6}, {16, 24, 3, 4, 2, -10, 6}};
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        float *p = synth(heads[k], &n);
        kiln_llama2c *m = NULL;
        kiln_error e = {0};
        REQUIRE(kiln_llama2c_open_memory(p, n, "synth.bin", &m, &e) == KILN_OK);
        CHECK(m->map == NULL);
        CHECK(m->config.vocab_size == 10 && m->config.shared_classifier == (k == 0));
        const float *ptrs[12] = {
            m->token_embedding, m->rms_att, m->wq, m->wk, m->wv,        m->wo,
            m->rms_ffn,         m->w1,      m->w2, m->w3, m->rms_final, m->wcls};
        for (int i = 0; i < 11; i++) CHECKF(ptrs[i][0] == (float)(i + 1), "section %d", i);
        /* Each section ends where the next begins: its last element still has its marker. */
        CHECK(m->wk[-1] == 3.0f && m->rms_final[-1] == 10.0f && m->rms_final[15] == 11.0f);
        if (k == 0) {
            CHECK(m->wcls == m->token_embedding);
        } else {
            CHECK(m->wcls[0] == 15.0f && m->wcls[-1] == 13.0f && m->wcls[159] == 15.0f);
            CHECK((const char *)(m->wcls + 160) == (const char *)p + n);
        }
        kiln_llama2c_close(m);
        /* One float short: rejected. */
        CHECK(kiln_llama2c_open_memory(p, n - 4, "synth.bin", &m, &e) == KILN_ERR_FORMAT);
        CHECK(msg_names(&e, "synth.bin") && m == NULL);
        /* Unaligned buffers are refused, not read misaligned. */
        uint8_t *u = malloc(n + 1);
        REQUIRE(u);
        memcpy(u + 1, p, n);
        CHECK(kiln_llama2c_open_memory(u + 1, n, "synth.bin", &m, &e) == KILN_ERR_INVALID_ARGUMENT);
        free(u);
        free(p);
    }
}

static void expect_header(const int32_t h[7], size_t file_bytes, kiln_status want,
                          const char *sub) {
    size_t n = file_bytes < 28 ? 28 : file_bytes;
    uint8_t *p = calloc(1, n);
    REQUIRE(p);
    memcpy(p, h, 28);
    kiln_llama2c *m = NULL;
    kiln_error e = {0};
    kiln_status s = kiln_llama2c_open_memory(p, file_bytes, NAME, &m, &e);
    CHECKF(s == want, "header {%d %d %d %d %d %d %d}: status %d: %s", h[0], h[1], h[2], h[3], h[4],
           h[5], h[6], s, e.message);
    if (s != KILN_OK) {
        CHECKF(msg_names(&e, NAME), "%s", e.message);
        if (sub) CHECKF(strstr(e.message, sub) != NULL, "'%s' not in '%s'", sub, e.message);
    }
    kiln_llama2c_close(m);
    free(p);
}

static void test_bad_checkpoints(void) {
    const int32_t ok[7] = {16, 24, 3, 4, 2, 10, 6};
    size_t need = 28 + 4 * (size_t)expected_floats(ok);
    expect_header(ok, need, KILN_OK, NULL);
    for (int f = 0; f < 7; f++) {
        static const char *names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                       "n_kv_heads", "vocab_size", "seq_len"};
        int32_t h[7];
        memcpy(h, ok, sizeof h);
        h[f] = 0;
        expect_header(h, need, KILN_ERR_FORMAT, names[f]);
        h[f] = f == 5 ? INT32_MIN : -3;
        expect_header(h, need, KILN_ERR_FORMAT, f == 5 ? "vocab_size" : names[f]);
    }
    int32_t h[7];
    memcpy(h, ok, sizeof h);
    h[3] = 5; /* 16 % 5 != 0 */
    expect_header(h, need, KILN_ERR_FORMAT, "n_heads");
    memcpy(h, ok, sizeof h);
    h[4] = 3; /* 4 % 3 != 0 */
    expect_header(h, need, KILN_ERR_FORMAT, "n_kv_heads");
    h[4] = 8; /* more kv heads than heads */
    expect_header(h, need, KILN_ERR_FORMAT, "n_kv_heads");
    /* Absurd sizes: every product overflows or exceeds the small file; fails at once. */
    const int32_t absurd[][7] = {{INT32_MAX, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, INT32_MAX},
                                 {1 << 30, 1 << 30, 1 << 30, 1, 1, -(1 << 30), 1 << 30},
                                 {65536, 65536, 65536, 1, 1, 65536, 65536},
                                 {16, 24, 3, 4, 2, 10, INT32_MAX}};
    for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
        expect_header(absurd[i], need, KILN_ERR_FORMAT, "declares weights");
    }
    /* Truncation at 20 points of a real checkpoint. */
    const char *bin = kiln_test_shared("models/stories260K/stories260K.bin");
    size_t n = 0;
    uint8_t *raw = read_whole(bin, &n);
    if (!raw) return;
    for (int i = 0; i < 20; i++) {
        size_t cut = i < 5 ? (size_t)(i * 7) : (size_t)((double)n * (i - 4) / 16.0) - 1;
        uint8_t *c = malloc(cut ? cut : 1);
        REQUIRE(c);
        memcpy(c, raw, cut);
        kiln_llama2c *m = NULL;
        kiln_error e = {0};
        CHECKF(kiln_llama2c_open_memory(c, cut, NAME, &m, &e) == KILN_ERR_FORMAT, "cut %zu: %s",
               cut, e.message);
        CHECK(msg_names(&e, NAME));
        free(c);
    }
    /* On disk. */
    const char *dir = make_tmpdir("l2c-bad");
    char p[600];
    snprintf(p, sizeof p, "%s/short.bin", dir);
    REQUIRE(write_whole(p, raw, n / 3) == 0);
    kiln_llama2c *m = NULL;
    kiln_error e = {0};
    CHECK(kiln_llama2c_open(p, &m, &e) == KILN_ERR_FORMAT && msg_names(&e, p) && m == NULL);
    CHECK(kiln_llama2c_open("/nonexistent.bin", &m, &e) == KILN_ERR_IO);
    CHECK(kiln_llama2c_open(dir, &m, &e) == KILN_ERR_IO);
    rm_rf(dir);
    free(raw);
    kiln_llama2c_close(NULL);
}

static void expect_vocab(const bb *b, int32_t n_tokens, kiln_status want, const char *sub) {
    uint8_t *c = malloc(b->n ? b->n : 1);
    REQUIRE(c);
    if (b->n) memcpy(c, b->p, b->n);
    kiln_llama2c_vocab *v = NULL;
    kiln_error e = {0};
    kiln_status s = kiln_llama2c_vocab_read_memory(c, b->n, NAME, n_tokens, &v, &e);
    free(c); /* the result must not point into the buffer */
    CHECKF(s == want, "status %d: %s", s, e.message);
    if (s != KILN_OK) {
        CHECK(v == NULL && msg_names(&e, NAME));
        if (sub) CHECKF(strstr(e.message, sub) != NULL, "'%s' not in '%s'", sub, e.message);
    } else {
        CHECK(v->n_tokens == n_tokens);
    }
    kiln_llama2c_vocab_free(v);
}

static void test_bad_vocab(void) {
    bb b = {0};
    bb_u32(&b, 4);
    const char *pieces[3] = {"a", "bc", "defg"};
    for (int i = 0; i < 3; i++) {
        bb_f32(&b, (float)-i);
        bb_u32(&b, (uint32_t)strlen(pieces[i]));
        bb_bytes(&b, pieces[i], strlen(pieces[i]));
    }
    expect_vocab(&b, 3, KILN_OK, NULL);
    {
        kiln_llama2c_vocab *v = NULL;
        REQUIRE(kiln_llama2c_vocab_read_memory(b.p, b.n, NULL, 3, &v, NULL) == KILN_OK);
        CHECK(v->max_token_length == 4 && v->scores[2] == -2.0f && v->lens[1] == 2 &&
              strcmp(v->pieces[2], "defg") == 0);
        kiln_llama2c_vocab_free(v);
    }
    expect_vocab(&b, 0, KILN_ERR_INVALID_ARGUMENT, NULL);
    expect_vocab(&b, -1, KILN_ERR_INVALID_ARGUMENT, NULL);
    expect_vocab(&b, INT32_MAX, KILN_ERR_FORMAT, "tokens"); /* fails before allocating */
    expect_vocab(&b, 4, KILN_ERR_FORMAT, "4 tokens");
    expect_vocab(&b, 2, KILN_ERR_FORMAT, "follow");
    for (size_t cut = 0; cut < b.n; cut++) {
        bb t = {b.p, cut, b.n};
        expect_vocab(&t, 3, KILN_ERR_FORMAT, NULL);
    }
    put_u32_at(b.p, 4 + 4, (uint32_t)-1); /* token 0 length -1 */
    expect_vocab(&b, 3, KILN_ERR_FORMAT, "length");
    put_u32_at(b.p, 4 + 4, 5); /* longer than max_token_length */
    expect_vocab(&b, 3, KILN_ERR_FORMAT, "max_token_length");
    put_u32_at(b.p, 4 + 4, 0x7FFFFFFF);
    expect_vocab(&b, 3, KILN_ERR_FORMAT, NULL);
    put_u32_at(b.p, 4 + 4, 1);
    put_u32_at(b.p, 0, 0); /* max_token_length 0 */
    expect_vocab(&b, 3, KILN_ERR_FORMAT, "max_token_length");
    put_u32_at(b.p, 0, 0x7FFFFFFF); /* a huge max is fine: lengths are checked one by one */
    expect_vocab(&b, 3, KILN_OK, NULL);
    bb_free(&b);
    kiln_llama2c_vocab *v = NULL;
    kiln_error e = {0};
    CHECK(kiln_llama2c_vocab_read("/nonexistent/tok.bin", 3, &v, &e) == KILN_ERR_IO &&
          msg_names(&e, "/nonexistent/tok.bin"));
    kiln_llama2c_vocab_free(NULL);
}

int main(void) {
    kiln_test_require_file(kiln_test_shared("models/stories260K/stories260K.bin"));
    /* Shapes from shared/README.md; -1 where the README does not give them. */
    const model_case cases[] = {
        {"models/stories260K/stories260K.bin", "models/stories260K/tok512.bin", 64, 172, 5, 8, 4,
         512, 512},
        {"models/llama2xs-260K/llama2xs.bin", "models/llama2xs-260K/tok512.bin", 64, 192, 5, 8, 4,
         512, 256},
        {"models/aidreams260K/aidreams260K.bin", "models/aidreams260K/tok512.bin", -1, -1, 4, 4, 4,
         512, 128},
        {"models/babyllama-tok105/model5000.bin", "models/babyllama-tok105/tok105.bin", 128, -1, 5,
         -1, -1, 105, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model_case mc = cases[i];
        if (mc.heads < 0 || mc.seq < 0) {
            /* fill what the README leaves open from the file, checked by the size equation */
            kiln_llama2c *m = NULL;
            if (kiln_llama2c_open(kiln_test_shared(mc.bin), &m, NULL) == KILN_OK) {
                if (mc.heads < 0) mc.heads = m->config.n_heads;
                if (mc.seq < 0) mc.seq = m->config.seq_len;
                kiln_llama2c_close(m);
            }
        }
        test_real(&mc);
    }
    test_layout();
    test_bad_checkpoints();
    test_bad_vocab();
    return kiln_test_finish("test_llama2c");
}
