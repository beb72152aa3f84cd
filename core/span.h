/* Byte spans within a device buffer: the bounds check each backend's copy
 * makes before handing offsets to its runtime, which would not check them. */
#ifndef FA_SPAN_H
#define FA_SPAN_H

#include "flashattn.h"

#include <stddef.h>

/* FA_SUCCESS when [offset, offset + bytes) lies within buffer_bytes (without
 * computing the overflowing sum); else FA_ERR_OUT_OF_BOUNDS naming what. */
fa_status fa_span_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what);

/* A copy between host memory and a device buffer, checked as the CUDA and
 * HIP backends' upload and download check it before the runtime sees it:
 * the span first, then the host pointer (host_name: "src", "dst"), which a
 * copy of no bytes may leave NULL. */
fa_status fa_span_copy_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what, const void *host,
                             const char *host_name);

/* The bounds check of the test-interop copies into and out of a native
 * allocation (fa_cuda_native_write and its kin); what is "write" or
 * "read". */
fa_status fa_native_span_check(size_t offset, size_t bytes, size_t allocation_bytes, const char *what);

#endif
