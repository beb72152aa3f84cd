/* The CUDA and HIP runtime halves: loading at run time, device description,
 * contexts, memory and zero-copy interop.
 *
 * Every case runs on every machine. Where a runtime or its GPU is missing,
 * the cases check that the backend says so clearly (a status, a reason)
 * and that nothing else is disturbed; the device cases then skip. On a
 * machine with the GPU they move real memory. A missing runtime is also
 * simulated on any machine, by pointing FLASHATTN_CUDA_LIBRARY,
 * FLASHATTN_HIP_LIBRARY and FLASHATTN_NVRTC_LIBRARY at files that do not
 * exist, in a child process (the runtimes are loaded once per process). */
#include "harness.h"
#include "test_util.h"

#include "flashattn.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif
#ifdef FA_WITH_HIP
#include "backends/hip/hip_runtime_internal.h"
#endif

#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/wait.h>

extern char **environ;

#define MISSING_CUDA "/nonexistent/flashattn-test/libcuda-missing.so.1"
#define MISSING_HIP "/nonexistent/flashattn-test/libamdhip64-missing.so"
#define MISSING_NVRTC "/nonexistent/flashattn-test/libnvrtc-missing.so"

static int compiled_in(fa_backend backend) {
#ifdef FA_WITH_CUDA
    if (backend == FA_BACKEND_CUDA) return 1;
#endif
#ifdef FA_WITH_HIP
    if (backend == FA_BACKEND_HIP) return 1;
#endif
    (void)backend;
    return 0;
}

/* The backend's status: success, or unavailable with a reason; never
 * anything else. Returns 1 when available. */
static int check_status(fa_backend backend) {
    char reason[1024];
    memset(reason, 'x', sizeof reason);
    fa_status st = fa_backend_get_status(backend, reason, sizeof reason);
    CHECK_MSG(st == FA_SUCCESS || st == FA_ERR_BACKEND_UNAVAILABLE, "%s: status %s",
              fa_backend_name(backend), fa_status_string(st));
    CHECK(memchr(reason, '\0', sizeof reason) != NULL);
    if (st == FA_SUCCESS) {
        CHECK_MSG(compiled_in(backend), "%s reports success but is not compiled in",
                  fa_backend_name(backend));
        CHECK_MSG(reason[0] == '\0', "available %s backend left a reason: %s",
                  fa_backend_name(backend), reason);
    } else {
        CHECK_MSG(strlen(reason) > 0, "%s is unavailable without a reason", fa_backend_name(backend));
        printf("  %s unavailable: %s\n", fa_backend_name(backend), reason);
    }
    /* A small buffer is truncated, never overrun, and the answer is stable. */
    char small[8];
    memset(small, 'x', sizeof small);
    fa_status again = fa_backend_get_status(backend, small, sizeof small);
    CHECK(again == st);
    CHECK(memchr(small, '\0', sizeof small) != NULL);
    return st == FA_SUCCESS;
}

/* Devices of one backend in the global list, which must be numbered 0.. in
 * order and agree with the backend. */
static int listed_devices(fa_backend backend) {
    int count = -1;
    CHECK_OK(fa_device_count(&count));
    CHECK(count >= 1); /* the reference device is always there */
    int seen = 0;
    for (int g = 0; g < count; g++) {
        fa_device_info info;
        memset(&info, 0, sizeof info);
        CHECK_OK(fa_device_get_info(g, &info));
        if (info.backend != backend) continue;
        CHECK_MSG(info.index == seen, "%s device listed as index %d, expected %d",
                  fa_backend_name(backend), info.index, seen);
        CHECK(info.desc.backend == backend);
        seen++;
    }
    return seen;
}

