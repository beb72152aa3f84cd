/* The CUDA backend's runtime half: the driver API loaded at run time, device
 * discovery and description, contexts, memory and zero-copy interop.
 *
 * Nothing here links against a vendor library: cuda.h and nvrtc.h supply
 * types only, and every entry point comes from dlopen (see
 * cuda_runtime_internal.h for the names tried and the environment variables
 * that override them). One build therefore runs on machines with or without
 * a driver; without one the backend reports itself unavailable with the
 * loader's reason.
 *
 * Plans, passes and timing are the attention half's (cuda_attention.c). */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"

#include "device_describe.h"
#include "device_registry.h"
#include "dynlib.h"
#include "fa_internal.h"
#include "plan.h"
#include "reason.h"
#include "span.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cuda_load(void);

/* State written once by cuda_load (through the registry's pthread_once),
 * read-only afterwards. */
static fa_device_registry cuda_registry = FA_DEVICE_REGISTRY_INIT("CUDA", cuda_load);
static fa_cu_api cuda_api;
static int cuda_cc[FA_REGISTRY_MAX_DEVICES][2];

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static fa_nvrtc_api nvrtc_api;
static int nvrtc_loaded;
static char nvrtc_reason[FA_REGISTRY_REASON_SIZE];

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

static const char *cu_alternative_name(const char *name) {
    if (strcmp(name, "cuEventElapsedTime_v2") == 0) return "cuEventElapsedTime";
    return NULL;
}

/* Names of the codes a broken installation produces, for when the driver
 * cannot name its own errors (the link stub's cuGetErrorName fails too). */
