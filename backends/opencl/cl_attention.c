/* The attention half of the OpenCL backend: builds the kernels of
 * kernels_cl/ for a plan's tile shape and options, owns the plan's device
 * copies (sequence offsets, block mask, tile maps) and workspace, and
 * launches the passes. The tiling policy is the planner's; this file only
 * checks that a shape is one the kernels can run. */
#include "cl_attention.h"
#include "cl_args.h"
#include "cl_kvcache.h"
#include "cl_mma.h"
#include "cl_standard.h"

#include "desc.h"
#include "dtype.h"
#include "build_options.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "planner.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most fp32 accumulators one work-item may hold per output (the
 * planner's register budget; larger would spill to memory). */
#define FA_CL_MAX_ACCUMULATORS 64

typedef struct cl_pass_shape {
    int br, bc, tr, tc, wg;
    int stream;                /* the streaming kernels (FA_STREAM) */
    int mma;                   /* the matrix-unit kernels, with geometry g */
    fa_cl_mma_geometry g;
} cl_pass_shape;

/* Launches a pass times: the backward's row sums, packed K and V, dK/dV
 * and dQ take four. */
#define FA_CL_MAX_EVENTS 6

typedef struct fa_cl_plan {
    fa_cl_plan_kind kind;      /* FA_CL_PLAN_FUSED; first, see cl_backend.h */
    fa_cl_context *ctx;

    cl_pass_shape fwd_shape, bwd_shape;
    int num_splits;            /* forward key splits; 1: none */
    cl_program fwd_program;
    cl_kernel fwd_kernel, merge_kernel;
    cl_program bwd_program, dq_program; /* dq_program: the matrix-unit dQ kernel's own */
    cl_kernel dot_kernel, dkdv_kernel, dq_kernel; /* dq_kernel: fa_bwd_dq_convert with dq_atomic */
    cl_kernel pack_kernel;     /* fa_bwd_pack_kv where the backward's geometry packs K and V */
    int dq_wg;                 /* work-group of fa_bwd_dq */
    int dq_atomic;             /* streaming backward adding dQ with atomics */
    int fwd_wgmma, bwd_wgmma;  /* the matrix-unit passes built with FA_FWD_WGMMA, FA_BWD_WGMMA */

    cl_mem cu_q, cu_k;         /* varlen offsets */
    cl_mem block_mask;
    cl_mem fwd_tiles, bwd_tiles; /* block mask per (query tile, key tile) */
    int fwd_tile_cols, bwd_tile_cols;
    cl_mem part_o, part_l;     /* split-K partial results */
    cl_mem dvec;               /* backward: rowsum(dO * O) */
    cl_mem dq_acc;             /* backward with dq_atomic: fp32 dQ */
    cl_mem kpack;              /* backward with k_packed: K and V in fragment order */
    cl_mem dummy;              /* bound to pointer arguments a build ignores */

    cl_layout q, k, v, o;
    int block_cols;
    float scale_log2;          /* 1 with score options: fa_logit2 forms base-2 logits */
    float drop_scale;

    /* Score options (kernels_cl/common.h): the ALiBi slopes on the device
     * (heads_q floats), the bias layout (elements; broadcast dimensions
     * stride 0) and fa_logit2's factors. */
    cl_mem slopes;
    cl_layout bias;
    float score_in, score_out;

    char options[512];         /* build options shared by both passes */
    int nv_options;            /* the device has cl_nv_compiler_options */

    cl_event events[FA_CL_MAX_EVENTS];
    cl_kernel event_kernels[FA_CL_MAX_EVENTS]; /* what each event timed (FLASHATTN_OPENCL_KERNEL_TIMES) */
    int event_count;
} fa_cl_plan;


/* ------------------------------------------------------------------------ */
/* Plan preparation                                                          */

static cl_layout resolve_layout(const fa_attention_desc *d, fa_tensor_role role) {
    fa_layout r = fa_desc_layout(d, role);
    cl_layout l = {r.offset, r.stride_batch, r.stride_seq, r.stride_head};
    return l;
}

/* The shapes the kernels run: divisibility, work-group size, registers and
 * local memory. */
static fa_status check_shape(const fa_cl_context *ctx, const fa_attention_desc *d,
                             const fa_kernel_plan *kp, fa_pass which, cl_pass_shape *shape) {
    const char *pass = which == FA_PASS_BACKWARD ? "backward" : "forward";
    if (kp->br <= 0 || kp->bc <= 0 || kp->thread_rows <= 0 || kp->thread_cols <= 0)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: br %d, bc %d, thread_rows %d, thread_cols %d must be > 0",
                       pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols);
    memset(shape, 0, sizeof *shape);
    shape->br = kp->br;
    shape->bc = kp->bc;
    shape->tr = kp->thread_rows;
    shape->tc = kp->thread_cols;
    shape->wg = kp->work_group_size;
    if (kp->variant == FA_VARIANT_MMA) {
        shape->mma = 1;
        return fa_cl_mma_check(ctx, d, which, kp, &shape->g);
    }
    if (kp->br % kp->thread_rows || kp->bc % kp->thread_cols)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: br %d / thread_rows %d or bc %d / thread_cols %d is not whole",
                       pass, kp->br, kp->thread_rows, kp->bc, kp->thread_cols);
    int ntr = kp->br / kp->thread_rows, ntc = kp->bc / kp->thread_cols;
    if (kp->work_group_size != ntr * ntc)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: work_group_size %d is not (br / thread_rows) * (bc / thread_cols) = %d",
                       pass, kp->work_group_size, ntr * ntc);
    if (kp->work_group_size > ctx->info.desc.max_work_group_size)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: work-group of %d exceeds the device's %d", pass,
                       kp->work_group_size, ctx->info.desc.max_work_group_size);
    int dpt = (d->head_dim + ntc - 1) / ntc;
    if (kp->thread_rows * dpt > FA_CL_MAX_ACCUMULATORS)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: %d x %d accumulators per work-item exceed %d", pass,
                       kp->thread_rows, dpt, FA_CL_MAX_ACCUMULATORS);
    const int stream = kp->variant == FA_VARIANT_SIMT_STREAM;
    if (stream && which == FA_PASS_BACKWARD) {
        /* dK and dV: thread_cols keys x ceil(head_dim / (br / thread_rows)) each. */
        int kdpt = (d->head_dim + ntr - 1) / ntr;
        if (2 * kp->thread_cols * kdpt > FA_CL_MAX_ACCUMULATORS)
            return fa_fail(FA_ERR_INTERNAL, "%s plan: 2 x %d x %d dK/dV accumulators per work-item exceed %d", pass,
                           kp->thread_cols, kdpt, FA_CL_MAX_ACCUMULATORS);
    }
    if (stream && kp->split_k > 1)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: the streaming kernels do not split keys (split_k %d)", pass,
                       kp->split_k);
    size_t local = fa_plan_local_mem(stream ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_SIMT, which, d, kp->br, kp->bc, 1);
    if (local > ctx->info.desc.local_mem_bytes)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: %zu bytes of local memory exceed the device's %zu", pass,
                       local, ctx->info.desc.local_mem_bytes);
    shape->stream = stream;
    return FA_SUCCESS;
}

