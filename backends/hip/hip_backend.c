/* The HIP backend's runtime half (AMD platform): the HIP runtime loaded at
 * run time, device discovery and description, contexts, memory and
 * zero-copy interop.
 *
 * The HIP headers supply types only; every entry point comes from dlopen of
 * libamdhip64 (names, overrides and the ABI caveats across ROCm releases are
 * in hip_runtime_internal.h). Without a runtime or without an AMD GPU the
 * backend reports itself unavailable with the runtime's reason. The
 * attention half (plans, kernels, launches) is hip_attention.c.
 *
 * Built with FA_HIP_NVIDIA, the default library is the mapping of HIP onto
 * CUDA (backends/hip_nvidia), and an NVIDIA device describes itself as one:
 * vendor NVIDIA, architecture sm_XY. */
#define FA_HIP_RUNTIME_TYPES
#include "hip_runtime_internal.h"

#include "device_describe.h"
#include "device_registry.h"
#include "dynlib.h"
#include "fa_internal.h"
#include "plan.h"
#include "reason.h"
#include "span.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hip_load(void);

/* State written once by hip_load (through the registry's pthread_once),
 * read-only afterwards. */
static fa_device_registry hip_registry = FA_DEVICE_REGISTRY_INIT("HIP", hip_load);
static fa_hip_api hip_api;

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

static void hip_describe(hipError_t err, char *out, size_t out_size) {
    const char *name = hip_api.hipGetErrorName ? hip_api.hipGetErrorName(err) : NULL;
    const char *text = hip_api.hipGetErrorString ? hip_api.hipGetErrorString(err) : NULL;
    /* ROCm's hipGetErrorString often returns the name again. */
    if (name && text && strcmp(name, text) != 0)
        snprintf(out, out_size, "%s: %s", name, text);
    else if (name || text)
        snprintf(out, out_size, "%s", name ? name : text);
    else
        snprintf(out, out_size, "HIP error %d", (int)err);
}

fa_status fa_hip_error(hipError_t err, const char *what) {
    char text[512];
    hip_describe(err, text, sizeof text);
    fa_status status = err == hipErrorOutOfMemory ? FA_ERR_OUT_OF_MEMORY : FA_ERR_LAUNCH;
    return fa_fail(status, "%s: %s", what, text);
}

/* Peak rates of one compute unit as the runtime counts them, by
 * architecture, from data-sheet peaks divided by CUs and peak clock:
 * - fp32: 2 flops per FMA times 64 lanes (128); CDNA2 and CDNA3 double it
 *   with packed FP32 (MI250X 47.9 TFLOP/s), RDNA3 and RDNA4 with dual issue.
 * - matrix, dense fp16 with fp32 accumulation: MI100 (gfx908) 184.6 TFLOP/s
 *   and MI250X (gfx90a) 383 TFLOP/s are both 1024 per CU per clock; MI300X
 *   (gfx942) 1307 TFLOP/s is 2048; MI355X (gfx950) 4096; RDNA3 WMMA 512,
 *   RDNA4 1024; RDNA1/RDNA2 and GCN have no matrix units.
 * - shape: the MFMA v_mfma_f32_32x32x8f16 on CDNA, WMMA 16x16x16 on RDNA3+,
 *   mma.sync m16n8k16 on NVIDIA through the mapping.
 * On RDNA in WGP mode the runtime may count work-group processors (two CUs
 * each) as compute units; the rates above are per CU and then understate
 * such a device by half, which errs on the safe side for the planner. */
typedef struct hip_arch_rates {
    const char *prefix;
    double fp32;
    double matrix;
    int m, n, k;
} hip_arch_rates;

static const hip_arch_rates hip_rates[] = {
    {"gfx908", 128.0, 1024.0, 32, 32, 8},
    {"gfx90a", 256.0, 1024.0, 32, 32, 8},
    {"gfx940", 256.0, 2048.0, 32, 32, 8},
    {"gfx941", 256.0, 2048.0, 32, 32, 8},
    {"gfx942", 256.0, 2048.0, 32, 32, 8},
    {"gfx950", 256.0, 4096.0, 32, 32, 8},
    {"gfx11", 256.0, 512.0, 16, 16, 16},
    {"gfx12", 256.0, 1024.0, 16, 16, 16},
    /* NVIDIA through the mapping: FMA rate of sm_80+ SMs, and the tensor
     * cores the HIP matrix-core kernels run with mma.sync m16n8k16 (dense
     * fp16: A100 312 TFLOP/s is 2048 per SM per clock, H100 4096). */
    {"sm_8", 256.0, 2048.0, 16, 8, 16},
    {"sm_9", 256.0, 4096.0, 16, 8, 16},
    {"sm_1", 256.0, 4096.0, 16, 8, 16},
    {"sm_", 256.0, 0.0, 0, 0, 0},
};

