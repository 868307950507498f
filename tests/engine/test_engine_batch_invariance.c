/*
 * The defining test of the engine (issue 3, DESIGN.md principle 3): a request's logits at
 * every generated position, and its tokens, are bitwise identical when
 *   (a) it runs alone;
 *   (b) it runs among 15 other requests with different prompts and lengths that join and
 *       leave (finish or are cancelled) at different steps;
 *   (c) its prompt is prefilled in chunks of 1, 7, 64 or all at once;
 *   (d) the step budget is 16 or 512 tokens;
 * for greedy decoding and for seeded sampling at temperature 0.8, top-p 0.9, on stories260K
 * (f32) and llama2xs (f32 and Q8_0). The thread count (1 or 2) varies too, and one f16-KV
 * configuration is checked against its own alone run.
 *
 * Independent anchor: for the f32 models the greedy tokens of the alone run must equal
 * llama2.c run.c's (../shared/golden/llama2c-greedy.json); the second target's prompt is a
 * golden prompt plus the first 100 golden tokens, so its greedy continuation must be the
 * golden tokens that follow. Each KV page format (f16, bf16, q8_0, q4_0, TurboQuant turbo:k8v3,
 * turbo:k3v3 and turbo:k3qv4q, and K / V in different formats) is checked alone against the
 * crowd within its own configuration. For the Hugging Face reference checkpoints (other families:
 * sliding windows, MoE, recurrent gated-delta-net layers) the anchor is transformers'
 * greedy_ids in reference.safetensors (target 0: the 16 prompt ids, 24 tokens; target 1:
 * prompt + the first 12 greedy ids, the 12 that follow).
 *
 * usage: test_engine_batch_invariance MODEL_REL [GOLDEN_MODEL_NAME | hf | -]
 */
#include <jansson.h>

#include "engine_test_util.h"
#include "format/safetensors.h"

#define N_TARGETS 2
#define N_OTHERS  14
#define N_CTX     512

typedef struct target {
    int32_t prompt[256];
    int32_t n_prompt;
    int32_t max_tokens;
    int32_t golden[256]; /* expected greedy tokens (n_golden of them), from run.c */
    int32_t n_golden;
} target;

static int32_t g_n_vocab;

static void set_sampling(kiln_request *r, bool sampled, uint64_t seed) {
    if (sampled) {
        r->temperature = 0.8f;
        r->top_p = 0.9f;
        r->seed = seed;
    } else {
        r->temperature = 0.0f;
    }
}

static void make_target_job(et_job *j, const target *t, bool sampled, uint64_t seed,
                            et_result *res) {
    memset(j, 0, sizeof *j);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = t->prompt;
    j->req.n_prompt_ids = t->n_prompt;
    j->req.max_tokens = t->max_tokens;
    j->req.ignore_eos = true; /* the references were generated without an EOS stop */
    set_sampling(&j->req, sampled, seed);
    j->dbg.capture_logits = true;
    j->cancel_step = -1;
    j->res = res;
}

static int32_t g_other_prompts[N_OTHERS][96];

/* The crowd: prompts of 1..95 tokens, 1..60 generated tokens, greedy or sampled, joining at
 * steps 0..40; one is cancelled while running. */
static void make_other_job(et_job *j, int k, et_result *res) {
    memset(j, 0, sizeof *j);
    uint64_t h = (uint64_t)k * 2654435761u + 7;
    int32_t n_prompt = 1 + (int32_t)(h % 95);
    et_prompt(g_other_prompts[k], n_prompt, 1000 + (uint64_t)k, g_n_vocab);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = g_other_prompts[k];
    j->req.n_prompt_ids = n_prompt;
    j->req.max_tokens = 1 + (int32_t)((h / 97) % 60);
    j->req.ignore_eos = (k % 3) == 0;
    set_sampling(&j->req, k % 2 == 1, 77 + (uint64_t)k);
    static const int64_t joins[N_OTHERS] = {0, 0, 0, 1, 2, 3, 3, 5, 8, 9, 13, 17, 25, 40};
    j->join_step = joins[k];
    j->cancel_step = k == 6 ? 12 : -1;
    j->res = res;
}

typedef struct config {
    int32_t chunk, step_tokens, threads;
    bool crowd;
    kiln_kv_type kv;
    const char *kv_k, *kv_v; /* per-side format names (NULL: kv) */
} config;

