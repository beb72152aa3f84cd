#include "flashattn_mpi.h"

#include "mpi_error.h"
#include "mpi_transport.h"

fa_status fa_comm_create_mpi(fa_context ctx, MPI_Comm comm, fa_comm *out) {
    if (!out) return fa_mpi_fail(FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    fa_transport transport;
    fa_status st = fa_mpi_transport_create(ctx, comm, 0, &transport);
    if (st != FA_SUCCESS) return st;
    st = fa_comm_create(&transport, out);
    if (st != FA_SUCCESS) {
        fa_mpi_fail(st, "fa_comm_create: %s", fa_last_error());
        transport.release(transport.impl);
    }
    return st;
}
