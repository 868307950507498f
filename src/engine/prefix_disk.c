/* prefix_disk.c - placeholder until the disk tier lands (no disk tier: every call is a no-op). */
#include "engine/engine_internal.h"
#include "util/error.h"

kiln_status kiln_engine_prefix_disk_open(kiln_engine *e, uint64_t fingerprint, kiln_error *err);
void kiln_engine_prefix_disk_close(kiln_engine *e);

kiln_status kiln_engine_prefix_disk_open(kiln_engine *e, uint64_t fingerprint, kiln_error *err) {
    (void)e;
    (void)fingerprint;
    return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "cache_dir: the disk tier is not built yet");
}
void kiln_engine_prefix_disk_close(kiln_engine *e) { (void)e; }
void kiln_engine_prefix_disk_stats(const kiln_engine *e, kiln_engine_stats *out) { (void)e; (void)out; }
bool kiln_engine_prefix_load_done(const kiln_seq *s) { (void)s; return true; }
void kiln_engine_prefix_cancel_load(kiln_engine *e, kiln_seq *s) { (void)e; (void)s; }
bool kiln_engine_prefix_start_load(kiln_engine *e, kiln_seq *s, int32_t first) { (void)e; (void)s; (void)first; return false; }
void kiln_engine_prefix_finish_load(kiln_engine *e, kiln_seq *s) { (void)e; (void)s; }
