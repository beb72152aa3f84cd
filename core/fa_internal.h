/* Internal helpers shared by core and backends: error reporting. */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"

#include <stdarg.h>

#if defined(__GNUC__)
#define FA_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FA_PRINTF(fmt, args)
#endif

/* Record a failure on the calling thread and return its status, so that
 * call sites read: return fa_fail(FA_ERR_NULL_POINTER, "q is NULL"); */
fa_status fa_fail(fa_status status, const char *fmt, ...) FA_PRINTF(2, 3);
fa_status fa_vfail(fa_status status, const char *fmt, va_list ap);
/* Append more text (a compiler log) to the current thread's message. */
void fa_fail_append(const char *text);
/* Forget the current thread's message (successful calls at the API edge). */
void fa_clear_error(void);

#define FA_CHECK(expr)                                                        \
    do {                                                                      \
        fa_status fa_check_status_ = (expr);                                  \
        if (fa_check_status_ != FA_SUCCESS) return fa_check_status_;          \
    } while (0)

#define FA_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif
