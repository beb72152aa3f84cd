#include "reason.h"

#include <stdarg.h>
#include <stdio.h>

void fa_reason_set(char *dst, size_t dst_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, dst_size, fmt, ap);
    va_end(ap);
}

void fa_reason_copy(char *dst, size_t dst_size, const char *src) {
    if (dst && dst_size > 0) snprintf(dst, dst_size, "%s", src);
}
