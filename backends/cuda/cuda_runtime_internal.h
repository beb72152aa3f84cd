/* Internal interface of the CUDA backend's runtime half (cuda_backend.c):
 * the driver API and NVRTC loaded at run time, the context and buffer
 * objects, error reporting. The attention half (kernels) builds on it.
 *
 * Two parts:
 * - Always visible: vendor-type-free helpers, so that tests can include this
 *   header without the CUDA toolkit's include directory.
 * - With FA_CUDA_DRIVER_TYPES defined before inclusion (the backend's own
 *   sources, which are compiled with the toolkit headers): the function
 *   tables and the object layouts, in the toolkit's types.
 *
 * Loading (documented here because users with unusual installs need it):
 * - The driver is opened as "libcuda.so.1", then "libcuda.so". When the
 *   environment variable FLASHATTN_CUDA_LIBRARY is set and not empty, its
 *   value (a file name or path) replaces that list. Tests point it at a file
 *   that does not exist to exercise the "unavailable" path on any machine.
 * - NVRTC is opened as libnvrtc.so.13, .12, .11.2, then unversioned, then
 *   from /usr/local/cuda/lib64 by absolute path. FLASHATTN_NVRTC_LIBRARY
 *   replaces that list the same way. NVRTC is independent of the driver: it
 *   compiles kernels on machines without a GPU, and a driver without NVRTC
 *   still serves devices and memory.
 * - The toolkit's link stub (lib64/stubs/libcuda.so) is never opened on
 *   purpose: it exists for linking only, and its cuInit fails.
 *
 * Entry points are resolved by their exported (versioned) names, not through
 * cuGetProcAddress: the names cuda.h maps by macro (cuMemAlloc ->
 * cuMemAlloc_v2, ...) are stable ABI that every driver since CUDA 11 exports,
 * so one explicit list documents exactly what the backend needs. */
#ifndef FA_CUDA_RUNTIME_INTERNAL_H
#define FA_CUDA_RUNTIME_INTERNAL_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Vendor-type-free part                                                    */
/* ------------------------------------------------------------------------ */

/* Device memory allocated with the driver directly, outside any fa_buffer,
 * as an application (or another library) would: the test of zero-copy
 * interop needs memory that flashattn did not allocate. */
typedef struct fa_cuda_native_mem {
    uintptr_t ptr;        /* the CUdeviceptr */
    size_t bytes;
    void *context;        /* CUcontext the memory belongs to */
    void *own_context;    /* non-NULL: a context created for this memory */
    int device;           /* CUdevice */
} fa_cuda_native_mem;

/* Allocate bytes on ctx's device (ctx must be a CUDA context). With foreign
 * set, the memory goes into a new context of its own on the same device, so
 * that it belongs to another context than ctx; FA_ERR_UNSUPPORTED when the
 * driver cannot create one. */
fa_status fa_cuda_native_alloc(fa_context ctx, size_t bytes, int foreign, fa_cuda_native_mem *mem);
/* Synchronous copies through the memory's own context. */
fa_status fa_cuda_native_write(const fa_cuda_native_mem *mem, size_t offset, const void *src,
                               size_t bytes);
fa_status fa_cuda_native_read(const fa_cuda_native_mem *mem, size_t offset, void *dst,
                              size_t bytes);
void fa_cuda_native_free(fa_cuda_native_mem *mem);

/* Whether NVRTC could be loaded (loading it on first use); on failure the
 * reason is written to reason. Works where the driver is missing. */
int fa_cuda_nvrtc_available(char *reason, size_t reason_size);

/* ------------------------------------------------------------------------ */
/* The attention half (cuda_attention.c)                                    */

struct fa_plan_s;

/* One compiled kernel (cuda_compile.c). Registers and stack bytes are read
 * from the CUBIN; spill stores and loads from ptxas' report in NVRTC's log,
 * or 0 where the log has none and the stack frame is empty (nothing
 * spilled). -1 where neither says (PTX without a report). */
typedef struct fa_cuda_kernel_report {
    char program[16];           /* "fwd_mma", "bwd_mma", "simt", "standard" */
    char kernel[32];            /* entry point */
    char options[512];          /* the plan's -D options */
    char arch[16];              /* "sm_90" */
    fa_pass pass;
    int threads;                /* block size it is launched with */
    size_t shared_bytes;        /* dynamic shared memory per block */
    int tensor_cores;           /* 1: an mma.sync program */
    int registers, spill_stores, spill_loads, stack_bytes;
    int wgmma_serialized;       /* 1: ptxas made each warpgroup MMA wait for the last
                                   (its C7510 note), 0: it did not, -1: no log */
    int from_cache;             /* 1: the binary came from the kernel cache */
    int real_code;              /* 1: CUBIN (SASS) for arch; 0: PTX */
    size_t binary_bytes;
    double compile_seconds;     /* 0 for a cache hit */
} fa_cuda_kernel_report;

