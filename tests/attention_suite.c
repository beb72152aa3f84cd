/* The attention suite every backend runs: forward and backward against the
 * fp64 CPU reference, through the public API, for every option of the
 * descriptor. Every run starts from fresh random inputs and NaN-poisoned
 * outputs; every element of every output is checked, and the gaps between
 * strided elements must stay untouched. A backend's test file supplies its
 * context and, where it can, a way to run tile shapes other than the
 * planner's (tests/attention_suite.h). */
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


#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static const suite_backend *g_backend;
static fa_context g_ctx;
static char g_skip[256];

void suite_use_backend(const suite_backend *backend) { g_backend = backend; }

/* The context every case shares; NULL (reason in g_skip) when the backend
 * has no device to run on. */
fa_context suite_context(void) {
    if (g_ctx) return g_ctx;
    if (!g_backend->compiled) {
        snprintf(g_skip, sizeof g_skip, "the %s backend is not built into this library", g_backend->name);
        return NULL;
    }
    fa_status st = fa_context_create(g_backend->backend, -1, &g_ctx);
    if (st != FA_SUCCESS) {
        snprintf(g_skip, sizeof g_skip, "no %s device: %s (%s)", g_backend->name, fa_status_string(st), fa_last_error());
        g_ctx = NULL;
    } else {
        fa_device_info info;
        if (fa_context_get_info(g_ctx, &info) == FA_SUCCESS)
            fprintf(stderr, "  running on %s: %s (driver %s)\n", g_backend->name, info.desc.name, info.driver_version);
    }
    return g_ctx;
}

#define SUITE_REQUIRE()                                                                    \
    do {                                                                                   \
        if (!suite_context()) FA_SKIP(g_skip);                                             \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

static double tol_for(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F16: return 3e-3;
    case FA_DTYPE_BF16: return 2e-2;
    default: return 1e-5;
    }
}

/* One tensor of a case: its role, host copies, device buffer. */
typedef struct tensor {
    fa_tensor_role role;
    int64_t count;      /* elements the buffer holds */
    size_t bytes;
    void *host;
    fa_buffer dev;
} tensor;

/* The API's extent and the reference's span are computed independently;
 * they must agree, and the buffer holds either. */
static int64_t tensor_count(const fa_attention_desc *d, fa_tensor_role role) {
    int64_t a = fa_desc_tensor_extent(d, role);
    int64_t b = fa_ref_tensor_span(d, role);
    CHECK_MSG(a == b, "tensor %d: the API's extent %lld differs from the reference's span %lld", (int)role,
              (long long)a, (long long)b);
    return a > b ? a : b;
}

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

/* Calls fn on the index of every element of a tensor's layout, in order. */
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

/* Which elements of the buffer belong to the tensor (1) or are gaps (0). */
static unsigned char *layout_map(const fa_attention_desc *d, fa_tensor_role role, int64_t count) {
    unsigned char *map = calloc((size_t)count + 1, 1);
    if (map) for_each_elem(d, role, mark_elem, map);
    return map;
}

typedef struct gather_state {
    const void *src;
    fa_dtype dtype;
    float *dst;
    int64_t n;
} gather_state;

static void gather_elem(int64_t index, void *user) {
    gather_state *g = user;
    g->dst[g->n++] = (float)fa_load_elem(g->src, g->dtype, index);
}

/* The tensor's elements in layout order, widened to float (exact). */
static float *gather(const fa_attention_desc *d, fa_tensor_role role, const void *src, fa_dtype dtype,
                     int64_t *n) {
    int64_t total = 0;
    for (int b = 0; b < d->batch; b++) total += (int64_t)seq_len(d, role, b) * tensor_heads(d, role) * d->head_dim;
    gather_state g = {src, dtype, malloc((size_t)(total + 1) * sizeof(float)), 0};
    if (g.dst) for_each_elem(d, role, gather_elem, &g);
    *n = g.n;
    return g.dst;
}

static int tensor_init(tensor *t, fa_context ctx, const fa_attention_desc *d, fa_tensor_role role) {
    t->role = role;
    t->count = tensor_count(d, role);
    t->bytes = (size_t)t->count * fa_dtype_size(d->q.dtype);
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

/* Relative error of a device output against the reference over the
 * layout's elements; also checks the gaps still hold the poison. */
static double compare_tensor(const fa_attention_desc *d, fa_tensor_role role, const void *got,
                             const void *want, const void *poison, int64_t count, const char *what) {
    fa_dtype dt = d->q.dtype;
    int64_t n1 = 0, n2 = 0;
    float *a = gather(d, role, got, dt, &n1);
    float *b = gather(d, role, want, dt, &n2);
    double err = INFINITY;
    if (a && b && n1 == n2) {
        err = fa_test_rel_error(a, b, FA_DTYPE_F32, n1);
        /* A gradient that is exactly zero in fp64 (one key: dS = P (dP - D)
         * cancels) has no relative error; measure it against the unit
         * scale of the N(0, 1) inputs instead. */
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < n1; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)b[i] * b[i];
        }
        if (den == 0.0 && n1 > 0 && isfinite(num)) err = sqrt(num / (double)n1);
    }
    free(a);
    free(b);
    unsigned char *map = layout_map(d, role, count);
    int64_t touched = 0;
    size_t es = fa_dtype_size(dt);
    if (map) {
        for (int64_t i = 0; i < count; i++)
            if (!map[i] && memcmp((const char *)got + i * (int64_t)es, (const char *)poison + i * (int64_t)es, es))
                touched++;
    }
    CHECK_MSG(map && touched == 0, "%s: %lld elements outside the layout were written", what, (long long)touched);
    free(map);
    return err;
}

