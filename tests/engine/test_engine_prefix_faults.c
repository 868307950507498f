/*
 * The prefix cache's disk tier under faults (issue 13). Whatever happens to the cache
 * directory, a request's tokens and the logits of every generated position stay bitwise
 * identical to the reference (an engine with no_prefix_cache, the request alone), and what
 * the cache reports (usage.cached_tokens, disk_reads, disk_corrupt) is exactly what verified:
 *
 *   1. corruption: the block files one engine left are damaged on disk (a payload byte
 *      flipped, a header byte flipped, truncated or extended, two files' contents swapped);
 *      then one engine after another on the directory: each serves the verified leading
 *      blocks, rejects (removes, logs, counts) the first bad file it reads, rewrites it from
 *      its own computation, and the next engine gets one more block, until all are clean
 *      (a file whose size fits no block of the tier is never read, so not counted corrupt:
 *      kiln_disk_tier_has does not report it, and the engine's write replaces it);
 *   2. another model on the same directory never reads the first model's files, and a file
 *      of the first model put under a name the second one looks up is rejected;
 *   3. a full disk (a 192 KiB tmpfs; needs CAP_SYS_ADMIN, else skipped): serving goes on,
 *      and after a restart every file present verifies;
 *   4. kill -9 while a child process writes: the directory lock is free again, leftover
 *      temporary files are removed at open, every block file present is whole and used;
 *   5. 64 clients at once on one engine with a pool smaller than the demand (preemptions),
 *      RAM only and with the disk tier (then again after a restart, from disk).
 *
 * Block files are identified by the token ids in their header (disk_tier.h's format): the
 * chain hashes cannot be computed from the public API, but the tokens say which block of
 * which prompt a file holds.
 *
 * usage: test_engine_prefix_faults MODEL_REL [OTHER_MODEL_REL]
 *   OTHER_MODEL_REL (case 2) defaults to llama2xs-260K, or stories260K when MODEL_REL is it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_test_util.h"
#include "kv/disk_tier.h"
#include "util/log.h"

#define BS         16 /* the engine's default block size */
#define PREFIX_LEN 80 /* 5 blocks */
#define N_PREFIX   (PREFIX_LEN / BS)
#define MAX_TOK    20
#define PATH_MAX_  1024

typedef struct prompt {
    int32_t ids[256];
    int32_t n;
} prompt;

static const char *g_rel;
static kiln_model *g_m;
static int32_t g_nv;

/* ---- small helpers --------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* prefix (prefix_len ids from prefix_seed) then suffix_len ids from suffix_seed */
static void prompt_make(prompt *p, int32_t nv, uint64_t prefix_seed, int32_t prefix_len,
                        uint64_t suffix_seed, int32_t suffix_len) {
    REQUIRE(prefix_len + suffix_len <= (int32_t)(sizeof p->ids / sizeof p->ids[0]));
    p->n = prefix_len + suffix_len;
    et_prompt(p->ids, prefix_len, prefix_seed, nv);
    et_prompt(p->ids + prefix_len, suffix_len, suffix_seed, nv);
}

static kiln_engine_params params_base(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 256;
    p.kv_tokens = 32 * 256;
    p.n_threads = 1;
    return p;
}

static kiln_engine *engine_new(const kiln_model *m, const kiln_engine_params *p) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    if (kiln_engine_create(m, p, &e, &err) != KILN_OK) {
        fprintf(stderr, "%s: engine create failed: %s\n", g_rel, err.message);
        exit(1);
    }
    return e;
}

static void job_init(et_job *j, const prompt *p, int32_t max_tokens, bool sampled, uint64_t seed,
                     et_result *res) {
    memset(j, 0, sizeof *j);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = p->ids;
    j->req.n_prompt_ids = p->n;
    j->req.max_tokens = max_tokens;
    j->req.ignore_eos = true;
    j->req.temperature = sampled ? 0.8f : 0.0f;
    j->req.top_p = sampled ? 0.9f : 1.0f;
    j->req.seed = seed;
    j->dbg.capture_logits = true;
    j->cancel_step = -1;
    j->res = res;
}

/* submit one request to e and read its stream to the end */
static void run_on(kiln_engine *e, int32_t nv, et_job *j) {
    kiln_stream *s = NULL;
    kiln_error err = {0};
    kiln_status st = kiln_engine_submit_debug(e, &j->req, &j->dbg, &s, &err);
    if (st != KILN_OK) {
        fprintf(stderr, "%s: submit failed: %s\n", g_rel, err.message);
        exit(1);
    }
    et_collect(s, j->res, nv);
    kiln_stream_destroy(s);
}

/* the reference: cache off, alone on a fresh engine */
static void reference(const kiln_model *m, const kiln_engine_params *base, const prompt *p,
                      int32_t max_tokens, bool sampled, uint64_t seed, et_result *out) {
    kiln_engine_params off = *base;
    off.no_prefix_cache = true;
    off.cache_dir = NULL;
    et_job j;
    job_init(&j, p, max_tokens, sampled, seed, out);
    kiln_engine *e = engine_new(m, &off);
    run_on(e, kiln_model_n_vocab(m), &j);
    kiln_engine_destroy(e);
    REQUIRE(out->finish == KILN_FINISH_LENGTH && out->n_tokens == max_tokens);
    REQUIRE(out->n_logit_rows == max_tokens);
}

