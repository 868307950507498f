#include <jansson.h>
#include <errno.h>
#include <getopt.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli/cli.h"
#include "kv/kv_format.h"
#include "util/error.h"

int cli_fail(const kiln_error *err) {
    fprintf(stderr, "kiln: error: %s\n",
            err->message[0] ? err->message : kiln_status_name(err->status));
    return KILN_EXIT_ERROR;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    fprintf(stderr, "kiln %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(run 'kiln %s --help' for usage)\n", cmd);
    return KILN_EXIT_USAGE;
}

int cli_bad_option(const char *cmd, int c, char **argv) {
    if (c == ':') return cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
    return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_size(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || *s < '0' || *s > '9') return false;
    const char *p = s;
    uint64_t whole = 0, frac = 0, frac_den = 1;
    for (; *p >= '0' && *p <= '9'; p++)
        if (__builtin_mul_overflow(whole, 10u, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            return false;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return false;
        for (; *p >= '0' && *p <= '9'; p++)
            if (frac_den < 1000000000000000000ull) { /* digits past 18 cannot matter */
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
    }
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ull << 10},
        {"kib", 1ull << 10},
        {"kb", 1000ull},
        {"m", 1ull << 20},
        {"mib", 1ull << 20},
        {"mb", 1000000ull},
        {"g", 1ull << 30},
        {"gib", 1ull << 30},
        {"gb", 1000000000ull},
        {"t", 1ull << 40},
        {"tib", 1ull << 40},
        {"tb", 1000000000000ull},
    };
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(p, units[i].unit)) mult = units[i].mult;
    if (mult == 0) return false;
    uint64_t v;
    if (__builtin_mul_overflow(whole, mult, &v)) return false;
    unsigned __int128 part = (unsigned __int128)frac * mult / frac_den;
    if (__builtin_add_overflow(v, (uint64_t)part, &v) || v > (uint64_t)INT64_MAX) return false;
    if ((int64_t)v < lo || (int64_t)v > hi) return false;
    *out = (int64_t)v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

bool cli_parse_f32(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

char *cli_read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, stdin);
        if (r == 0) break;
        n += r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cli_threadpool(int n, kiln_threadpool **tp) {
    *tp = NULL;
    if (n <= 0) n = kiln_physical_cores();
    if (n == 1) return 0;
    kiln_error err = {0};
    if (kiln_threadpool_create(n, tp, &err) != KILN_OK) return cli_fail(&err);
    return 0;
}

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *cli_kv_type_name(kiln_kv_type t) {
    switch (t) {
    case KILN_KV_F16:
        return "f16";
    case KILN_KV_BF16:
        return "bf16";
    case KILN_KV_Q8_0:
        return "q8_0";
    case KILN_KV_Q4_0:
        return "q4_0";
    case KILN_KV_TURBO:
        return "turbo:k8v3";
    default:
        return "f32";
    }
}

const char *cli_kv_type_label(const kiln_engine_params *ep) {
    return ep->kv_type_name && ep->kv_type_name[0] ? ep->kv_type_name
                                                    : cli_kv_type_name(ep->kv_type);
}

int cli_backend(int n, kiln_backend **be) {
    *be = NULL;
    if (n <= 0) n = kiln_physical_cores();
    kiln_error err = {0};
    const kiln_backend_params p = {.kind = KILN_BACKEND_CPU, .n_threads = n};
    if (kiln_backend_create(&p, be, &err) != KILN_OK) return cli_fail(&err);
    return 0;
}

bool cli_parse_device(const char *s, kiln_model_params *mp) {
    if (!strcmp(s, "auto")) {
        mp->device = KILN_DEVICE_AUTO;
        mp->device_index = 0;
        return true;
    }
    if (!strcmp(s, "cpu")) {
        mp->device = KILN_DEVICE_CPU;
        mp->device_index = 0;
        return true;
    }
    if (strncmp(s, "cuda", 4) != 0) return false;
    int64_t n = 0;
    if (s[4] == ':') {
        if (!cli_parse_i64(s + 5, 0, 1023, &n)) return false;
    } else if (s[4] != '\0') {
        return false;
    }
    mp->device = KILN_DEVICE_CUDA;
    mp->device_index = (int32_t)n;
    return true;
}

uint64_t cli_random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        /* no entropy source: mix the clock's nanoseconds and the pid */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
               ((uint64_t)getpid() << 32);
    }
    return seed >> 1; /* keep it printable as a non-negative int64 for --seed */
}

