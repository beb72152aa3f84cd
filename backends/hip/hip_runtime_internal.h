/* Internal interface of the HIP backend's runtime half (hip_backend.c): the
 * HIP runtime loaded at run time, the context and buffer objects, error
 * reporting. The attention half (kernels) builds on it.
 *
 * Two parts, as for CUDA: a vendor-type-free part that tests may include
 * anywhere, and with FA_HIP_RUNTIME_TYPES defined before inclusion, the
 * function table and object layouts in HIP's types.
 *
 * Loading: the runtime is opened as "libamdhip64.so", then ".so.6", ".so.5".
 * When the environment variable FLASHATTN_HIP_LIBRARY is set and not empty,
 * its value (a file name or path) replaces that list: tests point it at a
 * file that does not exist to exercise the "unavailable" path, and users
 * with a ROCm outside the loader's path can name theirs.
 *
 * ABI across ROCm releases: the build compiles against whichever HIP headers
 * it finds (Debian's 5.2 here) and must run on 5.x, 6.x and later runtimes.
 * - Functions are taken by name with the signatures of the headers; those
 *   used here kept their signatures from 5.x on.
 * - Device properties come from hipDeviceGetAttribute: the attribute numbers
 *   are stable (ROCm 6 renamed retired ones instead of renumbering), while
 *   hipDeviceProp_t changed layout in 6.0. Only the architecture name has no
 *   attribute; it is read from hipDeviceProp_t through the entry point that
 *   fills the 5.x layout on every runtime (hipGetDevicePropertiesR0000 where
 *   exported, ROCm 6 on; plain hipGetDeviceProperties before), into a buffer
 *   far larger than any layout, and kept only if it looks like "gfx...". A
 *   future runtime that drops both would leave the architecture empty, never
 *   overrun memory.
 * - hipPointerAttribute_t kept its size and the offset of its device field
 *   across 5.x and 6.x, but renumbered its memory types: only the device
 *   field is read. */
#ifndef FA_HIP_RUNTIME_INTERNAL_H
#define FA_HIP_RUNTIME_INTERNAL_H

#include "backend.h"
#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Vendor-type-free part                                                    */
/* ------------------------------------------------------------------------ */

/* Device memory allocated with hipMalloc directly, outside any fa_buffer, as
 * an application would (zero-copy interop tests). */
typedef struct fa_hip_native_mem {
    void *ptr;
    size_t bytes;
    int device;
} fa_hip_native_mem;

/* Allocate bytes on device (an ordinal of the HIP runtime); the copies are
 * synchronous. */
fa_status fa_hip_native_alloc(int device, size_t bytes, fa_hip_native_mem *mem);
fa_status fa_hip_native_write(const fa_hip_native_mem *mem, size_t offset, const void *src,
                              size_t bytes);
fa_status fa_hip_native_read(const fa_hip_native_mem *mem, size_t offset, void *dst, size_t bytes);
void fa_hip_native_free(fa_hip_native_mem *mem);

/* ------------------------------------------------------------------------ */
/* Attention half (hip_attention.c)                                         */
/* ------------------------------------------------------------------------ */

#define FA_HIP_MAX_DEFINES 24
#define FA_HIP_MAX_PATHS 6
#define FA_HIP_DEFINE_SIZE 40

/* The kernels of one pass as the backend builds them: the kernels_hip/
 * sources in order, the -D options fixed by the plan, the entry points.
 * The CI compile check builds exactly these for AMD targets. */
typedef struct fa_hip_program {
    const char *paths[FA_HIP_MAX_PATHS];
    int path_count;
    char defines[FA_HIP_MAX_DEFINES][FA_HIP_DEFINE_SIZE];
    int define_count;
    const char *kernels[3];
    int kernel_count;
} fa_hip_program;

/* The program of a pass for a kernel plan (SIMT or SPLITK forward, SIMT
 * backward) on a target whose wavefront is wave lanes wide. Checks the
 * shape the kernels need (divisibility, accumulators per work-item). */
fa_status fa_hip_program_for(const fa_attention_desc *desc, const fa_kernel_plan *kp, fa_pass pass, int wave,
                             fa_hip_program *out);

/* The program of a pass for a kernel plan on a device: the matrix-core
 * kernels (fwd_mma.hip, bwd_mma.hip on the layer core/planner_hip_mma.c
 * gives the plan) for MMA plans, fa_hip_program_for's otherwise. */
fa_status fa_hip_program_for_device(const fa_device_desc *dev, const fa_attention_desc *desc, const fa_kernel_plan *kp,
                                    fa_pass pass, fa_hip_program *out);

/* The program's full source text as compiled for arch (the NVIDIA prelude
 * first when arch is "sm_*", then kernels_hip/dtype.h, then the program's
 * paths), malloc'ed; *size without the NUL. */
