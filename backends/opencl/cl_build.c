/* OpenCL program builds through the kernel-binary cache. A cache hit skips
 * the compiler (seconds on some drivers for the larger kernels); anything
 * wrong with a cached binary only costs a rebuild from source. */
#include "cl_runtime_internal.h"

#include "fa_internal.h"
#include "kernel_sources.h"
#include "ptx_patch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FA_CL_STD_OPTION "-cl-std=CL1.2"

char *fa_cl_full_options(const char *options) {
    if (!options) options = "";
    int has_std = strstr(options, "-cl-std=") != NULL;
    size_t len = strlen(options);
    size_t cap = len + sizeof FA_CL_STD_OPTION + 1;
    char *full = malloc(cap);
    if (!full) return NULL;
    if (has_std)
        memcpy(full, options, len + 1);
    else
        snprintf(full, cap, "%s%s%s", options, len ? " " : "", FA_CL_STD_OPTION);
    return full;
}

void fa_cl_program_key(const fa_cl_context *ctx, const char *source, size_t size, const char *full_options,
                       fa_kcache_key *key) {
    const fa_cl_device *d = fa_cl_device_get(ctx->index);
    memset(key, 0, sizeof *key);
    key->backend = "opencl";
    key->source = source;
    key->source_size = size;
    key->options = full_options;
    key->device = d ? d->cache_device : "";
    key->driver = d ? d->cache_driver : "";
}

/* The compiler's log for the context's device, malloc'ed; NULL if none. */
static char *build_log(fa_cl_context *ctx, cl_program program) {
    size_t size = 0;
    if (fa_cl.clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) != CL_SUCCESS ||
        size == 0)
        return NULL;
    char *log = malloc(size + 1);
    if (!log) return NULL;
    if (fa_cl.clGetProgramBuildInfo(program, ctx->device, CL_PROGRAM_BUILD_LOG, size, log, NULL) != CL_SUCCESS) {
        free(log);
        return NULL;
    }
    log[size] = '\0';
    return log;
}

/* A program from a cached binary, or NULL when the driver will not take it
 * (another driver build wrote it, the file was edited, ...). */
static cl_program from_binary(fa_cl_context *ctx, const void *binary, size_t size, const char *options) {
    const unsigned char *bin = binary;
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program program = fa_cl.clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &size, &bin, &status, &err);
    if (!program) return NULL;
    if (err != CL_SUCCESS || status != CL_SUCCESS ||
        fa_cl.clBuildProgram(program, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS) {
        fa_cl.clReleaseProgram(program);
        return NULL;
    }
    return program;
}

/* FLASHATTN_OPENCL_LOG_DIR: every successful build's log (with NVIDIA's
 * -cl-nv-verbose, the registers and spills of each kernel) in that folder,
 * named by a hash of the source and options. Failed builds put theirs in
 * the error message instead. */
static void keep_log(fa_cl_context *ctx, cl_program program, const char *source, size_t size, const char *options) {
    const char *dir = getenv("FLASHATTN_OPENCL_LOG_DIR");
    if (!dir || !dir[0]) return;
    char *log = build_log(ctx, program);
    if (!log) return;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < size; i++) h = (h ^ (uint8_t)source[i]) * 16777619u;
    for (const char *c = options; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
    char path[1024];
    snprintf(path, sizeof path, "%s/opencl-%08x.log", dir, (unsigned)h);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "options: %s\n%s", options, log);
        fclose(f);
    }
    free(log);
}

/* clBuildProgram's failure err on program (what: the build's name) as
 * status `as` (FA_ERR_OUT_OF_MEMORY where the driver ran out) with the
 * compiler's log, the program released. */
static fa_status build_failed(fa_cl_context *ctx, cl_program program, cl_int err, const char *what,
                              const char *options, fa_status as) {
    const char *name = fa_cl_error_name(err);
    char *log = build_log(ctx, program);
    fa_status st = err == CL_OUT_OF_HOST_MEMORY || err == CL_OUT_OF_RESOURCES ? FA_ERR_OUT_OF_MEMORY : as;
    fa_fail(st, "OpenCL %s failed on %s: clBuildProgram: %s (%d), options \"%s\"; build log:\n", what,
            ctx->info.desc.name, name ? name : "unknown OpenCL error", (int)err, options);
    fa_fail_append(log && log[0] ? log : "(the driver gave no log)");
    free(log);
    fa_cl.clReleaseProgram(program);
    return st;
}

