/* NVIDIA's OpenCL compiler writes PTX for ".target sm_90" on Hopper (also
 * with -cl-nv-arch sm_90a), and ptxas refuses the warpgroup instructions
 * (wgmma) there: they need sm_90a. A kernel that uses them writes each such
 * line as a PTX comment, FA_PTX_SM90A_MARK followed by the instruction
 * (kernels_cl/mma_nvidia.h, FA_SM90A), operands substituted like any inline
 * assembly; the program built from source then gives its PTX, which
 * fa_ptx_unmask_sm90a turns into the program meant, to be built again as a
 * binary (backends/opencl/cl_build.c). */
#ifndef FA_PTX_PATCH_H
#define FA_PTX_PATCH_H

#include "flashattn.h"

#include <stddef.h>

#define FA_PTX_SM90A_MARK "// @sm_90a "

/* The PTX text ptx (size bytes, not necessarily terminated) with every
 * FA_PTX_SM90A_MARK removed and its ".target sm_9X" directive retargeted to
 * sm_9Xa, malloc'ed and NUL-terminated into *out (*out_size bytes without
 * the NUL). FA_ERR_COMPILE where the text has no such target directive (not
 * NVIDIA's PTX for a Hopper-class device), FA_ERR_OUT_OF_MEMORY. */
fa_status fa_ptx_unmask_sm90a(const char *ptx, size_t size, char **out, size_t *out_size);

#endif
