#include "mpi_transport.h"

#include "gpu_aware.h"
#include "mpi_error.h"
#include "mpi_message.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

/* The library's messages have a communicator of their own; one tag is
 * enough, as the ring posts its transfers in the same order on every rank
 * and MPI matches messages between two ranks in posting order. */
#define TRANSFER_TAG 0x6661
#define DEFAULT_BLOCK_BYTES ((size_t)1 << 30)

typedef struct mpi_transfer mpi_transfer;
struct mpi_transfer {
    MPI_Request requests[2]; /* receive, send */
    fa_mpi_message messages[2];
    size_t recv_bytes;
    int from, to;
    mpi_transfer *prev, *next;
};

typedef struct mpi_transport {
    MPI_Comm comm;
    /* Set only where MPI is handed device memory: every transfer waits for
     * the context's queue first. */
    fa_context ctx;
    int thread_level;
    size_t direct_limit, block_bytes;
    mpi_transfer *outstanding; /* started, not yet waited for */
} mpi_transport;

/* Below MPI_THREAD_SERIALIZED only the thread that initialised MPI may call
 * it; failing here beats undefined behaviour inside MPI. */
static fa_status check_thread(const mpi_transport *t) {
    if (t->thread_level >= MPI_THREAD_SERIALIZED) return FA_SUCCESS;
    int is_main = 0;
    MPI_Is_thread_main(&is_main);
    if (is_main) return FA_SUCCESS;
    return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT,
                       "MPI was initialised with a thread level below MPI_THREAD_SERIALIZED, and this thread is "
                       "not the one that initialised it");
}

static void transfer_unlink(mpi_transport *t, mpi_transfer *x) {
    if (x->prev) x->prev->next = x->next;
    else t->outstanding = x->next;
    if (x->next) x->next->prev = x->prev;
}

/* Drops what a failed or abandoned transfer still has posted without
 * waiting for a peer that may never come: the receive is cancelled (its
 * buffer may be freed next), the send left to MPI. */
static void transfer_abandon(mpi_transfer *x) {
    if (x->requests[0] != MPI_REQUEST_NULL) {
        MPI_Cancel(&x->requests[0]);
        MPI_Request_free(&x->requests[0]);
    }
    if (x->requests[1] != MPI_REQUEST_NULL) MPI_Request_free(&x->requests[1]);
    for (int i = 0; i < 2; i++) fa_mpi_message_free(&x->messages[i]);
    free(x);
}

static fa_status transport_start(void *impl, void *queue, const void *send, size_t send_bytes, int to, void *recv,
                                 size_t recv_bytes, int from, void **pending) {
    mpi_transport *t = impl;
    if (!pending) return fa_mpi_fail(FA_ERR_NULL_POINTER, "pending is NULL");
    *pending = NULL;
    fa_status st = check_thread(t);
    if (st != FA_SUCCESS) return st;
    /* MPI reads the send buffer and may write the receive buffer as soon
     * as the operations are posted, while the queue may still be working
     * on either. */
    if (t->ctx && (st = fa_context_synchronize(t->ctx)) != FA_SUCCESS)
        return fa_mpi_fail(st, "fa_context_synchronize before a transfer of device memory: %s", fa_last_error());

    mpi_transfer *x = calloc(1, sizeof *x);
    if (!x) return fa_mpi_fail(FA_ERR_OUT_OF_MEMORY, "MPI transfer: out of host memory");
    x->requests[0] = x->requests[1] = MPI_REQUEST_NULL;
    x->messages[0].type = x->messages[1].type = MPI_BYTE;
    x->recv_bytes = recv_bytes;
    x->from = from;
    x->to = to;
    st = fa_mpi_message_make(recv_bytes, t->direct_limit, t->block_bytes, &x->messages[0]);
    if (st == FA_SUCCESS) st = fa_mpi_message_make(send_bytes, t->direct_limit, t->block_bytes, &x->messages[1]);
    if (st == FA_SUCCESS) {
        int rc = MPI_Irecv(recv, x->messages[0].count, x->messages[0].type, from, TRANSFER_TAG, t->comm,
                           &x->requests[0]);
        if (rc != MPI_SUCCESS) st = fa_mpi_fail_code(rc, "MPI_Irecv of %zu bytes from rank %d", recv_bytes, from);
    }
    if (st == FA_SUCCESS) {
        int rc = MPI_Isend(send, x->messages[1].count, x->messages[1].type, to, TRANSFER_TAG, t->comm,
                           &x->requests[1]);
        if (rc != MPI_SUCCESS) st = fa_mpi_fail_code(rc, "MPI_Isend of %zu bytes to rank %d", send_bytes, to);
    }
    if (st != FA_SUCCESS) {
        transfer_abandon(x);
        return st;
    }
    x->next = t->outstanding;
    if (x->next) x->next->prev = x;
    t->outstanding = x;
    *pending = x;
    return FA_SUCCESS;
}

