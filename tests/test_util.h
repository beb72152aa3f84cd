/* Helpers shared by the tests: random tensors, error norms. */
#ifndef FA_TEST_UTIL_H
#define FA_TEST_UTIL_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* xoshiro-style generator: deterministic per seed, independent of libc. */
typedef struct fa_rng {
    uint64_t s[2];
} fa_rng;

void fa_rng_seed(fa_rng *rng, uint64_t seed);
uint64_t fa_rng_next(fa_rng *rng);
/* Uniform in [lo, hi). */
double fa_rng_uniform(fa_rng *rng, double lo, double hi);
/* Standard normal (Box-Muller). */
double fa_rng_normal(fa_rng *rng);

/* count elements of dtype, each drawn from N(0, 1) then rounded to dtype. */
void *fa_test_random_tensor(fa_rng *rng, fa_dtype dtype, int64_t count);
/* Fill count elements with NaN (the poison every output gets before a run). */
void fa_test_poison(void *data, fa_dtype dtype, int64_t count);

/* ||a - b|| / ||b|| over count elements; returns INFINITY if any element of
 * a is NaN or infinite (where b is finite). */
double fa_test_rel_error(const void *a, const void *b, fa_dtype dtype, int64_t count);

/* ||central differences of loss - grad|| / ||grad|| over the n entries of
 * x (those with covered[i] set; covered NULL: all), each moved by +-step
 * and restored; INFINITY where grad is all zero. */
double fa_test_fd_error(double *x, const double *grad, int64_t n, const uint8_t *covered, double step,
                        double (*loss)(void *ctx), void *ctx);

/* got against ref element by element: entries where ref is NaN or
 * infinite must match it exactly (NaN for NaN), and got must be finite
 * where ref is; mismatched counts the entries that break this. Over the
 * finite entries, the norms of got - ref and of ref. */
typedef struct fa_test_diff {
    double diff_norm, ref_norm;
    int64_t finite, mismatched;
} fa_test_diff;

fa_test_diff fa_test_compare(const void *got, const void *ref, fa_dtype dtype, int64_t count);
/* Relative plus absolute tolerance: no mismatch and ||got - ref|| <=
 * tol (||ref|| + sqrt(n)), an RMS error of tol on outputs of the inputs'
 * unit scale, so that a reference of zeros (the gradients of one-token
 * sequences) passes a device's rounding. */
int fa_test_within(const fa_test_diff *diff, double tol);

/* A kernel cache of the process's own: FLASHATTN_CACHE_DIR pointed at a new
 * folder under /tmp, made on the first call (before the library's first
 * look at the variable) and removed at exit with the entries in it. Returns
 * the folder, or NULL (errno set) when it cannot be made. */
const char *fa_test_own_cache(void);
/* How many finished entries (*.bin) the kernel cache in dir holds. */
int fa_test_cache_entries(const char *dir);

/* Runs the tool named (a program beside the running one, e.g. "fa-info")
 * with args (NULL-terminated, without the program name), its stdout and
 * stderr captured into out (truncated to out_size, NUL-terminated); killed
 * after timeout_s seconds. Returns its exit status; -1 when it could not
 * run, was killed or timed out. */
int fa_test_run_tool(const char *tool, const char *const *args, char *out, size_t out_size, double timeout_s);
/* The same for a program by path or by name on PATH (a compiler); -1
 * also for more than 126 arguments. */
int fa_test_run_program(const char *program, const char *const *args, char *out, size_t out_size,
                        double timeout_s);

/* A KV-cache step's descriptor for the compile tests: heads_kv 2 and
 * heads_q 2 x group, a window of (500, 0) where window is set, 1024 pages
 * where page_size is, softcap 30 where softcap is, slopes (heads_q of
 * them) where alibi is; k_new and v_new in the dtype where tokens are
 * appended. */
typedef struct fa_test_kv_shape {
    fa_dtype dtype;
    int dim, group, seqlen_q, seqlen_k, batch;
    int page_size, seqlen_new, rotary_dim, interleaved, softcap, alibi, causal, window;
} fa_test_kv_shape;

fa_attention_desc fa_test_kv_desc(const fa_test_kv_shape *s, const float *slopes);

#endif