/* tokens, finish reason and every captured logits row, bitwise */
static bool same_output(const char *what, int32_t nv, const et_result *ref, const et_result *got) {
    bool ok = true;
    if (got->finish != ref->finish) {
        fprintf(stderr, "%s: finish %s (%s), reference %s\n", what,
                kiln_finish_reason_name(got->finish), got->message,
                kiln_finish_reason_name(ref->finish));
        ok = false;
    }
    if (got->n_tokens != ref->n_tokens ||
        memcmp(got->tokens, ref->tokens, sizeof(int32_t) * (size_t)ref->n_tokens) != 0) {
        int32_t k = 0;
        while (k < got->n_tokens && k < ref->n_tokens && got->tokens[k] == ref->tokens[k]) k++;
        fprintf(stderr, "%s: %d tokens, reference %d, first difference at %d\n", what,
                got->n_tokens, ref->n_tokens, k);
        ok = false;
    }
    if (got->n_logit_rows != ref->n_logit_rows || !got->logits) {
        fprintf(stderr, "%s: %d logits rows, reference %d\n", what, got->n_logit_rows,
                ref->n_logit_rows);
        ok = false;
    } else {
        for (int32_t r = 0; r < ref->n_logit_rows; r++) {
            size_t off = (size_t)r * (size_t)nv;
            if (memcmp(got->logits + off, ref->logits + off, sizeof(float) * (size_t)nv)) {
                fprintf(stderr, "%s: logits row %d differs from the reference\n", what, r);
                ok = false;
                break;
            }
        }
    }
    CHECKF(ok, "%s: output is not bitwise the reference's", what);
    return ok;
}

static void pool_idle(const char *what, kiln_engine *e) {
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0 && st.kv_blocks_cached + st.kv_blocks_free == st.kv_blocks_total,
           "%s: pool not idle: used %d cached %d free %d total %d", what, st.kv_blocks_used,
           st.kv_blocks_cached, st.kv_blocks_free, st.kv_blocks_total);
}

/* ---- warnings (kiln_log_warn) are captured, counted and checked ----------------------- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_log_n;
static char g_log_lines[16][KILN_LOG_LINE_MAX];
static bool g_log_echo; /* also print them */

static void log_sink(void *user, const char *line) {
    (void)user;
    pthread_mutex_lock(&g_log_mu);
    snprintf(g_log_lines[g_log_n % 16], KILN_LOG_LINE_MAX, "%s", line);
    g_log_n++;
    if (g_log_echo) fprintf(stderr, "  [log] %s\n", line);
    pthread_mutex_unlock(&g_log_mu);
}

static void log_reset(void) {
    pthread_mutex_lock(&g_log_mu);
    g_log_n = 0;
    pthread_mutex_unlock(&g_log_mu);
}

/* lines logged since the last reset (the last 16) that hold every non-NULL needle */
static int log_count(const char *a, const char *b) {
    pthread_mutex_lock(&g_log_mu);
    int n = 0, lo = g_log_n > 16 ? g_log_n - 16 : 0;
    for (int i = lo; i < g_log_n; i++) {
        const char *l = g_log_lines[i % 16];
        if ((!a || strstr(l, a)) && (!b || strstr(l, b))) n++;
    }
    pthread_mutex_unlock(&g_log_mu);
    return n;
}

static int log_total(void) {
    pthread_mutex_lock(&g_log_mu);
    int n = g_log_n;
    pthread_mutex_unlock(&g_log_mu);
    return n;
}

/* ---- the cache directory as files ------------------------------------------------------ */

typedef struct dir_files {
    int n_kvb, n_tmp;
    char (*kvb)[PATH_MAX_];
    int64_t *size;
} dir_files;

static void files_free(dir_files *f) {
    free(f->kvb);
    free(f->size);
    memset(f, 0, sizeof *f);
}

static bool is_hex2(const char *s) {
    return strlen(s) == 2 && strchr("0123456789abcdef", s[0]) && strchr("0123456789abcdef", s[1]);
}

/* DIR/xy/<16 hex>.kvb files (regular) and DIR/xy/.tmp-* files */
static dir_files files_scan(const char *dir) {
    dir_files f = {0};
    int cap = 0;
    DIR *top = opendir(dir);
    if (!top) return f;
    struct dirent *de;
    while ((de = readdir(top))) {
        if (!is_hex2(de->d_name)) continue;
        char sub[400];
        snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
        DIR *d = opendir(sub);
        if (!d) continue;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            size_t len = strlen(fe->d_name);
            if (!strncmp(fe->d_name, ".tmp-", 5)) {
                f.n_tmp++;
                continue;
            }
            if (len != 20 || strcmp(fe->d_name + 16, ".kvb")) continue;
            char path[PATH_MAX_];
            snprintf(path, sizeof path, "%s/%s", sub, fe->d_name);
            struct stat sb;
            if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
            if (f.n_kvb == cap) {
                cap = cap ? 2 * cap : 64;
                f.kvb = realloc(f.kvb, sizeof *f.kvb * (size_t)cap);
                f.size = realloc(f.size, sizeof *f.size * (size_t)cap);
                REQUIRE(f.kvb && f.size);
            }
            snprintf(f.kvb[f.n_kvb], PATH_MAX_, "%s", path);
            f.size[f.n_kvb++] = (int64_t)sb.st_size;
        }
        closedir(d);
    }
    closedir(top);
    return f;
}

static uint8_t *file_read(const char *path, size_t *n) {
    *n = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return NULL;
    }
    uint8_t *buf = malloc((size_t)sb.st_size + 1);
    REQUIRE(buf);
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *n = got;
    return buf;
}

static void file_write(const char *path, const uint8_t *buf, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, buf, n) == (ssize_t)n);
    close(fd);
}

/* the block's token ids as the file's header holds them (false: not readable) */
static bool file_tokens(const char *path, int32_t tok[BS]) {
    uint8_t hdr[KILN_DISK_BLOCK_FIXED + 4 * BS];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    bool ok = pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr;
    close(fd);
    if (!ok || memcmp(hdr, KILN_DISK_BLOCK_MAGIC, 8) != 0) return false;
    for (int i = 0; i < BS; i++) {
        const uint8_t *b = hdr + KILN_DISK_BLOCK_FIXED + 4 * i;
        tok[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                           (uint32_t)b[3] << 24);
    }
    return true;
}

/* index in f of the file holding block `blk` of p (by its tokens), or -1; *n_match counts */
static int find_block(const dir_files *f, const prompt *p, int blk, int *n_match) {
    int found = -1, n = 0;
    for (int i = 0; i < f->n_kvb; i++) {
        int32_t tok[BS];
        if (file_tokens(f->kvb[i], tok) && !memcmp(tok, p->ids + blk * BS, sizeof tok)) {
            found = i;
            n++;
        }
    }
    if (n_match) *n_match = n;
    return found;
}