/* The block mask per (br x bc) tile (core/plan_data.h), on the device. */
static fa_status build_tile_map(fa_cl_plan *p, const fa_plan_s *plan, int br, int bc, cl_mem *out,
                                 int *cols_out) {
    uint8_t *map;
    size_t bytes;
    FA_CHECK(fa_tile_map_build(&plan->desc, plan->block_mask, br, bc, &map, &bytes, cols_out));
    fa_status st = fa_cl_create_plan_buffer(p->ctx, bytes, map, "the block-sparse tile map", out);
    free(map);
    return st;
}

/* Whether the device names an extension (a whole word of
 * CL_DEVICE_EXTENSIONS). */
static int device_has_extension(fa_cl_context *ctx, const char *name) {
    size_t size = 0;
    if (fa_cl.clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || size == 0) return 0;
    char *ext = malloc(size + 1);
    if (!ext) return 0;
    int found = 0;
    if (fa_cl.clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, size, ext, NULL) == CL_SUCCESS) {
        ext[size] = '\0';
        size_t len = strlen(name);
        for (const char *at = strstr(ext, name); at && !found; at = strstr(at + 1, name))
            found = (at == ext || at[-1] == ' ') && (at[len] == '\0' || at[len] == ' ');
    }
    free(ext);
    return found;
}

/* A work-group larger than 256 needs its registers to fit the
 * multiprocessor's 65536 (at most 255 a thread): with
 * cl_nv_compiler_options the budget is a build option, so a kernel that
 * would need more spills instead of failing to launch. (NVIDIA reports
 * CL_KERNEL_WORK_GROUP_SIZE = 256 for these kernels, yet runs 1024.) */
static void register_option(fa_cl_plan *p, int wg, char *out, size_t size) {
    out[0] = '\0';
    if (wg <= 256 || !p->nv_options) return;
    int regs = 65536 / wg / 8 * 8;
    if (regs < 255) snprintf(out, size, " -cl-nv-maxrregcount=%d", regs);
}

/* Every macro an OpenCL attention build may be given (kernels_cl/common.h,
 * mma_frag.h, mma_common.h) but the tuning ones (FA_STEP_UNROLL): the
 * environment's options may not set them. */
static const char *const cl_plan_macros[] = {
    "HEAD_DIM",      "BR",           "BC",           "TR",              "TC",              "DTYPE_F32",
    "DTYPE_F16",     "DTYPE_BF16",   "CAUSAL",       "WINDOW",          "BLOCK_MASK",      "DROPOUT",
    "VARLEN",        "FA_STREAM",    "FA_GPU",       "SPLITK",          "DQ_ATOMIC",       "FA_NV_PTX",
    "WARPS",         "QREG",         "FA_BWD_DQ",    "FA_MMA_EMULATE",  "FA_MMA_NVIDIA",   "FA_MMA_INTEL",
    "FA_MMA_AMD_MFMA", "FA_MMA_AMD_WMMA", "FA_MMA_AMD_MFMA16", "STAGES",       "VREG",          "QC",
    "KPACK",         "FA_FWD_WGMMA", "FA_BWD_WGMMA", "FA_NV_SM90A",
    "SOFTCAP",       "ALIBI",        "BIAS",         "BIAS_F32",        "FA_SCORE_OPTIONS", NULL};

static fa_status build_pass(fa_cl_plan *p, const cl_pass_shape *s, const char *extra,
                            const char *const *paths, int path_count, cl_program *program) {
    char options[1024], regs[48];
    register_option(p, s->wg, regs, sizeof regs);
    int n = snprintf(options, sizeof options, "-DBR=%d -DBC=%d -DTR=%d -DTC=%d %s%s%s%s", s->br, s->bc, s->tr,
                     s->tc, p->options, extra[0] ? " " : "", extra, regs);
    /* FLASHATTN_OPENCL_OPTIONS: build options appended to every attention
     * kernel's (a register cap to try, say: bench/opencl_tiles.sh). They are
     * part of the kernel cache's key like the others. */
    const char *env = getenv("FLASHATTN_OPENCL_OPTIONS");
    if (n >= 0 && (size_t)n < sizeof options) {
        FA_CHECK(fa_check_env_build_options("FLASHATTN_OPENCL_OPTIONS", env, options, cl_plan_macros));
        n += snprintf(options + n, sizeof options - (size_t)n, "%s%s", env && env[0] ? " " : "", env ? env : "");
    }
    if (n < 0 || (size_t)n >= sizeof options)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "kernel build options (FLASHATTN_OPENCL_OPTIONS included) do not fit in %zu bytes",
                       sizeof options);
    return fa_cl_build(p->ctx, paths, path_count, options, program);
}

/* The options of a matrix-unit pass of `warps` sub-groups: its layer, the
 * loop unrolling GPUs want, and what the caller adds (extra). */
static fa_status mma_options(fa_cl_plan *p, fa_mma_layout layout, int warps, const char *extra, char *out,
                             size_t size) {
    int emulated = 0;
    (void)fa_cl_mma_layer(p->ctx, &emulated);
    const int n = snprintf(out, size, "%s%s", extra, p->ctx->info.desc.type != FA_DEVICE_CPU ? " -DFA_GPU" : "");
    if (n < 0 || (size_t)n >= size) return fa_fail(FA_ERR_INTERNAL, "build options do not fit in %zu bytes", size);
    return fa_cl_mma_options(layout, emulated, warps, out, size);
}

/* A matrix-unit pass built with opts, and with Hopper's warpgroup products
 * where wgmma asks for them (macro: the kernel's switch, which the build
 * gets with FA_NV_SM90A); where the driver does not take the sm_90a route
 * (cl_build.c: FA_ERR_UNSUPPORTED), the same tiles on mma.sync. *taken:
 * whether the products are in the program. */
