/*
 * disk_tier.c - the prefix cache's disk tier (see disk_tier.h).
 *
 * Index: an array of entries (one per block file, or per queued put) found through an
 * open-addressing table on the hash (linear probing, backward-shift deletion, grown at half
 * load), and a doubly linked LRU list of the entries on disk, least recent first. An entry is
 * QUEUED from put until its file is renamed into place, then DISK; every DISK entry carries a
 * generation, so a reader that dropped the mutex during its I/O only removes or touches the
 * file it actually read.
 *
 * Who unlinks what: block files are created only by the I/O thread, so its own unlinks
 * (evictions) need no lock around the syscall; an unlink on another thread (a corrupt file
 * found by kiln_disk_tier_read, kiln_disk_tier_remove) happens under the mutex, after the
 * entry is dropped, so it can never remove a newer file written for the same hash.
 */
#include "kv/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kv/turboquant.h"
#include "tensor/dtype.h"
#include "util/error.h"
#include "util/log.h"

#define DEFAULT_MAX_BYTES   (16ll << 30)
#define DEFAULT_QUEUE_BYTES (256ll << 20)
#define DEFAULT_RETRY_MS    5000
#define PATH_CAP            4096
#define TMP_PREFIX          ".tmp-"

/* ---- the file format ------------------------------------------------------------------- */

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_HEADER_BYTES = 12,
    OFF_FINGERPRINT = 16,
    OFF_NS = 24,
    OFF_HASH = 32,
    OFF_PARENT = 40,
    OFF_KV_DIM = 48,
    OFF_KV_BYTES = 56,
    OFF_STATE_BYTES = 64,
    OFF_KV_SUM = 72,
    OFF_STATE_SUM = 80,
    OFF_PAGE_FORMAT = 88,
    OFF_N_LAYER = 92,
    OFF_BLOCK_SIZE = 96,
    OFF_FLAGS = 100,
    OFF_TOKENS = KILN_DISK_BLOCK_FIXED,
};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int64_t kiln_disk_block_header_bytes(int32_t block_size) {
    if (block_size < 1 || block_size > KILN_DISK_BLOCK_MAX_TOKENS) return 0;
    return KILN_DISK_BLOCK_FIXED + 4 * (int64_t)block_size + 8;
}

static bool desc_valid(const kiln_disk_block_desc *d) {
    return d && d->tokens && kiln_disk_block_header_bytes(d->block_size) > 0 && d->kv_bytes > 0 &&
           d->state_bytes >= 0 && d->n_layer >= 1 && d->kv_dim >= 1;
}

size_t kiln_disk_block_encode_header(const kiln_disk_block_desc *d, const void *kv,
                                     const void *state, uint8_t *hdr, size_t hdr_cap) {
    if (!desc_valid(d) || !kv || !hdr) return 0;
    size_t h = (size_t)kiln_disk_block_header_bytes(d->block_size);
    if (hdr_cap < h) return 0;
    bool with_state = state && d->state_bytes > 0;
    memset(hdr, 0, h);
    memcpy(hdr + OFF_MAGIC, KILN_DISK_BLOCK_MAGIC, 8); /* 7 letters and the NUL */
    put_u32(hdr + OFF_VERSION, KILN_DISK_BLOCK_VERSION);
    put_u32(hdr + OFF_HEADER_BYTES, (uint32_t)h);
    put_u64(hdr + OFF_FINGERPRINT, d->fingerprint);
    put_u64(hdr + OFF_NS, d->ns);
    put_u64(hdr + OFF_HASH, d->hash);
    put_u64(hdr + OFF_PARENT, d->parent);
    put_u64(hdr + OFF_KV_DIM, (uint64_t)d->kv_dim);
    put_u64(hdr + OFF_KV_BYTES, (uint64_t)d->kv_bytes);
    put_u64(hdr + OFF_STATE_BYTES, with_state ? (uint64_t)d->state_bytes : 0);
    put_u64(hdr + OFF_KV_SUM, XXH3_64bits(kv, (size_t)d->kv_bytes));
    put_u64(hdr + OFF_STATE_SUM, with_state ? XXH3_64bits(state, (size_t)d->state_bytes) : 0);
    put_u32(hdr + OFF_PAGE_FORMAT, (uint32_t)d->page_format);
    put_u32(hdr + OFF_N_LAYER, (uint32_t)d->n_layer);
    put_u32(hdr + OFF_BLOCK_SIZE, (uint32_t)d->block_size);
    put_u32(hdr + OFF_FLAGS, with_state ? KILN_DISK_BLOCK_FLAG_STATE : 0);
    for (int32_t i = 0; i < d->block_size; i++)
        put_u32(hdr + OFF_TOKENS + 4 * (size_t)i, (uint32_t)d->tokens[i]);
    put_u64(hdr + h - 8, XXH3_64bits(hdr, h - 8));
    return h;
}

size_t kiln_disk_block_encode(const kiln_disk_block_desc *d, const void *kv, const void *state,
                              uint8_t *out, size_t out_cap) {
    if (!desc_valid(d) || !kv || !out) return 0;
    bool with_state = state && d->state_bytes > 0;
    size_t h = (size_t)kiln_disk_block_header_bytes(d->block_size);
    size_t total = h + (size_t)d->kv_bytes + (with_state ? (size_t)d->state_bytes : 0);
    if (out_cap < total) return 0;
    if (kiln_disk_block_encode_header(d, kv, state, out, out_cap) != h) return 0;
    memcpy(out + h, kv, (size_t)d->kv_bytes);
    if (with_state) memcpy(out + h + (size_t)d->kv_bytes, state, (size_t)d->state_bytes);
    return total;
}

void kiln_disk_block_seal(uint8_t *buf, size_t n) {
    if (!buf || n < KILN_DISK_BLOCK_FIXED) return;
    uint64_t h = get_u32(buf + OFF_HEADER_BYTES);
    uint64_t kvb = get_u64(buf + OFF_KV_BYTES), sb = get_u64(buf + OFF_STATE_BYTES);
    if (h < KILN_DISK_BLOCK_FIXED + 8 || h > n) return;
    if (kvb > n - h || sb > n - h - kvb) return;
    put_u64(buf + OFF_KV_SUM, XXH3_64bits(buf + h, (size_t)kvb));
    put_u64(buf + OFF_STATE_SUM, sb ? XXH3_64bits(buf + h + kvb, (size_t)sb) : 0);
    put_u64(buf + h - 8, XXH3_64bits(buf, (size_t)h - 8));
}

