/*
 * test_kiln_fit - `kiln fit --json` and the engine's memory_budget against KV arithmetic done
 * here, independently of src/kv/kv_fit.c (issue 14 item 6 and its Memory acceptance).
 *
 * For stories260K (GGUF), pycode10M (HF directory, bf16) and the gemma3 HF reference (5
 * sliding layers of window 16 + 1 full, 4 KV heads of 16) at N = 8192, f32 and f16 pages,
 * --memory 1G, --bandwidth 10:
 *   - the model's geometry is read here from the file (GGUF keys / config.json);
 *   - bytes per token = layers * 2 * kv_dim * element bytes; one sequence holds, per full
 *     layer, ceil(N/16)*16 tokens, per sliding layer min(ceil(N/16), ceil(W/16) + 1)*16;
 *     kv_bytes, kv_bytes_all_full, the ratio (gemma3: < 0.3, issue 14), max_seqs =
 *     floor((memory - weights - scratch) / kv_bytes), max_ctx the largest n whose bytes fit,
 *     decode_tok_s = bandwidth / (weights + kv_bytes), pool_now's block bytes;
 *   - weights_bytes = the safetensors shards' data bytes (file size - 8 - header) or the
 *     GGUF data section (file size - data offset, within alignment padding per tensor);
 *   - f16's kv_bytes is half of f32's;
 *   - an engine created with memory_budget = weights + scratch + 10 blocks + a little holds
 *     exactly 10 blocks (kiln_engine_get_params), the arithmetic fit's pool_now uses; a
 *     budget below that is refused naming memory_budget, and with kv_memory too;
 *   - gpu_memory out of range, or for a model on the CPU, is refused naming it;
 *   - bad --memory / --ctx / --kv-type, serve --memory-budget and run --gpu-memory are usage
 *     errors that name the option.
 */
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>

#include "cli/cli_test_util.h"
#include "format/fmt_util.h"
#include "format/gguf.h"
#include "kiln.h"
#include "test.h"

typedef struct geom {
    int n_layer, kv_dim, window;
    bool sliding[64];
} geom;

static int64_t file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

/* data bytes of a safetensors file: size - 8 - header length */
static int64_t st_data(const char *p) {
    FILE *f = fopen(p, "rb");
    REQUIRE(f);
    uint64_t h = 0;
    REQUIRE(fread(&h, 8, 1, f) == 1);
    fclose(f);
    return file_size(p) - 8 - (int64_t)h;
}

static json_t *run_fit_json(const char *model, const char *kv, int64_t n) {
    char out[512], errbuf[4096], ctx[32];
    snprintf(out, sizeof out, "%s/fit.json", g_tmpdir);
    snprintf(ctx, sizeof ctx, "%lld", (long long)n);
    const char *args[] = {"fit", "-m", model, "--ctx", ctx, "--kv-type", kv, "--memory", "1G",
                          "--bandwidth", "10", "--json", NULL};
    int rc = run_kiln_to(args, out, errbuf, sizeof errbuf);
    CHECKF(rc == 0, "kiln fit %s: exit %d: %s", model, rc, errbuf);
    json_t *j = json_load_file(out, 0, NULL);
    REQUIRE(j);
    return j;
}

static int64_t jint(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    CHECKF(json_is_integer(v), "field %s missing", k);
    return (int64_t)json_integer_value(v);
}

static int64_t seq_bytes(const geom *g, int64_t n, int eb, bool all_full) {
    int64_t blocks = (n + 15) / 16, s = 0;
    for (int l = 0; l < g->n_layer; l++) {
        int64_t b = blocks;
        if (g->sliding[l] && !all_full) {
            int64_t cap = (g->window + 15) / 16 + 1;
            if (b > cap) b = cap;
        }
        s += b * 16 * 2 * (int64_t)g->kv_dim * eb;
    }
    return s;
}

