/* fp16 / bf16 storage conversions: exhaustive round trips, ties to even,
 * overflow, subnormals and NaN handling. */
#include "dtype.h"
#include "harness.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static float bits_to_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* Value of an fp16 pattern from the IEEE definition, independently of the
 * library's decoder; NaN for NaN patterns. */
static double f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double mag;
    if (exp == 0x1f) mag = mant ? NAN : INFINITY;
    else if (exp == 0) mag = ldexp((double)mant, -24);
    else mag = ldexp(1.0 + mant / 1024.0, exp - 15);
    return sign ? -mag : mag;
}

static double bf16_value(uint16_t b) {
    int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
    double mag;
    if (exp == 0xff) mag = mant ? NAN : INFINITY;
    else if (exp == 0) mag = ldexp((double)mant, -133);
    else mag = ldexp(1.0 + mant / 128.0, exp - 127);
    return sign ? -mag : mag;
}

static int f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static int bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

static uint16_t store_f16(double x) {
    uint16_t h;
    fa_store_elem(&h, FA_DTYPE_F16, 0, x);
    return h;
}

static uint16_t store_bf16(double x) {
    uint16_t b;
    fa_store_elem(&b, FA_DTYPE_BF16, 0, x);
    return b;
}

FA_TEST(f16_exhaustive_round_trip) {
    int bad_value = 0, bad_trip = 0, bad_nan = 0, bad_load = 0, bad_store = 0;
    for (uint32_t pattern = 0; pattern < 65536; pattern++) {
        uint16_t h = (uint16_t)pattern;
        float f = fa_f16_to_f32(h);
        double expect = f16_value(h);
        uint16_t back = fa_f32_to_f16(f);
        uint16_t back_store = store_f16((double)f);
        double loaded = fa_load_elem(&h, FA_DTYPE_F16, 0);
        if (isnan(expect)) {
            /* NaN stays NaN with its sign, through both directions. */
            if (!isnan(f) || !f16_is_nan(back) || !f16_is_nan(back_store) ||
                (back & 0x8000) != (h & 0x8000) || !!signbit(f) != !!(h & 0x8000))
                bad_nan++;
            if (!isnan(loaded)) bad_load++;
            continue;
        }
        if ((double)f != expect || !!signbit(f) != !!(h & 0x8000)) bad_value++;
        if (back != h) bad_trip++;
        if (back_store != h) bad_store++;
        if (loaded != expect) bad_load++;
    }
    CHECK_MSG(bad_value == 0, "%d patterns decode to the wrong value", bad_value);
    CHECK_MSG(bad_trip == 0, "%d patterns do not survive fp16 -> fp32 -> fp16", bad_trip);
    CHECK_MSG(bad_store == 0, "%d patterns do not survive fa_store_elem", bad_store);
    CHECK_MSG(bad_nan == 0, "%d NaN patterns lost their NaN-ness or sign", bad_nan);
    CHECK_MSG(bad_load == 0, "%d patterns load wrongly", bad_load);
}

FA_TEST(bf16_exhaustive_round_trip) {
    int bad_value = 0, bad_trip = 0, bad_nan = 0;
    for (uint32_t pattern = 0; pattern < 65536; pattern++) {
        uint16_t b = (uint16_t)pattern;
        float f = fa_bf16_to_f32(b);
        double expect = bf16_value(b);
        uint16_t back = fa_f32_to_bf16(f);
        uint16_t back_store = store_bf16((double)f);
        if (isnan(expect)) {
            if (!isnan(f) || !bf16_is_nan(back) || !bf16_is_nan(back_store) ||
                (back & 0x8000) != (b & 0x8000))
                bad_nan++;
            continue;
        }
        if ((double)f != expect || !!signbit(f) != !!(b & 0x8000)) bad_value++;
        if (back != b || back_store != b) bad_trip++;
    }
    CHECK_MSG(bad_value == 0, "%d patterns decode to the wrong value", bad_value);
    CHECK_MSG(bad_trip == 0, "%d patterns do not survive bf16 -> fp32 -> bf16", bad_trip);
    CHECK_MSG(bad_nan == 0, "%d NaN patterns lost their NaN-ness or sign", bad_nan);
}

