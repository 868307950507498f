/*
 * gguf_write.c - GGUF v3 writer (spec: ggml/docs/gguf.md). See gguf_write.h.
 *
 * Values are encoded little-endian; packed scalar arrays are copied as they are, which is
 * only right on a little-endian host (checked below at compile time).
 */
#include "format/gguf_write.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/temp_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c assumes a little-endian host"
#endif

#define GGUF_MAX_KEY         65535u
#define GGUF_MAX_TENSOR_NAME 63u /* GGML_MAX_NAME (64) less the NUL */
#define GGUF_MAX_DEPTH       8   /* as the reader */
#define ROWS_CHUNK_BYTES     ((size_t)8 << 20)
#define FILE_BUFFER_BYTES    ((size_t)4 << 20)

typedef struct wkv {
    char *key;
    kiln_gguf_value v;
} wkv;

typedef struct wtensor {
    char *name;
    kiln_dtype dtype;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    uint64_t offset; /* in the data section; set by begin */
} wtensor;

struct kiln_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    uint64_t alignment;

    /* writing state */
    bool begun, finished, dead;
    bool direct; /* writing to a non-regular target in place */
    FILE *f;
    char *fbuf;
    char *path, *tmp;
    uint64_t pos;      /* bytes written so far */
    size_t cur;        /* current tensor */
    uint64_t cur_done; /* bytes of the current tensor written */
};

/* ---- values -------------------------------------------------------------------------- */

static size_t scalar_size(kiln_gguf_type t) {
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

static bool is_int_type(kiln_gguf_type t) {
    return t == KILN_GGUF_UINT8 || t == KILN_GGUF_INT8 || t == KILN_GGUF_UINT16 ||
           t == KILN_GGUF_INT16 || t == KILN_GGUF_UINT32 || t == KILN_GGUF_INT32 ||
           t == KILN_GGUF_UINT64 || t == KILN_GGUF_INT64;
}

static void value_free(kiln_gguf_value *v) {
    if (v->type == KILN_GGUF_STRING) {
        free(v->str.data);
    } else if (v->type == KILN_GGUF_ARRAY && v->arr.data) {
        if (v->arr.elem_type == KILN_GGUF_STRING) {
            kiln_gguf_str *s = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++) free(s[i].data);
        } else if (v->arr.elem_type == KILN_GGUF_ARRAY) {
            kiln_gguf_value *a = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++) value_free(&a[i]);
        }
        free(v->arr.data);
    }
    memset(v, 0, sizeof *v);
}

static bool str_copy(kiln_gguf_str *dst, const kiln_gguf_str *src) {
    dst->len = src->len;
    dst->data = malloc((size_t)src->len + 1);
    if (!dst->data) return false;
    if (src->len) memcpy(dst->data, src->data, (size_t)src->len);
    dst->data[src->len] = '\0';
    return true;
}

