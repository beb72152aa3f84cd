#include "gpu_aware.h"

#include "mpi_error.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* Open MPI declares its CUDA and ROCm queries in mpi-ext.h, which other
 * MPIs lack. */
#if defined(__has_include)
#  if __has_include(<mpi-ext.h>)
#    include <mpi-ext.h>
#  endif
#elif defined(OPEN_MPI)
#  include <mpi-ext.h>
#endif

/* The macros say what the MPI was built with; the queries, what the MPI
 * that runs (a build may load another library of the same ABI, and Open
 * MPI can switch CUDA support off at run time) does. */
static int cuda_aware(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    return MPIX_Query_cuda_support() == 1;
#else
    return 0;
#endif
}

static int rocm_aware(void) {
#if defined(MPIX_ROCM_AWARE_SUPPORT)
    return MPIX_Query_rocm_support() == 1;
#else
    return 0;
#endif
}

fa_status fa_mpi_device_memory(fa_backend backend, int *device_memory) {
    *device_memory = 0;
    const char *forced = getenv("FLASHATTN_MPI_GPU_AWARE");
    int aware;
    if (forced && forced[0]) {
        if (strcmp(forced, "0") != 0 && strcmp(forced, "1") != 0)
            return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT, "FLASHATTN_MPI_GPU_AWARE is \"%s\": 0 or 1", forced);
        aware = forced[0] == '1';
    } else {
        aware = backend == FA_BACKEND_CUDA ? cuda_aware() : backend == FA_BACKEND_HIP ? rocm_aware() : 0;
    }
    *device_memory = aware && (backend == FA_BACKEND_CUDA || backend == FA_BACKEND_HIP);
    return FA_SUCCESS;
}