static fa_status from_source(fa_cl_context *ctx, const char *source, size_t size, const char *options,
                             cl_program *out) {
    cl_int err = CL_SUCCESS;
    cl_program program = fa_cl.clCreateProgramWithSource(ctx->context, 1, &source, &size, &err);
    if (!program || err != CL_SUCCESS) return fa_cl_error(err != CL_SUCCESS ? err : CL_INVALID_PROGRAM,
                                                          "clCreateProgramWithSource");
    err = fa_cl.clBuildProgram(program, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) return build_failed(ctx, program, err, "build", options, FA_ERR_COMPILE);
    keep_log(ctx, program, source, size, options);
    *out = program;
    return FA_SUCCESS;
}

/* The device binary of a built program, malloc'ed; NULL if the driver gives
 * none (caching is then skipped, not an error). */
static unsigned char *program_binary(cl_program program, size_t *size) {
    size_t bytes = 0;
    if (fa_cl.clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof bytes, &bytes, NULL) != CL_SUCCESS ||
        bytes == 0)
        return NULL;
    unsigned char *bin = malloc(bytes);
    if (!bin) return NULL;
    unsigned char *bins[1] = {bin};
    if (fa_cl.clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) != CL_SUCCESS) {
        free(bin);
        return NULL;
    }
    *size = bytes;
    return bin;
}

/* Whether options define FA_NV_SM90A: the program holds masked sm_90a
 * lines (core/ptx_patch.h). */
static int wants_sm90a(const char *options) {
    static const char flag[] = "-DFA_NV_SM90A";
    for (const char *at = strstr(options, flag); at; at = strstr(at + 1, flag)) {
        const char next = at[sizeof flag - 1];
        if ((at == options || at[-1] == ' ') && (next == '\0' || next == ' ' || next == '=')) return 1;
    }
    return 0;
}

int fa_cl_sm90a_refuse = 0;

/* The source build's PTX with its sm_90a lines unmasked, built again as
 * the program (NVIDIA's OpenCL takes PTX text as a program binary). Every
 * failure is FA_ERR_UNSUPPORTED with its reason (out of memory aside): the
 * driver did not take this route, and the caller may build without it. */
static fa_status sm90a_rebuild(fa_cl_context *ctx, const char *source, size_t size, const char *options,
                               cl_program *program) {
    if (fa_cl_sm90a_refuse)
        return fa_fail(FA_ERR_UNSUPPORTED, "OpenCL build on %s: sm_90a rebuilds refused (test hook)",
                       ctx->info.desc.name);
    size_t bytes = 0;
    unsigned char *ptx = program_binary(*program, &bytes);
    if (!ptx)
        return fa_fail(FA_ERR_UNSUPPORTED, "OpenCL build on %s: the driver gave no PTX to build the sm_90a lines from",
                       ctx->info.desc.name);
    char *text = NULL;
    size_t n = 0;
    fa_status st = fa_ptx_unmask_sm90a((const char *)ptx, bytes, &text, &n);
    free(ptx);
    if (st == FA_ERR_OUT_OF_MEMORY) return st;
    if (st != FA_SUCCESS) {
        char why[512];
        snprintf(why, sizeof why, "%s", fa_last_error());
        return fa_fail(FA_ERR_UNSUPPORTED, "OpenCL build on %s: the program binary is not PTX with sm_90a lines: %s",
                       ctx->info.desc.name, why);
    }
    const unsigned char *bin = (const unsigned char *)text;
    size_t len = n + 1;
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program p = fa_cl.clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &len, &bin, &status, &err);
    free(text);
    if (!p || err != CL_SUCCESS || status != CL_SUCCESS) {
        if (p) fa_cl.clReleaseProgram(p);
        const cl_int e = err != CL_SUCCESS ? err : status != CL_SUCCESS ? status : CL_INVALID_BINARY;
        const char *name = fa_cl_error_name(e);
        return fa_fail(FA_ERR_UNSUPPORTED, "OpenCL build on %s: clCreateProgramWithBinary (sm_90a PTX): %s (%d)",
                       ctx->info.desc.name, name ? name : "unknown OpenCL error", (int)e);
    }
    err = fa_cl.clBuildProgram(p, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) return build_failed(ctx, p, err, "build of the sm_90a PTX", options, FA_ERR_UNSUPPORTED);
    keep_log(ctx, p, source, size, options);
    fa_cl.clReleaseProgram(*program);
    *program = p;
    return FA_SUCCESS;
}