int cli_check_stdout(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kiln: error: writing to standard output failed: %s\n", strerror(errno));
        return KILN_EXIT_ERROR;
    }
    return 0;
}

bool cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

void cli_warn_ctx(const char *cmd, const kiln_model *m, int64_t n_ctx) {
    int32_t train = kiln_model_n_ctx_train(m);
    if (train > 0 && n_ctx > train)
        fprintf(stderr,
                "kiln %s: warning: --ctx %lld exceeds the model's training context of %d "
                "positions; output past position %d may degrade\n",
                cmd, (long long)n_ctx, train, train);
}

int cli_engine_option(const char *cmd, int opt, const char *arg, kiln_engine_params *ep) {
    static const struct {
        int opt;
        const char *name;
        int64_t lo, hi;
    } lim[] = {
        {CLI_OPT_THREADS, "--threads", 1, 512},
        {CLI_OPT_CTX, "--ctx", 1, 1 << 24},
        {CLI_OPT_KV_TOKENS, "--kv-tokens", 1, INT32_MAX},
        {CLI_OPT_BLOCK_SIZE, "--block-size", 1, 4096},
        {CLI_OPT_STEP_TOKENS, "--step-tokens", 1, 1 << 20},
        {CLI_OPT_PREFILL_CHUNK, "--prefill-chunk", 1, 1 << 20},
        {CLI_OPT_MAX_SEQS, "--max-seqs", 1, 1 << 16},
        {CLI_OPT_MAX_QUEUE, "--max-queue", 1, 1 << 24},
    };
    if (opt == CLI_OPT_KV_MEMORY || opt == CLI_OPT_CACHE_DISK_MAX ||
        opt == CLI_OPT_MEMORY_BUDGET) {
        const char *name = opt == CLI_OPT_KV_MEMORY       ? "--kv-memory"
                           : opt == CLI_OPT_MEMORY_BUDGET ? "--memory-budget"
                                                          : "--cache-disk-max";
        int64_t v;
        if (!cli_parse_size(arg, 1, INT64_MAX, &v))
            return cli_usage_error(cmd,
                                   "%s must be a size of at least 1 byte: bytes, or a number "
                                   "with K, M, G, T (powers of 1024; also KiB ... TiB) or KB, "
                                   "MB, GB, TB (powers of 1000), e.g. 512M or 1.5GiB (got '%s')",
                                   name, arg);
        if (opt == CLI_OPT_KV_MEMORY)
            ep->kv_memory = v;
        else if (opt == CLI_OPT_MEMORY_BUDGET)
            ep->memory_budget = v;
        else
            ep->cache_disk_max = v;
        return 0;
    }
    if (opt == CLI_OPT_GPU_MEMORY) {
        /* a plain decimal number (no unit) is a fraction; anything else a size */
        char *end = NULL;
        const double f = arg && strchr(arg, '.') ? strtod(arg, &end) : 0.0;
        const bool plain = end && end != arg && *end == '\0';
        int64_t v;
        if (plain && f > 0.0 && f <= 1.0)
            ep->gpu_memory = f;
        else if (!plain && cli_parse_size(arg, 2, INT64_MAX, &v))
            ep->gpu_memory = (double)v;
        else
            return cli_usage_error(cmd,
                                   "--gpu-memory must be a fraction of the GPU's memory in (0, 1] "
                                   "with a decimal point (e.g. 0.9) or a size of at least 2 bytes "
                                   "(e.g. 40G, 1.5GiB, 60GB) (got '%s')",
                                   arg ? arg : "");
        return 0;
    }
    if (opt == CLI_OPT_NO_PREFIX_CACHE) {
        ep->no_prefix_cache = true;
        return 0;
    }
    if (opt == CLI_OPT_KV_KEEP_WINDOW) {
        ep->kv_keep_window = true;
        return 0;
    }
    if (opt == CLI_OPT_CACHE_DIR) {
        if (!arg || !arg[0]) return cli_usage_error(cmd, "--cache-dir needs a directory");
        ep->cache_dir = arg;
        return 0;
    }
    if (opt == CLI_OPT_KV_TYPE || opt == CLI_OPT_KV_TYPE_K || opt == CLI_OPT_KV_TYPE_V) {
        /* validated here (the message names the option); the engine parses the name again */
        const char *name = opt == CLI_OPT_KV_TYPE     ? "--kv-type"
                           : opt == CLI_OPT_KV_TYPE_K ? "--kv-type-k"
                                                      : "--kv-type-v";
        const kiln_kv_side side = opt == CLI_OPT_KV_TYPE     ? KILN_KV_SIDE_BOTH
                                  : opt == CLI_OPT_KV_TYPE_K ? KILN_KV_SIDE_K
                                                             : KILN_KV_SIDE_V;
        kiln_dtype k = KILN_DTYPE_F32, v = KILN_DTYPE_F32;
        kiln_error e = {0};
        if (kiln_kv_format_parse(name, arg, side, &k, &v, &e))
            return cli_usage_error(cmd, "%s", e.message);
        if (opt == CLI_OPT_KV_TYPE) {
            ep->kv_type = k != v                ? KILN_KV_F32
                          : k == KILN_DTYPE_F16  ? KILN_KV_F16
                          : k == KILN_DTYPE_BF16 ? KILN_KV_BF16
                          : k == KILN_DTYPE_Q8_0 ? KILN_KV_Q8_0
                          : k == KILN_DTYPE_Q4_0 ? KILN_KV_Q4_0
                                                 : KILN_KV_F32;
            ep->kv_type_name = arg;
        } else {
            *(opt == CLI_OPT_KV_TYPE_K ? &ep->kv_type_k : &ep->kv_type_v) = arg;
        }
        return 0;
    }
    if (opt == CLI_OPT_KV_QUANT_START) {
        int64_t v;
        if (!cli_parse_i64(arg, 0, 1 << 24, &v))
            return cli_usage_error(cmd,
                                   "--kv-quant-start must be an integer in [0, %d] (got '%s')",
                                   1 << 24, arg);
        ep->kv_quant_start = (int32_t)v;
        return 0;
    }
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
        if (lim[i].opt != opt) continue;
        int64_t v;
        if (!cli_parse_i64(arg, lim[i].lo, lim[i].hi, &v))
            return cli_usage_error(cmd, "%s must be an integer in [%lld, %lld] (got '%s')",
                                   lim[i].name, (long long)lim[i].lo, (long long)lim[i].hi, arg);
        switch (opt) {
        case CLI_OPT_THREADS:
            ep->n_threads = (int32_t)v;
            break;
        case CLI_OPT_CTX:
            ep->n_ctx = (int32_t)v;
            break;
        case CLI_OPT_KV_TOKENS:
            ep->kv_tokens = (int32_t)v;
            break;
        case CLI_OPT_BLOCK_SIZE:
            ep->block_size = (int32_t)v;
            break;
        case CLI_OPT_STEP_TOKENS:
            ep->step_tokens = (int32_t)v;
            break;
        case CLI_OPT_PREFILL_CHUNK:
            ep->prefill_chunk = (int32_t)v;
            break;
        case CLI_OPT_MAX_SEQS:
            ep->max_seqs = (int32_t)v;
            break;
        default:
            ep->max_queue = (int32_t)v;
            break;
        }
        return 0;
    }
    return -1;
}

int cli_engine_check(const char *cmd, const kiln_engine_params *ep) {
    bool dir = ep->cache_dir && ep->cache_dir[0];
    if (dir && ep->no_prefix_cache)
        return cli_usage_error(cmd, "--cache-dir keeps the prefix cache's blocks on disk: it "
                                    "cannot be used with --no-prefix-cache");
    if (ep->cache_disk_max > 0 && !dir)
        return cli_usage_error(cmd, "--cache-disk-max limits the disk tier: it needs --cache-dir");
    return 0;
}

const char *cli_spec_name(kiln_spec_source s) {
    switch (s) {
    case KILN_SPEC_OFF:
        return "off";
    case KILN_SPEC_NGRAM:
        return "ngram";
    case KILN_SPEC_DRAFT:
        return "draft";
    case KILN_SPEC_RANDOM:
        return "random";
    default:
        return "default";
    }
}

int cli_spec_option(const char *cmd, int opt, const char *arg, kiln_engine_params *ep,
                    cli_spec *cs) {
    int64_t v;
    switch (opt) {
    case CLI_OPT_SPEC: {
        static const kiln_spec_source srcs[] = {KILN_SPEC_OFF, KILN_SPEC_NGRAM, KILN_SPEC_DRAFT,
                                                KILN_SPEC_RANDOM};
        for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++)
            if (!strcmp(arg, cli_spec_name(srcs[i]))) {
                ep->spec = srcs[i];
                cs->spec_set = true;
                return 0;
            }
        return cli_usage_error(cmd, "--spec must be off, ngram, draft or random (got '%s')", arg);
    }
    case CLI_OPT_SPEC_K:
        if (!cli_parse_i64(arg, 1, KILN_MAX_SPEC_K, &v))
            return cli_usage_error(cmd, "--spec-k must be an integer in [1, %d] (got '%s')",
                                   KILN_MAX_SPEC_K, arg);
        ep->spec_k = (int32_t)v;
        return 0;
    case CLI_OPT_SPEC_NGRAM: {
        const char *colon = strchr(arg, ':');
        char lo[32] = "";
        int64_t a = 0, b = 0;
        if (colon && (size_t)(colon - arg) < sizeof lo)
            snprintf(lo, sizeof lo, "%.*s", (int)(colon - arg), arg);
        if (!colon || !cli_parse_i64(lo, 1, 64, &a) || !cli_parse_i64(colon + 1, 1, 64, &b) ||
            a > b)
            return cli_usage_error(cmd,
                                   "--spec-ngram must be MIN:MAX, n-gram sizes with 1 <= MIN <= "
                                   "MAX <= 64, e.g. 1:4 (got '%s')",
                                   arg);
        ep->spec_ngram_min = (int32_t)a;
        ep->spec_ngram_max = (int32_t)b;
        return 0;
    }
    case CLI_OPT_DRAFT_MODEL:
        if (!arg || !arg[0]) return cli_usage_error(cmd, "--draft-model needs a model path");
        cs->draft_path = arg;
        return 0;
    default:
        return -1;
    }
}

