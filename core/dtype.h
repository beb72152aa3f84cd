/* Storage conversions for fp16, bf16 and fp8 e4m3 (round to nearest even), used by the
 * CPU reference, the tests and the host side of every backend. */
#ifndef FA_DTYPE_H
#define FA_DTYPE_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

uint16_t fa_f32_to_f16(float x);
float fa_f16_to_f32(uint16_t h);
uint16_t fa_f32_to_bf16(float x);
float fa_bf16_to_f32(uint16_t b);
/* e4m3 (OCP E4M3FN): round to nearest even, saturating ("satfinite": a
 * finite value or an infinity beyond +-448 gives +-448), NaN to 0x7f with
 * x's sign; and the exact value of a code (NaN for 0x7f and 0xff). */
uint8_t fa_f64_to_e4m3(double x);
double fa_e4m3_to_f64(uint8_t b);

/* Element i of an array of the given dtype, as double / stored from double
 * (rounding once, from double to the storage type through float for
 * fp16/bf16 is NOT used: double -> storage rounds directly to nearest even). */
double fa_load_elem(const void *base, fa_dtype dtype, int64_t index);
void fa_store_elem(void *base, fa_dtype dtype, int64_t index, double value);

/* The build option that selects the element type in every backend's kernel
 * sources ("-DDTYPE_F16", ...): one spelling, so that the OpenCL, CUDA and
 * HIP builds of a plan cannot name the dtype differently. A dtype without
 * an option of its own gets fp32's. */
const char *fa_dtype_build_option(fa_dtype dtype);

#endif
