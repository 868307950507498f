/*
 * safetensors.c - safetensors reader (source: huggingface/safetensors format docs).
 *
 * File: uint64 little-endian N, then N bytes of UTF-8 JSON (possibly padded with spaces),
 * then the data section. JSON: {"__metadata__": {str: str}, name: {"dtype": "F32",
 * "shape": [..], "data_offsets": [begin, end]}, ...}, offsets relative to the data section.
 * Sharded checkpoints: model.safetensors.index.json {"weight_map": {name: "shard file"}}.
 */
#include "format/safetensors.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"
#include "util/mapped_file.h"

#define ST_MAX_HEADER (100u * 1024u * 1024u) /* header JSON cap: 100 MB */
#define ST_MAX_INDEX  (64u * 1024u * 1024u)  /* index JSON cap */

/* Grows st->tensors to hold at least n entries. */
static kiln_status reserve_tensors(kiln_safetensors *st, size_t *cap, size_t n) {
    if (n <= *cap) return KILN_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < n) nc *= 2;
    kiln_st_tensor *t = realloc(st->tensors, nc * sizeof *t);
    if (!t) return KILN_ERR_OUT_OF_MEMORY;
    st->tensors = t;
    *cap = nc;
    return KILN_OK;
}

void kiln_safetensors_close(kiln_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->n_shards; i++) {
        if (st->shards) kiln_mapped_file_close(st->shards[i]);
        if (st->shard_paths) free(st->shard_paths[i]);
    }
    free(st->shards);
    free(st->shard_paths);
    for (size_t i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st);
}

/* Parses a dtype string: F32/F16/BF16/I32 are kiln's; every other spelling is reported. */
static bool parse_dtype(const char *s, kiln_dtype *dt, size_t *esize) {
    static const struct {
        const char *name;
        kiln_dtype dt;
        size_t size;
    } known[] = {{"F32", KILN_DTYPE_F32, 4},
                 {"F16", KILN_DTYPE_F16, 2},
                 {"BF16", KILN_DTYPE_BF16, 2},
                 {"I32", KILN_DTYPE_I32, 4}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(s, known[i].name) == 0) {
            *dt = known[i].dt;
            *esize = known[i].size;
            return true;
        }
    }
    return false;
}

/* A short printable copy of a (UTF-8) name for messages. */
static const char *clip(const char *s, char *buf, size_t cap) {
    size_t n = strlen(s);
    if (n < cap) return s;
    memcpy(buf, s, cap - 4);
    memcpy(buf + cap - 4, "...", 4);
    return buf;
}

static kiln_status parse_meta(kiln_safetensors *st, json_t *meta, const char *name, size_t hdr_len,
                              kiln_error *err) {
    if (!json_is_object(meta)) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header (offset 8, %zu bytes): \"__metadata__\" is not an "
                              "object of strings",
                              name, hdr_len);
    }
    size_t n = json_object_size(meta);
    if (n == 0) return KILN_OK;
    st->meta_keys = calloc(n, sizeof *st->meta_keys);
    st->meta_values = calloc(n, sizeof *st->meta_values);
    if (!st->meta_keys || !st->meta_values) {
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    const char *k;
    json_t *v;
    char cb[96];
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v)) {
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: header (offset 8, %zu bytes): \"__metadata__\" entry '%s' "
                                  "is not a string",
                                  name, hdr_len, clip(k, cb, sizeof cb));
        }
        char *kk = strdup(k);
        char *vv = malloc(json_string_length(v) + 1);
        if (!kk || !vv) {
            free(kk);
            free(vv);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        }
        memcpy(vv, json_string_value(v), json_string_length(v) + 1);
        st->meta_keys[st->n_meta] = kk;
        st->meta_values[st->n_meta] = vv;
        st->n_meta++;
    }
    return KILN_OK;
}

/* Reads a JSON integer >= 0 into *out. */
static bool json_uint(json_t *j, uint64_t *out) {
    if (!json_is_integer(j)) return false;
    json_int_t v = json_integer_value(j);
    if (v < 0) return false;
    *out = (uint64_t)v;
    return true;
}

/*
 * Parses one safetensors image and appends its tensors (shard index `shard`) to st.
 * want_meta: copy "__metadata__" into st.
 */
