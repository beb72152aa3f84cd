/* The OpenCL matrix-unit kernels (kernels_cl/fwd_mma.cl, bwd_mma.cl) in
 * tiles the planner would not pick on this device: every work-group shape
 * of the layout (sub-groups, strips), Q's fragments in registers, key
 * splits, head dims that are not whole fragments, lengths that are not
 * whole tiles; fp16 and bf16 against the fp64 reference, through the
 * suite's checks (tests/attention_suite.c). They need a device whose
 * matrix units the fragment layer reaches: natively (NVIDIA sm_80+), or
 * emulated, as ctest runs them once per layout below on PoCL (for Intel
 * DPAS, AMD MFMA (both shapes) and AMD WMMA the cases named below: head
 * dims 8 to 256 in fp16 and bf16 at lengths of no whole tile, key splits,
 * Q in registers, the score options).
 *
 * fa-test-labels: device
 * fa-test-mma-layouts: nvidia
 * fa-test-mma-subset-layouts: intel amd-mfma amd-wmma
 * fa-test-mma-subset-cases: head_dims split_keys q_in_registers score_options packed_keys_backward
 */
#include "attention_suite.h"
#include "harness.h"
#include "opencl_suite.h"
#include "test_util.h"

#include "dtype.h"
#include "plan.h"
#include "fa_internal.h"
#include "planner_cl_mma.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_mma.h"
#include "backends/opencl/cl_runtime_internal.h"

/* Stages of the backward tiles the case forces (opencl_suite_mma_bwd_stages). */
static int g_stages = 1;

/* The layouts of this context's matrix units (CDNA: both MFMA shapes);
 * skips the case without. */
static int layouts_here(const fa_mma_layout_info *out[FA_MMA_MAX_LAYOUTS]) {
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    const int n = fa_mma_layouts_of(&suite_context()->info.desc, ids);
    for (int i = 0; i < n; i++) out[i] = fa_mma_layout_get(ids[i]);
    return n;
}
#define REQUIRE_LAYERS(ls, n)                                                              \
    do {                                                                                   \
        suite_use_backend(&opencl_suite);                                                  \
        if (!suite_context()) FA_SKIP("no OpenCL device");                                 \
        (n) = layouts_here(ls);                                                            \
        if ((n) == 0) FA_SKIP("no matrix units the fragment layer reaches here: set FLASHATTN_OPENCL_MMA_EMULATE"); \
    } while (0)
#else
#define REQUIRE_LAYERS(ls, n)                                                              \
    do {                                                                                   \
        (void)(ls);                                                                        \
        (void)(n);                                                                         \
        FA_SKIP("the OpenCL backend is not built into this library");                      \
    } while (0)
#endif

#ifdef FA_WITH_OPENCL
/* A matrix-unit tile: strips of m rows a sub-group (queries forward, keys
 * backward) and the micro-tile planner_cl_mma.c counts for it. */
static suite_tiles mma_tile(const fa_mma_layout_info *l, fa_pass pass, int br, int bc, int strips, int split) {
    const int cols = l->c_elems / l->c_rows;
    suite_tiles t = {br, bc, 0, 0, split, 1};
    if (pass == FA_PASS_FORWARD) {
        t.tr = strips * l->c_rows;
        t.tc = bc * cols / l->n;
    } else {
        t.tc = strips * l->c_rows;
        t.tr = br * cols / l->n;
    }
    return t;
}

/* Whether the device runs the tile (the planner's geometry, and the
 * emulated layer's scratch beside the tiles). */
static int runs_here(const fa_attention_desc *d, fa_pass pass, const suite_tiles *t) {
    fa_context ctx = suite_context();
    const fa_device_desc *dev = &ctx->info.desc;
    fa_cl_mma_geometry g;
    const int stages = pass == FA_PASS_BACKWARD ? g_stages : 1;
    if (!fa_cl_mma_geometry_of(dev, d, pass, t->br, t->bc, t->tr, t->tc, stages, &g)) return 0;
    const int most = g.warps > g.dq_warps ? g.warps : g.dq_warps;
    return g.local_mem + fa_cl_mma_extra_local(ctx->impl, g.layout, most) <= dev->local_mem_bytes;
}

static fa_dtype alternate(int i) { return i % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16; }

/* The context's local memory as the planner and the plans see it. */
typedef struct local_mem {
    size_t desc, cl;
} local_mem;

/* Describes the context with kib KiB of local memory, plus room for the
 * layout's emulated scratch beside it; returns what it had, for
 * local_mem_restore. */
static local_mem local_mem_set(fa_context ctx, const fa_mma_layout_info *l, int kib) {
    fa_cl_context *cl = ctx->impl;
    const local_mem had = {ctx->info.desc.local_mem_bytes, cl->info.desc.local_mem_bytes};
    ctx->info.desc.local_mem_bytes = cl->info.desc.local_mem_bytes =
        (size_t)kib * 1024 + fa_cl_mma_extra_local(cl, fa_mma_layout_named(l->name), 8);
    return had;
}

