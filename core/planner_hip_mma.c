/* HIP plans on matrix cores: which layer of kernels_hip/ a device's matrix
 * units take, and what a tile and micro-tile mean to fwd_mma.hip and
 * bwd_mma.hip (wavefronts, strips of own rows, registers, local memory).
 * The planner (planner.c) enumerates tiles as for every family and asks
 * here whether one runs; the HIP backend asks for the geometry to build
 * the kernels.
 *
 * The micro-tile of an MMA plan is the scores a lane holds, as for SIMT
 * plans, so that (br / tr) * (bc / tc) is the work-group: per fragment a
 * lane holds c_elems scores on own_slots own rows. Forward the own rows are
 * queries: tr = own_slots * strips, tc = (bc / other side) * c_elems /
 * own_slots. Backward (the dK/dV kernel) they are keys: tc = own_slots *
 * strips, tr = (br / other side) * c_elems / own_slots. Layers differ in
 * these counts, so a micro-tile names its layer on a device (the CDNA
 * shapes: tc = bc / 2 for 32x32x8, bc / 4 for 16x16x16). */
#include "planner_hip_mma.h"

#include "desc.h"
#include "fa_internal.h"

#include <string.h>

/* Register budgets, in fp32 words of fragments a lane holds: forward per
 * strip the output accumulators, the scores, P as the next product's
 * operands (half a word a score; a whole word on RDNA3, whose operands
 * repeat in both half-wavefronts) and the Q operands (all of them held, or
 * one k-step's with Q_LOCAL); backward per strip dK and dV, S and dP, and
 * one k-step's K and V operands, or, in the deterministic dQ kernel, dQ
 * and three words a score. NVIDIA has 255 registers a thread; CDNA 512
 * (256 VGPRs and 256 AGPRs for the accumulators) at one wavefront a SIMD;
 * RDNA3 256 VGPRs in wave32, of which clang 15 (Debian's hipcc) gives a
 * kernel 128. Calibrated by tests/test_hip_compile.c, which compiles every
 * plan for each target and fails on spills (NVRTC 13.0 through the
 * mapping; hipcc of ROCm 5.2 for gfx90a, gfx940 and gfx1100): on NVIDIA
 * the dK/dV kernel spilled at 168 words (head_dim 32, 128 x 128 tiles,
 * every option) and the forward at 204 (head_dim 256, every option); on
 * gfx1100 the forward spilled at 48 (head_dim 32, every option), 56
 * (head_dim 64 with Q_LOCAL) and 64 (head_dim 32), so WMMA plans stop at
 * head_dim 32 forward with Q_LOCAL until a compiler gives gfx11 kernels
 * all 256 VGPRs. NVIDIA's backward has a second budget for problems
 * without the options that keep state of their own (fa_hip_mma_lean), in
 * words that count a score one and a half times: 240, where 64 x 128 at
 * head_dim 128 (232 words, 251-255 registers) and 32 x 128 in two strips
 * at head_dim 64 (240, 249-252) compiled without spilling, causal or not,
 * while two strips of 64 x 128 at head_dim 32 (272) spilled 80 bytes
 * (NVRTC 13.0, 2026-11-27). */
static const fa_hip_mma_layer_info layers[FA_HIP_MMA_LAYER_COUNT] = {
    [FA_HIP_MMA_NVIDIA] = {"nvidia", "kernels_hip/mma_nvidia.h", NULL, 16, 8, 16, 32, 0, 8, 4, 4, 2, 200, 160, 240, 4, 1},
    [FA_HIP_MMA_MFMA32] = {"mfma32", "kernels_hip/mma_cdna.h", "-DFA_MFMA32", 32, 32, 8, 64, 1, 4, 4, 16, 1, 256, 256, 0, 0, 0},
    [FA_HIP_MMA_MFMA16] = {"mfma16", "kernels_hip/mma_cdna.h", "-DFA_MFMA16", 16, 16, 16, 64, 1, 4, 4, 4, 1, 256, 256, 0, 0, 0},
    [FA_HIP_MMA_WMMA] = {"wmma", "kernels_hip/mma_rdna3.h", NULL, 16, 16, 16, 32, 1, 16, 16, 8, 1, 40, 40, 0, 0, 0},
};

