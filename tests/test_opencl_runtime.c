/* The OpenCL backend's runtime half: enumeration and device description,
 * the bandwidth probe and its cache, buffers (own and wrapped), program
 * builds through the kernel cache, launches and event timing.
 *
 * fa-test-labels: device
 *
 * Every case skips (never passes) where no OpenCL device is present. */
#include "harness.h"
#include "test_util.h"

#include "flashattn.h"

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_runtime_internal.h"
#include "dtype.h"
#include "plan.h"
#include "ptx_patch.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Scaffolding                                                              */

static char cache_dir[64];
static char skip_reason[600];

/* Every case runs against a kernel cache of its own, made before the first
 * library call, so entries found there were written by this process. */
static int use_fresh_cache(void) {
    if (cache_dir[0]) return 1;
    const char *dir = fa_test_own_cache();
    CHECK_MSG(dir != NULL, "no kernel cache of this process's own: %s", strerror(errno));
    if (!dir) return 0;
    snprintf(cache_dir, sizeof cache_dir, "%s", dir);
    unsetenv("FLASHATTN_NO_BANDWIDTH_PROBE");
    return 1;
}

/* 1 when the OpenCL backend has a device; otherwise the reason is left in
 * skip_reason. */
static int opencl_present(void) {
    if (!use_fresh_cache()) {
        snprintf(skip_reason, sizeof skip_reason, "no scratch cache directory");
        return 0;
    }
    char reason[512] = "";
    if (fa_backend_get_status(FA_BACKEND_OPENCL, reason, sizeof reason) != FA_SUCCESS) {
        snprintf(skip_reason, sizeof skip_reason, "OpenCL unavailable: %s", reason);
        return 0;
    }
    return 1;
}

#define REQUIRE_OPENCL()                                                                       \
    do {                                                                                       \
        if (!opencl_present()) FA_SKIP(skip_reason);                                           \
    } while (0)