/* pread exactly n bytes at off: 0, or -1 with errno (EIO... ; 0 bytes early: errno = 0) */
static int pread_all(int fd, void *buf, size_t n, off_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static kiln_status fail_read(char *why, size_t cap, const char *what) {
    if (errno) {
        snprintf(why, cap, "%s: %s", what, strerror(errno));
        return KILN_ERR_IO;
    }
    snprintf(why, cap, "truncated while reading %s (the file changed)", what);
    return KILN_ERR_FORMAT;
}

#define BAD(...) (snprintf(why, why_cap, __VA_ARGS__), KILN_ERR_FORMAT)

kiln_status kiln_disk_block_read_fd(int fd, const kiln_disk_block_desc *d, void *kv, void *state,
                                    bool *got_state, char *why, size_t why_cap) {
    char dummy[8];
    if (!why || why_cap == 0) {
        why = dummy;
        why_cap = sizeof dummy;
    }
    why[0] = '\0';
    if (got_state) *got_state = false;
    if (!desc_valid(d) || !kv) {
        snprintf(why, why_cap, "invalid arguments");
        return KILN_ERR_FORMAT;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) return fail_read(why, why_cap, "fstat");
    if (!S_ISREG(sb.st_mode)) return BAD("not a regular file");
    int64_t size = (int64_t)sb.st_size;
    int64_t h = kiln_disk_block_header_bytes(d->block_size);
    if (size < KILN_DISK_BLOCK_FIXED) return BAD("truncated header (%" PRId64 " bytes)", size);
    uint8_t stack_hdr[1024];
    uint8_t *hdr = h <= (int64_t)sizeof stack_hdr ? stack_hdr : malloc((size_t)h);
    if (!hdr) {
        snprintf(why, why_cap, "out of memory for a %" PRId64 "-byte header", h);
        return KILN_ERR_IO;
    }
    kiln_status st = KILN_ERR_FORMAT;
    size_t got = (size_t)(size < h ? size : h);
    if (pread_all(fd, hdr, got, 0) != 0) {
        st = fail_read(why, why_cap, "the header");
        goto out;
    }
    if (memcmp(hdr + OFF_MAGIC, KILN_DISK_BLOCK_MAGIC, 8) != 0) {
        st = BAD("bad magic");
        goto out;
    }
    uint32_t version = get_u32(hdr + OFF_VERSION);
    if (version != KILN_DISK_BLOCK_VERSION) {
        st = BAD("version %" PRIu32 " (this kiln reads %u)", version, KILN_DISK_BLOCK_VERSION);
        goto out;
    }
    uint32_t fh = get_u32(hdr + OFF_HEADER_BYTES);
    if ((int64_t)fh != h) {
        st = BAD("header of %" PRIu32 " bytes, expected %" PRId64 " (another block size?)", fh, h);
        goto out;
    }
    if (size < h) {
        st = BAD("truncated header (%" PRId64 " of %" PRId64 " bytes)", size, h);
        goto out;
    }
    if (get_u64(hdr + h - 8) != XXH3_64bits(hdr, (size_t)h - 8)) {
        st = BAD("header checksum mismatch");
        goto out;
    }
    uint64_t fp = get_u64(hdr + OFF_FINGERPRINT), ns = get_u64(hdr + OFF_NS);
    if (fp != d->fingerprint) {
        st = BAD("another model (fingerprint %016" PRIx64 ", expected %016" PRIx64 ")", fp,
                 d->fingerprint);
        goto out;
    }
    if (ns != d->ns) {
        st = BAD("another namespace (%016" PRIx64 ", expected %016" PRIx64 ")", ns, d->ns);
        goto out;
    }
    int32_t pf = (int32_t)get_u32(hdr + OFF_PAGE_FORMAT), nl = (int32_t)get_u32(hdr + OFF_N_LAYER);
    int32_t bs = (int32_t)get_u32(hdr + OFF_BLOCK_SIZE);
    int64_t kd = (int64_t)get_u64(hdr + OFF_KV_DIM), kvb = (int64_t)get_u64(hdr + OFF_KV_BYTES);
    if (pf != d->page_format || nl != d->n_layer || bs != d->block_size || kd != d->kv_dim ||
        kvb != d->kv_bytes) {
        st = BAD("another geometry (page format %" PRId32 ", %" PRId32 " layers, kv_dim %" PRId64
                 ", block size %" PRId32 ", %" PRId64 " kv bytes; expected %" PRId32 ", %" PRId32
                 ", %" PRId64 ", %" PRId32 ", %" PRId64 ")",
                 pf, nl, kd, bs, kvb, d->page_format, d->n_layer, d->kv_dim, d->block_size,
                 d->kv_bytes);
        goto out;
    }
    uint32_t flags = get_u32(hdr + OFF_FLAGS);
    if (flags & ~KILN_DISK_BLOCK_FLAG_STATE) {
        st = BAD("unknown flags 0x%" PRIx32, flags);
        goto out;
    }
    bool has_state = flags & KILN_DISK_BLOCK_FLAG_STATE;
    int64_t sbytes = (int64_t)get_u64(hdr + OFF_STATE_BYTES);
    uint64_t ssum = get_u64(hdr + OFF_STATE_SUM);
    if (has_state ? (d->state_bytes <= 0 || sbytes != d->state_bytes)
                  : (sbytes != 0 || ssum != 0)) {
        st = BAD("checkpoint of %" PRId64 " bytes, expected %" PRId64, sbytes,
                 has_state ? d->state_bytes : 0);
        goto out;
    }
    int64_t want = h + d->kv_bytes + (has_state ? sbytes : 0);
    if (size != want) {
        st = BAD("%s (%" PRId64 " bytes, expected %" PRId64 ")",
                 size < want ? "truncated" : "too long", size, want);
        goto out;
    }
    uint64_t fhash = get_u64(hdr + OFF_HASH), fparent = get_u64(hdr + OFF_PARENT);
    if (fhash != d->hash) {
        st = BAD("holds block %016" PRIx64 ", not %016" PRIx64, fhash, d->hash);
        goto out;
    }
    if (fparent != d->parent) {
        st = BAD("parent %016" PRIx64 ", asked %016" PRIx64, fparent, d->parent);
        goto out;
    }
    for (int32_t i = 0; i < d->block_size; i++) {
        int32_t t = (int32_t)get_u32(hdr + OFF_TOKENS + 4 * (size_t)i);
        if (t != d->tokens[i]) {
            st = BAD("token %" PRId32 " is %" PRId32 ", asked %" PRId32, i, t, d->tokens[i]);
            goto out;
        }
    }
    if (pread_all(fd, kv, (size_t)d->kv_bytes, (off_t)h) != 0) {
        st = fail_read(why, why_cap, "K and V");
        goto out;
    }
    if (XXH3_64bits(kv, (size_t)d->kv_bytes) != get_u64(hdr + OFF_KV_SUM)) {
        st = BAD("payload checksum mismatch (K and V)");
        goto out;
    }
    if (has_state && state) {
        if (pread_all(fd, state, (size_t)sbytes, (off_t)(h + d->kv_bytes)) != 0) {
            st = fail_read(why, why_cap, "the checkpoint");
            goto out;
        }
        if (XXH3_64bits(state, (size_t)sbytes) != ssum) {
            st = BAD("payload checksum mismatch (checkpoint)");
            goto out;
        }
        if (got_state) *got_state = true;
    }
    st = KILN_OK;
out:
    if (hdr != stack_hdr) free(hdr);
    return st;
}

/* ---- the tier -------------------------------------------------------------------------- */

enum { E_FREE, E_QUEUED, E_DISK };

typedef struct entry {
    uint64_t hash;
    int64_t size;       /* file bytes (DISK) */
    uint64_t gen;       /* DISK: changes whenever the file under this hash may have changed */
    int32_t prev, next; /* LRU links (DISK), or the free list (FREE: next) */
    uint8_t kind;
    bool has_state, plausible; /* from the size: a file this tier could have written */
} entry;

typedef struct witem {
    struct witem *next;
    uint64_t hash, parent;
    int64_t bytes; /* counted against queue_max_bytes */
    bool has_state;
    int32_t *tokens;
    uint8_t *kv, *state;
} witem;

enum { J_QUEUED, J_RUNNING };

typedef struct fjob {
    kiln_disk_fetch pub; /* first: a kiln_disk_fetch * is a fjob * */
    kiln_disk_tier *dt;
    struct fjob *next;
    uint64_t *hashes, *parents;
    int32_t *tokens;
    int stage;              /* J_QUEUED / J_RUNNING, under dt->mu */
    _Atomic bool cancelled; /* set under dt->mu by kiln_disk_fetch_free */
} fjob;

struct kiln_disk_tier {
    char *dir;
    kiln_disk_block_desc desc; /* identity and geometry; hash/parent/tokens per call */
    int64_t max_bytes, queue_max, retry_ms;
    int64_t header_bytes, file_plain, file_state; /* file sizes without / with a checkpoint */
    ssize_t (*write_fn)(int, const void *, size_t);
    int lock_fd;

    pthread_mutex_t mu;
    pthread_cond_t wake; /* the I/O thread: work or stop */
    pthread_cond_t idle; /* flush: a put finished */
    /* index (under mu) */
    entry *e;
    int32_t n_e, cap_e, free_e;
    int32_t *slot;
    uint32_t mask;
    int32_t n_live;
    int32_t lru_head, lru_tail;
    int64_t last_stamp; /* ns since the epoch: the most recent mtime given */
    uint64_t gen;
    /* queues (under mu) */
    witem *wq_head, *wq_tail;
    fjob *rq_head, *rq_tail;
    int64_t queue_bytes;
    uint64_t w_enq, w_done;
    bool stop;

    /* I/O thread only */
    uint8_t *whdr;
    uint64_t tmp_seq;
    bool full_logged, err_logged;
    int64_t full_since_ms;
    uint8_t subdir_ok[256];
    pthread_t thread;

    _Atomic int64_t reads, writes, read_bytes, write_bytes, corrupt, files, bytes, dropped,
        evictions;
    _Atomic bool disk_full;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* a strictly increasing recency stamp (under mu) */
static int64_t next_stamp(kiln_disk_tier *dt) {
    int64_t t = now_ns();
    if (t <= dt->last_stamp) t = dt->last_stamp + 1;
    dt->last_stamp = t;
    return t;
}

static void set_mtime(int fd, int64_t stamp) {
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = (time_t)(stamp / 1000000000ll);
    ts[0].tv_nsec = ts[1].tv_nsec = (long)(stamp % 1000000000ll);
    (void)futimens(fd, ts);
}

static const char *block_path(const kiln_disk_tier *dt, uint64_t hash, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s/%02x/%016" PRIx64 ".kvb", dt->dir, (unsigned)(hash >> 56), hash);
    return n > 0 && (size_t)n < cap ? buf : NULL;
}

const char *kiln_disk_tier_path(const kiln_disk_tier *dt, uint64_t hash, char *buf, size_t cap) {
    if (!dt || !buf) return NULL;
    return block_path(dt, hash, buf, cap);
}

/* -- the index (all under mu) -- */

static uint32_t home(const kiln_disk_tier *dt, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & dt->mask;
}

static int32_t find(const kiln_disk_tier *dt, uint64_t h) {
    for (uint32_t i = home(dt, h);; i = (i + 1) & dt->mask) {
        int32_t s = dt->slot[i];
        if (s < 0) return -1;
        if (dt->e[s].hash == h) return s;
    }
}

static void slot_put(kiln_disk_tier *dt, int32_t idx) {
    uint32_t i = home(dt, dt->e[idx].hash);
    while (dt->slot[i] >= 0) i = (i + 1) & dt->mask;
    dt->slot[i] = idx;
}

static bool table_grow(kiln_disk_tier *dt) {
    uint32_t n = (dt->mask + 1) * 2;
    int32_t *s = malloc(sizeof *s * n);
    if (!s) return false;
    for (uint32_t i = 0; i < n; i++) s[i] = -1;
    int32_t *old = dt->slot;
    uint32_t old_n = dt->mask + 1;
    dt->slot = s;
    dt->mask = n - 1;
    for (uint32_t i = 0; i < old_n; i++)
        if (old[i] >= 0) slot_put(dt, old[i]);
    free(old);
    return true;
}

static void slot_del(kiln_disk_tier *dt, uint64_t h) {
    uint32_t i = home(dt, h);
    while (dt->slot[i] >= 0 && dt->e[dt->slot[i]].hash != h) i = (i + 1) & dt->mask;
    if (dt->slot[i] < 0) return;
    /* backward shift: pull later members of the probe run back over the hole */
    for (uint32_t j = (i + 1) & dt->mask; dt->slot[j] >= 0; j = (j + 1) & dt->mask) {
        uint32_t k = home(dt, dt->e[dt->slot[j]].hash);
        if (((j - k) & dt->mask) >= ((j - i) & dt->mask)) {
            dt->slot[i] = dt->slot[j];
            i = j;
        }
    }
    dt->slot[i] = -1;
}

/* a new entry for h (not in the table yet), or -1 when memory runs out */
static int32_t entry_new(kiln_disk_tier *dt, uint64_t h, uint8_t kind) {
    if ((uint64_t)(dt->n_live + 1) * 2 > (uint64_t)dt->mask + 1 && !table_grow(dt)) return -1;
    int32_t idx = dt->free_e;
    if (idx >= 0) {
        dt->free_e = dt->e[idx].next;
    } else {
        if (dt->n_e == dt->cap_e) {
            if (dt->cap_e >= INT32_MAX / 2) return -1;
            int32_t cap = dt->cap_e ? dt->cap_e * 2 : 64;
            entry *ne = realloc(dt->e, sizeof *ne * (size_t)cap);
            if (!ne) return -1;
            dt->e = ne;
            dt->cap_e = cap;
        }
        idx = dt->n_e++;
    }
    entry *e = &dt->e[idx];
    memset(e, 0, sizeof *e);
    e->hash = h;
    e->kind = kind;
    e->prev = e->next = -1;
    slot_put(dt, idx);
    dt->n_live++;
    return idx;
}

static void lru_unlink(kiln_disk_tier *dt, int32_t idx) {
    entry *e = &dt->e[idx];
    if (e->prev >= 0)
        dt->e[e->prev].next = e->next;
    else
        dt->lru_head = e->next;
    if (e->next >= 0)
        dt->e[e->next].prev = e->prev;
    else
        dt->lru_tail = e->prev;
    e->prev = e->next = -1;
}

static void lru_push(kiln_disk_tier *dt, int32_t idx) {
    entry *e = &dt->e[idx];
    e->prev = dt->lru_tail;
    e->next = -1;
    if (dt->lru_tail >= 0)
        dt->e[dt->lru_tail].next = idx;
    else
        dt->lru_head = idx;
    dt->lru_tail = idx;
}

/* make a QUEUED entry DISK with a file of size bytes, most recent */
static void entry_commit(kiln_disk_tier *dt, int32_t idx, int64_t size) {
    entry *e = &dt->e[idx];
    e->kind = E_DISK;
    e->size = size;
    e->gen = ++dt->gen;
    e->plausible = size == dt->file_plain || (dt->desc.state_bytes > 0 && size == dt->file_state);
    e->has_state = dt->desc.state_bytes > 0 && size == dt->file_state;
    lru_push(dt, idx);
    atomic_fetch_add(&dt->files, 1);
    atomic_fetch_add(&dt->bytes, size);
}

static void entry_drop(kiln_disk_tier *dt, int32_t idx) {
    entry *e = &dt->e[idx];
    if (e->kind == E_DISK) {
        lru_unlink(dt, idx);
        atomic_fetch_sub(&dt->files, 1);
        atomic_fetch_sub(&dt->bytes, e->size);
    }
    slot_del(dt, e->hash);
    e->kind = E_FREE;
    e->next = dt->free_e;
    dt->free_e = idx;
    dt->n_live--;
}

/* drop h's entry if it is still the one (kind, gen) a caller saw */
static bool entry_drop_if(kiln_disk_tier *dt, uint64_t h, uint8_t kind, uint64_t gen) {
    int32_t idx = find(dt, h);
    if (idx < 0 || dt->e[idx].kind != kind || (kind == E_DISK && dt->e[idx].gen != gen))
        return false;
    entry_drop(dt, idx);
    return true;
}

/* -- reading -- */

/* Read and verify h's file (any thread). OK, or NOT_FOUND (absent, or failed a check: then
 * removed, logged and counted). */
static kiln_status read_block(kiln_disk_tier *dt, uint64_t hash, uint64_t parent,
                              const int32_t *tokens, void *kv, void *state, bool *got_state) {
    if (got_state) *got_state = false;
    char path[PATH_CAP];
    if (!block_path(dt, hash, path, sizeof path)) return KILN_ERR_NOT_FOUND;
    pthread_mutex_lock(&dt->mu);
    int32_t idx = find(dt, hash);
    if (idx < 0 || dt->e[idx].kind != E_DISK) {
        pthread_mutex_unlock(&dt->mu);
        return KILN_ERR_NOT_FOUND;
    }
    uint64_t gen = dt->e[idx].gen;
    pthread_mutex_unlock(&dt->mu);

    char why[256];
    kiln_status st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) { /* removed behind our back: forget it */
            pthread_mutex_lock(&dt->mu);
            entry_drop_if(dt, hash, E_DISK, gen);
            pthread_mutex_unlock(&dt->mu);
            return KILN_ERR_NOT_FOUND;
        }
        snprintf(why, sizeof why, "cannot open: %s", strerror(errno));
        st = KILN_ERR_IO;
    } else {
        kiln_disk_block_desc d = dt->desc;
        d.hash = hash;
        d.parent = parent;
        d.tokens = tokens;
        st = kiln_disk_block_read_fd(fd, &d, kv, state, got_state, why, sizeof why);
    }
    if (st != KILN_OK) {
        if (fd >= 0) close(fd);
        if (got_state) *got_state = false;
        pthread_mutex_lock(&dt->mu);
        if (entry_drop_if(dt, hash, E_DISK, gen)) unlink(path);
        pthread_mutex_unlock(&dt->mu);
        atomic_fetch_add(&dt->corrupt, 1);
        kiln_log_warn("disk tier: cache file %s: %s: removed", path, why);
        return KILN_ERR_NOT_FOUND;
    }
    int64_t stamp = 0, size = 0;
    pthread_mutex_lock(&dt->mu);
    idx = find(dt, hash);
    if (idx >= 0 && dt->e[idx].kind == E_DISK && dt->e[idx].gen == gen) {
        lru_unlink(dt, idx);
        lru_push(dt, idx);
        stamp = next_stamp(dt);
        size = dt->e[idx].size;
    }
    pthread_mutex_unlock(&dt->mu);
    if (stamp) set_mtime(fd, stamp); /* the recency survives a restart */
    close(fd);
    atomic_fetch_add(&dt->reads, 1);
    atomic_fetch_add(&dt->read_bytes, size);
    return KILN_OK;
}

