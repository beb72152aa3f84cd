/* Standard (unfused) attention on the OpenCL backend (FA_ALGO_STANDARD:
 * S and P in global memory, products through CLBlast), through the public
 * API, against two CPU references:
 *
 *   fa_ref_standard_forward  the same computation with the same rounding
 *                            points (S and P rounded to the dtype, fp32
 *                            accumulation): only summation order and the
 *                            device's exp differ, so O and L must agree to
 *                            well within one unit of the dtype;
 *   fa_ref_forward / fa_ref_backward   exact (fp64): within the dtype's
 *                            tolerance (GUIDE section 2).
 *
 * Every run starts from fresh random inputs and NaN-poisoned outputs; every
 * element of every output is checked and the gaps of strided layouts must
 * keep their poison. Cases skip where no OpenCL device exists, and where
 * CLBlast cannot be loaded (except the case that checks that refusal).
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "desc.h"
#include "dtype.h"
#include "flashattn.h"
#include "plan.h"
#include "reference.h"

#include <math.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_runtime_internal.h"
#include "backends/opencl/cl_standard.h"
#endif

extern char **environ;

#define CLBLAST_ENV "FLASHATTN_CLBLAST_LIBRARY"
#define MISSING_CLBLAST "/nonexistent/flashattn-test/libclblast.so.1"

static fa_context g_ctx;
static char g_skip[512];

/* The OpenCL backend's best device; NULL (reason in g_skip) when there is
 * none. */
static fa_context context(void) {
    if (g_ctx) return g_ctx;
#ifndef FA_WITH_OPENCL
    snprintf(g_skip, sizeof g_skip, "the OpenCL backend is not built into this library");
    return NULL;
#else
    fa_status st = fa_context_create(FA_BACKEND_OPENCL, -1, &g_ctx);
    if (st != FA_SUCCESS) {
        snprintf(g_skip, sizeof g_skip, "no OpenCL device: %s (%s)", fa_status_string(st), fa_last_error());
        g_ctx = NULL;
        return NULL;
    }
    fa_device_info info;
    if (fa_context_get_info(g_ctx, &info) == FA_SUCCESS)
        fprintf(stderr, "  running on %s (driver %s)\n", info.desc.name, info.driver_version);
    return g_ctx;
#endif
}

static fa_attention_desc make_desc(fa_dtype dt, int batch, int sq, int sk, int hq, int hkv, int dim) {
    fa_attention_desc d = suite_desc(dt, batch, sq, sk, hq, hkv, dim);
    d.algorithm = FA_ALGO_STANDARD;
    return d;
}

/* A device with CLBlast: every case but the one about its absence needs
 * both. The probe is a real plan, so the reason is the library's own. */
static int g_blas_checked, g_blas_ok;
static fa_context blas_context(void) {
    fa_context ctx = context();
    if (!ctx || g_blas_checked) return ctx && g_blas_ok ? ctx : NULL;
    g_blas_checked = 1;
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 8, 8, 1, 1, 8);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, &d, &plan);
    if (st == FA_SUCCESS) {
        g_blas_ok = 1;
        fa_plan_destroy(plan);
        return ctx;
    }
    snprintf(g_skip, sizeof g_skip, "standard attention unavailable: %s (%s)", fa_status_string(st), fa_last_error());
    return NULL;
}