static const int strip_counts[] = {1, 2};
static const int warp_counts[] = {1, 2, 4, 8};

const fa_hip_mma_layer_info *fa_hip_mma_layer_get(fa_hip_mma_layer layer) {
    if ((int)layer <= FA_HIP_MMA_NONE || layer >= FA_HIP_MMA_LAYER_COUNT) return NULL;
    return &layers[layer];
}

/* "sm_90" -> 90; 0 for other names. */
static int sm_number(const char *arch) {
    if (strncmp(arch, "sm_", 3) != 0) return 0;
    int v = 0;
    for (const char *c = arch + 3; *c >= '0' && *c <= '9'; c++) v = 10 * v + (*c - '0');
    return v;
}

int fa_hip_mma_layers(const fa_device_desc *dev, fa_dtype dtype, fa_hip_mma_layer out[2]) {
    if (!dev || dev->backend != FA_BACKEND_HIP || !(dev->matrix_flops_per_clock_cu > 0.0)) return 0;
    if (dtype != FA_DTYPE_F16 && dtype != FA_DTYPE_BF16) return 0;
    int n = 0;
    /* CDNA2 on (gfx908, CDNA1, lacks the bf16 _1k forms); RDNA3 only
     * (RDNA4's WMMA lays its operands out otherwise). */
    if (sm_number(dev->arch) >= 80) {
        out[n++] = FA_HIP_MMA_NVIDIA;
    } else if (strcmp(dev->arch, "gfx90a") == 0 || strncmp(dev->arch, "gfx94", 5) == 0 ||
               strncmp(dev->arch, "gfx95", 5) == 0) {
        out[n++] = FA_HIP_MMA_MFMA32;
        out[n++] = FA_HIP_MMA_MFMA16;
    } else if (strncmp(dev->arch, "gfx11", 5) == 0) {
        out[n++] = FA_HIP_MMA_WMMA;
    }
    /* The wavefront the kernels are built for must be the instruction's. */
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (layers[out[i]].lanes == dev->simd_width) out[kept++] = out[i];
    return kept;
}

int fa_hip_mma_lean(const fa_attention_desc *desc) {
    return desc && desc->dropout_p == 0.0f && !fa_desc_has_window(desc) && !desc->block_mask &&
           !desc->cu_seqlens_q && !fa_desc_option_in_use(desc);
}

int fa_hip_mma_applies(const fa_device_desc *dev, const fa_attention_desc *desc) {
    fa_hip_mma_layer l[2];
    return dev && desc && fa_hip_mma_layers(dev, desc->q.dtype, l) > 0;
}

static int own_side(const fa_hip_mma_layer_info *L) { return L->own_n ? L->n : L->m; }
static int other_side(const fa_hip_mma_layer_info *L) { return L->own_n ? L->m : L->n; }
static int own_op_elems(const fa_hip_mma_layer_info *L) { return L->own_n ? L->b_elems : L->a_elems; }
/* Scores a lane holds per own row of one fragment. */
static int others_per_lane(const fa_hip_mma_layer_info *L) { return L->c_elems / L->own_slots; }

static int in_list(int v, const int *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (list[i] == v) return 1;
    return 0;
}

/* Register words of the forward kernel's fragments (see the budgets). */
static int fwd_words(const fa_hip_mma_layer_info *L, int d, int bc, int strips, int q_local) {
    const int acc = (d / other_side(L)) * L->c_elems, scores = (bc / other_side(L)) * L->c_elems;
    const int p = (bc / L->k) * own_op_elems(L) / 2;
    const int q = q_local ? own_op_elems(L) / 2 : (d / L->k) * own_op_elems(L) / 2;
    return strips * (acc + scores + p + q);
}

