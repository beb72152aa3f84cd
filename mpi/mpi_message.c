#include "mpi_message.h"

#include "mpi_error.h"

#include <limits.h>
#include <stdint.h>

fa_status fa_mpi_message_make(size_t bytes, size_t direct_limit, size_t block_bytes, fa_mpi_message *out) {
    out->type = MPI_BYTE;
    out->count = 0;
    out->derived = 0;
    if (direct_limit > INT_MAX) direct_limit = INT_MAX;
    if (bytes <= direct_limit) {
        out->count = (int)bytes;
        return FA_SUCCESS;
    }
    if (block_bytes == 0 || block_bytes > INT_MAX)
        return fa_mpi_fail(FA_ERR_INTERNAL, "MPI message blocks of %zu bytes", block_bytes);
    const size_t blocks = bytes / block_bytes, rest = bytes % block_bytes;
    if (blocks > INT_MAX || bytes > (size_t)INT64_MAX)
        return fa_mpi_fail(FA_ERR_INVALID_SIZE, "a message of %zu bytes is more than MPI can describe", bytes);

    MPI_Datatype block = MPI_DATATYPE_NULL, tail = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous((int)block_bytes, MPI_BYTE, &block);
    if (rc == MPI_SUCCESS) {
        if (rest == 0) {
            rc = MPI_Type_contiguous((int)blocks, block, &whole);
        } else {
            rc = MPI_Type_contiguous((int)rest, MPI_BYTE, &tail);
            if (rc == MPI_SUCCESS) {
                int lengths[2] = {(int)blocks, 1};
                MPI_Aint displacements[2] = {0, (MPI_Aint)(blocks * block_bytes)};
                MPI_Datatype types[2] = {block, tail};
                rc = MPI_Type_create_struct(2, lengths, displacements, types, &whole);
            }
        }
    }
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&whole);
    /* The parts may go once the whole is built: it keeps what it needs. */
    if (tail != MPI_DATATYPE_NULL) MPI_Type_free(&tail);
    if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
    if (rc != MPI_SUCCESS) {
        if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
        return fa_mpi_fail_code(rc, "building an MPI datatype for a message of %zu bytes", bytes);
    }
    out->type = whole;
    out->count = 1;
    out->derived = 1;
    return FA_SUCCESS;
}

void fa_mpi_message_free(fa_mpi_message *message) {
    /* A pending operation keeps a freed type alive until it completes. */
    if (message->derived && message->type != MPI_DATATYPE_NULL) MPI_Type_free(&message->type);
    message->derived = 0;
    message->type = MPI_BYTE;
}