static fa_status build_mma_pass(fa_cl_plan *p, const cl_pass_shape *s, fa_mma_layout layout, const char *opts,
                                int wgmma, const char *macro, const char *const *paths, int n, cl_program *program,
                                int *taken) {
    fa_status st = FA_SUCCESS;
    for (*taken = wgmma;; *taken = 0) {
        char pass_opts[224], extra[256];
        const int len = snprintf(pass_opts, sizeof pass_opts, "%s%s%s%s", opts, *taken ? " -D" : "",
                                 *taken ? macro : "", *taken ? " -DFA_NV_SM90A" : "");
        if (len < 0 || (size_t)len >= sizeof pass_opts)
            return fa_fail(FA_ERR_INTERNAL, "build options do not fit in %zu bytes", sizeof pass_opts);
        FA_CHECK(mma_options(p, layout, s->g.warps, pass_opts, extra, sizeof extra));
        st = build_pass(p, s, extra, paths, n, program);
        if (st != FA_ERR_UNSUPPORTED || !*taken) break;
    }
    if (st == FA_SUCCESS && wgmma && !*taken) fa_clear_error();
    return st;
}

static fa_status prepare_forward_mma(fa_cl_plan *p) {
    static const char *const plain[] = {"kernels_cl/fwd_mma.cl"};
    static const char *const split[] = {"kernels_cl/fwd_mma.cl", "kernels_cl/splitk.cl"};
    const char *paths[8];
    const int n = fa_cl_mma_sources(p->fwd_shape.g.layout, p->num_splits > 1 ? split : plain,
                                    p->num_splits > 1 ? 2 : 1, paths, 8);
    if (n == 0) return fa_fail(FA_ERR_INTERNAL, "no matrix-unit sources for %s", p->ctx->info.desc.name);
    /* Hopper's warpgroup products on the 64 x 64 tile of four sub-groups
     * (fwd_mma.cl, FA_FWD_WGMMA), with the same fallback as the backward's. */
    int emulated = 0;
    (void)fa_cl_mma_layer(p->ctx, &emulated);
    const fa_cl_mma_geometry *g = &p->fwd_shape.g;
    const int wgmma = g->layout == FA_MMA_LAYOUT_NVIDIA && !emulated && p->num_splits == 1 &&
                      strcmp(p->ctx->info.desc.arch, "sm_90") == 0 && (g->d_pad == 64 || g->d_pad == 128) &&
                      g->warps == 4 && p->fwd_shape.br == 64 && p->fwd_shape.bc == 64;
    FA_CHECK(build_mma_pass(p, &p->fwd_shape, g->layout,
                            p->num_splits > 1 ? (g->q_regs ? "-DSPLITK -DQREG" : "-DSPLITK") : (g->q_regs ? "-DQREG" : ""),
                            wgmma, "FA_FWD_WGMMA", paths, n, &p->fwd_program, &p->fwd_wgmma));
    if (p->num_splits > 1) FA_CHECK(fa_cl_create_kernel(p->fwd_program, "fa_splitk_merge", &p->merge_kernel));
    return fa_cl_create_kernel(p->fwd_program, "fa_forward", &p->fwd_kernel);
}

static fa_status prepare_forward(fa_cl_plan *p) {
    static const char *const plain[] = {"kernels_cl/common.h", "kernels_cl/fwd.cl"};
    static const char *const split[] = {"kernels_cl/common.h", "kernels_cl/fwd.cl", "kernels_cl/splitk.cl"};
    if (p->fwd_shape.mma) return prepare_forward_mma(p);
    if (p->num_splits > 1) {
        FA_CHECK(build_pass(p, &p->fwd_shape, "-DSPLITK", split, 3, &p->fwd_program));
        FA_CHECK(fa_cl_create_kernel(p->fwd_program, "fa_splitk_merge", &p->merge_kernel));
    } else {
        FA_CHECK(build_pass(p, &p->fwd_shape, p->fwd_shape.stream ? "-DFA_STREAM" : "", plain, 2, &p->fwd_program));
    }
    return fa_cl_create_kernel(p->fwd_program, "fa_forward", &p->fwd_kernel);
}

/* The matrix-unit backward: the dK/dV program (with fa_bwd_dot, and
 * fa_bwd_dq_convert where dQ is added with atomics), and in deterministic
 * mode the dQ program, whose work-group is one strip of queries a
 * sub-group. */