static void check_backend_consistency(fa_backend backend) {
    int available = check_status(backend);
    int devices = listed_devices(backend);
    fa_context ctx = NULL;
    if (!available) {
        CHECK_MSG(devices == 0, "unavailable %s backend lists %d devices", fa_backend_name(backend),
                  devices);
        fa_status st = fa_context_create(backend, 0, &ctx);
        CHECK_MSG(st == FA_ERR_BACKEND_UNAVAILABLE || st == FA_ERR_DEVICE_NOT_FOUND,
                  "fa_context_create(%s, 0) returned %s", fa_backend_name(backend), fa_status_string(st));
        CHECK(strlen(fa_last_error()) > 0);
        CHECK(ctx == NULL);
        st = fa_context_create(backend, -1, &ctx);
        CHECK_MSG(st == FA_ERR_BACKEND_UNAVAILABLE || st == FA_ERR_DEVICE_NOT_FOUND,
                  "fa_context_create(%s, -1) returned %s", fa_backend_name(backend), fa_status_string(st));
        CHECK(strlen(fa_last_error()) > 0);
        CHECK(ctx == NULL);
    } else {
        CHECK_MSG(devices >= 1, "available %s backend lists no device", fa_backend_name(backend));
        /* One past the last device is not found, and says so. */
        CHECK_STATUS(fa_context_create(backend, devices, &ctx), FA_ERR_DEVICE_NOT_FOUND);
        CHECK(strlen(fa_last_error()) > 0);
        CHECK(ctx == NULL);
    }
}

FA_TEST(cuda_status_is_clear) { check_backend_consistency(FA_BACKEND_CUDA); }

FA_TEST(hip_status_is_clear) { check_backend_consistency(FA_BACKEND_HIP); }

/* Run in a child whose environment names missing runtime libraries. */
static void missing_runtime_checks(void) {
    const fa_backend backends[] = {FA_BACKEND_CUDA, FA_BACKEND_HIP};
    const char *paths[] = {MISSING_CUDA, MISSING_HIP};
    for (int i = 0; i < 2; i++) {
        char reason[1024] = "";
        CHECK_STATUS(fa_backend_get_status(backends[i], reason, sizeof reason),
                     FA_ERR_BACKEND_UNAVAILABLE);
        CHECK(strlen(reason) > 0);
        if (compiled_in(backends[i]))
            CHECK_MSG(strstr(reason, paths[i]) != NULL, "reason \"%s\" does not name %s", reason,
                      paths[i]);
        CHECK(listed_devices(backends[i]) == 0);
        fa_context ctx = NULL;
        CHECK_STATUS(fa_context_create(backends[i], 0, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
        if (compiled_in(backends[i]))
            CHECK_MSG(strstr(fa_last_error(), paths[i]) != NULL, "message \"%s\" does not name %s",
                      fa_last_error(), paths[i]);
        CHECK(ctx == NULL);
        CHECK_STATUS(fa_context_create(backends[i], -1, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
        CHECK(ctx == NULL);
    }
    /* The best device is then found elsewhere (the reference at least). */
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_ANY, -1, &ctx));
    if (ctx) {
        fa_device_info info;
        CHECK_OK(fa_context_get_info(ctx, &info));
        CHECK(info.backend != FA_BACKEND_CUDA && info.backend != FA_BACKEND_HIP);
        CHECK_OK(fa_context_destroy(ctx));
    }
#ifdef FA_WITH_CUDA
    char reason[1024] = "";
    CHECK(!fa_cuda_nvrtc_available(reason, sizeof reason));
    CHECK_MSG(strstr(reason, MISSING_NVRTC) != NULL, "NVRTC reason \"%s\" does not name %s", reason,
              MISSING_NVRTC);
#endif
}

FA_TEST(missing_runtime_is_unavailable) {
    const char *env = getenv("FLASHATTN_CUDA_LIBRARY");
    if (env && strcmp(env, MISSING_CUDA) == 0) {
        missing_runtime_checks();
        return;
    }
    /* The child re-runs this case with the overrides in its environment. */
    size_t n = 0;
    while (environ[n]) n++;
    char **envp = calloc(n + 4, sizeof *envp);
    CHECK(envp != NULL);
    if (!envp) return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "FLASHATTN_CUDA_LIBRARY=", 23) == 0 ||
            strncmp(environ[i], "FLASHATTN_HIP_LIBRARY=", 22) == 0 ||
            strncmp(environ[i], "FLASHATTN_NVRTC_LIBRARY=", 24) == 0)
            continue;
        envp[k++] = environ[i];
    }
    envp[k++] = (char *)"FLASHATTN_CUDA_LIBRARY=" MISSING_CUDA;
    envp[k++] = (char *)"FLASHATTN_HIP_LIBRARY=" MISSING_HIP;
    envp[k++] = (char *)"FLASHATTN_NVRTC_LIBRARY=" MISSING_NVRTC;
    envp[k] = NULL;
    char *argv[] = {(char *)"/proc/self/exe", (char *)"missing_runtime_is_unavailable", NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp);
    free(envp);
    CHECK_MSG(rc == 0, "posix_spawn failed: %d", rc);
    if (rc != 0) return;
    int wstatus = 0;
    CHECK(waitpid(pid, &wstatus, 0) == pid);
    CHECK_MSG(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
              "the child with missing runtimes failed (status 0x%x)", (unsigned)wstatus);
}

