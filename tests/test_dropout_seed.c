/* fa_plan_set_dropout_seed on every backend present: a plan given a new
 * seed and offset computes, bit for bit, what a plan created with them
 * computes (forward and backward, deterministic mode, fp32 and fp16, fused
 * and standard attention); going back to the first seed gives the first
 * results again; and a plan that differs only in its seed compiles nothing:
 * the kernel cache gains no entry. (Argument checks are in test_api.c.)
 *
 * fa-test-labels: device
 *
 * A case skips where its backend is missing or cannot run its algorithm. */
#include "call_runner.h"
#include "harness.h"
#include "test_util.h"

#include "flashattn.h"

#include <errno.h>
#include <stdint.h>

/* Offsets above 2^32 reach the key as well as the counter. */
static const uint64_t seed_a = 0x0123456789abcdefull, offset_a = 0x0000000700000003ull;
static const uint64_t seed_b = 42u, offset_b = 0x0000000100000010ull;

static const char *cache_dir;
static char skip_reason[600];

static fa_attention_desc seeded_desc(fa_dtype dt, fa_algorithm algo, uint64_t seed, uint64_t offset) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = 33;
    d.seqlen_k = 47;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 32;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = seed;
    d.dropout_offset = offset;
    d.algorithm = algo;
    d.deterministic = 1;
    return d;
}

/* Both passes of plan on the buffers, downloaded into out. */
static int run(fa_plan plan, const call_buffers *b, const call_problem *p, call_host *out) {
    CHECK_OK(call_forward(plan, b));
    CHECK_OK(call_backward(plan, b));
    return call_download(b, p, out);
}

/* 1 when the dtype ran; 0 when the backend cannot run the algorithm (the
 * reason then in skip_reason) or a check failed. */
static int reseed_matches_new_plan(fa_context ctx, fa_dtype dt, fa_algorithm algo) {
    const char *what = fa_dtype_name(dt);
    fa_attention_desc da = seeded_desc(dt, algo, seed_a, offset_a), db = seeded_desc(dt, algo, seed_b, offset_b);
    fa_plan a = NULL, b = NULL;
    fa_status st = fa_plan_create(ctx, &da, &a);
    if (st == FA_ERR_UNSUPPORTED || st == FA_ERR_BACKEND_UNAVAILABLE) {
        snprintf(skip_reason, sizeof skip_reason, "%s: %s", fa_status_string(st), fa_last_error());
        printf("  %s not run: %s\n", what, skip_reason);
        return 0;
    }
    CHECK_MSG(st == FA_SUCCESS, "%s: plan of the first seed: %s (%s)", what, fa_status_string(st), fa_last_error());
    const int entries = fa_test_cache_entries(cache_dir);
    CHECK_OK(fa_plan_create(ctx, &db, &b));
    const int after = fa_test_cache_entries(cache_dir);
    CHECK_MSG(after == entries, "%s: a plan differing only in its seed compiled again (%d cache entries, then %d)",
              what, entries, after);
    call_problem p;
    call_problem_init(&p, &db, 77);
    call_buffers buf;
    call_host first, other, reseeded, back;
    memset(&first, 0, sizeof first);
    memset(&other, 0, sizeof other);
    memset(&reseeded, 0, sizeof reseeded);
    memset(&back, 0, sizeof back);
    int ok = a && b && call_buffers_init(&buf, ctx, &p);
    if (ok && run(a, &buf, &p, &first) && run(b, &buf, &p, &other)) {
        CHECK_MSG(!call_host_equal(&p, &first, &other), "%s: two seeds gave the same results", what);
        CHECK_OK(fa_plan_set_dropout_seed(a, seed_b, offset_b));
        if (run(a, &buf, &p, &reseeded))
            CHECK_MSG(call_host_equal(&p, &reseeded, &other),
                      "%s: the reseeded plan differs from a plan created with that seed", what);
        CHECK_OK(fa_plan_set_dropout_seed(a, seed_a, offset_a));
        if (run(a, &buf, &p, &back))
            CHECK_MSG(call_host_equal(&p, &back, &first), "%s: the first seed again gave other results", what);
        /* Equal results could still both be wrong: the seeded plan against
         * the reference (fp32, where the tolerance is tight for both
         * algorithms). */
        if (dt == FA_DTYPE_F32) call_check_reference(&p, &other, what);
    }
    if (ok) call_buffers_free(&buf);
    call_host_free(&first);
    call_host_free(&other);
    call_host_free(&reseeded);
    call_host_free(&back);
    call_problem_free(&p);
    if (a) fa_plan_destroy(a);
    if (b) fa_plan_destroy(b);
    return ok;
}

static void reseed_case(fa_backend backend, fa_algorithm algo) {
    char reason[512] = "";
    if (fa_backend_get_status(backend, reason, sizeof reason) != FA_SUCCESS) {
        snprintf(skip_reason, sizeof skip_reason, "%s unavailable: %s", fa_backend_name(backend), reason);
        FA_SKIP(skip_reason);
    }
    if (!cache_dir) cache_dir = fa_test_own_cache();
    CHECK_MSG(cache_dir != NULL, "no kernel cache of this process's own: %s", strerror(errno));
    if (!cache_dir) return;
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(backend, -1, &ctx));
    if (!ctx) return;
    const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16};
    int ran = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) ran += reseed_matches_new_plan(ctx, dtypes[i], algo);
    fa_context_destroy(ctx);
    if (!ran) FA_SKIP(skip_reason);
}

FA_TEST(reference_fused) { reseed_case(FA_BACKEND_REFERENCE, FA_ALGO_FUSED); }
FA_TEST(reference_standard) { reseed_case(FA_BACKEND_REFERENCE, FA_ALGO_STANDARD); }
FA_TEST(opencl_fused) { reseed_case(FA_BACKEND_OPENCL, FA_ALGO_FUSED); }
FA_TEST(opencl_standard) { reseed_case(FA_BACKEND_OPENCL, FA_ALGO_STANDARD); }
FA_TEST(cuda_fused) { reseed_case(FA_BACKEND_CUDA, FA_ALGO_FUSED); }
FA_TEST(cuda_standard) { reseed_case(FA_BACKEND_CUDA, FA_ALGO_STANDARD); }
FA_TEST(hip_fused) { reseed_case(FA_BACKEND_HIP, FA_ALGO_FUSED); }
FA_TEST(hip_standard) { reseed_case(FA_BACKEND_HIP, FA_ALGO_STANDARD); }

FA_TEST_MAIN(FA_CASE(reference_fused), FA_CASE(reference_standard), FA_CASE(opencl_fused), FA_CASE(opencl_standard),
             FA_CASE(cuda_fused), FA_CASE(cuda_standard), FA_CASE(hip_fused), FA_CASE(hip_standard))