/* Words a score takes beside its own for the score options' logit
 * (kernels_hip/common.h, fa_logit2), forward and backward: on NVIDIA,
 * where NVRTC holds the planned tiles at or near its 255 registers without
 * them (the forward at head_dim 128 on 128 keys takes 254), two forward
 * (one left the forward at head_dim 128 with every option, masks and
 * dropout 8 bytes of spill) and one backward, and Q's operands stay in
 * registers (with Q_LOCAL and the options it spilled far more); calibrated
 * by tests/test_hip_compile.c's nvidia_score_options. The AMD compilers fit
 * the options in the layers' budgets (amd_score_options): none. */
static int option_words(fa_hip_mma_layer layer, const fa_attention_desc *desc, fa_pass pass) {
    if (layer != FA_HIP_MMA_NVIDIA || !fa_desc_option_in_use(desc)) return 0;
    return pass == FA_PASS_FORWARD ? 2 : 1;
}

/* Whether a layer runs a tile with strips own strips a wavefront;
 * fills g. */
static int shape_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, fa_hip_mma_layer layer,
                    int br, int bc, int strips, fa_hip_mma_geometry *g) {
    const fa_hip_mma_layer_info *L = &layers[layer];
    const int d = desc->head_dim, own = own_side(L), other = other_side(L), acc = (d / other) * L->c_elems;
    const int own_rows = pass == FA_PASS_FORWARD ? br : bc, other_rows = pass == FA_PASS_FORWARD ? bc : br;
    if (d % L->k || d % other || other_rows % other || other_rows % L->k) return 0;
    if (own_rows % (strips * own)) return 0;
    const int warps = own_rows / (strips * own);
    if (!in_list(warps, warp_counts, FA_ARRAY_SIZE(warp_counts)) || warps * L->lanes > dev->max_work_group_size)
        return 0;
    const int scores = (other_rows / other) * L->c_elems, opt = option_words(layer, desc, pass);
    int dq_warps = 0, q_local = 0;
    if (pass == FA_PASS_FORWARD) {
        /* Q in registers where they hold it, else read from local memory;
         * without Q_LOCAL, Q comes in through the K and V tiles. */
        const int extra = opt * strips * scores;
        q_local = fwd_words(L, d, bc, strips, 0) + extra > L->fwd_budget || br > 2 * bc;
        if (q_local && opt) return 0;
        if (fwd_words(L, d, bc, strips, q_local) + extra > L->fwd_budget) return 0;
    } else {
        /* dQ = dS K from local memory (queries along m, head_dim along n),
         * and the deterministic dQ kernel's strips of queries. */
        if (br % L->m || d % L->n || br % own) return 0;
        dq_warps = br / own;
        if (dq_warps * L->lanes > dev->max_work_group_size) return 0;
        if (strips * (2 * acc + (2 + opt) * scores + own_op_elems(L)) > L->bwd_budget &&
            !(L->bwd_budget_lean && fa_hip_mma_lean(desc) &&
              strips * (2 * acc + 3 * scores + own_op_elems(L)) <= L->bwd_budget_lean))
            return 0;
        if (desc->deterministic && acc + (3 + opt) * (bc / other) * L->c_elems > L->bwd_budget) return 0;
    }
    if (g) {
        g->layer = layer;
        g->warps = warps;
        g->strips = strips;
        g->q_local = q_local;
        g->dq_warps = dq_warps;
    }
    return 1;
}

/* A shape with its strips, where the layer prefers two strips forward and
 * they fit: then only they. */
static int strips_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, fa_hip_mma_layer layer,
                     int br, int bc, int strips, fa_hip_mma_geometry *g) {
    if (strips == 1 && pass == FA_PASS_FORWARD && layers[layer].prefer_strips &&
        shape_ok(dev, desc, pass, layer, br, bc, 2, NULL))
        return 0;
    return shape_ok(dev, desc, pass, layer, br, bc, strips, g);
}