/* Deep copy with validation. `what` names the key for messages. */
static kiln_status value_copy(kiln_gguf_value *dst, const kiln_gguf_value *src, int depth,
                              const char *what, kiln_error *err) {
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    switch (src->type) {
    case KILN_GGUF_UINT8:
    case KILN_GGUF_UINT16:
    case KILN_GGUF_UINT32:
    case KILN_GGUF_UINT64: {
        uint64_t max = src->type == KILN_GGUF_UINT8    ? 0xFFu
                       : src->type == KILN_GGUF_UINT16 ? 0xFFFFu
                       : src->type == KILN_GGUF_UINT32 ? 0xFFFFFFFFu
                                                       : UINT64_MAX;
        if (src->u64 > max)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "key '%s': value %llu does not fit its unsigned type", what,
                                  (unsigned long long)src->u64);
        dst->u64 = src->u64;
        return KILN_OK;
    }
    case KILN_GGUF_INT8:
    case KILN_GGUF_INT16:
    case KILN_GGUF_INT32:
    case KILN_GGUF_INT64: {
        int64_t lim = src->type == KILN_GGUF_INT8    ? 127
                      : src->type == KILN_GGUF_INT16 ? 32767
                      : src->type == KILN_GGUF_INT32 ? 2147483647
                                                     : INT64_MAX;
        if (src->i64 > lim || src->i64 < -lim - 1)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "key '%s': value %lld does not fit its signed type", what,
                                  (long long)src->i64);
        dst->i64 = src->i64;
        return KILN_OK;
    }
    case KILN_GGUF_FLOAT32:
    case KILN_GGUF_FLOAT64:
        dst->f64 = src->f64;
        return KILN_OK;
    case KILN_GGUF_BOOL:
        dst->b = src->b;
        return KILN_OK;
    case KILN_GGUF_STRING:
        if (!src->str.data && src->str.len)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "key '%s': string without data",
                                  what);
        if (!str_copy(&dst->str, &src->str)) goto oom;
        return KILN_OK;
    case KILN_GGUF_ARRAY:
        break;
    default:
        dst->type = KILN_GGUF_UINT8; /* nothing owned */
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "key '%s': invalid type tag %d", what,
                              (int)src->type);
    }
    /* array */
    kiln_gguf_type et = src->arr.elem_type;
    uint64_t n = src->arr.n;
    dst->arr.elem_type = et;
    dst->arr.n = 0;
    dst->arr.data = NULL;
    if (et == KILN_GGUF_ARRAY && depth + 1 >= GGUF_MAX_DEPTH)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "key '%s': arrays nested deeper than %d levels", what,
                              GGUF_MAX_DEPTH);
    size_t es = et == KILN_GGUF_STRING  ? sizeof(kiln_gguf_str)
                : et == KILN_GGUF_ARRAY ? sizeof(kiln_gguf_value)
                                        : scalar_size(et);
    if (es == 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "key '%s': invalid array element type tag %d", what, (int)et);
    if (n == 0) return KILN_OK;
    if (!src->arr.data)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "key '%s': array without data", what);
    if (n > SIZE_MAX / es) goto oom;
    if (et == KILN_GGUF_STRING) {
        kiln_gguf_str *a = calloc((size_t)n, sizeof *a);
        if (!a) goto oom;
        dst->arr.data = a;
        dst->arr.n = n; /* zeroed entries free cleanly */
        const kiln_gguf_str *s = src->arr.data;
        for (uint64_t i = 0; i < n; i++) {
            if (!s[i].data && s[i].len)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "key '%s': array string %llu without data", what,
                                      (unsigned long long)i);
            if (!str_copy(&a[i], &s[i])) goto oom;
        }
    } else if (et == KILN_GGUF_ARRAY) {
        kiln_gguf_value *a = calloc((size_t)n, sizeof *a);
        if (!a) goto oom;
        dst->arr.data = a;
        dst->arr.n = n;
        const kiln_gguf_value *s = src->arr.data;
        for (uint64_t i = 0; i < n; i++) {
            if (s[i].type != KILN_GGUF_ARRAY) {
                a[i].type = KILN_GGUF_UINT8;
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "key '%s': element %llu of an array of arrays is not an "
                                      "array",
                                      what, (unsigned long long)i);
            }
            kiln_status st = value_copy(&a[i], &s[i], depth + 1, what, err);
            if (st) return st;
        }
    } else {
        if (et == KILN_GGUF_BOOL) {
            const uint8_t *b = src->arr.data;
            for (uint64_t i = 0; i < n; i++)
                if (b[i] > 1)
                    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                          "key '%s': bool array element %llu is %u, not 0 or 1",
                                          what, (unsigned long long)i, b[i]);
        }
        void *a = malloc((size_t)n * es);
        if (!a) goto oom;
        memcpy(a, src->arr.data, (size_t)n * es);
        dst->arr.data = a;
        dst->arr.n = n;
    }
    return KILN_OK;
oom:
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "key '%s': out of memory", what);
}

/* ---- writer -------------------------------------------------------------------------- */

kiln_status kiln_gguf_writer_create(kiln_gguf_writer **out, kiln_error *err) {
    *out = NULL;
    kiln_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    w->alignment = 32;
    *out = w;
    return KILN_OK;
}

