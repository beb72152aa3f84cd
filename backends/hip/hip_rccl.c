/* The RCCL transport of HIP contexts (fa_comm_create_nccl): the transport
 * is core/nccl_transport.c's; this file lends it the HIP runtime's
 * streams, events and memory, each call made with the context's device
 * current. An NVIDIA GPU reached through the mapping onto CUDA
 * (backends/hip_nvidia) runs on CUDA streams, whose library is NCCL. */
#define FA_HIP_RUNTIME_TYPES
#include "hip_runtime_internal.h"

#include "fa_internal.h"
#include "nccl_transport.h"

#include <string.h>

static const fa_hip_api *hip(void) { return fa_hip_api_get(); }

static fa_status checked(hipError_t err, const char *what) {
    return err == hipSuccess ? FA_SUCCESS : fa_hip_error(err, what);
}

static int device(void *ctx) { return ((fa_hip_context *)ctx)->index; }

static fa_status enter(void *ctx, int *saved) { return fa_hip_enter(ctx, saved); }

static void leave(void *ctx, int saved) { fa_hip_leave(ctx, saved); }

static fa_status stream_create(void *ctx, void **stream) {
    (void)ctx;
    hipStream_t s = NULL;
    FA_CHECK(checked(hip()->hipStreamCreateWithFlags(&s, hipStreamNonBlocking),
                     "hipStreamCreateWithFlags (the transfers' stream)"));
    *stream = s;
    return FA_SUCCESS;
}

static void stream_destroy(void *ctx, void *stream) {
    (void)ctx;
    (void)hip()->hipStreamDestroy(stream);
}

static fa_status stream_synchronize(void *ctx, void *stream) {
    (void)ctx;
    return checked(hip()->hipStreamSynchronize(stream), "hipStreamSynchronize (the transfers' stream)");
}

static fa_status stream_wait(void *ctx, void *stream, void *event) {
    (void)ctx;
    return checked(hip()->hipStreamWaitEvent(stream, event, 0), "hipStreamWaitEvent");
}

static fa_status event_create(void *ctx, void **event) {
    (void)ctx;
    hipEvent_t e = NULL;
    FA_CHECK(checked(hip()->hipEventCreate(&e), "hipEventCreate"));
    *event = e;
    return FA_SUCCESS;
}

static void event_destroy(void *ctx, void *event) {
    (void)ctx;
    (void)hip()->hipEventDestroy(event);
}

static fa_status event_record(void *ctx, void *event, void *stream) {
    (void)ctx;
    return checked(hip()->hipEventRecord(event, stream), "hipEventRecord");
}

static fa_status memory_alloc(void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    return checked(hip()->hipMalloc(ptr, bytes), "hipMalloc (the transport's agreement buffer)");
}

static void memory_free(void *ctx, void *ptr) {
    (void)ctx;
    (void)hip()->hipFree(ptr);
}

static fa_status copy_to_device(void *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    (void)ctx;
    return checked(hip()->hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, stream), "hipMemcpyAsync (to device)");
}

static fa_status copy_to_host(void *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    (void)ctx;
    return checked(hip()->hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, stream), "hipMemcpyAsync (to host)");
}

static const fa_transfer_runtime hip_runtime = {
    .name = "HIP",
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

fa_status fa_hip_transport_nccl(void *ctx, void *nccl_comm, fa_transport *transport) {
    const fa_hip_context *c = ctx;
    const fa_collective_vendor vendor = strncmp(c->arch, "sm_", 3) == 0 ? FA_COLLECTIVE_NCCL : FA_COLLECTIVE_RCCL;
    return fa_nccl_transport_create(&hip_runtime, ctx, vendor, nccl_comm, transport);
}
