/* Fixed-width types and the storage dtypes' conversions, with no storage
 * dtype chosen: common.cuh builds each attention program for one dtype on
 * top of these, and rows.cu converts between any two at run time. Rounding
 * to fp16 and bf16 is to nearest even, as core/dtype.c's. */
#ifndef FA_CUDA_DTYPE_CUH
#define FA_CUDA_DTYPE_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FA_DEV static __device__ __forceinline__

#define FA_INF __int_as_float(0x7f800000)
#define FA_NAN __int_as_float(0x7fffffff)

/* Whether x is NaN, without a header to take isnan from. */
FA_DEV bool fa_isnan(float x) { return x != x; }

FA_DEV float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

FA_DEV u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

FA_DEV float bf16_to_f32(u16 b) { return __uint_as_float((u32)b << 16); }

/* Round to nearest even on the bits (any architecture); a NaN stays a quiet
 * NaN instead of rounding into the infinity pattern. */
FA_DEV u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif
