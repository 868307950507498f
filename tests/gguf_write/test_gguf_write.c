/*
 * test_gguf_write - the GGUF v3 writer (src/format/gguf_write.c).
 *
 * Expectations come from the GGUF specification (ggml/docs/gguf.md): a file image built by
 * hand with the test byte builder (tests/format/fmt_util.h) must equal the writer's output
 * byte for byte; files are also read back with kiln's reader (written separately) and real
 * GGUF files from ../shared survive a metadata copy unchanged. Failure paths: a write to
 * /dev/full, a file-size limit (RLIMIT_FSIZE) in a child process, a directory as target,
 * missing tensor data; none may leave the target or the temporary file behind.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "format/fmt_util.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "test.h"

static const char *g_dir;

static char *path_in(const char *name) {
    static char buf[4][1024];
    static int slot;
    char *b = buf[slot++ & 3];
    snprintf(b, 1024, "%s/%s", g_dir, name);
    return b;
}

static bool exists(const char *p) {
    return access(p, F_OK) == 0;
}

/* a writer's temporary file for target (target + ".tmp" + a unique suffix) is present */
static bool tmp_exists(const char *target) {
    char dir[4096], pre[1024];
    const char *slash = strrchr(target, '/');
    size_t dl = slash ? (size_t)(slash - target) : 1;
    snprintf(dir, sizeof dir, "%.*s", (int)dl, slash ? target : ".");
    snprintf(pre, sizeof pre, "%s.tmp", slash ? slash + 1 : target);
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        found = strncmp(e->d_name, pre, strlen(pre)) == 0;
    closedir(d);
    return found;
}

static bool values_equal(const kiln_gguf_value *a, const kiln_gguf_value *b);

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
        if (a->arr.elem_type != KILN_GGUF_STRING && a->arr.elem_type != KILN_GGUF_ARRAY)
            return a->arr.n == 0 ||
                   memcmp(a->arr.data, b->arr.data, a->arr.n * scalar_bytes(a->arr.elem_type)) == 0;
        return true;
    case KILN_GGUF_FLOAT32:
        return (float)a->f64 == (float)b->f64;
    case KILN_GGUF_FLOAT64:
        return a->f64 == b->f64;
    case KILN_GGUF_BOOL:
        return a->b == b->b;
    case KILN_GGUF_INT8:
    case KILN_GGUF_INT16:
    case KILN_GGUF_INT32:
    case KILN_GGUF_INT64:
        return a->i64 == b->i64;
    default:
        return a->u64 == b->u64;
    }
}

/* ---- hand-built image (the spec, independently of the writer) ----------------------- */

static void bb_str(bb *b, const char *s, size_t n) {
    bb_u64(b, n);
    bb_bytes(b, s, n);
}
static void bb_key(bb *b, const char *k, uint32_t type) {
    bb_str(b, k, strlen(k));
    bb_u32(b, type);
}

/* Tensor data of the typed test: deterministic bytes. */
static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_next(&s);
}

typedef struct tdecl {
    const char *name;
    kiln_dtype dtype;
    uint32_t n_dims;
    int64_t ne[4];
    size_t nbytes;
} tdecl;

static const tdecl k_tensors[] = {
    {"a.f32", KILN_DTYPE_F32, 1, {3, 1, 1, 1}, 12},
    {"b.f16", KILN_DTYPE_F16, 2, {5, 3, 1, 1}, 30},
    {"c.q8_0", KILN_DTYPE_Q8_0, 2, {64, 2, 1, 1}, 4 * 34},
    {"d.q4_0", KILN_DTYPE_Q4_0, 3, {32, 1, 3, 1}, 3 * 18},
    {"e.q4_k", KILN_DTYPE_Q4_K, 1, {256, 1, 1, 1}, 144},
    {"f.q6_k", KILN_DTYPE_Q6_K, 4, {256, 1, 1, 2}, 2 * 210},
    {"g.bf16", KILN_DTYPE_BF16, 1, {7, 1, 1, 1}, 14},
    {"h.i32", KILN_DTYPE_I32, 2, {2, 2, 1, 1}, 16},
};
#define N_T (sizeof k_tensors / sizeof k_tensors[0])

