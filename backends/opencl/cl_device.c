/* OpenCL devices: enumeration at init, the device description the planner
 * reads, and the copy-kernel bandwidth probe run on first context creation. */
#include "cl_runtime_internal.h"

#include "fa_internal.h"
#include "mma_layouts.h"
#include "mma_vendors.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Vendor queries, from the extension specifications (the 1.2 headers do not
 * all carry them). */
#define FA_CL_DEVICE_SUB_GROUP_SIZES_INTEL 0x4108
#define FA_CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define FA_CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#define FA_CL_DEVICE_WARP_SIZE_NV 0x4003
#define FA_CL_DEVICE_WAVEFRONT_WIDTH_AMD 0x4043
#define FA_CL_DEVICE_GFXIP_MAJOR_AMD 0x404A
#define FA_CL_DEVICE_GFXIP_MINOR_AMD 0x404B
#define FA_CL_DEVICE_IP_VERSION_INTEL 0x4250

/* A machine with more OpenCL devices than this is not one we plan for; the
 * rest are ignored rather than failing init. */
#define FA_CL_MAX_DEVICES 64

/* Bandwidth estimates (GB/s, read + write) until the probe has run. They are
 * deliberately modest: a plan made on them is valid, only its predicted time
 * is pessimistic. Dual-channel DDR4/DDR5 hosts reach 20 to 80 GB/s; integrated
 * GPUs share that memory; discrete GPUs start near 200 GB/s. */
#define FA_CL_ESTIMATE_CPU_GBS 20.0
#define FA_CL_ESTIMATE_IGPU_GBS 50.0
#define FA_CL_ESTIMATE_GPU_GBS 200.0
#define FA_CL_ESTIMATE_ACCEL_GBS 100.0

/* Probe sizes per buffer. GPUs: launch and tail effects weigh on small
 * copies (an H100 read 2.75 TB/s at 64 MiB, 2.95 at 256 MiB, 3.02 at 1 GiB),
 * and the probe runs once per machine. CPUs: at least four times the
 * reported global-memory cache (a 32 MiB L3 holds most of a 16 MiB copy and
 * inflates the figure), at most FA_CL_PROBE_MAX_BYTES. Both shrink to fit
 * small devices. */
#define FA_CL_PROBE_GPU_BYTES ((size_t)1024 << 20)
#define FA_CL_PROBE_CPU_BYTES ((size_t)16 << 20)
#define FA_CL_PROBE_MAX_BYTES ((size_t)256 << 20)
#define FA_CL_PROBE_MIN_BYTES ((size_t)1 << 20)
#define FA_CL_PROBE_RUNS 5

static fa_cl_device cl_devices[FA_CL_MAX_DEVICES];
static int cl_device_total;
static double cl_estimate_gbs[FA_CL_MAX_DEVICES];

/* info_lock guards the bandwidth fields of cl_devices[].info; probe_lock
 * serialises probes so that two contexts opened at once measure only once
 * (and never run two probes that disturb each other). */
static pthread_mutex_t cl_info_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cl_probe_lock = PTHREAD_MUTEX_INITIALIZER;
static int cl_probe_done[FA_CL_MAX_DEVICES];
static int cl_probe_runs;

static const char cl_copy_kernel[] =
    "__kernel void fa_bandwidth_copy(__global const float4 *restrict src,\n"
    "                                __global float4 *restrict dst) {\n"
    "    size_t i = get_global_id(0);\n"
    "    dst[i] = src[i];\n"
    "}\n";

const char *fa_cl_copy_kernel_source(void) { return cl_copy_kernel; }

/* ------------------------------------------------------------------------ */
/* Queries                                                                  */

/* A malloc'ed, NUL-terminated string query; NULL when it fails. */
static char *device_string(cl_device_id dev, cl_device_info param) {
    size_t size = 0;
    if (fa_cl.clGetDeviceInfo(dev, param, 0, NULL, &size) != CL_SUCCESS) return NULL;
    char *s = malloc(size + 1);
    if (!s) return NULL;
    if (fa_cl.clGetDeviceInfo(dev, param, size, s, NULL) != CL_SUCCESS) {
        free(s);
        return NULL;
    }
    s[size] = '\0';
    return s;
}

/* Copies text into out, dropping the leading and trailing blanks some
 * drivers pad names with; truncates to fit. */
