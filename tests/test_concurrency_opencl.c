/* Concurrency on the OpenCL device (PoCL in CI): the runtime loaded by many
 * threads at once, contexts of their own on threads, and the kernel cache
 * filled by processes compiling the same kernels at the same time. CI runs
 * these (label "concurrency", cmake/tsan.cmake) under ThreadSanitizer.
 * fa-test-labels: device */
#include "concurrency_cases.h"
#include "harness.h"

#define THREADS 4
#define PROCS 3
#define CHILD_SKIPPED 77

static const char *opencl_missing(void) {
    static char reason[256];
    fa_status st = fa_backend_get_status(FA_BACKEND_OPENCL, reason, sizeof reason);
    return st == FA_SUCCESS ? NULL : reason;
}

FA_TEST(first_calls_from_many_threads) {
    /* The runtime is loaded by the threads themselves: ask afterwards. */
    cc_first_calls_on_threads(FA_BACKEND_OPENCL, THREADS);
    if (opencl_missing()) FA_SKIP(opencl_missing());
}

FA_TEST(contexts_on_threads) {
    if (opencl_missing()) FA_SKIP(opencl_missing());
    cc_contexts_on_threads(FA_BACKEND_OPENCL, THREADS, 2);
}

/* ------------------------------------------------------------------------ */
/* The kernel cache filled by processes                                     */

#define MAX_ENTRIES 64

/* One of the processes (started by kcache_filled_by_processes): compiles,
 * or loads, and runs two problems. */
static void kcache_child(void) {
    if (cc_child_index() < 0) FA_SKIP("runs as a child of kcache_filled_by_processes");
    if (opencl_missing()) FA_SKIP(opencl_missing());
    for (int p = 0; p < 2; p++) {
        cc_run r;
        cc_run_alone(&r, FA_BACKEND_OPENCL, p);
        CHECK_MSG(!r.failure[0], "process %d, problem %d: %s", cc_child_index(), p, r.failure);
        cc_run_free(&r);
    }
}

FA_TEST(kcache_filled_by_processes) {
    char root[CC_PATH_CAP], dir[CC_PATH_CAP];
    if (!cc_fresh_cache(root, dir)) return;
    /* The measured bandwidth is cached too; only kernels are wanted here. */
    CHECK(setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1) == 0);

    int codes[PROCS], skipped = 0;
    cc_run_children("kcache_child", PROCS, codes);
    for (int i = 0; i < PROCS; i++) {
        skipped += codes[i] == CHILD_SKIPPED;
        CHECK_MSG(codes[i] == 0 || codes[i] == CHILD_SKIPPED, "process %d failed (exit status %d)", i, codes[i]);
    }
    if (skipped == PROCS) {
        cc_remove_cache(root, dir);
        FA_SKIP("OpenCL is not available");
    }

    /* Whole entries only, then a run in this process that loads every
     * kernel from them: a hit stores nothing, so no entry is replaced. */
    cc_entry before[MAX_ENTRIES], after[MAX_ENTRIES];
    int temporaries = 0;
    int n = cc_list_entries(dir, before, MAX_ENTRIES, &temporaries);
    CHECK_MSG(n > 0, "the processes left no cache entry in %s", dir);
    CHECK(temporaries == 0);
    cc_run cached[2], fresh[2];
    for (int p = 0; p < 2; p++) {
        cc_run_alone(&cached[p], FA_BACKEND_OPENCL, p);
        CHECK_MSG(!cached[p].failure[0], "problem %d from the cache: %s", p, cached[p].failure);
    }
    int m = cc_list_entries(dir, after, MAX_ENTRIES, &temporaries);
    CHECK_MSG(m == n, "%d cache entries before the cached run, %d after", n, m);
    for (int i = 0; i < n && m == n; i++) {
        int same = 0;
        for (int j = 0; j < m; j++)
            same |= strcmp(before[i].name, after[j].name) == 0 && before[i].inode == after[j].inode;
        CHECK_MSG(same, "entry %s was rewritten: a kernel missed the cache", before[i].name);
    }

    /* The cached kernels compute what freshly compiled ones do, bit for
     * bit (the problems ask for deterministic results). */
    CHECK(setenv("FLASHATTN_CACHE_DIR", "off", 1) == 0);
    for (int p = 0; p < 2; p++) {
        cc_run_alone(&fresh[p], FA_BACKEND_OPENCL, p);
        CHECK_MSG(!fresh[p].failure[0], "problem %d compiled: %s", p, fresh[p].failure);
        for (int i = CC_INPUTS; i < CC_TENSORS && !fresh[p].failure[0] && !cached[p].failure[0]; i++)
            CHECK_MSG(memcmp(fresh[p].host[i], cached[p].host[i], fresh[p].bytes[i]) == 0,
                      "problem %d: output %d differs between cached and compiled kernels", p, i);
        cc_run_free(&fresh[p]);
        cc_run_free(&cached[p]);
    }
    cc_remove_cache(root, dir);
}

FA_TEST_MAIN(FA_CASE(first_calls_from_many_threads), FA_CASE(contexts_on_threads),
             FA_CASE(kcache_filled_by_processes), FA_CASE(kcache_child))
