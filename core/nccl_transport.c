/* The transport over an NCCL or RCCL communicator (nccl_transport.h). */
#include "nccl_transport.h"

#include "fa_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending_transfer {
    void *done; /* recorded on the stream after the transfer */
    int busy;
} pending_transfer;

typedef struct nccl_transport {
    const fa_transfer_runtime *rt;
    void *ctx;
    const fa_nccl_api *nccl;
    void *comm;
    void *stream;
    void *ready; /* recorded on the context's queue before a transfer */
    pending_transfer pending[FA_NCCL_PENDING];
    void *agree_buf; /* device memory for agree's values */
    size_t agree_bytes;
} nccl_transport;

/* The NCCL group of one transfer on the transport's stream. A group opened
 * is always closed, also when a call inside it failed. */
static fa_status exchange(nccl_transport *t, const void *send, size_t send_bytes, int to, void *recv,
                          size_t recv_bytes, int from) {
    const fa_nccl_api *n = t->nccl;
    FA_CHECK(fa_nccl_error(n, n->ncclGroupStart(), "ncclGroupStart"));
    fa_status st = FA_SUCCESS;
    if (send_bytes > 0) st = fa_nccl_error(n, n->ncclSend(send, send_bytes, FA_NCCL_UINT8, to, t->comm, t->stream), "ncclSend");
    if (st == FA_SUCCESS && recv_bytes > 0)
        st = fa_nccl_error(n, n->ncclRecv(recv, recv_bytes, FA_NCCL_UINT8, from, t->comm, t->stream), "ncclRecv");
    const int ended = n->ncclGroupEnd();
    return st != FA_SUCCESS ? st : fa_nccl_error(n, ended, "ncclGroupEnd");
}

static fa_status transfer_start(void *impl, void *queue, const void *send, size_t send_bytes, int to, void *recv,
                                size_t recv_bytes, int from, void **pending) {
    nccl_transport *t = impl;
    if (!pending) return fa_fail(FA_ERR_NULL_POINTER, "pending is NULL");
    *pending = NULL;
    pending_transfer *slot = NULL;
    for (int i = 0; i < FA_NCCL_PENDING && !slot; i++)
        if (!t->pending[i].busy) slot = &t->pending[i];
    if (!slot)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%d transfers are in flight already: wait for one first",
                       FA_NCCL_PENDING);
    if ((send_bytes > 0 && !send) || (recv_bytes > 0 && !recv))
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", send_bytes > 0 && !send ? "send" : "recv");
    int saved;
    FA_CHECK(t->rt->enter(t->ctx, &saved));
    fa_status st = t->rt->event_record(t->ctx, t->ready, queue);
    if (st == FA_SUCCESS) st = t->rt->stream_wait(t->ctx, t->stream, t->ready);
    if (st == FA_SUCCESS) st = exchange(t, send, send_bytes, to, recv, recv_bytes, from);
    if (st == FA_SUCCESS) st = t->rt->event_record(t->ctx, slot->done, t->stream);
    t->rt->leave(t->ctx, saved);
    if (st != FA_SUCCESS) return st;
    slot->busy = 1;
    *pending = slot;
    return FA_SUCCESS;
}

static fa_status transfer_wait(void *impl, void *queue, void *pending) {
    nccl_transport *t = impl;
    pending_transfer *slot = NULL;
    for (int i = 0; i < FA_NCCL_PENDING; i++)
        if (pending == (void *)&t->pending[i] && t->pending[i].busy) slot = &t->pending[i];
    if (!slot)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "pending (%p) is no transfer in flight on this transport", pending);
    int saved;
    FA_CHECK(t->rt->enter(t->ctx, &saved));
    const fa_status st = t->rt->stream_wait(t->ctx, queue, slot->done);
    t->rt->leave(t->ctx, saved);
    /* The token is spent either way: a queue that could not be ordered
     * after the transfer is an error the caller sees now. */
    slot->busy = 0;
    return st;
}

static fa_status agree_inner(nccl_transport *t, int64_t *values, size_t bytes, int count) {
    if (bytes > t->agree_bytes) {
        if (t->agree_buf) t->rt->memory_free(t->ctx, t->agree_buf);
        t->agree_buf = NULL;
        t->agree_bytes = 0;
        FA_CHECK(t->rt->memory_alloc(t->ctx, bytes, &t->agree_buf));
        t->agree_bytes = bytes;
    }
    FA_CHECK(t->rt->copy_to_device(t->ctx, t->agree_buf, values, bytes, t->stream));
    const fa_nccl_api *n = t->nccl;
    FA_CHECK(fa_nccl_error(
        n, n->ncclAllReduce(t->agree_buf, t->agree_buf, (size_t)count, FA_NCCL_INT64, FA_NCCL_MAX, t->comm, t->stream),
        "ncclAllReduce"));
    FA_CHECK(t->rt->copy_to_host(t->ctx, values, t->agree_buf, bytes, t->stream));
    return t->rt->stream_synchronize(t->ctx, t->stream);
}

