/* The attention suite (tests/attention_suite.c) on the OpenCL backend's
 * best device: PoCL in CI, NVIDIA's OpenCL on the GPU machine.
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"

#include "planner.h"

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_attention.h"

static void apply_tiles(fa_kernel_plan *kp, const suite_tiles *t, fa_pass pass, const fa_attention_desc *desc) {
    kp->br = t->br;
    kp->bc = t->bc;
    kp->thread_rows = t->tr;
    kp->thread_cols = t->tc;
    kp->work_group_size = (t->br / t->tr) * (t->bc / t->tc);
    kp->split_k = t->split > 1 ? t->split : 1;
    kp->variant = t->split > 1 ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
    kp->stages = 1;
    kp->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_SIMT, pass, desc, t->br, t->bc, 1);
}

static fa_status cl_force_tiles(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd) {
    fa_cl_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    if (fwd) apply_tiles(&plan->info.forward, fwd, FA_PASS_FORWARD, &plan->desc);
    if (bwd) apply_tiles(&plan->info.backward, bwd, FA_PASS_BACKWARD, &plan->desc);
    return fa_cl_plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

/* The kernels declare exactly the local memory the planner budgets
 * (fa_plan_local_mem): the forward kernel and the dK/dV kernel equal it,
 * no kernel of a pass exceeds it. A driver may add a few bytes of its own
 * (NVIDIA reports 4 more than a kernel declares). */
#define DRIVER_LOCAL_RESERVE 64
static void cl_check_plan(const char *name, fa_plan plan) {
    const fa_kernel_plan *kp[2] = {&plan->info.forward, &plan->info.backward};
    for (int pass = 0; pass < 2; pass++) {
        size_t got = 0;
        fa_status st = fa_cl_plan_kernel_local_mem(plan->impl, (fa_pass)pass, &got);
        size_t want = fa_plan_local_mem(FA_VARIANT_SIMT, (fa_pass)pass, &plan->desc, kp[pass]->br, kp[pass]->bc, 1);
        CHECK_MSG(st == FA_SUCCESS && got >= want && got <= want + DRIVER_LOCAL_RESERVE,
                  "%s: %s kernels use %zu bytes of local memory, the planner budgets %zu", name,
                  pass ? "backward" : "forward", got, want);
    }
}

static const suite_backend opencl = {FA_BACKEND_OPENCL, "OpenCL", 1, cl_force_tiles, cl_check_plan};
#else
static const suite_backend opencl = {FA_BACKEND_OPENCL, "OpenCL", 0, NULL, NULL};
#endif

#define OPENCL_CASE(name)                                                                  \
    do {                                                                                   \
        suite_use_backend(&opencl);                                                        \
        suite_##name();                                                                    \
    } while (0)

FA_TEST(dtypes) { OPENCL_CASE(dtypes); }
FA_TEST(head_dims) { OPENCL_CASE(head_dims); }
FA_TEST(causal) { OPENCL_CASE(causal); }
FA_TEST(sliding_window) { OPENCL_CASE(sliding_window); }
FA_TEST(block_sparse) { OPENCL_CASE(block_sparse); }
FA_TEST(block_sparse_skips_tiles) { OPENCL_CASE(block_sparse_skips_tiles); }
FA_TEST(dropout) { OPENCL_CASE(dropout); }
FA_TEST(dropout_mask_bits) { OPENCL_CASE(dropout_mask_bits); }
FA_TEST(gqa_mqa) { OPENCL_CASE(gqa_mqa); }
FA_TEST(varlen) { OPENCL_CASE(varlen); }
FA_TEST(decoding_splitk) { OPENCL_CASE(decoding_splitk); }
FA_TEST(lengths) { OPENCL_CASE(lengths); }
FA_TEST(strides_offsets) { OPENCL_CASE(strides_offsets); }
FA_TEST(deterministic_backward) { OPENCL_CASE(deterministic_backward); }
FA_TEST(described_devices) { OPENCL_CASE(described_devices); }
FA_TEST(rejects_bad_tiles) { OPENCL_CASE(rejects_bad_tiles); }
FA_TEST(long_sequences) { OPENCL_CASE(long_sequences); }

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences))