static void hip_fill_rates(fa_device_desc *d) {
    d->fp32_flops_per_clock_cu = 128.0;
    d->matrix_flops_per_clock_cu = 0.0;
    d->matrix_m = d->matrix_n = d->matrix_k = 0;
    for (size_t i = 0; i < FA_ARRAY_SIZE(hip_rates); i++) {
        if (strncmp(d->arch, hip_rates[i].prefix, strlen(hip_rates[i].prefix)) == 0) {
            d->fp32_flops_per_clock_cu = hip_rates[i].fp32;
            d->matrix_flops_per_clock_cu = hip_rates[i].matrix;
            d->matrix_m = hip_rates[i].m;
            d->matrix_n = hip_rates[i].n;
            d->matrix_k = hip_rates[i].k;
            return;
        }
    }
}

/* Through the entry point that fills the 5.x layout of hipDeviceProp_t (see
 * hip_runtime_internal.h). */
void fa_hip_arch_name(int index, char *arch, size_t arch_size) {
    arch[0] = '\0';
    hipError_t (*get)(hipDeviceProp_t *, int) = hip_api.hipGetDevicePropertiesR0000;
    if (!get && hip_api.runtime_version / 10000000 == 5) get = hip_api.hipGetDeviceProperties;
    if (!get) return;
    /* Room for any layout a runtime might write. */
    union {
        hipDeviceProp_t props;
        unsigned char room[16384];
    } *buf = calloc(1, sizeof *buf);
    if (!buf) return;
    if (get(&buf->props, index) == hipSuccess) {
        const char *name = buf->props.gcnArchName;
        size_t len = strnlen(name, sizeof buf->props.gcnArchName);
        /* gfx names from AMD's runtime; sm_XY from the mapping onto CUDA. */
        if (len < sizeof buf->props.gcnArchName && (strncmp(name, "gfx", 3) == 0 || strncmp(name, "sm_", 3) == 0)) {
            size_t stop = strcspn(name, ":");
            if (stop >= arch_size) stop = arch_size - 1;
            memcpy(arch, name, stop);
            arch[stop] = '\0';
        }
    }
    free(buf);
}

static int hip_attribute(int index, hipDeviceAttribute_t attribute, const char *name, int *value,
                         char *why, size_t why_size) {
    hipError_t err = hip_api.hipDeviceGetAttribute(value, attribute, index);
    if (err == hipSuccess) return 1;
    char text[512];
    hip_describe(err, text, sizeof text);
    snprintf(why, why_size, "hipDeviceGetAttribute(%s): %s", name, text);
    return 0;
}

static int hip_describe_device(int index, fa_device_info *info, char *why, size_t why_size) {
    char text[512];
    hipDevice_t dev;
    hipError_t err = hip_api.hipDeviceGet(&dev, index);
    if (err != hipSuccess) {
        hip_describe(err, text, sizeof text);
        snprintf(why, why_size, "hipDeviceGet(%d): %s", index, text);
        return 0;
    }
    fa_describe_gpu_begin(info, FA_BACKEND_HIP, index, "AMD");
    fa_device_desc *d = &info->desc;
    err = hip_api.hipDeviceGetName(d->name, (int)sizeof d->name, dev);
    if (err != hipSuccess) {
        hip_describe(err, text, sizeof text);
        snprintf(why, why_size, "hipDeviceGetName(%d): %s", index, text);
        return 0;
    }
    d->name[sizeof d->name - 1] = '\0';
    int v = hip_api.runtime_version;
    snprintf(info->driver_version, sizeof info->driver_version, "%d.%d.%d", v / 10000000,
             (v / 100000) % 100, v % 100000);

    int lds = 0, threads = 0, warp = 0, cus = 0, clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
#define FA_HIP_ATTR(attr, var) \
    if (!hip_attribute(index, attr, #attr, &var, why, why_size)) return 0
    FA_HIP_ATTR(hipDeviceAttributeMaxSharedMemoryPerBlock, lds);
    FA_HIP_ATTR(hipDeviceAttributeMaxThreadsPerBlock, threads);
    FA_HIP_ATTR(hipDeviceAttributeWarpSize, warp);
    FA_HIP_ATTR(hipDeviceAttributeMultiprocessorCount, cus);
#undef FA_HIP_ATTR
    /* Clocks are informational: unreported ones leave 0. */
    if (hip_api.hipDeviceGetAttribute(&clock_khz, hipDeviceAttributeClockRate, index) != hipSuccess)
        clock_khz = 0;
    if (hip_api.hipDeviceGetAttribute(&mem_clock_khz, hipDeviceAttributeMemoryClockRate, index) !=
        hipSuccess)
        mem_clock_khz = 0;
    if (hip_api.hipDeviceGetAttribute(&bus_bits, hipDeviceAttributeMemoryBusWidth, index) !=
        hipSuccess)
        bus_bits = 0;
    size_t total = 0;
    err = hip_api.hipDeviceTotalMem(&total, dev);
    if (err != hipSuccess) {
        hip_describe(err, text, sizeof text);
        snprintf(why, why_size, "hipDeviceTotalMem(%d): %s", index, text);
        return 0;
    }

    /* Where a kernel may opt in to more local memory than the default (the
     * NVIDIA mapping: 227 KiB on an H100 against 48), the device offers the
     * larger figure: the matrix-core kernels take their tiles dynamically
     * and opt in (hip_attention.c), the planner keeps the SIMT kernels'
     * static tiles within the default. AMD reports one figure (or no
     * opt-in attribute). */
    int optin = 0;
    if (hip_api.hipFuncSetAttribute &&
        hip_api.hipDeviceGetAttribute(&optin, hipDeviceAttributeSharedMemPerBlockOptin, index) == hipSuccess &&
        optin > lds)
        lds = optin;

    fa_hip_arch_name(index, d->arch, sizeof d->arch);
    if (strncmp(d->arch, "sm_", 3) == 0) snprintf(d->vendor, sizeof d->vendor, "NVIDIA");
    d->local_mem_bytes = (size_t)lds;
    d->max_work_group_size = threads;
    d->simd_width = warp;        /* wavefront 64 (CDNA) or 32 (RDNA): as reported */
    d->compute_units = cus;
    d->clock_mhz = clock_khz / 1000;
    fa_describe_queried_bandwidth(d, mem_clock_khz, bus_bits);
    d->global_mem_bytes = total;
    hip_fill_rates(d);
    return 1;
}

static void hip_load(void) {
    char why[FA_REGISTRY_REASON_SIZE];
#ifdef FA_HIP_DEFAULT_LIBRARY
    static const char *const defaults[] = {FA_HIP_DEFAULT_LIBRARY, "libamdhip64.so", "libamdhip64.so.6",
                                           "libamdhip64.so.5", NULL};
#else
    static const char *const defaults[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5",
                                           NULL};
#endif
    const char *override_list[2];
    const char *const *names = fa_dynlib_names("FLASHATTN_HIP_LIBRARY", defaults, override_list);
    void *lib = fa_dynlib_open(names, why, sizeof why);
    if (!lib) {
        fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "HIP runtime library not found: %s", why);
        return;
    }
    /* The runtime stays loaded even when unusable: it registers process-exit
     * handlers once called, and unloading it under them is unsafe. */
    fa_hip_api api;
    memset(&api, 0, sizeof api);
#define FA_HIP_LOAD(name, ret, args)                                                              \
    if (!fa_dynlib_load(lib, #name, NULL, &api.name, why, sizeof why)) {                                  \
        fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "HIP runtime lacks an entry point (too old?): %s", \
                 why);                                                                           \
        return;                                                                                  \
    }
    FA_HIP_REQUIRED(FA_HIP_LOAD)
#undef FA_HIP_LOAD
#define FA_HIP_LOAD_OPTIONAL(name, ret, args) (void)fa_dynlib_load(lib, #name, NULL, &api.name, why, sizeof why);
    FA_HIP_OPTIONAL(FA_HIP_LOAD_OPTIONAL)
#undef FA_HIP_LOAD_OPTIONAL
    hip_api = api;

    char text[512], count_text[512];
    hipError_t init_err = hip_api.hipInit(0);
    int count = 0;
    hipError_t count_err = hip_api.hipGetDeviceCount(&count);
    if (init_err != hipSuccess) {
        /* Without a GPU, ROCm's hipInit fails with a generic code; the device
         * count says what that means, so both go into the reason. */
        hip_describe(init_err, text, sizeof text);
        if (count_err != hipSuccess || count <= 0) {
            hip_describe(count_err, count_text, sizeof count_text);
            fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "no HIP device (hipInit: %s; hipGetDeviceCount: %s)",
                     text, count_err != hipSuccess ? count_text : "0 devices");
        } else {
            fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "hipInit: %s", text);
        }
        return;
    }
    if (count_err != hipSuccess) {
        hip_describe(count_err, text, sizeof text);
        fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "hipGetDeviceCount: %s", text);
        return;
    }
    if (count <= 0) {
        fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "no HIP device (hipGetDeviceCount reported 0)");
        return;
    }
    hipError_t err = hip_api.hipRuntimeGetVersion(&hip_api.runtime_version);
    if (err != hipSuccess) {
        hip_describe(err, text, sizeof text);
        fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "hipRuntimeGetVersion: %s", text);
        return;
    }
    if (count > FA_REGISTRY_MAX_DEVICES) count = FA_REGISTRY_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        if (!hip_describe_device(i, &hip_registry.devices[i], why, sizeof why)) {
            fa_reason_set(hip_registry.reason, sizeof hip_registry.reason, "HIP device %d cannot be described: %s", i, why);
            return;
        }
    }
    fa_registry_ready(&hip_registry, count);
}

