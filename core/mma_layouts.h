/* The matrix-instruction layouts the OpenCL matrix-unit kernels are built
 * for (kernels_cl/mma_<name>.h): one table for the planner, the OpenCL
 * backend and the tests, which check it against the kernels' own macros
 * (tests/test_mma_layouts.c). Plain C, no vendor headers. */
#ifndef FA_MMA_LAYOUTS_H
#define FA_MMA_LAYOUTS_H

#include "flashattn.h"

typedef enum fa_mma_layout {
    FA_MMA_LAYOUT_NONE = 0,
    FA_MMA_LAYOUT_NVIDIA = 1,     /* mma.sync m16n8k16, 32 lanes */
    FA_MMA_LAYOUT_INTEL = 2,      /* DPAS 8x8x16 (Xe-HPG), sub-groups of 8 */
    FA_MMA_LAYOUT_AMD_MFMA = 3,   /* MFMA 32x32x8 (CDNA2/3), 64 lanes */
    FA_MMA_LAYOUT_AMD_WMMA = 4,   /* WMMA 16x16x16 (RDNA3), 32 lanes */
    FA_MMA_LAYOUT_AMD_MFMA16 = 5, /* MFMA 16x16x16 (CDNA2/3), 64 lanes */
    FA_MMA_LAYOUT_COUNT = 6
} fa_mma_layout;

/* A device's matrix units take at most this many layouts (CDNA: both MFMA
 * shapes). */
#define FA_MMA_MAX_LAYOUTS 2

typedef struct fa_mma_layout_info {
    const char *name;           /* "nvidia", "intel", "amd-mfma", "amd-wmma", "amd-mfma16" */
    const char *macro;          /* the build option that selects it */
    const char *header;         /* its kernel source, "kernels_cl/mma_nvidia.h" */
    /* The layout whose matrix shape a device with these matrix units
     * reports (matrix_m/n/k): itself, or, for a second shape of the same
     * units, the first (amd-mfma16: amd-mfma). */
    fa_mma_layout family;
    int m, n, k;                /* the layer's product: C (m x n) += A (m x k) B (k x n) */
    int sub_group;              /* lanes that run one instruction */
    int a_words, b_words;       /* 32-bit words of an A / B fragment per lane */
    int c_elems;                /* fp32 accumulators of a C fragment per lane */
    int c_rows;                 /* distinct rows among them */
    int c2a_regs;               /* accumulators become A operands in registers */
    int c2a_exchange;           /* ... through an exchange between lanes (FA_C2A_LANE) */
    /* fp32 words of fragments a lane may hold (forward, backward) without
     * spilling, from the register files (255 registers a thread on
     * NVIDIA; 128 a lane at SIMD8 on Intel; 512 VGPRs and AGPRs on CDNA;
     * 256 on RDNA3 in wave32), room left for addresses; the compile checks
     * (tests/test_opencl_compile.c) hold them to the compilers. */
    int fwd_budget, bwd_budget;
} fa_mma_layout_info;

/* NULL for FA_MMA_LAYOUT_NONE and out-of-range values. */
const fa_mma_layout_info *fa_mma_layout_get(fa_mma_layout layout);
/* By name ("amd-mfma"); FA_MMA_LAYOUT_NONE when none has it. */
fa_mma_layout fa_mma_layout_named(const char *name);
/* The layout family an OpenCL device's matrix units take: by its
 * matrix_m/n/k; FA_MMA_LAYOUT_NONE for other backends and devices without
 * them. */
fa_mma_layout fa_mma_layout_of(const fa_device_desc *dev);
/* Every layout of that family, the family first: the layouts the planner
 * may give the device's plans. Returns how many (0 .. FA_MMA_MAX_LAYOUTS). */
int fa_mma_layouts_of(const fa_device_desc *dev, fa_mma_layout out[FA_MMA_MAX_LAYOUTS]);

#endif