static void copy_trimmed(char *out, size_t cap, const char *text, const char *fallback) {
    if (!text) text = fallback;
    while (*text == ' ' || *text == '\t') text++;
    size_t len = strlen(text);
    while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\t' || text[len - 1] == '\n')) len--;
    if (len >= cap) len = cap - 1;
    memcpy(out, text, len);
    out[len] = '\0';
}

static void device_string_into(cl_device_id dev, cl_device_info param, char *out, size_t cap,
                               const char *fallback) {
    char *s = device_string(dev, param);
    copy_trimmed(out, cap, s, fallback);
    free(s);
}

static cl_uint device_uint(cl_device_id dev, cl_device_info param, cl_uint fallback) {
    cl_uint v = 0;
    return fa_cl.clGetDeviceInfo(dev, param, sizeof v, &v, NULL) == CL_SUCCESS ? v : fallback;
}

static cl_ulong device_ulong(cl_device_id dev, cl_device_info param, cl_ulong fallback) {
    cl_ulong v = 0;
    return fa_cl.clGetDeviceInfo(dev, param, sizeof v, &v, NULL) == CL_SUCCESS ? v : fallback;
}

static size_t device_size(cl_device_id dev, cl_device_info param, size_t fallback) {
    size_t v = 0;
    return fa_cl.clGetDeviceInfo(dev, param, sizeof v, &v, NULL) == CL_SUCCESS ? v : fallback;
}

/* Whole-word match in a space-separated extension list. */
static int has_extension(const char *list, const char *name) {
    if (!list) return 0;
    size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len) {
        int starts = p == list || p[-1] == ' ';
        int ends = p[len] == '\0' || p[len] == ' ';
        if (starts && ends) return 1;
    }
    return 0;
}

static int clamp_int(size_t v) { return v > 0x7fffffff ? 0x7fffffff : (int)v; }

/* ------------------------------------------------------------------------ */
/* Vendor facts                                                             */

/* FP32 lanes per NVIDIA SM by compute capability (public architecture
 * whitepapers): Kepler 192; Maxwell 128; GP100 64, other Pascal 128; Volta and
 * Turing 64; GA100 64, other Ampere and Ada 128; Hopper and Blackwell 128. */
static int nvidia_fp32_lanes(unsigned major, unsigned minor) {
    if (major <= 3) return 192;
    if (major == 5) return 128;
    if (major == 6) return minor == 0 ? 64 : 128;
    if (major == 7) return 64;
    if (major == 8) return minor == 0 ? 64 : 128;
    return 128;
}

/* FP32 FLOPs per clock per AMD CU: 64 lanes of FMA on GCN, CDNA1/2 (packed
 * FP32 on CDNA2 needs float2 code OpenCL compilers rarely emit) and RDNA1/2;
 * CDNA3 (gfx94x, gfx95x) and RDNA3/4 (gfx11xx, gfx12xx) issue twice that. */
static double amd_fp32_flops(const char *arch) {
    if (strncmp(arch, "gfx94", 5) == 0 || strncmp(arch, "gfx95", 5) == 0) return 2.0 * 64 * 2;
    if (strlen(arch) >= 7 && (strncmp(arch, "gfx11", 5) == 0 || strncmp(arch, "gfx12", 5) == 0))
        return 2.0 * 64 * 2;
    return 2.0 * 64;
}

/* The sub-group sizes an Intel device offers (0x4108), as a bit set of
 * powers of two (bit 3: 8). */
static unsigned intel_subgroup_sizes(cl_device_id dev) {
    size_t bytes = 0;
    if (fa_cl.clGetDeviceInfo(dev, FA_CL_DEVICE_SUB_GROUP_SIZES_INTEL, 0, NULL, &bytes) != CL_SUCCESS ||
        bytes < sizeof(size_t))
        return 0;
    size_t *sizes = malloc(bytes);
    if (!sizes) return 0;
    unsigned set = 0;
    if (fa_cl.clGetDeviceInfo(dev, FA_CL_DEVICE_SUB_GROUP_SIZES_INTEL, bytes, sizes, NULL) == CL_SUCCESS)
        for (size_t i = 0; i < bytes / sizeof(size_t); i++)
            for (unsigned b = 0; b <= 10; b++)
                if (sizes[i] == (size_t)1 << b) set |= 1u << b;
    free(sizes);
    return set;
}

/* The sub-group size the planner should assume on Intel GPUs: 16 where
 * offered (the size Intel's compilers favour), else the largest. */
