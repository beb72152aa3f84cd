/* MPI error codes as fa_status, with a message that names the call. */
#ifndef FA_MPI_ERROR_H
#define FA_MPI_ERROR_H

#include "flashattn.h"

#include <mpi.h>

#if defined(__GNUC__) || defined(__clang__)
#  define FA_MPI_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#  define FA_MPI_PRINTF(fmt, args)
#endif

/* status, with the message fmt ... for the calling thread. */
fa_status fa_mpi_fail(fa_status status, const char *fmt, ...) FA_MPI_PRINTF(2, 3);
/* The status for an MPI error code, with "what: MPI's error string". */
fa_status fa_mpi_fail_code(int mpi_code, const char *what, ...) FA_MPI_PRINTF(2, 3);
/* fa_mpi_last_error (flashattn_mpi.h) reads the message. */

#endif
