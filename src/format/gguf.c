/*
 * gguf.c - GGUF reader, versions 1-3 (source: ggml/docs/gguf.md).
 *
 * Layout: magic "GGUF", uint32 version, tensor count, kv count, kv pairs, tensor infos,
 * padding to `general.alignment`, tensor data. v1 stores counts, string lengths, array
 * lengths and tensor dims as uint32; v2/v3 as uint64 (v3 only adds big-endian files, which
 * kiln does not read: their version field reads as a huge number and is reported).
 *
 * Every length read from the file is checked against the bytes that remain before anything
 * is allocated from it, so a lying count fails at once instead of allocating.
 */
#include "format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/mapped_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAX_DEPTH         8 /* nesting bound for arrays of arrays */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4

typedef struct reader {
    const uint8_t *p;
    size_t size;
    size_t pos;
    const char *name; /* file name for messages */
    uint32_t version;
    kiln_error *err;
    char ctx[192]; /* what is being parsed: "key 'general.name'", "tensor #3 'x'" */
} reader;

/* Printable excerpt of a length-counted string for messages (cap >= 8). */
static const char *excerpt(const char *s, size_t len, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        size_t k = 1;
        if (c >= 0x20 && c < 0x7f && c != '\'') {
            tmp[0] = (char)c;
        } else {
            k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        }
        if (n + k + 4 > cap) { /* keep room for "..." and the NUL */
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        memcpy(buf + n, tmp, k);
        n += k;
    }
    buf[n] = '\0';
    return buf;
}

static kiln_status truncated(reader *r, const char *what, uint64_t need) {
    return kiln_error_set(r->err, KILN_ERR_FORMAT,
                          "%s: %s%s%s at offset %zu needs %llu bytes but only %zu remain "
                          "(file truncated or corrupt; file is %zu bytes)",
                          r->name, r->ctx, r->ctx[0] ? ": " : "", what, r->pos,
                          (unsigned long long)need, r->size - r->pos, r->size);
}

static kiln_status need(reader *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos) return truncated(r, what, n);
    return KILN_OK;
}

static kiln_status rd_u32(reader *r, uint32_t *v, const char *what) {
    kiln_status s = need(r, 4, what);
    if (s) return s;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return KILN_OK;
}

static kiln_status rd_u64(reader *r, uint64_t *v, const char *what) {
    kiln_status s = need(r, 8, what);
    if (s) return s;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return KILN_OK;
}

/* Size of a count / string length field: uint32 in v1, uint64 later. */
static size_t count_size(const reader *r) {
    return r->version == 1 ? 4 : 8;
}

static kiln_status rd_count(reader *r, uint64_t *v, const char *what) {
    if (r->version == 1) {
        uint32_t x;
        kiln_status s = rd_u32(r, &x, what);
        *v = x;
        return s;
    }
    return rd_u64(r, v, what);
}

/* Reads a GGUF string into owned, NUL-terminated memory. */
static kiln_status rd_str(reader *r, kiln_gguf_str *out, const char *what) {
    size_t at = r->pos;
    uint64_t len;
    kiln_status s = rd_count(r, &len, what);
    if (s) return s;
    if (len > r->size - r->pos) {
        return kiln_error_set(r->err, KILN_ERR_FORMAT,
                              "%s: %s%s%s at offset %zu: length %llu exceeds the %zu bytes left "
                              "in the file (%zu bytes)",
                              r->name, r->ctx, r->ctx[0] ? ": " : "", what, at,
                              (unsigned long long)len, r->size - r->pos, r->size);
    }
    char *d = malloc((size_t)len + 1);
    if (!d) {
        return kiln_error_set(r->err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory reading %s",
                              r->name, what);
    }
    if (len) memcpy(d, r->p + r->pos, (size_t)len);
    d[len] = '\0';
    r->pos += (size_t)len;
    out->data = d;
    out->len = len;
    return KILN_OK;
}

static const char *type_name(uint32_t t) {
    static const char *names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                  "int32",  "float32", "bool",   "string", "array",
                                  "uint64", "int64",   "float64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "invalid";
}