/* -- writing (I/O thread) -- */

static bool is_full_errno(int e) {
    return e == ENOSPC || e == EDQUOT;
}

static void drop_queued(kiln_disk_tier *dt, uint64_t hash) {
    pthread_mutex_lock(&dt->mu);
    entry_drop_if(dt, hash, E_QUEUED, 0);
    pthread_mutex_unlock(&dt->mu);
    atomic_fetch_add(&dt->dropped, 1);
}

static void enter_full(kiln_disk_tier *dt, int e, const char *what) {
    atomic_store(&dt->disk_full, true);
    dt->full_since_ms = mono_ms();
    if (!dt->full_logged)
        kiln_log_warn("disk tier: cache dir %s is full (%s: %s): writes paused, blocks are not "
                      "written until space is free",
                      dt->dir, what, strerror(e));
    dt->full_logged = true;
}

static int write_all(kiln_disk_tier *dt, int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = dt->write_fn ? dt->write_fn(fd, p, n) : write(fd, p, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) {
            errno = EIO;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* remove least recently used files until `need` more bytes fit under the cap */
static void make_room(kiln_disk_tier *dt, int64_t need) {
    char path[PATH_CAP];
    for (;;) {
        pthread_mutex_lock(&dt->mu);
        int32_t v = dt->lru_head;
        if (v < 0 || atomic_load(&dt->bytes) + need <= dt->max_bytes) {
            pthread_mutex_unlock(&dt->mu);
            return;
        }
        uint64_t h = dt->e[v].hash;
        entry_drop(dt, v);
        pthread_mutex_unlock(&dt->mu);
        /* only this thread creates block files, so no newer file can be here yet */
        if (block_path(dt, h, path, sizeof path)) unlink(path);
        atomic_fetch_add(&dt->evictions, 1);
    }
}

static void do_write(kiln_disk_tier *dt, witem *w) {
    int64_t size = dt->header_bytes + dt->desc.kv_bytes + (w->has_state ? dt->desc.state_bytes : 0);
    if (atomic_load(&dt->disk_full) || size > dt->max_bytes) {
        drop_queued(dt, w->hash);
        return;
    }
    make_room(dt, size);

    char path[PATH_CAP], tmp[PATH_CAP], sub[PATH_CAP];
    unsigned xy = (unsigned)(w->hash >> 56);
    snprintf(sub, sizeof sub, "%s/%02x", dt->dir, xy);
    block_path(dt, w->hash, path, sizeof path);
    int tn = snprintf(tmp, sizeof tmp, "%s/%02x/" TMP_PREFIX "%ld-%" PRIu64, dt->dir, xy,
                      (long)getpid(), dt->tmp_seq++);
    if (tn < 0 || (size_t)tn >= sizeof tmp) { /* cannot happen: open bounds the dir's length */
        drop_queued(dt, w->hash);
        return;
    }

    const char *what = "mkdir";
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        if (!dt->subdir_ok[xy]) {
            if (mkdir(sub, 0755) != 0 && errno != EEXIST) goto fail;
            dt->subdir_ok[xy] = 1;
        }
        what = "open";
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno == ENOENT) dt->subdir_ok[xy] = 0; /* removed behind our back */
    }
    if (fd < 0) goto fail;
    kiln_disk_block_desc d = dt->desc;
    d.hash = w->hash;
    d.parent = w->parent;
    d.tokens = w->tokens;
    kiln_disk_block_encode_header(&d, w->kv, w->has_state ? w->state : NULL, dt->whdr,
                                  (size_t)dt->header_bytes);
    what = "write";
    if (write_all(dt, fd, dt->whdr, (size_t)dt->header_bytes) != 0 ||
        write_all(dt, fd, w->kv, (size_t)dt->desc.kv_bytes) != 0 ||
        (w->has_state && write_all(dt, fd, w->state, (size_t)dt->desc.state_bytes) != 0))
        goto fail;
    what = "rename";
    if (rename(tmp, path) != 0) goto fail;

    pthread_mutex_lock(&dt->mu);
    int32_t idx = find(dt, w->hash);
    int64_t stamp = 0;
    if (idx >= 0 && dt->e[idx].kind == E_QUEUED) {
        entry_commit(dt, idx, size);
        stamp = next_stamp(dt);
    }
    pthread_mutex_unlock(&dt->mu);
    if (stamp) set_mtime(fd, stamp);
    close(fd);
    atomic_fetch_add(&dt->writes, 1);
    atomic_fetch_add(&dt->write_bytes, size);
    if (dt->full_logged) {
        kiln_log_warn("disk tier: cache dir %s has space again: writes resumed", dt->dir);
        dt->full_logged = false;
    }
    return;

fail:;
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    if (is_full_errno(e)) {
        enter_full(dt, e, what);
    } else if (!dt->err_logged) { /* once per open: a broken disk must not flood the log */
        kiln_log_warn("disk tier: writing %s failed (%s: %s): block dropped", path, what,
                      strerror(e));
        dt->err_logged = true;
    }
    drop_queued(dt, w->hash);
}

