/* The attention suite (tests/attention_suite.c) on the OpenCL backend's
 * best device: PoCL in CI, NVIDIA's OpenCL on the GPU machine.
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"

#include "planner.h"

/* The kernels forced tiles run in: SIMT, or the streaming ones. Key splits
 * always run SPLITK (SIMT). */
static fa_variant g_forced = FA_VARIANT_SIMT;

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_attention.h"

/* The local memory fa_plan_local_mem gives a plan's kernels. */
static size_t planned_local(const fa_kernel_plan *kp, fa_pass pass, const fa_attention_desc *desc) {
    fa_variant v = kp->variant == FA_VARIANT_SIMT_STREAM ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_SIMT;
    return fa_plan_local_mem(v, pass, desc, kp->br, kp->bc, 1);
}

static void apply_tiles(fa_kernel_plan *kp, const suite_tiles *t, fa_pass pass, const fa_attention_desc *desc) {
    kp->br = t->br;
    kp->bc = t->bc;
    kp->thread_rows = t->tr;
    kp->thread_cols = t->tc;
    kp->work_group_size = (t->br / t->tr) * (t->bc / t->tc);
    kp->split_k = t->split > 1 ? t->split : 1;
    kp->variant = t->split > 1 ? FA_VARIANT_SPLITK : g_forced;
    kp->stages = 1;
    kp->local_mem_bytes = planned_local(kp, pass, desc);
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
        size_t want = planned_local(kp[pass], (fa_pass)pass, &plan->desc);
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

/* A case whose forced tiles run in the streaming kernels. */
#define STREAM_CASE(name)                                                                  \
    do {                                                                                   \
        suite_use_backend(&opencl);                                                        \
        g_forced = FA_VARIANT_SIMT_STREAM;                                                 \
        suite_##name();                                                                    \
        g_forced = FA_VARIANT_SIMT;                                                        \
    } while (0)

#ifdef FA_WITH_OPENCL
/* The planner's view of this device made NVIDIA's OpenCL's (the described
 * nvidia-opencl: 48 KiB of local memory, work-groups of up to 1024, SIMD
 * width 32) with this device's compute units, so that the suite's cases
 * run the tiles and kernels the planner picks for the GPU (on PoCL's two
 * compute units, the large tiles of long sequences). 0, with the reason in
 * why, where this device cannot hold them. */
static int as_nvidia_opencl(char *why, size_t size) {
    fa_context ctx = suite_context();
    const fa_described_device *nv = fa_described_device_find("nvidia-opencl");
    if (!ctx || !nv) {
        snprintf(why, size, "no OpenCL device");
        return 0;
    }
    fa_device_desc *dev = &ctx->info.desc;
    if (dev->local_mem_bytes < nv->desc.local_mem_bytes || dev->max_work_group_size < nv->desc.max_work_group_size) {
        snprintf(why, size, "this device (%zu bytes of local memory, work-groups <= %d) cannot run NVIDIA's tiles",
                 dev->local_mem_bytes, dev->max_work_group_size);
        return 0;
    }
    dev->local_mem_bytes = nv->desc.local_mem_bytes;
    dev->max_work_group_size = nv->desc.max_work_group_size;
    dev->simd_width = nv->desc.simd_width;
    return 1;
}
#else
static int as_nvidia_opencl(char *why, size_t size) {
    snprintf(why, size, "the OpenCL backend is not built into this library");
    return 0;
}
#endif

/* A case planned as on NVIDIA's OpenCL, forced tiles in the streaming
 * kernels. */
static char g_why[160];
#define NVIDIA_CASE(name)                                                                  \
    do {                                                                                   \
        suite_use_backend(&opencl);                                                        \
        if (!as_nvidia_opencl(g_why, sizeof g_why)) FA_SKIP(g_why);                        \
        STREAM_CASE(name);                                                                 \
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

/* The streaming kernels on every described device's tiles (the SIMT ones
 * run them in described_devices), and skipping masked tiles. */
FA_TEST(described_devices_stream) { STREAM_CASE(described_devices); }
FA_TEST(block_sparse_skips_tiles_stream) { STREAM_CASE(block_sparse_skips_tiles); }

/* Every option of the descriptor in the plans NVIDIA's OpenCL gets. */
FA_TEST(nvidia_dtypes) { NVIDIA_CASE(dtypes); }
FA_TEST(nvidia_head_dims) { NVIDIA_CASE(head_dims); }
FA_TEST(nvidia_masks) {
    NVIDIA_CASE(causal);
    NVIDIA_CASE(sliding_window);
    NVIDIA_CASE(block_sparse);
}
FA_TEST(nvidia_dropout_gqa_varlen) {
    NVIDIA_CASE(dropout);
    NVIDIA_CASE(gqa_mqa);
    NVIDIA_CASE(varlen);
}
FA_TEST(nvidia_lengths_strides) {
    NVIDIA_CASE(lengths);
    NVIDIA_CASE(strides_offsets);
}
FA_TEST(nvidia_deterministic_backward) { NVIDIA_CASE(deterministic_backward); }

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences), FA_CASE(described_devices_stream), FA_CASE(block_sparse_skips_tiles_stream),
             FA_CASE(nvidia_dtypes), FA_CASE(nvidia_head_dims), FA_CASE(nvidia_masks),
             FA_CASE(nvidia_dropout_gqa_varlen), FA_CASE(nvidia_lengths_strides), FA_CASE(nvidia_deterministic_backward))