static fa_cl_context *cl_of(fa_context ctx) { return (fa_cl_context *)ctx->impl; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Names of the cache entries starting with prefix; returns how many. */
static int list_entries(const char *prefix, char names[][256], int max) {
    int n = 0;
    DIR *d = opendir(cache_dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !strstr(e->d_name, ".bin")) continue;
        if (strstr(e->d_name, ".tmp")) continue;
        if (n < max) snprintf(names[n], 256, "%s", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* The entry of names_after missing from names_before, or NULL. */
static const char *new_entry(char before[][256], int nb, char after[][256], int na) {
    for (int i = 0; i < na; i++) {
        int seen = 0;
        for (int j = 0; j < nb; j++) seen |= strcmp(after[i], before[j]) == 0;
        if (!seen) return after[i];
    }
    return NULL;
}

/* Starts as fa_cl_build starts each file, so every driver the test runs on
 * shows it accepts the #line (PoCL names the file in its log; NVIDIA ignores
 * the directive). */
static const char axpb_template[] =
    "#line 1 \"kernels_cl/axpb_test.cl\"\n"
    "#define SALT %lluUL\n"
    "__kernel void axpb(__global const float *x, __global float *y, float a, float b, uint n) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) y[i] = a * x[i] + b + (float)(SALT & 0u);\n"
    "}\n";

/* Runs axpb on n fresh random inputs and checks every output; returns the
 * kernel's device time in ms (negative when the event gave none). */
static double run_axpb(fa_context ctx, cl_program program, fa_rng *rng, unsigned n) {
    fa_cl_context *cl = cl_of(ctx);
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = fa_cl.clCreateKernel(program, "axpb", &err);
    CHECK_MSG(err == CL_SUCCESS && kernel, "clCreateKernel(axpb) = %d", (int)err);
    if (err != CL_SUCCESS) return -1.0;
    float *x = fa_test_random_tensor(rng, FA_DTYPE_F32, n);
    float *y = malloc(n * sizeof *y);
    fa_buffer bx = NULL, by = NULL;
    double ms = -1.0;
    CHECK_OK(fa_buffer_alloc(ctx, n * sizeof(float), &bx));
    CHECK_OK(fa_buffer_alloc(ctx, n * sizeof(float), &by));
    if (x && y && bx && by) {
        fa_test_poison(y, FA_DTYPE_F32, n);
        CHECK_OK(fa_buffer_upload(by, 0, y, n * sizeof(float)));
        CHECK_OK(fa_buffer_upload(bx, 0, x, n * sizeof(float)));
        float a = (float)fa_rng_uniform(rng, 0.5, 2.0), b = (float)fa_rng_uniform(rng, -1.0, 1.0);
        cl_mem mx = fa_buffer_get_native(bx, (void **)&mx) == FA_SUCCESS ? mx : NULL;
        cl_mem my = fa_buffer_get_native(by, (void **)&my) == FA_SUCCESS ? my : NULL;
        cl_uint cn = n;
        err = fa_cl.clSetKernelArg(kernel, 0, sizeof mx, &mx);
        err |= fa_cl.clSetKernelArg(kernel, 1, sizeof my, &my);
        err |= fa_cl.clSetKernelArg(kernel, 2, sizeof a, &a);
        err |= fa_cl.clSetKernelArg(kernel, 3, sizeof b, &b);
        err |= fa_cl.clSetKernelArg(kernel, 4, sizeof cn, &cn);
        CHECK(err == CL_SUCCESS);
        size_t local = 64, global = ((size_t)n + local - 1) / local * local;
        cl_event ev = NULL;
        CHECK_OK(fa_cl_launch(cl, kernel, 1, &global, &local, &ev));
        CHECK(ev != NULL);
        if (ev) {
            ms = fa_cl_event_ms(ev);
            fa_cl.clReleaseEvent(ev);
        }
        CHECK_OK(fa_buffer_download(by, 0, y, n * sizeof(float)));
        unsigned bad = 0;
        for (unsigned i = 0; i < n; i++) {
            float want = a * x[i] + b;
            if (!(fabsf(y[i] - want) <= 1e-5f * (1.0f + fabsf(want)))) bad++;
        }
        CHECK_MSG(bad == 0, "%u of %u outputs of axpb are wrong", bad, n);
    }
    if (bx) fa_buffer_free(bx);
    if (by) fa_buffer_free(by);
    fa_cl.clReleaseKernel(kernel);
    free(x);
    free(y);
    return ms;
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */

FA_TEST(enumerates_every_device) {
    REQUIRE_OPENCL();
    /* An independent count through the loader the backend opened. */
    cl_uint nplat = 0;
    int direct = 0;
    CHECK(fa_cl.clGetPlatformIDs(0, NULL, &nplat) == CL_SUCCESS);
    cl_platform_id plats[16];
    if (nplat > 16) nplat = 16;
    CHECK(fa_cl.clGetPlatformIDs(nplat, plats, NULL) == CL_SUCCESS);
    for (cl_uint p = 0; p < nplat; p++) {
        cl_uint nd = 0;
        if (fa_cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) == CL_SUCCESS) direct += (int)nd;
    }
    CHECK(direct > 0);
    CHECK(fa_cl_device_count() == direct);

    int count = 0, seen = 0;
    CHECK_OK(fa_device_count(&count));
    for (int g = 0; g < count; g++) {
        fa_device_info info;
        CHECK_OK(fa_device_get_info(g, &info));
        if (info.backend != FA_BACKEND_OPENCL) continue;
        const fa_device_desc *d = &info.desc;
        CHECK(info.index == seen);
        seen++;
        printf("opencl %d: name \"%s\" vendor \"%s\" driver \"%s\" arch \"%s\" type %d\n"
               "  local_mem %zu, max_wg %d, simd %d, CUs %d, clock %d MHz, global_mem %zu,\n"
               "  fp32 flops/clk/CU %.0f, matrix %.0f, bandwidth %.1f GB/s (measured %d)\n",
               info.index, d->name, d->vendor, info.driver_version, d->arch, (int)d->type, d->local_mem_bytes,
               d->max_work_group_size, d->simd_width, d->compute_units, d->clock_mhz, d->global_mem_bytes,
               d->fp32_flops_per_clock_cu, d->matrix_flops_per_clock_cu, d->bandwidth_gbs,
               d->bandwidth_measured);
        CHECK(d->backend == FA_BACKEND_OPENCL);
        CHECK(d->name[0] != '\0' && d->name[0] != ' ');
        CHECK(d->vendor[0] != '\0');
        CHECK(info.driver_version[0] != '\0');
        CHECK(d->type == FA_DEVICE_CPU || d->type == FA_DEVICE_GPU || d->type == FA_DEVICE_ACCELERATOR);
        CHECK(d->local_mem_bytes > 0);
        CHECK(d->max_work_group_size > 0);
        CHECK(d->simd_width > 0 && d->simd_width <= 128);
        CHECK(d->compute_units > 0);
        CHECK(d->clock_mhz > 0);
        CHECK(d->global_mem_bytes > 0);
        CHECK(d->fp32_flops_per_clock_cu >= 2.0);
        /* Matrix units where the vendor layer found them (NVIDIA sm_80 and
         * later, Intel's and AMD's matrix extensions), described whole;
         * none on a CPU. */
        CHECK((d->matrix_flops_per_clock_cu > 0.0) == (d->matrix_m > 0));
        if (d->type == FA_DEVICE_CPU) CHECK(d->matrix_flops_per_clock_cu == 0.0 && d->matrix_m == 0);
        CHECK(d->bandwidth_gbs > 0.0 && isfinite(d->bandwidth_gbs));
        if (d->type == FA_DEVICE_CPU) CHECK(d->fp32_flops_per_clock_cu == 4.0 * d->simd_width);

        /* The description agrees with what the driver says right now. */
        const fa_cl_device *dev = fa_cl_device_get(info.index);
        CHECK(dev != NULL);
        if (!dev) continue;
        cl_ulong local = 0;
        cl_uint cus = 0;
        char name[256] = "";
        CHECK(fa_cl.clGetDeviceInfo(dev->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL) == CL_SUCCESS);
        CHECK(fa_cl.clGetDeviceInfo(dev->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL) == CL_SUCCESS);
        CHECK(fa_cl.clGetDeviceInfo(dev->device, CL_DEVICE_NAME, sizeof name - 1, name, NULL) == CL_SUCCESS);
        CHECK(d->local_mem_bytes == (size_t)local);
        CHECK(d->compute_units == (int)cus);
        CHECK(strstr(name, d->name) != NULL);
    }
    CHECK(seen == direct);
    CHECK_STATUS(fa_cl_device_info(direct, &(fa_device_info){0}), FA_ERR_DEVICE_NOT_FOUND);
}

FA_TEST(bandwidth_measured_then_cached) {
    REQUIRE_OPENCL();
    fa_context probe = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &probe));
    if (!probe) return;
    int index = cl_of(probe)->index;
    CHECK_OK(fa_context_destroy(probe));

    /* Back to the state of a process that has not measured yet, on a cache
     * that has no figure for the device. */
    fa_cl_bandwidth_forget(index);
    fa_device_info before;
    CHECK_OK(fa_cl_device_info(index, &before));
    CHECK(before.desc.bandwidth_measured == 0);
    CHECK(before.desc.bandwidth_gbs > 0.0);
    char names[8][256];
    int entries0 = list_entries("opencl_bandwidth-", names, 8);
    for (int i = 0; i < entries0; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%.255s", cache_dir, names[i]);
        CHECK(unlink(path) == 0);
    }
    int runs0 = fa_cl_bandwidth_probe_count();

    /* Probe switched off: the estimate stays, marked as not measured. */
    CHECK(setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1) == 0);
    fa_context a = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, index, &a));
    unsetenv("FLASHATTN_NO_BANDWIDTH_PROBE");
    if (!a) return;
    fa_device_info ia;
    CHECK_OK(fa_context_get_info(a, &ia));
    CHECK(ia.desc.bandwidth_measured == 0);
    CHECK(ia.desc.bandwidth_gbs == before.desc.bandwidth_gbs);
    CHECK(fa_cl_bandwidth_probe_count() == runs0);
    CHECK(list_entries("opencl_bandwidth-", names, 8) == 0);

    /* The probe proper: measures once and leaves the figure on disk. */
    double t0 = now_ms();
    fa_cl_bandwidth_ensure(cl_of(a));
    double measure_ms = now_ms() - t0;
    CHECK(fa_cl_bandwidth_probe_count() == runs0 + 1);
    CHECK(list_entries("opencl_bandwidth-", names, 8) == 1);
    fa_device_info measured;
    CHECK_OK(fa_cl_device_info(index, &measured));
    CHECK(measured.desc.bandwidth_measured == 1);
    CHECK(measured.desc.bandwidth_gbs > 0.0 && isfinite(measured.desc.bandwidth_gbs));
    CHECK(measured.desc.bandwidth_gbs != before.desc.bandwidth_gbs);

    /* A context created now reports it. */
    fa_context b = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, index, &b));
    if (b) {
        fa_device_info ib;
        CHECK_OK(fa_context_get_info(b, &ib));
        CHECK(ib.desc.bandwidth_measured == 1 && ib.desc.bandwidth_gbs == measured.desc.bandwidth_gbs);
        CHECK_OK(fa_context_destroy(b));
    }

    /* A new process (simulated): the figure comes from the disk cache, bit
     * for bit, quickly and without measuring again... */
    fa_cl_bandwidth_forget(index);
    t0 = now_ms();
    fa_cl_bandwidth_ensure(cl_of(a));
    double cached_ms = now_ms() - t0;
    fa_device_info again;
    CHECK_OK(fa_cl_device_info(index, &again));
    CHECK(again.desc.bandwidth_measured == 1);
    CHECK(memcmp(&again.desc.bandwidth_gbs, &measured.desc.bandwidth_gbs, sizeof(double)) == 0);
    CHECK(fa_cl_bandwidth_probe_count() == runs0 + 1);
    CHECK_MSG(cached_ms < measure_ms && cached_ms < 50.0, "reading the figure took %.2f ms, measuring it %.2f ms",
              cached_ms, measure_ms);
    printf("bandwidth %.2f GB/s: %.2f ms to measure, %.3f ms to read from the cache\n",
           measured.desc.bandwidth_gbs, measure_ms, cached_ms);
    CHECK_OK(fa_context_destroy(a));

    /* ... and so does the public path: a context of a fresh process. */
    fa_cl_bandwidth_forget(index);
    fa_context c = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, index, &c));
    if (!c) return;
    fa_device_info ic;
    CHECK_OK(fa_context_get_info(c, &ic));
    CHECK(ic.desc.bandwidth_measured == 1);
    CHECK(memcmp(&ic.desc.bandwidth_gbs, &measured.desc.bandwidth_gbs, sizeof(double)) == 0);
    CHECK(fa_cl_bandwidth_probe_count() == runs0 + 1);
    CHECK_OK(fa_context_destroy(c));
}