static int intel_preferred_subgroup(unsigned sizes) {
    if (sizes & (1u << 4)) return 16;
    for (int b = 10; b >= 0; b--)
        if (sizes & (1u << b)) return 1 << b;
    return 0;
}

/* The device's matrix units as a layout of the OpenCL matrix-unit kernels
 * (core/mma_layouts.h): matrix_m/n/k from the table, the rate given. */
static void describe_matrix_units(fa_cl_device *d, fa_mma_layout layout, int emulated, double flops_per_clock) {
    const fa_mma_layout_info *l = fa_mma_layout_get(layout);
    fa_device_desc *desc = &d->info.desc;
    if (!l || !(flops_per_clock > 0.0)) return;
    d->mma_layout = layout;
    d->mma_emulated = emulated;
    desc->matrix_flops_per_clock_cu = flops_per_clock;
    desc->matrix_m = l->m;
    desc->matrix_n = l->n;
    desc->matrix_k = l->k;
}

/* The vendor of a GPU: its PCI vendor ID, or, where a runtime reports
 * another, the vendor's attribute-query extension. */
static unsigned gpu_vendor(cl_device_id dev, const char *ext) {
    const unsigned id = (unsigned)device_uint(dev, CL_DEVICE_VENDOR_ID, 0);
    if (id == FA_PCI_VENDOR_NVIDIA || id == FA_PCI_VENDOR_AMD || id == FA_PCI_VENDOR_INTEL) return id;
    if (has_extension(ext, "cl_nv_device_attribute_query")) return FA_PCI_VENDOR_NVIDIA;
    if (has_extension(ext, "cl_amd_device_attribute_query")) return FA_PCI_VENDOR_AMD;
    if (has_extension(ext, "cl_intel_required_subgroup_size")) return FA_PCI_VENDOR_INTEL;
    return id;
}

/* AMD's architecture: ROCm names the device by its target
 * ("gfx90a:sramecc+:xnack-"), which carries the stepping the GFXIP numbers
 * (cl_amd_device_attribute_query) lack. */
static void amd_arch(cl_device_id dev, const char *name, char *arch, size_t size) {
    if (strncmp(name, "gfx", 3) == 0) {
        size_t len = strcspn(name, ": ");
        if (len >= size) len = size - 1;
        memcpy(arch, name, len);
        arch[len] = '\0';
        return;
    }
    cl_uint major = device_uint(dev, FA_CL_DEVICE_GFXIP_MAJOR_AMD, 0);
    cl_uint minor = device_uint(dev, FA_CL_DEVICE_GFXIP_MINOR_AMD, 0);
    /* Stepping unknown here: assume 0. */
    if (major > 0) snprintf(arch, size, "gfx%u%u0", (unsigned)major, (unsigned)minor);
}

