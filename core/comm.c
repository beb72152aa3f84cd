/* Communicators over transports: the caller's own, or NCCL/RCCL through the
 * context's backend (MPI's lives in libflashattn_mpi, which calls
 * fa_comm_create). */
#include "comm.h"
#include "collective.h"
#include "fa_internal.h"
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>

fa_status fa_comm_create(const fa_transport *transport, fa_comm *comm) {
    if (!comm) return fa_fail(FA_ERR_NULL_POINTER, "comm is NULL");
    *comm = NULL;
    if (!transport) return fa_fail(FA_ERR_NULL_POINTER, "transport is NULL");
    if (!transport->start || !transport->wait || !transport->agree)
        return fa_fail(FA_ERR_NULL_POINTER, "transport: start, wait and agree must all be set");
    if (transport->world < 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "transport: world = %d, must be >= 1", transport->world);
    if (transport->rank < 0 || transport->rank >= transport->world)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "transport: rank = %d is outside [0, %d)", transport->rank,
                       transport->world);
    if (transport->device_memory != 0 && transport->device_memory != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "transport: device_memory = %d, must be 0 or 1",
                       transport->device_memory);
    struct fa_comm_s *c = calloc(1, sizeof *c);
    if (!c) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate a communicator");
    c->t = *transport;
    *comm = c;
    return FA_SUCCESS;
}

fa_status fa_comm_create_nccl(fa_context ctx, void *nccl_comm, fa_comm *comm) {
    if (!comm) return fa_fail(FA_ERR_NULL_POINTER, "comm is NULL");
    *comm = NULL;
    fa_transport t;
    FA_CHECK(fa_nccl_transport(ctx, nccl_comm, &t));
    fa_status st = fa_comm_create(&t, comm);
    if (st != FA_SUCCESS) {
        if (t.release) t.release(t.impl);
        return st;
    }
    fa_context_retain(ctx);
    (*comm)->ctx = ctx;
    return FA_SUCCESS;
}

fa_status fa_comm_get_rank(fa_comm comm, int *rank, int *world) {
    if (!comm) return fa_fail(FA_ERR_NULL_POINTER, "comm is NULL");
    if (rank) *rank = comm->t.rank;
    if (world) *world = comm->t.world;
    return FA_SUCCESS;
}

fa_status fa_comm_destroy(fa_comm comm) {
    if (!comm) return fa_fail(FA_ERR_NULL_POINTER, "comm is NULL");
    if (comm->t.release) comm->t.release(comm->t.impl);
    if (comm->ctx) fa_context_release(comm->ctx);
    free(comm);
    return FA_SUCCESS;
}

fa_status fa_comm_agree(fa_comm comm, int64_t *values, int count) {
    fa_clear_error();
    fa_status st = comm->t.agree(comm->t.impl, values, count);
    if (st != FA_SUCCESS) {
        char why[512];
        snprintf(why, sizeof why, "%s", fa_last_error());
        return fa_fail(st, "the transport could not agree with the other ranks (%s)%s%s", fa_status_string(st),
                       why[0] ? ": " : "", why);
    }
    return FA_SUCCESS;
}
