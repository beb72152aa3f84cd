/* Work shared by the concurrency tests of the reference (test_concurrency.c)
 * and of the OpenCL device (test_concurrency_opencl.c): what the header's
 * thread-safety section allows, done from many threads at once.
 *
 * - Contexts on threads: each thread opens its own context and runs a small
 *   attention problem (forward and backward, a few rounds) on it; the
 *   outputs must be bit for bit those of the same problem run alone
 *   afterwards (every problem asks for deterministic results), so a race
 *   between contexts shows as a wrong bit even where ThreadSanitizer cannot
 *   see it (inside a vendor runtime).
 * - Per-thread errors: every thread makes a call that fails with a message
 *   naming a number of its own, waits until all threads have failed, and
 *   must then read its own message.
 *
 * Static functions in a header: two test files use them, and the test
 * harness library is not theirs to extend. */
#ifndef FA_CONCURRENCY_CASES_H
#define FA_CONCURRENCY_CASES_H

#include "flashattn.h"
#include "harness.h"
#include "planner.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CC_MAX_THREADS 16

/* Vendor runtimes first loaded by a worker thread, under AddressSanitizer:
 * LLVM (inside PoCL) gives that thread an alternate signal stack of its own,
 * which ASan, when the thread exits, unmaps as if it were its own and
 * aborts; the HIP runtime keeps per-thread objects it never frees. Neither
 * is this library's memory. (Hooks the sanitizer runtimes call when they
 * are linked in; inert otherwise.) */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "use_sigaltstack=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libamdhip64.so\n"; }

/* Threads wait at the gate until all are started, so that their first calls
 * overlap; cc_gate_meet then waits until every started thread got there. A
 * thread that failed to start is simply not expected (a barrier would hang). */
typedef struct cc_gate {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int open, expected, arrived;
} cc_gate;

#define CC_GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0}