/* ------------------------------------------------------------------------ */
/* Contexts and buffers                                                     */

FA_TEST(context_native_and_sync) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, 0, &ctx));
    if (!ctx) return;
    void *nc = NULL, *nq = NULL;
    CHECK_OK(fa_context_get_native(ctx, &nc, &nq));
    CHECK(nc != NULL && nq != NULL);
    fa_cl_context *cl = cl_of(ctx);
    CHECK(nc == (void *)cl->context && nq == (void *)cl->queue);
    /* The native queue runs work on the native context's memory and times
     * it (profiling is on). */
    cl_int err = CL_SUCCESS;
    cl_mem mem = fa_cl.clCreateBuffer((cl_context)nc, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
    CHECK(err == CL_SUCCESS && mem);
    if (mem) {
        const float pattern = 0.25f;
        cl_event ev = NULL;
        CHECK(fa_cl.clEnqueueFillBuffer((cl_command_queue)nq, mem, &pattern, sizeof pattern, 0, 1 << 20, 0, NULL,
                                        &ev) == CL_SUCCESS);
        CHECK_OK(fa_context_synchronize(ctx));
        if (ev) {
            CHECK(fa_cl_event_ms(ev) >= 0.0);
            fa_cl.clReleaseEvent(ev);
        }
        float back[4] = {0};
        CHECK(fa_cl.clEnqueueReadBuffer((cl_command_queue)nq, mem, CL_TRUE, 4096, sizeof back, back, 0, NULL, NULL) ==
              CL_SUCCESS);
        CHECK(back[0] == pattern && back[3] == pattern);
        fa_cl.clReleaseMemObject(mem);
    }
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    CHECK(info.backend == FA_BACKEND_OPENCL && info.index == 0);
    CHECK(strcmp(info.desc.name, cl->info.desc.name) == 0);
    CHECK_STATUS(fa_context_create(FA_BACKEND_OPENCL, fa_cl_device_count(), &(fa_context){0}),
                 FA_ERR_DEVICE_NOT_FOUND);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(buffer_round_trip_unaligned) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ 0x5eedu);
    const size_t size = 1000003; /* odd, prime */
    unsigned char *mirror = malloc(size), *back = malloc(size);
    fa_buffer buf = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, size, &buf));
    if (mirror && back && buf) {
        size_t got = 0;
        CHECK_OK(fa_buffer_size(buf, &got));
        CHECK(got == size);
        for (size_t i = 0; i < size; i++) mirror[i] = (unsigned char)fa_rng_next(&rng);
        CHECK_OK(fa_buffer_upload(buf, 0, mirror, size));
        /* Pieces at odd offsets and lengths, including the very last byte. */
        for (int piece = 0; piece < 40; piece++) {
            size_t off = (size_t)(fa_rng_next(&rng) % size);
            size_t len = 1 + (size_t)(fa_rng_next(&rng) % 9973);
            if (len > size - off) len = size - off;
            unsigned char chunk[9973];
            for (size_t i = 0; i < len; i++) chunk[i] = (unsigned char)fa_rng_next(&rng);
            memcpy(mirror + off, chunk, len);
            CHECK_OK(fa_buffer_upload(buf, off, chunk, len));
        }
        unsigned char last = 0xa5;
        mirror[size - 1] = last;
        CHECK_OK(fa_buffer_upload(buf, size - 1, &last, 1));
        memset(back, 0, size);
        CHECK_OK(fa_buffer_download(buf, 0, back, size));
        CHECK(memcmp(mirror, back, size) == 0);
        for (int piece = 0; piece < 20; piece++) {
            size_t off = (size_t)(fa_rng_next(&rng) % size);
            size_t len = 1 + (size_t)(fa_rng_next(&rng) % 4099);
            if (len > size - off) len = size - off;
            memset(back, 0, len);
            CHECK_OK(fa_buffer_download(buf, off, back, len));
            CHECK_MSG(memcmp(mirror + off, back, len) == 0, "download of %zu bytes at %zu differs", len, off);
        }
    }
    if (buf) CHECK_OK(fa_buffer_free(buf));
    free(mirror);
    free(back);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(buffer_bounds_and_sizes) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_buffer buf = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, 1000, &buf));
    unsigned char data[64];
    memset(data, 0x3c, sizeof data);
    if (buf) {
        CHECK_STATUS(fa_buffer_upload(buf, 990, data, 11), FA_ERR_OUT_OF_BOUNDS);
        CHECK_STATUS(fa_buffer_upload(buf, 1001, data, 0), FA_ERR_OUT_OF_BOUNDS);
        CHECK_STATUS(fa_buffer_download(buf, SIZE_MAX - 4, data, 8), FA_ERR_OUT_OF_BOUNDS);
        CHECK_OK(fa_buffer_upload(buf, 990, data, 10));
        /* The backend refuses on its own too, whoever calls it. */
        const fa_backend_ops *ops = &fa_opencl_backend;
        CHECK_STATUS(ops->buffer_upload(ctx->impl, buf->impl, 999, data, 2), FA_ERR_OUT_OF_BOUNDS);
        CHECK_STATUS(ops->buffer_download(ctx->impl, buf->impl, SIZE_MAX, data, 2), FA_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(fa_last_error(), "past the end") != NULL);
        CHECK_STATUS(ops->buffer_alloc(ctx->impl, 0, &(void *){NULL}), FA_ERR_INVALID_SIZE);
        CHECK_OK(fa_buffer_free(buf));
    }
    const fa_cl_device *dev = fa_cl_device_get(cl_of(ctx)->index);
    CHECK(dev != NULL);
    if (dev) {
        size_t too_big = (size_t)dev->max_alloc_bytes + 4096;
        fa_buffer big = NULL;
        CHECK_STATUS(fa_buffer_alloc(ctx, too_big, &big), FA_ERR_OUT_OF_MEMORY);
        char want[32];
        snprintf(want, sizeof want, "%zu", too_big);
        CHECK_MSG(strstr(fa_last_error(), want) != NULL, "message \"%s\" does not name %s", fa_last_error(), want);
        CHECK(big == NULL);
    }
    CHECK_OK(fa_context_destroy(ctx));
}