static void close_and_discard(kiln_gguf_writer *w) {
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
    }
    if (w->tmp && !w->direct) remove(w->tmp);
    free(w->fbuf);
    w->fbuf = NULL;
}

void kiln_gguf_writer_destroy(kiln_gguf_writer *w) {
    if (!w) return;
    if (w->begun && !w->finished && !w->dead) close_and_discard(w);
    free(w->fbuf);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].v);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->path);
    free(w->tmp);
    free(w);
}

static kiln_status check_not_begun(const kiln_gguf_writer *w, kiln_error *err) {
    if (w->begun)
        return kiln_error_set(
            err, KILN_ERR_INVALID_ARGUMENT,
            "gguf writer: metadata and tensors cannot change after writing began");
    return KILN_OK;
}

static kiln_status check_key(const char *key, kiln_error *err) {
    if (!key || !*key)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "gguf writer: empty metadata key");
    if (strlen(key) > GGUF_MAX_KEY)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: metadata key of %zu bytes is longer than %u",
                              strlen(key), GGUF_MAX_KEY);
    return KILN_OK;
}

static wkv *find_kv(const kiln_gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return &w->kv[i];
    return NULL;
}

/* The alignment a value asks for, or 0 when it is not a valid alignment. */
static uint64_t alignment_of(const kiln_gguf_value *v) {
    uint64_t a;
    if (!is_int_type(v->type)) return 0;
    if (v->type == KILN_GGUF_INT8 || v->type == KILN_GGUF_INT16 || v->type == KILN_GGUF_INT32 ||
        v->type == KILN_GGUF_INT64) {
        if (v->i64 <= 0) return 0;
        a = (uint64_t)v->i64;
    } else {
        a = v->u64;
    }
    if (a == 0 || a > ((uint64_t)1 << 30) || (a & (a - 1)) != 0) return 0;
    return a;
}

kiln_status kiln_gguf_writer_set(kiln_gguf_writer *w, const char *key, const kiln_gguf_value *v,
                                 kiln_error *err) {
    kiln_status st;
    if ((st = check_not_begun(w, err)) || (st = check_key(key, err))) return st;
    uint64_t align = 0;
    if (strcmp(key, "general.alignment") == 0) {
        align = alignment_of(v);
        if (!align)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "gguf writer: general.alignment must be an integer power of two "
                                  "in [1, 2^30]");
    }
    kiln_gguf_value copy;
    if ((st = value_copy(&copy, v, 0, key, err))) {
        value_free(&copy);
        return st;
    }
    wkv *e = find_kv(w, key);
    if (e) {
        value_free(&e->v);
        e->v = copy;
    } else {
        if (w->n_kv == w->cap_kv) {
            size_t nc = w->cap_kv ? w->cap_kv * 2 : 16;
            wkv *nk = realloc(w->kv, nc * sizeof *nk);
            if (!nk) goto oom;
            w->kv = nk;
            w->cap_kv = nc;
        }
        char *k = strdup(key);
        if (!k) goto oom;
        w->kv[w->n_kv].key = k;
        w->kv[w->n_kv].v = copy;
        w->n_kv++;
    }
    if (align) w->alignment = align;
    return KILN_OK;
oom:
    value_free(&copy);
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "gguf writer: out of memory");
}

#define SETTER(fn, ctype, tag, field)                                                              \
    kiln_status fn(kiln_gguf_writer *w, const char *key, ctype x, kiln_error *err) {               \
        kiln_gguf_value v;                                                                         \
        memset(&v, 0, sizeof v);                                                                   \
        v.type = tag;                                                                              \
        v.field = x;                                                                               \
        return kiln_gguf_writer_set(w, key, &v, err);                                              \
    }