/* how many leading prompt blocks of p (of those a lookup covers) have a file in dir */
static int leading_on_disk(const char *dir, const prompt *p) {
    dir_files f = files_scan(dir);
    int lead = 0, limit = (p->n - 1) / BS;
    while (lead < limit && find_block(&f, p, lead, NULL) >= 0) lead++;
    files_free(&f);
    return lead;
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char path[PATH_MAX_];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_rf(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static const char *const dir_tags[] = {"corrupt", "other", "full", "kill", "load"};

static void fresh_dir(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/kiln-prefix-faults-%d-%s", (int)getpid(), tag);
    rm_rf(buf);
}

/* stats right after open: the index holds exactly the block files on disk */
static void check_index(const char *what, kiln_engine *e, const char *dir) {
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    dir_files f = files_scan(dir);
    CHECKF(st.disk_files == f.n_kvb, "%s: the tier indexes %lld files, the directory has %d", what,
           (long long)st.disk_files, f.n_kvb);
    CHECKF(f.n_tmp == 0, "%s: %d temporary files left after open", what, f.n_tmp);
    files_free(&f);
}

/* ---- case 1: corruption ---------------------------------------------------------------- */

/* A step hook that watches one path: a rejected file must be gone from the disk while the
 * request still runs (its rewrite comes only when the blocks go idle, at the finish). */
typedef struct watch {
    const char *path;
    int n_steps, n_absent;
} watch;

static void watch_hook(void *user, kiln_engine *e, int64_t step) {
    (void)e;
    (void)step;
    watch *w = user;
    w->n_steps++;
    if (w->path && access(w->path, F_OK) != 0) w->n_absent++;
}

enum { F_PAYLOAD, F_HEADER, F_TRUNCATE, F_SWAP, F_COUNT };
static const char *const fault_name[F_COUNT] = {"payload byte flipped", "header byte flipped",
                                                "truncated / extended", "contents swapped"};

/* header byte flipped in block i's file, and the reason the tier must give */
static const int hdr_off[N_PREFIX] = {0, 8, 12, 40, KILN_DISK_BLOCK_FIXED + 4 * 5};
static const char *const hdr_why[N_PREFIX] = {
    "bad magic", "version", "header of", "header checksum mismatch", "header checksum mismatch"};

static void case_corruption(void) {
    const double t0 = now_s();
    const kiln_engine_params base = params_base();
    prompt p[3];
    for (int k = 0; k < 3; k++)
        prompt_make(&p[k], g_nv, 1, PREFIX_LEN, 10 + (uint64_t)k, 7 + 3 * k);
    /* prompt 0 greedy fills the directory; then 1 greedy and 2 sampled alternate */
    static et_result ref[3], got;
    for (int k = 0; k < 3; k++)
        reference(g_m, &base, &p[k], MAX_TOK, k == 2, 77 + (uint64_t)k, &ref[k]);
    const int64_t header_bytes = kiln_disk_block_header_bytes(BS);

    for (int fault = 0; fault < F_COUNT; fault++) {
        char dir[256], what[512];
        fresh_dir(dir, sizeof dir, "corrupt");
        kiln_engine_params dp = base;
        dp.cache_dir = dir;
        {
            kiln_engine *e = engine_new(g_m, &dp);
            et_job j;
            job_init(&j, &p[0], MAX_TOK, false, 77, &got);
            run_on(e, g_nv, &j);
            snprintf(what, sizeof what, "%s corruption (%s): first engine", g_rel,
                     fault_name[fault]);
            same_output(what, g_nv, &ref[0], &got);
            et_result_free(&got);
            kiln_engine_destroy(e); /* flushes the writes */
        }
        /* the prefix's block files, by their tokens */
        dir_files f = files_scan(dir);
        char path[N_PREFIX][PATH_MAX_];
        uint8_t *orig[N_PREFIX], *bad_bytes[N_PREFIX];
        size_t orig_n[N_PREFIX], bad_n[N_PREFIX];
        bool bad[N_PREFIX];
        for (int i = 0; i < N_PREFIX; i++) {
            int n_match = 0, idx = find_block(&f, &p[0], i, &n_match);
            REQUIRE(idx >= 0 && n_match == 1);
            snprintf(path[i], PATH_MAX_, "%s", f.kvb[idx]);
            orig[i] = file_read(path[i], &orig_n[i]);
            REQUIRE(orig[i] && (int64_t)orig_n[i] > header_bytes);
        }
        files_free(&f);
        /* damage them */
        for (int i = 0; i < N_PREFIX; i++) {
            bad[i] = true;
            bad_n[i] = orig_n[i];
            bad_bytes[i] = malloc(orig_n[i] + 64);
            REQUIRE(bad_bytes[i]);
            memcpy(bad_bytes[i], orig[i], orig_n[i]);
            if (fault == F_PAYLOAD) {
                bad_bytes[i][header_bytes + (orig_n[i] - (size_t)header_bytes) / 2] ^= 0x10;
            } else if (fault == F_HEADER) {
                bad_bytes[i][hdr_off[i]] ^= 0xff;
            } else if (fault == F_TRUNCATE) {
                /* a byte short, cut in the payload, in the header, empty, a byte too long */
                const size_t size[N_PREFIX] = {orig_n[i] - 1, orig_n[i] - 4096, 100, 0,
                                               orig_n[i] + 1};
                bad_n[i] = size[i];
                bad_bytes[i][orig_n[i]] = 0; /* the extra byte of the last one */
            } else if (fault == F_SWAP) {
                bad[i] = i == 1 || i == 3;
            }
        }
        if (fault == F_SWAP) { /* blocks 1 and 3 exchange contents by renames */
            char tmp[PATH_MAX_ + 8];
            snprintf(tmp, sizeof tmp, "%s.swap", path[1]);
            REQUIRE(rename(path[1], tmp) == 0 && rename(path[3], path[1]) == 0 &&
                    rename(tmp, path[3]) == 0);
            memcpy(bad_bytes[1], orig[3], orig_n[1]);
            memcpy(bad_bytes[3], orig[1], orig_n[3]);
            REQUIRE(orig_n[1] == orig_n[3]);
        } else {
            for (int i = 0; i < N_PREFIX; i++) file_write(path[i], bad_bytes[i], bad_n[i]);
        }

        /* engines one after another: each gets the blocks before the first bad one */
        for (int step = 0;; step++) {
            REQUIRE(step <= N_PREFIX + 1);
            int lead = 0;
            while (lead < N_PREFIX && !bad[lead]) lead++;
            const bool read_bad = lead < N_PREFIX && fault != F_TRUNCATE; /* a size no block
                                     of this tier has is not even looked at: never read */
            const int k = 1 + step % 2;
            log_reset();
            watch w = {.path = read_bad ? path[lead] : NULL};
            kiln_engine_debug dbg = {.on_step = watch_hook, .user = &w};
            kiln_engine *e = NULL;
            kiln_error err = {0};
            REQUIRE(kiln_engine_create_debug(g_m, &dp, &dbg, &e, &err) == KILN_OK);
            snprintf(what, sizeof what, "%s corruption (%s): engine %d, prompt %d", g_rel,
                     fault_name[fault], step + 2, k);
            check_index(what, e, dir);
            et_job j;
            job_init(&j, &p[k], MAX_TOK, k == 2, 77 + (uint64_t)k, &got);
            run_on(e, g_nv, &j);
            same_output(what, g_nv, &ref[k], &got);
            kiln_engine_stats st;
            kiln_engine_get_stats(e, &st);
            CHECKF(got.usage.cached_tokens == lead * BS && got.usage.prompt_tokens == p[k].n,
                   "%s: cached_tokens %d (prompt %d), expected %d", what, got.usage.cached_tokens,
                   got.usage.prompt_tokens, lead * BS);
            CHECKF(st.disk_reads == lead && st.disk_corrupt == (read_bad ? 1 : 0),
                   "%s: %lld disk reads, %lld corrupt; expected %d and %d", what,
                   (long long)st.disk_reads, (long long)st.disk_corrupt, lead, read_bad ? 1 : 0);
            CHECKF(st.prefix_hit_requests == (lead > 0 ? 1 : 0), "%s: %lld prefix hits", what,
                   (long long)st.prefix_hit_requests);
            /* the rejected file is named with its reason in one warning */
            if (read_bad) {
                const char *why = fault == F_PAYLOAD  ? "payload checksum mismatch"
                                  : fault == F_HEADER ? hdr_why[lead]
                                                      : "holds block";
                CHECKF(log_count(path[lead], why) == 1 && log_count("removed", NULL) == 1,
                       "%s: expected one warning naming %s with \"%s\" (%d lines logged)", what,
                       path[lead], why, log_total());
            } else {
                CHECKF(log_total() == 0, "%s: %d unexpected warnings", what, log_total());
            }
            et_result_free(&got);
            pool_idle(what, e);
            kiln_engine_destroy(e);
            if (read_bad)
                CHECKF(w.n_absent > 0, "%s: the rejected file %s was never gone (%d steps)", what,
                       path[lead], w.n_steps);
            if (lead == N_PREFIX) break;
            /* the engine removed the bad file it read (or ignored the wrongly sized ones) and
             * wrote its own computation of the block(s) back: byte for byte what the first
             * engine wrote; the files it never read are untouched */
            if (fault == F_TRUNCATE)
                for (int i = 0; i < N_PREFIX; i++) bad[i] = false;
            else
                bad[lead] = false;
            for (int i = 0; i < N_PREFIX; i++) {
                size_t n = 0;
                uint8_t *now = file_read(path[i], &n);
                const uint8_t *want = bad[i] ? bad_bytes[i] : orig[i];
                size_t want_n = bad[i] ? bad_n[i] : orig_n[i];
                CHECKF(now && n == want_n && !memcmp(now, want, n),
                       "%s: block %d's file (%s) is not the %s bytes after the run", what, i,
                       path[i], bad[i] ? "damaged" : "original");
                free(now);
            }
        }
        for (int i = 0; i < N_PREFIX; i++) {
            free(orig[i]);
            free(bad_bytes[i]);
        }
        rm_rf(dir);
    }
    for (int k = 0; k < 3; k++) et_result_free(&ref[k]);
    printf("case 1 (corruption): %.2f s\n", now_s() - t0);
}

/* ---- case 2: another model on the directory ------------------------------------------- */

static void case_other_model(const char *other_rel) {
    const double t0 = now_s();
    if (access(kiln_test_shared(other_rel), R_OK) != 0) {
        printf("SKIP other-model case: %s is missing\n", other_rel);
        return;
    }
    kiln_model *m2 = et_load_opt(other_rel, true);
    const int32_t nv2 = kiln_model_n_vocab(m2);
    const kiln_engine_params base = params_base();
    prompt a[2], b[2];
    for (int k = 0; k < 2; k++) {
        prompt_make(&a[k], g_nv, 3, PREFIX_LEN, 30 + (uint64_t)k, 6 + 4 * k);
        /* the same seeds: with the same vocabulary, the very same token ids */
        prompt_make(&b[k], nv2, 3, PREFIX_LEN, 30 + (uint64_t)k, 6 + 4 * k);
    }
    static et_result ra[2], rb[2], got;
    for (int k = 0; k < 2; k++) {
        reference(g_m, &base, &a[k], MAX_TOK, k == 1, 5, &ra[k]);
        reference(m2, &base, &b[k], MAX_TOK, k == 1, 5, &rb[k]);
    }
    char dir[256], what[512];
    fresh_dir(dir, sizeof dir, "other");
    kiln_engine_params dp = base;
    dp.cache_dir = dir;
    et_job j;
    kiln_engine_stats st;

    /* the first model fills the directory */
    kiln_engine *e = engine_new(g_m, &dp);
    job_init(&j, &a[0], MAX_TOK, false, 5, &got);
    run_on(e, g_nv, &j);
    snprintf(what, sizeof what, "%s then %s: %s fills the directory", g_rel, other_rel, g_rel);
    same_output(what, g_nv, &ra[0], &got);
    et_result_free(&got);
    kiln_engine_destroy(e);
    dir_files f1 = files_scan(dir);
    REQUIRE(f1.n_kvb >= N_PREFIX);

    /* the other model: its namespace never matches, nothing is read, nothing breaks */
    log_reset();
    e = engine_new(m2, &dp);
    snprintf(what, sizeof what, "%s on %s's directory", other_rel, g_rel);
    check_index(what, e, dir);
    job_init(&j, &b[0], MAX_TOK, false, 5, &got);
    run_on(e, nv2, &j);
    same_output(what, nv2, &rb[0], &got);
    kiln_engine_get_stats(e, &st);
    CHECKF(got.usage.cached_tokens == 0 && st.disk_reads == 0 && st.disk_corrupt == 0 &&
               st.prefix_hit_requests == 0,
           "%s: cached_tokens %d, %lld disk reads, %lld corrupt, %lld hits", what,
           got.usage.cached_tokens, (long long)st.disk_reads, (long long)st.disk_corrupt,
           (long long)st.prefix_hit_requests);
    CHECKF(log_total() == 0, "%s: %d warnings", what, log_total());
    et_result_free(&got);
    kiln_engine_destroy(e);

    /* both models' files are there now; the first model's are untouched */
    dir_files f2 = files_scan(dir);
    CHECKF(f2.n_kvb > f1.n_kvb, "%s: %d files before, %d after", what, f1.n_kvb, f2.n_kvb);
    for (int i = 0; i < f1.n_kvb; i++) {
        bool kept = false;
        for (int k = 0; k < f2.n_kvb; k++) kept |= !strcmp(f1.kvb[i], f2.kvb[k]);
        CHECKF(kept, "%s: %s's file %s is gone", what, g_rel, f1.kvb[i]);
    }
    /* each model then hits its own files */
    const kiln_model *ms[2] = {g_m, m2};
    const prompt *ps[2] = {&a[1], &b[1]};
    const et_result *rs[2] = {&ra[1], &rb[1]};
    for (int w = 0; w < 2; w++) {
        e = engine_new(ms[w], &dp);
        job_init(&j, ps[w], MAX_TOK, true, 5, &got);
        run_on(e, kiln_model_n_vocab(ms[w]), &j);
        snprintf(what, sizeof what, "%s after %s: %s from disk", g_rel, other_rel,
                 w ? other_rel : g_rel);
        same_output(what, kiln_model_n_vocab(ms[w]), rs[w], &got);
        kiln_engine_get_stats(e, &st);
        CHECKF(got.usage.cached_tokens == PREFIX_LEN && st.disk_reads == N_PREFIX &&
                   st.disk_corrupt == 0,
               "%s: cached_tokens %d, %lld disk reads, %lld corrupt", what, got.usage.cached_tokens,
               (long long)st.disk_reads, (long long)st.disk_corrupt);
        et_result_free(&got);
        kiln_engine_destroy(e);
    }

    /* a forgery: the first model's block 0 put under the name the other model looks up
     * (found by its tokens among the files the other model wrote). With the same geometry
     * (file size) it is read and rejected as another model's; with another size it is never
     * read, and the other model's own write replaces it. The tier's unit test
     * (tests/kv/test_disk_tier.c) checks the rejection at file level either way. */
    dir_files f3 = files_scan(dir);
    int ia = -1, ib = -1; /* the first model's block 0, the other's */
    for (int i = 0; i < f3.n_kvb; i++) {
        bool first = false;
        for (int k = 0; k < f1.n_kvb; k++) first |= !strcmp(f1.kvb[k], f3.kvb[i]);
        int32_t tok[BS];
        if (!file_tokens(f3.kvb[i], tok)) continue;
        if (first && !memcmp(tok, a[0].ids, sizeof tok)) ia = i;
        if (!first && !memcmp(tok, b[0].ids, sizeof tok)) ib = i;
    }
    REQUIRE(ia >= 0 && ib >= 0);
    size_t na = 0, nb = 0;
    uint8_t *fa = file_read(f3.kvb[ia], &na), *fb = file_read(f3.kvb[ib], &nb);
    REQUIRE(fa && fb);
    const bool same_size = na == nb;
    file_write(f3.kvb[ib], fa, na);
    log_reset();
    e = engine_new(m2, &dp);
    job_init(&j, &b[1], MAX_TOK, true, 5, &got);
    run_on(e, nv2, &j);
    snprintf(what, sizeof what, "%s: a file of %s forged under its block 0's name (%s size)",
             other_rel, g_rel, same_size ? "same" : "other");
    same_output(what, nv2, &rb[1], &got);
    kiln_engine_get_stats(e, &st);
    CHECKF(got.usage.cached_tokens == 0 && st.disk_reads == 0 &&
               st.disk_corrupt == (same_size ? 1 : 0),
           "%s: cached_tokens %d, %lld disk reads, %lld corrupt", what, got.usage.cached_tokens,
           (long long)st.disk_reads, (long long)st.disk_corrupt);
    if (same_size)
        CHECKF(log_count(f3.kvb[ib], "another model") == 1, "%s: no \"another model\" warning",
               what);
    et_result_free(&got);
    kiln_engine_destroy(e);
    /* the other model rewrote its block 0 */
    size_t nn = 0;
    uint8_t *now = file_read(f3.kvb[ib], &nn);
    CHECKF(now && nn == nb && !memcmp(now, fb, nb), "%s: block 0's file was not rewritten", what);
    free(now);
    free(fa);
    free(fb);
    files_free(&f1);
    files_free(&f2);
    files_free(&f3);
    for (int k = 0; k < 2; k++) {
        et_result_free(&ra[k]);
        et_result_free(&rb[k]);
    }
    rm_rf(dir);
    kiln_model_free(m2);
    printf("case 2 (another model: %s): %.2f s\n", other_rel, now_s() - t0);
}

/* ---- case 3: a full disk ---------------------------------------------------------------- */

static char g_mounted[256];

/* also after a failed REQUIRE: no mount and no directory is left behind */
static void cleanup_at_exit(void) {
    if (g_mounted[0]) {
        umount2(g_mounted, MNT_DETACH);
        g_mounted[0] = '\0';
    }
    for (size_t i = 0; i < sizeof dir_tags / sizeof dir_tags[0]; i++) {
        char dir[256];
        fresh_dir(dir, sizeof dir, dir_tags[i]);
    }
}

#define N_FULL 24

static void case_disk_full(void) {
    const double t0 = now_s();
    char dir[256], what[512];
    fresh_dir(dir, sizeof dir, "full");
    REQUIRE(mkdir(dir, 0755) == 0);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=192k") != 0) {
        printf("SKIP disk-full case: cannot mount tmpfs (%s)\n", strerror(errno));
        rmdir(dir);
        return;
    }
    snprintf(g_mounted, sizeof g_mounted, "%s", dir);
    const kiln_engine_params base = params_base();
    kiln_engine_params dp = base;
    dp.cache_dir = dir;
    static prompt p[N_FULL];
    static et_result ref[N_FULL], got;
    for (int k = 0; k < N_FULL; k++) {
        prompt_make(&p[k], g_nv, 100 + (uint64_t)k, PREFIX_LEN, 500 + (uint64_t)k, 7);
        reference(g_m, &base, &p[k], MAX_TOK, k % 3 == 1, 9 + (uint64_t)k, &ref[k]);
    }
    /* one engine serves them all while its writes run the disk full */
    log_reset();
    kiln_engine *e = engine_new(g_m, &dp);
    for (int k = 0; k < N_FULL; k++) {
        et_job j;
        job_init(&j, &p[k], MAX_TOK, k % 3 == 1, 9 + (uint64_t)k, &got);
        run_on(e, g_nv, &j);
        snprintf(what, sizeof what, "%s disk full: prompt %d", g_rel, k);
        same_output(what, g_nv, &ref[k], &got);
        CHECKF(got.usage.cached_tokens == 0, "%s: cached_tokens %d", what, got.usage.cached_tokens);
        et_result_free(&got);
    }
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    pool_idle("disk full", e);
    kiln_engine_destroy(e);
    dir_files f = files_scan(dir);
    /* 24 prompts of 6 full blocks each: far more than 192 KiB holds */
    CHECKF(st.disk_writes >= 1 && st.disk_writes < N_FULL * N_PREFIX && f.n_kvb >= 1 &&
               f.n_kvb * (int64_t)f.size[0] <= 192 * 1024,
           "disk full: %lld writes, %d files", (long long)st.disk_writes, f.n_kvb);
    CHECKF(log_count("is full", NULL) >= 1, "disk full: no \"is full\" warning (%d lines)",
           log_total());
    CHECKF(f.n_tmp == 0, "disk full: %d temporary files left by the engine", f.n_tmp);
    for (int i = 0; i < f.n_kvb; i++)
        CHECKF(f.size[i] == f.size[0], "disk full: %s has %lld bytes, %s %lld: a torn file",
               f.kvb[i], (long long)f.size[i], f.kvb[0], (long long)f.size[0]);
    printf("disk full: %lld block files written (%d on disk, %lld bytes each), then the disk "
           "was full\n",
           (long long)st.disk_writes, f.n_kvb, f.n_kvb ? (long long)f.size[0] : 0ll);
    files_free(&f);

    /* a restart on the full disk: every file present verifies; prompts whose blocks made it
     * hit exactly those, the others compute; everything is still the reference */
    int lead[N_FULL];
    printf("disk full: leading blocks on disk per prompt:");
    for (int k = 0; k < N_FULL; k++) printf(" %d", lead[k] = leading_on_disk(dir, &p[k]));
    printf("\n");
    log_reset();
    e = engine_new(g_m, &dp);
    check_index("disk full, restarted", e, dir);
    int64_t want_reads = 0;
    int n_hit = 0;
    for (int k = 0; k < N_FULL; k++) {
        if (!(k < 4 || lead[k] > 0 || k == N_FULL - 1)) continue;
        et_job j;
        job_init(&j, &p[k], MAX_TOK, k % 3 == 1, 9 + (uint64_t)k, &got);
        run_on(e, g_nv, &j);
        snprintf(what, sizeof what, "%s disk full, restarted: prompt %d", g_rel, k);
        same_output(what, g_nv, &ref[k], &got);
        CHECKF(got.usage.cached_tokens == lead[k] * BS, "%s: cached_tokens %d, %d blocks on disk",
               what, got.usage.cached_tokens, lead[k]);
        want_reads += lead[k];
        n_hit += lead[k] > 0;
        et_result_free(&got);
    }
    kiln_engine_get_stats(e, &st);
    CHECKF(n_hit >= 1, "disk full: no prompt's first block made it to disk");
    CHECKF(st.disk_reads == want_reads && st.disk_corrupt == 0,
           "disk full, restarted: %lld reads (expected %lld), %lld corrupt",
           (long long)st.disk_reads, (long long)want_reads, (long long)st.disk_corrupt);
    pool_idle("disk full, restarted", e);
    kiln_engine_destroy(e);
    f = files_scan(dir);
    CHECKF(f.n_tmp == 0, "disk full, restarted: %d temporary files", f.n_tmp);
    files_free(&f);
    for (int k = 0; k < N_FULL; k++) et_result_free(&ref[k]);
    CHECK(umount2(dir, MNT_DETACH) == 0);
    g_mounted[0] = '\0';
    rm_rf(dir);
    printf("case 3 (disk full): %d prompts hit after the restart, %.2f s\n", n_hit, now_s() - t0);
}

/* ---- case 4: kill -9 while writing ---------------------------------------------------- */

#define N_KILL_PREFIX 4
#define N_KILL_ROUNDS 6

static void kill_prompt(prompt *p, int q, uint64_t j, int32_t suffix_len) {
    prompt_make(p, g_nv, 200 + (uint64_t)q, PREFIX_LEN, 1000 + j, suffix_len);
}

/* the child: one engine on dir, distinct requests (one of the shared prefixes, then a long
 * suffix of its own: several new blocks to write each) until killed */
static void child_main(const char *dir, int round) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    kiln_engine_params p = params_base();
    p.cache_dir = dir;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    if (kiln_engine_create(g_m, &p, &e, &err) != KILN_OK) _exit(3); /* the lock, say */
    static et_result r;
    for (uint64_t j = (uint64_t)round * 100000;; j++) {
        prompt pr;
        kill_prompt(&pr, (int)(j % N_KILL_PREFIX), j, 20 + (int32_t)(j % 60));
        et_job job;
        job_init(&job, &pr, 8, j % 2, j, &r);
        kiln_stream *s = NULL;
        if (kiln_engine_submit_debug(e, &job.req, &job.dbg, &s, &err) != KILN_OK) _exit(4);
        et_collect(s, &r, g_nv);
        kiln_stream_destroy(s);
        et_result_free(&r);
        if (r.finish != KILN_FINISH_LENGTH) _exit(5);
        if (j >= (uint64_t)round * 100000 + 50000) _exit(6); /* should have been killed */
    }
}

