/*
 * test_disk_tier - the prefix cache's disk tier (kv/disk_tier.h): round trips, restarts, runs
 * fetched asynchronously, every way a file can be wrong (each removed, logged, counted and
 * reported as not found), temporary files left by a killed writer, a full disk, the size cap's
 * LRU order (across a restart), the directory lock across processes, and bad parameters.
 *
 * Oracle: the behaviour disk_tier.h documents and the file format table in it; blocks are
 * built from their index so every byte read back can be compared with what was put.
 * Each case works in its own directory under a mkdtemp root in /tmp, removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "kv/disk_tier.h"
#include "kv/prefix_cache.h"
#include "tensor/dtype.h"
#include "test.h"
#include "util/log.h"

#define NL    2
#define KVD   8
#define BS    4
#define KVB   (2 * NL * BS * KVD * 2) /* f16 K and V, all layers */
#define SB    48
#define NS    0x5eed5eed12345678ull
#define FP    0xf1f2f3f4f5f6f7f8ull
#define HDR   (112 + 4 * BS)
#define FILE0 (HDR + KVB)      /* a file without a checkpoint */
#define FILE1 (HDR + KVB + SB) /* with one */

static char root[256];

/* ---- helpers ---- */

static int n_warn;
static char last_warn[KILN_LOG_LINE_MAX];

static void sink(void *user, const char *line) {
    (void)user;
    n_warn++;
    snprintf(last_warn, sizeof last_warn, "%s", line);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}
static void rm_rf(const char *p) {
    nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *case_dir(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, 512, "%s/%s", root, name);
    rm_rf(b);
    return b;
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* block i of one chain: tokens, parent, hash, K/V bytes (kvb of them) and a checkpoint */
typedef struct blk {
    int32_t tokens[BS];
    uint64_t parent, hash;
    uint8_t *kv, state[SB];
} blk;

static void make_chain(blk *b, int n, int64_t kvb, uint32_t salt) {
    uint64_t parent = NS;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < BS; k++) b[i].tokens[k] = (int32_t)(salt * 1000 + i * BS + k);
        b[i].parent = parent;
        b[i].hash = kiln_prefix_hash(parent, b[i].tokens, BS, NS);
        parent = b[i].hash;
        b[i].kv = malloc((size_t)kvb);
        uint64_t s = b[i].hash | 1;
        for (int64_t j = 0; j < kvb; j++) b[i].kv[j] = (uint8_t)rng(&s);
        for (int j = 0; j < SB; j++) b[i].state[j] = (uint8_t)rng(&s);
    }
}
static void free_chain(blk *b, int n) {
    for (int i = 0; i < n; i++) free(b[i].kv);
}

static kiln_disk_tier_params params(const char *dir) {
    kiln_disk_tier_params p = {0};
    p.dir = dir;
    p.fingerprint = FP;
    p.ns = NS;
    p.page_format = KILN_DTYPE_F16;
    p.n_layer = NL;
    p.kv_dim = KVD;
    p.block_size = BS;
    p.kv_bytes = KVB;
    p.state_bytes = SB;
    return p;
}

static kiln_disk_tier *open_p(const kiln_disk_tier_params *p) {
    kiln_disk_tier *dt = NULL;
    kiln_error e = {0};
    kiln_status st = kiln_disk_tier_open(p, &dt, &e);
    if (st != KILN_OK) fprintf(stderr, "open: %s\n", e.message);
    REQUIRE(st == KILN_OK && dt);
    return dt;
}
static kiln_disk_tier *open_dir(const char *dir) {
    kiln_disk_tier_params p = params(dir);
    return open_p(&p);
}

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static const char *path_of(kiln_disk_tier *dt, uint64_t h) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    REQUIRE(kiln_disk_tier_path(dt, h, b, 1024));
    return b;
}

/* files under dir whose name ends with suffix / starts with prefix (recursive) */
static int count_prefix, count_suffix;
static const char *want_prefix, *want_suffix;
static int count_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    if (flag != FTW_F) return 0;
    const char *base = p + f->base;
    size_t n = strlen(base), m = strlen(want_suffix);
    if (strncmp(base, want_prefix, strlen(want_prefix)) == 0) count_prefix++;
    if (n >= m && strcmp(base + n - m, want_suffix) == 0) count_suffix++;
    return 0;
}
static int count_files(const char *dir, const char *prefix, const char *suffix, int *n_suffix) {
    count_prefix = count_suffix = 0;
    want_prefix = prefix;
    want_suffix = suffix;
    nftw(dir, count_one, 16, FTW_PHYS);
    if (n_suffix) *n_suffix = count_suffix;
    return count_prefix;
}
static int n_blocks_in(const char *dir) {
    int n;
    count_files(dir, "\x01", ".kvb", &n);
    return n;
}
static int n_tmp_in(const char *dir) {
    return count_files(dir, ".tmp-", "\x01", NULL);
}

static bool read_ok(kiln_disk_tier *dt, const blk *b, bool want_state) {
    uint8_t kv[KVB], st[SB];
    bool got = false;
    kiln_status s = kiln_disk_tier_read(dt, b->hash, b->parent, b->tokens, kv,
                                        want_state ? st : NULL, &got, NULL);
    if (s != KILN_OK) return false;
    if (memcmp(kv, b->kv, KVB) != 0) return false;
    if (want_state && got && memcmp(st, b->state, SB) != 0) return false;
    return true;
}

static void put_all(kiln_disk_tier *dt, blk *b, int n, bool with_state) {
    for (int i = 0; i < n; i++)
        CHECK(kiln_disk_tier_put(dt, b[i].hash, b[i].parent, b[i].tokens, b[i].kv,
                                 with_state ? b[i].state : NULL));
    kiln_disk_tier_flush(dt);
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000l};
    nanosleep(&ts, NULL);
}

/* ---- cases ---- */

