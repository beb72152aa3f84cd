/* A timed device-to-device copy on a context's stream: the copy bandwidth a
 * benchmark puts beside the kernels it times (fa-bench --decode), measured
 * in the same run on the same buffers. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"

#include "fa_internal.h"
#include "plan.h"

fa_status fa_cuda_time_copy(fa_buffer dst, fa_buffer src, size_t bytes, double *ms) {
    if (!dst || !src || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !dst ? "dst" : !src ? "src" : "ms");
    *ms = 0.0;
    if (dst->ctx != src->ctx) return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst and src belong to different contexts");
    if (dst->ctx->info.backend != FA_BACKEND_CUDA)
        return fa_fail(FA_ERR_UNSUPPORTED, "a timed copy needs a CUDA context, not %s",
                       fa_backend_name(dst->ctx->info.backend));
    if (bytes > dst->bytes || bytes > src->bytes)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bytes = %zu exceeds dst (%zu) or src (%zu)", bytes, dst->bytes,
                       src->bytes);
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
