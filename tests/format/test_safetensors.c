/*
 * test_safetensors - the safetensors reader on ../shared (shapes from shared/README.md and
 * each model's config.json), a sharded checkpoint built by this test from a real file
 * (2 shards + model.safetensors.index.json, compared tensor by tensor with the unsharded
 * read), directory arguments, and bad input: truncation, header lengths, JSON errors,
 * dtypes, shapes, offsets, bit flips.
 */
#include <jansson.h>

#include "test.h"
#include "fmt_util.h"
#include "format/safetensors.h"
#include "util/mapped_file.h"

#define NAME "bad.safetensors"

static kiln_safetensors *open_ok(const char *path) {
    kiln_safetensors *st = NULL;
    kiln_error e = {0};
    kiln_status s = kiln_safetensors_open(path, &st, &e);
    CHECKF(s == KILN_OK, "%s: %s", path, e.message);
    return st;
}

static bool shape_is(const kiln_st_tensor *t, int nd, int64_t a, int64_t b) {
    return t && t->n_dims == nd && t->shape[0] == a && (nd < 2 || t->shape[1] == b);
}

static void check_in_bounds(const kiln_safetensors *st) {
    for (size_t i = 0; i < st->n_tensors; i++) {
        const kiln_st_tensor *t = &st->tensors[i];
        CHECK(t->shard >= 0 && (size_t)t->shard < st->n_shards);
        const kiln_mapped_file *f = st->shards[t->shard];
        if (!f) continue;
        const uint8_t *b = f->data, *d = t->data;
        CHECKF(d >= b + 8 && t->nbytes <= f->size && d <= b + f->size - t->nbytes, "%s", t->name);
    }
}

static int64_t cfg_int(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static void test_reference_dirs(void) {
    static const char *archs[] = {"llama",   "llama3",    "mistral",    "qwen2",
                                  "qwen3",   "gemma2",    "gemma3",     "phi3",
                                  "mixtral", "qwen3_moe", "qwen3_next", "gpt2"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "reference/hf/%s/model.safetensors", archs[i]);
        const char *path = kiln_test_shared(rel);
        if (access(path, R_OK) != 0) {
            printf("note: %s missing, skipped\n", path);
            continue;
        }
        kiln_safetensors *st = open_ok(path);
        if (!st) continue;
        CHECK(st->n_shards == 1 && st->n_tensors > 10);
        check_in_bounds(st);
        /* transformers writes {"format": "pt"} metadata. */
        bool pt = false;
        for (size_t k = 0; k < st->n_meta; k++) {
            if (!strcmp(st->meta_keys[k], "format") && !strcmp(st->meta_values[k], "pt")) pt = 1;
        }
        CHECKF(pt, "%s: metadata format=pt", archs[i]);
        /* The embedding is [vocab_size, hidden_size] from config.json. */
        snprintf(rel, sizeof rel, "reference/hf/%s/config.json", archs[i]);
        json_t *cfg = json_load_file(kiln_test_shared(rel), 0, NULL);
        if (cfg) {
            json_t *tc = json_object_get(cfg, "text_config");
            json_t *c = json_is_object(tc) ? tc : cfg;
            int64_t vocab = cfg_int(c, "vocab_size");
            int64_t hidden = cfg_int(c, strcmp(archs[i], "gpt2") ? "hidden_size" : "n_embd");
            const kiln_st_tensor *emb =
                kiln_safetensors_find(st, strcmp(archs[i], "gpt2") ? "model.embed_tokens.weight"
                                                                   : "transformer.wte.weight");
            if (!emb) emb = kiln_safetensors_find(st, "model.language_model.embed_tokens.weight");
            CHECKF(emb && emb->dtype == KILN_DTYPE_F32 && shape_is(emb, 2, vocab, hidden) &&
                       emb->nbytes == (size_t)(vocab * hidden * 4),
                   "%s: embedding shape vs config (%lld x %lld)", archs[i], (long long)vocab,
                   (long long)hidden);
            json_decref(cfg);
        }
        /* The directory resolves to model.safetensors (not reference.safetensors). */
        snprintf(rel, sizeof rel, "reference/hf/%s", archs[i]);
        kiln_safetensors *sd = open_ok(kiln_test_shared(rel));
        if (sd) {
            CHECK(sd->n_tensors == st->n_tensors &&
                  strstr(sd->shard_paths[0], "model.safetensors"));
            kiln_safetensors_close(sd);
        }
        kiln_safetensors_close(st);

        /* reference.safetensors: README lists its four tensors. */
        snprintf(rel, sizeof rel, "reference/hf/%s/reference.safetensors", archs[i]);
        kiln_safetensors *r = open_ok(kiln_test_shared(rel));
        if (!r) continue;
        CHECK(r->n_tensors == 4);
        const kiln_st_tensor *t = kiln_safetensors_find(r, "input_ids");
        CHECK(shape_is(t, 1, 48, 0) && t->dtype == KILN_DTYPE_I32 && t->nbytes == 48 * 4);
        t = kiln_safetensors_find(r, "logits");
        CHECK(shape_is(t, 2, 48, 512) && t->dtype == KILN_DTYPE_F32);
        t = kiln_safetensors_find(r, "prompt_ids");
        CHECK(shape_is(t, 1, 16, 0) && t->dtype == KILN_DTYPE_I32);
        t = kiln_safetensors_find(r, "greedy_ids");
        CHECK(shape_is(t, 1, 24, 0) && t->dtype == KILN_DTYPE_I32);
        /* prompt_ids is the prefix of input_ids? Not guaranteed; but ids are < vocab 512. */
        const kiln_st_tensor *ids = kiln_safetensors_find(r, "input_ids");
        if (ids) {
            for (int k = 0; k < 48; k++) {
                int32_t id;
                memcpy(&id, (const uint8_t *)ids->data + 4 * k, 4);
                CHECK(id >= 0 && id < 512);
            }
        }
        CHECK(kiln_safetensors_find(r, "nope") == NULL);
        kiln_safetensors_close(r);
    }
}