/* put, flush, read back bitwise; the file is where and what the header's table says */
static void test_roundtrip_and_format(void) {
    const char *dir = case_dir("roundtrip");
    blk b[6];
    make_chain(b, 6, KVB, 1);
    kiln_disk_tier *dt = open_dir(dir);
    for (int i = 0; i < 6; i++) CHECK(!kiln_disk_tier_has(dt, b[i].hash, NULL));
    for (int i = 0; i < 6; i++)
        CHECK(kiln_disk_tier_put(dt, b[i].hash, b[i].parent, b[i].tokens, b[i].kv,
                                 i % 2 ? b[i].state : NULL));
    /* already queued or on disk: refused, not counted as dropped */
    CHECK(!kiln_disk_tier_put(dt, b[0].hash, b[0].parent, b[0].tokens, b[0].kv, NULL));
    kiln_disk_tier_flush(dt);
    CHECK(!kiln_disk_tier_put(dt, b[1].hash, b[1].parent, b[1].tokens, b[1].kv, NULL));
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    CHECK(s.writes == 6 && s.files == 6 && s.dropped == 0 && s.corrupt == 0);
    CHECK(s.bytes == 3 * FILE0 + 3 * FILE1 && s.write_bytes == s.bytes);
    CHECK(n_blocks_in(dir) == 6);

    for (int i = 0; i < 6; i++) {
        bool hs = !(i % 2);
        CHECK(kiln_disk_tier_has(dt, b[i].hash, &hs));
        CHECK(hs == (i % 2 == 1));
        uint8_t kv[KVB], st[SB];
        bool got = !(i % 2);
        CHECK(kiln_disk_tier_read(dt, b[i].hash, b[i].parent, b[i].tokens, kv, st, &got, NULL) ==
              KILN_OK);
        CHECK(memcmp(kv, b[i].kv, KVB) == 0);
        CHECK(got == (i % 2 == 1));
        if (got) CHECK(memcmp(st, b[i].state, SB) == 0);
        /* without a state buffer a file with a checkpoint still reads (K and V only) */
        got = true;
        CHECK(kiln_disk_tier_read(dt, b[i].hash, b[i].parent, b[i].tokens, kv, NULL, &got, NULL) ==
              KILN_OK);
        CHECK(!got && memcmp(kv, b[i].kv, KVB) == 0);
    }
    s = kiln_disk_tier_get_stats(dt);
    CHECK(s.reads == 12 && s.read_bytes == 2 * (3 * FILE0 + 3 * FILE1) && s.corrupt == 0);

    /* absent: NOT_FOUND, nothing counted */
    uint8_t kv[KVB];
    kiln_error e = {0};
    CHECK(kiln_disk_tier_read(dt, 0x1234, 0, b[0].tokens, kv, NULL, NULL, &e) ==
          KILN_ERR_NOT_FOUND);
    CHECK(e.message[0] != '\0');
    CHECK(kiln_disk_tier_get_stats(dt).corrupt == 0);

    /* the file: DIR/xy/<hash>.kvb, byte for byte kiln_disk_block_encode's, fields per the table */
    char want[1024];
    snprintf(want, sizeof want, "%s/%02x/%016" PRIx64 ".kvb", dir, (unsigned)(b[1].hash >> 56),
             b[1].hash);
    CHECK(strcmp(path_of(dt, b[1].hash), want) == 0);
    size_t n = 0;
    uint8_t *f = slurp(want, &n);
    REQUIRE(f);
    CHECK(n == FILE1);
    kiln_disk_block_desc d = {FP,  NS, KILN_DTYPE_F16, NL,          KVD,        BS,
                              KVB, SB, b[1].hash,      b[1].parent, b[1].tokens};
    uint8_t enc[FILE1];
    CHECK(kiln_disk_block_encode(&d, b[1].kv, b[1].state, enc, sizeof enc) == FILE1);
    CHECK(n == FILE1 && memcmp(f, enc, FILE1) == 0);
    CHECK(memcmp(f, "KILNKVB\0", 8) == 0 && le32(f + 8) == 1 && le32(f + 12) == HDR);
    CHECK(le64(f + 16) == FP && le64(f + 24) == NS && le64(f + 32) == b[1].hash);
    CHECK(le64(f + 40) == b[1].parent && le64(f + 48) == KVD && le64(f + 56) == KVB);
    CHECK(le64(f + 64) == SB && le32(f + 88) == KILN_DTYPE_F16 && le32(f + 92) == NL);
    CHECK(le32(f + 96) == BS && le32(f + 100) == 1);
    for (int k = 0; k < BS; k++) CHECK((int32_t)le32(f + 104 + 4 * k) == b[1].tokens[k]);
    CHECK(memcmp(f + HDR, b[1].kv, KVB) == 0 && memcmp(f + HDR + KVB, b[1].state, SB) == 0);
    free(f);
    CHECK(kiln_disk_block_header_bytes(BS) == HDR && kiln_disk_block_header_bytes(0) == 0);

    /* restart: the index is rebuilt from the names, every block reads back */
    kiln_disk_tier_close(dt);
    dt = open_dir(dir);
    s = kiln_disk_tier_get_stats(dt);
    CHECK(s.files == 6 && s.bytes == 3 * FILE0 + 3 * FILE1 && s.writes == 0);
    for (int i = 0; i < 6; i++) {
        bool hs = false;
        CHECK(kiln_disk_tier_has(dt, b[i].hash, &hs) && hs == (i % 2 == 1));
        CHECK(read_ok(dt, &b[i], true));
    }
    /* remove */
    CHECK(kiln_disk_tier_remove(dt, b[2].hash));
    CHECK(!kiln_disk_tier_remove(dt, b[2].hash));
    CHECK(!kiln_disk_tier_has(dt, b[2].hash, NULL) && !file_exists(path_of(dt, b[2].hash)));
    CHECK(kiln_disk_tier_get_stats(dt).files == 5);
    kiln_disk_tier_close(dt);
    kiln_disk_tier_close(NULL);
    free_chain(b, 6);
}

static void wait_done(kiln_disk_fetch *f) {
    for (int i = 0; i < 5000 && !atomic_load(&f->done); i++) sleep_ms(1);
    REQUIRE(atomic_load(&f->done));
}

static void fetch_args(const blk *b, int n, uint64_t *h, uint64_t *p, int32_t *t) {
    for (int i = 0; i < n; i++) {
        h[i] = b[i].hash;
        p[i] = b[i].parent;
        memcpy(t + i * BS, b[i].tokens, sizeof b[i].tokens);
    }
}

