/* The OpenCL backend's runtime half: the ICD loader opened at run time, the
 * ops table core dispatches through, contexts, buffers, launches and event
 * timing. Device queries live in cl_device.c, program builds in cl_build.c. */
#include "cl_runtime_internal.h"

#include "dynlib.h"
#include "fa_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fa_cl_api fa_cl;

static void *fa_cl_library;

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */

fa_status fa_cl_load(char *reason, size_t reason_size) {
    static const char *const names[] = {
#if defined(__APPLE__)
        "/System/Library/Frameworks/OpenCL.framework/OpenCL",
#endif
        "libOpenCL.so.1", "libOpenCL.so", NULL};
    char why[1024];
    void *lib = fa_dynlib_open(names, why, sizeof why);
    if (!lib) {
        snprintf(reason, reason_size, "OpenCL ICD loader not found: %s", why);
        return FA_ERR_BACKEND_UNAVAILABLE;
    }
    fa_cl_api api;
    memset(&api, 0, sizeof api);
    /* ISO C cannot convert void * to a function pointer; copying the bytes
     * is exact on every platform with dlsym (POSIX requires it to be). */
#define FA_CL_RESOLVE(fn, ret, args)                                                           \
    {                                                                                          \
        void *sym = fa_dynlib_symbol(lib, #fn, why, sizeof why);                               \
        _Static_assert(sizeof sym == sizeof api.fn, "function and object pointers differ");   \
        if (!sym) {                                                                            \
            snprintf(reason, reason_size, "OpenCL ICD loader lacks a function: %s", why);       \
            fa_dynlib_close(lib);                                                              \
            return FA_ERR_BACKEND_UNAVAILABLE;                                                 \
        }                                                                                      \
        memcpy(&api.fn, &sym, sizeof sym);                                                     \
    }
    FA_CL_FUNCTIONS(FA_CL_RESOLVE)
#undef FA_CL_RESOLVE
    fa_cl = api;
    fa_cl_library = lib;
    return FA_SUCCESS;
}

static fa_status cl_init(char *reason, size_t reason_size) {
    /* Core calls init once; a second call (a test driving the table by
     * hand) keeps what the first one found. */
    if (fa_cl_library && fa_cl_device_count() > 0) return FA_SUCCESS;
    char local[1024];
    if (!reason || reason_size == 0) {
        reason = local;
        reason_size = sizeof local;
    }
    reason[0] = '\0';
    fa_status st = fa_cl_load(reason, reason_size);
    if (st == FA_SUCCESS) st = fa_cl_enumerate(reason, reason_size);
    if (st != FA_SUCCESS) {
        if (fa_cl_library) {
            fa_dynlib_close(fa_cl_library);
            fa_cl_library = NULL;
            memset(&fa_cl, 0, sizeof fa_cl);
        }
        return fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "%s", reason);
    }
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

typedef struct cl_error_entry {
    cl_int code;
    const char *name;
} cl_error_entry;

#define CL_ERR(name) {name, #name}
static const cl_error_entry cl_error_table[] = {
    CL_ERR(CL_SUCCESS),
    CL_ERR(CL_DEVICE_NOT_FOUND),
    CL_ERR(CL_DEVICE_NOT_AVAILABLE),
    CL_ERR(CL_COMPILER_NOT_AVAILABLE),
    CL_ERR(CL_MEM_OBJECT_ALLOCATION_FAILURE),
    CL_ERR(CL_OUT_OF_RESOURCES),
    CL_ERR(CL_OUT_OF_HOST_MEMORY),
    CL_ERR(CL_PROFILING_INFO_NOT_AVAILABLE),
    CL_ERR(CL_MEM_COPY_OVERLAP),
    CL_ERR(CL_IMAGE_FORMAT_MISMATCH),
    CL_ERR(CL_IMAGE_FORMAT_NOT_SUPPORTED),
    CL_ERR(CL_BUILD_PROGRAM_FAILURE),
    CL_ERR(CL_MAP_FAILURE),
    CL_ERR(CL_MISALIGNED_SUB_BUFFER_OFFSET),
    CL_ERR(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
    CL_ERR(CL_COMPILE_PROGRAM_FAILURE),
    CL_ERR(CL_LINKER_NOT_AVAILABLE),
    CL_ERR(CL_LINK_PROGRAM_FAILURE),
    CL_ERR(CL_DEVICE_PARTITION_FAILED),
    CL_ERR(CL_KERNEL_ARG_INFO_NOT_AVAILABLE),
    CL_ERR(CL_INVALID_VALUE),
    CL_ERR(CL_INVALID_DEVICE_TYPE),
    CL_ERR(CL_INVALID_PLATFORM),
    CL_ERR(CL_INVALID_DEVICE),
    CL_ERR(CL_INVALID_CONTEXT),
    CL_ERR(CL_INVALID_QUEUE_PROPERTIES),
    CL_ERR(CL_INVALID_COMMAND_QUEUE),
    CL_ERR(CL_INVALID_HOST_PTR),
    CL_ERR(CL_INVALID_MEM_OBJECT),
    CL_ERR(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR),
    CL_ERR(CL_INVALID_IMAGE_SIZE),
    CL_ERR(CL_INVALID_SAMPLER),
    CL_ERR(CL_INVALID_BINARY),
    CL_ERR(CL_INVALID_BUILD_OPTIONS),
    CL_ERR(CL_INVALID_PROGRAM),
    CL_ERR(CL_INVALID_PROGRAM_EXECUTABLE),
    CL_ERR(CL_INVALID_KERNEL_NAME),
    CL_ERR(CL_INVALID_KERNEL_DEFINITION),
    CL_ERR(CL_INVALID_KERNEL),
    CL_ERR(CL_INVALID_ARG_INDEX),
    CL_ERR(CL_INVALID_ARG_VALUE),
    CL_ERR(CL_INVALID_ARG_SIZE),
    CL_ERR(CL_INVALID_KERNEL_ARGS),
    CL_ERR(CL_INVALID_WORK_DIMENSION),
    CL_ERR(CL_INVALID_WORK_GROUP_SIZE),
    CL_ERR(CL_INVALID_WORK_ITEM_SIZE),
    CL_ERR(CL_INVALID_GLOBAL_OFFSET),
    CL_ERR(CL_INVALID_EVENT_WAIT_LIST),
    CL_ERR(CL_INVALID_EVENT),
    CL_ERR(CL_INVALID_OPERATION),
    CL_ERR(CL_INVALID_GL_OBJECT),
    CL_ERR(CL_INVALID_BUFFER_SIZE),
    CL_ERR(CL_INVALID_MIP_LEVEL),
    CL_ERR(CL_INVALID_GLOBAL_WORK_SIZE),
    CL_ERR(CL_INVALID_PROPERTY),
    CL_ERR(CL_INVALID_IMAGE_DESCRIPTOR),
    CL_ERR(CL_INVALID_COMPILER_OPTIONS),
    CL_ERR(CL_INVALID_LINKER_OPTIONS),
    CL_ERR(CL_INVALID_DEVICE_PARTITION_COUNT),
    /* Later versions and the ICD extension; the 1.2 headers lack them. */
    {-69, "CL_INVALID_PIPE_SIZE"},
    {-70, "CL_INVALID_DEVICE_QUEUE"},
    {-71, "CL_INVALID_SPEC_ID"},
    {-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
    {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
};
#undef CL_ERR

const char *fa_cl_error_name(cl_int err) {
    for (size_t i = 0; i < FA_ARRAY_SIZE(cl_error_table); i++)
        if (cl_error_table[i].code == err) return cl_error_table[i].name;
    return NULL;
}

fa_status fa_cl_error(cl_int err, const char *what) {
    const char *name = fa_cl_error_name(err);
    fa_status status = FA_ERR_LAUNCH;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
        err == CL_OUT_OF_HOST_MEMORY)
        status = FA_ERR_OUT_OF_MEMORY;
    return fa_fail(status, "%s failed: %s (%d)", what ? what : "OpenCL call",
                   name ? name : "unknown OpenCL error", (int)err);
}

/* ------------------------------------------------------------------------ */
/* Devices and contexts                                                     */

static int cl_device_count_op(void) { return fa_cl_device_count(); }

static fa_status cl_device_info_op(int index, fa_device_info *info) {
    return fa_cl_device_info(index, info);
}

static fa_status cl_context_create(int index, void **out) {
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    *out = NULL;
    const fa_cl_device *dev = fa_cl_device_get(index);
    if (!dev)
        return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "OpenCL device index %d is not in [0, %d)", index,
                       fa_cl_device_count());
    fa_cl_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for an OpenCL context");
    fa_cl_record_refresh();
    ctx->index = index;
    ctx->platform = dev->platform;
    ctx->device = dev->device;

    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)dev->platform, 0};
    cl_int err = CL_SUCCESS;
    ctx->context = fa_cl.clCreateContext(props, 1, &dev->device, NULL, NULL, &err);
    if (!ctx->context || err != CL_SUCCESS) {
        free(ctx);
        return fa_cl_error(err != CL_SUCCESS ? err : CL_INVALID_CONTEXT, "clCreateContext");
    }
    ctx->own_queue = fa_cl.clCreateCommandQueue(ctx->context, dev->device, CL_QUEUE_PROFILING_ENABLE, &err);
    ctx->queue = ctx->own_queue;
    if (!ctx->queue || err != CL_SUCCESS) {
        fa_cl.clReleaseContext(ctx->context);
        free(ctx);
        return fa_cl_error(err != CL_SUCCESS ? err : CL_INVALID_COMMAND_QUEUE, "clCreateCommandQueue");
    }
    fa_cl_bandwidth_ensure(ctx);
    fa_status st = fa_cl_device_info(index, &ctx->info);
    if (st != FA_SUCCESS) {
        fa_cl.clReleaseCommandQueue(ctx->own_queue);
        fa_cl.clReleaseContext(ctx->context);
        free(ctx);
        return st;
    }
    *out = ctx;
    return FA_SUCCESS;
}