#define REQUIRE_BLAS()                                                                     \
    do {                                                                                   \
        if (!blas_context()) FA_SKIP(g_skip);                                              \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Tensors and comparisons                                                   */

/* Exact reference: the GUIDE's expectations (fp32 well under 1e-5, fp16
 * about 1e-3, bf16 about 1e-2), with the margins the fused kernels get. */
static double tol_exact(fa_dtype t) { return t == FA_DTYPE_F16 ? 3e-3 : t == FA_DTYPE_BF16 ? 2e-2 : 1e-5; }

/* Same rounding points. fp32: the norm of the difference, a few units in
 * the last place. fp16 and bf16: the share of O elements that are not bit
 * for bit the reference's. Only a value lying next to a rounding boundary of
 * the dtype (a score or a probability; a tie happens) may round the other
 * way, and then it moves one row of O; rounding at other points (scores
 * kept in fp32, say) changes most elements. */
#define SAME_ROUNDING_F32 1e-6
#define SAME_ROUNDING_SHARE 0.05

static int heads_of(const fa_attention_desc *d, fa_tensor_role role) {
    return role == FA_TENSOR_K || role == FA_TENSOR_V ? d->heads_kv : d->heads_q;
}

static int len_of(const fa_attention_desc *d, fa_tensor_role role, int b) {
    int64_t start;
    int len;
    if (role == FA_TENSOR_K || role == FA_TENSOR_V)
        fa_ref_seq_k(d, b, &start, &len);
    else
        fa_ref_seq_q(d, b, &start, &len);
    return len;
}

/* Elements of the layout whose bits differ. */
static int64_t layout_differing(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *want,
                                int64_t *total) {
    size_t es = fa_dtype_size(d->q.dtype);
    int64_t n = 0, differ = 0;
    for (int b = 0; b < d->batch; b++)
        for (int t = 0; t < len_of(d, role, b); t++)
            for (int h = 0; h < heads_of(d, role); h++) {
                int64_t i = fa_ref_index(d, role, b, t, h, 0);
                for (int x = 0; x < d->head_dim; x++, n++)
                    differ += memcmp((const char *)got + (i + x) * (int64_t)es, (const char *)want + (i + x) * (int64_t)es,
                                     es) != 0;
            }
    *total = n;
    return differ;
}

/* ||got - want|| / ||want|| over the layout's elements (INFINITY when got
 * has a non-finite value where want is finite); where want is all zeros
 * (every row masked), the RMS of got instead. */
static double layout_error(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *want) {
    double num = 0.0, den = 0.0;
    int64_t n = 0;
    for (int b = 0; b < d->batch; b++)
        for (int t = 0; t < len_of(d, role, b); t++)
            for (int h = 0; h < heads_of(d, role); h++)
                for (int x = 0; x < d->head_dim; x++) {
                    int64_t i = fa_ref_index(d, role, b, t, h, x);
                    double g = fa_load_elem(got, d->q.dtype, i), w = fa_load_elem(want, d->q.dtype, i);
                    if (!isfinite(g)) return INFINITY;
                    num += (g - w) * (g - w);
                    den += w * w;
                    n++;
                }
    if (den == 0.0) return n ? sqrt(num / (double)n) : 0.0;
    return sqrt(num / den);
}

/* Elements outside the layout that no longer hold the poison. */
static int64_t gaps_written(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *poison,
                            int64_t count) {
    unsigned char *map = calloc((size_t)count + 1, 1);
    if (!map) return -1;
    for (int b = 0; b < d->batch; b++)
        for (int t = 0; t < len_of(d, role, b); t++)
            for (int h = 0; h < heads_of(d, role); h++)
                memset(map + fa_ref_index(d, role, b, t, h, 0), 1, (size_t)d->head_dim);
    size_t es = fa_dtype_size(d->q.dtype);
    int64_t written = 0;
    for (int64_t i = 0; i < count; i++)
        if (!map[i] && memcmp((const char *)got + i * (int64_t)es, (const char *)poison + i * (int64_t)es, es))
            written++;
    free(map);
    return written;
}

/* Relative error of L over the rows the reference finds finite; rows that
 * see no key must be -inf on both sides. */
static double lse_error(const float *got, const float *want, int64_t n, int64_t *inf_mismatch) {
    double num = 0.0, den = 0.0;
    *inf_mismatch = 0;
    for (int64_t i = 0; i < n; i++) {
        int want_inf = isinf(want[i]) && want[i] < 0, got_inf = isinf(got[i]) && got[i] < 0;
        if (want_inf || got_inf || !isfinite(got[i])) {
            *inf_mismatch += !(want_inf && got_inf);
            continue;
        }
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

typedef struct tensor {
    int64_t count;
    size_t bytes;
    void *host;
    fa_buffer dev;
} tensor;

static int tensor_init(tensor *t, fa_context ctx, const fa_attention_desc *d, fa_tensor_role role) {
    t->count = fa_desc_tensor_extent(d, role);
    t->bytes = (size_t)t->count * fa_dtype_size(d->q.dtype);
    t->host = malloc(t->bytes + 16);
    t->dev = NULL;
    return t->host && fa_buffer_alloc(ctx, t->bytes ? t->bytes : 16, &t->dev) == FA_SUCCESS;
}

static void tensor_free(tensor *t) {
    free(t->host);
    if (t->dev) fa_buffer_free(t->dev);
    t->host = NULL;
    t->dev = NULL;
}


typedef struct run_opts {
    int backward;   /* also run and check the backward pass */
    int twice;      /* run each pass twice: bit-identical results */
} run_opts;

/* One problem, forward (and backward) on the device and on the references.
 * The backward pass differentiates the exact reference's O and L, as the
 * fused kernels' tests do, so its error is the backward pass's own. */
static void run_case(const char *name, const fa_attention_desc *d, run_opts opt) {
    fa_context ctx = blas_context();
    if (!ctx) return;
    const fa_dtype dt = d->q.dtype;
    const uint64_t seed = suite_case_seed(name, 0);
    const int failures_before = fa_test_failures;
    fa_rng rng;
    fa_rng_seed(&rng, seed);

    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, d, &plan);
    CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s (%s)", name, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return;
    fa_plan_info info;
    CHECK_OK(fa_plan_get_info(plan, &info));
    CHECK_MSG(info.algorithm == FA_ALGO_STANDARD && info.forward.variant == FA_VARIANT_STANDARD &&
                  info.backward.variant == FA_VARIANT_STANDARD,
              "%s: the plan is not a standard-attention plan", name);

    tensor q, k, v, o, dout, dq, dk, dv;
    tensor *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    const fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O,
                                    FA_TENSOR_O, FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V};
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= tensor_init(all[i], ctx, d, roles[i]);
    const int64_t nl = (int64_t)d->heads_q * fa_attention_total_q(d);
    const size_t lbytes = (size_t)(nl > 0 ? nl : 1) * sizeof(float);
    float *lse = malloc(lbytes), *lse_ref = malloc(lbytes), *lse_std = malloc(lbytes), *lse_poison = malloc(lbytes);
    fa_buffer lse_dev = NULL;
    ok &= lse && lse_ref && lse_std && lse_poison && fa_buffer_alloc(ctx, lbytes, &lse_dev) == FA_SUCCESS;
    void *o_ref = malloc(o.bytes + 16), *o_std = malloc(o.bytes + 16), *first = malloc(o.bytes + 16);
    void *poison[4] = {malloc(q.bytes + 16), malloc(k.bytes + 16), malloc(v.bytes + 16), malloc(o.bytes + 16)};
    void *grad_ref[3] = {malloc(dq.bytes + 16), malloc(dk.bytes + 16), malloc(dv.bytes + 16)};
    ok &= o_ref && o_std && first && poison[0] && poison[1] && poison[2] && poison[3] && grad_ref[0] &&
          grad_ref[1] && grad_ref[2];
    CHECK_MSG(ok, "%s: allocation failed", name);
    if (!ok) goto done;

    for (int i = 0; i < 5; i++) {
        void *r = fa_test_random_tensor(&rng, dt, all[i]->count);
        CHECK(r != NULL);
        if (!r) goto done;
        memcpy(all[i]->host, r, all[i]->bytes);
        free(r);
    }
    fa_test_poison(poison[0], dt, q.count);
    fa_test_poison(poison[1], dt, k.count);
    fa_test_poison(poison[2], dt, v.count);
    fa_test_poison(poison[3], dt, o.count);
    fa_test_poison(lse_poison, FA_DTYPE_F32, nl);
    memcpy(o_ref, poison[3], o.bytes);
    memcpy(o_std, poison[3], o.bytes);
    CHECK_OK(fa_ref_forward(d, q.host, k.host, v.host, o_ref, lse_ref));
    CHECK_OK(fa_ref_standard_forward(d, q.host, k.host, v.host, o_std, lse_std));

    CHECK_OK(fa_buffer_upload(q.dev, 0, q.host, q.bytes));
    CHECK_OK(fa_buffer_upload(k.dev, 0, k.host, k.bytes));
    CHECK_OK(fa_buffer_upload(v.dev, 0, v.host, v.bytes));
    double e_same = 0, e_exact = 0, l_same = 0, l_exact = 0;
    for (int run = 0; run < (opt.twice ? 2 : 1); run++) {
        CHECK_OK(fa_buffer_upload(o.dev, 0, poison[3], o.bytes));
        CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_poison, lbytes));
        CHECK_OK(fa_forward(plan, q.dev, k.dev, v.dev, o.dev, lse_dev));
        CHECK_OK(fa_buffer_download(o.dev, 0, o.host, o.bytes));
        CHECK_OK(fa_buffer_download(lse_dev, 0, lse, lbytes));
        if (run == 1) CHECK_MSG(memcmp(first, o.host, o.bytes) == 0, "%s: O differs between two runs", name);
        memcpy(first, o.host, o.bytes);
    }
    double ms = -1.0;
    CHECK_OK(fa_plan_last_time_ms(plan, &ms));
    CHECK_MSG(ms > 0.0, "%s: forward time %g ms", name, ms);

    e_same = layout_error(d, FA_TENSOR_O, o.host, o_std);
    e_exact = layout_error(d, FA_TENSOR_O, o.host, o_ref);
    int64_t elems = 0, differing = layout_differing(d, FA_TENSOR_O, o.host, o_std, &elems);
    if (dt == FA_DTYPE_F32) {
        CHECK_MSG(e_same < SAME_ROUNDING_F32, "%s: O differs from the same-rounding reference by %.3g (limit %.1g)",
                  name, e_same, SAME_ROUNDING_F32);
    } else {
        CHECK_MSG((double)differing <= SAME_ROUNDING_SHARE * (double)elems,
                  "%s: %lld of %lld O elements differ from the same-rounding reference", name, (long long)differing,
                  (long long)elems);
        /* Unfused attention in the dtype, whichever computes it, is as far
         * from the exact result as the CPU's. */
        double e_std = layout_error(d, FA_TENSOR_O, o_std, o_ref);
        CHECK_MSG(e_exact <= 1.25 * e_std + 1e-7, "%s: O error %.3g, the CPU's unfused attention's %.3g", name,
                  e_exact, e_std);
    }
    CHECK_MSG(e_exact < tol_exact(dt), "%s: O relative error %.3g against the exact reference (%s limit %.1g)", name,
              e_exact, fa_dtype_name(dt), tol_exact(dt));
    int64_t gaps = gaps_written(d, FA_TENSOR_O, o.host, poison[3], o.count);
    CHECK_MSG(gaps == 0, "%s: %lld elements outside O's layout were written", name, (long long)gaps);
    int64_t inf_same = 0, inf_exact = 0;
    l_same = lse_error(lse, lse_std, nl, &inf_same);
    l_exact = lse_error(lse, lse_ref, nl, &inf_exact);
    CHECK_MSG(inf_same == 0 && inf_exact == 0, "%s: %lld / %lld L values differ in finiteness", name,
              (long long)inf_same, (long long)inf_exact);
    /* L of rounded scores: fp32-accurate against the same computation; the
     * rounding of S to the dtype moves it from the exact value. */
    CHECK_MSG(l_same < 2e-6, "%s: L differs from the same-rounding reference by %.3g", name, l_same);
    CHECK_MSG(l_exact < (dt == FA_DTYPE_F32 ? 1e-5 : tol_exact(dt) / 4), "%s: L relative error %.3g", name, l_exact);
    fprintf(stderr, "  %-36s %-4s O %.2e (same rounding: %.2e, %lld/%lld differ) L %.2e", name, fa_dtype_name(dt),
            e_exact, e_same, (long long)differing, (long long)elems, l_exact);

    if (opt.backward) {
        tensor *grads[3] = {&dq, &dk, &dv};
        const fa_tensor_role groles[3] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V};
        for (int i = 0; i < 3; i++) memcpy(grad_ref[i], poison[i], grads[i]->bytes);
        CHECK_OK(fa_ref_backward(d, q.host, k.host, v.host, o_ref, lse_ref, dout.host, grad_ref[0], grad_ref[1],
                                 grad_ref[2]));
        CHECK_OK(fa_buffer_upload(o.dev, 0, o_ref, o.bytes));
        CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_ref, lbytes));
        CHECK_OK(fa_buffer_upload(dout.dev, 0, dout.host, dout.bytes));
        void *prev[3] = {NULL, NULL, NULL};
        for (int run = 0; run < (opt.twice ? 2 : 1); run++) {
            for (int i = 0; i < 3; i++) CHECK_OK(fa_buffer_upload(grads[i]->dev, 0, poison[i], grads[i]->bytes));
            CHECK_OK(fa_backward(plan, q.dev, k.dev, v.dev, o.dev, lse_dev, dout.dev, dq.dev, dk.dev, dv.dev));
            for (int i = 0; i < 3; i++) CHECK_OK(fa_buffer_download(grads[i]->dev, 0, grads[i]->host, grads[i]->bytes));
            CHECK_OK(fa_plan_last_time_ms(plan, &ms));
            CHECK_MSG(ms > 0.0, "%s: backward time %g ms", name, ms);
            if (run == 1) {
                for (int i = 0; i < 3; i++)
                    CHECK_MSG(prev[i] && memcmp(prev[i], grads[i]->host, grads[i]->bytes) == 0,
                              "%s: gradient %d differs between two runs", name, i);
            } else if (opt.twice) {
                for (int i = 0; i < 3; i++) {
                    prev[i] = malloc(grads[i]->bytes + 1);
                    if (prev[i]) memcpy(prev[i], grads[i]->host, grads[i]->bytes);
                }
            }
        }
        for (int i = 0; i < 3; i++) free(prev[i]);
        static const char *const gnames[3] = {"dQ", "dK", "dV"};
        for (int i = 0; i < 3; i++) {
            double e = layout_error(d, groles[i], grads[i]->host, grad_ref[i]);
            CHECK_MSG(e < tol_exact(dt), "%s: %s relative error %.3g (%s limit %.1g)", name, gnames[i], e,
                      fa_dtype_name(dt), tol_exact(dt));
            int64_t g = gaps_written(d, groles[i], grads[i]->host, poison[i], grads[i]->count);
            CHECK_MSG(g == 0, "%s: %lld elements outside %s's layout were written", name, (long long)g, gnames[i]);
            fprintf(stderr, "  %s %.2e", gnames[i], e);
        }
    }
    fputc('\n', stderr);