/* -- fetches (I/O thread) -- */

static void job_free(fjob *j) {
    free(j->hashes);
    free(j->parents);
    free(j->tokens);
    free(j->pub.kv);
    free(j->pub.state);
    free(j->pub.has_state);
    free(j);
}

static void do_fetch(kiln_disk_tier *dt, fjob *j) {
    int64_t kvb = dt->desc.kv_bytes, sb = dt->desc.state_bytes;
    int32_t bs = dt->desc.block_size;
    int32_t ok = 0;
    for (int32_t i = 0; i < j->pub.n; i++) {
        if (atomic_load(&j->cancelled)) break;
        void *state = j->pub.state ? j->pub.state + (size_t)i * (size_t)sb : NULL;
        if (read_block(dt, j->hashes[i], j->parents[i], j->tokens + (size_t)i * (size_t)bs,
                       j->pub.kv + (size_t)i * (size_t)kvb, state, &j->pub.has_state[i]) != KILN_OK)
            break;
        ok = i + 1;
    }
    pthread_mutex_lock(&dt->mu);
    bool cancelled = atomic_load(&j->cancelled);
    if (!cancelled) {
        j->pub.n_ok = ok;
        atomic_store_explicit(&j->pub.done, true, memory_order_release);
    }
    pthread_mutex_unlock(&dt->mu);
    if (cancelled) job_free(j);
}

