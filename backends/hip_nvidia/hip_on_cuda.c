/* libfa_hip_on_cuda: exactly the HIP runtime and hiprtc calls flashattn's
 * HIP backend makes, each forwarded to the CUDA driver API or NVRTC, so the
 * HIP kernels run on an NVIDIA GPU where no HIP for NVIDIA builds (Debian's
 * HIP 5.2 NVIDIA headers do not compile against CUDA 13). README.md beside
 * this file has the call-by-call table.
 *
 * Loading: like the CUDA backend, the driver is opened as "libcuda.so.1"
 * then "libcuda.so" (FLASHATTN_CUDA_LIBRARY replaces that list), and NVRTC
 * as libnvrtc.so.13, .12, unversioned, then from /usr/local/cuda/lib64
 * (FLASHATTN_NVRTC_LIBRARY replaces that list). Only cuda.h and nvrtc.h are
 * needed at build time. hiprtc works without a driver (NVRTC alone), so
 * kernels compile on machines without a GPU.
 *
 * Semantics kept from HIP:
 * - A current device per host thread (0 until hipSetDevice), whose primary
 *   context every call makes current first; primary contexts are retained
 *   on first use and kept for the life of the process.
 * - hipError_t values: HIP numbers its errors as CUDA does for every code
 *   mapped here; hipGetErrorString of the last error a thread got returns
 *   the CUDA call and the driver's own text.
 * - Device attributes: the ones the backend reads, from the matching CUDA
 *   attribute. Shared memory per block is CUDA's default limit (48 KiB, all
 *   that static tiles get); the opt-in limit is SharedMemPerBlockOptin, and
 *   hipFuncSetAttribute(MaxDynamicSharedMemorySize) opts a kernel in.
 * - hipDeviceProp_t: name, memory, limits, compute capability, and
 *   gcnArchName = "sm_XY", which the backend passes back as
 *   --offload-arch=sm_XY.
 * - hipRuntimeGetVersion: the HIP API level mapped (5.2) with the CUDA
 *   driver's version (cuDriverGetVersion, e.g. 13000) as the patch number. */
#include "hip_on_cuda.h"

#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function and object pointers differ in size");
_Static_assert(sizeof(hipDevice_t) == sizeof(int), "hipDevice_t is a device ordinal");

#define SHIM_MAX_DEVICES 64

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

#define SHIM_CU_FUNCTIONS(X)                                                                   \
    X(cuGetErrorName, CUresult, (CUresult, const char **))                                     \
    X(cuGetErrorString, CUresult, (CUresult, const char **))                                   \
    X(cuInit, CUresult, (unsigned int))                                                        \
    X(cuDriverGetVersion, CUresult, (int *))                                                   \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                                \
    X(cuDeviceGetCount, CUresult, (int *))                                                     \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                                      \
    X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))                   \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                                     \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                             \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                                \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                                  \
    X(cuCtxSynchronize, CUresult, (void))                                                      \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                                    \
    X(cuStreamDestroy_v2, CUresult, (CUstream))                                                \
    X(cuStreamSynchronize, CUresult, (CUstream))                                               \
    X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                          \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                        \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                   \
    X(cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void *, size_t, CUstream))           \
    X(cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream))                 \
    X(cuMemcpyDtoDAsync_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))            \
    X(cuMemcpyAsync, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                   \
    X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))               \
    X(cuMemGetAddressRange_v2, CUresult, (CUdeviceptr *, size_t *, CUdeviceptr))               \
    X(cuPointerGetAttribute, CUresult, (void *, CUpointer_attribute, CUdeviceptr))             \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                  \
    X(cuModuleUnload, CUresult, (CUmodule))                                                    \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                   \
    X(cuFuncGetAttribute, CUresult, (int *, CUfunction_attribute, CUfunction))                 \
    X(cuFuncSetAttribute, CUresult, (CUfunction, CUfunction_attribute, int))                   \
    X(cuLaunchKernel, CUresult,                                                                \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,       \
       unsigned int, unsigned int, CUstream, void **, void **))                                \
    X(cuEventCreate, CUresult, (CUevent *, unsigned int))                                      \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                            \
    X(cuEventSynchronize, CUresult, (CUevent))                                                 \
    X(cuEventDestroy_v2, CUresult, (CUevent))

#define SHIM_NVRTC_FUNCTIONS(X)                                                                \
    X(nvrtcGetErrorString, const char *, (nvrtcResult))                                        \
    X(nvrtcVersion, nvrtcResult, (int *, int *))                                               \
    X(nvrtcCreateProgram, nvrtcResult,                                                         \
      (nvrtcProgram *, const char *, const char *, int, const char *const *,                   \
       const char *const *))                                                                   \
    X(nvrtcDestroyProgram, nvrtcResult, (nvrtcProgram *))                                      \
    X(nvrtcCompileProgram, nvrtcResult, (nvrtcProgram, int, const char *const *))              \
    X(nvrtcGetProgramLogSize, nvrtcResult, (nvrtcProgram, size_t *))                           \
    X(nvrtcGetProgramLog, nvrtcResult, (nvrtcProgram, char *))                                 \
    X(nvrtcGetCUBINSize, nvrtcResult, (nvrtcProgram, size_t *))                                \
    X(nvrtcGetCUBIN, nvrtcResult, (nvrtcProgram, char *))

