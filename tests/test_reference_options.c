/* The score options (softcap, ALiBi, additive bias): the fp64 reference's
 * forward against the header's formula written out, its backward against
 * finite differences, the descriptor check of each field, and the refusal
 * of every backend at plan creation. */
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

/* Every device of every backend here (the reference always; OpenCL where
 * one is, PoCL in CI) refuses each option at plan creation, by name. */
FA_TEST(every_backend_refuses_at_plan_creation) {
    int count = 0;
    CHECK_OK(fa_device_count(&count));
    CHECK(count >= 1);
    for (int dev = 0; dev < count; dev++) {
        fa_device_info info;
        CHECK_OK(fa_device_get_info(dev, &info));
        fa_context ctx = NULL;
        CHECK_OK(fa_context_create(info.backend, info.index, &ctx));
        for (int opt = 0; opt < 3; opt++) {
            fa_attention_desc d = base_desc();
            static const char *const names[3] = {"softcap", "alibi_slopes", "bias"};
            if (opt == 0) d.softcap = 2.0f;
            if (opt == 1) d.alibi_slopes = slopes;
            if (opt == 2) d.bias_batch = d.bias_heads = 1;
            fa_plan plan = NULL;
            CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_UNSUPPORTED, names[opt]);
            CHECK(plan == NULL);
        }
        fa_attention_desc plain = base_desc();
        fa_plan plan = NULL;
        CHECK_OK(fa_plan_create(ctx, &plain, &plan));
        CHECK_OK(fa_plan_destroy(plan));
        CHECK_OK(fa_context_destroy(ctx));
        /* Names what was covered: the GPU machine's log shows CUDA and HIP. */
        printf("refused by %s device %d (%s)\n", fa_backend_name(info.backend), info.index, info.desc.name);
    }
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
    CHECK_FAILS(fa_ref_forward(&d, q, k, v, o, lse), FA_ERR_UNSUPPORTED, "bias");
    CHECK_FAILS(fa_ref_backward(&d, q, k, v, o, lse, o, o, k, v), FA_ERR_UNSUPPORTED, "bias");
}

FA_TEST_MAIN(FA_CASE(softcap_forward_and_gradients), FA_CASE(alibi_forward_and_gradients),
             FA_CASE(bias_forward_and_gradients), FA_CASE(all_options_together),
             FA_CASE(softcap_bounds_infinite_scores), FA_CASE(bias_minus_inf_is_not_a_mask),
             FA_CASE(argument_checks), FA_CASE(every_backend_refuses_at_plan_creation),
             FA_CASE(storage_wrappers))