/* Every exact midpoint between two neighbouring finite fp16 values (both
 * signs, subnormals included) rounds to the one with an even pattern; a hair
 * above or below rounds to the nearer one. */
FA_TEST(f16_ties_to_even) {
    int bad_tie = 0, bad_above = 0, bad_below = 0, bad_direct = 0, ties = 0;
    for (uint16_t mag = 0; mag < 0x7bff; mag++) {
        for (int neg = 0; neg < 2; neg++) {
            uint16_t lo = (uint16_t)(mag | (neg ? 0x8000 : 0));
            uint16_t hi = (uint16_t)(lo + 1);
            double a = f16_value(lo), c = f16_value(hi);
            double mid = 0.5 * (a + c);      /* exact: 12 significant bits */
            float midf = (float)mid;
            if ((double)midf != mid) {
                bad_tie++;
                continue;
            }
            ties++;
            uint16_t even = (lo & 1) ? hi : lo;
            if (fa_f32_to_f16(midf) != even || store_f16(mid) != even) bad_tie++;
            /* Away from zero is "above" in magnitude for either sign. */
            float above = nextafterf(midf, neg ? -INFINITY : INFINITY);
            float below = nextafterf(midf, 0.0f);
            if (fa_f32_to_f16(above) != hi) bad_above++;
            if (fa_f32_to_f16(below) != lo) bad_below++;
            /* Just past the tie by far less than a float ulp: a double
             * rounded through float would land on the tie and go to even;
             * rounding the double directly must go to the nearer value. */
            double tiny = ldexp(fabs(c - a), -40);
            double past = neg ? mid - tiny : mid + tiny;
            double before = neg ? mid + tiny : mid - tiny;
            if (store_f16(past) != hi || store_f16(before) != lo) bad_direct++;
        }
    }
    CHECK(ties > 60000);
    CHECK_MSG(bad_tie == 0, "%d ties not rounded to even", bad_tie);
    CHECK_MSG(bad_above == 0, "%d values just above a tie not rounded up", bad_above);
    CHECK_MSG(bad_below == 0, "%d values just below a tie not rounded down", bad_below);
    CHECK_MSG(bad_direct == 0, "%d doubles rounded twice (through float)", bad_direct);
    /* Hand-made cases: 1 + 2^-11 is the tie between 1 and 1 + 2^-10. */
    CHECK(fa_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
    CHECK(fa_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
    CHECK(store_f16(1.0 + 0x1p-11 + 0x1p-40) == 0x3c01);
}

FA_TEST(bf16_ties_to_even) {
    int bad_tie = 0, bad_above = 0, bad_below = 0, bad_direct = 0, ties = 0;
    for (uint16_t mag = 0; mag < 0x7f7f; mag++) {
        for (int neg = 0; neg < 2; neg++) {
            uint16_t lo = (uint16_t)(mag | (neg ? 0x8000 : 0));
            uint16_t hi = (uint16_t)(lo + 1);
            double a = bf16_value(lo), c = bf16_value(hi);
            double mid = 0.5 * (a + c);
            float midf = (float)mid;
            if ((double)midf != mid) {
                bad_tie++;
                continue;
            }
            ties++;
            uint16_t even = (lo & 1) ? hi : lo;
            if (fa_f32_to_bf16(midf) != even || store_bf16(mid) != even) bad_tie++;
            float above = nextafterf(midf, neg ? -INFINITY : INFINITY);
            float below = nextafterf(midf, 0.0f);
            if (fa_f32_to_bf16(above) != hi) bad_above++;
            if (fa_f32_to_bf16(below) != lo) bad_below++;
            double tiny = ldexp(fabs(c - a), -40);
            double past = neg ? mid - tiny : mid + tiny;
            double before = neg ? mid + tiny : mid - tiny;
            if (store_bf16(past) != hi || store_bf16(before) != lo) bad_direct++;
        }
    }
    CHECK(ties > 60000);
    CHECK_MSG(bad_tie == 0, "%d ties not rounded to even", bad_tie);
    CHECK_MSG(bad_above == 0, "%d values just above a tie not rounded up", bad_above);
    CHECK_MSG(bad_below == 0, "%d values just below a tie not rounded down", bad_below);
    CHECK_MSG(bad_direct == 0, "%d doubles rounded twice (through float)", bad_direct);
    CHECK(fa_f32_to_bf16(bits_to_f32(0x3f808000u)) == 0x3f80); /* tie, down to even */
    CHECK(fa_f32_to_bf16(bits_to_f32(0x3f818000u)) == 0x3f82); /* tie, up to even */
    CHECK(fa_f32_to_bf16(bits_to_f32(0x3f808001u)) == 0x3f81);
}

/* Random floats across the whole finite range land on a nearest neighbour. */
FA_TEST(random_values_round_to_nearest) {
    fa_rng rng;
    fa_rng_seed(&rng, 0xd7e1);
    int bad16 = 0, bad_bf = 0;
    for (int n = 0; n < 200000; n++) {
        uint32_t bits = (uint32_t)fa_rng_next(&rng);
        float x = bits_to_f32(bits);
        if (!isfinite(x)) continue;
        uint16_t h = fa_f32_to_f16(x);
        double hv = f16_value(h);
        if (fabs(x) < 65520.0) {
            double up = f16_value((uint16_t)(h + 1)), down = f16_value((uint16_t)(h - 1));
            double err = fabs(hv - x);
            if ((h & 0x7fff) != 0x7bff && !(err <= fabs(up - x))) bad16++;
            if ((h & 0x7fff) != 0 && !(err <= fabs(down - x))) bad16++;
        } else if (!isinf(hv) || (hv < 0) != (x < 0)) {
            bad16++;
        }
        uint16_t b = fa_f32_to_bf16(x);
        double bv = bf16_value(b);
        if (isinf(bv)) {
            if (fabs(x) < ldexp(2.0 - 0x1p-8, 127)) bad_bf++;
        } else {
            double up = bf16_value((uint16_t)(b + 1)), down = bf16_value((uint16_t)(b - 1));
            double err = fabs(bv - x);
            if ((b & 0x7fff) != 0x7f7f && !(err <= fabs(up - x))) bad_bf++;
            if ((b & 0x7fff) != 0 && !(err <= fabs(down - x))) bad_bf++;
        }
    }
    CHECK_MSG(bad16 == 0, "%d fp16 conversions not to a nearest value", bad16);
    CHECK_MSG(bad_bf == 0, "%d bf16 conversions not to a nearest value", bad_bf);
}

FA_TEST(overflow_to_infinity) {
    /* fp16: 65504 is the largest finite value, 65520 the tie with 2^16. */
    CHECK(fa_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(fa_f32_to_f16(65519.996f) == 0x7bff);
    CHECK(fa_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(fa_f32_to_f16(-65520.0f) == 0xfc00);
    CHECK(fa_f32_to_f16(1e6f) == 0x7c00);
    CHECK(fa_f32_to_f16(FLT_MAX) == 0x7c00);
    CHECK(fa_f32_to_f16(-FLT_MAX) == 0xfc00);
    CHECK(fa_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(fa_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(store_f16(1e300) == 0x7c00);
    CHECK(store_f16(65519.999999) == 0x7bff);
    CHECK(isinf(fa_f16_to_f32(0x7c00)) && fa_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(fa_f16_to_f32(0xfc00)) && fa_f16_to_f32(0xfc00) < 0);
    /* bf16: the largest finite is (2 - 2^-7) 2^127; the tie with 2^128 goes
     * up (0x7f7f is odd), and FLT_MAX lies above that tie. */
    CHECK(fa_f32_to_bf16(bits_to_f32(0x7f7f0000u)) == 0x7f7f);
    CHECK(fa_f32_to_bf16(bits_to_f32(0x7f7f7fffu)) == 0x7f7f);
    CHECK(fa_f32_to_bf16(bits_to_f32(0x7f7f8000u)) == 0x7f80);
    CHECK(fa_f32_to_bf16(FLT_MAX) == 0x7f80);
    CHECK(fa_f32_to_bf16(-FLT_MAX) == 0xff80);
    CHECK(fa_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(fa_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(store_bf16(1e300) == 0x7f80);
    CHECK(store_bf16(-1e300) == 0xff80);
    /* A double just below that tie, nearer to it than any float, still
     * rounds down. */
    CHECK(store_bf16(ldexp(2.0 - 0x1p-8, 127) * (1 - 1e-12)) == 0x7f7f);
    float back;
    fa_store_elem(&back, FA_DTYPE_F32, 0, 1e300);
    CHECK(isinf(back) && back > 0);
}

FA_TEST(subnormals) {
    /* fp16: smallest subnormal 2^-24, largest 1023 * 2^-24, smallest normal 2^-14. */
    CHECK(fa_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(fa_f32_to_f16(-0x1p-24f) == 0x8001);
    CHECK(fa_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(fa_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(fa_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(fa_f32_to_f16(0x1p-25f) == 0x0000);                 /* tie with 0: even */
    CHECK(fa_f32_to_f16(-0x1p-25f) == 0x8000);
    CHECK(fa_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(fa_f32_to_f16(3 * 0x1p-25f) == 0x0002);             /* tie 1|2: even */
    CHECK(fa_f32_to_f16(5 * 0x1p-25f) == 0x0002);             /* tie 2|3: even */
    CHECK(fa_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);      /* rounds into the normals */
    CHECK(fa_f32_to_f16(0x1p-30f) == 0x0000);
    CHECK(store_f16(ldexp(1.0, -25) + ldexp(1.0, -60)) == 0x0001);
    /* Float subnormals vanish in fp16, keeping their sign. */
    CHECK(fa_f32_to_f16(0x1p-149f) == 0x0000);
    CHECK(fa_f32_to_f16(-0x1p-149f) == 0x8000);
    CHECK(fa_f32_to_f16(-0.0f) == 0x8000);
    /* bf16 shares float's exponent: subnormals down to 2^-133. */
    CHECK(fa_f32_to_bf16(0x1p-133f) == 0x0001);
    CHECK(fa_bf16_to_f32(0x0001) == 0x1p-133f);
    CHECK(fa_bf16_to_f32(0x007f) == 127 * 0x1p-133f);
    CHECK(fa_f32_to_bf16(0x1p-134f) == 0x0000);               /* tie with 0 */
    CHECK(fa_f32_to_bf16(3 * 0x1p-134f) == 0x0002);
    CHECK(fa_f32_to_bf16(0x1p-149f) == 0x0000);
    CHECK(fa_f32_to_bf16(-0x1p-149f) == 0x8000);
    CHECK(fa_f32_to_bf16(0x1p-126f - 0x1p-134f) == 0x0080);   /* into the normals */
    CHECK(store_bf16(ldexp(1.0, -140)) == 0x0000);
    CHECK(store_bf16(-ldexp(1.0, -1070)) == 0x8000);          /* double subnormal */
}

FA_TEST(nan_preserved) {
    /* Payloads living only in the low bits: a plain add-and-shift rounding
     * turns 0x7f800001 into infinity and carries 0x7fffffff into the sign. */
    const uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7f80ffffu,
                             0xff800001u, 0xffffffffu, 0x7fbfffffu, 0xffc00001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float x = bits_to_f32(nans[i]);
        uint16_t b = fa_f32_to_bf16(x), h = fa_f32_to_f16(x);
        int neg = (nans[i] >> 31) != 0;
        CHECK_MSG(bf16_is_nan(b) && !!(b & 0x8000) == neg, "bf16 of NaN 0x%08x gave 0x%04x",
                  (unsigned)nans[i], (unsigned)b);
        CHECK_MSG(f16_is_nan(h) && !!(h & 0x8000) == neg, "fp16 of NaN 0x%08x gave 0x%04x",
                  (unsigned)nans[i], (unsigned)h);
        CHECK(isnan(fa_bf16_to_f32(b)) && isnan(fa_f16_to_f32(h)));
        CHECK(bf16_is_nan(store_bf16((double)x)) && f16_is_nan(store_f16((double)x)));
    }
    CHECK(bf16_is_nan(store_bf16(NAN)) && f16_is_nan(store_f16(NAN)));
    /* Signalling doubles whose payload is only in bits both formats drop. */
    const uint64_t dnans[] = {0x7ff0000000000001ull, 0xfff0000000000001ull, 0x7ff00000ffffffffull};
    for (size_t i = 0; i < sizeof dnans / sizeof dnans[0]; i++) {
        double x;
        memcpy(&x, &dnans[i], sizeof x);
        uint16_t b = store_bf16(x), h = store_f16(x);
        int neg = (dnans[i] >> 63) != 0;
        CHECK_MSG(bf16_is_nan(b) && !!(b & 0x8000) == neg, "bf16 of double NaN gave 0x%04x", (unsigned)b);
        CHECK_MSG(f16_is_nan(h) && !!(h & 0x8000) == neg, "fp16 of double NaN gave 0x%04x", (unsigned)h);
    }
    float f;
    fa_store_elem(&f, FA_DTYPE_F32, 0, NAN);
    CHECK(isnan(f));
    /* A quiet bf16 NaN keeps its high payload bits. */
    CHECK((fa_f32_to_bf16(bits_to_f32(0x7fc50000u)) & 0x7f) == 0x45);
    CHECK(f32_to_bits(fa_bf16_to_f32(0x7fc5)) == 0x7fc50000u);
}

FA_TEST(dtype_size_and_name) {
    CHECK(fa_dtype_size(FA_DTYPE_F32) == 4);
    CHECK(fa_dtype_size(FA_DTYPE_F16) == 2);
    CHECK(fa_dtype_size(FA_DTYPE_BF16) == 2);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_F32), "fp32") == 0);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_F16), "fp16") == 0);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_BF16), "bf16") == 0);
    CHECK(fa_dtype_size((fa_dtype)7) == 0);
    CHECK(fa_dtype_name((fa_dtype)7) != NULL);
    /* Element access strides by the dtype's size. */
    uint16_t h[3] = {0, 0, 0};
    fa_store_elem(h, FA_DTYPE_F16, 1, 2.0);
    CHECK(h[0] == 0 && h[1] == 0x4000 && h[2] == 0);
    CHECK(fa_load_elem(h, FA_DTYPE_F16, 1) == 2.0);
    float f[3] = {0, 0, 0};
    fa_store_elem(f, FA_DTYPE_F32, 2, 0.1);
    CHECK(f[2] == 0.1f && f[1] == 0.0f);
    CHECK(fa_load_elem(f, FA_DTYPE_F32, 2) == (double)0.1f);
}

FA_TEST_MAIN(FA_CASE(f16_exhaustive_round_trip), FA_CASE(bf16_exhaustive_round_trip),
             FA_CASE(f16_ties_to_even), FA_CASE(bf16_ties_to_even),
             FA_CASE(random_values_round_to_nearest), FA_CASE(overflow_to_infinity),
             FA_CASE(subnormals), FA_CASE(nan_preserved), FA_CASE(dtype_size_and_name))
