/* fa_plan_set_dropout_seed on every backend present: a plan given a new
 * seed and offset computes, bit for bit, what a plan created with them
 * computes (forward and backward, deterministic mode, fp32 and fp16, fused
 * and standard attention); going back to the first seed gives the first
 * results again; and a plan that differs only in its seed compiles nothing:
 * the kernel cache gains no entry. (Argument checks are in test_api.c.)
 * And the dropout origin (core/plan.h) a ring gives each piece: a plan of
 * a sub-rectangle of a problem, given where it lies, drops exactly the
 * elements a plan of the whole problem drops there, so its results on the
 * rows and keys it covers are the whole plan's (bit for bit on the
 * reference, within rounding where the tiles differ).
 *
 * fa-test-labels: device
 *
 * A case skips where its backend is missing or cannot run its algorithm. */
#include "call_runner.h"
#include "harness.h"
#include "plan.h"
#include "test_util.h"

#include "flashattn.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* ------------------------------------------------------------------------ */
/* Dropout origin                                                            */

/* The whole problem the origin cases cut: no causal mask (the piece's own
 * bottom-right diagonal would differ from the whole's); a block mask hides
 * keys [0, ORIGIN_KEY0) from every row, so that a piece whose keys start
 * there sees, on its rows, exactly what the whole sees. */
enum { ORIGIN_SQ = 40, ORIGIN_SK = 52, ORIGIN_KEY0 = 8, ORIGIN_BLOCK_Q = 8, ORIGIN_BLOCK_K = 4 };
static uint8_t origin_mask[(ORIGIN_SQ / ORIGIN_BLOCK_Q) * (ORIGIN_SK / ORIGIN_BLOCK_K)];

static fa_attention_desc origin_whole(fa_dtype dt, fa_algorithm algo, int head_dim) {
    fa_attention_desc d = seeded_desc(dt, algo, seed_a, offset_a);
    d.seqlen_q = ORIGIN_SQ;
    d.seqlen_k = ORIGIN_SK;
    d.head_dim = head_dim;
    d.causal = 0;
    d.dropout_p = 0.3f;
    const int cols = ORIGIN_SK / ORIGIN_BLOCK_K;
    for (int i = 0; i < (int)sizeof origin_mask; i++) origin_mask[i] = i % cols >= ORIGIN_KEY0 / ORIGIN_BLOCK_K;
    d.block_mask = origin_mask;
    d.block_mask_bytes = sizeof origin_mask;
    d.block_q = ORIGIN_BLOCK_Q;
    d.block_k = ORIGIN_BLOCK_K;
    return d;
}

/* Rows [row0, row0 + rows) against keys [ORIGIN_KEY0, ORIGIN_SK) of the
 * whole problem: views into the whole tensors (L packed apart), no mask. */
static fa_attention_desc origin_piece(const fa_attention_desc *whole, int row0, int rows) {
    fa_attention_desc d = *whole;
    const int64_t hq = whole->heads_q, hk = whole->heads_kv, dim = whole->head_dim;
    d.seqlen_q = rows;
    d.seqlen_k = ORIGIN_SK - ORIGIN_KEY0;
    d.block_mask = NULL;
    d.block_mask_bytes = 0;
    d.block_q = d.block_k = 0;
    const fa_tensor_desc q = {whole->q.dtype, row0 * hq * dim, ORIGIN_SQ * hq * dim, hq * dim, dim};
    fa_tensor_desc k = {whole->k.dtype, ORIGIN_KEY0 * hk * dim, ORIGIN_SK * hk * dim, hk * dim, dim};
    d.q = d.o = q;
    d.k = d.v = k;
    return d;
}

/* Elements [first, first + count) of each of outer runs of len elements
 * (tokens of a batch entry, or rows of L), packed. */
static void *slice(const void *src, size_t es, int64_t outer, int64_t len, int64_t first, int64_t count) {
    char *out = malloc((size_t)(outer * count) * es);
    for (int64_t o = 0; out && o < outer; o++)
        memcpy(out + (size_t)(o * count) * es, (const char *)src + (size_t)(o * len + first) * es, (size_t)count * es);
    return out;
}

/* got against want: bit for bit on the reference, else within the
 * rounding of different tilings. */
static void origin_compare(const void *got, const void *want, fa_dtype dt, int64_t n, int bitwise, const char *what,
                           const char *tensor) {
    if (!got || !want) {
        CHECK_MSG(0, "%s: %s: out of memory", what, tensor);
        return;
    }
    if (bitwise) {
        CHECK_MSG(memcmp(got, want, (size_t)n * fa_dtype_size(dt)) == 0,
                  "%s: %s of the piece differs from the whole problem's (bitwise)", what, tensor);
        return;
    }
    const double tol = dt == FA_DTYPE_F32 ? 1e-5 : dt == FA_DTYPE_F16 ? 3e-3 : 2e-2;
    const fa_test_diff diff = fa_test_compare(got, want, dt, n);
    CHECK_MSG(fa_test_within(&diff, tol),
              "%s: %s of the piece differs from the whole problem's: ||diff|| %.3g, ||whole|| %.3g, %lld "
              "mismatched (limit %.1g)",
              what, tensor, diff.diff_norm, diff.ref_norm, (long long)diff.mismatched, tol);
}

