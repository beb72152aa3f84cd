/* One problem's passes through the public API (tests/call_runner.h). */
#include "call_runner.h"

#include "harness.h"
#include "reference.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static size_t bytes_of(const call_problem *p, int64_t n) { return (size_t)n * fa_dtype_size(p->desc.q.dtype); }

void call_problem_init(call_problem *p, const fa_attention_desc *desc, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->desc = *desc;
    p->n_q = fa_ref_tensor_span(desc, FA_TENSOR_Q);
    p->n_k = fa_ref_tensor_span(desc, FA_TENSOR_K);
    p->n_lse = (int64_t)desc->heads_q * fa_attention_total_q(desc);
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    const fa_dtype dt = desc->q.dtype;
    p->q = fa_test_random_tensor(&rng, dt, p->n_q);
    p->k = fa_test_random_tensor(&rng, dt, p->n_k);
    p->v = fa_test_random_tensor(&rng, dt, p->n_k);
    p->dout = fa_test_random_tensor(&rng, dt, p->n_q);
}

void call_problem_free(call_problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->dout);
    memset(p, 0, sizeof *p);
}

void call_buffers_free(call_buffers *b) {
    fa_buffer all[] = {b->q, b->k, b->v, b->o, b->lse, b->dout, b->dq, b->dk, b->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) fa_buffer_free(all[i]);
    memset(b, 0, sizeof *b);
}

/* A buffer of n elements of dt holding data, or NaN where data is NULL. */
static int make_buffer(fa_context ctx, fa_dtype dt, int64_t n, const void *data, fa_buffer *out) {
    const size_t bytes = (size_t)n * fa_dtype_size(dt);
    fa_status st = fa_buffer_alloc(ctx, bytes, out);
    CHECK_MSG(st == FA_SUCCESS, "fa_buffer_alloc(%zu): %s (%s)", bytes, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return 0;
    void *poison = NULL;
    if (!data) {
        poison = malloc(bytes);
        fa_test_poison(poison, dt, n);
        data = poison;
    }
    st = fa_buffer_upload(*out, 0, data, bytes);
    free(poison);
    CHECK_MSG(st == FA_SUCCESS, "fa_buffer_upload(%zu): %s (%s)", bytes, fa_status_string(st), fa_last_error());
    return st == FA_SUCCESS;
}

int call_buffers_init(call_buffers *b, fa_context ctx, const call_problem *p) {
    memset(b, 0, sizeof *b);
    const fa_dtype dt = p->desc.q.dtype;
    int ok = make_buffer(ctx, dt, p->n_q, p->q, &b->q) && make_buffer(ctx, dt, p->n_k, p->k, &b->k) &&
             make_buffer(ctx, dt, p->n_k, p->v, &b->v) && make_buffer(ctx, dt, p->n_q, NULL, &b->o) &&
             make_buffer(ctx, FA_DTYPE_F32, p->n_lse, NULL, &b->lse) &&
             make_buffer(ctx, dt, p->n_q, p->dout, &b->dout) && make_buffer(ctx, dt, p->n_q, NULL, &b->dq) &&
             make_buffer(ctx, dt, p->n_k, NULL, &b->dk) && make_buffer(ctx, dt, p->n_k, NULL, &b->dv);
    if (!ok) call_buffers_free(b);
    return ok;
}

fa_status call_forward(fa_plan plan, const call_buffers *b) { return fa_forward(plan, b->q, b->k, b->v, b->o, b->lse); }

fa_status call_backward(fa_plan plan, const call_buffers *b) {
    return fa_backward(plan, b->q, b->k, b->v, b->o, b->lse, b->dout, b->dq, b->dk, b->dv);
}

static int fetch(fa_buffer buf, size_t bytes, void **out) {
    *out = malloc(bytes);
    fa_status st = fa_buffer_download(buf, 0, *out, bytes);
    CHECK_MSG(st == FA_SUCCESS, "fa_buffer_download(%zu): %s (%s)", bytes, fa_status_string(st), fa_last_error());
    return st == FA_SUCCESS;
}

int call_download(const call_buffers *b, const call_problem *p, call_host *out) {
    memset(out, 0, sizeof *out);
    void *lse = NULL;
    int ok = fetch(b->o, bytes_of(p, p->n_q), &out->o) && fetch(b->lse, (size_t)p->n_lse * sizeof(float), &lse) &&
             fetch(b->dq, bytes_of(p, p->n_q), &out->dq) && fetch(b->dk, bytes_of(p, p->n_k), &out->dk) &&
             fetch(b->dv, bytes_of(p, p->n_k), &out->dv);
    out->lse = lse;
    return ok;
}

void call_host_free(call_host *h) {
    free(h->o);
    free(h->lse);
    free(h->dq);
    free(h->dk);
    free(h->dv);
    memset(h, 0, sizeof *h);
}

static double tolerance(fa_dtype t) { return t == FA_DTYPE_F32 ? 1e-5 : t == FA_DTYPE_F16 ? 3e-3 : 2e-2; }

static void check_close(const void *got, const void *want, fa_dtype dt, int64_t n, const char *what,
                        const char *tensor) {
    const fa_test_diff diff = fa_test_compare(got, want, dt, n);
    const double tol = tolerance(dt);
    CHECK_MSG(fa_test_within(&diff, tol),
              "%s: %s differs from the reference: ||diff|| %.3g, ||ref|| %.3g, %lld mismatched (%s limit %.1g)", what,
              tensor, diff.diff_norm, diff.ref_norm, (long long)diff.mismatched, fa_dtype_name(dt), tol);
}

void call_check_reference(const call_problem *p, const call_host *out, const char *what) {
    const fa_dtype dt = p->desc.q.dtype;
    call_host ref;
    ref.o = malloc(bytes_of(p, p->n_q));
    ref.lse = malloc((size_t)p->n_lse * sizeof(float));
    ref.dq = malloc(bytes_of(p, p->n_q));
    ref.dk = malloc(bytes_of(p, p->n_k));
    ref.dv = malloc(bytes_of(p, p->n_k));
    CHECK_OK(fa_ref_forward(&p->desc, p->q, p->k, p->v, ref.o, ref.lse));
    /* The backward pass reads the O and L the device computed, as a user's would. */
    CHECK_OK(fa_ref_backward(&p->desc, p->q, p->k, p->v, out->o, out->lse, p->dout, ref.dq, ref.dk, ref.dv));
    check_close(out->o, ref.o, dt, p->n_q, what, "O");
    check_close(out->lse, ref.lse, FA_DTYPE_F32, p->n_lse, what, "L");
    check_close(out->dq, ref.dq, dt, p->n_q, what, "dQ");
    check_close(out->dk, ref.dk, dt, p->n_k, what, "dK");
    check_close(out->dv, ref.dv, dt, p->n_k, what, "dV");
    call_host_free(&ref);
}

int call_host_equal(const call_problem *p, const call_host *a, const call_host *b) {
    return memcmp(a->o, b->o, bytes_of(p, p->n_q)) == 0 &&
           memcmp(a->lse, b->lse, (size_t)p->n_lse * sizeof(float)) == 0 &&
           memcmp(a->dq, b->dq, bytes_of(p, p->n_q)) == 0 && memcmp(a->dk, b->dk, bytes_of(p, p->n_k)) == 0 &&
           memcmp(a->dv, b->dv, bytes_of(p, p->n_k)) == 0;
}