static void cl_context_destroy(void *handle) {
    fa_cl_context *ctx = handle;
    if (!ctx) return;
    /* Work still queued may reference buffers the caller is about to free.
     * Core has handed a caller's queue back by now. */
    fa_cl.clFinish(ctx->own_queue);
    fa_cl_rows_release(ctx);
    fa_cl.clReleaseCommandQueue(ctx->own_queue);
    fa_cl.clReleaseContext(ctx->context);
    free(ctx);
}

static fa_status cl_context_synchronize(void *handle) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    cl_int err = fa_cl.clFinish(ctx->queue);
    return err == CL_SUCCESS ? FA_SUCCESS : fa_cl_error(err, "clFinish");
}

static fa_status cl_context_native(void *handle, void **native_context, void **native_queue) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (native_context) *native_context = (void *)ctx->context;
    if (native_queue) *native_queue = (void *)ctx->queue;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Caller queues (core decides when; see core/backend.h)                    */

/* A queue property, with the message naming what was asked. */
static fa_status queue_info(cl_command_queue queue, cl_command_queue_info what, const char *name, size_t size,
                            void *value) {
    cl_int err = fa_cl.clGetCommandQueueInfo(queue, what, size, value, NULL);
    if (err == CL_SUCCESS) return FA_SUCCESS;
    const char *code = fa_cl_error_name(err);
    return fa_fail(FA_ERR_INVALID_ARGUMENT,
                   "queue is not a usable cl_command_queue: clGetCommandQueueInfo(%s): %s (%d)", name,
                   code ? code : "unknown OpenCL error", (int)err);
}