/* One piece, rows [row0, row0 + rows) from key ORIGIN_KEY0 on, against the
 * whole run's outputs `whole_out`: O, L and dQ on its rows; dK and dV where
 * it holds every row (else they lack the other rows' share). */
static void origin_piece_matches(fa_context ctx, const call_problem *p, const call_buffers *wb,
                                 const call_host *whole_out, int row0, int rows, const char *what) {
    const fa_attention_desc *w = &p->desc;
    const fa_dtype dt = w->q.dtype;
    const size_t es = fa_dtype_size(dt);
    const int bitwise = ctx->info.backend == FA_BACKEND_REFERENCE;
    fa_attention_desc d = origin_piece(w, row0, rows);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (!plan) return;
    CHECK_OK(fa_plan_set_dropout_origin(plan, row0, ORIGIN_KEY0));
    const int64_t n_lse = (int64_t)w->batch * w->heads_q * rows;
    fa_buffer o = NULL, lse = NULL, dq = NULL, dk = NULL, dv = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)p->n_q * es, &o));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)n_lse * sizeof(float), &lse));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)p->n_q * es, &dq));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)p->n_k * es, &dk));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)p->n_k * es, &dv));
    void *ho = malloc((size_t)p->n_q * es), *hdq = malloc((size_t)p->n_q * es);
    void *hdk = malloc((size_t)p->n_k * es), *hdv = malloc((size_t)p->n_k * es);
    float *hl = malloc((size_t)n_lse * sizeof(float));
    if (o && lse && dq && dk && dv && ho && hdq && hdk && hdv && hl) {
        CHECK_OK(fa_forward(plan, wb->q, wb->k, wb->v, o, lse));
        CHECK_OK(fa_backward(plan, wb->q, wb->k, wb->v, o, lse, wb->dout, dq, dk, dv));
        CHECK_OK(fa_buffer_download(o, 0, ho, (size_t)p->n_q * es));
        CHECK_OK(fa_buffer_download(lse, 0, hl, (size_t)n_lse * sizeof(float)));
        CHECK_OK(fa_buffer_download(dq, 0, hdq, (size_t)p->n_q * es));
        CHECK_OK(fa_buffer_download(dk, 0, hdk, (size_t)p->n_k * es));
        CHECK_OK(fa_buffer_download(dv, 0, hdv, (size_t)p->n_k * es));
        const int64_t qrow = (int64_t)w->heads_q * w->head_dim, krow = (int64_t)w->heads_kv * w->head_dim;
        const int64_t nq = (int64_t)w->batch * rows * qrow, nk = (int64_t)w->batch * (ORIGIN_SK - ORIGIN_KEY0) * krow;
        struct {
            const char *name;
            const void *got, *want;
            size_t es;
            int64_t outer, len, first, count, n;
            fa_dtype dt;
        } views[] = {
            {"O", ho, whole_out->o, es, w->batch, ORIGIN_SQ * qrow, row0 * qrow, rows * qrow, nq, dt},
            {"dQ", hdq, whole_out->dq, es, w->batch, ORIGIN_SQ * qrow, row0 * qrow, rows * qrow, nq, dt},
            {"dK", hdk, whole_out->dk, es, w->batch, ORIGIN_SK * krow, ORIGIN_KEY0 * krow,
             (ORIGIN_SK - ORIGIN_KEY0) * krow, nk, dt},
            {"dV", hdv, whole_out->dv, es, w->batch, ORIGIN_SK * krow, ORIGIN_KEY0 * krow,
             (ORIGIN_SK - ORIGIN_KEY0) * krow, nk, dt},
        };
        const int compared = rows == ORIGIN_SQ ? 4 : 2;
        for (int i = 0; i < compared; i++) {
            void *got = slice(views[i].got, views[i].es, views[i].outer, views[i].len, views[i].first, views[i].count);
            void *want = slice(views[i].want, views[i].es, views[i].outer, views[i].len, views[i].first, views[i].count);
            origin_compare(got, want, views[i].dt, views[i].n, bitwise, what, views[i].name);
            free(got);
            free(want);
        }
        /* L: [batch][heads_q][rows] of the piece, [batch][heads_q][seqlen_q] of the whole. */
        float *want_l = slice(whole_out->lse, sizeof(float), (int64_t)w->batch * w->heads_q, ORIGIN_SQ, row0, rows);
        origin_compare(hl, want_l, FA_DTYPE_F32, n_lse, bitwise, what, "L");
        free(want_l);
    }
    free(ho);
    free(hdq);
    free(hdk);
    free(hdv);
    free(hl);
    fa_buffer made[] = {o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof made / sizeof made[0]; i++)
        if (made[i]) fa_buffer_free(made[i]);
    fa_plan_destroy(plan);
}