fa_status fa_cl_build_text(fa_cl_context *ctx, const char *source, size_t size, const char *options,
                           int use_cache, cl_program *program, fa_cl_origin *origin) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!source) return fa_fail(FA_ERR_NULL_POINTER, "source is NULL");
    if (!program) return fa_fail(FA_ERR_NULL_POINTER, "program is NULL");
    *program = NULL;
    if (origin) *origin = FA_CL_BUILT_FROM_SOURCE;
    char *full = fa_cl_full_options(options);
    if (!full) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for build options");

    fa_kcache_key key;
    fa_cl_program_key(ctx, source, size, full, &key);
    /* The test hook refuses sm_90a programs however they would come. */
    if (use_cache && !(fa_cl_sm90a_refuse && wants_sm90a(full))) {
        void *bin = NULL;
        size_t bin_size = 0;
        if (fa_kcache_load(&key, &bin, &bin_size) == FA_SUCCESS) {
            cl_program p = bin_size > 0 ? from_binary(ctx, bin, bin_size, full) : NULL;
            free(bin);
            if (p) {
                *program = p;
                if (origin) *origin = FA_CL_LOADED_FROM_CACHE;
                free(full);
                return FA_SUCCESS;
            }
        }
    }

    fa_status st = from_source(ctx, source, size, full, program);
    if (st == FA_SUCCESS && wants_sm90a(full)) {
        st = sm90a_rebuild(ctx, source, size, full, program);
        if (st != FA_SUCCESS) {
            fa_cl.clReleaseProgram(*program);
            *program = NULL;
        }
    }
    if (st == FA_SUCCESS && use_cache) {
        size_t bin_size = 0;
        unsigned char *bin = program_binary(*program, &bin_size);
        /* Storing replaces a rejected entry too. A cache that cannot be
         * written costs only the next compile. */
        if (bin) (void)fa_kcache_store(&key, bin, bin_size);
        free(bin);
    }
    free(full);
    return st;
}

fa_status fa_cl_build(fa_cl_context *ctx, const char *const *paths, int path_count, const char *options,
                      cl_program *program) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!program) return fa_fail(FA_ERR_NULL_POINTER, "program is NULL");
    *program = NULL;
    if (!paths || path_count <= 0) return fa_fail(FA_ERR_INTERNAL, "no kernel source paths given");

    const fa_kernel_source **srcs = malloc((size_t)path_count * sizeof *srcs);
    if (!srcs) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %d source paths", path_count);
    size_t total = 1;
    for (int i = 0; i < path_count; i++) {
        srcs[i] = fa_kernel_source_find(paths[i]);
        if (!srcs[i]) {
            free(srcs);
            return fa_fail(FA_ERR_INTERNAL, "kernel source \"%s\" is not embedded in this library",
                           paths[i] ? paths[i] : "(NULL)");
        }
        /* Each file is preceded by a #line naming it, so the compiler's log
         * points into the file rather than into the concatenation. */
        total += srcs[i]->size + strlen(srcs[i]->path) + 32;
    }
    char *text = malloc(total);
    if (!text) {
        free(srcs);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %zu bytes of kernel source", total);
    }
    size_t at = 0;
    for (int i = 0; i < path_count; i++) {
        at += (size_t)snprintf(text + at, total - at, "#line 1 \"%s\"\n", srcs[i]->path);
        memcpy(text + at, srcs[i]->text, srcs[i]->size);
        at += srcs[i]->size;
        if (srcs[i]->size == 0 || srcs[i]->text[srcs[i]->size - 1] != '\n') text[at++] = '\n';
    }
    text[at] = '\0';
    free(srcs);
    fa_status st = fa_cl_build_text(ctx, text, at, options, 1, program, NULL);
    free(text);
    return st;
}

fa_status fa_cl_create_kernel(cl_program program, const char *name, cl_kernel *out) {
    cl_int err = CL_SUCCESS;
    *out = fa_cl.clCreateKernel(program, name, &err);
    if (*out && err == CL_SUCCESS) return FA_SUCCESS;
    *out = NULL;
    char what[96];
    snprintf(what, sizeof what, "clCreateKernel(%s)", name);
    return fa_cl_error(err != CL_SUCCESS ? err : CL_INVALID_KERNEL, what);
}
