/* Internal interface of the OpenCL backend, shared by its runtime half
 * (cl_runtime.c: loading, devices, memory, builds, launches, timing), its
 * attention half (cl_attention.c: kernels for a plan) and the ring's
 * element-wise passes (cl_rows.c). */
#ifndef FA_CL_BACKEND_H
#define FA_CL_BACKEND_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "backend.h"
#include "plan.h"

/* Every OpenCL entry point the backend calls, loaded with dlopen from the
 * ICD loader. Members are named as the OpenCL functions: fa_cl.clFinish(q). */
#define FA_CL_FUNCTIONS(X)                                                                   \
    X(clGetPlatformIDs, cl_int, (cl_uint, cl_platform_id *, cl_uint *))                     \
    X(clGetPlatformInfo, cl_int, (cl_platform_id, cl_platform_info, size_t, void *, size_t *)) \
    X(clGetDeviceIDs, cl_int, (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *)) \
    X(clGetDeviceInfo, cl_int, (cl_device_id, cl_device_info, size_t, void *, size_t *))    \
    X(clCreateContext, cl_context,                                                          \
      (const cl_context_properties *, cl_uint, const cl_device_id *,                        \
       void(CL_CALLBACK *)(const char *, const void *, size_t, void *), void *, cl_int *))  \
    X(clReleaseContext, cl_int, (cl_context))                                               \
    X(clGetContextInfo, cl_int, (cl_context, cl_context_info, size_t, void *, size_t *))    \
    X(clCreateCommandQueue, cl_command_queue,                                               \
      (cl_context, cl_device_id, cl_command_queue_properties, cl_int *))                    \
    X(clReleaseCommandQueue, cl_int, (cl_command_queue))                                    \
    X(clRetainCommandQueue, cl_int, (cl_command_queue))                                     \
    X(clGetCommandQueueInfo, cl_int,                                                        \
      (cl_command_queue, cl_command_queue_info, size_t, void *, size_t *))                  \
    X(clCreateBuffer, cl_mem, (cl_context, cl_mem_flags, size_t, void *, cl_int *))         \
    X(clRetainMemObject, cl_int, (cl_mem))                                                  \
    X(clReleaseMemObject, cl_int, (cl_mem))                                                 \
    X(clGetMemObjectInfo, cl_int, (cl_mem, cl_mem_info, size_t, void *, size_t *))          \
    X(clEnqueueReadBuffer, cl_int,                                                          \
      (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint, const cl_event *, \
       cl_event *))                                                                         \
    X(clEnqueueWriteBuffer, cl_int,                                                         \
      (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,            \
       const cl_event *, cl_event *))                                                       \
    X(clEnqueueCopyBuffer, cl_int,                                                          \
      (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *, \
       cl_event *))                                                                         \
    X(clEnqueueFillBuffer, cl_int,                                                          \
      (cl_command_queue, cl_mem, const void *, size_t, size_t, size_t, cl_uint,             \
       const cl_event *, cl_event *))                                                       \
    X(clCreateProgramWithSource, cl_program,                                                \
      (cl_context, cl_uint, const char **, const size_t *, cl_int *))                       \
    X(clCreateProgramWithBinary, cl_program,                                                \
      (cl_context, cl_uint, const cl_device_id *, const size_t *, const unsigned char **,   \
       cl_int *, cl_int *))                                                                 \
    X(clBuildProgram, cl_int,                                                               \
      (cl_program, cl_uint, const cl_device_id *, const char *,                             \
       void(CL_CALLBACK *)(cl_program, void *), void *))                                    \
    X(clGetProgramInfo, cl_int, (cl_program, cl_program_info, size_t, void *, size_t *))    \
    X(clGetProgramBuildInfo, cl_int,                                                        \
      (cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *))          \
    X(clReleaseProgram, cl_int, (cl_program))                                               \
    X(clCreateKernel, cl_kernel, (cl_program, const char *, cl_int *))                      \
    X(clReleaseKernel, cl_int, (cl_kernel))                                                 \
    X(clGetKernelInfo, cl_int, (cl_kernel, cl_kernel_info, size_t, void *, size_t *))       \
    X(clSetKernelArg, cl_int, (cl_kernel, cl_uint, size_t, const void *))                   \
    X(clGetKernelWorkGroupInfo, cl_int,                                                     \
      (cl_kernel, cl_device_id, cl_kernel_work_group_info, size_t, void *, size_t *))       \
    X(clEnqueueNDRangeKernel, cl_int,                                                       \
      (cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *, \
       cl_uint, const cl_event *, cl_event *))                                              \
    X(clWaitForEvents, cl_int, (cl_uint, const cl_event *))                                 \
    X(clReleaseEvent, cl_int, (cl_event))                                                   \
    X(clGetEventProfilingInfo, cl_int, (cl_event, cl_profiling_info, size_t, void *, size_t *)) \
    X(clEnqueueMarkerWithWaitList, cl_int,                                                  \
      (cl_command_queue, cl_uint, const cl_event *, cl_event *))                            \
    X(clEnqueueBarrierWithWaitList, cl_int,                                                 \
      (cl_command_queue, cl_uint, const cl_event *, cl_event *))                            \
    X(clFlush, cl_int, (cl_command_queue))                                                  \
    X(clFinish, cl_int, (cl_command_queue))