/* Why a completed transfer failed, or FA_SUCCESS. */
static fa_status transfer_outcome(const mpi_transfer *x, int rc, MPI_Status statuses[2]) {
    if (rc == MPI_ERR_IN_STATUS) {
        for (int i = 0; i < 2; i++) {
            int code = statuses[i].MPI_ERROR;
            if (code == MPI_SUCCESS || code == MPI_ERR_PENDING) continue;
            if (i == 0) return fa_mpi_fail_code(code, "MPI_Waitall: receiving %zu bytes from rank %d", x->recv_bytes, x->from);
            return fa_mpi_fail_code(code, "MPI_Waitall: sending to rank %d", x->to);
        }
    }
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Waitall on the transfer from rank %d", x->from);
    MPI_Count received = 0;
    rc = MPI_Get_elements_x(&statuses[0], x->messages[0].type, &received);
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Get_elements_x on the transfer from rank %d", x->from);
    if (received < 0 || (uint64_t)received != (uint64_t)x->recv_bytes)
        return fa_mpi_fail(FA_ERR_INVALID_SIZE,
                           "received %lld bytes from rank %d where %zu were expected: the ranks disagree on the "
                           "transfer",
                           (long long)received, x->from, x->recv_bytes);
    return FA_SUCCESS;
}

static fa_status transport_wait(void *impl, void *queue, void *pending) {
    mpi_transport *t = impl;
    mpi_transfer *x = pending;
    if (!x) return fa_mpi_fail(FA_ERR_NULL_POINTER, "pending is NULL");
    fa_status st = check_thread(t);
    if (st != FA_SUCCESS) return st;
    transfer_unlink(t, x);
    MPI_Status statuses[2];
    int rc = MPI_Waitall(2, x->requests, statuses);
    st = transfer_outcome(x, rc, statuses);
    transfer_abandon(x); /* only what an error left posted is still there */
    return st;
}

static fa_status transport_agree(void *impl, int64_t *values, int count) {
    mpi_transport *t = impl;
    if (count < 0 || (count > 0 && !values))
        return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT, "agree on %d values at %p", count, (void *)values);
    fa_status st = check_thread(t);
    if (st != FA_SUCCESS) return st;
    int rc = MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_INT64_T, MPI_MAX, t->comm);
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Allreduce of %d values", count);
    return FA_SUCCESS;
}