FA_TEST(nvrtc_probe_is_clear) {
#ifdef FA_WITH_CUDA
    char reason[1024];
    memset(reason, 'x', sizeof reason);
    int present = fa_cuda_nvrtc_available(reason, sizeof reason);
    CHECK(memchr(reason, '\0', sizeof reason) != NULL);
    if (present)
        CHECK(reason[0] == '\0');
    else
        CHECK(strlen(reason) > 0);
    /* Loaded once: the second answer is the first. */
    char again[1024];
    CHECK(fa_cuda_nvrtc_available(again, sizeof again) == present);
    CHECK(strcmp(again, reason) == 0);
    printf("  NVRTC %s%s\n", present ? "present" : "missing: ", reason);
#else
    FA_SKIP("the CUDA backend is not compiled in");
#endif
}

/* ------------------------------------------------------------------------ */
/* With a device                                                            */
/* ------------------------------------------------------------------------ */

/* The first global device of a backend, or -1. */
static int first_device(fa_backend backend, fa_device_info *out) {
    int count = 0;
    if (fa_device_count(&count) != FA_SUCCESS) return -1;
    for (int g = 0; g < count; g++) {
        fa_device_info info;
        if (fa_device_get_info(g, &info) == FA_SUCCESS && info.backend == backend) {
            if (out) *out = info;
            return g;
        }
    }
    return -1;
}

static void check_desc(const fa_device_info *info, fa_backend backend) {
    const fa_device_desc *d = &info->desc;
    CHECK(d->backend == backend);
    CHECK(d->type == FA_DEVICE_GPU);
    CHECK(strlen(d->name) > 0);
    CHECK(strchr(info->driver_version, '.') != NULL);
    CHECK_MSG(d->local_mem_bytes >= 32 * 1024 && d->local_mem_bytes <= 1024 * 1024,
              "local_mem_bytes %zu", d->local_mem_bytes);
    CHECK_MSG(d->max_work_group_size >= 256 && d->max_work_group_size <= 4096,
              "max_work_group_size %d", d->max_work_group_size);
    CHECK_MSG(d->compute_units >= 1 && d->compute_units <= 4096, "compute_units %d", d->compute_units);
    CHECK_MSG(d->clock_mhz >= 100 && d->clock_mhz <= 10000, "clock_mhz %d", d->clock_mhz);
    CHECK_MSG(d->bandwidth_gbs >= 10.0 && d->bandwidth_gbs <= 100000.0, "bandwidth_gbs %g",
              d->bandwidth_gbs);
    CHECK(d->bandwidth_measured == 0); /* the queried peak, not a measurement */
    CHECK_MSG(d->global_mem_bytes >= ((size_t)256 << 20), "global_mem_bytes %zu", d->global_mem_bytes);
    CHECK_MSG(d->fp32_flops_per_clock_cu == 128.0 || d->fp32_flops_per_clock_cu == 256.0,
              "fp32_flops_per_clock_cu %g", d->fp32_flops_per_clock_cu);
    CHECK(d->matrix_flops_per_clock_cu >= 0.0);
    if (d->matrix_flops_per_clock_cu > 0.0)
        CHECK(d->matrix_m > 0 && d->matrix_n > 0 && d->matrix_k > 0);
    else
        CHECK(d->matrix_m == 0 && d->matrix_n == 0 && d->matrix_k == 0);
    printf("  %s: %s, %s, %d CUs at %d MHz, %zu KiB local, %.0f GB/s, %.0f/%.0f flops/clk/CU, "
           "driver %s\n",
           fa_backend_name(backend), d->name, d->arch, d->compute_units, d->clock_mhz,
           d->local_mem_bytes / 1024, d->bandwidth_gbs, d->fp32_flops_per_clock_cu,
           d->matrix_flops_per_clock_cu, info->driver_version);
}

