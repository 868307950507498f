/*
 * test_gguf_bad_input - the GGUF reader on corrupt input: truncations, bit flips in every
 * header field kind, absurd counts, out-of-range offsets, unknown dtypes, bad alignment,
 * nesting, duplicates. Every read must fail with a clear error naming the file (or succeed
 * with all data in bounds), without crashing, hanging or over-allocating. Run under
 * ASan+UBSan to catch out-of-bounds reads: every image is parsed from an exact-size heap copy.
 */
#include "test.h"
#include "gguf_builder.h"
#include "format/gguf.h"

#define NAME "bad.gguf"

/* Parses c[0..n) (a heap block of exactly n bytes); returns the status, fills e. On
 * success checks that everything lies in bounds. */
static kiln_status parse_buf(const uint8_t *c, size_t n, kiln_error *e) {
    kiln_gguf *g = NULL;
    memset(e, 0, sizeof *e);
    kiln_status s = kiln_gguf_open_memory(c, n, NAME, &g, e);
    if (s == KILN_OK) {
        REQUIRE(g);
        CHECK(g->data_offset <= n);
        for (size_t i = 0; i < g->n_tensors; i++) {
            const kiln_gguf_tensor *t = &g->tensors[i];
            const uint8_t *d = t->data;
            CHECKF(d >= c + g->data_offset && t->nbytes <= n && d <= c + n - t->nbytes,
                   "tensor %zu out of bounds", i);
        }
        for (size_t i = 0; i < g->n_kv; i++) CHECK(g->kv[i].key != NULL);
        kiln_gguf_close(g);
    } else {
        CHECK(g == NULL);
        CHECKF(msg_names(e, NAME), "status %d, message does not name the file: '%s'", s,
               e->message);
        CHECKF(s == KILN_ERR_FORMAT || s == KILN_ERR_UNSUPPORTED, "status %d: %s", s, e->message);
    }
    return s;
}

/* As parse_buf over an exact-size copy of p[0..n), so ASan sees any read past the end. */
static kiln_status parse_copy(const uint8_t *p, size_t n, kiln_error *e) {
    uint8_t *c = malloc(n ? n : 1);
    REQUIRE(c);
    if (n) memcpy(c, p, n);
    kiln_status s = parse_buf(c, n, e);
    free(c);
    return s;
}

/* Expects status `want` and a message containing `sub` (if non-NULL). */
static void expect(const char *what, const bb *b, kiln_status want, const char *sub) {
    kiln_error e;
    kiln_status s = parse_copy(b->p, b->n, &e);
    CHECKF(s == want, "%s: status %d (%s), want %d: %s", what, s, kiln_status_name(s), want,
           e.message);
    if (sub) CHECKF(strstr(e.message, sub) != NULL, "%s: '%s' not in '%s'", what, sub, e.message);
}

/* ---- Field locations of a real file, found by an independent walk. ---- */

typedef struct field {
    size_t off, len;
} field;

typedef struct walker {
    const uint8_t *p;
    size_t n, pos;
    uint32_t version;
    field f[4096];
    size_t nf;
} walker;

static uint64_t w_rd(walker *w, size_t len, bool record) {
    uint64_t v = 0;
    REQUIRE(w->pos + len <= w->n);
    for (size_t i = 0; i < len; i++) v |= (uint64_t)w->p[w->pos + i] << (8 * i);
    if (record && w->nf < 4096) w->f[w->nf++] = (field){w->pos, len};
    w->pos += len;
    return v;
}
static size_t w_cs(walker *w) {
    return w->version == 1 ? 4 : 8;
}
static void w_skip_str(walker *w, bool record) {
    uint64_t len = w_rd(w, w_cs(w), record);
    w->pos += (size_t)len;
}
static void w_value(walker *w, uint32_t t, bool record) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) {
        w_skip_str(w, record);
    } else if (t == 9) {
        uint32_t et = (uint32_t)w_rd(w, 4, record);
        uint64_t n = w_rd(w, w_cs(w), record);
        for (uint64_t i = 0; i < n; i++) w_value(w, et, record && i < 3);
    } else {
        REQUIRE(t < 13);
        w_rd(w, sz[t], record && t == 7);
    }
}
static void walk(walker *w, const uint8_t *p, size_t n) {
    memset(w, 0, sizeof *w);
    w->p = p;
    w->n = n;
    w_rd(w, 4, true);
    w->version = (uint32_t)w_rd(w, 4, true);
    uint64_t nt = w_rd(w, w_cs(w), true);
    uint64_t nkv = w_rd(w, w_cs(w), true);
    for (uint64_t i = 0; i < nkv; i++) {
        w_skip_str(w, true);
        uint32_t t = (uint32_t)w_rd(w, 4, true);
        w_value(w, t, true);
    }
    for (uint64_t i = 0; i < nt; i++) {
        bool rec = i < 6 || i + 1 == nt;
        w_skip_str(w, rec);
        uint32_t nd = (uint32_t)w_rd(w, 4, rec);
        for (uint32_t d = 0; d < nd; d++) w_rd(w, w_cs(w), rec);
        w_rd(w, 4, rec);
        w_rd(w, 8, rec);
    }
}