static void test_golden(void) {
    static const char *files[] = {"llamacpp-stories260K-f32", "llamacpp-llama2xs-f32",
                                  "llamacpp-llama2xs-Q8_0", "llamacpp-llama2xs-Q4_0"};
    for (size_t i = 0; i < 4; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "golden/%s.safetensors", files[i]);
        if (access(kiln_test_shared(rel), R_OK) != 0) continue;
        kiln_safetensors *st = open_ok(kiln_test_shared(rel));
        if (!st) continue;
        /* README: input_ids [64] (I32) and logits [64, 512] (F32); the GGUF file in metadata. */
        CHECK(st->n_tensors == 2);
        CHECK(shape_is(kiln_safetensors_find(st, "input_ids"), 1, 64, 0));
        CHECK(kiln_safetensors_find(st, "input_ids")->dtype == KILN_DTYPE_I32);
        const kiln_st_tensor *l = kiln_safetensors_find(st, "logits");
        CHECK(shape_is(l, 2, 64, 512) && l->dtype == KILN_DTYPE_F32 && l->nbytes == 64 * 512 * 4);
        bool named = false;
        for (size_t k = 0; k < st->n_meta; k++) {
            if (!strcmp(st->meta_keys[k], "model_file") && strstr(st->meta_values[k], ".gguf"))
                named = true;
        }
        CHECK(named);
        check_in_bounds(st);
        kiln_safetensors_close(st);
    }
}