/* After a full disk: is there room for a few files again? (I/O thread) */
static bool space_again(kiln_disk_tier *dt) {
    struct statvfs vs;
    if (statvfs(dt->dir, &vs) != 0) return false;
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    return avail >= 4 * (uint64_t)dt->file_state;
}

static void *io_main(void *arg) {
    kiln_disk_tier *dt = arg;
    pthread_mutex_lock(&dt->mu);
    for (;;) {
        if (dt->rq_head) { /* reads first: a request waits on them */
            fjob *j = dt->rq_head;
            dt->rq_head = j->next;
            if (!dt->rq_head) dt->rq_tail = NULL;
            j->stage = J_RUNNING;
            pthread_mutex_unlock(&dt->mu);
            do_fetch(dt, j);
            pthread_mutex_lock(&dt->mu);
            continue;
        }
        if (dt->wq_head) {
            witem *w = dt->wq_head;
            dt->wq_head = w->next;
            if (!dt->wq_head) dt->wq_tail = NULL;
            dt->queue_bytes -= w->bytes;
            pthread_mutex_unlock(&dt->mu);
            do_write(dt, w);
            free(w);
            pthread_mutex_lock(&dt->mu);
            dt->w_done++;
            pthread_cond_broadcast(&dt->idle);
            continue;
        }
        if (dt->stop) break;
        if (atomic_load(&dt->disk_full)) {
            int64_t due = dt->full_since_ms + dt->retry_ms, now = mono_ms();
            if (now >= due) {
                pthread_mutex_unlock(&dt->mu);
                bool again = space_again(dt);
                pthread_mutex_lock(&dt->mu);
                if (again)
                    atomic_store(&dt->disk_full, false); /* the next write tells */
                else
                    dt->full_since_ms = now;
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t wait_ms = due - now;
            ts.tv_sec += (time_t)(wait_ms / 1000);
            ts.tv_nsec += (long)(wait_ms % 1000) * 1000000l;
            if (ts.tv_nsec >= 1000000000l) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000l;
            }
            pthread_cond_timedwait(&dt->wake, &dt->mu, &ts);
            continue;
        }
        pthread_cond_wait(&dt->wake, &dt->mu);
    }
    pthread_mutex_unlock(&dt->mu);
    return NULL;
}