/* The micro-tile of a layer and strip count on a tile. */
static void micro_tile(const fa_hip_mma_layer_info *L, fa_pass pass, int br, int bc, int strips, int *tr, int *tc) {
    const int own = L->own_slots * strips;
    if (pass == FA_PASS_FORWARD) {
        *tr = own;
        *tc = bc / other_side(L) * others_per_lane(L);
    } else {
        *tr = br / other_side(L) * others_per_lane(L);
        *tc = own;
    }
}

int fa_hip_mma_geometry_of(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                           int tr, int tc, fa_hip_mma_geometry *g) {
    if (!dev || !desc || br <= 0 || bc <= 0 || tr <= 0 || tc <= 0) return 0;
    fa_hip_mma_layer list[2];
    const int n = fa_hip_mma_layers(dev, desc->q.dtype, list);
    for (int i = 0; i < n; i++)
        for (size_t s = 0; s < FA_ARRAY_SIZE(strip_counts); s++) {
            int want_tr, want_tc;
            micro_tile(&layers[list[i]], pass, br, bc, strip_counts[s], &want_tr, &want_tc);
            if (want_tr == tr && want_tc == tc && strips_ok(dev, desc, pass, list[i], br, bc, strip_counts[s], g))
                return 1;
        }
    return 0;
}

int fa_hip_mma_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc) {
    if (!dev || !desc) return 0;
    fa_hip_mma_layer list[2];
    const int n = fa_hip_mma_layers(dev, desc->q.dtype, list);
    for (int i = 0; i < n; i++)
        for (size_t s = 0; s < FA_ARRAY_SIZE(strip_counts); s++)
            if (strips_ok(dev, desc, pass, list[i], br, bc, strip_counts[s], NULL)) return 1;
    return 0;
}

/* NVIDIA at head_dim 64 and below: four wavefronts of two strips read a
 * quarter fewer operand bytes per product through shared memory than
 * eight of one (the K and V operands of a k-step serve twice the
 * queries' products) and leave room for two work-groups a
 * multiprocessor; CUDA's mma.sync backward plans four warps there for the
 * same reason (planner.c). */
int fa_hip_mma_preferred(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                         int tr, int tc) {
    fa_hip_mma_geometry g;
    if (pass != FA_PASS_BACKWARD || !fa_hip_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, &g)) return 1;
    const int limit = layers[g.layer].bwd_small_dim_warps;
    return !limit || desc->head_dim > 64 || g.warps <= limit;
}

/* 16-bit elements a row of a head_dim-wide tile takes (one 16-byte chunk
 * of padding, kernels_hip/mma_tiles.h LD), in bytes. */
static size_t tile_row_bytes(const fa_attention_desc *desc) { return 2 * ((size_t)desc->head_dim + 8); }

size_t fa_hip_mma_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                            const fa_kernel_plan *kp) {
    fa_hip_mma_geometry g;
    if (!kp || kp->stages < 1 || kp->stages > 2 || (pass == FA_PASS_FORWARD && kp->stages != 1) ||
        !fa_hip_mma_geometry_of(dev, desc, pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, &g))
        return 0;
    const size_t row = tile_row_bytes(desc), r = (size_t)kp->br, c = (size_t)kp->bc, st = (size_t)kp->stages;
    /* fwd_mma.hip: the Q tile with Q_LOCAL, the K and V tiles. */
    if (pass == FA_PASS_FORWARD) return ((g.q_local ? r : 0) + 2 * c) * row;
    /* bwd_mma.hip, fa_bwd_dkdv_mma: K, V tiles, Q and dO tiles a stage, dS
     * [query][key] (rows of bc + 8), L and D a stage. */
    return 2 * c * row + st * 2 * r * row + r * 2 * (c + 8) + st * 2 * r * 4;
}

size_t fa_hip_mma_dq_local_mem(const fa_attention_desc *desc, int br, int bc) {
    if (!desc || br <= 0 || bc <= 0 || desc->head_dim <= 0) return 0;
    return 2 * ((size_t)br + (size_t)bc) * tile_row_bytes(desc);
}