/* Writes a safetensors file holding tensors[idx[0..n)] of src (data copied). */
static void write_shard(const char *path, const kiln_safetensors *src, const size_t *idx,
                        size_t n) {
    json_t *hdr = json_object();
    size_t off = 0;
    static const char *dn[40] = {[KILN_DTYPE_F32] = "F32",
                                 [KILN_DTYPE_F16] = "F16",
                                 [KILN_DTYPE_BF16] = "BF16",
                                 [KILN_DTYPE_I32] = "I32"};
    for (size_t i = 0; i < n; i++) {
        const kiln_st_tensor *t = &src->tensors[idx[i]];
        json_t *shape = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(hdr, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", dn[t->dtype], "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *text = json_dumps(hdr, JSON_COMPACT);
    REQUIRE(text);
    bb b = {0};
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    bb_u64(&b, padded);
    bb_bytes(&b, text, hl);
    while (b.n < 8 + padded) bb_u8(&b, ' ');
    for (size_t i = 0; i < n; i++) {
        const kiln_st_tensor *t = &src->tensors[idx[i]];
        bb_bytes(&b, t->data, t->nbytes);
    }
    REQUIRE(write_whole(path, b.p, b.n) == 0);
    bb_free(&b);
    free(text);
    json_decref(hdr);
}

static void write_index(const char *path, const kiln_safetensors *src, const char *const *shard,
                        const size_t *which) {
    json_t *wm = json_object();
    for (size_t i = 0; i < src->n_tensors; i++) {
        json_object_set_new(wm, src->tensors[i].name, json_string(shard[which[i]]));
    }
    json_t *root =
        json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)0, "weight_map", wm);
    REQUIRE(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    json_decref(root);
}

static void expect_open(const char *path, kiln_status want, const char *sub) {
    kiln_safetensors *st = NULL;
    kiln_error e = {0};
    kiln_status s = kiln_safetensors_open(path, &st, &e);
    CHECKF(s == want, "%s: status %d: %s", path, s, e.message);
    if (s != KILN_OK) {
        CHECK(st == NULL && e.message[0]);
        if (sub) CHECKF(strstr(e.message, sub) != NULL, "'%s' not in '%s'", sub, e.message);
    }
    kiln_safetensors_close(st);
}

static void test_sharded(void) {
    const char *src_path = kiln_test_shared("reference/hf/llama/model.safetensors");
    if (access(src_path, R_OK) != 0) return;
    kiln_safetensors *src = open_ok(src_path);
    if (!src) return;
    const char *dir = make_tmpdir("st-shard");
    char d[512];
    snprintf(d, sizeof d, "%s", dir);
    /* Tensors alternate between the shards; shard 2 lives in a subdirectory. */
    const char *shard_names[2] = {"model-00001-of-00002.safetensors",
                                  "sub/model-00002-of-00002.safetensors"};
    char p[700];
    snprintf(p, sizeof p, "%s/sub", d);
    REQUIRE(mkdir(p, 0755) == 0);
    size_t n = src->n_tensors;
    size_t *which = calloc(n, sizeof *which), *idx[2], cnt[2] = {0, 0};
    idx[0] = calloc(n, sizeof(size_t));
    idx[1] = calloc(n, sizeof(size_t));
    REQUIRE(which && idx[0] && idx[1]);
    for (size_t i = 0; i < n; i++) {
        which[i] = i % 2;
        idx[which[i]][cnt[which[i]]++] = i;
    }
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/%s", d, shard_names[s]);
        write_shard(p, src, idx[s], cnt[s]);
    }
    char index[700];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", d);
    write_index(index, src, shard_names, which);

    for (int via_dir = 0; via_dir < 2; via_dir++) {
        kiln_safetensors *sh = open_ok(via_dir ? d : index);
        if (!sh) continue;
        CHECK(sh->n_shards == 2 && sh->n_tensors == n);
        CHECK(sh->n_meta == 1 && !strcmp(sh->meta_keys[0], "format"));
        check_in_bounds(sh);
        for (size_t i = 0; i < n; i++) {
            const kiln_st_tensor *a = &src->tensors[i];
            const kiln_st_tensor *b = kiln_safetensors_find(sh, a->name);
            CHECKF(b && b->dtype == a->dtype && b->n_dims == a->n_dims &&
                       !memcmp(b->shape, a->shape, sizeof a->shape) && b->nbytes == a->nbytes &&
                       !memcmp(b->data, a->data, a->nbytes) &&
                       strstr(sh->shard_paths[b->shard], shard_names[which[i]]) != NULL,
                   "sharded tensor %s differs", a->name);
        }
        kiln_safetensors_close(sh);
    }

    /* Broken indexes. */
    const char *wrong[2] = {shard_names[1], shard_names[0]};
    size_t *flip = calloc(n, sizeof *flip);
    REQUIRE(flip);
    memcpy(flip, which, n * sizeof *flip);
    flip[0] ^= 1;
    write_index(index, src, shard_names, flip);
    expect_open(index, KILN_ERR_FORMAT, src->tensors[0].name); /* tensor in the other shard */
    (void)wrong;
    const char *missing[2] = {shard_names[0], "nope.safetensors"};
    write_index(index, src, missing, which);
    expect_open(index, KILN_ERR_IO, "nope.safetensors");
    const char *escape[2] = {shard_names[0], "../x.safetensors"};
    write_index(index, src, escape, which);
    expect_open(index, KILN_ERR_FORMAT, "relative");
    const char *absolute[2] = {shard_names[0], "/etc/passwd"};
    write_index(index, src, absolute, which);
    expect_open(index, KILN_ERR_FORMAT, "relative");
    /* The same tensor in both shards. */
    size_t both[2] = {0, 1};
    snprintf(p, sizeof p, "%s/%s", d, shard_names[1]);
    write_shard(p, src, both, 2);
    size_t *which2 = calloc(n, sizeof *which2);
    REQUIRE(which2);
    which2[1] = 1;
    write_index(index, src, shard_names, which2);
    expect_open(index, KILN_ERR_FORMAT, "appears in both");
    REQUIRE(write_whole(index, "{\"weight_map\": ", 15) == 0);
    expect_open(index, KILN_ERR_FORMAT, "JSON");
    expect_open(d, KILN_ERR_FORMAT, NULL); /* the directory finds the broken index */
    REQUIRE(write_whole(index, "{\"weight_map\": {}}", 18) == 0);
    expect_open(index, KILN_ERR_FORMAT, "weight_map");

    /* Directories without an index. */
    remove(index);
    expect_open(d, KILN_OK, NULL); /* the lone *.safetensors file in d */
    snprintf(p, sizeof p, "%s/extra.safetensors", d);
    write_shard(p, src, both, 2);
    expect_open(d, KILN_ERR_NOT_FOUND, "model.safetensors.index.json"); /* which one? */
    char empty[700];
    snprintf(empty, sizeof empty, "%s/sub", d);
    expect_open(empty, KILN_OK, NULL); /* the lone *.safetensors in sub/ */
    snprintf(p, sizeof p, "%s/%s", d, shard_names[1]);
    remove(p);
    expect_open(empty, KILN_ERR_NOT_FOUND, NULL);
    expect_open("/nonexistent/model.safetensors", KILN_ERR_IO, "/nonexistent");

    free(which);
    free(which2);
    free(flip);
    free(idx[0]);
    free(idx[1]);
    rm_rf(d);
    kiln_safetensors_close(src);
}

