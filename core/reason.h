/* Reason strings: the fixed-size text a backend keeps to say why it is
 * unavailable, and hands to callers that ask. */
#ifndef FA_REASON_H
#define FA_REASON_H

#include "fa_internal.h"

#include <stddef.h>

/* snprintf into dst: reasons embed loader messages of any length, and
 * truncating them is intended. */
void fa_reason_set(char *dst, size_t dst_size, const char *fmt, ...) FA_PRINTF(3, 4);
/* Copies src into dst when the caller gave room for it (dst may be NULL). */
void fa_reason_copy(char *dst, size_t dst_size, const char *src);

#endif
