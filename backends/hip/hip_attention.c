/* The attention half of the HIP backend: compiles the kernels of
 * kernels_hip/ with hiprtc for a plan's tile shape and options (through the
 * kernel cache), owns the plan's device copies (sequence offsets, block
 * mask, tile maps) and workspace, and launches the passes. The kernels are
 * the OpenCL ones' twins: same plans (br, bc, thread_rows, thread_cols,
 * work_group_size, split_k), same arguments, same results.
 *
 * hiprtc: ROCm 5 exports it from libamdhip64 itself, ROCm 6 from a library
 * of its own. It is looked up in the HIP runtime library first (the one
 * FLASHATTN_HIP_LIBRARY names, else the build's default), then in
 * libhiprtc. Compiling needs no device, so the CI compile check uses the
 * same path on machines without a GPU.
 *
 * Build options: "--offload-arch=<arch>" (the device's gcnArchName, or
 * "sm_XX" through the NVIDIA mapping in backends/hip_nvidia/, which then
 * also gets kernels_hip/hip_nvidia_prelude.h in front of the source), "-O3",
 * and the plan's -D constants, WAVE among them: the wavefront width comes
 * from the device description, never from an assumption.
 *
 * MMA plans run the matrix-core kernels (kernels_hip/fwd_mma.hip,
 * bwd_mma.hip) on the fragment layer core/planner_hip_mma.c gives the plan
 * on the device; their backward adds dQ into an fp32 accumulator with
 * atomics, or, in deterministic mode, runs a dQ kernel of its own. Their
 * local memory is dynamic, passed at launch: where it exceeds what a
 * kernel gets by default (through the NVIDIA mapping: 48 KiB), the kernel
 * is opted in to it with hipFuncSetAttribute when its module loads. */
#define FA_HIP_RUNTIME_TYPES
#include "hip_runtime_internal.h"

#include <hip/hiprtc.h>

#include "desc.h"
#include "dtype.h"
#include "dynlib.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "kcache.h"
#include "kernel_sources.h"
#include "kvcache_launch.h"
#include "plan.h"
#include "planner.h"
#include "planner_hip_mma.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most fp32 accumulators one work-item may hold per output (the
 * planner's register budget). */
#define FA_HIP_MAX_ACCUMULATORS 64
/* Grid dimensions y and z: 65535 on every HIP and CUDA device. */
#define FA_HIP_MAX_GRID_YZ 65535u
#define FA_HIP_PRELUDE "kernels_hip/hip_nvidia_prelude.h"
#define FA_HIP_DTYPES "kernels_hip/dtype.h"

/* ------------------------------------------------------------------------ */
/* hiprtc                                                                    */
/* ------------------------------------------------------------------------ */

#define FA_HIPRTC_FUNCTIONS(X)                                                                     \
    X(hiprtcGetErrorString, const char *, (hiprtcResult))                                          \
    X(hiprtcVersion, hiprtcResult, (int *, int *))                                                 \
    X(hiprtcCreateProgram, hiprtcResult,                                                           \
      (hiprtcProgram *, const char *, const char *, int, const char **, const char **))            \
    X(hiprtcCompileProgram, hiprtcResult, (hiprtcProgram, int, const char **))                     \
    X(hiprtcDestroyProgram, hiprtcResult, (hiprtcProgram *))                                       \
    X(hiprtcGetProgramLogSize, hiprtcResult, (hiprtcProgram, size_t *))                            \
    X(hiprtcGetProgramLog, hiprtcResult, (hiprtcProgram, char *))                                  \
    X(hiprtcGetCodeSize, hiprtcResult, (hiprtcProgram, size_t *))                                  \
    X(hiprtcGetCode, hiprtcResult, (hiprtcProgram, char *))

typedef struct hip_rtc_api {
#define FA_HIPRTC_MEMBER(name, ret, args) ret (*name) args;
    FA_HIPRTC_FUNCTIONS(FA_HIPRTC_MEMBER)
#undef FA_HIPRTC_MEMBER
    char version[32];
} hip_rtc_api;

static pthread_once_t rtc_once = PTHREAD_ONCE_INIT;
static hip_rtc_api rtc_api;
static int rtc_loaded;
static char rtc_reason[1100];