int cli_spec_check(const char *cmd, kiln_engine_params *ep, const cli_spec *cs) {
    if (ep->spec == KILN_SPEC_DRAFT && !cs->draft_path)
        return cli_usage_error(cmd, "--spec draft needs --draft-model PATH (the draft model)");
    if (cs->draft_path && !cs->spec_set) ep->spec = KILN_SPEC_DRAFT;
    return 0;
}

int cli_spec_load(const cli_spec *cs, kiln_engine_params *ep, kiln_model **draft) {
    *draft = NULL;
    if (!cs->draft_path) return 0;
    kiln_error err = {0};
    kiln_model_params lp = {0};
    if (kiln_model_load(cs->draft_path, &lp, draft, &err) != KILN_OK) {
        kiln_error_prefix(&err, "draft model: ");
        return cli_fail(&err);
    }
    ep->draft_model = *draft;
    return 0;
}

bool cli_clobbers_input(const char *out, const char *in) {
    if (!out || !in) return false;
    if (cli_same_file(out, in)) return true;
    struct stat si, so, sd;
    if (stat(in, &si) != 0 || !S_ISDIR(si.st_mode) || stat(out, &so) != 0 || !S_ISREG(so.st_mode))
        return false;
    char dir[4096];
    const char *slash = strrchr(out, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) : 1, slash ? out : ".");
    if (slash == out) snprintf(dir, sizeof dir, "/");
    if (stat(dir, &sd) != 0 || sd.st_dev != si.st_dev || sd.st_ino != si.st_ino) return false;
    const char *base = slash ? slash + 1 : out;
    size_t bl = strlen(base);
    return (bl > 12 && !strcmp(base + bl - 12, ".safetensors")) ||
           (bl > 5 && !strcmp(base + bl - 5, ".json")) || !strncmp(base, "tokenizer", 9);
}

int cli_print_json(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    int rc = 0;
    if (!s) {
        fprintf(stderr, "kiln: error: cannot build the JSON output\n");
        rc = KILN_EXIT_ERROR;
    } else {
        printf("%s\n", s);
    }
    free(s);
    json_decref(o);
    return rc;
}

int cli_kv_side_option(const char *cmd, const char *opt, const char *arg, kiln_dtype *k,
                       kiln_dtype *v) {
    const kiln_kv_side side = !strcmp(opt, "--kv-type-k")   ? KILN_KV_SIDE_K
                              : !strcmp(opt, "--kv-type-v") ? KILN_KV_SIDE_V
                                                            : KILN_KV_SIDE_BOTH;
    kiln_error e = {0};
    if (kiln_kv_format_parse(opt, arg, side, k, v, &e)) return cli_usage_error(cmd, "%s", e.message);
    return 0;
}
