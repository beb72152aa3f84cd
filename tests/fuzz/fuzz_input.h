/* The fuzzer's bytes as values. Every reader takes bytes from the front and
 * yields zeros once they run out, so any input, even an empty one, decodes
 * to something. Numeric pickers read one selector byte: most selectors map
 * to a small in-domain value (so mutations walk the valid region), some to
 * an entry of a table of extremes (limits of the type, powers of two, values
 * next to them) and the last few to raw bytes of the full type. */
#ifndef FA_FUZZ_INPUT_H
#define FA_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

uint8_t fz_byte(fz_in *in);
uint32_t fz_u32(fz_in *in);
uint64_t fz_u64(fz_in *in);
/* One byte mapped onto [0, count); count > 0. */
int fz_choose(fz_in *in, int count);

/* An int: small values lo + k * step (k from 0 to (hi - lo) / step), an
 * extreme, or any 32-bit value. */
int fz_int(fz_in *in, int lo, int hi, int step);
/* An int64: small values lo + k * step as fz_int, extremes of int64 and of
 * the offsets and strides a tensor can be given, or any 64-bit value. */
int64_t fz_i64(fz_in *in, int64_t lo, int64_t hi, int64_t step);
/* A size_t: small values in [lo, hi], extremes, or any 64-bit value. */
size_t fz_size(fz_in *in, size_t lo, size_t hi);
/* A float: evenly spaced values in [lo, hi], extremes (NaN, infinities,
 * limits, denormals, values next to 0 and 1) or any bit pattern. */
float fz_float(fz_in *in, float lo, float hi);
double fz_double(fz_in *in, double lo, double hi);

#endif