static int rtc_symbols(void *lib, hip_rtc_api *api, char *why, size_t why_size) {
#define FA_HIPRTC_LOAD(name, ret, args) \
    if (!fa_dynlib_load(lib, #name, NULL, &api->name, why, why_size)) return 0;
    FA_HIPRTC_FUNCTIONS(FA_HIPRTC_LOAD)
#undef FA_HIPRTC_LOAD
    return 1;
}

static void rtc_load(void) {
    static const char *const runtimes[] = {
#ifdef FA_HIP_DEFAULT_LIBRARY
        FA_HIP_DEFAULT_LIBRARY,
#endif
        "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5", NULL};
    static const char *const standalone[] = {"libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5", NULL};
    const char *override_list[2];
    const char *const *names = fa_dynlib_names("FLASHATTN_HIP_LIBRARY", runtimes, override_list);
    char why[512], why2[512];
    hip_rtc_api api;
    memset(&api, 0, sizeof api);
    void *lib = fa_dynlib_open(names, why, sizeof why);
    int ok = lib && rtc_symbols(lib, &api, why, sizeof why);
    if (!ok) {
        /* The runtime stays open (the backend holds it too); hiprtc may
         * live beside it. */
        void *rtc = fa_dynlib_open(standalone, why2, sizeof why2);
        ok = rtc && rtc_symbols(rtc, &api, why2, sizeof why2);
        if (!ok) {
            snprintf(rtc_reason, sizeof rtc_reason, "hiprtc not found: %s; %s", why, why2);
            return;
        }
    }
    int major = 0, minor = 0;
    if (api.hiprtcVersion(&major, &minor) != HIPRTC_SUCCESS) major = minor = 0;
    snprintf(api.version, sizeof api.version, "hiprtc %d.%d", major, minor);
    rtc_api = api;
    rtc_loaded = 1;
}

static const hip_rtc_api *rtc_get(void) {
    pthread_once(&rtc_once, rtc_load);
    if (!rtc_loaded) {
        (void)fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "%s", rtc_reason);
        return NULL;
    }
    return &rtc_api;
}

/* ------------------------------------------------------------------------ */
/* Programs                                                                  */
/* ------------------------------------------------------------------------ */

static int add_define(fa_hip_program *p, const char *fmt, int value, int with_value) {
    if (p->define_count >= FA_HIP_MAX_DEFINES) return 0;
    char *dst = p->defines[p->define_count];
    int n = with_value ? snprintf(dst, FA_HIP_DEFINE_SIZE, fmt, value)
                       : snprintf(dst, FA_HIP_DEFINE_SIZE, "%s", fmt);
    if (n < 0 || n >= FA_HIP_DEFINE_SIZE) return 0;
    p->define_count++;
    return 1;
}

/* The defines every program takes: tile, wavefront, dtype, options (masks,
 * dropout, varlen, score options). */
static int add_common_defines(fa_hip_program *out, const fa_attention_desc *d, const fa_kernel_plan *kp, int wave) {
    int ok = add_define(out, "-DHEAD_DIM=%d", d->head_dim, 1) && add_define(out, "-DBR=%d", kp->br, 1) &&
             add_define(out, "-DBC=%d", kp->bc, 1) && add_define(out, "-DTR=%d", kp->thread_rows, 1) &&
             add_define(out, "-DTC=%d", kp->thread_cols, 1) && add_define(out, "-DWAVE=%d", wave, 1) &&
             add_define(out, fa_dtype_build_option(d->q.dtype), 0, 0);
    if (ok && d->causal) ok = add_define(out, "-DCAUSAL", 0, 0);
    if (ok && fa_desc_has_window(d)) ok = add_define(out, "-DWINDOW", 0, 0);
    if (ok && d->block_mask) ok = add_define(out, "-DBLOCK_MASK", 0, 0);
    if (ok && d->dropout_p > 0.0f) ok = add_define(out, "-DDROPOUT", 0, 0);
    if (ok && d->cu_seqlens_q) ok = add_define(out, "-DVARLEN", 0, 0);
    /* Score options: compiled in only where the plan has them. */
    if (ok && d->softcap > 0.0f) ok = add_define(out, "-DSOFTCAP", 0, 0);
    if (ok && d->alibi_slopes) ok = add_define(out, "-DALIBI", 0, 0);
    if (ok && d->bias_batch > 0) ok = add_define(out, "-DBIAS", 0, 0);
    if (ok && d->bias_batch > 0 && d->bias.dtype == FA_DTYPE_F32) ok = add_define(out, "-DBIAS_F32", 0, 0);
    return ok;
}

/* A KV-cache step (kernels_hip/kvcache.hip, with splitk.hip's merge for a
 * split plan): the FP32-pipe kernels on the plan's packed-row SIMT tile,
 * the step's options from core/kvcache_launch.c; forward only. */
static fa_status kvcache_program(const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass, int wave,
                                 fa_hip_program *out) {
    if (pass != FA_PASS_FORWARD) return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: a KV-cache step has no backward pass");
    FA_CHECK(fa_kvcache_check_simt(d, kp, "HIP"));
    fa_kv_defines kv;
    FA_CHECK(fa_kvcache_defines(d, &kv));
    const int split = fa_kvcache_splits(kp) > 1;
    int ok = add_common_defines(out, d, kp, wave);
    if (ok && split) ok = add_define(out, "-DSPLITK", 0, 0);
    for (int i = 0; ok && i < kv.count; i++) ok = add_define(out, kv.text[i], 0, 0);
    if (!ok) return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit");
    out->paths[out->path_count++] = "kernels_hip/common.h";
    out->paths[out->path_count++] = "kernels_hip/kvcache.hip";
    out->kernels[out->kernel_count++] = "fa_kv_prepare";
    out->kernels[out->kernel_count++] = "fa_kv_attend";
    if (split) {
        out->paths[out->path_count++] = "kernels_hip/splitk.hip";
        out->kernels[out->kernel_count++] = "fa_splitk_merge";
    }
    return FA_SUCCESS;
}

fa_status fa_hip_program_for(const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass, int wave,
                             fa_hip_program *out) {
    if (!d || !kp || !out) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !d ? "desc" : !kp ? "plan" : "out");
    memset(out, 0, sizeof *out);
    const char *name = pass == FA_PASS_BACKWARD ? "backward" : "forward";
    if (d->kv_cache && pass == FA_PASS_BACKWARD)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: a KV-cache step has no backward pass");
    if (pass == FA_PASS_FORWARD && kp->variant != FA_VARIANT_SIMT && kp->variant != FA_VARIANT_SPLITK)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward variant %s has no HIP kernel (SIMT and SPLITK do)",
                       fa_variant_name(kp->variant));
    if (pass == FA_PASS_BACKWARD && kp->variant != FA_VARIANT_SIMT)
        return fa_fail(FA_ERR_UNSUPPORTED, "backward variant %s has no HIP kernel (SIMT does)",
                       fa_variant_name(kp->variant));
    if (d->head_dim % 8 || d->head_dim < 8 || d->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not a multiple of 8 in [8, 256]", d->head_dim);
    if (wave <= 0 || (wave & (wave - 1)))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "wavefront width %d is not a power of two", wave);
    if (kp->br <= 0 || kp->bc <= 0 || kp->thread_rows <= 0 || kp->thread_cols <= 0)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: br %d, bc %d, thread_rows %d, thread_cols %d must be > 0", name,
                       kp->br, kp->bc, kp->thread_rows, kp->thread_cols);
    if (kp->br % kp->thread_rows || kp->bc % kp->thread_cols)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: br %d / thread_rows %d or bc %d / thread_cols %d is not whole",
                       name, kp->br, kp->thread_rows, kp->bc, kp->thread_cols);
    const int ntr = kp->br / kp->thread_rows, ntc = kp->bc / kp->thread_cols;
    if (kp->work_group_size != ntr * ntc)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: work_group_size %d is not (br / thread_rows) * (bc / thread_cols) = %d",
                       name, kp->work_group_size, ntr * ntc);
    const int dpt = (d->head_dim + ntc - 1) / ntc;
    if (kp->thread_rows * dpt > FA_HIP_MAX_ACCUMULATORS)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: %d x %d accumulators per work-item exceed %d", name,
                       kp->thread_rows, dpt, FA_HIP_MAX_ACCUMULATORS);

    if (d->kv_cache) return kvcache_program(d, kp, pass, wave, out);
    int ok = add_common_defines(out, d, kp, wave);
    const int split = pass == FA_PASS_FORWARD && kp->variant == FA_VARIANT_SPLITK && kp->split_k > 1;
    if (ok && split) ok = add_define(out, "-DSPLITK", 0, 0);
    if (!ok) return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit");

    out->paths[out->path_count++] = "kernels_hip/common.h";
    if (pass == FA_PASS_FORWARD) {
        out->paths[out->path_count++] = "kernels_hip/fwd.hip";
        out->kernels[out->kernel_count++] = "fa_forward";
        if (split) {
            out->paths[out->path_count++] = "kernels_hip/splitk.hip";
            out->kernels[out->kernel_count++] = "fa_splitk_merge";
        }
    } else {
        out->paths[out->path_count++] = "kernels_hip/bwd.hip";
        out->kernels[out->kernel_count++] = "fa_bwd_dot";
        out->kernels[out->kernel_count++] = "fa_bwd_dkdv";
        out->kernels[out->kernel_count++] = "fa_bwd_dq";
    }
    return FA_SUCCESS;
}

/* The matrix-core programs: the plan's layer and geometry from
 * core/planner_hip_mma.c, the kernels of fwd_mma.hip or bwd_mma.hip. The
 * backward adds dQ into an fp32 accumulator with atomics (DQ_ATOMIC)
 * unless the descriptor asks for deterministic results, which the dQ
 * kernel of its own gives. */
static fa_status mma_program_for(const fa_device_desc *dev, const fa_attention_desc *d, const fa_kernel_plan *kp,
                                 fa_pass pass, fa_hip_program *out) {
    const char *name = pass == FA_PASS_BACKWARD ? "backward" : "forward";
    fa_hip_mma_geometry g;
    if (!fa_hip_mma_geometry_of(dev, d, pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, &g))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "%s plan: the matrix-core kernels cannot run tile %d x %d with micro-tile %d x %d at head_dim "
                       "%d in %s on %s (wavefront %d)",
                       name, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, d->head_dim, fa_dtype_name(d->q.dtype),
                       dev->arch[0] ? dev->arch : "an unnamed architecture", dev->simd_width);
    const fa_hip_mma_layer_info *L = fa_hip_mma_layer_get(g.layer);
    if (kp->work_group_size != g.warps * L->lanes)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: work_group_size %d is not %d wavefronts of %d", name,
                       kp->work_group_size, g.warps, L->lanes);
    const int atomic = pass == FA_PASS_BACKWARD && !d->deterministic;
    if (kp->stages < 1 || kp->stages > (pass == FA_PASS_BACKWARD ? 2 : 1))
        return fa_fail(FA_ERR_INTERNAL, "%s plan: %d stages (the matrix-core kernels take 1%s)", name, kp->stages,
                       pass == FA_PASS_BACKWARD ? " or 2" : "");
    int ok = add_common_defines(out, d, kp, L->lanes) && add_define(out, "-DWARPS=%d", g.warps, 1) &&
             add_define(out, "-DSTRIPS=%d", g.strips, 1);
    if (ok && L->define) ok = add_define(out, L->define, 0, 0);
    if (ok && g.q_local) ok = add_define(out, "-DQ_LOCAL", 0, 0);
    if (ok && pass == FA_PASS_BACKWARD) ok = add_define(out, "-DSTAGES=%d", kp->stages, 1);
    if (ok && atomic) ok = add_define(out, "-DDQ_ATOMIC", 0, 0);
    if (!ok) return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit");
    out->paths[out->path_count++] = "kernels_hip/common.h";
    out->paths[out->path_count++] = L->header;
    out->paths[out->path_count++] = "kernels_hip/mma_frag.h";
    out->paths[out->path_count++] = "kernels_hip/mma_tiles.h";
    if (pass == FA_PASS_FORWARD) {
        out->paths[out->path_count++] = "kernels_hip/fwd_mma.hip";
        out->kernels[out->kernel_count++] = "fa_forward_mma";
    } else {
        out->paths[out->path_count++] = "kernels_hip/bwd_mma.hip";
        out->kernels[out->kernel_count++] = "fa_bwd_prep_mma";
        out->kernels[out->kernel_count++] = "fa_bwd_dkdv_mma";
        out->kernels[out->kernel_count++] = atomic ? "fa_bwd_dq_convert" : "fa_bwd_dq_mma";
    }
    return FA_SUCCESS;
}