static void run_config(const kiln_model *m, const config *c, const target *targets, bool sampled,
                       et_result *out /* [N_TARGETS] */) {
    kiln_engine_params p = kiln_engine_default_params();
    p.prefill_chunk = c->chunk;
    p.step_tokens = c->step_tokens;
    p.n_threads = c->threads;
    p.n_ctx = N_CTX;
    p.kv_type = c->kv;
    p.kv_type_k = c->kv_k;
    p.kv_type_v = c->kv_v;
    if (c->crowd) {
        et_job jobs[N_TARGETS + N_OTHERS];
        static et_result others[N_OTHERS];
        for (int k = 0; k < N_OTHERS; k++) make_other_job(&jobs[N_TARGETS + k], k, &others[k]);
        for (int t = 0; t < N_TARGETS; t++) {
            make_target_job(&jobs[t], &targets[t], sampled, 4242 + (uint64_t)t, &out[t]);
            jobs[t].join_step = t == 0 ? 2 : 4; /* mid-flight of the crowd */
        }
        kiln_engine_stats st = et_run_jobs(m, &p, jobs, N_TARGETS + N_OTHERS, NULL);
        CHECKF(st.kv_blocks_used == 0, "blocks still used after the crowd run: %d",
               st.kv_blocks_used);
        for (int k = 0; k < N_OTHERS; k++) {
            CHECKF(others[k].finish != KILN_FINISH_ERROR, "other %d failed: %s", k,
                   others[k].message);
            et_result_free(&others[k]);
        }
        CHECKF(others[6].finish == KILN_FINISH_CANCELLED, "other 6 was not cancelled (%s)",
               kiln_finish_reason_name(others[6].finish));
    } else {
        for (int t = 0; t < N_TARGETS; t++) {
            et_job j;
            make_target_job(&j, &targets[t], sampled, 4242 + (uint64_t)t, &out[t]);
            kiln_engine_stats st = et_run_jobs(m, &p, &j, 1, NULL);
            CHECKF(st.kv_blocks_used == 0, "blocks still used: %d", st.kv_blocks_used);
        }
    }
}

/* Bitwise comparison of a run against the reference. */
static void compare(const char *what, const et_result *ref, const et_result *got) {
    CHECKF(got->finish == ref->finish, "%s: finish %s, reference %s (%s)", what,
           kiln_finish_reason_name(got->finish), kiln_finish_reason_name(ref->finish),
           got->message);
    CHECKF(got->n_tokens == ref->n_tokens, "%s: %d tokens, reference %d", what, got->n_tokens,
           ref->n_tokens);
    int32_t n = got->n_tokens < ref->n_tokens ? got->n_tokens : ref->n_tokens;
    for (int32_t i = 0; i < n; i++)
        if (got->tokens[i] != ref->tokens[i]) {
            CHECKF(false, "%s: token %d is %d, reference %d", what, i, got->tokens[i],
                   ref->tokens[i]);
            break;
        }
    CHECKF(got->n_logit_rows == ref->n_logit_rows, "%s: %d logits rows, reference %d", what,
           got->n_logit_rows, ref->n_logit_rows);
    int32_t rows = got->n_logit_rows < ref->n_logit_rows ? got->n_logit_rows : ref->n_logit_rows;
    for (int32_t r = 0; r < rows; r++) {
        const float *a = got->logits + (size_t)r * g_n_vocab,
                    *b = ref->logits + (size_t)r * g_n_vocab;
        if (memcmp(a, b, (size_t)g_n_vocab * sizeof(float)) != 0) {
            int32_t v = 0;
            while (v < g_n_vocab && !memcmp(&a[v], &b[v], sizeof(float))) v++;
            CHECKF(false,
                   "%s: logits of generated position %d differ (first at id %d: %.9g vs %.9g)",
                   what, r, v, a[v], b[v]);
            break;
        }
    }
    CHECKF(got->usage.completion_tokens == ref->usage.completion_tokens &&
               got->usage.prompt_tokens == ref->usage.prompt_tokens,
           "%s: usage differs", what);
    CHECKF(got->order_ok, "%s: events out of order", what);
}

