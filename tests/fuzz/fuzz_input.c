#include "fuzz_input.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* Selector ranges: [0, SMALL_END) small, [SMALL_END, EXTREME_END) a table
 * entry, the rest raw bytes. */
#define SMALL_END 216
#define EXTREME_END 248
#define EXTREME_COUNT (EXTREME_END - SMALL_END)

uint8_t fz_byte(fz_in *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

uint32_t fz_u32(fz_in *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_byte(in) << (8 * i);
    return v;
}

uint64_t fz_u64(fz_in *in) {
    uint64_t lo = fz_u32(in);
    return lo | (uint64_t)fz_u32(in) << 32;
}

int fz_choose(fz_in *in, int count) { return fz_byte(in) % count; }

static const int64_t int_extremes[EXTREME_COUNT] = {
    0, -1, 1, 2, -2, 3, 7, 8, 9, 15, 16, 17, 255, 256, 257, 4096,
    65535, 65536, 1 << 20, 1 << 24, (1 << 30) - 1, 1 << 30, INT_MAX / 2 + 1, INT_MAX - 8,
    INT_MAX - 1, INT_MAX, INT_MIN, INT_MIN + 1, -65536, -(1 << 30), -16, -8};

static const int64_t i64_extremes[EXTREME_COUNT] = {
    0, -1, 1, -16, 16, 4096, INT32_MAX, INT32_MIN,
    (int64_t)UINT32_MAX, INT64_C(1) << 32, INT64_C(1) << 31, INT64_C(1) << 40,
    INT64_C(1) << 48, (INT64_C(1) << 62) - 4, INT64_C(1) << 62, (INT64_C(1) << 62) + 4,
    INT64_C(1) << 61, (INT64_C(1) << 61) - 8, INT64_MAX, INT64_MAX - 15,
    INT64_MAX / 2, INT64_MAX / 4, INT64_MAX / 8 + 8, INT64_MIN,
    INT64_MIN + 16, -(INT64_C(1) << 62), INT64_MIN / 4, INT64_C(1) << 56,
    (INT64_C(1) << 60) + 16, INT64_C(0x7ffffffffff0), 1 << 20, INT64_C(3) << 61};

static int64_t pick(fz_in *in, int64_t lo, int64_t hi, int64_t step, const int64_t *table, int raw64) {
    uint8_t s = fz_byte(in);
    if (s < SMALL_END) {
        if (step <= 0) step = 1;
        if (hi < lo) hi = lo;
        uint64_t span = (uint64_t)(hi - lo) / (uint64_t)step + 1;
        return lo + (int64_t)((uint64_t)s % span) * step;
    }
    if (s < EXTREME_END) return table[s - SMALL_END];
    return raw64 ? (int64_t)fz_u64(in) : (int64_t)(int32_t)fz_u32(in);
}

int fz_int(fz_in *in, int lo, int hi, int step) {
    /* Every table entry and every small value fits in int. */
    return (int)pick(in, lo, hi, step, int_extremes, 0);
}

int64_t fz_i64(fz_in *in, int64_t lo, int64_t hi, int64_t step) {
    return pick(in, lo, hi, step, i64_extremes, 1);
}

size_t fz_size(fz_in *in, size_t lo, size_t hi) {
    uint8_t s = fz_byte(in);
    if (s < SMALL_END) {
        /* Two more bytes: small sizes reach a few tens of kilobytes. */
        size_t r = fz_byte(in);
        r |= (size_t)fz_byte(in) << 8;
        return lo + r % (hi - lo + 1);
    }
    static const uint64_t size_extremes[EXTREME_COUNT] = {
        0, 1, 2, 3, 4, 8, 15, 16, 17, 255, 256, 4095, 4096, 4097, 65535, 65536,
        UINT32_MAX, (uint64_t)1 << 32, (uint64_t)1 << 40, (uint64_t)1 << 41, (uint64_t)1 << 48,
        (uint64_t)1 << 62, (uint64_t)1 << 63, UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - 15,
        UINT64_MAX / 2, UINT64_MAX / 2 + 1, UINT64_MAX / 4, UINT64_MAX / 8, UINT64_MAX / 16, 7};
    if (s < EXTREME_END) return (size_t)size_extremes[s - SMALL_END];
    return (size_t)fz_u64(in);
}

/* The small or extreme double a selector below EXTREME_END names. */
static double double_from(uint8_t s, double lo, double hi) {
    if (s < SMALL_END) return lo + (hi - lo) * (double)s / (double)(SMALL_END - 1);
    static const double extremes[EXTREME_COUNT] = {
        0.0, -0.0, NAN, -NAN, INFINITY, -INFINITY, DBL_MAX, -DBL_MAX,
        FLT_MAX, -FLT_MAX, 3.0e38, DBL_MIN, FLT_MIN, 4.9e-324, 1.4e-45, 1.0,
        -1.0, 0.5, 0.99999999999999989, 1.0000000000000002, 0.9999999, 1.0000001, 1e-30, 1e30,
        65504.0, 65520.0, 1e300, 0.1, 2.0, 1e-7, 4294967296.0, 9.2233720368547758e18};
    return extremes[s - SMALL_END];
}

double fz_double(fz_in *in, double lo, double hi) {
    uint8_t s = fz_byte(in);
    if (s < EXTREME_END) return double_from(s, lo, hi);
    uint64_t bits = fz_u64(in);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

float fz_float(fz_in *in, float lo, float hi) {
    uint8_t s = fz_byte(in);
    if (s < EXTREME_END) {
        double v = double_from(s, lo, hi);
        /* Out-of-range conversions are undefined in C: round them by hand. */
        if (v > FLT_MAX) return INFINITY;
        if (v < -FLT_MAX) return -INFINITY;
        return (float)v;
    }
    uint32_t bits = fz_u32(in);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}