static const struct {
    CUresult code;
    const char *name;
} cu_known_errors[] = {
#define FA_CU_KNOWN(code) {code, #code}
    FA_CU_KNOWN(CUDA_ERROR_INVALID_VALUE),
    FA_CU_KNOWN(CUDA_ERROR_OUT_OF_MEMORY),
    FA_CU_KNOWN(CUDA_ERROR_NOT_INITIALIZED),
    FA_CU_KNOWN(CUDA_ERROR_STUB_LIBRARY),
    FA_CU_KNOWN(CUDA_ERROR_DEVICE_UNAVAILABLE),
    FA_CU_KNOWN(CUDA_ERROR_NO_DEVICE),
    FA_CU_KNOWN(CUDA_ERROR_INVALID_DEVICE),
    FA_CU_KNOWN(CUDA_ERROR_OPERATING_SYSTEM),
    FA_CU_KNOWN(CUDA_ERROR_NOT_FOUND),
    FA_CU_KNOWN(CUDA_ERROR_SYSTEM_NOT_READY),
    FA_CU_KNOWN(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH),
    FA_CU_KNOWN(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
    FA_CU_KNOWN(CUDA_ERROR_UNKNOWN),
#undef FA_CU_KNOWN
};

static void cu_describe(CUresult result, char *out, size_t out_size) {
    const char *name = NULL, *text = NULL;
    if (cuda_api.cuGetErrorName && cuda_api.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = NULL;
    if (cuda_api.cuGetErrorString && cuda_api.cuGetErrorString(result, &text) != CUDA_SUCCESS)
        text = NULL;
    for (size_t i = 0; !name && i < FA_ARRAY_SIZE(cu_known_errors); i++)
        if (cu_known_errors[i].code == result) name = cu_known_errors[i].name;
    if (result == CUDA_ERROR_STUB_LIBRARY && !text)
        text = "this libcuda is the toolkit's link stub, not a driver";
    if (name && text)
        snprintf(out, out_size, "%s: %s", name, text);
    else if (name)
        snprintf(out, out_size, "%s", name);
    else
        snprintf(out, out_size, "CUDA error %d", (int)result);
}

fa_status fa_cuda_error(CUresult result, const char *what) {
    char text[512];
    cu_describe(result, text, sizeof text);
    fa_status status = result == CUDA_ERROR_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_LAUNCH;
    return fa_fail(status, "%s: %s", what, text);
}

/* Vector FP32 rate of one SM: 2 flops per FMA times the FP32 lanes. Ampere's
 * GA100 (sm_80) has 64 lanes per SM, the GA10x, Ada, Hopper and Blackwell
 * SMs 128; Volta and Turing 64; consumer Pascal 128. */
static double sm_fp32_flops_per_clock(int major, int minor) {
    if (major >= 9) return 256.0;
    if (major == 8) return minor == 0 ? 128.0 : 256.0;
    if (major == 6 && minor >= 1) return 256.0;
    return 128.0;
}

/* Dense fp16/bf16 tensor-core rate of one SM (fp32 accumulation), from the
 * data-sheet peaks divided by SMs and boost clock: A100 312 TFLOP/s (2048),
 * A10/A40/L40S (1024; GeForce parts halve it with fp32 accumulation), H100
 * 989 TFLOP/s (4096, reached only by wgmma: the mma.sync instructions our
 * kernels use get about two thirds of it). Architectures after Hopper are not
 * characterised here and get the conservative mma.sync rate of sm_86. Below
 * sm_80 the kernels' m16n8k16 instruction does not exist: 0. */
static double sm_matrix_flops_per_clock(int major, int minor) {
    if (major < 8) return 0.0;
    if (major == 8) return minor == 0 ? 2048.0 : 1024.0;
    if (major == 9) return 4096.0;
    return 1024.0;
}

static int cu_attribute(CUdevice dev, CUdevice_attribute attribute, const char *name, int *value,
                        char *why, size_t why_size) {
    CUresult r = cuda_api.cuDeviceGetAttribute(value, attribute, dev);
    if (r == CUDA_SUCCESS) return 1;
    char text[512];
    cu_describe(r, text, sizeof text);
    snprintf(why, why_size, "cuDeviceGetAttribute(%s): %s", name, text);
    return 0;
}

static int cuda_describe_device(int index, fa_device_info *info, int cc[2], char *why,
                                size_t why_size) {
    CUdevice dev;
    char text[512];
    CUresult r = cuda_api.cuDeviceGet(&dev, index);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        snprintf(why, why_size, "cuDeviceGet(%d): %s", index, text);
        return 0;
    }
    fa_describe_gpu_begin(info, FA_BACKEND_CUDA, index, "NVIDIA");
    fa_device_desc *d = &info->desc;

    r = cuda_api.cuDeviceGetName(d->name, (int)sizeof d->name, dev);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        snprintf(why, why_size, "cuDeviceGetName(%d): %s", index, text);
        return 0;
    }
    d->name[sizeof d->name - 1] = '\0';

    int version = 0;
    r = cuda_api.cuDriverGetVersion(&version);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        snprintf(why, why_size, "cuDriverGetVersion: %s", text);
        return 0;
    }
    /* 13000 -> "13.0", 12080 -> "12.8". */
    snprintf(info->driver_version, sizeof info->driver_version, "%d.%d", version / 1000,
             (version % 1000) / 10);

    int major = 0, minor = 0, smem_optin = 0, smem = 0, threads = 0, warp = 0, sms = 0;
    int clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
#define FA_CU_ATTR(attr, var) \
    if (!cu_attribute(dev, attr, #attr, &var, why, why_size)) return 0
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, major);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, minor);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, smem);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, smem_optin);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, threads);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_WARP_SIZE, warp);
    FA_CU_ATTR(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, sms);
