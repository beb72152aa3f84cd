/* Which matrix-unit layer (core/mma_layouts.h) a GPU's OpenCL runtime
 * reaches, from what the runtime reports of it: plain C, so that the rules
 * are tested on the host for devices this machine does not have
 * (tests/test_cl_vendors.c). backends/opencl/cl_device.c gathers the
 * facts. */
#ifndef FA_MMA_VENDORS_H
#define FA_MMA_VENDORS_H

#include "mma_layouts.h"

#include <stddef.h>

#define FA_PCI_VENDOR_AMD 0x1002u
#define FA_PCI_VENDOR_NVIDIA 0x10deu
#define FA_PCI_VENDOR_INTEL 0x8086u

typedef struct fa_gpu_facts {
    unsigned vendor_id;      /* CL_DEVICE_VENDOR_ID */
    const char *arch;        /* "sm_90", "gfx90a", "xe-hpg"; "" unknown */
    int wave;                /* NVIDIA's warp, AMD's wavefront; 0 unknown */
    int intel_sub_group_8;   /* Intel: sub-groups of 8 offered (cl_intel_required_subgroup_size) */
    int intel_matrix_mad;    /* cl_intel_subgroup_matrix_multiply_accumulate */
    unsigned intel_ip;       /* CL_DEVICE_IP_VERSION_INTEL (a cl_version); 0 unknown */
} fa_gpu_facts;

/* The layout family of the GPU's matrix units, and their dense fp16/bf16
 * rate in FLOPs per clock and compute unit (as OpenCL counts them: SMs,
 * CUs, Intel EUs); FA_MMA_LAYOUT_NONE where no layer of ours runs them.
 * flops may be NULL. */
fa_mma_layout fa_gpu_matrix_units(const fa_gpu_facts *f, double *flops);

/* Intel's architecture name for an IP version (CL_DEVICE_IP_VERSION_INTEL:
 * "xe-hpg" for 12.55, "xe-hpc", "xe-lpg", "xe2"; "ip12.10.0" for others),
 * into out. */
void fa_intel_arch_name(unsigned ip, char *out, size_t size);

#endif
