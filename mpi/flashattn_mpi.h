/*
 * flashattn_mpi: context parallelism over MPI.
 *
 * A communicator (fa_comm, flashattn.h) whose transport is MPI, for
 * fa_dist_plan_create and the distributed passes. A library of its own,
 * libflashattn_mpi, so that libflashattn never depends on MPI:
 *   CMake:      find_package(flashattn CONFIG REQUIRED COMPONENTS mpi)
 *               target_link_libraries(app PRIVATE flashattn::flashattn_mpi)
 *   pkg-config: pkg-config --cflags --libs flashattn_mpi
 *
 * Memory the transport hands to MPI
 * ---------------------------------
 * Host memory, unless the MPI library is GPU-aware for the context's
 * backend; the core library then stages device buffers through host
 * memory around every transfer. GPU-aware means, on a CUDA context, that
 * the MPI's mpi-ext.h defines MPIX_CUDA_AWARE_SUPPORT (Open MPI's CUDA
 * extension) and MPIX_Query_cuda_support() answers 1 at run time; on a HIP
 * context, that it defines MPIX_ROCM_AWARE_SUPPORT and
 * MPIX_Query_rocm_support() answers 1. Any other MPI, and the reference and
 * OpenCL backends, get host memory. The environment variable
 * FLASHATTN_MPI_GPU_AWARE, read when the communicator is created, overrides
 * the detection: 0 host memory always; 1 device pointers on CUDA and HIP
 * contexts (for an MPI that is GPU-aware without saying so, e.g. MPICH or
 * MVAPICH built with CUDA). With device pointers, every transfer first
 * waits for the context's queue (fa_context_synchronize), since MPI reads
 * and writes the memory as soon as the transfer starts.
 *
 * Threads
 * -------
 * The library makes MPI calls from the thread that calls
 * fa_comm_create_mpi, fa_dist_plan_create, fa_dist_forward,
 * fa_dist_backward, fa_dist_plan_destroy and fa_comm_destroy, and from no
 * other. MPI_THREAD_FUNNELED is enough when that is the thread that
 * initialised MPI; from another thread, MPI_THREAD_SERIALIZED (one MPI call
 * at a time in the process: serialise these calls with the application's
 * own MPI calls); MPI_THREAD_MULTIPLE where other threads make MPI calls at
 * the same time. A call from a thread the MPI's thread level does not allow
 * fails with FA_ERR_INVALID_ARGUMENT instead of calling MPI.
 *
 * Lifetimes
 * ---------
 * MPI must be initialised before fa_comm_create_mpi, and the communicator
 * destroyed (fa_comm_destroy, on every rank: it frees the duplicated MPI
 * communicator) before MPI_Finalize. Where the transport passes device
 * pointers, the context must outlive the communicator.
 *
 * Errors
 * ------
 * MPI errors on the library's communicator are returned, never fatal (it
 * sets MPI_ERRORS_RETURN on its duplicate): each becomes a fa_status
 * (FA_ERR_OUT_OF_MEMORY for MPI_ERR_NO_MEM, FA_ERR_INVALID_SIZE for
 * MPI_ERR_TRUNCATE and for a message of another size than expected,
 * FA_ERR_INVALID_ARGUMENT for a bad rank or argument, FA_ERR_LAUNCH for the
 * rest) with a message that names the MPI call and carries
 * MPI_Error_string, in fa_last_error() (through fa_set_last_error; after a
 * failed fa_dist_* call it follows the name of the ring's step that
 * failed: a transfer, an agreement between the ranks) and in
 * fa_mpi_last_error(), which keeps it until this library's next failure.
 */
#ifndef FLASHATTN_MPI_H
#define FLASHATTN_MPI_H

#include <flashattn.h>
#include <mpi.h>

#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(FLASHATTN_MPI_STATIC)
#    define FA_MPI_API
#  elif defined(FA_MPI_BUILDING_LIBRARY)
#    define FA_MPI_API __declspec(dllexport)
#  else
#    define FA_MPI_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define FA_MPI_API __attribute__((visibility("default")))
#else
#  define FA_MPI_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over the ranks of comm (collective over comm): rank and
 * world are comm's. The library works on a duplicate of comm
 * (MPI_Comm_dup), so its messages never match the caller's; the duplicate
 * is freed by fa_comm_destroy. ctx is the context the distributed plans
 * will run on: its backend decides which memory MPI is handed (see the
 * top of this file). */
FA_MPI_API fa_status fa_comm_create_mpi(fa_context ctx, MPI_Comm comm, fa_comm *out);

/* Details of the calling thread's last failure in this library: the MPI
 * call and MPI's error string, or why fa_comm_create_mpi refused; "" if
 * none. Valid until the thread's next failure here. */
FA_MPI_API const char *fa_mpi_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_MPI_H */
