/* Standard (unfused) attention on the CUDA backend (FA_ALGO_STANDARD: S, P,
 * dP and dS in device memory, products through cuBLAS), through the public
 * API, against two CPU references:
 *
 *   fa_ref_standard_forward  the same computation with the same rounding
 *                            points (S and P rounded to the dtype, fp32
 *                            accumulation): only the order of the sums and
 *                            the device's exp differ, so O and L agree to
 *                            about one unit of the dtype;
 *   fa_ref_forward / fa_ref_backward   exact (fp64): within the dtype's
 *                            tolerance (GUIDE section 2).
 *
 * Every run starts from fresh random inputs and NaN-poisoned outputs; every
 * element of every output is checked, and the gaps of strided layouts must
 * keep their poison. Cases skip where no CUDA device (or NVRTC) exists, and
 * where cuBLAS cannot be loaded (except the case that checks that refusal).
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

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#include "backends/cuda/cuda_standard.h"
#endif

extern char **environ;

#define CUBLAS_ENV "FLASHATTN_CUBLAS_LIBRARY"
#define MISSING_CUBLAS "/nonexistent/flashattn-test/libcublas.so.13"

static fa_context g_ctx;
static char g_skip[512];

/* The CUDA backend's best device, with NVRTC to compile for it; NULL
 * (reason in g_skip) otherwise. */
static fa_context context(void) {
    if (g_ctx) return g_ctx;
#ifndef FA_WITH_CUDA
    snprintf(g_skip, sizeof g_skip, "the CUDA backend is not built into this library");
    return NULL;
#else
    fa_status st = fa_context_create(FA_BACKEND_CUDA, -1, &g_ctx);
    if (st != FA_SUCCESS) {
        snprintf(g_skip, sizeof g_skip, "no CUDA device: %s (%s)", fa_status_string(st), fa_last_error());
        g_ctx = NULL;
        return NULL;
    }
    char why[256];
    if (!fa_cuda_nvrtc_available(why, sizeof why)) {
        snprintf(g_skip, sizeof g_skip, "a CUDA device but no NVRTC to compile kernels: %s", why);
        fa_context_destroy(g_ctx);
        g_ctx = NULL;
        return NULL;
    }
    fa_device_info info;
    if (fa_context_get_info(g_ctx, &info) == FA_SUCCESS)
        fprintf(stderr, "  running on %s (%s, driver %s)\n", info.desc.name, info.desc.arch, info.driver_version);
    return g_ctx;
#endif
}

static fa_attention_desc make_desc(fa_dtype dt, int batch, int sq, int sk, int hq, int hkv, int dim) {
    fa_attention_desc d = suite_desc(dt, batch, sq, sk, hq, hkv, dim);
    d.algorithm = FA_ALGO_STANDARD;
    return d;
}

/* A device with cuBLAS: every case but the one about its absence needs
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
 * about 1e-3, bf16 about 1e-2), with the margins the fused kernels get;
 * TF32 products keep 10 bits of mantissa, as fp16 does. */
static double tol_exact(const fa_attention_desc *d) {
    if (d->q.dtype == FA_DTYPE_F16) return 3e-3;
    if (d->q.dtype == FA_DTYPE_BF16) return 2e-2;
    return d->allow_tf32 ? 5e-3 : 1e-5;
}

/* Same rounding points. fp32: the norm of the difference, a few units in the
 * last place. fp16 and bf16: at most this share of O's elements may differ
 * from the reference's bits. Only a value next to a rounding boundary of the
 * dtype (a score, a probability, an element of O) may round the other way
 * when the sums run in another order; rounding at other points (scores kept
 * in fp32, say) changes most elements. */
#define SAME_ROUNDING_F32 1e-6
#define SAME_ROUNDING_SHARE 0.10

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

/* Elements of the layout whose bits differ; *total: elements of the layout. */
static int64_t layout_differing(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *want,
                                int64_t *total) {
    const size_t es = fa_dtype_size(d->q.dtype);
    int64_t n = 0, differ = 0;
    for (int b = 0; b < d->batch; b++)
        for (int t = 0; t < len_of(d, role, b); t++)
            for (int h = 0; h < heads_of(d, role); h++) {
                const int64_t i = fa_ref_index(d, role, b, t, h, 0);
                for (int x = 0; x < d->head_dim; x++, n++)
                    differ += memcmp((const char *)got + (i + x) * (int64_t)es,
                                     (const char *)want + (i + x) * (int64_t)es, es) != 0;
            }
    *total = n;
    return differ;
}