done:
    if (fa_test_failures != failures_before)
        fprintf(stderr, "  %s: inputs from seed 0x%016llx\n", name, (unsigned long long)seed);
    for (int i = 0; i < 8; i++) tensor_free(all[i]);
    if (lse_dev) fa_buffer_free(lse_dev);
    free(lse);
    free(lse_ref);
    free(lse_std);
    free(lse_poison);
    free(o_ref);
    free(o_std);
    free(first);
    for (int i = 0; i < 4; i++) free(poison[i]);
    for (int i = 0; i < 3; i++) free(grad_ref[i]);
    fa_plan_destroy(plan);
}

static void run(const char *name, const fa_attention_desc *d, int backward) {
    run_opts opt = {backward, 0};
    run_case(name, d, opt);
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

FA_TEST(dtypes) {
    REQUIRE_BLAS();
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(dts[i], 2, 100, 120, 2, 2, 64);
        run("dtypes b2 h2 100x120 d64", &d, 1);
    }
}

FA_TEST(head_dims) {
    REQUIRE_BLAS();
    const int dims[] = {32, 64, 128};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 70, 90, 2, 2, dims[i]);
        char name[64];
        snprintf(name, sizeof name, "head_dim %d", dims[i]);
        run(name, &d, 1);
    }
    fa_attention_desc d = make_desc(FA_DTYPE_F16, 1, 60, 80, 2, 1, 128);
    run("head_dim 128 fp16 mqa", &d, 1);
    d = make_desc(FA_DTYPE_BF16, 1, 50, 40, 1, 1, 32);
    d.softmax_scale = 0.3f;
    run("head_dim 32 bf16 scale 0.3", &d, 1);
}

