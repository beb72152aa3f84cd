/* The matrix-instruction layouts of the OpenCL matrix-unit kernels
 * (mma_layouts.h). The figures are the instructions' (PTX ISA m16n8k16;
 * cl_intel_subgroup_matrix_multiply_accumulate at sub-group size 8; AMD's
 * CDNA and RDNA3 ISA guides for v_mfma_f32_32x32x8 and v_wmma_f32_16x16x16)
 * and must equal the FA_* macros of kernels_cl/mma_<name>.h. */
#include "mma_layouts.h"

#include <stddef.h>
#include <string.h>

static const fa_mma_layout_info layouts[FA_MMA_LAYOUT_COUNT] = {
    [FA_MMA_LAYOUT_NVIDIA] = {"nvidia", "FA_MMA_NVIDIA", "kernels_cl/mma_nvidia.h", 16, 8, 16, 32, 4, 2, 4, 2, 1,
                              192, 176},
    [FA_MMA_LAYOUT_INTEL] = {"intel", "FA_MMA_INTEL", "kernels_cl/mma_intel.h", 8, 8, 16, 8, 8, 8, 8, 8, 0, 128, 112},
    [FA_MMA_LAYOUT_AMD_MFMA] = {"amd-mfma", "FA_MMA_AMD_MFMA", "kernels_cl/mma_amd_mfma.h", 32, 32, 8, 64, 2, 2, 16,
                                16, 0, 224, 224},
    [FA_MMA_LAYOUT_AMD_WMMA] = {"amd-wmma", "FA_MMA_AMD_WMMA", "kernels_cl/mma_amd_wmma.h", 16, 16, 16, 32, 8, 8, 8, 8,
                                0, 192, 176},
};

const fa_mma_layout_info *fa_mma_layout_get(fa_mma_layout layout) {
    if ((int)layout <= FA_MMA_LAYOUT_NONE || layout >= FA_MMA_LAYOUT_COUNT) return NULL;
    return &layouts[layout];
}

fa_mma_layout fa_mma_layout_named(const char *name) {
    if (!name) return FA_MMA_LAYOUT_NONE;
    for (int i = 1; i < FA_MMA_LAYOUT_COUNT; i++)
        if (strcmp(layouts[i].name, name) == 0) return (fa_mma_layout)i;
    return FA_MMA_LAYOUT_NONE;
}

fa_mma_layout fa_mma_layout_of(const fa_device_desc *dev) {
    if (!dev || dev->backend != FA_BACKEND_OPENCL || !(dev->matrix_flops_per_clock_cu > 0.0)) return FA_MMA_LAYOUT_NONE;
    for (int i = 1; i < FA_MMA_LAYOUT_COUNT; i++)
        if (dev->matrix_m == layouts[i].m && dev->matrix_n == layouts[i].n && dev->matrix_k == layouts[i].k)
            return (fa_mma_layout)i;
    return FA_MMA_LAYOUT_NONE;
}