#undef FA_CU_ATTR
    /* Clocks are informational: a driver that stops reporting them (they are
     * deprecated in the runtime API) leaves 0 rather than hiding the device. */
    if (cuda_api.cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) != CUDA_SUCCESS)
        clock_khz = 0;
    if (cuda_api.cuDeviceGetAttribute(&mem_clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev) !=
        CUDA_SUCCESS)
        mem_clock_khz = 0;
    if (cuda_api.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev) !=
        CUDA_SUCCESS)
        bus_bits = 0;

    int l2 = 0;
    if (cuda_api.cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev) != CUDA_SUCCESS) l2 = 0;

    size_t total = 0;
    r = cuda_api.cuDeviceTotalMem_v2(&total, dev);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        snprintf(why, why_size, "cuDeviceTotalMem(%d): %s", index, text);
        return 0;
    }

    snprintf(d->arch, sizeof d->arch, "sm_%d%d", major, minor);
    /* Kernels opt in to the larger shared-memory carve-out, so the planner
     * may use all of it; devices without opt-in report 0 there. */
    d->local_mem_bytes = (size_t)(smem_optin > smem ? smem_optin : smem);
    d->max_work_group_size = threads;
    d->simd_width = warp;
    d->compute_units = sms;
    d->clock_mhz = clock_khz / 1000;
    fa_describe_queried_bandwidth(d, mem_clock_khz, bus_bits);
    d->global_mem_bytes = total;
    d->l2_cache_bytes = l2 > 0 ? (size_t)l2 : 0;
    d->fp32_flops_per_clock_cu = sm_fp32_flops_per_clock(major, minor);
    d->matrix_flops_per_clock_cu = sm_matrix_flops_per_clock(major, minor);
    if (major >= 8) {
        d->matrix_m = 16;
        d->matrix_n = 8;
        d->matrix_k = 16;
    }
    cc[0] = major;
    cc[1] = minor;
    return 1;
}

static void cuda_load(void) {
    char why[FA_REGISTRY_REASON_SIZE];
    static const char *const defaults[] = {"libcuda.so.1", "libcuda.so", NULL};
    const char *override_list[2];
    const char *const *names = fa_dynlib_names("FLASHATTN_CUDA_LIBRARY", defaults, override_list);

    void *lib = fa_dynlib_open(names, why, sizeof why);
    if (!lib) {
        fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "CUDA driver library not found: %s", why);
        return;
    }
    /* The library stays loaded even when unusable: the driver registers
     * process-exit handlers once called, and unloading it under them is unsafe. */
    fa_cu_api api;
    memset(&api, 0, sizeof api);
#define FA_CU_LOAD(name, ret, args)                                                              \
    if (!fa_dynlib_load(lib, #name, cu_alternative_name(#name), &api.name, why, sizeof why)) {     \
        fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "CUDA driver lacks an entry point (too old?): %s", \
                 why);                                                                          \
        return;                                                                                 \
    }
    FA_CU_REQUIRED(FA_CU_LOAD)
#undef FA_CU_LOAD
#define FA_CU_LOAD_OPTIONAL(name, ret, args) \
    (void)fa_dynlib_load(lib, #name, NULL, &api.name, why, sizeof why);
    FA_CU_OPTIONAL(FA_CU_LOAD_OPTIONAL)
#undef FA_CU_LOAD_OPTIONAL
    cuda_api = api;

    char text[512];
    CUresult r = cuda_api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "cuInit: %s", text);
        return;
    }
    int count = 0;
    r = cuda_api.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        cu_describe(r, text, sizeof text);
        fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "cuDeviceGetCount: %s", text);
        return;
    }
    if (count <= 0) {
        fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "no CUDA device (cuDeviceGetCount reported 0)");
        return;
    }
    if (count > FA_REGISTRY_MAX_DEVICES) count = FA_REGISTRY_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        if (!cuda_describe_device(i, &cuda_registry.devices[i], cuda_cc[i], why, sizeof why)) {
            fa_reason_set(cuda_registry.reason, sizeof cuda_registry.reason, "CUDA device %d cannot be described: %s", i,
                     why);
            return;
        }
    }
    fa_registry_ready(&cuda_registry, count);
}