static void local_mem_restore(fa_context ctx, local_mem had) {
    fa_cl_context *cl = ctx->impl;
    ctx->info.desc.local_mem_bytes = had.desc;
    cl->info.desc.local_mem_bytes = had.cl;
}

/* One run with forced tiles (fwd or bwd NULL: the planner's); counts the
 * runs and names the layout and geometry. */
static int run_forced(const fa_mma_layout_info *l, const char *what, const fa_attention_desc *d,
                      const suite_tiles *f, const suite_tiles *b, int backward) {
    if ((f && !runs_here(d, FA_PASS_FORWARD, f)) || (b && !runs_here(d, FA_PASS_BACKWARD, b))) {
        fprintf(stderr, "  %-10s %-40s not a tile of this device: not run\n", l->name, what);
        return 0;
    }
    char name[160];
    snprintf(name, sizeof name, "%s %s %s d%d", l->name, what, fa_dtype_name(d->q.dtype), d->head_dim);
    suite_run_tiles(name, d, f, b, backward);
    return 1;
}
#endif

/* Work-groups of 1, 2, 4 and 8 sub-groups, one and two strips each, in
 * both passes; key tiles of one k-step and more; a length that is a whole
 * number of no tile; every layout of the device. */
FA_TEST(work_group_shapes) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        const int side = l->k > l->n ? l->k : l->n; /* the narrowest other side */
        static const int shapes[][2] = {{1, 1}, {2, 2}, {4, 1}, {8, 1}, {1, 2}};
        int ran = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int warps = shapes[i][0], strips = shapes[i][1], rows = warps * strips * l->m;
            const int other = strips == 1 && i % 2 ? 2 * side : side;
            fa_attention_desc d = suite_desc(alternate((int)i), 1, 150, 170, 2, 1, 64);
            d.causal = i == 2;
            const suite_tiles f = mma_tile(l, FA_PASS_FORWARD, rows, other, strips, 1);
            const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, other, rows, strips, 1);
            char what[96];
            snprintf(what, sizeof what, "%d sub-groups x %d strips, other side %d", warps, strips, other);
            ran += run_forced(l, what, &d, &f, &b, 1);
        }
        CHECK_MSG(ran >= 3, "%s: only %d of the work-group shapes ran", l->name, ran);
    }
#endif
}

/* Head dims that are whole fragments (64, 128, 256) and that are not (8,
 * 40, 72, 200): padded with zeros to whole fragments, never stored. The
 * planner's tiles, then (a second layout of the device) tiles of each
 * other layout. */
FA_TEST(head_dims) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    /* The layouts run as a CI subset (every one but NVIDIA's, emulated)
     * take an odd head_dim, 128 and 256: each head_dim is a PoCL compile
     * of both passes, which is where their time goes. */
    static const int dims_all[] = {8, 40, 64, 72, 128, 200, 256}, dims_subset[] = {40, 128, 256};
    const char *emulated = getenv("FLASHATTN_OPENCL_MMA_EMULATE");
    const int subset = emulated && *emulated && strcmp(emulated, "nvidia") != 0;
    const int *dims = subset ? dims_subset : dims_all;
    const size_t ndims = subset ? sizeof dims_subset / sizeof dims_subset[0] : sizeof dims_all / sizeof dims_all[0];
    for (size_t i = 0; i < ndims; i++) {
        fa_attention_desc d = suite_desc(alternate((int)i), 1, 77, 93, 2, 2, dims[i]);
        d.causal = i % 3 == 1;
        char name[64];
        snprintf(name, sizeof name, "planner's tiles %s d%d", fa_dtype_name(d.q.dtype), dims[i]);
        suite_run_tiles(name, &d, NULL, NULL, 1);
        for (int li = 1; li < nl; li++) {
            const fa_mma_layout_info *l = ls[li];
            const suite_tiles f = mma_tile(l, FA_PASS_FORWARD, 2 * l->m, 2 * l->n, 1, 1);
            const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, 2 * l->n, 2 * l->m, 1, 1);
            run_forced(l, "2 sub-groups", &d, &f, &b, 1);
        }
    }
#endif
}

/* Q's fragments in registers (QREG), as on a device whose tiles do not fit
 * three: the context is described with less local memory for the case
 * (48 KiB at head_dim 128 first), which the planner's geometry then
 * decides; smaller head_dims, key tiles and local memories are tried in
 * turn where a layout has no room for Q at head_dim 128. */
