/* The CUDA attention kernels against the fp64 CPU reference, through the
 * public API, on the best CUDA device: first the attention suite every
 * backend runs (tests/attention_suite.c), then this backend's own cases: the
 * tensor-core kernels (fp16, bf16, TF32) in every shape they take and with
 * every option, the planner's choice of them, dropout bits read off their
 * output, the deterministic dQ kernel. Every run starts from fresh random
 * inputs and NaN-poisoned outputs; every element of every output is checked,
 * and the gaps between strided elements must stay untouched.
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "desc.h"
#include "dtype.h"
#include "fa_internal.h"
#include "flashattn.h"
#include "philox.h"
#include "plan.h"
#include "planner.h"
#include "reference.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Context                                                                   */

static fa_context g_ctx;
static char g_skip[512];

static fa_context test_context(void) {
#ifdef FA_WITH_CUDA
    if (g_ctx) return g_ctx;
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
    }
    return g_ctx;
#else
    snprintf(g_skip, sizeof g_skip, "the CUDA backend is not built into this library");
    return NULL;
#endif
}

#define REQUIRE_CUDA()                                                                     \
    do {                                                                                   \
        if (!test_context()) FA_SKIP(g_skip);                                              \
    } while (0)

static int device_cc(void) {
    fa_device_info info;
    if (!g_ctx || fa_context_get_info(g_ctx, &info) != FA_SUCCESS) return 0;
    int major = 0, minor = 0;
    if (sscanf(info.desc.arch, "sm_%1d%d", &major, &minor) != 2) return 0;
    return major * 10 + minor;
}

/* ------------------------------------------------------------------------ */
/* Forced tiles                                                              */

/* A kernel plan to run instead of the planner's: variant, tile, threads,
 * micro-tile (SIMT), stages, splits. */
typedef struct tiles {
    fa_variant variant;
    int br, bc, threads, tr, tc, stages, split;
} tiles;

#ifdef FA_WITH_CUDA
static void apply_tiles(fa_kernel_plan *kp, const tiles *t, fa_pass pass, const fa_attention_desc *desc) {
    kp->variant = t->variant;
    kp->br = t->br;
    kp->bc = t->bc;
    kp->work_group_size = t->threads;
    kp->thread_rows = t->tr;
    kp->thread_cols = t->tc;
    kp->stages = t->stages > 0 ? t->stages : 1;
    kp->split_k = t->split > 1 ? t->split : 1;
    kp->local_mem_bytes = fa_plan_local_mem(fa_variant_on_matrix_units(t->variant) ? t->variant : FA_VARIANT_SIMT, pass,
                                            desc, t->br, t->bc, kp->stages);
}
#endif

static tiles simt(int br, int bc, int tr, int tc) {
    tiles t = {FA_VARIANT_SIMT, br, bc, (br / tr) * (bc / tc), tr, tc, 1, 1};
    return t;
}

static tiles mma(int br, int bc, int warps, int stages) {
    tiles t = {FA_VARIANT_MMA, br, bc, warps * 32, 1, 1, stages, 1};
    return t;
}

static tiles from_plan(const fa_kernel_plan *kp) {
    tiles t = {kp->variant, kp->br, kp->bc, kp->work_group_size, kp->thread_rows, kp->thread_cols, kp->stages,
               kp->split_k};
    return t;
}

/* Rebuilds a plan's kernels for other tiles: the test stands in for the
 * planner. */
static fa_status force_tiles(fa_plan plan, const tiles *fwd, const tiles *bwd) {
#ifdef FA_WITH_CUDA
    fa_cuda_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    if (fwd) apply_tiles(&plan->info.forward, fwd, FA_PASS_FORWARD, &plan->desc);
    if (bwd) apply_tiles(&plan->info.backward, bwd, FA_PASS_BACKWARD, &plan->desc);
    return fa_cuda_plan_prepare(plan->ctx->impl, plan, &plan->impl);
#else
    (void)plan;
    (void)fwd;
    (void)bwd;
    return FA_ERR_UNSUPPORTED;
#endif
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

static double tol_for(const fa_attention_desc *d) {
    switch (d->q.dtype) {
    case FA_DTYPE_F16: return 3e-3;
    case FA_DTYPE_BF16: return 2e-2;
    default: return d->allow_tf32 && device_cc() >= 80 ? 5e-3 : 1e-5;
    }
}

typedef struct tensor {
    int64_t count;
    size_t bytes;
    void *host;
    fa_buffer dev;
} tensor;

static int tensor_heads(const fa_attention_desc *d, fa_tensor_role role) {
    return role == FA_TENSOR_K || role == FA_TENSOR_V ? d->heads_kv : d->heads_q;
}

static int seq_len(const fa_attention_desc *d, fa_tensor_role role, int b) {
    int64_t start;
    int len;
    if (role == FA_TENSOR_K || role == FA_TENSOR_V)
        fa_ref_seq_k(d, b, &start, &len);
    else
        fa_ref_seq_q(d, b, &start, &len);
    return len;
}

static int64_t tensor_count(const fa_attention_desc *d, fa_tensor_role role) {
    int64_t a = fa_desc_tensor_extent(d, role);
    int64_t b = fa_ref_tensor_span(d, role);
    return a > b ? a : b;
}

typedef void (*elem_fn)(int64_t index, void *user);

static void for_each_elem(const fa_attention_desc *d, fa_tensor_role role, elem_fn fn, void *user) {
    int heads = tensor_heads(d, role);
    for (int b = 0; b < d->batch; b++) {
        int len = seq_len(d, role, b);
        for (int s = 0; s < len; s++)
            for (int h = 0; h < heads; h++) {
                int64_t row = fa_ref_index(d, role, b, s, h, 0);
                for (int x = 0; x < d->head_dim; x++) fn(row + x, user);
            }
    }
}

static void mark_elem(int64_t index, void *user) { ((unsigned char *)user)[index] = 1; }

typedef struct gather_state {
    const void *src;
    fa_dtype dtype;
    double *dst;
    int64_t n;
} gather_state;

static void gather_elem(int64_t index, void *user) {
    gather_state *g = user;
    g->dst[g->n++] = fa_load_elem(g->src, g->dtype, index);
}

static double *gather(const fa_attention_desc *d, fa_tensor_role role, const void *src, int64_t *n) {
    int64_t total = 0;
    for (int b = 0; b < d->batch; b++) total += (int64_t)seq_len(d, role, b) * tensor_heads(d, role) * d->head_dim;
    gather_state g = {src, fa_desc_tensor(d, role)->dtype, malloc((size_t)(total + 1) * sizeof(double)), 0};
    if (g.dst) for_each_elem(d, role, gather_elem, &g);
    *n = g.n;
    return g.dst;
}

static int tensor_init(tensor *t, fa_context ctx, const fa_attention_desc *d, fa_tensor_role role) {
    t->count = tensor_count(d, role);
    t->bytes = (size_t)t->count * fa_dtype_size(fa_desc_tensor(d, role)->dtype);
    t->host = malloc(t->bytes + 16);
    t->dev = NULL;
    if (!t->host) return 0;
    return fa_buffer_alloc(ctx, t->bytes ? t->bytes : 16, &t->dev) == FA_SUCCESS;
}

static void tensor_free(tensor *t) {
    free(t->host);
    if (t->dev) fa_buffer_free(t->dev);
    t->host = NULL;
    t->dev = NULL;
}

/* ||got - want|| / ||want|| over the layout's elements (non-finite: inf);
 * a gradient that is exactly zero in fp64 is measured against the unit
 * scale of the inputs. Also checks the gaps still hold the poison. */
static double compare_tensor(const fa_attention_desc *d, fa_tensor_role role, const void *got, const void *want,
                             const void *poison, int64_t count, const char *what) {
    int64_t n1 = 0, n2 = 0;
    double *a = gather(d, role, got, &n1), *b = gather(d, role, want, &n2);
    double err = INFINITY;
    if (a && b && n1 == n2) {
        double num = 0.0, den = 0.0;
        int finite = 1;
        for (int64_t i = 0; i < n1; i++) {
            /* Where the reference is NaN (NaN inputs), so must the result be. */
            if (isnan(b[i])) {
                if (!isnan(a[i])) finite = 0;
                continue;
            }
            if (!isfinite(a[i])) finite = 0;
            num += (a[i] - b[i]) * (a[i] - b[i]);
            den += b[i] * b[i];
        }
        if (finite) err = den > 0.0 ? sqrt(num / den) : (n1 > 0 ? sqrt(num / (double)n1) : 0.0);
    }
    free(a);
    free(b);
    unsigned char *map = calloc((size_t)count + 1, 1);
    int64_t touched = 0;
    size_t es = fa_dtype_size(fa_desc_tensor(d, role)->dtype);
    if (map) {
        for_each_elem(d, role, mark_elem, map);
        for (int64_t i = 0; i < count; i++)
            if (!map[i] && memcmp((const char *)got + i * (int64_t)es, (const char *)poison + i * (int64_t)es, es))
                touched++;
    }
    CHECK_MSG(map && touched == 0, "%s: %lld elements outside the layout were written", what, (long long)touched);
    free(map);
    return err;
}

/* L: -inf rows must match exactly, the rest to fp32 accuracy. */
static void compare_lse(const float *got, const float *want, int64_t n, const char *name, double tol) {
    int64_t inf_mismatch = 0;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            if (!isnan(got[i])) inf_mismatch++;
            continue;
        }
        if (isinf(want[i]) && want[i] < 0) {
            if (!(isinf(got[i]) && got[i] < 0)) inf_mismatch++;
            continue;
        }
        if (!isfinite(got[i])) {
            inf_mismatch++;
            continue;
        }
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK_MSG(inf_mismatch == 0, "%s: %lld L values differ in finiteness from the reference", name,
              (long long)inf_mismatch);
    CHECK_MSG(err < tol, "%s: L relative error %.3g", name, err);
}

/* ------------------------------------------------------------------------ */
/* One case                                                                  */

typedef struct run_opts {
    const tiles *fwd, *bwd;   /* forced kernel plans, NULL: the planner's */
    int backward;             /* also run and check the backward pass */
    int twice;                /* backward twice: results bit-identical */
    int nan_k0, nan_k1;       /* keys [nan_k0, nan_k1) of K and V set to NaN */
    uint64_t seed;
    int fwd_repeats;          /* forward again this many times: O and L bit-identical */
} run_opts;

typedef struct run_result {
    double err_o, err_std, err_dq, err_dk, err_dv;
    double *o;
    int64_t o_count;
    double fwd_ms, bwd_ms;
    fa_plan_info info;
} run_result;

static void fill_nan_keys(const fa_attention_desc *d, fa_tensor_role role, void *data, int k0, int k1) {
    const fa_tensor_desc *t = fa_desc_tensor(d, role);
    for (int b = 0; b < d->batch; b++) {
        int len = seq_len(d, role, b);
        for (int s = k0; s < k1 && s < len; s++)
            for (int h = 0; h < d->heads_kv; h++) {
                int64_t row = fa_ref_index(d, role, b, s, h, 0);
                for (int x = 0; x < d->head_dim; x++) fa_store_elem(data, t->dtype, row + x, NAN);
            }
    }
}


/* The kernels ask for exactly the shared memory the planner budgets. */
static void check_shared_mem(const char *name, fa_plan plan) {
#ifdef FA_WITH_CUDA
    const fa_kernel_plan *kp[2] = {&plan->info.forward, &plan->info.backward};
    for (int pass = 0; pass < 2; pass++) {
        size_t got = 0;
        fa_status st = fa_cuda_plan_shared_bytes(plan->impl, (fa_pass)pass, &got);
        fa_variant v = fa_variant_on_matrix_units(kp[pass]->variant) ? kp[pass]->variant : FA_VARIANT_SIMT;
        size_t want = fa_plan_local_mem(v, (fa_pass)pass, &plan->desc, kp[pass]->br, kp[pass]->bc, kp[pass]->stages);
        CHECK_MSG(st == FA_SUCCESS && got == want, "%s: %s kernels use %zu bytes of shared memory, the plan %zu", name,
                  pass ? "backward" : "forward", got, want);
    }
#else
    (void)name;
    (void)plan;
#endif
}

static const char *vname(const fa_kernel_plan *kp) { return fa_variant_name(kp->variant); }