static void check_model(const char *name, const char *model, const geom *g, int64_t weights,
                        int64_t weights_slack) {
    const int64_t N = 8192, memory = (int64_t)1 << 30;
    int64_t kv32 = 0;
    for (int pass = 0; pass < 2; pass++) {
        const char *kv = pass ? "f16" : "f32";
        const int eb = pass ? 2 : 4;
        json_t *j = run_fit_json(model, kv, N);
        int64_t w = jint(j, "weights_bytes");
        CHECKF(w >= weights - weights_slack && w <= weights, "%s weights %lld, want %lld (-%lld)",
               name, (long long)w, (long long)weights, (long long)weights_slack);
        int64_t per_tok = 0;
        for (int l = 0; l < g->n_layer; l++) per_tok += 2 * (int64_t)g->kv_dim * eb;
        CHECKF(jint(j, "kv_bytes_per_token") == per_tok, "%s %s per token %lld want %lld", name,
               kv, (long long)jint(j, "kv_bytes_per_token"), (long long)per_tok);
        int64_t want = seq_bytes(g, N, eb, false), full = seq_bytes(g, N, eb, true);
        int64_t got = jint(j, "kv_bytes");
        CHECKF(got == want, "%s %s kv_bytes %lld want %lld", name, kv, (long long)got,
               (long long)want);
        CHECK(jint(j, "kv_bytes_all_full") == full);
        double ratio = json_real_value(json_object_get(j, "kv_ratio_vs_all_full"));
        CHECK(fabs(ratio - (double)want / (double)full) < 1e-12);
        if (pass == 0) kv32 = got;
        if (pass == 1) CHECKF(got * 2 == kv32, "%s f16 kv_bytes %lld is not half of %lld", name,
                              (long long)got, (long long)kv32);
        int64_t scratch = jint(j, "scratch_bytes");
        CHECK(scratch > 0 && jint(j, "memory_bytes") == memory);
        int64_t budget = memory - w - scratch;
        CHECK(jint(j, "kv_budget_bytes") == budget);
        CHECKF(jint(j, "max_seqs") == budget / want, "%s max_seqs %lld want %lld", name,
               (long long)jint(j, "max_seqs"), (long long)(budget / want));
        int64_t mc = jint(j, "max_ctx");
        CHECKF(seq_bytes(g, mc, eb, false) <= budget &&
                   (mc == (1 << 24) || seq_bytes(g, mc + 1, eb, false) > budget),
               "%s max_ctx %lld", name, (long long)mc);
        double tps = json_real_value(json_object_get(j, "decode_tok_s"));
        CHECKF(fabs(tps - 10e9 / (double)(w + want)) < 1e-6 * tps, "%s decode_tok_s %g", name,
               tps);
        json_t *pool = json_object_get(j, "pool_now");
        CHECK(jint(pool, "block_bytes") == (int64_t)g->n_layer * 2 * 16 * g->kv_dim * eb);
        CHECK(jint(pool, "kv_bytes") == full);
        printf("%-10s %s: kv_bytes(8192) %lld, all-full %lld, ratio %.3f, max_seqs %lld, "
               "max_ctx %lld\n",
               name, kv, (long long)got, (long long)full, ratio, (long long)jint(j, "max_seqs"),
               (long long)mc);
        if (!strcmp(name, "gemma3"))
            CHECKF(ratio < 0.3, "gemma3 at 8192: %.3f of all-full-attention KV, want < 0.3",
                   ratio);
        json_decref(j);
    }
}

static void test_models(void) {
    /* stories260K: GGUF, 5 layers, 4 KV heads of 8 (dim 64 / 8 heads) */
    const char *s260 = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    if (access(s260, R_OK) == 0) {
        kiln_error e = {0};
        kiln_gguf *gg = NULL;
        REQUIRE(kiln_gguf_open(s260, &gg, &e) == KILN_OK);
        uint32_t nl = 0, nkv = 0, nh = 0, d = 0;
        REQUIRE(kiln_gguf_get_u32(gg, "llama.block_count", &nl) &&
                kiln_gguf_get_u32(gg, "llama.attention.head_count_kv", &nkv) &&
                kiln_gguf_get_u32(gg, "llama.attention.head_count", &nh) &&
                kiln_gguf_get_u32(gg, "llama.embedding_length", &d));
        geom g = {.n_layer = (int)nl, .kv_dim = (int)(nkv * (d / nh))};
        int64_t data = (int64_t)gg->size - (int64_t)gg->data_offset;
        int64_t slack = (int64_t)gg->n_tensors * (int64_t)gg->alignment;
        kiln_gguf_close(gg);
        check_model("stories260K", s260, &g, data, slack);
    } else {
        printf("SKIP stories260K: %s missing\n", s260);
    }
    /* pycode10M and gemma3: config.json */
    const char *dirs[2] = {"models/pycode10M", "reference/hf/gemma3"};
    const char *names[2] = {"pycode10M", "gemma3"};
    for (int k = 0; k < 2; k++) {
        const char *dir = kiln_test_shared(dirs[k]);
        char p[1024];
        snprintf(p, sizeof p, "%s/config.json", dir);
        json_t *c = json_load_file(p, 0, NULL);
        if (!c) {
            printf("SKIP %s: %s missing\n", names[k], p);
            continue;
        }
        geom g = {.n_layer = (int)json_integer_value(json_object_get(c, "num_hidden_layers"))};
        g.kv_dim = (int)(json_integer_value(json_object_get(c, "num_key_value_heads")) *
                         json_integer_value(json_object_get(c, "head_dim")));
        json_t *lt = json_object_get(c, "layer_types");
        for (int l = 0; l < g.n_layer && json_is_array(lt); l++)
            g.sliding[l] = !strcmp(json_string_value(json_array_get(lt, (size_t)l)),
                                   "sliding_attention");
        json_t *sw = json_object_get(c, "sliding_window");
        g.window = json_is_integer(sw) ? (int)json_integer_value(sw) : 0;
        int64_t w = 0;
        const char *shards[2][2] = {{"model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"},
                                    {"model.safetensors", NULL}};
        for (int s = 0; s < 2 && shards[k][s]; s++) {
            snprintf(p, sizeof p, "%s/%s", dir, shards[k][s]);
            w += st_data(p);
        }
        json_decref(c);
        check_model(names[k], dir, &g, w, 0);
    }
}