fa_status fa_hip_program_for_device(const fa_device_desc *dev, const fa_attention_desc *d, const fa_kernel_plan *kp,
                                    fa_pass pass, fa_hip_program *out) {
    if (!dev || !d || !kp || !out)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !dev ? "device" : !d ? "desc" : !kp ? "plan" : "out");
    /* A KV-cache step has FP32-pipe kernels only: fa_hip_program_for
     * refuses a matrix-core plan of one. */
    if (kp->variant != FA_VARIANT_MMA || d->kv_cache) return fa_hip_program_for(d, kp, pass, dev->simd_width, out);
    memset(out, 0, sizeof *out);
    return mma_program_for(dev, d, kp, pass, out);
}

static int is_nvidia_arch(const char *arch) { return arch && strncmp(arch, "sm_", 3) == 0; }

fa_status fa_hip_program_source(const fa_hip_program *prog, const char *arch, char **text_out, size_t *size_out) {
    if (!prog || !text_out || !size_out)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !prog ? "prog" : !text_out ? "text" : "size");
    *text_out = NULL;
    *size_out = 0;
    enum { MAX_PATHS = FA_HIP_MAX_PATHS + 2 };
    const char *paths[MAX_PATHS];
    int count = 0;
    if (is_nvidia_arch(arch)) paths[count++] = FA_HIP_PRELUDE;
    /* Every program is written on the types and conversions of dtype.h. */
    paths[count++] = FA_HIP_DTYPES;
    for (int i = 0; i < prog->path_count && count < MAX_PATHS; i++) paths[count++] = prog->paths[i];
    const fa_kernel_source *srcs[MAX_PATHS];
    size_t total = 1;
    for (int i = 0; i < count; i++) {
        srcs[i] = fa_kernel_source_find(paths[i]);
        if (!srcs[i])
            return fa_fail(FA_ERR_INTERNAL, "kernel source \"%s\" is not embedded in this library", paths[i]);
        total += srcs[i]->size + strlen(srcs[i]->path) + 32;
    }
    char *text = malloc(total);
    if (!text) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %zu bytes of kernel source", total);
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        /* Each file is preceded by a #line naming it, so the compiler's log
         * points into the file rather than into the concatenation. */
        at += (size_t)snprintf(text + at, total - at, "#line 1 \"%s\"\n", srcs[i]->path);
        memcpy(text + at, srcs[i]->text, srcs[i]->size);
        at += srcs[i]->size;
        if (srcs[i]->size == 0 || srcs[i]->text[srcs[i]->size - 1] != '\n') text[at++] = '\n';
    }
    text[at] = '\0';
    *text_out = text;
    *size_out = at;
    return FA_SUCCESS;
}

static void rtc_describe(const hip_rtc_api *api, hiprtcResult r, char *out, size_t size) {
    const char *s = api->hiprtcGetErrorString ? api->hiprtcGetErrorString(r) : NULL;
    snprintf(out, size, "%s (%d)", s ? s : "hiprtc error", (int)r);
}

/* One hiprtc compile, no cache. */
static fa_status rtc_compile(const hip_rtc_api *api, const char *source, const char *const *options, int count,
                             void **code, size_t *size) {
    hiprtcProgram prog = NULL;
    char text[256];
    hiprtcResult r = api->hiprtcCreateProgram(&prog, source, "flashattn.hip", 0, NULL, NULL);
    if (r != HIPRTC_SUCCESS) {
        rtc_describe(api, r, text, sizeof text);
        return fa_fail(r == HIPRTC_ERROR_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_COMPILE,
                       "hiprtcCreateProgram: %s", text);
    }
    /* hiprtc's signature lacks the const of its strings; it does not write. */
    const char **opts = malloc((size_t)count * sizeof *opts);
    if (!opts) {
        api->hiprtcDestroyProgram(&prog);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %d build options", count);
    }
    for (int i = 0; i < count; i++) opts[i] = options[i];
    r = api->hiprtcCompileProgram(prog, count, opts);
    free(opts);
    if (r != HIPRTC_SUCCESS) {
        rtc_describe(api, r, text, sizeof text);
        size_t log_size = 0;
        char *log = NULL;
        if (api->hiprtcGetProgramLogSize(prog, &log_size) == HIPRTC_SUCCESS && log_size > 0) {
            log = malloc(log_size + 1);
            if (log && api->hiprtcGetProgramLog(prog, log) == HIPRTC_SUCCESS)
                log[log_size] = '\0';
            else if (log)
                log[0] = '\0';
        }
        fa_status st = fa_fail(FA_ERR_COMPILE, "hiprtcCompileProgram: %s; options:", text);
        for (int i = 0; i < count; i++) {
            fa_fail_append(" ");
            fa_fail_append(options[i]);
        }
        fa_fail_append("\nlog:\n");
        fa_fail_append(log && log[0] ? log : "(empty)");
        free(log);
        api->hiprtcDestroyProgram(&prog);
        return st;
    }
    size_t n = 0;
    r = api->hiprtcGetCodeSize(prog, &n);
    void *buf = r == HIPRTC_SUCCESS && n > 0 ? malloc(n) : NULL;
    if (buf) r = api->hiprtcGetCode(prog, buf);
    api->hiprtcDestroyProgram(&prog);
    if (!buf || r != HIPRTC_SUCCESS) {
        free(buf);
        if (r == HIPRTC_SUCCESS && n > 0) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %zu bytes of code", n);
        rtc_describe(api, r, text, sizeof text);
        return fa_fail(FA_ERR_COMPILE, "hiprtcGetCode: %s (%zu bytes)", text, n);
    }
    *code = buf;
    *size = n;
    return FA_SUCCESS;
}

/* The compile with an explicit runtime version for the cache key (the
 * device's runtime when there is one; hiprtc's own version otherwise). */
static fa_status compile_cached(const char *arch, const char *runtime, const fa_hip_program *prog, void **code,
                                size_t *size) {
    if (!arch || !arch[0])
        return fa_fail(FA_ERR_UNSUPPORTED, "the device's architecture is unknown: cannot compile HIP kernels for it");
    const hip_rtc_api *api = rtc_get();
    if (!api) return FA_ERR_BACKEND_UNAVAILABLE;
    char *source = NULL;
    size_t source_size = 0;
    FA_CHECK(fa_hip_program_source(prog, arch, &source, &source_size));

    char arch_option[64];
    snprintf(arch_option, sizeof arch_option, "--offload-arch=%s", arch);
    const char *options[FA_HIP_MAX_DEFINES + 2];
    int count = 0;
    options[count++] = arch_option;
    options[count++] = "-O3";
    for (int i = 0; i < prog->define_count; i++) options[count++] = prog->defines[i];
    char joined[FA_HIP_MAX_DEFINES * (FA_HIP_DEFINE_SIZE + 1) + 96];
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        int n = snprintf(joined + at, sizeof joined - at, "%s%s", i ? " " : "", options[i]);
        if (n > 0) at += (size_t)n < sizeof joined - at ? (size_t)n : sizeof joined - at - 1;
    }
    char driver[96];
    snprintf(driver, sizeof driver, "%s; %s", runtime ? runtime : "no runtime", api->version);
    fa_kcache_key key = {"hip", source, source_size, joined, arch, driver};
    if (fa_kcache_load(&key, code, size) == FA_SUCCESS && *size > 0) {
        free(source);
        return FA_SUCCESS;
    }
    fa_status st = rtc_compile(api, source, options, count, code, size);
    /* A cache that cannot be written costs only the next compile. */
    if (st == FA_SUCCESS) (void)fa_kcache_store(&key, *code, *size);
    free(source);
    return st;
}

fa_status fa_hip_compile(const char *arch, const fa_hip_program *prog, void **code, size_t *size) {
    if (!arch || !prog || !code || !size)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !arch ? "arch" : !prog ? "prog" : !code ? "code" : "size");
    *code = NULL;
    *size = 0;
    return compile_cached(arch, NULL, prog, code, size);
}

/* ------------------------------------------------------------------------ */
/* Plans                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct hip_pass {
    int br, bc, tr, tc, wg;
    int mma;                    /* the matrix-core kernels (MMA plans) */
    int dq_atomic;              /* backward, mma: dQ through the fp32 accumulator */
    int dq_threads;             /* backward, mma, deterministic: the dQ kernel's work-group */
    hipModule_t module;
    hipFunction_t fn[3];
    size_t shared[3];           /* dynamic local memory each kernel is launched with */
    int fn_count;
} hip_pass;