static void run_case(const char *name, const fa_attention_desc *d, const run_opts *opt, run_result *res) {
    fa_context ctx = test_context();
    memset(res, 0, sizeof *res);
    res->err_o = res->err_dq = res->err_dk = res->err_dv = INFINITY;
    if (!ctx) return;
    clock_t t0 = clock();
    const fa_dtype dt = d->q.dtype;
    const double tol = tol_for(d);
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed(name, opt->seed));

    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, d, &plan);
    CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s (%s)", name, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return;
    if (opt->fwd || opt->bwd) {
        st = force_tiles(plan, opt->fwd, opt->bwd);
        CHECK_MSG(st == FA_SUCCESS, "%s: forcing tiles: %s (%s)", name, fa_status_string(st), fa_last_error());
        if (st != FA_SUCCESS) {
            fa_plan_destroy(plan);
            return;
        }
    }
    res->info = plan->info;
    check_shared_mem(name, plan);

    tensor q, k, v, o, dout, dq, dk, dv;
    tensor *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    const fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O,
                                    FA_TENSOR_O, FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V};
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= tensor_init(all[i], ctx, d, roles[i]);
    const int64_t nl = (int64_t)d->heads_q * fa_attention_total_q(d);
    const size_t lse_bytes = (size_t)(nl > 0 ? nl : 1) * sizeof(float);
    float *lse = malloc(lse_bytes), *lse_ref = malloc(lse_bytes), *lse_poison = malloc(lse_bytes);
    fa_buffer lse_dev = NULL;
    ok &= lse && lse_ref && lse_poison && fa_buffer_alloc(ctx, lse_bytes, &lse_dev) == FA_SUCCESS;
    void *o_ref = malloc(o.bytes + 16), *o_std = malloc(o.bytes + 16), *poison_o = malloc(o.bytes + 16);
    void *dq_ref = malloc(dq.bytes + 16), *dk_ref = malloc(dk.bytes + 16), *dv_ref = malloc(dv.bytes + 16);
    void *poison_q = malloc(q.bytes + 16), *poison_k = malloc(k.bytes + 16), *poison_v = malloc(v.bytes + 16);
    ok &= o_ref && o_std && poison_o && dq_ref && dk_ref && dv_ref && poison_q && poison_k && poison_v;
    /* The additive bias, where the descriptor has one: random values of a
     * logit's size over its whole span (the gaps of its strides too). */
    void *bias_host = NULL;
    fa_buffer bias_dev = NULL;
    if (d->bias_batch > 0) {
        const int64_t n = fa_desc_bias_extent(d);
        const size_t bytes = (size_t)(n > 0 ? n : 1) * fa_dtype_size(d->bias.dtype);
        bias_host = fa_test_random_tensor(&rng, d->bias.dtype, n > 0 ? n : 1);
        ok &= bias_host && fa_buffer_alloc(ctx, bytes, &bias_dev) == FA_SUCCESS;
        if (ok) CHECK_OK(fa_buffer_upload(bias_dev, 0, bias_host, bytes));
    }
    const int options = fa_desc_option_in_use(d) != NULL;
    const fa_ref_dropout_origin origin0 = {0, 0};
    CHECK_MSG(ok, "%s: allocation failed", name);
    if (!ok) goto done;

    for (int i = 0; i < 5; i++) {
        void *r = fa_test_random_tensor(&rng, dt, all[i]->count);
        if (r) memcpy(all[i]->host, r, all[i]->bytes);
        free(r);
    }
    if (opt->nan_k1 > opt->nan_k0) {
        fill_nan_keys(d, FA_TENSOR_K, k.host, opt->nan_k0, opt->nan_k1);
        fill_nan_keys(d, FA_TENSOR_V, v.host, opt->nan_k0, opt->nan_k1);
    }
    fa_test_poison(poison_o, dt, o.count);
    fa_test_poison(poison_q, dt, q.count);
    fa_test_poison(poison_k, dt, k.count);
    fa_test_poison(poison_v, dt, v.count);
    fa_test_poison(lse_poison, FA_DTYPE_F32, nl);
    memcpy(o_ref, poison_o, o.bytes);

    CHECK_OK(fa_ref_forward_at(d, origin0, bias_host, q.host, k.host, v.host, o_ref, lse_ref));
    CHECK_OK(fa_buffer_upload(q.dev, 0, q.host, q.bytes));
    CHECK_OK(fa_buffer_upload(k.dev, 0, k.host, k.bytes));
    CHECK_OK(fa_buffer_upload(v.dev, 0, v.host, v.bytes));
    CHECK_OK(fa_buffer_upload(o.dev, 0, poison_o, o.bytes));
    CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_poison, lse_bytes));
    const fa_pass_args fwd = {.q = q.dev, .k = k.dev, .v = v.dev, .o = o.dev, .lse = lse_dev, .bias = bias_dev};
    CHECK_OK(fa_forward_ex(plan, &fwd));
    CHECK_OK(fa_buffer_download(o.dev, 0, o.host, o.bytes));
    CHECK_OK(fa_buffer_download(lse_dev, 0, lse, lse_bytes));
    CHECK_OK(fa_plan_last_time_ms(plan, &res->fwd_ms));
    CHECK_MSG(res->fwd_ms > 0.0, "%s: forward time %g ms", name, res->fwd_ms);

    char what[200];
    snprintf(what, sizeof what, "%s O", name);
    res->err_o = compare_tensor(d, FA_TENSOR_O, o.host, o_ref, poison_o, o.count, what);
    CHECK_MSG(res->err_o < tol, "%s: O relative error %.3g (limit %.1g)", name, res->err_o, tol);
    /* TF32 rounds Q and K to 10-bit mantissas before the scores. */
    compare_lse(lse, lse_ref, nl, name, d->q.dtype == FA_DTYPE_F32 && d->allow_tf32 ? 2e-3 : 1e-5);
    res->o = gather(d, FA_TENSOR_O, o.host, &res->o_count);
    if (opt->fwd_repeats > 0) {
        /* State a pass leaves on the device (split arrival counts) must
         * not change the next one. */
        void *o_again = malloc(o.bytes + 1);
        float *lse_again = malloc(lse_bytes);
        CHECK_MSG(o_again && lse_again, "%s: allocation failed", name);
        for (int run = 0; run < opt->fwd_repeats && o_again && lse_again; run++) {
            CHECK_OK(fa_buffer_upload(o.dev, 0, poison_o, o.bytes));
            CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_poison, lse_bytes));
            CHECK_OK(fa_forward_ex(plan, &fwd));
            CHECK_OK(fa_buffer_download(o.dev, 0, o_again, o.bytes));
            CHECK_OK(fa_buffer_download(lse_dev, 0, lse_again, lse_bytes));
            CHECK_MSG(memcmp(o_again, o.host, o.bytes) == 0, "%s: O differs in forward run %d", name, run + 2);
            CHECK_MSG(memcmp(lse_again, lse, lse_bytes) == 0, "%s: L differs in forward run %d", name, run + 2);
        }
        free(o_again);
        free(lse_again);
    }
    /* Unfused attention has no score options: no second opinion there. */
    if (dt != FA_DTYPE_F32 && opt->nan_k1 <= opt->nan_k0 && !options) {
        memcpy(o_std, poison_o, o.bytes);
        CHECK_OK(fa_ref_standard_forward(d, q.host, k.host, v.host, o_std, NULL));
        res->err_std = compare_tensor(d, FA_TENSOR_O, o_std, o_ref, poison_o, o.count, "standard O");
        CHECK_MSG(res->err_o <= 2.0 * res->err_std, "%s: O error %.3g is more than twice unfused attention's %.3g",
                  name, res->err_o, res->err_std);
    }

    if (opt->backward) {
        /* Both sides differentiate the reference's O and L, so the
         * comparison measures the backward pass alone. */
        memcpy(dq_ref, poison_q, dq.bytes);
        memcpy(dk_ref, poison_k, dk.bytes);
        memcpy(dv_ref, poison_v, dv.bytes);
        CHECK_OK(fa_ref_backward_at(d, origin0, bias_host, q.host, k.host, v.host, o_ref, lse_ref, dout.host, dq_ref,
                                    dk_ref, dv_ref));
        CHECK_OK(fa_buffer_upload(o.dev, 0, o_ref, o.bytes));
        CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_ref, lse_bytes));
        CHECK_OK(fa_buffer_upload(dout.dev, 0, dout.host, dout.bytes));
        void *first[3] = {NULL, NULL, NULL};
        for (int run = 0; run < (opt->twice ? 2 : 1); run++) {
            CHECK_OK(fa_buffer_upload(dq.dev, 0, poison_q, dq.bytes));
            CHECK_OK(fa_buffer_upload(dk.dev, 0, poison_k, dk.bytes));
            CHECK_OK(fa_buffer_upload(dv.dev, 0, poison_v, dv.bytes));
            const fa_pass_args bwd = {.q = q.dev,     .k = k.dev,   .v = v.dev,   .o = o.dev,   .lse = lse_dev,
                                      .dout = dout.dev, .dq = dq.dev, .dk = dk.dev, .dv = dv.dev, .bias = bias_dev};
            CHECK_OK(fa_backward_ex(plan, &bwd));
            CHECK_OK(fa_buffer_download(dq.dev, 0, dq.host, dq.bytes));
            CHECK_OK(fa_buffer_download(dk.dev, 0, dk.host, dk.bytes));
            CHECK_OK(fa_buffer_download(dv.dev, 0, dv.host, dv.bytes));
            CHECK_OK(fa_plan_last_time_ms(plan, &res->bwd_ms));
            CHECK_MSG(res->bwd_ms > 0.0, "%s: backward time %g ms", name, res->bwd_ms);
            if (run == 0) {
                snprintf(what, sizeof what, "%s dQ", name);
                res->err_dq = compare_tensor(d, FA_TENSOR_Q, dq.host, dq_ref, poison_q, dq.count, what);
                snprintf(what, sizeof what, "%s dK", name);
                res->err_dk = compare_tensor(d, FA_TENSOR_K, dk.host, dk_ref, poison_k, dk.count, what);
                snprintf(what, sizeof what, "%s dV", name);
                res->err_dv = compare_tensor(d, FA_TENSOR_V, dv.host, dv_ref, poison_v, dv.count, what);
                CHECK_MSG(res->err_dq < tol, "%s: dQ relative error %.3g (limit %.1g)", name, res->err_dq, tol);
                CHECK_MSG(res->err_dk < tol, "%s: dK relative error %.3g (limit %.1g)", name, res->err_dk, tol);
                CHECK_MSG(res->err_dv < tol, "%s: dV relative error %.3g (limit %.1g)", name, res->err_dv, tol);
                if (opt->twice) {
                    first[0] = malloc(dq.bytes + 1);
                    first[1] = malloc(dk.bytes + 1);
                    first[2] = malloc(dv.bytes + 1);
                    if (first[0] && first[1] && first[2]) {
                        memcpy(first[0], dq.host, dq.bytes);
                        memcpy(first[1], dk.host, dk.bytes);
                        memcpy(first[2], dv.host, dv.bytes);
                    }
                }
            } else if (first[0] && first[1] && first[2]) {
                CHECK_MSG(memcmp(first[0], dq.host, dq.bytes) == 0, "%s: dQ differs between two runs", name);
                CHECK_MSG(memcmp(first[1], dk.host, dk.bytes) == 0, "%s: dK differs between two runs", name);
                CHECK_MSG(memcmp(first[2], dv.host, dv.bytes) == 0, "%s: dV differs between two runs", name);
            }
        }
        for (int i = 0; i < 3; i++) free(first[i]);
    }
    fprintf(stderr, "  %-36s %-4s f %-5s %3dx%-3d b %-5s %3dx%-3d O %.2e", name, fa_dtype_name(dt),
            vname(&plan->info.forward), plan->info.forward.br, plan->info.forward.bc, vname(&plan->info.backward),
            plan->info.backward.br, plan->info.backward.bc, res->err_o);
    if (res->err_std > 0) fprintf(stderr, " (unfused %.2e)", res->err_std);
    if (opt->backward) fprintf(stderr, " dQ %.2e dK %.2e dV %.2e", res->err_dq, res->err_dk, res->err_dv);
    fprintf(stderr, " [%.1f s cpu]\n", (double)(clock() - t0) / CLOCKS_PER_SEC);

done:
    for (int i = 0; i < 8; i++) tensor_free(all[i]);
    if (lse_dev) fa_buffer_free(lse_dev);
    if (bias_dev) fa_buffer_free(bias_dev);
    free(bias_host);
    free(lse);
    free(lse_ref);
    free(lse_poison);
    free(o_ref);
    free(o_std);
    free(poison_o);
    free(dq_ref);
    free(dk_ref);
    free(dv_ref);
    free(poison_q);
    free(poison_k);
    free(poison_v);
    fa_plan_destroy(plan);
}


/* ------------------------------------------------------------------------ */
/* The shared suite                                                          */

#ifdef FA_WITH_CUDA
/* Suite tiles are FP32-pipe shapes (micro-tiles, optional key splits). */
static fa_status suite_force(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd) {
    tiles f, b;
    if (fwd) {
        f = simt(fwd->br, fwd->bc, fwd->tr, fwd->tc);
        if (fwd->tr <= 0 || fwd->tc <= 0) f.threads = 0;
        if (fwd->split > 1) {
            f.variant = FA_VARIANT_SPLITK;
            f.split = fwd->split;
        }
    }
    if (bwd) {
        b = simt(bwd->br, bwd->bc, bwd->tr, bwd->tc);
        if (bwd->tr <= 0 || bwd->tc <= 0) b.threads = 0;
    }
    return force_tiles(plan, fwd ? &f : NULL, bwd ? &b : NULL);
}

static void suite_check(const char *name, fa_plan plan) { check_shared_mem(name, plan); }

static const suite_backend cuda_suite = {FA_BACKEND_CUDA,    "CUDA", 1, suite_force, suite_check, NULL,
                                         SUITE_ALL_SCORE_OPTIONS};
#else
static const suite_backend cuda_suite = {FA_BACKEND_CUDA, "CUDA", 0, NULL, NULL, NULL, 0};
#endif

#define SUITE_CASE(name)                                                                   \
    do {                                                                                   \
        suite_use_backend(&cuda_suite);                                                    \
        suite_##name();                                                                    \
    } while (0)

FA_TEST(dtypes) { SUITE_CASE(dtypes); }
FA_TEST(head_dims) { SUITE_CASE(head_dims); }
FA_TEST(causal) { SUITE_CASE(causal); }
FA_TEST(sliding_window) { SUITE_CASE(sliding_window); }
FA_TEST(block_sparse) { SUITE_CASE(block_sparse); }
FA_TEST(block_sparse_skips_tiles) { SUITE_CASE(block_sparse_skips_tiles); }
FA_TEST(dropout) { SUITE_CASE(dropout); }
FA_TEST(dropout_mask_bits) { SUITE_CASE(dropout_mask_bits); }
FA_TEST(gqa_mqa) { SUITE_CASE(gqa_mqa); }
FA_TEST(varlen) { SUITE_CASE(varlen); }
FA_TEST(decoding_splitk) { SUITE_CASE(decoding_splitk); }
FA_TEST(score_options) { SUITE_CASE(score_options); }
FA_TEST(lengths) { SUITE_CASE(lengths); }
FA_TEST(strides_offsets) { SUITE_CASE(strides_offsets); }
FA_TEST(deterministic_backward) { SUITE_CASE(deterministic_backward); }
FA_TEST(described_devices) { SUITE_CASE(described_devices); }
FA_TEST(rejects_bad_tiles) { SUITE_CASE(rejects_bad_tiles); }
FA_TEST(long_sequences) { SUITE_CASE(long_sequences); }
FA_TEST(extreme_windows) { SUITE_CASE(extreme_windows); }
/* The benchmarks' device copy and read (cuda_copy.c): each takes device
 * time, the read writes nothing, and bad arguments are refused with a
 * status, not launched. */
FA_TEST(bench_copy_and_read) {
    REQUIRE_CUDA();
#ifdef FA_WITH_CUDA
    const size_t bytes = (size_t)3 << 20;
    fa_buffer a = NULL, b = NULL;
    CHECK(fa_buffer_alloc(g_ctx, bytes, &a) == FA_SUCCESS);
    CHECK(fa_buffer_alloc(g_ctx, bytes, &b) == FA_SUCCESS);
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    CHECK(host && back);
    if (!a || !b || !host || !back) goto done;
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 131u + 7u);
    CHECK(fa_buffer_upload(a, 0, host, bytes) == FA_SUCCESS);
    CHECK(fa_buffer_upload(b, 0, host, bytes) == FA_SUCCESS);
    double ms = -1.0;
    CHECK_MSG(fa_cuda_time_read(a, bytes, b, bytes - 16, &ms) == FA_SUCCESS, "%s", fa_last_error());
    CHECK_MSG(ms > 0.0, "read time %g ms", ms);
    CHECK_MSG(fa_cuda_read_async(a, bytes) == FA_SUCCESS, "%s", fa_last_error());
    CHECK(fa_context_synchronize(g_ctx) == FA_SUCCESS);
    CHECK(fa_buffer_download(a, 0, back, bytes) == FA_SUCCESS);
    CHECK_MSG(memcmp(host, back, bytes) == 0, "the read changed its buffer");
    ms = -1.0;
    CHECK_MSG(fa_cuda_time_copy(b, a, bytes, &ms) == FA_SUCCESS && ms > 0.0, "copy: %s, %g ms", fa_last_error(), ms);
    CHECK(fa_buffer_download(b, 0, back, bytes) == FA_SUCCESS);
    CHECK_MSG(memcmp(host, back, bytes) == 0, "the copy's destination differs from its source");
    CHECK(fa_cuda_time_read(a, bytes - 8, NULL, 0, &ms) == FA_ERR_INVALID_ARGUMENT);
    CHECK(fa_cuda_time_read(a, bytes + 16, NULL, 0, &ms) == FA_ERR_INVALID_ARGUMENT);
    CHECK(fa_cuda_time_read(a, bytes, NULL, 16, &ms) == FA_ERR_NULL_POINTER);
    CHECK(fa_cuda_time_read(NULL, 0, NULL, 0, &ms) == FA_ERR_NULL_POINTER);
    CHECK(fa_cuda_time_read(a, bytes, b, bytes, NULL) == FA_ERR_NULL_POINTER);
    CHECK(fa_cuda_read_async(a, bytes + 16) == FA_ERR_INVALID_ARGUMENT);
