#include "harness.h"

#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs the selected cases; exit status 0 all passed, 1 any failed, 77 the
 * (single) selected case skipped. */
int fa_test_run(const fa_test_case *cases, int count, int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0, skipped = 0, ran = 0;
    for (int i = 0; i < count; i++) {
        if (only && strcmp(only, cases[i].name) != 0) continue;
        ran++;
        int failures_before = fa_test_failures;
        int checks_before = fa_test_checks;
        fa_test_skip_reason = NULL;
        double t0 = now_seconds();
        cases[i].fn();
        double dt = now_seconds() - t0;
        int case_failures = fa_test_failures - failures_before;
        int case_checks = fa_test_checks - checks_before;
        if (case_failures) {
            failed++;
            printf("FAIL %s (%d of %d checks failed, %.2f s)\n", cases[i].name, case_failures,
                   case_checks, dt);
        } else if (fa_test_skip_reason) {
            skipped++;
            printf("SKIP %s: %s\n", cases[i].name, fa_test_skip_reason);
        } else if (case_checks == 0) {
            failed++;
            printf("FAIL %s: made no checks\n", cases[i].name);
        } else {
            passed++;
            printf("ok   %s (%d checks, %.2f s)\n", cases[i].name, case_checks, dt);
        }
    }
    if (only && ran == 0) {
        fprintf(stderr, "no test case named %s\n", only);
        return 2;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed) return 1;
    if (skipped && passed == 0) return 77;
    return 0;
}