FA_TEST(q_in_registers) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    fa_context ctx = suite_context();
    const local_mem had = {ctx->info.desc.local_mem_bytes, ((fa_cl_context *)ctx->impl)->info.desc.local_mem_bytes};
    static const int dims[] = {128, 64}, keys[] = {64, 32, 16}, kib[] = {48, 24, 16};
    int layouts_ran = 0;
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        int ran = 0;
        for (size_t di = 0; di < FA_ARRAY_SIZE(dims) && !ran; di++)
            for (size_t ki = 0; ki < FA_ARRAY_SIZE(kib) && !ran; ki++)
                for (size_t bi = 0; bi < FA_ARRAY_SIZE(keys) && !ran; bi++)
                    for (int strips = 1; strips <= 2 && !ran; strips++)
                        for (int warps = 8; warps >= 1 && !ran; warps /= 2) {
                            (void)local_mem_set(ctx, l, kib[ki]);
                            fa_attention_desc d = suite_desc(alternate(warps), 1, 130, 150, 2, 1, dims[di]);
                            d.window_left = 60;
                            const int rows = warps * strips * l->m;
                            const suite_tiles f = mma_tile(l, FA_PASS_FORWARD, rows, keys[bi], strips, 1);
                            fa_cl_mma_geometry g;
                            if (!fa_cl_mma_geometry_of(&ctx->info.desc, &d, FA_PASS_FORWARD, f.br, f.bc, f.tr, f.tc,
                                                       1, &g) ||
                                g.layout != fa_mma_layout_named(l->name) || !g.q_regs ||
                                !runs_here(&d, FA_PASS_FORWARD, &f))
                                continue;
                            char what[80];
                            snprintf(what, sizeof what, "Q in registers, %d x %d in %d KiB", f.br, f.bc, kib[ki]);
                            ran += run_forced(l, what, &d, &f, NULL, 1);
                        }
        if (ran)
            layouts_ran++;
        else
            fprintf(stderr, "  %-10s no tile holds Q in registers beside its accumulators: not run\n", l->name);
    }
    local_mem_restore(ctx, had);
    /* Intel's DPAS layer: a lane holds whole rows of O, so Q never fits
     * beside them within its register budget (core/mma_layouts.c). */
    if (!layouts_ran) FA_SKIP("no layout of this device holds Q in registers");
#endif
}

/* The forward with keys split (decoding), merged through L: causal,
 * windowed and variable-length, more splits than some sequences have key
 * tiles. */
FA_TEST(split_keys) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        const int side = l->k > l->n ? l->k : l->n;
        /* One sub-group, or as few as make a whole SIMD width (Intel's
         * sub-groups of 8 on a device of 16). */
        const int simd = suite_context()->info.desc.simd_width;
        const int rows = l->m * (simd > l->sub_group ? simd / l->sub_group : 1);
        fa_attention_desc d = suite_desc(FA_DTYPE_F16, 2, 5, 700, 4, 1, 64);
        d.causal = 1;
        suite_tiles f = mma_tile(l, FA_PASS_FORWARD, rows, 2 * side, 1, 5);
        CHECK(run_forced(l, "split 5 causal", &d, &f, NULL, 0));
        static const int32_t cu_q[] = {0, 1, 3, 4};
        static const int32_t cu_k[] = {0, 300, 1100, 1101};
        d = suite_desc(FA_DTYPE_BF16, 3, 2, 800, 2, 2, 96);
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.window_left = 250;
        f = mma_tile(l, FA_PASS_FORWARD, rows, side, 1, 7);
        CHECK(run_forced(l, "split 7 varlen window", &d, &f, NULL, 0));
    }
#endif
}

#ifdef FA_WITH_OPENCL
/* Whether the planner's own plans for d run here beside an emulated
 * layer's scratch, which the planner does not count: forced tiles replace
 * one pass of them. */
static int planner_fits(fa_context ctx, const fa_attention_desc *d) {
    fa_plan_info info;
    if (fa_plan_for_device(&ctx->info.desc, d, &info) != FA_SUCCESS) return 0;
    const fa_kernel_plan *kp[2] = {&info.forward, &info.backward};
    const int forced = g_stages;
    int fits = 1;
    for (int pass = 0; pass < 2; pass++) {
        if (kp[pass]->variant != FA_VARIANT_MMA) continue;
        const suite_tiles t = {kp[pass]->br, kp[pass]->bc, kp[pass]->thread_rows, kp[pass]->thread_cols, 1, 1};
        g_stages = kp[pass]->stages; /* the plan's, not the forced tiles' */
        fits &= runs_here(d, (fa_pass)pass, &t);
    }
    g_stages = forced;
    return fits;
}
#endif

/* The pipelined dK/dV kernel (two stages of Q and dO): on the device's
 * own local memory (V's tile beside them; causal, GQA, dropout, the
 * deterministic dQ kernel), then described with NVIDIA's 48 KiB, where a
 * 32-query tile at head_dim 64 holds V's fragments in registers (VREG).
 * Every layout of the device whose backward runs on the matrix units (not
 * Intel's DPAS layer: core/mma_layouts.c gives it no backward budget); the
 * register-held V is required of NVIDIA's only (other layouts' register
 * budgets may not hold it). */