static cl_uint ref_count(cl_mem mem) {
    cl_uint n = 0;
    if (fa_cl.clGetMemObjectInfo(mem, CL_MEM_REFERENCE_COUNT, sizeof n, &n, NULL) != CL_SUCCESS) return 0;
    return n;
}

FA_TEST(wrap_native_buffer) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    void *nc = NULL, *nq = NULL;
    CHECK_OK(fa_context_get_native(ctx, &nc, &nq));
    cl_int err = CL_SUCCESS;
    const size_t size = 4096;
    cl_mem mem = fa_cl.clCreateBuffer((cl_context)nc, CL_MEM_READ_WRITE, size, NULL, &err);
    CHECK(err == CL_SUCCESS && mem);
    if (!mem) {
        fa_context_destroy(ctx);
        return;
    }
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ 0xc1u);
    unsigned char in[4096], out[4096];
    for (size_t i = 0; i < size; i++) in[i] = (unsigned char)fa_rng_next(&rng);

    fa_buffer wrapped = NULL;
    CHECK_STATUS(fa_buffer_wrap(ctx, mem, size + 1, &wrapped), FA_ERR_OUT_OF_BOUNDS);
    CHECK(wrapped == NULL);
    CHECK_OK(fa_buffer_wrap(ctx, mem, size - 96, &wrapped));
    CHECK(ref_count(mem) == 2);
    if (wrapped) {
        void *native = NULL;
        CHECK_OK(fa_buffer_get_native(wrapped, &native));
        CHECK(native == (void *)mem);
        CHECK_OK(fa_buffer_upload(wrapped, 7, in, size - 103));
        CHECK_STATUS(fa_buffer_upload(wrapped, 8, in, size - 103), FA_ERR_OUT_OF_BOUNDS);
        memset(out, 0, sizeof out);
        CHECK_OK(fa_buffer_download(wrapped, 7, out, size - 103));
        CHECK(memcmp(in, out, size - 103) == 0);
        CHECK_OK(fa_buffer_free(wrapped));
    }
    /* Still ours after fa_buffer_free, with the data written through the
     * wrapper. */
    CHECK(ref_count(mem) == 1);
    memset(out, 0, sizeof out);
    CHECK(fa_cl.clEnqueueReadBuffer((cl_command_queue)nq, mem, CL_TRUE, 7, size - 103, out, 0, NULL, NULL) ==
          CL_SUCCESS);
    CHECK(memcmp(in, out, size - 103) == 0);

    /* A cl_mem of another cl_context on the same device is foreign. */
    cl_device_id device = cl_of(ctx)->device;
    cl_context other = fa_cl.clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(err == CL_SUCCESS && other);
    if (other) {
        cl_mem alien = fa_cl.clCreateBuffer(other, CL_MEM_READ_WRITE, size, NULL, &err);
        CHECK(err == CL_SUCCESS && alien);
        if (alien) {
            CHECK_STATUS(fa_buffer_wrap(ctx, alien, size, &wrapped), FA_ERR_FOREIGN_BUFFER);
            CHECK(ref_count(alien) == 1);
            fa_cl.clReleaseMemObject(alien);
        }
        fa_cl.clReleaseContext(other);
    }
    /* So is one of another flashattn context (each has its own cl_context). */
    fa_context ctx2 = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, cl_of(ctx)->index, &ctx2));
    if (ctx2) {
        CHECK_STATUS(fa_buffer_wrap(ctx2, mem, size, &wrapped), FA_ERR_FOREIGN_BUFFER);
        CHECK_OK(fa_context_destroy(ctx2));
    }
    CHECK(ref_count(mem) == 1);
    fa_cl.clReleaseMemObject(mem);
    CHECK_OK(fa_context_destroy(ctx));
}

/* ------------------------------------------------------------------------ */
/* Builds                                                                   */

FA_TEST(broken_source_reports_log) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    static const char broken[] =
        "__kernel void broken(__global float *y) {\n"
        "    y[get_global_id(0)] = undeclared_symbol_q7 * 2.0f;\n"
        "}\n";
    char names0[32][256];
    int entries = list_entries("opencl-", names0, 32);
    cl_program program = (cl_program)(uintptr_t)1;
    fa_cl_origin origin = FA_CL_LOADED_FROM_CACHE;
    CHECK_STATUS(fa_cl_build_text(cl_of(ctx), broken, sizeof broken - 1, "-DX=1", 1, &program, &origin),
                 FA_ERR_COMPILE);
    CHECK(program == NULL);
    /* The identifier appears only in the compiler's diagnostics. */
    CHECK_MSG(strstr(fa_last_error(), "undeclared_symbol_q7") != NULL, "no compiler log in \"%s\"", fa_last_error());
    CHECK(strstr(fa_last_error(), "-cl-std=CL1.2") != NULL);
    char names[32][256];
    CHECK(list_entries("opencl-", names, 32) == entries);

    const char *paths[] = {"kernels_cl/no_such_file_here.cl"};
    CHECK_STATUS(fa_cl_build(cl_of(ctx), paths, 1, "", &program), FA_ERR_INTERNAL);
    CHECK(strstr(fa_last_error(), "kernels_cl/no_such_file_here.cl") != NULL);
    CHECK_OK(fa_context_destroy(ctx));
}

