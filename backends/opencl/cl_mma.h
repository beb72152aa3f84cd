/* The OpenCL backend's matrix-unit kernels (kernels_cl/fwd_mma.cl,
 * bwd_mma.cl): which fragment layers a device builds, the sources and build
 * options of a pass, and the check of a plan's tiles against the device. */
#ifndef FA_CL_MMA_H
#define FA_CL_MMA_H

#include "cl_backend.h"
#include "planner_cl_mma.h"

/* The device's matrix units: their layout family (FA_MMA_LAYOUT_NONE:
 * none; a plan's geometry names the layout of the family it runs) and, in
 * *emulated (may be NULL), whether the layers run in plain OpenCL C. */
fa_mma_layout fa_cl_mma_layer(const fa_cl_context *ctx, int *emulated);

/* Whether the kernels run a plan's MMA tiles on the context's device
 * (layout, work-group, registers, local memory with the emulated layer's
 * scratch); fills *g. */
fa_status fa_cl_mma_check(const fa_cl_context *ctx, const fa_attention_desc *d, fa_pass pass,
                          const fa_kernel_plan *kp, fa_cl_mma_geometry *g);

/* The local memory an emulated layer's kernels add to the planner's
 * figure (fa_cl_mma_geometry.local_mem) for a work-group of `warps`
 * sub-groups of a layout; 0 on native layers. */
size_t fa_cl_mma_extra_local(const fa_cl_context *ctx, fa_mma_layout layout, int warps);

/* The program of a matrix-unit kernel file in a layout: common.h, the
 * layer's headers, mma_common.h (NVIDIA's layer: then wgmma_nvidia.h), then
 * the files given (in order). Returns
 * the number of paths written to paths[] (at most cap), 0 when they do not
 * fit. */
int fa_cl_mma_sources(fa_mma_layout layout, const char *const *files, int count, const char **paths, int cap);

/* Build options of a layout (emulated or not) and a work-group of `warps`
 * sub-groups (" -DWARPS=4 -DFA_MMA_NVIDIA ..."), appended to out. */
fa_status fa_cl_mma_options(fa_mma_layout layout, int emulated, int warps, char *out, size_t size);

#endif