done:
    free(host);
    free(back);
    if (a) fa_buffer_free(a);
    if (b) fa_buffer_free(b);
#endif
}

FA_TEST(destroy_in_any_order) { SUITE_CASE(destroy_in_any_order); }
FA_TEST(huge_mask_blocks) { SUITE_CASE(huge_mask_blocks); }
FA_TEST(env_build_options) { SUITE_CASE(env_build_options); }

/* ------------------------------------------------------------------------ */
/* This backend's cases                                                      */


/* The tensor-core dtypes: fp16, bf16 and fp32 on TF32 units. */
static fa_attention_desc mma_desc(int which, int batch, int sq, int sk, int hq, int hkv, int d) {
    const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_F32};
    fa_attention_desc desc = suite_desc(dts[which], batch, sq, sk, hq, hkv, d);
    desc.allow_tf32 = which == 2;
    return desc;
}

static void run_full(const char *name, const fa_attention_desc *desc, const tiles *f, const tiles *b, int backward,
                     run_result *res) {
    run_opts opt = {f, b, backward, 0, 0, 0, 0, 0};
    run_case(name, desc, &opt, res);
    free(res->o);
    res->o = NULL;
}

static void run(const char *name, const fa_attention_desc *desc, int backward) {
    run_result res;
    run_full(name, desc, NULL, NULL, backward, &res);
}

static void run_tiles(const char *name, const fa_attention_desc *desc, const tiles *f, const tiles *b, int backward) {
    run_result res;
    run_full(name, desc, f, b, backward, &res);
}

#define REQUIRE_MMA()                                                                      \
    do {                                                                                   \
        REQUIRE_CUDA();                                                                    \
        if (device_cc() < 80) FA_SKIP("the tensor-core kernels need sm_80 or later");      \
    } while (0)

#define REQUIRE_WGMMA()                                                                    \
    do {                                                                                   \
        REQUIRE_CUDA();                                                                    \
        if (device_cc() != 90) FA_SKIP("the warpgroup kernels run on sm_90 only");         \
    } while (0)

/* The tensor-core forward the planner picks on this device: the warpgroup
 * one on sm_90 for fp16/bf16 at head dims of whole 64-column blocks, the
 * warp-specialised one among them with fixed lengths (at head_dim 256
 * without score options, and without dropout beside windows or block
 * masks). */
static fa_variant tensor_core_forward(const fa_attention_desc *d) {
    /* Head dims between whole blocks, padded unless turned off
     * (FLASHATTN_PLAN_TMA_PAD=0). */
    const char *pad = getenv("FLASHATTN_PLAN_TMA_PAD");
    if (device_cc() == 90 && d->q.dtype != FA_DTYPE_F32 && !(pad && strcmp(pad, "0") == 0) && d->head_dim % 32 == 0 &&
        d->head_dim % 64 != 0 && d->head_dim > 64 && !d->cu_seqlens_q &&
        (d->head_dim < 192 || (!fa_desc_option_in_use(d) && !(d->dropout_p > 0.0f && (d->window_left >= 0 ||
                                                                                      d->window_right >= 0 ||
                                                                                      d->block_mask)))))
        return FA_VARIANT_WGMMA_TMA;
    if (device_cc() != 90 || d->q.dtype == FA_DTYPE_F32 || d->head_dim % 64 != 0) return FA_VARIANT_MMA;
    const int bounds = d->window_left >= 0 || d->window_right >= 0 || d->block_mask;
    const int regs = d->head_dim < 256 || (!fa_desc_option_in_use(d) && !(d->dropout_p > 0.0f && bounds));
    return !d->cu_seqlens_q && regs ? FA_VARIANT_WGMMA_TMA : FA_VARIANT_WGMMA;
}

/* The tensor-core backward the planner picks on this device: the
 * warpgroup one on sm_90 for fp16/bf16 at head_dim 64, and at 128 unless
 * dropout comes with a mask or varlen (their registers and Philox's do
 * not fit together). */
static fa_variant tensor_core_backward(const fa_attention_desc *d) {
    const char *tma = getenv("FLASHATTN_PLAN_TMA_BWD"), *pad = getenv("FLASHATTN_PLAN_TMA_PAD");
    const int tma_off = tma && strcmp(tma, "0") == 0;
    /* Head dims between whole 64-column blocks (96; 160, 224) run the
     * warp-specialised backward (built for 96, padded to 192 or 256) where
     * the next block's problem plans it, not in deterministic mode
     * (FLASHATTN_PLAN_TMA_PAD=0: mma.sync). */
    if (device_cc() == 90 && d->q.dtype != FA_DTYPE_F32 && d->head_dim > 64 && d->head_dim % 32 == 0 &&
        d->head_dim % 64 != 0 && !d->deterministic && !(pad && strcmp(pad, "0") == 0)) {
        fa_attention_desc padded = *d;
        padded.head_dim = (d->head_dim + 63) / 64 * 64;
        return tensor_core_backward(&padded) == FA_VARIANT_WGMMA_TMA ? FA_VARIANT_WGMMA_TMA : FA_VARIANT_MMA;
    }
    /* Head_dim 192 and 256 on sm_90: the warp-specialised backward with
     * two consumer warpgroups sharing the keys, fixed lengths without
     * dropout or score options. */
    if (device_cc() == 90 && d->q.dtype != FA_DTYPE_F32 && (d->head_dim == 256 || d->head_dim == 192) && !tma_off &&
        d->dropout_p <= 0.0f &&
        !d->cu_seqlens_q && !fa_desc_option_in_use(d))
        return FA_VARIANT_WGMMA_TMA;
    const int crowded = d->dropout_p > 0.0f && (d->causal || d->window_left >= 0 || d->window_right >= 0 ||
                                                 d->block_mask || d->cu_seqlens_q);
    if (!(device_cc() == 90 && d->q.dtype != FA_DTYPE_F32 && d->head_dim % 64 == 0 &&
          d->head_dim <= (crowded ? 64 : 128)))
        return FA_VARIANT_MMA;
    /* The warp-specialised backward with fixed-length sequences (above
     * head_dim 64 without score options), unless turned off
     * (FLASHATTN_PLAN_TMA_BWD=0). */
    return !tma_off && !d->cu_seqlens_q && !(d->head_dim > 64 && fa_desc_option_in_use(d))
               ? FA_VARIANT_WGMMA_TMA
               : FA_VARIANT_WGMMA;
}

/* The variants the planner picks for desc on this device. */
static void expect_variants(const char *name, const fa_attention_desc *d, fa_variant fwd, fa_variant bwd) {
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(g_ctx, d, &plan));
    if (!plan) return;
    CHECK_MSG(plan->info.forward.variant == fwd && plan->info.backward.variant == bwd, "%s: planned %s / %s", name,
              vname(&plan->info.forward), vname(&plan->info.backward));
    fa_plan_destroy(plan);
}

FA_TEST(mma_dtypes) {
    REQUIRE_MMA();
    for (int w = 0; w < 3; w++) {
        fa_attention_desc d = mma_desc(w, 2, 130, 150, 2, 2, 64);
        run("mma dtypes b2 h2 130x150 d64", &d, 1);
        expect_variants("mma dtypes", &d, tensor_core_forward(&d), tensor_core_backward(&d));
    }
    /* fp32 without TF32 stays on the FP32 pipes; so does a head_dim the
     * m16n8k16 shape does not divide. */
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 130, 150, 2, 2, 64);
    expect_variants("fp32", &d, FA_VARIANT_SIMT, FA_VARIANT_SIMT);
    d = suite_desc(FA_DTYPE_F16, 2, 130, 150, 2, 2, 40);
    expect_variants("fp16 d40", &d, FA_VARIANT_SIMT, FA_VARIANT_SIMT);
}

FA_TEST(mma_head_dims) {
    REQUIRE_MMA();
    const int dims[] = {16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256};
    for (int w = 0; w < 3; w++)
        for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++) {
            if (w == 2 && dims[i] % 32) continue;
            fa_attention_desc d = mma_desc(w, 1, 70, 90, 2, 1, dims[i]);
            char name[64];
            snprintf(name, sizeof name, "mma head_dim %d", dims[i]);
            run(name, &d, 1);
        }
}

FA_TEST(mma_masks) {
    REQUIRE_MMA();
    const int shapes[][2] = {{50, 140}, {100, 100}, {140, 50}, {300, 257}};
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < 4; i++) {
            fa_attention_desc d = mma_desc(w, 2, shapes[i][0], shapes[i][1], 2, 2, 64);
            d.causal = 1;
            char name[64];
            snprintf(name, sizeof name, "mma causal %dx%d", shapes[i][0], shapes[i][1]);
            run(name, &d, 1);
        }
        const int win[][3] = {{20, 5, 0}, {-1, 10, 0}, {40, 0, 1}, {100, 100, 0}};
        for (int i = 0; i < 4; i++) {
            fa_attention_desc d = mma_desc(w, 1, 150, i % 2 ? 110 : 170, 2, 2, 32);
            d.window_left = win[i][0];
            d.window_right = win[i][1];
            d.causal = win[i][2];
            run("mma window", &d, 1);
        }
        fa_attention_desc d = mma_desc(w, 2, 150, 170, 2, 2, 64);
        uint8_t *m = suite_random_block_mask(&d, 16, 24, 11 + (uint64_t)w);
        run("mma block-sparse 16x24", &d, 1);
        free(m);
        d = mma_desc(w, 1, 300, 300, 2, 2, 128);
        m = suite_random_block_mask(&d, 64, 64, 13);
        d.causal = 1;
        run("mma block-sparse 64x64 causal", &d, 1);
        free(m);
        d = mma_desc(w, 4, 77, 100, 4, 2, 64);
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.causal = 1;
        run("mma varlen causal gqa", &d, 1);
        d = mma_desc(w, 1, 200, 300, 8, 1, 128);
        run("mma mqa 8/1 d128", &d, 1);
        const int lens[] = {1, 7, 127, 1000};
        for (int i = 0; i < 4; i++) {
            d = mma_desc(w, 1, lens[i], lens[i], 1, 1, 64);
            char name[64];
            snprintf(name, sizeof name, "mma length %d", lens[i]);
            run(name, &d, 1);
        }
    }
    fa_attention_desc d = mma_desc(1, 1, 2049, 2049, 1, 1, 64);
    d.causal = 1;
    run("mma length 2049 causal", &d, 1);
    /* Padded rows and offsets (16-byte multiples), and varlen strides. */
    d = mma_desc(0, 2, 70, 90, 4, 2, 64);
    d.q.offset = 24;
    d.q.stride_seq = 4 * 64 + 16;
    d.q.stride_batch = 70 * d.q.stride_seq;
    d.k.offset = 8;
    d.k.stride_seq = 2 * 64 + 8;
    d.k.stride_head = 64;
    d.k.stride_batch = 90 * d.k.stride_seq + 32;
    d.v.offset = 64;
    d.v.stride_head = 72;
    d.v.stride_seq = 2 * 72;
    d.v.stride_batch = (int64_t)90 * 2 * 72 + 8;
    d.o.offset = 40;
    d.o.stride_seq = 4 * 64 + 8;
    d.o.stride_batch = 70 * d.o.stride_seq;
    d.causal = 1;
    run("mma padded strides and offsets", &d, 1);
    static const int32_t vq[] = {0, 30, 100};
    static const int32_t vk[] = {0, 55, 90};
    d = mma_desc(1, 2, 70, 55, 2, 2, 32);
    d.cu_seqlens_q = vq;
    d.cu_seqlens_k = vk;
    d.q.offset = 16;
    d.q.stride_seq = 2 * 32 + 8;
    d.o.stride_head = 40;
    d.o.stride_seq = 2 * 40;
    run("mma varlen strides", &d, 1);
}

FA_TEST(mma_dropout) {
    REQUIRE_MMA();
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    for (int w = 0; w < 3; w++) {
        fa_attention_desc d = mma_desc(w, 2, 100, 120, 2, 2, 64);
        d.dropout_p = 0.17f;
        d.dropout_seed = 0x123456789abcdefull;
        d.dropout_offset = 0x500000007ull;
        run("mma dropout 0.17", &d, 1);
        d = mma_desc(w, 1, 90, 90, 3, 1, 32);
        d.causal = 1;
        d.dropout_p = 0.5f;
        d.dropout_seed = 42;
        run("mma dropout 0.5 causal mqa", &d, 1);
        d = mma_desc(w, 4, 77, 100, 4, 2, 64);
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.causal = 1;
        d.dropout_p = 0.1f;
        d.dropout_seed = 5;
        run("mma varlen causal dropout gqa", &d, 1);
    }
}

/* With V the identity (key j carries a 1 in dimension j), O[i][j] is
 * P[i][j] z_ij / (1 - p): the kernel's dropout mask can be read off O and
 * compared bit for bit with fa_dropout_keep. */
static void mask_bits(const fa_attention_desc *proto) {
    fa_context ctx = g_ctx;
    const int sq = 40, sk = 64, dim = 64, heads = 2;
    fa_attention_desc d = *proto;
    d.batch = 2;
    d.seqlen_q = sq;
    d.seqlen_k = sk;
    d.heads_q = d.heads_kv = heads;
    d.head_dim = dim;
    d.dropout_p = 0.25f;
    d.dropout_seed = 0xfeedface12345ull;
    d.dropout_offset = 3;
    d.softmax_scale = 0.05f; /* keeps every P comfortably above 0 */
    const fa_dtype dt = d.q.dtype;
    const size_t nq = (size_t)2 * sq * heads * dim, nk = (size_t)2 * sk * heads * dim, es = fa_dtype_size(dt);
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed("mma_dropout_mask_bits", (uint64_t)dt * 2 + (uint64_t)d.allow_tf32));
    void *q = fa_test_random_tensor(&rng, dt, (int64_t)nq);
    void *k = fa_test_random_tensor(&rng, dt, (int64_t)nk);
    void *v = calloc(nk, es), *o = malloc(nq * es);
    fa_buffer bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL;
    fa_plan plan = NULL;
    CHECK(q && k && v && o);
    if (!(q && k && v && o)) goto out;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < sk; j++)
            for (int h = 0; h < heads; h++) fa_store_elem(v, dt, (((int64_t)b * sk + j) * heads + h) * dim + j, 1.0);
    fa_test_poison(o, dt, (int64_t)nq);
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK_OK(fa_buffer_alloc(ctx, nq * es, &bq));
    CHECK_OK(fa_buffer_alloc(ctx, nk * es, &bk));
    CHECK_OK(fa_buffer_alloc(ctx, nk * es, &bv));
    CHECK_OK(fa_buffer_alloc(ctx, nq * es, &bo));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)2 * heads * sq * 4, &bl));
    if (!plan || !bq || !bk || !bv || !bo || !bl) goto out;
    CHECK_MSG(fa_variant_on_matrix_units(plan->info.forward.variant), "mask bits: forward planned %s",
              vname(&plan->info.forward));
    CHECK_OK(fa_buffer_upload(bq, 0, q, nq * es));
    CHECK_OK(fa_buffer_upload(bk, 0, k, nk * es));
    CHECK_OK(fa_buffer_upload(bv, 0, v, nk * es));
    CHECK_OK(fa_buffer_upload(bo, 0, o, nq * es));
    CHECK_OK(fa_forward(plan, bq, bk, bv, bo, bl));
    CHECK_OK(fa_buffer_download(bo, 0, o, nq * es));
    int64_t wrong = 0, dropped = 0, total = 0;
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < sq; i++)
                for (int j = 0; j < sk; j++) {
                    double val = fa_load_elem(o, dt, (((int64_t)b * sq + i) * heads + h) * dim + j);
                    int keep = fa_dropout_keep(d.dropout_seed, d.dropout_offset, d.dropout_p, b, h, heads, i, j);
                    wrong += (val != 0.0) != keep || !isfinite(val);
                    dropped += !keep;
                    total++;
                }
    CHECK_MSG(wrong == 0, "%s%s: %lld of %lld dropout decisions differ from the reference", fa_dtype_name(dt),
              d.allow_tf32 ? " tf32" : "", (long long)wrong, (long long)total);
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

