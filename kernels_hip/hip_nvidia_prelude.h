/* Put in front of the HIP kernels when they are compiled for an NVIDIA GPU
 * through the HIP-on-CUDA mapping (backends/hip_nvidia/): NVRTC then sees
 * CUDA C++, in which most of what the kernels use is spelled as in HIP
 * (__global__, __shared__, __launch_bounds__, threadIdx, blockIdx,
 * __syncthreads, fmaf, exp2f, __umulhi, __int_as_float, ...). This file
 * maps the rest, and nothing else:
 *
 *   HIP (AMD)                         CUDA
 *   __shfl_xor(v, mask, width)        __shfl_xor_sync(lanes, v, mask, width)
 *   (float)(_Float16) on the bits     cvt.f32.f16   (PTX)
 *   (_Float16)f, round to nearest     cvt.rn.f16.f32 (PTX)
 *
 * CUDA's exchanges name the lanes taking part: every lane of a work-group,
 * which is the whole warp unless the work-group is smaller than one. */

#define FA_HIP_ON_CUDA 1

#define FA_CUDA_LANES (WG_SIZE >= 32 ? 0xffffffffu : ((1u << (WG_SIZE % 32)) - 1u))
#define __shfl_xor(v, mask, width) __shfl_xor_sync(FA_CUDA_LANES, (v), (mask), (width))

static __device__ __forceinline__ float fa_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ unsigned short fa_float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
