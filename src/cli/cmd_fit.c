/*
 * cmd_fit.c - `kiln fit -m MODEL [--ctx N] [--kv-type T] [--memory BYTES] [--json]`: what a
 * model needs in memory and what a budget holds (kv/kv_fit.h, model/model_fit.h), like the
 * `fit` of the system kiln grew from (issue 14 item 6):
 *   - weights bytes (as stored in the file);
 *   - KV bytes per token per layer kind (full attention, sliding window W, recurrent state)
 *     and page format;
 *   - kv_bytes: one sequence of N = --ctx tokens, with sliding-window layers holding at most
 *     W + one block of tokens, rounded to blocks: what the engine's sliding group holds
 *     once it frees blocks outside the window (src/engine/kv_window.c). The pool that keeps
 *     every block (kv_keep_window, CUDA, kv_quant_start; and how --memory-budget counts
 *     blocks) is printed beside, as pool_now;
 *   - the longest context and the most concurrent N-token sequences that fit in the memory
 *     left after weights and step scratch (--memory, default MemAvailable of /proc/meminfo);
 *   - predicted decode tok/s = bandwidth / (weights + kv_bytes(N)) bytes read per token, the
 *     bandwidth measured here (a parallel read of a 256 MiB buffer, best of 5) or --bandwidth.
 * `kiln serve --memory-budget` sizes its pool with the same arithmetic (pool_now figures).
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kv/kv_format.h"
#include "kv/kv_pool.h"
#include "model/model_fit.h"
#include "util/error.h"

static void fit_usage(FILE *f) {
    fprintf(f,
            "usage: kiln fit -m MODEL [--ctx N] [--kv-type T] [--kv-type-k T] [--kv-type-v T]\n"
            "                [--memory SIZE] [--bandwidth GB/s] [--block-size N]\n"
            "                [--step-tokens N] [--json]\n"
            "\n"
            "Memory a model needs: weights, KV bytes per token per layer kind (full attention,\n"
            "sliding window, recurrent state) and format, kv_bytes for one sequence of --ctx\n"
            "tokens (sliding-window layers at most window + one block, rounded to blocks, as\n"
            "the engine frees blocks outside the window; the pool that keeps every block,\n"
            "--kv-keep-window, is shown as pool_now), the longest context and the most concurrent --ctx\n"
            "sequences that fit in --memory after weights and step scratch, and a decode speed\n"
            "bound: bandwidth / (weights + kv_bytes) bytes read per token.\n"
            "\n"
            "options:\n"
            "  --ctx N          sequence length N (default: the model's training context)\n"
            "  --kv-type T      KV page format of K and V: %s (default f32)\n"
            "  --kv-type-k T, --kv-type-v T   the format of K / V rows alone\n"
            "  --memory SIZE    budget (default: MemAvailable from /proc/meminfo)\n"
            "  --bandwidth GBS  memory read bandwidth in GB/s (default: measured, ~1 s)\n"
            "  --block-size N   tokens per KV block (default 16)\n"
            "  --step-tokens N  tokens per engine step, for the scratch (default 512)\n"
            "  --json           one JSON object\n",
            cli_kv_format_names());
}

enum { OPT_CTX = 0x200, OPT_KV, OPT_KVK, OPT_KVV, OPT_MEM, OPT_BW, OPT_BS, OPT_STEP, OPT_JSON };

/* ---- bandwidth ------------------------------------------------------------------------- */

typedef struct bw_ctx {
    const uint64_t *buf;
    size_t n;
    uint64_t sums[512];
} bw_ctx;

static void bw_read(void *ctx, int ith, int nth) {
    bw_ctx *c = ctx;
    size_t lo = c->n * (size_t)ith / (size_t)nth, hi = c->n * (size_t)(ith + 1) / (size_t)nth;
    uint64_t a = 0, b = 0, d = 0, e = 0;
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        a += c->buf[i];
        b ^= c->buf[i + 1];
        d += c->buf[i + 2];
        e ^= c->buf[i + 3];
    }
    for (; i < hi; i++) a += c->buf[i];
    c->sums[ith & 511] = a + b + d + e;
}