/* Compiles with NVRTC, through the kernel cache, every program a plan needs
 * (both passes) for compute capability cc_major.cc_minor, exactly as
 * plan creation on such a device would: no device is needed. Reports one
 * entry per kernel into reports (up to max_reports); *count receives how
 * many kernels there were. FA_ERR_UNSUPPORTED for a plan the kernels cannot
 * run, FA_ERR_COMPILE with the log for a compile error. */
fa_status fa_cuda_compile_plan(const fa_attention_desc *desc, const fa_plan_info *info, int cc_major,
                               int cc_minor, fa_cuda_kernel_report *reports, int max_reports, int *count);

/* Copies bytes from src to dst (buffers of one CUDA context) on its
 * stream and returns the copy's device time (cuda_copy.c). */
fa_status fa_cuda_time_copy(fa_buffer dst, fa_buffer src, size_t bytes, double *ms);
fa_status fa_cuda_copy_async(fa_buffer dst, fa_buffer src, size_t bytes);
/* A read of the first a_bytes of a and b_bytes of b (b NULL with 0; each a
 * multiple of 16), nothing written: timed, and untimed left in flight. */
fa_status fa_cuda_time_read(fa_buffer a, size_t a_bytes, fa_buffer b, size_t b_bytes, double *ms);
fa_status fa_cuda_read_async(fa_buffer src, size_t bytes);
/* Threads a block of kernels_cuda/stream_read.cu (STREAM_THREADS). */
#define FA_STREAM_THREADS 512

/* The same for the forward pass alone (sweeps over forward-only kernels,
 * such as decoding's, need not compile a backward per shape). */
fa_status fa_cuda_compile_forward(const fa_attention_desc *desc, const fa_plan_info *info, int cc_major,
                                  int cc_minor, fa_cuda_kernel_report *reports, int max_reports, int *count);

/* The same for standard attention (cuda_standard.c): compiles
 * kernels_cuda/standard.cu, through the kernel cache, for the options of
 * desc (dtype, masks, dropout, varlen) as plan creation would, and reports
 * its kernels (std_softmax, std_probs, std_dscores, std_rowdot, std_rows;
 * *count receives 5). */
fa_status fa_cuda_standard_compile_kernels(const fa_attention_desc *desc, int cc_major, int cc_minor,
                                           fa_cuda_kernel_report *reports, int max_reports, int *count);

/* Compiles kernels_cuda/rows.cu (the ring's element-wise passes) with
 * NVRTC, through the kernel cache, as a context's first pass would on a
 * device of compute capability cc_major.cc_minor: no device is needed.
 * One report per kernel (fa_rows, fa_rows_merge); *count receives 2. */
fa_status fa_cuda_rows_compile(int cc_major, int cc_minor, fa_cuda_kernel_report *reports, int max_reports,
                               int *count);
/* The same for kernels_cuda/stream_read.cu (fa_stream_read; *count 1). */
fa_status fa_cuda_read_compile(int cc_major, int cc_minor, fa_cuda_kernel_report *reports, int max_reports,
                                 int *count);

/* The backend's plan_prepare / plan_release, reachable by tests that
 * rebuild a plan's kernels for other tiles. */
fa_status fa_cuda_plan_prepare(void *ctx, const struct fa_plan_s *plan, void **plan_impl);
void fa_cuda_plan_release(void *ctx, void *plan_impl);
/* Shared memory (static + dynamic, bytes) of the largest kernel of a pass
 * of a prepared plan, as the driver loaded it. */
fa_status fa_cuda_plan_shared_bytes(void *plan_impl, fa_pass pass, size_t *bytes);
/* Whether a prepared plan's decoding splits meet (kernels_cuda/decode.cu
 * meet_splits, a cooperative launch): 1 or 0. */
int fa_cuda_plan_splits_meet(const void *plan_impl);

#ifdef FA_CUDA_DRIVER_TYPES

#include <cuda.h>
#include <nvrtc.h>

#include "backend.h"

/* Driver entry points, by exported name. Required ones must all resolve for
 * the backend to be available. */
