#include "mpi_error.h"

#include "flashattn_mpi.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FA_MPI_MESSAGE_SIZE 1024
static _Thread_local char mpi_message[FA_MPI_MESSAGE_SIZE];

const char *fa_mpi_last_error(void) { return mpi_message; }

fa_status fa_mpi_fail(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mpi_message, sizeof mpi_message, fmt, ap);
    va_end(ap);
    /* Also where the library's callers read it. */
    return fa_set_last_error(status, mpi_message);
}

/* The error classes a caller can act on get their own status; the rest are
 * failures of the communication itself. */
static fa_status status_of_class(int error_class) {
    switch (error_class) {
    case MPI_ERR_NO_MEM: return FA_ERR_OUT_OF_MEMORY;
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_COUNT: return FA_ERR_INVALID_SIZE;
    case MPI_ERR_RANK:
    case MPI_ERR_COMM:
    case MPI_ERR_ARG:
    case MPI_ERR_TYPE:
    case MPI_ERR_BUFFER:
    case MPI_ERR_TAG: return FA_ERR_INVALID_ARGUMENT;
    default: return FA_ERR_LAUNCH;
    }
}

fa_status fa_mpi_fail_code(int mpi_code, const char *what, ...) {
    int error_class = MPI_ERR_UNKNOWN;
    if (MPI_Error_class(mpi_code, &error_class) != MPI_SUCCESS) error_class = MPI_ERR_UNKNOWN;
    char text[MPI_MAX_ERROR_STRING + 1] = "";
    int text_len = 0;
    if (MPI_Error_string(mpi_code, text, &text_len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", mpi_code);
    char head[256];
    va_list ap;
    va_start(ap, what);
    vsnprintf(head, sizeof head, what, ap);
    va_end(ap);
    return fa_mpi_fail(status_of_class(error_class), "%s: %s", head, text);
}
