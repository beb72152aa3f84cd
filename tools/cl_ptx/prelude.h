/* The OpenCL built-ins the matrix-unit kernels call, for clang's NVPTX
 * target, which has no OpenCL library (libclc) here: each maps to the PTX
 * NVIDIA's OpenCL emits for it, so that ptxas's register count comes
 * close to what NVIDIA's compiler reports (tools/cl_ptx/registers.sh). exp2
 * keeps the subnormal fixup NVIDIA's exp2 has. */
#define OV __attribute__((overloadable, always_inline))
OV size_t get_group_id(uint d) { return d == 0 ? __nvvm_read_ptx_sreg_ctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_ctaid_y() : __nvvm_read_ptx_sreg_ctaid_z(); }
OV size_t get_local_id(uint d) { return d == 0 ? __nvvm_read_ptx_sreg_tid_x() : d == 1 ? __nvvm_read_ptx_sreg_tid_y() : __nvvm_read_ptx_sreg_tid_z(); }
OV size_t get_local_size(uint d) { return d == 0 ? __nvvm_read_ptx_sreg_ntid_x() : d == 1 ? __nvvm_read_ptx_sreg_ntid_y() : __nvvm_read_ptx_sreg_ntid_z(); }
OV size_t get_num_groups(uint d) { return d == 0 ? __nvvm_read_ptx_sreg_nctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_nctaid_y() : __nvvm_read_ptx_sreg_nctaid_z(); }
OV size_t get_global_id(uint d) { return get_group_id(d) * get_local_size(d) + get_local_id(d); }
OV void barrier(cl_mem_fence_flags f) { __asm__ __volatile__("bar.sync 0;" ::: "memory"); }
OV float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
OV float8 fma(float8 a, float8 b, float8 c) { return a * b + c; }
OV long max(long a, long b) { return a > b ? a : b; }
OV int max(int a, int b) { return a > b ? a : b; }
OV int min(int a, int b) { return a < b ? a : b; }
OV long min(long a, long b) { return a < b ? a : b; }
OV float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
OV float fmin(float a, float b) { return __builtin_fminf(a, b); }
OV float exp2(float x) { float s = x < -126.0f ? 24.0f : 0.0f; float y = __nvvm_ex2_approx_ftz_f(x + s); return s != 0.0f ? y * 5.9604645e-8f : y; }
OV float log2(float x) { return __nvvm_lg2_approx_f(x); }
OV float h2f_(ushort h) { float f; __asm__("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h)); return f; }
OV ushort f2h_(float f) { ushort h; __asm__("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f)); return h; }
OV float vload_half(size_t i, const half *p) { return h2f_(((const ushort *)p)[i]); }
OV float vload_half(size_t i, const __global half *p) { return h2f_(((const __global ushort *)p)[i]); }
OV float8 vload_half8(size_t i, const half *p) { const ushort *q = (const ushort *)p + 8 * i; return (float8)(h2f_(q[0]), h2f_(q[1]), h2f_(q[2]), h2f_(q[3]), h2f_(q[4]), h2f_(q[5]), h2f_(q[6]), h2f_(q[7])); }
OV void vstore_half_rte(float f, size_t i, half *p) { ((ushort *)p)[i] = f2h_(f); }
OV void vstore_half_rte(float f, size_t i, __global half *p) { ((__global ushort *)p)[i] = f2h_(f); }
OV void vstore_half8_rte(float8 v, size_t i, half *p) { ushort *q = (ushort *)p + 8 * i; q[0] = f2h_(v.s0); q[1] = f2h_(v.s1); q[2] = f2h_(v.s2); q[3] = f2h_(v.s3); q[4] = f2h_(v.s4); q[5] = f2h_(v.s5); q[6] = f2h_(v.s6); q[7] = f2h_(v.s7); }
OV ushort8 vload8(size_t i, const ushort *p) { return *(const ushort8 *)(p + 8 * i); }
OV float8 vload8(size_t i, const __global float *p) { return *(const __global float8 *)(p + 8 * i); }
OV void vstore8(float8 v, size_t i, __global float *p) { *(__global float8 *)(p + 8 * i) = v; }
OV void vstore8(float8 v, size_t i, float *p) { *(float8 *)(p + 8 * i) = v; }
OV void vstore8(ushort8 v, size_t i, ushort *p) { *(ushort8 *)(p + 8 * i) = v; }
OV void vstore8(ushort8 v, size_t i, __global ushort *p) { *(__global ushort8 *)(p + 8 * i) = v; }
OV ushort8 vload8(size_t i, const __global ushort *p) { return *(const __global ushort8 *)(p + 8 * i); }
