/* HIP plans on matrix cores (core/planner_hip_mma.c): the layers of the
 * HIP matrix-core kernels (kernels_hip/mma_*.h) and the geometry of
 * kernels_hip/fwd_mma.hip and bwd_mma.hip for a tile, shared by the
 * planner, the HIP backend (its build options) and the tests. Plain C, no
 * vendor headers. */
#ifndef FA_PLANNER_HIP_MMA_H
#define FA_PLANNER_HIP_MMA_H

#include "flashattn.h"

#include <stddef.h>

typedef enum fa_hip_mma_layer {
    FA_HIP_MMA_NONE = 0,
    FA_HIP_MMA_NVIDIA = 1, /* mma.sync m16n8k16, 32 lanes (the HIP-on-CUDA mapping) */
    FA_HIP_MMA_MFMA32 = 2, /* v_mfma_f32_32x32x8{f16,bf16_1k}, 64 lanes (CDNA2/3) */
    FA_HIP_MMA_MFMA16 = 3, /* v_mfma_f32_16x16x16{f16,bf16_1k}, 64 lanes (CDNA2/3) */
    FA_HIP_MMA_WMMA = 4,   /* v_wmma_f32_16x16x16_{f16,bf16}, 32 lanes (RDNA3) */
    FA_HIP_MMA_LAYER_COUNT = 5
} fa_hip_mma_layer;

/* What the kernels' layer headers say of their instruction (the host test
 * holds the two to each other). */
typedef struct fa_hip_mma_layer_info {
    const char *name;           /* FA_LAYER_NAME of the header */
    const char *header;         /* "kernels_hip/mma_nvidia.h" */
    const char *define;         /* the build option that selects the shape, or NULL */
    int m, n, k;                /* C (m x n) += A (m x k) B (k x n) */
    int lanes;                  /* wavefront width that runs one instruction */
    int own_n;                  /* 1: a work-group's own rows run along n (FA_OWN_N) */
    int a_elems, b_elems;       /* 16-bit operand elements per lane */
    int c_elems;                /* fp32 accumulators per lane */
    int own_slots;              /* own rows per lane in one accumulator (FA_OWN_SLOTS) */
    /* fp32 words of fragments (operands held across a loop, scores,
     * accumulators) one lane may keep, forward and backward, calibrated
     * against the compilers (tests/test_hip_compile.c: no spills). */
    int fwd_budget, bwd_budget;
    /* A second budget of the dK/dV kernel for problems without the
     * options that take registers of their own (fa_hip_mma_lean), in
     * words that count a score one and a half times (S and dP, then P and
     * dS as operands while some of them still live); 0: none. A tile runs
     * where either budget holds it. */
    int bwd_budget_lean;
    /* The most wavefronts of the dK/dV kernel the planner prefers at
     * head_dim 64 and below (0: no preference; fa_hip_mma_preferred). */
    int bwd_small_dim_warps;
    /* 1: a forward tile runs with two strips a wavefront wherever they fit
     * (every K and V operand the wavefront loads then serves two products:
     * mma.sync's operands come through shared memory, whose bandwidth the
     * tensor cores outrun at one product a load). */
    int prefer_strips;
} fa_hip_mma_layer_info;

/* NULL for FA_HIP_MMA_NONE and out-of-range values. */
const fa_hip_mma_layer_info *fa_hip_mma_layer_get(fa_hip_mma_layer layer);

/* The layers a device's matrix units run a dtype on (by architecture:
 * "sm_80" and later through the mapping, gfx90a / gfx94x / gfx95x CDNA,
 * gfx11 RDNA3), in the planner's order; 0 when none (other devices,
 * fp32). */
int fa_hip_mma_layers(const fa_device_desc *dev, fa_dtype dtype, fa_hip_mma_layer out[2]);

/* Whether a problem runs without dropout, windows, block masks, varlen and
 * the score options (softcap, ALiBi, bias): the kernels then hold none of
 * their state, and the backward's bwd_budget_lean applies. */
int fa_hip_mma_lean(const fa_attention_desc *desc);

/* Whether a problem runs on the device's matrix cores through HIP. */
int fa_hip_mma_applies(const fa_device_desc *dev, const fa_attention_desc *desc);

typedef struct fa_hip_mma_geometry {
    fa_hip_mma_layer layer;
    int warps;                  /* wavefronts of the work-group (forward; dK/dV) */
    int strips;                 /* strips of own rows a wavefront owns */
    int q_local;                /* forward: Q operands read from local memory each key tile (Q_LOCAL) */
    int dq_warps;               /* backward: wavefronts of the deterministic dQ kernel */
} fa_hip_mma_geometry;

/* The geometry a micro-tile (tr x tc: the scores a work-item holds, as for
 * SIMT plans: forward query rows x keys, backward query rows x keys with
 * the keys the own rows) stands for; 0 when the kernels cannot run it on
 * the device (layer, shape, work-group, registers; local memory aside).
 * g may be NULL. */
int fa_hip_mma_geometry_of(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                           int tr, int tc, fa_hip_mma_geometry *g);
/* Whether some micro-tile runs a br x bc tile. */
int fa_hip_mma_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc);
/* Whether the planner takes a micro-tile that the kernels can run (a
 * preference the IO model cannot express): at head_dim 64 and below, a
 * layer's backward in at most its bwd_small_dim_warps wavefronts. 1 for
 * every tile without a geometry. */
int fa_hip_mma_preferred(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                         int tr, int tc);
/* Local memory (bytes) the pass's largest kernel takes for a kernel plan
 * (tile, micro-tile and, backward, stages: query tiles in flight, 1 or 2):
 * the forward kernel, or the dK/dV kernel; 0 when the plan has no
 * geometry on the device. */
size_t fa_hip_mma_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                            const fa_kernel_plan *kp);
/* Local memory (bytes) of the deterministic dQ kernel of a br x bc
 * backward tile. */
size_t fa_hip_mma_dq_local_mem(const fa_attention_desc *desc, int br, int bc);

#endif
