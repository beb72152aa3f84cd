/* The score options (softcap, ALiBi, additive bias): the fp64 reference's
 * forward against the header's formula written out, its backward against
 * finite differences, the descriptor check of each field, the reference
 * backend running every option through the public API, and the bias
 * argument's checks. */
#include "attention_suite.h"
#include "desc.h"
#include "harness.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_STEP 1e-6
#define FD_TOLERANCE 1e-6

enum { B = 2, SQ = 3, SK = 5, HQ = 2, HKV = 1, D = 8 };
#define NQ (B * SQ * HQ * D)
#define NK (B * SK * HKV * D)
#define NL (B * HQ * SQ)
#define NBIAS (B * HQ * SQ * SK)

static const float slopes[HQ] = {0.5f, 0.125f};

typedef struct opt_problem {
    fa_attention_desc desc;
    double q[NQ], k[NK], v[NK], g[NQ], bias[NBIAS];
    double o[NQ], lse[NL], dq[NQ], dk[NK], dv[NK];
    const double *bias_arg; /* NULL without a bias */
} opt_problem;

static fa_attention_desc base_desc(void) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = B;
    d.seqlen_q = SQ;
    d.seqlen_k = SK;
    d.heads_q = HQ;
    d.heads_kv = HKV;
    d.head_dim = D;
    return d;
}

/* Scaled 3x so that softcap's tanh works well away from its linear part. */
static void opt_init(opt_problem *p, const fa_attention_desc *d, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->desc = *d;
    CHECK_OK(fa_attention_desc_check(d));
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    for (int i = 0; i < NQ; i++) p->q[i] = 3.0 * fa_rng_normal(&rng);
    for (int i = 0; i < NK; i++) p->k[i] = fa_rng_normal(&rng);
    for (int i = 0; i < NK; i++) p->v[i] = fa_rng_normal(&rng);
    for (int i = 0; i < NQ; i++) p->g[i] = fa_rng_normal(&rng);
    for (int i = 0; i < NBIAS; i++) p->bias[i] = fa_rng_normal(&rng);
    p->bias_arg = d->bias_batch ? p->bias : NULL;
}

/* Packed [batch, seq, heads, dim] indices and the packed bias, written out
 * from the header rather than taken from the library. */
static int qi_(int b, int t, int h) { return ((b * SQ + t) * HQ + h) * D; }
static int ki_(int b, int t, int h) { return ((b * SK + t) * HKV + h) * D; }
static int bias_i(const fa_attention_desc *d, int b, int h, int i, int j) {
    int bb = d->bias_batch == 1 ? 0 : b, hh = d->bias_heads == 1 ? 0 : h;
    return ((bb * d->bias_heads + hh) * SQ + i) * SK + j;
}

/* The header's formula, one row at a time, with the causal mask. */
static void naive_forward(const opt_problem *p, double *o) {
    const fa_attention_desc *d = &p->desc;
    const double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < SQ; i++) {
                double s[SK], m = -INFINITY, sum = 0.0;
                for (int j = 0; j < SK; j++) {
                    double acc = 0.0;
                    for (int x = 0; x < D; x++) acc += p->q[qi_(b, i, h) + x] * p->k[ki_(b, j, 0) + x];
                    s[j] = scale * acc;
                    if (d->softcap > 0.0f) s[j] = d->softcap * tanh(s[j] / d->softcap);
                    if (p->bias_arg) s[j] += p->bias[bias_i(d, b, h, i, j)];
                    if (d->alibi_slopes) s[j] -= d->alibi_slopes[h] * fabs((double)(i + SK - SQ - j));
                    if (d->causal && j > i + SK - SQ) s[j] = -INFINITY;
                    if (s[j] > m) m = s[j];
                }
                for (int j = 0; j < SK; j++) sum += exp(s[j] - m);
                for (int x = 0; x < D; x++) {
                    double acc = 0.0;
                    for (int j = 0; j < SK; j++) acc += exp(s[j] - m) / sum * p->v[ki_(b, j, 0) + x];
                    o[qi_(b, i, h) + x] = acc;
                }
            }
}

static double opt_loss(void *ctx) {
    opt_problem *p = ctx;
    double o[NQ], lse[NL];
    fa_ref_forward_f64_ex(&p->desc, p->bias_arg, p->q, p->k, p->v, o, lse);
    double loss = 0.0;
    for (int i = 0; i < NQ; i++) loss += o[i] * p->g[i];
    return loss;
}

static double fd_error(opt_problem *p, double *x, const double *an, int n) {
    return fa_test_fd_error(x, an, n, NULL, FD_STEP, opt_loss, p);
}

/* Forward against the naive formula, backward against finite differences. */
static void option_case(const fa_attention_desc *d, uint64_t seed) {
    static opt_problem p;
    opt_init(&p, d, seed);
    fa_ref_forward_f64_ex(&p.desc, p.bias_arg, p.q, p.k, p.v, p.o, p.lse);
    double naive[NQ], err = 0.0;
    naive_forward(&p, naive);
    for (int i = 0; i < NQ; i++) err = fmax(err, fabs(naive[i] - p.o[i]));
    CHECK_MSG(err < 1e-12, "O differs from the header's formula by %.3g", err);
    fa_ref_backward_f64_ex(&p.desc, p.bias_arg, p.q, p.k, p.v, p.o, p.lse, p.g, p.dq, p.dk, p.dv);
    const double eq = fd_error(&p, p.q, p.dq, NQ), ek = fd_error(&p, p.k, p.dk, NK), ev = fd_error(&p, p.v, p.dv, NK);
    CHECK_MSG(eq < FD_TOLERANCE, "dq: relative error %.3g against finite differences", eq);
    CHECK_MSG(ek < FD_TOLERANCE, "dk: relative error %.3g against finite differences", ek);
    CHECK_MSG(ev < FD_TOLERANCE, "dv: relative error %.3g against finite differences", ev);
}

FA_TEST(softcap_forward_and_gradients) {
    fa_attention_desc d = base_desc();
    d.softcap = 1.5f;
    option_case(&d, 11);
    d.causal = 1;
    option_case(&d, 12);
}

FA_TEST(alibi_forward_and_gradients) {
    fa_attention_desc d = base_desc();
    d.alibi_slopes = slopes;
    option_case(&d, 21);
    d.causal = 1;
    option_case(&d, 22);
}

FA_TEST(bias_forward_and_gradients) {
    static const int shapes[4][2] = {{B, HQ}, {1, HQ}, {B, 1}, {1, 1}};
    for (int s = 0; s < 4; s++) {
        fa_attention_desc d = base_desc();
        d.bias_batch = shapes[s][0];
        d.bias_heads = shapes[s][1];
        option_case(&d, 31 + (uint64_t)s);
    }
}

FA_TEST(all_options_together) {
    fa_attention_desc d = base_desc();
    d.softcap = 2.0f;
    d.alibi_slopes = slopes;
    d.bias_batch = B;
    d.bias_heads = 1;
    d.causal = 1;
    option_case(&d, 41);
}

/* Softcap saturates: an infinite score becomes +-softcap, finite, so the
 * row stays finite where without softcap it would be NaN. */
FA_TEST(softcap_bounds_infinite_scores) {
    static opt_problem p;
    fa_attention_desc d = base_desc();
    d.softcap = 1.0f;
    opt_init(&p, &d, 51);
    p.q[0] = INFINITY;
    fa_ref_forward_f64_ex(&p.desc, NULL, p.q, p.k, p.v, p.o, p.lse);
    for (int x = 0; x < D; x++) CHECK_MSG(isfinite(p.o[x]), "o[%d] = %g with softcap", x, p.o[x]);
    d.softcap = 0.0f;
    p.desc = d;
    fa_ref_forward_f64_ex(&p.desc, NULL, p.q, p.k, p.v, p.o, p.lse);
    CHECK(isnan(p.lse[0]));
}

/* A -inf bias weighs its key 0; all visible keys -inf is NaN, not a
 * masked row. */
FA_TEST(bias_minus_inf_is_not_a_mask) {
    static opt_problem p;
    fa_attention_desc d = base_desc();
    d.bias_batch = 1;
    d.bias_heads = 1;
    opt_init(&p, &d, 61);
    p.bias[bias_i(&d, 0, 0, 0, 0)] = -INFINITY;
    fa_ref_forward_f64_ex(&p.desc, p.bias, p.q, p.k, p.v, p.o, p.lse);
    CHECK(isfinite(p.lse[0]));
    for (int j = 0; j < SK; j++) p.bias[bias_i(&d, 0, 0, 0, j)] = -INFINITY;
    fa_ref_forward_f64_ex(&p.desc, p.bias, p.q, p.k, p.v, p.o, p.lse);
    CHECK(isnan(p.lse[0]));
    CHECK(isnan(p.o[0]));
}

