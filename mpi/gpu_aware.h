/* Whether the MPI library reads and writes device memory itself. */
#ifndef FA_MPI_GPU_AWARE_H
#define FA_MPI_GPU_AWARE_H

#include "flashattn.h"

/* *device_memory: 1 where the transport of a context of this backend
 * hands MPI device pointers, 0 where it hands host memory (see
 * flashattn_mpi.h). FA_ERR_INVALID_ARGUMENT for a FLASHATTN_MPI_GPU_AWARE
 * that is neither 0 nor 1. */
fa_status fa_mpi_device_memory(fa_backend backend, int *device_memory);

#endif