const fa_hip_api *fa_hip_api_get(void) {
    fa_registry_discover(&hip_registry);
    return hip_registry.status == FA_SUCCESS ? &hip_api : NULL;
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

static fa_status hip_init(char *reason, size_t reason_size) {
    return fa_registry_init(&hip_registry, reason, reason_size);
}

static int hip_device_count(void) { return fa_registry_count(&hip_registry); }

static fa_status hip_device_info(int index, fa_device_info *info) {
    return fa_registry_info(&hip_registry, index, info);
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */
/* ------------------------------------------------------------------------ */

static fa_status hip_enter_device(int device, int *previous) {
    *previous = -1;
    hipError_t err = hip_api.hipGetDevice(previous);
    if (err != hipSuccess) *previous = -1;
    if (*previous == device) return FA_SUCCESS;
    err = hip_api.hipSetDevice(device);
    if (err != hipSuccess) return fa_hip_error(err, "hipSetDevice");
    return FA_SUCCESS;
}

static void hip_leave_device(int device, int previous) {
    if (previous >= 0 && previous != device) (void)hip_api.hipSetDevice(previous);
}

fa_status fa_hip_enter(const fa_hip_context *ctx, int *previous) {
    return hip_enter_device(ctx->index, previous);
}

void fa_hip_leave(const fa_hip_context *ctx, int previous) { hip_leave_device(ctx->index, previous); }

static fa_status hip_context_create(int index, void **out) {
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    *out = NULL;
    FA_CHECK(fa_registry_check(&hip_registry, index));
    fa_hip_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fa_fail(FA_ERR_OUT_OF_MEMORY, "HIP context: host allocation failed");
    ctx->index = index;
    const fa_device_desc *d = &hip_registry.devices[index].desc;
    snprintf(ctx->arch, sizeof ctx->arch, "%s", d->arch);
    ctx->warp_size = d->simd_width;
    ctx->cu_count = d->compute_units;
    ctx->lds_bytes = d->local_mem_bytes;
    int lds_static = 0;
    ctx->lds_static_bytes =
        hip_api.hipDeviceGetAttribute(&lds_static, hipDeviceAttributeMaxSharedMemoryPerBlock, index) == hipSuccess &&
                lds_static > 0 && (size_t)lds_static < ctx->lds_bytes
            ? (size_t)lds_static
            : ctx->lds_bytes;
    int previous;
    fa_status st = fa_hip_enter(ctx, &previous);
    if (st != FA_SUCCESS) {
        free(ctx);
        return st;
    }
    hipError_t err = hip_api.hipStreamCreateWithFlags(&ctx->own_stream, hipStreamNonBlocking);
    ctx->stream = ctx->own_stream;
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) {
        free(ctx);
        return fa_hip_error(err, "hipStreamCreateWithFlags");
    }
    *out = ctx;
    return FA_SUCCESS;
}

static void hip_context_destroy(void *handle) {
    fa_hip_context *ctx = handle;
    if (!ctx) return;
    int previous;
    if (fa_hip_enter(ctx, &previous) == FA_SUCCESS) {
        /* Core has handed a caller's stream back by now. */
        (void)hip_api.hipStreamSynchronize(ctx->own_stream);
        (void)hip_api.hipStreamDestroy(ctx->own_stream);
        if (ctx->order_event) (void)hip_api.hipEventDestroy(ctx->order_event);
        fa_hip_rows_release(ctx);
        fa_hip_leave(ctx, previous);
    }
    free(ctx);
}

static fa_status hip_context_synchronize(void *handle) {
    fa_hip_context *ctx = handle;
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    hipError_t err = hip_api.hipStreamSynchronize(ctx->stream);
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) return fa_hip_error(err, "hipStreamSynchronize");
    return FA_SUCCESS;
}

