/*
 * metrics.h - the server's counters and histograms, rendered in the Prometheus text
 * exposition format (version 0.0.4: "# HELP", "# TYPE", samples; histograms as cumulative
 * _bucket{le=...} series with _sum and _count).
 */
#ifndef KILN_SERVER_METRICS_H
#define KILN_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "kiln.h"
#include "server/srv_util.h"

#define SRV_HIST_BUCKETS 16
#define SRV_MAX_STATUS   128

typedef struct srv_hist {
    const double *bounds; /* upper bounds in seconds, ascending; n_bounds of them */
    int n_bounds;
    uint64_t counts[SRV_HIST_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    double sum;
    uint64_t count;
} srv_hist;

typedef struct srv_status_count {
    int endpoint; /* index into the route names */
    int status;
    uint64_t count;
} srv_status_count;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_status_count status[SRV_MAX_STATUS]; /* (endpoint, status) pairs seen */
    int n_status;
    uint64_t status_overflow;
    uint64_t prompt_tokens, completion_tokens;
    uint64_t cached_tokens; /* of prompt_tokens, those served from the prefix cache */
    uint64_t finish[5];     /* by kiln_finish_reason */
    srv_hist ttft, itl, e2e;
} srv_metrics;

/** Route names used as the "endpoint" label (index = endpoint). */
extern const char *const srv_endpoint_names[];
extern const int srv_n_endpoints;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);

/** Count one finished HTTP request. */
void srv_metrics_request(srv_metrics *m, int endpoint, int status);
/** Count a finished generation: prompt tokens (cached_tokens of them from the prefix cache,
 *  kiln_usage.cached_tokens), generated tokens, finish reason, end-to-end seconds. Negative
 *  counts are taken as 0. */
void srv_metrics_generation(srv_metrics *m, int32_t prompt_tokens, int32_t cached_tokens,
                            int32_t completion_tokens, kiln_finish_reason finish, double e2e_s);
/** Observe one time to first token / one inter-token gap (seconds). */
void srv_metrics_ttft(srv_metrics *m, double s);
void srv_metrics_itl(srv_metrics *m, double s);

/**
 * Render everything, with the engine's gauges and counters from st (NULL while the model
 * loads: those are then 0): running/waiting sequences, KV blocks (used, total, cached),
 * steps, the prefix cache's (kiln_prefix_cache_*), preemption and disk tier's
 * (kiln_disk_cache_*) counters of kiln_engine_stats, and speculation's: verify steps,
 * drafted and accepted tokens, asserted fill tokens (kiln_spec_*_total, kiln_fill_tokens_total)
 * and the gauge kiln_spec_acceptance_ratio = accepted / drafted (0 when none was drafted).
 * Appends to out.
 */
void srv_metrics_render(srv_metrics *m, const kiln_engine_stats *st, srv_buf *out);

#endif