static void nvrtc_load(void) {
    char why[FA_REGISTRY_REASON_SIZE];
    /* The toolkit directory comes last, by absolute path, for machines where
     * it is installed but not on the loader's path. */
    static const char *const defaults[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    const char *override_list[2];
    const char *const *names = fa_dynlib_names("FLASHATTN_NVRTC_LIBRARY", defaults, override_list);
    void *lib = fa_dynlib_open(names, why, sizeof why);
    if (!lib) {
        fa_reason_set(nvrtc_reason, sizeof nvrtc_reason, "NVRTC not found: %s", why);
        return;
    }
    fa_nvrtc_api api;
    memset(&api, 0, sizeof api);
#define FA_NVRTC_LOAD(name, ret, args)                                                       \
    if (!fa_dynlib_load(lib, #name, NULL, &api.name, why, sizeof why)) {                       \
        fa_reason_set(nvrtc_reason, sizeof nvrtc_reason, "NVRTC lacks an entry point: %s", why); \
        return;                                                                             \
    }
    FA_NVRTC_REQUIRED(FA_NVRTC_LOAD)
#undef FA_NVRTC_LOAD
#define FA_NVRTC_LOAD_OPTIONAL(name, ret, args) \
    (void)fa_dynlib_load(lib, #name, NULL, &api.name, why, sizeof why);
    FA_NVRTC_OPTIONAL(FA_NVRTC_LOAD_OPTIONAL)
#undef FA_NVRTC_LOAD_OPTIONAL
    nvrtcResult r = api.nvrtcVersion(&api.version_major, &api.version_minor);
    if (r != NVRTC_SUCCESS) {
        const char *text = api.nvrtcGetErrorString(r);
        fa_reason_set(nvrtc_reason, sizeof nvrtc_reason, "nvrtcVersion: %s", text ? text : "failed");
        return;
    }
    nvrtc_api = api;
    nvrtc_loaded = 1;
    nvrtc_reason[0] = '\0';
}

const fa_cu_api *fa_cuda_api(void) {
    fa_registry_discover(&cuda_registry);
    return cuda_registry.status == FA_SUCCESS ? &cuda_api : NULL;
}

const fa_nvrtc_api *fa_cuda_nvrtc(char *reason, size_t reason_size) {
    pthread_once(&nvrtc_once, nvrtc_load);
    if (nvrtc_loaded) {
        fa_reason_copy(reason, reason_size, "");
        return &nvrtc_api;
    }
    fa_reason_copy(reason, reason_size, nvrtc_reason);
    return NULL;
}

int fa_cuda_nvrtc_available(char *reason, size_t reason_size) {
    return fa_cuda_nvrtc(reason, reason_size) != NULL;
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

static fa_status cuda_init(char *reason, size_t reason_size) {
    fa_status st = fa_registry_init(&cuda_registry, reason, reason_size);
    /* Recorded now so that plan creation can say why it cannot compile;
     * memory and devices work either way. */
    if (st == FA_SUCCESS) (void)fa_cuda_nvrtc(NULL, 0);
    return st;
}

static int cuda_device_count(void) { return fa_registry_count(&cuda_registry); }

static fa_status cuda_device_info(int index, fa_device_info *info) {
    return fa_registry_info(&cuda_registry, index, info);
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */
/* ------------------------------------------------------------------------ */

fa_status fa_cuda_push(const fa_cuda_context *ctx) {
    CUresult r = cuda_api.cuCtxPushCurrent_v2(ctx->context);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuCtxPushCurrent");
    return FA_SUCCESS;
}

void fa_cuda_pop(void) {
    CUcontext previous;
    (void)cuda_api.cuCtxPopCurrent_v2(&previous);
}

fa_status fa_cuda_events_ms(const fa_cuda_context *ctx, CUevent start, CUevent stop, double *ms) {
    FA_CHECK(fa_cuda_push(ctx));
    float t = 0.0f;
    CUresult r = cuda_api.cuEventSynchronize(stop);
    if (r == CUDA_SUCCESS) r = cuda_api.cuEventElapsedTime_v2(&t, start, stop);
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuEventElapsedTime");
    *ms = (double)t;
    return FA_SUCCESS;
}

static fa_status cuda_context_create(int index, void **out) {
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    *out = NULL;
    FA_CHECK(fa_registry_check(&cuda_registry, index));
    fa_cuda_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fa_fail(FA_ERR_OUT_OF_MEMORY, "CUDA context: host allocation failed");
    ctx->index = index;
    ctx->cc_major = cuda_cc[index][0];
    ctx->cc_minor = cuda_cc[index][1];
    ctx->sm_count = cuda_registry.devices[index].desc.compute_units;
    ctx->smem_optin = cuda_registry.devices[index].desc.local_mem_bytes;

    CUresult r = cuda_api.cuDeviceGet(&ctx->device, index);
    if (r != CUDA_SUCCESS) {
        free(ctx);
        return fa_cuda_error(r, "cuDeviceGet");
    }
    /* The primary context is the one the runtime API, PyTorch and most
     * libraries share: memory they allocate is directly usable here. */
    r = cuda_api.cuDevicePrimaryCtxRetain(&ctx->context, ctx->device);
    if (r != CUDA_SUCCESS) {
        free(ctx);
        return fa_cuda_error(r, "cuDevicePrimaryCtxRetain");
    }
    fa_status st = fa_cuda_push(ctx);
    if (st != FA_SUCCESS) {
        cuda_api.cuDevicePrimaryCtxRelease_v2(ctx->device);
        free(ctx);
        return st;
    }
    r = cuda_api.cuStreamCreate(&ctx->own_stream, CU_STREAM_NON_BLOCKING);
    ctx->stream = ctx->own_stream;
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) {
        st = fa_cuda_error(r, "cuStreamCreate");
        cuda_api.cuDevicePrimaryCtxRelease_v2(ctx->device);
        free(ctx);
        return st;
    }
    *out = ctx;
    return FA_SUCCESS;
}

static void cuda_context_destroy(void *handle) {
    fa_cuda_context *ctx = handle;
    if (!ctx) return;
    if (fa_cuda_push(ctx) == FA_SUCCESS) {
        /* Work still queued completes before the stream's resources go.
         * Core has handed a caller's stream back by now. */
        (void)cuda_api.cuStreamSynchronize(ctx->own_stream);
        (void)cuda_api.cuStreamDestroy_v2(ctx->own_stream);
        if (ctx->order_event) (void)cuda_api.cuEventDestroy_v2(ctx->order_event);
        fa_cuda_rows_release(ctx);
        fa_cuda_read_release(ctx);
        fa_cuda_pop();
    }
    (void)cuda_api.cuDevicePrimaryCtxRelease_v2(ctx->device);
    free(ctx);
}

static fa_status cuda_context_synchronize(void *handle) {
    fa_cuda_context *ctx = handle;
    FA_CHECK(fa_cuda_push(ctx));
    CUresult r = cuda_api.cuStreamSynchronize(ctx->stream);
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuStreamSynchronize");
    return FA_SUCCESS;
}

static fa_status cuda_context_native(void *handle, void **native_context, void **native_queue) {
    fa_cuda_context *ctx = handle;
    if (native_context) *native_context = (void *)ctx->context;
    if (native_queue) *native_queue = (void *)ctx->stream;
    return FA_SUCCESS;
}

/* Caller streams (core decides when; see core/backend.h). */

static fa_status cuda_queue_adopt(void *handle, void *queue) {
    fa_cuda_context *ctx = handle;
    /* Special handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) answer with
     * the current context: ours, pushed. */
    FA_CHECK(fa_cuda_push(ctx));
    CUcontext owner = NULL;
    CUresult r = cuda_api.cuStreamGetCtx((CUstream)queue, &owner);
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) {
        char text[512];
        cu_describe(r, text, sizeof text);
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "queue (%p) is not a usable CUstream: cuStreamGetCtx: %s", queue,
                       text);
    }
    if (owner != ctx->context)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "queue (%p) is a stream of another CUDA context than this one (the primary context of "
                       "device %d)",
                       queue, ctx->index);
    return FA_SUCCESS;
}

static fa_status cuda_queue_order(void *handle, void *later, void *earlier) {
    fa_cuda_context *ctx = handle;
    FA_CHECK(fa_cuda_push(ctx));
    CUresult r = ctx->order_event ? CUDA_SUCCESS : cuda_api.cuEventCreate(&ctx->order_event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) r = cuda_api.cuEventRecord(ctx->order_event, (CUstream)earlier);
    if (r == CUDA_SUCCESS) r = cuda_api.cuStreamWaitEvent((CUstream)later, ctx->order_event, 0);
    fa_cuda_pop();
    return r == CUDA_SUCCESS ? FA_SUCCESS
                             : fa_cuda_error(r, "ordering the new stream after the previous one (an event between)");
}

static void cuda_queue_select(void *handle, void *queue) {
    fa_cuda_context *ctx = handle;
    ctx->stream = queue ? (CUstream)queue : ctx->own_stream;
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */
/* ------------------------------------------------------------------------ */

static fa_status cuda_buffer_alloc(void *handle, size_t bytes, void **out) {
    fa_cuda_context *ctx = handle;
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    fa_cuda_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "CUDA buffer: host allocation failed");
    fa_status st = fa_cuda_push(ctx);
    if (st != FA_SUCCESS) {
        free(buf);
        return st;
    }
    CUresult r = cuda_api.cuMemAlloc_v2(&buf->ptr, bytes);
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) {
        free(buf);
        char what[96];
        snprintf(what, sizeof what, "cuMemAlloc(%zu bytes)", bytes);
        return fa_cuda_error(r, what);
    }
    buf->bytes = bytes;
    buf->owned = 1;
    *out = buf;
    return FA_SUCCESS;
}

static fa_status cuda_buffer_wrap(void *handle, void *native, size_t bytes, void **out) {
    fa_cuda_context *ctx = handle;
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (!native) return fa_fail(FA_ERR_NULL_POINTER, "native is NULL");
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)native;

    FA_CHECK(fa_cuda_push(ctx));
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = cuda_api.cuMemGetAddressRange_v2(&base, &size, ptr);
    if (r != CUDA_SUCCESS) {
        fa_cuda_pop();
        char text[512];
        cu_describe(r, text, sizeof text);
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "native (0x%llx) is not CUDA device memory: cuMemGetAddressRange: %s",
                       (unsigned long long)ptr, text);
    }
    /* The whole span must lie in the one allocation that holds ptr: a span
     * that runs into a neighbouring allocation would be accepted by the
     * hardware and silently corrupt it. */
    size_t room = (size_t)(base + size - ptr);
    if (bytes > room) {
        fa_cuda_pop();
        return fa_fail(FA_ERR_OUT_OF_BOUNDS,
                       "native (0x%llx) + bytes (%zu) runs past the end of its allocation "
                       "(0x%llx, %zu bytes): %zu bytes fit",
                       (unsigned long long)ptr, bytes, (unsigned long long)base, size, room);
    }
    CUcontext owner = NULL;
    r = cuda_api.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, ptr);
    if (r != CUDA_SUCCESS) {
        fa_cuda_pop();
        return fa_cuda_error(r, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_CONTEXT) on native");
    }
    if (owner) {
        if (owner != ctx->context) {
            fa_cuda_pop();
            return fa_fail(FA_ERR_FOREIGN_BUFFER,
                           "native (0x%llx) belongs to another CUDA context than this one "
                           "(the primary context of device %d)",
                           (unsigned long long)ptr, ctx->index);
        }
    } else {
        /* Virtual-memory-management and memory-pool allocations belong to no
         * context, only to a device: the device is what can be checked. */
        int ordinal = -1;
        r = cuda_api.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
        if (r != CUDA_SUCCESS) {
            fa_cuda_pop();
            return fa_cuda_error(r, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) on native");
        }
        if (ordinal != ctx->index) {
            fa_cuda_pop();
            return fa_fail(FA_ERR_FOREIGN_BUFFER,
                           "native (0x%llx) lives on CUDA device %d, this context on device %d",
                           (unsigned long long)ptr, ordinal, ctx->index);
        }
    }
    fa_cuda_pop();

    fa_cuda_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "CUDA buffer: host allocation failed");
    buf->ptr = ptr;
    buf->bytes = bytes;
    buf->owned = 0;
    *out = buf;
    return FA_SUCCESS;
}