typedef struct fa_hip_plan {
    fa_hip_context *ctx;
    hip_pass fwd, bwd;
    int num_splits;             /* forward key splits; 1: none */

    void *cu_q, *cu_k;          /* varlen offsets */
    void *block_mask;
    void *fwd_tiles, *bwd_tiles; /* block mask per (query tile, key tile) */
    int fwd_tile_cols, bwd_tile_cols;
    void *part_o, *part_l;      /* split-K partial results */
    void *dvec;                 /* backward: rowsum(dO * O) */
    void *dq_acc;               /* backward, mma: fp32 dQ [heads_q][total_q][head_dim] */
    void *slopes;               /* ALiBi: heads_q fp32 slopes */

    fa_layout q, k, v, o;
    int block_cols;
    float scale_log2;
    float drop_scale;
    float cap_in;               /* softcap: scale / softcap; else 0 */
    int64_t bias_sb, bias_sh, bias_ss; /* bias element strides, 0 along broadcast dimensions */

    int kv_cache;               /* a KV-cache plan: fa_hip_forward_kvcache only */
    void *kv_status;            /* kvcache.hip: a verdict per sequence */
    fa_kv_params kv_base;       /* the step's parameter block less its per-step addresses */
    unsigned kv_grid[3];        /* fa_kv_attend's */

    hipEvent_t start, stop;
    int timed;                  /* start and stop hold the last pass */
} fa_hip_plan;

/* The architecture to compile for: the device description's, else the
 * runtime's gcnArchName when it names one ("gfx...", or "sm_..." through
 * the NVIDIA mapping). */
static void target_arch(const fa_hip_context *ctx, char *arch, size_t size) {
    snprintf(arch, size, "%s", ctx->arch);
    if (arch[0] || !fa_hip_api_get()) return;
    fa_hip_arch_name(ctx->index, arch, size);
}

static fa_status device_alloc(size_t bytes, const void *host, const char *what, void **out) {
    const fa_hip_api *api = fa_hip_api_get();
    *out = NULL;
    if (bytes == 0) bytes = 16;
    hipError_t err = api->hipMalloc(out, bytes);
    if (err != hipSuccess) {
        *out = NULL;
        char where[128];
        snprintf(where, sizeof where, "hipMalloc(%zu bytes of %s)", bytes, what);
        return fa_hip_error(err, where);
    }
    if (host) {
        err = api->hipMemcpyAsync(*out, host, bytes, hipMemcpyHostToDevice, NULL);
        if (err == hipSuccess) err = api->hipDeviceSynchronize();
        if (err != hipSuccess) {
            (void)api->hipFree(*out);
            *out = NULL;
            return fa_hip_error(err, what);
        }
    }
    return FA_SUCCESS;
}

/* The block mask per (br x bc) tile (core/plan_data.h), on the device
 * (kernels_hip/common.h FA_TILE_*). */
static fa_status build_tile_map(fa_hip_plan *p, const fa_plan_s *plan, int br, int bc, void **out, int *cols_out) {
    uint8_t *map;
    size_t bytes;
    FA_CHECK(fa_tile_map_build(&plan->desc, plan->block_mask, br, bc, &map, &bytes, cols_out));
    fa_status st = device_alloc(bytes, map, "the block-sparse tile map", out);
    free(map);
    return st;
}

/* Work-group and local memory limits of this device for a pass: the SIMT
 * kernels' static tiles within the default, the matrix-core kernels'
 * dynamic ones within what a kernel may opt in to. */
static fa_status check_fit(const fa_hip_context *ctx, const fa_plan_s *plan, const fa_kernel_plan *kp, fa_pass pass) {
    const char *name = pass == FA_PASS_BACKWARD ? "backward" : "forward";
    const fa_device_desc *dev = &plan->ctx->info.desc;
    if (kp->work_group_size > dev->max_work_group_size)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: work-group of %d exceeds the device's %d", name,
                       kp->work_group_size, dev->max_work_group_size);
    const int mma = kp->variant == FA_VARIANT_MMA;
    const size_t local = mma ? fa_hip_mma_local_mem(dev, &plan->desc, pass, kp)
                             : fa_plan_local_mem(FA_VARIANT_SIMT, pass, &plan->desc, kp->br, kp->bc, 1);
    const size_t limit = mma ? ctx->lds_bytes : ctx->lds_static_bytes;
    if (local > limit)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: %zu bytes of local memory exceed the device's %zu%s", name, local,
                       limit, mma ? "" : " for static tiles");
    return FA_SUCCESS;
}

/* The matrix-core kernels' dynamic local memory, kernel by kernel in the
 * program's order (the row-wise kernels of the backward take none). */
static void mma_shared_sizes(const fa_device_desc *dev, const fa_attention_desc *d, const fa_kernel_plan *kp,
                             fa_pass pass, hip_pass *hp) {
    memset(hp->shared, 0, sizeof hp->shared);
    if (pass == FA_PASS_FORWARD) {
        hp->shared[0] = fa_hip_mma_local_mem(dev, d, pass, kp);
        return;
    }
    hp->shared[1] = fa_hip_mma_local_mem(dev, d, pass, kp);
    if (d->deterministic) hp->shared[2] = fa_hip_mma_dq_local_mem(d, kp->br, kp->bc);
}

/* Opts the kernels that take more dynamic local memory than the default in
 * to it. */
static fa_status opt_in_shared(const fa_hip_context *ctx, const fa_hip_program *prog, const hip_pass *hp) {
    const fa_hip_api *api = fa_hip_api_get();
    for (int i = 0; i < hp->fn_count; i++) {
        if (hp->shared[i] <= ctx->lds_static_bytes) continue;
        if (!api->hipFuncSetAttribute || hp->shared[i] > (size_t)INT32_MAX)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s: %zu bytes of local memory need hipFuncSetAttribute, which %s",
                           prog->kernels[i], hp->shared[i],
                           api->hipFuncSetAttribute ? "takes an int" : "this HIP runtime lacks");
        hipError_t err = api->hipFuncSetAttribute((const void *)hp->fn[i], hipFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)hp->shared[i]);
        if (err != hipSuccess) {
            char what[128];
            snprintf(what, sizeof what, "hipFuncSetAttribute(%s, MaxDynamicSharedMemorySize, %zu)", prog->kernels[i],
                     hp->shared[i]);
            return fa_hip_error(err, what);
        }
    }
    return FA_SUCCESS;
}

fa_status fa_hip_load_program(const fa_hip_context *ctx, const fa_hip_program *prog, hipModule_t *module,
                              hipFunction_t *fns) {
    const fa_hip_api *api = fa_hip_api_get();
    char arch[64], runtime[48];
    target_arch(ctx, arch, sizeof arch);
    const int v = api->runtime_version;
    snprintf(runtime, sizeof runtime, "hip %d.%d.%d", v / 10000000, (v / 100000) % 100, v % 100000);
    void *code = NULL;
    size_t size = 0;
    *module = NULL;
    FA_CHECK(compile_cached(arch, runtime, prog, &code, &size));
    hipModule_t loaded = NULL;
    hipError_t err = api->hipModuleLoadData(&loaded, code);
    free(code);
    if (err != hipSuccess) return fa_hip_error(err, "hipModuleLoadData");
    for (int i = 0; i < prog->kernel_count; i++) {
        err = api->hipModuleGetFunction(&fns[i], loaded, prog->kernels[i]);
        if (err != hipSuccess) {
            (void)api->hipModuleUnload(loaded);
            char what[96];
            snprintf(what, sizeof what, "hipModuleGetFunction(%s)", prog->kernels[i]);
            return fa_hip_error(err, what);
        }
    }
    *module = loaded;
    return FA_SUCCESS;
}

static fa_status load_pass(const fa_hip_plan *p, const fa_hip_program *prog, hip_pass *pass) {
    FA_CHECK(fa_hip_load_program(p->ctx, prog, &pass->module, pass->fn));
    pass->fn_count = prog->kernel_count;
    return FA_SUCCESS;
}

static void release_plan(fa_hip_plan *p) {
    const fa_hip_api *api = fa_hip_api_get();
    if (!api) {
        free(p);
        return;
    }
    int previous;
    int entered = fa_hip_enter(p->ctx, &previous) == FA_SUCCESS;
    /* Kernels of the plan may still run on the context's stream. */
    (void)api->hipStreamSynchronize(p->ctx->stream);
    if (p->fwd.module) (void)api->hipModuleUnload(p->fwd.module);
    if (p->bwd.module) (void)api->hipModuleUnload(p->bwd.module);
    void *mems[] = {p->cu_q,   p->cu_k, p->block_mask, p->fwd_tiles, p->bwd_tiles, p->part_o,
                    p->part_l, p->dvec, p->dq_acc,     p->slopes,    p->kv_status};
    for (size_t i = 0; i < FA_ARRAY_SIZE(mems); i++)
        if (mems[i]) (void)api->hipFree(mems[i]);
    if (p->start) (void)api->hipEventDestroy(p->start);
    if (p->stop) (void)api->hipEventDestroy(p->stop);
    if (entered) fa_hip_leave(p->ctx, previous);
    free(p);
}

