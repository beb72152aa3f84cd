/* Which matrix-unit layer an OpenCL GPU gets from what its runtime reports
 * (core/mma_vendors.c): the rules for GPUs this machine does not have,
 * from the facts their drivers give (vendor ID, NVIDIA's compute
 * capability, AMD's gfx name and wavefront, Intel's extension, sub-group
 * sizes and IP version). */
#include "harness.h"
#include "mma_vendors.h"

#include <string.h>

static fa_gpu_facts facts(unsigned vendor, const char *arch, int wave) {
    fa_gpu_facts f;
    memset(&f, 0, sizeof f);
    f.vendor_id = vendor;
    f.arch = arch;
    f.wave = wave;
    return f;
}

/* A cl_version: major << 22 | minor << 12 | patch. */
static unsigned ip(unsigned major, unsigned minor, unsigned patch) { return major << 22 | minor << 12 | patch; }

FA_TEST(nvidia_from_compute_capability) {
    double flops = -1.0;
    fa_gpu_facts f = facts(FA_PCI_VENDOR_NVIDIA, "sm_90", 32);
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_NVIDIA && flops == 4096.0);
    f.arch = "sm_80";
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_NVIDIA && flops == 2048.0);
    f.arch = "sm_86";
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_NVIDIA && flops == 1024.0);
    /* Volta and Turing have no m16n8k16 with bf16: the FMA kernels. */
    f.arch = "sm_75";
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_NONE && flops == 0.0);
    f.arch = "";
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
}

FA_TEST(amd_from_gfx_name_and_wavefront) {
    double flops = 0.0;
    fa_gpu_facts f = facts(FA_PCI_VENDOR_AMD, "gfx90a", 64);
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_AMD_MFMA && flops == 1024.0);
    f.arch = "gfx942";
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_AMD_MFMA && flops == 2048.0);
    f.arch = "gfx1100";
    f.wave = 32;
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_AMD_WMMA && flops == 512.0);
    /* RDNA3 in wave64 and CDNA in wave32 are not the layers' wavefronts. */
    f.wave = 64;
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    f = facts(FA_PCI_VENDOR_AMD, "gfx90a", 32);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    /* CDNA1 (no bf16 _1k forms), RDNA2 (no matrix units). */
    f = facts(FA_PCI_VENDOR_AMD, "gfx908", 64);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    f = facts(FA_PCI_VENDOR_AMD, "gfx1030", 32);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
}

FA_TEST(intel_from_extension_sub_groups_and_ip) {
    double flops = 0.0;
    fa_gpu_facts f = facts(FA_PCI_VENDOR_INTEL, "", 0);
    f.intel_matrix_mad = 1;
    f.intel_sub_group_8 = 1;
    /* No IP version reported: taken at the extension's word. */
    CHECK(fa_gpu_matrix_units(&f, &flops) == FA_MMA_LAYOUT_INTEL && flops == 128.0);
    f.intel_ip = ip(12, 55, 8); /* Xe-HPG (DG2) */
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_INTEL);
    f.intel_ip = ip(12, 71, 4); /* Xe-LPG with XMX */
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_INTEL);
    /* Xe-HPC and Xe2 run DPAS at sub-groups of 16: another layout. */
    f.intel_ip = ip(12, 60, 7);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    f.intel_ip = ip(20, 1, 0);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    /* Without the extension or sub-groups of 8, no layer. */
    f.intel_ip = 0;
    f.intel_sub_group_8 = 0;
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    f.intel_sub_group_8 = 1;
    f.intel_matrix_mad = 0;
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
}

FA_TEST(unknown_vendors_and_null) {
    fa_gpu_facts f = facts(0x1234u, "sm_90", 32);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    /* The rules go by vendor: an AMD name on an NVIDIA ID is no layer. */
    f = facts(FA_PCI_VENDOR_NVIDIA, "gfx90a", 64);
    CHECK(fa_gpu_matrix_units(&f, NULL) == FA_MMA_LAYOUT_NONE);
    double flops = -1.0;
    CHECK(fa_gpu_matrix_units(NULL, &flops) == FA_MMA_LAYOUT_NONE && flops == 0.0);
}

FA_TEST(intel_arch_names) {
    char name[32];
    fa_intel_arch_name(ip(12, 55, 8), name, sizeof name);
    CHECK(strcmp(name, "xe-hpg") == 0);
    fa_intel_arch_name(ip(12, 60, 7), name, sizeof name);
    CHECK(strcmp(name, "xe-hpc") == 0);
    fa_intel_arch_name(ip(12, 70, 4), name, sizeof name);
    CHECK(strcmp(name, "xe-lpg") == 0);
    fa_intel_arch_name(ip(20, 4, 4), name, sizeof name);
    CHECK(strcmp(name, "xe2") == 0);
    fa_intel_arch_name(ip(12, 10, 0), name, sizeof name);
    CHECK(strcmp(name, "ip12.10.0") == 0);
    char tiny[4];
    fa_intel_arch_name(ip(12, 55, 8), tiny, sizeof tiny);
    CHECK(strcmp(tiny, "xe-") == 0);
}

FA_TEST_MAIN(FA_CASE(nvidia_from_compute_capability), FA_CASE(amd_from_gfx_name_and_wavefront),
             FA_CASE(intel_from_extension_sub_groups_and_ip), FA_CASE(unknown_vendors_and_null),
             FA_CASE(intel_arch_names))
