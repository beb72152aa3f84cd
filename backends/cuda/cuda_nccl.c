/* The NCCL transport of CUDA contexts (fa_comm_create_nccl): the
 * transport is core/nccl_transport.c's; this file lends it the driver's
 * streams, events and memory, each call made with the context's primary
 * context current. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"

#include "fa_internal.h"
#include "nccl_transport.h"

#include <stdint.h>

static const fa_cu_api *cu(void) { return fa_cuda_api(); }

static fa_status checked(CUresult r, const char *what) {
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, what);
}

static int device(void *ctx) { return ((fa_cuda_context *)ctx)->index; }

static fa_status enter(void *ctx, int *saved) {
    *saved = 0;
    return fa_cuda_push(ctx);
}

static void leave(void *ctx, int saved) {
    (void)ctx;
    (void)saved;
    fa_cuda_pop();
}

static fa_status stream_create(void *ctx, void **stream) {
    (void)ctx;
    CUstream s = NULL;
    FA_CHECK(checked(cu()->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate (the transfers' stream)"));
    *stream = s;
    return FA_SUCCESS;
}

static void stream_destroy(void *ctx, void *stream) {
    (void)ctx;
    (void)cu()->cuStreamDestroy_v2(stream);
}

static fa_status stream_synchronize(void *ctx, void *stream) {
    (void)ctx;
    return checked(cu()->cuStreamSynchronize(stream), "cuStreamSynchronize (the transfers' stream)");
}

static fa_status stream_wait(void *ctx, void *stream, void *event) {
    (void)ctx;
    return checked(cu()->cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent");
}

static fa_status event_create(void *ctx, void **event) {
    (void)ctx;
    CUevent e = NULL;
    FA_CHECK(checked(cu()->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    *event = e;
    return FA_SUCCESS;
}

static void event_destroy(void *ctx, void *event) {
    (void)ctx;
    (void)cu()->cuEventDestroy_v2(event);
}

static fa_status event_record(void *ctx, void *event, void *stream) {
    (void)ctx;
    return checked(cu()->cuEventRecord(event, stream), "cuEventRecord");
}

static fa_status memory_alloc(void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    CUdeviceptr p = 0;
    FA_CHECK(checked(cu()->cuMemAlloc_v2(&p, bytes), "cuMemAlloc (the transport's agreement buffer)"));
    *ptr = (void *)(uintptr_t)p;
    return FA_SUCCESS;
}

static void memory_free(void *ctx, void *ptr) {
    (void)ctx;
    (void)cu()->cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
}

static fa_status copy_to_device(void *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    (void)ctx;
    return checked(cu()->cuMemcpyHtoDAsync_v2((CUdeviceptr)(uintptr_t)dst, src, bytes, stream), "cuMemcpyHtoDAsync");
}

static fa_status copy_to_host(void *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    (void)ctx;
    return checked(cu()->cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)(uintptr_t)src, bytes, stream), "cuMemcpyDtoHAsync");
}

static const fa_transfer_runtime cuda_runtime = {
    .name = "CUDA",
    .device = device,
    .enter = enter,
    .leave = leave,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_wait = stream_wait,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .memory_alloc = memory_alloc,
    .memory_free = memory_free,
    .copy_to_device = copy_to_device,
    .copy_to_host = copy_to_host,
};

fa_status fa_cuda_transport_nccl(void *ctx, void *nccl_comm, fa_transport *transport) {
    return fa_nccl_transport_create(&cuda_runtime, ctx, FA_COLLECTIVE_NCCL, nccl_comm, transport);
}