/* L: -inf rows must match exactly, the rest to fp32 accuracy. */
static void compare_lse(const float *got, const float *want, int64_t n, const char *name) {
    int64_t inf_mismatch = 0;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
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
    CHECK_MSG(err < 1e-5, "%s: L relative error %.3g", name, err);
}

/* ------------------------------------------------------------------------ */
/* One case                                                                  */

typedef struct run_opts {
    const suite_tiles *fwd, *bwd;   /* forced tile shapes, NULL: the planner's */
    int backward;             /* also run and check the backward pass */
    int twice;                /* backward twice: results bit-identical */
    int nan_k0, nan_k1;       /* keys [nan_k0, nan_k1) of K and V set to NaN */
    uint64_t seed;
} run_opts;

typedef struct run_result {
    double err_o, err_std, err_dq, err_dk, err_dv;
    float *o;                 /* device O, gathered, when keep_o */
    int64_t o_count;
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

static const char *dname(fa_dtype t) { return fa_dtype_name(t); }

/* Inputs differ from case to case (the seed hashes the case name) and, with
 * FA_TEST_SEED set, from run to run; failures print the seed. */
uint64_t suite_case_seed(const char *name, uint64_t extra) {
    uint64_t h = 1469598103934665603ull ^ extra;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    const char *env = getenv("FA_TEST_SEED");
    if (env) h ^= strtoull(env, NULL, 0) * 0x9e3779b97f4a7c15ull;
    return h;
}

/* FA_TEST_HALF=1 runs the fp32 cases in fp16 or bf16 (by the case name),
 * the dtypes of the matrix-unit kernels: every option of the suite then
 * reaches them. */
static fa_attention_desc suite_dtype_of(const char *name, const fa_attention_desc *desc) {
    fa_attention_desc d = *desc;
    const char *env = getenv("FA_TEST_HALF");
    if (env && strcmp(env, "1") == 0 && d.q.dtype == FA_DTYPE_F32)
        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = suite_case_seed(name, 0) & 1 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    return d;
}

/* Runs the forward (and backward) pass of desc on the device and on the
 * reference, checks every output, and returns the errors in *res. */
static void run_case(const char *name, const fa_attention_desc *desc, const run_opts *opt, run_result *res) {
    fa_context ctx = suite_context();
    memset(res, 0, sizeof *res);
    res->err_o = res->err_dq = res->err_dk = res->err_dv = INFINITY;
    if (!ctx) return;
    clock_t t0 = clock();
    const fa_attention_desc promoted = suite_dtype_of(name, desc);
    const fa_attention_desc *d = &promoted;
    fa_dtype dt = d->q.dtype;
    double tol = tol_for(dt);
    fa_rng rng;
    const uint64_t seed = suite_case_seed(name, opt->seed);
    const int failures_before = fa_test_failures;
    fa_rng_seed(&rng, seed);

    fa_plan plan = NULL;
    fa_status st = fa_plan_create(ctx, d, &plan);
    CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s (%s)", name, fa_status_string(st), fa_last_error());
    if (st != FA_SUCCESS) return;
    if (opt->fwd || opt->bwd) {
        st = g_backend->force_tiles ? g_backend->force_tiles(plan, opt->fwd, opt->bwd) : FA_ERR_UNSUPPORTED;
        CHECK_MSG(st == FA_SUCCESS, "%s: forcing tiles: %s (%s)", name, fa_status_string(st), fa_last_error());
        if (st != FA_SUCCESS) {
            fa_plan_destroy(plan);
            return;
        }
    }

    if (g_backend->check_plan) g_backend->check_plan(name, plan);

    tensor q, k, v, o, dout, dq, dk, dv;
    tensor *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O,
                              FA_TENSOR_O, FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V};
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= tensor_init(all[i], ctx, d, roles[i]);
    int64_t nl = (int64_t)d->heads_q * fa_attention_total_q(d);
    size_t lse_bytes = (size_t)(nl > 0 ? nl : 1) * sizeof(float);
    float *lse = malloc(lse_bytes), *lse_ref = malloc(lse_bytes), *lse_poison = malloc(lse_bytes);
    fa_buffer lse_dev = NULL;
    ok &= lse && lse_ref && lse_poison && fa_buffer_alloc(ctx, lse_bytes, &lse_dev) == FA_SUCCESS;
    void *o_ref = malloc(o.bytes + 16), *o_std = malloc(o.bytes + 16), *poison_o = malloc(o.bytes + 16);
    void *dq_ref = malloc(dq.bytes + 16), *dk_ref = malloc(dk.bytes + 16), *dv_ref = malloc(dv.bytes + 16);
    void *poison_q = malloc(q.bytes + 16), *poison_k = malloc(k.bytes + 16), *poison_v = malloc(v.bytes + 16);
    ok &= o_ref && o_std && poison_o && dq_ref && dk_ref && dv_ref && poison_q && poison_k && poison_v;
    /* The additive bias, where the descriptor has one: random values of a
     * logit's size over its whole span (strides' gaps included). */
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

    /* Fresh random inputs; outputs poisoned. */
    for (int i = 0; i < 5; i++) {
        void *r = fa_test_random_tensor(&rng, dt, all[i]->count);
        memcpy(all[i]->host, r, all[i]->bytes);
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
    double ms = -1.0;
    CHECK_OK(fa_plan_last_time_ms(plan, &ms));
    CHECK_MSG(ms > 0.0, "%s: forward time %g ms", name, ms);

    char what[160];
    snprintf(what, sizeof what, "%s O", name);
    res->err_o = compare_tensor(d, FA_TENSOR_O, o.host, o_ref, poison_o, o.count, what);
    CHECK_MSG(res->err_o < tol, "%s: O relative error %.3g (%s limit %.1g)", name, res->err_o, dname(dt), tol);
    compare_lse(lse, lse_ref, nl, name);
    res->o = gather(d, FA_TENSOR_O, o.host, dt, &res->o_count);
    /* Unfused attention has no score options: no second opinion there. */
    if (dt != FA_DTYPE_F32 && opt->nan_k1 <= opt->nan_k0 && !options) {
        memcpy(o_std, poison_o, o.bytes);
        CHECK_OK(fa_ref_standard_forward(d, q.host, k.host, v.host, o_std, lse));
        res->err_std = compare_tensor(d, FA_TENSOR_O, o_std, o_ref, poison_o, o.count, "standard O");
        CHECK_MSG(res->err_o <= 2.0 * res->err_std,
                  "%s: O error %.3g is more than twice unfused attention's %.3g in %s", name, res->err_o,
                  res->err_std, dname(dt));
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
            CHECK_OK(fa_plan_last_time_ms(plan, &ms));
            CHECK_MSG(ms > 0.0, "%s: backward time %g ms", name, ms);
            if (run == 0) {
                snprintf(what, sizeof what, "%s dQ", name);
                res->err_dq = compare_tensor(d, FA_TENSOR_Q, dq.host, dq_ref, poison_q, dq.count, what);
                snprintf(what, sizeof what, "%s dK", name);
                res->err_dk = compare_tensor(d, FA_TENSOR_K, dk.host, dk_ref, poison_k, dk.count, what);
                snprintf(what, sizeof what, "%s dV", name);
                res->err_dv = compare_tensor(d, FA_TENSOR_V, dv.host, dv_ref, poison_v, dv.count, what);
                CHECK_MSG(res->err_dq < tol, "%s: dQ relative error %.3g (%s limit %.1g)", name, res->err_dq,
                          dname(dt), tol);
                CHECK_MSG(res->err_dk < tol, "%s: dK relative error %.3g (%s limit %.1g)", name, res->err_dk,
                          dname(dt), tol);
                CHECK_MSG(res->err_dv < tol, "%s: dV relative error %.3g (%s limit %.1g)", name, res->err_dv,
                          dname(dt), tol);
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
    fprintf(stderr, "  %-34s %-4s O %.2e", name, dname(dt), res->err_o);
    if (res->err_std > 0) fprintf(stderr, " (unfused %.2e)", res->err_std);
    if (opt->backward) fprintf(stderr, "  dQ %.2e dK %.2e dV %.2e", res->err_dq, res->err_dk, res->err_dv);
    fprintf(stderr, "  [%.1f s cpu]\n", (double)(clock() - t0) / CLOCKS_PER_SEC);

done:
    if (fa_test_failures != failures_before)
        fprintf(stderr, "  %s: inputs from seed 0x%016llx\n", name, (unsigned long long)seed);
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
/* Cases                                                                     */

fa_attention_desc suite_desc(fa_dtype dt, int batch, int sq, int sk, int hq, int hkv, int d) {
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.batch = batch;
    desc.seqlen_q = sq;
    desc.seqlen_k = sk;
    desc.heads_q = hq;
    desc.heads_kv = hkv;
    desc.head_dim = d;
    desc.q.dtype = desc.k.dtype = desc.v.dtype = desc.o.dtype = dt;
    return desc;
}

static void run(const char *name, const fa_attention_desc *desc, int backward) {
    run_opts opt = {NULL, NULL, backward, 0, 0, 0, 0};
    run_result res;
    run_case(name, desc, &opt, &res);
    free(res.o);
}

void suite_run_tiles(const char *name, const fa_attention_desc *desc, const suite_tiles *fwd, const suite_tiles *bwd,
                     int backward) {
    run_opts opt = {fwd, bwd, backward, 0, 0, 0, 0};
    run_result res;
    run_case(name, desc, &opt, &res);
    free(res.o);
}

void suite_dtypes(void) {
    SUITE_REQUIRE();
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = suite_desc(dts[i], 2, 130, 150, 2, 2, 64);
        run("dtypes b2 h2 130x150 d64", &d, 1);
    }
}

void suite_head_dims(void) {
    SUITE_REQUIRE();
    const int dims[] = {8, 32, 40, 96, 128, 256};
    for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 70, 90, 2, 2, dims[i]);
        char name[64];
        snprintf(name, sizeof name, "head_dim %d", dims[i]);
        run(name, &d, 1);
    }
    fa_attention_desc d = suite_desc(FA_DTYPE_BF16, 1, 45, 60, 2, 1, 256);
    run("head_dim 256 mqa", &d, 1);
}

void suite_causal(void) {
    SUITE_REQUIRE();
    const int shapes[][2] = {{50, 140}, {100, 100}, {140, 50}};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, shapes[i][0], shapes[i][1], 2, 2, 64);
        d.causal = 1;
        char name[64];
        snprintf(name, sizeof name, "causal %dx%d", shapes[i][0], shapes[i][1]);
        run(name, &d, 1);
    }
    fa_attention_desc d = suite_desc(FA_DTYPE_F16, 1, 120, 97, 2, 2, 64);
    d.causal = 1;
    run("causal 120x97", &d, 1);
}

void suite_sliding_window(void) {
    SUITE_REQUIRE();
    const int w[][3] = {{20, 5, 0}, {30, -1, 0}, {-1, 10, 0}, {40, 0, 1}, {7, 3, 1}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(w); i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 150, i % 2 ? 110 : 170, 2, 2, 32);
        d.window_left = w[i][0];
        d.window_right = w[i][1];
        d.causal = w[i][2];
        char name[64];
        snprintf(name, sizeof name, "window %d,%d%s %dx%d", w[i][0], w[i][1], w[i][2] ? " causal" : "", d.seqlen_q,
                 d.seqlen_k);
        run(name, &d, 1);
    }
}

/* A random block mask with about half the blocks visible and one whole
 * block row masked (its rows see no key: L = -inf, O = 0, dQ = 0). */
uint8_t *suite_random_block_mask(fa_attention_desc *d, int bq, int bk, uint64_t seed) {
    int rows = (d->seqlen_q + bq - 1) / bq, cols = (d->seqlen_k + bk - 1) / bk;
    uint8_t *m = malloc((size_t)rows * (size_t)cols);
    if (!m) return NULL;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    for (int i = 0; i < rows * cols; i++) m[i] = fa_rng_uniform(&rng, 0, 1) < 0.5;
    for (int j = 0; j < cols; j++) m[(rows / 2) * cols + j] = 0;
    d->block_mask = m;
    d->block_mask_bytes = (size_t)rows * (size_t)cols;
    d->block_q = bq;
    d->block_k = bk;
    return m;
}