/* Bytes per second of a parallel read over 256 MiB (best of 5 passes); 0 on failure. */
static double measure_bandwidth(void) {
    const size_t bytes = (size_t)256 << 20;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0.0;
    kiln_threadpool *tp = NULL;
    kiln_error err = {0};
    if (kiln_threadpool_create(kiln_physical_cores(), &tp, &err) != KILN_OK) {
        free(buf);
        return 0.0;
    }
    bw_ctx c = {.buf = buf, .n = bytes / 8};
    for (size_t i = 0; i < c.n; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = cli_now_ms();
        kiln_threadpool_run(tp, bw_read, &c);
        double ms = cli_now_ms() - t0;
        if (ms > 0 && (double)bytes / (ms * 1e-3) > best) best = (double)bytes / (ms * 1e-3);
    }
    kiln_threadpool_destroy(tp);
    free(buf);
    return best;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when unreadable. */
static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? (int64_t)kb * 1024 : 0;
}

static double gib(int64_t b) {
    return (double)b / (double)(1 << 30);
}

int kiln_cmd_fit(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"ctx", required_argument, 0, OPT_CTX},
        {"kv-type", required_argument, 0, OPT_KV}, {"kv-type-k", required_argument, 0, OPT_KVK},
        {"kv-type-v", required_argument, 0, OPT_KVV}, {"memory", required_argument, 0, OPT_MEM},
        {"bandwidth", required_argument, 0, OPT_BW}, {"block-size", required_argument, 0, OPT_BS},
        {"step-tokens", required_argument, 0, OPT_STEP}, {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
    };
    const char *model_path = NULL;
    int64_t n_ctx = 0, memory = 0, block_size = KILN_KV_DEFAULT_BLOCK_SIZE, step_tokens = 512;
    float bandwidth_gbs = 0.0f;
    kiln_dtype kv_k = KILN_DTYPE_F32, kv_v = KILN_DTYPE_F32;
    bool json = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case OPT_CTX:
            if (!cli_parse_i64(optarg, 1, 1 << 24, &n_ctx))
                return cli_usage_error("fit", "--ctx must be an integer in [1, 16777216] (got "
                                              "'%s')",
                                       optarg);
            break;
        case OPT_KV:
        case OPT_KVK:
        case OPT_KVV: {
            const char *name = c == OPT_KV ? "--kv-type" : c == OPT_KVK ? "--kv-type-k"
                                                                         : "--kv-type-v";
            const int rc = cli_kv_side_option("fit", name, optarg, &kv_k, &kv_v);
            if (rc) return rc;
            break;
        }
        case OPT_MEM:
            if (!cli_parse_size(optarg, 1, INT64_MAX, &memory))
                return cli_usage_error("fit",
                                       "--memory must be a size of at least 1 byte: bytes, or a "
                                       "number with K, M, G, T (powers of 1024; also KiB ... "
                                       "TiB) or KB, MB, GB, TB (powers of 1000) (got '%s')",
                                       optarg);
            break;
        case OPT_BW:
            if (!cli_parse_f32(optarg, 1e-3f, 1e6f, &bandwidth_gbs))
                return cli_usage_error("fit", "--bandwidth must be GB/s in [0.001, 1e6] (got "
                                              "'%s')",
                                       optarg);
            break;
        case OPT_BS:
            if (!cli_parse_i64(optarg, 1, 4096, &block_size))
                return cli_usage_error("fit", "--block-size must be an integer in [1, 4096] (got "
                                              "'%s')",
                                       optarg);
            break;
        case OPT_STEP:
            if (!cli_parse_i64(optarg, 1, 1 << 20, &step_tokens))
                return cli_usage_error("fit", "--step-tokens must be an integer in [1, 1048576] "
                                              "(got '%s')",
                                       optarg);
            break;
        case OPT_JSON:
            json = true;
            break;
        case 'h':
            fit_usage(stdout);
            return 0;
        default:
            return cli_bad_option("fit", c, argv);
        }
    }
    if (optind < argc) return cli_usage_error("fit", "unexpected argument '%s'", argv[optind]);
    if (!model_path) return cli_usage_error("fit", "-m MODEL is required");

    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    lp.keep_file_layout = true;
    if (kiln_model_open(model_path, &lp, &m, &err) != KILN_OK) return cli_fail(&err);
    int rc = 0;
    const kiln_model_config *cfg = &m->cfg;
    if (!n_ctx) n_ctx = cfg->n_ctx_train > 0 ? cfg->n_ctx_train : 4096;
    kiln_kv_fit_layout L;
    if (!kiln_model_kv_layout(m, (int32_t)block_size, kv_k, kv_v, &L)) {
        kiln_error_set(&err, KILN_ERR_UNSUPPORTED, "%s: cannot describe the model's layers",
                       model_path);
        rc = cli_fail(&err);
        goto done;
    }
    {   /* the formats must hold this model's rows, as the engine checks (engine.c) */
        const kiln_kv_geom g = {(int64_t)cfg->n_head_kv * cfg->head_dim, cfg->n_head_kv,
                                cfg->head_dim};
        if (kiln_kv_format_check(kv_k, &g, "--kv-type-k", &err) ||
            kiln_kv_format_check(kv_v, &g, "--kv-type-v", &err)) {
            rc = cli_fail(&err);
            goto done;
        }
    }
    const char *mem_src = "--memory";
    if (!memory) {
        memory = mem_available();
        mem_src = "MemAvailable (/proc/meminfo)";
    }
    const char *bw_src = "--bandwidth";
    double bw = (double)bandwidth_gbs * 1e9;
    if (!(bw > 0)) {
        bw = measure_bandwidth();
        bw_src = "measured (parallel read of 256 MiB, best of 5)";
    }
    const int64_t weights = kiln_model_weights_bytes(m);
    const int64_t scratch = kiln_model_scratch_bytes(m, (int32_t)step_tokens, (int32_t)n_ctx);
    const int64_t budget = memory - weights - scratch;
    const int64_t kv_bytes = kiln_kv_fit_seq_bytes(&L, n_ctx, false);
    const int64_t kv_full = kiln_kv_fit_seq_bytes(&L, n_ctx, true);
    int64_t per_token = 0;
    for (int32_t g = 0; g < L.n_groups; g++) per_token += kiln_kv_fit_group_bytes_per_token(&L, g);
    const int64_t n_max = 1 << 24;
    const int64_t max_ctx = kiln_kv_fit_max_ctx(&L, budget, n_max);
    const int64_t max_seqs = kiln_kv_fit_max_seqs(&L, budget, n_ctx);
    /* today's pool: every layer, every block */
    const int64_t kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    const int64_t pool_block =
        kiln_kv_fit_pool_block_bytes(cfg->n_layer, kv_dim, cfg->head_dim, (int32_t)block_size,
                                     kv_k, kv_v);
    const int64_t pool_blocks_seq = (n_ctx + block_size - 1) / block_size;
    const int64_t pool_kv = pool_block * pool_blocks_seq;
    const int64_t pool_blocks = pool_block > 0 && budget > 0 ? budget / pool_block : 0;
    const int64_t pool_max_ctx = pool_blocks * block_size > n_max ? n_max : pool_blocks * block_size;
    const int64_t pool_max_seqs = pool_blocks_seq > 0 ? pool_blocks / pool_blocks_seq : 0;
    const double read_per_tok = (double)weights + (double)kv_bytes;
    const double tok_s = kiln_kv_fit_decode_tok_s(bw, read_per_tok);
    const double ratio = kv_full > 0 ? (double)kv_bytes / (double)kv_full : 0.0;

    if (json) {
        json_t *layers = json_array();
        for (int32_t g = 0; g < L.n_groups && layers; g++) {
            const kiln_kv_fit_group *G = &L.g[g];
            json_t *o = json_pack(
                "{s:s, s:i, s:I, s:i, s:I, s:I, s:I, s:I}", "kind",
                kiln_kv_layer_kind_name(G->kind), "n_layers", G->n_layers, "kv_dim",
                (json_int_t)G->kv_dim, "window", G->window, "bytes_per_token",
                (json_int_t)kiln_kv_fit_group_bytes_per_token(&L, g), "tokens_held",
                (json_int_t)kiln_kv_fit_group_tokens(&L, g, n_ctx), "kv_bytes",
                (json_int_t)kiln_kv_fit_group_bytes(&L, g, n_ctx), "state_bytes",
                (json_int_t)G->state_bytes);
            json_array_append_new(layers, o);
        }
        json_t *pool = json_pack("{s:I, s:I, s:I, s:I, s:I}", "block_bytes", (json_int_t)pool_block,
                                 "kv_bytes", (json_int_t)pool_kv, "blocks",
                                 (json_int_t)pool_blocks, "max_ctx", (json_int_t)pool_max_ctx,
                                 "max_seqs", (json_int_t)pool_max_seqs);
        json_t *o = json_pack(
            "{s:s, s:s, s:I, s:i, s:s, s:s, s:I, s:I, s:I, s:s, s:I, s:o, s:I, s:I, s:I, s:f, "
            "s:I, s:I, s:o, s:f, s:s, s:f, s:f, s:b}",
            "model", model_path, "arch", kiln_arch_name(cfg->arch), "n_ctx", (json_int_t)n_ctx,
            "block_size", (int)block_size, "kv_type_k", cli_kv_format_name(kv_k), "kv_type_v",
            cli_kv_format_name(kv_v), "weights_bytes", (json_int_t)weights, "scratch_bytes",
            (json_int_t)scratch, "memory_bytes", (json_int_t)memory, "memory_source", mem_src,
            "kv_budget_bytes", (json_int_t)budget, "layers", layers, "kv_bytes_per_token",
            (json_int_t)per_token, "kv_bytes", (json_int_t)kv_bytes, "kv_bytes_all_full",
            (json_int_t)kv_full, "kv_ratio_vs_all_full", ratio, "max_ctx", (json_int_t)max_ctx,
            "max_seqs", (json_int_t)max_seqs, "pool_now", pool, "bandwidth_gb_s", bw / 1e9,
            "bandwidth_source", bw_src, "decode_bytes_per_token", read_per_tok, "decode_tok_s",
            tok_s, "sliding_freeing", true);
        rc = cli_print_json(o);
    } else {
        printf("model: %s (%s, %d layers)\n", model_path, kiln_arch_name(cfg->arch),
               cfg->n_layer);
        printf("weights: %lld bytes (%.3f GiB)\n", (long long)weights, gib(weights));
        printf("KV: K %s, V %s, blocks of %lld tokens; per layer kind:\n",
               cli_kv_format_name(kv_k), cli_kv_format_name(kv_v), (long long)block_size);
        for (int32_t g = 0; g < L.n_groups; g++) {
            const kiln_kv_fit_group *G = &L.g[g];
            if (G->kind == KILN_KV_LAYER_RECURRENT) {
                printf("  recurrent  %3d layers: %lld bytes of state per sequence\n", G->n_layers,
                       (long long)G->state_bytes);
                continue;
            }
            printf("  %-9s  %3d layers, kv_dim %lld", kiln_kv_layer_kind_name(G->kind),
                   G->n_layers, (long long)G->kv_dim);
            if (G->kind == KILN_KV_LAYER_SLIDING) printf(", window %d", G->window);
            printf(": %lld bytes/token; at %lld tokens holds %lld tokens = %lld bytes\n",
                   (long long)kiln_kv_fit_group_bytes_per_token(&L, g), (long long)n_ctx,
                   (long long)kiln_kv_fit_group_tokens(&L, g, n_ctx),
                   (long long)kiln_kv_fit_group_bytes(&L, g, n_ctx));
        }
        printf("kv_bytes for one %lld-token sequence: %lld (%.3f GiB); all layers full "
               "attention: %lld (ratio %.3f)%s\n",
               (long long)n_ctx, (long long)kv_bytes, gib(kv_bytes), (long long)kv_full, ratio,
               kv_full != kv_bytes ? " [sliding-window blocks freed]" : "");
        printf("pool keeping every block (--kv-keep-window): %lld bytes per block (all %d "
               "layers), %lld for the sequence\n",
               (long long)pool_block, cfg->n_layer, (long long)pool_kv);
        printf("memory: %lld bytes (%s) - weights - scratch %lld = %lld for KV\n",
               (long long)memory, mem_src, (long long)scratch, (long long)budget);
        printf("longest context: %lld tokens (keeping every block: %lld)\n", (long long)max_ctx,
               (long long)pool_max_ctx);
        printf("concurrent %lld-token sequences: %lld (keeping every block: %lld)\n", (long long)n_ctx,
               (long long)max_seqs, (long long)pool_max_seqs);
        printf("decode: %.1f GB/s (%s) / %.0f bytes read per token (weights + kv_bytes) = "
               "%.1f tok/s predicted for one sequence\n",
               bw / 1e9, bw_src, read_per_tok, tok_s);
        rc = cli_check_stdout();
    }
done:
    kiln_model_close(m);
    return rc;
}