/* Size in bytes of a scalar of type t; 0 for STRING, ARRAY and invalid tags. */
static size_t scalar_size(uint32_t t) {
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
    case KILN_GGUF_UINT64:
    case KILN_GGUF_INT64:
    case KILN_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static bool valid_type(uint32_t t) {
    return t <= KILN_GGUF_FLOAT64;
}

static void free_value(kiln_gguf_value *v) {
    if (v->type == KILN_GGUF_STRING) {
        free(v->str.data);
    } else if (v->type == KILN_GGUF_ARRAY) {
        if (v->arr.data && v->arr.elem_type == KILN_GGUF_STRING) {
            kiln_gguf_str *s = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++) free(s[i].data);
        } else if (v->arr.data && v->arr.elem_type == KILN_GGUF_ARRAY) {
            kiln_gguf_value *e = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++) free_value(&e[i]);
        }
        free(v->arr.data);
    }
    memset(v, 0, sizeof *v);
}

/* Decodes one scalar of type t at p into v (t must have scalar_size > 0). */
static kiln_status decode_scalar(reader *r, uint32_t t, const uint8_t *p, kiln_gguf_value *v) {
    v->type = (kiln_gguf_type)t;
    switch (t) {
    case KILN_GGUF_UINT8:
        v->u64 = p[0];
        break;
    case KILN_GGUF_INT8:
        v->i64 = (int8_t)p[0];
        break;
    case KILN_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        v->u64 = x;
        break;
    }
    case KILN_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        v->i64 = x;
        break;
    }
    case KILN_GGUF_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        v->u64 = x;
        break;
    }
    case KILN_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        v->i64 = x;
        break;
    }
    case KILN_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        v->f64 = x;
        break;
    }
    case KILN_GGUF_BOOL:
        if (p[0] > 1) {
            return kiln_error_set(r->err, KILN_ERR_FORMAT,
                                  "%s: %s: bool value at offset %zu is %u, not 0 or 1", r->name,
                                  r->ctx, (size_t)(p - r->p), p[0]);
        }
        v->b = p[0] != 0;
        break;
    case KILN_GGUF_UINT64:
        memcpy(&v->u64, p, 8);
        break;
    case KILN_GGUF_INT64:
        memcpy(&v->i64, p, 8);
        break;
    case KILN_GGUF_FLOAT64:
        memcpy(&v->f64, p, 8);
        break;
    default:
        return kiln_error_set(r->err, KILN_ERR_INTERNAL, "%s: bad scalar type", r->name);
    }
    return KILN_OK;
}

static kiln_status rd_value(reader *r, uint32_t type, int depth, kiln_gguf_value *out);

static kiln_status rd_array(reader *r, int depth, kiln_gguf_value *out) {
    size_t at = r->pos;
    uint32_t et;
    uint64_t n;
    kiln_status s = rd_u32(r, &et, "array element type");
    if (s) return s;
    if (!valid_type(et)) {
        return kiln_error_set(r->err, KILN_ERR_FORMAT,
                              "%s: %s: array at offset %zu has invalid element type tag %u",
                              r->name, r->ctx, at, et);
    }
    if (et == KILN_GGUF_ARRAY && depth + 1 >= GGUF_MAX_DEPTH) {
        return kiln_error_set(r->err, KILN_ERR_FORMAT,
                              "%s: %s: arrays nested deeper than %d levels at offset %zu", r->name,
                              r->ctx, GGUF_MAX_DEPTH, at);
    }
    size_t count_at = r->pos;
    s = rd_count(r, &n, "array length");
    if (s) return s;
    /* The least bytes one element can occupy, to bound n by the bytes left. */
    size_t min_elem = et == KILN_GGUF_STRING  ? count_size(r)
                      : et == KILN_GGUF_ARRAY ? 4 + count_size(r)
                                              : scalar_size(et);
    size_t left = r->size - r->pos;
    if (n > left / min_elem) {
        return kiln_error_set(r->err, KILN_ERR_FORMAT,
                              "%s: %s: array length %llu at offset %zu: that many %s elements "
                              "(at least %zu bytes each) cannot fit in the %zu bytes left (file "
                              "is %zu bytes)",
                              r->name, r->ctx, (unsigned long long)n, count_at, type_name(et),
                              min_elem, left, r->size);
    }
    out->type = KILN_GGUF_ARRAY;
    out->arr.elem_type = (kiln_gguf_type)et;
    out->arr.n = 0;
    out->arr.data = NULL;
    if (n == 0) return KILN_OK;

    if (et == KILN_GGUF_STRING) {
        kiln_gguf_str *a = calloc((size_t)n, sizeof *a);
        if (!a) goto oom;
        out->arr.data = a;
        out->arr.n = n; /* entries are zeroed, so a partial array frees cleanly */
        for (uint64_t i = 0; i < n; i++) {
            s = rd_str(r, &a[i], "array string");
            if (s) return s;
        }
    } else if (et == KILN_GGUF_ARRAY) {
        kiln_gguf_value *a = calloc((size_t)n, sizeof *a);
        if (!a) goto oom;
        out->arr.data = a;
        out->arr.n = n;
        for (uint64_t i = 0; i < n; i++) {
            s = rd_value(r, KILN_GGUF_ARRAY, depth + 1, &a[i]);
            if (s) return s;
        }
    } else {
        size_t es = scalar_size(et);
        size_t bytes = (size_t)n * es; /* n <= left / es, so no overflow */
        if (et == KILN_GGUF_BOOL) {
            for (size_t i = 0; i < bytes; i++) {
                if (r->p[r->pos + i] > 1) {
                    return kiln_error_set(r->err, KILN_ERR_FORMAT,
                                          "%s: %s: bool array element %zu at offset %zu is %u, "
                                          "not 0 or 1",
                                          r->name, r->ctx, i, r->pos + i, r->p[r->pos + i]);
                }
            }
        }
        void *a = malloc(bytes);
        if (!a) goto oom;
        memcpy(a, r->p + r->pos, bytes);
        r->pos += bytes;
        out->arr.data = a;
        out->arr.n = n;
    }
    return KILN_OK;
oom:
    return kiln_error_set(r->err, KILN_ERR_OUT_OF_MEMORY,
                          "%s: %s: out of memory for an array of %llu %s values", r->name, r->ctx,
                          (unsigned long long)n, type_name(et));
}