static void cuda_buffer_free(void *handle, void *buf_handle) {
    fa_cuda_context *ctx = handle;
    fa_cuda_buffer *buf = buf_handle;
    if (!buf) return;
    if (buf->owned && fa_cuda_push(ctx) == FA_SUCCESS) {
        /* Kernels on the non-blocking stream may still read it; cuMemFree
         * does not wait for that stream. */
        (void)cuda_api.cuStreamSynchronize(ctx->stream);
        (void)cuda_api.cuMemFree_v2(buf->ptr);
        fa_cuda_pop();
    }
    free(buf);
}

/* Copies go through the stream in use and wait for it: ordered after
 * kernels queued there (a copy on the legacy default stream would not be,
 * the context's own stream being non-blocking), and synchronous for the
 * caller. */
static fa_status cuda_buffer_upload(void *handle, void *buf_handle, size_t offset, const void *src,
                                    size_t bytes) {
    fa_cuda_context *ctx = handle;
    fa_cuda_buffer *buf = buf_handle;
    FA_CHECK(fa_span_copy_check(offset, bytes, buf->bytes, "upload", src, "src"));
    if (bytes == 0) return FA_SUCCESS;
    FA_CHECK(fa_cuda_push(ctx));
    CUresult r = cuda_api.cuMemcpyHtoDAsync_v2(buf->ptr + offset, src, bytes, ctx->stream);
    const char *what = "cuMemcpyHtoDAsync";
    if (r == CUDA_SUCCESS) {
        r = cuda_api.cuStreamSynchronize(ctx->stream);
        what = "cuStreamSynchronize after upload";
    }
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, what);
    return FA_SUCCESS;
}

