/* The transport over an NCCL or RCCL communicator (fa_transport,
 * include/flashattn.h), written once for CUDA and HIP contexts on the few
 * stream, event and memory calls a backend lends it (backends/cuda/
 * cuda_nccl.c, backends/hip/hip_rccl.c):
 *
 * - device_memory 1: send and recv are device pointers of the context.
 * - Transfers run on a non-blocking stream of the transport's own. start
 *   records an event on the context's queue and makes the stream wait for
 *   it, so a transfer reads what the queue wrote before; it sends and
 *   receives in one NCCL group (ncclUint8 counts of bytes) and records a
 *   completion event. wait makes the queue wait for that event: work queued
 *   after it sees the data, and no host thread waits.
 * - At most FA_NCCL_PENDING transfers are in flight (the library starts two
 *   at a time); their completion events are made once, with the transport.
 * - agree: ncclAllReduce (int64 maximum) of the values, through a small
 *   device buffer on the transport's stream; the host waits for it, as it
 *   needs the result.
 * - release: waits for the stream, frees what the transport made; the
 *   caller's communicator stays the caller's.
 *
 * Communicators must be blocking (NCCL's default): a call answering
 * ncclInProgress fails with FA_ERR_UNSUPPORTED. */
#ifndef FA_NCCL_TRANSPORT_H
#define FA_NCCL_TRANSPORT_H

#include "collective.h"
#include "flashattn.h"

#include <stddef.h>

#define FA_NCCL_PENDING 2

/* What a backend lends the transport: calls on its context (ctx, the
 * backend's context handle) that make its device current, and the streams,
 * events and memory of its runtime. Each reports failures with fa_fail and
 * the runtime's message. */
typedef struct fa_transfer_runtime {
    const char *name; /* "CUDA", "HIP" */
    int (*device)(void *ctx);                               /* the device's ordinal */
    fa_status (*enter)(void *ctx, int *saved);              /* the device current for the calls below */
    void (*leave)(void *ctx, int saved);
    fa_status (*stream_create)(void *ctx, void **stream);   /* non-blocking */
    void (*stream_destroy)(void *ctx, void *stream);
    fa_status (*stream_synchronize)(void *ctx, void *stream);
    fa_status (*stream_wait)(void *ctx, void *stream, void *event);
    fa_status (*event_create)(void *ctx, void **event);
    void (*event_destroy)(void *ctx, void *event);
    fa_status (*event_record)(void *ctx, void *event, void *stream);
    fa_status (*memory_alloc)(void *ctx, size_t bytes, void **ptr);
    void (*memory_free)(void *ctx, void *ptr);
    /* Asynchronous on stream, either way between host and device. */
    fa_status (*copy_to_device)(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
    fa_status (*copy_to_host)(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
} fa_transfer_runtime;

/* The transport over nccl_comm of vendor's library for the context ctx of a
 * backend that lends runtime. Rank and world are the communicator's
 * (ncclCommUserRank, ncclCommCount); where the library tells the
 * communicator's device, it must be the context's (FA_ERR_INVALID_ARGUMENT). */
fa_status fa_nccl_transport_create(const fa_transfer_runtime *runtime, void *ctx, fa_collective_vendor vendor,
                                   void *nccl_comm, fa_transport *transport);

#endif