static void test_engine_budget(void) {
    const char *path = kiln_test_shared("models/pycode10M");
    if (access(path, R_OK) != 0) {
        printf("SKIP engine budget: %s missing\n", path);
        return;
    }
    /* the scratch and weights fit reports, for the engine's defaults (step 512, n_ctx 1024) */
    json_t *j = run_fit_json(path, "f32", 1024);
    int64_t w = jint(j, "weights_bytes");
    int64_t scratch = jint(j, "scratch_bytes");
    int64_t block = jint(json_object_get(j, "pool_now"), "block_bytes");
    json_decref(j);
    kiln_error e = {0};
    kiln_model *m = NULL;
    REQUIRE(kiln_model_load(path, NULL, &m, &e) == KILN_OK);
    kiln_engine_params p = kiln_engine_default_params();
    p.memory_budget = w + scratch + 10 * block + block / 2;
    p.n_threads = 1;
    kiln_engine *eng = NULL;
    CHECKF(kiln_engine_create(m, &p, &eng, &e) == KILN_OK, "engine: %s", e.message);
    if (eng) {
        kiln_engine_params got;
        kiln_engine_get_params(eng, &got);
        CHECKF(got.kv_tokens == 10 * 16 && got.kv_memory == 10 * block,
               "memory_budget pool: %d tokens, %lld bytes; want 160, %lld", got.kv_tokens,
               (long long)got.kv_memory, (long long)(10 * block));
        kiln_engine_destroy(eng);
        eng = NULL;
    }
    p.memory_budget = w + scratch + block / 2;
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(e.message, "memory_budget"));
    p.memory_budget = (int64_t)1 << 30;
    p.kv_memory = (int64_t)1 << 20;
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(e.message, "memory_budget"));
    /* gpu_memory (--gpu-memory, issue 16): out of range, or for a model on the CPU, refused
     * naming it (tests/cuda/test_cuda_gpu_memory sizes a pool with it on a GPU) */
    p.memory_budget = 0;
    p.kv_memory = 0;
    p.gpu_memory = -0.5;
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(e.message, "gpu_memory"));
    if (kiln_model_device(m, NULL) == KILN_DEVICE_CPU) {
        p.gpu_memory = 0.5;
        CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
              strstr(e.message, "gpu_memory") && strstr(e.message, "CPU"));
    }
    kiln_model_free(m);
}

/* TurboQuant on pycode10M (8 layers, 2 KV heads of 64): bytes per token and per pool block
 * from the row layout of kv/turboquant.h, computed here: a head row of B bits is an f32 norm
 * and B x 64 / 8 bytes of codes; with QJL, an f32 gamma, (B - 1) x 64 / 8 bytes of codes and
 * 64 / 8 bytes of signs. */
static int64_t turbo_head_bytes(int bits, bool qjl, int d) {
    return qjl ? 8 + (int64_t)(bits - 1) * d / 8 + d / 8 : 4 + (int64_t)bits * d / 8;
}

