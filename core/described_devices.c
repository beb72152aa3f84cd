/* Devices described by hand from their vendors' published figures, so the
 * planner can be exercised on hardware this machine does not have.
 *
 * Rates are per compute unit and clock: fp32 as 2 x FMA lanes, matrix as the
 * dense fp16/bf16 rate of the matrix units.
 * - H100 SXM: 132 SMs of 128 FP32 lanes; 4 tensor cores per SM, 2048 dense
 *   fp16 FMA per clock in all (989 TFLOP/s at 1830 MHz).
 * - MI250X, one of its two GCDs: 110 CUs; fp32 counted as packed FP32
 *   (95.7 TFLOP/s for both GCDs); MFMA fp16 1024 flops per clock per CU
 *   (383 TFLOP/s for both GCDs at 1700 MHz).
 * - MI300X: 304 CUs at 2100 MHz, 5.3 TB/s of HBM3 (192 GB), 64 KiB of LDS
 *   per work-group; fp32 163.4 TFLOP/s (256 per CU and clock), MFMA fp16
 *   dense 1307.4 TFLOP/s (2048 per CU and clock); 4 MiB of L2 on each of
 *   its eight XCDs (the 256 MiB Infinity Cache beside them is not counted).
 *   gfx942 (CDNA3), from AMD's data sheet and CDNA3 white paper.
 * - Arc A770: 32 Xe-cores of 16 vector engines x 8 fp32 lanes; XMX 2048
 *   fp16 flops per clock per Xe-core (138 TFLOP/s at 2100 MHz).
 * - Radeon RX 7900 XTX (gfx1100, RDNA3) through AMD's OpenCL: 96 CUs at
 *   2500 MHz, 960 GB/s of GDDR6 (24 GB), 64 KiB of LDS a work-group, wave32;
 *   fp32 counted as dual-issue (61.4 TFLOP/s: 256 per CU and clock), WMMA
 *   fp16 dense 122.8 TFLOP/s (512 per CU and clock); 6 MiB of L2 (the 96
 *   MiB Infinity Cache beside it is not counted). AMD's RDNA3 white paper
 *   and product page.
 * - NVIDIA's OpenCL on an H100: local memory capped at 48 KiB; the tensor
 *   cores through inline PTX mma.sync m16n8k16 (the H100's rate: wgmma, the
 *   faster path CUDA has, is refused there).
 * - PoCL on a 2-core AVX2 CPU: two 8-wide FMA ports per core. */
#include "planner.h"

#include <string.h>

#define KIB ((size_t)1024)
#define GIB ((size_t)1024 * 1024 * 1024)
#define MIB ((size_t)1024 * 1024)

static const fa_described_device described[] = {
    {"h100",
     {.name = "NVIDIA H100 80GB HBM3",
      .vendor = "NVIDIA Corporation",
      .arch = "sm_90",
      .backend = FA_BACKEND_CUDA,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 227 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 32,
      .compute_units = 132,
      .clock_mhz = 1980,
      .bandwidth_gbs = 3350.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 80 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 4096.0,
      .matrix_m = 16,
      .matrix_n = 8,
      .matrix_k = 16,
      .l2_cache_bytes = 50 * MIB}},
    {"mi250x",
     {.name = "AMD Instinct MI250X (one GCD)",
      .vendor = "Advanced Micro Devices, Inc.",
      .arch = "gfx90a",
      .backend = FA_BACKEND_HIP,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 64 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 64,
      .compute_units = 110,
      .clock_mhz = 1700,
      .bandwidth_gbs = 1600.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 64 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 1024.0,
      .matrix_m = 32,
      .matrix_n = 32,
      .matrix_k = 8,
      .l2_cache_bytes = 8 * MIB}},
    {"mi300x",
     {.name = "AMD Instinct MI300X",
      .vendor = "Advanced Micro Devices, Inc.",
      .arch = "gfx942",
      .backend = FA_BACKEND_HIP,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 64 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 64,
      .compute_units = 304,
      .clock_mhz = 2100,
      .bandwidth_gbs = 5300.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 192 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 2048.0,
      .matrix_m = 32,
      .matrix_n = 32,
      .matrix_k = 8,
      .l2_cache_bytes = 32 * MIB}},
    {"arc-a770",
     {.name = "Intel(R) Arc(TM) A770 Graphics",
      .vendor = "Intel(R) Corporation",
      .arch = "xe-hpg",
      .backend = FA_BACKEND_OPENCL,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 64 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 16,
      .compute_units = 32,
      .clock_mhz = 2100,
      .bandwidth_gbs = 560.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 16 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 2048.0,
      .matrix_m = 8,
      .matrix_n = 8,
      .matrix_k = 16,
      .l2_cache_bytes = 16 * MIB}},
    {"rx-7900xtx",
     {.name = "gfx1100",
      .vendor = "Advanced Micro Devices, Inc.",
      .arch = "gfx1100",
      .backend = FA_BACKEND_OPENCL,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 64 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 32,
      .compute_units = 96,
      .clock_mhz = 2500,
      .bandwidth_gbs = 960.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 24 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 512.0,
      .matrix_m = 16,
      .matrix_n = 16,
      .matrix_k = 16,
      .l2_cache_bytes = 6 * MIB}},
    {"nvidia-opencl",
     {.name = "NVIDIA H100 80GB HBM3 (OpenCL)",
      .vendor = "NVIDIA Corporation",
      .arch = "sm_90",
      .backend = FA_BACKEND_OPENCL,
      .type = FA_DEVICE_GPU,
      .local_mem_bytes = 48 * KIB,
      .max_work_group_size = 1024,
      .simd_width = 32,
      .compute_units = 132,
      .clock_mhz = 1980,
      .bandwidth_gbs = 3350.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 80 * GIB,
      .fp32_flops_per_clock_cu = 256.0,
      .matrix_flops_per_clock_cu = 4096.0,
      .matrix_m = 16,
      .matrix_n = 8,
      .matrix_k = 16,
      .l2_cache_bytes = 50 * MIB}},
    {"pocl-cpu",
     {.name = "pthread-cpu (2 cores)",
      .vendor = "The pocl project",
      .arch = "x86-64",
      .backend = FA_BACKEND_OPENCL,
      .type = FA_DEVICE_CPU,
      .local_mem_bytes = 1024 * KIB,
      .max_work_group_size = 4096,
      .simd_width = 8,
      .compute_units = 2,
      .clock_mhz = 2600,
      .bandwidth_gbs = 20.0,
      .bandwidth_measured = 0,
      .global_mem_bytes = 8 * GIB,
      .fp32_flops_per_clock_cu = 32.0,
      .matrix_flops_per_clock_cu = 0.0,
      .matrix_m = 0,
      .matrix_n = 0,
      .matrix_k = 0,
      .l2_cache_bytes = 0}},
};

int fa_described_device_count(void) { return (int)(sizeof described / sizeof described[0]); }

const fa_described_device *fa_described_device_get(int index) {
    if (index < 0 || index >= fa_described_device_count()) return NULL;
    return &described[index];
}

const fa_described_device *fa_described_device_find(const char *key) {
    if (!key) return NULL;
    for (int i = 0; i < fa_described_device_count(); i++)
        if (strcmp(described[i].key, key) == 0) return &described[i];
    return NULL;
}