typedef struct shim_cu {
#define SHIM_MEMBER(name, ret, args) ret (*name) args;
    SHIM_CU_FUNCTIONS(SHIM_MEMBER)
    /* Recent drivers export cuEventElapsedTime_v2, older ones only the
     * plain name, with the same signature. */
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
} shim_cu;

typedef struct shim_nvrtc {
    SHIM_NVRTC_FUNCTIONS(SHIM_MEMBER)
#undef SHIM_MEMBER
} shim_nvrtc;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static shim_cu cu;
static int cu_ready;
static CUresult cu_init_result = CUDA_ERROR_NOT_INITIALIZED;
static char cu_reason[1024];

static pthread_once_t rtc_once = PTHREAD_ONCE_INIT;
static shim_nvrtc rtc;
static int rtc_ready;
static char rtc_reason[1024];

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[SHIM_MAX_DEVICES];

/* The calling thread's current device and last error's details. */
static _Thread_local int tl_device;
static _Thread_local hipError_t tl_error;
static _Thread_local char tl_text[1400];

/* The first library of a list that opens; every dlerror in why otherwise. */
static void *open_first(const char *const *names, char *why, size_t why_size) {
    size_t at = 0;
    why[0] = '\0';
    for (int i = 0; names[i]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        const char *e = dlerror();
        int n = snprintf(why + at, why_size - at, "%s%s", at ? "; " : "", e ? e : names[i]);
        if (n > 0) at = (size_t)n < why_size - at ? at + (size_t)n : why_size - 1;
    }
    return NULL;
}

static int take(void *lib, const char *name, void *slot, char *why, size_t why_size) {
    void *sym = dlsym(lib, name);
    if (!sym) {
        snprintf(why, why_size, "symbol %s missing", name);
        return 0;
    }
    memcpy(slot, &sym, sizeof sym);
    return 1;
}

/* An override from the environment replaces a whole list of names. */
static const char *const *names_or_env(const char *var, const char *const *defaults, const char **one) {
    const char *env = getenv(var);
    if (env && env[0]) {
        one[0] = env;
        one[1] = NULL;
        return one;
    }
    return defaults;
}

