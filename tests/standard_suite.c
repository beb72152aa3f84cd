/* Standard (unfused) attention checked against two CPU references, shared
 * by the backends' test files:
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
 * keep their poison. */
#include "standard_suite.h"

#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "desc.h"
#include "dtype.h"
#include "flashattn.h"
#include "reference.h"

#include <math.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

static const standard_backend *g_backend;
static fa_context g_ctx;
static char g_skip[512];
static int g_blas_checked, g_blas_ok;

void standard_use_backend(const standard_backend *backend) { g_backend = backend; }

const char *standard_skip_reason(void) { return g_skip; }

fa_context standard_context(void) {
    if (g_ctx) return g_ctx;
    if (!g_backend->compiled) {
        snprintf(g_skip, sizeof g_skip, "the %s backend is not built into this library", g_backend->name);
        return NULL;
    }
    fa_status st = fa_context_create(g_backend->backend, -1, &g_ctx);
    if (st != FA_SUCCESS) {
        snprintf(g_skip, sizeof g_skip, "no %s device: %s (%s)", g_backend->name, fa_status_string(st),
                 fa_last_error());
        g_ctx = NULL;
        return NULL;
    }
    char why[256];
    if (g_backend->usable && !g_backend->usable(why, sizeof why)) {
        snprintf(g_skip, sizeof g_skip, "a %s device but %s", g_backend->name, why);
        fa_context_destroy(g_ctx);
        g_ctx = NULL;
        return NULL;
    }
    fa_device_info info;
    if (fa_context_get_info(g_ctx, &info) == FA_SUCCESS)
        fprintf(stderr, "  running on %s (%s, driver %s)\n", info.desc.name, info.desc.arch, info.driver_version);
    return g_ctx;
}

fa_context standard_blas_context(void) {
    fa_context ctx = standard_context();
    if (!ctx || g_blas_checked) return ctx && g_blas_ok ? ctx : NULL;
    g_blas_checked = 1;
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, 8, 8, 1, 1, 8);
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

fa_attention_desc standard_desc(fa_dtype dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                int head_dim) {
    fa_attention_desc d = suite_desc(dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim);
    d.algorithm = FA_ALGO_STANDARD;
    return d;
}

const fa_dtype standard_all_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

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

/* Same rounding points, fp32: the norm of the difference, a few units in
 * the last place. In fp16 and bf16 only a value next to a rounding boundary
 * of the dtype (a score, a probability, an element of O) may round the
 * other way when the sums run in another order, so a small share of O's
 * elements may differ (the backend's same_rounding_share); rounding at
 * other points (scores kept in fp32, say) changes most elements. */
#define SAME_ROUNDING_F32 1e-6

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

/* The backward pass differentiates the exact reference's O and L, as the
 * fused kernels' tests do, so its error is the backward pass's own. */
void standard_run_case(const char *name, const fa_attention_desc *d, standard_run_opts opt) {
    fa_context ctx = standard_blas_context();
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
        CHECK_MSG((double)differing <= g_backend->same_rounding_share * (double)elems,
                  "%s: %lld of %lld O elements differ from the same-rounding reference", name, (long long)differing,
                  (long long)elems);
        /* Unfused attention in the dtype, whichever device computes it, is
         * as far from the exact result as the CPU's. */
        const double e_std = layout_error(d, FA_TENSOR_O, o_std, o_ref);
        CHECK_MSG(e_exact <= 1.25 * e_std + 1e-7, "%s: O error %.3g, the CPU's unfused attention's %.3g", name,
                  e_exact, e_std);
    }
    CHECK_MSG(e_exact < tol, "%s: O relative error %.3g against the exact reference (%s limit %.1g)", name, e_exact,
              fa_dtype_name(dt), tol);
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
    const double l_same_tol = dt == FA_DTYPE_F32 ? (d->allow_tf32 ? 1e-3 : 2e-6) : g_backend->lse_same_tol;
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

void standard_run(const char *name, const fa_attention_desc *d) {
    const standard_run_opts opt = {1, 0};
    standard_run_case(name, d, opt);
}

/* ------------------------------------------------------------------------ */
/* Runs the backends share                                                   */

void standard_causal_shapes(const fa_dtype *dtypes, int n) {
    const int shapes[][2] = {{50, 140}, {100, 100}, {140, 50}};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < n; t++) {
            fa_attention_desc d = standard_desc(dtypes[t], 2, shapes[i][0], shapes[i][1], 2, 2, 64);
            d.causal = 1;
            char name[64];
            snprintf(name, sizeof name, "causal %dx%d", shapes[i][0], shapes[i][1]);
            standard_run(name, &d);
        }
}