/* ||got - want|| / ||want|| over the layout's elements (INFINITY when got
 * holds a non-finite value); where want is all zeros (every row masked),
 * the RMS of got instead. */
static double layout_error(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *want) {
    double num = 0.0, den = 0.0;
    int64_t n = 0;
    for (int b = 0; b < d->batch; b++)
        for (int t = 0; t < len_of(d, role, b); t++)
            for (int h = 0; h < heads_of(d, role); h++)
                for (int x = 0; x < d->head_dim; x++) {
                    const int64_t i = fa_ref_index(d, role, b, t, h, x);
                    const double g = fa_load_elem(got, d->q.dtype, i), w = fa_load_elem(want, d->q.dtype, i);
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
    const size_t es = fa_dtype_size(d->q.dtype);
    int64_t written = 0;
    for (int64_t i = 0; i < count; i++)
        if (!map[i] && memcmp((const char *)got + i * (int64_t)es, (const char *)poison + i * (int64_t)es, es))
            written++;
    free(map);
    return written;
}

/* Relative error of L over the rows the reference finds finite; rows that
 * see no key must be -inf on both sides (counted in *inf_mismatch). */
static double lse_error(const float *got, const float *want, int64_t n, int64_t *inf_mismatch) {
    double num = 0.0, den = 0.0;
    *inf_mismatch = 0;
    for (int64_t i = 0; i < n; i++) {
        const int want_inf = isinf(want[i]) && want[i] < 0, got_inf = isinf(got[i]) && got[i] < 0;
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
    int backward; /* also run and check the backward pass */
    int twice;    /* run each pass twice: bit-identical results */
} run_opts;

/* One problem, forward (and backward) on the device and on the references.
 * The backward pass differentiates the exact reference's O and L, as the
 * fused kernels' tests do, so its error is the backward pass's own. */
static void run_case(const char *name, const fa_attention_desc *d, run_opts opt) {
    fa_context ctx = blas_context();
    if (!ctx) return;
    const fa_dtype dt = d->q.dtype;
    const double tol = tol_exact(d);
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
    CHECK_MSG(ms > 0.0 && isfinite(ms), "%s: forward time %g ms", name, ms);

    const double e_same = layout_error(d, FA_TENSOR_O, o.host, o_std);
    const double e_exact = layout_error(d, FA_TENSOR_O, o.host, o_ref);
    int64_t elems = 0;
    const int64_t differing = layout_differing(d, FA_TENSOR_O, o.host, o_std, &elems);
    if (dt == FA_DTYPE_F32 && !d->allow_tf32) {
        CHECK_MSG(e_same < SAME_ROUNDING_F32, "%s: O differs from the same-rounding reference by %.3g (limit %.1g)",
                  name, e_same, SAME_ROUNDING_F32);
    } else if (dt != FA_DTYPE_F32) {
        CHECK_MSG((double)differing <= SAME_ROUNDING_SHARE * (double)elems,
                  "%s: %lld of %lld O elements differ from the same-rounding reference", name, (long long)differing,
                  (long long)elems);
        /* Unfused attention in the dtype, whichever device computes it, is
         * as far from the exact result as the CPU's. */
        const double e_std = layout_error(d, FA_TENSOR_O, o_std, o_ref);
        CHECK_MSG(e_exact <= 1.25 * e_std + 1e-7, "%s: O error %.3g, the CPU's unfused attention's %.3g", name,
                  e_exact, e_std);
    }
    CHECK_MSG(e_exact < tol, "%s: O relative error %.3g against the exact reference (limit %.1g)", name, e_exact,
              tol);
    const int64_t gaps = gaps_written(d, FA_TENSOR_O, o.host, poison[3], o.count);
    CHECK_MSG(gaps == 0, "%s: %lld elements outside O's layout were written", name, (long long)gaps);
    int64_t inf_same = 0, inf_exact = 0;
    const double l_same = lse_error(lse, lse_std, nl, &inf_same);
    const double l_exact = lse_error(lse, lse_ref, nl, &inf_exact);
    CHECK_MSG(inf_same == 0 && inf_exact == 0, "%s: %lld / %lld L values differ in finiteness", name,
              (long long)inf_same, (long long)inf_exact);
    /* L of the scores as rounded: fp32-accurate against the same
     * computation, up to the scores a different summation order rounds the
     * other way; the rounding of S moves it from the exact value. */
    const double l_same_tol = dt == FA_DTYPE_F32 ? (d->allow_tf32 ? 1e-3 : 2e-6) : 1e-5;
    CHECK_MSG(l_same < l_same_tol, "%s: L differs from the same-rounding reference by %.3g", name, l_same);
    CHECK_MSG(l_exact < (dt == FA_DTYPE_F32 && !d->allow_tf32 ? 1e-5 : tol / 4), "%s: L relative error %.3g", name,
              l_exact);
    fprintf(stderr, "  %-40s %-4s O %.2e (same rounding: %.2e, %lld/%lld differ) L %.2e", name, fa_dtype_name(dt),
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
            for (int i = 0; i < 3; i++)
                CHECK_OK(fa_buffer_download(grads[i]->dev, 0, grads[i]->host, grads[i]->bytes));
            CHECK_OK(fa_plan_last_time_ms(plan, &ms));
            CHECK_MSG(ms > 0.0 && isfinite(ms), "%s: backward time %g ms", name, ms);
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
            const double e = layout_error(d, groles[i], grads[i]->host, grad_ref[i]);
            CHECK_MSG(e < tol, "%s: %s relative error %.3g (%s limit %.1g)", name, gnames[i], e, fa_dtype_name(dt),
                      tol);
            const int64_t g = gaps_written(d, groles[i], grads[i]->host, poison[i], grads[i]->count);
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

static void run(const char *name, const fa_attention_desc *d) {
    run_opts opt = {1, 0};
    run_case(name, d, opt);
}

static const fa_dtype all_dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

FA_TEST(dtypes) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 2, 100, 120, 2, 2, 64);
        run("dtypes b2 h2 100x120 d64", &d);
    }
    /* fp32 on TF32 tensor cores, where the caller allows it. */
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 100, 120, 2, 2, 64);
    d.allow_tf32 = 1;
    run("tf32 b2 h2 100x120 d64", &d);
}

FA_TEST(head_dims) {
    REQUIRE_BLAS();
    const int dims[] = {64, 128};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            fa_attention_desc d = make_desc(all_dtypes[i], 1, 70, 90, 2, 2, dims[j]);
            char name[64];
            snprintf(name, sizeof name, "head_dim %d", dims[j]);
            run(name, &d);
        }
    fa_attention_desc d = make_desc(FA_DTYPE_BF16, 1, 50, 40, 1, 1, 32);
    d.softmax_scale = 0.3f;
    run("head_dim 32 scale 0.3", &d);
}

FA_TEST(causal) {
    REQUIRE_BLAS();
    const int shapes[][2] = {{50, 140}, {100, 100}, {140, 50}};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 3; t++) {
            fa_attention_desc d = make_desc(all_dtypes[t], 2, shapes[i][0], shapes[i][1], 2, 2, 64);
            d.causal = 1;
            char name[64];
            snprintf(name, sizeof name, "causal %dx%d", shapes[i][0], shapes[i][1]);
            run(name, &d);
        }
}

FA_TEST(sliding_window) {
    REQUIRE_BLAS();
    const int w[][3] = {{20, 5, 0}, {-1, 10, 0}, {7, 3, 1}};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 1, 150, i % 2 ? 110 : 170, 2, 2, 64);
        d.window_left = w[i][0];
        d.window_right = w[i][1];
        d.causal = w[i][2];
        char name[64];
        snprintf(name, sizeof name, "window %d,%d%s %dx%d", w[i][0], w[i][1], w[i][2] ? " causal" : "", d.seqlen_q,
                 d.seqlen_k);
        run(name, &d);
    }
}

/* About half the blocks on, and one whole block row off: its rows see no
 * key (L = -inf, O = 0, dQ = 0). */