static fa_status build_backward_mma(fa_cl_plan *p) {
    static const char *const files[] = {"kernels_cl/bwd_common.cl", "kernels_cl/bwd_mma.cl"};
    const char *paths[8];
    const fa_mma_layout layout = p->bwd_shape.g.layout;
    const int n = fa_cl_mma_sources(layout, files, 2, paths, 8);
    if (n == 0) return fa_fail(FA_ERR_INTERNAL, "no matrix-unit sources for %s", p->ctx->info.desc.name);
    int emulated = 0;
    (void)fa_cl_mma_layer(p->ctx, &emulated);
    /* The hardware's float add where the layer is NVIDIA's own. */
    const int nv_add = layout == FA_MMA_LAYOUT_NVIDIA && !emulated;
    /* dQ two floats a reduction from sm_90 (PTX 8.1): on an H100 the
     * backward ran 10-30% faster with it (bench/results/h100.md). */
    const char *arch = p->ctx->info.desc.arch;
    const int nv_red_v2 = nv_add && strncmp(arch, "sm_", 3) == 0 && atoi(arch + 3) >= 90;
    /* Two stages pipeline the query tiles (and may hold V in registers:
     * planner_cl_mma.c's geometry says which). */
    char pass_opts[192];
    char chunk[48] = "";
    if (p->bwd_shape.g.q_chunk > 0 && p->bwd_shape.g.q_chunk < p->bwd_shape.br)
        snprintf(chunk, sizeof chunk, " -DQC=%d", p->bwd_shape.g.q_chunk);
    else if (p->bwd_shape.g.dq_unit > 0 && p->dq_atomic)
        snprintf(chunk, sizeof chunk, " -DDQ_UNIT=%d", p->bwd_shape.g.dq_unit);
    /* Hopper's warpgroup products for the head_dim 64 and 128 tiles
     * (bwd_mma.cl, FA_BWD_WGMMA, which leaves them aside on any other
     * build; sm_90 alone: later architectures have no wgmma). */
    const fa_cl_mma_geometry *g = &p->bwd_shape.g;
    const int wgmma = nv_add && p->dq_atomic && strcmp(arch, "sm_90") == 0 && (g->d_pad == 64 || g->d_pad == 128) && g->warps == 4 &&
                      g->strips == 1 && p->bwd_shape.br == 32 && p->bwd_shape.bc == 64 && g->v_regs && !g->k_packed &&
                      g->q_chunk == p->bwd_shape.br;
    snprintf(pass_opts, sizeof pass_opts, "%s%s%s%s%s%s", !p->dq_atomic ? "" : nv_add ? "-DDQ_ATOMIC -DFA_NV_PTX" : "-DDQ_ATOMIC",
             p->dq_atomic && nv_red_v2 ? " -DFA_RED_V2" : "", p->bwd_shape.g.stages > 1 ? " -DSTAGES=2" : "",
             p->bwd_shape.g.v_regs ? " -DVREG" : "", p->bwd_shape.g.k_packed ? " -DKPACK" : "", chunk);
    FA_CHECK(build_mma_pass(p, &p->bwd_shape, layout, pass_opts, wgmma, "FA_BWD_WGMMA", paths, n, &p->bwd_program,
                            &p->bwd_wgmma));
    char extra[256];
    if (p->dq_atomic) return FA_SUCCESS;
    const fa_mma_layout_info *l = fa_mma_layout_get(layout);
    cl_pass_shape dq = p->bwd_shape;
    dq.tr = l->c_rows;
    dq.tc = dq.bc * (l->c_elems / l->c_rows) / l->n;
    dq.wg = p->dq_wg;
    FA_CHECK(mma_options(p, layout, p->bwd_shape.g.dq_warps, "-DFA_BWD_DQ", extra, sizeof extra));
    return build_pass(p, &dq, extra, paths, n, &p->dq_program);
}

static fa_status prepare_backward(fa_cl_plan *p) {
    static const char *const paths[] = {"kernels_cl/common.h", "kernels_cl/bwd_common.cl", "kernels_cl/bwd.cl"};
    if (p->bwd_program) return FA_SUCCESS;
    const char *options = !p->bwd_shape.stream ? ""
                          : !p->dq_atomic      ? "-DFA_STREAM"
                          : p->nv_options      ? "-DFA_STREAM -DDQ_ATOMIC -DFA_NV_PTX"
                                               : "-DFA_STREAM -DDQ_ATOMIC";
    fa_status st = p->bwd_shape.mma ? build_backward_mma(p) : build_pass(p, &p->bwd_shape, options, paths, 3, &p->bwd_program);
    if (st == FA_ERR_COMPILE && p->dq_atomic && p->nv_options && !p->bwd_shape.mma) {
        /* A compiler that takes NVIDIA's options but not the inline PTX
         * float add gets the compare-and-swap loop instead. */
        st = build_pass(p, &p->bwd_shape, "-DFA_STREAM -DDQ_ATOMIC", paths, 3, &p->bwd_program);
        if (st == FA_SUCCESS) fa_clear_error();
    }
    if (st == FA_SUCCESS) st = fa_cl_create_kernel(p->bwd_program, "fa_bwd_dot", &p->dot_kernel);
    if (st == FA_SUCCESS) st = fa_cl_create_kernel(p->bwd_program, "fa_bwd_dkdv", &p->dkdv_kernel);
    if (st == FA_SUCCESS && p->bwd_shape.mma && p->bwd_shape.g.k_packed)
        st = fa_cl_create_kernel(p->bwd_program, "fa_bwd_pack_kv", &p->pack_kernel);
    if (st == FA_SUCCESS)
        st = fa_cl_create_kernel(p->dq_program ? p->dq_program : p->bwd_program,
                                 p->dq_atomic ? "fa_bwd_dq_convert" : "fa_bwd_dq", &p->dq_kernel);
    if (st != FA_SUCCESS) {
        /* Leave no half-built pass behind: the next call starts over. */
        if (p->dot_kernel) fa_cl.clReleaseKernel(p->dot_kernel);
        if (p->dkdv_kernel) fa_cl.clReleaseKernel(p->dkdv_kernel);
        if (p->dq_kernel) fa_cl.clReleaseKernel(p->dq_kernel);
        if (p->pack_kernel) fa_cl.clReleaseKernel(p->pack_kernel);
        if (p->bwd_program) fa_cl.clReleaseProgram(p->bwd_program);
        if (p->dq_program) fa_cl.clReleaseProgram(p->dq_program);
        p->dot_kernel = p->dkdv_kernel = p->dq_kernel = p->pack_kernel = NULL;
        p->bwd_program = p->dq_program = NULL;
    }
    return st;
}

static void release_events(fa_cl_plan *p) {
    for (int i = 0; i < p->event_count; i++)
        if (p->events[i]) fa_cl.clReleaseEvent(p->events[i]);
    p->event_count = 0;
}

void fa_cl_plan_release(void *ctx, void *plan_impl) {
    (void)ctx;
    if (fa_cl_standard_owns(plan_impl)) {
        fa_cl_standard_release(plan_impl);
        return;
    }
    if (fa_cl_kvcache_owns(plan_impl)) {
        fa_cl_kvcache_release(plan_impl);
        return;
    }
    fa_cl_plan *p = plan_impl;
    if (!p) return;
    release_events(p);
    cl_kernel kernels[] = {p->fwd_kernel, p->merge_kernel, p->dot_kernel, p->dkdv_kernel, p->dq_kernel, p->pack_kernel};
    for (size_t i = 0; i < FA_ARRAY_SIZE(kernels); i++)
        if (kernels[i]) fa_cl.clReleaseKernel(kernels[i]);
    if (p->fwd_program) fa_cl.clReleaseProgram(p->fwd_program);
    if (p->bwd_program) fa_cl.clReleaseProgram(p->bwd_program);
    if (p->dq_program) fa_cl.clReleaseProgram(p->dq_program);
    cl_mem mems[] = {p->cu_q, p->cu_k, p->block_mask, p->fwd_tiles, p->bwd_tiles,
                     p->part_o, p->part_l, p->dvec, p->dq_acc, p->kpack, p->slopes, p->dummy};
    for (size_t i = 0; i < FA_ARRAY_SIZE(mems); i++)
        if (mems[i]) fa_cl.clReleaseMemObject(mems[i]);
    free(p);
}