FA_TEST(cuda_device_desc) {
    fa_device_info info;
    if (first_device(FA_BACKEND_CUDA, &info) < 0) FA_SKIP("no CUDA device");
    check_desc(&info, FA_BACKEND_CUDA);
    const fa_device_desc *d = &info.desc;
    CHECK(strcmp(d->vendor, "NVIDIA") == 0);
    CHECK_MSG(d->simd_width == 32, "warp size %d", d->simd_width);
    int sm = 0;
    char tail = 0;
    CHECK_MSG(sscanf(d->arch, "sm_%d%c", &sm, &tail) == 1 && sm >= 30, "arch \"%s\"", d->arch);
    if (sm >= 80) {
        CHECK(d->matrix_flops_per_clock_cu >= 1024.0);
        CHECK(d->matrix_m == 16 && d->matrix_n == 8 && d->matrix_k == 16);
    } else {
        CHECK(d->matrix_flops_per_clock_cu == 0.0);
    }
    /* The documented per-SM rates of the two architectures the kernels target. */
    if (sm == 80) CHECK(d->fp32_flops_per_clock_cu == 128.0 && d->matrix_flops_per_clock_cu == 2048.0);
    if (sm == 90) CHECK(d->fp32_flops_per_clock_cu == 256.0 && d->matrix_flops_per_clock_cu == 4096.0);
    if (sm >= 70) CHECK(d->local_mem_bytes > 48 * 1024); /* opt-in carve-out */
    /* The context reports the same device. */
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_CUDA, 0, &ctx));
    if (!ctx) return;
    fa_device_info cinfo;
    CHECK_OK(fa_context_get_info(ctx, &cinfo));
    CHECK(strcmp(cinfo.desc.name, d->name) == 0 && strcmp(cinfo.desc.arch, d->arch) == 0);
    CHECK(cinfo.desc.compute_units == d->compute_units);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(hip_device_desc) {
    fa_device_info info;
    if (first_device(FA_BACKEND_HIP, &info) < 0) FA_SKIP("no HIP device");
    check_desc(&info, FA_BACKEND_HIP);
    const fa_device_desc *d = &info.desc;
    CHECK_MSG(d->simd_width == 32 || d->simd_width == 64, "wavefront %d", d->simd_width);
    /* AMD: "gfx90a" (no ":sramecc+" suffix); NVIDIA through the HIP-on-CUDA
     * mapping: "sm_90", vendor NVIDIA. */
    int amd = strncmp(d->arch, "gfx", 3) == 0, nvidia = strncmp(d->arch, "sm_", 3) == 0;
    CHECK_MSG((amd || nvidia) && strchr(d->arch, ':') == NULL, "arch \"%s\"", d->arch);
    CHECK_MSG(strcmp(d->vendor, nvidia ? "NVIDIA" : "AMD") == 0, "vendor \"%s\" with arch \"%s\"", d->vendor, d->arch);
}

/* A download from a thread that never touched the runtime: the backend must
 * make its context current itself. */
typedef struct thread_download {
    fa_buffer buf;
    void *dst;
    size_t bytes;
    fa_status status;
} thread_download;

static void *download_in_thread(void *arg) {
    thread_download *job = arg;
    job->status = fa_buffer_download(job->buf, 0, job->dst, job->bytes);
    return NULL;
}

/* Upload, partial upload, offset download, bounds, another thread, interop
 * handles. */