static fa_status cuda_buffer_download(void *handle, void *buf_handle, size_t offset, void *dst,
                                      size_t bytes) {
    fa_cuda_context *ctx = handle;
    fa_cuda_buffer *buf = buf_handle;
    FA_CHECK(fa_span_copy_check(offset, bytes, buf->bytes, "download", dst, "dst"));
    if (bytes == 0) return FA_SUCCESS;
    FA_CHECK(fa_cuda_push(ctx));
    CUresult r = cuda_api.cuMemcpyDtoHAsync_v2(dst, buf->ptr + offset, bytes, ctx->stream);
    const char *what = "cuMemcpyDtoHAsync";
    if (r == CUDA_SUCCESS) {
        r = cuda_api.cuStreamSynchronize(ctx->stream);
        what = "cuStreamSynchronize after download";
    }
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, what);
    return FA_SUCCESS;
}

static void *cuda_buffer_native(void *handle, void *buf_handle) {
    (void)handle;
    fa_cuda_buffer *buf = buf_handle;
    return (void *)(uintptr_t)buf->ptr;
}

const fa_backend_ops fa_cuda_backend = {
    .id = FA_BACKEND_CUDA,
    .name = "cuda",
    .init = cuda_init,
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .context_create = cuda_context_create,
    .context_destroy = cuda_context_destroy,
    .context_synchronize = cuda_context_synchronize,
    .context_native = cuda_context_native,
    .queue_adopt = cuda_queue_adopt,
    .queue_order = cuda_queue_order,
    .queue_select = cuda_queue_select,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_wrap = cuda_buffer_wrap,
    .buffer_free = cuda_buffer_free,
    .buffer_upload = cuda_buffer_upload,
    .buffer_download = cuda_buffer_download,
    .buffer_native = cuda_buffer_native,
    .plan_prepare = fa_cuda_plan_prepare,
    .plan_release = fa_cuda_plan_release,
    .forward = fa_cuda_forward,
    .backward = fa_cuda_backward,
    .forward_kvcache = fa_cuda_forward_kvcache,
    .rows = fa_cuda_rows,
    .rows_merge = fa_cuda_rows_merge,
    .transport_nccl = fa_cuda_transport_nccl,
    .last_time_ms = fa_cuda_last_time_ms,
};

