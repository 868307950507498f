/* cli.h - shared helpers of the kiln command-line subcommands. */
#ifndef KILN_CLI_CLI_H
#define KILN_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "backend/backend.h"
#include "backend/loader.h"
#include "util/threadpool.h"

/* Exit codes: 0 success, 1 runtime error (bad model, bad input), 2 usage error. */
#define KILN_EXIT_ERROR 1
#define KILN_EXIT_USAGE 2

int kiln_cmd_run(int argc, char **argv);
int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_inspect(int argc, char **argv);
int kiln_cmd_logits(int argc, char **argv);
int kiln_cmd_quantize(int argc, char **argv);
int kiln_cmd_convert(int argc, char **argv);
int kiln_cmd_gen_model(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
int kiln_cmd_serve(int argc, char **argv);
int kiln_cmd_perplexity(int argc, char **argv);
int kiln_cmd_fit(int argc, char **argv);

/** Print "kiln: error: <message>" to stderr and return KILN_EXIT_ERROR. */
int cli_fail(const kiln_error *err);
/** The usage error for getopt_long's result c when it is not an option of cmd: ':' (a
 *  missing value) or anything else (an unknown option), naming argv[optind - 1]. Returns
 *  KILN_EXIT_USAGE. */
int cli_bad_option(const char *cmd, int c, char **argv);

/** Print "kiln <cmd>: <fmt...>" to stderr and return KILN_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Strict numeric parsing: the whole string must be a number within [lo, hi]. */
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

/**
 * Parse a byte size (the whole string): a decimal number, optionally with a fraction
 * ("1.5G"), then an optional unit, case-insensitive: none or "B" = bytes; "K", "M", "G", "T"
 * and "KiB", "MiB", "GiB", "TiB" = 1024^1..4 bytes; "KB", "MB", "GB", "TB" = 1000^1..4 bytes
 * (SI). The value is rounded down to whole bytes and must lie in [lo, hi]. False (and *out
 * untouched) for anything else: an empty string, a sign, spaces, an unknown unit, a value
 * past INT64_MAX.
 */
bool cli_parse_size(const char *s, int64_t lo, int64_t hi, int64_t *out);

/** Parse a decimal unsigned 64-bit integer (the whole string; no sign). */
bool cli_parse_u64(const char *s, uint64_t *out);
bool cli_parse_f32(const char *s, float lo, float hi, float *out);

/** Read all of stdin into a malloc'd buffer (NUL-terminated). NULL on failure. */
char *cli_read_stdin(size_t *len);

/** Threads: n > 0 as given, else kiln_physical_cores(). Prints errors; NULL tp means 1 thread. */
int cli_threadpool(int n, kiln_threadpool **tp);
/** A CPU backend context of n threads (n > 0 as given, else kiln_physical_cores()). Prints
 *  errors and returns non-zero on failure. */
int cli_backend(int n, kiln_backend **be);
/** "f32", "f16", "bf16". */
const char *cli_kv_type_name(kiln_kv_type t);
/** The --kv-type the params ask for: kv_type_name when set ("turbo:k4v3"), else kv_type's name. */
const char *cli_kv_type_label(const kiln_engine_params *ep);

double cli_now_ms(void);

/** A seed from getrandom(2) (clock ^ pid if that fails), in [0, 2^63) so --seed can repeat it. */
uint64_t cli_random_seed(void);

/** Flush stdout; on a write error (full disk, closed pipe) print why and return
 *  KILN_EXIT_ERROR, else 0. Commands call it before exiting successfully. */
int cli_check_stdout(void);

/** True when writing out would destroy an input: out is the same file as in, or in is a
 *  model directory and out is an existing .safetensors/.json/tokenizer file inside it. */
bool cli_clobbers_input(const char *out, const char *in);

/** True when both paths exist and name the same file (device and inode). */
bool cli_same_file(const char *a, const char *b);

/* getopt_long codes of the engine-limit options that run, bench and serve share (above any
 * short option's character, except -t). */
enum {
    CLI_OPT_THREADS = 't',
    CLI_OPT_CTX = 0x100,
    CLI_OPT_KV_TYPE,
    CLI_OPT_KV_MEMORY,
    CLI_OPT_KV_TOKENS,
    CLI_OPT_BLOCK_SIZE,
    CLI_OPT_STEP_TOKENS,
    CLI_OPT_PREFILL_CHUNK,
    CLI_OPT_MAX_SEQS,
    CLI_OPT_MAX_QUEUE,
    CLI_OPT_NO_PREFIX_CACHE,
    CLI_OPT_CACHE_DIR,
    CLI_OPT_CACHE_DISK_MAX,
    /* speculative decoding (run and serve) */
    CLI_OPT_SPEC,
    CLI_OPT_SPEC_K,
    CLI_OPT_SPEC_NGRAM,
    CLI_OPT_DRAFT_MODEL,
    CLI_OPT_DEVICE, /* --device (run, bench): where the model's weights go (model params) */
    CLI_OPT_MEMORY_BUDGET, /* --memory-budget SIZE: the KV pool from what weights and scratch
                              leave (kiln_engine_params.memory_budget) */
    CLI_OPT_KV_TYPE_K,
    CLI_OPT_KV_TYPE_V,
    CLI_OPT_KV_QUANT_START,
    CLI_OPT_GPU_MEMORY, /* --gpu-memory BYTES|FRACTION (kiln_engine_params.gpu_memory) */
    CLI_OPT_KV_KEEP_WINDOW, /* --kv-keep-window: kiln_engine_params.kv_keep_window */
};

/* The struct option entries of those options, for a command's option table. */
#define CLI_ENGINE_LONG_OPTIONS                                                                    \
    {"threads", required_argument, 0, CLI_OPT_THREADS},                                            \
        {"ctx", required_argument, 0, CLI_OPT_CTX},                                                \
        {"kv-type", required_argument, 0, CLI_OPT_KV_TYPE},                                        \
        {"kv-type-k", required_argument, 0, CLI_OPT_KV_TYPE_K},                                    \
        {"kv-type-v", required_argument, 0, CLI_OPT_KV_TYPE_V},                                    \
        {"kv-quant-start", required_argument, 0, CLI_OPT_KV_QUANT_START},                          \
        {"kv-keep-window", no_argument, 0, CLI_OPT_KV_KEEP_WINDOW},                                \
        {"kv-memory", required_argument, 0, CLI_OPT_KV_MEMORY},                                    \
        {"kv-tokens", required_argument, 0, CLI_OPT_KV_TOKENS},                                    \
        {"block-size", required_argument, 0, CLI_OPT_BLOCK_SIZE},                                  \
        {"step-tokens", required_argument, 0, CLI_OPT_STEP_TOKENS},                                \
        {"prefill-chunk", required_argument, 0, CLI_OPT_PREFILL_CHUNK},                            \
        {"max-seqs", required_argument, 0, CLI_OPT_MAX_SEQS},                                      \
        {"max-queue", required_argument, 0, CLI_OPT_MAX_QUEUE},                                    \
        {"no-prefix-cache", no_argument, 0, CLI_OPT_NO_PREFIX_CACHE},                              \
        {"cache-dir", required_argument, 0, CLI_OPT_CACHE_DIR},                                    \
        {"memory-budget", required_argument, 0, CLI_OPT_MEMORY_BUDGET},                            \
        {"gpu-memory", required_argument, 0, CLI_OPT_GPU_MEMORY}, {                                \
        "cache-disk-max", required_argument, 0, CLI_OPT_CACHE_DISK_MAX                             \
    }

/** Apply engine option `opt` (a CLI_OPT_* code) with value `arg` to *ep, checking its range
 * (the limits kiln_engine_create enforces). --kv-memory, --memory-budget and --cache-disk-max take sizes
 * (cli_parse_size: "512M", "16GiB", plain bytes); --gpu-memory a fraction in (0, 1] written
 * with a decimal point ("0.9", "1.0") or a size as those; --no-prefix-cache sets no_prefix_cache
 * (arg unused); --cache-dir DIR sets cache_dir to arg (borrowed: argv outlives the engine's
 * creation), which must not be empty. Returns -1 when opt is not an engine option, 0 when
 * applied, KILN_EXIT_USAGE (after printing "kiln CMD: --NAME must be ...") for a bad value. */
int cli_engine_option(const char *cmd, int opt, const char *arg, kiln_engine_params *ep);

/** Check the engine options of *ep together, after every option is parsed: the disk tier
 * needs the prefix cache (--cache-dir with --no-prefix-cache) and a directory
 * (--cache-disk-max without --cache-dir). Returns 0, or KILN_EXIT_USAGE after printing
 * "kiln CMD: ..." saying which options conflict. */
int cli_engine_check(const char *cmd, const kiln_engine_params *ep);

/* The struct option entries of the speculative-decoding options of run and serve. */
#define CLI_SPEC_LONG_OPTIONS                                                                      \
    {"spec", required_argument, 0, CLI_OPT_SPEC}, {"spec-k", required_argument, 0, CLI_OPT_SPEC_K}, \
        {"spec-ngram", required_argument, 0, CLI_OPT_SPEC_NGRAM}, {                                \
        "draft-model", required_argument, 0, CLI_OPT_DRAFT_MODEL                                   \
    }

/** What the speculation options gave besides engine parameters. */
typedef struct cli_spec {
    const char *draft_path; /* --draft-model PATH (borrowed from argv); NULL = none */
    bool spec_set;          /* --spec was given */
} cli_spec;

/** Apply speculation option `opt` with value `arg` (issue 18, kiln_engine_params' spec
 * fields): --spec off|ngram|draft|random (ep->spec), --spec-k N in [1, KILN_MAX_SPEC_K]
 * (ep->spec_k), --spec-ngram MIN:MAX with 1 <= MIN <= MAX <= 64 (ep->spec_ngram_min/max),
 * --draft-model PATH (cs->draft_path; loaded by cli_spec_load). Returns -1 when opt is not one
 * of them, 0 when applied, KILN_EXIT_USAGE (after "kiln CMD: --NAME must be ...") for a bad
 * value. */
int cli_spec_option(const char *cmd, int opt, const char *arg, kiln_engine_params *ep,
                    cli_spec *cs);

/** After every option: --spec draft needs --draft-model (KILN_EXIT_USAGE naming both), and
 * --draft-model without --spec makes draft the engine's default. Returns 0 or KILN_EXIT_USAGE. */
int cli_spec_check(const char *cmd, kiln_engine_params *ep, const cli_spec *cs);

/** Load the --draft-model (as the main model is loaded: kiln_model_load, its tokenizer found
 * beside a llama2.c checkpoint) into *draft and point ep->draft_model at it; nothing without
 * one (*draft NULL). The engine checks its vocabulary against the target's at creation.
 * Prints the error ("kiln: error: draft model: ...") and returns KILN_EXIT_ERROR on failure.
 * Free *draft with kiln_model_free after the engine is destroyed. */
int cli_spec_load(const cli_spec *cs, kiln_engine_params *ep, kiln_model **draft);

/** "off", "ngram", "draft", "random" ("default" for KILN_SPEC_DEFAULT). */
const char *cli_spec_name(kiln_spec_source s);

/** Warn on stderr (prefix "kiln CMD: warning:") when a --ctx of n_ctx positions exceeds the
 * model's training context (n_ctx_train > 0): positions past it are outside what the weights
 * were trained on, so quality usually degrades (llama.cpp warns likewise). */
void cli_warn_ctx(const char *cmd, const kiln_model *m, int64_t n_ctx);

/** Parse a --device value into mp: "auto" (the default), "cpu", "cuda" (GPU 0) or "cuda:N" (N a decimal integer in
 *  [0, 1023]). False for anything else; whether the device exists is kiln_model_load's
 *  check. */
bool cli_parse_device(const char *s, kiln_model_params *mp);

/** Weight type names f32 f16 bf16 q8_0 q4_0 q4_k q6_k (case-insensitive) -> dtype; false for
 *  anything else. (cmd_quantize.c) */
bool cli_parse_weight_type(const char *s, kiln_dtype *out);

typedef struct json_t json_t;
/** Print o as one compact line of JSON (keys in insertion order) to stdout and drop the
 *  reference. NULL o (a failed json_pack) or a failed dump prints "kiln: error: cannot build
 *  the JSON output" to stderr. Returns 0 or KILN_EXIT_ERROR. (common.c) */
int cli_print_json(json_t *o);

/** A KV page format by its name in the format traits table (kv/kv_format.h: "f32", "f16",
 *  "bf16", and any format added there); false for anything else. (kv_names.c) */
bool cli_parse_kv_format(const char *s, kiln_dtype *out);
/** "f32, f16, bf16, ...": every format of the traits table, for error messages. */
const char *cli_kv_format_names(void);
/** The traits table's name of format t, "?" when t is not a format. */
const char *cli_kv_format_name(kiln_dtype t);
/** One of --kv-type / --kv-type-k / --kv-type-v (opt, as typed) with its value arg: sets *k
 *  and *v (--kv-type), or the one side named, as kiln_kv_format_parse (kv/kv_format.h: a
 *  format name or a TurboQuant config turbo:kBvB, of which -k / -v keep their side). Returns 0,
 *  or cli_usage_error(cmd, ...)'s exit code naming opt and the bad part. (common.c) */
int cli_kv_side_option(const char *cmd, const char *opt, const char *arg, kiln_dtype *k,
                       kiln_dtype *v);

#endif