/* ---- bad input ---- */

/* Parses an exact-size copy; on success checks bounds. */
static kiln_status parse_copy(const uint8_t *p, size_t n, kiln_error *e) {
    uint8_t *c = malloc(n ? n : 1);
    REQUIRE(c);
    if (n) memcpy(c, p, n);
    kiln_safetensors *st = NULL;
    memset(e, 0, sizeof *e);
    kiln_status s = kiln_safetensors_open_memory(c, n, NAME, &st, e);
    if (s == KILN_OK) {
        for (size_t i = 0; i < st->n_tensors; i++) {
            const kiln_st_tensor *t = &st->tensors[i];
            const uint8_t *d = t->data;
            CHECK(d >= c + 8 && t->nbytes <= n && d <= c + n - t->nbytes);
        }
        kiln_safetensors_close(st);
    } else {
        CHECK(st == NULL);
        CHECKF(msg_names(e, NAME), "%s", e->message);
        CHECKF(s == KILN_ERR_FORMAT || s == KILN_ERR_UNSUPPORTED, "%d %s", s, e->message);
    }
    free(c);
    return s;
}

/* A file with header JSON `json` and `data_bytes` of data. */
static void make(bb *b, const char *json, size_t data_bytes) {
    memset(b, 0, sizeof *b);
    bb_u64(b, strlen(json));
    bb_bytes(b, json, strlen(json));
    bb_zeros(b, data_bytes);
}