static fa_status hip_context_native(void *handle, void **native_context, void **native_queue) {
    fa_hip_context *ctx = handle;
    if (native_context) *native_context = (void *)(intptr_t)ctx->index;
    if (native_queue) *native_queue = (void *)ctx->stream;
    return FA_SUCCESS;
}

/* Caller streams (core decides when; see core/backend.h). */

static fa_status hip_queue_adopt(void *handle, void *queue) {
    fa_hip_context *ctx = handle;
    /* Nothing to ask before ROCm 6; the per-thread stream is the current
     * device's, which is this context's during every call. */
    if (!hip_api.hipStreamGetDevice || queue == (void *)hipStreamPerThread) return FA_SUCCESS;
    hipDevice_t device = -1;
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    hipError_t err = hip_api.hipStreamGetDevice((hipStream_t)queue, &device);
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) {
        char text[512];
        hip_describe(err, text, sizeof text);
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "queue (%p) is not a usable hipStream_t: hipStreamGetDevice: %s",
                       queue, text);
    }
    if (device != ctx->index)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "queue (%p) is a stream of HIP device %d, this context's is %d", queue,
                       (int)device, ctx->index);
    return FA_SUCCESS;
}

static fa_status hip_queue_order(void *handle, void *later, void *earlier) {
    fa_hip_context *ctx = handle;
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    hipError_t err = ctx->order_event ? hipSuccess : hip_api.hipEventCreate(&ctx->order_event);
    if (err == hipSuccess) err = hip_api.hipEventRecord(ctx->order_event, (hipStream_t)earlier);
    if (err == hipSuccess) err = hip_api.hipStreamWaitEvent((hipStream_t)later, ctx->order_event, 0);
    fa_hip_leave(ctx, previous);
    return err == hipSuccess ? FA_SUCCESS
                             : fa_hip_error(err, "ordering the new stream after the previous one (an event between)");
}

static void hip_queue_select(void *handle, void *queue) {
    fa_hip_context *ctx = handle;
    ctx->stream = queue ? (hipStream_t)queue : ctx->own_stream;
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */
/* ------------------------------------------------------------------------ */

static fa_status hip_buffer_alloc(void *handle, size_t bytes, void **out) {
    fa_hip_context *ctx = handle;
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    fa_hip_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "HIP buffer: host allocation failed");
    int previous;
    fa_status st = fa_hip_enter(ctx, &previous);
    if (st != FA_SUCCESS) {
        free(buf);
        return st;
    }
    hipError_t err = hip_api.hipMalloc(&buf->ptr, bytes);
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) {
        free(buf);
        char what[96];
        snprintf(what, sizeof what, "hipMalloc(%zu bytes)", bytes);
        return fa_hip_error(err, what);
    }
    buf->bytes = bytes;
    buf->owned = 1;
    *out = buf;
    return FA_SUCCESS;
}

/* What is checked of a wrapped pointer: that the runtime knows it as an
 * allocation holding [native, native + bytes) (hipMemGetAddressRange, where
 * the runtime has it), and that it lives on this context's device
 * (hipPointerGetAttributes' device). Memory types are not compared, as
 * their numbering changed in ROCm 6: host memory mapped for the device
 * passes, which the device can read, only more slowly. */
