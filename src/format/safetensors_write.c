#include "format/safetensors_write.h"

#include <errno.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"
#include "util/temp_file.h"

static const char *st_dtype_name(kiln_dtype t) {
    switch (t) {
    case KILN_DTYPE_F32:
        return "F32";
    case KILN_DTYPE_F16:
        return "F16";
    case KILN_DTYPE_BF16:
        return "BF16";
    case KILN_DTYPE_I32:
        return "I32";
    default:
        return NULL;
    }
}

kiln_status kiln_safetensors_write(const char *path, const kiln_st_out_tensor *tensors, size_t n,
                                   kiln_error *err) {
    json_t *hdr = json_object();
    if (!hdr) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    size_t *sizes = calloc(n ? n : 1, sizeof *sizes);
    if (!sizes) {
        json_decref(hdr);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    kiln_status st = KILN_OK;
    uint64_t off = 0;
    for (size_t i = 0; i < n && st == KILN_OK; i++) {
        const kiln_st_out_tensor *t = &tensors[i];
        const char *dn = st_dtype_name(t->dtype);
        if (!dn || t->n_dims < 1 || t->n_dims > 8) {
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                "%s: tensor '%s': unsupported dtype or rank", path, t->name);
            break;
        }
        json_t *shape = json_array();
        uint64_t count = 1;
        for (int32_t d = 0; d < t->n_dims; d++) {
            if (t->shape[d] < 0) {
                st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: tensor '%s': negative dim",
                                    path, t->name);
                break;
            }
            count *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        sizes[i] = (size_t)count * kiln_dtype_traits_of(t->dtype)->type_size;
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dn, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + sizes[i]));
        if (!e || json_object_set_new(hdr, t->name, e) != 0)
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        off += sizes[i];
    }
    char *js = st == KILN_OK ? json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(hdr);
    if (st == KILN_OK && !js) st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != KILN_OK) {
        free(sizes);
        free(js);
        return st;
    }
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    /* A regular file (or a new path) is written to path.tmp and renamed, so a failed write
     * never leaves a truncated file. Anything else that exists (a device such as /dev/null,
     * a FIFO, a symlink's target) is written in place: renaming over it would replace the
     * node itself, which as root would destroy /dev/full or the link. */
    struct stat sb;
    bool in_place = stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
    bool is_link = lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
    if (is_link) in_place = true;
    char tmp[4300] = "";
    const char *target = path;
    FILE *f = in_place ? fopen(path, "wb") : kiln_temp_file_beside(path, tmp, sizeof tmp);
    if (!f) {
        st = kiln_error_set(err, KILN_ERR_IO, "%s: cannot create: %s", target, strerror(errno));
    } else {
        uint8_t len8[8];
        for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)padded >> (8 * b));
        bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(js, 1, jl, f) == jl;
        for (size_t p = jl; ok && p < padded; p++) ok = fputc(' ', f) != EOF;
        for (size_t i = 0; ok && i < n; i++)
            ok = sizes[i] == 0 || fwrite(tensors[i].data, 1, sizes[i], f) == sizes[i];
        if (ok && fflush(f) != 0) ok = false;
        int e = errno;
        if (fclose(f) != 0 && ok) {
            ok = false;
            e = errno;
        }
        if (!ok) {
            if (!in_place) remove(tmp);
            st = kiln_error_set(err, KILN_ERR_IO, "%s: write failed: %s", path, strerror(e));
        } else if (!in_place && rename(tmp, path) != 0) {
            e = errno;
            remove(tmp);
            st = kiln_error_set(err, KILN_ERR_IO, "%s: cannot rename into place: %s", path,
                                strerror(e));
        }
    }
    free(js);
    free(sizes);
    return st;
}