FA_TEST(mma_dropout_mask_bits) {
    REQUIRE_MMA();
    for (int w = 0; w < 3; w++) {
        fa_attention_desc d = mma_desc(w, 1, 1, 1, 1, 1, 64);
        mask_bits(&d);
    }
}

/* Keys 32..63 are hidden from every query by the block mask and hold NaN in
 * K and V: a forward kernel that computed those 16-key tiles instead of
 * skipping them would carry the NaN into O. */
FA_TEST(mma_block_sparse_skips_tiles) {
    REQUIRE_MMA();
    uint8_t mask[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) mask[i * 6 + j] = (uint8_t)(j == 2 || j == 3 ? 0 : (i + j) % 3 != 0);
    for (int w = 0; w < 3; w++) {
        fa_attention_desc d = mma_desc(w, 1, 64, 96, 2, 2, 32);
        d.block_mask = mask;
        d.block_mask_bytes = sizeof mask;
        d.block_q = 16;
        d.block_k = 16;
        const tiles f = mma(64, 16, 4, 2), b = simt(16, 16, 2, 2);
        run_opts opt = {&f, &b, 1, 0, 32, 64, 0, 0};
        run_result res;
        run_case("mma block-sparse NaN skipped", &d, &opt, &res);
        int64_t nonfinite = 0;
        for (int64_t i = 0; i < res.o_count; i++) nonfinite += !isfinite(res.o[i]);
        CHECK_MSG(res.o && nonfinite == 0, "%lld non-finite O values: masked tiles were computed",
                  (long long)nonfinite);
        free(res.o);
    }
}

/* The dQ kernel of deterministic mode: bit-identical twice, and right with
 * every mask (its tile map differs from the key-side kernel's). */
FA_TEST(mma_deterministic_backward) {
    REQUIRE_MMA();
    for (int w = 0; w < 3; w++) {
        fa_attention_desc d = mma_desc(w, 2, 110, 130, 4, 2, 64);
        d.causal = 1;
        d.dropout_p = 0.2f;
        d.dropout_seed = 1234;
        d.deterministic = 1;
        run_opts opt = {NULL, NULL, 1, 1, 0, 0, 0, 0};
        run_result res;
        run_case("mma deterministic backward", &d, &opt, &res);
        CHECK(res.info.backward.variant == tensor_core_backward(&d));
        free(res.o);
        d = mma_desc(w, 1, 300, 260, 2, 2, 128);
        uint8_t *m = suite_random_block_mask(&d, 32, 48, 21);
        d.window_left = 90;
        d.deterministic = 1;
        run_case("mma deterministic block-sparse window", &d, &opt, &res);
        free(res.o);
        free(m);
    }
}

/* Every tensor-core shape the kernels take: 4 and 8 warps, one and two
 * strips a warp, tile widths 16 to 128, one and two stages, Q fragments in
 * registers or not (large head dims). */
FA_TEST(mma_shapes) {
    REQUIRE_MMA();
    const struct {
        int dim;
        tiles f, b;
    } shapes[] = {
        {64, {FA_VARIANT_MMA, 64, 64, 128, 1, 1, 1, 1}, {FA_VARIANT_MMA, 64, 64, 128, 1, 1, 1, 1}},
        {64, {FA_VARIANT_MMA, 128, 32, 128, 1, 1, 2, 1}, {FA_VARIANT_MMA, 32, 128, 128, 1, 1, 2, 1}},
        {64, {FA_VARIANT_MMA, 128, 64, 256, 1, 1, 2, 1}, {FA_VARIANT_MMA, 64, 128, 256, 1, 1, 2, 1}},
        {32, {FA_VARIANT_MMA, 128, 128, 256, 1, 1, 1, 1}, {FA_VARIANT_MMA, 16, 128, 128, 1, 1, 1, 1}},
        {128, {FA_VARIANT_MMA, 64, 16, 128, 1, 1, 2, 1}, {FA_VARIANT_MMA, 16, 64, 128, 1, 1, 1, 1}},
        {256, {FA_VARIANT_MMA, 64, 32, 128, 1, 1, 1, 1}, {FA_VARIANT_SIMT, 16, 32, 128, 2, 2, 1, 1}},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(shapes); i++)
        for (int w = 0; w < 3; w++) {
            fa_attention_desc d = mma_desc(w, 2, 200, 230, 2, 1, shapes[i].dim);
            d.causal = (int)(i % 2);
            char name[96];
            snprintf(name, sizeof name, "mma d%d %dx%d/%d s%d, %dx%d/%d", shapes[i].dim, shapes[i].f.br,
                     shapes[i].f.bc, shapes[i].f.threads, shapes[i].f.stages, shapes[i].b.br, shapes[i].b.bc,
                     shapes[i].b.threads);
            run_tiles(name, &d, &shapes[i].f, &shapes[i].b, 1);
        }
}

/* The tensor-core backward at a wide head_dim (96, 192, 256; fp16, bf16;
 * above 128 warps share each key strip, bwd_mma.cu DK_SPLIT) on the
 * planner's tiles with every option it takes, against the fp64 reference:
 * GQA, causal, windows, block masks, varlen, dropout, and deterministic
 * mode (bit-identical twice). One test a head_dim, so that their kernel
 * builds can run side by side. */
static void wide_head_backward(int dim) {
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    enum { PLAIN, CAUSAL, WINDOW, BLOCKS, VARLEN, DROPOUT, DETERMINISTIC, CASES };
    static const char *const names[] = {"gqa", "causal", "window", "block-sparse", "varlen causal gqa",
                                        "dropout causal gqa", "deterministic dropout window"};
    for (int w = 0; w < 2; w++)
        for (int c = 0; c < CASES; c++) {
            fa_attention_desc d = mma_desc(w, 2, 130, 150, 4, 2, dim);
            uint8_t *blocks = NULL;
            run_opts opt = {NULL, NULL, 1, 0, 0, 0, 0, 0};
            switch (c) {
            case CAUSAL: d = mma_desc(w, 1, 300, 257, 2, 2, dim); d.causal = 1; break;
            case WINDOW: d.window_left = 40; d.window_right = 7; break;
            case BLOCKS: blocks = suite_random_block_mask(&d, 32, 48, 17); d.causal = 1; break;
            case VARLEN:
                d = mma_desc(w, 4, 77, 100, 4, 2, dim);
                d.cu_seqlens_q = cu_q;
                d.cu_seqlens_k = cu_k;
                d.causal = 1;
                break;
            case DROPOUT:
                d.causal = 1;
                d.dropout_p = 0.17f;
                d.dropout_seed = 0x123456789abcdefull;
                d.dropout_offset = 0x500000007ull;
                break;
            case DETERMINISTIC:
                d.dropout_p = 0.2f;
                d.dropout_seed = 1234;
                d.window_left = 90;
                d.deterministic = 1;
                opt.twice = 1;
                break;
            default: break;
            }
            char name[96];
            snprintf(name, sizeof name, "mma d%d %s %s backward", dim, w ? "bf16" : "fp16", names[c]);
            run_result res;
            run_case(name, &d, &opt, &res);
            CHECK_MSG(res.info.backward.variant == tensor_core_backward(&d), "%s: backward %s", name,
                      vname(&res.info.backward));
            free(res.o);
            free(blocks);
        }
}

FA_TEST(mma_wide_heads_d96) {
    REQUIRE_MMA();
    wide_head_backward(96);
}

FA_TEST(mma_wide_heads_d192) {
    REQUIRE_MMA();
    wide_head_backward(192);
}

FA_TEST(mma_wide_heads_d256) {
    REQUIRE_MMA();
    wide_head_backward(256);
}

/* Dropout at head_dim 128 in the warpgroup backward on sm_90 (keep bits
 * drawn while its products run, bwd_mma.cu keep_bits; mma.sync elsewhere,
 * and with a causal mask): GQA, deterministic (bit-identical twice),
 * causal, against the fp64 reference with the same Philox stream. */
FA_TEST(dropout_d128_backward) {
    REQUIRE_MMA();
    for (int w = 0; w < 2; w++)
        for (int c = 0; c < 3; c++) {
            fa_attention_desc d = mma_desc(w, 2, 200, 230, 4, 2, 128);
            d.dropout_p = c == 1 ? 0.5f : 0.17f;
            d.dropout_seed = 0x123456789abcdefull + (uint64_t)c;
            d.dropout_offset = 0x500000007ull;
            d.causal = c == 2;
            d.deterministic = c == 1;
            run_opts opt = {NULL, NULL, 1, c == 1, 0, 0, 0, 0};
            char name[96];
            snprintf(name, sizeof name, "d128 %s dropout %.2f%s%s", w ? "bf16" : "fp16", (double)d.dropout_p,
                     d.causal ? " causal" : "", d.deterministic ? " deterministic" : "");
            run_result res;
            run_case(name, &d, &opt, &res);
            CHECK_MSG(res.info.backward.variant == tensor_core_backward(&d), "%s: backward %s", name,
                      vname(&res.info.backward));
            free(res.o);
        }
}

/* Forced shapes of the shared-strip backward (br, bc, warps, stages): 4
 * and 8 warps, 32 to 128 queries (32: one pair of n-tiles a warp), one and
 * two stages, dQ by atomics and deterministic. */
FA_TEST(mma_wide_heads_shapes) {
    REQUIRE_MMA();
    static const int dims[] = {192, 256};
    const int forced[][4] = {{64, 64, 8, 1}, {64, 32, 4, 2}, {32, 64, 8, 1}, {32, 32, 4, 2}, {128, 32, 4, 1}};
    fa_device_info here;
    CHECK_OK(fa_context_get_info(g_ctx, &here));
    for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++)
        for (size_t s = 0; s < FA_ARRAY_SIZE(forced); s++)
            for (int w = 0; w < 2; w++) {
                fa_attention_desc d = mma_desc(w, 2, 200, 230, 4, 2, dims[i]);
                /* Shapes this device's shared memory holds (an A100's
                 * 163 KiB does not hold every one). */
                if (fa_plan_local_mem(FA_VARIANT_MMA, FA_PASS_BACKWARD, &d, forced[s][0], forced[s][1],
                                      forced[s][3]) > here.desc.local_mem_bytes)
                    continue;
                d.causal = (int)((s + (size_t)w) % 2);
                d.deterministic = s == 2;
                const tiles b = mma(forced[s][0], forced[s][1], forced[s][2], forced[s][3]);
                char name[96];
                snprintf(name, sizeof name, "mma d%d backward %dx%d/%d s%d%s", dims[i], b.br, b.bc, b.threads,
                         b.stages, d.causal ? " causal" : "");
                run_tiles(name, &d, NULL, &b, 1);
            }
}

/* Every warpgroup forward shape the kernel takes: one and two warpgroups,
 * key tiles 16 to 128, one and two stages, head dims 64 to 256 (one to four
 * 64-column blocks), fp16 and bf16, causal and not; the backward on the
 * planner's tiles. */
FA_TEST(wgmma_shapes) {
    REQUIRE_WGMMA();
    const struct {
        int dim;
        tiles f;
    } shapes[] = {
        {64, {FA_VARIANT_WGMMA, 128, 128, 256, 2, 32, 2, 1}},  {64, {FA_VARIANT_WGMMA, 64, 64, 128, 2, 16, 1, 1}},
        {64, {FA_VARIANT_WGMMA, 128, 16, 256, 2, 4, 2, 1}},    {128, {FA_VARIANT_WGMMA, 128, 128, 256, 2, 32, 2, 1}},
        {128, {FA_VARIANT_WGMMA, 128, 64, 256, 2, 16, 1, 1}},  {128, {FA_VARIANT_WGMMA, 64, 32, 128, 2, 8, 2, 1}},
        {192, {FA_VARIANT_WGMMA, 128, 128, 256, 2, 32, 1, 1}}, {256, {FA_VARIANT_WGMMA, 128, 64, 256, 2, 16, 2, 1}},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(shapes); i++)
        for (int w = 0; w < 2; w++) {
            fa_attention_desc d = mma_desc(w, 2, 200, 230, 2, 1, shapes[i].dim);
            d.causal = (int)((i + (size_t)w) % 2);
            char name[96];
            snprintf(name, sizeof name, "wgmma d%d %dx%d/%d s%d%s", shapes[i].dim, shapes[i].f.br, shapes[i].f.bc,
                     shapes[i].f.threads, shapes[i].f.stages, d.causal ? " causal" : "");
            run_tiles(name, &d, &shapes[i].f, NULL, 1);
        }
    /* The backward: one and two warpgroups of keys, one and two stages,
     * dQ by atomics and deterministic, GQA, masks, and dropout (d64). */
    enum { PLAIN, DROPOUT_WINDOW, WINDOW_BLOCKS };
    const struct {
        int dim, deterministic, opts;
        tiles b;
    } back[] = {
        {64, 0, 0, {FA_VARIANT_WGMMA, 64, 128, 256, 16, 2, 2, 1}},  {64, 1, 0, {FA_VARIANT_WGMMA, 64, 64, 128, 16, 2, 1, 1}},
        {64, 0, 1, {FA_VARIANT_WGMMA, 64, 64, 128, 16, 2, 2, 1}},   {128, 0, 0, {FA_VARIANT_WGMMA, 64, 128, 256, 16, 2, 2, 1}},
        {128, 1, 0, {FA_VARIANT_WGMMA, 64, 128, 256, 16, 2, 1, 1}}, {128, 0, 0, {FA_VARIANT_WGMMA, 64, 64, 128, 16, 2, 2, 1}},
        {128, 0, 2, {FA_VARIANT_WGMMA, 64, 128, 256, 16, 2, 2, 1}},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(back); i++)
        for (int w = 0; w < 2; w++) {
            fa_attention_desc d = mma_desc(w, 2, 200, 230, 4, 2, back[i].dim);
            d.causal = (int)((i + (size_t)w) % 2);
            d.deterministic = back[i].deterministic;
            uint8_t *blocks = NULL;
            if (back[i].opts == DROPOUT_WINDOW) {
                d.dropout_p = 0.15f;
                d.dropout_seed = 11;
                d.window_left = 90;
            } else if (back[i].opts == WINDOW_BLOCKS) {
                d.window_left = 70;
                d.window_right = 40;
                blocks = suite_random_block_mask(&d, 32, 48, 5);
            }
            char name[112];
            snprintf(name, sizeof name, "wgmma backward d%d %dx%d/%d s%d%s%s%s", back[i].dim, back[i].b.br,
                     back[i].b.bc, back[i].b.threads, back[i].b.stages, d.causal ? " causal" : "",
                     d.deterministic ? " deterministic" : "",
                     back[i].opts == DROPOUT_WINDOW ? " dropout window" : back[i].opts == WINDOW_BLOCKS ? " window blocks" : "");
            run_tiles(name, &d, NULL, &back[i].b, 1);
            free(blocks);
        }
}

