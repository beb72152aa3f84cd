/* The transport behind fa_comm_create_mpi, on its own so that the tests
 * can drive it directly. */
#ifndef FA_MPI_TRANSPORT_H
#define FA_MPI_TRANSPORT_H

#include "flashattn.h"

#include <mpi.h>
#include <stddef.h>

/* A transport over a duplicate of comm, collective over comm: every rank
 * gets an error where one fails. message_limit: 0 sends up to INT_MAX
 * bytes as plain bytes and larger transfers as derived types of 1 GiB
 * blocks; any other value is both limits, so that tests reach the derived
 * types with small buffers. On success the caller owns *out and ends it
 * with out->release(out->impl). */
fa_status fa_mpi_transport_create(fa_context ctx, MPI_Comm comm, size_t message_limit, fa_transport *out);

#endif