void suite_block_sparse(void) {
    SUITE_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 150, 170, 2, 2, 64);
    uint8_t *m = suite_random_block_mask(&d, 16, 24, 11);
    run("block-sparse 16x24", &d, 1);
    free(m);
    d = suite_desc(FA_DTYPE_F16, 1, 200, 130, 2, 2, 32);
    m = suite_random_block_mask(&d, 40, 8, 12);
    d.causal = 1;
    run("block-sparse 40x8 causal", &d, 1);
    free(m);
}

/* Keys 32..63 are hidden from every query by the block mask and hold NaN
 * in K and V: a kernel that computed those 16-key tiles instead of
 * skipping them would carry the NaN into O (0 * NaN) and the gradients. */
void suite_block_sparse_skips_tiles(void) {
    SUITE_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 64, 96, 2, 2, 32);
    int rows = 4, cols = 6;
    uint8_t mask[24];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) mask[i * cols + j] = (uint8_t)(j == 2 || j == 3 ? 0 : (i + j) % 3 != 0);
    d.block_mask = mask;
    d.block_mask_bytes = sizeof mask;
    d.block_q = 16;
    d.block_k = 16;
    const suite_tiles t = {16, 16, 2, 2, 1, 0};
    run_opts opt = {&t, &t, 1, 0, 32, 64, 0};
    run_result res;
    run_case("block-sparse NaN in skipped tiles", &d, &opt, &res);
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < res.o_count; i++) nonfinite += !isfinite(res.o[i]);
    CHECK_MSG(res.o && nonfinite == 0, "%lld non-finite O values: masked tiles were computed", (long long)nonfinite);
    free(res.o);
}

void suite_dropout(void) {
    SUITE_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 100, 120, 2, 2, 64);
    d.dropout_p = 0.17f;
    d.dropout_seed = 0x123456789abcdefull;
    d.dropout_offset = 0x500000007ull;
    run("dropout 0.17", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 1, 90, 90, 3, 1, 32);
    d.causal = 1;
    d.dropout_p = 0.5f;
    d.dropout_seed = 42;
    run("dropout 0.5 causal mqa", &d, 1);
    /* Tiles whose width is not a multiple of four (one Philox call per
     * element instead of per four). */
    d = suite_desc(FA_DTYPE_F32, 1, 37, 41, 2, 2, 16);
    d.dropout_p = 0.3f;
    d.dropout_seed = 7;
    d.dropout_offset = 99;
    const suite_tiles t = {6, 6, 2, 3, 1, 0};
    suite_run_tiles("dropout odd tiles", &d, &t, &t, 1);
}

/* With V the identity (key j carries a 1 in dimension j), O[i][j] is
 * P[i][j] * z_ij / (1 - p): the kernel's dropout mask can be read off O and
 * compared bit for bit with fa_dropout_keep. */
void suite_dropout_mask_bits(void) {
    fa_context ctx = suite_context();
    if (!ctx) FA_SKIP(g_skip);
    const int sq = 40, sk = 64, dim = 64, heads = 2;
    const fa_attention_desc base = suite_desc(FA_DTYPE_F32, 2, sq, sk, heads, heads, dim);
    fa_attention_desc d = suite_dtype_of("dropout_mask_bits", &base);
    const fa_dtype dt = d.q.dtype;
    const size_t es = fa_dtype_size(dt);
    d.dropout_p = 0.25f;
    d.dropout_seed = 0xfeedface12345ull;
    d.dropout_offset = 3;
    d.softmax_scale = 0.05f; /* keeps every P comfortably above 0 */
    size_t nq = (size_t)2 * sq * heads * dim, nk = (size_t)2 * sk * heads * dim;
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed("dropout_mask_bits", 0));
    void *q = fa_test_random_tensor(&rng, dt, (int64_t)nq);
    void *k = fa_test_random_tensor(&rng, dt, (int64_t)nk);
    void *v = calloc(nk, es);
    void *o = malloc(nq * es);
    float *lse = malloc((size_t)2 * heads * sq * sizeof(float));
    fa_buffer bq = NULL, bk = NULL, bv = NULL, bo = NULL, bl = NULL;
    fa_plan plan = NULL;
    CHECK(q && k && v && o && lse);
    if (!(q && k && v && o && lse)) goto out;
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
                    const double val = fa_load_elem(o, dt, (((int64_t)b * sq + i) * heads + h) * dim + j);
                    int keep = fa_dropout_keep(d.dropout_seed, d.dropout_offset, d.dropout_p, b, h, heads, i, j);
                    wrong += (val != 0.0) != keep || !isfinite(val);
                    dropped += !keep;
                    total++;
                }
    CHECK_MSG(wrong == 0, "%lld of %lld dropout decisions differ from the reference (%s)", (long long)wrong,
              (long long)total, dname(dt));
    /* The mask is really a mask: about p of the elements dropped. */
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
    free(lse);
}

void suite_gqa_mqa(void) {
    SUITE_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 32);
    run("gqa 6/2", &d, 1);
    d = suite_desc(FA_DTYPE_BF16, 1, 100, 80, 4, 1, 64);
    d.causal = 1;
    run("mqa 4/1 causal", &d, 1);
}

