/* The matrix-instruction layouts of the OpenCL matrix-unit kernels
 * (mma_layouts.h). The figures are the layers' (PTX ISA m16n8k16;
 * cl_intel_subgroup_matrix_multiply_accumulate at sub-group size 8; AMD's
 * CDNA and RDNA3 ISA guides for v_mfma_f32_32x32x8, 16x16x16 and
 * v_wmma_f32_16x16x16, which the Intel and AMD layers run on swapped
 * operands) and must equal the FA_* macros of kernels_cl/mma_<name>.h. */
#include "mma_layouts.h"

#include <stddef.h>
#include <string.h>

static const fa_mma_layout_info layouts[FA_MMA_LAYOUT_COUNT] = {
    /* NVIDIA's backward budget holds V's fragments beside 32 queries in
     * chunks of 16 at head_dim 128 (184 words: 240-251 registers on an
     * H200, no spill); tiles with V's tile keep to 176 (planner_cl_mma.c,
     * fa_cl_mma_preferred). */
    [FA_MMA_LAYOUT_NVIDIA] = {"nvidia", "FA_MMA_NVIDIA", "kernels_cl/mma_nvidia.h", FA_MMA_LAYOUT_NVIDIA, 16, 8, 16,
                              32, 4, 2, 4, 2, 1, 0, 192, 184},
    [FA_MMA_LAYOUT_INTEL] = {"intel", "FA_MMA_INTEL", "kernels_cl/mma_intel.h", FA_MMA_LAYOUT_INTEL, 8, 8, 16, 8, 8,
                             8, 8, 1, 1, 0, 112, 96},
    [FA_MMA_LAYOUT_AMD_MFMA] = {"amd-mfma", "FA_MMA_AMD_MFMA", "kernels_cl/mma_amd_mfma.h", FA_MMA_LAYOUT_AMD_MFMA,
                                32, 32, 8, 64, 2, 2, 16, 1, 1, 0, 224, 224},
    /* RDNA3's forward budget is what clang-16 holds in gfx1100's 256 VGPRs
     * without spilling (tests/test_opencl_compile.c): 80 words at head_dim
     * 128 and 32 keys took 249-250 VGPRs, 96 words spilled. Its backward
     * spilled at every tile (80 to 4092 bytes of scratch): WMMA's A and B
     * operands hold 16 values a lane, which the word count leaves out, so
     * no backward tile is planned on it (budget 0) and RDNA3's backward
     * runs the FMA kernels until the kernel holds fewer operands. */
    [FA_MMA_LAYOUT_AMD_WMMA] = {"amd-wmma", "FA_MMA_AMD_WMMA", "kernels_cl/mma_amd_wmma.h", FA_MMA_LAYOUT_AMD_WMMA,
                                16, 16, 16, 32, 8, 8, 8, 1, 1, 1, 80, 0},
    [FA_MMA_LAYOUT_AMD_MFMA16] = {"amd-mfma16", "FA_MMA_AMD_MFMA16", "kernels_cl/mma_amd_mfma.h",
                                  FA_MMA_LAYOUT_AMD_MFMA, 16, 16, 16, 64, 2, 2, 4, 1, 1, 0, 224, 224},
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
        if (layouts[i].family == (fa_mma_layout)i && dev->matrix_m == layouts[i].m && dev->matrix_n == layouts[i].n &&
            dev->matrix_k == layouts[i].k)
            return (fa_mma_layout)i;
    return FA_MMA_LAYOUT_NONE;
}

int fa_mma_layouts_of(const fa_device_desc *dev, fa_mma_layout out[FA_MMA_MAX_LAYOUTS]) {
    const fa_mma_layout family = fa_mma_layout_of(dev);
    if (family == FA_MMA_LAYOUT_NONE) return 0;
    int n = 0;
    out[n++] = family;
    for (int i = 1; i < FA_MMA_LAYOUT_COUNT && n < FA_MMA_MAX_LAYOUTS; i++)
        if (i != (int)family && layouts[i].family == family) out[n++] = (fa_mma_layout)i;
    return n;
}