static void describe_vendor(fa_cl_device *d, const char *ext) {
    fa_device_desc *desc = &d->info.desc;
    cl_device_id dev = d->device;
    cl_uint pvw = device_uint(dev, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, 0);
    int simd = 0;
    double flops = 0.0;

    /* CPU runtimes carry vendor extensions too (Intel's offers sub-groups of
     * up to 64, AMD's reports a wavefront of 1); their SIMD width is the
     * vector register, below. */
    const int cpu = desc->type == FA_DEVICE_CPU;
    fa_gpu_facts facts;
    memset(&facts, 0, sizeof facts);
    facts.vendor_id = cpu ? 0 : gpu_vendor(dev, ext);
    facts.arch = desc->arch;
    if (facts.vendor_id == FA_PCI_VENDOR_NVIDIA && has_extension(ext, "cl_nv_device_attribute_query")) {
        simd = (int)device_uint(dev, FA_CL_DEVICE_WARP_SIZE_NV, 0);
        cl_uint major = device_uint(dev, FA_CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, 0);
        cl_uint minor = device_uint(dev, FA_CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, 0);
        if (major > 0) {
            snprintf(desc->arch, sizeof desc->arch, "sm_%u%u", (unsigned)major, (unsigned)minor);
            flops = 2.0 * nvidia_fp32_lanes(major, minor);
        }
    } else if (facts.vendor_id == FA_PCI_VENDOR_AMD && has_extension(ext, "cl_amd_device_attribute_query")) {
        simd = (int)device_uint(dev, FA_CL_DEVICE_WAVEFRONT_WIDTH_AMD, 0);
        amd_arch(dev, desc->name, desc->arch, sizeof desc->arch);
        if (desc->type == FA_DEVICE_GPU) flops = amd_fp32_flops(desc->arch);
    } else if (facts.vendor_id == FA_PCI_VENDOR_INTEL && has_extension(ext, "cl_intel_required_subgroup_size")) {
        const unsigned sizes = intel_subgroup_sizes(dev);
        simd = intel_preferred_subgroup(sizes);
        facts.intel_sub_group_8 = (sizes >> 3) & 1u;
        facts.intel_matrix_mad = has_extension(ext, "cl_intel_subgroup_matrix_multiply_accumulate");
        if (has_extension(ext, "cl_intel_device_attribute_query")) {
            facts.intel_ip = (unsigned)device_uint(dev, FA_CL_DEVICE_IP_VERSION_INTEL, 0);
            if (facts.intel_ip) fa_intel_arch_name(facts.intel_ip, desc->arch, sizeof desc->arch);
        }
        /* OpenCL counts Intel GPU EUs as compute units: 8 FP32 FMA lanes each. */
        if (desc->type == FA_DEVICE_GPU) flops = 2.0 * 8;
    }
    /* Matrix units only where a layer of kernels_cl/ runs them. */
    facts.wave = simd;
    if (desc->type == FA_DEVICE_GPU) {
        /* The layout first: its call sets the rate passed beside it. */
        double matrix = 0.0;
        const fa_mma_layout layout = fa_gpu_matrix_units(&facts, &matrix);
        describe_matrix_units(d, layout, 0, matrix);
    }

    if (simd <= 0) {
        if (!cpu) {
            simd = 32;
        } else {
            /* CPUs: the preferred float vector is the SIMD register (4 SSE,
             * 8 AVX2, 16 AVX-512); a runtime that says 1 gives no hint, so
             * assume AVX2. */
            simd = pvw >= 4 ? (int)pvw : 8;
        }
    }
    if (flops <= 0.0) {
        if (cpu)
            flops = 2.0 * simd * 2; /* FMA, two vector ports per core */
        else
            flops = 2.0 * simd;
    }
    desc->simd_width = simd;
    desc->fp32_flops_per_clock_cu = flops;
}

static double bandwidth_estimate(const fa_cl_device *d) {
    switch (d->info.desc.type) {
    case FA_DEVICE_CPU:
        return FA_CL_ESTIMATE_CPU_GBS;
    case FA_DEVICE_GPU: {
        cl_bool unified = CL_FALSE;
        if (fa_cl.clGetDeviceInfo(d->device, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL) !=
            CL_SUCCESS)
            unified = CL_FALSE;
        return unified ? FA_CL_ESTIMATE_IGPU_GBS : FA_CL_ESTIMATE_GPU_GBS;
    }
    default:
        return FA_CL_ESTIMATE_ACCEL_GBS;
    }
}