void suite_varlen(void) {
    SUITE_REQUIRE();
    /* Sequence 1 has no queries, sequence 3 no keys (its rows: L = -inf). */
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 4, 77, 100, 2, 2, 32);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    run("varlen", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 4, 77, 100, 4, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.dropout_p = 0.1f;
    d.dropout_seed = 5;
    run("varlen causal dropout gqa", &d, 1);
}

void suite_decoding_splitk(void) {
    SUITE_REQUIRE();
    const int sqs[] = {1, 7, 16};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F16, 2, sqs[i], 2100, 4, 1, 64);
        d.causal = i == 1;
        const suite_tiles t = {16, 64, 1, 4, 4 + i, 0};
        char name[64];
        snprintf(name, sizeof name, "decode %dx2100 split %d%s", sqs[i], t.split, d.causal ? " causal" : "");
        suite_run_tiles(name, &d, &t, NULL, 0);
    }
    /* More splits than key tiles: some splits see nothing and weigh 0. */
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 3, 150, 2, 2, 32);
    const suite_tiles t = {8, 32, 1, 2, 8, 0};
    suite_run_tiles("decode 3x150 split 8", &d, &t, NULL, 0);
    static const int32_t cu_q[] = {0, 1, 3, 4};
    static const int32_t cu_k[] = {0, 700, 2300, 2301};
    d = suite_desc(FA_DTYPE_BF16, 3, 2, 1600, 2, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.window_left = 500;
    suite_run_tiles("decode varlen window split 4", &d, &(suite_tiles){16, 32, 1, 2, 4, 0}, NULL, 0);
    d = suite_desc(FA_DTYPE_F16, 1, 4, 3000, 8, 1, 128);
    run("decode planner's own plan", &d, 0);
}

/* The score options of a descriptor as SUITE_* bits. */
static int score_options_of(const fa_attention_desc *d) {
    return (d->softcap > 0.0f ? SUITE_SOFTCAP : 0) | (d->alibi_slopes ? SUITE_ALIBI : 0) |
           (d->bias_batch > 0 ? SUITE_BIAS : 0);
}

/* A case the backend computes runs against the reference (forward and,
 * with backward, the gradients); one it does not must be refused at plan
 * creation, naming the option. */
static void run_score_case(const char *name, const fa_attention_desc *d, int backward) {
    const int want = score_options_of(d);
    if ((want & g_backend->score_options) == want) {
        run(name, d, backward);
        return;
    }
    /* The message names an option the backend lacks. */
    const int missing = want & ~g_backend->score_options;
    const char *option = missing & SUITE_SOFTCAP ? "softcap" : missing & SUITE_ALIBI ? "alibi_slopes" : "bias";
    fa_plan plan = NULL;
    const fa_status st = fa_plan_create(suite_context(), d, &plan);
    CHECK_MSG(st == FA_ERR_UNSUPPORTED && plan == NULL && strstr(fa_last_error(), option),
              "%s: the %s backend should refuse %s: %s (%s)", name, g_backend->name, option, fa_status_string(st),
              fa_last_error());
    if (plan) fa_plan_destroy(plan);
    fprintf(stderr, "  %-34s refused: %s\n", name, fa_last_error());
}

void suite_score_options(void) {
    SUITE_REQUIRE();
    static const float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.75f, 0.03125f, 1.0f, 0.2f};
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 67, 67, 2, 2, 64);
    d.causal = 1;
    d.softcap = 2.5f;
    d.softmax_scale = 0.5f; /* large logits, so the cap bends them */
    run_score_case("softcap causal", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 1, 33, 100, 4, 2, 128);
    d.softcap = 1.0f;
    run_score_case("softcap GQA", &d, 1);
    d = suite_desc(FA_DTYPE_F32, 2, 40, 72, 4, 4, 64);
    d.causal = 1;
    d.alibi_slopes = slopes;
    run_score_case("alibi causal bottom-right", &d, 1);
    d = suite_desc(FA_DTYPE_BF16, 1, 80, 80, 8, 2, 64);
    d.alibi_slopes = slopes;
    d.window_left = 20;
    d.window_right = 5;
    run_score_case("alibi window GQA", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 2, 50, 70, 2, 2, 64);
    d.bias_batch = 1;
    d.bias_heads = 1;
    d.bias.dtype = FA_DTYPE_F32;
    run_score_case("bias f32 broadcast", &d, 1);
    d = suite_desc(FA_DTYPE_BF16, 2, 45, 45, 4, 2, 128);
    d.causal = 1;
    d.bias_batch = 2;
    d.bias_heads = 4;
    d.bias.dtype = FA_DTYPE_BF16;
    run_score_case("bias per batch and head, causal", &d, 1);
    d = suite_desc(FA_DTYPE_F32, 2, 31, 90, 4, 1, 32);
    d.bias_batch = 2;
    d.bias_heads = 1;
    d.bias.dtype = FA_DTYPE_F32;
    d.bias.offset = 7;
    d.bias.stride_seq = 96; /* rows padded past seqlen_k */
    d.bias.stride_batch = 31 * 96 + 5;
    run_score_case("bias strided with offset", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 2, 64, 96, 4, 2, 64);
    d.causal = 1;
    d.softcap = 3.0f;
    d.alibi_slopes = slopes;
    d.bias_batch = 1;
    d.bias_heads = 4;
    d.bias.dtype = FA_DTYPE_F16;
    d.dropout_p = 0.2f;
    d.dropout_seed = 99;
    run_score_case("all three with dropout", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 2, 1, 700, 8, 2, 128);
    d.softcap = 5.0f;
    d.alibi_slopes = slopes;
    run_score_case("decoding softcap alibi", &d, 0);
}