static void cu_load(void) {
    static const char *const defaults[] = {"libcuda.so.1", "libcuda.so", NULL};
    const char *one[2];
    char why[768];
    void *lib = open_first(names_or_env("FLASHATTN_CUDA_LIBRARY", defaults, one), why, sizeof why);
    if (!lib) {
        snprintf(cu_reason, sizeof cu_reason, "CUDA driver not found: %s", why);
        return;
    }
#define SHIM_TAKE(name, ret, args)                                                             \
    if (!take(lib, #name, &cu.name, why, sizeof why)) {                                        \
        snprintf(cu_reason, sizeof cu_reason, "CUDA driver too old: %s", why);                 \
        return;                                                                                \
    }
    SHIM_CU_FUNCTIONS(SHIM_TAKE)
    if (!take(lib, "cuEventElapsedTime_v2", &cu.cuEventElapsedTime, why, sizeof why) &&
        !take(lib, "cuEventElapsedTime", &cu.cuEventElapsedTime, why, sizeof why)) {
        snprintf(cu_reason, sizeof cu_reason, "CUDA driver too old: %s", why);
        return;
    }
    cu_init_result = cu.cuInit(0);
    if (cu_init_result != CUDA_SUCCESS) {
        const char *name = NULL, *text = NULL;
        (void)cu.cuGetErrorName(cu_init_result, &name);
        (void)cu.cuGetErrorString(cu_init_result, &text);
        snprintf(cu_reason, sizeof cu_reason, "cuInit: %s: %s", name ? name : "?", text ? text : "?");
        return;
    }
    cu_ready = 1;
}

static void rtc_load(void) {
    static const char *const defaults[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                           "/usr/local/cuda/lib64/libnvrtc.so.13",
                                           "/usr/local/cuda/lib64/libnvrtc.so.12",
                                           "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    const char *one[2];
    char why[768];
    void *lib = open_first(names_or_env("FLASHATTN_NVRTC_LIBRARY", defaults, one), why, sizeof why);
    if (!lib) {
        snprintf(rtc_reason, sizeof rtc_reason, "NVRTC not found: %s", why);
        return;
    }
#define SHIM_TAKE_RTC(name, ret, args)                                                         \
    if (!take(lib, #name, &rtc.name, why, sizeof why)) {                                       \
        snprintf(rtc_reason, sizeof rtc_reason, "NVRTC too old: %s", why);                     \
        return;                                                                                \
    }
    SHIM_NVRTC_FUNCTIONS(SHIM_TAKE_RTC)
    rtc_ready = 1;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static const struct {
    CUresult cu;
    hipError_t hip;
} error_map[] = {
    {CUDA_SUCCESS, hipSuccess},
    {CUDA_ERROR_INVALID_VALUE, hipErrorInvalidValue},
    {CUDA_ERROR_OUT_OF_MEMORY, hipErrorOutOfMemory},
    {CUDA_ERROR_NOT_INITIALIZED, hipErrorNotInitialized},
    {CUDA_ERROR_DEINITIALIZED, hipErrorDeinitialized},
    {CUDA_ERROR_NO_DEVICE, hipErrorNoDevice},
    {CUDA_ERROR_INVALID_DEVICE, hipErrorInvalidDevice},
    {CUDA_ERROR_INVALID_IMAGE, hipErrorInvalidImage},
    {CUDA_ERROR_INVALID_CONTEXT, hipErrorInvalidContext},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, hipErrorNoBinaryForGpu},
    {CUDA_ERROR_INVALID_PTX, hipErrorInvalidKernelFile},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, hipErrorInvalidKernelFile},
    {CUDA_ERROR_INVALID_SOURCE, hipErrorInvalidSource},
    {CUDA_ERROR_FILE_NOT_FOUND, hipErrorFileNotFound},
    {CUDA_ERROR_INVALID_HANDLE, hipErrorInvalidHandle},
    {CUDA_ERROR_NOT_FOUND, hipErrorNotFound},
    {CUDA_ERROR_NOT_READY, hipErrorNotReady},
    {CUDA_ERROR_ILLEGAL_ADDRESS, hipErrorIllegalAddress},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, hipErrorLaunchOutOfResources},
    {CUDA_ERROR_LAUNCH_TIMEOUT, hipErrorLaunchTimeOut},
    {CUDA_ERROR_LAUNCH_FAILED, hipErrorLaunchFailure},
    {CUDA_ERROR_NOT_SUPPORTED, hipErrorNotSupported},
};

static hipError_t set_error(hipError_t err, const char *fmt_call, const char *detail) {
    tl_error = err;
    snprintf(tl_text, sizeof tl_text, "%s: %s", fmt_call, detail);
    return err;
}

/* A CUDA result as HIP's, remembering the call and the driver's text. */
static hipError_t from_cu(CUresult r, const char *call) {
    if (r == CUDA_SUCCESS) return hipSuccess;
    hipError_t err = hipErrorUnknown;
    for (size_t i = 0; i < sizeof error_map / sizeof error_map[0]; i++)
        if (error_map[i].cu == r) err = error_map[i].hip;
    const char *name = NULL, *text = NULL;
    if (cu.cuGetErrorName) (void)cu.cuGetErrorName(r, &name);
    if (cu.cuGetErrorString) (void)cu.cuGetErrorString(r, &text);
    char detail[384];
    snprintf(detail, sizeof detail, "%s (%d): %s", name ? name : "CUDA error", (int)r, text ? text : "");
    return set_error(err, call, detail);
}

static hipError_t not_ready(void) {
    return set_error(cu_reason[0] ? hipErrorNoDevice : hipErrorNotInitialized, "HIP on CUDA",
                     cu_reason[0] ? cu_reason : "hipInit was not called");
}

#define SHIM_REQUIRE()                                                                         \
    do {                                                                                       \
        pthread_once(&cu_once, cu_load);                                                       \
        if (!cu_ready) return not_ready();                                                     \
    } while (0)

const char *hipGetErrorName(hipError_t err) {
    switch (err) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorDeinitialized: return "hipErrorDeinitialized";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorInvalidContext: return "hipErrorInvalidContext";
    case hipErrorNoBinaryForGpu: return "hipErrorNoBinaryForGpu";
    case hipErrorInvalidKernelFile: return "hipErrorInvalidKernelFile";
    case hipErrorInvalidSource: return "hipErrorInvalidSource";
    case hipErrorFileNotFound: return "hipErrorFileNotFound";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorIllegalAddress: return "hipErrorIllegalAddress";
    case hipErrorLaunchOutOfResources: return "hipErrorLaunchOutOfResources";
    case hipErrorLaunchTimeOut: return "hipErrorLaunchTimeOut";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t err) {
    if (err != hipSuccess && err == tl_error && tl_text[0]) return tl_text;
    return hipGetErrorName(err);
}

/* ------------------------------------------------------------------------ */
/* Devices and the current context                                          */
/* ------------------------------------------------------------------------ */

static hipError_t primary_context(int device, CUcontext *out) {
    if (device < 0 || device >= SHIM_MAX_DEVICES)
        return set_error(hipErrorInvalidDevice, "HIP on CUDA", "device ordinal out of range");
    pthread_mutex_lock(&ctx_lock);
    CUresult r = CUDA_SUCCESS;
    if (!primary[device]) {
        CUdevice dev;
        r = cu.cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS) r = cu.cuDevicePrimaryCtxRetain(&primary[device], dev);
        if (r != CUDA_SUCCESS) primary[device] = NULL;
    }
    *out = primary[device];
    pthread_mutex_unlock(&ctx_lock);
    return from_cu(r, "cuDevicePrimaryCtxRetain");
}