fa_status fa_hip_program_source(const fa_hip_program *prog, const char *arch, char **text, size_t *size);

/* Compile a program with hiprtc for arch ("gfx90a", "sm_90") into a code
 * object (malloc'ed, caller frees), through the kernel cache. Needs only
 * hiprtc (libamdhip64 on ROCm 5, libhiprtc from ROCm 6 on), not a device.
 * FA_ERR_COMPILE carries the compiler's log. */
fa_status fa_hip_compile(const char *arch, const fa_hip_program *prog, void **code, size_t *size);

/* The program of the ring's element-wise passes (kernels_hip/rows.hip:
 * fa_rows, fa_rows_merge), the same for every target: no build option. */
void fa_hip_rows_program(fa_hip_program *out);

/* The backend's plan operations (also called by tests that force tiles). */
fa_status fa_hip_plan_prepare(void *ctx, const fa_plan_s *plan, void **plan_impl);
void fa_hip_plan_release(void *ctx, void *plan_impl);
fa_status fa_hip_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
fa_status fa_hip_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
fa_status fa_hip_last_time_ms(void *ctx, void *plan_impl, double *ms);
/* A KV-cache step (kernels_hip/kvcache.hip) on a plan whose descriptor has
 * kv_cache = 1. */
fa_status fa_hip_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args);
/* A buffer handle's device address and size (core's launch modules ask
 * for them: core/rows_launch.h, core/kvcache_launch.h). */
void fa_hip_buffer_locate(void *buf, uint64_t *address, size_t *bytes);

/* What the runtime reports of the largest kernel of a pass of a prepared
 * plan: local memory (static, with the dynamic block it is launched with),
 * registers and private (scratch) bytes per work-item
 * (hipFuncGetAttribute). */
typedef struct fa_hip_kernel_usage {
    size_t local_bytes;
    int registers;
    size_t private_bytes;
} fa_hip_kernel_usage;
fa_status fa_hip_plan_kernel_usage(void *plan_impl, fa_pass pass, fa_hip_kernel_usage *usage);

#ifdef FA_HIP_RUNTIME_TYPES

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>

#include "backend.h"

#define FA_HIP_REQUIRED(X)                                                                   \
    X(hipGetErrorName, const char *, (hipError_t))                                           \
    X(hipGetErrorString, const char *, (hipError_t))                                         \
    X(hipInit, hipError_t, (unsigned int))                                                   \
    X(hipRuntimeGetVersion, hipError_t, (int *))                                             \
    X(hipGetDeviceCount, hipError_t, (int *))                                                \
    X(hipDeviceGet, hipError_t, (hipDevice_t *, int))                                        \
    X(hipDeviceGetName, hipError_t, (char *, int, hipDevice_t))                              \
    X(hipDeviceGetAttribute, hipError_t, (int *, hipDeviceAttribute_t, int))                 \
    X(hipDeviceTotalMem, hipError_t, (size_t *, hipDevice_t))                                \
    X(hipGetDevice, hipError_t, (int *))                                                     \
    X(hipSetDevice, hipError_t, (int))                                                       \
    X(hipDeviceSynchronize, hipError_t, (void))                                              \
    X(hipStreamCreateWithFlags, hipError_t, (hipStream_t *, unsigned int))                   \
    X(hipStreamDestroy, hipError_t, (hipStream_t))                                           \
    X(hipStreamSynchronize, hipError_t, (hipStream_t))                                       \
    X(hipStreamWaitEvent, hipError_t, (hipStream_t, hipEvent_t, unsigned int))               \
    X(hipMalloc, hipError_t, (void **, size_t))                                              \
    X(hipFree, hipError_t, (void *))                                                         \
    X(hipMemcpyAsync, hipError_t, (void *, const void *, size_t, hipMemcpyKind, hipStream_t)) \
    X(hipMemsetAsync, hipError_t, (void *, int, size_t, hipStream_t))                        \
    X(hipPointerGetAttributes, hipError_t, (hipPointerAttribute_t *, const void *))          \
    X(hipModuleLoadData, hipError_t, (hipModule_t *, const void *))                          \
    X(hipModuleUnload, hipError_t, (hipModule_t))                                            \
    X(hipModuleGetFunction, hipError_t, (hipFunction_t *, hipModule_t, const char *))        \
    X(hipFuncGetAttribute, hipError_t, (int *, hipFunction_attribute, hipFunction_t))        \
    X(hipModuleLaunchKernel, hipError_t,                                                     \
      (hipFunction_t, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,  \
       unsigned int, unsigned int, hipStream_t, void **, void **))                           \
    X(hipEventCreate, hipError_t, (hipEvent_t *))                                            \
    X(hipEventRecord, hipError_t, (hipEvent_t, hipStream_t))                                 \
    X(hipEventSynchronize, hipError_t, (hipEvent_t))                                         \
    X(hipEventElapsedTime, hipError_t, (float *, hipEvent_t, hipEvent_t))                    \
    X(hipEventDestroy, hipError_t, (hipEvent_t))

