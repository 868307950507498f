/*
 * gen_defaults.c - a Hugging Face directory's generation_config.json: the sampling defaults
 * the checkpoint ships (kiln_gen_defaults) and its end-of-generation ids.
 */
#include <jansson.h>
#include <stdio.h>

#include "format/json_file.h"
#include "model/model_internal.h"
#include "util/error.h"

/* generation_config.json (optional): sampling defaults, and eos_token_id (int or list) marks
 * end-of-generation ids, as transformers' generate stops on any of them. */
kiln_status kiln_model_read_gen_defaults(kiln_model *m, kiln_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", m->path);
    if (!kiln_model_file_exists(path)) return KILN_OK;
    json_t *root;
    kiln_status jst = kiln_json_load_path(path, 0, &root, err);
    if (jst) return jst;
    if (!json_is_object(root)) {
        json_decref(root);
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: the top level is not an object", path);
    }
    kiln_gen_defaults *g = &m->gen;
    json_t *v;
    if (json_is_number(v = json_object_get(root, "temperature"))) {
        g->has_temperature = true;
        g->temperature = (float)json_number_value(v);
    }
    if (json_is_number(v = json_object_get(root, "top_p"))) {
        g->has_top_p = true;
        g->top_p = (float)json_number_value(v);
    }
    if (json_is_integer(v = json_object_get(root, "top_k"))) {
        g->has_top_k = true;
        g->top_k = (int32_t)json_integer_value(v);
    }
    if (json_is_number(v = json_object_get(root, "min_p"))) {
        g->has_min_p = true;
        g->min_p = (float)json_number_value(v);
    }
    if (json_is_number(v = json_object_get(root, "repetition_penalty"))) {
        g->has_repetition_penalty = true;
        g->repetition_penalty = (float)json_number_value(v);
    }
    if (json_is_boolean(v = json_object_get(root, "do_sample"))) {
        g->has_do_sample = true;
        g->do_sample = json_is_true(v);
    }
    kiln_status st = KILN_OK;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (m->tokenizer && eos) {
        size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
        for (size_t i = 0; i < n && st == KILN_OK; i++) {
            json_t *e = json_is_array(eos) ? json_array_get(eos, i) : eos;
            if (!json_is_integer(e)) continue;
            json_int_t id = json_integer_value(e);
            if (id < 0 || id >= m->cfg.n_vocab)
                st =
                    kiln_error_set(err, KILN_ERR_FORMAT, "%s: eos_token_id %lld is outside [0, %d)",
                                   path, (long long)id, m->cfg.n_vocab);
            else
                st = kiln_tokenizer_add_eog(m->tokenizer, (int32_t)id, err);
        }
    }
    json_decref(root);
    return st;
}