FA_TEST(block_sparse) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 150, 170, 2, 2, 64);
    uint8_t *m = suite_random_block_mask(&d, 16, 24, 11);
    CHECK(m != NULL);
    if (m) run("block-sparse 16x24", &d);
    free(m);
    d = make_desc(FA_DTYPE_F16, 1, 200, 130, 2, 2, 128);
    m = suite_random_block_mask(&d, 40, 8, 12);
    d.causal = 1;
    CHECK(m != NULL);
    if (m) run("block-sparse 40x8 causal d128", &d);
    free(m);
    d = make_desc(FA_DTYPE_BF16, 2, 64, 96, 4, 2, 64);
    m = suite_random_block_mask(&d, 32, 32, 13);
    CHECK(m != NULL);
    if (m) run("block-sparse 32x32 gqa", &d);
    free(m);
}

FA_TEST(dropout) {
    REQUIRE_BLAS();
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 100, 122, 2, 2, 64);
    d.dropout_p = 0.17f;
    d.dropout_seed = 0x123456789abcdefull;
    d.dropout_offset = 0x500000007ull;
    run("dropout 0.17", &d);
    d = make_desc(FA_DTYPE_F16, 1, 90, 90, 3, 1, 64);
    d.causal = 1;
    d.dropout_p = 0.5f;
    d.dropout_seed = 42;
    run("dropout 0.5 causal mqa", &d);
    d = make_desc(FA_DTYPE_BF16, 2, 70, 130, 2, 2, 128);
    d.dropout_p = 0.1f;
    d.dropout_seed = 9;
    d.dropout_offset = 12345;
    run("dropout 0.1 d128", &d);
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
    const size_t nq = (size_t)2 * sq * heads * dim, nk = (size_t)2 * sk * heads * dim;
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
                    const float val = o[(((size_t)b * sq + i) * heads + h) * dim + j];
                    const int keep = fa_dropout_keep(d.dropout_seed, d.dropout_offset, d.dropout_p, b, h, heads, i, j);
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
 * accumulated; through fp32 for fp16 and bf16): the same bits on every
 * run. */
FA_TEST(gqa_mqa) {
    REQUIRE_BLAS();
    const run_opts twice = {1, 1};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 2, 90, 110, 6, 2, 64);
        run_case("gqa 6/2 twice", &d, twice);
    }
    fa_attention_desc d = make_desc(FA_DTYPE_BF16, 1, 100, 80, 4, 1, 64);
    d.causal = 1;
    run("mqa 4/1 causal", &d);
    d = make_desc(FA_DTYPE_F32, 2, 33, 47, 8, 1, 128);
    run("mqa 8/1 d128", &d);
    /* More kv heads than group members: the products run kv head by kv head. */
    d = make_desc(FA_DTYPE_F16, 1, 60, 70, 8, 4, 64);
    run("gqa 8/4", &d);
}

FA_TEST(varlen) {
    REQUIRE_BLAS();
    /* Sequence 1 has no queries (its dK, dV rows are 0), sequence 3 no keys
     * (its rows: L = -inf, O = 0, dQ = 0). */
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 4, 77, 100, 2, 2, 64);
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        run("varlen", &d);
    }
    fa_attention_desc d = make_desc(FA_DTYPE_F16, 4, 77, 100, 4, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.dropout_p = 0.1f;
    d.dropout_seed = 5;
    run("varlen causal dropout gqa", &d);
    /* Equal lengths: sequences may share a strided call. */
    static const int32_t cu_e[] = {0, 40, 80, 120};
    d = make_desc(FA_DTYPE_BF16, 3, 40, 40, 2, 1, 128);
    d.cu_seqlens_q = cu_e;
    d.cu_seqlens_k = cu_e;
    run("varlen equal lengths mqa d128", &d);
}