/* -- open: directory, lock, scan -- */

static kiln_status mkdir_p(const char *dir, kiln_error *err) {
    char buf[PATH_CAP];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t n = strlen(buf);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            return kiln_error_set(err, KILN_ERR_IO, "cache dir %s: cannot create %s: %s", dir, buf,
                                  strerror(e));
        }
        struct stat sb;
        if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return kiln_error_set(err, KILN_ERR_IO, "cache dir %s: %s is not a directory", dir,
                                  buf);
        buf[i] = c;
    }
    return KILN_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<16 lowercase hex>.kvb" in subdirectory xy: the hash, or false */
static bool parse_block_name(const char *name, unsigned xy, uint64_t *hash) {
    if (strlen(name) != 20 || strcmp(name + 16, ".kvb") != 0) return false;
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        int v = hexval(name[i]);
        if (v < 0) return false;
        h = h << 4 | (uint64_t)v;
    }
    if ((unsigned)(h >> 56) != xy) return false;
    *hash = h;
    return true;
}

typedef struct found {
    uint64_t hash;
    int64_t size, mtime;
} found;

static int found_cmp(const void *a, const void *b) {
    const found *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

static kiln_status scan(kiln_disk_tier *dt, kiln_error *err) {
    DIR *top = opendir(dt->dir);
    if (!top)
        return kiln_error_set(err, KILN_ERR_IO, "cache dir %s: cannot read it: %s", dt->dir,
                              strerror(errno));
    found *fs = NULL;
    size_t n = 0, cap = 0;
    kiln_status st = KILN_OK;
    struct dirent *de;
    while ((de = readdir(top))) {
        int a = hexval(de->d_name[0]), b = a >= 0 ? hexval(de->d_name[1]) : -1;
        if (a < 0 || b < 0 || de->d_name[2]) continue; /* not one of ours: ignored */
        unsigned xy = (unsigned)(a * 16 + b);
        char sub[PATH_CAP];
        snprintf(sub, sizeof sub, "%s/%s", dt->dir, de->d_name);
        struct stat sb;
        if (lstat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        DIR *d = opendir(sub);
        if (!d) continue;
        dt->subdir_ok[xy] = 1;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            uint64_t h;
            if (strncmp(fe->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
                /* a write cut short (the lock says no process is writing now) */
                unlinkat(dirfd(d), fe->d_name, 0);
                continue;
            }
            if (!parse_block_name(fe->d_name, xy, &h)) continue;
            if (fstatat(dirfd(d), fe->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(sb.st_mode))
                continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 256;
                found *nf = realloc(fs, sizeof *nf * nc);
                if (!nf) {
                    st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                        "cache dir %s: out of memory indexing %zu files", dt->dir,
                                        n);
                    break;
                }
                fs = nf;
                cap = nc;
            }
            fs[n++] = (found){h, (int64_t)sb.st_size,
                              (int64_t)sb.st_mtim.tv_sec * 1000000000ll + sb.st_mtim.tv_nsec};
        }
        closedir(d);
        if (st != KILN_OK) break;
    }
    closedir(top);
    if (st == KILN_OK && n) {
        qsort(fs, n, sizeof *fs, found_cmp); /* least recent first */
        for (size_t i = 0; i < n; i++) {
            int32_t idx = entry_new(dt, fs[i].hash, E_QUEUED);
            if (idx < 0) {
                st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                    "cache dir %s: out of memory indexing %zu files", dt->dir, n);
                break;
            }
            entry_commit(dt, idx, fs[i].size);
            if (fs[i].mtime > dt->last_stamp) dt->last_stamp = fs[i].mtime;
        }
    }
    free(fs);
    return st;
}

static void tier_free(kiln_disk_tier *dt) {
    if (dt->lock_fd >= 0) close(dt->lock_fd); /* releases the flock */
    pthread_cond_destroy(&dt->idle);
    pthread_cond_destroy(&dt->wake);
    pthread_mutex_destroy(&dt->mu);
    free(dt->whdr);
    free(dt->slot);
    free(dt->e);
    free(dt->dir);
    free(dt);
}

/* a page format id of the header: a kiln_dtype, or a TurboQuant page id (kv/turboquant.h) */
static bool page_format_id_ok(int32_t id) {
    return (id >= 0 && id < KILN_DTYPE_COUNT) ||
           (id >= KILN_KV_TURBO_DTYPE_BASE && id < KILN_KV_TURBO_DTYPE_END);
}

kiln_status kiln_disk_tier_open(const kiln_disk_tier_params *p, kiln_disk_tier **out,
                                kiln_error *err) {
    if (!p || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "disk tier: NULL %s",
                              !p ? "params" : "out");
    if (!p->dir || !p->dir[0])
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "disk tier: no cache dir given");
#define FIELD_CHECK(cond, what)                                                                    \
    if (!(cond))                                                                                   \
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "disk tier (cache dir %s): %s",      \
                              p->dir, what);
    FIELD_CHECK(strlen(p->dir) + 64 < PATH_CAP, "the path is too long");
    FIELD_CHECK(p->block_size >= 1 && p->block_size <= KILN_DISK_BLOCK_MAX_TOKENS,
                "block_size must be in [1, 1048576]");
    FIELD_CHECK(p->kv_bytes >= 1, "kv_bytes must be >= 1");
    FIELD_CHECK(p->state_bytes >= 0, "state_bytes must be >= 0");
    FIELD_CHECK(p->n_layer >= 1, "n_layer must be >= 1");
    FIELD_CHECK(p->kv_dim >= 1, "kv_dim must be >= 1");
    FIELD_CHECK(p->page_format >= 0 && page_format_id_ok(p->page_format & 0xFF) &&
                    page_format_id_ok(p->page_format >> 8),
                "page_format is not a kiln_dtype or TurboQuant page id (or K | V << 8)");
    FIELD_CHECK(p->max_bytes >= 0, "max_bytes must be >= 0");
    FIELD_CHECK(p->queue_max_bytes >= 0, "queue_max_bytes must be >= 0");
    FIELD_CHECK(p->retry_ms >= 0, "retry_ms must be >= 0");
    FIELD_CHECK(p->kv_bytes <= (INT64_MAX >> 3) && p->state_bytes <= (INT64_MAX >> 3),
                "kv_bytes / state_bytes too large");
