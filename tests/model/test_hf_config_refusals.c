/*
 * Unsupported Hugging Face configurations are refused at load time with a message naming
 * what is missing, never run with wrong numerics; and the reference parity test has teeth:
 * a config that drops a feature the checkpoint needs (Mistral's sliding window) really
 * changes the logits.
 * Each case copies a ../shared/reference/hf/<arch>/config.json into a temp dir with one
 * edit, the weights symlinked.
 */
#include "model_test_util.h"

typedef struct edit {
    const char *key;  /* field set at the top level of config.json (NULL: none) */
    const char *json; /* its new value, as JSON text */
} edit;

static void apply_edit(json_t *cfg, const void *arg) {
    const edit *e = arg;
    if (!e->key) return;
    json_error_t jerr;
    json_t *v = json_loads(e->json, JSON_DECODE_ANY, &jerr);
    REQUIRE(v);
    json_object_set_new(cfg, e->key, v);
}

typedef struct refusal {
    const char *arch;
    edit e;
    kiln_status want;
    const char *must_mention; /* substring the error message must contain */
} refusal;

static const refusal CASES[] = {
    {"llama", {"model_type", "\"falcon\""}, KILN_ERR_UNSUPPORTED, "model_type 'falcon'"},
    {"llama", {"model_type", "null"}, KILN_ERR_UNSUPPORTED, "model_type '(missing)'"},
    {"llama",
     {"rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0}"},
     KILN_ERR_UNSUPPORTED,
     "rope_type 'yarn'"},
    {"llama",
     {"rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}"},
     KILN_ERR_UNSUPPORTED,
     "rope_scaling: rope_type 'dynamic'"},
    {"llama3",
     {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}"},
     KILN_ERR_UNSUPPORTED,
     "disagree"},
    {"llama", {"rope_scaling", "null"}, KILN_OK, NULL},
    {"llama", {"hidden_act", "\"relu\""}, KILN_ERR_UNSUPPORTED, "hidden_act 'relu'"},
    {"llama", {"mlp_bias", "true"}, KILN_ERR_UNSUPPORTED, "mlp_bias"},
    {"llama", {"attention_bias", "true"}, KILN_ERR_FORMAT, "q_proj.bias' is missing"},
    {"gemma3",
     {"use_bidirectional_attention", "true"},
     KILN_ERR_UNSUPPORTED,
     "use_bidirectional_attention"},
    {"gemma2",
     {"hidden_activation", "\"gelu_fast\""},
     KILN_ERR_UNSUPPORTED,
     "hidden_activation 'gelu_fast'"},
    {"qwen2",
     {"layer_types", "[\"full_attention\", \"chunked_attention\", \"full_attention\"]"},
     KILN_ERR_UNSUPPORTED,
     "layer_types[1] = 'chunked_attention'"},
    {"qwen2", {"layer_types", "[\"full_attention\"]"}, KILN_ERR_FORMAT, "layer_types"},
    {"qwen3",
     {"layer_types", "[\"linear_attention\", \"full_attention\", \"full_attention\"]"},
     KILN_ERR_UNSUPPORTED,
     "linear_attention"},
    {"qwen3_moe", {"use_sliding_window", "true"}, KILN_OK, NULL}, /* sliding_window null */
    {"qwen3_moe", {"sliding_window", "8"}, KILN_OK, NULL},        /* but not enabled */
    {"phi3",
     {"rope_parameters", "{\"rope_type\": \"longrope\", \"rope_theta\": 10000.0}"},
     KILN_ERR_UNSUPPORTED,
     "rope_type 'longrope'"},
    {"phi3", {"partial_rotary_factor", "0.5"}, KILN_ERR_UNSUPPORTED, "disagree"},
    {"gpt2", {"add_cross_attention", "true"}, KILN_ERR_UNSUPPORTED, "add_cross_attention"},
    {"gpt2",
     {"activation_function", "\"relu\""},
     KILN_ERR_UNSUPPORTED,
     "activation_function 'relu'"},
    {"qwen3_next", {"num_hidden_layers", "5"}, KILN_ERR_FORMAT, "layer_types"},
    {"mistral", {"num_hidden_layers", "100000"}, KILN_ERR_UNSUPPORTED, "num_hidden_layers"},
    {"mixtral", {"num_experts_per_tok", "5"}, KILN_ERR_FORMAT, "MoE sizes"},
    {"llama", {"vocab_size", "1024"}, KILN_ERR_FORMAT, "embed_tokens.weight' has shape"},
};

static void run_refusal(const refusal *r) {
    char dir[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", r->arch);
    const char *src = kiln_test_shared(dir);
    char *vdir = variant_dir(src, apply_edit, &r->e);
    kiln_model *m = NULL;
    kiln_error err = {0};
    kiln_model_load_params lp = {0};
    kiln_status st = kiln_model_open(vdir, &lp, &m, &err);
    CHECKF(st == r->want, "%s with %s = %s: status %d, want %d (%s)", r->arch, r->e.key, r->e.json,
           (int)st, (int)r->want, st ? err.message : "loaded");
    if (r->must_mention)
        CHECKF(st != KILN_OK && strstr(err.message, r->must_mention),
               "%s with %s = %s: message '%s' does not mention '%s'", r->arch, r->e.key, r->e.json,
               err.message, r->must_mention);
    printf("%-10s %-26s -> %s\n", r->arch, r->e.key, st ? err.message : "loads");
    kiln_model_close(m);
    variant_dir_remove(vdir);
}

/* The window matters: Mistral without its sliding window must not match the reference. */
static void check_window_matters(void) {
    const char *src = kiln_test_shared("reference/hf/mistral");
    const char *rpath = kiln_test_shared("reference/hf/mistral/reference.safetensors");
    edit e = {"sliding_window", "null"};
    char *vdir = variant_dir(src, apply_edit, &e);
    kiln_error err = {0};
    kiln_safetensors *ref = NULL;
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    REQUIRE(kiln_model_open(vdir, &lp, &m, &err) == KILN_OK);
    const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
    const kiln_st_tensor *want = ref_tensor(ref, "logits", KILN_DTYPE_F32);
    const int32_t T = (int32_t)ids->shape[0], V = m->cfg.n_vocab;
    float *got = forward_all(m, ids->data, T, KILN_DTYPE_F32);
    /* positions < 16 see the same keys either way; later ones must differ */
    float early = max_abs_diff(got, want->data, (size_t)16 * V);
    float all = max_abs_diff(got, want->data, (size_t)T * V);
    CHECKF(early <= 1e-4f, "mistral without window: positions < 16 differ by %g", early);
    CHECKF(all > 1e-3f, "mistral without window still matches (%g): the window is not exercised",
           all);
    printf("mistral without sliding_window: positions <16 diff %.3g, all positions %.3g\n", early,
           all);
    free(got);
    kiln_model_close(m);
    kiln_safetensors_close(ref);
    variant_dir_remove(vdir);
}

int main(void) {
    kiln_test_require_file(kiln_test_shared("reference/hf/mistral/reference.safetensors"));
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char p[256];
        snprintf(p, sizeof p, "reference/hf/%s/config.json", CASES[i].arch);
        if (access(kiln_test_shared(p), R_OK) != 0) {
            printf("%-10s skipped (no reference)\n", CASES[i].arch);
            continue;
        }
        run_refusal(&CASES[i]);
    }
    check_window_matters();
    return kiln_test_finish("test_hf_config_refusals");
}