/* The TMA backward cases' masks: a window of 70 left and 20 right, a block
 * mask of 64 x 64 blocks. */
static void tma_case_masks(fa_attention_desc *d, int window, const uint8_t *blocks) {
    if (window) {
        d->window_left = 70;
        d->window_right = 20;
    }
    if (blocks) {
        d->block_mask = blocks;
        d->block_q = d->block_k = 64;
        d->block_mask_bytes = (size_t)((d->seqlen_q + 63) / 64) * (size_t)((d->seqlen_k + 63) / 64);
    }
}

/* The warp-specialised backward (bwd_mma.cu built with TMA) in the shapes
 * it takes: one consumer warpgroup (64 keys) and two (128 keys: the split
 * step, dQ in turns, at head_dim 128 by bulk reductions), 64 queries a
 * step and, at head_dim 64 causal or not, 128, fp16 and bf16,
 * lengths that leave partial tiles (a last query tile whose rows must not
 * reach the next head's dQ), GQA, causal masks, windows, block masks,
 * dropout and the score options. */
FA_TEST(tma_backward_shapes) {
    REQUIRE_WGMMA();
    static uint8_t blocks[16 * 16];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)((i * 7 + 3) % 4 != 0);
    const struct {
        int dim, br, bc;
    } shapes[] = {{128, 64, 128}, {64, 64, 128}, {128, 64, 64}, {64, 64, 64}, {64, 128, 128}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(shapes); i++) {
        const tiles bt = {FA_VARIANT_WGMMA_TMA, shapes[i].br, shapes[i].bc, 128 + 2 * shapes[i].bc, shapes[i].br / 4,
                          2, 2, 1};
        for (int k = 0; k < 6; k++) {
            /* As the planner takes them: at head_dim 128 dropout with 64
             * keys only, and no score options (the registers); 128
             * queries a step at head_dim 64 causal or not. */
            if (shapes[i].dim == 128 && (k == 5 || (k == 4 && shapes[i].bc == 128))) continue;
            if (shapes[i].br == 128 && k != 0 && k != 1) continue;
            const int w = k % 2;
            fa_attention_desc d = mma_desc(w, 2, 333 + 64 * k, 301 + 97 * k, 4, k < 2 ? 2 : 4, shapes[i].dim);
            d.causal = k == 1 || k == 4;
            tma_case_masks(&d, k == 2, k == 3 ? blocks : NULL);
            if (k == 4) {
                d.dropout_p = 0.2f;
                d.dropout_seed = 11 + i;
            }
            if (k == 5) d.softcap = 20.0f;
            char name[112];
            snprintf(name, sizeof name, "tma bwd d%d %dx%d%s%s%s%s%s%s", shapes[i].dim, shapes[i].br, shapes[i].bc,
                     w ? " bf16" : " fp16", d.causal ? " causal" : "", d.window_left >= 0 ? " window" : "",
                     d.block_mask ? " blocks" : "", d.dropout_p > 0.0f ? " dropout" : "",
                     d.softcap > 0.0f ? " softcap" : "");
            run_tiles(name, &d, NULL, &bt, 1);
        }
    }
}

/* Head_dim 256 and 192 on the warp-specialised backward (as planned on
 * sm_90: two consumer warpgroups sharing 64 keys, each holding half of dK
 * and dV at 256, one of them at 192) against the fp64 reference: partial tiles, GQA,
 * causal, a window with a block mask, deterministic. Rows are packed
 * (head_dim apart), so a store past a warpgroup's share of the head
 * dimensions would land in the next row. */
FA_TEST(tma_backward_split) {
    REQUIRE_WGMMA();
    static uint8_t blocks[16 * 16];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)((i * 7 + 3) % 4 != 0);
    for (int k = 0; k < 10; k++) {
        const int dim = k < 5 ? 256 : 192, c = k % 5;
        fa_attention_desc d = mma_desc(k % 2, 2, 333 + 64 * c, 301 + 97 * c, 4, c == 1 ? 2 : 4, dim);
        d.causal = c == 1;
        tma_case_masks(&d, c == 2 || c == 4, c == 3 ? blocks : NULL);
        d.deterministic = c == 4;
        char name[96];
        snprintf(name, sizeof name, "tma bwd d%d%s%s%s%s%s", dim, k % 2 ? " bf16" : " fp16", d.causal ? " causal" : "",
                 d.window_left >= 0 ? " window" : "", d.block_mask ? " blocks" : "",
                 d.deterministic ? " deterministic" : "");
        run_result res;
        run_full(name, &d, NULL, NULL, 1, &res);
        CHECK_MSG(res.info.backward.variant == FA_VARIANT_WGMMA_TMA && res.info.backward.bc == 64, "%s: backward %s",
                  name, fa_variant_name(res.info.backward.variant));
    }
}

/* Head dims between whole 64-column blocks on the warp-specialised forward
 * built for the next block (as planned): 96, 160 and 224 (192 native)
 * against the fp64 reference, the backward as planned beside it (on the
 * warp-specialised one where it applies: 96 and 192 built for themselves,
 * 160 and 224 padded to 192 and 256), with partial tiles, GQA, causal
 * masks, windows, dropout and softcap. Rows
 * are packed (head_dim apart), so a store past head_dim would land in the
 * next row's O (or dQ, dK, dV) and fail the comparison. */
FA_TEST(tma_padded_head_dims) {
    REQUIRE_WGMMA();
    static const int dims[] = {96, 160, 192, 224};
    for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++)
        for (int k = 0; k < 4; k++) {
            fa_attention_desc d = mma_desc(k % 2, 2, 333 + 50 * k, 301 + 97 * k, 4, k == 1 ? 2 : 4, dims[i]);
            d.causal = k == 1 || k == 3;
            if (k == 2) {
                d.window_left = 70;
                d.window_right = 20;
                d.dropout_p = dims[i] < 192 ? 0.2f : 0.0f;
                d.dropout_seed = 21 + i;
            }
            if (k == 3 && dims[i] < 192) d.softcap = 20.0f;
            char name[96];
            snprintf(name, sizeof name, "padded d%d%s%s%s%s%s", dims[i], k % 2 ? " bf16" : " fp16",
                     d.causal ? " causal" : "", d.window_left >= 0 ? " window" : "",
                     d.dropout_p > 0.0f ? " dropout" : "", d.softcap > 0.0f ? " softcap" : "");
            run_result res;
            run_full(name, &d, NULL, NULL, 1, &res);
            CHECK_MSG(res.info.forward.variant == FA_VARIANT_WGMMA_TMA, "%s: forward %s", name,
                      fa_variant_name(res.info.forward.variant));
            CHECK_MSG(res.info.backward.variant == tensor_core_backward(&d), "%s: backward %s", name,
                      fa_variant_name(res.info.backward.variant));
        }
}

/* The warp-specialised forward (fwd_tma.cu) in every shape it takes: one,
 * two and three consumer warpgroups, 64- and 128-key tiles, two to four
 * stages, head_dim 64, 128, 192 and 256, fp16 and bf16, each product schedule
 * (FLASHATTN_TMA_SCHEDULE), with lengths that leave partial tiles, GQA,
 * causal masks and windows, dropout and the score options; and what it
 * refuses. */
FA_TEST(tma_shapes) {
    REQUIRE_WGMMA();
    const struct {
        int dim, br, bc, stages;
        const char *schedule;
    } shapes[] = {
        {128, 128, 128, 2, "overlap"}, {128, 128, 128, 2, "both"},   {128, 128, 128, 2, "pingpong"},
        {128, 128, 128, 2, "plain"},   {128, 128, 64, 3, "overlap"}, {128, 64, 128, 2, "overlap"},
        {64, 128, 128, 2, "plain"},    {64, 128, 128, 4, "both"},    {64, 192, 128, 2, "overlap"},
        {64, 192, 64, 3, "plain"},     {64, 64, 64, 2, "overlap"},   {256, 128, 64, 2, "overlap"},
        {192, 128, 64, 2, "plain"},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(shapes); i++) {
        const tiles f = {FA_VARIANT_WGMMA_TMA, shapes[i].br, shapes[i].bc, 128 * (shapes[i].br / 64 + 1), 2,
                         shapes[i].bc / 4, shapes[i].stages, 1};
        setenv("FLASHATTN_TMA_SCHEDULE", shapes[i].schedule, 1);
        for (int w = 0; w < 2; w++) {
            fa_attention_desc d = mma_desc(w, 2, 333, 301 + 97 * (int)i, 4, 2, shapes[i].dim);
            d.causal = (int)((i + (size_t)w) % 2);
            if (i % 3 == 2 && w == 1) {
                d.window_left = 70;
                d.window_right = 20;
            }
            if (i % 4 == 1 && w == 0) {
                d.dropout_p = 0.2f;
                d.dropout_seed = 5 + i;
            }
            if (i % 4 == 3) d.softcap = 20.0f;
            char name[112];
            snprintf(name, sizeof name, "tma %s d%d %dx%d s%d%s%s%s%s", shapes[i].schedule, shapes[i].dim, f.br, f.bc,
                     f.stages, w ? " bf16" : " fp16", d.causal ? " causal" : "", d.window_left >= 0 ? " window" : "",
                     d.dropout_p > 0.0f ? " dropout" : d.softcap > 0.0f ? " softcap" : "");
            run_tiles(name, &d, &f, NULL, 0);
        }
    }
    unsetenv("FLASHATTN_TMA_SCHEDULE");
    /* A query tile past the keys, one key, and a sequence shorter than a
     * consumer warpgroup's rows. */
    const int lens[][2] = {{1, 1}, {70, 1}, {129, 2000}, {2000, 129}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(lens); i++) {
        fa_attention_desc d = mma_desc(0, 1, lens[i][0], lens[i][1], 2, 1, 128);
        d.causal = (int)(i % 2);
        const tiles f = {FA_VARIANT_WGMMA_TMA, 128, 128, 384, 2, 32, 2, 1};
        char name[64];
        snprintf(name, sizeof name, "tma lengths %d x %d%s", lens[i][0], lens[i][1], d.causal ? " causal" : "");
        run_tiles(name, &d, &f, NULL, 0);
    }

    fa_attention_desc d = mma_desc(0, 1, 256, 256, 2, 2, 128);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (!plan) return;
    CHECK_MSG(plan->info.forward.variant == FA_VARIANT_WGMMA_TMA, "planned %s", vname(&plan->info.forward));
    const tiles bad[] = {
        {FA_VARIANT_WGMMA_TMA, 128, 128, 256, 2, 32, 2, 1}, /* no producer warpgroup */
        {FA_VARIANT_WGMMA_TMA, 96, 128, 384, 2, 32, 2, 1},  /* not whole warpgroups of 64 rows */
        {FA_VARIANT_WGMMA_TMA, 128, 32, 384, 2, 8, 2, 1},   /* a key tile it has no products for */
        {FA_VARIANT_WGMMA_TMA, 128, 128, 384, 2, 32, 1, 1}, /* one stage */
        {FA_VARIANT_WGMMA_TMA, 256, 64, 640, 2, 16, 2, 1},  /* four consumer warpgroups */
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(bad); i++)
        CHECK_MSG(force_tiles(plan, &bad[i], NULL) == FA_ERR_UNSUPPORTED, "bad tile %zu accepted", i);
    fa_plan_destroy(plan);
    /* Varlen and TF32 are not its problems: forced, refused. (Head dims
     * between whole blocks are, padded: tma_padded_head_dims.) */
    static const int32_t cu[3] = {0, 100, 256};
    fa_attention_desc v = mma_desc(0, 2, 156, 156, 2, 2, 128);
    v.cu_seqlens_q = cu;
    v.cu_seqlens_k = cu;
    const fa_attention_desc tf32 = mma_desc(2, 1, 256, 256, 2, 2, 128);
    const tiles ok = {FA_VARIANT_WGMMA_TMA, 128, 128, 384, 2, 32, 2, 1};
    for (int k = 0; k < 2; k++) {
        fa_attention_desc x = k ? tf32 : v;
        plan = NULL;
        CHECK_OK(fa_plan_create(g_ctx, &x, &plan));
        if (!plan) continue;
        CHECK_MSG(plan->info.forward.variant == (k ? FA_VARIANT_MMA : FA_VARIANT_WGMMA), "%s: planned %s",
                  k ? "tf32" : "varlen", vname(&plan->info.forward));
        CHECK_MSG(force_tiles(plan, &ok, NULL) == FA_ERR_UNSUPPORTED, "%s: forced tile accepted", k ? "tf32" : "varlen");
        fa_plan_destroy(plan);
    }
}

/* The plans the planner makes for training and decoding shapes on the
 * described H100 and on this device, tensor-core tiles run as such, on
 * small problems. */
/* ------------------------------------------------------------------------ */
/* FP8 (e4m3) inputs: fwd_tma.cu built with FP8 on sm_90                     */

/* e4m3 inputs for one case, over each tensor's whole span. exact: Q and K
 * of -1, 0 and 1 (non-zero with probability density), so that with
 * descale_q descale_k softmax_scale log2 e = 1 or 2 every logit in log2
 * units is an integer, every probability a power of two and the kernel's
 * e4m3 P exact: O then differs from the fp64 reference by the fp32 sums
 * and the rounding of O alone. Otherwise N(0, 1) times mag, rounded. */
static void fp8_fill(fa_rng *rng, uint8_t *t, int64_t n, int exact, double density, double mag) {
    for (int64_t i = 0; i < n; i++) {
        double x = mag * fa_rng_normal(rng);
        if (exact) {
            const double u = fa_rng_uniform(rng, 0.0, 1.0);
            x = u < density / 2 ? -1.0 : u < density ? 1.0 : 0.0;
        }
        t[i] = fa_f64_to_e4m3(x);
    }
}