/* emulate: the layout FLASHATTN_OPENCL_MMA_EMULATE names, or none. */
static void describe(fa_cl_device *d, int index, fa_mma_layout emulate) {
    cl_device_id dev = d->device;
    fa_device_info *info = &d->info;
    fa_device_desc *desc = &info->desc;
    memset(info, 0, sizeof *info);
    info->backend = FA_BACKEND_OPENCL;
    info->index = index;
    desc->backend = FA_BACKEND_OPENCL;

    device_string_into(dev, CL_DEVICE_NAME, desc->name, sizeof desc->name, "unnamed OpenCL device");
    device_string_into(dev, CL_DEVICE_VENDOR, desc->vendor, sizeof desc->vendor, "unknown vendor");
    device_string_into(dev, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version, "unknown");

    cl_ulong type = device_ulong(dev, CL_DEVICE_TYPE, CL_DEVICE_TYPE_DEFAULT);
    if (type & CL_DEVICE_TYPE_GPU)
        desc->type = FA_DEVICE_GPU;
    else if (type & CL_DEVICE_TYPE_CPU)
        desc->type = FA_DEVICE_CPU;
    else
        desc->type = FA_DEVICE_ACCELERATOR;

    desc->local_mem_bytes = (size_t)device_ulong(dev, CL_DEVICE_LOCAL_MEM_SIZE, 0);
    desc->max_work_group_size = clamp_int(device_size(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, 1));
    desc->compute_units = (int)device_uint(dev, CL_DEVICE_MAX_COMPUTE_UNITS, 1);
    desc->clock_mhz = (int)device_uint(dev, CL_DEVICE_MAX_CLOCK_FREQUENCY, 0);
    desc->global_mem_bytes = (size_t)device_ulong(dev, CL_DEVICE_GLOBAL_MEM_SIZE, 0);
    /* The global-memory cache: the L2 on GPUs (a CPU reports one core's). */
    desc->l2_cache_bytes = (size_t)device_ulong(dev, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, 0);
    d->max_alloc_bytes = device_ulong(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, desc->global_mem_bytes / 4);
    if (desc->compute_units <= 0) desc->compute_units = 1;
    if (desc->max_work_group_size <= 0) desc->max_work_group_size = 1;

    char *ext = device_string(dev, CL_DEVICE_EXTENSIONS);
    describe_vendor(d, ext);
    free(ext);
    /* An emulated layout runs its instructions on the vector units: no
     * faster than them. */
    if (emulate != FA_MMA_LAYOUT_NONE) describe_matrix_units(d, emulate, 1, desc->fp32_flops_per_clock_cu);

    cl_estimate_gbs[index] = bandwidth_estimate(d);
    desc->bandwidth_gbs = cl_estimate_gbs[index];
    desc->bandwidth_measured = 0;

    char platform_version[128];
    size_t got = 0;
    if (fa_cl.clGetPlatformInfo(d->platform, CL_PLATFORM_VERSION, sizeof platform_version - 1, platform_version,
                                &got) != CL_SUCCESS)
        got = 0;
    platform_version[got < sizeof platform_version ? got : sizeof platform_version - 1] = '\0';
    snprintf(d->cache_device, sizeof d->cache_device, "%s %s", desc->name, desc->arch);
    snprintf(d->cache_driver, sizeof d->cache_driver, "%s / %s", info->driver_version, platform_version);
}

/* ------------------------------------------------------------------------ */
/* Enumeration                                                              */

/* FLASHATTN_OPENCL_MMA_EMULATE: a layout name, or unset (or empty, or
 * "off") for none; anything else makes the backend unavailable, with the
 * reason, rather than run other kernels than asked for. */
static int emulated_layout(fa_mma_layout *out, char *reason, size_t reason_size) {
    const char *env = getenv("FLASHATTN_OPENCL_MMA_EMULATE");
    *out = FA_MMA_LAYOUT_NONE;
    if (!env || !env[0] || strcmp(env, "off") == 0) return 1;
    /* A family: the units a device reports (amd-mfma plans both MFMA
     * shapes, as on the hardware). */
    const fa_mma_layout named = fa_mma_layout_named(env);
    const fa_mma_layout_info *l = fa_mma_layout_get(named);
    if (l && l->family == named) {
        *out = named;
        return 1;
    }
    snprintf(reason, reason_size,
             "FLASHATTN_OPENCL_MMA_EMULATE=%s names no family of matrix-unit layouts (nvidia, intel, amd-mfma, "
             "amd-wmma or off)",
             env);
    return 0;
}

fa_status fa_cl_enumerate(char *reason, size_t reason_size) {
    cl_device_total = 0;
    fa_mma_layout emulate;
    if (!emulated_layout(&emulate, reason, reason_size)) return FA_ERR_BACKEND_UNAVAILABLE;
    cl_uint nplat = 0;
    cl_int err = fa_cl.clGetPlatformIDs(0, NULL, &nplat);
    /* The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR when no vendor ICD is
     * registered. */
    if (err != CL_SUCCESS || nplat == 0) {
        const char *name = fa_cl_error_name(err);
        snprintf(reason, reason_size, "no OpenCL platform found (clGetPlatformIDs: %s (%d)); is an ICD installed "
                 "and listed in /etc/OpenCL/vendors or OCL_ICD_VENDORS?",
                 name ? name : "unknown OpenCL error", (int)err);
        return FA_ERR_BACKEND_UNAVAILABLE;
    }
    cl_platform_id *plats = malloc(nplat * sizeof *plats);
    if (!plats) {
        snprintf(reason, reason_size, "no host memory to list %u OpenCL platforms", (unsigned)nplat);
        return FA_ERR_BACKEND_UNAVAILABLE;
    }
    err = fa_cl.clGetPlatformIDs(nplat, plats, NULL);
    if (err != CL_SUCCESS) {
        free(plats);
        snprintf(reason, reason_size, "clGetPlatformIDs failed: %d", (int)err);
        return FA_ERR_BACKEND_UNAVAILABLE;
    }
    for (cl_uint p = 0; p < nplat && cl_device_total < FA_CL_MAX_DEVICES; p++) {
        cl_uint ndev = 0;
        /* A platform without devices (CL_DEVICE_NOT_FOUND) is not an error. */
        if (fa_cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &ndev) != CL_SUCCESS || ndev == 0) continue;
        cl_device_id *devs = malloc(ndev * sizeof *devs);
        if (!devs) continue;
        if (fa_cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, ndev, devs, NULL) == CL_SUCCESS) {
            for (cl_uint i = 0; i < ndev && cl_device_total < FA_CL_MAX_DEVICES; i++) {
                fa_cl_device *d = &cl_devices[cl_device_total];
                memset(d, 0, sizeof *d);
                d->platform = plats[p];
                d->device = devs[i];
                describe(d, cl_device_total, emulate);
                cl_probe_done[cl_device_total] = 0;
                cl_device_total++;
            }
        }
        free(devs);
    }
    free(plats);
    if (cl_device_total == 0) {
        snprintf(reason, reason_size, "%u OpenCL platform(s) found but no device in any of them", (unsigned)nplat);
        return FA_ERR_BACKEND_UNAVAILABLE;
    }
    return FA_SUCCESS;
}

int fa_cl_device_count(void) { return cl_device_total; }

const fa_cl_device *fa_cl_device_get(int index) {
    if (index < 0 || index >= cl_device_total) return NULL;
    return &cl_devices[index];
}

fa_status fa_cl_device_info(int index, fa_device_info *info) {
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    if (index < 0 || index >= cl_device_total)
        return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "OpenCL device index %d is not in [0, %d)", index, cl_device_total);
    pthread_mutex_lock(&cl_info_lock);
    *info = cl_devices[index].info;
    pthread_mutex_unlock(&cl_info_lock);
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Bandwidth                                                                */

static void bandwidth_key(const fa_cl_device *d, fa_kcache_key *key) {
    memset(key, 0, sizeof *key);
    /* kcache allows only [a-z0-9_] in backend names. */
    key->backend = "opencl_bandwidth";
    key->source = cl_copy_kernel;
    key->source_size = sizeof cl_copy_kernel - 1;
    key->options = "";
    key->device = d->info.desc.name;
    key->driver = d->info.driver_version;
}

/* Best of FA_CL_PROBE_RUNS copies of src to dst, timed with profiling
 * events; bytes count the read and the write. */