void fa_hip_plan_release(void *ctx, void *plan_impl) {
    (void)ctx;
    if (plan_impl) release_plan(plan_impl);
}

static fa_status create_events(fa_hip_plan *p) {
    const fa_hip_api *api = fa_hip_api_get();
    hipError_t err = api->hipEventCreate(&p->start);
    if (err == hipSuccess) err = api->hipEventCreate(&p->stop);
    return err == hipSuccess ? FA_SUCCESS : fa_hip_error(err, "hipEventCreate");
}

/* The plan's copy of the ALiBi slopes, one per query head (raw: the
 * kernels take log2 e where they need it). */
static fa_status copy_slopes(fa_hip_plan *p, const fa_plan_s *plan) {
    if (!plan->alibi_slopes) return FA_SUCCESS;
    size_t bytes;
    FA_CHECK(fa_workspace_bytes("the ALiBi slopes", (size_t[]){(size_t)plan->desc.heads_q, sizeof(float)}, 2, &bytes));
    return device_alloc(bytes, plan->alibi_slopes, "the ALiBi slopes", &p->slopes);
}

/* A KV-cache plan: the FP32-pipe step's program (kernels_hip/kvcache.hip)
 * on the plan's packed-row tile, its attention's local memory dynamic (so
 * that, through the mapping on NVIDIA, tiles above 48 KiB opt in like the
 * matrix-core kernels'), the verdicts and split partials, and the
 * parameter block's plan-time fields (core/kvcache_launch.c). */
static fa_status prepare_kvcache(fa_hip_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    const fa_kernel_plan *kp = &plan->info.forward;
    const fa_device_desc *dev = &plan->ctx->info.desc;
    fa_hip_program prog;
    FA_CHECK(fa_hip_program_for_device(dev, d, kp, FA_PASS_FORWARD, &prog));
    if (kp->work_group_size > dev->max_work_group_size)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache plan: work-group of %d exceeds the device's %d",
                       kp->work_group_size, dev->max_work_group_size);
    const size_t local = fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, d, kp->br, kp->bc, 1);
    if (local > p->ctx->lds_bytes)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache plan: %zu bytes of local memory exceed the device's %zu", local,
                       p->ctx->lds_bytes);
    FA_CHECK(fa_kvcache_grid(d, kp, p->kv_grid));
    p->kv_cache = 1;
    p->num_splits = fa_kvcache_splits(kp);
    p->fwd.br = kp->br;
    p->fwd.bc = kp->bc;
    p->fwd.tr = kp->thread_rows;
    p->fwd.tc = kp->thread_cols;
    p->fwd.wg = kp->work_group_size;
    memset(p->fwd.shared, 0, sizeof p->fwd.shared);
    p->fwd.shared[1] = local;
    p->q = fa_desc_layout(d, FA_TENSOR_Q);
    p->k = fa_desc_layout(d, FA_TENSOR_K);
    p->v = fa_desc_layout(d, FA_TENSOR_V);
    p->o = fa_desc_layout(d, FA_TENSOR_O);
    p->scale_log2 = (float)((double)plan->scale * 1.4426950408889634);
    fa_kvcache_params(d, &p->kv_base);
    FA_CHECK(create_events(p));

    fa_kv_workspace w;
    FA_CHECK(fa_kvcache_workspace(plan, p->num_splits, &w));
    FA_CHECK(device_alloc(w.status_bytes, NULL, "the sequences' verdicts", &p->kv_status));
    p->kv_base.status = (uint64_t)(uintptr_t)p->kv_status;
    if (p->num_splits > 1) {
        FA_CHECK(device_alloc(w.part_o_bytes, NULL, "split-K partial outputs", &p->part_o));
        FA_CHECK(device_alloc(w.part_l_bytes, NULL, "split-K partial log-sum-exps", &p->part_l));
    }
    FA_CHECK(copy_slopes(p, plan));
    p->kv_base.alibi = (uint64_t)(uintptr_t)p->slopes;
    FA_CHECK(load_pass(p, &prog, &p->fwd));
    return opt_in_shared(p->ctx, &prog, &p->fwd);
}

static fa_status prepare(fa_hip_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    const fa_plan_info *info = &plan->info;
    fa_hip_context *ctx = p->ctx;
    if (d->kv_cache) return prepare_kvcache(p, plan);

    const fa_device_desc *dev = &plan->ctx->info.desc;
    fa_hip_program fwd_prog, bwd_prog;
    FA_CHECK(fa_hip_program_for_device(dev, d, &info->forward, FA_PASS_FORWARD, &fwd_prog));
    FA_CHECK(fa_hip_program_for_device(dev, d, &info->backward, FA_PASS_BACKWARD, &bwd_prog));
    FA_CHECK(check_fit(ctx, plan, &info->forward, FA_PASS_FORWARD));
    FA_CHECK(check_fit(ctx, plan, &info->backward, FA_PASS_BACKWARD));
    const fa_kernel_plan *kp[2] = {&info->forward, &info->backward};
    hip_pass *hp[2] = {&p->fwd, &p->bwd};
    for (int i = 0; i < 2; i++) {
        hp[i]->br = kp[i]->br;
        hp[i]->bc = kp[i]->bc;
        hp[i]->tr = kp[i]->thread_rows;
        hp[i]->tc = kp[i]->thread_cols;
        hp[i]->wg = kp[i]->work_group_size;
        hp[i]->mma = kp[i]->variant == FA_VARIANT_MMA;
        if (hp[i]->mma) mma_shared_sizes(dev, d, kp[i], (fa_pass)i, hp[i]);
    }
    if (p->bwd.mma) {
        fa_hip_mma_geometry g;
        if (!fa_hip_mma_geometry_of(dev, d, FA_PASS_BACKWARD, p->bwd.br, p->bwd.bc, p->bwd.tr, p->bwd.tc, &g))
            return fa_fail(FA_ERR_INTERNAL, "backward plan: no matrix-core geometry");
        p->bwd.dq_atomic = !d->deterministic;
        p->bwd.dq_threads = g.dq_warps * fa_hip_mma_layer_get(g.layer)->lanes;
    }
    p->num_splits = info->forward.variant == FA_VARIANT_SPLITK && info->forward.split_k > 1 ? info->forward.split_k : 1;

    p->q = fa_desc_layout(d, FA_TENSOR_Q);
    p->k = fa_desc_layout(d, FA_TENSOR_K);
    p->v = fa_desc_layout(d, FA_TENSOR_V);
    p->o = fa_desc_layout(d, FA_TENSOR_O);
    p->scale_log2 = (float)((double)plan->scale * 1.4426950408889634);
    const int dropout = d->dropout_p > 0.0f;
    p->drop_scale = dropout ? (float)(1.0 / (1.0 - (double)d->dropout_p)) : 1.0f;
    p->cap_in = d->softcap > 0.0f ? (float)((double)plan->scale / (double)d->softcap) : 0.0f;
    if (d->bias_batch > 0) {
        fa_dim dims[4];
        fa_desc_bias_dims(d, dims);
        p->bias_ss = dims[1].stride;
        p->bias_sh = d->bias_heads == 1 ? 0 : dims[2].stride;
        p->bias_sb = d->bias_batch == 1 ? 0 : dims[3].stride;
    }

    FA_CHECK(create_events(p));

    if (plan->cu_seqlens_q) {
        size_t bytes = ((size_t)d->batch + 1) * sizeof(int32_t);
        FA_CHECK(device_alloc(bytes, plan->cu_seqlens_q, "cu_seqlens_q", &p->cu_q));
        FA_CHECK(device_alloc(bytes, plan->cu_seqlens_k, "cu_seqlens_k", &p->cu_k));
    }
    if (plan->block_mask) {
        p->block_cols = fa_block_cols(d);
        FA_CHECK(device_alloc(d->block_mask_bytes, plan->block_mask, "the block mask", &p->block_mask));
        FA_CHECK(build_tile_map(p, plan, p->fwd.br, p->fwd.bc, &p->fwd_tiles, &p->fwd_tile_cols));
        FA_CHECK(build_tile_map(p, plan, p->bwd.br, p->bwd.bc, &p->bwd_tiles, &p->bwd_tile_cols));
    }
    /* Rows of L: heads_q x total_q. */
    const size_t heads = (size_t)d->heads_q, tokens = (size_t)plan->total_q, dim = (size_t)d->head_dim;
    size_t bytes;
    FA_CHECK(copy_slopes(p, plan));
    if (p->num_splits > 1) {
        const size_t splits = (size_t)p->num_splits;
        FA_CHECK(fa_workspace_bytes("split-K partial outputs",
                                    (size_t[]){splits, heads, tokens, dim, sizeof(float)}, 5, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "split-K partial outputs", &p->part_o));
        FA_CHECK(fa_workspace_bytes("split-K partial log-sum-exps",
                                    (size_t[]){splits, heads, tokens, sizeof(float)}, 4, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "split-K partial log-sum-exps", &p->part_l));
    }
    FA_CHECK(fa_workspace_bytes("the backward row sums", (size_t[]){heads, tokens, sizeof(float)}, 3, &bytes));
    FA_CHECK(device_alloc(bytes, NULL, "the backward row sums", &p->dvec));
    if (p->bwd.mma && p->bwd.dq_atomic) {
        FA_CHECK(fa_workspace_bytes("the fp32 dQ accumulator", (size_t[]){heads, tokens, dim, sizeof(float)}, 4, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "the fp32 dQ accumulator", &p->dq_acc));
    }

    FA_CHECK(load_pass(p, &fwd_prog, &p->fwd));
    FA_CHECK(load_pass(p, &bwd_prog, &p->bwd));
    FA_CHECK(opt_in_shared(ctx, &fwd_prog, &p->fwd));
    return opt_in_shared(ctx, &bwd_prog, &p->bwd);
}

