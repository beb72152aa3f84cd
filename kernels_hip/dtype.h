/* Types and the storage dtypes' conversions, with no storage dtype chosen
 * and no build option needed: first in every HIP program, before common.h
 * (which builds an attention program for one dtype on them) or rows.hip
 * (which converts between any two at run time). Every load widens to fp32;
 * every store rounds to nearest even, NaN and infinities kept. */

#define FA_FN static __device__ __forceinline__

typedef long long fa_long;
typedef unsigned int fa_uint;
typedef unsigned short fa_ushort;
typedef unsigned char fa_uchar;

#define FA_INF __int_as_float(0x7f800000)
#define FA_NAN __int_as_float(0x7fffffff)

/* Whether x is NaN, without a header to take isnan from. */
FA_FN bool fa_isnan(float x) { return x != x; }

#ifndef FA_HIP_ON_CUDA
/* AMD: the compiler's _Float16 converts in hardware. The NVIDIA prelude
 * defines these two itself. */
FA_FN float fa_half_to_float(fa_ushort h) { return (float)__builtin_bit_cast(_Float16, h); }
FA_FN fa_ushort fa_float_to_half(float f) { return __builtin_bit_cast(fa_ushort, (_Float16)f); }
#endif

FA_FN float fa_bf16_to_float(fa_ushort h) { return __uint_as_float((fa_uint)h << 16); }

/* Round to nearest even on the bits; a NaN stays a (quiet) NaN instead of
 * rounding up into the infinity pattern. Written as a select, not a branch:
 * a branch in the store loops keeps the compiler from unrolling them, and
 * the accumulators they index then live in scratch memory. */
FA_FN fa_ushort fa_bf16_round(float f) {
    const fa_uint u = __float_as_uint(f);
    const fa_uint rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const fa_uint quiet = (u >> 16) | 0x40u;
    return (fa_ushort)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