typedef struct fa_cl_api {
#define FA_CL_MEMBER(name, ret, args) ret(CL_API_CALL *name) args;
    FA_CL_FUNCTIONS(FA_CL_MEMBER)
#undef FA_CL_MEMBER
} fa_cl_api;

/* Loaded by the backend's init; valid whenever a context exists. */
extern fa_cl_api fa_cl;

typedef struct fa_cl_context {
    int index;
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;     /* in use: own_queue, or the caller's (retained) */
    cl_command_queue own_queue; /* in order, profiling enabled */
    fa_device_info info;
    struct fa_cl_rows_kernels *rows; /* cl_rows.c's program: NULL until a pass needs it */
} fa_cl_context;

typedef struct fa_cl_buffer {
    cl_mem mem;
    size_t bytes;
} fa_cl_buffer;

/* Every plan object of the OpenCL backend starts with its kind, so the
 * entry points that receive only the object (release, timing) can tell the
 * fused kernels' plans from standard attention's. */
typedef enum fa_cl_plan_kind {
    FA_CL_PLAN_FUSED = 1,
    FA_CL_PLAN_STANDARD = 2,
    FA_CL_PLAN_KVCACHE = 3
} fa_cl_plan_kind;

/* An OpenCL error as a status with a message naming the call and the code. */
fa_status fa_cl_error(cl_int err, const char *what);

/* Build a program from embedded kernel sources (paths as in
 * core/kernel_sources.h, concatenated in order) with build options, through
 * the kernel-binary cache. A build failure returns FA_ERR_COMPILE with the
 * compiler log in the message. */
fa_status fa_cl_build(fa_cl_context *ctx, const char *const *paths, int path_count,
                      const char *options, cl_program *program);
/* One kernel of a built program; a failure names the kernel. */
fa_status fa_cl_create_kernel(cl_program program, const char *name, cl_kernel *out);
/* A plan's device buffer (read-write; filled from host when that is not
 * NULL). An allocation the device refuses is FA_ERR_OUT_OF_MEMORY naming
 * what the buffer holds, so that a plan too large for the device says which
 * of its buffers did not fit. */
fa_status fa_cl_create_plan_buffer(fa_cl_context *ctx, size_t bytes, const void *host, const char *what,
                                   cl_mem *out);

/* Enqueue a kernel; *event (may be NULL) gets a profiling event. A zero
 * global size launches nothing, succeeds, and leaves *event NULL. */
fa_status fa_cl_launch(fa_cl_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global,
                       const size_t *local, cl_event *event);
/* Launch records for profiling through another runtime (cl_record.c):
 * with FLASHATTN_OPENCL_RECORD naming a folder, the arguments set through
 * cl_args.h are kept per thread, and fa_cl_launch writes the launch (the
 * program binary, the sizes, every argument, the buffers' contents before
 * it) into a folder of its own there, for tools/cl_replay. Without the
 * variable both do nothing. */
void fa_cl_record_arg(cl_kernel kernel, cl_uint index, size_t size, const void *value, int is_mem);
void fa_cl_record_launch(fa_cl_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global,
                         const size_t *local);
/* The variables are read again at the next launch (a context's creation
 * calls it, so that a process may set them between contexts). */
void fa_cl_record_refresh(void);

/* Milliseconds between an event's start and end (waits for it); negative
 * when the event cannot be timed. */
double fa_cl_event_ms(cl_event event);

/* The attention half (cl_attention.c). */
fa_status fa_cl_plan_prepare(void *ctx, const fa_plan_s *plan, void **plan_impl);
void fa_cl_plan_release(void *ctx, void *plan_impl);
fa_status fa_cl_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
fa_status fa_cl_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
fa_status fa_cl_last_time_ms(void *ctx, void *plan_impl, double *ms);
fa_status fa_cl_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args);

/* The ring's element-wise passes (cl_rows.c). */
fa_status fa_cl_rows(void *ctx, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                     const fa_rows_view *src, float value);
fa_status fa_cl_rows_merge(void *ctx, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                           const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l);
/* Releases the context's rows program, if a pass built it. */
void fa_cl_rows_release(fa_cl_context *ctx);

#endif