/* One fp8 problem on the planned kernel (or the forced tile f) against the
 * fp64 reference (O, with the gaps of its layout untouched, and L), then
 * again after fa_plan_set_descale with each set of factors in later[]
 * (nlater of them: three floats each), on the same plan. tol: O's
 * relative error. */
static void run_fp8(const char *name, const fa_attention_desc *desc, const tiles *f, int exact, double tol,
                    const float (*later)[3], int nlater) {
    fa_attention_desc d = *desc;
    fa_plan plan = NULL;
    fa_status st = fa_plan_create(g_ctx, &d, &plan);
    CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s (%s)", name, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return;
    if (f && (st = force_tiles(plan, f, NULL)) != FA_SUCCESS) {
        CHECK_MSG(0, "%s: forcing tiles: %s (%s)", name, fa_status_string(st), fa_last_error());
        fa_plan_destroy(plan);
        return;
    }
    const fa_kernel_plan *kp = &plan->info.forward;
    CHECK_MSG(kp->variant == FA_VARIANT_WGMMA_TMA && plan->info.fp8, "%s: planned %s", name, vname(kp));
#ifdef FA_WITH_CUDA
    size_t smem = 0;
    CHECK_MSG(fa_cuda_plan_shared_bytes(plan->impl, FA_PASS_FORWARD, &smem) == FA_SUCCESS &&
                  smem == kp->local_mem_bytes,
              "%s: the kernel uses %zu bytes of shared memory, the plan %zu", name, smem, kp->local_mem_bytes);
#endif
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed(name, 0));
    tensor q, k, v, o;
    tensor *all[] = {&q, &k, &v, &o};
    const fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O};
    int ok = 1;
    for (int i = 0; i < 4; i++) ok &= tensor_init(all[i], g_ctx, &d, roles[i]);
    const int64_t nl = (int64_t)d.heads_q * fa_attention_total_q(&d);
    const size_t lse_bytes = (size_t)(nl > 0 ? nl : 1) * sizeof(float);
    float *lse = malloc(lse_bytes), *lse_ref = malloc(lse_bytes), *lse_poison = malloc(lse_bytes);
    void *o_ref = malloc(o.bytes + 16), *poison_o = malloc(o.bytes + 16);
    fa_buffer lse_dev = NULL;
    ok &= lse && lse_ref && lse_poison && o_ref && poison_o && fa_buffer_alloc(g_ctx, lse_bytes, &lse_dev) == FA_SUCCESS;
    CHECK_MSG(ok, "%s: allocation failed", name);
    if (ok) {
        /* Q and K of about 2 non-zero products a dot: logits within a few
         * units of each other, none of whose probabilities e4m3 loses. */
        const double density = sqrt(2.0 / d.head_dim);
        fp8_fill(&rng, q.host, q.count, exact, density, 3.0);
        fp8_fill(&rng, k.host, k.count, exact, density, 3.0);
        fp8_fill(&rng, v.host, v.count, 0, 0.0, 1.0);
        fa_test_poison(poison_o, d.o.dtype, o.count);
        fa_test_poison(lse_poison, FA_DTYPE_F32, nl);
        CHECK_OK(fa_buffer_upload(q.dev, 0, q.host, q.bytes));
        CHECK_OK(fa_buffer_upload(k.dev, 0, k.host, k.bytes));
        CHECK_OK(fa_buffer_upload(v.dev, 0, v.host, v.bytes));
    }
    for (int run = 0; ok && run <= nlater; run++) {
        if (run > 0) {
            const float *ds = later[run - 1];
            CHECK_OK(fa_plan_set_descale(plan, ds[0], ds[1], ds[2]));
            d.descale_q = ds[0];
            d.descale_k = ds[1];
            d.descale_v = ds[2];
        }
        memcpy(o_ref, poison_o, o.bytes);
        CHECK_OK(fa_ref_forward(&d, q.host, k.host, v.host, o_ref, lse_ref));
        CHECK_OK(fa_buffer_upload(o.dev, 0, poison_o, o.bytes));
        CHECK_OK(fa_buffer_upload(lse_dev, 0, lse_poison, lse_bytes));
        CHECK_OK(fa_forward(plan, q.dev, k.dev, v.dev, o.dev, lse_dev));
        CHECK_OK(fa_buffer_download(o.dev, 0, o.host, o.bytes));
        CHECK_OK(fa_buffer_download(lse_dev, 0, lse, lse_bytes));
        char what[200];
        snprintf(what, sizeof what, "%s (descale %g %g %g) O", name, (double)d.descale_q, (double)d.descale_k,
                 (double)d.descale_v);
        const double err = compare_tensor(&d, FA_TENSOR_O, o.host, o_ref, poison_o, o.count, what);
        CHECK_MSG(err < tol, "%s: relative error %.3g (limit %.1g)", what, err, tol);
        /* Exact inputs: logits in sums of exact products. Random ones:
         * 8-bit products accumulate with fewer bits than fp32, so L's
         * error grows with the logits (on an H100 1.1e-4 where
         * descale_q descale_k is 1). */
        compare_lse(lse, lse_ref, nl, what, exact ? 1e-5 : 1e-3);
        fprintf(stderr, "  %-44s %s->%s %3dx%-3d O %.2e\n", what, fa_dtype_name(d.q.dtype), fa_dtype_name(d.o.dtype),
                kp->br, kp->bc, err);
    }
    for (int i = 0; i < 4; i++) tensor_free(all[i]);
    if (lse_dev) fa_buffer_free(lse_dev);
    free(lse);
    free(lse_ref);
    free(lse_poison);
    free(o_ref);
    free(poison_o);
    fa_plan_destroy(plan);
}

/* An fp8 descriptor: e4m3 Q, K, V, O in o_dtype, descale_q descale_k
 * softmax_scale log2 e = 1 (fp8_fill's exact inputs). */
static fa_attention_desc fp8_desc(int batch, int sq, int sk, int hq, int hkv, int dim, fa_dtype o_dtype) {
    fa_attention_desc d = suite_desc(FA_DTYPE_BF16, batch, sq, sk, hq, hkv, dim);
    d.q.dtype = d.k.dtype = d.v.dtype = FA_DTYPE_FP8_E4M3;
    d.o.dtype = o_dtype;
    d.softmax_scale = (float)0.69314718055994531; /* log2 e times it: 1 */
    d.descale_q = 0.5f;
    d.descale_k = 2.0f;
    d.descale_v = 0.75f;
    return d;
}

/* FP8 (e4m3) inputs on sm_90, each against the fp64 reference: every
 * head_dim the kernel takes, causal or not, sliding windows, GQA and MQA,
 * lengths that are no multiple of the tiles (a query tile past the keys,
 * one key, sequences shorter than a warpgroup's rows), strided layouts,
 * O in bf16 and fp16, every product schedule (plain, causal, windowed),
 * and descale factors changed
 * on the plan (fa_plan_set_descale). Exact inputs (fp8_fill) check O to
 * its rounding; random ones, whose probabilities e4m3 rounds, to 5%. */
FA_TEST(fp8_forward) {
    REQUIRE_WGMMA();
    static const float later[][3] = {{2.0f, 0.5f, 0.25f}, {0.25f, 8.0f, 3.0f}};
    /* On an H100: exact inputs 0.7e-3 to 1.4e-3 (bf16 O), random 1.9e-2
     * to 2.3e-2. */
    const double exact_tol = 6e-3, random_tol = 5e-2;
    static const struct {
        int dim, batch, sq, sk, hq, hkv, causal, wl, wr;
    } shapes[] = {
        {128, 2, 333, 301, 4, 2, 0, -1, -1}, {128, 1, 1000, 1000, 2, 2, 1, -1, -1}, {128, 1, 700, 900, 4, 1, 0, 70, 20},
        {64, 2, 500, 500, 6, 2, 1, -1, -1},  {64, 1, 333, 1030, 3, 1, 0, -1, -1},   {64, 1, 900, 900, 2, 2, 1, 200, 0},
        {256, 1, 200, 300, 2, 1, 0, -1, -1}, {256, 1, 400, 400, 2, 2, 1, -1, -1},   {192, 2, 150, 250, 2, 2, 1, -1, -1},
        {128, 1, 1, 1, 2, 1, 0, -1, -1},     {128, 1, 70, 1, 2, 1, 1, -1, -1},      {128, 1, 129, 2000, 2, 1, 1, -1, -1},
        {128, 1, 2000, 129, 2, 1, 1, -1, -1}, {64, 1, 40, 40, 1, 1, 0, -1, -1},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(shapes); i++) {
        fa_attention_desc d = fp8_desc(shapes[i].batch, shapes[i].sq, shapes[i].sk, shapes[i].hq, shapes[i].hkv,
                                       shapes[i].dim, i % 3 == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16);
        d.causal = shapes[i].causal;
        d.window_left = shapes[i].wl;
        d.window_right = shapes[i].wr;
        char name[112];
        snprintf(name, sizeof name, "fp8 d%d %dx%d h%d/%d%s%s", shapes[i].dim, shapes[i].sq, shapes[i].sk, shapes[i].hq,
                 shapes[i].hkv, d.causal ? " causal" : "", d.window_left >= 0 ? " window" : "");
        run_fp8(name, &d, NULL, 1, exact_tol, later, i == 0 || i == 4 ? 2 : 0);
    }
    /* Strided layouts of 1-byte elements: heads apart by more than a row,
     * tokens by more than the heads, offsets of 16-byte multiples. */
    fa_attention_desc s = fp8_desc(2, 300, 260, 4, 2, 128, FA_DTYPE_BF16);
    s.q.offset = 48;
    s.q.stride_head = 160;
    s.q.stride_seq = 4 * 160 + 32;
    s.q.stride_batch = 300 * (4 * 160 + 32) + 16;
    s.k.stride_seq = 2 * 128 + 64;
    s.k.stride_batch = 260 * (2 * 128 + 64);
    s.v.offset = 16;
    s.v.stride_head = 144;
    s.v.stride_seq = 2 * 144;
    s.v.stride_batch = 260 * 2 * 144;
    s.o.offset = 8;
    s.o.stride_seq = 4 * 128 + 8;
    s.o.stride_batch = 300 * (4 * 128 + 8);
    run_fp8("fp8 d128 strided", &s, NULL, 1, exact_tol, NULL, 0);
    /* Each product schedule (the plan compiles with the environment's). */
    static const char *const schedules[] = {"overlap", "pingpong", "both", "plain"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(schedules); i++) {
        setenv("FLASHATTN_TMA_SCHEDULE", schedules[i], 1);
        for (int k = 0; k < 6; k++) {
            /* Plain, causal and a window, at head_dim 64 and 128. */
            const int dim = k % 2 ? 128 : 64;
            fa_attention_desc d = fp8_desc(1, 777, 777, 4, 2, dim, FA_DTYPE_BF16);
            d.causal = k / 2 == 1;
            if (k / 2 == 2) {
                d.window_left = 150;
                d.window_right = 30;
            }
            char name[112];
            snprintf(name, sizeof name, "fp8 d%d %s%s%s", dim, schedules[i], d.causal ? " causal" : "",
                     d.window_left >= 0 ? " window" : "");
            run_fp8(name, &d, NULL, 1, exact_tol, NULL, 0);
        }
    }
    unsetenv("FLASHATTN_TMA_SCHEDULE");
    /* Every tile the kernel takes, forced: key tiles of 64, 128 and 192,
     * one to three consumer warpgroups, two to four stages. */
    static const struct {
        int dim, br, bc, stages;
    } forced[] = {{128, 128, 128, 2}, {128, 128, 64, 3}, {128, 64, 192, 2}, {128, 128, 192, 2}, {64, 128, 192, 2},
                  {64, 192, 64, 4},   {256, 128, 64, 2}, {192, 64, 128, 2}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(forced); i++) {
        const tiles f = {FA_VARIANT_WGMMA_TMA, forced[i].br, forced[i].bc, 128 * (forced[i].br / 64 + 1), 2,
                         forced[i].bc / 4, forced[i].stages, 1};
        fa_attention_desc d = fp8_desc(2, 400, 555, 4, 2, forced[i].dim, FA_DTYPE_BF16);
        d.causal = (int)(i % 2);
        char name[112];
        snprintf(name, sizeof name, "fp8 d%d forced %dx%d/%d%s", forced[i].dim, forced[i].br, forced[i].bc,
                 forced[i].stages, d.causal ? " causal" : "");
        run_fp8(name, &d, &f, 1, exact_tol, NULL, 0);
    }
    /* Inputs whose probabilities e4m3 rounds: O to e4m3's precision. */
    for (int i = 0; i < 4; i++) {
        fa_attention_desc d = fp8_desc(2, 1024, 1024, 4, 2, i < 2 ? 128 : 64, FA_DTYPE_BF16);
        d.causal = i % 2;
        d.softmax_scale = 0.0f;
        d.descale_q = 0.5f;
        d.descale_k = 0.25f;
        d.descale_v = 4.0f;
        char name[112];
        snprintf(name, sizeof name, "fp8 d%d random%s", d.head_dim, d.causal ? " causal" : "");
        run_fp8(name, &d, NULL, 0, random_tol, later, 1);
    }
}

/* What the fp8 forward does not take is refused at plan creation, naming
 * it: dropout, block masks, score options, varlen, other head dims. */