static fa_status cl_queue_adopt(void *handle, void *native) {
    fa_cl_context *ctx = handle;
    cl_command_queue queue = native;
    cl_context owner = NULL;
    cl_device_id device = NULL;
    cl_command_queue_properties props = 0;
    FA_CHECK(queue_info(queue, CL_QUEUE_CONTEXT, "CL_QUEUE_CONTEXT", sizeof owner, &owner));
    if (owner != ctx->context)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "queue belongs to another cl_context than this flashattn context's "
                       "(fa_context_get_native gives it)");
    FA_CHECK(queue_info(queue, CL_QUEUE_DEVICE, "CL_QUEUE_DEVICE", sizeof device, &device));
    if (device != ctx->device)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "queue runs on another device than this context's (%s)",
                       ctx->info.desc.name);
    FA_CHECK(queue_info(queue, CL_QUEUE_PROPERTIES, "CL_QUEUE_PROPERTIES", sizeof props, &props));
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "queue executes out of order: the kernels of a pass rely on running in the order queued");
    cl_int err = fa_cl.clRetainCommandQueue(queue);
    return err == CL_SUCCESS ? FA_SUCCESS : fa_cl_error(err, "clRetainCommandQueue");
}

static void cl_queue_drop(void *handle, void *native) {
    (void)handle;
    fa_cl.clReleaseCommandQueue((cl_command_queue)native);
}

static fa_status cl_queue_order(void *handle, void *later, void *earlier) {
    (void)handle;
    cl_event marker = NULL;
    cl_int err = fa_cl.clEnqueueMarkerWithWaitList((cl_command_queue)earlier, 0, NULL, &marker);
    if (err != CL_SUCCESS) return fa_cl_error(err, "clEnqueueMarkerWithWaitList on the previous queue");
    /* Another queue may wait on the marker only once it is submitted. */
    err = fa_cl.clFlush((cl_command_queue)earlier);
    if (err == CL_SUCCESS) err = fa_cl.clEnqueueBarrierWithWaitList((cl_command_queue)later, 1, &marker, NULL);
    fa_cl.clReleaseEvent(marker);
    return err == CL_SUCCESS ? FA_SUCCESS : fa_cl_error(err, "ordering the new queue after the previous one");
}