static kiln_status rd_value(reader *r, uint32_t type, int depth, kiln_gguf_value *out) {
    memset(out, 0, sizeof *out);
    if (type == KILN_GGUF_STRING) {
        out->type = KILN_GGUF_STRING;
        return rd_str(r, &out->str, "string value");
    }
    if (type == KILN_GGUF_ARRAY) return rd_array(r, depth, out);
    size_t sz = scalar_size(type);
    kiln_status s = need(r, sz, type_name(type));
    if (s) return s;
    s = decode_scalar(r, type, r->p + r->pos, out);
    if (s) return s;
    r->pos += sz;
    return KILN_OK;
}

/* GGML type names for messages about tensors kiln cannot use (ggml/include/ggml.h ids). */
static const char *ggml_type_name(uint32_t t) {
    static const char *names[] = {
        [0] = "f32",     [1] = "f16",      [2] = "q4_0",   [3] = "q4_1",    [6] = "q5_0",
        [7] = "q5_1",    [8] = "q8_0",     [9] = "q8_1",   [10] = "q2_K",   [11] = "q3_K",
        [12] = "q4_K",   [13] = "q5_K",    [14] = "q6_K",  [15] = "q8_K",   [16] = "iq2_xxs",
        [17] = "iq2_xs", [18] = "iq3_xxs", [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s",
        [22] = "iq2_s",  [23] = "iq4_xs",  [24] = "i8",    [25] = "i16",    [26] = "i32",
        [27] = "i64",    [28] = "f64",     [29] = "iq1_m", [30] = "bf16",   [34] = "tq1_0",
        [35] = "tq2_0",  [39] = "mxfp4",
    };
    if (t < sizeof names / sizeof names[0] && names[t]) return names[t];
    return "unknown";
}

typedef struct name_ref {
    const char *s;
    size_t idx;
} name_ref;

static int cmp_name_ref(const void *a, const void *b) {
    const name_ref *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    if (c) return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Finds a duplicate among n names in O(n log n): *dup_idx is the index of a repeated name
 * (SIZE_MAX when all are distinct) and *first_idx that of its first occurrence. */
static kiln_status find_duplicate(size_t n, const char *(*get)(const void *, size_t),
                                  const void *base, size_t *dup_idx, size_t *first_idx) {
    *dup_idx = SIZE_MAX;
    if (n < 2) return KILN_OK;
    name_ref *refs = malloc(n * sizeof *refs);
    if (!refs) return KILN_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) refs[i] = (name_ref){get(base, i), i};
    qsort(refs, n, sizeof *refs, cmp_name_ref);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(refs[i - 1].s, refs[i].s) == 0) {
            *dup_idx = refs[i].idx;
            *first_idx = refs[i - 1].idx;
            break;
        }
    }
    free(refs);
    return KILN_OK;
}

static const char *kv_name(const void *base, size_t i) {
    return ((const kiln_gguf_kv *)base)[i].key;
}

static const char *tensor_name(const void *base, size_t i) {
    return ((const kiln_gguf_tensor *)base)[i].name;
}

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    if (g->kv) {
        for (size_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free_value(&g->kv[i].value);
        }
        free(g->kv);
    }
    if (g->tensors) {
        for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
        free(g->tensors);
    }
    kiln_mapped_file_close(g->owned_map);
    free(g->path);
    free(g);
}

/* Reads the alignment from general.alignment if present. */
static kiln_status read_alignment(reader *r, kiln_gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const kiln_gguf_kv *kv = kiln_gguf_find(g, "general.alignment");
    if (!kv) return KILN_OK;
    uint64_t a = 0;
    bool ok = false;
    switch (kv->value.type) {
    case KILN_GGUF_UINT8:
    case KILN_GGUF_UINT16:
    case KILN_GGUF_UINT32:
    case KILN_GGUF_UINT64:
        a = kv->value.u64;
        ok = true;
        break;
    case KILN_GGUF_INT8:
    case KILN_GGUF_INT16:
    case KILN_GGUF_INT32:
    case KILN_GGUF_INT64:
        ok = kv->value.i64 > 0;
        a = ok ? (uint64_t)kv->value.i64 : 0;
        break;
    default:
        break;
    }
    if (!ok || a == 0 || (a & (a - 1)) != 0) {
        char v[64];
        if (kv->value.type <= KILN_GGUF_UINT64 && scalar_size(kv->value.type) &&
            kv->value.type != KILN_GGUF_FLOAT32 && kv->value.type != KILN_GGUF_FLOAT64 &&
            kv->value.type != KILN_GGUF_BOOL) {
            snprintf(v, sizeof v, "%llu", (unsigned long long)a);
        } else {
            snprintf(v, sizeof v, "a %s", type_name(kv->value.type));
        }
        return kiln_error_set(r->err, KILN_ERR_FORMAT,
                              "%s: key 'general.alignment' is %s; it must be a non-zero power of "
                              "two (uint32)",
                              r->name, v);
    }
    g->alignment = a;
    return KILN_OK;
}

static kiln_status parse(const void *data, size_t size, const char *name, kiln_gguf *g,
                         kiln_error *err) {
    reader rr = {.p = data, .size = data ? size : 0, .name = name, .err = err};
    reader *r = &rr;
    kiln_status s;
    char eb[96];

    /* Header. */
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0) {
        if (r->size < 4) return truncated(r, "header.magic", 4);
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header.magic at offset 0 is '%s', not 'GGUF': not a GGUF file",
                              name, excerpt((const char *)r->p, 4, eb, sizeof eb));
    }
    r->pos = 4;
    if ((s = rd_u32(r, &g->version, "header.version"))) return s;
    r->version = g->version;
    if (g->version == 0) {
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: header.version at offset 4 is 0", name);
    }
    if (g->version > 3) {
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: header.version at offset 4 is %u; kiln reads GGUF versions 1 "
                              "to 3%s",
                              name, g->version,
                              g->version >= 0x01000000u ? " (a big-endian file?)" : "");
    }
    uint64_t n_tensors, n_kv;
    size_t nt_at = r->pos;
    if ((s = rd_count(r, &n_tensors, "header.n_tensors"))) return s;
    size_t nkv_at = r->pos;
    if ((s = rd_count(r, &n_kv, "header.n_kv"))) return s;

    /* Bound the counts by the bytes left before allocating: a kv needs at least a key
     * length, a type tag and one value byte; a tensor info at least a name length, n_dims,
     * one dim, a type and an offset. */
    size_t cs = count_size(r);
    size_t left = r->size - r->pos;
    if (n_kv > left / (cs + 4 + 1)) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header.n_kv at offset %zu is %llu, impossible in the %zu bytes "
                              "left (file is %zu bytes)",
                              name, nkv_at, (unsigned long long)n_kv, left, r->size);
    }
    if (n_tensors > left / (cs + 4 + cs + 4 + 8)) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header.n_tensors at offset %zu is %llu, impossible in the %zu "
                              "bytes left (file is %zu bytes)",
                              name, nt_at, (unsigned long long)n_tensors, left, r->size);
    }

    /* Metadata. */
    if (n_kv) {
        g->kv = calloc((size_t)n_kv, sizeof *g->kv);
        if (!g->kv) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    for (size_t i = 0; i < n_kv; i++) {
        kiln_gguf_kv *kv = &g->kv[i];
        size_t key_at = r->pos;
        snprintf(r->ctx, sizeof r->ctx, "metadata kv #%zu", i);
        kiln_gguf_str key = {0};
        if ((s = rd_str(r, &key, "key"))) return s;
        kv->key = key.data;
        g->n_kv = i + 1;
        if (strlen(key.data) != key.len) {
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: metadata kv #%zu: key at offset %zu contains a NUL byte",
                                  name, i, key_at);
        }
        if (key.len == 0) {
            /* gguf.md: keys are non-empty ASCII dotted paths; ggml's gguf_init refuses an
             * empty one too */
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: metadata kv #%zu: key at offset %zu is empty; every "
                                  "metadata key must be a non-empty name",
                                  name, i, key_at);
        }
        snprintf(r->ctx, sizeof r->ctx, "key '%s'", excerpt(key.data, key.len, eb, sizeof eb));
        size_t type_at = r->pos;
        uint32_t type;
        if ((s = rd_u32(r, &type, "value type"))) return s;
        if (!valid_type(type)) {
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: %s: invalid value type tag %u at offset %zu", name, r->ctx,
                                  type, type_at);
        }
        if ((s = rd_value(r, type, 0, &kv->value))) return s;
    }
    r->ctx[0] = '\0';
    size_t dup, first;
    if (find_duplicate(g->n_kv, kv_name, g->kv, &dup, &first)) {
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    if (dup != SIZE_MAX) {
        return kiln_error_set(
            err, KILN_ERR_FORMAT, "%s: metadata key '%s' appears twice (kv #%zu and #%zu)", name,
            excerpt(g->kv[dup].key, strlen(g->kv[dup].key), eb, sizeof eb), first, dup);
    }
    if ((s = read_alignment(r, g))) return s;

    /* Tensor infos. */
    if (n_tensors) {
        g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
        if (!g->tensors) {
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        }
    }
    uint32_t *type_ids = NULL;
    size_t *info_at = NULL;
    if (n_tensors) {
        type_ids = calloc((size_t)n_tensors, sizeof *type_ids);
        info_at = calloc((size_t)n_tensors, sizeof *info_at);
        if (!type_ids || !info_at) {
            free(type_ids);
            free(info_at);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        }
    }
    for (size_t i = 0; i < n_tensors; i++) {
        kiln_gguf_tensor *t = &g->tensors[i];
        info_at[i] = r->pos;
        snprintf(r->ctx, sizeof r->ctx, "tensor info #%zu", i);
        kiln_gguf_str nm = {0};
        if ((s = rd_str(r, &nm, "name"))) goto fail;
        t->name = nm.data;
        g->n_tensors = i + 1;
        if (strlen(nm.data) != nm.len) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor info #%zu: name at offset %zu contains a NUL byte", name,
                               i, info_at[i]);
            goto fail;
        }
        if (nm.len == 0) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor info #%zu: name at offset %zu is empty; every tensor "
                               "must have a name",
                               name, i, info_at[i]);
            goto fail;
        }
        snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", excerpt(nm.data, nm.len, eb, sizeof eb));
        size_t nd_at = r->pos;
        if ((s = rd_u32(r, &t->n_dims, "n_dims"))) goto fail;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: %s: n_dims at offset %zu is %u; must be 1 to %d", name, r->ctx,
                               nd_at, t->n_dims, GGUF_MAX_DIMS);
            goto fail;
        }
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            size_t ne_at = r->pos;
            uint64_t ne;
            if ((s = rd_count(r, &ne, "dimension"))) goto fail;
            if (ne == 0 || ne > (uint64_t)INT64_MAX) {
                s = kiln_error_set(err, KILN_ERR_FORMAT,
                                   "%s: %s: ne[%u] at offset %zu is %llu; dimensions must be "
                                   "positive",
                                   name, r->ctx, d, ne_at, (unsigned long long)ne);
                goto fail;
            }
            t->ne[d] = (int64_t)ne;
        }
        if ((s = rd_u32(r, &type_ids[i], "type"))) goto fail;
        size_t off_at = r->pos;
        if ((s = rd_u64(r, &t->offset, "offset"))) goto fail;
        if (t->offset % g->alignment != 0) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: %s: data offset %llu (field at offset %zu) is not a multiple "
                               "of the alignment %llu",
                               name, r->ctx, (unsigned long long)t->offset, off_at,
                               (unsigned long long)g->alignment);
            goto fail;
        }
    }
    r->ctx[0] = '\0';
    if (find_duplicate(g->n_tensors, tensor_name, g->tensors, &dup, &first)) {
        s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        goto fail;
    }
    if (dup != SIZE_MAX) {
        s = kiln_error_set(
            err, KILN_ERR_FORMAT, "%s: tensor name '%s' appears twice (tensor infos #%zu and #%zu)",
            name, excerpt(g->tensors[dup].name, strlen(g->tensors[dup].name), eb, sizeof eb), first,
            dup);
        goto fail;
    }

    /* Data section: the next multiple of the alignment after the tensor infos. */
    size_t end_infos = r->pos;
    uint64_t data_off;
    if (__builtin_add_overflow((uint64_t)end_infos, g->alignment - 1, &data_off)) {
        data_off = UINT64_MAX;
    } else {
        data_off -= data_off % g->alignment;
    }
    if (data_off > r->size) {
        if (n_tensors) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor data section would start at offset %llu (tensor infos "
                               "end at %zu, alignment %llu), beyond end of file (%zu bytes)",
                               name, (unsigned long long)data_off, end_infos,
                               (unsigned long long)g->alignment, r->size);
            goto fail;
        }
        data_off = r->size; /* vocab-only files end right after the metadata */
    }
    g->data_offset = (size_t)data_off;

    for (size_t i = 0; i < g->n_tensors; i++) {
        kiln_gguf_tensor *t = &g->tensors[i];
        const char *tn = excerpt(t->name, strlen(t->name), eb, sizeof eb);
        const kiln_dtype_traits *tr =
            type_ids[i] <= INT32_MAX ? kiln_dtype_traits_of((int32_t)type_ids[i]) : NULL;
        if (!tr) {
            s = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                               "%s: tensor '%s' (info at offset %zu) has dtype id %u (%s), which "
                               "kiln does not support",
                               name, tn, info_at[i], type_ids[i], ggml_type_name(type_ids[i]));
            goto fail;
        }
        t->dtype = (kiln_dtype)type_ids[i];
        if (tr->block_size <= 0 || tr->type_size == 0 || t->ne[0] % tr->block_size != 0) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s' (info at offset %zu): ne[0] = %lld is not a "
                               "multiple of the %s block size %d",
                               name, tn, info_at[i], (long long)t->ne[0], tr->name,
                               (int)tr->block_size);
            goto fail;
        }
        uint64_t blocks = (uint64_t)t->ne[0] / (uint64_t)tr->block_size;
        uint64_t nbytes;
        bool ovf = __builtin_mul_overflow(blocks, (uint64_t)tr->type_size, &nbytes);
        for (int d = 1; d < GGUF_MAX_DIMS && !ovf; d++) {
            ovf = __builtin_mul_overflow(nbytes, (uint64_t)t->ne[d], &nbytes);
        }
        if (ovf || nbytes > SIZE_MAX) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s' (info at offset %zu): shape [%lld, %lld, %lld, "
                               "%lld] of %s overflows a byte size",
                               name, tn, info_at[i], (long long)t->ne[0], (long long)t->ne[1],
                               (long long)t->ne[2], (long long)t->ne[3], tr->name);
            goto fail;
        }
        uint64_t begin, end;
        if (__builtin_add_overflow((uint64_t)g->data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, nbytes, &end) || end > r->size) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: tensor '%s': data [offset %llu, size %llu] extends beyond end "
                               "of file (%zu bytes)",
                               name, tn, (unsigned long long)g->data_offset + t->offset,
                               (unsigned long long)nbytes, r->size);
            goto fail;
        }
        t->nbytes = (size_t)nbytes;
        t->data = r->p + begin;
    }
    free(type_ids);
    free(info_at);
    return KILN_OK;
