#include "span.h"

#include "fa_internal.h"

fa_status fa_span_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what) {
    if (offset > buffer_bytes || bytes > buffer_bytes - offset)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "%s: offset %zu + bytes %zu exceeds the buffer's %zu bytes", what,
                       offset, bytes, buffer_bytes);
    return FA_SUCCESS;
}

fa_status fa_span_copy_check(size_t offset, size_t bytes, size_t buffer_bytes, const char *what, const void *host,
                             const char *host_name) {
    FA_CHECK(fa_span_check(offset, bytes, buffer_bytes, what));
    if (bytes > 0 && !host) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", host_name);
    return FA_SUCCESS;
}

fa_status fa_native_span_check(size_t offset, size_t bytes, size_t allocation_bytes, const char *what) {
    if (offset > allocation_bytes || bytes > allocation_bytes - offset)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "native %s past the end of the allocation", what);
    return FA_SUCCESS;
}
