/* Ring attention on every device backend present (fa-test-labels: device):
 * ranks as threads of this process over host memory (several ranks on one
 * device), and over NCCL with one GPU a rank where a process has two or
 * more CUDA devices, each against one context of the same backend on the
 * whole sequence. FA_TEST_LARGE=1 adds a multi-tile problem on the matrix
 * units (GPU machines). */
#include "dist_check.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int devices_of(fa_backend backend) {
    int n = 0, count = 0;
    fa_device_info info;
    if (fa_device_count(&count) != FA_SUCCESS) return 0;
    for (int i = 0; i < count; i++)
        if (fa_device_get_info(i, &info) == FA_SUCCESS && info.backend == backend) n++;
    return n;
}

static void expect_match(const char *what, const dist_case *c) {
    const dist_result r = dist_check_run(c, -1, NULL);
    const double tol = dist_check_tolerance(c->dtype);
    CHECK_MSG(r.ran, "%s: the one-context run failed", what);
    for (int k = 0; k < c->world; k++)
        CHECK_MSG(r.plan_status[k] == FA_SUCCESS && r.pass_status[k] == FA_SUCCESS, "%s: rank %d: %s / %s: %s", what,
                  k, fa_status_string(r.plan_status[k]), fa_status_string(r.pass_status[k]), r.plan_message[k]);
    CHECK_MSG(r.err_o <= tol && r.err_lse <= tol && r.lse_mismatch == 0 && r.err_dq <= tol && r.err_dk <= tol &&
                  r.err_dv <= tol,
              "%s: O %.3g L %.3g (%d mismatched) dQ %.3g dK %.3g dV %.3g, tolerance %.3g", what, r.err_o, r.err_lse,
              r.lse_mismatch, r.err_dq, r.err_dk, r.err_dv, tol);
    printf("%-8s %-6s %-40s world %d O %.2e L %.2e dQ %.2e dK %.2e dV %.2e\n", fa_backend_name(c->backend),
           c->nccl ? "nccl" : "thread", what, c->world, r.err_o, r.err_lse, r.err_dq, r.err_dk, r.err_dv);
}

/* The cases every backend runs, on the transport given. */
static void cases_on(fa_backend backend, int nccl, int world) {
    dist_case c = dist_case_default(backend, world, FA_CP_ZIGZAG);
    c.nccl = nccl;
    c.causal = 1;
    expect_match("causal fp32", &c);
    c.dtype = FA_DTYPE_BF16;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 64;
    expect_match("causal bf16 GQA d64", &c);
    c.dtype = FA_DTYPE_F16;
    c.causal = 0;
    c.layout = FA_CP_CONTIGUOUS;
    c.window_left = 9;
    c.window_right = 2;
    expect_match("window (9, 2) fp16", &c);
    c.window_left = c.window_right = -1;
    c.causal = 1;
    c.layout = FA_CP_ZIGZAG;
    c.block_q = 12;
    c.block_k = 6;
    expect_match("causal block mask 12x6 fp16", &c);
    static const int32_t cu[] = {0, 20, 21, 48};
    dist_case v = dist_case_default(backend, world, FA_CP_ZIGZAG);
    v.nccl = nccl;
    v.batch = 3;
    v.seqlen_q = v.seqlen_k = 27;
    v.cu_q = cu;
    v.causal = 1;
    v.dtype = FA_DTYPE_BF16;
    expect_match("varlen causal bf16", &v);
    const char *large = getenv("FA_TEST_LARGE");
    if (large && strcmp(large, "1") == 0) {
        dist_case g = dist_case_default(backend, world, FA_CP_ZIGZAG);
        g.nccl = nccl;
        g.batch = 1;
        g.seqlen_q = g.seqlen_k = 4096;
        g.heads_q = 8;
        g.heads_kv = 2;
        g.head_dim = 128;
        g.causal = 1;
        g.dtype = FA_DTYPE_BF16;
        expect_match("causal bf16 d128 4k tokens", &g);
        g.window_left = 700;
        g.dtype = FA_DTYPE_F16;
        expect_match("causal window 700 fp16 d128 4k tokens", &g);
    }
}

static void on_backend(fa_backend backend) {
    const int n = devices_of(backend);
    if (n == 0) FA_SKIP("no device of this backend");
    for (int world = 2; world <= 4; world += 2) cases_on(backend, 0, world);
    if (backend == FA_BACKEND_CUDA && n >= 2) cases_on(backend, 1, n < 4 ? n : 4);
    else if (backend == FA_BACKEND_CUDA) printf("NCCL cases not run: %d CUDA device (two or more needed)\n", n);
}

FA_TEST(opencl) { on_backend(FA_BACKEND_OPENCL); }
FA_TEST(cuda) { on_backend(FA_BACKEND_CUDA); }
FA_TEST(hip) { on_backend(FA_BACKEND_HIP); }

FA_TEST_MAIN(FA_CASE(opencl), FA_CASE(cuda), FA_CASE(hip))