/* The GPU flavour of the streaming kernels (FA_GPU, kernels_cl/common.h:
 * whole and partial unrolling, loads after the barrier) runs only where the
 * device is a GPU. Here it is at least compiled, on whatever OpenCL device
 * the test has, with every option on, in the tile shapes NVIDIA's OpenCL
 * plans (bench/results/h200.md). The inline-PTX float add (FA_NV_PTX)
 * needs NVIDIA's compiler; the compare-and-swap dQ stands in for it. */
FA_TEST(stream_gpu_flavour_builds) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    static const char *const fwd[] = {"kernels_cl/common.h", "kernels_cl/fwd.cl"};
    static const char *const bwd[] = {"kernels_cl/common.h", "kernels_cl/bwd_common.cl", "kernels_cl/bwd.cl"};
    static const struct {
        const char *const *paths;
        int count;
        const char *options;
    } builds[] = {
        {fwd, 2, "-DBR=128 -DBC=64 -DTR=8 -DTC=4 -DHEAD_DIM=128 -DDTYPE_F32"},
        {fwd, 2, "-DBR=128 -DBC=64 -DTR=8 -DTC=4 -DHEAD_DIM=128 -DDTYPE_BF16"},
        {bwd, 3, "-DBR=128 -DBC=64 -DTR=8 -DTC=4 -DHEAD_DIM=128 -DDTYPE_F32 -DDQ_ATOMIC"},
        {bwd, 3, "-DBR=64 -DBC=128 -DTR=4 -DTC=8 -DHEAD_DIM=64 -DDTYPE_F16"},
    };
    for (size_t i = 0; i < sizeof builds / sizeof builds[0]; i++) {
        char options[512];
        snprintf(options, sizeof options,
                 "%s -DFA_STREAM -DFA_GPU -DCAUSAL -DWINDOW -DBLOCK_MASK -DDROPOUT -DVARLEN", builds[i].options);
        cl_program program = NULL;
        const fa_status st = fa_cl_build(cl_of(ctx), builds[i].paths, builds[i].count, options, &program);
        CHECK_MSG(st == FA_SUCCESS, "%s %s: %s", builds[i].paths[builds[i].count - 1], options, fa_last_error());
        if (program) fa_cl.clReleaseProgram(program);
    }
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(build_cache_hit_corrupt_and_stale) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_cl_context *cl = cl_of(ctx);
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ (uint64_t)getpid());
    /* A salt no earlier run has built, so the first build must compile. */
    char source[1024];
    int len = snprintf(source, sizeof source, axpb_template, (unsigned long long)(fa_rng_next(&rng) >> 1));
    const char *options = "-DFA_TEST_OPTION=3";

    char before[32][256], after[32][256];
    int nb = list_entries("opencl-", before, 32);
    cl_program p = NULL;
    fa_cl_origin origin = FA_CL_LOADED_FROM_CACHE;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
    CHECK(origin == FA_CL_BUILT_FROM_SOURCE);
    int na = list_entries("opencl-", after, 32);
    CHECK(na == nb + 1);
    const char *entry = new_entry(before, nb, after, na);
    CHECK(entry != NULL);
    if (p) {
        CHECK(run_axpb(ctx, p, &rng, 1000) >= 0.0);
        fa_cl.clReleaseProgram(p);
    }

    /* Second build: from the cache, and it runs. */
    p = NULL;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
    CHECK(origin == FA_CL_LOADED_FROM_CACHE);
    if (p) {
        CHECK(run_axpb(ctx, p, &rng, 777) >= 0.0);
        fa_cl.clReleaseProgram(p);
    }
    /* Different options are a different entry. */
    p = NULL;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, "-DFA_TEST_OPTION=4", 1, &p, &origin));
    CHECK(origin == FA_CL_BUILT_FROM_SOURCE);
    if (p) fa_cl.clReleaseProgram(p);

    /* Corrupt the entry's payload: the build goes back to source and works. */
    if (entry) {
        char path[400];
        snprintf(path, sizeof path, "%s/%.255s", cache_dir, entry);
        FILE *f = fopen(path, "r+b");
        CHECK(f != NULL);
        if (f) {
            CHECK(fseek(f, -16, SEEK_END) == 0);
            unsigned char junk[8];
            for (int i = 0; i < 8; i++) junk[i] = (unsigned char)(fa_rng_next(&rng) | 1u);
            unsigned char orig[8];
            CHECK(fread(orig, 1, 8, f) == 8);
            for (int i = 0; i < 8; i++) junk[i] ^= orig[i];
            CHECK(fseek(f, -16, SEEK_END) == 0);
            CHECK(fwrite(junk, 1, 8, f) == 8);
            fclose(f);
        }
        p = NULL;
        CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
        CHECK(origin == FA_CL_BUILT_FROM_SOURCE);
        if (p) {
            CHECK(run_axpb(ctx, p, &rng, 4096) >= 0.0);
            fa_cl.clReleaseProgram(p);
        }
        p = NULL;
        CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
        CHECK(origin == FA_CL_LOADED_FROM_CACHE);
        if (p) fa_cl.clReleaseProgram(p);
    }

    /* A well-formed entry whose binary the driver rejects (as after a driver
     * update that kept the version string): rebuilt from source. */
    char *full = fa_cl_full_options(options);
    CHECK(full != NULL);
    if (full) {
        fa_kcache_key key;
        fa_cl_program_key(cl, source, (size_t)len, full, &key);
        unsigned char garbage[256];
        for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (unsigned char)fa_rng_next(&rng);
        CHECK_OK(fa_kcache_store(&key, garbage, sizeof garbage));
        void *data = NULL;
        size_t size = 0;
        CHECK_OK(fa_kcache_load(&key, &data, &size));
        CHECK(size == sizeof garbage && data && memcmp(data, garbage, size) == 0);
        free(data);
        free(full);
        p = NULL;
        CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
        CHECK(origin == FA_CL_BUILT_FROM_SOURCE);
        if (p) {
            CHECK(run_axpb(ctx, p, &rng, 333) >= 0.0);
            fa_cl.clReleaseProgram(p);
        }
        /* ... and the good binary replaced the rejected one. */
        p = NULL;
        CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 1, &p, &origin));
        CHECK(origin == FA_CL_LOADED_FROM_CACHE);
        if (p) fa_cl.clReleaseProgram(p);
    }

    /* use_cache = 0 neither reads nor writes entries. */
    nb = list_entries("opencl-", before, 32);
    p = NULL;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, options, 0, &p, &origin));
    CHECK(origin == FA_CL_BUILT_FROM_SOURCE);
    if (p) fa_cl.clReleaseProgram(p);
    CHECK(list_entries("opencl-", after, 32) == nb);
    CHECK_OK(fa_context_destroy(ctx));
}

