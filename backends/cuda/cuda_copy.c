/* Device-to-device copies on a context's stream for the benchmarks: a timed
 * one (the copy bandwidth fa-bench --decode puts beside the kernels it
 * times, measured in the same run on the same buffers) and an untimed one
 * left in flight (the cache flush before a timed run, which must not leave
 * the device idle while the host prepares the next launch). */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"

#include "fa_internal.h"
#include "plan.h"

static fa_status check_copy(fa_buffer dst, fa_buffer src, size_t bytes) {
    if (!dst || !src) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !dst ? "dst" : "src");
    if (dst->ctx != src->ctx) return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst and src belong to different contexts");
    if (dst->ctx->info.backend != FA_BACKEND_CUDA)
        return fa_fail(FA_ERR_UNSUPPORTED, "a device copy here needs a CUDA context, not %s",
                       fa_backend_name(dst->ctx->info.backend));
    if (bytes > dst->bytes || bytes > src->bytes)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bytes = %zu exceeds dst (%zu) or src (%zu)", bytes, dst->bytes,
                       src->bytes);
    return FA_SUCCESS;
}

fa_status fa_cuda_copy_async(fa_buffer dst, fa_buffer src, size_t bytes) {
    FA_CHECK(check_copy(dst, src, bytes));
    const fa_cuda_context *ctx = dst->ctx->impl;
    const fa_cuda_buffer *d = dst->impl, *s = src->impl;
    FA_CHECK(fa_cuda_push(ctx));
    const CUresult r = fa_cuda_api()->cuMemcpyDtoDAsync_v2(d->ptr, s->ptr, bytes, ctx->stream);
    fa_cuda_pop();
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuMemcpyDtoDAsync");
}

fa_status fa_cuda_time_copy(fa_buffer dst, fa_buffer src, size_t bytes, double *ms) {
    if (!ms) return fa_fail(FA_ERR_NULL_POINTER, "ms is NULL");
    *ms = 0.0;
    FA_CHECK(check_copy(dst, src, bytes));
    const fa_cuda_context *ctx = dst->ctx->impl;
    const fa_cuda_buffer *d = dst->impl, *s = src->impl;
    const fa_cu_api *cu = fa_cuda_api();
    FA_CHECK(fa_cuda_push(ctx));
    CUevent start = NULL, stop = NULL;
    const char *what = "cuEventCreate";
    CUresult r = cu->cuEventCreate(&start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu->cuEventCreate(&stop, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) {
        what = "cuEventRecord";
        r = cu->cuEventRecord(start, ctx->stream);
    }
    if (r == CUDA_SUCCESS) {
        what = "cuMemcpyDtoDAsync";
        r = cu->cuMemcpyDtoDAsync_v2(d->ptr, s->ptr, bytes, ctx->stream);
    }
    if (r == CUDA_SUCCESS) {
        what = "cuEventRecord";
        r = cu->cuEventRecord(stop, ctx->stream);
    }
    float t = 0.0f;
    if (r == CUDA_SUCCESS) {
        what = "cuEventElapsedTime";
        r = cu->cuEventSynchronize(stop);
        if (r == CUDA_SUCCESS) r = cu->cuEventElapsedTime_v2(&t, start, stop);
    }
    if (start) (void)cu->cuEventDestroy_v2(start);
    if (stop) (void)cu->cuEventDestroy_v2(stop);
    fa_cuda_pop();
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, what);
    *ms = (double)t;
    return FA_SUCCESS;
}
