/* The attention suite's hooks for the OpenCL backend (opencl_suite.h). */
#include "opencl_suite.h"

#include "harness.h"
#include "plan.h"
#include "planner.h"

#include <stdlib.h>
#include <string.h>

/* Forced tiles run in the streaming kernels (g_stream), or in the kernels
 * an OpenCL plan with those tiles uses (stream_tiles); key splits always
 * run SPLITK. */
static int g_stream;
/* Stages of forced matrix-unit backward tiles (0: one). */
static int g_mma_bwd_stages;

void opencl_suite_stream(int on) { g_stream = on; }
void opencl_suite_mma_bwd_stages(int stages) { g_mma_bwd_stages = stages; }

int opencl_suite_emulating(void) {
    const char *env = getenv("FLASHATTN_OPENCL_MMA_EMULATE");
    return env && env[0] && strcmp(env, "off") != 0;
}

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_attention.h"
#include "backends/opencl/cl_mma.h"

/* The local memory the planner gives a plan's kernels: fa_plan_local_mem's
 * figure for the FMA kernels, planner_cl_mma.c's for the matrix-unit ones;
 * *extra receives what an emulated fragment layer may add (its scratch). */
static size_t planned_local(fa_plan plan, const fa_kernel_plan *kp, fa_pass pass, size_t *extra) {
    const fa_attention_desc *desc = &plan->desc;
    *extra = 0;
    if (kp->variant == FA_VARIANT_MMA) {
        const fa_device_desc *dev = &plan->ctx->info.desc;
        fa_cl_mma_geometry g;
        if (!fa_cl_mma_geometry_of(dev, desc, pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, kp->stages,
                                   &g))
            return 0;
        *extra = fa_cl_mma_extra_local(plan->ctx->impl, g.layout, g.warps > g.dq_warps ? g.warps : g.dq_warps);
        return g.local_mem;
    }
    fa_variant v = kp->variant == FA_VARIANT_SIMT_STREAM ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_SIMT;
    return fa_plan_local_mem(v, pass, desc, kp->br, kp->bc, 1);
}

/* Tiles whose SIMT kernels would need more local memory than an OpenCL GPU
 * offers (64 KiB: NVIDIA's OpenCL gives 48, AMD and Intel 64) can only be a
 * streaming plan there (the described nvidia-opencl's at head_dim 128, for
 * one), so they run in the streaming kernels, where their dK/dV
 * accumulators fit. */
#define OPENCL_GPU_LOCAL (64 * 1024)
static int stream_tiles(const suite_tiles *t, fa_pass pass, const fa_attention_desc *desc) {
    if (g_stream) return 1;
    if (t->br % t->tr || t->bc % t->tc) return 0;
    if (fa_plan_local_mem(FA_VARIANT_SIMT, pass, desc, t->br, t->bc, 1) <= OPENCL_GPU_LOCAL) return 0;
    const int ntr = t->br / t->tr;
    return pass == FA_PASS_FORWARD || 2 * t->tc * ((desc->head_dim + ntr - 1) / ntr) <= 64;
}

static void apply_tiles(fa_plan plan, fa_kernel_plan *kp, const suite_tiles *t, fa_pass pass) {
    kp->br = t->br;
    kp->bc = t->bc;
    kp->thread_rows = t->tr;
    kp->thread_cols = t->tc;
    kp->work_group_size = (t->br / t->tr) * (t->bc / t->tc);
    kp->split_k = t->split > 1 ? t->split : 1;
    kp->variant = t->mma                                ? FA_VARIANT_MMA
                  : t->split > 1                        ? FA_VARIANT_SPLITK
                  : stream_tiles(t, pass, &plan->desc) ? FA_VARIANT_SIMT_STREAM
                                                        : FA_VARIANT_SIMT;
    kp->stages = t->mma && pass == FA_PASS_BACKWARD && g_mma_bwd_stages > 1 ? g_mma_bwd_stages : 1;
    size_t extra;
    kp->local_mem_bytes = planned_local(plan, kp, pass, &extra);
}

static fa_status cl_force_tiles(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd) {
    fa_cl_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    if (fwd) apply_tiles(plan, &plan->info.forward, fwd, FA_PASS_FORWARD);
    if (bwd) apply_tiles(plan, &plan->info.backward, bwd, FA_PASS_BACKWARD);
    return fa_cl_plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

/* The kernels declare exactly the local memory the planner budgets
 * (fa_plan_local_mem): the forward kernel and the dK/dV kernel equal it,
 * no kernel of a pass exceeds it. A driver may add a few bytes of its own
 * (NVIDIA reports 4 more than a kernel declares). */
#define DRIVER_LOCAL_RESERVE 64
static int g_last_wgmma[2];
int opencl_suite_last_wgmma(fa_pass pass) { return g_last_wgmma[pass == FA_PASS_BACKWARD]; }

static void cl_check_plan(const char *name, fa_plan plan) {
    const fa_kernel_plan *kp[2] = {&plan->info.forward, &plan->info.backward};
    for (int pass = 0; pass < 2; pass++) {
        size_t got = 0, extra = 0;
        fa_status st = fa_cl_plan_kernel_local_mem(plan->impl, (fa_pass)pass, &got);
        size_t want = planned_local(plan, kp[pass], (fa_pass)pass, &extra);
        g_last_wgmma[pass] = pass == FA_PASS_BACKWARD ? fa_cl_plan_bwd_wgmma(plan->impl) : fa_cl_plan_fwd_wgmma(plan->impl);
        if (g_last_wgmma[pass]) extra += FA_CL_WGMMA_ALIGN_SLACK;
        CHECK_MSG(st == FA_SUCCESS && got >= want && got <= want + extra + DRIVER_LOCAL_RESERVE,
                  "%s: %s kernels use %zu bytes of local memory, the planner budgets %zu", name,
                  pass ? "backward" : "forward", got, want);
    }
}

/* A described device's matrix-unit tiles run here where it is an OpenCL
 * device of the layout family this context's matrix units (or their
 * emulation) take. */
static int cl_runs_mma(fa_context ctx, const fa_device_desc *dev) {
    const fa_mma_layout here = fa_cl_mma_layer(ctx->impl, NULL);
    return here != FA_MMA_LAYOUT_NONE && fa_mma_layout_of(dev) == here;
}

const suite_backend opencl_suite = {FA_BACKEND_OPENCL, "OpenCL", 1, cl_force_tiles, cl_check_plan, cl_runs_mma,
                                    SUITE_ALL_SCORE_OPTIONS};
#else
const suite_backend opencl_suite = {FA_BACKEND_OPENCL, "OpenCL", 0, NULL, NULL, NULL, 0};
#endif