static fa_status hip_buffer_wrap(void *handle, void *native, size_t bytes, void **out) {
    fa_hip_context *ctx = handle;
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *out = NULL;
    if (!native) return fa_fail(FA_ERR_NULL_POINTER, "native is NULL");
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    char text[512];
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    if (hip_api.hipMemGetAddressRange) {
        hipDeviceptr_t base = NULL;
        size_t size = 0;
        hipError_t err = hip_api.hipMemGetAddressRange(&base, &size, native);
        if (err != hipSuccess) {
            fa_hip_leave(ctx, previous);
            hip_describe(err, text, sizeof text);
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "native (%p) is not HIP device memory: hipMemGetAddressRange: %s", native,
                           text);
        }
        uintptr_t p = (uintptr_t)native, b = (uintptr_t)base;
        size_t room = p >= b && p - b <= size ? size - (size_t)(p - b) : 0;
        if (bytes > room) {
            fa_hip_leave(ctx, previous);
            return fa_fail(FA_ERR_OUT_OF_BOUNDS,
                           "native (%p) + bytes (%zu) runs past the end of its allocation (%p, %zu "
                           "bytes): %zu bytes fit",
                           native, bytes, base, size, room);
        }
    }
    /* Room for a larger layout than the headers' should a runtime write one. */
    union {
        hipPointerAttribute_t attr;
        unsigned char room[256];
    } a;
    memset(&a, 0, sizeof a);
    hipError_t err = hip_api.hipPointerGetAttributes(&a.attr, native);
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) {
        hip_describe(err, text, sizeof text);
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "native (%p) is not HIP device memory: hipPointerGetAttributes: %s", native,
                       text);
    }
    if (a.attr.device != ctx->index)
        return fa_fail(FA_ERR_FOREIGN_BUFFER,
                       "native (%p) lives on HIP device %d, this context on device %d", native,
                       a.attr.device, ctx->index);

    fa_hip_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) return fa_fail(FA_ERR_OUT_OF_MEMORY, "HIP buffer: host allocation failed");
    buf->ptr = native;
    buf->bytes = bytes;
    buf->owned = 0;
    *out = buf;
    return FA_SUCCESS;
}

static void hip_buffer_free(void *handle, void *buf_handle) {
    fa_hip_context *ctx = handle;
    fa_hip_buffer *buf = buf_handle;
    if (!buf) return;
    int previous;
    if (buf->owned && fa_hip_enter(ctx, &previous) == FA_SUCCESS) {
        /* Kernels on the non-blocking stream may still read it. */
        (void)hip_api.hipStreamSynchronize(ctx->stream);
        (void)hip_api.hipFree(buf->ptr);
        fa_hip_leave(ctx, previous);
    }
    free(buf);
}

/* Copies go through the stream in use and wait for it: ordered after the
 * kernels queued there, synchronous for the caller. */
static fa_status hip_copy(fa_hip_context *ctx, void *dst, const void *src, size_t bytes,
                          hipMemcpyKind kind, const char *what) {
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    hipError_t err = hip_api.hipMemcpyAsync(dst, src, bytes, kind, ctx->stream);
    const char *failed = "hipMemcpyAsync";
    if (err == hipSuccess) {
        err = hip_api.hipStreamSynchronize(ctx->stream);
        failed = "hipStreamSynchronize";
    }
    fa_hip_leave(ctx, previous);
    if (err != hipSuccess) {
        char where[128];
        snprintf(where, sizeof where, "%s (%s)", failed, what);
        return fa_hip_error(err, where);
    }
    return FA_SUCCESS;
}

static fa_status hip_buffer_upload(void *handle, void *buf_handle, size_t offset, const void *src,
                                   size_t bytes) {
    fa_hip_buffer *buf = buf_handle;
    FA_CHECK(fa_span_copy_check(offset, bytes, buf->bytes, "upload", src, "src"));
    if (bytes == 0) return FA_SUCCESS;
    return hip_copy(handle, (char *)buf->ptr + offset, src, bytes, hipMemcpyHostToDevice, "upload");
}

static fa_status hip_buffer_download(void *handle, void *buf_handle, size_t offset, void *dst,
                                     size_t bytes) {
    fa_hip_buffer *buf = buf_handle;
    FA_CHECK(fa_span_copy_check(offset, bytes, buf->bytes, "download", dst, "dst"));
    if (bytes == 0) return FA_SUCCESS;
    return hip_copy(handle, dst, (const char *)buf->ptr + offset, bytes, hipMemcpyDeviceToHost,
                    "download");
}

static void *hip_buffer_native(void *handle, void *buf_handle) {
    (void)handle;
    fa_hip_buffer *buf = buf_handle;
    return buf->ptr;
}

