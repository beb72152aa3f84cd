#include "fa_internal.h"

#include <stdio.h>
#include <string.h>

/* Per-thread detail of the last failure: long enough for a compiler log. */
#define FA_MESSAGE_SIZE 16384
static _Thread_local char fa_message[FA_MESSAGE_SIZE];

static const char *const fa_status_names[FA_STATUS_COUNT] = {
    [FA_SUCCESS] = "success",
    [FA_ERR_NULL_POINTER] = "null pointer",
    [FA_ERR_INVALID_SIZE] = "invalid size",
    [FA_ERR_UNSUPPORTED_HEAD_DIM] = "unsupported head_dim",
    [FA_ERR_HEADS_MISMATCH] = "heads_q is not a multiple of heads_kv",
    [FA_ERR_BAD_STRIDE] = "bad strides",
    [FA_ERR_OUT_OF_BOUNDS] = "tensor runs past the end of its buffer",
    [FA_ERR_MISALIGNED] = "misaligned offset or stride",
    [FA_ERR_FOREIGN_BUFFER] = "buffer belongs to another context",
    [FA_ERR_DTYPE_MISMATCH] = "dtype mismatch",
    [FA_ERR_BAD_DROPOUT] = "bad dropout probability",
    [FA_ERR_BAD_MASK] = "bad mask",
    [FA_ERR_BAD_SCALE] = "bad softmax scale",
    [FA_ERR_BAD_SEQLENS] = "bad variable-length sequence offsets",
    [FA_ERR_INVALID_ARGUMENT] = "invalid argument",
    [FA_ERR_BACKEND_UNAVAILABLE] = "backend unavailable",
    [FA_ERR_DEVICE_NOT_FOUND] = "device not found",
    [FA_ERR_OUT_OF_MEMORY] = "out of memory",
    [FA_ERR_COMPILE] = "kernel compilation failed",
    [FA_ERR_LAUNCH] = "kernel launch or device call failed",
    [FA_ERR_UNSUPPORTED] = "not supported by this backend",
    [FA_ERR_IO] = "file system error",
    [FA_ERR_INTERNAL] = "internal error",
};

const char *fa_status_string(fa_status status) {
    if ((int)status < 0 || status >= FA_STATUS_COUNT || !fa_status_names[status])
        return "unknown status";
    return fa_status_names[status];
}

const char *fa_last_error(void) { return fa_message; }

fa_status fa_vfail(fa_status status, const char *fmt, va_list ap) {
    vsnprintf(fa_message, sizeof fa_message, fmt, ap);
    return status;
}

fa_status fa_fail(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fa_vfail(status, fmt, ap);
    va_end(ap);
    return status;
}

void fa_fail_append(const char *text) {
    size_t used = strlen(fa_message);
    if (used + 1 < sizeof fa_message) snprintf(fa_message + used, sizeof fa_message - used, "%s", text);
}

void fa_clear_error(void) { fa_message[0] = '\0'; }

fa_status fa_set_last_error(fa_status status, const char *message) {
    return fa_fail(status, "%s", message ? message : "");
}

const char *fa_version(int *major, int *minor, int *patch) {
    if (major) *major = FA_VERSION_MAJOR;
    if (minor) *minor = FA_VERSION_MINOR;
    if (patch) *patch = FA_VERSION_PATCH;
#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}
