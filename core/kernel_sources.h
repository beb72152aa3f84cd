/* Kernel sources embedded into the library at build time (generated from
 * kernels_cl/, kernels_hip/ and kernels_cuda/ by cmake/embed_kernels.cmake). */
#ifndef FA_KERNEL_SOURCES_H
#define FA_KERNEL_SOURCES_H

#include <stddef.h>

typedef struct fa_kernel_source {
    const char *path;           /* relative to the repository root: "kernels_cl/fwd.cl" */
    const char *text;           /* NUL-terminated */
    size_t size;                /* without the NUL */
} fa_kernel_source;

int fa_kernel_source_count(void);
const fa_kernel_source *fa_kernel_source_get(int index);
/* NULL when no embedded file has that path. */
const fa_kernel_source *fa_kernel_source_find(const char *path);

#endif
