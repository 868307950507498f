/*
 * temp_file.h - the temporary file a writer fills before renaming it over its target, so a
 * failed write never leaves a truncated output and never touches other files.
 */
#ifndef KILN_UTIL_TEMP_FILE_H
#define KILN_UTIL_TEMP_FILE_H

#include <stddef.h>
#include <stdio.h>

/**
 * Create a new file "PATH.tmp.<pid>.<n>" beside path (O_CREAT | O_EXCL, mode 0666 less the
 * umask, as fopen would give) and open it for binary writing; an existing file of any
 * candidate name is skipped, never truncated. tmp (cap bytes) receives the name.
 * Returns the stream, or NULL with errno set (ENAMETOOLONG when the name does not fit in
 * cap; EEXIST after 100 names in use; else open's errno). POSIX open(2) semantics.
 */
FILE *kiln_temp_file_beside(const char *path, char *tmp, size_t cap);

#endif