FA_TEST(launch_and_timing) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_cl_context *cl = cl_of(ctx);
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ 0x7a11u);
    char source[1024];
    int len = snprintf(source, sizeof source, axpb_template, 42ull);
    cl_program p = NULL;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, "", 1, &p, NULL));
    if (!p) {
        fa_context_destroy(ctx);
        return;
    }
    double ms = run_axpb(ctx, p, &rng, 1u << 18);
    CHECK_MSG(ms > 0.0, "kernel time %g ms", ms);
    printf("axpb over 2^18 floats: %.4f ms\n", ms);

    cl_int err = CL_SUCCESS;
    cl_kernel k = fa_cl.clCreateKernel(p, "axpb", &err);
    CHECK(err == CL_SUCCESS);
    if (k) {
        /* No arguments set: the driver refuses, and the code is named. */
        size_t global = 64, local = 64;
        cl_event ev = (cl_event)(uintptr_t)1;
        CHECK_STATUS(fa_cl_launch(cl, k, 1, &global, &local, &ev), FA_ERR_LAUNCH);
        CHECK(ev == NULL);
        CHECK_MSG(strstr(fa_last_error(), "CL_INVALID_KERNEL_ARGS (-52)") != NULL, "message: %s", fa_last_error());
        /* Sizes the caller failed to round are its bug, caught before the
         * driver. */
        size_t odd = 100;
        CHECK_STATUS(fa_cl_launch(cl, k, 1, &odd, &local, NULL), FA_ERR_INTERNAL);
        CHECK_STATUS(fa_cl_launch(cl, k, 4, &global, NULL, NULL), FA_ERR_INTERNAL);
        fa_cl.clReleaseKernel(k);
    }
    CHECK(fa_cl_event_ms(NULL) < 0.0);
    fa_cl.clReleaseProgram(p);
    CHECK_OK(fa_context_destroy(ctx));
}

/* FLASHATTN_OPENCL_RECORD (cl_record.c): a fused forward's launch lands
 * in launch-000 with its kernel name, one line an argument (as many as
 * the kernel has), q's contents as its first buffer and the program's
 * binary; only the kernel the filter names, only as many as the cap. The
 * variables are set before this process's first launch, as the record
 * reads them once. */
