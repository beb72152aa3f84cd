/* The attention suite (tests/attention_suite.c) on the HIP backend's best
 * device: an AMD GPU, or an NVIDIA GPU through the HIP-on-CUDA mapping
 * (FA_HIP_NVIDIA, backends/hip_nvidia/). The same cases as the OpenCL
 * kernels' test, against the fp64 reference; skipped where no HIP device
 * exists.
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"

#include "planner.h"

#include <stdio.h>

#ifdef FA_WITH_HIP
#include "backends/hip/hip_runtime_internal.h"

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

static fa_status hip_force_tiles(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd) {
    fa_hip_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    if (fwd) apply_tiles(&plan->info.forward, fwd, FA_PASS_FORWARD, &plan->desc);
    if (bwd) apply_tiles(&plan->info.backward, bwd, FA_PASS_BACKWARD, &plan->desc);
    return fa_hip_plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

/* The kernels declare exactly the local memory the planner budgets
 * (fa_plan_local_mem): the largest kernel of each pass (forward, dK/dV)
 * equals it as the runtime reports it for the loaded code, give or take
 * the padding a compiler may put between tiles of odd sizes. Registers and
 * private (spilled) bytes per work-item are printed where a kernel spills:
 * the planner's largest work-groups leave few registers to each. */
#define TILE_PADDING 64
static void hip_check_plan(const char *name, fa_plan plan) {
    static int described;
    if (!described) {
        fa_device_info info;
        if (fa_context_get_info(plan->ctx, &info) == FA_SUCCESS)
            fprintf(stderr, "  HIP device: %s (%s, arch \"%s\"), wavefront %d, %zu bytes of local memory\n",
                    info.desc.name, info.desc.vendor, info.desc.arch, info.desc.simd_width,
                    info.desc.local_mem_bytes);
        described = 1;
    }
    const fa_kernel_plan *kp[2] = {&plan->info.forward, &plan->info.backward};
    for (int pass = 0; pass < 2; pass++) {
        fa_hip_kernel_usage u;
        fa_status st = fa_hip_plan_kernel_usage(plan->impl, (fa_pass)pass, &u);
        size_t want = fa_plan_local_mem(FA_VARIANT_SIMT, (fa_pass)pass, &plan->desc, kp[pass]->br, kp[pass]->bc, 1);
        CHECK_MSG(st == FA_SUCCESS && u.local_bytes >= want && u.local_bytes <= want + TILE_PADDING,
                  "%s: %s kernels use %zu bytes of local memory, the planner budgets %zu", name,
                  pass ? "backward" : "forward", u.local_bytes, want);
        if (st == FA_SUCCESS && u.private_bytes > 0)
            fprintf(stderr, "  %s: %s kernels: %d registers, %zu private bytes per work-item\n", name,
                    pass ? "backward" : "forward", u.registers, u.private_bytes);
    }
}

static const suite_backend hip = {FA_BACKEND_HIP, "HIP", 1, hip_force_tiles, hip_check_plan, NULL};
#else
static const suite_backend hip = {FA_BACKEND_HIP, "HIP", 0, NULL, NULL, NULL};
#endif

#define HIP_CASE(name)                                                                     \
    do {                                                                                   \
        suite_use_backend(&hip);                                                           \
        suite_##name();                                                                    \
    } while (0)

FA_TEST(dtypes) { HIP_CASE(dtypes); }
FA_TEST(head_dims) { HIP_CASE(head_dims); }
FA_TEST(causal) { HIP_CASE(causal); }
FA_TEST(sliding_window) { HIP_CASE(sliding_window); }
FA_TEST(block_sparse) { HIP_CASE(block_sparse); }
FA_TEST(block_sparse_skips_tiles) { HIP_CASE(block_sparse_skips_tiles); }
FA_TEST(dropout) { HIP_CASE(dropout); }
FA_TEST(dropout_mask_bits) { HIP_CASE(dropout_mask_bits); }
FA_TEST(gqa_mqa) { HIP_CASE(gqa_mqa); }
FA_TEST(varlen) { HIP_CASE(varlen); }
FA_TEST(decoding_splitk) { HIP_CASE(decoding_splitk); }
FA_TEST(lengths) { HIP_CASE(lengths); }
FA_TEST(strides_offsets) { HIP_CASE(strides_offsets); }
FA_TEST(deterministic_backward) { HIP_CASE(deterministic_backward); }
FA_TEST(described_devices) { HIP_CASE(described_devices); }
FA_TEST(rejects_bad_tiles) { HIP_CASE(rejects_bad_tiles); }
FA_TEST(long_sequences) { HIP_CASE(long_sequences); }
FA_TEST(extreme_windows) { HIP_CASE(extreme_windows); }
FA_TEST(destroy_in_any_order) { HIP_CASE(destroy_in_any_order); }
FA_TEST(huge_mask_blocks) { HIP_CASE(huge_mask_blocks); }
FA_TEST(env_build_options) { HIP_CASE(env_build_options); }

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences), FA_CASE(extreme_windows), FA_CASE(destroy_in_any_order),
             FA_CASE(huge_mask_blocks), FA_CASE(env_build_options))