static void test_real_file(const char *rel) {
    const char *path = kiln_test_shared(rel);
    size_t n = 0;
    uint8_t *orig = read_whole(path, &n);
    REQUIRE(orig && n > 1000);
    kiln_error e;
    CHECK(parse_copy(orig, n, &e) == KILN_OK);
    char last[128] = "";
    kiln_gguf *g = NULL;
    REQUIRE(kiln_gguf_open_memory(orig, n, NAME, &g, &e) == KILN_OK && g->n_tensors > 0);
    snprintf(last, sizeof last, "tensor '%s'", g->tensors[g->n_tensors - 1].name);
    kiln_gguf_close(g);

    /* Truncated at 20 cut points: header, metadata, tensor infos, padding, data. */
    walker *w = malloc(sizeof *w);
    REQUIRE(w);
    walk(w, orig, n);
    size_t cuts[20] = {0, 3, 4, 7, 12, 23, 40, w->f[w->nf - 1].off + 3, w->pos, n - 1};
    for (int i = 10; i < 20; i++) cuts[i] = (size_t)((double)n * (i - 9) / 11.5);
    for (int i = 0; i < 20; i++) {
        kiln_status s = parse_copy(orig, cuts[i], &e);
        CHECKF(s == KILN_ERR_FORMAT, "%s cut at %zu: status %d: %s", rel, cuts[i], s, e.message);
    }

    /* Every bit of every recorded header field (magic, version, counts, key and string
     * lengths, type tags, array counts, bools, tensor names, n_dims, dims, dtypes, offsets). */
    uint8_t *c = malloc(n);
    REQUIRE(c);
    memcpy(c, orig, n);
    size_t n_ok = 0, n_fail = 0;
    for (size_t fi = 0; fi < w->nf; fi++) {
        for (size_t bit = 0; bit < w->f[fi].len * 8; bit++) {
            size_t at = w->f[fi].off + bit / 8;
            c[at] ^= (uint8_t)(1u << (bit % 8));
            if (parse_buf(c, n, &e) == KILN_OK) {
                n_ok++;
            } else {
                n_fail++;
            }
            c[at] = orig[at];
        }
    }
    printf("%s: %zu fields, bit flips: %zu read, %zu rejected\n", rel, w->nf, n_ok, n_fail);
    CHECK(n_fail > 0);

    /* Random multi-bit flips anywhere in the header region. */
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int it = 0; it < 1500; it++) {
        size_t at[4];
        int k = 1 + (int)(rng_next(&seed) % 4);
        for (int j = 0; j < k; j++) {
            at[j] = (size_t)(rng_next(&seed) % w->pos);
            c[at[j]] ^= (uint8_t)(1u << (rng_next(&seed) % 8));
        }
        parse_buf(c, n, &e);
        for (int j = 0; j < k; j++) c[at[j]] = orig[at[j]];
    }

    /* The last tensor's offset pushed beyond the end of the file. */
    size_t last_off_field = w->f[w->nf - 1].off;
    memcpy(c, orig, n);
    put_u64_at(c, last_off_field, (uint64_t)n / 32 * 32 + 4096);
    CHECK(parse_copy(c, n, &e) == KILN_ERR_FORMAT);
    CHECKF(strstr(e.message, "extends beyond end of file") && strstr(e.message, last), "%s",
           e.message);
    /* ... and to a value whose sum with the data offset wraps around. */
    put_u64_at(c, last_off_field, UINT64_MAX - 31);
    CHECK(parse_copy(c, n, &e) == KILN_ERR_FORMAT);
    /* An unknown dtype on the last tensor: q4_1 (3), then an id no one defines. */
    memcpy(c, orig, n);
    put_u32_at(c, last_off_field - 4, 3);
    CHECK(parse_copy(c, n, &e) == KILN_ERR_UNSUPPORTED);
    CHECKF(strstr(e.message, "dtype id 3") && strstr(e.message, "q4_1") && strstr(e.message, last),
           "%s", e.message);
    put_u32_at(c, last_off_field - 4, 1000);
    CHECK(parse_copy(c, n, &e) == KILN_ERR_UNSUPPORTED);
    CHECK(strstr(e.message, "1000") != NULL);

    /* The same kinds of damage on disk, through kiln_gguf_open. */
    const char *dir = make_tmpdir("gguf-bad");
    char p[640];
    struct {
        const char *file;
        size_t len;
        kiln_status want;
    } disk[3] = {{"truncated.gguf", n / 2, KILN_ERR_FORMAT},
                 {"header-only.gguf", 30, KILN_ERR_FORMAT},
                 {"dtype.gguf", n, KILN_ERR_UNSUPPORTED}};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, disk[i].file);
        REQUIRE(write_whole(p, i == 2 ? c : orig, disk[i].len) == 0);
        kiln_status s = kiln_gguf_open(p, &g, &e);
        CHECKF(s == disk[i].want && g == NULL, "%s: %d %s", p, s, e.message);
        CHECKF(msg_names(&e, p), "message does not name %s: %s", p, e.message);
    }
    snprintf(p, sizeof p, "%s/empty.gguf", dir);
    REQUIRE(write_whole(p, "", 0) == 0);
    CHECK(kiln_gguf_open(p, &g, &e) == KILN_ERR_FORMAT && msg_names(&e, p));
    rm_rf(dir);
    free(c);
    free(w);
    free(orig);
}