/* Sets every metadata type on w and appends the same pairs, in the same order, to b. */
static void typed_metadata(kiln_gguf_writer *w, bb *b, uint64_t *n_kv) {
    kiln_error e = {0};
    *n_kv = 0;
#define KV(call, key, type, emit)                                                                  \
    do {                                                                                           \
        CHECKF(call == KILN_OK, "%s: %s", key, e.message);                                         \
        bb_key(b, key, type);                                                                      \
        emit;                                                                                      \
        (*n_kv)++;                                                                                 \
    } while (0)
    KV(kiln_gguf_writer_set_u32(w, "general.alignment", 64, &e), "general.alignment", 4,
       bb_u32(b, 64));
    KV(kiln_gguf_writer_set_u8(w, "t.u8", 255, &e), "t.u8", 0, bb_u8(b, 255));
    KV(kiln_gguf_writer_set_i8(w, "t.i8", -128, &e), "t.i8", 1, bb_u8(b, 0x80));
    KV(kiln_gguf_writer_set_u16(w, "t.u16", 65535, &e), "t.u16", 2, bb_u16(b, 65535));
    KV(kiln_gguf_writer_set_i16(w, "t.i16", -2, &e), "t.i16", 3, bb_u16(b, 0xFFFE));
    KV(kiln_gguf_writer_set_u32(w, "t.u32", 4000000000u, &e), "t.u32", 4, bb_u32(b, 4000000000u));
    KV(kiln_gguf_writer_set_i32(w, "t.i32", INT32_MIN, &e), "t.i32", 5, bb_u32(b, 0x80000000u));
    KV(kiln_gguf_writer_set_f32(w, "t.f32", 1.5e-5f, &e), "t.f32", 6, bb_f32(b, 1.5e-5f));
    KV(kiln_gguf_writer_set_bool(w, "t.bool", true, &e), "t.bool", 7, bb_u8(b, 1));
    KV(kiln_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo", &e), "t.str", 8,
       bb_str(b, "h\xc3\xa9llo", 6));
    KV(kiln_gguf_writer_set_u64(w, "t.u64", UINT64_MAX, &e), "t.u64", 10, bb_u64(b, UINT64_MAX));
    KV(kiln_gguf_writer_set_i64(w, "t.i64", INT64_MIN, &e), "t.i64", 11,
       bb_u64(b, 0x8000000000000000ull));
    KV(kiln_gguf_writer_set_f64(w, "t.f64", -0.1, &e), "t.f64", 12, bb_f64(b, -0.1));
    /* a string with an embedded NUL, through the generic setter */
    kiln_gguf_value sv = {.type = KILN_GGUF_STRING};
    sv.str.data = "a\0b";
    sv.str.len = 3;
    KV(kiln_gguf_writer_set(w, "t.str_nul", &sv, &e), "t.str_nul", 8, bb_str(b, "a\0b", 3));
    /* packed arrays of every scalar type */
    const uint8_t au8[] = {0, 1, 255};
    const int8_t ai8[] = {-128, 127};
    const uint16_t au16[] = {1, 65535};
    const int16_t ai16[] = {-32768};
    const uint32_t au32[] = {7, 8, 9};
    const int32_t ai32[] = {-1, 2, 6};
    const float af32[] = {0.5f, -2.0f};
    const uint8_t abool[] = {1, 0, 1};
    const uint64_t au64[] = {UINT64_MAX};
    const int64_t ai64[] = {-5, 5};
    const double af64[] = {1e300, -1e-300};
    struct {
        const char *key;
        kiln_gguf_type et;
        const void *data;
        uint64_t n;
    } arrs[] = {
        {"a.u8", KILN_GGUF_UINT8, au8, 3},     {"a.i8", KILN_GGUF_INT8, ai8, 2},
        {"a.u16", KILN_GGUF_UINT16, au16, 2},  {"a.i16", KILN_GGUF_INT16, ai16, 1},
        {"a.u32", KILN_GGUF_UINT32, au32, 3},  {"a.i32", KILN_GGUF_INT32, ai32, 3},
        {"a.f32", KILN_GGUF_FLOAT32, af32, 2}, {"a.bool", KILN_GGUF_BOOL, abool, 3},
        {"a.u64", KILN_GGUF_UINT64, au64, 1},  {"a.i64", KILN_GGUF_INT64, ai64, 2},
        {"a.f64", KILN_GGUF_FLOAT64, af64, 2}, {"a.empty", KILN_GGUF_INT32, NULL, 0},
    };
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        size_t es = scalar_bytes(arrs[i].et);
        KV(kiln_gguf_writer_set_array(w, arrs[i].key, arrs[i].et, arrs[i].data, arrs[i].n, &e),
           arrs[i].key, 9,
           (bb_u32(b, arrs[i].et), bb_u64(b, arrs[i].n),
            bb_bytes(b, arrs[i].data, es * arrs[i].n)));
    }
    const char *strs[] = {"<unk>", "", "\xe2\x96\x81the"};
    KV(kiln_gguf_writer_set_str_array(w, "a.str", strs, 3, &e), "a.str", 9,
       (bb_u32(b, 8), bb_u64(b, 3), bb_str(b, strs[0], 5), bb_str(b, strs[1], 0),
        bb_str(b, strs[2], 6)));
    /* nested: [[1, 2], []] of u32, and [[["x"]]] (three levels) */
    uint32_t in0[] = {1, 2};
    kiln_gguf_value inner[2] = {{.type = KILN_GGUF_ARRAY}, {.type = KILN_GGUF_ARRAY}};
    inner[0].arr.elem_type = KILN_GGUF_UINT32;
    inner[0].arr.n = 2;
    inner[0].arr.data = in0;
    inner[1].arr.elem_type = KILN_GGUF_UINT32;
    inner[1].arr.n = 0;
    kiln_gguf_value outer = {.type = KILN_GGUF_ARRAY};
    outer.arr.elem_type = KILN_GGUF_ARRAY;
    outer.arr.n = 2;
    outer.arr.data = inner;
    KV(kiln_gguf_writer_set(w, "a.nested", &outer, &e), "a.nested", 9,
       (bb_u32(b, 9), bb_u64(b, 2), bb_u32(b, 4), bb_u64(b, 2), bb_u32(b, 1), bb_u32(b, 2),
        bb_u32(b, 4), bb_u64(b, 0)));
    kiln_gguf_str xs = {"x", 1};
    kiln_gguf_value l3 = {.type = KILN_GGUF_ARRAY};
    l3.arr.elem_type = KILN_GGUF_STRING;
    l3.arr.n = 1;
    l3.arr.data = &xs;
    kiln_gguf_value l2 = {.type = KILN_GGUF_ARRAY};
    l2.arr.elem_type = KILN_GGUF_ARRAY;
    l2.arr.n = 1;
    l2.arr.data = &l3;
    kiln_gguf_value l1 = {.type = KILN_GGUF_ARRAY};
    l1.arr.elem_type = KILN_GGUF_ARRAY;
    l1.arr.n = 1;
    l1.arr.data = &l2;
    KV(kiln_gguf_writer_set(w, "a.nested3", &l1, &e), "a.nested3", 9,
       (bb_u32(b, 9), bb_u64(b, 1), bb_u32(b, 9), bb_u64(b, 1), bb_u32(b, 8), bb_u64(b, 1),
        bb_str(b, "x", 1)));