FA_TEST(causal) {
    REQUIRE_BLAS();
    const int shapes[][2] = {{50, 140}, {100, 100}, {140, 50}};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, shapes[i][0], shapes[i][1], 2, 2, 64);
        d.causal = 1;
        char name[64];
        snprintf(name, sizeof name, "causal %dx%d", shapes[i][0], shapes[i][1]);
        run(name, &d, 1);
    }
    fa_attention_desc d = make_desc(FA_DTYPE_F16, 1, 120, 97, 2, 2, 64);
    d.causal = 1;
    run("causal 120x97 fp16", &d, 1);
}

FA_TEST(sliding_window) {
    REQUIRE_BLAS();
    const int w[][3] = {{20, 5, 0}, {-1, 10, 0}, {7, 3, 1}};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(i == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F32, 1, 150, i % 2 ? 110 : 170, 2, 2, 32);
        d.window_left = w[i][0];
        d.window_right = w[i][1];
        d.causal = w[i][2];
        char name[64];
        snprintf(name, sizeof name, "window %d,%d%s %dx%d", w[i][0], w[i][1], w[i][2] ? " causal" : "", d.seqlen_q,
                 d.seqlen_k);
        run(name, &d, 1);
    }
}

/* About half the blocks on, and one whole block row off: its rows see no
 * key (L = -inf, O = 0, dQ = 0). */