FA_TEST(argument_checks) {
    fa_attention_desc d = base_desc();
    d.softcap = -1.0f;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "softcap");
    d.softcap = INFINITY;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "softcap");
    d.softcap = NAN;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "softcap");

    d = base_desc();
    const float bad_slopes[HQ] = {0.5f, NAN};
    d.alibi_slopes = bad_slopes;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "alibi_slopes[1]");

    d = base_desc();
    d.bias_heads = 1;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "bias_heads");
    d.bias_batch = 3;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "bias_batch");
    d.bias_batch = 1;
    d.bias_heads = 3;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "bias_heads");
    d.bias_heads = HQ;
    CHECK_OK(fa_attention_desc_check(&d));
    d.bias.dtype = FA_DTYPE_F16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "bias.dtype");
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    CHECK_OK(fa_attention_desc_check(&d));
    d = base_desc();
    d.bias_batch = 1;
    d.bias_heads = 1;
    d.bias.offset = -1;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "bias.offset");
    d.bias.offset = 0;
    d.bias.stride_seq = -SK;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "bias");
    d.bias.stride_seq = SK - 1; /* rows overlap */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "bias strides overlap");
    d.bias.stride_seq = INT64_C(1) << 61; /* past 2^62 bytes of fp32 */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "bias");
    d.bias.stride_seq = SK;
    d.bias.offset = (INT64_C(1) << 60) - 1; /* the last byte past 2^62 */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "bias.offset");
    d.bias.offset = 3; /* no alignment asked of the bias */
    CHECK_OK(fa_attention_desc_check(&d));

    d = base_desc();
    const int32_t cu_q[B + 1] = {0, 2, 5}, cu_k[B + 1] = {0, 4, 9};
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.alibi_slopes = slopes;
    d.softcap = 3.0f;
    CHECK_OK(fa_attention_desc_check(&d));
    d.bias_batch = 1;
    d.bias_heads = 1;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "bias");
}

/* The reference backend runs every option through the public API (plans,
 * buffers, fa_forward_ex / fa_backward_ex with the bias buffer) against
 * the fp64 core: the suite's score-option cases. */
static const suite_backend reference_suite = {FA_BACKEND_REFERENCE, "reference", 1, NULL, NULL, NULL,
                                              SUITE_ALL_SCORE_OPTIONS};

FA_TEST(reference_backend_runs_every_option) {
    suite_use_backend(&reference_suite);
    suite_score_options();
}

/* Unfused attention has none of the options, on any backend: refused at
 * plan creation, by name. */
FA_TEST(standard_algorithm_refuses) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    fa_attention_desc d = base_desc();
    d.algorithm = FA_ALGO_STANDARD;
    d.softcap = 2.0f;
    fa_plan plan = NULL;
    CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_UNSUPPORTED, "softcap");
    CHECK(plan == NULL);
    CHECK_OK(fa_context_destroy(ctx));
}

/* The bias buffer is checked like a tensor: present exactly with a bias,
 * of the plan's context, large enough, never overlapping an output. */