/* an asynchronous run: n_ok counts the leading verified blocks */
static void test_fetch(void) {
    const char *dir = case_dir("fetch");
    blk b[6];
    make_chain(b, 6, KVB, 2);
    kiln_disk_tier *dt = open_dir(dir);
    for (int i = 0; i < 6; i++)
        if (i != 3)
            CHECK(kiln_disk_tier_put(dt, b[i].hash, b[i].parent, b[i].tokens, b[i].kv,
                                     i == 1 ? b[i].state : NULL));
    kiln_disk_tier_flush(dt);
    uint64_t h[6], p[6];
    int32_t t[6 * BS];
    fetch_args(b, 6, h, p, t);

    kiln_disk_fetch *f = kiln_disk_tier_fetch(dt, h, p, t, 6);
    REQUIRE(f);
    wait_done(f);
    CHECK(f->n == 6 && f->n_ok == 3); /* block 3 is missing: the run stops there */
    for (int i = 0; i < 3; i++) {
        CHECK(memcmp(f->kv + i * KVB, b[i].kv, KVB) == 0);
        CHECK(f->has_state[i] == (i == 1));
    }
    CHECK(f->state && memcmp(f->state + SB, b[1].state, SB) == 0);
    kiln_disk_fetch_free(f);

    /* the run after the gap reads whole */
    f = kiln_disk_tier_fetch(dt, h + 4, p + 4, t + 4 * BS, 2);
    REQUIRE(f);
    wait_done(f);
    CHECK(f->n_ok == 2 && memcmp(f->kv + KVB, b[5].kv, KVB) == 0);
    kiln_disk_fetch_free(f);

    /* a corrupt middle block: n_ok stops, the file is removed and counted */
    FILE *fp = fopen(path_of(dt, b[1].hash), "r+b");
    REQUIRE(fp);
    fseek(fp, HDR + 5, SEEK_SET);
    fputc(0xff ^ b[1].kv[5], fp);
    fclose(fp);
    int w0 = n_warn;
    f = kiln_disk_tier_fetch(dt, h, p, t, 3);
    REQUIRE(f);
    wait_done(f);
    CHECK(f->n_ok == 1);
    CHECK(kiln_disk_tier_get_stats(dt).corrupt == 1 && n_warn == w0 + 1);
    CHECK(!file_exists(path_of(dt, b[1].hash)) && !kiln_disk_tier_has(dt, b[1].hash, NULL));
    kiln_disk_fetch_free(f);

    /* n == 0 is done at once; bad arguments give NULL */
    f = kiln_disk_tier_fetch(dt, NULL, NULL, NULL, 0);
    REQUIRE(f);
    CHECK(atomic_load(&f->done) && f->n_ok == 0);
    kiln_disk_fetch_free(f);
    CHECK(!kiln_disk_tier_fetch(dt, h, p, t, -1) && !kiln_disk_tier_fetch(NULL, h, p, t, 1));
    kiln_disk_fetch_free(NULL);

    /* freed before done: cancelled safely (ASan checks), whichever stage it is in */
    for (int k = 0; k < 200; k++) {
        kiln_disk_fetch *g = kiln_disk_tier_fetch(dt, h, p, t, 6);
        REQUIRE(g);
        if (k % 3 == 1) sleep_ms(0);
        kiln_disk_fetch_free(g);
    }
    /* done fetches outlive the tier */
    f = kiln_disk_tier_fetch(dt, h + 4, p + 4, t + 4 * BS, 2);
    kiln_disk_tier_close(dt); /* finishes it */
    CHECK(atomic_load(&f->done) && f->n_ok == 2);
    kiln_disk_fetch_free(f);
    free_chain(b, 6);
}

/* A dir holding blocks A (0) and B (1) of chain salt 3, written and closed. */
static void two_blocks(const char *dir, blk *b) {
    make_chain(b, 2, KVB, 3);
    kiln_disk_tier *dt = open_dir(dir);
    put_all(dt, b, 2, true);
    kiln_disk_tier_close(dt);
}

