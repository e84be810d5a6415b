/* A minimal test harness: CHECK records failures and keeps going; main returns the
 * failure count so CTest sees it. */
#ifndef LM_TEST_H
#define LM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int lm_test_failures;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
            lm_test_failures++;                                                         \
        }                                                                               \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                           \
    do {                                                                                \
        double lm_a_ = (a), lm_b_ = (b);                                                \
        if (!(fabs(lm_a_ - lm_b_) <= (tol))) {                                          \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g (tol %g)\n",\
                    __FILE__, __LINE__, #a, lm_a_, #b, lm_b_, (double)(tol));           \
            lm_test_failures++;                                                         \
        }                                                                               \
    } while (0)

#define TEST_MAIN_END()                                                                 \
    do {                                                                                \
        if (lm_test_failures) fprintf(stderr, "%d check(s) failed\n", lm_test_failures);\
        return lm_test_failures ? 1 : 0;                                                \
    } while (0)

/* Exit code CTest maps to "skipped" (SKIP_RETURN_CODE). */
#define LM_TEST_SKIP 77

/* A whole file as a NUL-terminated string (free it); NULL if it cannot be read. */
static inline char *test_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

#endif
