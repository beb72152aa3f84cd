/* Overflow-checked integer arithmetic for every size, offset and index that
 * comes from user input (the descriptor, buffer sizes, block masks). The
 * calls follow C23's ckd_add / ckd_mul: they store the result and return
 * nonzero when the exact result does not fit, so chains read
 *     if (fa_ckd_mul_i64(&n, a, b) || fa_ckd_add_i64(&n, n, c)) fail;
 * On overflow *out is unspecified. */
#ifndef FA_CHECKED_H
#define FA_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define FA_HAVE_OVERFLOW_BUILTINS 1
#endif

static inline int fa_ckd_add_i64(int64_t *out, int64_t a, int64_t b) {
#ifdef FA_HAVE_OVERFLOW_BUILTINS
    return __builtin_add_overflow(a, b, out);
#else
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 1;
    *out = a + b;
    return 0;
#endif
}

static inline int fa_ckd_mul_i64(int64_t *out, int64_t a, int64_t b) {
#ifdef FA_HAVE_OVERFLOW_BUILTINS
    return __builtin_mul_overflow(a, b, out);
#else
    if (a == 0 || b == 0) {
        *out = 0;
        return 0;
    }
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : a < INT64_MAX / b))
        return 1;
    *out = a * b;
    return 0;
#endif
}

static inline int fa_ckd_add_size(size_t *out, size_t a, size_t b) {
#ifdef FA_HAVE_OVERFLOW_BUILTINS
    return __builtin_add_overflow(a, b, out);
#else
    if (a > SIZE_MAX - b) return 1;
    *out = a + b;
    return 0;
#endif
}

static inline int fa_ckd_mul_size(size_t *out, size_t a, size_t b) {
#ifdef FA_HAVE_OVERFLOW_BUILTINS
    return __builtin_mul_overflow(a, b, out);
#else
    if (b != 0 && a > SIZE_MAX / b) return 1;
    *out = a * b;
    return 0;
#endif
}

/* A non-negative int64 as a size_t; nonzero when negative or too large
 * (32-bit hosts). */
static inline int fa_ckd_size_of_i64(size_t *out, int64_t v) {
    if (v < 0 || (uint64_t)v > (uint64_t)SIZE_MAX) return 1;
    *out = (size_t)v;
    return 0;
}

#endif
