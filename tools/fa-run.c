/* fa-run: the main job. Runs fused attention forward and backward on a
 * device (the best one present unless told otherwise), times both passes,
 * and checks every output against the CPU reference. Exit status 0 only when
 * every output is within the dtype's tolerance. */
#include "cli.h"
#include "dtype.h"
#include "planner.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct host_tensor {
    void *data;
    size_t bytes;
    fa_buffer buf;
} host_tensor;

static int fail_at(const char *what) {
    fprintf(stderr, "fa-run: %s failed: %s\n", what, fa_last_error());
    return 1;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs a pass `repeats` times after one warm-up; median device time.
 * t: q k v o lse dout dq dk dv, then the bias (buf NULL without one). */
typedef fa_status (*pass_fn)(fa_plan plan, host_tensor *t);

static fa_status run_forward(fa_plan plan, host_tensor *t) {
    const fa_pass_args a = {.q = t[0].buf, .k = t[1].buf, .v = t[2].buf, .o = t[3].buf, .lse = t[4].buf,
                            .bias = t[9].buf};
    return fa_forward_ex(plan, &a);
}

static fa_status run_backward(fa_plan plan, host_tensor *t) {
    const fa_pass_args a = {.q = t[0].buf,    .k = t[1].buf,  .v = t[2].buf,  .o = t[3].buf,  .lse = t[4].buf,
                            .dout = t[5].buf, .dq = t[6].buf, .dk = t[7].buf, .dv = t[8].buf, .bias = t[9].buf};
    return fa_backward_ex(plan, &a);
}

static int time_pass(fa_plan plan, fa_context ctx, host_tensor *t, pass_fn fn, int repeats, double *median_ms) {
    double *times = malloc(((size_t)repeats + 1) * sizeof *times);
    if (!times) return fail_at("host allocation");
    for (int r = 0; r <= repeats; r++) {
        if (fn(plan, t) != FA_SUCCESS || fa_context_synchronize(ctx) != FA_SUCCESS) {
            free(times);
            return fail_at("pass");
        }
        if (fa_plan_last_time_ms(plan, &times[r]) != FA_SUCCESS) times[r] = NAN;
    }
    qsort(times + 1, (size_t)repeats, sizeof(double), compare_doubles); /* times[0] is the warm-up */
    *median_ms = times[1 + repeats / 2];
    free(times);
    return 0;
}

/* O's tolerance for inputs of dtype written in o_dtype. fp8 kernels round
 * the probabilities to e4m3 (3 significant bits), and O of random V
 * inherits their relative error, while the reference computes with exact
 * probabilities: an H100 ran 1.6e-2 to 2.4e-2 on these inputs. */
static double tolerance(fa_dtype dtype, fa_dtype o_dtype) {
    if (dtype == FA_DTYPE_FP8_E4M3) return 5e-2;
    return o_dtype == FA_DTYPE_F32 ? 1e-5 : o_dtype == FA_DTYPE_F16 ? 3e-3 : 2e-2;
}

/* An output against the reference: the relative error, and a pass where
 * it is within tol relative plus tol absolute (fa_test_within), so that a
 * reference of zeros (dQ and dK of one-token sequences) is not a failure;
 * NaN and infinite entries of the reference (L = -inf of masked rows) must
 * be matched exactly. */
static int report(const char *name, const void *got, const void *ref, fa_dtype dtype, int64_t count, double tol) {
    const fa_test_diff diff = fa_test_compare(got, ref, dtype, count);
    const double rel = diff.ref_norm > 0.0 ? diff.diff_norm / diff.ref_norm : diff.diff_norm > 0.0 ? INFINITY : 0.0;
    const double rms = diff.finite > 0 ? diff.diff_norm / sqrt((double)diff.finite) : 0.0;
    const int ok = fa_test_within(&diff, tol);
    printf("  %-3s relative error %.3e, absolute (rms) %.3e (limit %.0e each)%s  %s\n", name, rel, rms, tol,
           diff.mismatched ? " with non-finite mismatches" : "", ok ? "ok" : "FAIL");
    return ok;
}

int main(int argc, char **argv) {
    fa_cli cli;
    int rc = fa_cli_parse(&cli, argc, argv);
    if (rc != 0) {
        fa_cli_usage(argv[0], "fa-run:\n  --repeats N         timed repeats (default 10)\n"
                              "  --no-check          skip the comparison with the CPU reference\n");
        return rc > 0 ? 0 : 2;
    }
    fa_attention_desc *d = &cli.desc;
    fa_context ctx;
    if (fa_context_create(cli.backend, cli.device, &ctx) != FA_SUCCESS) return fail_at("fa_context_create");
    fa_device_info info;
    fa_context_get_info(ctx, &info);
    char problem[256];
    fa_cli_describe_problem(d, problem, sizeof problem);
    printf("flashattn %s\ndevice:\n", fa_version(NULL, NULL, NULL));
    fa_cli_print_device(&info);
    printf("problem: %s\n", problem);

    fa_plan plan;
    if (fa_plan_create(ctx, d, &plan) != FA_SUCCESS) return fail_at("fa_plan_create");
    fa_plan_info pinfo;
    fa_plan_get_info(plan, &pinfo);
    char text[4096];
    fa_plan_info_format(&pinfo, text, sizeof text);
    printf("plan:\n%s\n", text);

    /* q k v o lse dout dq dk dv */
    fa_dtype dt = d->q.dtype;
    /* fp8 inputs run the forward only, and write O in o's dtype. */
    const int fwd_only = dt == FA_DTYPE_FP8_E4M3;
    int64_t nq = fa_attention_total_q(d) * d->heads_q * d->head_dim;
    int64_t nk = fa_attention_total_k(d) * d->heads_kv * d->head_dim;
    int64_t nl = fa_attention_total_q(d) * d->heads_q;
    int64_t counts[9] = {nq, nk, nk, nq, nl, nq, nq, nk, nk};
    host_tensor t[10];
    memset(t, 0, sizeof t);
    fa_rng rng;
    fa_rng_seed(&rng, 20261121);
    if (d->bias_batch > 0) {
        /* The additive bias: random values over its span. */
        const int64_t n = fa_desc_bias_extent(d);
        t[9].bytes = (size_t)n * fa_dtype_size(d->bias.dtype);
        t[9].data = fa_test_random_tensor(&rng, d->bias.dtype, n);
        if (!t[9].data) return fail_at("host allocation");
        if (fa_buffer_alloc(ctx, t[9].bytes, &t[9].buf) != FA_SUCCESS) return fail_at("fa_buffer_alloc");
        if (fa_buffer_upload(t[9].buf, 0, t[9].data, t[9].bytes) != FA_SUCCESS) return fail_at("fa_buffer_upload");
    }
    for (int i = 0; i < 9; i++) {
        fa_dtype tdt = i == 4 ? FA_DTYPE_F32 : i == 3 || i == 5 ? d->o.dtype : dt;
        t[i].bytes = (size_t)counts[i] * fa_dtype_size(tdt);
        int is_input = i < 3 || i == 5;
        t[i].data = is_input ? fa_test_random_tensor(&rng, tdt, counts[i]) : malloc(t[i].bytes);
        if (!t[i].data) return fail_at("host allocation");
        if (!is_input) fa_test_poison(t[i].data, tdt, counts[i]);
        if (fa_buffer_alloc(ctx, t[i].bytes, &t[i].buf) != FA_SUCCESS) return fail_at("fa_buffer_alloc");
        if (fa_buffer_upload(t[i].buf, 0, t[i].data, t[i].bytes) != FA_SUCCESS) return fail_at("fa_buffer_upload");
    }

    double fwd_ms = NAN, bwd_ms = NAN;
    if (time_pass(plan, ctx, t, run_forward, cli.repeats, &fwd_ms)) return 1;
    if (!fwd_only && time_pass(plan, ctx, t, run_backward, cli.repeats, &bwd_ms)) return 1;
    double fwd_flops = fa_attention_flops(d, FA_PASS_FORWARD), bwd_flops = fa_attention_flops(d, FA_PASS_BACKWARD);
    printf("timing (median of %d after a warm-up):\n", cli.repeats);
    printf("  forward  %9.3f ms  %8.3f TFLOP/s  (predicted roofline %.3f ms)\n", fwd_ms, fwd_flops / fwd_ms * 1e-9,
           pinfo.forward.cost.roofline_ms);
    printf("  backward %9.3f ms  %8.3f TFLOP/s  (predicted roofline %.3f ms)\n", bwd_ms, bwd_flops / bwd_ms * 1e-9,
           pinfo.backward.cost.roofline_ms);

    int ok = 1;
    if (cli.check) {
        void *got[9], *ref[9];
        const int last = fwd_only ? 5 : 9;
        for (int i = 3; i < last; i++) {
            if (i == 5) continue;
            got[i] = malloc(t[i].bytes);
            ref[i] = malloc(t[i].bytes);
            if (!got[i] || !ref[i]) return fail_at("host allocation");
            if (fa_buffer_download(t[i].buf, 0, got[i], t[i].bytes) != FA_SUCCESS) return fail_at("download");
        }
        const fa_ref_dropout_origin origin = {0, 0};
        if (fa_ref_forward_at(d, origin, t[9].data, t[0].data, t[1].data, t[2].data, ref[3], ref[4]) != FA_SUCCESS)
            return fail_at("reference forward");
        /* The backward reference takes the device's O and L, as the kernels did. */
        if (!fwd_only && fa_ref_backward_at(d, origin, t[9].data, t[0].data, t[1].data, t[2].data, got[3], got[4],
                                            t[5].data, ref[6], ref[7], ref[8]) != FA_SUCCESS)
            return fail_at("reference backward");
        double tol = tolerance(dt, d->o.dtype);
        printf("check against the CPU reference (fp64):\n");
        static const char *const names[9] = {"q", "k", "v", "O", "L", "dO", "dQ", "dK", "dV"};
        for (int i = 3; i < last; i++) {
            if (i == 5) continue;
            const fa_dtype tdt = i == 4 ? FA_DTYPE_F32 : i == 3 ? d->o.dtype : dt;
            /* L: fp8 products may sum in less than fp32 (Hopper's e4m3 wgmma). */
            const double l_tol = dt == FA_DTYPE_FP8_E4M3 ? 1e-4 : 1e-5;
            ok &= report(names[i], got[i], ref[i], tdt, counts[i], i == 4 ? l_tol : tol);
            free(got[i]);
            free(ref[i]);
        }
        printf("%s\n", ok ? "PASS" : "FAIL");
    }
    for (int i = 0; i < 10; i++) {
        if (t[i].buf) fa_buffer_free(t[i].buf);
        free(t[i].data);
    }
    fa_plan_destroy(plan);
    fa_context_destroy(ctx);
    fa_cli_free(&cli);
    return ok ? 0 : 1;
}