FA_TEST(block_sparse) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 150, 170, 2, 2, 64);
    uint8_t *m = suite_random_block_mask(&d, 16, 24, 11);
    CHECK(m != NULL);
    if (m) run("block-sparse 16x24", &d, 1);
    free(m);
    d = make_desc(FA_DTYPE_F16, 1, 200, 130, 2, 2, 32);
    m = suite_random_block_mask(&d, 40, 8, 12);
    d.causal = 1;
    CHECK(m != NULL);
    if (m) run("block-sparse 40x8 causal fp16", &d, 1);
    free(m);
}

FA_TEST(dropout) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 100, 122, 2, 2, 64);
    d.dropout_p = 0.17f;
    d.dropout_seed = 0x123456789abcdefull;
    d.dropout_offset = 0x500000007ull;
    run("dropout 0.17", &d, 1);
    d = make_desc(FA_DTYPE_F16, 1, 90, 90, 3, 1, 32);
    d.causal = 1;
    d.dropout_p = 0.5f;
    d.dropout_seed = 42;
    run("dropout 0.5 causal mqa fp16", &d, 1);
}

/* With V the identity (key j carries a 1 in dimension j), O[i][j] is
 * P[i][j] * z_ij / (1 - p): the kept and dropped elements read off O must
 * be fa_dropout_keep's, bit for bit. */