/* ------------------------------------------------------------------------ */
/* Plans: the kernels are not in this build                                 */
/* ------------------------------------------------------------------------ */

const fa_backend_ops fa_hip_backend = {
    .id = FA_BACKEND_HIP,
    .name = "hip",
    .init = hip_init,
    .device_count = hip_device_count,
    .device_info = hip_device_info,
    .context_create = hip_context_create,
    .context_destroy = hip_context_destroy,
    .context_synchronize = hip_context_synchronize,
    .context_native = hip_context_native,
    .queue_adopt = hip_queue_adopt,
    .queue_order = hip_queue_order,
    .queue_select = hip_queue_select,
    .buffer_alloc = hip_buffer_alloc,
    .buffer_wrap = hip_buffer_wrap,
    .buffer_free = hip_buffer_free,
    .buffer_upload = hip_buffer_upload,
    .buffer_download = hip_buffer_download,
    .buffer_native = hip_buffer_native,
    .plan_prepare = fa_hip_plan_prepare,
    .plan_release = fa_hip_plan_release,
    .forward = fa_hip_forward,
    .backward = fa_hip_backward,
    .forward_kvcache = fa_hip_forward_kvcache,
    .rows = fa_hip_rows,
    .rows_merge = fa_hip_rows_merge,
    .transport_nccl = fa_hip_transport_nccl,
    .last_time_ms = fa_hip_last_time_ms,
};

/* ------------------------------------------------------------------------ */
/* Native allocations for interop tests                                     */
/* ------------------------------------------------------------------------ */

fa_status fa_hip_native_alloc(int device, size_t bytes, fa_hip_native_mem *mem) {
    if (!mem) return fa_fail(FA_ERR_NULL_POINTER, "mem is NULL");
    memset(mem, 0, sizeof *mem);
    if (!fa_hip_api_get()) return fa_registry_unavailable(&hip_registry);
    if (device < 0 || device >= hip_registry.total)
        return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "HIP device index %d out of range", device);
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    int previous;
    FA_CHECK(hip_enter_device(device, &previous));
    void *ptr = NULL;
    hipError_t err = hip_api.hipMalloc(&ptr, bytes);
    hip_leave_device(device, previous);
    if (err != hipSuccess) return fa_hip_error(err, "hipMalloc");
    mem->ptr = ptr;
    mem->bytes = bytes;
    mem->device = device;
    return FA_SUCCESS;
}

static fa_status native_copy(const fa_hip_native_mem *mem, void *dst, const void *src, size_t bytes,
                             hipMemcpyKind kind) {
    int previous;
    FA_CHECK(hip_enter_device(mem->device, &previous));
    hipError_t err = hip_api.hipMemcpyAsync(dst, src, bytes, kind, NULL);
    if (err == hipSuccess) err = hip_api.hipDeviceSynchronize();
    hip_leave_device(mem->device, previous);
    if (err != hipSuccess) return fa_hip_error(err, "native copy");
    return FA_SUCCESS;
}

fa_status fa_hip_native_write(const fa_hip_native_mem *mem, size_t offset, const void *src,
                              size_t bytes) {
    if (!mem || !src) return fa_fail(FA_ERR_NULL_POINTER, "mem or src is NULL");
    FA_CHECK(fa_native_span_check(offset, bytes, mem->bytes, "write"));
    return native_copy(mem, (char *)mem->ptr + offset, src, bytes, hipMemcpyHostToDevice);
}

fa_status fa_hip_native_read(const fa_hip_native_mem *mem, size_t offset, void *dst, size_t bytes) {
    if (!mem || !dst) return fa_fail(FA_ERR_NULL_POINTER, "mem or dst is NULL");
    FA_CHECK(fa_native_span_check(offset, bytes, mem->bytes, "read"));
    return native_copy(mem, dst, (const char *)mem->ptr + offset, bytes, hipMemcpyDeviceToHost);
}

void fa_hip_native_free(fa_hip_native_mem *mem) {
    if (!mem || !mem->ptr) return;
    int previous;
    if (hip_enter_device(mem->device, &previous) == FA_SUCCESS) {
        (void)hip_api.hipDeviceSynchronize();
        (void)hip_api.hipFree(mem->ptr);
        hip_leave_device(mem->device, previous);
    }
    memset(mem, 0, sizeof *mem);
}