FA_TEST(pipelined_backward) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    fa_context ctx = suite_context();
    g_stages = 2;
    opencl_suite_mma_bwd_stages(2);
    /* head_dim, sub-groups, strips, query rows (in k-steps of 16); 48 KiB or not */
    static const int cases[][5] = {{64, 4, 1, 2, 0}, {128, 4, 1, 1, 0}, {64, 8, 1, 1, 0}, {64, 2, 2, 1, 0},
                                   {64, 8, 1, 2, 1}, {128, 4, 1, 1, 1}};
    int layouts_ran = 0;
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        const int side = l->k > l->n ? l->k : l->n;
        int ran = 0, vregs = 0, one_stage = 0;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const int dim = cases[i][0], warps = cases[i][1], strips = cases[i][2], small = cases[i][4];
            const int br = cases[i][3] * (side > 16 ? side : 16);
            const local_mem had = small ? local_mem_set(ctx, l, 48) : (local_mem){0, 0};
            fa_attention_desc d = suite_desc(alternate((int)i), 2, 150, 170, 4, 2, dim);
            d.causal = i % 2 == 0;
            d.deterministic = i == 1;
            if (i == 2) {
                d.dropout_p = 0.15f;
                d.dropout_seed = 7;
            }
            /* Shorter sequences give the planner smaller tiles of its own. */
            for (int len = 150; small && len > 16 && !planner_fits(ctx, &d); len /= 2) d.seqlen_q = d.seqlen_k = len;
            const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, br, warps * strips * l->m, strips, 1);
            fa_cl_mma_geometry g;
            one_stage += fa_cl_mma_geometry_of(&ctx->info.desc, &d, FA_PASS_BACKWARD, b.br, b.bc, b.tr, b.tc, 1, NULL);
            if (fa_cl_mma_geometry_of(&ctx->info.desc, &d, FA_PASS_BACKWARD, b.br, b.bc, b.tr, b.tc, 2, &g) &&
                g.layout == fa_mma_layout_named(l->name) && (!small || planner_fits(ctx, &d))) {
                char what[96];
                snprintf(what, sizeof what, "two stages%s, %d x %d%s", g.v_regs ? ", V in registers" : "", b.br,
                         b.bc, small ? ", 48 KiB" : "");
                const int r = run_forced(l, what, &d, NULL, &b, 1);
                ran += r;
                vregs += r && g.v_regs;
            }
            if (small) local_mem_restore(ctx, had);
        }
        if (!one_stage) {
            fprintf(stderr, "  %-10s no backward tile on the matrix units: not run\n", l->name);
            continue;
        }
        layouts_ran++;
        CHECK_MSG(ran >= 1, "%s: no two-stage backward tile ran", l->name);
        if (fa_mma_layout_named(l->name) == FA_MMA_LAYOUT_NVIDIA) {
            CHECK_MSG(ran >= 4, "%s: only %d two-stage backward tiles ran", l->name, ran);
            CHECK_MSG(vregs > 0, "no two-stage %s tile held V in registers in 48 KiB", l->name);
        }
    }
    g_stages = 1;
    opencl_suite_mma_bwd_stages(1);
    if (!layouts_ran) FA_SKIP("no layout of this device runs the backward on its matrix units");
#endif
}

/* NVIDIA's dK/dV kernel in one stage with V's fragments in registers
 * (planner_cl_mma.c, bwd_v_regs), as on the 48 KiB of NVIDIA's OpenCL: 128
 * keys at head_dim 128, 32 queries at head_dim 64 (whole) and at 128 and
 * 112 (in chunks of 16, bwd_q_chunk, with dropout; whole with dQ units of
 * two n-tiles otherwise, bwd_whole_step); causal, dropout, GQA, a block mask with a
 * window (its query tiles walked from a different start per key tile,
 * FA_BWD_ROTATE), a window with variable lengths. The geometry must say V
 * in registers, and the chunk, for each. (Deterministic mode never takes
 * them: its dQ kernel holds K's and V's tiles of the same keys beside Q
 * and dO, which then fit the dK/dV kernel too.) Other layouts keep V's
 * tile in one stage: the case runs NVIDIA's layout alone. */