static void flip(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    REQUIRE(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

/* read of `asked` fails as corrupt: NOT_FOUND, one more corrupt, the file gone, one warning
 * naming the file and containing reason */
static void expect_rejected(kiln_disk_tier *dt, const blk *asked, const char *file_hash_path,
                            const char *reason, int64_t corrupt_before) {
    int w0 = n_warn;
    uint8_t kv[KVB], st[SB];
    bool got = true;
    CHECK(kiln_disk_tier_read(dt, asked->hash, asked->parent, asked->tokens, kv, st, &got, NULL) ==
          KILN_ERR_NOT_FOUND);
    CHECK(!got);
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    CHECKF(s.corrupt == corrupt_before + 1, "corrupt %" PRId64, s.corrupt);
    CHECK(!file_exists(file_hash_path));
    CHECK(!kiln_disk_tier_has(dt, asked->hash, NULL));
    CHECKF(n_warn == w0 + 1, "%d warnings", n_warn - w0);
    CHECKF(strstr(last_warn, file_hash_path) && strstr(last_warn, reason),
           "warning '%s', want '%s'", last_warn, reason);
    /* asked again: simply absent now */
    CHECK(kiln_disk_tier_read(dt, asked->hash, asked->parent, asked->tokens, kv, NULL, NULL,
                              NULL) == KILN_ERR_NOT_FOUND);
    CHECK(kiln_disk_tier_get_stats(dt).corrupt == corrupt_before + 1);
}

static void test_faults(void) {
    blk b[2];
    char pa[1024], pb[1024];
    struct {
        const char *name, *reason;
    } cases[] = {
        {"payload", "payload checksum"},
        {"state", "mismatch (checkpoint)"},
        {"header", "header checksum"},
        {"magic", "bad magic"},
        {"truncate", "truncated"},
        {"extend", "too long"},
        {"swap", "holds block"},
        {"model", "another model"},
        {"geometry", "another geometry"},
        {"tokens", "token 2"},
        {"parent", "parent"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *name = cases[c].name;
        char sub[64];
        snprintf(sub, sizeof sub, "fault-%s", name);
        const char *dir = case_dir(sub);
        two_blocks(dir, b);
        kiln_disk_tier_params p = params(dir);
        if (strcmp(name, "model") == 0) p.fingerprint ^= 1; /* same namespace, other model */
        if (strcmp(name, "geometry") == 0) p.kv_dim = 2 * KVD, p.n_layer = NL / 2;
        {
            kiln_disk_tier *tmp = open_dir(dir);
            kiln_disk_tier_path(tmp, b[0].hash, pa, sizeof pa);
            kiln_disk_tier_path(tmp, b[1].hash, pb, sizeof pb);
            kiln_disk_tier_close(tmp);
        }
        if (strcmp(name, "payload") == 0) flip(pa, HDR + 17);
        if (strcmp(name, "state") == 0) flip(pa, HDR + KVB + 3);
        if (strcmp(name, "header") == 0) flip(pa, 44); /* the parent hash */
        if (strcmp(name, "magic") == 0) flip(pa, 2);
        if (strcmp(name, "truncate") == 0) CHECK(truncate(pa, FILE1 - 1) == 0);
        if (strcmp(name, "extend") == 0) CHECK(truncate(pa, FILE1 + 1) == 0);
        if (strcmp(name, "swap") == 0) CHECK(rename(pb, pa) == 0); /* B's file under A's name */
        kiln_disk_tier *dt = open_p(&p);
        blk asked = b[0];
        if (strcmp(name, "tokens") == 0) asked.tokens[2]++;
        if (strcmp(name, "parent") == 0) asked.parent ^= 4;
        /* a size no block of this tier has is not reported by has, and still rejected on read */
        bool odd_size = strcmp(name, "truncate") == 0 || strcmp(name, "extend") == 0;
        CHECK(kiln_disk_tier_has(dt, b[0].hash, NULL) == !odd_size);
        kiln_disk_tier_stats s0 = kiln_disk_tier_get_stats(dt);
        expect_rejected(dt, &asked, pa, cases[c].reason, 0);
        kiln_disk_tier_stats s1 = kiln_disk_tier_get_stats(dt);
        CHECK(s1.files == s0.files - 1 && s1.reads == 0);
        if (strcmp(name, "swap") == 0) {
            /* B's own name is gone (renamed away): not found, not corrupt */
            uint8_t kv[KVB];
            CHECK(kiln_disk_tier_read(dt, b[1].hash, b[1].parent, b[1].tokens, kv, NULL, NULL,
                                      NULL) == KILN_ERR_NOT_FOUND);
            CHECK(kiln_disk_tier_get_stats(dt).corrupt == 1);
        } else if (strcmp(name, "model") != 0 && strcmp(name, "geometry") != 0) {
            CHECK(read_ok(dt, &b[1], true)); /* the other block is untouched */
            /* the rejected block can be written again */
            CHECK(kiln_disk_tier_put(dt, b[0].hash, b[0].parent, b[0].tokens, b[0].kv, NULL));
            kiln_disk_tier_flush(dt);
            CHECK(read_ok(dt, &b[0], false));
        }
        kiln_disk_tier_close(dt);
        free_chain(b, 2);
    }
}

/* temporary files are removed at open and never read; unknown names are left alone */
static void test_leftovers_and_names(void) {
    const char *dir = case_dir("leftover");
    blk b[3];
    two_blocks(dir, b);
    make_chain(b + 2, 1, KVB, 4);
    char p[1200];
    kiln_disk_tier *dt = open_dir(dir);
    const char *pc = path_of(dt, b[2].hash);
    kiln_disk_tier_close(dt);
    /* a complete, valid encoding of block C under a temporary name in C's subdirectory */
    char sub[1100];
    snprintf(sub, sizeof sub, "%.*s", (int)(strrchr(pc, '/') - pc), pc);
    mkdir(sub, 0755);
    kiln_disk_block_desc d = {FP,  NS, KILN_DTYPE_F16, NL,          KVD,        BS,
                              KVB, SB, b[2].hash,      b[2].parent, b[2].tokens};
    uint8_t enc[FILE1];
    REQUIRE(kiln_disk_block_encode(&d, b[2].kv, NULL, enc, sizeof enc) == FILE0);
    const char *junk[] = {"/.tmp-99999-0", "/.tmp-1-7", "/notes.txt", "/ABCDEF0123456789.kvb",
                          "/0123456789abcdef.kvb" /* valid hex, wrong subdirectory unless 01 */};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s%s", sub, junk[i]);
        FILE *f = fopen(p, "wb");
        REQUIRE(f);
        fwrite(enc, 1, i < 2 ? FILE0 : 10, f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/README", dir);
    FILE *f = fopen(p, "wb");
    fclose(f);
    snprintf(p, sizeof p, "%s/zz", dir);
    mkdir(p, 0755);
    CHECK(n_tmp_in(dir) == 2);

    dt = open_dir(dir);
    CHECK(n_tmp_in(dir) == 0);
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    bool wrong_sub_is_right = strncmp(strrchr(sub, '/') + 1, "01", 2) == 0;
    CHECK(s.files == 2 + (wrong_sub_is_right ? 1 : 0));
    CHECK(!kiln_disk_tier_has(dt, b[2].hash, NULL));
    uint8_t kv[KVB];
    CHECK(kiln_disk_tier_read(dt, b[2].hash, b[2].parent, b[2].tokens, kv, NULL, NULL, NULL) ==
          KILN_ERR_NOT_FOUND);
    CHECK(kiln_disk_tier_get_stats(dt).corrupt == 0);
    CHECK(read_ok(dt, &b[0], true) && read_ok(dt, &b[1], true));
    for (int i = 2; i < 5; i++) {
        snprintf(p, sizeof p, "%s%s", sub, junk[i]);
        CHECK(file_exists(p));
    }
    snprintf(p, sizeof p, "%s/README", dir);
    CHECK(file_exists(p));
    kiln_disk_tier_close(dt);
    free_chain(b, 3);
}

/* ---- kill -9 in the middle of writing ---- */

#define KILL_N   300
#define KILL_KVB 16384

/* The child's writes: short (the file grows in 1 KiB steps) and slow; the 500th call (about
 * the 29th file) never returns, so a half-written temporary file is certain to be there when
 * the parent kills the child. */
static ssize_t slow_write(int fd, const void *buf, size_t n) {
    static int calls;
    if (++calls >= 500)
        for (;;) pause();
    if (n > 1024) n = 1024;
    usleep(30);
    return write(fd, buf, n);
}

static void test_kill9(void) {
    const char *dir = case_dir("kill9");
    blk *b = calloc(KILL_N, sizeof *b);
    make_chain(b, KILL_N, KILL_KVB, 5);
    kiln_disk_tier_params p = params(dir);
    p.kv_bytes = KILL_KVB;
    p.write_fn = slow_write;
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        kiln_disk_tier *dt = NULL;
        if (kiln_disk_tier_open(&p, &dt, NULL) != KILN_OK) _exit(3);
        for (int i = 0; i < KILL_N; i++)
            kiln_disk_tier_put(dt, b[i].hash, b[i].parent, b[i].tokens, b[i].kv,
                               i % 3 ? NULL : b[i].state);
        kiln_disk_tier_flush(dt);
        _exit(4); /* not reached in time: the parent kills it first */
    }
    int seen = 0, tmps = 0;
    for (int i = 0; i < 20000 && (seen < 25 || tmps < 1); i++) {
        sleep_ms(1);
        seen = n_blocks_in(dir);
        tmps = n_tmp_in(dir);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
    int on_disk = n_blocks_in(dir);
    printf("kill -9: %d block files and %d temporary files left\n", on_disk, n_tmp_in(dir));
    CHECK(on_disk >= 25 && on_disk < KILL_N);
    CHECK(n_tmp_in(dir) == 1);

    p.write_fn = NULL;
    kiln_disk_tier *dt = open_p(&p);
    CHECK(n_tmp_in(dir) == 0);
    int ok = 0, bad = 0;
    uint8_t *kv = malloc(KILL_KVB);
    for (int i = 0; i < KILL_N; i++) {
        uint8_t st[SB];
        bool got = false;
        kiln_status s =
            kiln_disk_tier_read(dt, b[i].hash, b[i].parent, b[i].tokens, kv, st, &got, NULL);
        if (s == KILN_OK) {
            ok++;
            if (memcmp(kv, b[i].kv, KILL_KVB) != 0 || got != (i % 3 == 0) ||
                (got && memcmp(st, b[i].state, SB) != 0))
                bad++; /* read as valid with wrong content: must never happen */
        } else {
            CHECK(s == KILN_ERR_NOT_FOUND);
        }
    }
    free(kv);
    CHECKF(bad == 0, "%d blocks read back with wrong content", bad);
    CHECKF(ok == on_disk, "%d of %d files verified", ok, on_disk);
    /* renames are atomic: no half-written file was ever visible under a block name */
    CHECK(kiln_disk_tier_get_stats(dt).corrupt == 0);
    kiln_disk_tier_close(dt);
    free_chain(b, KILL_N);
    free(b);
}

/* ---- a full disk, injected through write_fn ---- */

static _Atomic int fail_errno;   /* 0: writes succeed */
static _Atomic long fail_budget; /* bytes that still succeed before failing */
static ssize_t inject_write(int fd, const void *buf, size_t n) {
    int e = atomic_load(&fail_errno);
    if (e) {
        long left = atomic_load(&fail_budget);
        if (left <= 0) {
            errno = e;
            return -1;
        }
        if ((long)n > left) n = (size_t)left;
        atomic_fetch_sub(&fail_budget, (long)n);
    }
    return write(fd, buf, n);
}

static bool wait_not_full(kiln_disk_tier *dt) {
    for (int i = 0; i < 5000; i++) {
        if (!kiln_disk_tier_get_stats(dt).disk_full) return true;
        sleep_ms(2);
    }
    return false;
}

static void test_disk_full(void) {
    const char *dir = case_dir("full");
    blk b[8];
    make_chain(b, 8, KVB, 6);
    kiln_disk_tier_params p = params(dir);
    p.write_fn = inject_write;
    p.retry_ms = 400;
    kiln_disk_tier *dt = open_p(&p);
    put_all(dt, b, 1, false);
    CHECK(kiln_disk_tier_get_stats(dt).writes == 1);

    /* the disk fills in the middle of block 1's file */
    atomic_store(&fail_budget, 100);
    atomic_store(&fail_errno, ENOSPC);
    int w0 = n_warn;
    CHECK(kiln_disk_tier_put(dt, b[1].hash, b[1].parent, b[1].tokens, b[1].kv, NULL));
    kiln_disk_tier_flush(dt);
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    CHECK(s.disk_full && s.dropped == 1 && s.writes == 1 && s.files == 1);
    CHECK(n_warn == w0 + 1 && strstr(last_warn, "full") && strstr(last_warn, dir));
    CHECK(!file_exists(path_of(dt, b[1].hash)) && !kiln_disk_tier_has(dt, b[1].hash, NULL));
    CHECK(n_tmp_in(dir) == 0 && n_blocks_in(dir) == 1);
    /* while full, puts are dropped at once (counted), reads still work */
    CHECK(!kiln_disk_tier_put(dt, b[2].hash, b[2].parent, b[2].tokens, b[2].kv, NULL));
    CHECK(kiln_disk_tier_get_stats(dt).dropped == 2);
    CHECK(read_ok(dt, &b[0], false));

    /* still full at the retry: paused again, no second warning */
    CHECK(wait_not_full(dt));
    CHECK(kiln_disk_tier_put(dt, b[3].hash, b[3].parent, b[3].tokens, b[3].kv, NULL));
    kiln_disk_tier_flush(dt);
    s = kiln_disk_tier_get_stats(dt);
    CHECK(s.disk_full && s.dropped == 3 && n_warn == w0 + 1 && n_tmp_in(dir) == 0);

    /* space comes back: the next retry resumes writing */
    atomic_store(&fail_errno, 0);
    CHECK(wait_not_full(dt));
    CHECK(kiln_disk_tier_put(dt, b[4].hash, b[4].parent, b[4].tokens, b[4].kv, b[4].state));
    CHECK(kiln_disk_tier_put(dt, b[1].hash, b[1].parent, b[1].tokens, b[1].kv, NULL));
    kiln_disk_tier_flush(dt);
    s = kiln_disk_tier_get_stats(dt);
    CHECK(!s.disk_full && s.writes == 3 && s.files == 3 && s.dropped == 3);
    CHECK(read_ok(dt, &b[4], true) && read_ok(dt, &b[1], false));
    CHECK(n_warn == w0 + 2 && strstr(last_warn, "resumed"));

    /* EDQUOT counts as full too */
    atomic_store(&fail_budget, 0);
    atomic_store(&fail_errno, EDQUOT);
    CHECK(kiln_disk_tier_put(dt, b[5].hash, b[5].parent, b[5].tokens, b[5].kv, NULL));
    kiln_disk_tier_flush(dt);
    CHECK(kiln_disk_tier_get_stats(dt).disk_full && n_tmp_in(dir) == 0);
    atomic_store(&fail_errno, 0);
    CHECK(wait_not_full(dt));

    /* another error (EIO) drops the block, logs once, and does not pause writes */
    atomic_store(&fail_errno, EIO);
    int w1 = n_warn;
    CHECK(kiln_disk_tier_put(dt, b[6].hash, b[6].parent, b[6].tokens, b[6].kv, NULL));
    CHECK(kiln_disk_tier_put(dt, b[7].hash, b[7].parent, b[7].tokens, b[7].kv, NULL));
    kiln_disk_tier_flush(dt);
    s = kiln_disk_tier_get_stats(dt);
    CHECK(!s.disk_full && s.dropped == 6 && n_warn == w1 + 1 && n_tmp_in(dir) == 0);
    CHECK(!kiln_disk_tier_has(dt, b[6].hash, NULL) && !kiln_disk_tier_has(dt, b[7].hash, NULL));
    atomic_store(&fail_errno, 0);
    kiln_disk_tier_close(dt);
    free_chain(b, 8);
}

/* ---- the size cap: least recently used first, and the order survives a restart ---- */

static void test_cap_lru(void) {
    const char *dir = case_dir("cap");
    blk b[6];
    make_chain(b, 6, KVB, 7);
    kiln_disk_tier_params p = params(dir);
    p.max_bytes = 3 * FILE0;
    kiln_disk_tier *dt = open_p(&p);
    put_all(dt, b, 3, false);         /* A B C */
    CHECK(read_ok(dt, &b[0], false)); /* touch A: now B is the least recent */
    put_all(dt, b + 3, 1, false);     /* D evicts B */
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    CHECK(s.evictions == 1 && s.files == 3 && s.bytes == 3 * FILE0);
    CHECK(!kiln_disk_tier_has(dt, b[1].hash, NULL) && !file_exists(path_of(dt, b[1].hash)));
    CHECK(kiln_disk_tier_has(dt, b[0].hash, NULL) && kiln_disk_tier_has(dt, b[2].hash, NULL) &&
          kiln_disk_tier_has(dt, b[3].hash, NULL));
    kiln_disk_tier_close(dt);

    /* restart: the order (C, A, D) comes back from the mtimes */
    dt = open_p(&p);
    put_all(dt, b + 4, 1, false); /* E evicts C */
    s = kiln_disk_tier_get_stats(dt);
    CHECK(s.evictions == 1 && s.files == 3);
    CHECK(!kiln_disk_tier_has(dt, b[2].hash, NULL));
    CHECK(kiln_disk_tier_has(dt, b[0].hash, NULL) && kiln_disk_tier_has(dt, b[3].hash, NULL) &&
          kiln_disk_tier_has(dt, b[4].hash, NULL));
    CHECK(read_ok(dt, &b[3], false)); /* order now A, E, D */
    kiln_disk_tier_close(dt);

    /* a smaller cap at open evicts at once, least recent first: A goes */
    p.max_bytes = 2 * FILE0;
    dt = open_p(&p);
    s = kiln_disk_tier_get_stats(dt);
    CHECK(s.evictions == 1 && s.files == 2 && !kiln_disk_tier_has(dt, b[0].hash, NULL));
    CHECK(kiln_disk_tier_has(dt, b[3].hash, NULL) && kiln_disk_tier_has(dt, b[4].hash, NULL));
    kiln_disk_tier_close(dt);

    /* a block whose file alone passes the cap is dropped */
    p.max_bytes = FILE0 + 1;
    dt = open_p(&p);
    CHECK(kiln_disk_tier_get_stats(dt).files == 1); /* and the cap evicted E at open */
    CHECK(!kiln_disk_tier_put(dt, b[5].hash, b[5].parent, b[5].tokens, b[5].kv, b[5].state));
    CHECK(kiln_disk_tier_get_stats(dt).dropped == 1);
    kiln_disk_tier_close(dt);
    free_chain(b, 6);
}

/* ---- the write-behind queue: a full one drops, reads go before writes ---- */

static _Atomic int gate_open, gate_entered;
/* holds the I/O thread inside its first write call until gate_open */
static ssize_t gated_write(int fd, const void *buf, size_t n) {
    atomic_store(&gate_entered, 1);
    while (!atomic_load(&gate_open)) usleep(200);
    return write(fd, buf, n);
}

static void test_queue(void) {
    const char *dir = case_dir("queue");
    blk b[4];
    make_chain(b, 4, KVB, 8);
    kiln_disk_tier_params p = params(dir);
    kiln_disk_tier *dt = open_p(&p);
    put_all(dt, b + 3, 1, false); /* D is on disk, for the fetch */
    kiln_disk_tier_close(dt);

    p.write_fn = gated_write;
    p.queue_max_bytes = (int64_t)(KVB + 4 * BS + 256); /* one block's copy, not two */
    atomic_store(&gate_open, 0);
    atomic_store(&gate_entered, 0);
    dt = open_p(&p);
    CHECK(kiln_disk_tier_put(dt, b[0].hash, b[0].parent, b[0].tokens, b[0].kv, NULL));
    for (int i = 0; i < 5000 && !atomic_load(&gate_entered); i++) sleep_ms(1);
    REQUIRE(atomic_load(&gate_entered)); /* the I/O thread holds A, the queue is empty */
    /* put never waits for the disk: B is queued, C finds the queue full and is dropped */
    CHECK(kiln_disk_tier_put(dt, b[1].hash, b[1].parent, b[1].tokens, b[1].kv, NULL));
    CHECK(!kiln_disk_tier_put(dt, b[2].hash, b[2].parent, b[2].tokens, b[2].kv, NULL));
    CHECK(kiln_disk_tier_get_stats(dt).dropped == 1);
    CHECK(!kiln_disk_tier_has(dt, b[1].hash, NULL)); /* queued is not on disk */
    /* a synchronous read does not wait for the I/O thread either */
    CHECK(read_ok(dt, &b[3], false));
    atomic_store(&gate_open, 1);
    kiln_disk_tier_flush(dt);
    CHECK(kiln_disk_tier_has(dt, b[0].hash, NULL) && kiln_disk_tier_has(dt, b[1].hash, NULL));
    CHECK(!kiln_disk_tier_has(dt, b[2].hash, NULL));
    kiln_disk_tier_close(dt);
    free_chain(b, 4);
}

/* reads before writes, pinned down: with writes B, C queued behind a running A, a fetch queued
 * last is done before B's first write call */
static _Atomic int order_calls;
static kiln_disk_fetch *_Atomic order_fetch;
static _Atomic int order_seen_done_at; /* write call index at which the fetch was first done */
static ssize_t order_write(int fd, const void *buf, size_t n) {
    int k = atomic_fetch_add(&order_calls, 1);
    atomic_store(&gate_entered, 1);
    while (!atomic_load(&gate_open)) usleep(200);
    kiln_disk_fetch *f = atomic_load(&order_fetch);
    if (f && atomic_load(&f->done) && atomic_load(&order_seen_done_at) < 0)
        atomic_store(&order_seen_done_at, k);
    return write(fd, buf, n);
}

static void test_reads_first(void) {
    const char *dir = case_dir("order");
    blk b[4];
    make_chain(b, 4, KVB, 9);
    kiln_disk_tier_params p = params(dir);
    kiln_disk_tier *dt = open_p(&p);
    put_all(dt, b + 3, 1, false);
    kiln_disk_tier_close(dt);
    p.write_fn = order_write;
    atomic_store(&gate_open, 0);
    atomic_store(&gate_entered, 0);
    atomic_store(&order_calls, 0);
    atomic_store(&order_seen_done_at, -1);
    dt = open_p(&p);
    CHECK(kiln_disk_tier_put(dt, b[0].hash, b[0].parent, b[0].tokens, b[0].kv, NULL));
    for (int i = 0; i < 5000 && !atomic_load(&gate_entered); i++) sleep_ms(1);
    CHECK(kiln_disk_tier_put(dt, b[1].hash, b[1].parent, b[1].tokens, b[1].kv, NULL));
    CHECK(kiln_disk_tier_put(dt, b[2].hash, b[2].parent, b[2].tokens, b[2].kv, NULL));
    kiln_disk_fetch *f = kiln_disk_tier_fetch(dt, &b[3].hash, &b[3].parent, b[3].tokens, 1);
    REQUIRE(f);
    atomic_store(&order_fetch, f);
    atomic_store(&gate_open, 1);
    kiln_disk_tier_flush(dt);
    wait_done(f);
    /* A's file takes 2 write calls (header, K and V): the fetch is done when B's first one
     * (call 2) begins; served after the writes, it would be seen at call 6 or never */
    int at = atomic_load(&order_seen_done_at);
    CHECKF(at == 2, "fetch first seen done at write call %d", at);
    CHECK(f->n_ok == 1);
    atomic_store(&order_fetch, NULL);
    kiln_disk_fetch_free(f);
    kiln_disk_tier_close(dt);
    free_chain(b, 4);
}

/* ---- the directory lock ---- */

static void test_lock(void) {
    const char *dir = case_dir("lock");
    kiln_disk_tier *dt = open_dir(dir);
    kiln_disk_tier_flush(dt);
    /* a second opener in this process is refused too */
    kiln_disk_tier_params p = params(dir);
    kiln_disk_tier *dt2 = NULL;
    kiln_error e = {0};
    CHECK(kiln_disk_tier_open(&p, &dt2, &e) == KILN_ERR_IO && !dt2);
    CHECK(strstr(e.message, "is in use by another kiln process") && strstr(e.message, dir));

    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        kiln_disk_tier *c = NULL;
        kiln_error ce = {0};
        kiln_status st = kiln_disk_tier_open(&p, &c, &ce);
        _exit(st == KILN_ERR_IO && !c && strstr(ce.message, "in use by another kiln process") ? 0
                                                                                              : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    kiln_disk_tier_close(dt);

    /* a child holding the lock: refused here until it exits, then fine */
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        kiln_disk_tier *c = NULL;
        char ok = kiln_disk_tier_open(&p, &c, NULL) == KILN_OK ? 'y' : 'n';
        ssize_t w = write(fds[1], &ok, 1);
        (void)w;
        sleep_ms(300);
        _exit(0); /* no close: process exit releases the lock */
    }
    char ok = 0;
    CHECK(read(fds[0], &ok, 1) == 1 && ok == 'y');
    CHECK(kiln_disk_tier_open(&p, &dt2, &e) == KILN_ERR_IO && !dt2);
    waitpid(pid, &status, 0);
    close(fds[0]);
    close(fds[1]);
    dt = open_p(&p);
    kiln_disk_tier_close(dt);
}

/* ---- bad parameters ---- */

static void expect_open_error(const kiln_disk_tier_params *p, kiln_status want, const char *text) {
    kiln_disk_tier *dt = (kiln_disk_tier *)1;
    kiln_error e = {0};
    kiln_status st = kiln_disk_tier_open(p, &dt, &e);
    CHECKF(st == want, "status %s, want %s (%s)", kiln_status_name(st), kiln_status_name(want),
           e.message);
    CHECK(dt == (kiln_disk_tier *)1); /* untouched */
    CHECKF(strstr(e.message, text), "message '%s' lacks '%s'", e.message, text);
}

static void test_bad_params(void) {
    const char *dir = case_dir("params");
    kiln_disk_tier_params p = params(dir);
    kiln_disk_tier *dt = NULL;
    CHECK(kiln_disk_tier_open(NULL, &dt, NULL) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_disk_tier_open(&p, NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);
    p.dir = NULL;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "cache dir");
    p.dir = "";
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "cache dir");
    p = params(dir);
    p.kv_bytes = 0;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "kv_bytes");
    p = params(dir);
    p.block_size = 0;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "block_size");
    p = params(dir);
    p.n_layer = 0;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "n_layer");
    p = params(dir);
    p.page_format = -1;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "page_format");
    p = params(dir);
    p.state_bytes = -1;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "state_bytes");
    p = params(dir);
    p.max_bytes = -1;
    expect_open_error(&p, KILN_ERR_INVALID_ARGUMENT, "max_bytes");
    CHECK(!file_exists(dir)); /* nothing was created for a bad call */

    /* the dir is a file, or lies under one */
    char file[600], under[700];
    snprintf(file, sizeof file, "%s/plain-file", root);
    FILE *f = fopen(file, "wb");
    fclose(f);
    p = params(file);
    expect_open_error(&p, KILN_ERR_IO, "not a directory");
    snprintf(under, sizeof under, "%s/sub/dir", file);
    p = params(under);
    expect_open_error(&p, KILN_ERR_IO, file);
    remove(file);

    /* several missing levels are created */
    char deep[700];
    snprintf(deep, sizeof deep, "%s/a/b/c/", dir);
    p = params(deep);
    dt = open_p(&p);
    kiln_disk_tier_close(dt);
    snprintf(deep, sizeof deep, "%s/a/b/c/lock", dir);
    CHECK(file_exists(deep));

    /* a relative dir is resolved at open: a later chdir does not move the tier */
    char cwd[1024];
    REQUIRE(getcwd(cwd, sizeof cwd));
    REQUIRE(chdir(dir) == 0);
    p = params("rel/dir");
    dt = open_p(&p);
    REQUIRE(chdir("/") == 0);
    blk b[1];
    make_chain(b, 1, KVB, 12);
    put_all(dt, b, 1, true);
    CHECK(read_ok(dt, &b[0], true));
    kiln_disk_tier_close(dt);
    REQUIRE(chdir(cwd) == 0);
    snprintf(deep, sizeof deep, "%s/rel/dir/lock", dir);
    CHECK(file_exists(deep) && n_blocks_in(dir) == 1);
    free_chain(b, 1);

    /* NULL-safe calls */
    CHECK(!kiln_disk_tier_put(NULL, 1, 2, NULL, NULL, NULL));
    CHECK(!kiln_disk_tier_has(NULL, 1, NULL));
    CHECK(kiln_disk_tier_read(NULL, 1, 2, NULL, NULL, NULL, NULL, NULL) ==
          KILN_ERR_INVALID_ARGUMENT);
    kiln_disk_tier_flush(NULL);
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(NULL);
    CHECK(s.files == 0 && !s.disk_full);
}