fail:
    free(type_ids);
    free(info_at);
    return s;
}

static kiln_status open_impl(const void *data, size_t size, const char *name, kiln_mapped_file *map,
                             kiln_gguf **out, kiln_error *err) {
    kiln_gguf *g = calloc(1, sizeof *g);
    char *p = strdup(name);
    if (!g || !p) {
        free(g);
        free(p);
        kiln_mapped_file_close(map);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    g->path = p;
    g->owned_map = map;
    g->base = data;
    g->size = data ? size : 0;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    kiln_status s = parse(data, size, g->path, g, err);
    if (s != KILN_OK) {
        kiln_gguf_close(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out, kiln_error *err) {
    *out = NULL;
    kiln_mapped_file *m = NULL;
    kiln_status s = kiln_mapped_file_open(path, &m, err);
    if (s != KILN_OK) {
        if (s == KILN_ERR_INVALID_ARGUMENT) {
            /* a directory: report as an I/O problem, as documented */
            return kiln_error_set(err, KILN_ERR_IO, "%s: is a directory, not a GGUF file", path);
        }
        return s;
    }
    return open_impl(m->data, m->size, path, m, out, err);
}

kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *name, kiln_gguf **out,
                                  kiln_error *err) {
    *out = NULL;
    return open_impl(data, size, name ? name : "<memory>", NULL, out, err);
}

const kiln_gguf_kv *kiln_gguf_find(const kiln_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    for (size_t i = 0; i < g->n_kv; i++) {
        if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    }
    return NULL;
}

const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    for (size_t i = 0; i < g->n_tensors; i++) {
        if (g->tensors[i].name && strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    }
    return NULL;
}

static bool is_unsigned_type(kiln_gguf_type t) {
    return t == KILN_GGUF_UINT8 || t == KILN_GGUF_UINT16 || t == KILN_GGUF_UINT32 ||
           t == KILN_GGUF_UINT64;
}

static bool is_signed_type(kiln_gguf_type t) {
    return t == KILN_GGUF_INT8 || t == KILN_GGUF_INT16 || t == KILN_GGUF_INT32 ||
           t == KILN_GGUF_INT64;
}

bool kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return false;
    const kiln_gguf_value *v = &kv->value;
    if (is_unsigned_type(v->type)) {
        if (v->u64 > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v->u64;
        return true;
    }
    if (is_signed_type(v->type)) {
        *out = v->i64;
        return true;
    }
    if (v->type == KILN_GGUF_BOOL) {
        *out = v->b ? 1 : 0;
        return true;
    }
    return false;
}

bool kiln_gguf_get_u32(const kiln_gguf *g, const char *key, uint32_t *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return false;
    const kiln_gguf_value *v = &kv->value;
    if (is_unsigned_type(v->type)) {
        if (v->u64 > UINT32_MAX) return false;
        *out = (uint32_t)v->u64;
        return true;
    }
    if (is_signed_type(v->type)) {
        if (v->i64 < 0 || v->i64 > (int64_t)UINT32_MAX) return false;
        *out = (uint32_t)v->i64;
        return true;
    }
    if (v->type == KILN_GGUF_BOOL) {
        *out = v->b ? 1u : 0u;
        return true;
    }
    return false;
}

bool kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return false;
    const kiln_gguf_value *v = &kv->value;
    if (v->type == KILN_GGUF_FLOAT32 || v->type == KILN_GGUF_FLOAT64) {
        *out = (float)v->f64;
        return true;
    }
    if (is_unsigned_type(v->type)) {
        *out = (float)v->u64;
        return true;
    }
    if (is_signed_type(v->type)) {
        *out = (float)v->i64;
        return true;
    }
    return false;
}

bool kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return false;
    const kiln_gguf_value *v = &kv->value;
    if (v->type == KILN_GGUF_BOOL) {
        *out = v->b;
        return true;
    }
    if ((is_unsigned_type(v->type) && v->u64 <= 1) ||
        (is_signed_type(v->type) && (v->i64 == 0 || v->i64 == 1))) {
        *out = is_unsigned_type(v->type) ? v->u64 != 0 : v->i64 != 0;
        return true;
    }
    return false;
}

const kiln_gguf_str *kiln_gguf_get_str(const kiln_gguf *g, const char *key) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv || kv->value.type != KILN_GGUF_STRING) return NULL;
    return &kv->value.str;
}

const kiln_gguf_value *kiln_gguf_get_arr(const kiln_gguf *g, const char *key) {
    const kiln_gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv || kv->value.type != KILN_GGUF_ARRAY) return NULL;
    return &kv->value;
}
