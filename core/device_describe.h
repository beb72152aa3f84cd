/* What the GPU backends' device descriptions compute alike, apart from the
 * runtime queries that feed them: the fields every description starts
 * from, and the bandwidth figure a runtime's memory clock and bus width
 * give. One definition, so that the planner sees CUDA and HIP devices
 * described by the same rules. */
#ifndef FA_DEVICE_DESCRIBE_H
#define FA_DEVICE_DESCRIBE_H

#include "flashattn.h"

/* Clears info, then names the backend, the device's index, a GPU, and the
 * vendor. */
void fa_describe_gpu_begin(fa_device_info *info, fa_backend backend, int index, const char *vendor);

/* The theoretical peak of a double-data-rate interface, from the memory
 * clock (kHz) and bus width (bits) the runtime reports: the queried figure,
 * marked as not measured. 0 when either is unreported. */
void fa_describe_queried_bandwidth(fa_device_desc *d, int mem_clock_khz, int bus_bits);

#endif