void standard_sliding_windows(const fa_dtype dtypes[3], int head_dim) {
    const int w[][3] = {{20, 5, 0}, {-1, 10, 0}, {7, 3, 1}};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(dtypes[i], 1, 150, i % 2 ? 110 : 170, 2, 2, head_dim);
        d.window_left = w[i][0];
        d.window_right = w[i][1];
        d.causal = w[i][2];
        char name[64];
        snprintf(name, sizeof name, "window %d,%d%s %dx%d", w[i][0], w[i][1], w[i][2] ? " causal" : "", d.seqlen_q,
                 d.seqlen_k);
        standard_run(name, &d);
    }
}

void standard_block_sparse(int head_dim, const char *fp16_name) {
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 150, 170, 2, 2, 64);
    uint8_t *m = suite_random_block_mask(&d, 16, 24, 11);
    CHECK(m != NULL);
    if (m) standard_run("block-sparse 16x24", &d);
    free(m);
    d = standard_desc(FA_DTYPE_F16, 1, 200, 130, 2, 2, head_dim);
    m = suite_random_block_mask(&d, 40, 8, 12);
    d.causal = 1;
    CHECK(m != NULL);
    if (m) standard_run(fp16_name, &d);
    free(m);
}

void standard_dropout(int head_dim, const char *fp16_name) {
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 100, 122, 2, 2, 64);
    d.dropout_p = 0.17f;
    d.dropout_seed = 0x123456789abcdefull;
    d.dropout_offset = 0x500000007ull;
    standard_run("dropout 0.17", &d);
    d = standard_desc(FA_DTYPE_F16, 1, 90, 90, 3, 1, head_dim);
    d.causal = 1;
    d.dropout_p = 0.5f;
    d.dropout_seed = 42;
    standard_run(fp16_name, &d);
}

/* Sequence 1 has no queries (its dK, dV rows are 0), sequence 3 no keys
 * (its rows: L = -inf, O = 0, dQ = 0). */
void standard_varlen(fa_dtype dtype, int heads_q, int heads_kv, int head_dim, int causal_dropout, const char *name) {
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = standard_desc(dtype, 4, 77, 100, heads_q, heads_kv, head_dim);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    if (causal_dropout) {
        d.causal = 1;
        d.dropout_p = 0.1f;
        d.dropout_seed = 5;
    }
    standard_run(name, &d);
}

/* The head stride then steps whole sequences, and all (sequence, head)
 * pairs fit one strided call. */
void standard_bhsd(fa_dtype dtype, int head_dim, const char *name) {
    const int b = 2, sq = 70, sk = 90, hq = 4, hkv = 2;
    fa_attention_desc d = standard_desc(dtype, b, sq, sk, hq, hkv, head_dim);
    fa_tensor_desc *t[] = {&d.q, &d.k, &d.v, &d.o};
    for (int r = 0; r < 4; r++) {
        const int heads = r == 1 || r == 2 ? hkv : hq, seq = r == 1 || r == 2 ? sk : sq;
        t[r]->stride_seq = head_dim;
        t[r]->stride_head = (int64_t)seq * head_dim;
        t[r]->stride_batch = (int64_t)heads * seq * head_dim;
    }
    standard_run(name, &d);
}

void standard_padded_strides(fa_dtype dtype, const char *name) {
    const int b = 2, sq = 70, sk = 90, hq = 4, hkv = 2;
    fa_attention_desc d = standard_desc(dtype, b, sq, sk, hq, hkv, 64);
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
    standard_run(name, &d);
}

void standard_varlen_strides(int head_dim, const char *bf16_name, const char *f32_name) {
    static const int32_t cu_q[] = {0, 30, 100};
    static const int32_t cu_k[] = {0, 55, 90};
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 2, 70, 55, 2, 2, head_dim);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.q.offset = 16;
    d.q.stride_seq = 2 * head_dim + 8;
    d.o.stride_head = head_dim + 8;
    d.o.stride_seq = 2 * (head_dim + 8);
    standard_run(bf16_name, &d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    d.q.offset = 8;
    standard_run(f32_name, &d);
}

/* A token stride of 16 elements for 64-wide rows is valid when each
 * sequence holds one token, though no BLAS takes it as a leading
 * dimension. */
void standard_single_query(fa_dtype dtype) {
    fa_attention_desc d = standard_desc(dtype, 3, 1, 300, 4, 2, 64);
    d.q.stride_seq = 16;
    d.q.stride_head = 64;
    d.q.stride_batch = 4 * 64 + 16;
    standard_run("decode 1x300 narrow stride", &d);
}

/* With V the identity (key j carries a 1 in dimension j), O[i][j] is
 * P[i][j] * z_ij / (1 - p). */