/* Make the thread's current device's primary context current in CUDA. */
static hipError_t bind(void) {
    CUcontext ctx = NULL, cur = NULL;
    hipError_t err = primary_context(tl_device, &ctx);
    if (err != hipSuccess) return err;
    if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx) return hipSuccess;
    return from_cu(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

#define SHIM_BIND()                                                                            \
    do {                                                                                       \
        SHIM_REQUIRE();                                                                        \
        hipError_t bind_err_ = bind();                                                         \
        if (bind_err_ != hipSuccess) return bind_err_;                                         \
    } while (0)

hipError_t hipInit(unsigned int flags) {
    (void)flags;
    SHIM_REQUIRE();
    return hipSuccess;
}

hipError_t hipRuntimeGetVersion(int *version) {
    if (!version) return set_error(hipErrorInvalidValue, "hipRuntimeGetVersion", "version is NULL");
    SHIM_REQUIRE();
    int driver = 0;
    hipError_t err = from_cu(cu.cuDriverGetVersion(&driver), "cuDriverGetVersion");
    if (err != hipSuccess) return err;
    *version = 5 * 10000000 + 2 * 100000 + (driver >= 0 && driver < 100000 ? driver : 0);
    return hipSuccess;
}

hipError_t hipGetDeviceCount(int *count) {
    if (!count) return set_error(hipErrorInvalidValue, "hipGetDeviceCount", "count is NULL");
    *count = 0;
    SHIM_REQUIRE();
    hipError_t err = from_cu(cu.cuDeviceGetCount(count), "cuDeviceGetCount");
    if (err == hipSuccess && *count > SHIM_MAX_DEVICES) *count = SHIM_MAX_DEVICES;
    return err;
}

hipError_t hipDeviceGet(hipDevice_t *device, int ordinal) {
    if (!device) return set_error(hipErrorInvalidValue, "hipDeviceGet", "device is NULL");
    SHIM_REQUIRE();
    CUdevice dev;
    hipError_t err = from_cu(cu.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    /* HIP's device handle is the ordinal. */
    if (err == hipSuccess) *device = ordinal;
    return err;
}

static hipError_t cu_device(int ordinal, CUdevice *dev) {
    return from_cu(cu.cuDeviceGet(dev, ordinal), "cuDeviceGet");
}

hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device) {
    if (!name || len <= 0) return set_error(hipErrorInvalidValue, "hipDeviceGetName", "name is NULL or len <= 0");
    SHIM_REQUIRE();
    CUdevice dev;
    hipError_t err = cu_device(device, &dev);
    if (err == hipSuccess) err = from_cu(cu.cuDeviceGetName(name, len, dev), "cuDeviceGetName");
    return err;
}

hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device) {
    if (!bytes) return set_error(hipErrorInvalidValue, "hipDeviceTotalMem", "bytes is NULL");
    SHIM_REQUIRE();
    CUdevice dev;
    hipError_t err = cu_device(device, &dev);
    if (err == hipSuccess) err = from_cu(cu.cuDeviceTotalMem_v2(bytes, dev), "cuDeviceTotalMem_v2");
    return err;
}

static const struct {
    hipDeviceAttribute_t hip;
    CUdevice_attribute cu;
} attribute_map[] = {
    {hipDeviceAttributeMaxSharedMemoryPerBlock, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK},
    {hipDeviceAttributeMaxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
    {hipDeviceAttributeWarpSize, CU_DEVICE_ATTRIBUTE_WARP_SIZE},
    {hipDeviceAttributeMultiprocessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
    {hipDeviceAttributeClockRate, CU_DEVICE_ATTRIBUTE_CLOCK_RATE},
    {hipDeviceAttributeMemoryClockRate, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE},
    {hipDeviceAttributeMemoryBusWidth, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH},
    {hipDeviceAttributeComputeCapabilityMajor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
    {hipDeviceAttributeComputeCapabilityMinor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
    {hipDeviceAttributeMaxBlockDimX, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X},
    {hipDeviceAttributeMaxBlockDimY, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y},
    {hipDeviceAttributeMaxBlockDimZ, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z},
    {hipDeviceAttributeMaxGridDimX, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X},
    {hipDeviceAttributeMaxGridDimY, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y},
    {hipDeviceAttributeMaxGridDimZ, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z},
    {hipDeviceAttributeL2CacheSize, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
    {hipDeviceAttributeMaxRegistersPerBlock, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK},
    {hipDeviceAttributeSharedMemPerBlockOptin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
    {hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR},
    {hipDeviceAttributeTotalConstantMemory, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY},
};

hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device) {
    if (!value) return set_error(hipErrorInvalidValue, "hipDeviceGetAttribute", "value is NULL");
    SHIM_REQUIRE();
    CUdevice dev;
    hipError_t err = cu_device(device, &dev);
    if (err != hipSuccess) return err;
    for (size_t i = 0; i < sizeof attribute_map / sizeof attribute_map[0]; i++)
        if (attribute_map[i].hip == attr)
            return from_cu(cu.cuDeviceGetAttribute(value, attribute_map[i].cu, dev), "cuDeviceGetAttribute");
    char detail[96];
    snprintf(detail, sizeof detail, "attribute %d is not mapped onto CUDA", (int)attr);
    return set_error(hipErrorInvalidValue, "hipDeviceGetAttribute", detail);
}

static hipError_t fill_properties(hipDeviceProp_t *props, int device) {
    if (!props) return set_error(hipErrorInvalidValue, "hipGetDeviceProperties", "props is NULL");
    SHIM_REQUIRE();
    CUdevice dev;
    hipError_t err = cu_device(device, &dev);
    if (err != hipSuccess) return err;
    memset(props, 0, sizeof *props);
    err = from_cu(cu.cuDeviceGetName(props->name, (int)sizeof props->name, dev), "cuDeviceGetName");
    if (err == hipSuccess) err = from_cu(cu.cuDeviceTotalMem_v2(&props->totalGlobalMem, dev), "cuDeviceTotalMem_v2");
    int shared = 0;
    const struct {
        hipDeviceAttribute_t attr;
        int *dst;
    } ints[] = {
        {hipDeviceAttributeMaxSharedMemoryPerBlock, &shared},
        {hipDeviceAttributeWarpSize, &props->warpSize},
        {hipDeviceAttributeMaxThreadsPerBlock, &props->maxThreadsPerBlock},
        {hipDeviceAttributeClockRate, &props->clockRate},
        {hipDeviceAttributeMemoryClockRate, &props->memoryClockRate},
        {hipDeviceAttributeMemoryBusWidth, &props->memoryBusWidth},
        {hipDeviceAttributeMultiprocessorCount, &props->multiProcessorCount},
        {hipDeviceAttributeComputeCapabilityMajor, &props->major},
        {hipDeviceAttributeComputeCapabilityMinor, &props->minor},
        {hipDeviceAttributeL2CacheSize, &props->l2CacheSize},
        {hipDeviceAttributeMaxRegistersPerBlock, &props->regsPerBlock},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && err == hipSuccess; i++)
        err = hipDeviceGetAttribute(ints[i].dst, ints[i].attr, device);
    if (err != hipSuccess) return err;
    props->sharedMemPerBlock = (size_t)shared;
    props->maxSharedMemoryPerMultiProcessor = (size_t)shared;
    snprintf(props->gcnArchName, sizeof props->gcnArchName, "sm_%d%d", props->major, props->minor);
    props->gcnArch = 0;
    return hipSuccess;
}

hipError_t hipGetDeviceProperties(hipDeviceProp_t *props, int device) { return fill_properties(props, device); }

hipError_t hipGetDevicePropertiesR0000(hipDeviceProp_t *props, int device) { return fill_properties(props, device); }

hipError_t hipGetDevice(int *device) {
    if (!device) return set_error(hipErrorInvalidValue, "hipGetDevice", "device is NULL");
    SHIM_REQUIRE();
    *device = tl_device;
    return hipSuccess;
}

hipError_t hipSetDevice(int device) {
    SHIM_REQUIRE();
    int count = 0;
    hipError_t err = from_cu(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (err != hipSuccess) return err;
    if (device < 0 || device >= count || device >= SHIM_MAX_DEVICES)
        return set_error(hipErrorInvalidDevice, "hipSetDevice", "device ordinal out of range");
    tl_device = device;
    return bind();
}

hipError_t hipDeviceSynchronize(void) {
    SHIM_BIND();
    return from_cu(cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

/* ------------------------------------------------------------------------ */
/* Streams, memory                                                           */
/* ------------------------------------------------------------------------ */

static CUstream cu_stream(hipStream_t s) { return (CUstream)(void *)s; }
static CUdeviceptr cu_ptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
    if (!stream) return set_error(hipErrorInvalidValue, "hipStreamCreateWithFlags", "stream is NULL");
    SHIM_BIND();
    CUstream s = NULL;
    unsigned int cu_flags = (flags & hipStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    hipError_t err = from_cu(cu.cuStreamCreate(&s, cu_flags), "cuStreamCreate");
    *stream = err == hipSuccess ? (hipStream_t)(void *)s : NULL;
    return err;
}

hipError_t hipStreamDestroy(hipStream_t stream) {
    SHIM_BIND();
    return from_cu(cu.cuStreamDestroy_v2(cu_stream(stream)), "cuStreamDestroy_v2");
}

hipError_t hipStreamSynchronize(hipStream_t stream) {
    SHIM_BIND();
    return from_cu(cu.cuStreamSynchronize(cu_stream(stream)), "cuStreamSynchronize");
}

hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    SHIM_BIND();
    return from_cu(cu.cuStreamWaitEvent(cu_stream(stream), (CUevent)(void *)event, flags), "cuStreamWaitEvent");
}

hipError_t hipMalloc(void **ptr, size_t size) {
    if (!ptr) return set_error(hipErrorInvalidValue, "hipMalloc", "ptr is NULL");
    *ptr = NULL;
    if (size == 0) return hipSuccess;
    SHIM_BIND();
    CUdeviceptr p = 0;
    hipError_t err = from_cu(cu.cuMemAlloc_v2(&p, size), "cuMemAlloc_v2");
    if (err == hipSuccess) *ptr = (void *)(uintptr_t)p;
    return err;
}

hipError_t hipFree(void *ptr) {
    if (!ptr) return hipSuccess;
    SHIM_BIND();
    return from_cu(cu.cuMemFree_v2(cu_ptr(ptr)), "cuMemFree_v2");
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, hipMemcpyKind kind, hipStream_t stream) {
    if (bytes == 0) return hipSuccess;
    SHIM_BIND();
    CUstream s = cu_stream(stream);
    switch (kind) {
    case hipMemcpyHostToDevice:
        return from_cu(cu.cuMemcpyHtoDAsync_v2(cu_ptr(dst), src, bytes, s), "cuMemcpyHtoDAsync_v2");
    case hipMemcpyDeviceToHost:
        return from_cu(cu.cuMemcpyDtoHAsync_v2(dst, cu_ptr(src), bytes, s), "cuMemcpyDtoHAsync_v2");
    case hipMemcpyDeviceToDevice:
        return from_cu(cu.cuMemcpyDtoDAsync_v2(cu_ptr(dst), cu_ptr(src), bytes, s), "cuMemcpyDtoDAsync_v2");
    case hipMemcpyDefault:
    case hipMemcpyHostToHost:
        /* Unified addressing tells the pointers apart. */
        return from_cu(cu.cuMemcpyAsync(cu_ptr(dst), cu_ptr(src), bytes, s), "cuMemcpyAsync");
    default:
        return set_error(hipErrorInvalidMemcpyDirection, "hipMemcpyAsync", "unknown copy kind");
    }
}

hipError_t hipMemsetAsync(void *dst, int value, size_t bytes, hipStream_t stream) {
    if (bytes == 0) return hipSuccess;
    SHIM_BIND();
    return from_cu(cu.cuMemsetD8Async(cu_ptr(dst), (unsigned char)value, bytes, cu_stream(stream)),
                   "cuMemsetD8Async");
}

hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr) {
    if (!attributes) return set_error(hipErrorInvalidValue, "hipPointerGetAttributes", "attributes is NULL");
    SHIM_BIND();
    memset(attributes, 0, sizeof *attributes);
    int ordinal = -1;
    unsigned int type = 0;
    hipError_t err = from_cu(cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, cu_ptr(ptr)),
                             "cuPointerGetAttribute(DEVICE_ORDINAL)");
    if (err == hipSuccess)
        err = from_cu(cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, cu_ptr(ptr)),
                      "cuPointerGetAttribute(MEMORY_TYPE)");
    if (err != hipSuccess) return err;
    attributes->device = ordinal;
    attributes->memoryType = type == CU_MEMORYTYPE_HOST ? hipMemoryTypeHost : hipMemoryTypeDevice;
    attributes->devicePointer = type == CU_MEMORYTYPE_HOST ? NULL : (void *)(uintptr_t)ptr;
    attributes->hostPointer = type == CU_MEMORYTYPE_HOST ? (void *)(uintptr_t)ptr : NULL;
    return hipSuccess;
}

hipError_t hipMemGetAddressRange(hipDeviceptr_t *base, size_t *size, hipDeviceptr_t ptr) {
    SHIM_BIND();
    CUdeviceptr b = 0;
    size_t n = 0;
    hipError_t err = from_cu(cu.cuMemGetAddressRange_v2(&b, &n, cu_ptr(ptr)), "cuMemGetAddressRange_v2");
    if (err == hipSuccess) {
        if (base) *base = (hipDeviceptr_t)(uintptr_t)b;
        if (size) *size = n;
    }
    return err;
}

/* ------------------------------------------------------------------------ */
/* Modules, launches, events                                                 */
/* ------------------------------------------------------------------------ */

hipError_t hipModuleLoadData(hipModule_t *module, const void *image) {
    if (!module || !image) return set_error(hipErrorInvalidValue, "hipModuleLoadData", "module or image is NULL");
    SHIM_BIND();
    CUmodule m = NULL;
    hipError_t err = from_cu(cu.cuModuleLoadData(&m, image), "cuModuleLoadData");
    *module = err == hipSuccess ? (hipModule_t)(void *)m : NULL;
    return err;
}

hipError_t hipModuleUnload(hipModule_t module) {
    SHIM_BIND();
    return from_cu(cu.cuModuleUnload((CUmodule)(void *)module), "cuModuleUnload");
}

hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *name) {
    if (!function || !name) return set_error(hipErrorInvalidValue, "hipModuleGetFunction", "function or name is NULL");
    SHIM_BIND();
    CUfunction f = NULL;
    hipError_t err = from_cu(cu.cuModuleGetFunction(&f, (CUmodule)(void *)module, name), "cuModuleGetFunction");
    *function = err == hipSuccess ? (hipFunction_t)(void *)f : NULL;
    return err;
}

hipError_t hipFuncGetAttribute(int *value, hipFunction_attribute attrib, hipFunction_t function) {
    if (!value) return set_error(hipErrorInvalidValue, "hipFuncGetAttribute", "value is NULL");
    SHIM_BIND();
    CUfunction_attribute a;
    switch (attrib) {
    case HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: a = CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK; break;
    case HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: a = CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES; break;
    case HIP_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: a = CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES; break;
    case HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: a = CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES; break;
    case HIP_FUNC_ATTRIBUTE_NUM_REGS: a = CU_FUNC_ATTRIBUTE_NUM_REGS; break;
    case HIP_FUNC_ATTRIBUTE_PTX_VERSION: a = CU_FUNC_ATTRIBUTE_PTX_VERSION; break;
    case HIP_FUNC_ATTRIBUTE_BINARY_VERSION: a = CU_FUNC_ATTRIBUTE_BINARY_VERSION; break;
    case HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: a = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; break;
    default: return set_error(hipErrorInvalidValue, "hipFuncGetAttribute", "attribute not mapped onto CUDA");
    }
    return from_cu(cu.cuFuncGetAttribute(value, a, (CUfunction)(void *)function), "cuFuncGetAttribute");
}

hipError_t hipFuncSetAttribute(const void *function, hipFuncAttribute attr, int value) {
    if (!function) return set_error(hipErrorInvalidDeviceFunction, "hipFuncSetAttribute", "function is NULL");
    if (attr != hipFuncAttributeMaxDynamicSharedMemorySize)
        return set_error(hipErrorInvalidValue, "hipFuncSetAttribute", "attribute not mapped onto CUDA");
    SHIM_BIND();
    /* The backend passes the hipFunction_t of a loaded module: a CUfunction. */
    return from_cu(cu.cuFuncSetAttribute((CUfunction)(uintptr_t)function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         value),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int shared, hipStream_t stream,
                                 void **params, void **extra) {
    SHIM_BIND();
    /* HIP's and CUDA's "extra" lists use different end markers
     * (HIP_LAUNCH_PARAM_END is 3, CU_LAUNCH_PARAM_END 0); the other two
     * markers agree. */
    void *cu_extra[16];
    void **pass_extra = NULL;
    if (extra) {
        size_t n = 0;
        while (n + 1 < sizeof cu_extra / sizeof cu_extra[0] && extra[n] != HIP_LAUNCH_PARAM_END) {
            cu_extra[n] = extra[n];
            n++;
        }
        if (extra[n] != HIP_LAUNCH_PARAM_END)
            return set_error(hipErrorInvalidValue, "hipModuleLaunchKernel", "extra list too long");
        cu_extra[n] = CU_LAUNCH_PARAM_END;
        pass_extra = cu_extra;
    }
    return from_cu(cu.cuLaunchKernel((CUfunction)(void *)f, gx, gy, gz, bx, by, bz, shared, cu_stream(stream), params,
                                     pass_extra),
                   "cuLaunchKernel");
}

hipError_t hipEventCreate(hipEvent_t *event) {
    if (!event) return set_error(hipErrorInvalidValue, "hipEventCreate", "event is NULL");
    SHIM_BIND();
    CUevent e = NULL;
    hipError_t err = from_cu(cu.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    *event = err == hipSuccess ? (hipEvent_t)(void *)e : NULL;
    return err;
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    SHIM_BIND();
    return from_cu(cu.cuEventRecord((CUevent)(void *)event, cu_stream(stream)), "cuEventRecord");
}

hipError_t hipEventSynchronize(hipEvent_t event) {
    SHIM_BIND();
    return from_cu(cu.cuEventSynchronize((CUevent)(void *)event), "cuEventSynchronize");
}

hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop) {
    if (!ms) return set_error(hipErrorInvalidValue, "hipEventElapsedTime", "ms is NULL");
    SHIM_BIND();
    return from_cu(cu.cuEventElapsedTime(ms, (CUevent)(void *)start, (CUevent)(void *)stop), "cuEventElapsedTime");
}

hipError_t hipEventDestroy(hipEvent_t event) {
    SHIM_BIND();
    return from_cu(cu.cuEventDestroy_v2((CUevent)(void *)event), "cuEventDestroy_v2");
}

/* ------------------------------------------------------------------------ */
/* hiprtc on NVRTC                                                           */
/* ------------------------------------------------------------------------ */

/* hiprtc's handle: NVRTC's program and what the mapping itself has to say
 * (a refused option), which the program log then starts with. */
struct _hiprtcProgram {
    nvrtcProgram prog;
    char note[256];
};

static hiprtcResult from_nvrtc(nvrtcResult r) {
    /* hiprtc numbers its results as NVRTC does, 0 to 11. */
    return (int)r >= 0 && (int)r <= (int)HIPRTC_ERROR_INTERNAL_ERROR ? (hiprtcResult)r : HIPRTC_ERROR_INTERNAL_ERROR;
}

#define SHIM_RTC_REQUIRE()                                                                     \
    do {                                                                                       \
        pthread_once(&rtc_once, rtc_load);                                                     \
        if (!rtc_ready) return HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE;                         \
    } while (0)

const char *hiprtcGetErrorString(hiprtcResult result) {
    switch (result) {
    case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
    case HIPRTC_ERROR_OUT_OF_MEMORY: return "HIPRTC_ERROR_OUT_OF_MEMORY";
    case HIPRTC_ERROR_PROGRAM_CREATION_FAILURE: return "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
    case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
    case HIPRTC_ERROR_INVALID_OPTION: return "HIPRTC_ERROR_INVALID_OPTION";
    case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
    case HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE:
        pthread_once(&rtc_once, rtc_load);
        return rtc_ready ? "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE" : rtc_reason;
    default: return "HIPRTC_ERROR_INTERNAL_ERROR";
    }
}

hiprtcResult hiprtcVersion(int *major, int *minor) {
    SHIM_RTC_REQUIRE();
    return from_nvrtc(rtc.nvrtcVersion(major, minor));
}

hiprtcResult hiprtcCreateProgram(hiprtcProgram *prog, const char *src, const char *name, int num_headers,
                                 const char **headers, const char **include_names) {
    if (!prog || !src) return HIPRTC_ERROR_INVALID_INPUT;
    *prog = NULL;
    SHIM_RTC_REQUIRE();
    struct _hiprtcProgram *p = calloc(1, sizeof *p);
    if (!p) return HIPRTC_ERROR_OUT_OF_MEMORY;
    nvrtcResult r = rtc.nvrtcCreateProgram(&p->prog, src, name, num_headers, (const char *const *)headers,
                                           (const char *const *)include_names);
    if (r != NVRTC_SUCCESS) {
        free(p);
        return from_nvrtc(r);
    }
    *prog = p;
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcDestroyProgram(hiprtcProgram *prog) {
    if (!prog || !*prog) return HIPRTC_ERROR_INVALID_PROGRAM;
    SHIM_RTC_REQUIRE();
    nvrtcResult r = rtc.nvrtcDestroyProgram(&(*prog)->prog);
    free(*prog);
    *prog = NULL;
    return from_nvrtc(r);
}

/* Options: --offload-arch=sm_XY becomes --gpu-architecture=sm_XY (a
 * cubin for exactly that GPU); an AMD architecture is refused; -O levels
 * are dropped (NVRTC and ptxas optimise fully by default); everything
 * else (-D, -I, -std) passes as is. */
hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int num_options, const char **options) {
    if (!prog || num_options < 0 || (num_options > 0 && !options)) return HIPRTC_ERROR_INVALID_INPUT;
    SHIM_RTC_REQUIRE();
    prog->note[0] = '\0';
    const char **mapped = malloc(((size_t)num_options + 1) * sizeof *mapped);
    char **owned = calloc((size_t)num_options + 1, sizeof *owned);
    if (!mapped || !owned) {
        free(mapped);
        free(owned);
        return HIPRTC_ERROR_OUT_OF_MEMORY;
    }
    int n = 0;
    hiprtcResult result = HIPRTC_SUCCESS;
    static const char arch_prefix[] = "--offload-arch=";
    for (int i = 0; i < num_options && result == HIPRTC_SUCCESS; i++) {
        const char *o = options[i];
        if (!o) {
            result = HIPRTC_ERROR_INVALID_INPUT;
        } else if (strncmp(o, arch_prefix, sizeof arch_prefix - 1) == 0) {
            const char *arch = o + sizeof arch_prefix - 1;
            if (strncmp(arch, "sm_", 3) != 0) {
                snprintf(prog->note, sizeof prog->note,
                         "HIP on CUDA: %s names no NVIDIA architecture (sm_XY)\n", o);
                result = HIPRTC_ERROR_INVALID_OPTION;
            } else {
                size_t len = strlen(arch) + sizeof "--gpu-architecture=";
                owned[n] = malloc(len);
                if (!owned[n]) {
                    result = HIPRTC_ERROR_OUT_OF_MEMORY;
                } else {
                    snprintf(owned[n], len, "--gpu-architecture=%s", arch);
                    mapped[n] = owned[n];
                    n++;
                }
            }
        } else if (o[0] == '-' && o[1] == 'O' && o[2] != '\0' && o[3] == '\0') {
            continue;
        } else {
            mapped[n++] = o;
        }
    }
    if (result == HIPRTC_SUCCESS) result = from_nvrtc(rtc.nvrtcCompileProgram(prog->prog, n, mapped));
    for (int i = 0; i < num_options; i++) free(owned[i]);
    free(owned);
    free(mapped);
    return result;
}

hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    SHIM_RTC_REQUIRE();
    size_t n = 0;
    nvrtcResult r = rtc.nvrtcGetProgramLogSize(prog->prog, &n);
    if (r != NVRTC_SUCCESS) return from_nvrtc(r);
    /* NVRTC's size counts its NUL; the note goes in front of its text. */
    *size = strlen(prog->note) + n;
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char *log) {
    if (!prog || !log) return HIPRTC_ERROR_INVALID_INPUT;
    SHIM_RTC_REQUIRE();
    size_t note = strlen(prog->note);
    memcpy(log, prog->note, note);
    return from_nvrtc(rtc.nvrtcGetProgramLog(prog->prog, log + note));
}

hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    SHIM_RTC_REQUIRE();
    return from_nvrtc(rtc.nvrtcGetCUBINSize(prog->prog, size));
}

hiprtcResult hiprtcGetCode(hiprtcProgram prog, char *code) {
    if (!prog || !code) return HIPRTC_ERROR_INVALID_INPUT;
    SHIM_RTC_REQUIRE();
    return from_nvrtc(rtc.nvrtcGetCUBIN(prog->prog, code));
}