/* ---- the verifier on memory images: the format's own properties ---- */

static void test_verifier(void) {
    blk b[1];
    make_chain(b, 1, KVB, 10);
    kiln_disk_block_desc d = {FP,  NS, KILN_DTYPE_F16, NL,          KVD,        BS,
                              KVB, SB, b[0].hash,      b[0].parent, b[0].tokens};
    uint8_t enc[FILE1 + 8], kv[KVB], st[SB];
    CHECK(kiln_disk_block_encode(&d, b[0].kv, b[0].state, enc, FILE1 - 1) == 0); /* too small */
    REQUIRE(kiln_disk_block_encode(&d, b[0].kv, b[0].state, enc, sizeof enc) == FILE1);
    char path[600];
    snprintf(path, sizeof path, "%s/image.kvb", root);
    /* every single-byte change of the header is rejected, even resealed (seal fixes the
     * checksums, so the field checks themselves are exercised) */
    int rejected = 0, total = 0;
    for (int off = 0; off < HDR; off++) {
        for (int pass = 0; pass < 2; pass++) {
            uint8_t img[FILE1];
            memcpy(img, enc, FILE1);
            img[off] ^= 0x01;
            if (pass) kiln_disk_block_seal(img, FILE1);
            if (pass && memcmp(img, enc, FILE1) == 0) continue; /* a checksum byte, resealed */
            FILE *f = fopen(path, "wb");
            fwrite(img, 1, FILE1, f);
            fclose(f);
            int fd = open(path, O_RDONLY);
            char why[256];
            bool got;
            total++;
            if (kiln_disk_block_read_fd(fd, &d, kv, st, &got, why, sizeof why) != KILN_OK)
                rejected++;
            else
                fprintf(stderr, "accepted a change at offset %d (pass %d)\n", off, pass);
            close(fd);
        }
    }
    CHECKF(rejected == total, "%d of %d rejected", rejected, total);
    /* the intact image verifies, and seal leaves it unchanged */
    uint8_t img[FILE1];
    memcpy(img, enc, FILE1);
    kiln_disk_block_seal(img, FILE1);
    CHECK(memcmp(img, enc, FILE1) == 0);
    FILE *f = fopen(path, "wb");
    fwrite(enc, 1, FILE1, f);
    fclose(f);
    int fd = open(path, O_RDONLY);
    bool got = false;
    char why[256];
    CHECK(kiln_disk_block_read_fd(fd, &d, kv, st, &got, why, sizeof why) == KILN_OK && got);
    CHECK(memcmp(kv, b[0].kv, KVB) == 0 && memcmp(st, b[0].state, SB) == 0);
    /* a tier without checkpoints rejects a file with one (another geometry) */
    kiln_disk_block_desc d0 = d;
    d0.state_bytes = 0;
    CHECK(kiln_disk_block_read_fd(fd, &d0, kv, NULL, NULL, why, sizeof why) == KILN_ERR_FORMAT);
    CHECK(strstr(why, "checkpoint") != NULL);
    close(fd);
    remove(path);
    free_chain(b, 1);
}