/* A minimal valid v3 file: 1 kv, 1 f32 tensor [4]. */
static void small_valid(gb *g, uint32_t version) {
    memset(g, 0, sizeof *g);
    gb_header(g, version, 1, 1);
    gb_kv_str(g, "general.architecture", "llama");
    uint64_t ne[1] = {4};
    gb_tensor(g, "w", 1, ne, 0, 0);
    bb_pad_to(&g->b, 32);
    for (int i = 0; i < 4; i++) bb_f32(&g->b, (float)i);
}

/* Header + one kv whose value the caller writes; tensors 0. */
static void one_kv(gb *g, uint32_t version, const char *key, uint32_t type) {
    memset(g, 0, sizeof *g);
    gb_header(g, version, 0, 1);
    gb_key(g, key, type);
}

/* One tensor with the given description and enough zero data for `data_bytes`. */
static void one_tensor(gb *g, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off,
                       size_t data_bytes) {
    memset(g, 0, sizeof *g);
    gb_header(g, 3, 1, 0);
    gb_tensor(g, "t", n_dims, ne, type, off);
    bb_pad_to(&g->b, 32);
    bb_zeros(&g->b, data_bytes);
}

static void test_synthetic(void) {
    gb g;
    kiln_error e;
    for (uint32_t v = 1; v <= 3; v++) {
        small_valid(&g, v);
        expect("small valid", &g.b, KILN_OK, NULL);
        bb_free(&g.b);
    }
    /* Empty and tiny buffers, NULL data. */
    kiln_gguf *r = (kiln_gguf *)1;
    CHECK(kiln_gguf_open_memory(NULL, 0, NAME, &r, &e) == KILN_ERR_FORMAT && r == NULL);
    CHECK(msg_names(&e, NAME));
    CHECK(kiln_gguf_open_memory("GG", 2, NULL, &r, &e) == KILN_ERR_FORMAT);
    CHECK(msg_names(&e, "<memory>"));

    /* Magic and version. */
    small_valid(&g, 3);
    g.b.p[0] = 'g';
    expect("magic", &g.b, KILN_ERR_FORMAT, "header.magic");
    g.b.p[0] = 'G';
    put_u32_at(g.b.p, 4, 0);
    expect("version 0", &g.b, KILN_ERR_FORMAT, "header.version");
    put_u32_at(g.b.p, 4, 4);
    expect("version 4", &g.b, KILN_ERR_UNSUPPORTED, "header.version");
    put_u32_at(g.b.p, 4, 0x03000000u);
    expect("big-endian", &g.b, KILN_ERR_UNSUPPORTED, "big-endian");
    put_u32_at(g.b.p, 4, 3);
    /* Absurd counts in a small file must fail at once (no allocation of 2^60 entries). */
    put_u64_at(g.b.p, 8, 1ull << 60);
    expect("n_tensors 2^60", &g.b, KILN_ERR_FORMAT, "header.n_tensors");
    put_u64_at(g.b.p, 8, 1);
    put_u64_at(g.b.p, 16, 1ull << 60);
    expect("n_kv 2^60", &g.b, KILN_ERR_FORMAT, "header.n_kv");
    put_u64_at(g.b.p, 16, UINT64_MAX);
    expect("n_kv max", &g.b, KILN_ERR_FORMAT, "header.n_kv");
    put_u64_at(g.b.p, 16, 1);
    put_u64_at(g.b.p, 24, 1ull << 60); /* key length */
    expect("key len 2^60", &g.b, KILN_ERR_FORMAT, "offset 24");
    bb_free(&g.b);

    small_valid(&g, 1);
    put_u32_at(g.b.p, 8, 0xFFFFFFFFu);
    expect("v1 n_tensors", &g.b, KILN_ERR_FORMAT, "header.n_tensors");
    bb_free(&g.b);

    /* Strings and arrays whose lengths lie. */
    one_kv(&g, 3, "s", 8);
    bb_u64(&g.b, 1ull << 60);
    bb_bytes(&g.b, "abc", 3);
    expect("string len 2^60", &g.b, KILN_ERR_FORMAT, "key 's'");
    bb_free(&g.b);
    const uint32_t elem_types[] = {0, 6, 8, 9, 12};
    for (size_t i = 0; i < 5; i++) {
        one_kv(&g, 3, "a", 9);
        gb_arr(&g, elem_types[i], 1ull << 60);
        bb_zeros(&g.b, 64);
        expect("array count 2^60", &g.b, KILN_ERR_FORMAT, "array length");
        bb_free(&g.b);
        one_kv(&g, 1, "a", 9);
        gb_arr(&g, elem_types[i], 0xFFFFFFFFu);
        bb_zeros(&g.b, 64);
        expect("v1 array count", &g.b, KILN_ERR_FORMAT, "array length");
        bb_free(&g.b);
    }
    /* Bad type tags. */
    one_kv(&g, 3, "t", 13);
    bb_zeros(&g.b, 16);
    expect("type 13", &g.b, KILN_ERR_FORMAT, "type tag 13");
    bb_free(&g.b);
    one_kv(&g, 3, "t", 0xFFFFFFFFu);
    bb_zeros(&g.b, 16);
    expect("type max", &g.b, KILN_ERR_FORMAT, "type tag");
    bb_free(&g.b);
    one_kv(&g, 3, "t", 9);
    gb_arr(&g, 13, 1);
    bb_zeros(&g.b, 16);
    expect("array elem type 13", &g.b, KILN_ERR_FORMAT, "element type");
    bb_free(&g.b);
    one_kv(&g, 3, "b", 7);
    bb_u8(&g.b, 2);
    expect("bool 2", &g.b, KILN_ERR_FORMAT, "bool");
    bb_free(&g.b);
    one_kv(&g, 3, "b", 9);
    gb_arr(&g, 7, 3);
    bb_bytes(&g.b, "\0\1\7", 3);
    expect("bool array 7", &g.b, KILN_ERR_FORMAT, "bool");
    bb_free(&g.b);
    /* A value cut short. */
    one_kv(&g, 3, "u", 10);
    bb_u32(&g.b, 1);
    expect("short u64", &g.b, KILN_ERR_FORMAT, "key 'u'");
    bb_free(&g.b);

    /* Nesting: 8 levels of arrays are fine, 9 are rejected. */
    for (int levels = 7; levels <= 10; levels++) {
        one_kv(&g, 3, "nest", 9);
        for (int l = 1; l < levels; l++) gb_arr(&g, 9, 1);
        gb_arr(&g, 8, 1);
        gb_str(&g, "deep");
        expect("nesting", &g.b, levels <= 8 ? KILN_OK : KILN_ERR_FORMAT,
               levels <= 8 ? NULL : "nested");
        bb_free(&g.b);
    }
    /* A long chain of nested arrays (fuzzer-style) stays bounded. */
    one_kv(&g, 3, "nest", 9);
    for (int l = 0; l < 10000; l++) gb_arr(&g, 9, 1);
    expect("deep chain", &g.b, KILN_ERR_FORMAT, "nested");
    bb_free(&g.b);

    /* Duplicate keys, duplicate tensor names, NUL bytes in names. */
    memset(&g, 0, sizeof g);
    gb_header(&g, 3, 0, 3);
    gb_kv_u32(&g, "k1", 1);
    gb_kv_u32(&g, "k2", 2);
    gb_kv_u32(&g, "k1", 3);
    expect("dup key", &g.b, KILN_ERR_FORMAT, "'k1' appears twice");
    bb_free(&g.b);
    memset(&g, 0, sizeof g);
    gb_header(&g, 3, 0, 1);
    gb_strn(&g, "a\0b", 3);
    bb_u32(&g.b, 4);
    bb_u32(&g.b, 1);
    expect("NUL in key", &g.b, KILN_ERR_FORMAT, "NUL");
    bb_free(&g.b);
    {
        uint64_t ne[1] = {8};
        memset(&g, 0, sizeof g);
        gb_header(&g, 3, 2, 0);
        gb_tensor(&g, "x", 1, ne, 0, 0);
        gb_tensor(&g, "x", 1, ne, 0, 32);
        bb_pad_to(&g.b, 32);
        bb_zeros(&g.b, 64);
        expect("dup tensor", &g.b, KILN_ERR_FORMAT, "'x' appears twice");
        bb_free(&g.b);
    }
    /* An empty metadata key and an empty tensor name (issue 20): refused, named. */
    memset(&g, 0, sizeof g);
    gb_header(&g, 3, 0, 2);
    gb_kv_u32(&g, "k1", 1);
    gb_kv_u32(&g, "", 2);
    expect("empty key", &g.b, KILN_ERR_FORMAT, "metadata kv #1: key at offset");
    expect("empty key says so", &g.b, KILN_ERR_FORMAT, "is empty");
    bb_free(&g.b);
    {
        uint64_t ne[1] = {8};
        memset(&g, 0, sizeof g);
        gb_header(&g, 3, 1, 0);
        gb_tensor(&g, "", 1, ne, 0, 0);
        bb_pad_to(&g.b, 32);
        bb_zeros(&g.b, 32);
        expect("empty tensor name", &g.b, KILN_ERR_FORMAT, "tensor info #0: name at offset");
        expect("empty tensor name says so", &g.b, KILN_ERR_FORMAT, "is empty");
        bb_free(&g.b);
    }

    /* general.alignment. */
    const struct {
        uint32_t type;
        uint64_t v;
        kiln_status want;
    } al[] = {{4, 0, KILN_ERR_FORMAT},           {4, 3, KILN_ERR_FORMAT},
              {4, 48, KILN_ERR_FORMAT},          {5, 0xFFFFFFE0u, KILN_ERR_FORMAT},
              {6, 0x42000000u, KILN_ERR_FORMAT}, {4, 16, KILN_OK},
              {10, 1ull << 40, KILN_ERR_FORMAT}};
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
        memset(&g, 0, sizeof g);
        gb_header(&g, 3, 1, 1);
        gb_key(&g, "general.alignment", al[i].type);
        if (al[i].type == 10) {
            bb_u64(&g.b, al[i].v);
        } else {
            bb_u32(&g.b, (uint32_t)al[i].v);
        }
        uint64_t ne[1] = {4};
        gb_tensor(&g, "w", 1, ne, 0, 0);
        bb_pad_to(&g.b, 16);
        bb_zeros(&g.b, 16);
        /* 2^40 is a valid power of two, but then the data section lies beyond the file. */
        expect("alignment", &g.b, al[i].want,
               al[i].want == KILN_OK ? NULL : (al[i].type == 10 ? "data section" : "alignment"));
        bb_free(&g.b);
    }

    /* Tensor infos. */
    uint64_t ne4[4] = {4, 1, 1, 1};
    one_tensor(&g, 0, ne4, 0, 0, 16);
    expect("n_dims 0", &g.b, KILN_ERR_FORMAT, "n_dims");
    bb_free(&g.b);
    uint64_t ne5[5] = {4, 1, 1, 1, 1};
    one_tensor(&g, 5, ne5, 0, 0, 16);
    expect("n_dims 5", &g.b, KILN_ERR_FORMAT, "n_dims");
    bb_free(&g.b);
    uint64_t ne0[2] = {4, 0};
    one_tensor(&g, 2, ne0, 0, 0, 16);
    expect("ne 0", &g.b, KILN_ERR_FORMAT, "ne[1]");
    bb_free(&g.b);
    uint64_t neg[2] = {4, (uint64_t)-4};
    one_tensor(&g, 2, neg, 0, 0, 16);
    expect("ne negative", &g.b, KILN_ERR_FORMAT, "ne[1]");
    bb_free(&g.b);
    uint64_t big[4] = {1ull << 40, 1ull << 40, 1ull << 40, 2};
    one_tensor(&g, 4, big, 0, 0, 16);
    expect("nbytes overflow", &g.b, KILN_ERR_FORMAT, "overflows");
    bb_free(&g.b);
    uint64_t huge[2] = {1ull << 30, 1ull << 30};
    one_tensor(&g, 2, huge, 0, 0, 16);
    expect("huge tensor", &g.b, KILN_ERR_FORMAT, "extends beyond end of file");
    bb_free(&g.b);
    uint64_t q[2] = {48, 2};
    one_tensor(&g, 2, q, 8, 0, 34 * 4);
    expect("q8_0 ne0 48", &g.b, KILN_ERR_FORMAT, "block size");
    bb_free(&g.b);
    q[0] = 64;
    one_tensor(&g, 2, q, 8, 0, 34 * 4);
    expect("q8_0 ok", &g.b, KILN_OK, NULL);
    bb_free(&g.b);
    one_tensor(&g, 1, ne4, 0, 16, 64);
    expect("misaligned offset", &g.b, KILN_ERR_FORMAT, "multiple of the alignment");
    bb_free(&g.b);
    one_tensor(&g, 1, ne4, 0, 64, 64);
    expect("offset past end", &g.b, KILN_ERR_FORMAT, "extends beyond end of file");
    bb_free(&g.b);
    one_tensor(&g, 1, ne4, 0, 0, 15);
    expect("data one byte short", &g.b, KILN_ERR_FORMAT, "tensor 't': data [offset");
    bb_free(&g.b);
    one_tensor(&g, 1, ne4, 3, 0, 64);
    expect("q4_1", &g.b, KILN_ERR_UNSUPPORTED, "tensor 't'");
    bb_free(&g.b);
    one_tensor(&g, 1, ne4, 0xFFFFFFFFu, 0, 64);
    expect("dtype max", &g.b, KILN_ERR_UNSUPPORTED, "4294967295");
    bb_free(&g.b);
    /* Infos end, but the data section (aligned) lies beyond the file. */
    memset(&g, 0, sizeof g);
    gb_header(&g, 3, 1, 0);
    gb_tensor(&g, "t", 1, ne4, 0, 0);
    expect("no data section", &g.b, KILN_ERR_FORMAT, "data section");
    bb_free(&g.b);
    /* A vocab-only file ends right after its metadata: fine. */
    memset(&g, 0, sizeof g);
    gb_header(&g, 3, 0, 1);
    gb_kv_str(&g, "x", "y");
    expect("vocab only", &g.b, KILN_OK, NULL);
    bb_free(&g.b);
}