FA_TEST(fp8_refusals) {
    REQUIRE_WGMMA();
    static const int32_t cu[3] = {0, 100, 256};
    static const float slopes[2] = {0.5f, 0.25f};
    static uint8_t blocks[2 * 2]; /* 128 tokens in blocks of 64 */
    memset(blocks, 1, sizeof blocks);
    static const char *const needles[] = {"dropout_p", "block_mask", "softcap", "alibi_slopes", "cu_seqlens_q", "head_dim"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(needles); i++) {
        fa_attention_desc d = fp8_desc(2, 128, 128, 2, 2, 128, FA_DTYPE_BF16);
        if (i == 0) d.dropout_p = 0.1f;
        if (i == 1) {
            d.block_mask = blocks;
            d.block_q = d.block_k = 64;
            d.block_mask_bytes = sizeof blocks;
        }
        if (i == 2) d.softcap = 30.0f;
        if (i == 3) d.alibi_slopes = slopes;
        if (i == 4) {
            d.cu_seqlens_q = d.cu_seqlens_k = cu;
            d.seqlen_q = d.seqlen_k = 156;
        }
        if (i == 5) d.head_dim = 96;
        fa_plan plan = NULL;
        const fa_status st = fa_plan_create(g_ctx, &d, &plan);
        CHECK_MSG(st == (i == 5 ? FA_ERR_UNSUPPORTED_HEAD_DIM : FA_ERR_UNSUPPORTED) && plan == NULL &&
                      strstr(fa_last_error(), needles[i]) && strstr(fa_last_error(), "fp8_e4m3"),
                  "%s: %s (%s)", needles[i], fa_status_string(st), fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
}

FA_TEST(mma_planned_tiles) {
    REQUIRE_MMA();
    fa_device_info here;
    CHECK_OK(fa_context_get_info(g_ctx, &here));
    const fa_device_desc *devs[] = {&fa_described_device_find("h100")->desc, &here.desc};
    const char *names[] = {"h100", "this device"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++) {
            const int decode = j == 4, dim = j == 1 ? 128 : j == 2 ? 256 : j == 3 ? 96 : 64;
            const int w = j % 3;
            fa_attention_desc big = decode ? mma_desc(w, 2, 4, 8192, 16, 2, dim) : mma_desc(w, 8, 2048, 2048, 16, 16, dim);
            big.causal = j == 1;
            fa_plan_info info;
            fa_status st = fa_plan_for_device(devs[i], &big, &info);
            CHECK_MSG(st == FA_SUCCESS, "planning for %s: %s", names[i], fa_last_error());
            if (st != FA_SUCCESS) continue;
            if (info.forward.local_mem_bytes > here.desc.local_mem_bytes ||
                info.backward.local_mem_bytes > here.desc.local_mem_bytes)
                continue;
            if (!decode) CHECK_MSG(fa_variant_on_matrix_units(info.forward.variant), "%s d%d: forward %s", names[i], dim,
                                   vname(&info.forward));
            tiles f = from_plan(&info.forward), b = from_plan(&info.backward);
            fa_attention_desc d = decode ? mma_desc(w, 1, 4, 1100, 4, 1, dim) : mma_desc(w, 1, 150, 170, 2, 1, dim);
            d.causal = big.causal;
            char name[96];
            snprintf(name, sizeof name, "%s%s d%d planned", names[i], decode ? " decode" : "", dim);
            run_tiles(name, &d, &f, &b, !decode);
        }
}

/* Shapes no kernel runs are refused with a status and leave no plan. */
FA_TEST(mma_rejects_bad_tiles) {
    REQUIRE_MMA();
    fa_attention_desc d = suite_desc(FA_DTYPE_F16, 1, 64, 64, 1, 1, 64);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (!plan) return;
    const tiles bad[] = {
        {FA_VARIANT_MMA, 64, 64, 96, 1, 1, 1, 1},   /* three warps */
        {FA_VARIANT_MMA, 256, 64, 128, 1, 1, 1, 1}, /* four strips a warp */
        {FA_VARIANT_MMA, 64, 24, 128, 1, 1, 1, 1},  /* bc not a multiple of 16 */
        {FA_VARIANT_MMA, 64, 64, 128, 1, 1, 3, 1},  /* three stages */
        {FA_VARIANT_WGMMA, 96, 64, 192, 2, 16, 1, 1},  /* not whole warpgroups of 64 rows */
        {FA_VARIANT_WGMMA, 128, 48, 256, 2, 12, 1, 1}, /* a key tile with no S product */
        {FA_VARIANT_WGMMA, 128, 64, 128, 2, 16, 1, 1}, /* two strips a warp */
        {FA_VARIANT_WGMMA, 128, 64, 256, 2, 16, 3, 1}, /* three stages */
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(bad); i++) {
        fa_status st = force_tiles(plan, &bad[i], NULL);
        CHECK_MSG(st == FA_ERR_UNSUPPORTED && plan->impl == NULL, "bad tile %zu accepted: %s", i,
                  fa_status_string(st));
    }
    const tiles fine = mma(64, 64, 4, 2);
    CHECK_OK(force_tiles(plan, &fine, NULL));
    fa_plan_destroy(plan);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (!plan) return;
    CHECK_STATUS(force_tiles(plan, &fine, NULL), FA_ERR_UNSUPPORTED); /* fp32 without allow_tf32 */
    fa_plan_destroy(plan);
}

/* ------------------------------------------------------------------------ */
/* Score options (softcap, ALiBi, additive bias) in every kernel family      */

/* heads_q of the cases below is at most 32 (the decoding shapes). */
static const float g_slopes[32] = {0.5f,  0.25f, 0.125f, 0.0625f, 0.03125f, 0.75f, 1.0f,  0.2f,
                                   0.3f,  0.01f, 0.4f,   0.6f,    0.15f,    0.05f, 0.9f,  0.35f,
                                   0.45f, 0.02f, 0.7f,   0.8f,    0.11f,    0.07f, 0.55f, 0.65f,
                                   0.13f, 0.17f, 0.19f,  0.23f,   0.29f,    0.31f, 0.37f, 0.41f};

enum { SO_SOFTCAP, SO_ALIBI, SO_BIAS, SO_ALL, SO_SETS };
static const char *const so_names[SO_SETS] = {"softcap", "alibi", "bias", "all three"};

/* Option set `set` on d (shape and dtype set, heads_q <= 16): softcap
 * alone over logits the cap bends; ALiBi alone, with a window (alt: under
 * the causal mask); the bias alone, per batch and head in fp32 with rows
 * padded past seqlen_k and an offset (alt: in the dtype, broadcast over
 * the batch); all three with dropout and a causal mask, the bias broadcast
 * over the heads (alt: in the dtype). */
static void score_option_set(fa_attention_desc *d, int set, int alt) {
    if (set == SO_SOFTCAP || set == SO_ALL) {
        d->softcap = alt ? 5.0f : 2.0f;
        d->softmax_scale = 0.5f; /* large logits, so the cap bends them */
    }
    if (set == SO_ALIBI || set == SO_ALL) {
        d->alibi_slopes = g_slopes;
        if (set == SO_ALIBI && alt) d->causal = 1;
        if (set == SO_ALIBI && !alt) {
            d->window_left = 45;
            d->window_right = 9;
        }
    }
    if (set == SO_BIAS || set == SO_ALL) {
        d->bias_batch = set == SO_BIAS && !alt ? d->batch : 1;
        d->bias_heads = set == SO_ALL ? 1 : d->heads_q;
        d->bias.dtype = alt ? d->q.dtype : FA_DTYPE_F32;
        if (!alt) {
            /* Rows padded past seqlen_k; a packed (0) stride would count
             * seqlen_k elements a row, so the outer ones are given too. */
            d->bias.offset = 3;
            d->bias.stride_seq = d->seqlen_k + 5;
            d->bias.stride_head = (int64_t)d->seqlen_q * d->bias.stride_seq;
            d->bias.stride_batch = (int64_t)d->bias_heads * d->bias.stride_head;
        }
    }
    if (set == SO_ALL) {
        d->causal = 1;
        d->dropout_p = 0.15f;
        d->dropout_seed = 77;
        d->dropout_offset = 5;
    }
}

/* Every option set (both of its forms) of base on the given kernels (NULL:
 * the planner's), forward and backward unless fwd_only; deterministic
 * plans run their backward twice (bit-identical). want_f / want_b: the
 * variants the plans must run (-1: any). */
static void score_option_cases(const char *family, const fa_attention_desc *base, const tiles *f, const tiles *b,
                               int fwd_only, int want_f, int want_b) {
    for (int set = 0; set < SO_SETS; set++)
        for (int alt = 0; alt < 2; alt++) {
            fa_attention_desc d = *base;
            score_option_set(&d, set, alt);
            char name[112];
            snprintf(name, sizeof name, "%s %s%s%s%s", family, so_names[set], alt ? " (2)" : "",
                     d.deterministic ? " deterministic" : "", d.causal ? " causal" : "");
            run_opts opt = {f, b, !fwd_only, d.deterministic && !fwd_only, 0, 0, 0, 0};
            run_result res;
            run_case(name, &d, &opt, &res);
            if (want_f >= 0)
                CHECK_MSG(res.info.forward.variant == (fa_variant)want_f, "%s: forward %s", name,
                          vname(&res.info.forward));
            if (want_b >= 0 && !fwd_only)
                CHECK_MSG(res.info.backward.variant == (fa_variant)want_b, "%s: backward %s", name,
                          vname(&res.info.backward));
            free(res.o);
        }
}

/* The FP32-pipe kernels: fp32 on the planner's tiles, fp16 and bf16 on
 * forced SIMT tiles (dQ by atomics and, deterministic, by fa_bwd_dq_simt),
 * and the split-K forward that decoding shapes with score options take
 * (the packed decoding kernel has none). */
FA_TEST(score_options_simt) {
    REQUIRE_CUDA();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 70, 90, 4, 2, 64);
    score_option_cases("simt fp32", &d, NULL, NULL, 0, FA_VARIANT_SIMT, FA_VARIANT_SIMT);
    const tiles t = simt(32, 32, 4, 2);
    for (int det = 0; det < 2; det++) {
        d = suite_desc(det ? FA_DTYPE_BF16 : FA_DTYPE_F16, 2, 61, 83, 4, 1, 40);
        d.deterministic = det;
        score_option_cases(det ? "simt bf16 d40" : "simt fp16 d40", &d, &t, &t, 0, FA_VARIANT_SIMT,
                           FA_VARIANT_SIMT);
    }
    d = suite_desc(FA_DTYPE_F16, 2, 3, 700, 8, 2, 128);
    score_option_cases("split-K decode fp16 d128", &d, NULL, NULL, 1, FA_VARIANT_SPLITK, -1);
    const tiles split = {FA_VARIANT_SPLITK, 16, 64, 256, 1, 4, 1, 5};
    d = suite_desc(FA_DTYPE_BF16, 2, 5, 900, 4, 4, 64);
    score_option_cases("split-K 5 bf16 d64", &d, &split, NULL, 1, FA_VARIANT_SPLITK, -1);
}

/* mma.sync forward and backward (forced, so that sm_90 runs them too):
 * fp16, bf16 and TF32, head_dim 64 and 128, dQ by atomics and
 * deterministic; and ALiBi with softcap over variable-length sequences
 * (no bias there: the descriptor refuses it). */
FA_TEST(score_options_mma) {
    REQUIRE_MMA();
    const tiles f64 = mma(128, 64, 4, 2), b64 = mma(64, 128, 8, 2);
    const tiles f128 = mma(64, 64, 4, 1), b128 = mma(64, 64, 4, 1);
    static const char *const dt[] = {"fp16", "bf16", "tf32"};
    for (int w = 0; w < 3; w++)
        for (int dim = 64; dim <= 128; dim += 64) {
            fa_attention_desc d = mma_desc(w, 2, 130, 150, 4, 2, dim);
            d.deterministic = dim == 128;
            char family[48];
            snprintf(family, sizeof family, "mma %s d%d", dt[w], dim);
            score_option_cases(family, &d, dim == 64 ? &f64 : &f128, dim == 64 ? &b64 : &b128, 0, FA_VARIANT_MMA,
                               FA_VARIANT_MMA);
        }
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    for (int w = 0; w < 2; w++) {
        fa_attention_desc d = mma_desc(w, 4, 77, 100, 4, 2, 64);
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.causal = 1;
        d.softcap = 3.0f;
        d.alibi_slopes = g_slopes;
        run_tiles(w ? "mma varlen causal softcap alibi bf16" : "mma varlen causal softcap alibi fp16", &d, &f64, &b64,
                  1);
        run(w ? "planned varlen causal softcap alibi bf16" : "planned varlen causal softcap alibi fp16", &d, 1);
    }
}

/* The warpgroup kernels of sm_90: forced at head_dim 64 (one and two
 * warpgroups, dQ by atomics and deterministic), and the planner's plans at
 * 128, whose backward is the warpgroup one where its registers allow the
 * options (the planner's rules, core/planner.c) and mma.sync elsewhere. */
FA_TEST(score_options_wgmma) {
    REQUIRE_WGMMA();
    const tiles f = {FA_VARIANT_WGMMA, 128, 64, 256, 2, 16, 2, 1};
    const tiles b2 = {FA_VARIANT_WGMMA, 64, 128, 256, 16, 2, 2, 1}, b1 = {FA_VARIANT_WGMMA, 64, 64, 128, 16, 2, 1, 1};
    for (int w = 0; w < 2; w++)
        for (int det = 0; det < 2; det++) {
            fa_attention_desc d = mma_desc(w, 2, 200, 230, 4, 2, 64);
            d.deterministic = det;
            score_option_cases(w ? "wgmma bf16 d64" : "wgmma fp16 d64", &d, &f, det ? &b1 : &b2, 0, FA_VARIANT_WGMMA,
                               FA_VARIANT_WGMMA);
        }
    /* The planner's forward at head_dim 128 and 64 is the warp-specialised
     * one (three consumer warpgroups at 64, two with dropout). */
    for (int w = 0; w < 2; w++) {
        fa_attention_desc d = mma_desc(w, 2, 200, 230, 4, 2, 128);
        score_option_cases(w ? "planned bf16 d128" : "planned fp16 d128", &d, NULL, NULL, 0, FA_VARIANT_WGMMA_TMA,
                           -1);
        d = mma_desc(w, 2, 333, 250, 4, 2, 64);
        score_option_cases(w ? "planned bf16 d64" : "planned fp16 d64", &d, NULL, NULL, 1, FA_VARIANT_WGMMA_TMA, -1);
    }
}

/* Above head_dim 128 (192, 256): the planner's plans, whose backward has
 * warps sharing key strips (bwd_mma.cu DK_SPLIT), dQ by atomics and
 * deterministic. */
FA_TEST(score_options_wide_heads) {
    REQUIRE_MMA();
    static const int dims[] = {192, 256};
    for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++)
        for (int w = 0; w < 2; w++) {
            fa_attention_desc d = mma_desc(w, 2, 130, 150, 4, 2, dims[i]);
            d.deterministic = w;
            char family[48];
            snprintf(family, sizeof family, "wide %s d%d", w ? "bf16" : "fp16", dims[i]);
            score_option_cases(family, &d, NULL, NULL, 0, -1, FA_VARIANT_MMA);
        }
}

/* Decoding shapes with score options never plan the packed decoding
 * kernel (it has none), and a forced one is refused naming the option. */
FA_TEST(score_options_decode_shapes) {
    REQUIRE_MMA();
    fa_attention_desc d = mma_desc(1, 1, 1, 4096, 32, 4, 128);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (!plan) return;
    CHECK(plan->info.forward.variant == FA_VARIANT_DECODE);
    const tiles packed = from_plan(&plan->info.forward);
    fa_plan_destroy(plan);
    for (int set = 0; set < SO_SETS; set++) {
        d = mma_desc(1, 1, 1, 4096, 32, 4, 128);
        score_option_set(&d, set, 1);
        d.causal = 0;
        d.dropout_p = 0.0f;
        plan = NULL;
        CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
        if (!plan) continue;
        CHECK_MSG(plan->info.forward.variant != FA_VARIANT_DECODE, "%s: forward %s", so_names[set],
                  vname(&plan->info.forward));
        const fa_status st = force_tiles(plan, &packed, NULL);
        CHECK_MSG(st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "score options"), "%s: forced decode: %s (%s)",
                  so_names[set], fa_status_string(st), fa_last_error());
        fa_plan_destroy(plan);
        char name[64];
        snprintf(name, sizeof name, "decode shape %s", so_names[set]);
        run(name, &d, 0);
    }
}

/* Standard attention has no score options (nor has the reference's): each
 * is refused at plan creation by name. */
