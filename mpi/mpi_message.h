/* A byte range as one MPI message, whatever its size. */
#ifndef FA_MPI_MESSAGE_H
#define FA_MPI_MESSAGE_H

#include "flashattn.h"

#include <mpi.h>
#include <stddef.h>

/* MPI counts are int. Up to direct_limit bytes a message is that many
 * MPI_BYTE; above, it is one element of a derived type (whole blocks of
 * block_bytes, then the rest), so that a transfer stays one message: the
 * receiver learns its size from MPI, and transfers between the same two
 * ranks match in the order they were posted however large they are. */
typedef struct fa_mpi_message {
    MPI_Datatype type;
    int count;
    int derived; /* type is the message's own, for fa_mpi_message_free */
} fa_mpi_message;

fa_status fa_mpi_message_make(size_t bytes, size_t direct_limit, size_t block_bytes, fa_mpi_message *out);
void fa_mpi_message_free(fa_mpi_message *message);

#endif