/* 1 when the case ran; 0 when the backend cannot run it (the reason then
 * in skip_reason) or a check failed. */
static int origin_matches_whole(fa_context ctx, fa_dtype dt, fa_algorithm algo, int head_dim) {
    char what[96];
    snprintf(what, sizeof what, "%s %s d%d", fa_dtype_name(dt), algo == FA_ALGO_STANDARD ? "standard" : "fused",
             head_dim);
    fa_attention_desc w = origin_whole(dt, algo, head_dim);
    fa_plan whole = NULL;
    fa_status st = fa_plan_create(ctx, &w, &whole);
    if (st == FA_ERR_UNSUPPORTED || st == FA_ERR_BACKEND_UNAVAILABLE) {
        snprintf(skip_reason, sizeof skip_reason, "%s: %s", fa_status_string(st), fa_last_error());
        printf("  %s not run: %s\n", what, skip_reason);
        return 0;
    }
    CHECK_MSG(st == FA_SUCCESS, "%s: plan of the whole problem: %s (%s)", what, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return 0;
    call_problem p;
    call_problem_init(&p, &w, 91);
    call_buffers buf;
    call_host out;
    memset(&out, 0, sizeof out);
    const int ok = call_buffers_init(&buf, ctx, &p);
    if (ok && run(whole, &buf, &p, &out)) {
        /* A row range that starts and ends inside tiles, from the first key
         * on; then every row, where dK and dV are whole too. */
        origin_piece_matches(ctx, &p, &buf, &out, 13, 17, what);
        origin_piece_matches(ctx, &p, &buf, &out, 0, ORIGIN_SQ, what);
        printf("  %s: pieces from (13, %d) and (0, %d) match the whole problem\n", what, ORIGIN_KEY0, ORIGIN_KEY0);
    }
    if (ok) call_buffers_free(&buf);
    call_host_free(&out);
    call_problem_free(&p);
    fa_plan_destroy(whole);
    return ok;
}

static void origin_case(fa_backend backend, fa_algorithm algo) {
    char reason[512] = "";
    if (fa_backend_get_status(backend, reason, sizeof reason) != FA_SUCCESS) {
        snprintf(skip_reason, sizeof skip_reason, "%s unavailable: %s", fa_backend_name(backend), reason);
        FA_SKIP(skip_reason);
    }
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(backend, -1, &ctx));
    if (!ctx) return;
    /* fp32 (SIMT kernels), fp16 d32 and bf16 d128 (the matrix units where a
     * device has them; d128 the warpgroup kernels on sm_90). */
    const struct {
        fa_dtype dt;
        int head_dim;
    } shapes[] = {{FA_DTYPE_F32, 32}, {FA_DTYPE_F16, 32}, {FA_DTYPE_BF16, 128}};
    int ran = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        ran += origin_matches_whole(ctx, shapes[i].dt, algo, shapes[i].head_dim);
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
FA_TEST(origin_reference_fused) { origin_case(FA_BACKEND_REFERENCE, FA_ALGO_FUSED); }
FA_TEST(origin_reference_standard) { origin_case(FA_BACKEND_REFERENCE, FA_ALGO_STANDARD); }
FA_TEST(origin_opencl_fused) { origin_case(FA_BACKEND_OPENCL, FA_ALGO_FUSED); }
FA_TEST(origin_opencl_standard) { origin_case(FA_BACKEND_OPENCL, FA_ALGO_STANDARD); }
FA_TEST(origin_cuda_fused) { origin_case(FA_BACKEND_CUDA, FA_ALGO_FUSED); }
FA_TEST(origin_cuda_standard) { origin_case(FA_BACKEND_CUDA, FA_ALGO_STANDARD); }
FA_TEST(origin_hip_fused) { origin_case(FA_BACKEND_HIP, FA_ALGO_FUSED); }
FA_TEST(origin_hip_standard) { origin_case(FA_BACKEND_HIP, FA_ALGO_STANDARD); }

FA_TEST_MAIN(FA_CASE(reference_fused), FA_CASE(reference_standard), FA_CASE(opencl_fused), FA_CASE(opencl_standard),
             FA_CASE(cuda_fused), FA_CASE(cuda_standard), FA_CASE(hip_fused), FA_CASE(hip_standard),
             FA_CASE(origin_reference_fused), FA_CASE(origin_reference_standard), FA_CASE(origin_opencl_fused),
             FA_CASE(origin_opencl_standard), FA_CASE(origin_cuda_fused), FA_CASE(origin_cuda_standard),
             FA_CASE(origin_hip_fused), FA_CASE(origin_hip_standard))