FA_TEST(one_stage_v_in_registers) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    fa_context ctx = suite_context();
    const fa_mma_layout_info *l = NULL;
    for (int li = 0; li < nl; li++)
        if (fa_mma_layout_named(ls[li]->name) == FA_MMA_LAYOUT_NVIDIA) l = ls[li];
    if (!l) FA_SKIP("NVIDIA's layout only (the others keep V's tile in one stage)");
    /* head_dim, sub-groups, query rows, the chunk the geometry must give,
     * KiB of local memory (beside the emulated layer's scratch, which
     * local_mem_set adds: 32 x 128 at head_dim 64 and 32 x 64 at 112 keep
     * V's tile in 48 and that), query and key lengths */
    static const int cases[][7] = {{128, 8, 16, 16, 48, 100, 150}, {128, 4, 32, 16, 48, 100, 120},
                                   {64, 8, 32, 32, 40, 100, 150},  {128, 8, 16, 16, 48, 120, 300},
                                   {128, 4, 32, 32, 48, 115, 105}, {112, 4, 32, 32, 40, 90, 130}};
    static const int32_t cu_q[] = {0, 70, 75, 190};
    static const int32_t cu_k[] = {0, 90, 95, 200};
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int dim = cases[i][0], warps = cases[i][1], br = cases[i][2], chunk = cases[i][3];
        const local_mem had = local_mem_set(ctx, l, cases[i][4]);
        fa_attention_desc d = suite_desc(alternate((int)i), 1, cases[i][5], cases[i][6], 4, 2, dim);
        switch (i) {
        case 0:
            d.causal = 1;
            break;
        case 1:
            d.dropout_p = 0.2f;
            d.dropout_seed = 11;
            break;
        case 2:
            d.causal = 1;
            d.heads_kv = 1;
            break;
        case 3:
            d.window_left = 40;
            break;
        case 5:
            d.causal = 1;
            d.heads_kv = 1;
            break;
        default:
            d.batch = 3;
            d.cu_seqlens_q = cu_q;
            d.cu_seqlens_k = cu_k;
            d.window_left = 30;
            d.window_right = 20;
            break;
        }
        for (int len = d.seqlen_q; !d.cu_seqlens_q && len > 16 && !planner_fits(ctx, &d); len /= 2)
            d.seqlen_q = d.seqlen_k = len;
        const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, br, warps * l->m, 1, 1);
        fa_cl_mma_geometry g;
        const int ok = fa_cl_mma_geometry_of(&ctx->info.desc, &d, FA_PASS_BACKWARD, b.br, b.bc, b.tr, b.tc, 1, &g);
        /* A whole step where the register model chunks it takes dQ units
         * of two n-tiles. */
        const int unit = chunk == br && br > 16 && dim != 64 ? 2 : 0;
        CHECK_MSG(ok && g.v_regs && g.q_chunk == chunk && g.dq_unit == unit,
                  "d%d %d x %d in %d KiB: geometry %d, V in registers %d, chunk %d (want %d), dQ unit %d (want %d)",
                  dim, b.br, b.bc, cases[i][4], ok, ok ? g.v_regs : -1, ok ? g.q_chunk : -1, chunk,
                  ok ? g.dq_unit : -1, unit);
        uint8_t *blocks = i == 3 ? suite_random_block_mask(&d, 16, 24, 5) : NULL;
        /* The walk from a rotated start: a tuning option, given as one. */
        const char *env = getenv("FLASHATTN_OPENCL_OPTIONS");
        char *saved = env ? strdup(env) : NULL;
        if (i == 3) setenv("FLASHATTN_OPENCL_OPTIONS", "-DFA_BWD_ROTATE", 1);
        if (ok && planner_fits(ctx, &d) && (i != 3 || blocks)) {
            char what[96];
            snprintf(what, sizeof what, "one stage, V in registers, %d x %d, chunks of %d%s, %d KiB", b.br, b.bc,
                     g.q_chunk, i == 3 ? ", rotated" : "", cases[i][4]);
            ran += run_forced(l, what, &d, NULL, &b, 1);
        }
        if (saved)
            setenv("FLASHATTN_OPENCL_OPTIONS", saved, 1);
        else
            unsetenv("FLASHATTN_OPENCL_OPTIONS");
        free(saved);
        free(blocks);
        local_mem_restore(ctx, had);
    }
    CHECK_MSG(ran == (int)(sizeof cases / sizeof cases[0]), "only %d of the one-stage tiles with V in registers ran",
              ran);
#endif
}

#ifdef FA_WITH_OPENCL
/* The least local memory (KiB, in steps of 4) at which the geometry packs
 * K and V for a tile in `stages` stages and the tile fits; 0 if none up to
 * 160. */
static int packing_kib(fa_context ctx, const fa_mma_layout_info *l, const fa_attention_desc *d, const suite_tiles *b,
                       int stages) {
    int found = 0;
    for (int kib = 16; kib <= 160 && !found; kib += 4) {
        const local_mem had = local_mem_set(ctx, l, kib);
        fa_cl_mma_geometry g;
        g_stages = stages;
        if (fa_cl_mma_geometry_of(&ctx->info.desc, d, FA_PASS_BACKWARD, b->br, b->bc, b->tr, b->tc, stages, &g) &&
            g.k_packed && runs_here(d, FA_PASS_BACKWARD, b))
            found = kib;
        g_stages = 1;
        local_mem_restore(ctx, had);
    }
    return found;
}
#endif

