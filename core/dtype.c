/* fp16 / bf16 / fp8 (e4m3) storage conversions.
 *
 * Every narrowing conversion goes through one routine that rounds a double
 * straight to the target format. A float widens to double exactly, so the
 * float entry points round once as well, and fa_store_elem never rounds
 * twice (double -> float -> half can land on the wrong side of a tie). */
#include "dtype.h"

#include <math.h>
#include <string.h>

size_t fa_dtype_size(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_FP8_E4M3: return 1;
    }
    return 0;
}

const char *fa_dtype_name(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return "fp32";
    case FA_DTYPE_F16: return "fp16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_FP8_E4M3: return "fp8_e4m3";
    }
    return "unknown";
}

const char *fa_dtype_build_option(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F16: return "-DDTYPE_F16";
    case FA_DTYPE_BF16: return "-DDTYPE_BF16";
    default: return "-DDTYPE_F32";
    }
}

/* Round x to a binary format with 1 sign bit, exp_bits exponent bits and
 * mant_bits stored significand bits (IEEE layout, subnormals, infinities),
 * to nearest, ties to even. */
static uint16_t round_f64_to_small(double x, int exp_bits, int mant_bits) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 63) << (exp_bits + mant_bits));
    int exp_field = (int)((bits >> 52) & 0x7ff);
    uint64_t frac = bits & ((UINT64_C(1) << 52) - 1);
    uint16_t inf = (uint16_t)(((1u << exp_bits) - 1u) << mant_bits);

    if (exp_field == 0x7ff) {
        if (frac == 0) return (uint16_t)(sign | inf);
        /* Keep the top of the payload, but always set the quiet bit: a
         * payload living only in the dropped low bits must not turn the
         * NaN into an infinity. */
        uint16_t payload = (uint16_t)(frac >> (52 - mant_bits));
        uint16_t quiet = (uint16_t)(1u << (mant_bits - 1));
        return (uint16_t)(sign | inf | quiet | payload);
    }
    /* Double subnormals are far below the smallest fp16/bf16 subnormal. */
    if (exp_field == 0) return sign;

    int bias = (1 << (exp_bits - 1)) - 1;
    int e = exp_field - 1023;          /* unbiased exponent of x */
    int emin = 1 - bias;               /* exponent of the smallest normal */
    if (e > bias) return (uint16_t)(sign | inf);
    /* Below half the smallest subnormal (2^(emin - mant_bits - 1)), and at
     * exactly half (a tie with the even zero), the result is zero. */
    if (e < emin - mant_bits - 1) return sign;

    uint64_t sig = frac | (UINT64_C(1) << 52); /* 53-bit significand */
    int shift = 52 - mant_bits;
    if (e < emin) shift += emin - e;           /* subnormal result */
    uint64_t q = sig >> shift;
    uint64_t rem = sig & ((UINT64_C(1) << shift) - 1);
    uint64_t half = UINT64_C(1) << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;

    /* For a normal result q still carries the implicit bit, which adds one
     * to the biased exponent: hence e + bias - 1. A carry out of the
     * significand moves into the exponent, up to infinity, as it should. A
     * subnormal rounding up to 2^emin lands on the smallest normal. */
    uint64_t out = e >= emin ? ((uint64_t)(e + bias - 1) << mant_bits) + q : q;
    return (uint16_t)(sign | out);
}

uint16_t fa_f32_to_f16(float x) { return round_f64_to_small((double)x, 5, 10); }

uint16_t fa_f32_to_bf16(float x) { return round_f64_to_small((double)x, 8, 7); }

float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        /* Subnormal (or zero): mant * 2^-24, exact in float. */
        float mag = ldexpf((float)mant, -24);
        return sign ? -mag : mag;
    } else {
        bits = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

float fa_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* e4m3 (OCP E4M3FN): exponent bias 7, the smallest normal 2^-6, subnormals
 * in steps of 2^-9, the top code of each sign (S.1111.111) NaN, no
 * infinities. */
#define E4M3_MAX 448.0
#define E4M3_EMIN (-6)
#define E4M3_MANT 3

uint8_t fa_f64_to_e4m3(double x) {
    const uint8_t sign = signbit(x) ? 0x80u : 0u;
    if (isnan(x)) return (uint8_t)(sign | 0x7fu);
    double a = fabs(x);
    if (a >= E4M3_MAX) return (uint8_t)(sign | 0x7eu); /* satfinite, infinities included */
    if (a == 0.0) return sign;
    /* a = m * 2^e2 with m in [0.5, 1): the unbiased exponent is e2 - 1,
     * clamped at the smallest normal's (subnormals share its quantum). */
    int e2;
    (void)frexp(a, &e2);
    int e = e2 - 1 < E4M3_EMIN ? E4M3_EMIN : e2 - 1;
    /* Scaling by powers of two is exact here (a is far from double's
     * limits): q < 16 carries the significand with its implicit bit. */
    const double q = ldexp(a, E4M3_MANT - e);
    double n = floor(q);
    const double rem = q - n;
    if (rem > 0.5 || (rem == 0.5 && fmod(n, 2.0) != 0.0)) n += 1.0;
    /* A carry to 16 moves to the next binade; past 448 it saturates. */
    const double r = ldexp(n, e - E4M3_MANT);
    if (r >= E4M3_MAX) return (uint8_t)(sign | 0x7eu);
    if (r == 0.0) return sign;
    (void)frexp(r, &e2);
    e = e2 - 1;
    if (e < E4M3_EMIN) return (uint8_t)(sign | (uint8_t)ldexp(r, 9)); /* subnormal: r / 2^-9 */
    const unsigned mant = (unsigned)ldexp(r, E4M3_MANT - e) - 8u;
    return (uint8_t)(sign | (unsigned)(e + 7) << E4M3_MANT | mant);
}

double fa_e4m3_to_f64(uint8_t b) {
    const unsigned exp = (b >> E4M3_MANT) & 0xfu, mant = b & 0x7u;
    double mag;
    if (exp == 0xfu && mant == 0x7u) mag = NAN;
    else if (exp == 0) mag = ldexp((double)mant, -9);
    else mag = ldexp((double)(8u + mant), (int)exp - 7 - E4M3_MANT);
    return (b & 0x80u) ? -mag : mag;
}

double fa_load_elem(const void *base, fa_dtype dtype, int64_t index) {
    switch (dtype) {
    case FA_DTYPE_F32: return (double)((const float *)base)[index];
    case FA_DTYPE_F16: return (double)fa_f16_to_f32(((const uint16_t *)base)[index]);
    case FA_DTYPE_BF16: return (double)fa_bf16_to_f32(((const uint16_t *)base)[index]);
    case FA_DTYPE_FP8_E4M3: return fa_e4m3_to_f64(((const uint8_t *)base)[index]);
    }
    return NAN;
}

void fa_store_elem(void *base, fa_dtype dtype, int64_t index, double value) {
    switch (dtype) {
    case FA_DTYPE_F32: ((float *)base)[index] = (float)value; break;
    case FA_DTYPE_F16: ((uint16_t *)base)[index] = round_f64_to_small(value, 5, 10); break;
    case FA_DTYPE_BF16: ((uint16_t *)base)[index] = round_f64_to_small(value, 8, 7); break;
    case FA_DTYPE_FP8_E4M3: ((uint8_t *)base)[index] = fa_f64_to_e4m3(value); break;
    }
}
