/* libfa_hip_on_cuda: the HIP entry points flashattn's HIP backend loads,
 * implemented on the CUDA driver API and NVRTC (README.md beside this file
 * has the table). Built only with -DFA_HIP_NVIDIA=ON.
 *
 * Every function it exports has the signature of Debian's HIP 5.2 headers
 * for the AMD platform, which declare all of them but one: the entry point
 * ROCm 6 added to fill the 5.x layout of hipDeviceProp_t, declared here. */
#ifndef FA_HIP_ON_CUDA_H
#define FA_HIP_ON_CUDA_H

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

hipError_t hipGetDevicePropertiesR0000(hipDeviceProp_t *props, int device);

#endif