#define FA_CU_REQUIRED(X)                                                                     \
    X(cuGetErrorName, CUresult, (CUresult, const char **))                                    \
    X(cuGetErrorString, CUresult, (CUresult, const char **))                                  \
    X(cuInit, CUresult, (unsigned int))                                                       \
    X(cuDriverGetVersion, CUresult, (int *))                                                  \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                               \
    X(cuDeviceGetCount, CUresult, (int *))                                                    \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                                     \
    X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))                  \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                                    \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                            \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                     \
    X(cuCtxPushCurrent_v2, CUresult, (CUcontext))                                             \
    X(cuCtxPopCurrent_v2, CUresult, (CUcontext *))                                            \
    X(cuCtxSynchronize, CUresult, (void))                                                     \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                                   \
    X(cuStreamDestroy_v2, CUresult, (CUstream))                                               \
    X(cuStreamSynchronize, CUresult, (CUstream))                                              \
    X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                         \
    X(cuStreamGetCtx, CUresult, (CUstream, CUcontext *))                                      \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                       \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                  \
    X(cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void *, size_t, CUstream))          \
    X(cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream))                \
    X(cuMemcpyDtoDAsync_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))           \
    X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))              \
    X(cuMemsetD32Async, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream))              \
    X(cuMemGetAddressRange_v2, CUresult, (CUdeviceptr *, size_t *, CUdeviceptr))              \
    X(cuPointerGetAttribute, CUresult, (void *, CUpointer_attribute, CUdeviceptr))            \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                 \
    X(cuModuleLoadDataEx, CUresult,                                                           \
      (CUmodule *, const void *, unsigned int, CUjit_option *, void **))                      \
    X(cuModuleUnload, CUresult, (CUmodule))                                                   \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                  \
    X(cuFuncGetAttribute, CUresult, (int *, CUfunction_attribute, CUfunction))                \
    X(cuFuncSetAttribute, CUresult, (CUfunction, CUfunction_attribute, int))                  \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, CUresult, (int *, CUfunction, int, size_t)) \
    X(cuLaunchKernel, CUresult,                                                               \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,      \
       unsigned int, unsigned int, CUstream, void **, void **))                               \
    X(cuLaunchCooperativeKernel, CUresult,                                                    \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,      \
       unsigned int, unsigned int, CUstream, void **))                                        \
    X(cuEventCreate, CUresult, (CUevent *, unsigned int))                                     \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                           \
    X(cuEventSynchronize, CUresult, (CUevent))                                                \
    X(cuEventDestroy_v2, CUresult, (CUevent))                                                 \
    /* Drivers of recent releases export a _v2; older ones only the plain    \
     * name, with the same signature: the loader falls back to it. */         \
    X(cuEventElapsedTime_v2, CUresult, (float *, CUevent, CUevent))

/* Entry points only the interop tests and the warp-specialised forward
 * use; NULL when missing. cuCtxCreate_v2 is the pre-CUDA-13 signature,
 * which drivers keep exporting for older applications. */
#define FA_CU_OPTIONAL(X)                                                                     \
    X(cuCtxCreate_v2, CUresult, (CUcontext *, unsigned int, CUdevice))                        \
    X(cuCtxDestroy_v2, CUresult, (CUcontext))                                                 \
    /* CUDA 12 and later: the warp-specialised forward's tensor maps. */      \
    X(cuTensorMapEncodeTiled, CUresult,                                                       \
      (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,            \
       const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,     \
       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill))

typedef struct fa_cu_api {
#define FA_CU_MEMBER(name, ret, args) ret(CUDAAPI *name) args;
    FA_CU_REQUIRED(FA_CU_MEMBER)
    FA_CU_OPTIONAL(FA_CU_MEMBER)
#undef FA_CU_MEMBER
} fa_cu_api;

#define FA_NVRTC_REQUIRED(X)                                                                  \
    X(nvrtcGetErrorString, const char *, (nvrtcResult))                                       \
    X(nvrtcVersion, nvrtcResult, (int *, int *))                                              \
    X(nvrtcCreateProgram, nvrtcResult,                                                        \
      (nvrtcProgram *, const char *, const char *, int, const char *const *,                 \
       const char *const *))                                                                  \
    X(nvrtcDestroyProgram, nvrtcResult, (nvrtcProgram *))                                     \
    X(nvrtcCompileProgram, nvrtcResult, (nvrtcProgram, int, const char *const *))             \
    X(nvrtcGetProgramLogSize, nvrtcResult, (nvrtcProgram, size_t *))                          \
    X(nvrtcGetProgramLog, nvrtcResult, (nvrtcProgram, char *))                                \
    X(nvrtcGetPTXSize, nvrtcResult, (nvrtcProgram, size_t *))                                 \
    X(nvrtcGetPTX, nvrtcResult, (nvrtcProgram, char *))                                       \
    X(nvrtcGetCUBINSize, nvrtcResult, (nvrtcProgram, size_t *))                               \
    X(nvrtcGetCUBIN, nvrtcResult, (nvrtcProgram, char *))                                     \
    X(nvrtcAddNameExpression, nvrtcResult, (nvrtcProgram, const char *const))                 \
    X(nvrtcGetLoweredName, nvrtcResult, (nvrtcProgram, const char *const, const char **))