#undef KV
}

/* Declares k_tensors on w; returns their data (one malloc'd block per tensor). */
static uint8_t **typed_tensors(kiln_gguf_writer *w) {
    kiln_error e = {0};
    uint8_t **data = calloc(N_T, sizeof *data);
    for (size_t i = 0; i < N_T; i++) {
        const tdecl *t = &k_tensors[i];
        CHECKF(kiln_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, &e) == KILN_OK,
               "%s: %s", t->name, e.message);
        CHECK(kiln_gguf_writer_tensor_nbytes(w, i) == t->nbytes);
        data[i] = malloc(t->nbytes);
        fill_bytes(data[i], t->nbytes, 1000 + i);
    }
    return data;
}

static void test_typed_file(void) {
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    bb kvb = {0};
    uint64_t n_kv = 0;
    typed_metadata(w, &kvb, &n_kv);
    CHECK(kiln_gguf_writer_alignment(w) == 64);
    uint8_t **data = typed_tensors(w);

    /* expected image: header, kv, tensor infos, pad to 64, data each at a multiple of 64 */
    bb x = {0};
    bb_bytes(&x, "GGUF", 4);
    bb_u32(&x, 3);
    bb_u64(&x, N_T);
    bb_u64(&x, n_kv);
    bb_bytes(&x, kvb.p, kvb.n);
    uint64_t off = 0, offs[N_T];
    for (size_t i = 0; i < N_T; i++) {
        const tdecl *t = &k_tensors[i];
        bb_str(&x, t->name, strlen(t->name));
        bb_u32(&x, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) bb_u64(&x, (uint64_t)t->ne[d]);
        bb_u32(&x, (uint32_t)t->dtype);
        bb_u64(&x, off);
        offs[i] = off;
        off = (off + t->nbytes + 63) / 64 * 64;
    }
    bb_pad_to(&x, 64);
    size_t data_start = x.n;
    for (size_t i = 0; i < N_T; i++) {
        bb_bytes(&x, data[i], k_tensors[i].nbytes);
        bb_pad_to(&x, 64);
    }

    const char *out = path_in("typed.gguf");
    CHECKF(kiln_gguf_writer_write_file(w, out, (const void *const *)data, &e) == KILN_OK, "%s",
           e.message);
    CHECK(!tmp_exists(path_in("typed.gguf")));
    size_t sz = 0;
    uint8_t *got = read_whole(out, &sz);
    REQUIRE(got);
    CHECKF(sz == x.n, "file is %zu bytes, the hand-built image %zu", sz, x.n);
    if (sz == x.n) {
        size_t first = 0;
        while (first < sz && got[first] == x.p[first]) first++;
        CHECKF(first == sz, "first differing byte at offset %zu", first);
    }

    /* and kiln's reader agrees */
    kiln_gguf *g = NULL;
    CHECKF(kiln_gguf_open(out, &g, &e) == KILN_OK, "%s", e.message);
    if (g) {
        CHECK(g->version == 3 && g->alignment == 64 && g->n_kv == n_kv && g->n_tensors == N_T);
        CHECK(g->data_offset == data_start);
        for (size_t i = 0; i < g->n_kv; i++) {
            const kiln_gguf_value *mine = kiln_gguf_writer_get(w, g->kv[i].key);
            CHECKF(mine && values_equal(mine, &g->kv[i].value), "key %s differs", g->kv[i].key);
        }
        for (size_t i = 0; i < N_T; i++) {
            const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, k_tensors[i].name);
            CHECKF(t, "tensor %s missing", k_tensors[i].name);
            if (!t) continue;
            CHECK(t->dtype == k_tensors[i].dtype && t->n_dims == k_tensors[i].n_dims);
            for (int d = 0; d < 4; d++) CHECK(t->ne[d] == k_tensors[i].ne[d]);
            CHECK(t->offset == offs[i] && t->offset % 64 == 0);
            CHECK(t->nbytes == k_tensors[i].nbytes);
            CHECK(memcmp(t->data, data[i], t->nbytes) == 0);
        }
        kiln_gguf_close(g);
    }

    /* streaming the same data in 7-byte chunks (spanning tensors) gives the same file */
    kiln_gguf_writer *w2 = NULL;
    REQUIRE(kiln_gguf_writer_create(&w2, &e) == KILN_OK);
    bb dummy = {0};
    typed_metadata(w2, &dummy, &n_kv);
    uint8_t **data2 = typed_tensors(w2);
    bb all = {0};
    for (size_t i = 0; i < N_T; i++) bb_bytes(&all, data2[i], k_tensors[i].nbytes);
    const char *out2 = path_in("typed2.gguf");
    REQUIRE(kiln_gguf_writer_begin(w2, out2, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_set_u32(w2, "late", 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_add_tensor(w2, "late", KILN_DTYPE_F32, 1, (int64_t[]){1}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(tmp_exists(path_in("typed2.gguf")) && !exists(out2));
    for (size_t at = 0; at < all.n; at += 7) {
        size_t n = all.n - at < 7 ? all.n - at : 7;
        CHECKF(kiln_gguf_writer_write_data(w2, all.p + at, n, &e) == KILN_OK, "%s", e.message);
    }
    /* one byte more than declared is refused */
    CHECK(kiln_gguf_writer_write_data(w2, "x", 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECKF(kiln_gguf_writer_finish(w2, &e) == KILN_OK, "%s", e.message);
    size_t sz2 = 0;
    uint8_t *got2 = read_whole(out2, &sz2);
    CHECK(got2 && sz2 == sz && memcmp(got2, got, sz) == 0);
    CHECK(!tmp_exists(path_in("typed2.gguf")));
    free(got2);
    for (size_t i = 0; i < N_T; i++) free(data2[i]);
    free(data2);
    bb_free(&all);
    bb_free(&dummy);
    kiln_gguf_writer_destroy(w2);

    free(got);
    for (size_t i = 0; i < N_T; i++) free(data[i]);
    free(data);
    bb_free(&x);
    bb_free(&kvb);
    kiln_gguf_writer_destroy(w);
}

/* Default alignment: no general.alignment key, offsets multiples of 32. */
static void test_default_alignment(void) {
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_alignment(w) == 32);
    float a[5] = {1, 2, 3, 4, 5}, b[3] = {6, 7, 8};
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){5}, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "b", KILN_DTYPE_F32, 1, (int64_t[]){3}, &e) == KILN_OK);
    /* replacing a key keeps one pair, at its first position, with the new value */
    CHECK(kiln_gguf_writer_set_str(w, "k1", "old", &e) == KILN_OK);
    CHECK(kiln_gguf_writer_set_u32(w, "k2", 2, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_set_str(w, "k1", "new", &e) == KILN_OK);
    CHECK(kiln_gguf_writer_remove(w, "k2") && !kiln_gguf_writer_remove(w, "k2"));
    const char *out = path_in("plain.gguf");
    const void *data[] = {a, b};
    CHECKF(kiln_gguf_writer_write_file(w, out, data, &e) == KILN_OK, "%s", e.message);
    kiln_gguf *g = NULL;
    CHECKF(kiln_gguf_open(out, &g, &e) == KILN_OK, "%s", e.message);
    if (g) {
        CHECK(g->alignment == 32 && g->n_kv == 1 && !kiln_gguf_find(g, "general.alignment"));
        const kiln_gguf_str *s = kiln_gguf_get_str(g, "k1");
        CHECK(s && s->len == 3 && memcmp(s->data, "new", 3) == 0);
        const kiln_gguf_tensor *tb = kiln_gguf_find_tensor(g, "b");
        CHECK(tb && tb->offset == 32 && memcmp(tb->data, b, sizeof b) == 0);
        CHECK(g->data_offset % 32 == 0 && g->size == g->data_offset + 64);
        kiln_gguf_close(g);
    }
    kiln_gguf_writer_destroy(w);
}

static void test_bad_arguments(void) {
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_set_u32(w, "", 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_gguf_value v = {.type = KILN_GGUF_UINT8, .u64 = 256};
    CHECK(kiln_gguf_writer_set(w, "x", &v, &e) == KILN_ERR_INVALID_ARGUMENT);
    v = (kiln_gguf_value){.type = KILN_GGUF_INT16, .i64 = -40000};
    CHECK(kiln_gguf_writer_set(w, "x", &v, &e) == KILN_ERR_INVALID_ARGUMENT);
    v = (kiln_gguf_value){.type = (kiln_gguf_type)13};
    CHECK(kiln_gguf_writer_set(w, "x", &v, &e) == KILN_ERR_INVALID_ARGUMENT);
    const uint8_t bad_bool[] = {0, 2};
    CHECK(kiln_gguf_writer_set_array(w, "x", KILN_GGUF_BOOL, bad_bool, 2, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_set_array(w, "x", KILN_GGUF_STRING, bad_bool, 2, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_set_u32(w, "general.alignment", 48, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_set_str(w, "general.alignment", "32", &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_set_i32(w, "general.alignment", -32, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_alignment(w) == 32 && !kiln_gguf_writer_get(w, "general.alignment"));
    /* arrays nested 9 levels are refused (the reader's limit is 8) */
    kiln_gguf_value lv[9];
    for (int i = 0; i < 9; i++) {
        lv[i] = (kiln_gguf_value){.type = KILN_GGUF_ARRAY};
        lv[i].arr.elem_type = i == 8 ? KILN_GGUF_UINT8 : KILN_GGUF_ARRAY;
        lv[i].arr.n = i == 8 ? 0 : 1;
        lv[i].arr.data = i == 8 ? NULL : &lv[i + 1];
    }
    CHECK(kiln_gguf_writer_set(w, "deep", &lv[0], &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_set(w, "deep8", &lv[1], &e) == KILN_OK);
    CHECK(!kiln_gguf_writer_get(w, "x") && !kiln_gguf_writer_get(w, "deep"));

    char long_name[65];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    CHECK(kiln_gguf_writer_add_tensor(w, long_name, KILN_DTYPE_F32, 1, (int64_t[]){1}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    long_name[63] = '\0';
    CHECK(kiln_gguf_writer_add_tensor(w, long_name, KILN_DTYPE_F32, 1, (int64_t[]){1}, &e) ==
          KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, long_name, KILN_DTYPE_F32, 1, (int64_t[]){1}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_add_tensor(w, "t", KILN_DTYPE_Q8_0, 2, (int64_t[]){48, 2}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_add_tensor(w, "t", KILN_DTYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_add_tensor(w, "t", KILN_DTYPE_F32, 2, (int64_t[]){4, 0}, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_add_tensor(w, "t", (kiln_dtype)3, 1, (int64_t[]){32}, &e) ==
          KILN_ERR_UNSUPPORTED);
    CHECK(kiln_gguf_writer_add_tensor(w, "t", KILN_DTYPE_F32, 4,
                                      (int64_t[]){INT64_MAX, INT64_MAX, 2, 2},
                                      &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_n_tensors(w) == 1);
    /* write_data / finish before begin */
    CHECK(kiln_gguf_writer_write_data(w, "x", 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_gguf_writer_finish(w, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_gguf_writer_destroy(w);
    kiln_gguf_writer_destroy(NULL);
}

/* Missing tensor data at finish, abandoning a writer, and a directory target: no file left. */
static void test_incomplete_and_abandoned(void) {
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    float x[8] = {0};
    const char *out = path_in("incomplete.gguf");

    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){8}, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "b", KILN_DTYPE_F32, 1, (int64_t[]){8}, &e) == KILN_OK);
    REQUIRE(kiln_gguf_writer_begin(w, out, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_write_data(w, x, sizeof x, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_write_data(w, x, 5, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_finish(w, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECKF(msg_names(&e, "'b'"), "message should name tensor b: %s", e.message);
    CHECK(!exists(out) && !tmp_exists(path_in("incomplete.gguf")));
    CHECK(kiln_gguf_writer_write_data(w, x, 4, &e) == KILN_ERR_IO);
    kiln_gguf_writer_destroy(w);

    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){8}, &e) == KILN_OK);
    REQUIRE(kiln_gguf_writer_begin(w, out, &e) == KILN_OK);
    CHECK(tmp_exists(path_in("incomplete.gguf")));
    kiln_gguf_writer_destroy(w); /* abandoned */
    CHECK(!exists(out) && !tmp_exists(path_in("incomplete.gguf")));

    /* the target is a directory: the rename fails, the temporary file goes */
    const char *dir = path_in("adir");
    REQUIRE(mkdir(dir, 0700) == 0);
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){8}, &e) == KILN_OK);
    const void *d[] = {x};
    CHECK(kiln_gguf_writer_write_file(w, dir, d, &e) == KILN_ERR_IO);
    CHECK(!tmp_exists(path_in("adir")));
    kiln_gguf_writer_destroy(w);

    /* a directory that does not exist: cannot create */
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_write_file(w, path_in("nodir/x.gguf"), NULL, &e) == KILN_ERR_IO);
    kiln_gguf_writer_destroy(w);
}

/* A full device: /dev/full accepts the open and fails every write with ENOSPC. */
static void test_dev_full(void) {
    if (access("/dev/full", W_OK) != 0) {
        printf("note: /dev/full not writable here; skipping that case\n");
        return;
    }
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    CHECK(kiln_gguf_writer_set_str(w, "general.architecture", "llama", &e) == KILN_OK);
    static float big[1 << 16];
    CHECK(kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){1 << 16}, &e) ==
          KILN_OK);
    kiln_status st = kiln_gguf_writer_begin(w, "/dev/full", &e);
    if (st == KILN_OK) st = kiln_gguf_writer_write_data(w, big, sizeof big, &e);
    if (st == KILN_OK) st = kiln_gguf_writer_finish(w, &e);
    CHECKF(st == KILN_ERR_IO, "writing to /dev/full gave %s: %s", kiln_status_name(st), e.message);
    CHECK(strstr(e.message, "/dev/full") != NULL);
    CHECK(!tmp_exists("/dev/full"));
    CHECK(kiln_gguf_writer_finish(w, &e) == KILN_ERR_IO);
    kiln_gguf_writer_destroy(w);
}

/* A disk that fills up part way (RLIMIT_FSIZE in a child): KILN_ERR_IO, the old file at the
 * target survives, no temporary file remains. */
static void test_size_limit(void) {
    const char *out = path_in("limited.gguf");
    REQUIRE(write_whole(out, "old", 3) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {64 * 1024, 64 * 1024};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        kiln_error e = {0};
        kiln_gguf_writer *w = NULL;
        if (kiln_gguf_writer_create(&w, &e) != KILN_OK) _exit(4);
        static float big[1 << 18]; /* 1 MiB */
        if (kiln_gguf_writer_add_tensor(w, "a", KILN_DTYPE_F32, 1, (int64_t[]){1 << 18}, &e))
            _exit(5);
        const void *d[] = {big};
        kiln_status st = kiln_gguf_writer_write_file(w, out, d, &e);
        kiln_gguf_writer_destroy(w);
        if (st == KILN_ERR_IO && strstr(e.message, "limited.gguf")) _exit(0);
        fprintf(stderr, "size-limited write gave %s: %s\n", kiln_status_name(st), e.message);
        _exit(1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    size_t n = 0;
    uint8_t *old = read_whole(out, &n);
    CHECK(old && n == 3 && memcmp(old, "old", 3) == 0);
    free(old);
    CHECK(!tmp_exists(path_in("limited.gguf")));
}

/* write_rows: quantized rows equal the reference quantizer's output for the same floats,
 * with and without a thread pool, across several chunks. */
typedef struct rowctx {
    int64_t ne0;
} rowctx;

static float row_value(int64_t row, int64_t i) {
    return sinf((float)(row * 131 + i) * 0.37f) * (1.0f + (float)(row % 7));
}

static void gen_row(void *ctx, int64_t row, float *out) {
    const rowctx *c = ctx;
    for (int64_t i = 0; i < c->ne0; i++) out[i] = row_value(row, i);
}

static void test_write_rows(void) {
    kiln_error e = {0};
    const int64_t ne0 = 512, rows = 20000; /* q8_0: 544 bytes a row, ~10.9 MB: two chunks */
    kiln_threadpool *tp = NULL;
    REQUIRE(kiln_threadpool_create(2, &tp, &e) == KILN_OK);
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(KILN_DTYPE_Q8_0);
    size_t rb = kiln_dtype_row_size(KILN_DTYPE_Q8_0, ne0);
    uint8_t *want = malloc((size_t)rows * rb);
    float *buf = malloc((size_t)ne0 * sizeof *buf);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < ne0; i++) buf[i] = row_value(r, i);
        tr->from_float(buf, want + (size_t)r * rb, ne0);
    }
    float f32row[4] = {1, 2, 3, 4};
    for (int pass = 0; pass < 2; pass++) {
        kiln_gguf_writer *w = NULL;
        REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
        CHECK(kiln_gguf_writer_add_tensor(w, "pre", KILN_DTYPE_F32, 1, (int64_t[]){4}, &e) == 0);
        CHECK(kiln_gguf_writer_add_tensor(w, "q", KILN_DTYPE_Q8_0, 2, (int64_t[]){ne0, rows}, &e) ==
              KILN_OK);
        const char *out = path_in(pass ? "rows_tp.gguf" : "rows.gguf");
        REQUIRE(kiln_gguf_writer_begin(w, out, &e) == KILN_OK);
        rowctx c = {ne0};
        /* not at a row boundary of 'q' yet: 'pre' is current and has 4 f32 per row */
        CHECK(kiln_gguf_writer_write_data(w, f32row, 2 * sizeof(float), &e) == KILN_OK);
        CHECK(kiln_gguf_writer_write_rows(w, gen_row, &c, 1, NULL, &e) ==
              KILN_ERR_INVALID_ARGUMENT);
        CHECK(kiln_gguf_writer_write_data(w, f32row + 2, 2 * sizeof(float), &e) == KILN_OK);
        CHECK(kiln_gguf_writer_write_rows(w, gen_row, &c, rows + 1, NULL, &e) ==
              KILN_ERR_INVALID_ARGUMENT);
        CHECKF(kiln_gguf_writer_write_rows(w, gen_row, &c, 7, pass ? tp : NULL, &e) == KILN_OK,
               "%s", e.message);
        CHECKF(kiln_gguf_writer_write_rows(w, gen_row, &c, rows - 7, pass ? tp : NULL, &e) ==
                   KILN_OK,
               "%s", e.message);
        CHECK(kiln_gguf_writer_write_rows(w, gen_row, &c, 1, NULL, &e) ==
              KILN_ERR_INVALID_ARGUMENT);
        CHECKF(kiln_gguf_writer_finish(w, &e) == KILN_OK, "%s", e.message);
        kiln_gguf_writer_destroy(w);
        kiln_gguf *g = NULL;
        CHECKF(kiln_gguf_open(out, &g, &e) == KILN_OK, "%s", e.message);
        if (g) {
            const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, "q");
            CHECK(t && t->nbytes == (size_t)rows * rb && memcmp(t->data, want, t->nbytes) == 0);
            const kiln_gguf_tensor *p = kiln_gguf_find_tensor(g, "pre");
            CHECK(p && memcmp(p->data, f32row, sizeof f32row) == 0);
            kiln_gguf_close(g);
        }
    }
    free(want);
    free(buf);
    kiln_threadpool_destroy(tp);
}

/* Every metadata pair of real llama.cpp files survives copy_kv + write + read unchanged. */
static void test_copy_real_files(void) {
    const char *files[] = {"tokenizer/ggml-vocab-llama-spm.gguf",
                           "models/llama2xs-260K/llama2xs-Q8_0.gguf"};
    for (size_t f = 0; f < 2; f++) {
        const char *src = kiln_test_shared(files[f]);
        if (access(src, R_OK) != 0) {
            printf("note: %s missing; copy case skipped\n", src);
            continue;
        }
        kiln_error e = {0};
        kiln_gguf *g = NULL;
        REQUIRE(kiln_gguf_open(src, &g, &e) == KILN_OK);
        kiln_gguf_writer *w = NULL;
        REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
        CHECKF(kiln_gguf_writer_copy_kv(w, g, NULL, &e) == KILN_OK, "%s", e.message);
        const void **data = calloc(g->n_tensors + 1, sizeof *data);
        for (size_t i = 0; i < g->n_tensors; i++) {
            const kiln_gguf_tensor *t = &g->tensors[i];
            CHECK(kiln_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, &e) == 0);
            data[i] = t->data;
        }
        const char *out = path_in("copy.gguf");
        CHECKF(kiln_gguf_writer_write_file(w, out, data, &e) == KILN_OK, "%s", e.message);
        kiln_gguf *h = NULL;
        CHECKF(kiln_gguf_open(out, &h, &e) == KILN_OK, "%s", e.message);
        if (h) {
            CHECK(h->n_kv == g->n_kv && h->n_tensors == g->n_tensors);
            for (size_t i = 0; i < g->n_kv && i < h->n_kv; i++)
                CHECKF(!strcmp(g->kv[i].key, h->kv[i].key) &&
                           values_equal(&g->kv[i].value, &h->kv[i].value),
                       "%s: key %s changed", files[f], g->kv[i].key);
            for (size_t i = 0; i < g->n_tensors && i < h->n_tensors; i++)
                CHECK(h->tensors[i].nbytes == g->tensors[i].nbytes &&
                      memcmp(h->tensors[i].data, g->tensors[i].data, g->tensors[i].nbytes) == 0);
            /* prefix copy */
            kiln_gguf_writer *w2 = NULL;
            REQUIRE(kiln_gguf_writer_create(&w2, &e) == KILN_OK);
            CHECK(kiln_gguf_writer_copy_kv(w2, g, "tokenizer.ggml.", &e) == KILN_OK);
            size_t want = 0;
            for (size_t i = 0; i < g->n_kv; i++)
                want += strncmp(g->kv[i].key, "tokenizer.ggml.", 15) == 0;
            CHECK(want > 0 && kiln_gguf_writer_get(w2, "tokenizer.ggml.tokens") &&
                  !kiln_gguf_writer_get(w2, "general.architecture"));
            kiln_gguf_writer_destroy(w2);
            kiln_gguf_close(h);
        }
        free(data);
        kiln_gguf_writer_destroy(w);
        kiln_gguf_close(g);
    }
}

/* general.file_type / general.quantization_version as llama.cpp writes them (llama.h's
 * llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15,
 * MOSTLY_Q6_K 18, MOSTLY_BF16 32; GGML_QNT_VERSION 2). */
static void test_file_type(void) {
    static const struct {
        kiln_dtype t;
        uint32_t ft;
        bool q;
    } cases[] = {
        {KILN_DTYPE_F32, 0, false},   {KILN_DTYPE_F16, 1, false},  {KILN_DTYPE_Q4_0, 2, true},
        {KILN_DTYPE_Q8_0, 7, true},   {KILN_DTYPE_Q4_K, 15, true}, {KILN_DTYPE_Q6_K, 18, true},
        {KILN_DTYPE_BF16, 32, false},
    };
    kiln_error e = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &e) == KILN_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(kiln_gguf_file_type(cases[i].t) == cases[i].ft);
        CHECK(kiln_gguf_writer_set_file_type(w, cases[i].t, &e) == KILN_OK);
        const kiln_gguf_value *ft = kiln_gguf_writer_get(w, "general.file_type");
        const kiln_gguf_value *qv = kiln_gguf_writer_get(w, "general.quantization_version");
        CHECK(ft && ft->type == KILN_GGUF_UINT32 && ft->u64 == cases[i].ft);
        CHECK(cases[i].q ? (qv && qv->type == KILN_GGUF_UINT32 && qv->u64 == 2) : !qv);
    }
    CHECK(kiln_gguf_file_type(KILN_DTYPE_I32) == UINT32_MAX);
    CHECK(kiln_gguf_writer_set_file_type(w, KILN_DTYPE_I32, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_gguf_writer_destroy(w);
}

int main(void) {
    g_dir = make_tmpdir("gguf-write");
    test_typed_file();
    test_default_alignment();
    test_bad_arguments();
    test_file_type();
    test_incomplete_and_abandoned();
    test_dev_full();
    test_size_limit();
    test_write_rows();
    test_copy_real_files();
    rm_rf(g_dir);
    return kiln_test_finish("test_gguf_write");
}
