#include "format/json_file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

kiln_status kiln_json_load_path(const char *path, size_t flags, json_t **out, kiln_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(EISDIR));
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error_set(err, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    json_error_t je;
    json_t *root = json_loadf(f, flags, &je);
    int read_failed = ferror(f);
    fclose(f);
    if (root) {
        *out = root;
        return KILN_OK;
    }
    if (read_failed) return kiln_error_set(err, KILN_ERR_IO, "%s: read error", path);
    if (je.line > 0)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: line %d, column %d: %s", path, je.line,
                              je.column, je.text);
    return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s", path, je.text);
}