FA_TEST(bias_argument_checks) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    fa_attention_desc d = base_desc();
    d.bias_batch = B;
    d.bias_heads = HQ;
    d.bias.dtype = FA_DTYPE_F32;
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    fa_buffer q, k, v, o, lse, bias, small;
    CHECK_OK(fa_buffer_alloc(ctx, NQ * sizeof(float), &q));
    CHECK_OK(fa_buffer_alloc(ctx, NK * sizeof(float), &k));
    CHECK_OK(fa_buffer_alloc(ctx, NK * sizeof(float), &v));
    CHECK_OK(fa_buffer_alloc(ctx, NQ * sizeof(float), &o));
    CHECK_OK(fa_buffer_alloc(ctx, NL * sizeof(float), &lse));
    CHECK_OK(fa_buffer_alloc(ctx, NBIAS * sizeof(float), &bias));
    CHECK_OK(fa_buffer_alloc(ctx, NBIAS * sizeof(float) - 4, &small));
    static float zeros[NBIAS > NQ ? NBIAS : NQ];
    CHECK_OK(fa_buffer_upload(q, 0, zeros, NQ * sizeof(float)));
    CHECK_OK(fa_buffer_upload(k, 0, zeros, NK * sizeof(float)));
    CHECK_OK(fa_buffer_upload(v, 0, zeros, NK * sizeof(float)));
    CHECK_OK(fa_buffer_upload(bias, 0, zeros, NBIAS * sizeof(float)));
    fa_pass_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    CHECK_FAILS(fa_forward_ex(plan, &a), FA_ERR_NULL_POINTER, "bias");
    CHECK_FAILS(fa_forward(plan, q, k, v, o, lse), FA_ERR_NULL_POINTER, "bias");
    CHECK_FAILS(fa_forward_ex(plan, NULL), FA_ERR_NULL_POINTER, "args");
    a.bias = small;
    CHECK_FAILS(fa_forward_ex(plan, &a), FA_ERR_OUT_OF_BOUNDS, "bias");
    a.bias = o; /* the forward's output */
    CHECK_FAILS(fa_forward_ex(plan, &a), FA_ERR_INVALID_ARGUMENT, "bias and o");
    a.bias = bias;
    CHECK_OK(fa_forward_ex(plan, &a));
    /* Another context's buffer. */
    fa_context other = NULL;
    fa_buffer foreign = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &other));
    CHECK_OK(fa_buffer_alloc(other, NBIAS * sizeof(float), &foreign));
    a.bias = foreign;
    CHECK_FAILS(fa_forward_ex(plan, &a), FA_ERR_FOREIGN_BUFFER, "bias");
    CHECK_OK(fa_buffer_free(foreign));
    CHECK_OK(fa_context_destroy(other));
    /* The bias is an input: an output (dq) may not share its bytes. */
    fa_buffer shared = NULL, dk = NULL, dv = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, (NBIAS > NQ ? NBIAS : NQ) * sizeof(float), &shared));
    CHECK_OK(fa_buffer_alloc(ctx, NK * sizeof(float), &dk));
    CHECK_OK(fa_buffer_alloc(ctx, NK * sizeof(float), &dv));
    const fa_pass_args g = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .dout = o,
                            .dq = shared, .dk = dk, .dv = dv, .bias = shared};
    CHECK_FAILS(fa_backward_ex(plan, &g), FA_ERR_INVALID_ARGUMENT, "bias and dq");
    CHECK_OK(fa_plan_destroy(plan));
    /* A bias for a plan without one. */
    a.bias = bias;
    fa_attention_desc plain = base_desc();
    CHECK_OK(fa_plan_create(ctx, &plain, &plan));
    CHECK_FAILS(fa_forward_ex(plan, &a), FA_ERR_INVALID_ARGUMENT, "bias");
    a.bias = NULL;
    CHECK_OK(fa_forward_ex(plan, &a));
    CHECK_OK(fa_plan_destroy(plan));
    fa_buffer all[] = {q, k, v, o, lse, bias, small, shared, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK_OK(fa_buffer_free(all[i]));
    CHECK_OK(fa_context_destroy(ctx));
}

/* The storage-dtype wrappers take softcap and ALiBi; a bias needs the
 * fp64 core, and unfused attention has none of the options yet. */
FA_TEST(storage_wrappers) {
    static float q[NQ], k[NK], v[NK], o[NQ], lse[NL];
    static double qd[NQ], kd[NK], vd[NK], od[NQ], ld[NL];
    fa_rng rng;
    fa_rng_seed(&rng, 71);
    for (int i = 0; i < NQ; i++) qd[i] = q[i] = (float)fa_rng_normal(&rng);
    for (int i = 0; i < NK; i++) kd[i] = k[i] = (float)fa_rng_normal(&rng);
    for (int i = 0; i < NK; i++) vd[i] = v[i] = (float)fa_rng_normal(&rng);
    fa_attention_desc d = base_desc();
    d.softcap = 1.0f;
    d.alibi_slopes = slopes;
    CHECK_OK(fa_ref_forward(&d, q, k, v, o, lse));
    fa_ref_forward_f64_ex(&d, NULL, qd, kd, vd, od, ld);
    for (int i = 0; i < NQ; i++) CHECK_NEAR(o[i], od[i], 1e-6);
    CHECK_FAILS(fa_ref_standard_forward(&d, q, k, v, o, lse), FA_ERR_UNSUPPORTED, "softcap");
    d.bias_batch = d.bias_heads = 1;
    CHECK_FAILS(fa_ref_forward(&d, q, k, v, o, lse), FA_ERR_NULL_POINTER, "bias");
    CHECK_FAILS(fa_ref_backward(&d, q, k, v, o, lse, o, o, k, v), FA_ERR_NULL_POINTER, "bias");
}

FA_TEST_MAIN(FA_CASE(softcap_forward_and_gradients), FA_CASE(alibi_forward_and_gradients),
             FA_CASE(bias_forward_and_gradients), FA_CASE(all_options_together),
             FA_CASE(softcap_bounds_infinite_scores), FA_CASE(bias_minus_inf_is_not_a_mask),
             FA_CASE(argument_checks), FA_CASE(reference_backend_runs_every_option), FA_CASE(standard_algorithm_refuses), FA_CASE(bias_argument_checks),
             FA_CASE(storage_wrappers))