static int count_tasks(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static int count_kvb(const char *dir) {
    dir_files f = files_scan(dir);
    int n = f.n_kvb;
    files_free(&f);
    return n;
}

/* Rounds: a child process opens the directory (the lock of the one killed before must be
 * free: else it exits 3) and writes; once it has written a few more files it is killed at a
 * moment that varies by round. Then this process opens the directory. */
static void case_kill9(void) {
    const double t0 = now_s();
    char dir[256], what[512];
    fresh_dir(dir, sizeof dir, "kill");
    /* fork from a single-threaded process: no engine has been created yet */
    CHECKF(count_tasks() == 1, "kill -9: %d threads before fork", count_tasks());
    int n_tmp_seen = 0, n_files = 0;
    pid_t last_pid = 0;
    for (int round = 0; round < N_KILL_ROUNDS; round++) {
        const int want = round == 0 ? 4 * N_PREFIX : count_kvb(dir) + 6;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) child_main(dir, round);
        last_pid = pid;
        const double deadline = now_s() + 10.0;
        int wst = 0;
        bool exited = false;
        while (now_s() < deadline && (n_files = count_kvb(dir)) < want) {
            if (waitpid(pid, &wst, WNOHANG) == pid) {
                exited = true;
                break;
            }
            usleep(1000);
        }
        if (!exited && round == N_KILL_ROUNDS - 1) {
            /* while the child lives, the directory is its own (the last round: no fork
             * follows this engine attempt) */
            kiln_engine_params lp = params_base();
            lp.cache_dir = dir;
            kiln_engine *e = NULL;
            kiln_error err = {0};
            kiln_status cs = kiln_engine_create(g_m, &lp, &e, &err);
            CHECKF(cs == KILN_ERR_IO && strstr(err.message, "in use by another kiln process"),
                   "kill -9: an engine on a live child's directory: %s (%s)", kiln_status_name(cs),
                   err.message);
            kiln_engine_destroy(e);
        }
        if (!exited) {
            usleep((useconds_t)((round * 1777) % 4000)); /* somewhere in its stream */
            kill(pid, SIGKILL);
            REQUIRE(waitpid(pid, &wst, 0) == pid);
        }
        CHECKF(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
               "kill -9, round %d: the child did not run until killed (%s %d)", round,
               WIFEXITED(wst) ? "exit status" : "signal",
               WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
        CHECKF(n_files >= want, "kill -9, round %d: %d block files after 10 s, waited for %d",
               round, n_files, want);
        dir_files f = files_scan(dir);
        n_tmp_seen += f.n_tmp;
        /* a rename puts every block file in place whole: all have one size */
        for (int i = 0; i < f.n_kvb; i++)
            CHECKF(f.size[i] == f.size[0], "kill -9: %s has %lld bytes, %s %lld", f.kvb[i],
                   (long long)f.size[i], f.kvb[0], (long long)f.size[0]);
        files_free(&f);
    }
    dir_files f = files_scan(dir);
    REQUIRE(f.n_kvb >= 1);
    printf("kill -9: %d rounds, %d block files, %d temporary files seen at the kills\n",
           N_KILL_ROUNDS, f.n_kvb, n_tmp_seen);
    /* a temporary file such as a killed writer leaves, for certain */
    char sub[PATH_MAX_], tmp[PATH_MAX_ + 32];
    snprintf(sub, sizeof sub, "%s", f.kvb[0]);
    *strrchr(sub, '/') = '\0';
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-7", sub, (int)last_pid);
    file_write(tmp, (const uint8_t *)"torn", 4);
    files_free(&f);

    const kiln_engine_params base = params_base();
    prompt p[N_KILL_PREFIX];
    int lead[N_KILL_PREFIX];
    static et_result ref[N_KILL_PREFIX], got;
    for (int q = 0; q < N_KILL_PREFIX; q++) {
        kill_prompt(&p[q], q, 90000 + (uint64_t)q, 9); /* a suffix the child never ran */
        lead[q] = leading_on_disk(dir, &p[q]);
        reference(g_m, &base, &p[q], MAX_TOK, q % 2, 31, &ref[q]);
    }
    kiln_engine_params dp = base;
    dp.cache_dir = dir;
    kiln_engine *e = NULL;
    kiln_error err = {0};
    kiln_status cs = kiln_engine_create(g_m, &dp, &e, &err);
    CHECKF(cs == KILN_OK, "kill -9: engine on the dead child's directory: %s", err.message);
    if (cs != KILN_OK) {
        rm_rf(dir);
        return;
    }
    check_index("kill -9: after open", e, dir);
    CHECKF(access(tmp, F_OK) != 0, "kill -9: %s is still there after open", tmp);
    int n_hit = 0;
    for (int q = 0; q < N_KILL_PREFIX; q++) {
        et_job j;
        job_init(&j, &p[q], MAX_TOK, q % 2, 31, &got);
        run_on(e, g_nv, &j);
        snprintf(what, sizeof what, "%s after kill -9: prefix %d", g_rel, q);
        same_output(what, g_nv, &ref[q], &got);
        CHECKF(got.usage.cached_tokens == lead[q] * BS, "%s: cached_tokens %d, %d blocks on disk",
               what, got.usage.cached_tokens, lead[q]);
        n_hit += lead[q] == N_PREFIX;
        et_result_free(&got);
    }
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    CHECKF(st.disk_corrupt == 0, "kill -9: %lld corrupt files", (long long)st.disk_corrupt);
    CHECKF(n_hit >= 1, "kill -9: no prefix wholly on disk");
    pool_idle("kill -9", e);
    kiln_engine_destroy(e);
    for (int q = 0; q < N_KILL_PREFIX; q++) et_result_free(&ref[q]);
    rm_rf(dir);
    printf("case 4 (kill -9): %d of %d prefixes whole on disk (%d temporary files seen at the "
           "kill), %.2f s\n",
           n_hit, N_KILL_PREFIX, n_tmp_seen, now_s() - t0);
}

/* ---- case 5: 64 clients on one small pool --------------------------------------------- */

#define N_CLIENTS 64
#define LOAD_TOK  24

typedef struct client {
    kiln_engine *e;
    pthread_barrier_t *bar;
    et_job job;
    et_result *res;
    kiln_status st;
    char msg[1024];
} client;

static void *client_main(void *arg) {
    client *c = arg;
    pthread_barrier_wait(c->bar);
    kiln_stream *s = NULL;
    kiln_error err = {0};
    c->st = kiln_engine_submit_debug(c->e, &c->job.req, &c->job.dbg, &s, &err);
    if (c->st != KILN_OK) {
        snprintf(c->msg, sizeof c->msg, "%s", err.message);
        return NULL;
    }
    et_collect(s, c->res, g_nv);
    kiln_stream_destroy(s);
    return NULL;
}

static void case_64_clients(void) {
    const double t0 = now_s();
    kiln_engine_params base = params_base();
    base.n_ctx = 128;
    base.kv_tokens = BS * 40; /* 40 blocks; the 64 requests want about 5 each */
    static prompt p[N_CLIENTS];
    et_result *ref = calloc(N_CLIENTS, sizeof *ref), *got = calloc(N_CLIENTS, sizeof *got);
    REQUIRE(ref && got);
    for (int i = 0; i < N_CLIENTS; i++) {
        prompt_make(&p[i], g_nv, 300 + (uint64_t)(i % 4), 48, 700 + (uint64_t)i, 5 + (i * 7) % 16);
        reference(g_m, &base, &p[i], LOAD_TOK, i % 3 == 0, 4000 + (uint64_t)i, &ref[i]);
    }
    char dir[256];
    fresh_dir(dir, sizeof dir, "load");
    /* RAM only; then the disk tier; then a restart on that directory */
    for (int round = 0; round < 3; round++) {
        const char *name = round == 0 ? "RAM" : round == 1 ? "disk" : "disk after a restart";
        kiln_engine_params ep = base;
        if (round) ep.cache_dir = dir;
        kiln_engine *e = engine_new(g_m, &ep);
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, N_CLIENTS);
        static client c[N_CLIENTS];
        pthread_t th[N_CLIENTS];
        for (int i = 0; i < N_CLIENTS; i++) {
            c[i] = (client){.e = e, .bar = &bar, .res = &got[i]};
            job_init(&c[i].job, &p[i], LOAD_TOK, i % 3 == 0, 4000 + (uint64_t)i, &got[i]);
            REQUIRE(pthread_create(&th[i], NULL, client_main, &c[i]) == 0);
        }
        for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        int n_ok = 0;
        for (int i = 0; i < N_CLIENTS; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s 64 clients (%s): client %d", g_rel, name, i);
            CHECKF(c[i].st == KILN_OK, "%s: submit: %s", what, c[i].msg);
            if (c[i].st != KILN_OK) continue;
            n_ok +=
                got[i].finish == KILN_FINISH_LENGTH && same_output(what, g_nv, &ref[i], &got[i]);
            et_result_free(&got[i]);
        }
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        char what[256];
        snprintf(what, sizeof what, "%s 64 clients (%s)", g_rel, name);
        pool_idle(what, e);
        CHECKF(n_ok == N_CLIENTS, "%s: %d of %d requests finished as their reference", what, n_ok,
               N_CLIENTS);
        CHECKF(st.n_requests_finished == N_CLIENTS, "%s: %lld requests finished", what,
               (long long)st.n_requests_finished);
        CHECKF(st.prefix_hit_requests > 0, "%s: no prefix hit", what);
        CHECKF(st.disk_corrupt == 0, "%s: %lld corrupt files", what, (long long)st.disk_corrupt);
        if (round == 2) CHECKF(st.disk_reads > 0, "%s: nothing read from disk", what);
        printf("64 clients (%s): %lld preemptions, %lld prefix hits (%lld tokens), %lld disk "
               "reads, %lld writes, peak %d of %d blocks\n",
               name, (long long)st.preemptions, (long long)st.prefix_hit_requests,
               (long long)st.prefix_hit_tokens, (long long)st.disk_reads, (long long)st.disk_writes,
               st.kv_blocks_peak, st.kv_blocks_total);
        kiln_engine_destroy(e);
    }
    rm_rf(dir);
    for (int i = 0; i < N_CLIENTS; i++) et_result_free(&ref[i]);
    free(ref);
    free(got);
    printf("case 5 (64 clients): %.2f s\n", now_s() - t0);
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    g_rel = argv[1];
    const char *other = argc >= 3                   ? argv[2]
                        : strstr(g_rel, "llama2xs") ? "models/stories260K/stories260K-f32.gguf"
                                                    : "models/llama2xs-260K/llama2xs-f32.gguf";
    g_m = et_load_opt(g_rel, true);
    g_nv = kiln_model_n_vocab(g_m);
    REQUIRE(kiln_model_seq_state_floats(g_m) == 0); /* the checks assume attention-only KV */
    kiln_log_set_sink(log_sink, NULL);
    g_log_echo = getenv("KILN_TEST_ECHO_LOG") != NULL;
    atexit(cleanup_at_exit);
    const double t0 = now_s();

    case_kill9(); /* first: it forks, and no engine thread exists yet */
    case_corruption();
    case_other_model(other);
    case_disk_full();
    case_64_clients();

    kiln_log_set_sink(NULL, NULL);
    kiln_model_free(g_m);
    printf("total %.2f s\n", now_s() - t0);
    return kiln_test_finish("test_engine_prefix_faults");
}