static void transport_release(void *impl) {
    mpi_transport *t = impl;
    if (!t) return;
    /* After MPI_Finalize no MPI call is allowed: what MPI held is gone
     * with it, only the library's own memory is left to free. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    while (t->outstanding) {
        mpi_transfer *x = t->outstanding;
        transfer_unlink(t, x);
        if (finalized) free(x);
        else transfer_abandon(x);
    }
    if (!finalized) MPI_Comm_free(&t->comm);
    free(t);
}

/* What this rank found before agreeing with the others. */
static fa_status local_setup(mpi_transport *t, fa_context ctx, int *device_memory) {
    fa_device_info info;
    fa_status st = fa_context_get_info(ctx, &info);
    if (st != FA_SUCCESS) return fa_mpi_fail(st, "fa_context_get_info: %s", fa_last_error());
    if ((st = fa_mpi_device_memory(info.backend, device_memory)) != FA_SUCCESS) return st;
    if (*device_memory) t->ctx = ctx;
    return FA_SUCCESS;
}

/* Every rank learns whether one failed, so that none goes on to wait for a
 * rank that gave up; the failing rank keeps its own status and message. */
static fa_status agree_on_setup(MPI_Comm comm, fa_status local) {
    int mine[2] = {(int)local, 0}, worst[2];
    MPI_Comm_rank(comm, &mine[1]);
    int rc = MPI_Allreduce(mine, worst, 1, MPI_2INT, MPI_MAXLOC, comm);
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Allreduce agreeing on the communicator");
    if (local != FA_SUCCESS) return local;
    if (worst[0] != FA_SUCCESS)
        return fa_mpi_fail((fa_status)worst[0], "rank %d could not create its MPI transport (%s)", worst[1],
                           fa_status_string((fa_status)worst[0]));
    return FA_SUCCESS;
}

/* What can be refused without talking to the other ranks, each of which
 * sees the same (an MPI state, a communicator, a thread level). */
static fa_status check_usable(MPI_Comm comm, int *thread_level) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT, "MPI is %s", finalized ? "finalized" : "not initialised");
    if (comm == MPI_COMM_NULL) return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    mpi_transport probe = {.thread_level = MPI_THREAD_SINGLE};
    int rc = MPI_Query_thread(&probe.thread_level);
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Query_thread");
    fa_status st = check_thread(&probe);
    if (st != FA_SUCCESS) return st;
    *thread_level = probe.thread_level;
    int inter = 0;
    rc = MPI_Comm_test_inter(comm, &inter);
    if (rc != MPI_SUCCESS) return fa_mpi_fail_code(rc, "MPI_Comm_test_inter");
    if (inter)
        return fa_mpi_fail(FA_ERR_INVALID_ARGUMENT, "comm is an intercommunicator: the ring needs an intracommunicator");
    return FA_SUCCESS;
}

fa_status fa_mpi_transport_create(fa_context ctx, MPI_Comm comm, size_t message_limit, fa_transport *out) {
    if (!ctx) return fa_mpi_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!out) return fa_mpi_fail(FA_ERR_NULL_POINTER, "out is NULL");
    int thread_level = MPI_THREAD_SINGLE;
    fa_status st = check_usable(comm, &thread_level);
    if (st != FA_SUCCESS) return st;
    mpi_transport *t = calloc(1, sizeof *t);
    if (!t) return fa_mpi_fail(FA_ERR_OUT_OF_MEMORY, "MPI transport: out of host memory");
    t->thread_level = thread_level;
    t->direct_limit = message_limit ? message_limit : INT_MAX;
    t->block_bytes = message_limit ? message_limit : DEFAULT_BLOCK_BYTES;
    /* The caller's error handler applies to this call alone: the library's
     * later calls return their errors. */
    int rc = MPI_Comm_dup(comm, &t->comm);
    if (rc != MPI_SUCCESS) {
        free(t);
        return fa_mpi_fail_code(rc, "MPI_Comm_dup");
    }
    rc = MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    st = rc == MPI_SUCCESS ? FA_SUCCESS : fa_mpi_fail_code(rc, "MPI_Comm_set_errhandler");
    int device_memory = 0;
    if (st == FA_SUCCESS) st = local_setup(t, ctx, &device_memory);
    st = agree_on_setup(t->comm, st);
    if (st != FA_SUCCESS) {
        transport_release(t);
        return st;
    }
    fa_transport transport = {0};
    MPI_Comm_rank(t->comm, &transport.rank);
    MPI_Comm_size(t->comm, &transport.world);
    transport.device_memory = device_memory;
    transport.impl = t;
    transport.start = transport_start;
    transport.wait = transport_wait;
    transport.agree = transport_agree;
    transport.release = transport_release;
    *out = transport;
    return FA_SUCCESS;
}