static fa_status transfer_agree(void *impl, int64_t *values, int count) {
    nccl_transport *t = impl;
    if (count < 0) return fa_fail(FA_ERR_INVALID_SIZE, "count = %d", count);
    if (count == 0) return FA_SUCCESS;
    if (!values) return fa_fail(FA_ERR_NULL_POINTER, "values is NULL");
    int saved;
    FA_CHECK(t->rt->enter(t->ctx, &saved));
    const fa_status st = agree_inner(t, values, (size_t)count * sizeof *values, count);
    t->rt->leave(t->ctx, saved);
    return st;
}

static void transfer_release(void *impl) {
    nccl_transport *t = impl;
    if (!t) return;
    int saved;
    if (t->rt->enter(t->ctx, &saved) == FA_SUCCESS) {
        if (t->stream) {
            (void)t->rt->stream_synchronize(t->ctx, t->stream);
            t->rt->stream_destroy(t->ctx, t->stream);
        }
        if (t->ready) t->rt->event_destroy(t->ctx, t->ready);
        for (int i = 0; i < FA_NCCL_PENDING; i++)
            if (t->pending[i].done) t->rt->event_destroy(t->ctx, t->pending[i].done);
        if (t->agree_buf) t->rt->memory_free(t->ctx, t->agree_buf);
        t->rt->leave(t->ctx, saved);
    }
    free(t);
}

/* The communicator's place, checked against the context's. */
static fa_status read_comm(const nccl_transport *t, fa_transport *out) {
    const fa_nccl_api *n = t->nccl;
    FA_CHECK(fa_nccl_error(n, n->ncclCommCount(t->comm, &out->world), "ncclCommCount"));
    FA_CHECK(fa_nccl_error(n, n->ncclCommUserRank(t->comm, &out->rank), "ncclCommUserRank"));
    if (n->ncclCommCuDevice) {
        int device = -1;
        FA_CHECK(fa_nccl_error(n, n->ncclCommCuDevice(t->comm, &device), "ncclCommCuDevice"));
        const int ours = t->rt->device(t->ctx);
        if (device != ours)
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "nccl_comm was initialised for %s device %d, the context runs on device %d", t->rt->name,
                           device, ours);
    }
    return FA_SUCCESS;
}

static fa_status make_objects(nccl_transport *t) {
    FA_CHECK(t->rt->stream_create(t->ctx, &t->stream));
    FA_CHECK(t->rt->event_create(t->ctx, &t->ready));
    for (int i = 0; i < FA_NCCL_PENDING; i++) FA_CHECK(t->rt->event_create(t->ctx, &t->pending[i].done));
    return FA_SUCCESS;
}

fa_status fa_nccl_transport_create(const fa_transfer_runtime *runtime, void *ctx, fa_collective_vendor vendor,
                                   void *nccl_comm, fa_transport *transport) {
    if (!runtime || !ctx || !nccl_comm || !transport)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL",
                       !runtime ? "runtime" : !ctx ? "ctx" : !nccl_comm ? "nccl_comm" : "transport");
    memset(transport, 0, sizeof *transport);
    const fa_nccl_api *nccl = NULL;
    FA_CHECK(fa_nccl_load(vendor, &nccl));
    nccl_transport *t = calloc(1, sizeof *t);
    if (!t) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a transport");
    t->rt = runtime;
    t->ctx = ctx;
    t->nccl = nccl;
    t->comm = nccl_comm;
    fa_transport out;
    memset(&out, 0, sizeof out);
    int saved;
    fa_status st = runtime->enter(ctx, &saved);
    if (st == FA_SUCCESS) {
        st = read_comm(t, &out);
        if (st == FA_SUCCESS) st = make_objects(t);
        runtime->leave(ctx, saved);
    }
    if (st != FA_SUCCESS) {
        transfer_release(t);
        return st;
    }
    out.device_memory = 1;
    out.impl = t;
    out.start = transfer_start;
    out.wait = transfer_wait;
    out.agree = transfer_agree;
    out.release = transfer_release;
    *transport = out;
    return FA_SUCCESS;
}
