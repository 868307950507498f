/* metrics.c - Prometheus counters and histograms of the server (see metrics.h). */
#include "server/metrics.h"

#include <string.h>

const char *const srv_endpoint_names[] = {
    "other",    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
    "/metrics", "/tokenize",       "/detokenize",          "/v1/messages", "/v1/responses",
    "/v1/responses/{id}",
};
const int srv_n_endpoints = (int)(sizeof srv_endpoint_names / sizeof srv_endpoint_names[0]);

/* Latency buckets in seconds: fine below 10 ms for small models, up to a minute. */
static const double ttft_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5,   1,      2.5,   5,    10,    30,   60};
static const double itl_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                    0.1,    0.25,  0.5,    1,     2.5,  5,     10};
static const double e2e_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                    5,    10,    20,   30,  60,   120, 300};

static void hist_init(srv_hist *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = b;
    h->n_bounds = n;
}

static void hist_observe(srv_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]));
    hist_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]));
    hist_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof e2e_bounds[0]));
}

void srv_metrics_destroy(srv_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void srv_metrics_request(srv_metrics *m, int endpoint, int status) {
    if (endpoint < 0 || endpoint >= srv_n_endpoints) endpoint = 0;
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_status && !(m->status[i].endpoint == endpoint && m->status[i].status == status))
        i++;
    if (i == m->n_status && m->n_status < SRV_MAX_STATUS) {
        m->status[i] = (srv_status_count){endpoint, status, 0};
        m->n_status++;
    }
    if (i < m->n_status)
        m->status[i].count++;
    else
        m->status_overflow++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_generation(srv_metrics *m, int32_t prompt_tokens, int32_t cached_tokens,
                            int32_t completion_tokens, kiln_finish_reason finish, double e2e_s) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->cached_tokens += (uint64_t)(cached_tokens > 0 ? cached_tokens : 0);
    m->completion_tokens += (uint64_t)(completion_tokens > 0 ? completion_tokens : 0);
    if ((int)finish >= 0 && (int)finish < 5) m->finish[finish]++;
    hist_observe(&m->e2e, e2e_s);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_ttft(srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_itl(srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

/* One sample without labels, with its HELP and TYPE lines. */
static void render_one(srv_buf *o, const char *name, const char *type, const char *help,
                       long long v) {
    srv_buf_addf(o, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", name, help, name, type, name, v);
}

static void render_hist(srv_buf *o, const char *name, const char *help, const srv_hist *h) {
    srv_buf_addf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        srv_buf_addf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    srv_buf_addf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    srv_buf_addf(o, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                 (unsigned long long)h->count);
}

void srv_metrics_render(srv_metrics *m, const kiln_engine_stats *st, srv_buf *o) {
    pthread_mutex_lock(&m->mu);
    srv_buf_adds(o, "# HELP kiln_http_requests_total HTTP requests answered, by endpoint and "
                    "status code.\n# TYPE kiln_http_requests_total counter\n");
    for (int i = 0; i < m->n_status; i++)
        srv_buf_addf(o, "kiln_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                     srv_endpoint_names[m->status[i].endpoint], m->status[i].status,
                     (unsigned long long)m->status[i].count);
    if (m->status_overflow)
        srv_buf_addf(o, "kiln_http_requests_total{endpoint=\"other\",status=\"other\"} %llu\n",
                     (unsigned long long)m->status_overflow);
    srv_buf_addf(o,
                 "# HELP kiln_prompt_tokens_total Prompt tokens of finished generations.\n"
                 "# TYPE kiln_prompt_tokens_total counter\nkiln_prompt_tokens_total %llu\n"
                 "# HELP kiln_generation_tokens_total Tokens generated by finished "
                 "generations.\n# TYPE kiln_generation_tokens_total counter\n"
                 "kiln_generation_tokens_total %llu\n",
                 (unsigned long long)m->prompt_tokens, (unsigned long long)m->completion_tokens);
    render_one(o, "kiln_prompt_tokens_cached_total", "counter",
               "Prompt tokens of finished generations whose KV came from the prefix cache "
               "(the sum of usage.prompt_tokens_details.cached_tokens).",
               (long long)m->cached_tokens);
    srv_buf_adds(o, "# HELP kiln_generations_total Finished generations, by finish reason.\n"
                    "# TYPE kiln_generations_total counter\n");
    static const char *const reasons[5] = {"none", "stop", "length", "cancelled", "error"};
    for (int i = 1; i < 5; i++)
        srv_buf_addf(o, "kiln_generations_total{finish_reason=\"%s\"} %llu\n", reasons[i],
                     (unsigned long long)m->finish[i]);
    render_hist(o, "kiln_time_to_first_token_seconds",
                "Time from the request's arrival to its first generated token.", &m->ttft);
    render_hist(o, "kiln_inter_token_latency_seconds",
                "Time between two consecutive generated tokens of a request.", &m->itl);
    render_hist(o, "kiln_request_duration_seconds",
                "Time from a generation request's arrival to its last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    kiln_engine_stats z = {0};
    if (!st) st = &z;
    srv_buf_addf(o,
                 "# HELP kiln_num_requests_running Sequences admitted and not finished.\n"
                 "# TYPE kiln_num_requests_running gauge\nkiln_num_requests_running %d\n"
                 "# HELP kiln_num_requests_waiting Requests queued for admission.\n"
                 "# TYPE kiln_num_requests_waiting gauge\nkiln_num_requests_waiting %d\n"
                 "# HELP kiln_kv_blocks_used KV cache blocks in use.\n"
                 "# TYPE kiln_kv_blocks_used gauge\nkiln_kv_blocks_used %d\n"
                 "# HELP kiln_kv_blocks_total KV cache blocks in the pool.\n"
                 "# TYPE kiln_kv_blocks_total gauge\nkiln_kv_blocks_total %d\n"
                 "# HELP kiln_kv_block_size Positions per KV cache block.\n"
                 "# TYPE kiln_kv_block_size gauge\nkiln_kv_block_size %d\n"
                 "# HELP kiln_engine_steps_total Forward steps the engine ran.\n"
                 "# TYPE kiln_engine_steps_total counter\nkiln_engine_steps_total %lld\n",
                 st->n_running, st->n_queued, st->kv_blocks_used, st->kv_blocks_total,
                 st->block_size, (long long)st->n_steps);
    /* Prefix cache, preemption and the disk tier (kiln_engine_stats; all 0 with the cache
     * off, the disk ones 0 without a cache directory). */
    static const char *const C = "counter", *const G = "gauge";
    const struct {
        const char *name, *type, *help;
        long long v;
    } eng[] = {
        {"kiln_kv_blocks_cached", G,
         "KV cache blocks holding no sequence, kept for the prefix cache (evictable).",
         st->kv_blocks_cached},
        {"kiln_prefix_cache_hits_total", C,
         "Requests admitted with at least one prompt block from the prefix cache (RAM or "
         "disk); a preempted request counts again when it resumes.",
         st->prefix_hit_requests},
        {"kiln_prefix_cache_misses_total", C,
         "Requests admitted with no prompt block from the prefix cache.", st->prefix_miss_requests},
        {"kiln_prefix_cache_hit_tokens_total", C,
         "Prompt tokens whose KV came from the prefix cache at admission.", st->prefix_hit_tokens},
        {"kiln_prefix_cache_miss_tokens_total", C, "Prompt tokens computed at admission.",
         st->prefix_miss_tokens},
        {"kiln_kv_evictions_total", C, "Cached KV blocks taken back for other sequences.",
         st->kv_evictions},
        {"kiln_preemptions_total", C,
         "Running sequences requeued because the KV pool ran dry (resumed from the cache).",
         st->preemptions},
        {"kiln_disk_cache_reads_total", C, "KV block files read from the disk tier (verified).",
         st->disk_reads},
        {"kiln_disk_cache_writes_total", C, "KV block files written to the disk tier.",
         st->disk_writes},
        {"kiln_disk_cache_read_bytes_total", C, "Bytes of the block files read from disk.",
         st->disk_read_bytes},
        {"kiln_disk_cache_write_bytes_total", C, "Bytes of the block files written to disk.",
         st->disk_write_bytes},
        {"kiln_disk_cache_corrupt_total", C,
         "Block files that failed a check (corrupt or not this model's): skipped and removed.",
         st->disk_corrupt},
        {"kiln_disk_cache_files", G, "Block files the disk tier's directory holds.",
         st->disk_files},
        {"kiln_disk_cache_bytes", G, "Bytes the disk tier's block files hold.", st->disk_bytes},
        {"kiln_spec_verify_steps_total", C,
         "Sequence-steps that verified at least one drafted token (speculative decoding).",
         st->spec_verify_steps},
        {"kiln_spec_drafted_tokens_total", C,
         "Drafted tokens fed for verification (n-gram, draft model, random, client "
         "predictions, verify-policy fills).",
         st->spec_drafted},
        {"kiln_spec_accepted_tokens_total", C, "Drafted tokens accepted by verification.",
         st->spec_accepted},
        {"kiln_fill_tokens_total", C, "Asserted fill tokens appended without sampling.",
         st->fill_tokens},
        {"kiln_forked_sequences_total", C,
         "Choices (n > 1) that shared their prompt's KV blocks with the first choice instead "
         "of computing the prompt.",
         st->n_forked},
    };
    for (size_t i = 0; i < sizeof eng / sizeof eng[0]; i++)
        render_one(o, eng[i].name, eng[i].type, eng[i].help, eng[i].v);
    /* accepted / drafted since the engine started (0 before any draft) */
    double ratio =
        st->spec_drafted > 0 ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0;
    srv_buf_addf(o,
                 "# HELP kiln_spec_acceptance_ratio Drafted tokens accepted, as a fraction of "
                 "those drafted since the engine started (0 when none was drafted).\n"
                 "# TYPE kiln_spec_acceptance_ratio gauge\nkiln_spec_acceptance_ratio %.9g\n",
                 ratio);
}