SETTER(kiln_gguf_writer_set_u8, uint8_t, KILN_GGUF_UINT8, u64)
SETTER(kiln_gguf_writer_set_i8, int8_t, KILN_GGUF_INT8, i64)
SETTER(kiln_gguf_writer_set_u16, uint16_t, KILN_GGUF_UINT16, u64)
SETTER(kiln_gguf_writer_set_i16, int16_t, KILN_GGUF_INT16, i64)
SETTER(kiln_gguf_writer_set_u32, uint32_t, KILN_GGUF_UINT32, u64)
SETTER(kiln_gguf_writer_set_i32, int32_t, KILN_GGUF_INT32, i64)
SETTER(kiln_gguf_writer_set_u64, uint64_t, KILN_GGUF_UINT64, u64)
SETTER(kiln_gguf_writer_set_i64, int64_t, KILN_GGUF_INT64, i64)
SETTER(kiln_gguf_writer_set_f32, float, KILN_GGUF_FLOAT32, f64)
SETTER(kiln_gguf_writer_set_f64, double, KILN_GGUF_FLOAT64, f64)
SETTER(kiln_gguf_writer_set_bool, bool, KILN_GGUF_BOOL, b)
#undef SETTER

kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *s,
                                     kiln_error *err) {
    if (!s) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "key '%s': NULL string", key);
    kiln_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = KILN_GGUF_STRING;
    v.str.data = (char *)s;
    v.str.len = strlen(s);
    return kiln_gguf_writer_set(w, key, &v, err);
}

kiln_status kiln_gguf_writer_set_array(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem,
                                       const void *data, uint64_t n, kiln_error *err) {
    if (scalar_size(elem) == 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "key '%s': kiln_gguf_writer_set_array takes scalar elements only",
                              key ? key : "");
    kiln_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = KILN_GGUF_ARRAY;
    v.arr.elem_type = elem;
    v.arr.n = n;
    v.arr.data = (void *)data;
    return kiln_gguf_writer_set(w, key, &v, err);
}

kiln_status kiln_gguf_writer_set_str_array(kiln_gguf_writer *w, const char *key,
                                           const char *const *strs, uint64_t n, kiln_error *err) {
    if (n > SIZE_MAX / sizeof(kiln_gguf_str))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "key '%s': out of memory", key);
    kiln_gguf_str *s = n ? malloc((size_t)n * sizeof *s) : NULL;
    if (n && !s) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "key '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(s);
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "key '%s': string %llu is NULL",
                                  key, (unsigned long long)i);
        }
        s[i].data = (char *)strs[i];
        s[i].len = strlen(strs[i]);
    }
    kiln_gguf_value v;
    memset(&v, 0, sizeof v);
    v.type = KILN_GGUF_ARRAY;
    v.arr.elem_type = KILN_GGUF_STRING;
    v.arr.n = n;
    v.arr.data = s;
    kiln_status st = kiln_gguf_writer_set(w, key, &v, err);
    free(s);
    return st;
}

bool kiln_gguf_writer_remove(kiln_gguf_writer *w, const char *key) {
    if (w->begun || !key) return false;
    wkv *e = find_kv(w, key);
    if (!e) return false;
    size_t i = (size_t)(e - w->kv);
    free(e->key);
    value_free(&e->v);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - i - 1) * sizeof *w->kv);
    w->n_kv--;
    if (strcmp(key, "general.alignment") == 0) w->alignment = 32;
    return true;
}

const kiln_gguf_value *kiln_gguf_writer_get(const kiln_gguf_writer *w, const char *key) {
    const wkv *e = key ? find_kv(w, key) : NULL;
    return e ? &e->v : NULL;
}

kiln_status kiln_gguf_writer_copy_kv(kiln_gguf_writer *w, const kiln_gguf *src, const char *prefix,
                                     kiln_error *err) {
    size_t pl = prefix ? strlen(prefix) : 0;
    for (size_t i = 0; i < src->n_kv; i++) {
        if (pl && strncmp(src->kv[i].key, prefix, pl) != 0) continue;
        kiln_status st = kiln_gguf_writer_set(w, src->kv[i].key, &src->kv[i].value, err);
        if (st) return st;
    }
    return KILN_OK;
}

uint64_t kiln_gguf_writer_alignment(const kiln_gguf_writer *w) {
    return w->alignment;
}

/* ---- tensors ------------------------------------------------------------------------- */

kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, kiln_dtype dtype,
                                        uint32_t n_dims, const int64_t *ne, kiln_error *err) {
    kiln_status st;
    if ((st = check_not_begun(w, err))) return st;
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > GGUF_MAX_TENSOR_NAME)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: tensor name '%s' must be 1..%u bytes", name ? name : "",
                              GGUF_MAX_TENSOR_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "gguf writer: tensor '%s' declared twice", name);
    const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)dtype);
    if (!tr)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "gguf writer: tensor '%s': dtype %d is not supported", name,
                              (int)dtype);
    if (n_dims < 1 || n_dims > 4)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: tensor '%s': n_dims %u is not in 1..4", name, n_dims);
    wtensor t = {0};
    t.dtype = dtype;
    t.n_dims = n_dims;
    for (int d = 0; d < 4; d++) t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "gguf writer: tensor '%s': ne[%u] = %lld must be >= 1", name, d,
                                  (long long)ne[d]);
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % tr->block_size != 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s "
                              "block size %d",
                              name, (long long)t.ne[0], tr->name, tr->block_size);
    uint64_t nb = kiln_dtype_row_size(dtype, t.ne[0]);
    for (int d = 1; d < 4 && nb; d++) {
        if ((uint64_t)t.ne[d] > (UINT64_MAX >> 2) / nb)
            nb = 0;
        else
            nb *= (uint64_t)t.ne[d];
    }
    if (nb == 0 || nb > ((uint64_t)1 << 60))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: tensor '%s': size overflows", name);
    t.nbytes = nb;
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = nc;
    }
    if (!(t.name = strdup(name)))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "gguf writer: out of memory");
    w->t[w->n_t++] = t;
    return KILN_OK;
}

size_t kiln_gguf_writer_n_tensors(const kiln_gguf_writer *w) {
    return w->n_t;
}

uint64_t kiln_gguf_writer_tensor_nbytes(const kiln_gguf_writer *w, size_t i) {
    return i < w->n_t ? w->t[i].nbytes : 0;
}

/* ---- encoding ------------------------------------------------------------------------ */

/* Write failure: capture errno, drop the file, mark the writer dead. */
static kiln_status fail_io(kiln_gguf_writer *w, int e, const char *what, kiln_error *err) {
    const char *target = w->direct ? w->path : w->tmp;
    close_and_discard(w);
    w->dead = true;
    return kiln_error_set(err, KILN_ERR_IO, "%s: %s failed: %s", target ? target : "(gguf)", what,
                          strerror(e ? e : EIO));
}

static bool put(kiln_gguf_writer *w, const void *p, size_t n) {
    if (n == 0) return true;
    if (fwrite(p, 1, n, w->f) != n) return false;
    w->pos += n;
    return true;
}

static bool put_u32(kiln_gguf_writer *w, uint32_t x) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(x >> (8 * i));
    return put(w, b, 4);
}

static bool put_u64(kiln_gguf_writer *w, uint64_t x) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(x >> (8 * i));
    return put(w, b, 8);
}

static bool put_str(kiln_gguf_writer *w, const char *s, uint64_t len) {
    return put_u64(w, len) && put(w, s, (size_t)len);
}

static bool put_zeros(kiln_gguf_writer *w, uint64_t n) {
    static const uint8_t z[256];
    while (n) {
        size_t k = n > sizeof z ? sizeof z : (size_t)n;
        if (!put(w, z, k)) return false;
        n -= k;
    }
    return true;
}

