/*
 * model_internal.h - what the units of the model loader share inside src/model; not part of
 * the model API (model.h).
 */
#ifndef KILN_MODEL_MODEL_INTERNAL_H
#define KILN_MODEL_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

/* ---- model_owned.c ---- */

/** Zeroed memory of `bytes` (at least 1) owned by m: freed by kiln_model_close. NULL when out
 *  of memory. */
void *kiln_model_alloc(kiln_model *m, size_t bytes);

/** Set err to KILN_ERR_OUT_OF_MEMORY naming m's path; returns that status. */
kiln_status kiln_model_oom(const kiln_model *m, kiln_error *err);

/* ---- model_bind.c ---- */

/** Bind every weight of m (config m->cfg, m->layers allocated) from the GGUF file m->gguf
 *  by llama.cpp's tensor names, and refuse tensors of layers beyond the block_count metadata.
 *  Errors: KILN_ERR_FORMAT (missing tensor, wrong shape, an undeclared layer: named),
 *  KILN_ERR_UNSUPPORTED (dtype, a tensor the scheme has no name for), KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_model_bind_gguf(kiln_model *m, kiln_error *err);

/** The same from the safetensors of the Hugging Face directory m->safetensors, by
 *  transformers' module names (GPT-2's with or without the "transformer." prefix, as the
 *  file has them); tensors of layers beyond config.json's layer count are refused. */
kiln_status kiln_model_bind_hf(kiln_model *m, kiln_error *err);

/** Views of the llama2.c checkpoint m->llama2c's f32 arrays as m's weights (its fixed
 *  layout; the config must be validated). */
void kiln_model_bind_llama2c(kiln_model *m);

/* ---- model_files.c ---- */

/** True when p names a regular file (stat(2), symlinks followed). */
bool kiln_model_file_exists(const char *p);

/** True when p names a directory. */
bool kiln_model_is_dir(const char *p);

/** True when the file at path starts with the 4 bytes "GGUF"; false when it cannot be read. */
bool kiln_model_has_gguf_magic(const char *path);

/** The llama2.c tokenizer beside the checkpoint model_path: tokenizer.bin in its directory,
 *  else the only tok*.bin there. A malloc'd path, or NULL when there is none (or several). */
char *kiln_model_find_llama2c_tokenizer(const char *model_path);

/* ---- gen_defaults.c ---- */

/** Read m->path/generation_config.json when present (absent: KILN_OK, nothing set): the
 *  sampling defaults into m->gen (a field only where it has the right JSON type), and each
 *  eos_token_id (an int or a list, as transformers' generate stops on any of them) added to
 *  m->tokenizer's end-of-generation ids when there is a tokenizer.
 *  Errors: KILN_ERR_IO, KILN_ERR_FORMAT (malformed JSON, not an object, an eos id outside
 *  [0, n_vocab)), the tokenizer's errors. */
kiln_status kiln_model_read_gen_defaults(kiln_model *m, kiln_error *err);

#endif
