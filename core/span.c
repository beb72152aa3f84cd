#include "span.h"

#include "fa_internal.h"

fa_status fa_span_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what) {
    if (offset > buffer_bytes || bytes > buffer_bytes - offset)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "%s: offset %zu + bytes %zu exceeds the buffer's %zu bytes", what,
                       offset, bytes, buffer_bytes);
    return FA_SUCCESS;
}