static void cc_gate_wait(cc_gate *g) {
    pthread_mutex_lock(&g->lock);
    while (!g->open) pthread_cond_wait(&g->changed, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void cc_gate_open(cc_gate *g, int expected) {
    pthread_mutex_lock(&g->lock);
    g->open = 1;
    g->expected = expected;
    pthread_cond_broadcast(&g->changed);
    pthread_mutex_unlock(&g->lock);
}

static void cc_gate_meet(cc_gate *g) {
    pthread_mutex_lock(&g->lock);
    g->arrived++;
    pthread_cond_broadcast(&g->changed);
    while (g->arrived < g->expected) pthread_cond_wait(&g->changed, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

/* Runs fn on threads threads, thread t on (char *)args + t * size, each
 * waiting at gate (which the arguments point to) until all are started;
 * joins them. started[t] tells which ran. */
static void cc_on_threads(void *(*fn)(void *), void *args, size_t size, int threads, cc_gate *gate, int *started) {
    pthread_t tid[CC_MAX_THREADS];
    int count = 0;
    for (int t = 0; t < threads; t++) {
        started[t] = pthread_create(&tid[t], NULL, fn, (char *)args + (size_t)t * size) == 0;
        CHECK_MSG(started[t], "pthread_create failed for thread %d", t);
        count += started[t];
    }
    cc_gate_open(gate, count);
    for (int t = 0; t < threads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}
/* Distinct problems: the threads run different options side by side. */
#define CC_PROBLEMS 4

/* Problem p: small, packed, deterministic; each with other options. */
static fa_attention_desc cc_problem(int p) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1 + p % 2;
    d.seqlen_q = 48 + 16 * p;
    d.seqlen_k = 64;
    d.heads_q = 4;
    d.heads_kv = p == 2 ? 1 : p == 3 ? 2 : 4;
    d.head_dim = p == 1 ? 64 : 32;
    d.deterministic = 1;
    d.causal = p == 1;
    if (p == 2) {
        d.window_left = 8;
        d.window_right = 4;
    }
    if (p == 3) {
        d.dropout_p = 0.25f;
        d.dropout_seed = 1234;
    }
    return d;
}

/* Host tensors of one problem: inputs made from the problem's number, and
 * the outputs a run produced. */
enum { CC_Q, CC_K, CC_V, CC_DOUT, CC_INPUTS, CC_O = CC_INPUTS, CC_LSE, CC_DQ, CC_DK, CC_DV, CC_TENSORS };

typedef struct cc_run {
    fa_backend backend;
    int problem;
    int rounds;
    cc_gate *start; /* NULL: run at once */
    /* Results. */
    size_t bytes[CC_TENSORS];
    void *host[CC_TENSORS];
    char failure[512]; /* "" when every call succeeded */
    int rounds_differ; /* a later round gave other bits than the first */
} cc_run;

static void cc_fail(cc_run *r, const char *what, fa_status st) {
    if (!r->failure[0])
        snprintf(r->failure, sizeof r->failure, "%s: %s: %s", what, fa_status_string(st), fa_last_error());
}

#define CC_TRY(r, expr)                                                                     \
    do {                                                                                    \
        fa_status cc_st_ = (expr);                                                          \
        if (cc_st_ != FA_SUCCESS) cc_fail((r), #expr, cc_st_);                              \
    } while (0)

static void cc_run_free(cc_run *r) {
    for (int i = 0; i < CC_TENSORS; i++) free(r->host[i]);
    memset(r->host, 0, sizeof r->host);
}

/* Opens a context, runs the problem r->rounds times, keeps the first
 * round's outputs and compares the others with them, and closes all. */
static void cc_execute(cc_run *r) {
    fa_attention_desc d = cc_problem(r->problem);
    size_t q_bytes = (size_t)fa_attention_total_q(&d) * (size_t)d.heads_q * (size_t)d.head_dim * sizeof(float);
    size_t kv_bytes = (size_t)fa_attention_total_k(&d) * (size_t)d.heads_kv * (size_t)d.head_dim * sizeof(float);
    size_t lse_bytes = (size_t)fa_attention_total_q(&d) * (size_t)d.heads_q * sizeof(float);
    const size_t bytes[CC_TENSORS] = {q_bytes, kv_bytes, kv_bytes, q_bytes, q_bytes, lse_bytes, q_bytes, kv_bytes, kv_bytes};
    fa_rng rng;
    fa_rng_seed(&rng, 1000u + (unsigned)r->problem);
    for (int i = 0; i < CC_TENSORS; i++) {
        r->bytes[i] = bytes[i];
        r->host[i] = i < CC_INPUTS ? fa_test_random_tensor(&rng, FA_DTYPE_F32, (int64_t)(bytes[i] / sizeof(float)))
                                   : calloc(bytes[i], 1);
        if (!r->host[i]) {
            snprintf(r->failure, sizeof r->failure, "out of host memory");
            return;
        }
    }
    unsigned char *again = malloc(q_bytes > kv_bytes ? q_bytes : kv_bytes);
    if (!again) {
        snprintf(r->failure, sizeof r->failure, "out of host memory");
        return;
    }
    if (r->start) cc_gate_wait(r->start);

    fa_context ctx = NULL;
    fa_plan plan = NULL;
    fa_buffer buf[CC_TENSORS] = {NULL};
    CC_TRY(r, fa_context_create(r->backend, -1, &ctx));
    for (int i = 0; i < CC_TENSORS && ctx; i++) CC_TRY(r, fa_buffer_alloc(ctx, bytes[i], &buf[i]));
    for (int i = 0; i < CC_INPUTS && !r->failure[0]; i++) CC_TRY(r, fa_buffer_upload(buf[i], 0, r->host[i], bytes[i]));
    if (!r->failure[0]) CC_TRY(r, fa_plan_create(ctx, &d, &plan));
    for (int round = 0; round < r->rounds && !r->failure[0]; round++) {
        CC_TRY(r, fa_forward(plan, buf[CC_Q], buf[CC_K], buf[CC_V], buf[CC_O], buf[CC_LSE]));
        CC_TRY(r, fa_backward(plan, buf[CC_Q], buf[CC_K], buf[CC_V], buf[CC_O], buf[CC_LSE], buf[CC_DOUT], buf[CC_DQ],
                              buf[CC_DK], buf[CC_DV]));
        for (int i = CC_INPUTS; i < CC_TENSORS && !r->failure[0]; i++) {
            void *dst = round == 0 ? r->host[i] : again;
            CC_TRY(r, fa_buffer_download(buf[i], 0, dst, bytes[i]));
            if (round > 0 && !r->failure[0] && memcmp(again, r->host[i], bytes[i]) != 0) r->rounds_differ = 1;
        }
    }
    if (plan) CC_TRY(r, fa_plan_destroy(plan));
    for (int i = 0; i < CC_TENSORS; i++)
        if (buf[i]) CC_TRY(r, fa_buffer_free(buf[i]));
    if (ctx) CC_TRY(r, fa_context_destroy(ctx));
    free(again);
}

static void *cc_thread(void *arg) {
    cc_execute(arg);
    return NULL;
}

/* One problem, one round, at once on this thread. */
static void cc_run_alone(cc_run *r, fa_backend backend, int problem) {
    memset(r, 0, sizeof *r);
    r->backend = backend;
    r->problem = problem;
    r->rounds = 1;
    cc_execute(r);
}

/* threads contexts at once, then each problem alone: the same bits. */
static void cc_contexts_on_threads(fa_backend backend, int threads, int rounds) {
    if (threads > CC_MAX_THREADS) threads = CC_MAX_THREADS;
    cc_run runs[CC_MAX_THREADS], alone[CC_PROBLEMS];
    int started[CC_MAX_THREADS] = {0};
    cc_gate start = CC_GATE_INIT;
    for (int t = 0; t < threads; t++) {
        memset(&runs[t], 0, sizeof runs[t]);
        runs[t].backend = backend;
        runs[t].problem = t % CC_PROBLEMS;
        runs[t].rounds = rounds;
        runs[t].start = &start;
    }
    cc_on_threads(cc_thread, runs, sizeof runs[0], threads, &start, started);

    for (int p = 0; p < CC_PROBLEMS; p++) {
        cc_run_alone(&alone[p], backend, p);
        CHECK_MSG(!alone[p].failure[0], "problem %d alone: %s", p, alone[p].failure);
    }
    static const char *const names[CC_TENSORS] = {"q", "k", "v", "dout", "o", "lse", "dq", "dk", "dv"};
    for (int t = 0; t < threads; t++) {
        const cc_run *r = &runs[t], *ref = &alone[r->problem];
        if (!started[t]) continue;
        CHECK_MSG(!r->failure[0], "thread %d: %s", t, r->failure);
        CHECK_MSG(!r->rounds_differ, "thread %d: the rounds of one context gave different bits", t);
        if (r->failure[0] || ref->failure[0]) continue;
        for (int i = CC_INPUTS; i < CC_TENSORS; i++)
            CHECK_MSG(memcmp(r->host[i], ref->host[i], r->bytes[i]) == 0,
                      "thread %d (problem %d): %s differs from the problem run alone", t, r->problem, names[i]);
    }
    for (int t = 0; t < threads; t++) cc_run_free(&runs[t]);
    for (int p = 0; p < CC_PROBLEMS; p++) cc_run_free(&alone[p]);
}

/* The calls the header allows from any thread at any time, as a process's
 * first calls, from many threads at once; then a failing call per thread
 * (an index of its own on the backend), and each thread reads its own
 * message after all have failed. */
typedef struct cc_first {
    fa_backend backend;
    int index; /* the device index this thread's failing call names */
    cc_gate *gate;
    int count;
    fa_status status[FA_BACKEND_COUNT];
    fa_status failed;
    char message[512];
    fa_plan_info plan;
    fa_status planned;
} cc_first;

/* Devices described by hand (core/described_devices.c), one per thread. */
static fa_device_desc cc_described(int i) {
    return fa_described_device_get(i % fa_described_device_count())->desc;
}

static void *cc_first_thread(void *arg) {
    cc_first *f = arg;
    cc_gate_wait(f->gate);
    fa_device_count(&f->count);
    for (int b = 0; b < FA_BACKEND_COUNT; b++) {
        char reason[256];
        f->status[b] = fa_backend_get_status((fa_backend)b, reason, sizeof reason);
    }
    for (int i = 0; i < f->count; i++) {
        fa_device_info info;
        fa_device_get_info(i, &info);
    }
    fa_device_desc dev = cc_described(f->index);
    fa_attention_desc d = cc_problem(f->index % CC_PROBLEMS);
    f->planned = fa_plan_for_device(&dev, &d, &f->plan);
    char text[4096];
    fa_plan_info_format(&f->plan, text, sizeof text);

    fa_context ctx = NULL;
    f->failed = fa_context_create(f->backend, f->index, &ctx);
    if (ctx) fa_context_destroy(ctx);
    cc_gate_meet(f->gate);
    snprintf(f->message, sizeof f->message, "%s", fa_last_error());
    return NULL;
}

static void cc_first_calls_on_threads(fa_backend backend, int threads) {
    if (threads > CC_MAX_THREADS) threads = CC_MAX_THREADS;
    cc_first f[CC_MAX_THREADS];
    int started[CC_MAX_THREADS] = {0};
    cc_gate gate = CC_GATE_INIT;
    for (int t = 0; t < threads; t++) {
        memset(&f[t], 0, sizeof f[t]);
        f[t].backend = backend;
        f[t].index = 7000 + t;
        f[t].gate = &gate;
    }
    cc_on_threads(cc_first_thread, f, sizeof f[0], threads, &gate, started);

    /* Every thread saw the same devices and backends as this one now sees. */
    int count_now = -1;
    CHECK_OK(fa_device_count(&count_now));
    for (int t = 0; t < threads; t++) {
        if (!started[t]) continue;
        CHECK_MSG(f[t].count == count_now, "thread %d counted %d devices, %d now", t, f[t].count, count_now);
        for (int b = 0; b < FA_BACKEND_COUNT; b++) {
            char reason[256];
            fa_status now = fa_backend_get_status((fa_backend)b, reason, sizeof reason);
            CHECK_MSG(f[t].status[b] == now, "thread %d: backend %s was %s, now %s", t, fa_backend_name((fa_backend)b),
                      fa_status_string(f[t].status[b]), fa_status_string(now));
        }
        /* The planner from any thread: the plan of the same inputs here. */
        fa_device_desc dev = cc_described(f[t].index);
        fa_attention_desc d = cc_problem(f[t].index % CC_PROBLEMS);
        fa_plan_info plan;
        CHECK_OK(f[t].planned);
        CHECK_OK(fa_plan_for_device(&dev, &d, &plan));
        CHECK_MSG(memcmp(&plan, &f[t].plan, sizeof plan) == 0, "thread %d planned differently", t);
        /* Its own failure, not another thread's (where the backend is
         * missing, the caller skips). */
        if (f[t].failed == FA_ERR_BACKEND_UNAVAILABLE) continue;
        char own[32];
        snprintf(own, sizeof own, "%d", f[t].index);
        CHECK_MSG(f[t].failed == FA_ERR_DEVICE_NOT_FOUND, "thread %d: device %d gave %s", t, f[t].index,
                  fa_status_string(f[t].failed));
        CHECK_MSG(strstr(f[t].message, own) != NULL, "thread %d read \"%s\", which does not name its device %s", t,
                  f[t].message, own);
    }
}

/* ------------------------------------------------------------------------ */
/* Cache directories                                                        */

#define CC_PATH_CAP 512

typedef struct cc_entry {
    char name[256];
    ino_t inode;
} cc_entry;

/* The files in dir (up to cap of them into out, which may be NULL), and how
 * many of them are a store's temporary files; -1 if dir cannot be read. */
static int cc_list_entries(const char *dir, cc_entry *out, int cap, int *temporaries) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    *temporaries = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (strstr(e->d_name, ".tmp.")) (*temporaries)++;
        if (out && n < cap) {
            char path[2 * CC_PATH_CAP];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            snprintf(out[n].name, sizeof out[n].name, "%s", e->d_name);
            out[n].inode = stat(path, &st) == 0 ? st.st_ino : 0;
        }
        n++;
    }
    closedir(d);
    return n;
}

/* A fresh directory root/cache (not created: the processes race to create
 * it) named by FLASHATTN_CACHE_DIR; 0 (with a failed check) on failure. */
static int cc_fresh_cache(char *root, char *dir) {
    snprintf(root, CC_PATH_CAP, "/tmp/fa-conc-XXXXXX");
    if (!mkdtemp(root)) {
        CHECK_MSG(0, "no scratch cache directory: %s", strerror(errno));
        return 0;
    }
    snprintf(dir, CC_PATH_CAP, "%.400s/cache", root); /* root is 19 characters */
    int ok = setenv("FLASHATTN_CACHE_DIR", dir, 1) == 0;
    CHECK(ok);
    return ok;
}

static void cc_remove_cache(const char *root, const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[2 * CC_PATH_CAP];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
    rmdir(root);
}

/* ------------------------------------------------------------------------ */
/* Child processes                                                          */

#define CC_CHILD_ENV "FA_CONCURRENCY_CHILD"

extern char **environ;

/* Runs case_name of this test executable in a new process, with
 * FA_CONCURRENCY_CHILD=index in its environment (and this process's
 * environment otherwise). A new program rather than a fork: this process
 * may hold threads of a vendor runtime, which a fork would not carry over.
 * Returns the child's pid, or -1 (with a failed check). */
static pid_t cc_spawn_child(const char *case_name, int index) {
    size_t n = 0;
    while (environ[n]) n++;
    char **envp = calloc(n + 2, sizeof *envp);
    char setting[64];
    CHECK(envp != NULL);
    if (!envp) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], CC_CHILD_ENV "=", sizeof CC_CHILD_ENV) != 0) envp[k++] = environ[i];
    snprintf(setting, sizeof setting, "%s=%d", CC_CHILD_ENV, index);
    envp[k++] = setting;
    envp[k] = NULL;
    char *argv[] = {(char *)"/proc/self/exe", (char *)case_name, NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp);
    free(envp);
    CHECK_MSG(rc == 0, "posix_spawn: %s", strerror(rc));
    return rc == 0 ? pid : -1;
}

/* The index a child was started with, or -1 in a process run directly. */
static int cc_child_index(void) {
    const char *v = getenv(CC_CHILD_ENV);
    return v ? atoi(v) : -1;
}

/* Runs count children of case_name at once (indices 0 to count - 1) and
 * waits for them; codes[i] is child i's harness exit status: 0 passed, 77
 * skipped, else failed (-1 when it did not start or exit). */
static void cc_run_children(const char *case_name, int count, int *codes) {
    pid_t pids[CC_MAX_THREADS];
    for (int i = 0; i < count; i++) pids[i] = cc_spawn_child(case_name, i);
    for (int i = 0; i < count; i++) {
        int status = 0;
        codes[i] = -1;
        if (pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status))
            codes[i] = WEXITSTATUS(status);
    }
}

#endif
