/* A small test harness. Each test file defines cases with FA_TEST(name) and
 * ends with FA_TEST_MAIN(...) listing them; CMake registers every case as its
 * own ctest test "<file>.<case>" by scanning for FA_TEST( in the source.
 *
 *   ./test_x            runs every case
 *   ./test_x case       runs one case
 * A case that calls FA_SKIP(reason) exits with 77, which ctest reports as
 * skipped (never as passed). */
#ifndef FA_TEST_HARNESS_H
#define FA_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FA_TEST(name) static void name(void)

typedef struct fa_test_case {
    const char *name;
    void (*fn)(void);
} fa_test_case;

extern int fa_test_failures;
extern int fa_test_checks;
extern const char *fa_test_skip_reason;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        fa_test_checks++;                                                                  \
        if (!(cond)) {                                                                     \
            fa_test_failures++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        fa_test_checks++;                                                                  \
        if (!(cond)) {                                                                     \
            fa_test_failures++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* expr must return the expected fa_status; prints the library's message. */
#define CHECK_STATUS(expr, expected)                                                       \
    do {                                                                                   \
        fa_status check_got_ = (expr);                                                     \
        fa_test_checks++;                                                                  \
        if (check_got_ != (expected)) {                                                    \
            fa_test_failures++;                                                            \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__,         \
                    __LINE__, #expr, fa_status_string(check_got_),                         \
                    fa_status_string(expected), fa_last_error());                          \
        }                                                                                  \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, FA_SUCCESS)

/* expr must fail with status and a message naming the argument (needle). */
#define CHECK_FAILS(expr, status, needle)                                                   \
    do {                                                                                    \
        CHECK_STATUS(expr, status);                                                         \
        CHECK_MSG(strstr(fa_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"",   \
                  fa_last_error(), needle);                                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                              \
    do {                                                                                   \
        double check_a_ = (a), check_b_ = (b);                                             \
        fa_test_checks++;                                                                  \
        if (!(fabs(check_a_ - check_b_) <= (tol))) {                                       \
            fa_test_failures++;                                                            \
            fprintf(stderr, "%s:%d: %s = %.17g, %s = %.17g, differ by more than %g\n",     \
                    __FILE__, __LINE__, #a, check_a_, #b, check_b_, (double)(tol));        \
        }                                                                                  \
    } while (0)

#define FA_SKIP(reason)                                                                    \
    do {                                                                                   \
        fa_test_skip_reason = (reason);                                                    \
        return;                                                                            \
    } while (0)

int fa_test_run(const fa_test_case *cases, int count, int argc, char **argv);

#define FA_TEST_MAIN(...)                                                                  \
    int fa_test_failures = 0;                                                              \
    int fa_test_checks = 0;                                                                \
    const char *fa_test_skip_reason = NULL;                                                \
    int main(int argc, char **argv) {                                                      \
        static const fa_test_case cases_[] = {__VA_ARGS__};                                \
        return fa_test_run(cases_, (int)(sizeof(cases_) / sizeof(cases_[0])), argc, argv); \
    }

#define FA_CASE(name) {#name, name}

#endif