static kiln_status parse_file(kiln_safetensors *st, size_t *cap, const void *data, size_t size,
                              const char *name, int32_t shard, bool want_meta, kiln_error *err) {
    const uint8_t *p = data;
    if (!p) size = 0;
    if (size < 8) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header length at offset 0 needs 8 bytes but the file is %zu "
                              "bytes (truncated or not a safetensors file)",
                              name, size);
    }
    uint64_t n;
    memcpy(&n, p, 8);
    if (n > size - 8) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header length at offset 0 is %llu but only %zu bytes follow "
                              "(truncated or not a safetensors file)",
                              name, (unsigned long long)n, size - 8);
    }
    if (n > ST_MAX_HEADER) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header length at offset 0 is %llu, above the %u-byte limit",
                              name, (unsigned long long)n, ST_MAX_HEADER);
    }
    if (n < 2) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header length at offset 0 is %llu: too short for a JSON object",
                              name, (unsigned long long)n);
    }
    const size_t hdr_len = (size_t)n;
    const size_t data_start = 8 + hdr_len;
    const size_t data_size = size - data_start;
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, hdr_len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header JSON (offset 8, %zu bytes) is malformed at file offset "
                              "%zu: %s",
                              name, hdr_len, 8 + (size_t)(je.position > 0 ? je.position : 0),
                              je.text);
    }
    kiln_status s = KILN_OK;
    char cb[96];
    if (!json_is_object(root)) {
        s = kiln_error_set(err, KILN_ERR_FORMAT,
                           "%s: header JSON (offset 8, %zu bytes) is not an object", name, hdr_len);
        goto done;
    }
    if ((s = reserve_tensors(st, cap, st->n_tensors + json_object_size(root)))) {
        s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (want_meta && (s = parse_meta(st, val, name, hdr_len, err))) goto done;
            if (!want_meta && !json_is_object(val)) {
                s = kiln_error_set(err, KILN_ERR_FORMAT,
                                   "%s: \"__metadata__\" is not an object of strings", name);
                goto done;
            }
            continue;
        }
        const char *tn = clip(key, cb, sizeof cb);
        if (!json_is_object(val)) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': header entry is not an object", name, tn);
            goto done;
        }
        json_t *jd = json_object_get(val, "dtype");
        json_t *js = json_object_get(val, "shape");
        json_t *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd)) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': \"dtype\" is missing or not a string", name, tn);
            goto done;
        }
        kiln_st_tensor t = {0};
        size_t esize = 0;
        if (!parse_dtype(json_string_value(jd), &t.dtype, &esize)) {
            char db[40];
            s = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                               "%s: tensor '%s': dtype \"%s\" is not supported by kiln (F32, F16, "
                               "BF16 and I32 are)",
                               name, tn, clip(json_string_value(jd), db, sizeof db));
            goto done;
        }
        if (!json_is_array(js)) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': \"shape\" is missing or not an array", name, tn);
            goto done;
        }
        size_t nd = json_array_size(js);
        if (nd > KILN_ST_MAX_DIMS) {
            s = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                               "%s: tensor '%s': %zu dimensions; kiln supports at most %d", name,
                               tn, nd, KILN_ST_MAX_DIMS);
            goto done;
        }
        t.n_dims = (int32_t)nd;
        uint64_t count = 1;
        bool ovf = false;
        for (size_t d = 0; d < nd; d++) {
            uint64_t dim;
            if (!json_uint(json_array_get(js, d), &dim)) {
                s = kiln_error_set(err, KILN_ERR_FORMAT,
                                   "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                                   name, tn, d);
                goto done;
            }
            t.shape[d] = (int64_t)dim;
            ovf = ovf || __builtin_mul_overflow(count, dim, &count);
        }
        uint64_t nbytes = 0;
        ovf = ovf || __builtin_mul_overflow(count, (uint64_t)esize, &nbytes);
        uint64_t begin, end;
        if (!json_is_array(jo) || json_array_size(jo) != 2 ||
            !json_uint(json_array_get(jo, 0), &begin) || !json_uint(json_array_get(jo, 1), &end)) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': \"data_offsets\" is missing or not two "
                               "non-negative integers",
                               name, tn);
            goto done;
        }
        if (begin > end || end > data_size) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets [%llu, %llu] (file offset %llu) %s "
                               "the data section [%zu, %zu) of the file (%zu bytes)",
                               name, tn, (unsigned long long)begin, (unsigned long long)end,
                               (unsigned long long)data_start + begin,
                               begin > end ? "are reversed; must lie inside" : "extend beyond",
                               data_start, size, size);
            goto done;
        }
        if (ovf || nbytes != end - begin) {
            char sh[160];
            size_t o = 0;
            sh[0] = '\0';
            for (size_t d = 0; d < nd && o < sizeof sh - 24; d++) {
                o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld", d ? ", " : "",
                                      (long long)t.shape[d]);
            }
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': shape [%s] of %s needs %s%llu bytes but "
                               "data_offsets [%llu, %llu] (file offset %llu) hold %llu",
                               name, tn, sh, json_string_value(jd), ovf ? "more than " : "",
                               ovf ? (unsigned long long)UINT64_MAX : (unsigned long long)nbytes,
                               (unsigned long long)begin, (unsigned long long)end,
                               (unsigned long long)data_start + begin,
                               (unsigned long long)(end - begin));
            goto done;
        }
        t.name = strdup(key);
        if (!t.name) {
            s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
            goto done;
        }
        t.data = p + data_start + begin;
        t.nbytes = (size_t)nbytes;
        t.shard = shard;
        st->tensors[st->n_tensors++] = t;
    }
