/*
 * The draft sources' pure parts (issue 18): prompt lookup (kiln_ngram_propose) and a client
 * prediction's alignment (kiln_pred_align_*), on hand-made sequences whose answers are worked
 * out in the comments. The accounting cases are those the issue names: a full match, a
 * one-token edit in the middle, a prediction longer than the output, an empty prediction and an
 * unrelated text.
 */
#include <string.h>

#include "engine/spec.h"
#include "test.h"

/* Feed out[0..n) to a fresh alignment over pred; returns accepted, *j_out the final j. */
static int32_t align(const int32_t *pred, int32_t n_pred, const int32_t *out, int32_t n,
                     int32_t *j_out) {
    kiln_pred_align a;
    kiln_pred_align_init(&a, pred, n_pred);
    for (int32_t i = 1; i <= n; i++) kiln_pred_align_push(&a, out, i);
    if (j_out) *j_out = a.j;
    return a.accepted;
}

static void test_ngram(void) {
    int32_t d[8];
    /* 1 2 3 4 5 1 2 3: the last 3-gram "1 2 3" occurred at [0,3) -> drafts 4 5 1 2 3 */
    int32_t t1[] = {1, 2, 3, 4, 5, 1, 2, 3};
    int32_t n = kiln_ngram_propose(t1, 8, 1, 4, d, 8);
    CHECKF(n == 5 && d[0] == 4 && d[1] == 5 && d[2] == 1 && d[4] == 3, "ngram: n %d d0 %d", n,
           d[0]);
    /* cap 2 */
    n = kiln_ngram_propose(t1, 8, 1, 4, d, 2);
    CHECK(n == 2 && d[0] == 4 && d[1] == 5);
    /* the latest occurrence wins: 7 9 | 7 8 | 7 -> 1-gram "7" latest earlier at index 2 -> 8 7 */
    int32_t t2[] = {7, 9, 7, 8, 7};
    n = kiln_ngram_propose(t2, 5, 1, 4, d, 8);
    CHECKF(n == 2 && d[0] == 8 && d[1] == 7, "ngram latest: n %d d0 %d", n, d[0]);
    /* no repeat: nothing */
    int32_t t3[] = {1, 2, 3, 4};
    CHECK(kiln_ngram_propose(t3, 4, 1, 4, d, 8) == 0);
    /* nmin 2: "4" alone would match in 4 1 4 but no 2-gram does */
    int32_t t4[] = {4, 1, 4};
    CHECK(kiln_ngram_propose(t4, 3, 2, 4, d, 8) == 0);
    CHECK(kiln_ngram_propose(t4, 3, 1, 4, d, 8) == 2 && d[0] == 1);
    /* degenerate arguments */
    CHECK(kiln_ngram_propose(t1, 1, 1, 4, d, 8) == 0);
    CHECK(kiln_ngram_propose(t1, 8, 1, 4, d, 0) == 0);
    CHECK(kiln_ngram_propose(NULL, 8, 1, 4, d, 8) == 0);
}

static void test_prediction(void) {
    int32_t j, d[8];
    /* full match: every token takes the next index */
    int32_t p1[] = {10, 11, 12, 13, 14, 15};
    CHECK(align(p1, 6, p1, 6, &j) == 6 && j == 6);
    /* one-token edit in the middle: 10 11 99 13 14 15. 99 != pred[2] and occurs nowhere: j
     * stays 2 (rejected so far: 12). 13 != pred[2]; the 2-gram "99 13" is absent, the 1-gram
     * "13" is pred[3] (q = 4 >= j + 1): re-aligned, j = 4; then 14, 15 follow. Accepted 5 of 6. */
    int32_t o2[] = {10, 11, 99, 13, 14, 15};
    CHECK(align(p1, 6, o2, 6, &j) == 5 && j == 6);
    /* drafts after the edit token: j stayed at 2, so they are pred[2..] */
    kiln_pred_align a;
    kiln_pred_align_init(&a, p1, 6);
    for (int i = 1; i <= 3; i++) kiln_pred_align_push(&a, o2, i);
    CHECK(kiln_pred_align_drafts(&a, d, 8) == 4 && d[0] == 12);
    CHECK(kiln_pred_align_drafts(&a, d, 2) == 2 && d[1] == 13);
    /* prediction longer than the output: 4 accepted, 2 never reached (rejected) */
    CHECK(align(p1, 6, p1, 4, &j) == 4 && j == 4);
    /* empty prediction: nothing accepted, nothing to draft */
    CHECK(align(p1, 0, p1, 4, &j) == 0 && j == 0);
    kiln_pred_align_init(&a, p1, 0);
    CHECK(kiln_pred_align_drafts(&a, d, 8) == 0);
    /* unrelated text: no token of it occurs in the prediction */
    int32_t o5[] = {1, 2, 3, 4, 5, 6};
    CHECK(align(p1, 6, o5, 6, &j) == 0 && j == 0);
    /* a deletion: the output skips 12 13: 10 11 14 15. 14 != pred[2]; "11 14" is absent, "14"
     * is pred[4]: j = 5; 15 follows. Accepted 4. */
    int32_t o6[] = {10, 11, 14, 15};
    CHECK(align(p1, 6, o6, 4, &j) == 4 && j == 6);
    /* an insertion: 10 11 77 12 13: 77 absent (j stays 2), then 12 == pred[2]. Accepted 5. */
    int32_t o7[] = {10, 11, 77, 12, 13, 14, 15};
    CHECK(align(p1, 6, o7, 7, &j) == 6 && j == 6);
    /* the longest n-gram decides, not the nearest 1-gram: pred 5 6 7 1 5 6 8, output 5 6 8.
     * 8 != pred[2] (7); "5 6 8" occurs as pred[4..7): q = 7 -> accepted 3 */
    int32_t p8[] = {5, 6, 7, 1, 5, 6, 8};
    int32_t o8[] = {5, 6, 8};
    CHECK(align(p8, 7, o8, 3, &j) == 3 && j == 7);
    /* re-alignment never goes back: pred 1 2 3, output 1 2 3 1 2 3 -> 3 accepted, j = 3 */
    int32_t p9[] = {1, 2, 3};
    int32_t o9[] = {1, 2, 3, 1, 2, 3};
    CHECK(align(p9, 3, o9, 6, &j) == 3 && j == 3);
}

int main(void) {
    test_ngram();
    test_prediction();
    if (kiln_test_failures) {
        fprintf(stderr, "test_spec_sources: %d check(s) failed\n", kiln_test_failures);
        return 1;
    }
    printf("test_spec_sources: all checks passed\n");
    return 0;
}
