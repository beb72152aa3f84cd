/* The CUDA backend's one way of compiling a program with NVRTC, shared by
 * the fused kernels (cuda_attention.c) and standard attention
 * (cuda_standard.c).
 *
 * A program is an embedded .cu file (core/kernel_sources.h), the embedded
 * headers it includes by file name, its -D options and the entry points it
 * defines. It is compiled for a compute capability as real code (CUBIN)
 * when NVRTC knows that architecture, else as PTX of the newest virtual
 * architecture below it, which the driver finishes; always with
 * --ptxas-options=-v.
 *
 * Kernel cache (core/kcache.h). The binary is keyed by the program's text
 * with its headers', the options, the architecture and the NVRTC version;
 * its log by the same key under "cuda_log". A cached CUBIN is a hit by
 * itself (it states each kernel's registers and stack); cached PTX only
 * beside a log holding ptxas' report of every kernel. That way the reports
 * below never depend on which process compiled first.
 *
 * Reports. Registers and the stack frame come from the CUBIN itself
 * (cubin_info.h), because NVRTC does not copy ptxas' verbose report into
 * its log on every installation. Spill stores and loads come from the log
 * where it has them; where it does not, a stack frame of 0 bytes means
 * nothing spilled. PTX carries neither, so its figures come from the log
 * alone (-1 where it says nothing).
 *
 * FLASHATTN_CUDA_LOG_DIR, when set, keeps every compile log as
 * <dir>/<program>-<arch>-<options hash>.log, first line "options: ...".
 *
 * This header names no vendor type: tests include it without the CUDA
 * toolkit's include directory. */
#ifndef FA_CUDA_COMPILE_H
#define FA_CUDA_COMPILE_H

#include "cuda_runtime_internal.h"

#include <stddef.h>

#define FA_CUDA_MAX_KERNELS 8

typedef struct fa_cuda_program {
    const char *source;           /* embedded path: "kernels_cuda/fwd_mma.cu" */
    const char *const *headers;   /* embedded paths, included by file name */
    int nheaders;
    const char *defines;          /* -D options separated by spaces; "" for none */
    const char *const *kernels;   /* entry points, at most FA_CUDA_MAX_KERNELS */
    int nkernels;
    int arch_specific;            /* 1: the device's own architecture with its
                                     "a" features (sm_90a: wgmma), or an error */
} fa_cuda_program;

typedef struct fa_cuda_binary {
    void *data;                   /* CUBIN, or NUL-terminated PTX */
    size_t size;
    int cubin;                    /* 1: CUBIN; 0: PTX */
    char *log;                    /* NUL-terminated, never NULL on success */
    int from_cache;
    double seconds;               /* 0 for a cache hit */
    char arch[32];                /* the target: "sm_90", or "compute_90" for PTX */
    /* One per kernel of the program, in its order: program (the source's
     * file name without extension), kernel, options (the defines), arch
     * ("sm_<cc>"), from_cache, real_code, binary_bytes, compile_seconds and
     * the resources above. pass, threads, shared_bytes and tensor_cores are
     * left 0 for the caller. */
    fa_cuda_kernel_report reports[FA_CUDA_MAX_KERNELS];
    int nreports;
} fa_cuda_binary;

/* Compiles prog for compute capability cc_major.cc_minor. With lookup set,
 * the kernel cache is tried first; a fresh binary is stored in it either
 * way. FA_ERR_UNSUPPORTED when NVRTC cannot be loaded, FA_ERR_COMPILE with
 * NVRTC's log for a compile error, FA_ERR_INTERNAL for a source that is not
 * embedded or a binary lacking one of the kernels. On failure *out holds
 * nothing to free. */
fa_status fa_cuda_compile(const fa_cuda_program *prog, int cc_major, int cc_minor, int lookup, fa_cuda_binary *out);
void fa_cuda_binary_free(fa_cuda_binary *bin);

/* A small program a context compiles on first use (the ring's rows, the
 * benchmarks' read), compiled as the context would on a device of
 * compute capability cc_major.cc_minor, no device needed: one report per
 * kernel into reports (up to max_reports), threads set to the program's
 * block size; *count receives how many kernels it has. */
fa_status fa_cuda_program_report(const fa_cuda_program *prog, int cc_major, int cc_minor, int threads,
                                 fa_cuda_kernel_report *reports, int max_reports, int *count);

/* Registers, stack and spills of one kernel of bin, by the rules above,
 * from bin's binary and bin->log; only those four fields of rep change. */
void fa_cuda_kernel_resources(const fa_cuda_binary *bin, const char *kernel, fa_cuda_kernel_report *rep);

#endif