void suite_lengths(void) {
    SUITE_REQUIRE();
    const int lens[] = {1, 7, 127, 1000};
    for (int i = 0; i < 4; i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, lens[i], lens[i], 1, 1, 16);
        char name[64];
        snprintf(name, sizeof name, "length %d", lens[i]);
        run(name, &d, 1);
    }
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 4097, 4097, 1, 1, 8);
    d.causal = 1;
    run("length 4097 causal", &d, 1);
    d = suite_desc(FA_DTYPE_F32, 1, 7, 1000, 1, 1, 16);
    run("length 7x1000", &d, 1);
}

void suite_strides_offsets(void) {
    SUITE_REQUIRE();
    /* BHSD: [batch, heads, seq, dim]. */
    const int b = 2, sq = 70, sk = 90, hq = 4, hkv = 2, dim = 32;
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, b, sq, sk, hq, hkv, dim);
    fa_tensor_desc *t[] = {&d.q, &d.k, &d.v, &d.o};
    for (int i = 0; i < 4; i++) {
        int heads = i == 1 || i == 2 ? hkv : hq, seq = i == 1 || i == 2 ? sk : sq;
        t[i]->stride_seq = dim;
        t[i]->stride_head = (int64_t)seq * dim;
        t[i]->stride_batch = (int64_t)heads * seq * dim;
    }
    run("bhsd", &d, 1);
    /* Padded rows and offsets (in elements, 16-byte multiples). */
    d = suite_desc(FA_DTYPE_F16, b, sq, sk, hq, hkv, 64);
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
    run("padded strides and offsets", &d, 1);
    static const int32_t cu_q[] = {0, 30, 100};
    static const int32_t cu_k[] = {0, 55, 90};
    d = suite_desc(FA_DTYPE_BF16, 2, 70, 55, 2, 2, 32);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.q.offset = 16;
    d.q.stride_seq = 2 * 32 + 8;
    d.o.stride_head = 40;
    d.o.stride_seq = 2 * 40;
    run("varlen strides", &d, 1);
}

void suite_deterministic_backward(void) {
    SUITE_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F16, 2, 110, 130, 4, 2, 64);
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 1234;
    d.deterministic = 1;
    run_opts opt = {NULL, NULL, 1, 1, 0, 0, 0};
    run_result res;
    run_case("deterministic backward", &d, &opt, &res);
    free(res.o);
}

/* Whether this device can hold both passes' work-groups and local memory
 * (matrix-unit tiles: their work-groups; force_tiles checks the rest). */
static int fits_here(const fa_attention_desc *d, const suite_tiles *f, const suite_tiles *b) {
    fa_device_info info;
    if (fa_context_get_info(suite_context(), &info) != FA_SUCCESS) return 0;
    const suite_tiles *t[2] = {f, b};
    for (int pass = 0; pass < 2; pass++) {
        int wg = (t[pass]->br / t[pass]->tr) * (t[pass]->bc / t[pass]->tc);
        size_t local = t[pass]->mma ? 0 : fa_plan_local_mem(FA_VARIANT_SIMT, (fa_pass)pass, d, t[pass]->br, t[pass]->bc, 1);
        if (wg > info.desc.max_work_group_size || local > fa_plan_variant_local_mem(&info.desc, FA_VARIANT_SIMT))
            return 0;
    }
    return 1;
}

/* The tiles the planner picks on each described device, run here on small
 * problems: the kernels must be right for every shape the planner emits,
 * not only for PoCL's. Training shapes (8 x 16 heads x 2048) give the large
 * tiles, a decoding shape (4 queries, 8192 keys) the split-K plans. Where
 * a device would use matrix units its fp32 plan is taken instead, unless
 * the backend runs that device's matrix-unit tiles here (runs_mma: an
 * OpenCL device of the layout this one runs, native or emulated). */
void suite_described_devices(void) {
    SUITE_REQUIRE();
    static const char *const keys[] = {"h100", "mi250x", "arc-a770", "nvidia-opencl", "pocl-cpu"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(keys); i++) {
        const fa_described_device *dev = fa_described_device_find(keys[i]);
        CHECK_MSG(dev != NULL, "described device %s is missing", keys[i]);
        if (!dev) continue;
        for (int j = 0; j < 3; j++) {
            const int decode = j == 2, dim = j == 1 ? 128 : 64;
            const fa_dtype dt = j == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
            fa_attention_desc big = decode ? suite_desc(dt, 2, 4, 8192, 16, 2, dim) : suite_desc(dt, 8, 2048, 2048, 16, 16, dim);
            big.causal = j == 1;
            fa_plan_info info;
            fa_status st = fa_plan_for_device(&dev->desc, &big, &info);
            const int mma_here = g_backend->runs_mma && g_backend->runs_mma(suite_context(), &dev->desc);
            if (st == FA_SUCCESS &&
                ((!mma_here && (info.forward.variant == FA_VARIANT_MMA || info.backward.variant == FA_VARIANT_MMA)) ||
                 info.forward.variant == FA_VARIANT_DECODE)) {
                /* Matrix-unit tiles of another backend or layout (or CUDA's
                 * decoding kernel, tested in its own cases); the device's
                 * fp32 (SIMT) plan runs here instead. */
                big.q.dtype = big.k.dtype = big.v.dtype = big.o.dtype = FA_DTYPE_F32;
                st = fa_plan_for_device(&dev->desc, &big, &info);
            }
            CHECK_MSG(st == FA_SUCCESS, "planning for %s: %s", keys[i], fa_last_error());
            if (st != FA_SUCCESS) continue;
            suite_tiles f = {info.forward.br, info.forward.bc, info.forward.thread_rows, info.forward.thread_cols,
                             info.forward.split_k > 1 ? info.forward.split_k : 1,
                             info.forward.variant == FA_VARIANT_MMA};
            suite_tiles b = {info.backward.br, info.backward.bc, info.backward.thread_rows, info.backward.thread_cols, 1,
                             info.backward.variant == FA_VARIANT_MMA};
            fa_attention_desc d = decode ? suite_desc(big.q.dtype, 1, 4, 1100, 4, 1, dim)
                                         : suite_desc(big.q.dtype, 1, 150, 170, 2, 1, dim);
            d.causal = big.causal;
            char name[96];
            snprintf(name, sizeof name, "%s%s d%d %s%dx%d/%dx%d s%d, %s%dx%d/%dx%d", keys[i], decode ? " decode" : "",
                     dim, f.mma ? "mma " : "", f.br, f.bc, f.tr, f.tc, f.split, b.mma ? "mma " : "", b.br, b.bc, b.tr,
                     b.tc);
            if (!fits_here(&d, &f, &b)) {
                /* PoCL (CI) holds every shape; a GPU with fewer work-items
                 * or less local memory than the described device cannot. */
                fprintf(stderr, "  %-34s does not fit this device: not run\n", name);
                continue;
            }
            suite_run_tiles(name, &d, &f, &b, !decode);
        }
    }
}

