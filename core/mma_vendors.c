/* The matrix-unit layer of a GPU, from its OpenCL facts (mma_vendors.h).
 *
 * Rates (dense fp16/bf16 with fp32 accumulation, FLOPs per clock and
 * compute unit), from the vendors' architecture documents:
 * - NVIDIA, per SM: GA100 (sm_80) 2048; GA10x and AD10x (sm_86, sm_87,
 *   sm_89) 1024; GH100 (sm_90) 4096, assumed for later ones, whose
 *   mma.sync is what OpenCL reaches.
 * - AMD, per CU: CDNA2 (gfx90a) 1024; CDNA3 (gfx94x) 2048; CDNA4 (gfx95x)
 *   4096; RDNA3 (gfx11) 512 (WMMA).
 * - Intel, per EU (OpenCL's compute unit): XMX of Xe-HPG 128 (an Arc A770:
 *   138 TFLOP/s from 512 EUs at 2.1 GHz).
 *
 * Layers: NVIDIA from compute capability 8.0 (mma.sync m16n8k16); AMD CDNA2
 * on (gfx908, CDNA1, lacks the bf16 _1k forms) on 64-wide wavefronts, and
 * RDNA3 (gfx11; RDNA4 lays its WMMA operands out otherwise) on 32-wide
 * ones, as the HIP layers (core/planner_hip_mma.c); Intel where the
 * built-ins run at sub-group size 8: Xe-HPG and Xe-LPG with XMX (IP
 * 12.55 to 12.59, 12.70 to 12.74). Xe-HPC (12.60) and Xe2 (20.x) run them
 * at sub-group size 16 only, with another layout (8x16x16), for which no
 * layer exists; an Intel device that does not report its IP version is
 * taken at its word (the extension and sub-groups of 8). */
#include "mma_vendors.h"

#include <stdio.h>
#include <string.h>

static int number_at(const char *s, int *v) {
    int n = 0, x = 0;
    while (s[n] >= '0' && s[n] <= '9' && n < 6) x = 10 * x + (s[n++] - '0');
    *v = x;
    return n;
}

static fa_mma_layout nvidia_units(const fa_gpu_facts *f, double *flops) {
    int sm = 0;
    if (strncmp(f->arch, "sm_", 3) != 0 || number_at(f->arch + 3, &sm) < 2 || sm < 80 || f->wave != 32)
        return FA_MMA_LAYOUT_NONE;
    *flops = sm == 80 ? 2048.0 : sm < 90 ? 1024.0 : 4096.0;
    return FA_MMA_LAYOUT_NVIDIA;
}

static fa_mma_layout amd_units(const fa_gpu_facts *f, double *flops) {
    const char *a = f->arch;
    if (strcmp(a, "gfx90a") == 0 || strncmp(a, "gfx94", 5) == 0 || strncmp(a, "gfx95", 5) == 0) {
        if (f->wave != 64) return FA_MMA_LAYOUT_NONE;
        *flops = a[4] == '0' ? 1024.0 : a[4] == '4' ? 2048.0 : 4096.0;
        return FA_MMA_LAYOUT_AMD_MFMA;
    }
    if (strncmp(a, "gfx11", 5) == 0 && strlen(a) >= 7) {
        if (f->wave != 32) return FA_MMA_LAYOUT_NONE;
        *flops = 512.0;
        return FA_MMA_LAYOUT_AMD_WMMA;
    }
    return FA_MMA_LAYOUT_NONE;
}

static fa_mma_layout intel_units(const fa_gpu_facts *f, double *flops) {
    if (!f->intel_matrix_mad || !f->intel_sub_group_8) return FA_MMA_LAYOUT_NONE;
    if (f->intel_ip) {
        const unsigned major = f->intel_ip >> 22, minor = (f->intel_ip >> 12) & 0x3ffu;
        const int sub_group_8 = major == 12 && ((minor >= 55 && minor <= 59) || (minor >= 70 && minor <= 74));
        if (!sub_group_8) return FA_MMA_LAYOUT_NONE;
    }
    *flops = 128.0;
    return FA_MMA_LAYOUT_INTEL;
}

fa_mma_layout fa_gpu_matrix_units(const fa_gpu_facts *f, double *flops) {
    double rate = 0.0;
    fa_mma_layout l = FA_MMA_LAYOUT_NONE;
    if (f && f->arch) {
        if (f->vendor_id == FA_PCI_VENDOR_NVIDIA) l = nvidia_units(f, &rate);
        if (f->vendor_id == FA_PCI_VENDOR_AMD) l = amd_units(f, &rate);
        if (f->vendor_id == FA_PCI_VENDOR_INTEL) l = intel_units(f, &rate);
    }
    if (flops) *flops = l == FA_MMA_LAYOUT_NONE ? 0.0 : rate;
    return l;
}

void fa_intel_arch_name(unsigned ip, char *out, size_t size) {
    const unsigned major = ip >> 22, minor = (ip >> 12) & 0x3ffu, rev = ip & 0xfffu;
    const char *name = NULL;
    if (major == 12 && minor >= 55 && minor <= 59) name = "xe-hpg";
    if (major == 12 && minor >= 60 && minor <= 69) name = "xe-hpc";
    if (major == 12 && minor >= 70 && minor <= 74) name = "xe-lpg";
    if (major == 20) name = "xe2";
    if (name)
        snprintf(out, size, "%s", name);
    else
        snprintf(out, size, "ip%u.%u.%u", major, minor, rev);
}
