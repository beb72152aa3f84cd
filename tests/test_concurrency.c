/* Concurrency on the reference device and in the kernel cache: what the
 * header allows from several threads, and the cache filled by several
 * processes at once. CI runs these (label "concurrency", cmake/tsan.cmake)
 * under ThreadSanitizer; each case runs in a process of its own, so the
 * threads of a case make the process's first calls into the library. */
#include "concurrency_cases.h"
#include "harness.h"
#include "kcache.h"
#include "test_util.h"

#include <stdint.h>

#define THREADS 8

FA_TEST(first_calls_from_many_threads) { cc_first_calls_on_threads(FA_BACKEND_REFERENCE, THREADS); }

FA_TEST(reference_contexts_on_threads) { cc_contexts_on_threads(FA_BACKEND_REFERENCE, THREADS, 3); }

/* ------------------------------------------------------------------------ */
/* The kernel cache filled by processes                                     */

#define PROCS 4
#define PROC_ROUNDS 30

/* Every process stores one key that all of them share (each its own
 * payload) and one key of its own, again and again, loading both between
 * stores. */
typedef struct proc_keys {
    fa_kcache_key shared, own[PROCS];
    char own_options[PROCS][16];
    unsigned char *payload[PROCS];
    size_t size[PROCS];
} proc_keys;

static int make_keys(proc_keys *k) {
    memset(k, 0, sizeof *k);
    const fa_kcache_key base = {"test", "kernel source text", 18, "", "device", "driver"};
    k->shared = base;
    fa_rng rng;
    fa_rng_seed(&rng, 77);
    for (int i = 0; i < PROCS; i++) {
        k->own[i] = base;
        snprintf(k->own_options[i], sizeof k->own_options[i], "-DOWN=%d", i);
        k->own[i].options = k->own_options[i];
        k->size[i] = 30000 + 977 * (size_t)i;
        k->payload[i] = malloc(k->size[i]);
        if (!k->payload[i]) return 0;
        for (size_t b = 0; b < k->size[i]; b++) k->payload[i][b] = (unsigned char)fa_rng_next(&rng);
    }
    return 1;
}

static void free_keys(proc_keys *k) {
    for (int i = 0; i < PROCS; i++) free(k->payload[i]);
}

/* Which payload a load returned: its index, -1 for a miss, -2 for bytes
 * that are no payload at all. */
static int loaded(const proc_keys *k, const fa_kcache_key *key) {
    void *data = NULL;
    size_t size = 0;
    if (fa_kcache_load(key, &data, &size) != FA_SUCCESS) return -1;
    int which = -2;
    for (int i = 0; i < PROCS; i++)
        if (size == k->size[i] && memcmp(data, k->payload[i], size) == 0) which = i;
    free(data);
    return which;
}

/* One of the processes (started by kcache_filled_by_processes). */
static void kcache_child(void) {
    int self = cc_child_index();
    if (self < 0 || self >= PROCS) FA_SKIP("runs as a child of kcache_filled_by_processes");
    proc_keys k;
    CHECK(make_keys(&k));
    for (int r = 0; r < PROC_ROUNDS; r++) {
        CHECK_OK(fa_kcache_store(&k.shared, k.payload[self], k.size[self]));
        CHECK_OK(fa_kcache_store(&k.own[self], k.payload[self], k.size[self]));
        /* Another process may be renaming its entry into place: the load
         * sees one whole payload, never a mix. */
        CHECK(loaded(&k, &k.shared) >= 0);
        CHECK(loaded(&k, &k.own[self]) == self);
    }
    free_keys(&k);
}

FA_TEST(kcache_filled_by_processes) {
    char root[CC_PATH_CAP], dir[CC_PATH_CAP];
    if (!cc_fresh_cache(root, dir)) return;
    proc_keys k;
    CHECK(make_keys(&k));

    int codes[PROCS];
    cc_run_children("kcache_child", PROCS, codes);
    for (int i = 0; i < PROCS; i++) CHECK_MSG(codes[i] == 0, "process %d failed (exit status %d)", i, codes[i]);

    /* One entry per key, whole, and no temporary file left behind. */
    int temporaries = 0;
    CHECK(cc_list_entries(dir, NULL, 0, &temporaries) == PROCS + 1);
    CHECK(temporaries == 0);
    CHECK(loaded(&k, &k.shared) >= 0);
    for (int i = 0; i < PROCS; i++) CHECK_MSG(loaded(&k, &k.own[i]) == i, "key of process %d", i);
    free_keys(&k);
    cc_remove_cache(root, dir);
}

FA_TEST_MAIN(FA_CASE(first_calls_from_many_threads), FA_CASE(reference_contexts_on_threads),
             FA_CASE(kcache_filled_by_processes), FA_CASE(kcache_child))
