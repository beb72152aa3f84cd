/* Shared-memory tile helpers of the FP32-pipe kernels (simt.cu,
 * kvcache_simt.cu): tiles in fp32, stored transposed where a thread reads
 * them along rows. */
#ifndef FA_CUDA_SIMT_TILES_CUH
#define FA_CUDA_SIMT_TILES_CUH

#include "common.cuh"

/* Eight loaded values scattered into a transposed tile: element x of row r
 * goes to dst[x * ld + r]. */
FA_DEV void store8_t(float *dst, int ld, int x0, int r, const float v[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) dst[(x0 + i) * ld + r] = v[i];
}

FA_DEV void store8_row(float *dst, const float v[8]) {
    *(float4 *)dst = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

/* N consecutive floats of a shared tile, as wide as alignment allows (tile
 * offsets are multiples of N and tiles 16-byte aligned). */
template <int N> FA_DEV void lds_n(float *dst, const float *src) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 v = *(const float4 *)(src + i);
            dst[i] = v.x;
            dst[i + 1] = v.y;
            dst[i + 2] = v.z;
            dst[i + 3] = v.w;
        }
    } else if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const float2 v = *(const float2 *)(src + i);
            dst[i] = v.x;
            dst[i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) dst[i] = src[i];
    }
}

template <int N> FA_DEV void sts_n(float *dst, const float *src) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *(float4 *)(dst + i) = make_float4(src[i], src[i + 1], src[i + 2], src[i + 3]);
    } else if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) *(float2 *)(dst + i) = make_float2(src[i], src[i + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) dst[i] = src[i];
    }
}

#endif