static bool put_scalar(kiln_gguf_writer *w, const kiln_gguf_value *v) {
    switch (v->type) {
    case KILN_GGUF_UINT8: {
        uint8_t x = (uint8_t)v->u64;
        return put(w, &x, 1);
    }
    case KILN_GGUF_INT8: {
        uint8_t x = (uint8_t)(int8_t)v->i64;
        return put(w, &x, 1);
    }
    case KILN_GGUF_UINT16:
    case KILN_GGUF_INT16: {
        uint16_t x = v->type == KILN_GGUF_UINT16 ? (uint16_t)v->u64 : (uint16_t)(int16_t)v->i64;
        uint8_t b[2] = {(uint8_t)x, (uint8_t)(x >> 8)};
        return put(w, b, 2);
    }
    case KILN_GGUF_UINT32:
        return put_u32(w, (uint32_t)v->u64);
    case KILN_GGUF_INT32:
        return put_u32(w, (uint32_t)(int32_t)v->i64);
    case KILN_GGUF_UINT64:
        return put_u64(w, v->u64);
    case KILN_GGUF_INT64:
        return put_u64(w, (uint64_t)v->i64);
    case KILN_GGUF_FLOAT32: {
        float f = (float)v->f64;
        uint32_t u;
        memcpy(&u, &f, 4);
        return put_u32(w, u);
    }
    case KILN_GGUF_FLOAT64: {
        uint64_t u;
        memcpy(&u, &v->f64, 8);
        return put_u64(w, u);
    }
    case KILN_GGUF_BOOL: {
        uint8_t x = v->b ? 1 : 0;
        return put(w, &x, 1);
    }
    default:
        return false;
    }
}

static bool put_value(kiln_gguf_writer *w, const kiln_gguf_value *v) {
    if (v->type == KILN_GGUF_STRING) return put_str(w, v->str.data, v->str.len);
    if (v->type != KILN_GGUF_ARRAY) return put_scalar(w, v);
    kiln_gguf_type et = v->arr.elem_type;
    if (!put_u32(w, (uint32_t)et) || !put_u64(w, v->arr.n)) return false;
    if (et == KILN_GGUF_STRING) {
        const kiln_gguf_str *s = v->arr.data;
        for (uint64_t i = 0; i < v->arr.n; i++)
            if (!put_str(w, s[i].data, s[i].len)) return false;
        return true;
    }
    if (et == KILN_GGUF_ARRAY) {
        const kiln_gguf_value *a = v->arr.data;
        for (uint64_t i = 0; i < v->arr.n; i++)
            if (!put_value(w, &a[i])) return false;
        return true;
    }
    return put(w, v->arr.data, (size_t)v->arr.n * scalar_size(et)); /* little-endian host */
}

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

kiln_status kiln_gguf_writer_begin(kiln_gguf_writer *w, const char *path, kiln_error *err) {
    if (w->begun)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "gguf writer: already begun");
    if (!path || !*path)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "gguf writer: empty output path");
    size_t pl = strlen(path);
    if (pl > 4000)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "gguf writer: output path too long");
    struct stat sb;
    w->direct = stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode);
    w->path = strdup(path);
    w->tmp = malloc(pl + 40);
    w->fbuf = malloc(FILE_BUFFER_BYTES);
    if (!w->path || !w->tmp || !w->fbuf) {
        free(w->fbuf);
        w->fbuf = NULL;
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "gguf writer: out of memory");
    }
    w->tmp[0] = '\0';
    const char *target = w->direct ? w->path : path;
    w->f = w->direct ? fopen(target, "wb") : kiln_temp_file_beside(path, w->tmp, pl + 40);
    if (!w->f) {
        int e = errno;
        free(w->fbuf);
        w->fbuf = NULL;
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot create: %s", target, strerror(e));
    }
    setvbuf(w->f, w->fbuf, _IOFBF, FILE_BUFFER_BYTES);
    w->begun = true;
    w->pos = 0;

    /* data offsets */
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off = align_up(off + w->t[i].nbytes, w->alignment);
    }
    errno = 0;
    bool ok = put(w, "GGUF", 4) && put_u32(w, 3) && put_u64(w, w->n_t) && put_u64(w, w->n_kv);
    for (size_t i = 0; ok && i < w->n_kv; i++)
        ok = put_str(w, w->kv[i].key, strlen(w->kv[i].key)) &&
             put_u32(w, (uint32_t)w->kv[i].v.type) && put_value(w, &w->kv[i].v);
    for (size_t i = 0; ok && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        ok = put_str(w, t->name, strlen(t->name)) && put_u32(w, t->n_dims);
        for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = put_u64(w, (uint64_t)t->ne[d]);
        ok = ok && put_u32(w, (uint32_t)t->dtype) && put_u64(w, t->offset);
    }
    ok = ok && put_zeros(w, align_up(w->pos, w->alignment) - w->pos);
    if (!ok) return fail_io(w, errno, "write", err);
    w->cur = 0;
    w->cur_done = 0;
    return KILN_OK;
}

