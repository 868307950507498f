/*
 * bench.h - what the modes of `kiln bench` share: cmd_bench.c (concurrency levels over
 * independent synthetic prompts), bench_prefix.c (--shared-prefix: prompts that share a
 * prefix, with the prefix cache off, on, and across an engine restart over --cache-dir) and
 * bench_spec.c (--spec MODE: speculative decoding against plain decoding in the same run, and
 * --verify-scaling: what a forward of M tokens costs against one of 1).
 */
#ifndef KILN_CLI_BENCH_H
#define KILN_CLI_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

/** One benchmark request, read by bench_consume. Times are milliseconds on CLOCK_MONOTONIC
 *  (cli_now_ms's clock): t_submit is set by the caller just before kiln_engine_submit, the
 *  others are the engine's event times (kiln_event.time_ns), so a reader thread that wakes
 *  late does not skew them. */
typedef struct bench_req {
    kiln_stream *stream;
    double t_submit, t_first, t_last, t_end;
    int32_t n_tokens;      /* TOKEN events */
    int32_t cached_tokens; /* the FINISH usage's cached_tokens (prefix cache) */
    int32_t prompt_tokens; /* the FINISH usage's prompt_tokens */
    kiln_usage usage;      /* the FINISH usage, whole */
    int32_t *ids;          /* optional (caller's buffer of ids_cap): the TOKEN events' ids */
    int32_t ids_cap;
    kiln_finish_reason finish;
    kiln_error err; /* finish KILN_FINISH_ERROR: why */
} bench_req;

/** Read r->stream to its FINISH event, filling r's times, counts, usage and finish (a failed
 *  kiln_stream_next or an error finish sets finish KILN_FINISH_ERROR and r->err), and the
 *  first ids_cap token ids into r->ids when it is set. Does not destroy the stream. Usable as
 *  a pthread start routine (arg: a bench_req). */
void *bench_consume(void *arg);

/** Token ids for synthetic prompts: every id of the vocabulary that is not end-of-generation,
 *  not BOS and (with a tokenizer) decodes to a non-empty piece, ascending. malloc'd; *n_out
 *  gets the count. NULL when out of memory. */
int32_t *bench_ordinary_tokens(const kiln_model *m, int32_t *n_out);

/** xorshift64 (Marsaglia 2003): advance *x (non-zero) and return it. */
uint64_t bench_xorshift(uint64_t *x);

/** qsort comparator for doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/** Nearest-rank percentile p (0..100) of sorted v[0..n), n >= 1. */
double bench_percentile(const double *v, int32_t n, double p);

/** CPU seconds the whole process has used (all threads): CLOCK_PROCESS_CPUTIME_ID. */
double bench_cpu_now_s(void);

/** Make ep->n_ctx hold a request of per_req positions: the --ctx the user gave (0: the model's
 *  training context), stretched to per_req when shorter, with a warning on stderr (RoPE
 *  extrapolates; the figures stay meaningful for speed, not for text). Returns 0, or
 *  KILN_EXIT_USAGE (an explicit --ctx shorter than a request: an error on stderr).
 *  (bench_util.c) */
int bench_fit_ctx(const kiln_model *m, kiln_engine_params *ep, int64_t per_req);

/** What `kiln bench --shared-prefix` runs (defaults in cmd_bench.c's usage). */
typedef struct bench_prefix_opts {
    int32_t prefix_tokens; /* N: tokens every prompt starts with */
    int32_t suffix_tokens; /* unique tokens after the prefix, per request */
    int32_t gen_tokens;    /* greedy tokens generated per request (ignore_eos) */
    int32_t clients;       /* concurrent client threads, each submitting and reading */
    int32_t requests;      /* measured requests per phase */
    uint64_t seed;         /* of the synthetic prefix and suffixes */
    bool json;             /* one JSON object instead of a table */
} bench_prefix_opts;