static void cl_queue_select(void *handle, void *native) {
    fa_cl_context *ctx = handle;
    ctx->queue = native ? (cl_command_queue)native : ctx->own_queue;
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */

fa_status fa_cl_create_plan_buffer(fa_cl_context *ctx, size_t bytes, const void *host, const char *what,
                                   cl_mem *out) {
    cl_int err = CL_SUCCESS;
    if (bytes == 0) bytes = 16; /* a zero-sized buffer is an error in OpenCL */
    const cl_mem_flags flags = CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0);
    *out = fa_cl.clCreateBuffer(ctx->context, flags, bytes, (void *)host, &err);
    if (*out && err == CL_SUCCESS) return FA_SUCCESS;
    *out = NULL;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY ||
        err == CL_INVALID_BUFFER_SIZE)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of %s on the device", bytes, what);
    return fa_cl_error(err != CL_SUCCESS ? err : CL_INVALID_MEM_OBJECT, "clCreateBuffer");
}

static fa_status cl_buffer_alloc(void *handle, size_t bytes, void **out) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    const fa_cl_device *dev = fa_cl_device_get(ctx->index);
    if (dev && (cl_ulong)bytes > dev->max_alloc_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "cannot allocate %zu bytes: %s allows at most %llu bytes per buffer "
                       "(CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                       bytes, dev->info.desc.name, (unsigned long long)dev->max_alloc_bytes);
    fa_cl_buffer *buf = malloc(sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a buffer handle");
    cl_int err = CL_SUCCESS;
    buf->mem = fa_cl.clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!buf->mem || err != CL_SUCCESS) {
        free(buf);
        if (err == CL_SUCCESS) err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        const char *name = fa_cl_error_name(err);
        if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
            err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE)
            return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes on the device: clCreateBuffer: %s (%d)",
                           bytes, name ? name : "unknown OpenCL error", (int)err);
        return fa_cl_error(err, "clCreateBuffer");
    }
    buf->bytes = bytes;
    *out = buf;
    return FA_SUCCESS;
}

static fa_status cl_buffer_wrap(void *handle, void *native, size_t bytes, void **out) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (!native) return fa_fail(FA_ERR_NULL_POINTER, "native is NULL (expected a cl_mem)");
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    cl_mem mem = (cl_mem)native;
    cl_context owner = NULL;
    cl_int err = fa_cl.clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err != CL_SUCCESS) {
        const char *name = fa_cl_error_name(err);
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "native is not a usable cl_mem: clGetMemObjectInfo: %s (%d)",
                       name ? name : "unknown OpenCL error", (int)err);
    }
    if (owner != ctx->context)
        return fa_fail(FA_ERR_FOREIGN_BUFFER,
                       "native cl_mem belongs to another cl_context than this flashattn context");
    size_t size = 0;
    err = fa_cl.clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err != CL_SUCCESS) return fa_cl_error(err, "clGetMemObjectInfo(CL_MEM_SIZE)");
    if (size < bytes)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "bytes (%zu) exceeds the size of the native cl_mem (%zu)",
                       bytes, size);
    fa_cl_buffer *buf = malloc(sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a buffer handle");
    /* Our own reference: the caller keeps theirs, and release on free only
     * drops ours. */
    err = fa_cl.clRetainMemObject(mem);
    if (err != CL_SUCCESS) {
        free(buf);
        return fa_cl_error(err, "clRetainMemObject");
    }
    buf->mem = mem;
    buf->bytes = bytes;
    *out = buf;
    return FA_SUCCESS;
}

static void cl_buffer_free(void *handle, void *b) {
    (void)handle;
    fa_cl_buffer *buf = b;
    if (!buf) return;
    fa_cl.clReleaseMemObject(buf->mem);
    free(buf);
}

static fa_status check_range(const fa_cl_buffer *buf, size_t offset, size_t bytes, const char *what) {
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "%s of %zu bytes at offset %zu runs past the end of a %zu-byte buffer",
                       what, bytes, offset, buf->bytes);
    return FA_SUCCESS;
}