done:
    json_decref(root);
    return s;
}

typedef struct name_ref {
    const char *s;
    size_t idx;
} name_ref;

static int cmp_ref(const void *a, const void *b) {
    const name_ref *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Rejects a tensor name that occurs in two shards. */
static kiln_status check_duplicates(kiln_safetensors *st, kiln_error *err) {
    if (st->n_tensors < 2) return KILN_OK;
    name_ref *r = malloc(st->n_tensors * sizeof *r);
    if (!r) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < st->n_tensors; i++) r[i] = (name_ref){st->tensors[i].name, i};
    qsort(r, st->n_tensors, sizeof *r, cmp_ref);
    kiln_status s = KILN_OK;
    for (size_t i = 1; i < st->n_tensors; i++) {
        if (strcmp(r[i - 1].s, r[i].s) == 0) {
            const kiln_st_tensor *a = &st->tensors[r[i - 1].idx], *b = &st->tensors[r[i].idx];
            char cb[96];
            s = kiln_error_set(err, KILN_ERR_FORMAT, "tensor '%s' appears in both %s and %s",
                               clip(a->name, cb, sizeof cb), st->shard_paths[a->shard],
                               st->shard_paths[b->shard]);
            break;
        }
    }
    free(r);
    return s;
}

static kiln_safetensors *alloc_st(size_t n_shards) {
    kiln_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->shards = calloc(n_shards ? n_shards : 1, sizeof *st->shards);
    st->shard_paths = calloc(n_shards ? n_shards : 1, sizeof *st->shard_paths);
    if (!st->shards || !st->shard_paths) {
        kiln_safetensors_close(st);
        return NULL;
    }
    return st;
}

kiln_status kiln_safetensors_open_memory(const void *data, size_t size, const char *name,
                                         kiln_safetensors **out, kiln_error *err) {
    *out = NULL;
    if (!name) name = "<memory>";
    kiln_safetensors *st = alloc_st(1);
    if (!st) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    st->n_shards = 1;
    st->shard_paths[0] = strdup(name);
    if (!st->shard_paths[0]) {
        kiln_safetensors_close(st);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    size_t cap = 0;
    kiln_status s = parse_file(st, &cap, data, size, name, 0, true, err);
    if (s != KILN_OK) {
        kiln_safetensors_close(st);
        return s;
    }
    *out = st;
    return KILN_OK;
}

/* Maps shard i of st from path and parses it. */
static kiln_status open_shard(kiln_safetensors *st, size_t *cap, size_t i, const char *path,
                              kiln_error *err) {
    st->shard_paths[i] = strdup(path);
    if (!st->shard_paths[i]) {
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    kiln_mapped_file *f = NULL;
    kiln_status s = kiln_mapped_file_open(path, &f, err);
    if (s == KILN_ERR_INVALID_ARGUMENT) {
        return kiln_error_set(err, KILN_ERR_IO, "%s: is a directory, not a safetensors file", path);
    }
    if (s != KILN_OK) return s;
    st->shards[i] = f;
    return parse_file(st, cap, f->data, f->size, path, (int32_t)i, i == 0, err);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Path of `rel` relative to the directory of `index_path`; malloc'd. */
static char *join_dir_of(const char *index_path, const char *rel) {
    const char *slash = strrchr(index_path, '/');
    size_t dl = slash ? (size_t)(slash - index_path) + 1 : 0;
    size_t rl = strlen(rel);
    char *p = malloc(dl + rl + 1);
    if (!p) return NULL;
    memcpy(p, index_path, dl);
    memcpy(p + dl, rel, rl + 1);
    return p;
}

/* A shard name must stay inside the index's directory: relative, no ".." component. */
static bool safe_relative(const char *s) {
    if (s[0] == '\0' || s[0] == '/') return false;
    const char *c = s;
    while (*c) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.') return false;
        if (!e) break;
        c = e + 1;
    }
    return true;
}

static kiln_status open_index(const char *index_path, kiln_safetensors **out, kiln_error *err) {
    char *text = NULL;
    size_t len = 0;
    kiln_status s = kiln_read_file(index_path, ST_MAX_INDEX, &text, &len, err);
    if (s == KILN_ERR_INVALID_ARGUMENT) {
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: index larger than %u bytes", index_path,
                              ST_MAX_INDEX);
    }
    if (s != KILN_OK) return s;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) {
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: malformed JSON at offset %d: %s",
                              index_path, je.position, je.text);
    }
    json_t *wm = json_object_get(root, "weight_map");
    const char **names = NULL;
    kiln_safetensors *st = NULL;
    char cb[96];
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        s = kiln_error_set(err, KILN_ERR_FORMAT,
                           "%s: \"weight_map\" is missing, empty or not an object", index_path);
        goto done;
    }
    /* Distinct shard names, sorted. */
    size_t n_map = json_object_size(wm), n_sh = 0;
    names = malloc(n_map * sizeof *names);
    if (!names) {
        s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v) || !safe_relative(json_string_value(v)) ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: weight_map entry '%s' is not a relative shard file name",
                               index_path, clip(k, cb, sizeof cb));
            goto done;
        }
        names[n_sh++] = json_string_value(v);
    }
    qsort(names, n_sh, sizeof *names, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_sh; i++) {
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    }
    n_sh = u;
    st = alloc_st(n_sh);
    if (!st) {
        s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
        goto done;
    }
    st->n_shards = n_sh;
    size_t cap = 0;
    for (size_t i = 0; i < n_sh; i++) {
        char *sp = join_dir_of(index_path, names[i]);
        if (!sp) {
            s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
            goto done;
        }
        s = open_shard(st, &cap, i, sp, err);
        free(sp);
        if (s != KILN_OK) {
            kiln_error_prefix(err, "%s: shard %zu of %zu: ", index_path, i + 1, n_sh);
            goto done;
        }
    }
    if ((s = check_duplicates(st, err))) {
        kiln_error_prefix(err, "%s: ", index_path);
        goto done;
    }
    /* Every weight_map entry must name a tensor of the shard it points to. */
    json_object_foreach(wm, k, v) {
        const kiln_st_tensor *t = kiln_safetensors_find(st, k);
        if (!t) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: weight_map lists tensor '%s' in %s, but no shard holds it",
                               index_path, clip(k, cb, sizeof cb), json_string_value(v));
            goto done;
        }
        const char *want = json_string_value(v);
        if (strcmp(names[t->shard], want) != 0) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: weight_map puts tensor '%s' in %s, but it is in %s", index_path,
                               clip(k, cb, sizeof cb), want, st->shard_paths[t->shard]);
            goto done;
        }
    }