static void round_trip(fa_backend backend, uint64_t seed) {
    if (first_device(backend, NULL) < 0) return;
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(backend, 0, &ctx));
    if (!ctx) return;
    void *native_ctx = NULL, *native_queue = NULL;
    CHECK_OK(fa_context_get_native(ctx, &native_ctx, &native_queue));
    if (backend == FA_BACKEND_CUDA) CHECK(native_ctx != NULL);
    else CHECK((intptr_t)native_ctx == 0); /* device ordinal 0 */
    CHECK(native_queue != NULL);

    fa_rng rng;
    fa_rng_seed(&rng, seed);
    const int64_t n = (1 << 18) + 3; /* an odd size */
    const size_t bytes = (size_t)n * sizeof(float);
    float *src = fa_test_random_tensor(&rng, FA_DTYPE_F32, n);
    float *patch = fa_test_random_tensor(&rng, FA_DTYPE_F32, 1000);
    float *dst = malloc(bytes);
    CHECK(src && patch && dst);
    fa_buffer buf = NULL, other = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &buf));
    CHECK_OK(fa_buffer_alloc(ctx, 4096, &other));
    if (src && patch && dst && buf && other) {
        CHECK_OK(fa_buffer_upload(buf, 0, src, bytes));
        fa_test_poison(dst, FA_DTYPE_F32, n);
        CHECK_OK(fa_buffer_download(buf, 0, dst, bytes));
        CHECK(memcmp(src, dst, bytes) == 0);

        /* A patch at an unaligned offset changes exactly its bytes. */
        const size_t at = 4097 * sizeof(float) + 2;
        const size_t patch_bytes = 1000 * sizeof(float) - 1;
        CHECK_OK(fa_buffer_upload(buf, at, patch, patch_bytes));
        memcpy((char *)src + at, patch, patch_bytes);
        fa_test_poison(dst, FA_DTYPE_F32, n);
        CHECK_OK(fa_buffer_download(buf, 0, dst, bytes));
        CHECK(memcmp(src, dst, bytes) == 0);

        /* A download from an offset. */
        fa_test_poison(dst, FA_DTYPE_F32, 1000);
        CHECK_OK(fa_buffer_download(buf, 12345, dst, 777));
        CHECK(memcmp((char *)src + 12345, dst, 777) == 0);

        thread_download job = {buf, dst, bytes, FA_ERR_INTERNAL};
        fa_test_poison(dst, FA_DTYPE_F32, n);
        pthread_t thread;
        CHECK(pthread_create(&thread, NULL, download_in_thread, &job) == 0);
        CHECK(pthread_join(thread, NULL) == 0);
        CHECK_OK(job.status);
        CHECK(memcmp(src, dst, bytes) == 0);

        CHECK_STATUS(fa_buffer_upload(buf, bytes - 4, src, 8), FA_ERR_OUT_OF_BOUNDS);
        CHECK_STATUS(fa_buffer_download(buf, bytes + 1, dst, 0), FA_ERR_OUT_OF_BOUNDS);
        CHECK_OK(fa_context_synchronize(ctx));

        void *a = NULL, *b = NULL;
        CHECK_OK(fa_buffer_get_native(buf, &a));
        CHECK_OK(fa_buffer_get_native(other, &b));
        CHECK(a != NULL && b != NULL && a != b);
        size_t size = 0;
        CHECK_OK(fa_buffer_size(buf, &size));
        CHECK(size == bytes);
    }
    if (buf) CHECK_OK(fa_buffer_free(buf));
    if (other) CHECK_OK(fa_buffer_free(other));

    /* More than any device holds. */
    fa_buffer huge = NULL;
    CHECK_STATUS(fa_buffer_alloc(ctx, (size_t)1 << 60, &huge), FA_ERR_OUT_OF_MEMORY);
    CHECK(huge == NULL);
    CHECK(strlen(fa_last_error()) > 0);

    free(src);
    free(patch);
    free(dst);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(cuda_buffer_round_trip) {
    CHECK(compiled_in(FA_BACKEND_CUDA) || first_device(FA_BACKEND_CUDA, NULL) < 0);
    if (first_device(FA_BACKEND_CUDA, NULL) < 0) FA_SKIP("no CUDA device");
    round_trip(FA_BACKEND_CUDA, 0x5eed0001);
}

FA_TEST(hip_buffer_round_trip) {
    CHECK(compiled_in(FA_BACKEND_HIP) || first_device(FA_BACKEND_HIP, NULL) < 0);
    if (first_device(FA_BACKEND_HIP, NULL) < 0) FA_SKIP("no HIP device");
    round_trip(FA_BACKEND_HIP, 0x5eed0002);
}

/* Memory allocated with the vendor runtime directly, as an application
 * would, through the backend's own table. */
typedef struct test_native {
    fa_backend backend;
    void *ptr;
    size_t bytes;
#ifdef FA_WITH_CUDA
    fa_cuda_native_mem cuda;
#endif
#ifdef FA_WITH_HIP
    fa_hip_native_mem hip;
#endif
} test_native;

/* foreign: memory the context must refuse (another CUDA context on the same
 * device; for HIP another device). FA_ERR_UNSUPPORTED when there is none. */
static fa_status native_alloc(fa_context ctx, fa_backend backend, size_t bytes, int foreign,
                              test_native *n) {
    memset(n, 0, sizeof *n);
    n->backend = backend;
    n->bytes = bytes;
#ifdef FA_WITH_CUDA
    if (backend == FA_BACKEND_CUDA) {
        fa_status st = fa_cuda_native_alloc(ctx, bytes, foreign, &n->cuda);
        n->ptr = (void *)n->cuda.ptr;
        return st;
    }
#endif
#ifdef FA_WITH_HIP
    if (backend == FA_BACKEND_HIP) {
        fa_device_info info;
        fa_status st = fa_context_get_info(ctx, &info);
        if (st != FA_SUCCESS) return st;
        int device = info.index;
        if (foreign) {
            if (listed_devices(FA_BACKEND_HIP) < 2) return FA_ERR_UNSUPPORTED;
            device = info.index == 0 ? 1 : 0;
        }
        st = fa_hip_native_alloc(device, bytes, &n->hip);
        n->ptr = n->hip.ptr;
        return st;
    }
#endif
    (void)ctx;
    (void)foreign;
    return FA_ERR_UNSUPPORTED;
}

static fa_status native_write(const test_native *n, size_t offset, const void *src, size_t bytes) {
#ifdef FA_WITH_CUDA
    if (n->backend == FA_BACKEND_CUDA) return fa_cuda_native_write(&n->cuda, offset, src, bytes);
#endif
#ifdef FA_WITH_HIP
    if (n->backend == FA_BACKEND_HIP) return fa_hip_native_write(&n->hip, offset, src, bytes);
#endif
    (void)n;
    (void)offset;
    (void)src;
    (void)bytes;
    return FA_ERR_UNSUPPORTED;
}

static fa_status native_read(const test_native *n, size_t offset, void *dst, size_t bytes) {
#ifdef FA_WITH_CUDA
    if (n->backend == FA_BACKEND_CUDA) return fa_cuda_native_read(&n->cuda, offset, dst, bytes);
#endif
#ifdef FA_WITH_HIP
    if (n->backend == FA_BACKEND_HIP) return fa_hip_native_read(&n->hip, offset, dst, bytes);
#endif
    (void)n;
    (void)offset;
    (void)dst;
    (void)bytes;
    return FA_ERR_UNSUPPORTED;
}

static void native_free(test_native *n) {
#ifdef FA_WITH_CUDA
    if (n->backend == FA_BACKEND_CUDA) fa_cuda_native_free(&n->cuda);
#endif
#ifdef FA_WITH_HIP
    if (n->backend == FA_BACKEND_HIP) fa_hip_native_free(&n->hip);
#endif
    n->ptr = NULL;
}

static void wrap_native(fa_backend backend, uint64_t seed) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(backend, 0, &ctx));
    if (!ctx) return;
    fa_rng rng;
    fa_rng_seed(&rng, seed);
    const int64_t n = 16384;
    const size_t bytes = (size_t)n * sizeof(float);
    float *data = fa_test_random_tensor(&rng, FA_DTYPE_F32, n);
    float *patch = fa_test_random_tensor(&rng, FA_DTYPE_F32, 256);
    float *back = malloc(bytes);
    test_native mem;
    CHECK_OK(native_alloc(ctx, backend, bytes, 0, &mem));
    CHECK(data && patch && back && mem.ptr);
    if (!(data && patch && back && mem.ptr)) goto done;

    /* Written natively, read through the wrapped buffer: no copy between. */
    CHECK_OK(native_write(&mem, 0, data, bytes));
    fa_buffer wrapped = NULL;
    CHECK_OK(fa_buffer_wrap(ctx, mem.ptr, bytes, &wrapped));
    if (wrapped) {
        fa_test_poison(back, FA_DTYPE_F32, n);
        CHECK_OK(fa_buffer_download(wrapped, 0, back, bytes));
        CHECK(memcmp(back, data, bytes) == 0);
        void *native = NULL;
        CHECK_OK(fa_buffer_get_native(wrapped, &native));
        CHECK(native == mem.ptr);
        /* Written through the buffer, read natively. */
        CHECK_OK(fa_buffer_upload(wrapped, 1024, patch, 256 * sizeof(float)));
        memcpy((char *)data + 1024, patch, 256 * sizeof(float));
        fa_test_poison(back, FA_DTYPE_F32, n);
        CHECK_OK(native_read(&mem, 0, back, bytes));
        CHECK(memcmp(back, data, bytes) == 0);
        /* Freeing the wrapper leaves the memory to its owner. */
        CHECK_OK(fa_buffer_free(wrapped));
        fa_test_poison(back, FA_DTYPE_F32, n);
        CHECK_OK(native_read(&mem, 0, back, bytes));
        CHECK(memcmp(back, data, bytes) == 0);
    }

    /* An interior span of the allocation. */
    fa_buffer inner = NULL;
    CHECK_OK(fa_buffer_wrap(ctx, (char *)mem.ptr + 256, bytes - 256, &inner));
    if (inner) {
        fa_test_poison(back, FA_DTYPE_F32, n);
        CHECK_OK(fa_buffer_download(inner, 0, back, bytes - 256));
        CHECK(memcmp(back, (char *)data + 256, bytes - 256) == 0);
        CHECK_OK(fa_buffer_free(inner));
    }

    /* Spans running past the allocation. */
    fa_buffer bad = NULL;
    CHECK_STATUS(fa_buffer_wrap(ctx, mem.ptr, bytes + 1, &bad), FA_ERR_OUT_OF_BOUNDS);
    CHECK(bad == NULL);
    CHECK_STATUS(fa_buffer_wrap(ctx, (char *)mem.ptr + 256, bytes, &bad), FA_ERR_OUT_OF_BOUNDS);
    CHECK(bad == NULL);

    /* Host memory is not device memory. */
    CHECK_STATUS(fa_buffer_wrap(ctx, back, bytes, &bad), FA_ERR_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    CHECK(strstr(fa_last_error(), "native") != NULL);

    /* A buffer's own allocation, wrapped again, is the same memory. */
    fa_buffer own = NULL, alias = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &own));
    if (own) {
        void *p = NULL;
        CHECK_OK(fa_buffer_get_native(own, &p));
        CHECK_OK(fa_buffer_wrap(ctx, p, bytes, &alias));
        if (alias) {
            CHECK_OK(fa_buffer_upload(alias, 0, data, bytes));
            fa_test_poison(back, FA_DTYPE_F32, n);
            CHECK_OK(fa_buffer_download(own, 0, back, bytes));
            CHECK(memcmp(back, data, bytes) == 0);
            CHECK_OK(fa_buffer_free(alias));
        }
        CHECK_OK(fa_buffer_free(own));
    }

    /* Memory of another context (or device) is refused. */
    test_native foreign;
    fa_status fst = native_alloc(ctx, backend, bytes, 1, &foreign);
    CHECK_MSG(fst == FA_SUCCESS || fst == FA_ERR_UNSUPPORTED, "foreign allocation: %s (%s)",
              fa_status_string(fst), fa_last_error());
    if (fst == FA_SUCCESS) {
        CHECK_STATUS(fa_buffer_wrap(ctx, foreign.ptr, bytes, &bad), FA_ERR_FOREIGN_BUFFER);
        CHECK(bad == NULL);
        native_free(&foreign);
    } else {
        printf("  no foreign memory to test with\n");
    }

done:
    if (mem.ptr) native_free(&mem);
    free(data);
    free(patch);
    free(back);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(cuda_wrap_native) {
    CHECK(compiled_in(FA_BACKEND_CUDA) || first_device(FA_BACKEND_CUDA, NULL) < 0);
    if (first_device(FA_BACKEND_CUDA, NULL) < 0) FA_SKIP("no CUDA device");
    wrap_native(FA_BACKEND_CUDA, 0x5eed0003);
}

FA_TEST(hip_wrap_native) {
    CHECK(compiled_in(FA_BACKEND_HIP) || first_device(FA_BACKEND_HIP, NULL) < 0);
    if (first_device(FA_BACKEND_HIP, NULL) < 0) FA_SKIP("no HIP device");
    wrap_native(FA_BACKEND_HIP, 0x5eed0004);
}

FA_TEST_MAIN(FA_CASE(cuda_status_is_clear), FA_CASE(hip_status_is_clear),
             FA_CASE(missing_runtime_is_unavailable), FA_CASE(nvrtc_probe_is_clear),
             FA_CASE(cuda_device_desc), FA_CASE(hip_device_desc), FA_CASE(cuda_buffer_round_trip),
             FA_CASE(hip_buffer_round_trip), FA_CASE(cuda_wrap_native), FA_CASE(hip_wrap_native))