static fa_status cl_buffer_upload(void *handle, void *b, size_t offset, const void *src, size_t bytes) {
    fa_cl_context *ctx = handle;
    fa_cl_buffer *buf = b;
    if (!ctx || !buf) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !ctx ? "ctx" : "buf");
    FA_CHECK(check_range(buf, offset, bytes, "upload"));
    if (bytes == 0) return FA_SUCCESS;
    if (!src) return fa_fail(FA_ERR_NULL_POINTER, "src is NULL");
    cl_int err = fa_cl.clEnqueueWriteBuffer(ctx->queue, buf->mem, CL_TRUE, offset, bytes, src, 0, NULL, NULL);
    return err == CL_SUCCESS ? FA_SUCCESS : fa_cl_error(err, "clEnqueueWriteBuffer");
}

static fa_status cl_buffer_download(void *handle, void *b, size_t offset, void *dst, size_t bytes) {
    fa_cl_context *ctx = handle;
    fa_cl_buffer *buf = b;
    if (!ctx || !buf) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !ctx ? "ctx" : "buf");
    FA_CHECK(check_range(buf, offset, bytes, "download"));
    if (bytes == 0) return FA_SUCCESS;
    if (!dst) return fa_fail(FA_ERR_NULL_POINTER, "dst is NULL");
    cl_int err = fa_cl.clEnqueueReadBuffer(ctx->queue, buf->mem, CL_TRUE, offset, bytes, dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? FA_SUCCESS : fa_cl_error(err, "clEnqueueReadBuffer");
}

static void *cl_buffer_native(void *handle, void *b) {
    (void)handle;
    fa_cl_buffer *buf = b;
    return buf ? (void *)buf->mem : NULL;
}

/* ------------------------------------------------------------------------ */
/* Launches and timing                                                      */

fa_status fa_cl_launch(fa_cl_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global,
                       const size_t *local, cl_event *event) {
    if (event) *event = NULL;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!kernel) return fa_fail(FA_ERR_NULL_POINTER, "kernel is NULL");
    if (!global) return fa_fail(FA_ERR_NULL_POINTER, "global is NULL");
    if (dims < 1 || dims > 3) return fa_fail(FA_ERR_INTERNAL, "dims is %u, not 1, 2 or 3", (unsigned)dims);
    for (cl_uint d = 0; d < dims; d++) {
        /* An empty range is legal in OpenCL 2.x but not 1.2; nothing to run. */
        if (global[d] == 0) return FA_SUCCESS;
        if (local && (local[d] == 0 || global[d] % local[d] != 0))
            return fa_fail(FA_ERR_INTERNAL, "global[%u] = %zu is not a multiple of local[%u] = %zu",
                           (unsigned)d, global[d], (unsigned)d, local[d]);
    }
    fa_cl_record_launch(ctx, kernel, dims, global, local);
    cl_int err = fa_cl.clEnqueueNDRangeKernel(ctx->queue, kernel, dims, NULL, global, local, 0, NULL, event);
    if (err != CL_SUCCESS) {
        if (event) *event = NULL;
        return fa_cl_error(err, "clEnqueueNDRangeKernel");
    }
    return FA_SUCCESS;
}

/* Returns a negative value when the event cannot be timed. */
double fa_cl_event_ms(cl_event event) {
    if (!event) return -1.0;
    if (fa_cl.clWaitForEvents(1, &event) != CL_SUCCESS) return -1.0;
    cl_ulong start = 0, end = 0;
    if (fa_cl.clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) != CL_SUCCESS ||
        fa_cl.clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) != CL_SUCCESS)
        return -1.0;
    if (end < start) return -1.0;
    return (double)(end - start) * 1e-6;
}

/* ------------------------------------------------------------------------ */

const fa_backend_ops fa_opencl_backend = {
    .id = FA_BACKEND_OPENCL,
    .name = "opencl",
    .init = cl_init,
    .device_count = cl_device_count_op,
    .device_info = cl_device_info_op,
    .context_create = cl_context_create,
    .context_destroy = cl_context_destroy,
    .context_synchronize = cl_context_synchronize,
    .context_native = cl_context_native,
    .queue_adopt = cl_queue_adopt,
    .queue_drop = cl_queue_drop,
    .queue_order = cl_queue_order,
    .queue_select = cl_queue_select,
    .buffer_alloc = cl_buffer_alloc,
    .buffer_wrap = cl_buffer_wrap,
    .buffer_free = cl_buffer_free,
    .buffer_upload = cl_buffer_upload,
    .buffer_download = cl_buffer_download,
    .buffer_native = cl_buffer_native,
    .plan_prepare = fa_cl_plan_prepare,
    .plan_release = fa_cl_plan_release,
    .forward = fa_cl_forward,
    .backward = fa_cl_backward,
    .forward_kvcache = fa_cl_forward_kvcache,
    .rows = fa_cl_rows,
    .rows_merge = fa_cl_rows_merge,
    .last_time_ms = fa_cl_last_time_ms,
};