/* ---- has/get_stats from another thread while the engine thread puts and reads ---- */

static _Atomic int stop_reader;
static void *poller(void *arg) {
    kiln_disk_tier *dt = arg;
    long n = 0;
    while (!atomic_load(&stop_reader)) {
        kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
        if (s.files < 0 || s.bytes < 0) abort();
        kiln_disk_tier_has(dt, (uint64_t)n * 0x9e3779b97f4a7c15ull, NULL);
        n++;
    }
    return NULL;
}

static void test_threads(void) {
    const char *dir = case_dir("threads");
    enum { N = 200 };
    blk *b = calloc(N, sizeof *b);
    make_chain(b, N, KVB, 11);
    kiln_disk_tier_params p = params(dir);
    p.max_bytes = 50 * FILE1;
    kiln_disk_tier *dt = open_p(&p);
    pthread_t th;
    atomic_store(&stop_reader, 0);
    REQUIRE(pthread_create(&th, NULL, poller, dt) == 0);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        kiln_disk_tier_put(dt, b[i].hash, b[i].parent, b[i].tokens, b[i].kv, b[i].state);
        if (i >= 10 && read_ok(dt, &b[i - 10], true)) ok++;
        if (i % 20 == 0) {
            uint64_t h[5], pa[5];
            int32_t t[5 * BS];
            fetch_args(b + (i >= 5 ? i - 5 : 0), 5, h, pa, t);
            kiln_disk_fetch *f = kiln_disk_tier_fetch(dt, h, pa, t, 5);
            if (i % 40 == 0) wait_done(f);
            kiln_disk_fetch_free(f);
        }
    }
    kiln_disk_tier_flush(dt);
    atomic_store(&stop_reader, 1);
    pthread_join(th, NULL);
    kiln_disk_tier_stats s = kiln_disk_tier_get_stats(dt);
    CHECK(s.corrupt == 0 && s.files <= 50 && s.bytes <= 50 * FILE1);
    CHECK(s.files + s.evictions + s.dropped == N);
    printf("threads: %d of %d reads behind the writer hit, %" PRId64 " evictions\n", ok, N - 10,
           s.evictions);
    kiln_disk_tier_close(dt);
    free_chain(b, N);
    free(b);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/kiln-test-disk-tier-XXXXXX");
    REQUIRE(mkdtemp(root));
    kiln_log_set_sink(sink, NULL);
    test_roundtrip_and_format();
    test_fetch();
    test_faults();
    test_leftovers_and_names();
    test_kill9();
    test_disk_full();
    test_cap_lru();
    test_queue();
    test_reads_first();
    test_lock();
    test_bad_params();
    test_verifier();
    test_threads();
    kiln_log_set_sink(NULL, NULL);
    rm_rf(root);
    return kiln_test_finish("test_disk_tier");
}
