/* Byte spans within a device buffer: the bounds check each backend's copy
 * makes before handing offsets to its runtime, which would not check them. */
#ifndef FA_SPAN_H
#define FA_SPAN_H

#include "flashattn.h"

#include <stddef.h>

/* FA_SUCCESS when [offset, offset + bytes) lies within buffer_bytes (without
 * computing the overflowing sum); else FA_ERR_OUT_OF_BOUNDS naming what. */
fa_status fa_span_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what);

#endif
