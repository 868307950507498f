/* mapped_file.h - read-only memory mapping of a whole file, and memory hints for large buffers
 * (releasing mapped pages, huge pages, available memory). */
#ifndef KILN_UTIL_MAPPED_FILE_H
#define KILN_UTIL_MAPPED_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln.h"

/** A read-only mapping of a whole file. `data` is NULL when size == 0. */
typedef struct kiln_mapped_file {
    char *path;       /* owned copy of the path, for error messages */
    const void *data; /* mapping base, `size` bytes, PROT_READ */
    size_t size;      /* file size in bytes */
} kiln_mapped_file;

/**
 * Map `path` read-only (mmap(2), MAP_PRIVATE). The file is never copied.
 * Errors: KILN_ERR_IO (cannot open/stat/map; message names the path and errno text),
 *         KILN_ERR_INVALID_ARGUMENT (path is a directory), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_mapped_file_open(const char *path, kiln_mapped_file **out, kiln_error *err);

/** True when [p, p + n) lies inside f's mapping (overflow-safe). NULL f: false. */
bool kiln_mapped_file_contains(const kiln_mapped_file *f, const void *p, size_t n);

/**
 * Drop the whole pages of [p, p + n) that lie inside f's mapping from this process's memory
 * (madvise(2) MADV_DONTNEED): for data copied elsewhere (packed weights) whose pages need not
 * stay resident. The bytes stay readable: a later read maps them from the file again. Pages
 * only partly inside the range, and ranges outside the mapping, are left alone. NULL f is a
 * no-op.
 */
void kiln_mapped_file_release(const kiln_mapped_file *f, const void *p, size_t n);

/**
 * Ask for transparent huge pages (madvise(2) MADV_HUGEPAGE) on the 2 MiB-aligned part of
 * [p, p + n), before it is first written: a large buffer then takes one page fault per 2 MiB
 * instead of per 4 KiB. Only a hint: ignored where unsupported.
 */
void kiln_advise_hugepages(void *p, size_t n);

/**
 * Memory the system can still give this process without swapping, in bytes: MemAvailable
 * of /proc/meminfo (Linux proc(5): free memory plus reclaimable caches). 0 when unknown.
 */
size_t kiln_mem_available(void);

/** Unmap and free. NULL is a no-op. */
void kiln_mapped_file_close(kiln_mapped_file *f);

/**
 * Read a whole (small) file into a malloc'd NUL-terminated buffer, for JSON and text
 * files. *out_len excludes the NUL. Errors: KILN_ERR_IO, KILN_ERR_OUT_OF_MEMORY,
 * KILN_ERR_INVALID_ARGUMENT if larger than max_bytes.
 */
kiln_status kiln_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                           kiln_error *err);

#endif