FA_TEST(dropout_mask_bits) {
    REQUIRE_BLAS();
    fa_context ctx = blas_context();
    const int sq = 40, sk = 64, dim = 64, heads = 2;
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, sq, sk, heads, heads, dim);
    d.dropout_p = 0.25f;
    d.dropout_seed = 0xfeedface12345ull;
    d.dropout_offset = 3;
    d.softmax_scale = 0.05f; /* keeps every P well above 0 */
    size_t nq = (size_t)2 * sq * heads * dim, nk = (size_t)2 * sk * heads * dim;
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed("dropout_mask_bits", 0));
    float *q = fa_test_random_tensor(&rng, FA_DTYPE_F32, (int64_t)nq);
    float *k = fa_test_random_tensor(&rng, FA_DTYPE_F32, (int64_t)nk);
    float *v = calloc(nk, sizeof(float));
    float *o = malloc(nq * sizeof(float));
    fa_buffer bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL;
    fa_plan plan = NULL;
    CHECK(q && k && v && o);
    if (!(q && k && v && o)) goto out;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < sk; j++)
            for (int h = 0; h < heads; h++) v[(((size_t)b * sk + j) * heads + h) * dim + j] = 1.0f;
    fa_test_poison(o, FA_DTYPE_F32, (int64_t)nq);
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK_OK(fa_buffer_alloc(ctx, nq * 4, &bq));
    CHECK_OK(fa_buffer_alloc(ctx, nk * 4, &bk));
    CHECK_OK(fa_buffer_alloc(ctx, nk * 4, &bv));
    CHECK_OK(fa_buffer_alloc(ctx, nq * 4, &bo));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)2 * heads * sq * 4, &bl));
    if (!plan || !bq || !bk || !bv || !bo || !bl) goto out;
    CHECK_OK(fa_buffer_upload(bq, 0, q, nq * 4));
    CHECK_OK(fa_buffer_upload(bk, 0, k, nk * 4));
    CHECK_OK(fa_buffer_upload(bv, 0, v, nk * 4));
    CHECK_OK(fa_buffer_upload(bo, 0, o, nq * 4));
    CHECK_OK(fa_forward(plan, bq, bk, bv, bo, bl));
    CHECK_OK(fa_buffer_download(bo, 0, o, nq * 4));
    int64_t wrong = 0, dropped = 0, total = 0;
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < sq; i++)
                for (int j = 0; j < sk; j++) {
                    float val = o[(((size_t)b * sq + i) * heads + h) * dim + j];
                    int keep = fa_dropout_keep(d.dropout_seed, d.dropout_offset, d.dropout_p, b, h, heads, i, j);
                    wrong += (val != 0.0f) != keep || !isfinite(val);
                    dropped += !keep;
                    total++;
                }
    CHECK_MSG(wrong == 0, "%lld of %lld dropout decisions differ from the reference", (long long)wrong,
              (long long)total);
    CHECK_MSG(dropped > total / 8 && dropped < total / 2, "%lld of %lld dropped at p = 0.25", (long long)dropped,
              (long long)total);
out:
    if (plan) fa_plan_destroy(plan);
    fa_buffer bufs[] = {bq, bk, bv, bo, bl};
    for (int i = 0; i < 5; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    free(q);
    free(k);
    free(v);
    free(o);
}

/* dK and dV sum over the query heads of a group (one product per member,
 * accumulated): the same bits on every run. */
FA_TEST(gqa_mqa) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 32);
    run_opts twice = {1, 1};
    run_case("gqa 6/2 twice", &d, twice);
    d = make_desc(FA_DTYPE_BF16, 1, 100, 80, 4, 1, 64);
    d.causal = 1;
    run("mqa 4/1 causal bf16", &d, 1);
}

FA_TEST(varlen) {
    REQUIRE_BLAS();
    /* Sequence 1 has no queries (its dK, dV rows are 0), sequence 3 no
     * keys (its rows: L = -inf, O = 0, dQ = 0). */
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 4, 77, 100, 2, 2, 32);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    run("varlen", &d, 1);
    d = make_desc(FA_DTYPE_F16, 4, 77, 100, 4, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.dropout_p = 0.1f;
    d.dropout_seed = 5;
    run("varlen causal dropout gqa fp16", &d, 1);
}

FA_TEST(strides_offsets) {
    REQUIRE_BLAS();
    /* BHSD: [batch, heads, seq, dim]; fp32 tensors are used in place. */
    const int b = 2, sq = 70, sk = 90, hq = 4, hkv = 2, dim = 32;
    fa_attention_desc d = make_desc(FA_DTYPE_F32, b, sq, sk, hq, hkv, dim);
    fa_tensor_desc *t[] = {&d.q, &d.k, &d.v, &d.o};
    for (int i = 0; i < 4; i++) {
        int heads = i == 1 || i == 2 ? hkv : hq, seq = i == 1 || i == 2 ? sk : sq;
        t[i]->stride_seq = dim;
        t[i]->stride_head = (int64_t)seq * dim;
        t[i]->stride_batch = (int64_t)heads * seq * dim;
    }
    run("bhsd fp32", &d, 1);
    /* Padded rows and offsets, every tensor its own. */
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        d = make_desc(dts[i], b, sq, sk, hq, hkv, 64);
        d.q.offset = 24;
        d.q.stride_seq = hq * 64 + 16;
        d.q.stride_batch = sq * d.q.stride_seq;
        d.k.offset = 8;
        d.k.stride_seq = hkv * 64 + 8;
        d.k.stride_head = 64;
        d.k.stride_batch = sk * d.k.stride_seq + 32;
        d.v.offset = 64;
        d.v.stride_head = 72;
        d.v.stride_seq = hkv * 72;
        d.v.stride_batch = (int64_t)sk * hkv * 72 + 8;
        d.o.offset = 40;
        d.o.stride_seq = hq * 64 + 8;
        d.o.stride_batch = sq * d.o.stride_seq;
        d.causal = 1;
        run(i ? "padded strides and offsets fp16" : "padded strides and offsets fp32", &d, 1);
    }
    static const int32_t cu_q[] = {0, 30, 100};
    static const int32_t cu_k[] = {0, 55, 90};
    d = make_desc(FA_DTYPE_BF16, 2, 70, 55, 2, 2, 32);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.q.offset = 16;
    d.q.stride_seq = 2 * 32 + 8;
    d.o.stride_head = 40;
    d.o.stride_seq = 2 * 40;
    run("varlen strides bf16", &d, 1);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    d.q.offset = 8;
    run("varlen strides fp32", &d, 1);
}

