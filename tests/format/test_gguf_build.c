/*
 * test_gguf_build - GGUF files written by hand (tests/format/gguf_builder.h, following the
 * GGUF spec) read back exactly: every metadata type, arrays of strings, nested arrays,
 * a custom general.alignment, versions 1, 2 and 3, typed getters.
 */
#include <math.h>

#include "test.h"
#include "gguf_builder.h"
#include "format/gguf.h"

#define N_KV 20

/* Writes the same content in `version` with alignment `align` (0 = default, no key). */
static void build(gb *g, uint32_t version, uint32_t align) {
    memset(g, 0, sizeof *g);
    gb_header(g, version, 3, N_KV + (align ? 1 : 0));
    gb_key(g, "t.u8", 0);
    bb_u8(&g->b, 0xAB);
    gb_key(g, "t.i8", 1);
    bb_u8(&g->b, (uint8_t)(int8_t)-5);
    gb_key(g, "t.u16", 2);
    bb_u16(&g->b, 0xBEEF);
    gb_key(g, "t.i16", 3);
    bb_u16(&g->b, (uint16_t)(int16_t)-30000);
    gb_kv_u32(g, "t.u32", 4000000000u);
    gb_key(g, "t.i32", 5);
    bb_u32(&g->b, (uint32_t)(int32_t)-2000000000);
    gb_key(g, "t.f32", 6);
    bb_f32(&g->b, 0.15625f);
    gb_key(g, "t.bool", 7);
    bb_u8(&g->b, 1);
    gb_kv_str(g, "t.str", "h\xc3\xa9llo");
    gb_key(g, "t.strnul", 8);
    gb_strn(g, "a\0b", 3);
    gb_key(g, "t.u64", 10);
    bb_u64(&g->b, 0xFEDCBA9876543210ull);
    gb_key(g, "t.i64", 11);
    bb_u64(&g->b, (uint64_t)INT64_MIN);
    gb_key(g, "t.f64", 12);
    bb_f64(&g->b, -1.0 / 3.0);
    gb_key(g, "t.arr_i16", 9);
    gb_arr(g, 3, 3);
    bb_u16(&g->b, 1);
    bb_u16(&g->b, (uint16_t)(int16_t)-2);
    bb_u16(&g->b, 300);
    gb_key(g, "t.arr_str", 9);
    gb_arr(g, 8, 3);
    gb_str(g, "zero");
    gb_str(g, "");
    gb_str(g, "two");
    gb_key(g, "t.arr_empty", 9);
    gb_arr(g, 12, 0);
    /* [[["a","b"],["c"]],[]] : arrays of arrays of arrays of strings */
    gb_key(g, "t.nested", 9);
    gb_arr(g, 9, 2);
    gb_arr(g, 9, 2);
    gb_arr(g, 8, 2);
    gb_str(g, "a");
    gb_str(g, "b");
    gb_arr(g, 8, 1);
    gb_str(g, "c");
    gb_arr(g, 9, 0);
    gb_key(g, "t.arr_bool", 9);
    gb_arr(g, 7, 2);
    bb_u8(&g->b, 0);
    bb_u8(&g->b, 1);
    gb_key(g, "t.arr_f64", 9);
    gb_arr(g, 12, 2);
    bb_f64(&g->b, 2.5);
    bb_f64(&g->b, -0.0);
    gb_key(g, "t.neg_i32", 5);
    bb_u32(&g->b, (uint32_t)-7);
    if (align) gb_kv_u32(g, "general.alignment", align);
    uint32_t a = align ? align : 32;
    /* Tensors: f32 [5, 3], f16 [4], q8_0 [64, 2]; offsets are multiples of the alignment. */
    uint64_t ne_a[2] = {5, 3}, ne_b[1] = {4}, ne_c[2] = {64, 2};
    uint64_t off_a = 0, off_b = (60 + a - 1) / a * a, off_c = (off_b + 8 + a - 1) / a * a;
    gb_tensor(g, "a.f32", 2, ne_a, 0, off_a);
    gb_tensor(g, "b.f16", 1, ne_b, 1, off_b);
    gb_tensor(g, "c.q8_0", 2, ne_c, 8, off_c);
    bb_pad_to(&g->b, a);
    size_t data = g->b.n;
    for (int i = 0; i < 15; i++) bb_f32(&g->b, (float)i * 0.5f);
    while (g->b.n < data + off_b) bb_u8(&g->b, 0);
    for (int i = 0; i < 4; i++) bb_u16(&g->b, (uint16_t)(0x3C00 + i));
    while (g->b.n < data + off_c) bb_u8(&g->b, 0);
    for (int i = 0; i < 2 * 2 * 34; i++) bb_u8(&g->b, (uint8_t)i);
}

static const kiln_gguf_value *val(const kiln_gguf *g, const char *key) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    CHECKF(kv != NULL, "missing %s", key);
    static kiln_gguf_value none;
    return kv ? &kv->value : &none;
}