/* The dK/dV kernel with K and V packed in the workspace (planner_cl_mma.c,
 * bwd_k_packed; KPACK): where even V in registers leaves K's tile no room
 * in 48 KiB. NVIDIA's layout in one stage: 64 queries a step at head_dim
 * 128 (causal; dropout with MQA; variable lengths, one of them empty, with
 * a window) and at 112 (padded dimensions, a block mask), 128 keys in one
 * strip of eight sub-groups and in two strips of four at head_dim 64 in 40
 * KiB (a sub-group's second strip of packed fragments). Every layout with
 * a backward on its matrix units in two stages (head_dim 128, and 64 with
 * dropout), with the local memory at which its tile packs (its fragments
 * packed in its own order). The geometry must say K packed, and V neither
 * in a tile nor in registers, for each case that runs. */
FA_TEST(packed_keys_backward) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    fa_context ctx = suite_context();
    /* The second sequence empty: its key tiles have no slot to take. */
    static const int32_t cu_q[] = {0, 70, 70, 185};
    static const int32_t cu_k[] = {0, 90, 90, 200};
    /* head_dim, sub-groups, strips, query rows (in k-steps of 16), stages,
     * query and key lengths, KiB of local memory (beside the emulated
     * layer's scratch, which local_mem_set adds: at head_dim 64 V's
     * fragments in registers make 128 keys fit in 48 and that; 0: the
     * least at which the tile packs) */
    static const int cases[][8] = {{128, 4, 1, 4, 1, 80, 120, 48}, {128, 4, 1, 4, 1, 115, 75, 48},
                                   {128, 4, 1, 4, 1, 0, 0, 48},     {112, 4, 1, 4, 1, 70, 100, 48},
                                   {64, 8, 1, 4, 1, 100, 170, 40},  {64, 4, 2, 4, 1, 90, 140, 40},
                                   {128, 4, 1, 2, 2, 80, 120, 48},  {64, 4, 1, 2, 2, 70, 90, 0}};
    int layouts_ran = 0;
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        const int nvidia = fa_mma_layout_named(l->name) == FA_MMA_LAYOUT_NVIDIA;
        const int side = l->k > l->n ? l->k : l->n;
        int ran = 0, tried = 0;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const int dim = cases[i][0], warps = cases[i][1], strips = cases[i][2], stages = cases[i][4];
            /* Other layouts hold V in registers (and pack) in two stages only. */
            if (!nvidia && stages == 1) continue;
            const int br = cases[i][3] * (side > 16 ? side : 16);
            fa_attention_desc d = suite_desc(alternate((int)i), 1, cases[i][5], cases[i][6], 4, 2, dim);
            const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, br, warps * strips * l->m, strips, 1);
            /* Other layouts' tiles take the local memory at which they pack. */
            const int kib = nvidia && cases[i][7] ? cases[i][7] : packing_kib(ctx, l, &d, &b, stages);
            if (!kib) continue;
            const local_mem had = local_mem_set(ctx, l, kib);
            uint8_t *blocks = NULL;
            switch (i) {
            case 0:
            case 6:
                d.causal = 1;
                break;
            case 7:
                d.dropout_p = 0.1f;
                d.dropout_seed = 3;
                break;
            case 1:
                d.dropout_p = 0.2f;
                d.dropout_seed = 5;
                d.heads_kv = 1;
                break;
            case 2:
                d.batch = 3;
                d.seqlen_q = d.seqlen_k = 115;
                d.cu_seqlens_q = cu_q;
                d.cu_seqlens_k = cu_k;
                d.window_left = 30;
                d.window_right = 20;
                break;
            case 3:
                d.window_left = 50;
                blocks = suite_random_block_mask(&d, 16, 24, 9);
                break;
            case 4:
                d.causal = 1;
                d.heads_kv = 4;
                break;
            default:
                break;
            }
            for (int len = d.seqlen_q; !d.cu_seqlens_q && len > 16 && !planner_fits(ctx, &d); len /= 2)
                d.seqlen_q = d.seqlen_k = len;
            fa_cl_mma_geometry g;
            const int ok =
                fa_cl_mma_geometry_of(&ctx->info.desc, &d, FA_PASS_BACKWARD, b.br, b.bc, b.tr, b.tc, stages, &g) &&
                g.layout == fa_mma_layout_named(l->name);
            if (ok) {
                tried++;
                CHECK_MSG(g.k_packed && !g.v_regs, "%s d%d %d x %d in %d stage(s), %d KiB: K packed %d, V in registers %d",
                          l->name, dim, b.br, b.bc, stages, kib, g.k_packed, g.v_regs);
            } else if (nvidia) {
                CHECK_MSG(0, "%s d%d %d x %d in %d stage(s): no geometry", l->name, dim, b.br, b.bc, stages);
            }
            g_stages = stages;
            opencl_suite_mma_bwd_stages(stages);
            if (ok && g.k_packed && planner_fits(ctx, &d) && (i != 3 || blocks)) {
                char what[96];
                snprintf(what, sizeof what, "K and V packed, %d stage(s), %d x %d, chunks of %d, %d KiB", stages,
                         b.br, b.bc, g.q_chunk, kib);
                ran += run_forced(l, what, &d, NULL, &b, 1);
            }
            g_stages = 1;
            opencl_suite_mma_bwd_stages(1);
            free(blocks);
            local_mem_restore(ctx, had);
        }
        if (!tried) {
            fprintf(stderr, "  %-10s no packed backward tile on the matrix units: not run\n", l->name);
            continue;
        }
        layouts_ran++;
        if (nvidia)
            CHECK_MSG(ran == 8, "%s: only %d of the eight packed-key tiles ran", l->name, ran);
        else
            CHECK_MSG(ran >= 1, "%s: no packed-key tile ran", l->name);
    }
    if (!layouts_ran) FA_SKIP("no layout of this device packs the backward's keys");