static kiln_status check_writing(const kiln_gguf_writer *w, kiln_error *err) {
    if (w->dead) return kiln_error_set(err, KILN_ERR_IO, "%s: an earlier write failed", w->path);
    if (!w->begun || w->finished)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: not writing (begin not called, or finished)");
    return KILN_OK;
}

kiln_status kiln_gguf_writer_write_data(kiln_gguf_writer *w, const void *data, size_t n,
                                        kiln_error *err) {
    kiln_status st;
    if ((st = check_writing(w, err))) return st;
    const uint8_t *p = data;
    while (n > 0) {
        if (w->cur >= w->n_t)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "%s: %zu bytes of tensor data beyond the declared tensors",
                                  w->path, n);
        wtensor *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        size_t take = n < left ? n : (size_t)left;
        errno = 0;
        if (!put(w, p, take)) return fail_io(w, errno, "write", err);
        p += take;
        n -= take;
        w->cur_done += take;
        if (w->cur_done == t->nbytes) {
            uint64_t end = t->offset + t->nbytes;
            errno = 0;
            if (!put_zeros(w, align_up(end, w->alignment) - end))
                return fail_io(w, errno, "write", err);
            w->cur++;
            w->cur_done = 0;
        }
    }
    return KILN_OK;
}

typedef struct rows_job {
    kiln_gguf_row_fn fn;
    void *ctx;
    const kiln_dtype_traits *tr;
    int64_t ne0;
    size_t row_bytes;
    int64_t row0, n; /* rows of this chunk */
    uint8_t *out;
    float *scratch; /* ne0 floats per thread */
} rows_job;

static void rows_worker(void *vctx, int ith, int nth) {
    rows_job *j = vctx;
    int64_t per = (j->n + nth - 1) / nth;
    int64_t a = (int64_t)ith * per, b = a + per < j->n ? a + per : j->n;
    float *buf = j->scratch + (size_t)ith * (size_t)j->ne0;
    for (int64_t r = a; r < b; r++) {
        j->fn(j->ctx, j->row0 + r, buf);
        j->tr->from_float(buf, j->out + (size_t)r * j->row_bytes, j->ne0);
    }
}

kiln_status kiln_gguf_writer_write_rows(kiln_gguf_writer *w, kiln_gguf_row_fn fn, void *ctx,
                                        int64_t n_rows, kiln_threadpool *tp, kiln_error *err) {
    kiln_status st;
    if ((st = check_writing(w, err))) return st;
    if (w->cur >= w->n_t)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: write_rows: every declared tensor is complete", w->path);
    const wtensor *t = &w->t[w->cur];
    const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)t->dtype);
    if (!tr || !tr->from_float)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: tensor '%s': dtype %s has no quantizer", w->path, t->name,
                              kiln_dtype_name((int32_t)t->dtype));
    size_t row_bytes = kiln_dtype_row_size(t->dtype, t->ne[0]);
    if (w->cur_done % row_bytes != 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: tensor '%s': write_rows not at a row boundary", w->path,
                              t->name);
    int64_t row0 = (int64_t)(w->cur_done / row_bytes);
    int64_t total = (int64_t)(t->nbytes / row_bytes);
    if (n_rows < 0 || n_rows > total - row0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: tensor '%s': %lld rows asked, %lld left", w->path, t->name,
                              (long long)n_rows, (long long)(total - row0));
    if (n_rows == 0) return KILN_OK;
    int nth = kiln_threadpool_size(tp);
    int64_t chunk = (int64_t)(ROWS_CHUNK_BYTES / row_bytes);
    if (chunk < nth) chunk = nth;
    if (chunk > n_rows) chunk = n_rows;
    rows_job j = {fn, ctx, tr, t->ne[0], row_bytes, 0, 0, NULL, NULL};
    j.out = malloc((size_t)chunk * row_bytes);
    j.scratch = malloc((size_t)nth * (size_t)t->ne[0] * sizeof(float));
    if (!j.out || !j.scratch) {
        free(j.out);
        free(j.scratch);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory",
                              w->path, t->name);
    }
    st = KILN_OK;
    for (int64_t done = 0; done < n_rows && st == KILN_OK; done += j.n) {
        j.row0 = row0 + done;
        j.n = n_rows - done < chunk ? n_rows - done : chunk;
        kiln_threadpool_run(tp, rows_worker, &j);
        st = kiln_gguf_writer_write_data(w, j.out, (size_t)j.n * row_bytes, err);
    }
    free(j.out);
    free(j.scratch);
    return st;
}