fa_status fa_cl_plan_prepare(void *ctx_handle, const fa_plan_s *plan, void **plan_impl) {
    if (!plan_impl) return fa_fail(FA_ERR_NULL_POINTER, "plan_impl is NULL");
    *plan_impl = NULL;
    fa_cl_context *ctx = ctx_handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    /* KV-cache steps have kernels of their own (cl_kvcache.c). */
    if (plan->desc.kv_cache) return fa_cl_kvcache_prepare(ctx, plan, plan_impl);
    const fa_attention_desc *d = &plan->desc;
    const fa_plan_info *info = &plan->info;

    if (d->algorithm == FA_ALGO_STANDARD) {
        /* Unfused attention has no score options (nor has the reference's). */
        FA_CHECK(fa_refuse_score_options(d, "OpenCL (standard algorithm)"));
        return fa_cl_standard_prepare(ctx, plan, plan_impl);
    }
    if (info->algorithm != FA_ALGO_FUSED || d->algorithm != FA_ALGO_FUSED)
        return fa_fail(FA_ERR_UNSUPPORTED, "the OpenCL attention kernels run only FA_ALGO_FUSED");
    if (info->forward.variant != FA_VARIANT_SIMT && info->forward.variant != FA_VARIANT_SPLITK &&
        info->forward.variant != FA_VARIANT_SIMT_STREAM && info->forward.variant != FA_VARIANT_MMA)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "forward variant %s (%d) has no OpenCL kernel (SIMT, streaming SIMT, SPLITK and MMA do)",
                       fa_variant_name(info->forward.variant), (int)info->forward.variant);
    if (info->backward.variant != FA_VARIANT_SIMT && info->backward.variant != FA_VARIANT_SIMT_STREAM &&
        info->backward.variant != FA_VARIANT_MMA)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "backward variant %s (%d) has no OpenCL kernel (SIMT, streaming SIMT and MMA do)",
                       fa_variant_name(info->backward.variant), (int)info->backward.variant);
    if (d->head_dim % 8 || d->head_dim < 8 || d->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not a multiple of 8 in [8, 256]", d->head_dim);
    if (d->q.dtype != d->k.dtype || d->q.dtype != d->v.dtype || d->q.dtype != d->o.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "the OpenCL kernels need q, k, v and o of one dtype");

    fa_cl_plan *p = calloc(1, sizeof *p);
    if (p) p->kind = FA_CL_PLAN_FUSED;
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for an OpenCL plan");
    p->ctx = ctx;
    fa_status st = check_shape(ctx, d, &info->forward, FA_PASS_FORWARD, &p->fwd_shape);
    if (st == FA_SUCCESS) st = check_shape(ctx, d, &info->backward, FA_PASS_BACKWARD, &p->bwd_shape);
    if (st != FA_SUCCESS) {
        free(p);
        return st;
    }
    p->num_splits = (info->forward.variant == FA_VARIANT_SPLITK || info->forward.variant == FA_VARIANT_MMA) &&
                            info->forward.split_k > 1
                        ? info->forward.split_k
                        : 1;
    /* Deterministic mode keeps dQ's sums in a fixed order: a kernel of its
     * own instead of atomics. */
    p->dq_atomic = (p->bwd_shape.stream || p->bwd_shape.mma) && !d->deterministic;
    p->dq_wg = p->bwd_shape.mma ? p->bwd_shape.g.dq_warps * fa_mma_layout_get(p->bwd_shape.g.layout)->sub_group
                                : p->bwd_shape.wg;

    p->q = resolve_layout(d, FA_TENSOR_Q);
    p->k = resolve_layout(d, FA_TENSOR_K);
    p->v = resolve_layout(d, FA_TENSOR_V);
    p->o = resolve_layout(d, FA_TENSOR_O);
    const double log2e = 1.4426950408889634;
    const int softcap = d->softcap > 0.0f, alibi = d->alibi_slopes != NULL, bias = d->bias_batch > 0;
    const int score_options = softcap || alibi || bias;
    p->scale_log2 = score_options ? 1.0f : (float)((double)plan->scale * log2e);
    p->score_in = softcap ? (float)((double)plan->scale / (double)d->softcap) : 0.0f;
    p->score_out = (float)((softcap ? (double)d->softcap : (double)plan->scale) * log2e);
    if (bias) {
        fa_dim dims[4];
        fa_desc_bias_dims(d, dims);
        p->bias.offset = d->bias.offset;
        p->bias.stride_batch = d->bias_batch == 1 ? 0 : dims[3].stride;
        p->bias.stride_head = d->bias_heads == 1 ? 0 : dims[2].stride;
        p->bias.stride_seq = dims[1].stride;
    }
    int dropout = d->dropout_p > 0.0f;
    p->drop_scale = dropout ? (float)(1.0 / (1.0 - (double)d->dropout_p)) : 1.0f;
    int window = fa_desc_has_window(d);
    int varlen = plan->cu_seqlens_q != NULL;
    int blocks = plan->block_mask != NULL;
    /* The streaming kernels' loop unrolling and load order for GPUs
     * (FA_GPU, kernels_cl/common.h). */
    int gpu = ctx->info.desc.type != FA_DEVICE_CPU &&
              (info->forward.variant == FA_VARIANT_SIMT_STREAM || info->backward.variant == FA_VARIANT_SIMT_STREAM);
    snprintf(p->options, sizeof p->options, "-DHEAD_DIM=%d %s%s%s%s%s%s%s%s%s%s%s", d->head_dim,
             fa_dtype_build_option(d->q.dtype), d->causal ? " -DCAUSAL" : "", window ? " -DWINDOW" : "",
             blocks ? " -DBLOCK_MASK" : "", dropout ? " -DDROPOUT" : "", varlen ? " -DVARLEN" : "",
             gpu ? " -DFA_GPU" : "", softcap ? " -DSOFTCAP" : "", alibi ? " -DALIBI" : "", bias ? " -DBIAS" : "",
             bias && d->bias.dtype == FA_DTYPE_F32 && d->q.dtype != FA_DTYPE_F32 ? " -DBIAS_F32" : "");

    p->nv_options = device_has_extension(ctx, "cl_nv_compiler_options");
    st = fa_cl_create_plan_buffer(ctx, 16, NULL, "a placeholder buffer", &p->dummy);
    if (st == FA_SUCCESS && varlen) {
        size_t bytes = ((size_t)d->batch + 1) * sizeof(int32_t);
        st = fa_cl_create_plan_buffer(ctx, bytes, plan->cu_seqlens_q, "cu_seqlens_q", &p->cu_q);
        if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, plan->cu_seqlens_k, "cu_seqlens_k", &p->cu_k);
    }
    if (st == FA_SUCCESS && alibi)
        st = fa_cl_create_plan_buffer(ctx, (size_t)d->heads_q * sizeof(float), plan->alibi_slopes,
                                      "the ALiBi slopes", &p->slopes);
    if (st == FA_SUCCESS && blocks) {
        p->block_cols = fa_block_cols(d);
        st = fa_cl_create_plan_buffer(ctx, d->block_mask_bytes, plan->block_mask, "the block mask", &p->block_mask);
        if (st == FA_SUCCESS)
            st = build_tile_map(p, plan, p->fwd_shape.br, p->fwd_shape.bc, &p->fwd_tiles, &p->fwd_tile_cols);
        if (st == FA_SUCCESS)
            st = build_tile_map(p, plan, p->bwd_shape.br, p->bwd_shape.bc, &p->bwd_tiles, &p->bwd_tile_cols);
    }
    /* Rows of L: heads_q x total_q. */
    const size_t heads = (size_t)d->heads_q, tokens = (size_t)plan->total_q, dim = (size_t)d->head_dim;
    size_t bytes = 0;
    if (st == FA_SUCCESS && p->num_splits > 1) {
        st = fa_workspace_bytes("split-K partial outputs",
                                (size_t[]){(size_t)p->num_splits, heads, tokens, dim, sizeof(float)}, 5, &bytes);
        if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "split-K partial outputs", &p->part_o);
        if (st == FA_SUCCESS)
            st = fa_workspace_bytes("split-K partial log-sum-exps",
                                    (size_t[]){(size_t)p->num_splits, heads, tokens, sizeof(float)}, 4, &bytes);
        if (st == FA_SUCCESS)
            st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "split-K partial log-sum-exps", &p->part_l);
    }
    if (st == FA_SUCCESS) st = fa_workspace_bytes("the backward row sums",
                                                  (size_t[]){heads, tokens, sizeof(float)}, 3, &bytes);
    if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "the backward row sums", &p->dvec);
    if (st == FA_SUCCESS && p->dq_atomic) {
        st = fa_workspace_bytes("the fp32 dQ accumulator", (size_t[]){heads, tokens, dim, sizeof(float)}, 4, &bytes);
        if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "the fp32 dQ accumulator", &p->dq_acc);
    }
    if (st == FA_SUCCESS && p->bwd_shape.mma && p->bwd_shape.g.k_packed) {
        st = fa_cl_mma_packed_k_bytes(&p->bwd_shape.g, d, p->bwd_shape.bc, plan->total_k, &bytes);
        if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "the packed K and V of the backward", &p->kpack);
    }
    if (st == FA_SUCCESS) st = prepare_forward(p);
    if (st == FA_SUCCESS) st = prepare_backward(p);
    if (st != FA_SUCCESS) {
        fa_cl_plan_release(ctx, p);
        return st;
    }
    *plan_impl = p;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                    */