/* One query per sequence (decoding): a tensor whose token stride CLBlast
 * could not take as a leading dimension (16 elements for 64-wide rows) is
 * valid when each sequence holds one token. */
FA_TEST(single_query) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 3, 1, 300, 4, 2, 64);
    d.q.stride_seq = 16;
    d.q.stride_head = 64;
    d.q.stride_batch = 4 * 64 + 16;
    run("decode 1x300 narrow stride", &d, 1);
}

#ifdef FA_WITH_OPENCL
/* The device's CL_DEVICE_MAX_MEM_ALLOC_SIZE, from the backend's records. */
static uint64_t max_alloc_bytes(fa_context ctx) {
    fa_device_info info;
    if (fa_context_get_info(ctx, &info) != FA_SUCCESS) return 0;
    const fa_cl_device *dev = fa_cl_device_get(info.index);
    return dev ? (uint64_t)dev->max_alloc_bytes : 0;
}
#endif

/* A score matrix the device cannot hold is FA_ERR_OUT_OF_MEMORY at plan
 * creation, with a message that says so, and leaves the context usable. */
FA_TEST(out_of_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = blas_context();
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    const uint64_t max_alloc = max_alloc_bytes(ctx), global = info.desc.global_mem_bytes;
    CHECK_MSG(max_alloc > 0 && global > 0, "device reports max alloc %llu, global memory %llu",
              (unsigned long long)max_alloc, (unsigned long long)global);
    if (!(max_alloc > 0 && global > 0)) return;

    /* One head's S larger than one buffer may be, though the device has the
     * memory for it. */
    const int n1 = (int)sqrt((double)max_alloc / 4.0) + 64;
    if ((double)n1 * n1 * 4.0 < (double)global) {
        fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, n1, n1, 1, 1, 8);
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S of %d x %d (max alloc %llu): %s (%s)", n1, n1,
                  (unsigned long long)max_alloc, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    } else {
        fprintf(stderr, "  one buffer may hold all the device memory: no per-buffer case\n");
    }
    /* Larger than the whole device: seqlen 65536, twice the global memory. */
    {
        const int n = 65536;
        const double per_head = (double)n * n * 4.0;
        int heads = (int)(2.0 * (double)global / per_head) + 1;
        fa_attention_desc d = make_desc(FA_DTYPE_F16, 1, n, n, heads, 1, 8);
        d.causal = 1;
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S of %.0f bytes (global %llu): %s (%s)",
                  per_head * heads, (unsigned long long)global, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "global memory") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
    /* Nothing was left behind: an ordinary problem still runs. */
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 33, 47, 2, 2, 16);
    run("after out of memory", &d, 1);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

/* Score matrices split over several buffers (as they are when one buffer
 * cannot hold them, or CLBlast could not index them): a cap of a few blocks
 * per buffer puts chunk boundaries inside sequences and inside the query
 * heads of one kv head, whose dK and dV sums cross them. */
FA_TEST(chunked_scores) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = blas_context();
    /* 6 query heads over 2 kv heads, 90 x 110 blocks: 2.5 blocks a buffer. */
    fa_cl_standard_set_chunk_limit((size_t)90 * 110 * 4 * 5 / 2);
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 32);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        int chunks = fa_cl_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 6, "12 blocks, two to a buffer: %d buffers", chunks);
        fa_plan_destroy(plan);
    }
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 77;
    run("chunked gqa causal dropout", &d, 1);
    /* Buffers of 24750 elements: sequence 0's four 40 x 70 blocks and two
     * of sequence 2's 90 x 65 ones in the first, sequence 2's other two in
     * the second (sequence 1 has no queries). */
    static const int32_t cu_q[] = {0, 40, 40, 130};
    static const int32_t cu_k[] = {0, 70, 95, 160};
    d = make_desc(FA_DTYPE_F16, 3, 90, 70, 4, 1, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        int chunks = fa_cl_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 2, "blocks of 2800 and 5850 elements, 24750 to a buffer: %d buffers", chunks);
        fa_plan_destroy(plan);
    }
    run("chunked varlen mqa fp16", &d, 1);
    fa_cl_standard_set_chunk_limit(0);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

