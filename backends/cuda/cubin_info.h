/* Resources of a kernel read from a CUBIN (an ELF image), so that register
 * and local-memory figures do not depend on whether NVRTC forwards ptxas'
 * verbose report into its log (some installations do not). */
#ifndef FA_CUBIN_INFO_H
#define FA_CUBIN_INFO_H

#include <stddef.h>

/* Registers per thread and stack frame bytes (local memory: spills and
 * local arrays) of the entry point `kernel`. Returns 0 and fills both when
 * the image names the kernel with both attributes; -1 otherwise (the
 * outputs are then untouched). Never reads outside [image, image + size). */
int fa_cubin_kernel_resources(const void *image, size_t size, const char *kernel, int *registers,
                              int *frame_bytes);

#endif
