/* A read of two buffers and nothing else, for the benchmarks
 * (backends/cuda/cuda_copy.c): the time a device needs to bring a decoding
 * step's K and V from memory with no attention around it, timed the way
 * the step is, and a flush of the last-level cache that leaves it holding
 * clean lines (a copy or a fill leaves it full of dirty ones, which the
 * next kernel pays to write back).
 *
 * Every thread keeps STREAM_UNROLL 16-byte loads in flight, the grid steps
 * over both buffers as one range, and the words are folded into a value
 * that is stored only when it equals a key no input of the benchmarks
 * produces, so the loads cannot be optimised away and nothing is written. */
#include "dtype.cuh"

#define STREAM_THREADS 512 /* FA_STREAM_THREADS */
#define STREAM_UNROLL 4

/* 16 bytes from global memory, not kept in L1 (read once). */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ const uint4 *word_at(const uint4 *a, u64 na, const uint4 *b, u64 i) {
    return i < na ? a + i : b + (i - na);
}

/* na and nb: 16-byte words of a and b; sink: one word, written only on the
 * key (never, for the benchmarks' data). */
extern "C" __global__ void __launch_bounds__(STREAM_THREADS) fa_stream_read(const uint4 *a, u64 na, const uint4 *b,
                                                                             u64 nb, u32 key, u32 *sink) {
    const u64 n = na + nb, stride = (u64)gridDim.x * STREAM_THREADS;
    u64 i = (u64)blockIdx.x * STREAM_THREADS + threadIdx.x;
    u32 acc = 0;
    for (; i + (STREAM_UNROLL - 1) * stride < n; i += STREAM_UNROLL * stride) {
        uint4 v[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++) v[u] = ld_stream(word_at(a, na, b, i + u * stride));
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = ld_stream(word_at(a, na, b, i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == key) *sink = acc;
}