FA_TEST(strides_offsets) {
    REQUIRE_BLAS();
    /* BHSD: [batch, heads, seq, dim]; the head stride then steps whole
     * sequences, and all (sequence, head) pairs fit one strided call. */
    const int b = 2, sq = 70, sk = 90, hq = 4, hkv = 2;
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], b, sq, sk, hq, hkv, 64);
        fa_tensor_desc *t[] = {&d.q, &d.k, &d.v, &d.o};
        for (int r = 0; r < 4; r++) {
            const int heads = r == 1 || r == 2 ? hkv : hq, seq = r == 1 || r == 2 ? sk : sq;
            t[r]->stride_seq = 64;
            t[r]->stride_head = (int64_t)seq * 64;
            t[r]->stride_batch = (int64_t)heads * seq * 64;
        }
        run("bhsd", &d);
    }
    /* Padded rows and offsets, every tensor its own. */
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], b, sq, sk, hq, hkv, 64);
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
        run("padded strides and offsets causal", &d);
    }
    static const int32_t cu_q[] = {0, 30, 100};
    static const int32_t cu_k[] = {0, 55, 90};
    fa_attention_desc d = make_desc(FA_DTYPE_BF16, 2, 70, 55, 2, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.q.offset = 16;
    d.q.stride_seq = 2 * 64 + 8;
    d.o.stride_head = 72;
    d.o.stride_seq = 2 * 72;
    run("varlen strides", &d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    d.q.offset = 8;
    run("varlen strides", &d);
}

/* Sequence lengths from one token to a thousand, each dtype. */
FA_TEST(lengths) {
    REQUIRE_BLAS();
    const int lens[] = {1, 7, 127, 1000};
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 3; t++) {
            fa_attention_desc d = make_desc(all_dtypes[t], 1, lens[i], lens[i], 2, 1, 64);
            char name[64];
            snprintf(name, sizeof name, "length %d", lens[i]);
            run(name, &d);
        }
    fa_attention_desc d = make_desc(FA_DTYPE_F16, 2, 1, 1000, 2, 2, 128);
    run("decode 1x1000 d128", &d);
    d = make_desc(FA_DTYPE_F32, 1, 127, 7, 2, 2, 64);
    d.causal = 1;
    run("127x7 causal (rows without keys)", &d);
}

/* One query per sequence (decoding): a tensor whose token stride is
 * narrower than a row (16 elements for 64-wide rows) is valid when each
 * sequence holds one token; cuBLAS wants a leading dimension of a row. */
FA_TEST(single_query) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 3, 1, 300, 4, 2, 64);
        d.q.stride_seq = 16;
        d.q.stride_head = 64;
        d.q.stride_batch = 4 * 64 + 16;
        run("decode 1x300 narrow stride", &d);
    }
}

/* The path of layouts cuBLAS cannot address (a token stride beyond 32
 * bits): every tensor copied to its packed form and the results back,
 * forced here on small problems. */
FA_TEST(packed_copies) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_cuda_standard_set_force_pack(1);
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = make_desc(all_dtypes[i], 2, 50, 60, 4, 2, 64);
        d.q.offset = 16;
        d.q.stride_seq = 4 * 64 + 16;
        d.q.stride_batch = 50 * d.q.stride_seq;
        d.v.stride_head = 72;
        d.v.stride_seq = 2 * 72;
        d.v.stride_batch = 60 * 2 * 72;
        d.o.offset = 8;
        d.o.stride_seq = 4 * 64 + 8;
        d.o.stride_batch = 50 * d.o.stride_seq + 64;
        d.causal = i == 1;
        run("packed copies gqa", &d);
    }
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 4, 77, 100, 2, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.k.stride_seq = 2 * 64 + 32;
    run("packed copies varlen", &d);
    fa_cuda_standard_set_force_pack(0);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* Score matrices split over several allocations (a cap of a few blocks
 * each): chunk boundaries inside sequences and inside the query heads of
 * one kv head, whose dK and dV sums cross them. */
FA_TEST(chunked_scores) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_context ctx = blas_context();
    /* 6 query heads over 2 kv heads, 90 x 112 (padded 110) fp32 blocks:
     * 2.5 blocks to an allocation, so two each. */
    fa_cuda_standard_set_chunk_limit((size_t)90 * 112 * 4 * 5 / 2);
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 64);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        const int chunks = fa_cuda_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 6, "12 blocks, two to an allocation: %d allocations", chunks);
        fa_plan_destroy(plan);
    }
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 77;
    run("chunked gqa causal dropout", &d);
    /* Allocations of 24750 fp16 elements: sequence 0's four 40 x 72 blocks
     * and two of sequence 2's 90 x 72 ones in the first, sequence 2's other
     * two in the second (sequence 1 has no queries). */
    fa_cuda_standard_set_chunk_limit((size_t)24750 * 2);
    static const int32_t cu_q[] = {0, 40, 40, 130};
    static const int32_t cu_k[] = {0, 70, 95, 160};
    d = make_desc(FA_DTYPE_F16, 3, 90, 70, 4, 1, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        const int chunks = fa_cuda_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 2, "blocks of 2880 and 6480 elements, 24750 to an allocation: %d allocations", chunks);
        fa_plan_destroy(plan);
    }
    run("chunked varlen mqa", &d);
    fa_cuda_standard_set_chunk_limit(0);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* The plan holds the planner's workspace (S and P; then dP, dS and D once
 * the backward pass has run), the quantity the benchmark plots against the
 * sequence length. */
