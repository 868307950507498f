/*
 * json_file.h - reading a whole JSON file (config.json, generation_config.json) with
 * jansson, with kiln's error conventions.
 */
#ifndef KILN_FORMAT_JSON_FILE_H
#define KILN_FORMAT_JSON_FILE_H

#include <jansson.h>
#include <stddef.h>

#include "util/error.h"

/**
 * Parse the JSON file at path (jansson json_loadf with flags, e.g. JSON_REJECT_DUPLICATES)
 * into *out, a new reference the caller json_decref's. On failure *out is NULL and:
 *   KILN_ERR_IO      "PATH: cannot open: <strerror>" (missing, unreadable, a directory);
 *   KILN_ERR_FORMAT  "PATH: line L, column C: <jansson's message>" for malformed JSON
 *                    (line/column omitted when jansson gives none).
 * Source: RFC 8259 through jansson's parser; the position is jansson's json_error_t.
 */
kiln_status kiln_json_load_path(const char *path, size_t flags, json_t **out, kiln_error *err);

#endif
