#include "device_describe.h"

#include <stdio.h>
#include <string.h>

void fa_describe_gpu_begin(fa_device_info *info, fa_backend backend, int index, const char *vendor) {
    memset(info, 0, sizeof *info);
    info->backend = backend;
    info->index = index;
    fa_device_desc *d = &info->desc;
    d->backend = backend;
    d->type = FA_DEVICE_GPU;
    snprintf(d->vendor, sizeof d->vendor, "%s", vendor);
}

void fa_describe_queried_bandwidth(fa_device_desc *d, int mem_clock_khz, int bus_bits) {
    d->bandwidth_gbs = 2.0 * (double)mem_clock_khz * (double)bus_bits / 8.0 / 1e6;
    d->bandwidth_measured = 0;
}
