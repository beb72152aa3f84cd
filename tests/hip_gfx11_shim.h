/* The device-library functions the HIP kernels reach through HIP's headers,
 * for compiling gfx1100 (RDNA3) code objects with Debian's ROCm 5.2, which
 * ships no gfx11 device library (tests/test_hip_compile.c passes -nogpulib
 * and includes this). Built on the compiler's own built-ins; the code
 * objects serve the register and LDS counts only and never run. */
#ifndef FA_HIP_GFX11_SHIM_H
#define FA_HIP_GFX11_SHIM_H

#define FA_SHIM_FN extern "C" __device__ __attribute__((always_inline))

FA_SHIM_FN size_t __ockl_get_local_id(uint d) {
    return d == 0 ? __builtin_amdgcn_workitem_id_x() : d == 1 ? __builtin_amdgcn_workitem_id_y()
                                                              : __builtin_amdgcn_workitem_id_z();
}
FA_SHIM_FN size_t __ockl_get_group_id(uint d) {
    return d == 0 ? __builtin_amdgcn_workgroup_id_x() : d == 1 ? __builtin_amdgcn_workgroup_id_y()
                                                               : __builtin_amdgcn_workgroup_id_z();
}
/* gridDim: the dispatch packet's grid size over its work-group size
 * (work-group sizes are 16-bit fields from byte 4, grid sizes 32-bit
 * fields from byte 12). */
FA_SHIM_FN size_t __ockl_get_num_groups(uint d) {
    const unsigned char *packet = (const unsigned char *)__builtin_amdgcn_dispatch_ptr();
    const uint wg = ((const unsigned short *)(packet + 4))[d], grid = ((const uint *)(packet + 12))[d];
    return (grid + wg - 1) / wg;
}
FA_SHIM_FN uint __ockl_mul_hi_u32(uint a, uint b) { return (uint)(((unsigned long long)a * b) >> 32); }
FA_SHIM_FN float __ocml_exp2_f32(float x) { return __builtin_exp2f(x); }
FA_SHIM_FN float __ocml_log2_f32(float x) { return __builtin_log2f(x); }
FA_SHIM_FN float __ocml_fma_f32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
FA_SHIM_FN float __ocml_exp_f32(float x) { return __builtin_exp2f(x * 1.44269504f); }
FA_SHIM_FN float __ocml_log1p_f32(float x) { return __builtin_log2f(1.0f + x) * 0.693147181f; }
FA_SHIM_FN float __ocml_fabs_f32(float x) { return __builtin_fabsf(x); }
/* The KV-cache step's row maxima and its split merge's L. */
FA_SHIM_FN float __ocml_fmax_f32(float a, float b) { return __builtin_fmaxf(a, b); }
FA_SHIM_FN float __ocml_log_f32(float x) { return __builtin_log2f(x) * 0.693147181f; }
/* __syncthreads: a work-group fence of the order asked for. */
FA_SHIM_FN void __atomic_work_item_fence(__cl_mem_fence_flags f, __memory_order o, __memory_scope s) {
    (void)f;
    (void)s;
    if (o == __memory_order_release)
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    else if (o == __memory_order_acquire)
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
    else
        __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "workgroup");
}

#undef FA_SHIM_FN
#endif
