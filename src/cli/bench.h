/*
 * bench.h - what the two modes of `kiln bench` share: cmd_bench.c (concurrency levels over
 * independent synthetic prompts) and bench_prefix.c (--shared-prefix: prompts that share a
 * prefix, with the prefix cache off, on, and across an engine restart over --cache-dir).
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
    kiln_finish_reason finish;
    kiln_error err; /* finish KILN_FINISH_ERROR: why */
} bench_req;

/** Read r->stream to its FINISH event, filling r's times, counts and finish (a failed
 *  kiln_stream_next or an error finish sets finish KILN_FINISH_ERROR and r->err). Does not
 *  destroy the stream. Usable as a pthread start routine (arg: a bench_req). */
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

#endif