static void load_targets(const char *model_rel, const char *golden_model, target *t) {
    if (golden_model && !strcmp(golden_model, "hf")) {
        char rel[512];
        snprintf(rel, sizeof rel, "%s/reference.safetensors", model_rel);
        const char *path = kiln_test_shared(rel);
        kiln_test_require_file(path);
        kiln_safetensors *ref = NULL;
        kiln_error err = {0};
        REQUIRE(kiln_safetensors_open(path, &ref, &err) == KILN_OK);
        const kiln_st_tensor *pi = kiln_safetensors_find(ref, "prompt_ids");
        const kiln_st_tensor *gi = kiln_safetensors_find(ref, "greedy_ids");
        REQUIRE(pi && gi && pi->dtype == KILN_DTYPE_I32 && gi->dtype == KILN_DTYPE_I32);
        int32_t np = (int32_t)pi->shape[0], ng = (int32_t)gi->shape[0];
        REQUIRE(np > 0 && np < 64 && ng == 24);
        const int32_t *pv = pi->data, *gv = gi->data;
        t[0].n_prompt = np;
        memcpy(t[0].prompt, pv, (size_t)np * sizeof(int32_t));
        t[0].max_tokens = t[0].n_golden = 24;
        memcpy(t[0].golden, gv, 24 * sizeof(int32_t));
        t[1].n_prompt = np + 12;
        memcpy(t[1].prompt, pv, (size_t)np * sizeof(int32_t));
        memcpy(t[1].prompt + np, gv, 12 * sizeof(int32_t));
        t[1].max_tokens = t[1].n_golden = 12;
        memcpy(t[1].golden, gv + 12, 12 * sizeof(int32_t));
        kiln_safetensors_close(ref);
        return;
    }
    if (golden_model && strcmp(golden_model, "-") != 0) {
        const char *gpath = kiln_test_shared("golden/llama2c-greedy.json");
        kiln_test_require_file(gpath);
        json_error_t jerr;
        json_t *root = json_load_file(gpath, 0, &jerr);
        REQUIRE(root);
        json_t *cases = json_object_get(root, "cases"), *c = NULL;
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *ci = json_array_get(cases, i);
            if (!strcmp(json_string_value(json_object_get(ci, "model")), golden_model) &&
                !strcmp(json_string_value(json_object_get(ci, "prompt")), "One day, a big bear"))
                c = ci;
        }
        REQUIRE(c);
        json_t *pi = json_object_get(c, "prompt_ids"), *gi = json_object_get(c, "generated_ids");
        int32_t np = (int32_t)json_array_size(pi), ng = (int32_t)json_array_size(gi);
        REQUIRE(ng >= 160 && np < 64);
        int32_t all[512];
        for (int32_t i = 0; i < np; i++)
            all[i] = (int32_t)json_integer_value(json_array_get(pi, i));
        for (int32_t i = 0; i < ng; i++)
            all[np + i] = (int32_t)json_integer_value(json_array_get(gi, i));
        /* target 0: the golden prompt, 48 tokens */
        t[0].n_prompt = np;
        memcpy(t[0].prompt, all, (size_t)np * sizeof(int32_t));
        t[0].max_tokens = 48;
        t[0].n_golden = 48;
        memcpy(t[0].golden, all + np, 48 * sizeof(int32_t));
        /* target 1: prompt + 100 golden tokens as the prompt, 40 more */
        t[1].n_prompt = np + 100;
        memcpy(t[1].prompt, all, (size_t)t[1].n_prompt * sizeof(int32_t));
        t[1].max_tokens = 40;
        t[1].n_golden = 40;
        memcpy(t[1].golden, all + np + 100, 40 * sizeof(int32_t));
        json_decref(root);
    } else {
        t[0].n_prompt = 9;
        et_prompt(t[0].prompt, t[0].n_prompt, 1, g_n_vocab);
        t[0].max_tokens = 48;
        t[1].n_prompt = 113;
        et_prompt(t[1].prompt, t[1].n_prompt, 2, g_n_vocab);
        t[1].max_tokens = 40;
    }
    /* The goldens run until BOS or 256 positions; the targets must not hit either early. */
    for (int k = 0; k < N_TARGETS; k++)
        for (int32_t i = 0; i < t[k].n_golden; i++) REQUIRE(t[k].golden[i] != 1);
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    bool hf = argc >= 3 && !strcmp(argv[2], "hf");
    kiln_model *m = et_load_opt(argv[1], !hf);
    g_n_vocab = kiln_model_n_vocab(m);
    target targets[N_TARGETS];
    memset(targets, 0, sizeof targets);
    load_targets(argv[1], argc >= 3 ? argv[2] : NULL, targets);

    static const config configs[] = {
        {512, 512, 1, false, KILN_KV_F32, NULL, NULL}, /* the reference: alone, whole prompt, 1 thread */
        {1, 512, 2, false, KILN_KV_F32, NULL, NULL},   {7, 512, 2, false, KILN_KV_F32, NULL, NULL},
        {64, 512, 2, false, KILN_KV_F32, NULL, NULL},  {512, 16, 2, false, KILN_KV_F32, NULL, NULL},
        {7, 16, 2, false, KILN_KV_F32, NULL, NULL},    {512, 512, 2, true, KILN_KV_F32, NULL, NULL},
        {1, 512, 2, true, KILN_KV_F32, NULL, NULL},    {7, 512, 1, true, KILN_KV_F32, NULL, NULL},
        {64, 512, 2, true, KILN_KV_F32, NULL, NULL},   {1, 16, 2, true, KILN_KV_F32, NULL, NULL},
        {7, 16, 2, true, KILN_KV_F32, NULL, NULL},     {64, 16, 2, true, KILN_KV_F32, NULL, NULL},
        {512, 16, 2, true, KILN_KV_F32, NULL, NULL},
    };
    int n_configs = (int)(sizeof configs / sizeof configs[0]);
