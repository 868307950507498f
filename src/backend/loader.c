/* loader.c - kiln_model_open: bind a model's weights, then place them for a backend. */
#include "backend/loader.h"

kiln_status kiln_model_open(const char *path, const kiln_model_load_params *params,
                            kiln_model **out, kiln_error *err) {
    kiln_model_load_params p = params ? *params : (kiln_model_load_params){0};
    if (!p.backend) p.backend = kiln_backend_ops_of(KILN_BACKEND_CPU);
    return kiln_model_load_file(path, &p, out, err);
}
