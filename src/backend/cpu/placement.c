/*
 * placement.c - the CPU backend's weight placement (kiln_cpu_place_weights, cpu_backend.h):
 * owned huge-page copies of the matrices, F16 packed into KILN_LAYOUT_F16_R64, with the mapped
 * pages they came from released.
 */
#include "backend/cpu/cpu_backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "util/mapped_file.h"
#include "util/threadpool.h"

/* state of kiln_place_weights' passes over the matrices */
typedef struct place_ctx {
    const kiln_mapped_file *const *maps; /* the file mappings the weights may lie in */
    size_t n_maps;
    kiln_placement_alloc_fn alloc; /* memory for the copies, owned by `owner` */
    void *owner;
    kiln_threadpool *tp; /* created on the first F16 matrix packed */
    size_t total;        /* bytes of the copies, each rounded up to 64 */
    char *arena;         /* one huge-page-hinted block for all copies, or NULL */
    size_t arena_left;
} place_ctx;

/* The file mapping (GGUF file, safetensors shard or llama2.c checkpoint) that holds
 * [p, p + n), or NULL for owned memory. */
static const kiln_mapped_file *source_map(const place_ctx *c, const void *p, size_t n) {
    for (size_t i = 0; i < c->n_maps; i++)
        if (kiln_mapped_file_contains(c->maps[i], p, n)) return c->maps[i];
    return NULL;
}

/* 64-byte aligned memory for one copy: from the arena, else its own allocation (NULL when
 * that fails) */
static void *place_alloc(place_ctx *c, size_t bytes) {
    size_t r = (bytes + 63) & ~(size_t)63;
    if (c->arena && r <= c->arena_left) {
        void *p = c->arena;
        c->arena += r, c->arena_left -= r;
        return p;
    }
    char *raw = c->alloc(c->owner, bytes + 63);
    if (!raw) return NULL;
    void *dst = (void *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    kiln_advise_hugepages(dst, bytes);
    return dst;
}

/* bytes of w's copy: the packed layout for F16, the row layout for every other dtype */
static size_t placed_bytes(const kiln_mat *w) {
    return kiln_cpu_layout_bytes(w->dtype == KILN_DTYPE_F16 ? KILN_LAYOUT_F16_R64
                                                            : KILN_LAYOUT_ROWS,
                                 w->dtype, w->n_out, w->n_in);
}

/* Move one matrix into owned, 64-byte aligned memory with transparent huge pages: F16 packed
 * into the CPU backend's KILN_LAYOUT_F16_R64 (the outer-product kernels, backend/cpu/cpu.h),
 * other dtypes copied as they are (a 16-sequence Q4_0 decode step ran 1.08x faster with its
 * weights in huge pages than read through the 4 KiB pages of the mapped file: A/B pairs on a
 * 2-core Zen 5, where one sequence gained nothing). The mapped pages of the source are then
 * released. A matrix whose copy cannot be allocated stays where it is (it works there too). */
static void place_mat(place_ctx *c, kiln_mat *w) {
    size_t bytes = placed_bytes(w);
    if (bytes == 0 || bytes > SIZE_MAX - 63) return;
    void *dst = place_alloc(c, bytes);
    if (!dst) return;
    size_t src_bytes = kiln_cpu_layout_bytes(KILN_LAYOUT_ROWS, w->dtype, w->n_out, w->n_in);
    if (w->dtype == KILN_DTYPE_F16) {
        if (!c->tp && kiln_physical_cores() > 1) { /* packing is memory-bound: every core */
            kiln_error perr;
            if (kiln_threadpool_create(kiln_physical_cores(), &c->tp, &perr) != KILN_OK)
                c->tp = NULL;
        }
        kiln_cpu_pack_f16_r64(c->tp, w->n_out, w->n_in, w->data, dst);
        w->layout = KILN_LAYOUT_F16_R64;
    } else {
        memcpy(dst, w->data, bytes);
    }
    /* drop the source's mapped pages (owned sources, i.e. F16 GPT-2 copies, stay) */
    kiln_mapped_file_release(source_map(c, w->data, src_bytes), w->data, src_bytes);
    w->data = dst;
}

static void add_placed_size(place_ctx *c, kiln_mat *w) {
    size_t b = placed_bytes(w);
    b = b > SIZE_MAX - 63 ? SIZE_MAX : (b + 63) & ~(size_t)63;
    c->total = b > SIZE_MAX - c->total ? SIZE_MAX : c->total + b;
}

typedef void (*mat_visit_fn)(place_ctx *c, kiln_mat *w);

/* F16 matrices (packed wherever they are) and matrices still in a file mapping (owned copies,
 * such as GPT-2's transposed weights, are not copied again) */
static void visit_mat(place_ctx *c, kiln_mat *w, mat_visit_fn visit) {
    if (!w->data || w->layout != KILN_LAYOUT_ROWS || w->n_out <= 0 || w->n_in <= 0) return;
    if (w->dtype == KILN_DTYPE_F16 ||
        source_map(c, w->data,
                   kiln_cpu_layout_bytes(KILN_LAYOUT_ROWS, w->dtype, w->n_out, w->n_in)))
        visit(c, w);
}

/* visit(c, mat) for every matrix of the list, in order */
static void each_mat(place_ctx *c, kiln_mat *const *mats, size_t n_mats, mat_visit_fn visit) {
    for (size_t i = 0; i < n_mats; i++)
        if (mats[i]) visit_mat(c, mats[i], visit);
}

/* env KILN_REPACK=0 keeps every weight in the mapped file (read once) */
static bool g_repack = true;
static pthread_once_t g_repack_once = PTHREAD_ONCE_INIT;
static void repack_init(void) {
    const char *e = getenv("KILN_REPACK");
    if (e && strcmp(e, "0") == 0) g_repack = false;
}

void kiln_cpu_place_weights(kiln_mat *const *mats, size_t n_mats, const kiln_mapped_file *const *maps,
                        size_t n_maps, kiln_placement_alloc_fn alloc, void *owner) {
    pthread_once(&g_repack_once, repack_init);
    if (!g_repack) return;
    place_ctx c = {maps, n_maps, alloc, owner, NULL, 0, NULL, 0};
    each_mat(&c, mats, n_mats, add_placed_size);
    size_t avail = kiln_mem_available();
    if (c.total == 0 || (avail > 0 && c.total > avail / 4 * 3)) return;
    /* one block, 2 MiB aligned, so small matrices (MoE experts) get huge pages too and the
     * process one mapping instead of one per matrix; per-matrix copies if it cannot be had */
    const size_t huge = (size_t)2 << 20;
    char *raw = c.total <= SIZE_MAX - huge ? alloc(owner, c.total + huge) : NULL;
    if (raw) {
        c.arena = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
        c.arena_left = c.total;
        kiln_advise_hugepages(c.arena, c.total);
    }
    each_mat(&c, mats, n_mats, place_mat);
    kiln_threadpool_destroy(c.tp);
}