/* Tiny hand-made images (hex), each with its expected status. The fuzz target
 * tests/fuzz/fuzz_gguf.c found no crash so far (6.6M runs); any input it ever finds
 * belongs here as a regression case. */
static void test_tiny_images(void) {
    static const struct {
        const char *hex;
        kiln_status want;
    } cases[] = {
        {"47475546", KILN_ERR_FORMAT},                                 /* magic only */
        {"4747554603000000", KILN_ERR_FORMAT},                         /* no counts */
        {"474755460300000000000000000000000000000000000000", KILN_OK}, /* empty v3 */
        {"47475546010000000000000000000000", KILN_OK},                 /* empty v1 */
        {"474755460100000000000000000000", KILN_ERR_FORMAT},           /* v1, 1 byte short */
        /* one kv "a": array of arrays, count 1, then the inner array header cut short */
        {"4747554603000000000000000000000001000000000000000100000000000000610900000009000000"
         "0100000000000000",
         KILN_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bb b = {0};
        const char *h = cases[i].hex;
        for (size_t k = 0; h[k] && h[k + 1]; k += 2) {
            unsigned x;
            sscanf(h + k, "%2x", &x);
            bb_u8(&b, (uint8_t)x);
        }
        kiln_error e;
        kiln_status s = parse_copy(b.p, b.n, &e);
        CHECKF(s == cases[i].want, "tiny image %zu: status %d: %s", i, s, e.message);
        bb_free(&b);
    }
}

int main(void) {
    test_synthetic();
    test_tiny_images();
    const char *v3 = "models/stories260K/stories260K-f32.gguf";
    kiln_test_require_file(kiln_test_shared(v3));
    test_real_file(v3);
    test_real_file("models/stories260K/stories260K-f32-gguf-v1.gguf");
    test_real_file("models/llama2xs-260K/llama2xs-Q4_0.gguf");
    return kiln_test_finish("test_gguf_bad_input");
}