static cl_mem or_dummy(const fa_cl_plan *p, cl_mem m) { return m ? m : p->dummy; }

/* The arguments fa_forward and the backward kernels share after their
 * tensors (sizes, masks, dropout), in the kernels' order. */
static void mask_args(cl_args *a, const fa_cl_plan *p, const fa_plan_s *plan, cl_mem tiles, int tile_cols) {
    const fa_attention_desc *d = &plan->desc;
    arg_mem(a, or_dummy(p, p->cu_q));
    arg_mem(a, or_dummy(p, p->cu_k));
    arg_int(a, d->window_left);
    arg_int(a, d->window_right);
    arg_mem(a, or_dummy(p, p->block_mask));
    arg_int(a, d->block_mask ? d->block_q : 1);
    arg_int(a, d->block_mask ? d->block_k : 1);
    arg_int(a, p->block_cols);
    arg_mem(a, or_dummy(p, tiles));
    arg_int(a, tile_cols);
    arg_uint(a, plan->dropout_key.key0);
    arg_uint(a, plan->dropout_key.key1);
    arg_uint(a, plan->dropout_key.offset_lo);
    arg_uint(a, plan->dropout_threshold);
    arg_float(a, p->drop_scale);
    /* The origin is read at every pass: a ring sets it after the plan is
     * prepared (fa_plan_set_dropout_origin). */
    arg_uint(a, (cl_uint)plan->drop_row0);
    arg_uint(a, (cl_uint)plan->drop_col0);
}

/* The score options' arguments (FA_SCORE_PARAMS in kernels_cl/common.h),
 * last in the forward and backward kernels'; bias: the pass's buffer, NULL
 * without one. */
static void score_args(cl_args *a, const fa_cl_plan *p, void *bias) {
    arg_mem(a, bias ? mem_of(bias) : p->dummy);
    arg_long(a, p->bias.offset);
    arg_long(a, p->bias.stride_batch);
    arg_long(a, p->bias.stride_head);
    arg_long(a, p->bias.stride_seq);
    arg_mem(a, or_dummy(p, p->slopes));
    arg_float(a, p->score_in);
    arg_float(a, p->score_out);
}

static fa_status launch(fa_cl_plan *p, cl_kernel kernel, cl_uint dims, const size_t *global,
                        const size_t *local) {
    cl_event *ev = p->event_count < FA_CL_MAX_EVENTS ? &p->events[p->event_count] : NULL;
    fa_status st = fa_cl_launch(p->ctx, kernel, dims, global, local, ev);
    if (st == FA_SUCCESS && ev && *ev) p->event_kernels[p->event_count++] = kernel;
    return st;
}