static fa_status time_copies(fa_cl_context *ctx, cl_kernel kernel, cl_mem src, cl_mem dst, size_t bytes,
                             double *gbs) {
    /* Touch every page of both buffers first: reads of never-written pages
     * can be served from a shared zero page and look impossibly fast. */
    const float pattern = 1.5f;
    cl_int err = fa_cl.clEnqueueFillBuffer(ctx->queue, src, &pattern, sizeof pattern, 0, bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = fa_cl.clEnqueueFillBuffer(ctx->queue, dst, &pattern, sizeof pattern, 0, bytes, 0, NULL, NULL);
    if (err == CL_SUCCESS) err = fa_cl.clSetKernelArg(kernel, 0, sizeof src, &src);
    if (err == CL_SUCCESS) err = fa_cl.clSetKernelArg(kernel, 1, sizeof dst, &dst);
    if (err != CL_SUCCESS) return fa_cl_error(err, "bandwidth probe setup");

    size_t global = bytes / 16;
    double best = INFINITY;
    /* Run 0 warms up (first-use compilation, page mapping) and is not kept. */
    for (int run = 0; run <= FA_CL_PROBE_RUNS; run++) {
        cl_event ev = NULL;
        FA_CHECK(fa_cl_launch(ctx, kernel, 1, &global, NULL, &ev));
        double ms = fa_cl_event_ms(ev);
        fa_cl.clReleaseEvent(ev);
        if (ms < 0.0) return fa_fail(FA_ERR_LAUNCH, "bandwidth probe: profiling event could not be read");
        if (run > 0 && ms > 0.0 && ms < best) best = ms;
    }
    if (!isfinite(best)) return fa_fail(FA_ERR_LAUNCH, "bandwidth probe: no run gave a positive time");
    *gbs = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
    return FA_SUCCESS;
}

static fa_status measure(fa_cl_context *ctx, const fa_cl_device *d, double *gbs) {
    size_t bytes = d->info.desc.type == FA_DEVICE_GPU ? FA_CL_PROBE_GPU_BYTES : FA_CL_PROBE_CPU_BYTES;
    cl_ulong cache = device_ulong(d->device, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, 0);
    while (bytes < FA_CL_PROBE_MAX_BYTES && (cl_ulong)bytes < 4 * cache) bytes *= 2;
    while (bytes >= 2 * FA_CL_PROBE_MIN_BYTES &&
           ((cl_ulong)bytes > d->max_alloc_bytes / 2 || (cl_ulong)bytes > d->info.desc.global_mem_bytes / 8))
        bytes /= 2;
    if ((cl_ulong)bytes > d->max_alloc_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "device too small for the bandwidth probe");

    cl_program program = NULL;
    FA_CHECK(fa_cl_build_text(ctx, cl_copy_kernel, sizeof cl_copy_kernel - 1, "", 0, &program, NULL));
    cl_int err = CL_SUCCESS;
    cl_mem src = NULL, dst = NULL;
    fa_status st;
    cl_kernel kernel = fa_cl.clCreateKernel(program, "fa_bandwidth_copy", &err);
    if (err != CL_SUCCESS) {
        st = fa_cl_error(err, "clCreateKernel(fa_bandwidth_copy)");
    } else {
        src = fa_cl.clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (err == CL_SUCCESS) dst = fa_cl.clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (err != CL_SUCCESS)
            st = fa_cl_error(err, "clCreateBuffer(bandwidth probe)");
        else
            st = time_copies(ctx, kernel, src, dst, bytes, gbs);
    }
    if (src) fa_cl.clReleaseMemObject(src);
    if (dst) fa_cl.clReleaseMemObject(dst);
    if (kernel) fa_cl.clReleaseKernel(kernel);
    fa_cl.clReleaseProgram(program);
    return st;
}

static void set_bandwidth(int index, double gbs, int measured) {
    pthread_mutex_lock(&cl_info_lock);
    cl_devices[index].info.desc.bandwidth_gbs = gbs;
    cl_devices[index].info.desc.bandwidth_measured = measured;
    pthread_mutex_unlock(&cl_info_lock);
}

void fa_cl_bandwidth_ensure(fa_cl_context *ctx) {
    const fa_cl_device *d = fa_cl_device_get(ctx->index);
    if (!d) return;
    const char *skip = getenv("FLASHATTN_NO_BANDWIDTH_PROBE");
    if (skip && strcmp(skip, "1") == 0) return;

    pthread_mutex_lock(&cl_probe_lock);
    if (!cl_probe_done[ctx->index]) {
        /* Once per process whatever the outcome: a probe that failed would
         * most likely fail again, and each try costs a compile. */
        cl_probe_done[ctx->index] = 1;
        fa_kcache_key key;
        bandwidth_key(d, &key);
        void *data = NULL;
        size_t size = 0;
        double gbs = 0.0;
        int have = 0;
        if (fa_kcache_load(&key, &data, &size) == FA_SUCCESS) {
            if (size == sizeof gbs) {
                memcpy(&gbs, data, sizeof gbs);
                have = isfinite(gbs) && gbs > 0.0;
            }
            free(data);
        }
        if (!have && measure(ctx, d, &gbs) == FA_SUCCESS && isfinite(gbs) && gbs > 0.0) {
            have = 1;
            cl_probe_runs++;
            /* A cache that cannot be written only costs the next process a
             * probe. */
            (void)fa_kcache_store(&key, &gbs, sizeof gbs);
        }
        if (have) set_bandwidth(ctx->index, gbs, 1);
    }
    pthread_mutex_unlock(&cl_probe_lock);
}

void fa_cl_bandwidth_forget(int index) {
    if (index < 0 || index >= cl_device_total) return;
    pthread_mutex_lock(&cl_probe_lock);
    cl_probe_done[index] = 0;
    set_bandwidth(index, cl_estimate_gbs[index], 0);
    pthread_mutex_unlock(&cl_probe_lock);
}

int fa_cl_bandwidth_probe_count(void) {
    pthread_mutex_lock(&cl_probe_lock);
    int n = cl_probe_runs;
    pthread_mutex_unlock(&cl_probe_lock);
    return n;
}