fa_status fa_hip_plan_prepare(void *ctx_handle, const fa_plan_s *plan, void **plan_impl) {
    if (!plan_impl) return fa_fail(FA_ERR_NULL_POINTER, "plan_impl is NULL");
    *plan_impl = NULL;
    fa_hip_context *ctx = ctx_handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const fa_attention_desc *d = &plan->desc;
    /* The fused kernels compute every score option; unfused attention has
     * no HIP kernels at all, and names an option first. */
    if (plan->info.algorithm != FA_ALGO_FUSED || d->algorithm != FA_ALGO_FUSED) {
        FA_CHECK(fa_refuse_score_options(d, "HIP (standard algorithm)"));
        return fa_fail(FA_ERR_UNSUPPORTED, "the HIP attention kernels run only FA_ALGO_FUSED");
    }
    if (d->q.dtype != d->k.dtype || d->q.dtype != d->v.dtype || d->q.dtype != d->o.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "the HIP kernels need q, k, v and o of one dtype");
    if (!fa_hip_api_get()) return fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "the HIP runtime is not loaded");

    fa_hip_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a HIP plan");
    p->ctx = ctx;
    int previous;
    fa_status st = fa_hip_enter(ctx, &previous);
    if (st != FA_SUCCESS) {
        free(p);
        return st;
    }
    st = prepare(p, plan);
    fa_hip_leave(ctx, previous);
    if (st != FA_SUCCESS) {
        release_plan(p);
        return st;
    }
    *plan_impl = p;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Launches                                                                  */
/* ------------------------------------------------------------------------ */

#define FA_HIP_MAX_ARGS 64

/* Kernel arguments as hipModuleLaunchKernel takes them: one pointer per
 * argument, to a value of the kernel's parameter type. */
typedef struct hip_args {
    union {
        void *ptr;
        int64_t i64;
        int32_t i32;
        uint32_t u32;
        float f32;
    } slot[FA_HIP_MAX_ARGS];
    void *ptrs[FA_HIP_MAX_ARGS];
    int count;
} hip_args;

static void *arg_slot(hip_args *a) {
    if (a->count >= FA_HIP_MAX_ARGS) return NULL;
    a->ptrs[a->count] = &a->slot[a->count];
    return &a->slot[a->count++];
}
static void arg_ptr(hip_args *a, void *v) {
    void *s = arg_slot(a);
    if (s) memcpy(s, &v, sizeof v);
}
static void arg_i64(hip_args *a, int64_t v) {
    void *s = arg_slot(a);
    if (s) memcpy(s, &v, sizeof v);
}
static void arg_int(hip_args *a, int v) {
    int32_t x = v;
    void *s = arg_slot(a);
    if (s) memcpy(s, &x, sizeof x);
}
static void arg_u32(hip_args *a, uint32_t v) {
    void *s = arg_slot(a);
    if (s) memcpy(s, &v, sizeof v);
}
static void arg_float(hip_args *a, float v) {
    void *s = arg_slot(a);
    if (s) memcpy(s, &v, sizeof v);
}
static void arg_layout(hip_args *a, const fa_layout *l) {
    arg_i64(a, l->offset);
    arg_i64(a, l->stride_batch);
    arg_i64(a, l->stride_seq);
    arg_i64(a, l->stride_head);
}

/* A parameter block passed by value (hipModuleLaunchKernel copies what
 * the pointer points at, the block's size as the kernel declares it). */
static void arg_block(hip_args *a, void *block) {
    if (a->count < FA_HIP_MAX_ARGS) a->ptrs[a->count++] = block;
}

static void *ptr_of(void *buffer) { return ((fa_hip_buffer *)buffer)->ptr; }

/* The arguments fa_forward and the backward kernels share after their
 * tensors (sizes, masks, dropout), in the kernels' order. */
static void mask_args(hip_args *a, const fa_hip_plan *p, const fa_plan_s *plan, void *tiles, int tile_cols) {
    const fa_attention_desc *d = &plan->desc;
    arg_ptr(a, p->cu_q);
    arg_ptr(a, p->cu_k);
    arg_int(a, d->window_left);
    arg_int(a, d->window_right);
    arg_ptr(a, p->block_mask);
    arg_int(a, d->block_mask ? d->block_q : 1);
    arg_int(a, d->block_mask ? d->block_k : 1);
    arg_int(a, p->block_cols);
    arg_ptr(a, tiles);
    arg_int(a, tile_cols);
    arg_u32(a, plan->dropout_key.key0);
    arg_u32(a, plan->dropout_key.key1);
    arg_u32(a, plan->dropout_key.offset_lo);
    arg_u32(a, plan->dropout_threshold);
    arg_float(a, p->drop_scale);
    /* The origin is read at every pass: a ring sets it after the plan is
     * prepared (fa_plan_set_dropout_origin). */
    arg_u32(a, (uint32_t)plan->drop_row0);
    arg_u32(a, (uint32_t)plan->drop_col0);
}

/* The score options' arguments, last in every attention kernel's list
 * (FA_SCORE_PARAMS in kernels_hip/common.h); bias: the pass's buffer, NULL
 * without one. */
static void score_args(hip_args *a, const fa_hip_plan *p, const fa_plan_s *plan, void *bias) {
    const fa_attention_desc *d = &plan->desc;
    arg_float(a, plan->scale);
    arg_float(a, p->cap_in);
    arg_float(a, d->softcap);
    arg_ptr(a, p->slopes);
    arg_ptr(a, bias ? ptr_of(bias) : NULL);
    arg_i64(a, bias ? d->bias.offset : 0);
    arg_i64(a, p->bias_sb);
    arg_i64(a, p->bias_sh);
    arg_i64(a, p->bias_ss);
}

fa_status fa_hip_launch(const fa_hip_context *ctx, hipFunction_t fn, const char *name, size_t gx, size_t gy,
                        size_t gz, unsigned block, size_t shared, void **args) {
    if (gx == 0 || gy == 0 || gz == 0) return FA_SUCCESS;
    if (gx > 0x7fffffffu || gy > FA_HIP_MAX_GRID_YZ || gz > FA_HIP_MAX_GRID_YZ)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s: grid %zu x %zu x %zu exceeds the device's (2^31 - 1) x %u x %u", name,
                       gx, gy, gz, FA_HIP_MAX_GRID_YZ, FA_HIP_MAX_GRID_YZ);
    const fa_hip_api *api = fa_hip_api_get();
    hipError_t err = api->hipModuleLaunchKernel(fn, (unsigned)gx, (unsigned)gy, (unsigned)gz, block, 1, 1,
                                                (unsigned)shared, ctx->stream, args, NULL);
    if (err != hipSuccess) {
        char what[96];
        snprintf(what, sizeof what, "hipModuleLaunchKernel(%s)", name);
        return fa_hip_error(err, what);
    }
    return FA_SUCCESS;
}