/**
 * Run the shared-prefix benchmark on the model at model_path (loaded with *lp) and print its
 * table (or JSON) to stdout. ep holds the engine options the user gave: each phase creates a
 * fresh engine from a copy, with no_prefix_cache set for "off" and cleared for "on"; only the
 * "restart" phase, run when ep->cache_dir is set, uses the directory (and
 * ep->cache_disk_max). ep->no_prefix_cache must be false. Returns 0, or KILN_EXIT_ERROR after
 * printing "kiln: error: ..." (a model or engine that does not load, a failed request).
 */
int bench_prefix_run(const char *model_path, const kiln_model_params *lp,
                     const kiln_engine_params *ep, const bench_prefix_opts *o);

/** What `kiln bench --spec MODE` measures (bench_spec.c). */
typedef enum bench_spec_mode {
    BENCH_SPEC_NONE = 0,  /* no --spec (--verify-scaling alone) */
    BENCH_SPEC_NGRAM,     /* prompt lookup (KILN_SPEC_NGRAM) */
    BENCH_SPEC_RANDOM,    /* uniformly random drafts (KILN_SPEC_RANDOM) */
    BENCH_SPEC_DRAFT,     /* a draft model (KILN_SPEC_DRAFT, engine draft_model) */
    BENCH_SPEC_PRED_SELF, /* prediction_ids = the request's own plain greedy output */
    BENCH_SPEC_PRED_EDIT, /* that output with edit_pct % of its tokens replaced */
} bench_spec_mode;

#define BENCH_SPEC_MAX_LEVELS 16

/** The options of `kiln bench --spec MODE` and `--verify-scaling` (defaults in cmd_bench.c's
 *  usage). */
typedef struct bench_spec_opts {
    bench_spec_mode mode;
    const char *mode_arg;   /* MODE as given (reports) */
    const char *draft_path; /* BENCH_SPEC_DRAFT: the draft model (borrowed from argv) */
    float edit_pct;         /* BENCH_SPEC_PRED_EDIT: percent of tokens replaced, [0, 100] */
    bool verify_scaling;    /* also (or only, with mode NONE) the forward-cost table */
    int32_t levels[BENCH_SPEC_MAX_LEVELS]; /* concurrency levels */
    int32_t n_levels;
    int32_t requests;      /* requests per phase per level (at least the level's concurrency) */
    int32_t prompt_tokens; /* 0: 128 synthetic, or the whole --prompt-file */
    int32_t gen_tokens;
    const char *prompt_file; /* text, tokenized: the prompts (NULL: synthetic) */
    int32_t spec_k;          /* 0: the engine's default */
    uint64_t seed;           /* synthetic prompts, edits */
    bool json;
} bench_spec_opts;

/**
 * Parse --spec's MODE into o->mode (and draft_path, edit_pct): "ngram", "random",
 * "draft:PATH" (PATH must be a readable file or directory), "prediction:self",
 * "prediction:edit=P" (P a number in [0, 100]). Returns 0, or KILN_EXIT_USAGE after printing
 * "kiln bench: --spec ..." naming what is wrong.
 */
int bench_spec_parse_mode(const char *arg, bench_spec_opts *o);

/**
 * Run `kiln bench --spec` / `--verify-scaling` on the model at model_path (loaded with *lp)
 * and print the table (or one JSON object) to stdout. ep holds the user's engine options;
 * the engine is created from a copy with the prefix cache off (both phases compute their
 * prompt) and, for draft:PATH, the draft model. Returns 0; KILN_EXIT_ERROR after printing
 * "kiln: error: ..." (a model, prompt file or engine that does not load, a failed request)
 * or, after the full report, "MISMATCH" lines when a speculative output differs from its
 * plain one; KILN_EXIT_USAGE when a --prompt-file holds fewer tokens than --prompt-tokens.
 */
int bench_spec_run(const char *model_path, const kiln_model_params *lp,
                   const kiln_engine_params *ep, const bench_spec_opts *o);

#endif