kiln_status kiln_gguf_writer_finish(kiln_gguf_writer *w, kiln_error *err) {
    kiln_status st;
    if ((st = check_writing(w, err))) return st;
    if (w->cur < w->n_t) {
        const wtensor *t = &w->t[w->cur];
        st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                            "%s: tensor '%s' got %llu of its %llu bytes (and %zu later tensors "
                            "none)",
                            w->path, t->name, (unsigned long long)w->cur_done,
                            (unsigned long long)t->nbytes, w->n_t - w->cur - 1);
        close_and_discard(w);
        w->dead = true;
        return st;
    }
    errno = 0;
    if (fflush(w->f) != 0) return fail_io(w, errno, "write", err);
    if (!w->direct && fsync(fileno(w->f)) != 0) return fail_io(w, errno, "fsync", err);
    FILE *f = w->f;
    w->f = NULL;
    errno = 0;
    if (fclose(f) != 0) return fail_io(w, errno, "close", err);
    free(w->fbuf);
    w->fbuf = NULL;
    if (!w->direct && rename(w->tmp, w->path) != 0) {
        int e = errno;
        remove(w->tmp);
        w->dead = true;
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot rename %s into place: %s", w->path,
                              w->tmp, strerror(e));
    }
    w->finished = true;
    return KILN_OK;
}

kiln_status kiln_gguf_writer_write_file(kiln_gguf_writer *w, const char *path,
                                        const void *const *data, kiln_error *err) {
    kiln_status st = kiln_gguf_writer_begin(w, path, err);
    for (size_t i = 0; st == KILN_OK && i < w->n_t; i++) {
        uint64_t n = w->t[i].nbytes;
        if (n > SIZE_MAX)
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: tensor '%s' too large", path,
                                w->t[i].name);
        else if (!data[i])
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: tensor '%s': NULL data", path,
                                w->t[i].name);
        else
            st = kiln_gguf_writer_write_data(w, data[i], (size_t)n, err);
    }
    if (st == KILN_OK) return kiln_gguf_writer_finish(w, err);
    if (!w->dead) {
        close_and_discard(w);
        w->dead = true;
    }
    return st;
}

uint32_t kiln_gguf_file_type(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32:
        return 0;
    case KILN_DTYPE_F16:
        return 1;
    case KILN_DTYPE_Q4_0:
        return 2;
    case KILN_DTYPE_Q8_0:
        return 7;
    case KILN_DTYPE_Q4_K:
        return 15;
    case KILN_DTYPE_Q6_K:
        return 18;
    case KILN_DTYPE_BF16:
        return 32;
    default:
        return UINT32_MAX;
    }
}

kiln_status kiln_gguf_writer_set_file_type(kiln_gguf_writer *w, kiln_dtype t, kiln_error *err) {
    uint32_t ft = kiln_gguf_file_type(t);
    if (ft == UINT32_MAX)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gguf writer: no llama.cpp file type for dtype %s",
                              kiln_dtype_name((int32_t)t));
    kiln_status st = kiln_gguf_writer_set_u32(w, "general.file_type", ft, err);
    if (st) return st;
    const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)t);
    if (tr && tr->is_quantized)
        return kiln_gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    kiln_gguf_writer_remove(w, "general.quantization_version");
    return KILN_OK;
}