FA_TEST(device_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_context ctx = blas_context();
    const int batch = 2, sq = 64, sk = 96, hq = 3, dim = 64;
    fa_attention_desc d = make_desc(FA_DTYPE_F16, batch, sq, sk, hq, 1, dim);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (!plan) return;
    fa_plan_info info;
    CHECK_OK(fa_plan_get_info(plan, &info));
    const size_t matrix = (size_t)batch * hq * sq * sk * 2, rows = (size_t)batch * hq * sq * sizeof(float);
    CHECK_MSG(info.forward.workspace_bytes == 2 * matrix && info.backward.workspace_bytes == 4 * matrix + rows,
              "planned workspace %zu / %zu, expected %zu / %zu", info.forward.workspace_bytes,
              info.backward.workspace_bytes, 2 * matrix, 4 * matrix + rows);
    /* Besides the workspace only small arrays (offsets; with GQA in fp16
     * the fp32 sums of dK and dV). */
    const size_t sums = 2 * (size_t)batch * sk * dim * sizeof(float), small = 4096;
    size_t bytes = 0;
    CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
    CHECK_MSG(bytes >= info.forward.workspace_bytes && bytes <= info.forward.workspace_bytes + small,
              "forward plan holds %zu bytes, its workspace is %zu", bytes, info.forward.workspace_bytes);
    const size_t nq = (size_t)batch * sq * hq * dim, nk = (size_t)batch * sk * dim;
    const size_t sizes[9] = {nq, nk, nk, nq, rows / 2, nq, nq, nk, nk}; /* elements of 2 bytes */
    fa_buffer bufs[9] = {NULL};
    int ok = 1;
    for (int i = 0; i < 9; i++) ok &= fa_buffer_alloc(ctx, sizes[i] * 2, &bufs[i]) == FA_SUCCESS;
    CHECK(ok);
    if (ok) {
        fa_rng rng;
        fa_rng_seed(&rng, suite_case_seed("device_memory", 0));
        for (int i = 0; i < 6; i++) {
            if (i == 4) continue; /* L: the forward pass writes it */
            void *r = fa_test_random_tensor(&rng, FA_DTYPE_F16, (int64_t)sizes[i]);
            if (r) CHECK_OK(fa_buffer_upload(bufs[i], 0, r, sizes[i] * 2));
            free(r);
        }
        CHECK_OK(fa_forward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]));
        CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes <= info.forward.workspace_bytes + small, "the forward pass allocated: %zu bytes", bytes);
        CHECK_OK(fa_backward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8]));
        CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes >= info.backward.workspace_bytes + sums && bytes <= info.backward.workspace_bytes + sums + small,
                  "after backward the plan holds %zu bytes; its workspace is %zu, the fp32 sums %zu", bytes,
                  info.backward.workspace_bytes, sums);
        CHECK_OK(fa_context_synchronize(ctx));
    }
    for (int i = 0; i < 9; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    fa_plan_destroy(plan);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* Score matrices the device cannot hold are FA_ERR_OUT_OF_MEMORY with a
 * message that says so (the benchmark reports that point), never a crash,
 * and leave the context usable. */
FA_TEST(out_of_memory) {
    REQUIRE_BLAS();
    fa_context ctx = blas_context();
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    const double global = (double)info.desc.global_mem_bytes;
    CHECK_MSG(global > 0, "the device reports %zu bytes of global memory", info.desc.global_mem_bytes);
    if (!(global > 0)) return;
    /* Beyond the whole device: seqlen 65536 in fp16, S and P twice the
     * global memory; refused before any allocation. */
    {
        const int n = 65536;
        const double per_head = (double)n * n * 2.0 * 2.0;
        const int heads = (int)(2.0 * global / per_head) + 1;
        fa_attention_desc d = make_desc(FA_DTYPE_F16, 1, n, n, heads, 1, 64);
        d.causal = 1;
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S and P of %.0f bytes (global %.0f): %s (%s)",
                  per_head * heads, global, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "global memory") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
    /* Within the device's size but not its free memory: a buffer takes most
     * of it first, so the allocation of the score matrices fails. */
    {
        const size_t taken = (size_t)(global * 0.6);
        fa_buffer hog = NULL;
        fa_status st = fa_buffer_alloc(ctx, taken, &hog);
        if (st == FA_SUCCESS) {
            const int n = 16384;
            const double per_head = (double)n * n * 2.0 * 2.0;
            const int heads = (int)(0.8 * global / per_head) + 1;
            fa_attention_desc d = make_desc(FA_DTYPE_F16, 1, n, n, heads, heads, 64);
            fa_plan plan = NULL;
            st = fa_plan_create(ctx, &d, &plan);
            CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL,
                      "S and P of %.0f bytes beside %zu bytes taken (global %.0f): %s (%s)", per_head * heads, taken,
                      global, fa_status_string(st), fa_last_error());
            CHECK_MSG(strstr(fa_last_error(), "score matrix") != NULL, "message: %s", fa_last_error());
            if (plan) fa_plan_destroy(plan);
            fa_buffer_free(hog);
        } else {
            fprintf(stderr, "  could not take %zu bytes first (%s): no allocation-failure case\n", taken,
                    fa_last_error());
        }
    }
    /* Nothing was left behind: an ordinary problem still runs. */
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 33, 47, 2, 2, 64);
    run("after out of memory", &d);
}