#endif
}

/* The score options (softcap, ALiBi, additive bias) on the matrix units,
 * whatever the planner would pick: both passes with dQ added atomically
 * (all three options, causal, GQA, dropout), the deterministic dQ kernel
 * (softcap and a bias in the inputs' dtype under a window), and the
 * forward with keys split (decoding). A layout whose backward does not run
 * on its matrix units (Intel's DPAS layer) runs its forward there and the
 * planner's backward. Every case on the device's first layout, the first
 * on the others. */
FA_TEST(score_options) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    static const float slopes[4] = {0.5f, 0.125f, 0.75f, 0.03125f};
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = ls[li];
        const int side = l->k > l->n ? l->k : l->n;
        fa_attention_desc d = suite_desc(FA_DTYPE_F16, 2, 70, 90, 4, 2, 64);
        d.causal = 1;
        d.softcap = 2.0f;
        d.softmax_scale = 0.4f;
        d.alibi_slopes = slopes;
        d.bias_batch = 2;
        d.bias_heads = 1;
        d.bias.dtype = FA_DTYPE_F32;
        d.dropout_p = 0.2f;
        d.dropout_seed = 11;
        const suite_tiles f = mma_tile(l, FA_PASS_FORWARD, 2 * l->m, 2 * side, 1, 1);
        const suite_tiles b = mma_tile(l, FA_PASS_BACKWARD, 2 * side, 2 * l->m, 1, 1);
        const int bwd = runs_here(&d, FA_PASS_BACKWARD, &b);
        int ran = run_forced(l, bwd ? "all three, dropout gqa" : "all three, dropout gqa (forward)", &d, &f,
                             bwd ? &b : NULL, 1);
        if (li == 0) {
            d = suite_desc(FA_DTYPE_BF16, 2, 50, 75, 2, 2, 64);
            d.window_left = 30;
            d.window_right = 4;
            d.softcap = 1.5f;
            d.bias_batch = 1;
            d.bias_heads = 2;
            d.bias.dtype = FA_DTYPE_BF16;
            d.bias.offset = 3;
            d.bias.stride_seq = 80; /* rows padded past seqlen_k */
            d.bias.stride_head = 50 * 80;
            d.deterministic = 1;
            ran += run_forced(l, bwd ? "softcap bias, deterministic" : "softcap bias (forward)", &d, &f,
                              bwd ? &b : NULL, 1);
            d = suite_desc(FA_DTYPE_F16, 2, 3, 900, 4, 1, 64);
            d.causal = 1;
            d.softcap = 4.0f;
            d.alibi_slopes = slopes;
            d.bias_batch = 2;
            d.bias_heads = 4;
            d.bias.dtype = FA_DTYPE_F16;
            /* One sub-group, or as few as make a whole SIMD width (as split_keys). */
            const int simd = suite_context()->info.desc.simd_width;
            const int rows = l->m * (simd > l->sub_group ? simd / l->sub_group : 1);
            const suite_tiles s = mma_tile(l, FA_PASS_FORWARD, rows, 2 * side, 1, 5);
            ran += run_forced(l, "split 5, all three", &d, &s, NULL, 0);
        }
        CHECK_MSG(ran == (li == 0 ? 3 : 1), "%s: %d of the score-option cases ran", l->name, ran);
    }
#endif
}

/* dQ's padding columns (head_dim 72 is 80 on the instruction's k) stay
 * out of the next row: a NaN in one query row makes that row's products
 * NaN in every column, padding included, and only that row's dQ may show
 * it (the rule above fa_forward in flashattn.h). The reductions once added
 * the padding columns into the next row's first ones; zeros hid it until a
 * non-finite row, which the GPU's differential test found. */
FA_TEST(dq_padding_columns) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
    (void)ls;
