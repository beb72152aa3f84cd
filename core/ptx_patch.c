/* Masked sm_90a lines of NVIDIA PTX unmasked (ptx_patch.h). */
#include "ptx_patch.h"

#include "fa_internal.h"

#include <stdlib.h>
#include <string.h>

static int starts(const char *at, const char *end, const char *word) {
    const size_t n = strlen(word);
    return (size_t)(end - at) >= n && memcmp(at, word, n) == 0;
}

fa_status fa_ptx_unmask_sm90a(const char *ptx, size_t size, char **out, size_t *out_size) {
    if (!ptx || !out || !out_size) return fa_fail(FA_ERR_NULL_POINTER, "fa_ptx_unmask_sm90a: NULL argument");
    *out = NULL;
    *out_size = 0;
    /* The driver's binary may carry its terminating NUL in the size. */
    while (size > 0 && ptx[size - 1] == '\0') size--;
    static const char target[] = ".target sm_9";
    /* One 'a' more at most, at the target. */
    char *text = malloc(size + 2);
    if (!text) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %zu bytes of PTX", size);
    const char *at = ptx, *const end = ptx + size;
    size_t n = 0;
    int retargeted = 0;
    while (at < end) {
        if (starts(at, end, FA_PTX_SM90A_MARK)) {
            at += sizeof FA_PTX_SM90A_MARK - 1;
            continue;
        }
        /* ".target sm_9X" with X a digit and no suffix yet: the 'a' goes
         * after X. Only the first directive (PTX has one). */
        if (!retargeted && starts(at, end, target)) {
            const char *x = at + sizeof target - 1;
            if (x < end && *x >= '0' && *x <= '9') {
                memcpy(text + n, at, (size_t)(x - at) + 1);
                n += (size_t)(x - at) + 1;
                at = x + 1;
                if (at >= end || *at != 'a') text[n++] = 'a';
                retargeted = 1;
                continue;
            }
        }
        text[n++] = *at++;
    }
    if (!retargeted) {
        free(text);
        return fa_fail(FA_ERR_COMPILE, "the program's PTX names no \".target sm_9x\" to build its sm_90a lines for");
    }
    text[n] = '\0';
    *out = text;
    *out_size = n;
    return FA_SUCCESS;
}