#undef FIELD_CHECK
    kiln_status st = mkdir_p(p->dir, err);
    if (st != KILN_OK) return st;

    kiln_disk_tier *dt = calloc(1, sizeof *dt);
    if (!dt) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "disk tier: out of memory");
    dt->lock_fd = -1;
    pthread_mutex_init(&dt->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&dt->wake, &ca); /* timed waits on the monotonic clock */
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&dt->idle, NULL);
    /* absolute, so a later chdir cannot move the tier; mkdir_p has made it exist */
    dt->dir = realpath(p->dir, NULL);
    if (!dt->dir) dt->dir = strdup(p->dir);
    size_t dl = dt->dir ? strlen(dt->dir) : 0;
    while (dl > 1 && dt->dir[dl - 1] == '/') dt->dir[--dl] = '\0';
    if (dl + 64 >= PATH_CAP) {
        tier_free(dt);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "disk tier (cache dir %s): the path is too long", p->dir);
    }
    dt->desc = (kiln_disk_block_desc){.fingerprint = p->fingerprint,
                                      .ns = p->ns,
                                      .page_format = p->page_format,
                                      .n_layer = p->n_layer,
                                      .kv_dim = p->kv_dim,
                                      .block_size = p->block_size,
                                      .kv_bytes = p->kv_bytes,
                                      .state_bytes = p->state_bytes};
    dt->max_bytes = p->max_bytes ? p->max_bytes : DEFAULT_MAX_BYTES;
    dt->queue_max = p->queue_max_bytes ? p->queue_max_bytes : DEFAULT_QUEUE_BYTES;
    dt->retry_ms = p->retry_ms ? p->retry_ms : DEFAULT_RETRY_MS;
    dt->header_bytes = kiln_disk_block_header_bytes(p->block_size);
    dt->file_plain = dt->header_bytes + p->kv_bytes;
    dt->file_state = dt->file_plain + p->state_bytes;
    dt->write_fn = p->write_fn;
    dt->lru_head = dt->lru_tail = -1;
    dt->free_e = -1;
    dt->mask = 255;
    dt->slot = malloc(sizeof *dt->slot * 256);
    dt->whdr = malloc((size_t)dt->header_bytes);
    if (!dt->dir || !dt->slot || !dt->whdr) {
        tier_free(dt);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "disk tier: out of memory");
    }
    for (int i = 0; i < 256; i++) dt->slot[i] = -1;

    char lock[PATH_CAP];
    snprintf(lock, sizeof lock, "%s/lock", dt->dir);
    dt->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (dt->lock_fd < 0) {
        st = kiln_error_set(err, KILN_ERR_IO, "cache dir %s: cannot open %s: %s", dt->dir, lock,
                            strerror(errno));
        tier_free(dt);
        return st;
    }
    if (flock(dt->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK)
            st = kiln_error_set(err, KILN_ERR_IO,
                                "cache dir %s is in use by another kiln process (%s is locked)",
                                p->dir, lock);
        else
            st = kiln_error_set(err, KILN_ERR_IO, "cache dir %s: cannot lock %s: %s", dt->dir, lock,
                                strerror(e));
        tier_free(dt);
        return st;
    }
    st = scan(dt, err);
    if (st != KILN_OK) {
        tier_free(dt);
        return st;
    }
    make_room(dt, 0); /* a smaller cap than last time */
    if (pthread_create(&dt->thread, NULL, io_main, dt) != 0) {
        tier_free(dt);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cache dir %s: cannot start the I/O thread",
                              p->dir);
    }
    *out = dt;
    return KILN_OK;
}

void kiln_disk_tier_close(kiln_disk_tier *dt) {
    if (!dt) return;
    pthread_mutex_lock(&dt->mu);
    dt->stop = true;
    pthread_cond_signal(&dt->wake);
    pthread_mutex_unlock(&dt->mu);
    pthread_join(dt->thread, NULL); /* it drains both queues first */
    tier_free(dt);
}

bool kiln_disk_tier_put(kiln_disk_tier *dt, uint64_t hash, uint64_t parent, const int32_t *tokens,
                        const void *kv, const void *state) {
    if (!dt || !tokens || !kv) return false;
    bool with_state = state && dt->desc.state_bytes > 0;
    int64_t size = with_state ? dt->file_state : dt->file_plain;
    size_t tok_bytes = sizeof(int32_t) * (size_t)dt->desc.block_size;
    size_t kvb = (size_t)dt->desc.kv_bytes, sb = with_state ? (size_t)dt->desc.state_bytes : 0;
    int64_t item = (int64_t)(sizeof(witem) + tok_bytes + kvb + sb);

    pthread_mutex_lock(&dt->mu);
    int32_t idx = find(dt, hash);
    bool known = idx >= 0 && (dt->e[idx].kind == E_QUEUED || dt->e[idx].plausible);
    bool room = dt->queue_bytes + item <= dt->queue_max;
    pthread_mutex_unlock(&dt->mu);
    if (known) return false; /* not a drop: the block is (or will be) on disk */
    if (!room || atomic_load(&dt->disk_full) || size > dt->max_bytes) {
        atomic_fetch_add(&dt->dropped, 1);
        return false;
    }
    witem *w = malloc((size_t)item); /* copy outside the lock */
    if (!w) {
        atomic_fetch_add(&dt->dropped, 1);
        return false;
    }
    w->next = NULL;
    w->hash = hash;
    w->parent = parent;
    w->bytes = item;
    w->has_state = with_state;
    w->tokens = (int32_t *)(w + 1);
    w->kv = (uint8_t *)w->tokens + tok_bytes;
    w->state = with_state ? w->kv + kvb : NULL;
    memcpy(w->tokens, tokens, tok_bytes);
    memcpy(w->kv, kv, kvb);
    if (with_state) memcpy(w->state, state, sb);

    pthread_mutex_lock(&dt->mu);
    idx = find(dt, hash); /* again: another thread may have come first */
    if (idx >= 0 && (dt->e[idx].kind == E_QUEUED || dt->e[idx].plausible)) {
        pthread_mutex_unlock(&dt->mu);
        free(w);
        return false;
    }
    /* a file no block of this tier could be (another geometry, torn) is replaced */
    if (idx >= 0) entry_drop(dt, idx);
    if (dt->queue_bytes + item > dt->queue_max || entry_new(dt, hash, E_QUEUED) < 0) {
        pthread_mutex_unlock(&dt->mu);
        free(w);
        atomic_fetch_add(&dt->dropped, 1);
        return false;
    }
    if (dt->wq_tail)
        dt->wq_tail->next = w;
    else
        dt->wq_head = w;
    dt->wq_tail = w;
    dt->queue_bytes += item;
    dt->w_enq++;
    pthread_cond_signal(&dt->wake);
    pthread_mutex_unlock(&dt->mu);
    return true;
}