/* The plan holds the score matrix in device memory (the quantity the
 * benchmark plots against the sequence length), the backward pass's second
 * matrix only once it has run. */
FA_TEST(device_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = blas_context();
    const int batch = 2, sq = 64, sk = 96, hq = 3, dim = 32;
    fa_attention_desc d = make_desc(FA_DTYPE_F32, batch, sq, sk, hq, 1, dim);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (!plan) return;
    /* fp32 tensors are used in place: besides S only a few small vectors
     * (offsets, placeholders), then dS and D. */
    const size_t scores = (size_t)batch * hq * sq * sk * sizeof(float), rows = (size_t)batch * hq * sq * sizeof(float);
    const size_t small = 1024;
    size_t bytes = 0;
    CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
    CHECK_MSG(bytes >= scores && bytes <= scores + small, "forward plan holds %zu bytes, S alone is %zu", bytes,
              scores);
    const size_t nq = (size_t)batch * sq * hq * dim, nk = (size_t)batch * sk * dim;
    const size_t sizes[9] = {nq, nk, nk, nq, rows / sizeof(float), nq, nq, nk, nk};
    fa_buffer bufs[9] = {NULL};
    int ok = 1;
    for (int i = 0; i < 9; i++) ok &= fa_buffer_alloc(ctx, sizes[i] * sizeof(float), &bufs[i]) == FA_SUCCESS;
    CHECK(ok);
    if (ok) {
        fa_rng rng;
        fa_rng_seed(&rng, suite_case_seed("device_memory", 0));
        for (int i = 0; i < 6; i++) {
            if (i == 4) continue; /* L: the forward pass writes it */
            void *r = fa_test_random_tensor(&rng, FA_DTYPE_F32, (int64_t)sizes[i]);
            if (r) CHECK_OK(fa_buffer_upload(bufs[i], 0, r, sizes[i] * sizeof(float)));
            free(r);
        }
        CHECK_OK(fa_forward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]));
        CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes <= scores + small, "the forward pass allocated: %zu bytes", bytes);
        CHECK_OK(fa_backward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8]));
        CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes >= 2 * scores + rows && bytes <= 2 * scores + rows + small,
                  "after backward the plan holds %zu bytes; S, dS and D are %zu", bytes, 2 * scores + rows);
    }
    for (int i = 0; i < 9; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    fa_plan_destroy(plan);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

#ifdef FA_WITH_OPENCL
/* The check itself: with CLBlast unloadable, a standard plan fails with
 * FA_ERR_UNSUPPORTED and a message naming CLBlast and the file tried, and
 * the fused path is unaffected. */
static void expect_missing_clblast(fa_context ctx) {
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 16, 16, 1, 1, 16);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, &d, &plan);
    CHECK_MSG(st == FA_ERR_UNSUPPORTED && plan == NULL, "with %s=%s: %s (%s)", CLBLAST_ENV, MISSING_CLBLAST,
              fa_status_string(st), fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "CLBlast") && strstr(fa_last_error(), MISSING_CLBLAST),
              "the message names neither CLBlast nor the file: %s", fa_last_error());
    if (plan) fa_plan_destroy(plan);
    d.algorithm = FA_ALGO_FUSED;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) fa_plan_destroy(plan);
}
#endif

FA_TEST(clblast_missing) {
    fa_context ctx = context();
    if (!ctx) FA_SKIP(g_skip);
#ifdef FA_WITH_OPENCL
    if (!fa_cl_standard_blas_loaded()) {
        /* Nothing loaded it yet in this process: the environment decides. */
        CHECK(setenv(CLBLAST_ENV, MISSING_CLBLAST, 1) == 0);
        expect_missing_clblast(ctx);
        CHECK(unsetenv(CLBLAST_ENV) == 0);
        return;
    }
    /* Loaded by an earlier case: ask a fresh process running this case. */
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    CHECK(env != NULL);
    if (!env) return;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], CLBLAST_ENV "=", sizeof CLBLAST_ENV) != 0) env[m++] = environ[i];
    env[m++] = (char *)CLBLAST_ENV "=" MISSING_CLBLAST;
    char *argv[] = {(char *)"test_opencl_standard", (char *)"clblast_missing", NULL};
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env);
    free(env);
    CHECK_MSG(rc == 0, "posix_spawn: %s", strerror(rc));
    if (rc != 0) return;
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process checking a missing CLBlast failed");
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

FA_TEST_MAIN(FA_CASE(clblast_missing), FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal),
             FA_CASE(sliding_window), FA_CASE(block_sparse), FA_CASE(dropout), FA_CASE(dropout_mask_bits),
             FA_CASE(gqa_mqa), FA_CASE(varlen), FA_CASE(strides_offsets), FA_CASE(single_query),
             FA_CASE(out_of_memory), FA_CASE(chunked_scores), FA_CASE(device_memory))