static bool sv(const kiln_gguf_str *s, const char *want, size_t n) {
    return s->len == n && memcmp(s->data, want, n) == 0 && s->data[n] == '\0';
}

static void check_content(const kiln_gguf *g, uint32_t align) {
    const kiln_gguf_value *v;
    CHECK(g->n_kv == N_KV + (align ? 1u : 0u));
    v = val(g, "t.u8");
    CHECK(v->type == KILN_GGUF_UINT8 && v->u64 == 0xAB);
    v = val(g, "t.i8");
    CHECK(v->type == KILN_GGUF_INT8 && v->i64 == -5);
    v = val(g, "t.u16");
    CHECK(v->type == KILN_GGUF_UINT16 && v->u64 == 0xBEEF);
    v = val(g, "t.i16");
    CHECK(v->type == KILN_GGUF_INT16 && v->i64 == -30000);
    v = val(g, "t.u32");
    CHECK(v->type == KILN_GGUF_UINT32 && v->u64 == 4000000000u);
    v = val(g, "t.i32");
    CHECK(v->type == KILN_GGUF_INT32 && v->i64 == -2000000000);
    v = val(g, "t.f32");
    CHECK(v->type == KILN_GGUF_FLOAT32 && v->f64 == 0.15625);
    v = val(g, "t.bool");
    CHECK(v->type == KILN_GGUF_BOOL && v->b);
    v = val(g, "t.str");
    CHECK(v->type == KILN_GGUF_STRING && sv(&v->str, "h\xc3\xa9llo", 6));
    v = val(g, "t.strnul");
    CHECK(v->type == KILN_GGUF_STRING && sv(&v->str, "a\0b", 3));
    v = val(g, "t.u64");
    CHECK(v->type == KILN_GGUF_UINT64 && v->u64 == 0xFEDCBA9876543210ull);
    v = val(g, "t.i64");
    CHECK(v->type == KILN_GGUF_INT64 && v->i64 == INT64_MIN);
    v = val(g, "t.f64");
    CHECK(v->type == KILN_GGUF_FLOAT64 && v->f64 == -1.0 / 3.0);
    v = val(g, "t.arr_i16");
    CHECK(v->type == KILN_GGUF_ARRAY && v->arr.elem_type == KILN_GGUF_INT16 && v->arr.n == 3);
    if (v->arr.n == 3) {
        const int16_t *a = v->arr.data;
        CHECK(a[0] == 1 && a[1] == -2 && a[2] == 300);
    }
    v = val(g, "t.arr_str");
    CHECK(v->type == KILN_GGUF_ARRAY && v->arr.elem_type == KILN_GGUF_STRING && v->arr.n == 3);
    if (v->arr.n == 3) {
        const kiln_gguf_str *s = v->arr.data;
        CHECK(sv(&s[0], "zero", 4) && sv(&s[1], "", 0) && sv(&s[2], "two", 3));
    }
    v = val(g, "t.arr_empty");
    CHECK(v->type == KILN_GGUF_ARRAY && v->arr.elem_type == KILN_GGUF_FLOAT64 && v->arr.n == 0);
    v = val(g, "t.nested");
    CHECK(v->type == KILN_GGUF_ARRAY && v->arr.elem_type == KILN_GGUF_ARRAY && v->arr.n == 2);
    if (v->arr.n == 2) {
        const kiln_gguf_value *o = v->arr.data;
        CHECK(o[0].type == KILN_GGUF_ARRAY && o[0].arr.elem_type == KILN_GGUF_ARRAY &&
              o[0].arr.n == 2);
        CHECK(o[1].type == KILN_GGUF_ARRAY && o[1].arr.elem_type == KILN_GGUF_ARRAY &&
              o[1].arr.n == 0);
        if (o[0].arr.n == 2) {
            const kiln_gguf_value *in = o[0].arr.data;
            CHECK(in[0].arr.elem_type == KILN_GGUF_STRING && in[0].arr.n == 2);
            CHECK(in[1].arr.elem_type == KILN_GGUF_STRING && in[1].arr.n == 1);
            if (in[0].arr.n == 2 && in[1].arr.n == 1) {
                const kiln_gguf_str *s0 = in[0].arr.data, *s1 = in[1].arr.data;
                CHECK(sv(&s0[0], "a", 1) && sv(&s0[1], "b", 1) && sv(&s1[0], "c", 1));
            }
        }
    }
    v = val(g, "t.arr_bool");
    CHECK(v->arr.elem_type == KILN_GGUF_BOOL && v->arr.n == 2);
    if (v->arr.n == 2) CHECK(((const uint8_t *)v->arr.data)[1] == 1);
    v = val(g, "t.arr_f64");
    CHECK(v->arr.elem_type == KILN_GGUF_FLOAT64 && v->arr.n == 2);
    if (v->arr.n == 2) {
        const double *d = v->arr.data;
        CHECK(d[0] == 2.5 && d[1] == 0.0 && signbit(d[1]));
    }

    /* Typed getters. */
    int64_t i64 = 42;
    uint32_t u32 = 42;
    float f = 0;
    bool b = false;
    CHECK(kiln_gguf_get_i64(g, "t.i8", &i64) && i64 == -5);
    CHECK(kiln_gguf_get_i64(g, "t.u32", &i64) && i64 == 4000000000ll);
    i64 = 42;
    CHECK(!kiln_gguf_get_i64(g, "t.u64", &i64) && i64 == 42); /* > INT64_MAX: untouched */
    CHECK(kiln_gguf_get_i64(g, "t.bool", &i64) && i64 == 1);
    CHECK(!kiln_gguf_get_i64(g, "t.f32", &i64));
    CHECK(!kiln_gguf_get_i64(g, "t.str", &i64));
    CHECK(kiln_gguf_get_u32(g, "t.u16", &u32) && u32 == 0xBEEF);
    u32 = 42;
    CHECK(!kiln_gguf_get_u32(g, "t.neg_i32", &u32) && u32 == 42);
    CHECK(!kiln_gguf_get_u32(g, "t.u64", &u32) && u32 == 42);
    CHECK(!kiln_gguf_get_u32(g, "absent", &u32) && u32 == 42);
    CHECK(kiln_gguf_get_f32(g, "t.f64", &f) && f == (float)(-1.0 / 3.0));
    CHECK(kiln_gguf_get_f32(g, "t.i16", &f) && f == -30000.0f);
    CHECK(!kiln_gguf_get_f32(g, "t.arr_f64", &f));
    CHECK(kiln_gguf_get_bool(g, "t.bool", &b) && b);
    CHECK(!kiln_gguf_get_bool(g, "t.str", &b));
    CHECK(kiln_gguf_get_str(g, "t.u8") == NULL && kiln_gguf_get_str(g, "t.str") != NULL);
    CHECK(kiln_gguf_get_arr(g, "t.str") == NULL && kiln_gguf_get_arr(g, "t.nested") != NULL);

    /* Tensors and alignment. */
    uint32_t a = align ? align : 32;
    CHECK(g->alignment == a);
    CHECK(g->data_offset % a == 0 && ((uintptr_t)g->base + g->data_offset) % 1 == 0);
    CHECK(g->n_tensors == 3);
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, "a.f32");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_F32 && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 &&
          t->ne[2] == 1 && t->ne[3] == 1 && t->nbytes == 60 && t->offset == 0);
    CHECK((const uint8_t *)t->data == (const uint8_t *)g->base + g->data_offset);
    float x;
    memcpy(&x, (const uint8_t *)t->data + 7 * 4, 4);
    CHECK(x == 3.5f);
    t = kiln_gguf_find_tensor(g, "b.f16");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_F16 && t->nbytes == 8 && t->offset % a == 0);
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 6, 2);
    CHECK(h == 0x3C03);
    t = kiln_gguf_find_tensor(g, "c.q8_0");
    REQUIRE(t);
    CHECK(t->dtype == KILN_DTYPE_Q8_0 && t->nbytes == 2 * 2 * 34);
    CHECK(((const uint8_t *)t->data)[135] == 135);
    CHECK((const uint8_t *)t->data + t->nbytes == (const uint8_t *)g->base + g->size);
}