#ifdef FA_WITH_CUDA
/* The check itself: with cuBLAS unloadable, a standard plan fails with
 * FA_ERR_UNSUPPORTED and a message naming cuBLAS and the file tried, and
 * the fused path is unaffected. */
static void expect_missing_cublas(fa_context ctx) {
    fa_attention_desc d = make_desc(FA_DTYPE_F32, 1, 16, 16, 1, 1, 64);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, &d, &plan);
    CHECK_MSG(st == FA_ERR_UNSUPPORTED && plan == NULL, "with %s=%s: %s (%s)", CUBLAS_ENV, MISSING_CUBLAS,
              fa_status_string(st), fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "cuBLAS") && strstr(fa_last_error(), MISSING_CUBLAS),
              "the message names neither cuBLAS nor the file: %s", fa_last_error());
    if (plan) fa_plan_destroy(plan);
    d.algorithm = FA_ALGO_FUSED;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) fa_plan_destroy(plan);
}
#endif

FA_TEST(cublas_missing) {
    fa_context ctx = context();
    if (!ctx) FA_SKIP(g_skip);
#ifdef FA_WITH_CUDA
    if (!fa_cuda_standard_blas_loaded()) {
        /* Nothing loaded it yet in this process: the environment decides.
         * A value the caller set is put back for the later cases. */
        const char *was = getenv(CUBLAS_ENV);
        char *saved = was ? strdup(was) : NULL;
        CHECK(setenv(CUBLAS_ENV, MISSING_CUBLAS, 1) == 0);
        expect_missing_cublas(ctx);
        CHECK(saved ? setenv(CUBLAS_ENV, saved, 1) == 0 : unsetenv(CUBLAS_ENV) == 0);
        free(saved);
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
        if (strncmp(environ[i], CUBLAS_ENV "=", sizeof CUBLAS_ENV) != 0) env[m++] = environ[i];
    env[m++] = (char *)CUBLAS_ENV "=" MISSING_CUBLAS;
    char *argv[] = {(char *)"test_cuda_standard", (char *)"cublas_missing", NULL};
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env);
    free(env);
    CHECK_MSG(rc == 0, "posix_spawn: %s", strerror(rc));
    if (rc != 0) return;
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process checking a missing cuBLAS failed");
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

FA_TEST_MAIN(FA_CASE(cublas_missing), FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window),
             FA_CASE(block_sparse), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa), FA_CASE(varlen),
             FA_CASE(strides_offsets), FA_CASE(lengths), FA_CASE(single_query), FA_CASE(packed_copies),
             FA_CASE(chunked_scores), FA_CASE(device_memory), FA_CASE(out_of_memory))
