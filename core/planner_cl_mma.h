/* OpenCL plans on matrix units (core/planner_cl_mma.c): the geometry of
 * kernels_cl/fwd_mma.cl and bwd_mma.cl for a tile, shared by the planner,
 * the OpenCL backend (its build options) and the tests. */
#ifndef FA_PLANNER_CL_MMA_H
#define FA_PLANNER_CL_MMA_H

#include "flashattn.h"
#include "mma_layouts.h"

#include <stddef.h>
#include <stdint.h>

/* What a tile and micro-tile mean to the kernels. */
typedef struct fa_cl_mma_geometry {
    fa_mma_layout layout;
    int warps;        /* sub-groups of the work-group (forward; dK/dV backward) */
    int strips;       /* strips of m rows a sub-group owns: queries forward, keys backward */
    int q_regs;       /* forward: Q's fragments stay in registers (QREG) */
    int stages;       /* backward: buffers of Q and dO (2: the next query tile loads during this one) */
    int v_regs;       /* backward: V's fragments stay in registers (VREG; two stages, or NVIDIA's layout) */
    int k_packed;     /* backward: K's fragments read from a packed copy in the workspace, not a
                         local tile (KPACK; with v_regs, where K's tile does not fit either) */
    int q_chunk;      /* backward: queries of a step computed at a time (QC; br: the whole tile) */
    int dq_unit;      /* backward with dQ atomics: head-dim n-tiles of a unit of dQ += dS K
                         (DQ_UNIT; 0: the kernel's own choice) */
    int d_pad;        /* head_dim padded to whole fragments */
    int dq_warps;     /* backward, deterministic: sub-groups of the dQ kernel,
                         one strip of queries each */
    size_t local_mem; /* bytes the pass's largest kernel declares on real
                         matrix units (fa_cl_mma_scratch_bytes aside) */
} fa_cl_mma_geometry;

/* Whether a problem runs on the device's matrix units through OpenCL: an
 * OpenCL device whose matrix shape is a known layout, fp16 or bf16. */
int fa_cl_mma_applies(const fa_device_desc *dev, const fa_attention_desc *desc);
/* Whether some micro-tile runs a br x bc tile in one stage (local memory
 * aside). */
int fa_cl_mma_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc);

/* fp32 words a lane may hold past a layout's backward budget: 0 for the
 * planner; fa-cl-mma-sweep raises it to time tiles the register model
 * refuses (NVIDIA's compiler then says whether they spill). */
extern int fa_cl_mma_bwd_slack;

/* The geometry of a micro-tile (tr x tc: the scores a work-item holds, as
 * for SIMT plans) in `stages` stages (1; 1 or 2 backward), which also
 * names the layout among the device's (fa_mma_layouts_of: the MFMA shapes
 * differ in it); 0 when the kernels cannot run it on the device (layout,
 * work-group, registers; local memory aside). g may be NULL. */
int fa_cl_mma_geometry_of(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                          int tr, int tc, int stages, fa_cl_mma_geometry *g);
/* Local memory (bytes) of a pass's kernels on real matrix units for the
 * br x bc tile: the least any layout of the device takes (a plan's own is
 * its geometry's local_mem; the emulated layouts add their scratch,
 * fa_cl_mma_scratch_bytes) in `stages` stages; 0 for a stage count the
 * pass does not run. */
size_t fa_cl_mma_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                           int stages);
/* A micro-tile's figure: its geometry's local_mem, 0 where it has none. */
size_t fa_cl_mma_tile_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br,
                                int bc, int tr, int tc, int stages);
/* Whether the planner may take a micro-tile fa_cl_mma_geometry_of accepts
 * in one stage: 0 where a layout's measured preference sets it aside, which
 * the IO model's order cannot express (planner_cl_mma.c: NVIDIA's forward
 * in work-groups of at most four sub-groups; NVIDIA's backward with V's
 * fragments in registers in at most four, its queries in chunks only
 * there). Every tile of Intel's and AMD's layouts. Forced plans (the OpenCL
 * suite, fa-cl-mma-sweep) still run the others. */
int fa_cl_mma_preferred(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                        int tr, int tc);
/* Bytes of one key tile's packed K and V (a slot) for key tiles of bc; 0
 * without k_packed. */
size_t fa_cl_mma_packed_slot_bytes(const fa_cl_mma_geometry *g, int bc);
/* Workspace bytes of a backward geometry's packed K (0 without k_packed)
 * for key tiles of bc over total_k keys of the batch; FA_ERR_OUT_OF_MEMORY
 * where the size overflows. */
fa_status fa_cl_mma_packed_k_bytes(const fa_cl_mma_geometry *g, const fa_attention_desc *desc, int bc,
                                   int64_t total_k, size_t *bytes);
/* The local scratch an emulated layout's kernels add: warps sub-groups. */
size_t fa_cl_mma_scratch_bytes(fa_mma_layout layout, int warps);

#endif