fa_status fa_cl_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args) {
    (void)ctx;
    if (plan && plan->desc.algorithm == FA_ALGO_STANDARD) return fa_cl_standard_forward(plan_impl, plan, args);
    fa_cl_plan *p = plan_impl;
    if (!p || !plan || !args) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    const fa_attention_desc *d = &plan->desc;
    release_events(p);

    cl_args a = {p->fwd_kernel, 0, CL_SUCCESS, 0};
    arg_mem(&a, mem_of(args->q));
    arg_mem(&a, mem_of(args->k));
    arg_mem(&a, mem_of(args->v));
    arg_mem(&a, mem_of(args->o));
    arg_mem(&a, mem_of(args->lse));
    arg_layout(&a, &p->q);
    arg_layout(&a, &p->k);
    arg_layout(&a, &p->v);
    arg_layout(&a, &p->o);
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->seqlen_k);
    arg_int(&a, d->heads_q);
    arg_int(&a, d->heads_q / d->heads_kv);
    arg_long(&a, plan->total_q);
    arg_float(&a, p->scale_log2);
    mask_args(&a, p, plan, p->fwd_tiles, p->fwd_tile_cols);
    arg_int(&a, p->num_splits);
    arg_mem(&a, or_dummy(p, p->part_o));
    arg_mem(&a, or_dummy(p, p->part_l));
    score_args(&a, p, args->bias);
    FA_CHECK(args_done(&a, "fa_forward"));

    const cl_pass_shape *s = &p->fwd_shape;
    size_t tiles = (size_t)fa_tile_count(d->seqlen_q, s->br);
    size_t global[3] = {tiles * (size_t)s->wg, (size_t)d->heads_q, (size_t)d->batch * (size_t)p->num_splits};
    size_t local[3] = {(size_t)s->wg, 1, 1};
    FA_CHECK(launch(p, p->fwd_kernel, 3, global, local));
    if (p->num_splits == 1) return FA_SUCCESS;

    cl_args m = {p->merge_kernel, 0, CL_SUCCESS, 0};
    arg_mem(&m, p->part_o);
    arg_mem(&m, p->part_l);
    arg_mem(&m, mem_of(args->o));
    arg_mem(&m, mem_of(args->lse));
    arg_layout(&m, &p->o);
    arg_int(&m, d->seqlen_q);
    arg_int(&m, d->heads_q);
    arg_long(&m, plan->total_q);
    arg_mem(&m, or_dummy(p, p->cu_q));
    arg_int(&m, p->num_splits);
    FA_CHECK(args_done(&m, "fa_splitk_merge"));
    size_t mglobal[3] = {(size_t)d->head_dim, (size_t)d->seqlen_q, (size_t)d->batch * (size_t)d->heads_q};
    return launch(p, p->merge_kernel, 3, mglobal, NULL);
}

/* The backward kernels' shared arguments (FA_BWD_PARAMS in bwd_common.cl). */
static void bwd_common_args(cl_args *a, const fa_cl_plan *p, const fa_plan_s *plan, void *bias) {
    const fa_attention_desc *d = &plan->desc;
    arg_layout(a, &p->q);
    arg_layout(a, &p->k);
    arg_layout(a, &p->v);
    arg_layout(a, &p->o);
    arg_int(a, d->seqlen_q);
    arg_int(a, d->seqlen_k);
    arg_int(a, d->heads_q);
    arg_int(a, d->heads_q / d->heads_kv);
    arg_long(a, plan->total_q);
    arg_float(a, p->scale_log2);
    arg_float(a, plan->scale);
    mask_args(a, p, plan, p->bwd_tiles, p->bwd_tile_cols);
    score_args(a, p, bias);
}

/* The row-wise kernels' range (bwd_common.cl: fa_bwd_dot,
 * fa_bwd_dq_convert): a row's head_dim / 8 chunks across dimension 0 of a
 * work-group, as many rows as FA_CL_ROW_GROUP_ITEMS (the kernels' local
 * array, FA_ROW_GROUP_ITEMS) and the device allow across dimension 1,
 * sequences times heads across dimension 2. */
#define FA_CL_ROW_GROUP_ITEMS 256
static fa_status row_range(const fa_cl_plan *p, const fa_attention_desc *d, size_t global[3], size_t local[3]) {
    const size_t chunks = (size_t)d->head_dim / 8;
    size_t items = (size_t)p->ctx->info.desc.max_work_group_size;
    if (items > FA_CL_ROW_GROUP_ITEMS) items = FA_CL_ROW_GROUP_ITEMS;
    if (chunks == 0 || items < chunks)
        return fa_fail(FA_ERR_UNSUPPORTED, "the backward's row kernels need %zu work-items a work-group; the device allows %zu",
                       chunks, items);
    const size_t rows = items / chunks;
    local[0] = chunks;
    local[1] = rows;
    local[2] = 1;
    global[0] = chunks;
    global[1] = ((size_t)d->seqlen_q + rows - 1) / rows * rows;
    global[2] = (size_t)d->batch * (size_t)d->heads_q;
    return FA_SUCCESS;
}