static fa_status launch(const fa_hip_plan *p, hipFunction_t fn, const char *name, size_t gx, size_t gy, size_t gz,
                        unsigned block, size_t shared, hip_args *a) {
    if (a->count >= FA_HIP_MAX_ARGS) return fa_fail(FA_ERR_INTERNAL, "%s: too many kernel arguments", name);
    return fa_hip_launch(p->ctx, fn, name, gx, gy, gz, block, shared, a->ptrs);
}

static fa_status record(fa_hip_plan *p, hipEvent_t ev) {
    hipError_t err = fa_hip_api_get()->hipEventRecord(ev, p->ctx->stream);
    return err == hipSuccess ? FA_SUCCESS : fa_hip_error(err, "hipEventRecord");
}

/* splitk.hip's merge of a split forward (kernel fn of the forward pass)
 * into o and lse (NULL: a KV-cache step's caller wants no L); nothing
 * without splits. */
static fa_status launch_merge(fa_hip_plan *p, const fa_plan_s *plan, int fn, void *o, void *lse) {
    if (p->num_splits == 1) return FA_SUCCESS;
    const fa_attention_desc *d = &plan->desc;
    hip_args m = {0};
    arg_ptr(&m, p->part_o);
    arg_ptr(&m, p->part_l);
    arg_ptr(&m, o);
    arg_ptr(&m, lse);
    arg_layout(&m, &p->o);
    arg_int(&m, d->seqlen_q);
    arg_int(&m, d->heads_q);
    arg_i64(&m, plan->total_q);
    arg_ptr(&m, p->cu_q);
    arg_int(&m, p->num_splits);
    return launch(p, p->fwd.fn[fn], "fa_splitk_merge", (size_t)d->seqlen_q, (size_t)d->heads_q, (size_t)d->batch,
                  (unsigned)d->head_dim, 0, &m);
}

/* The tensors the forward kernels (fa_forward, fa_forward_mma,
 * fa_kv_attend) take first, then their layouts. */
static void tensor_args(hip_args *a, const fa_hip_plan *p, void *q, void *k, void *v, void *o, void *lse) {
    void *const ptrs[] = {q, k, v, o, lse};
    for (size_t i = 0; i < FA_ARRAY_SIZE(ptrs); i++) arg_ptr(a, ptrs[i]);
    const fa_layout *const layouts[] = {&p->q, &p->k, &p->v, &p->o};
    for (size_t i = 0; i < FA_ARRAY_SIZE(layouts); i++) arg_layout(a, layouts[i]);
}

static fa_status run_forward(fa_hip_plan *p, const fa_plan_s *plan, const fa_fwd_args *args) {
    const fa_attention_desc *d = &plan->desc;
    hip_args a = {0};
    tensor_args(&a, p, ptr_of(args->q), ptr_of(args->k), ptr_of(args->v), ptr_of(args->o), ptr_of(args->lse));
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->seqlen_k);
    arg_int(&a, d->heads_q);
    arg_int(&a, d->heads_q / d->heads_kv);
    arg_i64(&a, plan->total_q);
    arg_float(&a, p->scale_log2);
    mask_args(&a, p, plan, p->fwd_tiles, p->fwd_tile_cols);
    arg_int(&a, p->num_splits);
    arg_ptr(&a, p->part_o);
    arg_ptr(&a, p->part_l);
    score_args(&a, p, plan, args->bias);
    const size_t tiles = ((size_t)d->seqlen_q + (size_t)p->fwd.br - 1) / (size_t)p->fwd.br;
    FA_CHECK(launch(p, p->fwd.fn[0], p->fwd.mma ? "fa_forward_mma" : "fa_forward", tiles, (size_t)d->heads_q,
                    (size_t)d->batch * (size_t)p->num_splits, (unsigned)p->fwd.wg, p->fwd.shared[0], &a));
    return launch_merge(p, plan, 1, ptr_of(args->o), ptr_of(args->lse));
}

/* A timed pass: the context entered and the start event recorded, then
 * (pass_end) the stop event and the context left. */
static fa_status pass_begin(fa_hip_plan *p, int *previous) {
    FA_CHECK(fa_hip_enter(p->ctx, previous));
    p->timed = 0;
    const fa_status st = record(p, p->start);
    if (st != FA_SUCCESS) fa_hip_leave(p->ctx, *previous);
    return st;
}

static fa_status pass_end(fa_hip_plan *p, fa_status st, int previous) {
    if (st == FA_SUCCESS) st = record(p, p->stop);
    if (st == FA_SUCCESS) p->timed = 1;
    fa_hip_leave(p->ctx, previous);
    return st;
}

fa_status fa_hip_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args) {
    (void)ctx;
    fa_hip_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    if (p->kv_cache)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "the plan's descriptor has kv_cache = 1: use fa_forward_kvcache");
    int previous;
    FA_CHECK(pass_begin(p, &previous));
    return pass_end(p, run_forward(p, plan, args), previous);
}

/* The backward kernels' shared arguments (FA_BWD_PARAMS in bwd.hip), the
 * score options' last. */
static void bwd_common_args(hip_args *a, const fa_hip_plan *p, const fa_plan_s *plan, void *bias) {
    const fa_attention_desc *d = &plan->desc;
    arg_layout(a, &p->q);
    arg_layout(a, &p->k);
    arg_layout(a, &p->v);
    arg_layout(a, &p->o);
    arg_int(a, d->seqlen_q);
    arg_int(a, d->seqlen_k);
    arg_int(a, d->heads_q);
    arg_int(a, d->heads_q / d->heads_kv);
    arg_i64(a, plan->total_q);
    arg_float(a, p->scale_log2);
    arg_float(a, plan->scale);
    mask_args(a, p, plan, p->bwd_tiles, p->bwd_tile_cols);
    score_args(a, p, plan, bias);
}

/* The tensors the dK/dV and dQ kernels take first. */
static void bwd_inputs(hip_args *a, const fa_hip_plan *p, const fa_bwd_args *args) {
    arg_ptr(a, ptr_of(args->q));
    arg_ptr(a, ptr_of(args->k));
    arg_ptr(a, ptr_of(args->v));
    arg_ptr(a, ptr_of(args->lse));
    arg_ptr(a, ptr_of(args->dout));
    arg_ptr(a, p->dvec);
}

/* Rows per work-group of the matrix-core backward's row kernels
 * (FA_PREP_ROWS in kernels_hip/bwd_mma.hip) and their work-group. */
#define FA_HIP_PREP_ROWS 32
#define FA_HIP_PREP_THREADS 256

static fa_status run_backward_mma(fa_hip_plan *p, const fa_plan_s *plan, const fa_bwd_args *args) {
    const fa_attention_desc *d = &plan->desc;
    const size_t row_blocks = ((size_t)d->seqlen_q + FA_HIP_PREP_ROWS - 1) / FA_HIP_PREP_ROWS;
    hip_args a = {0};
    arg_ptr(&a, ptr_of(args->o));
    arg_ptr(&a, ptr_of(args->dout));
    arg_ptr(&a, p->dvec);
    arg_ptr(&a, p->bwd.dq_atomic ? p->dq_acc : NULL);
    arg_layout(&a, &p->o);
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->heads_q);
    arg_i64(&a, plan->total_q);
    arg_ptr(&a, p->cu_q);
    FA_CHECK(launch(p, p->bwd.fn[0], "fa_bwd_prep_mma", row_blocks, (size_t)d->heads_q, (size_t)d->batch,
                    FA_HIP_PREP_THREADS, 0, &a));

    hip_args kv = {0};
    bwd_inputs(&kv, p, args);
    arg_ptr(&kv, ptr_of(args->dk));
    arg_ptr(&kv, ptr_of(args->dv));
    arg_ptr(&kv, p->dq_acc);
    bwd_common_args(&kv, p, plan, args->bias);
    const size_t ktiles = ((size_t)d->seqlen_k + (size_t)p->bwd.bc - 1) / (size_t)p->bwd.bc;
    FA_CHECK(launch(p, p->bwd.fn[1], "fa_bwd_dkdv_mma", ktiles, (size_t)d->heads_kv, (size_t)d->batch,
                    (unsigned)p->bwd.wg, p->bwd.shared[1], &kv));

    hip_args q = {0};
    if (p->bwd.dq_atomic) {
        arg_ptr(&q, p->dq_acc);
        arg_ptr(&q, ptr_of(args->dq));
        arg_layout(&q, &p->q);
        arg_int(&q, d->seqlen_q);
        arg_int(&q, d->heads_q);
        arg_i64(&q, plan->total_q);
        arg_ptr(&q, p->cu_q);
        arg_float(&q, plan->scale);
        return launch(p, p->bwd.fn[2], "fa_bwd_dq_convert", row_blocks, (size_t)d->heads_q, (size_t)d->batch,
                      FA_HIP_PREP_THREADS, 0, &q);
    }
    bwd_inputs(&q, p, args);
    arg_ptr(&q, ptr_of(args->dq));
    bwd_common_args(&q, p, plan, args->bias);
    const size_t qtiles = ((size_t)d->seqlen_q + (size_t)p->bwd.br - 1) / (size_t)p->bwd.br;
    return launch(p, p->bwd.fn[2], "fa_bwd_dq_mma", qtiles, (size_t)d->heads_q, (size_t)d->batch,
                  (unsigned)p->bwd.dq_threads, p->bwd.shared[2], &q);
}