FA_TEST(launch_recorded) {
    REQUIRE_OPENCL();
    char dir[] = "/tmp/fa-record-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("FLASHATTN_OPENCL_RECORD", dir, 1);
    setenv("FLASHATTN_OPENCL_RECORD_KERNEL", "fa_forward", 1);
    setenv("FLASHATTN_OPENCL_RECORD_MAX", "1", 1);
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 64;
    d.heads_q = d.heads_kv = 2;
    d.head_dim = 32;
    const size_t n = 64 * 2 * 32, bytes = n * sizeof(float);
    fa_rng rng;
    fa_rng_seed(&rng, 20261127);
    float *host = fa_test_random_tensor(&rng, FA_DTYPE_F32, (int64_t)n);
    fa_plan plan = NULL;
    fa_buffer q = NULL, k = NULL, v = NULL, o = NULL, lse = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &q));
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &k));
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &v));
    CHECK_OK(fa_buffer_alloc(ctx, bytes, &o));
    CHECK_OK(fa_buffer_alloc(ctx, 64 * 2 * sizeof(float), &lse));
    if (plan && host && q && k && v && o && lse) {
        CHECK_OK(fa_buffer_upload(q, 0, host, bytes));
        CHECK_OK(fa_buffer_upload(k, 0, host, bytes));
        CHECK_OK(fa_buffer_upload(v, 0, host, bytes));
        CHECK_OK(fa_forward(plan, q, k, v, o, lse));
        CHECK_OK(fa_forward(plan, q, k, v, o, lse));
        CHECK_OK(fa_context_synchronize(ctx));
        char path[256], line[256], kernel[64] = "";
        snprintf(path, sizeof path, "%s/launch-000/meta.txt", dir);
        FILE *meta = fopen(path, "r");
        CHECK_MSG(meta != NULL, "no %s", path);
        int nargs = -1, lines = 0, first_mem = -1;
        while (meta && fgets(line, sizeof line, meta)) {
            unsigned i, b;
            if (sscanf(line, "kernel %63s", kernel) == 1) continue;
            if (sscanf(line, "args %d", &nargs) == 1) continue;
            if (sscanf(line, "arg %u mem buf%u.bin", &i, &b) == 2 && first_mem < 0) first_mem = (int)b;
            if (strncmp(line, "arg ", 4) == 0) lines++;
        }
        if (meta) fclose(meta);
        CHECK_MSG(strcmp(kernel, "fa_forward") == 0, "kernel %s", kernel);
        CHECK_MSG(nargs > 20 && lines == nargs, "%d argument lines for %d arguments", lines, nargs);
        CHECK_MSG(first_mem == 0, "first buffer argument %d", first_mem);
        struct stat st;
        snprintf(path, sizeof path, "%s/launch-000/buf000.bin", dir);
        CHECK_MSG(stat(path, &st) == 0 && (size_t)st.st_size == bytes, "%s: %lld bytes", path,
                  (long long)st.st_size);
        FILE *f = fopen(path, "rb");
        float first = 0.0f;
        CHECK(f && fread(&first, sizeof first, 1, f) == 1 && first == host[0]);
        if (f) fclose(f);
        snprintf(path, sizeof path, "%s/launch-000/program.bin", dir);
        CHECK(stat(path, &st) == 0 && st.st_size > 0);
        snprintf(path, sizeof path, "%s/launch-001", dir);
        CHECK_MSG(stat(path, &st) != 0, "a second launch was recorded past the cap of 1");
    }
    free(host);
    fa_buffer bufs[5] = {q, k, v, o, lse};
    for (int i = 0; i < 5; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    if (plan) fa_plan_destroy(plan);
    CHECK_OK(fa_context_destroy(ctx));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* One warpgroup matrix product through the masked sm_90a lines
 * (core/ptx_patch.h): A (64 x 16) and B (8 x 16) fp16 in local memory in
 * the no-swizzle K-major layout (8 x 8 core matrices of 128 contiguous
 * bytes, 128 bytes apart along k and 256 along the rows), D = A B^T by one
 * wgmma m64n8k16, its accumulator laid out as mma.sync's, a warp's 16 rows
 * each. */
static const char sm90a_source[] =
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void\n"
    "wg(__global const ushort *a, __global const ushort *b, __global float *d) {\n"
    "    __local ushort As[64 * 16] __attribute__((aligned(256)));\n"
    "    __local ushort Bs[8 * 16] __attribute__((aligned(256)));\n"
    "    const int t = get_local_id(0);\n"
    "    for (int i = t; i < 64 * 16; i += 128)\n"
    "        As[(i / 128 * 2 + i % 16 / 8) * 64 + i / 16 % 8 * 8 + i % 8] = a[i];\n"
    "    Bs[(t % 16 / 8) * 64 + t / 16 * 8 + t % 8] = b[t];\n"
    "    __asm__ __volatile__(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    const ulong hi = (ulong)(256 >> 4) << 32 | (ulong)(128 >> 4) << 16;\n"
    "    const ulong da = hi | (uint)(size_t)As >> 4, db = hi | (uint)(size_t)Bs >> 4;\n"
    "    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;\n"
    "    __asm__ __volatile__(\"" FA_PTX_SM90A_MARK "wgmma.fence.sync.aligned;\\n\\t\"\n"
    "                         \"" FA_PTX_SM90A_MARK "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 \"\n"
    "                         \"{%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\\n\\t\"\n"
    "                         \"" FA_PTX_SM90A_MARK "wgmma.commit_group.sync.aligned;\\n\\t\"\n"
    "                         \"" FA_PTX_SM90A_MARK "wgmma.wait_group.sync.aligned 0;\"\n"
    "                         : \"+f\"(c0), \"+f\"(c1), \"+f\"(c2), \"+f\"(c3) : \"l\"(da), \"l\"(db) : \"memory\");\n"
    "    const int row = 16 * (t / 32) + t % 32 / 4, col = 2 * (t % 4);\n"
    "    d[row * 8 + col] = c0;\n"
    "    d[row * 8 + col + 1] = c1;\n"
    "    d[(row + 8) * 8 + col] = c2;\n"
    "    d[(row + 8) * 8 + col + 1] = c3;\n"
    "}\n";

/* Runs sm90a_source's kernel on small integers (exact in fp16 and in the
 * product) and counts the outputs that differ from the host's product. */
static int run_sm90a(fa_context ctx, cl_program program) {
    fa_cl_context *cl = cl_of(ctx);
    cl_int err = CL_SUCCESS;
    cl_kernel kernel = fa_cl.clCreateKernel(program, "wg", &err);
    CHECK_MSG(err == CL_SUCCESS && kernel, "clCreateKernel(wg) = %d", (int)err);
    if (err != CL_SUCCESS) return -1;
    uint16_t ha[64 * 16], hb[8 * 16];
    float fa[64 * 16], fb[8 * 16], got[64 * 8];
    for (int i = 0; i < 64 * 16; i++) ha[i] = fa_f32_to_f16(fa[i] = (float)((i * 7 + 3) % 9 - 4));
    for (int i = 0; i < 8 * 16; i++) hb[i] = fa_f32_to_f16(fb[i] = (float)((i * 5 + 1) % 7 - 3) * 0.5f);
    fa_buffer ba = NULL, bb = NULL, bd = NULL;
    int bad = -1;
    CHECK_OK(fa_buffer_alloc(ctx, sizeof ha, &ba));
    CHECK_OK(fa_buffer_alloc(ctx, sizeof hb, &bb));
    CHECK_OK(fa_buffer_alloc(ctx, sizeof got, &bd));
    if (ba && bb && bd) {
        CHECK_OK(fa_buffer_upload(ba, 0, ha, sizeof ha));
        CHECK_OK(fa_buffer_upload(bb, 0, hb, sizeof hb));
        cl_mem m[3] = {NULL, NULL, NULL};
        const fa_buffer bufs[3] = {ba, bb, bd};
        for (int i = 0; i < 3; i++) {
            if (fa_buffer_get_native(bufs[i], (void **)&m[i]) != FA_SUCCESS) m[i] = NULL;
            err |= fa_cl.clSetKernelArg(kernel, (cl_uint)i, sizeof m[i], &m[i]);
        }
        CHECK(err == CL_SUCCESS);
        size_t local = 128, global = 128;
        CHECK_OK(fa_cl_launch(cl, kernel, 1, &global, &local, NULL));
        CHECK_OK(fa_buffer_download(bd, 0, got, sizeof got));
        bad = 0;
        for (int r = 0; r < 64; r++)
            for (int c = 0; c < 8; c++) {
                float want = 0.0f;
                for (int k = 0; k < 16; k++) want += fa[r * 16 + k] * fb[c * 16 + k];
                bad += got[r * 8 + c] != want;
            }
    }
    if (ba) fa_buffer_free(ba);
    if (bb) fa_buffer_free(bb);
    if (bd) fa_buffer_free(bd);
    fa_cl.clReleaseKernel(kernel);
    return bad;
}

/* A program with masked sm_90a lines (FA_NV_SM90A) on NVIDIA's OpenCL on
 * Hopper or later: built from source, unmasked and built again from its
 * PTX, then from the kernel cache; each run computes the right product. */
FA_TEST(sm90a_lines_build_and_run) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_cl_context *cl = cl_of(ctx);
    const char *arch = cl->info.desc.arch;
    if (strncmp(arch, "sm_", 3) != 0 || atoi(arch + 3) < 90) {
        static char why[320];
        snprintf(why, sizeof why, "needs NVIDIA's OpenCL on sm_90 or later; %s is \"%s\"", cl->info.desc.name,
                 arch);
        fa_context_destroy(ctx);
        FA_SKIP(why);
    }
    /* A salt no earlier run has built, so the second build must compile. */
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ (uint64_t)getpid());
    char source[sizeof sm90a_source + 64];
    const int len = snprintf(source, sizeof source, "// salt %llu\n%s", (unsigned long long)(fa_rng_next(&rng) >> 1),
                             sm90a_source);
    static const fa_cl_origin origins[] = {FA_CL_BUILT_FROM_SOURCE, FA_CL_BUILT_FROM_SOURCE, FA_CL_LOADED_FROM_CACHE};
    for (int i = 0; i < 3; i++) {
        cl_program p = NULL;
        fa_cl_origin origin = FA_CL_LOADED_FROM_CACHE;
        /* Uncached, then into the cache and out of it. */
        CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, "-DFA_NV_SM90A", i > 0, &p, &origin));
        CHECK_MSG(origin == origins[i], "build %d: origin %d", i, (int)origin);
        if (!p) continue;
        const int bad = run_sm90a(ctx, p);
        CHECK_MSG(bad == 0, "build %d: %d of 512 outputs wrong", i, bad);
        fa_cl.clReleaseProgram(p);
    }
    /* Without the flag the masked lines stay comments: the kernel builds
     * and leaves D zero, which the check tells apart. */
    cl_program p = NULL;
    CHECK_OK(fa_cl_build_text(cl, source, (size_t)len, "", 0, &p, NULL));
    if (p) {
        CHECK(run_sm90a(ctx, p) > 0);
        fa_cl.clReleaseProgram(p);
    }
    fa_context_destroy(ctx);
}