done:
    free(names);
    json_decref(root);
    if (s != KILN_OK) {
        kiln_safetensors_close(st);
        return s;
    }
    *out = st;
    return KILN_OK;
}

static kiln_status open_single(const char *path, kiln_safetensors **out, kiln_error *err) {
    kiln_safetensors *st = alloc_st(1);
    if (!st) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    st->n_shards = 1;
    size_t cap = 0;
    kiln_status s = open_shard(st, &cap, 0, path, err);
    if (s != KILN_OK) {
        kiln_safetensors_close(st);
        return s;
    }
    *out = st;
    return KILN_OK;
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out, kiln_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot open: no such file or directory", path);
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (ends_with(path, ".json")) return open_index(path, out, err);
        return open_single(path, out, err);
    }
    /* A directory: the index wins, then model.safetensors, then a lone *.safetensors. */
    size_t pl = strlen(path);
    char *cand = malloc(pl + 64);
    if (!cand) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    const char *sep = pl && path[pl - 1] == '/' ? "" : "/";
    snprintf(cand, pl + 64, "%s%s%s", path, sep, "model.safetensors.index.json");
    kiln_status s;
    if (is_file(cand)) {
        s = open_index(cand, out, err);
        free(cand);
        return s;
    }
    snprintf(cand, pl + 64, "%s%s%s", path, sep, "model.safetensors");
    if (is_file(cand)) {
        s = open_single(cand, out, err);
        free(cand);
        return s;
    }
    free(cand);
    DIR *d = opendir(path);
    if (!d) return kiln_error_set(err, KILN_ERR_IO, "%s: cannot read directory", path);
    char *found = NULL;
    int n_found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        size_t n = pl + strlen(e->d_name) + 2;
        char *full = malloc(n);
        if (!full) break;
        snprintf(full, n, "%s%s%s", path, sep, e->d_name);
        if (is_file(full) && ++n_found == 1) {
            found = full;
        } else {
            free(full);
        }
    }
    closedir(d);
    if (n_found != 1) {
        free(found);
        if (n_found == 0) {
            return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                                  "%s: no model.safetensors.index.json, model.safetensors or other "
                                  "*.safetensors file in this directory",
                                  path);
        }
        return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                              "%s: %d *.safetensors files but no model.safetensors.index.json or "
                              "model.safetensors to say which to load",
                              path, n_found);
    }
    s = open_single(found, out, err);
    free(found);
    return s;
}

const kiln_st_tensor *kiln_safetensors_find(const kiln_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    for (size_t i = 0; i < st->n_tensors; i++) {
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    }
    return NULL;
}
