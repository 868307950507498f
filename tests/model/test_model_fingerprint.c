/*
 * kiln_model_fingerprint (model_fingerprint.c), the model part of the prefix cache's
 * namespace and of the disk tier's file headers: equal for the same weights loaded twice or
 * from a byte-identical copy in another directory; different for another model, another
 * quantization of the same model, and a copy with one byte changed inside a sampled region
 * (the first 64 KiB); an error, not a value, when the file is gone.
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "model/model.h"
#include "test.h"

static kiln_model *load(const char *path) {
    kiln_model *m = NULL;
    kiln_error err = {0};
    kiln_model_params mp = {0};
    if (kiln_model_load(path, &mp, &m, &err) != KILN_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.message);
        exit(1);
    }
    return m;
}

static uint64_t fp_of(const char *path) {
    kiln_model *m = load(path);
    uint64_t fp = 0;
    kiln_error err = {0};
    CHECKF(kiln_model_fingerprint(m, &fp, &err) == KILN_OK, "%s: %s", path, err.message);
    kiln_model_free(m);
    return fp;
}

static void copy_file(const char *from, const char *to, long flip_at) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    REQUIRE(in && out);
    char buf[1 << 16];
    size_t n;
    long off = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (flip_at >= off && flip_at < off + (long)n) buf[flip_at - off] ^= 0x01;
        REQUIRE(fwrite(buf, 1, n, out) == n);
        off += (long)n;
    }
    fclose(in);
    fclose(out);
}

int main(void) {
    const char *stories = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(stories);
    char a[512], b[512], xs[512], q8[512];
    snprintf(xs, sizeof xs, "%s", kiln_test_shared("models/llama2xs-260K/llama2xs-f32.gguf"));
    snprintf(q8, sizeof q8, "%s", kiln_test_shared("models/llama2xs-260K/llama2xs-Q8_0.gguf"));
    kiln_test_require_file(xs);
    kiln_test_require_file(q8);
    uint64_t s1 = fp_of(stories), s2 = fp_of(stories);
    CHECKF(s1 == s2, "the same file twice: %016llx vs %016llx", (unsigned long long)s1,
           (unsigned long long)s2);
    uint64_t fxs = fp_of(xs), fq8 = fp_of(q8);
    CHECK(fxs != s1 && fq8 != s1 && fq8 != fxs);

    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/kiln-test-fp-%d", (int)getpid());
    REQUIRE(mkdir(dir, 0700) == 0);
    snprintf(a, sizeof a, "%s/stories260K-f32.gguf", dir);
    copy_file(stories, a, -1);
    CHECKF(fp_of(a) == s1, "a byte-identical copy in another directory differs");
    /* a changed weight byte near the end of the first 64 KiB (past the GGUF header, which
     * only describes the tensors) */
    snprintf(b, sizeof b, "%s/b/stories260K-f32.gguf", dir);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/b", dir);
    REQUIRE(mkdir(sub, 0700) == 0);
    copy_file(stories, b, 60000);
    uint64_t fb = fp_of(b);
    CHECKF(fb != s1, "one weight byte changed inside a sample, same fingerprint");
    /* the file removed after loading: an error naming it */
    kiln_model *m = load(b);
    unlink(b);
    uint64_t fp = 0;
    kiln_error err = {0};
    kiln_status st = kiln_model_fingerprint(m, &fp, &err);
    CHECKF(st == KILN_ERR_IO && strstr(err.message, "stories260K-f32.gguf"),
           "fingerprint of a deleted file: status %d, '%s'", (int)st, err.message);
    kiln_model_free(m);
    CHECK(kiln_model_fingerprint(NULL, &fp, &err) == KILN_ERR_INVALID_ARGUMENT);
    unlink(a);
    rmdir(sub);
    rmdir(dir);
    if (kiln_test_failures) return 1;
    printf("test_model_fingerprint: all checks passed\n");
    return 0;
}