void standard_dropout_mask_bits(void) {
    fa_context ctx = standard_blas_context();
    if (!ctx) return;
    const int sq = 40, sk = 64, dim = 64, heads = 2;
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, sq, sk, heads, heads, dim);
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
    fa_buffer bufs[5] = {NULL, NULL, NULL, NULL, NULL}; /* Q, K, V, O, L */
    const size_t bytes[5] = {nq * 4, nk * 4, nk * 4, nq * 4, (size_t)2 * heads * sq * 4};
    fa_plan plan = NULL;
    CHECK(q && k && v && o);
    if (!(q && k && v && o)) goto out;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < sk; j++)
            for (int h = 0; h < heads; h++) v[(((size_t)b * sk + j) * heads + h) * dim + j] = 1.0f;
    fa_test_poison(o, FA_DTYPE_F32, (int64_t)nq);
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    int ok = plan != NULL;
    for (int i = 0; i < 5; i++) {
        CHECK_OK(fa_buffer_alloc(ctx, bytes[i], &bufs[i]));
        ok &= bufs[i] != NULL;
    }
    if (!ok) goto out;
    const void *host[4] = {q, k, v, o};
    for (int i = 0; i < 4; i++) CHECK_OK(fa_buffer_upload(bufs[i], 0, host[i], bytes[i]));
    CHECK_OK(fa_forward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]));
    CHECK_OK(fa_buffer_download(bufs[3], 0, o, bytes[3]));
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
    standard_free_buffers(bufs, 5);
    free(q);
    free(k);
    free(v);
    free(o);
}

int standard_io_buffers(fa_context ctx, fa_dtype dtype, const size_t sizes[9], fa_buffer bufs[9]) {
    const size_t es = fa_dtype_size(dtype);
    int ok = 1;
    for (int i = 0; i < 9; i++) {
        bufs[i] = NULL;
        ok &= fa_buffer_alloc(ctx, sizes[i] * es, &bufs[i]) == FA_SUCCESS;
    }
    CHECK(ok);
    if (!ok) return 0;
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed("device_memory", 0));
    for (int i = 0; i < 6; i++) {
        if (i == 4) continue; /* L: the forward pass writes it */
        void *r = fa_test_random_tensor(&rng, dtype, (int64_t)sizes[i]);
        if (r) CHECK_OK(fa_buffer_upload(bufs[i], 0, r, sizes[i] * es));
        free(r);
    }
    return 1;
}

void standard_free_buffers(fa_buffer *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
}

static void expect_missing_blas(fa_context ctx, const char *env, const char *missing, const char *lib, int head_dim) {
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, 16, 16, 1, 1, head_dim);
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, &d, &plan);
    CHECK_MSG(st == FA_ERR_UNSUPPORTED && plan == NULL, "with %s=%s: %s (%s)", env, missing, fa_status_string(st),
              fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), lib) && strstr(fa_last_error(), missing),
              "the message names neither %s nor the file: %s", lib, fa_last_error());
    if (plan) fa_plan_destroy(plan);
    d.algorithm = FA_ALGO_FUSED;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) fa_plan_destroy(plan);
}

void standard_blas_missing(const char *env, const char *missing, const char *lib, int head_dim, int loaded,
                           const char *exe, const char *case_name) {
    fa_context ctx = standard_context();
    if (!ctx) return;
    if (!loaded) {
        /* Nothing loaded it yet in this process: the environment decides.
         * A value the caller set is put back for the later cases. */
        const char *was = getenv(env);
        char *saved = was ? strdup(was) : NULL;
        CHECK(setenv(env, missing, 1) == 0);
        expect_missing_blas(ctx, env, missing, lib, head_dim);
        CHECK(saved ? setenv(env, saved, 1) == 0 : unsetenv(env) == 0);
        free(saved);
        return;
    }
    /* Loaded by an earlier case: ask a fresh process running this case. */
    const size_t env_len = strlen(env);
    size_t n = 0;
    while (environ[n]) n++;
    char **child_env = calloc(n + 2, sizeof *child_env);
    char *setting = malloc(env_len + strlen(missing) + 2);
    CHECK(child_env != NULL && setting != NULL);
    if (!child_env || !setting) {
        free(child_env);
        free(setting);
        return;
    }
    snprintf(setting, env_len + strlen(missing) + 2, "%s=%s", env, missing);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], env, env_len) != 0 || environ[i][env_len] != '=') child_env[m++] = environ[i];
    child_env[m++] = setting;
    char *argv[] = {(char *)exe, (char *)case_name, NULL};
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, child_env);
    free(child_env);
    free(setting);
    CHECK_MSG(rc == 0, "posix_spawn: %s", strerror(rc));
    if (rc != 0) return;
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process checking a missing %s failed", lib);
}