static fa_status run_backward(fa_hip_plan *p, const fa_plan_s *plan, const fa_bwd_args *args) {
    if (p->bwd.mma) return run_backward_mma(p, plan, args);
    const fa_attention_desc *d = &plan->desc;
    hip_args a = {0};
    arg_ptr(&a, ptr_of(args->o));
    arg_ptr(&a, ptr_of(args->dout));
    arg_ptr(&a, p->dvec);
    arg_layout(&a, &p->o);
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->heads_q);
    arg_i64(&a, plan->total_q);
    arg_ptr(&a, p->cu_q);
    FA_CHECK(launch(p, p->bwd.fn[0], "fa_bwd_dot", ((size_t)d->seqlen_q + 63) / 64, (size_t)d->heads_q,
                    (size_t)d->batch, 64, 0, &a));

    hip_args kv = {0};
    bwd_inputs(&kv, p, args);
    arg_ptr(&kv, ptr_of(args->dk));
    arg_ptr(&kv, ptr_of(args->dv));
    bwd_common_args(&kv, p, plan, args->bias);
    const size_t ktiles = ((size_t)d->seqlen_k + (size_t)p->bwd.bc - 1) / (size_t)p->bwd.bc;
    FA_CHECK(launch(p, p->bwd.fn[1], "fa_bwd_dkdv", ktiles, (size_t)d->heads_kv, (size_t)d->batch,
                    (unsigned)p->bwd.wg, 0, &kv));

    hip_args q = {0};
    bwd_inputs(&q, p, args);
    arg_ptr(&q, ptr_of(args->dq));
    bwd_common_args(&q, p, plan, args->bias);
    const size_t qtiles = ((size_t)d->seqlen_q + (size_t)p->bwd.br - 1) / (size_t)p->bwd.br;
    return launch(p, p->bwd.fn[2], "fa_bwd_dq", qtiles, (size_t)d->heads_q, (size_t)d->batch, (unsigned)p->bwd.wg,
                  0, &q);
}

fa_status fa_hip_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args) {
    (void)ctx;
    fa_hip_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    if (p->kv_cache) return fa_fail(FA_ERR_INVALID_ARGUMENT, "a KV-cache plan has no backward pass");
    int previous;
    FA_CHECK(pass_begin(p, &previous));
    return pass_end(p, run_backward(p, plan, args), previous);
}

void fa_hip_buffer_locate(void *buf, uint64_t *address, size_t *bytes) {
    const fa_hip_buffer *b = buf;
    *address = (uint64_t)(uintptr_t)b->ptr;
    *bytes = b->bytes;
}

static void *device_ptr(uint64_t address) { return (void *)(uintptr_t)address; }

/* One step of kernels_hip/kvcache.hip, in stream order: the verdicts and
 * the append (one block a sequence), the attention, which reads both, and
 * the merge of its splits. */
static fa_status run_kvcache(fa_hip_plan *p, const fa_plan_s *plan, const fa_kv_tensors *t, fa_kv_params *kv) {
    const fa_attention_desc *d = &plan->desc;
    hip_args w = {0};
    arg_ptr(&w, device_ptr(t->k_cache));
    arg_ptr(&w, device_ptr(t->v_cache));
    arg_layout(&w, &p->k);
    arg_layout(&w, &p->v);
    arg_int(&w, d->seqlen_q);
    arg_int(&w, d->seqlen_k);
    arg_int(&w, d->heads_kv);
    arg_block(&w, kv);
    FA_CHECK(launch(p, p->fwd.fn[0], "fa_kv_prepare", (size_t)d->batch, 1, 1, FA_KV_PREP_THREADS, 0, &w));

    hip_args a = {0};
    tensor_args(&a, p, device_ptr(t->q), device_ptr(t->k_cache), device_ptr(t->v_cache), device_ptr(t->o),
                device_ptr(t->lse));
    arg_int(&a, d->seqlen_q);
    arg_int(&a, d->heads_q);
    arg_int(&a, d->heads_q / d->heads_kv);
    arg_i64(&a, plan->total_q);
    arg_float(&a, plan->scale);
    arg_float(&a, p->scale_log2);
    arg_int(&a, d->window_left);
    arg_int(&a, d->window_right);
    arg_int(&a, p->num_splits);
    arg_ptr(&a, p->part_o);
    arg_ptr(&a, p->part_l);
    arg_block(&a, kv);
    FA_CHECK(launch(p, p->fwd.fn[1], "fa_kv_attend", p->kv_grid[0], p->kv_grid[1], p->kv_grid[2],
                    (unsigned)p->fwd.wg, p->fwd.shared[1], &a));
    return launch_merge(p, plan, 2, device_ptr(t->o), device_ptr(t->lse));
}

fa_status fa_hip_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args) {
    (void)ctx;
    fa_hip_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    if (!p->kv_cache) return fa_fail(FA_ERR_INVALID_ARGUMENT, "the plan's descriptor has kv_cache = 0: use fa_forward");
    fa_kv_params kv = p->kv_base;
    fa_kv_tensors t;
    FA_CHECK(fa_kvcache_bind(&plan->desc, args, fa_hip_buffer_locate, &kv, &t));
    int previous;
    FA_CHECK(pass_begin(p, &previous));
    return pass_end(p, run_kvcache(p, plan, &t, &kv), previous);
}

fa_status fa_hip_last_time_ms(void *ctx, void *plan_impl, double *ms) {
    (void)ctx;
    fa_hip_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    *ms = 0.0;
    if (!p->timed) return fa_fail(FA_ERR_UNSUPPORTED, "no HIP attention pass has run on this plan");
    const fa_hip_api *api = fa_hip_api_get();
    int previous;
    FA_CHECK(fa_hip_enter(p->ctx, &previous));
    float t = 0.0f;
    hipError_t err = api->hipEventSynchronize(p->stop);
    if (err == hipSuccess) err = api->hipEventElapsedTime(&t, p->start, p->stop);
    fa_hip_leave(p->ctx, previous);
    if (err != hipSuccess) return fa_hip_error(err, "hipEventElapsedTime");
    *ms = (double)t;
    return FA_SUCCESS;
}

fa_status fa_hip_plan_kernel_usage(void *plan_impl, fa_pass pass, fa_hip_kernel_usage *usage) {
    fa_hip_plan *p = plan_impl;
    if (!p || !usage) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "usage");
    memset(usage, 0, sizeof *usage);
    const fa_hip_api *api = fa_hip_api_get();
    const hip_pass *hp = pass == FA_PASS_BACKWARD ? &p->bwd : &p->fwd;
    for (int i = 0; i < hp->fn_count; i++) {
        int local = 0, regs = 0, priv = 0;
        hipError_t err = api->hipFuncGetAttribute(&local, HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, hp->fn[i]);
        if (err == hipSuccess) err = api->hipFuncGetAttribute(&regs, HIP_FUNC_ATTRIBUTE_NUM_REGS, hp->fn[i]);
        if (err == hipSuccess) err = api->hipFuncGetAttribute(&priv, HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, hp->fn[i]);
        if (err != hipSuccess) return fa_hip_error(err, "hipFuncGetAttribute");
        if ((size_t)local + hp->shared[i] > usage->local_bytes) usage->local_bytes = (size_t)local + hp->shared[i];
        if (regs > usage->registers) usage->registers = regs;
        if ((size_t)priv > usage->private_bytes) usage->private_bytes = (size_t)priv;
    }
    return FA_SUCCESS;
}