/* Shapes no kernel can run are refused with a status, not run. */
void suite_rejects_bad_tiles(void) {
    SUITE_REQUIRE();
    if (!g_backend->force_tiles) FA_SKIP("this backend's test cannot force tile shapes");
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 16, 16, 1, 1, 32);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(suite_context(), &d, &plan));
    if (!plan) return;
    const suite_tiles uneven = {16, 16, 3, 2, 1, 0};
    fa_status st = g_backend->force_tiles(plan, &uneven, NULL);
    CHECK_MSG(st != FA_SUCCESS && plan->impl == NULL, "br 16 with thread_rows 3 was accepted");
    const suite_tiles huge = {4096, 4096, 1, 1, 1, 0};
    st = g_backend->force_tiles(plan, &huge, NULL);
    CHECK_MSG(st != FA_SUCCESS && plan->impl == NULL, "a 4096 x 4096 work-group was accepted");
    const suite_tiles fine = {16, 16, 4, 4, 1, 0};
    CHECK_OK(g_backend->force_tiles(plan, &fine, &fine));
    fa_plan_destroy(plan);
}


/* Long sequences (N up to 16k) for GPU machines, where the fp64 reference
 * is the slow side: FA_TEST_LARGE=1 runs them; CI's CPU device skips. */
void suite_long_sequences(void) {
    SUITE_REQUIRE();
    const char *env = getenv("FA_TEST_LARGE");
    if (!env || strcmp(env, "1") != 0) FA_SKIP("set FA_TEST_LARGE=1 to run sequences up to 16k (GPU machines)");
    fa_attention_desc d = suite_desc(FA_DTYPE_F16, 1, 16384, 16384, 1, 1, 64);
    d.causal = 1;
    run("long 16k causal fp16 d64", &d, 1);
    d = suite_desc(FA_DTYPE_BF16, 1, 8192, 8192, 2, 1, 128);
    run("long 8k bf16 d128 mqa", &d, 1);
    d = suite_desc(FA_DTYPE_F32, 1, 4096, 4096, 2, 2, 128);
    d.window_left = 1024;
    d.window_right = 0;
    run("long 4k fp32 d128 window", &d, 1);
    d = suite_desc(FA_DTYPE_F16, 1, 16, 16384, 4, 1, 128);
    run("long decode 16x16k fp16 d128", &d, 0);
}

/* Windows at and past the sequence lengths, and at both ends of the int
 * range: any bound that cannot bind means unlimited, every negative one
 * too (include/flashattn.h). Each must give the reference's answer, forward
 * and backward, alone, with the causal mask and with varlen batches. */
void suite_extreme_windows(void) {
    SUITE_REQUIRE();
    const int sq = 70, sk = 90;
    const int w[][3] = {{-1, INT_MAX, 1},          {INT_MAX, INT_MIN, 0}, {INT_MIN, INT_MAX, 0},
                        {INT_MAX, INT_MAX, 1},     {INT_MAX - 1, 3, 0},  {5, INT_MAX - 1, 1},
                        {sk - 1, sq - 1, 0},       {sk - 2, sq - 2, 0},  {sk, sq, 1},
                        {INT_MIN, 0, 0},           {0, INT_MIN, 1}};
    static const int32_t cu_q[] = {0, 70, 103}, cu_k[] = {0, 41, 131};
    for (size_t i = 0; i < FA_ARRAY_SIZE(w); i++)
        for (int varlen = 0; varlen <= 1; varlen++) {
            fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, sq, sk, 2, 1, 32);
            d.window_left = w[i][0];
            d.window_right = w[i][1];
            d.causal = w[i][2];
            if (varlen) {
                d.cu_seqlens_q = cu_q;
                d.cu_seqlens_k = cu_k;
            }
            char name[96];
            snprintf(name, sizeof name, "window %d,%d%s%s", w[i][0], w[i][1], w[i][2] ? " causal" : "",
                     varlen ? " varlen" : "");
            run(name, &d, 1);
        }
}

/* Buffers and plans keep their context alive (include/flashattn.h): every
 * order of destroying the context, a plan and its buffers is safe, and a
 * plan whose context was destroyed still runs. Each order on a fresh
 * context of the backend. */
typedef struct lifetime_objects {
    fa_context ctx;
    fa_plan plan;
    fa_buffer buf[5]; /* q k v o lse */
} lifetime_objects;