bool kiln_disk_tier_has(const kiln_disk_tier *dt, uint64_t hash, bool *has_state) {
    if (has_state) *has_state = false;
    if (!dt) return false;
    kiln_disk_tier *m = (kiln_disk_tier *)dt; /* the mutex only */
    pthread_mutex_lock(&m->mu);
    int32_t idx = find(dt, hash);
    bool on_disk = idx >= 0 && dt->e[idx].kind == E_DISK && dt->e[idx].plausible;
    if (on_disk && has_state) *has_state = dt->e[idx].has_state;
    pthread_mutex_unlock(&m->mu);
    return on_disk;
}

kiln_status kiln_disk_tier_read(kiln_disk_tier *dt, uint64_t hash, uint64_t parent,
                                const int32_t *tokens, void *kv, void *state, bool *got_state,
                                kiln_error *err) {
    if (got_state) *got_state = false;
    if (!dt || !tokens || !kv)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "disk tier read: NULL %s",
                              !dt       ? "tier"
                              : !tokens ? "tokens"
                                        : "kv");
    kiln_status st = read_block(dt, hash, parent, tokens, kv, state, got_state);
    if (st != KILN_OK)
        return kiln_error_set(err, st, "disk tier: no valid file for block %016" PRIx64, hash);
    return kiln_error_set(err, KILN_OK, NULL);
}

kiln_disk_fetch *kiln_disk_tier_fetch(kiln_disk_tier *dt, const uint64_t *hashes,
                                      const uint64_t *parents, const int32_t *tokens, int32_t n) {
    if (!dt || n < 0 || (n > 0 && (!hashes || !parents || !tokens))) return NULL;
    fjob *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->dt = dt;
    j->pub.n = n;
    if (n == 0) {
        atomic_store(&j->pub.done, true);
        return &j->pub;
    }
    size_t un = (size_t)n, kv_total, st_total = 0, tok_total;
    bool ovf =
        __builtin_mul_overflow(un, (size_t)dt->desc.kv_bytes, &kv_total) ||
        __builtin_mul_overflow(un, (size_t)dt->desc.state_bytes, &st_total) ||
        __builtin_mul_overflow(un, (size_t)dt->desc.block_size * sizeof(int32_t), &tok_total);
    if (!ovf) {
        j->hashes = malloc(sizeof(uint64_t) * un);
        j->parents = malloc(sizeof(uint64_t) * un);
        j->tokens = malloc(tok_total);
        j->pub.kv = malloc(kv_total);
        j->pub.state = st_total ? malloc(st_total) : NULL;
        j->pub.has_state = calloc(un, sizeof(bool));
    }
    if (ovf || !j->hashes || !j->parents || !j->tokens || !j->pub.kv || !j->pub.has_state ||
        (st_total && !j->pub.state)) {
        job_free(j);
        return NULL;
    }
    memcpy(j->hashes, hashes, sizeof(uint64_t) * un);
    memcpy(j->parents, parents, sizeof(uint64_t) * un);
    memcpy(j->tokens, tokens, tok_total);
    pthread_mutex_lock(&dt->mu);
    j->stage = J_QUEUED;
    if (dt->rq_tail)
        dt->rq_tail->next = j;
    else
        dt->rq_head = j;
    dt->rq_tail = j;
    pthread_cond_signal(&dt->wake);
    pthread_mutex_unlock(&dt->mu);
    return &j->pub;
}

void kiln_disk_fetch_free(kiln_disk_fetch *f) {
    if (!f) return;
    fjob *j = (fjob *)f;
    if (atomic_load_explicit(&f->done, memory_order_acquire)) {
        job_free(j);
        return;
    }
    kiln_disk_tier *dt = j->dt;
    pthread_mutex_lock(&dt->mu);
    if (atomic_load(&f->done)) { /* finished meanwhile */
        pthread_mutex_unlock(&dt->mu);
        job_free(j);
        return;
    }
    if (j->stage == J_QUEUED) { /* not started: take it out of the queue */
        fjob **pp = &dt->rq_head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) *pp = j->next;
        if (dt->rq_tail == j) dt->rq_tail = prev;
        pthread_mutex_unlock(&dt->mu);
        job_free(j);
        return;
    }
    atomic_store(&j->cancelled, true); /* running: the I/O thread frees it */
    pthread_mutex_unlock(&dt->mu);
}

void kiln_disk_tier_flush(kiln_disk_tier *dt) {
    if (!dt) return;
    pthread_mutex_lock(&dt->mu);
    uint64_t target = dt->w_enq;
    while (dt->w_done < target) pthread_cond_wait(&dt->idle, &dt->mu);
    pthread_mutex_unlock(&dt->mu);
}

bool kiln_disk_tier_remove(kiln_disk_tier *dt, uint64_t hash) {
    if (!dt) return false;
    char path[PATH_CAP];
    pthread_mutex_lock(&dt->mu);
    int32_t idx = find(dt, hash);
    bool known = idx >= 0 && dt->e[idx].kind == E_DISK;
    if (known) {
        entry_drop(dt, idx);
        if (block_path(dt, hash, path, sizeof path)) unlink(path); /* under mu: see the top */
    }
    pthread_mutex_unlock(&dt->mu);
    return known;
}

kiln_disk_tier_stats kiln_disk_tier_get_stats(const kiln_disk_tier *dt) {
    kiln_disk_tier_stats s = {0};
    if (!dt) return s;
    s.reads = atomic_load(&dt->reads);
    s.writes = atomic_load(&dt->writes);
    s.read_bytes = atomic_load(&dt->read_bytes);
    s.write_bytes = atomic_load(&dt->write_bytes);
    s.corrupt = atomic_load(&dt->corrupt);
    s.files = atomic_load(&dt->files);
    s.bytes = atomic_load(&dt->bytes);
    s.dropped = atomic_load(&dt->dropped);
    s.evictions = atomic_load(&dt->evictions);
    s.disk_full = atomic_load(&dt->disk_full);
    return s;
}
