/* Build options from the environment (FLASHATTN_OPENCL_OPTIONS,
 * FLASHATTN_CUDA_OPTIONS) are appended to a plan's kernel builds to tune
 * them (a register cap, an unroll factor, blocks per SM). They may not
 * change what a kernel computes or the geometry the host launches it with:
 * a -D or -U (NVRTC also --define-macro / --undefine-macro) of a macro the
 * plan's own options define, or of one of the backend's option macros, is
 * refused. */
#ifndef FA_BUILD_OPTIONS_H
#define FA_BUILD_OPTIONS_H

#include "flashattn.h"

/* FA_ERR_INVALID_ARGUMENT naming env_name and the macro when env (may be
 * NULL) defines or undefines a name that plan_options define or that
 * reserved (NULL-terminated) lists. */
fa_status fa_check_env_build_options(const char *env_name, const char *env, const char *plan_options,
                                     const char *const *reserved);

#endif