#if defined(__SANITIZE_ADDRESS__)
    /* Under the sanitizers (10x slower) a cross-section: every chunk size, both budgets, alone
     * and in the crowd; the normal build runs the whole matrix. */
    static const int subset[] = {0, 2, 4, 7, 9, 11, 13};
#else
    static const int subset[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
#endif
    int n_subset = (int)(sizeof subset / sizeof subset[0]);
    for (int i = 0; i < n_subset; i++) REQUIRE(subset[i] < n_configs);
    for (int sampled = 0; sampled <= 1; sampled++) {
        et_result ref[N_TARGETS];
        run_config(m, &configs[0], targets, sampled, ref);
        for (int t = 0; t < N_TARGETS; t++) {
            CHECKF(ref[t].finish == KILN_FINISH_LENGTH && ref[t].n_tokens == targets[t].max_tokens,
                   "%s target %d alone: finish %s after %d tokens (%s)", argv[1], t,
                   kiln_finish_reason_name(ref[t].finish), ref[t].n_tokens, ref[t].message);
            CHECKF(ref[t].n_logit_rows == ref[t].usage.completion_tokens,
                   "target %d: %d logits rows for %d generated tokens", t, ref[t].n_logit_rows,
                   ref[t].usage.completion_tokens);
            if (!sampled && targets[t].n_golden > 0) {
                bool same = ref[t].n_tokens >= targets[t].n_golden;
                for (int32_t i = 0; same && i < targets[t].n_golden; i++)
                    same = ref[t].tokens[i] == targets[t].golden[i];
                CHECKF(same, "%s target %d: greedy tokens differ from llama2.c run.c's", argv[1],
                       t);
            }
        }
        for (int ci = 1; ci < n_subset; ci++) {
            int c = subset[ci];
            et_result got[N_TARGETS];
            run_config(m, &configs[c], targets, sampled, got);
            for (int t = 0; t < N_TARGETS; t++) {
                char what[256];
                snprintf(what, sizeof what,
                         "%s %s target %d, %s, chunk %d, step budget %d, %d threads", argv[1],
                         sampled ? "sampled" : "greedy", t,
                         configs[c].crowd ? "among 15 others" : "alone", configs[c].chunk,
                         configs[c].step_tokens, configs[c].threads);
                compare(what, &ref[t], &got[t]);
                et_result_free(&got[t]);
            }
        }
        /* Every other KV page format (kv/kv_format.h), and K and V in different formats:
         * invariance holds within each format's configuration too. q8_0 / q4_0 need
         * kv_dim % 32 == 0 (skipped, and said, otherwise). */
        static const struct {
            kiln_kv_type kv;
            const char *k, *v, *name;
        } fmts[] = {
            {KILN_KV_F16, NULL, NULL, "f16"},
            {KILN_KV_BF16, NULL, NULL, "bf16"},
            {KILN_KV_Q8_0, NULL, NULL, "q8_0"},
            {KILN_KV_TURBO, NULL, NULL, "turbo:k8v3"},
            {KILN_KV_Q4_0, NULL, NULL, "q4_0"},
            {KILN_KV_F16, "q8_0", NULL, "q8_0 K, f16 V"},
            {KILN_KV_Q8_0, NULL, "q4_0", "q8_0 K, q4_0 V"},
            /* TurboQuant: 3.5 bits per channel, the QJL residual on both sides (kv_type_k /
             * kv_type_v each keep their side of a config), and a turbo K beside f16 V rows
             * (the f16 rows enter the rotated kernel through their traits) */
            {KILN_KV_F32, "turbo:k3v3", "turbo:k3v3", "turbo:k3v3"},
            {KILN_KV_F32, "turbo3q", "turbo:k8v4q", "turbo:k3qv4q"},
            {KILN_KV_F16, "turbo4", NULL, "turbo4 K, f16 V"},
        };
        /* whether the model's KV rows can be q8_0 (kv_dim % 32 == 0): ask the engine */
        bool quant_ok;
        {
            kiln_engine_params qp = kiln_engine_default_params();
            qp.kv_type = KILN_KV_Q8_0;
            qp.n_ctx = 64;
            qp.kv_tokens = 64;
            kiln_engine *qe = NULL;
            kiln_error qerr = {0};
            quant_ok = kiln_engine_create(m, &qp, &qe, &qerr) == KILN_OK;
            if (!quant_ok) printf("%s: no quantized KV: %s\n", argv[1], qerr.message);
            kiln_engine_destroy(qe);
        }
        /* whether TurboQuant can hold its heads (a head size that is a power of two) */
        bool turbo_ok;
        {
            kiln_engine_params qp = kiln_engine_default_params();
            qp.kv_type = KILN_KV_TURBO;
            qp.n_ctx = 64;
            qp.kv_tokens = 64;
            kiln_engine *qe = NULL;
            kiln_error qerr = {0};
            turbo_ok = kiln_engine_create(m, &qp, &qe, &qerr) == KILN_OK;
            if (!turbo_ok) printf("%s: no TurboQuant KV: %s\n", argv[1], qerr.message);
            kiln_engine_destroy(qe);
        }
#if defined(__SANITIZE_ADDRESS__)
        const int n_fmts = 4; /* f16, bf16, q8_0, turbo:k8v3 */
#else
        const int n_fmts = (int)(sizeof fmts / sizeof fmts[0]);
#endif
        for (int fi = 0; fi < n_fmts; fi++) {
            const bool turbo = fmts[fi].kv == KILN_KV_TURBO ||
                               (fmts[fi].k && !strncmp(fmts[fi].k, "turbo", 5)) ||
                               (fmts[fi].v && !strncmp(fmts[fi].v, "turbo", 5));
            const bool quant = !turbo && (fmts[fi].kv >= KILN_KV_Q8_0 || fmts[fi].k || fmts[fi].v);
            if ((quant && !quant_ok) || (turbo && !turbo_ok)) {
                printf("%s: %s KV skipped\n", argv[1], fmts[fi].name);
                continue;
            }
            config f_alone = {512, 512, 1, false, fmts[fi].kv, fmts[fi].k, fmts[fi].v},
                   f_crowd = {7, 16, 2, true, fmts[fi].kv, fmts[fi].k, fmts[fi].v};
            et_result a[N_TARGETS], b[N_TARGETS];
            run_config(m, &f_alone, targets, sampled, a);
            run_config(m, &f_crowd, targets, sampled, b);
            for (int t = 0; t < N_TARGETS; t++) {
                char what[256];
                snprintf(what, sizeof what, "%s %s target %d, %s KV, crowd chunk 7 budget 16",
                         argv[1], sampled ? "sampled" : "greedy", t, fmts[fi].name);
                CHECKF(a[t].finish == KILN_FINISH_LENGTH, "%s alone: %s (%s)", what,
                       kiln_finish_reason_name(a[t].finish), a[t].message);
                compare(what, &a[t], &b[t]);
                et_result_free(&a[t]);
                et_result_free(&b[t]);
            }
        }
        for (int t = 0; t < N_TARGETS; t++) et_result_free(&ref[t]);
    }
    kiln_model_free(m);
    return kiln_test_finish("test_engine_batch_invariance");
}