/* The sm_90a route's refusals are FA_ERR_UNSUPPORTED (the caller then
 * builds without those lines), a source that does not compile stays
 * FA_ERR_COMPILE: a program built with FA_NV_SM90A where the binary is not
 * PTX for sm_9x (PoCL's, or an older NVIDIA GPU's) is refused, and on
 * every device while the test hook refuses them, the kernel cache
 * included. */
FA_TEST(sm90a_route_refused) {
    REQUIRE_OPENCL();
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_OPENCL, -1, &ctx));
    if (!ctx) return;
    fa_cl_context *cl = cl_of(ctx);
    const int ptx_sm9x = strncmp(cl->info.desc.arch, "sm_9", 4) == 0;
    static const char plain[] = "__kernel void plain(__global float *y) { y[get_global_id(0)] = 1.0f; }\n";
    static const char broken[] = "__kernel void broken(__global float *y) { y[0] = undeclared_symbol_r4; }\n";
    cl_program p = NULL;
    fa_status st = fa_cl_build_text(cl, plain, sizeof plain - 1, "-DFA_NV_SM90A", 1, &p, NULL);
    if (ptx_sm9x) {
        CHECK_MSG(st == FA_SUCCESS, "%s on %s: %s", fa_status_string(st), cl->info.desc.arch, fa_last_error());
    } else {
        CHECK_STATUS(st, FA_ERR_UNSUPPORTED);
        CHECK(p == NULL);
        CHECK_MSG(strstr(fa_last_error(), "PTX") != NULL, "no reason in \"%s\"", fa_last_error());
    }
    if (p) fa_cl.clReleaseProgram(p);
    p = NULL;
    fa_cl_sm90a_refuse = 1;
    /* Cached above where it built: the hook passes the cache by. */
    CHECK_STATUS(fa_cl_build_text(cl, plain, sizeof plain - 1, "-DFA_NV_SM90A", 1, &p, NULL), FA_ERR_UNSUPPORTED);
    CHECK(p == NULL);
    CHECK(strstr(fa_last_error(), "refused") != NULL);
    CHECK_STATUS(fa_cl_build_text(cl, broken, sizeof broken - 1, "-DFA_NV_SM90A", 0, &p, NULL), FA_ERR_COMPILE);
    CHECK(strstr(fa_last_error(), "undeclared_symbol_r4") != NULL);
    /* Without the flag the hook changes nothing. */
    CHECK_OK(fa_cl_build_text(cl, plain, sizeof plain - 1, "", 0, &p, NULL));
    if (p) fa_cl.clReleaseProgram(p);
    fa_cl_sm90a_refuse = 0;
    fa_context_destroy(ctx);
}

/* Needs no device: names and statuses only. */
FA_TEST(error_codes_named) {
    CHECK_STATUS(fa_cl_error(CL_INVALID_VALUE, "clFoo"), FA_ERR_LAUNCH);
    CHECK(strstr(fa_last_error(), "clFoo") != NULL);
    CHECK(strstr(fa_last_error(), "CL_INVALID_VALUE (-30)") != NULL);
    CHECK_STATUS(fa_cl_error(CL_OUT_OF_RESOURCES, "clBar"), FA_ERR_OUT_OF_MEMORY);
    CHECK(strstr(fa_last_error(), "CL_OUT_OF_RESOURCES (-5)") != NULL);
    CHECK_STATUS(fa_cl_error(CL_MEM_OBJECT_ALLOCATION_FAILURE, "x"), FA_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(fa_cl_error(CL_OUT_OF_HOST_MEMORY, "x"), FA_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(fa_cl_error(CL_INVALID_WORK_GROUP_SIZE, "x"), FA_ERR_LAUNCH);
    CHECK(strstr(fa_last_error(), "CL_INVALID_WORK_GROUP_SIZE (-54)") != NULL);
    CHECK_STATUS(fa_cl_error(-1001, "x"), FA_ERR_LAUNCH);
    CHECK(strstr(fa_last_error(), "CL_PLATFORM_NOT_FOUND_KHR (-1001)") != NULL);
    CHECK_STATUS(fa_cl_error(-12345, "x"), FA_ERR_LAUNCH);
    CHECK(strstr(fa_last_error(), "(-12345)") != NULL);
    CHECK(fa_cl_error_name(CL_BUILD_PROGRAM_FAILURE) && strcmp(fa_cl_error_name(CL_BUILD_PROGRAM_FAILURE),
                                                               "CL_BUILD_PROGRAM_FAILURE") == 0);
}

#else /* !FA_WITH_OPENCL */

/* Same case names, each skipping; cmake registers the definitions above. */
#define NOT_BUILT(name) \
    FA_TEST(name) { FA_SKIP("the OpenCL backend is not compiled into this build"); }
NOT_BUILT(enumerates_every_device)
NOT_BUILT(bandwidth_measured_then_cached)
NOT_BUILT(context_native_and_sync)
NOT_BUILT(buffer_round_trip_unaligned)
NOT_BUILT(buffer_bounds_and_sizes)
NOT_BUILT(wrap_native_buffer)
NOT_BUILT(broken_source_reports_log)
NOT_BUILT(stream_gpu_flavour_builds)
NOT_BUILT(build_cache_hit_corrupt_and_stale)
NOT_BUILT(launch_and_timing)
NOT_BUILT(error_codes_named)
NOT_BUILT(sm90a_lines_build_and_run)
NOT_BUILT(sm90a_route_refused)
NOT_BUILT(launch_recorded)

#endif

FA_TEST_MAIN(FA_CASE(enumerates_every_device), FA_CASE(bandwidth_measured_then_cached),
             FA_CASE(context_native_and_sync), FA_CASE(buffer_round_trip_unaligned),
             FA_CASE(buffer_bounds_and_sizes), FA_CASE(wrap_native_buffer), FA_CASE(broken_source_reports_log),
             FA_CASE(build_cache_hit_corrupt_and_stale), FA_CASE(launch_and_timing), FA_CASE(error_codes_named),
             FA_CASE(stream_gpu_flavour_builds), FA_CASE(launch_recorded), FA_CASE(sm90a_lines_build_and_run),
             FA_CASE(sm90a_route_refused))