#define FA_NVRTC_OPTIONAL(X)                                                                  \
    X(nvrtcGetNumSupportedArchs, nvrtcResult, (int *))                                        \
    X(nvrtcGetSupportedArchs, nvrtcResult, (int *))

typedef struct fa_nvrtc_api {
#define FA_NVRTC_MEMBER(name, ret, args) ret (*name) args;
    FA_NVRTC_REQUIRED(FA_NVRTC_MEMBER)
    FA_NVRTC_OPTIONAL(FA_NVRTC_MEMBER)
#undef FA_NVRTC_MEMBER
    int version_major, version_minor;
} fa_nvrtc_api;

/* The driver table; NULL unless the backend's init succeeded. */
const fa_cu_api *fa_cuda_api(void);
/* The NVRTC table, loading it on first use (thread-safe); NULL and the reason
 * when it cannot be loaded. */
const fa_nvrtc_api *fa_cuda_nvrtc(char *reason, size_t reason_size);

typedef struct fa_cuda_context {
    int index;
    CUdevice device;
    CUcontext context;          /* the device's primary context, retained */
    CUstream stream;            /* in use: own_stream, or the caller's */
    CUstream own_stream;        /* non-blocking: never waits on the legacy stream */
    CUevent order_event;        /* orders a new stream after the last; made on first use */
    int cc_major, cc_minor;     /* compute capability */
    int sm_count;
    size_t smem_optin;          /* shared memory per block with opt-in */
    CUmodule rows_module;       /* kernels_cuda/rows.cu, loaded on first use (cuda_rows.c) */
    CUfunction rows_fn, rows_merge_fn;
    CUmodule read_module;     /* kernels_cuda/stream_read.cu, loaded on first use (cuda_copy.c) */
    CUfunction read_fn;
    CUdeviceptr read_sink;    /* the read's one word */
} fa_cuda_context;

typedef struct fa_cuda_buffer {
    CUdeviceptr ptr;
    size_t bytes;
    int owned;                  /* 0: wrapped, the caller frees it */
} fa_cuda_buffer;

/* A driver error as a status (CUDA_ERROR_OUT_OF_MEMORY: FA_ERR_OUT_OF_MEMORY,
 * others FA_ERR_LAUNCH) with a message naming the call and carrying the
 * driver's error name and text. */
fa_status fa_cuda_error(CUresult result, const char *what);

/* Make ctx's context current on the calling thread for the span of a call,
 * so that every entry point works from any thread; pop restores the
 * caller's previous current context. */
fa_status fa_cuda_push(const fa_cuda_context *ctx);
void fa_cuda_pop(void);

/* The milliseconds between two recorded events on ctx, once stop has
 * completed (waited for): a plan's last pass, as fa_last_time_ms reports
 * it. */
fa_status fa_cuda_events_ms(const fa_cuda_context *ctx, CUevent start, CUevent stop, double *ms);

/* The attention passes (cuda_attention.c), as the ops table takes them. */
fa_status fa_cuda_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
fa_status fa_cuda_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
fa_status fa_cuda_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args);
fa_status fa_cuda_last_time_ms(void *ctx, void *plan_impl, double *ms);
/* A buffer handle's device address and size (core's launch modules ask
 * for them: core/rows_launch.h, core/kvcache_launch.h). */
void fa_cuda_buffer_locate(void *buf, uint64_t *address, size_t *bytes);

/* The ring's element-wise passes and NCCL transport (cuda_rows.c,
 * cuda_nccl.c), as the ops table takes them; fa_cuda_rows_release unloads
 * what the passes loaded into a context being destroyed. */
fa_status fa_cuda_rows(void *ctx, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                       const fa_rows_view *src, float value);
fa_status fa_cuda_rows_merge(void *ctx, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                             const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l);
void fa_cuda_rows_release(fa_cuda_context *ctx);
/* Compiles a small program (cuda_compile.h) for ctx's device, loads it and
 * looks up each of its kernels into fns (the context is current); on
 * failure nothing stays loaded. */
struct fa_cuda_program;
fa_status fa_cuda_program_load(const struct fa_cuda_program *prog, const fa_cuda_context *ctx, CUmodule *module,
                               CUfunction *fns);
/* The read's module and sink (cuda_copy.c), at context destruction. */
void fa_cuda_read_release(fa_cuda_context *ctx);
fa_status fa_cuda_transport_nccl(void *ctx, void *nccl_comm, fa_transport *transport);

#endif /* FA_CUDA_DRIVER_TYPES */

#endif