static void test_turbo(void) {
    const char *dir = kiln_test_shared("models/pycode10M");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *c = json_load_file(p, 0, NULL);
    if (!c) {
        printf("SKIP turbo: %s missing\n", p);
        return;
    }
    const int L = (int)json_integer_value(json_object_get(c, "num_hidden_layers"));
    const int nkv = (int)json_integer_value(json_object_get(c, "num_key_value_heads"));
    const int d = (int)json_integer_value(json_object_get(c, "head_dim"));
    json_decref(c);
    const struct {
        const char *kv;
        int kb, vb;
        bool kq, vq;
    } cases[] = {{"turbo", 8, 3, false, false},
                 {"turbo:k4v4", 4, 4, false, false},
                 {"turbo:k3v3", 3, 3, false, false},
                 {"turbo:k4qv3q", 4, 3, true, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = run_fit_json(dir, cases[i].kv, 512);
        const int64_t hk = turbo_head_bytes(cases[i].kb, cases[i].kq, d);
        const int64_t hv = turbo_head_bytes(cases[i].vb, cases[i].vq, d);
        const int64_t per_tok = (int64_t)L * nkv * (hk + hv);
        CHECKF(jint(j, "kv_bytes_per_token") == per_tok, "%s per token %lld want %lld",
               cases[i].kv, (long long)jint(j, "kv_bytes_per_token"), (long long)per_tok);
        CHECKF(jint(j, "kv_bytes") == per_tok * 512, "%s kv_bytes %lld", cases[i].kv,
               (long long)jint(j, "kv_bytes"));
        const int64_t rk = (16 * nkv * hk + 63) / 64 * 64, rv = (16 * nkv * hv + 63) / 64 * 64;
        json_t *pool = json_object_get(j, "pool_now");
        CHECKF(jint(pool, "block_bytes") == (int64_t)L * (rk + rv), "%s pool block %lld want %lld",
               cases[i].kv, (long long)jint(pool, "block_bytes"), (long long)(L * (rk + rv)));
        printf("pycode10M %s: %lld KV bytes per token (%.3f bits per element)\n", cases[i].kv,
               (long long)per_tok, 8.0 * (double)per_tok / (2.0 * L * nkv * d));
        json_decref(j);
    }
}

static void test_bad_options(void) {
    const char *model = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    char errbuf[4096];
    struct {
        const char *opt, *val, *needle;
    } cases[] = {
        {"--memory", "0", "--memory"},     {"--memory", "lots", "--memory"},
        {"--ctx", "0", "--ctx"},           {"--ctx", "x", "--ctx"},
        {"--kv-type", "q9", "--kv-type"},  {"--kv-type-v", "f8", "--kv-type-v"},
        {"--bandwidth", "-1", "--bandwidth"},
        {"--kv-type", "turbo:k9v3", "--kv-type"}, {"--kv-type", "turbo:x", "--kv-type"},
        {"--kv-type", "turbo:k8", "--kv-type"},   {"--kv-type-k", "turbo:k0v3", "--kv-type-k"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {"fit", "-m", model, cases[i].opt, cases[i].val, NULL};
        int rc = run_kiln(args, errbuf, sizeof errbuf);
        CHECKF(rc == 2 && strstr(errbuf, cases[i].needle), "fit %s %s: exit %d: %s",
               cases[i].opt, cases[i].val, rc, errbuf);
    }
    const char *sv[] = {"serve", "-m", model, "--memory-budget", "12Q", NULL};
    int rc = run_kiln(sv, errbuf, sizeof errbuf);
    CHECKF(rc == 2 && strstr(errbuf, "--memory-budget"), "serve --memory-budget 12Q: %d %s", rc,
           errbuf);
    /* --gpu-memory: a fraction in (0, 1] with a decimal point, or a size of at least 2 bytes */
    static const char *bad_gpu[] = {"1.5", "0.0", "-0.1", "1", "lots"};
    for (size_t i = 0; i < sizeof bad_gpu / sizeof bad_gpu[0]; i++) {
        const char *rv[] = {"run", "-m", model, "--gpu-memory", bad_gpu[i], "-p", "x", NULL};
        rc = run_kiln(rv, errbuf, sizeof errbuf);
        CHECKF(rc == 2 && strstr(errbuf, "--gpu-memory"), "run --gpu-memory %s: %d %s",
               bad_gpu[i], rc, errbuf);
    }
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    if (access(g_kiln, X_OK) != 0) {
        printf("SKIP: %s not built\n", g_kiln);
        return 77;
    }
    snprintf(g_tmpdir, sizeof g_tmpdir, "%.200s", make_tmpdir("kiln-fit"));
    test_models();
    test_engine_budget();
    test_turbo();
    test_bad_options();
    rm_rf(g_tmpdir);
    return kiln_test_finish("test_kiln_fit");
}