static int lifetime_create(lifetime_objects *o) {
    memset(o, 0, sizeof *o);
    fa_status st = fa_context_create(g_backend->backend, -1, &o->ctx);
    CHECK_MSG(st == FA_SUCCESS, "fa_context_create: %s", fa_last_error());
    if (st != FA_SUCCESS) return 0;
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 8, 8, 1, 1, 8);
    CHECK_OK(fa_plan_create(o->ctx, &d, &o->plan));
    const size_t bytes[5] = {256, 256, 256, 256, 32};
    for (int i = 0; i < 5; i++) CHECK_OK(fa_buffer_alloc(o->ctx, bytes[i], &o->buf[i]));
    float host[64];
    for (int i = 0; i < 64; i++) host[i] = (float)(i % 7) * 0.25f - 0.5f;
    for (int i = 0; i < 5 && o->buf[i]; i++) CHECK_OK(fa_buffer_upload(o->buf[i], 0, host, i == 4 ? 32 : sizeof host));
    if (o->plan && o->buf[0] && o->buf[1] && o->buf[2] && o->buf[3] && o->buf[4]) return 1;
    for (int i = 0; i < 5; i++)
        if (o->buf[i]) fa_buffer_free(o->buf[i]);
    if (o->plan) fa_plan_destroy(o->plan);
    fa_context_destroy(o->ctx);
    return 0;
}

/* Destroys the context (0), the plan (1) and the buffers (2) in order;
 * while the plan and the buffers remain a forward pass still runs. */
static void lifetime_destroy(lifetime_objects *o, const int order[3]) {
    int ctx_gone = 0, plan_gone = 0, bufs_gone = 0;
    for (int step = 0; step < 3; step++) {
        if (order[step] == 0) {
            CHECK_OK(fa_context_destroy(o->ctx));
            ctx_gone = 1;
        } else if (order[step] == 1) {
            CHECK_OK(fa_plan_destroy(o->plan));
            plan_gone = 1;
        } else {
            for (int i = 0; i < 5; i++) CHECK_OK(fa_buffer_free(o->buf[i]));
            bufs_gone = 1;
        }
        if (!plan_gone && !bufs_gone) {
            CHECK_OK(fa_forward(o->plan, o->buf[0], o->buf[1], o->buf[2], o->buf[3], o->buf[4]));
            float out[64];
            CHECK_OK(fa_buffer_download(o->buf[3], 0, out, sizeof out));
            CHECK(isfinite(out[0]) && isfinite(out[63]));
        }
        if (!bufs_gone && ctx_gone) {
            size_t bytes = 0;
            CHECK_OK(fa_buffer_size(o->buf[0], &bytes));
            CHECK(bytes == 256);
        }
    }
}

void suite_destroy_in_any_order(void) {
    if (!g_backend->compiled) FA_SKIP("the backend is not built into this library");
    SUITE_REQUIRE();
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int i = 0; i < 6; i++) {
        lifetime_objects o;
        if (!lifetime_create(&o)) return;
        lifetime_destroy(&o, orders[i]);
    }
}

/* Block sizes at the end of the int range: one block covering every
 * position (ceil(seqlen / block) overflowed int in the backends), or one
 * side huge and the other small. */
void suite_huge_mask_blocks(void) {
    SUITE_REQUIRE();
    const int sizes[][2] = {{INT_MAX, INT_MAX}, {INT_MAX, 16}, {24, INT_MAX}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(sizes); i++) {
        fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 70, 90, 2, 1, 32);
        d.causal = (int)(i % 2);
        d.block_q = sizes[i][0];
        d.block_k = sizes[i][1];
        const int64_t rows = ((int64_t)d.seqlen_q + d.block_q - 1) / d.block_q;
        const int64_t cols = ((int64_t)d.seqlen_k + d.block_k - 1) / d.block_k;
        uint8_t *m = malloc((size_t)(rows * cols));
        CHECK(m != NULL);
        if (!m) return;
        for (int64_t b = 0; b < rows * cols; b++) m[b] = (uint8_t)(b % 3 != 1);
        d.block_mask = m;
        d.block_mask_bytes = (size_t)(rows * cols);
        char name[64];
        snprintf(name, sizeof name, "blocks %d x %d%s", sizes[i][0], sizes[i][1], d.causal ? " causal" : "");
        run(name, &d, 1);
        free(m);
    }
}

/* Build options from the environment may tune a kernel build but not
 * redefine the plan's macros (FLASHATTN_OPENCL_OPTIONS=-DHEAD_DIM=8 gave a
 * wrong answer): plan creation refuses them, naming the macro, and a
 * tuning option still builds kernels that give the reference's answer. */
void suite_env_build_options(void) {
    SUITE_REQUIRE();
    const char *var = g_backend->backend == FA_BACKEND_OPENCL ? "FLASHATTN_OPENCL_OPTIONS"
                      : g_backend->backend == FA_BACKEND_CUDA ? "FLASHATTN_CUDA_OPTIONS"
                                                              : NULL;
    if (!var) FA_SKIP("this backend takes no build options from the environment");
    const char *saved = getenv(var);
    char *restore = saved ? strdup(saved) : NULL;
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 40, 50, 2, 2, 64);
    const char *const refused[] = {"-DHEAD_DIM=8", "-D HEAD_DIM=8", "-UHEAD_DIM", "-DCAUSAL", "-DBR=4"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(refused); i++) {
        setenv(var, refused[i], 1);
        fa_plan plan = NULL;
        CHECK_STATUS(fa_plan_create(suite_context(), &d, &plan), FA_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(fa_last_error(), var) != NULL, "%s=%s: message \"%s\" names neither", var, refused[i],
                  fa_last_error());
        CHECK(plan == NULL);
        if (plan) fa_plan_destroy(plan);
    }
    /* A tuning option: OpenCL's unroll factor, an NVRTC flag. */
    setenv(var, g_backend->backend == FA_BACKEND_OPENCL ? "-DFA_STEP_UNROLL=4" : "-lineinfo", 1);
    run("env build options tune", &d, 1);
    if (restore) {
        setenv(var, restore, 1);
        free(restore);
    } else {
        unsetenv(var);
    }
}
