/* Private declarations of the OpenCL runtime half, shared by cl_runtime.c
 * (loading, contexts, memory, launches), cl_device.c (device queries and the
 * bandwidth probe) and cl_build.c (program builds through the kernel cache),
 * and reached by tests/test_opencl_runtime.c. */
#ifndef FA_CL_RUNTIME_INTERNAL_H
#define FA_CL_RUNTIME_INTERNAL_H

#include "cl_backend.h"
#include "kcache.h"

#include <stddef.h>

/* What init learned of one device; immutable after init except the
 * bandwidth fields of info, which only cl_device.c touches (under its lock). */
typedef struct fa_cl_device {
    cl_platform_id platform;
    cl_device_id device;
    cl_ulong max_alloc_bytes;   /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    char cache_device[256];     /* kernel-cache key: name and arch */
    char cache_driver[256];     /* kernel-cache key: driver and platform version */
    int mma_layout;             /* fa_mma_layout family of its matrix units; 0: none */
    int mma_emulated;           /* that layout in plain OpenCL C (FLASHATTN_OPENCL_MMA_EMULATE) */
    fa_device_info info;
} fa_cl_device;

/* cl_runtime.c: the loader and its symbols. */
fa_status fa_cl_load(char *reason, size_t reason_size);
/* "CL_INVALID_VALUE" for a known code, NULL otherwise. */
const char *fa_cl_error_name(cl_int err);

/* cl_device.c: enumeration (at init) and per-device facts. */
fa_status fa_cl_enumerate(char *reason, size_t reason_size);
int fa_cl_device_count(void);
/* NULL for an index out of range. */
const fa_cl_device *fa_cl_device_get(int index);
/* A snapshot of the device's info, with the bandwidth as currently known. */
fa_status fa_cl_device_info(int index, fa_device_info *info);
/* Measures the device's bandwidth once (or reads it from the kernel cache)
 * through the given context. Never fails: a probe that cannot run leaves the
 * estimate in place. */
void fa_cl_bandwidth_ensure(fa_cl_context *ctx);
/* Test hooks: forget the in-memory result, so the next context reads the
 * disk cache again; count of copy-kernel measurements run by this process. */
void fa_cl_bandwidth_forget(int index);
int fa_cl_bandwidth_probe_count(void);
/* The copy kernel's text (also the bandwidth cache key's source). */
const char *fa_cl_copy_kernel_source(void);

/* cl_build.c. How a program came to be. */
typedef enum fa_cl_origin {
    FA_CL_BUILT_FROM_SOURCE = 0,
    FA_CL_LOADED_FROM_CACHE = 1
} fa_cl_origin;

/* Build one program from source text (size bytes, no NUL needed). With
 * use_cache, the kernel cache is looked up first and filled after a source
 * build; a cached binary that the driver rejects falls back to source.
 * origin may be NULL. */
fa_status fa_cl_build_text(fa_cl_context *ctx, const char *source, size_t size,
                           const char *options, int use_cache, cl_program *program,
                           fa_cl_origin *origin);

/* A program built with FA_NV_SM90A whose sm_90a rebuild (its PTX
 * unmasked and built again) cannot be made fails with FA_ERR_UNSUPPORTED
 * (a source that does not compile fails with FA_ERR_COMPILE), so that a
 * caller may build it without those lines. Test hook: while set, every
 * such rebuild is refused that way. */
extern int fa_cl_sm90a_refuse;

/* The options a build really passes: options plus "-cl-std=CL1.2" unless
 * they already name a standard. malloc'ed; NULL when memory ran out. */
char *fa_cl_full_options(const char *options);
/* The kernel-cache key of a program (key->options = full_options, which the
 * caller keeps alive, as it does source). */
void fa_cl_program_key(const fa_cl_context *ctx, const char *source, size_t size,
                       const char *full_options, fa_kcache_key *key);

#endif