static void expect_json(const char *json, size_t data_bytes, kiln_status want, const char *sub) {
    bb b;
    make(&b, json, data_bytes);
    kiln_error e;
    kiln_status s = parse_copy(b.p, b.n, &e);
    CHECKF(s == want, "%s: status %d: %s", json, s, e.message);
    if (sub && s != KILN_OK) CHECKF(strstr(e.message, sub), "'%s' not in '%s'", sub, e.message);
    bb_free(&b);
}

static void test_bad_input(void) {
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, KILN_OK,
                NULL);
    expect_json("{}", 0, KILN_OK, NULL);
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, KILN_OK,
                NULL); /* a scalar */
    expect_json("{\"a\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[0,0]}}", 0, KILN_OK,
                NULL); /* empty */
    expect_json("{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16,
                KILN_ERR_UNSUPPORTED, "\"F64\"");
    expect_json("{\"a\":{\"dtype\":\"XYZ\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16,
                KILN_ERR_UNSUPPORTED, "XYZ");
    expect_json("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,16]}}", 16, KILN_ERR_FORMAT,
                "dtype");
    expect_json("{\"a\":{\"shape\":[2],\"data_offsets\":[0,16]}}", 16, KILN_ERR_FORMAT, "dtype");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                KILN_ERR_FORMAT, "shape[0]");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                KILN_ERR_FORMAT, "shape[0]");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12,
                KILN_ERR_FORMAT, "shape");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                KILN_ERR_FORMAT, "needs 12 bytes");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                KILN_ERR_FORMAT, "reversed");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7,
                KILN_ERR_FORMAT, "extend beyond");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                KILN_ERR_FORMAT, "data_offsets");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
                KILN_ERR_FORMAT, "data_offsets");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "18446744073709551615]}}",
                8, KILN_ERR_FORMAT, NULL);
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
                "\"data_offsets\":[0,0]}}",
                8, KILN_ERR_FORMAT, "more than");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                "\"data_offsets\":[0,0]}}",
                8, KILN_ERR_FORMAT, "more than"); /* 2^62 * 4 wraps to 0 */
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                4, KILN_ERR_UNSUPPORTED, "dimensions");
    expect_json("{\"a\":[1]}", 0, KILN_ERR_FORMAT, "not an object");
    expect_json("[1, 2]", 0, KILN_ERR_FORMAT, "not an object");
    expect_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                4, KILN_ERR_FORMAT, "duplicate");
    expect_json("{\"__metadata__\":{\"k\":1}}", 0, KILN_ERR_FORMAT, "__metadata__");
    expect_json("{\"__metadata__\":[]}", 0, KILN_ERR_FORMAT, "__metadata__");
    expect_json("{\"__metadata__\":{\"k\":\"v\",\"x\":\"\"}}", 0, KILN_OK, NULL);
    expect_json("{\"a\":", 0, KILN_ERR_FORMAT, "JSON");
    expect_json("{\"a\xff\":1}", 0, KILN_ERR_FORMAT, "JSON");
    expect_json("{\"a\\u0000b\":{}}", 0, KILN_ERR_FORMAT, NULL);
    expect_json("{}                                        ", 0, KILN_OK, NULL); /* padding */
    expect_json("{} x", 0, KILN_ERR_FORMAT, "JSON");
    expect_json("{", 0, KILN_ERR_FORMAT, "header length"); /* too short */

    bb b;
    kiln_error e;
    /* Header lengths: beyond the file, huge, zero; files shorter than 8 bytes. */
    make(&b, "{}", 0);
    put_u64_at(b.p, 0, 3);
    CHECK(parse_copy(b.p, b.n, &e) == KILN_ERR_FORMAT && strstr(e.message, "header length"));
    put_u64_at(b.p, 0, UINT64_MAX);
    CHECK(parse_copy(b.p, b.n, &e) == KILN_ERR_FORMAT && strstr(e.message, "header length"));
    put_u64_at(b.p, 0, 0);
    CHECK(parse_copy(b.p, b.n, &e) == KILN_ERR_FORMAT);
    for (size_t n = 0; n < 8; n++) CHECK(parse_copy(b.p, n, &e) == KILN_ERR_FORMAT);
    bb_free(&b);
    kiln_safetensors *st = (kiln_safetensors *)1;
    CHECK(kiln_safetensors_open_memory(NULL, 0, NULL, &st, &e) == KILN_ERR_FORMAT && !st);
    CHECK(msg_names(&e, "<memory>"));
    /* A header above the 100 MB cap is refused before it is parsed. */
    size_t big = 101u * 1024 * 1024 + 8;
    uint8_t *huge = calloc(1, big);
    REQUIRE(huge);
    put_u64_at(huge, 0, big - 8);
    huge[8] = '{';
    CHECK(kiln_safetensors_open_memory(huge, big, NAME, &st, &e) == KILN_ERR_FORMAT);
    CHECKF(strstr(e.message, "limit"), "%s", e.message);
    free(huge);

    /* Truncation of a real file at 20 points, and bit flips in its header. */
    const char *path = kiln_test_shared("reference/hf/llama/reference.safetensors");
    size_t n = 0;
    uint8_t *raw = read_whole(path, &n);
    if (raw) {
        CHECK(parse_copy(raw, n, &e) == KILN_OK);
        uint64_t hl;
        memcpy(&hl, raw, 8);
        for (int i = 0; i < 20; i++) {
            size_t cut = i < 10 ? (size_t)(i * (8 + hl) / 10) : n - 1 - (size_t)(i - 10) * (n / 11);
            CHECKF(parse_copy(raw, cut, &e) == KILN_ERR_FORMAT, "cut %zu: %s", cut, e.message);
        }
        uint64_t seed = 12345;
        int ok = 0, bad = 0;
        for (size_t bit = 0; bit < (8 + hl) * 8; bit += 3) {
            raw[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            if (parse_copy(raw, n, &e) == KILN_OK) {
                ok++;
            } else {
                bad++;
            }
            raw[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        for (int it = 0; it < 300; it++) {
            size_t at = (size_t)(rng_next(&seed) % (8 + hl));
            uint8_t old = raw[at];
            raw[at] = (uint8_t)rng_next(&seed);
            parse_copy(raw, n, &e);
            raw[at] = old;
        }
        printf("reference.safetensors header bit flips: %d read, %d rejected\n", ok, bad);
        CHECK(bad > 0);
        /* On disk. */
        const char *dir = make_tmpdir("st-bad");
        char p[640];
        snprintf(p, sizeof p, "%s/trunc.safetensors", dir);
        REQUIRE(write_whole(p, raw, n - 100) == 0);
        kiln_safetensors *s2 = NULL;
        CHECK(kiln_safetensors_open(p, &s2, &e) == KILN_ERR_FORMAT && msg_names(&e, p));
        snprintf(p, sizeof p, "%s/f64.safetensors", dir);
        const char *j = "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
        make(&b, j, 8);
        REQUIRE(write_whole(p, b.p, b.n) == 0);
        bb_free(&b);
        CHECK(kiln_safetensors_open(p, &s2, &e) == KILN_ERR_UNSUPPORTED && msg_names(&e, p) &&
              strstr(e.message, "F64") && strstr(e.message, "'w'"));
        rm_rf(dir);
        free(raw);
    }
    kiln_safetensors_close(NULL);
}

int main(void) {
    kiln_test_require_file(kiln_test_shared("reference/hf/llama/model.safetensors"));
    test_reference_dirs();
    test_golden();
    test_sharded();
    test_bad_input();
    return kiln_test_finish("test_safetensors");
}