fa_status fa_cl_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args) {
    (void)ctx;
    if (plan && plan->desc.algorithm == FA_ALGO_STANDARD) return fa_cl_standard_backward(plan_impl, plan, args);
    fa_cl_plan *p = plan_impl;
    if (!p || !plan || !args) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    const fa_attention_desc *d = &plan->desc;
    FA_CHECK(prepare_backward(p));
    release_events(p);

    cl_args a = {p->dot_kernel, 0, CL_SUCCESS, 0};
    arg_mem(&a, mem_of(args->o));
    arg_mem(&a, mem_of(args->dout));
    arg_mem(&a, p->dvec);
    arg_layout(&a, &p->o);
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->heads_q);
    arg_long(&a, plan->total_q);
    arg_mem(&a, or_dummy(p, p->cu_q));
    if (p->dq_atomic) arg_mem(&a, p->dq_acc);
    FA_CHECK(args_done(&a, "fa_bwd_dot"));
    size_t row_global[3], row_local[3];
    FA_CHECK(row_range(p, d, row_global, row_local));
    FA_CHECK(launch(p, p->dot_kernel, 3, row_global, row_local));

    const cl_pass_shape *s = &p->bwd_shape;
    cl_args kv = {p->dkdv_kernel, 0, CL_SUCCESS, 0};
    arg_mem(&kv, mem_of(args->q));
    arg_mem(&kv, mem_of(args->k));
    arg_mem(&kv, mem_of(args->v));
    arg_mem(&kv, mem_of(args->lse));
    arg_mem(&kv, mem_of(args->dout));
    arg_mem(&kv, p->dvec);
    arg_mem(&kv, mem_of(args->dk));
    arg_mem(&kv, mem_of(args->dv));
    bwd_common_args(&kv, p, plan, args->bias);
    if (s->stream || s->mma) arg_mem(&kv, or_dummy(p, p->dq_acc));
    if (s->mma) arg_mem(&kv, or_dummy(p, p->kpack));
    FA_CHECK(args_done(&kv, "fa_bwd_dkdv"));
    size_t ktiles = (size_t)fa_tile_count(d->seqlen_k, s->bc);
    size_t kv_global[3] = {ktiles * (size_t)s->wg, (size_t)d->heads_kv, (size_t)d->batch};
    size_t local[3] = {(size_t)s->wg, 1, 1};
    if (p->pack_kernel) {
        cl_args k = {p->pack_kernel, 0, CL_SUCCESS, 0};
        arg_mem(&k, mem_of(args->k));
        arg_mem(&k, mem_of(args->v));
        arg_layout(&k, &p->k);
        arg_layout(&k, &p->v);
        arg_int(&k, d->seqlen_k);
        arg_int(&k, d->heads_kv);
        arg_mem(&k, or_dummy(p, p->cu_q));
        arg_mem(&k, or_dummy(p, p->cu_k));
        arg_mem(&k, p->kpack);
        FA_CHECK(args_done(&k, "fa_bwd_pack_kv"));
        FA_CHECK(launch(p, p->pack_kernel, 3, kv_global, local));
    }
    FA_CHECK(launch(p, p->dkdv_kernel, 3, kv_global, local));

    if (p->dq_atomic) {
        cl_args c = {p->dq_kernel, 0, CL_SUCCESS, 0};
        arg_mem(&c, p->dq_acc);
        arg_mem(&c, mem_of(args->dq));
        arg_layout(&c, &p->q);
        arg_int(&c, d->seqlen_q);
        arg_int(&c, d->heads_q);
        arg_long(&c, plan->total_q);
        arg_mem(&c, or_dummy(p, p->cu_q));
        arg_float(&c, plan->scale);
        FA_CHECK(args_done(&c, "fa_bwd_dq_convert"));
        return launch(p, p->dq_kernel, 3, row_global, row_local);
    }

    cl_args q = {p->dq_kernel, 0, CL_SUCCESS, 0};
    arg_mem(&q, mem_of(args->q));
    arg_mem(&q, mem_of(args->k));
    arg_mem(&q, mem_of(args->v));
    arg_mem(&q, mem_of(args->lse));
    arg_mem(&q, mem_of(args->dout));
    arg_mem(&q, p->dvec);
    arg_mem(&q, mem_of(args->dq));
    bwd_common_args(&q, p, plan, args->bias);
    FA_CHECK(args_done(&q, "fa_bwd_dq"));
    size_t qtiles = (size_t)fa_tile_count(d->seqlen_q, s->br);
    size_t q_global[3] = {qtiles * (size_t)p->dq_wg, (size_t)d->heads_q, (size_t)d->batch};
    size_t q_local[3] = {(size_t)p->dq_wg, 1, 1};
    return launch(p, p->dq_kernel, 3, q_global, q_local);
}

fa_status fa_cl_last_time_ms(void *ctx, void *plan_impl, double *ms) {
    (void)ctx;
    if (fa_cl_standard_owns(plan_impl)) return fa_cl_standard_last_time_ms(plan_impl, ms);
    if (fa_cl_kvcache_owns(plan_impl)) return fa_cl_kvcache_last_time_ms(plan_impl, ms);
    fa_cl_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    if (p->event_count == 0) return fa_fail(FA_ERR_UNSUPPORTED, "no OpenCL attention pass has run on this plan");
    /* Each kernel's share of a pass, for tuning: which of a backward's
     * kernels a change moved. */
    const int report = getenv("FLASHATTN_OPENCL_KERNEL_TIMES") != NULL;
    double total = 0.0;
    for (int i = 0; i < p->event_count; i++) {
        double t = fa_cl_event_ms(p->events[i]);
        if (t < 0.0) return fa_fail(FA_ERR_UNSUPPORTED, "the OpenCL queue could not time the last pass");
        total += t;
        char name[64];
        if (report && fa_cl.clGetKernelInfo(p->event_kernels[i], CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) ==
                          CL_SUCCESS)
            fprintf(stderr, "opencl kernel %s %.4f ms\n", name, t);
    }
    *ms = total;
    return FA_SUCCESS;
}

fa_status fa_cl_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args) {
    (void)ctx;
    if (!fa_cl_kvcache_owns(plan_impl)) return fa_fail(FA_ERR_INTERNAL, "plan_impl is not a KV-cache plan's");
    return fa_cl_kvcache_forward(plan_impl, plan, args);
}

int fa_cl_plan_fwd_wgmma(void *plan_impl) {
    if (!plan_impl || fa_cl_standard_owns(plan_impl) || fa_cl_kvcache_owns(plan_impl)) return 0;
    const fa_cl_plan *p = plan_impl;
    return p->fwd_wgmma;
}

int fa_cl_plan_bwd_wgmma(void *plan_impl) {
    if (!plan_impl || fa_cl_kvcache_owns(plan_impl)) return 0;
    fa_cl_plan *p = plan_impl;
    if (prepare_backward(p) != FA_SUCCESS) return 0;
    return p->bwd_wgmma;
}

fa_status fa_cl_plan_kernel_local_mem(void *plan_impl, fa_pass pass, size_t *bytes) {
    if (fa_cl_kvcache_owns(plan_impl)) return fa_fail(FA_ERR_UNSUPPORTED, "a KV-cache plan has no fused-pass kernels");
    fa_cl_plan *p = plan_impl;
    if (!p || !bytes) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "bytes");
    *bytes = 0;
    if (pass == FA_PASS_BACKWARD) FA_CHECK(prepare_backward(p));
    cl_kernel kernels[3] = {NULL, NULL, NULL};
    if (pass == FA_PASS_FORWARD) {
        kernels[0] = p->fwd_kernel;
    } else {
        kernels[0] = p->dkdv_kernel;
        kernels[1] = p->dq_kernel;
    }
    for (int i = 0; i < 3 && kernels[i]; i++) {
        cl_ulong local = 0;
        cl_int err = fa_cl.clGetKernelWorkGroupInfo(kernels[i], p->ctx->device, CL_KERNEL_LOCAL_MEM_SIZE,
                                                    sizeof local, &local, NULL);
        if (err != CL_SUCCESS) return fa_cl_error(err, "clGetKernelWorkGroupInfo(CL_KERNEL_LOCAL_MEM_SIZE)");
        if ((size_t)local > *bytes) *bytes = (size_t)local;
    }
    return FA_SUCCESS;
}