/* NULL when the runtime lacks them; see the notes above. hipStreamGetDevice
 * came with ROCm 6 (the headers of 5.2 do not declare it). hipFuncSetAttribute
 * is called only where the device reports an opt-in limit of local memory
 * above its default (the NVIDIA mapping), with a module's function. */
#define FA_HIP_OPTIONAL(X)                                                                   \
    X(hipMemGetAddressRange, hipError_t, (hipDeviceptr_t *, size_t *, hipDeviceptr_t))       \
    X(hipFuncSetAttribute, hipError_t, (const void *, hipFuncAttribute, int))                \
    X(hipStreamGetDevice, hipError_t, (hipStream_t, hipDevice_t *))                          \
    X(hipGetDevicePropertiesR0000, hipError_t, (hipDeviceProp_t *, int))                     \
    X(hipGetDeviceProperties, hipError_t, (hipDeviceProp_t *, int))

typedef struct fa_hip_api {
#define FA_HIP_MEMBER(name, ret, args) ret (*name) args;
    FA_HIP_REQUIRED(FA_HIP_MEMBER)
    FA_HIP_OPTIONAL(FA_HIP_MEMBER)
#undef FA_HIP_MEMBER
    int runtime_version;        /* HIP_VERSION encoding: major * 10^7 + minor * 10^5 + patch */
} fa_hip_api;

/* The runtime table; NULL unless the backend's init succeeded. */
const fa_hip_api *fa_hip_api_get(void);
/* The architecture ("gfx90a") from device index's gcnArchName
 * ("gfx90a:sramecc+:xnack-"), or "sm_XY" through the NVIDIA mapping; "" when
 * unavailable or implausible. Only once fa_hip_api_get() has succeeded. */
void fa_hip_arch_name(int index, char *arch, size_t arch_size);

typedef struct fa_hip_context {
    int index;                  /* HIP device ordinal */
    hipStream_t stream;         /* in use: own_stream, or the caller's */
    hipStream_t own_stream;     /* non-blocking: never waits on the null stream */
    hipEvent_t order_event;     /* orders a new stream after the last; made on first use */
    char arch[32];              /* "gfx90a", "" if unknown */
    int warp_size;              /* wavefront: 64 on CDNA, 32 on RDNA */
    int cu_count;
    size_t lds_bytes;           /* local memory a kernel may take (the opt-in limit where there is one) */
    size_t lds_static_bytes;    /* ... without opting in: all that static tiles get */
    hipModule_t rows_module;    /* kernels_hip/rows.hip, loaded on first use (hip_rows.c) */
    hipFunction_t rows_fn[2];   /* fa_rows, fa_rows_merge */
} fa_hip_context;

typedef struct fa_hip_buffer {
    void *ptr;
    size_t bytes;
    int owned;                  /* 0: wrapped, the caller frees it */
} fa_hip_buffer;

/* A HIP error as a status (hipErrorOutOfMemory: FA_ERR_OUT_OF_MEMORY, others
 * FA_ERR_LAUNCH) with a message naming the call and the runtime's text. */
fa_status fa_hip_error(hipError_t err, const char *what);

/* Make ctx's device current on the calling thread for the span of a call;
 * leave restores the caller's device, so that the application's own HIP
 * state is left as it was. */
fa_status fa_hip_enter(const fa_hip_context *ctx, int *previous);
void fa_hip_leave(const fa_hip_context *ctx, int previous);

/* Compiles prog for the context's device through the kernel cache and
 * loads it: the module, and prog's kernels in fns in its order. The
 * device is current. */
fa_status fa_hip_load_program(const fa_hip_context *ctx, const fa_hip_program *prog, hipModule_t *module,
                              hipFunction_t *fns);
/* One launch on the stream in use; args as hipModuleLaunchKernel takes
 * them. An empty grid launches nothing. */
fa_status fa_hip_launch(const fa_hip_context *ctx, hipFunction_t fn, const char *name, size_t gx, size_t gy,
                        size_t gz, unsigned block, size_t shared, void **args);

/* The ring's element-wise passes and NCCL/RCCL transport (hip_rows.c,
 * hip_rccl.c), as the ops table takes them; fa_hip_rows_release unloads
 * what the passes loaded into a context being destroyed. */
fa_status fa_hip_rows(void *ctx, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                      const fa_rows_view *src, float value);
fa_status fa_hip_rows_merge(void *ctx, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                            const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l);
void fa_hip_rows_release(fa_hip_context *ctx);
fa_status fa_hip_transport_nccl(void *ctx, void *nccl_comm, fa_transport *transport);

#endif /* FA_HIP_RUNTIME_TYPES */

#endif