#ifdef FA_WITH_OPENCL
    const int n = 48, dim = 72, bad = 5;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = n;
    d.heads_q = d.heads_kv = 1;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    const size_t count = (size_t)n * dim, bytes = count * 2;
    fa_context ctx = suite_context();
    fa_rng rng;
    fa_rng_seed(&rng, 72);
    uint16_t *in[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) in[i] = fa_test_random_tensor(&rng, FA_DTYPE_F16, (int64_t)count);
    fa_buffer t[9] = {NULL};
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    int ok = plan != NULL;
    for (int i = 0; i < 9 && ok; i++) {
        CHECK_OK(fa_buffer_alloc(ctx, i == 4 ? (size_t)n * 4 : bytes, &t[i]));
        ok = t[i] != NULL;
    }
    for (int i = 0; i < 4 && ok; i++) ok = in[i] != NULL;
    if (ok) {
        CHECK_MSG(plan->info.backward.variant == FA_VARIANT_MMA, "backward planned %s",
                  fa_variant_name(plan->info.backward.variant));
        in[0][(size_t)bad * dim + 3] = 0x7e00; /* NaN in query row 5 */
        /* q k v o lse dout dq dk dv */
        CHECK_OK(fa_buffer_upload(t[0], 0, in[0], bytes));
        CHECK_OK(fa_buffer_upload(t[1], 0, in[1], bytes));
        CHECK_OK(fa_buffer_upload(t[2], 0, in[2], bytes));
        CHECK_OK(fa_buffer_upload(t[5], 0, in[3], bytes));
        CHECK_OK(fa_forward(plan, t[0], t[1], t[2], t[3], t[4]));
        CHECK_OK(fa_backward(plan, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]));
        uint16_t *dq = malloc(bytes);
        if (dq && fa_buffer_download(t[6], 0, dq, bytes) == FA_SUCCESS) {
            int spurious = 0, row_nan = 0, first = -1;
            for (size_t e = 0; e < count; e++) {
                const int finite = isfinite(fa_f16_to_f32(dq[e]));
                if ((int)(e / dim) == bad)
                    row_nan += !finite;
                else if (!finite && spurious++ == 0)
                    first = (int)e;
            }
            CHECK_MSG(spurious == 0, "%d non-finite dQ values outside row %d, the first at row %d column %d", spurious,
                      bad, first / dim, first % dim);
            CHECK_MSG(row_nan > 0, "row %d of dQ has no NaN", bad);
        }
        free(dq);
    }
    for (int i = 0; i < 9; i++)
        if (t[i]) fa_buffer_free(t[i]);
    if (plan) fa_plan_destroy(plan);
    for (int i = 0; i < 4; i++) free(in[i]);
#endif
}

/* NVIDIA's OpenCL on sm_90: the planner's forward and backward at head_dim
 * 64 and 128 take the warpgroup products, and where the sm_90a rebuild is
 * refused (cl_build.c's test hook, as a driver that gives no PTX would)
 * the same tiles on mma.sync; both against the fp64 reference. */
FA_TEST(warpgroup_backward_fallback) {
    const fa_mma_layout_info *ls[FA_MMA_MAX_LAYOUTS];
    int nl = 0;
    REQUIRE_LAYERS(ls, nl);
#ifdef FA_WITH_OPENCL
    fa_cl_context *cl = suite_context()->impl;
    int emulated = 0;
    (void)fa_cl_mma_layer(cl, &emulated);
    if (emulated || strcmp(cl->info.desc.arch, "sm_90") != 0) FA_SKIP("needs NVIDIA's OpenCL on sm_90");
    /* Shapes the planner gives its 64 x 64 forward and 32 x 64 backward
     * tiles (a smaller problem gets smaller tiles, which run on mma.sync;
     * a length of no whole 64 keys gets tiles that divide it), causal at
     * head_dim 128. */
    static const int dims[] = {64, 128}, lens[] = {960, 1024}, heads[] = {32, 32};
    for (int refuse = 0; refuse < 2; refuse++) {
        for (int i = 0; i < 2; i++) {
            fa_attention_desc d = suite_desc(alternate(i + refuse), 1, lens[i], lens[i], heads[i], heads[i], dims[i]);
            d.causal = i == 1;
            char name[80];
            snprintf(name, sizeof name, "planner's tiles%s %s d%d", refuse ? ", sm_90a refused" : "",
                     fa_dtype_name(d.q.dtype), dims[i]);
            fa_cl_sm90a_refuse = refuse;
            suite_run_tiles(name, &d, NULL, NULL, 1);
            fa_cl_sm90a_refuse = 0;
            CHECK_MSG(opencl_suite_last_wgmma(FA_PASS_FORWARD) == !refuse &&
                          opencl_suite_last_wgmma(FA_PASS_BACKWARD) == !refuse,
                      "%s: warpgroup products %d forward, %d backward", name, opencl_suite_last_wgmma(FA_PASS_FORWARD),
                      opencl_suite_last_wgmma(FA_PASS_BACKWARD));
        }
    }
#endif
}

FA_TEST_MAIN(FA_CASE(work_group_shapes), FA_CASE(head_dims), FA_CASE(q_in_registers), FA_CASE(split_keys),
             FA_CASE(pipelined_backward), FA_CASE(one_stage_v_in_registers), FA_CASE(packed_keys_backward),
             FA_CASE(score_options), FA_CASE(dq_padding_columns), FA_CASE(warpgroup_backward_fallback))