FA_TEST(score_options_standard_refused) {
    REQUIRE_CUDA();
    for (int set = 0; set < SO_ALL; set++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F16, 1, 64, 64, 2, 2, 64);
        d.algorithm = FA_ALGO_STANDARD;
        score_option_set(&d, set, 1);
        static const char *const names[] = {"softcap", "alibi", "bias"};
        fa_plan plan = NULL;
        const fa_status st = fa_plan_create(g_ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_UNSUPPORTED && !plan && strstr(fa_last_error(), names[set]),
                  "standard attention with %s: %s (%s)", so_names[set], fa_status_string(st), fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
}

/* ------------------------------------------------------------------------ */
/* Decoding (kernels_cuda/decode.cu): a GQA group's heads and tokens packed   */
/* into one tile, keys split                                                 */

/* The packed kernel forced onto a problem (cache lengths the planner gives
 * to other kernels: shorter than its key tiles, or 1). */
static tiles decode_tiles(const fa_attention_desc *d, int split) {
    const int rows = d->heads_q / d->heads_kv * d->seqlen_q;
    const int br = rows <= 16 ? 16 : rows <= 32 && d->head_dim <= 128 ? 32 : 16;
    tiles t = {FA_VARIANT_DECODE, br, 64, 128, br / 8, 4, 2, split};
    return t;
}

/* Runs the forward of desc on the packed kernel: the planner's plan where
 * the keys are long enough for it (which must be the packed kernel), else
 * forced with split key ranges. */
static void run_decode(const char *name, const fa_attention_desc *d, int split) {
    if (d->seqlen_k >= 256 && split == 0) {
        fa_plan plan = NULL;
        CHECK_OK(fa_plan_create(g_ctx, d, &plan));
        if (plan) {
            CHECK_MSG(plan->info.forward.variant == FA_VARIANT_DECODE, "%s: planned %s", name,
                      vname(&plan->info.forward));
            fa_plan_destroy(plan);
        }
        run(name, d, 0);
        return;
    }
    const tiles t = decode_tiles(d, split);
    run_tiles(name, d, &t, NULL, 0);
}

FA_TEST(decode_gqa_lengths) {
    REQUIRE_MMA();
    const int groups[] = {1, 4, 8};
    const int lens[] = {1, 63, 65, 300, 4099};
    for (int w = 0; w < 2; w++)
        for (int sq = 1; sq <= 4; sq++)
            for (size_t gi = 0; gi < FA_ARRAY_SIZE(groups); gi++)
                for (size_t li = 0; li < FA_ARRAY_SIZE(lens); li++) {
                    fa_attention_desc d = mma_desc(w, 2, sq, lens[li], 2 * groups[gi], 2, 128);
                    char name[80];
                    snprintf(name, sizeof name, "decode sq%d g%d k%d", sq, groups[gi], lens[li]);
                    run_decode(name, &d, 0);
                    /* Split key ranges, empty ones included (more splits
                     * than key tiles). */
                    if (lens[li] > 1 || sq == 1) {
                        snprintf(name, sizeof name, "decode sq%d g%d k%d split 3", sq, groups[gi], lens[li]);
                        run_decode(name, &d, 3);
                    }
                }
}

/* Causal, bottom-right: with more query tokens than keys the first rows see
 * nothing (O = 0, L = -inf). */
FA_TEST(decode_causal) {
    REQUIRE_MMA();
    const int lens[] = {1, 3, 200, 4099};
    for (int w = 0; w < 2; w++)
        for (int sq = 1; sq <= 4; sq++)
            for (size_t li = 0; li < FA_ARRAY_SIZE(lens); li++) {
                fa_attention_desc d = mma_desc(w, 2, sq, lens[li], 16, 2, 128);
                d.causal = 1;
                char name[80];
                snprintf(name, sizeof name, "decode causal sq%d k%d", sq, lens[li]);
                run_decode(name, &d, 0);
                snprintf(name, sizeof name, "decode causal sq%d k%d split 2", sq, lens[li]);
                run_decode(name, &d, 2);
            }
}

/* Windows: left only (with causal), both sides, the diagonal alone. */
FA_TEST(decode_windows) {
    REQUIRE_MMA();
    const int lens[] = {1, 3, 200, 4099};
    const int win[][3] = {{100, 0, 1}, {50, 10, 0}, {0, 0, 0}};
    for (int w = 0; w < 2; w++)
        for (int sq = 1; sq <= 4; sq++)
            for (size_t li = 0; li < FA_ARRAY_SIZE(lens); li++)
                for (int i = 0; i < 3; i++) {
                    fa_attention_desc d = mma_desc(w, 1, sq, lens[li], 8, 2, 64);
                    d.window_left = win[i][0];
                    d.window_right = win[i][1];
                    d.causal = win[i][2];
                    char name[80];
                    snprintf(name, sizeof name, "decode window %d,%d sq%d k%d", win[i][0], win[i][1], sq, lens[li]);
                    run_decode(name, &d, 0);
                    snprintf(name, sizeof name, "decode window %d,%d sq%d k%d split 4", win[i][0], win[i][1], sq,
                             lens[li]);
                    run_decode(name, &d, 4);
                }
}

FA_TEST(decode_varlen) {
    REQUIRE_MMA();
    /* Sequences of 1 to 4 tokens (one of none) over caches of 1 to 5000
     * keys (one of none): the grid covers the longest. */
    static const int32_t cu_q[] = {0, 1, 5, 5, 7, 10};
    static const int32_t cu_k[] = {0, 5000, 5001, 5301, 5301, 5400};
    for (int w = 0; w < 2; w++)
        for (int causal = 0; causal < 2; causal++) {
            fa_attention_desc d = mma_desc(w, 5, 4, 5000, 8, 1, 128);
            d.cu_seqlens_q = cu_q;
            d.cu_seqlens_k = cu_k;
            d.causal = causal;
            run_decode(causal ? "decode varlen causal" : "decode varlen", &d, 0);
            run_decode(causal ? "decode varlen causal split 5" : "decode varlen split 5", &d, 5);
        }
}

/* The three ways a split step merges (decode.cu's splits together after
 * they meet, where the grid fits the device at once and there are at most
 * 128 splits; the last block; the separate fa_splitk_merge launch through
 * FLASHATTN_DECODE_MERGE=kernel):
 * 2 to 130 splits (more than the 65 key tiles: empty ones), a GQA group's
 * rows in one tile or two, keys with NaN in one split, and
 * repeated steps on one plan (the arrival counts wrap back to zero; the
 * result does not depend on which block merges). */
static void decode_merge_cases(const char *merge) {
    static const int splits[] = {2, 7, 66, 130};
    for (int w = 0; w < 2; w++)
        for (size_t si = 0; si < FA_ARRAY_SIZE(splits); si++)
            for (int sq = 1; sq <= 4; sq += 3) {
                fa_attention_desc d = mma_desc(w, 3, sq, 4099, 16, 2, 128);
                tiles t = decode_tiles(&d, splits[si]);
                if (sq == 4) { /* 32 rows in two tiles: counts per row tile */
                    t.br = 16;
                    t.tr = 2;
                }
                char name[80];
                snprintf(name, sizeof name, "decode merge %s sq%d split %d", merge, sq, splits[si]);
                run_opts opt = {&t, NULL, 0, 0, 0, 0, 0, 3};
                run_result res;
                run_case(name, &d, &opt, &res);
                free(res.o);
                snprintf(name, sizeof name, "decode merge %s sq%d split %d NaN keys", merge, sq, splits[si]);
                opt.nan_k0 = 1000;
                opt.nan_k1 = 1003;
                opt.fwd_repeats = 1;
                run_case(name, &d, &opt, &res);
                free(res.o);
            }
}

/* The splits' meeting, where it applies (16 to 128 splits, a grid that
 * fits the device at once): batch 1, a GQA group's rows in one tile of 16
 * or 32 (causal, tokens beyond the keys: rows with and without mass in one
 * warp of the merge), NaN keys in one split, repeated steps; the plan must
 * say the splits met, and FLASHATTN_DECODE_MERGE=last that they did not. */
FA_TEST(decode_splits_meet) {
    REQUIRE_MMA();
    const char *saved = getenv("FLASHATTN_DECODE_MERGE");
    char *keep = saved ? strdup(saved) : NULL;
    static const int splits[] = {16, 33, 64};
    for (int m = 0; m < 2; m++) {
        CHECK(setenv("FLASHATTN_DECODE_MERGE", m == 0 ? "meet" : "last", 1) == 0);
        for (int w = 0; w < 2; w++)
            for (size_t si = 0; si < FA_ARRAY_SIZE(splits); si++)
                for (int sq = 1; sq <= 4; sq += 3) {
                    fa_attention_desc d = mma_desc(w, 1, sq, 4099, 16, 2, 128);
                    d.causal = sq > 1;
                    tiles t = decode_tiles(&d, splits[si]);
                    t.br = sq == 1 ? 16 : 32;
                    t.tr = t.br / 8;
                    fa_plan plan = NULL;
                    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
                    if (!plan) continue;
#ifdef FA_WITH_CUDA
                    if (force_tiles(plan, &t, NULL) == FA_SUCCESS)
                        CHECK_MSG(fa_cuda_plan_splits_meet(plan->impl) == (m == 0), "%s, sq%d split %d: splits_meet %d",
                                  m == 0 ? "meet" : "last", sq, splits[si], fa_cuda_plan_splits_meet(plan->impl));
#endif
                    fa_plan_destroy(plan);
                    char name[80];
                    snprintf(name, sizeof name, "decode %s sq%d split %d", m == 0 ? "meet" : "last", sq, splits[si]);
                    run_opts opt = {&t, NULL, 0, 0, 0, 0, 0, 3};
                    run_result res;
                    run_case(name, &d, &opt, &res);
                    free(res.o);
                    snprintf(name, sizeof name, "decode %s sq%d split %d NaN keys", m == 0 ? "meet" : "last", sq,
                             splits[si]);
                    opt.nan_k0 = 1000;
                    opt.nan_k1 = 1003;
                    opt.fwd_repeats = 1;
                    run_case(name, &d, &opt, &res);
                    free(res.o);
                }
    }
    if (keep)
        CHECK(setenv("FLASHATTN_DECODE_MERGE", keep, 1) == 0);
    else
        CHECK(unsetenv("FLASHATTN_DECODE_MERGE") == 0);
    free(keep);
}

FA_TEST(decode_split_merges) {
    REQUIRE_MMA();
    const char *saved = getenv("FLASHATTN_DECODE_MERGE");
    char *keep = saved ? strdup(saved) : NULL;
    CHECK(setenv("FLASHATTN_DECODE_MERGE", "meet", 1) == 0);
    decode_merge_cases("meet");
    CHECK(setenv("FLASHATTN_DECODE_MERGE", "last", 1) == 0);
    decode_merge_cases("last");
    CHECK(setenv("FLASHATTN_DECODE_MERGE", "kernel", 1) == 0);
    decode_merge_cases("kernel");
    if (keep)
        CHECK(setenv("FLASHATTN_DECODE_MERGE", keep, 1) == 0);
    else
        CHECK(unsetenv("FLASHATTN_DECODE_MERGE") == 0);
    free(keep);
}

/* Every head_dim the planner gives the kernel, in bf16 (fp16 at 64 and 128
 * beside the other cases), causal, as planned and with forced splits (one
 * problem a head_dim, so one backward program to compile at plan creation);
 * in two halves that run side by side. */
static void decode_dims(int lo, int hi) {
    const int dims[] = {16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256};
    for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++) {
            if (dims[i] < lo || dims[i] > hi || (w == 0 && dims[i] != 64 && dims[i] != 128)) continue;
            fa_attention_desc d = mma_desc(w, 1, 2, 1000, 16, 2, dims[i]);
            d.causal = 1;
            char name[64];
            snprintf(name, sizeof name, "decode causal head_dim %d", dims[i]);
            run_decode(name, &d, 0);
            snprintf(name, sizeof name, "decode causal head_dim %d split 3", dims[i]);
            run_decode(name, &d, 3);
        }
}

FA_TEST(decode_head_dims_small) {
    REQUIRE_MMA();
    decode_dims(16, 128);
}

FA_TEST(decode_head_dims_large) {
    REQUIRE_MMA();
    decode_dims(129, 256);
}

/* What stays off the packed kernel, and a forced plan it cannot run. */
FA_TEST(decode_refusals) {
    REQUIRE_MMA();
    fa_attention_desc d = mma_desc(1, 1, 1, 4096, 32, 4, 128);
    d.dropout_p = 0.1f;
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (plan) {
        CHECK_MSG(plan->info.forward.variant != FA_VARIANT_DECODE, "dropout: %s", vname(&plan->info.forward));
        fa_plan_destroy(plan);
    }
    run("decode shape with dropout", &d, 0);
    d = mma_desc(1, 1, 1, 4096, 32, 4, 128);
    CHECK_OK(fa_plan_create(g_ctx, &d, &plan));
    if (!plan) return;
    CHECK(plan->info.forward.variant == FA_VARIANT_DECODE);
    tiles bad = from_plan(&plan->info.forward);
    bad.bc = 32;
    CHECK_STATUS(force_tiles(plan, &bad, NULL), FA_ERR_UNSUPPORTED);
    bad = from_plan(&plan->info.forward);
    bad.stages = 1;
    CHECK_STATUS(force_tiles(plan, &bad, NULL), FA_ERR_UNSUPPORTED);
    fa_plan_destroy(plan);
}

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(score_options), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences), FA_CASE(extreme_windows), FA_CASE(destroy_in_any_order),
             FA_CASE(bench_copy_and_read), FA_CASE(decode_splits_meet),
             FA_CASE(huge_mask_blocks), FA_CASE(env_build_options), FA_CASE(mma_dtypes), FA_CASE(mma_head_dims),
             FA_CASE(mma_masks), FA_CASE(mma_dropout), FA_CASE(mma_dropout_mask_bits),
             FA_CASE(mma_block_sparse_skips_tiles), FA_CASE(mma_deterministic_backward), FA_CASE(mma_shapes),
             FA_CASE(mma_wide_heads_d96), FA_CASE(mma_wide_heads_d192), FA_CASE(mma_wide_heads_d256),
             FA_CASE(mma_wide_heads_shapes), FA_CASE(dropout_d128_backward), FA_CASE(wgmma_shapes), FA_CASE(tma_shapes), FA_CASE(tma_backward_shapes), FA_CASE(tma_backward_split), FA_CASE(tma_padded_head_dims),
             FA_CASE(fp8_forward), FA_CASE(fp8_refusals),
             FA_CASE(mma_planned_tiles), FA_CASE(mma_rejects_bad_tiles), FA_CASE(score_options_simt),
             FA_CASE(score_options_mma), FA_CASE(score_options_wgmma), FA_CASE(score_options_wide_heads),
             FA_CASE(score_options_decode_shapes), FA_CASE(score_options_standard_refused),
             FA_CASE(decode_gqa_lengths),
             FA_CASE(decode_causal), FA_CASE(decode_windows), FA_CASE(decode_varlen), FA_CASE(decode_split_merges),
             FA_CASE(decode_head_dims_small), FA_CASE(decode_head_dims_large), FA_CASE(decode_refusals))