/* ------------------------------------------------------------------------ */
/* Native allocations for interop tests                                     */
/* ------------------------------------------------------------------------ */

static fa_status native_push(const fa_cuda_native_mem *mem) {
    CUresult r = cuda_api.cuCtxPushCurrent_v2((CUcontext)mem->context);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuCtxPushCurrent");
    return FA_SUCCESS;
}

fa_status fa_cuda_native_alloc(fa_context ctx, size_t bytes, int foreign, fa_cuda_native_mem *mem) {
    if (!mem) return fa_fail(FA_ERR_NULL_POINTER, "mem is NULL");
    memset(mem, 0, sizeof *mem);
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (ctx->ops != &fa_cuda_backend)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "ctx is not a CUDA context");
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    const fa_cuda_context *cctx = ctx->impl;
    CUcontext owner = cctx->context;
    CUcontext own = NULL;
    CUresult r;
    if (foreign) {
        if (!cuda_api.cuCtxCreate_v2 || !cuda_api.cuCtxDestroy_v2)
            return fa_fail(FA_ERR_UNSUPPORTED, "this CUDA driver cannot create a second context");
        /* Creating a context also makes it current: pop it straight away. */
        r = cuda_api.cuCtxCreate_v2(&own, 0, cctx->device);
        if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuCtxCreate");
        fa_cuda_pop();
        owner = own;
    }
    mem->context = (void *)owner;
    mem->own_context = (void *)own;
    mem->device = (int)cctx->device;
    fa_status st = native_push(mem);
    if (st == FA_SUCCESS) {
        CUdeviceptr ptr = 0;
        r = cuda_api.cuMemAlloc_v2(&ptr, bytes);
        fa_cuda_pop();
        if (r == CUDA_SUCCESS) {
            mem->ptr = (uintptr_t)ptr;
            mem->bytes = bytes;
            return FA_SUCCESS;
        }
        st = fa_cuda_error(r, "cuMemAlloc");
    }
    if (own) (void)cuda_api.cuCtxDestroy_v2(own);
    memset(mem, 0, sizeof *mem);
    return st;
}

fa_status fa_cuda_native_write(const fa_cuda_native_mem *mem, size_t offset, const void *src,
                               size_t bytes) {
    if (!mem || !src) return fa_fail(FA_ERR_NULL_POINTER, "mem or src is NULL");
    FA_CHECK(fa_native_span_check(offset, bytes, mem->bytes, "write"));
    FA_CHECK(native_push(mem));
    CUresult r = cuda_api.cuMemcpyHtoDAsync_v2((CUdeviceptr)(mem->ptr + offset), src, bytes, NULL);
    if (r == CUDA_SUCCESS) r = cuda_api.cuCtxSynchronize();
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "native write");
    return FA_SUCCESS;
}

fa_status fa_cuda_native_read(const fa_cuda_native_mem *mem, size_t offset, void *dst, size_t bytes) {
    if (!mem || !dst) return fa_fail(FA_ERR_NULL_POINTER, "mem or dst is NULL");
    FA_CHECK(fa_native_span_check(offset, bytes, mem->bytes, "read"));
    FA_CHECK(native_push(mem));
    CUresult r = cuda_api.cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)(mem->ptr + offset), bytes, NULL);
    if (r == CUDA_SUCCESS) r = cuda_api.cuCtxSynchronize();
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "native read");
    return FA_SUCCESS;
}

void fa_cuda_native_free(fa_cuda_native_mem *mem) {
    if (!mem || !mem->ptr) return;
    if (native_push(mem) == FA_SUCCESS) {
        (void)cuda_api.cuCtxSynchronize();
        (void)cuda_api.cuMemFree_v2((CUdeviceptr)mem->ptr);
        fa_cuda_pop();
    }
    if (mem->own_context) (void)cuda_api.cuCtxDestroy_v2((CUcontext)mem->own_context);
    memset(mem, 0, sizeof *mem);
}
