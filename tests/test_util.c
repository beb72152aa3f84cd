#include "test_util.h"

#include "dtype.h"

#include <dirent.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fa_rng_seed(fa_rng *rng, uint64_t seed) {
    rng->s[0] = splitmix64(&seed);
    rng->s[1] = splitmix64(&seed);
}

uint64_t fa_rng_next(fa_rng *rng) {
    /* xoroshiro128+ */
    uint64_t s0 = rng->s[0], s1 = rng->s[1];
    uint64_t result = s0 + s1;
    s1 ^= s0;
    rng->s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    rng->s[1] = (s1 << 37) | (s1 >> 27);
    return result;
}

double fa_rng_uniform(fa_rng *rng, double lo, double hi) {
    double u = (double)(fa_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

double fa_rng_normal(fa_rng *rng) {
    double u1 = fa_rng_uniform(rng, 0.0, 1.0);
    double u2 = fa_rng_uniform(rng, 0.0, 1.0);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void *fa_test_random_tensor(fa_rng *rng, fa_dtype dtype, int64_t count) {
    void *data = malloc((size_t)count * fa_dtype_size(dtype) + 1);
    if (!data) return NULL;
    for (int64_t i = 0; i < count; i++) fa_store_elem(data, dtype, i, fa_rng_normal(rng));
    return data;
}

void fa_test_poison(void *data, fa_dtype dtype, int64_t count) {
    for (int64_t i = 0; i < count; i++) fa_store_elem(data, dtype, i, NAN);
}

double fa_test_rel_error(const void *a, const void *b, fa_dtype dtype, int64_t count) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < count; i++) {
        double x = fa_load_elem(a, dtype, i), y = fa_load_elem(b, dtype, i);
        if (isfinite(y) && !isfinite(x)) return INFINITY;
        if (!isfinite(y)) continue;
        num += (x - y) * (x - y);
        den += y * y;
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

fa_test_diff fa_test_compare(const void *got, const void *ref, fa_dtype dtype, int64_t count) {
    fa_test_diff d = {0.0, 0.0, 0, 0};
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < count; i++) {
        const double a = fa_load_elem(got, dtype, i), b = fa_load_elem(ref, dtype, i);
        if (!isfinite(b)) {
            d.mismatched += !(a == b || (isnan(a) && isnan(b)));
            continue;
        }
        if (!isfinite(a)) {
            d.mismatched++;
            continue;
        }
        diff2 += (a - b) * (a - b);
        ref2 += b * b;
        d.finite++;
    }
    d.diff_norm = sqrt(diff2);
    d.ref_norm = sqrt(ref2);
    return d;
}

int fa_test_within(const fa_test_diff *diff, double tol) {
    return diff->mismatched == 0 && diff->diff_norm <= tol * (diff->ref_norm + sqrt((double)diff->finite));
}

static char own_cache[64];

/* The cache's entries lie flat in its folder. */
static void remove_own_cache(void) {
    DIR *d = opendir(own_cache);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", own_cache, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(own_cache);
}

const char *fa_test_own_cache(void) {
    if (own_cache[0]) return own_cache;
    snprintf(own_cache, sizeof own_cache, "/tmp/fa-test-cache-XXXXXX");
    if (!mkdtemp(own_cache)) {
        own_cache[0] = '\0';
        return NULL;
    }
    atexit(remove_own_cache);
    return setenv("FLASHATTN_CACHE_DIR", own_cache, 1) == 0 ? own_cache : NULL;
}

int fa_test_cache_entries(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strstr(e->d_name, ".bin") != NULL && strstr(e->d_name, ".tmp") == NULL;
    closedir(d);
    return n;
}

/* The running program's folder, where the build puts the tools too. */
static int own_folder(char *out, size_t size) {
    ssize_t n = readlink("/proc/self/exe", out, size - 1);
    if (n <= 0) return -1;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

int fa_test_run_tool(const char *tool, const char *const *args, char *out, size_t out_size, double timeout_s) {
    char path[4096];
    if (out_size) out[0] = '\0';
    if (own_folder(path, sizeof path) || strlen(path) + strlen(tool) + 2 > sizeof path) return -1;
    strcat(path, "/");
    strcat(path, tool);
    return fa_test_run_program(path, args, out, out_size, timeout_s);
}

int fa_test_run_program(const char *program, const char *const *args, char *out, size_t out_size,
                        double timeout_s) {
    if (out_size) out[0] = '\0';
    char *argv[128];
    int argc = 0;
    argv[argc++] = (char *)program;
    for (; args && *args; args++) {
        /* Never a silently shortened command line. */
        if (argc >= (int)(sizeof argv / sizeof argv[0]) - 1) return -1;
        argv[argc++] = (char *)*args;
    }
    argv[argc] = NULL;
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execvp(program, argv);
        _exit(127);
    }
    close(fds[1]);
    size_t used = 0;
    int timed_out = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        const double spent = (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
        const double left = timeout_s - spent;
        if (left <= 0) {
            timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        char chunk[4096];
        ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n && used + 1 < out_size; i++) out[used++] = chunk[i];
        if (out_size) out[used] = '\0';
    }
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || timed_out || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

double fa_test_fd_error(double *x, const double *grad, int64_t n, const uint8_t *covered, double step,
                        double (*loss)(void *ctx), void *ctx) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (covered && !covered[i]) continue;
        const double saved = x[i];
        x[i] = saved + step;
        const double up = loss(ctx);
        x[i] = saved - step;
        const double down = loss(ctx);
        x[i] = saved;
        const double fd = (up - down) / (2 * step);
        num += (fd - grad[i]) * (fd - grad[i]);
        den += grad[i] * grad[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

fa_attention_desc fa_test_kv_desc(const fa_test_kv_shape *s, const float *slopes) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = s->dtype;
    if (s->seqlen_new) d.k_new.dtype = d.v_new.dtype = s->dtype;
    d.batch = s->batch;
    d.head_dim = s->dim;
    d.heads_kv = 2;
    d.heads_q = 2 * s->group;
    d.seqlen_q = s->seqlen_q;
    d.seqlen_k = s->seqlen_k;
    d.causal = s->causal;
    if (s->window) {
        d.window_left = 500;
        d.window_right = 0;
    }
    d.kv_cache = 1;
    d.page_size = s->page_size;
    d.num_pages = s->page_size ? 1024 : 0;
    d.seqlen_new = s->seqlen_new;
    d.rotary_dim = s->rotary_dim;
    d.rotary_interleaved = s->interleaved;
    d.softcap = s->softcap ? 30.0f : 0.0f;
    d.alibi_slopes = s->alibi ? slopes : NULL;
    return d;
}