int main(void) {
    const uint32_t versions[] = {1, 2, 3};
    const uint32_t aligns[] = {0, 64, 8, 1};
    for (size_t vi = 0; vi < 3; vi++) {
        for (size_t ai = 0; ai < 4; ai++) {
            gb g;
            build(&g, versions[vi], aligns[ai]);
            kiln_gguf *r = NULL;
            kiln_error e = {0};
            kiln_status s = kiln_gguf_open_memory(g.b.p, g.b.n, "built.gguf", &r, &e);
            CHECKF(s == KILN_OK, "v%u align %u: %s", versions[vi], aligns[ai], e.message);
            if (s == KILN_OK) {
                CHECK(r->version == versions[vi]);
                check_content(r, aligns[ai]);
                kiln_gguf_close(r);
            }
            bb_free(&g.b);
        }
    }
    /* The same through a file on disk. */
    gb g;
    build(&g, 2, 64);
    const char *dir = make_tmpdir("gguf-build");
    char path[600];
    snprintf(path, sizeof path, "%s/v2.gguf", dir);
    REQUIRE(write_whole(path, g.b.p, g.b.n) == 0);
    kiln_gguf *r = NULL;
    kiln_error e = {0};
    CHECKF(kiln_gguf_open(path, &r, &e) == KILN_OK, "%s", e.message);
    if (r) {
        CHECK(r->version == 2 && r->owned_map != NULL && strcmp(r->path, path) == 0);
        check_content(r, 64);
        kiln_gguf_close(r);
    }
    bb_free(&g.b);
    rm_rf(dir);
    return kiln_test_finish("test_gguf_build");
}
