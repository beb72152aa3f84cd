/* Queries of the attention half of the OpenCL backend beyond the backend
 * interface, for tests and tools. */
#ifndef FA_CL_ATTENTION_H
#define FA_CL_ATTENTION_H

#include "cl_backend.h"

/* Local memory (bytes, CL_KERNEL_LOCAL_MEM_SIZE) of the largest kernel of a
 * pass as the driver compiled it for a prepared plan. */
fa_status fa_cl_plan_kernel_local_mem(void *plan_impl, fa_pass pass, size_t *bytes);

/* Whether a plan's forward or backward is built with the warpgroup
 * products (kernels_cl/fwd_mma.cl FA_FWD_WGMMA, bwd_mma.cl FA_BWD_WGMMA;
 * 0 where the pass cannot be prepared).
 * Their tiles start on 1024-byte boundaries, for which NVIDIA's compiler
 * pads the local memory before them: the kernel then declares up to
 * FA_CL_WGMMA_ALIGN_SLACK bytes more than the planner's figure (1024 more
 * at both tiles measured on an H200; the planner's tiles there use 23-33
 * KiB of the 48). */
int fa_cl_plan_fwd_wgmma(void *plan_impl);
int fa_cl_plan_bwd_wgmma(void *plan_impl);
#define FA_CL_WGMMA_ALIGN_SLACK 1024

#endif
